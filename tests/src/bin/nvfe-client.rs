//! `nvfe-client`: a test client that speaks NVIDIA's frontend ABI (`/dev/nvidiactl`,
//! `/dev/nvidia<N>`) with raw ioctls, as libcuda does, and checks every answer.
//!
//! `nvfe-client [--driver-version V] [--dev-dir DIR] SCENARIO [ARGS]`
//!
//! - `init`: the frontend part of a CUDA initialisation (see `tests::nvfe::Session`), then the
//!   frees; prints one JSON summary line. `--expect-gpus N`, `--expect-name S` check what the
//!   instance shows.
//! - hostile scenarios: each makes one kind of bad call (or a few variants of it) and checks the
//!   exact errno or NV status; the defaults are what the real driver answers (or, where the
//!   proxy decides, what it answers), each overridable with `--expect`.
//! - `hold`: allocates a root client, a device and a subdevice, prints their handles as JSON and
//!   waits: `check` on stdin re-uses the client, `free` frees and exits, EOF keeps holding until
//!   killed.
//! - `concurrent N`: N threads each run `init` on their own files at once.
//!
//! Output: one JSON line on stdout. Exit status 0 only if every check passed, 1 otherwise, 2 on
//! usage errors.

use std::fs::File;
use std::io::{BufRead, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use nvproxy_abi::RMAPI_PARAM_COPY_MAX_PARAMS_SIZE;
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use serde_json::json;
use tests::nvfe::status::*;
use tests::nvfe::*;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// `sizeof(nv_ioctl_numa_info_t)` (`nv-ioctl-numa.h`: nid, status, memblock_size,
/// numa_mem_addr, numa_mem_size, use_auto_online, offline_addresses{`u64[64]`, u32}).
const NUMA_INFO_SIZE: usize = 560;
/// An escape number the driver does not define (`nv_escape.h` ends at 0x5f, the Unix ones are
/// 0xc8..=0xda).
const UNKNOWN_ESCAPE_NR: u8 = 0x7f;

#[derive(Parser)]
#[command(
    name = "nvfe-client",
    about = "NVIDIA frontend ABI test client (raw ioctls)"
)]
struct Cli {
    /// The driver version to speak (the version string of CHECK_VERSION_STR and the ABI table).
    #[arg(long, default_value = "535.261.03", global = true)]
    driver_version: String,
    /// Directory holding nvidiactl and `nvidia<N>`.
    #[arg(long, default_value = "/dev", global = true)]
    dev_dir: PathBuf,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// The frontend part of a CUDA initialisation, then the frees.
    Init {
        /// The number of GPUs the instance must show.
        #[arg(long)]
        expect_gpus: Option<usize>,
        /// The name GPU 0 must report (GPU_GET_NAME_STRING).
        #[arg(long)]
        expect_name: Option<String>,
    },
    /// An escape number the driver does not know (driver: rm_ioctl's default case, EINVAL).
    UnknownEscape {
        #[arg(long, default_value = "EINVAL")]
        expect: String,
    },
    /// RM_CONTROL with _IOC_SIZE 48 instead of 32 (driver: dataSize check, EINVAL).
    OversizedParams {
        #[arg(long, default_value = "EINVAL")]
        expect: String,
    },
    /// RM_CONTROL with _IOC_SIZE 16 instead of 32 (driver: dataSize check, EINVAL).
    UndersizedParams {
        #[arg(long, default_value = "EINVAL")]
        expect: String,
    },
    /// RM_CONTROL whose params pointer names inaccessible memory (driver: the param copy-in
    /// fails in os_memcpy_from_user: NV_ERR_INVALID_ADDRESS in the status, ioctl succeeds).
    BadNestedPointer {
        #[arg(long, default_value = "NV_ERR_INVALID_ADDRESS")]
        expect: String,
    },
    /// GPU_GET_CLASSLIST whose classList (a pointer inside the params) names inaccessible memory
    /// (driver: embeddedParamCopyIn fails: NV_ERR_INVALID_ADDRESS).
    BadEmbeddedPointer {
        #[arg(long, default_value = "NV_ERR_INVALID_ADDRESS")]
        expect: String,
    },
    /// RM_CONTROL with paramsSize beyond the control's size and RMAPI_PARAM_COPY_MAX_PARAMS_SIZE
    /// (driver: _rmapiRmControl's size check: NV_ERR_INVALID_ARGUMENT).
    ParamsSizeTooLarge {
        /// paramsSize (a buffer this large is allocated, so only the size is wrong).
        #[arg(long, default_value_t = RMAPI_PARAM_COPY_MAX_PARAMS_SIZE + 4096)]
        size: u32,
        #[arg(long, default_value = "NV_ERR_INVALID_ARGUMENT")]
        expect: String,
    },
    /// REGISTER_FD naming a descriptor number that is not open. The proxy resolves fd fields
    /// itself and fails a foreign or closed fd with EBADF (ioctl-proxy `FdError::Foreign`); the
    /// real driver would say EINVAL (nv_get_file_private fails).
    ForeignFd {
        /// The descriptor number (default: the first closed one from 100).
        #[arg(long)]
        fd: Option<i32>,
        #[arg(long, default_value = "EBADF")]
        expect: String,
    },
    /// REGISTER_FD naming an open descriptor that is not one of the instance's nodes
    /// (/dev/null, a pipe: the proxy's EBADF), and one that is, but is `nvidia<N>` rather than
    /// nvidiactl (forwarded; the driver's nv_get_file_private(require ctl) fails: EINVAL).
    NonNvproxyFd {
        #[arg(long, default_value = "EBADF")]
        expect: String,
        #[arg(long, default_value = "EINVAL")]
        expect_non_ctl: String,
    },
    /// REGISTER_FD on this instance's nvidia0 naming an open nvidiactl of *another* instance
    /// (both paths given, e.g. /dev/nvproxy/b/nvidiactl from a host process): the proxy's fd
    /// resolution accepts only this instance's nodes (EBADF).
    CrossInstanceFd {
        /// The other instance's nvidiactl.
        #[arg(long)]
        other: PathBuf,
        #[arg(long, default_value = "EBADF")]
        expect: String,
    },
    /// Frees an object twice (driver, RS_COMPATABILITY_MODE: the second free is NV_OK) and the
    /// root client twice (the proxy's object table: NV_ERR_INVALID_CLIENT).
    DoubleFree {
        #[arg(long, default_value = "NV_OK")]
        expect_object: String,
        #[arg(long, default_value = "NV_ERR_INVALID_CLIENT")]
        expect_client: String,
    },
    /// Reaches for GPUs outside the instance: NV01_DEVICE_0 with every deviceId below
    /// NV_MAX_DEVICES that no visible GPU has, and for each --gpu-id the NV0000 controls that
    /// name a GPU id and NV_ESC_ATTACH_GPUS_TO_FD. Each default is what the driver answers for
    /// a GPU it does not have (see `OutsideSet`).
    GpuOutsideSet(OutsideSet),
    /// NV_ESC_NUMA_INFO on `nvidia<N>` and on nvidiactl: the driver serves it on a GPU node
    /// (nv.c, every supported version: 535 declares it in kernel-open/common/inc) and answers
    /// EINVAL on nvidiactl.
    NumaInfo {
        /// The answer on nvidia0.
        #[arg(long, default_value = "ok")]
        expect_gpu: String,
        /// The answer on nvidiactl.
        #[arg(long, default_value = "EINVAL")]
        expect_ctl: String,
    },
    /// Uses an RM client handle this process did not allocate (RM_CONTROL, RM_ALLOC under it,
    /// RM_FREE of it, RM_DUP_OBJECT from it): the proxy's object table refuses each.
    UseHandle {
        /// The handle (hex or decimal), e.g. one printed by `hold` in another instance.
        #[arg(value_parser = parse_u32)]
        handle: u32,
        #[arg(long, default_value = "NV_ERR_INVALID_CLIENT")]
        expect: String,
    },
    /// Allocates a root client, device and subdevice, prints their handles and waits.
    Hold,
    /// A hostile tenant's call that never ends on its own: an RM control whose params lie on a
    /// page of a `userfaultfd` nobody serves. Prints `{"parked": ...}` before the call and its
    /// outcome after it (the daemon's client-wait deadline, or a live upgrade, ends it).
    ParkOnUffd,
    /// N threads each run the init sequence on their own files at once.
    Concurrent {
        threads: usize,
        /// Init sequences per thread.
        #[arg(long, default_value_t = 1)]
        iterations: usize,
    },
    /// Issues the control NAME (zeroed params of its table size) on the client, device or
    /// subdevice and checks the status (for policy and audit tests).
    ProbeControl {
        name: String,
        /// For the info-list controls ({listSize, list pointer at offset 8}: FB_GET_INFO,
        /// GR_GET_INFO, BUS_GET_INFO, ...): the indices to ask for.
        #[arg(long, value_delimiter = ',', value_parser = parse_u32)]
        list: Vec<u32>,
        #[arg(long, default_value = "NV_OK")]
        expect: String,
    },
}

