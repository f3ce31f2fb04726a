//! The request path's own work per ioctl, in process: a [`Proxy`] on the simulated driver
//! (`nvsim`) and a flat client memory that copies (no transport, no syscalls), running `N`
//! simple controls (`NV0000_CTRL_CMD_SYSTEM_GET_FABRIC_STATUS`, 4-byte params, as nv-bench's
//! `simple-control`), nested controls (`NV0080_CTRL_CMD_GPU_GET_CLASSLIST`) or RM_ALLOC+FREE
//! pairs of `NV01_DEVICE_0`. Prints ns per ioctl; made to be counted with an instruction-level
//! profiler: run it twice under `valgrind --tool=callgrind` with two counts and subtract, so
//! the start-up drops out (`tests/bench/README.md`, "Instructions per request").
//!
//! Kind `memfree` times RM_ALLOC+FREE pairs of a 4 KiB `NV01_MEMORY_SYSTEM` under a device
//! whose client already holds `--objects K` such memory objects (default 0): what one free
//! costs as a client's table grows.
//!
//! With `--switch` last, every request follows a pipe round trip with a child process, so that
//! each starts as on a server, after a switch away from the process and back (under QEMU's
//! TCG that empties the guest's TLB and the translated-jump cache); kind `none` times the
//! round trips alone.
//!
//! `cargo run --release -p ioctl-proxy --example request_cost -- [simple|nested|alloc|memfree|none] [N] [--objects K] [--switch]`

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use ioctl_proxy::{
    Caller, ClientMemory, FdError, FdResolver, FrontendNode, InstancePolicy, MemError, OpenId,
    Proxy,
};
use nvproxy_abi::ioctl::nv_iowr;
use nvsim::{SimConfig, SimDriver};

/// Client memory: one flat region at `BASE`.
struct Flat {
    bytes: Vec<u8>,
}

const BASE: u64 = 0x10_0000;
const TOP: u64 = BASE;
const PARAMS: u64 = BASE + 0x100;
const NESTED: u64 = BASE + 0x1000;

impl Flat {
    fn range(&self, addr: u64, len: usize) -> Result<std::ops::Range<usize>, MemError> {
        let off = usize::try_from(addr.checked_sub(BASE).ok_or(MemError::Fault)?)
            .map_err(|_| MemError::Fault)?;
        let end = off.checked_add(len).ok_or(MemError::Fault)?;
        if end > self.bytes.len() {
            return Err(MemError::Fault);
        }
        Ok(off..end)
    }
    fn put(&mut self, addr: u64, data: &[u8]) {
        let r = self.range(addr, data.len()).expect("in the region");
        self.bytes[r].copy_from_slice(data);
    }
    fn u32_at(&self, addr: u64) -> u32 {
        let r = self.range(addr, 4).expect("in the region");
        u32::from_ne_bytes(self.bytes[r].try_into().expect("4 bytes"))
    }
}

impl ClientMemory for Flat {
    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
        Ok(self.bytes[self.range(addr, len)?].to_vec())
    }
    fn read_into(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        buf.copy_from_slice(&self.bytes[self.range(addr, buf.len())?]);
        Ok(())
    }
    fn reserve_write(&mut self, addr: u64, len: usize) -> Result<(), MemError> {
        self.range(addr, len).map(|_| ())
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        let r = self.range(addr, data.len())?;
        self.bytes[r].copy_from_slice(data);
        Ok(())
    }
}

/// The client's fd table: fd 3 is its `/dev/nvidiactl`.
struct Fds(OpenId);

const CTL_FD: i32 = 3;

impl FdResolver for Fds {
    fn resolve(&self, fd: i32) -> Result<OpenId, FdError> {
        if fd == CTL_FD {
            Ok(self.0)
        } else {
            Err(FdError::Foreign)
        }
    }
}

const CALLER: Caller = Caller {
    pid: 4242,
    tid: 4242,
    since: None,
};

