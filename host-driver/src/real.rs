//! The real NVIDIA driver behind [`HostDriver`]: host device nodes opened by the daemon, ioctls
//! issued with `libc::ioctl`. The only module of this crate with `unsafe` (the syscall).
//!
//! A [`HostCall`]'s nested buffers are daemon memory; before the syscall each buffer's address
//! is written into its parent (the params or another nested buffer) at its offset
//! ([`patch_pointers`], a safe function over byte buffers, unit-tested), so the driver's
//! `copy_from_user`/`copy_to_user` on those pointers land in the daemon's buffers. Pointer
//! fields without a buffer were set to 0 by the proxy, so no client address reaches the driver.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nvproxy_abi::DriverVersion;
use nvproxy_abi::ioctl::ioc_size;

use crate::restricted::open_restricted;
use crate::{ClientPages, HostCall, HostDriver, HostFile, NestedBuf, NodeKind};

/// Writes the address of every nested buffer (as `addr_of` gives it) into its parent at its
/// offset. Fails, touching nothing, if a parent index is out of range or the buffer itself, or
/// an offset does not leave room for 8 bytes in the parent.
pub fn patch_pointers(
    call: &mut HostCall,
    mut addr_of: impl FnMut(usize, &NestedBuf) -> u64,
) -> io::Result<()> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
    for (i, n) in call.nested.iter().enumerate() {
        let parent_len = match n.parent {
            None => call.params.len(),
            Some(p) if p != i => call
                .nested
                .get(p)
                .map(|b| b.data.len())
                .ok_or_else(|| bad(format!("nested buffer {i}: parent {p} does not exist")))?,
            Some(_) => return Err(bad(format!("nested buffer {i} is its own parent"))),
        };
        if n.offset.checked_add(8).is_none_or(|end| end > parent_len) {
            return Err(bad(format!(
                "nested buffer {i}: pointer at {} outside its {parent_len}-byte parent",
                n.offset
            )));
        }
    }
    let addrs: Vec<u64> = call
        .nested
        .iter()
        .enumerate()
        .map(|(i, n)| addr_of(i, n))
        .collect();
    for (i, addr) in addrs.into_iter().enumerate() {
        let (parent, off) = (call.nested[i].parent, call.nested[i].offset);
        let target = match parent {
            None => &mut call.params[..],
            Some(p) => &mut call.nested[p].data[..],
        };
        target[off..off + 8].copy_from_slice(&addr.to_ne_bytes());
    }
    Ok(())
}

/// Extracts the driver version from the text of `/sys/module/nvidia/version` (just the
/// version) or `/proc/driver/nvidia/version` ("NVRM version: NVIDIA UNIX x86_64 Kernel Module
/// 535.261.03  Wed ..."): the first whitespace-separated word that is a driver version.
pub fn parse_version(text: &str) -> Option<DriverVersion> {
    text.split_whitespace().find_map(|w| w.parse().ok())
}

/// The host's NVIDIA driver.
#[derive(Debug)]
pub struct RealHostDriver {
    dev_dir: PathBuf,
    version: String,
    unrestricted_mapping_fds: bool,
}

