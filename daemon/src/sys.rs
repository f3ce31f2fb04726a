//! The daemon's only `unsafe` code: thin wrappers over syscalls that `libc` exposes only raw.

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
    const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new fd or -1; no memory is
    // passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, PIDFD_THREAD) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: `fd` was just returned to us by pidfd_open and is owned by nobody else.
    unsafe { libc::close(fd) };
    Ok(())
}

/// `CAP_SYS_ADMIN` (linux/capability.h): what the NVIDIA driver's `os_is_administrator()`
/// (`NV_IS_SUSER`, `capable(CAP_SYS_ADMIN)`) asks of the calling thread.
pub const CAP_SYS_ADMIN: u32 = 21;

/// `_LINUX_CAPABILITY_VERSION_3` (linux/capability.h): 64-bit sets, as two 32-bit words.
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct` (linux/capability.h).
#[repr(C)]
struct CapUserHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct` (linux/capability.h); version 3 takes two of them
/// (capabilities 0-31, then 32-63).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapUserData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

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

fn capget_thread() -> io::Result<[CapUserData; 2]> {
    let mut hdr = CapUserHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0, // the calling thread
    };
    let mut data = [CapUserData::default(); 2];
    // SAFETY: `hdr` is a live, exclusive `__user_cap_header_struct`; with version 3 the kernel
    // writes exactly two `__user_cap_data_struct`s at `data`, which holds two. Both outlive the
    // call; the kernel keeps no pointer to them.
    let ret = unsafe { libc::syscall(libc::SYS_capget, &raw mut hdr, data.as_mut_ptr()) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(data)
}

/// The calling thread's capabilities (`capget` on this thread; capabilities are per thread).
pub fn thread_caps() -> io::Result<ThreadCaps> {
    let [lo, hi] = capget_thread()?;
    let join = |l: u32, h: u32| u64::from(l) | (u64::from(h) << 32);
    Ok(ThreadCaps {
        effective: join(lo.effective, hi.effective),
        permitted: join(lo.permitted, hi.permitted),
        inheritable: join(lo.inheritable, hi.inheritable),
    })
}

/// Removes `cap` from the calling thread's effective, permitted and inheritable sets and keeps
/// every other capability it has (`capget`, then `capset` on this thread only). Irreversible
/// for the thread and for the threads it starts later: nothing regains a capability that is
/// not in its permitted set short of an `execve` of a privileged file. Read back afterwards:
/// an error unless `cap` is gone from both sets.
pub fn drop_thread_capability(cap: u32) -> io::Result<()> {
    if cap >= 64 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut data = capget_thread()?;
    let word = &mut data[(cap / 32) as usize];
    let bit = !(1u32 << (cap % 32));
    word.effective &= bit;
    word.permitted &= bit;
    word.inheritable &= bit;
    let mut hdr = CapUserHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0, // the calling thread; capset cannot change another
    };
    // SAFETY: `hdr` is a live `__user_cap_header_struct` (the kernel may write the version it
    // prefers back into it, hence exclusive); with version 3 the kernel reads exactly the two
    // `__user_cap_data_struct`s at `data`. Both outlive the call.
    let ret = unsafe { libc::syscall(libc::SYS_capset, &raw mut hdr, data.as_ptr()) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let now = thread_caps()?;
    if now.has_effective(cap) || now.has_permitted(cap) {
        return Err(io::Error::other(format!(
            "capability {cap} still held after capset"
        )));
    }
    Ok(())
}

/// `CAP_SYS_PTRACE` (linux/capability.h): what `pidfd_getfd`, `process_vm_readv/writev` and
/// `/proc/<pid>/maps` of tenant processes of another uid need.
pub const CAP_SYS_PTRACE: u32 = 19;

