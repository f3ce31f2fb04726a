//! Self-service on a host whose driver version has no node: `nvproxy abi check --from-source`,
//! `nvproxy abi import --from-source` and the node files `nvproxy serve` loads.
//!
//! **check** derives the facts of a driver source tree (`from_source`, then `extract`) and
//! compares them with the nearest node: the tables the facts imply (with the node's policy)
//! against the node's tables, and every modelled struct against the Rust layouts.
//!
//! **import** writes a *node file*: a JSON object naming the version, its parent (the nearest
//! node) and only the changes the facts show to entries the parent has (new number, new size,
//! gone, or admin-only where RM stops copying a pointer): entries the parent does not have stay
//! denied (they are listed, never added), and translation kinds and caps are the parent's. A
//! modelled struct whose layout no Rust struct matches marks the node unqualified.
//!
//! **load** verifies a node file before `serve` uses it: format version, a version that is no
//! built-in node, a built-in parent, every change naming an entry of the parent, numbers and
//! sizes in range, no two entries on one number, policy never loosened, and the support the
//! changes imply (a resized modelled struct means unqualified).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use nvproxy_abi::structs::MODELED_STRUCTS;
use nvproxy_abi::structs::layouts::{Layout, layouts};
use nvproxy_abi::{AbiNode, Caps, DriverAbi, DriverVersion, ParamSize, Support};
use serde_json::{Value, json};

use crate::suggest::{Entry, Kind, Size, entries};
use crate::tree_gen::{Implied, anchor, delta, implied_tables};

/// The format version of node files.
pub const NODE_FILE_FORMAT: u64 = 1;

/// The extract of the driver source tree in `dir` (needs a C compiler, a few seconds).
pub fn extract_from_source(dir: &Path) -> Result<Value> {
    let opts = crate::from_source::Options {
        version: None,
        commit: None,
    };
    let facts = crate::from_source::extract(dir, &opts)
        .with_context(|| format!("deriving the facts of {}", dir.display()))?;
    crate::extract::extract(&facts, None)
}

fn version_of(extract: &Value) -> Result<DriverVersion> {
    let v = extract["driver_version"]
        .as_str()
        .context("the facts name no driver_version")?;
    v.parse().map_err(|e| anyhow!("{e}"))
}

/// The node a version is compared with: itself if it is one, else the nearest node of its
/// branch (not newer where there is one), else the nearest older node.
pub fn nearest_node(version: &DriverVersion) -> &'static AbiNode {
    anchor(version, &[])
}

