//! Deadlines on waits for the client's memory.
//!
//! A handler that reads or writes the calling process's memory itself (`process_vm_readv`)
//! waits for page faults the client controls: a page registered with `userfaultfd`, or a
//! mapping of a FUSE file the client serves, blocks the read until the client chooses, and
//! `process_vm_readv` cannot be interrupted by a signal (its faults wait `TASK_KILLABLE`). The
//! client, meanwhile, waits for our reply; if it is killed it cannot exit until we reply, and
//! its `userfaultfd` is only released when it exits: a deadlock that would keep a serving
//! thread forever.
//!
//! So a handler arms a [`ClientWait`] around each such access ([`Request::client_waits`]).
//! The session's watchdog thread answers a request whose armed wait lasts longer than
//! [`DeviceConfig::client_wait_timeout`] with `EFAULT` (what the driver's `copy_from_user`
//! answers for memory it cannot read), or at once with `EINTR` when a `FUSE_INTERRUPT` names
//! it (the client got a signal, possibly a fatal one). The client is released; the handler's
//! own reply, when its access finally returns, is dropped (the request was answered), and
//! [`ClientWaits::fired`] tells it to abandon the request before any side effect. The serving
//! thread itself stays in the syscall until the fault resolves (the client resolves it, or
//! exits and its `userfaultfd` goes); the number of such threads is bounded by
//! `max_workers`, and they hold nothing of other devices.
//!
//! **Cost.** Arming and disarming are one atomic store each in the request's own state (no
//! shared lock, no wake-up: every request arms a wait, so this is on every ioctl's path). The
//! watchdog thread looks at the session's requests in flight every tenth of the timeout (at
//! most every second), and at once when an interrupt arrives; a wait is answered within a
//! tenth of the timeout after its deadline.
//!
//! [`Request::client_waits`]: crate::Request::client_waits
//! [`DeviceConfig::client_wait_timeout`]: crate::DeviceConfig::client_wait_timeout

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::Duration;

use tenant_log::tenant_log;
use tracing::warn;

/// The log key of waits not tied to a session or instance.
const STANDALONE_KEY: &str = "cuse-dev client waits";

use crate::Errno;
use crate::interrupt::InterruptFlag;

/// The requests a watchdog looks at: (unique, state) of each request in flight.
pub(crate) type Scan = dyn Fn(&mut dyn FnMut(u64, &Arc<InterruptFlag>)) + Send + Sync;

/// Nanoseconds of the monotonic clock (0 means "not armed", never read from the clock).
fn now_ns() -> u64 {
    crate::sys::monotonic_ns().max(1)
}

/// One session's watchdog (or a standalone one's).
pub(crate) struct Watchdog {
    /// Where answers go; `None` for a standalone watchdog, which only marks waits fired.
    chan: Option<Arc<File>>,
    /// The key of its limit on log lines (a fired wait is the tenant's doing).
    log_key: String,
    timeout: Duration,
    /// The requests to look at.
    scan: Box<Scan>,
    started: AtomicBool,
    stop: Mutex<bool>,
    cv: Condvar,
    /// Waits that fired, since the start (for tests and logs).
    fired: AtomicU64,
    /// A standalone watchdog's answer to a request whose wait fired (none: only marked).
    answer: Option<Box<Answer>>,
    /// A shorter deadline in force (nanoseconds; 0: none): a suspension past its grace
    /// ([`Watchdog::hurry`]).
    hurried_ns: AtomicU64,
}

/// How a standalone watchdog answers a request whose wait fired, with the errno it chose.
pub type Answer = dyn Fn(Errno) + Send + Sync;

impl Watchdog {
    /// Where its session's answers go, with the log key: `None` for a standalone watchdog.
    pub(crate) fn channel(&self) -> Option<(&File, &str)> {
        self.chan.as_deref().map(|c| (c, self.log_key.as_str()))
    }

    /// A session's watchdog: it looks at the requests `scan` yields.
    pub(crate) fn new(
        chan: Option<Arc<File>>,
        log_key: String,
        timeout: Duration,
        scan: Box<Scan>,
    ) -> Arc<Self> {
        Arc::new(Self {
            chan,
            log_key,
            timeout,
            scan,
            started: AtomicBool::new(false),
            stop: Mutex::new(false),
            cv: Condvar::new(),
            fired: AtomicU64::new(0),
            answer: None,
            hurried_ns: AtomicU64::new(0),
        })
    }

