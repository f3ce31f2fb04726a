//! Channels and the front end (`fifo.rs`, `gpfifo.rs`): the objects `cuCtxCreate` allocates
//! with the driver's statuses, and what a channel executes when its doorbell rings, per method
//! group: GPFIFO/USERD, host semaphores, non-stall interrupts, the copy engine, the compute
//! class (inline-to-memory, report semaphores, state methods, a launch's channel error), MMU
//! faults. The client side is built the way libcuda builds it: memory objects mapped into the
//! GPU VA space with `UVM_MAP_EXTERNAL_ALLOCATION`, GPFIFO and pushbuffers written through
//! the CPU (`SimDriver::memory_write`, what a client mapping sees), `GP_PUT` in USERD, the
//! work-submit token on the doorbell page.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use host_driver::{HostCall, HostDriver, NodeKind};
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use nvsim::status::*;
use nvsim::{SimConfig, SimDriver};
use zerocopy::{FromZeros, IntoBytes};

const TSG: u32 = 0xa06c;
const CTXSHARE: u32 = 0x9067;
const CHANNEL: u32 = 0xc86f;
const COMPUTE: u32 = 0xcbc0;
const COPY: u32 = 0xc8b5;
const USERMODE: u32 = 0xc661;
const VASPACE: u32 = 0x90f1;
const SYSMEM: u32 = 0x3e;
const GR0: u32 = 0x01;
const COPY2: u32 = 0x0b;
const MB2: u64 = 2 << 20;
/// Where the test maps its memory in the GPU VA space.
const VA: u64 = 0x0020_0000_0000;
/// Offsets in that memory: GPFIFO ring, pushbuffer, semaphores, data.
const GPFIFO: u64 = 0;
const PB: u64 = 0x1000;
const SEM: u64 = 0x8000;
const DATA: u64 = 0x10_0000;

const NV_ERR_INVALID_CLASS: u32 = 0x22;
const NV_ERR_NO_MEMORY: u32 = 0x51;
const NV_ERR_INVALID_CHANNEL: u32 = 0x21;

struct Gpu {
    d: Arc<SimDriver>,
    s: Stack,
    uvm: File,
    vas: u32,
    mem: u32,
}

fn abi(d: &SimDriver) -> nvproxy_abi::DriverAbi {
    nvproxy_abi::find(&d.driver_version()).unwrap().tables()
}

fn uvm_status(f: &File, cmd: u32, params: &[u8], at: usize) -> u32 {
    let mut call = HostCall {
        cmd,
        params: params.to_vec().into(),
        nested: Default::default(),
    };
    assert_eq!(f.ioctl(&mut call).expect("UVM ioctl"), 0);
    u32::from_ne_bytes(call.params[at..at + 4].try_into().unwrap())
}

/// A GPU stack with a VA space registered in UVM and 2 MiB of system memory mapped at [`VA`].
fn gpu() -> Gpu {
    let d = SimDriver::new(SimConfig::default_gpus(1));
    let s = stack(&d, 0);
    let uvm = open(&d, NodeKind::Uvm);
    let t = abi(&d);
    let mut p = UVM_INITIALIZE_PARAMS::new_zeroed();
    p.flags = UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE;
    assert_eq!(uvm_status(&uvm, UVM_INITIALIZE, p.as_bytes(), 8), NV_OK);
    let uuid = NvProcessorUuid {
        uuid: d.config().gpus[0].uuid,
    };
    let mut p = UVM_REGISTER_GPU_PARAMS::new_zeroed();
    p.gpu_uuid = uuid;
    p.rmCtrlFd = -1;
    assert_eq!(uvm_status(&uvm, UVM_REGISTER_GPU, p.as_bytes(), 36), NV_OK);
    let vsize = t.classes[&VASPACE].param_size as usize;
    let (st, vas) = alloc(
        &s.ctl,
        s.client,
        s.device,
        0,
        VASPACE,
        Some(&vec![0; vsize]),
    );
    assert_eq!(st, NV_OK);
    let mut p = UVM_REGISTER_GPU_VASPACE_PARAMS::new_zeroed();
    p.gpuUuid = uuid;
    p.rmCtrlFd = -1;
    p.hClient = s.client;
    p.hVaSpace = vas;
    assert_eq!(
        uvm_status(&uvm, UVM_REGISTER_GPU_VASPACE, p.as_bytes(), 28),
        NV_OK
    );
    let layout = t.classes[&SYSMEM].param_size as usize;
    let (st, mem) = alloc(
        &s.ctl,
        s.client,
        s.device,
        0,
        SYSMEM,
        Some(&mem_params(MB2, layout)),
    );
    assert_eq!(st, NV_OK);
    map_external(&d, &uvm, s.client, VA, MB2, mem);
    Gpu {
        d,
        s,
        uvm,
        vas,
        mem,
    }
}

/// `UVM_CREATE_EXTERNAL_RANGE` + `UVM_MAP_EXTERNAL_ALLOCATION` of `h_mem` at `va` for GPU 0.
fn map_external(d: &SimDriver, uvm: &File, h_client: u32, va: u64, len: u64, h_mem: u32) {
    let t = abi(d);
    let mut r = UVM_CREATE_EXTERNAL_RANGE_PARAMS::new_zeroed();
    r.base = va;
    r.length = len;
    assert_eq!(
        uvm_status(uvm, UVM_CREATE_EXTERNAL_RANGE, r.as_bytes(), 16),
        NV_OK
    );
    let spec = t.uvm[&UVM_MAP_EXTERNAL_ALLOCATION].param_size as usize;
    let mut b = vec![0u8; spec];
    b[0..8].copy_from_slice(&va.to_ne_bytes());
    b[8..16].copy_from_slice(&len.to_ne_bytes());
    b[24..40].copy_from_slice(&d.config().gpus[0].uuid);
    let tail = spec - 24;
    b[tail..tail + 8].copy_from_slice(&1u64.to_ne_bytes());
    b[tail + 8..tail + 12].copy_from_slice(&(-1i32).to_ne_bytes());
    b[tail + 12..tail + 16].copy_from_slice(&h_client.to_ne_bytes());
    b[tail + 16..tail + 20].copy_from_slice(&h_mem.to_ne_bytes());
    assert_eq!(
        uvm_status(uvm, UVM_MAP_EXTERNAL_ALLOCATION, &b, spec - 4),
        NV_OK
    );
}