fn top_fields(s: &Value) -> Vec<(String, u64, u64)> {
    s["fields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| Some((f[0].as_str()?.to_owned(), f[1].as_u64()?, f[2].as_u64()?)))
        .collect()
}

fn layout_matches(l: &Layout, s: &Value) -> bool {
    if s["size"].as_u64() != Some(l.size as u64) || s["align"].as_u64() != Some(l.align as u64) {
        return false;
    }
    let c = top_fields(s);
    let fields_ok = l.fields.iter().all(|(name, off, size)| {
        c.iter()
            .any(|(n, o, sz)| n == name && (*o, *sz) == (*off as u64, *size as u64))
    });
    let covered = c
        .iter()
        .filter(|(n, _, _)| !n.contains('.') && !n.contains('['))
        .all(|(n, _, _)| l.fields.iter().any(|(f, _, _)| f == n));
    fields_ok && covered
}

/// The modelled structs of the facts that no Rust layout matches: the request path would
/// misread them.
pub fn layout_mismatches(extract: &Value) -> Vec<String> {
    let all = layouts();
    let mut out = Vec::new();
    for name in MODELED_STRUCTS {
        let s = &extract["structs"][*name];
        if s.is_null() {
            continue;
        }
        if !all
            .iter()
            .filter(|l| l.c_name == *name)
            .any(|l| layout_matches(l, s))
        {
            out.push(format!(
                "struct {name}: {} bytes, a layout no Rust struct has",
                s["size"]
            ));
        }
    }
    out
}

fn node_tables(n: &AbiNode) -> Implied {
    let t = n.tables();
    Kind::ALL.iter().map(|k| (*k, entries(&t, *k))).collect()
}

/// What `check` found.
#[derive(Debug)]
pub struct Check {
    /// The version of the source tree.
    pub version: DriverVersion,
    /// The node compared with.
    pub node: DriverVersion,
    /// Table differences, as builder lines (`abi.resize_control(...)`).
    pub tables: Vec<String>,
    /// Modelled structs no Rust layout matches.
    pub layouts: Vec<String>,
}

impl Check {
    /// `VERSION: matches node NODE`, or every difference from the node.
    pub fn render(&self) -> String {
        if self.tables.is_empty() && self.layouts.is_empty() {
            return format!("{}: matches node {}\n", self.version, self.node);
        }
        let mut out = format!(
            "{}: differs from node {} ({} table changes, {} struct layouts):\n",
            self.version,
            self.node,
            self.tables.len(),
            self.layouts.len()
        );
        for l in self.tables.iter().chain(&self.layouts) {
            let _ = writeln!(out, "  {l}");
        }
        out
    }
}

/// Compares an extract with the nearest node.
pub fn check(extract: &Value) -> Result<Check> {
    let version = version_of(extract)?;
    let node = nearest_node(&version);
    let implied = implied_tables(extract, node)?;
    Ok(Check {
        version,
        node: node.version,
        tables: delta(&node_tables(node), &implied),
        layouts: layout_mismatches(extract),
    })
}

fn table_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Escape => "escapes",
        Kind::Uvm => "uvm",
        Kind::Control => "controls",
        Kind::Class => "classes",
    }
}

fn kind_of(table: &str) -> Option<Kind> {
    Kind::ALL.into_iter().find(|k| table_name(*k) == table)
}

fn size_json(s: &Size) -> Value {
    match s {
        Size::Fixed(n) | Size::Array(n) => json!(n),
        Size::OneOf(ns) => json!(ns),
    }
}

/// The node file for an extract whose version has no node: changes to the parent's entries
/// only.
pub fn import(extract: &Value, source: &str) -> Result<Value> {
    let version = version_of(extract)?;
    if nvproxy_abi::find(&version).is_ok() {
        bail!("{version} is a node of the tree already: nothing to import");
    }
    let parent = nearest_node(&version);
    let implied = implied_tables(extract, parent)?;
    let old = node_tables(parent);
    let mut changes = Vec::new();
    let mut denied = Vec::new();
    let mut resized_modelled = Vec::new();
    for kind in Kind::ALL {
        let by_name = |v: &[Entry]| -> BTreeMap<String, Entry> {
            v.iter().map(|e| (e.name.clone(), e.clone())).collect()
        };
        let (o, n) = (by_name(&old[&kind]), by_name(&implied[&kind]));
        let table = table_name(kind);
        for (name, oe) in &o {
            match n.get(name) {
                None => changes.push(json!({"table": table, "name": name, "removed": true})),
                Some(ne) if ne == oe => {}
                Some(ne) => {
                    let mut c = json!({"table": table, "name": name, "number": ne.key});
                    if ne.size != oe.size {
                        c["size"] = size_json(&ne.size);
                        for p in ne
                            .params
                            .iter()
                            .filter(|p| MODELED_STRUCTS.contains(&p.as_str()))
                        {
                            resized_modelled.push(format!("{table} {name}: {p} resized"));
                        }
                    }
                    if ne.caps.is_empty() && !oe.caps.is_empty() {
                        c["admin_only"] = json!(true);
                    }
                    changes.push(c);
                }
            }
        }
        for name in n.keys().filter(|k| !o.contains_key(*k)) {
            denied.push(format!("{table} {name}"));
        }
    }
    let mut problems = layout_mismatches(extract);
    problems.extend(resized_modelled);
    let reason = (!problems.is_empty()).then(|| {
        format!(
            "modelled structs changed (the request path parses them): {}",
            problems.join("; ")
        )
    });
    Ok(json!({
        "nvproxy_node_file": NODE_FILE_FORMAT,
        "version": version.to_string(),
        "parent": parent.version.to_string(),
        "support": if reason.is_some() { "unqualified" } else { "supported" },
        "reason": reason,
        "source": source,
        "commit": extract["commit"],
        "changes": changes,
        "denied": denied,
        "layout_changes": problems,
    }))
}

