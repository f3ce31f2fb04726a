//! The simulated GPUs keep books of their video memory (`nvsim/src/fb.rs`): allocations past
//! what is free fail as on a full GPU (`NV_ERR_NO_MEMORY`), contiguity as the driver's PMA
//! path asks it, placement inside the memory, and the FB info controls (both layouts) answer
//! from the books; frees, dups, a freed client and a closed file give the memory back.
//! System memory draws on the simulated host's pages (`nvsim/src/sysmem.rs`) with the
//! driver's size checks.

mod common;

use common::*;
use nvproxy_abi::ioctl::NV_ESC_RM_VID_HEAP_CONTROL;
use nvproxy_abi::structs::{NV_MEMORY_ALLOCATION_PARAMS, NVOS32_PARAMETERS};
use nvsim::control::cmd;
use nvsim::{SimConfig, SimDriver};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const NV_OK: u32 = 0;
const NV_ERR_NO_MEMORY: u32 = 0x51;
const NV_ERR_INVALID_ARGUMENT: u32 = 0x1f;
const NV_ERR_INSUFFICIENT_RESOURCES: u32 = 0x1a;
const NV01_MEMORY_LOCAL_USER: u32 = 0x40;
const NV01_MEMORY_SYSTEM: u32 = 0x3e;
const GIB: u64 = 1 << 30;
/// The simulated H100's memory (`SimGpu::h100`).
const TOTAL: u64 = 80 * GIB;
/// `NV_MEMORY_ALLOCATION_PARAMS` of this version (535).
const LAYOUT: usize = 120;

/// `NVOS32_ATTR_PHYSICALITY` (28:27) values.
const PHYS_DEFAULT: u32 = 0;
const PHYS_NONCONTIGUOUS: u32 = 1 << 27;
const PHYS_CONTIGUOUS: u32 = 2 << 27;
const PHYS_ALLOW_NONCONTIGUOUS: u32 = 3 << 27;
const PHYS_MASK: u32 = 3 << 27;

/// `NV2080_CTRL_FB_INFO_INDEX_*`.
const TOTAL_RAM_SIZE: u32 = 0x08;
const HEAP_SIZE: u32 = 0x09;
const HEAP_BASE_KB: u32 = 0x11;
const LARGEST_FREE_REGION_SIZE_KB: u32 = 0x12;
const LARGEST_FREE_REGION_BASE_KB: u32 = 0x13;
const HEAP_FREE: u32 = 0x16;
const USABLE_RAM_SIZE: u32 = 0x20;

/// Allocates `size` bytes of class `class` with `attr`: (status, offset, attr) reported back.
fn mem(s: &Stack, h: u32, class: u32, size: u64, attr: u32) -> (u32, u64, u32) {
    let mut p = NV_MEMORY_ALLOCATION_PARAMS::new_zeroed();
    p.size = size;
    p.attr = attr;
    let mut b = p.as_bytes().to_vec();
    b.resize(LAYOUT, 0);
    let (r, out, params) = alloc_full(&s.ctl, s.client, s.device, h, class, Some(&b));
    assert_eq!(r.expect("RM_ALLOC"), 0);
    let params = params.expect("params");
    let back = NV_MEMORY_ALLOCATION_PARAMS::read_from_prefix(&params)
        .expect("params")
        .0;
    (out.status, back.offset, back.attr)
}

fn vid(s: &Stack, h: u32, size: u64, attr: u32) -> (u32, u64, u32) {
    mem(s, h, NV01_MEMORY_LOCAL_USER, size, attr)
}

/// `VID_HEAP_CONTROL` `ALLOC_SIZE` of `size` bytes of video memory (attr 0) as `h`, with
/// `attr2`; the status.
fn vid_heap(s: &Stack, h: u32, size: u64, attr2: u32) -> u32 {
    let mut p = NVOS32_PARAMETERS::new_zeroed();
    p.hRoot = s.client;
    p.hObjectParent = s.device;
    p.function = 2; // NVOS32_FUNCTION_ALLOC_SIZE
    p.data[4..8].copy_from_slice(&h.to_ne_bytes());
    p.data[12..16].copy_from_slice(&0x4000u32.to_ne_bytes()); // MEMORY_HANDLE_PROVIDED
    p.data[48..56].copy_from_slice(&size.to_ne_bytes()); // attr 0: VIDMEM
    p.data[104..108].copy_from_slice(&attr2.to_ne_bytes());
    let (r, out) = esc(&s.ctl, NV_ESC_RM_VID_HEAP_CONTROL, &p);
    assert_eq!(r.unwrap(), 0);
    out.status
}