/// `gpu-outside-set`: the GPUs to reach for and the expected answers.
#[derive(clap::Args)]
struct OutsideSet {
    /// GPU ids (hex or decimal) of GPUs the instance must not reach.
    #[arg(long = "gpu-id", value_parser = parse_u32)]
    gpu_ids: Vec<u32>,
    /// NV01_DEVICE_0: deviceConstruct_IMPL (gpu/device.c) answers an invalid device instance
    /// (gpumgrIsDeviceInstanceValid fails) with NV_ERR_INVALID_CLASS.
    #[arg(long, default_value = "NV_ERR_INVALID_CLASS")]
    expect_device: String,
    /// GPU_ATTACH_IDS: cliresCtrlCmdGpuAttachIds_IMPL, an id not probed: NV_ERR_INVALID_ARGUMENT.
    #[arg(long, default_value = "NV_ERR_INVALID_ARGUMENT")]
    expect_attach: String,
    /// GPU_GET_ID_INFO_V2: gpumgrGetGpuIdInfoV2, gpumgrGetGpuFromId fails:
    /// NV_ERR_INVALID_ARGUMENT.
    #[arg(long, default_value = "NV_ERR_INVALID_ARGUMENT")]
    expect_id_info: String,
    /// GPU_GET_PCI_INFO: gpumgrGetProbedGpuDomainBusDevice, no probed GPU with the id:
    /// NV_ERR_OBJECT_NOT_FOUND.
    #[arg(long, default_value = "NV_ERR_OBJECT_NOT_FOUND")]
    expect_pci_info: String,
    /// GPU_GET_UUID_FROM_GPU_ID: cliresCtrlCmdGpuGetUuidFromGpuId_IMPL, no GPU with the id:
    /// NV_ERR_OBJECT_NOT_FOUND.
    #[arg(long, default_value = "NV_ERR_OBJECT_NOT_FOUND")]
    expect_uuid: String,
    /// NV_ESC_ATTACH_GPUS_TO_FD: nvidia_dev_get fails in nv.c: EINVAL.
    #[arg(long, default_value = "EINVAL")]
    expect_attach_fd: String,
}

