//! `from-source`: derive an abi-facts file from a driver source tree.
//!
//! The tree is a checkout (or `git archive`) of a tag of NVIDIA/open-gpu-kernel-modules. The
//! method is the one described in `abi-facts/README.md` ("How the layouts were obtained"):
//!
//! 1. Two translation units are generated: one including the SDK headers (`nvos.h`, `class/`,
//!    `alloc/`, `ctrl/`) and the Unix ioctl headers, one including the UVM ioctl headers. They
//!    are compiled with `-g`, and the struct and member list is read from the DWARF that
//!    `readelf --debug-dump=info` prints (`layouts`).
//! 2. A generated C program prints `sizeof` and `_Alignof` of every struct; sizes are checked
//!    against the debugging information.
//! 3. Candidate macros are found by scanning the headers' `#define`s and evaluated by the
//!    compiler; those that are not integer constant expressions are dropped (`numbers`).
//! 4. The facts about how the kernel uses the structs are parsed from the few kernel sources
//!    named in the README (`usage`).

mod cc;
mod dwarf;
mod layouts;
mod numbers;
mod source_tree;
mod usage;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

use source_tree::{Tree, UVM};

/// Options of `from-source`.
pub struct Options {
    /// The version to record (default: `NVIDIA_VERSION` of `version.mk`).
    pub version: Option<String>,
    /// The commit to record (default: the work tree's `HEAD`, if it is one).
    pub commit: Option<String>,
}

/// The layouts of one translation unit: typedef name -> layout and alignment.
struct Unit {
    structs: BTreeMap<String, (layouts::Layout, u64)>,
    /// Typedef names reachable from the UVM params structs (only for the UVM unit).
    reachable: Option<std::collections::BTreeSet<String>>,
}

fn unit(
    cc: &cc::Cc,
    tree: &Tree,
    name: &str,
    source: &str,
    includes: &[PathBuf],
    uvm: bool,
) -> Result<Unit> {
    let obj = cc.object(name, source, includes)?;
    let info = cc.readelf(&obj, "info")?;
    let lines = cc.readelf(&obj, "rawline")?;
    let dw = dwarf::Dwarf::parse(&info)?;
    let files = dwarf::file_table(&lines)?;
    let root = format!("{}/", tree.root.display());
    let header_of = |i: usize| -> Option<String> {
        let f = dw.dies[i].decl_file?;
        let p = files.get(&f)?;
        p.strip_prefix(&root).map(str::to_owned)
    };
    let recs = layouts::record_typedefs(&dw, &header_of);
    let reachable = uvm.then(|| {
        let roots: Vec<usize> = recs
            .iter()
            .filter(|(n, (_, _, h))| {
                n.starts_with("UVM_") && n.ends_with("_PARAMS") && h.starts_with(UVM)
            })
            .map(|(_, (t, _, _))| *t)
            .collect();
        layouts::reachable(&dw, &roots)
    });
    // sizeof / _Alignof of every typedef, from a generated program.
    let names: Vec<&String> = recs.keys().collect();
    let mut prog = String::from("#include <stdio.h>\n");
    prog.push_str(source);
    prog.push_str("int main(void) {\n");
    for n in &names {
        prog.push_str(&format!(
            "  printf(\"%zu %zu\\n\", sizeof({n}), _Alignof({n}));\n"
        ));
    }
    prog.push_str("  return 0;\n}\n");
    let out = cc.run_program(&format!("{name}_sizes"), &prog, includes)?;
    let mut structs = BTreeMap::new();
    let mut lines_out = out.lines();
    for n in names {
        let line = lines_out
            .next()
            .context("size program printed too little")?;
        let (size, align) = line
            .split_once(' ')
            .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
            .context("size program printed garbage")?;
        let (_, rec, header) = &recs[n];
        let l =
            layouts::layout(&dw, *rec, header.clone()).with_context(|| format!("struct {n}"))?;
        if l.size != size {
            bail!(
                "{n}: sizeof is {size} but the debugging information says {}",
                l.size
            );
        }
        structs.insert(n.clone(), (l, align));
    }
    Ok(Unit { structs, reachable })
}

