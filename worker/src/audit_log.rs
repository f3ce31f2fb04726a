//! The audit trail: one JSON line per denied, would-be-denied or failed call, to a file and to the
//! log; and, when an instance stops, one JSON line per (entry, decision) with its count.
//!
//! Event lines are `ioctl_proxy::AuditEvent` as JSON (`"type": "event"`); count lines are
//! `{"type": "count", "instance", "kind", "name", "decision", "count"}`; a
//! `{"type": "suppressed", "instance", "events"}` line says how many events the rate limit left
//! out since the previous line (the counts still include them).
//!
//! A tenant chooses how many denied calls it makes, so the trail is bounded (issue 9, finding 5):
//! - **rate:** per instance a token bucket ([`AuditLimits::events_per_second`], burst
//!   [`AuditLimits::burst`]) admits events; the others are counted and summarised in one
//!   `suppressed` line (and one warning) when the next event is admitted or the instance stops;
//! - **size:** a file that reaches [`AuditLimits::max_bytes`] is renamed to `<file>.1`
//!   (replacing an older one) and a new file started, so one instance's trail never takes more
//!   than twice the limit;
//! - **never blocking:** the request path only formats the line and hands it to the instance's
//!   writer thread through a bounded queue; when the queue is full (the disk is slow or full)
//!   the event is dropped and counted with the suppressed ones, never waited for.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use ioctl_proxy::audit::{AuditCounts, AuditEvent, AuditSink};
use serde::Serialize;

use crate::ratelimit::TokenBucket;

/// Bounds of one instance's audit trail.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AuditLimits {
    /// Events admitted per second, sustained.
    pub events_per_second: f64,
    /// Events admitted at once after a quiet period.
    pub burst: f64,
    /// Size at which the file is rotated to `<file>.1`.
    pub max_bytes: u64,
    /// Lines waiting for the writer thread before events are dropped.
    pub queue: usize,
}

impl Default for AuditLimits {
    fn default() -> Self {
        Self {
            events_per_second: 100.0,
            burst: 1000.0,
            max_bytes: 64 << 20,
            queue: 4096,
        }
    }
}

#[derive(Serialize)]
struct EventLine<'a> {
    r#type: &'static str,
    #[serde(flatten)]
    ev: &'a AuditEvent,
}

#[derive(Serialize)]
struct CountLine<'a> {
    r#type: &'static str,
    instance: &'a str,
    #[serde(flatten)]
    row: &'a ioctl_proxy::audit::CountRow,
}

#[derive(Serialize)]
struct SuppressedLine<'a> {
    r#type: &'static str,
    instance: &'a str,
    events: u64,
}

enum Msg {
    Line(String),
    /// Answered once every line before it is written and flushed.
    Sync(SyncSender<()>),
}

/// Writes audit events as JSON lines, bounded in rate and size, off the request path.
pub struct JsonLinesSink {
    limiter: Mutex<TokenBucket>,
    tx: Option<SyncSender<Msg>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

/// The writer thread's file: appends, rotates at the limit.
struct Writer {
    path: PathBuf,
    file: BufWriter<File>,
    size: u64,
    max_bytes: u64,
}

impl Writer {
    fn open(path: &Path, max_bytes: u64) -> Result<Self> {
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening audit log {}", path.display()))?;
        let size = f.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(Self {
            path: path.to_owned(),
            file: BufWriter::new(f),
            size,
            max_bytes,
        })
    }

    fn write(&mut self, line: &str) {
        let len = line.len() as u64 + 1;
        if self.size > 0 && self.size + len > self.max_bytes {
            self.rotate();
        }
        match writeln!(self.file, "{line}") {
            Ok(()) => self.size += len,
            Err(e) => {
                tracing::error!(error = %e, path = %self.path.display(), "writing the audit log failed")
            }
        }
    }

    fn rotate(&mut self) {
        let _ = self.file.flush();
        let old = rotated_path(&self.path);
        if let Err(e) = std::fs::rename(&self.path, &old) {
            // A worker under its own uid may not write the log's directory: its supervisor
            // created both files for it, so the old lines are copied into the `.1` file.
            match std::fs::copy(&self.path, &old) {
                Ok(_) => {}
                Err(e2) => {
                    tracing::error!(error = %e, copy_error = %e2, path = %self.path.display(), "rotating the audit log failed (rename and copy); truncating it")
                }
            }
        }
        match OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&self.path)
        {
            Ok(f) => {
                self.file = BufWriter::new(f);
                self.size = 0;
                tracing::info!(path = %self.path.display(), old = %old.display(), "audit log rotated");
            }
            Err(e) => {
                tracing::error!(error = %e, path = %self.path.display(), "reopening the audit log failed")
            }
        }
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Line(l) => self.write(&l),
            Msg::Sync(done) => {
                let _ = self.file.flush();
                let _ = done.send(());
            }
        }
    }

    fn run(mut self, rx: Receiver<Msg>) {
        while let Ok(msg) = rx.recv() {
            self.handle(msg);
            // Flush when the queue is empty: a burst is written in one go, a lone line at once.
            while let Ok(m) = rx.try_recv() {
                self.handle(m);
            }
            if let Err(e) = self.file.flush() {
                tracing::error!(error = %e, path = %self.path.display(), "writing the audit log failed");
            }
        }
    }
}

