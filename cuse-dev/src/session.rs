//! The session: one `/dev/cuse` channel, its reader loop and its worker pool.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tenant_log::tenant_log;
use tracing::{Span, debug, debug_span, error, info, trace, warn};
use zerocopy::FromBytes;

use crate::error::{CuseError, HandlerReplyError};
use crate::handler::{
    Handler, Ioctl, IoctlReply, PollHandle, Request, RetryRound, ioctl_reply_body,
};
use crate::interrupt::InterruptFlag;
use crate::reply::{reply_direct, send_logged, send_reply};
use crate::sys;
use crate::watchdog::Watchdog;
use crate::wire::{
    self, CUSE_INIT, CUSE_MIN_MINOR, CUSE_UNRESTRICTED_IOCTL, FUSE_IOCTL_32BIT, FUSE_IOCTL_COMPAT,
    FUSE_IOCTL_COMPAT_X32, FUSE_IOCTL_MAX_BYTES, FUSE_IOCTL_UNRESTRICTED,
    FUSE_KERNEL_MINOR_VERSION, FUSE_KERNEL_VERSION, FUSE_POLL_SCHEDULE_NOTIFY, Op, ReplyBody,
    cuse_init_in, cuse_init_out, fuse_in_header, fuse_ioctl_in, fuse_open_out, fuse_poll_out,
    fuse_write_out,
};
use crate::{Errno, Opened};

/// The largest `max_read`/`max_write` a [`DeviceConfig`] accepts.
pub const MAX_IO_SIZE: u32 = 1 << 20;
/// The largest char device major (`MKDEV` has 12 bits for it).
pub const MAX_DEV_MAJOR: u32 = (1 << 12) - 1;
/// The largest char device minor (`MINORBITS` is 20).
pub const MAX_DEV_MINOR: u32 = (1 << 20) - 1;

/// How to register the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The node's path below `/dev` (`DEVNAME=`); may contain `/` (devtmpfs creates the
    /// directories). Checked by [`wire::validate_devname`].
    pub devname: String,
    /// Char device major; 0 = dynamic (the kernel picks; learn it from `stat` of the node).
    pub dev_major: u32,
    /// Char device minor.
    pub dev_minor: u32,
    /// Ask for unrestricted ioctls (`CUSE_UNRESTRICTED_IOCTL`): handlers may answer
    /// [`IoctlReply::Retry`](crate::IoctlReply::Retry) and `_IOC` encodings are ignored.
    pub unrestricted_ioctl: bool,
    /// Largest READ the kernel sends (it raises values below 4096 to 4096).
    pub max_read: u32,
    /// Largest WRITE the kernel sends (it raises values below 4096 to 4096).
    pub max_write: u32,
    /// Most handlers running at once (at least 1); the session has at most one thread more,
    /// which reads. See the crate docs: this bounds how many handlers may block at the same
    /// time.
    pub max_workers: usize,
    /// A serving thread that stayed idle (waiting in `read`) for this long exits; two always
    /// stay.
    pub idle_timeout: Duration,
    /// How long a handler's armed wait on the client's memory may last before the request is
    /// answered `EFAULT` without it (`watchdog.rs`).
    pub client_wait_timeout: Duration,
    /// The key of the limit on log lines a tenant can cause (malformed or refused requests,
    /// stuck waits; the `tenant-log` crate): an instance's name, so that they share its
    /// limit with its other lines. `devname` by default.
    pub log_key: String,
}

impl DeviceConfig {
    /// Defaults: dynamic number, unrestricted ioctls, 128 KiB reads/writes, 64 workers, 10 s
    /// idle timeout, 10 s client-wait timeout.
    pub fn new(devname: impl Into<String>) -> Self {
        let devname: String = devname.into();
        DeviceConfig {
            log_key: devname.clone(),
            devname,
            dev_major: 0,
            dev_minor: 0,
            unrestricted_ioctl: true,
            max_read: 128 * 1024,
            max_write: 128 * 1024,
            max_workers: 64,
            idle_timeout: Duration::from_secs(10),
            client_wait_timeout: Duration::from_secs(10),
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<(), CuseError> {
        wire::validate_devname(&self.devname).map_err(|reason| CuseError::InvalidName {
            name: self.devname.clone(),
            reason,
        })?;
        if self.dev_major > MAX_DEV_MAJOR || self.dev_minor > MAX_DEV_MINOR {
            return Err(CuseError::InvalidConfig(format!(
                "device number {}:{} out of range (major <= {MAX_DEV_MAJOR}, minor <= {MAX_DEV_MINOR})",
                self.dev_major, self.dev_minor
            )));
        }
        if self.max_read > MAX_IO_SIZE || self.max_write > MAX_IO_SIZE {
            return Err(CuseError::InvalidConfig(format!(
                "max_read {} / max_write {} above {MAX_IO_SIZE}",
                self.max_read, self.max_write
            )));
        }
        if self.max_workers == 0 {
            return Err(CuseError::InvalidConfig(
                "max_workers must be at least 1".into(),
            ));
        }
        if self.client_wait_timeout.is_zero() {
            return Err(CuseError::InvalidConfig(
                "client_wait_timeout must be above 0".into(),
            ));
        }
        Ok(())
    }

    /// Size of the buffer one request is read into: large enough for the biggest WRITE and
    /// the biggest ioctl input, and at least the kernel's `FUSE_MIN_READ_BUFFER` (8192).
    fn read_buffer_size(&self) -> usize {
        let hdr = size_of::<fuse_in_header>();
        let write = hdr
            + size_of::<wire::fuse_write_in>()
            + usize::try_from(self.max_write.max(4096)).unwrap_or(usize::MAX);
        let ioctl = hdr
            + size_of::<fuse_ioctl_in>()
            + usize::try_from(FUSE_IOCTL_MAX_BYTES).unwrap_or(usize::MAX);
        write.max(ioctl).max(8192)
    }
}

/// What `CUSE_INIT` settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitInfo {
    /// The kernel's FUSE major.
    pub kernel_major: u32,
    /// The kernel's FUSE minor.
    pub kernel_minor: u32,
    /// The minor we answered (`min(kernel, ours)`).
    pub minor: u32,
    /// The flags we answered (`CUSE_UNRESTRICTED_IOCTL` or 0).
    pub flags: u32,
    /// `max_read` we answered.
    pub max_read: u32,
    /// `max_write` we answered.
    pub max_write: u32,
    /// The major we asked for (0 = dynamic: the kernel does not tell us its choice).
    pub dev_major: u32,
    /// The minor we asked for.
    pub dev_minor: u32,
}

#[derive(Debug)]
struct ControlInner {
    stop_fd: File,
    stopped: AtomicBool,
    init: Mutex<Option<InitInfo>>,
    init_cv: Condvar,
    workers: AtomicUsize,
    /// What the supervising thread (the caller of [`Session::run`]) waits for: how the
    /// connection ended, set by the serving thread that saw it. `stop` only notifies.
    end: Mutex<Option<Result<(), CuseError>>>,
    end_cv: Condvar,
    /// [`SessionControl::suspend`] asked: `run_handover` hands the channel back.
    suspending: AtomicBool,
    /// The channel while the session serves (for [`SessionControl::poll_handle`]).
    chan: Mutex<std::sync::Weak<File>>,
}

/// Controls a running [`Session`] from other threads. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SessionControl {
    inner: Arc<ControlInner>,
}

