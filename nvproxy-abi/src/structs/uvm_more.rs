//! Parameters of the remaining allowlisted UVM ioctls (`uvm_ioctl.h`): the proxy needs the
//! offsets of their GPU UUIDs, RM handles and `rmStatus`, and `nvsim` reads them.
//!
//! Two layouts changed without a size change or with one the table tells apart:
//! - `UVM_SET_PREFERRED_LOCATION_PARAMS` gained `preferredCpuNumaNode` before `rmStatus` with
//!   the 550 branch (40 bytes either way, `rmStatus` 32 → 36): [`uvm_preferred_location_v550`]
//!   says which layout a table's version uses;
//! - `UVM_FREE_PARAMS` (24 → 16, `length` removed) and `UVM_UNREGISTER_CHANNEL_PARAMS`
//!   (28 → 12, `gpuUuid` removed) shrank at 590, `UVM_ALLOC_SEMAPHORE_POOL_PARAMS` grew with
//!   `UVM_MAX_GPUS` 32 → 256 at 550: told apart by size.
#![allow(missing_docs)] // every struct is documented; fields keep the C member names of the header

use core::mem::{align_of, offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::frontend::NVOS47_PARAMETERS_V550;
use super::nvtypes::NvHandle;
use super::uvm::{NvProcessorUuid, UvmGpuMappingAttributes};
use crate::DriverAbi;

/// Whether the tables' version lays `UVM_SET_PREFERRED_LOCATION_PARAMS` out as
/// [`UVM_SET_PREFERRED_LOCATION_PARAMS_V550`] (`preferredCpuNumaNode` at 32, `rmStatus` at 36)
/// rather than the 535 layout (`rmStatus` at 32). The size is 40 in both, so the table cannot
/// tell; the change entered with the first 550 release (550.40.07) together with the 48-byte
/// `NVOS47_PARAMETERS` of `NV_ESC_RM_UNMAP_MEMORY_DMA`, so that escape's size is the witness.
/// (`UVM_MAP_EXTERNAL_ALLOCATION`'s 9264 bytes, the witness until the tree had every tag, came
/// one release later: 550.40.07 has the 550 layout with the 1200-byte params.)
/// `tests/parity.rs` checks the answer against the facts of every node.
pub fn uvm_preferred_location_v550(abi: &DriverAbi) -> bool {
    abi.escapes
        .get(&crate::ioctl::NV_ESC_RM_UNMAP_MEMORY_DMA)
        .is_some_and(|e| {
            u32::try_from(size_of::<NVOS47_PARAMETERS_V550>())
                .is_ok_and(|size| e.size == crate::ParamSize::Fixed(size))
        })
}

/// `UVM_CREATE_RANGE_GROUP_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_CREATE_RANGE_GROUP_PARAMS {
    pub rangeGroupId: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_CREATE_RANGE_GROUP_PARAMS>() == 16);
const _: () = assert!(align_of::<UVM_CREATE_RANGE_GROUP_PARAMS>() == 8);
const _: () = assert!(offset_of!(UVM_CREATE_RANGE_GROUP_PARAMS, rmStatus) == 8);

/// `UVM_DESTROY_RANGE_GROUP_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_DESTROY_RANGE_GROUP_PARAMS {
    pub rangeGroupId: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_DESTROY_RANGE_GROUP_PARAMS>() == 16);
const _: () = assert!(offset_of!(UVM_DESTROY_RANGE_GROUP_PARAMS, rmStatus) == 8);

/// `UVM_UNREGISTER_GPU_VASPACE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_UNREGISTER_GPU_VASPACE_PARAMS {
    pub gpuUuid: NvProcessorUuid,
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_UNREGISTER_GPU_VASPACE_PARAMS>() == 20);
const _: () = assert!(align_of::<UVM_UNREGISTER_GPU_VASPACE_PARAMS>() == 4);
const _: () = assert!(offset_of!(UVM_UNREGISTER_GPU_VASPACE_PARAMS, rmStatus) == 16);

