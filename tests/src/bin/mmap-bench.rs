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
//! and, to split `node`: `hello` (one `NVPROXY_IOC_HELLO` on the node: one CUSE round trip
//! answered by the node without the request path) and `redeem` (the ticket ioctl and the socket
//! exchange by hand, the received fd closed: `node` without its `mmap`/`munmap`).
//!
//! Every batch of a kind is paired with a `plain` batch run just before it, so that a slow
//! patch of the (noisy, emulated) machine hits both; a kind's ratio in a repetition is the
//! median of its batch ratios; repetitions report the median and range of those. Output: one
//! JSON line.
//!
//! `mmap-bench [--iters N] [--batches B] [--reps R] [--driver-version V]`

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use nvproxy_preload_proto::DEFAULT_SOCKET_PATH;
use serde_json::json;
use tests::mmapc::{self, Answer, Mapping, RmMemory};

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
    /// Only the kinds that need no node (plain, file, anon): to measure the shim's cost on
    /// other mmaps natively, with `LD_PRELOAD` and any `NVPROXY_NODES` (e.g. `1:5`) set by hand.
    #[arg(long)]
    no_node: bool,
}

const LEN: usize = 4096;
const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Plain,
    File,
    Anon,
    Hello,
    Redeem,
    Node,
}

const KINDS: [Kind; 6] = [
    Kind::Plain,
    Kind::File,
    Kind::Anon,
    Kind::Hello,
    Kind::Redeem,
    Kind::Node,
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::File => "file",
            Kind::Anon => "anon",
            Kind::Hello => "hello",
            Kind::Redeem => "redeem",
            Kind::Node => "node",
        }
    }
}

/// One operation of `kind`.
fn once(kind: Kind, memfd: RawFd, node: &File) -> Result<(), i32> {
    let node_fd = node.as_raw_fd();
    match kind {
        Kind::Plain => mmapc::raw_map_unmap(LEN, RW, libc::MAP_SHARED, memfd),
        Kind::File => Mapping::map(0, LEN, RW, libc::MAP_SHARED, memfd, 0).map(drop),
        Kind::Anon => {
            Mapping::map(0, LEN, RW, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0).map(drop)
        }
        Kind::Hello => mmapc::hello(node).map(drop),
        Kind::Redeem => {
            let t = mmapc::simple_ticket(node)?;
            match mmapc::redeem(Path::new(DEFAULT_SOCKET_PATH), t) {
                Ok(Answer::Reply(r, Some(fd))) if r.errno == 0 => {
                    drop(fd);
                    Ok(())
                }
                _ => Err(libc::EPROTO),
            }
        }
        Kind::Node => Mapping::map(0, LEN, RW, libc::MAP_SHARED, node_fd, 0).map(drop),
    }
}

/// µs per operation of one batch of `iters`.
fn batch(kind: Kind, iters: u32, memfd: RawFd, node: &File) -> Result<f64, i32> {
    let t = Instant::now();
    for _ in 0..iters {
        once(kind, memfd, node)?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / f64::from(iters))
}

/// One repetition of `kind`: (median µs, median ratio to the plain batch run just before each
/// of its batches).
fn measure(kind: Kind, cli: &Cli, memfd: RawFd, node: &File) -> Result<(f64, f64), i32> {
    let (mut us, mut ratios) = (Vec::new(), Vec::new());
    for _ in 0..cli.batches {
        let floor = batch(Kind::Plain, cli.iters, memfd, node)?;
        let v = batch(kind, cli.iters, memfd, node)?;
        us.push(v);
        ratios.push(v / floor);
    }
    Ok((median(&mut us), median(&mut ratios)))
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
    let kinds: &[Kind] = if cli.no_node { &KINDS[..3] } else { &KINDS };
    let (mut rm, node, cookie) = if cli.no_node {
        let null = File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
        (None, null, 0)
    } else {
        let mut rm = RmMemory::new(&cli.driver_version, LEN as u64)?;
        let node = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(Path::new("/dev/nvidiactl"))
            .map_err(|e| format!("nvidiactl: {e}"))?;
        let cookie = rm.map_onto(node.as_raw_fd())?;
        (Some(rm), node, cookie)
    };
    // Warm-up: the shim's one-time HELLO and the first ticket.
    for &k in kinds {
        once(k, memfd.as_raw_fd(), &node).map_err(|e| format!("{}: errno {e}", k.name()))?;
    }
    let mut us: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let mut rs: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for _ in 0..cli.reps {
        for (i, k) in kinds.iter().enumerate() {
            let (v, r) = measure(*k, cli, memfd.as_raw_fd(), &node)
                .map_err(|e| format!("{}: errno {e}", k.name()))?;
            us[i].push(v);
            rs[i].push(r);
        }
    }
    if let Some(rm) = rm.as_mut() {
        rm.unmap(cookie)?;
    }
    drop(node);
    if let Some(rm) = rm.take() {
        rm.close()?;
    }
    let mut out = serde_json::Map::new();
    for (i, k) in kinds.iter().enumerate() {
        let mut ratios = rs[i].clone();
        let mut vals = us[i].clone();
        ratios.sort_by(f64::total_cmp);
        out.insert(
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
              "reps": cli.reps, "kinds": out}),
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
