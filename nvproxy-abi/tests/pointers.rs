//! Pointer-safety parity: the data that keeps tenant pointers and fds away from the driver,
//! checked against the facts of every node (`facts/<version>.json`: `unsafe_fields` holds the
//! facts' `pointers`, found at any depth of a struct, and `fds` of every struct the tables name;
//! `embedded_pointer_controls` the controls whose pointers RM itself copies).
//!
//! - An entry marked [`Translation::Simple`] is copied to the driver as opaque bytes, so its
//!   param struct must have no pointer and no fd member, except the address values the driver
//!   never dereferences ([`ADDRESS_MEMBERS`]).
//! - The embedded-pointer table ([`nvproxy_abi::embedded`]) equals the facts'
//!   `embedded_pointer_controls` for every control in the node's table: same pointer offsets,
//!   element sizes, counts and copy directions.

mod common;

use common::facts;
use nvproxy_abi::embedded::{ADDRESS_MEMBERS, Count, Embedded, embedded};
use nvproxy_abi::{DriverAbi, Translation, nodes};
use serde_json::Value;

/// Type names that are no struct: plain ids.
const PLAIN: [&str; 3] = ["NvHandle", "NvU32", "NvU32[]"];

/// Why `params` may not be copied as opaque bytes, if it may not.
fn unsafe_members(f: &Value, params: &str) -> Result<Option<String>, String> {
    if PLAIN.contains(&params) {
        return Ok(None);
    }
    if f["struct_sizes"].get(params).is_none() {
        return Err(format!("{params}: no facts for the struct"));
    }
    let u = &f["unsafe_fields"][params];
    let members = |key: &str| -> Vec<(String, u64)> {
        u[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                (
                    m[0].as_str().unwrap_or("?").to_owned(),
                    m[1].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    let address_value = |path: &str| {
        ADDRESS_MEMBERS
            .iter()
            .any(|(s, m, _)| *s == params && *m == path)
    };
    let ptrs: Vec<String> = members("pointers")
        .into_iter()
        .filter(|(path, _)| !address_value(path))
        .map(|(path, at)| format!("{path} at {at}"))
        .collect();
    let fds: Vec<String> = members("fds")
        .into_iter()
        .map(|(path, at)| format!("{path} at {at}"))
        .collect();
    if ptrs.is_empty() && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some(format!("pointers {ptrs:?}, fds {fds:?}")))
}

fn simple_entries_with_pointers(abi: &DriverAbi, f: &Value) -> Vec<String> {
    let mut entries: Vec<(String, Vec<&str>)> = Vec::new();
    let simple = Translation::Simple;
    for e in abi.escapes.values().filter(|e| e.translation == simple) {
        entries.push((format!("escape {}", e.name), e.params.to_vec()));
    }
    for e in abi.uvm.values().filter(|e| e.translation == simple) {
        entries.push((format!("UVM {}", e.name), e.params.into_iter().collect()));
    }
    for e in abi.controls.values().filter(|e| e.translation == simple) {
        let who = format!("control {} ({:#x})", e.name, e.cmd);
        entries.push((who, e.params.into_iter().collect()));
    }
    for e in abi.classes.values().filter(|e| e.translation == simple) {
        let who = format!("class {} ({:#x})", e.name, e.class);
        entries.push((who, e.params.into_iter().collect()));
    }
    let mut errs = Vec::new();
    for (who, params) in entries {
        for p in params {
            match unsafe_members(f, p) {
                Ok(None) => {}
                Ok(Some(why)) => errs.push(format!("{who} is Simple, but {p} has {why}")),
                Err(e) => errs.push(format!("{who}: {e}")),
            }
        }
    }
    errs
}

#[test]
fn test_simple_entries_have_no_pointer_or_fd_member_in_every_node() {
    let mut errs = Vec::new();
    for node in nodes() {
        let v = node.version.to_string();
        let errors = simple_entries_with_pointers(&node.tables(), &facts(node.facts));
        errs.extend(errors.into_iter().map(|e| format!("{v}: {e}")));
    }
    assert!(
        errs.is_empty(),
        "{} mismatches:\n{}",
        errs.len(),
        errs.join("\n")
    );
}

/// The offset of member `path` in the extracted layout of `params`.
fn member_offset(f: &Value, params: &str, path: &str) -> Option<usize> {
    let fields = f["structs"][params]["fields"].as_array()?;
    let m = fields.iter().find(|m| m[0].as_str() == Some(path))?;
    usize::try_from(m[1].as_u64()?).ok()
}

/// The facts' copies of one deep-copy control, in our table's terms.
fn copies_from_facts(f: &Value, name: &str, e: &Value) -> Result<Vec<Embedded>, String> {
    for key in ["only_if", "special"] {
        if let Some(why) = e.get(key) {
            return Err(format!("{name}: {key} {why}: needs hand-written handling"));
        }
    }
    let params = e["params"].as_str().ok_or(format!("{name}: no params"))?;
    let mut out = Vec::new();
    for c in e["copies"].as_array().into_iter().flatten() {
        let count = match &c["count"] {
            // embeddedParamCopyIn computes GET_P2P_CAPS's count as the local `numEntries =
            // gpuCount * gpuCount` (zero when the pointer is null).
            Value::String(s) if s == "numEntries" => {
                let at = member_offset(f, params, "gpuCount");
                Count::Square(at.ok_or(format!("{name}: no gpuCount in {params}"))?)
            }
            Value::String(s) => {
                let at = member_offset(f, params, s);
                Count::Field(at.ok_or(format!("{name}: no member {s} in {params}"))?)
            }
            other => return Err(format!("{name}: count {other} is not a member")),
        };
        let num = |k: &str| {
            c[k].as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or(format!("{name}: {k} {} is not a number", c[k]))
        };
        out.push(Embedded {
            ptr: num("ptr_offset")?,
            count,
            elem: num("elem_size")?,
            copy_in: c["copy_in"].as_bool() == Some(true),
            copy_out: c["copy_out"].as_bool() == Some(true),
        });
    }
    out.sort_by_key(|e| e.ptr);
    Ok(out)
}

fn embedded_table_against_facts(abi: &DriverAbi, f: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    let without_method: Vec<&str> = f["controls_without_rm_method"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for c in abi.controls.values() {
        let mut ours = embedded(c.cmd, c.param_size).to_vec();
        ours.sort_by_key(|e| e.ptr);
        let fact = &f["embedded_pointer_controls"][c.name];
        if fact.is_null() {
            // No deep copy in embedded_param_copy.c. A control without an RM method is either
            // one of RM's deprecated V1 controls, whose converter (rmapi_deprecated_control.c)
            // copies the same list pointer, or not served at all: redirecting its pointer to a
            // daemon buffer is what keeps the tenant address away from the driver either way.
            if !ours.is_empty() && !without_method.contains(&c.name) {
                errs.push(format!(
                    "control {} ({:#x}): in the embedded-pointer table, the driver copies nothing",
                    c.name, c.cmd
                ));
            }
            continue;
        }
        match copies_from_facts(f, c.name, fact) {
            Err(e) => errs.push(e),
            // RM copies fewer pointers than the params have and uses the rest as they are (a
            // user address in kernel mode): no translation makes that safe, so the node must
            // make the control admin-only (abi-import's `uncopied_pointer` rule).
            Ok(theirs) if theirs.iter().all(|t| ours.contains(t)) && theirs.len() < ours.len() => {
                if !c.caps.is_empty() {
                    errs.push(format!(
                        "control {} ({:#x}): RM copies {} of its {} pointers and uses the rest \
                         unchecked, but the control is enabled by {}",
                        c.name,
                        c.cmd,
                        theirs.len(),
                        ours.len(),
                        c.caps
                    ));
                }
            }
            Ok(theirs) if theirs != ours => errs.push(format!(
                "control {} ({:#x}, {} bytes): embedded {ours:?}, driver {theirs:?}",
                c.name, c.cmd, c.param_size
            )),
            Ok(_) => {}
        }
        if c.translation == Translation::Simple {
            errs.push(format!(
                "control {}: deep-copied by RM, marked Simple",
                c.name
            ));
        }
    }
    errs
}

#[test]
fn test_embedded_pointer_table_equals_the_facts_for_every_node() {
    let mut errs = Vec::new();
    let mut checked = 0;
    for node in nodes() {
        let v = node.version.to_string();
        let f = facts(node.facts);
        let abi = node.tables();
        checked += abi
            .controls
            .values()
            .filter(|c| !f["embedded_pointer_controls"][c.name].is_null())
            .count();
        let errors = embedded_table_against_facts(&abi, &f);
        errs.extend(errors.into_iter().map(|e| format!("{v}: {e}")));
    }
    assert!(
        errs.is_empty(),
        "{} mismatches:\n{}",
        errs.len(),
        errs.join("\n")
    );
    assert!(
        checked >= nodes().len() * 12,
        "only {checked} deep-copy controls checked"
    );
}

#[test]
fn test_every_embedded_pointer_control_is_marked_pointer() {
    for node in nodes() {
        for c in node.tables().controls.values() {
            if !embedded(c.cmd, c.param_size).is_empty() {
                assert_eq!(
                    c.translation,
                    Translation::Pointer,
                    "{}: {}",
                    node.version,
                    c.name
                );
            }
        }
    }
}

#[test]
fn test_every_address_member_is_a_pointer_in_the_facts() {
    // An address-value exception must name a pointer the facts list, or it hides nothing and
    // is stale.
    let f = facts(
        nvproxy_abi::nodes()
            .iter()
            .max_by_key(|n| n.version)
            .unwrap()
            .facts,
    );
    for (strukt, member, _) in ADDRESS_MEMBERS {
        let ptrs = f["unsafe_fields"][strukt]["pointers"].as_array().cloned();
        let listed = ptrs.into_iter().flatten().any(|p| p[0] == member);
        assert!(listed, "{strukt}.{member} is no pointer in the facts");
    }
}
