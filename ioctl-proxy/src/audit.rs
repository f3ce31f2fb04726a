//! Audit events and counts.
//!
//! Every call that is denied, would be denied (audit mode), or fails (an errno, or an NV status
//! other than `NV_OK`) becomes one [`AuditEvent`] handed to the instance's [`AuditSink`]; the
//! daemon writes each as one JSON line (`serde_json::to_string`). Allowed calls are only counted,
//! per entry and decision, in [`AuditCounts`], which the daemon can dump at any time; the counts
//! are what `nvproxy policy suggest --from-audit` needs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::hash::WordHash;

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountRow {
    /// Which table.
    pub kind: Kind,
    /// The entry name ([`Kind::other_row`] for the row entries the table does not know fold
    /// into).
    pub name: String,
    /// The decision.
    pub decision: Decision,
    /// How many calls.
    pub count: u64,
    /// Of the fold-over row: the first distinct numbers counted in it (at most
    /// [`AuditCounts::FIRST_NUMBERS`]), so that an admin sees what was tried.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub numbers: Vec<u32>,
}

/// The fold-over row of one (kind, decision).
#[derive(Debug, Default)]
struct Other {
    count: u64,
    numbers: Vec<u32>,
}

#[derive(Debug, Default)]
struct Rows {
    named: BTreeMap<String, u64>,
    other: Option<Other>,
}

/// Calls per entry and decision since the proxy started.
///
/// Bounded whatever a tenant sends: the numbers of entries the table does not know (2^32 per
/// kind, chosen by the tenant) all fold into one row per kind and decision,
/// [`Kind::other_row`], which keeps the first [`AuditCounts::FIRST_NUMBERS`] distinct numbers;
/// names built from a tenant's number (a pass-through command's `RM_GSS_LEGACY 0x...`) get
/// their own row only while the kind has fewer than [`AuditCounts::MAX_NAMES`] rows, and fold
/// into the same row after that. Table names are far fewer than the bound.
#[derive(Debug, Default)]
pub struct AuditCounts {
    /// The table's entries (built once, read-only): (kind, name) → slot in `fixed`, so that
    /// counting a known entry, every call's case, takes no lock: concurrent requests of an
    /// instance do not serialise on their accounting.
    index: HashMap<(Kind, &'static str), usize>,
    /// The same entries by the address of their name: the request path names a known entry
    /// with the table's own `&'static str`, so a lookup hashes one word instead of the name.
    by_addr: HashMap<(Kind, usize), (usize, usize), WordHash>,
    /// Per slot, one counter per decision.
    fixed: Vec<[AtomicU64; 4]>,
    /// The rest: names built from tenant numbers and the fold-over rows, keyed by
    /// (kind, decision), then name.
    counts: Mutex<BTreeMap<(Kind, Decision), Rows>>,
}

impl Kind {
    /// The name of the count row that entries the table does not know fold into:
    /// `"control (not in the table)"`.
    pub fn other_row(self) -> &'static str {
        match self {
            Kind::Escape => "escape (not in the table)",
            Kind::Control => "control (not in the table)",
            Kind::Class => "class (not in the table)",
            Kind::Uvm => "uvm (not in the table)",
        }
    }

    /// The name an entry has in audit events when the table does not know it:
    /// `control 0x2080dead`.
    pub fn unknown_name(self, number: u32) -> String {
        match self {
            Kind::Escape => format!("NV_ESC_{number:#04x}"),
            Kind::Control => format!("control {number:#010x}"),
            Kind::Class => format!("class {number:#06x}"),
            Kind::Uvm => format!("UVM {number:#x}"),
        }
    }

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

impl Decision {
    fn slot(self) -> usize {
        match self {
            Decision::Allowed => 0,
            Decision::Denied => 1,
            Decision::AuditWouldDeny => 2,
            Decision::Failed => 3,
        }
    }

