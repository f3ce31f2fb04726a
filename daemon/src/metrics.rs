//! Prometheus metrics: what each worker measures ([`LATENCY`], its audit counts, open files and
//! objects, answered on its stats socket) and what the supervisor renders from them
//! ([`render`]): `GET /metrics` on the control socket's `metrics` request and, with
//! `[daemon] metrics_listen`, over HTTP ([`HttpServer`]).
//!
//! Encoding is `prometheus-client`'s (text format); the numbers come from the workers at each
//! scrape through a [`Collector`], so the supervisor keeps no copy that could go stale.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use crate::worker::WorkerStats;

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

/// A histogram as the stats socket carries it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LatencySnapshot {
    /// Per bucket of [`BOUNDS_S`] and `+Inf`, not cumulative.
    pub buckets: Vec<u64>,
    /// Sum of the latencies, nanoseconds.
    pub sum_ns: u64,
}

/// One row of a worker's audit counts, as the stats socket carries it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct IoctlCount {
    /// escape, control, class or uvm.
    pub kind: String,
    /// The entry's driver name (or the fold-over row's).
    pub name: String,
    /// allowed, denied, audit-would-deny or failed.
    pub decision: String,
    /// Calls.
    pub count: u64,
}

/// What the supervisor knows of one instance at a scrape.
#[derive(Debug, Clone)]
pub struct InstanceSample {
    /// The instance.
    pub name: String,
    /// Its worker serves.
    pub running: bool,
    /// Workers started again after an unasked exit, since the supervisor started.
    pub restarts: u64,
    /// The worker's numbers (`None` when it did not answer).
    pub stats: Option<WorkerStats>,
}

#[derive(Debug)]
struct Sampled(Vec<InstanceSample>);

type Labels = Vec<(&'static str, String)>;

fn instance_label(name: &str) -> Labels {
    vec![("instance", name.to_owned())]
}

impl Collector for Sampled {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let running = self.0.iter().filter(|i| i.running).count();
        ConstGauge::new(running as i64).encode(encoder.encode_descriptor(
            "nvproxy_workers",
            "Worker processes serving an instance",
            None,
            MetricType::Gauge,
        )?)?;
        {
            let mut e = encoder.encode_descriptor(
                "nvproxy_instance_up",
                "1 while the instance's worker serves, 0 when it failed",
                None,
                MetricType::Gauge,
            )?;
            for i in &self.0 {
                ConstGauge::new(i64::from(i.running))
                    .encode(e.encode_family(&instance_label(&i.name))?)?;
            }
        }
        {
            let mut e = encoder.encode_descriptor(
                "nvproxy_worker_restarts",
                "Workers started again after exiting unasked",
                None,
                MetricType::Counter,
            )?;
            for i in &self.0 {
                ConstCounter::new(i.restarts).encode(e.encode_family(&instance_label(&i.name))?)?;
            }
        }
        let with_stats: Vec<(&InstanceSample, &WorkerStats)> = self
            .0
            .iter()
            .filter_map(|i| Some((i, i.stats.as_ref()?)))
            .collect();
        for (name, help, value) in [
            (
                "nvproxy_open_files",
                "Open files of the instance's nodes",
                (|s: &WorkerStats| s.open_files) as fn(&WorkerStats) -> usize,
            ),
            (
                "nvproxy_objects",
                "RM clients and objects the instance holds",
                |s: &WorkerStats| s.objects,
            ),
        ] {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (i, s) in &with_stats {
                ConstGauge::new(value(s) as i64)
                    .encode(e.encode_family(&instance_label(&i.name))?)?;
            }
        }
        {
            let mut e = encoder.encode_descriptor(
                "nvproxy_ioctls",
                "Ioctls by instance, table kind, driver name and decision",
                None,
                MetricType::Counter,
            )?;
            for (i, s) in &with_stats {
                for c in &s.ioctls {
                    let labels: Labels = vec![
                        ("instance", i.name.clone()),
                        ("kind", c.kind.clone()),
                        ("name", c.name.clone()),
                        ("decision", c.decision.clone()),
                    ];
                    ConstCounter::new(c.count).encode(e.encode_family(&labels)?)?;
                }
            }
        }
        {
            let mut e = encoder.encode_descriptor(
                "nvproxy_ioctl_duration_seconds",
                "Time from an ioctl's arrival at the worker to its answer",
                None,
                MetricType::Histogram,
            )?;
            for (i, s) in &with_stats {
                let l = &s.latency;
                if l.buckets.len() != BOUNDS_S.len() + 1 {
                    continue; // a worker of another build: no histogram rather than a wrong one
                }
                let buckets: Vec<(f64, u64)> = BOUNDS_S
                    .iter()
                    .copied()
                    .chain([f64::INFINITY])
                    .zip(l.buckets.iter().copied())
                    .collect();
                let count = l.buckets.iter().sum();
                e.encode_family(&instance_label(&i.name))?
                    .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    l.sum_ns as f64 / 1e9,
                    count,
                    &buckets,
                    None,
                )?;
            }
        }
        Ok(())
    }
}

