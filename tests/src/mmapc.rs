//! Helpers of the mmap test client and benchmark (`src/bin/mmap-client.rs`,
//! `src/bin/mmap-bench.rs`): raw `mmap`, nvproxy's private ioctls, and the mmap socket spoken by
//! hand (to play a hostile client). The crate's other `unsafe` code is in `nvfe::sys`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::sys::socket::{self, MsgFlags};
use nvproxy_abi::ioctl::{NV_ESC_RM_MAP_MEMORY, NV_ESC_RM_UNMAP_MEMORY};
use nvproxy_abi::structs::{
    NV_MEMORY_ALLOCATION_PARAMS, NVOS34_PARAMETERS, nv_ioctl_nvos33_parameters_with_fd,
};
use nvproxy_preload_proto::socket::{AttachRequest, CallOp, CallReply, CallRequest};
use nvproxy_preload_proto::{
    MmapReply, MmapRequest, MmapTicketArgs, NVPROXY_IOC_HELLO, NVPROXY_IOC_MMAP_TICKET,
};

use zerocopy::{FromZeros, IntoBytes};

use crate::nvfe::Session;
use crate::nvfe::status::NV_OK;

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// A mapping made with `mmap(2)` (through whatever `mmap` the process links: the shim when it
/// is preloaded), unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    /// `mmap(addr, len, prot, flags, fd, offset)`; the errno on failure. A `MAP_FIXED` at an
    /// address that is not the caller's own reservation is refused with a panic: it would
    /// replace memory this program uses.
    pub fn map(
        addr: usize,
        len: usize,
        prot: i32,
        flags: i32,
        fd: RawFd,
        offset: i64,
    ) -> Result<Mapping, i32> {
        // SAFETY: without MAP_FIXED the kernel picks free addresses (a hint is only a hint);
        // with MAP_FIXED the callers of this test helper pass only addresses inside a
        // reservation they made with `Mapping::reserve` and keep alive, so nothing else is
        // replaced.
        let p = unsafe { libc::mmap(addr as *mut libc::c_void, len, prot, flags, fd, offset) };
        if p == libc::MAP_FAILED {
            return Err(errno());
        }
        Ok(Mapping {
            addr: p as usize,
            len,
        })
    }

    /// An anonymous `PROT_NONE` reservation of `len` bytes (the `cudaMallocManaged` pattern
    /// maps over it with `MAP_FIXED`).
    pub fn reserve(len: usize) -> Result<Mapping, i32> {
        Self::map(
            0,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    }

    /// The mapping's address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: mmap refuses length 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads `buf.len()` bytes at `offset` (volatile: another mapping of the same memory may
    /// have written them).
    pub fn read(&self, offset: usize, buf: &mut [u8]) {
        assert!(offset + buf.len() <= self.len, "read past the mapping");
        for (i, b) in buf.iter_mut().enumerate() {
            // SAFETY: inside the mapping (checked above), which stays mapped while `self`
            // lives; the caller mapped it readable.
            *b = unsafe { std::ptr::read_volatile((self.addr + offset + i) as *const u8) };
        }
    }

    /// Writes `data` at `offset` (volatile).
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.len, "write past the mapping");
        for (i, &b) in data.iter().enumerate() {
            // SAFETY: inside the mapping, which stays mapped while `self` lives; the caller
            // mapped it writable. Volatile: the memory is shared with other mappings.
            unsafe { std::ptr::write_volatile((self.addr + offset + i) as *mut u8, b) };
        }
    }

    /// Gives up ownership without unmapping (when a `MAP_FIXED` mapping replaced part of a
    /// reservation that will be unmapped as a whole).
    pub fn leak(self) -> usize {
        let a = self.addr;
        std::mem::forget(self);
        a
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `addr..addr+len` is this mapping, made by `map` and owned by `self`.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// `ioctl(fd, NVPROXY_IOC_HELLO, 0)`.
pub fn hello(fd: &impl AsRawFd) -> Result<i32, i32> {
    // SAFETY: a by-value ioctl (0 is not a pointer), sent only to our own nodes by the tests.
    let r = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            NVPROXY_IOC_HELLO as libc::Ioctl,
            0 as libc::c_ulong,
        )
    };
    if r < 0 { Err(errno()) } else { Ok(r) }
}

