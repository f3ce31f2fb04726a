//! The CLI's messages for what `check-config` and `abi` refuse (no root, no CUSE needed).

use std::path::{Path, PathBuf};
use std::process::Command;

fn nvproxy(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nvproxy"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running nvproxy");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A config file in a directory of its own, removed when dropped.
struct Config(PathBuf);

impl std::ops::Deref for Config {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Config {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn config(tag: &str, text: &str) -> Config {
    let dir = std::env::temp_dir().join(format!("nvproxy-cli-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{tag}.toml"));
    std::fs::write(&path, text).unwrap();
    Config(path)
}

fn check_config_fails(tag: &str, text: &str, want: &str) {
    let path = config(tag, text);
    let (ok, _, err) = nvproxy(&["check-config", path.to_str().unwrap()]);
    assert!(!ok, "{tag}: check-config passed");
    assert!(
        err.starts_with(&format!("nvproxy: in config {}: ", path.display())) && err.contains(want),
        "{tag}: {err}"
    );
    assert!(!err.contains('\u{1b}'), "{tag}: colour codes in {err:?}");
}

#[test]
fn test_check_config_refuses_a_gpu_the_simulated_driver_lacks() {
    check_config_fails(
        "gpu",
        "driver = \"sim\"\n[sim]\ngpus = 2\n[[instance]]\nname = \"a\"\ngpus = [5]\n",
        "instance \"a\": gpus: no GPU 5 on the simulated driver: [sim] gpus = 2 gives it GPUs 0-1",
    );
}

#[test]
fn test_check_config_refuses_an_unknown_driver_version() {
    check_config_fails(
        "version",
        "driver = \"sim\"\n[sim]\ndriver_version = \"999.100.01\"\n",
        "[sim] driver_version = \"999.100.01\": nvproxy has no ABI tables for driver 999.100.01, \
         nor for any earlier version of branch 999",
    );
}

#[test]
fn test_check_config_refuses_an_unknown_allow_name_naming_the_nearest() {
    check_config_fails(
        "allow",
        "driver = \"sim\"\n[[instance]]\nname = \"a\"\ngpus = [0]\nallow = [\"NV_ESC_CARD_INFOO\"]\n",
        "instance \"a\": allow: NV_ESC_CARD_INFOO is not a name in the ABI table of driver \
         535.261.03 (nearest known: NV_ESC_CARD_INFO,",
    );
}

#[test]
fn test_check_config_prints_the_files_spellings() {
    let path = config(
        "good",
        "driver = \"sim\"\n[daemon]\nmemory = \"process-vm\"\n[[instance]]\nname = \"a\"\ngpus = [0]\n",
    );
    let (ok, out, err) = nvproxy(&["check-config", path.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        out.contains("client memory: process-vm") && out.contains("mode enforce"),
        "{out}"
    );
}

#[test]
fn test_abi_show_of_an_unknown_version_names_the_choices() {
    let (ok, _, err) = nvproxy(&["abi", "show", "535.400.01"]);
    assert!(!ok);
    assert!(
        err.starts_with(
            "nvproxy: abi show 535.400.01: nvproxy has no ABI tables for driver 535.400.01"
        ) && err.contains("nvproxy serve --abi-version 535.309.01")
            && err.contains("nvproxy abi import --from-source DIR")
            && !err.contains("driver driver"),
        "{err}"
    );
}

#[test]
fn test_abi_versions_says_why_sha256_is_a_dash() {
    let (ok, out, _) = nvproxy(&["abi", "versions"]);
    assert!(ok);
    assert!(
        out.contains("as gVisor's version.go lists it") && out.contains("`-`: none listed"),
        "{out}"
    );
}

#[test]
fn test_abi_versions_lists_every_tag_and_the_reasons() {
    let (ok, out, _) = nvproxy(&["abi", "versions"]);
    assert!(ok);
    assert!(out.contains("149 versions, 148 supported."), "{out}");
    let line = out.lines().find(|l| l.contains("595.71.05 ")).unwrap();
    assert!(line.contains("unqualified: no facts of its own"), "{line}");
}
