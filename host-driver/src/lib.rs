//! The boundary to the driver: the real one on a GPU host ([`real::RealHostDriver`]), or
//! `nvsim`. Like the kvm-bindings / kvm-ioctls cut: `nvproxy-abi` holds the data, this crate
//! the calls; the request path (`ioctl-proxy`) and the simulator both depend on it, and the
//! simulator no longer depends on the request path.
//!
//! A proxied call reaches the driver as a [`HostCall`]: the top-level parameter struct (with its
//! fd fields already replaced by host file ids) plus the daemon-side buffers that its embedded
//! pointers name. The real implementation patches each buffer's address into its parent before
//! the `ioctl`; the simulated driver reads the buffers by position instead of dereferencing
//! anything, so neither the trait nor `nvsim` needs `unsafe`.

#![deny(missing_docs)]
#![deny(unsafe_code)]

use std::io;
use std::sync::Arc;

#[allow(unsafe_code)]
pub mod real;
pub mod restricted;

/// Which host device node a file is open on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeKind {
    /// `/dev/nvidiactl`.
    Ctl,
    /// `/dev/nvidia<minor>`.
    Gpu(u32),
    /// `/dev/nvidia-uvm`.
    Uvm,
}

/// The value a pointer field of [`HostCall::params`] (or of a nested buffer) holds when a
/// [`NestedBuf`] stands for it: non-null, so a driver that only tests for NULL sees "present",
/// and non-canonical on x86_64 and arm64, so a backend that forgot to patch it makes the driver
/// fault instead of touching daemon memory. Pointer fields without a buffer are 0: a client
/// address never reaches the host.
pub const NESTED_PTR_PLACEHOLDER: u64 = 0xdead_5a5a_0000_0000;

/// A daemon-side buffer that an embedded pointer of a [`HostCall`] refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NestedBuf {
    /// The buffer holding the pointer: `None` for the top-level params, `Some(i)` for
    /// `nested[i]` (pointers inside pointed-to buffers, e.g. RM_CONTROL params that carry their
    /// own pointers).
    pub parent: Option<usize>,
    /// Byte offset of the 8-byte pointer inside its parent.
    pub offset: usize,
    /// The buffer itself; the driver reads and writes it in place.
    pub data: NestedData,
}

/// A nested buffer's bytes: most are a few dozen (a control's or an allocation's params), kept
/// inline up to 64.
pub type NestedData = smallvec::SmallVec<[u8; 64]>;

/// `len` zero bytes as [`NestedData`]. Above the inline 64 bytes, allocated with `malloc` and
/// filled, not with `calloc` (what `SmallVec::from_elem(0, n)` takes): glibc's `calloc`
/// skips its per-thread cache, so every nested buffer of a request (a class list, a
/// control's larger params) cost ~400 instructions of allocator instead of ~60.
#[expect(
    clippy::slow_vector_initialization,
    reason = "vec![0; n] is the calloc this avoids"
)]
pub fn zeroed_nested(len: usize) -> NestedData {
    if len <= 64 {
        return NestedData::from_elem(0, len);
    }
    let mut v = Vec::with_capacity(len);
    v.resize(len, 0);
    NestedData::from_vec(v)
}

/// A call's nested buffers: most calls name one or two (a control's params, an allocation's
/// params and rights), kept inline.
pub type NestedBufs = smallvec::SmallVec<[NestedBuf; 2]>;

/// One ioctl as the driver sees it, after translation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCall {
    /// The full ioctl command number (`_IOWR('F', nr, size)` or a UVM number).
    pub cmd: u32,
    /// The top-level parameter struct, read and written in place.
    pub params: NestedData,
    /// Buffers named by pointers in `params` or in other nested buffers.
    pub nested: NestedBufs,
}

/// Client memory a call names by address and the driver is to use in place
/// (`NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`: the driver pins the pages at `pMemory` in the *calling*
/// process, which is the daemon). The client's pages at that address are a shared mapping of
/// `file` from offset 0 (the in-container shim puts them there); the backend uses the file's
/// pages instead of any address: the real driver gets the address of the daemon's own shared
/// mapping of `file` in the pointer field, `nvsim` reads and writes `file`.
#[derive(Debug, Clone)]
pub struct ClientPages {
    /// The file whose first `len` bytes are the pages (a dup of the client's own fd, so its
    /// access mode is the client's: read-only stays read-only).
    pub file: Arc<std::fs::File>,
    /// Bytes from offset 0 that the call covers (`limit + 1`).
    pub len: u64,
    /// Offset in [`HostCall::params`] of the 8-byte address field that names the pages.
    pub ptr_offset: usize,
}

