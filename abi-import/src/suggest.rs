//! `suggest`: compare an extract with the tables of an existing node and print the delta a new
//! node would need, in the style of `nvproxy-abi/src/tree/generated.rs` (`abi-import add` and
//! `tree` write such deltas themselves; this is the comparison against any node you name). The
//! entry types and the delta lines are shared with `tree_gen` and `host`.
//!
//! Entries are matched by name. Translation kind and caps come from the base node (or, for an
//! entry the base lacks, from the newest node that has it): those are policy, not facts, and a
//! reviewer must confirm them. Struct layout changes of modeled structs are listed as comments:
//! each one needs a `_Vxxx` struct variant and a parity-test mapping.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result, anyhow};
use nvproxy_abi::{DriverAbi, DriverVersion, ParamSize, Translation, nodes};
use serde_json::Value;

/// One table entry in owned form, comparable between the base tables and the extract.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Entry {
    pub(crate) key: u32,
    pub(crate) name: String,
    pub(crate) params: Vec<String>,
    pub(crate) size: Size,
    pub(crate) translation: Translation,
    pub(crate) caps: nvproxy_abi::Caps,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Size {
    Fixed(u32),
    OneOf(Vec<u32>),
    Array(u32),
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Kind {
    Escape,
    Uvm,
    Control,
    Class,
}

impl Kind {
    pub(crate) const ALL: [Kind; 4] = [Kind::Escape, Kind::Uvm, Kind::Control, Kind::Class];

    fn extract_key(self) -> (&'static str, &'static str) {
        match self {
            Kind::Escape => ("escapes", "nr"),
            Kind::Uvm => ("uvm_ioctls", "cmd"),
            Kind::Control => ("controls", "cmd"),
            Kind::Class => ("classes", "class"),
        }
    }

    pub(crate) fn word(self) -> &'static str {
        match self {
            Kind::Escape => "escape",
            Kind::Uvm => "uvm",
            Kind::Control => "control",
            Kind::Class => "class",
        }
    }
}

pub(crate) fn entries(abi: &DriverAbi, kind: Kind) -> Vec<Entry> {
    let one = |p: Option<&str>| p.map(|p| vec![p.to_owned()]).unwrap_or_default();
    match kind {
        Kind::Escape => abi
            .escapes
            .values()
            .map(|e| Entry {
                key: u32::from(e.nr),
                name: e.name.to_owned(),
                params: e.params.iter().map(|p| (*p).to_owned()).collect(),
                size: match e.size {
                    ParamSize::Fixed(n) => Size::Fixed(n),
                    ParamSize::OneOf(ns) => Size::OneOf(ns.to_vec()),
                    ParamSize::Array { elem } => Size::Array(elem),
                },
                translation: e.translation,
                caps: e.caps,
            })
            .collect(),
        Kind::Uvm => abi
            .uvm
            .values()
            .map(|e| Entry {
                key: e.cmd,
                name: e.name.to_owned(),
                params: one(e.params),
                size: Size::Fixed(e.param_size),
                translation: e.translation,
                caps: e.caps,
            })
            .collect(),
        Kind::Control => abi
            .controls
            .values()
            .map(|e| Entry {
                key: e.cmd,
                name: e.name.to_owned(),
                params: one(e.params),
                size: Size::Fixed(e.param_size),
                translation: e.translation,
                caps: e.caps,
            })
            .collect(),
        Kind::Class => abi
            .classes
            .values()
            .map(|e| Entry {
                key: e.class,
                name: e.name.to_owned(),
                params: one(e.params),
                size: Size::Fixed(e.param_size),
                translation: e.translation,
                caps: e.caps,
            })
            .collect(),
    }
}

/// Size of a payload type named in the facts (`NvU32[]` is an array of 4-byte ids).
fn type_size(extract: &Value, name: &str) -> Option<u32> {
    match name {
        "NvHandle" | "NvU32" | "NvU32[]" => Some(4),
        _ => extract["struct_sizes"][name]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok()),
    }
}

/// What the extract says about `template` (matched by name), keeping its policy fields.
pub(crate) fn implied(extract: &Value, kind: Kind, template: &Entry) -> Option<Entry> {
    let (table, num) = kind.extract_key();
    let mut e = template.clone();
    if let Some(fact) = extract[table].get(&template.name) {
        e.key = u32::try_from(fact[num].as_u64()?).ok()?;
        e.params = match &fact["params"] {
            Value::Array(a) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            Value::String(s) => vec![s.clone()],
            _ => Vec::new(),
        };
    } else if kind == Kind::Control {
        // A nameless NVOC method, kept under gVisor's name: present if its number still is.
        let methods = extract["unnamed_control_methods"].as_array()?;
        let m = methods
            .iter()
            .find(|m| m[0].as_u64() == Some(u64::from(template.key)))?;
        e.params = m[1]
            .as_str()
            .map(|p| vec![p.to_owned()])
            .unwrap_or_default();
    } else {
        return None;
    }
    let sizes: Vec<u32> = e
        .params
        .iter()
        .map(|p| type_size(extract, p))
        .collect::<Option<_>>()?;
    e.size = match (kind, sizes.as_slice()) {
        (Kind::Escape, [elem]) if fact_check(extract, &e.name) == Some("array") => {
            Size::Array(*elem)
        }
        (_, []) => Size::Fixed(0),
        (_, [one]) => Size::Fixed(*one),
        (_, many) => Size::OneOf(many.to_vec()),
    };
    Some(e)
}

