//! Plain-text rendering of the tree and the tables, for `nvproxy abi versions | show | diff`.
//! Pure functions: they return `String`s and print nothing.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::tree::{AbiNode, Support, children, nodes};
use crate::{DriverAbi, DriverVersion, ParamSize};

fn support_name(s: Support) -> &'static str {
    match s {
        Support::Supported => "supported",
        Support::Unqualified => "unqualified",
    }
}

/// The version tree, one node per line: a node's child with the most descendants follows it at
/// the same indentation, its other children fork below it, indented (`├──`);
/// version, support, installer checksum (or `-`), parent (or `-`) and a note (for an
/// unqualified node, first the reason); then lines on what the columns mean.
pub fn versions() -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<38} {:<11}  {:<SHA_SHOWN$}  {:<10}  note",
        "version", "support", "sha256", "parent"
    );
    for root in nodes().iter().filter(|n| n.parent.is_none()) {
        tree_lines(&mut out, root, "", "");
    }
    let supported = nodes()
        .iter()
        .filter(|n| n.support == Support::Supported)
        .count();
    let _ = writeln!(
        out,
        "\n{} versions, {supported} supported. support: supported = its tables and every \
         modelled struct pass the parity test against the facts of its headers; unqualified = \
         not qualified, for the reason given (served the same way, with a warning)",
        nodes().len()
    );
    let _ = writeln!(
        out,
        "sha256: of NVIDIA's x86_64 .run installer, as gVisor's version.go lists it for the \
         versions it supports (copied, not computed by us), its first {SHA_SHOWN} digits \
         (`nvproxy abi show VERSION` prints it whole); `-`: none listed"
    );
    out
}

/// Digits of the installer checksum `versions` shows.
const SHA_SHOWN: usize = 16;
/// Characters of a note per line in `versions`.
const NOTE_WIDTH: usize = 64;

/// `text` in lines of at most `width` characters, broken at spaces (a longer word stays whole).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

fn tree_lines(out: &mut String, node: &'static AbiNode, first: &str, rest: &str) {
    let label = format!("{first}{}", node.version);
    let sum = node.installer_sha256.unwrap_or("-");
    let parent = node
        .parent
        .map_or_else(|| "-".to_owned(), |p| p.to_string());
    let alias = if node.same_as_parent {
        " (same tables as parent)"
    } else {
        ""
    };
    let reason = node
        .reason
        .map_or_else(String::new, |r| format!("unqualified: {r}; "));
    let sum = sum.get(..SHA_SHOWN).unwrap_or(sum);
    let note = format!("{reason}{}{alias}", node.note);
    let mut lines = wrap(&note, NOTE_WIDTH).into_iter();
    let _ = writeln!(
        out,
        "{label:<38} {:<11}  {sum:<SHA_SHOWN$}  {parent:<10}  {}",
        support_name(node.support),
        lines.next().unwrap_or_default()
    );
    // A long note goes on below, under its column, after the tree's own continuation.
    for more in lines {
        let _ = writeln!(
            out,
            "{rest:<38} {:<11}  {:<SHA_SHOWN$}  {:<10}  {more}",
            "", "", ""
        );
    }
    // The child with the most descendants continues at the node's own indentation (a release
    // line reads as a column, the main line runs down the left); the others fork, indented.
    let mut kids: Vec<_> = children(&node.version).collect();
    kids.sort_by_key(|k| (descendants(k), k.version));
    let Some(last) = kids.pop() else {
        return;
    };
    for kid in kids {
        tree_lines(out, kid, &format!("{rest}├── "), &format!("{rest}│   "));
    }
    tree_lines(out, last, rest, rest);
}

fn descendants(node: &AbiNode) -> usize {
    children(&node.version).map(|k| 1 + descendants(k)).sum()
}

/// A size rule as text: `48`, `32|48`, `72*n`.
pub fn param_size_text(size: &ParamSize) -> String {
    match size {
        ParamSize::Fixed(n) => n.to_string(),
        ParamSize::OneOf(ns) => ns.iter().map(u32::to_string).collect::<Vec<_>>().join("|"),
        ParamSize::Array { elem } => format!("{elem}*n"),
    }
}

/// One uniform row of any of the four tables.
#[derive(Clone, PartialEq, Eq)]
struct Row {
    number: u32,
    name: &'static str,
    params: String,
    size: String,
    translation: &'static str,
    caps: String,
}

