//! `nvproxy ns-exec` (internal): runs a command in a private mount namespace that shows the
//! instance's nodes where a container would see NVIDIA's.
//!
//! `nvproxy exec` starts this as a fresh child process (so the namespace set-up runs
//! single-threaded, not in a fork of the multi-threaded daemon), which then `execvp`s the
//! workload. Inside the namespace:
//!
//! - `/dev` is a new tmpfs holding bind mounts of every entry of the host's `/dev` except the
//!   host's NVIDIA nodes (`nvidia*`), nvproxy's own tree (`nvproxy/`) and `cuse`/`fuse`, plus the instance's
//!   CUSE nodes bind-mounted at `/dev/nvidiactl`, `/dev/nvidia0`, ... (bind mounts keep
//!   devtmpfs's mount flags, so the nodes open although they sit on a fresh tmpfs);
//! - `/proc/driver/nvidia/params` says `ModifyDeviceFiles: 0`, so libcuda opens our nodes
//!   instead of trying to recreate them as 195:N (observed with Debian's libcuda 535.261.03).
//!   With the host driver it is the host's file with that one line changed; without one, a small
//!   tmpfs is mounted on `/proc/driver` (the only way to add files under procfs).
//!
//! - `/dev/char` is the namespace's own directory: the host's links except those to hidden
//!   nodes, plus `195:255` and `195:<N>` pointing at our `nvidiactl` and `nvidia<N>` (the links
//!   the NVIDIA driver's tools keep; libcuda re-creates `195:255` itself at initialisation and
//!   fails with `CUDA_ERROR_OPERATING_SYSTEM` where it cannot, and must never write into the
//!   host's `/dev/char`);
//! - with `--sim-proc DIR` (the simulated driver), `/proc/driver/nvidia` is a tmpfs holding
//!   DIR's files (the simulated driver's `params`, `version`, `gpus/<pci>/information`)
//!   instead of the host's or none;
//! - with `--sim-sys DIR` (the simulated driver), the machine's PCI devices in `/sys` are the
//!   simulated ones of DIR (`nvsim::sysfs`: the GPUs, each behind its PCIe switch and root
//!   port): `/sys/bus/pci` is a tmpfs holding DIR's `bus/pci`, and `/sys/devices` a tmpfs
//!   holding bind mounts of every host entry except the PCI domains (`pci*`), plus DIR's
//!   `devices/pci*`; both read-only. NVML's hwloc builds the PCI tree from there (`topo -m`
//!   needs the GPUs in it). The host's PCI devices are not visible; links to them elsewhere in
//!   `/sys` (`/sys/class/net/<nic>`, `/sys/dev/...`) dangle;
//! - with `--mmap-socket`, `/run/nvproxy` is a small tmpfs holding only `mmap.sock`, a bind
//!   mount of the instance's socket (so other instances' sockets are not even visible), and the
//!   command runs with the shim appended to `LD_PRELOAD` and `NVPROXY_NODES` set (see the
//!   `preload` crate).
//!
//! - the command gets its own **pid namespace** with its own `/proc`: it sees only its own
//!   processes, so a root tenant cannot reach another instance's nodes (or anything else)
//!   through `/proc/<pid>/root` of a process outside. ns-exec forks the namespace's init
//!   (pid 1: mounts `/proc`, runs the command as its child, reaps orphans, forwards
//!   SIGINT/SIGTERM/SIGHUP) and waits for it, forwarding the same signals; the exit status is
//!   the command's (128 + signal when killed).
//! - the chain dies with `nvproxy exec`, even when it is killed with SIGKILL: exec starts
//!   ns-exec with `PR_SET_PDEATHSIG` = SIGKILL (`child.rs`), ns-exec gives its init the same,
//!   and the kernel kills every process of a pid namespace when its init dies.
//!
//! Mount propagation is made private first, so nothing leaks to the host's namespace.

use crate::cdi::char_link_name;
use std::ffi::CString;
use std::fs;
use std::os::unix::fs::{FileTypeExt, symlink};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

