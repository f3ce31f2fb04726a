//! `NV_ESC_RM_VID_HEAP_CONTROL`: `RmDeprecatedVidHeapControl`
//! (`src/nvidia/interface/deprecated/rmapi_deprecated_vidheapctrl.c`).
//!
//! The driver keeps the old `NVOS32` heap interface as a translation onto `RM_ALLOC`:
//! `NVOS32_FUNCTION_ALLOC_SIZE` becomes an allocation of `NV50_MEMORY_VIRTUAL`
//! (`NVOS32_ALLOC_FLAGS_VIRTUAL`), from 550 `NV_MEMORY_EXTENDED_USER` (`NVOS32_ATTR2_USE_EGM`:
//! EGM, which the simulated GPUs lack), `NV01_MEMORY_LOCAL_USER` (attr location `VIDMEM`) or
//! `NV01_MEMORY_SYSTEM` under `hObjectParent`, with an `NV_MEMORY_ALLOCATION_PARAMS` built from
//! the `AllocSize` fields, whose results are copied back whatever the status. The simulator
//! does the same onto its own `RM_ALLOC`. The other functions are not simulated
//! (`NV_ERR_NOT_SUPPORTED`; the proxy never forwards them), an unknown function is
//! `NV_ERR_INVALID_ARGUMENT`, and an IVC heap (embedded platforms only) `NV_ERR_NOT_SUPPORTED`.

use std::mem::offset_of;

use nvproxy_abi::structs::{NV_MEMORY_ALLOCATION_PARAMS, NVOS32_PARAMETERS};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::buf::{Loc, read_at, write_at};
use crate::driver::{SimDriver, State};
use crate::rm::{self, AllocArgs};
use crate::status::*;

/// `NVOS32_PARAMETERS.data.AllocSize` (an anonymous struct in `nvos.h`).
#[allow(non_snake_case)]
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
struct AllocSize {
    owner: u32,
    hMemory: u32,
    r#type: u32,
    flags: u32,
    attr: u32,
    format: u32,
    comprCovg: u32,
    zcullCovg: u32,
    partitionStride: u32,
    width: u32,
    height: u32,
    _pad0: [u8; 4],
    size: u64,
    alignment: u64,
    offset: u64,
    limit: u64,
    address: u64,
    rangeBegin: u64,
    rangeEnd: u64,
    attr2: u32,
    ctagOffset: u32,
}
const _: () = assert!(size_of::<AllocSize>() == 112);
const _: () = assert!(offset_of!(AllocSize, size) == 48);
const _: () =
    assert!(offset_of!(AllocSize, address) == NVOS32_PARAMETERS::ALLOC_SIZE_ADDRESS_OFFSET);
const _: () = assert!(offset_of!(AllocSize, attr2) == 104);

/// The `NVOS32_FUNCTION_*` values the driver's table knows (`rmVidHeapControlTable`).
const ALLOC_SIZE: u32 = 2;
const KNOWN_FUNCTIONS: &[u32] = &[2, 3, 5, 6, 11, 14, 15, 16, 18, 19, 20, 27];
/// `NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED`.
const FLAGS_MEMORY_HANDLE_PROVIDED: u32 = 0x4000;
/// `NVOS32_ALLOC_FLAGS_USE_BEGIN_END`.
const FLAGS_USE_BEGIN_END: u32 = 0x2_0000;

/// One `RM_VID_HEAP_CONTROL` (size and node checked by the caller); writes the whole
/// `NVOS32_PARAMETERS` back.
pub(crate) fn vid_heap_control(
    drv: &SimDriver,
    st: &mut State,
    call: &mut host_driver::HostCall,
    loc: Loc,
    os_info: i32,
) {
    let mut p: NVOS32_PARAMETERS = read_at(call, loc, 0).expect("size checked");
    p.status = if p.ivcHeapNumber > 0 {
        NV_ERR_NOT_SUPPORTED
    } else if !KNOWN_FUNCTIONS.contains(&p.function) {
        NV_ERR_INVALID_ARGUMENT
    } else if p.function != ALLOC_SIZE {
        NV_ERR_NOT_SUPPORTED
    } else {
        alloc_size(drv, st, &mut p, os_info)
    };
    write_at(call, loc, 0, &p);
}

