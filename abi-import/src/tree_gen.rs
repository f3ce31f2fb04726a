//! `tree` and `delta`: the version tree from the facts.
//!
//! `delta OLD.json NEW.json` prints the builder lines that turn the tables implied by one extract
//! into those implied by another (the tool that finds each node's own deltas). `tree INDEX.tsv`
//! writes `nvproxy-abi/src/tree/generated.rs`: one builder per node of the index (its parent's
//! builder plus the delta between their facts), or the parent's builder where the tables are the
//! same, and the `NODES` array.
//!
//! The tables a version's facts imply: every entry a *template* names that the facts have, with
//! the facts' number, params and size, and the template's translation kind and caps (policy, not
//! facts). Templates are the entries of every node of the tree (the newest node wins), overridden
//! by those of the version's *anchor*: the node itself once it exists, else the node whose facts
//! file it shares, else the nearest node of its branch. So regenerating an existing tree
//! reproduces its tables exactly (the parity test holds each node's entries equal to its facts),
//! and a new node inherits the policy of the nodes around it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use nvproxy_abi::{AbiNode, DriverVersion, nodes};
use serde_json::Value;

use crate::suggest::{Entry, Kind, delta_lines, entries, implied, struct_notes};

/// One row of `facts/index.tsv`.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub(crate) version: DriverVersion,
    pub(crate) parent: Option<DriverVersion>,
    /// The facts file (`facts/<this>.json`) holding this version's extract, shared by every
    /// version with the same ABI.
    pub(crate) facts: String,
    pub(crate) commit: Option<String>,
    pub(crate) sha256: Option<String>,
    /// `None`: supported; `Some(reason)`: unqualified.
    pub(crate) unqualified: Option<String>,
    pub(crate) note: String,
}

fn dash(s: &str) -> Option<String> {
    (s != "-" && !s.is_empty()).then(|| s.to_owned())
}

fn parse_version(s: &str) -> Result<DriverVersion> {
    s.parse().map_err(|e| anyhow!("{s}: {e}"))
}

/// Parses the index (`# ` lines are comments): version, parent, facts, commit, sha256,
/// support (`supported` or `unqualified: REASON`), note; tab-separated, `-` for none.
pub(crate) fn read_index(path: &Path) -> Result<Vec<Row>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        let [version, parent, facts, commit, sha256, support, note] = cols.as_slice() else {
            bail!("{}:{}: want 7 tab-separated columns", path.display(), i + 1);
        };
        let unqualified = match *support {
            "supported" => None,
            s => Some(
                s.strip_prefix("unqualified: ")
                    .with_context(|| format!("{}:{}: support {s:?}", path.display(), i + 1))?
                    .to_owned(),
            ),
        };
        rows.push(Row {
            version: parse_version(version)?,
            parent: dash(parent).map(|p| parse_version(&p)).transpose()?,
            facts: (*facts).to_owned(),
            commit: dash(commit),
            sha256: dash(sha256),
            unqualified,
            note: (*note).to_owned(),
        });
    }
    Ok(rows)
}

pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// The node whose policy a version takes: itself, the node sharing its facts, or the nearest
/// node of its branch (not newer if there is one), else the nearest older node.
pub(crate) fn anchor(
    version: &DriverVersion,
    shares_facts_with: &[DriverVersion],
) -> &'static AbiNode {
    if let Ok(n) = nvproxy_abi::find(version) {
        return n;
    }
    if let Some(n) = shares_facts_with
        .iter()
        .find_map(|v| nvproxy_abi::find(v).ok())
    {
        return n;
    }
    let same_branch = |n: &&AbiNode| n.version.major() == version.major();
    let older = |n: &&AbiNode| n.version <= *version;
    let all = nodes().iter();
    all.clone()
        .filter(same_branch)
        .filter(older)
        .max_by_key(|n| n.version)
        .or_else(|| all.clone().filter(same_branch).min_by_key(|n| n.version))
        .or_else(|| all.clone().filter(older).max_by_key(|n| n.version))
        .or_else(|| all.clone().min_by_key(|n| n.version))
        .expect("the tree has nodes")
}

/// Every node's entries by name (the newest node wins), built once.
fn all_templates() -> &'static BTreeMap<Kind, BTreeMap<String, Entry>> {
    static ALL: std::sync::OnceLock<BTreeMap<Kind, BTreeMap<String, Entry>>> =
        std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        let mut all: Vec<&AbiNode> = nodes().iter().filter(|n| !n.same_as_parent).collect();
        all.sort_by_key(|n| n.version);
        let tables: Vec<_> = all.iter().map(|n| n.tables()).collect();
        let mut out = BTreeMap::new();
        for kind in Kind::ALL {
            let mut m = BTreeMap::new();
            for t in &tables {
                for e in entries(t, kind) {
                    m.insert(e.name.clone(), e);
                }
            }
            out.insert(kind, m);
        }
        out
    })
}

