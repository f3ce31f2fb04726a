//! The socket transport's poll family: `poll`, `ppoll` (and glibc's fortified `__poll_chk`,
//! `__ppoll_chk`), `select`, `pselect` and `epoll_ctl` answer for our opens as the driver's
//! nodes do (an open's fd is a socket, whose own answer, always writable, is not the node's).
//!
//! - `/dev/nvidiactl`, `/dev/nvidia<N>` (`nvidia_poll`, kernel-open/nvidia/nv.c): `POLLPRI |
//!   POLLIN` while an RM event is pending on the open, else nothing; never `POLLOUT`; `POLLHUP`
//!   for a lost GPU. nvproxy does not carry the driver's event wake-ups to the container
//!   (neither transport does), so an open here never has an event pending: nothing is ready
//!   and the caller's timeout runs. The open's socket still takes part in the kernel's wait,
//!   with no events asked, so a hang-up of the worker comes through (`POLLHUP`, as for a lost
//!   GPU). For `select` the fd leaves the write set before the call (the socket is never
//!   readable nor exceptional until a hang-up); for epoll the writable events leave the
//!   registration (a copy; the caller's `epoll_event` is not changed).
//! - `/dev/nvidia-uvm` has no poll in the driver (`uvm_fops`): the kernel answers
//!   `DEFAULT_POLLMASK` (readable and writable at once) for poll and select, so the call does
//!   not wait, and epoll refuses the file (`EPERM`, `file_can_poll`). So does the shim.
//!
//! At most [`TRACKED`] of our fds per call are answered so; further ones are left to the
//! socket's own answer. Same rules as `devshim.rs`: no allocation, no locks, no panics.

use std::ffi::c_int;

use crate::devshim::{Sym, enabled, errno, next, node_of_fd, ret, set_errno};
use crate::proto::socket::DevNode;

/// The most of our fds one call answers for.
const TRACKED: usize = 256;
/// The most entries or fds looked at (the kernel's largest `nr_open`); larger calls go to
/// the kernel as they are (which refuses them).
const MAX_FDS: usize = 1 << 20;

/// What the kernel answers for a file without poll (`DEFAULT_POLLMASK`).
const DEFAULT_POLLMASK: libc::c_short =
    libc::POLLIN | libc::POLLOUT | libc::POLLRDNORM | libc::POLLWRNORM;
/// The events a node's open never reports (the socket's writability).
const EPOLL_WRITABLE: u32 = (libc::EPOLLOUT | libc::EPOLLWRNORM | libc::EPOLLWRBAND) as u32;

