//! Legacy GSS controls (measured firmware answers only), `RM_VID_HEAP_CONTROL`, GPU VA spaces
//! and `NV50_MEMORY_VIRTUAL` reservations.

mod common;

use common::*;
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use nvsim::status::*;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const NV50_MEMORY_VIRTUAL: u32 = 0x50a0;
const FERMI_VASPACE_A: u32 = 0x90f1;
const NV01_MEMORY_LOCAL_USER: u32 = 0x40;

// ---- legacy GSS ----------------------------------------------------------------------------

#[test]
fn gss_8159_returns_the_buffer_unchanged_with_nv_ok() {
    let d = sim(1);
    let s = stack(&d, 0);
    // libcuda's request: words 2, 0xc, 0, 0x25, the rest zero; and a patterned one.
    let mut req = vec![0u8; 332];
    req[0] = 2;
    req[4] = 0xc;
    req[12] = 0x25;
    let (st, out) = control(&s.ctl, s.client, s.subdevice, 0x2080_8159, &req);
    assert_eq!((st, out), (NV_OK, req));
    let pattern: Vec<u8> = (0..332u32).map(|i| (i % 251) as u8).collect();
    let (st, out) = control(&s.ctl, s.client, s.subdevice, 0x2080_8159, &pattern);
    assert_eq!((st, out), (NV_OK, pattern));
}

#[test]
fn gss_8162_writes_the_measured_byte() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, out) = control(&s.ctl, s.client, s.subdevice, 0x2080_8162, &[0]);
    assert_eq!((st, out), (NV_OK, vec![1]));
}

#[test]
fn gss_clock_queries_answer_the_simulated_gpus_max_clocks() {
    let d = sim(1);
    let s = stack(&d, 0);
    let gpu = nvsim::SimGpu::h100(0);
    // 0x2080a084: NV_OK, nothing written.
    let (st, out) = control(&s.ctl, s.client, s.subdevice, 0x2080_a084, &[9, 9, 9, 9]);
    assert_eq!((st, out), (NV_OK, vec![9, 9, 9, 9]));
    // 0x2080a026 for GPC (1) and MCLK (0x10), as libcuda asks it.
    let mut req = vec![0u8; 532];
    let put = |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    put(&mut req, 0, 0x400);
    put(&mut req, 0x10, 2);
    put(&mut req, 0x14, 0x1);
    put(&mut req, 0x24, 0x10);
    let (st, out) = control(&s.ctl, s.client, s.subdevice, 0x2080_a026, &req);
    assert_eq!(st, NV_OK);
    let word = |at: usize| u32::from_le_bytes(out[at..at + 4].try_into().unwrap());
    assert_eq!(word(0x1c), gpu.max_gpc_clock_khz);
    assert_eq!(word(0x2c), gpu.max_memory_clock_khz);
    assert_eq!((out[4], word(8), word(0x0c)), (2, 4, 1));
    // Another domain, a bad header, too many entries: not a measured shape.
    let mut other = req.clone();
    put(&mut other, 0x24, 0x2);
    assert_eq!(
        control(&s.ctl, s.client, s.subdevice, 0x2080_a026, &other).0,
        NV_ERR_NOT_SUPPORTED
    );
    let mut other = req.clone();
    put(&mut other, 0, 0x401);
    assert_eq!(
        control(&s.ctl, s.client, s.subdevice, 0x2080_a026, &other).0,
        NV_ERR_NOT_SUPPORTED
    );
    let mut other = req.clone();
    put(&mut other, 0x10, 33);
    assert_eq!(
        control(&s.ctl, s.client, s.subdevice, 0x2080_a026, &other).0,
        NV_ERR_NOT_SUPPORTED
    );
    // The measured CLK word pair.
    let (st, out) = control(&s.ctl, s.client, s.subdevice, 0x2080_9009, &[0xff; 8]);
    assert_eq!((st, out), (NV_OK, vec![0, 0, 0, 0, 0xd, 0, 0, 0]));
}

