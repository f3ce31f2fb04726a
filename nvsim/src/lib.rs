//! A simulated NVIDIA kernel driver behind `host-driver`'s [`HostDriver`](host_driver::HostDriver) trait, for tests and
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
//! use host_driver::{HostDriver, NodeKind};
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
//! A call is a [`HostCall`](host_driver::HostCall): `cmd` is the full ioctl number, `params`
//! the top-level struct (exactly `_IOC_SIZE(cmd)` bytes, else `EFAULT`, as the driver's copy
//! would fault), and `nested` the buffers that embedded pointers name: `parent: None` for a
//! pointer in `params` at `offset`, `Some(j)` for one inside `nested[j]`. An absent entry is a
//! NULL pointer; pointer values themselves are never read. fd fields carry
//! [`HostFile::id`](host_driver::HostFile::id) values of this driver's files.
//!
//! # What is simulated
//! - Files: `open` of the control node, of `/dev/nvidia<minor>` (`ENODEV` without a GPU on that
//!   minor) and of `/dev/nvidia-uvm`; ids `(instance + 1) << 16 | n`, unique across instances.
//!   Dropping a file releases it like `nvidia_close`: the RM clients whose OS info is the file
//!   are freed, its OS events go, its GPU references are dropped. A control file named by a
//!   `REGISTER_FD` stays alive until the registering file is released (the driver holds it
//!   with `fget`).
//! - Escapes: `CHECK_VERSION_STR` (strict, relaxed, query), `SYS_PARAMS`, `CARD_INFO`,
//!   `REGISTER_FD`, `ATTACH_GPUS_TO_FD`, `ALLOC_OS_EVENT`, `FREE_OS_EVENT`, `STATUS_CODE`,
//!   `WAIT_OPEN_COMPLETE` (550+), `RM_ALLOC` (NVOS21 and NVOS64), `RM_ALLOC_OBJECT`, `RM_FREE`,
//!   `RM_CONTROL`, `RM_DUP_OBJECT`, `RM_SHARE`, `RM_MAP_MEMORY`, `RM_UNMAP_MEMORY`,
//!   `RM_ALLOC_MEMORY` (`NV01_MEMORY_SYSTEM`, and `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR` backed by
//!   the client's own file through `HostFile::ioctl_with_pages`), and `NV_ESC_IOCTL_XFER_CMD` around any of
//!   them.
//! - Memory the CPU can see: memory objects are backed by memfds (created when first mapped or
//!   written); `RM_MAP_MEMORY` checks the range and the target file as the driver does and
//!   stores an mmap context in the file named by `fd`; a file's
//!   [`HostFile::mmap_fd`](host_driver::HostFile::mmap_fd) is a dup of the memfd its context
//!   names plus the context's offset, so bytes written through a client's mapping are what
//!   [`SimDriver::memory_read`] returns, and [`SimDriver::memory_write`] shows in the mapping.
//!   Files from `open_mapping` fail every ioctl with `EACCES`, as the real daemon's
//!   Landlock-restricted mapping files do (a memfd is not a device, so Landlock itself has
//!   nothing to restrict here).
//! - UVM (`uvm.rs`): the UVM file model (uninitialised, va_space, mm file) with the driver's
//!   statuses for `INITIALIZE`, `MM_INITIALIZE`, GPU and GPU-VA-space registration, peers,
//!   range groups, external ranges and mappings, semaphore pools, dynamic-parallelism regions,
//!   `FREE`, `VALIDATE_VA_RANGE`, the policy commands and `MIGRATE`. Each va_space is backed by
//!   a sparse memfd whose offset is the virtual address: `HostFile::mmap_fd` of a UVM file is
//!   that memfd with offset adjust 0, so a client's `mmap` at VA == offset shares bytes with
//!   [`SimDriver::uvm_read`] / [`SimDriver::uvm_write`], and such mappings (read from
//!   `/proc/*/maps`) are the managed ranges `VALIDATE_VA_RANGE` and the policy commands see.
//! - Classes: `NV01_ROOT*` (client handles `0xc1d00000 | n`, or the caller's `hRoot`),
//!   `NV01_DEVICE_0`, `NV20_SUBDEVICE_0`, `NV01_EVENT` / `NV01_EVENT_OS_EVENT`,
//!   `NV01_MEMORY_SYSTEM`, `NV01_MEMORY_LOCAL_USER` (placed in the GPU's books of its memory, `fb.rs`),
//!   `FERMI_VASPACE_A` (with its VA range) and `NV50_MEMORY_VIRTUAL` (reserved ranges in it,
//!   see `vaspace.rs`); driver-chosen object handles from `0xcaf00000`.
//! - Channels (`fifo.rs`): `KEPLER_CHANNEL_GROUP_A` (TSGs, with legacy mode's RM-allocated
//!   context shares), `FERMI_CONTEXT_SHARE_A` (subcontext ids), `HOPPER_CHANNEL_GPFIFO_A`
//!   (GPFIFO ring, client USERD, channel ids per runlist, error notifier, work-submit token),
//!   `HOPPER_COMPUTE_A` and `HOPPER_DMA_COPY_A` objects, with their constructors' checks and
//!   statuses; the TSG and channel controls (`GPFIFO_SCHEDULE`, timeslice, interleave,
//!   `GET_CLASS_ENGINEID`, `GPFIFO_GET_WORK_SUBMIT_TOKEN`, the token notifier index),
//!   `FIFO_GET_CHANNELLIST`, `GR_GET_CTX_BUFFER_SIZE` (0: no GR context buffers exist),
//!   `MC_SERVICE_INTERRUPTS`; `UVM_REGISTER_CHANNEL`.
//! - The front end (`gpfifo.rs`): the `HOPPER_USERMODE_A` doorbell (a memfd, watched while
//!   channels exist) makes the simulator execute GPFIFO entries through the channel's GPU VA
//!   space (UVM external mappings and managed memory, backed by memfds): host semaphores,
//!   non-stall interrupts (counted on the OS events), the copy engine's copies and memsets,
//!   the compute class' inline-to-memory and report semaphores; other compute methods are
//!   recorded; a compute launch raises the channel error a faulting launch raises (no SMs);
//!   SM debugger sessions (`GT200_DEBUGGER`) and their exception-mask / MMU-debug controls,
//!   OS events on channels, engine objects and debugger sessions, the compute preemption
//!   mode and channel resets, recorded without effect (nothing runs on SMs).
//! - `RM_UPDATE_DEVICE_MAPPING_INFO` (a CPU mapping's new address).
//! - `RM_VID_HEAP_CONTROL`'s `ALLOC_SIZE`, translated onto `RM_ALLOC` as the driver does.
//! - Legacy GSS controls (answered by GSP firmware on a real GPU): only those whose firmware
//!   answer has been measured (`gss_legacy.rs`); the rest `NV_ERR_NOT_SUPPORTED`.
//! - Controls: those in [`control::cmd`], answered with the [`SimGpu`] values.
//! - Status codes of the resource server for unknown clients, parents and objects, duplicate
//!   handles, wrong parent classes, clients used from another file (strict client validation),
//!   frees of unknown objects (`NV_OK`: compatibility mode), unknown classes and controls,
//!   wrong control param sizes; see the tests for the full list.
//!
//! # What is not simulated
//! UVM range groups (`SET_RANGE_GROUP`, `MIGRATE_RANGE_GROUP`: `NV_ERR_NOT_SUPPORTED`), HMM and
//! ATS, and the UVM commands outside the ABI tables (`EINVAL`); what needs the SMs (compute
//! launches), block-linear and physical copy-engine addressing, waking `poll` on OS events (the
//! `HostDriver` boundary has no poll hook), MIG/vGPU/confidential-computing channels, bare
//! channels without a TSG; the other memory escapes
//! (`RM_VID_HEAP_CONTROL` functions other than `ALLOC_SIZE`, DMA mapping, dma-buf export,
//! `RM_ALLOC_MEMORY` of classes other than
//! `NV01_MEMORY_SYSTEM` (and OS descriptors without the client's pages), `RM_MAP_MEMORY_DMA` answer `NV_ERR_NOT_SUPPORTED` in their status); register (device,
//! subdevice) mappings and the driver's `mmap`-time checks on the VMA (see `memory.rs`);
//! classes other than clients, device, subdevice,
//! OS events, `NV01_MEMORY_SYSTEM`, `NV01_MEMORY_LOCAL_USER`, `FERMI_VASPACE_A`,
//! `NV50_MEMORY_VIRTUAL`, `HOPPER_USERMODE_A`, `NV_CONFIDENTIAL_COMPUTE` and the channel classes
//! above (`NV_ERR_INVALID_CLASS`; EGM, `NV_MEMORY_EXTENDED_USER`, gets `NV_ERR_INVALID_ARGUMENT`
//! as on a GPU without local EGM); controls other than those in [`control::cmd`]
//! (`NV_ERR_NOT_SUPPORTED`); NUMA, I2C, registry and event-data escapes (`EINVAL`).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod buf;
pub mod caller;
mod channel;
mod config;
pub mod control;
mod control_ctx;
mod control_init;
mod control_smi;
mod dispatch;
mod driver;
mod escape;
mod fb;
mod fifo;
mod gpfifo;
mod gpfifo_state;
pub mod gss_legacy;
mod memory;
mod memory_state;
pub mod perf;
pub mod procfs;
pub mod rm;
pub mod status;
pub mod sysfs;
mod sysmem;
mod uvm;
mod uvm_state;
mod vaspace;
mod vidheap;

pub use config::{DEFAULT_HOST_MEMORY, DEFAULT_VERSION, SimConfig, SimError, SimGpu};
pub use dispatch::SimFile;
pub use driver::{SimDriver, SimStats};
pub use gpfifo::ChannelStatus;
pub use gpfifo_state::ExecStats;