impl SessionControl {
    fn new() -> Result<Self, CuseError> {
        let stop_fd = File::from(sys::eventfd().map_err(CuseError::Setup)?);
        Ok(SessionControl {
            inner: Arc::new(ControlInner {
                stop_fd,
                stopped: AtomicBool::new(false),
                init: Mutex::new(None),
                init_cv: Condvar::new(),
                workers: AtomicUsize::new(0),
                end: Mutex::new(None),
                end_cv: Condvar::new(),
                suspending: AtomicBool::new(false),
                chan: Mutex::new(std::sync::Weak::new()),
            }),
        })
    }

    /// Asks [`Session::run`] to return: it stops reading (threads blocked in `read` are woken
    /// with a signal, see the crate docs), lets running handlers finish (their replies are still
    /// written) and returns `Ok`. The channel closes, and so the device goes away, once the last
    /// handler is done.
    pub fn stop(&self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        if let Err(e) = (&self.inner.stop_fd).write(&1u64.to_ne_bytes()) {
            // EAGAIN means the counter is already non-zero: the reader is woken anyway.
            if e.kind() != io::ErrorKind::WouldBlock {
                warn!(error = %e, "cannot signal the session reader to stop");
            }
        }
        let _guard = self
            .inner
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.inner.end_cv.notify_all();
    }

    /// Asks [`Session::run_handover`] to hand the channel back instead of ending: it stops
    /// reading as [`SessionControl::stop`] does, waits for the running handlers' replies, and
    /// returns [`Suspended`]: the channel (the kernel's device stays registered, its open files
    /// stay open, and requests not yet read wait in the kernel's queue for whoever reads the
    /// channel next) and the retry rounds in progress. [`Session::resume`] serves it again, in
    /// this process or another one it was passed to.
    pub fn suspend(&self) {
        self.inner.suspending.store(true, Ordering::SeqCst);
        self.stop();
    }

    /// A poll handle for the kernel's handle `kh` on this session's channel, while it serves:
    /// what a handler that took over a session's open files ([`Session::resume`]) keeps to wake
    /// the pollers the previous server registered (`fuse_poll_in.kh` survives a handover; the
    /// previous server's [`PollHandle`]s do not).
    pub fn poll_handle(&self, kh: u64) -> Option<PollHandle> {
        let chan = self
            .inner
            .chan
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        chan.upgrade().is_some().then_some(PollHandle { kh, chan })
    }

    /// Whether [`SessionControl::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    /// The `CUSE_INIT` outcome, once it was answered.
    pub fn init_info(&self) -> Option<InitInfo> {
        *self
            .inner
            .init
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits up to `timeout` for `CUSE_INIT` to be answered.
    pub fn wait_init(&self, timeout: Duration) -> Option<InitInfo> {
        let guard = self
            .inner
            .init
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (guard, _) = self
            .inner
            .init_cv
            .wait_timeout_while(guard, timeout, |i| i.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        *guard
    }

    /// Serving threads alive right now, not counting the one kept reading: each reads requests
    /// and runs the handlers of what it read, so this is how many handlers could run at once
    /// right now (at most [`DeviceConfig::max_workers`]).
    pub fn worker_count(&self) -> usize {
        self.inner.workers.load(Ordering::SeqCst)
    }

    /// Records how the connection ended (the first report wins) and wakes the supervisor.
    fn set_end(&self, end: Result<(), CuseError>) {
        let mut slot = self
            .inner
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(end);
        }
        self.inner.end_cv.notify_all();
    }

    fn set_init(&self, info: InitInfo) {
        *self
            .inner
            .init
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(info);
        self.inner.init_cv.notify_all();
    }
}

/// One CUSE device: the channel to the kernel and its configuration.
#[derive(Debug)]
pub struct Session {
    chan: Arc<File>,
    cfg: DeviceConfig,
    control: SessionControl,
    thread_start: Option<ThreadStart>,
    /// Set by [`Session::resume`]: `CUSE_INIT` was answered by an earlier server.
    resumed: Option<(InitInfo, Vec<PendingRetry>)>,
}

/// A retry round in progress (the caller thread `tid` of open file `fh` is blocked in an
/// unrestricted ioctl whose next round the kernel has yet to send): what a session that takes
/// over the channel needs to recognise that round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRetry {
    /// The open file.
    pub fh: u64,
    /// The calling thread (as the kernel names it in the request header).
    pub tid: u32,
    /// The regions the next round carries.
    pub round: RetryRound,
}

/// A session handed back by [`Session::run_handover`] after [`SessionControl::suspend`].
#[derive(Debug)]
pub struct Suspended {
    /// The channel (a duplicate of the session's `/dev/cuse` file: the same connection).
    pub channel: OwnedFd,
    /// What `CUSE_INIT` settled when the device was registered.
    pub init: InitInfo,
    /// The retry rounds in progress.
    pub retries: Vec<PendingRetry>,
}

/// The hook of [`Session::on_thread_start`].
#[derive(Clone)]
struct ThreadStart(Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for ThreadStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ThreadStart(..)")
    }
}

/// What one read attempt gave.
enum ReadOutcome {
    Message(usize),
    Stopped,
    Ended,
}

impl Session {
    /// Opens `/dev/cuse` for a new device. The kernel sends `CUSE_INIT` right away; the device
    /// appears once [`Session::run`] has answered it.
    pub fn open(cfg: DeviceConfig) -> Result<Self, CuseError> {
        cfg.validate()?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/cuse")
            .map_err(CuseError::Open)?;
        Self::with_file(file, cfg)
    }

    /// Serves a channel that is already open: `/dev/cuse` opened elsewhere (inherited, or
    /// from a file-descriptor store), or one end of [`seqpacket_pair`](crate::seqpacket_pair)
    /// whose other end plays the kernel (tests).
    pub fn from_fd(fd: OwnedFd, cfg: DeviceConfig) -> Result<Self, CuseError> {
        cfg.validate()?;
        Self::with_file(File::from(fd), cfg)
    }

    fn with_file(file: File, cfg: DeviceConfig) -> Result<Self, CuseError> {
        Ok(Session {
            chan: Arc::new(file),
            cfg,
            control: SessionControl::new()?,
            thread_start: None,
            resumed: None,
        })
    }

    /// Serves a channel whose `CUSE_INIT` an earlier session answered ([`Suspended`]): no
    /// `CUSE_INIT` is expected, the device and its open files are the kernel's as before, and
    /// the next request read is the first this session answers. `init` must be what that
    /// session settled; `cfg` is checked against it (the same name and ioctl mode).
    pub fn resume(
        fd: OwnedFd,
        cfg: DeviceConfig,
        init: InitInfo,
        retries: Vec<PendingRetry>,
    ) -> Result<Self, CuseError> {
        cfg.validate()?;
        let unrestricted = init.flags & CUSE_UNRESTRICTED_IOCTL != 0;
        if unrestricted != cfg.unrestricted_ioctl {
            return Err(CuseError::InvalidConfig(format!(
                "resuming {}: the device was registered with unrestricted_ioctl = {unrestricted}",
                cfg.devname
            )));
        }
        if retries.len() > MAX_RETRY_ROUNDS {
            return Err(CuseError::InvalidConfig(format!(
                "resuming {}: {} retry rounds (at most {MAX_RETRY_ROUNDS})",
                cfg.devname,
                retries.len()
            )));
        }
        let mut s = Self::with_file(File::from(fd), cfg)?;
        s.resumed = Some((init, retries));
        Ok(s)
    }

