//! FUSE/CUSE wire structures, request parsing and reply encoding.
//!
//! Everything here is pure: bytes in, typed values out (and back). No I/O, no `unsafe`.
//! The structures mirror `include/uapi/linux/fuse.h` (torvalds/linux) and keep its C names, so
//! they can be grepped against the header. Only the subset that a CUSE server sees is defined.
//!
//! Parsing copies the fixed-size structures out of the buffer with zerocopy's
//! `read_from_prefix`, so any alignment of the input is fine, and every length is checked
//! before it is used. Payloads (write data, ioctl input) are borrowed from the input.

#![allow(non_camel_case_types)] // names match include/uapi/linux/fuse.h

use std::borrow::Cow;
use std::mem::{offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::Errno;

/// The FUSE major protocol version. CUSE insists on exactly this major in the `CUSE_INIT` reply.
pub const FUSE_KERNEL_VERSION: u32 = 7;
/// The lowest minor version the kernel's CUSE accepts in the `CUSE_INIT` reply
/// (`fs/fuse/cuse.c`, `cuse_process_init_reply`: `arg->minor < 11` fails).
pub const CUSE_MIN_MINOR: u32 = 11;
/// The minor version this crate implements. The structures a CUSE server sees have kept their
/// layout since 7.16 (64-bit `fuse_ioctl_iovec`); we answer `min(kernel minor, this)`.
pub const FUSE_KERNEL_MINOR_VERSION: u32 = 31;

/// Opcode `FUSE_OPEN`.
pub const FUSE_OPEN: u32 = 14;
/// Opcode `FUSE_READ`.
pub const FUSE_READ: u32 = 15;
/// Opcode `FUSE_WRITE`.
pub const FUSE_WRITE: u32 = 16;
/// Opcode `FUSE_RELEASE`.
pub const FUSE_RELEASE: u32 = 18;
/// Opcode `FUSE_FSYNC`.
pub const FUSE_FSYNC: u32 = 20;
/// Opcode `FUSE_FLUSH`.
pub const FUSE_FLUSH: u32 = 25;
/// Opcode `FUSE_INTERRUPT`.
pub const FUSE_INTERRUPT: u32 = 36;
/// Opcode `FUSE_DESTROY`.
pub const FUSE_DESTROY: u32 = 38;
/// Opcode `FUSE_IOCTL`.
pub const FUSE_IOCTL: u32 = 39;
/// Opcode `FUSE_POLL`.
pub const FUSE_POLL: u32 = 40;
/// Opcode `CUSE_INIT`.
pub const CUSE_INIT: u32 = 4096;

/// `cuse_init_out.flags`: the kernel lets the server name iovecs (`FUSE_IOCTL_RETRY`).
pub const CUSE_UNRESTRICTED_IOCTL: u32 = 1 << 0;

/// `fuse_ioctl_in.flags`: the caller is a 32-bit (compat) task.
pub const FUSE_IOCTL_COMPAT: u32 = 1 << 0;
/// `fuse_ioctl_in.flags`: unrestricted ioctl (the server may answer `FUSE_IOCTL_RETRY`).
pub const FUSE_IOCTL_UNRESTRICTED: u32 = 1 << 1;
/// `fuse_ioctl_out.flags`: retry with the iovecs that follow the reply.
pub const FUSE_IOCTL_RETRY: u32 = 1 << 2;
/// `fuse_ioctl_in.flags`: 32-bit ioctl.
pub const FUSE_IOCTL_32BIT: u32 = 1 << 3;
/// `fuse_ioctl_in.flags`: the ioctl is on a directory (never for CUSE).
pub const FUSE_IOCTL_DIR: u32 = 1 << 4;
/// `fuse_ioctl_in.flags`: x32 compat ioctl.
pub const FUSE_IOCTL_COMPAT_X32: u32 = 1 << 5;
/// The kernel takes at most this many iovecs in one retry reply (in + out together).
pub const FUSE_IOCTL_MAX_IOV: usize = 256;
/// The most bytes the kernel copies per direction in one ioctl round: CUSE never negotiates
/// `max_pages`, so it stays `FUSE_DEFAULT_MAX_PAGES_PER_REQ` (32) pages; we assume 4 KiB pages,
/// which is the smallest page size and so the safe bound everywhere.
pub const FUSE_IOCTL_MAX_BYTES: u64 = 128 * 1024;
/// Every ioctl flag a CUSE request can legitimately carry.
pub const FUSE_IOCTL_KNOWN_REQUEST_FLAGS: u32 =
    FUSE_IOCTL_COMPAT | FUSE_IOCTL_UNRESTRICTED | FUSE_IOCTL_32BIT | FUSE_IOCTL_COMPAT_X32;

/// `fuse_poll_in.flags`: the kernel wants a `FUSE_NOTIFY_POLL` when the file becomes ready.
pub const FUSE_POLL_SCHEDULE_NOTIFY: u32 = 1 << 0;
/// Notification code `FUSE_NOTIFY_POLL` (sent in `fuse_out_header.error` with `unique == 0`).
pub const FUSE_NOTIFY_POLL: i32 = 1;

/// `fuse_open_out.open_flags`: bypass the page cache (CUSE always does direct I/O anyway).
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// `fuse_open_out.open_flags`: the file is not seekable.
pub const FOPEN_NONSEEKABLE: u32 = 1 << 2;

/// The most bytes of `key=value\0` device information the kernel reads (`CUSE_INIT_INFO_MAX`).
pub const CUSE_INIT_INFO_MAX: usize = 4096;

/// `struct fuse_in_header`: prefix of every request the kernel sends.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_in_header {
    /// Total length of the request, header included.
    pub len: u32,
    /// What the request asks for (`FUSE_*`/`CUSE_INIT`).
    pub opcode: u32,
    /// Request id, echoed in the reply.
    pub unique: u64,
    /// Node id (always 0 for CUSE).
    pub nodeid: u64,
    /// Caller's fs uid.
    pub uid: u32,
    /// Caller's fs gid.
    pub gid: u32,
    /// Caller's thread id in the pid namespace of whoever opened `/dev/cuse` (0 if invisible).
    pub pid: u32,
    /// Length of request extensions in 8-byte units (7.38+; never used by CUSE).
    pub total_extlen: u16,
    /// Padding.
    pub padding: u16,
}