struct Tenant {
    proxy: Proxy,
    mem: Flat,
    ctl: OpenId,
}

impl Tenant {
    fn ioctl(&mut self, cmd: u32, top: &[u8]) {
        self.ioctl_on(self.ctl, cmd, top);
    }

    fn ioctl_on(&mut self, open: OpenId, cmd: u32, top: &[u8]) {
        self.mem.put(TOP, top);
        let r = self
            .proxy
            .ioctl(open, &CALLER, cmd, TOP, &mut self.mem, &Fds(self.ctl))
            .expect("ioctl");
        assert_eq!(r, 0);
    }

    /// NVOS64 alloc of `class` under `parent`; returns the new handle.
    fn alloc(&mut self, client: u32, parent: u32, class: u32, params: &[u8]) -> u32 {
        let mut p = [0u8; 48];
        p[0..4].copy_from_slice(&client.to_ne_bytes());
        p[4..8].copy_from_slice(&parent.to_ne_bytes());
        p[12..16].copy_from_slice(&class.to_ne_bytes());
        if !params.is_empty() {
            self.mem.put(PARAMS, params);
            p[16..24].copy_from_slice(&PARAMS.to_ne_bytes());
            p[32..36].copy_from_slice(&u32::try_from(params.len()).expect("small").to_ne_bytes());
        }
        self.ioctl(nv_iowr(0x2b, 48), &p);
        assert_eq!(self.mem.u32_at(TOP + 40), 0, "alloc status");
        self.mem.u32_at(TOP + 8)
    }

    fn free(&mut self, client: u32, parent: u32, object: u32) {
        let mut p = [0u8; 16];
        p[0..4].copy_from_slice(&client.to_ne_bytes());
        p[4..8].copy_from_slice(&parent.to_ne_bytes());
        p[8..12].copy_from_slice(&object.to_ne_bytes());
        self.ioctl(nv_iowr(0x29, 16), &p);
        assert_eq!(self.mem.u32_at(TOP + 12), 0, "free status");
    }

    fn control(&mut self, client: u32, object: u32, cmd: u32, params: &[u8]) {
        let mut p = [0u8; 32];
        p[0..4].copy_from_slice(&client.to_ne_bytes());
        p[4..8].copy_from_slice(&object.to_ne_bytes());
        p[8..12].copy_from_slice(&cmd.to_ne_bytes());
        self.mem.put(PARAMS, params);
        p[16..24].copy_from_slice(&PARAMS.to_ne_bytes());
        p[24..28].copy_from_slice(&u32::try_from(params.len()).expect("small").to_ne_bytes());
        self.ioctl(nv_iowr(0x2a, 32), &p);
        assert_eq!(self.mem.u32_at(TOP + 28), 0, "control status");
    }
}

/// A child process that answers every byte written to it: one round trip = two switches.
struct Switcher {
    to: Option<OwnedFd>,
    from: OwnedFd,
    child: nix::unistd::Pid,
}

impl Drop for Switcher {
    /// Closing our end ends the child's loop; then it is reaped.
    fn drop(&mut self) {
        drop(self.to.take());
        let _ = nix::sys::wait::waitpid(self.child, None);
    }
}

