//! The mmap path through the real kernel's CUSE: `nvproxy exec`/`serve`/`run` with the
//! simulated driver, the shim (`libnvproxy_preload.so`, next to the `nvproxy` binary) and
//! `mmap-client` (`src/bin/mmap-client.rs`).
//!
//! They need `/dev/cuse` and root, so they are `#[ignore]`d and run by
//! `tests/run-kernel-tests.sh` (natively or in the CUSE VM), which builds the daemon and the shim
//! and sets `NVPROXY_BIN`.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use tests::harness::{nvproxy_bin_with_shim, require_cuse};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;

const CLIENT: &str = env!("CARGO_BIN_EXE_mmap-client");
const TIMEOUT: Duration = Duration::from_secs(180);
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A child in its own process group with its output collected; killed (group) on drop.
struct Proc {
    child: Child,
    tag: String,
    lines: mpsc::Receiver<(bool, String)>,
    stdout: Vec<String>,
    stderr: Vec<String>,
}

fn pump(
    stream: impl Read + Send + 'static,
    tag: String,
    out: bool,
    tx: mpsc::Sender<(bool, String)>,
) {
    thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { return };
            eprintln!("[{tag}] {line}");
            if tx.send((out, line)).is_err() {
                return;
            }
        }
    });
}

impl Proc {
    fn spawn(tag: &str, cmd: &mut Command) -> Proc {
        eprintln!("[{tag}] $ {cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let (tx, lines) = mpsc::channel();
        pump(
            child.stdout.take().unwrap(),
            format!("{tag} out"),
            true,
            tx.clone(),
        );
        pump(
            child.stderr.take().unwrap(),
            format!("{tag} err"),
            false,
            tx,
        );
        Proc {
            child,
            tag: tag.to_owned(),
            lines,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    fn store(&mut self, (out, line): (bool, String)) {
        if out {
            self.stdout.push(line);
        } else {
            self.stderr.push(line);
        }
    }

    fn wait_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok((true, l)) if pred(&l) => {
                    self.stdout.push(l);
                    return;
                }
                Ok(item) => self.store(item),
                Err(e) => panic!(
                    "{}: expected line not seen ({e:?})\n{}",
                    self.tag,
                    self.transcript()
                ),
            }
        }
    }

    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let until = Instant::now() + Duration::from_secs(10);
                while let Ok(item) = self
                    .lines
                    .recv_timeout(until.saturating_duration_since(Instant::now()))
                {
                    self.store(item);
                }
                return status;
            }
            while let Ok(item) = self.lines.try_recv() {
                self.store(item);
            }
            if Instant::now() >= deadline {
                let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
                let _ = self.child.wait();
                panic!(
                    "{}: still running after {timeout:?}\n{}",
                    self.tag,
                    self.transcript()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn transcript(&self) -> String {
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            self.stdout.join("\n"),
            self.stderr.join("\n")
        )
    }

    /// The client's JSON summary (last stdout line with a `scenario`).
    fn summary(&self) -> Value {
        self.stdout
            .iter()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v.get("scenario").is_some())
            .unwrap_or_else(|| panic!("{}: no JSON summary\n{}", self.tag, self.transcript()))
    }

    fn stderr_has(&self, needle: &str) -> bool {
        self.stderr.iter().any(|l| l.contains(needle))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// `nvproxy --log LOG exec --driver sim EXTRA -- mmap-client ARGS`, waited for; asserts the
/// client's summary says ok.
fn exec_client(log: &str, extra: &[&str], args: &[&str]) -> Proc {
    require_cuse();
    let mut c = Command::new(nvproxy_bin_with_shim());
    c.args(["--log", log, "exec", "--driver", "sim"])
        .args(extra)
        .arg("--")
        .arg(CLIENT)
        .args(args);
    let mut p = Proc::spawn("exec", &mut c);
    let status = p.wait(TIMEOUT);
    let v = p.summary();
    assert!(
        status.success() && v["ok"] == true,
        "exec: {status:?}, summary {v}\n{}",
        p.transcript()
    );
    p
}

/// `nvproxy serve` with instances `a` and `b`, waited for READY.
fn serve_two() -> Proc {
    require_cuse();
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "nvproxy-mmap-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "driver = \"sim\"\n[sim]\ngpus = 2\n[daemon]\naudit_dir = \"{}\"\n\
             [[instance]]\nname = \"a\"\ngpus = [0]\n[[instance]]\nname = \"b\"\ngpus = [1]\n",
            dir.display()
        ),
    )
    .expect("config");
    let mut c = Command::new(nvproxy_bin_with_shim());
    c.args(["serve", "--config"]).arg(&config);
    let mut p = Proc::spawn("serve", &mut c);
    p.wait_line(READY_TIMEOUT, |l| l.starts_with("READY"));
    p
}