/// Milliseconds of `d` for the report (saturating; a run takes minutes).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?}: {e}"))
}

/// The checks of one hostile scenario.
struct Checks {
    scenario: &'static str,
    list: Vec<serde_json::Value>,
    ok: bool,
}

impl Checks {
    fn new(scenario: &'static str) -> Checks {
        Checks {
            scenario,
            list: Vec::new(),
            ok: true,
        }
    }

    /// Records `got` against `want` for `call`.
    fn record(&mut self, call: impl Into<String>, got: Outcome, want: Outcome) {
        let call = call.into();
        let ok = got == want;
        self.ok &= ok;
        if !ok {
            eprintln!("nvfe-client: {call}: got {got}, want {want}");
        }
        self.list.push(json!({
            "call": call,
            "got": got.to_string(),
            "want": want.to_string(),
            "ok": ok,
        }));
    }

    fn finish(self, extra: serde_json::Value) -> ExitCode {
        let mut out = json!({
            "scenario": self.scenario,
            "ok": self.ok,
            "checks": self.list,
        });
        if let (Some(o), serde_json::Value::Object(e)) = (out.as_object_mut(), extra) {
            o.extend(e);
        }
        println!("{out}");
        exit(self.ok)
    }
}

fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn expectation(s: &str) -> Result<Outcome, Error> {
    Outcome::parse(s).ok_or_else(|| Error::Check(format!("cannot parse expectation {s:?}")))
}

fn errno_outcome(r: Result<i32, i32>) -> Outcome {
    match r {
        Ok(_) => Outcome::Ok,
        Err(e) => Outcome::Errno(e),
    }
}

fn status_outcome(r: Result<u32, i32>) -> Outcome {
    match r {
        Ok(s) => Outcome::Status(s),
        Err(e) => Outcome::Errno(e),
    }
}

/// A session with the root client, the NV0000 controls and GPU 0's device and subdevice.
fn session_with_device(cli: &Cli) -> Result<Session, Error> {
    let mut s = Session::open(&cli.driver_version, &cli.dev_dir)?;
    s.probe()?;
    s.system_controls()?;
    s.open_gpus()?;
    s.attach()?;
    if s.gpus.is_empty() {
        return Err(Error::Check("the instance shows no GPU".into()));
    }
    s.alloc_device(0)?;
    Ok(s)
}

