//! The socket transport's half of the shim: with `NVPROXY_DEV_SOCKET` set (the container has no
//! NVIDIA device nodes), `open`, `fopen`, `stat`, `statx`, `access`, `ioctl`, `poll` (with
//! `select` and epoll, `devpoll.rs`) and `mmap` of `/dev/nvidiactl`, `/dev/nvidia<N>` and
//! `/dev/nvidia-uvm` are served by the instance's worker (protocol: `preload-proto`'s `socket`
//! module; the worker checks everything, the shim is a convenience, never a boundary).
//!
//! - Paths: `/dev/<node>` exactly, or any path (relative, through `dirfd`, with `.`, `..`,
//!   repeated slashes, a symlinked directory) whose last component is a node's name and whose
//!   directory the kernel resolves to `/dev` ([`node_at`]; only such names cost a syscall).
//! - `open`/`openat` (and glibc's fortified `__open_2` family): a connection to the device
//!   socket and an open request; the fd returned is the open's own socket (so `dup`, `fork`,
//!   `close` are the kernel's and need no interposing). `fopen`/`fopen64` open the node so and
//!   wrap the fd (`fdopen`), `freopen`/`freopen64` put it under the stream's fd: glibc's own
//!   open theirs with internal calls the shim cannot see.
//! - `stat` family, `statx` and `access` family of a node path: a character device `0666` with
//!   the driver's numbers (`195:255`, `195:N`), as the driver's nodes look; `fstat`,
//!   `fstatat`/`statx` with `AT_EMPTY_PATH` of an open's fd the same.
//! - `ioctl`/`mmap` on an open's fd: one request on the calling thread's channel for that open
//!   and one answer back (`channel.rs`).
//!
//! Our fds are recognised by `fstat` (a socket) and the abstract name the worker bound its end to
//! (`getpeername`), cached by socket inode (`cache.rs`). Everything else goes to the next
//! definition unchanged (or, where `dlsym` finds none, the raw syscall). Without
//! `NVPROXY_DEV_SOCKET` every function passes straight through.
//!
//! Same rules as `shim.rs`: no allocation, no blocking locks, no std I/O, no panics; the shim's
//! own syscalls are raw (`libc::syscall`) or functions it does not interpose, never its own
//! exports.

use std::ffi::{CStr, c_char, c_int, c_ulong, c_void};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering};

use crate::cache::{FileKey, NodeCache};
use crate::config::SUN_PATH_LEN;
use crate::proto::socket::{
    CallOp, DEFAULT_UVM_MAJOR, DevNode, ENV_DEV_GPUS, ENV_DEV_SOCKET, ENV_DEV_UVM_MAJOR,
    OPEN_PEER_PREFIX, OpenReply, OpenRequest, node_of_peer_name,
};

struct DevConfig {
    state: AtomicU8,
    enabled: AtomicBool,
    path: [AtomicU8; SUN_PATH_LEN],
    len: AtomicUsize,
    gpus: AtomicU32,
    /// The major `/dev/nvidia-uvm` shows (the driver's is dynamic).
    uvm_major: AtomicU32,
}

static DEV: DevConfig = DevConfig {
    state: AtomicU8::new(0),
    enabled: AtomicBool::new(false),
    path: [const { AtomicU8::new(0) }; SUN_PATH_LEN],
    len: AtomicUsize::new(0),
    gpus: AtomicU32::new(0),
    uvm_major: AtomicU32::new(DEFAULT_UVM_MAJOR),
};

/// Our sockets: `(st_dev, st_ino)` → node code.
static SOCKETS: NodeCache = NodeCache::new();

pub(crate) fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() }
}

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e };
}

fn getenv(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv takes a NUL-terminated name and returns NULL or a pointer into the
    // environment, read once here.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-NULL getenv result is a NUL-terminated string in the environment block.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// The thread loading the configuration (to recognise a re-entry from it, e.g. a signal
/// handler that opens a file while it reads the environment).
static LOADER: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

fn gettid() -> i32 {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "gettid returns a pid_t, an int"
    )]
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) as i32 };
    tid
}

/// Whether the socket transport is on (loading the configuration on first use). While another
/// thread loads it (a few getenv calls) this waits; a re-entry from the loading thread, or a
/// wait that does not end (a fork while another thread loaded), answers "off" for that call.
pub(crate) fn enabled() -> bool {
    if DEV.state.load(Ordering::Acquire) == 2 {
        return DEV.enabled.load(Ordering::Relaxed);
    }
    let mut spins = 0u32;
    loop {
        match DEV
            .state
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Acquire)
        {
            Ok(_) => {
                LOADER.store(gettid(), Ordering::Relaxed);
                load();
                DEV.state.store(2, Ordering::Release);
                break;
            }
            Err(2) => break,
            Err(_) => {
                spins += 1;
                if LOADER.load(Ordering::Relaxed) == gettid() || spins > 1 << 24 {
                    return false;
                }
                std::hint::spin_loop();
            }
        }
    }
    DEV.enabled.load(Ordering::Relaxed)
}

fn load() {
    const _: () = assert!(
        ENV_DEV_SOCKET.len() == 18 && ENV_DEV_GPUS.len() == 16 && ENV_DEV_UVM_MAJOR.len() == 21
    );
    let Some(path) = getenv(c"NVPROXY_DEV_SOCKET") else {
        return;
    };
    if path.first() != Some(&b'/') || path.contains(&0) || path.len() >= SUN_PATH_LEN {
        return;
    }
    for (slot, &b) in DEV.path.iter().zip(path) {
        slot.store(b, Ordering::Relaxed);
    }
    DEV.len.store(path.len(), Ordering::Relaxed);
    let number = |v: &[u8], digits: usize| {
        if v.is_empty() || v.len() > digits || !v.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(v.iter().fold(0u32, |a, d| a * 10 + u32::from(d - b'0')))
    };
    let gpus = getenv(c"NVPROXY_DEV_GPUS")
        .and_then(|v| number(v, 3))
        .unwrap_or(0);
    DEV.gpus.store(gpus, Ordering::Relaxed);
    if let Some(m) = getenv(c"NVPROXY_DEV_UVM_MAJOR").and_then(|v| number(v, 4)) {
        DEV.uvm_major.store(m, Ordering::Relaxed);
    }
    DEV.enabled.store(true, Ordering::Relaxed);
}

extern "C" fn init() {
    enabled();
}

/// Loads the configuration when the library is loaded, before the program's `main`.
#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

/// Whether the instance has `node`.
fn exists(node: DevNode) -> bool {
    match node {
        DevNode::Gpu(n) => n < DEV.gpus.load(Ordering::Relaxed),
        DevNode::Ctl | DevNode::Uvm => true,
    }
}

