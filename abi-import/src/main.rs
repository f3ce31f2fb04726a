//! `abi-import`: the facts pipeline and the version tree generator.
//!
//! ```text
//! abi-import add DIR [--parent V] [--sha256 H] [--note T]  a release into the tree, one step
//! abi-import from-source DIR --out FACTS.json [--version V] [--commit C]
//!                                                      derives a facts file from driver sources
//! abi-import extract FACTS.json [--allowlist TSV] [--out DIR]   writes DIR/<version>.json
//! abi-import delta OLD.json NEW.json                   the tree delta between two extracts
//! abi-import tree INDEX.tsv --out generated.rs         regenerates the tree from the index
//! abi-import suggest EXTRACT.json [--base VERSION]     the delta against an existing node
//! ```
//! See `ADDING_A_DRIVER_VERSION.md` at the repository root.

#![forbid(unsafe_code)]

use abi_import::{add, extract, from_source, suggest, tree_gen};

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

const USAGE: &str = "usage:
  abi-import extract FACTS.json [--allowlist nvproxy-allowlist.tsv] [--out nvproxy-abi/facts]
  abi-import suggest EXTRACT.json [--base VERSION]
  abi-import from-source DIR --out FACTS.json [--version VERSION] [--commit COMMIT]
  abi-import delta OLD_EXTRACT.json NEW_EXTRACT.json
  abi-import tree nvproxy-abi/facts/index.tsv --out nvproxy-abi/src/tree/generated.rs
  abi-import add DIR [--parent VERSION] [--sha256 HASH] [--note TEXT]
      (from the repository root: facts into nvproxy-abi/facts, a row in its index.tsv,
       nvproxy-abi/src/tree/generated.rs regenerated)

from-source: DIR is a checkout (or `git archive`) of a tag of NVIDIA/open-gpu-kernel-modules.
  Compiles its public headers with the system C compiler ($CC, else cc) and writes the
  abi-facts JSON (same shape as abi-facts/<version>.json): escape, UVM, control and class
  numbers, every struct's size, alignment, fields, pointers and fds, and the usage facts
  parsed from the kernel sources (class/control params, flags, deep-copy controls).
  --version defaults to NVIDIA_VERSION in DIR/version.mk; --commit defaults to the
  checked-out commit when DIR is a git work tree (else null).";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, rest) = args.split_first().context(USAGE)?;
    if matches!(mode.as_str(), "--help" | "-h" | "help") {
        println!("{USAGE}");
        return Ok(());
    }
    let (path, opts) = rest.split_first().context(USAGE)?;
    let opt = |name: &str| -> Result<Option<&String>> {
        match opts.iter().position(|o| o == name) {
            None => Ok(None),
            Some(i) => opts
                .get(i + 1)
                .map(Some)
                .with_context(|| format!("{name} needs a value")),
        }
    };
    let flags = if mode == "delta" {
        &opts[1.min(opts.len())..]
    } else {
        opts
    };
    for o in flags.iter().step_by(2) {
        if !matches!(
            o.as_str(),
            "--allowlist"
                | "--out"
                | "--base"
                | "--version"
                | "--commit"
                | "--parent"
                | "--sha256"
                | "--note"
        ) {
            bail!("unknown option {o}\n{USAGE}");
        }
    }
    match mode.as_str() {
        "extract" => {
            let out =
                opt("--out")?.map_or_else(|| PathBuf::from("nvproxy-abi/facts"), PathBuf::from);
            let written =
                extract::run(path.as_ref(), opt("--allowlist")?.map(|p| p.as_ref()), &out)?;
            println!("wrote {}", written.display());
            Ok(())
        }
        "suggest" => {
            print!(
                "{}",
                suggest::run(path.as_ref(), opt("--base")?.map(String::as_str))?
            );
            Ok(())
        }
        "delta" => {
            let new = opts.first().context("delta needs OLD.json NEW.json")?;
            print!("{}", tree_gen::run_delta(path.as_ref(), new.as_ref())?);
            Ok(())
        }
        "add" => {
            let opts = add::AddOptions {
                parent: opt("--parent")?.cloned(),
                sha256: opt("--sha256")?.cloned(),
                note: opt("--note")?.cloned(),
            };
            print!(
                "{}",
                add::run(
                    path.as_ref(),
                    "nvproxy-abi/facts".as_ref(),
                    "nvproxy-abi/src/tree/generated.rs".as_ref(),
                    &opts
                )?
            );
            Ok(())
        }
        "tree" => {
            let out = opt("--out")?.context("tree needs --out FILE")?;
            let n = tree_gen::run_tree(path.as_ref(), out.as_ref())?;
            println!("wrote {out}: {n} nodes");
            Ok(())
        }
        "from-source" => {
            let out = opt("--out")?.context("from-source needs --out FILE")?;
            let opts = from_source::Options {
                version: opt("--version")?.cloned(),
                commit: opt("--commit")?.cloned(),
            };
            from_source::run(path.as_ref(), out.as_ref(), &opts)?;
            println!("wrote {out}");
            Ok(())
        }
        _ => bail!("unknown mode {mode}\n{USAGE}"),
    }
}
