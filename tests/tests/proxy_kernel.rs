//! End-to-end tests of the `nvproxy` daemon through the real kernel's CUSE: each test runs
//! `nvproxy exec` (or `serve` + `run`) with the simulated driver and drives the proxied nodes
//! with `nvfe-client`, a raw-ioctl client of NVIDIA's frontend ABI (`src/bin/nvfe-client.rs`).
//!
//! They need `/dev/cuse` and root, so they are `#[ignore]`d and run by
//! `tests/run-kernel-tests.sh` (natively or in the CUSE VM) with `--ignored --test-threads=1`.
//! The runner builds the daemon and sets `NVPROXY_BIN`; without it the binary is looked up
//! next to the test binary's target directory (`target/<profile>/nvproxy`).
//!
//! The expected errnos and NV statuses are the client's defaults; each scenario's doc comment in
//! `nvfe-client` names the driver source (or the proxy's decision) behind its value.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use test_kit::eventually;
use tests::harness::{nvproxy_bin, require_cuse};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;

const CLIENT: &str = env!("CARGO_BIN_EXE_nvfe-client");
const MMAP_CLIENT: &str = env!("CARGO_BIN_EXE_mmap-client");
/// One `nvproxy exec` of a short scenario (the VM guest runs 10-50x slower than the host).
const EXEC_TIMEOUT: Duration = Duration::from_secs(180);
/// Scenarios with many clients.
const LONG_TIMEOUT: Duration = Duration::from_secs(480);
/// Until `nvproxy serve` prints READY.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A fresh directory under the temporary directory.
fn scratch_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "nvproxy-e2e-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Collects a child's output lines (echoed to stderr with a tag) on a channel.
fn pump(
    stream: impl Read + Send + 'static,
    tag: String,
    tx: mpsc::Sender<(bool, String)>,
    out: bool,
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

/// A child process in its own process group, its output collected line by line. Dropping it
/// kills the whole group.
struct Proc {
    child: Child,
    tag: String,
    lines: mpsc::Receiver<(bool, String)>,
    stdout: Vec<String>,
    stderr: Vec<String>,
    stdin: Option<ChildStdin>,
}

impl Proc {
    fn spawn(tag: &str, cmd: &mut Command, with_stdin: bool) -> Proc {
        let cmd_line = format!("{cmd:?}");
        eprintln!("[{tag}] $ {cmd_line}");
        let mut child = cmd
            .stdin(if with_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd_line}: {e}"));
        let (tx, lines) = mpsc::channel();
        pump(
            child.stdout.take().unwrap(),
            format!("{tag} out"),
            tx.clone(),
            true,
        );
        pump(
            child.stderr.take().unwrap(),
            format!("{tag} err"),
            tx,
            false,
        );
        let stdin = child.stdin.take();
        Proc {
            child,
            tag: tag.to_owned(),
            lines,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdin,
        }
    }

    fn store(&mut self, (out, line): (bool, String)) {
        if out {
            self.stdout.push(line);
        } else {
            self.stderr.push(line);
        }
    }

    /// Waits for a stdout line satisfying `pred`; panics after `timeout` or if the process ends
    /// first.
    fn wait_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((true, line)) if pred(&line) => {
                    self.stdout.push(line.clone());
                    return line;
                }
                Ok(item) => self.store(item),
                Err(e) => panic!(
                    "{}: no expected line on stdout ({e:?}); status {:?}\n{}",
                    self.tag,
                    self.child.try_wait(),
                    self.transcript()
                ),
            }
        }
    }

    /// Waits for a stderr line satisfying `pred` (lines already seen count too); panics after
    /// `timeout` or if the process ends first.
    fn wait_err_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        if let Some(l) = self.stderr.iter().find(|l| pred(l)) {
            return l.clone();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((false, line)) if pred(&line) => {
                    self.stderr.push(line.clone());
                    return line;
                }
                Ok(item) => self.store(item),
                Err(e) => panic!(
                    "{}: no expected line on stderr ({e:?}); status {:?}\n{}",
                    self.tag,
                    self.child.try_wait(),
                    self.transcript()
                ),
            }
        }
    }

    /// Sends `line` to the child's stdin.
    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("spawned with stdin");
        writeln!(stdin, "{line}").expect("write to child stdin");
        stdin.flush().expect("flush child stdin");
    }

    /// Waits for the process to exit (and its output to end); kills the group after `timeout`.
    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // Drain what is left (the pipes close once every holder exited).
                let drain_until = Instant::now() + Duration::from_secs(10);
                while let Ok(item) = self
                    .lines
                    .recv_timeout(drain_until.saturating_duration_since(Instant::now()))
                {
                    self.store(item);
                }
                return status;
            }
            while let Ok(item) = self.lines.try_recv() {
                self.store(item);
            }
            if Instant::now() >= deadline {
                self.kill_group(Signal::SIGKILL);
                let _ = self.child.wait();
                panic!(
                    "{}: still running after {timeout:?}; killed\n{}",
                    self.tag,
                    self.transcript()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill_group(&self, sig: Signal) {
        let _ = killpg(Pid::from_raw(self.child.id() as i32), sig);
    }

    fn signal(&self, sig: Signal) {
        let _ = nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), sig);
    }

    fn assert_no_table_leak(&self) {
        assert!(
            !self.stderr.iter().any(|l| l.contains(TABLE_LEAK)),
            "{}: an instance stopped with objects in its table\n{}",
            self.tag,
            self.transcript()
        );
    }

    fn transcript(&self) -> String {
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            self.stdout.join("\n"),
            self.stderr.join("\n")
        )
    }

    /// The last stdout line that is a JSON object with a `scenario` (the client's summary).
    fn summary(&self) -> Value {
        self.stdout
            .iter()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v.get("scenario").is_some())
            .unwrap_or_else(|| panic!("{}: no JSON summary\n{}", self.tag, self.transcript()))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill_group(Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// A finished run.
struct Ran {
    proc_: Proc,
    status: ExitStatus,
    elapsed: Duration,
}

/// What the daemon logs when an instance stops with objects still in its object table: the
/// clients of every released open should have been dropped by then.
const TABLE_LEAK: &str = "object table not empty at stop";

impl Ran {
    /// Exit status 0 (the client passed, and `--check-leaks` found the simulated driver empty)
    /// and no instance stopped with objects left in the proxy's own table.
    fn assert_success(&self) -> &Self {
        assert!(
            self.status.success(),
            "{}: exit {:?}, want 0\n{}",
            self.proc_.tag,
            self.status,
            self.proc_.transcript()
        );
        self.proc_.assert_no_table_leak();
        self
    }

    fn summary(&self) -> Value {
        self.proc_.summary()
    }
}

/// `nvproxy exec ARGS -- CMD...`, waited for.
fn exec_cmd(args: &[&str], cmd: &[&str], timeout: Duration) -> Ran {
    require_cuse();
    let mut c = Command::new(nvproxy_bin());
    c.arg("exec").args(args).arg("--").args(cmd);
    let started = Instant::now();
    let mut p = Proc::spawn("exec", &mut c, false);
    let status = p.wait(timeout);
    let elapsed = started.elapsed();
    eprintln!("[exec] {status:?} after {elapsed:?}");
    Ran {
        proc_: p,
        status,
        elapsed,
    }
}

/// `nvproxy exec ARGS -- nvfe-client CLIENT_ARGS...`.
fn exec(args: &[&str], client_args: &[&str]) -> Ran {
    let mut cmd = vec![CLIENT];
    cmd.extend_from_slice(client_args);
    exec_cmd(args, &cmd, EXEC_TIMEOUT)
}

/// The default instance: one simulated GPU, enforce mode, leak check on exit.
const SIM: &[&str] = &["--driver", "sim", "--check-leaks"];

/// Runs a hostile scenario under `nvproxy exec --driver sim --check-leaks` and checks that the
/// client got exactly what it expects (exit 0) and the daemon found no leak.
fn hostile(client_args: &[&str]) -> Value {
    let ran = exec(SIM, client_args);
    ran.assert_success();
    let v = ran.summary();
    assert_eq!(v["ok"], true, "{v}");
    v
}

/// GPU ids of all GPUs of a simulated driver with `n` GPUs, in minor order (from `init`).
fn sim_gpu_ids(n: u32) -> Vec<String> {
    let all: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let gpus = all.join(",");
    let expect = n.to_string();
    let n_s = n.to_string();
    let ran = exec(
        &[
            "--driver",
            "sim",
            "--sim-gpus",
            &n_s,
            "--gpus",
            &gpus,
            "--check-leaks",
        ],
        &["init", "--expect-gpus", &expect],
    );
    ran.assert_success();
    let v = ran.summary();
    let mut list: Vec<(u64, String)> = v["gpu_list"]
        .as_array()
        .expect("gpu_list")
        .iter()
        .map(|g| {
            (
                g["minor"].as_u64().expect("minor"),
                g["gpu_id"].as_str().expect("gpu_id").to_owned(),
            )
        })
        .collect();
    list.sort();
    list.into_iter().map(|(_, id)| id).collect()
}

// ---- CUDA initialisation ------------------------------------------------------------------

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_sim_init_passes_without_leaks() {
    let ran = exec(SIM, &["init", "--expect-gpus", "1"]);
    ran.assert_success();
    let v = ran.summary();
    eprintln!("init took {:?}: {v}", ran.elapsed);
    assert_eq!(
        (v["ok"].clone(), v["gpus"].clone()),
        (true.into(), 1.into())
    );
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_init_retry_transport_passes() {
    let ran = exec(SIM_RETRY, &["init", "--expect-gpus", "1"]);
    ran.assert_success();
    eprintln!("retry transport: {:?}", ran.elapsed);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_init_process_vm_transport_passes() {
    let ran = exec(
        &["--driver", "sim", "--memory", "process-vm", "--check-leaks"],
        &["init", "--expect-gpus", "1"],
    );
    ran.assert_success();
    eprintln!("process-vm transport: {:?}", ran.elapsed);
}

/// `init` on the second of two simulated GPUs, client and simulated driver both at `version`.
fn init_second_gpu_at(version: &str) {
    let ran = exec(
        &[
            "--driver",
            "sim",
            "--sim-gpus",
            "2",
            "--gpus",
            "1",
            "--sim-driver-version",
            version,
            "--check-leaks",
        ],
        &["--driver-version", version, "init", "--expect-gpus", "1"],
    );
    ran.assert_success();
    assert_eq!(ran.summary()["build_version"], version);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_init_at_570_passes() {
    init_second_gpu_at("570.211.01");
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_init_at_580_with_gpu_flags_in_probed_ids_passes() {
    // 580 adds gpuFlags to GPU_GET_PROBED_IDS (384 bytes); the proxy filters it with the ids.
    init_second_gpu_at("580.142");
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_second_of_two_sim_gpus_is_the_tenants_nvidia0() {
    let ids = sim_gpu_ids(2);
    let ran = exec(
        &[
            "--driver",
            "sim",
            "--sim-gpus",
            "2",
            "--gpus",
            "1",
            "--check-leaks",
        ],
        &["init", "--expect-gpus", "1"],
    );
    ran.assert_success();
    let g = &ran.summary()["gpu_list"][0];
    assert_eq!(
        (g["minor"].clone(), g["gpu_id"].as_str().map(str::to_owned)),
        (0.into(), Some(ids[1].clone())),
        "{g}"
    );
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_gpu_outside_set_is_unreachable() {
    let ids = sim_gpu_ids(2);
    let ran = exec(
        &[
            "--driver",
            "sim",
            "--sim-gpus",
            "2",
            "--gpus",
            "1",
            "--check-leaks",
        ],
        &["gpu-outside-set", "--gpu-id", &ids[0]],
    );
    ran.assert_success();
    assert_eq!(ran.summary()["ok"], true);
}

// ---- hostile clients ----------------------------------------------------------------------

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_unknown_escape_fails_einval() {
    hostile(&["unknown-escape"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_oversized_params_fail_einval() {
    hostile(&["oversized-params"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_undersized_params_fail_einval() {
    hostile(&["undersized-params"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_bad_nested_pointer_answers_invalid_address() {
    hostile(&["bad-nested-pointer"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_bad_embedded_pointer_answers_invalid_address() {
    hostile(&["bad-embedded-pointer"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_params_size_too_large_answers_invalid_argument() {
    hostile(&["params-size-too-large"]);
}

/// The default instance with the CUSE retry transport for client memory.
const SIM_RETRY: &[&str] = &["--driver", "sim", "--memory", "retry", "--check-leaks"];

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_retry_transport_bounds_params_size_before_copying() {
    // 1 MiB + 4 KiB is above the retry protocol's 128 KiB per direction: only a bound checked
    // before any copy gives the driver's answer.
    let ran = exec(SIM_RETRY, &["params-size-too-large"]);
    ran.assert_success();
}

// With the retry transport the *kernel* copies the buffers the daemon names, and a bad address
// fails the client's ioctl with EFAULT before the daemon sees the retried request (fs/fuse
// ioctl.c, fuse_do_ioctl: copying the in-iovecs fails with -EFAULT). So the driver's answer,
// NV_ERR_INVALID_ADDRESS in the status, is out of reach there; these pin what the client gets.

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_retry_transport_bad_nested_pointer_fails_efault() {
    let ran = exec(SIM_RETRY, &["bad-nested-pointer", "--expect", "EFAULT"]);
    ran.assert_success();
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_retry_transport_bad_embedded_pointer_fails_efault() {
    let ran = exec(SIM_RETRY, &["bad-embedded-pointer", "--expect", "EFAULT"]);
    ran.assert_success();
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_register_fd_with_closed_fd_fails_ebadf() {
    hostile(&["foreign-fd"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_register_fd_with_non_nvproxy_fd_fails() {
    hostile(&["non-nvproxy-fd"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_double_free_is_ok_for_objects_and_refused_for_clients() {
    hostile(&["double-free"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_numa_info_is_served_on_the_gpu_node_and_einval_on_nvidiactl() {
    hostile(&["numa-info"]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_unknown_client_handle_is_refused() {
    // A handle this instance never allocated (the driver's client handles look like this).
    hostile(&["use-handle", "0xc1d00a5a"]);
}

// ---- policy and audit ---------------------------------------------------------------------

/// A graphics-only control (table caps: graphics), denied to a compute,utility instance in
/// enforce mode; nvsim answers it, so audit mode shows the driver's answer.
const GRAPHICS_CONTROL: &str = "NV2080_CTRL_CMD_FB_GET_INFO";
/// Its info list: `NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE`.
const GRAPHICS_CONTROL_LIST: &str = "8";

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_enforce_mode_denies_control_outside_caps() {
    hostile(&[
        "probe-control",
        GRAPHICS_CONTROL,
        "--list",
        GRAPHICS_CONTROL_LIST,
        "--expect",
        "NV_ERR_NOT_SUPPORTED",
    ]);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_audit_mode_allows_and_logs_control_outside_caps() {
    let dir = scratch_dir("audit");
    let log = dir.join("audit.jsonl");
    let log_s = log.to_str().expect("utf-8 path");
    let ran = exec(
        &[
            "--driver",
            "sim",
            "--mode",
            "audit",
            "--audit-log",
            log_s,
            "--check-leaks",
        ],
        &[
            "probe-control",
            GRAPHICS_CONTROL,
            "--list",
            GRAPHICS_CONTROL_LIST,
            "--expect",
            "NV_OK",
        ],
    );
    ran.assert_success();
    let text = std::fs::read_to_string(&log)
        .unwrap_or_else(|e| panic!("audit log {}: {e}", log.display()));
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line {l:?}: {e}")))
        .collect();
    let hit = events
        .iter()
        .find(|e| e["name"] == GRAPHICS_CONTROL && e["decision"] == "audit-would-deny");
    assert!(
        hit.is_some(),
        "no audit-would-deny event for {GRAPHICS_CONTROL} in {}:\n{text}",
        log.display()
    );
}

// ---- clients that die, many clients -------------------------------------------------------

/// A shell script run inside `nvproxy exec`: `$0` is the client.
fn exec_sh(script: &str, timeout: Duration) -> Ran {
    exec_cmd(SIM, &["/bin/sh", "-c", script, CLIENT], timeout)
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_killed_holding_client_leaks_nothing_and_daemon_serves_on() {
    let script = r#"
        out=/tmp/nvfe-hold.$$
        "$0" hold > "$out" &
        pid=$!
        i=0
        until grep -q '"client"' "$out" 2>/dev/null; do
            i=$((i + 1)); [ "$i" -gt 1200 ] && { echo "hold never ready" >&2; exit 10; }
            sleep 0.1
        done
        cat "$out"
        kill -9 "$pid"; wait "$pid"
        "$0" init --expect-gpus 1
    "#;
    let ran = exec_sh(script, EXEC_TIMEOUT);
    ran.assert_success();
    assert_eq!(ran.summary()["scenario"], "init");
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_client_killed_mid_ioctl_leaks_nothing_and_daemon_serves_on() {
    // Eight threads looping over the init sequence; SIGKILL lands while ioctls are in flight.
    let script = r#"
        "$0" concurrent 8 --iterations 100000 > /dev/null &
        pid=$!
        sleep 3
        kill -9 "$pid"; wait "$pid"
        "$0" init --expect-gpus 1
    "#;
    let ran = exec_sh(script, EXEC_TIMEOUT);
    ran.assert_success();
    assert_eq!(ran.summary()["scenario"], "init");
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_64_concurrent_clients_all_pass() {
    let started = Instant::now();
    let ran = exec_cmd(SIM, &[CLIENT, "concurrent", "64"], LONG_TIMEOUT);
    ran.assert_success();
    let v = ran.summary();
    eprintln!("64 concurrent init sequences: {:?}, {v}", started.elapsed());
    assert_eq!(
        (v["ok"].clone(), v["passed"].clone()),
        (true.into(), 64.into())
    );
}

// ---- two instances on one simulated driver ------------------------------------------------

/// `nvproxy serve` with two instances `a` (sim GPU 0) and `b` (sim GPU 1), waited for READY.
fn serve_two_instances() -> (Proc, PathBuf) {
    serve_two_instances_with_env(&[])
}

/// [`serve_two_instances`] with extra environment variables for the daemon.
fn serve_two_instances_with_env(env: &[(&str, &str)]) -> (Proc, PathBuf) {
    serve_two_instances_with(env, "", "", |_| String::new())
}

/// [`serve_two_instances`] with extra environment variables, extra `[daemon]` keys, and extra
/// sections (given the scratch directory) appended to the config.
fn serve_two_instances_with(
    env: &[(&str, &str)],
    sim_keys: &str,
    daemon_keys: &str,
    sections: impl Fn(&Path) -> String,
) -> (Proc, PathBuf) {
    require_cuse();
    kill_leftover_workers();
    let dir = scratch_dir("serve");
    let config = dir.join("config.toml");
    let text = format!(
        r#"driver = "sim"

[sim]
gpus = 2
driver_version = "535.261.03"
{sim_keys}

[daemon]
memory = "process-vm"
audit_dir = "{audit}"
{daemon_keys}

[[instance]]
name = "a"
gpus = [0]
caps = ["compute", "utility"]

[[instance]]
name = "b"
gpus = [1]
caps = ["compute", "utility"]

{sections}
"#,
        audit = dir.join("audit").display(),
        sections = sections(&dir),
    );
    std::fs::write(&config, text).expect("write config");
    let mut c = Command::new(nvproxy_bin());
    c.arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--check-leaks")
        .envs(env.iter().copied());
    let mut daemon = Proc::spawn("serve", &mut c, false);
    // `READY a b`: every instance serves.
    daemon.wait_line(READY_TIMEOUT, |l| l.starts_with("READY"));
    (daemon, dir)
}

/// `nvproxy run --instance NAME -- nvfe-client ARGS...`, not waited for.
fn run_in(instance: &str, client_args: &[&str], with_stdin: bool) -> Proc {
    let mut c = Command::new(nvproxy_bin());
    c.args(["run", "--instance", instance, "--", CLIENT])
        .args(client_args);
    Proc::spawn(&format!("run {instance}"), &mut c, with_stdin)
}

fn json_line(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"))
}

/// Kills the workers a failed earlier test left serving (they run in their own process groups,
/// so a test's cleanup of its supervisor does not reach them), so that no later supervisor
/// adopts them.
fn kill_leftover_workers() {
    let Ok(dir) = std::fs::read_dir("/run/nvproxy") else {
        return;
    };
    for e in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("worker.json")) else {
            continue;
        };
        if let Some(pid) = json_line(&text)["pid"].as_u64() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid"));
            if nix::sys::signal::kill(pid, Signal::SIGKILL).is_ok() {
                eprintln!("killed a leftover worker {pid}");
                let _ = eventually(Duration::from_secs(10), || {
                    nix::sys::signal::kill(pid, None).is_err()
                });
            }
        }
        let _ = std::fs::remove_file(e.path().join("worker.json"));
    }
}

/// The pid of the worker serving `instance` (its state file).
fn worker_pid(instance: &str) -> u32 {
    let path = format!("/run/nvproxy/{instance}/worker.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    u32::try_from(json_line(&text)["pid"].as_u64().expect("pid")).expect("a pid")
}

/// Whether `pid` holds a `/dev/cuse` channel (serves CUSE nodes).
fn holds_cuse(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == Path::new("/dev/cuse")))
        })
        .unwrap_or(false)
}

/// `nvproxy instance ARGS`: (success, stdout, stderr).
fn instance_cmd(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(nvproxy_bin())
        .arg("instance")
        .args(args)
        .output()
        .expect("nvproxy instance");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Stops the daemon with SIGTERM; checks it exits 0 (with `--check-leaks`: the simulated
/// driver holds nothing) and no instance stopped with objects in its table.
fn stop(mut daemon: Proc) {
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait(EXEC_TIMEOUT);
    assert!(
        status.success(),
        "nvproxy serve --check-leaks: {status:?}\n{}",
        daemon.transcript()
    );
    daemon.assert_no_table_leak();
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_serve_instance_b_cannot_use_instance_a_client_handle() {
    let (daemon, _dir) = serve_two_instances();
    let mut hold = run_in("a", &["hold"], true);
    let held = json_line(&hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"client\"")));
    let handle = held["client"].as_str().expect("client handle").to_owned();

    let mut other = run_in("b", &["use-handle", &handle], false);
    let status = other.wait(EXEC_TIMEOUT);
    assert!(
        status.success(),
        "use-handle in b: {status:?}\n{}",
        other.transcript()
    );

    // A's client survived B's attempts (including RM_FREE of it).
    hold.send("check");
    let checked = json_line(&hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"check\"")));
    assert_eq!(checked["ok"], true, "{checked}");
    hold.send("free");
    let status = hold.wait(EXEC_TIMEOUT);
    assert!(status.success(), "hold: {status:?}\n{}", hold.transcript());

    stop(daemon);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_serve_killed_client_leaves_no_leak_at_sigterm() {
    let (daemon, _dir) = serve_two_instances();
    let mut hold = run_in("a", &["hold"], true);
    let held = json_line(&hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"client\"")));
    let handle = held["client"].as_str().expect("client handle").to_owned();
    hold.kill_group(Signal::SIGKILL);
    let _ = hold.wait(EXEC_TIMEOUT);

    // The dead client's RM client goes with its files (the kernel's RELEASE of them is
    // asynchronous): soon instance a itself refuses the handle.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut p = run_in("a", &["use-handle", &handle], false);
        if p.wait(EXEC_TIMEOUT).success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "instance a still knows the killed client's handle {handle}\n{}",
            p.transcript()
        );
        thread::sleep(Duration::from_millis(500));
    }

    // Both instances still serve.
    for instance in ["a", "b"] {
        let mut p = run_in(instance, &["init", "--expect-gpus", "1"], false);
        let status = p.wait(EXEC_TIMEOUT);
        assert!(
            status.success(),
            "init in {instance}: {status:?}\n{}",
            p.transcript()
        );
    }
    stop(daemon);
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_serve_register_fd_naming_another_instances_ctl_fails_ebadf() {
    let (daemon, _dir) = serve_two_instances();
    // A host process that can open both instances' nodes (their paths under /dev/nvproxy).
    let mut c = Command::new(CLIENT);
    c.args([
        "--dev-dir",
        "/dev/nvproxy/a",
        "cross-instance-fd",
        "--other",
        "/dev/nvproxy/b/nvidiactl",
    ]);
    let mut p = Proc::spawn("client", &mut c, false);
    let status = p.wait(EXEC_TIMEOUT);
    assert!(
        status.success(),
        "cross-instance-fd: {status:?}\n{}",
        p.transcript()
    );
    stop(daemon);
}

// ---- privilege towards the host driver ----------------------------------------------------

/// What the daemon logs (debug, target `nvproxy_worker::device`) when a serving thread has dropped
/// `CAP_SYS_ADMIN`, with its `tid`.
const DROPPED: &str = "request thread runs without CAP_SYS_ADMIN";
/// `CAP_SYS_ADMIN` (linux/capability.h): the NVIDIA driver's `os_is_administrator()`.
const CAP_SYS_ADMIN: u32 = 21;
/// `CAP_SYS_NICE`: what the driver grants the scheduling controls' `RS_ACCESS_NICE` for.
const CAP_SYS_NICE: u32 = 23;

/// One thread of a process as `/proc/<pid>/task/<tid>/` shows it.
#[derive(Debug)]
struct TaskCaps {
    tid: u32,
    comm: String,
    /// `CAP_SYS_ADMIN` in `CapEff` / `CapPrm`.
    admin_eff: bool,
    admin_prm: bool,
    /// `CAP_SYS_NICE` in `CapEff` / `CapPrm`.
    nice_eff: bool,
    nice_prm: bool,
}

/// Every thread of `pid` with its name and whether it holds `CAP_SYS_ADMIN` (threads that exit
/// while being read are skipped).
fn task_caps(pid: u32) -> Vec<TaskCaps> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir}: {e}")) {
        let path = entry.expect("task entry").path();
        let Some(tid) = path.file_name().and_then(|n| n.to_str()?.parse().ok()) else {
            continue;
        };
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(path.join("comm")),
            std::fs::read_to_string(path.join("status")),
        ) else {
            continue; // exited meanwhile
        };
        let cap_bit = |field: &str, bit: u32| {
            let hex = status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .unwrap_or_else(|| panic!("no {field} in {}/status", path.display()))
                .trim();
            let mask =
                u64::from_str_radix(hex, 16).unwrap_or_else(|e| panic!("{field} {hex:?}: {e}"));
            mask & (1 << bit) != 0
        };
        let cap = |field: &str| cap_bit(field, CAP_SYS_ADMIN);
        out.push(TaskCaps {
            tid,
            comm: comm.trim().to_owned(),
            admin_eff: cap("CapEff:"),
            admin_prm: cap("CapPrm:"),
            nice_eff: cap_bit("CapEff:", CAP_SYS_NICE),
            nice_prm: cap_bit("CapPrm:", CAP_SYS_NICE),
        });
    }
    out
}

/// Removes ANSI escape sequences (the log's colours) from `line`.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The `tid`s of the daemon's [`DROPPED`] log lines so far.
fn dropped_tids(daemon: &mut Proc) -> Vec<u32> {
    while let Ok(item) = daemon.lines.try_recv() {
        daemon.store(item);
    }
    daemon
        .stderr
        .iter()
        .map(|l| strip_ansi(l))
        .filter(|l| l.contains(DROPPED))
        .filter_map(|l| {
            let rest = &l[l.find("tid=")? + 4..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// The NVIDIA driver takes an RM caller's privilege from the calling thread's capabilities
/// (`os_is_administrator()` is `capable(CAP_SYS_ADMIN)`). A root daemon's threads that serve
/// the nodes (cuse-dev's `cuse-worker` threads, which run the handlers themselves) must have
/// dropped `CAP_SYS_ADMIN` from their effective and permitted sets, while the rest of the
/// daemon (its main thread) keeps it.
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_serve_request_threads_run_without_cap_sys_admin() {
    let (mut daemon, _dir) =
        serve_two_instances_with_env(&[("RUST_LOG", "info,nvproxy_worker::device=debug")]);
    // Instance a's requests are served by its worker process.
    let pid = worker_pid("a");
    // Requests served: the client opened nvidiactl and allocated an RM client through it.
    let mut hold = run_in("a", &["hold"], true);
    hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"client\""));

    // The log lines come through a pipe and a pump thread: give them a moment to arrive.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (tasks, logged) = loop {
        let tasks = task_caps(pid);
        let logged = dropped_tids(&mut daemon);
        let all_logged = tasks
            .iter()
            .filter(|t| t.comm == "cuse-worker")
            .all(|t| logged.contains(&t.tid));
        if all_logged || Instant::now() >= deadline {
            break (tasks, logged);
        }
        thread::sleep(Duration::from_millis(100));
    };
    let dump = format!("{tasks:#?}\nlogged tids: {logged:?}");
    let main = tasks
        .iter()
        .find(|t| t.tid == pid)
        .unwrap_or_else(|| panic!("no main thread\n{dump}"));
    assert!(
        main.admin_eff && main.admin_prm,
        "the worker's main thread lost CAP_SYS_ADMIN (the VM runs it as root)\n{dump}"
    );
    let workers: Vec<&TaskCaps> = tasks.iter().filter(|t| t.comm == "cuse-worker").collect();
    assert!(!workers.is_empty(), "no cuse-worker thread\n{dump}");
    for w in &workers {
        assert!(
            !w.admin_eff && !w.admin_prm,
            "serving thread {} holds CAP_SYS_ADMIN\n{dump}",
            w.tid
        );
        // CAP_SYS_NICE stays permitted (the proxy raises it for the instance's interleave
        // level alone) but out of the effective set: tenants' calls get RS_ACCESS_NICE refused.
        assert!(
            !w.nice_eff && w.nice_prm,
            "serving thread {} holds CAP_SYS_NICE effective or lost it\n{dump}",
            w.tid
        );
        assert!(
            logged.contains(&w.tid),
            "serving thread {} never logged its drop\n{dump}",
            w.tid
        );
    }
    for tid in &logged {
        if let Some(t) = tasks.iter().find(|t| t.tid == *tid) {
            assert_eq!(t.comm, "cuse-worker", "{dump}");
        }
    }

    hold.send("free");
    let status = hold.wait(EXEC_TIMEOUT);
    assert!(status.success(), "hold: {status:?}\n{}", hold.transcript());
    stop(daemon);
}

// ---- the process model: a worker per instance, the supervisor, the instance API -------------

/// `nvfe-client init` through `init_in` and the UVM managed-memory mmap pattern
/// (`mmap-client uvm-map`, which needs the worker to read the tenant's maps) through `map_in`.
fn init_and_uvm_map(init_in: &str, map_in: &str) {
    let mut p = run_in(init_in, &["init", "--expect-gpus", "1"], false);
    assert!(
        p.wait(EXEC_TIMEOUT).success(),
        "init in {init_in}\n{}",
        p.transcript()
    );
    let mut c = Command::new(nvproxy_bin());
    c.args([
        "run",
        "--instance",
        map_in,
        "--",
        env!("CARGO_BIN_EXE_mmap-client"),
    ])
    .args(["uvm-map", "--count", "2"]);
    let mut m = Proc::spawn(&format!("run {map_in} uvm-map"), &mut c, false);
    assert!(
        m.wait(EXEC_TIMEOUT).success(),
        "uvm-map in {map_in}\n{}",
        m.transcript()
    );
}

/// `/proc/PID/status` field `Uid:`/`Gid:` (real, effective, saved, fs) and `CapEff:` of `pid`.
fn ids_and_caps(pid: u32) -> (String, String, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let eff = u64::from_str_radix(&field("CapEff:"), 16).expect("CapEff hex");
    (field("Uid:"), field("Gid:"), eff)
}

/// `[daemon] worker_uids`: each worker runs under its own uid and gid from the range (so the
/// RM clients it creates for its tenants carry an euid no other instance and no tenant has:
/// what `osValidateClientTokens` compares), with `CAP_SYS_PTRACE` as its only capability; it
/// still serves: `process-vm` reads of the tenant's memory, the mmap path (the worker reads
/// the tenant's `/proc/PID/maps` for a UVM managed range), its stats and the metrics.
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_serve_workers_run_under_their_own_uids_and_still_serve() {
    let (daemon, _dir) =
        serve_two_instances_with(&[], "", "worker_uids = \"61000-61009\"", |_| String::new());
    let (a, b) = (worker_pid("a"), worker_pid("b"));
    // CAP_SYS_PTRACE (19) and CAP_SYS_NICE (23, the instance's interleave level: serving
    // threads keep it out of their effective set, docs/architecture/scheduling.md).
    let ptrace_nice = 1u64 << 19 | 1 << 23;
    let (ua, ga, ea) = ids_and_caps(a);
    let (ub, gb, eb) = ids_and_caps(b);
    assert_eq!(
        (ua.as_str(), ga.as_str()),
        ("61000 61000 61000 61000", "61000 61000 61000 61000")
    );
    assert_eq!(
        (ub.as_str(), gb.as_str()),
        ("61001 61001 61001 61001", "61001 61001 61001 61001")
    );
    assert_eq!(
        (ea, eb),
        (ptrace_nice, ptrace_nice),
        "CapEff of the workers"
    );
    // Every thread of the worker: the serving threads too.
    for t in std::fs::read_dir(format!("/proc/{a}/task"))
        .expect("tasks")
        .flatten()
    {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        if let Some(eff) = status.lines().find_map(|l| l.strip_prefix("CapEff:")) {
            let eff = u64::from_str_radix(eff.trim(), 16).unwrap_or(u64::MAX);
            assert_eq!(eff & !ptrace_nice, 0, "thread {}", t.path().display());
        }
        if let Some(uid) = status.lines().find_map(|l| l.strip_prefix("Uid:")) {
            assert_eq!(
                uid.split_whitespace().collect::<Vec<_>>(),
                ["61000"; 4],
                "thread {}",
                t.path().display()
            );
        }
    }
    init_and_uvm_map("a", "b");
    let (_, list, _) = instance_cmd(&["list"]);
    assert!(
        list.lines().filter(|l| l.ends_with("running")).count() == 2,
        "{list}"
    );
    stop(daemon);
}

/// `[sim] process = true`: each instance's simulated driver is a process of its own, which the
/// workers reach through its socket (with the mmap fds passed over it) and which outlives them:
/// a worker killed while its client holds an RM client is restarted against the same driver
/// process, which closed the dead worker's files as the kernel closes a dead process's (the
/// leak check at the end, against that driver, finds nothing), and the other instance's client
/// notices nothing. Workers under their own uids reach it too.
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_serve_sim_driver_process_outlives_a_killed_worker() {
    let (mut daemon, _dir) = serve_two_instances_with(
        &[],
        "process = true",
        "worker_uids = \"61000-61009\"",
        |_| String::new(),
    );
    let sim_pid = |inst: &str| -> u32 {
        std::fs::read_to_string(format!("/run/nvproxy/{inst}/sim.pid"))
            .unwrap_or_else(|e| panic!("{inst}: sim.pid: {e}"))
            .trim()
            .parse()
            .unwrap()
    };
    let (sa, sb) = (sim_pid("a"), sim_pid("b"));
    let (wa, wb) = (worker_pid("a"), worker_pid("b"));
    assert!(
        sa != sb && sa != wa && sb != wb,
        "sims {sa} {sb}, workers {wa} {wb}"
    );
    assert!(!holds_cuse(sa), "the sim-driver serves no node");
    // Through the remote driver: the frontend, and the UVM mmap path (its memfd crosses the
    // driver's socket).
    init_and_uvm_map("b", "b");

    let mut hold_a = run_in("a", &["hold"], true);
    hold_a.wait_line(EXEC_TIMEOUT, |l| l.contains("\"client\""));
    let mut hold_b = run_in("b", &["hold"], true);
    hold_b.wait_line(EXEC_TIMEOUT, |l| l.contains("\"client\""));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(wa as i32), Signal::SIGKILL).unwrap();
    daemon.wait_err_line(EXEC_TIMEOUT, |l| l.contains("worker exited unasked"));
    assert!(
        eventually(EXEC_TIMEOUT, || std::fs::read_to_string(
            "/run/nvproxy/a/worker.json"
        )
        .is_ok_and(|t| json_line(&t)["pid"].as_u64() != Some(u64::from(wa)))),
        "no new worker for a\n{}",
        daemon.transcript()
    );
    assert_eq!(sim_pid("a"), sa, "the driver process went with the worker");
    // Its nodes went with the worker; the driver closed the dead worker's files. The driver
    // process and the supervisor log from two processes into one pipe: its line may come
    // before or after the supervisor's "worker exited unasked", so it is waited for (a line
    // read already counts).
    drop(hold_a);
    daemon.wait_err_line(EXEC_TIMEOUT, |l| {
        l.contains("session ended; its files closed") && !l.contains("files=0")
    });
    hold_b.send("check");
    let checked = json_line(&hold_b.wait_line(EXEC_TIMEOUT, |l| l.contains("\"check\"")));
    assert_eq!(checked["ok"], true, "b's client: {checked}");
    hold_b.send("free");
    assert!(
        hold_b.wait(EXEC_TIMEOUT).success(),
        "hold b\n{}",
        hold_b.transcript()
    );
    let mut p = run_in("a", &["init", "--expect-gpus", "1"], false);
    assert!(
        p.wait(EXEC_TIMEOUT).success(),
        "init in a after the restart\n{}",
        p.transcript()
    );
    // --check-leaks: each worker asks its driver process at stop; a's must not still hold the
    // dead worker's client.
    stop(daemon);
    assert!(
        eventually(Duration::from_secs(20), || nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(sa as i32),
            None
        )
        .is_err()),
        "the sim-driver outlived its instance"
    );
}

/// `nvproxy instance upgrade` (issue 13): a client loops through two mappings of one RM memory
/// object, RM controls on its client, new mmaps (tickets, the mmap socket) and whole new
/// sessions while its instance's worker is replaced three times, live, by new processes; one
/// more upgrade fails on purpose after the state was sent (fault injection) and the old worker
/// serves on. The client sees no error at all; the other instance's worker is untouched; at
/// stop the driver process holds nothing (`--check-leaks`). The client also keeps a UVM
/// va_space with a managed-style range it touches and validates every round.
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_live_upgrades_under_a_looping_client_cause_no_error() {
    // In the instance's run directory, which its worker's uid owns (it removes the trigger).
    let trigger = PathBuf::from("/run/nvproxy/a/fault-take-over");
    let trigger_env = trigger.to_str().unwrap().to_owned();
    let (daemon, dir) = serve_two_instances_with(
        &[("NVPROXY_FAULT_TAKE_OVER", &trigger_env)],
        "process = true",
        // Workers under their own uids: the new worker (same uid) takes the old one's files.
        "worker_uids = \"61000-61009\"",
        |_| String::new(),
    );
    let stop_file = dir.join("stop-live");
    let mut c = Command::new(nvproxy_bin());
    c.args([
        "run",
        "--instance",
        "a",
        "--",
        MMAP_CLIENT,
        "live",
        "--stop-file",
    ])
    .arg(&stop_file);
    let mut client = Proc::spawn("live a", &mut c, false);
    client.wait_line(EXEC_TIMEOUT, |l| l.contains("\"started\""));
    let b_pid = worker_pid("b");
    let mut pids = vec![worker_pid("a")];
    let gone = |pid: u32| {
        eventually(Duration::from_secs(20), || {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_err()
        })
    };
    for round in 0..4 {
        thread::sleep(Duration::from_millis(1500));
        let old = *pids.last().unwrap();
        if round == 1 {
            std::fs::write(&trigger, "").unwrap();
            let (ok, out, err) = instance_cmd(&["upgrade", "a"]);
            assert!(!ok, "the failed upgrade reported success: {out}");
            assert!(err.contains("serves on"), "{err}");
            assert!(!trigger.exists(), "the new worker never saw the trigger");
            assert_eq!(worker_pid("a"), old, "a failed upgrade replaced the worker");
            assert!(
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(old as i32), None).is_ok(),
                "the old worker exited after a failed upgrade"
            );
            continue;
        }
        let (ok, out, err) = instance_cmd(&["upgrade", "a"]);
        assert!(ok, "upgrade {round}: {out}{err}\n{}", daemon.transcript());
        assert!(out.contains("upgraded"), "{out}");
        let now = worker_pid("a");
        assert!(
            !pids.contains(&now),
            "upgrade {round}: worker pid {now} again"
        );
        assert!(
            gone(old),
            "upgrade {round}: the old worker {old} still runs"
        );
        assert!(holds_cuse(now), "the new worker serves no node");
        pids.push(now);
    }
    assert_eq!(pids.len(), 4, "three upgrades");
    thread::sleep(Duration::from_millis(1500));
    std::fs::write(&stop_file, "").unwrap();
    assert!(
        client.wait(EXEC_TIMEOUT).success(),
        "the client saw errors\n{}\n{}",
        client.transcript(),
        daemon.transcript()
    );
    let report = client
        .transcript()
        .lines()
        .rev()
        .find(|l| l.contains("\"rounds\""))
        .map(json_line)
        .expect("the client's report");
    eprintln!("live upgrades: workers {pids:?}; the client: {report}");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert!(report["rounds"].as_u64().unwrap() >= 20, "{report}");
    assert_eq!(worker_pid("b"), b_pid, "b's worker was touched");
    // The upgraded worker's table and counts: it knows what the client did before it.
    let (ok, out, _) = instance_cmd(&["show", "a"]);
    assert!(ok, "{out}");
    stop(daemon);
}

/// `nvproxy instance checkpoint` and `restore` across a driver reload: with `[sim] process =
/// true` the instance's driver is a process; it is killed (everything the driver held is gone,
/// as at a module reload) and a fresh one starts on the same socket; `restore` replays the
/// saved objects onto it, and the client that held an RM client, a device and a subdevice
/// through the reload goes on with its old handles (`check`, then its frees), while the
/// driver's leak check at stop finds nothing.
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_checkpoint_and_restore_across_a_driver_reload() {
    let (daemon, dir) = serve_two_instances_with(&[], "process = true", "", |_| String::new());
    let mut hold = run_in("a", &["hold"], true);
    hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"client\""));
    let ckpt = dir.join("a.ckpt.json");
    let (ok, out, err) = instance_cmd(&["checkpoint", "a", ckpt.to_str().unwrap()]);
    assert!(ok, "checkpoint: {out}{err}");
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&ckpt).unwrap()).unwrap();
    assert_eq!(saved["format"], "nvproxy-checkpoint", "{saved}");

    // The reload: the driver process dies, a fresh one serves the socket.
    let pid: i32 = std::fs::read_to_string("/run/nvproxy/a/sim.pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    assert!(
        eventually(Duration::from_secs(20), || nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            None
        )
        .is_err()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "))),
        "the old driver did not die"
    );
    let mut fresh = Command::new(nvproxy_bin());
    fresh.args([
        "sim-driver",
        "--socket",
        "/run/nvproxy/a/sim.sock",
        "--gpus",
        "2",
        "--handle-key",
        "a",
    ]);
    let mut fresh = Proc::spawn("fresh sim-driver", &mut fresh, false);
    fresh.wait_line(EXEC_TIMEOUT, |l| l.trim() == "READY");

    let (ok, out, err) = instance_cmd(&["restore", ckpt.to_str().unwrap()]);
    assert!(ok, "restore: {out}{err}\n{}", daemon.transcript());
    hold.send("check");
    let checked = json_line(&hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"check\"")));
    assert_eq!(
        checked["ok"], true,
        "the client after the reload and restore: {checked}"
    );
    hold.send("free");
    assert!(
        hold.wait(EXEC_TIMEOUT).success(),
        "hold\n{}",
        hold.transcript()
    );
    // --check-leaks asks the fresh driver: the replayed objects were freed by the client.
    stop(daemon);
    fresh.signal(Signal::SIGTERM);
    let _ = fresh.wait(EXEC_TIMEOUT);
}

/// The metrics (`nvproxy metrics` on the control socket, and HTTP on `[daemon]
/// metrics_listen`) count what the workers served, and the `[cdi] spec` follows `instance
/// create` and `rm`.
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_serve_metrics_and_the_cdi_spec_follow_the_instances() {
    let (daemon, dir) =
        serve_two_instances_with(&[], "", "metrics_listen = \"127.0.0.1:19464\"", |dir| {
            format!(
                "[cdi]\nspec = \"{}\"\n",
                dir.join("cdi/nvproxy.json").display()
            )
        });
    let spec_path = dir.join("cdi/nvproxy.json");
    let devices = || -> Vec<String> {
        let text = std::fs::read_to_string(&spec_path).unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        v["devices"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter_map(|x| x["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(devices(), ["a", "b"], "the spec at start");

    let mut p = run_in("a", &["init", "--expect-gpus", "1"], false);
    assert!(
        p.wait(EXEC_TIMEOUT).success(),
        "init in a\n{}",
        p.transcript()
    );
    let out = Command::new(nvproxy_bin())
        .arg("metrics")
        .output()
        .expect("nvproxy metrics");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "nvproxy metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.lines().any(|l| l == "nvproxy_workers 2"), "{text}");
    let allowed_in_a = |text: &str| -> u64 {
        text.lines()
            .filter(|l| {
                l.starts_with("nvproxy_ioctls_total{instance=\"a\"")
                    && l.contains("decision=\"allowed\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    assert!(
        allowed_in_a(&text) > 10,
        "init's ioctls are counted\n{text}"
    );
    let count_line = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("nvproxy_ioctl_duration_seconds_count{instance=\"a\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(
        count_line(&text) >= allowed_in_a(&text),
        "the histogram counts every ioctl\n{text}"
    );
    // The same over HTTP.
    let http = {
        let mut s = std::net::TcpStream::connect("127.0.0.1:19464").expect("metrics_listen");
        write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(http.starts_with("HTTP/1.0 200"), "{http}");
    assert!(allowed_in_a(&http) >= allowed_in_a(&text), "{http}");

    let (ok, _, err) = instance_cmd(&["create", "c", "--gpus", "0"]);
    assert!(ok, "create c: {err}");
    assert_eq!(devices(), ["a", "b", "c"], "the spec after create");
    let (ok, _, err) = instance_cmd(&["rm", "b"]);
    assert!(ok, "rm b: {err}");
    assert_eq!(devices(), ["a", "c"], "the spec after rm");
    stop(daemon);
    assert!(!spec_path.exists(), "the spec outlived the daemon");
}

/// Each instance is served by its own worker process (not the supervisor), which holds the
/// instance's CUSE channels; the instance API lists both with their workers.
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_serve_runs_one_worker_process_per_instance() {
    let (daemon, _dir) = serve_two_instances();
    let (a, b) = (worker_pid("a"), worker_pid("b"));
    let sup = daemon.child.id();
    assert!(
        a != b && a != sup && b != sup,
        "workers {a} {b}, supervisor {sup}"
    );
    assert!(
        holds_cuse(a) && holds_cuse(b),
        "the workers serve the nodes"
    );
    assert!(!holds_cuse(sup), "the supervisor holds a CUSE channel");
    let (ok, out, err) = instance_cmd(&["list"]);
    assert!(ok, "instance list: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{out}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with('a') && l.contains(&a.to_string()) && l.ends_with("running")),
        "{out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with('b') && l.contains(&b.to_string()) && l.ends_with("running")),
        "{out}"
    );
    let mut p = run_in("a", &["init", "--expect-gpus", "1"], false);
    assert!(
        p.wait(EXEC_TIMEOUT).success(),
        "init in a\n{}",
        p.transcript()
    );
    stop(daemon);
}

/// A worker killed under its tenants: the other instance's client keeps working, the
/// supervisor reports the crash and starts a new worker, which serves again.
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_serve_a_killed_worker_is_restarted_and_the_other_instance_is_untouched() {
    let (mut daemon, _dir) = serve_two_instances();
    let mut hold = run_in("b", &["hold"], true);
    hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"client\""));
    let old = worker_pid("a");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old as i32), Signal::SIGKILL).unwrap();
    daemon.wait_err_line(EXEC_TIMEOUT, |l| {
        l.contains("worker exited unasked") && l.contains("signal 9")
    });
    assert!(
        eventually(EXEC_TIMEOUT, || std::fs::read_to_string(
            "/run/nvproxy/a/worker.json"
        )
        .is_ok_and(|t| json_line(&t)["pid"].as_u64() != Some(u64::from(old)))),
        "no new worker for a\n{}",
        daemon.transcript()
    );
    hold.send("check");
    let checked = json_line(&hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"check\"")));
    assert_eq!(
        checked["ok"], true,
        "b's client after a's worker died: {checked}"
    );
    let mut p = run_in("a", &["init", "--expect-gpus", "1"], false);
    assert!(
        p.wait(EXEC_TIMEOUT).success(),
        "init in a after the restart\n{}",
        p.transcript()
    );
    let (_, out, _) = instance_cmd(&["show", "a"]);
    assert!(out.contains("running"), "{out}");
    hold.send("free");
    assert!(
        hold.wait(EXEC_TIMEOUT).success(),
        "hold\n{}",
        hold.transcript()
    );
    stop(daemon);
}

/// The supervisor killed and started again: its workers kept serving (a client holding an RM
/// client meanwhile notices nothing) and the new supervisor adopts them instead of starting
/// new ones.
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_serve_a_restarted_supervisor_adopts_the_running_workers() {
    let (mut daemon, dir) = serve_two_instances();
    let (a, b) = (worker_pid("a"), worker_pid("b"));
    let mut hold = run_in("a", &["hold"], true);
    hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"client\""));
    daemon.signal(Signal::SIGKILL);
    let _ = daemon.wait(EXEC_TIMEOUT);
    hold.send("check");
    let checked = json_line(&hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"check\"")));
    assert_eq!(
        checked["ok"], true,
        "client without a supervisor: {checked}"
    );

    let mut c = Command::new(nvproxy_bin());
    c.args(["serve", "--config"])
        .arg(dir.join("config.toml"))
        .arg("--check-leaks");
    let mut again = Proc::spawn("serve again", &mut c, false);
    again.wait_line(READY_TIMEOUT, |l| l.starts_with("READY"));
    assert_eq!(
        (worker_pid("a"), worker_pid("b")),
        (a, b),
        "workers replaced, not adopted"
    );
    again.wait_err_line(EXEC_TIMEOUT, |l| l.contains("worker re-adopted"));
    hold.send("check");
    let checked = json_line(&hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"check\"")));
    assert_eq!(checked["ok"], true, "client after the adoption: {checked}");
    hold.send("free");
    assert!(
        hold.wait(EXEC_TIMEOUT).success(),
        "hold\n{}",
        hold.transcript()
    );
    // The adopted workers stop with the new supervisor.
    again.signal(Signal::SIGTERM);
    let status = again.wait(EXEC_TIMEOUT);
    assert!(status.success(), "{status:?}\n{}", again.transcript());
    assert!(eventually(Duration::from_secs(30), || !Path::new(
        &format!("/proc/{a}")
    )
    .exists()));
}

/// `nvproxy instance create` starts a worker for a new instance, which serves; `rm` refuses
/// while a file is open and `rm --force` revokes it.
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_instance_api_creates_and_removes_instances() {
    let (daemon, _dir) = serve_two_instances();
    let (ok, out, err) = instance_cmd(&["create", "c", "--gpus", "1"]);
    assert!(ok, "create: {out}{err}");
    assert!(out.contains("instance c created"), "{out}");
    let (ok, _, err) = instance_cmd(&["create", "c", "--gpus", "1"]);
    assert!(!ok && err.contains("exists already"), "{err}");
    let (ok, _, err) = instance_cmd(&["create", "d", "--gpus", "7"]);
    assert!(!ok && err.contains("GPU 7"), "{err}");
    let mut p = run_in("c", &["init", "--expect-gpus", "1"], false);
    assert!(
        p.wait(EXEC_TIMEOUT).success(),
        "init in c\n{}",
        p.transcript()
    );

    let mut hold = run_in("c", &["hold"], true);
    hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"client\""));
    let (ok, _, err) = instance_cmd(&["rm", "c"]);
    assert!(
        !ok && err.contains("open file"),
        "rm with a file open: {err}"
    );
    let (ok, out, err) = instance_cmd(&["rm", "--force", "c"]);
    assert!(ok, "rm --force: {out}{err}");
    // The holder's files are revoked: its next call fails (ENOTCONN from the gone node).
    hold.send("check");
    let checked = json_line(&hold.wait_line(EXEC_TIMEOUT, |l| l.contains("\"check\"")));
    assert!(
        checked["check"]
            .as_str()
            .is_some_and(|c| c.contains("ENOTCONN")),
        "a revoked file still works: {checked}"
    );
    hold.kill_group(Signal::SIGKILL);
    let _ = hold.wait(EXEC_TIMEOUT);
    assert!(
        !Path::new("/dev/nvproxy/c").exists(),
        "c's nodes are still there"
    );
    let (_, out, _) = instance_cmd(&["list"]);
    assert!(!out.lines().any(|l| l.starts_with("c ")), "{out}");
    stop(daemon);
}

/// The command of `nvproxy exec` runs in its own pid namespace with its own /proc: it is not
/// pid 1 (an init reaps for it), it sees only the namespace's processes, and no process of the
/// host (the daemon, other instances' clients) has a `/proc/<pid>/root` it could walk into.
/// (Before, a root tenant could open another instance's nodes through
/// `/proc/<their pid>/root/dev/...`.)
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_exec_command_runs_in_its_own_pid_namespace() {
    let daemon_pid = std::process::id();
    let script = format!(
        r#"
        echo "pid=$$"
        echo "procs=$(ls /proc | grep -cE '^[0-9]+$')"
        [ -e /proc/{daemon_pid}/root/dev ] && echo "host-visible=yes" || echo "host-visible=no"
        "$0" init --expect-gpus 1
    "#
    );
    let ran = exec_sh(&script, EXEC_TIMEOUT);
    ran.assert_success();
    let out = ran.proc_.stdout.join("\n");
    assert!(
        out.contains("pid=2"),
        "the command is not pid 2 of a new namespace\n{out}"
    );
    let procs: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("procs="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no process count\n{out}"));
    assert!(
        procs <= 6,
        "{procs} processes visible in the namespace\n{out}"
    );
    assert!(out.contains("host-visible=no"), "{out}");
    assert_eq!(ran.summary()["scenario"], "init");
}

// ---- the real-driver path without a GPU ----------------------------------------------------

/// Issue 26, item 0: `RealHostDriver`'s ioctl path (the buffers assembled and their pointers
/// patched in the worker, `ioctl(2)` on a real fd, fds handed back) run before any GPU does:
/// `tests/vm/sim-as-driver.sh` serves the simulated driver on CUSE nodes made the host's
/// `/dev/nvidiactl`, `/dev/nvidia0`, `/dev/nvidia-uvm` (with its `/proc/driver/nvidia`), and
/// `nvproxy exec --driver host` serves the client over them: `nvfe-client`'s init and hostile
/// scenarios, and `nvidia-smi -L` and `-q` where NVIDIA's userspace was fetched; then a held
/// client through a live upgrade and through a checkpoint, a driver reload and a restore, on
/// `nvproxy serve --driver host`. (What maps the driver's files, every CUDA step, needs a real
/// driver: CUSE has no mmap.)
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_the_real_driver_path_runs_over_the_simulated_driver_as_the_host_driver() {
    require_cuse();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = root.join("tests/vm/sim-as-driver.sh");
    let bin = nvproxy_bin();
    let bin_dir = bin.parent().expect("nvproxy's directory");
    let mut steps: Vec<String> = [
        "init --expect-gpus 1",
        "unknown-escape",
        "bad-nested-pointer",
        "foreign-fd",
        "double-free",
    ]
    .iter()
    .map(|s| format!("{CLIENT} {s} >/dev/null"))
    .collect();
    let smi = std::env::var_os("NVIDIA_USERSPACE_DIR")
        .map(|d| PathBuf::from(d).join("535.261.03"))
        .filter(|d| d.join("bin/nvidia-smi").is_file());
    match &smi {
        Some(d) => {
            let (lib, smi) = (d.join("lib"), d.join("bin/nvidia-smi"));
            let env = format!("env LD_LIBRARY_PATH={}", lib.display());
            steps.push(format!("{env} {} -L | grep -q '^GPU 0: '", smi.display()));
            steps.push(format!(
                "{env} {} -q | grep -q 'Product Name'",
                smi.display()
            ));
        }
        None => eprintln!("nvidia-smi part SKIPPED: NVIDIA_USERSPACE_DIR has no 535.261.03"),
    }
    let out = Command::new(&script)
        .args(["sh", "-ec", &steps.join("\n")])
        .env("BIN", bin_dir)
        .env("CLIENT", CLIENT)
        .env("SIM_AS_DRIVER_BASELINE", "3")
        .env("SIM_AS_DRIVER_STATE", "1")
        .current_dir(&root)
        .output()
        .expect("sim-as-driver.sh");
    assert!(
        out.status.success(),
        "{}: {}\nstdout:\n{}\nstderr:\n{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The baseline on the same device (a figure for the log, never a failure).
    let err = String::from_utf8_lossy(&out.stderr);
    let baseline = err
        .lines()
        .find(|l| l.starts_with("sim-as-driver baseline:"));
    eprintln!(
        "{}",
        baseline.unwrap_or("sim-as-driver baseline: not measured")
    );
    assert!(baseline.is_some(), "{err}");
    // The state of an instance on the real-driver path: its client's handles work after a live
    // upgrade and after a checkpoint, a driver reload and a restore (the script fails
    // otherwise; these lines say it got that far).
    for step in [
        "check 1 after a live upgrade",
        "check 2 after a checkpoint, a driver reload and a restore",
        "the client freed its objects",
    ] {
        assert!(err.contains(step), "no {step:?}:\n{err}");
    }
}
