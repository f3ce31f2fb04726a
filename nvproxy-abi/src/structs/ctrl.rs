//! Params of the RM controls in our tables that carry user pointers or fds (`ctrl/ctrl*.h`),
//! plus the nested types they embed.
#![allow(missing_docs)] // every struct is documented; fields keep the C member names of the header

use core::mem::{align_of, offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::nvtypes::{NvHandle, NvP64};

/// `NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS` (`ctrl0000system.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS {
    pub sizeOfStrings: u32,
    pub _pad0: [u8; 4],
    pub pDriverVersionBuffer: NvP64,
    pub pVersionBuffer: NvP64,
    pub pTitleBuffer: NvP64,
    pub changelistNumber: u32,
    pub officialChangelistNumber: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS>() == 40);
const _: () = assert!(align_of::<NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS>() == 8);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS,
        pDriverVersionBuffer
    ) == 8
);
const _: () =
    assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS, pVersionBuffer) == 16);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS, pTitleBuffer) == 24);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS,
        changelistNumber
    ) == 32
);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS,
        officialChangelistNumber
    ) == 36
);

/// `NV0000_CTRL_GPU_GET_ID_INFO_PARAMS` (`ctrl0000gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_ID_INFO_PARAMS {
    pub gpuId: u32,
    pub gpuFlags: u32,
    pub deviceInstance: u32,
    pub subDeviceInstance: u32,
    pub szName: NvP64,
    pub sliStatus: u32,
    pub boardId: u32,
    pub gpuInstance: u32,
    pub numaId: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_GET_ID_INFO_PARAMS>() == 40);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_GET_ID_INFO_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_PARAMS, gpuFlags) == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_PARAMS, deviceInstance) == 8);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_PARAMS, subDeviceInstance) == 12);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_PARAMS, szName) == 16);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_PARAMS, sliStatus) == 24);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_PARAMS, boardId) == 28);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_PARAMS, gpuInstance) == 32);
const _: () = assert!(offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_PARAMS, numaId) == 36);

/// `NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS` (`ctrl0000unix.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS {
    pub object: NV0000_CTRL_OS_UNIX_EXPORT_OBJECT,
    pub fd: i32,
    pub flags: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS>() == 24);
const _: () = assert!(align_of::<NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS, fd) == 16);
const _: () = assert!(offset_of!(NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS, flags) == 20);

/// `NV0000_CTRL_OS_UNIX_EXPORT_OBJECT` (`ctrl0000unix.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_OS_UNIX_EXPORT_OBJECT {
    pub r#type: u32,
    pub data: [u32; 3],
}
const _: () = assert!(size_of::<NV0000_CTRL_OS_UNIX_EXPORT_OBJECT>() == 16);
const _: () = assert!(align_of::<NV0000_CTRL_OS_UNIX_EXPORT_OBJECT>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_OS_UNIX_EXPORT_OBJECT, data) == 4);

/// `NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS` (`ctrl0000unix.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS {
    pub fd: i32,
    pub object: NV0000_CTRL_OS_UNIX_EXPORT_OBJECT,
}
const _: () = assert!(size_of::<NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS>() == 20);
const _: () = assert!(align_of::<NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS, object) == 4);

/// `NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS` (`ctrl0000unix.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS {
    pub fd: i32,
    pub hDevice: NvHandle,
    pub maxObjects: u16,
    pub metadata: [u8; 64],
    pub _pad0: [u8; 2],
    pub objects: [u32; 512],
    pub numObjects: u16,
    pub index: u16,
}
const _: () = assert!(size_of::<NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS>() == 2128);
const _: () = assert!(align_of::<NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS, hDevice) == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS, maxObjects) == 8);
const _: () = assert!(offset_of!(NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS, metadata) == 10);
const _: () = assert!(offset_of!(NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS, objects) == 76);
const _: () =
    assert!(offset_of!(NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS, numObjects) == 2124);