fn stop(mut daemon: Proc) {
    let _ = nix::sys::signal::kill(Pid::from_raw(daemon.child.id() as i32), Signal::SIGTERM);
    let status = daemon.wait(TIMEOUT);
    assert!(
        status.success(),
        "serve: {status:?}\n{}",
        daemon.transcript()
    );
}

// ---- without and with the shim -------------------------------------------------------------

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_mmap_without_shim_fails_enodev_and_the_log_says_why() {
    let p = exec_client(
        "info",
        &["--no-preload"],
        &["map", "--node", "/dev/nvidiactl", "--expect", "ENODEV"],
    );
    assert_eq!(p.summary()["shim_loaded"], false);
    assert!(
        p.stderr_has("without the mmap shim"),
        "no log line about the missing shim\n{}",
        p.transcript()
    );
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_mmap_through_shim_of_node_without_mapping_gives_the_drivers_einval() {
    // nvidiactl with no RM_MAP_MEMORY context: the driver's mmap fails with EINVAL
    // (nv-mmap.c; the proxy answers it from its own context tracking).
    let p = exec_client(
        "nvproxy=debug",
        &[],
        &["map", "--node", "/dev/nvidiactl", "--expect", "EINVAL"],
    );
    assert_eq!(p.summary()["shim_loaded"], true);
    assert!(
        p.stderr_has("mmap ticket redeemed"),
        "the mmap did not reach the daemon\n{}",
        p.transcript()
    );
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_mmap_through_shim_with_retry_transport_reaches_the_daemon() {
    let p = exec_client(
        "nvproxy=debug",
        &["--memory", "retry"],
        &["map", "--node", "/dev/nvidia0", "--expect", "EINVAL"],
    );
    assert!(p.stderr_has("mmap ticket redeemed"), "{}", p.transcript());
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_shim_checks_the_fd_access_mode_like_the_kernel() {
    // A shared writable map of a read-only fd: EACCES (mm/mmap.c), before any ticket.
    exec_client(
        "warn",
        &[],
        &[
            "map",
            "--node",
            "/dev/nvidiactl",
            "--read-only",
            "--expect",
            "EACCES",
        ],
    );
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_shim_leaves_other_mmaps_alone() {
    exec_client("warn", &[], &["unrelated"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_hello_answers_and_identify_is_refused_to_clients() {
    exec_client("warn", &[], &["hello", "--node", "/dev/nvidiactl"]);
}

// ---- hostile -------------------------------------------------------------------------------

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_replayed_ticket_gets_nothing() {
    exec_client("warn", &[], &["replay"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_expired_ticket_gets_nothing() {
    exec_client("warn", &[], &["expired", "--wait-ms", "6000"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_peer_other_than_the_ticket_owner_gets_nothing() {
    let p = exec_client("warn", &[], &["wrong-peer"]);
    assert!(
        p.stderr_has("did not ask for it"),
        "no warning about the wrong peer\n{}",
        p.transcript()
    );
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_made_up_ticket_gets_nothing() {
    exec_client("warn", &[], &["unknown"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_ticket_of_another_instance_gets_nothing() {
    let daemon = serve_two();
    // On the host, outside any namespace: a's node, b's socket, then a's.
    let mut c = Command::new(CLIENT);
    c.args(["cross", "--node", "/dev/nvproxy/a/nvidiactl"])
        .args(["--socket", "/run/nvproxy/b/mmap.sock"])
        .args(["--own-socket", "/run/nvproxy/a/mmap.sock"]);
    let mut p = Proc::spawn("cross", &mut c);
    let status = p.wait(TIMEOUT);
    let v = p.summary();
    assert!(
        status.success() && v["ok"] == true,
        "{v}\n{}",
        p.transcript()
    );
    stop(daemon);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_socket_path_is_per_instance() {
    let daemon = serve_two();
    let host = |i: &str| {
        let m = std::fs::metadata(format!("/run/nvproxy/{i}/mmap.sock")).expect("socket");
        assert!(m.file_type().is_socket());
        (m.dev(), m.ino())
    };
    let (a, b) = (host("a"), host("b"));
    let mut seen = Vec::new();
    for inst in ["a", "b"] {
        let mut c = Command::new(nvproxy_bin_with_shim());
        c.args(["run", "--instance", inst, "--", CLIENT, "socket-info"]);
        let mut p = Proc::spawn(&format!("run {inst}"), &mut c);
        let status = p.wait(TIMEOUT);
        assert!(status.success(), "{}", p.transcript());
        let v = p.summary();
        seen.push((
            v["dev"].as_u64().unwrap(),
            v["ino"].as_u64().unwrap(),
            v["entries"].clone(),
        ));
    }
    stop(daemon);
    let only_socket = serde_json::json!(["mmap.sock"]);
    assert_ne!(a, b);
    assert_eq!(
        seen,
        vec![(a.0, a.1, only_socket.clone()), (b.0, b.1, only_socket)]
    );
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_served_instance_through_run_maps_through_the_shim() {
    let daemon = serve_two();
    let mut c = Command::new(nvproxy_bin_with_shim());
    c.args(["run", "--instance", "b", "--", CLIENT]).args([
        "map",
        "--node",
        "/dev/nvidia0",
        "--expect",
        "EINVAL",
    ]);
    let mut p = Proc::spawn("run b", &mut c);
    let status = p.wait(TIMEOUT);
    let v = p.summary();
    assert!(
        status.success() && v["ok"] == true && v["shim_loaded"] == true,
        "{v}\n{}",
        p.transcript()
    );
    stop(daemon);
}

// ---- data through the mapping ----------------------------------------------------------------

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_rm_memory_mapped_through_the_shim_is_shared_both_ways() {
    // NV01_MEMORY_SYSTEM mapped (RM_MAP_MEMORY) onto two nvidiactl files and mmapped through
    // the shim from both: bytes written through one mapping are read through the other. With
    // the simulated driver the handed-over fd is a memfd (a device ioctl on it: ENOTTY); on a
    // GPU host it is a Landlock'd open of the node, where the same check must give EACCES.
    let p = exec_client(
        "warn",
        &["--check-leaks"],
        &["rm-map", "--expect-fd-ioctl", "ENOTTY"],
    );
    assert_eq!(p.summary()["shim_loaded"], true);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_uvm_managed_pattern_maps_fixed_at_va_equal_offset_many_times() {
    // cudaMallocManaged: reserve with an anonymous mapping, MAP_FIXED the UVM fd over it at
    // VA == offset (2 MiB, 16 times): every mapping lands exactly where asked, the simulated
    // driver sees each as a managed range (UVM_VALIDATE_VA_RANGE), and a second process that
    // maps the same VA shares the bytes both ways.
    let p = exec_client("warn", &["--check-leaks"], &["uvm-map", "--count", "16"]);
    assert_eq!(p.summary()["landed"], 16);
}
