//! The `ioctl-proxy` request path as a [`Backend`] of the CUSE nodes.

use std::io;
use std::sync::{Arc, RwLock};

use cuse_dev::Errno;
use ioctl_proxy::{Caller, ClientMemory, FdError, FdResolver, OpenId, OwnerId, Proxy, ProxyError};

use uvm::UvmProxy;

use crate::device::{Backend, FdLookup, Node};
use crate::ratelimit::tenant_log;

/// One instance's proxy behind its nodes.
pub struct ProxyBackend {
    proxy: RwLock<Arc<Proxy>>,
}

impl ProxyBackend {
    /// Serves `proxy`.
    pub fn new(proxy: Arc<Proxy>) -> Self {
        ProxyBackend {
            proxy: RwLock::new(proxy),
        }
    }

    /// The proxy serving now (a restore replaces it, `checkpoint.rs`).
    pub fn proxy(&self) -> Arc<Proxy> {
        self.proxy.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Serves `proxy` from now on; returns the one it replaces.
    pub fn replace(&self, proxy: Arc<Proxy>) -> Arc<Proxy> {
        std::mem::replace(
            &mut *self.proxy.write().unwrap_or_else(|e| e.into_inner()),
            proxy,
        )
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
        let proxy = self.proxy();
        let id = proxy.open(node).map_err(|e| {
            tenant_log!(warn, &proxy.policy().name, %node, error = %e, "open failed");
            errno_of(&e)
        })?;
        if id.0 > i32::MAX as u64 {
            // The identify ioctl returns the fh as an int.
            proxy.release(id);
            return Err(Errno::from_i32(libc::EMFILE));
        }
        Ok(id.0)
    }

    fn release(&self, open: u64) {
        self.proxy().release(OwnerId(open));
    }

    fn mapping_fd(&self, open: u64) -> Result<(std::os::fd::OwnedFd, u64), Errno> {
        self.proxy().mapping_fd(OwnerId(open)).map_err(|e| {
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
        self.proxy()
            .ioctl(OwnerId(open), &caller, cmd, arg, mem, &Lookup(fds))
            .map_err(|e| errno_of(&e))
    }
}

/// One instance's `/dev/nvidia-uvm` request path (`uvm::UvmProxy`) as the node's backend.
/// Its opens take ids from the frontend proxy's id space, so the fd resolution the nodes share
/// names exactly one open of one node.
pub struct UvmBackend {
    uvm: RwLock<Arc<UvmProxy>>,
    /// The frontend's backend (the UVM node shares its instance).
    _frontend: Arc<ProxyBackend>,
}

impl UvmBackend {
    /// Serves `uvm`.
    pub fn new(uvm: Arc<UvmProxy>, frontend: Arc<ProxyBackend>) -> Self {
        UvmBackend {
            uvm: RwLock::new(uvm),
            _frontend: frontend,
        }
    }

    /// The UVM proxy serving now (a restore replaces it, `checkpoint.rs`).
    pub fn uvm(&self) -> Arc<UvmProxy> {
        self.uvm.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Serves `uvm` from now on; returns the one it replaces.
    pub fn replace(&self, uvm: Arc<UvmProxy>) -> Arc<UvmProxy> {
        std::mem::replace(
            &mut *self.uvm.write().unwrap_or_else(|e| e.into_inner()),
            uvm,
        )
    }
}

impl Backend for UvmBackend {
    fn open(&self, node: Node, _pid: u32) -> Result<u64, Errno> {
        if node != Node::Uvm {
            return Err(Errno::ENODEV);
        }
        let uvm = self.uvm();
        let id = uvm.open().map_err(|e| {
            tenant_log!(warn, &uvm.frontend().policy().name, error = %e, "uvm open failed");
            errno_of(&e)
        })?;
        if id.0 > i32::MAX as u64 {
            uvm.release(id);
            return Err(Errno::from_i32(libc::EMFILE));
        }
        Ok(id.0)
    }

    fn release(&self, open: u64) {
        self.uvm().release(OwnerId(open));
    }

    /// The host UVM file's mmap fd (offset == VA, adjust 0), unless the instance's
    /// `uvm_mmap` is off: `ENODEV`.
    fn mapping_fd(&self, open: u64) -> Result<(std::os::fd::OwnedFd, u64), Errno> {
        self.uvm()
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
        self.uvm()
            .ioctl(OwnerId(open), &caller, cmd, arg, mem, &Lookup(fds))
            .map_err(|e| errno_of(&e))
    }
}
