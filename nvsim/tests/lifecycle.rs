//! Nothing leaks: frees, client frees and file closes bring every counter back to zero. Plus
//! several GPUs, several driver instances, other driver versions, and concurrent use.

mod common;

use std::sync::Arc;

use common::*;
use host_driver::{HostDriver, NodeKind};
use nvproxy_abi::DriverVersion;
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use nvsim::control::cmd;
use nvsim::status::*;
use nvsim::{SimConfig, SimDriver, SimStats};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

fn os_event_object(s: &Stack, h: u32) {
    let mut ev = nv_ioctl_alloc_os_event_t::new_zeroed();
    ev.hClient = s.client;
    ev.fd = s.gpu.id();
    assert_eq!(esc(&s.gpu, NV_ESC_ALLOC_OS_EVENT, &ev).1.Status, NV_OK);
    let mut ep = NV0005_ALLOC_PARAMETERS::new_zeroed();
    ep.hParentClient = s.client;
    ep.hClass = 0x79;
    ep.data = u64::try_from(s.gpu.id()).expect("an open fd");
    assert_eq!(
        alloc(&s.gpu, s.client, s.subdevice, h, 0x79, Some(ep.as_bytes())).0,
        NV_OK
    );
}

#[test]
fn test_free_device_frees_its_subtree() {
    let d = sim(1);
    let s = stack(&d, 0);
    alloc(
        &s.ctl,
        s.client,
        s.subdevice,
        0x71,
        0x40,
        Some(&mem_params(1 << 20, 120)),
    );
    os_event_object(&s, 0x72);
    assert_eq!(d.live_objects(), 4);
    assert_eq!(free(&s.ctl, s.client, s.device), NV_OK);
    let st = d.stats();
    assert_eq!(
        (st.live_clients, st.live_objects, st.allocated_memory),
        (1, 0, 0)
    );
    assert_eq!(st.os_events, 1, "the OS event itself stays registered");
}

#[test]
fn test_event_with_null_parent_client_lives_under_the_client() {
    let d = sim(1);
    let s = stack(&d, 0);
    let mut ev = nv_ioctl_alloc_os_event_t::new_zeroed();
    ev.hClient = s.client;
    ev.fd = s.gpu.id();
    assert_eq!(esc(&s.gpu, NV_ESC_ALLOC_OS_EVENT, &ev).1.Status, NV_OK);
    let mut ep = NV0005_ALLOC_PARAMETERS::new_zeroed();
    ep.hClass = 0x79; // hParentClient 0: _fixupAllocParams re-parents the event to the client
    ep.data = u64::try_from(s.gpu.id()).expect("an open fd");
    let (_, _, out) = alloc_full(
        &s.gpu,
        s.client,
        s.subdevice,
        0x72,
        0x79,
        Some(ep.as_bytes()),
    );
    let out = NV0005_ALLOC_PARAMETERS::read_from_bytes(&out.unwrap()).unwrap();
    assert_eq!(out.hSrcResource, s.subdevice);
    assert_eq!(free(&s.ctl, s.client, s.device), NV_OK);
    assert_eq!(d.live_objects(), 1, "the event survives its notifier");
    assert_eq!(free(&s.ctl, s.client, 0x72), NV_OK);
    assert_eq!(d.live_objects(), 0);
}

#[test]
fn test_client_free_frees_objects_and_os_events() {
    let d = sim(1);
    let s = stack(&d, 0);
    os_event_object(&s, 0x72);
    alloc(
        &s.ctl,
        s.client,
        s.device,
        0x71,
        0x3e,
        Some(&mem_params(1 << 16, 120)),
    );
    assert_eq!(free(&s.ctl, s.client, s.client), NV_OK);
    let st = d.stats();
    assert_eq!(
        (
            st.live_clients,
            st.live_objects,
            st.os_events,
            st.allocated_memory
        ),
        (0, 0, 0, 0)
    );
}

#[test]
fn test_closing_files_frees_everything() {
    let d = sim(1);
    let s = stack(&d, 0);
    os_event_object(&s, 0x72);
    alloc(
        &s.ctl,
        s.client,
        s.device,
        0x71,
        0x40,
        Some(&mem_params(1 << 30, 120)),
    );
    assert_ne!(d.stats(), SimStats::default());
    drop(s);
    assert_eq!(d.stats(), SimStats::default());
}

