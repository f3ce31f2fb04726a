//! The controls and classes of NVIDIA's own clients' initialisation (`control_init.rs`,
//! `HOPPER_USERMODE_A`, `procfs.rs`): the values and statuses the driver source gives for the
//! simulated H100, in the layouts of `nvproxy_abi::structs::client`.

mod common;

use common::*;
use nvproxy_abi::DriverVersion;
use nvproxy_abi::structs::*;
use nvsim::status::*;
use nvsim::{SimConfig, SimDriver};
use zerocopy::{FromBytes, FromZeros};

const SYNC_GPU_BOOST_GROUP_INFO: u32 = 0x0000_0a04;
const GPU_DETACH_IDS: u32 = 0x0000_0216;
const GPU_QUERY_DRAIN_STATE: u32 = 0x0000_0279;
const GPU_GET_MEMOP_ENABLE: u32 = 0x0000_027b;
const CLIENT_GET_ADDR_SPACE_TYPE: u32 = 0x0000_0d01;
const HOST_GET_CAPS_V2: u32 = 0x0080_1402;
const FB_GET_CAPS_V2: u32 = 0x0080_1307;
const GET_VIRTUALIZATION_MODE: u32 = 0x0080_0289;
const GET_ACTIVE_PARTITION_IDS: u32 = 0x2080_018b;
const QUERY_COMPUTE_MODE_RULES: u32 = 0x2080_0131;
const GET_ENGINES_V2: u32 = 0x2080_0170;
const BUS_GET_INFO_V2: u32 = 0x2080_1823;
const BUS_GET_PCI_BAR_INFO: u32 = 0x2080_1803;
const TIME_CORRELATION: u32 = 0x2080_0406;
const GSP_GET_FEATURES: u32 = 0x2080_3601;
const GR_GET_CAPS_V2: u32 = 0x2080_1227;
const SM_ISSUE_RATE: u32 = 0x2080_1230;
const GLOBAL_SM_ORDER: u32 = 0x2080_121b;
const GPC_MASK: u32 = 0x2080_122a;
const TPC_MASK: u32 = 0x2080_122b;
const CE_GET_ALL_CAPS: u32 = 0x2080_2a0a;
const HOPPER_USERMODE_A: u32 = 0xc661;
const GET_GPU_FABRIC_PROBE_INFO: u32 = 0x2080_01a3;
const NV_CONFIDENTIAL_COMPUTE: u32 = 0xcb33;
const CC_GET_CAPABILITIES: u32 = 0xcb33_0101;
const CC_GET_GPUS_STATE: u32 = 0xcb33_0104;

#[test]
fn test_client_controls_answer_as_the_driver() {
    let d = sim(1);
    let s = stack(&d, 0);
    let id = d.config().gpus[0].gpu_id();

    let (st, q) = ctrl(
        &s.ctl,
        s.client,
        s.client,
        SYNC_GPU_BOOST_GROUP_INFO,
        &NV0000_SYNC_GPU_BOOST_GROUP_INFO_PARAMS::new_zeroed(),
    );
    assert_eq!((st, q.groupCount), (NV_OK, 0));

    let mut q = NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS::new_zeroed();
    q.gpuId = id;
    q.drainState = 7;
    let (st, out) = ctrl(&s.ctl, s.client, s.client, GPU_QUERY_DRAIN_STATE, &q);
    assert_eq!((st, out.drainState, out.flags), (NV_OK, 0, 0));
    q.gpuId = 0x1234;
    let (st, _) = ctrl(&s.ctl, s.client, s.client, GPU_QUERY_DRAIN_STATE, &q);
    assert_eq!(st, NV_ERR_OBJECT_NOT_FOUND);

    let mut ids = [u32::MAX; 32];
    ids[0] = id;
    let (st, _) = ctrl(&s.ctl, s.client, s.client, GPU_DETACH_IDS, &ids);
    assert_eq!(st, NV_OK);
    ids[0] = 0x1234;
    let (st, _) = ctrl(&s.ctl, s.client, s.client, GPU_DETACH_IDS, &ids);
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);

    let (st, q) = ctrl(&s.ctl, s.client, s.client, GPU_GET_MEMOP_ENABLE, &u32::MAX);
    assert_eq!((st, q), (NV_OK, 0));

    let (st, q) = ctrl(&s.ctl, s.client, s.device, HOST_GET_CAPS_V2, &[0xffu8; 3]);
    assert_eq!((st, q), (NV_OK, [0x04, 0, 0]));
    let (st, q) = ctrl(&s.ctl, s.client, s.device, FB_GET_CAPS_V2, &[0u8; 3]);
    assert_eq!((st, q), (NV_OK, [0x0b, 0x81, 0x02]));
    let (st, q) = ctrl(&s.ctl, s.client, s.device, GET_VIRTUALIZATION_MODE, &7u32);
    assert_eq!((st, q), (NV_OK, 0));
    // A device control on the subdevice is not exported there.
    let (st, _) = ctrl(&s.ctl, s.client, s.subdevice, HOST_GET_CAPS_V2, &[0u8; 3]);
    assert_eq!(st, NV_ERR_NOT_SUPPORTED);

    let mut q = NV2080_CTRL_GPU_GET_ACTIVE_PARTITION_IDS_PARAMS::new_zeroed();
    q.partitionCount = 5;
    let (st, _) = ctrl(&s.ctl, s.client, s.subdevice, GET_ACTIVE_PARTITION_IDS, &q);
    assert_eq!(st, NV_ERR_NOT_SUPPORTED, "MIG is off");

    let (st, q) = ctrl(
        &s.ctl,
        s.client,
        s.subdevice,
        QUERY_COMPUTE_MODE_RULES,
        &9u32,
    );
    assert_eq!((st, q), (NV_OK, 0));

    let (st, q) = ctrl(
        &s.ctl,
        s.client,
        s.subdevice,
        GSP_GET_FEATURES,
        &NV2080_CTRL_GSP_GET_FEATURES_PARAMS::new_zeroed(),
    );
    assert_eq!(
        (st, q.gspFeatures, q.bValid, q.bDefaultGspRmGpu),
        (NV_OK, 1, 1, 1)
    );
    assert_eq!(cstr(&q.firmwareVersion), "535.261.03");

    let (st, out) = control(
        &s.ctl,
        s.client,
        s.subdevice,
        GET_GPU_FABRIC_PROBE_INFO,
        &[7; 40],
    );
    assert_eq!(
        (st, out[0]),
        (NV_OK, 0),
        "probe state UNSUPPORTED: no NVSwitch fabric"
    );
}

