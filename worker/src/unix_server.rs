//! A unix-socket server thread: the supervisor's control socket (`api.rs`) and each worker's
//! stats socket (`worker.rs`). The listener is polled ([`crate::listener`]), so dropping the
//! server stops its thread within 50 ms; connections are answered one at a time by the handler.

use std::ops::ControlFlow;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::listener::{self, Stop};

/// A socket served by a thread; dropping it stops the thread and removes the socket.
pub struct UnixServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    remove_on_drop: bool,
}

impl UnixServer {
    /// Binds `path` (replacing a stale socket), then `prepare`s it (permissions) before any
    /// connection is accepted, and serves each connection with `handle` on a thread named
    /// `name`.
    pub fn start(
        path: &Path,
        name: &str,
        prepare: impl FnOnce(&Path) -> Result<()>,
        handle: impl Fn(UnixStream) + Send + 'static,
    ) -> Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener =
            UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
        prepare(path)?;
        Self::serve(listener, path, name, true, handle)
    }

    /// Serves a listener bound at `path` already (one systemd kept in its fd store);
    /// `remove_on_drop`: whether dropping the server unlinks `path` (not for a stored listener,
    /// which outlives this process: its path must stay for the next one).
    pub fn serve(
        listener: UnixListener,
        path: &Path,
        name: &str,
        remove_on_drop: bool,
        handle: impl Fn(UnixStream) + Send + 'static,
    ) -> Result<Self> {
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let tag = name.to_owned();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let stop = Stop::Flag(&flag, Duration::from_millis(50));
                listener::accept_loop(listener.as_fd(), stop, |turn| {
                    match turn {
                        Ok(conn) => {
                            let conn = UnixStream::from(conn);
                            let _ = conn.set_nonblocking(false);
                            handle(conn);
                        }
                        Err(e) => {
                            tracing::warn!(socket = %tag, error = %e, "accept failed");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                    ControlFlow::Continue(())
                });
            })
            .with_context(|| format!("starting the {name} thread"))?;
        Ok(Self {
            path: path.to_owned(),
            stop,
            thread: Some(thread),
            remove_on_drop,
        })
    }
}

impl Drop for UnixServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if self.remove_on_drop {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
