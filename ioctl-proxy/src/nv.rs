//! NV status codes, class numbers, flag bits and field offsets the handlers use. Values from the
//! driver headers (`nvstatuscodes.h`, `nvos.h`, `class/cl*.h`, `rs_access.h`); offsets of
//! modeled structs come from `nvproxy-abi` (parity-checked), the others are noted where used.

use core::mem::offset_of;

use nvproxy_abi::structs::NVOS32_PARAMETERS;

pub use nvproxy_abi::class::*;
pub use nvproxy_abi::status::*;

/// `NVOS02_FLAGS_LOCATION_PCI` (field 11:8).
pub const NVOS02_FLAGS_LOCATION_PCI: u32 = 0;
/// `NVOS02_FLAGS_ALLOC_NONE` (field 17:16).
pub const NVOS02_FLAGS_ALLOC_NONE: u32 = 1;
/// `NVOS02_FLAGS_MAPPING_NO_MAP` (field 31:30).
pub const NVOS02_FLAGS_MAPPING_NO_MAP: u32 = 1;
/// `NVOS32_ALLOC_FLAGS_VIRTUAL`.
pub const NVOS32_ALLOC_FLAGS_VIRTUAL: u32 = 0x0008_0000;
/// `NVOS32_ATTR_LOCATION_VIDMEM` (field 26:25).
pub const NVOS32_ATTR_LOCATION_VIDMEM: u32 = 0;
/// `NVOS32_ATTR2_USE_EGM` (bit 24).
pub const NVOS32_ATTR2_USE_EGM: u32 = 1 << 24;

const NVOS32_DATA: usize = offset_of!(NVOS32_PARAMETERS, data);
/// `NVOS32_PARAMETERS.data.AllocSize.hMemory` (abi-facts: 44 in every version).
pub const NVOS32_ALLOC_SIZE_HMEMORY: usize = NVOS32_DATA + 4;
/// `NVOS32_PARAMETERS.data.AllocSize.flags` (52).
pub const NVOS32_ALLOC_SIZE_FLAGS: usize = NVOS32_DATA + 12;
/// `NVOS32_PARAMETERS.data.AllocSize.attr` (56).
pub const NVOS32_ALLOC_SIZE_ATTR: usize = NVOS32_DATA + 16;
/// `NVOS32_PARAMETERS.data.AllocSize.size` (88).
pub const NVOS32_ALLOC_SIZE_SIZE: usize = NVOS32_DATA + 48;
/// `NVOS32_PARAMETERS.data.AllocSize.address` (120): a client pointer to an `NvU64`.
pub const NVOS32_ALLOC_SIZE_ADDRESS: usize =
    NVOS32_DATA + NVOS32_PARAMETERS::ALLOC_SIZE_ADDRESS_OFFSET;
/// `NVOS32_PARAMETERS.data.AllocSize.attr2` (144).
pub const NVOS32_ALLOC_SIZE_ATTR2: usize = NVOS32_DATA + 104;

/// `NV_MEMORY_FABRIC` (`class/cl00f8.h`).
pub const NV_MEMORY_FABRIC: u32 = 0x00f8;

/// `RS_SHARE_TYPE_CLIENT` (`rs_access.h`): the share policy's target is a client handle.
pub const RS_SHARE_TYPE_CLIENT: u16 = 3;

const _: () = assert!(NVOS32_ALLOC_SIZE_HMEMORY == 44);
const _: () = assert!(NVOS32_ALLOC_SIZE_ADDRESS == 120);
const _: () = assert!(NVOS32_ALLOC_SIZE_ATTR2 == 144);
const _: () = assert!(NVOS32_ALLOC_SIZE_SIZE == 88);
