//! The choice of tables for serving a host driver ([`host_tables`]): the host version's node, a
//! verified node file of `[daemon] abi_dir`, or, named by `[daemon] abi_version` /
//! `--abi-version`, a known version's tables for an unknown host version. Imports nothing of
//! the crate.

use std::path::PathBuf;

use abi_import::host::{self, LoadedNode};
use anyhow::{Context, Result, anyhow, bail};
use nvproxy_abi::{DriverAbi, DriverVersion, Support};

/// Where `serve` takes the host driver's tables from (`[daemon] abi_version`, `abi_dir`).
#[derive(Debug, Clone, Default)]
pub struct AbiChoice {
    /// Serve an unknown host version with this known version's tables.
    pub abi_version: Option<String>,
    /// Directory of node files (`nvproxy abi import`) to verify and load.
    pub abi_dir: Option<PathBuf>,
}

/// The tables `serve` uses for a host driver of `host_version`, and a line saying where they
/// come from: the version's own node; else a verified node file for it; else, with
/// `abi_version`, that known version's tables (warned about loudly); else the unknown-version
/// error with the admin's choices.
pub fn host_tables(host_version: &str, choice: &AbiChoice) -> Result<(DriverAbi, String)> {
    let version: DriverVersion = host_version
        .trim()
        .parse()
        .map_err(|e| anyhow!("the host driver's version: {e}"))?;
    let loaded: Vec<LoadedNode> = match &choice.abi_dir {
        Some(d) => host::load_dir(d).with_context(|| format!("[daemon] abi_dir = {d:?}"))?,
        None => Vec::new(),
    };
    let named = |v: &DriverVersion| -> Option<(DriverAbi, String)> {
        if let Ok(n) = nvproxy_abi::find(v) {
            return Some((n.tables(), format!("node {}", n.version)));
        }
        loaded.iter().find(|l| l.version == *v).map(|l| {
            let label = format!("node file {} (parent {})", l.path.display(), l.parent);
            (l.tables.clone(), label)
        })
    };
    if let Ok(n) = nvproxy_abi::find(&version) {
        if let Some(o) = &choice.abi_version {
            tracing::warn!(
                "[daemon] abi_version = {o:?} ignored: driver {version} has its own node"
            );
        }
        if n.support == Support::Unqualified {
            tracing::warn!(
                "driver {version} is an unqualified node: {}",
                n.reason.unwrap_or("no reason given")
            );
        }
        return Ok((n.tables(), format!("node {version}")));
    }
    if let Some(l) = loaded.iter().find(|l| l.version == version) {
        if let Some(r) = &l.reason {
            tracing::warn!(
                "driver {version}: node file {} is unqualified: {r}",
                l.path.display()
            );
        }
        let label = format!("node file {} (parent {})", l.path.display(), l.parent);
        return Ok((l.tables.clone(), label));
    }
    let unknown = nvproxy_abi::find(&version).unwrap_err();
    let Some(o) = &choice.abi_version else {
        bail!("{unknown}");
    };
    let other: DriverVersion = o
        .parse()
        .map_err(|e| anyhow!("[daemon] abi_version / --abi-version: {e}"))?;
    let Some((tables, label)) = named(&other) else {
        bail!(
            "[daemon] abi_version / --abi-version {other}: no node or node file for {other} \
             either (`nvproxy abi versions` lists the versions)"
        );
    };
    tracing::warn!(
        "SERVING DRIVER {version} WITH THE TABLES OF {other} ([daemon] abi_version / \
         --abi-version): {version} has no node; every number and size nvproxy checks is \
         {other}'s, so requests whose layout changed fail or are misread. `nvproxy abi check \
         --from-source DIR` shows the differences; `nvproxy abi import` makes a node"
    );
    Ok((
        tables,
        format!("{label}, overriding driver {version} (abi_version)"),
    ))
}
