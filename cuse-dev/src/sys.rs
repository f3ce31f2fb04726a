//! The crate's only `unsafe` code: thin wrappers around the few syscalls std does not offer.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
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
