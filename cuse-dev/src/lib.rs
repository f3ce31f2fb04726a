//! The CUSE wire protocol on `/dev/cuse`, implemented natively (no libfuse).
//!
//! A CUSE server opens `/dev/cuse`; the kernel sends `CUSE_INIT`, the server answers with the
//! device name (`DEVNAME=`), numbers and flags, and the kernel registers a character device.
//! From then on every `open`, `read`, `write`, `ioctl`, `poll` and last `close` of that node
//! arrives as a request on the channel, and the caller sleeps until the server writes the reply.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cuse_dev::{DeviceConfig, Errno, Handler, Opened, Request, Session};
//!
//! struct Null;
//! impl Handler for Null {
//!     fn open(&self, _req: &Request, _flags: u32) -> Result<Opened, Errno> {
//!         Ok(Opened::default())
//!     }
//! }
//! let session = Session::open(DeviceConfig::new("example/null"))?;
//! session.run(Arc::new(Null))?; // returns when the kernel ends the connection
//! # Ok::<(), cuse_dev::CuseError>(())
//! ```
//!
//! # Modules
//!
//! - [`wire`]: the kernel structures (`include/uapi/linux/fuse.h` names), [`wire::parse_request`]
//!   and reply encoding. Pure and safe; the fuzz target drives it.
//! - [`Session`], [`SessionControl`], [`DeviceConfig`]: the channel, its reader loop and worker
//!   pool.
//! - [`Handler`] and the values it sees ([`Request`], [`Ioctl`]) and returns ([`Opened`],
//!   [`IoctlReply`]); [`PollHandle`] for poll wake-ups; [`EarlyAnswer`] for an ioctl answered
//!   before its handler returns (the client goes on while the handler keeps its books).
//!
//! # Threading
//!
//! Leader/follower, as libfuse's multi-threaded loop: a pool of **serving threads** each block
//! in `read` on the channel, and the thread that reads a request runs its handler itself and
//! writes the reply (one `writev`, header and payload together) — no hand-off to another
//! thread. Before it runs a handler, it makes sure another thread is reading: if none is, it
//! starts one (a thread is started only when the pool grows; in a steady state one thread
//! reads while the others run handlers or wait in `read` too). So replies go out in any
//! order, a slow handler stalls neither other requests nor other opens, and a request costs
//! the server one `read` and one `writev`, as with libfuse (the kernel wakes exactly one of the
//! threads waiting in `read`). Protocol-level cases are answered by the thread that read them
//! (unknown opcode → `ENOSYS`, malformed → `EINVAL`/`EIO`, 32-bit compat ioctl → `ENOTTY`),
//! and `FUSE_INTERRUPT` is applied through a table of requests in flight shared by all threads.
//!
//! At most [`DeviceConfig::max_workers`] handlers run at once, so the pool has at most one
//! thread more. A request read while `max_workers` handlers run waits in a queue (the pool
//! logs a warning), and the thread that read it goes back to reading; a thread that finishes a
//! handler takes queued requests before it reads again. A thread idle in `read` for
//! [`DeviceConfig::idle_timeout`] exits; two always stay. The caller of [`Session::run`]
//! answers `CUSE_INIT`, then only supervises: it waits for the end of the connection or
//! [`SessionControl::stop`], retires idle threads, and on stop wakes the threads blocked in
//! `read`.
//!
//! No `poll` before `read`: several threads polling one channel would all be woken by every
//! request. Threads blocked in `read` are woken for `stop` (and idle exit) by a signal,
//! `SIGRTMIN + 7`, sent with `pthread_kill` to the session's own threads only; the session
//! installs a handler for it that does nothing, without `SA_RESTART`, so `read` fails with
//! `EINTR` (once per process; a program must not install its own handler for that signal),
//! and unblocks it in its threads.
//!
//! Plain threads, not async: the work behind a request is blocking syscalls (host ioctls,
//! `pidfd_getfd`, `close`), and an async runtime would need a blocking pool anyway.
//!
//! Why reading must never stall behind a handler (measured with libfuse,
//! `reference/cuse-experiments.md` 1b–1c):
//!
//! - A handler may send a request to **its own device** (the daemon's private identify ioctl on
//!   a `pidfd_getfd` dup of a client's file). That nested request must be read and served while
//!   the first handler waits for it.
//! - A handler may drop the **last reference** to a client's file (closing such a dup). CUSE's
//!   release is synchronous (`fuse_sync_release`): `close` returns only after our RELEASE reply.
//!
//! If no thread read meanwhile, both would deadlock, and the client would sit in `D` state
//! where even `SIGKILL` cannot free it. Here a handler runs only while another thread reads;
//! each nested request needs a free handler slot, so `max_workers` must exceed the number of
//! handlers that can wait on nested requests at once (the pool logs a warning when it is
//! full). The nvproxy daemon should run resolutions off the pool or size it accordingly.
//!
//! # Interrupts
//!
//! When a caller gets a signal, the kernel sends `FUSE_INTERRUPT` naming the request. The
//! session marks the request, [`Request::is_interrupted`] turns true and
//! [`Request::wait_interrupted`] returns. A request interrupted while still queued is answered
//! `EINTR` without calling the handler (except RELEASE, which cannot be interrupted). For a
//! **fatal** signal the caller cannot exit until we reply, so a blocking handler should wait
//! with [`Request::wait_interrupted`] and answer `Err(Errno::EINTR)`.
//!
//! An interrupt is not answered when its request is found. With several threads reading, an
//! interrupt can be read before the thread that read its request has registered it; an
//! interrupt whose request is not found is therefore answered `EAGAIN`, which makes the kernel
//! queue it again while the request still waits for its reply (`fuse_dev_do_write`; for a
//! request already answered the kernel refuses the reply with `ENOENT`, logged at debug level).
//! This is what libfuse does too.
//!
//! # Registration and the end of the connection
//!
//! [`SessionControl::wait_init`] and [`Handler::init_done`] report that `CUSE_INIT` was
//! answered. The kernel registers the device while processing that reply; if the name or the
//! fixed number is taken, it aborts the connection silently, which shows only as the next read
//! failing with `ENODEV`: [`Session::run`] then returns `Ok(())`. Check that the node is yours
//! (open it, send a private ioctl) before announcing it. Read errors `ENOENT`, `EINTR` and
//! `EAGAIN` are retried; `ENODEV` (or end-of-file on a socket) ends the session cleanly. A reply
//! that fails with `ENOENT` (its request was interrupted or aborted) is logged at debug level.
//!
//! # When the server dies
//!
//! Closing the channel (the process exiting) unregisters the device and aborts the connection.
//! Measured on 6.12 (`tests/tests/cuse_kernel.rs`): a client blocked in a request gets
//! `ECONNABORTED`; later calls on its open file get `ENOTCONN`; the node and the directories
//! devtmpfs made for it are gone, so `open` gets `ENOENT`.
//!
//! # Limits enforced before anything is sent
//!
//! Unrestricted ioctl retries: at most [`wire::FUSE_IOCTL_MAX_IOV`] iovecs (in and out
//! together) and [`wire::FUSE_IOCTL_MAX_BYTES`] per direction; larger requests are refused with
//! `E2BIG` and an error log ([`HandlerReplyError`]). Ioctl output longer than `out_size`, a READ
//! reply longer than asked, a negative ioctl result or a retry on a restricted ioctl become
//! `EIO`. Compat (32-bit) ioctls are refused with `ENOTTY`, the errno a driver without
//! `compat_ioctl` gives, plus a warning log line.

#![deny(missing_docs)]
#![deny(unsafe_code)]

mod errno;
mod error;
mod handler;
mod interrupt;
mod reply;
mod session;
// The system calls on `/dev/cuse` (see the module docs).
#[allow(unsafe_code)]
mod sys;
mod watchdog;
pub mod wire;

pub use errno::Errno;
pub use error::{CuseError, HandlerReplyError};
pub use handler::{
    EarlyAnswer, Handler, IoVec, Ioctl, IoctlReply, Opened, PollHandle, ReplyData, Request,
    RetryRound,
};
pub use session::{
    DeviceConfig, InitInfo, MAX_DEV_MAJOR, MAX_DEV_MINOR, MAX_IO_SIZE, PendingRetry, Session,
    SessionControl, Suspended,
};
pub use sys::seqpacket_pair;
pub use watchdog::{ClientWait, ClientWaits};