/// `FB_GET_INFO_V2` of `indices` on the stack's subdevice.
fn fb_info_v2(s: &Stack, indices: &[u32]) -> Vec<u32> {
    let mut p = vec![0u8; 4 + 8 * 0x36];
    let n = u32::try_from(indices.len()).expect("a short list");
    p[..4].copy_from_slice(&n.to_ne_bytes());
    for (i, &ix) in indices.iter().enumerate() {
        p[4 + 8 * i..8 + 8 * i].copy_from_slice(&ix.to_ne_bytes());
    }
    let (st, out) = control(&s.ctl, s.client, s.subdevice, cmd::FB_GET_INFO_V2, &p);
    assert_eq!(st, NV_OK);
    (0..indices.len())
        .map(|i| u32::from_ne_bytes(out[8 + 8 * i..12 + 8 * i].try_into().unwrap()))
        .collect()
}

/// The legacy `FB_GET_INFO` (the list behind a pointer), same indices.
fn fb_info_legacy(s: &Stack, indices: &[u32]) -> Vec<u32> {
    let mut p = [0u8; 16];
    let n = u32::try_from(indices.len()).expect("a short list");
    p[..4].copy_from_slice(&n.to_ne_bytes());
    let mut list = vec![0u8; 8 * indices.len()];
    for (i, &ix) in indices.iter().enumerate() {
        list[8 * i..8 * i + 4].copy_from_slice(&ix.to_ne_bytes());
    }
    let (st, call) = control_call(
        &s.ctl,
        s.client,
        s.subdevice,
        cmd::FB_GET_INFO,
        &p,
        vec![(8, list)],
    );
    assert_eq!(st, NV_OK);
    let out = &call.nested[1].data;
    (0..indices.len())
        .map(|i| u32::from_ne_bytes(out[8 * i + 4..8 * i + 8].try_into().unwrap()))
        .collect()
}

/// (HEAP_FREE, LARGEST_FREE_REGION_SIZE_KB) in bytes, checked equal in both layouts.
fn free_and_largest(s: &Stack) -> (u64, u64) {
    let ix = [HEAP_FREE, LARGEST_FREE_REGION_SIZE_KB];
    let v2 = fb_info_v2(s, &ix);
    assert_eq!(v2, fb_info_legacy(s, &ix), "both layouts answer alike");
    (u64::from(v2[0]) << 10, u64::from(v2[1]) << 10)
}

#[test]
fn test_fb_info_answers_from_the_books() {
    let d = sim(1);
    let s = stack(&d, 0);
    let kib = u32::try_from(TOTAL >> 10).expect("80 GiB in KiB");
    let fixed = [
        TOTAL_RAM_SIZE,
        HEAP_SIZE,
        USABLE_RAM_SIZE,
        HEAP_BASE_KB,
        LARGEST_FREE_REGION_BASE_KB,
    ];
    let want_fixed = vec![kib, kib, kib, 0, u32::MAX];
    assert_eq!(fb_info_v2(&s, &fixed), want_fixed);
    assert_eq!(free_and_largest(&s), (TOTAL, TOTAL));
    assert_eq!(vid(&s, 0x100, 10 * GIB, 0).0, NV_OK);
    assert_eq!(vid(&s, 0x101, 5 * GIB, 0).0, NV_OK);
    // System memory is not video memory.
    assert_eq!(mem(&s, 0x102, NV01_MEMORY_SYSTEM, 7 * GIB, 0).0, NV_OK);
    assert_eq!(free_and_largest(&s), (65 * GIB, 65 * GIB));
    assert_eq!(d.allocated_video_memory(0), 15 * GIB);
    // A hole below: free grows, the largest run does not.
    assert_eq!(free(&s.ctl, s.client, 0x100), NV_OK);
    assert_eq!(free_and_largest(&s), (75 * GIB, 65 * GIB));
    // The sizes do not move with what is allocated.
    assert_eq!(fb_info_v2(&s, &fixed), want_fixed);
}

