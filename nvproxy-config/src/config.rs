//! The daemon's configuration file (TOML) and its validation. Host facts come in through a
//! [`HostProbe`]; imports `policy` and `probe` of the crate.
//!
//! ```toml
//! driver = "sim"                 # "host" (default): the NVIDIA driver on this machine
//!
//! [sim]                          # only read with driver = "sim"
//! gpus = 2                       # simulated GPUs, minors 0..gpus-1
//! driver_version = "535.261.03"  # selects the ABI node; any supported version
//!
//! [daemon]
//! memory = "process-vm"          # how client memory is read: "process-vm" or "retry"
//! audit_dir = "/var/log/nvproxy" # default place of <instance>.jsonl audit logs
//! allow_unrestricted_mmap_fds = false  # true: without Landlock ABI 5, hand tenants host fds
//!                                      # for RM mmaps that they can also ioctl (no isolation)
//! abi_dir = "/etc/nvproxy/abi.d" # node files (`nvproxy abi import`) serve verifies and loads
//! overcommit_gpu_memory = true   # false: check-config refuses gpu_memory quotas that add
//!                                # up past a GPU's memory (checked for simulated GPUs)
//! abi_version = "580.173.02"     # serve a host driver with no node with this version's
//!                                # tables (at your own risk; warned about at start)
//!
//! [[instance]]
//! name = "job42"                 # [a-z0-9][a-z0-9_-]*, at most 32 characters
//! gpus = [1]                     # host minors; the tenant sees them as nvidia0, nvidia1, ...
//! caps = ["compute", "utility"]  # compute, utility, graphics, video, rdma, profiling, fabric-imex-mgmt
//! mode = "enforce"               # or "audit": allow what is known, log what enforce would deny
//! allow = ["NV2080_CTRL_CMD_GPU_QUERY_ECC_CONFIGURATION"]  # admin overrides, by driver name
//!                                # (pass-through controls: "RM_GSS_LEGACY" or one command,
//!                                # "RM_GSS_LEGACY 0x20808159"; see `policy.rs`)
//! audit_log = "/var/log/nvproxy/job42.jsonl"             # default: <audit_dir>/<name>.jsonl
//! max_open_files = 4096          # opens of the instance's nodes at once (past it: ENOMEM)
//! max_objects = 131072           # RM clients + objects (past it: NV_ERR_INSUFFICIENT_RESOURCES)
//! max_in_flight = 256            # requests handled at once (past it: EAGAIN)
//! max_os_descriptor_bytes = 4294967296  # OS-descriptor memory (host memory the GPU maps from
//!                                # the tenant's files) pinned at once (past it:
//!                                # NV_ERR_INVALID_ADDRESS, the driver's "cannot pin")
//! gpu_memory = "10GiB"          # video memory per GPU of the instance (absent: no quota);
//!                                # past it allocations fail as on a full GPU (NV_ERR_NO_MEMORY)
//! system_memory = "32GiB"       # system memory the driver allocates for the instance (its
//!                                # pages no memory cgroup sees; absent: no quota); past it
//!                                # NV_ERR_NO_MEMORY, the driver's answer for a host out of pages
//! priority = "medium"           # interleave level of its channel groups: low, medium, high
//! transport = "auto"            # default: "cuse" where /dev/cuse can be opened, else
//!                                # "socket": no device nodes, the shim forwards /dev/nvidia*
//!                                # to the worker over a unix socket (kernels without CUSE)
//! policy = "job42-policy.toml"   # a policy file (`policy.rs`; relative to this file's
//!                                # directory), e.g. from `nvproxy policy suggest --from-audit`
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use ioctl_proxy::policy::pass_through_name;
use nvproxy_abi::{Caps, DriverVersion};
use serde::{Deserialize, Serialize};

use crate::HostProbe;
use crate::policy::AbiNames;

/// Which driver the daemon forwards to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DriverKind {
    /// The NVIDIA kernel driver of this host.
    #[default]
    Host,
    /// The simulated driver (`nvsim`): no GPU needed.
    Sim,
}

/// How the daemon reads and writes client memory.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    Default,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryTransport {
    /// `process_vm_readv`/`writev` on the calling thread: one CUSE round trip per ioctl.
    #[default]
    ProcessVm,
    /// The CUSE unrestricted-ioctl retry protocol: one extra round trip per level of pointers.
    Retry,
}

/// How an instance reaches its tenants.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    Default,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// CUSE where this host's `/dev/cuse` can be opened, the socket transport otherwise
    /// ([`Transport::resolve`]); what an instance runs with is always one of the two.
    #[default]
    Auto,
    /// CUSE nodes (`/dev/nvproxy/<instance>/...`, bind-mounted at `/dev/nvidia*`), mmap through
    /// the shim.
    Cuse,
    /// No device nodes: the shim serves `/dev/nvidia*` over the instance's device socket
    /// (`/run/nvproxy/<instance>/dev.sock`, this module). For kernels without CUSE.
    Socket,
}

impl Transport {
    /// The name the config file and the command line use.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Cuse => "cuse",
            Transport::Socket => "socket",
        }
    }

    /// The transport an instance runs with: `auto` becomes `cuse` when `cuse_usable` (the
    /// host probe [`HostProbe::cuse_usable`]), else `socket`; the others stay.
    pub fn resolve(self, cuse_usable: bool) -> Transport {
        match self {
            Transport::Auto if cuse_usable => Transport::Cuse,
            Transport::Auto => Transport::Socket,
            t => t,
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Enforce the policy, or only record what it would deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Deny what the policy does not allow.
    #[default]
    Enforce,
    /// Allow everything the ABI table knows; log what enforce would deny.
    Audit,
}

impl DriverKind {
    /// The name the config file and the command line use.
    pub fn as_str(self) -> &'static str {
        match self {
            DriverKind::Host => "host",
            DriverKind::Sim => "sim",
        }
    }
}

impl MemoryTransport {
    /// The name the config file and the command line use.
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryTransport::ProcessVm => "process-vm",
            MemoryTransport::Retry => "retry",
        }
    }
}

impl Mode {
    /// The name the config file and the command line use.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Audit => "audit",
        }
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}
display_as_str!(DriverKind, MemoryTransport, Mode);

/// `[sim]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimSection {
    /// Number of simulated GPUs.
    pub gpus: u32,
    /// Driver version the simulated driver reports.
    pub driver_version: String,
    /// Run each instance's simulated driver as a process of its own (`nvproxy sim-driver`,
    /// the daemon's `simd.rs`), which outlives the instance's workers as the kernel driver
    /// does, instead of inside the worker.
    pub process: bool,
}

impl Default for SimSection {
    fn default() -> Self {
        SimSection {
            gpus: 1,
            driver_version: DEFAULT_SIM_VERSION.to_owned(),
            process: false,
        }
    }
}

