//! The crate's only `unsafe` code: the exported `mmap`/`mmap64`, the real functions behind
//! them, and the syscalls of [`crate::route::Os`].
//!
//! Rules for everything reachable from `mmap`: no allocation (malloc may call mmap), no locks
//! that can block (the caller may be a signal handler, or a thread forked while another held
//! one), no std I/O, no panics (an `extern "C"` fn that panics aborts the process).

use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::cache::{FileKey, NodeCache};
use crate::config::{Begin, Config, SUN_PATH_LEN};
use crate::proto::{
    self, MmapReply, MmapRequest, MmapTicketArgs, NVPROXY_HELLO_MAGIC, NVPROXY_IOC_HELLO,
    NVPROXY_IOC_MMAP_TICKET,
};
use crate::route::{self, Call, Failure, Os, Route, Stat};

static CONFIG: Config = Config::new();
static CACHE: NodeCache = NodeCache::new();

type MmapFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, i64) -> *mut c_void;

/// The two entry points; each resolves its own next definition.
#[derive(Clone, Copy)]
enum Which {
    Mmap = 0,
    Mmap64 = 1,
}

const NAMES: [&CStr; 2] = [c"mmap", c"mmap64"];
/// Resolved next definitions (as addresses; 0 = not yet).
static REAL: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
/// Set while some thread is inside `dlsym` (which may allocate, and so call mmap).
static RESOLVING: AtomicBool = AtomicBool::new(false);

fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e };
}

fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "gettid returns a pid_t, an int"
    )]
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) as i32 };
    tid
}

/// The next `mmap`/`mmap64` after ours, or `None` while it cannot be resolved (re-entry from
/// inside `dlsym`, or no next definition): the caller then makes the raw syscall.
fn next(which: Which) -> Option<MmapFn> {
    let slot = &REAL[which as usize];
    let mut addr = slot.load(Ordering::Acquire);
    if addr == 0 {
        if RESOLVING.swap(true, Ordering::Acquire) {
            return None;
        }
        // SAFETY: dlsym takes a pseudo-handle and a NUL-terminated name (a static C string).
        let sym = unsafe { libc::dlsym(libc::RTLD_NEXT, NAMES[which as usize].as_ptr()) };
        RESOLVING.store(false, Ordering::Release);
        if sym.is_null() {
            return None;
        }
        addr = sym as usize;
        slot.store(addr, Ordering::Release);
    }
    // SAFETY: `addr` is what dlsym returned for "mmap"/"mmap64", a function with exactly the
    // C signature of `MmapFn` (void *(void *, size_t, int, int, int, off_t)).
    Some(unsafe { std::mem::transmute::<usize, MmapFn>(addr) })
}

/// The real mmap.
///
/// # Safety
/// As `mmap(2)`: the caller answers for what the mapping replaces (`MAP_FIXED`).
unsafe fn real_mmap(
    which: Which,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    match next(which) {
        // SAFETY: the next definition of mmap, called with the caller's own arguments, whose
        // validity the caller answers for (this function's contract).
        Some(f) => unsafe { f(addr, len, prot, flags, fd, off) },
        None => {
            // SAFETY: the raw mmap syscall with the caller's arguments (same contract); glibc's
            // syscall() turns a -errno result into -1 and errno.
            let r = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
            if r == -1 {
                libc::MAP_FAILED
            } else {
                r as *mut c_void
            }
        }
    }
}

fn getenv(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv takes a NUL-terminated name and returns NULL or a pointer into the
    // environment. The shim reads it once at start-up and copies what it keeps.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-NULL getenv result is a NUL-terminated string in the environment block.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// The configuration, loading it on first use.
fn config() -> &'static Config {
    match CONFIG.begin(gettid()) {
        Begin::Ready | Begin::Reentered => {}
        Begin::Load => {
            // SAFETY: sysconf takes a constant and returns a long; no memory is involved.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            let debug = getenv(c"NVPROXY_SHIM_DEBUG").is_some_and(|v| !v.is_empty() && v != b"0");
            CONFIG.load(
                getenv(c"NVPROXY_NODES"),
                getenv(c"NVPROXY_SOCKET"),
                usize::try_from(page).unwrap_or(4096),
                debug,
            );
            CONFIG.publish();
        }
    }
    &CONFIG
}

extern "C" fn init() {
    config();
    next(Which::Mmap);
    next(Which::Mmap64);
}

/// Runs [`init`] when the library is loaded, before the program's `main`.
#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

const _: () = assert!(proto::ENV_NODES.len() == 13 && proto::ENV_SOCKET.len() == 14);

