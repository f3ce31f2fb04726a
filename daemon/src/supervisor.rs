//! The supervisor: `nvproxy serve` runs one worker process per instance (`worker.rs`) and
//! watches them.
//!
//! - **Start.** A worker is `nvproxy worker` (this binary) in its own process group, its spec
//!   on stdin; it is up when it prints `READY <pid>` (within [`START_TIMEOUT`]). The
//!   supervisor holds a pidfd for each worker; the serve loop waits on them (with the
//!   termination signals, a pipe that says the set changed, and the systemd watchdog's next
//!   ping as its only timeout), so a worker's exit is seen at once and an idle daemon sleeps.
//! - **Crash.** A worker that exits unasked is reported (exit status or signal) and, with
//!   `restart = "on-failure"` (the default), started again, at most [`MAX_RESTARTS`] times in
//!   [`RESTART_WINDOW`]; after that, or with `restart = "no"`, the instance is `failed`.
//! - **Re-adoption.** Workers do not depend on the supervisor: a supervisor that is killed or
//!   restarted leaves them serving. At start the supervisor reads the workers' state files
//!   (`/run/nvproxy/*/worker.json`) and adopts every live worker whose process is an
//!   `nvproxy worker` of that instance (the containerd-shim pattern) instead of starting a new
//!   one; an adopted worker is watched through its pidfd like the others (it is not our child:
//!   its exit status is unknown).
//! - **Reload.** SIGHUP (`systemctl reload`) upgrades every worker live (`upgrade.rs`).
//! - **One supervisor per run directory.** `serve` holds an exclusive `flock` on
//!   `<run dir>/serve.lock` (its pid inside) for its whole life ([`ServeLock`]); a second
//!   `serve` on the same run directory refuses to start, naming the first one's pid, instead of
//!   adopting (and at its stop, stopping) the workers of a supervisor that still watches them.
//!   The kernel drops the lock when its holder dies, however: a restarted supervisor (killed,
//!   `systemctl restart`) takes it and adopts. The lock is not inherited by the workers
//!   (close-on-exec), so workers left serving (`keep_workers`) never hold it.
//! - **Stop.** SIGTERM/SIGINT stop every worker (SIGTERM, then SIGKILL after
//!   [`STOP_TIMEOUT`]) and the supervisor; `[daemon] keep_workers = true` leaves them
//!   serving instead, for a supervisor restart (`systemctl restart` with `KillMode=process`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use nvproxy_config::{InstanceConfig, RestartPolicy};
use nvproxy_worker::paths;
use nvproxy_worker::sys;
use nvproxy_worker::worker;
use nvproxy_worker::worker_spec::{self, WorkerSpec, WorkerStats};

/// The `--log` filter this process was started with, which its workers get too.
pub static LOG_FILTER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The sim-driver's socket in the instance's run directory (`[sim] process = true`).
pub const SIM_SOCKET: &str = "sim.sock";
/// The sim-driver's pid file in the instance's run directory.
pub const SIM_PID: &str = "sim.pid";

/// How long a worker may take to print READY (the VM's emulated CPU is slow).
pub const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a worker may take to stop after SIGTERM before it is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Restarts allowed in [`RESTART_WINDOW`] before an instance is marked failed.
pub const MAX_RESTARTS: usize = 5;
/// See [`MAX_RESTARTS`].
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// `serve`'s hold on its run directory (see the module doc): released when dropped or when the
/// process dies.
pub struct ServeLock {
    _file: nix::fcntl::Flock<std::fs::File>,
}

impl ServeLock {
    /// Takes `<root>/serve.lock` and writes our pid into it; if another process holds it, an
    /// error naming that process's pid (as it wrote it).
    pub fn acquire(root: &Path) -> Result<ServeLock> {
        let path = root.join(paths::SERVE_LOCK);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let mut file =
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(f) => f,
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    let holder = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|t| t.trim().parse::<u32>().ok())
                        .map_or_else(|| "pid unknown".to_owned(), |p| format!("pid {p}"));
                    bail!(
                        "another nvproxy serve ({holder}) owns the run directory {}: stop it \
                         first, or give this one a run directory of its own (--run-dir, {} or \
                         [daemon] run_dir)",
                        root.display(),
                        paths::RUN_DIR_ENV
                    );
                }
                Err((_, e)) => {
                    return Err(e).with_context(|| format!("locking {}", path.display()));
                }
            };
        file.set_len(0)
            .and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()))
            .with_context(|| format!("writing our pid into {}", path.display()))?;
        Ok(ServeLock { _file: file })
    }
}

/// An instance's state, as `nvproxy instance list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Its worker serves it.
    Running,
    /// Its worker exited and it is not restarted: why.
    Failed(String),
}

/// One instance of the supervisor.
struct Entry {
    spec: WorkerSpec,
    pid: u32,
    pidfd: Option<OwnedFd>,
    /// Started by this supervisor (so its exit status can be reaped), not adopted.
    child: bool,
    state: State,
    restarts: Vec<Instant>,
    /// The worker's exit status once it stopped (when known).
    exit: Option<i32>,
    /// A live upgrade is replacing the worker: its exit is expected, not a crash.
    upgrading: bool,
}

