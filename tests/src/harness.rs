//! What the native and VM suites (`tests/*.rs`) each need before they start: the `nvproxy`
//! binary under test (and the shim beside it), `/dev/cuse`, root and util-linux's tools.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>` of the running test binary (`target/<profile>/deps/NAME-HASH`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary in target/<profile>/deps")
        .to_path_buf()
}

/// The `nvproxy` binary under test: `NVPROXY_BIN`, else the one beside the test binary's
/// profile directory. Panics, saying how to build it, when it is missing.
pub fn nvproxy_bin() -> PathBuf {
    let path = std::env::var_os("NVPROXY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| profile_dir().join("nvproxy"));
    assert!(
        path.is_file(),
        "nvproxy binary {} not found: cargo build -p daemon -p preload, or set NVPROXY_BIN \
         (tests/run-kernel-tests.sh does both)",
        path.display()
    );
    path
}

/// [`nvproxy_bin`], and the shim (`libnvproxy_preload.so`) must lie beside it.
pub fn nvproxy_bin_with_shim() -> PathBuf {
    let path = nvproxy_bin();
    let shim = path.with_file_name("libnvproxy_preload.so");
    assert!(
        shim.is_file(),
        "the shim {} is missing: cargo build -p preload",
        shim.display()
    );
    path
}

/// Panics unless the kernel offers CUSE (`/dev/cuse`).
pub fn require_cuse() {
    assert!(
        Path::new("/dev/cuse").exists(),
        "/dev/cuse is missing: these tests need a kernel with CUSE (modprobe cuse) and root; \
         run them with tests/run-kernel-tests.sh"
    );
}

/// Whether a native suite can run here: root (for `why`) and each of `tools` (util-linux's)
/// answering `--version`. Prints why not (`SKIPPED: …`).
pub fn runnable(why: &str, tools: &[&str]) -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root ({why})");
        return false;
    }
    for tool in tools {
        if Command::new(tool).arg("--version").output().is_err() {
            eprintln!("SKIPPED: {tool} (util-linux) is missing");
            return false;
        }
    }
    true
}
