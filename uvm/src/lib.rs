//! `/dev/nvidia-uvm` handlers: [`UvmProxy`], one instance's UVM request path next to its
//! frontend [`ioctl_proxy::Proxy`].
//!
//! Every client open gets its own host UVM file ([`UvmProxy::open`]); its ioctls go through
//! [`UvmProxy::ioctl`]:
//!
//! 1. the command is looked up by its full number in the version's ABI table (UVM numbers
//!    carry no size; the size comes from the table). Unknown commands, and commands the
//!    instance's policy denies, fail with `EINVAL` as the driver's `uvm_ioctl` does for a
//!    command it lacks; `UVM_TOOLS_READ/WRITE_PROCESS_MEMORY` are never accepted from
//!    clients; `UVM_PAGEABLE_MEM_ACCESS_ON_GPU` needs the `video` capability (gVisor's
//!    table);
//! 2. the whole params struct is read, and checked: every GPU UUID must be one of the
//!    instance's GPUs (or the CPU where the driver accepts it), `gpuAttributesCount` arrays
//!    included; RM client and object handles must be the instance's. A refusal is the NV
//!    status the driver gives for a GPU or handle it does not know, written into `rmStatus`
//!    with ioctl success;
//! 3. fds are translated: `rmCtrlFd` must be one of the instance's frontend opens (negative
//!    passes through; the driver never reads it), `UVM_MM_INITIALIZE.uvmFd` one of its UVM
//!    opens (else `NV_ERR_INVALID_ARGUMENT`);
//! 4. `UVM_INITIALIZE` gets `UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE` forced on and hidden
//!    again in the flags the client reads back;
//! 5. the host ioctl runs on the open's host UVM file and the struct is copied back, with the
//!    client's own fd numbers.
//!
//! Audit events and counts go to the frontend proxy's sink and counts (kind `uvm`, node
//! `uvm`). [`UvmProxy::mmap_fd`] is the mmap path: the host UVM file's mmap fd, unless the
//! instance's `uvm_mmap` switch is off.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod layout;
pub mod live;
pub mod nv;
mod proxy;
mod replay;

pub use proxy::UvmProxy;
pub use replay::restore_instance;

/// Where command `cmd`'s params of `size` bytes carry the driver's `rmStatus`, for the
/// layouts this crate forwards (`None` for any other command or size: the proxy refuses
/// those, so they never reach the driver). For readers of the driver boundary, such as the
/// daemon's recording mode.
pub fn status_offset(abi: &nvproxy_abi::DriverAbi, cmd: u32, size: usize) -> Option<usize> {
    layout::fields(abi, cmd, size).map(|f| f.status)
}