type PollFn = unsafe extern "C" fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int;
type PpollFn = unsafe extern "C" fn(
    *mut libc::pollfd,
    libc::nfds_t,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;
type PollChkFn = unsafe extern "C" fn(*mut libc::pollfd, libc::nfds_t, c_int, usize) -> c_int;
type PpollChkFn = unsafe extern "C" fn(
    *mut libc::pollfd,
    libc::nfds_t,
    *const libc::timespec,
    *const libc::sigset_t,
    usize,
) -> c_int;
type SelectFn = unsafe extern "C" fn(
    c_int,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::timeval,
) -> c_int;
type PselectFn = unsafe extern "C" fn(
    c_int,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;
type EpollCtlFn = unsafe extern "C" fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int;

/// The kernel's sigset size for `ppoll`/`pselect6` (`_NSIG / 8`).
const SIGSET_SIZE: usize = 8;

// ---- poll -----------------------------------------------------------------------------------

/// Our entries of one poll call: positions, the caller's events, which are UVM.
struct Muted {
    at: [u32; TRACKED],
    events: [libc::c_short; TRACKED],
    uvm: [bool; TRACKED],
    n: usize,
}

impl Muted {
    const fn new() -> Self {
        Muted {
            at: [0; TRACKED],
            events: [0; TRACKED],
            uvm: [false; TRACKED],
            n: 0,
        }
    }

    /// Asks no events of our entries (saving the caller's); whether a UVM entry is ready at
    /// once (the call must then not wait).
    fn mute(&mut self, entries: &mut [libc::pollfd]) -> bool {
        let mut ready = false;
        // u32 like `at`: the caller's array has at most MAX_FDS = 2^20 entries.
        for (i, p) in (0u32..).zip(entries.iter_mut()) {
            if self.n == TRACKED {
                break;
            }
            let Some(node) = node_of_fd(p.fd) else {
                continue;
            };
            let uvm = node == DevNode::Uvm;
            ready |= uvm && p.events & DEFAULT_POLLMASK != 0;
            self.at[self.n] = i;
            self.events[self.n] = p.events;
            self.uvm[self.n] = uvm;
            self.n += 1;
            p.events = 0;
        }
        ready
    }

    /// Gives the caller's events back and, after a successful call (`r >= 0`), UVM's answer;
    /// the entries that answer made ready beyond the kernel's count.
    fn unmute(&self, entries: &mut [libc::pollfd], r: c_int) -> c_int {
        let mut extra = 0;
        for k in 0..self.n {
            let p = &mut entries[self.at[k] as usize];
            p.events = self.events[k];
            if r >= 0 && self.uvm[k] {
                let counted = p.revents != 0;
                p.revents |= p.events & DEFAULT_POLLMASK;
                if !counted && p.revents != 0 {
                    extra += 1;
                }
            }
        }
        extra
    }
}

/// The shared body of the poll family: `call(no_wait)` makes the caller's call (with a zero
/// timeout when `no_wait`) with our entries muted.
///
/// # Safety
/// `fds` is NULL or points to `nfds` pollfds the caller owns for the call (poll(2)).
unsafe fn muted(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    call: impl FnOnce(bool) -> c_int,
) -> c_int {
    let n = usize::try_from(nfds).unwrap_or(usize::MAX);
    if fds.is_null() || n == 0 || n > MAX_FDS || !enabled() {
        return call(false);
    }
    // SAFETY: the caller's array of `nfds` (= n) entries (this function's contract).
    let entries = unsafe { std::slice::from_raw_parts_mut(fds, n) };
    let mut m = Muted::new();
    let no_wait = m.mute(entries);
    if m.n == 0 {
        return call(false);
    }
    let r = call(no_wait);
    let e = errno();
    let extra = m.unmute(entries, r);
    if r < 0 {
        set_errno(e);
        return r;
    }
    r + extra
}

/// `poll(2)`, interposed: our opens answer as the driver's nodes (see the module's doc).
///
/// # Safety
/// As `poll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's arguments (contract of poll(2)).
    unsafe {
        muted(fds, nfds, |no_wait| {
            let timeout = if no_wait { 0 } else { timeout };
            match next(Sym::Poll) {
                // SAFETY: the address dlsym returned for "poll" (PollFn), the caller's call.
                Some(f) => std::mem::transmute::<usize, PollFn>(f)(fds, nfds, timeout),
                // SAFETY: the caller's own call as the raw syscall.
                None => ret(libc::syscall(libc::SYS_poll, fds, nfds, timeout)),
            }
        })
    }
}

/// A zero timeout.
const NO_WAIT: libc::timespec = libc::timespec {
    tv_sec: 0,
    tv_nsec: 0,
};

/// `ppoll(2)`, interposed as [`poll`].
///
/// # Safety
/// As `ppoll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's arguments (contract of ppoll(2)).
    unsafe {
        muted(fds, nfds, |no_wait| {
            let timeout = if no_wait { &NO_WAIT } else { timeout };
            match next(Sym::Ppoll) {
                // SAFETY: the address dlsym returned for "ppoll" (PpollFn), the caller's call.
                Some(f) => std::mem::transmute::<usize, PpollFn>(f)(fds, nfds, timeout, sigmask),
                // SAFETY: the caller's own call as the raw syscall.
                None => ret(libc::syscall(
                    libc::SYS_ppoll,
                    fds,
                    nfds,
                    timeout,
                    sigmask,
                    SIGSET_SIZE,
                )),
            }
        })
    }
}

/// Whether a fortified call's array (`fdslen` bytes) holds `nfds` entries; when it does not,
/// glibc's check (the next definition) ends the program before the shim reads anything.
fn fits(nfds: libc::nfds_t, fdslen: usize) -> bool {
    (fdslen / size_of::<libc::pollfd>()) as libc::nfds_t >= nfds
}