#[test]
fn test_allocations_past_the_free_memory_fail_and_change_nothing() {
    let d = sim(1);
    let s = stack(&d, 0);
    assert_eq!(vid(&s, 0x100, 70 * GIB, 0).0, NV_OK);
    let before = (free_and_largest(&s), d.stats().live_objects);
    for attr in [
        PHYS_DEFAULT,
        PHYS_CONTIGUOUS,
        PHYS_NONCONTIGUOUS,
        PHYS_ALLOW_NONCONTIGUOUS,
    ] {
        assert_eq!(vid(&s, 0x101, 10 * GIB + 4096, attr).0, NV_ERR_NO_MEMORY);
    }
    assert_eq!((free_and_largest(&s), d.stats().live_objects), before);
    // Exactly what is left fits.
    assert_eq!(vid(&s, 0x101, 10 * GIB, 0).0, NV_OK);
    assert_eq!(free_and_largest(&s), (0, 0));
    assert_eq!(vid(&s, 0x102, 4096, 0).0, NV_ERR_NO_MEMORY, "a full GPU");
}

#[test]
fn test_a_fragmented_gpu_refuses_what_must_be_contiguous() {
    let d = sim(1);
    let s = stack(&d, 0);
    for i in 0..8 {
        assert_eq!(vid(&s, 0x100 + i, 10 * GIB, 0).0, NV_OK);
    }
    for i in [1, 3, 5] {
        assert_eq!(free(&s.ctl, s.client, 0x100 + i), NV_OK);
    }
    assert_eq!(free_and_largest(&s), (30 * GIB, 10 * GIB));
    // vidmemPmaAlloc: contiguous unless _NONCONTIGUOUS; retried noncontiguous only for
    // _ALLOW_NONCONTIGUOUS.
    assert_eq!(vid(&s, 0x200, 20 * GIB, PHYS_DEFAULT).0, NV_ERR_NO_MEMORY);
    assert_eq!(
        vid(&s, 0x200, 20 * GIB, PHYS_CONTIGUOUS).0,
        NV_ERR_NO_MEMORY
    );
    let (st, offset, attr) = vid(&s, 0x200, 20 * GIB, PHYS_ALLOW_NONCONTIGUOUS);
    assert_eq!(
        (st, offset, attr & PHYS_MASK),
        (NV_OK, 10 * GIB, PHYS_NONCONTIGUOUS)
    );
    let (st, offset, attr) = vid(&s, 0x201, 4 * GIB, PHYS_NONCONTIGUOUS);
    assert_eq!(
        (st, offset, attr & PHYS_MASK),
        (NV_OK, 50 * GIB, PHYS_NONCONTIGUOUS)
    );
    let (st, offset, attr) = vid(&s, 0x202, 6 * GIB, PHYS_DEFAULT);
    assert_eq!(
        (st, offset, attr & PHYS_MASK),
        (NV_OK, 54 * GIB, PHYS_CONTIGUOUS)
    );
    assert_eq!(free_and_largest(&s), (0, 0));
    // The split allocation gives back both of its runs.
    assert_eq!(free(&s.ctl, s.client, 0x200), NV_OK);
    assert_eq!(free_and_largest(&s), (20 * GIB, 10 * GIB));
}

#[test]
fn test_offsets_stay_inside_the_memory_after_churn() {
    let d = sim(1);
    let s = stack(&d, 0);
    for round in 0..5 {
        let (st, offset, _) = vid(&s, 0x100, 60 * GIB, 0);
        assert_eq!((st, offset), (NV_OK, 0), "round {round}");
        assert_eq!(free(&s.ctl, s.client, 0x100), NV_OK);
    }
    let (_, a, _) = vid(&s, 0x100, GIB, 0);
    let (_, b, _) = vid(&s, 0x101, GIB, 0);
    assert_eq!((a, b), (0, GIB));
    assert_eq!(free(&s.ctl, s.client, 0x100), NV_OK);
    assert_eq!(vid(&s, 0x102, 4096, 0).1, 0, "the lowest hole first");
}

#[test]
fn test_vid_heap_alloc_size_takes_from_the_same_books() {
    let d = sim(1);
    let s = stack(&d, 0);
    let heap = |h: u32, size: u64| vid_heap(&s, h, size, 0);
    assert_eq!(heap(0x300, 50 * GIB), NV_OK);
    assert_eq!(free_and_largest(&s), (30 * GIB, 30 * GIB));
    assert_eq!(heap(0x301, 31 * GIB), NV_ERR_NO_MEMORY);
    assert_eq!(vid(&s, 0x302, 31 * GIB, 0).0, NV_ERR_NO_MEMORY);
    assert_eq!(free(&s.ctl, s.client, 0x300), NV_OK);
    assert_eq!(free_and_largest(&s), (TOTAL, TOTAL));
}