/// What `list`/`show` report of an instance.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct InstanceInfo {
    /// The instance name.
    pub name: String,
    /// Its worker's pid (0 when failed).
    pub pid: u32,
    /// Host GPU minors.
    pub gpus: Vec<u32>,
    /// Driver capabilities.
    pub caps: Vec<String>,
    /// enforce or audit.
    pub mode: String,
    /// low, medium or high (empty from a supervisor older than the field).
    #[serde(default)]
    pub priority: String,
    /// `cuse` or `socket` (empty from a supervisor older than the field).
    #[serde(default)]
    pub transport: String,
    /// `running`, or `failed: why`.
    pub state: String,
    /// Restarts in the last minute.
    pub restarts: usize,
    /// The worker's numbers, when it answered.
    pub stats: Option<WorkerStats>,
}

/// The supervisor: the instances and their workers.
pub struct Supervisor {
    entries: Mutex<BTreeMap<String, Entry>>,
    root: PathBuf,
    exe: PathBuf,
    /// `[daemon] worker_uids`.
    worker_uids: Option<(u32, u32)>,
    /// Held by `create`, so that two creates cannot pick one uid (or one name).
    creating: Mutex<()>,
    /// Workers started again after an unasked exit, per instance, since this supervisor
    /// started (the metrics' `nvproxy_worker_restarts_total`).
    restarts_total: Mutex<BTreeMap<String, u64>>,
    /// One CDI spec write at a time.
    cdi_lock: Mutex<()>,
    /// A pipe (read end, write end; non-blocking) that says the workers to watch changed: a
    /// worker started, an upgrade began or ended. The serve loop waits on it and on the
    /// workers' pidfds ([`Supervisor::exit_fds`]), never on a timer.
    changed: (OwnedFd, OwnedFd),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Supervisor {
    /// A supervisor whose workers keep their state under `root` (`/run/nvproxy`);
    /// `worker_uids`: the range of `[daemon] worker_uids`.
    pub fn new(root: &Path, worker_uids: Option<(u32, u32)>) -> Result<Arc<Self>> {
        // A run directory of a deployment's own (`[daemon] run_dir`) may lie deeper.
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        nvproxy_worker::seqpacket::make_run_root(root)?;
        Ok(Arc::new(Self {
            entries: Mutex::new(BTreeMap::new()),
            root: root.to_owned(),
            exe: std::env::current_exe().context("finding our own executable")?,
            worker_uids,
            creating: Mutex::new(()),
            restarts_total: Mutex::new(BTreeMap::new()),
            cdi_lock: Mutex::new(()),
            changed: nix::unistd::pipe2(
                nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK,
            )
            .context("a pipe for the serve loop")?,
        }))
    }

    /// Wakes the serve loop: the set of pidfds to watch changed.
    fn changed(&self) {
        // A full pipe already says so.
        let _ = nix::unistd::write(&self.changed.1, &[1]);
    }

    /// Readable when the set of workers to watch changed since [`Supervisor::take_changes`].
    pub fn changes_fd(&self) -> BorrowedFd<'_> {
        self.changed.0.as_fd()
    }

    /// Empties [`Supervisor::changes_fd`] (before the loop collects [`Supervisor::exit_fds`]).
    pub fn take_changes(&self) {
        let mut buf = [0u8; 64];
        while matches!(nix::unistd::read(self.changed.0.as_raw_fd(), &mut buf), Ok(n) if n > 0) {}
    }

    /// Duplicates of the pidfds [`Supervisor::check`] looks at (readable once their worker
    /// exits): every watched worker but one being upgraded.
    pub fn exit_fds(&self) -> Vec<OwnedFd> {
        lock(&self.entries)
            .values()
            .filter(|e| !e.upgrading)
            .filter_map(|e| e.pidfd.as_ref()?.try_clone().ok())
            .collect()
    }

    /// The user a new worker of `spec` runs as: its instance's `user`, else the lowest uid of
    /// `worker_uids` no instance uses, else the supervisor's (`None`). Root is `None`.
    fn choose_user(&self, spec: &WorkerSpec) -> Result<Option<worker_spec::RunAs>> {
        if let Some(u) = &spec.instance.user {
            let run_as = resolve_user(u)
                .with_context(|| format!("instance {}: user {u:?}", spec.instance.name))?;
            return Ok((run_as.uid != 0).then_some(run_as));
        }
        let Some((first, last)) = self.worker_uids else {
            return Ok(None);
        };
        let used: std::collections::BTreeSet<u32> = lock(&self.entries)
            .values()
            .filter_map(|e| e.spec.run_as.map(|r| r.uid))
            .collect();
        let uid = (first..=last)
            .find(|u| !used.contains(u))
            .with_context(|| {
                format!(
                    "instance {}: every uid of [daemon] worker_uids = \"{first}-{last}\" is in use",
                    spec.instance.name
                )
            })?;
        Ok(Some(worker_spec::RunAs { uid, gid: uid }))
    }

