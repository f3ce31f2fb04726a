//! GPU and system memory quotas through the proxy on `nvsim` (`vidmem.rs`): two instances on
//! one GPU with 10 GiB each; allocations past an instance's quota get `NV_ERR_NO_MEMORY`
//! without reaching the driver; frees, closed files and dups/exports behave as the driver's
//! references do; the FB info controls show the quota and the instance's own use. System
//! memory (`Quotas::system_memory`: pages the driver takes from the host unaccounted) counts
//! in one host pool from every path that allocates it, apart from video memory; a checkpoint
//! holding more than the quota it is restored under is refused.

mod common;

use common::*;
use ioctl_proxy::*;
use nvproxy_abi::ioctl::{NV_ESC_RM_ALLOC_MEMORY, NV_ESC_RM_VID_HEAP_CONTROL, nv_iowr};
use nvproxy_abi::status::*;
use nvproxy_abi::structs::{NVOS32_PARAMETERS, nv_ioctl_nvos02_parameters_with_fd};
use nvsim::{SimConfig, SimDriver, SimStats};
use std::sync::Arc;
use zerocopy::{FromZeros, IntoBytes};

const GIB: u64 = 1 << 30;
const QUOTA: u64 = 10 * GIB;
const SYS_QUOTA: u64 = 4 * GIB;
const LOCAL_USER: u32 = 0x40;
const SYSTEM: u32 = 0x3e;
/// `NV_MEMORY_EXTENDED_USER` (EGM).
const EGM: u32 = 0x42;
/// `NVOS32_ATTR2_USE_EGM` (24).
const ATTR2_USE_EGM: u32 = 1 << 24;
/// `NVOS32_ATTR_LOCATION_PCI` (26:25).
const ATTR_PCI: u32 = 1 << 25;
/// `NVOS02_FLAGS_MAPPING_NO_MAP` (31:30); location PCI, contiguous (0).
const OS02_NO_MAP: u32 = 1 << 30;
/// `NVOS02_FLAGS_ALLOC_NONE` (17:16).
const OS02_ALLOC_NONE: u32 = 1 << 16;
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
    gpu: OpenId,
    client: u32,
    device: u32,
    subdevice: u32,
}

fn instance(sim: &Arc<SimDriver>, name: &str, quota: Option<u64>) -> Inst {
    instance_with(sim, name, quota, None)
}

/// An instance with a GPU memory quota `gpu_quota` and a system memory quota `system`.
fn instance_with(
    sim: &Arc<SimDriver>,
    name: &str,
    gpu_quota: Option<u64>,
    system: Option<u64>,
) -> Inst {
    let mut policy = InstancePolicy::new(name, nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0]);
    policy.quotas.gpu_memory = gpu_quota;
    policy.quotas.system_memory = system;
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
        gpu,
        client,
        device,
        subdevice,
    }
}

impl Inst {
    fn vid(&mut self, h: u32, bytes: u64) -> u32 {
        self.mem(h, LOCAL_USER, bytes)
    }

    /// `RM_ALLOC` of memory class `class`, `bytes`, as `h`.
    fn mem(&mut self, h: u32, class: u32, bytes: u64) -> u32 {
        let mut p = vec![0u8; MEM_PARAMS];
        wr64(&mut p, SIZE_AT, bytes);
        let mut top = vec![0u8; 48];
        wr32(&mut top, 0, self.client);
        wr32(&mut top, 4, self.device);
        wr32(&mut top, 8, h);
        wr32(&mut top, 12, class);
        self.t.mem.map(SIM_PARAMS, &p);
        wr64(&mut top, 16, SIM_PARAMS);
        wr32(&mut top, 32, u32::try_from(p.len()).unwrap());
        let (_, out) = self.t.ioctl(self.ctl, nv_iowr(0x2b, 48), &top);
        rd32(&out, 40)
    }

    /// Allocates a client and a device through `ctl` and makes them (and `ctl`) the ones the
    /// other helpers use.
    fn use_new_client_on(&mut self, ctl: OpenId) {
        let (s, client) = self.t.alloc(ctl, 0, 0, 0x41, &[]);
        assert_eq!(s, NV_OK);
        let (s, device) = self.t.alloc(ctl, client, client, 0x80, &[0; 56]);
        assert_eq!(s, NV_OK);
        (self.ctl, self.client, self.device) = (ctl, client, device);
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
        self.vid_heap_at(h, bytes, 0)
    }