/// The node `path` names relative to `dirfd`, when the transport is on: `/dev/<node>` at once
/// (no syscall); any other path whose last component is a node's name when the kernel resolves
/// its directory to `/dev` (relative paths, `dirfd`, `.`, `..`, repeated slashes, symlinked
/// directories). Every other path costs nothing but a look at its last component.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
pub(crate) unsafe fn node_at(dirfd: c_int, path: *const c_char) -> Option<DevNode> {
    if path.is_null() || !enabled() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated (this function's contract).
    let path = unsafe { CStr::from_ptr(path) }.to_bytes();
    if let Some(node) = DevNode::from_path(path) {
        return Some(node);
    }
    let (dir, name) = match path.iter().rposition(|&c| c == b'/') {
        Some(0) => (&b"/"[..], &path[1..]),
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&b"."[..], path),
    };
    let node = DevNode::from_name(name)?;
    in_dev(dirfd, dir).then_some(node)
}

/// The longest path the kernel resolves, with its NUL (`PATH_MAX`).
const PATH_MAX: usize = 4096;

/// `AF_UNIX` as `sun_family` holds it.
#[expect(clippy::cast_possible_truncation, reason = "AF_UNIX is 1")]
pub(crate) const AF_UNIX_FAMILY: libc::sa_family_t = libc::AF_UNIX as libc::sa_family_t;

/// `sizeof(struct sockaddr_un)` as the socket calls take it.
#[expect(clippy::cast_possible_truncation, reason = "110 bytes")]
const SOCKADDR_UN_LEN: libc::socklen_t = size_of::<libc::sockaddr_un>() as libc::socklen_t;

/// `sizeof(int)` as `CMSG_SPACE` and `CMSG_LEN` take it.
#[expect(clippy::cast_possible_truncation, reason = "4 bytes")]
const INT_LEN: u32 = size_of::<c_int>() as u32;

/// Whether directory `dir` (relative to `dirfd`) is `/dev`, as the kernel resolves both (same
/// `st_dev` and `st_ino`; raw `newfstatat`, following symlinks).
#[inline(never)]
fn in_dev(dirfd: c_int, dir: &[u8]) -> bool {
    if dir.len() >= PATH_MAX {
        return false;
    }
    let mut buf = [0u8; PATH_MAX];
    buf[..dir.len()].copy_from_slice(dir);
    let identity = |at: c_int, p: *const c_char| {
        // SAFETY: `struct stat` is plain data; all zeroes is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `p` is NUL-terminated (a local buffer with a NUL after `dir`, or a static C
        // string); the kernel writes at most sizeof(struct stat) into `st`, a live local.
        let r = unsafe { libc::syscall(libc::SYS_newfstatat, at, p, &mut st, 0) };
        (r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFDIR).then_some((st.st_dev, st.st_ino))
    };
    match identity(dirfd, buf.as_ptr().cast()) {
        Some(d) => identity(libc::AT_FDCWD, c"/dev".as_ptr()) == Some(d),
        None => false,
    }
}

/// What `stat` shows for a node: a character device 0666 with the driver's numbers.
fn fake_stat(node: DevNode) -> libc::stat {
    // SAFETY: `struct stat` is plain data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    st.st_mode = libc::S_IFCHR | 0o666;
    st.st_rdev = node.rdev(DEV.uvm_major.load(Ordering::Relaxed));
    st.st_nlink = 1;
    st.st_ino = node.code();
    st.st_dev = crate::proto::makedev(0, 6);
    st.st_blksize = 4096;
    st
}

/// What `statx` shows for a node: [`fake_stat`]'s fields.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "fake_stat's blksize, nlink and mode are small constants"
)]
fn fake_statx(node: DevNode) -> libc::statx {
    let st = fake_stat(node);
    // SAFETY: `struct statx` is plain data; all zeroes is a valid value.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    sx.stx_mask = libc::STATX_BASIC_STATS;
    sx.stx_blksize = st.st_blksize as u32;
    sx.stx_nlink = st.st_nlink as u32;
    sx.stx_mode = st.st_mode as u16;
    sx.stx_ino = st.st_ino;
    sx.stx_rdev_major = crate::proto::major(st.st_rdev);
    sx.stx_rdev_minor = crate::proto::minor(st.st_rdev);
    sx.stx_dev_major = crate::proto::major(st.st_dev);
    sx.stx_dev_minor = crate::proto::minor(st.st_dev);
    sx
}

/// Writes the node's stat into `buf` (the caller's `struct stat`): 0, or -1 with ENOENT when
/// the instance lacks it.
///
/// # Safety
/// `buf` is NULL or points to a writable `struct stat`.
unsafe fn stat_node(node: DevNode, buf: *mut libc::stat) -> c_int {
    if !exists(node) {
        set_errno(libc::ENOENT);
        return -1;
    }
    if buf.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: `buf` points to a writable struct stat (contract).
    unsafe { buf.write(fake_stat(node)) };
    0
}

/// The node of one of our open's sockets, or `None` (any other fd: the caller then does what it
/// would have done).
pub(crate) fn node_of_fd(fd: c_int) -> Option<DevNode> {
    open_of_fd(fd).map(|(node, _)| node)
}

/// The node of one of our open's sockets and the socket's `(st_dev, st_ino)`, or `None`.
pub(crate) fn open_of_fd(fd: c_int) -> Option<(DevNode, (u64, u64))> {
    if fd < 0 || !enabled() {
        return None;
    }
    // SAFETY: `struct stat` is plain data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the raw fstat syscall writes at most sizeof(struct stat) into `st`, a live local.
    let r = unsafe { libc::syscall(libc::SYS_fstat, fd, &mut st as *mut libc::stat) };
    if r != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return None;
    }
    let key = (st.st_dev, st.st_ino);
    if let Some(code) = SOCKETS.find(st.st_dev, st.st_ino) {
        return DevNode::from_code(code).map(|n| (n, key));
    }
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = SOCKADDR_UN_LEN;
    // SAFETY: getpeername writes at most `len` bytes into `addr`, a live local, and the length
    // into `len`. It is not interposed by the shim.
    let r =
        unsafe { libc::getpeername(fd, (&mut addr as *mut libc::sockaddr_un).cast(), &mut len) };
    let path_at = std::mem::offset_of!(libc::sockaddr_un, sun_path);
    if r != 0 || addr.sun_family != AF_UNIX_FAMILY || (len as usize) <= path_at {
        return None;
    }
    let n = (len as usize - path_at).min(SUN_PATH_LEN);
    let mut name = [0u8; SUN_PATH_LEN];
    for (d, &s) in name.iter_mut().zip(&addr.sun_path[..n]) {
        *d = s.to_ne_bytes()[0];
    }
    if !name[..n].starts_with(OPEN_PEER_PREFIX) {
        return None;
    }
    let node = node_of_peer_name(&name[..n])?;
    SOCKETS.insert(FileKey {
        dev: st.st_dev,
        ino: st.st_ino,
        rdev: node.code(),
    });
    Some((node, key))
}

