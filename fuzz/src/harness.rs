//! Runs one decoded input against two instances on one simulated driver and checks the
//! invariants (each a panic, so that libFuzzer reports it with the input).
//!
//! Instance A is the tenant under test: every operation of the input is its, except
//! [`Op::Cross`], which instance B (the neighbour, on the other GPU) runs naming A's handles.
//! B is set up first with a client, a device and a subdevice of its own, and A's inputs can
//! name those handles ([`H::Foreign`]).
//!
//! Invariants, after every operation:
//! - no panic anywhere in the request path (the simulator included);
//! - the client-memory rules of [`FuzzMem`]: no client byte delivered twice in one request,
//!   writes only inside reserved ranges, no access above [`crate::mem::MAX_ACCESS`]; with the
//!   retry transport a run that ends `Pending` wrote nothing, changed nothing in the driver
//!   (`SimStats`) nor in either object table, and the request completes within
//!   [`MAX_ROUNDS`] rounds; without it, `Pending` never comes back;
//! - the audit counts stay within their structural bound ([`COUNT_BOUND`]);
//! - every RM client A's object table holds exists in the driver, and no client handle is in
//!   both instances' tables;
//! - A's operations leave B alone: B's client is still in the driver and B's object count
//!   changes only through B's own (Cross) operations;
//! - the driver holds no more video memory per GPU, nor system memory, nor RM clients and
//!   objects, than the two instances' books count (what a request could take uncounted would
//!   escape a quota).
//!
//! After the input: every open of both instances is closed; then both object tables are
//! empty, no open-file slot is taken, and the simulator holds nothing (`SimStats` all zero:
//! files, clients, objects, OS events, memory, attached GPUs, UVM va_spaces, mappings).

use std::collections::HashSet;
use std::sync::Arc;

use ioctl_proxy::{
    AuditCounts, Caller, FrontendNode, InstancePolicy, Mode, OpenId, Proxy, ProxyError, Quotas,
};
use nvproxy_abi::ParamSize;
use nvproxy_abi::ioctl::{IOC_READ, IOC_WRITE, NV_IOCTL_MAGIC, ioc, ioc_nr, ioc_size, ioc_type};
use nvproxy_abi::{Caps, DriverAbi};
use nvsim::{SimConfig, SimDriver, SimStats};
use uvm::UvmProxy;

use crate::input::*;
use crate::mem::{ERRNO_FD, FuzzFds, FuzzMem};

/// The driver versions an input can select (`Config::version` mod count).
pub const VERSIONS: &[&str] = &[
    "535.261.03",
    "550.163.01",
    "570.211.01",
    "580.142",
    "595.45.04",
];

/// Which request path the input drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The frontend (`Proxy::ioctl`); UVM operations are skipped.
    Proxy,
    /// `/dev/nvidia-uvm` (`UvmProxy::ioctl`), with the frontend operations for its RM setup.
    Uvm,
}

/// Retry rounds one request may take (each level of pointers costs one).
pub const MAX_ROUNDS: usize = 16;
/// The most rows `AuditCounts` can have: per kind (4) and decision (4), `MAX_NAMES` named rows
/// and one fold-over row.
pub const COUNT_BOUND: usize = 4 * 4 * (AuditCounts::MAX_NAMES + 1);
/// Handles remembered per instance (the oldest stay).
const POOL_MAX: usize = 64;

const TOP: u64 = 0x1000_0000;
const NEST_BASE: u64 = 0x2000_0000;
const NEST_STRIDE: u64 = 0x20_0000;
const UNMAPPED: u64 = 0x7f00_dead_0000;
const KERNEL: u64 = 0xffff_8880_0000_0000;
/// Length of a nested buffer whose blob says 0 and whose size no table gives.
const NESTED_DEFAULT: usize = 64;
/// fd numbers of the opens: `FD_BASE + index`.
const FD_BASE: i32 = 100;

const CALLER: Caller = Caller {
    pid: 4242,
    tid: 4243,
    since: None,
};

/// RM classes the curated selector picks from (those the simulator models, then neighbours).
pub const CLASSES: &[u32] = &[
    0x41, 0x80, 0x2080, 0x3e, 0x40, 0x90f1, 0x50a0, 0x79, 0x5, 0x0, 0x1, 0x78, 0x7e, 0xc661,
    0xcb33, 0x83de, 0xc86f, 0xc8b5, 0xc6c0, 0x9067, 0x90e6, 0x00f1, 0x00db, 0x0073, 0x2081,
];

/// RM controls the curated selector picks from: those the simulator answers, those the proxy
/// rewrites for GPU-set isolation, the pass-through families.
pub const CONTROLS: &[u32] = &[
    0x0000_0101,
    0x0000_0136,
    0x0000_013e,
    0x0000_0201,
    0x0000_0202,
    0x0000_0204,
    0x0000_0205,
    0x0000_0214,
    0x0000_0215,
    0x0000_0216,
    0x0000_021b,
    0x0000_0275,
    0x0000_0d04,
    0x0000_0a04,
    0x0000_0127,
    0x0000_012b,
    0x0000_013a,
    0x0000_0b06,
    0x0000_0211,
    0x0000_0219,
    0x0080_0201,
    0x0080_0280,
    0x0080_0292,
    0x2080_0102,
    0x2080_0110,
    0x2080_0111,
    0x2080_0119,
    0x2080_014a,
    0x2080_1201,
    0x2080_1228,
    0x2080_1301,
    0x2080_1303,
    0x2080_1701,
    0x2080_1801,
    0x2080_0145,
    0x2080_0146,
    0x2080_220c,
    0x2080_2210,
    0x2080_3002,
    0x2080_018d,
    0x2080_018e,
    0x2080_0123,
    0x2080_1802,
    0x2080_8159,
    0x2080_a081,
    0x2081_0101,
    0x0000_8001,
];

