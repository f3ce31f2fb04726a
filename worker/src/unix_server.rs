//! A unix-socket server thread: the supervisor's control socket (`api.rs`) and each worker's
//! stats socket (`worker.rs`). The thread waits on the listener and a stop pipe
//! ([`crate::listener`]), never on a timer: dropping the server stops it at once (after the
//! connection it is answering); connections are answered one at a time by the handler.

use std::ops::ControlFlow;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::listener::{self, Stop};

/// A socket served by a thread; dropping it stops the thread and removes the socket.
pub struct UnixServer {
    path: PathBuf,
    /// The stop pipe's write end: dropped, it ends the thread's wait.
    stop: Option<OwnedFd>,
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
        let (stop_r, stop_w) =
            listener::stop_pipe().with_context(|| format!("a stop pipe for {name}"))?;
        let tag = name.to_owned();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let stop = Stop::Pipe(stop_r.as_fd());
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
            stop: Some(stop_w),
            thread: Some(thread),
            remove_on_drop,
        })
    }
}

impl Drop for UnixServer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if self.remove_on_drop {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// The voluntary context switches of this process's thread named `comm`.
    fn switches_of(comm: &str) -> u64 {
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let dir = task.unwrap().path();
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if name.trim_end() != comm {
                continue;
            }
            let status = std::fs::read_to_string(dir.join("status")).unwrap();
            let line = status
                .lines()
                .find(|l| l.starts_with("voluntary_ctxt_switches:"))
                .unwrap();
            return line.split_whitespace().nth(1).unwrap().parse().unwrap();
        }
        panic!("no thread named {comm}");
    }

    #[test]
    fn an_idle_server_sleeps_serves_and_stops_at_once_when_dropped() {
        let dir = test_kit::TestDir::new("unix-server");
        let path = dir.path().join("s");
        let server = UnixServer::start(
            &path,
            "us-idle-test",
            |_| Ok(()),
            |mut conn| {
                let _ = conn.write_all(b"hi");
            },
        )
        .unwrap();
        let mut got = String::new();
        UnixStream::connect(&path)
            .unwrap()
            .read_to_string(&mut got)
            .unwrap();
        assert_eq!(got, "hi");
        // Idle: the thread waits on the listener and the stop pipe, not on a timer (a 50 ms
        // poll period would wake it ~10 times here).
        let before = switches_of("us-idle-test");
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            switches_of("us-idle-test") - before <= 1,
            "an idle server woke"
        );
        let t0 = std::time::Instant::now();
        drop(server);
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(!path.exists(), "the socket is removed");
    }
}