#[test]
fn test_control_file_outlives_its_close_while_registered() {
    let d = sim(1);
    let Stack {
        ctl, gpu, client, ..
    } = stack(&d, 0);
    drop(ctl);
    // nvidia0 still holds the control file (REGISTER_FD took a reference): nothing freed yet.
    let st = d.stats();
    assert_eq!((st.open_files, st.live_clients, st.live_objects), (2, 1, 2));
    assert_eq!(d.client_handles(), vec![client]);
    drop(gpu);
    assert_eq!(d.stats(), SimStats::default());
}

#[test]
fn test_gpu_file_close_frees_only_its_own_os_events() {
    let d = sim(1);
    let s = stack(&d, 0);
    let mut ev = nv_ioctl_alloc_os_event_t::new_zeroed();
    ev.hClient = s.client;
    ev.fd = s.gpu.id();
    assert_eq!(esc(&s.gpu, NV_ESC_ALLOC_OS_EVENT, &ev).1.Status, NV_OK);
    ev.fd = s.ctl.id();
    assert_eq!(esc(&s.ctl, NV_ESC_ALLOC_OS_EVENT, &ev).1.Status, NV_OK);
    let Stack { ctl, gpu, .. } = s;
    drop(gpu);
    assert_eq!(d.stats().os_events, 1);
    assert_eq!(
        d.live_clients(),
        1,
        "the clients belong to the control file"
    );
    drop(ctl);
    assert_eq!(d.stats(), SimStats::default());
}

#[test]
fn test_attached_gpus_follow_opens_and_attach_refs() {
    let d = sim(2);
    let ctl = open(&d, NodeKind::Ctl);
    assert_eq!(d.stats().attached_gpus, 0);
    let g1 = open(&d, NodeKind::Gpu(1));
    assert_eq!(d.stats().attached_gpus, 1);
    let mut call = esc_call(
        NV_ESC_ATTACH_GPUS_TO_FD,
        &d.config().gpus[0].gpu_id().to_ne_bytes(),
    );
    ctl.ioctl(&mut call).unwrap();
    assert_eq!(d.stats().attached_gpus, 2);
    drop(g1);
    assert_eq!(d.stats().attached_gpus, 1);
    drop(ctl);
    assert_eq!(d.stats(), SimStats::default());
}

#[test]
fn test_two_gpus_devices_and_memory_per_gpu() {
    let d = sim(2);
    let ctl = open(&d, NodeKind::Ctl);
    let mut call = esc_call(NV_ESC_CARD_INFO, &[0; 2 * 72]);
    ctl.ioctl(&mut call).unwrap();
    let c1 = nv_ioctl_card_info_t::read_from_prefix(&call.params[72..])
        .unwrap()
        .0;
    assert_eq!((c1.valid, c1.minor_number, c1.gpu_id), (1, 1, 0x2a00));
    let g0 = open(&d, NodeKind::Gpu(0));
    let g1 = open(&d, NodeKind::Gpu(1));
    register(&g0, &ctl).unwrap();
    let h = client(&ctl);
    let d0 = device(&ctl, h, 0x10, 0);
    let d1 = device(&ctl, h, 0x20, 1);
    let s1 = subdevice(&ctl, h, d1, 0x21);
    alloc(&ctl, h, d0, 0x11, 0x40, Some(&mem_params(2 << 30, 120)));
    alloc(&ctl, h, d1, 0x22, 0x40, Some(&mem_params(3 << 30, 120)));
    assert_eq!(
        (d.allocated_video_memory(0), d.allocated_video_memory(1)),
        (2 << 30, 3 << 30)
    );
    let (s, bus) = ctrl(
        &ctl,
        h,
        s1,
        cmd::BUS_GET_PCI_INFO,
        &NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS::new_zeroed(),
    );
    assert_eq!((s, bus.pciDeviceId), (NV_OK, 0x2330_10de));
    let gid = NV2080_CTRL_GPU_GET_GID_INFO_PARAMS::new_zeroed();
    let (_, gid) = ctrl(&ctl, h, s1, cmd::GPU_GET_GID_INFO, &gid);
    assert_eq!(cstr(&gid.data), d.config().gpus[1].uuid_string());
    let (_, mask) = ctrl(&ctl, h, h, cmd::GPU_GET_DEVICE_IDS, &0u32);
    assert_eq!(mask, 0b11);
    drop((g0, g1, ctl));
    assert_eq!(d.stats(), SimStats::default());
}

#[test]
fn test_two_drivers_are_independent() {
    let a = sim(1);
    let b = sim(1);
    let ca = open(&a, NodeKind::Ctl);
    let cb = open(&b, NodeKind::Ctl);
    assert_ne!(ca.id(), cb.id(), "file ids never collide across instances");
    let ha = client(&ca);
    let hb = client(&cb);
    assert_eq!((ha, hb), (0xc1d0_0000, 0xc1d0_0000));
    assert_eq!(free(&ca, ha, ha), NV_OK);
    assert_eq!(b.live_clients(), 1);
    assert_eq!(a.live_clients(), 0);
}