    /// Runs `hook` on every serving thread when it starts, before it reads its first request:
    /// for per-thread state that handlers rely on (Linux credentials and capabilities are per
    /// thread). The thread that calls [`Session::run`] answers `CUSE_INIT` and supervises only;
    /// it does not run the hook. A hook cannot refuse the thread: one whose failure must not
    /// let requests through records its outcome where the handlers check it. A panic in the
    /// hook is logged and the thread serves on.
    pub fn on_thread_start(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.thread_start = Some(ThreadStart(Arc::new(hook)));
        self
    }

    /// A handle to stop the session and to learn when `CUSE_INIT` was answered.
    pub fn control(&self) -> SessionControl {
        self.control.clone()
    }

    /// The configuration.
    pub fn config(&self) -> &DeviceConfig {
        &self.cfg
    }

    /// Answers `CUSE_INIT`, then serves requests until the kernel ends the connection
    /// (`Ok`; this includes a failed registration, see the crate docs), the session is stopped
    /// (`Ok`, also before `CUSE_INIT`), or reading fails (`Err`). A connection that ends before
    /// `CUSE_INIT` is [`CuseError::EndedBeforeInit`]. The calling thread reads `CUSE_INIT`, then
    /// supervises: requests are read and handled by the session's serving threads (crate docs,
    /// "Threading").
    pub fn run(self, handler: Arc<dyn Handler>) -> Result<(), CuseError> {
        self.run_handover(handler).map(|_| ())
    }

    /// [`Session::run`], except that a session ended by [`SessionControl::suspend`] returns
    /// `Some(`[`Suspended`]`)`: the channel, for [`Session::resume`]. Running handlers get
    /// a grace of one second; past it, every wait on a client's memory is answered at once
    /// (`EFAULT`, as its deadline would), and a request the watchdog answered counts as done:
    /// its thread, still parked, writes nothing more and takes nothing after the handover.
    /// If other handlers still run when the client-wait timeout (plus a margin) has passed,
    /// the suspension fails with [`CuseError::SuspendTimeout`]; the channel stays this
    /// process's (closed with the session), and nothing was handed over.
    pub fn run_handover(
        mut self,
        handler: Arc<dyn Handler>,
    ) -> Result<Option<Suspended>, CuseError> {
        let (info, retries) = match self.resumed.take() {
            Some((info, retries)) => {
                info!(devname = %self.cfg.devname, retries = retries.len(), "CUSE session resumed");
                (info, retries)
            }
            None => {
                let mut buf = vec![0u8; self.cfg.read_buffer_size()];
                let info = loop {
                    let n = match self.read_one(&mut buf)? {
                        ReadOutcome::Message(n) => n,
                        ReadOutcome::Stopped => return Ok(None),
                        ReadOutcome::Ended => return Err(CuseError::EndedBeforeInit),
                    };
                    let Some(bytes) = buf.get(..n) else { continue };
                    if let Some(info) = self.handle_pre_init(bytes)? {
                        break info;
                    }
                };
                info!(
                    devname = %self.cfg.devname,
                    minor = info.minor,
                    kernel_minor = info.kernel_minor,
                    unrestricted = info.flags & CUSE_UNRESTRICTED_IOCTL != 0,
                    "CUSE_INIT answered"
                );
                (info, Vec::new())
            }
        };
        *self
            .control
            .inner
            .chan
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(&self.chan);
        self.control.set_init(info);
        handler.init_done(&info);

        // From here on the serving threads block in `read` (no `poll`: several threads polling
        // one channel would all wake for every request); `stop` wakes them with a signal.
        sys::install_wake_handler().map_err(CuseError::Setup)?;
        sys::set_nonblocking(self.chan.as_fd(), false).map_err(CuseError::Setup)?;
        let timeout = self.cfg.client_wait_timeout;
        let shared = Arc::new_cyclic(|me: &std::sync::Weak<Shared>| Shared {
            chan: Arc::clone(&self.chan),
            handler,
            inflight: Mutex::new(IdMap::default()),
            pool: Mutex::new(PoolState::default()),
            max: self.cfg.max_workers,
            buf_size: self.cfg.read_buffer_size(),
            control: self.control.clone(),
            thread_start: self.thread_start.clone(),
            watchdog: {
                // The watchdog looks at the session's requests in flight.
                let me = me.clone();
                Watchdog::new(
                    Some(Arc::clone(&self.chan)),
                    self.cfg.log_key.clone(),
                    timeout,
                    Box::new(move |f| {
                        if let Some(shared) = me.upgrade() {
                            for (&unique, flag) in shared.inflight().iter() {
                                f(unique, flag);
                            }
                        }
                    }),
                )
            },
            retries: Mutex::new(
                retries
                    .into_iter()
                    .map(|p| ((p.fh, p.tid), p.round))
                    .collect(),
            ),
            handed_over: AtomicBool::new(false),
            attention: AtomicUsize::new(0),
            log_key: self.cfg.log_key.clone(),
        });
        for i in 0..MIN_THREADS {
            if let Err(e) = shared.start_thread() {
                error!(error = %e, "cannot start a serving thread");
                if i == 0 {
                    return Err(CuseError::Setup(e));
                }
            }
        }
        let end = shared.supervise(self.cfg.idle_timeout);
        if !self.control.inner.suspending.load(Ordering::SeqCst) || end.is_err() {
            shared.watchdog.stop();
            // What the limit left out of the session's tenant-caused lines is said now.
            tenant_log::flush(&self.cfg.log_key);
            return end.map(|()| None);
        }
        // Suspended: every running handler's reply goes out before the channel is handed on.
        // A handler stuck on its client's memory (a page the tenant holds with userfaultfd)
        // cannot veto it: the watchdog keeps answering such waits, past the grace at once
        // (its deadline brought forward to SUSPEND_CLIENT_WAIT), and a request it answered
        // counts as done; its thread stays parked and takes nothing more (`handed_over`).
        let started = Instant::now();
        let deadline = started + timeout + SUSPEND_MARGIN;
        let mut hurried = false;
        loop {
            let (running, parked, queued) = shared.suspension_counts();
            if running == 0 && queued == 0 {
                if parked > 0 {
                    warn!(devname = %self.cfg.devname, parked, "suspension: serving threads still wait on their client's memory; their requests were answered EFAULT, they stay behind");
                }
                break;
            }
            // Queued requests behind parked threads get threads of their own (bounded).
            shared.run_queued_past_parked();
            if hurried && running == 0 && parked > 0 && queued > 0 {
                // Every thread left is parked on memory its tenant holds, and the pool is at
                // its bound: what waits behind them is answered as the hurried deadline
                // answers a wait on client memory, so that no tenant holds the handover.
                let failed = shared.fail_queued(Errno::EFAULT);
                warn!(devname = %self.cfg.devname, parked, failed, "suspension: the pool is full of threads parked on their client's memory; the requests queued behind them were answered EFAULT");
            }
            if !hurried && started.elapsed() >= SUSPEND_GRACE {
                hurried = true;
                warn!(devname = %self.cfg.devname, running, queued, "suspension: handlers still running after {} ms; those waiting on their client's memory are answered EFAULT now", SUSPEND_GRACE.as_millis());
                shared.watchdog.hurry(SUSPEND_CLIENT_WAIT);
            }
            if Instant::now() > deadline {
                shared.watchdog.stop();
                return Err(CuseError::SuspendTimeout {
                    running,
                    parked,
                    queued,
                });
            }
            thread::sleep(Duration::from_millis(2));
        }
        shared.handed_over.store(true, Ordering::SeqCst);
        shared.watchdog.stop();
        let retries = shared
            .retries_lock()
            .drain()
            .map(|((fh, tid), round)| PendingRetry { fh, tid, round })
            .collect();
        let channel = self.chan.try_clone().map_err(CuseError::Setup)?;
        info!(devname = %self.cfg.devname, "CUSE session suspended: the channel is handed over");
        Ok(Some(Suspended {
            channel: OwnedFd::from(channel),
            init: info,
            retries,
        }))
    }

