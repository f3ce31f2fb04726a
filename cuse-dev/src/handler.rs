//! The [`Handler`] trait and the types it sees and returns.

use std::fmt;
use std::fs::File;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::error::{CuseError, HandlerReplyError};
use crate::interrupt::InterruptFlag;
use crate::watchdog::{ClientWaits, Watchdog};
use crate::wire::{
    self, FUSE_IOCTL_32BIT, FUSE_IOCTL_COMPAT, FUSE_IOCTL_COMPAT_X32, FUSE_IOCTL_MAX_BYTES,
    FUSE_IOCTL_MAX_IOV, FUSE_IOCTL_RETRY, FUSE_IOCTL_UNRESTRICTED, ReplyBody, fuse_ioctl_iovec,
    fuse_ioctl_out,
};
use crate::{Errno, InitInfo};

/// The device's behaviour. One value serves every open file of the device, from many serving
/// threads at once, so methods take `&self`.
///
/// Every method runs on the serving thread that read the request and may block (syscalls, host
/// ioctls, even requests to this very device: another thread keeps reading meanwhile). Reply with
/// `Err(Errno::EINTR)` when [`Request::is_interrupted`] says the caller gave up. A panic is
/// caught and answered with `EIO`.
pub trait Handler: Send + Sync + 'static {
    /// `CUSE_INIT` was answered. Runs on the thread that called [`Session::run`](crate::Session::run)
    /// before any request is served: do not block here.
    ///
    /// This does not prove the device was registered: a name or number that is taken shows only
    /// as the connection ending right after (the session then returns `Ok`).
    fn init_done(&self, info: &InitInfo) {
        let _ = info;
    }

    /// `open(2)` of the device node. `flags` are the caller's `open` flags. The returned `fh`
    /// names this open file in every later request.
    fn open(&self, req: &Request, flags: u32) -> Result<Opened, Errno>;

    /// The last reference to an open file went away. The kernel waits for this reply (the
    /// closing thread blocks in `close`), and it cannot be interrupted. `req.pid()` is 0.
    fn release(&self, req: &Request, fh: u64, flags: u32) {
        let _ = (req, fh, flags);
    }

    /// `read(2)`: return at most `size` bytes.
    fn read(&self, req: &Request, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let _ = (req, fh, offset, size);
        Err(Errno::ENOSYS)
    }

    /// `write(2)`: return how many bytes of `data` were taken.
    fn write(&self, req: &Request, fh: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let _ = (req, fh, offset, data);
        Err(Errno::ENOSYS)
    }

    /// `ioctl(2)`. The kernel turns `ENOSYS` into `ENOTTY` for the caller.
    fn ioctl(&self, req: &Request, io: &Ioctl<'_>) -> Result<IoctlReply, Errno> {
        let _ = (req, io);
        Err(Errno::ENOTTY)
    }

    /// `poll(2)`/`select`/`epoll`: return the ready events (`POLLIN`, ...). When `notify` is
    /// `Some`, the kernel waits for a wake-up: keep the handle and call [`PollHandle::notify`]
    /// when readiness changes (from any thread). Answering `ENOSYS` makes the kernel stop
    /// asking and treat the device as always ready.
    fn poll(
        &self,
        req: &Request,
        fh: u64,
        events: u32,
        notify: Option<PollHandle>,
    ) -> Result<u32, Errno> {
        let _ = (req, fh, events, notify);
        Err(Errno::ENOSYS)
    }

    /// `FUSE_FLUSH` (the CUSE kernel does not send it as of 6.12; kept for completeness).
    fn flush(&self, req: &Request, fh: u64) -> Result<(), Errno> {
        let _ = (req, fh);
        Ok(())
    }

    /// `FUSE_FSYNC`.
    fn fsync(&self, req: &Request, fh: u64, datasync: bool) -> Result<(), Errno> {
        let _ = (req, fh, datasync);
        Ok(())
    }

    /// `FUSE_DESTROY` (the CUSE kernel does not send it as of 6.12; kept for completeness).
    fn destroy(&self) {}
}

