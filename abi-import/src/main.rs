//! `abi-import`: turns a full abi-facts JSON file into the compact extract the parity test
//! reads, and suggests the tree delta a new driver version needs.
//!
//! ```text
//! abi-import extract FACTS.json [--allowlist TSV] [--out DIR]   writes DIR/<version>.json
//! abi-import suggest EXTRACT.json [--base VERSION]              prints a delta for tree/deltas.rs
//! ```
//! See `ADDING_A_DRIVER_VERSION.md` at the repository root.

mod extract;
mod suggest;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

const USAGE: &str = "usage:
  abi-import extract FACTS.json [--allowlist nvproxy-allowlist.tsv] [--out nvproxy-abi/facts]
  abi-import suggest EXTRACT.json [--base VERSION]";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, rest) = args.split_first().context(USAGE)?;
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
    for o in opts.iter().step_by(2) {
        if !matches!(o.as_str(), "--allowlist" | "--out" | "--base") {
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
        _ => bail!("unknown mode {mode}\n{USAGE}"),
    }
}