/// The simulated driver's default version (Debian's libcuda1 userspace).
pub const DEFAULT_SIM_VERSION: &str = "535.261.03";

/// `[daemon]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonSection {
    /// Client memory transport.
    pub memory: MemoryTransport,
    /// Directory for per-instance audit logs.
    pub audit_dir: Option<PathBuf>,
    /// Where the kernel cannot deny device ioctls with Landlock (ABI < 5), hand tenants
    /// unrestricted host driver fds for RM memory mmaps instead of refusing them. Off by
    /// default: such an fd lets the tenant issue raw driver ioctls around the proxy.
    pub allow_unrestricted_mmap_fds: bool,
    /// On SIGTERM, leave the workers serving (a later supervisor re-adopts them) instead of
    /// stopping them: for supervisor restarts under systemd with `KillMode=process`.
    pub keep_workers: bool,
    /// Whether `[[instance]] gpu_memory` quotas may add up past a GPU's memory (default true:
    /// like the driver, the first to allocate gets the memory). False: `check-config` refuses
    /// such a configuration (for GPUs whose memory it knows: the simulated ones).
    pub overcommit_gpu_memory: Option<bool>,
    /// A group whose members may use the instance API (the control socket) besides root.
    pub api_group: Option<String>,
    /// Directory of node files (`nvproxy abi import --from-source`) for driver versions the
    /// tree lacks: `serve` verifies every `*.json` in it and refuses to start on a bad one.
    /// Relative to the config file's directory.
    pub abi_dir: Option<PathBuf>,
    /// Serve a host driver whose version has no node (nor node file) with the tables of this
    /// known version (`serve --abi-version`); ignored, with a warning, when the host version
    /// has its own node.
    pub abi_version: Option<String>,
    /// Run every worker whose instance names no `user` under its own uid (and a gid of the
    /// same number) from this inclusive range, e.g. `"61000-61999"`: the lowest one no other
    /// instance of the supervisor uses. Unset: such workers run as the supervisor's user.
    pub worker_uids: Option<String>,
    /// Serve the Prometheus metrics (`GET /metrics`) on this TCP address as well as on the
    /// control socket: a port alone (`"9464"`) is loopback's, or an IP address and port
    /// (`"127.0.0.1:9464"`). Unset: the control socket only. Whoever reaches the address reads
    /// every instance's numbers; tenants under `nvproxy run` share the host's network
    /// namespace and reach loopback (README "Metrics" says how to keep them off it).
    pub metrics_listen: Option<String>,
    /// The host's run directory (instance directories, sockets, state files, the control
    /// socket and `serve`'s lock), relative to the config file's directory; `--run-dir` and
    /// `NVPROXY_RUN_DIR` come first. Unset: `/run/nvproxy`.
    pub run_dir: Option<PathBuf>,
}

/// `[cdi]`: the CDI spec `serve` keeps current (written at start and after every `instance
/// create`/`rm`, removed at stop).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CdiSection {
    /// Where the spec goes (`.json` writes JSON, anything else YAML); `""` turns it off.
    pub spec: PathBuf,
    /// CDI vendor (the kind is VENDOR/CLASS).
    pub vendor: String,
    /// CDI class.
    pub class: String,
    /// Take NVIDIA's libraries and binaries from this CDI spec (`nvidia-ctk cdi generate`'s)
    /// instead of looking for them.
    pub nvidia_spec: Option<PathBuf>,
    /// Where NVIDIA's userspace is installed (as `cdi generate --driver-root`).
    pub driver_root: PathBuf,
}

impl Default for CdiSection {
    fn default() -> Self {
        CdiSection {
            spec: PathBuf::from("/run/cdi/nvproxy.yaml"),
            vendor: "nvproxy.dev".to_owned(),
            class: "gpu".to_owned(),
            nvidia_spec: None,
            driver_root: PathBuf::from("/"),
        }
    }
}

/// Parses `[daemon] metrics_listen`: an IP address and port, or a port alone (`"9464"` or
/// `":9464"`), which is loopback's (`127.0.0.1`): the default, since the metrics name every
/// instance.
pub fn metrics_addr(text: &str) -> Result<std::net::SocketAddr> {
    let t = text.trim();
    let port = t.strip_prefix(':').unwrap_or(t);
    if let Ok(p) = port.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], p)));
    }
    t.parse::<std::net::SocketAddr>().map_err(|e| {
        anyhow::anyhow!(
            "[daemon] metrics_listen = {text:?}: {e} (a port, served on loopback, or an IP \
             address and port, e.g. \"9464\" or \"127.0.0.1:9464\")"
        )
    })
}

/// Parses `[daemon] worker_uids`: `"FIRST-LAST"`, inclusive, neither 0.
pub fn parse_uid_range(text: &str) -> Result<(u32, u32)> {
    let bad = || {
        anyhow::anyhow!(
            "[daemon] worker_uids = {text:?}: expected \"FIRST-LAST\" (uids, 0 < FIRST <= LAST), \
             e.g. \"61000-61999\""
        )
    };
    let (a, b) = text.split_once('-').ok_or_else(bad)?;
    let a: u32 = a.trim().parse().map_err(|_| bad())?;
    let b: u32 = b.trim().parse().map_err(|_| bad())?;
    if a == 0 || a > b || b == u32::MAX {
        return Err(bad());
    }
    Ok((a, b))
}

