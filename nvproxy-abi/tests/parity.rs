//! ABI parity: every node's tables and every modeled struct against the facts extracted from
//! the driver headers of that version (`facts/<node.facts>.json`, written by `abi-import
//! extract`; versions with the same ABI share one file, `facts/index.tsv`).
//!
//! Checked per node: for every table entry, its number, param struct name(s), size and
//! array-ness; that every entry any node knows and the driver has is in the table
//! (completeness); for every modeled struct the driver has, that one of its Rust layouts matches
//! it: size, alignment and each field's offset and size (C field names; padding fields
//! excluded), with the Rust fields covering every top-level C member. A node that fails is
//! unqualified with a reason; a supported node passes everything.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::offset_of;

use nvproxy_abi::structs::layouts::{Layout, layouts};
use nvproxy_abi::structs::*;
use nvproxy_abi::{DriverAbi, ParamSize, Support, nodes};
use serde_json::Value;

mod common;

use common::facts;

fn type_size(f: &Value, name: &str) -> Option<u64> {
    match name {
        "NvHandle" | "NvU32" | "NvU32[]" => Some(4),
        _ => f["struct_sizes"][name].as_u64(),
    }
}

fn params_of(v: &Value) -> Vec<String> {
    match v {
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Value::String(s) => vec![s.clone()],
        _ => Vec::new(),
    }
}

/// Checks one entry of a table; returns the mismatches.
fn check_entry(
    f: &Value,
    table: &str,
    num_key: &str,
    name: &str,
    key: u64,
    params: &[&str],
    size: u64,
) -> Vec<String> {
    let mut errs = Vec::new();
    let fact = &f[table][name];
    let (fact_key, fact_params) = if fact.is_null() {
        // A nameless NVOC control method kept under gVisor's name.
        let m = f["unnamed_control_methods"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m[0].as_u64() == Some(key)));
        match (table, m) {
            ("controls", Some(m)) => (key, params_of(&m[1])),
            _ => return vec![format!("{table} {name}: not in the driver")],
        }
    } else {
        (
            fact[num_key].as_u64().unwrap_or(u64::MAX),
            params_of(&fact["params"]),
        )
    };
    if fact_key != key {
        errs.push(format!(
            "{table} {name}: number {key:#x}, driver {fact_key:#x}"
        ));
    }
    if fact_params != params {
        errs.push(format!(
            "{table} {name}: params {params:?}, driver {fact_params:?}"
        ));
    }
    let want: Option<u64> = fact_params.iter().map(|p| type_size(f, p)).sum();
    if fact_params.len() <= 1 && want.unwrap_or(0) != size {
        errs.push(format!("{table} {name}: size {size}, driver {want:?}"));
    }
    errs
}

/// Every name any node knows, per table: what completeness checks for.
fn known_names() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    let mut known: BTreeMap<&str, BTreeSet<&'static str>> = BTreeMap::new();
    for n in nodes().iter().filter(|n| !n.same_as_parent) {
        let t = n.tables();
        known
            .entry("escapes")
            .or_default()
            .extend(t.escapes.values().map(|e| e.name));
        known
            .entry("uvm_ioctls")
            .or_default()
            .extend(t.uvm.values().map(|e| e.name));
        known
            .entry("controls")
            .or_default()
            .extend(t.controls.values().map(|e| e.name));
        known
            .entry("classes")
            .or_default()
            .extend(t.classes.values().map(|e| e.name));
    }
    known
}

/// The distinct facts files of the tree.
fn facts_files() -> BTreeSet<&'static str> {
    nodes().iter().map(|n| n.facts).collect()
}