/// `UVM_UNREGISTER_CHANNEL_PARAMS` before 590 (`gpuUuid`, which the driver never read,
/// removed at 590).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_UNREGISTER_CHANNEL_PARAMS {
    pub gpuUuid: NvProcessorUuid,
    pub hClient: NvHandle,
    pub hChannel: NvHandle,
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_UNREGISTER_CHANNEL_PARAMS>() == 28);
const _: () = assert!(offset_of!(UVM_UNREGISTER_CHANNEL_PARAMS, hClient) == 16);
const _: () = assert!(offset_of!(UVM_UNREGISTER_CHANNEL_PARAMS, hChannel) == 20);
const _: () = assert!(offset_of!(UVM_UNREGISTER_CHANNEL_PARAMS, rmStatus) == 24);

/// `UVM_UNREGISTER_CHANNEL_PARAMS` since 590.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_UNREGISTER_CHANNEL_PARAMS_V590 {
    pub hClient: NvHandle,
    pub hChannel: NvHandle,
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_UNREGISTER_CHANNEL_PARAMS_V590>() == 12);
const _: () = assert!(offset_of!(UVM_UNREGISTER_CHANNEL_PARAMS_V590, rmStatus) == 8);

/// `UVM_ENABLE_PEER_ACCESS_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_ENABLE_PEER_ACCESS_PARAMS {
    pub gpuUuidA: NvProcessorUuid,
    pub gpuUuidB: NvProcessorUuid,
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_ENABLE_PEER_ACCESS_PARAMS>() == 36);
const _: () = assert!(offset_of!(UVM_ENABLE_PEER_ACCESS_PARAMS, gpuUuidB) == 16);
const _: () = assert!(offset_of!(UVM_ENABLE_PEER_ACCESS_PARAMS, rmStatus) == 32);

/// `UVM_DISABLE_PEER_ACCESS_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_DISABLE_PEER_ACCESS_PARAMS {
    pub gpuUuidA: NvProcessorUuid,
    pub gpuUuidB: NvProcessorUuid,
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_DISABLE_PEER_ACCESS_PARAMS>() == 36);
const _: () = assert!(offset_of!(UVM_DISABLE_PEER_ACCESS_PARAMS, rmStatus) == 32);

/// `UVM_SET_RANGE_GROUP_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_SET_RANGE_GROUP_PARAMS {
    pub rangeGroupId: u64,
    pub requestedBase: u64,
    pub length: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_SET_RANGE_GROUP_PARAMS>() == 32);
const _: () = assert!(offset_of!(UVM_SET_RANGE_GROUP_PARAMS, rmStatus) == 24);

/// `UVM_FREE_PARAMS` before 590.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_FREE_PARAMS {
    pub base: u64,
    pub length: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_FREE_PARAMS>() == 24);
const _: () = assert!(offset_of!(UVM_FREE_PARAMS, rmStatus) == 16);

/// `UVM_FREE_PARAMS` since 590 (`length` removed).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_FREE_PARAMS_V590 {
    pub base: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_FREE_PARAMS_V590>() == 16);
const _: () = assert!(offset_of!(UVM_FREE_PARAMS_V590, rmStatus) == 8);

/// `UVM_UNREGISTER_GPU_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_UNREGISTER_GPU_PARAMS {
    pub gpu_uuid: NvProcessorUuid,
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_UNREGISTER_GPU_PARAMS>() == 20);
const _: () = assert!(offset_of!(UVM_UNREGISTER_GPU_PARAMS, rmStatus) == 16);

/// `UVM_PAGEABLE_MEM_ACCESS_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_PAGEABLE_MEM_ACCESS_PARAMS {
    /// `NvBool`.
    pub pageableMemAccess: u8,
    pub _pad0: [u8; 3],
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_PAGEABLE_MEM_ACCESS_PARAMS>() == 8);
const _: () = assert!(offset_of!(UVM_PAGEABLE_MEM_ACCESS_PARAMS, rmStatus) == 4);

/// `UVM_SET_PREFERRED_LOCATION_PARAMS` before 550.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_SET_PREFERRED_LOCATION_PARAMS {
    pub requestedBase: u64,
    pub length: u64,
    pub preferredLocation: NvProcessorUuid,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_SET_PREFERRED_LOCATION_PARAMS>() == 40);
const _: () = assert!(offset_of!(UVM_SET_PREFERRED_LOCATION_PARAMS, preferredLocation) == 16);
const _: () = assert!(offset_of!(UVM_SET_PREFERRED_LOCATION_PARAMS, rmStatus) == 32);

