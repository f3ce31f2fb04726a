//! `nvproxy abi`: inspect the driver version tree and the per-version ABI tables.
//!
//! ```text
//! nvproxy abi versions          the tree: version, parent, supported/unqualified, checksum
//! nvproxy abi show 580.142      one version's escapes, UVM ioctls, controls and classes
//! nvproxy abi diff 570.211.01 575.64.05
//! ```

use anyhow::{Context, Result, anyhow};
use nvproxy_abi::{AbiNode, DriverVersion, render};

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
            render::show(&node.version, &node.tables())
        }
        AbiCommand::Diff { a, b } => {
            let na = lookup(a).with_context(|| format!("abi diff {a} {b}: the old version"))?;
            let nb = lookup(b).with_context(|| format!("abi diff {a} {b}: the new version"))?;
            render::diff((&na.version, &na.tables()), (&nb.version, &nb.tables()))
        }
    })
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
            version: "580.159.03".into(),
        })
        .unwrap_err();
        assert!(format!("{err:#}").contains("580.142"), "{err:#}");
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
    fn test_show_unknown_version_promises_no_override() {
        let err = render(&AbiCommand::Show {
            version: "535.309.01".into(),
        })
        .unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.starts_with("abi show 535.309.01: nvproxy has no ABI tables for driver 535.309.01")
                && msg.contains("535.288.01")
                && !msg.contains("override"),
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
