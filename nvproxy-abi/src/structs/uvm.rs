//! Parameters of the UVM ioctls the proxy must parse: the ones carrying fds (`rmCtrlFd`,
//! `uvmFd`) and `UVM_INITIALIZE` (`uvm_ioctl.h`, `uvm_linux_ioctl.h`, `uvm_types.h`).
#![allow(missing_docs)] // every struct is documented; fields keep the C member names of the header

use core::mem::{align_of, offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::nvtypes::NvHandle;

/// `UVM_INITIALIZE_PARAMS` (`uvm_linux_ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_INITIALIZE_PARAMS {
    pub flags: u64,
    pub rmStatus: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<UVM_INITIALIZE_PARAMS>() == 16);
const _: () = assert!(align_of::<UVM_INITIALIZE_PARAMS>() == 8);
const _: () = assert!(offset_of!(UVM_INITIALIZE_PARAMS, rmStatus) == 8);

/// `UVM_MM_INITIALIZE_PARAMS` (`uvm_ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_MM_INITIALIZE_PARAMS {
    pub uvmFd: i32,
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_MM_INITIALIZE_PARAMS>() == 8);
const _: () = assert!(align_of::<UVM_MM_INITIALIZE_PARAMS>() == 4);
const _: () = assert!(offset_of!(UVM_MM_INITIALIZE_PARAMS, rmStatus) == 4);

/// `UVM_REGISTER_GPU_PARAMS` (`uvm_ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_REGISTER_GPU_PARAMS {
    pub gpu_uuid: NvProcessorUuid,
    pub numaEnabled: u8,
    pub _pad0: [u8; 3],
    pub numaNodeId: u32,
    pub rmCtrlFd: i32,
    pub hClient: NvHandle,
    pub hSmcPartRef: u32,
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_REGISTER_GPU_PARAMS>() == 40);
const _: () = assert!(align_of::<UVM_REGISTER_GPU_PARAMS>() == 4);
const _: () = assert!(offset_of!(UVM_REGISTER_GPU_PARAMS, numaEnabled) == 16);
const _: () = assert!(offset_of!(UVM_REGISTER_GPU_PARAMS, numaNodeId) == 20);
const _: () = assert!(offset_of!(UVM_REGISTER_GPU_PARAMS, rmCtrlFd) == 24);
const _: () = assert!(offset_of!(UVM_REGISTER_GPU_PARAMS, hClient) == 28);
const _: () = assert!(offset_of!(UVM_REGISTER_GPU_PARAMS, hSmcPartRef) == 32);
const _: () = assert!(offset_of!(UVM_REGISTER_GPU_PARAMS, rmStatus) == 36);

/// `UVM_REGISTER_GPU_VASPACE_PARAMS` (`uvm_ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_REGISTER_GPU_VASPACE_PARAMS {
    pub gpuUuid: NvProcessorUuid,
    pub rmCtrlFd: i32,
    pub hClient: NvHandle,
    pub hVaSpace: u32,
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_REGISTER_GPU_VASPACE_PARAMS>() == 32);
const _: () = assert!(align_of::<UVM_REGISTER_GPU_VASPACE_PARAMS>() == 4);
const _: () = assert!(offset_of!(UVM_REGISTER_GPU_VASPACE_PARAMS, rmCtrlFd) == 16);
const _: () = assert!(offset_of!(UVM_REGISTER_GPU_VASPACE_PARAMS, hClient) == 20);
const _: () = assert!(offset_of!(UVM_REGISTER_GPU_VASPACE_PARAMS, hVaSpace) == 24);
const _: () = assert!(offset_of!(UVM_REGISTER_GPU_VASPACE_PARAMS, rmStatus) == 28);