/// `<file>.1`.
pub fn rotated_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".1");
    PathBuf::from(s)
}

impl JsonLinesSink {
    /// A sink appending to `path` (created if missing) with the default limits, or only logging
    /// when `None`.
    pub fn open(path: Option<&Path>) -> Result<Self> {
        Self::with_limits(path, AuditLimits::default())
    }

    /// A sink with explicit limits.
    pub fn with_limits(path: Option<&Path>, limits: AuditLimits) -> Result<Self> {
        let (tx, writer) = match path {
            Some(p) => {
                if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating audit directory {}", dir.display()))?;
                }
                let w = Writer::open(p, limits.max_bytes)?;
                let (tx, rx) = sync_channel(limits.queue.max(1));
                let h = std::thread::Builder::new()
                    .name("audit-writer".into())
                    .spawn(move || w.run(rx))
                    .context("starting the audit writer thread")?;
                (Some(tx), Some(h))
            }
            None => (None, None),
        };
        Ok(JsonLinesSink {
            limiter: Mutex::new(TokenBucket::new(limits.events_per_second, limits.burst)),
            tx,
            writer: Mutex::new(writer),
        })
    }

    fn limiter(&self) -> MutexGuard<'_, TokenBucket> {
        self.limiter.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands a line to the writer; false when the queue is full (the line is dropped).
    fn send(&self, line: String) -> bool {
        match &self.tx {
            Some(tx) => match tx.try_send(Msg::Line(line)) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => false,
                Err(TrySendError::Disconnected(_)) => false,
            },
            None => true,
        }
    }

    /// Writes the pending `suppressed` line, if events were left out.
    fn report_suppressed(&self, instance: &str, n: u64) {
        if n == 0 {
            return;
        }
        tracing::warn!(
            instance,
            suppressed = n,
            "{n} more audit events suppressed (rate limit or slow disk)"
        );
        if let Ok(line) = serde_json::to_string(&SuppressedLine {
            r#type: "suppressed",
            instance,
            events: n,
        }) && !self.send(line)
        {
            // The queue is full: the count goes into the next summary.
            self.limiter().add_suppressed(n);
        }
    }

    /// Waits until every line handed over so far is written (not on the request path).
    pub fn sync(&self) {
        if let Some(tx) = &self.tx {
            let (done_tx, done_rx) = sync_channel(1);
            if tx.send(Msg::Sync(done_tx)).is_ok() {
                let _ = done_rx.recv();
            }
        }
    }

    /// Appends the counts of allowed (and other) calls, one line per entry and decision, after
    /// the pending summary of suppressed events; waits until they are written.
    pub fn write_counts(&self, instance: &str, counts: &AuditCounts) {
        let pending = self.limiter().take_suppressed();
        self.report_suppressed(instance, pending);
        for row in counts.snapshot() {
            tracing::info!(
                instance,
                kind = ?row.kind,
                name = %row.name,
                decision = ?row.decision,
                count = row.count,
                "audit count"
            );
            match serde_json::to_string(&CountLine {
                r#type: "count",
                instance,
                row: &row,
            }) {
                // Count lines are few (bounded by AuditCounts) and written at stop: wait.
                Ok(line) => {
                    if let Some(tx) = &self.tx {
                        let _ = tx.send(Msg::Line(line));
                    }
                }
                Err(e) => tracing::error!(error = %e, "serialising an audit count"),
            }
        }
        self.sync();
    }
}

impl Drop for JsonLinesSink {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(h) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }
}