/// Who sent a request, and whether they are still waiting for it.
#[derive(Clone)]
pub struct Request {
    pub(crate) unique: u64,
    pub(crate) opcode: u32,
    pub(crate) pid: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) interrupt: Arc<InterruptFlag>,
    /// The session's client-wait watchdog (`None` for a detached request).
    pub(crate) watchdog: Option<Arc<Watchdog>>,
}

impl Request {
    /// A request not tied to a session, for calling handlers directly in tests.
    pub fn detached(unique: u64, pid: u32, uid: u32, gid: u32) -> Self {
        Request {
            unique,
            opcode: 0,
            pid,
            uid,
            gid,
            interrupt: Arc::default(),
            watchdog: None,
        }
    }

    /// The request's client waits: arm one around each access to the caller's memory that
    /// the caller's page faults can block (`process_vm_readv`/`writev`); see `watchdog.rs`.
    /// Unbounded for a detached request.
    pub fn client_waits(&self) -> ClientWaits {
        ClientWaits::new(self.watchdog.clone(), Arc::clone(&self.interrupt))
    }

    /// What answers this request's ioctl before its handler returns ([`EarlyAnswer`]);
    /// `out_size` is the ioctl's (`Ioctl::out_size`).
    pub fn early_answer(&self, out_size: u32) -> EarlyAnswer {
        EarlyAnswer {
            unique: self.unique,
            out_size,
            interrupt: Arc::clone(&self.interrupt),
            watchdog: self.watchdog.clone(),
        }
    }

    /// The kernel's request id.
    pub fn unique(&self) -> u64 {
        self.unique
    }

    /// The FUSE opcode.
    pub fn opcode(&self) -> u32 {
        self.opcode
    }

    /// The calling **thread** id, in the pid namespace of the process that opened `/dev/cuse`.
    /// 0 when the caller is outside that namespace, and always 0 for RELEASE.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The caller's fs uid.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The caller's fs gid.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// Whether the kernel sent `FUSE_INTERRUPT` for this request (the caller got a signal; on
    /// a fatal one it cannot exit until we reply, so reply `EINTR` soon).
    pub fn is_interrupted(&self) -> bool {
        self.interrupt.is_set()
    }

    /// Blocks until the request is interrupted (`true`) or `timeout` passes (`false`).
    pub fn wait_interrupted(&self, timeout: Duration) -> bool {
        self.interrupt.wait(timeout)
    }

    /// Marks the request interrupted, as a `FUSE_INTERRUPT` would (for handler tests).
    pub fn interrupt(&self) {
        self.interrupt.raise();
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("unique", &self.unique)
            .field("opcode", &self.opcode)
            .field("pid", &self.pid)
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("interrupted", &self.is_interrupted())
            .finish()
    }
}

/// Answers one ioctl before its handler returns ([`Request::early_answer`]): the handler
/// sends the final answer as soon as it is known and finishes its bookkeeping while the
/// client goes on. The request's answer flag decides, as between the handler and the
/// client-wait watchdog: whoever claims it first answers, so the session sends nothing once an
/// early answer went out (and an early answer goes nowhere once the watchdog answered).
pub struct EarlyAnswer {
    unique: u64,
    out_size: u32,
    interrupt: Arc<InterruptFlag>,
    watchdog: Option<Arc<Watchdog>>,
}

impl fmt::Debug for EarlyAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EarlyAnswer")
            .field("unique", &self.unique)
            .field("out_size", &self.out_size)
            .field("in_session", &self.watchdog.is_some())
            .finish()
    }
}

