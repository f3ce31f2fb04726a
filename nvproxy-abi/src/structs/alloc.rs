//! Allocation params (`pAllocParms`) of classes that carry pointers or fds, or whose handles
//! the proxy must track (`class/cl*.h`, `alloc/*.h`, `nvos.h`).
#![allow(missing_docs)] // every struct is documented; fields keep the C member names of the header

use core::mem::{align_of, offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::nvtypes::{NvHandle, NvP64};

/// `NV0005_ALLOC_PARAMETERS` (`cl0005.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0005_ALLOC_PARAMETERS {
    pub hParentClient: NvHandle,
    pub hSrcResource: NvHandle,
    pub hClass: u32,
    pub notifyIndex: u32,
    pub data: NvP64,
}
const _: () = assert!(size_of::<NV0005_ALLOC_PARAMETERS>() == 24);
const _: () = assert!(align_of::<NV0005_ALLOC_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NV0005_ALLOC_PARAMETERS, hSrcResource) == 4);
const _: () = assert!(offset_of!(NV0005_ALLOC_PARAMETERS, hClass) == 8);
const _: () = assert!(offset_of!(NV0005_ALLOC_PARAMETERS, notifyIndex) == 12);
const _: () = assert!(offset_of!(NV0005_ALLOC_PARAMETERS, data) == 16);

/// `NV00F1_ALLOCATION_PARAMETERS` (`cl00f1.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV00F1_ALLOCATION_PARAMETERS {
    pub capDescriptor: u64,
    pub flags: u32,
    pub _pad0: [u8; 4],
    pub pOsEvent: NvP64,
    pub nodeId: u16,
    pub _pad1: [u8; 6],
}
const _: () = assert!(size_of::<NV00F1_ALLOCATION_PARAMETERS>() == 32);
const _: () = assert!(align_of::<NV00F1_ALLOCATION_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NV00F1_ALLOCATION_PARAMETERS, flags) == 8);
const _: () = assert!(offset_of!(NV00F1_ALLOCATION_PARAMETERS, pOsEvent) == 16);
const _: () = assert!(offset_of!(NV00F1_ALLOCATION_PARAMETERS, nodeId) == 24);

/// `NV_MEMORY_ALLOCATION_PARAMS` (`nvos.h`): the layout since 545 (adds `numaNode`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV_MEMORY_ALLOCATION_PARAMS_V545 {
    pub owner: u32,
    pub r#type: u32,
    pub flags: u32,
    pub width: u32,
    pub height: u32,
    pub pitch: u32,
    pub attr: u32,
    pub attr2: u32,
    pub format: u32,
    pub comprCovg: u32,
    pub zcullCovg: u32,
    pub _pad0: [u8; 4],
    pub rangeLo: u64,
    pub rangeHi: u64,
    pub size: u64,
    pub alignment: u64,
    pub offset: u64,
    pub limit: u64,
    pub address: NvP64,
    pub ctagOffset: u32,
    pub hVASpace: NvHandle,
    pub internalflags: u32,
    pub tag: u32,
    pub numaNode: u32,
    pub _pad1: [u8; 4],
}
const _: () = assert!(size_of::<NV_MEMORY_ALLOCATION_PARAMS_V545>() == 128);
const _: () = assert!(align_of::<NV_MEMORY_ALLOCATION_PARAMS_V545>() == 8);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, r#type) == 4);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, flags) == 8);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, width) == 12);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, height) == 16);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, pitch) == 20);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, attr) == 24);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, attr2) == 28);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, format) == 32);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, comprCovg) == 36);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, zcullCovg) == 40);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, rangeLo) == 48);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, rangeHi) == 56);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, size) == 64);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, alignment) == 72);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, offset) == 80);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, limit) == 88);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, address) == 96);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, ctagOffset) == 104);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, hVASpace) == 108);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, internalflags) == 112);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, tag) == 116);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS_V545, numaNode) == 120);