const _: () = assert!(offset_of!(NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS, index) == 2126);

/// `NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS` (`ctrl0000unix.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS {
    pub fd: i32,
    pub hParent: NvHandle,
    pub objects: [u32; 128],
    pub objectTypes: [u32; 32],
    pub numObjects: u16,
    pub index: u16,
}
const _: () = assert!(size_of::<NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS>() == 652);
const _: () = assert!(align_of::<NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS, hParent) == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS, objects) == 8);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS,
        objectTypes
    ) == 520
);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS,
        numObjects
    ) == 648
);
const _: () = assert!(offset_of!(NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS, index) == 650);

/// `NV0041_CTRL_GET_SURFACE_INFO_PARAMS` (`ctrl0041.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0041_CTRL_GET_SURFACE_INFO_PARAMS {
    pub surfaceInfoListSize: u32,
    pub _pad0: [u8; 4],
    pub surfaceInfoList: NvP64,
}
const _: () = assert!(size_of::<NV0041_CTRL_GET_SURFACE_INFO_PARAMS>() == 16);
const _: () = assert!(align_of::<NV0041_CTRL_GET_SURFACE_INFO_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV0041_CTRL_GET_SURFACE_INFO_PARAMS, surfaceInfoList) == 8);

/// `NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS` (`ctrl0080gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS {
    pub numClasses: u32,
    pub _pad0: [u8; 4],
    pub classList: NvP64,
}
const _: () = assert!(size_of::<NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS>() == 16);
const _: () = assert!(align_of::<NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS, classList) == 8);

/// `NV0080_CTRL_GR_GET_CAPS_PARAMS` (`ctrl0080gr.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0080_CTRL_GR_GET_CAPS_PARAMS {
    pub capsTblSize: u32,
    pub _pad0: [u8; 4],
    pub capsTbl: NvP64,
}
const _: () = assert!(size_of::<NV0080_CTRL_GR_GET_CAPS_PARAMS>() == 16);
const _: () = assert!(align_of::<NV0080_CTRL_GR_GET_CAPS_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV0080_CTRL_GR_GET_CAPS_PARAMS, capsTbl) == 8);

/// `NV0080_CTRL_FB_GET_CAPS_PARAMS` (`ctrl0080fb.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0080_CTRL_FB_GET_CAPS_PARAMS {
    pub capsTblSize: u32,
    pub _pad0: [u8; 4],
    pub capsTbl: NvP64,
}
const _: () = assert!(size_of::<NV0080_CTRL_FB_GET_CAPS_PARAMS>() == 16);
const _: () = assert!(align_of::<NV0080_CTRL_FB_GET_CAPS_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV0080_CTRL_FB_GET_CAPS_PARAMS, capsTbl) == 8);

/// `NV0080_CTRL_FIFO_GET_CAPS_PARAMS` (`ctrl0080fifo.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0080_CTRL_FIFO_GET_CAPS_PARAMS {
    pub capsTblSize: u32,
    pub _pad0: [u8; 4],
    pub capsTbl: NvP64,
}
const _: () = assert!(size_of::<NV0080_CTRL_FIFO_GET_CAPS_PARAMS>() == 16);
const _: () = assert!(align_of::<NV0080_CTRL_FIFO_GET_CAPS_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV0080_CTRL_FIFO_GET_CAPS_PARAMS, capsTbl) == 8);

/// `NV0080_CTRL_MSENC_GET_CAPS_PARAMS` (`ctrl0080msenc.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0080_CTRL_MSENC_GET_CAPS_PARAMS {
    pub capsTblSize: u32,
    pub _pad0: [u8; 4],
    pub capsTbl: NvP64,
}
const _: () = assert!(size_of::<NV0080_CTRL_MSENC_GET_CAPS_PARAMS>() == 16);
const _: () = assert!(align_of::<NV0080_CTRL_MSENC_GET_CAPS_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV0080_CTRL_MSENC_GET_CAPS_PARAMS, capsTbl) == 8);