/// `NVOS32_ATTR2_USE_EGM` (24): from 550 `ALLOC_SIZE` allocates EGM
/// (`NV_MEMORY_EXTENDED_USER`), which the simulated GPUs lack (`egmmemValidateParams`:
/// `NV_ERR_INVALID_ARGUMENT`, nothing allocated); before 550 the bit is unused and the location
/// decides. `RM_ALLOC` of the class gets the same answer.
#[test]
fn test_vid_heap_egm_from_550_and_the_unused_bit_before() {
    // attr2 bit 24: NVOS32_ATTR2_USE_EGM from 550.
    let heap = |s: &Stack, h: u32, size: u64| vid_heap(s, h, size, 1 << 24);
    let d = sim(1);
    let s = stack(&d, 0);
    assert_eq!(heap(&s, 0x300, GIB), NV_OK);
    assert_eq!(d.stats().allocated_memory, GIB, "535: video memory");

    let d = SimDriver::new(SimConfig::default_gpus(1).with_version("580.142".parse().unwrap()));
    let s = stack(&d, 0);
    assert_eq!(heap(&s, 0x300, GIB), NV_ERR_INVALID_ARGUMENT);
    assert_eq!(d.stats().allocated_memory, 0, "580: EGM, refused");
    let b = vec![0u8; 128];
    let (r, out, _) = alloc_full(&s.ctl, s.client, s.device, 0x301, 0x42, Some(&b));
    assert_eq!((r.unwrap(), out.status), (0, NV_ERR_INVALID_ARGUMENT));
    assert_eq!(d.stats().live_objects, 2, "the device and subdevice only");
}

#[test]
fn test_frees_dups_clients_and_closed_files_give_the_memory_back() {
    let d = sim(2);
    let s = stack(&d, 0);
    let t = stack(&d, 1);
    assert_eq!(vid(&s, 0x100, 30 * GIB, 0).0, NV_OK);
    assert_eq!(vid(&t, 0x100, 70 * GIB, 0).0, NV_OK);
    // Each GPU keeps its own books.
    assert_eq!(free_and_largest(&s), (50 * GIB, 50 * GIB));
    assert_eq!(free_and_largest(&t), (10 * GIB, 10 * GIB));
    // A dup in another client holds the memory until it goes too.
    let (c2, _) = dup_holding_0x100(&s, 50 * GIB);
    // Freeing the dup's client frees it.
    assert_eq!(free(&s.ctl, c2, c2), NV_OK);
    assert_eq!(free_and_largest(&s).0, TOTAL);
    // Freeing a client frees its memory.
    assert_eq!(vid(&s, 0x101, 20 * GIB, 0).0, NV_OK);
    assert_eq!(free(&s.ctl, s.client, s.client), NV_OK);
    assert_eq!(d.allocated_video_memory(0), 0);
    // Closing the file frees what its clients held (the other GPU's books too).
    let u = stack(&d, 1);
    assert_eq!(vid(&u, 0x100, 10 * GIB, 0).0, NV_OK);
    assert_eq!(d.allocated_video_memory(1), 80 * GIB);
    assert_eq!(vid(&u, 0x101, 4096, 0).0, NV_ERR_NO_MEMORY);
    drop(t);
    assert_eq!(d.allocated_video_memory(1), 10 * GIB);
    assert_eq!(free_and_largest(&u), (70 * GIB, 70 * GIB));
    drop(u);
    drop(s);
    assert_eq!(d.allocated_video_memory(1), 0);
    assert_eq!(d.stats().allocated_memory, 0);
}

#[test]
fn test_freeing_a_dups_parent_frees_the_dup_and_its_hold() {
    let d = sim(1);
    let s = stack(&d, 0);
    assert_eq!(vid(&s, 0x100, 30 * GIB, 0).0, NV_OK);
    let (c2, dev2) = dup_holding_0x100(&s, 50 * GIB);
    let objects = d.stats().live_objects;
    // serverFreeResourceTree: the device's children go with it, the dup among them.
    assert_eq!(free(&s.ctl, c2, dev2), NV_OK);
    assert_eq!(
        d.stats().live_objects,
        objects - 2,
        "the device and the dup"
    );
    assert_eq!(free_and_largest(&s).0, TOTAL, "the dup's hold went with it");
}

