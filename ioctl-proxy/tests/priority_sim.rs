//! Scheduling priority through the proxy on `nvsim` (`schedule.rs`): the instance's interleave
//! level reaches every channel group it creates; the controls the driver keeps for callers with
//! CAP_SYS_NICE get an unprivileged caller's answer without reaching the driver; a tenant's
//! timeslice reaches the driver at most at the bound; a level the driver refuses leaves no
//! channel group behind.

mod common;

use common::*;
use ioctl_proxy::*;
use nvproxy_abi::ioctl::nv_iowr;
use nvproxy_abi::status::*;
use nvsim::{SimConfig, SimDriver};
use std::sync::Arc;

const DEVICE: u32 = 0x80;
const SUBDEVICE: u32 = 0x2080;
const VASPACE: u32 = 0x90f1;
const TSG: u32 = 0xa06c;
const SET_TIMESLICE: u32 = 0xa06c_0103;
const GET_TIMESLICE: u32 = 0xa06c_0104;
const SET_INTERLEAVE: u32 = 0xa06c_0107;
const GET_INTERLEAVE: u32 = 0xa06c_0108;
const MAKE_REALTIME: u32 = 0xa06c_0110;
const RUNLIST_SET_SCHED_POLICY: u32 = 0x2080_1115;
/// The driver's default timeslice (kfifoChannelGroupGetDefaultTimeslice_GV100).
const DEFAULT_TIMESLICE: u64 = 1024;

struct Inst {
    sim: Arc<SimDriver>,
    t: SimTenant,
    events: Arc<Events>,
    ctl: OpenId,
    client: u32,
    device: u32,
    subdevice: u32,
    vaspace: u32,
}

fn instance(priority: Priority) -> Inst {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut policy = InstancePolicy::new("job", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0]);
    policy.priority = priority;
    let events = Arc::new(Events::default());
    let proxy = Proxy::for_host(policy, sim.clone())
        .unwrap()
        .with_audit(events.clone());
    let mut t = SimTenant::from_proxy(proxy);
    let ctl = t.proxy.open(FrontendNode::Ctl).unwrap();
    let gpu = t.proxy.open(FrontendNode::Gpu(0)).unwrap();
    t.fds.add(3, ctl);
    let (r, _) = t.ioctl(gpu, nv_iowr(0xc9, 4), &3i32.to_ne_bytes());
    assert_eq!(r, 0);
    let (s, client) = t.alloc(ctl, 0, 0, 0x41, &[]);
    assert_eq!(s, NV_OK);
    let (s, device) = t.alloc(ctl, client, client, DEVICE, &[0; 56]);
    assert_eq!(s, NV_OK, "device");
    let (s, subdevice) = t.alloc(ctl, client, device, SUBDEVICE, &[0; 4]);
    assert_eq!(s, NV_OK, "subdevice");
    let (s, vaspace) = t.alloc(ctl, client, device, VASPACE, &[0; 48]);
    assert_eq!(s, NV_OK, "VA space");
    Inst {
        sim,
        t,
        events,
        ctl,
        client,
        device,
        subdevice,
        vaspace,
    }
}

impl Inst {
    /// A graphics/compute TSG in the VA space; (status, handle).
    fn tsg(&mut self) -> (u32, u32) {
        let mut p = vec![0u8; 20];
        wr32(&mut p, 8, self.vaspace); // hVASpace
        wr32(&mut p, 12, 1); // engineType: GR0
        self.t.alloc(self.ctl, self.client, self.device, TSG, &p)
    }

    fn control(&mut self, object: u32, cmd: u32, params: &[u8]) -> (u32, Vec<u8>) {
        self.t.control(self.ctl, self.client, object, cmd, params)
    }

    fn last_event(&self) -> AuditEvent {
        self.events.all().pop().unwrap()
    }
}

#[test]
fn test_each_channel_group_gets_the_instances_level() {
    for (priority, level) in [
        (Priority::Low, 0),
        (Priority::Medium, 1),
        (Priority::High, 2),
    ] {
        let mut i = instance(priority);
        for _ in 0..2 {
            let (s, _) = i.tsg();
            assert_eq!(s, NV_OK, "{priority}");
        }
        assert_eq!(
            i.sim.channel_group_schedules(),
            vec![(level, DEFAULT_TIMESLICE); 2],
            "{priority}"
        );
    }
}