impl RealHostDriver {
    /// The driver behind `/dev`, its version read from `/sys/module/nvidia/version` or, failing
    /// that, `/proc/driver/nvidia/version`.
    pub fn new() -> io::Result<Self> {
        let text = std::fs::read_to_string("/sys/module/nvidia/version")
            .or_else(|_| std::fs::read_to_string("/proc/driver/nvidia/version"))?;
        let version = parse_version(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no driver version in {text:?}"),
            )
        })?;
        Ok(Self::with_dev_dir("/dev", version))
    }

    /// A driver whose nodes live in `dev_dir`, with a known version (tests, containers).
    pub fn with_dev_dir(dev_dir: impl AsRef<Path>, version: DriverVersion) -> Self {
        Self {
            dev_dir: dev_dir.as_ref().to_path_buf(),
            version: version.to_string(),
            unrestricted_mapping_fds: false,
        }
    }

    /// Lets [`HostDriver::open_mapping`] fall back to an *unrestricted* host file when the
    /// kernel cannot deny device ioctls with Landlock (ABI < 5). Such a file, once handed to a
    /// tenant for `mmap`, also lets the tenant issue raw driver ioctls around the proxy: an
    /// explicit admin opt-in (`[daemon] allow_unrestricted_mmap_fds`), logged loudly.
    pub fn with_unrestricted_mapping_fds(mut self, allow: bool) -> Self {
        self.unrestricted_mapping_fds = allow;
        if allow {
            tracing::warn!(
                "allow_unrestricted_mmap_fds is set: where Landlock cannot deny device ioctls, \
                 tenants receive host driver fds they can issue raw ioctls on (no isolation)"
            );
        }
        self
    }

    fn path(&self, node: NodeKind) -> PathBuf {
        self.dev_dir.join(match node {
            NodeKind::Ctl => "nvidiactl".to_owned(),
            NodeKind::Gpu(minor) => format!("nvidia{minor}"),
            NodeKind::Uvm => "nvidia-uvm".to_owned(),
        })
    }
}

impl HostDriver for RealHostDriver {
    fn version(&self) -> &str {
        &self.version
    }

    fn open(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        // std opens with O_CLOEXEC; the driver needs read-write.
        let file: File = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.path(node))?;
        Ok(Arc::new(RealHostFile {
            node,
            fd: OwnedFd::from(file),
            mapping: false,
        }))
    }

    /// Opens `/dev/nvidiactl` or `/dev/nvidia<N>` with [`open_restricted`]: the file takes an
    /// mmap context and can be mapped by the tenant, but every device ioctl on it fails with
    /// `EACCES` in any process. Without Landlock ABI 5 this fails with
    /// [`io::ErrorKind::Unsupported`], unless [`Self::with_unrestricted_mapping_fds`] allowed
    /// a plain open.
    fn open_mapping(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        if node == NodeKind::Uvm {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let path = self.path(node);
        let fd = match open_restricted(&path) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::Unsupported && self.unrestricted_mapping_fds => {
                static WARNED: AtomicBool = AtomicBool::new(false);
                if !WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %e,
                        "handing tenants UNRESTRICTED host driver fds for mmap \
                         (allow_unrestricted_mmap_fds): they can issue raw driver ioctls on them"
                    );
                }
                OwnedFd::from(OpenOptions::new().read(true).write(true).open(&path)?)
            }
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "{e}; refusing to hand out mmap fds of {} (set [daemon] \
                         allow_unrestricted_mmap_fds = true to accept unrestricted ones)",
                        path.display()
                    ),
                ));
            }
            Err(e) => return Err(e),
        };
        Ok(Arc::new(RealHostFile {
            node,
            fd,
            mapping: true,
        }))
    }

    /// Nothing: the driver's state is the files'.
    fn hand_over_driver(&self) -> io::Result<Option<crate::HandedFile>> {
        Ok(None)
    }

    /// The fd another worker handed over: the driver's file (its RM clients, mmap context,
    /// UVM va_space) is the same open file description.
    fn adopt(&self, file: crate::HandedFile) -> io::Result<Arc<dyn HostFile>> {
        let fd = file
            .fd
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no fd came with it"))?;
        Ok(Arc::new(RealHostFile {
            node: file.node,
            fd,
            mapping: file.mapping,
        }))
    }
}

/// An open host node.
#[derive(Debug)]
pub struct RealHostFile {
    node: NodeKind,
    fd: OwnedFd,
    /// Opened by [`HostDriver::open_mapping`]: may be handed to the tenant.
    mapping: bool,
}

impl HostFile for RealHostFile {
    fn node(&self) -> NodeKind {
        self.node
    }