#[test]
fn compute_mode_reservation_is_held_by_one_client_until_its_subdevice_goes() {
    let d = sim(1);
    let s = stack(&d, 0);
    let other = client(&s.ctl);
    let dev = device(&s.ctl, other, 0xd0, 0);
    let sub = subdevice(&s.ctl, other, dev, 0xd1);
    let (acquire, release) = (0x2080_0145, 0x2080_0146);
    assert_eq!(
        control(&s.ctl, s.client, s.subdevice, acquire, &[]).0,
        NV_OK
    );
    // Compute mode NONE: another client gets it too, and then holds it.
    assert_eq!(control(&s.ctl, other, sub, acquire, &[]).0, NV_OK);
    assert_eq!(
        control(&s.ctl, s.client, s.subdevice, release, &[]).0,
        NV_ERR_STATE_IN_USE
    );
    assert_eq!(control(&s.ctl, other, sub, release, &[]).0, NV_OK);
    assert_eq!(
        control(&s.ctl, other, sub, release, &[]).0,
        NV_ERR_STATE_IN_USE
    );
    // Freeing the holder's subdevice drops the reservation.
    assert_eq!(control(&s.ctl, other, sub, acquire, &[]).0, NV_OK);
    assert_eq!(free(&s.ctl, other, sub), NV_OK);
    assert_eq!(
        control(&s.ctl, s.client, s.subdevice, acquire, &[]).0,
        NV_OK
    );
    assert_eq!(
        control(&s.ctl, s.client, s.subdevice, release, &[]).0,
        NV_OK
    );
}

#[test]
fn gss_unmeasured_wrong_size_and_privileged_are_refused() {
    let d = sim(1);
    let s = stack(&d, 0);
    // Unmeasured command (libcuda's 0x20808161), and a measured one with another size.
    let (st, out) = control(&s.ctl, s.client, s.subdevice, 0x2080_8161, &[7; 952]);
    assert_eq!((st, out), (NV_ERR_NOT_SUPPORTED, vec![7; 952]));
    let (st, _) = control(&s.ctl, s.client, s.subdevice, 0x2080_8159, &[0; 331]);
    assert_eq!(st, NV_ERR_NOT_SUPPORTED);
    // RM_GSS_LEGACY_MASK_PRIVILEGED needs a root-level caller; the simulator's are users.
    let (st, _) = control(&s.ctl, s.client, s.subdevice, 0x2080_c159, &[0; 332]);
    assert_eq!(st, NV_ERR_INSUFFICIENT_PERMISSIONS);
    // On the device too (gpuGetByHandle finds its GPU).
    let (st, _) = control(&s.ctl, s.client, s.device, 0x2080_8159, &[0; 332]);
    assert_eq!(st, NV_OK);
}

#[test]
fn gss_on_a_non_gpu_object_takes_the_normal_path() {
    let d = sim(1);
    let s = stack(&d, 0);
    // The client is no GPU object: RmDeprecatedGetControlHandler finds no GPU, so the resource
    // server handles it and knows no such control.
    let (st, _) = control(&s.ctl, s.client, s.client, 0x2080_8159, &[0; 332]);
    assert_eq!(st, NV_ERR_NOT_SUPPORTED);
    // An unknown object: the normal path's lookup.
    let (st, _) = control(&s.ctl, s.client, 0xdead, 0x2080_8159, &[0; 332]);
    assert_eq!(st, NV_ERR_OBJECT_NOT_FOUND);
}

// ---- VA spaces and virtual memory -------------------------------------------------------

fn vaspace(s: &Stack, h: u32, va_base: u64, va_size: u64) -> (u32, u64, u64) {
    // 48 bytes before 580, 56 (pasid) from 580 on; vaSize and vaBase stay at 8 and 40.
    let mut p = [0u8; 56];
    p[8..16].copy_from_slice(&va_size.to_ne_bytes());
    p[40..48].copy_from_slice(&va_base.to_ne_bytes());
    let (r, a, out) = alloc_full(&s.ctl, s.client, s.device, h, FERMI_VASPACE_A, Some(&p));
    assert_eq!(r.unwrap(), 0);
    let out = out.unwrap();
    let size = u64::from_ne_bytes(out[8..16].try_into().unwrap());
    let base = u64::from_ne_bytes(out[40..48].try_into().unwrap());
    (a.status, base, size)
}

