//! Params of the controls and classes NVIDIA's own clients (`libcuda.so.1`'s `cuInit`,
//! `nvidia-smi` / NVML) use at initialisation beyond the frontend set in `sim.rs`, as the
//! simulated driver answers them (`nvsim/src/control_init.rs`): `ctrl0000gpu.h`,
//! `ctrl0000syncgpuboost.h`, `ctrl0080host.h`, `ctrl0080fb.h`, `ctrl2080gpu.h`, `ctrl2080bus.h`,
//! `ctrl2080tmr.h`, `ctrl2080gsp.h`, `ctrl2080gr.h`, `nvos.h`.
//!
//! Only layouts identical in every version of the tree live here. Params that grow between
//! versions are left to their users to lay out by the table's `param_size`:
//! `NV2080_CTRL_GPU_GET_ENGINES_V2_PARAMS` (the engine list grows from 62 to 84 entries),
//! `NV2080_CTRL_CE_GET_ALL_CAPS_PARAMS` (32 copy engines with a u32 mask before 545, 64 with a
//! u64 mask after), `NV2080_CTRL_GR_GET_GLOBAL_SM_ORDER_PARAMS` (12-byte SM entries, 14 at 575,
//! 18 from 580) and `NV0080_CTRL_GPU_GET_VIRTUALIZATION_MODE_PARAMS` (`isGridBuild` from 555).
#![allow(missing_docs)] // every struct is documented; fields keep the C member names of the header

use core::mem::{align_of, offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::ctrl::NV2080_CTRL_GR_ROUTE_INFO;

/// `NV0000_SYNC_GPU_BOOST_GROUP_CONFIG` (`ctrl0000syncgpuboost.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_SYNC_GPU_BOOST_GROUP_CONFIG {
    pub gpuCount: u32,
    pub gpuIds: [u32; 32],
    pub boostGroupId: u32,
    pub bBridgeless: u8,
    pub _pad0: [u8; 3],
}
const _: () = assert!(size_of::<NV0000_SYNC_GPU_BOOST_GROUP_CONFIG>() == 140);
const _: () = assert!(align_of::<NV0000_SYNC_GPU_BOOST_GROUP_CONFIG>() == 4);
const _: () = assert!(offset_of!(NV0000_SYNC_GPU_BOOST_GROUP_CONFIG, gpuIds) == 4);
const _: () = assert!(offset_of!(NV0000_SYNC_GPU_BOOST_GROUP_CONFIG, boostGroupId) == 132);
const _: () = assert!(offset_of!(NV0000_SYNC_GPU_BOOST_GROUP_CONFIG, bBridgeless) == 136);

/// `NV0000_SYNC_GPU_BOOST_GROUP_INFO_PARAMS`: `NV0000_CTRL_CMD_SYNC_GPU_BOOST_GROUP_INFO`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_SYNC_GPU_BOOST_GROUP_INFO_PARAMS {
    pub groupCount: u32,
    pub pBoostGroups: [NV0000_SYNC_GPU_BOOST_GROUP_CONFIG; 16],
}
const _: () = assert!(size_of::<NV0000_SYNC_GPU_BOOST_GROUP_INFO_PARAMS>() == 2244);
const _: () = assert!(align_of::<NV0000_SYNC_GPU_BOOST_GROUP_INFO_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV0000_SYNC_GPU_BOOST_GROUP_INFO_PARAMS, pBoostGroups) == 4);

/// `NV0000_CTRL_GPU_GET_MEMOP_ENABLE_PARAMS` (`ctrl0000gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_MEMOP_ENABLE_PARAMS {
    pub enableMask: u32,
}
const _: () = assert!(size_of::<NV0000_CTRL_GPU_GET_MEMOP_ENABLE_PARAMS>() == 4);
const _: () = assert!(align_of::<NV0000_CTRL_GPU_GET_MEMOP_ENABLE_PARAMS>() == 4);

/// `NV0080_CTRL_HOST_GET_CAPS_V2_PARAMS` (`ctrl0080host.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0080_CTRL_HOST_GET_CAPS_V2_PARAMS {
    pub capsTbl: [u8; 3],
}
const _: () = assert!(size_of::<NV0080_CTRL_HOST_GET_CAPS_V2_PARAMS>() == 3);
const _: () = assert!(align_of::<NV0080_CTRL_HOST_GET_CAPS_V2_PARAMS>() == 1);

/// `NV0080_CTRL_FB_GET_CAPS_V2_PARAMS` (`ctrl0080fb.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0080_CTRL_FB_GET_CAPS_V2_PARAMS {
    pub capsTbl: [u8; 3],
}
const _: () = assert!(size_of::<NV0080_CTRL_FB_GET_CAPS_V2_PARAMS>() == 3);
const _: () = assert!(align_of::<NV0080_CTRL_FB_GET_CAPS_V2_PARAMS>() == 1);