/// `struct fuse_out_header`: prefix of every reply and notification.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_out_header {
    /// Total length of the reply, header included.
    pub len: u32,
    /// 0, or a negative errno; for notifications (`unique == 0`) the notify code.
    pub error: i32,
    /// The request id being answered; 0 for notifications.
    pub unique: u64,
}

/// `struct cuse_init_in`: body of `CUSE_INIT`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct cuse_init_in {
    /// Kernel's protocol major.
    pub major: u32,
    /// Kernel's protocol minor.
    pub minor: u32,
    /// Unused.
    pub unused: u32,
    /// Flags the kernel offers (`CUSE_UNRESTRICTED_IOCTL`).
    pub flags: u32,
}

/// `struct cuse_init_out`: reply to `CUSE_INIT`, followed by the `key=value\0` device info.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct cuse_init_out {
    /// Must be `FUSE_KERNEL_VERSION`.
    pub major: u32,
    /// Must be at least `CUSE_MIN_MINOR`.
    pub minor: u32,
    /// Unused.
    pub unused: u32,
    /// `CUSE_UNRESTRICTED_IOCTL` or 0.
    pub flags: u32,
    /// Largest READ the kernel sends (it raises values below 4096 to 4096).
    pub max_read: u32,
    /// Largest WRITE the kernel sends (it raises values below 4096 to 4096).
    pub max_write: u32,
    /// Character device major; 0 asks for a dynamic one.
    pub dev_major: u32,
    /// Character device minor.
    pub dev_minor: u32,
    /// Reserved.
    pub spare: [u32; 10],
}