/// The syscalls of the decision.
struct Sys;

impl Os for Sys {
    fn fstat(&self, fd: i32) -> Option<Stat> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `st` is a live, writable buffer of sizeof(struct stat); fstat fills it or fails.
        if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
            return None;
        }
        // SAFETY: fstat returned 0, so it initialised the whole struct.
        let st = unsafe { st.assume_init() };
        Some(Stat {
            mode: st.st_mode,
            key: FileKey {
                dev: st.st_dev,
                ino: st.st_ino,
                rdev: st.st_rdev,
            },
        })
    }

    fn hello(&self, fd: i32) -> bool {
        // SAFETY: a by-value ioctl (the argument 0 is not a pointer), sent only to a character
        // device whose number the daemon listed as one of its nodes.
        let r = unsafe { libc::ioctl(fd, NVPROXY_IOC_HELLO as libc::Ioctl, 0 as libc::c_ulong) };
        r == NVPROXY_HELLO_MAGIC
    }

    fn access_mode(&self, fd: i32) -> Result<i32, i32> {
        // SAFETY: F_GETFL takes no argument and returns the file status flags or -1.
        let r = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if r < 0 {
            return Err(errno());
        }
        Ok(r & libc::O_ACCMODE)
    }

    fn ticket(&self, fd: i32, args: &mut MmapTicketArgs) -> Result<(), i32> {
        let p: *mut MmapTicketArgs = args;
        // SAFETY: `p` points to an exclusive, live MmapTicketArgs (repr(C), 40 bytes), the
        // argument this ioctl is defined with; our node reads and writes only those bytes.
        let r = unsafe { libc::ioctl(fd, NVPROXY_IOC_MMAP_TICKET as libc::Ioctl, p) };
        if r < 0 {
            return Err(errno());
        }
        Ok(())
    }

    fn redeem(&self, path: &[u8], ticket: u64) -> Result<(i32, u64), Failure> {
        // SAFETY: socket takes plain integers and returns a new fd or -1.
        let s =
            unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        if s < 0 {
            let e = errno();
            return Err(match e {
                libc::EMFILE | libc::ENFILE | libc::ENOMEM => Failure::new(e, "socket() failed"),
                _ => Failure::new(libc::ENODEV, "socket() failed"),
            });
        }
        let result = exchange(s, path, ticket);
        self.close(s);
        result
    }

    fn close(&self, fd: i32) {
        // SAFETY: `fd` is a descriptor the shim owns (a socket it made or an fd it received).
        unsafe { libc::close(fd) };
    }
}

/// Whether `fd` is one of our CUSE nodes, by the mmap path's rule: a character device whose
/// number the daemon listed that answered `NVPROXY_IOC_HELLO` (once per file identity).
pub(crate) fn is_cuse_node(fd: c_int) -> bool {
    let cfg = config();
    if fd < 0 || !cfg.has_nodes() {
        return false;
    }
    let Some(st) = Sys.fstat(fd) else {
        return false;
    };
    if st.mode & libc::S_IFMT != libc::S_IFCHR || !cfg.is_node(st.key.rdev) {
        return false;
    }
    if !CACHE.contains(st.key) {
        if !Sys.hello(fd) {
            return false;
        }
        CACHE.insert(st.key);
    }
    true
}

/// How long the shim waits for the daemon's reply.
const REPLY_TIMEOUT_S: libc::time_t = 30;

/// `sizeof(struct timeval)` as `setsockopt` takes it.
#[expect(clippy::cast_possible_truncation, reason = "a timeval is 16 bytes")]
const TIMEVAL_LEN: libc::socklen_t = size_of::<libc::timeval>() as libc::socklen_t;

/// Room for the reply's control message: one `int` fd needs CMSG_SPACE(4) = 24 bytes; a few
/// more fds fit, so that a surplus is received (and closed) rather than silently dropped.
const CMSG_BUF_WORDS: usize = 8;