/// `NV_CHANNEL_ALLOC_PARAMS` (535 layout) for a channel with a context share and a USERD.
fn channel_params(entries: u32, h_share: u32, h_userd: u32, h_error: u32) -> Vec<u8> {
    let mut p = vec![0u8; 360];
    p[0..4].copy_from_slice(&h_error.to_ne_bytes());
    p[8..16].copy_from_slice(&(VA + GPFIFO).to_ne_bytes());
    p[16..20].copy_from_slice(&entries.to_ne_bytes());
    p[24..28].copy_from_slice(&h_share.to_ne_bytes());
    p[32..36].copy_from_slice(&h_userd.to_ne_bytes());
    p
}

/// A channel of `engine` with its engine object, a USERD and an error notifier.
struct Chan {
    h: u32,
    /// The engine object (compute or copy).
    obj: u32,
    tsg: u32,
    userd: u32,
    notifier: u32,
    token: u32,
}

impl Gpu {
    fn tsg(&self, engine: u32) -> u32 {
        let mut p = NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS::new_zeroed();
        p.hVASpace = self.vas;
        p.engineType = engine;
        let (st, h) = alloc(
            &self.s.ctl,
            self.s.client,
            self.s.device,
            0,
            TSG,
            Some(p.as_bytes()),
        );
        assert_eq!(st, NV_OK, "TSG");
        h
    }

    fn sysmem(&self, size: u64) -> u32 {
        let layout = abi(&self.d).classes[&SYSMEM].param_size as usize;
        let (st, h) = alloc(
            &self.s.ctl,
            self.s.client,
            self.s.device,
            0,
            SYSMEM,
            Some(&mem_params(size, layout)),
        );
        assert_eq!(st, NV_OK);
        h
    }

    fn channel(&self, engine: u32) -> Chan {
        let tsg = self.tsg(engine);
        let mut cp = NV_CTXSHARE_ALLOCATION_PARAMETERS::new_zeroed();
        cp.hVASpace = self.vas;
        let (st, share) = alloc(
            &self.s.ctl,
            self.s.client,
            tsg,
            0,
            CTXSHARE,
            Some(cp.as_bytes()),
        );
        assert_eq!(st, NV_OK, "context share");
        let userd = self.sysmem(4096);
        let notifier = self.sysmem(4096);
        let (st, h) = alloc(
            &self.s.ctl,
            self.s.client,
            tsg,
            0,
            CHANNEL,
            Some(&channel_params(64, share, userd, notifier)),
        );
        assert_eq!(st, NV_OK, "channel");
        let (class, params) = if engine == GR0 {
            (COMPUTE, vec![0u8; 16])
        } else {
            let mut p = vec![0u8; 8];
            p[0..4].copy_from_slice(&1u32.to_ne_bytes());
            p[4..8].copy_from_slice(&engine.to_ne_bytes());
            (COPY, p)
        };
        let (st, obj) = alloc(&self.s.ctl, self.s.client, h, 0, class, Some(&params));
        assert_eq!(st, NV_OK, "engine object");
        let mut sched = [0u8; 2];
        sched[0] = 1;
        let (st, _) = control(&self.s.ctl, self.s.client, tsg, 0xa06c_0101, &sched);
        assert_eq!(st, NV_OK, "GPFIFO_SCHEDULE");
        let (st, out) = control(&self.s.ctl, self.s.client, h, 0xc36f_0108, &[0; 4]);
        assert_eq!(st, NV_OK, "work submit token");
        Chan {
            h,
            obj,
            tsg,
            userd,
            notifier,
            token: u32::from_ne_bytes(out[..4].try_into().unwrap()),
        }
    }

    fn write(&self, off: u64, data: &[u8]) {
        self.d
            .memory_write(self.s.client, self.mem, off, data)
            .expect("memory_write");
    }

    fn read(&self, off: u64, n: usize) -> Vec<u8> {
        self.d.memory_read(self.s.client, self.mem, off, n).unwrap()
    }

    fn u32_at(&self, off: u64) -> u32 {
        u32::from_le_bytes(self.read(off, 4).try_into().unwrap())
    }

    /// Puts `methods` (a pushbuffer) at `PB + pb_off` and GPFIFO entry `slot` pointing at it,
    /// sets USERD's GP_PUT to `slot + 1` and rings the doorbell.
    fn submit(&self, c: &Chan, slot: u32, pb_off: u64, methods: &[u32]) {
        self.put_work(c, slot, pb_off, methods);
        self.d.ring_doorbell(0, c.token);
    }

    /// [`Gpu::submit`] without the doorbell.
    fn put_work(&self, c: &Chan, slot: u32, pb_off: u64, methods: &[u32]) {
        let pb: Vec<u8> = methods.iter().flat_map(|d| d.to_le_bytes()).collect();
        self.write(PB + pb_off, &pb);
        let addr = VA + PB + pb_off;
        let e0 = lo(addr) & !3;
        let len = u32::try_from(methods.len()).expect("a short pushbuffer");
        let e1 = ((addr >> 32) as u32 & 0xff) | (len << 10);
        let entry = (u64::from(e1) << 32) | u64::from(e0);
        self.write(GPFIFO + 8 * u64::from(slot), &entry.to_le_bytes());
        self.d
            .memory_write(self.s.client, c.userd, 0x8c, &(slot + 1).to_le_bytes())
            .unwrap();
    }

    fn userd(&self, c: &Chan, off: u64) -> u32 {
        let b = self.d.memory_read(self.s.client, c.userd, off, 4).unwrap();
        u32::from_le_bytes(b.try_into().unwrap())
    }
}

/// An incrementing method header (`SEC_OP_INC_METHOD`).
fn inc(subch: u32, method: u32, count: u32) -> u32 {
    (1 << 29) | (count << 16) | (subch << 13) | (method >> 2)
}

/// An immediate-data method header (`SEC_OP_IMMD_DATA_METHOD`).
fn immd(subch: u32, method: u32, data: u32) -> u32 {
    (4 << 29) | (data << 16) | (subch << 13) | (method >> 2)
}

/// A non-incrementing method header.
fn non_inc(subch: u32, method: u32, count: u32) -> u32 {
    (3 << 29) | (count << 16) | (subch << 13) | (method >> 2)
}

/// The low 32 bits of `v`: the LO word of an address or payload method pair.
fn lo(v: u64) -> u32 {
    (v & 0xffff_ffff) as u32
}

/// `SEM_ADDR_LO..SEM_EXECUTE` for `va` with `payload` and `execute`.
fn sem(va: u64, payload: u64, execute: u32) -> Vec<u32> {
    vec![
        inc(0, 0x5c, 5),
        lo(va),
        (va >> 32) as u32,
        lo(payload),
        (payload >> 32) as u32,
        execute,
    ]
}