/// What a run reached (the corpus test checks that the seeds reach deep).
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Operations run.
    pub ops: usize,
    /// ioctls issued (frontend and UVM, every retry round counted once).
    pub ioctls: usize,
    /// RM_ALLOCs answered `NV_OK`.
    pub allocs_ok: usize,
    /// RM_CONTROLs answered `NV_OK`.
    pub controls_ok: usize,
    /// Other frontend ioctls that returned 0 (statuses not looked at).
    pub escapes_ok: usize,
    /// UVM ioctls that returned 0 with `rmStatus` `NV_OK`.
    pub uvm_ok: usize,
    /// The most retry rounds one request took.
    pub max_rounds: usize,
    /// Distinct handles instance A got.
    pub handles: usize,
}

#[derive(Debug, Clone, Copy)]
struct OpenRec {
    id: OpenId,
    fd: i32,
    uvm: bool,
    live: bool,
}

struct Tenant {
    proxy: Arc<Proxy>,
    uvm: UvmProxy,
    opens: Vec<OpenRec>,
    fds: FuzzFds,
    /// Handles the driver gave this instance (and the ones it named itself), in order.
    pool: Vec<u32>,
    /// Of those, RM clients.
    clients: Vec<u32>,
    retry: bool,
}

fn rd32(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .map_or(0, |s| u32::from_ne_bytes(s.try_into().unwrap()))
}

fn put(buf: &mut [u8], off: usize, v: &[u8]) {
    if let Some(dst) = off
        .checked_add(v.len())
        .and_then(|end| buf.get_mut(off..end))
    {
        dst.copy_from_slice(v);
    }
}

/// What values selectors resolve against.
struct Names<'a> {
    pool: &'a [u32],
    foreign: &'a [u32],
    fds: Vec<i32>,
    ours: &'a [[u8; 16]],
    host: Vec<[u8; 16]>,
}

impl Names<'_> {
    fn handle(&self, h: H) -> u32 {
        let pick = |v: &[u32], i: u8| {
            if v.is_empty() {
                0
            } else {
                v[i as usize % v.len()]
            }
        };
        match h {
            H::Pool(i) => pick(self.pool, i),
            H::Zero => 0,
            H::Raw(v) => v,
            H::Foreign(i) => pick(self.foreign, i),
            H::Next(i) => pick(self.pool, i).wrapping_add(1),
        }
    }
    fn fd(&self, f: Fd) -> i32 {
        match f {
            Fd::Open(i) if self.fds.is_empty() => FD_BASE + i32::from(i),
            Fd::Open(i) => self.fds[i as usize % self.fds.len()],
            Fd::Minus1 => -1,
            Fd::Raw(v) => v,
            Fd::Errno => ERRNO_FD,
            Fd::Stdin => 0,
        }
    }
    fn uuid(&self, u: Uuid) -> [u8; 16] {
        match u {
            Uuid::Ours(i) if !self.ours.is_empty() => self.ours[i as usize % self.ours.len()],
            Uuid::Host(i) if !self.host.is_empty() => self.host[i as usize % self.host.len()],
            Uuid::Raw(b) => b,
            _ => [0; 16],
        }
    }
}

/// Lays out one request's client memory.
struct Layout {
    mem: FuzzMem,
    slots: u64,
}

impl Layout {
    fn new(retry: bool) -> Self {
        Self {
            mem: FuzzMem::new(retry),
            slots: 0,
        }
    }

    /// Builds `blob` (`default_len` when its length is 0), maps it at `addr`; returns its length.
    fn place(&mut self, n: &Names, blob: &Blob, default_len: usize, addr: u64) -> usize {
        let len = if blob.len == 0 {
            default_len
        } else {
            blob.len as usize
        };
        let mut buf = vec![0u8; len];
        let k = blob.bytes.len().min(len);
        buf[..k].copy_from_slice(&blob.bytes[..k]);
        for p in &blob.patches {
            match p {
                Patch::U32(o, v) => put(&mut buf, *o as usize, &v.to_ne_bytes()),
                Patch::U64(o, v) => put(&mut buf, *o as usize, &v.to_ne_bytes()),
                Patch::Handle(o, h) => put(&mut buf, *o as usize, &n.handle(*h).to_ne_bytes()),
                Patch::Fd(o, f) => put(&mut buf, *o as usize, &n.fd(*f).to_ne_bytes()),
                Patch::Uuid(o, u) => put(&mut buf, *o as usize, &n.uuid(*u)),
                Patch::Ptr(o, ptr) => {
                    let v = self.ptr(n, ptr, NESTED_DEFAULT);
                    put(&mut buf, *o as usize, &v.to_ne_bytes())
                }
            }
        }
        self.mem.map(addr, buf);
        len
    }