pub(crate) fn close(fd: c_int) {
    // SAFETY: `fd` is a descriptor the shim owns (a socket it made or an fd it received).
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// Receives one message on `s` into `buf`: its length and the fds attached (at most one kept;
/// surplus fds are closed). `Err(errno)` on failure; length 0 with no fd is the peer's close.
pub(crate) fn receive(
    s: c_int,
    buf: &mut [u8],
    flags: c_int,
) -> Result<(usize, Option<c_int>, bool), c_int> {
    let mut cbuf = [0u64; 8];
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
    let n = loop {
        // SAFETY: `msg` names `iov` (describing `buf`) and `cbuf`, all live and writable for
        // their stated lengths; recvmsg writes only inside them.
        let n = unsafe { libc::recvmsg(s, &mut msg, flags) };
        if n >= 0 || errno() != libc::EINTR {
            break n;
        }
    };
    let mut fds = [-1i32; 8];
    let nfds = crate::shim::received_fds(&msg, &mut fds);
    if n < 0 {
        let e = errno();
        fds[..nfds].iter().for_each(|&fd| close(fd));
        return Err(e);
    }
    fds[1..nfds.max(1)].iter().for_each(|&fd| close(fd));
    let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    // n >= 0 here.
    Ok((n.unsigned_abs(), (nfds > 0).then_some(fds[0]), truncated))
}

/// Sends `bytes` on `s` with `fd` attached (if any).
pub(crate) fn send(s: c_int, bytes: &[u8], fd: Option<c_int>) -> Result<(), c_int> {
    let mut cbuf = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE only computes a length.
        let space = unsafe { libc::CMSG_SPACE(INT_LEN) } as usize;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer (32 bytes, 8-aligned) holds one header with one int
        // (CMSG_SPACE(4) = 24); CMSG_FIRSTHDR returns its start.
        let c = unsafe { &mut *libc::CMSG_FIRSTHDR(&msg) };
        c.cmsg_level = libc::SOL_SOCKET;
        c.cmsg_type = libc::SCM_RIGHTS;
        // SAFETY: CMSG_LEN only computes a length.
        c.cmsg_len = unsafe { libc::CMSG_LEN(INT_LEN) } as usize;
        // SAFETY: CMSG_DATA points just past the header, inside the control buffer, with room
        // for one int; it may be unaligned, hence write_unaligned.
        unsafe { libc::CMSG_DATA(c).cast::<c_int>().write_unaligned(fd) };
    }
    loop {
        // SAFETY: `msg` names `iov` (describing `bytes`, which sendmsg only reads) and, when
        // set, the control buffer built above.
        let n = unsafe { libc::sendmsg(s, &msg, libc::MSG_NOSIGNAL) };
        if n == bytes.len() as isize {
            return Ok(());
        }
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        return Err(if n < 0 { errno() } else { libc::EIO });
    }
}

/// Opens `node` through the device socket: the open's fd, or the errno.
pub(crate) fn dev_open(node: DevNode, flags: c_int) -> Result<c_int, c_int> {
    if !exists(node) {
        return Err(libc::ENOENT);
    }
    // The kernel's answers for an existing character device, before the driver is asked.
    if flags & (libc::O_CREAT | libc::O_EXCL) == libc::O_CREAT | libc::O_EXCL {
        return Err(libc::EEXIST);
    }
    if flags & libc::O_DIRECTORY != 0 {
        return Err(libc::ENOTDIR);
    }
    // SAFETY: socket takes plain integers and returns a new fd or -1.
    let s = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(errno());
    }
    let r = open_over(s, node, flags);
    close(s);
    r
}

fn open_over(s: c_int, node: DevNode, flags: c_int) -> Result<c_int, c_int> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = AF_UNIX_FAMILY;
    let len = DEV.len.load(Ordering::Relaxed);
    for (d, s) in addr.sun_path.iter_mut().zip(&DEV.path[..len]) {
        *d = s.load(Ordering::Relaxed) as c_char;
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "at most sizeof(sockaddr_un): len < sizeof(sun_path)"
    )]
    let alen = (std::mem::offset_of!(libc::sockaddr_un, sun_path) + len + 1) as libc::socklen_t;
    // SAFETY: `addr` is a live sockaddr_un whose first `alen` bytes hold the family and a
    // NUL-terminated path (len < sizeof(sun_path)).
    let r = unsafe { libc::connect(s, (&addr as *const libc::sockaddr_un).cast(), alen) };
    if r != 0 {
        // No worker behind the socket: as if the node did not exist.
        return Err(libc::ENOENT);
    }
    send(s, &OpenRequest { node, flags }.encode(), None).map_err(|_| libc::ENOENT)?;
    let mut buf = [0u8; OpenReply::SIZE + 1];
    let rflags = if flags & libc::O_CLOEXEC != 0 {
        libc::MSG_CMSG_CLOEXEC
    } else {
        0
    };
    let (n, fd, truncated) = receive(s, &mut buf, rflags).map_err(|_| libc::ENOENT)?;
    let reply = if truncated {
        None
    } else {
        OpenReply::decode(&buf[..n])
    };
    match (reply, fd) {
        (Some(OpenReply { errno: 0 }), Some(fd)) => Ok(fd),
        (Some(OpenReply { errno }), None) if errno != 0 => Err(errno),
        (_, fd) => {
            if let Some(fd) = fd {
                close(fd);
            }
            Err(libc::EIO)
        }
    }
}

/// For `shim.rs`'s mmap: `None` when `fd` is not one of our opens; else the host fd and offset
/// to map, or the errno.
pub(crate) fn mmap_target(
    fd: c_int,
    len: usize,
    prot: c_int,
    flags: c_int,
    offset: i64,
) -> Option<Result<(c_int, i64), c_int>> {
    let (_, key) = open_of_fd(fd)?;
    let op = CallOp::Mmap {
        len: len as u64,
        prot,
        flags,
        offset,
    };
    Some(match crate::channel::call(fd, key, op) {
        Ok((r, _)) if r.errno != 0 => Err(r.errno),
        Ok((r, Some(host))) => match i64::try_from(r.offset_adjust)
            .ok()
            .and_then(|a| offset.checked_add(a))
        {
            Some(off) => Ok((host, off)),
            None => {
                close(host);
                Err(libc::EOVERFLOW)
            }
        },
        Ok((_, None)) => Err(libc::EIO),
        Err(e) => Err(e),
    })
}

// ---- next definitions -------------------------------------------------------------------

#[derive(Clone, Copy)]
pub(crate) enum Sym {
    Open,
    Open64,
    Openat,
    Openat64,
    Ioctl,
    Poll,
    Access,
    Faccessat,
    Euidaccess,
    Statx,
    Fopen,
    Fopen64,
    Freopen,
    Freopen64,
    Ppoll,
    PollChk,
    PpollChk,
    Select,
    Pselect,
    EpollCtl,
}

const NAMES: [&CStr; 20] = [
    c"open",
    c"open64",
    c"openat",
    c"openat64",
    c"ioctl",
    c"poll",
    c"access",
    c"faccessat",
    c"euidaccess",
    c"statx",
    c"fopen",
    c"fopen64",
    c"freopen",
    c"freopen64",
    c"ppoll",
    c"__poll_chk",
    c"__ppoll_chk",
    c"select",
    c"pselect",
    c"epoll_ctl",
];
static NEXT: [AtomicUsize; NAMES.len()] = [const { AtomicUsize::new(0) }; NAMES.len()];