    /// Reads one request. Waits in `poll` on the channel and the stop eventfd, so
    /// [`SessionControl::stop`] works even while no requests come.
    fn read_one(&self, buf: &mut [u8]) -> Result<ReadOutcome, CuseError> {
        loop {
            if self.control.is_stopped() {
                return Ok(ReadOutcome::Stopped);
            }
            match sys::poll2(self.chan.as_fd(), self.control.inner.stop_fd.as_fd(), None) {
                Ok(r) if r.second => return Ok(ReadOutcome::Stopped),
                Ok(r) if !r.first => continue,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(CuseError::Read(e)),
            }
            match (&*self.chan).read(buf) {
                Ok(0) => return Ok(ReadOutcome::Ended),
                Ok(n) => {
                    trace!(bytes = ?buf.get(..n), "request");
                    return Ok(ReadOutcome::Message(n));
                }
                Err(e) => match e.raw_os_error() {
                    // ENOENT: the request was interrupted/withdrawn before we got it.
                    Some(libc::ENOENT | libc::EINTR | libc::EAGAIN) => continue,
                    Some(libc::ENODEV) => return Ok(ReadOutcome::Ended),
                    _ => return Err(CuseError::Read(e)),
                },
            }
        }
    }

    /// Handles a message that arrives before `CUSE_INIT` was answered: `Some` once it was.
    fn handle_pre_init(&self, bytes: &[u8]) -> Result<Option<InitInfo>, CuseError> {
        let msg = match wire::parse_request(bytes) {
            Ok(m) => m,
            Err(e) => {
                match fuse_in_header::read_from_prefix(bytes) {
                    Ok((hdr, _)) if hdr.opcode == CUSE_INIT => {
                        reply_direct(&self.chan, &self.cfg.log_key, &hdr, Err(e.errno()));
                        return Err(CuseError::BadInit(e));
                    }
                    Ok((hdr, _)) => {
                        reply_direct(&self.chan, &self.cfg.log_key, &hdr, Err(e.errno()))
                    }
                    Err(_) => {
                        tenant_log!(warn, &self.cfg.log_key, error = %e, "dropping malformed request")
                    }
                }
                return Ok(None);
            }
        };
        let Op::Init(arg) = msg.op else {
            warn!(
                opcode = msg.header.opcode,
                "request before CUSE_INIT; answering EIO"
            );
            reply_direct(&self.chan, &self.cfg.log_key, &msg.header, Err(Errno::EIO));
            return Ok(None);
        };
        match self.negotiate(&arg) {
            Ok((out, info)) => {
                let body = ReplyBody::Init(out, wire::devinfo(&self.cfg.devname));
                send_reply(&self.chan, msg.header.unique, Ok(&body)).map_err(CuseError::Write)?;
                Ok(Some(info))
            }
            Err(e) => {
                error!(error = %e, "cannot serve this kernel");
                reply_direct(
                    &self.chan,
                    &self.cfg.log_key,
                    &msg.header,
                    Err(Errno::EPROTO),
                );
                Err(e)
            }
        }
    }

    /// Chooses the `CUSE_INIT` answer.
    fn negotiate(&self, arg: &cuse_init_in) -> Result<(cuse_init_out, InitInfo), CuseError> {
        negotiate(&self.cfg, arg)
    }
}

/// Chooses the `CUSE_INIT` answer for `cfg` given the kernel's offer.
pub(crate) fn negotiate(
    cfg: &DeviceConfig,
    arg: &cuse_init_in,
) -> Result<(cuse_init_out, InitInfo), CuseError> {
    let minor = arg.minor.min(FUSE_KERNEL_MINOR_VERSION);
    if arg.major != FUSE_KERNEL_VERSION || minor < CUSE_MIN_MINOR {
        return Err(CuseError::UnsupportedProtocol {
            major: arg.major,
            minor: arg.minor,
            ours: FUSE_KERNEL_MINOR_VERSION,
        });
    }
    let flags = if cfg.unrestricted_ioctl {
        CUSE_UNRESTRICTED_IOCTL
    } else {
        0
    };
    if cfg.unrestricted_ioctl && arg.flags & CUSE_UNRESTRICTED_IOCTL == 0 {
        warn!(
            kernel_flags = arg.flags,
            "kernel did not offer CUSE_UNRESTRICTED_IOCTL; asking anyway"
        );
    }
    let out = cuse_init_out {
        major: FUSE_KERNEL_VERSION,
        minor,
        unused: 0,
        flags,
        max_read: cfg.max_read,
        max_write: cfg.max_write,
        dev_major: cfg.dev_major,
        dev_minor: cfg.dev_minor,
        spare: [0; 10],
    };
    let info = InitInfo {
        kernel_major: arg.major,
        kernel_minor: arg.minor,
        minor,
        flags,
        max_read: cfg.max_read,
        max_write: cfg.max_write,
        dev_major: cfg.dev_major,
        dev_minor: cfg.dev_minor,
    };
    Ok((out, info))
}

/// Serving threads kept when idle: one blocked in `read`, and one more so that a request that
/// arrives while the other runs a handler never waits for a thread to be started.
const MIN_THREADS: usize = 2;

/// How often the supervisor re-sends the wake signal to threads that should leave `read`
/// (a signal that arrives just before a thread enters `read` does not interrupt it).
const WAKE_RETRY: Duration = Duration::from_millis(10);

/// How long the supervisor keeps waking readers on stop before it gives up and returns.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// A map keyed by ids that no client chooses (the kernel's request uniques, our thread ids),
/// so a multiplicative hash is enough: SipHash's protection against chosen keys is not needed
/// on this per-request path.
type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// The hasher of [`IdMap`].
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// What every serving thread and the supervisor share.
struct Shared {
    chan: Arc<File>,
    handler: Arc<dyn Handler>,
    /// Requests read and not yet answered, by `unique`, so that `FUSE_INTERRUPT` can reach
    /// them (whichever thread reads the interrupt).
    inflight: Mutex<IdMap<Arc<InterruptFlag>>>,
    pool: Mutex<PoolState>,
    /// Most handlers running at once (`max_workers`).
    max: usize,
    /// Size of each thread's request buffer.
    buf_size: usize,
    control: SessionControl,
    /// [`Session::on_thread_start`]'s hook.
    thread_start: Option<ThreadStart>,
    /// Bounds handlers' waits on client memory (`watchdog.rs`).
    watchdog: Arc<Watchdog>,
    /// [`DeviceConfig::log_key`].
    log_key: String,
    /// The regions of each retry round in progress, by (fh, calling thread): what the next
    /// round's data holds (at most [`MAX_RETRY_ROUNDS`]).
    retries: Mutex<HashMap<(u64, u32), RetryRound>>,
    /// The channel was handed over ([`Session::run_handover`]): a thread still parked on a
    /// request the watchdog answered takes nothing more when it comes back.
    handed_over: AtomicBool,
    /// Reasons a reading thread must look at the pool before it reads again: the retire
    /// flags set and not yet seen, plus one for shutdown. Zero, the usual case, spares every
    /// request a pool lock (`leave_if_asked`). Only grows while the flag it counts is set
    /// under the pool lock, and shrinks when a thread consumes its flag under that lock.
    attention: AtomicUsize,
}

