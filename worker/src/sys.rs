//! The daemon's system calls: safe wrappers from `rustix` and `nix` where a crate offers one,
//! and the daemon's `unsafe` code where none does (each block with its `// SAFETY:` comment):
//! the Landlock ABI probe, `tgkill`, a value-argument ioctl, `sigtimedwait`, taking ownership
//! of inherited fds, `pre_exec` hooks, `fork` and the userfaultfd/mmap helpers of the tests.

use std::io;

/// `LANDLOCK_CREATE_RULESET_VERSION` (linux/landlock.h): ask for the ABI version.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;

/// The kernel's Landlock ABI version, or the errno saying why there is none
/// (`ENOSYS`: not built in; `EOPNOTSUPP`: built in but disabled at boot).
pub fn landlock_abi_version() -> io::Result<u32> {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) reads no memory
    // (attr is NULL, size 0) and returns the ABI version as a non-negative int, or -1 and errno.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(ret).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Whether `pidfd_open(tid, PIDFD_THREAD)` works on this kernel (Linux 6.9+), tried on our own
/// thread. fd identity resolution needs it (DESIGN.md section 3, step 5).
pub fn pidfd_thread_supported() -> io::Result<()> {
    let fd = rustix::process::pidfd_open(rustix::thread::gettid(), PIDFD_THREAD)?;
    drop(fd);
    Ok(())
}

/// `PIDFD_THREAD` (linux/pidfd.h, Linux 6.9+): `O_EXCL`. rustix names no such flag, but
/// `PidfdFlags` passes unnamed bits through.
const PIDFD_THREAD: rustix::process::PidfdFlags =
    rustix::process::PidfdFlags::from_bits_retain(libc::O_EXCL as u32);

/// `pid` as rustix's `Pid`: `ESRCH` beyond `pid_t`, `err` for 0 (which rustix cannot name).
fn to_pid(pid: u32, err: i32) -> io::Result<rustix::process::Pid> {
    let raw = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    rustix::process::Pid::from_raw(raw).ok_or_else(|| io::Error::from_raw_os_error(err))
}

/// `CAP_SYS_ADMIN` (linux/capability.h): what the NVIDIA driver's `os_is_administrator()`
/// (`NV_IS_SUSER`, `capable(CAP_SYS_ADMIN)`) asks of the calling thread.
pub const CAP_SYS_ADMIN: u32 = 21;

/// One thread's capability sets, as 64-bit masks (bit N is capability N).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadCaps {
    /// What the kernel's `capable()` checks.
    pub effective: u64,
    /// The most the thread may ever have in `effective` again.
    pub permitted: u64,
    /// What an `execve` may pass on.
    pub inheritable: u64,
}

impl ThreadCaps {
    /// Whether `cap` is in the effective set.
    pub fn has_effective(&self, cap: u32) -> bool {
        cap < 64 && self.effective & (1u64 << cap) != 0
    }

    /// Whether `cap` is in the permitted set.
    pub fn has_permitted(&self, cap: u32) -> bool {
        cap < 64 && self.permitted & (1u64 << cap) != 0
    }
}

/// The calling thread's capability sets (`capget`, version 3, on this thread).
fn capget_thread() -> io::Result<rustix::thread::CapabilitySets> {
    Ok(rustix::thread::capabilities(None)?)
}

/// The calling thread's capabilities (`capget` on this thread; capabilities are per thread).
pub fn thread_caps() -> io::Result<ThreadCaps> {
    let sets = capget_thread()?;
    Ok(ThreadCaps {
        effective: sets.effective.bits(),
        permitted: sets.permitted.bits(),
        inheritable: sets.inheritable.bits(),
    })
}