/// A by-value ioctl `cmd` with argument `arg` on one of our nodes (e.g. the daemon's identify
/// ioctl, which clients must be refused).
pub fn ioctl_value(fd: &impl AsRawFd, cmd: u32, arg: u64) -> Result<i32, i32> {
    // SAFETY: a by-value ioctl sent only to our own nodes, which read no memory at `arg` for
    // these commands.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), cmd as libc::Ioctl, arg as libc::c_ulong) };
    if r < 0 { Err(errno()) } else { Ok(r) }
}

/// `ioctl(fd, NVPROXY_IOC_MMAP_TICKET, args)`: the ticket.
pub fn ticket(fd: &impl AsRawFd, args: &mut MmapTicketArgs) -> Result<u64, i32> {
    let p: *mut MmapTicketArgs = args;
    // SAFETY: `p` is an exclusive, live MmapTicketArgs (repr(C), 40 bytes), the argument the
    // ioctl is defined with.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), NVPROXY_IOC_MMAP_TICKET as libc::Ioctl, p) };
    if r < 0 {
        return Err(errno());
    }
    Ok(args.ticket)
}

/// A ticket for a 4 KiB shared read/write mapping at offset 0.
pub fn simple_ticket(fd: &impl AsRawFd) -> Result<u64, i32> {
    ticket(
        fd,
        &mut MmapTicketArgs {
            len: 4096,
            prot: libc::PROT_READ | libc::PROT_WRITE,
            flags: libc::MAP_SHARED,
            ..Default::default()
        },
    )
}

/// What the daemon answered to a redemption.
#[derive(Debug)]
pub enum Answer {
    /// A reply, with the fd when its errno is 0.
    Reply(MmapReply, Option<OwnedFd>),
    /// The daemon closed the connection without a word (refused).
    Nothing,
}

