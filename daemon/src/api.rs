//! The instance API: the supervisor's control socket (`/run/nvproxy/nvproxy.sock`) and the
//! `nvproxy instance` verbs that use it.
//!
//! One JSON request line per connection, one JSON answer line ([`Request`], [`Answer`]). The
//! socket is mode 0660; a peer is served only if `SO_PEERCRED` says it is root, or its
//! process belongs to the configured `[daemon] api_group` (primary or supplementary group, from
//! `/proc/<pid>/status`); others are closed without an answer.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::supervisor::{InstanceInfo, Supervisor, spec_for};
use nvproxy_config::{Config, InstanceConfig, Mode, RestartPolicy};

/// The control socket's file name under the run directory.
pub const SOCKET_NAME: &str = nvproxy_worker::paths::CONTROL_SOCKET;
/// Its name in systemd's fd store.
pub const FDSTORE_NAME: &str = "nvproxy-api";

/// A request to the supervisor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// Every instance.
    List,
    /// One instance.
    Show {
        /// Its name.
        name: String,
    },
    /// A new instance, served by a new worker.
    Create {
        /// Its configuration (GPUs already resolved to host minors; boxed, the largest
        /// variant by far).
        instance: Box<InstanceConfig>,
    },
    /// Stop an instance's worker and forget it.
    Rm {
        /// Its name.
        name: String,
        /// Revoke open files instead of refusing.
        force: bool,
    },
    /// The Prometheus text exposition.
    Metrics,
    /// The node's GPUs and the CDI kind (`nvproxy device-plugin`).
    Gpus,
    /// Replace instance workers with fresh processes of the binary on disk, live
    /// (`upgrade.rs`): one instance, or every one (`name` absent).
    Upgrade {
        /// The instance; `None`: all.
        #[serde(default)]
        name: Option<String>,
    },
}

/// The supervisor's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Answer {
    /// The instances asked for.
    Instances {
        /// Them.
        instances: Vec<InstanceInfo>,
    },
    /// Done (create: the worker's pid; rm: its exit status if known).
    Ok {
        /// What happened.
        message: String,
    },
    /// The metrics, in the Prometheus text format.
    Metrics {
        /// The exposition.
        text: String,
    },
    /// The node's GPUs.
    Gpus {
        /// Them, by minor.
        gpus: Vec<crate::node_gpus::NodeGpu>,
        /// The CDI kind of the instances' devices (`[cdi] vendor/class`).
        cdi_kind: String,
        /// `[daemon] overcommit_gpu_memory` (absent from older daemons).
        #[serde(default)]
        overcommit_gpu_memory: Option<bool>,
    },
    /// Refused or failed.
    Error {
        /// Why.
        message: String,
    },
}

/// The control socket server.
pub struct ApiServer {
    _server: nvproxy_worker::unix_server::UnixServer,
}

impl ApiServer {
    /// Serves `sup` on `path`. `group`: the gid allowed besides root.
    pub fn start(
        path: &Path,
        sup: Arc<Supervisor>,
        cfg: Arc<Config>,
        group: Option<u32>,
    ) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let prepare = |path: &Path| -> Result<()> {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
            if let Some(gid) = group {
                nix::unistd::chown(path, None, Some(nix::unistd::Gid::from_raw(gid)))
                    .with_context(|| format!("giving {} to group {gid}", path.display()))?;
            }
            Ok(())
        };
        let handle = move |conn: UnixStream| {
            if permitted(&conn, group) {
                serve_one(conn, &sup, &cfg);
            }
        };
        // Under systemd the listener lives in the unit's fd store too: a restarted supervisor
        // serves the same socket, so clients that connect meanwhile wait in its backlog
        // instead of finding no socket.
        if let Some(fd) = nvproxy_worker::sys::stored_fd(FDSTORE_NAME) {
            let listener = std::os::unix::net::UnixListener::from(fd);
            let bound = listener
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(Path::to_owned));
            if bound.as_deref() == Some(path) && path.exists() {
                tracing::info!(socket = %path.display(), "control socket from the systemd fd store");
                prepare(path)?;
                let server = nvproxy_worker::unix_server::UnixServer::serve(
                    listener, path, "api", false, handle,
                )?;
                return Ok(Self { _server: server });
            }
            tracing::warn!(
                ?bound,
                "the stored control socket is not {}: a new one",
                path.display()
            );
        }
        let _ = std::fs::remove_file(path);
        let listener = std::os::unix::net::UnixListener::bind(path)
            .with_context(|| format!("binding {}", path.display()))?;
        prepare(path)?;
        let stored = std::env::var_os("NOTIFY_SOCKET").is_some()
            && match listener.try_clone() {
                Ok(dup) => match nvproxy_worker::sys::sd_notify_with_fd(
                    &format!("FDSTORE=1\nFDNAME={FDSTORE_NAME}"),
                    &std::os::fd::OwnedFd::from(dup),
                ) {
                    Ok(()) => {
                        tracing::info!("control socket kept in the systemd fd store");
                        true
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "FDSTORE=1 failed");
                        false
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "duplicating the control socket");
                    false
                }
            };
        // A stored listener outlives us: its path must stay for the next supervisor.
        let server =
            nvproxy_worker::unix_server::UnixServer::serve(listener, path, "api", !stored, handle)?;
        Ok(Self { _server: server })
    }
}