// ---- objects and statuses ---------------------------------------------------------------------

#[test]
fn test_channel_group_context_share_and_channel_statuses() {
    let g = gpu();
    let before = g.d.stats();
    let (c, s) = (&g.s.ctl, &g.s);
    let tsg_params = |engine: u32, vas: u32| {
        let mut p = NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS::new_zeroed();
        p.hVASpace = vas;
        p.engineType = engine;
        p.as_bytes().to_vec()
    };
    // RS_REQUIRED params, a device parent, a valid engine, GR0 only.
    assert_eq!(
        alloc(c, s.client, s.device, 0, TSG, None).0,
        NV_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        alloc(
            c,
            s.client,
            s.subdevice,
            0,
            TSG,
            Some(&tsg_params(GR0, g.vas))
        )
        .0,
        NV_ERR_INVALID_OBJECT_PARENT
    );
    assert_eq!(
        alloc(c, s.client, s.device, 0, TSG, Some(&tsg_params(0, g.vas))).0,
        NV_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        alloc(
            c,
            s.client,
            s.device,
            0,
            TSG,
            Some(&tsg_params(0x02, g.vas))
        )
        .0,
        NV_ERR_INVALID_ARGUMENT,
        "GR1 without MIG"
    );
    assert_eq!(
        alloc(
            c,
            s.client,
            s.device,
            0,
            TSG,
            Some(&tsg_params(GR0, s.subdevice))
        )
        .0,
        NV_ERR_INVALID_OBJECT_HANDLE,
        "hVASpace names a subdevice"
    );
    let tsg = g.tsg(GR0);
    // Context shares: SYNC is VEID 0, ASYNC the highest free one, SPECIFIED a free one.
    let share = |flags: u32, id: u32| {
        let mut p = NV_CTXSHARE_ALLOCATION_PARAMETERS::new_zeroed();
        p.hVASpace = g.vas;
        p.flags = flags;
        p.subctxId = id;
        let (st, h, out) = {
            let (r, p, out) = alloc_full(c, s.client, tsg, 0, CTXSHARE, Some(p.as_bytes()));
            r.unwrap();
            (p.status, p.hObjectNew, out.unwrap())
        };
        (st, h, u32::from_ne_bytes(out[8..12].try_into().unwrap()))
    };
    let (st, sync, id) = share(0, 0);
    assert_eq!((st, id), (NV_OK, 0));
    assert_eq!(share(0, 0).0, NV_ERR_NO_MEMORY, "VEID 0 is taken");
    let (st, _, id) = share(1, 0);
    assert_eq!((st, id), (NV_OK, 63));
    assert_eq!(share(2, 5).2, 5);
    assert_eq!(share(2, 5).0, NV_ERR_NO_MEMORY);
    assert_eq!(share(2, 64).0, NV_ERR_NO_MEMORY);
    assert_eq!(share(3, 0).0, NV_ERR_INVALID_ARGUMENT);
    let named = |vas: u32| {
        let mut p = NV_CTXSHARE_ALLOCATION_PARAMETERS::new_zeroed();
        p.hVASpace = vas;
        p.flags = 1;
        alloc(c, s.client, tsg, 0, CTXSHARE, Some(p.as_bytes())).0
    };
    assert_eq!(named(s.subdevice), NV_ERR_INVALID_OBJECT_HANDLE);
    assert_eq!(named(0xbad), NV_ERR_OBJECT_NOT_FOUND);
    assert_eq!(
        named(0),
        NV_ERR_NOT_SUPPORTED,
        "the device's default VA space"
    );
    assert_eq!(
        alloc(c, s.client, s.device, 0, CTXSHARE, Some(&[0; 12])).0,
        NV_ERR_INVALID_OBJECT_PARENT
    );
    // Channels.
    let userd = g.sysmem(4096);
    let mut p = channel_params(64, sync, userd, 0);
    p[28..32].copy_from_slice(&g.vas.to_ne_bytes());
    assert_eq!(
        alloc(c, s.client, tsg, 0, CHANNEL, Some(&p)).0,
        NV_ERR_INVALID_ARGUMENT,
        "hContextShare and hVASpace"
    );
    assert_eq!(
        alloc(
            c,
            s.client,
            tsg,
            0,
            CHANNEL,
            Some(&channel_params(48, sync, userd, 0))
        )
        .0,
        NV_ERR_INVALID_ARGUMENT,
        "GPFIFO entries not a power of two"
    );
    let mut p = channel_params(64, sync, userd, 0);
    p[64..72].copy_from_slice(&4096u64.to_ne_bytes());
    assert_eq!(
        alloc(c, s.client, tsg, 0, CHANNEL, Some(&p)).0,
        NV_ERR_INVALID_ARGUMENT,
        "USERD past the memory"
    );
    assert_eq!(
        alloc(c, s.client, tsg, 0, CHANNEL, Some(&[0; 100])).0,
        NV_ERR_INVALID_ADDRESS
    );
    let (st, ch) = alloc(
        c,
        s.client,
        tsg,
        0,
        CHANNEL,
        Some(&channel_params(64, sync, userd, 0)),
    );
    assert_eq!(st, NV_OK);
    assert_eq!(
        alloc(
            c,
            s.client,
            tsg,
            0,
            CHANNEL,
            Some(&channel_params(64, 0, userd, 0))
        )
        .0,
        NV_ERR_INVALID_ARGUMENT,
        "a TSG does not mix context shares and legacy channels"
    );
    // Engine objects: compute on the GR channel; a copy engine that is a GRCE (COPY0) too,
    // not COPY2 (no GR partner).
    assert_eq!(alloc(c, s.client, ch, 0, COMPUTE, None).0, NV_OK);
    let ce = |engine: u32| {
        let mut p = vec![0u8; 8];
        p[0..4].copy_from_slice(&1u32.to_ne_bytes());
        p[4..8].copy_from_slice(&engine.to_ne_bytes());
        alloc(c, s.client, ch, 0, COPY, Some(&p))
    };
    let (st, copy) = ce(0x09);
    assert_eq!(st, NV_OK);
    assert_eq!(ce(COPY2).0, NV_ERR_INVALID_CLASS);
    assert_eq!(ce(0x01).0, NV_ERR_INVALID_ARGUMENT);
    assert_eq!(
        alloc(c, s.client, tsg, 0, COMPUTE, None).0,
        NV_ERR_INVALID_OBJECT_PARENT
    );
    // Controls: GET_CLASS_ENGINEID, the work-submit token, the channel list.
    let mut q = [0u8; 16];
    q[0..4].copy_from_slice(&copy.to_ne_bytes());
    let (st, out) = control(c, s.client, ch, 0xc36f_0101, &q);
    assert_eq!(st, NV_OK);
    let w = |o: usize| u32::from_ne_bytes(out[o..o + 4].try_into().unwrap());
    assert_eq!((w(4), w(8), w(12)), (COPY, COPY, 0x09));
    let (st, out) = control(c, s.client, ch, 0xc36f_0108, &[0; 4]);
    assert_eq!(st, NV_OK);
    let status = g.d.channel_status(s.client, ch).unwrap();
    assert_eq!(
        u32::from_ne_bytes(out[..4].try_into().unwrap()),
        status.work_submit_token
    );
    assert_eq!(status.work_submit_token, status.chid, "GR0's runlist is 0");
    // Token notifier index: never the error notifier's entry 0.
    assert_eq!(
        control(c, s.client, ch, 0xc36f_010a, &[0; 4]).0,
        NV_ERR_INVALID_ARGUMENT
    );
    // A second TSG in legacy mode: two RM-allocated context shares under it.
    let legacy = g.tsg(COPY2);
    let n = g.d.live_objects();
    let (st, _) = alloc(
        c,
        s.client,
        legacy,
        0,
        CHANNEL,
        Some(&channel_params(64, 0, userd, 0)),
    );
    assert_eq!(st, NV_OK);
    assert_eq!(
        g.d.live_objects(),
        n + 3,
        "channel and the SYNC/ASYNC shares"
    );
    // The TSG's free frees its children, the shares it allocated itself among them.
    assert_eq!(free(c, s.client, legacy), NV_OK);
    assert_eq!(g.d.live_objects(), n - 1, "the TSG, its channel and shares");
    // Freeing the VA space frees its dependants: the other TSG and everything under it.
    assert_eq!(free(c, s.client, g.vas), NV_OK);
    assert!(g.d.channel_status(s.client, ch).is_none());
    drop(g.uvm);
    let _ = before;
}

