//! GPU memory quotas through the proxy on `nvsim` (`vidmem.rs`): two instances on one GPU with
//! 10 GiB each; allocations past an instance's quota get `NV_ERR_NO_MEMORY` without reaching
//! the driver; frees, closed files and dups/exports behave as the driver's references do; the
//! FB info controls show the quota and the instance's own use.

mod common;

use common::*;
use ioctl_proxy::*;
use nvproxy_abi::ioctl::{NV_ESC_RM_VID_HEAP_CONTROL, nv_iowr};
use nvproxy_abi::status::*;
use nvproxy_abi::structs::NVOS32_PARAMETERS;
use nvsim::{SimConfig, SimDriver};
use std::sync::Arc;
use zerocopy::{FromZeros, IntoBytes};

const GIB: u64 = 1 << 30;
const QUOTA: u64 = 10 * GIB;
const LOCAL_USER: u32 = 0x40;
/// `NV_MEMORY_ALLOCATION_PARAMS` of the default version (535): `size` at 64.
const MEM_PARAMS: usize = 120;
const SIZE_AT: usize = 64;
/// `NV2080_CTRL_CMD_FB_GET_INFO_V2`, `_INFO` and the indices.
const FB_GET_INFO_V2: u32 = 0x2080_1303;
const TOTAL_RAM_SIZE: u32 = 0x08;
const HEAP_SIZE: u32 = 0x09;
const USABLE_RAM_SIZE: u32 = 0x20;
const HEAP_FREE: u32 = 0x16;

struct Inst {
    t: SimTenant,
    ctl: OpenId,
    client: u32,
    device: u32,
    subdevice: u32,
}

fn instance(sim: &Arc<SimDriver>, name: &str, quota: Option<u64>) -> Inst {
    let mut policy = InstancePolicy::new(name, nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0]);
    policy.quotas.gpu_memory = quota;
    let mut t = SimTenant::from_proxy(Proxy::for_host(policy, sim.clone()).unwrap());
    let ctl = t.proxy.open(FrontendNode::Ctl).unwrap();
    let gpu = t.proxy.open(FrontendNode::Gpu(0)).unwrap();
    // libcuda registers the GPU file with its control file (NV_ESC_REGISTER_FD).
    t.fds.add(3, ctl);
    let (r, _) = t.ioctl(gpu, nv_iowr(0xc9, 4), &3i32.to_ne_bytes());
    assert_eq!(r, 0);
    let (s, client) = t.alloc(ctl, 0, 0, 0x41, &[]);
    assert_eq!(s, 0);
    let (device, subdevice) = (0x5d01, 0x5d02);
    for (parent, h, class, params) in [
        (client, device, 0x80, vec![0u8; 56]),
        (device, subdevice, 0x2080, vec![0u8; 4]),
    ] {
        let mut top = vec![0u8; 48];
        wr32(&mut top, 0, client);
        wr32(&mut top, 4, parent);
        wr32(&mut top, 8, h);
        wr32(&mut top, 12, class);
        t.mem.map(SIM_PARAMS, &params);
        wr64(&mut top, 16, SIM_PARAMS);
        wr32(&mut top, 32, u32::try_from(params.len()).unwrap());
        let (_, out) = t.ioctl(ctl, nv_iowr(0x2b, 48), &top);
        assert_eq!(rd32(&out, 40), 0, "class {class:#x}");
    }
    Inst {
        t,
        ctl,
        client,
        device,
        subdevice,
    }
}

impl Inst {
    fn vid(&mut self, h: u32, bytes: u64) -> u32 {
        let mut p = vec![0u8; MEM_PARAMS];
        wr64(&mut p, SIZE_AT, bytes);
        let mut top = vec![0u8; 48];
        wr32(&mut top, 0, self.client);
        wr32(&mut top, 4, self.device);
        wr32(&mut top, 8, h);
        wr32(&mut top, 12, LOCAL_USER);
        self.t.mem.map(SIM_PARAMS, &p);
        wr64(&mut top, 16, SIM_PARAMS);
        wr32(&mut top, 32, u32::try_from(p.len()).unwrap());
        let (_, out) = self.t.ioctl(self.ctl, nv_iowr(0x2b, 48), &top);
        rd32(&out, 40)
    }