/// A node file `serve` has verified, with the tables it builds.
#[derive(Debug, Clone)]
pub struct LoadedNode {
    /// The file.
    pub path: PathBuf,
    /// Its version.
    pub version: DriverVersion,
    /// The built-in node its tables start from.
    pub parent: DriverVersion,
    /// Supported or unqualified (per the file, checked against its changes).
    pub support: Support,
    /// Why it is unqualified.
    pub reason: Option<String>,
    /// The tables: the parent's with the file's changes.
    pub tables: DriverAbi,
}

/// Largest `_IOC_SIZE` an escape can have (14 bits).
const MAX_ESCAPE_SIZE: u64 = (1 << 14) - 1;

fn apply(abi: &mut DriverAbi, c: &Value) -> Result<()> {
    let table = c["table"].as_str().context("a change without a table")?;
    let kind = kind_of(table).with_context(|| format!("unknown table {table:?}"))?;
    let name = c["name"].as_str().context("a change without a name")?;
    if let Some(extra) = c.as_object().and_then(|o| {
        o.keys().find(|k| {
            !["table", "name", "number", "size", "removed", "admin_only"].contains(&k.as_str())
        })
    }) {
        bail!("{table} {name}: unknown key {extra:?} (a node file cannot change policy)");
    }
    let removed = c["removed"].as_bool() == Some(true);
    let number = c["number"].as_u64();
    let size = &c["size"];
    let admin_only = match &c["admin_only"] {
        Value::Null => false,
        Value::Bool(true) => true,
        other => bail!("{table} {name}: admin_only {other}: only `true` (tightening) is allowed"),
    };
    let one = |v: &Value, max: u64| -> Result<u32> {
        let n = v
            .as_u64()
            .with_context(|| format!("{table} {name}: size {v} is no number"))?;
        if n > max {
            bail!("{table} {name}: size {n} above {max}");
        }
        Ok(u32::try_from(n)?)
    };
    let max_params = u64::from(nvproxy_abi::RMAPI_PARAM_COPY_MAX_PARAMS_SIZE);
    macro_rules! rekey {
        ($map:expr, $key_ty:ty, $what:literal, |$e:ident, $k:ident| $update:block) => {{
            let key = $map
                .iter()
                .find(|(_, e)| e.name == name)
                .map(|(k, _)| *k)
                .with_context(|| format!("{} {name}: the parent has no such entry", $what))?;
            let mut $e = $map.remove(&key).expect("found above");
            if removed {
                return Ok(());
            }
            let $k: $key_ty = match number {
                Some(n) => <$key_ty>::try_from(n)
                    .map_err(|_| anyhow!("{} {name}: number {n:#x} out of range", $what))?,
                None => key,
            };
            $update
            if admin_only {
                $e.caps = Caps::NONE;
            }
            if $map.insert($k, $e).is_some() {
                bail!("{} {name}: number {:#x} is another entry's", $what, $k);
            }
        }};
    }
    match kind {
        Kind::Escape => rekey!(abi.escapes, u8, "escape", |e, new_key| {
            e.nr = new_key;
            if !size.is_null() {
                e.size = match (e.size, size) {
                    (ParamSize::Array { .. }, v) => ParamSize::Array {
                        elem: one(v, MAX_ESCAPE_SIZE)?,
                    },
                    (ParamSize::OneOf(_), _) => {
                        bail!("escape {name}: a size change of a multi-layout escape needs a node")
                    }
                    (ParamSize::Fixed(_), v) => ParamSize::Fixed(one(v, MAX_ESCAPE_SIZE)?),
                };
            }
        }),
        Kind::Uvm => rekey!(abi.uvm, u32, "UVM ioctl", |e, new_key| {
            e.cmd = new_key;
            if !size.is_null() {
                e.param_size = one(size, max_params)?;
            }
        }),
        Kind::Control => rekey!(abi.controls, u32, "control", |e, new_key| {
            e.cmd = new_key;
            if !size.is_null() {
                e.param_size = one(size, max_params)?;
            }
        }),
        Kind::Class => rekey!(abi.classes, u32, "class", |e, new_key| {
            e.class = new_key;
            if !size.is_null() {
                e.param_size = one(size, max_params)?;
            }
        }),
    }
    Ok(())
}