/// `NV0080_CTRL_GR_GET_INFO_PARAMS` (`ctrl0080gr.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0080_CTRL_GR_GET_INFO_PARAMS {
    pub grInfoListSize: u32,
    pub _pad0: [u8; 4],
    pub grInfoList: NvP64,
}
const _: () = assert!(size_of::<NV0080_CTRL_GR_GET_INFO_PARAMS>() == 16);
const _: () = assert!(align_of::<NV0080_CTRL_GR_GET_INFO_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV0080_CTRL_GR_GET_INFO_PARAMS, grInfoList) == 8);

/// `NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS` (`ctrl0080fifo.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS {
    pub numChannels: u32,
    pub _pad0: [u8; 4],
    pub pChannelHandleList: NvP64,
    pub pChannelList: NvP64,
}
const _: () = assert!(size_of::<NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS>() == 24);
const _: () = assert!(align_of::<NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS, pChannelHandleList) == 8);
const _: () = assert!(offset_of!(NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS, pChannelList) == 16);

/// `NV00FD_CTRL_ATTACH_GPU_PARAMS` (`ctrl00fd.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV00FD_CTRL_ATTACH_GPU_PARAMS {
    pub hSubdevice: u32,
    pub flags: u32,
    pub devDescriptor: u64,
}
const _: () = assert!(size_of::<NV00FD_CTRL_ATTACH_GPU_PARAMS>() == 16);
const _: () = assert!(align_of::<NV00FD_CTRL_ATTACH_GPU_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV00FD_CTRL_ATTACH_GPU_PARAMS, flags) == 4);
const _: () = assert!(offset_of!(NV00FD_CTRL_ATTACH_GPU_PARAMS, devDescriptor) == 8);

/// `NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS` (`ctrl2080gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS {
    pub hClientTarget: u32,
    pub hChannelTarget: u32,
    pub bNonTransactional: u32,
    pub reserved00: [u32; 2],
    pub regOpCount: u32,
    pub regOps: NvP64,
    pub grRouteInfo: NV2080_CTRL_GR_ROUTE_INFO,
}
const _: () = assert!(size_of::<NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS>() == 48);
const _: () = assert!(align_of::<NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS, hChannelTarget) == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS, bNonTransactional) == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS, reserved00) == 12);
const _: () = assert!(offset_of!(NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS, regOpCount) == 20);
const _: () = assert!(offset_of!(NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS, regOps) == 24);
const _: () = assert!(offset_of!(NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS, grRouteInfo) == 32);

/// `NV2080_CTRL_GR_ROUTE_INFO` (`ctrl2080gr.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GR_ROUTE_INFO {
    pub flags: u32,
    pub _pad0: [u8; 4],
    pub route: u64,
}
const _: () = assert!(size_of::<NV2080_CTRL_GR_ROUTE_INFO>() == 16);
const _: () = assert!(align_of::<NV2080_CTRL_GR_ROUTE_INFO>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_GR_ROUTE_INFO, route) == 8);

/// `NV2080_CTRL_GPU_GET_ENGINES_PARAMS` (`ctrl2080gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GPU_GET_ENGINES_PARAMS {
    pub engineCount: u32,
    pub _pad0: [u8; 4],
    pub engineList: NvP64,
}
const _: () = assert!(size_of::<NV2080_CTRL_GPU_GET_ENGINES_PARAMS>() == 16);
const _: () = assert!(align_of::<NV2080_CTRL_GPU_GET_ENGINES_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_GPU_GET_ENGINES_PARAMS, engineList) == 8);

/// `NV2080_CTRL_BIOS_GET_INFO_PARAMS` (`ctrl2080bios.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_BIOS_GET_INFO_PARAMS {
    pub biosInfoListSize: u32,
    pub _pad0: [u8; 4],
    pub biosInfoList: NvP64,
}
const _: () = assert!(size_of::<NV2080_CTRL_BIOS_GET_INFO_PARAMS>() == 16);
const _: () = assert!(align_of::<NV2080_CTRL_BIOS_GET_INFO_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_BIOS_GET_INFO_PARAMS, biosInfoList) == 8);

