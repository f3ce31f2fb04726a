//! The instance verbs: `nvproxy exec` (one instance around one command, in an ephemeral
//! worker), `nvproxy serve` (the supervisor of one worker process per instance,
//! `supervisor.rs`) and `nvproxy run` (a command with the nodes of a served instance). The
//! instance they run is `running.rs`'s [`RunningInstance`](nvproxy_worker::running::RunningInstance).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nvsim::SimDriver;

use nvproxy_config::{DriverKind, InstanceConfig, MemoryTransport, Mode};
use nvproxy_worker::mmap::{self};
use nvproxy_worker::running::{LEAK_EXIT, make_driver};
use nvproxy_worker::sys;

/// `nvproxy exec` options.
#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The driver to forward to.
    #[arg(long, value_enum, default_value_t = DriverKind::Host)]
    pub driver: DriverKind,
    /// Number of simulated GPUs (--driver sim).
    #[arg(long, default_value_t = 1)]
    pub sim_gpus: u32,
    /// Driver version the simulated driver reports (selects the ABI node).
    #[arg(long, default_value = nvproxy_config::DEFAULT_SIM_VERSION)]
    pub sim_driver_version: String,
    /// Host GPU minors the instance gets, comma-separated (default: all of the simulated GPUs;
    /// with --driver host, required).
    #[arg(long, value_delimiter = ',')]
    pub gpus: Option<Vec<u32>>,
    /// Driver capabilities, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "compute,utility")]
    pub caps: Vec<String>,
    /// Video memory the instance may hold on each of its GPUs (e.g. 10GiB, 512MiB); past it
    /// allocations fail as on a full GPU. Default: no quota.
    #[arg(long, value_name = "SIZE")]
    pub gpu_memory: Option<nvproxy_config::ByteSize>,
    /// System memory the driver may allocate for the instance (pinned host pages no memory
    /// cgroup sees; e.g. 32GiB); past it allocations fail as on a host out of pages. Default:
    /// no quota.
    #[arg(long, value_name = "SIZE")]
    pub system_memory: Option<nvproxy_config::ByteSize>,
    /// Scheduling priority of the instance's channel groups: low, medium (the driver's
    /// default) or high.
    #[arg(long, value_name = "LEVEL", default_value_t = ioctl_proxy::Priority::Medium)]
    pub priority: ioctl_proxy::Priority,
    /// enforce, or audit (allow what the ABI knows, record what enforce would deny).
    #[arg(long, value_enum, default_value_t = Mode::Enforce)]
    pub mode: Mode,
    /// Entries allowed beyond the caps (driver names), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub allow: Vec<String>,
    /// Write audit events (JSON lines) here.
    #[arg(long)]
    pub audit_log: Option<PathBuf>,
    /// A policy file (TOML, e.g. from `nvproxy policy suggest --from-audit`): with
    /// `allow_only = true` exactly its entries are allowed, whatever --caps.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// How client memory is read.
    #[arg(long, value_enum, default_value_t = MemoryTransport::ProcessVm)]
    pub memory: MemoryTransport,
    /// With --driver sim: exit with status 3 if the simulated driver still holds clients,
    /// objects or files after the command ended.
    #[arg(long)]
    pub check_leaks: bool,
    /// With --driver host on a kernel without Landlock ABI 5: hand the command unrestricted
    /// host driver fds for RM memory mmaps (it could then issue raw driver ioctls on them).
    #[arg(long)]
    pub allow_unrestricted_mmap_fds: bool,
    /// Refuse mmap of /dev/nvidia-uvm (the instance's `uvm_mmap = false`): the tenant then
    /// never holds the host UVM fd, and CUDA's managed memory is unavailable.
    #[arg(long)]
    pub no_uvm_mmap: bool,
    /// How the command reaches the instance: `cuse` (CUSE nodes at /dev/nvidia*), `socket`
    /// (no device nodes: the shim forwards /dev/nvidia* to the worker over a unix socket; for
    /// kernels without CUSE; needs the shim) or `auto` (cuse where /dev/cuse can be opened,
    /// else socket).
    #[arg(long, value_enum, default_value_t = nvproxy_config::Transport::Auto)]
    pub transport: nvproxy_config::Transport,
    /// Record every call the instance makes to the driver to FILE (JSON lines: node, names,
    /// request and reply bytes, NV status, errno; appended).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// The record file's bound (default 16MiB); recording stops past it and says so once.
    #[arg(long, value_name = "SIZE", requires = "record")]
    pub record_limit: Option<nvproxy_config::ByteSize>,
    #[command(flatten)]
    pub shim: ShimArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// How `exec`/`run` give the command the mmap shim.
