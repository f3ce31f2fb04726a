//! The request-latency histogram a worker keeps ([`LATENCY`]): every ioctl its nodes answer,
//! on both transports; the stats socket carries its [`LatencySnapshot`] to the supervisor's
//! metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::worker_spec::LatencySnapshot;

/// Upper bounds (seconds) of the request-latency histogram's buckets; one more, `+Inf`,
/// follows. From 10 µs (a native request's floor) to 1 s (a request parked on tenant memory
/// until its bounded wait ends).
pub const BOUNDS_S: [f64; 13] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.1, 1.0,
];

/// [`BOUNDS_S`] in nanoseconds.
const BOUNDS_NS: [u64; BOUNDS_S.len()] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    100_000_000,
    1_000_000_000,
];

/// A worker's request latencies: one counter per bucket (not cumulative) and the sum.
pub struct Latency {
    buckets: [AtomicU64; BOUNDS_S.len() + 1],
    sum_ns: AtomicU64,
}

/// The worker's histogram: every ioctl its nodes answer (the frontend nodes and UVM), from the
/// request's arrival at the handler to its answer.
pub static LATENCY: Latency = Latency::new();

impl Latency {
    /// An empty histogram.
    pub const fn new() -> Self {
        Latency {
            buckets: [const { AtomicU64::new(0) }; BOUNDS_S.len() + 1],
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Counts one request that took `d`.
    pub fn observe(&self, d: Duration) {
        self.observe_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Counts one request that started at `start` ([`ioctl_proxy::service::monotonic_ns`]).
    pub fn observe_since(&self, start: u64) {
        self.observe_ns(ioctl_proxy::service::monotonic_ns().saturating_sub(start));
    }

    /// Counts one request that took `ns` nanoseconds.
    pub fn observe_ns(&self, ns: u64) {
        // Integers only: every request passes here.
        let i = BOUNDS_NS
            .iter()
            .position(|&b| ns <= b)
            .unwrap_or(BOUNDS_NS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The numbers now.
    pub fn snapshot(&self) -> LatencySnapshot {
        LatencySnapshot {
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_bounds_in_ns_are_the_bounds_in_seconds() {
        for (ns, s) in BOUNDS_NS.iter().zip(BOUNDS_S) {
            #[expect(clippy::cast_precision_loss, reason = "at most 1e9")]
            let got = *ns as f64 / 1e9;
            assert!((got - s).abs() < 1e-12, "{ns} ns vs {s} s");
        }
    }

    #[test]
    fn test_a_request_lands_in_the_first_bucket_that_holds_it() {
        let l = Latency::new();
        l.observe(Duration::from_micros(10)); // on the bound: that bucket
        l.observe(Duration::from_nanos(10_001));
        l.observe(Duration::from_secs(2)); // past every bound: +Inf
        let s = l.snapshot();
        assert_eq!(
            (s.buckets[0], s.buckets[1], s.buckets[BOUNDS_S.len()]),
            (1, 1, 1)
        );
        assert_eq!(s.sum_ns, 2_000_020_001);
    }
}
