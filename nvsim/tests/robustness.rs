//! Hostile input never panics the simulator: every escape number with odd sizes and random
//! bytes, every simulated control with random params and sizes, random nested buffers.

mod common;

use common::*;
use host_driver::{HostCall, NestedBuf, NodeKind};
use nvproxy_abi::ioctl::*;
use nvsim::SimStats;

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next().to_le_bytes()[0]).collect()
    }
    /// Random bytes of a random length below `max`.
    fn blob(&mut self, max: u64) -> Vec<u8> {
        let n = usize::try_from(self.next() % max).expect("max is small");
        self.bytes(n)
    }
}

#[test]
fn test_random_escapes_never_panic() {
    let d = sim(2);
    let mut rng = Lcg(7);
    {
        let s = stack(&d, 0);
        let uvm = open(&d, NodeKind::Uvm);
        for nr in 0..=255u8 {
            for size in [
                0usize, 1, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 72, 144, 184, 2600,
            ] {
                for f in [&s.ctl, &s.gpu, &uvm] {
                    let mut call = HostCall {
                        cmd: nv_iowr(nr, size),
                        params: rng.bytes(size).into(),
                        nested: (0..(rng.next() % 3))
                            .map(|i| NestedBuf {
                                parent: if i == 0 { None } else { Some(0) },
                                offset: (rng.next() % 32) as usize,
                                data: rng.blob(300).into(),
                            })
                            .collect(),
                    };
                    let _ = f.ioctl(&mut call);
                }
            }
        }
    }
    assert_eq!(d.stats(), SimStats::default());
}

#[test]
fn test_random_controls_never_panic() {
    use nvsim::control::cmd::*;
    let cmds = [
        SYSTEM_GET_BUILD_VERSION,
        SYSTEM_GET_FABRIC_STATUS,
        SYSTEM_GET_BUILD_VERSION_V2,
        GPU_GET_ATTACHED_IDS,
        GPU_GET_ID_INFO,
        GPU_GET_DEVICE_IDS,
        GPU_GET_ID_INFO_V2,
        GPU_GET_PROBED_IDS,
        GPU_ATTACH_IDS,
        GPU_GET_PCI_INFO,
        GPU_GET_UUID_FROM_GPU_ID,
        CLIENT_SET_INHERITED_SHARE_POLICY,
        DEVICE_GPU_GET_CLASSLIST,
        DEVICE_GPU_GET_NUM_SUBDEVICES,
        DEVICE_GPU_GET_CLASSLIST_V2,
        GPU_GET_INFO_V2,
        GPU_GET_NAME_STRING,
        GPU_GET_SHORT_NAME_STRING,
        GPU_GET_SIMULATION_INFO,
        GPU_GET_GID_INFO,
        GR_GET_INFO,
        GR_GET_INFO_V2,
        FB_GET_INFO,
        FB_GET_INFO_V2,
        MC_GET_ARCH_INFO,
        BUS_GET_PCI_INFO,
        RC_RELEASE_WATCHDOG_REQUESTS,
        RC_SOFT_DISABLE_WATCHDOG,
        GPU_ACQUIRE_COMPUTE_MODE_RESERVATION,
        GPU_RELEASE_COMPUTE_MODE_RESERVATION,
        // Legacy GSS: measured, modelled (clocks), unmeasured and privileged ones.
        0x2080_8159,
        0x2080_8162,
        0x2080_9009,
        0x2080_9001,
        0x2080_9064,
        0x2080_a084,
        0x2080_a026,
        0x2080_a001,
        0x2080_c159,
    ];
    let d = sim(1);
    let mut rng = Lcg(11);
    let s = stack(&d, 0);
    for &c in &cmds {
        for obj in [s.client, s.device, s.subdevice, 0x1234] {
            for _ in 0..40 {
                let exact = [
                    4usize, 12, 16, 32, 40, 64, 128, 132, 256, 268, 516, 644, 776, 436, 0, 1, 8,
                    332, 520, 532,
                ][(rng.next() % 20) as usize];
                let len = if rng.next().is_multiple_of(2) {
                    exact
                } else {
                    (rng.next() % 1100) as usize
                };
                let params = rng.bytes(len);
                let inner = (0..(rng.next() % 4))
                    .map(|_| ((rng.next() % 4) as usize * 8, rng.blob(600)))
                    .collect();
                let _ = control_call(&s.ctl, s.client, obj, c, &params, inner);
            }
        }
    }
    drop(s);
    assert_eq!(d.stats(), SimStats::default());
}

#[test]
fn test_random_vid_heap_and_virtual_allocations_never_panic_or_leak() {
    use nvproxy_abi::structs::NVOS32_PARAMETERS;
    use zerocopy::{FromBytes, IntoBytes};
    let d = sim(1);
    let mut rng = Lcg(13);
    {
        let s = stack(&d, 0);
        // A VA space with random base/size, then random NVOS32 ALLOC_SIZE and RM_ALLOC
        // NV50_MEMORY_VIRTUAL requests in it.
        for i in 0..200u32 {
            let mut vas = rng.bytes(48);
            if i % 2 == 0 {
                vas[8..16].copy_from_slice(&0u64.to_ne_bytes());
                vas[40..48].copy_from_slice(&0u64.to_ne_bytes());
            }
            let _ = alloc_full(&s.ctl, s.client, s.device, 0xa000 + i, 0x90f1, Some(&vas));
            let mut p = NVOS32_PARAMETERS::read_from_bytes(&rng.bytes(184)).unwrap();
            p.hRoot = s.client;
            p.hObjectParent = if i % 3 == 0 { s.subdevice } else { s.device };
            p.function = 2;
            p.ivcHeapNumber = 0;
            p.hVASpace = if i % 4 == 0 { 0 } else { 0xa000 + i };
            let _ = esc(&s.ctl, NV_ESC_RM_VID_HEAP_CONTROL, &p);
            let mut m = rng.bytes(120);
            m[108..112].copy_from_slice(&(0xa000 + i).to_ne_bytes()); // hVASpace
            if i % 2 == 0 {
                m[8..12].copy_from_slice(&0x8_0010u32.to_ne_bytes()); // VIRTUAL | FIXED
            }
            let _ = alloc_full(&s.ctl, s.client, s.device, 0xb000 + i, 0x50a0, Some(&m));
            let _ = p.as_bytes();
        }
    }
    assert_eq!(d.stats(), SimStats::default());
}
