//! `nvproxy worker`: one instance served by its own process.
//!
//! The supervisor (`nvproxy serve`, `supervisor.rs`) starts one worker per instance: the same
//! binary, `nvproxy worker`, with the instance's [`WorkerSpec`] as JSON on its stdin. The worker
//! builds its own driver (the host's, or its own simulated one), registers the instance's CUSE
//! nodes, its mmap socket and audit log ([`RunningInstance`]), writes its state file
//! (`/run/nvproxy/<instance>/worker.json`: pid and spec, what a restarted supervisor re-adopts
//! it from), answers `stats` on `/run/nvproxy/<instance>/worker.sock`, prints `READY <pid>` on
//! stdout and serves until SIGTERM/SIGINT/SIGHUP. So the RM driver attributes each tenant's
//! clients to its own process, and a crash or exhaustion of one worker (fds, memory, threads)
//! cannot touch another instance.
//!
//! **The simulated driver** with workers: with `[sim] process = true` the instance's `nvsim` is
//! a process of its own (`nvproxy sim-driver`, `simd.rs`) that outlives its workers, as the
//! kernel driver outlives processes; otherwise each worker has its own `nvsim` driver with the
//! configured GPUs. From each worker's point of view it behaves like the real driver; what it
//! cannot show is one tenant's effect on another's view of the same GPUs (GPU attach state,
//! device instances), because no two workers share it. That cross-instance behaviour of one
//! driver is tested in-process (`ioctl-proxy/tests/proxy_sim.rs`: two proxies on one `nvsim`).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::paths::{STATE_FILE, WORKER_SOCKET, run_dir};
use crate::running::{self, RunningInstance};
use crate::sys;
use crate::worker_spec::{CHANNELS_ENV, WorkerSpec, WorkerState, WorkerStats};
use nvproxy_config::DriverKind;
#[cfg(test)]
use nvproxy_config::MemoryTransport;

/// Takes the channels [`CHANNELS_ENV`] names: each must be an open `/dev/cuse` file of ours.
fn inherited_channels() -> Result<Vec<std::os::fd::OwnedFd>> {
    let Some(list) = std::env::var_os(CHANNELS_ENV) else {
        return Ok(Vec::new());
    };
    let list = list.to_string_lossy().into_owned();
    let mut fds: Vec<i32> = Vec::new();
    for item in list.split(',').filter(|s| !s.is_empty()) {
        let fd: i32 =
            item.parse().ok().filter(|&fd| fd > 2).with_context(|| {
                format!("{CHANNELS_ENV}={list}: {item:?} is not an fd number > 2")
            })?;
        if fds.contains(&fd) {
            bail!("{CHANNELS_ENV}={list}: fd {fd} named twice");
        }
        let target = std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .with_context(|| format!("{CHANNELS_ENV}: fd {fd} is not open"))?;
        if target != Path::new("/dev/cuse") {
            bail!(
                "{CHANNELS_ENV}: fd {fd} is {}, not /dev/cuse",
                target.display()
            );
        }
        fds.push(fd);
    }
    sys::take_inherited_fds(&fds).context("taking the inherited /dev/cuse channels")
}

/// `nvproxy worker`: reads the spec from stdin and serves it until a termination signal.
/// Exit status: 0, or [`running::LEAK_EXIT`] when the simulated driver held something after the
/// instance stopped (the supervisor reports it for `--check-leaks`).
pub fn run() -> Result<ExitCode> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("reading the worker spec from stdin")?;
    let spec: WorkerSpec = serde_json::from_str(&text).context("parsing the worker spec")?;
    spec.instance
        .validate()
        .with_context(|| format!("instance {}", spec.instance.name))?;
    sys::block_termination_signals().context("blocking signals")?;
    if spec.ephemeral {
        // An `nvproxy exec`'s worker goes with it, even when it is killed.
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
            .context("PR_SET_PDEATHSIG")?;
    }
    let name = spec.instance.name.clone();
    let dir = run_dir(&spec.run_dir, &name);
    let started = if spec.take_over {
        crate::upgrade::take_over(&spec, &dir.join(WORKER_SOCKET))
            .context("taking over from the old worker")
    } else {
        start_instance(&spec)
    };
    let (running, mut driver) = match started {
        Ok(r) => r,
        Err(e) => {
            // What went wrong, for the supervisor, which reports it (exec's and serve's error,
            // the instance API's answer, the log of a restart): printing it here as well
            // would show the user the same line twice.
            println!("FAILED {}", format!("{e:#}").replace('\n', " "));
            std::io::stdout().flush().ok();
            tracing::debug!(instance = %name, error = %format!("{e:#}"), "worker did not start");
            return Ok(ExitCode::FAILURE);
        }
    };
    let running = Arc::new(running);

    let control = Arc::new(
        crate::checkpoint::Control::new(&running, driver.host.clone())
            .with_sim_socket(spec.sim_socket.clone())
            .with_gpu_set(spec.instance.gpus.clone()),
    );
    let stats = StatsServer::start(&dir.join(WORKER_SOCKET), control, Some(running.clone()))
        .with_context(|| format!("instance {name}: the worker socket"))?;
    // What a supervisor that adopts this worker (or restarts it) starts from: a fresh start.
    let state = WorkerState {
        pid: std::process::id(),
        spec: WorkerSpec {
            take_over: false,
            ..spec.clone()
        },
    };
    write_state(&dir, &state).with_context(|| format!("instance {name}: the state file"))?;
    println!("READY {}", std::process::id());
    std::io::stdout().flush().ok();
    tracing::info!(instance = %name, pid = std::process::id(), "worker serving");
    let sig = sys::wait_for_termination().context("waiting for a signal")?;
    tracing::info!(instance = %name, signal = ?sig, "worker stopping");
    let _ = std::fs::remove_file(dir.join(STATE_FILE));
    drop(stats);
    let table_clean = running.stop();
    // The driver now (a restore may have moved the instance to a new sim-driver process).
    if let (Some(path), Some(_)) = (&spec.sim_socket, &driver.remote) {
        match crate::simd::RemoteSim::connect(path) {
            Ok(r) => driver.remote = Some(Arc::new(r)),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "the sim-driver for the leak check")
            }
        }
    }
    let clean = running::leak_check(&driver) && table_clean;
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(running::LEAK_EXIT)
    })
}

