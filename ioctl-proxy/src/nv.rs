//! NV status codes, class numbers, flag bits and field offsets the handlers use. Values from the
//! driver headers (`nvstatuscodes.h`, `nvos.h`, `class/cl*.h`, `rs_access.h`); offsets of
//! modeled structs come from `nvproxy-abi` (parity-checked), the others are noted where used.

use core::mem::offset_of;

use nvproxy_abi::structs::NVOS32_PARAMETERS;

/// `NV_OK`.
pub const NV_OK: u32 = 0;
/// `NV_ERR_INSERT_DUPLICATE_NAME`.
pub const NV_ERR_INSERT_DUPLICATE_NAME: u32 = 0x19;
/// `NV_ERR_INVALID_ADDRESS`.
pub const NV_ERR_INVALID_ADDRESS: u32 = 0x1e;
/// `NV_ERR_INVALID_ARGUMENT`.
pub const NV_ERR_INVALID_ARGUMENT: u32 = 0x1f;
/// `NV_ERR_INVALID_CLASS`.
pub const NV_ERR_INVALID_CLASS: u32 = 0x22;
/// `NV_ERR_INSUFFICIENT_RESOURCES`: RM's answer when a client's handle space is exhausted; the
/// proxy's when the instance's object quota is reached.
pub const NV_ERR_INSUFFICIENT_RESOURCES: u32 = 0x1a;
/// `NV_ERR_INVALID_CLIENT`.
pub const NV_ERR_INVALID_CLIENT: u32 = 0x23;
/// `NV_ERR_INVALID_OBJECT_HANDLE`.
pub const NV_ERR_INVALID_OBJECT_HANDLE: u32 = 0x33;
/// `NV_ERR_INVALID_OBJECT_PARENT`.
pub const NV_ERR_INVALID_OBJECT_PARENT: u32 = 0x36;
/// `NV_ERR_INVALID_PARAM_STRUCT`.
pub const NV_ERR_INVALID_PARAM_STRUCT: u32 = 0x3a;
/// `NV_ERR_NOT_SUPPORTED`.
pub const NV_ERR_NOT_SUPPORTED: u32 = 0x56;
/// `NV_ERR_OBJECT_NOT_FOUND`.
pub const NV_ERR_OBJECT_NOT_FOUND: u32 = 0x57;

/// `NV01_ROOT`.
pub const NV01_ROOT: u32 = 0x0;
/// `NV01_ROOT_NON_PRIV`.
pub const NV01_ROOT_NON_PRIV: u32 = 0x1;
/// `NV01_CONTEXT_DMA`.
pub const NV01_CONTEXT_DMA: u32 = 0x2;
/// `NV01_EVENT`: the real class is `NV0005_ALLOC_PARAMETERS.hClass`.
pub const NV01_EVENT: u32 = 0x5;
/// `NV01_MEMORY_SYSTEM`.
pub const NV01_MEMORY_SYSTEM: u32 = 0x3e;
/// `NV01_MEMORY_LOCAL_USER`.
pub const NV01_MEMORY_LOCAL_USER: u32 = 0x40;
/// `NV01_ROOT_CLIENT`.
pub const NV01_ROOT_CLIENT: u32 = 0x41;
/// `NV_MEMORY_EXTENDED_USER`.
pub const NV_MEMORY_EXTENDED_USER: u32 = 0x42;
/// `NV01_MEMORY_VIRTUAL`.
pub const NV01_MEMORY_VIRTUAL: u32 = 0x70;
/// `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`.
pub const NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: u32 = 0x71;
/// `NV01_EVENT_OS_EVENT`.
pub const NV01_EVENT_OS_EVENT: u32 = 0x79;
/// `NV01_DEVICE_0`.
pub const NV01_DEVICE_0: u32 = 0x80;
/// `NV_IMEX_SESSION`.
pub const NV_IMEX_SESSION: u32 = 0xf1;
/// `NV_MEMORY_MULTICAST_FABRIC`.
pub const NV_MEMORY_MULTICAST_FABRIC: u32 = 0xfd;
/// `NV50_MEMORY_VIRTUAL`.
pub const NV50_MEMORY_VIRTUAL: u32 = 0x50a0;
/// `GT200_DEBUGGER`.
pub const GT200_DEBUGGER: u32 = 0x83de;
/// `FERMI_CONTEXT_SHARE_A`.
pub const FERMI_CONTEXT_SHARE_A: u32 = 0x9067;
/// `KEPLER_CHANNEL_GROUP_A`.
pub const KEPLER_CHANNEL_GROUP_A: u32 = 0xa06c;

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
/// `NVOS32_PARAMETERS.data.AllocSize.address` (120): a client pointer to an `NvU64`.
pub const NVOS32_ALLOC_SIZE_ADDRESS: usize =
    NVOS32_DATA + NVOS32_PARAMETERS::ALLOC_SIZE_ADDRESS_OFFSET;
/// `NVOS32_PARAMETERS.data.AllocSize.attr2` (144).
pub const NVOS32_ALLOC_SIZE_ATTR2: usize = NVOS32_DATA + 104;

/// `RS_SHARE_TYPE_CLIENT` (`rs_access.h`): the share policy's target is a client handle.
pub const RS_SHARE_TYPE_CLIENT: u16 = 3;

const _: () = assert!(NVOS32_ALLOC_SIZE_HMEMORY == 44);
const _: () = assert!(NVOS32_ALLOC_SIZE_ADDRESS == 120);
const _: () = assert!(NVOS32_ALLOC_SIZE_ATTR2 == 144);
