//! NVIDIA's own userspace through the proxy on the simulated GPU: `nvidia-smi` (and NVML) and
//! `libcuda.so.1` (driven by `cuda-probe`), from Debian 12's non-free packages of the driver
//! versions the team tests with, each against `nvproxy exec --driver sim` with the matching
//! `--sim-driver-version`.
//!
//! They need `/dev/cuse`, root and the unpacked userspace, so they are `#[ignore]`d and run by
//! `tests/run-kernel-tests.sh`, which fetches the userspace with `tests/nvidia-userspace/fetch.sh`
//! (`<target>/nvidia-userspace/<version>/{lib,bin/nvidia-smi}`; `NVIDIA_USERSPACE_DIR` names that
//! root) and builds the daemon (`NVPROXY_BIN`).
//!
//! What they pin down (values from `nvsim::SimGpu::h100`):
//! - `nvidia-smi -L` and `--query-gpu=name,uuid,pci.bus_id,memory.total,driver_version
//!   --format=csv` print the simulated GPU(s), exactly;
//! - with two simulated GPUs and an instance granted only the second (`--sim-gpus 2 --gpus 1`),
//!   exactly that GPU, as GPU 0;
//! - a userspace of another version than the simulated driver's is refused as on a real
//!   machine (NVML's version mismatch);
//! - `cuInit` goes as far as the simulated driver can honestly answer: it stops at the legacy
//!   GSS control `0x20808159`, which the real driver forwards to GSP firmware and whose meaning
//!   and answer are in no open source (`tests/nvidia-userspace/RESULTS.md`). The test asserts
//!   exactly that stop (CUresult, the control, its NV status, that only teardown follows), so a
//!   change in how far libcuda gets is seen;
//! - every run with `--check-leaks`: the simulated driver and the proxy hold nothing afterwards.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_cuda-probe");
/// One `nvproxy exec` of a real client (the VM guest runs 10-50x slower than the host).
const TIMEOUT: Duration = Duration::from_secs(300);
/// The versions of NVIDIA's userspace Debian 12 carries that the team tests with.
const VERSIONS: [&str; 2] = ["535.216.03", "535.261.03"];

fn require_cuse() {
    assert!(
        Path::new("/dev/cuse").exists(),
        "/dev/cuse is missing: these tests need a kernel with CUSE (modprobe cuse) and root; \
         run them with tests/run-kernel-tests.sh"
    );
}

/// `target/<profile>` of this test binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary in target/<profile>/deps")
        .to_path_buf()
}

