//! `nvproxy serve` natively (socket transport, simulated driver), each daemon in a mount
//! namespace of its own with a fresh tmpfs on `/run`: the host's `/run/nvproxy` is never
//! touched, and the daemon creates its run directory itself, as at boot. Everything the test
//! runs against it (`nvproxy run`, `instance ...`, mode checks) enters that namespace
//! (`nsenter --mount`), or reads it through `/proc/<pid>/root`.
//!
//! - run directory modes after start, for each configuration (`[sim] process` off and on, a
//!   run directory some earlier start left 0755), and that a host uid outside every tenant
//!   reaches no instance's socket (issue 20, item 9); `instance rm` leaves no directory;
//! - a tenant call parked on a `userfaultfd` page does not veto a live upgrade (issue 20,
//!   item 7);
//! - socket-transport instances as first-class ones (issue 21): `transport = "auto"`,
//!   `instance create --transport`, the TRANSPORT column, their CDI devices, their latencies
//!   in the metrics, and one plain error line for a failed `instance create`;
//! - one serve per run directory: a second one refuses to start and leaves the first one's
//!   workers alone; a supervisor restarted after its predecessor died adopts them (issue 21,
//!   item 1);
//! - an idle supervisor sleeps (no timer in its loop) and restarts a killed worker.
//!
//! Needs root (namespaces, `process_vm_readv`, `pidfd_getfd`), `unshare`/`nsenter`/`setpriv`
//! (util-linux) and the binaries (`cargo build -p daemon -p preload`).

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use tests::harness::nvproxy_bin_with_shim;

const NVFE: &str = env!("CARGO_BIN_EXE_nvfe-client");
const TIMEOUT: Duration = Duration::from_secs(120);

/// Whether the suite can run here (root, util-linux's tools); says why not.
fn runnable() -> bool {
    tests::harness::runnable(
        "namespaces, pidfd_getfd",
        &["unshare", "nsenter", "setpriv"],
    )
}