fn check_tables(
    version: &str,
    abi: &DriverAbi,
    f: &Value,
    known: &BTreeMap<&'static str, BTreeSet<&'static str>>,
) -> Vec<String> {
    let mut errs = Vec::new();
    for e in abi.escapes.values() {
        let params: Vec<&str> = e.params.to_vec();
        let is_array = f["escapes"][e.name]["size_check"] == "array";
        let sizes: Vec<Option<u64>> = e.params.iter().map(|p| type_size(f, p)).collect();
        match e.size {
            ParamSize::Fixed(n) => {
                errs.extend(check_entry(
                    f,
                    "escapes",
                    "nr",
                    e.name,
                    e.nr.into(),
                    &params,
                    n.into(),
                ));
                if is_array {
                    errs.push(format!("escape {}: driver takes an array", e.name));
                }
            }
            ParamSize::OneOf(ns) => {
                errs.extend(check_entry(
                    f,
                    "escapes",
                    "nr",
                    e.name,
                    e.nr.into(),
                    &params,
                    0,
                ));
                let ns: Vec<Option<u64>> = ns.iter().map(|n| Some(u64::from(*n))).collect();
                if ns != sizes {
                    errs.push(format!("escape {}: sizes {ns:?}, driver {sizes:?}", e.name));
                }
            }
            ParamSize::Array { elem } => {
                errs.extend(check_entry(
                    f,
                    "escapes",
                    "nr",
                    e.name,
                    e.nr.into(),
                    &params,
                    elem.into(),
                ));
                if !is_array {
                    errs.push(format!("escape {}: not an array in the driver", e.name));
                }
            }
        }
    }
    for e in abi.uvm.values() {
        let p: Vec<&str> = e.params.into_iter().collect();
        errs.extend(check_entry(
            f,
            "uvm_ioctls",
            "cmd",
            e.name,
            e.cmd.into(),
            &p,
            e.param_size.into(),
        ));
    }
    for e in abi.controls.values() {
        let p: Vec<&str> = e.params.into_iter().collect();
        errs.extend(check_entry(
            f,
            "controls",
            "cmd",
            e.name,
            e.cmd.into(),
            &p,
            e.param_size.into(),
        ));
    }
    for e in abi.classes.values() {
        let p: Vec<&str> = e.params.into_iter().collect();
        errs.extend(check_entry(
            f,
            "classes",
            "class",
            e.name,
            e.class.into(),
            &p,
            e.param_size.into(),
        ));
    }
    // Completeness: an entry any node knows must be in this node's table if the driver has it.
    let mine: BTreeSet<&str> = abi
        .escapes
        .values()
        .map(|e| e.name)
        .chain(abi.uvm.values().map(|e| e.name))
        .chain(abi.controls.values().map(|e| e.name))
        .chain(abi.classes.values().map(|e| e.name))
        .collect();
    for (table, names) in known {
        for name in names.iter().copied() {
            if f[table].get(name).is_some() && !mine.contains(name) {
                errs.push(format!(
                    "{version}: driver has {table} {name}, the table does not"
                ));
            }
        }
    }
    errs
}