#[test]
fn test_uvm_channel_registration() {
    let g = gpu();
    let c = g.channel(GR0);
    let mut p = UVM_REGISTER_CHANNEL_PARAMS::new_zeroed();
    p.gpuUuid = NvProcessorUuid {
        uuid: g.d.config().gpus[0].uuid,
    };
    p.rmCtrlFd = -1;
    p.hClient = g.s.client;
    p.hChannel = c.h;
    let reg = |p: &UVM_REGISTER_CHANNEL_PARAMS| {
        uvm_status(&g.uvm, UVM_REGISTER_CHANNEL, p.as_bytes(), 48)
    };
    assert_eq!(reg(&p), NV_OK);
    assert_eq!(
        reg(&p),
        NV_ERR_INVALID_CHANNEL,
        "a handle pair registers once"
    );
    // A channel in another RM VA space of the GPU is not this GPU VA space's.
    let vsize = abi(&g.d).classes[&VASPACE].param_size as usize;
    let (st, other_vas) = alloc(
        &g.s.ctl,
        g.s.client,
        g.s.device,
        0,
        VASPACE,
        Some(&vec![0; vsize]),
    );
    assert_eq!(st, NV_OK);
    let mut tp = NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS::new_zeroed();
    tp.hVASpace = other_vas;
    tp.engineType = COPY2;
    let (_, tsg) = alloc(
        &g.s.ctl,
        g.s.client,
        g.s.device,
        0,
        TSG,
        Some(tp.as_bytes()),
    );
    let (st, other) = alloc(
        &g.s.ctl,
        g.s.client,
        tsg,
        0,
        CHANNEL,
        Some(&channel_params(64, 0, c.userd, 0)),
    );
    assert_eq!(st, NV_OK);
    p.hChannel = other;
    assert_eq!(reg(&p), NV_ERR_INVALID_CHANNEL);
    let mut un = UVM_UNREGISTER_CHANNEL_PARAMS::new_zeroed();
    un.hClient = g.s.client;
    un.hChannel = c.h;
    assert_eq!(
        uvm_status(&g.uvm, UVM_UNREGISTER_CHANNEL, un.as_bytes(), 24),
        NV_OK
    );
}

// ---- GPFIFO, USERD and host semaphores --------------------------------------------------------

#[test]
fn test_gpfifo_release_advances_gp_get_and_writes_the_semaphore() {
    let g = gpu();
    let c = g.channel(GR0);
    g.submit(&c, 0, 0, &sem(VA + SEM, 0x1234_5678, 1));
    assert_eq!(g.u32_at(SEM), 0x1234_5678);
    assert_eq!(g.userd(&c, 0x88), 1, "GP_GET in USERD");
    let st = g.d.channel_status(g.s.client, c.h).unwrap();
    assert_eq!((st.gp_get, st.error, st.stats.gp_entries), (1, None, 1));
    // 64-bit payload with the timestamp: payload at +0, time at +8.
    g.submit(
        &c,
        1,
        0x100,
        &sem(
            VA + SEM + 0x10,
            0xaabb_ccdd_0011_2233,
            1 | 1 << 24 | 1 << 25,
        ),
    );
    let b = g.read(SEM + 0x10, 16);
    assert_eq!(
        u64::from_le_bytes(b[0..8].try_into().unwrap()),
        0xaabb_ccdd_0011_2233
    );
    assert_ne!(
        u64::from_le_bytes(b[8..16].try_into().unwrap()),
        0,
        "timestamp"
    );
    // A reduction (IADD, unsigned).
    g.write(SEM + 0x40, &40u32.to_le_bytes());
    g.submit(
        &c,
        2,
        0x200,
        &sem(VA + SEM + 0x40, 2, 6 | 5 << 27 | 1 << 31),
    );
    assert_eq!(g.u32_at(SEM + 0x40), 42);
    // SET_REFERENCE lands in USERD; the legacy SEMAPHOREA..D release too.
    let mut m = vec![immd(0, 0x50, 77)];
    m.extend([
        inc(0, 0x10, 4),
        (VA >> 32) as u32,
        lo(VA + SEM + 0x50),
        9,
        0x2 | 1 << 24,
    ]);
    g.submit(&c, 3, 0x300, &m);
    assert_eq!(g.userd(&c, 0x48), 77);
    assert_eq!(g.u32_at(SEM + 0x50), 9);
    // Above 40 bits: SET_PB_SEGMENT_EXTENDED_BASE (a control entry) supplies bits 56:40; here
    // they are 0 again, and an address with them set would be outside the mapping.
    g.write(GPFIFO + 8 * 4, &((4u64 << 32) | 1 << 8).to_le_bytes());
    g.d.memory_write(g.s.client, c.userd, 0x8c, &5u32.to_le_bytes())
        .unwrap();
    g.d.ring_doorbell(0, c.token);
    g.put_work(&c, 5, 0x400, &sem(VA + SEM + 0x60, 1, 1));
    g.d.ring_doorbell(0, c.token);
    let st = g.d.channel_status(g.s.client, c.h).unwrap();
    assert_eq!(
        (st.gp_get, st.error),
        (5, Some(31)),
        "the segment at 2^40 + PB is unmapped"
    );
    assert_eq!(g.u32_at(SEM + 0x60), 0);
}