/// `struct fuse_open_in`: body of `FUSE_OPEN`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_open_in {
    /// The `open(2)` flags of the caller (`O_RDWR`, ...).
    pub flags: u32,
    /// `FUSE_OPEN_*` flags (7.38+).
    pub open_flags: u32,
}

/// `struct fuse_open_out`: reply to `FUSE_OPEN`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_open_out {
    /// Our handle for this open file; every later request on it carries it.
    pub fh: u64,
    /// `FOPEN_*` flags.
    pub open_flags: u32,
    /// Padding (`backing_id` in 7.40+, unused by CUSE).
    pub padding: u32,
}

/// `struct fuse_release_in`: body of `FUSE_RELEASE` (and `FUSE_RELEASEDIR`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_release_in {
    /// The handle from `fuse_open_out`.
    pub fh: u64,
    /// The file's flags.
    pub flags: u32,
    /// `FUSE_RELEASE_*` flags.
    pub release_flags: u32,
    /// Lock owner.
    pub lock_owner: u64,
}

/// `struct fuse_flush_in`: body of `FUSE_FLUSH`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_flush_in {
    /// The handle from `fuse_open_out`.
    pub fh: u64,
    /// Unused.
    pub unused: u32,
    /// Padding.
    pub padding: u32,
    /// Lock owner.
    pub lock_owner: u64,
}

/// `struct fuse_read_in`: body of `FUSE_READ`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_read_in {
    /// The handle from `fuse_open_out`.
    pub fh: u64,
    /// File offset.
    pub offset: u64,
    /// Bytes wanted; the reply may carry fewer, never more.
    pub size: u32,
    /// `FUSE_READ_*` flags.
    pub read_flags: u32,
    /// Lock owner.
    pub lock_owner: u64,
    /// The file's flags.
    pub flags: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_write_in`: body of `FUSE_WRITE`, followed by `size` bytes of data.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_write_in {
    /// The handle from `fuse_open_out`.
    pub fh: u64,
    /// File offset.
    pub offset: u64,
    /// Length of the data that follows.
    pub size: u32,
    /// `FUSE_WRITE_*` flags.
    pub write_flags: u32,
    /// Lock owner.
    pub lock_owner: u64,
    /// The file's flags.
    pub flags: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_write_out`: reply to `FUSE_WRITE`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_write_out {
    /// Bytes accepted.
    pub size: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_fsync_in`: body of `FUSE_FSYNC`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_fsync_in {
    /// The handle from `fuse_open_out`.
    pub fh: u64,
    /// `FUSE_FSYNC_*` flags.
    pub fsync_flags: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_interrupt_in`: body of `FUSE_INTERRUPT`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_interrupt_in {
    /// The `unique` of the request to interrupt.
    pub unique: u64,
}

/// `struct fuse_ioctl_in`: body of `FUSE_IOCTL`, followed by `in_size` bytes of input.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_ioctl_in {
    /// The handle from `fuse_open_out`.
    pub fh: u64,
    /// `FUSE_IOCTL_*` flags.
    pub flags: u32,
    /// The ioctl command.
    pub cmd: u32,
    /// The raw argument (a pointer in the caller's address space, or a value).
    pub arg: u64,
    /// Bytes of input data that follow.
    pub in_size: u32,
    /// Bytes of output the kernel will copy back at most.
    pub out_size: u32,
}

/// `struct fuse_ioctl_iovec`: one region of the caller's memory, in a retry reply.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_ioctl_iovec {
    /// Address in the caller's address space.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
}

/// `struct fuse_ioctl_out`: reply to `FUSE_IOCTL`, followed by output data or iovecs.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_ioctl_out {
    /// The ioctl's return value.
    pub result: i32,
    /// `FUSE_IOCTL_RETRY` or 0.
    pub flags: u32,
    /// With `FUSE_IOCTL_RETRY`: how many input iovecs follow.
    pub in_iovs: u32,
    /// With `FUSE_IOCTL_RETRY`: how many output iovecs follow the input ones.
    pub out_iovs: u32,
}

