//! What programs do with NVIDIA's device nodes beyond `open`/`ioctl`/`mmap`, under the socket
//! transport's shim (`preload/src/devshim.rs`, `devpoll.rs`), natively (no CUSE, no VM): a C
//! program (`tests/c/devnode_calls.c`, compiled here with `cc`, plain and fortified) and
//! Python's own `os`/`select` calls, each against `nvproxy exec --driver sim --transport socket
//! --check-leaks`:
//! - `statx`, `stat`/`lstat`/`fstatat` (`AT_EMPTY_PATH` on an open too), `access`,
//!   `faccessat`, `euidaccess` of the nodes by relative paths, `dirfd`, `.`, `..`, repeated
//!   slashes and a symlinked directory; a file with a node's name elsewhere stays that file;
//! - `open`/`openat` by those paths (and glibc's fortified `__open_2`), `O_CREAT|O_EXCL`'s
//!   `EEXIST`; `fopen`, `fopen64`, `freopen` (on `stdin`), `freopen64`, with `e`'s
//!   close-on-exec and `x`'s `EEXIST`;
//! - `poll`, `ppoll` (and `__poll_chk`/`__ppoll_chk`), `select`, `pselect`, `epoll_ctl` +
//!   `epoll_wait`: an open of nvidiactl or nvidia<N> has no event pending (`nvidia_poll`: never
//!   writable, readable only with an event), so the caller's timeout runs and only other fds
//!   are reported; nvidia-uvm (no poll in the driver) is readable and writable at once and
//!   refused by epoll (`EPERM`).
//!
//! Needs root and the binaries (`cargo build -p daemon -p preload`), and a C compiler (`cc`,
//! which cargo's linking needs anyway); skipped with a message without them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use test_kit::TestDir;
use tests::harness::nvproxy_bin_with_shim;

use serde_json::Value;

/// Whether the suite can run here (root, util-linux's tools); says why not.
fn runnable() -> bool {
    tests::harness::runnable("namespaces", &[])
}

/// `nvproxy exec --driver sim --transport socket --check-leaks -- CMD`, in a run directory of
/// its own (`NVPROXY_RUN_DIR`): never the host's `/run/nvproxy`.
fn exec(cmd: &[&str]) -> Output {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let run = TestDir::new(&format!("run{n}"));
    let o = Command::new(nvproxy_bin_with_shim())
        .args([
            "exec",
            "--driver",
            "sim",
            "--transport",
            "socket",
            "--check-leaks",
            "--",
        ])
        .args(cmd)
        .env("RUST_LOG", "warn")
        .env("NVPROXY_RUN_DIR", run.path().join("run"))
        .stdin(Stdio::null())
        .output()
        .expect("nvproxy exec");
    drop(run);
    o
}

fn text(o: &Output) -> String {
    format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every check `devnode_calls.c` makes, in its order (a check that stops being made fails).
const C_CHECKS: &[&str] = &[
    "open_relative_cwd_dev",
    "open_dot_relative",
    "openat_dev_dirfd",
    "openat_dirfd_dotdot",
    "open_absolute_dotdot",
    "open_slashes_and_dot",
    "openat_missing_gpu",
    "open_through_dir_symlink",
    "open_relative_dotdot_from_tmp",
    "open_other_dir_same_name",
    "open_other_dir_missing_name",
    "statx_absolute",
    "statx_dirfd",
    "statx_relative_uvm",
    "statx_empty_path_fd",
    "statx_null_path_fd",
    "fstatat_empty_path_fd",
    "statx_missing_gpu",
    "stat_relative",
    "fstatat_dirfd",
    "lstat_dotdot",
    "access_relative",
    "faccessat_dirfd",
    "euidaccess_relative",
    "access_missing_gpu",
    "fstatat_dotdot_from_tmp",
    "statx_other_dir_same_name",
    "fopen",
    "fopen64_relative",
    "fopen_cloexec",
    "fopen_no_cloexec",
    "fopen_missing_gpu",
    "fopen_excl_existing",
    "fopen_bad_mode",
    "freopen_stdin",
    "freopen64_relative",
    "fopen_other_dir_same_name",
    "poll_no_event_waits",
    "poll_keeps_events",
    "ppoll_no_event_waits",
    "poll_other_fd_ready",
    "ppoll_other_fd_ready",
    "poll_untouched_writable",
    "select_no_event_waits",
    "select_other_fds_ready",
    "pselect_no_event_waits",
    "epoll_ctl_add",
    "epoll_no_event_waits",
    "epoll_mod_no_event_waits",
    "epoll_other_fds_ready",
    "epoll_ctl_del",
    "open_after_polls",
    "open_excl_existing",
];

/// Compiles `devnode_calls.c` into `dir` with `flags`; `None` (with a message) without `cc`.
fn compile(dir: &Path, name: &str, flags: &[&str]) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c/devnode_calls.c");
    let out = dir.join(name);
    let o = match Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: no C compiler (cc: {e})");
            return None;
        }
    };
    assert!(o.status.success(), "cc {flags:?}: {}", text(&o));
    Some(out)
}

