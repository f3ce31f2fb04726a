//! `abi-import from-source` against the reference abi-facts files.
//!
//! `from_source_reproduces_facts` needs driver source trees, which CI does not have. It runs
//! when `NVPROXY_DRIVER_SRC_DIR` names a folder holding one unpacked tree per version
//! (`<dir>/<version>/`, as `abi-import/reproduce-facts.sh` makes them) and
//! `NVPROXY_ABI_FACTS_DIR` (default `/work/shared/abi-facts`) holds the reference
//! `<version>.json` files; otherwise it prints why it skipped and passes.
//! The other tests need no tree.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_abi-import"))
}

/// Up to `max` differences between `got` and `want`, as JSON paths.
fn diff(path: &str, got: &Value, want: &Value, out: &mut Vec<String>, max: usize) {
    if out.len() >= max || got == want {
        return;
    }
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                match g.get(k) {
                    None => out.push(format!("{path}.{k}: missing (want {})", short(wv))),
                    Some(gv) => diff(&format!("{path}.{k}"), gv, wv, out, max),
                }
                if out.len() >= max {
                    return;
                }
            }
            for (k, gv) in g {
                if !w.contains_key(k) && out.len() < max {
                    out.push(format!("{path}.{k}: unexpected {}", short(gv)));
                }
            }
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
            for (i, (gv, wv)) in g.iter().zip(w).enumerate() {
                diff(&format!("{path}[{i}]"), gv, wv, out, max);
            }
        }
        _ => out.push(format!("{path}: got {}, want {}", short(got), short(want))),
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 200 {
        format!("{}…", s.chars().take(200).collect::<String>())
    } else {
        s
    }
}

fn read_trimmed(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

#[test]
fn from_source_reproduces_facts() {
    let Some(src) = std::env::var_os("NVPROXY_DRIVER_SRC_DIR").map(PathBuf::from) else {
        println!(
            "SKIP from_source_reproduces_facts: NVPROXY_DRIVER_SRC_DIR is not set \
             (run abi-import/reproduce-facts.sh MIRROR to unpack the trees and run this test)"
        );
        return;
    };
    let facts = std::env::var_os("NVPROXY_ABI_FACTS_DIR")
        .map_or_else(|| PathBuf::from("/work/shared/abi-facts"), PathBuf::from);
    let mut refs: Vec<PathBuf> = match std::fs::read_dir(&facts) {
        Ok(d) => d
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect(),
        Err(e) => {
            println!(
                "SKIP from_source_reproduces_facts: no reference facts in {} ({e})",
                facts.display()
            );
            return;
        }
    };
    refs.sort();
    assert!(!refs.is_empty(), "no <version>.json in {}", facts.display());
    let out_dir = std::env::temp_dir().join(format!("abi-import-test-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let mut identical = 0;
    let mut failures = Vec::new();
    for r in &refs {
        let version = r.file_stem().unwrap().to_string_lossy().into_owned();
        let tree = src.join(&version);
        if !tree.is_dir() {
            failures.push(format!("{version}: no source tree at {}", tree.display()));
            continue;
        }
        let want: Value = serde_json::from_str(&std::fs::read_to_string(r).unwrap()).unwrap();
        let out = out_dir.join(format!("{version}.json"));
        let mut cmd = bin();
        cmd.arg("from-source").arg(&tree).arg("--out").arg(&out);
        cmd.args(["--version", &version]);
        // The commit is not in a `git archive` tree; reproduce-facts.sh records it in `.commit`
        // (a git checkout needs nothing: from-source asks git).
        if let Some(c) = read_trimmed(&tree.join(".commit")) {
            cmd.args(["--commit", &c]);
        }
        let t0 = std::time::Instant::now();
        let res = cmd.output().unwrap();
        if !res.status.success() {
            failures.push(format!(
                "{version}: from-source failed: {}",
                String::from_utf8_lossy(&res.stderr)
            ));
            continue;
        }
        let got: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let mut d = Vec::new();
        diff("", &got, &want, &mut d, 10);
        if d.is_empty() {
            identical += 1;
            println!("{version}: identical ({:.1} s)", t0.elapsed().as_secs_f64());
        } else {
            println!("{version}: DIFFERS");
            for l in &d {
                println!("    {l}");
            }
            failures.push(format!("{version}: {}", d.join("; ")));
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    println!("{identical}/{} identical", refs.len());
    assert!(failures.is_empty(), "differences:\n{}", failures.join("\n"));
}

#[test]
fn rejects_a_folder_that_is_not_a_driver_tree() {
    let dir = std::env::temp_dir().join(format!("abi-import-not-a-tree-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let res = bin()
        .args(["from-source"])
        .arg(&dir)
        .args(["--out", "/dev/null"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!res.status.success());
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(
        err.contains("does not look like an open-gpu-kernel-modules tree"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn rejects_a_missing_folder() {
    let res = bin()
        .args([
            "from-source",
            "/nonexistent/driver/tree",
            "--out",
            "/dev/null",
        ])
        .output()
        .unwrap();
    assert!(!res.status.success());
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(err.contains("is not a folder"), "{err}");
}

#[test]
fn needs_out() {
    let res = bin().args(["from-source", "/tmp"]).output().unwrap();
    assert!(!res.status.success());
    assert!(String::from_utf8_lossy(&res.stderr).contains("--out"));
}

#[test]
fn reports_a_missing_compiler() {
    // A fake tree that passes the layout check, so the compiler lookup is reached.
    let dir = std::env::temp_dir().join(format!("abi-import-fake-tree-{}", std::process::id()));
    for f in [
        "src/common/sdk/nvidia/inc/nvos.h",
        "src/nvidia/arch/nvalloc/unix/include/nv_escape.h",
        "kernel-open/nvidia-uvm/uvm_ioctl.h",
    ] {
        let p = dir.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "").unwrap();
    }
    let res = bin()
        .env("CC", "/nonexistent/cc")
        .arg("from-source")
        .arg(&dir)
        .args(["--out", "/dev/null"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!res.status.success());
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(err.contains("no working C compiler"), "{err}");
}

#[test]
fn help_mentions_from_source() {
    let res = bin().arg("--help").output().unwrap();
    assert!(res.status.success());
    assert!(String::from_utf8_lossy(&res.stdout).contains("from-source DIR --out"));
}