impl EarlyAnswer {
    /// Sends the ioctl's final answer: `result` and `out` (the data the kernel copies back to
    /// the caller). True when it was sent (or the channel refused it: the client is gone);
    /// false when nothing was sent and the handler's return answers as usual: a request of no
    /// session ([`Request::detached`]), an answer the kernel would refuse (a negative result,
    /// more data than `out_size`), or a request already answered.
    pub fn ioctl(&self, result: i32, out: &[u8]) -> bool {
        let Some((chan, key)) = self.watchdog.as_deref().and_then(Watchdog::channel) else {
            return false;
        };
        if result < 0 || u32::try_from(out.len()).map_or(true, |n| n > self.out_size) {
            return false;
        }
        if !self.interrupt.take_answer() {
            return false;
        }
        let hdr = fuse_ioctl_out {
            result,
            flags: 0,
            in_iovs: 0,
            out_iovs: 0,
        };
        let body = ReplyBody::Ioctl(hdr, ReplyData::from_slice(out));
        crate::reply::send_logged(chan, key, self.unique, Ok(&body));
        true
    }
}

/// A successful open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Opened {
    /// Our handle for the open file, passed back in every later request on it.
    pub fh: u64,
    /// `FOPEN_*` flags ([`wire::FOPEN_NONSEEKABLE`], ...); usually 0.
    pub open_flags: u32,
}

/// One ioctl round as the handler sees it.
///
/// Restricted ioctls (no [`Ioctl::is_unrestricted`]) carry exactly the bytes `_IOC_SIZE(cmd)`
/// names for `_IOW`, and `out_size` is `_IOC_SIZE(cmd)` for `_IOR`. Unrestricted ioctls start
/// with no data; the handler asks for client memory with [`IoctlReply::Retry`] and is called
/// again (a new request) with `in_data` = the named input regions concatenated and `out_size` =
/// the total length of the named output regions. There is no round counter: tell rounds apart
/// by `in_data.len()` and `out_size`, as the kernel resends the same `cmd`, `arg` and `flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ioctl<'a> {
    /// The open file's handle.
    pub fh: u64,
    /// The command.
    pub cmd: u32,
    /// The raw argument: a pointer in the caller's address space, or a value.
    pub arg: u64,
    /// `FUSE_IOCTL_*` flags of the request.
    pub flags: u32,
    /// Input bytes copied from the caller.
    pub in_data: &'a [u8],
    /// The most output bytes the kernel copies back.
    pub out_size: u32,
    /// On a retry round, the regions `in_data` holds and the output regions, as the previous
    /// round's [`IoctlReply::Retry`] named them (the session keeps them per open file and
    /// calling thread between rounds); `None` on a first round.
    pub retry: Option<&'a RetryRound>,
}

/// The regions of one retry round: what a handler's [`IoctlReply::Retry`] asked for. The
/// kernel's next `FUSE_IOCTL` for the same open file and thread carries the `in_iovs`' bytes,
/// concatenated, and accepts up to the `out_iovs`' total length back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryRound {
    /// The input regions, in order.
    pub in_iovs: Vec<IoVec>,
    /// The output regions, in order.
    pub out_iovs: Vec<IoVec>,
}

impl RetryRound {
    /// Whether a request with `in_size` input bytes and room for `out_size` output bytes is
    /// this round's continuation.
    pub fn matches(&self, in_size: usize, out_size: u32) -> bool {
        let sum = |v: &[IoVec]| v.iter().map(|i| i.len).sum::<u64>();
        sum(&self.in_iovs) == in_size as u64 && sum(&self.out_iovs) == u64::from(out_size)
    }
}

impl Ioctl<'_> {
    /// Whether the device runs with unrestricted ioctls (retry allowed).
    pub fn is_unrestricted(&self) -> bool {
        self.flags & FUSE_IOCTL_UNRESTRICTED != 0
    }

    /// Whether this is a 32-bit compat call. The session refuses these with `ENOTTY` before a
    /// handler sees them, so handlers never get `true` here.
    pub fn is_compat(&self) -> bool {
        self.flags & (FUSE_IOCTL_COMPAT | FUSE_IOCTL_32BIT | FUSE_IOCTL_COMPAT_X32) != 0
    }
}

/// A region of the caller's memory, named in a retry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoVec {
    /// Address in the caller's address space.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
}

impl IoVec {
    /// A region of `len` bytes at `base`.
    pub fn new(base: u64, len: u64) -> Self {
        IoVec { base, len }
    }
}