#[derive(Debug, clap::Args)]
pub struct ShimArgs {
    /// The mmap shim to add to the command's LD_PRELOAD (default: libnvproxy_preload.so next to
    /// the nvproxy binary).
    #[arg(long, value_name = "PATH")]
    pub preload: Option<PathBuf>,
    /// Do not inject the shim or mount the instance socket (mmap of the nodes then fails with
    /// ENODEV).
    #[arg(long, conflicts_with = "preload")]
    pub no_preload: bool,
}

impl ShimArgs {
    /// The shim to inject, or None with --no-preload. A missing `--preload PATH` is an error; a
    /// missing default shim is a warning (the command runs, and its mmaps of the nodes fail
    /// with ENODEV), so that a build of the daemon alone still runs everything but mmap.
    fn resolve(&self) -> Result<Option<PathBuf>> {
        if self.no_preload {
            return Ok(None);
        }
        match (&self.preload, mmap::shim_path(self.preload.as_deref())) {
            (_, Ok(p)) => Ok(Some(p)),
            (Some(_), Err(e)) => Err(e),
            (None, Err(e)) => {
                tracing::warn!("{e:#}; running the command without it");
                Ok(None)
            }
        }
    }
}

/// Refuses `verb` to a caller that is not root, saying why it needs root.
fn need_root(verb: &str, why: &str) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("nvproxy {verb} needs root: {why} (run it as root, e.g. with sudo)");
    }
    Ok(())
}

