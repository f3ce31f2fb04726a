//! The crate's error types.

use std::io;

use crate::Errno;
use crate::wire::WireError;

/// What can go wrong setting up or running a session.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CuseError {
    /// [`SessionControl::suspend`](crate::SessionControl::suspend): handlers were still
    /// running when the wait for them ended; nothing was handed over.
    #[error(
        "suspending the session: {running} serving thread(s) still running a handler not \
         answered ({queued} request(s) queued behind them; {parked} more thread(s) parked on \
         their client's memory, their requests answered)"
    )]
    SuspendTimeout {
        /// Threads that had not finished a request the watchdog did not answer.
        running: usize,
        /// Threads parked on a request the watchdog answered (not waited for).
        parked: usize,
        /// Requests read and not yet given to a handler.
        queued: usize,
    },
    /// The device name is not a safe CUSE `DEVNAME`.
    #[error("invalid device name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// Some other configuration value is out of range.
    #[error("invalid device configuration: {0}")]
    InvalidConfig(String),
    /// `/dev/cuse` could not be opened (missing module, not root, ...).
    #[error("cannot open /dev/cuse")]
    Open(#[source] io::Error),
    /// A helper resource (eventfd) could not be created.
    #[error("cannot set up the session")]
    Setup(#[source] io::Error),
    /// Reading a request failed with an error that does not mean "retry" or "ended".
    #[error("reading from the CUSE channel failed")]
    Read(#[source] io::Error),
    /// Writing a reply or notification failed.
    #[error("writing to the CUSE channel failed")]
    Write(#[source] io::Error),
    /// The kernel's protocol version cannot serve CUSE.
    #[error(
        "kernel speaks FUSE {major}.{minor}; CUSE needs major 7 and minor >= 11 (we implement 7.{ours})"
    )]
    UnsupportedProtocol {
        /// Kernel major.
        major: u32,
        /// Kernel minor.
        minor: u32,
        /// The minor we implement.
        ours: u32,
    },
    /// The `CUSE_INIT` request was malformed.
    #[error("malformed CUSE_INIT request")]
    BadInit(#[source] WireError),
    /// The connection ended (or the session was stopped) before `CUSE_INIT` arrived.
    #[error("the CUSE connection ended before CUSE_INIT")]
    EndedBeforeInit,
    /// The session this handle belonged to has ended.
    #[error("the CUSE session has ended")]
    Disconnected,
}

/// A handler's answer that the kernel would refuse or misread. The session logs it and sends
/// the caller [`HandlerReplyError::errno`] instead of forwarding the bad reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerReplyError {
    /// A READ reply longer than the request asked for.
    #[error("read reply of {got} bytes, request asked for at most {max}")]
    ReadTooLong {
        /// Bytes returned.
        got: usize,
        /// Bytes asked for.
        max: u32,
    },
    /// A WRITE reply claiming more bytes than were written.
    #[error("write reply claims {got} bytes of a {max}-byte write")]
    WriteTooLong {
        /// Bytes claimed.
        got: u32,
        /// Bytes in the request.
        max: usize,
    },
    /// A negative ioctl result: the caller would read it as an errno. Return `Err(Errno)`.
    #[error("negative ioctl result {0}; return Err(Errno) instead")]
    NegativeResult(i32),
    /// Ioctl output longer than the kernel will copy back.
    #[error("ioctl output of {got} bytes, the kernel copies back at most {max}")]
    OutTooLong {
        /// Bytes returned.
        got: usize,
        /// `out_size` of the request.
        max: u32,
    },
    /// A retry reply to a restricted ioctl (the kernel fails it with EIO).
    #[error("FUSE_IOCTL_RETRY on a restricted ioctl")]
    RetryRestricted,
    /// More iovecs than the kernel takes in one retry.
    #[error("ioctl retry with {got} iovecs, the kernel takes at most {max}")]
    TooManyIovecs {
        /// In + out iovecs asked for.
        got: usize,
        /// `FUSE_IOCTL_MAX_IOV`.
        max: usize,
    },
    /// More bytes in one direction than the kernel copies in one round.
    #[error("ioctl retry asks for {bytes} bytes of {direction}, the kernel copies at most {max}")]
    RetryTooLarge {
        /// `"input"` or `"output"`.
        direction: &'static str,
        /// Bytes asked for (saturated at `u64::MAX`).
        bytes: u64,
        /// `FUSE_IOCTL_MAX_BYTES`.
        max: u64,
    },
    /// The handler panicked.
    #[error("handler panicked")]
    Panicked,
}

impl HandlerReplyError {
    /// What the caller sees instead of the bad reply. Oversized retries get `E2BIG` (the kernel
    /// itself would answer `ENOMEM`, which hides the cause); everything else is `EIO`.
    pub fn errno(&self) -> Errno {
        match self {
            Self::TooManyIovecs { .. } | Self::RetryTooLarge { .. } => Errno::E2BIG,
            Self::ReadTooLong { .. }
            | Self::WriteTooLong { .. }
            | Self::NegativeResult(_)
            | Self::OutTooLong { .. }
            | Self::RetryRestricted
            | Self::Panicked => Errno::EIO,
        }
    }
}