/// The text exposition of `samples`.
pub fn render(samples: Vec<InstanceSample>) -> Result<String> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Sampled(samples)));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .context("encoding the metrics")?;
    Ok(out)
}

/// `GET /metrics` over HTTP on `[daemon] metrics_listen` (tiny_http), every answer rendered
/// from `sample` at the request.
pub struct HttpServer {
    server: std::sync::Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl HttpServer {
    /// Listens on `addr` and serves until dropped.
    pub fn start(
        addr: &str,
        sample: impl Fn() -> Vec<InstanceSample> + Send + 'static,
    ) -> Result<Self> {
        let server = std::sync::Arc::new(
            tiny_http::Server::http(addr)
                .map_err(|e| anyhow::anyhow!("[daemon] metrics_listen = {addr:?}: {e}"))?,
        );
        let s = server.clone();
        let thread = std::thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || {
                for req in s.incoming_requests() {
                    let path = req.url().split('?').next().unwrap_or("");
                    let resp = if *req.method() != tiny_http::Method::Get {
                        tiny_http::Response::from_string("GET only\n").with_status_code(405)
                    } else if path != "/metrics" {
                        tiny_http::Response::from_string("not found: the metrics are at /metrics\n")
                            .with_status_code(404)
                    } else {
                        match render(sample()) {
                            Ok(text) => tiny_http::Response::from_string(text).with_header(
                                tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE)
                                    .expect("a valid header"),
                            ),
                            Err(e) => tiny_http::Response::from_string(format!("{e:#}\n"))
                                .with_status_code(500),
                        }
                    };
                    let _ = req.respond(resp);
                }
            })?;
        Ok(HttpServer {
            server,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    #[cfg(test)]
    pub fn addr(&self) -> Option<std::net::SocketAddr> {
        self.server.server_addr().to_ip()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<InstanceSample> {
        let l = Latency::new();
        l.observe(Duration::from_micros(5));
        l.observe(Duration::from_micros(300));
        l.observe(Duration::from_secs(3));
        vec![
            InstanceSample {
                name: "job42".into(),
                running: true,
                restarts: 2,
                stats: Some(WorkerStats {
                    pid: 77,
                    open_files: 3,
                    objects: 9,
                    ioctls: vec![IoctlCount {
                        kind: "control".into(),
                        name: "NV2080_CTRL_CMD_GPU_GET_INFO_V2".into(),
                        decision: "allowed".into(),
                        count: 12,
                    }],
                    latency: l.snapshot(),
                }),
            },
            InstanceSample {
                name: "dead".into(),
                running: false,
                restarts: 5,
                stats: None,
            },
        ]
    }

    #[test]
    fn test_the_text_format_has_every_family_with_the_workers_numbers() {
        let text = render(sample()).unwrap();
        for line in [
            "nvproxy_workers 1",
            "nvproxy_instance_up{instance=\"job42\"} 1",
            "nvproxy_instance_up{instance=\"dead\"} 0",
            "nvproxy_worker_restarts_total{instance=\"dead\"} 5",
            "nvproxy_open_files{instance=\"job42\"} 3",
            "nvproxy_objects{instance=\"job42\"} 9",
            "nvproxy_ioctls_total{instance=\"job42\",kind=\"control\",name=\"NV2080_CTRL_CMD_GPU_GET_INFO_V2\",decision=\"allowed\"} 12",
            "nvproxy_ioctl_duration_seconds_count{instance=\"job42\"} 3",
            "nvproxy_ioctl_duration_seconds_bucket{le=\"0.00001\",instance=\"job42\"} 1",
            "nvproxy_ioctl_duration_seconds_bucket{le=\"0.0005\",instance=\"job42\"} 2",
            "nvproxy_ioctl_duration_seconds_bucket{le=\"1.0\",instance=\"job42\"} 2",
            "nvproxy_ioctl_duration_seconds_bucket{le=\"+Inf\",instance=\"job42\"} 3",
            "# EOF",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in\n{text}"
            );
        }
        assert!(
            !text.contains("nvproxy_open_files{instance=\"dead\"}"),
            "{text}"
        );
    }

    #[test]
    fn test_the_http_endpoint_serves_metrics_and_refuses_other_paths() {
        use std::io::{Read, Write};
        let server = HttpServer::start("127.0.0.1:0", sample).unwrap();
        let addr = server.addr().unwrap();
        let get = |path: &str| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        let ok = get("/metrics");
        assert!(ok.starts_with("HTTP/1.0 200"), "{ok}");
        assert!(ok.contains(CONTENT_TYPE), "{ok}");
        assert!(ok.contains("nvproxy_workers 1"), "{ok}");
        let missing = get("/");
        assert!(missing.starts_with("HTTP/1.0 404"), "{missing}");
        drop(server);
        // tiny_http closes its listener from its own thread after the drop: soon, not at once.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::net::TcpStream::connect(addr).is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "still listening 5 s after the drop"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