    /// `VID_HEAP_CONTROL` `ALLOC_SIZE` of `bytes` with `attr` (location VIDMEM: 0).
    fn vid_heap_at(&mut self, h: u32, bytes: u64, attr: u32) -> u32 {
        self.vid_heap_at2(h, bytes, attr, 0)
    }

    /// The same with `attr2`.
    fn vid_heap_at2(&mut self, h: u32, bytes: u64, attr: u32, attr2: u32) -> u32 {
        let mut p = NVOS32_PARAMETERS::new_zeroed();
        p.hRoot = self.client;
        p.hObjectParent = self.device;
        p.function = nvproxy_abi::structs::NVOS32_FUNCTION_ALLOC_SIZE;
        let mut b = p.as_bytes().to_vec();
        wr32(&mut b, 44, h); // AllocSize.hMemory
        wr32(&mut b, 52, 0x4000); // flags: MEMORY_HANDLE_PROVIDED
        wr32(&mut b, 56, attr); // AllocSize.attr
        wr32(&mut b, 144, attr2); // AllocSize.attr2
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

    /// `RM_ALLOC_MEMORY` of `NV01_MEMORY_SYSTEM`, `bytes` (`limit + 1`), on the GPU node
    /// (the escape is `NV_ACTUAL_DEVICE_ONLY`).
    fn alloc_memory(&mut self, h: u32, bytes: u64, flags: u32) -> u32 {
        type P = nv_ioctl_nvos02_parameters_with_fd;
        let mut p = P::new_zeroed();
        p.params.hRoot = self.client;
        p.params.hObjectParent = self.device;
        p.params.hObjectNew = h;
        p.params.hClass = SYSTEM;
        p.params.flags = flags;
        p.params.limit = bytes - 1;
        p.fd = -1;
        let cmd = nv_iowr(NV_ESC_RM_ALLOC_MEMORY, size_of::<P>());
        let (r, out) = self.t.ioctl(self.gpu, cmd, p.as_bytes());
        assert_eq!(r, 0);
        rd32(&out, std::mem::offset_of!(P, params.status))
    }

    fn used(&self) -> u64 {
        self.t.proxy.gpu_memory_used()[0].1
    }

    fn sys_used(&self) -> u64 {
        self.t.proxy.system_memory_used()
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
    // The GPU file registered the control file: the two go together.
    a.t.proxy.release(a.gpu);
    assert_eq!(a.used(), 10 * GIB);
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

#[test]
fn test_rm_alloc_of_system_memory_counts_and_stops_at_the_quota() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut a = instance_with(&sim, "a", None, Some(SYS_QUOTA));
    assert_eq!(a.mem(0x100, SYSTEM, 3 * GIB), NV_OK);
    assert_eq!(a.sys_used(), 3 * GIB);
    let before = (sim.allocated_memory(), sim.stats().live_objects);
    assert_eq!(a.mem(0x101, SYSTEM, GIB + 1), NV_ERR_NO_MEMORY);
    assert_eq!(
        (sim.allocated_memory(), sim.stats().live_objects),
        before,
        "refused before the driver"
    );
    // Admitted by pages: what is left fits exactly.
    assert_eq!(a.mem(0x101, SYSTEM, GIB - 4095), NV_OK);
    assert_eq!(a.sys_used(), SYS_QUOTA);
    // Video memory is another pool (no GPU memory quota here).
    assert_eq!(a.vid(0x102, 20 * GIB), NV_OK);
    assert_eq!(a.sys_used(), SYS_QUOTA);
    assert_eq!(a.free(0x100), NV_OK);
    assert_eq!(a.sys_used(), GIB);
    assert_eq!(a.mem(0x100, SYSTEM, 3 * GIB), NV_OK);
}

#[test]
fn test_every_system_memory_path_counts_in_one_pool() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut a = instance_with(&sim, "a", None, Some(SYS_QUOTA));
    assert_eq!(a.vid_heap_at(0x200, GIB, ATTR_PCI), NV_OK);
    assert_eq!(a.sys_used(), GIB);
    assert_eq!(a.alloc_memory(0x201, 2 * GIB, OS02_NO_MAP), NV_OK);
    assert_eq!(a.sys_used(), 3 * GIB);
    assert_eq!(a.vid_heap_at(0x202, GIB + 1, ATTR_PCI), NV_ERR_NO_MEMORY);
    assert_eq!(
        a.alloc_memory(0x202, GIB + 4096, OS02_NO_MAP),
        NV_ERR_NO_MEMORY
    );
    assert_eq!(a.mem(0x202, SYSTEM, GIB + 1), NV_ERR_NO_MEMORY);
    // What the driver refuses without allocating (ALLOC_NONE: NV_ERR_INVALID_FLAGS) is not
    // held against the quota.
    assert_eq!(
        a.alloc_memory(0x203, 8 * GIB, OS02_NO_MAP | OS02_ALLOC_NONE),
        NV_ERR_INVALID_FLAGS
    );
    assert_eq!(a.sys_used(), 3 * GIB);
    assert_eq!(a.free(0x201), NV_OK);
    assert_eq!(a.free(0x200), NV_OK);
    assert_eq!(a.sys_used(), 0);
    assert_eq!(a.alloc_memory(0x201, SYS_QUOTA, OS02_NO_MAP), NV_OK);
}

/// EGM (`VID_HEAP_CONTROL` with `NVOS32_ATTR2_USE_EGM`, which from 550 allocates
/// `NV_MEMORY_EXTENDED_USER`) is host memory the driver carves for the GPU on self-hosted
/// systems ("EGM pool is the same as sysmem pool", `egmmemValidateParams`, `egm_mem.c`): it
/// counts in the host pool, so a tenant cannot take host memory past its quota by asking for
/// it as EGM. nvsim's GPUs have no local EGM and answer `NV_ERR_INVALID_ARGUMENT`, as the
/// driver does: nothing stays counted. `RM_ALLOC` of the class is in no version's table.
#[test]
fn test_bypass_egm_counts_against_the_system_memory_quota() {
    let sim = SimDriver::new(SimConfig::default_gpus(1).with_version("580.142".parse().unwrap()));
    let mut a = instance_with(&sim, "a", None, Some(SYS_QUOTA));
    assert_eq!(a.vid_heap_at(0x100, 3 * GIB, ATTR_PCI), NV_OK);
    // The proxy's answer; the driver's would be NV_ERR_INVALID_ARGUMENT.
    assert_eq!(
        a.vid_heap_at2(0x101, GIB + 1, 0, ATTR2_USE_EGM),
        NV_ERR_NO_MEMORY
    );
    assert_eq!(
        a.vid_heap_at2(0x101, GIB, 0, ATTR2_USE_EGM),
        NV_ERR_INVALID_ARGUMENT
    );
    assert_eq!(a.sys_used(), 3 * GIB);
    let (c, d, ctl) = (a.client, a.device, a.ctl);
    let (s, _) = a.t.alloc(ctl, c, d, EGM, &[0; 128]);
    assert_eq!(s, NV_ERR_INVALID_CLASS);
}

/// Before 550 attr2 bit 24 means nothing to the driver, which allocates by location: the bit
/// must not make video memory look like uncounted EGM.
#[test]
fn test_bypass_attr2_bit_24_before_550_is_counted_by_its_location() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut a = instance_with(&sim, "a", Some(QUOTA), Some(SYS_QUOTA));
    assert_eq!(
        a.vid_heap_at2(0x100, QUOTA + 1, 0, ATTR2_USE_EGM),
        NV_ERR_NO_MEMORY
    );
    assert_eq!(a.vid_heap_at2(0x100, 2 * GIB, 0, ATTR2_USE_EGM), NV_OK);
    assert_eq!(a.used(), 2 * GIB);
    assert_eq!(
        a.vid_heap_at2(0x101, SYS_QUOTA + 1, ATTR_PCI, ATTR2_USE_EGM),
        NV_ERR_NO_MEMORY
    );
    assert_eq!(a.vid_heap_at2(0x101, GIB, ATTR_PCI, ATTR2_USE_EGM), NV_OK);
    assert_eq!(a.sys_used(), GIB);
}