    /// Starts the thread on the first arm (cheap check afterwards).
    fn ensure_thread(self: &Arc<Self>) {
        if self.started.load(Ordering::Acquire) || self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Arc::downgrade(self);
        if let Err(e) = std::thread::Builder::new()
            .name("cuse-watchdog".into())
            .spawn(move || Self::run(&me))
        {
            warn!(error = %e, "cannot start the client-wait watchdog; waits are unbounded");
        }
    }

    /// An interrupt arrived for some request: look at the armed waits now.
    pub(crate) fn poke(&self) {
        self.cv.notify_all();
    }

    /// Brings every deadline forward to `short` (a suspension past its grace): waits armed
    /// for longer are answered now, later ones after `short`.
    pub(crate) fn hurry(&self, short: Duration) {
        let ns = u64::try_from(short.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.hurried_ns.store(ns, Ordering::Release);
        self.poke();
    }

    /// The deadline in force: the configured one, or a shorter one while hurried.
    fn deadline(&self) -> Duration {
        match self.hurried_ns.load(Ordering::Acquire) {
            0 => self.timeout,
            ns => self.timeout.min(Duration::from_nanos(ns)),
        }
    }

    /// Stops the watchdog thread (the session ends).
    pub(crate) fn stop(&self) {
        *self.stop.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.cv.notify_all();
    }

    /// Answers through `answer` instead of a channel (a standalone watchdog that answers).
    fn answering(mut self: Arc<Self>, answer: Box<Answer>) -> Arc<Self> {
        if let Some(me) = Arc::get_mut(&mut self) {
            me.answer = Some(answer);
        }
        self
    }

    /// How many waits fired.
    pub(crate) fn fired_count(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }

    /// The thread: holds the watchdog only while it looks, so it ends once every handle is
    /// gone, or at [`Watchdog::stop`].
    fn run(weak: &Weak<Self>) {
        while let Some(me) = weak.upgrade() {
            if !me.step() {
                return;
            }
        }
    }

    /// Fires what is due, then waits a tenth of the timeout (at most a second) or for a poke.
    /// False: stopped.
    fn step(&self) -> bool {
        let timeout = self.deadline();
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let now = now_ns();
        let mut due = Vec::new();
        (self.scan)(&mut |unique, req| {
            let since = req.armed_since();
            if since != 0 && (req.is_set() || now.saturating_sub(since) >= timeout_ns) {
                due.push((unique, Arc::clone(req)));
            }
        });
        for (unique, req) in due {
            self.fire(unique, &req, timeout);
        }
        let period = (timeout / 10).clamp(Duration::from_millis(1), Duration::from_secs(1));
        let stop = self.stop.lock().unwrap_or_else(PoisonError::into_inner);
        if *stop {
            return false;
        }
        let (stop, _) = self
            .cv
            .wait_timeout(stop, period)
            .unwrap_or_else(PoisonError::into_inner);
        !*stop
    }

    fn fire(&self, unique: u64, req: &InterruptFlag, timeout: Duration) {
        // Fired first: the handler, when its access returns, must see it before it could act.
        if req.has_fired() {
            return;
        }
        req.mark_fired();
        self.fired.fetch_add(1, Ordering::Relaxed);
        let interrupted = req.is_set();
        let errno = if interrupted {
            Errno::EINTR
        } else {
            Errno::EFAULT
        };
        tenant_log!(
            warn,
            &self.log_key,
            unique,
            interrupted,
            timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            "a wait on the client's memory did not end in time: request answered {errno:?}; \
             the serving thread stays until the client's page fault resolves"
        );
        if req.take_answer() {
            if let Some(chan) = &self.chan {
                crate::reply::send_error(chan, &self.log_key, unique, errno);
            } else if let Some(answer) = &self.answer {
                answer(errno);
            }
            req.mark_settled();
        }
    }
}

/// The client waits of one request: arm one around each access to the client's memory.
/// Cloneable; cheap.
#[derive(Clone)]
pub struct ClientWaits {
    wd: Option<Arc<Watchdog>>,
    req: Arc<InterruptFlag>,
}

impl ClientWaits {
    pub(crate) fn new(wd: Option<Arc<Watchdog>>, req: Arc<InterruptFlag>) -> Self {
        Self { wd, req }
    }