/// Root, or a process in `group`.
fn permitted(conn: &UnixStream, group: Option<u32>) -> bool {
    let Ok(c) = nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::PeerCredentials)
    else {
        return false;
    };
    if c.uid() == 0 {
        return true;
    }
    let Some(gid) = group else {
        tracing::warn!(
            uid = c.uid(),
            pid = c.pid(),
            "control socket: peer refused (not root)"
        );
        return false;
    };
    let ok = c.gid() == gid || supplementary_groups(c.pid()).contains(&gid);
    if !ok {
        tracing::warn!(
            uid = c.uid(),
            pid = c.pid(),
            "control socket: peer refused (not root, not in the api group)"
        );
    }
    ok
}

/// The `Groups:` of `/proc/<pid>/status`.
fn supplementary_groups(pid: i32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Groups:").map(|g| {
                    g.split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect()
                })
            })
        })
        .unwrap_or_default()
}

fn serve_one(conn: UnixStream, sup: &Supervisor, cfg: &Config) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    if BufReader::new(&conn).read_line(&mut line).is_err() {
        return;
    }
    let answer = match serde_json::from_str::<Request>(&line) {
        Ok(req) => handle(req, sup, cfg),
        Err(e) => Answer::Error {
            message: format!("bad request: {e}"),
        },
    };
    if let Ok(mut text) = serde_json::to_string(&answer) {
        text.push('\n');
        let _ = (&conn).write_all(text.as_bytes());
    }
}

fn handle(req: Request, sup: &Supervisor, cfg: &Config) -> Answer {
    let res: Result<Answer> = (|| match req {
        Request::List => Ok(Answer::Instances {
            instances: sup.list(),
        }),
        Request::Show { name } => {
            let found: Vec<_> = sup.list().into_iter().filter(|i| i.name == name).collect();
            if found.is_empty() {
                bail!("no instance {name}");
            }
            Ok(Answer::Instances { instances: found })
        }
        Request::Create { mut instance } => {
            // A path the root worker appends to: the admin's config names it, not a caller of
            // the API (which may be any member of `api_group`).
            if instance.record.is_some() {
                bail!(
                    "record: a config-file key (`[[instance]] record`), not taken through the API"
                );
            }
            instance.transport = instance
                .transport
                .resolve(nvproxy_worker::host::cuse_usable());
            instance.validate()?;
            cfg.check_gpus(&instance)?;
            let spec = spec_for(cfg, &instance);
            let pid = sup.create(spec)?;
            tracing::info!(instance = %instance.name, pid, "instance created");
            sup.refresh_cdi(cfg);
            Ok(Answer::Ok {
                message: format!("instance {} created: worker pid {pid}", instance.name),
            })
        }
        Request::Rm { name, force } => {
            let status = sup.remove(&name, force)?;
            tracing::info!(instance = %name, ?status, "instance removed");
            sup.refresh_cdi(cfg);
            Ok(Answer::Ok {
                message: format!("instance {name} removed"),
            })
        }
        Request::Gpus => Ok(Answer::Gpus {
            gpus: crate::node_gpus::node_gpus(cfg),
            cdi_kind: format!("{}/{}", cfg.cdi.vendor, cfg.cdi.class),
            overcommit_gpu_memory: Some(cfg.daemon.overcommit_gpu_memory.unwrap_or(true)),
        }),
        Request::Metrics => Ok(Answer::Metrics {
            text: crate::metrics::render(sup.metrics_samples())?,
        }),
        Request::Upgrade { name: Some(name) } => {
            let (old, new) = sup.upgrade(&name)?;
            Ok(Answer::Ok {
                message: format!("instance {name} upgraded: worker {old} replaced by {new}"),
            })
        }
        Request::Upgrade { name: None } => {
            let results = sup.upgrade_all();
            let mut lines = Vec::new();
            let mut failed = 0;
            for (name, r) in &results {
                match r {
                    Ok((old, new)) => lines.push(format!(
                        "instance {name} upgraded: worker {old} replaced by {new}"
                    )),
                    Err(e) => {
                        failed += 1;
                        lines.push(format!(
                            "instance {name} not upgraded (its worker serves on): {e:#}"
                        ));
                    }
                }
            }
            if failed > 0 {
                bail!("{}", lines.join("\n"));
            }
            Ok(Answer::Ok {
                message: if lines.is_empty() {
                    "no instance to upgrade".into()
                } else {
                    lines.join("\n")
                },
            })
        }
    })();
    res.unwrap_or_else(|e| Answer::Error {
        message: format!("{e:#}"),
    })
}