fn check_layout(l: &Layout, s: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    let who = format!("{} ({})", l.rust, l.c_name);
    if s["size"].as_u64() != Some(l.size as u64) || s["align"].as_u64() != Some(l.align as u64) {
        errs.push(format!(
            "{who}: size/align {}/{}, driver {}/{}",
            l.size, l.align, s["size"], s["align"]
        ));
    }
    let c_fields: BTreeMap<&str, (u64, u64)> = s["fields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| Some((x[0].as_str()?, (x[1].as_u64()?, x[2].as_u64()?))))
        .collect();
    for (name, off, size) in &l.fields {
        match c_fields.get(name) {
            None => errs.push(format!("{who}: field {name} is not in the driver's struct")),
            Some(&(o, sz)) if (o, sz) != (*off as u64, *size as u64) => errs.push(format!(
                "{who}: field {name} at {off} size {size}, driver at {o} size {sz}"
            )),
            Some(_) => {}
        }
    }
    for name in c_fields
        .keys()
        .filter(|n| !n.contains('.') && !n.contains('['))
    {
        if !l.fields.iter().any(|(f, _, _)| f == name) {
            errs.push(format!("{who}: driver member {name} has no Rust field"));
        }
    }
    errs
}

/// Every modelled struct of the facts that no Rust layout matches, with the first candidate's
/// mismatches.
fn layout_errors(layouts: &[Layout], f: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    for c_name in MODELED_STRUCTS {
        let s = &f["structs"][*c_name];
        if s.is_null() {
            continue;
        }
        let tried: Vec<(&Layout, Vec<String>)> = layouts
            .iter()
            .filter(|l| l.c_name == *c_name)
            .map(|l| (l, check_layout(l, s)))
            .collect();
        if tried.iter().any(|(_, e)| e.is_empty()) {
            continue;
        }
        let detail: Vec<String> = tried.iter().flat_map(|(_, e)| e.clone()).collect();
        errs.push(format!(
            "struct {c_name} ({} bytes): no Rust layout matches: {}",
            s["size"],
            detail.join("; ")
        ));
    }
    errs
}

/// Every node's parity errors: tables (number, params, size, completeness) and layouts.
fn parity_errors() -> BTreeMap<String, Vec<String>> {
    let layouts = layouts();
    let known = known_names();
    let mut by_facts: BTreeMap<&str, (Value, Vec<String>)> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for node in nodes() {
        let (f, layout_errs) = by_facts.entry(node.facts).or_insert_with(|| {
            let f = facts(node.facts);
            let e = layout_errors(&layouts, &f);
            (f, e)
        });
        let v = node.version.to_string();
        let mut errs = check_tables(&v, &node.tables(), f, &known);
        errs.extend(layout_errs.iter().cloned());
        out.insert(v, errs);
    }
    out
}

#[test]
fn test_every_node_passes_parity_or_is_unqualified_with_a_reason() {
    let errs = parity_errors();
    let mut problems = Vec::new();
    for node in nodes() {
        let v = node.version.to_string();
        let e = &errs[&v];
        match (node.support, node.reason) {
            (Support::Supported, _) if !e.is_empty() => {
                problems.extend(e.iter().map(|e| format!("{v} (supported): {e}")))
            }
            (Support::Unqualified, None | Some("")) => {
                problems.push(format!("{v}: unqualified without a reason"))
            }
            (Support::Supported, Some(r)) => {
                problems.push(format!("{v}: supported with a reason {r:?}"))
            }
            _ => {}
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
    let checked: usize = nodes().len();
    assert!(checked >= 149, "only {checked} nodes");
}

#[test]
fn test_every_node_names_an_existing_facts_file_of_its_abi() {
    for node in nodes() {
        let f = facts(node.facts);
        assert!(
            f["structs"].as_object().is_some_and(|m| m.len() > 70),
            "{}",
            node.version
        );
        // A version's own facts file carries its own version and commit.
        if node.facts == node.version.to_string() {
            assert_eq!(f["commit"].as_str(), node.commit, "{}", node.version);
        }
    }
}

#[test]
fn test_every_modeled_struct_has_a_layout_and_is_in_the_newest_facts() {
    let layouts = layouts();
    let newest = facts(nodes().iter().max_by_key(|n| n.version).unwrap().facts);
    for c_name in MODELED_STRUCTS {
        assert!(
            layouts.iter().any(|l| l.c_name == *c_name),
            "{c_name} has no layout entry"
        );
        assert!(
            !newest["structs"][*c_name].is_null(),
            "{c_name} is not in the 595.45.04 facts"
        );
    }
    assert!(layouts.iter().all(|l| MODELED_STRUCTS.contains(&l.c_name)));
}

#[test]
fn test_nvos32_alloc_size_address_accessor_matches_every_version() {
    for v in facts_files() {
        let fields = facts(v)["structs"]["NVOS32_PARAMETERS"]["fields"].clone();
        let address = fields
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x[0] == "data.AllocSize.address");
        let at = address.and_then(|x| x[1].as_u64());
        let want =
            offset_of!(NVOS32_PARAMETERS, data) + NVOS32_PARAMETERS::ALLOC_SIZE_ADDRESS_OFFSET;
        assert_eq!(at, Some(want as u64), "{v}");
    }
}

#[test]
fn test_preferred_location_layout_choice_matches_every_version() {
    for node in nodes() {
        let v = node.version.to_string();
        let fields =
            facts(node.facts)["structs"]["UVM_SET_PREFERRED_LOCATION_PARAMS"]["fields"].clone();
        let status = fields
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x[0] == "rmStatus")
            .and_then(|x| x[1].as_u64());
        let want = if uvm_preferred_location_v550(&node.tables()) {
            offset_of!(UVM_SET_PREFERRED_LOCATION_PARAMS_V550, rmStatus)
        } else {
            offset_of!(UVM_SET_PREFERRED_LOCATION_PARAMS, rmStatus)
        };
        assert_eq!(status, Some(want as u64), "{v}");
    }
}

/// The legacy GSS control categories `nvproxy-abi` names legacy controls by are exactly those
/// the headers of each node's version define (`legacy_control_categories` in its facts).
#[test]
fn test_every_node_knows_exactly_the_legacy_categories_of_its_headers() {
    for node in nodes() {
        let f = facts(node.facts);
        let want: BTreeMap<String, u64> = f["legacy_control_categories"]
            .as_object()
            .unwrap_or_else(|| panic!("facts {} have no legacy_control_categories", node.facts))
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().expect("a number")))
            .collect();
        let got: BTreeMap<String, u64> = nvproxy_abi::legacy_categories(node.version)
            .map(|c| (c.name.to_owned(), u64::from(c.category)))
            .collect();
        assert_eq!(got, want, "{}", node.version);
        for c in nvproxy_abi::legacy_categories(node.version) {
            let class = u32::from_str_radix(&c.name[2..6], 16).expect("NVxxxx");
            assert_eq!(class, c.class, "{}", c.name);
        }
    }
}
