//! What `nvidia-smi -q` and `nvidia-smi topo -m` ask beyond the initialisation: `NV_ESC_NUMA_INFO`
//! and the controls of `control_smi.rs` (and the deprecated `BUS_GET_INFO`), against the default
//! simulated H100s.

mod common;

use common::*;
use host_driver::NodeKind;
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const NV_OK: u32 = 0;
const NV_ERR_INVALID_ARGUMENT: u32 = 0x1f;

const SYSTEM_GET_P2P_CAPS: u32 = 0x0000_0127;
const QUERY_SW_STATE_PERSISTENCE: u32 = 0x0080_0288;
const GET_VGX_CAPS: u32 = 0x0080_028e;
const GET_BRAND_CAPS: u32 = 0x0080_0294;
const GET_RESET_STATUS: u32 = 0x2080_01ab;
const GET_DRAIN_AND_RESET_STATUS: u32 = 0x2080_01ae;
const BIOS_GET_INFO: u32 = 0x2080_0802;
const BUS_GET_INFO: u32 = 0x2080_1802;
const FB_GET_REMAPPED_ROWS: u32 = 0x2080_1344;

#[test]
fn test_numa_info_on_a_gpu_node_is_no_numa_node_and_einval_on_ctl() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let gpu = open(&d, NodeKind::Gpu(0));
    let (r, _) = esc(
        &ctl,
        NV_ESC_SYS_PARAMS,
        &nv_ioctl_sys_params_t {
            memblock_size: 128 << 20,
        },
    );
    assert_eq!(r.unwrap(), 0);
    // The caller's garbage in every field, as a client's stack would hold.
    let mut p = nv_ioctl_numa_info_t::new_zeroed();
    p.nid = 7;
    p.status = 3;
    p.numa_mem_addr = 0xdead_0000;
    p.numa_mem_size = 1 << 30;
    p.use_auto_online = 1;
    p.offline_addresses.numEntries = 64;
    p.offline_addresses.addresses[0] = 0x1234;
    let (r, out) = esc(&gpu, NV_ESC_NUMA_INFO, &p);
    assert_eq!(r.unwrap(), 0);
    assert_eq!(
        (out.nid, out.status, out.memblock_size),
        (-1, NV_IOCTL_NUMA_STATUS_DISABLED, 128 << 20)
    );
    assert_eq!((out.numa_mem_addr, out.numa_mem_size), (0, 0));
    assert_eq!(
        (out.use_auto_online, out.offline_addresses.numEntries),
        (0, 0)
    );
    // On the control node: NV_ACTUAL_DEVICE_ONLY.
    assert_eq!(errno(esc(&ctl, NV_ESC_NUMA_INFO, &p).0), Some(libc::EINVAL));
    // Another size: EINVAL.
    let mut call = esc_call(NV_ESC_NUMA_INFO, &[0u8; 552]);
    assert_eq!(errno(gpu.ioctl(&mut call)), Some(libc::EINVAL));
}

#[test]
fn test_device_controls_persistence_vgx_brand() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, out) = control(
        &s.ctl,
        s.client,
        s.device,
        QUERY_SW_STATE_PERSISTENCE,
        &[0xff; 4],
    );
    assert_eq!(
        (st, u32::from_ne_bytes(out[..4].try_into().unwrap())),
        (NV_OK, 1)
    );
    let (st, out) = control(&s.ctl, s.client, s.device, GET_VGX_CAPS, &[0xff]);
    assert_eq!((st, out[0]), (NV_OK, 0));
    let (st, out) = control(&s.ctl, s.client, s.device, GET_BRAND_CAPS, &[0xff; 4]);
    assert_eq!((st, out), (NV_OK, vec![0; 4]));
    // Device controls on the subdevice: not exported there.
    let (st, _) = control(&s.ctl, s.client, s.subdevice, GET_VGX_CAPS, &[0]);
    assert_ne!(st, NV_OK);
}

#[test]
fn test_subdevice_state_controls_of_a_healthy_gpu() {
    let d = sim(1);
    let s = stack(&d, 0);
    for cmd in [GET_RESET_STATUS, GET_DRAIN_AND_RESET_STATUS] {
        let (st, out) = control(&s.ctl, s.client, s.subdevice, cmd, &[0xff]);
        assert_eq!((st, out[0]), (NV_OK, 0), "{cmd:#x}");
    }
    let (st, out) = control(
        &s.ctl,
        s.client,
        s.subdevice,
        FB_GET_REMAPPED_ROWS,
        &[0xaa; 6152],
    );
    assert_eq!(st, NV_OK);
    assert!(out.iter().all(|&b| b == 0), "no rows remapped, no flags");
}