/// A file the daemon holds open on a host node.
pub trait HostFile: Send + Sync + std::fmt::Debug {
    /// The node this file is open on.
    fn node(&self) -> NodeKind;
    /// The number that stands for this file inside translated params (fd fields such as
    /// `REGISTER_FD.ctl_fd` carry it): the real fd number for the host driver.
    fn id(&self) -> i32;
    /// Performs the ioctl. `Ok(ret)` is the syscall's non-negative return; driver-level failures
    /// are NV status codes inside the params, as on the real driver.
    fn ioctl(&self, call: &mut HostCall) -> io::Result<i32>;

    /// A file descriptor the *client* may `mmap` in place of this file, and the amount to add
    /// to the client's mmap offset. The in-container shim maps it with the caller's exact
    /// address, length, protection and flags. Real driver: a dup of this host fd (offset 0).
    /// `nvsim`: a memfd that carries the memory this file's mmap context names. Default: ENODEV
    /// (the file cannot be mapped).
    fn mmap_fd(&self) -> io::Result<(std::os::fd::OwnedFd, u64)> {
        Err(io::Error::from_raw_os_error(libc::ENODEV))
    }

    /// Performs `call`, whose pointer field at `pages.ptr_offset` names client memory the driver
    /// keeps using after the call (OS-descriptor memory): the backend points it at `pages`
    /// instead. The pages stay in use until the object the call creates is freed. Default:
    /// `EOPNOTSUPP` (the backend cannot use client pages).
    fn ioctl_with_pages(&self, call: &mut HostCall, pages: &ClientPages) -> io::Result<i32> {
        let _ = (call, pages);
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }

    /// This file as another process of the daemon can take it over ([`HostDriver::adopt`]):
    /// a live upgrade hands every host file of an instance to the new worker. The file stays
    /// this process's too (the real driver: a dup of the fd). Default: `EOPNOTSUPP` (a driver
    /// whose files live in this process cannot hand them over).
    fn hand_over(&self) -> io::Result<HandedFile> {
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }
}

/// A host file in transit between two processes of the daemon ([`HostFile::hand_over`],
/// [`HostDriver::adopt`]).
#[derive(Debug)]
pub struct HandedFile {
    /// Its node.
    pub node: NodeKind,
    /// The file itself when the driver's files are fds (the real driver), sent with
    /// `SCM_RIGHTS`.
    pub fd: Option<std::os::fd::OwnedFd>,
    /// What names it to its driver otherwise (a simulated driver process: its file handle).
    pub token: u64,
    /// [`HostFile::id`] as the driver knows it (the real driver: ignored, the fd number is the
    /// new process's).
    pub id: i32,
    /// Opened by [`HostDriver::open_mapping`] (may be handed to the tenant).
    pub mapping: bool,
}

/// The driver behind the proxy.
pub trait HostDriver: Send + Sync {
    /// The driver's version string, e.g. `535.261.03`; selects the ABI table.
    fn version(&self) -> &str;
    /// Opens a new host file on `node` (every client open gets its own).
    fn open(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>>;

    /// Opens a host file on `node` that serves only as an mmap target
    /// (`NV_ESC_RM_MAP_MEMORY.fd`): its [`HostFile::mmap_fd`] is handed to the tenant, so the
    /// real implementation opens it from a Landlock-restricted thread, which makes every device
    /// ioctl on it fail with `EACCES` in any process. Default: ENODEV (no mmap path).
    fn open_mapping(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        let _ = node;
        Err(io::Error::from_raw_os_error(libc::ENODEV))
    }

    /// What another process of the daemon needs to reach this driver's state (a live
    /// upgrade): `None` for the real driver (the kernel's state belongs to the files); a
    /// simulated driver process's session. Default: `EOPNOTSUPP` (the driver's state lives in
    /// this process).
    fn hand_over_driver(&self) -> io::Result<Option<HandedFile>> {
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }

    /// Takes over a file another process of the daemon handed over ([`HostFile::hand_over`]).
    /// Default: `EOPNOTSUPP`.
    fn adopt(&self, file: HandedFile) -> io::Result<Arc<dyn HostFile>> {
        let _ = file;
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_zeroed_nested_is_len_zero_bytes_inline_or_not() {
        for len in [0, 1, 64, 65, 256, 4096] {
            let d = zeroed_nested(len);
            assert_eq!(d.len(), len);
            assert!(d.iter().all(|&b| b == 0));
            assert_eq!(d.spilled(), len > 64, "len {len}");
        }
    }
}
