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

#[cfg(test)]
mod tests {
    use super::*;

    fn node_dir(name: &str, files: &[(&str, String)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nvproxy-abi-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (f, text) in files {
            std::fs::write(dir.join(f), text).unwrap();
        }
        dir
    }

    /// A node file for 580.300.01 (580.142's facts renamed, one control resized).
    fn node_file() -> String {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../nvproxy-abi/facts/580.142.json"
        );
        let mut f: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        f["driver_version"] = serde_json::json!("580.300.01");
        f["struct_sizes"]["NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS"] = serde_json::json!(68);
        host::node_file_text(&host::import(&f, "test").unwrap()).unwrap()
    }

    #[test]
    fn test_host_tables_of_a_known_version_are_its_node() {
        let (t, label) = host_tables("580.142\n", &AbiChoice::default()).unwrap();
        assert_eq!(label, "node 580.142");
        assert_eq!(
            t,
            nvproxy_abi::find(&"580.142".parse().unwrap())
                .unwrap()
                .tables()
        );
    }

    #[test]
    fn test_host_tables_of_an_unknown_version_is_the_error_with_the_choices() {
        let err = host_tables("580.300.01", &AbiChoice::default()).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("nvproxy has no ABI tables for driver 580.300.01")
                && msg.contains("The choices: (1)")
                && msg.contains("nvproxy serve --abi-version 580.173.02"),
            "{msg}"
        );
    }

    #[test]
    fn test_host_tables_override_serves_an_unknown_version_with_a_named_node() {
        let choice = AbiChoice {
            abi_version: Some("580.142".into()),
            abi_dir: None,
        };
        let (t, label) = host_tables("580.300.01", &choice).unwrap();
        assert_eq!(
            label,
            "node 580.142, overriding driver 580.300.01 (abi_version)"
        );
        assert_eq!(
            t,
            nvproxy_abi::find(&"580.142".parse().unwrap())
                .unwrap()
                .tables()
        );
        let bad = AbiChoice {
            abi_version: Some("580.299.01".into()),
            abi_dir: None,
        };
        let msg = format!("{:#}", host_tables("580.300.01", &bad).unwrap_err());
        assert!(msg.contains("no node or node file for 580.299.01"), "{msg}");
    }

    #[test]
    fn test_host_tables_loads_a_verified_node_file_for_the_host_version() {
        let dir = node_dir("load", &[("580.300.01.json", node_file())]);
        let choice = AbiChoice {
            abi_version: None,
            abi_dir: Some(dir.clone()),
        };
        let (t, label) = host_tables("580.300.01", &choice).unwrap();
        assert!(
            label.starts_with("node file ") && label.ends_with("(parent 580.173.02)"),
            "{label}"
        );
        assert_eq!(t.controls[&0x2080_0110].param_size, 68);
        // A node file can also be what the override names.
        let (_, label) = host_tables(
            "580.301.01",
            &AbiChoice {
                abi_version: Some("580.300.01".into()),
                abi_dir: Some(dir.clone()),
            },
        )
        .unwrap();
        assert!(label.contains("overriding driver 580.301.01"), "{label}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_host_tables_refuses_to_start_on_a_node_file_that_does_not_verify() {
        let tampered = node_file().replace("\"supported\"", "\"unqualified\"");
        let dir = node_dir("bad", &[("580.300.01.json", tampered)]);
        let choice = AbiChoice {
            abi_version: None,
            abi_dir: Some(dir.clone()),
        };
        let msg = format!("{:#}", host_tables("580.142", &choice).unwrap_err());
        assert!(
            msg.contains("[daemon] abi_dir")
                && msg.contains("580.300.01.json")
                && msg.contains("without a reason"),
            "{msg}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