/// `UVM_SET_PREFERRED_LOCATION_PARAMS` since 550 (`preferredCpuNumaNode` inserted).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_SET_PREFERRED_LOCATION_PARAMS_V550 {
    pub requestedBase: u64,
    pub length: u64,
    pub preferredLocation: NvProcessorUuid,
    pub preferredCpuNumaNode: i32,
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_SET_PREFERRED_LOCATION_PARAMS_V550>() == 40);
const _: () =
    assert!(offset_of!(UVM_SET_PREFERRED_LOCATION_PARAMS_V550, preferredCpuNumaNode) == 32);
const _: () = assert!(offset_of!(UVM_SET_PREFERRED_LOCATION_PARAMS_V550, rmStatus) == 36);

/// `UVM_UNSET_PREFERRED_LOCATION_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_UNSET_PREFERRED_LOCATION_PARAMS {
    pub requestedBase: u64,
    pub length: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_UNSET_PREFERRED_LOCATION_PARAMS>() == 24);
const _: () = assert!(offset_of!(UVM_UNSET_PREFERRED_LOCATION_PARAMS, rmStatus) == 16);

/// `UVM_ENABLE_READ_DUPLICATION_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_ENABLE_READ_DUPLICATION_PARAMS {
    pub requestedBase: u64,
    pub length: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_ENABLE_READ_DUPLICATION_PARAMS>() == 24);

/// `UVM_DISABLE_READ_DUPLICATION_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_DISABLE_READ_DUPLICATION_PARAMS {
    pub requestedBase: u64,
    pub length: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_DISABLE_READ_DUPLICATION_PARAMS>() == 24);

/// `UVM_SET_ACCESSED_BY_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_SET_ACCESSED_BY_PARAMS {
    pub requestedBase: u64,
    pub length: u64,
    pub accessedByUuid: NvProcessorUuid,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_SET_ACCESSED_BY_PARAMS>() == 40);
const _: () = assert!(offset_of!(UVM_SET_ACCESSED_BY_PARAMS, accessedByUuid) == 16);
const _: () = assert!(offset_of!(UVM_SET_ACCESSED_BY_PARAMS, rmStatus) == 32);

/// `UVM_UNSET_ACCESSED_BY_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_UNSET_ACCESSED_BY_PARAMS {
    pub requestedBase: u64,
    pub length: u64,
    pub accessedByUuid: NvProcessorUuid,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_UNSET_ACCESSED_BY_PARAMS>() == 40);

/// `UVM_MIGRATE_PARAMS` (`cpuNumaNode` is `NvU32` before 550 and `NvS32` since: same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_MIGRATE_PARAMS {
    pub base: u64,
    pub length: u64,
    pub destinationUuid: NvProcessorUuid,
    pub flags: u32,
    pub _pad0: [u8; 4],
    pub semaphoreAddress: u64,
    pub semaphorePayload: u32,
    pub cpuNumaNode: i32,
    pub userSpaceStart: u64,
    pub userSpaceLength: u64,
    pub rmStatus: u32,
    pub _pad1: [u8; 4],
}
const _: () = assert!(size_of::<UVM_MIGRATE_PARAMS>() == 80);
const _: () = assert!(offset_of!(UVM_MIGRATE_PARAMS, destinationUuid) == 16);
const _: () = assert!(offset_of!(UVM_MIGRATE_PARAMS, semaphoreAddress) == 40);
const _: () = assert!(offset_of!(UVM_MIGRATE_PARAMS, cpuNumaNode) == 52);
const _: () = assert!(offset_of!(UVM_MIGRATE_PARAMS, rmStatus) == 72);

/// `UVM_MIGRATE_RANGE_GROUP_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_MIGRATE_RANGE_GROUP_PARAMS {
    pub rangeGroupId: u64,
    pub destinationUuid: NvProcessorUuid,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_MIGRATE_RANGE_GROUP_PARAMS>() == 32);
const _: () = assert!(offset_of!(UVM_MIGRATE_RANGE_GROUP_PARAMS, destinationUuid) == 8);
const _: () = assert!(offset_of!(UVM_MIGRATE_RANGE_GROUP_PARAMS, rmStatus) == 24);