/// Retry rounds in progress per session (each is one caller thread blocked in an ioctl).
pub const MAX_RETRY_ROUNDS: usize = 4096;

/// How much longer than the client-wait timeout a suspension waits for running handlers.
const SUSPEND_MARGIN: Duration = Duration::from_secs(5);
/// How long a suspension lets running handlers finish as usual; past it, waits on the
/// client's memory are answered at once (as the socket transport's suspension does).
const SUSPEND_GRACE: Duration = Duration::from_secs(1);
/// The client-wait deadline while a suspension is past its grace.
const SUSPEND_CLIENT_WAIT: Duration = Duration::from_millis(100);

/// One serving thread.
struct Slot {
    /// Set by the thread when it starts; only threads with a handle are ever signalled.
    thread: Option<sys::ThreadHandle>,
    /// In (or on its way to) `read`, as opposed to running handlers.
    reading: bool,
    /// Requests it took; the supervisor compares this between two looks to find idle threads.
    served: u64,
    seen: u64,
    /// Asked to exit by the supervisor (idle).
    retire: bool,
    /// The request whose handler it runs (a suspension looks whether the watchdog answered
    /// it).
    current: Option<Arc<InterruptFlag>>,
}

/// The pool. `readers + busy == slots.len()`: every thread either reads or runs handlers.
#[derive(Default)]
struct PoolState {
    slots: IdMap<Slot>,
    next_id: u64,
    readers: usize,
    busy: usize,
    /// Requests read while `max` handlers were running; a thread that finishes a handler
    /// takes the next one before it goes back to reading.
    queue: VecDeque<Job<'static>>,
    shutdown: bool,
    warned_full: bool,
}

impl PoolState {
    fn slot(&mut self, id: u64) -> Option<&mut Slot> {
        self.slots.get_mut(&id)
    }
}