#[test]
fn test_bus_controls_describe_a_gen5_x16_gpu_and_its_bars() {
    let d = sim(1);
    let s = stack(&d, 0);
    let gpu = d.config().gpus[0].clone();

    let mut q = NV2080_CTRL_BUS_GET_INFO_V2_PARAMS::new_zeroed();
    let indices = [0x00u32, 0x03, 0x0b, 0x0f, 0x10, 0x2c, 0x2d];
    q.busInfoListSize = u32::try_from(indices.len()).expect("a short list");
    for (e, &i) in q.busInfoList.iter_mut().zip(&indices) {
        e.index = i;
    }
    let (st, out) = ctrl(&s.ctl, s.client, s.subdevice, BUS_GET_INFO_V2, &q);
    assert_eq!(st, NV_OK);
    let data: Vec<u32> = out.busInfoList[..indices.len()]
        .iter()
        .map(|e| e.data)
        .collect();
    assert_eq!(
        data,
        [3, 0x105, 0x5, u32::from(gpu.pci_bus), 0, 0, 0x44_4000],
        "PCI Express, gen5 x16, coherent, bus, device, domain, gen info"
    );
    // An index past the last one is INVALID_ARGUMENT; an empty list too.
    q.busInfoList[0].index = 0x40;
    let (st, _) = ctrl(&s.ctl, s.client, s.subdevice, BUS_GET_INFO_V2, &q);
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);
    q.busInfoListSize = 0;
    let (st, _) = ctrl(&s.ctl, s.client, s.subdevice, BUS_GET_INFO_V2, &q);
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);

    let (st, q) = ctrl(
        &s.ctl,
        s.client,
        s.subdevice,
        BUS_GET_PCI_BAR_INFO,
        &NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS::new_zeroed(),
    );
    assert_eq!((st, q.pciBarCount), (NV_OK, 3));
    assert_eq!(q.pciBarInfo[0].barSizeBytes, 16 << 20);
    assert_eq!(q.pciBarInfo[0].barOffset, gpu.bar0_address);
    let mib = u32::try_from(gpu.bar1_bytes >> 20).expect("BAR1 is 128 GiB");
    assert_eq!(q.pciBarInfo[1].barSize, mib);
    assert_eq!(q.pciBarInfo[3].barSizeBytes, 0);
}