/// The abi-facts of the driver source tree in `dir` (same shape as `abi-facts/<version>.json`).
pub fn extract(dir: &Path, opts: &Options) -> Result<Value> {
    let tree = Tree::open(dir)?;
    let cc = cc::Cc::new()?;
    let gcc = cc.version()?;
    let version = match opts.version.clone().or_else(|| tree.version()) {
        Some(v) => v,
        None => bail!(
            "{} has no version.mk; give the driver version with --version",
            dir.display()
        ),
    };

    let tu1 = tree.tu1()?;
    let u1 = unit(&cc, &tree, "tu1", &tu1, &tree.includes1(), false)?;
    let tu2 = tree.tu_uvm();
    let u2 = unit(&cc, &tree, "tu_uvm", &tu2, &tree.includes_uvm(), true)?;

    let mut structs: BTreeMap<String, Value> = BTreeMap::new();
    for (n, (l, a)) in &u1.structs {
        structs.insert(n.clone(), l.to_json(*a));
    }
    let reach = u2.reachable.clone().unwrap_or_default();
    for (n, (l, a)) in &u2.structs {
        if reach.contains(n) && !structs.contains_key(n) {
            structs.insert(n.clone(), l.to_json(*a));
        }
    }

    let nums = numbers::evaluate(&cc, &tree, &tu1, &tu2)?;
    let usage = usage::parse(&tree, &nums, &structs)?;

    let count_with = |key: &str| structs.values().filter(|s| s.get(key).is_some()).count();
    let mut facts = Map::new();
    facts.insert("driver_version".into(), json!(version));
    facts.insert(
        "source".into(),
        json!(format!("NVIDIA/open-gpu-kernel-modules tag {version}")),
    );
    let commit = opts.commit.clone().or_else(|| tree.git_head());
    facts.insert("commit".into(), json!(commit));
    facts.insert("abi".into(), json!(format!("x86_64 Linux (LP64), {gcc}")));
    facts.insert(
        "counts".into(),
        json!({
            "escapes": nums.escapes.len(),
            "uvm_ioctls": nums.uvm_ioctls.len(),
            "classes": nums.classes.len(),
            "controls": nums.controls.len(),
            "control_params": usage.control_params.len(),
            "structs": structs.len(),
            "structs_with_pointers": count_with("pointers"),
            "structs_with_fds": count_with("fds"),
            "embedded_pointer_controls": usage.embedded.len(),
        }),
    );
    facts.insert("escapes".into(), numbers::to_json(&nums.escapes)?);
    facts.insert("escape_params".into(), usage.escape_params);
    facts.insert("escape_size_check".into(), usage.escape_size_check);
    facts.insert("constants".into(), numbers::to_json(&nums.constants)?);
    facts.insert("uvm_ioctls".into(), numbers::to_json(&nums.uvm_ioctls)?);
    facts.insert("uvm_ioctl_params".into(), usage.uvm_ioctl_params);
    facts.insert(
        "uvm_init_flags".into(),
        numbers::to_json(&nums.uvm_init_flags)?,
    );
    facts.insert(
        "uvm_constants".into(),
        numbers::to_json(&nums.uvm_constants)?,
    );
    facts.insert("classes".into(), numbers::to_json(&nums.classes)?);
    facts.insert("class_alloc_params".into(), usage.class_alloc_params);
    facts.insert("controls".into(), numbers::to_json(&nums.controls)?);
    facts.insert(
        "legacy_control_categories".into(),
        numbers::to_json(&nums.legacy_control_categories)?,
    );
    facts.insert("control_params".into(), Value::Object(usage.control_params));
    facts.insert(
        "control_params_inferred".into(),
        usage.control_params_inferred,
    );
    facts.insert("control_flags".into(), usage.control_flags);
    facts.insert("rmctrl_flags".into(), numbers::to_json(&nums.rmctrl_flags)?);
    facts.insert(
        "unnamed_control_methods".into(),
        usage.unnamed_control_methods,
    );
    facts.insert(
        "embedded_pointer_controls".into(),
        Value::Object(usage.embedded),
    );
    let unresolved: Map<String, Value> = usage.unresolved;
    facts.insert(
        "structs".into(),
        Value::Object(structs.into_iter().collect()),
    );
    facts.insert("unresolved_types".into(), Value::Object(unresolved));
    facts.insert("skipped".into(), json!([]));
    Ok(Value::Object(facts))
}

/// `abi-import from-source DIR --out FILE`.
pub fn run(dir: &Path, out: &Path, opts: &Options) -> Result<()> {
    let facts = extract(dir, opts)?;
    let mut text = serde_json::to_string_pretty(&facts)?;
    text.push('\n');
    fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}
