//! `extract`: keep only what the tables and the modeled structs need.
//!
//! The extract holds, for one driver version: every escape (number, payload structs, size
//! check), every UVM ioctl (number, params), the controls and classes whose names appear in any
//! node of the tree or in the allowlist given with `--allowlist` (number, params), the nameless
//! control methods, the size of every struct those reference, the pointer and fd members of each
//! of those structs (`unsafe_fields`: the facts' `pointers` and `fds`, both at any depth), the
//! deep-copy entries (`embedded_pointer_controls`) of the controls kept, and the full layout
//! (fields, pointers, fds) of every struct in `nvproxy_abi::structs::MODELED_STRUCTS` and of the
//! params of every deep-copy control kept.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

/// Names of controls and classes the tree knows, plus those of the allowlist (if given).
fn names_of_interest(allowlist: Option<&Path>) -> Result<(BTreeSet<String>, BTreeSet<String>)> {
    let mut controls = BTreeSet::new();
    let mut classes = BTreeSet::new();
    for node in nvproxy_abi::nodes() {
        let abi = node.tables();
        controls.extend(abi.controls.values().map(|c| c.name.to_owned()));
        classes.extend(abi.classes.values().map(|c| c.name.to_owned()));
    }
    if let Some(path) = allowlist {
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split('\t').collect();
            match cols.as_slice() {
                ["control", name, ..] => controls.insert((*name).to_owned()),
                ["alloc_class", name, ..] => classes.insert((*name).to_owned()),
                _ => false,
            };
        }
    }
    Ok((controls, classes))
}

fn obj<'a>(facts: &'a Value, key: &str) -> Result<&'a Map<String, Value>> {
    facts
        .get(key)
        .and_then(Value::as_object)
        .with_context(|| format!("facts have no object {key:?}"))
}