#[test]
fn test_bypass_a_dup_of_system_memory_then_free_of_the_original_keeps_it_counted() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut a = instance_with(&sim, "a", None, Some(SYS_QUOTA));
    assert_eq!(a.mem(0x100, SYSTEM, 3 * GIB), NV_OK);
    assert_eq!(a.dup(0x300, 0x100), NV_OK);
    assert_eq!(a.sys_used(), 3 * GIB, "a dup shares the block");
    assert_eq!(a.free(0x100), NV_OK);
    assert_eq!(a.sys_used(), 3 * GIB, "the dup still holds the memory");
    assert_eq!(a.mem(0x101, SYSTEM, 2 * GIB), NV_ERR_NO_MEMORY);
    assert_eq!(a.free(0x300), NV_OK);
    assert_eq!(a.sys_used(), 0);
}

/// The GPU file registered the control file (`NV_ESC_REGISTER_FD`), so the driver keeps the
/// control file, its clients and their memory after the tenant closes it, until the GPU file
/// goes (`escape.c`: the link holds the file's reference): the memory stays counted until
/// then. Before, a tenant could close and reopen control files to hold memory past its quota.
#[test]
fn test_bypass_a_registered_control_file_keeps_its_memory_counted_after_its_close() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut a = instance_with(&sim, "a", Some(QUOTA), Some(SYS_QUOTA));
    assert_eq!(a.mem(0x100, SYSTEM, 3 * GIB), NV_OK);
    assert_eq!(a.vid(0x101, 8 * GIB), NV_OK);
    a.t.proxy.release(a.ctl);
    assert_eq!(a.t.proxy.lingering_opens(), 1);
    assert!(
        a.t.proxy.release(a.ctl).is_empty(),
        "a second release changes nothing"
    );
    assert_eq!(
        sim.allocated_host_memory(),
        3 * GIB,
        "the driver keeps the file"
    );
    assert_eq!((a.sys_used(), a.used()), (3 * GIB, 8 * GIB));
    // A new control file cannot take what the old one still holds.
    let ctl = a.t.proxy.open(FrontendNode::Ctl).unwrap();
    a.use_new_client_on(ctl);
    assert_eq!(a.mem(0x200, SYSTEM, GIB + 1), NV_ERR_NO_MEMORY);
    assert_eq!(a.vid(0x201, 2 * GIB + 1), NV_ERR_NO_MEMORY);
    // The GPU file's release takes the old control file with it.
    a.t.proxy.release(a.gpu);
    assert_eq!(a.t.proxy.lingering_opens(), 0);
    assert_eq!((a.sys_used(), a.used()), (0, 0));
    assert_eq!(sim.allocated_host_memory(), 0);
    a.t.proxy.release_all();
    assert_eq!(sim.stats(), SimStats::default());
}