/// Builds the driver and registers the instance's nodes (a worker's usual start).
fn start_instance(spec: &WorkerSpec) -> Result<(RunningInstance, running::Driver)> {
    let name = spec.instance.name.clone();
    let mut driver = match (&spec.sim_socket, spec.driver) {
        (Some(path), DriverKind::Sim) => {
            let remote = Arc::new(crate::simd::RemoteSim::connect(path)?);
            running::Driver {
                host: remote.clone(),
                sim: None,
                remote: Some(remote),
                abi: None,
            }
        }
        _ => running::make_driver(
            spec.driver,
            spec.sim.gpus,
            &spec.sim.driver_version,
            spec.allow_unrestricted_mmap_fds,
            Some(&name),
        )?,
    };
    let choice = nvproxy_config::abi_tables::AbiChoice {
        abi_version: spec.abi_version.clone(),
        abi_dir: spec.abi_dir.clone(),
    };
    let (abi, from) = nvproxy_config::abi_tables::host_tables(driver.host.version(), &choice)?;
    tracing::info!(instance = %name, tables = %from, "ABI tables");
    driver.abi = Some(abi);
    crate::record::wrap(&mut driver, &spec.instance)?;
    let channels = inherited_channels()?;
    let running = RunningInstance::start(
        &spec.instance,
        &driver,
        spec.memory,
        spec.audit.as_deref(),
        channels,
        &spec.run_dir,
    )?;
    Ok((running, driver))
}