#[test]
fn test_a_tenant_cannot_set_a_level_or_make_a_group_realtime() {
    let mut i = instance(Priority::Low);
    let (s, tsg) = i.tsg();
    assert_eq!(s, NV_OK);
    for level in [0u32, 1, 2] {
        let (s, _) = i.control(tsg, SET_INTERLEAVE, &level.to_ne_bytes());
        assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS, "level {level}");
        let ev = i.last_event();
        assert_eq!(ev.name, "NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL");
        assert_eq!(ev.decision, Decision::Denied);
    }
    let (s, _) = i.control(tsg, MAKE_REALTIME, &[1, 0, 0, 0]);
    assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS);
    let (s, _) = i.control(i.subdevice, RUNLIST_SET_SCHED_POLICY, &[0; 8]);
    assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS);
    // The driver's order: an unknown object, then a control the object's class lacks.
    let (s, _) = i.control(0xdead_0001, SET_INTERLEAVE, &2u32.to_ne_bytes());
    assert_eq!(s, NV_ERR_OBJECT_NOT_FOUND);
    let (s, _) = i.control(i.device, SET_INTERLEAVE, &2u32.to_ne_bytes());
    assert_eq!(s, NV_ERR_NOT_SUPPORTED);
    let (s, _) = i.control(tsg, RUNLIST_SET_SCHED_POLICY, &[0; 8]);
    assert_eq!(s, NV_ERR_NOT_SUPPORTED);
    // The driver exports no GET of the level.
    let (s, _) = i.control(tsg, GET_INTERLEAVE, &[0; 4]);
    assert_eq!(s, NV_ERR_NOT_SUPPORTED);
    assert_eq!(
        i.sim.channel_group_schedules(),
        vec![(0, DEFAULT_TIMESLICE)]
    );
}

#[test]
fn test_a_timeslice_above_the_bound_reaches_the_driver_as_the_bound() {
    let mut i = instance(Priority::Medium);
    let (s, tsg) = i.tsg();
    assert_eq!(s, NV_OK);
    // libcuda's own value passes as it is.
    let (s, after) = i.control(tsg, SET_TIMESLICE, &2048u64.to_ne_bytes());
    assert_eq!((s, rd64(&after, 0)), (NV_OK, 2048));
    assert_eq!(i.sim.channel_group_schedules(), vec![(1, 2048)]);
    let (s, after) = i.control(tsg, SET_TIMESLICE, &5_000_000u64.to_ne_bytes());
    assert_eq!(s, NV_OK);
    assert_eq!(
        rd64(&after, 0),
        5_000_000,
        "the tenant's memory keeps its value"
    );
    assert_eq!(i.sim.channel_group_schedules(), vec![(1, 2048)]);
    let (s, _) = i.control(tsg, SET_TIMESLICE, &500u64.to_ne_bytes());
    assert_eq!(s, NV_OK);
    assert_eq!(i.sim.channel_group_schedules(), vec![(1, 500)]);
}

#[test]
fn test_a_level_the_driver_refuses_fails_the_allocation_and_leaves_nothing() {
    let mut i = instance(Priority::Low);
    let objects = i.sim.live_objects();
    // The proxy's own call made without CAP_SYS_NICE (a worker that lacks it).
    let (s, h) = nvsim::caller::with_caller_nice(false, || i.tsg());
    assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS);
    assert!(i.sim.channel_group_schedules().is_empty());
    assert_eq!(i.sim.live_objects(), objects, "the driver holds no TSG");
    let (s, _) = i.control(h, GET_TIMESLICE, &[0; 8]);
    assert_eq!(s, NV_ERR_OBJECT_NOT_FOUND, "nor the proxy's table");
    // With the right the next one gets its level.
    let (s, _) = i.tsg();
    assert_eq!(s, NV_OK);
    assert_eq!(
        i.sim.channel_group_schedules(),
        vec![(0, DEFAULT_TIMESLICE)]
    );
}

#[test]
fn test_medium_needs_no_right() {
    let mut i = instance(Priority::Medium);
    let (s, _) = nvsim::caller::with_caller_nice(false, || i.tsg());
    assert_eq!(s, NV_OK);
    assert_eq!(
        i.sim.channel_group_schedules(),
        vec![(1, DEFAULT_TIMESLICE)]
    );
}