    /// Waits not tied to a session: a wait past `timeout` (or after [`ClientWaits::interrupt`])
    /// is only marked fired. For callers that read client memory outside a CUSE request, and
    /// for tests.
    pub fn standalone(timeout: Duration) -> Self {
        Self::standalone_for(STANDALONE_KEY, timeout)
    }

    /// [`ClientWaits::standalone`] whose log lines go through `log_key`'s limit (an
    /// instance's name; see [`DeviceConfig::log_key`](crate::DeviceConfig::log_key)).
    pub fn standalone_for(log_key: &str, timeout: Duration) -> Self {
        let req = Arc::new(InterruptFlag::default());
        let me = Arc::downgrade(&req);
        let scan: Box<Scan> = Box::new(move |f| {
            if let Some(r) = me.upgrade() {
                f(0, &r);
            }
        });
        Self {
            wd: Some(Watchdog::new(None, log_key.to_owned(), timeout, scan)),
            req,
        }
    }

    /// [`ClientWaits::standalone`] whose watchdog also answers the request: `answer` is called
    /// once per firing, from the watchdog's thread, with `EFAULT` (deadline) or `EINTR`
    /// (interrupted); the caller decides, e.g. under a lock of its own, whether its handler or
    /// `answer` replies. For servers that answer their requests themselves (the socket
    /// transport).
    /// Its log lines go through `log_key`'s limit.
    pub fn standalone_answering(log_key: &str, timeout: Duration, answer: Box<Answer>) -> Self {
        let mut w = Self::standalone_for(log_key, timeout);
        w.wd = w.wd.map(|wd| wd.answering(answer));
        w
    }

    /// Waits that are never bounded (a request outside a session).
    pub fn unbounded() -> Self {
        Self {
            wd: None,
            req: Arc::default(),
        }
    }

    /// Arms a deadline for one access; it is disarmed when the guard drops.
    pub fn arm(&self) -> ClientWait<'_> {
        if let Some(wd) = &self.wd {
            wd.ensure_thread();
            self.req.arm(now_ns());
        }
        ClientWait { waits: self }
    }

    /// Whether a wait of this request fired: the request was answered, so the handler must
    /// abandon it (fail every further access) before any side effect.
    pub fn fired(&self) -> bool {
        self.req.has_fired()
    }

    /// Marks the request interrupted and pokes the watchdog (as a `FUSE_INTERRUPT` does).
    pub fn interrupt(&self) {
        self.req.raise();
        if let Some(wd) = &self.wd {
            wd.poke();
        }
    }

    /// Waits that fired so far on this request's watchdog (the session's, for a request).
    pub fn fired_count(&self) -> u64 {
        self.wd.as_ref().map_or(0, |wd| wd.fired_count())
    }
}

/// One armed wait; see the module docs.
pub struct ClientWait<'a> {
    waits: &'a ClientWaits,
}

impl ClientWait<'_> {
    /// Whether the deadline passed (or the client was interrupted) during this wait: the
    /// request has been answered; abandon it.
    pub fn fired(&self) -> bool {
        self.waits.fired()
    }
}

impl Drop for ClientWait<'_> {
    fn drop(&mut self) {
        self.waits.req.arm(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// An armed wait fires once its timeout has passed, never before it; a disarmed one
    /// never.
    #[test]
    fn test_an_armed_wait_fires_after_its_timeout_and_not_before() {
        let timeout = Duration::from_millis(100);
        let waits = ClientWaits::standalone(timeout);
        let start = Instant::now();
        let wait = waits.arm();
        while !wait.fired() {
            assert!(start.elapsed() < Duration::from_secs(5), "never fired");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            start.elapsed() >= timeout,
            "fired after {:?}",
            start.elapsed()
        );
        drop(wait);
        assert_eq!(waits.fired_count(), 1);

        let other = ClientWaits::standalone(timeout);
        drop(other.arm());
        std::thread::sleep(timeout * 3);
        assert!(!other.fired(), "a disarmed wait fired");
    }
}
