//! What `nvproxy exec`/`run` inject into the command: the shim (`LD_PRELOAD`) and the node
//! ids it recognises (`NVPROXY_NODES`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The shim's file name, looked for next to the `nvproxy` binary.
pub const SHIM_NAME: &str = "libnvproxy_preload.so";

/// The value of `NVPROXY_NODES` for the nodes at `paths` (`maj:min,...`).
pub fn node_ids<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Result<String> {
    let mut ids = Vec::new();
    for p in paths {
        let m = std::fs::metadata(p).with_context(|| format!("node {}", p.display()))?;
        ids.push(nvproxy_preload_proto::format_dev(m.rdev()));
    }
    Ok(ids.join(","))
}

/// The shim to inject: `--preload PATH`, else `libnvproxy_preload.so` next to our binary. An
/// error says how to get it.
pub fn shim_path(explicit: Option<&Path>) -> Result<PathBuf> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .context("finding our own executable")?
            .parent()
            .context("our executable has no directory")?
            .join(SHIM_NAME),
    };
    if !path.is_file() {
        anyhow::bail!(
            "the mmap shim {} is missing: build it (`cargo build -p preload`, next to nvproxy), \
             pass --preload PATH, or --no-preload (mmap of the nodes then fails with ENODEV)",
            path.display()
        );
    }
    std::fs::canonicalize(&path).with_context(|| format!("resolving {}", path.display()))
}

/// `LD_PRELOAD` with `shim` appended to what the user set (unless already there).
pub fn ld_preload_with(existing: Option<&str>, shim: &Path) -> String {
    let shim = shim.to_string_lossy();
    match existing.map(str::trim).filter(|e| !e.is_empty()) {
        None => shim.into_owned(),
        Some(e) if e.split([' ', ':']).any(|p| p == shim) => e.to_owned(),
        Some(e) => format!("{e}:{shim}"),
    }
}