/// `NV00FD_ALLOCATION_PARAMETERS` (`cl00fd.h`): the layout since 545 (prepends the export packet and index).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV00FD_ALLOCATION_PARAMETERS_V545 {
    pub expPacket: [u8; 32],
    pub index: u16,
    pub _pad0: [u8; 6],
    pub alignment: u64,
    pub allocSize: u64,
    pub pageSize: u32,
    pub allocFlags: u32,
    pub numGpus: u32,
    pub _pad1: [u8; 4],
    pub pOsEvent: NvP64,
}
const _: () = assert!(size_of::<NV00FD_ALLOCATION_PARAMETERS_V545>() == 80);
const _: () = assert!(align_of::<NV00FD_ALLOCATION_PARAMETERS_V545>() == 8);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V545, index) == 32);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V545, alignment) == 40);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V545, allocSize) == 48);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V545, pageSize) == 56);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V545, allocFlags) == 60);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V545, numGpus) == 64);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V545, pOsEvent) == 72);

/// `NV0080_ALLOC_PARAMETERS` (`cl0080.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0080_ALLOC_PARAMETERS {
    pub deviceId: u32,
    pub hClientShare: u32,
    pub hTargetClient: u32,
    pub hTargetDevice: u32,
    pub flags: u32,
    pub _pad0: [u8; 4],
    pub vaSpaceSize: u64,
    pub vaStartInternal: u64,
    pub vaLimitInternal: u64,
    pub vaMode: u32,
    pub _pad1: [u8; 4],
}
const _: () = assert!(size_of::<NV0080_ALLOC_PARAMETERS>() == 56);
const _: () = assert!(align_of::<NV0080_ALLOC_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NV0080_ALLOC_PARAMETERS, hClientShare) == 4);
const _: () = assert!(offset_of!(NV0080_ALLOC_PARAMETERS, hTargetClient) == 8);
const _: () = assert!(offset_of!(NV0080_ALLOC_PARAMETERS, hTargetDevice) == 12);
const _: () = assert!(offset_of!(NV0080_ALLOC_PARAMETERS, flags) == 16);
const _: () = assert!(offset_of!(NV0080_ALLOC_PARAMETERS, vaSpaceSize) == 24);
const _: () = assert!(offset_of!(NV0080_ALLOC_PARAMETERS, vaStartInternal) == 32);
const _: () = assert!(offset_of!(NV0080_ALLOC_PARAMETERS, vaLimitInternal) == 40);
const _: () = assert!(offset_of!(NV0080_ALLOC_PARAMETERS, vaMode) == 48);

/// `NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS` (`cl0070.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS {
    pub offset: u64,
    pub limit: u64,
    pub hVASpace: NvHandle,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS>() == 24);
const _: () = assert!(align_of::<NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS, limit) == 8);
const _: () = assert!(offset_of!(NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS, hVASpace) == 16);

/// `NV_CONTEXT_DMA_ALLOCATION_PARAMS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV_CONTEXT_DMA_ALLOCATION_PARAMS {
    pub hSubDevice: NvHandle,
    pub flags: u32,
    pub hMemory: NvHandle,
    pub _pad0: [u8; 4],
    pub offset: u64,
    pub limit: u64,
}
const _: () = assert!(size_of::<NV_CONTEXT_DMA_ALLOCATION_PARAMS>() == 32);
const _: () = assert!(align_of::<NV_CONTEXT_DMA_ALLOCATION_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV_CONTEXT_DMA_ALLOCATION_PARAMS, flags) == 4);
const _: () = assert!(offset_of!(NV_CONTEXT_DMA_ALLOCATION_PARAMS, hMemory) == 8);
const _: () = assert!(offset_of!(NV_CONTEXT_DMA_ALLOCATION_PARAMS, offset) == 16);
const _: () = assert!(offset_of!(NV_CONTEXT_DMA_ALLOCATION_PARAMS, limit) == 24);

/// `NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS {
    pub hObjectError: u32,
    pub hObjectEccError: u32,
    pub hVASpace: NvHandle,
    pub engineType: u32,
    pub bIsCallingContextVgpuPlugin: u8,
    pub _pad0: [u8; 3],
}
const _: () = assert!(size_of::<NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS>() == 20);
const _: () = assert!(align_of::<NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS>() == 4);
const _: () = assert!(offset_of!(NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS, hObjectEccError) == 4);
const _: () = assert!(offset_of!(NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS, hVASpace) == 8);
const _: () = assert!(offset_of!(NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS, engineType) == 12);
const _: () = assert!(
    offset_of!(
        NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS,
        bIsCallingContextVgpuPlugin
    ) == 16
);

