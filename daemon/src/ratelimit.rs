//! Rate limits of what a tenant can make the daemon write: the audit trail (`audit_log.rs`)
//! and every log line a tenant's calls can cause ([`tenant_log!`]).
//!
//! A tenant chooses how often it is refused, so a `WARN` per refused open or ioctl is a write
//! it controls: under systemd, journald's own rate limit would then drop every instance's
//! messages. So each instance has a token bucket for its tenant-caused lines
//! ([`LOG_LINES_PER_SECOND`], burst [`LOG_BURST`]); a line past it is counted, not written,
//! and the next line admitted is preceded by one `WARN` saying how many were suppressed (as
//! is the instance's stop, [`flush`]).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Tenant-caused log lines admitted per second per instance, sustained.
pub const LOG_LINES_PER_SECOND: f64 = 10.0;
/// Tenant-caused log lines admitted at once per instance after a quiet period.
pub const LOG_BURST: f64 = 100.0;
/// Instances with a bucket of their own; more share one (instance names are the admin's, so
/// this only bounds the map).
const MAX_INSTANCES: usize = 1024;

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

fn buckets() -> std::sync::MutexGuard<'static, HashMap<String, TokenBucket>> {
    static B: OnceLock<Mutex<HashMap<String, TokenBucket>>> = OnceLock::new();
    B.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Whether `instance` may write one more tenant-caused line: `Some(n)` yes, after reporting
/// the `n` left out before (see [`tenant_log!`]); `None` no.
pub fn admit(instance: &str) -> Option<u64> {
    let mut b = buckets();
    let key = if b.contains_key(instance) || b.len() < MAX_INSTANCES {
        instance
    } else {
        ""
    };
    if !b.contains_key(key) {
        b.insert(
            key.to_owned(),
            TokenBucket::new(LOG_LINES_PER_SECOND, LOG_BURST),
        );
    }
    b.get_mut(key).expect("inserted").admit()
}

/// Reports what `instance`'s limit left out since its last admitted line (its instance stops).
pub fn flush(instance: &str) {
    let n = buckets()
        .get_mut(instance)
        .map_or(0, TokenBucket::take_suppressed);
    report(instance, n);
}

/// The summary line of `n` suppressed lines (none for 0).
pub fn report(instance: &str, n: u64) {
    if n > 0 {
        tracing::warn!(
            instance,
            suppressed = n,
            "{n} more log lines caused by the instance's tenants suppressed (rate limit)"
        );
    }
}

/// `tracing::<level>!(...)` of a line a tenant can cause, through its instance's limit
/// (module docs): `tenant_log!(warn, instance, fields..., "message")`.
macro_rules! tenant_log {
    ($level:ident, $instance:expr, $($rest:tt)+) => {{
        let instance: &str = $instance;
        if let Some(n) = $crate::ratelimit::admit(instance) {
            $crate::ratelimit::report(instance, n);
            tracing::$level!(instance, $($rest)+);
        }
    }};
}
pub(crate) use tenant_log;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::Arc;

    /// What `f` logs on this thread (WARN and above), as text.
    fn captured(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Capture(Arc<Mutex<Vec<u8>>>);
        impl Write for Capture {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let out = Capture::default();
        let w = out.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(sub, f);
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn test_a_flood_of_refused_opens_writes_a_bounded_log_with_a_summary() {
        use crate::node::{Backend, Node};
        let sim = nvsim::SimDriver::new(nvsim::SimConfig::default_gpus(1));
        let mut policy = ioctl_proxy::InstancePolicy::new(
            "log-flood",
            nvproxy_abi::Caps::COMPUTE_UTILITY,
            vec![0],
        );
        policy.quotas.open_files = 1;
        let proxy = Arc::new(
            ioctl_proxy::Proxy::for_host(policy, sim as Arc<dyn ioctl_proxy::HostDriver>).unwrap(),
        );
        let backend = crate::backend::ProxyBackend::new(proxy);
        let first = backend.open(Node::Ctl, 1).unwrap();
        let refused = 5_000;
        let log = captured(|| {
            for _ in 0..refused {
                assert!(backend.open(Node::Ctl, 1).is_err());
            }
            flush("log-flood");
        });
        let lines = log.lines().filter(|l| l.contains("open failed")).count();
        assert!(
            lines as f64 <= LOG_BURST + 2.0,
            "{lines} lines for {refused} refused opens"
        );
        let summary = log
            .lines()
            .find(|l| l.contains("suppressed"))
            .expect("a summary");
        assert!(summary.contains("log-flood"), "{summary}");
        // Every refused open is either written or counted.
        let counted: usize = log
            .lines()
            .filter_map(|l| l.split("suppressed=").nth(1))
            .map(|n| {
                n.split_whitespace()
                    .next()
                    .unwrap()
                    .parse::<usize>()
                    .unwrap()
            })
            .sum();
        assert_eq!(lines + counted, refused, "{log}");
        backend.release(first);
    }

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
}