/// The next definition of `sym` (as an address), or `None` when `dlsym` finds none.
pub(crate) fn next(sym: Sym) -> Option<usize> {
    let slot = &NEXT[sym as usize];
    let addr = slot.load(Ordering::Acquire);
    if addr != 0 {
        return Some(addr);
    }
    // SAFETY: dlsym takes a pseudo-handle and a NUL-terminated name (a static C string).
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, NAMES[sym as usize].as_ptr()) };
    if p.is_null() {
        return None;
    }
    slot.store(p as usize, Ordering::Release);
    Some(p as usize)
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, libc::mode_t) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, libc::mode_t) -> c_int;
type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;
type AccessFn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type StatxFn =
    unsafe extern "C" fn(c_int, *const c_char, c_int, libc::c_uint, *mut libc::statx) -> c_int;
type FopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;
type FreopenFn =
    unsafe extern "C" fn(*const c_char, *const c_char, *mut libc::FILE) -> *mut libc::FILE;
type FaccessatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_int) -> c_int;

/// A raw syscall's result as libc returns it (`syscall()` already sets errno).
#[expect(
    clippy::cast_possible_truncation,
    reason = "only for syscalls whose result is an int (open, stat, poll, ioctl, ...)"
)]
pub(crate) fn ret(r: libc::c_long) -> c_int {
    r as c_int
}

// ---- open -------------------------------------------------------------------------------

/// The shared body of the open family: ours for a node path, else `other()`.
///
/// # Safety
/// `path` is NULL or NUL-terminated; `other` makes the caller's own call.
unsafe fn open_or(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    other: impl FnOnce() -> c_int,
) -> c_int {
    // SAFETY: `path` as the caller passed it (contract).
    match unsafe { node_at(dirfd, path) } {
        None => other(),
        Some(node) => match dev_open(node, flags) {
            Ok(fd) => fd,
            Err(e) => {
                set_errno(e);
                -1
            }
        },
    }
}

macro_rules! export_open {
    ($name:ident, $sym:expr) => {
        /// `open(2)`, interposed: the nodes' paths go to the socket transport.
        ///
        /// # Safety
        /// As `open(2)`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            path: *const c_char,
            flags: c_int,
            mode: libc::mode_t,
        ) -> c_int {
            // SAFETY: the caller's arguments, passed on (contract of open(2)).
            unsafe {
                open_or(libc::AT_FDCWD, path, flags, || match next($sym) {
                    // SAFETY: the address dlsym returned for this open variant, whose C
                    // signature is OpenFn (the mode is read only with O_CREAT/O_TMPFILE).
                    Some(f) => std::mem::transmute::<usize, OpenFn>(f)(path, flags, mode),
                    None => ret(libc::syscall(
                        libc::SYS_openat,
                        libc::AT_FDCWD,
                        path,
                        flags,
                        mode,
                    )),
                })
            }
        }
    };
}

macro_rules! export_openat {
    ($name:ident, $sym:expr) => {
        /// `openat(2)`, interposed: the nodes' paths (relative to `dirfd` too) go to the
        /// socket transport.
        ///
        /// # Safety
        /// As `openat(2)`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dirfd: c_int,
            path: *const c_char,
            flags: c_int,
            mode: libc::mode_t,
        ) -> c_int {
            // SAFETY: the caller's arguments, passed on (contract of openat(2)).
            unsafe {
                open_or(dirfd, path, flags, || match next($sym) {
                    // SAFETY: the address dlsym returned for this openat variant, whose C
                    // signature is OpenatFn.
                    Some(f) => std::mem::transmute::<usize, OpenatFn>(f)(dirfd, path, flags, mode),
                    None => ret(libc::syscall(libc::SYS_openat, dirfd, path, flags, mode)),
                })
            }
        }
    };
}

export_open!(open, Sym::Open);
export_open!(open64, Sym::Open64);
export_openat!(openat, Sym::Openat);
export_openat!(openat64, Sym::Openat64);

/// `__open_2` (fortified `open` without a mode), interposed as [`open`].
///
/// # Safety
/// As `open(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded under the caller's contract (no O_CREAT: no mode).
    unsafe { open(path, flags, 0) }
}

/// `__open64_2`, interposed as [`open64`].
///
/// # Safety
/// As `open(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    unsafe { open64(path, flags, 0) }
}

/// `__openat_2`, interposed as [`openat`].
///
/// # Safety
/// As `openat(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    unsafe { openat(dirfd, path, flags, 0) }
}

/// `__openat64_2`, interposed as [`openat64`].
///
/// # Safety
/// As `openat(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    unsafe { openat64(dirfd, path, flags, 0) }
}

// ---- stat and access ----------------------------------------------------------------------

/// The stat family's shared body: the node's stat for a node path, else the raw
/// `newfstatat(dirfd, path, buf, flag)` (what glibc's wrappers make on x86_64).
///
/// # Safety
/// As `fstatat(2)`.
unsafe fn stat_path(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flag: c_int) -> c_int {
    // SAFETY: `path` as the caller passed it.
    match unsafe { node_at(dirfd, path) } {
        // SAFETY: `buf` as the caller passed it.
        Some(node) => unsafe { stat_node(node, buf) },
        // SAFETY: the caller's own call as the raw syscall; the kernel checks the pointers.
        None => ret(unsafe { libc::syscall(libc::SYS_newfstatat, dirfd, path, buf, flag) }),
    }
}

/// `fstat`'s shared body: the node's stat for one of our opens, else the raw `fstat`.
///
/// # Safety
/// As `fstat(2)`.
unsafe fn stat_fd(fd: c_int, buf: *mut libc::stat) -> c_int {
    match node_of_fd(fd) {
        // SAFETY: `buf` as the caller passed it.
        Some(node) => unsafe { stat_node(node, buf) },
        // SAFETY: the caller's own call as the raw syscall.
        None => ret(unsafe { libc::syscall(libc::SYS_fstat, fd, buf) }),
    }
}

macro_rules! export_stat {
    ($name:ident, $flag:expr) => {
        /// `stat`/`lstat`, interposed: the nodes' paths show the driver's nodes.
        ///
        /// # Safety
        /// As `stat(2)`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, buf: *mut libc::stat) -> c_int {
            // SAFETY: the caller's arguments (contract of stat(2)).
            unsafe { stat_path(libc::AT_FDCWD, path, buf, $flag) }
        }
    };
}

macro_rules! export_xstat {
    ($name:ident, $flag:expr) => {
        /// glibc's old `__xstat`/`__lxstat` (x86_64: the version argument is 1, the struct
        /// the kernel's), interposed as `stat`.
        ///
        /// # Safety
        /// As `stat(2)`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            _ver: c_int,
            path: *const c_char,
            buf: *mut libc::stat,
        ) -> c_int {
            // SAFETY: the caller's arguments (contract of stat(2)).
            unsafe { stat_path(libc::AT_FDCWD, path, buf, $flag) }
        }
    };
}

export_stat!(stat, 0);
export_stat!(stat64, 0);
export_stat!(lstat, libc::AT_SYMLINK_NOFOLLOW);
export_stat!(lstat64, libc::AT_SYMLINK_NOFOLLOW);
export_xstat!(__xstat, 0);
export_xstat!(__xstat64, 0);
export_xstat!(__lxstat, libc::AT_SYMLINK_NOFOLLOW);
export_xstat!(__lxstat64, libc::AT_SYMLINK_NOFOLLOW);