fn virt_params(flags: u32, size: u64, offset: u64, h_vaspace: u32) -> Vec<u8> {
    let mut p = NV_MEMORY_ALLOCATION_PARAMS::new_zeroed();
    p.flags = flags;
    p.size = size;
    p.offset = offset;
    p.hVASpace = h_vaspace;
    p.as_bytes().to_vec()
}

const VIRTUAL: u32 = 0x8_0000;
const FIXED: u32 = 0x10;

#[test]
fn vaspace_reports_its_range() {
    let d = sim(1);
    let s = stack(&d, 0);
    assert_eq!(vaspace(&s, 0xa1, 0, 0), (NV_OK, 1 << 20, 1 << 57));
    assert_eq!(
        vaspace(&s, 0xa2, 1 << 32, 1 << 40),
        (NV_OK, 1 << 32, 1 << 40)
    );
    assert_eq!(vaspace(&s, 0xa3, 0, 1 << 58).0, NV_ERR_INVALID_ARGUMENT);
}

#[test]
fn virtual_memory_reserves_non_overlapping_ranges_and_is_a_dependant() {
    let d = sim(1);
    let s = stack(&d, 0);
    assert_eq!(vaspace(&s, 0xa1, 0, 0).0, NV_OK);
    let objects = d.stats().live_objects;
    let fixed = |h: u32, size: u64, at: u64| {
        let p = virt_params(VIRTUAL | FIXED, size, at, 0xa1);
        let (r, a, out) = alloc_full(&s.ctl, s.client, s.device, h, NV50_MEMORY_VIRTUAL, Some(&p));
        assert_eq!(r.unwrap(), 0);
        let m = NV_MEMORY_ALLOCATION_PARAMS::read_from_bytes(&out.unwrap()).unwrap();
        (a.status, m.offset, m.size, m.limit)
    };
    assert_eq!(
        fixed(0xb1, 0xfb00_0000, 0x2_0000_0000),
        (NV_OK, 0x2_0000_0000, 0xfb00_0000, 0xfaff_ffff)
    );
    assert_eq!(
        fixed(0xb2, 0x1000, 0x2_0001_0000).0,
        NV_ERR_NO_MEMORY,
        "overlaps"
    );
    assert_eq!(
        fixed(0xb2, 0x1000, 0x2_0000_1000).0,
        NV_ERR_INVALID_ARGUMENT,
        "unaligned"
    );
    assert_eq!(
        fixed(0xb2, 0x1000, 0x10000).0,
        NV_ERR_NO_MEMORY,
        "below the VA space"
    );
    assert_eq!(
        fixed(0xb2, 0x1000, 0x2_fb00_0000),
        (NV_OK, 0x2_fb00_0000, 0x10000, 0xffff)
    );
    // Without VIRTUAL, without or with a foreign VA space.
    let p = virt_params(0, 0x1000, 0, 0xa1);
    let st = alloc(
        &s.ctl,
        s.client,
        s.device,
        0xb3,
        NV50_MEMORY_VIRTUAL,
        Some(&p),
    )
    .0;
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);
    let p = virt_params(VIRTUAL, 0x1000, 0, 0);
    let st = alloc(
        &s.ctl,
        s.client,
        s.device,
        0xb3,
        NV50_MEMORY_VIRTUAL,
        Some(&p),
    )
    .0;
    assert_eq!(
        st, NV_ERR_NOT_SUPPORTED,
        "the device's default VA space is not simulated"
    );
    let p = virt_params(VIRTUAL, 0x1000, 0, s.subdevice);
    let st = alloc(
        &s.ctl,
        s.client,
        s.device,
        0xb3,
        NV50_MEMORY_VIRTUAL,
        Some(&p),
    )
    .0;
    assert_eq!(st, NV_ERR_INVALID_OBJECT_HANDLE);
    assert_eq!(d.stats().live_objects, objects + 2);
    // Freeing one reservation frees its range; freeing the VA space frees its dependants.
    assert_eq!(free(&s.ctl, s.client, 0xb1), NV_OK);
    assert_eq!(fixed(0xb4, 0x1000, 0x2_0000_0000).0, NV_OK);
    assert_eq!(free(&s.ctl, s.client, 0xa1), NV_OK);
    assert_eq!(d.stats().live_objects, objects - 1);
    assert_eq!(free(&s.ctl, s.client, s.client), NV_OK);
    assert_eq!(d.stats().live_objects, 0);
}