/// `{index, data}` list bytes with `data` poisoned.
fn info_list(indices: &[u32]) -> Vec<u8> {
    indices
        .iter()
        .flat_map(|&i| [i.to_ne_bytes(), 0xeeee_eeee_u32.to_ne_bytes()].concat())
        .collect()
}

fn list_data(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(8)
        .map(|c| u32::from_ne_bytes(c[4..8].try_into().unwrap()))
        .collect()
}

/// A deprecated list control: `{listSize u32, pad, list NvP64}` with the list nested at 8.
fn list_control(s: &Stack, cmd: u32, indices: &[u32]) -> (u32, Vec<u32>) {
    let mut top = [0u8; 16];
    let n = u32::try_from(indices.len()).expect("a short list");
    top[..4].copy_from_slice(&n.to_ne_bytes());
    top[8..].copy_from_slice(&0x7000_0000u64.to_ne_bytes());
    let (st, call) = control_call(
        &s.ctl,
        s.client,
        s.subdevice,
        cmd,
        &top,
        vec![(8, info_list(indices))],
    );
    (st, list_data(&call.nested[1].data))
}

#[test]
fn test_bios_get_info_is_a_gpu_without_vbios() {
    let d = sim(1);
    let s = stack(&d, 0);
    // REVISION and OEM_REVISION, as NVML asks them.
    assert_eq!(
        list_control(&s, BIOS_GET_INFO, &[0, 1]),
        (NV_OK, vec![0, 0])
    );
    // An index past NV2080_CTRL_BIOS_INFO_MAX_SIZE, or too many entries.
    assert_eq!(
        list_control(&s, BIOS_GET_INFO, &[0, 0xf]).0,
        NV_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        list_control(&s, BIOS_GET_INFO, &[0; 16]).0,
        NV_ERR_INVALID_ARGUMENT
    );
}

#[test]
fn test_deprecated_bus_get_info_answers_as_v2() {
    let d = sim(1);
    let s = stack(&d, 0);
    let g = d.config().gpus[0].clone();
    // TYPE (PCI Express = 3), the link caps (gen | width << 4), BUS and DEVICE.
    let (st, data) = list_control(&s, BUS_GET_INFO, &[0x00, 0x03, 0x0f, 0x10]);
    assert_eq!(st, NV_OK);
    assert_eq!(
        data,
        vec![3, g.pcie_gen | (g.pcie_width << 4), u32::from(g.pci_bus), 0]
    );
}

#[test]
fn test_p2p_caps_of_simulated_gpus_is_no_peer_path() {
    let d = sim(2);
    let s0 = stack(&d, 0);
    let _s1 = stack(&d, 1);
    let ids = [d.config().gpus[0].gpu_id(), d.config().gpus[1].gpu_id()];
    let mut p = NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS::new_zeroed();
    p.gpuIds[..2].copy_from_slice(&ids);
    p.gpuCount = 2;
    p.p2pCaps = 0xffff_ffff;
    p.p2pCapsStatus = [0; 9];
    p.busPeerIds = 0x7000_0000;
    let (st, call) = control_call(
        &s0.ctl,
        s0.client,
        s0.client,
        SYSTEM_GET_P2P_CAPS,
        p.as_bytes(),
        vec![(160, vec![0u8; 16])],
    );
    assert_eq!(st, NV_OK);
    let out =
        NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS::read_from_bytes(&call.nested[0].data).unwrap();
    assert_eq!(
        (out.p2pCaps, out.p2pOptimalReadCEs, out.p2pOptimalWriteCEs),
        (0, 0, 0)
    );
    assert_eq!(out.p2pCapsStatus, [5; 9], "NOT_SUPPORTED everywhere");
    assert!(
        call.nested[1].data.chunks_exact(4).all(|c| c == [0xff; 4]),
        "BUS_INVALID_PEER"
    );
    // An id that is no attached GPU, and a count of 0.
    p.gpuIds[1] = 0x4242;
    let (st, _) = control(
        &s0.ctl,
        s0.client,
        s0.client,
        SYSTEM_GET_P2P_CAPS,
        p.as_bytes(),
    );
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);
    p.gpuCount = 0;
    let (st, _) = control(
        &s0.ctl,
        s0.client,
        s0.client,
        SYSTEM_GET_P2P_CAPS,
        p.as_bytes(),
    );
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);
}