pub use crate::wire::ReplyData;

/// A handler's answer to an ioctl round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoctlReply {
    /// The ioctl is finished: `result` is what `ioctl(2)` returns (must be >= 0; errors are
    /// `Err(Errno)`), `out` is copied to the caller (restricted: to `arg`; unrestricted: across
    /// the output regions of the last retry, in order). At most `out_size` bytes.
    Done {
        /// The return value (>= 0).
        result: i32,
        /// Output bytes.
        out: ReplyData,
    },
    /// Unrestricted only: copy these regions in (their bytes become the next round's
    /// `in_data`) and prepare these regions for output, then call again. At most
    /// [`FUSE_IOCTL_MAX_IOV`] regions in all, and [`FUSE_IOCTL_MAX_BYTES`] bytes per direction;
    /// larger requests are refused with `E2BIG` and an error log line.
    Retry {
        /// Regions to read from the caller.
        in_iovs: Vec<IoVec>,
        /// Regions the final output will be written to.
        out_iovs: Vec<IoVec>,
    },
}

impl IoctlReply {
    /// `Done` with a result and no output.
    pub fn result(result: i32) -> Self {
        IoctlReply::Done {
            result,
            out: ReplyData::new(),
        }
    }
}

/// Checks a handler's ioctl answer against what the kernel accepts, and encodes it.
pub(crate) fn ioctl_reply_body(
    io: &Ioctl<'_>,
    reply: IoctlReply,
) -> Result<ReplyBody, HandlerReplyError> {
    match reply {
        IoctlReply::Done { result, out } => {
            if result < 0 {
                return Err(HandlerReplyError::NegativeResult(result));
            }
            if u32::try_from(out.len()).map_or(true, |n| n > io.out_size) {
                return Err(HandlerReplyError::OutTooLong {
                    got: out.len(),
                    max: io.out_size,
                });
            }
            let hdr = fuse_ioctl_out {
                result,
                flags: 0,
                in_iovs: 0,
                out_iovs: 0,
            };
            Ok(ReplyBody::Ioctl(hdr, out))
        }
        IoctlReply::Retry { in_iovs, out_iovs } => {
            if !io.is_unrestricted() {
                return Err(HandlerReplyError::RetryRestricted);
            }
            let count = in_iovs.len().saturating_add(out_iovs.len());
            if count > FUSE_IOCTL_MAX_IOV {
                return Err(HandlerReplyError::TooManyIovecs {
                    got: count,
                    max: FUSE_IOCTL_MAX_IOV,
                });
            }
            for (direction, iovs) in [("input", &in_iovs), ("output", &out_iovs)] {
                let bytes = iovs.iter().try_fold(0u64, |acc, v| acc.checked_add(v.len));
                match bytes {
                    Some(b) if b <= FUSE_IOCTL_MAX_BYTES => {}
                    _ => {
                        return Err(HandlerReplyError::RetryTooLarge {
                            direction,
                            bytes: bytes.unwrap_or(u64::MAX),
                            max: FUSE_IOCTL_MAX_BYTES,
                        });
                    }
                }
            }
            // Both counts are <= 256 here, so they fit in u32.
            let hdr = fuse_ioctl_out {
                result: 0,
                flags: FUSE_IOCTL_RETRY,
                // At most FUSE_IOCTL_MAX_IOV each (checked when they were built).
                in_iovs: u32::try_from(in_iovs.len()).unwrap_or(u32::MAX),
                out_iovs: u32::try_from(out_iovs.len()).unwrap_or(u32::MAX),
            };
            let iovs = in_iovs
                .iter()
                .chain(out_iovs.iter())
                .map(|v| fuse_ioctl_iovec {
                    base: v.base,
                    len: v.len,
                })
                .collect();
            Ok(ReplyBody::IoctlRetry(hdr, iovs))
        }
    }
}

/// A kernel poll handle: call [`PollHandle::notify`] to wake the callers polling the file.
/// Cheap to clone, usable from any thread, and it does not keep the session alive.
#[derive(Clone)]
pub struct PollHandle {
    pub(crate) kh: u64,
    pub(crate) chan: Weak<File>,
}

