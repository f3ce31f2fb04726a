//! The node concept shared by the node devices, the mmap path and the instance: which node
//! ([`Node`], the request path's type), the request path behind an instance's nodes
//! ([`Backend`]), and a host node as the wires name it ([`WireNode`]).

use std::io;

use cuse_dev::Errno;
use host_driver::NodeKind;
use ioctl_proxy::{Caller, ClientMemory};
use serde::{Deserialize, Serialize};

/// Which node of an instance a device is, as the tenant sees it: the request path's node type.
pub use ioctl_proxy::Node;

/// A host node as the wires name it: the worker state of a live upgrade (JSON, `upgrade.rs`)
/// and the simulated driver's frames (`postcard`, by variant index, `simd.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireNode {
    /// `/dev/nvidiactl`.
    Ctl,
    /// `/dev/nvidia<minor>`.
    Gpu(u32),
    /// `/dev/nvidia-uvm`.
    Uvm,
}

impl From<NodeKind> for WireNode {
    fn from(n: NodeKind) -> Self {
        match n {
            NodeKind::Ctl => WireNode::Ctl,
            NodeKind::Gpu(m) => WireNode::Gpu(m),
            NodeKind::Uvm => WireNode::Uvm,
        }
    }
}

impl From<WireNode> for NodeKind {
    fn from(n: WireNode) -> Self {
        match n {
            WireNode::Ctl => NodeKind::Ctl,
            WireNode::Gpu(m) => NodeKind::Gpu(m),
            WireNode::Uvm => NodeKind::Uvm,
        }
    }
}

/// Resolves a caller's fd number to the open id of one of the instance's files.
pub type FdLookup<'a> = &'a dyn Fn(i32) -> io::Result<u64>;

/// The request path behind the nodes of one instance.
pub trait Backend: Send + Sync + 'static {
    /// A client opened `node`: returns the open's id (used as the CUSE `fh`, below 2^31).
    fn open(&self, node: Node, pid: u32) -> Result<u64, Errno>;
    /// The last reference to the open file is gone.
    fn release(&self, open: u64);
    /// The fd the mmap shim maps for an `mmap` of open file `open`, with the offset to add to
    /// the caller's (see `HostFile::mmap_fd`). Default: ENODEV, as CUSE's own mmap answers.
    fn mapping_fd(&self, open: u64) -> Result<(std::os::fd::OwnedFd, u64), Errno> {
        let _ = open;
        Err(Errno::ENODEV)
    }

    /// One ioctl of thread `caller.tid`. `mem` is the caller's memory; `fds` resolves fd
    /// numbers inside params.
    fn ioctl(
        &self,
        open: u64,
        caller: Caller,
        cmd: u32,
        arg: u64,
        mem: &mut dyn ClientMemory,
        fds: FdLookup<'_>,
    ) -> Result<i32, Errno>;
}