/// In a freshly forked child, before `execve` (`CommandExt::pre_exec`): becomes `uid`/`gid`
/// (real, effective and saved; the supplementary groups become `[gid]`) while keeping `keep`
/// (one capability) through the `execve`, in the permitted, effective, inheritable and
/// ambient sets; every other capability is gone. Only raw system calls, no allocation: safe
/// between `fork` and `execve` of a multi-threaded parent.
fn become_user_keeping(uid: u32, gid: u32, keep: u32) -> io::Result<()> {
    if keep >= 32 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let check = |ret: libc::c_long| {
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    let groups = [gid];
    // SAFETY: raw system calls with plain integer arguments, except setgroups, which reads
    // exactly one gid_t at `groups` (live for the call) and capset, which reads `hdr` and the two
    // data structs of version 3 (live for the call; the kernel may write its version into `hdr`,
    // hence exclusive). None of them touches other memory of this process.
    unsafe {
        check(libc::syscall(libc::SYS_setgroups, 1, groups.as_ptr()))?;
        check(libc::syscall(libc::SYS_setresgid, gid, gid, gid))?;
        // Keep the permitted set through the uid change (it is cleared otherwise).
        check(libc::syscall(
            libc::SYS_prctl,
            libc::PR_SET_KEEPCAPS,
            1,
            0,
            0,
            0,
        ))?;
        check(libc::syscall(libc::SYS_setresuid, uid, uid, uid))?;
        let bit = 1u32 << keep;
        let data = [
            CapUserData {
                effective: bit,
                permitted: bit,
                inheritable: bit,
            },
            CapUserData::default(),
        ];
        let mut hdr = CapUserHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        check(libc::syscall(libc::SYS_capset, &raw mut hdr, data.as_ptr()))?;
        check(libc::syscall(
            libc::SYS_prctl,
            libc::PR_SET_KEEPCAPS,
            0,
            0,
            0,
            0,
        ))?;
        // Ambient: what survives the execve of our (capability-less) binary.
        check(libc::syscall(
            libc::SYS_prctl,
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_RAISE,
            keep,
            0,
            0,
        ))?;
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
        // SAFETY: F_GETFD reads no memory; it only tells whether `fd` is open.
        if fd < 0 || fds[..i].contains(&fd) || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
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
/// `keep` ([`become_user_keeping`]); both happen in the child between `fork` and `execve`.
pub fn exec_as_user_keeping(
    cmd: &mut std::process::Command,
    fds: Vec<i32>,
    uid: u32,
    gid: u32,
    keep: u32,
) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and execve; it makes raw system calls only
    // (fcntl, setgroups, setresgid/setresuid, prctl, capset) and allocates nothing; `fds` was
    // moved in and is only read.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &fds {
                keep_across_exec(fd)?;
            }
            become_user_keeping(uid, gid, keep)
        });
    }
}

/// In a forked child before `execve`: clears `FD_CLOEXEC` on `fd`, so the new program
/// inherits it. A raw system call only.
fn keep_across_exec(fd: i32) -> io::Result<()> {
    // SAFETY: F_SETFD with an integer argument reads and writes no memory.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's id.
pub fn gettid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    u32::try_from(tid).unwrap_or(0)
}

/// Reads `buf.len()` bytes at `addr` in thread `tid`'s address space. A short read (the range
/// crosses an unmapped page) is reported as `EFAULT`, like the driver's `copy_from_user`.
pub fn process_vm_read(tid: u32, addr: u64, buf: &mut [u8]) -> io::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    let pid = libc::pid_t::try_from(tid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, an exclusive live buffer of exactly iov_len bytes, so the
    // kernel writes only inside it. `remote` is an address in the other process and is never
    // dereferenced here; the kernel checks it and fails with EFAULT.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    match n {
        n if n < 0 => Err(io::Error::last_os_error()),
        n if n as usize == buf.len() => Ok(()),
        _ => Err(io::Error::from_raw_os_error(libc::EFAULT)),
    }
}

/// Writes `data` at `addr` in thread `tid`'s address space; a short write is `EFAULT`.
pub fn process_vm_write(tid: u32, addr: u64, data: &[u8]) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let pid = libc::pid_t::try_from(tid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: `local` describes `data`, a live buffer of iov_len bytes that the kernel only reads
    // (process_vm_writev copies local → remote). `remote` is checked by the kernel.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    match n {
        n if n < 0 => Err(io::Error::last_os_error()),
        n if n as usize == data.len() => Ok(()),
        _ => Err(io::Error::from_raw_os_error(libc::EFAULT)),
    }
}