    /// Adopts the live workers that state files name; removes stale state files. Returns
    /// the adopted instances' names.
    pub fn adopt(&self) -> Vec<String> {
        let mut adopted = Vec::new();
        for st in worker::read_states(&self.root) {
            if st.spec.ephemeral {
                continue; // an `nvproxy exec`'s own
            }
            let name = st.spec.instance.name.clone();
            let state_file = paths::run_dir(&self.root, &name).join(paths::STATE_FILE);
            if !is_worker_of(st.pid) {
                tracing::info!(instance = %name, pid = st.pid, "stale worker state file removed");
                let _ = std::fs::remove_file(&state_file);
                continue;
            }
            let pidfd = match sys::pidfd_open_process(st.pid) {
                Ok(fd) => fd,
                Err(e) => {
                    tracing::warn!(instance = %name, pid = st.pid, error = %e, "cannot watch a worker; not adopted");
                    continue;
                }
            };
            tracing::info!(instance = %name, pid = st.pid, "worker re-adopted");
            self.changed();
            lock(&self.entries).insert(
                name.clone(),
                Entry {
                    spec: st.spec,
                    pid: st.pid,
                    pidfd: Some(pidfd),
                    child: false,
                    state: State::Running,
                    restarts: Vec::new(),
                    exit: None,
                    upgrading: false,
                },
            );
            adopted.push(name);
        }
        adopted
    }

    /// Whether `name` is an instance of this supervisor.
    pub fn has(&self, name: &str) -> bool {
        lock(&self.entries).contains_key(name)
    }

    /// Starts a worker for `spec` and records the instance. An instance of the same name is
    /// an error.
    pub fn create(&self, mut spec: WorkerSpec) -> Result<u32> {
        let _creating = lock(&self.creating);
        let name = spec.instance.name.clone();
        if self.has(&name) {
            bail!("instance {name} exists already");
        }
        // The worker keeps its instance directory in this supervisor's run directory.
        spec.run_dir = self.root.clone();
        if spec.run_as.is_none() {
            spec.run_as = self.choose_user(&spec)?;
        }
        if spec.driver == nvproxy_config::DriverKind::Sim && spec.sim.process {
            spec.sim_socket = Some(self.ensure_sim(&spec)?);
        }
        let (pid, pidfd) = match self.spawn(&spec) {
            Ok(w) => w,
            Err(e) => {
                self.stop_sim(&spec.instance.name);
                return Err(e);
            }
        };
        lock(&self.entries).insert(
            name,
            Entry {
                spec,
                pid,
                pidfd: Some(pidfd),
                child: true,
                state: State::Running,
                restarts: Vec::new(),
                exit: None,
                upgrading: false,
            },
        );
        self.changed();
        Ok(pid)
    }

    /// The instance's `nvproxy sim-driver` (`[sim] process = true`): the running one if its
    /// socket answers, else a new one (its own process group, pid in `sim.pid`), which
    /// outlives the instance's workers. Returns its socket.
    fn ensure_sim(&self, spec: &WorkerSpec) -> Result<PathBuf> {
        let name = &spec.instance.name;
        let dir = paths::run_dir(&self.root, name);
        // 0700 from the start (the worker makes it the same way): a directory created 0755
        // here would let any host uid reach the instance's sockets.
        nvproxy_worker::seqpacket::make_run_root(&self.root)?;
        nvproxy_worker::seqpacket::make_private_dir(&dir)?;
        let socket = dir.join(SIM_SOCKET);
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            return Ok(socket);
        }
        let mut cmd = Command::new(&self.exe);
        if let Some(f) = LOG_FILTER.get() {
            cmd.arg("--log").arg(f);
        }
        cmd.arg("sim-driver")
            .arg("--socket")
            .arg(&socket)
            .arg("--gpus")
            .arg(spec.sim.gpus.to_string())
            .arg("--driver-version")
            .arg(&spec.sim.driver_version)
            .arg("--handle-key")
            .arg(name);
        if let Some(r) = spec.run_as {
            cmd.arg("--allow-uid").arg(r.uid.to_string());
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .with_context(|| format!("instance {name}: starting its sim-driver"))?;
        let stdout = child.stdout.take().context("sim-driver stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        if line.trim() != "READY" {
            let _ = child.kill();
            let status = child.wait().ok();
            bail!(
                "instance {name}: its sim-driver did not start: it {} before it was ready \
                 (its errors, if any, are in the log)",
                describe_exit(status)
            );
        }
        std::fs::write(dir.join(SIM_PID), child.id().to_string())?;
        tracing::info!(instance = %name, pid = child.id(), "sim-driver serving");
        Ok(socket)
    }