fn fact_check<'a>(extract: &'a Value, escape: &str) -> Option<&'a str> {
    extract["escapes"][escape]["size_check"].as_str()
}

fn caps_const(caps: nvproxy_abi::Caps) -> String {
    use nvproxy_abi::Caps as C;
    let named = [
        (C::COMPUTE_UTILITY, "CU"),
        (C::COMPUTE_UTILITY.union(C::GRAPHICS), "CUG"),
        (C::COMPUTE_UTILITY.union(C::VIDEO), "CUV"),
        (C::GRAPHICS, "G"),
        (C::VIDEO, "V"),
        (C::GRAPHICS.union(C::VIDEO), "GV"),
        (C::PROFILING, "P"),
        (C::RDMA, "RDMA"),
        (C::FABRIC_IMEX_MGMT, "IMEX"),
        (C::NONE, "ADMIN"),
    ];
    named
        .iter()
        .find(|(c, _)| *c == caps)
        .map_or_else(|| format!("/* {caps} */"), |(_, n)| (*n).to_owned())
}

fn translation_name(t: Translation) -> &'static str {
    match t {
        Translation::Simple => "Simple",
        Translation::Fd => "Fd",
        Translation::Pointer => "Pointer",
        Translation::Special => "Special",
    }
}

fn add_line(kind: Kind, e: &Entry) -> String {
    let opt = |p: &[String]| {
        p.first()
            .map_or_else(|| "None".to_owned(), |p| format!("Some(\"{p}\")"))
    };
    let size = match &e.size {
        Size::Fixed(n) => n.to_string(),
        Size::OneOf(ns) => format!("{ns:?}"),
        Size::Array(n) => n.to_string(),
    };
    let (t, c) = (translation_name(e.translation), caps_const(e.caps));
    match kind {
        Kind::Escape => {
            let params: Vec<String> = e.params.iter().map(|p| format!("\"{p}\"")).collect();
            let size = match &e.size {
                Size::Fixed(n) => format!("ParamSize::Fixed({n})"),
                Size::OneOf(ns) => format!(
                    "ParamSize::OneOf(&[{}])",
                    ns.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                ),
                Size::Array(n) => format!("ParamSize::Array {{ elem: {n} }}"),
            };
            format!(
                "abi.add_escape({:#04x}, \"{}\", &[{}], {size}, {t}, {c});",
                e.key,
                e.name,
                params.join(", ")
            )
        }
        Kind::Uvm => format!(
            "abi.add_uvm({:#x}, \"{}\", {}, {size}, {t}, {c});",
            e.key,
            e.name,
            opt(&e.params)
        ),
        Kind::Control => {
            format!(
                "abi.add_control({:#x}, \"{}\", {}, {size}, {t}, {c});",
                e.key,
                e.name,
                opt(&e.params)
            )
        }
        Kind::Class => format!(
            "abi.add_class({:#x}, \"{}\", {}, {size}, {t}, {c});",
            e.key,
            e.name,
            opt(&e.params)
        ),
    }
}