#[test]
fn test_acquire_blocks_the_channel_until_the_semaphore_is_released() {
    let g = gpu();
    let c = g.channel(GR0);
    let mut m = sem(VA + SEM, 7, 0); // ACQUIRE == 7
    m.extend(sem(VA + SEM + 8, 1, 1)); // then RELEASE 1
    g.submit(&c, 0, 0, &m);
    let st = g.d.channel_status(g.s.client, c.h).unwrap();
    assert!(st.blocked);
    assert_eq!(st.gp_get, 0);
    assert_eq!(g.u32_at(SEM + 8), 0);
    // The CPU releases it; the front end retries the acquire (the watcher would too).
    g.write(SEM, &7u32.to_le_bytes());
    g.d.ring_doorbell(0, c.token);
    let st = g.d.channel_status(g.s.client, c.h).unwrap();
    assert!(!st.blocked);
    assert_eq!((st.gp_get, g.u32_at(SEM + 8)), (1, 1));
    // Strict GEQ, circular GEQ, AND, NOR.
    for (i, (mem, payload, op, passes)) in [
        (5u32, 5u64, 2u32, true),
        (4, 5, 2, false),
        (1, 0xffff_fff0, 3, true),
        (0b100, 0b110, 4, true),
        (0b100, 0b011, 5, true),
    ]
    .into_iter()
    .enumerate()
    {
        let at = SEM + 0x100 + 16 * i as u64;
        g.write(at, &mem.to_le_bytes());
        let slot = 1 + u32::try_from(i).expect("a few cases");
        g.submit(&c, slot, 0x100 * (slot as u64), &sem(VA + at, payload, op));
        let st = g.d.channel_status(g.s.client, c.h).unwrap();
        assert_eq!(
            !st.blocked, passes,
            "acquire op {op} mem {mem} payload {payload}"
        );
        if !passes {
            g.write(at, &5u32.to_le_bytes());
            g.d.ring_doorbell(0, c.token);
        }
    }
}

#[test]
fn test_the_doorbell_page_is_watched() {
    let g = gpu();
    let c = g.channel(GR0);
    let (st, um) = alloc(&g.s.ctl, g.s.client, g.s.subdevice, 0, USERMODE, None);
    assert_eq!(st, NV_OK);
    // Map the page as libcuda does (RM_MAP_MEMORY on the GPU node) and write the token
    // through the memfd the client would map.
    let target = g.d.open_mapping(NodeKind::Gpu(0)).unwrap();
    let mut p = nv_ioctl_nvos33_parameters_with_fd::new_zeroed();
    p.params.hClient = g.s.client;
    p.params.hDevice = g.s.subdevice;
    p.params.hMemory = um;
    p.params.length = 0x1_0000;
    p.fd = target.id();
    let (r, out) = esc(&g.s.ctl, NV_ESC_RM_MAP_MEMORY, &p);
    assert_eq!((r.unwrap(), out.params.status), (0, NV_OK));
    let (fd, adjust) = target.mmap_fd().unwrap();
    let page = std::fs::File::from(fd);
    // The work: a release, GP_PUT 1, then the doorbell write.
    g.put_work(&c, 0, 0, &sem(VA + SEM, 0x55, 1));
    use std::os::unix::fs::FileExt;
    page.write_all_at(&c.token.to_le_bytes(), adjust + 0x90)
        .unwrap();
    let t = Instant::now();
    while g.u32_at(SEM) != 0x55 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the watcher did not run the channel"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(g.userd(&c, 0x88), 1);
    let mut b = [0u8; 4];
    page.read_exact_at(&mut b, adjust + 0x90).unwrap();
    assert_eq!(b, [0xff; 4], "the doorbell is consumed");
}

// ---- non-stall interrupts ---------------------------------------------------------------------

#[test]
fn test_non_stall_interrupt_notifies_the_engine_event() {
    let g = gpu();
    let c = g.channel(GR0);
    let mut ev = nv_ioctl_alloc_os_event_t::new_zeroed();
    ev.hClient = g.s.client;
    ev.fd = 99;
    assert_eq!(esc(&g.s.gpu, NV_ESC_ALLOC_OS_EVENT, &ev).1.Status, NV_OK);
    let mut ep = NV0005_ALLOC_PARAMETERS::new_zeroed();
    ep.hParentClient = g.s.client;
    ep.hClass = 0x79;
    ep.notifyIndex = 12; // NV2080_NOTIFIERS_GR0
    ep.data = 99;
    assert_eq!(
        alloc(
            &g.s.gpu,
            g.s.client,
            g.s.subdevice,
            0,
            0x79,
            Some(ep.as_bytes())
        )
        .0,
        NV_OK
    );
    assert_eq!(g.d.os_event_notifications(g.s.gpu.id(), 99), Some(0));
    g.submit(&c, 0, 0, &[immd(0, 0x20, 0), immd(0, 0x20, 0)]);
    assert_eq!(g.d.os_event_notifications(g.s.gpu.id(), 99), Some(2));
    assert_eq!(
        g.d.channel_status(g.s.client, c.h)
            .unwrap()
            .stats
            .nonstall_interrupts,
        2
    );
}

// ---- copy engine ------------------------------------------------------------------------------