fn rows(abi: &DriverAbi) -> [(&'static str, BTreeMap<u32, Row>); 4] {
    let opt = |p: Option<&str>| p.unwrap_or("-").to_owned();
    [
        (
            "escapes",
            abi.escapes
                .values()
                .map(|e| {
                    let row = Row {
                        number: u32::from(e.nr),
                        name: e.name,
                        params: e.params.join("|"),
                        size: param_size_text(&e.size),
                        translation: e.translation.name(),
                        caps: e.caps.to_string(),
                    };
                    (row.number, row)
                })
                .collect(),
        ),
        (
            "uvm",
            abi.uvm
                .values()
                .map(|e| {
                    let row = Row {
                        number: e.cmd,
                        name: e.name,
                        params: opt(e.params),
                        size: e.param_size.to_string(),
                        translation: e.translation.name(),
                        caps: e.caps.to_string(),
                    };
                    (row.number, row)
                })
                .collect(),
        ),
        (
            "controls",
            abi.controls
                .values()
                .map(|e| {
                    let row = Row {
                        number: e.cmd,
                        name: e.name,
                        params: opt(e.params),
                        size: e.param_size.to_string(),
                        translation: e.translation.name(),
                        caps: e.caps.to_string(),
                    };
                    (row.number, row)
                })
                .collect(),
        ),
        (
            "classes",
            abi.classes
                .values()
                .map(|e| {
                    let row = Row {
                        number: e.class,
                        name: e.name,
                        params: opt(e.params),
                        size: e.param_size.to_string(),
                        translation: e.translation.name(),
                        caps: e.caps.to_string(),
                    };
                    (row.number, row)
                })
                .collect(),
        ),
    ]
}

/// One version's four tables: name, number in hex, param size, translation, caps.
pub fn show(version: &DriverVersion, abi: &DriverAbi) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "driver {version}");
    for (title, table) in rows(abi) {
        let _ = writeln!(out, "\n{title} ({})", table.len());
        let _ = writeln!(
            out,
            "  {:<10}  {:<64}  {:>7}  {:<8}  caps",
            "number", "name", "size", "transl"
        );
        for r in table.values() {
            let _ = writeln!(
                out,
                "  {:<10}  {:<64}  {:>7}  {:<8}  {}",
                format!("{:#x}", r.number),
                r.name,
                r.size,
                r.translation,
                r.caps
            );
        }
    }
    out
}

/// The difference from version `a` to version `b`, per table, matched by name: entries added,
/// removed, renumbered (same name, new number) and changed (old → new size, params, translation
/// or caps).
pub fn diff(a: (&DriverVersion, &DriverAbi), b: (&DriverVersion, &DriverAbi)) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} -> {}", a.0, b.0);
    let mut total = 0;
    for ((title, old), (_, new)) in rows(a.1).into_iter().zip(rows(b.1)) {
        let by_name = |t: &BTreeMap<u32, Row>| -> BTreeMap<&'static str, Row> {
            t.values().map(|r| (r.name, r.clone())).collect()
        };
        let (old, new) = (by_name(&old), by_name(&new));
        let mut lines: Vec<(u32, String)> = Vec::new();
        for (name, o) in &old {
            let Some(n) = new.get(name) else {
                lines.push((o.number, format!("  - {:#x} {name} ({})", o.number, o.size)));
                continue;
            };
            let mut what = Vec::new();
            if o.number != n.number {
                what.push(format!("renumbered {:#x} -> {:#x}", o.number, n.number));
            }
            if o.size != n.size {
                what.push(format!("size {} -> {}", o.size, n.size));
            }
            if o.params != n.params {
                what.push(format!("params {} -> {}", o.params, n.params));
            }
            if o.translation != n.translation {
                what.push(format!(
                    "translation {} -> {}",
                    o.translation, n.translation
                ));
            }
            if o.caps != n.caps {
                what.push(format!("caps {} -> {}", o.caps, n.caps));
            }
            if !what.is_empty() {
                lines.push((
                    n.number,
                    format!("  ~ {:#x} {name}: {}", n.number, what.join(", ")),
                ));
            }
        }
        for (name, n) in new.iter().filter(|(name, _)| !old.contains_key(*name)) {
            let line = format!(
                "  + {:#x} {name} ({}, {}, {})",
                n.number, n.size, n.translation, n.caps
            );
            lines.push((n.number, line));
        }
        lines.sort();
        total += lines.len();
        if !lines.is_empty() {
            let _ = writeln!(out, "\n{title}:");
            for (_, l) in lines {
                let _ = writeln!(out, "{l}");
            }
        }
    }
    if total == 0 {
        let _ = writeln!(out, "\nno differences in the tables");
    }
    out
}
