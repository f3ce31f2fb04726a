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

/// Issue 21, item 11: the help agreed neither with itself nor with the README: the `instance`
/// summary named four of its seven verbs, `instance upgrade` hid `--all` from its usage,
/// `checkpoint`/`restore` had no `--socket`, and `serve --help` named SIGTERM only.
#[test]
fn test_the_help_agrees_with_itself() {
    let (ok, top, _) = nvproxy(&["--help"]);
    assert!(ok);
    let line = top
        .lines()
        .find(|l| l.trim_start().starts_with("instance "))
        .unwrap_or_else(|| panic!("{top}"));
    let (_, verbs, _) = nvproxy(&["instance", "--help"]);
    let listed: Vec<&str> = verbs
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|v| *v != "help")
        .collect();
    assert!(listed.len() >= 7, "{verbs}");
    for v in &listed {
        assert!(line.contains(v), "the summary misses {v}: {line}");
    }
    let (_, upgrade, _) = nvproxy(&["instance", "upgrade", "--help"]);
    assert!(upgrade.contains("<NAME|--all>"), "{upgrade}");
    for verb in ["checkpoint", "restore", "list", "create"] {
        let (_, h, _) = nvproxy(&["instance", verb, "--help"]);
        assert!(h.contains("--socket <SOCKET>"), "instance {verb}: {h}");
    }
    let (_, serve, _) = nvproxy(&["serve", "--help"]);
    assert!(
        serve.contains("SIGINT") && serve.contains("SIGTERM"),
        "{serve}"
    );
}

/// Issue 21, item 6: `run --instance` of an instance nobody serves printed a 700-character
/// hint about CUSE only; now one short line that names both transports' paths and what to do.
#[test]
fn test_run_of_an_instance_nobody_serves_says_what_to_do_in_one_line() {
    let dir = std::env::temp_dir().join(format!("nvproxy-cli-{}-norun", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_nvproxy"))
        .args(["--run-dir"])
        .arg(&dir)
        .args(["run", "--instance", "job42", "--", "true"])
        .env_remove("RUST_LOG")
        .output()
        .expect("running nvproxy");
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("instance job42 is not being served")
            && err.contains("dev.sock")
            && err.contains("nvproxy serve")
            && err.contains("nvproxy instance create job42"),
        "{err}"
    );
    assert!(err.len() < 400, "{} characters: {err}", err.len());
}