fn run_init(cli: &Cli, expect_gpus: Option<usize>, expect_name: Option<&str>) -> ExitCode {
    let started = Instant::now();
    let mut s = match Session::open(&cli.driver_version, &cli.dev_dir) {
        Ok(s) => s,
        Err(e) => return fail("init", &e, 1),
    };
    let result = s.init_all().and_then(|()| {
        if let Some(n) = expect_gpus
            && s.gpus.len() != n
        {
            return Err(Error::Check(format!(
                "the instance shows {} GPUs, want {n}",
                s.gpus.len()
            )));
        }
        if let Some(want) = expect_name {
            let got = s.gpus.first().and_then(|g| g.info.get("name").cloned());
            if got.as_ref().and_then(|v| v.as_str()) != Some(want) {
                return Err(Error::Check(format!("GPU 0 name {got:?}, want {want:?}")));
            }
        }
        Ok(())
    });
    let summary = s.summary();
    let teardown = s.teardown();
    match result.and(teardown) {
        Ok(()) => {
            let mut out = json!({"scenario": "init", "ok": true});
            if let (Some(o), serde_json::Value::Object(m)) = (out.as_object_mut(), summary) {
                o.extend(m);
            }
            out["ioctls"] = s.fe.ioctls().into();
            out["elapsed_ms"] = millis(started.elapsed()).into();
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => fail("init", &e, s.fe.ioctls()),
    }
}

fn fail(scenario: &str, e: &Error, ioctls: u64) -> ExitCode {
    eprintln!("nvfe-client: {scenario}: {e}");
    println!(
        "{}",
        json!({"scenario": scenario, "ok": false, "error": e.to_string(), "ioctls": ioctls})
    );
    ExitCode::FAILURE
}

fn run_unknown_escape(cli: &Cli, expect: &str) -> Result<ExitCode, Error> {
    let want = expectation(expect)?;
    let mut s = Session::open(&cli.driver_version, &cli.dev_dir)?;
    let mut c = Checks::new("unknown-escape");
    let mut call = Call::new(nv_iowr(UNKNOWN_ESCAPE_NR, 8), vec![0; 8]);
    let got = errno_outcome(s.fe.ioctl(&s.ctl, &mut call));
    c.record(
        format!("_IOWR('F', {UNKNOWN_ESCAPE_NR:#x}, 8) on nvidiactl"),
        got,
        want,
    );
    Ok(c.finish(json!({})))
}

/// RM_CONTROL GPU_GET_PROBED_IDS with the NVOS54 sent under `_IOC_SIZE` `size`.
fn run_wrong_size(
    cli: &Cli,
    scenario: &'static str,
    size: usize,
    expect: &str,
) -> Result<ExitCode, Error> {
    let want = expectation(expect)?;
    let mut s = Session::open(&cli.driver_version, &cli.dev_dir)?;
    s.alloc_root()?;
    let c_ref = s.fe.control("NV0000_CTRL_CMD_GPU_GET_PROBED_IDS")?;
    let mut p = NVOS54_PARAMETERS::new_zeroed();
    p.hClient = s.h_client;
    p.hObject = s.h_client;
    p.cmd = c_ref.cmd;
    p.paramsSize = c_ref.size;
    let mut params = p.as_bytes().to_vec();
    params.resize(size.max(params.len()), 0);
    let mut call = Call::new(nv_iowr(NV_ESC_RM_CONTROL, size), params);
    if size >= 24 {
        call.nest(None, 16, vec![0; c_ref.size as usize]);
    }
    let got = errno_outcome(s.fe.ioctl(&s.ctl, &mut call));
    let mut c = Checks::new(scenario);
    c.record(
        format!("NV_ESC_RM_CONTROL with _IOC_SIZE {size} (want 32)"),
        got,
        want,
    );
    s.teardown()?;
    Ok(c.finish(json!({})))
}

fn run_bad_nested_pointer(cli: &Cli, expect: &str) -> Result<ExitCode, Error> {
    let want = expectation(expect)?;
    let mut s = Session::open(&cli.driver_version, &cli.dev_dir)?;
    s.alloc_root()?;
    let c_ref = s.fe.control("NV0000_CTRL_CMD_GPU_GET_PROBED_IDS")?;
    let mut p = NVOS54_PARAMETERS::new_zeroed();
    p.hClient = s.h_client;
    p.hObject = s.h_client;
    p.cmd = c_ref.cmd;
    p.params = inaccessible_address();
    p.paramsSize = c_ref.size;
    let mut call = Call::new(NV_ESC_RM_CONTROL_CMD, p.as_bytes().to_vec());
    let r = s.fe.ioctl(&s.ctl, &mut call);
    let got = status_outcome(r.map(|_| {
        NVOS54_PARAMETERS::read_from_bytes(&call.params)
            .expect("32 bytes")
            .status
    }));
    let mut c = Checks::new("bad-nested-pointer");
    c.record(
        format!(
            "NV_ESC_RM_CONTROL GPU_GET_PROBED_IDS params={:#x} (PROT_NONE)",
            p.params
        ),
        got,
        want,
    );
    s.teardown()?;
    Ok(c.finish(json!({})))
}

fn run_bad_embedded_pointer(cli: &Cli, expect: &str) -> Result<ExitCode, Error> {
    let want = expectation(expect)?;
    let mut s = session_with_device(cli)?;
    let c_ref = s.fe.control("NV0080_CTRL_CMD_GPU_GET_CLASSLIST")?;
    let mut p = NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS::new_zeroed();
    p.numClasses = 4;
    p.classList = inaccessible_address();
    let (h, hd) = (s.h_client, s.gpus[0].h_device);
    let r =
        s.fe.rm_control_raw(&s.ctl, h, hd, c_ref.cmd, p.as_bytes().to_vec(), vec![]);
    let got = status_outcome(r.map(|r| r.status));
    let mut c = Checks::new("bad-embedded-pointer");
    c.record(
        format!(
            "NV_ESC_RM_CONTROL GPU_GET_CLASSLIST classList={:#x} (PROT_NONE)",
            p.classList
        ),
        got,
        want,
    );
    s.teardown()?;
    Ok(c.finish(json!({})))
}

fn run_params_size_too_large(cli: &Cli, size: u32, expect: &str) -> Result<ExitCode, Error> {
    let want = expectation(expect)?;
    let mut s = Session::open(&cli.driver_version, &cli.dev_dir)?;
    s.alloc_root()?;
    let c_ref = s.fe.control("NV0000_CTRL_CMD_GPU_GET_PROBED_IDS")?;
    let h = s.h_client;
    let r =
        s.fe.rm_control_raw(&s.ctl, h, h, c_ref.cmd, vec![0; size as usize], vec![]);
    let got = status_outcome(r.map(|r| r.status));
    let mut c = Checks::new("params-size-too-large");
    c.record(
        format!(
            "NV_ESC_RM_CONTROL GPU_GET_PROBED_IDS paramsSize={size} (control size {})",
            c_ref.size
        ),
        got,
        want,
    );
    s.teardown()?;
    Ok(c.finish(json!({})))
}

/// The first descriptor number from `from` that is not open in this process.
fn closed_fd(from: i32) -> i32 {
    (from..)
        .find(|n| !Path::new(&format!("/proc/self/fd/{n}")).exists())
        .expect("a free descriptor number")
}

fn open_gpu0(s: &Session) -> Result<File, Error> {
    open_node(&s.dev_dir.join("nvidia0"))
}

fn run_foreign_fd(cli: &Cli, fd: Option<i32>, expect: &str) -> Result<ExitCode, Error> {
    let want = expectation(expect)?;
    let mut s = Session::open(&cli.driver_version, &cli.dev_dir)?;
    let dev = open_gpu0(&s)?;
    let fd = fd.unwrap_or_else(|| closed_fd(100));
    let got = errno_outcome(s.fe.register_fd(&dev, fd));
    let mut c = Checks::new("foreign-fd");
    c.record(
        format!("NV_ESC_REGISTER_FD on nvidia0, ctl_fd={fd} (not open)"),
        got,
        want,
    );
    // The file must still be usable: registering the real ctl fd works afterwards.
    let ctl_fd = s.ctl.as_raw_fd();
    let after = errno_outcome(s.fe.register_fd(&dev, ctl_fd));
    c.record(
        "NV_ESC_REGISTER_FD on the same nvidia0 with the real ctl fd afterwards",
        after,
        Outcome::Ok,
    );
    Ok(c.finish(json!({})))
}

fn run_non_nvproxy_fd(cli: &Cli, expect: &str, expect_non_ctl: &str) -> Result<ExitCode, Error> {
    let want = expectation(expect)?;
    let want_non_ctl = expectation(expect_non_ctl)?;
    let mut s = Session::open(&cli.driver_version, &cli.dev_dir)?;
    let dev = open_gpu0(&s)?;
    let mut c = Checks::new("non-nvproxy-fd");
    let null = File::open("/dev/null").map_err(|e| Error::Check(format!("/dev/null: {e}")))?;
    let got = errno_outcome(s.fe.register_fd(&dev, null.as_raw_fd()));
    c.record(
        format!("NV_ESC_REGISTER_FD ctl_fd={} (/dev/null)", null.as_raw_fd()),
        got,
        want,
    );
    let (rd, _wr) = pipe().map_err(|e| Error::Check(format!("pipe: {e}")))?;
    let got = errno_outcome(s.fe.register_fd(&dev, rd.as_raw_fd()));
    c.record(
        format!("NV_ESC_REGISTER_FD ctl_fd={} (pipe)", rd.as_raw_fd()),
        got,
        want,
    );
    let other = open_gpu0(&s)?;
    let got = errno_outcome(s.fe.register_fd(&dev, other.as_raw_fd()));
    c.record(
        format!(
            "NV_ESC_REGISTER_FD ctl_fd={} (another nvidia0, not nvidiactl)",
            other.as_raw_fd()
        ),
        got,
        want_non_ctl,
    );
    Ok(c.finish(json!({})))
}

fn run_cross_instance_fd(cli: &Cli, other: &Path, expect: &str) -> Result<ExitCode, Error> {
    let want = expectation(expect)?;
    let mut s = Session::open(&cli.driver_version, &cli.dev_dir)?;
    let dev = open_gpu0(&s)?;
    let foreign = open_node(other)?;
    let mut c = Checks::new("cross-instance-fd");
    let got = errno_outcome(s.fe.register_fd(&dev, foreign.as_raw_fd()));
    c.record(
        format!(
            "NV_ESC_REGISTER_FD on {} naming {} (fd {})",
            s.dev_dir.join("nvidia0").display(),
            other.display(),
            foreign.as_raw_fd()
        ),
        got,
        want,
    );
    let ctl_fd = s.ctl.as_raw_fd();
    let after = errno_outcome(s.fe.register_fd(&dev, ctl_fd));
    c.record(
        "NV_ESC_REGISTER_FD on the same nvidia0 with our own nvidiactl afterwards",
        after,
        Outcome::Ok,
    );
    Ok(c.finish(json!({})))
}

fn run_double_free(cli: &Cli, expect_object: &str, expect_client: &str) -> Result<ExitCode, Error> {
    let (want_obj, want_client) = (expectation(expect_object)?, expectation(expect_client)?);
    let mut s = session_with_device(cli)?;
    let mut c = Checks::new("double-free");
    let (h, hd, hs) = (s.h_client, s.gpus[0].h_device, s.gpus[0].h_subdevice);
    s.fe.rm_free(&s.ctl, h, hd, hs)?;
    s.gpus[0].h_subdevice = 0;
    let got = status_outcome(s.fe.rm_free_raw(&s.ctl, h, hd, hs));
    c.record(
        format!("NV_ESC_RM_FREE subdevice {hs:#x} again"),
        got,
        want_obj,
    );
    // Free the client (with the device under it), then again.
    s.fe.rm_free(&s.ctl, h, 0, h)?;
    s.gpus[0].h_device = 0;
    s.h_client = 0;
    let got = status_outcome(s.fe.rm_free_raw(&s.ctl, h, 0, h));
    c.record(
        format!("NV_ESC_RM_FREE client {h:#x} again"),
        got,
        want_client,
    );
    Ok(c.finish(json!({})))
}

fn run_gpu_outside_set(cli: &Cli, o: &OutsideSet) -> Result<ExitCode, Error> {
    let gpu_ids = &o.gpu_ids;
    let want_device = expectation(&o.expect_device)?;
    let want_attach = expectation(&o.expect_attach)?;
    let want_id_info = expectation(&o.expect_id_info)?;
    let want_pci_info = expectation(&o.expect_pci_info)?;
    let want_uuid = expectation(&o.expect_uuid)?;
    let want_attach_fd = expectation(&o.expect_attach_fd)?;
    let mut s = Session::open(&cli.driver_version, &cli.dev_dir)?;
    s.probe()?;
    s.system_controls()?;
    s.open_gpus()?;
    s.attach()?;
    let mut c = Checks::new("gpu-outside-set");
    let visible: Vec<u32> = s.gpus.iter().map(|g| g.gpu_id).collect();
    let instances: Vec<u32> = s.gpus.iter().map(|g| g.device_instance).collect();

    // NV01_DEVICE_0 for every device instance (< NV_MAX_DEVICES) the instance does not show.
    let class = s.fe.class("NV01_DEVICE_0")?;
    let h = s.h_client;
    let h_new = 0xcaf0_f000;
    for device_id in (0u32..)
        .take(CARD_INFO_ENTRIES)
        .filter(|d| !instances.contains(d))
    {
        let mut dp = NV0080_ALLOC_PARAMETERS::new_zeroed();
        dp.deviceId = device_id;
        dp.hClientShare = h;
        let r =
            s.fe.rm_alloc_raw(&s.ctl, h, h, h_new, class, Some(dp.as_bytes().to_vec()));
        let got = status_outcome(r.map(|p| p.status));
        if got == Outcome::Status(NV_OK) {
            // Do not leave it behind if the proxy let it through.
            let _ = s.fe.rm_free_raw(&s.ctl, h, h, h_new);
        }
        c.record(
            format!("NV_ESC_RM_ALLOC NV01_DEVICE_0 deviceId={device_id}"),
            got,
            want_device,
        );
    }

    for &id in gpu_ids {
        if visible.contains(&id) {
            return Err(Error::Check(format!(
                "GPU {id:#x} is visible in this instance ({visible:#x?}): not outside the set"
            )));
        }
        let got = status_outcome(match s.attach_ids(&[id]) {
            Ok(st) => Ok(st),
            Err(Error::Errno { errno, .. }) => Err(errno),
            Err(e) => return Err(e),
        });
        c.record(format!("GPU_ATTACH_IDS [{id:#x}]"), got, want_attach);

        let got = status_outcome(match s.id_info_raw(id) {
            Ok((st, _)) => Ok(st),
            Err(Error::Errno { errno, .. }) => Err(errno),
            Err(e) => return Err(e),
        });
        c.record(format!("GPU_GET_ID_INFO_V2 {id:#x}"), got, want_id_info);

        let mut pci = NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS::new_zeroed();
        pci.gpuId = id;
        let got =
            client_control_outcome(&mut s, "NV0000_CTRL_CMD_GPU_GET_PCI_INFO", pci.as_bytes())?;
        c.record(format!("GPU_GET_PCI_INFO {id:#x}"), got, want_pci_info);

        let mut uuid = NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS::new_zeroed();
        uuid.gpuId = id;
        uuid.flags = GID_FLAGS_FORMAT_BINARY;
        let got = client_control_outcome(
            &mut s,
            "NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID",
            uuid.as_bytes(),
        )?;
        c.record(format!("GPU_GET_UUID_FROM_GPU_ID {id:#x}"), got, want_uuid);

        // ATTACH_GPUS_TO_FD may be issued once per file: use a fresh nvidiactl each time.
        let file = open_node(&s.dev_dir.join("nvidiactl"))?;
        let mut call = Call::new(
            nv_iowr(NV_ESC_ATTACH_GPUS_TO_FD, 4),
            id.to_ne_bytes().to_vec(),
        );
        let got = errno_outcome(s.fe.ioctl(&file, &mut call));
        c.record(
            format!("NV_ESC_ATTACH_GPUS_TO_FD [{id:#x}]"),
            got,
            want_attach_fd,
        );
    }
    s.teardown()?;
    let visible: Vec<String> = visible.iter().map(|id| format!("{id:#x}")).collect();
    Ok(c.finish(json!({"visible_gpu_ids": visible})))
}

/// The control `name` on the session's client with `params`: its status or errno.
fn client_control_outcome(s: &mut Session, name: &str, params: &[u8]) -> Result<Outcome, Error> {
    let c_ref = s.fe.control(name)?;
    let h = s.h_client;
    let r =
        s.fe.rm_control_raw(&s.ctl, h, h, c_ref.cmd, params.to_vec(), vec![]);
    Ok(status_outcome(r.map(|r| r.status)))
}

fn run_numa_info(cli: &Cli, expect_gpu: &str, expect_ctl: &str) -> Result<ExitCode, Error> {
    let (want_gpu, want) = (expectation(expect_gpu)?, expectation(expect_ctl)?);
    let mut s = Session::open(&cli.driver_version, &cli.dev_dir)?;
    let dev = open_gpu0(&s)?;
    let mut c = Checks::new("numa-info");
    let cmd = nv_iowr(NV_ESC_NUMA_INFO, NUMA_INFO_SIZE);
    let mut call = Call::new(cmd, vec![0; NUMA_INFO_SIZE]);
    let got = errno_outcome(s.fe.ioctl(&dev, &mut call));
    c.record("NV_ESC_NUMA_INFO on nvidia0", got, want_gpu);
    let mut call = Call::new(cmd, vec![0; NUMA_INFO_SIZE]);
    let got = errno_outcome(s.fe.ioctl(&s.ctl, &mut call));
    c.record("NV_ESC_NUMA_INFO on nvidiactl", got, want);
    Ok(c.finish(json!({})))
}

fn run_use_handle(cli: &Cli, handle: u32, expect: &str) -> Result<ExitCode, Error> {
    let want = expectation(expect)?;
    let mut s = Session::open(&cli.driver_version, &cli.dev_dir)?;
    s.alloc_root()?;
    let mut c = Checks::new("use-handle");
    let probed = s.fe.control("NV0000_CTRL_CMD_GPU_GET_PROBED_IDS")?;
    let r = s.fe.rm_control_raw(
        &s.ctl,
        handle,
        handle,
        probed.cmd,
        vec![0; probed.size as usize],
        vec![],
    );
    c.record(
        format!("NV_ESC_RM_CONTROL GPU_GET_PROBED_IDS on client {handle:#x}"),
        status_outcome(r.map(|r| r.status)),
        want,
    );

    let class = s.fe.class("NV01_DEVICE_0")?;
    let dp = NV0080_ALLOC_PARAMETERS::new_zeroed();
    let h_new = 0xcaf0_e000;
    let r = s.fe.rm_alloc_raw(
        &s.ctl,
        handle,
        handle,
        h_new,
        class,
        Some(dp.as_bytes().to_vec()),
    );
    c.record(
        format!("NV_ESC_RM_ALLOC NV01_DEVICE_0 under client {handle:#x}"),
        status_outcome(r.map(|p| p.status)),
        want,
    );

    let mut dup = NVOS55_PARAMETERS::new_zeroed();
    dup.hClient = s.h_client;
    dup.hParent = s.h_client;
    dup.hObject = 0xcaf0_e001;
    dup.hClientSrc = handle;
    dup.hObjectSrc = handle;
    let r = s.fe.escape(&s.ctl, NV_ESC_RM_DUP_OBJECT, &mut dup);
    c.record(
        format!("NV_ESC_RM_DUP_OBJECT from client {handle:#x}"),
        status_outcome(r.map(|_| dup.status)),
        want,
    );

    let r = s.fe.rm_free_raw(&s.ctl, handle, 0, handle);
    c.record(
        format!("NV_ESC_RM_FREE of client {handle:#x}"),
        status_outcome(r),
        want,
    );
    s.teardown()?;
    Ok(c.finish(json!({"handle": format!("{handle:#x}")})))
}

fn run_park_on_uffd(cli: &Cli) -> Result<ExitCode, Error> {
    let mut s = Session::open(&cli.driver_version, &cli.dev_dir)?;
    s.alloc_root()?;
    let (_uffd, page) = parked_page().map_err(|e| Error::Check(format!("userfaultfd: {e}")))?;
    let c_ref = s.fe.control("NV0000_CTRL_CMD_GPU_GET_PROBED_IDS")?;
    let mut p = NVOS54_PARAMETERS::new_zeroed();
    p.hClient = s.h_client;
    p.hObject = s.h_client;
    p.cmd = c_ref.cmd;
    p.params = page;
    p.paramsSize = c_ref.size;
    println!("{}", json!({"parked": true, "pid": std::process::id()}));
    let _ = std::io::stdout().flush();
    let started = Instant::now();
    let mut call = Call::new(NV_ESC_RM_CONTROL_CMD, p.as_bytes().to_vec());
    let r = s.fe.ioctl(&s.ctl, &mut call);
    let took = started.elapsed();
    let got = status_outcome(r.map(|_| {
        NVOS54_PARAMETERS::read_from_bytes(&call.params)
            .expect("32 bytes")
            .status
    }));
    println!(
        "{}",
        json!({"scenario": "park-on-uffd", "ok": true, "got": got.to_string(), "ms": millis(took)})
    );
    let _ = std::io::stdout().flush();
    s.teardown()?;
    Ok(ExitCode::SUCCESS)
}

fn run_hold(cli: &Cli) -> Result<ExitCode, Error> {
    let mut s = session_with_device(cli)?;
    let (h, hd, hs) = (s.h_client, s.gpus[0].h_device, s.gpus[0].h_subdevice);
    println!(
        "{}",
        json!({
            "scenario": "hold",
            "ok": true,
            "pid": std::process::id(),
            "client": format!("{h:#x}"),
            "device": format!("{hd:#x}"),
            "subdevice": format!("{hs:#x}"),
        })
    );
    let _ = std::io::stdout().flush();
    let probed = s.fe.control("NV0000_CTRL_CMD_GPU_GET_PROBED_IDS")?;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "check" => {
                let r = s.fe.rm_control_raw(
                    &s.ctl,
                    h,
                    h,
                    probed.cmd,
                    vec![0; probed.size as usize],
                    vec![],
                );
                let got = status_outcome(r.map(|r| r.status));
                println!(
                    "{}",
                    json!({"check": got.to_string(), "ok": got == Outcome::Status(NV_OK)})
                );
            }
            "free" => {
                s.teardown()?;
                println!("{}", json!({"freed": true, "ioctls": s.fe.ioctls()}));
                return Ok(ExitCode::SUCCESS);
            }
            _ => println!("{}", json!({"error": format!("unknown command {line:?}")})),
        }
        let _ = std::io::stdout().flush();
    }
    // stdin ended: hold until killed.
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}