/// `UVM_MAP_DYNAMIC_PARALLELISM_REGION_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_MAP_DYNAMIC_PARALLELISM_REGION_PARAMS {
    pub base: u64,
    pub length: u64,
    pub gpuUuid: NvProcessorUuid,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_MAP_DYNAMIC_PARALLELISM_REGION_PARAMS>() == 40);
const _: () = assert!(offset_of!(UVM_MAP_DYNAMIC_PARALLELISM_REGION_PARAMS, rmStatus) == 32);

/// `UVM_UNMAP_EXTERNAL_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_UNMAP_EXTERNAL_PARAMS {
    pub base: u64,
    pub length: u64,
    pub gpuUuid: NvProcessorUuid,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_UNMAP_EXTERNAL_PARAMS>() == 40);
const _: () = assert!(offset_of!(UVM_UNMAP_EXTERNAL_PARAMS, gpuUuid) == 16);
const _: () = assert!(offset_of!(UVM_UNMAP_EXTERNAL_PARAMS, rmStatus) == 32);

/// `UVM_ALLOC_SEMAPHORE_POOL_PARAMS` before 550 (`UVM_MAX_GPUS` 32).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_ALLOC_SEMAPHORE_POOL_PARAMS {
    pub base: u64,
    pub length: u64,
    pub perGpuAttributes: [UvmGpuMappingAttributes; 32],
    pub gpuAttributesCount: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_ALLOC_SEMAPHORE_POOL_PARAMS>() == 1184);
const _: () = assert!(offset_of!(UVM_ALLOC_SEMAPHORE_POOL_PARAMS, perGpuAttributes) == 16);
const _: () = assert!(offset_of!(UVM_ALLOC_SEMAPHORE_POOL_PARAMS, gpuAttributesCount) == 1168);
const _: () = assert!(offset_of!(UVM_ALLOC_SEMAPHORE_POOL_PARAMS, rmStatus) == 1176);

/// `UVM_ALLOC_SEMAPHORE_POOL_PARAMS` since 550 (`UVM_MAX_GPUS` 256).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_ALLOC_SEMAPHORE_POOL_PARAMS_V550 {
    pub base: u64,
    pub length: u64,
    pub perGpuAttributes: [UvmGpuMappingAttributes; 256],
    pub gpuAttributesCount: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_ALLOC_SEMAPHORE_POOL_PARAMS_V550>() == 9248);
const _: () = assert!(offset_of!(UVM_ALLOC_SEMAPHORE_POOL_PARAMS_V550, gpuAttributesCount) == 9232);
const _: () = assert!(offset_of!(UVM_ALLOC_SEMAPHORE_POOL_PARAMS_V550, rmStatus) == 9240);

/// `UVM_PAGEABLE_MEM_ACCESS_ON_GPU_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_PAGEABLE_MEM_ACCESS_ON_GPU_PARAMS {
    pub gpu_uuid: NvProcessorUuid,
    /// `NvBool`.
    pub pageableMemAccess: u8,
    pub _pad0: [u8; 3],
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_PAGEABLE_MEM_ACCESS_ON_GPU_PARAMS>() == 24);
const _: () = assert!(offset_of!(UVM_PAGEABLE_MEM_ACCESS_ON_GPU_PARAMS, pageableMemAccess) == 16);
const _: () = assert!(offset_of!(UVM_PAGEABLE_MEM_ACCESS_ON_GPU_PARAMS, rmStatus) == 20);

/// `UVM_VALIDATE_VA_RANGE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_VALIDATE_VA_RANGE_PARAMS {
    pub base: u64,
    pub length: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_VALIDATE_VA_RANGE_PARAMS>() == 24);
const _: () = assert!(offset_of!(UVM_VALIDATE_VA_RANGE_PARAMS, rmStatus) == 16);

/// `UVM_CREATE_EXTERNAL_RANGE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_CREATE_EXTERNAL_RANGE_PARAMS {
    pub base: u64,
    pub length: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_CREATE_EXTERNAL_RANGE_PARAMS>() == 24);
const _: () = assert!(offset_of!(UVM_CREATE_EXTERNAL_RANGE_PARAMS, rmStatus) == 16);