/// Removes `cap` from the calling thread's effective, permitted and inheritable sets and keeps
/// every other capability it has (`capget`, then `capset` on this thread only). Irreversible
/// for the thread and for the threads it starts later: nothing regains a capability that is
/// not in its permitted set short of an `execve` of a privileged file. Read back afterwards:
/// an error unless `cap` is gone from both sets.
pub fn drop_thread_capability(cap: u32) -> io::Result<()> {
    use rustix::thread::CapabilitySet;
    if cap >= 64 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut sets = capget_thread()?;
    let bit = CapabilitySet::from_bits_retain(1u64 << cap);
    sets.effective.remove(bit);
    sets.permitted.remove(bit);
    sets.inheritable.remove(bit);
    // The calling thread; capset cannot change another.
    rustix::thread::set_capabilities(None, sets)?;
    let now = thread_caps()?;
    if now.has_effective(cap) || now.has_permitted(cap) {
        return Err(io::Error::other(format!(
            "capability {cap} still held after capset"
        )));
    }
    Ok(())
}

/// Puts `cap` into or out of the calling thread's effective set only (it must be in the
/// permitted set to go in); read back afterwards: an error unless the effective set says so.
pub fn set_thread_effective(cap: u32, on: bool) -> io::Result<()> {
    use rustix::thread::CapabilitySet;
    if cap >= 64 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut sets = capget_thread()?;
    let bit = CapabilitySet::from_bits_retain(1u64 << cap);
    sets.effective.set(bit, on);
    // The calling thread; capset cannot change another.
    rustix::thread::set_capabilities(None, sets)?;
    if thread_caps()?.has_effective(cap) != on {
        return Err(io::Error::other(format!(
            "capability {cap} not {} the effective set after capset",
            if on { "in" } else { "out of" }
        )));
    }
    Ok(())
}

/// `CAP_SYS_PTRACE` (linux/capability.h): what `pidfd_getfd`, `process_vm_readv/writev` and
/// `/proc/<pid>/maps` of tenant processes of another uid need.
pub const CAP_SYS_PTRACE: u32 = 19;
/// `CAP_SYS_NICE`: what the driver grants `RS_ACCESS_NICE` for (the interleave level of a
/// channel group, `ioctl_proxy::schedule`).
pub const CAP_SYS_NICE: u32 = 23;

/// In a freshly forked child, before `execve` (`CommandExt::pre_exec`): becomes `uid`/`gid`
/// (real, effective and saved; the supplementary groups become `[gid]`) while keeping the
/// capabilities of the mask `keep` through the `execve`, in the permitted, effective,
/// inheritable and ambient sets; every other capability is gone. Only raw system calls, no
/// allocation: safe between `fork` and `execve` of a multi-threaded parent.
fn become_user_keeping(uid: u32, gid: u32, keep: u64) -> io::Result<()> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    if keep >> 32 != 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // rustix's linux_raw backend makes each of these one raw system call on this thread (no
    // libc wrapper that would signal the other threads, no allocation).
    let gid = rustix::process::Gid::from_raw(gid);
    let uid = rustix::process::Uid::from_raw(uid);
    rustix::thread::set_thread_groups(&[gid])?;
    rustix::thread::set_thread_res_gid(gid, gid, gid)?;
    // Keep the permitted set through the uid change (it is cleared otherwise).
    rustix::thread::set_keep_capabilities(true)?;
    rustix::thread::set_thread_res_uid(uid, uid, uid)?;
    let bits = CapabilitySet::from_bits_retain(keep);
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: bits,
            permitted: bits,
            inheritable: bits,
        },
    )?;
    rustix::thread::set_keep_capabilities(false)?;
    // Ambient: what survives the execve of our (capability-less) binary, one at a time.
    for cap in 0..32 {
        if keep & (1 << cap) != 0 {
            let bit = CapabilitySet::from_bits_retain(1 << cap);
            rustix::thread::configure_capability_in_ambient_set(bit, true)?;
        }
    }
    Ok(())
}