#[test]
fn test_time_correlation_samples_gpu_and_cpu_time() {
    let d = sim(1);
    let s = stack(&d, 0);
    let mut q = NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS::new_zeroed();
    q.cpuClkId = 1; // OSTIME
    q.sampleCount = 3;
    let (st, out) = ctrl(&s.ctl, s.client, s.subdevice, TIME_CORRELATION, &q);
    assert_eq!(st, NV_OK);
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let now_us = u64::try_from(now_us).expect("microseconds since 1970 fit in a u64");
    for smp in &out.samples[..3] {
        // cpuTime in microseconds, gpuTime (PTIMER) in nanoseconds of the same clock.
        assert!(
            smp.cpuTime <= now_us && now_us - smp.cpuTime < 10_000_000,
            "{smp:?}"
        );
        assert!(smp.gpuTime / 1000 >= smp.cpuTime, "{smp:?}");
    }
    assert_eq!(out.samples[3].gpuTime, 0);
    q.sampleCount = 17;
    let (st, _) = ctrl(&s.ctl, s.client, s.subdevice, TIME_CORRELATION, &q);
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);
    q.sampleCount = 1;
    q.cpuClkId = 0x11; // GSP's clock: only with GSP-RM offload, not modelled
    let (st, _) = ctrl(&s.ctl, s.client, s.subdevice, TIME_CORRELATION, &q);
    assert_eq!(st, NV_ERR_NOT_SUPPORTED);
}

#[test]
fn test_gr_controls_match_the_sm_layout() {
    let d = sim(1);
    let s = stack(&d, 0);
    let gpu = d.config().gpus[0].clone();

    let (st, q) = ctrl(
        &s.ctl,
        s.client,
        s.subdevice,
        GR_GET_CAPS_V2,
        &NV2080_CTRL_GR_GET_CAPS_V2_PARAMS::new_zeroed(),
    );
    assert_eq!((st, q.bCapsPopulated), (NV_OK, 1));

    let mut q = NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_PARAMS::new_zeroed();
    q.dp = 3;
    let (st, out) = ctrl(&s.ctl, s.client, s.subdevice, SM_ISSUE_RATE, &q);
    assert_eq!((st, out.dp), (NV_OK, 0), "full-rate FP64");

    let (st, q) = ctrl(
        &s.ctl,
        s.client,
        s.subdevice,
        GPC_MASK,
        &NV2080_CTRL_GR_GET_GPC_MASK_PARAMS::new_zeroed(),
    );
    assert_eq!((st, q.gpcMask), (NV_OK, 0xff));
    let mut total = 0;
    for gpc in 0..9 {
        let mut q = NV2080_CTRL_GR_GET_TPC_MASK_PARAMS::new_zeroed();
        q.gpcId = gpc;
        let (st, q) = ctrl(&s.ctl, s.client, s.subdevice, TPC_MASK, &q);
        assert_eq!(st, NV_OK);
        total += q.tpcMask.count_ones();
    }
    assert_eq!(total, gpu.tpc_count(), "the TPC masks cover every TPC");

    let (st, out) = control(&s.ctl, s.client, s.subdevice, GLOBAL_SM_ORDER, &[0; 6168]);
    assert_eq!(st, NV_OK);
    let num_sm = u16::read_from_bytes(&out[6144..6146]).unwrap();
    let num_tpc = u16::read_from_bytes(&out[6146..6148]).unwrap();
    assert_eq!(
        (u32::from(num_sm), u32::from(num_tpc)),
        (gpu.sm_count, gpu.tpc_count())
    );
    // Every (gpc, local tpc, sm) appears once; global TPC ids run 0..numTpc.
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..usize::from(num_sm) {
        let e = <[u16; 6]>::read_from_bytes(&out[12 * i..12 * i + 12]).unwrap();
        assert!(seen.insert((e[0], e[1], e[2])), "{e:?}");
        assert!(e[3] < num_tpc);
    }
}

#[test]
fn test_ce_caps_follow_the_version_layout() {
    for (version, size, present_at) in [("535.261.03", 68usize, 64usize), ("550.163.01", 136, 128)]
    {
        let v: DriverVersion = version.parse().unwrap();
        let d = SimDriver::new(SimConfig::default_gpus(1).with_version(v));
        let s = stack(&d, 0);
        let (st, out) = control(
            &s.ctl,
            s.client,
            s.subdevice,
            CE_GET_ALL_CAPS,
            &vec![0; size],
        );
        assert_eq!(st, NV_OK, "{version}");
        assert_eq!(
            out[present_at..present_at + 4],
            0x3ffu32.to_ne_bytes(),
            "{version}"
        );
        assert_eq!(out[0] & 0x01, 0x01, "COPY0 is a GRCE ({version})");
        let (st, out) = control(&s.ctl, s.client, s.subdevice, GET_ENGINES_V2, &[0; 4]);
        assert_eq!(
            st, NV_ERR_INVALID_ARGUMENT,
            "wrong size ({version}): {out:?}"
        );
    }
}

