//! `nvproxy device-plugin`: the kubelet device plugin (the `device-plugin` crate) as a client
//! of a running `nvproxy serve`'s instance API, and the API's `gpus` answer it reads (the
//! node's GPUs with what places them: bus id, sysfs PCI path, NUMA node).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};

use crate::api::{Answer, Request, call};
use nvproxy_config::{InstanceConfig, Mode, RestartPolicy, Transport};

/// `nvproxy device-plugin`.
#[derive(Debug, clap::Args)]
pub struct DevicePluginArgs {
    #[command(flatten)]
    pub socket: nvproxy_worker::paths::SocketArg,
    /// The kubelet's device plugin directory (its kubelet.sock; ours goes there too).
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    pub device_plugin_dir: PathBuf,
    /// The kubelet's PodResources socket [default: DIR/../pod-resources/kubelet.sock].
    #[arg(long, value_name = "PATH")]
    pub pod_resources_socket: Option<PathBuf>,
    /// Driver capabilities of the pods' instances, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "compute,utility")]
    pub caps: Vec<String>,
    /// The pods' instances' transport. CDI devices exist for `cuse` instances only; `socket`
    /// is for hosts without CUSE (tests).
    #[arg(long, value_enum, default_value_t = Transport::Cuse)]
    pub transport: Transport,
    /// How often the daemon is asked for the devices' health (e.g. 500ms, 2s).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub poll: Duration,
    /// How often the instances are compared with the kubelet's pods.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub reconcile: Duration,
    /// How long an instance may go without a pod the kubelet lists before it is removed.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Also serve `nvproxy.dev/gpu-share`: this many shares of each GPU, each an instance of
    /// that GPU with --share-gpu-memory as its quota (needs --share-gpu-memory).
    #[arg(long, value_name = "N", requires = "share_gpu_memory")]
    pub shares_per_gpu: Option<u32>,
    /// The video memory quota of each share's instance (e.g. 10GiB; needs --shares-per-gpu).
    #[arg(long, value_name = "SIZE", requires = "shares_per_gpu")]
    pub share_gpu_memory: Option<nvproxy_config::ByteSize>,
    /// The system memory quota of every instance the plugin creates (e.g. 16GiB): the pinned
    /// host memory the driver allocates for a pod, which its memory limit does not count.
    /// Default: no quota.
    #[arg(long, value_name = "SIZE")]
    pub system_memory: Option<nvproxy_config::ByteSize>,
}

/// `250ms`, `2s`, `1m`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 2s, 1m)"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(format!("{s:?}: the unit must be ms, s or m")),
    };
    if d.is_zero() {
        return Err(format!("{s:?} must not be zero"));
    }
    Ok(d)
}

/// The instance API as the plugin's backend.
struct ApiBackend {
    socket: PathBuf,
    caps: Vec<String>,
    transport: Transport,
    /// `--system-memory`.
    system_memory: Option<nvproxy_config::ByteSize>,
}

impl ApiBackend {
    fn call(&self, req: &Request) -> Result<Answer, String> {
        match call(&self.socket, req) {
            Ok(Answer::Error { message }) => Err(message),
            Ok(a) => Ok(a),
            Err(e) => Err(format!("{e:#}")),
        }
    }
}

impl device_plugin::Backend for ApiBackend {
    fn node(&self) -> Result<device_plugin::Node, String> {
        match self.call(&Request::Gpus)? {
            Answer::Gpus {
                gpus,
                cdi_kind,
                overcommit_gpu_memory,
            } => Ok(device_plugin::Node {
                gpus: gpus
                    .into_iter()
                    .map(|g| device_plugin::Gpu {
                        minor: g.minor,
                        uuid: g.uuid,
                        bus_id: g.bus_id,
                        pci_path: g.pci_path,
                        numa_node: g.numa_node,
                        memory: g.memory_bytes,
                    })
                    .collect(),
                cdi_kind,
                // An older daemon does not say: it allowed overcommit (its only behaviour).
                overcommit: overcommit_gpu_memory.unwrap_or(true),
            }),
            _ => Err("the daemon answered `gpus` with something else (an older nvproxy?)".into()),
        }
    }

    fn instances(&self) -> Result<Vec<device_plugin::Instance>, String> {
        match self.call(&Request::List)? {
            Answer::Instances { instances } => Ok(instances
                .into_iter()
                .map(|i| device_plugin::Instance {
                    up: i.state == "running" && i.pid != 0 && i.stats.is_some(),
                    // Watched by pidfd only where it is a worker in our pid namespace
                    // (the DaemonSet's hostPID).
                    pid: if crate::supervisor::is_worker_of(i.pid) {
                        i.pid
                    } else {
                        0
                    },
                    name: i.name,
                    gpus: i.gpus,
                })
                .collect()),
            _ => Err("the daemon answered `list` with something else".into()),
        }
    }