/// `NV2080_CTRL_GPU_GET_ACTIVE_PARTITION_IDS_PARAMS` (`ctrl2080gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GPU_GET_ACTIVE_PARTITION_IDS_PARAMS {
    pub swizzId: [u32; 9],
    pub partitionCount: u32,
}
const _: () = assert!(size_of::<NV2080_CTRL_GPU_GET_ACTIVE_PARTITION_IDS_PARAMS>() == 40);
const _: () = assert!(align_of::<NV2080_CTRL_GPU_GET_ACTIVE_PARTITION_IDS_PARAMS>() == 4);
const _: () = assert!(
    offset_of!(
        NV2080_CTRL_GPU_GET_ACTIVE_PARTITION_IDS_PARAMS,
        partitionCount
    ) == 36
);

/// `NV2080_CTRL_GPU_QUERY_COMPUTE_MODE_RULES_PARAMS` (`ctrl2080gpu.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GPU_QUERY_COMPUTE_MODE_RULES_PARAMS {
    pub rules: u32,
}
const _: () = assert!(size_of::<NV2080_CTRL_GPU_QUERY_COMPUTE_MODE_RULES_PARAMS>() == 4);
const _: () = assert!(align_of::<NV2080_CTRL_GPU_QUERY_COMPUTE_MODE_RULES_PARAMS>() == 4);

/// `NV2080_CTRL_BUS_INFO` (`ctrl2080bus.h`): one `{index, data}` entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_BUS_INFO {
    pub index: u32,
    pub data: u32,
}
const _: () = assert!(size_of::<NV2080_CTRL_BUS_INFO>() == 8);
const _: () = assert!(align_of::<NV2080_CTRL_BUS_INFO>() == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_BUS_INFO, data) == 4);

/// `NV2080_CTRL_BUS_GET_INFO_V2_PARAMS` (`ctrl2080bus.h`): `NV2080_CTRL_BUS_INFO_MAX_LIST_SIZE`
/// (52) entries.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_BUS_GET_INFO_V2_PARAMS {
    pub busInfoListSize: u32,
    pub busInfoList: [NV2080_CTRL_BUS_INFO; 52],
}
const _: () = assert!(size_of::<NV2080_CTRL_BUS_GET_INFO_V2_PARAMS>() == 420);
const _: () = assert!(align_of::<NV2080_CTRL_BUS_GET_INFO_V2_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_BUS_GET_INFO_V2_PARAMS, busInfoList) == 4);

/// `NV2080_CTRL_BUS_PCI_BAR_INFO` (`ctrl2080bus.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_BUS_PCI_BAR_INFO {
    pub flags: u32,
    pub barSize: u32,
    pub barSizeBytes: u64,
    pub barOffset: u64,
}
const _: () = assert!(size_of::<NV2080_CTRL_BUS_PCI_BAR_INFO>() == 24);
const _: () = assert!(align_of::<NV2080_CTRL_BUS_PCI_BAR_INFO>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_BUS_PCI_BAR_INFO, barSize) == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_BUS_PCI_BAR_INFO, barSizeBytes) == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_BUS_PCI_BAR_INFO, barOffset) == 16);

/// `NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS` (`ctrl2080bus.h`): `NV2080_CTRL_BUS_MAX_PCI_BARS`
/// (8) entries.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS {
    pub pciBarCount: u32,
    pub _pad0: [u8; 4],
    pub pciBarInfo: [NV2080_CTRL_BUS_PCI_BAR_INFO; 8],
}
const _: () = assert!(size_of::<NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS>() == 200);
const _: () = assert!(align_of::<NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS, pciBarInfo) == 8);

/// `NV2080_CTRL_TIMER_GPU_CPU_TIME_SAMPLE` (`ctrl2080tmr.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_TIMER_GPU_CPU_TIME_SAMPLE {
    pub cpuTime: u64,
    pub gpuTime: u64,
}
const _: () = assert!(size_of::<NV2080_CTRL_TIMER_GPU_CPU_TIME_SAMPLE>() == 16);
const _: () = assert!(align_of::<NV2080_CTRL_TIMER_GPU_CPU_TIME_SAMPLE>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_TIMER_GPU_CPU_TIME_SAMPLE, gpuTime) == 8);

/// `NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS` (`ctrl2080tmr.h`):
/// `NV2080_CTRL_TIMER_GPU_CPU_TIME_MAX_SAMPLES` (16) samples.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS {
    pub cpuClkId: u8,
    pub sampleCount: u8,
    pub _pad0: [u8; 6],
    pub samples: [NV2080_CTRL_TIMER_GPU_CPU_TIME_SAMPLE; 16],
}
const _: () =
    assert!(size_of::<NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS>() == 264);
const _: () =
    assert!(align_of::<NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS>() == 8);
