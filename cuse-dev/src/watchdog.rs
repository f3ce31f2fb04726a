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
//! [`Request::client_waits`]: crate::Request::client_waits
//! [`DeviceConfig::client_wait_timeout`]: crate::DeviceConfig::client_wait_timeout

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::Errno;
use crate::handler::InterruptFlag;

/// One session's watchdog.
pub(crate) struct Watchdog {
    /// Where answers go; `None` for a standalone watchdog (tests, or callers without a
    /// session), which only marks waits fired.
    chan: Option<Arc<File>>,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
    /// Waits that fired, since the start (for tests and logs).
    fired: AtomicU64,
}

#[derive(Default)]
struct State {
    armed: HashMap<u64, Armed>,
    next_token: u64,
    thread: bool,
    stop: bool,
}

struct Armed {
    unique: u64,
    deadline: Instant,
    req: Arc<InterruptFlag>,
}

impl Watchdog {
    pub(crate) fn new(chan: Option<Arc<File>>, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            chan,
            timeout,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            fired: AtomicU64::new(0),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn arm(self: &Arc<Self>, unique: u64, req: &Arc<InterruptFlag>) -> Option<u64> {
        let mut st = self.state();
        if st.stop {
            return None;
        }
        if !st.thread {
            let me = Arc::downgrade(self);
            match std::thread::Builder::new()
                .name("cuse-watchdog".into())
                .spawn(move || Self::run(&me))
            {
                Ok(_) => st.thread = true,
                Err(e) => {
                    warn!(error = %e, "cannot start the client-wait watchdog; waits are unbounded");
                    return None;
                }
            }
        }
        st.next_token += 1;
        let token = st.next_token;
        let was_empty = st.armed.is_empty();
        st.armed.insert(
            token,
            Armed {
                unique,
                deadline: Instant::now() + self.timeout,
                req: Arc::clone(req),
            },
        );
        if was_empty {
            self.cv.notify_all();
        }
        Some(token)
    }

    fn disarm(&self, token: u64) {
        self.state().armed.remove(&token);
    }

    /// An interrupt arrived for some request: look at the armed waits now.
    pub(crate) fn poke(&self) {
        let st = self.state();
        if !st.armed.is_empty() {
            self.cv.notify_all();
        }
    }

    /// Stops the watchdog thread (the session ends); armed waits are not answered any more.
    pub(crate) fn stop(&self) {
        self.state().stop = true;
        self.cv.notify_all();
    }

    /// How many waits fired.
    pub(crate) fn fired_count(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }

    /// The watchdog thread: holds the watchdog only while it looks (at most a second at a
    /// time), so it ends once every handle is gone, or at [`Watchdog::stop`].
    fn run(weak: &std::sync::Weak<Self>) {
        while let Some(me) = weak.upgrade() {
            if !me.step() {
                return;
            }
        }
    }

    /// Fires what is due, then waits for the next deadline (at most a second). False: stopped.
    fn step(&self) -> bool {
        let mut st = self.state();
        if st.stop {
            return false;
        }
        let now = Instant::now();
        let due: Vec<u64> = st
            .armed
            .iter()
            .filter(|(_, a)| a.req.is_set() || a.deadline <= now)
            .map(|(&t, _)| t)
            .collect();
        let fired: Vec<Armed> = due.iter().filter_map(|t| st.armed.remove(t)).collect();
        if !fired.is_empty() {
            drop(st);
            for a in fired {
                self.fire(a);
            }
            return true;
        }
        let wait = st
            .armed
            .values()
            .map(|a| a.deadline.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(1))
            .clamp(Duration::from_millis(1), Duration::from_secs(1));
        drop(
            self.cv
                .wait_timeout(st, wait)
                .unwrap_or_else(PoisonError::into_inner),
        );
        true
    }

    fn fire(&self, a: Armed) {
        // Fired first: the handler, when its access returns, must see it before it could act.
        a.req.mark_fired();
        self.fired.fetch_add(1, Ordering::Relaxed);
        let interrupted = a.req.is_set();
        let errno = if interrupted {
            Errno::EINTR
        } else {
            Errno::EFAULT
        };
        warn!(
            unique = a.unique,
            interrupted,
            timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            "a wait on the client's memory did not end in time: request answered {errno:?}; \
             the serving thread stays until the client's page fault resolves"
        );
        if a.req.take_answer() {
            if let Some(chan) = &self.chan {
                crate::session::send_error(chan, a.unique, errno);
            }
        }
    }
}

/// The client waits of one request: arm one around each access to the client's memory.
/// Cloneable; cheap.
#[derive(Clone)]
pub struct ClientWaits {
    wd: Option<Arc<Watchdog>>,
    unique: u64,
    req: Arc<InterruptFlag>,
}

impl ClientWaits {
    pub(crate) fn new(wd: Option<Arc<Watchdog>>, unique: u64, req: Arc<InterruptFlag>) -> Self {
        Self { wd, unique, req }
    }

    /// Waits not tied to a session: a wait past `timeout` (or after [`ClientWaits::interrupt`])
    /// is only marked fired. For callers that read client memory outside a CUSE request, and
    /// for tests.
    pub fn standalone(timeout: Duration) -> Self {
        Self {
            wd: Some(Watchdog::new(None, timeout)),
            unique: 0,
            req: Arc::default(),
        }
    }

    /// Waits that are never bounded (a request outside a session).
    pub fn unbounded() -> Self {
        Self {
            wd: None,
            unique: 0,
            req: Arc::default(),
        }
    }

    /// Arms a deadline for one access; it is disarmed when the guard drops.
    pub fn arm(&self) -> ClientWait<'_> {
        let token = self
            .wd
            .as_ref()
            .and_then(|wd| wd.arm(self.unique, &self.req));
        ClientWait { waits: self, token }
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
    token: Option<u64>,
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
        if let (Some(wd), Some(t)) = (&self.waits.wd, self.token) {
            wd.disarm(t);
        }
    }
}
