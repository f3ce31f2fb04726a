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