/// A client allocated through a file that registered a control file belongs to that control
/// file in the driver (`escape.c`: `clientOSInfo = nvfp->ctl_nvfp`), so closing the first
/// file leaves the client and its memory alive: they stay counted until the control file
/// goes. Before, they left the books with the first file (found by the fuzzer).
#[test]
fn test_bypass_a_client_made_through_a_registered_file_lives_with_the_control_file() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut a = instance_with(&sim, "a", None, Some(SYS_QUOTA));
    let ctl = a.ctl;
    let x = a.t.proxy.open(FrontendNode::Ctl).unwrap();
    a.t.fds.add(5, ctl);
    let (r, _) = a.t.ioctl(x, nv_iowr(0xc9, 4), &5i32.to_ne_bytes());
    assert_eq!(r, 0, "REGISTER_FD of the second control file");
    a.use_new_client_on(x);
    assert_eq!(a.mem(0x100, SYSTEM, 3 * GIB), NV_OK);
    a.t.proxy.release(x);
    assert_eq!(
        sim.allocated_host_memory(),
        3 * GIB,
        "filed under the control file"
    );
    assert_eq!(a.sys_used(), 3 * GIB);
    a.t.proxy.release(a.gpu);
    a.t.proxy.release(ctl);
    assert_eq!((a.sys_used(), sim.allocated_host_memory()), (0, 0));
}

/// A device allocated without params is device instance 0 (`deviceConstruct`: the class
/// less `NV01_DEVICE_0`): memory under it counts on that GPU, in an instance of two GPUs too,
/// where before it was refused under a quota as of an unknown GPU and uncounted without one
/// (found by the fuzzer).
#[test]
fn test_memory_under_a_device_allocated_without_params_counts_on_gpu_0() {
    let sim = SimDriver::new(SimConfig::default_gpus(2));
    let mut policy = InstancePolicy::new("two", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0, 1]);
    policy.quotas.gpu_memory = Some(QUOTA);
    let mut t = SimTenant::from_proxy(Proxy::for_host(policy, sim.clone()).unwrap());
    let ctl = t.proxy.open(FrontendNode::Ctl).unwrap();
    // An open GPU node attaches the GPU (nvidia_open).
    let _gpu = t.proxy.open(FrontendNode::Gpu(0)).unwrap();
    let (s, client) = t.alloc(ctl, 0, 0, 0x41, &[]);
    assert_eq!(s, NV_OK);
    let (s, device) = t.alloc(ctl, client, client, 0x80, &[]);
    assert_eq!(s, NV_OK, "device 0 from no params");
    let mut p = vec![0u8; MEM_PARAMS];
    wr64(&mut p, SIZE_AT, 2 * GIB);
    let (s, _) = t.alloc(ctl, client, device, LOCAL_USER, &p);
    assert_eq!(s, NV_OK);
    let used = t.proxy.gpu_memory_used();
    assert_eq!(used, [(0, 2 * GIB), (1, 0)]);
    assert_eq!(sim.allocated_video_memory(0), 2 * GIB);
}