fn text(o: &Output) -> String {
    format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One `nvproxy serve` in its own mount namespace; stopped (SIGINT) and its scratch directory
/// removed on drop.
struct Served {
    child: Option<Child>,
    scratch: PathBuf,
    ready: String,
}

impl Served {
    /// Serves `config` (the `[[instance]]`s and anything else), after `prepare` (a shell
    /// snippet run in the namespace before the daemon, e.g. to leave an old run directory).
    fn start(tag: &str, config: &str, prepare: &str) -> Served {
        let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("serve-native-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).expect("scratch dir");
        let cfg = scratch.join("config.toml");
        // No CDI spec unless the test asks for one.
        let cdi = if config.contains("[cdi]") {
            ""
        } else {
            "\n[cdi]\nspec = \"\"\n"
        };
        std::fs::write(&cfg, format!("{config}{cdi}")).expect("config");
        let script = format!(
            "mount -t tmpfs -o mode=0755 nvproxy-test /run && {prepare} exec \"$0\" serve \
             --check-leaks --config \"$1\""
        );
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(script)
            .arg(nvproxy_bin_with_shim())
            .arg(&cfg)
            // umask 022, as a shell's: what the daemon creates must not depend on it.
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning unshare ... nvproxy serve");
        let mut out = child.stdout.take().expect("stdout");
        let mut ready = Vec::new();
        let mut byte = [0u8; 1];
        let started = Instant::now();
        while !ready.ends_with(b"\n") && started.elapsed() < TIMEOUT {
            match out.read(&mut byte) {
                Ok(1) => ready.push(byte[0]),
                _ => break,
            }
        }
        let mut s = Served {
            child: Some(child),
            scratch,
            ready: String::from_utf8_lossy(&ready).trim().to_owned(),
        };
        if !s.ready.starts_with("READY") {
            let err = s.stop();
            panic!("serve did not start: {:?}\n{err}", s.ready);
        }
        s
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("serving").id()
    }

    /// A path of the daemon's namespace, seen from here.
    fn path(&self, p: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{p}", self.pid()))
    }

    /// `args` run in the daemon's mount namespace.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount=/proc/{}/ns/mnt", self.pid()))
            .arg("--")
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        c
    }

    fn nvproxy(&self, args: &[&str]) -> Output {
        let bin = nvproxy_bin_with_shim();
        let mut all = vec![bin.to_str().expect("utf-8 path")];
        all.extend_from_slice(args);
        self.command(&all)
            .output()
            .expect("nvproxy in the namespace")
    }

    /// Stops the daemon; its stderr.
    fn stop(&mut self) -> String {
        let Some(mut child) = self.child.take() else {
            return String::new();
        };
        // SAFETY: kill sends SIGINT to the serve process this test started (its pid).
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let status = child.wait().ok();
        let mut err = String::new();
        let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
        format!("serve exit {status:?}\n{err}")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// Every entry under `dir`: (path relative to it, kind, mode, owner uid), sorted.
fn tree(dir: &Path) -> Vec<(String, char, u32, u32)> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, char, u32, u32)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            use std::os::unix::fs::FileTypeExt;
            let t = m.file_type();
            let kind = if t.is_dir() {
                'd'
            } else if t.is_socket() {
                's'
            } else if t.is_symlink() {
                'l'
            } else {
                'f'
            };
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            out.push((rel, kind, m.permissions().mode() & 0o7777, m.uid()));
            if t.is_dir() {
                walk(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The run directory's own mode and every entry's, checked against the rules: the run
/// directory searchable at most (listing allowed only as systemd's 0755), writable by root
/// alone; every instance directory 0700 and root's; nothing below writable by others except
/// the sockets meant for any uid (`dev.sock`, `mmap.sock`, `worker.sock`: 0666, reachable only
/// through their 0700 directory or a bind mount). Returns the violations.
fn mode_violations(s: &Served) -> (Vec<String>, String) {
    let root = s.path("/run/nvproxy");
    let m = std::fs::metadata(&root).expect("the run directory");
    let mut bad = Vec::new();
    let mode = m.permissions().mode() & 0o7777;
    if mode & !0o755 != 0 || m.uid() != 0 {
        bad.push(format!("/run/nvproxy: {mode:o} uid {}", m.uid()));
    }
    let entries = tree(&root);
    for (rel, kind, mode, uid) in &entries {
        let depth = rel.matches('/').count();
        let ok = match (depth, kind) {
            (0, 'd') => *mode == 0o700 && *uid == 0,
            (0, 's') => rel == "nvproxy.sock" && *mode == 0o660,
            (0, 'f') => rel == "serve.lock" && *mode & 0o022 == 0,
            (1, 's') => {
                matches!(
                    rel.rsplit('/').next(),
                    Some("dev.sock" | "mmap.sock" | "worker.sock")
                ) && *mode == 0o666
                    || *mode & 0o077 == 0
            }
            (1, 'f') => *mode & 0o022 == 0,
            _ => false,
        };
        if !ok {
            bad.push(format!("{rel}: {kind} {mode:o} uid {uid}"));
        }
    }
    let listing = std::iter::once(format!("/run/nvproxy d {mode:o}"))
        .chain(
            entries
                .iter()
                .map(|(r, k, m, u)| format!("  {r} {k} {m:o} uid {u}")),
        )
        .collect::<Vec<_>>()
        .join("\n");
    (bad, listing)
}

/// Whether uid 65534 (no tenant's, no group of ours) reaches `path` in the daemon's namespace.
fn nobody_reaches(s: &Served, path: &str) -> bool {
    s.command(&[
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "test",
        "-e",
        path,
    ])
    .status()
    .expect("setpriv test -e")
    .success()
}

fn two_socket_instances(sim_process: bool) -> String {
    format!(
        "driver = \"sim\"\n[sim]\ngpus = 2\nprocess = {sim_process}\n\
         [[instance]]\nname = \"alpha\"\ngpus = [0]\ntransport = \"socket\"\n\
         [[instance]]\nname = \"beta\"\ngpus = [1]\ntransport = \"socket\"\n"
    )
}

fn check_run_dir_modes(tag: &str, sim_process: bool, prepare: &str) {
    let mut s = Served::start(tag, &two_socket_instances(sim_process), prepare);
    assert_eq!(s.ready, "READY alpha beta");
    // A tenant's open makes its connection and the worker's files exist too.
    let run = s.nvproxy(&[
        "run",
        "--instance",
        "beta",
        "--",
        NVFE,
        "init",
        "--expect-gpus",
        "1",
    ]);
    let (bad, listing) = mode_violations(&s);
    let reached: Vec<&str> = ["/run/nvproxy/alpha/dev.sock", "/run/nvproxy/beta/dev.sock"]
        .into_iter()
        .filter(|p| nobody_reaches(&s, p))
        .collect();
    // `instance rm` takes the instance's directory with it.
    let rm = s.nvproxy(&["instance", "rm", "alpha"]);
    std::thread::sleep(Duration::from_millis(200));
    let alpha_left = s.path("/run/nvproxy/alpha").exists();
    let err = s.stop();
    assert!(run.status.success(), "nvproxy run: {}\n{err}", text(&run));
    assert!(
        bad.is_empty() && reached.is_empty(),
        "{tag}: modes that let others in: {bad:?}; uid 65534 reached {reached:?}\n{listing}\n{err}"
    );
    assert!(rm.status.success(), "instance rm: {}", text(&rm));
    assert!(
        !alpha_left,
        "{tag}: instance rm left /run/nvproxy/alpha\n{err}"
    );
}

/// Issue 20, item 9: with `[sim] process = true` the run directories were 0755 (the
/// sim-driver's directory made by `create_dir_all` under umask 022), and uid 65534 reached
/// `/run/nvproxy/beta/dev.sock`.
#[test]
fn test_run_directory_modes_with_the_sim_driver_as_a_process() {
    if runnable() {
        check_run_dir_modes("simproc", true, "");
    }
}

#[test]
fn test_run_directory_modes_with_the_sim_driver_in_process() {
    if runnable() {
        check_run_dir_modes("siminproc", false, "");
    }
}

/// An earlier start (an older binary) left the run directory and an instance directory 0755,
/// writable by the group too: they are tightened, not trusted.
#[test]
fn test_run_directories_left_too_open_are_tightened() {
    if runnable() {
        check_run_dir_modes(
            "leftopen",
            true,
            "mkdir -m 0775 /run/nvproxy /run/nvproxy/beta && chmod 0777 /run/nvproxy/beta &&",
        );
    }
}

/// Issue 20, item 7: one call parked on a `userfaultfd` page made every upgrade fail after 15 s
/// ("its worker did not start"), as often as the tenant liked. Now the upgrade completes in
/// bounded time: the parked call is answered EFAULT (the client-wait deadline's answer,
/// brought forward), the client goes on, and the instance serves from the new worker.
#[test]
fn test_a_call_parked_on_tenant_memory_does_not_veto_a_live_upgrade() {
    if !runnable() {
        return;
    }
    let s = Served::start("parked", &two_socket_instances(true), "");
    let mut parked = s
        .command(&[
            nvproxy_bin_with_shim().to_str().unwrap(),
            "run",
            "--instance",
            "beta",
            "--",
            NVFE,
            "park-on-uffd",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("nvproxy run nvfe-client park-on-uffd");
    // Its output, line by line, from a thread: a client that is never answered keeps the
    // pipe open (the test must not hang on it).
    let out = parked.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(TIMEOUT).unwrap_or_default();
    // The call reaches the worker and parks there.
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let upgrade = s.nvproxy(&["instance", "upgrade", "beta"]);
    let took = t.elapsed();
    // The client: answered, it tears down and exits.
    let rest = rx.recv_timeout(Duration::from_secs(15)).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(5);
    while parked.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = parked.kill();
    let status = parked.wait().expect("parked client");
    // The new worker serves.
    let after = s.nvproxy(&[
        "run",
        "--instance",
        "beta",
        "--",
        NVFE,
        "init",
        "--expect-gpus",
        "1",
    ]);
    let mut s = s;
    let err = s.stop();
    assert!(
        first.contains("\"parked\""),
        "the client did not park: {first}{rest}"
    );
    assert!(
        upgrade.status.success() && took < Duration::from_secs(8),
        "upgrade with a parked call (took {took:?}): {}\n{err}",
        text(&upgrade)
    );
    assert!(
        status.success() && rest.contains("EFAULT"),
        "the parked call's client ({status}): {rest}"
    );
    assert!(
        after.status.success(),
        "after the upgrade: {}\n{err}",
        text(&after)
    );
}

/// Waits up to `limit` for `child` to exit; `None` if it still runs.
fn wait_until(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid in an instance's `worker.json` of the daemon's namespace (0 when none).
fn worker_pid(s: &Served, instance: &str) -> u64 {
    std::fs::read_to_string(s.path(&format!("/run/nvproxy/{instance}/worker.json")))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["pid"].as_u64())
        .unwrap_or(0)
}

/// Issue 21, item 1: a second `serve` on the run directory of a running one refused nothing:
/// it adopted the first one's worker (`worker re-adopted`), printed READY, and at its stop
/// stopped that worker, while the first one served on with nothing. Now it refuses to start,
/// naming the first one's pid, and the first one's worker serves on. Once the first one is
/// gone (SIGKILL: its workers keep serving), a restarted supervisor takes the run directory
/// and adopts the worker.
#[test]
fn test_a_second_serve_refuses_the_run_directory_and_a_restarted_one_adopts() {
    if !runnable() {
        return;
    }
    let config =
        "driver = \"sim\"\n[[instance]]\nname = \"job42\"\ngpus = [0]\ntransport = \"socket\"\n";
    let mut a = Served::start("lock", config, "");
    assert_eq!(a.ready, "READY job42");
    let worker = worker_pid(&a, "job42");
    let b_config = a.scratch.join("b.toml");
    std::fs::write(
        &b_config,
        "driver = \"sim\"\n[[instance]]\nname = \"other\"\ngpus = [0]\ntransport = \"socket\"\n\
         [cdi]\nspec = \"\"\n",
    )
    .expect("config b");
    let bin = nvproxy_bin_with_shim();
    let mut b = a
        .command(&[
            bin.to_str().expect("utf-8 path"),
            "serve",
            "--config",
            b_config.to_str().expect("utf-8 path"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the second serve");
    let b_exit = wait_until(&mut b, TIMEOUT);
    if b_exit.is_none() {
        // It serves: stopped as a user would (Ctrl-C), which shows what it does to `a`.
        // SAFETY: kill sends SIGINT to the nsenter this test started (its pid); nsenter
        // passes it on to the serve it waits for.
        unsafe { libc::kill(b.id() as libc::pid_t, libc::SIGINT) };
        let _ = wait_until(&mut b, Duration::from_secs(30));
        let _ = b.kill();
    }
    let b_out = b.wait_with_output().expect("the second serve's output");
    let worker_after = worker_pid(&a, "job42");
    let run = a.nvproxy(&[
        "run",
        "--instance",
        "job42",
        "--",
        NVFE,
        "init",
        "--expect-gpus",
        "1",
    ]);
    let list = a.nvproxy(&["instance", "list"]);
    let want = format!(
        "nvproxy: another nvproxy serve (pid {}) owns the run directory /run/nvproxy: stop it \
         first, or give this one a run directory of its own (--run-dir, NVPROXY_RUN_DIR or \
         [daemon] run_dir)\n",
        a.pid()
    );
    assert!(
        b_exit.is_some_and(|s| !s.success()) && String::from_utf8_lossy(&b_out.stderr) == want,
        "the second serve: {b_exit:?}, {}",
        text(&b_out)
    );
    assert!(
        worker != 0 && worker_after == worker && run.status.success(),
        "the first serve's worker {worker} (now {worker_after}): {}",
        text(&run)
    );
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(
        listed.contains("job42") && !listed.contains("other"),
        "{}",
        text(&list)
    );

    // A restart: the first supervisor dies, its worker (and the namespace) stay.
    let mut first = a.child.take().expect("serving");
    first.kill().expect("SIGKILL to the first serve");
    first.wait().expect("wait");
    let ns = format!("--mount=/proc/{worker}/ns/mnt");
    let mut c = Command::new("nsenter")
        .args([ns.as_str(), "--"])
        .arg(&bin)
        .args(["serve", "--config"])
        .arg(a.scratch.join("config.toml"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the restarted serve");
    let mut out = c.stdout.take().expect("stdout");
    let mut ready = Vec::new();
    let mut byte = [0u8; 1];
    let started = Instant::now();
    while !ready.ends_with(b"\n") && started.elapsed() < TIMEOUT {
        match out.read(&mut byte) {
            Ok(1) => ready.push(byte[0]),
            _ => break,
        }
    }
    let adopted =
        std::fs::read_to_string(format!("/proc/{worker}/root/run/nvproxy/job42/worker.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["pid"].as_u64());
    // SAFETY: kill sends SIGINT to the nsenter this test started; it passes it on to serve,
    // which stops the worker it adopted.
    unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGINT) };
    let stopped = wait_until(&mut c, Duration::from_secs(30));
    let _ = c.kill();
    let mut err = String::new();
    let _ = c.stderr.take().map(|mut e| e.read_to_string(&mut err));
    let _ = c.wait();
    let worker_gone = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        !Path::new(&format!("/proc/{worker}")).exists()
    });
    if !worker_gone {
        // SAFETY: SIGKILL to the worker this test's serve started, so that nothing outlives
        // the test.
        unsafe { libc::kill(libc::pid_t::try_from(worker).expect("a pid"), libc::SIGKILL) };
    }
    assert_eq!(
        String::from_utf8_lossy(&ready).trim(),
        "READY job42",
        "the restarted serve\n{err}"
    );
    assert_eq!(
        adopted,
        Some(worker),
        "the restarted serve did not adopt\n{err}"
    );
    assert!(
        stopped.is_some_and(|s| s.success()) && worker_gone,
        "the restarted serve: {stopped:?}, its adopted worker gone: {worker_gone}\n{err}"
    );
}

/// Whether this process could open `/dev/cuse`: what `transport = "auto"` decides by.
fn cuse_usable() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/cuse")
        .is_ok()
}

/// The TRANSPORT cell of `name`'s row in `instance list`.
fn transport_of(list: &str, name: &str) -> Option<String> {
    let header: Vec<&str> = list.lines().next()?.split_whitespace().collect();
    let col = header.iter().position(|h| *h == "TRANSPORT")?;
    list.lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&name))
        .and_then(|cells| cells.get(col).map(|c| (*c).to_owned()))
}

/// Issue 21, items 4, 6, 7 and 9: before, an `[[instance]]` without `transport` was CUSE (and
/// failed on this host), `instance create` had no `--transport`, `instance list` did not say
/// which, serve left its socket instances out of the CDI spec with a warning, their ioctls
/// never reached `nvproxy_ioctl_duration_seconds`, and a failed create printed Rust debug text.
#[test]
fn test_socket_instances_are_first_class() {
    if !runnable() {
        return;
    }
    let auto = if cuse_usable() { "cuse" } else { "socket" };
    let config = "driver = \"sim\"\n[sim]\ngpus = 2\n\
         [[instance]]\nname = \"alpha\"\ngpus = [0]\ntransport = \"socket\"\n\
         [[instance]]\nname = \"beta\"\ngpus = [1]\n\
         [cdi]\nspec = \"/run/cdi-test/nvproxy.yaml\"\n";
    let mut s = Served::start("firstclass", config, "");
    assert_eq!(s.ready, "READY alpha beta");
    let run = s.nvproxy(&[
        "run",
        "--instance",
        "alpha",
        "--",
        NVFE,
        "init",
        "--expect-gpus",
        "1",
    ]);
    let metrics = s.nvproxy(&["metrics"]);
    let create = s.nvproxy(&[
        "instance",
        "create",
        "gamma",
        "--gpus",
        "1",
        "--transport",
        "socket",
    ]);
    let create_auto = s.nvproxy(&["instance", "create", "delta", "--gpus", "0"]);
    let bad = s.nvproxy(&[
        "instance",
        "create",
        "omega",
        "--gpus",
        "0",
        "--policy",
        "/nonexistent-policy.toml",
    ]);
    let bad_gpu = s.nvproxy(&["instance", "create", "omega", "--gpus", "7"]);
    let list = s.nvproxy(&["instance", "list"]);
    let spec = std::fs::read_to_string(s.path("/run/cdi-test/nvproxy.yaml")).unwrap_or_default();
    let err = s.stop();
    assert!(run.status.success(), "nvproxy run: {}\n{err}", text(&run));
    assert!(create.status.success(), "create: {}\n{err}", text(&create));
    assert!(
        create_auto.status.success(),
        "create (auto): {}\n{err}",
        text(&create_auto)
    );
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    for (name, want) in [
        ("alpha", "socket"),
        ("beta", auto),
        ("gamma", "socket"),
        ("delta", auto),
    ] {
        assert_eq!(
            transport_of(&list, name).as_deref(),
            Some(want),
            "{name}\n{list}"
        );
    }
    // The socket instances' ioctls are timed.
    let metrics = String::from_utf8_lossy(&metrics.stdout).into_owned();
    let count = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("nvproxy_ioctl_duration_seconds_count{instance=\"alpha\"} ")
                .and_then(|n| n.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    assert!(count > 0, "no ioctl of alpha timed:\n{metrics}");
    // Every socket instance is in the CDI spec, with its socket and no nodes; serve said
    // nothing about them.
    if auto == "socket" {
        for name in ["alpha", "beta", "gamma", "delta"] {
            assert!(
                spec.contains(&format!("name: {name}\n"))
                    && spec.contains(&format!("/run/nvproxy/{name}/dev.sock")),
                "{name} in the CDI spec:\n{spec}"
            );
        }
        assert!(!spec.contains("deviceNodes"), "{spec}");
        assert!(
            spec.contains("NVPROXY_DEV_SOCKET=/run/nvproxy/dev.sock"),
            "{spec}"
        );
    }
    assert!(!err.contains("not in the CDI spec"), "{err}");
    // A failed create: one line, the worker's own words, no debug formatting.
    for (what, o, words) in [
        ("policy", &bad, "/nonexistent-policy.toml"),
        ("gpu", &bad_gpu, "GPU 7"),
    ] {
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "{what}: {}", text(o));
        assert_eq!(e.trim().lines().count(), 1, "{what}: {e}");
        assert!(e.contains(words), "{what}: {e}");
        for debug in ["ExitStatus", "Some(", "its log is above"] {
            assert!(!e.contains(debug), "{what}: {e}");
        }
    }
}

/// The voluntary context switches of thread `tid` of process `pid`.
fn switches(pid: u32, tid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .expect("the thread's status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches")
}

/// The supervisor's loop waits on signals, the workers' pidfds and a change pipe, not on a
/// timer: idle, its main thread sleeps; a killed worker is seen and restarted at once.
#[test]
fn test_an_idle_supervisor_sleeps_and_restarts_a_killed_worker() {
    if !runnable() {
        return;
    }
    let config = "driver = \"sim\"\n[sim]\ngpus = 1\n\
         [[instance]]\nname = \"idle\"\ngpus = [0]\ntransport = \"socket\"\n";
    let s = Served::start("idle", config, "");
    assert_eq!(s.ready, "READY idle");
    let worker_pid = || {
        std::fs::read_to_string(s.path("/run/nvproxy/idle/worker.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["pid"].as_u64())
    };
    let first = worker_pid().expect("the worker's state file");
    // Idle: a 200 ms period would wake the loop ~10 times in 2 s.
    let before = switches(s.pid(), s.pid());
    std::thread::sleep(Duration::from_secs(2));
    let woke = switches(s.pid(), s.pid()) - before;
    assert!(
        woke <= 2,
        "the idle supervisor's loop woke {woke} times in 2 s"
    );
    // SAFETY: SIGKILL to the worker this test's serve started.
    unsafe { libc::kill(libc::pid_t::try_from(first).expect("a pid"), libc::SIGKILL) };
    let started = Instant::now();
    let restarted = loop {
        match worker_pid() {
            Some(p) if p != first => break Some(p),
            _ if started.elapsed() > Duration::from_secs(30) => break None,
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    assert!(restarted.is_some(), "the killed worker was not restarted");
    let list = s.nvproxy(&["instance", "list"]);
    assert!(
        String::from_utf8_lossy(&list.stdout).contains("running"),
        "{}",
        text(&list)
    );
}
