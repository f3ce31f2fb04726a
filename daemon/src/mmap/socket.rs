//! [`MmapSocket`]: the per-instance socket that hands redeemed tickets their mapping fd.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{self};

use super::*;
use crate::sys;

/// The instance socket and its accepting thread. Dropping it stops the thread and removes the
/// socket and its directory.
pub struct MmapSocket {
    path: PathBuf,
    dir: PathBuf,
    stop: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl MmapSocket {
    /// Serves `mmap` at `<root>/<instance>/mmap.sock` (`root` is [`RUN_DIR`] outside tests).
    /// The directories are 0700 (only root on the host reaches the socket by its path; clients
    /// reach it through the bind mount), the socket 0666 (any uid in the container may connect;
    /// tickets and `SO_PEERCRED` decide). A stale socket of an earlier run is replaced: the
    /// instance's nodes are registered first, so a live daemon serving this instance would have
    /// made us fail before.
    pub fn start(mmap: Arc<InstanceMmap>, root: &Path) -> Result<MmapSocket> {
        make_private_dir(root)?;
        let dir = root.join(&mmap.instance);
        make_private_dir(&dir)?;
        let path = dir.join(SOCKET_NAME);
        remove_stale_socket(&path)?;
        let listener = socket::socket(
            socket::AddressFamily::Unix,
            socket::SockType::SeqPacket,
            socket::SockFlag::SOCK_CLOEXEC | socket::SockFlag::SOCK_NONBLOCK,
            None,
        )
        .context("creating the mmap socket")?;
        let addr = socket::UnixAddr::new(&path).context("mmap socket path")?;
        socket::bind(listener.as_raw_fd(), &addr)
            .with_context(|| format!("binding {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        socket::listen(&listener, socket::Backlog::new(64).context("backlog")?)
            .context("listen on the mmap socket")?;
        let (stop_r, stop_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe for the mmap socket")?;
        let thread = std::thread::Builder::new()
            .name(format!("mmap-{}", mmap.instance))
            .spawn(move || accept_loop(&mmap, &listener, &stop_r))?;
        Ok(MmapSocket {
            path,
            dir,
            stop: Some(stop_w),
            thread: Some(thread),
        })
    }

    /// The socket's path on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for MmapSocket {
    fn drop(&mut self) {
        // Closing the pipe's write end wakes the thread (POLLHUP).
        drop(self.stop.take());
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!(socket = %self.path.display(), "mmap socket thread panicked");
        }
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Removes a stale socket of an earlier run at `path`; anything else there is an error.
pub(crate) fn remove_stale_socket(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))
        }
        Ok(_) => anyhow::bail!("{} exists and is not a socket", path.display()),
        Err(_) => Ok(()),
    }
}

/// Creates `dir` 0700 (or checks an existing one is a root-owned directory).
pub(crate) fn make_private_dir(dir: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(dir)?;
            if !m.is_dir() {
                anyhow::bail!("{} exists and is not a directory", dir.display());
            }
            if m.uid() != 0 && nix::unistd::geteuid().is_root() {
                anyhow::bail!("{} is not owned by root", dir.display());
            }
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("creating {}", dir.display())),
    }
}

fn accept_loop(mmap: &InstanceMmap, listener: &OwnedFd, stop: &OwnedFd) {
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::error!(instance = %mmap.instance, error = %e, "mmap socket: poll failed; no more mmaps for this instance");
                return;
            }
        }
        if fds[1].any().unwrap_or(true) {
            return;
        }
        match sys::accept_cloexec(listener.as_fd()) {
            Ok(conn) => mmap.serve_peer(conn),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EINTR | libc::ECONNABORTED)
                ) => {}
            Err(e) => {
                tracing::warn!(instance = %mmap.instance, error = %e, "mmap socket: accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
