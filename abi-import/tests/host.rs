//! Self-service: check an extract against the tree, import a node file for an unknown version,
//! verify node files. The extracts come from the committed facts (no C compiler needed): an
//! unknown version is a committed extract renamed and edited as a new driver would differ.

use std::path::{Path, PathBuf};

use abi_import::host::{check, import, load_dir, node_file_text, verify};
use nvproxy_abi::{Caps, Support, find};
use serde_json::{Value, json};

fn facts(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../nvproxy-abi/facts")
        .join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// 580.142's facts as an unknown 580.300.01.
fn unknown() -> Value {
    let mut f = facts("580.142");
    f["driver_version"] = json!("580.300.01");
    f["commit"] = Value::Null;
    f
}

/// 580.300.01 with a resized control, a control gone, and a control 580 never had.
fn changed() -> Value {
    let mut f = unknown();
    f["struct_sizes"]["NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS"] = json!(68);
    let gone = "NV2080_CTRL_CMD_GPU_GET_SKYLINE_INFO";
    f["controls"].as_object_mut().unwrap().remove(gone).unwrap();
    f["controls"]["NV2080_CTRL_CMD_NVLINK_LOCK_REMAP_TABLE_AND_MSE"] = json!({"cmd": 0x2080_309d_u32, "params": "NV2080_CTRL_NVLINK_LOCK_REMAP_TABLE_AND_MSE_PARAMS"});
    f["struct_sizes"]["NV2080_CTRL_NVLINK_LOCK_REMAP_TABLE_AND_MSE_PARAMS"] = json!(16);
    f
}

fn ver(s: &str) -> nvproxy_abi::DriverVersion {
    s.parse().unwrap()
}

#[test]
fn test_check_of_a_known_version_matches_its_node() {
    let c = check(&facts("580.142")).unwrap();
    assert_eq!(c.render(), "580.142: matches node 580.142\n");
    // 580.126.20 shares 580.142's facts file; its own facts name 580.142, so check that a
    // renamed copy matches its node too.
    let mut f = facts("580.142");
    f["driver_version"] = json!("580.126.20");
    assert_eq!(
        check(&f).unwrap().render(),
        "580.126.20: matches node 580.126.20\n"
    );
}

#[test]
fn test_check_of_an_unknown_version_with_the_same_abi_names_the_nearest_node() {
    let c = check(&unknown()).unwrap();
    assert_eq!(c.render(), "580.300.01: matches node 580.173.02\n");
}

#[test]
fn test_check_prints_every_difference_from_the_nearest_node() {
    let mut f = changed();
    f["structs"]["NVOS54_PARAMETERS"]["size"] = json!(40);
    let out = check(&f).unwrap().render();
    assert!(
        out.starts_with(
            "580.300.01: differs from node 580.173.02 (3 table changes, 1 struct layouts):\n"
        ),
        "{out}"
    );
    for want in [
        "abi.resize_control(0x20800110, 68); // NV2080_CTRL_CMD_GPU_GET_NAME_STRING: 132 -> 68",
        "abi.remove_control(0x2080019f); // NV2080_CTRL_CMD_GPU_GET_SKYLINE_INFO is gone",
        "abi.add_control(0x2080309d, \"NV2080_CTRL_CMD_NVLINK_LOCK_REMAP_TABLE_AND_MSE\"",
        "struct NVOS54_PARAMETERS: 40 bytes, a layout no Rust struct has",
    ] {
        assert!(out.contains(want), "{want}\n{out}");
    }
}

#[test]
fn test_import_changes_only_parent_entries_and_new_ones_stay_denied() {
    let file = import(&changed(), "test").unwrap();
    assert_eq!(file["version"], "580.300.01");
    assert_eq!(file["parent"], "580.173.02");
    assert_eq!(file["support"], "supported");
    assert_eq!(
        file["denied"],
        json!(["controls NV2080_CTRL_CMD_NVLINK_LOCK_REMAP_TABLE_AND_MSE"])
    );
    let node = verify(&node_file_text(&file).unwrap(), Path::new("x.json")).unwrap();
    assert_eq!(node.support, Support::Supported);
    let parent = find(&ver("580.173.02")).unwrap().tables();
    let t = &node.tables;
    assert_eq!(t.controls[&0x2080_0110].param_size, 68);
    assert_eq!(
        t.controls[&0x2080_0110].caps,
        parent.controls[&0x2080_0110].caps
    );
    assert!(
        !t.controls.contains_key(&0x2080_019f),
        "the removed control"
    );
    assert!(
        !t.controls.contains_key(&0x2080_309d),
        "a control the parent lacks stays denied"
    );
    assert_eq!(t.controls.len(), parent.controls.len() - 1);
    assert_eq!(t.escapes, parent.escapes);
}

#[test]
fn test_import_marks_a_changed_modelled_struct_unqualified() {
    let mut f = unknown();
    // NVOS54_PARAMETERS grows: the control escape's size changes and no Rust layout fits.
    f["structs"]["NVOS54_PARAMETERS"]["size"] = json!(40);
    f["struct_sizes"]["NVOS54_PARAMETERS"] = json!(40);
    let file = import(&f, "test").unwrap();
    assert_eq!(file["support"], "unqualified", "{file:#}");
    let reason = file["reason"].as_str().unwrap();
    assert!(reason.contains("NVOS54_PARAMETERS"), "{reason}");
    let node = verify(&node_file_text(&file).unwrap(), Path::new("x.json")).unwrap();
    assert_eq!(node.support, Support::Unqualified);
    assert_eq!(
        node.tables.escapes[&0x2a].size,
        nvproxy_abi::ParamSize::Fixed(40)
    );
}

#[test]
fn test_import_refuses_a_known_version() {
    let err = import(&facts("580.142"), "test").unwrap_err();
    assert!(
        err.to_string().contains("is a node of the tree already"),
        "{err}"
    );
}

fn file_with(change: Value) -> String {
    let mut f = import(&unknown(), "test").unwrap();
    f["changes"] = json!([change]);
    node_file_text(&f).unwrap()
}

fn refused(text: &str) -> String {
    format!("{:#}", verify(text, Path::new("x.json")).unwrap_err())
}

#[test]
fn test_verify_refuses_policy_changes_new_entries_and_collisions() {
    let e = refused(&file_with(
        json!({"table": "controls", "name": "NV2080_CTRL_CMD_GPU_GET_NAME_STRING", "translation": "simple"}),
    ));
    assert!(e.contains("cannot change policy"), "{e}");
    let e = refused(&file_with(
        json!({"table": "controls", "name": "NV2080_CTRL_CMD_NVLINK_LOCK_REMAP_TABLE_AND_MSE", "number": 0x2080_309d_u32}),
    ));
    assert!(e.contains("the parent has no such entry"), "{e}");
    let e = refused(&file_with(
        json!({"table": "controls", "name": "NV2080_CTRL_CMD_GPU_GET_NAME_STRING", "number": 0x2080_0102_u32}),
    ));
    assert!(e.contains("is another entry's"), "{e}");
    let e = refused(&file_with(
        json!({"table": "controls", "name": "NV2080_CTRL_CMD_GPU_GET_NAME_STRING", "admin_only": false}),
    ));
    assert!(e.contains("only `true`"), "{e}");
    let e = refused(&file_with(
        json!({"table": "escapes", "name": "NV_ESC_RM_CONTROL", "size": 20000}),
    ));
    assert!(e.contains("above"), "{e}");
}

#[test]
fn test_verify_refuses_shadowing_unknown_parents_and_wrong_support() {
    let mut f = import(&unknown(), "test").unwrap();
    f["version"] = json!("580.142");
    assert!(refused(&node_file_text(&f).unwrap()).contains("built-in node"));
    let mut f = import(&unknown(), "test").unwrap();
    f["parent"] = json!("580.999.01");
    assert!(refused(&node_file_text(&f).unwrap()).contains("not a built-in node"));
    let mut f = import(&unknown(), "test").unwrap();
    f["layout_changes"] = json!(["struct NVOS54_PARAMETERS: 40 bytes"]);
    assert!(refused(&node_file_text(&f).unwrap()).contains("marked supported"));
    let mut f = import(&unknown(), "test").unwrap();
    f["support"] = json!("unqualified");
    assert!(refused(&node_file_text(&f).unwrap()).contains("without a reason"));
    assert!(refused("{}").contains("not an nvproxy node file"));
}

#[test]
fn test_load_dir_verifies_every_file_and_names_the_bad_one() {
    let dir = std::env::temp_dir().join(format!("nvproxy-nodes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let good = import(&changed(), "test").unwrap();
    std::fs::write(dir.join("580.300.01.json"), node_file_text(&good).unwrap()).unwrap();
    std::fs::write(dir.join("README"), "not a node file").unwrap();
    let nodes = load_dir(&dir).unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].version, ver("580.300.01"));
    assert_eq!(nodes[0].tables.controls[&0x127].caps, Caps::COMPUTE_UTILITY);
    std::fs::write(dir.join("bad.json"), "{\"nvproxy_node_file\": 1}").unwrap();
    let err = format!("{:#}", load_dir(&dir).unwrap_err());
    assert!(err.contains("bad.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