/// `nvproxy exec`: one instance around one command.
pub fn exec(args: &ExecArgs) -> Result<ExitCode> {
    need_root(
        "exec",
        "it serves the instance from the run directory and runs the command in a mount \
         namespace of its own",
    )?;
    // Before any thread starts: signals to nvproxy go to the command, and the instance is
    // always stopped (its audit counts written) after the command.
    crate::child::block_termination_signals()?;
    // What execs killed with SIGKILL left (they cannot remove their own).
    crate::exec_scratch::sweep(&std::env::temp_dir());
    crate::exec_scratch::sweep_run_dir(&nvproxy_worker::paths::host_run_dir(None));
    let driver = make_driver(
        args.driver,
        args.sim_gpus,
        &args.sim_driver_version,
        args.allow_unrestricted_mmap_fds,
        None,
    )?;
    let gpus = match (&args.gpus, args.driver) {
        (Some(g), _) => g.clone(),
        (None, DriverKind::Sim) => (0..args.sim_gpus).collect(),
        (None, DriverKind::Host) => bail!(
            "--gpus is required with --driver host: name the host GPU minors the command gets \
             (e.g. --gpus 0 for /dev/nvidia0), or use --driver sim"
        ),
    };
    if args.driver == DriverKind::Sim {
        nvproxy_config::check_sim_gpus(
            &gpus,
            args.sim_gpus,
            &format!("--sim-gpus {}", args.sim_gpus),
        )
        .context("--gpus")?;
    }
    let transport = args.transport.resolve(nvproxy_worker::host::cuse_usable());
    if args.transport == nvproxy_config::Transport::Auto {
        tracing::info!(%transport, "transport auto");
    }
    let inst = InstanceConfig {
        name: format!("exec-{}", std::process::id()),
        gpus,
        caps: args.caps.clone(),
        mode: args.mode,
        allow: args.allow.clone(),
        audit_log: args.audit_log.clone(),
        policy: args.policy.clone(),
        uvm_mmap: !args.no_uvm_mmap,
        max_open_files: None,
        max_objects: None,
        max_in_flight: None,
        max_os_descriptor_bytes: None,
        gpu_memory: args.gpu_memory,
        system_memory: args.system_memory,
        priority: args.priority,
        restart: nvproxy_config::RestartPolicy::No,
        user: None,
        transport,
        record: match &args.record {
            Some(p) => Some(std::path::absolute(p).context("--record")?),
            None => None,
        },
        record_limit: args.record_limit,
    };
    inst.validate()?;
    nvproxy_config::policy::check_allow(
        &inst.allow,
        &nvproxy_config::policy::AbiNames::for_version(driver.host.version())?,
    )
    .context("--allow")?;
    let shim = args.shim.resolve()?;
    if transport == nvproxy_config::Transport::Socket && args.memory == MemoryTransport::Retry {
        bail!(
            "--memory retry is a CUSE protocol; the socket transport reads client memory with \
             process_vm_readv (drop --memory retry)"
        );
    }
    if transport == nvproxy_config::Transport::Socket && shim.is_none() {
        bail!(
            "the socket transport needs the shim ({}): it is what serves /dev/nvidia* to the \
             command; build it (`cargo build -p preload`) or pass --preload PATH",
            mmap::SHIM_NAME
        );
    }
    // The instance is served by a worker process, as under `serve` (its own driver files and
    // RM clients; with --driver sim its own simulated driver, configured as ours); it stops
    // after the command, and with us if we die (`ephemeral`: PR_SET_PDEATHSIG).
    let spec = nvproxy_worker::worker_spec::WorkerSpec {
        instance: inst.clone(),
        driver: args.driver,
        sim: nvproxy_config::SimSection {
            gpus: args.sim_gpus,
            driver_version: args.sim_driver_version.clone(),
            process: false,
        },
        memory: args.memory,
        audit: args.audit_log.clone(),
        allow_unrestricted_mmap_fds: args.allow_unrestricted_mmap_fds,
        abi_version: None,
        abi_dir: None,
        ephemeral: true,
        run_as: None,
        sim_socket: None,
        take_over: false,
        run_dir: nvproxy_worker::paths::host_run_dir(None),
    };
    let root = &spec.run_dir.clone();
    let sup = crate::supervisor::Supervisor::new(root, None)?;
    sup.create(spec)?;
    let socket_transport = transport == nvproxy_config::Transport::Socket;
    let nodes: Vec<(PathBuf, String)> = std::iter::once(nvproxy_worker::node::Node::Ctl)
        .chain(
            (0..u32::try_from(inst.gpus.len()).unwrap_or(0)).map(nvproxy_worker::node::Node::Gpu),
        )
        .chain(std::iter::once(nvproxy_worker::node::Node::Uvm))
        .map(|n| {
            (
                nvproxy_worker::instance::node_path(&inst.name, n),
                n.dev_name(),
            )
        })
        .filter(|_| !socket_transport)
        .collect();

    let exe = std::env::current_exe().context("finding our own executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("ns-exec").arg("--driver-params");
    for (path, name) in &nodes {
        cmd.arg("--node").arg(format!("{}={name}", path.display()));
    }
    // The simulated driver's /proc and /sys files, for ns-exec to copy; removed when the
    // command ended (a dead exec's by the next exec: `exec_scratch::sweep` above).
    let scratch = match &driver.sim {
        Some(sim) => {
            let s = crate::exec_scratch::Scratch::create(&std::env::temp_dir())?;
            let (proc_dir, sys_dir) = (s.path().join("proc"), s.path().join("sys"));
            write_sim_proc(sim, &proc_dir, &inst.gpus)?;
            write_sim_sys(sim, &sys_dir, &inst.gpus)?;
            cmd.arg("--sim-proc")
                .arg(proc_dir)
                .arg("--sim-sys")
                .arg(sys_dir);
            Some(s)
        }
        None => None,
    };
    if let (true, Some(shim)) = (socket_transport, &shim) {
        nvproxy_worker::socket_transport::ns_exec_args(
            &mut cmd,
            root,
            &inst.name,
            shim,
            inst.gpus.len(),
        );
    } else if let Some(shim) = &shim {
        let socket = root
            .join(&inst.name)
            .join(nvproxy_worker::paths::MMAP_SOCKET);
        cmd.arg("--mmap-socket")
            .arg(&socket)
            .arg("--preload")
            .arg(shim)
            .arg("--nvproxy-nodes")
            .arg(mmap::node_ids(nodes.iter().map(|(p, _)| p.as_path()))?);
    }
    cmd.arg("--").args(&args.command);
    let status = crate::child::run_forwarding_signals(&mut cmd);
    drop(scratch);
    // The worker stops (its leak check: exit status LEAK_EXIT when its simulated driver still
    // held something).
    let worker_status = sup.remove(&inst.name, true)?;
    let clean = worker_status == Some(0);
    if !clean {
        tracing::warn!(status = ?worker_status, "the instance's worker did not stop cleanly");
    }
    drop(driver);
    let status = status?;

    let code = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        (None, None) => 1,
    };
    if args.check_leaks && !clean {
        return Ok(ExitCode::from(LEAK_EXIT));
    }
    Ok(ExitCode::from(code))
}

