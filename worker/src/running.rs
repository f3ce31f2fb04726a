//! A running instance, the runtime of the worker process that serves it: the driver
//! ([`make_driver`]: the host's or a simulated one), the instance's request path (`Parts`:
//! policy, audit sink, proxies, backends) and its nodes and sockets ([`RunningInstance`]), and
//! the leak check of a simulated driver. The CLI verbs (`serve.rs`), the worker (`worker.rs`),
//! live upgrades, checkpoints and the simulated-driver process build on it; it imports none of
//! them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use host_driver::real::RealHostDriver;
use ioctl_proxy::{HostDriver, InstancePolicy, Proxy};

use nvsim::SimDriver;

use crate::audit_log::JsonLinesSink;
use crate::backend::{ProxyBackend, UvmBackend};
use crate::fdid::FdIdentity;
use crate::instance::InstanceNodes;
use crate::mmap::{self, InstanceMmap, MmapSocket};
use nvproxy_config::{DriverKind, InstanceConfig, MemoryTransport, Mode};

/// Exit status of `exec` / `serve` when `--check-leaks` finds objects left in the simulated
/// driver.
pub const LEAK_EXIT: u8 = 3;

/// The driver chosen on the command line.
pub struct Driver {
    /// What the proxies talk to.
    pub host: Arc<dyn HostDriver>,
    /// The same driver when it is the simulated one (for leak checks).
    pub sim: Option<Arc<SimDriver>>,
    /// The same driver when it is a simulated one in its own process (`simd.rs`).
    pub remote: Option<Arc<crate::simd::RemoteSim>>,
    /// The tables to serve it with, when chosen by `serve` (`abi_cmd::host_tables`); `None`:
    /// the host version's own node.
    pub abi: Option<nvproxy_abi::DriverAbi>,
}

/// Builds the driver: the host's, or a simulated one with `gpus` GPUs of `version`.
/// `unrestricted_mmap_fds`: the admin's opt-in to hand tenants unrestricted host fds for RM
/// mmaps where Landlock cannot deny their device ioctls (host driver only).
/// `handle_key`: with the simulated driver, where its client-handle counter starts
/// (`SimConfig::with_client_index_base`; a worker passes its instance's name, so that the
/// simulated drivers of two workers do not hand out the same handles, as the one real driver
/// shared by all processes does not).
pub fn make_driver(
    kind: DriverKind,
    gpus: u32,
    version: &str,
    unrestricted_mmap_fds: bool,
    handle_key: Option<&str>,
) -> Result<Driver> {
    match kind {
        DriverKind::Host => {
            let d = RealHostDriver::new()
                .map_err(|e| {
                    anyhow::anyhow!(
                        "no usable NVIDIA driver on this host: its version is read from \
                         /sys/module/nvidia/version, else /proc/driver/nvidia/version: {e} (is \
                         the nvidia kernel module loaded?). Without a GPU, use the simulated \
                         driver: `--driver sim`, or driver = \"sim\" in the config"
                    )
                })?
                .with_unrestricted_mapping_fds(unrestricted_mmap_fds);
            if !unrestricted_mmap_fds && !host_driver::restricted::ioctl_dev_restriction_available()
            {
                tracing::warn!(
                    "Landlock cannot deny device ioctls on this kernel (needs ABI 5, Linux \
                     6.10): RM memory mmaps (NV_ESC_RM_MAP_MEMORY) will be refused; \
                     `nvproxy doctor` reports the ABI, [daemon] allow_unrestricted_mmap_fds \
                     accepts the risk"
                );
            }
            Ok(Driver {
                host: Arc::new(d),
                sim: None,
                remote: None,
                abi: None,
            })
        }
        DriverKind::Sim => {
            let sim = crate::simd::sim_driver(gpus, version, handle_key)?;
            Ok(Driver {
                host: sim.clone(),
                sim: Some(sim),
                remote: None,
                abi: None,
            })
        }
    }
}