/// A new client with a device whose dup of `s`'s memory 0x100 outlives the original's free
/// (`free` bytes left on the GPU then). Returns the client and its device.
fn dup_holding_0x100(s: &Stack, free_left: u64) -> (u32, u32) {
    let c2 = client(&s.ctl);
    let dev2 = device(&s.ctl, c2, 0x10, 0);
    let p = dup(&s.ctl, c2, dev2, 0, s.client, 0x100);
    assert_eq!(p.status, NV_OK);
    assert_eq!(free(&s.ctl, s.client, 0x100), NV_OK);
    assert_eq!(free_and_largest(s).0, free_left, "the dup holds it");
    (c2, dev2)
}

/// `NV_ESC_RM_DUP_OBJECT`.
fn dup(
    f: &File,
    h_client: u32,
    h_parent: u32,
    h_new: u32,
    h_src_client: u32,
    h_src: u32,
) -> nvproxy_abi::structs::NVOS55_PARAMETERS {
    let mut p = nvproxy_abi::structs::NVOS55_PARAMETERS::new_zeroed();
    p.hClient = h_client;
    p.hParent = h_parent;
    p.hObject = h_new;
    p.hClientSrc = h_src_client;
    p.hObjectSrc = h_src;
    esc(f, nvproxy_abi::ioctl::NV_ESC_RM_DUP_OBJECT, &p).1
}

#[test]
fn test_system_memory_draws_on_the_hosts_pages_with_the_drivers_size_checks() {
    let d = nvsim::SimDriver::new(nvsim::SimConfig {
        host_memory_bytes: 8 * GIB,
        ..nvsim::SimConfig::default_gpus(1)
    });
    let s = stack(&d, 0);
    let sys = |h, size, attr| mem(&s, h, NV01_MEMORY_SYSTEM, size, attr);
    // The driver reports the physicality it obtained: contiguous only when asked.
    let (st, _, attr) = sys(0x100, 6 * GIB, PHYS_DEFAULT);
    assert_eq!((st, attr & PHYS_MASK), (NV_OK, PHYS_NONCONTIGUOUS));
    let before = (d.allocated_memory(), d.stats().live_objects);
    // The host's pages run out; video memory is another pool.
    assert_eq!(sys(0x101, 2 * GIB + 1, PHYS_DEFAULT).0, NV_ERR_NO_MEMORY);
    assert_eq!(vid(&s, 0x101, 10 * GIB, 0).0, NV_OK);
    assert_eq!(free(&s.ctl, s.client, 0x101), NV_OK);
    // memdescCreate: a size that wraps when rounded to the page; a noncontiguous
    // descriptor of 4 GiB or more (past ~2 TiB); nv_alloc_contig_pages past 4 MiB.
    assert_eq!(
        sys(0x101, u64::MAX, PHYS_DEFAULT).0,
        NV_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        sys(0x101, 4096 << 30, PHYS_DEFAULT).0,
        NV_ERR_INSUFFICIENT_RESOURCES
    );
    assert_eq!(
        sys(0x101, (4 << 20) + 1, PHYS_CONTIGUOUS).0,
        NV_ERR_NO_MEMORY
    );
    // A refused allocation holds nothing.
    assert_eq!((d.allocated_memory(), d.stats().live_objects), before);
    let (st, _, attr) = sys(0x101, 4 << 20, PHYS_CONTIGUOUS);
    assert_eq!((st, attr & PHYS_MASK), (NV_OK, PHYS_CONTIGUOUS));
    assert_eq!(sys(0x102, 2 * GIB - (4 << 20), PHYS_DEFAULT).0, NV_OK);
    assert_eq!(sys(0x103, 1, PHYS_DEFAULT).0, NV_ERR_NO_MEMORY);
    // A free gives the pages back; a dup holds the block, not more pages.
    assert_eq!(
        dup(&s.ctl, s.client, s.device, 0x104, s.client, 0x100).status,
        NV_OK
    );
    assert_eq!(free(&s.ctl, s.client, 0x100), NV_OK);
    assert_eq!(sys(0x103, 1, PHYS_DEFAULT).0, NV_ERR_NO_MEMORY);
    assert_eq!(free(&s.ctl, s.client, 0x104), NV_OK);
    assert_eq!(sys(0x103, 6 * GIB, PHYS_DEFAULT).0, NV_OK);
}