/// `pidfd_open(tid, PIDFD_THREAD)`: a pidfd for one thread (Linux 6.9+).
pub fn pidfd_open_thread(tid: u32) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;
    let tid = libc::pid_t::try_from(tid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, PIDFD_THREAD) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: `fd` is a new descriptor returned by the kernel; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// `pidfd_getfd(pidfd, targetfd, 0)`: a duplicate of another process's file descriptor.
pub fn pidfd_getfd(
    pidfd: std::os::fd::BorrowedFd<'_>,
    target: i32,
) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: pidfd_getfd takes two fds and flags by value; `pidfd` is borrowed, so it stays open
    // for the call. It returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0u32) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: `fd` is a new descriptor returned by the kernel; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Whether `tid` is a thread of this process (`tgkill(getpid(), tid, 0)` succeeds).
pub fn is_own_thread(tid: u32) -> bool {
    let Ok(tid) = libc::pid_t::try_from(tid) else {
        return false;
    };
    // SAFETY: getpid takes no arguments and cannot fail.
    let pid = unsafe { libc::getpid() };
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

/// Waits up to `timeout` for SIGINT, SIGTERM or SIGHUP (blocked beforehand): the signal, or
/// `None` when the time passed.
pub fn poll_termination(
    timeout: std::time::Duration,
) -> io::Result<Option<nix::sys::signal::Signal>> {
    let mut set = libc_sigset();
    for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `set` is an initialised sigset_t of ours; sigaddset writes into it.
        unsafe { libc::sigaddset(&mut set, s) };
    }
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: sigtimedwait reads `set` and `ts` (ours) and writes no siginfo (NULL).
    let r = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EINTR) => Ok(None),
            _ => Err(e),
        };
    }
    nix::sys::signal::Signal::try_from(r)
        .map(Some)
        .map_err(io::Error::from)
}

fn libc_sigset() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set it is given; zeroed memory is a valid start.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        set
    }
}

/// `sd_notify` with one fd attached (`FDSTORE=1`: systemd keeps it for the next start of the
/// unit). Without `NOTIFY_SOCKET`, nothing.
pub fn sd_notify_with_fd(state: &str, fd: &std::os::fd::OwnedFd) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};
    use std::os::fd::AsRawFd;
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
    let iov = [io::IoSlice::new(state.as_bytes())];
    let fds = [fd.as_raw_fd()];
    sendmsg(
        sock.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
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
    // SAFETY: F_SETFD with an integer argument reads and writes no memory.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return None;
    }
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
            tracing::info!(every_ms = e.as_millis() as u64, "systemd watchdog: pinging");
        }
        Watchdog {
            every,
            last: std::time::Instant::now(),
        }
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
    if let Some(p) = pid {
        if p.trim().parse::<u32>().ok()? != me {
            return None;
        }
    }
    Some(std::time::Duration::from_micros(usec / 2))
}