/// One `[[instance]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceConfig {
    /// Instance name: part of the device paths and the audit records.
    pub name: String,
    /// Host GPU minors, in the order the tenant sees them.
    pub gpus: Vec<u32>,
    /// Driver capabilities (names as NVIDIA_DRIVER_CAPABILITIES uses them).
    #[serde(default = "default_caps")]
    pub caps: Vec<String>,
    /// enforce or audit.
    #[serde(default)]
    pub mode: Mode,
    /// Escapes, controls, classes or UVM ioctls allowed beyond the caps, by driver name; a
    /// pass-through control by family (`RM_GSS_LEGACY`) or command (`RM_GSS_LEGACY
    /// 0x20808159`, normalised to lowercase hex by [`Config::parse`]).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Audit log path (JSON lines).
    pub audit_log: Option<PathBuf>,
    /// A policy file ([`crate::policy`]): an allowlist-only policy replaces the caps, or more
    /// names beyond them. `Config::load` resolves a relative path against the config's
    /// directory and checks the file.
    #[serde(default)]
    pub policy: Option<PathBuf>,
    /// Whether clients may mmap `/dev/nvidia-uvm` (default true). The mapping hands the tenant
    /// the instance's host UVM fd, on which it can issue raw UVM ioctls on its own va_space
    /// (ARCHITECTURE.md, "UVM"); false turns the path off (mmap fails with ENODEV).
    #[serde(default = "default_true")]
    pub uvm_mmap: bool,
    /// Open files of the instance's nodes at once (`nvidiactl`, `nvidia<N>`, `nvidia-uvm`),
    /// each a host file of the daemon; past it `open` fails with ENOMEM for this instance only.
    #[serde(default)]
    pub max_open_files: Option<usize>,
    /// RM clients plus objects the instance may hold; past it allocations get
    /// `NV_ERR_INSUFFICIENT_RESOURCES`.
    #[serde(default)]
    pub max_objects: Option<usize>,
    /// Requests of the instance handled at once; past it an ioctl fails with EAGAIN.
    #[serde(default)]
    pub max_in_flight: Option<usize>,
    /// Bytes of OS-descriptor memory (the tenant's files, pinned by the driver through the
    /// worker) the instance's objects hold at once; past it the allocation gets
    /// `NV_ERR_INVALID_ADDRESS` (default 4 GiB, `ioctl_proxy::Quotas`).
    #[serde(default)]
    pub max_os_descriptor_bytes: Option<u64>,
    /// Video memory the instance may hold on each of its GPUs (`"10GiB"`, `"512MiB"` or a
    /// number of bytes); past it allocations get `NV_ERR_NO_MEMORY`, the driver's answer for a
    /// full GPU. Absent: no quota.
    #[serde(default)]
    pub gpu_memory: Option<ByteSize>,
    /// System memory the driver may allocate for the instance (`NV01_MEMORY_SYSTEM`, pinned
    /// host pages no memory cgroup accounts for), same units; past it allocations get
    /// `NV_ERR_NO_MEMORY`, the driver's answer for a host out of pages. Absent: no quota.
    #[serde(default)]
    pub system_memory: Option<ByteSize>,
    /// The interleave level of the instance's channel groups: `low`, `medium` (default, the
    /// driver's own) or `high`; the tenant cannot change it (`ioctl_proxy::schedule`).
    #[serde(default)]
    pub priority: ioctl_proxy::Priority,
    /// What the supervisor does when the instance's worker exits unasked: `on-failure`
    /// (default: start a new one, at most 5 times in 60 s) or `no` (mark the instance failed).
    #[serde(default)]
    pub restart: RestartPolicy,
    /// The user the instance's worker runs as once it holds its CUSE channels (a name or a
    /// numeric uid; its primary group is used): tenants' RM clients are then created under an
    /// euid no other instance shares. Overrides `[daemon] worker_uids`.
    #[serde(default)]
    pub user: Option<String>,
    /// How tenants reach the instance: `auto` (default: `cuse` where `/dev/cuse` can be
    /// opened, else `socket`), `cuse` (CUSE nodes) or `socket` (no device nodes; the shim
    /// forwards `/dev/nvidia*` to the worker over a unix socket; the daemon's
    /// `socket_transport.rs`).
    /// [`Config::resolve_transports`] settles `auto` before an instance starts.
    #[serde(default)]
    pub transport: Transport,
    /// Record every call the instance makes to the driver to this file (JSON lines,
    /// the daemon's `record.rs`), appending, up to `record_limit` bytes.
    #[serde(default)]
    pub record: Option<PathBuf>,
    /// The record file's bound (default 16 MiB); recording stops past it and says so once.
    #[serde(default)]
    pub record_limit: Option<ByteSize>,
}

/// `[[instance]] restart`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Restart a worker that exited unasked.
    #[default]
    OnFailure,
    /// Leave the instance failed.
    No,
}

impl InstanceConfig {
    /// The instance's quotas: the configured ones over the defaults
    /// (`ioctl_proxy::Quotas::default`).
    pub fn quotas(&self) -> ioctl_proxy::Quotas {
        let d = ioctl_proxy::Quotas::default();
        ioctl_proxy::Quotas {
            open_files: self.max_open_files.unwrap_or(d.open_files),
            objects: self.max_objects.unwrap_or(d.objects),
            in_flight: self.max_in_flight.unwrap_or(d.in_flight),
            os_descriptor_bytes: self
                .max_os_descriptor_bytes
                .unwrap_or(d.os_descriptor_bytes),
            gpu_memory: self.gpu_memory.map(|b| b.0),
            system_memory: self.system_memory.map(|b| b.0),
        }
    }
}

/// A size in bytes, written as a number of bytes or a string with a binary or decimal unit
/// (`"10GiB"`, `"512MiB"`, `"1.5GiB"`, `"8GB"`, `"4096"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl std::str::FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let not_a_size = || format!("{s:?} is not a size (e.g. \"10GiB\", \"512MiB\")");
        if num.is_empty() {
            return Err(not_a_size());
        }
        let mult: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            u => {
                return Err(format!(
                    "{s:?}: unknown unit {u:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
                ));
            }
        };
        let v: f64 = num.parse().map_err(|_| not_a_size())?;
        let bytes = v * mult as f64;
        if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
            return Err(format!("{s:?}: a size must be at least 1 byte"));
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "finite and in 1..=2^64 (checked above); `as` saturates 2^64 to u64::MAX"
        )]
        let bytes = bytes as u64;
        Ok(ByteSize(bytes))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(0) => Err(serde::de::Error::custom("a size must be at least 1 byte")),
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_caps() -> Vec<String> {
    vec!["compute".into(), "utility".into()]
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// host or sim.
    #[serde(default)]
    pub driver: DriverKind,
    /// Simulated driver settings.
    #[serde(default)]
    pub sim: SimSection,
    /// Daemon-wide settings.
    #[serde(default)]
    pub daemon: DaemonSection,
    /// The CDI spec `serve` writes.
    #[serde(default)]
    pub cdi: CdiSection,
    /// The instances to serve.
    #[serde(default, rename = "instance")]
    pub instances: Vec<InstanceConfig>,
}

impl Config {
    /// Reads and validates a config file, and the policy files it names (relative paths are
    /// resolved against the config's directory).
    pub fn load(path: &Path, host: &dyn HostProbe) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        let mut cfg =
            Config::parse(&text, host).with_context(|| format!("in config {}", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new(""));
        if let Some(p) = cfg.daemon.abi_dir.as_mut().filter(|p| p.is_relative()) {
            *p = dir.join(&*p);
        }
        if let Some(p) = cfg.daemon.run_dir.as_mut().filter(|p| p.is_relative()) {
            *p = dir.join(&*p);
        }
        for inst in &mut cfg.instances {
            if let Some(p) = inst.policy.as_mut().filter(|p| p.is_relative()) {
                *p = dir.join(&*p);
            }
        }
        cfg.check_policy_files(host)
            .with_context(|| format!("in config {}", path.display()))?;
        cfg.check_abi_choice()
            .with_context(|| format!("in config {}", path.display()))?;
        if cfg.driver == DriverKind::Host
            && let Some(minors) = host.gpu_minors()
        {
            for inst in &cfg.instances {
                check_host_gpus(&inst.gpus, &minors).with_context(|| {
                    format!(
                        "in config {}: instance {:?}: gpus",
                        path.display(),
                        inst.name
                    )
                })?;
            }
        }
        Ok(cfg)
    }