/// What the namespace must contain.
#[derive(Debug, Clone, clap::Args)]
pub struct NsSpec {
    /// A node to provide: `SOURCE=NAME` binds SOURCE (our CUSE node) at /dev/NAME.
    #[arg(long = "node", value_parser = parse_node)]
    pub nodes: Vec<(PathBuf, String)>,
    /// Provide /proc/driver/nvidia/params with `ModifyDeviceFiles: 0`.
    #[arg(long)]
    pub driver_params: bool,
    /// Replace /proc/driver/nvidia with the files of DIR (the simulated driver's), copied into a
    /// tmpfs; implies the params file (DIR's).
    #[arg(long, value_name = "DIR")]
    pub sim_proc: Option<PathBuf>,
    /// Replace the PCI devices of /sys with the tree in DIR (`bus/pci`, `devices/pci*`: the
    /// simulated GPUs'), on tmpfs mounts.
    #[arg(long, value_name = "DIR")]
    pub sim_sys: Option<PathBuf>,
    /// The instance's mmap socket, bind-mounted at /run/nvproxy/mmap.sock.
    #[arg(long, value_name = "PATH")]
    pub mmap_socket: Option<PathBuf>,
    /// Append this mmap shim to the command's LD_PRELOAD.
    #[arg(long, value_name = "PATH")]
    pub preload: Option<PathBuf>,
    /// `NVPROXY_NODES` for the shim (`maj:min,...`).
    #[arg(long, value_name = "IDS")]
    pub nvproxy_nodes: Option<String>,
    /// The socket transport: the instance's device socket, bind-mounted at
    /// /run/nvproxy/dev.sock, and `NVPROXY_DEV_SOCKET` set for the shim.
    #[arg(long, value_name = "PATH", conflicts_with = "mmap_socket")]
    pub dev_socket: Option<PathBuf>,
    /// With --dev-socket: the instance's GPU count (`NVPROXY_DEV_GPUS`).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub dev_gpus: u32,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

fn parse_node(s: &str) -> Result<(PathBuf, String), String> {
    let (src, name) = s.split_once('=').ok_or("expected SOURCE=NAME")?;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(format!("bad node name {name:?}"));
    }
    Ok((PathBuf::from(src), name.to_owned()))
}

/// Whether an entry of the host's /dev is hidden from the workload.
/// `/dev/cuse` and `/dev/fuse` would let a root workload create devices of its own.
fn hidden_dev_entry(name: &str) -> bool {
    name.starts_with("nvidia") || matches!(name, "nvproxy" | "cuse" | "fuse")
}

/// Sets up the namespace and replaces this process with the command. Returns only on error.
pub fn run(spec: &NsSpec) -> Result<std::convert::Infallible> {
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID)
        .context("unshare(CLONE_NEWNS | CLONE_NEWPID) (needs root)")?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("making / private")?;
    setup_dev(&spec.nodes)?;
    if let Some(dir) = &spec.sim_sys {
        setup_sim_sys(dir)?;
    }
    if let Some(socket) = &spec.mmap_socket {
        setup_mmap_socket(socket, nvproxy_preload_proto::DEFAULT_SOCKET_PATH)?;
    }
    if let Some(socket) = &spec.dev_socket {
        setup_mmap_socket(
            socket,
            nvproxy_preload_proto::socket::DEFAULT_DEV_SOCKET_PATH,
        )?;
    }
    // The command's pid namespace: its first process (pid 1) mounts the namespace's own
    // /proc, so no process outside it is visible there and `/proc/<pid>/root` of another
    // instance's process cannot be reached; then it runs the command as its child and reaps
    // what the command leaves (an init's job: as pid 1 it would ignore signals it has no
    // handler for, so the command is not pid 1).
    let termination = termination_set();
    termination
        .thread_block()
        .context("blocking signals for the namespace's init")?;
    // The init dies with us (`PR_SET_PDEATHSIG`, and with it, as the kernel tears a pid
    // namespace down with its init, the command): we hold this pipe's write end until we exit,
    // so that the init sees whether we died before its prctl took effect (its parent is
    // outside its pid namespace: `getppid` says 0 there).
    let (alive_r, alive_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe for the init")?;
    if let Some(init) =
        nvproxy_worker::sys::fork_single_threaded().context("forking the namespace's init")?
    {
        drop(alive_r);
        let code = supervise(init, &termination);
        drop(alive_w);
        std::process::exit(code);
    }
    // pid 1 of the new namespace.
    drop(alive_w);
    if nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).is_err()
        || parent_gone(&alive_r)
    {
        std::process::exit(126);
    }
    drop(alive_r);
    let code = (|| -> Result<i32> {
        mount(
            Some("proc"),
            "/proc",
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .context("mounting the pid namespace's /proc")?;
        if let Some(dir) = &spec.sim_proc {
            setup_sim_proc(dir)?;
        } else if spec.driver_params {
            setup_driver_params()?;
        }
        match nvproxy_worker::sys::fork_single_threaded().context("forking the command")? {
            Some(cmd) => Ok(supervise(cmd, &termination)),
            None => {
                let _ = nix::sys::signal::SigSet::empty().thread_set_mask();
                let e = exec(&spec.command, &command_env(spec)).unwrap_err();
                eprintln!("nvproxy: {e:#}");
                std::process::exit(127);
            }
        }
    })();
    match code {
        Ok(c) => std::process::exit(c),
        Err(e) => {
            eprintln!("nvproxy: {e:#}");
            std::process::exit(126);
        }
    }
}