/// `fstat`, interposed: an open's fd shows its node.
///
/// # Safety
/// As `fstat(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_fd(fd, buf) }
}

/// `fstat64`, as [`fstat`].
///
/// # Safety
/// As `fstat(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat64(fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_fd(fd, buf) }
}

/// glibc's old `__fxstat`, as [`fstat`].
///
/// # Safety
/// As `fstat(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat(_ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_fd(fd, buf) }
}

/// glibc's old `__fxstat64`, as [`fstat`].
///
/// # Safety
/// As `fstat(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat64(_ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { stat_fd(fd, buf) }
}

/// `fstatat`'s shared body: `AT_EMPTY_PATH` on an fd is `fstat`.
///
/// # Safety
/// As `fstatat(2)`.
unsafe fn fstatat_any(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flag: c_int,
) -> c_int {
    // An empty path, or (Linux 6.11 on) none, with AT_EMPTY_PATH names `dirfd` itself.
    if flag & libc::AT_EMPTY_PATH != 0
        // SAFETY: NULL or NUL-terminated (contract): only its first byte is read.
        && (path.is_null() || unsafe { *path } == 0)
        && node_of_fd(dirfd).is_some()
    {
        // SAFETY: the caller's arguments.
        return unsafe { stat_fd(dirfd, buf) };
    }
    // SAFETY: the caller's arguments.
    unsafe { stat_path(dirfd, path, buf, flag) }
}

macro_rules! export_fstatat {
    ($name:ident) => {
        /// `fstatat`, interposed: node paths and our opens show the driver's nodes.
        ///
        /// # Safety
        /// As `fstatat(2)`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dirfd: c_int,
            path: *const c_char,
            buf: *mut libc::stat,
            flag: c_int,
        ) -> c_int {
            // SAFETY: the caller's arguments.
            unsafe { fstatat_any(dirfd, path, buf, flag) }
        }
    };
}

macro_rules! export_fxstatat {
    ($name:ident) => {
        /// glibc's old `__fxstatat`, as `fstatat`.
        ///
        /// # Safety
        /// As `fstatat(2)`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            _ver: c_int,
            dirfd: c_int,
            path: *const c_char,
            buf: *mut libc::stat,
            flag: c_int,
        ) -> c_int {
            // SAFETY: the caller's arguments.
            unsafe { fstatat_any(dirfd, path, buf, flag) }
        }
    };
}

export_fstatat!(fstatat);
export_fstatat!(fstatat64);
export_fxstatat!(__fxstatat);
export_fxstatat!(__fxstatat64);

/// `access`'s answer for a node: read and write for everyone (the driver's nodes are 0666),
/// never execute.
fn access_node(node: DevNode, mode: c_int) -> c_int {
    if !exists(node) {
        set_errno(libc::ENOENT);
        return -1;
    }
    if mode & libc::X_OK != 0 {
        set_errno(libc::EACCES);
        return -1;
    }
    0
}

/// `access(2)`, interposed for the nodes' paths.
///
/// # Safety
/// As `access(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: `path` as the caller passed it.
    match unsafe { node_at(libc::AT_FDCWD, path) } {
        Some(node) => access_node(node, mode),
        None => match next(Sym::Access) {
            // SAFETY: the address dlsym returned for "access" (AccessFn), the caller's call.
            Some(f) => unsafe { std::mem::transmute::<usize, AccessFn>(f)(path, mode) },
            // SAFETY: the caller's own call as the raw syscall.
            None => ret(unsafe { libc::syscall(libc::SYS_faccessat, libc::AT_FDCWD, path, mode) }),
        },
    }
}

/// `faccessat(2)`, interposed for the nodes' paths.
///
/// # Safety
/// As `faccessat(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: `path` as the caller passed it.
    match unsafe { node_at(dirfd, path) } {
        Some(node) => access_node(node, mode),
        None => match next(Sym::Faccessat) {
            // SAFETY: the address dlsym returned for "faccessat" (FaccessatFn).
            Some(f) => unsafe {
                std::mem::transmute::<usize, FaccessatFn>(f)(dirfd, path, mode, flags)
            },
            // SAFETY: the caller's own call as the raw syscall (faccessat2 takes the flags).
            None => ret(unsafe { libc::syscall(libc::SYS_faccessat2, dirfd, path, mode, flags) }),
        },
    }
}

/// `euidaccess` (and its alias `eaccess`), interposed for the nodes' paths: glibc's own
/// definition checks the file with calls the shim cannot see.
///
/// # Safety
/// As `euidaccess(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn euidaccess(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: `path` as the caller passed it.
    match unsafe { node_at(libc::AT_FDCWD, path) } {
        Some(node) => access_node(node, mode),
        None => match next(Sym::Euidaccess) {
            // SAFETY: the address dlsym returned for "euidaccess" (AccessFn), the caller's call.
            Some(f) => unsafe { std::mem::transmute::<usize, AccessFn>(f)(path, mode) },
            // SAFETY: the caller's own call as the raw syscall (faccessat2 with AT_EACCESS).
            None => ret(unsafe {
                libc::syscall(
                    libc::SYS_faccessat2,
                    libc::AT_FDCWD,
                    path,
                    mode,
                    libc::AT_EACCESS,
                )
            }),
        },
    }
}

/// `eaccess`, as [`euidaccess`].
///
/// # Safety
/// As `euidaccess(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn eaccess(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { euidaccess(path, mode) }
}

/// `statx(2)`, interposed: the nodes' paths (relative to `dirfd` too) and our opens
/// (`AT_EMPTY_PATH`) show the driver's nodes, with every basic field (`STATX_BASIC_STATS`)
/// whatever `mask` asks, as the kernel may.
///
/// # Safety
/// As `statx(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: libc::c_uint,
    buf: *mut libc::statx,
) -> c_int {
    // An empty path, or (Linux 6.11 on) none, with AT_EMPTY_PATH names `dirfd` itself.
    // SAFETY: NULL or NUL-terminated (contract): only its first byte is read.
    let empty = path.is_null() || unsafe { *path } == 0;
    let node = if empty && flags & libc::AT_EMPTY_PATH != 0 {
        node_of_fd(dirfd)
    } else {
        // SAFETY: `path` as the caller passed it.
        unsafe { node_at(dirfd, path) }
    };
    let Some(node) = node else {
        return match next(Sym::Statx) {
            // SAFETY: the address dlsym returned for "statx" (StatxFn), the caller's call.
            Some(f) => unsafe {
                std::mem::transmute::<usize, StatxFn>(f)(dirfd, path, flags, mask, buf)
            },
            // SAFETY: the caller's own call as the raw syscall.
            None => ret(unsafe { libc::syscall(libc::SYS_statx, dirfd, path, flags, mask, buf) }),
        };
    };
    if !exists(node) {
        set_errno(libc::ENOENT);
        return -1;
    }
    if buf.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: `buf` points to a writable struct statx (contract).
    unsafe { buf.write(fake_statx(node)) };
    0
}

// ---- fopen ---------------------------------------------------------------------------------