/// A registration the driver refuses (the GPU file has its control file already) holds
/// nothing: the other control file goes at its close.
#[test]
fn test_a_refused_registration_holds_nothing() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut a = instance_with(&sim, "a", None, Some(SYS_QUOTA));
    let ctl = a.t.proxy.open(FrontendNode::Ctl).unwrap();
    let (s, client) = a.t.alloc(ctl, 0, 0, 0x41, &[]);
    assert_eq!(s, NV_OK);
    a.t.fds.add(4, ctl);
    a.t.mem.map(SIM_TOP, &4i32.to_ne_bytes());
    a.t.mem.begin_request();
    let t = &mut a.t;
    let r = t.proxy.ioctl(
        a.gpu,
        &CALLER,
        nv_iowr(0xc9, 4),
        SIM_TOP,
        &mut t.mem,
        &t.fds,
    );
    assert!(r.is_err(), "a second REGISTER_FD of the GPU file: {r:?}");
    let objects = a.t.proxy.object_count();
    assert_eq!(a.t.proxy.release(ctl), [client]);
    assert_eq!(a.t.proxy.lingering_opens(), 0);
    assert_eq!(a.t.proxy.object_count(), objects - 1);
}

#[test]
fn test_a_closed_file_gives_the_system_memory_back() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut a = instance_with(&sim, "a", None, Some(SYS_QUOTA));
    assert_eq!(a.mem(0x100, SYSTEM, 3 * GIB), NV_OK);
    a.t.proxy.release(a.gpu);
    a.t.proxy.release(a.ctl);
    assert_eq!(a.sys_used(), 0);
    a.t.proxy.release_all();
    assert_eq!(sim.stats(), SimStats::default());
}

#[test]
fn test_quotas_of_both_pools_hold_apart() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut a = instance_with(&sim, "a", Some(2 * GIB), Some(SYS_QUOTA));
    assert_eq!(a.mem(0x100, LOCAL_USER, 2 * GIB), NV_OK);
    assert_eq!(a.mem(0x101, LOCAL_USER, 4096), NV_ERR_NO_MEMORY);
    assert_eq!(a.mem(0x102, SYSTEM, SYS_QUOTA), NV_OK);
    assert_eq!(a.mem(0x103, SYSTEM, 4096), NV_ERR_NO_MEMORY);
    assert_eq!(a.t.proxy.gpu_memory_used()[0].1, 2 * GIB);
    assert_eq!(a.sys_used(), SYS_QUOTA);
}

#[test]
fn test_system_memory_without_a_quota_is_not_limited_but_counted() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut a = instance_with(&sim, "a", None, None);
    assert_eq!(a.mem(0x100, SYSTEM, 40 * GIB), NV_OK);
    assert_eq!(a.sys_used(), 40 * GIB);
}

/// A restore holds to the system memory quota as allocations do: a checkpoint whose objects
/// hold more than the quota it is restored under is refused before the driver is asked.
#[test]
fn test_restore_past_the_system_memory_quota_is_refused() {
    let old = SimDriver::new(SimConfig::default_gpus(1));
    let mut a = instance_with(&old, "a", None, None);
    assert_eq!(a.mem(0x100, SYSTEM, 2 * GIB), NV_OK);
    let ckpt = a.t.proxy.checkpoint().unwrap();
    a.t.proxy.release_all();
    let new = SimDriver::new(SimConfig::default_gpus(1));
    let policy = |q| {
        let mut p = InstancePolicy::new("a", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0]);
        p.quotas.system_memory = q;
        p
    };
    let err = Proxy::restore(&ckpt, policy(Some(GIB)), new.clone(), &[]).unwrap_err();
    assert!(err.to_string().contains("system memory"), "{err}");
    assert_eq!(
        new.stats(),
        SimStats::default(),
        "nothing reached the driver"
    );
    let restored = Proxy::restore(&ckpt, policy(Some(SYS_QUOTA)), new.clone(), &[]).unwrap();
    assert_eq!(restored.proxy.system_memory_used(), 2 * GIB);
}