    fn create(&self, name: &str, gpus: &[u32], gpu_memory: Option<u64>) -> Result<(), String> {
        let instance = InstanceConfig {
            name: name.to_owned(),
            gpus: gpus.to_vec(),
            caps: self.caps.clone(),
            mode: Mode::Enforce,
            allow: Vec::new(),
            audit_log: None,
            policy: None,
            uvm_mmap: true,
            max_open_files: None,
            max_objects: None,
            max_in_flight: None,
            max_os_descriptor_bytes: None,
            gpu_memory: gpu_memory.map(nvproxy_config::ByteSize),
            system_memory: self.system_memory,
            priority: ioctl_proxy::Priority::default(),
            restart: RestartPolicy::OnFailure,
            user: None,
            transport: self.transport,
            record: None,
            record_limit: None,
        };
        self.call(&Request::Create {
            instance: Box::new(instance),
        })
        .map(|_| ())
    }

    fn remove(&self, name: &str) -> Result<(), String> {
        match self.call(&Request::Rm {
            name: name.to_owned(),
            force: true,
        }) {
            Ok(_) => Ok(()),
            // Gone already (removed by hand, or the daemon started afresh).
            Err(m) if m == format!("no instance {name}") => Ok(()),
            Err(m) => Err(m),
        }
    }
}

/// Runs the plugin until SIGTERM/SIGINT.
pub fn run(args: &DevicePluginArgs) -> Result<()> {
    nvproxy_config::parse_caps(&args.caps)?;
    let shares = match (args.shares_per_gpu, args.share_gpu_memory) {
        (Some(per_gpu), Some(m)) => {
            let s = device_plugin::Shares {
                per_gpu,
                gpu_memory: m.0,
            };
            s.validate()
                .map_err(|e| anyhow::anyhow!("--shares-per-gpu: {e}"))?;
            Some(s)
        }
        (None, None) => None,
        _ => bail!("--shares-per-gpu and --share-gpu-memory go together"),
    };
    let backend = ApiBackend {
        socket: args.socket.path(),
        caps: args.caps.clone(),
        transport: args.transport,
        system_memory: args.system_memory,
    };
    match device_plugin::Backend::node(&backend) {
        Ok(n) if n.gpus.is_empty() => tracing::warn!("the daemon reports no GPUs"),
        // Shares that cannot fit: refused now (a GPU met later is listed Unhealthy instead).
        Ok(n) if shares.is_some_and(|s| n.gpus.iter().any(|g| s.fit(g, n.overcommit).is_err())) => {
            let s = shares.expect("checked");
            let e = n
                .gpus
                .iter()
                .find_map(|g| s.fit(g, n.overcommit).err())
                .unwrap_or_default();
            bail!("--shares-per-gpu/--share-gpu-memory: {e}")
        }
        Ok(n) => tracing::info!(gpus = n.gpus.len(), cdi_kind = %n.cdi_kind, "the daemon answers"),
        Err(e) => {
            tracing::warn!(error = %e, "the daemon does not answer yet: devices unhealthy until it does")
        }
    }
    if !args.device_plugin_dir.is_dir() {
        bail!(
            "the device plugin directory {} does not exist (is the kubelet's \
             /var/lib/kubelet/device-plugins mounted there?)",
            args.device_plugin_dir.display()
        );
    }
    let mut cfg = device_plugin::Config::new(&args.device_plugin_dir);
    if let Some(p) = &args.pod_resources_socket {
        cfg.pod_resources_socket = p.clone();
    }
    cfg.poll = args.poll;
    cfg.reconcile = args.reconcile;
    cfg.grace = args.grace;
    let mut cfgs = vec![cfg.clone()];
    if let Some(s) = shares {
        let share = device_plugin::Config::for_shares(&args.device_plugin_dir, s);
        cfgs.push(device_plugin::Config {
            endpoint: share.endpoint,
            resource_name: share.resource_name,
            instance_prefix: share.instance_prefix,
            shares: share.shares,
            ..cfg.clone()
        });
    }
    device_plugin::run_until_signal(cfgs, Arc::new(backend))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_durations_parse_and_bad_ones_say_why() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("0s").unwrap_err().contains("zero"));
        assert!(parse_duration("1h").unwrap_err().contains("unit"));
        assert!(parse_duration("x").unwrap_err().contains("not a duration"));
    }
}
