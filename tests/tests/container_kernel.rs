//! Real containers through CDI: Debian's `podman` runs `--device nvproxy.dev/gpu=NAME` against
//! `nvproxy serve --driver sim`, with the spec serve keeps (`[cdi] spec`), and NVIDIA's Debian
//! userspace inside the container (mounted by the spec from the fetched driver root).
//!
//! - `nvidia-smi -L` and `cuda-probe init` (libcuda's `cuInit` and device queries, mmap through
//!   the shim and the instance socket) succeed inside the container and see the instance's GPU;
//! - the container's `/dev` has no raw `195:*` node; one it makes with `mknod` (root in the
//!   container keeps `CAP_MKNOD`) cannot be opened (device cgroup), nor can a node with another
//!   instance's CUSE numbers; `/proc/driver/nvidia/params` says `ModifyDeviceFiles: 0` and
//!   `/dev/char/195:*` lead to our nodes;
//! - two containers on two instances with different GPUs, at the same time, each see only their
//!   own; killing one instance's worker leaves the other's container working;
//! - `nvproxy device-plugin`'s `Allocate` answers (a kubelet `Registration` server and a
//!   `DevicePlugin` client of the test's): podman with those CDI names sees exactly the
//!   allocated GPUs, 1 and then 2;
//! - `systemd/nvproxy.service` under a real systemd (the host's, as PID 1 of a privileged podman
//!   container): `Type=notify` reaches `active`, serve writes the spec, logs to journald and
//!   pings the watchdog, stop removes the spec;
//!   and the same unit with a device ACL (`DevicePolicy=closed`, `DeviceAllow=char-cuse` ...)
//!   fails at the daemon's own open of its first node.
//!
//! The image is a rootfs directory made here from host files (busybox, the glibc libraries the
//! clients need, `cuda-probe`): no registry. Podman runs with `--network none`, the `vfs` storage
//! driver under a scratch directory, `cgroupfs` (no systemd) and, in the VM only,
//! `no_pivot_root` (the guest's root is the initramfs, where `pivot_root` fails with `EINVAL`).
//! The spec goes to `/var/run/cdi` (Debian's podman 4.3 has no `--cdi-spec-dir`), under a file
//! name of its own, removed afterwards.
//!
//! `#[ignore]`d: needs `/dev/cuse`, root, `podman` and the fetched NVIDIA userspace; run by
//! `tests/run-kernel-tests.sh container_kernel` (in the VM where the kernel has no CUSE).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tests::harness::{nvproxy_bin, profile_dir};

use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_cuda-probe");
const VERSION: &str = "535.261.03";
/// One podman run in the VM (TCG: podman, conmon and crun are all emulated).
const TIMEOUT: Duration = Duration::from_secs(300);
const SPEC_PATH: &str = "/var/run/cdi/nvproxy-container-kernel.yaml";

/// The fetched driver root (`tests/nvidia-userspace/fetch.sh` unpacks Debian's packages there).
fn driver_root() -> PathBuf {
    let root = std::env::var_os("NVIDIA_USERSPACE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| profile_dir().join("../nvidia-userspace"))
        .join(VERSION)
        .join("root");
    assert!(
        root.join("usr/lib/nvidia/current/nvidia-smi").exists(),
        "NVIDIA userspace {VERSION} not found under {}: tests/nvidia-userspace/fetch.sh {VERSION}",
        root.display()
    );
    root
}

fn require_env() {
    assert!(
        Path::new("/dev/cuse").exists(),
        "/dev/cuse is missing: run with tests/run-kernel-tests.sh container_kernel"
    );
    let ok = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "podman is missing: apt-get install podman (.ci/run does)"
    );
}

fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "nvproxy-ctr-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// cgroup2 at /sys/fs/cgroup (the VM's init mounts none; podman needs it for the device rules).
fn ensure_cgroup2() {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        return;
    }
    nix::mount::mount(
        Some("cgroup2"),
        "/sys/fs/cgroup",
        Some("cgroup2"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .expect("mounting cgroup2 on /sys/fs/cgroup");
}

/// The shared libraries `bin` loads (from `ldd`).
fn ldd(bin: &Path) -> Vec<PathBuf> {
    let o = Command::new("ldd").arg(bin).output().expect("ldd");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}

/// A rootfs directory: busybox (static) as /bin/sh and friends, cuda-probe and the glibc
/// libraries it and nvidia-smi need (nvidia-smi and libcuda come from the CDI spec's mounts).
fn make_rootfs(dir: &Path) -> PathBuf {
    let r = dir.join("rootfs");
    for d in [
        "bin",
        "lib64",
        "lib/x86_64-linux-gnu",
        "usr/lib/x86_64-linux-gnu",
        "usr/bin",
        "proc",
        "sys",
        "dev",
        "etc",
        "tmp",
        "run",
    ] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", r.join("bin/busybox")).expect("busybox (busybox-static)");
    for a in [
        "sh", "ls", "stat", "mknod", "cat", "head", "echo", "sleep", "test", "[",
    ] {
        symlink("busybox", r.join("bin").join(a)).unwrap();
    }
    std::fs::copy(PROBE, r.join("usr/bin/cuda-probe")).unwrap();
    let smi = driver_root().join("usr/lib/nvidia/current/nvidia-smi");
    let mut libs = ldd(Path::new(PROBE));
    libs.extend(ldd(&smi));
    for l in libs {
        let dst = r.join(l.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        // Copy the file the name resolves to, under the name ld.so looks for.
        std::fs::copy(&l, &dst).unwrap_or_else(|e| panic!("copying {}: {e}", l.display()));
    }
    std::fs::write(r.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").unwrap();
    r
}

/// `nvproxy serve --driver sim --check-leaks` with two GPUs and instances `ctr-a` (GPU 0) and
/// `ctr-b` (GPU 1); waits for READY.
struct Daemon {
    child: Child,
    config: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "driver = \"sim\"\n[sim]\ngpus = 2\n\
                 [cdi]\nspec = \"{SPEC_PATH}\"\ndriver_root = \"{}\"\n\
                 [[instance]]\nname = \"ctr-a\"\ngpus = [0]\n\
                 [[instance]]\nname = \"ctr-b\"\ngpus = [1]\n\
                 [[instance]]\nname = \"ctr-s\"\ngpus = [1]\ntransport = \"socket\"\n",
                driver_root().display()
            ),
        )
        .unwrap();
        let log = dir.join("serve.log");
        let mut child = Command::new(nvproxy_bin())
            .args(["serve", "--check-leaks", "--config"])
            .arg(&config)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn nvproxy serve");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(l) if l.starts_with("READY") => break,
                Ok(_) => {}
                Err(e) => panic!(
                    "serve: no READY ({e:?})\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ),
            }
        }
        Daemon { child, config, log }
    }

    /// SIGTERM; asserts a clean exit (status 3 = the simulated driver still held objects).
    fn stop(mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "serve: {status}\n{}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Everything a test needs: the daemon, the spec written, the rootfs, podman's configuration.
struct Env {
    daemon: Option<Daemon>,
    dir: PathBuf,
    rootfs: PathBuf,
    /// The spec, from the same generator as JSON.
    spec: Value,
}

impl Env {
    fn new(tag: &str) -> Env {
        require_env();
        ensure_cgroup2();
        let dir = scratch(tag);
        let rootfs = make_rootfs(&dir);
        // serve writes the spec ([cdi] spec) before READY.
        let daemon = Daemon::start(&dir);
        eprintln!(
            "--- {SPEC_PATH}:\n{}",
            std::fs::read_to_string(SPEC_PATH).unwrap()
        );
        let json = dir.join("spec.json");
        let o = Command::new(nvproxy_bin())
            .args(["cdi", "generate", "--config"])
            .arg(&daemon.config)
            .arg("--driver-root")
            .arg(driver_root())
            .arg("--out")
            .arg(&json)
            .output()
            .unwrap();
        assert!(o.status.success(), "cdi generate --out spec.json");
        let spec: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        podman_conf(&dir);
        Env {
            daemon: Some(daemon),
            dir,
            rootfs,
            spec,
        }
    }

    fn podman(&self, device: &str, cmd: &[&str]) -> Command {
        self.podman_with(device, &[], cmd)
    }

    /// [`Env::podman`] with more `podman run` options.
    fn podman_with(&self, device: &str, opts: &[&str], cmd: &[&str]) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .arg("--root")
            .arg(self.dir.join("storage"))
            .arg("--runroot")
            .arg(self.dir.join("runroot"))
            .args([
                "--storage-driver",
                "vfs",
                "run",
                "--rm",
                "--network",
                "none",
            ])
            .args(["--device", &format!("nvproxy.dev/gpu={device}")])
            .args(opts)
            .arg("--rootfs")
            .arg(&self.rootfs)
            .args(cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    fn run(&self, device: &str, cmd: &[&str]) -> Output {
        let child = self.podman(device, cmd).spawn().expect("spawn podman");
        wait_output(child, &format!("{device} {cmd:?}"))
    }

    fn stop(mut self) {
        if let Some(d) = self.daemon.take() {
            d.stop();
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(SPEC_PATH);
        self.daemon.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_output(child: Child, what: &str) -> Output {
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let o = match rx.recv_timeout(TIMEOUT) {
        Ok(o) => o.expect("podman output"),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("podman {what}: not done after {TIMEOUT:?}");
        }
    };
    eprintln!(
        "--- podman {what}: {}\n--- stdout:\n{}--- stderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn smi_line(g: &nvsim::SimGpu) -> String {
    format!("GPU 0: {} (UUID: {})\n", g.name, g.uuid_string())
}

/// The `maj:min` of the node at container path `path` of the spec's device `device`.
fn spec_node(spec: &Value, device: &str, path: &str) -> (u64, u64) {
    let dev = spec["devices"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == device))
        .unwrap_or_else(|| panic!("no device {device} in {spec}"));
    let node = dev["containerEdits"]["deviceNodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["path"] == path))
        .unwrap_or_else(|| panic!("no {path} in {dev}"));
    (
        node["major"].as_u64().unwrap(),
        node["minor"].as_u64().unwrap(),
    )
}

#[test]
#[ignore = "needs /dev/cuse, root, podman and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
fn nvidia_smi_and_cuinit_run_in_a_podman_container() {
    let env = Env::new("clients");
    let o = env.run("ctr-a", &["/usr/bin/nvidia-smi", "-L"]);
    assert!(o.status.success(), "nvidia-smi -L in the container");
    assert_eq!(stdout(&o), smi_line(&nvsim::SimGpu::h100(0)));

    let g = nvsim::SimGpu::h100(0);
    let uuid = g.uuid_string();
    let o = env.run(
        "ctr-a",
        &[
            "/usr/bin/cuda-probe",
            "--expect-count",
            "1",
            "--expect-name",
            &g.name,
            "--expect-uuid",
            &uuid,
            "init",
        ],
    );
    let j: Value = stdout(&o)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("cuda-probe printed no JSON"));
    assert!(o.status.success(), "cuda-probe init in the container: {j}");
    assert_eq!(j["ok"], true, "{j}");
    assert_eq!(j["steps"][0]["devices"][0]["uuid"], uuid.as_str(), "{j}");
    env.stop();
}

/// Issue 21, item 6: a socket-transport instance had no CDI device. Its device has no nodes:
/// the shim, preloaded, reaches the worker over the instance's device socket, and NVIDIA's
/// clients in the container see its GPU and nothing else (no `/dev/nvidia*` at all).
#[test]
#[ignore = "needs /dev/cuse, root, podman and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
fn a_socket_transport_instance_runs_nvidia_smi_in_a_container() {
    let env = Env::new("socket");
    let dev = env.spec["devices"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == "ctr-s"))
        .unwrap_or_else(|| panic!("no device ctr-s in {}", env.spec));
    assert!(
        dev["containerEdits"]["deviceNodes"].is_null(),
        "a socket instance's device has nodes: {dev}"
    );
    let o = env.run(
        "ctr-s",
        &[
            "/bin/sh",
            "-c",
            "for f in /dev/nvidia*; do [ -e \"$f\" ] && echo \"node $f\"; done; \
             /usr/bin/nvidia-smi -L",
        ],
    );
    assert!(o.status.success(), "nvidia-smi -L in the container");
    let out = stdout(&o);
    assert!(
        !out.contains("node "),
        "/dev/nvidia* in the container: {out}"
    );
    assert!(
        out.ends_with(&smi_line(&nvsim::SimGpu::h100(1))),
        "nvidia-smi -L: {out}"
    );
    env.stop();
}

#[test]
#[ignore = "needs /dev/cuse, root, podman and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
fn the_container_gets_our_nodes_only_and_cannot_make_others() {
    let env = Env::new("nodes");
    let (b_major, b_minor) = spec_node(&env.spec, "ctr-b", "/dev/nvidia0");
    let (a_major, a_minor) = spec_node(&env.spec, "ctr-a", "/dev/nvidia0");
    let script = format!(
        "for f in /dev/* /dev/*/*; do [ -c \"$f\" ] && stat -c 'node %t:%T %n' \"$f\"; done; \
         for l in /dev/char/*; do echo \"link $l -> $(stat -c %N \"$l\")\"; done; \
         cat /proc/driver/nvidia/params; \
         mknod /tmp/raw c 195 0; echo \"mknod-raw=$?\"; \
         (exec 3<>/tmp/raw) 2>/dev/null; echo \"open-raw=$?\"; \
         mknod /tmp/other c {b_major} {b_minor}; echo \"mknod-other=$?\"; \
         (exec 3<>/tmp/other) 2>/dev/null; echo \"open-other=$?\"; \
         (exec 3<>/dev/nvidia0) 2>/dev/null; echo \"open-own=$?\"; \
         rm /dev/nvidia-uvm 2>/dev/null; echo \"rm-uvm=$?\"; \
         ls /run/nvproxy"
    );
    let o = env.run("ctr-a", &["/bin/sh", "-c", &script]);
    assert!(o.status.success(), "the shell in the container");
    let out = stdout(&o);
    let nodes: Vec<&str> = out.lines().filter(|l| l.starts_with("node ")).collect();
    // 195 = 0xc3: no node of the NVIDIA driver's major anywhere in /dev.
    assert!(
        !nodes.iter().any(|l| l.starts_with("node c3:")),
        "raw NVIDIA node in the container: {nodes:?}"
    );
    for p in ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"] {
        let (maj, min) = spec_node(&env.spec, "ctr-a", p);
        let want = format!("node {maj:x}:{min:x} {p}");
        assert!(nodes.contains(&want.as_str()), "{want} not in {nodes:?}");
    }
    assert!(!out.contains("/dev/nvidia1"), "{out}");
    assert!(out.contains("ModifyDeviceFiles: 0"), "{out}");
    assert!(
        out.contains("'/dev/char/195:255' -> '../nvidiactl'"),
        "{out}"
    );
    assert!(out.contains("'/dev/char/195:0' -> '../nvidia0'"), "{out}");
    // The device cgroup: mknod may succeed (runtimes allow `m` for every device), open may not.
    assert!(
        out.contains("open-raw=") && !out.contains("open-raw=0"),
        "a raw 195:0 node opened: {out}"
    );
    assert!(
        out.contains("open-other=") && !out.contains("open-other=0"),
        "another instance's node ({b_major}:{b_minor}) opened: {out}"
    );
    assert!(out.contains("open-own=0"), "{out}");
    // pin-nodes: the nodes cannot be unlinked (and so not replaced).
    assert!(
        out.contains("rm-uvm=") && !out.contains("rm-uvm=0"),
        "{out}"
    );
    assert!(out.lines().any(|l| l.trim() == "mmap.sock"), "{out}");
    assert_ne!((a_major, a_minor), (b_major, b_minor));
    env.stop();
}

#[test]
#[ignore = "needs /dev/cuse, root, podman and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
fn two_containers_on_two_instances_each_see_only_their_own_gpu() {
    let env = Env::new("two");
    let a = env
        .podman("ctr-a", &["/usr/bin/nvidia-smi", "-L"])
        .spawn()
        .unwrap();
    let b = env
        .podman("ctr-b", &["/usr/bin/nvidia-smi", "-L"])
        .spawn()
        .unwrap();
    let (oa, ob) = (wait_output(a, "ctr-a"), wait_output(b, "ctr-b"));
    assert!(oa.status.success() && ob.status.success());
    // Both are "GPU 0" in their container; the UUIDs tell the simulated GPUs apart.
    assert_eq!(stdout(&oa), smi_line(&nvsim::SimGpu::h100(0)));
    assert_eq!(stdout(&ob), smi_line(&nvsim::SimGpu::h100(1)));
    env.stop();
}

/// One instance's worker killed while a container of the other instance works: that
/// container, holding its nodes open across the kill, goes on (`nvidia-smi -L`, `cuda-probe
/// init`), its worker untouched; the killed instance gets a new worker, and the spec (serve's
/// own `[cdi] spec`) follows its new device numbers, so a new container of it works too.
#[test]
#[ignore = "needs /dev/cuse, root, podman and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
fn killing_one_worker_leaves_the_other_container_working() {
    let env = Env::new("kill");
    let pid_of = |inst: &str| -> u64 {
        let t = std::fs::read_to_string(format!("/run/nvproxy/{inst}/worker.json")).unwrap();
        serde_json::from_str::<Value>(&t).unwrap()["pid"]
            .as_u64()
            .unwrap()
    };
    let (a, b) = (pid_of("ctr-a"), pid_of("ctr-b"));
    let script = "exec 3<>/dev/nvidiactl 4<>/dev/nvidia0 || exit 9; \
                  /usr/bin/nvidia-smi -L && echo STEP1 && \
                  while [ ! -e /run/go ]; do sleep 0.2; done; \
                  /usr/bin/nvidia-smi -L && /usr/bin/cuda-probe --expect-count 1 init && echo STEP2";
    let go = env.dir.join("go");
    let mut c = env.podman_with(
        "ctr-b",
        &["-v", &format!("{}:/run/go-dir", env.dir.display())],
        &[
            "/bin/sh",
            "-c",
            &script.replace("/run/go", "/run/go-dir/go"),
        ],
    );
    let mut child = c.spawn().expect("podman ctr-b");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while !seen.iter().any(|l: &String| l == "STEP1") {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => seen.push(l),
            Err(e) => panic!("ctr-b never reached STEP1 ({e:?}): {seen:?}"),
        }
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(a).expect("a pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let restarted = {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let now = std::fs::read_to_string("/run/nvproxy/ctr-a/worker.json")
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok()?["pid"].as_u64());
            if now.is_some_and(|p| p != a) || Instant::now() > deadline {
                break now;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    std::fs::write(&go, "").unwrap();
    for l in rx.iter() {
        seen.push(l);
    }
    let status = child.wait().unwrap();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(
        status.success() && seen.iter().any(|l| l == "STEP2"),
        "ctr-b after ctr-a's worker was killed: {status}\n{seen:#?}\n{err}"
    );
    assert_eq!(pid_of("ctr-b"), b, "ctr-b's worker was touched");
    assert!(
        restarted.is_some_and(|p| p != a),
        "no new worker for ctr-a: {restarted:?}"
    );
    // The restarted worker's nodes have new numbers; the spec serve rewrote has them.
    let o = env.run("ctr-a", &["/usr/bin/nvidia-smi", "-L"]);
    assert!(o.status.success(), "nvidia-smi -L in a new ctr-a container");
    env.stop();
}

/// podman's configuration under `dir` (see the module doc); `no_pivot_root` in the VM only.
fn podman_conf(dir: &Path) -> PathBuf {
    let in_vm = std::fs::read_to_string("/proc/cmdline").is_ok_and(|c| c.contains("rdinit=/init"));
    std::fs::create_dir_all(dir.join("net")).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let conf = dir.join("containers.conf");
    std::fs::write(
        &conf,
        format!(
            "[engine]\nevents_logger = \"none\"\ncgroup_manager = \"cgroupfs\"\n\
             tmp_dir = \"{0}/tmp\"\nno_pivot_root = {in_vm}\n\
             [network]\nnetwork_config_dir = \"{0}/net\"\n",
            dir.display()
        ),
    )
    .unwrap();
    conf
}

fn podman_cmd(dir: &Path, conf: &Path) -> Command {
    let mut c = Command::new("podman");
    c.env("CONTAINERS_CONF", conf)
        .arg("--root")
        .arg(dir.join("storage"))
        .arg("--runroot")
        .arg(dir.join("runroot"))
        .args(["--storage-driver", "vfs"]);
    c
}

/// Boots systemd (the host's, 252 on Debian 12) as PID 1 of a privileged podman container whose
/// rootfs is the host's /usr (read-only) and a copy of its /etc, with `unit` installed as
/// nvproxy.service (its /usr/local/bin/nvproxy replaced by our binary), nvproxy-tmpfiles.conf
/// and a sim config; the host's /dev is bind-mounted so the CUSE nodes appear. Waits until the
/// unit is active or failed and returns (state, `journalctl -u` text, the container's name).
fn boot_unit(
    dir: &Path,
    conf: &Path,
    tag: &str,
    unit: &str,
    worker_uids: bool,
) -> (String, String, String) {
    let r = dir.join(format!("sroot-{tag}"));
    for d in ["usr", "dev", "proc", "sys", "run", "tmp", "var", "root"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    for l in ["bin", "sbin", "lib", "lib64"] {
        symlink(format!("usr/{l}"), r.join(l)).unwrap();
    }
    let st = Command::new("cp")
        .args(["-a", "/etc"])
        .arg(r.join("etc"))
        .status()
        .unwrap();
    assert!(st.success(), "cp -a /etc");
    std::fs::write(r.join("etc/machine-id"), "").unwrap();
    std::fs::create_dir_all(r.join("etc/nvproxy")).unwrap();
    std::fs::write(
        r.join("etc/nvproxy/config.toml"),
        // With worker_uids, the worker under its own uid: the unit's bounding set and sandbox
        // must allow it, and a supervisor without CAP_DAC_OVERRIDE must still read its state
        // and stats.
        format!(
            "driver = \"sim\"\n[sim]\ngpus = 2\n{}[[instance]]\nname = \"sd-a\"\ngpus = [0]\n",
            // (The simulated driver as a process: `systemctl reload` upgrades the worker live.)
            if worker_uids {
                "process = true\n[daemon]\nworker_uids = \"61000-61009\"\n"
            } else {
                ""
            }
        ),
    )
    .unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::copy(
        src.join("systemd/nvproxy-tmpfiles.conf"),
        r.join("etc/tmpfiles.d/nvproxy.conf"),
    )
    .unwrap();
    let bin = nvproxy_bin().canonicalize().unwrap();
    // The binary and its shim, mounted at a fixed path: systemd-mode podman mounts a tmpfs on
    // /tmp (and /run), which would hide a checkout there (CI clones may live under /tmp).
    const INNER: &str = "/opt/nvproxy-bin";
    std::fs::write(
        r.join("etc/systemd/system/nvproxy.service"),
        unit.replace("/usr/local/bin/nvproxy", &format!("{INNER}/nvproxy")),
    )
    .unwrap();
    let share = bin.parent().unwrap().to_path_buf();
    std::fs::create_dir_all(r.join(INNER.strip_prefix('/').unwrap())).unwrap();
    let name = format!("nvproxy-sd-{tag}-{}", std::process::id());
    let o = podman_cmd(dir, conf)
        .args([
            "run",
            "-d",
            "--name",
            &name,
            "--privileged",
            "--systemd=always",
        ])
        .args(["--network", "none", "-v", "/usr:/usr:ro", "--tmpfs", "/var"])
        .arg("-v")
        .arg(format!("{}:{INNER}:ro", share.display()))
        .args(["--mount", "type=bind,src=/dev,dst=/dev", "--rootfs"])
        .arg(&r)
        .args(["/lib/systemd/systemd", "--unit=nvproxy.service"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "podman run systemd: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let exec = |args: &[&str]| -> String {
        let o = podman_cmd(dir, conf)
            .args(["exec", &name])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let deadline = Instant::now() + TIMEOUT;
    let state = loop {
        let s = exec(&["systemctl", "is-active", "nvproxy.service"]);
        let s = s.trim().to_owned();
        if s == "active" || s == "failed" || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    let journal = exec(&[
        "journalctl",
        "-u",
        "nvproxy.service",
        "--no-pager",
        "-o",
        "cat",
    ]);
    eprintln!("--- {tag}: nvproxy.service {state}\n{journal}");
    (state, journal, name)
}

fn remove_container(dir: &Path, conf: &Path, name: &str) {
    let _ = podman_cmd(dir, conf)
        .args(["rm", "-f", "-t", "2", name])
        .output();
}

#[test]
#[ignore = "needs /dev/cuse, root, podman and systemd; run by tests/run-kernel-tests.sh"]
fn the_systemd_unit_serves_under_systemd() {
    require_env();
    ensure_cgroup2();
    let dir = scratch("systemd");
    let conf = podman_conf(&dir);
    let unit = include_str!("../../systemd/nvproxy.service");
    let (state, journal, name) = boot_unit(&dir, &conf, "unit", unit, true);
    let exec = |args: &[&str]| -> String {
        let o = podman_cmd(&dir, &conf)
            .args(["exec", &name])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let spec = exec(&["cat", "/run/cdi/nvproxy.yaml"]);
    let list = exec(&["/opt/nvproxy-bin/nvproxy", "instance", "list"]);
    // journald's native protocol (tracing-journald), not only the stderr stream: the span and
    // event fields arrive as journal fields.
    let json = exec(&[
        "journalctl",
        "-u",
        "nvproxy.service",
        "--no-pager",
        "-o",
        "json",
    ]);
    let worker_uid = exec(&[
        "sh",
        "-c",
        "grep Uid: /proc/$(sed 's/.*\"pid\":\\([0-9]*\\).*/\\1/' /run/nvproxy/sd-a/worker.json)/status",
    ]);
    let nodes = exec(&["ls", "/dev/nvproxy/sd-a"]);
    // A restart keeps the control socket (the fd store): the same inode, served again.
    let inode = || exec(&["stat", "-c", "%i", "/run/nvproxy/nvproxy.sock"]);
    let before = inode();
    exec(&["systemctl", "restart", "nvproxy.service"]);
    let restarted = {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let s = exec(&["systemctl", "is-active", "nvproxy.service"]);
            if s.trim() == "active" || Instant::now() > deadline {
                break s.trim().to_owned();
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    };
    let after = inode();
    let list_after = exec(&["/opt/nvproxy-bin/nvproxy", "instance", "list"]);
    // `systemctl reload` (ExecReload: SIGHUP): the worker is replaced live by a new process.
    let worker_pid = || {
        exec(&[
            "sh",
            "-c",
            "sed 's/.*\"pid\":\\([0-9]*\\).*/\\1/' /run/nvproxy/sd-a/worker.json",
        ])
        .trim()
        .to_owned()
    };
    let pid_before_reload = worker_pid();
    exec(&["systemctl", "reload", "nvproxy.service"]);
    let reloaded = {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let now = worker_pid();
            if (!now.is_empty() && now != pid_before_reload) || Instant::now() > deadline {
                break now;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    };
    let state_after_reload = exec(&["systemctl", "is-active", "nvproxy.service"]);
    let list_after_reload = exec(&["/opt/nvproxy-bin/nvproxy", "instance", "list"]);
    let journal2 = exec(&[
        "journalctl",
        "-u",
        "nvproxy.service",
        "--no-pager",
        "-o",
        "cat",
    ]);
    let journal3 = exec(&[
        "journalctl",
        "-u",
        "nvproxy.service",
        "--no-pager",
        "-o",
        "cat",
    ]);
    let stopped = {
        exec(&["systemctl", "stop", "nvproxy.service"]);
        exec(&["sh", "-c", "ls /run/cdi; ls /dev/nvproxy 2>&1"])
    };
    remove_container(&dir, &conf, &name);
    assert_eq!(
        state, "active",
        "Type=notify: READY=1 reached systemd\n{journal}"
    );
    assert!(journal.contains("READY sd-a"), "{journal}");
    // tracing goes to journald (JOURNAL_STREAM), and WatchdogSec= is answered.
    assert!(journal.contains("systemd watchdog: pinging"), "{journal}");
    assert!(
        spec.contains("kind: nvproxy.dev/gpu") && spec.contains("- name: sd-a"),
        "serve wrote the spec ([cdi] spec): {spec}"
    );
    assert!(
        nodes.contains("nvidiactl") && nodes.contains("nvidia-uvm"),
        "{nodes}"
    );
    assert!(
        json.lines().any(|l| l.contains("\"F_INSTANCE\":\"sd-a\"")
            && l.contains("\"SYSLOG_IDENTIFIER\":\"nvproxy\"")),
        "no journal entry with the instance as a field:\n{json}"
    );
    assert!(
        worker_uid
            .split_whitespace()
            .eq(["Uid:", "61000", "61000", "61000", "61000"]),
        "the worker's uid: {worker_uid:?}\n{journal}"
    );
    assert!(
        list.lines()
            .any(|l| l.starts_with("sd-a") && l.ends_with("running") && !l.contains(" - ")),
        "instance list (its stats through the group-readable run directory): {list}\n{journal}"
    );
    assert_eq!(restarted, "active", "after systemctl restart\n{journal2}");
    assert!(
        !before.trim().is_empty() && before == after,
        "the control socket changed across the restart: {before:?} {after:?}\n{journal2}"
    );
    assert!(
        journal2.contains("control socket from the systemd fd store"),
        "{journal2}"
    );
    assert!(
        list_after.lines().any(|l| l.starts_with("sd-a")),
        "{list_after}"
    );
    assert!(
        !pid_before_reload.is_empty() && reloaded != pid_before_reload,
        "systemctl reload did not replace the worker ({pid_before_reload} -> {reloaded})\n{journal2}"
    );
    assert_eq!(state_after_reload.trim(), "active", "after reload");
    assert!(
        list_after_reload
            .lines()
            .any(|l| l.starts_with("sd-a") && l.ends_with("running")),
        "after reload: {list_after_reload}"
    );
    assert!(
        journal3.contains("reload: worker upgraded"),
        "the journal after reload:\n{journal3}"
    );
    assert!(
        !stopped.contains("nvproxy.yaml") && stopped.contains("No such file"),
        "after stop: the spec removed and the nodes gone: {stopped}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Why the unit has no device ACL: with `DevicePolicy=closed` and `DeviceAllow=` for
/// `/dev/cuse`, `char-cuse` and `char-nvidia*` (resolved against /proc/devices at start, before
/// the daemon's CUSE majors exist), a root worker's own open of its first node (its
/// self-check) is refused. (A worker under its own uid never opens its nodes: see
/// docs/architecture/process-model.md.)
#[test]
#[ignore = "needs /dev/cuse, root, podman and systemd; run by tests/run-kernel-tests.sh"]
fn a_device_acl_blocks_the_daemons_own_nodes() {
    require_env();
    ensure_cgroup2();
    let dir = scratch("acl");
    let conf = podman_conf(&dir);
    let unit = include_str!("../../systemd/nvproxy.service")
        .replace(
            "DevicePolicy=auto\n",
            "DevicePolicy=closed\nDeviceAllow=/dev/cuse rw\nDeviceAllow=char-cuse rw\n\
             DeviceAllow=char-nvidia* rw\n",
        )
        .replace("Restart=on-failure\n", "Restart=no\n");
    assert!(unit.contains("DevicePolicy=closed"));
    let (state, journal, name) = boot_unit(&dir, &conf, "acl", &unit, false);
    remove_container(&dir, &conf, &name);
    assert_eq!(state, "failed", "{journal}");
    assert!(
        journal.contains("opening /dev/nvproxy/sd-a/nvidiactl: Operation not permitted"),
        "{journal}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The device plugin's CDI names run containers: `nvproxy device-plugin` against this serve,
/// with a kubelet `Registration` server and a `DevicePlugin` client of the test's own;
/// `Allocate` of one GPU, then of two, and podman `--device` with exactly the name each answer
/// gave: `nvidia-smi -L` lists the allocated GPUs and no other.
mod device_plugin_cdi {
    use super::*;
    use device_plugin::api::v1beta1::{
        AllocateRequest, ContainerAllocateRequest, Empty, RegisterRequest,
        device_plugin_client::DevicePluginClient,
        registration_server::{Registration, RegistrationServer},
    };

    struct Kubelet(tokio::sync::mpsc::UnboundedSender<RegisterRequest>);

    #[tonic::async_trait]
    impl Registration for Kubelet {
        async fn register(
            &self,
            req: tonic::Request<RegisterRequest>,
        ) -> Result<tonic::Response<Empty>, tonic::Status> {
            let _ = self.0.send(req.into_inner());
            Ok(tonic::Response::new(Empty {}))
        }
    }

    /// The plugin process, registered with our kubelet, and a client of it.
    struct Plugin {
        rt: tokio::runtime::Runtime,
        child: Child,
        log: PathBuf,
        client: DevicePluginClient<tonic::transport::Channel>,
    }

    impl Plugin {
        fn start(dir: &Path) -> Plugin {
            let dp = dir.join("device-plugins");
            std::fs::create_dir_all(&dp).unwrap();
            let log = dir.join("plugin.log");
            let child = Command::new(nvproxy_bin())
                .arg("device-plugin")
                .arg("--device-plugin-dir")
                .arg(&dp)
                .args(["--poll", "200ms"])
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("nvproxy device-plugin");
            let rt = tokio::runtime::Runtime::new().unwrap();
            let client = rt.block_on(async {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let incoming = device_plugin::serve_on(&dp.join("kubelet.sock")).unwrap();
                tokio::spawn(
                    tonic::transport::Server::builder()
                        .serve_with_incoming(RegistrationServer::new(Kubelet(tx)), incoming),
                );
                let reg = tokio::time::timeout(TIMEOUT, rx.recv())
                    .await
                    .expect("the plugin registers")
                    .unwrap();
                let ch = device_plugin::connect(&dp.join(&reg.endpoint), TIMEOUT)
                    .await
                    .unwrap();
                DevicePluginClient::new(ch)
            });
            Plugin {
                rt,
                child,
                log,
                client,
            }
        }

        /// The instance name of the CDI device the plugin answers `Allocate` of GPUs `gpus` with.
        fn allocate(&mut self, gpus: &[u32]) -> String {
            let ids = gpus
                .iter()
                .map(|&i| nvsim::SimGpu::h100(i).uuid_string())
                .collect();
            let r = self
                .rt
                .block_on(self.client.allocate(AllocateRequest {
                    container_requests: vec![ContainerAllocateRequest { devices_ids: ids }],
                }))
                .unwrap_or_else(|e| panic!("Allocate {gpus:?}: {e}\n{}", self.log_text()))
                .into_inner();
            let c = &r.container_responses[0];
            assert!(c.devices.is_empty() && c.mounts.is_empty(), "{c:?}");
            assert_eq!(c.cdi_devices.len(), 1, "{c:?}");
            c.cdi_devices[0]
                .name
                .strip_prefix("nvproxy.dev/gpu=")
                .unwrap_or_else(|| panic!("CDI name {:?}", c.cdi_devices[0].name))
                .to_owned()
        }

        fn log_text(&self) -> String {
            std::fs::read_to_string(&self.log).unwrap_or_default()
        }
    }

    impl Drop for Plugin {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let status = self.child.wait();
            eprintln!("--- plugin ({status:?}):\n{}", self.log_text());
        }
    }

    fn smi_lines(gpus: &[u32]) -> String {
        gpus.iter()
            .enumerate()
            .map(|(i, &g)| {
                let g = nvsim::SimGpu::h100(g);
                format!("GPU {i}: {} (UUID: {})\n", g.name, g.uuid_string())
            })
            .collect()
    }

    #[test]
    #[ignore = "needs /dev/cuse, root, podman and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
    fn the_device_plugins_cdi_names_run_containers_that_see_their_gpus() {
        let env = Env::new("device-plugin");
        let mut plugin = Plugin::start(&env.dir);
        let one = plugin.allocate(&[1]);
        let o = env.run(&one, &["/usr/bin/nvidia-smi", "-L"]);
        assert!(o.status.success(), "nvidia-smi -L with GPU 1");
        assert_eq!(stdout(&o), smi_lines(&[1]));
        // GPU 1 allocated again (the first pod is gone): a fresh instance, the first removed.
        let two = plugin.allocate(&[0, 1]);
        let o = env.run(&two, &["/usr/bin/nvidia-smi", "-L"]);
        assert!(o.status.success(), "nvidia-smi -L with GPUs 0 and 1");
        assert_eq!(stdout(&o), smi_lines(&[0, 1]));
        let spec = std::fs::read_to_string(SPEC_PATH).unwrap();
        assert!(
            !spec.contains(&format!("name: {one}")),
            "the first allocation's instance left the spec:\n{spec}"
        );
        drop(plugin);
        env.stop();
    }
}