const _: () = assert!(
    offset_of!(
        NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS,
        sampleCount
    ) == 1
);
const _: () = assert!(
    offset_of!(
        NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS,
        samples
    ) == 8
);

/// `NV2080_CTRL_GSP_GET_FEATURES_PARAMS` (`ctrl2080gsp.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GSP_GET_FEATURES_PARAMS {
    pub gspFeatures: u32,
    pub bValid: u8,
    pub bDefaultGspRmGpu: u8,
    pub firmwareVersion: [u8; 64],
    pub _pad0: [u8; 2],
}
const _: () = assert!(size_of::<NV2080_CTRL_GSP_GET_FEATURES_PARAMS>() == 72);
const _: () = assert!(align_of::<NV2080_CTRL_GSP_GET_FEATURES_PARAMS>() == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_GSP_GET_FEATURES_PARAMS, bValid) == 4);
const _: () = assert!(offset_of!(NV2080_CTRL_GSP_GET_FEATURES_PARAMS, bDefaultGspRmGpu) == 5);
const _: () = assert!(offset_of!(NV2080_CTRL_GSP_GET_FEATURES_PARAMS, firmwareVersion) == 6);

/// `NV2080_CTRL_GR_GET_CAPS_V2_PARAMS` (`ctrl2080gr.h`): `NV0080_CTRL_GR_CAPS_TBL_SIZE` (23)
/// caps bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GR_GET_CAPS_V2_PARAMS {
    pub capsTbl: [u8; 23],
    pub _pad0: [u8; 1],
    pub grRouteInfo: NV2080_CTRL_GR_ROUTE_INFO,
    pub bCapsPopulated: u8,
    pub _pad1: [u8; 7],
}
const _: () = assert!(size_of::<NV2080_CTRL_GR_GET_CAPS_V2_PARAMS>() == 48);
const _: () = assert!(align_of::<NV2080_CTRL_GR_GET_CAPS_V2_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_GR_GET_CAPS_V2_PARAMS, grRouteInfo) == 24);
const _: () = assert!(offset_of!(NV2080_CTRL_GR_GET_CAPS_V2_PARAMS, bCapsPopulated) == 40);

/// `NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_PARAMS` (`ctrl2080gr.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_PARAMS {
    pub grRouteInfo: NV2080_CTRL_GR_ROUTE_INFO,
    pub imla0: u8,
    pub fmla16: u8,
    pub dp: u8,
    pub fmla32: u8,
    pub ffma: u8,
    pub imla1: u8,
    pub imla2: u8,
    pub imla3: u8,
    pub imla4: u8,
    pub _pad0: [u8; 7],
}
const _: () = assert!(size_of::<NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_PARAMS>() == 32);
const _: () = assert!(align_of::<NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_PARAMS, imla0) == 16);
const _: () = assert!(offset_of!(NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_PARAMS, imla4) == 24);

/// `NV2080_CTRL_GR_GET_GPC_MASK_PARAMS` (`ctrl2080gr.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GR_GET_GPC_MASK_PARAMS {
    pub grRouteInfo: NV2080_CTRL_GR_ROUTE_INFO,
    pub gpcMask: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<NV2080_CTRL_GR_GET_GPC_MASK_PARAMS>() == 24);
const _: () = assert!(align_of::<NV2080_CTRL_GR_GET_GPC_MASK_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_GR_GET_GPC_MASK_PARAMS, gpcMask) == 16);

/// `NV2080_CTRL_GR_GET_TPC_MASK_PARAMS` (`ctrl2080gr.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV2080_CTRL_GR_GET_TPC_MASK_PARAMS {
    pub grRouteInfo: NV2080_CTRL_GR_ROUTE_INFO,
    pub gpcId: u32,
    pub tpcMask: u32,
}
const _: () = assert!(size_of::<NV2080_CTRL_GR_GET_TPC_MASK_PARAMS>() == 24);
const _: () = assert!(align_of::<NV2080_CTRL_GR_GET_TPC_MASK_PARAMS>() == 8);
const _: () = assert!(offset_of!(NV2080_CTRL_GR_GET_TPC_MASK_PARAMS, gpcId) == 16);
const _: () = assert!(offset_of!(NV2080_CTRL_GR_GET_TPC_MASK_PARAMS, tpcMask) == 20);

/// `NV_HOPPER_USERMODE_A_PARAMS` (`nvos.h`): the optional alloc params of `HOPPER_USERMODE_A`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV_HOPPER_USERMODE_A_PARAMS {
    pub bBar1Mapping: u8,
    pub bPriv: u8,
}
const _: () = assert!(size_of::<NV_HOPPER_USERMODE_A_PARAMS>() == 2);
const _: () = assert!(align_of::<NV_HOPPER_USERMODE_A_PARAMS>() == 1);
const _: () = assert!(offset_of!(NV_HOPPER_USERMODE_A_PARAMS, bPriv) == 1);