/// Writes the state file atomically (a temporary file renamed over it).
fn write_state(dir: &Path, state: &WorkerState) -> Result<()> {
    let tmp = dir.join(format!(".{STATE_FILE}.{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec(state)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    // Readable by whoever reaches the directory (root's, or a worker's 0770 with the
    // supervisor's group): a supervisor without CAP_DAC_OVERRIDE reads it.
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
        .with_context(|| format!("chmod {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(STATE_FILE))
        .with_context(|| format!("renaming {} into place", tmp.display()))?;
    Ok(())
}

/// Reads the state files under `root` (`<root>/*/worker.json`); unreadable ones are skipped
/// with a warning.
pub fn read_states(root: &Path) -> Vec<WorkerState> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let path = e.path().join(STATE_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        match serde_json::from_str::<WorkerState>(&text) {
            Ok(s) => out.push(s),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unreadable worker state file skipped")
            }
        }
    }
    out
}

/// Asks the worker of `instance` for its numbers.
pub fn query_stats(root: &Path, instance: &str) -> Result<WorkerStats> {
    let path = run_dir(root, instance).join(WORKER_SOCKET);
    let mut s =
        UnixStream::connect(&path).with_context(|| format!("connecting to {}", path.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"stats\n")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    serde_json::from_str(&line).with_context(|| format!("the answer of {}", path.display()))
}

/// The worker's stats socket: answers `stats` with [`WorkerStats`], and the checkpoint and
/// restore requests (`checkpoint.rs`), to root or the worker's own user only.
struct StatsServer {
    _server: crate::unix_server::UnixServer,
}

impl StatsServer {
    fn start(
        path: &Path,
        control: Arc<crate::checkpoint::Control>,
        running: Option<Arc<RunningInstance>>,
    ) -> Result<Self> {
        let server = crate::unix_server::UnixServer::start(
            path,
            "worker-stats",
            // Whoever reaches the directory may connect (see write_state); the peer check
            // decides.
            |p| {
                Ok(std::fs::set_permissions(
                    p,
                    std::fs::Permissions::from_mode(0o666),
                )?)
            },
            move |conn| answer_stats(conn, &control, running.as_deref()),
        )?;
        Ok(Self { _server: server })
    }
}

fn answer_stats(
    conn: UnixStream,
    control: &crate::checkpoint::Control,
    running: Option<&RunningInstance>,
) {
    let me = nix::unistd::geteuid().as_raw();
    match nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials) {
        Ok(c) if c.uid() == 0 || c.uid() == me => {}
        _ => return,
    }
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let Some(line) = crate::checkpoint::read_request(&conn) else {
        return;
    };
    if line.trim_start().starts_with('{') {
        if let (Some(running), Ok(v)) = (running, serde_json::from_str::<serde_json::Value>(&line))
            && v.get("op").and_then(|o| o.as_str()) == Some("handover")
        {
            // Returns only when the upgrade did not happen (this worker serves on).
            crate::upgrade::hand_over(running, &control.host(), conn);
            return;
        }
        if let Ok(mut text) = serde_json::to_string(&control.answer(&line)) {
            text.push('\n');
            let _ = (&conn).write_all(text.as_bytes());
        }
        return;
    }
    if line.trim() != "stats" {
        return;
    }
    let proxy = control.proxy();
    let stats = WorkerStats {
        pid: std::process::id(),
        open_files: proxy.open_files(),
        objects: proxy.object_count(),
        gpu_memory: proxy
            .gpu_memory_used()
            .into_iter()
            .map(|(gpu, used)| crate::worker_spec::GpuMemoryStat {
                gpu,
                used,
                quota: proxy.policy().quotas.gpu_memory,
            })
            .collect(),
        system_memory: proxy.system_memory_used(),
        system_memory_quota: proxy.policy().quotas.system_memory,
        ioctls: proxy
            .counts()
            .snapshot()
            .into_iter()
            .map(|r| crate::worker_spec::IoctlCount {
                kind: r.kind.as_str().to_owned(),
                name: r.name,
                decision: r.decision.as_str().to_owned(),
                count: r.count,
            })
            .collect(),
        latency: crate::latency::LATENCY.snapshot(),
    };
    if let Ok(mut text) = serde_json::to_string(&stats) {
        text.push('\n');
        let _ = (&conn).write_all(text.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> WorkerSpec {
        let cfg = nvproxy_config::Config::parse(
            &format!("driver = \"sim\"\n[[instance]]\nname = \"{name}\"\ngpus = [0]\n"),
            &crate::host::ThisHost,
        )
        .unwrap();
        WorkerSpec {
            instance: cfg.instances[0].clone(),
            driver: DriverKind::Sim,
            sim: cfg.sim.clone(),
            memory: MemoryTransport::ProcessVm,
            audit: None,
            allow_unrestricted_mmap_fds: false,
            abi_version: None,
            abi_dir: None,
            ephemeral: false,
            run_as: None,
            sim_socket: None,
            take_over: false,
            run_dir: std::path::PathBuf::from(crate::paths::DEFAULT_RUN_DIR),
        }
    }

    #[test]
    fn test_spec_round_trips_through_json() {
        let s = spec("job42");
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<WorkerSpec>(&text).unwrap(), s);
    }

    #[test]
    fn test_state_files_are_read_back_and_bad_ones_skipped() {
        let root = std::env::temp_dir().join(format!("nvproxy-states-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for n in ["a", "b"] {
            std::fs::create_dir_all(root.join(n)).unwrap();
        }
        write_state(
            &root.join("a"),
            &WorkerState {
                pid: 77,
                spec: spec("a"),
            },
        )
        .unwrap();
        std::fs::write(root.join("b").join(STATE_FILE), "not json").unwrap();
        let states = read_states(&root);
        assert_eq!(states.len(), 1);
        assert_eq!(
            (states[0].pid, states[0].spec.instance.name.as_str()),
            (77, "a")
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn test_stats_socket_answers_root() {
        let dir = std::env::temp_dir().join(format!("nvproxy-stats-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a")).unwrap();
        let sim = nvsim::SimDriver::new(nvsim::SimConfig::default_gpus(1));
        let proxy = Arc::new(
            ioctl_proxy::Proxy::for_host(
                ioctl_proxy::InstancePolicy::new("a", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0]),
                sim as Arc<dyn ioctl_proxy::HostDriver>,
            )
            .unwrap(),
        );
        let open = proxy.open(ioctl_proxy::Node::Ctl).unwrap();
        let frontend = Arc::new(crate::backend::ProxyBackend::new(proxy.clone()));
        let uvm = Arc::new(crate::backend::UvmBackend::new(
            Arc::new(uvm::UvmProxy::with_gpu_uuids(proxy.clone(), Vec::new())),
            frontend.clone(),
        ));
        let control = Arc::new(crate::checkpoint::Control::from_parts(
            "a",
            frontend,
            uvm,
            proxy.host_driver().clone(),
            Arc::new(crate::audit_log::JsonLinesSink::open(None).unwrap()),
        ));
        let server = StatsServer::start(&dir.join("a").join(WORKER_SOCKET), control, None).unwrap();
        let stats = query_stats(&dir, "a").unwrap();
        assert_eq!(
            (stats.pid, stats.open_files, stats.objects),
            (std::process::id(), 1, 0)
        );
        assert_eq!(
            stats.latency.buckets.len(),
            crate::latency::BOUNDS_S.len() + 1
        );
        proxy.release(open);
        drop(server);
        assert!(!dir.join("a").join(WORKER_SOCKET).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
