//! The `ioctl-proxy` request path as a [`Backend`] of the CUSE nodes.

use std::io;
use std::sync::Arc;

use cuse_dev::Errno;
use ioctl_proxy::{Caller, ClientMemory, FdError, FdResolver, OpenId, OwnerId, Proxy, ProxyError};

use uvm::UvmProxy;

use crate::device::{Backend, FdLookup, Node};

/// One instance's proxy behind its nodes.
pub struct ProxyBackend {
    proxy: Arc<Proxy>,
}

impl ProxyBackend {
    /// Serves `proxy`.
    pub fn new(proxy: Arc<Proxy>) -> Self {
        ProxyBackend { proxy }
    }
}

fn errno_of(e: &ProxyError) -> Errno {
    Errno::from_i32(e.errno())
}

struct Lookup<'a>(FdLookup<'a>);

impl FdResolver for Lookup<'_> {
    fn resolve(&self, fd: i32) -> Result<OpenId, FdError> {
        (self.0)(fd)
            .map(OwnerId)
            .map_err(|e: io::Error| match e.raw_os_error() {
                Some(libc::EBADF) | None => FdError::Foreign,
                Some(n) => FdError::Errno(n),
            })
    }
}

impl Backend for ProxyBackend {
    fn open(&self, node: Node, _pid: u32) -> Result<u64, Errno> {
        if node == Node::Uvm {
            return Err(Errno::ENODEV); // served by UvmBackend
        }
        let id = self.proxy.open(node).map_err(|e| {
            tracing::warn!(%node, error = %e, "open failed");
            errno_of(&e)
        })?;
        if id.0 > i32::MAX as u64 {
            // The identify ioctl returns the fh as an int.
            self.proxy.release(id);
            return Err(Errno::from_i32(libc::EMFILE));
        }
        Ok(id.0)
    }

    fn release(&self, open: u64) {
        self.proxy.release(OwnerId(open));
    }

    fn mapping_fd(&self, open: u64) -> Result<(std::os::fd::OwnedFd, u64), Errno> {
        self.proxy.mapping_fd(OwnerId(open)).map_err(|e| {
            tracing::debug!(open, error = %e, "no mapping fd");
            errno_of(&e)
        })
    }

    fn ioctl(
        &self,
        open: u64,
        tid: u32,
        cmd: u32,
        arg: u64,
        mem: &mut dyn ClientMemory,
        fds: FdLookup<'_>,
    ) -> Result<i32, Errno> {
        let caller = Caller {
            pid: 0, // looked up only for an audit event (Caller::process)
            tid,
        };
        self.proxy
            .ioctl(OwnerId(open), &caller, cmd, arg, mem, &Lookup(fds))
            .map_err(|e| errno_of(&e))
    }
}

/// One instance's `/dev/nvidia-uvm` request path (`uvm::UvmProxy`) as the node's backend.
/// Its opens take ids from the frontend proxy's id space, so the fd resolution the nodes share
/// names exactly one open of one node.
pub struct UvmBackend {
    uvm: Arc<UvmProxy>,
    /// The frontend's backend (the UVM node shares its instance).
    _frontend: Arc<ProxyBackend>,
}

impl UvmBackend {
    /// Serves `uvm`.
    pub fn new(uvm: Arc<UvmProxy>, frontend: Arc<ProxyBackend>) -> Self {
        UvmBackend {
            uvm,
            _frontend: frontend,
        }
    }
}

impl Backend for UvmBackend {
    fn open(&self, node: Node, _pid: u32) -> Result<u64, Errno> {
        if node != Node::Uvm {
            return Err(Errno::ENODEV);
        }
        let id = self.uvm.open().map_err(|e| {
            tracing::warn!(error = %e, "uvm open failed");
            errno_of(&e)
        })?;
        if id.0 > i32::MAX as u64 {
            self.uvm.release(id);
            return Err(Errno::from_i32(libc::EMFILE));
        }
        Ok(id.0)
    }

    fn release(&self, open: u64) {
        self.uvm.release(OwnerId(open));
    }

    /// The host UVM file's mmap fd (offset == VA, adjust 0), unless the instance's
    /// `uvm_mmap` is off: `ENODEV`.
    fn mapping_fd(&self, open: u64) -> Result<(std::os::fd::OwnedFd, u64), Errno> {
        self.uvm
            .mmap_fd(&Caller::default(), OwnerId(open))
            .map_err(|e| {
                tracing::debug!(open, error = %e, "no uvm mapping fd");
                Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
            })
    }

    fn ioctl(
        &self,
        open: u64,
        tid: u32,
        cmd: u32,
        arg: u64,
        mem: &mut dyn ClientMemory,
        fds: FdLookup<'_>,
    ) -> Result<i32, Errno> {
        let caller = Caller {
            pid: 0, // looked up only for an audit event (Caller::process)
            tid,
        };
        self.uvm
            .ioctl(OwnerId(open), &caller, cmd, arg, mem, &Lookup(fds))
            .map_err(|e| errno_of(&e))
    }
}