fn run_concurrent(cli: &Cli, threads: usize, iterations: usize) -> Result<ExitCode, Error> {
    let started = Instant::now();
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (version, dir, barrier) = (
                cli.driver_version.clone(),
                cli.dev_dir.clone(),
                Arc::clone(&barrier),
            );
            thread::spawn(move || -> (u64, Vec<String>) {
                barrier.wait();
                let mut ioctls = 0;
                let mut errors = Vec::new();
                for i in 0..iterations {
                    let r = Session::open(&version, &dir).and_then(|mut s| {
                        let r = s.init_all().and(s.teardown());
                        ioctls += s.fe.ioctls();
                        r
                    });
                    if let Err(e) = r {
                        errors.push(format!("thread {t} iteration {i}: {e}"));
                    }
                }
                (ioctls, errors)
            })
        })
        .collect();
    let mut ioctls = 0;
    let mut failures = Vec::new();
    for h in handles {
        match h.join() {
            Ok((n, errs)) => {
                ioctls += n;
                failures.extend(errs);
            }
            Err(_) => failures.push("a thread panicked".to_string()),
        }
    }
    for f in &failures {
        eprintln!("nvfe-client: concurrent: {f}");
    }
    let ok = failures.is_empty();
    println!(
        "{}",
        json!({
            "scenario": "concurrent",
            "ok": ok,
            "threads": threads,
            "iterations": iterations,
            "passed": threads * iterations - failures.len(),
            "failures": failures,
            "ioctls": ioctls,
            "elapsed_ms": millis(started.elapsed()),
        })
    );
    Ok(exit(ok))
}

