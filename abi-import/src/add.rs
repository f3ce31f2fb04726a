//! `abi-import add DIR`: a new release into the tree in one step.
//!
//! Derives the facts of the driver source tree in `DIR` (`from_source`, `extract`), stores them
//! (reusing the facts file of a version with the same ABI, else writing
//! `facts/<version>.json`), appends the version's row to `facts/index.tsv` and regenerates
//! `tree/generated.rs`. The parent is `--parent`, else, when `DIR` is a git checkout of
//! NVIDIA's repository, the nearest tagged ancestor of its commit (`git describe --tags
//! HEAD^`, the branch history the tree follows), else the newest node of the version's branch
//! that is not newer. A modelled struct no Rust layout matches makes the row unqualified with
//! that reason.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use nvproxy_abi::DriverVersion;
use serde_json::Value;

use crate::tree_gen::{read_index, read_json};

/// Options of `add`.
#[derive(Debug, Default)]
pub struct AddOptions {
    /// The parent node (default: from git, else the branch's nearest node).
    pub parent: Option<String>,
    /// The installer's SHA-256, if known from a source you name in the note.
    pub sha256: Option<String>,
    /// The note (default: the branch and the parent).
    pub note: Option<String>,
}

fn without_identity(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        for k in ["driver_version", "source", "commit"] {
            o.remove(k);
        }
    }
    v
}

fn git_parent(dir: &Path) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["describe", "--tags", "--abbrev=0", "HEAD^"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Adds the tree in `dir` to the index in `facts_dir`; regenerates `generated`. Returns what it
/// did, for printing.
pub fn run(dir: &Path, facts_dir: &Path, generated: &Path, opts: &AddOptions) -> Result<String> {
    let extract = crate::host::extract_from_source(dir)?;
    add_extract(&extract, Some(dir), facts_dir, generated, opts)
}

/// `run` on an extract already made (the tests use committed ones).
pub fn add_extract(
    extract: &Value,
    dir: Option<&Path>,
    facts_dir: &Path,
    generated: &Path,
    opts: &AddOptions,
) -> Result<String> {
    let version: DriverVersion = extract["driver_version"]
        .as_str()
        .context("the facts name no driver_version")?
        .parse()
        .map_err(|e| anyhow!("{e}"))?;
    let index = facts_dir.join("index.tsv");
    let rows = read_index(&index)?;
    if rows.iter().any(|r| r.version == version) {
        bail!("{version} is in {} already", index.display());
    }
    let known = |v: &DriverVersion| rows.iter().any(|r| r.version == *v);
    let parent: DriverVersion = match (&opts.parent, dir.and_then(git_parent)) {
        (Some(p), _) => p.parse().map_err(|e| anyhow!("--parent: {e}"))?,
        (None, Some(g)) if g.parse().is_ok_and(|v: DriverVersion| known(&v)) => g.parse()?,
        _ => rows
            .iter()
            .filter(|r| r.version.major() == version.major() && r.version < version)
            .max_by_key(|r| r.version)
            .map(|r| r.version)
            .with_context(|| {
                format!(
                    "{version} starts a new branch: name its parent with --parent (the release \
                     its tag's commit was made on: `git describe --tags {version}^` in NVIDIA's \
                     repository)"
                )
            })?,
    };
    if !known(&parent) {
        bail!("parent {parent} is not in {}", index.display());
    }
    let mut out = String::new();
    // Share the facts file of a version with the same ABI, else write one.
    let me = without_identity(extract);
    let mut facts = None;
    let mut names: Vec<&str> = rows.iter().map(|r| r.facts.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let other = read_json(&facts_dir.join(format!("{name}.json")))?;
        if without_identity(&other) == me {
            facts = Some(name.to_owned());
            break;
        }
    }
    let facts = match facts {
        Some(f) => {
            let _ = writeln!(out, "{version}: same ABI as facts/{f}.json, shared");
            f
        }
        None => {
            let p: PathBuf = facts_dir.join(format!("{version}.json"));
            fs::write(&p, crate::extract::to_lines(extract)?)
                .with_context(|| format!("writing {}", p.display()))?;
            let _ = writeln!(out, "wrote {}", p.display());
            version.to_string()
        }
    };
    let problems = crate::host::layout_mismatches(extract);
    let support = if problems.is_empty() {
        "supported".to_owned()
    } else {
        format!(
            "unqualified: modelled structs no Rust layout matches: {}",
            problems.join("; ")
        )
    };
    let note = opts.note.clone().unwrap_or_else(|| {
        if parent.major() == version.major() {
            format!("{} branch", version.major())
        } else {
            format!("first {} release; git parent {parent}", version.major())
        }
    });
    let commit = extract["commit"].as_str().unwrap_or("-");
    let sha = opts.sha256.as_deref().unwrap_or("-");
    for field in [&note, &support] {
        if field.contains('\t') || field.contains('\n') {
            bail!("the note and the support must be one line without tabs");
        }
    }
    let mut text = fs::read_to_string(&index)?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let _ = writeln!(
        text,
        "{version}\t{parent}\t{facts}\t{commit}\t{sha}\t{support}\t{note}"
    );
    fs::write(&index, text).with_context(|| format!("writing {}", index.display()))?;
    let _ = writeln!(
        out,
        "added {version} (parent {parent}) to {}",
        index.display()
    );
    if !problems.is_empty() {
        let _ = writeln!(out, "{support}");
    }
    let n = crate::tree_gen::run_tree(&index, generated)?;
    let _ = writeln!(
        out,
        "wrote {} ({n} nodes); the new node takes effect once nvproxy-abi is rebuilt: run \
         `cargo test -p nvproxy-abi -p abi-import`",
        generated.display()
    );
    Ok(out)
}