    /// Loads every instance's policy file and checks its names against the table the config
    /// will run with: the simulated driver's version, or the host driver's (every known
    /// version's names when this host has none; the instance checks again at start).
    pub fn check_policy_files(&self, host: &dyn HostProbe) -> Result<()> {
        if self.instances.iter().all(|i| i.policy.is_none()) {
            return Ok(());
        }
        let names = self.abi_names(host)?;
        for inst in &self.instances {
            if let Some(p) = &inst.policy {
                crate::policy::load_checked(p, &names)
                    .with_context(|| format!("instance {:?}", inst.name))?;
            }
        }
        Ok(())
    }

    /// Parses and validates config text.
    pub fn parse(text: &str, host: &dyn HostProbe) -> Result<Config> {
        let mut cfg: Config = toml::from_str(text)?;
        for inst in &mut cfg.instances {
            for n in &mut inst.allow {
                if let Ok(Some(normal)) = pass_through_name(n) {
                    *n = normal;
                }
            }
        }
        cfg.validate(host)?;
        Ok(cfg)
    }

    /// Settles every instance's `transport = "auto"` for this host (`cuse_usable`: the
    /// probe [`HostProbe::cuse_usable`]); what the supervisor starts never says `auto`.
    pub fn resolve_transports(&mut self, cuse_usable: bool) {
        for i in &mut self.instances {
            i.transport = i.transport.resolve(cuse_usable);
        }
    }

    /// A human-readable description of what this config serves, in the file's own spellings.
    pub fn summary(&self, host: &dyn HostProbe) -> String {
        let mut out = match self.driver {
            DriverKind::Host => "driver: host\n".to_owned(),
            DriverKind::Sim => format!(
                "driver: sim ({} GPU(s), version {})\n",
                self.sim.gpus, self.sim.driver_version
            ),
        };
        out.push_str(&format!("client memory: {}\n", self.daemon.memory));
        for i in &self.instances {
            let caps = parse_caps(&i.caps)
                .map(|c| c.to_string())
                .unwrap_or_default();
            let audit = i
                .audit_path(&self.daemon)
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "log only".into());
            let gpus: Vec<String> = i.gpus.iter().map(u32::to_string).collect();
            let allow = if i.allow.is_empty() {
                "nothing".to_owned()
            } else {
                i.allow.join(", ")
            };
            out.push_str(&format!(
                "instance {}: gpus {}, caps {caps}, mode {}, allow {allow}, audit {audit}",
                i.name,
                gpus.join(", "),
                i.mode
            ));
            if let Some(p) = &i.policy {
                out.push_str(&format!(", policy {}", p.display()));
            }
            if !i.uvm_mmap {
                out.push_str(", uvm_mmap off");
            }
            let on_this_host = i.transport.resolve(host.cuse_usable());
            if on_this_host == i.transport {
                out.push_str(&format!(", transport {}", i.transport));
            } else {
                out.push_str(&format!(
                    ", transport {} ({on_this_host} on this host)",
                    i.transport
                ));
            }
            out.push('\n');
        }
        if self.instances.is_empty() {
            out.push_str("no [[instance]]: serve would serve nothing\n");
        }
        out.trim_end().to_owned()
    }

    /// `[daemon] abi_dir`: every node file verifies; `abi_version`: a known version or one of
    /// those files.
    fn check_abi_choice(&self) -> Result<()> {
        let loaded = match &self.daemon.abi_dir {
            Some(d) => abi_import::host::load_dir(d)
                .with_context(|| format!("[daemon] abi_dir = {d:?}"))?,
            None => Vec::new(),
        };
        if let Some(v) = &self.daemon.abi_version {
            let version: DriverVersion = v
                .parse()
                .map_err(|e| anyhow::anyhow!("[daemon] abi_version: {e}"))?;
            if nvproxy_abi::find(&version).is_err() && !loaded.iter().any(|l| l.version == version)
            {
                bail!(
                    "[daemon] abi_version = {v:?}: no node or node file for {v} \
                     (`nvproxy abi versions` lists the versions)"
                );
            }
        }
        Ok(())
    }

    /// Checks what serde cannot: what `serve` would refuse with this config's driver. With
    /// `driver = "sim"`: a known `[sim] driver_version`, GPU indices the simulated driver has,
    /// and `allow` names in that version's table. With the host driver: `allow` names in the
    /// host driver's table (every known version's when this host has none). `[sim]
    /// driver_version` must be a known version whatever the driver (`serve --driver sim`
    /// uses it).
    pub fn validate(&self, host: &dyn HostProbe) -> Result<()> {
        let v = &self.sim.driver_version;
        let version: DriverVersion = v
            .parse()
            .map_err(|e| anyhow::anyhow!("[sim] driver_version: {e}"))?;
        nvproxy_abi::find(&version)
            .map_err(|e| anyhow::anyhow!("[sim] driver_version = {v:?}: {e}"))?;
        if self.sim.gpus == 0 || self.sim.gpus > MAX_SIM_GPUS {
            bail!(
                "[sim] gpus must be between 1 and {MAX_SIM_GPUS} (the driver's limit), not {}",
                self.sim.gpus
            );
        }
        if let Some(r) = &self.daemon.worker_uids {
            parse_uid_range(r)?;
        }
        if let Some(a) = &self.daemon.metrics_listen {
            metrics_addr(a)?;
        }
        let mut names = BTreeSet::new();
        for inst in &self.instances {
            inst.validate()
                .with_context(|| format!("instance {:?}", inst.name))?;
            if !names.insert(inst.name.as_str()) {
                bail!("instance name {:?} is used twice", inst.name);
            }
        }
        if self.driver == DriverKind::Sim && self.daemon.overcommit_gpu_memory == Some(false) {
            // The simulated GPUs' memory (nvsim's default GPU).
            let total = nvsim::SimConfig::default_gpus(1).gpus[0].memory_bytes;
            let mut sums = std::collections::BTreeMap::<u32, u64>::new();
            for inst in &self.instances {
                if let Some(q) = inst.gpu_memory {
                    for &g in &inst.gpus {
                        let e = sums.entry(g).or_default();
                        *e = e.saturating_add(q.0);
                    }
                }
            }
            if let Some((g, sum)) = sums.iter().find(|(_, s)| **s > total) {
                let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
                bail!(
                    "gpu_memory quotas on GPU {g} add up to {:.1} GiB, more than its {:.1} GiB, \
                     and [daemon] overcommit_gpu_memory = false",
                    gib(*sum),
                    gib(total)
                );
            }
        }
        if self.driver == DriverKind::Sim {
            for inst in &self.instances {
                check_sim_gpus(
                    &inst.gpus,
                    self.sim.gpus,
                    &format!("[sim] gpus = {}", self.sim.gpus),
                )
                .with_context(|| format!("instance {:?}: gpus", inst.name))?;
            }
        }
        if self.instances.iter().any(|i| !i.allow.is_empty()) {
            let abi = self.abi_names(host)?;
            for inst in &self.instances {
                crate::policy::check_allow(&inst.allow, &abi)
                    .with_context(|| format!("instance {:?}: allow", inst.name))?;
            }
        }
        Ok(())
    }

    /// The names of the table this config runs with: the simulated driver's version, or the
    /// host driver's (every known version's when this host has none).
    pub fn abi_names(&self, host: &dyn HostProbe) -> Result<AbiNames> {
        Ok(match self.driver {
            DriverKind::Sim => AbiNames::for_version(&self.sim.driver_version)?,
            DriverKind::Host => AbiNames::for_host(host),
        })
    }

    /// The config with another driver (`serve --driver`), checked again for that driver.
    pub fn with_driver(mut self, driver: DriverKind, host: &dyn HostProbe) -> Result<Config> {
        if driver != self.driver {
            self.driver = driver;
            self.validate(host)
                .with_context(|| format!("with --driver {driver}"))?;
            self.check_policy_files(host)
                .with_context(|| format!("with --driver {driver}"))?;
        }
        Ok(self)
    }

    /// Checks an instance created at run time against this daemon's driver, as
    /// `check-config` checks the file's.
    pub fn check_gpus(&self, inst: &InstanceConfig) -> Result<()> {
        if self.driver == DriverKind::Sim
            && let Some(&g) = inst.gpus.iter().find(|&&g| g >= self.sim.gpus)
        {
            bail!(
                "GPU {g}: the simulated driver has {} GPU(s) (0-{})",
                self.sim.gpus,
                self.sim.gpus.saturating_sub(1)
            );
        }
        Ok(())
    }
}

