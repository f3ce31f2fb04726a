//! Params the proxy reads or rewrites to keep an instance inside its GPU set (`ctrl0000gpu.h`,
//! `ctrl0000system.h`, `cl2080.h`): GPU id lists it filters, GPU ids it checks, the device
//! instance it learns. None of them carries a pointer or an fd.
#![allow(missing_docs)] // every struct is documented; fields keep the C member names of the header

use core::mem::{align_of, offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `NV0000_CTRL_GPU_MAX_ATTACHED_GPUS` / `NV0000_CTRL_GPU_MAX_PROBED_GPUS`: length of the id lists.
pub const NV0000_CTRL_GPU_MAX_GPUS: usize = 32;
/// `NV0000_CTRL_GPU_INVALID_ID`: fills the unused tail of an id list.
pub const NV0000_CTRL_GPU_INVALID_ID: u32 = 0xffff_ffff;
/// `NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS`: `gpuIds[0]` of `GPU_ATTACH_IDS` meaning "all probed".
pub const NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS: u32 = 0x0000_ffff;

/// `NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS` (`ctrl0000gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS {
    pub gpuIds: [u32; 32],
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS>() == 128);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS>() == 4);

/// `NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS` (`ctrl0000gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS {
    pub gpuIds: [u32; 32],
    pub excludedGpuIds: [u32; 32],
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS>() == 256);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS, excludedGpuIds) == 128);

/// `NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS` (`ctrl0000gpu.h`): the layout since 580 (adds
/// `gpuFlags`, parallel to `gpuIds`; 384 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580 {
    pub gpuIds: [u32; 32],
    pub excludedGpuIds: [u32; 32],
    pub gpuFlags: [u32; 32],
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580>() == 384);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580>() == 4);
const _: () =
    assert!(offset_of!(NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580, excludedGpuIds) == 128);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580, gpuFlags) == 256);

/// `NV0000_CTRL_GPU_ATTACH_IDS_PARAMS` (`ctrl0000gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_ATTACH_IDS_PARAMS {
    pub gpuIds: [u32; 32],
    pub failedId: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_ATTACH_IDS_PARAMS>() == 132);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_ATTACH_IDS_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_ATTACH_IDS_PARAMS, failedId) == 128);

/// `NV0000_CTRL_GPU_DETACH_IDS_PARAMS` (`ctrl0000gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_DETACH_IDS_PARAMS {
    pub gpuIds: [u32; 32],
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_DETACH_IDS_PARAMS>() == 128);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_DETACH_IDS_PARAMS>() == 4);

/// `NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS` (`ctrl0000gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS {
    pub gpuId: u32,
    pub gpuFlags: u32,
    pub deviceInstance: u32,
    pub subDeviceInstance: u32,
    pub sliStatus: u32,
    pub boardId: u32,
    pub gpuInstance: u32,
    pub numaId: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS>() == 32);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, gpuFlags) == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, deviceInstance) == 8);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, subDeviceInstance) == 12);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, sliStatus) == 16);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, boardId) == 20);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, gpuInstance) == 24);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, numaId) == 28);

/// `NV0000_CTRL_GPU_ACTIVE_DEVICE` (`ctrl0000gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_ACTIVE_DEVICE {
    pub gpuId: u32,
    pub gpuInstanceId: u32,
    pub computeInstanceId: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_ACTIVE_DEVICE>() == 12);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_ACTIVE_DEVICE>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_ACTIVE_DEVICE, gpuInstanceId) == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_ACTIVE_DEVICE, computeInstanceId) == 8);

/// `NV0000_CTRL_GPU_GET_ACTIVE_DEVICE_IDS_PARAMS` (`ctrl0000gpu.h`), since 545.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_ACTIVE_DEVICE_IDS_PARAMS {
    pub numDevices: u32,
    pub devices: [NV0000_CTRL_GPU_ACTIVE_DEVICE; 256],
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_GET_ACTIVE_DEVICE_IDS_PARAMS>() == 3076);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_GET_ACTIVE_DEVICE_IDS_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ACTIVE_DEVICE_IDS_PARAMS, devices) == 4);