/// The `open(2)` flags of an `fopen` mode, as glibc reads it (the first character, then up to
/// six more until a NUL or `,`): `None` for a mode glibc refuses (`EINVAL`).
fn fopen_flags(mode: &[u8]) -> Option<c_int> {
    let (mut access, mut extra) = match mode.first()? {
        b'r' => (libc::O_RDONLY, 0),
        b'w' => (libc::O_WRONLY, libc::O_CREAT | libc::O_TRUNC),
        b'a' => (libc::O_WRONLY, libc::O_CREAT | libc::O_APPEND),
        _ => return None,
    };
    for &c in mode.iter().skip(1).take(6) {
        match c {
            b',' => break,
            b'+' => access = libc::O_RDWR,
            b'x' => extra |= libc::O_EXCL,
            b'e' => extra |= libc::O_CLOEXEC,
            _ => {}
        }
    }
    Some(access | extra)
}

/// The shared body of `fopen`/`fopen64`: a node's path opens the node and wraps the fd in a
/// stream (`fdopen`, libc's own: glibc's `fopen` opens its file with an internal call the shim
/// cannot interpose); anything else is `other()`.
///
/// # Safety
/// `path` and `mode` are NULL or NUL-terminated; `other` makes the caller's own call.
unsafe fn fopen_or(
    path: *const c_char,
    mode: *const c_char,
    other: impl FnOnce() -> *mut libc::FILE,
) -> *mut libc::FILE {
    // SAFETY: `path` as the caller passed it.
    let Some(node) = (unsafe { node_at(libc::AT_FDCWD, path) }) else {
        return other();
    };
    // SAFETY: a non-NULL mode is NUL-terminated (contract).
    let flags = (!mode.is_null()).then(|| unsafe { CStr::from_ptr(mode) }.to_bytes());
    let Some(flags) = flags.and_then(fopen_flags) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let fd = match dev_open(node, flags) {
        Ok(fd) => fd,
        Err(e) => {
            set_errno(e);
            return std::ptr::null_mut();
        }
    };
    // SAFETY: `fd` is the open just made, `mode` a valid mode string (checked above).
    let f = unsafe { libc::fdopen(fd, mode) };
    if f.is_null() {
        let e = errno();
        close(fd);
        set_errno(e);
    }
    f
}

/// `fopen(3)`, interposed: a node's path opens the node.
///
/// # Safety
/// As `fopen(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: the caller's arguments.
    unsafe {
        fopen_or(path, mode, || match next(Sym::Fopen) {
            // SAFETY: the address dlsym returned for "fopen" (FopenFn), the caller's call.
            Some(f) => std::mem::transmute::<usize, FopenFn>(f)(path, mode),
            None => {
                set_errno(libc::ENOSYS);
                std::ptr::null_mut()
            }
        })
    }
}

/// `fopen64(3)`, as [`fopen`].
///
/// # Safety
/// As `fopen(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: the caller's arguments.
    unsafe {
        fopen_or(path, mode, || match next(Sym::Fopen64) {
            // SAFETY: the address dlsym returned for "fopen64" (FopenFn), the caller's call.
            Some(f) => std::mem::transmute::<usize, FopenFn>(f)(path, mode),
            None => {
                set_errno(libc::ENOSYS);
                std::ptr::null_mut()
            }
        })
    }
}

/// The shared body of `freopen`/`freopen64` for a node's path: the node is opened first (its
/// errors leave `stream` as it was, except that glibc would have closed it: so is it here);
/// then the next `freopen` reopens `stream` on `/dev/null` with the same mode (less `x`),
/// which keeps the stream's fd number, and that fd is replaced by the node's (`dup3`, keeping
/// `e`'s close-on-exec).
///
/// # Safety
/// As `freopen(3)`; `real` is the next `freopen` variant.
unsafe fn freopen_node(
    node: DevNode,
    mode: *const c_char,
    stream: *mut libc::FILE,
    real: FreopenFn,
) -> *mut libc::FILE {
    let fail = |e: c_int| {
        if !stream.is_null() {
            // SAFETY: the caller's stream, which freopen closes on failure.
            unsafe { libc::fclose(stream) };
        }
        set_errno(e);
        std::ptr::null_mut()
    };
    // SAFETY: a non-NULL mode is NUL-terminated (contract).
    let m = (!mode.is_null()).then(|| unsafe { CStr::from_ptr(mode) }.to_bytes());
    let Some((m, flags)) = m.and_then(|m| Some((m, fopen_flags(m)?))) else {
        return fail(libc::EINVAL);
    };
    // The mode for /dev/null: the same, without `x` (which /dev/null, existing, would refuse).
    let mut m2 = [0u8; 64];
    if m.len() >= m2.len() {
        return fail(libc::EINVAL);
    }
    let mut n = 0;
    for &c in m {
        if c != b'x' {
            m2[n] = c;
            n += 1;
        }
    }
    let fd = match dev_open(node, flags) {
        Ok(fd) => fd,
        Err(e) => return fail(e),
    };
    // SAFETY: the caller's stream and a NUL-terminated mode (m2 has a NUL after `n`).
    let f = unsafe { real(c"/dev/null".as_ptr(), m2.as_ptr().cast(), stream) };
    if f.is_null() {
        let e = errno();
        close(fd);
        set_errno(e);
        return f;
    }
    // SAFETY: fileno on the stream freopen just returned.
    let target = unsafe { libc::fileno(f) };
    let cloexec = flags & libc::O_CLOEXEC;
    // SAFETY: dup3 of the node's fd (ours) over the stream's fd, both open.
    let r = unsafe { libc::syscall(libc::SYS_dup3, fd, target, cloexec) };
    let e = errno();
    close(fd);
    if r < 0 {
        // SAFETY: the stream freopen returned, which the failure closes.
        unsafe { libc::fclose(f) };
        set_errno(e);
        return std::ptr::null_mut();
    }
    f
}

macro_rules! export_freopen {
    ($name:ident, $sym:expr) => {
        /// `freopen(3)`, interposed: a node's path reopens the stream on the node.
        ///
        /// # Safety
        /// As `freopen(3)`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            path: *const c_char,
            mode: *const c_char,
            stream: *mut libc::FILE,
        ) -> *mut libc::FILE {
            let Some(real) = next($sym) else {
                set_errno(libc::ENOSYS);
                return std::ptr::null_mut();
            };
            // SAFETY: the address dlsym returned for this freopen variant (FreopenFn).
            let real = unsafe { std::mem::transmute::<usize, FreopenFn>(real) };
            // SAFETY: `path` as the caller passed it.
            match unsafe { node_at(libc::AT_FDCWD, path) } {
                // SAFETY: the caller's arguments.
                Some(node) => unsafe { freopen_node(node, mode, stream, real) },
                // SAFETY: the caller's own call.
                None => unsafe { real(path, mode, stream) },
            }
        }
    };
}

export_freopen!(freopen, Sym::Freopen);
export_freopen!(freopen64, Sym::Freopen64);

// ---- ioctl ---------------------------------------------------------------------------------

