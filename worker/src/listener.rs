//! The one accept loop of the daemon's listening sockets: the control and stats sockets
//! (`unix_server.rs`), the `SOCK_SEQPACKET` sockets (`seqpacket.rs`), the metrics listener
//! (`metrics.rs`) and the sim-driver (`simd.rs`). It waits for a connection with `poll`,
//! accepts it close-on-exec ([`accept`]) and hands it to its caller, until told to stop
//! ([`Stop`]). What a failure means (log, pause, give up) is the caller's to say.

use std::io;
use std::ops::ControlFlow;
use std::os::fd::{BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// When an accept loop ends (besides its caller's `ControlFlow::Break`).
pub enum Stop<'a> {
    /// When this fd is readable or hangs up (the read end of a pipe whose write end the owner
    /// drops): at once, even while no connection comes.
    Pipe(BorrowedFd<'a>),
    /// Never: the loop lasts as long as the process.
    Never,
}

/// A turn of the loop that failed.
#[derive(Debug)]
pub enum Failure {
    /// `poll` failed (`EINTR` is retried, not reported).
    Poll(Errno),
    /// `accept` failed (`EAGAIN` and `EINTR` are retried, not reported).
    Accept(io::Error),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Poll(e) => write!(f, "poll: {e}"),
            Failure::Accept(e) => e.fmt(f),
        }
    }
}

/// A stop pipe, `(read end, write end)`, both close-on-exec: the loop polls the read end
/// ([`Stop::Pipe`]); dropping the write end stops it at once. No loop wakes on a timer: an idle
/// daemon stays asleep, and no periodic wake-up disturbs how the scheduler places a client and
/// the thread serving it.
pub fn stop_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

/// `accept4(listener, SOCK_CLOEXEC)`: the accepted connection (blocking, close-on-exec).
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    use rustix::net::{SocketFlags, accept_with};
    Ok(accept_with(listener, SocketFlags::CLOEXEC)?)
}

/// Accepts connections on `listener` until `stop` says so or `handle` breaks; `handle` gets
/// each connection, or the failure of a turn (after which the loop goes on unless it breaks).
pub fn accept_loop(
    listener: BorrowedFd<'_>,
    stop: Stop<'_>,
    mut handle: impl FnMut(Result<OwnedFd, Failure>) -> ControlFlow<()>,
) {
    loop {
        let polled = match stop {
            Stop::Pipe(pipe) => {
                let mut fds = [
                    PollFd::new(listener, PollFlags::POLLIN),
                    PollFd::new(pipe, PollFlags::POLLIN),
                ];
                let polled = poll(&mut fds, PollTimeout::NONE);
                if polled.is_ok() && fds[1].any().unwrap_or(true) {
                    return;
                }
                polled
            }
            Stop::Never => poll(
                &mut [PollFd::new(listener, PollFlags::POLLIN)],
                PollTimeout::NONE,
            ),
        };
        let turn = match polled {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => match accept(listener) {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) => {
                    continue;
                }
                accepted => accepted.map_err(Failure::Accept),
            },
            Err(e) => Err(Failure::Poll(e)),
        };
        if handle(turn).is_break() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::{UnixListener, UnixStream};

    #[test]
    fn test_accepts_until_the_handler_breaks_and_stops_on_the_pipe() {
        let dir = test_kit::TestDir::new("listener");
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).unwrap();
        let _a = UnixStream::connect(&path).unwrap();
        let _b = UnixStream::connect(&path).unwrap();
        let mut n = 0;
        accept_loop(listener.as_fd(), Stop::Never, |turn| {
            turn.unwrap();
            n += 1;
            if n == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        assert_eq!(n, 2);
        let (r, w) = stop_pipe().unwrap();
        drop(w);
        accept_loop(listener.as_fd(), Stop::Pipe(r.as_fd()), |_| {
            panic!("nothing to accept")
        });
    }

    #[test]
    fn test_a_waiting_loop_ends_when_the_stop_pipe_is_dropped() {
        let dir = test_kit::TestDir::new("listener-stop");
        let listener = UnixListener::bind(dir.path().join("s")).unwrap();
        let (r, w) = stop_pipe().unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let waiting = std::thread::spawn(move || {
            accept_loop(listener.as_fd(), Stop::Pipe(r.as_fd()), |_| {
                panic!("nothing to accept")
            });
            done_tx.send(()).unwrap();
        });
        // Still waiting: nothing wakes it on a timer.
        let timeout = std::time::Duration::from_millis(200);
        assert!(done_rx.recv_timeout(timeout).is_err());
        drop(w);
        done_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the loop ended when the write end was dropped");
        waiting.join().unwrap();
    }
}
