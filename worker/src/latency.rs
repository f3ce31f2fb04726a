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
        let s = d.as_secs_f64();
        let i = BOUNDS_S
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(BOUNDS_S.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
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
