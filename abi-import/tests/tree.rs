//! `abi-import tree` and `abi-import delta` against the committed tree.

use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_abi-import"))
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn test_generated_tree_is_up_to_date_with_the_index_and_the_facts() {
    // Regenerating from the index and the facts reproduces the committed builders and node list:
    // the tree is what the facts say, and nobody edited the generated file by hand.
    let out = std::env::temp_dir().join(format!("nvproxy-tree-{}.rs", std::process::id()));
    let st = bin()
        .arg("tree")
        .arg(repo().join("nvproxy-abi/facts/index.tsv"))
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    let got = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let want = std::fs::read_to_string(repo().join("nvproxy-abi/src/tree/generated.rs")).unwrap();
    assert!(
        got == want,
        "nvproxy-abi/src/tree/generated.rs is stale: run `cargo run -p abi-import -- tree \
         nvproxy-abi/facts/index.tsv --out nvproxy-abi/src/tree/generated.rs`"
    );
}

#[test]
fn test_delta_between_facts_files_prints_the_node_changes() {
    let facts = repo().join("nvproxy-abi/facts");
    let out = bin()
        .arg("delta")
        .arg(facts.join("545.29.06.json"))
        .arg(facts.join("550.40.07.json"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("abi.resize_escape(0x58, 48); // NV_ESC_RM_UNMAP_MEMORY_DMA: 40 -> 48"),
        "{text}"
    );
    let same = bin()
        .arg("delta")
        .arg(facts.join("580.142.json"))
        .arg(facts.join("580.142.json"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&same.stdout).contains("no table or modelled-struct change"));
}

#[test]
fn test_add_shares_the_facts_of_an_equal_abi_and_appends_a_node() {
    let tmp = std::env::temp_dir().join(format!("nvproxy-add-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let facts = tmp.join("facts");
    std::fs::create_dir_all(&facts).unwrap();
    for e in std::fs::read_dir(repo().join("nvproxy-abi/facts")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, facts.join(p.file_name().unwrap())).unwrap();
    }
    let mut ex: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(facts.join("580.142.json")).unwrap())
            .unwrap();
    ex["driver_version"] = serde_json::json!("580.300.01");
    ex["commit"] = serde_json::json!("0123456789abcdef0123456789abcdef01234567");
    let generated = tmp.join("generated.rs");
    let opts = abi_import::add::AddOptions::default();
    let out = abi_import::add::add_extract(&ex, None, &facts, &generated, &opts).unwrap();
    assert!(
        out.contains("same ABI as facts/580.142.json, shared"),
        "{out}"
    );
    let index = std::fs::read_to_string(facts.join("index.tsv")).unwrap();
    assert!(index.ends_with(
        "580.300.01\t580.173.02\t580.142\t0123456789abcdef0123456789abcdef01234567\t-\tsupported\t580 branch\n"
    ), "{index}");
    let code = std::fs::read_to_string(&generated).unwrap();
    assert!(
        code.contains(
            "AbiNode { version: v(580, 300, Some(1)), parent: Some(v(580, 173, Some(2)))"
        )
    );
    // A new branch needs its parent named.
    ex["driver_version"] = serde_json::json!("600.10.01");
    let err = abi_import::add::add_extract(&ex, None, &facts, &generated, &opts).unwrap_err();
    assert!(
        err.to_string()
            .contains("starts a new branch: name its parent with --parent"),
        "{err}"
    );
    // A changed modelled struct is written as a new facts file and an unqualified row.
    ex["structs"]["NVOS54_PARAMETERS"]["size"] = serde_json::json!(40);
    let opts = abi_import::add::AddOptions {
        parent: Some("595.45.04".into()),
        ..Default::default()
    };
    let out = abi_import::add::add_extract(&ex, None, &facts, &generated, &opts).unwrap();
    assert!(
        out.contains("600.10.01.json") && out.contains("unqualified: modelled structs"),
        "{out}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}