    /// The value of a pointer field; a buffer it names gets a slot of its own.
    fn ptr(&mut self, n: &Names, ptr: &Ptr, default_len: usize) -> u64 {
        match ptr {
            Ptr::Null => 0,
            Ptr::Buf(b) | Ptr::BufEnd(b) => {
                let addr = NEST_BASE + self.slots * NEST_STRIDE;
                self.slots += 1;
                let len = self.place(n, b, default_len, addr);
                if matches!(ptr, Ptr::BufEnd(_)) {
                    addr + len.saturating_sub(4) as u64
                } else {
                    addr
                }
            }
            Ptr::Unmapped => UNMAPPED,
            Ptr::Raw(v) => *v,
            Ptr::Kernel => KERNEL,
        }
    }

    /// The length a pointer's buffer got (for `paramsSize`): `table` when it names none.
    fn ptr_len(ptr: &Ptr, table: usize) -> usize {
        match ptr {
            Ptr::Buf(b) | Ptr::BufEnd(b) if b.len != 0 => b.len as usize,
            Ptr::Null => 0,
            _ => table,
        }
    }
}

/// Runs the input's operations; see the module docs for what is checked.
pub fn run(target: Target, data: &[u8]) -> Report {
    let input = Input::decode(data);
    run_input(target, &input)
}

/// [`run`] on a decoded input.
pub fn run_input(target: Target, input: &Input) -> Report {
    let cfg = input.config;
    let version = VERSIONS[cfg.version as usize % VERSIONS.len()];
    let sim = SimDriver::new(SimConfig::default_gpus(2).with_version(version.parse().unwrap()));
    let (a_gpus, b_gpus) = cfg.gpus();
    let caps = if cfg.all_caps() {
        Caps::ALL_CONTAINER
    } else {
        Caps::COMPUTE_UTILITY
    };
    let mut pa = InstancePolicy::new("a", caps, a_gpus);
    if cfg.audit() {
        pa.mode = Mode::Audit;
    }
    if cfg.small_quotas() {
        pa.quotas = Quotas {
            open_files: 6,
            objects: 10,
            in_flight: 256,
            os_descriptor_bytes: 8 << 20,
            gpu_memory: Some(64 << 20),
            system_memory: Some(64 << 20),
        };
    }
    pa.uvm_mmap = !cfg.uvm_mmap_off();
    let pb = InstancePolicy::new("b", Caps::COMPUTE_UTILITY, b_gpus);
    let mut a = Tenant::new(&sim, pa, cfg.retry());
    let mut b = Tenant::new(&sim, pb, false);
    let mut w = World {
        target,
        sim: sim.clone(),
        abi: a.proxy.abi().clone(),
        host_uuids: sim.config().gpus.iter().map(|g| g.uuid).collect(),
        report: Report::default(),
    };
    let b_client = w.setup_neighbour(&mut b);
    let mut b_objects = b.proxy.object_count();
    // B's client can go only through B's own (Cross) operations (a raw handle may name it).
    let mut b_alive = true;

    for op in &input.ops {
        w.report.ops += 1;
        if trace() {
            eprintln!("{op:?}");
        }
        match op {
            Op::Cross(inner) => {
                w.op(&mut b, &a.pool.clone(), inner, true);
                b_objects = b.proxy.object_count();
                b_alive = b.proxy.has_client(b_client);
            }
            op => {
                let foreign = b.pool.clone();
                w.op(&mut a, &foreign, op, false);
            }
        }
        w.check_live(&a, &b, b_alive.then_some(b_client), b_objects);
    }

    // The neighbour was not touched by A: its subdevice still answers.
    if b_alive {
        assert!(
            b.proxy.has_client(b_client) && sim.client_handles().contains(&b_client),
            "instance B lost its client {b_client:#x}"
        );
    }
    for &h in &a.clients {
        if a.proxy.has_client(h) {
            assert!(!b.proxy.has_client(h), "client {h:#x} in both instances");
        }
    }

    w.report.handles = a.pool.len();
    // Successful UVM calls: the proxy counts a call `allowed` only when it returned 0 with
    // `NV_OK` (or an `NV_WARN_*`).
    w.report.uvm_ok = a
        .proxy
        .counts()
        .snapshot()
        .iter()
        .filter(|r| {
            r.kind == ioctl_proxy::Kind::Uvm && r.decision == ioctl_proxy::Decision::Allowed
        })
        .map(|r| r.count as usize)
        .sum();
    a.close_all();
    b.close_all();
    for (name, t) in [("A", &a), ("B", &b)] {
        assert_eq!(
            t.proxy.object_count(),
            0,
            "instance {name}: objects left after every open was closed"
        );
        assert_eq!(
            t.proxy.open_files(),
            0,
            "instance {name}: open-file slots left"
        );
        assert_eq!(t.uvm.open_count(), 0);
        assert!(
            t.proxy.gpu_memory_used().iter().all(|&(_, u)| u == 0),
            "instance {name}: video memory counted after every open was closed"
        );
        assert_eq!(
            t.proxy.system_memory_used(),
            0,
            "instance {name}: system memory counted after every open was closed"
        );
    }
    let st = sim.stats();
    assert_eq!(
        st,
        SimStats::default(),
        "the driver holds something after every open was closed: {st}"
    );
    w.report
}

struct World {
    target: Target,
    sim: Arc<SimDriver>,
    abi: DriverAbi,
    host_uuids: Vec<[u8; 16]>,
    report: Report,
}

impl Tenant {
    fn new(sim: &Arc<SimDriver>, policy: InstancePolicy, retry: bool) -> Self {
        let proxy = Arc::new(Proxy::for_host(policy, sim.clone()).expect("proxy on the simulator"));
        let uvm = UvmProxy::new(proxy.clone()).expect("UVM proxy on the simulator");
        Self {
            proxy,
            uvm,
            opens: Vec::new(),
            fds: FuzzFds::default(),
            pool: Vec::new(),
            clients: Vec::new(),
            retry,
        }
    }