    const ALL: [Decision; 4] = [
        Decision::Allowed,
        Decision::Denied,
        Decision::AuditWouldDeny,
        Decision::Failed,
    ];
}

impl AuditCounts {
    /// Counts whose known entries (`names`: the ABI table's, for its lifetime) are counted
    /// without a lock.
    pub fn for_names(names: impl IntoIterator<Item = (Kind, &'static str)>) -> Self {
        let mut index = HashMap::new();
        let mut by_addr = HashMap::default();
        for key in names {
            let n = index.len();
            let slot = *index.entry(key).or_insert(n);
            by_addr
                .entry((key.0, key.1.as_ptr().addr()))
                .or_insert((slot, key.1.len()));
        }
        let fixed = (0..index.len()).map(|_| Default::default()).collect();
        Self {
            index,
            by_addr,
            fixed,
            counts: Mutex::default(),
        }
    }

    /// The slot of a table entry: by its name's address (the request path's case), else by
    /// the name.
    fn slot(&self, kind: Kind, name: &str) -> Option<usize> {
        match self.by_addr.get(&(kind, name.as_ptr().addr())) {
            // The same address and length: the same `&'static str`.
            Some(&(i, len)) if len == name.len() => Some(i),
            _ => self.index.get(&(kind, name)).copied(),
        }
    }

    /// Named rows per (kind, decision) before further names fold into [`Kind::other_row`].
    pub const MAX_NAMES: usize = 1024;
    /// Distinct numbers the fold-over row keeps.
    pub const FIRST_NUMBERS: usize = 16;

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(Kind, Decision), Rows>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one call of the entry `name` (number `number`).
    pub fn add(&self, kind: Kind, name: &str, number: u32, decision: Decision) {
        if let Some(i) = self.slot(kind, name) {
            self.fixed[i][decision.slot()].fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut c = self.lock();
        let rows = c.entry((kind, decision)).or_default();
        if let Some(n) = rows.named.get_mut(name) {
            *n += 1;
        } else if rows.named.len() < Self::MAX_NAMES {
            rows.named.insert(name.to_owned(), 1);
        } else {
            rows.fold(number);
        }
    }

    /// Counts one call of an entry the table does not know: into [`Kind::other_row`].
    pub fn add_unknown(&self, kind: Kind, number: u32, decision: Decision) {
        self.lock()
            .entry((kind, decision))
            .or_default()
            .fold(number);
    }

    /// The count of one entry and decision (`Kind::other_row` for the fold-over row).
    pub fn get(&self, kind: Kind, name: &str, decision: Decision) -> u64 {
        if let Some(i) = self.slot(kind, name) {
            return self.fixed[i][decision.slot()].load(Ordering::Relaxed);
        }
        let c = self.lock();
        c.get(&(kind, decision)).map_or(0, |rows| {
            if name == kind.other_row() {
                rows.other.as_ref().map_or(0, |o| o.count)
            } else {
                rows.named.get(name).copied().unwrap_or(0)
            }
        })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        let fixed = self
            .fixed
            .iter()
            .map(|d| d.iter().filter(|c| c.load(Ordering::Relaxed) > 0).count())
            .sum::<usize>();
        fixed
            + self
                .lock()
                .values()
                .map(|r| r.named.len() + usize::from(r.other.is_some()))
                .sum::<usize>()
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every row, sorted by kind, name, decision.
    pub fn snapshot(&self) -> Vec<CountRow> {
        let mut rows: Vec<CountRow> = Vec::new();
        for (&(kind, name), &i) in &self.index {
            for d in Decision::ALL {
                let count = self.fixed[i][d.slot()].load(Ordering::Relaxed);
                if count > 0 {
                    rows.push(CountRow {
                        kind,
                        name: name.to_owned(),
                        decision: d,
                        count,
                        numbers: Vec::new(),
                    });
                }
            }
        }
        let c = self.lock();
        for (&(kind, decision), r) in c.iter() {
            rows.extend(r.named.iter().map(|(name, &count)| CountRow {
                kind,
                name: name.clone(),
                decision,
                count,
                numbers: Vec::new(),
            }));
            if let Some(o) = &r.other {
                rows.push(CountRow {
                    kind,
                    name: kind.other_row().to_owned(),
                    decision,
                    count: o.count,
                    numbers: o.numbers.clone(),
                });
            }
        }
        rows.sort_by(|a, b| (a.kind, &a.name, a.decision).cmp(&(b.kind, &b.name, b.decision)));
        rows
    }
}

impl AuditCounts {
    /// Adds the rows of another proxy's [`AuditCounts::snapshot`] (a live upgrade carries an
    /// instance's counts to its new worker). Bounded as counting is: unknown names past
    /// [`AuditCounts::MAX_NAMES`] fold, at most [`AuditCounts::FIRST_NUMBERS`] numbers are kept.
    pub fn add_rows(&self, rows: &[CountRow]) {
        for r in rows {
            if let Some(&i) = self.index.get(&(r.kind, r.name.as_str())) {
                self.fixed[i][r.decision.slot()].fetch_add(r.count, Ordering::Relaxed);
                continue;
            }
            let mut c = self.lock();
            let rows = c.entry((r.kind, r.decision)).or_default();
            if r.name == r.kind.other_row() {
                let o = rows.other.get_or_insert_with(Other::default);
                o.count += r.count;
                for &n in &r.numbers {
                    if o.numbers.len() < Self::FIRST_NUMBERS && !o.numbers.contains(&n) {
                        o.numbers.push(n);
                    }
                }
            } else if let Some(n) = rows.named.get_mut(&r.name) {
                *n += r.count;
            } else if rows.named.len() < Self::MAX_NAMES {
                rows.named.insert(r.name.clone(), r.count);
            } else {
                rows.other.get_or_insert_with(Other::default).count += r.count;
            }
        }
    }
}

impl Rows {
    fn fold(&mut self, number: u32) {
        let o = self.other.get_or_insert_with(Other::default);
        o.count += 1;
        if o.numbers.len() < AuditCounts::FIRST_NUMBERS && !o.numbers.contains(&number) {
            o.numbers.push(number);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_rows_added_to_fresh_counts_give_the_same_snapshot() {
        let names = [(Kind::Escape, "NV_ESC_CARD_INFO"), (Kind::Control, "A")];
        let a = AuditCounts::for_names(names);
        a.add(Kind::Escape, "NV_ESC_CARD_INFO", 0x21, Decision::Allowed);
        a.add(Kind::Escape, "NV_ESC_CARD_INFO", 0x21, Decision::Allowed);
        a.add(Kind::Control, "RM_GSS_LEGACY 0x7", 7, Decision::Denied);
        a.add_unknown(Kind::Control, 0x1234, Decision::Denied);
        a.add_unknown(Kind::Control, 0x1235, Decision::Denied);
        let rows = a.snapshot();
        let b = AuditCounts::for_names(names);
        b.add_rows(&rows);
        assert_eq!(b.snapshot(), rows);
        let text = serde_json::to_string(&rows).unwrap();
        assert_eq!(serde_json::from_str::<Vec<CountRow>>(&text).unwrap(), rows);
        b.add_rows(&rows);
        assert_eq!(
            b.get(Kind::Escape, "NV_ESC_CARD_INFO", Decision::Allowed),
            4
        );
        assert_eq!(
            b.get(Kind::Control, Kind::Control.other_row(), Decision::Denied),
            4
        );
    }

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
        c.add(Kind::Escape, "NV_ESC_CARD_INFO", 0xc8, Decision::Allowed);
        c.add(Kind::Escape, "NV_ESC_CARD_INFO", 0xc8, Decision::Allowed);
        c.add(Kind::Escape, "NV_ESC_CARD_INFO", 0xc8, Decision::Failed);
        assert_eq!(
            c.get(Kind::Escape, "NV_ESC_CARD_INFO", Decision::Allowed),
            2
        );
        assert_eq!(c.snapshot().len(), 2);
        // Rows come sorted by kind, name, decision.
        let c = AuditCounts::default();
        c.add(Kind::Control, "B", 2, Decision::Allowed);
        c.add(Kind::Control, "A", 1, Decision::Failed);
        c.add(Kind::Escape, "Z", 3, Decision::Denied);
        c.add(Kind::Control, "A", 1, Decision::Allowed);
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

    #[test]
    fn test_unknown_numbers_fold_into_one_row_per_kind_and_decision() {
        let c = AuditCounts::default();
        for n in 0..20_000u32 {
            c.add_unknown(Kind::Control, 0x1000_0000 + n, Decision::Denied);
            c.add_unknown(Kind::Class, n, Decision::Denied);
        }
        let rows = c.snapshot();
        assert_eq!(rows.len(), 2);
        let r = &rows[0];
        assert_eq!(
            (r.kind, r.name.as_str()),
            (Kind::Control, Kind::Control.other_row())
        );
        assert_eq!(r.count, 20_000);
        assert_eq!(r.numbers.len(), AuditCounts::FIRST_NUMBERS);
        assert_eq!(r.numbers[..2], [0x1000_0000, 0x1000_0001]);
        let line = serde_json::to_string(r).unwrap();
        assert!(
            line.contains(r#""name":"control (not in the table)""#),
            "{line}"
        );
        assert!(line.contains(r#""numbers":[268435456,"#), "{line}");
    }

    #[test]
    fn test_names_past_the_bound_fold_and_known_rows_keep_counting() {
        let c = AuditCounts::default();
        c.add(Kind::Control, "KNOWN", 1, Decision::Allowed);
        for n in 0..5_000u32 {
            c.add(
                Kind::Control,
                &format!("RM_GSS_LEGACY {n:#x}"),
                n,
                Decision::Allowed,
            );
        }
        c.add(Kind::Control, "KNOWN", 1, Decision::Allowed);
        assert_eq!(c.len(), AuditCounts::MAX_NAMES + 1);
        assert_eq!(c.get(Kind::Control, "KNOWN", Decision::Allowed), 2);
        assert_eq!(
            c.get(Kind::Control, Kind::Control.other_row(), Decision::Allowed),
            5_000 - (AuditCounts::MAX_NAMES as u64 - 1)
        );
    }

    #[test]
    fn test_known_names_count_without_the_lock_and_snapshot_merges_both() {
        let c = AuditCounts::for_names([(Kind::Control, "KNOWN"), (Kind::Escape, "E")]);
        c.add(Kind::Control, "KNOWN", 1, Decision::Allowed);
        c.add(Kind::Control, "KNOWN", 1, Decision::Allowed);
        c.add(Kind::Control, "KNOWN", 1, Decision::Failed);
        c.add(Kind::Control, "OTHER", 2, Decision::Allowed);
        c.add_unknown(Kind::Control, 3, Decision::Denied);
        assert_eq!(c.get(Kind::Control, "KNOWN", Decision::Allowed), 2);
        assert_eq!(c.len(), 4);
        let rows: Vec<_> = c
            .snapshot()
            .into_iter()
            .map(|r| (r.name, r.decision, r.count))
            .collect();
        assert_eq!(
            rows,
            [
                ("KNOWN".to_owned(), Decision::Allowed, 2),
                ("KNOWN".to_owned(), Decision::Failed, 1),
                ("OTHER".to_owned(), Decision::Allowed, 1),
                (Kind::Control.other_row().to_owned(), Decision::Denied, 1),
            ]
        );
    }
}
