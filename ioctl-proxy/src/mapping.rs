//! RM memory mappings: the mmap target of `NV_ESC_RM_MAP_MEMORY` and of
//! `NV_ESC_RM_ALLOC_MEMORY` with system memory mapped at once.
//!
//! The driver's protocol (`src/nvidia/arch/nvalloc/unix/src/escape.c`, `osapi.c`
//! `RmCreateMmapContextLocked`, `kernel-open/nvidia/nv-usermap.c`
//! `nv_add_mapping_context_to_file`, `nv-mmap.c` `nvidia_mmap_helper`): the client opens a new
//! frontend file F, names F's fd in the escape's `fd` field, the driver stores an *mmap context*
//! in F's private data (one per file, for the file's lifetime: a second one is
//! `NV_ERR_STATE_IN_USE`), and the client `mmap`s F at offset 0.
//!
//! CUSE cannot `mmap`, so the tenant maps a host fd instead (DESIGN.md section 5). The proxy
//! gives each client open F, when it is first named as an mmap target, its own *mapping host
//! file* ([`HostDriver::open_mapping`](crate::HostDriver::open_mapping) on F's node: the real
//! driver opens it from a Landlock-restricted thread, so nobody can issue device ioctls on it),
//! substitutes that file's id in `fd`, and later hands [`Proxy::mapping_fd`] to the mmap shim.
//! The mapping file lives as long as F's open (released with it).
//!
//! The proxy tracks whether F's mapping file has a context, so that a second target use is
//! answered as the driver would without reaching it, and a concurrent pair cannot both
//! believe they set it: the slot is *pending* while the host call runs and becomes *set* only
//! when the driver said `NV_OK`.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use tenant_log::tenant_log;

use crate::audit::Decision;
use crate::error::ProxyError;
use crate::kit::Stop;
use crate::mapping_slot::{Context, lock};
use crate::nv::NV_ERR_NOT_SUPPORTED;
use crate::proxy::{FdError, FrontendNode, OpenFile, OpenId, Proxy};
use crate::request::Req;
use host_driver::NodeKind;

/// `NV_ERR_STATE_IN_USE` (`nvstatuscodes.h`): the target file already has an mmap context.
pub(crate) const NV_ERR_STATE_IN_USE: u32 = 0x63;

/// Why an fd could not become an mmap target.
pub(crate) enum TargetError {
    /// Not an open of this instance (or the resolver failed).
    Fd(FdError),
    /// The open already has an mmap context, or one is being created.
    InUse,
    /// The host cannot give a mapping file: no mmap path (no Landlock ABI 5 and no opt-in, or a
    /// driver without one).
    NoMmapPath,
    /// Opening the mapping file failed otherwise.
    Host(io::Error),
}

/// An mmap target reserved for one host call: its slot is `Pending` until [`Target::commit`];
/// dropped uncommitted, the slot goes back to no context.
pub(crate) struct Target {
    open: Arc<OpenFile>,
    /// The mapping file's id, to put in the `fd` field.
    pub(crate) id: i32,
    committed: bool,
}

impl Target {
    /// The host call ended: `ok` when the driver created the context.
    pub(crate) fn commit(mut self, ok: bool) {
        lock(&self.open.mapping).context = if ok { Context::Set } else { Context::None };
        self.committed = true;
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if !self.committed {
            lock(&self.open.mapping).context = Context::None;
        }
    }
}

