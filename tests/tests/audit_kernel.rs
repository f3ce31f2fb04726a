//! Allowlist auditing end to end, through the real kernel's CUSE: a workload runs under
//! `nvproxy exec --mode audit --audit-log F`, `nvproxy policy suggest --from-audit F` turns the
//! log into an allowlist-only policy, the workload passes under `--policy P` in enforce mode,
//! and with one entry taken out of P that call gets the driver's refusal and the audit log
//! names it. The workloads: `nvfe-client init`, `mmap-client uvm-map` (UVM) and NVIDIA's own
//! `libcuda.so.1` (`cuda-probe init`: `cuInit` and the device queries). Also: `nvproxy
//! audit summary`, `serve` with policy files, and the counts written when the command is killed
//! or nvproxy itself is signalled.
//!
//! Needs `/dev/cuse` and root: `#[ignore]`d, run by `tests/run-kernel-tests.sh` (natively or in
//! the CUSE VM), which builds the daemon and the shim and sets `NVPROXY_BIN`, and fetches
//! NVIDIA's userspace (`NVIDIA_USERSPACE_DIR`, `tests/nvidia-userspace/fetch.sh`).

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use tests::harness::{nvproxy_bin, require_cuse};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::Value;

const NVFE: &str = env!("CARGO_BIN_EXE_nvfe-client");
const MMAP: &str = env!("CARGO_BIN_EXE_mmap-client");
const PROBE: &str = env!("CARGO_BIN_EXE_cuda-probe");
/// The NVIDIA userspace version of the libcuda round trip: `exec --driver sim`'s default.
const CUDA_VERSION: &str = "535.261.03";
/// One `nvproxy exec` (the VM guest runs 10-50x slower than the host).
const TIMEOUT: Duration = Duration::from_secs(240);
/// The control taken out of the suggested policy: `init` asks it once per GPU.
const REMOVED: &str = "NV2080_CTRL_CMD_GPU_GET_NAME_STRING";
/// Its command number, as cuda-probe prints it.
const REMOVED_CMD: &str = "0x20800110";
/// `NV_ERR_NOT_SUPPORTED`: a denied control's status (ioctl-proxy `policy` module docs).
const NV_ERR_NOT_SUPPORTED: u64 = 0x56;

fn scratch_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "nvproxy-audit-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// A child in its own process group, its output collected line by line (and echoed).
struct Proc {
    child: Child,
    tag: String,
    lines: mpsc::Receiver<(bool, String)>,
    stdout: Vec<String>,
    stderr: Vec<String>,
}

impl Proc {
    fn spawn(tag: &str, cmd: &mut Command) -> Proc {
        let line = format!("{cmd:?}");
        eprintln!("[{tag}] $ {line}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {line}: {e}"));
        let (tx, lines) = mpsc::channel();
        pump(child.stdout.take().unwrap(), tag, true, tx.clone());
        pump(child.stderr.take().unwrap(), tag, false, tx);
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