/// Checks that every GPU minor in `gpus` is one of the host driver's (`minors`).
pub fn check_host_gpus(gpus: &[u32], minors: &[u32]) -> Result<()> {
    let missing: Vec<String> = gpus
        .iter()
        .filter(|g| !minors.contains(g))
        .map(u32::to_string)
        .collect();
    if !missing.is_empty() {
        let have: Vec<String> = minors.iter().map(u32::to_string).collect();
        bail!(
            "the host driver has no GPU with minor {} (its GPUs, from /proc/driver/nvidia/gpus: {})",
            missing.join(", "),
            have.join(", ")
        );
    }
    Ok(())
}

/// The most GPUs the simulated driver (like the real one) supports.
pub const MAX_SIM_GPUS: u32 = 32;

/// Checks that every GPU index in `gpus` exists on a simulated driver with `sim_gpus` GPUs
/// (minors `0..sim_gpus`); `setting` says where that count came from (`[sim] gpus = 2`).
pub fn check_sim_gpus(gpus: &[u32], sim_gpus: u32, setting: &str) -> Result<()> {
    let missing: Vec<String> = gpus
        .iter()
        .filter(|&&g| g >= sim_gpus)
        .map(u32::to_string)
        .collect();
    if !missing.is_empty() {
        let have = match sim_gpus {
            0 => "none".to_owned(),
            1 => "only GPU 0".to_owned(),
            n => format!("GPUs 0-{}", n - 1),
        };
        bail!(
            "no GPU {} on the simulated driver: {setting} gives it {have}",
            missing.join(", ")
        );
    }
    Ok(())
}

/// Checks an instance name: it becomes a path segment under `/dev/nvproxy/`.
pub fn validate_instance_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !ok {
        bail!("instance name {name:?} must match [a-z0-9][a-z0-9_-]* and be at most 32 characters");
    }
    Ok(())
}

/// Parses capability names into a set (`all` = compute, utility, graphics, video).
pub fn parse_caps(names: &[String]) -> Result<Caps> {
    let mut caps = Caps::NONE;
    for n in names {
        let c = if n == "all" {
            Caps::ALL_CONTAINER
        } else {
            Caps::from_name(n).with_context(|| {
                format!("unknown capability {n:?} (compute, utility, graphics, video, rdma, profiling, fabric-imex-mgmt, all)")
            })?
        };
        caps = caps.union(c);
    }
    Ok(caps)
}