/// Connects to the mmap socket at `path` and presents `ticket`, as the shim does.
pub fn redeem(path: &Path, ticket: u64) -> io::Result<Answer> {
    let s = socket::socket(
        socket::AddressFamily::Unix,
        socket::SockType::SeqPacket,
        socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::connect(s.as_raw_fd(), &socket::UnixAddr::new(path)?)?;
    socket::send(
        s.as_raw_fd(),
        &MmapRequest { ticket }.encode(),
        MsgFlags::empty(),
    )?;
    let mut buf = [0u8; 64];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let msg = socket::recvmsg::<()>(
        s.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let n = msg.bytes;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let socket::ControlMessageOwned::ScmRights(v) = c {
            // SAFETY: the kernel installed these fds in our table for this message alone;
            // nothing else owns them.
            fds.extend(v.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    if n == 0 {
        if !fds.is_empty() {
            return Err(io::Error::other("fds without a reply"));
        }
        return Ok(Answer::Nothing);
    }
    let reply = MmapReply::decode(&buf[..n]).ok_or_else(|| io::Error::other("malformed reply"))?;
    if fds.len() > 1 || (reply.errno == 0) != (fds.len() == 1) {
        return Err(io::Error::other(format!(
            "reply errno {} with {} fds",
            reply.errno,
            fds.len()
        )));
    }
    Ok(Answer::Reply(reply, fds.pop()))
}

/// With the socket transport: asks the worker for the host fd of an mmap of open `fd` by hand
/// (a channel attached on the open's own socket, then a `CallRequest` on it, as the shim
/// sends): the reply and the fd.
pub fn socket_host_fd(fd: &impl AsRawFd) -> io::Result<(CallReply, Option<OwnedFd>)> {
    let (mine, theirs) = socket::socketpair(
        socket::AddressFamily::Unix,
        socket::SockType::SeqPacket,
        None,
        socket::SockFlag::SOCK_CLOEXEC,
    )?;
    // A channel of our own for the open (as the shim attaches one per thread).
    let attach = AttachRequest { fd: fd.as_raw_fd() }.encode();
    let raw = [theirs.as_raw_fd()];
    socket::sendmsg::<()>(
        fd.as_raw_fd(),
        &[io::IoSlice::new(&attach)],
        &[socket::ControlMessage::ScmRights(&raw)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    drop(theirs);
    let (attached, _) = channel_reply(&mine)?;
    if attached.errno != 0 {
        return Ok((attached, None));
    }
    let req = CallRequest {
        fd: fd.as_raw_fd(),
        op: CallOp::Mmap {
            len: 4096,
            prot: libc::PROT_READ | libc::PROT_WRITE,
            flags: libc::MAP_SHARED,
            offset: 0,
        },
    }
    .encode();
    socket::send(mine.as_raw_fd(), &req, MsgFlags::MSG_NOSIGNAL)?;
    channel_reply(&mine)
}

/// One [`CallReply`] read from a channel, with the fd it carries.
fn channel_reply(chan: &OwnedFd) -> io::Result<(CallReply, Option<OwnedFd>)> {
    let mut buf = [0u8; 64];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let msg = socket::recvmsg::<()>(
        chan.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let n = msg.bytes;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let socket::ControlMessageOwned::ScmRights(v) = c {
            // SAFETY: the kernel installed these fds in our table for this message alone;
            // nothing else owns them.
            fds.extend(v.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let reply = CallReply::decode(&buf[..n]).ok_or_else(|| io::Error::other("malformed reply"))?;
    Ok((reply, fds.pop()))
}

/// Whether this process has the shim mapped.
pub fn shim_loaded() -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.contains("/libnvproxy_preload.so"))
        .unwrap_or(false)
}

/// `memfd_create` of `len` bytes.
pub fn memfd(len: u64) -> io::Result<OwnedFd> {
    let fd =
        nix::sys::memfd::memfd_create(c"mmap-test", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)?;
    let f = std::fs::File::from(fd);
    f.set_len(len)?;
    Ok(f.into())
}

/// An `NV01_MEMORY_SYSTEM` object of a CUDA-like session on `/dev/nvidiactl` (GPU 0's device),
/// to map with `NV_ESC_RM_MAP_MEMORY` and then `mmap`.
pub struct RmMemory {
    s: Session,
    h_device: u32,
    len: u64,
}

/// The memory object's handle.
const H_MEMORY: u32 = 0xcafe_7000;

fn nv(e: crate::nvfe::Error) -> String {
    e.to_string()
}

impl RmMemory {
    /// Opens a session speaking `version`, attaches GPU 0, allocates its device and `len` bytes
    /// of system memory.
    pub fn new(version: &str, len: u64) -> Result<RmMemory, String> {
        let mut s = Session::open(version, Path::new("/dev")).map_err(nv)?;
        s.probe().map_err(nv)?;
        s.open_gpus().map_err(nv)?;
        s.attach().map_err(nv)?;
        s.alloc_device(0).map_err(nv)?;
        let (h, hd) = (s.h_client, s.gpus[0].h_device);
        let class = s.fe.class("NV01_MEMORY_SYSTEM").map_err(nv)?;
        let size = s.fe.abi().classes[&class].param_size as usize;
        let mut mp = NV_MEMORY_ALLOCATION_PARAMS::new_zeroed();
        mp.size = len;
        let mut params = mp.as_bytes().to_vec();
        params.resize(size, 0);
        let ctl = s.ctl.try_clone().map_err(|e| e.to_string())?;
        s.fe.rm_alloc(&ctl, h, hd, H_MEMORY, class, Some(params))
            .map_err(nv)?;
        Ok(RmMemory {
            s,
            h_device: hd,
            len,
        })
    }

    /// `NV_ESC_RM_MAP_MEMORY` of the whole object with the mmap context on the file `fd` (an
    /// nvidiactl open); the address cookie for [`RmMemory::unmap`].
    pub fn map_onto(&mut self, fd: RawFd) -> Result<u64, String> {
        let mut p = nv_ioctl_nvos33_parameters_with_fd::new_zeroed();
        p.params.hClient = self.s.h_client;
        p.params.hDevice = self.h_device;
        p.params.hMemory = H_MEMORY;
        p.params.length = self.len;
        p.fd = fd;
        let ctl = self.s.ctl.try_clone().map_err(|e| e.to_string())?;
        self.s
            .fe
            .escape(&ctl, NV_ESC_RM_MAP_MEMORY, &mut p)
            .map_err(|e| format!("RM_MAP_MEMORY: errno {e}"))?;
        if p.params.status != NV_OK {
            return Err(format!("RM_MAP_MEMORY: status {:#x}", p.params.status));
        }
        Ok(p.params.pLinearAddress)
    }

    /// `NV_ESC_RM_UNMAP_MEMORY` of a mapping made by [`RmMemory::map_onto`].
    pub fn unmap(&mut self, address: u64) -> Result<(), String> {
        let mut p = NVOS34_PARAMETERS::new_zeroed();
        p.hClient = self.s.h_client;
        p.hDevice = self.h_device;
        p.hMemory = H_MEMORY;
        p.pLinearAddress = address;
        let ctl = self.s.ctl.try_clone().map_err(|e| e.to_string())?;
        self.s
            .fe
            .escape(&ctl, NV_ESC_RM_UNMAP_MEMORY, &mut p)
            .map_err(|e| format!("RM_UNMAP_MEMORY: errno {e}"))?;
        if p.status != NV_OK {
            return Err(format!("RM_UNMAP_MEMORY: status {:#x}", p.status));
        }
        Ok(())
    }

    /// RM controls on the session's root client (build version, share policy, probed GPUs),
    /// each checked: a cheap "is my client still mine and answered right" probe.
    pub fn ping(&mut self) -> Result<(), String> {
        self.s.system_controls().map_err(nv)
    }

    /// Frees the memory and the session's objects.
    pub fn close(mut self) -> Result<(), String> {
        let (h, hd) = (self.s.h_client, self.h_device);
        let ctl = self.s.ctl.try_clone().map_err(|e| e.to_string())?;
        self.s.fe.rm_free(&ctl, h, hd, H_MEMORY).map_err(nv)?;
        self.s.teardown().map_err(nv)
    }
}

/// `mmap` + `munmap` of `len` bytes of `fd` with the raw syscalls, bypassing any interposed
/// `mmap` (the benchmark's floor).
pub fn raw_map_unmap(len: usize, prot: i32, flags: i32, fd: RawFd) -> Result<(), i32> {
    // SAFETY: no MAP_FIXED and address 0: the kernel picks a free range, so nothing is
    // replaced; the mapping is unmapped right below and never touched.
    let p = unsafe { libc::syscall(libc::SYS_mmap, 0usize, len, prot, flags, fd, 0i64) };
    if p == -1 {
        return Err(errno());
    }
    // SAFETY: `p..p+len` is the mapping just made, owned by nobody else.
    unsafe { libc::munmap(p as *mut libc::c_void, len) };
    Ok(())
}

/// A UVM ioctl: `cmd` (a plain number) with `params`, exactly the ABI table's size for it;
/// returns the syscall result or the errno. `params` is updated in place.
pub fn uvm_ioctl(fd: &impl AsRawFd, cmd: u32, params: &mut [u8]) -> Result<i32, i32> {
    // SAFETY: `params` is an exclusive, live buffer of the size the UVM command copies in and
    // out (the callers pass the table's size), and the command's params hold no pointers.
    let r = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            cmd as libc::Ioctl,
            params.as_mut_ptr().cast::<libc::c_void>(),
        )
    };
    if r < 0 { Err(errno()) } else { Ok(r) }
}

/// Clears `FD_CLOEXEC` on `fd`, so that a child started with `exec` inherits it.
pub fn inherit(fd: &impl AsRawFd) -> io::Result<()> {
    use nix::fcntl::{F_GETFD, F_SETFD, FdFlag, fcntl};
    let flags = FdFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), F_GETFD)?);
    fcntl(fd.as_raw_fd(), F_SETFD(flags - FdFlag::FD_CLOEXEC))?;
    Ok(())
}
