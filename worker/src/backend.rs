//! The request path as the [`Backend`] of an instance's nodes: one generic [`NodeBackend`]
//! over `ioctl_proxy`'s [`NodeService`], served by the frontend ([`ProxyBackend`]: `Proxy`,
//! `/dev/nvidiactl` and `/dev/nvidia<N>`) and UVM ([`UvmBackend`]: `uvm::UvmProxy`,
//! `/dev/nvidia-uvm`) alike.

use std::io;
use std::sync::{Arc, RwLock};

use cuse_dev::Errno;
use ioctl_proxy::{
    Caller, ClientMemory, FdError, FdResolver, NodeService, OpenId, OwnerId, Proxy, ProxyError,
};

use uvm::UvmProxy;

use crate::device::{Backend, FdLookup, Node};
use crate::ratelimit::tenant_log;

/// One instance's request path of one node type behind its nodes. A restore or upgrade
/// replaces the service it serves ([`NodeBackend::replace`]).
pub struct NodeBackend<S> {
    service: RwLock<Arc<S>>,
    /// The frontend's backend, for the UVM node (it shares its instance).
    _frontend: Option<Arc<ProxyBackend>>,
}

/// The frontend nodes' backend.
pub type ProxyBackend = NodeBackend<Proxy>;

/// One instance's `/dev/nvidia-uvm` request path (`uvm::UvmProxy`) as the node's backend.
/// Its opens take ids from the frontend proxy's id space, so the fd resolution the nodes share
/// names exactly one open of one node.
pub type UvmBackend = NodeBackend<UvmProxy>;

impl<S> NodeBackend<S> {
    /// The service serving now (a restore replaces it, `checkpoint.rs`).
    fn serving(&self) -> Arc<S> {
        self.service
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Serves `service` from now on; returns the one it replaces.
    pub fn replace(&self, service: Arc<S>) -> Arc<S> {
        std::mem::replace(
            &mut *self.service.write().unwrap_or_else(|e| e.into_inner()),
            service,
        )
    }
}

impl ProxyBackend {
    /// Serves `proxy`.
    pub fn new(proxy: Arc<Proxy>) -> Self {
        NodeBackend {
            service: RwLock::new(proxy),
            _frontend: None,
        }
    }

    /// The proxy serving now (a restore replaces it, `checkpoint.rs`).
    pub fn proxy(&self) -> Arc<Proxy> {
        self.serving()
    }
}

impl UvmBackend {
    /// Serves `uvm`, next to the instance's frontend backend.
    pub fn new(uvm: Arc<UvmProxy>, frontend: Arc<ProxyBackend>) -> Self {
        NodeBackend {
            service: RwLock::new(uvm),
            _frontend: Some(frontend),
        }
    }

    /// The UVM proxy serving now (a restore replaces it, `checkpoint.rs`).
    pub fn uvm(&self) -> Arc<UvmProxy> {
        self.serving()
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

impl<S: NodeService + 'static> Backend for NodeBackend<S> {
    fn open(&self, node: Node, _pid: u32) -> Result<u64, Errno> {
        let service = self.serving();
        if !service.serves(node) {
            return Err(Errno::ENODEV); // served by the instance's other backend
        }
        let id = service.open_node(node).map_err(|e| {
            let instance = &service.instance().policy().name;
            tenant_log!(warn, instance, %node, error = %e, "open failed");
            errno_of(&e)
        })?;
        if id.0 > i32::MAX as u64 {
            // The identify ioctl returns the fh as an int.
            service.release_open(id);
            return Err(Errno::from_i32(libc::EMFILE));
        }
        Ok(id.0)
    }

    fn release(&self, open: u64) {
        self.serving().release_open(OwnerId(open));
    }

    /// The open's mapping fd (frontend: the RM mapping file; UVM: the host UVM file's mmap fd,
    /// offset == VA, adjust 0, unless the instance's `uvm_mmap` is off: `ENODEV`).
    fn mapping_fd(&self, open: u64) -> Result<(std::os::fd::OwnedFd, u64), Errno> {
        self.serving()
            .mmap_fd(&Caller::default(), OwnerId(open))
            .map_err(|e| {
                tracing::debug!(open, error = %e, "no mapping fd");
                Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
            })
    }

    fn ioctl(
        &self,
        open: u64,
        caller: Caller,
        cmd: u32,
        arg: u64,
        mem: &mut dyn ClientMemory,
        fds: FdLookup<'_>,
    ) -> Result<i32, Errno> {
        let service = self.serving();
        ioctl_proxy::service::ioctl(
            &*service,
            OwnerId(open),
            &caller,
            cmd,
            arg,
            mem,
            &Lookup(fds),
        )
        .map_err(|e| errno_of(&e))
    }
}