    fn add_open(&mut self, id: OpenId, uvm: bool) {
        let fd = FD_BASE + self.opens.len() as i32;
        self.opens.push(OpenRec {
            id,
            fd,
            uvm,
            live: true,
        });
        self.fds.0.insert(fd, id);
    }

    fn close(&mut self, i: u8) {
        if self.opens.is_empty() {
            return;
        }
        let n = self.opens.len();
        let o = &mut self.opens[i as usize % n];
        if !o.live {
            return;
        }
        o.live = false;
        self.fds.0.remove(&o.fd);
        if o.uvm {
            self.uvm.release(o.id);
        } else {
            self.proxy.release(o.id);
        }
    }

    fn close_all(&mut self) {
        for i in 0..self.opens.len() {
            self.close(i as u8);
            // Indices past 255 wrap; close those directly.
            if self.opens[i].live {
                let o = &mut self.opens[i];
                o.live = false;
                self.fds.0.remove(&o.fd);
                if o.uvm {
                    self.uvm.release(o.id);
                } else {
                    self.proxy.release(o.id);
                }
            }
        }
    }

    /// The i-th (mod count) frontend or UVM open made so far.
    fn pick(&self, i: u8, uvm: bool) -> Option<OpenId> {
        let v: Vec<OpenId> = self
            .opens
            .iter()
            .filter(|o| o.uvm == uvm)
            .map(|o| o.id)
            .collect();
        (!v.is_empty()).then(|| v[i as usize % v.len()])
    }

    fn first_live(&self, uvm: bool) -> Option<OpenId> {
        self.opens
            .iter()
            .find(|o| o.live && o.uvm == uvm)
            .map(|o| o.id)
    }

    fn learn(&mut self, h: u32, client: bool) {
        if h == 0 || self.pool.len() >= POOL_MAX {
            return;
        }
        if !self.pool.contains(&h) {
            self.pool.push(h);
        }
        if client && !self.clients.contains(&h) {
            self.clients.push(h);
        }
    }
}

impl World {
    fn names<'a>(&self, t: &'a Tenant, foreign: &'a [u32]) -> Names<'a> {
        Names {
            pool: &t.pool,
            foreign,
            fds: t.opens.iter().map(|o| o.fd).collect(),
            ours: t.uvm.gpu_uuids(),
            host: self.host_uuids.clone(),
        }
    }

    /// Issues one request through `f`, with retry rounds, checking the transport invariants.
    fn request(
        &mut self,
        t: &Tenant,
        mem: &mut FuzzMem,
        mut f: impl FnMut(&mut FuzzMem) -> Result<i32, ProxyError>,
    ) -> Result<i32, ProxyError> {
        self.report.ioctls += 1;
        loop {
            let before = t.retry.then(|| (self.sim.stats(), t.proxy.object_count()));
            mem.begin_run();
            match f(mem) {
                Err(ProxyError::Pending) => {
                    let Some((stats, objects)) = before else {
                        panic!("Pending without the retry transport");
                    };
                    assert_eq!(
                        mem.run_writes, 0,
                        "a run that ended Pending wrote client memory"
                    );
                    assert_eq!(
                        (self.sim.stats(), t.proxy.object_count()),
                        (stats, objects),
                        "a run that ended Pending changed the driver or the object table"
                    );
                    mem.fetch();
                    assert!(
                        mem.rounds <= MAX_ROUNDS,
                        "request still Pending after {MAX_ROUNDS} rounds"
                    );
                    self.report.max_rounds = self.report.max_rounds.max(mem.rounds);
                }
                r => return r,
            }
        }
    }

    /// A frontend ioctl with `lay`'s memory (top-level struct at `TOP`, `top_len` bytes);
    /// learns handles from the answer.
    fn frontend(
        &mut self,
        t: &mut Tenant,
        open: OpenId,
        cmd: u32,
        mut lay: Layout,
        top_len: usize,
    ) -> Option<Vec<u8>> {
        let proxy = t.proxy.clone();
        let fds = std::mem::take(&mut t.fds);
        let r = self.request(t, &mut lay.mem, |m| {
            proxy.ioctl(open, &CALLER, cmd, TOP, m, &fds)
        });
        t.fds = fds;
        let out = lay.mem.get(TOP, top_len).map(<[u8]>::to_vec);
        if trace() {
            eprintln!(
                "  {} frontend {cmd:#010x} -> {r:?} {:02x?}",
                t.proxy.policy().name,
                out.as_deref().unwrap_or(&[])
            );
        }
        if !matches!(r, Ok(0)) {
            return None;
        }
        let out = out?;
        if ioc_type(cmd) == NV_IOCTL_MAGIC {
            self.harvest(t, cmd, &out);
        }
        Some(out)
    }

    /// Learns the handles an answer carries and counts what succeeded.
    fn harvest(&mut self, t: &mut Tenant, cmd: u32, out: &[u8]) {
        let size = ioc_size(cmd) as usize;
        match (ioc_nr(cmd), size) {
            (0x2b, 32 | 48) => {
                let status = rd32(out, if size == 48 { 40 } else { 28 });
                if status == 0 {
                    self.report.allocs_ok += 1;
                    let class = rd32(out, 12);
                    t.learn(rd32(out, 8), matches!(class, 0x0 | 0x1 | 0x41));
                }
            }
            (0x2a, 32) => {
                if rd32(out, 28) == 0 {
                    self.report.controls_ok += 1;
                }
            }
            (0x34, 28) if rd32(out, 24) == 0 => t.learn(rd32(out, 8), false),
            (0x27, 48) if rd32(out, 40) == 0 => t.learn(rd32(out, 8), false),
            (0x4a, 184) if rd32(out, 20) == 0 => t.learn(rd32(out, 44), false),
            _ => self.report.escapes_ok += 1,
        }
    }