impl Switcher {
    fn start() -> Self {
        let (to_r, to_w) = nix::unistd::pipe().expect("pipe");
        let (from_r, from_w) = nix::unistd::pipe().expect("pipe");
        // SAFETY: the process is single-threaded here (nothing spawned yet), and the child
        // only reads and writes its pipes and exits.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => {
                // The parent's ends go: its exit then ends the child's read (EOF).
                drop((to_w, from_r));
                let mut b = [0u8; 1];
                while nix::unistd::read(to_r.as_raw_fd(), &mut b).is_ok_and(|n| n == 1) {
                    if nix::unistd::write(&from_w, &b).is_err() {
                        break;
                    }
                }
                std::process::exit(0)
            }
            nix::unistd::ForkResult::Parent { child } => Self {
                to: Some(to_w),
                from: from_r,
                child,
            },
        }
    }

    fn bounce(&self) {
        let mut b = [0u8; 1];
        let to = self.to.as_ref().expect("open until dropped");
        nix::unistd::write(to, &b).expect("write");
        let n = nix::unistd::read(self.from.as_raw_fd(), &mut b).expect("read");
        assert_eq!(n, 1, "the switcher child went away");
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let switch = args.last().is_some_and(|a| a == "--switch");
    if switch {
        args.pop();
    }
    let mut objects = 0u32;
    if let Some(i) = args.iter().position(|a| a == "--objects") {
        objects = args
            .get(i + 1)
            .and_then(|k| k.parse().ok())
            .expect("--objects K");
        args.drain(i..i + 2);
    }
    let mut args = args.into_iter();
    let kind = args.next().unwrap_or_else(|| "simple".into());
    let n: u32 = args.next().map_or(10_000, |a| a.parse().expect("N"));
    let switcher = switch.then(Switcher::start);
    let bounce = || {
        if let Some(s) = &switcher {
            s.bounce();
        }
    };
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let policy = InstancePolicy::new("bench", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0]);
    let proxy = Proxy::for_host(policy, Arc::<SimDriver>::clone(&sim)).expect("proxy");
    let ctl = proxy.open(FrontendNode::Ctl).expect("open");
    let mut t = Tenant {
        proxy,
        mem: Flat {
            bytes: vec![0; 0x2000],
        },
        ctl,
    };
    // As libcuda: the GPU node registers the control node's fd (NV_ESC_REGISTER_FD).
    let gpu = t.proxy.open(FrontendNode::Gpu(0)).expect("open GPU");
    t.ioctl_on(gpu, nv_iowr(0xc9, 4), &CTL_FD.to_ne_bytes());
    let client = t.alloc(0, 0, 0x41, &[]);
    // NV01_DEVICE_0 with deviceId 0 (one per client: the alloc kind makes its own).
    let device = if kind == "nested" || kind == "memfree" {
        t.alloc(client, client, 0x80, &[0; 56])
    } else {
        0
    };
    // NV_MEMORY_ALLOCATION_PARAMS with size 4 KiB (offset 64).
    let mut memory = [0u8; 120];
    memory[64..72].copy_from_slice(&4096u64.to_ne_bytes());
    if kind == "memfree" {
        for _ in 0..objects {
            t.alloc(client, device, 0x3e, &memory);
        }
    }
    let start = Instant::now();
    let ioctls = match kind.as_str() {
        "simple" => {
            for _ in 0..n {
                bounce();
                t.control(client, client, 0x136, &[0; 4]);
            }
            n
        }
        "nested" => {
            // NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS { numClasses = 64, classList → NESTED }.
            let mut p = [0u8; 16];
            p[0..4].copy_from_slice(&64u32.to_ne_bytes());
            p[8..16].copy_from_slice(&NESTED.to_ne_bytes());
            for _ in 0..n {
                bounce();
                t.control(client, device, 0x80_0201, &p);
            }
            n
        }
        "alloc" => {
            for _ in 0..n {
                bounce();
                let d = t.alloc(client, client, 0x80, &[0; 56]);
                bounce();
                t.free(client, client, d);
            }
            2 * n
        }
        "memfree" => {
            for _ in 0..n {
                bounce();
                let m = t.alloc(client, device, 0x3e, &memory);
                bounce();
                t.free(client, device, m);
            }
            2 * n
        }
        "none" => {
            for _ in 0..n {
                bounce();
            }
            n
        }
        other => panic!("unknown kind {other:?}: simple, nested, alloc, memfree or none"),
    };
    let ns = start.elapsed().as_nanos() / u128::from(ioctls.max(1));
    let after = if switch { " switch" } else { "" };
    println!("{kind}{after}: {ns} ns per ioctl, {ioctls} ioctls");
}