fn run_probe_control(cli: &Cli, name: &str, list: &[u32], expect: &str) -> Result<ExitCode, Error> {
    let want = expectation(expect)?;
    let mut s = session_with_device(cli)?;
    let c_ref = s.fe.control(name)?;
    let h = s.h_client;
    let object = match c_ref.cmd >> 16 {
        0x0000 => h,
        0x0080 => s.gpus[0].h_device,
        0x2080 => s.gpus[0].h_subdevice,
        class => {
            return Err(Error::Check(format!(
                "{name}: class {class:#06x} objects are not allocated by this client"
            )));
        }
    };
    let mut params = vec![0; c_ref.size as usize];
    let mut inner = Vec::new();
    if !list.is_empty() {
        put_u32(
            &mut params,
            0,
            u32::try_from(list.len()).expect("a short list"),
        );
        let mut l = vec![0; 8 * list.len()];
        for (k, index) in list.iter().enumerate() {
            put_u32(&mut l, 8 * k, *index);
        }
        inner.push((8, l));
    }
    let r =
        s.fe.rm_control_raw(&s.ctl, h, object, c_ref.cmd, params, inner);
    let mut c = Checks::new("probe-control");
    c.record(
        format!("NV_ESC_RM_CONTROL {name} ({:#x})", c_ref.cmd),
        status_outcome(r.map(|r| r.status)),
        want,
    );
    s.teardown()?;
    Ok(c.finish(json!({"control": name})))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let name = scenario_name(&cli.scenario);
    let r = match &cli.scenario {
        Scenario::Init {
            expect_gpus,
            expect_name,
        } => return run_init(&cli, *expect_gpus, expect_name.as_deref()),
        Scenario::UnknownEscape { expect } => run_unknown_escape(&cli, expect),
        Scenario::OversizedParams { expect } => {
            run_wrong_size(&cli, "oversized-params", 48, expect)
        }
        Scenario::UndersizedParams { expect } => {
            run_wrong_size(&cli, "undersized-params", 16, expect)
        }
        Scenario::BadNestedPointer { expect } => run_bad_nested_pointer(&cli, expect),
        Scenario::BadEmbeddedPointer { expect } => run_bad_embedded_pointer(&cli, expect),
        Scenario::ParamsSizeTooLarge { size, expect } => {
            run_params_size_too_large(&cli, *size, expect)
        }
        Scenario::ForeignFd { fd, expect } => run_foreign_fd(&cli, *fd, expect),
        Scenario::NonNvproxyFd {
            expect,
            expect_non_ctl,
        } => run_non_nvproxy_fd(&cli, expect, expect_non_ctl),
        Scenario::CrossInstanceFd { other, expect } => run_cross_instance_fd(&cli, other, expect),
        Scenario::DoubleFree {
            expect_object,
            expect_client,
        } => run_double_free(&cli, expect_object, expect_client),
        Scenario::GpuOutsideSet(o) => run_gpu_outside_set(&cli, o),
        Scenario::NumaInfo {
            expect_gpu,
            expect_ctl,
        } => run_numa_info(&cli, expect_gpu, expect_ctl),
        Scenario::UseHandle { handle, expect } => run_use_handle(&cli, *handle, expect),
        Scenario::Hold => run_hold(&cli),
        Scenario::ParkOnUffd => run_park_on_uffd(&cli),
        Scenario::Concurrent {
            threads,
            iterations,
        } => run_concurrent(&cli, *threads, *iterations),
        Scenario::ProbeControl { name, list, expect } => {
            run_probe_control(&cli, name, list, expect)
        }
    };
    r.unwrap_or_else(|e| fail(name, &e, 0))
}

fn scenario_name(s: &Scenario) -> &'static str {
    match s {
        Scenario::Init { .. } => "init",
        Scenario::UnknownEscape { .. } => "unknown-escape",
        Scenario::OversizedParams { .. } => "oversized-params",
        Scenario::UndersizedParams { .. } => "undersized-params",
        Scenario::BadNestedPointer { .. } => "bad-nested-pointer",
        Scenario::BadEmbeddedPointer { .. } => "bad-embedded-pointer",
        Scenario::ParamsSizeTooLarge { .. } => "params-size-too-large",
        Scenario::ForeignFd { .. } => "foreign-fd",
        Scenario::NonNvproxyFd { .. } => "non-nvproxy-fd",
        Scenario::CrossInstanceFd { .. } => "cross-instance-fd",
        Scenario::DoubleFree { .. } => "double-free",
        Scenario::GpuOutsideSet(_) => "gpu-outside-set",
        Scenario::NumaInfo { .. } => "numa-info",
        Scenario::UseHandle { .. } => "use-handle",
        Scenario::Hold => "hold",
        Scenario::ParkOnUffd => "park-on-uffd",
        Scenario::Concurrent { .. } => "concurrent",
        Scenario::ProbeControl { .. } => "probe-control",
    }
}