    /// B's own state: a control open, a client, a device and a subdevice on its GPU.
    fn setup_neighbour(&mut self, b: &mut Tenant) -> u32 {
        let ctl = b.proxy.open(FrontendNode::Ctl).expect("B's control open");
        b.add_open(ctl, false);
        // The driver grants a device only while the process holds its GPU node open.
        let gpu = b.proxy.open(FrontendNode::Gpu(0)).expect("B's GPU open");
        b.add_open(gpu, false);
        // Its own pool stands in for "the other instance's" (cross = true) here.
        let run = |w: &mut World, b: &mut Tenant, op: Op| {
            let own = b.pool.clone();
            w.op(b, &own, &op, true)
        };
        run(
            self,
            b,
            Op::Alloc {
                open: 0,
                nvos21: false,
                root: H::Zero,
                parent: H::Zero,
                new: H::Zero,
                class: NumSel::Raw(0x41),
                params: Ptr::Null,
                size: SizeField::Auto,
            },
        );
        let client = *b.clients.first().expect("B's client");
        // nvsim numbers device instances in configuration order (minor == index here).
        let minor = b.proxy.gpus()[0].minor;
        let dev_inst = self
            .sim
            .config()
            .gpus
            .iter()
            .position(|g| g.minor == minor)
            .expect("B's GPU") as u32;
        run(
            self,
            b,
            Op::Alloc {
                open: 0,
                nvos21: false,
                root: H::Pool(0),
                parent: H::Pool(0),
                new: H::Zero,
                class: NumSel::Raw(0x80),
                params: Ptr::Buf(Blob::table(vec![Patch::U32(0, dev_inst)])),
                size: SizeField::Auto,
            },
        );
        run(
            self,
            b,
            Op::Alloc {
                open: 0,
                nvos21: false,
                root: H::Pool(0),
                parent: H::Pool(1),
                new: H::Zero,
                class: NumSel::Raw(0x2080),
                params: Ptr::Buf(Blob::table(vec![])),
                size: SizeField::Auto,
            },
        );
        assert_eq!(b.pool.len(), 3, "B's client, device and subdevice");
        self.report = Report::default();
        client
    }

    fn check_live(&self, a: &Tenant, b: &Tenant, b_client: Option<u32>, b_objects: usize) {
        let n = a.proxy.counts().len();
        assert!(n <= COUNT_BOUND, "{n} audit count rows");
        if let Some(q) = a.proxy.policy().quotas.gpu_memory {
            for (gpu, used) in a.proxy.gpu_memory_used() {
                assert!(
                    used <= q,
                    "A holds {used} bytes on GPU {gpu}, past its quota {q}"
                );
            }
        }
        if let Some(q) = a.proxy.policy().quotas.system_memory {
            let used = a.proxy.system_memory_used();
            assert!(
                used <= q,
                "A holds {used} bytes of system memory, past its quota {q}"
            );
        }
        // The driver never holds more memory than the two instances count: memory that a
        // request can take without being counted would escape a quota.
        for g in 0..self.sim.config().gpus.len() {
            let minor = u32::try_from(g).expect("few GPUs");
            let counted = |t: &Tenant| {
                t.proxy
                    .gpu_memory_used()
                    .into_iter()
                    .find(|&(m, _)| m == minor)
                    .map_or(0, |(_, used)| used)
            };
            let held = self.sim.allocated_video_memory(g);
            let (ca, cb) = (counted(a), counted(b));
            assert!(
                held <= ca + cb,
                "the driver holds {held} bytes of video memory on GPU {g}, the instances count {ca} + {cb}"
            );
        }
        let held = self.sim.allocated_host_memory();
        let (ca, cb) = (a.proxy.system_memory_used(), b.proxy.system_memory_used());
        assert!(
            held <= ca + cb,
            "the driver holds {held} bytes of system memory, the instances count {ca} + {cb}"
        );
        // Nor more RM clients and objects: what the books miss escapes the object quota.
        let st = self.sim.stats();
        let (na, nb) = (a.proxy.object_count(), b.proxy.object_count());
        assert!(
            st.live_clients + st.live_objects <= na + nb,
            "the driver holds {} clients and {} objects, the instances count {na} + {nb}",
            st.live_clients,
            st.live_objects
        );
        let driver_clients: HashSet<u32> = self.sim.client_handles().into_iter().collect();
        for &h in &a.clients {
            if a.proxy.has_client(h) {
                assert!(
                    driver_clients.contains(&h),
                    "A's object table holds client {h:#x}, which the driver does not have"
                );
                assert!(!b.proxy.has_client(h), "client {h:#x} in both instances");
            }
        }
        if let Some(c) = b_client {
            assert!(
                driver_clients.contains(&c) && b.proxy.has_client(c),
                "an operation of A freed B's client {c:#x}"
            );
        }
        assert_eq!(
            b.proxy.object_count(),
            b_objects,
            "an operation of A changed B's object table"
        );
    }