/// Whether the write end of `r`'s pipe is closed everywhere (its holder died).
fn parent_gone(r: &std::os::fd::OwnedFd) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(r.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(0) => false,
        Ok(_) => fds[0]
            .revents()
            .is_some_and(|e| e.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
        Err(_) => true,
    }
}

/// SIGINT, SIGTERM, SIGHUP and SIGCHLD.
fn termination_set() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ] {
        set.add(s);
    }
    set
}

/// Waits for `child` (signals blocked in `set`): forwards SIGINT/SIGTERM/SIGHUP to it, reaps
/// every child that exits (as pid 1, also orphans of the command), and returns `child`'s exit
/// code (128 + signal when it was killed).
fn supervise(child: nix::unistd::Pid, set: &nix::sys::signal::SigSet) -> i32 {
    use nix::sys::signal::Signal;
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    loop {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == child => return code,
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => return 128 + sig as i32,
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
        match set.wait() {
            Ok(Signal::SIGCHLD) | Err(_) => {}
            Ok(sig) => {
                let _ = nix::sys::signal::kill(child, sig);
            }
        }
    }
}

/// The command's environment: ours, with the shim appended to `LD_PRELOAD` and
/// `NVPROXY_NODES` set when asked.
fn command_env(spec: &NsSpec) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let mut env: Vec<_> = std::env::vars_os()
        .filter(|(k, _)| {
            !(spec.preload.is_some() && k == "LD_PRELOAD"
                || spec.nvproxy_nodes.is_some() && k == nvproxy_preload_proto::ENV_NODES
                || k == nvproxy_preload_proto::socket::ENV_DEV_SOCKET
                || k == nvproxy_preload_proto::socket::ENV_DEV_GPUS
                || k == nvproxy_preload_proto::socket::ENV_DEV_UVM_MAJOR)
        })
        .collect();
    if let Some(shim) = &spec.preload {
        let user = std::env::var("LD_PRELOAD").ok();
        env.push((
            "LD_PRELOAD".into(),
            nvproxy_worker::mmap::ld_preload_with(user.as_deref(), shim).into(),
        ));
    }
    if let Some(nodes) = &spec.nvproxy_nodes {
        env.push((nvproxy_preload_proto::ENV_NODES.into(), nodes.into()));
    }
    if spec.dev_socket.is_some() {
        use nvproxy_preload_proto::socket::{
            DEFAULT_DEV_SOCKET_PATH, ENV_DEV_GPUS, ENV_DEV_SOCKET,
        };
        env.push((ENV_DEV_SOCKET.into(), DEFAULT_DEV_SOCKET_PATH.into()));
        env.push((ENV_DEV_GPUS.into(), spec.dev_gpus.to_string().into()));
        // libcuda compares /dev/nvidia-uvm's major with the driver's in /proc/devices.
        if let Some(major) = nvproxy_worker::host::uvm_major() {
            env.push((
                nvproxy_preload_proto::socket::ENV_DEV_UVM_MAJOR.into(),
                major.to_string().into(),
            ));
        }
    }
    env
}