fn exchange(s: c_int, path: &[u8], ticket: u64) -> Result<(i32, u64), Failure> {
    const UNREACHABLE: Failure = Failure::new(
        libc::ENODEV,
        "the nvproxy mmap socket is unreachable (NVPROXY_SOCKET, default /run/nvproxy/mmap.sock)",
    );
    const PROTOCOL: Failure = Failure::new(libc::ENODEV, "malformed reply from the nvproxy daemon");
    let tv = libc::timeval {
        tv_sec: REPLY_TIMEOUT_S,
        tv_usec: 0,
    };
    // SAFETY: `tv` is a live timeval and the length is its size. A failure only loses the
    // timeout.
    unsafe {
        libc::setsockopt(
            s,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            TIMEVAL_LEN,
        )
    };
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = crate::devshim::AF_UNIX_FAMILY;
    if path.len() >= SUN_PATH_LEN {
        return Err(UNREACHABLE);
    }
    for (d, &b) in addr.sun_path.iter_mut().zip(path) {
        *d = b as libc::c_char;
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "at most sizeof(sockaddr_un), 110: path.len() < SUN_PATH_LEN"
    )]
    let len =
        (std::mem::offset_of!(libc::sockaddr_un, sun_path) + path.len() + 1) as libc::socklen_t;
    // SAFETY: `addr` is a live sockaddr_un whose first `len` bytes hold the family and a
    // NUL-terminated path (len < sizeof(sockaddr_un)).
    let r = unsafe { libc::connect(s, (&addr as *const libc::sockaddr_un).cast(), len) };
    if r != 0 {
        return Err(UNREACHABLE);
    }
    let req = MmapRequest { ticket }.encode();
    // SAFETY: `req` is a live buffer of req.len() bytes that send only reads.
    let n = unsafe { libc::send(s, req.as_ptr().cast(), req.len(), libc::MSG_NOSIGNAL) };
    if n != req.len() as isize {
        return Err(UNREACHABLE);
    }

    let mut buf = [0u8; MmapReply::SIZE + 1];
    let mut cbuf = [0u64; CMSG_BUF_WORDS];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&cbuf);
    // SAFETY: `msg` names `iov` (describing `buf`) and `cbuf`, all live and writable for their
    // stated lengths; recvmsg writes only inside them. MSG_CMSG_CLOEXEC marks received fds
    // close-on-exec.
    let n = unsafe { libc::recvmsg(s, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    let mut fds = [-1i32; 8];
    let nfds = received_fds(&msg, &mut fds);
    let close_all = |fds: &[i32]| fds.iter().for_each(|&fd| Sys.close(fd));
    if n == 0 {
        close_all(&fds[..nfds]);
        return Err(Failure::new(
            libc::EACCES,
            "the nvproxy daemon refused the mmap ticket (see its log)",
        ));
    }
    if n < 0 {
        close_all(&fds[..nfds]);
        return Err(UNREACHABLE);
    }
    let reply = if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) == 0 {
        MmapReply::decode(&buf[..n.unsigned_abs()]) // n > 0 here
    } else {
        None
    };
    let Some(reply) = reply else {
        close_all(&fds[..nfds]);
        return Err(PROTOCOL);
    };
    if reply.errno != 0 {
        close_all(&fds[..nfds]);
        return Err(Failure::new(reply.errno, "the driver refused the mapping"));
    }
    if nfds != 1 {
        close_all(&fds[..nfds]);
        return Err(PROTOCOL);
    }
    Ok((fds[0], reply.offset_adjust))
}

/// Collects the fds of the `SCM_RIGHTS` messages in `msg` into `out` (closing any beyond its
/// room); returns how many it stored.
pub(crate) fn received_fds(msg: &libc::msghdr, out: &mut [i32]) -> usize {
    let mut n = 0;
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR reads only msg_control/msg_controllen
    // and returns NULL or a header inside the control buffer.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !c.is_null() {
        // SAFETY: `c` is a non-NULL header inside the control buffer (CMSG_FIRSTHDR/NXTHDR
        // check that a whole header fits).
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN only computes a length.
            let header = unsafe { libc::CMSG_LEN(0) } as usize;
            let count = (h.cmsg_len as usize).saturating_sub(header) / size_of::<c_int>();
            // SAFETY: CMSG_DATA points just past the header, inside the same message.
            let data = unsafe { libc::CMSG_DATA(c) }.cast::<c_int>();
            for i in 0..count {
                // SAFETY: the kernel wrote `count` ints after the header (cmsg_len says so,
                // and MSG_CTRUNC would have shortened cmsg_len to what fits); they may be
                // unaligned, hence read_unaligned.
                let fd = unsafe { data.add(i).read_unaligned() };
                if n < out.len() {
                    out[n] = fd;
                    n += 1;
                } else {
                    Sys.close(fd);
                }
            }
        }
        // SAFETY: `c` is a header of `msg`'s control buffer; CMSG_NXTHDR returns the next one
        // or NULL.
        c = unsafe { libc::CMSG_NXTHDR(msg, c) };
    }
    n
}