/// An instance being served.
pub struct RunningInstance {
    name: String,
    /// What serves the tenants now; `None` while a live upgrade has the nodes suspended
    /// (`upgrade.rs`) or after [`RunningInstance::stop`].
    serving: Mutex<Option<Serving>>,
    /// The nodes' backends: their proxies are the instance's (a restore replaces them).
    backend: Arc<ProxyBackend>,
    uvm_backend: Arc<UvmBackend>,
    sink: Arc<JsonLinesSink>,
    /// The CUSE nodes' fd identity and mmap tickets (CUSE transport).
    pub(crate) fdid: Arc<FdIdentity>,
    pub(crate) mmap: Arc<InstanceMmap>,
    pub(crate) transport: MemoryTransport,
    /// The tenant's GPU count.
    pub(crate) gpus: u32,
    /// The host's run directory its sockets are in (`paths.rs`).
    root: PathBuf,
}

/// How an instance reaches its tenants (`[[instance]] transport`).
pub(crate) enum Serving {
    /// CUSE nodes and the mmap socket.
    Cuse {
        nodes: InstanceNodes,
        mmap_socket: MmapSocket,
    },
    /// The device socket (`socket_transport.rs`).
    Socket(crate::socket_transport::DevSocket),
}

/// An instance's request path before it serves: policy, audit sink, proxies, backends.
pub(crate) struct Parts {
    pub(crate) backend: Arc<ProxyBackend>,
    pub(crate) uvm_backend: Arc<UvmBackend>,
    pub(crate) sink: Arc<JsonLinesSink>,
    pub(crate) caps: nvproxy_abi::Caps,
}

impl Parts {
    /// The policy, audit sink and proxies of `inst` on `driver`.
    pub(crate) fn build(
        inst: &InstanceConfig,
        driver: &Driver,
        audit: Option<&Path>,
    ) -> Result<Parts> {
        Self::build_with(inst, driver, audit, None)
    }

    /// [`Parts::build`], serving `served` instead of the policy `inst` and its policy file
    /// give (a live upgrade keeps what the old worker served).
    pub(crate) fn build_with(
        inst: &InstanceConfig,
        driver: &Driver,
        audit: Option<&Path>,
        served: Option<InstancePolicy>,
    ) -> Result<Parts> {
        let caps = nvproxy_config::parse_caps(&inst.caps)?;
        let mut policy = InstancePolicy::new(inst.name.clone(), caps, inst.gpus.clone());
        policy.mode = match inst.mode {
            Mode::Enforce => ioctl_proxy::Mode::Enforce,
            Mode::Audit => ioctl_proxy::Mode::Audit,
        };
        policy.allow = inst.allow.iter().cloned().collect();
        policy.uvm_mmap = inst.uvm_mmap;
        policy.quotas = inst.quotas();
        policy.priority = inst.priority;
        // The interleave level is set with CAP_SYS_NICE raised for that call alone (the
        // request threads run without it); one way per process.
        ioctl_proxy::install_nice_caller(std::sync::Arc::new(crate::device::RaiseNice));
        let policy_file = match &inst.policy {
            Some(p) => Some(nvproxy_config::policy::PolicyFile::load(p)?),
            None => None,
        };
        if let Some(f) = &policy_file {
            f.apply(&mut policy);
        }
        // The served policy's GPUs may differ from the spec's after a restore with a remap:
        // what was served wins.
        let policy = match served {
            Some(p) if p.name == policy.name => p,
            Some(p) => bail!(
                "instance {}: the served policy is instance {}'s",
                inst.name,
                p.name
            ),
            None => policy,
        };
        let caps = policy.caps;
        let sink = Arc::new(JsonLinesSink::open(audit)?);
        let proxy = match &driver.abi {
            Some(abi) => Proxy::new(abi.clone(), policy, driver.host.clone()),
            None => Proxy::for_host(policy, driver.host.clone()),
        }
        .context("the proxy")?
        .with_audit(sink.clone());
        // The names must be in the table of the driver this instance runs on.
        let names = nvproxy_config::policy::AbiNames::of(
            proxy.abi(),
            format!("driver {}", driver.host.version().trim()),
        );
        nvproxy_config::policy::check_allow(&inst.allow, &names).context("allow")?;
        if let (Some(f), Some(p)) = (&policy_file, &inst.policy) {
            f.check(&names)
                .with_context(|| format!("policy file {}", p.display()))?;
        }
        let proxy = Arc::new(proxy);
        let backend = Arc::new(ProxyBackend::new(proxy.clone()));
        let uvm = uvm::UvmProxy::new(proxy.clone()).context("the GPUs' UUIDs for UVM")?;
        let uvm_backend = Arc::new(UvmBackend::new(Arc::new(uvm), backend.clone()));
        Ok(Parts {
            backend,
            uvm_backend,
            sink,
            caps,
        })
    }
}