/// Templates for one anchor: every node's entries (newest wins), then the anchor's.
fn templates(anchor: &AbiNode, kind: Kind) -> BTreeMap<String, Entry> {
    let mut out = all_templates()[&kind].clone();
    for e in entries(&anchor.tables(), kind) {
        out.insert(e.name.clone(), e);
    }
    out
}

/// The four tables a version's extract implies, by kind, with the anchor's policy.
pub(crate) type Implied = BTreeMap<Kind, Vec<Entry>>;

pub(crate) fn implied_tables(extract: &Value, anchor: &AbiNode) -> Result<Implied> {
    let mut out = BTreeMap::new();
    for kind in Kind::ALL {
        let mut seen = BTreeMap::new();
        let mut v = Vec::new();
        for t in templates(anchor, kind).values() {
            let Some(mut e) = implied(extract, kind, t) else {
                continue;
            };
            if kind == Kind::Control && uncopied_pointer(extract, &e.name) {
                e.caps = nvproxy_abi::Caps::NONE;
            }
            if let Some(other) = seen.insert(e.key, e.name.clone()) {
                bail!(
                    "{} {:#x} is both {other} and {} in {}: pick one in the tree first",
                    kind.word(),
                    e.key,
                    e.name,
                    extract["driver_version"]
                );
            }
            v.push(e);
        }
        v.sort_by_key(|e| e.key);
        out.insert(kind, v);
    }
    Ok(out)
}