/// Shows the instance's socket, alone, at `at` (`/run/nvproxy/mmap.sock`, or `dev.sock` for the
/// socket transport). Runs after the /dev staging, which covers /run for a while.
fn setup_mmap_socket(socket: &Path, at: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    // Hold the socket by an O_PATH fd: the tmpfs below hides its path.
    let held = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(socket)
        .with_context(|| format!("mmap socket {}", socket.display()))?;
    if !held.metadata()?.file_type().is_socket() {
        bail!("{} is not a socket", socket.display());
    }
    let dir = Path::new(at)
        .parent()
        .context("socket path has a directory")?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=755,size=16k"),
    )
    .with_context(|| format!("mounting a tmpfs on {}", dir.display()))?;
    let dst = Path::new(at);
    fs::File::create(dst).with_context(|| format!("creating {}", dst.display()))?;
    let src = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&held)
    ));
    bind(&src, dst, false)
}

fn bind(src: &Path, dst: &Path, recursive: bool) -> Result<()> {
    let mut flags = MsFlags::MS_BIND;
    if recursive {
        flags |= MsFlags::MS_REC;
    }
    mount(Some(src), dst, None::<&str>, flags, None::<&str>)
        .with_context(|| format!("bind-mounting {} on {}", src.display(), dst.display()))
}

fn setup_dev(nodes: &[(PathBuf, String)]) -> Result<()> {
    for (src, _) in nodes {
        let meta = fs::metadata(src).with_context(|| format!("node {}", src.display()))?;
        if !meta.file_type().is_char_device() {
            bail!("{} is not a character device", src.display());
        }
    }
    // Keep the host's /dev reachable under a path while a tmpfs covers it: bind it to a
    // directory of the new tmpfs, copy the entries over as bind mounts, then detach it.
    let old = Path::new("/dev");
    let stage = Path::new("/run/nvproxy-olddev");
    mount(
        Some("tmpfs"),
        "/run",
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some("mode=755,size=64k"),
    )
    .context("mounting a staging tmpfs on /run")?;
    fs::create_dir(stage)?;
    bind(old, stage, true)?;
    mount(
        Some("tmpfs"),
        old,
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some("mode=755"),
    )
    .context("mounting a tmpfs on /dev")?;
    for entry in fs::read_dir(stage).context("reading the host's /dev")? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name_str) = name.to_str() else {
            continue;
        };
        if hidden_dev_entry(name_str) {
            continue;
        }
        let src = entry.path();
        let dst = old.join(&name);
        let ft = entry.file_type()?;
        if ft.is_symlink() {
            symlink(fs::read_link(&src)?, &dst)?;
        } else if ft.is_dir() && name_str == "char" {
            copy_char_links(&src, &dst)?;
        } else if ft.is_dir() {
            fs::create_dir(&dst)?;
            bind(&src, &dst, true)?;
        } else {
            fs::File::create(&dst)?;
            bind(&src, &dst, false)?;
        }
    }
    for (src, name) in nodes {
        // Sources under /dev are hidden by the new tmpfs now: take them from the staged copy.
        let src = match src.strip_prefix(old) {
            Ok(rel) => stage.join(rel),
            Err(_) => src.clone(),
        };
        let dst = old.join(name);
        fs::File::create(&dst).with_context(|| format!("creating {}", dst.display()))?;
        bind(&src, &dst, false)?;
        if let Some(link) = char_link_name(name) {
            let dir = old.join("char");
            fs::create_dir_all(&dir)?;
            let _ = fs::remove_file(dir.join(&link));
            symlink(format!("../{name}"), dir.join(&link))
                .with_context(|| format!("creating /dev/char/{link}"))?;
        }
    }
    nix::mount::umount2(stage, nix::mount::MntFlags::MNT_DETACH)
        .context("detaching staging /dev")?;
    nix::mount::umount2("/run", nix::mount::MntFlags::MNT_DETACH)
        .context("detaching staging /run")?;
    Ok(())
}