#[test]
fn test_copy_engine_copies_memsets_and_releases() {
    let g = gpu();
    let c = g.channel(COPY2);
    let src: Vec<u8> = (0..0x1_0000u32)
        .map(|i| ((i * 7 + 3) & 0xff) as u8)
        .collect();
    g.write(DATA, &src);
    let (s, d) = (VA + DATA, VA + DATA + 0x4_0000);
    // SET_OBJECT, a 64 KiB pitch copy, a four-word semaphore release with the timestamp.
    let mut m = vec![inc(4, 0, 1), COPY];
    m.extend([
        inc(4, 0x400, 4),
        (s >> 32) as u32,
        lo(s),
        (d >> 32) as u32,
        lo(d),
    ]);
    m.extend([inc(4, 0x418, 1), u32::try_from(src.len()).expect("64 KiB")]);
    m.extend([
        inc(4, 0x240, 3),
        ((VA + SEM) >> 32) as u32,
        lo(VA + SEM),
        0xc0de,
    ]);
    // DATA_TRANSFER NON_PIPELINED, SEMAPHORE FOUR_WORD, pitch src and dst.
    m.extend([inc(4, 0x300, 1), 2 | 2 << 3 | 1 << 7 | 1 << 8]);
    g.submit(&c, 0, 0, &m);
    let st = g.d.channel_status(g.s.client, c.h).unwrap();
    assert_eq!(st.error, None);
    assert_eq!(g.read(DATA + 0x4_0000, src.len()), src);
    assert_eq!(g.u32_at(SEM), 0xc0de);
    assert_ne!(g.read(SEM + 8, 8), vec![0; 8], "timestamp");
    // A memset (remap CONST_A, 4-byte components, one per pixel) of 1000 words, then a
    // one-word release with a non-blocking interrupt.
    let t = VA + DATA + 0x8_0000;
    let mut m = vec![inc(4, 0x700, 3), 0xdead_beef, 0, 4 | 3 << 16];
    m.extend([
        inc(4, 0x408, 2),
        (t >> 32) as u32,
        lo(t),
        inc(4, 0x418, 1),
        1000,
    ]);
    m.extend([
        inc(4, 0x240, 3),
        ((VA + SEM) >> 32) as u32,
        lo(VA + SEM + 0x20),
        5,
    ]);
    m.extend([
        inc(4, 0x300, 1),
        2 | 1 << 3 | 2 << 5 | 1 << 7 | 1 << 8 | 1 << 10,
    ]);
    g.submit(&c, 1, 0x400, &m);
    let words = g.read(DATA + 0x8_0000, 4004);
    assert!(
        words[..4000]
            .chunks(4)
            .all(|w| w == 0xdead_beefu32.to_le_bytes())
    );
    assert_eq!(&words[4000..], &[0; 4], "exactly 1000 words");
    assert_eq!(g.u32_at(SEM + 0x20), 5);
    // A multi-line copy: 3 lines of 16 bytes, pitches 64 (in) and 32 (out).
    let t2 = VA + DATA + 0xc_0000;
    let mut m = vec![
        inc(4, 0x400, 8),
        (s >> 32) as u32,
        lo(s),
        (t2 >> 32) as u32,
        lo(t2),
        64,
        32,
        16,
        3,
    ];
    m.extend([inc(4, 0x300, 1), 2 | 1 << 7 | 1 << 8 | 1 << 9]);
    g.submit(&c, 2, 0x800, &m);
    let out = g.read(DATA + 0xc_0000, 96);
    for line in 0..3 {
        assert_eq!(
            &out[32 * line..32 * line + 16],
            &src[64 * line..64 * line + 16]
        );
        assert_eq!(&out[32 * line + 16..32 * line + 32], &[0; 16]);
    }
    let st = g.d.channel_status(g.s.client, c.h).unwrap();
    assert_eq!((st.stats.copies, st.stats.nonstall_interrupts), (3, 1));
    // Block-linear is not simulated: the CE's channel error (ROBUST_CHANNEL_CE2_ERROR).
    g.submit(&c, 3, 0xc00, &[inc(4, 0x300, 1), 2]);
    assert_eq!(g.d.channel_status(g.s.client, c.h).unwrap().error, Some(41));
}

/// A tenant's line length is up to 2^32 - 1 pixels of up to four 4-byte components: a copy
/// engine works through it piece by piece and faults where the mapping ends, as the hardware
/// does; the simulator never sizes a buffer by it (64 GiB for a remapped line, which would
/// abort the process that hosts it).
#[test]
fn test_a_huge_copy_line_faults_at_the_end_of_the_mapping_without_a_line_sized_buffer() {
    let g = gpu();
    let (s, d) = (VA + DATA, VA + DATA + 0x4_0000);
    // Remap: four 4-byte source components to four destination components; then without it.
    let remap = 3 << 8 | 2 << 4 | 3 << 16 | 3 << 20 | 3 << 24 | 1 << 12;
    for launch in [2 | 1 << 7 | 1 << 8 | 1 << 10, 2 | 1 << 7 | 1 << 8] {
        let c = g.channel(COPY2);
        let mut m = vec![inc(4, 0, 1), COPY, inc(4, 0x700, 3), 0, 0, remap];
        m.extend([
            inc(4, 0x400, 4),
            (s >> 32) as u32,
            lo(s),
            (d >> 32) as u32,
            lo(d),
        ]);
        m.extend([inc(4, 0x418, 1), u32::MAX, inc(4, 0x300, 1), launch]);
        g.submit(&c, 0, 0, &m);
        assert_eq!(
            g.d.channel_status(g.s.client, c.h).unwrap().error,
            Some(31),
            "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (launch {launch:#x})"
        );
    }
}

/// A shared mapping of the UVM va_space's memfd at VA == offset (how CUDA maps managed
/// memory), so the range is managed.
struct Managed {
    addr: u64,
    len: usize,
}