    fn class(&self, s: NumSel) -> u32 {
        match s {
            NumSel::Curated(i) => CLASSES[i as usize % CLASSES.len()],
            NumSel::Table(i) => nth_key(&self.abi.classes, i as usize).unwrap_or(0x41),
            NumSel::Raw(v) => v,
        }
    }

    fn control(&self, s: NumSel) -> u32 {
        match s {
            NumSel::Curated(i) => CONTROLS[i as usize % CONTROLS.len()],
            NumSel::Table(i) => nth_key(&self.abi.controls, i as usize).unwrap_or(0x214),
            NumSel::Raw(v) => v,
        }
    }

    fn uvm_cmd(&self, s: NumSel) -> u32 {
        match s {
            NumSel::Curated(i) => nth_key(&self.abi.uvm, i as usize).unwrap_or(0x30000001),
            NumSel::Table(i) => nth_key(&self.abi.uvm, i as usize).unwrap_or(0x30000001),
            NumSel::Raw(v) => v,
        }
    }

    /// Runs one operation as tenant `t`; `foreign` is what `H::Foreign` names.
    fn op(&mut self, t: &mut Tenant, foreign: &[u32], op: &Op, cross: bool) {
        // Across instances the "pool" is the other instance's: B names A's handles.
        let pool_override: Option<Vec<u32>> = cross.then(|| foreign.to_vec());
        match op {
            Op::Open(sel) => {
                let node = match sel % 4 {
                    0 => FrontendNode::Ctl,
                    1 => FrontendNode::Gpu(0),
                    2 => FrontendNode::Gpu(1),
                    _ => FrontendNode::Gpu(u32::from(sel >> 2)),
                };
                if let Ok(id) = t.proxy.open(node) {
                    t.add_open(id, false);
                }
            }
            Op::Close(i) | Op::UvmClose(i) => t.close(*i),
            Op::Escape {
                open,
                nr,
                size,
                top,
            } => {
                let Some(open) = t.pick(*open, false) else {
                    return;
                };
                let nr = match *nr {
                    EscSel::Table(i) => nth_key(&self.abi.escapes, i as usize).unwrap_or(0xd2),
                    EscSel::Raw(v) => v,
                };
                let spec = self.abi.escapes.get(&nr);
                let len = match (spec.map(|s| s.size), *size) {
                    (_, SizeSel::Raw(s)) => (s & 0x3fff) as usize,
                    (Some(ParamSize::Fixed(n)), SizeSel::Table) => n as usize,
                    (Some(ParamSize::Fixed(n)), SizeSel::Alt(k)) => n as usize + k as usize,
                    (Some(ParamSize::OneOf(ns)), SizeSel::Table) => ns[0] as usize,
                    (Some(ParamSize::OneOf(ns)), SizeSel::Alt(k)) => {
                        ns[k as usize % ns.len()] as usize
                    }
                    (Some(ParamSize::Array { elem }), SizeSel::Table) => elem as usize,
                    (Some(ParamSize::Array { elem }), SizeSel::Alt(k)) => {
                        elem as usize * (k as usize + 1)
                    }
                    (None, _) => 64,
                };
                let cmd = ioc(IOC_READ | IOC_WRITE, NV_IOCTL_MAGIC, nr, len.min(0x3fff));
                self.generic(t, foreign, pool_override.as_deref(), open, cmd, top, len);
            }
            Op::Raw { open, cmd, top } => {
                let Some(open) = t.pick(*open, false) else {
                    return;
                };
                let len = (ioc_size(*cmd) as usize).max(8);
                self.generic(t, foreign, pool_override.as_deref(), open, *cmd, top, len);
            }
            Op::Alloc {
                open,
                nvos21,
                root,
                parent,
                new,
                class,
                params,
                size,
            } => {
                let Some(open) = t.pick(*open, false) else {
                    return;
                };
                let class = self.class(*class);
                let table = self
                    .abi
                    .classes
                    .get(&class)
                    .map_or(NESTED_DEFAULT, |c| c.param_size as usize);
                let mut lay = Layout::new(t.retry);
                let top_len = if *nvos21 { 32 } else { 48 };
                let mut top = vec![0u8; top_len];
                {
                    let mut names = self.names(t, foreign);
                    if let Some(p) = &pool_override {
                        names.pool = p;
                    }
                    put(&mut top, 0, &names.handle(*root).to_ne_bytes());
                    put(&mut top, 4, &names.handle(*parent).to_ne_bytes());
                    put(&mut top, 8, &names.handle(*new).to_ne_bytes());
                    put(&mut top, 12, &class.to_ne_bytes());
                    let p = lay.ptr(&names, params, table);
                    put(&mut top, 16, &p.to_ne_bytes());
                    let psize = match size {
                        SizeField::Auto => Layout::ptr_len(params, table) as u32,
                        SizeField::Raw(v) => *v,
                    };
                    if *nvos21 {
                        put(&mut top, 24, &psize.to_ne_bytes());
                    } else {
                        put(&mut top, 32, &psize.to_ne_bytes());
                    }
                }
                lay.mem.map(TOP, top);
                self.frontend(
                    t,
                    open,
                    nvproxy_abi::ioctl::nv_iowr(0x2b, top_len),
                    lay,
                    top_len,
                );
            }
            Op::Control {
                open,
                client,
                object,
                cmd,
                flags,
                params,
                size,
            } => {
                let Some(open) = t.pick(*open, false) else {
                    return;
                };
                let cmd = self.control(*cmd);
                let table = self
                    .abi
                    .controls
                    .get(&cmd)
                    .map_or(NESTED_DEFAULT, |c| c.param_size as usize);
                let mut lay = Layout::new(t.retry);
                let mut top = vec![0u8; 32];
                {
                    let mut names = self.names(t, foreign);
                    if let Some(p) = &pool_override {
                        names.pool = p;
                    }
                    put(&mut top, 0, &names.handle(*client).to_ne_bytes());
                    put(&mut top, 4, &names.handle(*object).to_ne_bytes());
                    put(&mut top, 8, &cmd.to_ne_bytes());
                    put(&mut top, 12, &flags.to_ne_bytes());
                    let p = lay.ptr(&names, params, table);
                    put(&mut top, 16, &p.to_ne_bytes());
                    let psize = match size {
                        SizeField::Auto => Layout::ptr_len(params, table) as u32,
                        SizeField::Raw(v) => *v,
                    };
                    put(&mut top, 24, &psize.to_ne_bytes());
                }
                lay.mem.map(TOP, top);
                self.frontend(t, open, nvproxy_abi::ioctl::nv_iowr(0x2a, 32), lay, 32);
            }
            Op::Free {
                open,
                root,
                parent,
                object,
            } => {
                let Some(open) = t.pick(*open, false) else {
                    return;
                };
                let mut lay = Layout::new(t.retry);
                let mut top = vec![0u8; 16];
                {
                    let mut names = self.names(t, foreign);
                    if let Some(p) = &pool_override {
                        names.pool = p;
                    }
                    put(&mut top, 0, &names.handle(*root).to_ne_bytes());
                    put(&mut top, 4, &names.handle(*parent).to_ne_bytes());
                    put(&mut top, 8, &names.handle(*object).to_ne_bytes());
                }
                lay.mem.map(TOP, top);
                self.frontend(t, open, nvproxy_abi::ioctl::nv_iowr(0x29, 16), lay, 16);
            }
            Op::Dup {
                open,
                client,
                parent,
                new,
                src_client,
                src_object,
                flags,
            } => {
                let Some(open) = t.pick(*open, false) else {
                    return;
                };
                let mut lay = Layout::new(t.retry);
                let mut top = vec![0u8; 28];
                {
                    let mut names = self.names(t, foreign);
                    if let Some(p) = &pool_override {
                        names.pool = p;
                    }
                    for (i, h) in [client, parent, new, src_client, src_object]
                        .into_iter()
                        .enumerate()
                    {
                        put(&mut top, 4 * i, &names.handle(*h).to_ne_bytes());
                    }
                    put(&mut top, 20, &flags.to_ne_bytes());
                }
                lay.mem.map(TOP, top);
                self.frontend(t, open, nvproxy_abi::ioctl::nv_iowr(0x34, 28), lay, 28);
            }
            Op::Cross(inner) => self.op(t, foreign, inner, cross),
            Op::Burst { kind, n, base } => self.burst(t, *kind, *n, *base),
            Op::Mmap(i) => {
                if let Some(open) = t.pick(*i, false) {
                    let _ = t.proxy.mapping_fd(open);
                }
            }
            Op::RegisterFd { open, fd } => {
                let Some(open) = t.pick(*open, false) else {
                    return;
                };
                let names = self.names(t, foreign);
                let top = Blob::sized(4, vec![Patch::Fd(0, *fd)]);
                drop(names);
                self.generic(
                    t,
                    foreign,
                    None,
                    open,
                    nvproxy_abi::ioctl::nv_iowr(0xc9, 4),
                    &top,
                    4,
                );
            }
            Op::UvmOpen | Op::Uvm { .. } | Op::UvmMmap(_) if self.target != Target::Uvm => {}
            Op::UvmOpen => {
                if let Ok(id) = t.uvm.open() {
                    t.add_open(id, true);
                }
            }
            Op::UvmMmap(i) => {
                if let Some(open) = t.pick(*i, true) {
                    let _ = t.uvm.mmap_fd(&CALLER, open);
                }
            }
            Op::Uvm { open, cmd, top } => {
                let Some(open) = t.pick(*open, true) else {
                    return;
                };
                let cmd = self.uvm_cmd(*cmd);
                let len = self
                    .abi
                    .uvm
                    .get(&cmd)
                    .map_or(NESTED_DEFAULT, |s| s.param_size as usize);
                self.uvm_ioctl(t, foreign, open, cmd, top, len);
            }
        }
    }

