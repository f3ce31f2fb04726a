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
//!   [`IoctlReply`]); [`PollHandle`] for poll wake-ups.
//!
//! # Threading
//!
//! One **reader** thread (the caller of [`Session::run`]) reads requests and a **worker pool**
//! runs the handlers. The reader parses each request, answers protocol-level cases itself
//! (unknown opcode → `ENOSYS`, malformed → `EINVAL`/`EIO`, 32-bit compat ioctl → `ENOTTY`),
//! records `FUSE_INTERRUPT` targets, and queues everything else. It **never runs handler code
//! and never waits for a worker**: the only locks it takes are held for a few instructions, and
//! a full pool makes requests queue rather than block the reader. Workers are started on demand
//! up to [`DeviceConfig::max_workers`] and exit after [`DeviceConfig::idle_timeout`] idle (one
//! stays). Each worker writes its own reply with one `writev` (header and payload together), so
//! replies go out in any order: a slow handler stalls neither other requests nor other opens.
//!
//! Plain threads, not async: the work behind a request is blocking syscalls (host ioctls,
//! `pidfd_getfd`, `close`), and an async runtime would need a blocking pool anyway.
//!
//! Why the reader must stay free (measured with libfuse, `reference/cuse-experiments.md` 1b–1c):
//!
//! - A handler may send a request to **its own device** (the daemon's private identify ioctl on
//!   a `pidfd_getfd` dup of a client's file). That nested request must be read and served while
//!   the first handler waits for it.
//! - A handler may drop the **last reference** to a client's file (closing such a dup). CUSE's
//!   release is synchronous (`fuse_sync_release`): `close` returns only after our RELEASE reply.
//!
//! With a reader that waited for handlers, both deadlock, and the client sits in `D` state where
//! even `SIGKILL` cannot free it. Here the reader keeps reading; each nested request needs a free
//! worker, so `max_workers` must exceed the number of handlers that can wait on nested requests
//! at once (the pool logs a warning when it is full). The nvproxy daemon should run resolutions
//! off the pool or size it accordingly.
//!
//! # Interrupts
//!
//! When a caller gets a signal, the kernel sends `FUSE_INTERRUPT` naming the request. It gets no
//! reply; the session marks the request, [`Request::is_interrupted`] turns true and
//! [`Request::wait_interrupted`] returns. A request interrupted while still queued is answered
//! `EINTR` without calling the handler (except RELEASE, which cannot be interrupted). For a
//! **fatal** signal the caller cannot exit until we reply, so a blocking handler should wait
//! with [`Request::wait_interrupted`] and answer `Err(Errno::EINTR)`.
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

mod errno;
mod error;
mod handler;
mod session;
mod sys;
pub mod wire;

pub use errno::Errno;
pub use error::{CuseError, HandlerReplyError};
pub use handler::{Handler, IoVec, Ioctl, IoctlReply, Opened, PollHandle, Request};
pub use session::{
    DeviceConfig, InitInfo, MAX_DEV_MAJOR, MAX_DEV_MINOR, MAX_IO_SIZE, Session, SessionControl,
};
pub use sys::seqpacket_pair;