/// Writes the simulated driver's `/proc/driver/nvidia` files (`nvsim::procfs`) into the new
/// directory `dir` (in the exec's scratch directory) for `ns-exec --sim-proc` (ns-exec copies
/// the files into its namespace).
fn write_sim_proc(sim: &SimDriver, dir: &Path, gpus: &[u32]) -> Result<()> {
    for f in nvsim::procfs::proc_files(sim.config(), gpus) {
        let path = dir.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, f.text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Writes the simulated GPUs' PCI tree (`nvsim::sysfs`, with the host's NUMA nodes) into the
/// new directory `dir` (in the exec's scratch directory) for `ns-exec --sim-sys`.
fn write_sim_sys(sim: &SimDriver, dir: &Path, gpus: &[u32]) -> Result<()> {
    std::fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
    for e in nvsim::sysfs::pci_entries(sim.config(), gpus, &host_numa_nodes()) {
        let path = dir.join(&e.path);
        match e.node {
            nvsim::sysfs::SysNode::Dir => std::fs::create_dir_all(&path),
            nvsim::sysfs::SysNode::File(data) => std::fs::write(&path, data),
            nvsim::sysfs::SysNode::Link(target) => std::os::unix::fs::symlink(target, &path),
        }
        .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The host's NUMA nodes with their CPUs (`/sys/devices/system/node/node<N>/{cpumap,cpulist}`),
/// in node order; on a kernel without NUMA, node -1 with the online CPUs.
fn host_numa_nodes() -> Vec<nvsim::sysfs::NumaNode> {
    let read = |p: &Path| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
    let mut nodes: Vec<nvsim::sysfs::NumaNode> = std::fs::read_dir("/sys/devices/system/node")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let id = e.file_name().to_str()?.strip_prefix("node")?.parse().ok()?;
            Some(nvsim::sysfs::NumaNode {
                id,
                cpumap: read(&e.path().join("cpumap"))?,
                cpulist: read(&e.path().join("cpulist"))?,
            })
        })
        .collect();
    nodes.sort_by_key(|n| n.id);
    if nodes.is_empty()
        && let Some(list) = read(Path::new("/sys/devices/system/cpu/online"))
    {
        nodes.push(nvsim::sysfs::NumaNode {
            id: -1,
            cpumap: cpumask_of_list(&list),
            cpulist: list,
        });
    }
    nodes
}

/// A CPU list (`0-3,8`) as mask text like the kernel's `%*pb` (32-bit hex words, most
/// significant first, comma-separated; not padded to `nr_cpu_ids` as the kernel's is).
fn cpumask_of_list(list: &str) -> String {
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
            cpus.extend(a..=b);
        }
    }
    let words = cpus.iter().max().map_or(1, |m| m / 32 + 1);
    let mut w = vec![0u32; words];
    for c in cpus {
        w[c / 32] |= 1 << (c % 32);
    }
    let mut out: Vec<String> = w.iter().rev().map(|x| format!("{x:08x}")).collect();
    if let Some(first) = out.first_mut() {
        *first = format!("{:x}", w[words - 1]);
    }
    out.join(",")
}