/// glibc's fortified `poll` (`__poll_chk`), interposed as [`poll`] (glibc's own calls its
/// internal poll, which the shim cannot see).
///
/// # Safety
/// As `poll(2)`, with `fdslen` the size of the array.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
    fdslen: usize,
) -> c_int {
    let real = |timeout: c_int| match next(Sym::PollChk) {
        // SAFETY: the address dlsym returned for "__poll_chk" (PollChkFn), the caller's call.
        Some(f) => unsafe {
            std::mem::transmute::<usize, PollChkFn>(f)(fds, nfds, timeout, fdslen)
        },
        // As glibc's check would (the array is smaller than `nfds` entries).
        None if !fits(nfds, fdslen) => std::process::abort(),
        // SAFETY: the caller's own call as the raw syscall (its size checked just above).
        None => ret(unsafe { libc::syscall(libc::SYS_poll, fds, nfds, timeout) }),
    };
    if !fits(nfds, fdslen) {
        return real(timeout);
    }
    // SAFETY: the caller's arguments; the array holds `nfds` entries (checked above).
    unsafe { muted(fds, nfds, |no_wait| real(if no_wait { 0 } else { timeout })) }
}

/// glibc's fortified `ppoll` (`__ppoll_chk`), interposed as [`ppoll`].
///
/// # Safety
/// As `ppoll(2)`, with `fdslen` the size of the array.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
    fdslen: usize,
) -> c_int {
    let real = |timeout: *const libc::timespec| match next(Sym::PpollChk) {
        // SAFETY: the address dlsym returned for "__ppoll_chk" (PpollChkFn), the caller's call.
        Some(f) => unsafe {
            std::mem::transmute::<usize, PpollChkFn>(f)(fds, nfds, timeout, sigmask, fdslen)
        },
        None if !fits(nfds, fdslen) => std::process::abort(),
        None => {
            // SAFETY: the caller's own call as the raw syscall (its size checked just above).
            ret(unsafe { libc::syscall(libc::SYS_ppoll, fds, nfds, timeout, sigmask, SIGSET_SIZE) })
        }
    };
    if !fits(nfds, fdslen) {
        return real(timeout);
    }
    // SAFETY: the caller's arguments; the array holds `nfds` entries (checked above).
    unsafe {
        muted(fds, nfds, |no_wait| {
            real(if no_wait { &NO_WAIT } else { timeout })
        })
    }
}

// ---- select ---------------------------------------------------------------------------------

/// One bit of an fd set (the kernel's layout: an array of longs, bit `fd % 64` of word
/// `fd / 64`).
struct Bits(*mut libc::fd_set);

impl Bits {
    fn word(&self, w: usize) -> *mut u64 {
        self.0.cast::<u64>().wrapping_add(w)
    }

    /// Word `w`, or 0 without a set.
    ///
    /// # Safety
    /// The set holds at least `w + 1` words (the caller's `nfds` bits, select(2)).
    unsafe fn get_word(&self, w: usize) -> u64 {
        if self.0.is_null() {
            return 0;
        }
        // SAFETY: inside the caller's set (contract).
        unsafe { self.word(w).read_unaligned() }
    }

    /// # Safety
    /// As [`Bits::get_word`] for `fd / 64`.
    unsafe fn has(&self, fd: usize) -> bool {
        // SAFETY: as the contract says.
        let word = unsafe { self.get_word(fd / 64) };
        word & (1 << (fd % 64)) != 0
    }

    /// # Safety
    /// As [`Bits::get_word`] for `fd / 64`.
    unsafe fn set(&self, fd: usize, on: bool) {
        if self.0.is_null() {
            return;
        }
        let p = self.word(fd / 64);
        // SAFETY: inside the caller's set (contract), which it lends to select for writing.
        unsafe {
            let v = p.read_unaligned();
            let bit = 1u64 << (fd % 64);
            p.write_unaligned(if on { v | bit } else { v & !bit });
        }
    }
}

/// Our fds of one select call: which, whether the caller asked them readable and writable,
/// and whether UVM (answered ready by the shim).
struct Selected {
    fd: [u32; TRACKED],
    read: [bool; TRACKED],
    write: [bool; TRACKED],
    uvm: [bool; TRACKED],
    n: usize,
}