    fn free(&mut self, h: u32) -> u32 {
        let mut fp = vec![0u8; 16];
        wr32(&mut fp, 0, self.client);
        wr32(&mut fp, 4, self.device);
        wr32(&mut fp, 8, h);
        let (r, out) = self.t.ioctl(self.ctl, nv_iowr(0x29, 16), &fp);
        assert_eq!(r, 0);
        rd32(&out, 12)
    }

    fn dup(&mut self, h_new: u32, src: u32) -> u32 {
        let mut p = vec![0u8; 28];
        wr32(&mut p, 0, self.client);
        wr32(&mut p, 4, self.device);
        wr32(&mut p, 8, h_new);
        wr32(&mut p, 12, self.client);
        wr32(&mut p, 16, src);
        let (r, out) = self.t.ioctl(self.ctl, nv_iowr(0x34, 28), &p);
        assert_eq!(r, 0);
        rd32(&out, 24)
    }

    fn dup_from(&mut self, h_new: u32, client: u32, src: u32) -> u32 {
        let mut p = vec![0u8; 28];
        wr32(&mut p, 0, self.client);
        wr32(&mut p, 4, self.device);
        wr32(&mut p, 8, h_new);
        wr32(&mut p, 12, client);
        wr32(&mut p, 16, src);
        let (_, out) = self.t.ioctl(self.ctl, nv_iowr(0x34, 28), &p);
        rd32(&out, 24)
    }

    fn vid_heap(&mut self, h: u32, bytes: u64) -> u32 {
        let mut p = NVOS32_PARAMETERS::new_zeroed();
        p.hRoot = self.client;
        p.hObjectParent = self.device;
        p.function = nvproxy_abi::structs::NVOS32_FUNCTION_ALLOC_SIZE;
        let mut b = p.as_bytes().to_vec();
        wr32(&mut b, 44, h); // AllocSize.hMemory
        wr32(&mut b, 52, 0x4000); // flags: MEMORY_HANDLE_PROVIDED
        wr64(&mut b, 88, bytes); // AllocSize.size
        let (r, out) = self
            .t
            .ioctl(self.ctl, nv_iowr(NV_ESC_RM_VID_HEAP_CONTROL, b.len()), &b);
        assert_eq!(r, 0);
        rd32(&out, 20) // status
    }

    fn fb(&mut self, indices: &[u32]) -> Vec<u64> {
        let mut p = vec![0u8; 4 + 8 * 0x36];
        wr32(&mut p, 0, u32::try_from(indices.len()).unwrap());
        for (i, &ix) in indices.iter().enumerate() {
            wr32(&mut p, 4 + 8 * i, ix);
        }
        let (c, s) = (self.client, self.subdevice);
        let (st, out) = self.t.control(self.ctl, c, s, FB_GET_INFO_V2, &p);
        assert_eq!(st, 0);
        (0..indices.len())
            .map(|i| u64::from(rd32(&out, 8 + 8 * i)) << 10)
            .collect()
    }

    fn used(&self) -> u64 {
        self.t.proxy.gpu_memory_used()[0].1
    }
}

fn two() -> (Arc<SimDriver>, Inst, Inst) {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let a = instance(&sim, "a", Some(QUOTA));
    let b = instance(&sim, "b", Some(QUOTA));
    (sim, a, b)
}

#[test]
fn test_two_instances_each_get_their_quota() {
    let (sim, mut a, mut b) = two();
    assert_eq!(a.vid(0x100, 8 * GIB), NV_OK);
    let before = sim.live_objects();
    assert_eq!(a.vid(0x101, 4 * GIB), NV_ERR_NO_MEMORY);
    assert_eq!(sim.live_objects(), before, "refused before the driver");
    assert_eq!(b.vid(0x100, 8 * GIB), NV_OK, "B has its own quota");
    assert_eq!((a.used(), b.used()), (8 * GIB, 8 * GIB));
    // What each sees: its quota as the size, its own use as used.
    for i in [&mut a, &mut b] {
        let v = i.fb(&[TOTAL_RAM_SIZE, HEAP_SIZE, USABLE_RAM_SIZE, HEAP_FREE]);
        assert_eq!(v, vec![QUOTA, QUOTA, QUOTA, 2 * GIB]);
    }
    // A free makes room again.
    assert_eq!(a.free(0x100), NV_OK);
    assert_eq!(a.used(), 0);
    assert_eq!(a.vid(0x101, 4 * GIB), NV_OK);
    assert_eq!(a.fb(&[HEAP_FREE]), vec![6 * GIB]);
}