/// The delta lines that turn `old` (the base) into `new` for one table.
pub(crate) fn delta_lines(kind: Kind, old: &[Entry], new: &[Entry]) -> Vec<String> {
    let mut lines = Vec::new();
    let by_key = |v: &[Entry]| {
        v.iter()
            .map(|e| (e.key, e.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    let (old, new) = (by_key(old), by_key(new));
    let w = kind.word();
    for (k, o) in &old {
        match new.get(k) {
            None => lines.push(format!("abi.remove_{w}({k:#x}); // {} is gone", o.name)),
            Some(n) if n == o => {}
            Some(n) => match (&o.size, &n.size) {
                (Size::Fixed(a), Size::Fixed(b))
                    if o.name == n.name
                        && o.params == n.params
                        && (o.translation, o.caps) == (n.translation, n.caps) =>
                {
                    lines.push(format!(
                        "abi.resize_{w}({k:#x}, {b}); // {}: {a} -> {b}",
                        n.name
                    ));
                }
                _ if o.name == n.name && o.params == n.params && o.size == n.size => {
                    lines.push(format!(
                        "{} // {}: policy {}/{} -> {}/{}",
                        add_line(kind, n),
                        n.name,
                        o.translation,
                        o.caps,
                        n.translation,
                        n.caps
                    ))
                }
                _ => lines.push(format!(
                    "{} // was {} {:?}",
                    add_line(kind, n),
                    o.name,
                    o.size
                )),
            },
        }
    }
    for (k, n) in &new {
        if !old.contains_key(k) {
            lines.push(add_line(kind, n));
        }
    }
    lines
}

fn top_fields(s: &Value) -> Vec<(String, u64, u64)> {
    s["fields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| Some((f[0].as_str()?.to_owned(), f[1].as_u64()?, f[2].as_u64()?)))
        .filter(|(n, _, _)| !n.contains('.') && !n.contains('['))
        .collect()
}

/// Layout changes of the modeled structs between two extracts, as comment lines.
pub(crate) fn struct_notes(base: &Value, new: &Value) -> Vec<String> {
    let mut notes = Vec::new();
    for name in nvproxy_abi::structs::MODELED_STRUCTS {
        let (a, b) = (&base["structs"][*name], &new["structs"][*name]);
        match (a.is_null(), b.is_null()) {
            (true, true) => continue,
            (false, true) => notes.push(format!("// struct {name}: gone")),
            (true, false) => notes.push(format!("// struct {name}: new, size {}", b["size"])),
            (false, false) => {
                let (fa, fb) = (top_fields(a), top_fields(b));
                if a["size"] == b["size"] && a["align"] == b["align"] && fa == fb {
                    continue;
                }
                let added: Vec<String> = fb
                    .iter()
                    .filter(|f| !fa.contains(f))
                    .map(|(n, o, s)| format!("{n}@{o}({s})"))
                    .collect();
                let removed: Vec<String> = fa
                    .iter()
                    .filter(|f| !fb.contains(f))
                    .map(|(n, o, _)| format!("{n}@{o}"))
                    .collect();
                notes.push(format!(
                    "// struct {name}: size {} -> {}; now {} ; was {} => add a _Vxxx variant",
                    a["size"],
                    b["size"],
                    added.join(" "),
                    removed.join(" ")
                ));
            }
        }
    }
    notes
}

/// `abi-import suggest EXTRACT [--base V]`.
pub fn run(extract_path: &Path, base: Option<&str>) -> Result<String> {
    let read = |p: &Path| -> Result<Value> {
        let text = fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", p.display()))
    };
    let extract = read(extract_path)?;
    let version: DriverVersion = extract["driver_version"]
        .as_str()
        .context("extract has no driver_version")?
        .parse()
        .map_err(|e| anyhow!("{e}"))?;
    let base_node = match base {
        Some(b) => {
            let v: DriverVersion = b.parse().map_err(|e| anyhow!("{e}"))?;
            nvproxy_abi::find(&v).map_err(|e| anyhow!("{e}"))?
        }
        None => nvproxy_abi::tree::nearest_ancestor(&version)
            .or_else(|| nodes().iter().max_by_key(|n| n.version))
            .context("the tree is empty")?,
    };
    let base_abi = base_node.tables();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// {} -> {version}: suggested delta (review caps and translation)",
        base_node.version
    );
    let _ = writeln!(
        out,
        "pub(super) fn v{}() -> DriverAbi {{",
        version.to_string().replace('.', "_")
    );
    let _ = writeln!(
        out,
        "    let mut abi = v{}();",
        base_node.version.to_string().replace('.', "_")
    );
    let mut changes = 0;
    for kind in Kind::ALL {
        // Templates: the base's entries, then entries other nodes have (newest node wins).
        let mut templates: BTreeMap<String, Entry> = BTreeMap::new();
        let mut all: Vec<_> = nodes().iter().collect();
        all.sort_by_key(|n| n.version);
        for node in all {
            for e in entries(&node.tables(), kind) {
                templates.insert(e.name.clone(), e);
            }
        }
        let old = entries(&base_abi, kind);
        for e in &old {
            templates.insert(e.name.clone(), e.clone());
        }
        let new: Vec<Entry> = templates
            .values()
            .filter_map(|t| implied(&extract, kind, t))
            .collect();
        for line in delta_lines(kind, &old, &new) {
            changes += 1;
            let _ = writeln!(out, "    {line}");
        }
    }
    let _ = writeln!(out, "    abi\n}}");
    // The base node's facts file (shared between the versions of one ABI).
    let base_extract = extract_path.with_file_name(format!("{}.json", base_node.facts));
    match read(&base_extract) {
        Ok(b) => {
            for note in struct_notes(&b, &extract) {
                changes += 1;
                let _ = writeln!(out, "{note}");
            }
        }
        Err(e) => {
            let _ = writeln!(out, "// struct layouts not compared: {e:#}");
        }
    }
    if changes == 0 {
        let _ = writeln!(
            out,
            "// no table or layout change: a node for {version} reuses {}'s builder (its \
             row in facts/index.tsv can share that facts file)",
            base_node.version
        );
    }
    Ok(out)
}