/// `accept4(listener, SOCK_CLOEXEC)`: the accepted connection (blocking, close-on-exec).
pub fn accept_cloexec(listener: std::os::fd::BorrowedFd<'_>) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: accept4 with NULL address pointers writes no memory; `listener` is borrowed, so it
    // stays open for the call. It returns a new fd or -1.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor returned by the kernel; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Sends `bytes` on the stream socket `sock` with `fd` attached (`SCM_RIGHTS`).
pub fn send_with_fd(
    sock: std::os::fd::RawFd,
    bytes: &[u8],
    fd: std::os::fd::RawFd,
) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let iov = [io::IoSlice::new(bytes)];
    let fds = [fd];
    let n = sendmsg::<()>(
        sock,
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    if n != bytes.len() {
        return Err(io::Error::other("short sendmsg"));
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes from the stream socket `sock` and the fd attached to them,
/// if any (close-on-exec). Returns the byte count (0: the peer closed). A message with more
/// than one fd, or whose fds were cut short, is refused (every fd that came with it closed).
pub fn recv_with_fd(
    sock: std::os::fd::BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<(usize, Option<std::os::fd::OwnedFd>)> {
    let mut msg = crate::fdpass::recv(sock, buf, libc::MSG_CMSG_CLOEXEC)?;
    if msg.fds.len() > 1 {
        return Err(io::Error::other(format!(
            "{} fds attached, at most one expected (closed)",
            msg.fds.len()
        )));
    }
    Ok((msg.bytes, msg.fds.pop()))
}

/// Most fds one [`send_fds`] message carries (the kernel's `SCM_MAX_FD` is 253).
pub const FDS_PER_MESSAGE: usize = 250;

/// Sends one byte on the stream socket `sock` with `fds` attached (at most
/// [`FDS_PER_MESSAGE`]).
pub fn send_fds(sock: std::os::fd::RawFd, fds: &[std::os::fd::RawFd]) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    if fds.len() > FDS_PER_MESSAGE {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let iov = [io::IoSlice::new(b"F")];
    let n = sendmsg::<()>(
        sock,
        &iov,
        &[ControlMessage::ScmRights(fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    if n != 1 {
        return Err(io::Error::other("short sendmsg"));
    }
    Ok(())
}

/// Receives the one byte of a [`send_fds`] message and its fds (close-on-exec); fails when
/// the peer closed, the byte is not ours, the kernel truncated the fds or more than
/// [`FDS_PER_MESSAGE`] came (whatever arrived is closed then).
pub fn recv_fds(sock: std::os::fd::BorrowedFd<'_>) -> io::Result<Vec<std::os::fd::OwnedFd>> {
    let mut byte = [0u8; 1];
    let msg = crate::fdpass::recv(sock, &mut byte, libc::MSG_CMSG_CLOEXEC)?;
    if msg.bytes != 1 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed",
        ));
    }
    if msg.truncated {
        return Err(io::Error::other("fds truncated (fd limit?)"));
    }
    if byte != *b"F" {
        return Err(io::Error::other("not an fd message"));
    }
    if msg.fds.len() > FDS_PER_MESSAGE {
        return Err(io::Error::other(format!(
            "{} fds in one message, at most {FDS_PER_MESSAGE} expected",
            msg.fds.len()
        )));
    }
    Ok(msg.fds)
}

/// `getsockopt(fd, SOL_SOCKET, SO_COOKIE)`: the socket's cookie, unique among the sockets
/// of this boot (`ENOTSOCK` for a file that is not a socket).
pub fn socket_cookie(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    const SO_COOKIE: libc::c_int = 57;
    let mut cookie = 0u64;
    let mut len = size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` are live locals the kernel writes at most `len` (8) bytes into;
    // `fd` is borrowed, so it stays open for the call.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size_of::<u64>() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(cookie)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    // SAFETY: the fd was just returned by userfaultfd and is owned by nobody else.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
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
    use std::os::fd::FromRawFd;
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: `fd` is a new descriptor returned by the kernel; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Sends `sig` to the process of `pidfd` (`pidfd_send_signal`: no pid-reuse race).
pub fn pidfd_send_signal(pidfd: std::os::fd::BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal takes an fd, a signal number, a NULL siginfo and flags 0; no
    // memory is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reaps our exited child behind `pidfd` (`waitid(P_PIDFD, WEXITED | WNOHANG)`): its exit
/// code (128 + signal when killed), `None` while it runs, `ECHILD` for a process that is not
/// our child (a re-adopted worker: its parent is init).
pub fn waitid_pidfd(pidfd: std::os::fd::BorrowedFd<'_>) -> io::Result<Option<i32>> {
    use std::os::fd::AsRawFd;
    const P_PIDFD: libc::idtype_t = 3;
    let mut info: libc::siginfo_t = unsafe_zeroed_siginfo();
    // SAFETY: waitid writes one siginfo_t into `info`, which is ours and large enough.
    let r = unsafe {
        libc::waitid(
            P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after a successful waitid the pid/status fields of `info` are initialised (0 pid
    // when nothing has exited yet, with WNOHANG).
    let (pid, status, code) = unsafe { (info.si_pid(), info.si_status(), info.si_code) };
    if pid == 0 {
        return Ok(None);
    }
    Ok(Some(if code == libc::CLD_EXITED {
        status
    } else {
        128 + status
    }))
}

fn unsafe_zeroed_siginfo() -> libc::siginfo_t {
    // SAFETY: siginfo_t is a plain C struct for which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
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
