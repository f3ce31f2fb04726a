//! Params of simple escapes and controls that the simulated driver (`nvsim`) answers: the
//! values a CUDA or `nvidia-smi` initialisation reads back (`nv-ioctl.h`, `ctrl0000*.h`,
//! `ctrl0080*.h`, `ctrl2080*.h`, `cl2080.h`).
//!
//! Only layouts that are identical in every version of the tree live here (the GPU-id controls
//! are in `proxy.rs`). Controls whose params grow with a list capacity between versions
//! (`GPU_GET_INFO_V2`, `FB_GET_INFO_V2`, `GPU_GET_CLASSLIST_V2`) or lose a member
//! (`GPU_GET_NAME_STRING` drops its unicode buffer in 595) are modeled by their element structs;
//! their size per version is the control's `param_size` in the version's table.
#![allow(missing_docs)] // every struct is documented; fields keep the C member names of the header

use core::mem::{align_of, offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::frontend::RS_SHARE_POLICY;
use super::nvtypes::NvHandle;

/// `nv_ioctl_status_code_t` (`nv-ioctl.h`): argument of `NV_ESC_STATUS_CODE`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_status_code_t {
    pub domain: u32,
    pub bus: u8,
    pub slot: u8,
    pub _pad0: [u8; 2],
    pub status: u32,
}
const _: () = assert!(size_of::<nv_ioctl_status_code_t>() == 12);
const _: () = assert!(align_of::<nv_ioctl_status_code_t>() == 4);
const _: () = assert!(offset_of!(nv_ioctl_status_code_t, bus) == 4);
const _: () = assert!(offset_of!(nv_ioctl_status_code_t, slot) == 5);
const _: () = assert!(offset_of!(nv_ioctl_status_code_t, status) == 8);

/// `NV0000_CTRL_SYSTEM_GET_FABRIC_STATUS_PARAMS` (`ctrl0000system.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_SYSTEM_GET_FABRIC_STATUS_PARAMS {
    pub fabricStatus: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_SYSTEM_GET_FABRIC_STATUS_PARAMS>() == 4);
const _: () = assert!(align_of::<NV0000_CTRL_SYSTEM_GET_FABRIC_STATUS_PARAMS>() == 4);

/// `NV0000_CTRL_CLIENT_SET_INHERITED_SHARE_POLICY_PARAMS` (`ctrl0000client.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_CLIENT_SET_INHERITED_SHARE_POLICY_PARAMS {
    pub sharePolicy: RS_SHARE_POLICY,
}
const _: () = assert!(size_of::<NV0000_CTRL_CLIENT_SET_INHERITED_SHARE_POLICY_PARAMS>() == 12);
const _: () = assert!(align_of::<NV0000_CTRL_CLIENT_SET_INHERITED_SHARE_POLICY_PARAMS>() == 4);

/// `NV0000_CTRL_GPU_GET_DEVICE_IDS_PARAMS` (`ctrl0000gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_DEVICE_IDS_PARAMS {
    pub deviceIds: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_GET_DEVICE_IDS_PARAMS>() == 4);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_GET_DEVICE_IDS_PARAMS>() == 4);

/// `NV0000_CTRL_CLIENT_GET_ADDR_SPACE_TYPE_PARAMS` (`ctrl0000client.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_CLIENT_GET_ADDR_SPACE_TYPE_PARAMS {
    pub hObject: NvHandle,
    pub mapFlags: u32,
    pub addrSpaceType: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_CLIENT_GET_ADDR_SPACE_TYPE_PARAMS>() == 12);
const _: () = assert!(align_of::<NV0000_CTRL_CLIENT_GET_ADDR_SPACE_TYPE_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_CTRL_CLIENT_GET_ADDR_SPACE_TYPE_PARAMS, mapFlags) == 4);
const _: () =
    assert!(offset_of!(NV0000_CTRL_CLIENT_GET_ADDR_SPACE_TYPE_PARAMS, addrSpaceType) == 8);