#[test]
fn test_client_handles_are_distinct_and_recycled_after_wrap_only() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let h: Vec<u32> = (0..3).map(|_| client(&ctl)).collect();
    assert_eq!(h, vec![0xc1d0_0000, 0xc1d0_0001, 0xc1d0_0002]);
    free(&ctl, h[0], h[0]);
    assert_eq!(client(&ctl), 0xc1d0_0003);
}

#[test]
fn test_concurrent_clients_from_many_threads() {
    let d = sim(1);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let d = Arc::clone(&d);
            std::thread::spawn(move || {
                for _ in 0..20 {
                    let s = stack(&d, 0);
                    alloc(
                        &s.ctl,
                        s.client,
                        s.device,
                        0x71,
                        0x40,
                        Some(&mem_params(1 << 20, 120)),
                    );
                    assert_eq!(free(&s.ctl, s.client, s.client), NV_OK);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(d.stats(), SimStats::default());
}

// ---- other driver versions ----------------------------------------------------------------

fn sim_at(version: &str, n: usize) -> Arc<SimDriver> {
    let v: DriverVersion = version.parse().unwrap();
    SimDriver::new(SimConfig::default_gpus(n).with_version(v))
}

#[test]
fn test_580_layouts() {
    let d = sim_at("580.142", 1);
    let s = stack(&d, 0);
    assert_eq!(s.ctl.node(), NodeKind::Ctl);
    // GET_PROBED_IDS grew gpuFlags (384 bytes); the 535 size is now wrong.
    let (st, out) = control(
        &s.ctl,
        s.client,
        s.client,
        cmd::GPU_GET_PROBED_IDS,
        &[0xff; 384],
    );
    assert_eq!(st, NV_OK);
    assert_eq!(u32::from_ne_bytes(out[..4].try_into().unwrap()), 0x1800);
    assert!(out[256..].iter().all(|&b| b == 0));
    let (st, _) = control(
        &s.ctl,
        s.client,
        s.client,
        cmd::GPU_GET_PROBED_IDS,
        &[0; 256],
    );
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);
    // GPU_GET_INFO_V2 is 564 bytes, FB_GET_INFO_V2 1028, CLASSLIST_V2 804.
    let mut gi = vec![0u8; 564];
    gi[..4].copy_from_slice(&1u32.to_ne_bytes());
    gi[4..8].copy_from_slice(&0x2cu32.to_ne_bytes());
    let (st, gi) = control(&s.ctl, s.client, s.subdevice, cmd::GPU_GET_INFO_V2, &gi);
    assert_eq!(
        (st, u32::from_ne_bytes(gi[8..12].try_into().unwrap())),
        (NV_OK, 0x900)
    );
    let (st, _) = control(
        &s.ctl,
        s.client,
        s.device,
        cmd::DEVICE_GPU_GET_CLASSLIST_V2,
        &[0; 804],
    );
    assert_eq!(st, NV_OK);
    // BUILD_VERSION_V2 carries driverBranch since 560.
    let (st, bv) = control(
        &s.ctl,
        s.client,
        s.client,
        cmd::SYSTEM_GET_BUILD_VERSION_V2,
        &[0; 1032],
    );
    assert_eq!(st, NV_OK);
    assert_eq!(cstr(&bv[..256]), "580.142");
    assert_eq!(cstr(&bv[512..768]), "r580_00");
    // NV_MEMORY_ALLOCATION_PARAMS is 128 bytes since 545: a 120-byte buffer cannot be copied.
    let (st, _) = alloc(
        &s.ctl,
        s.client,
        s.device,
        0x71,
        0x40,
        Some(&mem_params(4096, 120)),
    );
    assert_eq!(st, NV_ERR_INVALID_ADDRESS);
    let (st, _) = alloc(
        &s.ctl,
        s.client,
        s.device,
        0x71,
        0x40,
        Some(&mem_params(4096, 128)),
    );
    assert_eq!(st, NV_OK);
    // WAIT_OPEN_COMPLETE exists since 550.
    let (r, w) = esc(
        &s.gpu,
        NV_ESC_WAIT_OPEN_COMPLETE,
        &nv_ioctl_wait_open_complete_t {
            rc: 7,
            adapterStatus: 7,
        },
    );
    assert_eq!((r.unwrap(), w.rc, w.adapterStatus), (0, 0, 0));
}

#[test]
fn test_535_has_no_wait_open_complete() {
    let d = sim(1);
    let gpu = open(&d, NodeKind::Gpu(0));
    let (r, _) = esc(
        &gpu,
        NV_ESC_WAIT_OPEN_COMPLETE,
        &nv_ioctl_wait_open_complete_t {
            rc: 0,
            adapterStatus: 0,
        },
    );
    assert_eq!(errno(r), Some(EINVAL));
}

#[test]
fn test_595_name_string_is_ascii_only() {
    let d = sim_at("595.45.04", 1);
    let s = stack(&d, 0);
    let (st, name) = control(
        &s.ctl,
        s.client,
        s.subdevice,
        cmd::GPU_GET_NAME_STRING,
        &[0; 68],
    );
    assert_eq!(st, NV_OK);
    assert_eq!(cstr(&name[4..]), "NVIDIA H100 80GB HBM3");
    let mut uni = [0u8; 68];
    uni[0] = 1; // NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_UNICODE
    let (st, _) = control(
        &s.ctl,
        s.client,
        s.subdevice,
        cmd::GPU_GET_NAME_STRING,
        &uni,
    );
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);
}

#[test]
fn test_every_tree_version_runs_the_init_stack() {
    for node in nvproxy_abi::nodes() {
        let d = SimDriver::new(SimConfig::default_gpus(1).with_version(node.version));
        assert_eq!(d.version(), node.version.to_string());
        let s = stack(&d, 0);
        let major = d.driver_version().major();
        let (st, _) = control(
            &s.ctl,
            s.client,
            s.subdevice,
            cmd::GPU_GET_NAME_STRING,
            &[0; 132],
        );
        let want = if major >= 595 {
            NV_ERR_INVALID_ARGUMENT
        } else {
            NV_OK
        };
        assert_eq!(st, want, "{}", node.version);
        drop(s);
        assert_eq!(d.stats(), SimStats::default(), "{}", node.version);
    }
}

#[test]
fn test_unknown_version_and_bad_configs_are_refused() {
    let mut c = SimConfig::default_gpus(1);
    c.version = "536.1.01".parse().unwrap();
    assert!(SimDriver::try_new(c).is_err());
    let mut c = SimConfig::default_gpus(2);
    c.gpus[1].minor = 0;
    assert!(matches!(
        SimDriver::try_new(c),
        Err(nvsim::SimError::DuplicateMinor(0))
    ));
    let mut c = SimConfig::default_gpus(2);
    c.gpus[1].pci_bus = c.gpus[0].pci_bus;
    assert!(matches!(
        SimDriver::try_new(c),
        Err(nvsim::SimError::DuplicateGpuId(_))
    ));
}

#[test]
fn test_stats_display_is_readable() {
    let d = sim(1);
    let _s = stack(&d, 0);
    assert_eq!(
        d.stats().to_string(),
        "2 open files, 1 clients, 2 objects, 0 OS events, 0 bytes allocated, 1 GPUs attached"
    );
}

#[test]
fn test_os_event_freed_while_referenced_lives_until_its_rm_event_goes() {
    let d = sim(1);
    let s = stack(&d, 0);
    os_event_object(&s, 0x72);
    let mut fe = nv_ioctl_free_os_event_t::new_zeroed();
    fe.hClient = s.client;
    fe.fd = s.gpu.id();
    assert_eq!(esc(&s.gpu, NV_ESC_FREE_OS_EVENT, &fe).1.Status, NV_OK);
    assert_eq!(d.stats().os_events, 1, "still referenced by the RM event");
    assert_eq!(
        esc(&s.gpu, NV_ESC_FREE_OS_EVENT, &fe).1.Status,
        NV_ERR_INVALID_EVENT
    );
    // The fd can be registered again at once, and a new RM event refers to the new one.
    os_event_object(&s, 0x73);
    assert_eq!(d.stats().os_events, 2);
    assert_eq!(free(&s.ctl, s.client, 0x72), NV_OK);
    assert_eq!(d.stats().os_events, 1);
    drop(s);
    assert_eq!(d.stats(), SimStats::default());
}

#[test]
fn test_unknown_client_is_always_invalid_object_handle_from_555() {
    let d = sim_at("580.142", 1);
    let ctl = open(&d, NodeKind::Ctl);
    let h = client(&ctl);
    assert_eq!(
        free(&ctl, h - 0x400, h - 0x400),
        NV_ERR_INVALID_OBJECT_HANDLE
    );
}