#[test]
fn test_a_closed_file_gives_the_memory_back() {
    let (_sim, mut a, _b) = two();
    assert_eq!(a.vid(0x100, 10 * GIB), NV_OK);
    a.t.proxy.release(a.ctl);
    assert_eq!(a.used(), 0);
    let mut a2 = instance(&_sim, "a2", Some(QUOTA));
    assert_eq!(a2.vid(0x100, 10 * GIB), NV_OK);
    // A removed instance (every open released) gives its memory back too.
    assert_eq!(a2.used(), 10 * GIB);
    a2.t.proxy.release_all();
    assert_eq!(a2.used(), 0);
}

#[test]
fn test_freeing_the_parent_gives_the_memory_back() {
    let (_sim, mut a, _b) = two();
    assert_eq!(a.vid(0x100, 6 * GIB), NV_OK);
    let (c, d) = (a.client, a.device);
    assert_eq!(a.free(d), NV_OK);
    assert_eq!(a.used(), 0);
    let mut fp = vec![0u8; 16];
    wr32(&mut fp, 0, c);
    wr32(&mut fp, 8, c);
    let _ = a.t.ioctl(a.ctl, nv_iowr(0x29, 16), &fp);
    assert_eq!(a.used(), 0);
}

#[test]
fn test_vid_heap_allocations_count() {
    let (_sim, mut a, _b) = two();
    assert_eq!(a.vid_heap(0x200, 8 * GIB), NV_OK);
    assert_eq!(a.used(), 8 * GIB);
    assert_eq!(a.vid_heap(0x201, 4 * GIB), NV_ERR_NO_MEMORY);
    assert_eq!(a.vid(0x202, 4 * GIB), NV_ERR_NO_MEMORY);
}

#[test]
fn test_bypass_a_dup_then_free_of_the_original_keeps_it_counted() {
    let (_sim, mut a, _b) = two();
    assert_eq!(a.vid(0x100, 8 * GIB), NV_OK);
    assert_eq!(a.dup(0x300, 0x100), NV_OK);
    assert_eq!(a.used(), 8 * GIB, "a dup shares the block");
    assert_eq!(a.free(0x100), NV_OK);
    assert_eq!(a.used(), 8 * GIB, "the dup still holds the memory");
    assert_eq!(a.vid(0x101, 4 * GIB), NV_ERR_NO_MEMORY);
    assert_eq!(a.free(0x300), NV_OK);
    assert_eq!(a.used(), 0);
}

#[test]
fn test_bypass_a_dup_from_another_instance_is_refused() {
    let (_sim, mut a, mut b) = two();
    assert_eq!(b.vid(0x100, 8 * GIB), NV_OK);
    let bc = b.client;
    assert_eq!(a.dup_from(0x300, bc, 0x100), NV_ERR_INVALID_CLIENT);
    assert_eq!(a.used(), 0);
}

#[test]
fn test_bypass_fabric_memory_is_refused_under_a_quota() {
    let (_sim, mut a, _b) = two();
    let (c, d, ctl) = (a.client, a.device, a.ctl);
    let (s, _) = a.t.alloc(ctl, c, d, 0xf8, &[0; 48]);
    assert_eq!(s, NV_ERR_INVALID_CLASS);
}

#[test]
fn test_an_instance_without_a_quota_is_not_limited_but_counted() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut a = instance(&sim, "a", None);
    assert_eq!(a.vid(0x100, 40 * GIB), NV_OK);
    assert_eq!(a.used(), 40 * GIB);
    assert_eq!(a.fb(&[TOTAL_RAM_SIZE]), vec![80 * GIB]);
}