/// Sends one request to the control socket at `path`.
pub fn call(path: &Path, req: &Request) -> Result<Answer> {
    let mut s = UnixStream::connect(path).with_context(|| {
        format!(
            "connecting to the control socket {} (is `nvproxy serve` running, and are we root \
             or in its api group?)",
            path.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut text = serde_json::to_string(req)?;
    text.push('\n');
    s.write_all(text.as_bytes())?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    if line.is_empty() {
        bail!("the supervisor closed the connection without an answer (not permitted?)");
    }
    serde_json::from_str(&line).context("the supervisor's answer")
}

/// `nvproxy instance ...`.
#[derive(Debug, clap::Subcommand)]
pub enum InstanceCommand {
    /// Create an instance (served by a new worker).
    Create {
        /// Its name.
        name: String,
        /// Its GPUs, in the order the tenant sees them: host indices (minors), UUIDs
        /// (GPU-...) or PCI bus ids (0000:18:00.0), comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        gpus: Vec<String>,
        /// Driver capabilities, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "compute,utility")]
        caps: Vec<String>,
        /// enforce, or audit.
        #[arg(long, value_enum, default_value_t = Mode::Enforce)]
        mode: Mode,
        /// A policy file.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Run the worker as this user (name or uid) instead of the supervisor's
        /// `[daemon] worker_uids` choice.
        #[arg(long)]
        user: Option<String>,
        /// How tenants reach it: cuse, socket, or auto (the daemon picks cuse where its
        /// /dev/cuse can be opened, else socket).
        #[arg(long, value_enum, default_value_t = nvproxy_config::Transport::Auto)]
        transport: nvproxy_config::Transport,
        /// Video memory the instance may hold on each of its GPUs (e.g. 10GiB, 512MiB);
        /// default: no quota.
        #[arg(long, value_name = "SIZE")]
        gpu_memory: Option<nvproxy_config::ByteSize>,
        /// System memory the driver may allocate for it (pinned host pages no memory cgroup
        /// sees; e.g. 32GiB); default: no quota.
        #[arg(long, value_name = "SIZE")]
        system_memory: Option<nvproxy_config::ByteSize>,
        /// Scheduling priority of its channel groups: low, medium (the driver's default) or
        /// high.
        #[arg(long, value_name = "LEVEL", default_value_t = ioctl_proxy::Priority::Medium)]
        priority: ioctl_proxy::Priority,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// List the instances.
    List {
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Show one instance.
    Show {
        /// Its name.
        name: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Save an instance's state (its RM objects, opens and UVM va_spaces, to be re-created
    /// by replay) to FILE; refused, naming each one, when something cannot be replayed. The
    /// tenant should be paused (e.g. cuda-checkpoint). Root only (the worker's socket).
    Checkpoint(nvproxy_worker::checkpoint::CheckpointArgs),
    /// Restore the instance a checkpoint FILE names, in place: its objects are re-created on
    /// fresh host files (GPUs remapped by identity) behind the same nodes, so its clients'
    /// open files and handles work again. Root only.
    Restore(nvproxy_worker::checkpoint::RestoreArgs),
    /// Replace an instance's worker with a new process of the nvproxy binary on disk, live:
    /// its clients keep their open files, handles and mappings and see no error. With
    /// `driver = "sim"` it needs `[sim] process = true`. A failed upgrade leaves the
    /// old worker serving. `--all`: every instance (what `systemctl reload` does).
    #[command(group(clap::ArgGroup::new("which").required(true).args(["name", "all"])))]
    Upgrade {
        /// The instance.
        name: Option<String>,
        /// Every instance.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Remove an instance: stop its worker. Refused while files are open unless --force,
    /// which revokes them.
    Rm {
        /// Its name.
        name: String,
        /// Revoke the open files.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
}

pub use nvproxy_worker::paths::SocketArg;

/// Runs one `nvproxy instance` verb.
pub fn run(cmd: &InstanceCommand) -> Result<()> {
    let (socket, req) = match cmd {
        InstanceCommand::Create {
            name,
            gpus,
            caps,
            mode,
            policy,
            user,
            transport,
            gpu_memory,
            system_memory,
            priority,
            socket,
        } => {
            let policy = match policy {
                Some(p) => Some(
                    std::fs::canonicalize(p)
                        .with_context(|| format!("policy file {}", p.display()))?,
                ),
                None => None,
            };
            let instance = InstanceConfig {
                name: name.clone(),
                gpus: resolve_gpus(gpus)?,
                caps: caps.clone(),
                mode: *mode,
                allow: Vec::new(),
                audit_log: None,
                policy,
                uvm_mmap: true,
                max_open_files: None,
                max_objects: None,
                max_in_flight: None,
                max_os_descriptor_bytes: None,
                gpu_memory: *gpu_memory,
                system_memory: *system_memory,
                priority: *priority,
                restart: RestartPolicy::OnFailure,
                user: user.clone(),
                transport: *transport,
                record: None,
                record_limit: None,
            };
            instance.validate()?;
            (
                socket,
                Request::Create {
                    instance: Box::new(instance),
                },
            )
        }
        InstanceCommand::Checkpoint(a) => return nvproxy_worker::checkpoint::checkpoint(a),
        InstanceCommand::Restore(a) => return nvproxy_worker::checkpoint::restore(a),
        InstanceCommand::List { socket } => (socket, Request::List),
        InstanceCommand::Upgrade { name, socket, .. } => {
            (socket, Request::Upgrade { name: name.clone() })
        }
        InstanceCommand::Show { name, socket } => (socket, Request::Show { name: name.clone() }),
        InstanceCommand::Rm {
            name,
            force,
            socket,
        } => (
            socket,
            Request::Rm {
                name: name.clone(),
                force: *force,
            },
        ),
    };
    match call(&socket.path(), &req)? {
        Answer::Instances { instances } => {
            print!("{}", table(&instances));
            Ok(())
        }
        Answer::Ok { message } => {
            println!("{message}");
            Ok(())
        }
        Answer::Metrics { text } => {
            print!("{text}");
            Ok(())
        }
        Answer::Gpus { .. } => bail!("unexpected answer"),
        Answer::Error { message } => bail!("{message}"),
    }
}

/// `nvproxy metrics`: prints the supervisor's metrics (the control socket's `metrics`).
pub fn metrics(socket: &SocketArg) -> Result<()> {
    match call(&socket.path(), &Request::Metrics)? {
        Answer::Metrics { text } => {
            print!("{text}");
            Ok(())
        }
        Answer::Error { message } => bail!("{message}"),
        other => bail!("unexpected answer {other:?}"),
    }
}

/// `nvproxy instance list` as a table.
pub fn table(instances: &[InstanceInfo]) -> String {
    let rows: Vec<[String; 12]> = instances
        .iter()
        .map(|i| {
            let (files, objects) = i.stats.as_ref().map_or(("-".into(), "-".into()), |s| {
                (s.open_files.to_string(), s.objects.to_string())
            });
            let memory = i
                .stats
                .as_ref()
                .filter(|s| !s.gpu_memory.is_empty())
                .map_or("-".into(), |s| {
                    s.gpu_memory
                        .iter()
                        .map(|g| {
                            let quota = g.quota.map_or("-".into(), gib);
                            format!("{}/{quota}", gib(g.used))
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                });
            let system = i.stats.as_ref().map_or("-".into(), |s| {
                let quota = s.system_memory_quota.map_or("-".into(), gib);
                format!("{}/{quota}", gib(s.system_memory))
            });
            [
                i.name.clone(),
                if i.pid == 0 {
                    "-".into()
                } else {
                    i.pid.to_string()
                },
                i.gpus
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                i.caps.join(","),
                i.mode.clone(),
                if i.priority.is_empty() {
                    "-".into()
                } else {
                    i.priority.clone()
                },
                if i.transport.is_empty() {
                    "-".into()
                } else {
                    i.transport.clone()
                },
                files,
                objects,
                memory,
                system,
                i.state.clone(),
            ]
        })
        .collect();
    let mut widths = [4, 3, 4, 4, 4, 8, 9, 5, 7, 10, 13, 5];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let fmt_row = |cells: &[String]| {
        let mut l = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:w$}"))
            .collect::<Vec<_>>()
            .join("  ");
        l.truncate(l.trim_end().len());
        l.push('\n');
        l
    };
    let mut out = fmt_row(
        &[
            "NAME",
            "PID",
            "GPUS",
            "CAPS",
            "MODE",
            "PRIORITY",
            "TRANSPORT",
            "FILES",
            "OBJECTS",
            "GPU MEMORY",
            "SYSTEM MEMORY",
            "STATE",
        ]
        .map(String::from),
    );
    for r in &rows {
        out.push_str(&fmt_row(r));
    }
    out
}

/// Bytes as GiB with one decimal (`8.0GiB`).
fn gib(bytes: u64) -> String {
    format!("{:.1}GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// GPU names to host minors: a number is a minor; `GPU-…` a UUID and `dddd:bb:dd.f` a PCI bus
/// id, looked up in `/proc/driver/nvidia/gpus/<bus id>/information` (the driver's; the
/// simulated driver's equivalent is not on the host, so there only minors are taken).
pub fn resolve_gpus(names: &[String]) -> Result<Vec<u32>> {
    let table = nvproxy_worker::host::host_gpu_table();
    names
        .iter()
        .map(|n| {
            let n = n.trim();
            if let Ok(m) = n.parse::<u32>() {
                return Ok(m);
            }
            let lower = n.to_ascii_lowercase();
            table
                .iter()
                .find(|g| {
                    g.uuid.eq_ignore_ascii_case(n)
                        || g.bus_id == lower
                        || g.bus_id.ends_with(&format!(":{lower}"))
                })
                .map(|g| g.minor)
                .ok_or_else(|| {
                    if table.is_empty() {
                        anyhow::anyhow!(
                            "GPU {n:?}: no NVIDIA driver GPUs to look it up in \
                             (/proc/driver/nvidia/gpus); name GPUs by index on this host"
                        )
                    } else {
                        anyhow::anyhow!(
                            "GPU {n:?} is none of the host's: {}",
                            table
                                .iter()
                                .map(|g| format!("{} ({}, {})", g.minor, g.uuid, g.bus_id))
                                .collect::<Vec<_>>()
                                .join("; ")
                        )
                    }
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_requests_and_answers_are_one_json_line_each() {
        let r = Request::Rm {
            name: "a".into(),
            force: true,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"op":"rm","name":"a","force":true}"#);
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
        let a: Answer =
            serde_json::from_str(r#"{"result":"error","message":"no instance x"}"#).unwrap();
        assert_eq!(
            a,
            Answer::Error {
                message: "no instance x".into()
            }
        );
    }

    #[test]
    fn test_numeric_gpus_resolve_without_a_driver() {
        assert_eq!(resolve_gpus(&["1".into(), " 0".into()]).unwrap(), [1, 0]);
    }

    #[test]
    fn test_the_table_lines_up() {
        let t = table(&[InstanceInfo {
            name: "job42".into(),
            pid: 77,
            gpus: vec![0, 1],
            caps: vec!["compute".into()],
            mode: "enforce".into(),
            priority: "low".into(),
            transport: "socket".into(),
            state: "running".into(),
            restarts: 0,
            stats: Some(nvproxy_worker::worker_spec::WorkerStats {
                pid: 77,
                open_files: 3,
                objects: 12,
                gpu_memory: vec![
                    nvproxy_worker::worker_spec::GpuMemoryStat {
                        gpu: 0,
                        used: 8 << 30,
                        quota: Some(10 << 30),
                    },
                    nvproxy_worker::worker_spec::GpuMemoryStat {
                        gpu: 1,
                        used: 0,
                        quota: Some(10 << 30),
                    },
                ],
                system_memory: 3 << 30,
                system_memory_quota: Some(32 << 30),
                ..Default::default()
            }),
        }]);
        assert_eq!(
            t,
            "NAME   PID  GPUS  CAPS     MODE     PRIORITY  TRANSPORT  FILES  OBJECTS  GPU MEMORY                     SYSTEM MEMORY   STATE\n\
             job42  77   0,1   compute  enforce  low       socket     3      12       8.0GiB/10.0GiB,0.0GiB/10.0GiB  3.0GiB/32.0GiB  running\n"
        );
    }

    /// Only root or the api group get an answer: a server whose group no test user has,
    /// reached as root, answers; the permission check itself is exercised with our own creds.
    #[test]
    fn test_root_peer_is_permitted() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(permitted(&a, None), nix::unistd::geteuid().is_root());
    }
}