/// `UVM_REGISTER_CHANNEL_PARAMS` (`uvm_ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_REGISTER_CHANNEL_PARAMS {
    pub gpuUuid: NvProcessorUuid,
    pub rmCtrlFd: i32,
    pub hClient: NvHandle,
    pub hChannel: u32,
    pub _pad0: [u8; 4],
    pub base: u64,
    pub length: u64,
    pub rmStatus: u32,
    pub _pad1: [u8; 4],
}
const _: () = assert!(size_of::<UVM_REGISTER_CHANNEL_PARAMS>() == 56);
const _: () = assert!(align_of::<UVM_REGISTER_CHANNEL_PARAMS>() == 8);
const _: () = assert!(offset_of!(UVM_REGISTER_CHANNEL_PARAMS, rmCtrlFd) == 16);
const _: () = assert!(offset_of!(UVM_REGISTER_CHANNEL_PARAMS, hClient) == 20);
const _: () = assert!(offset_of!(UVM_REGISTER_CHANNEL_PARAMS, hChannel) == 24);
const _: () = assert!(offset_of!(UVM_REGISTER_CHANNEL_PARAMS, base) == 32);
const _: () = assert!(offset_of!(UVM_REGISTER_CHANNEL_PARAMS, length) == 40);
const _: () = assert!(offset_of!(UVM_REGISTER_CHANNEL_PARAMS, rmStatus) == 48);

/// `UVM_MAP_EXTERNAL_ALLOCATION_PARAMS` (`uvm_ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_MAP_EXTERNAL_ALLOCATION_PARAMS {
    pub base: u64,
    pub length: u64,
    pub offset: u64,
    pub perGpuAttributes: [UvmGpuMappingAttributes; 32],
    pub gpuAttributesCount: u64,
    pub rmCtrlFd: i32,
    pub hClient: NvHandle,
    pub hMemory: NvHandle,
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_MAP_EXTERNAL_ALLOCATION_PARAMS>() == 1200);
const _: () = assert!(align_of::<UVM_MAP_EXTERNAL_ALLOCATION_PARAMS>() == 8);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, length) == 8);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, offset) == 16);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, perGpuAttributes) == 24);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, gpuAttributesCount) == 1176);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, rmCtrlFd) == 1184);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, hClient) == 1188);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, hMemory) == 1192);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, rmStatus) == 1196);

/// `UvmGpuMappingAttributes` (`uvm_types.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UvmGpuMappingAttributes {
    pub gpuUuid: NvProcessorUuid,
    pub gpuMappingType: u32,
    pub gpuCachingType: u32,
    pub gpuFormatType: u32,
    pub gpuElementBits: u32,
    pub gpuCompressionType: u32,
}
const _: () = assert!(size_of::<UvmGpuMappingAttributes>() == 36);
const _: () = assert!(align_of::<UvmGpuMappingAttributes>() == 4);
const _: () = assert!(offset_of!(UvmGpuMappingAttributes, gpuMappingType) == 16);
const _: () = assert!(offset_of!(UvmGpuMappingAttributes, gpuCachingType) == 20);
const _: () = assert!(offset_of!(UvmGpuMappingAttributes, gpuFormatType) == 24);
const _: () = assert!(offset_of!(UvmGpuMappingAttributes, gpuElementBits) == 28);
const _: () = assert!(offset_of!(UvmGpuMappingAttributes, gpuCompressionType) == 32);

/// `NvProcessorUuid` (`nvCpuUuid.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NvProcessorUuid {
    pub uuid: [u8; 16],
}
const _: () = assert!(size_of::<NvProcessorUuid>() == 16);
const _: () = assert!(align_of::<NvProcessorUuid>() == 1);

/// `UVM_MAP_EXTERNAL_ALLOCATION_PARAMS` (`uvm_ioctl.h`): the layout since 550 (`UVM_MAX_GPUS` 32 -> 256).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550 {
    pub base: u64,
    pub length: u64,
    pub offset: u64,
    pub perGpuAttributes: [UvmGpuMappingAttributes; 256],
    pub gpuAttributesCount: u64,
    pub rmCtrlFd: i32,
    pub hClient: NvHandle,
    pub hMemory: NvHandle,
    pub rmStatus: u32,
}
const _: () = assert!(size_of::<UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550>() == 9264);
const _: () = assert!(align_of::<UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550>() == 8);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550, length) == 8);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550, offset) == 16);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550, perGpuAttributes) == 24);
const _: () =
    assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550, gpuAttributesCount) == 9240);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550, rmCtrlFd) == 9248);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550, hClient) == 9252);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550, hMemory) == 9256);
const _: () = assert!(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550, rmStatus) == 9260);