/// `nvproxy serve` options.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The configuration file (TOML; see examples/config.toml).
    #[arg(long)]
    pub config: PathBuf,
    /// Override the file's driver choice.
    #[arg(long, value_enum)]
    pub driver: Option<DriverKind>,
    /// With the simulated driver: exit with status 3 if it still holds anything after stopping.
    #[arg(long)]
    pub check_leaks: bool,
    /// Serve a host driver version that has no node with this known version's tables (the
    /// config's `[daemon] abi_version`; at your own risk, warned about at start).
    #[arg(long, value_name = "VERSION")]
    pub abi_version: Option<String>,
}

/// `nvproxy serve`: the supervisor (`supervisor.rs`). Refuses to start while another serve
/// owns the run directory (`ServeLock`); adopts the workers a previous supervisor left serving, starts a worker for every other instance of the config, serves the
/// instance API, prints `READY <instances>` (and `READY=1` to systemd), watches the workers
/// until SIGINT/SIGTERM/SIGHUP, then stops them (unless `[daemon] keep_workers`).
pub fn serve(args: &ServeArgs) -> Result<ExitCode> {
    need_root(
        "serve",
        "its workers open the driver, own the run directory and read their clients' memory",
    )?;
    use crate::supervisor::{Supervisor, spec_for};
    let mut cfg = nvproxy_config::Config::load(&args.config, &nvproxy_worker::host::ThisHost)?;
    if let Some(d) = args.driver {
        cfg = cfg
            .with_driver(d, &nvproxy_worker::host::ThisHost)
            .with_context(|| format!("in config {}", args.config.display()))?;
    }
    let cuse = nvproxy_worker::host::cuse_usable();
    for i in cfg
        .instances
        .iter()
        .filter(|i| i.transport == nvproxy_config::Transport::Auto)
    {
        tracing::info!(
            instance = %i.name,
            transport = %i.transport.resolve(cuse),
            "transport auto: {}",
            if cuse { "/dev/cuse can be opened" } else { "no usable /dev/cuse" }
        );
    }
    cfg.resolve_transports(cuse);
    sys::block_termination_signals().context("blocking signals")?;
    // The ABI tables the workers will serve the host driver with: chosen (and any node
    // files verified) here once, so that a bad choice stops `serve` before a worker starts;
    // each worker makes the same choice for its own driver (`WorkerSpec::abi_*`).
    if let Some(v) = &args.abi_version {
        cfg.daemon.abi_version = Some(v.clone());
    }
    {
        let driver = make_driver(
            cfg.driver,
            cfg.sim.gpus,
            &cfg.sim.driver_version,
            cfg.daemon.allow_unrestricted_mmap_fds,
            None,
        )?;
        let choice = nvproxy_config::abi_tables::AbiChoice {
            abi_version: cfg.daemon.abi_version.clone(),
            abi_dir: cfg.daemon.abi_dir.clone(),
        };
        let (_, from) = nvproxy_config::abi_tables::host_tables(driver.host.version(), &choice)?;
        tracing::info!(driver = driver.host.version().trim(), tables = %from, "ABI tables");
    }
    let root = &nvproxy_worker::paths::host_run_dir(cfg.daemon.run_dir.as_deref());
    let worker_uids = match &cfg.daemon.worker_uids {
        Some(r) => Some(nvproxy_config::parse_uid_range(r)?),
        None => None,
    };
    let sup = Supervisor::new(root, worker_uids)?;
    // Held until we return: no other serve adopts (and then stops) our workers meanwhile.
    let _lock = crate::supervisor::ServeLock::acquire(root)?;
    let adopted = sup.adopt();
    for inst in &cfg.instances {
        if adopted.contains(&inst.name) {
            continue;
        }
        if let Err(e) = sup.create(spec_for(&cfg, inst)) {
            sup.stop_all();
            return Err(e);
        }
    }
    let group = match &cfg.daemon.api_group {
        Some(g) => Some(
            nix::unistd::Group::from_name(g)
                .with_context(|| format!("[daemon] api_group {g:?}"))?
                .with_context(|| format!("[daemon] api_group {g:?}: no such group"))?
                .gid
                .as_raw(),
        ),
        None => None,
    };
    let cfg = Arc::new(cfg);
    let api = crate::api::ApiServer::start(
        &root.join(crate::api::SOCKET_NAME),
        sup.clone(),
        cfg.clone(),
        group,
    )
    .context("the control socket")?;
    let _metrics_http = match &cfg.daemon.metrics_listen {
        Some(addr) => {
            let s = sup.clone();
            let addr = nvproxy_config::metrics_addr(addr)?;
            let server =
                crate::metrics::HttpServer::start(&addr.to_string(), move || s.metrics_samples())?;
            if !addr.ip().is_loopback() {
                tracing::warn!(addr = %server.addr(), "metrics served beyond loopback: whoever reaches the address reads every instance's numbers");
            }
            tracing::info!(addr = %server.addr(), "metrics served over HTTP at /metrics");
            Some(server)
        }
        None => None,
    };
    sup.refresh_cdi(&cfg);
    let names: Vec<String> = sup.list().into_iter().map(|i| i.name).collect();
    println!("READY {}", names.join(" "));
    use std::io::Write;
    std::io::stdout().flush().ok();
    if let Err(e) = sys::sd_notify("READY=1") {
        tracing::warn!(error = %e, "sd_notify failed");
    }
    let mut watchdog = sys::Watchdog::from_env();
    let mut signals =
        sys::TerminationSignals::new().context("a signalfd for SIGINT, SIGTERM and SIGHUP")?;
    let sig = loop {
        // Wakes for a signal, a worker's exit, a change of the workers to watch, or the
        // watchdog's next ping: never on a timer of its own.
        sup.take_changes();
        let exits = sup.exit_fds();
        let timeout = match watchdog.until_due() {
            None => PollTimeout::NONE,
            // Rounded up: a timeout of 0 would spin until the ping is due.
            Some(d) => {
                PollTimeout::try_from(d.as_micros().div_ceil(1000)).unwrap_or(PollTimeout::MAX)
            }
        };
        let mut fds: Vec<PollFd<'_>> = [signals.as_fd(), sup.changes_fd()]
            .into_iter()
            .chain(exits.iter().map(std::os::fd::AsFd::as_fd))
            .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
            .collect();
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e).context("waiting for a signal or a worker's exit"),
        }
        drop(fds);
        match signals.take().context("reading a signal")? {
            // `systemctl reload`: every worker is replaced live by the binary on disk now
            // (`upgrade.rs`), one instance after another, while this loop watches on.
            Some(nix::sys::signal::Signal::SIGHUP) => {
                let sup = sup.clone();
                let _ = sys::sd_notify("RELOADING=1");
                let spawned = std::thread::Builder::new()
                    .name("reload".into())
                    .spawn(move || {
                        for (name, r) in sup.upgrade_all() {
                            match r {
                                Ok((old, new)) => tracing::info!(instance = %name, old, new, "reload: worker upgraded"),
                                Err(e) => tracing::error!(instance = %name, error = %format!("{e:#}"), "reload: not upgraded; its worker serves on"),
                            }
                        }
                        let _ = sys::sd_notify("READY=1");
                    });
                if let Err(e) = spawned {
                    tracing::error!(error = %e, "reload: no thread for it");
                }
            }
            Some(sig) => break sig,
            None => {}
        }
        if !sup.check().is_empty() {
            // A restarted worker's nodes have new device numbers.
            sup.refresh_cdi(&cfg);
        }
        watchdog.ping();
    };
    tracing::info!(signal = ?sig, "stopping");
    let _ = sys::sd_notify("STOPPING=1");
    drop(api);
    if cfg.daemon.keep_workers {
        sup.detach_all();
        return Ok(ExitCode::SUCCESS);
    }
    let statuses = sup.stop_all();
    if !cfg.cdi.spec.as_os_str().is_empty() {
        // No engine may resolve devices whose nodes are gone.
        match std::fs::remove_file(&cfg.cdi.spec) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(spec = %cfg.cdi.spec.display(), error = %e, "removing the CDI spec")
            }
        }
    }
    let leaked: Vec<&String> = statuses
        .iter()
        .filter(|(_, s)| **s == Some(i32::from(LEAK_EXIT)))
        .map(|(n, _)| n)
        .collect();
    if !leaked.is_empty() {
        eprintln!(
            "nvproxy: leak check failed in the worker(s) of {}",
            leaked
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        if args.check_leaks {
            return Ok(ExitCode::from(LEAK_EXIT));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `nvproxy run` options.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A served instance's name.
    #[arg(long)]
    pub instance: String,
    #[command(flatten)]
    pub shim: ShimArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// `nvproxy run`: replaces this process with `ns-exec` over a served instance's nodes.
pub fn run(args: &RunArgs) -> Result<std::convert::Infallible> {
    nvproxy_config::validate_instance_name(&args.instance)?;
    let root = nvproxy_worker::paths::host_run_dir(None);
    if let Some(argv) = nvproxy_worker::socket_transport::run_argv(
        &root,
        &args.instance,
        args.shim.resolve()?.as_deref(),
        &args.command,
    )? {
        let exe = std::env::current_exe().context("finding our own executable")?;
        let err = std::os::unix::process::CommandExt::exec(Command::new(exe).args(argv));
        return Err(err).context("executing nvproxy ns-exec");
    }
    let dir = Path::new("/dev/nvproxy").join(&args.instance);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| {
            let socket = nvproxy_worker::paths::run_dir(&root, &args.instance)
                .join(nvproxy_preload_proto::socket::DEV_SOCKET_NAME);
            anyhow::anyhow!(
                "instance {name} is not being served (no {socket}, and {dir}: {e}): start \
                 `nvproxy serve --config FILE` (as root) with a config whose [[instance]] has \
                 name = {name:?}, or create it in a running serve with `nvproxy instance create \
                 {name} --gpus ...`",
                name = args.instance,
                socket = socket.display(),
                dir = dir.display(),
            )
        })?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n == "nvidiactl"
                || n == "nvidia-uvm"
                || n.strip_prefix("nvidia")
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    names.sort();
    let exe = std::env::current_exe().context("finding our own executable")?;
    let mut argv = vec!["ns-exec".to_owned(), "--driver-params".to_owned()];
    for n in &names {
        argv.push("--node".to_owned());
        argv.push(format!("{}={n}", dir.join(n).display()));
    }
    if let Some(shim) = args.shim.resolve()? {
        let socket = root
            .join(&args.instance)
            .join(nvproxy_worker::paths::MMAP_SOCKET);
        if !socket.exists() {
            bail!(
                "instance {} has no mmap socket ({}): is its daemon older than the shim? (--no-preload runs without it)",
                args.instance,
                socket.display()
            );
        }
        let paths: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
        argv.extend([
            "--mmap-socket".to_owned(),
            socket.display().to_string(),
            "--preload".to_owned(),
            shim.display().to_string(),
            "--nvproxy-nodes".to_owned(),
            mmap::node_ids(paths.iter().map(PathBuf::as_path))?,
        ]);
    }
    argv.push("--".to_owned());
    argv.extend(args.command.iter().cloned());
    let err = std::os::unix::process::CommandExt::exec(Command::new(exe).args(argv));
    Err(err).context("executing nvproxy ns-exec")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_cpumask_of_list_is_the_kernels_word_order() {
        assert_eq!(cpumask_of_list("0"), "1");
        assert_eq!(cpumask_of_list("0-3,8"), "10f");
        assert_eq!(cpumask_of_list("0-1,32"), "1,00000003");
        assert_eq!(cpumask_of_list(""), "0");
    }
}