/// `NV0080_CTRL_GPU_GET_NUM_SUBDEVICES_PARAMS` (`ctrl0080gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0080_CTRL_GPU_GET_NUM_SUBDEVICES_PARAMS {
    pub numSubDevices: u32,
}
const _: () = assert!(size_of::<NV0080_CTRL_GPU_GET_NUM_SUBDEVICES_PARAMS>() == 4);
const _: () = assert!(align_of::<NV0080_CTRL_GPU_GET_NUM_SUBDEVICES_PARAMS>() == 4);

/// `NV2080_CTRL_GPU_INFO` (`ctrl2080gpu.h`): one entry of `GPU_GET_INFO_V2`'s list.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GPU_INFO {
    pub index: u32,
    pub data: u32,
}
const _: () = assert!(size_of::<NV2080_CTRL_GPU_INFO>() == 8);
const _: () = assert!(align_of::<NV2080_CTRL_GPU_INFO>() == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_GPU_INFO, data) == 4);

/// `NV2080_CTRL_FB_INFO` (`ctrl2080fb.h`): one entry of `FB_GET_INFO(_V2)`'s list.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_FB_INFO {
    pub index: u32,
    pub data: u32,
}
const _: () = assert!(size_of::<NV2080_CTRL_FB_INFO>() == 8);
const _: () = assert!(align_of::<NV2080_CTRL_FB_INFO>() == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_FB_INFO, data) == 4);

/// `NV2080_CTRL_GR_INFO` (`ctrl2080gr.h`): one entry of `GR_GET_INFO(_V2)`'s list.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GR_INFO {
    pub index: u32,
    pub data: u32,
}
const _: () = assert!(size_of::<NV2080_CTRL_GR_INFO>() == 8);
const _: () = assert!(align_of::<NV2080_CTRL_GR_INFO>() == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_GR_INFO, data) == 4);

/// `NV2080_CTRL_GPU_GET_SHORT_NAME_STRING_PARAMS` (`ctrl2080gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GPU_GET_SHORT_NAME_STRING_PARAMS {
    pub gpuShortNameString: [u8; 64],
}
const _: () = assert!(size_of::<NV2080_CTRL_GPU_GET_SHORT_NAME_STRING_PARAMS>() == 64);
const _: () = assert!(align_of::<NV2080_CTRL_GPU_GET_SHORT_NAME_STRING_PARAMS>() == 1);

/// `NV2080_CTRL_GPU_GET_GID_INFO_PARAMS` (`ctrl2080gpu.h`): the GPU's UUID.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GPU_GET_GID_INFO_PARAMS {
    pub index: u32,
    pub flags: u32,
    pub length: u32,
    pub data: [u8; 256],
}
const _: () = assert!(size_of::<NV2080_CTRL_GPU_GET_GID_INFO_PARAMS>() == 268);
const _: () = assert!(align_of::<NV2080_CTRL_GPU_GET_GID_INFO_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_GPU_GET_GID_INFO_PARAMS, flags) == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_GPU_GET_GID_INFO_PARAMS, length) == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_GPU_GET_GID_INFO_PARAMS, data) == 12);

/// `NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS` (`ctrl2080bus.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS {
    pub pciDeviceId: u32,
    pub pciSubSystemId: u32,
    pub pciRevisionId: u32,
    pub pciExtDeviceId: u32,
}
const _: () = assert!(size_of::<NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS>() == 16);
const _: () = assert!(align_of::<NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS, pciSubSystemId) == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS, pciRevisionId) == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS, pciExtDeviceId) == 12);

/// `NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS` (`ctrl2080mc.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS {
    pub architecture: u32,
    pub implementation: u32,
    pub revision: u32,
    pub subRevision: u8,
    pub _pad0: [u8; 3],
}
const _: () = assert!(size_of::<NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS>() == 16);
const _: () = assert!(align_of::<NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS, implementation) == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS, revision) == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS, subRevision) == 12);

/// `NV2080_CTRL_GPU_GET_SIMULATION_INFO_PARAMS` (`ctrl2080gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GPU_GET_SIMULATION_INFO_PARAMS {
    pub r#type: u32,
}
const _: () = assert!(size_of::<NV2080_CTRL_GPU_GET_SIMULATION_INFO_PARAMS>() == 4);
const _: () = assert!(align_of::<NV2080_CTRL_GPU_GET_SIMULATION_INFO_PARAMS>() == 4);