impl InstanceConfig {
    /// Checks one instance.
    pub fn validate(&self) -> Result<()> {
        validate_instance_name(&self.name)?;
        if self.gpus.is_empty() {
            bail!("gpus must name at least one GPU minor");
        }
        let unique: BTreeSet<_> = self.gpus.iter().collect();
        if unique.len() != self.gpus.len() {
            bail!("gpus lists a GPU twice: {:?}", self.gpus);
        }
        if let Some(&g) = self.gpus.iter().find(|&&g| g > 254) {
            bail!("GPU minor {g} is out of range (0-254)");
        }
        for (key, zero) in [
            ("max_open_files", self.max_open_files == Some(0)),
            ("max_objects", self.max_objects == Some(0)),
            ("max_in_flight", self.max_in_flight == Some(0)),
            (
                "max_os_descriptor_bytes",
                self.max_os_descriptor_bytes == Some(0),
            ),
        ] {
            if zero {
                bail!("{key} = 0 would refuse every request; leave it out for the default");
            }
        }
        parse_caps(&self.caps)?;
        for n in &self.allow {
            // Pass-through controls have no table entries: their names are checked here.
            match pass_through_name(n) {
                Err(e) => bail!("allow: {e}"),
                Ok(Some(normal)) if normal != *n => {
                    bail!("allow: {n:?}: write it as {normal:?} (lowercase hex)")
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// The audit log path: `audit_log`, else `<audit_dir>/<name>.jsonl`, else none.
    pub fn audit_path(&self, daemon: &DaemonSection) -> Option<PathBuf> {
        self.audit_log.clone().or_else(|| {
            daemon
                .audit_dir
                .as_ref()
                .map(|d| d.join(format!("{}.jsonl", self.name)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host without the NVIDIA driver or `/dev/cuse`, like a build machine.
    struct NoHost;

    impl HostProbe for NoHost {
        fn driver_version(&self) -> Option<String> {
            None
        }
        fn gpu_minors(&self) -> Option<Vec<u32>> {
            None
        }
        fn cuse_usable(&self) -> bool {
            false
        }
    }

    fn parse(text: &str) -> Result<Config> {
        Config::parse(text, &NoHost)
    }

    fn load(path: &Path) -> Result<Config> {
        Config::load(path, &NoHost)
    }

    const EXAMPLE: &str = include_str!("../../examples/config.toml");

    fn instance_allowing(allow: &str) -> Result<Config> {
        parse(&format!(
            "driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [0]\nallow = [{allow}]\n"
        ))
    }

    #[test]
    fn test_quotas_default_and_override_and_zero_is_refused() {
        let cfg = parse("driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [0]\n").unwrap();
        assert_eq!(cfg.instances[0].quotas(), ioctl_proxy::Quotas::default());
        let cfg = parse(
            "driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [0]\nmax_open_files = 64\nmax_objects = 10\n",
        )
        .unwrap();
        let q = cfg.instances[0].quotas();
        assert_eq!((q.open_files, q.objects, q.in_flight), (64, 10, 256));
        assert_eq!(q.os_descriptor_bytes, 4 << 30, "the default");
        let cfg = parse(
            "driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [0]\nmax_os_descriptor_bytes = 65536\n",
        )
        .unwrap();
        assert_eq!(cfg.instances[0].quotas().os_descriptor_bytes, 65536);
        let err =
            parse("driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [0]\nmax_objects = 0\n")
                .unwrap_err();
        assert!(format!("{err:#}").contains("max_objects = 0"), "{err:#}");
    }

    #[test]
    fn test_priority_is_a_level_and_medium_by_default() {
        let p = |line: &str| {
            parse(&format!(
                "driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [0]\n{line}\n"
            ))
            .map(|c| c.instances[0].priority)
        };
        assert_eq!(p("").unwrap(), ioctl_proxy::Priority::Medium);
        assert_eq!(p("priority = \"low\"").unwrap(), ioctl_proxy::Priority::Low);
        assert_eq!(
            p("priority = \"high\"").unwrap(),
            ioctl_proxy::Priority::High
        );
        let err = format!("{:#}", p("priority = \"urgent\"").unwrap_err());
        assert!(err.contains("low") && err.contains("high"), "{err}");
    }

    #[test]
    fn test_gpu_memory_sizes_and_bad_sizes() {
        let q = |v: &str| {
            parse(&format!(
                "driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [0]\ngpu_memory = {v}\n"
            ))
            .map(|c| c.instances[0].quotas().gpu_memory)
        };
        assert_eq!(q("\"10GiB\"").unwrap(), Some(10 << 30));
        assert_eq!(q("\"512MiB\"").unwrap(), Some(512 << 20));
        assert_eq!(q("\"1.5GiB\"").unwrap(), Some(3 << 29));
        assert_eq!(q("\"8GB\"").unwrap(), Some(8_000_000_000));
        assert_eq!(q("4096").unwrap(), Some(4096));
        let none = parse("driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [0]\n");
        let none = none.unwrap().instances[0].quotas();
        assert_eq!((none.gpu_memory, none.system_memory), (None, None));
        let sys = parse(
            "driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [0]\nsystem_memory = \"32GiB\"\n",
        );
        assert_eq!(
            sys.unwrap().instances[0].quotas().system_memory,
            Some(32 << 30)
        );
        for bad in [
            "\"10 parsecs\"",
            "\"GiB\"",
            "\"ten GiB\"",
            "0",
            "\"0GiB\"",
            "\"-1GiB\"",
        ] {
            let err = format!("{:#}", q(bad).unwrap_err());
            assert!(err.contains("size") || err.contains("unit"), "{bad}: {err}");
            assert!(!err.contains("ByteSize"), "no debug formatting: {err}");
        }
        assert!(format!("{:#}", q("\"10 parsecs\"").unwrap_err()).contains("unknown unit"));
        assert!(format!("{:#}", q("\"ten GiB\"").unwrap_err()).contains("is not a size"));
    }

    #[test]
    fn test_overcommit_off_refuses_quotas_past_a_gpus_memory() {
        let cfg = |over: &str, a: &str, b: &str| {
            parse(&format!(
                "driver = \"sim\"\n[daemon]\n{over}\n\
                 [[instance]]\nname = \"a\"\ngpus = [0]\ngpu_memory = \"{a}\"\n\
                 [[instance]]\nname = \"b\"\ngpus = [0]\ngpu_memory = \"{b}\"\n"
            ))
        };
        // The simulated GPU has 80 GiB.
        assert!(cfg("", "60GiB", "60GiB").is_ok(), "overcommit by default");
        assert!(cfg("overcommit_gpu_memory = false", "40GiB", "40GiB").is_ok());
        let err = cfg("overcommit_gpu_memory = false", "60GiB", "30GiB").unwrap_err();
        assert!(
            format!("{err:#}").contains("add up to 90.0 GiB, more than its 80.0 GiB"),
            "{err:#}"
        );
    }

    #[test]
    fn test_allow_takes_pass_through_families_and_normalised_commands() {
        let cfg = instance_allowing(
            "\"RM_GSS_LEGACY\", \"NV2081_BINAPI\", \"RM_GSS_LEGACY 0x20808b5A\", \
             \"NV2081_BINAPI 0x20810108\"",
        )
        .unwrap();
        assert_eq!(
            cfg.instances[0].allow,
            [
                "RM_GSS_LEGACY",
                "NV2081_BINAPI",
                "RM_GSS_LEGACY 0x20808b5a",
                "NV2081_BINAPI 0x20810108"
            ]
        );
    }

    #[test]
    fn test_allow_refuses_bad_pass_through_commands_naming_them() {
        for (bad, want) in [
            ("RM_GSS_LEGACY 0x20800159", "bit 0x8000 is clear"),
            ("NV2081_BINAPI 0x20800108", "its class is 0x2080"),
            (
                "RM_GSS_LEGACY 0x2080c159",
                "never forwarded: the proxy refuses privileged legacy GSS controls",
            ),
            (
                "RM_GSS_LEGACY 0xzz",
                "is not a valid RM_GSS_LEGACY policy name",
            ),
        ] {
            let msg = format!(
                "{:#}",
                instance_allowing(&format!("\"{bad}\"")).unwrap_err()
            );
            assert!(
                msg.contains(&format!("allow: \"{bad}\"")) && msg.contains(want),
                "{bad}: {msg}"
            );
        }
    }

    #[test]
    fn test_instance_allow_unnormalised_command_is_refused_with_its_normal_form() {
        // `nvproxy exec --allow` builds the instance without Config::parse.
        let mut cfg = instance_allowing("").unwrap();
        cfg.instances[0].allow = vec!["RM_GSS_LEGACY 0x20808b5A".into()];
        let msg = format!("{:#}", cfg.instances[0].validate().unwrap_err());
        assert!(
            msg.contains("write it as \"RM_GSS_LEGACY 0x20808b5a\""),
            "{msg}"
        );
    }

    #[test]
    fn test_example_config_parses() {
        let cfg = parse(EXAMPLE).unwrap();
        assert_eq!(cfg.driver, DriverKind::Sim);
        assert_eq!(cfg.instances.len(), 2);
        assert_eq!(cfg.instances[0].mode, Mode::Enforce);
    }

    #[test]
    fn test_unrestricted_mmap_fds_is_an_explicit_opt_in() {
        assert!(!parse("").unwrap().daemon.allow_unrestricted_mmap_fds);
        let cfg = parse("[daemon]\nallow_unrestricted_mmap_fds = true\n").unwrap();
        assert!(cfg.daemon.allow_unrestricted_mmap_fds);
    }

    #[test]
    fn test_unknown_key_is_an_error() {
        let err = parse("driver = \"sim\"\nbogus = 1\n").unwrap_err();
        assert!(format!("{err:#}").contains("bogus"), "{err:#}");
    }

    #[test]
    fn test_worker_uids_and_metrics_listen_are_checked() {
        let ok =
            parse("[daemon]\nworker_uids = \"61000-61009\"\nmetrics_listen = \"127.0.0.1:9464\"\n")
                .unwrap();
        assert_eq!(
            parse_uid_range(ok.daemon.worker_uids.as_deref().unwrap()).unwrap(),
            (61000, 61009)
        );
        for bad in ["0-10", "10-5", "x-5", "61000"] {
            let err = parse(&format!("[daemon]\nworker_uids = \"{bad}\"\n")).unwrap_err();
            assert!(format!("{err:#}").contains("FIRST-LAST"), "{bad}: {err:#}");
        }
        let err = parse("[daemon]\nmetrics_listen = \"localhost\"\n").unwrap_err();
        assert!(format!("{err:#}").contains("metrics_listen"), "{err:#}");
        // A port alone is loopback's.
        for port in ["9464", ":9464"] {
            assert_eq!(
                metrics_addr(port).unwrap(),
                "127.0.0.1:9464".parse().unwrap(),
                "{port}"
            );
        }
        assert_eq!(
            metrics_addr("[::1]:9464").unwrap(),
            "[::1]:9464".parse().unwrap()
        );
        let cdi = parse("[cdi]\nspec = \"\"\n").unwrap();
        assert!(cdi.cdi.spec.as_os_str().is_empty());
        assert_eq!(
            parse("").unwrap().cdi.spec,
            PathBuf::from("/run/cdi/nvproxy.yaml")
        );
    }

    #[test]
    fn test_instance_transport_defaults_to_auto_and_takes_socket() {
        let mut c = parse("[[instance]]\nname = \"a\"\ngpus = [0]\n").unwrap();
        assert_eq!(c.instances[0].transport, Transport::Auto);
        c.resolve_transports(false);
        assert_eq!(c.instances[0].transport, Transport::Socket);
        let mut c = parse("[[instance]]\nname = \"a\"\ngpus = [0]\n").unwrap();
        c.resolve_transports(true);
        assert_eq!(c.instances[0].transport, Transport::Cuse);
        let mut c =
            parse("[[instance]]\nname = \"a\"\ngpus = [0]\ntransport = \"cuse\"\n").unwrap();
        c.resolve_transports(false);
        assert_eq!(
            c.instances[0].transport,
            Transport::Cuse,
            "an explicit choice stays"
        );
        let c = parse("[[instance]]\nname = \"a\"\ngpus = [0]\ntransport = \"socket\"\n").unwrap();
        assert_eq!(c.instances[0].transport, Transport::Socket);
        let err =
            parse("[[instance]]\nname = \"a\"\ngpus = [0]\ntransport = \"tcp\"\n").unwrap_err();
        assert!(format!("{err:#}").contains("tcp"), "{err:#}");
    }

    #[test]
    fn test_bad_instance_name_is_refused() {
        let err = parse("[[instance]]\nname = \"../x\"\ngpus = [0]\n").unwrap_err();
        assert!(format!("{err:#}").contains("must match"), "{err:#}");
    }

    #[test]
    fn test_duplicate_instance_is_refused() {
        let text =
            "[[instance]]\nname = \"a\"\ngpus = [0]\n[[instance]]\nname = \"a\"\ngpus = [1]\n";
        assert!(format!("{:#}", parse(text).unwrap_err()).contains("twice"));
    }

    #[test]
    fn test_unknown_cap_is_refused() {
        let text = "[[instance]]\nname = \"a\"\ngpus = [0]\ncaps = [\"display\"]\n";
        assert!(format!("{:#}", parse(text).unwrap_err()).contains("unknown capability"));
    }

    #[test]
    fn test_empty_gpu_set_is_refused() {
        let text = "[[instance]]\nname = \"a\"\ngpus = []\n";
        assert!(format!("{:#}", parse(text).unwrap_err()).contains("at least one"));
    }

    #[test]
    fn test_bad_sim_version_is_refused() {
        let text = "driver = \"sim\"\n[sim]\ndriver_version = \"5x5\"\n";
        assert!(format!("{:#}", parse(text).unwrap_err()).contains("driver_version"));
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nvproxy-config-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn test_a_relative_run_dir_is_the_config_files_neighbour() {
        let d = scratch("run-dir");
        let path = d.join("c.toml");
        std::fs::write(&path, "[daemon]\nrun_dir = \"run\"\n").unwrap();
        let cfg = load(&path).unwrap();
        assert_eq!(cfg.daemon.run_dir, Some(d.join("run")));
        std::fs::write(&path, "[daemon]\nrun_dir = \"/srv/nv\"\n").unwrap();
        let cfg = load(&path).unwrap();
        assert_eq!(cfg.daemon.run_dir, Some(PathBuf::from("/srv/nv")));
        assert_eq!(parse("").unwrap().daemon.run_dir, None);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn test_policy_file_is_resolved_next_to_the_config_and_checked() {
        let d = scratch("policy");
        std::fs::write(
            d.join("p.toml"),
            "[policy]\nallow_only = true\nescapes = [\"NV_ESC_CARD_INFO\"]\n",
        )
        .unwrap();
        let cfg_text =
            "driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [0]\npolicy = \"p.toml\"\n";
        std::fs::write(d.join("c.toml"), cfg_text).unwrap();
        let cfg = load(&d.join("c.toml")).unwrap();
        assert_eq!(
            cfg.instances[0].policy.as_deref(),
            Some(d.join("p.toml").as_path())
        );
        assert!(
            cfg.summary(&NoHost).contains("policy "),
            "{}",
            cfg.summary(&NoHost)
        );

        std::fs::write(
            d.join("p.toml"),
            "[policy]\nallow_only = true\nescapes = [\"NV_ESC_NOPE\"]\n",
        )
        .unwrap();
        let err = format!("{:#}", load(&d.join("c.toml")).unwrap_err());
        assert!(
            err.contains("NV_ESC_NOPE") && err.contains("instance \"a\""),
            "{err}"
        );

        std::fs::remove_file(d.join("p.toml")).unwrap();
        let err = format!("{:#}", load(&d.join("c.toml")).unwrap_err());
        assert!(err.contains("p.toml"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn parse_err(text: &str) -> String {
        format!("{:#}", parse(text).unwrap_err())
    }

    #[test]
    fn test_gpu_index_the_simulated_driver_lacks_is_refused() {
        // What `serve` refused as "host has no GPU /dev/nvidia5".
        let msg = parse_err(
            "driver = \"sim\"\n[sim]\ngpus = 2\n[[instance]]\nname = \"a\"\ngpus = [0, 5]\n",
        );
        assert!(
            msg.contains("instance \"a\": gpus: no GPU 5 on the simulated driver")
                && msg.contains("[sim] gpus = 2 gives it GPUs 0-1"),
            "{msg}"
        );
        let msg = parse_err("driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [1]\n");
        assert!(msg.contains("[sim] gpus = 1 gives it only GPU 0"), "{msg}");
        // The host driver's GPUs are not known to `parse` (`load` reads /proc).
        assert!(parse("[[instance]]\nname = \"a\"\ngpus = [5]\n").is_ok());
    }

    #[test]
    fn test_more_simulated_gpus_than_the_driver_supports_is_refused() {
        let msg = parse_err("driver = \"sim\"\n[sim]\ngpus = 33\n");
        assert!(
            msg.contains("between 1 and 32") && msg.contains("33"),
            "{msg}"
        );
        assert!(parse("driver = \"sim\"\n[sim]\ngpus = 32\n").is_ok());
    }

    #[test]
    fn test_host_gpu_minors_are_checked_against_the_drivers() {
        assert!(check_host_gpus(&[0, 1], &[0, 1]).is_ok());
        let msg = format!("{:#}", check_host_gpus(&[1, 5], &[0, 1]).unwrap_err());
        assert!(
            msg.contains("no GPU with minor 5") && msg.contains(": 0, 1)"),
            "{msg}"
        );
    }

    #[test]
    fn test_abi_version_must_name_a_known_version_and_abi_dir_must_verify() {
        let dir = std::env::temp_dir().join(format!("nvproxy-cfg-abi-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("abi.d")).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let ok = write(
            "ok.toml",
            "driver = \"sim\"\n[daemon]\nabi_version = \"580.142\"\nabi_dir = \"abi.d\"\n",
        );
        let cfg = load(&ok).unwrap();
        assert_eq!(cfg.daemon.abi_dir, Some(dir.join("abi.d")));
        let bad = write(
            "bad.toml",
            "driver = \"sim\"\n[daemon]\nabi_version = \"580.299.01\"\n",
        );
        let msg = format!("{:#}", load(&bad).unwrap_err());
        assert!(
            msg.contains("[daemon] abi_version = \"580.299.01\": no node"),
            "{msg}"
        );
        std::fs::write(dir.join("abi.d/x.json"), "{}").unwrap();
        let msg = format!("{:#}", load(&ok).unwrap_err());
        assert!(
            msg.contains("[daemon] abi_dir") && msg.contains("x.json"),
            "{msg}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_unknown_sim_driver_version_is_refused() {
        for v in ["999.100.01", "535.400.01"] {
            let msg = parse_err(&format!(
                "driver = \"sim\"\n[sim]\ndriver_version = \"{v}\"\n"
            ));
            assert!(
                msg.contains(&format!(
                    "[sim] driver_version = \"{v}\": nvproxy has no ABI tables for driver {v}"
                )) && msg.contains("nvproxy abi versions"),
                "{msg}"
            );
        }
        // Known versions pass, supported or not.
        assert!(parse("[sim]\ndriver_version = \"535.216.03\"\n").is_ok());
    }

    #[test]
    fn test_unknown_allow_name_is_refused_naming_the_nearest() {
        let msg = format!(
            "{:#}",
            instance_allowing("\"NV_ESC_CARD_INF\"").unwrap_err()
        );
        assert!(
            msg.contains("instance \"a\": allow: NV_ESC_CARD_INF is not a name in the ABI table of driver 535.261.03")
                && msg.contains("nearest known: NV_ESC_CARD_INFO")
                && msg.contains("`nvproxy abi show 535.261.03` lists them all"),
            "{msg}"
        );
        let msg = format!(
            "{:#}",
            instance_allowing("\"NV_NOT_A_THING\", \"NV_ESC_RM_CONTROL\"").unwrap_err()
        );
        assert!(
            msg.contains("NV_NOT_A_THING is not a name") && !msg.contains("NV_ESC_RM_CONTROL is"),
            "{msg}"
        );
        // Names of every kind are accepted.
        instance_allowing(
            "\"NV_ESC_CARD_INFO\", \"NV2080_CTRL_CMD_GPU_QUERY_ECC_CONFIGURATION\", \
             \"NV01_ROOT_CLIENT\", \"UVM_INITIALIZE\"",
        )
        .unwrap();
    }

    #[test]
    fn test_unknown_allow_name_is_refused_for_the_host_driver_too() {
        // No host driver here: every known version's names.
        let msg = parse_err("[[instance]]\nname = \"a\"\ngpus = [0]\nallow = [\"NV_NOPE\"]\n");
        assert!(
            msg.contains("NV_NOPE is not a name in the ABI table of"),
            "{msg}"
        );
    }

    #[test]
    fn test_summary_uses_the_config_spellings() {
        let cfg = parse(
            "driver = \"sim\"\n[sim]\ngpus = 2\n[daemon]\nmemory = \"process-vm\"\n\
             [[instance]]\nname = \"a\"\ngpus = [1, 0]\nallow = [\"NV_ESC_CARD_INFO\"]\n\
             [[instance]]\nname = \"b\"\ngpus = [0]\nmode = \"audit\"\n",
        )
        .unwrap();
        let s = cfg.summary(&NoHost);
        assert!(s.contains("client memory: process-vm\n"), "{s}");
        assert!(
            s.contains(
                "instance a: gpus 1, 0, caps compute,utility, mode enforce, allow NV_ESC_CARD_INFO,"
            ) || s.contains("instance a: gpus 1, 0, caps ")
                && s.contains("mode enforce, allow NV_ESC_CARD_INFO,"),
            "{s}"
        );
        assert!(s.contains("mode audit, allow nothing"), "{s}");
        assert!(
            !s.contains("ProcessVm") && !s.contains("Enforce") && !s.contains('"'),
            "{s}"
        );
        let retry = parse("[daemon]\nmemory = \"retry\"\n").unwrap();
        assert!(retry.summary(&NoHost).contains("client memory: retry"));
    }

    #[test]
    fn test_serve_driver_override_checks_the_config_again() {
        let cfg = parse("[sim]\ngpus = 1\n[[instance]]\nname = \"a\"\ngpus = [3]\n").unwrap();
        let msg = format!(
            "{:#}",
            cfg.with_driver(DriverKind::Sim, &NoHost).unwrap_err()
        );
        assert!(
            msg.contains("with --driver sim") && msg.contains("no GPU 3"),
            "{msg}"
        );
    }

    #[test]
    fn test_all_caps_expand_to_the_four() {
        assert_eq!(parse_caps(&["all".into()]).unwrap(), Caps::ALL_CONTAINER);
    }
}