impl PollHandle {
    /// The kernel's handle number (`fuse_poll_in.kh`); one per open file.
    pub fn kh(&self) -> u64 {
        self.kh
    }

    /// Sends `FUSE_NOTIFY_POLL`: the kernel wakes the pollers, which then send a new POLL.
    /// Fails with [`CuseError::Disconnected`] once the session is gone.
    pub fn notify(&self) -> Result<(), CuseError> {
        let chan = self.chan.upgrade().ok_or(CuseError::Disconnected)?;
        let msg = wire::encode_poll_wakeup(self.kh);
        crate::reply::write_all_once(&chan, &[&msg]).map_err(CuseError::Write)
    }
}

impl fmt::Debug for PollHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollHandle").field("kh", &self.kh).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unrestricted() -> Ioctl<'static> {
        Ioctl {
            retry: None,
            fh: 1,
            cmd: 0,
            arg: 0,
            flags: FUSE_IOCTL_UNRESTRICTED,
            in_data: &[],
            out_size: 4,
        }
    }

    fn retry(n_in: usize, n_out: usize, len: u64) -> IoctlReply {
        IoctlReply::Retry {
            in_iovs: vec![IoVec::new(0x1000, len); n_in],
            out_iovs: vec![IoVec::new(0x2000, len); n_out],
        }
    }

    #[test]
    fn retry_limits_are_the_kernels() {
        let io = unrestricted();
        // Exactly at the limits: 256 iovecs, 128 KiB per direction.
        let body = ioctl_reply_body(&io, retry(128, 128, 1024)).unwrap();
        let ReplyBody::IoctlRetry(out, iovs) = body else {
            panic!()
        };
        assert_eq!(
            (out.flags, out.in_iovs, out.out_iovs, iovs.len()),
            (FUSE_IOCTL_RETRY, 128, 128, 256)
        );
        assert!(ioctl_reply_body(&io, retry(1, 1, FUSE_IOCTL_MAX_BYTES)).is_ok());
        // One over.
        let err = ioctl_reply_body(&io, retry(200, 57, 1)).unwrap_err();
        assert_eq!(err, HandlerReplyError::TooManyIovecs { got: 257, max: 256 });
        assert_eq!(err.errno(), Errno::E2BIG);
        let err = ioctl_reply_body(&io, retry(0, 1, FUSE_IOCTL_MAX_BYTES + 1)).unwrap_err();
        assert!(matches!(
            err,
            HandlerReplyError::RetryTooLarge {
                direction: "output",
                ..
            }
        ));
        // Lengths that overflow u64 when summed.
        let err = ioctl_reply_body(&io, retry(2, 0, u64::MAX)).unwrap_err();
        assert!(matches!(
            err,
            HandlerReplyError::RetryTooLarge {
                bytes: u64::MAX,
                ..
            }
        ));
        // Retry on a restricted ioctl, negative result, output past out_size.
        let restricted = Ioctl { flags: 0, ..io };
        assert_eq!(
            ioctl_reply_body(&restricted, retry(1, 0, 4)),
            Err(HandlerReplyError::RetryRestricted)
        );
        assert_eq!(
            ioctl_reply_body(&io, IoctlReply::result(-1)),
            Err(HandlerReplyError::NegativeResult(-1))
        );
        let long = IoctlReply::Done {
            result: 0,
            out: vec![0; 5].into(),
        };
        assert_eq!(
            ioctl_reply_body(&io, long),
            Err(HandlerReplyError::OutTooLong { got: 5, max: 4 })
        );
    }

    #[test]
    fn wait_interrupted_times_out_or_wakes() {
        let req = Request::detached(2, 1, 0, 0);
        assert!(!req.wait_interrupted(Duration::from_millis(10)));
        let r2 = req.clone();
        let t = std::thread::spawn(move || r2.wait_interrupted(Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        req.interrupt();
        assert!(t.join().unwrap());
        assert!(req.is_interrupted());
    }
}