/// `ioctl(2)`, interposed: on one of our opens, the worker serves it (reading and writing the
/// caller's memory itself); on anything else, the next `ioctl`.
///
/// # Safety
/// As `ioctl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    // The driver's command numbers are 32 bits (the kernel's ioctl takes an unsigned int).
    let cmd = (request & 0xffff_ffff) as u32;
    if cmd == RM_ALLOC_MEMORY
        && let Some(r) = os_descriptor(fd, arg)
    {
        return r;
    }
    let Some((_, key)) = open_of_fd(fd) else {
        return match next(Sym::Ioctl) {
            // SAFETY: the address dlsym returned for "ioctl" (IoctlFn), the caller's call.
            Some(f) => unsafe { std::mem::transmute::<usize, IoctlFn>(f)(fd, request, arg) },
            // SAFETY: the caller's own call as the raw syscall.
            None => ret(unsafe { libc::syscall(libc::SYS_ioctl, fd, request, arg) }),
        };
    };
    let op = CallOp::Ioctl {
        cmd,
        arg: arg as u64,
    };
    match crate::channel::call(fd, key, op) {
        Ok((r, host)) => {
            if let Some(h) = host {
                close(h);
            }
            if r.errno != 0 {
                set_errno(r.errno);
                return -1;
            }
            r.result
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

// ---- OS-descriptor memory -------------------------------------------------------------------

/// `NV_ESC_RM_ALLOC_MEMORY`: `_IOWR('F', 0x27, sizeof(nv_ioctl_nvos02_parameters_with_fd))`.
pub(crate) const RM_ALLOC_MEMORY: u32 = 0xc038_4627;
/// `sizeof(nv_ioctl_nvos02_parameters_with_fd)` and the offsets the shim reads
/// (`hClass`, `flags`, `pMemory`, `limit`; nv-ioctl.h, nvos.h).
pub(crate) const NVOS02_SIZE: usize = 56;
pub(crate) const NVOS02_HCLASS: usize = 12;
pub(crate) const NVOS02_PMEMORY: usize = 24;
pub(crate) const NVOS02_LIMIT: usize = 32;
/// `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`.
pub(crate) const OS_DESCRIPTOR_CLASS: u32 = 0x71;
/// The most the shim moves into a file for one request (the daemon's bound too).
const MAX_OS_DESCRIPTOR_BYTES: u64 = 1 << 30;
const PAGE: u64 = 4096;

/// The shim's side of OS-descriptor memory (`NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`; the driver pins
/// the pages at `pMemory` of the *calling* process, which behind nvproxy is the daemon): when
/// `fd` is one of our GPU opens (either transport) and the request is well-formed, the pages
/// at `pMemory` are replaced by a shared mapping of a new memfd that holds the same bytes
/// (`MAP_FIXED` over the same range, same address), and the daemon is asked with
/// `NVPROXY_IOC_ALLOC_OS_DESCRIPTOR`, naming the memfd; the daemon takes its own duplicate,
/// so the GPU and this process share those pages from then on. `None`: not ours, or nothing
/// the shim can do (the plain escape then goes out, and the daemon answers it as before).
///
/// What changes for the process: the range becomes a shared file mapping (writes made by
/// another thread between the copy and the remap are lost; a `fork` child shares the pages
/// instead of copying them; a file-backed range no longer writes to its file).
fn os_descriptor(fd: c_int, arg: *mut c_void) -> Option<c_int> {
    if fd < 0 || arg.is_null() {
        return None;
    }
    let socket = match open_of_fd(fd) {
        Some((DevNode::Gpu(_), key)) => Some(key),
        Some(_) => return None,
        None => {
            if !crate::shim::is_cuse_node(fd) {
                return None;
            }
            None
        }
    };
    let mut p = [0u8; NVOS02_SIZE];
    // Read through the kernel, so a bad pointer is the driver's EFAULT (the plain path), not
    // a fault in the shim.
    let local = libc::iovec {
        iov_base: p.as_mut_ptr().cast(),
        iov_len: p.len(),
    };
    let remote = libc::iovec {
        iov_base: arg,
        iov_len: p.len(),
    };
    // SAFETY: process_vm_readv on our own process copies at most `p.len()` bytes into `p`, a
    // live local buffer; a bad remote address fails with EFAULT instead of faulting.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n != p.len() as isize {
        return None;
    }
    let u32_at = |o: usize| u32::from_ne_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]]);
    let u64_at = |o: usize| u64::from(u32_at(o)) | u64::from(u32_at(o + 4)) << 32;
    if u32_at(NVOS02_HCLASS) != OS_DESCRIPTOR_CLASS {
        return None;
    }
    let (addr, limit) = (u64_at(NVOS02_PMEMORY), u64_at(NVOS02_LIMIT));
    let len = limit.checked_add(1)?;
    if addr == 0 || addr % PAGE != 0 || len > MAX_OS_DESCRIPTOR_BYTES {
        return None; // the daemon answers these as the driver does
    }
    let size = len.div_ceil(PAGE) * PAGE;
    let memfd = share_range(addr, size)?;
    let args = crate::proto::OsDescriptorArgs {
        params: arg as u64,
        memfd,
        reserved: 0,
    };
    let cmd = crate::proto::NVPROXY_IOC_ALLOC_OS_DESCRIPTOR;
    let r = if let Some(key) = socket {
        let op = CallOp::Ioctl {
            cmd,
            arg: &args as *const crate::proto::OsDescriptorArgs as u64,
        };
        match crate::channel::call(fd, key, op) {
            Ok((r, host)) => {
                if let Some(h) = host {
                    close(h);
                }
                if r.errno != 0 {
                    Err(r.errno)
                } else {
                    Ok(r.result)
                }
            }
            Err(e) => Err(e),
        }
    } else {
        // SAFETY: the private ioctl with a pointer to `args`, a live repr(C) OsDescriptorArgs
        // that the daemon only reads, on one of our own nodes (checked above).
        let r = unsafe {
            libc::syscall(
                libc::SYS_ioctl,
                fd,
                cmd as c_ulong,
                &args as *const crate::proto::OsDescriptorArgs,
            )
        };
        if r < 0 { Err(errno()) } else { Ok(ret(r)) }
    };
    close(memfd);
    Some(match r {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

/// Puts the `size` bytes at `addr` into a new memfd and maps it shared over the same range;
/// the memfd, or `None` (nothing changed, or the range could not be read).
fn share_range(addr: u64, size: u64) -> Option<c_int> {
    let len = usize::try_from(size).ok()?;
    // SAFETY: memfd_create takes a NUL-terminated name (a static C string) and flags.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_memfd_create,
            c"nvproxy-os-descriptor".as_ptr(),
            libc::MFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "memfd_create returned a new fd, an int"
    )]
    let fd = fd as c_int;
    // SAFETY: ftruncate on the memfd just made, by value.
    if unsafe { libc::syscall(libc::SYS_ftruncate, fd, size as libc::off_t) } != 0 {
        close(fd);
        return None;
    }
    let mut done = 0usize;
    while done < len {
        // SAFETY: pwrite reads `size - done` bytes of our own memory at `addr + done` in the
        // kernel (an unmapped page fails with EFAULT, nothing faults here) into the memfd.
        let n = unsafe {
            libc::syscall(
                libc::SYS_pwrite64,
                fd,
                (addr + done as u64) as *const c_void,
                len - done,
                done as libc::off_t,
            )
        };
        match usize::try_from(n) {
            Ok(n) if n > 0 => done += n,
            _ => {
                close(fd);
                return None;
            }
        }
    }
    // SAFETY: MAP_FIXED over exactly the range just copied, which the caller named as its own
    // memory for the driver to pin; the new pages hold the same bytes. The raw syscall: the
    // shim's own `mmap` is interposed.
    let m = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            addr as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0 as libc::off_t,
        )
    };
    if u64::try_from(m) != Ok(addr) {
        close(fd);
        return None;
    }
    Some(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_fake_stat_looks_like_the_drivers_nodes() {
        let st = fake_stat(DevNode::Ctl);
        assert_eq!(st.st_mode, libc::S_IFCHR | 0o666);
        assert_eq!(st.st_rdev, crate::proto::makedev(195, 255));
        assert_eq!(
            fake_stat(DevNode::Gpu(3)).st_rdev,
            crate::proto::makedev(195, 3)
        );
    }

    #[test]
    fn test_os_descriptor_numbers_are_the_drivers() {
        use nvproxy_abi::structs::{NVOS02_PARAMETERS, nv_ioctl_nvos02_parameters_with_fd as P};
        use std::mem::offset_of;
        assert_eq!(NVOS02_SIZE, size_of::<P>());
        assert_eq!(
            RM_ALLOC_MEMORY,
            nvproxy_abi::ioctl::nv_iowr(0x27, NVOS02_SIZE)
        );
        let base = offset_of!(P, params);
        assert_eq!(NVOS02_HCLASS, base + offset_of!(NVOS02_PARAMETERS, hClass));
        assert_eq!(
            NVOS02_PMEMORY,
            base + offset_of!(NVOS02_PARAMETERS, pMemory)
        );
        assert_eq!(NVOS02_LIMIT, base + offset_of!(NVOS02_PARAMETERS, limit));
        assert_eq!(
            OS_DESCRIPTOR_CLASS,
            nvproxy_abi::class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
        );
    }

    #[test]
    fn test_share_range_keeps_the_bytes_and_shares_the_pages_with_the_memfd() {
        let len = usize::try_from(2 * PAGE).unwrap();
        // SAFETY: a fresh private anonymous mapping chosen by the kernel, unmapped below.
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
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: `p` is the live mapping of `len` bytes made above, nothing else uses it.
        let mem = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
        mem[..6].copy_from_slice(b"before");
        mem[len - 4..].copy_from_slice(b"tail");
        let fd = share_range(p as u64, len as u64).expect("share_range");
        // SAFETY: the same range, still mapped (now shared, from the memfd).
        let mem = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
        assert_eq!(&mem[..6], b"before");
        assert_eq!(&mem[len - 4..], b"tail");
        // What the other side writes into the file, this process reads at the address.
        let f = std::fs::File::from(
            // SAFETY: `fd` was returned by share_range for the caller to own.
            unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) },
        );
        std::os::unix::fs::FileExt::write_all_at(&f, b"gpu", 8).unwrap();
        assert_eq!(&mem[8..11], b"gpu");
        mem[100] = 7;
        let mut b = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, 100).unwrap();
        assert_eq!(b[0], 7);
        // A range the process cannot read is refused, and left as it was.
        // SAFETY: the range made above, which nothing else uses.
        assert_eq!(unsafe { libc::mprotect(p, len, libc::PROT_NONE) }, 0);
        assert_eq!(share_range(p as u64, len as u64), None);
        // SAFETY: as above; then the range is given back.
        assert_eq!(unsafe { libc::mprotect(p, len, libc::PROT_READ) }, 0);
        // SAFETY: the range is readable again (and still the memfd's pages).
        assert_eq!(unsafe { *p.cast::<u8>().add(8) }, b'g');
        // SAFETY: unmapping the range made above.
        unsafe { libc::munmap(p, len) };
    }

    #[test]
    fn test_disabled_transport_passes_everything_through() {
        // The test binary has no NVPROXY_DEV_SOCKET: nothing is ours.
        assert!(!enabled());
        // SAFETY: a NUL-terminated path.
        let node = unsafe { node_at(libc::AT_FDCWD, c"/dev/nvidiactl".as_ptr()) };
        assert_eq!(node, None);
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(node_of_fd(std::os::fd::AsRawFd::as_raw_fd(&a)), None);
    }

    #[test]
    fn test_in_dev_compares_what_the_kernel_resolves() {
        assert!(in_dev(libc::AT_FDCWD, b"/dev"));
        assert!(in_dev(libc::AT_FDCWD, b"//dev/../dev/."));
        assert!(!in_dev(libc::AT_FDCWD, b"/"));
        assert!(!in_dev(libc::AT_FDCWD, b"/nonexistent-dir"));
        assert!(!in_dev(libc::AT_FDCWD, b"/dev/null")); // not a directory
        assert!(!in_dev(libc::AT_FDCWD, &[b'/'; PATH_MAX]));
        let dev = std::fs::File::open("/dev").unwrap();
        let dirfd = std::os::fd::AsRawFd::as_raw_fd(&dev);
        assert!(in_dev(dirfd, b"."));
        assert!(in_dev(dirfd, b"../dev"));
        assert!(!in_dev(dirfd, b".."));
    }

    #[test]
    fn test_fopen_modes_give_glibcs_open_flags() {
        use libc::{O_APPEND, O_CLOEXEC, O_CREAT, O_EXCL, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY};
        assert_eq!(fopen_flags(b"r"), Some(O_RDONLY));
        assert_eq!(fopen_flags(b"rb+"), Some(O_RDWR));
        assert_eq!(fopen_flags(b"r+e"), Some(O_RDWR | O_CLOEXEC));
        assert_eq!(fopen_flags(b"w"), Some(O_WRONLY | O_CREAT | O_TRUNC));
        assert_eq!(
            fopen_flags(b"wx"),
            Some(O_WRONLY | O_CREAT | O_TRUNC | O_EXCL)
        );
        assert_eq!(fopen_flags(b"a+"), Some(O_RDWR | O_CREAT | O_APPEND));
        // Only the first seven characters count, and `,` ends the flags.
        assert_eq!(fopen_flags(b"rbbbbbbe"), Some(O_RDONLY));
        assert_eq!(fopen_flags(b"r,ccs=e"), Some(O_RDONLY));
        for bad in [&b""[..], b"q", b"+r", b"x"] {
            assert_eq!(fopen_flags(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn test_fake_statx_matches_fake_stat() {
        assert_eq!(size_of::<libc::statx>(), 256);
        let sx = fake_statx(DevNode::Gpu(2));
        assert_eq!(u32::from(sx.stx_mode), libc::S_IFCHR | 0o666);
        assert_eq!((sx.stx_rdev_major, sx.stx_rdev_minor), (195, 2));
        assert_eq!(sx.stx_mask, libc::STATX_BASIC_STATS);
        assert_eq!(sx.stx_ino, DevNode::Gpu(2).code());
    }
}