#[test]
fn test_usermode_page_is_register_memory_of_the_subdevice() {
    let d = sim(1);
    let s = stack(&d, 0);
    // Only under a subdevice.
    let (st, _) = alloc(&s.ctl, s.client, s.device, 0, HOPPER_USERMODE_A, None);
    assert_eq!(st, NV_ERR_INVALID_OBJECT_PARENT);
    // The privileged page needs BAR1 and a kernel caller.
    let (st, _) = alloc(
        &s.ctl,
        s.client,
        s.subdevice,
        0,
        HOPPER_USERMODE_A,
        Some(&[0, 1]),
    );
    assert_eq!(st, NV_ERR_INVALID_PARAMETER);
    let (st, _) = alloc(
        &s.ctl,
        s.client,
        s.subdevice,
        0,
        HOPPER_USERMODE_A,
        Some(&[1, 1]),
    );
    assert_eq!(st, NV_ERR_INSUFFICIENT_PERMISSIONS);
    let (st, h) = alloc(&s.ctl, s.client, s.subdevice, 0, HOPPER_USERMODE_A, None);
    assert_eq!(st, NV_OK);
    let before = d.stats();
    let mut q = NV0000_CTRL_CLIENT_GET_ADDR_SPACE_TYPE_PARAMS::new_zeroed();
    q.hObject = h;
    let (st, out) = ctrl(&s.ctl, s.client, s.client, CLIENT_GET_ADDR_SPACE_TYPE, &q);
    assert_eq!((st, out.addrSpaceType), (NV_OK, 3), "REGMEM");
    q.hObject = s.subdevice;
    let (st, out) = ctrl(&s.ctl, s.client, s.client, CLIENT_GET_ADDR_SPACE_TYPE, &q);
    assert_eq!((st, out.addrSpaceType), (NV_OK, 3));
    q.hObject = 0xbad;
    let (st, _) = ctrl(&s.ctl, s.client, s.client, CLIENT_GET_ADDR_SPACE_TYPE, &q);
    assert_eq!(st, NV_ERR_OBJECT_NOT_FOUND);
    assert_eq!(before.allocated_memory, 0, "a register page is not memory");
    assert_eq!(free(&s.ctl, s.client, h), NV_OK);
}

#[test]
fn test_confidential_compute_object_reports_cc_off_on_a_capable_gpu() {
    let d = sim(1);
    let ctl = open(&d, host_driver::NodeKind::Ctl);
    let c = client(&ctl);
    // Under the client only.
    let (st, h) = alloc(
        &ctl,
        c,
        c,
        0,
        NV_CONFIDENTIAL_COMPUTE,
        Some(&c.to_ne_bytes()),
    );
    assert_eq!(st, NV_OK);
    // No GPU attached yet: the GPU manager has no CC caps.
    let (st, out) = control(&ctl, c, h, CC_GET_CAPABILITIES, &[9; 5]);
    assert_eq!((st, out), (NV_OK, vec![0, 0, 0, 0, 0]));
    let (st, out) = control(&ctl, c, h, CC_GET_GPUS_STATE, &[1]);
    assert_eq!((st, out), (NV_OK, vec![0]));
    // The control is the CC object's, not the client's.
    let (st, _) = control(&ctl, c, c, CC_GET_CAPABILITIES, &[0; 5]);
    assert_eq!(st, NV_ERR_NOT_SUPPORTED);
    // With nvidia0 open the GPU is attached: HCC-capable, CC disabled.
    let s = stack(&d, 0);
    let (st, h2) = alloc(&s.ctl, s.client, s.client, 0, NV_CONFIDENTIAL_COMPUTE, None);
    assert_eq!(st, NV_OK);
    let (st, out) = control(&s.ctl, s.client, h2, CC_GET_CAPABILITIES, &[0; 5]);
    assert_eq!((st, out), (NV_OK, vec![0, 2, 0, 0, 0]));
    let (st, _) = alloc(&s.ctl, s.client, s.device, 0, NV_CONFIDENTIAL_COMPUTE, None);
    assert_eq!(st, NV_ERR_INVALID_OBJECT_PARENT);
    assert_eq!(free(&ctl, c, h), NV_OK);
}

#[test]
fn test_proc_files_for_an_instance() {
    let cfg = SimConfig::default_gpus(2);
    let files = nvsim::procfs::proc_files(&cfg, &[1]);
    let names: Vec<_> = files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        names,
        ["params", "version", "gpus/0000:2a:00.0/information"]
    );
    assert!(files[0].text.contains("ModifyDeviceFiles: 0\n"));
}