/// `abi-import extract FACTS --out DIR`: writes `DIR/<version>.json`.
pub fn run(facts_path: &Path, allowlist: Option<&Path>, out_dir: &Path) -> Result<PathBuf> {
    let text = fs::read_to_string(facts_path)
        .with_context(|| format!("reading {}", facts_path.display()))?;
    let facts: Value = serde_json::from_str(&text).context("facts are not JSON")?;
    let extract = extract(&facts, allowlist)?;
    let version = extract["driver_version"].as_str().unwrap_or_default();
    fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let out = out_dir.join(format!("{version}.json"));
    let text = to_lines(&extract)?;
    fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

/// The extract of a full abi-facts file (what `run` writes).
pub fn extract(facts: &Value, allowlist: Option<&Path>) -> Result<Value> {
    let facts = facts.clone();
    let version = facts["driver_version"]
        .as_str()
        .context("no driver_version")?
        .to_owned();
    version
        .parse::<nvproxy_abi::DriverVersion>()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let structs = obj(&facts, "structs")?;
    let (want_controls, want_classes) = names_of_interest(allowlist)?;
    let mut referenced: BTreeSet<String> = BTreeSet::new();

    let mut escapes = Map::new();
    let esc_params = obj(&facts, "escape_params")?;
    let esc_check = obj(&facts, "escape_size_check")?;
    for (name, nr) in obj(&facts, "escapes")? {
        let params = esc_params.get(name).cloned().unwrap_or(json!([]));
        for p in params
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            referenced.insert(p.to_owned());
        }
        let check = esc_check.get(name).cloned().unwrap_or(Value::Null);
        escapes.insert(
            name.clone(),
            json!({"nr": nr, "params": params, "size_check": check}),
        );
    }

    let mut uvm = Map::new();
    let uvm_params = obj(&facts, "uvm_ioctl_params")?;
    for (name, cmd) in obj(&facts, "uvm_ioctls")? {
        let params = uvm_params.get(name).cloned().unwrap_or(Value::Null);
        if let Some(p) = params.as_str() {
            referenced.insert(p.to_owned());
        }
        uvm.insert(name.clone(), json!({"cmd": cmd, "params": params}));
    }

    let mut controls = Map::new();
    let ctrl_params = obj(&facts, "control_params")?;
    for (name, cmd) in obj(&facts, "controls")?
        .iter()
        .filter(|(n, _)| want_controls.contains(*n))
    {
        let params = ctrl_params.get(name).cloned().unwrap_or(Value::Null);
        if let Some(p) = params.as_str() {
            referenced.insert(p.to_owned());
        }
        controls.insert(name.clone(), json!({"cmd": cmd, "params": params}));
    }
    // Kept controls that have no method in RM's exported-method tables (no `control_flags`):
    // RM answers NV_ERR_NOT_SUPPORTED for them before any copy (`tests/pointers.rs`).
    let flags = obj(&facts, "control_flags")?;
    let without_method: Vec<&String> = controls
        .keys()
        .filter(|n| !flags.contains_key(*n))
        .collect();
    let without_method = json!(without_method);
    let unnamed = facts["unnamed_control_methods"].clone();
    for m in unnamed.as_array().into_iter().flatten() {
        if let Some(p) = m.get(1).and_then(Value::as_str) {
            referenced.insert(p.to_owned());
        }
    }

    let mut classes = Map::new();
    let class_params = obj(&facts, "class_alloc_params")?;
    for (name, number) in obj(&facts, "classes")?
        .iter()
        .filter(|(n, _)| want_classes.contains(*n))
    {
        let params = class_params
            .get(name)
            .and_then(|c| c.get("params"))
            .cloned();
        let params = params.unwrap_or(Value::Null);
        if let Some(p) = params.as_str() {
            referenced.insert(p.to_owned());
        }
        classes.insert(name.clone(), json!({"class": number, "params": params}));
    }

    // The deep-copy controls among those kept: RM itself copies their embedded user pointers,
    // so each must be in the proxy's embedded-pointer table (parity: `tests/pointers.rs`).
    let mut embedded = Map::new();
    let mut embedded_params = BTreeSet::new();
    for (name, e) in obj(&facts, "embedded_pointer_controls")?
        .iter()
        .filter(|(n, _)| want_controls.contains(*n))
    {
        if let Some(p) = e.get("params").and_then(Value::as_str) {
            embedded_params.insert(p.to_owned());
        }
        embedded.insert(name.clone(), e.clone());
    }

    let mut sizes = BTreeMap::new();
    let mut unsafe_fields = Map::new();
    for name in &referenced {
        let Some(s) = structs.get(name) else { continue };
        if let Some(size) = s.get("size") {
            sizes.insert(name.clone(), size.clone());
        }
        let mut entry = Map::new();
        for key in ["pointers", "fds"] {
            if let Some(v) = s.get(key) {
                entry.insert(key.to_owned(), v.clone());
            }
        }
        if !entry.is_empty() {
            unsafe_fields.insert(name.clone(), Value::Object(entry));
        }
    }
    let mut layouts = Map::new();
    let layout_names: BTreeSet<&str> = nvproxy_abi::structs::MODELED_STRUCTS
        .iter()
        .copied()
        .chain(embedded_params.iter().map(String::as_str))
        .collect();
    for name in layout_names {
        let Some(s) = structs.get(name) else {
            continue;
        };
        let mut entry = Map::new();
        for key in ["size", "align", "header", "fields", "pointers", "fds"] {
            if let Some(v) = s.get(key) {
                entry.insert(key.to_owned(), v.clone());
            }
        }
        layouts.insert(name.to_owned(), Value::Object(entry));
    }
    if layouts.is_empty() {
        bail!("none of the modeled structs is in the facts: is this an abi-facts file?");
    }

    // The legacy GSS control categories (`nvproxy-abi`'s `legacy` module names legacy controls
    // by them); facts written before from-source extracted them have none.
    let legacy = obj(&facts, "legacy_control_categories")
        .cloned()
        .unwrap_or_default();

    let extract = json!({
        "legacy_control_categories": legacy,
        "driver_version": version,
        "source": facts["source"],
        "commit": facts["commit"],
        "escapes": escapes,
        "uvm_ioctls": uvm,
        "controls": controls,
        "unnamed_control_methods": unnamed,
        "controls_without_rm_method": without_method,
        "classes": classes,
        "struct_sizes": sizes,
        "unsafe_fields": unsafe_fields,
        "embedded_pointer_controls": embedded,
        "structs": layouts,
    });
    Ok(extract)
}

/// JSON with one line per entry of each top-level map: small, and diffs well in review.
pub fn to_lines(v: &Value) -> Result<String> {
    let top = v.as_object().context("extract is an object")?;
    let mut out = String::from("{\n");
    for (i, (key, val)) in top.iter().enumerate() {
        out.push_str(&format!("{}:", serde_json::to_string(key)?));
        match val.as_object() {
            Some(map) if !map.is_empty() => {
                out.push_str(" {\n");
                for (j, (k, e)) in map.iter().enumerate() {
                    let comma = if j + 1 < map.len() { "," } else { "" };
                    out.push_str(&format!(
                        "  {}: {}{comma}\n",
                        serde_json::to_string(k)?,
                        serde_json::to_string(e)?
                    ));
                }
                out.push('}');
            }
            _ => out.push_str(&format!(" {}", serde_json::to_string(val)?)),
        }
        out.push_str(if i + 1 < top.len() { ",\n" } else { "\n" });
    }
    out.push_str("}\n");
    Ok(out)
}