/// Fills the namespace's own `/dev/char` with the host's links, except those to hidden entries
/// (the host's NVIDIA nodes).
fn copy_char_links(host: &Path, dst: &Path) -> Result<()> {
    fs::create_dir(dst)?;
    for entry in fs::read_dir(host).context("reading the host's /dev/char")? {
        let entry = entry?;
        if !entry.file_type()?.is_symlink() {
            continue;
        }
        let target = fs::read_link(entry.path())?;
        let hidden = target
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(hidden_dev_entry)
            || target.components().any(|c| {
                c.as_os_str()
                    .to_str()
                    .is_some_and(|n| n != ".." && hidden_dev_entry(n))
            });
        if !hidden {
            symlink(&target, dst.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// The params file the workload sees: the host's with `ModifyDeviceFiles: 0`, or a minimal one.
fn driver_params_text() -> String {
    match fs::read_to_string("/proc/driver/nvidia/params") {
        Ok(host) => {
            let mut out: String = host
                .lines()
                .filter(|l| !l.starts_with("ModifyDeviceFiles:"))
                .map(|l| format!("{l}\n"))
                .collect();
            out.push_str("ModifyDeviceFiles: 0\n");
            out
        }
        Err(_) => "ModifyDeviceFiles: 0\n".to_owned(),
    }
}

fn setup_driver_params() -> Result<()> {
    let text = driver_params_text();
    let real = Path::new("/proc/driver/nvidia/params");
    if real.exists() {
        // Stage the file on the namespace's own /dev tmpfs, bind it over the host's, unlink it.
        let staged = Path::new("/dev/.nvproxy-params");
        fs::write(staged, &text)?;
        bind(staged, real, false)?;
        fs::remove_file(staged)?;
        return Ok(());
    }
    let driver_dir = Path::new("/proc/driver");
    if !driver_dir.is_dir() {
        bail!(
            "/proc/driver does not exist on this kernel: cannot provide /proc/driver/nvidia/params"
        );
    }
    mount(
        Some("tmpfs"),
        driver_dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=755,size=64k"),
    )
    .context("mounting a tmpfs on /proc/driver")?;
    fs::create_dir(driver_dir.join("nvidia"))?;
    fs::write(driver_dir.join("nvidia/params"), text)?;
    Ok(())
}

/// Shows `dir`'s files (relative paths, one level of subdirectories and more) as
/// `/proc/driver/nvidia`, on a tmpfs over the host's directory or, without one, over
/// `/proc/driver`.
fn setup_sim_proc(dir: &Path) -> Result<()> {
    let mut files = Vec::new();
    collect_files(dir, Path::new(""), &mut files)
        .with_context(|| format!("reading {}", dir.display()))?;
    let nvidia = Path::new("/proc/driver/nvidia");
    let (mount_on, root) = if nvidia.is_dir() {
        (nvidia, nvidia.to_path_buf())
    } else {
        let driver = Path::new("/proc/driver");
        if !driver.is_dir() {
            bail!("/proc/driver does not exist on this kernel: cannot provide /proc/driver/nvidia");
        }
        (driver, driver.join("nvidia"))
    };
    mount(
        Some("tmpfs"),
        mount_on,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=755,size=256k"),
    )
    .with_context(|| format!("mounting a tmpfs on {}", mount_on.display()))?;
    fs::create_dir_all(&root)?;
    for (rel, data) in files {
        let dst = root.join(rel);
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&dst, data).with_context(|| format!("writing {}", dst.display()))?;
    }
    Ok(())
}

/// Shows DIR's `bus/pci` as `/sys/bus/pci` and DIR's `devices/pci*` in place of the host's in
/// `/sys/devices` (the host's other entries bind-mounted back), all on read-only tmpfs mounts.
fn setup_sim_sys(dir: &Path) -> Result<()> {
    let tmpfs_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let pci = Path::new("/sys/bus/pci");
    mount(
        Some("tmpfs"),
        pci,
        Some("tmpfs"),
        tmpfs_flags,
        Some("mode=755,size=1m"),
    )
    .context("mounting a tmpfs on /sys/bus/pci")?;
    copy_tree(&dir.join("bus/pci"), pci)?;
    readonly(pci)?;

    // Keep the host's /sys/devices reachable under a staging path while a tmpfs covers it.
    let devices = Path::new("/sys/devices");
    let stage_root = Path::new("/run");
    let stage = stage_root.join("nvproxy-oldsys");
    mount(
        Some("tmpfs"),
        stage_root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some("mode=755,size=64k"),
    )
    .context("mounting a staging tmpfs on /run")?;
    fs::create_dir(&stage)?;
    bind(devices, &stage, true)?;
    mount(
        Some("tmpfs"),
        devices,
        Some("tmpfs"),
        tmpfs_flags,
        Some("mode=755,size=4m"),
    )
    .context("mounting a tmpfs on /sys/devices")?;
    for entry in fs::read_dir(&stage).context("reading the host's /sys/devices")? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_str().is_some_and(|n| n.starts_with("pci")) || !entry.file_type()?.is_dir() {
            continue;
        }
        let dst = devices.join(&name);
        fs::create_dir(&dst)?;
        bind(&entry.path(), &dst, true)?;
    }
    copy_tree(&dir.join("devices"), devices)?;
    nix::mount::umount2(&stage, nix::mount::MntFlags::MNT_DETACH)
        .context("detaching staging /sys/devices")?;
    nix::mount::umount2(stage_root, nix::mount::MntFlags::MNT_DETACH)
        .context("detaching staging /run")?;
    readonly(devices)
}

/// Remounts the tmpfs at `path` read-only (sysfs attributes are not the workload's to write).
fn readonly(path: &Path) -> Result<()> {
    mount(
        None::<&str>,
        path,
        None::<&str>,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .with_context(|| format!("remounting {} read-only", path.display()))
}

/// Copies the directories, files and symlinks under `src` into the existing directory `dst`.
fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    for entry in fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let entry = entry?;
        let to = dst.join(entry.file_name());
        let ft = entry.file_type()?;
        if ft.is_symlink() {
            symlink(fs::read_link(entry.path())?, &to)
        } else if ft.is_dir() {
            fs::create_dir(&to)
                .map_err(Into::into)
                .and_then(|()| copy_tree(&entry.path(), &to))?;
            continue;
        } else {
            fs::copy(entry.path(), &to).map(|_| ())
        }
        .with_context(|| format!("creating {}", to.display()))?;
    }
    Ok(())
}

fn collect_files(base: &Path, rel: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) -> Result<()> {
    for entry in fs::read_dir(base.join(rel))? {
        let entry = entry?;
        let rel = rel.join(entry.file_name());
        let ft = entry.file_type()?;
        if ft.is_dir() {
            collect_files(base, &rel, out)?;
        } else if ft.is_file() {
            out.push((rel.clone(), fs::read(base.join(&rel))?));
        }
    }
    Ok(())
}

fn exec(
    command: &[String],
    env: &[(std::ffi::OsString, std::ffi::OsString)],
) -> Result<std::convert::Infallible> {
    use std::os::unix::ffi::OsStrExt;
    let args: Vec<CString> = command
        .iter()
        .map(|a| CString::new(a.as_bytes()).context("argument contains a NUL byte"))
        .collect::<Result<_>>()?;
    let env: Vec<CString> = env
        .iter()
        .filter_map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).ok()
        })
        .collect();
    let Some(prog) = args.first() else {
        bail!("no command given")
    };
    Err(nix::unistd::execvpe(prog, &args, &env).unwrap_err())
        .with_context(|| format!("executing {}", command[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_node_splits_source_and_name() {
        assert_eq!(
            parse_node("/dev/nvproxy/a/nvidiactl=nvidiactl").unwrap(),
            (
                PathBuf::from("/dev/nvproxy/a/nvidiactl"),
                "nvidiactl".to_owned()
            )
        );
    }

    #[test]
    fn test_parse_node_refuses_paths_as_names() {
        assert!(parse_node("/x=../etc").is_err());
        assert!(parse_node("/x=a/b").is_err());
        assert!(parse_node("/x").is_err());
    }

    #[test]
    fn test_char_links_use_the_drivers_numbers() {
        assert_eq!(char_link_name("nvidiactl").as_deref(), Some("195:255"));
        assert_eq!(char_link_name("nvidia3").as_deref(), Some("195:3"));
        assert_eq!(char_link_name("nvidia-uvm"), None);
    }

    #[test]
    fn test_host_nvidia_nodes_are_hidden() {
        assert!(hidden_dev_entry("nvidia0"));
        assert!(hidden_dev_entry("nvidia-caps"));
        assert!(hidden_dev_entry("nvproxy"));
        assert!(hidden_dev_entry("cuse"));
        assert!(!hidden_dev_entry("null"));
    }
}