impl Managed {
    fn new(uvm: &File, len: usize) -> Managed {
        use std::os::fd::AsRawFd;
        let (fd, adjust) = uvm.mmap_fd().unwrap();
        assert_eq!(adjust, 0);
        // SAFETY: a fresh reservation at an address of the kernel's choice.
        let resv = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(resv, libc::MAP_FAILED);
        // SAFETY: MAP_FIXED over the reservation this test owns; the fd is live.
        let p = unsafe {
            libc::mmap(
                resv,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                resv as libc::off_t,
            )
        };
        assert_eq!(p, resv);
        Managed {
            addr: resv as u64,
            len,
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the live shared mapping of `len` bytes made above.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        // SAFETY: exactly the range mapped above, once.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

#[test]
fn test_copies_between_video_system_and_managed_memory() {
    let g = gpu();
    let c = g.channel(COPY2);
    // 2 MiB of video memory at VA + 4 MiB, 1 MiB of managed memory wherever the kernel puts it.
    let layout = abi(&g.d).classes[&0x40].param_size as usize;
    let (st, vid) = alloc(
        &g.s.ctl,
        g.s.client,
        g.s.device,
        0,
        0x40,
        Some(&mem_params(MB2, layout)),
    );
    assert_eq!(st, NV_OK);
    let vid_va = VA + 2 * MB2;
    map_external(&g.d, &g.uvm, g.s.client, vid_va, MB2, vid);
    let managed = Managed::new(&g.uvm, 1 << 20);
    let src: Vec<u8> = (0..0x3000u32)
        .map(|i| ((i ^ (i >> 8)) & 0xff) as u8)
        .collect();
    let n = u32::try_from(src.len()).expect("12 KiB");
    g.write(DATA, &src);
    let copy = |from: u64, to: u64, n: u32| {
        vec![
            inc(4, 0x400, 4),
            (from >> 32) as u32,
            lo(from),
            (to >> 32) as u32,
            lo(to),
            inc(4, 0x418, 1),
            n,
            inc(4, 0x300, 1),
            2 | 1 << 7 | 1 << 8,
        ]
    };
    // System -> video -> managed -> system (at another offset).
    let mut m = vec![inc(4, 0, 1), COPY];
    m.extend(copy(VA + DATA, vid_va + 0x1000, n));
    m.extend(copy(vid_va + 0x1000, managed.addr + 0x2000, n));
    m.extend(copy(managed.addr + 0x2000, VA + DATA + 0x8_0000, n));
    g.submit(&c, 0, 0, &m);
    assert_eq!(g.d.channel_status(g.s.client, c.h).unwrap().error, None);
    let v = g.d.memory_read(g.s.client, vid, 0x1000, src.len()).unwrap();
    assert_eq!(v, src, "video memory, as the driver sees it");
    assert_eq!(
        &managed.bytes()[0x2000..0x2000 + src.len()],
        &src[..],
        "through the CPU mapping"
    );
    assert_eq!(g.read(DATA + 0x8_0000, src.len()), src);
    let gone = managed.addr;
    drop(managed);
    // Unmapped again: the managed range is gone and a copy to it faults.
    g.submit(&c, 1, 0x400, &copy(VA + DATA, gone, 16));
    assert_eq!(g.d.channel_status(g.s.client, c.h).unwrap().error, Some(31));
}

// ---- compute class ----------------------------------------------------------------------------

#[test]
fn test_compute_inline_to_memory_and_report_semaphore() {
    let g = gpu();
    let c = g.channel(GR0);
    let t = VA + DATA;
    // SET_OBJECT, a state method (recorded), I2M of 10 bytes, a one-word report semaphore.
    let mut m = vec![inc(1, 0, 1), COMPUTE, immd(1, 0x2e4, 1)];
    m.extend([
        inc(1, 0x180, 2),
        10,
        1,
        inc(1, 0x188, 2),
        (t >> 32) as u32,
        lo(t),
    ]);
    m.extend([
        immd(1, 0x1b0, 1),
        non_inc(1, 0x1b4, 3),
        0x0403_0201,
        0x0807_0605,
        0x0000_0a09,
    ]);
    m.extend([
        inc(1, 0x1b00, 4),
        ((VA + SEM) >> 32) as u32,
        lo(VA + SEM),
        31,
        1 << 28,
    ]);
    g.submit(&c, 0, 0, &m);
    let st = g.d.channel_status(g.s.client, c.h).unwrap();
    assert_eq!(st.error, None);
    assert_eq!(g.read(DATA, 11), vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0]);
    assert_eq!(g.u32_at(SEM), 31);
    assert_eq!(st.stats.compute_state_methods, 1);
    assert_eq!(
        g.d.compute_state(g.s.client, c.h, 0x2e4),
        Some(1),
        "recorded"
    );
    assert_eq!(g.d.compute_state(g.s.client, c.h, 0x2e8), None);
}

#[test]
fn test_a_compute_launch_raises_the_channel_error_of_a_faulting_launch() {
    let g = gpu();
    let c = g.channel(GR0);
    let mut m = vec![inc(1, 0, 1), COMPUTE];
    m.extend([immd(1, 0x2b4, 0x1234), immd(1, 0x2c0, 0)]);
    m.extend(sem(VA + SEM, 1, 1)); // never reached
    g.submit(&c, 0, 0, &m);
    let st = g.d.channel_status(g.s.client, c.h).unwrap();
    assert_eq!(st.error, Some(13), "ROBUST_CHANNEL_GR_EXCEPTION");
    assert_eq!(g.u32_at(SEM), 0);
    let n = g.d.memory_read(g.s.client, c.notifier, 0, 16).unwrap();
    assert_eq!(
        u32::from_le_bytes(n[8..12].try_into().unwrap()),
        13,
        "info32"
    );
    assert_eq!(
        u16::from_le_bytes(n[12..14].try_into().unwrap()),
        1,
        "info16: GR0"
    );
    assert_eq!(
        u16::from_le_bytes(n[14..16].try_into().unwrap()),
        0xffff,
        "status"
    );
    // The channel executes nothing more.
    g.submit(&c, 1, 0x100, &sem(VA + SEM, 2, 1));
    assert_eq!(g.u32_at(SEM), 0);
    let _ = c.tsg;
}

// ---- faults -----------------------------------------------------------------------------------

#[test]
fn test_unmapped_addresses_fault_the_channel() {
    let g = gpu();
    let c = g.channel(GR0);
    g.submit(&c, 0, 0, &sem(0x1000, 1, 1));
    assert_eq!(g.d.channel_status(g.s.client, c.h).unwrap().error, Some(31));
    // An engine method without an object bound, on a fresh channel.
    let c = g.channel(GR0);
    g.submit(&c, 0, 0, &[immd(2, 0x300, 1)]);
    assert_eq!(g.d.channel_status(g.s.client, c.h).unwrap().error, Some(32));
}

#[test]
fn test_everything_is_released_with_the_files() {
    let g = gpu();
    let _c = g.channel(GR0);
    let _d = g.channel(COPY2);
    let Gpu { d, s, uvm, .. } = g;
    drop(uvm);
    drop(s);
    let st = d.stats();
    assert_eq!((st.open_files, st.live_clients, st.live_objects), (0, 0, 0));
}

const DEBUGGER: u32 = 0x83de;

fn debugger_params(obsolete: u32, app: u32, object: u32) -> Vec<u8> {
    [obsolete, app, object]
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .collect()
}

#[test]
fn test_sm_debugger_session_statuses_controls_and_lifetime() {
    let g = gpu();
    let (ctl, client) = (&g.s.ctl, g.s.client);
    let gr = g.channel(GR0);
    let ce = g.channel(COPY2);
    for (what, parent, params, want) in [
        ("no params", g.s.device, None, NV_ERR_INVALID_ARGUMENT),
        (
            "obsolete client",
            g.s.device,
            Some(debugger_params(client, 0, gr.obj)),
            NV_ERR_INVALID_ARGUMENT,
        ),
        (
            "unknown app client",
            g.s.device,
            Some(debugger_params(0, 0xc1d0_0bad, gr.obj)),
            NV_ERR_INVALID_CLIENT,
        ),
        (
            "unknown object",
            g.s.device,
            Some(debugger_params(0, 0, 0xbad)),
            NV_ERR_INVALID_OBJECT_PARENT,
        ),
        (
            "copy object",
            g.s.device,
            Some(debugger_params(0, 0, ce.obj)),
            NV_ERR_INVALID_OBJECT,
        ),
        (
            "under a subdevice",
            g.s.subdevice,
            Some(debugger_params(0, 0, gr.obj)),
            NV_ERR_INVALID_OBJECT_PARENT,
        ),
    ] {
        let (st, _) = alloc(ctl, client, parent, 0, DEBUGGER, params.as_deref());
        assert_eq!(st, want, "{what}");
    }
    let before = g.d.live_objects();
    let (st, dbg) = alloc(
        ctl,
        client,
        g.s.device,
        0,
        DEBUGGER,
        Some(&debugger_params(0, 0, gr.obj)),
    );
    assert_eq!(st, NV_OK);
    // hAppClient names the caller's own client explicitly too.
    let (st, dbg2) = alloc(
        ctl,
        client,
        g.s.device,
        0,
        DEBUGGER,
        Some(&debugger_params(0, client, gr.obj)),
    );
    assert_eq!(st, NV_OK);
    assert_eq!(g.d.live_objects(), before + 2);
    // Its controls: SET_EXCEPTION_MASK within _ALL, SET_MODE_MMU_DEBUG enable/disable.
    for (cmd, arg, want) in [
        (0x83de_0309u32, 0xffffu32, NV_OK),
        (0x83de_0309, 0, NV_OK),
        (0x83de_0309, 0x1_0000, NV_ERR_INVALID_ARGUMENT),
        (0x83de_0307, 1, NV_OK),
        (0x83de_0307, 2, NV_OK),
        (0x83de_0307, 3, NV_ERR_INVALID_ARGUMENT),
    ] {
        let (st, _) = control(ctl, client, dbg, cmd, &arg.to_ne_bytes());
        assert_eq!(st, want, "{cmd:#x} {arg:#x}");
    }
    // A debugger session is a dependant of the object it debugs: freed with it.
    assert_eq!(free(ctl, client, gr.obj), NV_OK);
    assert_eq!(g.d.live_objects(), before - 1);
    let _ = dbg2;
}

#[test]
fn test_events_on_channels_engine_objects_and_debuggers() {
    let g = gpu();
    let (ctl, client) = (&g.s.ctl, g.s.client);
    let gr = g.channel(GR0);
    let (st, dbg) = alloc(
        ctl,
        client,
        g.s.device,
        0,
        DEBUGGER,
        Some(&debugger_params(0, 0, gr.obj)),
    );
    assert_eq!(st, NV_OK);
    // eventConstruct: the source must be a Notifier; a TSG or memory is not.
    for (src, want) in [
        (gr.h, NV_OK),
        (gr.obj, NV_OK),
        (dbg, NV_OK),
        (gr.tsg, NV_ERR_INVALID_OBJECT),
        (g.mem, NV_ERR_INVALID_OBJECT),
    ] {
        assert_eq!(os_event_on(&g, src), want, "source {src:#x}");
    }
}

/// Allocates an OS event and an `NV01_EVENT_OS_EVENT` notified by `src` (its parent); the
/// event's status.
fn os_event_on(g: &Gpu, src: u32) -> u32 {
    let fd = 100 + (src & 0xff) as i32;
    let mut ev = nv_ioctl_alloc_os_event_t::new_zeroed();
    ev.hClient = g.s.client;
    ev.fd = fd;
    assert_eq!(esc(&g.s.gpu, NV_ESC_ALLOC_OS_EVENT, &ev).1.Status, NV_OK);
    let mut p = NV0005_ALLOC_PARAMETERS::new_zeroed();
    p.hParentClient = g.s.client;
    p.hClass = 0x79;
    p.data = u64::try_from(fd).expect("an open fd");
    alloc(&g.s.gpu, g.s.client, src, 0, 0x79, Some(p.as_bytes())).0
}

#[test]
fn test_ctxsw_preemption_mode_and_channel_reset() {
    let g = gpu();
    let (ctl, client) = (&g.s.ctl, g.s.client);
    let gr = g.channel(GR0);
    let ce = g.channel(COPY2);
    let params = |flags: u32, h: u32, gfxp: u32, cilp: u32| {
        let mut p = vec![0u8; 32];
        for (i, w) in [flags, h, gfxp, cilp].into_iter().enumerate() {
            p[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
        }
        p
    };
    for (what, p, want) in [
        ("compute WFI on the channel", params(1, gr.h, 0, 0), NV_OK),
        ("CILP on the TSG", params(1, gr.tsg, 0, 2), NV_OK),
        ("nothing selected", params(0, gr.h, 9, 9), NV_OK),
        (
            "bad compute mode",
            params(1, gr.h, 0, 3),
            NV_ERR_INVALID_ARGUMENT,
        ),
        (
            "graphics preemption",
            params(2, gr.h, 1, 0),
            NV_ERR_NOT_SUPPORTED,
        ),
        (
            "a copy channel",
            params(1, ce.h, 0, 0),
            NV_ERR_OBJECT_NOT_FOUND,
        ),
        ("no channel", params(1, 0xbad, 0, 0), NV_ERR_INVALID_CHANNEL),
    ] {
        let (st, _) = control(ctl, client, g.s.subdevice, 0x2080_1210, &p);
        assert_eq!(st, want, "{what}");
    }
    // RESET_CHANNEL {engineID, subdeviceInstance, resetReason}: reasons below _ENUM_MAX.
    let reset = |reason: u32| {
        let p: Vec<u8> = [GR0, 0, reason]
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .collect();
        control(ctl, client, gr.h, 0x906f_0102, &p).0
    };
    assert_eq!(reset(0), NV_OK);
    assert_eq!(reset(2), NV_OK);
    assert_eq!(reset(3), NV_ERR_INVALID_PARAMETER);
    // The channel still runs after a reset.
    g.submit(&gr, 0, 0, &sem(VA + SEM, 7, 1));
    let deadline = Instant::now() + Duration::from_secs(5);
    while g.u32_at(SEM) != 7 {
        assert!(Instant::now() < deadline, "the release did not land");
        std::thread::sleep(Duration::from_millis(1));
    }
}