fn nvproxy_bin() -> PathBuf {
    let path = std::env::var_os("NVPROXY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| profile_dir().join("nvproxy"));
    assert!(
        path.is_file(),
        "nvproxy binary {} not found: build it (cargo build -p daemon -p preload) or set \
         NVPROXY_BIN; tests/run-kernel-tests.sh does both",
        path.display()
    );
    path
}

/// NVIDIA's userspace of `version`: (the directory with libcuda.so.1 and libnvidia-ml.so.1,
/// nvidia-smi).
fn userspace(version: &str) -> (PathBuf, PathBuf) {
    let root = std::env::var_os("NVIDIA_USERSPACE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| profile_dir().join("../nvidia-userspace"));
    let lib = root.join(version).join("lib");
    let smi = root.join(version).join("bin/nvidia-smi");
    assert!(
        lib.join("libcuda.so.1").exists() && smi.exists(),
        "NVIDIA userspace {version} not found under {}: run tests/nvidia-userspace/fetch.sh \
         {version} (tests/run-kernel-tests.sh does, and sets NVIDIA_USERSPACE_DIR)",
        root.display()
    );
    (lib, smi)
}

/// Runs `nvproxy exec --driver sim --check-leaks EXEC_ARGS -- env LD_LIBRARY_PATH=LIB CMD...`,
/// killing it after [`TIMEOUT`]. Echoes its output to stderr.
fn exec(version: &str, exec_args: &[&str], lib: &Path, cmd: &[&str]) -> Output {
    let mut c = Command::new(nvproxy_bin());
    c.args([
        "exec",
        "--driver",
        "sim",
        "--sim-driver-version",
        version,
        "--check-leaks",
    ])
    .args(exec_args)
    .arg("--")
    .arg("env")
    .arg(format!("LD_LIBRARY_PATH={}", lib.display()))
    .args(cmd)
    .env("RUST_LOG", "warn")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn nvproxy exec");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            panic!("nvproxy exec {cmd:?} did not finish in {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = Output {
        status,
        stdout: t_out.join().expect("stdout reader"),
        stderr: t_err.join().expect("stderr reader"),
    };
    eprintln!(
        "--- {cmd:?} {exec_args:?} ({version}): {status} in {:?}\n--- stdout:\n{}--- stderr:\n{}",
        start.elapsed(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn gpu(index: u32) -> nvsim::SimGpu {
    nvsim::SimGpu::h100(index)
}

/// The `nvidia-smi -L` line of a simulated GPU shown as GPU `shown`.
fn smi_line(shown: u32, g: &nvsim::SimGpu) -> String {
    format!("GPU {shown}: {} (UUID: {})\n", g.name, g.uuid_string())
}

/// The `--query-gpu` csv row of a simulated GPU (NVML's bus id: 8-digit domain, upper case).
fn csv_row(g: &nvsim::SimGpu, version: &str) -> String {
    format!(
        "{}, {}, {:08X}:{:02X}:{:02X}.{:X}, {} MiB, {version}\n",
        g.name,
        g.uuid_string(),
        g.pci_domain,
        g.pci_bus,
        g.pci_device,
        g.pci_function,
        g.memory_bytes >> 20
    )
}

const QUERY: &str = "--query-gpu=name,uuid,pci.bus_id,memory.total,driver_version";
const CSV_HEADER: &str = "name, uuid, pci.bus_id, memory.total [MiB], driver_version\n";

fn assert_ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: exit {} (3 = --check-leaks found objects left in the simulated driver or the \
         proxy)",
        o.status
    );
}

#[test]
#[ignore = "needs /dev/cuse and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
fn nvidia_smi_lists_the_simulated_gpu() {
    require_cuse();
    for v in VERSIONS {
        let (lib, smi) = userspace(v);
        let o = exec(v, &[], &lib, &[smi.to_str().unwrap(), "-L"]);
        assert_ok(&o, "nvidia-smi -L");
        assert_eq!(stdout(&o), smi_line(0, &gpu(0)), "nvidia-smi -L with {v}");
    }
}

#[test]
#[ignore = "needs /dev/cuse and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
fn nvidia_smi_query_gpu_prints_the_simulated_values() {
    require_cuse();
    for v in VERSIONS {
        let (lib, smi) = userspace(v);
        let o = exec(
            v,
            &[],
            &lib,
            &[smi.to_str().unwrap(), QUERY, "--format=csv"],
        );
        assert_ok(&o, "nvidia-smi --query-gpu");
        assert_eq!(
            stdout(&o),
            format!("{CSV_HEADER}{}", csv_row(&gpu(0), v)),
            "nvidia-smi --query-gpu with {v}"
        );
    }
}

#[test]
#[ignore = "needs /dev/cuse and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
fn two_gpus_both_listed_in_order() {
    require_cuse();
    let v = VERSIONS[1];
    let (lib, smi) = userspace(v);
    let o = exec(
        v,
        &["--sim-gpus", "2"],
        &lib,
        &[smi.to_str().unwrap(), "-L"],
    );
    assert_ok(&o, "nvidia-smi -L, two GPUs");
    assert_eq!(
        stdout(&o),
        format!("{}{}", smi_line(0, &gpu(0)), smi_line(1, &gpu(1)))
    );
}

#[test]
#[ignore = "needs /dev/cuse and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
fn instance_granted_the_second_gpu_sees_exactly_it_as_gpu_0() {
    require_cuse();
    let only_second = ["--sim-gpus", "2", "--gpus", "1"];
    for v in VERSIONS {
        let (lib, smi) = userspace(v);
        let smi = smi.to_str().unwrap();
        let o = exec(v, &only_second, &lib, &[smi, "-L"]);
        assert_ok(&o, "nvidia-smi -L, --gpus 1");
        assert_eq!(stdout(&o), smi_line(0, &gpu(1)), "-L with {v}");
        let o = exec(v, &only_second, &lib, &[smi, QUERY, "--format=csv"]);
        assert_ok(&o, "nvidia-smi --query-gpu, --gpus 1");
        assert_eq!(
            stdout(&o),
            format!("{CSV_HEADER}{}", csv_row(&gpu(1), v)),
            "--query-gpu with {v}"
        );
        // The GPU index selects among the visible GPUs only.
        let o = exec(
            v,
            &only_second,
            &lib,
            &[smi, "-i", "0", "--query-gpu=uuid", "--format=csv,noheader"],
        );
        assert_ok(&o, "nvidia-smi -i 0");
        assert_eq!(stdout(&o), format!("{}\n", gpu(1).uuid_string()));
    }
}

#[test]
#[ignore = "needs /dev/cuse and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
fn userspace_of_another_version_is_refused() {
    require_cuse();
    // 535.216.03's NVML against a driver that says 535.261.03: CHECK_VERSION_STR fails, as on
    // a machine whose kernel module and userspace differ.
    let (lib, smi) = userspace(VERSIONS[0]);
    let o = exec(VERSIONS[1], &[], &lib, &[smi.to_str().unwrap(), "-L"]);
    assert!(!o.status.success(), "a mismatched userspace must fail");
    assert_ne!(
        o.status.code(),
        Some(3),
        "nothing may be left in the driver"
    );
    let all = format!("{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
    assert!(
        all.contains("version mismatch"),
        "expected NVML's version mismatch, got: {all}"
    );
}

/// The probe's JSON line.
fn probe_json(o: &Output) -> Value {
    let text = stdout(o);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("cuda-probe output {text:?}: {e}"))
}

#[test]
#[ignore = "needs /dev/cuse and NVIDIA userspace; run by tests/run-kernel-tests.sh"]
fn cuinit_goes_as_far_as_the_simulator_can_honestly_answer() {
    require_cuse();
    for (v, exec_args) in [
        (VERSIONS[0], &[][..]),
        (VERSIONS[1], &[][..]),
        (VERSIONS[1], &["--sim-gpus", "2", "--gpus", "1"][..]),
    ] {
        let (lib, _) = userspace(v);
        let o = exec(v, exec_args, &lib, &[PROBE, "init"]);
        // The probe's own status (1: a step failed), not --check-leaks' 3.
        assert_eq!(
            o.status.code(),
            Some(1),
            "cuda-probe init with {v} {exec_args:?}"
        );
        let j = probe_json(&o);
        let failed = &j["failed"];
        assert_eq!(failed["call"], "cuInit");
        assert_eq!(failed["result_name"], "CUDA_ERROR_NO_DEVICE", "{j}");
        // libcuda's last request before it tears down: the legacy GSS control, answered
        // NV_ERR_NOT_SUPPORTED (0x56) by the simulator because GSP's answer is unknown.
        let calls = failed["last_ioctls"].as_array().expect("last_ioctls");
        let first_teardown = calls
            .iter()
            .position(|c| {
                c["escape"] == "RM_UNMAP_MEMORY"
                    || c["escape"] == "RM_FREE"
                    || c["uvm_cmd"] == "0x30000002"
            })
            .expect("libcuda tears down after the failure");
        let before = &calls[first_teardown - 1];
        assert_eq!(before["escape"], "RM_CONTROL", "{before}");
        assert_eq!(before["code"], "0x20808159", "{before}");
        assert_eq!(before["nv_status"], "0x56", "{before}");
        // Everything before it in the window succeeded or is one of the documented tolerated
        // NOT_SUPPORTED answers.
        for c in &calls[..first_teardown - 1] {
            assert_eq!(c["ret"], 0, "{c}");
        }
        assert!(j["nv_ioctls"].as_u64().unwrap() >= 70, "{j}");
        // The GPUs the driver showed libcuda: exactly the instance's (the second one when it is
        // granted only that).
        let shown = if exec_args.is_empty() { gpu(0) } else { gpu(1) };
        assert_eq!(
            j["probed_gpu_ids"],
            serde_json::json!([format!("{:#x}", shown.gpu_id())]),
            "{j}"
        );
    }
}