// ---- RM_VID_HEAP_CONTROL -----------------------------------------------------------------

fn vid_heap(
    s: &Stack,
    h_vaspace: u32,
    flags: u32,
    attr: u32,
    size: u64,
    offset: u64,
    h_mem: u32,
) -> NVOS32_PARAMETERS {
    let mut p = NVOS32_PARAMETERS::new_zeroed();
    p.hRoot = s.client;
    p.hObjectParent = s.device;
    p.function = NVOS32_FUNCTION_ALLOC_SIZE;
    p.hVASpace = h_vaspace;
    p.data[4..8].copy_from_slice(&h_mem.to_ne_bytes());
    p.data[12..16].copy_from_slice(&flags.to_ne_bytes());
    p.data[16..20].copy_from_slice(&attr.to_ne_bytes());
    p.data[48..56].copy_from_slice(&size.to_ne_bytes());
    p.data[64..72].copy_from_slice(&offset.to_ne_bytes());
    let (r, out) = esc(&s.ctl, NV_ESC_RM_VID_HEAP_CONTROL, &p);
    assert_eq!(r.unwrap(), 0);
    out
}

fn field64(p: &NVOS32_PARAMETERS, at: usize) -> u64 {
    u64::from_ne_bytes(p.data[at..at + 8].try_into().unwrap())
}

fn field32(p: &NVOS32_PARAMETERS, at: usize) -> u32 {
    u32::from_ne_bytes(p.data[at..at + 4].try_into().unwrap())
}

#[test]
fn vid_heap_alloc_size_reserves_virtual_memory_like_libcuda_asks() {
    let d = sim(1);
    let s = stack(&d, 0);
    assert_eq!(vaspace(&s, 0xa1, 0, 0).0, NV_OK);
    // libcuda 535's cuInit: flags 0x8c415 (VIRTUAL, MAP_NOT_REQUIRED, HANDLE_PROVIDED, LAZY,
    // FIXED_ADDRESS, GROWS_DOWN, IGNORE_BANK).
    let p = vid_heap(&s, 0xa1, 0x8c415, 0, 4_211_081_216, 0x1_0000_0000, 0xcafe);
    assert_eq!(p.status, NV_OK);
    assert_eq!(field32(&p, 4), 0xcafe, "hMemory");
    assert_eq!(field32(&p, 32), 256, "partitionStride");
    assert_eq!(field64(&p, 64), 0x1_0000_0000, "offset");
    assert_eq!(field64(&p, 48), 4_211_081_216, "size");
    assert_eq!(field64(&p, 72), 4_211_081_216 - 1, "limit");
    // The same range again: taken.
    let p = vid_heap(&s, 0xa1, 0x8c415, 0, 0x10000, 0x1_0000_0000, 0xcaff);
    assert_eq!(p.status, NV_ERR_NO_MEMORY);
    // Video memory (attr location VIDMEM, no handle given: the driver picks one).
    let before = d.stats().allocated_memory;
    let p = vid_heap(&s, 0, 0, 0, 0x20_0000, 0, 0x1234);
    assert_eq!(p.status, NV_OK);
    assert_ne!(field32(&p, 4), 0x1234, "a driver-chosen handle");
    assert_eq!(d.stats().allocated_memory, before + 0x20_0000);
    assert_eq!(free(&s.ctl, s.client, field32(&p, 4)), NV_OK);
    assert_eq!(d.stats().allocated_memory, before);
    let _ = NV01_MEMORY_LOCAL_USER;
}