    /// A frontend ioctl whose whole top-level struct comes from `top`.
    #[allow(clippy::too_many_arguments)]
    fn generic(
        &mut self,
        t: &mut Tenant,
        foreign: &[u32],
        pool: Option<&[u32]>,
        open: OpenId,
        cmd: u32,
        top: &Blob,
        len: usize,
    ) {
        let mut lay = Layout::new(t.retry);
        let top_len = {
            let mut names = self.names(t, foreign);
            if let Some(p) = pool {
                names.pool = p;
            }
            lay.place(&names, top, len, TOP)
        };
        self.frontend(t, open, cmd, lay, top_len);
    }

    fn uvm_ioctl(
        &mut self,
        t: &mut Tenant,
        foreign: &[u32],
        open: OpenId,
        cmd: u32,
        top: &Blob,
        len: usize,
    ) {
        let mut lay = Layout::new(t.retry);
        let top_len = {
            let names = self.names(t, foreign);
            lay.place(&names, top, len, TOP)
        };
        if cmd == UVM_ALLOC_SEMAPHORE_POOL {
            let length = lay
                .mem
                .get(TOP + 8, 8)
                .map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap()));
            if length > SEMAPHORE_POOL_MAX {
                // Open finding F1 (regressions/uvm_ioctl/open/): nvsim zero-fills the pool's
                // whole range of its va_space memfd, so one call with a huge length fills
                // the machine's shmem (the fuzzer was OOM-killed with 24 GB of shmem).
                assert!(
                    !strict(),
                    "F1: UVM_ALLOC_SEMAPHORE_POOL of {length:#x} bytes: nvsim would zero-fill \
                     that much shmem (uvm.rs alloc_semaphore_pool -> zero)"
                );
                return;
            }
        }
        let fds = std::mem::take(&mut t.fds);
        let r = {
            let tt: &Tenant = t;
            self.request(tt, &mut lay.mem, |m| {
                tt.uvm.ioctl(open, &CALLER, cmd, TOP, m, &fds)
            })
        };
        t.fds = fds;
        if trace() {
            eprintln!(
                "  uvm {cmd:#x} -> {r:?} {:02x?}",
                lay.mem.get(TOP, top_len).unwrap_or(&[])
            );
        }
    }

    fn burst(&mut self, t: &mut Tenant, kind: u8, n: u8, base: u32) {
        let count = n as usize * 16;
        match kind % 4 {
            0 | 2 => {
                let Some(ctl) = t.first_live(false) else {
                    return;
                };
                let client = t.clients.first().copied().unwrap_or(0);
                for i in 0..count {
                    let num = base.wrapping_add(i as u32);
                    let mut lay = Layout::new(t.retry);
                    let (cmd, top) = if kind.is_multiple_of(4) {
                        let mut top = vec![0u8; 32];
                        put(&mut top, 0, &client.to_ne_bytes());
                        put(&mut top, 4, &client.to_ne_bytes());
                        put(&mut top, 8, &num.to_ne_bytes());
                        (nvproxy_abi::ioctl::nv_iowr(0x2a, 32), top)
                    } else {
                        let mut top = vec![0u8; 48];
                        put(&mut top, 0, &client.to_ne_bytes());
                        put(&mut top, 4, &client.to_ne_bytes());
                        put(&mut top, 12, &num.to_ne_bytes());
                        (nvproxy_abi::ioctl::nv_iowr(0x2b, 48), top)
                    };
                    let len = top.len();
                    lay.mem.map(TOP, top);
                    self.frontend(t, ctl, cmd, lay, len);
                }
            }
            1 => {
                let Some(ctl) = t.first_live(false) else {
                    return;
                };
                for i in 0..count {
                    let cmd = base.wrapping_add(i as u32);
                    let mut lay = Layout::new(t.retry);
                    lay.mem.map(TOP, vec![0u8; 64]);
                    self.frontend(t, ctl, cmd, lay, 64);
                }
            }
            _ => {
                if self.target != Target::Uvm {
                    return;
                }
                let Some(u) = t.first_live(true) else {
                    return;
                };
                for i in 0..count {
                    let cmd = base.wrapping_add(i as u32);
                    self.uvm_ioctl(t, &[], u, cmd, &Blob::sized(64, vec![]), 64);
                }
            }
        }
    }
}