    /// Stops the instance's `nvproxy sim-driver`, if it has one.
    fn stop_sim(&self, name: &str) {
        let dir = paths::run_dir(&self.root, name);
        let Ok(text) = std::fs::read_to_string(dir.join(SIM_PID)) else {
            return;
        };
        let _ = std::fs::remove_file(dir.join(SIM_PID));
        let Ok(pid) = text.trim().parse::<u32>() else {
            return;
        };
        if !is_nvproxy_command(pid, b"sim-driver") {
            return;
        }
        let Ok(fd) = sys::pidfd_open_process(pid) else {
            return;
        };
        if sys::pidfd_send_signal(fd.as_fd(), libc::SIGTERM).is_err() {
            return;
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while !readable(&fd) {
            if Instant::now() > deadline {
                let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Our child when we started it: reap it (an adopted one is init's).
        let _ = sys::waitid_pidfd(fd.as_fd());
        tracing::info!(instance = %name, pid, "sim-driver stopped");
    }

    /// Starts one worker and waits for its READY line.
    fn spawn(&self, spec: &WorkerSpec) -> Result<(u32, OwnedFd)> {
        let name = &spec.instance.name;
        let mut cmd = Command::new(&self.exe);
        // A worker under its own user: what it cannot open or create itself is prepared here,
        // as root; the channels are closed here once the worker has its copies.
        let _channels = match spec.run_as {
            Some(run_as) => self.prepare_for_user(spec, run_as, &mut cmd)?,
            None => {
                self.reclaim_run_dir(name)?;
                Vec::new()
            }
        };
        if let Some(f) = LOG_FILTER.get() {
            cmd.arg("--log").arg(f);
        }
        let mut child = cmd
            .arg("worker")
            .env(
                nvproxy_worker::advice::FOR_COMMAND_ENV,
                nvproxy_worker::advice::this_command_line(),
            )
            .env(
                nvproxy_worker::advice::FOR_SUBCOMMAND_ENV,
                nvproxy_worker::advice::user_subcommand().unwrap_or_default(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Its own process group: the supervisor's terminal and group signals stay ours.
            .process_group(0)
            .spawn()
            .with_context(|| format!("instance {name}: starting its worker"))?;
        let pid = child.id();
        let pidfd = sys::pidfd_open_process(pid)
            .with_context(|| format!("instance {name}: watching worker {pid}"))?;
        let text = serde_json::to_string(spec)?;
        {
            let mut stdin = child.stdin.take().context("worker stdin")?;
            stdin
                .write_all(text.as_bytes())
                .with_context(|| format!("instance {name}: sending the worker its spec"))?;
        }
        let stdout = child.stdout.take().context("worker stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let r = BufReader::new(stdout).read_line(&mut line).map(|_| line);
            let _ = tx.send(r);
        });
        match rx.recv_timeout(START_TIMEOUT) {
            Ok(Ok(line)) if line.trim() == format!("READY {pid}") => {
                tracing::info!(instance = %name, pid, "worker serving");
                // The Child handle is dropped without waiting: the pidfd watches it, and
                // waitid reaps it.
                Ok((pid, pidfd))
            }
            other => {
                let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
                let status = child.wait().ok();
                let why = match other {
                    // The worker's own words: all there is to say.
                    Ok(Ok(l)) if l.starts_with("FAILED ") => {
                        bail!("instance {name}: {}", l["FAILED ".len()..].trim())
                    }
                    Ok(Ok(l)) if l.is_empty() => {
                        format!("it {} before it was ready", describe_exit(status))
                    }
                    Ok(Ok(l)) => format!("it printed {:?} instead of READY", l.trim()),
                    Ok(Err(e)) => format!("reading its stdout: {e}"),
                    Err(_) => format!("it was not ready within {} s", START_TIMEOUT.as_secs()),
                };
                bail!(
                    "instance {name}: {}: {why} (its errors, if any, are in the log)",
                    if spec.take_over {
                        "the new worker did not take over"
                    } else {
                        "its worker did not start"
                    },
                );
            }
        }
    }

    /// For a worker under our own user: its run directory, if an earlier worker under another
    /// uid had it (the instance was created with `--user` before, or `worker_uids` changed),
    /// becomes ours again (owner, group and 0700), else the worker refuses it as not root's.
    fn reclaim_run_dir(&self, name: &str) -> Result<()> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = paths::run_dir(&self.root, name);
        let Ok(m) = std::fs::symlink_metadata(&dir) else {
            return Ok(());
        };
        let me = nix::unistd::geteuid();
        if !m.is_dir() || m.uid() == me.as_raw() {
            return Ok(());
        }
        nix::unistd::chown(&dir, Some(me), Some(nix::unistd::getegid()))
            .with_context(|| format!("taking back {}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("chmod {}", dir.display()))?;
        tracing::info!(instance = %name, dir = %dir.display(), previous_uid = m.uid(), "run directory taken back from an earlier worker user");
        Ok(())
    }

    /// For a worker under `run_as`: its run directory (and audit log) made its own, one
    /// `/dev/cuse` channel per node opened for it (inherited, [`worker_spec::CHANNELS_ENV`]), and
    /// the uid change with `CAP_SYS_PTRACE` and `CAP_SYS_NICE` kept (`sys::become_user_keeping`; NICE for
    /// the instance's interleave level, off in the request threads' effective set) done in the child
    /// before `execve`. Returns the channels (the parent's copies).
    fn prepare_for_user(
        &self,
        spec: &WorkerSpec,
        run_as: worker_spec::RunAs,
        cmd: &mut Command,
    ) -> Result<Vec<OwnedFd>> {
        use std::os::fd::AsRawFd;
        let name = &spec.instance.name;
        let (uid, gid) = (
            nix::unistd::Uid::from_raw(run_as.uid),
            nix::unistd::Gid::from_raw(run_as.gid),
        );
        let dir = paths::run_dir(&self.root, name);
        nvproxy_worker::seqpacket::make_run_root(&self.root)?;
        if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(&dir)
            && e.kind() != std::io::ErrorKind::AlreadyExists
        {
            return Err(e).with_context(|| format!("creating {}", dir.display()));
        }
        // The worker must reach its own directory through the run directory, which is
        // private (0700): search only (0711) for others; the instance directories stay 0700,
        // each its owner's alone.
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&self.root)
                .with_context(|| format!("{}", self.root.display()))?
                .permissions()
                .mode();
            if mode & 0o011 != 0o011 {
                std::fs::set_permissions(
                    &self.root,
                    std::fs::Permissions::from_mode((mode & 0o7777) | 0o011),
                )
                .with_context(|| format!("letting workers search {}", self.root.display()))?;
            }
        }
        // The worker's, with the supervisor's group and 0770: the directory is the guard, so
        // that a supervisor without CAP_DAC_OVERRIDE (the systemd unit's) reads the worker's
        // state file (0644) and reaches its stats socket (0666, peer-checked) inside it, and
        // nobody else reaches either. (No setgid bit: the unit's RestrictSUIDSGID= refuses it.)
        // Ours first (an earlier worker's directory is its), then the mode, then the worker's:
        // changing the mode of a directory we do not own would need CAP_FOWNER, which the
        // unit does not keep (CAP_CHOWN it does).
        let my_gid = nix::unistd::getegid();
        nix::unistd::chown(&dir, Some(nix::unistd::geteuid()), Some(my_gid))
            .with_context(|| format!("taking back {}", dir.display()))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770))
                .with_context(|| format!("chmod {}", dir.display()))?;
        }
        nix::unistd::chown(&dir, Some(uid), Some(my_gid))
            .with_context(|| format!("giving {} to uid {}", dir.display(), run_as.uid))?;
        if let Some(audit) = &spec.audit {
            if let Some(parent) = audit.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            // The log and its rotation file: the worker may not create files in their
            // directory, so it rotates by copying into the `.1` file (audit_log.rs).
            for path in [
                audit.clone(),
                nvproxy_worker::audit_log::rotated_path(audit),
            ] {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("creating {}", path.display()))?;
                nix::unistd::chown(&path, Some(uid), Some(gid))
                    .with_context(|| format!("giving {} to uid {}", path.display(), run_as.uid))?;
            }
        }
        // nvidiactl, the GPUs, nvidia-uvm; a worker taking over gets the old one's.
        let nodes = if spec.take_over {
            0
        } else {
            spec.instance.gpus.len() + 2
        };
        let channels = (0..nodes)
            .map(|_| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open("/dev/cuse")
                    .map(OwnedFd::from)
                    .with_context(|| {
                        format!(
                            "instance {name}: opening /dev/cuse for its worker (uid {})",
                            run_as.uid
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let raw: Vec<i32> = channels.iter().map(|c| c.as_raw_fd()).collect();
        cmd.env(
            worker_spec::CHANNELS_ENV,
            raw.iter()
                .map(|fd| fd.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
        // CAP_SYS_NICE only where the supervisor has it (a unit's bounding set may lack it):
        // without it the instance's level is refused by the driver and logged, and instances
        // of priority medium (the default) need nothing.
        let nice = sys::thread_caps().is_ok_and(|c| c.has_permitted(sys::CAP_SYS_NICE));
        let keep: &[u32] = if nice {
            &[sys::CAP_SYS_PTRACE, sys::CAP_SYS_NICE]
        } else {
            &[sys::CAP_SYS_PTRACE]
        };
        sys::exec_as_user_keeping(cmd, raw, run_as.uid, run_as.gid, keep);
        Ok(channels)
    }

    /// Looks at every worker once: reaps those that exited and restarts or fails their
    /// instances. Returns the instances that changed.
    pub fn check(&self) -> Vec<String> {
        let exited: Vec<(String, Option<i32>)> = {
            let mut e = lock(&self.entries);
            let mut out = Vec::new();
            for (name, entry) in e.iter_mut() {
                if entry.upgrading {
                    continue;
                }
                let Some(fd) = &entry.pidfd else { continue };
                if !readable(fd) {
                    continue;
                }
                let code = if entry.child {
                    sys::waitid_pidfd(fd.as_fd()).ok().flatten()
                } else {
                    None
                };
                entry.pidfd = None;
                entry.exit = code;
                out.push((name.clone(), code));
            }
            out
        };
        let mut changed = Vec::new();
        for (name, code) in exited {
            let how = match code {
                Some(c) if c > 128 => format!("killed by signal {}", c - 128),
                Some(c) => format!("exit status {c}"),
                None => "exit status unknown (adopted)".to_owned(),
            };
            tracing::error!(instance = %name, how, "worker exited unasked");
            self.restart_or_fail(&name, &how);
            changed.push(name);
        }
        changed
    }

    fn restart_or_fail(&self, name: &str, how: &str) {
        let spec = {
            let mut e = lock(&self.entries);
            let Some(entry) = e.get_mut(name) else { return };
            let now = Instant::now();
            entry
                .restarts
                .retain(|t| now.duration_since(*t) < RESTART_WINDOW);
            if entry.spec.instance.restart == RestartPolicy::No {
                entry.state = State::Failed(format!("worker {how}; restart = \"no\""));
                return;
            }
            if entry.restarts.len() >= MAX_RESTARTS {
                entry.state = State::Failed(format!(
                    "worker {how}; restarted {MAX_RESTARTS} times in {} s",
                    RESTART_WINDOW.as_secs()
                ));
                tracing::error!(instance = %name, "not restarted again: instance failed");
                return;
            }
            entry.restarts.push(now);
            entry.spec.clone()
        };
        // The old worker's run directory may still hold its state file.
        let _ = std::fs::remove_file(paths::run_dir(&self.root, name).join(paths::STATE_FILE));
        match self.spawn(&spec) {
            Ok((pid, pidfd)) => {
                tracing::warn!(instance = %name, pid, "worker restarted");
                *lock(&self.restarts_total)
                    .entry(name.to_owned())
                    .or_default() += 1;
                if let Some(entry) = lock(&self.entries).get_mut(name) {
                    entry.pid = pid;
                    entry.pidfd = Some(pidfd);
                    entry.child = true;
                    entry.state = State::Running;
                }
                self.changed();
            }
            Err(e) => {
                tracing::error!(instance = %name, error = %format!("{e:#}"), "restart failed");
                if let Some(entry) = lock(&self.entries).get_mut(name) {
                    entry.state = State::Failed(format!("worker {how}; restart failed: {e:#}"));
                }
            }
        }
    }

    /// Replaces the worker of `name` with a new process of the binary on disk that takes the
    /// instance over live (`upgrade.rs`). Returns (old pid, new pid). On failure the old worker
    /// serves on (it resumes itself when the new one does not take over).
    pub fn upgrade(&self, name: &str) -> Result<(u32, u32)> {
        let _one = lock(&self.creating);
        let (spec, old_pid, old_fd, child) = {
            let mut e = lock(&self.entries);
            let entry = e
                .get_mut(name)
                .with_context(|| format!("no instance {name}"))?;
            if entry.state != State::Running || entry.pidfd.is_none() {
                bail!("instance {name} is not running");
            }
            if entry.spec.driver == nvproxy_config::DriverKind::Sim && !entry.spec.sim.process {
                bail!(
                    "instance {name}: its simulated driver lives in its worker; a live upgrade \
                     needs [sim] process = true"
                );
            }
            let fd = entry.pidfd.as_ref().map(|f| f.try_clone()).transpose()?;
            entry.upgrading = true;
            (entry.spec.clone(), entry.pid, fd, entry.child)
        };
        // The old worker's exit is the upgrade's, not one to restart: out of the watched set.
        self.changed();
        let done = |e: &mut BTreeMap<String, Entry>| {
            if let Some(entry) = e.get_mut(name) {
                entry.upgrading = false;
            }
            self.changed();
        };
        let spawned = self.spawn(&WorkerSpec {
            take_over: true,
            ..spec
        });
        let (pid, pidfd) = match spawned {
            Ok(w) => w,
            Err(e) => {
                done(&mut lock(&self.entries));
                return Err(e.context(format!(
                    "instance {name}: upgrade failed; worker {old_pid} serves on"
                )));
            }
        };
        // The old worker exits once it handed over (before the new one said READY).
        if let Some(fd) = &old_fd {
            let deadline = Instant::now() + STOP_TIMEOUT;
            while !readable(fd) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if child {
                let _ = sys::waitid_pidfd(fd.as_fd());
            }
        }
        let mut e = lock(&self.entries);
        if let Some(entry) = e.get_mut(name) {
            entry.pid = pid;
            entry.pidfd = Some(pidfd);
            entry.child = true;
            entry.exit = None;
            entry.upgrading = false;
        }
        drop(e);
        self.changed();
        tracing::info!(instance = %name, old = old_pid, new = pid, "worker upgraded live");
        Ok((old_pid, pid))
    }

    /// [`Supervisor::upgrade`] of every running instance, one after another.
    pub fn upgrade_all(&self) -> Vec<(String, Result<(u32, u32)>)> {
        let names: Vec<String> = lock(&self.entries)
            .iter()
            .filter(|(_, e)| e.state == State::Running && e.pidfd.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        names
            .into_iter()
            .map(|n| {
                let r = self.upgrade(&n);
                (n, r)
            })
            .collect()
    }

    /// The instances, with their workers' numbers.
    pub fn list(&self) -> Vec<InstanceInfo> {
        let snapshot: Vec<(String, WorkerSpec, u32, State, usize)> = lock(&self.entries)
            .iter()
            .map(|(n, e)| {
                (
                    n.clone(),
                    e.spec.clone(),
                    if e.pidfd.is_some() { e.pid } else { 0 },
                    e.state.clone(),
                    e.restarts.len(),
                )
            })
            .collect();
        snapshot
            .into_iter()
            .map(|(name, spec, pid, state, restarts)| {
                let stats = (state == State::Running)
                    .then(|| worker::query_stats(&self.root, &name).ok())
                    .flatten();
                InstanceInfo {
                    pid,
                    gpus: spec.instance.gpus.clone(),
                    caps: spec.instance.caps.clone(),
                    mode: spec.instance.mode.to_string(),
                    priority: spec.instance.priority.to_string(),
                    transport: spec.instance.transport.to_string(),
                    state: match state {
                        State::Running => "running".to_owned(),
                        State::Failed(why) => format!("failed: {why}"),
                    },
                    restarts,
                    stats,
                    name,
                }
            })
            .collect()
    }

    /// Stops the worker of `name` and forgets the instance. Refuses while its nodes have open
    /// files, unless `force` (stopping the worker revokes them: its CUSE nodes go away, and
    /// the clients' calls fail with `ENOTCONN`). Returns the worker's exit status if known.
    pub fn remove(&self, name: &str, force: bool) -> Result<Option<i32>> {
        let running = match lock(&self.entries).get(name) {
            None => bail!("no instance {name}"),
            Some(e) => e.pidfd.is_some(),
        };
        if running && !force {
            let stats = worker::query_stats(&self.root, name)
                .with_context(|| format!("asking instance {name}'s worker for its open files"))?;
            if stats.open_files > 0 {
                bail!(
                    "instance {name} has {} open file(s); `nvproxy instance rm --force {name}` \
                     revokes them",
                    stats.open_files
                );
            }
        }
        let entry = lock(&self.entries).remove(name);
        let status = entry.and_then(stop_entry);
        self.stop_sim(name);
        // Its directory goes with it once the worker and sim-driver removed what they made
        // (`remove_dir` removes only an empty one: anything left is kept, and said).
        let dir = paths::run_dir(&self.root, name);
        if let Err(e) = std::fs::remove_dir(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(instance = %name, dir = %dir.display(), error = %e, "the instance's run directory was kept");
        }
        Ok(status)
    }

    /// Every instance's numbers for a metrics scrape (each running worker asked now).
    pub fn metrics_samples(&self) -> Vec<crate::metrics::InstanceSample> {
        let restarts = lock(&self.restarts_total).clone();
        self.list()
            .into_iter()
            .map(|i| crate::metrics::InstanceSample {
                running: i.state == "running",
                restarts: restarts.get(&i.name).copied().unwrap_or(0),
                stats: i.stats,
                name: i.name,
            })
            .collect()
    }

    /// Rewrites the `[cdi] spec` for the instances whose workers serve now (after start,
    /// every create and rm, and a restarted worker's new nodes). A failure is logged: the
    /// instances serve on, and `nvproxy cdi generate` can still write a spec.
    pub fn refresh_cdi(&self, cfg: &nvproxy_config::Config) {
        let _one = lock(&self.cdi_lock);
        let running: Vec<(String, Vec<String>)> = lock(&self.entries)
            .iter()
            .filter(|(_, e)| e.pidfd.is_some() && e.state == State::Running)
            .map(|(n, e)| (n.clone(), e.spec.instance.caps.clone()))
            .collect();
        match crate::cdi::write_current(cfg, &running) {
            Ok(()) if !cfg.cdi.spec.as_os_str().is_empty() => {
                tracing::info!(spec = %cfg.cdi.spec.display(), devices = running.len(), "CDI spec written")
            }
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "the CDI spec could not be written")
            }
        }
    }

    /// Stops every worker (in parallel) and returns their exit statuses.
    pub fn stop_all(&self) -> BTreeMap<String, Option<i32>> {
        let entries = std::mem::take(&mut *lock(&self.entries));
        let handles: Vec<_> = entries
            .into_iter()
            .map(|(n, e)| (n, std::thread::spawn(move || stop_entry(e))))
            .collect();
        let statuses: BTreeMap<String, Option<i32>> = handles
            .into_iter()
            .map(|(n, h)| (n, h.join().ok().flatten()))
            .collect();
        for name in statuses.keys() {
            self.stop_sim(name);
        }
        statuses
    }

    /// Forgets every worker without stopping them (`keep_workers`): a later supervisor adopts
    /// them.
    pub fn detach_all(&self) {
        let n = std::mem::take(&mut *lock(&self.entries)).len();
        tracing::info!(workers = n, "supervisor exits; workers keep serving");
    }
}

/// SIGTERM, wait up to [`STOP_TIMEOUT`], then SIGKILL; the exit status when it is our child.
fn stop_entry(e: Entry) -> Option<i32> {
    let fd = e.pidfd?;
    if sys::pidfd_send_signal(fd.as_fd(), libc::SIGTERM).is_err() {
        return e.exit;
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    while !readable(&fd) {
        if Instant::now() > deadline {
            tracing::warn!(instance = %e.spec.instance.name, pid = e.pid, "worker did not stop; killed");
            let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if !e.child {
        // Not our child: wait for it to go, its status is its parent's (init's).
        while !readable(&fd) {
            std::thread::sleep(Duration::from_millis(20));
        }
        return None;
    }
    loop {
        match sys::waitid_pidfd(fd.as_fd()) {
            Ok(Some(c)) => return Some(c),
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => return None,
        }
    }
}

/// Whether a pidfd says its process exited.
fn readable(fd: &OwnedFd) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

/// Whether `pid` is a live `nvproxy` process running subcommand `sub`.
fn is_nvproxy_command(pid: u32, sub: &[u8]) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| runs_nvproxy_command(&c, sub))
}

/// Whether the command line `cmdline` (`/proc/PID/cmdline`: NUL-separated) is an `nvproxy`
/// binary's subcommand `sub`, after any global options (`--log FILTER`, `--log=FILTER`).
fn runs_nvproxy_command(cmdline: &[u8], sub: &[u8]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let ours = args.first().is_some_and(|a| {
        Path::new(std::ffi::OsStr::from_bytes(a))
            .file_name()
            .is_some_and(|f| f == "nvproxy")
    });
    let mut rest = args.iter().skip(1);
    let subcommand = loop {
        match rest.next() {
            Some(a) if *a == b"--log" => {
                rest.next();
            }
            Some(a) if a.starts_with(b"--log=") => {}
            other => break other,
        }
    };
    ours && subcommand.is_some_and(|a| *a == sub)
}

/// Whether `pid` is a live `nvproxy worker` (its command line is an `nvproxy` binary's
/// `worker` subcommand); the state file that names it lies in its instance's directory.
pub fn is_worker_of(pid: u32) -> bool {
    is_nvproxy_command(pid, b"worker")
}

/// `user`: a user name (its uid and primary gid) or a numeric uid (its passwd entry's gid, or
/// a gid of the same number when it has none).
pub fn resolve_user(user: &str) -> Result<worker_spec::RunAs> {
    use nix::unistd::{Uid, User};
    if let Ok(uid) = user.parse::<u32>() {
        let gid = User::from_uid(Uid::from_raw(uid))
            .ok()
            .flatten()
            .map_or(uid, |u| u.gid.as_raw());
        return Ok(worker_spec::RunAs { uid, gid });
    }
    let u = User::from_name(user)
        .with_context(|| format!("looking up user {user:?}"))?
        .with_context(|| format!("no user {user:?} (a user name or a numeric uid)"))?;
    Ok(worker_spec::RunAs {
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
    })
}

/// The spec of a config instance under this config's daemon settings.
pub fn spec_for(cfg: &nvproxy_config::Config, inst: &InstanceConfig) -> WorkerSpec {
    WorkerSpec {
        instance: inst.clone(),
        driver: cfg.driver,
        sim: cfg.sim.clone(),
        memory: cfg.daemon.memory,
        audit: inst.audit_path(&cfg.daemon),
        allow_unrestricted_mmap_fds: cfg.daemon.allow_unrestricted_mmap_fds,
        abi_version: cfg.daemon.abi_version.clone(),
        abi_dir: cfg.daemon.abi_dir.clone(),
        ephemeral: false,
        run_as: None,
        sim_socket: None,
        take_over: false,
        run_dir: nvproxy_worker::paths::host_run_dir(cfg.daemon.run_dir.as_deref()),
    }
}

/// A child's end in words: "exited with status 1", "was killed by SIGKILL".
pub fn describe_exit(status: Option<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        None => "ended (its status is unknown)".to_owned(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exited with status {c}"),
            (None, Some(sig)) => match nix::sys::signal::Signal::try_from(sig) {
                Ok(sig) => format!("was killed by {sig}"),
                Err(_) => format!("was killed by signal {sig}"),
            },
            (None, None) => "ended".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_stale_state_file_is_not_adopted_and_is_removed() {
        let scratch = test_kit::TestDir::new("sup-stale");
        let root = scratch.path().join("run");
        std::fs::create_dir_all(root.join("a")).unwrap();
        let cfg = nvproxy_config::Config::parse(
            "driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [0]\n",
            &nvproxy_worker::host::ThisHost,
        )
        .unwrap();
        let st = worker_spec::WorkerState {
            // Our own pid is alive, but not an `nvproxy worker`.
            pid: std::process::id(),
            spec: spec_for(&cfg, &cfg.instances[0]),
        };
        std::fs::write(
            root.join("a").join(paths::STATE_FILE),
            serde_json::to_vec(&st).unwrap(),
        )
        .unwrap();
        let sup = Supervisor::new(&root, None).unwrap();
        assert!(sup.adopt().is_empty());
        assert!(!root.join("a").join(paths::STATE_FILE).exists());
    }

    /// One holder at a time; the refusal names the holder's pid and how to serve elsewhere;
    /// the lock is free again once its holder let go (as when it dies).
    #[test]
    fn test_the_serve_lock_refuses_a_second_holder_naming_the_first() {
        let dir = test_kit::TestDir::new("serve-lock");
        let first = ServeLock::acquire(dir.path()).unwrap();
        let err = ServeLock::acquire(dir.path())
            .err()
            .expect("a second holder");
        assert_eq!(
            format!("{err:#}"),
            format!(
                "another nvproxy serve (pid {}) owns the run directory {}: stop it first, or \
                 give this one a run directory of its own (--run-dir, NVPROXY_RUN_DIR or \
                 [daemon] run_dir)",
                std::process::id(),
                dir.path().display()
            )
        );
        drop(first);
        let again = ServeLock::acquire(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(paths::SERVE_LOCK)).unwrap();
        assert_eq!(text, format!("{}\n", std::process::id()));
        drop(again);
    }

    #[test]
    fn test_a_worker_is_recognised_after_global_options() {
        let w = |s: &str| runs_nvproxy_command(s.replace(' ', "\0").as_bytes(), b"worker");
        assert!(w("/usr/bin/nvproxy worker"));
        assert!(w("/usr/bin/nvproxy --log info,nvsim=debug worker"));
        assert!(w("nvproxy --log=debug worker"));
        assert!(!w("/usr/bin/nvproxy serve --config worker"));
        assert!(!w("/usr/bin/nvproxy --log worker serve"));
        assert!(!w("/usr/bin/other worker"));
    }

    #[test]
    fn test_removing_an_unknown_instance_is_an_error() {
        let dir = test_kit::TestDir::new("sup-rm");
        let sup = Supervisor::new(&dir.path().join("run"), None).unwrap();
        let err = sup.remove("nope", false).unwrap_err();
        assert_eq!(err.to_string(), "no instance nope");
    }

    #[test]
    fn test_an_exit_is_described_in_words() {
        use std::os::unix::process::ExitStatusExt;
        let st = |raw| Some(std::process::ExitStatus::from_raw(raw));
        assert_eq!(describe_exit(st(256)), "exited with status 1");
        assert_eq!(describe_exit(st(9)), "was killed by SIGKILL");
        assert_eq!(describe_exit(None), "ended (its status is unknown)");
    }
}
