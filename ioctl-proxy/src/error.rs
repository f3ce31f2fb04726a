//! The crate's error type and its one mapping to an errno.
//!
//! Only failures the *ioctl syscall* reports are errors here. Answers the driver gives through an
//! NV status inside the params (unknown class, unknown client, bad nested pointer, ...) are not
//! errors: the proxy writes the status and the ioctl succeeds, as on the real driver.

use std::io;

use nvproxy_abi::AbiError;
use thiserror::Error;

/// Why a proxied call (or the proxy's construction) failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// `_IOC_TYPE` is not `NV_IOCTL_MAGIC` ('F').
    #[error("ioctl {cmd:#010x} is not an NVIDIA escape (type is not 'F')")]
    NotNvidia {
        /// The command.
        cmd: u32,
    },
    /// The escape number is not in the driver version's table.
    #[error("escape {nr:#x} is not in the ABI table")]
    UnknownEscape {
        /// `_IOC_NR`.
        nr: u32,
    },
    /// The UVM command is not in the driver version's table (or is never accepted from a
    /// client): the driver's `uvm_ioctl` answers an unknown command with `-EINVAL`
    /// (`uvm.c`: the default case falls to `uvm_test_ioctl`, which returns `-EINVAL` unless
    /// the module's built-in tests are enabled).
    #[error("UVM ioctl {cmd:#x} is not in the ABI table")]
    UnknownUvm {
        /// The full command number.
        cmd: u32,
    },
    /// The payload size is not one the escape accepts.
    #[error("{name}: {size}-byte payload is not acceptable")]
    BadSize {
        /// The escape.
        name: &'static str,
        /// `_IOC_SIZE` (or the `NV_ESC_IOCTL_XFER_CMD` size).
        size: u32,
    },
    /// The instance's policy denies the escape.
    #[error("{0} denied by policy")]
    Denied(&'static str),
    /// The request names a GPU outside the instance's set (`NV_ESC_ATTACH_GPUS_TO_FD`).
    #[error("GPU id {0:#x} is not in the instance's GPU set")]
    GpuNotInSet(u32),
    /// The call is valid but this proxy cannot carry it out (yet).
    #[error("{0}")]
    Unsupported(&'static str),
    /// An fd field that the driver checks with an errno named no file of this instance.
    #[error("fd {fd} is not a node of this instance")]
    ForeignFd {
        /// The caller's fd number.
        fd: i32,
        /// The errno the resolver gave (`EBADF` for a foreign or closed fd).
        errno: i32,
    },
    /// The top-level parameters could not be read or written (`copy_from_user` failed).
    #[error("bad address in client memory")]
    Fault,
    /// Client memory is not available yet: the transport must fetch more and re-run the call
    /// (retry transport only). Never reaches the client.
    #[error("client memory pending")]
    Pending,
    /// The open file id is not (or no longer) one of this proxy's.
    #[error("open file {0} unknown")]
    UnknownOpen(u64),
    /// The UVM node asked of the frontend proxy (it is the `uvm` crate's).
    #[error("/dev/nvidia-uvm is not a frontend node")]
    NotFrontend,
    /// The tenant opened a GPU node beyond its set.
    #[error("no GPU {0} in this instance")]
    NoSuchGpu(u32),
    /// The host driver failed the syscall.
    #[error("host driver: {0}")]
    Host(#[source] io::Error),
    /// The instance holds as many open files as its quota allows.
    #[error("instance {instance}: open files quota ({limit}) reached")]
    OpenQuota {
        /// The instance.
        instance: String,
        /// The quota.
        limit: usize,
    },
    /// The instance has as many requests in progress as its quota allows.
    #[error("instance {instance}: in-flight requests quota ({limit}) reached")]
    InFlightQuota {
        /// The instance.
        instance: String,
        /// The quota.
        limit: usize,
    },
    /// The driver version has no ABI table.
    #[error(transparent)]
    Abi(#[from] AbiError),
    /// The instance configuration does not fit the host.
    #[error("instance configuration: {0}")]
    Config(String),
    /// An mmap of a client open that no `NV_ESC_RM_MAP_MEMORY`/`RM_ALLOC_MEMORY` gave a
    /// context: `nvidia_mmap` answers `-EINVAL` (`nv-mmap.c`, "invalid mmap").
    #[error("the open file has no mmap context")]
    NoMmapContext,
    /// `NV_ESC_RM_ALLOC_MEMORY` named an mmap target that already has a context: the driver
    /// fails the escape with `-EINVAL` (escape.c, `rm_create_mmap_context` →
    /// `NV_ERR_STATE_IN_USE` in `nv_add_mapping_context_to_file`).
    #[error("the mmap target file already has an mmap context")]
    MmapContextInUse,
}

impl ProxyError {
    /// The errno the client sees (positive). One match, so every variant chooses one.
    ///
    /// Sources for the choices: `kernel-open/nvidia/nv.c` `nvidia_ioctl` returns `-EINVAL` for
    /// an unknown escape (escape.c `RmIoctl` default leaves `NV_ERR_GENERIC`, nv.c maps any
    /// non-OK `rm_ioctl` to `-EINVAL`), for a bad `_IOC_SIZE` (each escape's size check) and for
    /// an XFER size above `NV_ABSOLUTE_MAX_IOCTL_SIZE`; `-EFAULT` when `copy_from_user` of the
    /// argument fails.
    pub fn errno(&self) -> i32 {
        match self {
            // Not the driver's ioctl at all: the kernel convention for a foreign command.
            Self::NotNvidia { .. } => libc::ENOTTY,
            Self::UnknownEscape { .. }
            | Self::UnknownUvm { .. }
            | Self::BadSize { .. }
            | Self::Denied(_)
            | Self::GpuNotInSet(_)
            | Self::Unsupported(_)
            | Self::Config(_)
            | Self::NoMmapContext
            | Self::MmapContextInUse
            | Self::Abi(_) => libc::EINVAL,
            Self::ForeignFd { errno, .. } => *errno,
            Self::Fault => libc::EFAULT,
            Self::Pending => libc::EAGAIN,
            Self::UnknownOpen(_) => libc::EBADF,
            // nvidia_open / uvm_open when the open's state cannot be allocated.
            Self::OpenQuota { .. } => libc::ENOMEM,
            Self::InFlightQuota { .. } => libc::EAGAIN,
            Self::NoSuchGpu(_) | Self::NotFrontend => libc::ENODEV,
            Self::Host(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// Whether the transport must fetch more client memory and re-run the call.
    pub fn is_pending(&self) -> bool {
        matches!(self, Self::Pending)
    }
}