/// `UVM_ALLOC_SEMAPHORE_POOL`.
const UVM_ALLOC_SEMAPHORE_POOL: u32 = 0x44;
/// Semaphore pools larger than this are not sent (open finding F1) unless strict.
pub const SEMAPHORE_POOL_MAX: u64 = 64 << 20;

thread_local! {
    static STRICT: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Sets, for this thread, whether inputs that trigger an open finding fail (`true`) or are
/// skipped (`false`, the default unless `NVPROXY_FUZZ_STRICT=1`). The open findings are listed
/// in `regressions/README.md`.
pub fn set_strict(on: bool) {
    STRICT.with(|s| s.set(Some(on)));
}

fn strict() -> bool {
    STRICT
        .with(|s| s.get())
        .unwrap_or_else(|| std::env::var_os("NVPROXY_FUZZ_STRICT").is_some())
}

/// `NVPROXY_FUZZ_TRACE=1`: print every operation and answer (to read a crash input).
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("NVPROXY_FUZZ_TRACE").is_some())
}

fn nth_key<K: Copy, V>(m: &std::collections::BTreeMap<K, V>, i: usize) -> Option<K> {
    if m.is_empty() {
        return None;
    }
    m.keys().nth(i % m.len()).copied()
}

/// Starts (once per process) a thread that aborts the process when the machine's shmem grows
/// by more than `limit_mb` over what it was at the start: the simulator backs memory with
/// memfds, whose pages libFuzzer's `-rss_limit_mb` does not see (finding F1 filled 24 GB of
/// shmem and brought in the kernel's OOM killer). The abort is libFuzzer's crash: the input
/// that was running is saved as the artifact.
pub fn start_shmem_watchdog(limit_mb: u64) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Some(base) = shmem_kb() else { return };
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(std::time::Duration::from_millis(5));
                if let Some(now) = shmem_kb()
                    && now.saturating_sub(base) > limit_mb * 1024
                {
                    eprintln!(
                        "==shmem watchdog: Shmem grew from {base} kB to {now} kB during this \
                         input; aborting"
                    );
                    std::process::abort();
                }
            }
        });
    });
}

fn shmem_kb() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Shmem:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}
