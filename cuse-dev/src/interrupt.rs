//! The interrupt state of one request ([`InterruptFlag`]): shared by the reader, the handler
//! and the client-wait watchdog. Imports nothing of the crate.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The interrupt state of one request, shared by the reader (which sets it when a
/// `FUSE_INTERRUPT` names the request) and the handler (which reads or waits for it).
///
/// It also records whether the request has been answered (by its handler, or by the
/// client-wait watchdog, `watchdog.rs`: exactly one of them writes the reply) and whether a
/// client wait of it fired.
#[derive(Debug, Default)]
pub(crate) struct InterruptFlag {
    set: Mutex<bool>,
    cv: Condvar,
    answered: AtomicBool,
    fired: AtomicBool,
    /// The watchdog answered the request and its reply is written: the request is over for
    /// its client and for a suspension, whatever its serving thread still waits for.
    settled: AtomicBool,
    /// When the handler's current wait on client memory began (the watchdog's clock), 0 when
    /// none is armed.
    armed: AtomicU64,
}

impl InterruptFlag {
    /// Arms (`ns` > 0) or disarms (0) a wait on client memory.
    pub(crate) fn arm(&self, ns: u64) {
        self.armed.store(ns, Ordering::Release);
    }

    pub(crate) fn armed_since(&self) -> u64 {
        self.armed.load(Ordering::Acquire)
    }

    /// Claims the reply: true for the first caller only.
    pub(crate) fn take_answer(&self) -> bool {
        !self.answered.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn mark_fired(&self) {
        self.fired.store(true, Ordering::Release);
    }

    pub(crate) fn has_fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    /// The watchdog wrote the request's answer (after [`InterruptFlag::take_answer`]).
    pub(crate) fn mark_settled(&self) {
        self.settled.store(true, Ordering::Release);
    }

    /// Whether the watchdog answered the request and wrote its reply.
    pub(crate) fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    pub(crate) fn raise(&self) {
        *self.set.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.cv.notify_all();
    }

    pub(crate) fn is_set(&self) -> bool {
        *self.set.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut set = self.set.lock().unwrap_or_else(PoisonError::into_inner);
        while !*set {
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return false,
                },
                None => Duration::from_secs(3600),
            };
            set = self
                .cv
                .wait_timeout(set, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}