/// Whether RM deep-copies fewer of the control's pointers than its params have: it then uses
/// the others as they are, a user address in kernel mode (`GET_P2P_CAPS`' `busEgmPeerIds` from
/// 550.40.07 to 550.78: `CliGetSystemP2pCaps` stores through it, client_resource.c). No
/// translation makes that safe, so such a control is admin-only (`Caps::NONE`) in that node;
/// `tests/pointers.rs` checks the rule.
fn uncopied_pointer(extract: &Value, control: &str) -> bool {
    let copy = &extract["embedded_pointer_controls"][control];
    let Some(params) = copy["params"].as_str() else {
        return false;
    };
    let copied = copy["copies"].as_array().map_or(0, Vec::len);
    let address = |m: &str| {
        nvproxy_abi::embedded::ADDRESS_MEMBERS
            .iter()
            .any(|(s, f, _)| *s == params && *f == m)
    };
    let pointers = extract["unsafe_fields"][params]["pointers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| !p[0].as_str().is_some_and(address))
        .count();
    copied < pointers
}

/// The delta lines from `old` to `new`, all four tables.
pub(crate) fn delta(old: &Implied, new: &Implied) -> Vec<String> {
    let mut lines = Vec::new();
    for kind in Kind::ALL {
        let empty = Vec::new();
        let (o, n) = (
            old.get(&kind).unwrap_or(&empty),
            new.get(&kind).unwrap_or(&empty),
        );
        lines.extend(delta_lines(kind, o, n));
    }
    lines
}

fn version_of(extract: &Value) -> Result<DriverVersion> {
    parse_version(
        extract["driver_version"]
            .as_str()
            .context("extract has no driver_version")?,
    )
}

/// `abi-import delta OLD NEW`: the builder lines and struct-layout notes between two extracts.
pub fn run_delta(old_path: &Path, new_path: &Path) -> Result<String> {
    let (old, new) = (read_json(old_path)?, read_json(new_path)?);
    let (vo, vn) = (version_of(&old)?, version_of(&new)?);
    let old_t = implied_tables(&old, anchor(&vo, &[]))?;
    let new_t = implied_tables(&new, anchor(&vn, &[]))?;
    let mut out = format!("// {vo} -> {vn}: delta of the tables the facts imply\n");
    let lines = delta(&old_t, &new_t);
    let notes = struct_notes(&old, &new);
    for l in &lines {
        let _ = writeln!(out, "abi.{}", l.trim_start_matches("abi."));
    }
    for n in &notes {
        let _ = writeln!(out, "{n}");
    }
    if lines.is_empty() && notes.is_empty() {
        let _ = writeln!(out, "// no table or modelled-struct change");
    }
    Ok(out)
}

fn fn_name(v: &DriverVersion) -> String {
    format!("v{}", v.to_string().replace('.', "_"))
}

fn version_expr(v: &DriverVersion) -> String {
    let patch = v
        .patch()
        .map_or_else(|| "None".to_owned(), |p| format!("Some({p})"));
    format!("v({}, {}, {patch})", v.major(), v.minor())
}

fn lit(s: &str) -> String {
    format!("{s:?}")
}

/// `abi-import tree INDEX --out FILE`: writes the generated tree module.
pub fn run_tree(index: &Path, out: &Path) -> Result<usize> {
    let rows = read_index(index)?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut extracts: BTreeMap<String, Value> = BTreeMap::new();
    for r in &rows {
        if !extracts.contains_key(&r.facts) {
            let p: PathBuf = dir.join(format!("{}.json", r.facts));
            extracts.insert(r.facts.clone(), read_json(&p)?);
        }
    }
    let mut seen = BTreeSet::new();
    let mut tables: BTreeMap<DriverVersion, Implied> = BTreeMap::new();
    let mut build_of: BTreeMap<DriverVersion, String> = BTreeMap::new();
    let mut code = String::new();
    let mut node_lines = String::new();
    for r in &rows {
        if !seen.insert(r.version) {
            bail!("{} is in the index twice", r.version);
        }
        let sharing: Vec<DriverVersion> = rows
            .iter()
            .filter(|o| o.facts == r.facts)
            .map(|o| o.version)
            .collect();
        let a = anchor(&r.version, &sharing);
        let t = implied_tables(&extracts[&r.facts], a)?;
        let (build, same) = match r.parent {
            None => {
                // The root starts from the table generated once from 535.216.03's facts.
                let base = nvproxy_abi::tree::base_table();
                let mut base_t = BTreeMap::new();
                for kind in Kind::ALL {
                    base_t.insert(kind, entries(&base, kind));
                }
                let lines = delta(&base_t, &t);
                let name = fn_name(&r.version);
                let _ = writeln!(
                    code,
                    "\n/// {} (root): the table of `base.rs`, then what {} differs in.",
                    r.version, r.version
                );
                let _ = writeln!(code, "pub(super) fn {name}() -> DriverAbi {{");
                let _ = writeln!(code, "    let mut abi = base::table_535_216_03();");
                for l in lines {
                    let _ = writeln!(code, "    {l}");
                }
                let _ = writeln!(code, "    abi\n}}");
                (name, false)
            }
            Some(p) => {
                let pt = tables.get(&p).with_context(|| {
                    format!("{}: parent {p} is not listed before it", r.version)
                })?;
                let lines = delta(pt, &t);
                if lines.is_empty() {
                    (build_of[&p].clone(), true)
                } else {
                    let name = fn_name(&r.version);
                    let _ = writeln!(code, "\n/// {} (parent {p}).", r.version);
                    let _ = writeln!(code, "pub(super) fn {name}() -> DriverAbi {{");
                    let _ = writeln!(code, "    let mut abi = {}();", build_of[&p]);
                    for l in lines {
                        let _ = writeln!(code, "    {l}");
                    }
                    let _ = writeln!(code, "    abi\n}}");
                    (name, false)
                }
            }
        };
        let parent = r.parent.map_or_else(
            || "None".to_owned(),
            |p| format!("Some({})", version_expr(&p)),
        );
        let (support, reason) = match &r.unqualified {
            None => ("Supported", "None".to_owned()),
            Some(why) => ("Unqualified", format!("Some({})", lit(why))),
        };
        let opt = |o: &Option<String>| {
            o.as_ref()
                .map_or_else(|| "None".to_owned(), |s| format!("Some({})", lit(s)))
        };
        let _ = writeln!(
            node_lines,
            "    AbiNode {{ version: {}, parent: {parent}, support: Support::{support}, reason: {reason}, \
             installer_sha256: {}, note: {}, facts: {}, commit: {}, same_as_parent: {same}, build: {build} }},",
            version_expr(&r.version),
            opt(&r.sha256),
            lit(&r.note),
            lit(&r.facts),
            opt(&r.commit),
        );
        tables.insert(r.version, t);
        build_of.insert(r.version, build);
    }
    let mut text = String::new();
    let _ = writeln!(
        text,
        "//! Generated by `abi-import tree nvproxy-abi/facts/index.tsv --out \
         nvproxy-abi/src/tree/generated.rs`: do not edit; edit the index (or the policy of a node) \
         and regenerate.\n//!\n//! One builder per node whose tables differ from its parent's: \
         the parent's builder, then the delta\n//! between the two versions' facts (`abi-import \
         delta`). A `// A -> B` comment on a resize gives the\n//! old and new size in bytes."
    );
    text.push_str(
        "\n#![allow(unused_imports)]\n\nuse super::base;\nuse super::caps_consts::*;\n\
         use super::node::{AbiNode, Support, v};\n\
         use crate::Translation::{Fd, Pointer, Simple, Special};\nuse crate::table::{DriverAbi, ParamSize};\n",
    );
    text.push_str(&code);
    let _ = writeln!(
        text,
        "\n/// Every node, parents before children (the order of the index).\npub(super) static NODES: [AbiNode; {}] = [",
        rows.len()
    );
    text.push_str(&node_lines);
    text.push_str("];\n");
    fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    Ok(rows.len())
}