/// Parses and verifies a node file's contents.
pub fn verify(text: &str, path: &Path) -> Result<LoadedNode> {
    let v: Value = serde_json::from_str(text).context("not JSON")?;
    if v["nvproxy_node_file"].as_u64() != Some(NODE_FILE_FORMAT) {
        bail!("not an nvproxy node file of format {NODE_FILE_FORMAT}");
    }
    let parse = |key: &str| -> Result<DriverVersion> {
        let s = v[key].as_str().with_context(|| format!("no {key}"))?;
        s.parse().map_err(|e| anyhow!("{key}: {e}"))
    };
    let version = parse("version")?;
    let parent = parse("parent")?;
    if nvproxy_abi::find(&version).is_ok() {
        bail!("{version} is a built-in node: the file would shadow it");
    }
    let pnode = nvproxy_abi::find(&parent)
        .map_err(|_| anyhow!("parent {parent} is not a built-in node of this nvproxy"))?;
    let mut tables = pnode.tables();
    let changes = v["changes"].as_array().context("no changes list")?;
    let mut resized_modelled = false;
    for c in changes {
        apply(&mut tables, c)?;
        if !c["size"].is_null() {
            let kind = kind_of(c["table"].as_str().unwrap_or_default());
            let name = c["name"].as_str().unwrap_or_default();
            let parent_entries = kind
                .map(|k| entries(&pnode.tables(), k))
                .unwrap_or_default();
            resized_modelled |= parent_entries
                .iter()
                .filter(|e| e.name == name)
                .flat_map(|e| e.params.iter())
                .any(|p| MODELED_STRUCTS.contains(&p.as_str()));
        }
    }
    let reason = v["reason"].as_str().map(str::to_owned);
    let layout_changes = v["layout_changes"]
        .as_array()
        .is_some_and(|a| !a.is_empty());
    let support = match (v["support"].as_str(), &reason) {
        (Some("supported"), None) if !layout_changes && !resized_modelled => Support::Supported,
        (Some("supported"), _) => {
            bail!("marked supported, but a modelled struct changed or a reason is given")
        }
        (Some("unqualified"), Some(_)) => Support::Unqualified,
        (Some("unqualified"), None) => bail!("unqualified without a reason"),
        (other, _) => bail!("support {other:?}: want supported or unqualified"),
    };
    Ok(LoadedNode {
        path: path.to_owned(),
        version,
        parent,
        support,
        reason,
        tables,
    })
}

/// Loads and verifies every `*.json` node file of `dir`: a file that fails verification is an
/// error naming it (serve refuses to start rather than run on a table it cannot trust).
pub fn load_dir(dir: &Path) -> Result<Vec<LoadedNode>> {
    let mut out: Vec<LoadedNode> = Vec::new();
    let mut paths: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("reading node files in {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    for p in paths {
        let text = fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        let node = verify(&text, &p).with_context(|| format!("node file {}", p.display()))?;
        if let Some(other) = out.iter().find(|o| o.version == node.version) {
            bail!(
                "node files {} and {} are both for {}",
                other.path.display(),
                p.display(),
                node.version
            );
        }
        out.push(node);
    }
    Ok(out)
}

/// The node file as text (pretty JSON).
pub fn node_file_text(v: &Value) -> Result<String> {
    let mut s = serde_json::to_string_pretty(v)?;
    s.push('\n');
    Ok(s)
}
