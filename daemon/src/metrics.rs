//! Prometheus metrics: what each worker measures ([`nvproxy_worker::latency::LATENCY`], its audit counts, open files and
//! objects, answered on its stats socket) and what the supervisor renders from them
//! ([`render`]): `GET /metrics` on the control socket's `metrics` request and, with
//! `[daemon] metrics_listen`, over HTTP ([`HttpServer`], our own bounded HTTP/1.0 responder).
//!
//! Encoding is `prometheus-client`'s (text format); the numbers come from the workers at each
//! scrape through a [`Collector`], so the supervisor keeps no copy that could go stale.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use nvproxy_worker::latency::BOUNDS_S;
#[cfg(test)]
use nvproxy_worker::worker_spec::IoctlCount;
use nvproxy_worker::worker_spec::WorkerStats;

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
        for (name, help, quota) in [
            (
                "nvproxy_gpu_memory_used_bytes",
                "Video memory the instance's objects hold, per GPU (host minor)",
                false,
            ),
            (
                "nvproxy_gpu_memory_quota_bytes",
                "The instance's video memory quota per GPU (only instances with one)",
                true,
            ),
        ] {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (i, s) in &with_stats {
                for g in &s.gpu_memory {
                    let v = if quota { g.quota } else { Some(g.used) };
                    let Some(v) = v else { continue };
                    let labels: Labels =
                        vec![("instance", i.name.clone()), ("gpu", g.gpu.to_string())];
                    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
                        .encode(e.encode_family(&labels)?)?;
                }
            }
        }
        for (name, help, quota) in [
            (
                "nvproxy_system_memory_used_bytes",
                "System memory the driver holds for the instance's objects",
                false,
            ),
            (
                "nvproxy_system_memory_quota_bytes",
                "The instance's system memory quota (only instances with one)",
                true,
            ),
        ] {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (i, s) in &with_stats {
                let v = if quota {
                    s.system_memory_quota
                } else {
                    Some(s.system_memory)
                };
                let Some(v) = v else { continue };
                ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
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

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Connections served at once: a fixed pool of this many threads, started with the listener
/// (no thread per connection, none started later).
pub const HTTP_THREADS: usize = 4;
/// Accepted connections waiting for a serving thread; past it a connection is closed at once.
pub const HTTP_QUEUE: usize = 16;
/// The longest request head read (request line and headers); a longer one is answered 431.
pub const HTTP_MAX_HEAD: usize = 8 << 10;
/// The time one connection may take from its accept to its answer's last byte, whatever the
/// client sends or reads; then it is closed.
#[cfg(not(test))]
pub const HTTP_CONNECTION_TIME: Duration = Duration::from_secs(5);
#[cfg(test)]
pub const HTTP_CONNECTION_TIME: Duration = Duration::from_millis(500);
/// A rendering this young answers the next scrape too: scrapes ask the workers at most once
/// per interval, however many arrive.
pub const HTTP_MIN_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// `GET /metrics` over HTTP/1.0 on `[daemon] metrics_listen`: our own small responder on
/// `std::net`, with every bound fixed (ARCHITECTURE.md, "Metrics"): [`HTTP_THREADS`] serving
/// threads and a [`HTTP_QUEUE`] of accepted connections (the rest are closed at once, so fds
/// and threads never grow with connections), [`HTTP_MAX_HEAD`] bytes of request head,
/// [`HTTP_CONNECTION_TIME`] per connection, one request per connection (pipelined requests are
/// never read), and at most one sampling of the workers per [`HTTP_MIN_SAMPLE_INTERVAL`]. An
/// accept error (`EMFILE`, `ENFILE`, ...) is logged and retried after a pause, never fatal; a
/// serving thread that panics is replaced by its loop.
pub struct HttpServer {
    /// The accept thread's stop pipe (write end): dropped, it ends the thread's wait.
    stop: Option<OwnedFd>,
    addr: std::net::SocketAddr,
    threads: Vec<std::thread::JoinHandle<()>>,
}

type Sampler = dyn Fn() -> Vec<InstanceSample> + Send + Sync;

/// The latest rendering and when it was made.
struct Rendered {
    sample: Box<Sampler>,
    last: Mutex<Option<(Instant, Result<String, String>)>>,
}

impl Rendered {
    fn text(&self) -> Result<String, String> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, text)) = &*last
            && at.elapsed() < HTTP_MIN_SAMPLE_INTERVAL
        {
            return text.clone();
        }
        let text = render((self.sample)()).map_err(|e| format!("{e:#}"));
        *last = Some((Instant::now(), text.clone()));
        text
    }
}

