//! `nvproxy abi`: inspect the driver version tree and the per-version ABI tables.
//!
//! ```text
//! nvproxy abi versions          the tree: version, parent, supported/unqualified, checksum
//! nvproxy abi show 580.142      one version's escapes, UVM ioctls, controls and classes
//! nvproxy abi diff 570.211.01 575.64.05
//! nvproxy abi check --from-source DIR           a driver tree against the tree
//! nvproxy abi import --from-source DIR --out F  a node file for a version the tree lacks
//! ```
//!
//! The choice of tables for `nvproxy serve` is `nvproxy_config::abi_tables`.

use std::path::{Path, PathBuf};

use abi_import::host;
use anyhow::{Context, Result, anyhow};
use nvproxy_abi::{AbiNode, DriverVersion, Support, render};

/// Subcommands of `nvproxy abi`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum AbiCommand {
    /// List the known driver versions as a tree.
    Versions,
    /// Print one version's four tables.
    Show {
        /// Exact driver version, e.g. 535.216.03 or 580.142.
        version: String,
    },
    /// Print what changes in the tables from version A to version B.
    Diff {
        /// The old version.
        a: String,
        /// The new version.
        b: String,
    },
    /// Compare a driver source tree with the tree: `VERSION: matches node N`, or every
    /// difference from the nearest node (needs a C compiler).
    Check {
        /// A checkout of the driver's tag of NVIDIA/open-gpu-kernel-modules (or its DKMS tree).
        #[arg(long, value_name = "DIR")]
        from_source: PathBuf,
    },
    /// Write a node file for a driver version the tree lacks, for `[daemon] abi_dir`.
    Import {
        /// A checkout of the driver's tag of NVIDIA/open-gpu-kernel-modules (or its DKMS tree).
        #[arg(long, value_name = "DIR")]
        from_source: PathBuf,
        /// The node file to write (e.g. /etc/nvproxy/abi.d/VERSION.json).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

fn lookup(text: &str) -> Result<&'static AbiNode> {
    let version: DriverVersion = text.parse().map_err(|e| anyhow!("{e}"))?;
    nvproxy_abi::find(&version).map_err(|e| anyhow!("{e}"))
}

/// The text a subcommand prints.
pub fn render(cmd: &AbiCommand) -> Result<String> {
    Ok(match cmd {
        AbiCommand::Versions => render::versions(),
        AbiCommand::Show { version } => {
            let node = lookup(version).with_context(|| format!("abi show {version}"))?;
            let mut text = render::show(&node.version, &node.tables());
            if let Some(sum) = node.installer_sha256 {
                let at = text.find('\n').map_or(text.len(), |i| i + 1);
                text.insert_str(
                    at,
                    &format!("installer sha256 {sum} (gVisor's version.go)\n"),
                );
            }
            text
        }
        AbiCommand::Diff { a, b } => {
            let na = lookup(a).with_context(|| format!("abi diff {a} {b}: the old version"))?;
            let nb = lookup(b).with_context(|| format!("abi diff {a} {b}: the new version"))?;
            render::diff((&na.version, &na.tables()), (&nb.version, &nb.tables()))
        }
        AbiCommand::Check { from_source } => check(from_source)?,
        AbiCommand::Import { from_source, out } => import(from_source, out)?,
    })
}

fn check(dir: &Path) -> Result<String> {
    let extract = host::extract_from_source(dir)?;
    Ok(host::check(&extract)?.render())
}

fn import(dir: &Path, out: &Path) -> Result<String> {
    let extract = host::extract_from_source(dir)?;
    let source = format!("nvproxy abi import --from-source {}", dir.display());
    let file = host::import(&extract, &source)?;
    let text = host::node_file_text(&file)?;
    // The file must load as written.
    let node = host::verify(&text, out).context("the node file just made does not verify")?;
    std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
    let denied = file["denied"].as_array().map_or(0, Vec::len);
    let changes = file["changes"].as_array().map_or(0, Vec::len);
    let support = match (&node.support, &node.reason) {
        (Support::Unqualified, Some(r)) => format!("unqualified: {r}"),
        _ => "supported".to_owned(),
    };
    Ok(format!(
        "wrote {}: {} from node {} with {changes} changes; {denied} entries the parent lacks stay \
         denied; {support}\n",
        out.display(),
        node.version,
        node.parent
    ))
}

/// Runs `nvproxy abi ...`: prints to stdout; a bad or unknown version is an error (exit nonzero).
pub fn run(cmd: &AbiCommand) -> Result<()> {
    print!("{}", render(cmd)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_show_unknown_version_names_nearest_ancestor() {
        let err = render(&AbiCommand::Show {
            version: "580.300.01".into(),
        })
        .unwrap_err();
        assert!(format!("{err:#}").contains("580.173.02"), "{err:#}");
    }

    #[test]
    fn test_show_malformed_version_is_an_error() {
        assert!(
            render(&AbiCommand::Show {
                version: "580".into()
            })
            .is_err()
        );
    }

    #[test]
    fn test_show_unknown_version_names_the_admins_choices() {
        let err = render(&AbiCommand::Show {
            version: "535.400.01".into(),
        })
        .unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.starts_with("abi show 535.400.01: nvproxy has no ABI tables for driver 535.400.01")
                && msg.contains("535.309.01")
                && msg.contains("`[daemon] abi_version = \"535.309.01\"`"),
            "{msg}"
        );
    }

    #[test]
    fn test_diff_names_the_bad_version() {
        let err = render(&AbiCommand::Diff {
            a: "535.216.03".into(),
            b: "999.1.1".into(),
        })
        .unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.starts_with("abi diff 535.216.03 999.1.1: the new version: \"999.1.1\""),
            "{msg}"
        );
    }

    #[test]
    fn test_diff_570_575_shows_dram_renumbering() {
        let out = render(&AbiCommand::Diff {
            a: "570.211.01".into(),
            b: "575.64.05".into(),
        });
        assert!(out.unwrap().contains(
            "NV2080_CTRL_CMD_FB_QUERY_DRAM_ENCRYPTION_STATUS: renumbered 0x20801359 -> 0x20801358"
        ));
    }
}