/// `NV_CTXSHARE_ALLOCATION_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV_CTXSHARE_ALLOCATION_PARAMETERS {
    pub hVASpace: NvHandle,
    pub flags: u32,
    pub subctxId: u32,
}
const _: () = assert!(size_of::<NV_CTXSHARE_ALLOCATION_PARAMETERS>() == 12);
const _: () = assert!(align_of::<NV_CTXSHARE_ALLOCATION_PARAMETERS>() == 4);
const _: () = assert!(offset_of!(NV_CTXSHARE_ALLOCATION_PARAMETERS, flags) == 4);
const _: () = assert!(offset_of!(NV_CTXSHARE_ALLOCATION_PARAMETERS, subctxId) == 8);

/// `NV83DE_ALLOC_PARAMETERS` (`cl83de.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV83DE_ALLOC_PARAMETERS {
    pub hDebuggerClient_Obsolete: u32,
    pub hAppClient: NvHandle,
    pub hClass3dObject: u32,
}
const _: () = assert!(size_of::<NV83DE_ALLOC_PARAMETERS>() == 12);
const _: () = assert!(align_of::<NV83DE_ALLOC_PARAMETERS>() == 4);
const _: () = assert!(offset_of!(NV83DE_ALLOC_PARAMETERS, hAppClient) == 4);
const _: () = assert!(offset_of!(NV83DE_ALLOC_PARAMETERS, hClass3dObject) == 8);

/// `NV_MEMORY_ALLOCATION_PARAMS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV_MEMORY_ALLOCATION_PARAMS {
    pub owner: u32,
    pub r#type: u32,
    pub flags: u32,
    pub width: u32,
    pub height: u32,
    pub pitch: u32,
    pub attr: u32,
    pub attr2: u32,
    pub format: u32,
    pub comprCovg: u32,
    pub zcullCovg: u32,
    pub _pad0: [u8; 4],
    pub rangeLo: u64,
    pub rangeHi: u64,
    pub size: u64,
    pub alignment: u64,
    pub offset: u64,
    pub limit: u64,
    pub address: NvP64,
    pub ctagOffset: u32,
    pub hVASpace: NvHandle,
    pub internalflags: u32,
    pub tag: u32,
}
const _: () = assert!(size_of::<NV_MEMORY_ALLOCATION_PARAMS>() == 120);
const _: () = assert!(align_of::<NV_MEMORY_ALLOCATION_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, r#type) == 4);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, flags) == 8);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, width) == 12);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, height) == 16);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, pitch) == 20);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, attr) == 24);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, attr2) == 28);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, format) == 32);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, comprCovg) == 36);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, zcullCovg) == 40);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, rangeLo) == 48);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, rangeHi) == 56);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, size) == 64);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, alignment) == 72);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, offset) == 80);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, limit) == 88);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, address) == 96);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, ctagOffset) == 104);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, hVASpace) == 108);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, internalflags) == 112);
const _: () = assert!(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, tag) == 116);

/// `NV00FD_ALLOCATION_PARAMETERS` (`cl00fd.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV00FD_ALLOCATION_PARAMETERS {
    pub alignment: u64,
    pub allocSize: u64,
    pub pageSize: u32,
    pub allocFlags: u32,
    pub numGpus: u32,
    pub _pad0: [u8; 4],
    pub pOsEvent: NvP64,
}
const _: () = assert!(size_of::<NV00FD_ALLOCATION_PARAMETERS>() == 40);
const _: () = assert!(align_of::<NV00FD_ALLOCATION_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS, allocSize) == 8);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS, pageSize) == 16);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS, allocFlags) == 20);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS, numGpus) == 24);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS, pOsEvent) == 32);

/// `NV00FD_ALLOCATION_PARAMETERS` (`cl00fd.h`): the layout since 590 (`pageSize` becomes 64-bit).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV00FD_ALLOCATION_PARAMETERS_V590 {
    pub expPacket: [u8; 32],
    pub index: u16,
    pub _pad0: [u8; 6],
    pub alignment: u64,
    pub allocSize: u64,
    pub pageSize: u64,
    pub allocFlags: u32,
    pub numGpus: u32,
    pub pOsEvent: NvP64,
}
const _: () = assert!(size_of::<NV00FD_ALLOCATION_PARAMETERS_V590>() == 80);
const _: () = assert!(align_of::<NV00FD_ALLOCATION_PARAMETERS_V590>() == 8);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, index) == 32);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, alignment) == 40);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, allocSize) == 48);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, pageSize) == 56);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, allocFlags) == 64);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, numGpus) == 68);
const _: () = assert!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, pOsEvent) == 72);
