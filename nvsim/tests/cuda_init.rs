//! The frontend part of a CUDA initialisation, step by step, against the default simulated H100,
//! with the values checked; then the frees, and the counters back at zero.

mod common;

use common::*;
use host_driver::NodeKind;
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use nvsim::control::cmd;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

fn version_request(cmd: u32, s: &str) -> nv_ioctl_rm_api_version_t {
    let mut p = nv_ioctl_rm_api_version_t::new_zeroed();
    p.cmd = cmd;
    p.versionString[..s.len()].copy_from_slice(s.as_bytes());
    p
}

#[test]
fn test_cuda_frontend_init_sequence_against_h100() {
    let d = sim(1);
    let g = d.config().gpus[0].clone();
    let ctl = open(&d, NodeKind::Ctl);

    // 1. Version check (strict), as libcuda's first ioctl.
    let (r, v) = esc(
        &ctl,
        NV_ESC_CHECK_VERSION_STR,
        &version_request(0, "535.261.03"),
    );
    assert_eq!(r.unwrap(), 0);
    assert_eq!(v.reply, NV_RM_API_VERSION_REPLY_RECOGNIZED);

    // 2. SYS_PARAMS.
    let (r, _) = esc(
        &ctl,
        NV_ESC_SYS_PARAMS,
        &nv_ioctl_sys_params_t {
            memblock_size: 128 << 20,
        },
    );
    assert_eq!(r.unwrap(), 0);

    // 3. CARD_INFO with 32 entries (0xC90046C8).
    let mut call = esc_call(NV_ESC_CARD_INFO, &[0xaau8; 32 * 72]);
    assert_eq!(call.cmd, 0xc900_46c8);
    assert_eq!(ctl.ioctl(&mut call).unwrap(), 0);
    let c0 = nv_ioctl_card_info_t::read_from_prefix(&call.params)
        .unwrap()
        .0;
    assert_eq!(c0.valid, 1);
    assert_eq!(c0.gpu_id, 0x1800);
    assert_eq!(
        (c0.pci_info.domain, c0.pci_info.bus, c0.pci_info.slot),
        (0, 0x18, 0)
    );
    assert_eq!(
        (c0.pci_info.vendor_id, c0.pci_info.device_id),
        (0x10de, 0x2330)
    );
    assert_eq!(c0.minor_number, 0);
    assert_eq!(c0.fb_size, 128 << 30);
    assert!(
        call.params[72..].iter().all(|&b| b == 0),
        "other entries zeroed, invalid"
    );

    // 4. Root client: driver-chosen handle, class forced to NV01_ROOT_CLIENT.
    let (r, p, _) = alloc_full(&ctl, 0, 0, 0, 0x0001, None);
    assert_eq!(r.unwrap(), 0);
    assert_eq!(p.status, 0);
    assert_eq!(p.hObjectNew, 0xc1d0_0000);
    assert_eq!(p.hClass, 0x41);
    let h = p.hObjectNew;

    // 5. SYSTEM_GET_BUILD_VERSION: size query with NULL buffers, then the strings.
    let q = NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS::new_zeroed();
    let (s, q) = ctrl(&ctl, h, h, cmd::SYSTEM_GET_BUILD_VERSION, &q);
    assert_eq!(s, 0);
    let n = q.sizeOfStrings as usize;
    assert!(n > "535.261.03".len());
    let (s, call) = control_call(
        &ctl,
        h,
        h,
        cmd::SYSTEM_GET_BUILD_VERSION,
        q.as_bytes(),
        vec![(8, vec![0; n]), (16, vec![0; n]), (24, vec![0; n])],
    );
    assert_eq!(s, 0);
    assert_eq!(cstr(&call.nested[1].data), "535.261.03");
    assert!(cstr(&call.nested[2].data).contains("r535"));

    // 6. CLIENT_SET_INHERITED_SHARE_POLICY, SYSTEM_GET_FABRIC_STATUS.
    let pol = NV0000_CTRL_CLIENT_SET_INHERITED_SHARE_POLICY_PARAMS::new_zeroed();
    assert_eq!(
        ctrl(&ctl, h, h, cmd::CLIENT_SET_INHERITED_SHARE_POLICY, &pol).0,
        0
    );
    let (s, fab) = ctrl(&ctl, h, h, cmd::SYSTEM_GET_FABRIC_STATUS, &0u32);
    assert_eq!((s, fab), (0, 1)); // NV0000_CTRL_GET_SYSTEM_FABRIC_STATUS_SKIP

    // 7. GPU_GET_PROBED_IDS, GPU_ATTACH_IDS.
    let probed = NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS::new_zeroed();
    let (s, probed) = ctrl(&ctl, h, h, cmd::GPU_GET_PROBED_IDS, &probed);
    assert_eq!(s, 0);
    assert_eq!(&probed.gpuIds[..2], &[0x1800, 0xffff_ffff]);
    assert_eq!(probed.excludedGpuIds[0], 0xffff_ffff);
    let mut att = NV0000_CTRL_GPU_ATTACH_IDS_PARAMS::new_zeroed();
    att.gpuIds = [0xffff_ffff; 32];
    att.gpuIds[0] = 0x1800;
    assert_eq!(ctrl(&ctl, h, h, cmd::GPU_ATTACH_IDS, &att).0, 0);

    // 8. Open nvidia0 and link it to the control file.
    let gpu = open(&d, NodeKind::Gpu(0));
    assert_eq!(register(&gpu, &ctl).unwrap(), 0);

    // 9. GPU_GET_ATTACHED_IDS, GPU_GET_ID_INFO_V2, GPU_GET_UUID_FROM_GPU_ID, GET_PCI_INFO.
    let (s, ids) = ctrl(
        &ctl,
        h,
        h,
        cmd::GPU_GET_ATTACHED_IDS,
        &NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS::new_zeroed(),
    );
    assert_eq!(s, 0);
    assert_eq!(&ids.gpuIds[..2], &[0x1800, 0xffff_ffff]);
    let mut info = NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS::new_zeroed();
    info.gpuId = 0x1800;
    let (s, info) = ctrl(&ctl, h, h, cmd::GPU_GET_ID_INFO_V2, &info);
    assert_eq!(s, 0);
    assert_eq!((info.deviceInstance, info.subDeviceInstance), (0, 0));
    assert_eq!(info.numaId, u32::MAX);
    let mut u = NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS::new_zeroed();
    u.gpuId = 0x1800;
    let (s, u) = ctrl(&ctl, h, h, cmd::GPU_GET_UUID_FROM_GPU_ID, &u);
    assert_eq!(s, 0);
    assert_eq!(u.uuidStrLen, 41);
    assert_eq!(cstr(&u.gpuUuid), g.uuid_string());
    let mut pci = NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS::new_zeroed();
    pci.gpuId = 0x1800;
    let (s, pci) = ctrl(&ctl, h, h, cmd::GPU_GET_PCI_INFO, &pci);
    assert_eq!((s, pci.domain, pci.bus, pci.slot), (0, 0, 0x18, 0));

    // 10. Device and subdevice.
    let dev = device(&ctl, h, H_DEVICE, info.deviceInstance);
    let sub = subdevice(&ctl, h, dev, H_SUBDEVICE);

    // 11. Class lists: the pointer form (count, then list) and V2.
    let cl = NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS::new_zeroed();
    let (s, cl) = ctrl(&ctl, h, dev, cmd::DEVICE_GPU_GET_CLASSLIST, &cl);
    assert_eq!(s, 0);
    let n = cl.numClasses as usize;
    let (s, call) = control_call(
        &ctl,
        h,
        dev,
        cmd::DEVICE_GPU_GET_CLASSLIST,
        cl.as_bytes(),
        vec![(8, vec![0; 4 * n])],
    );
    assert_eq!(s, 0);
    let classes: Vec<u32> = call.nested[1]
        .data
        .chunks(4)
        .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert!(classes.contains(&0xcbc0), "HOPPER_COMPUTE_A");
    assert!(classes.contains(&0xc86f), "HOPPER_CHANNEL_GPFIFO_A");
    let (s, v2) = control(&ctl, h, dev, cmd::DEVICE_GPU_GET_CLASSLIST_V2, &[0u8; 644]);
    assert_eq!(s, 0);
    assert_eq!(u32::from_ne_bytes(v2[..4].try_into().unwrap()) as usize, n);
    let (s, nsub) = ctrl(&ctl, h, dev, cmd::DEVICE_GPU_GET_NUM_SUBDEVICES, &0u32);
    assert_eq!((s, nsub), (0, 1));

    // 12. GPU_GET_INFO_V2: SM version 9.0.
    let mut gi = vec![0u8; 516];
    gi[..4].copy_from_slice(&2u32.to_ne_bytes());
    gi[4..8].copy_from_slice(&0x2cu32.to_ne_bytes()); // GPU_SM_VERSION
    gi[12..16].copy_from_slice(&0x1fu32.to_ne_bytes()); // SYSMEM_ACCESS
    let (s, gi) = control(&ctl, h, sub, cmd::GPU_GET_INFO_V2, &gi);
    assert_eq!(s, 0);
    let e: [NV2080_CTRL_GPU_INFO; 2] = FromBytes::read_from_bytes(&gi[4..20]).unwrap();
    assert_eq!((e[0].data, e[1].data), (0x900, 1));

    // 13. Name, short name, UUID (ascii and binary), PCI ids, arch.
    let (s, name) = control(&ctl, h, sub, cmd::GPU_GET_NAME_STRING, &[0u8; 132]);
    assert_eq!(s, 0);
    assert_eq!(cstr(&name[4..]), "NVIDIA H100 80GB HBM3");
    let (s, short) = ctrl(
        &ctl,
        h,
        sub,
        cmd::GPU_GET_SHORT_NAME_STRING,
        &NV2080_CTRL_GPU_GET_SHORT_NAME_STRING_PARAMS::new_zeroed(),
    );
    assert_eq!(
        (s, cstr(&short.gpuShortNameString)),
        (0, "GH100".to_owned())
    );
    let gid = NV2080_CTRL_GPU_GET_GID_INFO_PARAMS::new_zeroed();
    let (s, gid) = ctrl(&ctl, h, sub, cmd::GPU_GET_GID_INFO, &gid);
    assert_eq!((s, gid.length), (0, 41));
    assert_eq!(cstr(&gid.data), g.uuid_string());
    let mut gidb = NV2080_CTRL_GPU_GET_GID_INFO_PARAMS::new_zeroed();
    gidb.flags = 2; // FORMAT_BINARY
    let (s, gidb) = ctrl(&ctl, h, sub, cmd::GPU_GET_GID_INFO, &gidb);
    assert_eq!((s, gidb.length), (0, 16));
    assert_eq!(&gidb.data[..16], &g.uuid);
    let (s, bus) = ctrl(
        &ctl,
        h,
        sub,
        cmd::BUS_GET_PCI_INFO,
        &NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS::new_zeroed(),
    );
    assert_eq!(
        (s, bus.pciDeviceId, bus.pciSubSystemId),
        (0, 0x2330_10de, 0x16c1_10de)
    );
    let (s, arch) = ctrl(
        &ctl,
        h,
        sub,
        cmd::MC_GET_ARCH_INFO,
        &NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS::new_zeroed(),
    );
    assert_eq!((s, arch.architecture), (0, 0x180));

    // 14. FB_GET_INFO_V2: total RAM, free heap (KiB), L2.
    let mut fb = vec![0u8; 436];
    fb[..4].copy_from_slice(&3u32.to_ne_bytes());
    fb[4..8].copy_from_slice(&0x08u32.to_ne_bytes()); // TOTAL_RAM_SIZE
    fb[12..16].copy_from_slice(&0x16u32.to_ne_bytes()); // HEAP_FREE
    fb[20..24].copy_from_slice(&0x1bu32.to_ne_bytes()); // L2CACHE_SIZE
    let (s, fb) = control(&ctl, h, sub, cmd::FB_GET_INFO_V2, &fb);
    assert_eq!(s, 0);
    let e: [NV2080_CTRL_FB_INFO; 3] = FromBytes::read_from_bytes(&fb[4..28]).unwrap();
    assert_eq!(e[0].data, 80 << 20);
    assert_eq!(e[1].data, 80 << 20);
    assert_eq!(e[2].data, 50 << 20);

    // 15. GR_GET_INFO with its list behind a pointer: SM version, CUDA cores.
    let mut gr = NV2080_CTRL_GR_GET_INFO_PARAMS::new_zeroed();
    gr.grInfoListSize = 2;
    let list = [
        NV2080_CTRL_GR_INFO {
            index: 0x0c,
            data: 0,
        },
        NV2080_CTRL_GR_INFO {
            index: 0x1d,
            data: 0,
        },
    ];
    let (s, call) = control_call(
        &ctl,
        h,
        sub,
        cmd::GR_GET_INFO,
        gr.as_bytes(),
        vec![(8, list.as_bytes().to_vec())],
    );
    assert_eq!(s, 0);
    let out: [NV2080_CTRL_GR_INFO; 2] = FromBytes::read_from_bytes(&call.nested[1].data).unwrap();
    assert_eq!((out[0].data, out[1].data), (0x900, 132 * 128));

    // 16. OS event on nvidia0 and an NV01_EVENT_OS_EVENT on the subdevice (allowed on nvidia#).
    let mut ev = nv_ioctl_alloc_os_event_t::new_zeroed();
    ev.hClient = h;
    ev.hDevice = dev;
    ev.fd = gpu.id();
    let (r, ev) = esc(&gpu, NV_ESC_ALLOC_OS_EVENT, &ev);
    assert_eq!((r.unwrap(), ev.Status), (0, 0));
    let mut ep = NV0005_ALLOC_PARAMETERS::new_zeroed();
    ep.hParentClient = h;
    ep.hClass = 0x79;
    ep.notifyIndex = 0;
    ep.data = u64::try_from(gpu.id()).expect("an open fd");
    let (s, hev) = alloc(&gpu, h, sub, 0xe000_0001, 0x79, Some(ep.as_bytes()));
    assert_eq!((s, hev), (0, 0xe000_0001));

    // 17. Memory: 1 GiB of video memory, 4 KiB of system memory, a VA space.
    let (s, hmem) = alloc(
        &ctl,
        h,
        dev,
        0xf000_0001,
        0x40,
        Some(&mem_params(1 << 30, 120)),
    );
    assert_eq!((s, hmem), (0, 0xf000_0001));
    let (s, _) = alloc(
        &ctl,
        h,
        dev,
        0xf000_0002,
        0x3e,
        Some(&mem_params(4096, 120)),
    );
    assert_eq!(s, 0);
    let (s, _) = alloc(&ctl, h, dev, 0xf000_0003, 0x90f1, Some(&[0u8; 48]));
    assert_eq!(s, 0);
    assert_eq!(d.allocated_video_memory(0), 1 << 30);
    assert_eq!(d.allocated_memory(), (1 << 30) + 4096);
    let mut fb = vec![0u8; 436];
    fb[..4].copy_from_slice(&1u32.to_ne_bytes());
    fb[4..8].copy_from_slice(&0x16u32.to_ne_bytes()); // HEAP_FREE
    let (_, fb) = control(&ctl, h, sub, cmd::FB_GET_INFO_V2, &fb);
    assert_eq!(
        u32::from_ne_bytes(fb[8..12].try_into().unwrap()),
        (80 << 20) - (1 << 20)
    );
    assert_eq!(d.live_objects(), 6);

    // 18. Frees: the event, its OS event, the memory, then the client with the rest.
    assert_eq!(free(&ctl, h, hev), 0);
    let mut fe = nv_ioctl_free_os_event_t::new_zeroed();
    fe.hClient = h;
    fe.fd = gpu.id();
    let (r, fe) = esc(&gpu, NV_ESC_FREE_OS_EVENT, &fe);
    assert_eq!((r.unwrap(), fe.Status), (0, 0));
    assert_eq!(free(&ctl, h, hmem), 0);
    assert_eq!(d.allocated_video_memory(0), 0);
    assert_eq!(free(&ctl, h, h), 0);
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
    assert_eq!(st.open_files, 2);

    drop(gpu);
    drop(ctl);
    assert_eq!(d.stats(), nvsim::SimStats::default());
}

