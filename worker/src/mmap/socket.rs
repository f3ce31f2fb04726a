//! [`MmapSocket`]: the per-instance socket that hands redeemed tickets their mapping fd.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};

use super::*;
use crate::seqpacket::{SeqpacketServer, make_private_dir, make_run_root};

/// The instance socket and its accepting thread. Dropping it stops the thread and removes the
/// socket and its directory.
pub struct MmapSocket {
    server: Option<SeqpacketServer>,
    dir: PathBuf,
}

impl MmapSocket {
    /// Serves `mmap` at `<root>/<instance>/mmap.sock` (`root`: the host run directory,
    /// [`crate::paths::host_run_dir`]).
    /// The directories are 0700 (only root on the host reaches the socket by its path; clients
    /// reach it through the bind mount), the socket 0666 (any uid in the container may connect;
    /// tickets and `SO_PEERCRED` decide). A stale socket of an earlier run is replaced: the
    /// instance's nodes are registered first, so a live daemon serving this instance would have
    /// made us fail before.
    pub fn start(mmap: Arc<InstanceMmap>, root: &Path) -> Result<MmapSocket> {
        make_run_root(root)?;
        let dir = root.join(&mmap.instance);
        make_private_dir(&dir)?;
        let name = format!("mmap-{}", mmap.instance);
        let server =
            SeqpacketServer::start(&dir.join(crate::paths::MMAP_SOCKET), name, move |conn| {
                mmap.serve_peer(conn)
            })?;
        Ok(MmapSocket {
            server: Some(server),
            dir,
        })
    }

    /// Serves `mmap` on the listener another worker handed over (a live upgrade).
    pub fn adopt(mmap: Arc<InstanceMmap>, root: &Path, listener: OwnedFd) -> Result<MmapSocket> {
        let dir = root.join(&mmap.instance);
        let name = format!("mmap-{}", mmap.instance);
        let server = SeqpacketServer::serve_listener(
            listener,
            &dir.join(crate::paths::MMAP_SOCKET),
            name,
            move |conn| mmap.serve_peer(conn),
        )?;
        Ok(MmapSocket {
            server: Some(server),
            dir,
        })
    }

    /// Stops serving and returns the listener (for [`MmapSocket::adopt`], here again if the
    /// upgrade fails, or in the new worker); the socket and its directory stay.
    pub fn suspend(mut self) -> Result<OwnedFd> {
        let server = self.server.take().context("no server")?;
        // The directory must stay: forget it so that Drop leaves it.
        self.dir = PathBuf::new();
        server.take_listener()
    }

    /// The socket's path on the host.
    pub fn path(&self) -> &Path {
        self.server.as_ref().map_or(Path::new(""), |s| s.path())
    }
}

impl Drop for MmapSocket {
    fn drop(&mut self) {
        drop(self.server.take());
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}