impl Shared {
    fn retries_lock(&self) -> MutexGuard<'_, HashMap<(u64, u32), RetryRound>> {
        self.retries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn inflight(&self) -> MutexGuard<'_, IdMap<Arc<InterruptFlag>>> {
        self.inflight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn pool(&self) -> MutexGuard<'_, PoolState> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish_count(&self, st: &PoolState) {
        self.control
            .inner
            .workers
            .store(st.slots.len().saturating_sub(1), Ordering::SeqCst);
    }

    /// Adds a reading slot for a thread about to be started.
    fn reserve_slot(&self, st: &mut PoolState) -> u64 {
        let id = st.next_id;
        st.next_id += 1;
        st.slots.insert(
            id,
            Slot {
                thread: None,
                reading: true,
                served: 0,
                seen: 0,
                retire: false,
                current: None,
            },
        );
        st.readers += 1;
        self.publish_count(st);
        id
    }

    fn remove_slot(&self, st: &mut PoolState, id: u64) {
        if let Some(slot) = st.slots.remove(&id) {
            if slot.reading {
                st.readers -= 1;
            } else {
                st.busy -= 1;
            }
        }
        self.publish_count(st);
    }

    /// Starts one more serving thread (it begins by reading).
    fn start_thread(self: &Arc<Self>) -> io::Result<()> {
        let id = {
            let mut st = self.pool();
            self.reserve_slot(&mut st)
        };
        self.spawn_reserved(id, None)
    }

    /// Spawns the thread of slot `id`; with `first`, a queued request the slot was made busy
    /// for, which it runs before it reads ([`Shared::run_queued_past_parked`]).
    fn spawn_reserved(self: &Arc<Self>, id: u64, first: Option<Job<'static>>) -> io::Result<()> {
        let shared = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name("cuse-worker".into())
            .spawn(move || shared.serve(id, first));
        if let Err(e) = spawned {
            let mut st = self.pool();
            self.remove_slot(&mut st, id);
            return Err(e);
        }
        Ok(())
    }

    /// A serving thread: reads a request, and runs its handler itself once it made sure that
    /// another thread is reading (leader/follower, as libfuse's multi-threaded loop).
    fn serve(self: Arc<Self>, id: u64, first: Option<Job<'static>>) {
        if let Some(ThreadStart(hook)) = &self.thread_start
            && catch_unwind(AssertUnwindSafe(|| hook())).is_err()
        {
            error!("thread start hook panicked");
        }
        if let Err(e) = sys::unblock_wake_signal() {
            warn!(error = %e, "cannot unblock the wake signal; stop may hang");
        }
        {
            let mut st = self.pool();
            if let Some(slot) = st.slot(id) {
                slot.thread = Some(sys::ThreadHandle::current());
            }
        }
        if let Some(job) = first {
            self.execute(job);
            self.after_handler(id);
        }
        let mut buf = vec![0u8; self.buf_size];
        loop {
            if self.leave_if_asked(id) {
                return;
            }
            match sys::read(self.chan.as_fd(), &mut buf) {
                Ok(0) => return self.ended(id, Ok(())),
                Ok(n) => {
                    if let Some(bytes) = buf.get(..n) {
                        trace!(bytes = ?bytes, "request");
                        self.dispatch(id, bytes);
                    }
                }
                Err(e) => match e.raw_os_error() {
                    // EINTR: woken by the supervisor (or any signal): look at the flags again.
                    // ENOENT: the request was interrupted/withdrawn before we got it.
                    Some(libc::ENOENT | libc::EINTR | libc::EAGAIN) => {}
                    Some(libc::ENODEV) => return self.ended(id, Ok(())),
                    _ => return self.ended(id, Err(CuseError::Read(e))),
                },
            }
        }
    }

    /// Whether this (reading) thread should exit: the session shuts down, or the supervisor
    /// retired it and enough other threads remain. Unregisters it if so.
    fn leave_if_asked(&self, id: u64) -> bool {
        if self.attention.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let mut st = self.pool();
        let retire = st.slots.get(&id).is_some_and(|s| s.retire);
        if retire {
            // This thread's flag is consumed below, by leaving or by clearing it.
            self.attention.fetch_sub(1, Ordering::SeqCst);
        }
        let leave = st.shutdown || (retire && st.slots.len() > MIN_THREADS && st.readers > 1);
        if leave {
            if retire && !st.shutdown {
                debug!(workers = st.slots.len() - 2, "idle serving thread exits");
            }
            self.remove_slot(&mut st, id);
            drop(st);
            // The supervisor may be waiting for the readers to go.
            let _g = self
                .control
                .inner
                .end
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.control.inner.end_cv.notify_all();
            return true;
        }
        if let Some(slot) = st.slot(id) {
            slot.retire = false;
        }
        false
    }

    fn ended(&self, id: u64, end: Result<(), CuseError>) {
        match &end {
            Ok(()) => debug!("connection ended"),
            Err(e) => error!(error = %e, "reading the CUSE channel failed"),
        }
        {
            let mut st = self.pool();
            self.remove_slot(&mut st, id);
        }
        self.control.set_end(end);
    }

    /// Runs on the thread that called [`Session::run`] once `CUSE_INIT` is answered: waits for
    /// the end of the connection or `stop`, retiring idle serving threads meanwhile, then
    /// wakes the readers out of `read` and returns. Handlers still running finish on their own.
    fn supervise(&self, idle_timeout: Duration) -> Result<(), CuseError> {
        let inner = &self.control.inner;
        let mut end = inner.end.lock().unwrap_or_else(PoisonError::into_inner);
        let mut last_look = Instant::now();
        let result = loop {
            if self.control.is_stopped() {
                debug!("session stopped");
                break Ok(());
            }
            if let Some(r) = end.take() {
                break r;
            }
            end = inner
                .end_cv
                .wait_timeout(end, idle_timeout)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if last_look.elapsed() >= idle_timeout {
                last_look = Instant::now();
                self.retire_idle();
            }
        };
        {
            let mut st = self.pool();
            st.shutdown = true;
            self.attention.fetch_add(1, Ordering::SeqCst);
        }
        let deadline = Instant::now() + STOP_WAIT;
        loop {
            {
                let st = self.pool();
                let readers: Vec<_> = st.slots.values().filter(|s| s.reading).collect();
                if readers.is_empty() {
                    break;
                }
                if Instant::now() > deadline {
                    // Only if something else in the process took over the wake signal.
                    warn!(
                        threads = readers.len(),
                        signal = sys::wake_signal(),
                        "serving threads did not leave read; they keep the device until the \
                         next request or the process exits"
                    );
                    break;
                }
                for s in readers {
                    if let Some(t) = s.thread {
                        t.wake();
                    }
                }
            }
            end = inner
                .end_cv
                .wait_timeout(end, WAKE_RETRY)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        result
    }

    /// Asks the threads that have been reading since the last look to exit, keeping
    /// [`MIN_THREADS`] and one reader.
    fn retire_idle(&self) {
        let mut st = self.pool();
        let mut spare = st.slots.len().saturating_sub(MIN_THREADS);
        let mut readers = st.readers;
        for slot in st.slots.values_mut() {
            let idle = slot.reading && slot.served == slot.seen;
            slot.seen = slot.served;
            let Some(t) = slot.thread else { continue };
            if slot.retire && slot.reading {
                // Signalled before it entered `read`: once more.
                t.wake();
            } else if idle && spare > 0 && readers > 1 {
                slot.retire = true;
                self.attention.fetch_add(1, Ordering::SeqCst);
                spare -= 1;
                readers -= 1;
                t.wake();
            }
        }
    }

    /// Handles one request read by thread `id`: protocol-level cases at once (a `write` to the
    /// channel, which never waits for a handler), interrupts, and everything else by running
    /// its handler on this thread, or queueing it when `max_workers` handlers are running.
    fn dispatch(self: &Arc<Self>, id: u64, bytes: &[u8]) {
        let msg = match wire::parse_request(bytes) {
            Ok(m) => m,
            Err(e) => {
                match fuse_in_header::read_from_prefix(bytes) {
                    Ok((hdr, _)) => {
                        let span = debug_span!(
                            "cuse",
                            unique = hdr.unique,
                            opcode = hdr.opcode,
                            pid = hdr.pid
                        );
                        let _enter = span.enter();
                        tenant_log!(warn, &self.log_key, error = %e, "malformed request");
                        reply_direct(&self.chan, &self.log_key, &hdr, Err(e.errno()));
                    }
                    Err(_) => {
                        tenant_log!(warn, &self.log_key, error = %e, "dropping malformed request")
                    }
                }
                return;
            }
        };
        let hdr = msg.header;
        let span = debug_span!(
            "cuse",
            unique = hdr.unique,
            opcode = hdr.opcode,
            pid = hdr.pid
        );
        let enter = span.enter();
        match msg.op {
            Op::Interrupt(arg) => {
                match self.inflight().get(&arg.unique) {
                    Some(flag) => {
                        debug!(target_unique = arg.unique, "interrupt");
                        flag.raise();
                        // A handler stuck on the client's memory cannot see it: the watchdog
                        // answers EINTR for it.
                        self.watchdog.poke();
                    }
                    None => {
                        // Finished, or read by another thread that has not registered it yet.
                        // EAGAIN makes the kernel queue the interrupt again if the request is
                        // still waiting for its reply; for a finished one the write fails with
                        // ENOENT (`fuse_dev_do_write`). Never ENOSYS: that turns interrupts off.
                        trace!(
                            target_unique = arg.unique,
                            "interrupt target unknown: EAGAIN"
                        );
                        if hdr.unique != 0 {
                            send_logged(&self.chan, &self.log_key, hdr.unique, Err(Errno::EAGAIN));
                        }
                    }
                }
                return;
            }
            Op::Init(_) => {
                tenant_log!(warn, &self.log_key, "second CUSE_INIT; answering EIO");
                reply_direct(&self.chan, &self.log_key, &hdr, Err(Errno::EIO));
                return;
            }
            Op::Unknown(opcode) => {
                debug!(opcode, "unknown opcode; answering ENOSYS");
                reply_direct(&self.chan, &self.log_key, &hdr, Err(Errno::ENOSYS));
                return;
            }
            Op::Ioctl(ref a, _)
                if a.flags & (FUSE_IOCTL_COMPAT | FUSE_IOCTL_32BIT | FUSE_IOCTL_COMPAT_X32)
                    != 0 =>
            {
                tenant_log!(
                    warn,
                    &self.log_key,
                    cmd = format_args!("{:#010x}", a.cmd),
                    flags = format_args!("{:#x}", a.flags),
                    "32-bit compat ioctl refused with ENOTTY"
                );
                reply_direct(&self.chan, &self.log_key, &hdr, Err(Errno::ENOTTY));
                return;
            }
            _ => {}
        }
        if hdr.unique == 0 {
            tenant_log!(
                warn,
                &self.log_key,
                op = msg.op.name(),
                "request with unique 0 dropped"
            );
            return;
        }
        let interrupt = InterruptFlag::reuse_or_new(SPARE_FLAG.take());
        {
            let mut inflight = self.inflight();
            if inflight.contains_key(&hdr.unique) {
                tenant_log!(
                    warn,
                    &self.log_key,
                    op = msg.op.name(),
                    "duplicate unique of a request in flight; dropped"
                );
                return;
            }
            inflight.insert(hdr.unique, Arc::clone(&interrupt));
        }
        drop(enter);
        let job = Job {
            header: hdr,
            op: msg.op,
            interrupt,
            span,
        };
        self.take(id, job);
    }

    /// Runs `job` on this thread (and then whatever was queued meanwhile), after making sure
    /// another thread is reading; queues it instead when `max` handlers run already.
    fn take(self: &Arc<Self>, id: u64, job: Job<'_>) {
        let mut st = self.pool();
        // `holding` never exceeds `busy`: its scan of the slots is needed only near the
        // limit.
        if st.busy >= self.max && self.holding(&st) >= self.max {
            if !st.warned_full {
                st.warned_full = true;
                tenant_log!(
                    warn,
                    &self.log_key,
                    workers = st.busy,
                    queued = st.queue.len() + 1,
                    "all workers busy; requests wait in the queue (a handler that waits for \
                     another request to this device can deadlock now: raise max_workers)"
                );
            }
            trace!("queued");
            st.queue.push_back(job.into_owned());
            return;
        }
        st.readers -= 1;
        st.busy += 1;
        if let Some(slot) = st.slot(id) {
            slot.reading = false;
            slot.served += 1;
            slot.current = Some(Arc::clone(&job.interrupt));
        }
        // The invariant: while a handler runs, some thread reads (the handler may wait for a
        // nested request to this device, or for the RELEASE its close triggers).
        let spawn = (st.readers == 0).then(|| self.reserve_slot(&mut st));
        drop(st);
        if let Some(new) = spawn
            && let Err(e) = self.spawn_reserved(new, None)
        {
            let mut st = self.pool();
            tenant_log!(error, &self.log_key, error = %e, workers = st.slots.len(), "cannot start a serving thread");
            // Keep reading ourselves: leave the job to a busy thread, or fail it.
            let unique = job.header.unique;
            let others_busy = st.busy > 1;
            if others_busy {
                st.queue.push_back(job.into_owned());
            }
            self.back_to_reading(&mut st, id);
            drop(st);
            if !others_busy {
                self.inflight().remove(&unique);
                send_logged(&self.chan, &self.log_key, unique, Err(Errno::EAGAIN));
            }
            return;
        }
        self.execute(job);
        self.after_handler(id);
    }

    /// After a handler of slot `id`: the queued requests, then back to reading.
    fn after_handler(&self, id: u64) {
        loop {
            let mut st = self.pool();
            // After a handover (a thread the watchdog released comes back late) nothing is
            // queued; the check keeps it that way.
            let next = if self.handed_over.load(Ordering::SeqCst) {
                None
            } else {
                st.queue.pop_front()
            };
            match next {
                Some(next) => {
                    if let Some(slot) = st.slot(id) {
                        slot.current = Some(Arc::clone(&next.interrupt));
                    }
                    drop(st);
                    self.execute(next);
                }
                None => {
                    self.back_to_reading(&mut st, id);
                    return;
                }
            }
        }
    }

    /// Busy threads that hold a handler slot: a thread parked on its client's memory after the
    /// watchdog answered its request holds none (up to `max` of them, so the pool stays
    /// bounded: at most twice `max` handlers), or a tenant that parks `max` calls would
    /// starve every later request of its instance, and hold a suspension past its deadline.
    fn holding(&self, st: &PoolState) -> usize {
        let settled = st
            .slots
            .values()
            .filter(|s| !s.reading && s.current.as_ref().is_some_and(|f| f.is_settled()))
            .count();
        st.busy - settled.min(self.max)
    }

    /// Starts threads for queued requests while slots are free past the parked threads
    /// ([`Shared::holding`]): the queue is otherwise only taken by threads that finish a
    /// handler, which parked ones do not.
    fn run_queued_past_parked(self: &Arc<Self>) {
        loop {
            let mut st = self.pool();
            if self.handed_over.load(Ordering::SeqCst) || self.holding(&st) >= self.max {
                return;
            }
            let Some(job) = st.queue.pop_front() else {
                return;
            };
            let id = self.reserve_slot(&mut st);
            st.readers -= 1;
            st.busy += 1;
            if let Some(slot) = st.slot(id) {
                slot.reading = false;
                slot.served += 1;
                slot.current = Some(Arc::clone(&job.interrupt));
            }
            drop(st);
            let unique = job.header.unique;
            if let Err(e) = self.spawn_reserved(id, Some(job)) {
                // The slot is gone again (spawn_reserved); the request is answered, not lost.
                tenant_log!(error, &self.log_key, error = %e, "cannot start a serving thread for a queued request");
                self.inflight().remove(&unique);
                send_logged(&self.chan, &self.log_key, unique, Err(Errno::EAGAIN));
                return;
            }
        }
    }

    /// Answers every queued request with `errno` (a suspension whose pool is held by parked
    /// threads); returns how many.
    fn fail_queued(&self, errno: Errno) -> usize {
        let jobs: Vec<Job<'static>> = self.pool().queue.drain(..).collect();
        for job in &jobs {
            let unique = job.header.unique;
            self.inflight().remove(&unique);
            send_logged(&self.chan, &self.log_key, unique, Err(errno));
        }
        jobs.len()
    }

    /// What a suspension waits for: (threads still serving a request that was not answered,
    /// or otherwise not gone; threads parked on a request the watchdog answered; requests
    /// queued).
    fn suspension_counts(&self) -> (usize, usize, usize) {
        let st = self.pool();
        let parked = st
            .slots
            .values()
            .filter(|s| s.current.as_ref().is_some_and(|f| f.is_settled()))
            .count();
        (st.slots.len() - parked, parked, st.queue.len())
    }

    fn back_to_reading(&self, st: &mut PoolState, id: u64) {
        st.busy -= 1;
        st.readers += 1;
        st.warned_full = false;
        if let Some(slot) = st.slot(id) {
            slot.reading = true;
            slot.current = None;
        }
    }

    /// Runs one request's handler and writes its reply.
    fn execute(&self, job: Job<'_>) {
        let _enter = job.span.enter();
        let req = Request {
            unique: job.header.unique,
            opcode: job.header.opcode,
            pid: job.header.pid,
            uid: job.header.uid,
            gid: job.header.gid,
            interrupt: job.interrupt,
            watchdog: Some(Arc::clone(&self.watchdog)),
        };
        let interruptible = !matches!(job.op, Op::Release(_) | Op::Destroy);
        let result = if interruptible && req.is_interrupted() {
            debug!("interrupted before a handler ran");
            Err(Errno::EINTR)
        } else {
            match catch_unwind(AssertUnwindSafe(|| self.call(&req, job.op))) {
                Ok(Ok(body)) => Ok(body),
                Ok(Err(Reject::Errno(e))) => {
                    debug!(errno = e.raw(), "handler error");
                    Err(e)
                }
                Ok(Err(Reject::Bad(e))) => {
                    tenant_log!(error, &self.log_key, error = %e, "handler reply refused");
                    Err(e.errno())
                }
                Err(_) => {
                    tenant_log!(error, &self.log_key, "handler panicked; answering EIO");
                    Err(HandlerReplyError::Panicked.errno())
                }
            }
        };
        // The answer first, the bookkeeping after: the client waits for the one, not the
        // other. The flag decides who answers (the watchdog may have), so an interrupt or a
        // watchdog scan that still finds the request in flight meanwhile answers nothing.
        if req.interrupt.take_answer() {
            send_logged(
                &self.chan,
                &self.log_key,
                req.unique,
                result.as_ref().map_err(|e| *e),
            );
        } else {
            debug!("already answered (early by the handler, or by the client-wait watchdog)");
        }
        self.inflight().remove(&req.unique);
        // This thread's next request reuses the flag if nothing holds it by then (the slot's
        // reference goes when the thread goes back to reading).
        SPARE_FLAG.set(Some(req.interrupt));
    }

    fn call(&self, req: &Request, op: Op<'_>) -> Result<ReplyBody, Reject> {
        let h = &*self.handler;
        match op {
            Op::Open(a) => {
                let Opened { fh, open_flags } = h.open(req, a.flags)?;
                debug!(fh, "opened");
                Ok(ReplyBody::Open(fuse_open_out {
                    fh,
                    open_flags,
                    padding: 0,
                }))
            }
            Op::Release(a) => {
                self.retries_lock().retain(|&(fh, _), _| fh != a.fh);
                h.release(req, a.fh, a.flags);
                Ok(ReplyBody::Empty)
            }
            Op::Read(a) => {
                let data = h.read(req, a.fh, a.offset, a.size)?;
                if u32::try_from(data.len()).map_or(true, |n| n > a.size) {
                    return Err(HandlerReplyError::ReadTooLong {
                        got: data.len(),
                        max: a.size,
                    }
                    .into());
                }
                Ok(ReplyBody::Data(data))
            }
            Op::Write(a, data) => {
                let n = h.write(req, a.fh, a.offset, &data)?;
                if usize::try_from(n).map_or(true, |n| n > data.len()) {
                    return Err(HandlerReplyError::WriteTooLong {
                        got: n,
                        max: data.len(),
                    }
                    .into());
                }
                Ok(ReplyBody::Write(fuse_write_out {
                    size: n,
                    padding: 0,
                }))
            }
            Op::Flush(a) => {
                h.flush(req, a.fh)?;
                Ok(ReplyBody::Empty)
            }
            Op::Fsync(a) => {
                h.fsync(req, a.fh, a.fsync_flags & 1 != 0)?;
                Ok(ReplyBody::Empty)
            }
            Op::Ioctl(a, data) => {
                // A first round carries nothing; a retry round carries what the previous
                // round of this open file and thread named.
                // Restricted ioctls (the kernel copies `_IOC_SIZE` itself) have no rounds: no
                // lookup, no lock.
                let key = (a.fh, req.pid);
                let unrestricted = a.flags & FUSE_IOCTL_UNRESTRICTED != 0;
                let prev = if unrestricted {
                    self.retries_lock().remove(&key)
                } else {
                    None
                };
                let first = data.is_empty() && a.out_size == 0;
                let retry = prev.filter(|r| !first && r.matches(data.len(), a.out_size));
                let io = Ioctl {
                    fh: a.fh,
                    cmd: a.cmd,
                    arg: a.arg,
                    flags: a.flags,
                    in_data: &data,
                    out_size: a.out_size,
                    retry: retry.as_ref(),
                };
                let reply = h.ioctl(req, &io)?;
                let next = match &reply {
                    IoctlReply::Retry { in_iovs, out_iovs } => Some(RetryRound {
                        in_iovs: in_iovs.clone(),
                        out_iovs: out_iovs.clone(),
                    }),
                    IoctlReply::Done { .. } => None,
                };
                let body = ioctl_reply_body(&io, reply)?;
                // A request the watchdog answered has no next round (its caller got the
                // answer); after a handover the rounds are the next server's.
                let over = req.interrupt.has_fired() || self.handed_over.load(Ordering::SeqCst);
                if let Some(round) = next.filter(|_| !over) {
                    let mut r = self.retries_lock();
                    if r.len() >= MAX_RETRY_ROUNDS {
                        tenant_log!(
                            warn,
                            &self.log_key,
                            rounds = r.len(),
                            "too many retry rounds in progress: EIO"
                        );
                        return Err(Reject::Errno(Errno::EIO));
                    }
                    r.insert(key, round);
                }
                Ok(body)
            }
            Op::Poll(a) => {
                let notify = (a.flags & FUSE_POLL_SCHEDULE_NOTIFY != 0).then(|| PollHandle {
                    kh: a.kh,
                    chan: Arc::downgrade(&self.chan),
                });
                let revents = h.poll(req, a.fh, a.events, notify)?;
                Ok(ReplyBody::Poll(fuse_poll_out {
                    revents,
                    padding: 0,
                }))
            }
            Op::Destroy => {
                h.destroy();
                Ok(ReplyBody::Empty)
            }
            // The reader answers these itself; reaching here would be our bug.
            Op::Init(_) | Op::Interrupt(_) | Op::Unknown(_) => Err(Reject::Errno(Errno::EIO)),
        }
    }
}

