//! The frontend nodes (`/dev/nvidiactl`, `/dev/nvidia<N>`) as a [`NodeService`]: [`Proxy`]'s
//! entry ([`Proxy::ioctl`]) and its dispatch into a [`Req`].

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::audit::Kind;
use crate::error::ProxyError;
use crate::kit::Note;
use crate::memory::ClientMemory;
use crate::proxy::{Caller, FdResolver, Node, OpenFile, OpenId, Proxy};
use crate::request::Req;
use crate::service::{Call, NodeService};

impl Proxy {
    /// Proxies one ioctl of the client open `open`: [`crate::service::ioctl`], the nodes' one
    /// entry, whose contract it has.
    pub fn ioctl(
        &self,
        open: OpenId,
        caller: &Caller,
        cmd: u32,
        arg: u64,
        mem: &mut dyn ClientMemory,
        fds: &dyn FdResolver,
    ) -> Result<i32, ProxyError> {
        crate::service::ioctl(self, open, caller, cmd, arg, mem, fds)
    }
}

/// The frontend nodes (`Ctl`, `Gpu`) as a [`NodeService`].
impl NodeService for Proxy {
    type File = Arc<OpenFile>;

    /// The number becomes the escape's (`Req::dispatch`).
    const KIND: Kind = Kind::Escape;

    fn instance(&self) -> &Proxy {
        self
    }

    fn serves(&self, node: Node) -> bool {
        node != Node::Uvm
    }

    fn open_node(&self, node: Node) -> Result<OpenId, ProxyError> {
        self.open(node)
    }

    fn release_open(&self, open: OpenId) {
        self.release(open);
    }

    /// [`Proxy::mapping_fd`] (the caller is not needed: no audit event).
    fn mmap_fd(&self, _caller: &Caller, open: OpenId) -> std::io::Result<(OwnedFd, u64)> {
        self.mapping_fd(open)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
    }

    fn file(&self, open: OpenId) -> Option<Arc<OpenFile>> {
        Proxy::file(self, open)
    }

    fn node(&self, file: &Arc<OpenFile>) -> Node {
        file.node
    }

    fn dispatch(
        &self,
        file: Arc<OpenFile>,
        call: Call<'_>,
        note: &mut Note,
    ) -> Result<i32, ProxyError> {
        let Call {
            open,
            cmd,
            arg,
            mem,
            fds,
        } = call;
        Req::new(self, open, file, mem, fds, note).dispatch(cmd, arg)
    }
}