    /// Waits for a stdout line that starts with `want`.
    fn wait_line(&mut self, want: &str) {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok((true, l)) if l.starts_with(want) => return self.stdout.push(l),
                Ok(item) => self.store(item),
                Err(e) => panic!(
                    "{}: no line {want:?} ({e:?})\n{}",
                    self.tag,
                    self.transcript()
                ),
            }
        }
    }

    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let until = Instant::now() + Duration::from_secs(10);
                while let Ok(item) = self
                    .lines
                    .recv_timeout(until.saturating_duration_since(Instant::now()))
                {
                    self.store(item);
                }
                eprintln!("[{}] {status:?}", self.tag);
                return status;
            }
            while let Ok(item) = self.lines.try_recv() {
                self.store(item);
            }
            if Instant::now() >= deadline {
                let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
                let _ = self.child.wait();
                panic!(
                    "{}: still running after {TIMEOUT:?}\n{}",
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

    /// The client's JSON summary line.
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
            let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

fn pump(
    stream: impl Read + Send + 'static,
    tag: &str,
    out: bool,
    tx: mpsc::Sender<(bool, String)>,
) {
    let tag = format!("{tag} {}", if out { "out" } else { "err" });
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

/// `nvproxy ARGS`, waited for; must succeed.
fn nvproxy(tag: &str, args: &[&str]) -> Proc {
    let mut p = Proc::spawn(tag, Command::new(nvproxy_bin()).args(args));
    let status = p.wait();
    assert_ok(&p, status);
    p
}

/// `nvproxy exec --driver sim EXEC_ARGS -- CMD`, waited for; returns the process and status.
fn exec(tag: &str, exec_args: &[&str], cmd: &[&str]) -> (Proc, ExitStatus) {
    require_cuse();
    let mut c = Command::new(nvproxy_bin());
    c.args(["exec", "--driver", "sim"])
        .args(exec_args)
        .arg("--")
        .args(cmd);
    let mut p = Proc::spawn(tag, &mut c);
    let status = p.wait();
    (p, status)
}

fn assert_ok(p: &Proc, status: ExitStatus) {
    assert!(
        status.success(),
        "{}: exit {status:?}, want 0\n{}",
        p.tag,
        p.transcript()
    );
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The audit log's JSON lines.
fn audit_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading audit log {}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line {l:?}: {e}")))
        .collect()
}

/// Lines of `ty` ("event" or "count") naming `name`.
fn lines_naming<'a>(lines: &'a [Value], ty: &str, name: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|v| v["type"] == ty && v["name"] == name)
        .collect()
}

/// `policy suggest --from-audit LOG` into DIR/NAME; returns its path and text.
fn suggest(dir: &Path, log: &Path, name: &str) -> (PathBuf, String) {
    let p = nvproxy("suggest", &["policy", "suggest", "--from-audit", s(log)]);
    let text = p.stdout.join("\n") + "\n";
    let path = dir.join(name);
    std::fs::write(&path, &text).expect("write policy");
    (path, text)
}

/// The policy text without the line that names `entry` (an array element of its own).
fn without(text: &str, entry: &str) -> String {
    let quoted = format!("\"{entry}\"");
    let out: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with(&quoted))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(out.len(), text.len(), "{entry} not in the policy\n{text}");
    out
}