#[test]
fn test_relaxed_version_check_matches_branch_only() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let (r, _) = esc(
        &ctl,
        NV_ESC_CHECK_VERSION_STR,
        &version_request(u32::from(b'1'), "535.1.1"),
    );
    assert_eq!(r.unwrap(), 0);
}

#[test]
fn test_version_query_returns_driver_version() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let (r, v) = esc(
        &ctl,
        NV_ESC_CHECK_VERSION_STR,
        &version_request(u32::from(b'2'), ""),
    );
    assert_eq!(r.unwrap(), 0);
    assert_eq!(cstr(&v.versionString), "535.261.03");
}

#[test]
fn test_rm_alloc_nvos21_layout_works() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let p = NVOS21_PARAMETERS::new_zeroed();
    let mut call = esc_call(NV_ESC_RM_ALLOC, p.as_bytes());
    assert_eq!(call.cmd, NV_ESC_RM_ALLOC_NVOS21);
    assert_eq!(ctl.ioctl(&mut call).unwrap(), 0);
    let p = NVOS21_PARAMETERS::read_from_bytes(&call.params).unwrap();
    assert_eq!((p.status, p.hObjectNew, p.hClass), (0, 0xc1d0_0000, 0x41));
}

#[test]
fn test_build_version_v2_and_driver_chosen_handles() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, out) = control(
        &s.ctl,
        s.client,
        s.client,
        cmd::SYSTEM_GET_BUILD_VERSION_V2,
        &[0u8; 776],
    );
    assert_eq!(st, 0);
    assert_eq!(cstr(&out[..256]), "535.261.03");
    // hObjectNew 0: the resource server picks a handle from RS_UNIQUE_HANDLE_BASE.
    let (st, h) = alloc(&s.ctl, s.client, s.device, 0, 0x90f1, Some(&[0u8; 48]));
    assert_eq!((st, h), (0, 0xcaf0_0000));
    let (st, h) = alloc(&s.ctl, s.client, s.device, 0, 0x90f1, Some(&[0u8; 48]));
    assert_eq!((st, h), (0, 0xcaf0_0001));
}

#[test]
fn test_xfer_cmd_carries_card_info() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let x = nv_ioctl_xfer_t {
        cmd: u32::from(NV_ESC_CARD_INFO),
        size: 72 * 4,
        ptr: 0x1234_0000,
    };
    let mut call = esc_call(NV_ESC_IOCTL_XFER_CMD, x.as_bytes());
    call.nested.push(host_driver::NestedBuf {
        parent: None,
        offset: 8,
        data: vec![0; 72 * 4].into(),
    });
    assert_eq!(ctl.ioctl(&mut call).unwrap(), 0);
    let c0 = nv_ioctl_card_info_t::read_from_prefix(&call.nested[0].data)
        .unwrap()
        .0;
    assert_eq!((c0.valid, c0.gpu_id), (1, 0x1800));
}