/// Takes ownership of fds this process inherited (`fds`: distinct, open). Once per process:
/// a second call is refused, so no fd gets two owners.
pub fn take_inherited_fds(fds: &[i32]) -> io::Result<Vec<std::os::fd::OwnedFd>> {
    use std::os::fd::FromRawFd;
    static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if TAKEN.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return Err(io::Error::other("inherited fds taken twice"));
    }
    for (i, &fd) in fds.iter().enumerate() {
        if fd < 0 || fds[..i].contains(&fd) || nix::fcntl::fcntl(fd, nix::fcntl::F_GETFD).is_err() {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
    }
    Ok(fds
        .iter()
        // SAFETY: each fd is open and distinct (checked above), and nothing else in this
        // process owns it: it was inherited for this use, and this function runs once.
        .map(|&fd| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
        .collect())
}

/// Makes `cmd`'s child keep `fds` open across its `execve` and run as `uid`/`gid` with only
/// the capabilities `keep` (`become_user_keeping`); both happen in the child between `fork`
/// and `execve`.
pub fn exec_as_user_keeping(
    cmd: &mut std::process::Command,
    fds: Vec<i32>,
    uid: u32,
    gid: u32,
    keep: &[u32],
) {
    use std::os::unix::process::CommandExt;
    // The mask is made here: the child must not allocate. A number past 31 makes the child
    // fail to start (EINVAL) rather than be dropped.
    let keep = keep
        .iter()
        .fold(0u64, |m, &c| m | 1u64.checked_shl(c).unwrap_or(1 << 63));
    // SAFETY: the closure runs between fork and execve; it makes raw system calls only
    // (fcntl, setgroups, setresgid/setresuid, prctl, capset: nix and rustix wrappers that
    // allocate nothing) and allocates nothing; `fds` was moved in and is only read.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &fds {
                keep_across_exec(fd)?;
            }
            become_user_keeping(uid, gid, keep)
        });
    }
}

/// Makes `cmd`'s child get SIGKILL when the thread that starts it exits
/// (`PR_SET_PDEATHSIG`, set in the child between `fork` and `execve`); a child whose parent
/// died before the prctl took effect fails to start (`ESRCH`): no signal would come.
pub fn killed_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before execve and only makes the
    // async-signal-safe syscalls prctl (rustix, a raw system call) and getppid; it allocates
    // nothing.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // We died before the prctl took effect: no signal will come.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// In a forked child before `execve`: clears `FD_CLOEXEC` on `fd`, so the new program
/// inherits it. A raw system call only.
fn keep_across_exec(fd: i32) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty()))?;
    Ok(())
}

/// The calling thread's id.
pub fn gettid() -> u32 {
    u32::try_from(rustix::thread::gettid().as_raw_nonzero().get()).unwrap_or(0)
}

/// Reads `buf.len()` bytes at `addr` in thread `tid`'s address space. A short read (the range
/// crosses an unmapped page) is reported as `EFAULT`, like the driver's `copy_from_user`.
pub fn process_vm_read(tid: u32, addr: u64, buf: &mut [u8]) -> io::Result<()> {
    use nix::sys::uio::{RemoteIoVec, process_vm_readv};
    if buf.is_empty() {
        return Ok(());
    }
    let pid = libc::pid_t::try_from(tid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    let base = usize::try_from(addr).map_err(|_| io::Error::from_raw_os_error(libc::EFAULT))?;
    let remote = [RemoteIoVec {
        base,
        len: buf.len(),
    }];
    let len = buf.len();
    let n = process_vm_readv(
        nix::unistd::Pid::from_raw(pid),
        &mut [io::IoSliceMut::new(buf)],
        &remote,
    )?;
    if n == len {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EFAULT))
    }
}

/// Writes `data` at `addr` in thread `tid`'s address space; a short write is `EFAULT`.
pub fn process_vm_write(tid: u32, addr: u64, data: &[u8]) -> io::Result<()> {
    use nix::sys::uio::{RemoteIoVec, process_vm_writev};
    if data.is_empty() {
        return Ok(());
    }
    let pid = libc::pid_t::try_from(tid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    let base = usize::try_from(addr).map_err(|_| io::Error::from_raw_os_error(libc::EFAULT))?;
    let remote = [RemoteIoVec {
        base,
        len: data.len(),
    }];
    let n = process_vm_writev(
        nix::unistd::Pid::from_raw(pid),
        &[io::IoSlice::new(data)],
        &remote,
    )?;
    if n == data.len() {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EFAULT))
    }
}

/// `pidfd_open(tid, PIDFD_THREAD)`: a pidfd for one thread (Linux 6.9+).
pub fn pidfd_open_thread(tid: u32) -> io::Result<std::os::fd::OwnedFd> {
    // The kernel refuses pid 0 with EINVAL; rustix cannot name it.
    let tid = to_pid(tid, libc::EINVAL)?;
    Ok(rustix::process::pidfd_open(tid, PIDFD_THREAD)?)
}

