//! Reading audit logs back: `nvproxy audit summary FILE`, and the reader that
//! `nvproxy policy suggest --from-audit` builds on.
//!
//! An audit log (`audit_log.rs`) holds two kinds of JSON lines: `"type":"event"` for each
//! denied, would-be-denied or failed call, written as it happens, and `"type":"count"` for each
//! (entry, decision) of an instance, written when the instance stops; the counts cover every
//! call, the events' included. So for each instance a block of count lines replaces the events
//! of that instance seen since its previous block (one run), and events after an instance's last
//! block (a run that did not stop cleanly, or is still running) are counted one by one. A file
//! may hold several instances and several runs (the sink appends).
//!
//! Lines that are not JSON, or lack the fields, are skipped and counted (a warning names the
//! first few); a file without a single event or count line is an error.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use ioctl_proxy::audit::{Decision, Kind};
use serde::Deserialize;

/// `nvproxy audit ...`.
#[derive(Debug, clap::Subcommand)]
pub enum AuditCommand {
    /// A table of the entries an audit log records: name, kind, count, decision; totals.
    Summary {
        /// The audit log (JSON lines, as written by exec --audit-log or serve).
        path: PathBuf,
    },
}

/// Runs an `audit` subcommand.
pub fn run(cmd: &AuditCommand) -> Result<()> {
    match cmd {
        AuditCommand::Summary { path } => {
            let log = AuditLog::load(path)?;
            log.warn(path);
            print!("{}", log.summary(path));
            Ok(())
        }
    }
}

/// One entry and decision, as the audit trail names them.
pub type Key = (Kind, String, Decision);

/// What an audit log records, aggregated.
#[derive(Debug, Default)]
pub struct AuditLog {
    /// Calls per entry and decision, over every instance and run in the file.
    pub counts: BTreeMap<Key, u64>,
    /// The instances named.
    pub instances: BTreeSet<String>,
    /// Event lines read.
    pub event_lines: u64,
    /// Count lines read.
    pub count_lines: u64,
    /// Instances whose last events came after their last count lines: counted from the
    /// events alone (their allowed calls were never written).
    pub unterminated: BTreeSet<String>,
    /// Line numbers (1-based) of lines that could not be read, in order.
    pub malformed: Vec<usize>,
    /// Valid JSON lines of another `type` (skipped).
    pub other: u64,
    /// Events the rate limit (or a full writer queue) left out, from `suppressed` lines.
    pub suppressed: u64,
}

#[derive(Deserialize)]
struct Line {
    r#type: Option<String>,
}

#[derive(Deserialize)]
struct EventLine {
    instance: String,
    kind: Kind,
    name: String,
    decision: Decision,
}

#[derive(Deserialize)]
struct CountLine {
    instance: String,
    kind: Kind,
    name: String,
    decision: Decision,
    count: u64,
}

