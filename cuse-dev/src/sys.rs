//! The crate's only `unsafe` code: thin wrappers around the few syscalls std does not offer.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::Duration;

/// Creates a non-blocking, close-on-exec eventfd with count 0.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; it returns a new fd or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd, is open, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What [`poll2`] saw on its two fds.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ready {
    /// The first fd is readable or in an error/hang-up state (a read will tell which).
    pub(crate) first: bool,
    /// The second fd is readable (or in error).
    pub(crate) second: bool,
}

/// Waits until `a` or `b` is readable (or has an error/hang-up), or the timeout passes
/// (`None`: forever). EINTR comes back as an error of kind `Interrupted`.
pub(crate) fn poll2(
    a: BorrowedFd<'_>,
    b: BorrowedFd<'_>,
    timeout: Option<Duration>,
) -> io::Result<Ready> {
    let mut fds = [
        libc::pollfd {
            fd: a.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = timeout.map_or(-1, |t| i32::try_from(t.as_millis()).unwrap_or(i32::MAX));
    // SAFETY: `fds` is a live, exclusive array of exactly `fds.len()` pollfd entries for the
    // whole call; both fds are borrowed, so they stay open until poll returns.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let hit = |p: &libc::pollfd| p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0;
    Ok(Ready {
        first: hit(&fds[0]),
        second: hit(&fds[1]),
    })
}

/// Creates a connected, close-on-exec `AF_UNIX`/`SOCK_SEQPACKET` pair: message boundaries are
/// kept like on `/dev/cuse`, and closing one end gives the other end end-of-file. Used to speak
/// the protocol to a [`Session`](crate::Session) without a kernel (tests, fuzzing, simulations).
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1i32; 2];
    // SAFETY: `fds` is a live, exclusive array of the two ints socketpair writes.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair succeeded, so both fds are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sets or clears `O_NONBLOCK` on `fd`.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>, nonblocking: bool) -> io::Result<()> {
    // SAFETY: fcntl(F_GETFL) takes no pointers; the fd is borrowed, so it stays open.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let new = if nonblocking {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    if new != flags {
        // SAFETY: as above; F_SETFL takes an int.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, new) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signal that wakes a session thread blocked in `read` on the channel (see
/// [`install_wake_handler`]): `SIGRTMIN + 7`. Real-time signals are never raised by the kernel
/// on its own, and this one is only ever sent to a session's own threads, with `pthread_kill`.
pub(crate) fn wake_signal() -> libc::c_int {
    libc::SIGRTMIN() + 7
}

extern "C" fn wake_handler(_sig: libc::c_int) {}

/// Installs (once per process) a handler that does nothing for [`wake_signal`], *without*
/// `SA_RESTART`, so the signal makes a blocked `read` fail with `EINTR`. Returns the error of
/// the first attempt on every call if it failed.
pub(crate) fn install_wake_handler() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let r = INSTALLED.get_or_init(|| {
        // SAFETY: `sigaction` is plain data; zeroed is a valid value (empty mask, no flags),
        // and every field the kernel reads is set below.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = wake_handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
        act.sa_flags = 0;
        // SAFETY: `act.sa_mask` is a live sigset_t owned by `act`.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: `act` is a valid, initialised sigaction for the whole call; the old action
        // is not asked for (null). The handler is async-signal-safe (it does nothing).
        let rc = unsafe { libc::sigaction(wake_signal(), &act, std::ptr::null_mut()) };
        if rc < 0 {
            Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL))
        } else {
            Ok(())
        }
    });
    r.map_err(io::Error::from_raw_os_error)
}

/// Unblocks [`wake_signal`] for the calling thread (threads inherit their creator's mask, and
/// a program may block signals in its main thread before starting sessions).
pub(crate) fn unblock_wake_signal() -> io::Result<()> {
    // SAFETY: `set` is a live sigset_t for the whole block; it is initialised by sigemptyset
    // before use; pthread_sigmask is not asked for the old mask (null).
    let rc = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, wake_signal());
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// A session thread, to be woken with [`wake_signal`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct ThreadHandle(libc::pthread_t);

impl ThreadHandle {
    /// The calling thread.
    pub(crate) fn current() -> Self {
        // SAFETY: pthread_self has no preconditions.
        ThreadHandle(unsafe { libc::pthread_self() })
    }

    /// Sends [`wake_signal`] to the thread. The caller must know that the thread has not
    /// exited: the session only signals threads that are registered in its pool, under the
    /// pool lock, and a thread unregisters itself under that lock before it returns.
    pub(crate) fn wake(self) {
        // SAFETY: per the contract above, `self.0` names a live thread of this process, so
        // pthread_kill does not touch a freed thread descriptor.
        let rc = unsafe { libc::pthread_kill(self.0, wake_signal()) };
        if rc != 0 {
            tracing::warn!(errno = rc, "cannot wake a session thread");
        }
    }
}

/// `read(2)` of `fd` into `buf`, by its syscall number. libc's `read` is a thread-cancellation
/// point: in a process with threads it brackets the syscall with two calls that switch
/// asynchronous cancellation on and off, about 70 instructions per read, a tenth of what a
/// serving thread spends on a request outside its handler. The crate cancels no thread; a
/// signal still interrupts the read (EINTR), as the session's wake-ups need.
pub(crate) fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole call and `fd` is
    // open for its duration (borrowed); the kernel writes at most that many bytes.
    let n = unsafe { libc::syscall(libc::SYS_read, fd.as_raw_fd(), buf.as_mut_ptr(), buf.len()) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `writev(2)` of `slices` to `fd`, by its syscall number, for the reason [`read`] gives.
pub(crate) fn writev(fd: BorrowedFd<'_>, slices: &[io::IoSlice<'_>]) -> io::Result<usize> {
    let count = libc::c_int::try_from(slices.len())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `IoSlice` is ABI-compatible with `struct iovec` (std guarantees it on Unix);
    // each slice and the array outlive the call, `fd` is open for its duration (borrowed),
    // and the kernel only reads them.
    let n = unsafe {
        libc::syscall(
            libc::SYS_writev,
            fd.as_raw_fd(),
            slices.as_ptr().cast::<libc::iovec>(),
            count,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `CLOCK_MONOTONIC` in nanoseconds (the clock `Instant` reads), without `Instant`'s
/// `Duration` arithmetic: the watchdog stamps every client-memory syscall with it.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer; CLOCK_MONOTONIC
    // cannot fail on Linux (a failure would leave it zero, read as "not armed" downstream).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}