/// `pidfd_getfd(pidfd, targetfd, 0)`: a duplicate of another process's file descriptor.
pub fn pidfd_getfd(
    pidfd: std::os::fd::BorrowedFd<'_>,
    target: i32,
) -> io::Result<std::os::fd::OwnedFd> {
    use rustix::process::PidfdGetfdFlags;
    Ok(rustix::process::pidfd_getfd(
        pidfd,
        target,
        PidfdGetfdFlags::empty(),
    )?)
}

/// Whether `tid` is a thread of this process (`tgkill(getpid(), tid, 0)` succeeds).
pub fn is_own_thread(tid: u32) -> bool {
    let Ok(tid) = libc::pid_t::try_from(tid) else {
        return false;
    };
    let pid = nix::unistd::getpid().as_raw();
    // SAFETY: tgkill with signal 0 sends nothing; it only checks that `tid` is in thread group
    // `pid`. All arguments are plain integers.
    unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, 0) == 0 }
}

/// A value-argument ioctl: `ioctl(fd, cmd, arg)` where `arg` is not a pointer. Returns the
/// non-negative result.
pub fn ioctl_by_value(fd: std::os::fd::BorrowedFd<'_>, cmd: u32, arg: u64) -> io::Result<i32> {
    use std::os::fd::AsRawFd;
    // SAFETY: `fd` is borrowed and open for the call. The command is one of our private
    // ioctls, which our own server answers without touching memory at `arg` (it is a value).
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), cmd as libc::Ioctl, arg as libc::c_ulong) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret)
}

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (and the threads it starts later),
/// so that [`wait_for_termination`] can take them synchronously.
pub fn block_termination_signals() -> io::Result<()> {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGINT);
    set.add(nix::sys::signal::Signal::SIGTERM);
    set.add(nix::sys::signal::Signal::SIGHUP);
    set.thread_block().map_err(io::Error::from)
}

/// Waits for SIGINT, SIGTERM or SIGHUP (blocked beforehand) and returns it.
pub fn wait_for_termination() -> io::Result<nix::sys::signal::Signal> {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGINT);
    set.add(nix::sys::signal::Signal::SIGTERM);
    set.add(nix::sys::signal::Signal::SIGHUP);
    set.wait().map_err(io::Error::from)
}

/// SIGINT, SIGTERM and SIGHUP (blocked beforehand, [`block_termination_signals`]) as a
/// readable fd (`signalfd`), for a loop that waits on other fds too.
pub struct TerminationSignals(nix::sys::signalfd::SignalFd);

impl TerminationSignals {
    pub fn new() -> io::Result<Self> {
        use nix::sys::signalfd::{SfdFlags, SignalFd};
        let mut set = nix::sys::signal::SigSet::empty();
        set.add(nix::sys::signal::Signal::SIGINT);
        set.add(nix::sys::signal::Signal::SIGTERM);
        set.add(nix::sys::signal::Signal::SIGHUP);
        SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
            .map(Self)
            .map_err(io::Error::from)
    }

    /// Readable while one of the signals is pending.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.0)
    }

    /// One pending signal (the next call gives the next), or `None`.
    pub fn take(&mut self) -> io::Result<Option<nix::sys::signal::Signal>> {
        match self.0.read_signal() {
            Ok(Some(info)) => i32::try_from(info.ssi_signo)
                .ok()
                .and_then(|n| nix::sys::signal::Signal::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL)),
            Ok(None) | Err(nix::errno::Errno::EINTR) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// `sd_notify` with one fd attached (`FDSTORE=1`: systemd keeps it for the next start of the
/// unit). Without `NOTIFY_SOCKET`, nothing.
pub fn sd_notify_with_fd(state: &str, fd: &std::os::fd::OwnedFd) -> io::Result<()> {
    use nix::sys::socket::{MsgFlags, UnixAddr};
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::net::UnixDatagram;
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(abs) => UnixAddr::new_abstract(abs.as_bytes())?,
        None => UnixAddr::new(path.as_str())?,
    };
    let sock = UnixDatagram::unbound()?;
    crate::fdpass::send_to(
        sock.as_fd(),
        state.as_bytes(),
        &[fd.as_raw_fd()],
        MsgFlags::empty(),
        Some(&addr),
    )?;
    Ok(())
}