/// `struct fuse_poll_in`: body of `FUSE_POLL`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_poll_in {
    /// The handle from `fuse_open_out`.
    pub fh: u64,
    /// The kernel's poll handle, to name in `FUSE_NOTIFY_POLL`.
    pub kh: u64,
    /// `FUSE_POLL_SCHEDULE_NOTIFY` or 0.
    pub flags: u32,
    /// The poll events asked for (`POLLIN`, ...).
    pub events: u32,
}

/// `struct fuse_poll_out`: reply to `FUSE_POLL`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_poll_out {
    /// The ready events.
    pub revents: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_notify_poll_wakeup_out`: body of a `FUSE_NOTIFY_POLL` notification.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_notify_poll_wakeup_out {
    /// The poll handle from `fuse_poll_in.kh`.
    pub kh: u64,
}

const _: () = assert!(size_of::<fuse_in_header>() == 40);
const _: () = assert!(offset_of!(fuse_in_header, pid) == 32);
const _: () = assert!(size_of::<fuse_out_header>() == 16);
const _: () = assert!(size_of::<cuse_init_in>() == 16);
const _: () = assert!(size_of::<cuse_init_out>() == 72);
const _: () = assert!(offset_of!(cuse_init_out, dev_major) == 24);
const _: () = assert!(size_of::<fuse_open_in>() == 8);
const _: () = assert!(size_of::<fuse_open_out>() == 16);
const _: () = assert!(size_of::<fuse_release_in>() == 24);
const _: () = assert!(size_of::<fuse_flush_in>() == 24);
const _: () = assert!(size_of::<fuse_read_in>() == 40);
const _: () = assert!(size_of::<fuse_write_in>() == 40);
const _: () = assert!(size_of::<fuse_write_out>() == 8);
const _: () = assert!(size_of::<fuse_fsync_in>() == 16);
const _: () = assert!(size_of::<fuse_interrupt_in>() == 8);
const _: () = assert!(size_of::<fuse_ioctl_in>() == 32);
const _: () = assert!(offset_of!(fuse_ioctl_in, arg) == 16);
const _: () = assert!(size_of::<fuse_ioctl_iovec>() == 16);
const _: () = assert!(size_of::<fuse_ioctl_out>() == 16);
const _: () = assert!(size_of::<fuse_poll_in>() == 24);
const _: () = assert!(size_of::<fuse_poll_out>() == 8);
const _: () = assert!(size_of::<fuse_notify_poll_wakeup_out>() == 8);

/// Why a request could not be parsed. The peer's fault, never ours: it becomes an error reply
/// (when the header was readable) or a logged drop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than a `fuse_in_header`.
    #[error("request of {0} bytes is shorter than fuse_in_header")]
    Short(usize),
    /// `fuse_in_header.len` does not match the number of bytes read.
    #[error("fuse_in_header.len is {header} but {read} bytes were read")]
    LenMismatch {
        /// What the header says.
        header: u32,
        /// What the read returned.
        read: usize,
    },
    /// The body is shorter than the opcode's fixed structure.
    #[error("opcode {opcode}: body of {got} bytes, need at least {want}")]
    BodyTooShort {
        /// The opcode.
        opcode: u32,
        /// Bytes present.
        got: usize,
        /// Bytes needed.
        want: usize,
    },
    /// A size field in the body does not match the payload that follows it.
    #[error("opcode {opcode}: size field says {declared} bytes of payload, {present} present")]
    PayloadMismatch {
        /// The opcode.
        opcode: u32,
        /// What the size field says.
        declared: u64,
        /// What follows the fixed structure.
        present: usize,
    },
    /// Flag bits this protocol does not define.
    #[error("opcode {opcode}: unknown flags {flags:#x}")]
    UnknownFlags {
        /// The opcode.
        opcode: u32,
        /// The offending flag bits.
        flags: u32,
    },
    /// A reply would not fit the 32-bit length field.
    #[error("reply of {0} bytes does not fit fuse_out_header.len")]
    ReplyTooLong(usize),
}

impl WireError {
    /// The errno sent back for a request that failed to parse.
    pub fn errno(&self) -> Errno {
        match self {
            Self::Short(_) | Self::LenMismatch { .. } | Self::ReplyTooLong(_) => Errno::EIO,
            Self::BodyTooShort { .. }
            | Self::PayloadMismatch { .. }
            | Self::UnknownFlags { .. } => Errno::EINVAL,
        }
    }
}

/// One parsed request: the header and the operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    /// The request header, copied.
    pub header: fuse_in_header,
    /// The operation with its arguments.
    pub op: Op<'a>,
}

/// A request's operation and arguments. Payloads borrow from the input (or own a copy, after
/// [`Op::into_owned`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op<'a> {
    /// `CUSE_INIT`.
    Init(cuse_init_in),
    /// `FUSE_OPEN`.
    Open(fuse_open_in),
    /// `FUSE_RELEASE`.
    Release(fuse_release_in),
    /// `FUSE_READ`.
    Read(fuse_read_in),
    /// `FUSE_WRITE` with its data.
    Write(fuse_write_in, Cow<'a, [u8]>),
    /// `FUSE_FLUSH`.
    Flush(fuse_flush_in),
    /// `FUSE_FSYNC`.
    Fsync(fuse_fsync_in),
    /// `FUSE_INTERRUPT`.
    Interrupt(fuse_interrupt_in),
    /// `FUSE_IOCTL` with its input data.
    Ioctl(fuse_ioctl_in, Cow<'a, [u8]>),
    /// `FUSE_POLL`.
    Poll(fuse_poll_in),
    /// `FUSE_DESTROY`.
    Destroy,
    /// Any other opcode (answered with `ENOSYS`).
    Unknown(u32),
}

impl Op<'_> {
    /// Copies any borrowed payload, so the operation can move to another thread.
    pub fn into_owned(self) -> Op<'static> {
        match self {
            Op::Init(a) => Op::Init(a),
            Op::Open(a) => Op::Open(a),
            Op::Release(a) => Op::Release(a),
            Op::Read(a) => Op::Read(a),
            Op::Write(a, d) => Op::Write(a, Cow::Owned(d.into_owned())),
            Op::Flush(a) => Op::Flush(a),
            Op::Fsync(a) => Op::Fsync(a),
            Op::Interrupt(a) => Op::Interrupt(a),
            Op::Ioctl(a, d) => Op::Ioctl(a, Cow::Owned(d.into_owned())),
            Op::Poll(a) => Op::Poll(a),
            Op::Destroy => Op::Destroy,
            Op::Unknown(o) => Op::Unknown(o),
        }
    }

    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Init(_) => "CUSE_INIT",
            Op::Open(_) => "OPEN",
            Op::Release(_) => "RELEASE",
            Op::Read(_) => "READ",
            Op::Write(..) => "WRITE",
            Op::Flush(_) => "FLUSH",
            Op::Fsync(_) => "FSYNC",
            Op::Interrupt(_) => "INTERRUPT",
            Op::Ioctl(..) => "IOCTL",
            Op::Poll(_) => "POLL",
            Op::Destroy => "DESTROY",
            Op::Unknown(_) => "UNKNOWN",
        }
    }
}

/// Splits one `/dev/cuse` read into its header and body. The header is copied, so any alignment
/// is fine; `len` must equal the number of bytes read.
pub fn split_request(buf: &[u8]) -> Result<(fuse_in_header, &[u8]), WireError> {
    let (hdr, rest) =
        fuse_in_header::read_from_prefix(buf).map_err(|_| WireError::Short(buf.len()))?;
    if usize::try_from(hdr.len).ok() != Some(buf.len()) {
        return Err(WireError::LenMismatch {
            header: hdr.len,
            read: buf.len(),
        });
    }
    Ok((hdr, rest))
}

/// Reads a fixed structure from the front of `body`, returning it and what follows.
fn take<T: FromBytes>(opcode: u32, body: &[u8]) -> Result<(T, &[u8]), WireError> {
    T::read_from_prefix(body).map_err(|_| WireError::BodyTooShort {
        opcode,
        got: body.len(),
        want: size_of::<T>(),
    })
}

/// The payload that follows a fixed structure must be exactly `declared` bytes long.
fn exact_payload(opcode: u32, declared: u32, rest: &[u8]) -> Result<&[u8], WireError> {
    if usize::try_from(declared).ok() != Some(rest.len()) {
        return Err(WireError::PayloadMismatch {
            opcode,
            declared: u64::from(declared),
            present: rest.len(),
        });
    }
    Ok(rest)
}

/// Parses one complete request (exactly the bytes of one read from `/dev/cuse`).
///
/// Checks syntax only: lengths, sizes and defined flag bits. Bytes after a fixed structure are
/// tolerated (newer kernels may grow structures) except where a size field names the payload.
pub fn parse_request(buf: &[u8]) -> Result<Message<'_>, WireError> {
    let (header, body) = split_request(buf)?;
    let opcode = header.opcode;
    let op = match opcode {
        CUSE_INIT => Op::Init(take(opcode, body)?.0),
        FUSE_OPEN => Op::Open(take(opcode, body)?.0),
        FUSE_RELEASE => Op::Release(take(opcode, body)?.0),
        FUSE_READ => Op::Read(take(opcode, body)?.0),
        FUSE_WRITE => {
            let (arg, rest) = take::<fuse_write_in>(opcode, body)?;
            let data = exact_payload(opcode, arg.size, rest)?;
            Op::Write(arg, Cow::Borrowed(data))
        }
        FUSE_FLUSH => Op::Flush(take(opcode, body)?.0),
        FUSE_FSYNC => Op::Fsync(take(opcode, body)?.0),
        FUSE_INTERRUPT => Op::Interrupt(take(opcode, body)?.0),
        FUSE_IOCTL => {
            let (arg, rest) = take::<fuse_ioctl_in>(opcode, body)?;
            let unknown = arg.flags & !FUSE_IOCTL_KNOWN_REQUEST_FLAGS;
            if unknown != 0 {
                return Err(WireError::UnknownFlags {
                    opcode,
                    flags: unknown,
                });
            }
            let data = exact_payload(opcode, arg.in_size, rest)?;
            Op::Ioctl(arg, Cow::Borrowed(data))
        }
        FUSE_POLL => {
            let (arg, _) = take::<fuse_poll_in>(opcode, body)?;
            let unknown = arg.flags & !FUSE_POLL_SCHEDULE_NOTIFY;
            if unknown != 0 {
                return Err(WireError::UnknownFlags {
                    opcode,
                    flags: unknown,
                });
            }
            Op::Poll(arg)
        }
        FUSE_DESTROY => Op::Destroy,
        other => Op::Unknown(other),
    };
    Ok(Message { header, op })
}

/// An ioctl's output bytes: most are a top-level struct of a few dozen bytes, kept inline up
/// to 64.
pub type ReplyData = smallvec::SmallVec<[u8; 64]>;

/// The body of a successful reply. [`ReplyBody::parts`] gives the bytes after the header.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplyBody {
    /// No body (RELEASE, FLUSH, FSYNC, DESTROY).
    Empty,
    /// `CUSE_INIT`: the structure and the `key=value\0` device info.
    Init(cuse_init_out, Vec<u8>),
    /// `FUSE_OPEN`.
    Open(fuse_open_out),
    /// `FUSE_READ`: the data.
    Data(Vec<u8>),
    /// `FUSE_WRITE`.
    Write(fuse_write_out),
    /// `FUSE_IOCTL`, final: the result and the output data.
    Ioctl(fuse_ioctl_out, ReplyData),
    /// `FUSE_IOCTL`, retry: `fuse_ioctl_out` with `FUSE_IOCTL_RETRY` and the in then out iovecs.
    IoctlRetry(fuse_ioctl_out, Vec<fuse_ioctl_iovec>),
    /// `FUSE_POLL`.
    Poll(fuse_poll_out),
}

impl ReplyBody {
    /// The body as (up to) two byte slices, written after the header in one `writev`.
    pub fn parts(&self) -> [&[u8]; 2] {
        match self {
            Self::Empty => [&[], &[]],
            Self::Init(out, info) => [out.as_bytes(), info],
            Self::Open(out) => [out.as_bytes(), &[]],
            Self::Data(data) => [data, &[]],
            Self::Write(out) => [out.as_bytes(), &[]],
            Self::Ioctl(out, data) => [out.as_bytes(), data],
            Self::IoctlRetry(out, iovs) => [out.as_bytes(), iovs.as_bytes()],
            Self::Poll(out) => [out.as_bytes(), &[]],
        }
    }

    /// Total length of the body.
    pub fn len(&self) -> usize {
        let [a, b] = self.parts();
        a.len().saturating_add(b.len())
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The header of a reply: `len` from the body length, `error` as `-errno` or 0.
pub fn reply_header(
    unique: u64,
    error: Option<Errno>,
    body_len: usize,
) -> Result<fuse_out_header, WireError> {
    let len = size_of::<fuse_out_header>()
        .checked_add(body_len)
        .ok_or(WireError::ReplyTooLong(usize::MAX))?;
    let len32 = u32::try_from(len).map_err(|_| WireError::ReplyTooLong(len))?;
    let error = error.map_or(0, |e| -e.raw());
    Ok(fuse_out_header {
        len: len32,
        error,
        unique,
    })
}

/// Encodes a complete reply into one buffer (what the session writes with one `writev`).
/// An error reply has no body.
pub fn encode_reply(unique: u64, reply: Result<&ReplyBody, Errno>) -> Result<Vec<u8>, WireError> {
    match reply {
        Ok(body) => {
            let hdr = reply_header(unique, None, body.len())?;
            let [a, b] = body.parts();
            let mut out = Vec::with_capacity(hdr.len as usize);
            out.extend_from_slice(hdr.as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b);
            Ok(out)
        }
        Err(e) => Ok(reply_header(unique, Some(e), 0)?.as_bytes().to_vec()),
    }
}

/// Encodes a `FUSE_NOTIFY_POLL` wake-up for the kernel poll handle `kh`.
pub fn encode_poll_wakeup(kh: u64) -> Vec<u8> {
    let body = fuse_notify_poll_wakeup_out { kh };
    #[expect(clippy::cast_possible_truncation, reason = "24 bytes")]
    const LEN: u32 =
        (size_of::<fuse_out_header>() + size_of::<fuse_notify_poll_wakeup_out>()) as u32;
    let hdr = fuse_out_header {
        len: LEN,
        error: FUSE_NOTIFY_POLL,
        unique: 0,
    };
    let mut out = hdr.as_bytes().to_vec();
    out.extend_from_slice(body.as_bytes());
    out
}

/// Builds the `DEVNAME=...\0` device info string for the `CUSE_INIT` reply.
pub fn devinfo(devname: &str) -> Vec<u8> {
    let mut info = Vec::with_capacity(devname.len() + 9);
    info.extend_from_slice(b"DEVNAME=");
    info.extend_from_slice(devname.as_bytes());
    info.push(0);
    info
}

/// Checks a CUSE device name: `/`-separated segments of `[A-Za-z0-9._-]`, no empty, `.` or `..`
/// segment (the kernel honours `..`), at most [`MAX_DEVNAME_LEN`] bytes.
pub fn validate_devname(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty name");
    }
    if name.len() > MAX_DEVNAME_LEN {
        return Err("name too long");
    }
    for seg in name.split('/') {
        if seg.is_empty() {
            return Err("empty path segment (leading, trailing or double '/')");
        }
        if seg == "." || seg == ".." {
            return Err("'.' or '..' path segment");
        }
        if !seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err("character outside [A-Za-z0-9._-]");
        }
    }
    Ok(())
}

/// The longest device name accepted by [`validate_devname`].
pub const MAX_DEVNAME_LEN: usize = 128;
