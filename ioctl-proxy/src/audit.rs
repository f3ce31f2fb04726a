//! Audit events and counts.
//!
//! Every call that is denied, would be denied (audit mode), or fails (an errno, or an NV status
//! other than `NV_OK`) becomes one [`AuditEvent`] handed to the instance's [`AuditSink`]; the
//! daemon writes each as one JSON line (`serde_json::to_string`). Allowed calls are only counted,
//! per entry and decision, in [`AuditCounts`], which the daemon can dump at any time; the counts
//! are what `nvproxy policy suggest --from-audit` needs.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which table an entry comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A frontend escape (`NV_ESC_*`).
    Escape,
    /// An RM control (`NV_ESC_RM_CONTROL`).
    Control,
    /// An RM allocation class (`NV_ESC_RM_ALLOC`).
    Class,
    /// A UVM ioctl.
    Uvm,
}

/// What the proxy decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    /// Allowed and forwarded (or answered) successfully.
    Allowed,
    /// Refused: by policy, or because the table does not know the entry, or isolation.
    Denied,
    /// Audit mode: enforce mode would have denied it; it was let through.
    AuditWouldDeny,
    /// Allowed, but the call failed (errno, or an NV status other than `NV_OK`).
    Failed,
}

/// One audited call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEvent {
    /// The instance.
    pub instance: String,
    /// The calling process (thread group) as the daemon sees it.
    pub pid: u32,
    /// The calling thread.
    pub tid: u32,
    /// The node, as the tenant sees it: `ctl` or `gpu<N>`.
    pub node: String,
    /// Which table the entry is from.
    pub kind: Kind,
    /// The entry's driver name, or its number in hex when the table does not know it.
    pub name: String,
    /// The escape number, control command, or class.
    pub number: u32,
    /// The decision.
    pub decision: Decision,
    /// Why, in a few words, when the proxy refused or failed the call itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// The NV status the client saw, when the call has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nv_status: Option<u32>,
    /// The errno the client saw, when the ioctl failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
    /// Time spent in the proxy, microseconds.
    pub latency_us: u64,
}

impl AuditEvent {
    /// The latency as a `Duration`.
    pub fn latency(&self) -> Duration {
        Duration::from_micros(self.latency_us)
    }
}

/// Where audit events go. The daemon implements it (JSON lines to a file or the journal).
pub trait AuditSink: Send + Sync {
    /// Records one event. Called on the request path: must not block for long.
    fn record(&self, ev: &AuditEvent);
}

/// A sink that drops every event.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl AuditSink for NullSink {
    fn record(&self, _ev: &AuditEvent) {}
}

/// One row of [`AuditCounts::snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CountRow {
    /// Which table.
    pub kind: Kind,
    /// The entry name.
    pub name: String,
    /// The decision.
    pub decision: Decision,
    /// How many calls.
    pub count: u64,
}

/// Calls per entry and decision since the proxy started.
#[derive(Debug, Default)]
pub struct AuditCounts {
    /// Keyed by (kind, decision), then name, so that counting a call that was counted before
    /// looks the name up by reference and allocates nothing (this runs for every call).
    counts: Mutex<BTreeMap<(Kind, Decision), BTreeMap<String, u64>>>,
}

impl Kind {
    /// The name the audit trail uses (`escape`, `control`, `class`, `uvm`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Escape => "escape",
            Kind::Control => "control",
            Kind::Class => "class",
            Kind::Uvm => "uvm",
        }
    }
}

impl Decision {
    /// The name the audit trail uses (`allowed`, `denied`, `audit-would-deny`, `failed`).
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied => "denied",
            Decision::AuditWouldDeny => "audit-would-deny",
            Decision::Failed => "failed",
        }
    }
}

