//! What the supervisor and a worker exchange: the [`WorkerSpec`] a worker is started with
//! (JSON on its stdin), the [`WorkerState`] file a restarted supervisor re-adopts it from, and
//! the [`WorkerStats`] its stats socket answers. Data only: imports nothing of the crate but
//! the configuration's types and `paths`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use nvproxy_config::{DriverKind, InstanceConfig, MemoryTransport, SimSection};

/// What a worker serves: everything it needs, so that it can be started (or re-adopted)
/// without the supervisor's config file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkerSpec {
    /// The instance.
    pub instance: InstanceConfig,
    /// host or sim.
    pub driver: DriverKind,
    /// The simulated driver's settings (with `driver = sim`).
    pub sim: SimSection,
    /// Client memory transport.
    pub memory: MemoryTransport,
    /// The audit log, if any.
    pub audit: Option<PathBuf>,
    /// `[daemon] allow_unrestricted_mmap_fds`.
    pub allow_unrestricted_mmap_fds: bool,
    /// `[daemon] abi_version` / `serve --abi-version`: the known version whose tables serve a
    /// host driver that has no node.
    #[serde(default)]
    pub abi_version: Option<String>,
    /// `[daemon] abi_dir`: node files for versions the tree lacks.
    #[serde(default)]
    pub abi_dir: Option<PathBuf>,
    /// The one instance of an `nvproxy exec`: no supervisor adopts it, and it stops when the
    /// `exec` that started it dies (`PR_SET_PDEATHSIG`).
    #[serde(default)]
    pub ephemeral: bool,
    /// The user the worker runs as (`[[instance]] user`, or one of `[daemon] worker_uids`);
    /// `None`: the supervisor's.
    #[serde(default)]
    pub run_as: Option<RunAs>,
    /// With `[sim] process = true`: the socket of the instance's `nvproxy sim-driver`.
    #[serde(default)]
    pub sim_socket: Option<PathBuf>,
    /// Take the instance over from the worker serving it now (a live upgrade, `upgrade.rs`)
    /// instead of registering its nodes.
    #[serde(default)]
    pub take_over: bool,
    /// The host's run directory the worker keeps its instance directory in (`paths.rs`);
    /// state files of workers older than the key are `/run/nvproxy`'s.
    #[serde(default = "default_run_dir")]
    pub run_dir: PathBuf,
}

fn default_run_dir() -> PathBuf {
    PathBuf::from(crate::paths::DEFAULT_RUN_DIR)
}

/// A worker's own user: it is started under it, with `CAP_SYS_PTRACE` (for tenants' memory and
/// fds) and `CAP_SYS_NICE` (the instance's interleave level, `ioctl_proxy::schedule`) only,
/// its `/dev/cuse` channels opened by the supervisor.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunAs {
    /// Real, effective and saved uid.
    pub uid: u32,
    /// Real, effective and saved gid (and the only supplementary group).
    pub gid: u32,
}

/// The environment variable that names the `/dev/cuse` channels a worker inherits
/// (comma-separated fd numbers, one per node: nvidiactl, nvidia0.., nvidia-uvm).
pub const CHANNELS_ENV: &str = "NVPROXY_CUSE_CHANNELS";

/// A worker's state file: what a restarted supervisor needs to re-adopt it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerState {
    /// The worker's pid.
    pub pid: u32,
    /// What it serves.
    pub spec: WorkerSpec,
}

/// What `stats` answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkerStats {
    /// The worker's pid.
    pub pid: u32,
    /// Open files of the instance's nodes.
    pub open_files: usize,
    /// RM clients and objects the instance holds.
    pub objects: usize,
    /// The instance's audit counts (every ioctl, by kind, name and decision).
    #[serde(default)]
    pub ioctls: Vec<IoctlCount>,
    /// The worker's request latencies.
    #[serde(default)]
    pub latency: LatencySnapshot,
    /// Video memory the instance holds, per GPU (`ioctl_proxy` `vidmem.rs`).
    #[serde(default)]
    pub gpu_memory: Vec<GpuMemoryStat>,
    /// System memory the instance's objects hold (`ioctl_proxy` `vidmem.rs`; absent from an
    /// older worker: 0).
    #[serde(default)]
    pub system_memory: u64,
    /// The instance's system memory quota (`None`: no quota).
    #[serde(default)]
    pub system_memory_quota: Option<u64>,
}

/// One GPU's video memory of an instance, as the stats socket carries it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GpuMemoryStat {
    /// The GPU's host minor.
    pub gpu: u32,
    /// Bytes the instance's objects hold.
    pub used: u64,
    /// The instance's quota on it (`None`: no quota).
    pub quota: Option<u64>,
}

/// A histogram as the stats socket carries it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LatencySnapshot {
    /// Per bucket of [`crate::latency::BOUNDS_S`] and `+Inf`, not cumulative.
    pub buckets: Vec<u64>,
    /// Sum of the latencies, nanoseconds.
    pub sum_ns: u64,
}

/// One row of a worker's audit counts, as the stats socket carries it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct IoctlCount {
    /// escape, control, class or uvm.
    pub kind: String,
    /// The entry's driver name (or the fold-over row's).
    pub name: String,
    /// allowed, denied, audit-would-deny or failed.
    pub decision: String,
    /// Calls.
    pub count: u64,
}