/// `NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS` (`ctrl2080fifo.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS {
    pub bDisable: u8,
    pub _pad0: [u8; 3],
    pub numChannels: u32,
    pub bOnlyDisableScheduling: u8,
    pub bRewindGpPut: u8,
    pub _pad1: [u8; 6],
    pub pRunlistPreemptEvent: NvP64,
    pub hClientList: [u32; 64],
    pub hChannelList: [u32; 64],
}
const _: () = assert!(size_of::<NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS>() == 536);
const _: () = assert!(align_of::<NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS, numChannels) == 4);
const _: () = assert!(
    offset_of!(
        NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS,
        bOnlyDisableScheduling
    ) == 8
);
const _: () = assert!(offset_of!(NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS, bRewindGpPut) == 9);
const _: () = assert!(
    offset_of!(
        NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS,
        pRunlistPreemptEvent
    ) == 16
);
const _: () = assert!(offset_of!(NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS, hClientList) == 24);
const _: () = assert!(offset_of!(NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS, hChannelList) == 280);

/// `NV2080_CTRL_GR_GET_INFO_PARAMS` (`ctrl2080gr.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GR_GET_INFO_PARAMS {
    pub grInfoListSize: u32,
    pub _pad0: [u8; 4],
    pub grInfoList: NvP64,
    pub grRouteInfo: NV2080_CTRL_GR_ROUTE_INFO,
}
const _: () = assert!(size_of::<NV2080_CTRL_GR_GET_INFO_PARAMS>() == 32);
const _: () = assert!(align_of::<NV2080_CTRL_GR_GET_INFO_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_GR_GET_INFO_PARAMS, grInfoList) == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_GR_GET_INFO_PARAMS, grRouteInfo) == 16);

/// `NV2080_CTRL_FB_GET_INFO_PARAMS` (`ctrl2080fb.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_FB_GET_INFO_PARAMS {
    pub fbInfoListSize: u32,
    pub _pad0: [u8; 4],
    pub fbInfoList: NvP64,
}
const _: () = assert!(size_of::<NV2080_CTRL_FB_GET_INFO_PARAMS>() == 16);
const _: () = assert!(align_of::<NV2080_CTRL_FB_GET_INFO_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_FB_GET_INFO_PARAMS, fbInfoList) == 8);

/// `NV2080_CTRL_BUS_GET_INFO_PARAMS` (`ctrl2080bus.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_BUS_GET_INFO_PARAMS {
    pub busInfoListSize: u32,
    pub _pad0: [u8; 4],
    pub busInfoList: NvP64,
}
const _: () = assert!(size_of::<NV2080_CTRL_BUS_GET_INFO_PARAMS>() == 16);
const _: () = assert!(align_of::<NV2080_CTRL_BUS_GET_INFO_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_BUS_GET_INFO_PARAMS, busInfoList) == 8);

/// `NV503C_CTRL_REGISTER_VA_SPACE_PARAMS` (`ctrl503c.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV503C_CTRL_REGISTER_VA_SPACE_PARAMS {
    pub hVASpace: NvHandle,
    pub _pad0: [u8; 4],
    pub vaSpaceToken: u64,
}
const _: () = assert!(size_of::<NV503C_CTRL_REGISTER_VA_SPACE_PARAMS>() == 16);
const _: () = assert!(align_of::<NV503C_CTRL_REGISTER_VA_SPACE_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV503C_CTRL_REGISTER_VA_SPACE_PARAMS, vaSpaceToken) == 8);

