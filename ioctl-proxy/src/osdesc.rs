//! OS-descriptor memory (`NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`): the driver pins the pages at
//! `pMemory` of the *calling process* (escape.c `RmCreateOsDescriptor`, `os_lock_user_pages`),
//! and the caller of the host ioctl is the daemon. So the plain escape is refused
//! (`request.rs` `rm_alloc_memory`), and the in-container shim asks with
//! `NVPROXY_IOC_ALLOC_OS_DESCRIPTOR` (`preload-proto`) instead: it has put the tenant's pages at
//! `pMemory` into a shared mapping of a file of its own (a memfd, offset 0) and names that fd.
//! The proxy takes its own duplicate of the fd from the caller (`ClientMemory::client_fd`,
//! `pidfd_getfd`: the same open file, so the caller's access mode stays and a read-only fd
//! cannot become writable pages) and the host gets the file's pages in place of the address
//! (`HostFile::ioctl_with_pages`): the real driver pins the daemon's shared mapping of that
//! file, `nvsim` backs the memory object with it. Either way the GPU and the tenant share the
//! tenant's own pages, and no page of the daemon is ever named.
//!
//! Hostile-tenant rules: the params are read once; the class must be the OS-descriptor class
//! (`NV_ERR_INVALID_CLASS`), the policy must allow `RM_ALLOC_MEMORY` (the class is no
//! `RM_ALLOC` class, so the tables have no entry of its own to judge), the client
//! and parent must be the instance's, the object quota must have room; at most
//! [`MAX_OS_DESCRIPTOR_BYTES`] per allocation (`NV_ERR_INSUFFICIENT_RESOURCES`); the fd must
//! be a regular file of the caller (`EBADF` otherwise) at least as long as the range (else
//! `NV_ERR_INVALID_ADDRESS`, what `os_lock_user_pages` answers for pages that are not there).
//! Per instance the live OS-descriptor objects pin at most `Quotas::os_descriptor_bytes` and
//! number at most [`MAX_OS_DESCRIPTORS`] (each is a file the simulated driver keeps open);
//! past either the allocation gets `NV_ERR_INVALID_ADDRESS`, the driver's answer when it cannot
//! pin the pages (`os_lock_user_pages`), without reaching it.
//! The object is recorded unreplayable: a restore cannot re-create the tenant's pages.

use std::mem::offset_of;
use std::os::unix::fs::FileTypeExt;
use std::sync::Arc;

use host_driver::ClientPages;
use nvproxy_abi::ioctl::{NV_ESC_RM_ALLOC_MEMORY, nv_iowr};
use nvproxy_abi::structs::{NVOS02_PARAMETERS, nv_ioctl_nvos02_parameters_with_fd};
use nvproxy_preload_proto::OsDescriptorArgs;
use tracing::debug;
use zerocopy::IntoBytes;

use crate::audit::Decision;
use crate::error::ProxyError;
use crate::kit::{Stop, deny, fail};
use crate::nv::*;
use crate::objects::Origin;
use crate::plan::{Plan, rd32};
use crate::request::Req;

/// The most bytes one OS-descriptor allocation may pin (libcuda asks 2 MiB per context).
pub const MAX_OS_DESCRIPTOR_BYTES: u64 = 1 << 30;
/// The most OS-descriptor objects an instance holds at once.
pub const MAX_OS_DESCRIPTORS: usize = 4096;