/// Why a handler call did not produce a reply body.
enum Reject {
    Errno(Errno),
    Bad(HandlerReplyError),
}

impl From<Errno> for Reject {
    fn from(e: Errno) -> Self {
        Reject::Errno(e)
    }
}

impl From<HandlerReplyError> for Reject {
    fn from(e: HandlerReplyError) -> Self {
        Reject::Bad(e)
    }
}

thread_local! {
    /// The flag of the last request this thread executed ([`InterruptFlag::reuse_or_new`]).
    static SPARE_FLAG: std::cell::Cell<Option<Arc<InterruptFlag>>> = const { std::cell::Cell::new(None) };
}

/// A request on its way to a handler (borrowing the reading thread's buffer, or owned when
/// queued).
struct Job<'a> {
    header: fuse_in_header,
    op: Op<'a>,
    interrupt: Arc<InterruptFlag>,
    span: Span,
}

impl Job<'_> {
    fn into_owned(self) -> Job<'static> {
        Job {
            header: self.header,
            op: self.op.into_owned(),
            interrupt: self.interrupt,
            span: self.span,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        let cfg = DeviceConfig::new("x");
        let offer = |major, minor| cuse_init_in {
            major,
            minor,
            unused: 0,
            flags: 1,
        };
        let (out, info) = negotiate(&cfg, &offer(7, 41)).unwrap();
        assert_eq!((out.major, out.minor), (7, FUSE_KERNEL_MINOR_VERSION));
        assert_eq!(info.kernel_minor, 41);
        assert_eq!(out.flags, CUSE_UNRESTRICTED_IOCTL);
        let (out, _) = negotiate(&cfg, &offer(7, 12)).unwrap();
        assert_eq!(out.minor, 12);
        assert!(matches!(
            negotiate(&cfg, &offer(7, 10)),
            Err(CuseError::UnsupportedProtocol {
                major: 7,
                minor: 10,
                ..
            })
        ));
        assert!(matches!(
            negotiate(&cfg, &offer(8, 0)),
            Err(CuseError::UnsupportedProtocol { major: 8, .. })
        ));
        let restricted = DeviceConfig {
            unrestricted_ioctl: false,
            ..cfg
        };
        assert_eq!(negotiate(&restricted, &offer(7, 41)).unwrap().0.flags, 0);
    }

    #[test]
    fn config_validation() {
        assert!(DeviceConfig::new("nvproxy/a/nvidiactl").validate().is_ok());
        for bad in ["", "a/../b", "/a", "a/", "a//b", ".", "a b", "a\0b", "ä"] {
            assert!(DeviceConfig::new(bad).validate().is_err(), "{bad:?}");
        }
        assert!(DeviceConfig::new("x".repeat(200)).validate().is_err());
        let cfg = DeviceConfig {
            dev_minor: 1 << 20,
            ..DeviceConfig::new("x")
        };
        assert!(cfg.validate().is_err());
        let cfg = DeviceConfig {
            max_workers: 0,
            ..DeviceConfig::new("x")
        };
        assert!(cfg.validate().is_err());
        assert!(DeviceConfig::new("x").read_buffer_size() >= 40 + 32 + 128 * 1024);
    }
}
