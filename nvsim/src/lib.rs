//! A simulated NVIDIA kernel driver behind `ioctl-proxy`'s [`HostDriver`] trait, for tests and
//! `nvproxy serve --driver sim`.
//!
//! It models the driver, not a yes-machine: RM clients and objects with the resource server's
//! handle rules and status codes, files with their `REGISTER_FD` links and the clients they
//! own, OS events, GPU attach state and memory accounting, and the escapes and controls of a
//! CUDA initialisation answered with the values of the configured GPUs (by default an H100
//! SXM5 80GB on driver 535.261.03). Behaviour follows the open kernel driver's source
//! (`kernel-open/nvidia/nv.c`, `src/nvidia/arch/nvalloc/unix/src/{escape,osapi}.c`,
//! `src/nvidia/src/kernel/rmapi/*`, `src/nvidia/src/libraries/resserv/src/*`); where the
//! simulator simplifies, the item says so.
//!
//! ```
//! use ioctl_proxy::{HostDriver, NodeKind};
//! use nvsim::{SimConfig, SimDriver};
//!
//! let drv = SimDriver::new(SimConfig::default_gpus(2));
//! let ctl = drv.open(NodeKind::Ctl).unwrap();
//! assert!(drv.open(NodeKind::Gpu(7)).is_err()); // no GPU on minor 7: ENODEV
//! drop(ctl);
//! assert_eq!(drv.stats().open_files, 0);
//! ```
//!
//! # The call contract
//! A call is a [`HostCall`](ioctl_proxy::HostCall): `cmd` is the full ioctl number, `params`
//! the top-level struct (exactly `_IOC_SIZE(cmd)` bytes, else `EFAULT`, as the driver's copy
//! would fault), and `nested` the buffers that embedded pointers name: `parent: None` for a
//! pointer in `params` at `offset`, `Some(j)` for one inside `nested[j]`. An absent entry is a
//! NULL pointer; pointer values themselves are never read. fd fields carry
//! [`HostFile::id`](ioctl_proxy::HostFile::id) values of this driver's files.
//!
//! # What is not simulated
//! UVM (`/dev/nvidia-uvm` opens, every ioctl answers `ENOTTY`); mmap and the memory escapes
//! (`RM_ALLOC_MEMORY`, `RM_MAP_MEMORY`, `RM_VID_HEAP_CONTROL`, DMA mapping, dma-buf export answer
//! `NV_ERR_NOT_SUPPORTED` in their status); classes other than clients, device, subdevice,
//! OS events, `NV01_MEMORY_SYSTEM`, `NV01_MEMORY_LOCAL_USER` and `FERMI_VASPACE_A`
//! (`NV_ERR_INVALID_CLASS`); controls other than those in [`control::cmd`]
//! (`NV_ERR_NOT_SUPPORTED`); NUMA, I2C, registry and event-data escapes (`EINVAL`).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod buf;
mod config;
pub mod control;
mod driver;
mod escape;
pub mod rm;
pub mod status;

pub use config::{DEFAULT_VERSION, SimConfig, SimGpu};
pub use driver::{SimDriver, SimFile, SimStats};

/// Why a [`SimConfig`] cannot be simulated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The version has no node in the ABI tree, so its layouts are unknown.
    #[error("no ABI tables for driver {0}")]
    Version(#[source] nvproxy_abi::AbiError),
    /// Two GPUs share a minor number.
    #[error("two GPUs on minor {0}")]
    DuplicateMinor(u32),
    /// Two GPUs share a PCI address (hence an RM GPU id).
    #[error("two GPUs with GPU id {0:#x} (same PCI domain/bus/device)")]
    DuplicateGpuId(u32),
    /// The driver supports at most 32 GPUs.
    #[error("{0} GPUs configured; the driver supports at most 32")]
    TooManyGpus(usize),
}