impl AuditSink for JsonLinesSink {
    fn record(&self, ev: &AuditEvent) {
        let Some(pending) = self.limiter().admit() else {
            return;
        };
        self.report_suppressed(&ev.instance, pending);
        tracing::info!(
            instance = %ev.instance,
            pid = ev.pid,
            node = %ev.node,
            kind = ?ev.kind,
            name = %ev.name,
            number = format_args!("{:#x}", ev.number),
            decision = ?ev.decision,
            nv_status = ?ev.nv_status,
            errno = ?ev.errno,
            latency_us = ev.latency_us,
            "audit"
        );
        match serde_json::to_string(&EventLine {
            r#type: "event",
            ev,
        }) {
            Ok(line) => {
                if !self.send(line) {
                    self.limiter().add_suppressed(1);
                }
            }
            Err(e) => tracing::error!(error = %e, "serialising an audit event"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ioctl_proxy::audit::{Decision, Kind};

    fn event(n: u32) -> AuditEvent {
        AuditEvent {
            instance: "job".into(),
            pid: 1,
            tid: 1,
            node: "ctl".into(),
            kind: Kind::Control,
            name: format!("control {n:#010x}"),
            number: n,
            decision: Decision::Denied,
            reason: Some("unknown control"),
            nv_status: Some(0x56),
            errno: None,
            latency_us: 1,
        }
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// A log path in a test directory (removed when the directory is dropped).
    fn scratch(name: &str) -> (test_kit::TestDir, PathBuf) {
        let dir = test_kit::TestDir::new(&format!("audit-{name}"));
        let path = dir.path().join("job.jsonl");
        (dir, path)
    }

    /// A flood of denials: the burst is written, the rest summarised in one line, and the counts
    /// still say how many calls there were.
    #[test]
    fn test_a_flood_of_denials_is_rate_limited_with_a_summary() {
        let (_dir, path) = scratch("flood");
        let limits = AuditLimits {
            events_per_second: 0.001,
            burst: 10.0,
            ..AuditLimits::default()
        };
        let sink = JsonLinesSink::with_limits(Some(&path), limits).unwrap();
        let counts = AuditCounts::default();
        for n in 0..100_000 {
            sink.record(&event(n));
            counts.add_unknown(Kind::Control, n, Decision::Denied);
        }
        sink.write_counts("job", &counts);
        let l = lines(&path);
        let events = l.iter().filter(|v| v["type"] == "event").count();
        assert_eq!(events, 10);
        let suppressed: u64 = l
            .iter()
            .filter(|v| v["type"] == "suppressed")
            .map(|v| v["events"].as_u64().unwrap())
            .sum();
        assert_eq!(suppressed, 100_000 - 10);
        let count = l.iter().find(|v| v["type"] == "count").unwrap();
        assert_eq!(count["count"], 100_000);
        assert!(std::fs::metadata(&path).unwrap().len() < 16 << 10);
    }

    /// Past the size limit the file is rotated once; the two files stay under twice the limit.
    #[test]
    fn test_the_file_is_rotated_at_the_size_limit() {
        let (_dir, path) = scratch("rotate");
        let limits = AuditLimits {
            events_per_second: 1e9,
            burst: 1e9,
            max_bytes: 20_000,
            ..AuditLimits::default()
        };
        let sink = JsonLinesSink::with_limits(Some(&path), limits).unwrap();
        for n in 0..2_000 {
            sink.record(&event(n));
            if n % 256 == 0 {
                sink.sync();
            }
        }
        sink.sync();
        let now = std::fs::metadata(&path).unwrap().len();
        let old = std::fs::metadata(rotated_path(&path)).unwrap().len();
        assert!(now <= 20_000 && old <= 20_000, "{now} {old}");
        let newest = lines(&path);
        assert_eq!(newest.last().unwrap()["number"], 1999);
    }

    /// A writer that cannot keep up never blocks `record`: with the queue full the event is
    /// dropped and counted as suppressed.
    #[test]
    fn test_record_never_waits_for_the_writer() {
        let (_dir, path) = scratch("queue");
        let limits = AuditLimits {
            events_per_second: 1e9,
            burst: 1e9,
            queue: 1,
            ..AuditLimits::default()
        };
        let sink = JsonLinesSink::with_limits(Some(&path), limits).unwrap();
        // Hold the writer: a Sync it cannot answer until we read.
        let (done_tx, done_rx) = sync_channel(0);
        sink.tx.as_ref().unwrap().send(Msg::Sync(done_tx)).unwrap();
        let t = std::time::Instant::now();
        for n in 0..10_000 {
            sink.record(&event(n));
        }
        assert!(t.elapsed().as_secs() < 5, "record blocked");
        done_rx.recv().unwrap();
        sink.sync();
        // Every event is accounted for: written, summarised in a `suppressed` line (one may
        // slip into the queue's one place when the writer takes the Sync), or still pending.
        let l = lines(&path);
        let written = l.iter().filter(|v| v["type"] == "event").count() as u64;
        let summarised: u64 = l
            .iter()
            .filter(|v| v["type"] == "suppressed")
            .map(|v| v["events"].as_u64().unwrap())
            .sum();
        let pending = sink.limiter().take_suppressed();
        assert_eq!(
            written + summarised + pending,
            10_000,
            "{written} {summarised} {pending}"
        );
        assert!(written <= 2, "{written} events got past a full queue");
    }
}