/// `NV83DE_CTRL_DEBUG_READ_MEMORY_PARAMS` (`ctrl83dedebug.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV83DE_CTRL_DEBUG_READ_MEMORY_PARAMS {
    pub hMemory: NvHandle,
    pub length: u32,
    pub offset: u64,
    pub buffer: NvP64,
}
const _: () = assert!(size_of::<NV83DE_CTRL_DEBUG_READ_MEMORY_PARAMS>() == 24);
const _: () = assert!(align_of::<NV83DE_CTRL_DEBUG_READ_MEMORY_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV83DE_CTRL_DEBUG_READ_MEMORY_PARAMS, length) == 4);
const _: () = assert!(offset_of!(NV83DE_CTRL_DEBUG_READ_MEMORY_PARAMS, offset) == 8);
const _: () = assert!(offset_of!(NV83DE_CTRL_DEBUG_READ_MEMORY_PARAMS, buffer) == 16);

/// `NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS` (`ctrl0000system.h`): the layout since 550 (adds the `busEgmPeerIds` pointer).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550 {
    pub gpuIds: [u32; 32],
    pub gpuCount: u32,
    pub p2pCaps: u32,
    pub p2pOptimalReadCEs: u32,
    pub p2pOptimalWriteCEs: u32,
    pub p2pCapsStatus: [u8; 9],
    pub _pad0: [u8; 7],
    pub busPeerIds: NvP64,
    pub busEgmPeerIds: NvP64,
}
const _: () = assert!(size_of::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550>() == 176);
const _: () = assert!(align_of::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550>() == 8);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550, gpuCount) == 128);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550, p2pCaps) == 132);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550,
        p2pOptimalReadCEs
    ) == 136
);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550,
        p2pOptimalWriteCEs
    ) == 140
);
const _: () =
    assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550, p2pCapsStatus) == 144);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550, busPeerIds) == 160);
const _: () =
    assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550, busEgmPeerIds) == 168);

/// `NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS` (`ctrl0000unix.h`): the layout since 545 (adds `gpuInstanceId`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS_V545 {
    pub fd: i32,
    pub deviceInstance: u32,
    pub gpuInstanceId: u32,
    pub maxObjects: u16,
    pub metadata: [u8; 64],
    pub _pad0: [u8; 2],
}
const _: () = assert!(size_of::<NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS_V545>() == 80);
const _: () = assert!(align_of::<NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS_V545>() == 4);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS_V545,
        deviceInstance
    ) == 4
);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS_V545,
        gpuInstanceId
    ) == 8
);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS_V545,
        maxObjects
    ) == 12
);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS_V545,
        metadata
    ) == 14
);

/// `NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS` (`ctrl0000system.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS {
    pub gpuIds: [u32; 32],
    pub gpuCount: u32,
    pub p2pCaps: u32,
    pub p2pOptimalReadCEs: u32,
    pub p2pOptimalWriteCEs: u32,
    pub p2pCapsStatus: [u8; 9],
    pub _pad0: [u8; 7],
    pub busPeerIds: NvP64,
}
const _: () = assert!(size_of::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS>() == 168);
const _: () = assert!(align_of::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS, gpuCount) == 128);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS, p2pCaps) == 132);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS, p2pOptimalReadCEs) == 136);
const _: () =
    assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS, p2pOptimalWriteCEs) == 140);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS, p2pCapsStatus) == 144);
const _: () = assert!(offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS, busPeerIds) == 160);

/// `NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS` (`ctrl0000unix.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS {
    pub fd: i32,
    pub deviceInstance: u32,
    pub maxObjects: u16,
    pub metadata: [u8; 64],
    pub _pad0: [u8; 2],
}
const _: () = assert!(size_of::<NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS>() == 76);
const _: () = assert!(align_of::<NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS>() == 4);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS,
        deviceInstance
    ) == 4
);
const _: () = assert!(
    offset_of!(
        NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS,
        maxObjects
    ) == 8
);
const _: () =
    assert!(offset_of!(NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS, metadata) == 10);