impl Req<'_> {
    /// Resolves the caller's fd `fd` to an open of this instance and reserves that open's
    /// mapping file (created on first use) as the target of an mmap context.
    pub(crate) fn mapping_target(&mut self, fd: i32) -> Result<Target, TargetError> {
        if fd < 0 {
            return Err(TargetError::Fd(FdError::Foreign));
        }
        let open = self.fds.resolve(fd).map_err(TargetError::Fd)?;
        let file = self
            .px
            .file(open)
            .ok_or(TargetError::Fd(FdError::Foreign))?;
        let mut slot = lock(&file.mapping);
        if slot.context != Context::None {
            return Err(TargetError::InUse);
        }
        let id = match &slot.file {
            Some(f) => f.id(),
            None => {
                let node = self
                    .px
                    .host_node(file.node)
                    .map_err(|e| TargetError::Host(io::Error::from_raw_os_error(e.errno())))?;
                let f = self.px.host.open_mapping(node).map_err(|e| {
                    let no_path = e.kind() == io::ErrorKind::Unsupported
                        || e.raw_os_error() == Some(libc::ENODEV);
                    tenant_log!(warn, &self.px.policy.name, error = %e, "no mapping file for an mmap target");
                    if no_path {
                        TargetError::NoMmapPath
                    } else {
                        TargetError::Host(e)
                    }
                })?;
                let id = f.id();
                slot.file = Some(f);
                id
            }
        };
        slot.context = Context::Pending;
        drop(slot);
        Ok(Target {
            open: file,
            id,
            committed: false,
        })
    }

    /// [`Self::mapping_target`] for `NV_ESC_RM_MAP_MEMORY`, whose target failures the driver
    /// reports as NV statuses: a foreign fd is `NV_ERR_INVALID_ARGUMENT` (no NVIDIA file behind
    /// it: `nv_add_mapping_context_to_file`), a file with a context `NV_ERR_STATE_IN_USE`
    /// (same function); no mmap path on this host is `NV_ERR_NOT_SUPPORTED`, refused before the
    /// driver maps anything.
    pub(crate) fn mapping_target_status(&mut self, fd: i32) -> Result<Target, Stop> {
        use crate::nv::NV_ERR_INVALID_ARGUMENT;
        match self.mapping_target(fd) {
            Ok(t) => Ok(t),
            Err(TargetError::Fd(FdError::Foreign)) => Err(Stop::Status {
                status: NV_ERR_INVALID_ARGUMENT,
                decision: Decision::Denied,
                reason: "fd is not a node of this instance",
            }),
            Err(TargetError::Fd(FdError::Errno(e))) => {
                Err(Stop::Err(ProxyError::ForeignFd { fd, errno: e }))
            }
            Err(TargetError::InUse) => Err(Stop::Status {
                status: NV_ERR_STATE_IN_USE,
                decision: Decision::Failed,
                reason: "the target file already has an mmap context",
            }),
            Err(TargetError::NoMmapPath) => Err(no_mmap_path()),
            Err(TargetError::Host(e)) => Err(Stop::Err(ProxyError::Host(e))),
        }
    }

    /// [`Self::mapping_target`] for `NV_ESC_RM_ALLOC_MEMORY` with a mapping, whose context
    /// failure the driver reports as `EINVAL` (escape.c: `rm_create_mmap_context` failed →
    /// `NV_ERR_INVALID_ARGUMENT` → `-EINVAL`, after allocating); the proxy refuses before
    /// allocating. A foreign fd is `EBADF`, as for every fd field checked with an errno.
    pub(crate) fn mapping_target_errno(&mut self, fd: i32) -> Result<Target, Stop> {
        match self.mapping_target(fd) {
            Ok(t) => Ok(t),
            Err(TargetError::Fd(e)) => {
                if e == FdError::Foreign {
                    self.set_decision(Decision::Denied, "fd is not a node of this instance");
                }
                Err(Stop::Err(ProxyError::ForeignFd {
                    fd,
                    errno: e.errno(),
                }))
            }
            Err(TargetError::InUse) => {
                self.set_decision(
                    Decision::Failed,
                    "the target file already has an mmap context",
                );
                Err(Stop::Err(ProxyError::MmapContextInUse))
            }
            Err(TargetError::NoMmapPath) => Err(no_mmap_path()),
            Err(TargetError::Host(e)) => Err(Stop::Err(ProxyError::Host(e))),
        }
    }
}

fn no_mmap_path() -> Stop {
    Stop::Status {
        status: NV_ERR_NOT_SUPPORTED,
        decision: Decision::Denied,
        reason: "no mmap path on this host (mapping fds need Landlock ABI >= 5 or the admin's opt-in)",
    }
}

impl Proxy {
    /// The host node a frontend node of this instance stands for.
    pub(crate) fn host_node(&self, node: FrontendNode) -> Result<NodeKind, ProxyError> {
        Ok(match node {
            FrontendNode::Ctl => NodeKind::Ctl,
            FrontendNode::Uvm => return Err(ProxyError::NotFrontend),
            FrontendNode::Gpu(i) => NodeKind::Gpu(
                self.gpus
                    .get(i as usize)
                    .ok_or(ProxyError::NoSuchGpu(i))?
                    .minor,
            ),
        })
    }

    /// The fd the tenant maps for an `mmap` of client open `open`, and the amount to add to
    /// its mmap offset: the open's mapping file's [`HostFile::mmap_fd`](host_driver::HostFile::mmap_fd) once the driver gave
    /// it an mmap context (`NV_ESC_RM_MAP_MEMORY` or `NV_ESC_RM_ALLOC_MEMORY` named the open).
    /// Without one, [`ProxyError::NoMmapContext`] (`EINVAL`, the driver's `nvidia_mmap`
    /// answer for a file without a valid context, `nv-mmap.c`).
    pub fn mapping_fd(&self, open: OpenId) -> Result<(OwnedFd, u64), ProxyError> {
        // A `match`, not `ok_or`: the error (with drop glue) is built only when needed.
        let Some(file) = self.file(open) else {
            return Err(ProxyError::UnknownOpen(open.0));
        };
        let slot = lock(&file.mapping);
        match (&slot.file, slot.context) {
            (Some(f), Context::Set) => f.mmap_fd().map_err(ProxyError::Host),
            _ => Err(ProxyError::NoMmapContext),
        }
    }

    /// Mapping host files the instance holds (one per client open that was an mmap target).
    pub fn mapping_file_count(&self) -> usize {
        self.opens()
            .values()
            .filter(|f| lock(&f.mapping).file.is_some())
            .count()
    }
}
