//! The interrupt state of one request ([`InterruptFlag`]): shared by the reader, the handler
//! and the client-wait watchdog. Imports nothing of the crate.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
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
    /// The flag of a new request: `spare` (a finished request's flag), reset, when nothing
    /// else holds it any more; else a new one. Saves the allocation (and its free) that a
    /// request otherwise costs the serving thread.
    pub(crate) fn reuse_or_new(spare: Option<Arc<Self>>) -> Arc<Self> {
        if let Some(mut flag) = spare
            && let Some(f) = Arc::get_mut(&mut flag)
        {
            *f = Self::default();
            return flag;
        }
        Arc::new(Self::default())
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_spare_flag_nothing_else_holds_is_reused_and_reset() {
        let spare = Arc::new(InterruptFlag::default());
        spare.raise();
        assert!(spare.take_answer());
        spare.mark_settled();
        spare.arm(5);
        let at = Arc::as_ptr(&spare);
        let flag = InterruptFlag::reuse_or_new(Some(spare));
        assert_eq!(Arc::as_ptr(&flag), at, "the same allocation");
        assert!(!flag.is_set() && !flag.is_settled() && !flag.has_fired());
        assert_eq!(flag.armed_since(), 0);
        assert!(
            flag.take_answer(),
            "the new request's answer is not taken yet"
        );
    }

    #[test]
    fn test_a_spare_flag_still_held_elsewhere_is_left_alone() {
        let spare = Arc::new(InterruptFlag::default());
        let held = Arc::clone(&spare);
        assert!(held.take_answer());
        let flag = InterruptFlag::reuse_or_new(Some(spare));
        assert!(!Arc::ptr_eq(&flag, &held), "a new flag");
        assert!(!held.take_answer(), "the holder's state is untouched");
        assert!(flag.take_answer());
    }
}