/// The symbols `bin` imports (`nm -D --undefined-only`), or `None` without `nm`.
fn imports(bin: &Path) -> Option<String> {
    let o = Command::new("nm")
        .args(["-D", "--undefined-only"])
        .arg(bin)
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

fn run_c_checks(bin: &Path, data: &Path) {
    let o = exec(&[bin.to_str().unwrap(), data.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    let mut seen = Vec::new();
    let mut failed = Vec::new();
    for line in out.lines() {
        if let Some((name, verdict)) = line.split_once(' ')
            && name != "done"
        {
            seen.push(name.to_string());
            if verdict != "ok" {
                failed.push(line.to_string());
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{}: failed checks:\n{}\n{}",
        bin.display(),
        failed.join("\n"),
        text(&o)
    );
    assert_eq!(seen, C_CHECKS, "{}: {}", bin.display(), text(&o));
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn test_a_c_program_statx_relative_paths_fopen_and_polls_through_libc() {
    if !runnable() {
        return;
    }
    let dir = TestDir::new("c");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    std::fs::write(data.join("nvidia0"), "hi").expect("a file named nvidia0");
    let Some(plain) = compile(dir.path(), "devnode_calls", &["-O0"]) else {
        return;
    };
    run_c_checks(&plain, &data);
    // Fortified: glibc's checking wrappers, whose definitions call libc's internal functions.
    let fortified = compile(
        dir.path(),
        "devnode_calls_fortified",
        &["-O2", "-D_FORTIFY_SOURCE=2"],
    )
    .expect("cc ran above");
    if let Some(syms) = imports(&fortified) {
        for sym in ["__poll_chk", "__ppoll_chk", "__open_2", "__openat_2"] {
            assert!(
                syms.lines()
                    .any(|l| l.trim_end().ends_with(&format!(" {sym}"))
                        || l.contains(&format!(" {sym}@"))),
                "the fortified build does not call {sym}:\n{syms}"
            );
        }
    } else {
        eprintln!("no nm: the fortified build's imports are not checked");
    }
    run_c_checks(&fortified, &data);
}

/// Python's own calls (`os`, `select`, `fcntl`, `open`) with the nodes. Prints one JSON line.
const PYTHON: &str = r#"
import errno, fcntl, json, os, pathlib, select, stat, struct, sys, time
out = {}
CHECK_VERSION = 0xc04846d2
def answers(fd):
    b = bytearray(72); b[0] = ord("2")
    fcntl.ioctl(fd, CHECK_VERSION, b)
    return struct.unpack_from("<I", b, 4)[0] == 1
def rdev(st):
    return [stat.S_ISCHR(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev)]
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
dev = os.open("/dev", os.O_RDONLY | os.O_DIRECTORY)
os.chdir("/dev")
out["stat_relative"] = rdev(os.stat("nvidiactl"))
out["stat_dir_fd"] = rdev(os.stat("nvidia0", dir_fd=dev))
out["lstat_dotdot"] = rdev(os.lstat("/dev/../dev/nvidiactl"))
out["access_relative"] = os.access("nvidia-uvm", os.R_OK | os.W_OK)
out["access_dir_fd"] = os.access("nvidia0", os.R_OK, dir_fd=dev)
out["exists_relative"] = os.path.exists("nvidia0")
out["pathlib_char_device"] = pathlib.Path("/dev/./nvidiactl").is_char_device()
out["stat_missing_gpu"] = err(lambda: os.stat("nvidia7"))
fd = os.open("nvidiactl", os.O_RDWR)
out["open_relative"] = answers(fd)
g = os.open("nvidia0", os.O_RDWR, dir_fd=dev)
out["open_dir_fd"] = rdev(os.fstat(g))
with open("nvidiactl", "r+b", buffering=0) as f:
    out["builtin_open"] = answers(f.fileno())
out["open_excl"] = err(lambda: os.open("nvidiactl", os.O_RDWR | os.O_CREAT | os.O_EXCL))
# poll family on nvidiactl: no event pending, so nothing is ready and the timeout runs.
p = select.poll()
p.register(fd, select.POLLIN | select.POLLOUT | select.POLLPRI)
t = time.monotonic(); r = p.poll(200); out["poll"] = [r, time.monotonic() - t >= 0.19]
t = time.monotonic(); r = select.select([fd], [fd], [fd], 0.2)
out["select"] = [r, time.monotonic() - t >= 0.19]
e = select.epoll()
e.register(fd, select.EPOLLIN | select.EPOLLOUT | select.EPOLLPRI)
t = time.monotonic(); r = e.poll(0.2); out["epoll"] = [r, time.monotonic() - t >= 0.19]
rp, wp = os.pipe(); os.write(wp, b"x")
p.register(rp, select.POLLIN)
out["poll_other_ready"] = p.poll(5000)
out["select_other_ready"] = select.select([fd, rp], [fd], [], 5)
# nvidia-uvm has no poll in the driver: the kernel's default (readable and writable at once);
# epoll refuses it.
u = os.open("/dev/nvidia-uvm", os.O_RDWR)
q = select.poll(); q.register(u, select.POLLIN | select.POLLOUT | select.POLLPRI)
t = time.monotonic(); r = q.poll(5000)
out["uvm_poll"] = [r, time.monotonic() - t < 1]
out["uvm_select"] = select.select([u, fd], [u, fd], [u, fd], 5)
out["uvm_epoll"] = err(lambda: select.epoll().register(u, select.EPOLLIN))
out["fds"] = {"ctl": fd, "uvm": u, "pipe": rp}
print(json.dumps(out), flush=True)
"#;

#[test]
fn test_pythons_os_and_select_calls_with_the_nodes() {
    if !runnable() {
        return;
    }
    let o = exec(&["python3", "-c", PYTHON]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let v: Value = serde_json::from_str(out.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    let ctl = serde_json::json!([true, 195, 255]);
    let gpu0 = serde_json::json!([true, 195, 0]);
    assert_eq!(v["stat_relative"], ctl, "{v}");
    assert_eq!(v["stat_dir_fd"], gpu0, "{v}");
    assert_eq!(v["lstat_dotdot"], ctl, "{v}");
    for k in [
        "access_relative",
        "access_dir_fd",
        "exists_relative",
        "pathlib_char_device",
        "open_relative",
        "builtin_open",
    ] {
        assert_eq!(v[k], true, "{k}: {v}");
    }
    assert_eq!(v["stat_missing_gpu"], "ENOENT", "{v}");
    assert_eq!(v["open_dir_fd"], gpu0, "{v}");
    assert_eq!(v["open_excl"], "EEXIST", "{v}");
    assert_eq!(v["poll"], serde_json::json!([[], true]), "{v}");
    assert_eq!(v["select"], serde_json::json!([[[], [], []], true]), "{v}");
    assert_eq!(v["epoll"], serde_json::json!([[], true]), "{v}");
    let (ctl_fd, uvm, pipe) = (&v["fds"]["ctl"], &v["fds"]["uvm"], &v["fds"]["pipe"]);
    let pollin = libc::POLLIN;
    assert_eq!(
        v["poll_other_ready"],
        serde_json::json!([[pipe, pollin]]),
        "{v}"
    );
    assert_eq!(
        v["select_other_ready"],
        serde_json::json!([[pipe], [], []]),
        "{v}"
    );
    let uvm_mask = libc::POLLIN | libc::POLLOUT;
    assert_eq!(
        v["uvm_poll"],
        serde_json::json!([[[uvm, uvm_mask]], true]),
        "{v}"
    );
    assert_eq!(
        v["uvm_select"],
        serde_json::json!([[uvm], [uvm], []]),
        "ctl {ctl_fd}: {v}"
    );
    assert_eq!(v["uvm_epoll"], "EPERM", "{v}");
}