/// The shared body of `select`/`pselect`: `call(no_wait)` makes the caller's call (with a
/// zero timeout when `no_wait`) with our fds taken out where the socket's answer is not the
/// node's: the write set for every node (the driver never answers writable), the read and
/// write sets for UVM (set back after the call: always ready).
///
/// # Safety
/// As select(2): each non-NULL set holds `nfds` bits.
unsafe fn selected(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    call: impl FnOnce(bool) -> c_int,
) -> c_int {
    // 0 for a negative nfds.
    let n = usize::try_from(nfds).unwrap_or(0);
    if n == 0 || n > MAX_FDS || (readfds.is_null() && writefds.is_null()) {
        return call(false);
    }
    if !enabled() {
        return call(false);
    }
    let (r, w) = (Bits(readfds), Bits(writefds));
    let mut s = Selected {
        fd: [0; TRACKED],
        read: [false; TRACKED],
        write: [false; TRACKED],
        uvm: [false; TRACKED],
        n: 0,
    };
    let mut no_wait = false;
    'scan: for word in 0..n.div_ceil(64) {
        // SAFETY: word < nfds / 64 rounded up: inside the caller's sets (contract).
        let mut bits = unsafe { r.get_word(word) | w.get_word(word) };
        while bits != 0 {
            let fd = word * 64 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if fd >= n {
                break 'scan;
            }
            if s.n == TRACKED {
                break 'scan;
            }
            // fd < n <= MAX_FDS = 2^20: it fits both.
            let (Ok(fd_int), Ok(fd_u32)) = (c_int::try_from(fd), u32::try_from(fd)) else {
                break 'scan;
            };
            let Some(node) = node_of_fd(fd_int) else {
                continue;
            };
            let uvm = node == DevNode::Uvm;
            // SAFETY: fd < nfds: inside the caller's sets (contract).
            let (in_r, in_w) = unsafe { (r.has(fd), w.has(fd)) };
            if !uvm && !in_w {
                continue;
            }
            s.fd[s.n] = fd_u32;
            s.read[s.n] = in_r;
            s.write[s.n] = in_w;
            s.uvm[s.n] = uvm;
            s.n += 1;
            no_wait |= uvm;
            // SAFETY: as above.
            unsafe {
                w.set(fd, false);
                if uvm {
                    r.set(fd, false);
                }
            }
        }
    }
    if s.n == 0 {
        return call(false);
    }
    let res = call(no_wait);
    let e = errno();
    let mut extra = 0;
    for k in 0..s.n {
        let fd = s.fd[k] as usize;
        // SAFETY: our fds were found below nfds: inside the caller's sets (contract).
        unsafe {
            if res < 0 {
                // The sets as the caller gave them (the kernel writes none on failure).
                if s.uvm[k] {
                    r.set(fd, s.read[k]);
                }
                w.set(fd, s.write[k]);
            } else if s.uvm[k] {
                r.set(fd, s.read[k]);
                w.set(fd, s.write[k]);
                extra += c_int::from(s.read[k]) + c_int::from(s.write[k]);
            }
        }
    }
    if res < 0 {
        set_errno(e);
        return res;
    }
    res + extra
}

/// `select(2)`, interposed: our opens answer as the driver's nodes (see the module's doc).
///
/// # Safety
/// As `select(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn select(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    // SAFETY: the caller's arguments (contract of select(2)).
    unsafe {
        selected(nfds, readfds, writefds, |no_wait| {
            let mut zero = libc::timeval {
                tv_sec: 0,
                tv_usec: 0,
            };
            let timeout = if no_wait { &mut zero } else { timeout };
            match next(Sym::Select) {
                // SAFETY: the address dlsym returned for "select" (SelectFn), the caller's
                // call.
                Some(f) => std::mem::transmute::<usize, SelectFn>(f)(
                    nfds, readfds, writefds, exceptfds, timeout,
                ),
                // SAFETY: the caller's own call as the raw syscall.
                None => ret(libc::syscall(
                    libc::SYS_select,
                    nfds,
                    readfds,
                    writefds,
                    exceptfds,
                    timeout,
                )),
            }
        })
    }
}