/// The TOML array `key` of a policy text, as names.
fn array(text: &str, key: &str) -> Vec<String> {
    let start = text
        .find(&format!("\n{key} = ["))
        .unwrap_or_else(|| panic!("no {key} in\n{text}"));
    let rest = &text[start + key.len() + 5..];
    let end = rest.find(']').expect("array end");
    rest[..end]
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix('"')?
                .split('"')
                .next()
                .map(str::to_owned)
        })
        .collect()
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_audit_suggest_enforce_round_trip_with_nvfe_client() {
    let dir = scratch_dir("nvfe");
    let log = dir.join("run.jsonl");

    // 1. The workload in audit mode.
    let (p, st) = exec(
        "audit",
        &["--mode", "audit", "--audit-log", s(&log), "--check-leaks"],
        &[NVFE, "init"],
    );
    assert_ok(&p, st);
    let lines = audit_lines(&log);
    for name in ["NV_ESC_CARD_INFO", "NV01_ROOT_CLIENT", REMOVED] {
        let c = lines_naming(&lines, "count", name);
        assert!(
            c.iter()
                .any(|v| v["decision"] == "allowed" && v["count"].as_u64() > Some(0)),
            "no allowed count line for {name}: {lines:#?}"
        );
    }

    // 2. The readable table.
    let sum = nvproxy("summary", &["audit", "summary", s(&log)]);
    let table = sum.stdout.join("\n");
    assert!(
        sum.stdout.iter().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() == 4 && w[0] == REMOVED && w[1] == "control" && w[3] == "allowed"
        }),
        "{REMOVED} row missing\n{table}"
    );
    assert!(table.contains("total: "), "{table}");

    // 3. The suggestion: carriers included, and it checks against the sim's version.
    let (policy, text) = suggest(&dir, &log, "policy.toml");
    let escapes = array(&text, "escapes");
    for e in [
        "NV_ESC_CHECK_VERSION_STR",
        "NV_ESC_CARD_INFO",
        "NV_ESC_RM_CONTROL",
        "NV_ESC_RM_ALLOC",
        "NV_ESC_RM_FREE",
        "NV_ESC_REGISTER_FD",
        "NV_ESC_ALLOC_OS_EVENT",
    ] {
        assert!(escapes.iter().any(|x| x == e), "{e} not in escapes\n{text}");
    }
    assert!(
        array(&text, "controls").iter().any(|c| c == REMOVED),
        "{text}"
    );
    assert!(
        array(&text, "classes")
            .iter()
            .any(|c| c == "NV01_ROOT_CLIENT"),
        "{text}"
    );
    nvproxy(
        "check",
        &[
            "policy",
            "check",
            s(&policy),
            "--driver-version",
            "535.261.03",
        ],
    );

    // 4. Enforce mode with exactly that policy: passes, nothing denied.
    let log2 = dir.join("enforce.jsonl");
    let (p, st) = exec(
        "enforce",
        &[
            "--policy",
            s(&policy),
            "--audit-log",
            s(&log2),
            "--check-leaks",
        ],
        &[NVFE, "init"],
    );
    assert_ok(&p, st);
    let lines2 = audit_lines(&log2);
    let refused: Vec<&Value> = lines2
        .iter()
        .filter(|v| v["decision"] == "denied" || v["decision"] == "audit-would-deny")
        .collect();
    assert!(
        refused.is_empty(),
        "refused under the suggested policy: {refused:#?}"
    );

    // 5. The policy minus one control the client uses: that call gets NV_ERR_NOT_SUPPORTED,
    //    and the audit log names the control, denied.
    let tight = dir.join("minus-one.toml");
    std::fs::write(&tight, without(&text, REMOVED)).expect("write policy");
    let log3 = dir.join("minus-one.jsonl");
    let (p, st) = exec(
        "minus-one",
        &[
            "--policy",
            s(&tight),
            "--audit-log",
            s(&log3),
            "--check-leaks",
        ],
        &[NVFE, "init"],
    );
    assert_eq!(st.code(), Some(1), "init must fail\n{}", p.transcript());
    let err = p.summary()["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        err.contains(REMOVED) && err.contains("NV_ERR_NOT_SUPPORTED"),
        "init's error {err:?} should name {REMOVED} and NV_ERR_NOT_SUPPORTED"
    );
    let lines3 = audit_lines(&log3);
    let ev = lines_naming(&lines3, "event", REMOVED);
    assert!(
        ev.iter().any(|v| v["decision"] == "denied"
            && v["kind"] == "control"
            && v["reason"] == "policy"
            && v["nv_status"].as_u64() == Some(NV_ERR_NOT_SUPPORTED)),
        "no denied event for {REMOVED}: {lines3:#?}"
    );
    assert!(
        lines_naming(&lines3, "count", REMOVED)
            .iter()
            .any(|v| v["decision"] == "denied"),
        "no denied count for {REMOVED}: {lines3:#?}"
    );
    // The probe of just that control sees the same refusal with the session around it intact.
    let (p, st) = exec(
        "probe",
        &["--policy", s(&tight), "--check-leaks"],
        &[
            NVFE,
            "probe-control",
            REMOVED,
            "--expect",
            "NV_ERR_NOT_SUPPORTED",
        ],
    );
    assert_ok(&p, st);

    // 6. The same policy in audit mode: the call goes through, recorded as would-deny (how an
    //    admin tries a tighter list).
    let log4 = dir.join("minus-one-audit.jsonl");
    let (p, st) = exec(
        "minus-one-audit",
        &[
            "--mode",
            "audit",
            "--policy",
            s(&tight),
            "--audit-log",
            s(&log4),
        ],
        &[NVFE, "init"],
    );
    assert_ok(&p, st);
    assert!(
        lines_naming(&audit_lines(&log4), "event", REMOVED)
            .iter()
            .any(|v| v["decision"] == "audit-would-deny"),
        "no would-deny event for {REMOVED}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_policy_naming_an_entry_outside_the_table_is_refused_before_the_command_runs() {
    let dir = scratch_dir("bad");
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[policy]\nallow_only = true\nescapes = [\"NV_ESC_RM_CONTROL\", \"NV_ESC_NOT_A_THING\"]\n",
    )
    .unwrap();
    let marker = dir.join("ran");
    let (p, st) = exec(
        "bad-policy",
        &["--policy", s(&bad)],
        &["/bin/sh", "-c", &format!("touch {}", s(&marker))],
    );
    assert!(
        !st.success(),
        "exec must refuse the policy\n{}",
        p.transcript()
    );
    let err = p.stderr.join("\n");
    assert!(
        err.contains("NV_ESC_NOT_A_THING") && err.contains("driver 535.261.03"),
        "{err}"
    );
    assert!(!marker.exists(), "the command ran");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_counts_are_written_when_the_command_is_killed_or_nvproxy_is_signalled() {
    let dir = scratch_dir("signals");

    // The command kills itself with SIGKILL after the client's run.
    let log = dir.join("killed.jsonl");
    let script = format!("{NVFE} init && kill -KILL $$");
    let (p, st) = exec(
        "killed",
        &["--mode", "audit", "--audit-log", s(&log)],
        &["/bin/sh", "-c", &script],
    );
    assert_eq!(st.code(), Some(128 + 9), "{}", p.transcript());
    let lines = audit_lines(&log);
    assert!(
        !lines_naming(&lines, "count", "NV_ESC_CARD_INFO").is_empty(),
        "no count lines after the command was killed: {lines:#?}"
    );

    // nvproxy exec itself gets SIGTERM while the command waits: forwarded, counts written.
    let log = dir.join("sigterm.jsonl");
    let script = format!("{NVFE} init && echo CLIENT-DONE && exec sleep 600");
    let mut c = Command::new(nvproxy_bin());
    c.args([
        "exec",
        "--driver",
        "sim",
        "--mode",
        "audit",
        "--audit-log",
        s(&log),
    ])
    .args(["--", "/bin/sh", "-c", &script]);
    require_cuse();
    let mut p = Proc::spawn("sigterm", &mut c);
    p.wait_line("CLIENT-DONE");
    kill(Pid::from_raw(p.child.id() as i32), Signal::SIGTERM).expect("kill nvproxy");
    let st = p.wait();
    assert_eq!(
        (st.code(), st.signal()),
        (Some(128 + 15), None),
        "nvproxy should outlive the command and exit with its status\n{}",
        p.transcript()
    );
    let lines = audit_lines(&log);
    assert!(
        !lines_naming(&lines, "count", "NV_ESC_CARD_INFO").is_empty(),
        "no count lines after SIGTERM: {lines:#?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_uvm_ioctls_are_audited_and_the_suggestion_allows_exactly_them() {
    let dir = scratch_dir("uvm");
    let log = dir.join("uvm.jsonl");
    let (p, st) = exec(
        "uvm-audit",
        &["--mode", "audit", "--audit-log", s(&log), "--check-leaks"],
        &[MMAP, "uvm-map", "--count", "2"],
    );
    assert_ok(&p, st);
    let lines = audit_lines(&log);
    for name in ["UVM_INITIALIZE", "UVM_VALIDATE_VA_RANGE"] {
        assert!(
            lines_naming(&lines, "count", name)
                .iter()
                .any(|v| v["kind"] == "uvm" && v["decision"] == "allowed"),
            "no UVM count line for {name}: {lines:#?}"
        );
    }
    let (policy, text) = suggest(&dir, &log, "uvm.toml");
    let uvm = array(&text, "uvm");
    assert!(
        uvm.iter().any(|n| n == "UVM_INITIALIZE")
            && uvm.iter().any(|n| n == "UVM_VALIDATE_VA_RANGE"),
        "{text}"
    );
    assert!(text.contains("#     uvm mmap: allowed"), "{text}");

    let (p, st) = exec(
        "uvm-enforce",
        &["--policy", s(&policy), "--check-leaks"],
        &[MMAP, "uvm-map", "--count", "2"],
    );
    assert_ok(&p, st);

    // Without VALIDATE_VA_RANGE the client's check of its ranges fails (EINVAL, the driver's
    // answer to a command it lacks) and the log names the command.
    let tight = dir.join("uvm-minus-one.toml");
    std::fs::write(&tight, without(&text, "UVM_VALIDATE_VA_RANGE")).unwrap();
    let log2 = dir.join("uvm-minus-one.jsonl");
    let (p, st) = exec(
        "uvm-minus-one",
        &["--policy", s(&tight), "--audit-log", s(&log2)],
        &[MMAP, "uvm-map", "--count", "2"],
    );
    assert!(!st.success(), "uvm-map must fail\n{}", p.transcript());
    let lines2 = audit_lines(&log2);
    assert!(
        lines_naming(&lines2, "event", "UVM_VALIDATE_VA_RANGE")
            .iter()
            .any(|v| v["decision"] == "denied" && v["errno"] == 22),
        "no denied UVM_VALIDATE_VA_RANGE event: {lines2:#?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn test_serve_instances_with_policy_files_from_an_audit_run() {
    let dir = scratch_dir("serve");
    let log = dir.join("run.jsonl");
    let (p, st) = exec(
        "audit",
        &["--mode", "audit", "--audit-log", s(&log)],
        &[NVFE, "init"],
    );
    assert_ok(&p, st);
    let (_, text) = suggest(&dir, &log, "job.toml");
    std::fs::write(dir.join("tight.toml"), without(&text, REMOVED)).unwrap();
    // Relative policy paths: next to the config file.
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "driver = \"sim\"\n[daemon]\naudit_dir = \"{}\"\n\
             [[instance]]\nname = \"full\"\ngpus = [0]\npolicy = \"job.toml\"\n\
             [[instance]]\nname = \"tight\"\ngpus = [0]\npolicy = \"tight.toml\"\n",
            s(&dir.join("audit"))
        ),
    )
    .unwrap();
    let chk = nvproxy("check-config", &["check-config", s(&config)]);
    assert!(
        chk.stdout
            .iter()
            .any(|l| l.starts_with("instance tight:") && l.contains("tight.toml")),
        "{}",
        chk.transcript()
    );

    require_cuse();
    let mut daemon = Proc::spawn(
        "serve",
        Command::new(nvproxy_bin()).args(["serve", "--config", s(&config), "--check-leaks"]),
    );
    daemon.wait_line("READY");
    let mut full = Proc::spawn(
        "run full",
        Command::new(nvproxy_bin()).args(["run", "--instance", "full", "--", NVFE, "init"]),
    );
    let st = full.wait();
    assert_ok(&full, st);
    let mut tight = Proc::spawn(
        "run tight",
        Command::new(nvproxy_bin()).args([
            "run",
            "--instance",
            "tight",
            "--",
            NVFE,
            "probe-control",
            REMOVED,
            "--expect",
            "NV_ERR_NOT_SUPPORTED",
        ]),
    );
    let st = tight.wait();
    assert_ok(&tight, st);
    kill(Pid::from_raw(daemon.child.id() as i32), Signal::SIGTERM).expect("kill serve");
    let st = daemon.wait();
    assert_ok(&daemon, st);

    let full_log = audit_lines(&dir.join("audit/full.jsonl"));
    assert!(
        !lines_naming(&full_log, "count", REMOVED).is_empty(),
        "{full_log:#?}"
    );
    assert!(
        full_log
            .iter()
            .all(|v| v["decision"] != "denied" && v["decision"] != "audit-would-deny"),
        "{full_log:#?}"
    );
    let tight_log = audit_lines(&dir.join("audit/tight.jsonl"));
    assert!(
        lines_naming(&tight_log, "event", REMOVED)
            .iter()
            .any(|v| v["decision"] == "denied" && v["reason"] == "policy"),
        "{tight_log:#?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// libcuda's directory of NVIDIA's userspace `version` (see `real_clients_kernel`).
fn cuda_lib_dir(version: &str) -> PathBuf {
    let root = std::env::var_os("NVIDIA_USERSPACE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::current_exe()
                .expect("current_exe")
                .parent()
                .and_then(Path::parent)
                .expect("test binary in target/<profile>/deps")
                .join("../nvidia-userspace")
        });
    let lib = root.join(version).join("lib");
    assert!(
        lib.join("libcuda.so.1").exists(),
        "NVIDIA userspace {version} not found under {}: run tests/nvidia-userspace/fetch.sh \
         {version} (tests/run-kernel-tests.sh does, and sets NVIDIA_USERSPACE_DIR)",
        root.display()
    );
    lib
}

/// `cuda-probe init` under `nvproxy exec --driver sim EXEC_ARGS`: the process and the probe's
/// JSON line.
fn cuda_init(tag: &str, exec_args: &[&str]) -> (Proc, ExitStatus, Value) {
    let lib = format!("LD_LIBRARY_PATH={}", s(&cuda_lib_dir(CUDA_VERSION)));
    let mut args = vec!["--sim-driver-version", CUDA_VERSION, "--check-leaks"];
    args.extend_from_slice(exec_args);
    let (p, st) = exec(tag, &args, &["env", &lib, PROBE, "init"]);
    let j = p.summary_line();
    (p, st, j)
}

impl Proc {
    /// The last stdout line that is a JSON object (cuda-probe's report).
    fn summary_line(&self) -> Value {
        self.stdout
            .iter()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(Value::is_object)
            .unwrap_or_else(|| panic!("{}: no JSON line\n{}", self.tag, self.transcript()))
    }
}

/// Where a cuda-probe run stopped: (failed call, CUresult name, NVIDIA ioctls made).
fn probe_stop(j: &Value) -> (Value, Value, Value) {
    (
        j["failed"]["call"].clone(),
        j["failed"]["result_name"].clone(),
        j["nv_ioctls"].clone(),
    )
}

#[test]
#[ignore = "needs /dev/cuse, root and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
fn test_audit_suggest_enforce_round_trip_with_libcuda() {
    let dir = scratch_dir("libcuda");
    let log = dir.join("run.jsonl");

    // 1. libcuda's cuInit and device queries in audit mode: they pass.
    let (p, st, audit_run) = cuda_init("cuda-audit", &["--mode", "audit", "--audit-log", s(&log)]);
    assert_eq!(st.code(), Some(0), "{}", p.transcript());
    assert_eq!(audit_run["failed"], Value::Null, "{audit_run}");
    let lines = audit_lines(&log);
    for (kind, name) in [
        ("escape", "NV_ESC_CARD_INFO"),
        ("class", "NV01_ROOT"),
        ("control", REMOVED),
        ("uvm", "UVM_INITIALIZE"),
    ] {
        assert!(
            lines_naming(&lines, "count", name)
                .iter()
                .any(|v| v["kind"] == kind && v["decision"] == "allowed"),
            "no allowed count line for {kind} {name}: {lines:#?}"
        );
    }
    // Every NVIDIA ioctl libcuda made is counted.
    let counted: u64 = lines
        .iter()
        .filter(|v| v["type"] == "count" && v["name"] != "mmap")
        .map(|v| v["count"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        Some(counted),
        audit_run["nv_ioctls"].as_u64(),
        "counts vs the probe's own ioctl count: {lines:#?}"
    );

    // 2. The suggestion (the legacy GSS controls one command each, by the name the headers
    // give their category and message, never the family).
    let (policy, text) = suggest(&dir, &log, "libcuda.toml");
    let controls = array(&text, "controls");
    assert!(controls.iter().any(|c| c == REMOVED), "{text}");
    assert!(
        controls
            .iter()
            .any(|c| c == "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x59"),
        "{text}"
    );
    assert!(
        !controls
            .iter()
            .any(|c| c == "RM_GSS_LEGACY" || c == "NV2081_BINAPI"),
        "{text}"
    );
    assert!(
        array(&text, "uvm").iter().any(|c| c == "UVM_INITIALIZE"),
        "{text}"
    );
    nvproxy(
        "check",
        &[
            "policy",
            "check",
            s(&policy),
            "--driver-version",
            CUDA_VERSION,
        ],
    );

    // 3. Enforce mode with it: libcuda passes again, with the same ioctls, and nothing is
    //    denied by policy.
    let log2 = dir.join("enforce.jsonl");
    let (p, st, enforced) = cuda_init(
        "cuda-enforce",
        &["--policy", s(&policy), "--audit-log", s(&log2)],
    );
    assert_eq!(st.code(), Some(0), "{}", p.transcript());
    assert_eq!(probe_stop(&enforced), probe_stop(&audit_run), "{enforced}");
    let by_policy: Vec<Value> = audit_lines(&log2)
        .into_iter()
        .filter(|v| v["type"] == "event" && v["reason"] == "policy")
        .collect();
    assert!(
        by_policy.is_empty(),
        "denied by the suggested policy: {by_policy:#?}"
    );

    // 4. Minus one control libcuda uses: its call gets NV_ERR_NOT_SUPPORTED, libcuda fails
    //    (cuInit or cuDeviceGetName, whichever asks it first), and the log names the control,
    //    denied.
    let tight = dir.join("libcuda-minus-one.toml");
    std::fs::write(&tight, without(&text, REMOVED)).unwrap();
    let log3 = dir.join("minus-one.jsonl");
    let (p, st, tightened) = cuda_init(
        "cuda-minus-one",
        &["--policy", s(&tight), "--audit-log", s(&log3)],
    );
    assert_eq!(st.code(), Some(1), "{}", p.transcript());
    let calls = tightened["failed"]["last_ioctls"]
        .as_array()
        .expect("last_ioctls");
    assert!(
        calls
            .iter()
            .any(|c| c["code"] == REMOVED_CMD && c["nv_status"] == "0x56"),
        "libcuda's {REMOVED} ({REMOVED_CMD}) should have got 0x56: {tightened}"
    );
    assert!(
        tightened["nv_ioctls"].as_u64() < audit_run["nv_ioctls"].as_u64(),
        "libcuda should stop earlier: {tightened}"
    );
    let lines3 = audit_lines(&log3);
    assert!(
        lines_naming(&lines3, "event", REMOVED)
            .iter()
            .any(|v| v["decision"] == "denied"
                && v["kind"] == "control"
                && v["reason"] == "policy"
                && v["nv_status"].as_u64() == Some(NV_ERR_NOT_SUPPORTED)),
        "no denied event for {REMOVED}: {lines3:#?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