    fn id(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// A dup of the fd, offset unchanged: the tenant's `mmap` reaches the driver's own
    /// `nvidia_mmap` with the context this file holds (the driver wants `vm_pgoff == 0`,
    /// `nv-mmap.c`). Only mapping files ([`HostDriver::open_mapping`]) and UVM files are ever
    /// handed out: a frontend file the proxy issues ioctls on would give the tenant a raw,
    /// unrestricted driver channel, so those answer `ENODEV`.
    fn mmap_fd(&self) -> io::Result<(OwnedFd, u64)> {
        if !self.mapping && self.node != NodeKind::Uvm {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        Ok((self.fd.try_clone()?, 0))
    }

    /// A dup of the fd: the same open file description (the driver's per-file state).
    fn hand_over(&self) -> io::Result<crate::HandedFile> {
        Ok(crate::HandedFile {
            node: self.node,
            fd: Some(self.fd.try_clone()?),
            token: 0,
            id: self.fd.as_raw_fd(),
            mapping: self.mapping,
        })
    }

    fn ioctl(&self, call: &mut HostCall) -> io::Result<i32> {
        // Frontend commands carry the payload size; the buffer must be exactly that large so
        // the driver's copy_from_user/copy_to_user stay inside it. UVM numbers carry no size:
        // the caller sized the params from the ABI table.
        if self.node != NodeKind::Uvm && ioc_size(call.cmd) as usize != call.params.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "ioctl {:#010x}: {}-byte params, _IOC_SIZE {}",
                    call.cmd,
                    call.params.len(),
                    ioc_size(call.cmd)
                ),
            ));
        }
        patch_pointers(call, |_, n| n.data.as_ptr() as u64)?;
        let arg = if call.params.is_empty() {
            std::ptr::null_mut()
        } else {
            call.params.as_mut_ptr()
        };
        // SAFETY: `self.fd` is owned by `self`, so it stays open for the call. `arg` is null
        // (no params) or an exclusive, live buffer of exactly the size the command encodes
        // (checked above; for UVM, the size of the command's params struct, as the caller
        // built it), so the driver's copies of the argument stay inside it. Every pointer
        // embedded in it (or in a nested buffer) was just set by `patch_pointers` to a nested
        // buffer of `call`, sized by the proxy to what the driver copies for that pointer;
        // `call` is borrowed mutably for the whole call, so none of them moves or is freed
        // before the ioctl returns. Those sizes come from the request path's typed structs and
        // the ABI tables of `nvproxy-abi` (param struct sizes, embedded-pointer counts and
        // element sizes), which its parity test checks against the driver headers of every
        // version in the tree: a layout the driver copies differently from ours fails that test.
        let ret = unsafe { libc::ioctl(self.fd.as_raw_fd(), call.cmd as libc::Ioctl, arg) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ret)
    }

    /// Maps `pages.file` shared and read-write into the daemon (the access mode of the client's
    /// own fd decides: a read-only one fails here with `EACCES`), points the call's address
    /// field at that mapping, and issues the call: the driver pins the file's pages, which are
    /// the client's own. The daemon's mapping is removed after the call; the driver holds the
    /// pages pinned (`os_lock_user_pages`), not the mapping.
    fn ioctl_with_pages(&self, call: &mut HostCall, pages: &ClientPages) -> io::Result<i32> {
        let len = usize::try_from(pages.len)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        if pages.file.metadata()?.len() < pages.len {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let end = pages
            .ptr_offset
            .checked_add(8)
            .filter(|&e| e <= call.params.len())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a new shared mapping chosen by the kernel (no MAP_FIXED, so nothing of ours
        // is replaced) of `len` bytes of a file we hold open for the call; the result is
        // checked before use and the mapping is removed below, whatever the ioctl returns.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                pages.file.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        call.params[pages.ptr_offset..end].copy_from_slice(&(addr as u64).to_ne_bytes());
        let ret = self.ioctl(call);
        // SAFETY: exactly the mapping made above, which nothing else refers to.
        unsafe { libc::munmap(addr, len) };
        ret
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call_with(nested: Vec<NestedBuf>) -> HostCall {
        HostCall {
            cmd: 0,
            params: vec![0; 32].into(),
            nested: nested.into(),
        }
    }

    #[test]
    fn test_patch_writes_addresses_into_params_and_nested_parents() {
        let mut call = call_with(vec![
            NestedBuf {
                parent: None,
                offset: 16,
                data: vec![0; 16].into(),
            },
            NestedBuf {
                parent: Some(0),
                offset: 8,
                data: vec![0; 4].into(),
            },
        ]);
        patch_pointers(&mut call, |i, _| 0x1000 * (i as u64 + 1)).unwrap();
        assert_eq!(call.params[16..24], 0x1000u64.to_ne_bytes());
        assert_eq!(call.nested[0].data[8..16], 0x2000u64.to_ne_bytes());
    }

    #[test]
    fn test_patch_rejects_offset_past_parent_without_writing() {
        let mut call = call_with(vec![NestedBuf {
            parent: None,
            offset: 28,
            data: vec![].into(),
        }]);
        assert!(patch_pointers(&mut call, |_, _| 1).is_err());
        assert_eq!(call.params.as_slice(), [0; 32]);
    }

    #[test]
    fn test_patch_rejects_missing_or_self_parent() {
        let missing = NestedBuf {
            parent: Some(5),
            offset: 0,
            data: vec![0; 8].into(),
        };
        let own = NestedBuf {
            parent: Some(0),
            offset: 0,
            data: vec![0; 8].into(),
        };
        assert!(patch_pointers(&mut call_with(vec![missing]), |_, _| 1).is_err());
        assert!(patch_pointers(&mut call_with(vec![own]), |_, _| 1).is_err());
    }

    #[test]
    fn test_parse_version_from_proc_text() {
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jul  9 2025\n\
                    GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        assert_eq!(parse_version(text).unwrap().to_string(), "535.261.03");
    }

    #[test]
    fn test_parse_version_from_sysfs_text() {
        assert_eq!(parse_version("580.142\n").unwrap().to_string(), "580.142");
    }

    /// A directory with a regular file named `nvidiactl` standing for the node; removed when
    /// dropped.
    struct FakeDevDir(PathBuf);

    impl AsRef<Path> for FakeDevDir {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for FakeDevDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn fake_dev_dir(tag: &str) -> FakeDevDir {
        let dir = std::env::temp_dir().join(format!("nvproxy-real-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("nvidiactl"), [0u8; 4096]).unwrap();
        FakeDevDir(dir)
    }

    #[test]
    fn test_plain_host_files_are_never_handed_out_for_mmap() {
        let dir = fake_dev_dir("plain");
        let drv = RealHostDriver::with_dev_dir(&dir, "535.261.03".parse().unwrap());
        let f = drv.open(NodeKind::Ctl).unwrap();
        assert_eq!(f.mmap_fd().unwrap_err().raw_os_error(), Some(libc::ENODEV));
    }

    #[test]
    fn test_mapping_file_is_restricted_or_refused_with_the_opt_in_named() {
        let dir = fake_dev_dir("mapping");
        let drv = RealHostDriver::with_dev_dir(&dir, "535.261.03".parse().unwrap());
        match drv.open_mapping(NodeKind::Ctl) {
            Ok(f) => {
                assert!(crate::restricted::ioctl_dev_restriction_available());
                let (fd, adjust) = f.mmap_fd().unwrap();
                assert_ne!(fd.as_raw_fd(), f.id());
                assert_eq!(adjust, 0);
            }
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::Unsupported);
                assert!(e.to_string().contains("allow_unrestricted_mmap_fds"), "{e}");
            }
        }
        assert_eq!(
            drv.open_mapping(NodeKind::Uvm).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn test_unrestricted_opt_in_always_opens_a_mapping_file() {
        let dir = fake_dev_dir("optin");
        let drv = RealHostDriver::with_dev_dir(&dir, "535.261.03".parse().unwrap())
            .with_unrestricted_mapping_fds(true);
        let f = drv.open_mapping(NodeKind::Ctl).unwrap();
        assert!(f.mmap_fd().is_ok());
    }

    #[test]
    fn test_open_missing_node_fails() {
        let drv = RealHostDriver::with_dev_dir("/nonexistent", "535.261.03".parse().unwrap());
        assert!(drv.open(NodeKind::Ctl).is_err());
    }
}