impl AuditLog {
    /// Reads an audit log file.
    pub fn load(path: &Path) -> Result<AuditLog> {
        let bytes =
            std::fs::read(path).with_context(|| format!("reading audit log {}", path.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        AuditLog::parse(&text).with_context(|| format!("audit log {}", path.display()))
    }

    /// Parses audit log text; errors only when no event or count line is found.
    pub fn parse(text: &str) -> Result<AuditLog> {
        let mut log = AuditLog::default();
        // Per instance: the events since its last block of count lines.
        let mut pending: BTreeMap<String, BTreeMap<Key, u64>> = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
                log.malformed.push(i + 1);
                continue;
            };
            let ty = Line::deserialize(&value).ok().and_then(|l| l.r#type);
            match ty.as_deref() {
                Some("event") => match EventLine::deserialize(&value) {
                    Ok(e) => {
                        log.event_lines += 1;
                        log.instances.insert(e.instance.clone());
                        *pending
                            .entry(e.instance)
                            .or_default()
                            .entry((e.kind, e.name, e.decision))
                            .or_insert(0) += 1;
                    }
                    Err(_) => log.malformed.push(i + 1),
                },
                Some("count") => match CountLine::deserialize(&value) {
                    Ok(c) => {
                        log.count_lines += 1;
                        log.instances.insert(c.instance.clone());
                        // The counts include this run's events: drop them.
                        pending.remove(&c.instance);
                        *log.counts.entry((c.kind, c.name, c.decision)).or_insert(0) += c.count;
                    }
                    Err(_) => log.malformed.push(i + 1),
                },
                Some("suppressed") => match value["events"].as_u64() {
                    Some(n) => log.suppressed += n,
                    None => log.malformed.push(i + 1),
                },
                _ => log.other += 1,
            }
        }
        for (instance, events) in pending {
            if events.is_empty() {
                continue;
            }
            log.unterminated.insert(instance);
            for (key, n) in events {
                *log.counts.entry(key).or_insert(0) += n;
            }
        }
        if log.event_lines + log.count_lines == 0 {
            bail!(
                "no audit lines in it (no JSON line with \"type\": \"event\" or \"count\"{})",
                if log.malformed.is_empty() {
                    String::new()
                } else {
                    format!("; {} malformed line(s) skipped", log.malformed.len())
                }
            );
        }
        Ok(log)
    }

    /// Prints the warnings a reader of `path` should see (malformed lines, runs without counts).
    pub fn warn(&self, path: &Path) {
        for w in self.warnings(path) {
            eprintln!("nvproxy: warning: {w}");
        }
    }

    /// The warnings, one per line.
    pub fn warnings(&self, path: &Path) -> Vec<String> {
        let mut out = Vec::new();
        if !self.malformed.is_empty() {
            let first: Vec<String> = self
                .malformed
                .iter()
                .take(5)
                .map(ToString::to_string)
                .collect();
            out.push(format!(
                "{}: skipped {} malformed line(s) (line {}{})",
                path.display(),
                self.malformed.len(),
                first.join(", "),
                if self.malformed.len() > 5 {
                    ", ..."
                } else {
                    ""
                }
            ));
        }
        if self.other > 0 {
            out.push(format!(
                "{}: skipped {} JSON line(s) that are neither events nor counts",
                path.display(),
                self.other
            ));
        }
        if self.suppressed > 0 {
            out.push(format!(
                "{}: {} audit event(s) were suppressed by the rate limit; the count lines \
                 include their calls, runs without count lines miss them",
                path.display(),
                self.suppressed
            ));
        }
        for i in &self.unterminated {
            out.push(format!(
                "{}: instance {i} has events after its last count lines (the run did not stop \
                 cleanly, or is still running): its denied, would-be-denied and failed calls \
                 are counted, its allowed calls are missing",
                path.display()
            ));
        }
        out
    }

    /// Every entry with its calls per decision, by kind then name.
    pub fn entries(&self) -> BTreeMap<(Kind, &str), BTreeMap<Decision, u64>> {
        let mut out: BTreeMap<(Kind, &str), BTreeMap<Decision, u64>> = BTreeMap::new();
        for ((kind, name, decision), &n) in &self.counts {
            *out.entry((*kind, name.as_str()))
                .or_default()
                .entry(*decision)
                .or_insert(0) += n;
        }
        out
    }

    /// The `audit summary` table.
    pub fn summary(&self, path: &Path) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "audit log {}: {} instance(s) ({}), {} count line(s), {} event line(s){}",
            path.display(),
            self.instances.len(),
            self.instances
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", "),
            self.count_lines,
            self.event_lines,
            if self.malformed.is_empty() {
                String::new()
            } else {
                format!(", {} malformed line(s) skipped", self.malformed.len())
            }
        );
        let name_w = self
            .counts
            .keys()
            .map(|(_, n, _)| n.len())
            .max()
            .unwrap_or(0)
            .max("NAME".len());
        let count_w = self
            .counts
            .values()
            .map(|c| c.to_string().len())
            .max()
            .unwrap_or(0)
            .max("COUNT".len());
        let _ = writeln!(
            out,
            "{:name_w$}  {:7}  {:>count_w$}  DECISION",
            "NAME", "KIND", "COUNT"
        );
        let mut per_decision: BTreeMap<Decision, u64> = BTreeMap::new();
        let mut per_kind: BTreeMap<Kind, (BTreeSet<&str>, u64)> = BTreeMap::new();
        for ((kind, name, decision), &n) in &self.counts {
            let _ = writeln!(
                out,
                "{name:name_w$}  {:7}  {n:>count_w$}  {}",
                kind.as_str(),
                decision.as_str()
            );
            *per_decision.entry(*decision).or_insert(0) += n;
            let k = per_kind.entry(*kind).or_default();
            k.0.insert(name);
            k.1 += n;
        }
        let total: u64 = per_decision.values().sum();
        let entries: usize = per_kind.values().map(|(names, _)| names.len()).sum();
        let _ = writeln!(
            out,
            "total: {entries} entries, {total} calls ({})",
            [
                Decision::Allowed,
                Decision::Failed,
                Decision::AuditWouldDeny,
                Decision::Denied
            ]
            .iter()
            .map(|d| format!(
                "{} {}",
                d.as_str(),
                per_decision.get(d).copied().unwrap_or(0)
            ))
            .collect::<Vec<_>>()
            .join(", ")
        );
        let _ = writeln!(
            out,
            "by kind: {}",
            per_kind
                .iter()
                .map(|(k, (names, n))| format!("{} {} entries {n} calls", k.as_str(), names.len()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(instance: &str, kind: &str, name: &str, decision: &str, n: u64) -> String {
        format!(
            r#"{{"type":"count","instance":"{instance}","kind":"{kind}","name":"{name}","decision":"{decision}","count":{n}}}"#
        )
    }

    fn event(instance: &str, kind: &str, name: &str, decision: &str) -> String {
        format!(
            r#"{{"type":"event","instance":"{instance}","pid":7,"tid":8,"node":"ctl","kind":"{kind}","name":"{name}","number":42,"decision":"{decision}","reason":"policy","nv_status":86,"latency_us":3}}"#
        )
    }

    fn get(log: &AuditLog, kind: Kind, name: &str, d: Decision) -> u64 {
        log.counts
            .get(&(kind, name.to_owned(), d))
            .copied()
            .unwrap_or(0)
    }

    #[test]
    fn test_count_lines_replace_the_events_of_their_run() {
        let text = [
            event("a", "control", "X", "audit-would-deny"),
            event("a", "control", "X", "audit-would-deny"),
            count("a", "control", "X", "audit-would-deny", 2),
            count("a", "escape", "NV_ESC_CARD_INFO", "allowed", 3),
        ]
        .join("\n");
        let log = AuditLog::parse(&text).unwrap();
        assert_eq!(get(&log, Kind::Control, "X", Decision::AuditWouldDeny), 2);
        assert_eq!(
            get(&log, Kind::Escape, "NV_ESC_CARD_INFO", Decision::Allowed),
            3
        );
        assert!(log.unterminated.is_empty());
        assert_eq!((log.event_lines, log.count_lines), (2, 2));
    }

    #[test]
    fn test_events_without_counts_are_counted_and_reported() {
        let text = [
            count("a", "escape", "NV_ESC_CARD_INFO", "allowed", 1),
            // A second run of `a` that never stopped, and another instance.
            event("a", "control", "X", "denied"),
            event("b", "class", "Y", "failed"),
            event("b", "class", "Y", "failed"),
        ]
        .join("\n");
        let log = AuditLog::parse(&text).unwrap();
        assert_eq!(get(&log, Kind::Control, "X", Decision::Denied), 1);
        assert_eq!(get(&log, Kind::Class, "Y", Decision::Failed), 2);
        assert_eq!(log.unterminated.iter().collect::<Vec<_>>(), vec!["a", "b"]);
        assert!(
            log.warnings(Path::new("f"))
                .iter()
                .any(|w| w.contains("instance a has events after"))
        );
    }

    #[test]
    fn test_runs_and_instances_add_up() {
        let text = [
            count("a", "uvm", "UVM_INITIALIZE", "allowed", 1),
            event("a", "uvm", "UVM_FREE", "failed"),
            count("a", "uvm", "UVM_INITIALIZE", "allowed", 2),
            count("a", "uvm", "UVM_FREE", "failed", 1),
            count("b", "uvm", "UVM_INITIALIZE", "allowed", 4),
        ]
        .join("\n");
        let log = AuditLog::parse(&text).unwrap();
        assert_eq!(get(&log, Kind::Uvm, "UVM_INITIALIZE", Decision::Allowed), 7);
        assert_eq!(get(&log, Kind::Uvm, "UVM_FREE", Decision::Failed), 1);
        assert_eq!(log.instances.len(), 2);
    }

    #[test]
    fn test_malformed_lines_are_skipped_and_counted() {
        let text = [
            "not json".to_owned(),
            r#"{"type":"count","instance":"a"}"#.to_owned(),
            r#"{"type":"event","kind":"bogus"}"#.to_owned(),
            r#"{"type":"hello"}"#.to_owned(),
            "[1,2]".to_owned(),
            String::new(),
            count("a", "escape", "NV_ESC_CARD_INFO", "allowed", 1),
            r#"{"type":"count","instance":"a","kind":"escape","name":"N","decision":"allowed","count":-1}"#.to_owned(),
            "\u{0}\u{ffff}".to_owned(),
        ]
        .join("\n");
        let log = AuditLog::parse(&text).unwrap();
        assert_eq!(log.malformed, vec![1, 2, 3, 8, 9]);
        assert_eq!(log.other, 2);
        assert_eq!(log.counts.len(), 1);
        let w = log.warnings(Path::new("f")).join("\n");
        assert!(
            w.contains("skipped 5 malformed line(s) (line 1, 2, 3, 8, 9)"),
            "{w}"
        );
    }

    #[test]
    fn test_no_audit_lines_is_an_error() {
        for text in ["", "\n\n", "garbage\n{}\n", r#"{"type":"other"}"#] {
            let err = AuditLog::parse(text).unwrap_err();
            assert!(format!("{err:#}").contains("no audit lines"), "{err:#}");
        }
    }

    #[test]
    fn test_summary_table_has_rows_and_totals() {
        let text = [
            count("a", "escape", "NV_ESC_CARD_INFO", "allowed", 2),
            count(
                "a",
                "control",
                "NV2080_CTRL_CMD_GPU_GET_NAME_STRING",
                "denied",
                1,
            ),
            count("a", "uvm", "UVM_INITIALIZE", "failed", 1),
        ]
        .join("\n");
        let log = AuditLog::parse(&text).unwrap();
        let s = log.summary(Path::new("run.jsonl"));
        let lines: Vec<&str> = s.lines().collect();
        assert!(
            lines[0].starts_with("audit log run.jsonl: 1 instance(s) (a)"),
            "{s}"
        );
        assert!(lines[1].starts_with("NAME "), "{s}");
        assert!(lines[1].ends_with("KIND     COUNT  DECISION"), "{s}");
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["NV_ESC_CARD_INFO", "escape", "2", "allowed"]
        );
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            [
                "NV2080_CTRL_CMD_GPU_GET_NAME_STRING",
                "control",
                "1",
                "denied"
            ]
        );
        assert!(
            s.contains(
                "total: 3 entries, 4 calls (allowed 2, failed 1, audit-would-deny 0, denied 1)"
            ),
            "{s}"
        );
    }
}