/// `NVOS32_ATTR2_USE_EGM` (bit 24, from 550; unused before).
const ATTR2_USE_EGM: u32 = 1 << 24;

/// `_nvos32FunctionAllocSize` + `_rmVidHeapControlAllocCommon`.
fn alloc_size(drv: &SimDriver, st: &mut State, p: &mut NVOS32_PARAMETERS, os_info: i32) -> u32 {
    let mut a = AllocSize::read_from_prefix(&p.data[..])
        .expect("data holds AllocSize")
        .0;
    let mut mp = NV_MEMORY_ALLOCATION_PARAMS::new_zeroed();
    if a.flags & FLAGS_USE_BEGIN_END != 0 {
        mp.rangeLo = a.rangeBegin;
        mp.rangeHi = a.rangeEnd;
    }
    mp.owner = a.owner;
    mp.r#type = a.r#type;
    mp.flags = a.flags;
    mp.height = a.height;
    mp.width = a.width;
    mp.size = a.size;
    mp.alignment = a.alignment;
    mp.offset = a.offset;
    mp.attr = a.attr;
    mp.attr2 = a.attr2;
    mp.format = a.format;
    mp.limit = a.limit;
    mp.address = a.address;
    mp.comprCovg = a.comprCovg;
    mp.zcullCovg = a.zcullCovg;
    mp.ctagOffset = a.ctagOffset;
    mp.hVASpace = p.hVASpace;
    a.partitionStride = 256;
    if a.flags & FLAGS_MEMORY_HANDLE_PROVIDED == 0 {
        a.hMemory = 0;
    }
    // NVOS32_ATTR_LOCATION (bits 26:25) VIDMEM is 0.
    let class = if a.flags & crate::vaspace::FLAGS_VIRTUAL != 0 {
        rm::NV50_MEMORY_VIRTUAL
    } else if drv.abi.vid_heap_egm && a.attr2 & ATTR2_USE_EGM != 0 {
        rm::NV_MEMORY_EXTENDED_USER
    } else if (a.attr >> 25) & 3 == 0 {
        rm::NV01_MEMORY_LOCAL_USER
    } else {
        rm::NV01_MEMORY_SYSTEM
    };
    // From 545 on the params end with numaNode (128 bytes), copied in from AllocSize.numaNode
    // (after ctagOffset).
    let mut params = mp.as_bytes().to_vec();
    let class_size = drv
        .abi
        .classes
        .get(&class)
        .map_or(params.len(), |c| c.param_size as usize);
    if class_size >= 128 {
        params.resize(class_size, 0);
        params[120..124].copy_from_slice(&p.data[112..116]);
    }
    let (status, h) = st.alloc(
        drv,
        AllocArgs {
            h_client: p.hRoot,
            h_parent: p.hObjectParent,
            h_new: a.hMemory,
            class,
            params: Some(&mut params),
            os_info,
        },
    );
    tracing::debug!(
        class = format_args!("{class:#x}"),
        flags = format_args!("{:#x}", a.flags),
        attr = format_args!("{:#x}", a.attr),
        attr2 = format_args!("{:#x}", a.attr2),
        size = a.size,
        status = format_args!("{status:#x}"),
        "vid heap ALLOC_SIZE"
    );
    if status == NV_OK {
        a.hMemory = h;
    }
    let out = NV_MEMORY_ALLOCATION_PARAMS::read_from_prefix(&params[..])
        .expect("params hold NV_MEMORY_ALLOCATION_PARAMS")
        .0;
    a.size = out.size;
    a.offset = out.offset;
    a.attr = out.attr;
    a.attr2 = out.attr2;
    a.format = out.format;
    a.limit = out.limit;
    a.address = out.address;
    a.comprCovg = out.comprCovg;
    a.zcullCovg = out.zcullCovg;
    a.ctagOffset = out.ctagOffset;
    p.data[..size_of::<AllocSize>()].copy_from_slice(a.as_bytes());
    p.free = 0;
    p.total = 0;
    status
}
