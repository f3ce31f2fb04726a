//! Waiting for a condition, bounded.

use std::time::{Duration, Instant};

/// Polls `cond` until it holds or `timeout` has passed; returns whether it held (it is asked
/// once more at the deadline). Polls often at first (1 ms) and then less (up to every 50 ms),
/// so that a quick condition costs little and a slow one little CPU.
///
/// Use it where a test would sleep a fixed time and then assert: `assert!(eventually(
/// Duration::from_secs(5), || done()), "never done")` passes as soon as the condition holds
/// and fails only after the bound, on a loaded machine too. A check that something does *not*
/// happen cannot be written this way.
#[must_use]
pub fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        if cond() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return cond();
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_at_once_or_later_or_never() {
        assert!(eventually(Duration::ZERO, || true));
        let mut n = 0;
        assert!(eventually(Duration::from_secs(5), || {
            n += 1;
            n == 5
        }));
        let t = Instant::now();
        assert!(!eventually(Duration::from_millis(30), || false));
        assert!(t.elapsed() >= Duration::from_millis(30));
    }
}