/// The fd systemd passed this process under `name` (`LISTEN_PID`, `LISTEN_FDS`,
/// `LISTEN_FDNAMES`: the unit's fd store at start), made close-on-exec so that children do
/// not inherit it. `None` when there is none (or the variables are another process's).
pub fn stored_fd(name: &str) -> Option<std::os::fd::OwnedFd> {
    let pid: u32 = std::env::var("LISTEN_PID").ok()?.trim().parse().ok()?;
    if pid != std::process::id() {
        return None;
    }
    let n: i32 = std::env::var("LISTEN_FDS").ok()?.trim().parse().ok()?;
    let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
    let index = names.split(':').position(|n| n == name)?;
    let index = i32::try_from(index).ok().filter(|&i| i < n)?;
    const SD_LISTEN_FDS_START: i32 = 3;
    let fd = SD_LISTEN_FDS_START + index;
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).ok()?;
    take_inherited_fds(&[fd]).ok()?.pop()
}

/// Sends `state` (e.g. `READY=1`) to systemd's notify socket when `NOTIFY_SOCKET` is set; a
/// no-op otherwise. Abstract socket names (`@...`) are supported.
pub fn sd_notify(state: &str) -> io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(abs) => SocketAddr::from_abstract_name(abs.as_bytes())?,
        None => SocketAddr::from_pathname(&path)?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

/// Whether stderr is the journal stream systemd gave this process: `JOURNAL_STREAM` is
/// `DEVICE:INODE` of that stream, and stderr's `fstat` must match (a child whose stderr was
/// redirected inherits the variable, not the stream).
pub fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    let Ok(fd) = std::os::fd::AsFd::as_fd(&std::io::stderr()).try_clone_to_owned() else {
        return false;
    };
    std::fs::File::from(fd)
        .metadata()
        .is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// systemd's watchdog (`WatchdogSec=`): `WATCHDOG=1` at half the interval systemd gives in
/// `WATCHDOG_USEC`, when `WATCHDOG_PID` (if set) is this process. The supervisor pings from
/// its watch loop, so a loop that stops turning stops the pings and systemd restarts it.
pub struct Watchdog {
    every: Option<std::time::Duration>,
    last: std::time::Instant,
}

impl Watchdog {
    /// From this process's environment.
    pub fn from_env() -> Self {
        let usec = std::env::var("WATCHDOG_USEC").ok();
        let pid = std::env::var("WATCHDOG_PID").ok();
        let every = watchdog_interval(usec.as_deref(), pid.as_deref(), std::process::id());
        if let Some(e) = every {
            tracing::info!(
                every_ms = u64::try_from(e.as_millis()).unwrap_or(u64::MAX),
                "systemd watchdog: pinging"
            );
        }
        Watchdog {
            every,
            last: std::time::Instant::now(),
        }
    }

    /// How long until [`Watchdog::ping`] is due; `None` without a watchdog.
    pub fn until_due(&self) -> Option<std::time::Duration> {
        self.every.map(|e| e.saturating_sub(self.last.elapsed()))
    }

    /// Sends `WATCHDOG=1` if half the interval has passed since the last one.
    pub fn ping(&mut self) {
        let Some(every) = self.every else { return };
        if self.last.elapsed() >= every {
            if let Err(e) = sd_notify("WATCHDOG=1") {
                tracing::warn!(error = %e, "watchdog ping failed");
            }
            self.last = std::time::Instant::now();
        }
    }
}

/// The ping interval for `WATCHDOG_USEC`/`WATCHDOG_PID` as systemd sets them
/// (`sd_watchdog_enabled`): half the timeout; `None` when unset, unparsable, zero, or meant
/// for another pid.
pub fn watchdog_interval(
    usec: Option<&str>,
    pid: Option<&str>,
    me: u32,
) -> Option<std::time::Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(p) = pid
        && p.trim().parse::<u32>().ok()? != me
    {
        return None;
    }
    Some(std::time::Duration::from_micros(usec / 2))
}

