//! Rate limits of the log lines a tenant can cause, shared by every crate on the request path
//! (`cuse-dev`, `ioctl-proxy`, the daemon): one token bucket per key (an instance's name), so
//! that all of an instance's tenant-caused lines, whichever crate writes them, share one limit.
//!
//! A tenant chooses how often it is refused, so a `WARN` per refused open, malformed request or
//! stuck wait is a write it controls: under systemd, journald's own rate limit would then drop
//! every instance's messages. Each key admits [`LINES_PER_SECOND`] lines sustained, [`BURST`] at
//! once; a line past it is counted, not written, and the next line admitted is preceded by one
//! `WARN` saying how many were suppressed (as is [`flush`], when the key's user stops).
//!
//! ```
//! tenant_log::tenant_log!(warn, "alpha", error = "EFAULT", "a refused call");
//! tenant_log::flush("alpha");
//! ```

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

#[doc(hidden)]
pub use tracing as __tracing;

/// Tenant-caused log lines admitted per second per key, sustained.
pub const LINES_PER_SECOND: f64 = 10.0;
/// Tenant-caused log lines admitted at once per key after a quiet period.
pub const BURST: f64 = 100.0;
/// Keys with a bucket of their own; more share one (keys are instance and device names, the
/// admin's, so this only bounds the map).
const MAX_KEYS: usize = 1024;

/// A token bucket and the count of what it left out.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
    suppressed: u64,
}

impl TokenBucket {
    /// A full bucket admitting `rate` per second, at most `burst` at once.
    pub fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
            last: Instant::now(),
            suppressed: 0,
        }
    }

    /// Takes a token: `Some(n)` admitted, with `n` left out since the last admission (taken:
    /// the caller reports them); `None` left out (counted).
    pub fn admit(&mut self) -> Option<u64> {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens < 1.0 {
            self.suppressed += 1;
            return None;
        }
        self.tokens -= 1.0;
        Some(std::mem::take(&mut self.suppressed))
    }

    /// Counts `n` more left out (a line admitted but then dropped).
    pub fn add_suppressed(&mut self, n: u64) {
        self.suppressed += n;
    }

    /// Takes the count of what was left out.
    pub fn take_suppressed(&mut self) -> u64 {
        std::mem::take(&mut self.suppressed)
    }
}

fn buckets() -> MutexGuard<'static, HashMap<String, TokenBucket>> {
    static B: OnceLock<Mutex<HashMap<String, TokenBucket>>> = OnceLock::new();
    B.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Whether `key` may write one more tenant-caused line: `Some(n)` yes, after reporting the `n`
/// left out before (see [`tenant_log!`]); `None` no.
pub fn admit(key: &str) -> Option<u64> {
    let mut b = buckets();
    let key = if b.contains_key(key) || b.len() < MAX_KEYS {
        key
    } else {
        ""
    };
    if !b.contains_key(key) {
        b.insert(key.to_owned(), TokenBucket::new(LINES_PER_SECOND, BURST));
    }
    b.get_mut(key).map_or(Some(0), TokenBucket::admit)
}

/// Reports what `key`'s limit left out since its last admitted line (its user stops).
pub fn flush(key: &str) {
    let n = buckets()
        .get_mut(key)
        .map_or(0, TokenBucket::take_suppressed);
    report(key, n);
}

/// The summary line of `n` suppressed lines (none for 0).
pub fn report(key: &str, n: u64) {
    if n > 0 {
        tracing::warn!(
            instance = key,
            suppressed = n,
            "{n} more log lines caused by the instance's tenants suppressed (rate limit)"
        );
    }
}

/// `tracing::<level>!(...)` of a line a tenant can cause, through `key`'s limit (crate docs):
/// `tenant_log!(warn, key, fields..., "message")`; the line carries `instance = key`.
#[macro_export]
macro_rules! tenant_log {
    ($level:ident, $key:expr, $($rest:tt)+) => {{
        let key: &str = $key;
        if let Some(n) = $crate::admit(key) {
            $crate::report(key, n);
            $crate::__tracing::$level!(instance = key, $($rest)+);
        }
    }};
}

/// What code logs, as text: for the tests of the log limits (feature `capture`).
#[cfg(any(test, feature = "capture"))]
pub mod capture {
    use std::sync::{Arc, Mutex};

    /// A `tracing` writer that keeps what is written.
    #[derive(Clone, Default)]
    pub struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Capture {
        /// A subscriber writing WARN and above into this capture, without colours.
        pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + use<> {
            let w = self.clone();
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::WARN)
                .with_ansi(false)
                .with_writer(move || w.clone())
                .finish()
        }

        /// What was written so far.
        pub fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
        }
    }

    /// What `f` logs on this thread (WARN and above), as text.
    pub fn captured(f: impl FnOnce()) -> String {
        let out = Capture::default();
        tracing::subscriber::with_default(out.subscriber(), f);
        out.text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_bucket_admits_its_burst_then_counts() {
        let mut b = TokenBucket::new(0.0, 3.0);
        assert_eq!(
            (0..10).map(|_| b.admit()).collect::<Vec<_>>(),
            [Some(0), Some(0), Some(0)]
                .into_iter()
                .chain([None; 7])
                .collect::<Vec<_>>()
        );
        assert_eq!(b.take_suppressed(), 7);
        let mut b = TokenBucket::new(1e9, 1.0);
        b.admit();
        b.add_suppressed(5);
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_eq!(b.admit(), Some(5));
    }

    #[test]
    fn test_a_flood_writes_its_burst_and_a_summary() {
        let log = capture::captured(|| {
            for i in 0..1000 {
                tenant_log!(warn, "tenant-log-test", i, "refused");
            }
            flush("tenant-log-test");
        });
        let lines = log.lines().filter(|l| l.contains("refused")).count();
        assert!(lines as f64 <= BURST + 2.0, "{lines}");
        let summary = log.lines().find(|l| l.contains("suppressed=")).unwrap();
        assert!(
            summary.contains("instance=\"tenant-log-test\"")
                || summary.contains("instance=tenant-log-test"),
            "{summary}"
        );
    }
}