#[test]
fn vid_heap_other_functions_and_bad_input() {
    let d = sim(1);
    let s = stack(&d, 0);
    let mut p = NVOS32_PARAMETERS::new_zeroed();
    p.hRoot = s.client;
    for (function, ivc, want) in [
        (0u32, 0u16, NV_ERR_INVALID_ARGUMENT), // no such function
        (99, 0, NV_ERR_INVALID_ARGUMENT),
        (3, 0, NV_ERR_NOT_SUPPORTED),  // FREE: exists, not simulated
        (27, 0, NV_ERR_NOT_SUPPORTED), // ALLOC_OS_DESCRIPTOR
        (2, 1, NV_ERR_NOT_SUPPORTED),  // an IVC heap
    ] {
        p.function = function;
        p.ivcHeapNumber = ivc;
        let (r, out) = esc(&s.ctl, NV_ESC_RM_VID_HEAP_CONTROL, &p);
        assert_eq!(
            (r.unwrap(), out.status),
            (0, want),
            "function {function} ivc {ivc}"
        );
    }
    // Unknown client, and the GPU node.
    let mut q = NVOS32_PARAMETERS::new_zeroed();
    q.function = NVOS32_FUNCTION_ALLOC_SIZE;
    q.hRoot = 0xc1d0_7777;
    let (_, out) = esc(&s.ctl, NV_ESC_RM_VID_HEAP_CONTROL, &q);
    assert_ne!(out.status, NV_OK);
    assert_eq!(
        errno(esc(&s.gpu, NV_ESC_RM_VID_HEAP_CONTROL, &q).0),
        Some(22)
    );
}

#[test]
fn vid_heap_alloc_size_works_with_every_versions_alloc_params() {
    // From 545 on NV_MEMORY_ALLOCATION_PARAMS is 128 bytes (numaNode).
    for v in [
        "535.216.03",
        "550.163.01",
        "570.211.01",
        "580.142",
        "595.45.04",
    ] {
        let version: nvproxy_abi::DriverVersion = v.parse().unwrap();
        let d = nvsim::SimDriver::new(nvsim::SimConfig::default_gpus(1).with_version(version));
        let s = stack(&d, 0);
        assert_eq!(vaspace(&s, 0xa1, 0, 0).0, NV_OK, "{v}");
        let p = vid_heap(&s, 0xa1, 0x8c415, 0, 0x20_0000, 0x1_0000_0000, 0xcafe);
        assert_eq!(p.status, NV_OK, "{v}");
        let p = vid_heap(&s, 0, 0, 0, 0x20_0000, 0, 0);
        assert_eq!(p.status, NV_OK, "{v}");
    }
}

// ---- the CUDA clock limit (perf.rs) ----------------------------------------------------------

