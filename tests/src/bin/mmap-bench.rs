//! `mmap-bench`: what an mmap costs through nvproxy's shim, measured in one process that runs
//! under `nvproxy exec` (the shim preloaded). Run by `tests/bench/mmap-bench.sh` in the VM.
//!
//! Kinds, each one `mmap` + `munmap` of 4 KiB (`MAP_SHARED`, read/write, pages never touched):
//! - `plain`: a memfd, with the raw `mmap` syscall (the shim is bypassed): the floor;
//! - `file`: the same memfd through `mmap()`, so through the shim: what the shim adds to an
//!   unrelated file mapping (one `fstat`);
//! - `anon`: an anonymous mapping through the shim (it adds no syscall);
//! - `node`: our nvidiactl, whose open carries an RM mmap context (`NV01_MEMORY_SYSTEM` mapped
//!   with `NV_ESC_RM_MAP_MEMORY`), through the shim: ticket ioctl + socket + host fd + `mmap`.
//!
//! Repetitions interleave the kinds (so a slow patch of the machine hits all alike); each
//! kind's figure per repetition is the median of its batches; ratios to `plain` are taken
//! inside each repetition and reported as median and range. Output: one JSON line.
//!
//! `mmap-bench [--iters N] [--batches B] [--reps R] [--driver-version V]`

use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use serde_json::json;
use tests::mmapc::{self, Mapping, RmMemory};

#[derive(Parser)]
struct Cli {
    /// mmap+munmap pairs per batch.
    #[arg(long, default_value_t = 200)]
    iters: u32,
    /// Batches per kind and repetition.
    #[arg(long, default_value_t = 3)]
    batches: u32,
    /// Repetitions.
    #[arg(long, default_value_t = 5)]
    reps: u32,
    /// The driver version the RM session speaks.
    #[arg(long, default_value = "535.261.03")]
    driver_version: String,
}

const LEN: usize = 4096;
const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Plain,
    File,
    Anon,
    Node,
}

const KINDS: [Kind; 4] = [Kind::Plain, Kind::File, Kind::Anon, Kind::Node];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::File => "file",
            Kind::Anon => "anon",
            Kind::Node => "node",
        }
    }
}

/// One mmap + munmap of `kind`.
fn once(kind: Kind, memfd: RawFd, node: RawFd) -> Result<(), i32> {
    match kind {
        Kind::Plain => mmapc::raw_map_unmap(LEN, RW, libc::MAP_SHARED, memfd),
        Kind::File => Mapping::map(0, LEN, RW, libc::MAP_SHARED, memfd, 0).map(drop),
        Kind::Anon => {
            Mapping::map(0, LEN, RW, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0).map(drop)
        }
        Kind::Node => Mapping::map(0, LEN, RW, libc::MAP_SHARED, node, 0).map(drop),
    }
}

/// µs per pair: the median of `batches` batches of `iters`.
fn measure(kind: Kind, cli: &Cli, memfd: RawFd, node: RawFd) -> Result<f64, i32> {
    let mut per = Vec::new();
    for _ in 0..cli.batches {
        let t = Instant::now();
        for _ in 0..cli.iters {
            once(kind, memfd, node)?;
        }
        per.push(t.elapsed().as_secs_f64() * 1e6 / f64::from(cli.iters));
    }
    Ok(median(&mut per))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run(cli: &Cli) -> Result<serde_json::Value, String> {
    if !mmapc::shim_loaded() {
        return Err("the shim is not loaded: run under `nvproxy exec`".into());
    }
    let memfd = mmapc::memfd(LEN as u64).map_err(|e| format!("memfd: {e}"))?;
    let mut rm = RmMemory::new(&cli.driver_version, LEN as u64)?;
    let node = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(Path::new("/dev/nvidiactl"))
        .map_err(|e| format!("nvidiactl: {e}"))?;
    let cookie = rm.map_onto(node.as_raw_fd())?;
    // Warm-up: the shim's one-time HELLO and the first ticket.
    for k in KINDS {
        once(k, memfd.as_raw_fd(), node.as_raw_fd())
            .map_err(|e| format!("{}: errno {e}", k.name()))?;
    }
    let mut us: Vec<Vec<f64>> = vec![Vec::new(); KINDS.len()];
    for _ in 0..cli.reps {
        for (i, k) in KINDS.iter().enumerate() {
            let v = measure(*k, cli, memfd.as_raw_fd(), node.as_raw_fd())
                .map_err(|e| format!("{}: errno {e}", k.name()))?;
            us[i].push(v);
        }
    }
    rm.unmap(cookie)?;
    drop(node);
    rm.close()?;
    let mut kinds = serde_json::Map::new();
    for (i, k) in KINDS.iter().enumerate() {
        let mut ratios: Vec<f64> = us[i].iter().zip(&us[0]).map(|(a, b)| a / b).collect();
        let mut vals = us[i].clone();
        ratios.sort_by(f64::total_cmp);
        kinds.insert(
            k.name().into(),
            json!({
                "median_us": median(&mut vals),
                "ratio_to_plain": median(&mut ratios.clone()),
                "ratio_min": ratios.first(),
                "ratio_max": ratios.last(),
                "per_rep_us": us[i],
            }),
        );
    }
    Ok(
        json!({"bench": "mmap", "ok": true, "iters": cli.iters, "batches": cli.batches,
              "reps": cli.reps, "kinds": kinds}),
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{}", json!({"bench": "mmap", "ok": false, "error": e}));
            ExitCode::FAILURE
        }
    }
}
