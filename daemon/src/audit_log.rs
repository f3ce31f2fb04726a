//! The audit trail: one JSON line per denied, would-be-denied or failed call, to a file and to the
//! log; and, when an instance stops, one JSON line per (entry, decision) with its count.
//!
//! Event lines are `ioctl_proxy::AuditEvent` as JSON (`"type": "event"`); count lines are
//! `{"type": "count", "instance", "kind", "name", "decision", "count"}`.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use anyhow::{Context, Result};
use ioctl_proxy::audit::{AuditCounts, AuditEvent, AuditSink};
use serde::Serialize;

/// Writes audit events as JSON lines.
pub struct JsonLinesSink {
    file: Mutex<Option<BufWriter<File>>>,
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

impl JsonLinesSink {
    /// A sink appending to `path` (created if missing), or only logging when `None`.
    pub fn open(path: Option<&Path>) -> Result<Self> {
        let file = match path {
            Some(p) => {
                if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating audit directory {}", dir.display()))?;
                }
                let f = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("opening audit log {}", p.display()))?;
                Some(BufWriter::new(f))
            }
            None => None,
        };
        Ok(JsonLinesSink {
            file: Mutex::new(file),
        })
    }

    fn write_line(&self, line: &str) {
        let mut guard = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = guard.as_mut() {
            if let Err(e) = writeln!(f, "{line}").and_then(|()| f.flush()) {
                tracing::error!(error = %e, "writing the audit log failed");
            }
        }
    }

    /// Appends the counts of allowed (and other) calls, one line per entry and decision.
    pub fn write_counts(&self, instance: &str, counts: &AuditCounts) {
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
                Ok(line) => self.write_line(&line),
                Err(e) => tracing::error!(error = %e, "serialising an audit count"),
            }
        }
    }
}

impl AuditSink for JsonLinesSink {
    fn record(&self, ev: &AuditEvent) {
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
            Ok(line) => self.write_line(&line),
            Err(e) => tracing::error!(error = %e, "serialising an audit event"),
        }
    }
}