/// `NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS` (`ctrl0000gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS {
    pub gpuId: u32,
    pub flags: u32,
    pub gpuUuid: [u8; 256],
    pub uuidStrLen: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS>() == 268);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS, flags) == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS, gpuUuid) == 8);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS, uuidStrLen) == 264);

/// `NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS` (`ctrl0000gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS {
    pub gpuId: u32,
    pub domain: u32,
    pub bus: u16,
    pub slot: u16,
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS>() == 12);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS, domain) == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS, bus) == 8);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS, slot) == 10);

/// `NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS` (`ctrl0000gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS {
    pub gpuId: u32,
    pub drainState: u32,
    pub flags: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS>() == 12);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS, drainState) == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS, flags) == 8);

/// `NV0000_CTRL_GPU_ASYNC_ATTACH_ID_PARAMS` (`ctrl0000gpu.h`), since 550.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_ASYNC_ATTACH_ID_PARAMS {
    pub gpuId: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_ASYNC_ATTACH_ID_PARAMS>() == 4);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_ASYNC_ATTACH_ID_PARAMS>() == 4);

/// `NV0000_CTRL_GPU_WAIT_ATTACH_ID_PARAMS` (`ctrl0000gpu.h`), since 550.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_WAIT_ATTACH_ID_PARAMS {
    pub gpuId: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_WAIT_ATTACH_ID_PARAMS>() == 4);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_WAIT_ATTACH_ID_PARAMS>() == 4);

/// `NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS` (`ctrl0000system.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS {
    pub gpuIds: [u32; 32],
    pub gpuCount: u32,
    pub p2pCaps: u32,
    pub p2pOptimalReadCEs: u32,
    pub p2pOptimalWriteCEs: u32,
    pub p2pCapsStatus: [u8; 9],
    pub _pad0: [u8; 3],
    pub busPeerIds: [u32; 1024],
}
const _: () = assert!(size_of::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS>() == 4252);
const _: () = assert!(align_of::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS, gpuCount) == 128);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS, p2pCaps) == 132);
const _: () =
    assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS, p2pOptimalReadCEs) == 136);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS,
        p2pOptimalWriteCEs
    ) == 140
);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS, p2pCapsStatus) == 144);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS, busPeerIds) == 156);

/// `NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS` (`ctrl0000system.h`): the layout since 550 (adds
/// `busEgmPeerIds`; 8348 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS_V550 {
    pub gpuIds: [u32; 32],
    pub gpuCount: u32,
    pub p2pCaps: u32,
    pub p2pOptimalReadCEs: u32,
    pub p2pOptimalWriteCEs: u32,
    pub p2pCapsStatus: [u8; 9],
    pub _pad0: [u8; 3],
    pub busPeerIds: [u32; 1024],
    pub busEgmPeerIds: [u32; 1024],
}
const _: () = assert!(size_of::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS_V550>() == 8348);
const _: () = assert!(align_of::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS_V550>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS_V550, gpuCount) == 128);
const _: () =
    assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS_V550, busPeerIds) == 156);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS_V550,
        busEgmPeerIds
    ) == 4252
);

/// `NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS` (`ctrl0000system.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS {
    pub grpACount: u32,
    pub grpBCount: u32,
    pub gpuIdGrpA: [u32; 8],
    pub gpuIdGrpB: [u32; 8],
    pub p2pCaps: [[u32; 8]; 8],
    pub a2bOptimalReadCes: [[u32; 8]; 8],
    pub a2bOptimalWriteCes: [[u32; 8]; 8],
    pub b2aOptimalReadCes: [[u32; 8]; 8],
    pub b2aOptimalWriteCes: [[u32; 8]; 8],
}
const _: () = assert!(size_of::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS>() == 1352);
const _: () = assert!(align_of::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS, grpBCount) == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS, gpuIdGrpA) == 8);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS, gpuIdGrpB) == 40);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS, p2pCaps) == 72);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS,
        b2aOptimalWriteCes
    ) == 1096
);

/// `NV2080_ALLOC_PARAMETERS` (`cl2080.h`): params of `NV20_SUBDEVICE_0`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_ALLOC_PARAMETERS {
    pub subDeviceId: u32,
}
const _: () = assert!(size_of::<NV2080_ALLOC_PARAMETERS>() == 4);
const _: () = assert!(align_of::<NV2080_ALLOC_PARAMETERS>() == 4);