/// `pselect(2)`, interposed as [`select`].
///
/// # Safety
/// As `pselect(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's arguments (contract of pselect(2)).
    unsafe {
        selected(nfds, readfds, writefds, |no_wait| {
            let timeout = if no_wait { &NO_WAIT } else { timeout };
            match next(Sym::Pselect) {
                // SAFETY: the address dlsym returned for "pselect" (PselectFn), the caller's
                // call.
                Some(f) => std::mem::transmute::<usize, PselectFn>(f)(
                    nfds, readfds, writefds, exceptfds, timeout, sigmask,
                ),
                None => {
                    // The raw pselect6 takes the mask as {pointer, size}.
                    let mask: [usize; 2] = [sigmask as usize, SIGSET_SIZE];
                    let mask = if sigmask.is_null() {
                        std::ptr::null()
                    } else {
                        mask.as_ptr()
                    };
                    // SAFETY: the caller's own call as the raw syscall; `mask` lives until
                    // it returns.
                    ret(libc::syscall(
                        libc::SYS_pselect6,
                        nfds,
                        readfds,
                        writefds,
                        exceptfds,
                        timeout,
                        mask,
                    ))
                }
            }
        })
    }
}

// ---- epoll ----------------------------------------------------------------------------------

/// `epoll_ctl(2)`, interposed: a node's open is registered without the writable events (the
/// driver never reports them; the socket always would); UVM's is refused with `EPERM`, as
/// the kernel refuses a file without poll.
///
/// # Safety
/// As `epoll_ctl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    event: *mut libc::epoll_event,
) -> c_int {
    let real = |event: *mut libc::epoll_event| match next(Sym::EpollCtl) {
        // SAFETY: the address dlsym returned for "epoll_ctl" (EpollCtlFn), the caller's call.
        Some(f) => unsafe { std::mem::transmute::<usize, EpollCtlFn>(f)(epfd, op, fd, event) },
        // SAFETY: the caller's own call as the raw syscall.
        None => ret(unsafe { libc::syscall(libc::SYS_epoll_ctl, epfd, op, fd, event) }),
    };
    match node_of_fd(fd) {
        None => real(event),
        Some(DevNode::Uvm) => {
            set_errno(libc::EPERM);
            -1
        }
        Some(_) if event.is_null() || op == libc::EPOLL_CTL_DEL => real(event),
        Some(_) => {
            // SAFETY: a non-NULL event points to the caller's epoll_event (contract); it is
            // packed on x86_64, hence the unaligned read.
            let mut ev = unsafe { event.read_unaligned() };
            ev.events &= !EPOLL_WRITABLE;
            real(&mut ev)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_fortified_sizes_are_checked_in_entries() {
        let one = size_of::<libc::pollfd>();
        assert!(fits(2, 2 * one));
        assert!(fits(2, 3 * one - 1));
        assert!(!fits(2, 2 * one - 1));
        assert!(fits(0, 0));
    }

    #[test]
    fn test_fd_set_bits_follow_the_kernels_layout() {
        // SAFETY: fd_set is plain data; all zeroes is an empty set.
        let mut set: libc::fd_set = unsafe { std::mem::zeroed() };
        // SAFETY: FD_SET on a live set, fd below FD_SETSIZE.
        unsafe { libc::FD_SET(70, &mut set) };
        let b = Bits(&mut set);
        // SAFETY: 70 and 3 are below FD_SETSIZE (the set's 1024 bits).
        unsafe {
            assert!(b.has(70));
            assert!(!b.has(3));
            b.set(3, true);
            b.set(70, false);
        }
        // SAFETY: FD_ISSET on a live set.
        assert!(unsafe { libc::FD_ISSET(3, &set) && !libc::FD_ISSET(70, &set) });
        // SAFETY: no set: nothing is read.
        let none = unsafe { Bits(std::ptr::null_mut()).has(3) };
        assert!(!none);
    }

    #[test]
    fn test_with_the_transport_off_other_fds_are_polled_as_asked() {
        // The test binary has no NVPROXY_DEV_SOCKET: every fd is the kernel's.
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&a);
        let mut p = [libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        }];
        // SAFETY: a live array of one pollfd.
        assert_eq!(unsafe { poll(p.as_mut_ptr(), 1, 0) }, 1);
        assert_eq!(p[0].revents, libc::POLLOUT);
        assert_eq!(p[0].events, libc::POLLOUT);
    }
}
