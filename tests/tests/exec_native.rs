//! `nvproxy exec` as a new user meets it on a host without CUSE (issue 21, items 4, 9, 10):
//! the default transport works, the command's terminal gets no log lines unless asked, and
//! every refusal is one plain line. Each run is in a mount namespace of its own with a fresh
//! tmpfs on `/run`, so the host's `/run/nvproxy` is never touched.
//!
//! Needs root (namespaces) and util-linux's `unshare`/`setpriv`, and the binaries
//! (`cargo build -p daemon -p preload`).

use std::process::{Command, Output};
use tests::harness::nvproxy_bin_with_shim;

/// Whether the suite can run here (root, util-linux's tools); says why not.
fn runnable() -> bool {
    tests::harness::runnable("namespaces", &["unshare", "setpriv"])
}

/// `prefix... nvproxy ARGS` in a private mount namespace with a tmpfs on `/run`, RUST_LOG unset.
fn nvproxy(prefix: &[&str], args: &[&str]) -> Output {
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount -t tmpfs -o mode=0755 nvproxy-test /run && exec \"$@\"")
        .arg("sh")
        .args(prefix)
        .arg(nvproxy_bin_with_shim())
        .args(args)
        .env_remove("RUST_LOG");
    c.output().expect("unshare ... nvproxy")
}

fn text(o: &Output) -> String {
    format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Before: `exec` needed `--transport socket` on a host without CUSE and printed ~30 INFO
/// lines into the command's terminal.
#[test]
fn test_exec_defaults_to_a_working_transport_and_keeps_quiet() {
    if !runnable() {
        return;
    }
    let o = nvproxy(
        &[],
        &["exec", "--driver", "sim", "--", "sh", "-c", "echo ran"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran\n", "{}", text(&o));
    assert!(
        o.stderr.is_empty(),
        "log lines in the command's terminal:\n{}",
        text(&o)
    );
    // -v asks for them.
    let v = nvproxy(&[], &["-v", "exec", "--driver", "sim", "--", "true"]);
    let err = String::from_utf8_lossy(&v.stderr).into_owned();
    assert!(
        v.status.success() && err.contains("INFO") && err.contains("transport auto"),
        "{}",
        text(&v)
    );
}

/// Before: each of these printed the worker's error, then again with
/// `exit Some(ExitStatus(unix_wait_status(256))); its log is above`.
#[test]
fn test_exec_refusals_are_one_plain_line() {
    if !runnable() {
        return;
    }
    let cases: [(&str, &[&str], &[&str], &str); 3] = [
        (
            "policy",
            &[],
            &[
                "exec",
                "--driver",
                "sim",
                "--policy",
                "/nonexistent.toml",
                "--",
                "true",
            ],
            "reading policy file /nonexistent.toml",
        ),
        (
            "audit log",
            &[],
            &[
                "exec",
                "--driver",
                "sim",
                "--audit-log",
                "/proc/nope/x.jsonl",
                "--",
                "true",
            ],
            "/proc/nope",
        ),
        (
            "not root",
            &[
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
            ],
            &["exec", "--driver", "sim", "--", "true"],
            "nvproxy exec needs root",
        ),
    ];
    for (what, prefix, args, words) in cases {
        let o = nvproxy(prefix, args);
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "{what}: {}", text(&o));
        assert_eq!(e.trim().lines().count(), 1, "{what}: {}", text(&o));
        assert!(
            e.starts_with("nvproxy: ") && e.contains(words),
            "{what}: {e}"
        );
        for debug in ["ExitStatus", "Some(", "its log is above"] {
            assert!(!e.contains(debug), "{what}: {e}");
        }
    }
}