/// Writes `nvproxy shim: <why> (errno N)` to stderr with one `write` (no allocation).
fn report(f: &Failure) {
    let mut line = [0u8; 256];
    let mut n = 0;
    let mut put = |bytes: &[u8]| {
        for &b in bytes {
            if n < line.len() {
                line[n] = b;
                n += 1;
            }
        }
    };
    put(b"nvproxy shim: mmap failed: ");
    put(f.why.as_bytes());
    put(b" (errno ");
    let mut digits = [0u8; 10];
    let mut v = f.errno.unsigned_abs();
    let mut d = digits.len();
    loop {
        d -= 1;
        digits[d] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    put(&digits[d..]);
    put(b")\n");
    // SAFETY: `line[..n]` is a live buffer; write only reads it. A failed write is ignored.
    unsafe { libc::write(2, line.as_ptr().cast(), n) };
}

/// The shared body of `mmap` and `mmap64`.
///
/// # Safety
/// As `mmap(2)`.
unsafe fn hook(
    which: Which,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // Anonymous mappings go straight through, before anything else (not even the config).
    if flags & libc::MAP_ANONYMOUS != 0 || fd < 0 {
        // SAFETY: the caller's own call, passed on unchanged (this function's contract).
        return unsafe { real_mmap(which, addr, len, prot, flags, fd, off) };
    }
    let saved = errno();
    // The socket transport: an mmap of one of its opens maps the host fd the worker sends.
    if let Some(target) = crate::devshim::mmap_target(fd, len, prot, flags, off) {
        return match target {
            Ok((host, offset)) => {
                // SAFETY: the caller's call with its fd replaced by the host fd the worker
                // handed over for this very open: same address, length, protection and flags.
                let p = unsafe { real_mmap(which, addr, len, prot, flags, host, offset) };
                let e = if p == libc::MAP_FAILED {
                    errno()
                } else {
                    saved
                };
                Sys.close(host);
                set_errno(e);
                p
            }
            Err(e) => {
                set_errno(e);
                libc::MAP_FAILED
            }
        };
    }
    let cfg = config();
    let call = Call {
        addr: addr as usize,
        len,
        prot,
        flags,
        fd,
        offset: off,
    };
    match route::route(&Sys, cfg, &CACHE, &call) {
        Route::Real => {
            set_errno(saved);
            // SAFETY: the caller's own call, passed on unchanged.
            unsafe { real_mmap(which, addr, len, prot, flags, fd, off) }
        }
        Route::Host { fd: host, offset } => {
            // SAFETY: the caller's call with its fd replaced by the host fd the daemon handed
            // over for this very open file: same address, length, protection and flags, so the
            // caller's contract covers it.
            let p = unsafe { real_mmap(which, addr, len, prot, flags, host, offset) };
            let e = if p == libc::MAP_FAILED {
                errno()
            } else {
                saved
            };
            Sys.close(host);
            if p == libc::MAP_FAILED && cfg.debug() {
                report(&Failure::new(e, "mmap of the host fd failed"));
            }
            set_errno(e);
            p
        }
        Route::Fail(f) => {
            if cfg.debug() {
                report(&f);
            }
            set_errno(f.errno);
            libc::MAP_FAILED
        }
    }
}

/// `mmap(2)`, interposed: mappings of nvproxy's nodes go through the daemon; everything else
/// reaches the next `mmap` unchanged.
///
/// # Safety
/// As `mmap(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: forwarded under the caller's contract.
    unsafe { hook(Which::Mmap, addr, len, prot, flags, fd, off) }
}

/// `mmap64(2)`, interposed like [`mmap`] (the same function on 64-bit targets).
///
/// # Safety
/// As `mmap(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off64_t,
) -> *mut c_void {
    // SAFETY: forwarded under the caller's contract.
    unsafe { hook(Which::Mmap64, addr, len, prot, flags, fd, off) }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The test binary itself links this module, so its own mmaps go through `mmap` above.

    #[test]
    fn test_anonymous_mmap_passes_through() {
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: `p` is the 8 KiB mapping just made.
        assert_eq!(unsafe { libc::munmap(p, 8192) }, 0);
    }

    #[test]
    fn test_file_mmap_errors_keep_the_kernels_errno() {
        // SAFETY: fd 987654 is not open: the call fails without mapping anything.
        let p = unsafe {
            mmap64(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                987_654,
                0,
            )
        };
        assert_eq!((p, errno()), (libc::MAP_FAILED, libc::EBADF));
    }

    #[test]
    fn test_report_formats_without_allocating() {
        // Only checks it does not panic; the line goes to the test's stderr.
        report(&Failure::new(libc::ENODEV, "test"));
    }
}