impl HttpServer {
    /// Listens on `addr` and serves until dropped.
    pub fn start(
        addr: &str,
        sample: impl Fn() -> Vec<InstanceSample> + Send + Sync + 'static,
    ) -> Result<Self> {
        let listener = std::net::TcpListener::bind(addr)
            .with_context(|| format!("[daemon] metrics_listen = {addr:?}"))?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        let (stop_r, stop_w) = nvproxy_worker::listener::stop_pipe()
            .context("a stop pipe for the metrics listener")?;
        let rendered = Arc::new(Rendered {
            sample: Box::new(sample),
            last: Mutex::new(None),
        });
        let (tx, rx) = std::sync::mpsc::sync_channel::<(std::net::TcpStream, Instant)>(HTTP_QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for i in 0..HTTP_THREADS {
            let (rx, rendered) = (rx.clone(), rendered.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("metrics-http-{i}"))
                    .spawn(move || serve_queue(&rx, &rendered))
                    .context("starting the metrics threads")?,
            );
        }
        threads.push(
            std::thread::Builder::new()
                .name("metrics-accept".into())
                .spawn(move || accept_loop(&listener, &tx, &stop_r))
                .context("starting the metrics listener")?,
        );
        Ok(HttpServer {
            stop: Some(stop_w),
            addr: local,
            threads,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        drop(self.stop.take());
        // The accept thread ends at once and drops the queue's sender; the
        // serving threads end with it (each connection within HTTP_CONNECTION_TIME).
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Accepts until `stop`: each connection goes to the queue, or is closed when it is full.
fn accept_loop(
    listener: &std::net::TcpListener,
    queue: &std::sync::mpsc::SyncSender<(std::net::TcpStream, Instant)>,
    stop: &OwnedFd,
) {
    use nvproxy_worker::listener::{self, Failure, Stop};
    use std::ops::ControlFlow;
    use std::os::fd::AsFd;
    let mut last_warning: Option<Instant> = None;
    let mut refused = 0u64;
    let stop = Stop::Pipe(stop.as_fd());
    listener::accept_loop(listener.as_fd(), stop, |turn| {
        match turn {
            Ok(conn) => {
                let conn = std::net::TcpStream::from(conn);
                match queue.try_send((conn, Instant::now())) {
                    Ok(()) => {}
                    // Full: closed at once (the client sees a reset), counted and said now and
                    // then; nothing waits for it.
                    Err(std::sync::mpsc::TrySendError::Full(_)) => {
                        refused += 1;
                        if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                            last_warning = Some(Instant::now());
                            tracing::warn!(
                                refused,
                                "metrics listener: {HTTP_THREADS} connections served and {HTTP_QUEUE} waiting; more are closed at once"
                            );
                        }
                    }
                    Err(std::sync::mpsc::TrySendError::Disconnected(_)) => {
                        return ControlFlow::Break(());
                    }
                }
            }
            Err(Failure::Poll(e)) => {
                tracing::error!(error = %e, "metrics listener: poll failed; retrying in 1 s");
                std::thread::sleep(Duration::from_secs(1));
            }
            // EMFILE, ENFILE, ENOBUFS, ...: the listener stays; try again after a pause.
            Err(Failure::Accept(e)) => {
                if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    last_warning = Some(Instant::now());
                    tracing::error!(error = %e, "metrics listener: accept failed; retrying");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        ControlFlow::Continue(())
    });
}

/// A serving thread: answers queued connections until the queue's sender is gone.
fn serve_queue(
    rx: &Mutex<std::sync::mpsc::Receiver<(std::net::TcpStream, Instant)>>,
    rendered: &Rendered,
) {
    loop {
        let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok((conn, accepted)) = next else {
            return;
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            answer_http(conn, accepted + HTTP_CONNECTION_TIME, rendered)
        }));
        if r.is_err() {
            tracing::error!("metrics listener: a connection's handler panicked; serving on");
        }
    }
}

/// The time left until `deadline`, or `None` when it passed.
fn left(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Reads one request head (bounded in size and time) and answers it; closes the connection.
fn answer_http(mut conn: std::net::TcpStream, deadline: Instant, rendered: &Rendered) {
    use std::io::{Read, Write};
    let _ = conn.set_nodelay(true);
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let complete = loop {
        if let Some(end) = find_head_end(&head) {
            head.truncate(end);
            break true;
        }
        if head.len() > HTTP_MAX_HEAD {
            break false;
        }
        let Some(t) = left(deadline) else {
            return; // too slow: closed without an answer
        };
        if conn.set_read_timeout(Some(t)).is_err() {
            return;
        }
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    };
    let (status, content_type, body) = if !complete {
        (
            "431 Request Header Fields Too Large",
            "text/plain",
            format!("request head over {HTTP_MAX_HEAD} bytes\n"),
        )
    } else {
        route(&head, rendered)
    };
    let mut out = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    let mut sent = 0;
    while sent < out.len() {
        let Some(t) = left(deadline) else {
            return; // a client that does not read: closed
        };
        if conn.set_write_timeout(Some(t)).is_err() {
            return;
        }
        match conn.write(&out[sent..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => sent += n,
        }
    }
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

/// Where the request head ends (after its blank line).
fn find_head_end(head: &[u8]) -> Option<usize> {
    head.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4)
        .or_else(|| head.windows(2).position(|w| w == b"\n\n").map(|p| p + 2))
}

/// The answer to a request head: status, content type, body.
fn route(head: &[u8], rendered: &Rendered) -> (&'static str, &'static str, String) {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end().split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" {
        return ("405 Method Not Allowed", "text/plain", "GET only\n".into());
    }
    if path != "/metrics" {
        return (
            "404 Not Found",
            "text/plain",
            "not found: the metrics are at /metrics\n".into(),
        );
    }
    match rendered.text() {
        Ok(text) => ("200 OK", CONTENT_TYPE, text),
        Err(e) => ("500 Internal Server Error", "text/plain", format!("{e}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvproxy_worker::latency::Latency;

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
                    gpu_memory: vec![nvproxy_worker::worker_spec::GpuMemoryStat {
                        gpu: 1,
                        used: 8 << 30,
                        quota: Some(10 << 30),
                    }],
                    system_memory: 3 << 30,
                    system_memory_quota: Some(32 << 30),
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
            "nvproxy_gpu_memory_used_bytes{instance=\"job42\",gpu=\"1\"} 8589934592",
            "nvproxy_gpu_memory_quota_bytes{instance=\"job42\",gpu=\"1\"} 10737418240",
            "nvproxy_system_memory_used_bytes{instance=\"job42\"} 3221225472",
            "nvproxy_system_memory_quota_bytes{instance=\"job42\"} 34359738368",
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
        let addr = server.addr();
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
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "still listening after the drop"
        );
    }

    fn metrics_threads() -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.starts_with("metrics-"))
            })
            .count()
    }

    fn scrape(addr: std::net::SocketAddr) -> std::io::Result<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }

    /// Issue 20, item 4 (a, c, d): idle connections cost no thread each (tiny_http added one
    /// per connection), each is closed after its time, and scrapes are answered again soon.
    #[test]
    fn test_idle_connections_cost_no_threads_and_are_closed_in_time() {
        use std::io::Read;
        let server = HttpServer::start("127.0.0.1:0", sample).unwrap();
        let addr = server.addr();
        let idle: Vec<std::net::TcpStream> = (0..200)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        // Two servers' worth at most (another test may run one meanwhile).
        let threads = metrics_threads();
        assert!(
            threads <= 2 * (HTTP_THREADS + 1),
            "{threads} metrics threads with 200 idle connections"
        );
        // Every idle connection ends: closed at once (queue full) or after its time.
        let t = Instant::now();
        for mut c in idle {
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = [0u8; 64];
            assert!(
                matches!(c.read(&mut buf), Ok(0) | Err(_)),
                "an idle connection got an answer"
            );
        }
        let max =
            HTTP_CONNECTION_TIME * u32::try_from(HTTP_QUEUE / HTTP_THREADS + 2).expect("small");
        assert!(
            t.elapsed() < max,
            "idle connections held for {:?}",
            t.elapsed()
        );
        let ok = scrape(addr).unwrap();
        assert!(ok.starts_with("HTTP/1.0 200"), "{ok}");
    }

    /// Issue 20, item 4 (b): a request head past the bound is answered 431 after at most the
    /// bound and a buffer read, not kept (tiny_http grew by the header's size).
    #[test]
    fn test_an_oversized_request_head_is_refused() {
        use std::io::{Read, Write};
        let server = HttpServer::start("127.0.0.1:0", sample).unwrap();
        let mut s = std::net::TcpStream::connect(server.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nX-Big: ");
        let chunk = vec![b'a'; 64 << 10];
        // The server answers and closes once it has read past the bound: writes fail then.
        for _ in 0..16 {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.0 431"), "{out}");
    }

    /// One request per connection: pipelined requests behind the first are never read, and a
    /// client that sends its head byte by byte is cut off at its time.
    #[test]
    fn test_pipelined_and_slow_requests_are_bounded() {
        use std::io::{Read, Write};
        let server = HttpServer::start("127.0.0.1:0", sample).unwrap();
        let addr = server.addr();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(&b"GET /metrics HTTP/1.0\r\n\r\n".repeat(300))
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert_eq!(out.matches("HTTP/1.0 200").count(), 1, "{out}");
        let mut slow = std::net::TcpStream::connect(addr).unwrap();
        let t = Instant::now();
        let mut cut = false;
        while t.elapsed() < 4 * HTTP_CONNECTION_TIME {
            if slow.write_all(b"G").is_err() {
                cut = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut rest = Vec::new();
        slow.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let _ = slow.read_to_end(&mut rest);
        assert!(
            cut || rest.is_empty(),
            "a byte-by-byte client was served for {:?}",
            t.elapsed()
        );
        assert!(scrape(addr).unwrap().starts_with("HTTP/1.0 200"));
    }
}