impl RunningInstance {
    /// Creates the proxy and the nodes of `inst` on `driver`.
    pub fn start(
        inst: &InstanceConfig,
        driver: &Driver,
        transport: MemoryTransport,
        audit: Option<&Path>,
        channels: Vec<std::os::fd::OwnedFd>,
        root: &Path,
    ) -> Result<RunningInstance> {
        let Parts {
            backend,
            uvm_backend,
            sink,
            caps,
        } = Parts::build(inst, driver, audit)?;
        let fdid = Arc::new(FdIdentity::new().context("reading a random secret")?);
        let uvm: Arc<dyn crate::device::Backend> = uvm_backend.clone();
        let gpus = u32::try_from(inst.gpus.len()).context("too many GPUs")?;
        let mmap = Arc::new(InstanceMmap::new(&inst.name).context("mmap tickets")?);
        // `auto` is settled before a worker starts (serve, exec, the instance API); settled
        // again here so that nothing else ever stands for CUSE.
        if inst.transport.resolve(crate::host::cuse_usable()) == nvproxy_config::Transport::Socket {
            if transport == MemoryTransport::Retry {
                tracing::warn!(instance = %inst.name, "memory = \"retry\" is a CUSE protocol: the socket transport reads client memory with process_vm_readv");
            }
            let nodes = crate::socket_transport::Nodes {
                frontend: backend.clone(),
                uvm: Some(uvm),
                gpus,
            };
            let dev = crate::socket_transport::DevSocket::start(&inst.name, nodes, root)
                .context("device socket")?;
            tracing::info!(instance = %inst.name, gpus = ?inst.gpus, caps = %caps, mode = %inst.mode, transport = "socket", "instance serving");
            return Ok(RunningInstance {
                name: inst.name.clone(),
                serving: Mutex::new(Some(Serving::Socket(dev))),
                backend,
                uvm_backend,
                sink,
                fdid,
                mmap,
                transport,
                gpus,
                root: root.to_owned(),
            });
        }
        let nodes = InstanceNodes::start(
            &inst.name,
            gpus,
            backend.clone(),
            Some(uvm),
            fdid.clone(),
            transport,
            mmap.clone(),
            channels,
        )?;
        // After the nodes: their registration proved no live daemon serves this instance.
        let mmap_socket = MmapSocket::start(mmap.clone(), root).context("mmap socket")?;
        tracing::info!(instance = %inst.name, gpus = ?inst.gpus, caps = %caps, mode = %inst.mode, "instance serving");
        tracing::info!(
            instance = %inst.name,
            socket = %mmap_socket.path().display(),
            "mmap of the nodes goes through the shim {}: it takes a ticket from the node and the host fd from this socket (bind-mounted at {}); `nvproxy exec`/`run` inject both. A client without the shim gets ENODEV from mmap() (CUSE has no mmap)",
            mmap::SHIM_NAME,
            nvproxy_preload_proto::DEFAULT_SOCKET_PATH,
        );
        Ok(RunningInstance {
            name: inst.name.clone(),
            serving: Mutex::new(Some(Serving::Cuse { nodes, mmap_socket })),
            backend,
            uvm_backend,
            sink,
            fdid,
            mmap,
            transport,
            gpus,
            root: root.to_owned(),
        })
    }

