//! Shared by the parity tests: the facts of one version (`facts/<version>.json`, written by
//! `abi-import extract`).

use std::path::PathBuf;

use serde_json::Value;

/// The extracted facts in `facts/<name>.json` (a node's `facts`: shared by the versions of one ABI).
pub fn facts(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("facts")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