/// `NV0080_CTRL_CMD_PERF_CUDA_LIMIT_SET_CONTROL`'s legacy form 0x809909 (libcuda 535's last
/// call of cuCtxCreate, which 535's kernel forwards to GSP) with kern_cuda_limit.c's
/// semantics: a reference count per device object, the byte left as sent, disabling at zero
/// refused, the references dropped with the device.
#[test]
fn gss_cuda_limit_counts_per_device_and_goes_with_the_device() {
    let d = sim(1);
    let s = stack(&d, 0);
    const LIMIT: u32 = 0x0080_9909;
    assert!(!d.cuda_limited(0));
    assert_eq!(
        control(&s.ctl, s.client, s.device, LIMIT, &[1]),
        (NV_OK, vec![1])
    );
    assert_eq!(
        control(&s.ctl, s.client, s.device, LIMIT, &[1]),
        (NV_OK, vec![1])
    );
    assert!(d.cuda_limited(0));
    assert_eq!(
        control(&s.ctl, s.client, s.device, LIMIT, &[0]),
        (NV_OK, vec![0])
    );
    assert!(d.cuda_limited(0), "one reference is left");
    assert_eq!(
        control(&s.ctl, s.client, s.device, LIMIT, &[0]),
        (NV_OK, vec![0])
    );
    assert!(!d.cuda_limited(0));
    // Disabling at zero: NV_ERR_INVALID_REQUEST, and on an error nothing is copied back.
    assert_eq!(
        control(&s.ctl, s.client, s.device, LIMIT, &[0]),
        (NV_ERR_INVALID_REQUEST, vec![0])
    );
    // Another size than the params', and a subdevice, which has no such control.
    assert_eq!(
        control(&s.ctl, s.client, s.device, LIMIT, &[1, 0]).0,
        NV_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        control(&s.ctl, s.client, s.subdevice, LIMIT, &[1]).0,
        NV_ERR_NOT_SUPPORTED
    );
    // A reference held by a device object goes when the object is freed.
    assert_eq!(control(&s.ctl, s.client, s.device, LIMIT, &[1]).0, NV_OK);
    assert!(d.cuda_limited(0));
    assert_eq!(free(&s.ctl, s.client, s.device), NV_OK);
    assert!(!d.cuda_limited(0));
}

/// 550+ exports the unmasked control itself; 535's kernel has none (NOT_SUPPORTED there).
#[test]
fn cuda_limit_control_is_exported_from_550_only() {
    let mut cfg = nvsim::SimConfig::default_gpus(1);
    cfg.version = "550.163.01".parse().unwrap();
    let d = nvsim::SimDriver::new(cfg);
    let s = stack(&d, 0);
    assert_eq!(
        control(&s.ctl, s.client, s.device, 0x0080_1909, &[1]),
        (NV_OK, vec![1])
    );
    assert!(d.cuda_limited(0));
    assert_eq!(
        control(&s.ctl, s.client, s.device, 0x0080_9909, &[0]).0,
        NV_OK
    );
    assert!(!d.cuda_limited(0), "both forms count the same references");
    let d = sim(1);
    let s = stack(&d, 0);
    assert_eq!(
        control(&s.ctl, s.client, s.device, 0x0080_1909, &[1]).0,
        NV_ERR_NOT_SUPPORTED
    );
}

/// What libcuda and the CUDA runtime ask at start-up, answered as the kernel answers on a
/// GPU without a display, NVLink or host atomics (control_init.rs cites the code).
#[test]
fn runtime_start_up_controls_answer_as_the_kernel_does() {
    let d = sim(1);
    let s = stack(&d, 0);
    // RC_GET_WATCHDOG_INFO: DISABLED | INITIALIZED.
    assert_eq!(
        control(&s.ctl, s.client, s.subdevice, 0x2080_2209, &[0xff; 4]),
        (NV_OK, 5u32.to_le_bytes().to_vec())
    );
    // BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS: 13 entries, none supported.
    assert_eq!(
        control(&s.ctl, s.client, s.subdevice, 0x2080_182a, &[0xff; 104]),
        (NV_OK, vec![0; 104])
    );
    // NVLINK_GET_NVLINK_STATUS: no links; the rest as sent.
    let (st, out) = control(&s.ctl, s.client, s.subdevice, 0x2080_3002, &[0xee; 5896]);
    assert_eq!(st, NV_OK);
    assert_eq!(&out[..4], &[0; 4]);
    assert!(out[4..].iter().all(|&b| b == 0xee));
    // PERF_BOOST: NV_OK, nothing written.
    let boost = [0x12, 0, 0, 0, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(
        control(&s.ctl, s.client, s.subdevice, 0x2080_200a, &boost),
        (NV_OK, boost.to_vec())
    );
}