    /// The instance of `spec` whose nodes (or device socket) serve again in this process,
    /// taken over from another worker (`upgrade.rs`).
    pub(crate) fn from_serving(
        spec: &crate::worker_spec::WorkerSpec,
        parts: Parts,
        serving: Serving,
        fdid: Arc<FdIdentity>,
        mmap: Arc<InstanceMmap>,
    ) -> Result<RunningInstance> {
        Ok(RunningInstance {
            name: spec.instance.name.clone(),
            serving: Mutex::new(Some(serving)),
            backend: parts.backend,
            uvm_backend: parts.uvm_backend,
            sink: parts.sink,
            fdid,
            mmap,
            transport: spec.memory,
            gpus: u32::try_from(spec.instance.gpus.len()).context("too many GPUs")?,
            root: spec.run_dir.clone(),
        })
    }

    /// What serves the tenants (`upgrade.rs` suspends and resumes it).
    pub(crate) fn serving(&self) -> std::sync::MutexGuard<'_, Option<Serving>> {
        self.serving.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The instance's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host's run directory its sockets are in.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The nodes' backends and the audit sink (`checkpoint.rs` restores behind them).
    pub fn parts(&self) -> (Arc<ProxyBackend>, Arc<UvmBackend>, Arc<JsonLinesSink>) {
        (
            self.backend.clone(),
            self.uvm_backend.clone(),
            self.sink.clone(),
        )
    }

    /// Unregisters the nodes and writes the audit counts. Returns whether the instance's object
    /// table was empty (every client released what it allocated); `--check-leaks` counts a
    /// non-empty table as a leak.
    pub fn stop(&self) -> bool {
        match self.serving().take() {
            Some(Serving::Cuse { nodes, mmap_socket }) => {
                drop(mmap_socket);
                nodes.stop();
            }
            Some(Serving::Socket(dev)) => drop(dev),
            None => {}
        }
        // Files the clients still hold are revoked (the nodes are gone): their RM clients and
        // host files go now, so the driver holds nothing of them.
        let (proxy, uvm) = (self.backend.proxy(), self.uvm_backend.uvm());
        let revoked = uvm.release_all() + proxy.release_all();
        if revoked != 0 {
            tracing::warn!(instance = %self.name, files = revoked, "open files revoked at stop");
        }
        self.sink.write_counts(&self.name, proxy.counts());
        crate::ratelimit::flush(&self.name);
        let left = proxy.object_count();
        if left != 0 {
            tracing::warn!(instance = %self.name, objects = left, "proxy object table not empty at stop");
        }
        left == 0
    }
}

/// Checks the simulated driver holds nothing; returns whether it is clean.
pub fn leak_check(driver: &Driver) -> bool {
    if let Some(remote) = &driver.remote {
        return remote_leak_check(remote);
    }
    let Some(sim) = &driver.sim else { return true };
    // The proxies and their host files are gone by now; give late releases a moment.
    for _ in 0..50 {
        if sim.live_clients() == 0 && sim.live_objects() == 0 && sim.open_files() == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let stats = sim.stats();
    let clean = sim.live_clients() == 0 && sim.live_objects() == 0 && sim.open_files() == 0;
    if clean {
        tracing::info!(%stats, "simulated driver holds nothing");
    } else {
        eprintln!("nvproxy: leak check failed: the simulated driver still holds {stats}");
    }
    clean
}

/// [`leak_check`] of a simulated driver in its own process: what it holds for this instance
/// (it serves no other).
fn remote_leak_check(remote: &crate::simd::RemoteSim) -> bool {
    let empty =
        |s: &nvsim::SimStats| s.live_clients == 0 && s.live_objects == 0 && s.open_files == 0;
    let mut last = None;
    for _ in 0..50 {
        match remote.stats() {
            Ok(s) if empty(&s) => {
                tracing::info!(stats = %s, "simulated driver (its own process) holds nothing");
                return true;
            }
            Ok(s) => last = Some(s),
            Err(e) => {
                eprintln!("nvproxy: leak check: the sim-driver did not answer: {e}");
                return false;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if let Some(s) = last {
        eprintln!("nvproxy: leak check failed: the simulated driver still holds {s}");
    }
    false
}