/// `getsockopt(fd, SOL_SOCKET, SO_COOKIE)`: the socket's cookie, unique among the sockets
/// of this boot (`ENOTSOCK` for a file that is not a socket).
pub fn socket_cookie(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<u64> {
    Ok(rustix::net::sockopt::socket_cookie(fd)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_watchdogs_next_ping_is_the_loops_only_timeout() {
        let every = std::time::Duration::from_secs(90);
        let mut w = Watchdog {
            every: Some(every),
            last: std::time::Instant::now(),
        };
        let due = w.until_due().expect("a watchdog");
        assert!(due <= every && due > every / 2, "{due:?}");
        w.last -= every * 2;
        assert_eq!(w.until_due(), Some(std::time::Duration::ZERO), "overdue");
        let none = Watchdog {
            every: None,
            last: std::time::Instant::now(),
        };
        assert_eq!(none.until_due(), None, "no watchdog: no timeout");
    }

    #[test]
    fn test_watchdog_interval_follows_systemds_variables() {
        use std::time::Duration;
        let min = Some(Duration::from_secs(60));
        assert_eq!(watchdog_interval(Some("120000000"), None, 7), min);
        assert_eq!(watchdog_interval(Some("120000000"), Some("7"), 7), min);
        assert_eq!(watchdog_interval(Some("120000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("x"), None, 7), None);
        assert_eq!(watchdog_interval(None, Some("7"), 7), None);
    }

    #[test]
    fn test_drop_thread_capability_clears_it_on_that_thread_only_and_keeps_the_rest() {
        let before = thread_caps().unwrap();
        let after = std::thread::spawn(|| {
            drop_thread_capability(CAP_SYS_ADMIN).unwrap();
            drop_thread_capability(CAP_SYS_ADMIN).unwrap(); // again: a no-op
            thread_caps().unwrap()
        })
        .join()
        .unwrap();
        let admin = 1u64 << CAP_SYS_ADMIN;
        assert_eq!(
            after,
            ThreadCaps {
                effective: before.effective & !admin,
                permitted: before.permitted & !admin,
                inheritable: before.inheritable & !admin,
            }
        );
        assert_eq!(thread_caps().unwrap(), before);
    }

    #[test]
    fn test_thread_started_after_the_drop_inherits_it() {
        let child = std::thread::spawn(|| {
            drop_thread_capability(CAP_SYS_ADMIN).unwrap();
            std::thread::spawn(|| thread_caps().unwrap())
                .join()
                .unwrap()
        })
        .join()
        .unwrap();
        assert!(!child.has_effective(CAP_SYS_ADMIN) && !child.has_permitted(CAP_SYS_ADMIN));
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (every open of a tenant holds daemon fds:
/// the default soft limit of 1024 would let one tenant's ~1000 opens exhaust the daemon; the
/// per-instance `max_open_files` quota bounds each tenant below it). Returns (soft, hard)
/// after the change.
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(io::Error::from)?;
    }
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    Ok((soft, hard))
}

#[cfg(test)]
mod nofile_tests {
    use super::*;

    #[test]
    fn test_raise_nofile_limit_sets_soft_to_hard() {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        // Start from a low soft limit, as a default session has.
        setrlimit(Resource::RLIMIT_NOFILE, 1024.min(hard), hard).unwrap();
        let (soft, hard2) = raise_nofile_limit().unwrap();
        assert_eq!((soft, hard2), (hard, hard));
    }
}

/// A `userfaultfd` with `len` bytes at `addr` (page-aligned, mapped) registered for missing-page
/// faults: a read of them from anywhere blocks until [`uffd_zeropage`] (or the fd closes). For
/// the tests that show a tenant's page fault holding a serving thread.
#[cfg(test)]
pub fn uffd_register_missing(addr: u64, len: u64) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: userfaultfd takes flags by value and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the fd was just returned by userfaultfd and is owned by nobody else.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    /// `UFFD_API`, `_IOWR(0xAA, 0x3F, struct uffdio_api)`, `_IOWR(0xAA, 0x00, struct
    /// uffdio_register)`, `UFFDIO_REGISTER_MODE_MISSING` (`include/uapi/linux/userfaultfd.h`).
    const UFFD_API: u64 = 0xaa;
    const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
    const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
    const MODE_MISSING: u64 = 1;
    let mut api = [UFFD_API, 0u64, 0u64];
    use std::os::fd::AsRawFd;
    // SAFETY: UFFDIO_API reads and writes the 24-byte struct uffdio_api `api` points to.
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, api.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut reg = [addr, len, MODE_MISSING, 0u64];
    // SAFETY: UFFDIO_REGISTER reads and writes the 32-byte struct uffdio_register `reg` points
    // to; the range is the caller's mapping.
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_REGISTER, reg.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Resolves the missing pages of `len` bytes at `addr` with zeros (`UFFDIO_ZEROPAGE`).
#[cfg(test)]
pub fn uffd_zeropage(fd: std::os::fd::BorrowedFd<'_>, addr: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    const UFFDIO_ZEROPAGE: libc::c_ulong = 0xc020_aa04;
    let mut z = [addr, len, 0u64, 0u64];
    // SAFETY: UFFDIO_ZEROPAGE reads and writes the 32-byte struct uffdio_zeropage `z` points
    // to.
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_ZEROPAGE, z.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An anonymous private mapping, unmapped on drop (tests).
#[cfg(test)]
pub struct AnonMap {
    addr: u64,
    len: usize,
}

#[cfg(test)]
impl AnonMap {
    /// Maps `len` bytes; no page is touched.
    pub fn new(len: usize) -> io::Result<Self> {
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses; nothing else is
        // affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            addr: p as u64,
            len,
        })
    }

    /// Its address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
}

#[cfg(test)]
impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours (made by `new`) and nobody holds references into it.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// `pidfd_open(pid, 0)`: a pidfd for a whole process (readable once it has exited), for
/// workers the supervisor started and for those it re-adopts after a restart.
pub fn pidfd_open_process(pid: u32) -> io::Result<std::os::fd::OwnedFd> {
    // The kernel refuses pid 0 with EINVAL; rustix cannot name it.
    let pid = to_pid(pid, libc::EINVAL)?;
    Ok(rustix::process::pidfd_open(
        pid,
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// Sends `sig` to the process of `pidfd` (`pidfd_send_signal`: no pid-reuse race).
pub fn pidfd_send_signal(pidfd: std::os::fd::BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    // Callers send named signals (SIGTERM, SIGKILL); another (a real-time one) is EINVAL.
    let sig = rustix::process::Signal::from_named_raw(sig)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(rustix::process::pidfd_send_signal(pidfd, sig)?)
}

/// Reaps our exited child behind `pidfd` (`waitid(P_PIDFD, WEXITED | WNOHANG)`): its exit
/// code (128 + signal when killed), `None` while it runs, `ECHILD` for a process that is not
/// our child (a re-adopted worker: its parent is init).
pub fn waitid_pidfd(pidfd: std::os::fd::BorrowedFd<'_>) -> io::Result<Option<i32>> {
    use rustix::process::{WaitId, WaitIdOptions, waitid};
    let Some(info) = waitid(
        WaitId::PidFd(pidfd),
        WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
    )?
    else {
        return Ok(None); // nothing has exited yet (a zero pid)
    };
    // si_status: the exit code when it exited, else the signal that ended it.
    let status = info
        .exit_status()
        .or_else(|| info.terminating_signal())
        .unwrap_or(0);
    Ok(Some(if info.exited() { status } else { 128 + status }))
}

/// `fork()` for a process that is single-threaded (ns-exec, before it starts any thread): the
/// child is `Ok(None)`, the parent gets the child's pid.
pub fn fork_single_threaded() -> io::Result<Option<nix::unistd::Pid>> {
    // SAFETY: the callers (ns-exec) run this while the process has exactly one thread, so the
    // child inherits no lock held by another thread; it only makes syscalls and execs or exits.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Child => Ok(None),
        nix::unistd::ForkResult::Parent { child } => Ok(Some(child)),
    }
}