impl AuditCounts {
    /// Counts one call.
    pub fn add(&self, kind: Kind, name: &str, decision: Decision) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let names = c.entry((kind, decision)).or_default();
        match names.get_mut(name) {
            Some(n) => *n += 1,
            None => {
                names.insert(name.to_owned(), 1);
            }
        }
    }

    /// The count of one entry and decision.
    pub fn get(&self, kind: Kind, name: &str, decision: Decision) -> u64 {
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.get(&(kind, decision))
            .and_then(|names| names.get(name))
            .copied()
            .unwrap_or(0)
    }

    /// Every row, sorted by kind, name, decision.
    pub fn snapshot(&self) -> Vec<CountRow> {
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mut rows: Vec<CountRow> = c
            .iter()
            .flat_map(|(&(kind, decision), names)| {
                names.iter().map(move |(name, &count)| CountRow {
                    kind,
                    name: name.clone(),
                    decision,
                    count,
                })
            })
            .collect();
        rows.sort_by(|a, b| (a.kind, &a.name, a.decision).cmp(&(b.kind, &b.name, b.decision)));
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_event_serializes_as_one_json_line() {
        let ev = AuditEvent {
            instance: "job42".into(),
            pid: 7,
            tid: 8,
            node: "ctl".into(),
            kind: Kind::Control,
            name: "NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS".into(),
            number: 0x2080_3401,
            decision: Decision::AuditWouldDeny,
            reason: Some("policy"),
            nv_status: Some(0),
            errno: None,
            latency_us: 12,
        };
        let line = serde_json::to_string(&ev).unwrap();
        assert_eq!(
            line,
            r#"{"instance":"job42","pid":7,"tid":8,"node":"ctl","kind":"control","name":"NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS","number":545272833,"decision":"audit-would-deny","reason":"policy","nv_status":0,"latency_us":12}"#
        );
    }

    #[test]
    fn test_kind_and_decision_names_round_trip_through_json() {
        for k in [Kind::Escape, Kind::Control, Kind::Class, Kind::Uvm] {
            let j = serde_json::to_string(&k).unwrap();
            assert_eq!(j, format!("\"{}\"", k.as_str()));
            assert_eq!(serde_json::from_str::<Kind>(&j).unwrap(), k);
        }
        for d in [
            Decision::Allowed,
            Decision::Denied,
            Decision::AuditWouldDeny,
            Decision::Failed,
        ] {
            let j = serde_json::to_string(&d).unwrap();
            assert_eq!(j, format!("\"{}\"", d.as_str()));
            assert_eq!(serde_json::from_str::<Decision>(&j).unwrap(), d);
        }
    }

    #[test]
    fn test_counts_aggregate_per_entry_and_decision() {
        let c = AuditCounts::default();
        c.add(Kind::Escape, "NV_ESC_CARD_INFO", Decision::Allowed);
        c.add(Kind::Escape, "NV_ESC_CARD_INFO", Decision::Allowed);
        c.add(Kind::Escape, "NV_ESC_CARD_INFO", Decision::Failed);
        assert_eq!(
            c.get(Kind::Escape, "NV_ESC_CARD_INFO", Decision::Allowed),
            2
        );
        assert_eq!(c.snapshot().len(), 2);
        // Rows come sorted by kind, name, decision.
        let c = AuditCounts::default();
        c.add(Kind::Control, "B", Decision::Allowed);
        c.add(Kind::Control, "A", Decision::Failed);
        c.add(Kind::Escape, "Z", Decision::Denied);
        c.add(Kind::Control, "A", Decision::Allowed);
        let rows: Vec<_> = c
            .snapshot()
            .into_iter()
            .map(|r| (r.kind, r.name, r.decision))
            .collect();
        assert_eq!(
            rows,
            [
                (Kind::Escape, "Z".to_owned(), Decision::Denied),
                (Kind::Control, "A".to_owned(), Decision::Allowed),
                (Kind::Control, "A".to_owned(), Decision::Failed),
                (Kind::Control, "B".to_owned(), Decision::Allowed),
            ]
        );
    }
}