impl Req<'_> {
    /// `NVPROXY_IOC_ALLOC_OS_DESCRIPTOR`: the escape `NV_ESC_RM_ALLOC_MEMORY` of OS-descriptor
    /// memory whose pages are the caller's file (module docs). Audited as that escape.
    pub(crate) fn alloc_os_descriptor(&mut self, arg: u64) -> Result<i32, ProxyError> {
        self.note.number = u32::from(NV_ESC_RM_ALLOC_MEMORY);
        let Some(spec) = self.px.abi.escape(NV_ESC_RM_ALLOC_MEMORY).copied() else {
            self.set_decision(Decision::Denied, "unknown escape");
            return Err(ProxyError::UnknownEscape {
                nr: u32::from(NV_ESC_RM_ALLOC_MEMORY),
            });
        };
        self.note.name = spec.name.into();
        if !self.check_policy(spec.name, spec.caps) {
            return Err(ProxyError::Denied(spec.name));
        }
        let mut raw = [0u8; OsDescriptorArgs::SIZE];
        self.read_top_into(arg, &mut raw)?;
        let args = OsDescriptorArgs::from_bytes(&raw).expect("sized");
        if args.reserved != 0 {
            self.set_decision(Decision::Failed, "reserved field set");
            return Err(ProxyError::Unsupported(
                "reserved field of the OS-descriptor request",
            ));
        }
        type P = nv_ioctl_nvos02_parameters_with_fd;
        const STATUS: usize = offset_of!(P, params) + offset_of!(NVOS02_PARAMETERS, status);
        const PTR: usize = offset_of!(P, params) + offset_of!(NVOS02_PARAMETERS, pMemory);
        self.with_params(args.params, STATUS, |r, p: P| {
            let q = p.params;
            let (h_root, h_parent, h_new, class) =
                (q.hRoot, q.hObjectParent, q.hObjectNew, q.hClass);
            if class != NV01_MEMORY_SYSTEM_OS_DESCRIPTOR {
                return fail(NV_ERR_INVALID_CLASS, "not OS-descriptor memory");
            }
            r.need_client(h_root)?;
            r.need_object(h_root, h_parent, NV_ERR_INVALID_OBJECT_PARENT)?;
            r.need_room()?;
            // RmCreateOsDescriptor: a page-aligned address (the shim maps whole pages from
            // offset 0 of the file at it); os_lock_user_pages of NULL fails.
            if q.pMemory & 0xfff != 0 {
                return fail(NV_ERR_NOT_SUPPORTED, "OS descriptor not page-aligned");
            }
            if q.pMemory == 0 {
                return fail(NV_ERR_INVALID_ADDRESS, "OS descriptor at NULL");
            }
            // RmCreateOsDescriptor: limit + 1 must not wrap.
            let Some(len) = q.limit.checked_add(1) else {
                return fail(NV_ERR_INVALID_LIMIT, "limit + 1 wraps");
            };
            if len > MAX_OS_DESCRIPTOR_BYTES {
                return deny(
                    NV_ERR_INSUFFICIENT_RESOURCES,
                    "OS-descriptor memory above the proxy's bound",
                );
            }
            let fd_err = |errno| {
                Stop::Err(ProxyError::ForeignFd {
                    fd: args.memfd,
                    errno,
                })
            };
            let fd = r
                .mem
                .client_fd(args.memfd)
                .map_err(|e| fd_err(e.raw_os_error().unwrap_or(libc::EBADF)))?;
            let file = std::fs::File::from(fd);
            let meta = file.metadata().map_err(|_| fd_err(libc::EBADF))?;
            let ft = meta.file_type();
            if !ft.is_file() || ft.is_char_device() || ft.is_block_device() {
                return Err(fd_err(libc::EBADF));
            }
            if meta.len() < len {
                return fail(NV_ERR_INVALID_ADDRESS, "the file is shorter than the range");
            }
            let pages = ClientPages {
                file: Arc::new(file),
                len,
                ptr_offset: PTR,
            };
            let mut plan = Plan::new(
                nv_iowr(NV_ESC_RM_ALLOC_MEMORY, size_of::<P>()),
                p.as_bytes(),
            );
            // The host gets the pages, never the tenant's address; the client its own back.
            plan.rewrite64(None, PTR, 0);
            let _g = r.px.rm_lock();
            // Checked and recorded under the RM lock, so concurrent allocations cannot both
            // fit the last room.
            let pinned = r.px.objects().pinned();
            if pinned.objects >= MAX_OS_DESCRIPTORS
                || pinned.bytes.saturating_add(len) > r.px.policy.quotas.os_descriptor_bytes
            {
                return deny(
                    NV_ERR_INVALID_ADDRESS,
                    "the instance's OS-descriptor memory bound is reached",
                );
            }
            r.px.translate_clients(&mut plan, false);
            let ret = r
                .file
                .host
                .ioctl_with_pages(&mut plan.call, &pages)
                .map_err(ProxyError::Host)?;
            if rd32(plan.buf(None), STATUS) == NV_OK {
                let added = r.px.objects().add_pinning_object(
                    h_root,
                    h_parent,
                    h_new,
                    class,
                    &[],
                    Origin::Unreplayable("OS-descriptor memory: the tenant's own pages".into()),
                    len,
                );
                debug!(?added, h_new, len, "OS-descriptor memory recorded");
            }
            Ok(r.finish(args.params, &mut plan, Some(STATUS), ret)?)
        })
    }
}
