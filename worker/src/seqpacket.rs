//! A `SOCK_SEQPACKET` unix-socket server thread: the mmap socket (`mmap/socket.rs`) and the
//! socket transport's device socket (`socket_transport.rs`). One thread polls the listener
//! and a stop pipe and hands each connection to the server's function; dropping the server
//! stops the thread and removes the socket. Also the run directories' helpers.

use std::io;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use nix::sys::socket;

use crate::listener::{self, Failure, Stop};

/// A served socket; dropping it stops its thread and removes the socket file.
pub struct SeqpacketServer {
    path: PathBuf,
    stop: Option<OwnedFd>,
    /// The accepting thread; it gives the listener back when it stops.
    thread: Option<JoinHandle<OwnedFd>>,
}

impl SeqpacketServer {
    /// Binds `path` (replacing a stale socket of an earlier run, refusing anything else there),
    /// makes it 0666 (any uid in the container may connect; the server's own checks decide)
    /// and serves each connection with `serve`, one at a time, on a thread named `name`.
    pub fn start(
        path: &Path,
        name: String,
        serve: impl Fn(OwnedFd) + Send + 'static,
    ) -> Result<Self> {
        remove_stale_socket(path)?;
        let listener = socket::socket(
            socket::AddressFamily::Unix,
            socket::SockType::SeqPacket,
            socket::SockFlag::SOCK_CLOEXEC | socket::SockFlag::SOCK_NONBLOCK,
            None,
        )
        .with_context(|| format!("creating the socket {}", path.display()))?;
        let addr = socket::UnixAddr::new(path).context("socket path")?;
        socket::bind(listener.as_raw_fd(), &addr)
            .with_context(|| format!("binding {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        socket::listen(&listener, socket::Backlog::new(64).context("backlog")?)
            .with_context(|| format!("listen on {}", path.display()))?;
        Self::serve_listener(listener, path, name, serve)
    }

    /// Serves a socket already bound and listening at `path` (another worker's, handed over
    /// in a live upgrade: clients that hold its path, bind mounts included, reach us).
    pub fn serve_listener(
        listener: OwnedFd,
        path: &Path,
        name: String,
        serve: impl Fn(OwnedFd) + Send + 'static,
    ) -> Result<Self> {
        let (stop_r, stop_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .with_context(|| format!("a stop pipe for {}", path.display()))?;
        let tag = name.clone();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            accept_loop(&tag, &listener, &stop_r, serve);
            listener
        })?;
        Ok(SeqpacketServer {
            path: path.to_owned(),
            stop: Some(stop_w),
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl SeqpacketServer {
    /// Stops accepting (a connection being served is finished first) and returns the
    /// listener, bound and listening: connections made meanwhile wait in its backlog for
    /// whoever serves it next ([`SeqpacketServer::serve_listener`]). The socket file stays.
    pub fn take_listener(mut self) -> Result<OwnedFd> {
        drop(self.stop.take());
        let t = self.thread.take().context("the socket thread is gone")?;
        t.join()
            .map_err(|_| anyhow::anyhow!("socket thread of {} panicked", self.path.display()))
    }
}

impl Drop for SeqpacketServer {
    fn drop(&mut self) {
        let Some(t) = self.thread.take() else {
            return; // the listener was taken: the socket is someone else's now
        };
        // Closing the pipe's write end wakes the thread (POLLHUP).
        drop(self.stop.take());
        if t.join().is_err() {
            tracing::error!(socket = %self.path.display(), "socket thread panicked");
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn accept_loop(name: &str, listener: &OwnedFd, stop: &OwnedFd, serve: impl Fn(OwnedFd)) {
    listener::accept_loop(listener.as_fd(), Stop::Pipe(stop.as_fd()), |turn| {
        match turn {
            Ok(conn) => serve(conn),
            Err(Failure::Poll(e)) => {
                tracing::error!(socket = name, error = %e, "poll failed; the socket is no longer served");
                return ControlFlow::Break(());
            }
            Err(Failure::Accept(e)) if e.raw_os_error() == Some(libc::ECONNABORTED) => {}
            Err(Failure::Accept(e)) => {
                tracing::warn!(socket = name, error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        ControlFlow::Continue(())
    });
}

/// Removes a stale socket of an earlier run at `path`; anything else there is an error.
pub fn remove_stale_socket(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))
        }
        Ok(_) => anyhow::bail!("{} exists and is not a socket", path.display()),
        Err(_) => Ok(()),
    }
}

/// The run directory (`/run/nvproxy`) as created: others may only search it (the API group
/// reaches its control socket, workers under their own uid their directories), nobody lists it.
pub const RUN_ROOT_MODE: u32 = 0o711;
/// The most an existing run directory may allow: systemd's `RuntimeDirectoryMode=0755` (others
/// list and search); never written by anyone but its owner.
pub const RUN_ROOT_MAX: u32 = 0o755;
/// An instance directory as created: its owner's alone.
pub const INSTANCE_DIR_MODE: u32 = 0o700;
/// The most an instance directory may allow when a worker user owns it (its group is the
/// supervisor's, `supervisor.rs` `prepare_for_user`); a root-owned one stays 0700.
pub const INSTANCE_DIR_WORKER_MAX: u32 = 0o770;

/// Creates the run directory `dir` with [`RUN_ROOT_MODE`] (whatever the umask), or checks an
/// existing one: a directory (not a link), root's when we are root, and at most
/// [`RUN_ROOT_MAX`]; a looser one of ours is tightened, one we cannot change refused.
pub fn make_run_root(dir: &Path) -> Result<()> {
    ensure_dir(dir, RUN_ROOT_MODE, false, |_| RUN_ROOT_MAX)
}

/// Creates the instance directory `dir` 0700 (whatever the umask), or checks an existing one:
/// a directory (not a link), root's when we are root unless a worker user has it (then at most
/// 0770), else at most 0700. A looser one of ours is tightened (a directory another start
/// made 0755 under umask 022 would let any host uid reach the sockets inside), one we cannot
/// change refused.
pub fn make_private_dir(dir: &Path) -> Result<()> {
    // Only root can create a directory in the run root (root's, 0711): one owned by another
    // uid was handed to that worker user by the supervisor (`prepare_for_user`).
    ensure_dir(dir, INSTANCE_DIR_MODE, true, |owner| {
        if owner == 0 {
            INSTANCE_DIR_MODE
        } else {
            INSTANCE_DIR_WORKER_MAX
        }
    })
}

/// Creates `dir` with `mode` (set again after the `mkdir`: the umask only ever removes bits)
/// or checks an existing one against `max(owner uid)`; when we are root, an existing one must
/// be root's unless `other_owners` (then `max` bounds it).
fn ensure_dir(dir: &Path, mode: u32, other_owners: bool, max: impl Fn(u32) -> u32) -> Result<()> {
    let me = nix::unistd::geteuid();
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("chmod {mode:o} {}", dir.display())),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(dir)?;
            if !m.is_dir() {
                anyhow::bail!("{} exists and is not a directory", dir.display());
            }
            if me.is_root() && m.uid() != 0 && !other_owners {
                anyhow::bail!("{} is not owned by root", dir.display());
            }
            let have = m.mode() & 0o7777;
            let allowed = max(m.uid());
            if have & !allowed == 0 {
                return Ok(());
            }
            let tight = have & allowed;
            if m.uid() != me.as_raw() && !me.is_root() {
                anyhow::bail!(
                    "{} has mode {have:o}, more than {allowed:o}, and is uid {}'s: not ours to \
                     tighten",
                    dir.display(),
                    m.uid()
                );
            }
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(tight))
                .with_context(|| format!("tightening {} from {have:o}", dir.display()))?;
            tracing::warn!(dir = %dir.display(), from = format_args!("{have:o}"), to = format_args!("{tight:o}"), "a run directory allowed too much: tightened");
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("creating {}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A supervisor restarted after uid workers finds their instance directories owned by
    /// the worker users (it chowned them): it must serve on (the CI run of `systemctl restart`
    /// with `worker_uids` failed "not owned by root"), while the run root itself must stay
    /// root's. Needs root (chown).
    #[test]
    fn test_an_instance_dir_a_worker_user_owns_is_accepted_and_the_run_root_is_not() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root (chown)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("nvproxy-dirs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        make_private_dir(&dir).unwrap();
        let worker = nix::unistd::Uid::from_raw(61000);
        nix::unistd::chown(&dir, Some(worker), None).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
        let private = make_private_dir(&dir);
        let root = make_run_root(&dir);
        // Looser than 0770 is tightened even when a worker user owns it.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let tightened = make_private_dir(&dir);
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        std::fs::remove_dir_all(&dir).unwrap();
        private.unwrap();
        assert!(root.is_err(), "the run root must be root's");
        tightened.unwrap();
        assert_eq!(mode, 0o770);
    }
}
