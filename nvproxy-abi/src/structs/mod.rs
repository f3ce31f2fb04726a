//! `#[repr(C)]` parameter structs, named exactly as in the driver headers.
//!
//! Every struct derives zerocopy's `FromBytes`, `IntoBytes`, `KnownLayout` and `Immutable`, names
//! each padding byte (`_padN`), and pins its size, alignment and field offsets at compile time.
//! The parity test (`tests/parity.rs`) checks the same numbers against the facts of every
//! version in the tree. Where a layout changed between versions, the newer layout is a separate
//! type with a `_Vxxx` suffix naming the branch that introduced it; the plain name is the oldest
//! layout in the tree (535). Unions are exposed as byte arrays with accessors where the proxy
//! needs a member.
//!
//! Which layout a version uses follows from the table entry's param size (the variants of one
//! struct differ in size), except for `nv_ioctl_export_to_dma_buf_fd_t_V570`/`_V580`, which have
//! the same size and differ only in a byte of tail padding the proxy does not read, and
//! `UVM_SET_PREFERRED_LOCATION_PARAMS` (40 bytes in both layouts; [`uvm_preferred_location_v550`]
//! tells them apart).
#![allow(non_camel_case_types, non_snake_case)]

mod alloc;
mod client;
mod ctrl;
pub(crate) mod frontend;
pub mod layouts;
mod nvtypes;
mod proxy;
mod sim;
mod uvm;
mod uvm_more;

pub use alloc::*;
pub use client::*;
pub use ctrl::*;
pub use frontend::*;
pub use nvtypes::{NvHandle, NvP64, NvV32};
pub use proxy::*;
pub use sim::*;
pub use uvm::*;
pub use uvm_more::*;

/// C names of every struct modeled in this module (each `_Vxxx` variant models the same C
/// name). `abi-import` copies these layouts into the facts extracts, and the parity test checks
/// each of them for every version in the tree.
pub const MODELED_STRUCTS: &[&str] = &[
    "NV0000_CTRL_CLIENT_GET_ADDR_SPACE_TYPE_PARAMS",
    "NV0000_CTRL_CLIENT_SET_INHERITED_SHARE_POLICY_PARAMS",
    "NV0000_CTRL_GPU_ACTIVE_DEVICE",
    "NV0000_CTRL_GPU_ASYNC_ATTACH_ID_PARAMS",
    "NV0000_CTRL_GPU_ATTACH_IDS_PARAMS",
    "NV0000_CTRL_GPU_DETACH_IDS_PARAMS",
    "NV0000_CTRL_GPU_GET_ACTIVE_DEVICE_IDS_PARAMS",
    "NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS",
    "NV0000_CTRL_GPU_GET_DEVICE_IDS_PARAMS",
    "NV0000_CTRL_GPU_GET_ID_INFO_PARAMS",
    "NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS",
    "NV0000_CTRL_GPU_GET_MEMOP_ENABLE_PARAMS",
    "NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS",
    "NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS",
    "NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS",
    "NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS",
    "NV0000_CTRL_GPU_WAIT_ATTACH_ID_PARAMS",
    "NV0000_CTRL_OS_UNIX_EXPORT_OBJECT",
    "NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS",
    "NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS",
    "NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS",
    "NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS",
    "NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS",
    "NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS",
    "NV0000_CTRL_SYSTEM_GET_FABRIC_STATUS_PARAMS",
    "NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS",
    "NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS",
    "NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS",
    "NV0000_SYNC_GPU_BOOST_GROUP_CONFIG",
    "NV0000_SYNC_GPU_BOOST_GROUP_INFO_PARAMS",
    "NV0005_ALLOC_PARAMETERS",
    "NV0041_CTRL_GET_SURFACE_INFO_PARAMS",
    "NV0080_ALLOC_PARAMETERS",
    "NV0080_CTRL_FB_GET_CAPS_PARAMS",
    "NV0080_CTRL_FB_GET_CAPS_V2_PARAMS",
    "NV0080_CTRL_FIFO_GET_CAPS_PARAMS",
    "NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS",
    "NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS",
    "NV0080_CTRL_GPU_GET_NUM_SUBDEVICES_PARAMS",
    "NV0080_CTRL_GR_GET_CAPS_PARAMS",
    "NV0080_CTRL_GR_GET_INFO_PARAMS",
    "NV0080_CTRL_HOST_GET_CAPS_V2_PARAMS",
    "NV0080_CTRL_MSENC_GET_CAPS_PARAMS",
    "NV00F1_ALLOCATION_PARAMETERS",
    "NV00FD_ALLOCATION_PARAMETERS",
    "NV00FD_CTRL_ATTACH_GPU_PARAMS",
    "NV2080_ALLOC_PARAMETERS",
    "NV2080_CTRL_BIOS_GET_INFO_PARAMS",
    "NV2080_CTRL_BUS_GET_INFO_PARAMS",
    "NV2080_CTRL_BUS_GET_INFO_V2_PARAMS",
    "NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS",
    "NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS",
    "NV2080_CTRL_BUS_INFO",
    "NV2080_CTRL_BUS_PCI_BAR_INFO",
    "NV2080_CTRL_FB_GET_INFO_PARAMS",
    "NV2080_CTRL_FB_INFO",
    "NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS",
    "NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS",
    "NV2080_CTRL_GPU_GET_ACTIVE_PARTITION_IDS_PARAMS",
    "NV2080_CTRL_GPU_GET_ENGINES_PARAMS",
    "NV2080_CTRL_GPU_GET_GID_INFO_PARAMS",
    "NV2080_CTRL_GPU_GET_SHORT_NAME_STRING_PARAMS",
    "NV2080_CTRL_GPU_GET_SIMULATION_INFO_PARAMS",
    "NV2080_CTRL_GPU_INFO",
    "NV2080_CTRL_GPU_QUERY_COMPUTE_MODE_RULES_PARAMS",
    "NV2080_CTRL_GR_GET_CAPS_V2_PARAMS",
    "NV2080_CTRL_GR_GET_GPC_MASK_PARAMS",
    "NV2080_CTRL_GR_GET_INFO_PARAMS",
    "NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_PARAMS",
    "NV2080_CTRL_GR_GET_TPC_MASK_PARAMS",
    "NV2080_CTRL_GR_INFO",
    "NV2080_CTRL_GR_ROUTE_INFO",
    "NV2080_CTRL_GSP_GET_FEATURES_PARAMS",
    "NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS",
    "NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS",
    "NV2080_CTRL_TIMER_GPU_CPU_TIME_SAMPLE",
    "NV503C_CTRL_REGISTER_VA_SPACE_PARAMS",
    "NV83DE_ALLOC_PARAMETERS",
    "NV83DE_CTRL_DEBUG_READ_MEMORY_PARAMS",
    "NVOS00_PARAMETERS",
    "NVOS02_PARAMETERS",
    "NVOS05_PARAMETERS",
    "NVOS21_PARAMETERS",
    "NVOS30_PARAMETERS",
    "NVOS32_PARAMETERS",
    "NVOS33_PARAMETERS",
    "NVOS34_PARAMETERS",
    "NVOS39_PARAMETERS",
    "NVOS46_PARAMETERS",
    "NVOS47_PARAMETERS",
    "NVOS54_PARAMETERS",
    "NVOS55_PARAMETERS",
    "NVOS56_PARAMETERS",
    "NVOS57_PARAMETERS",
    "NVOS64_PARAMETERS",
    "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS",
    "NV_CONTEXT_DMA_ALLOCATION_PARAMS",
    "NV_CTXSHARE_ALLOCATION_PARAMETERS",
    "NV_HOPPER_USERMODE_A_PARAMS",
    "NV_MEMORY_ALLOCATION_PARAMS",
    "NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS",
    "NvProcessorUuid",
    "RS_SHARE_POLICY",
    "UVM_ALLOC_SEMAPHORE_POOL_PARAMS",
    "UVM_CREATE_EXTERNAL_RANGE_PARAMS",
    "UVM_CREATE_RANGE_GROUP_PARAMS",
    "UVM_DESTROY_RANGE_GROUP_PARAMS",
    "UVM_DISABLE_PEER_ACCESS_PARAMS",
    "UVM_DISABLE_READ_DUPLICATION_PARAMS",
    "UVM_ENABLE_PEER_ACCESS_PARAMS",
    "UVM_ENABLE_READ_DUPLICATION_PARAMS",
    "UVM_FREE_PARAMS",
    "UVM_INITIALIZE_PARAMS",
    "UVM_MAP_DYNAMIC_PARALLELISM_REGION_PARAMS",
    "UVM_MAP_EXTERNAL_ALLOCATION_PARAMS",
    "UVM_MIGRATE_PARAMS",
    "UVM_MIGRATE_RANGE_GROUP_PARAMS",
    "UVM_MM_INITIALIZE_PARAMS",
    "UVM_PAGEABLE_MEM_ACCESS_ON_GPU_PARAMS",
    "UVM_PAGEABLE_MEM_ACCESS_PARAMS",
    "UVM_REGISTER_CHANNEL_PARAMS",
    "UVM_REGISTER_GPU_PARAMS",
    "UVM_REGISTER_GPU_VASPACE_PARAMS",
    "UVM_SET_ACCESSED_BY_PARAMS",
    "UVM_SET_PREFERRED_LOCATION_PARAMS",
    "UVM_SET_RANGE_GROUP_PARAMS",
    "UVM_UNMAP_EXTERNAL_PARAMS",
    "UVM_UNREGISTER_CHANNEL_PARAMS",
    "UVM_UNREGISTER_GPU_PARAMS",
    "UVM_UNREGISTER_GPU_VASPACE_PARAMS",
    "UVM_UNSET_ACCESSED_BY_PARAMS",
    "UVM_UNSET_PREFERRED_LOCATION_PARAMS",
    "UVM_VALIDATE_VA_RANGE_PARAMS",
    "UvmGpuMappingAttributes",
    "nv_ioctl_alloc_os_event_t",
    "nv_ioctl_card_info_t",
    "nv_ioctl_export_to_dma_buf_fd_t",
    "nv_ioctl_free_os_event_t",
    "nv_ioctl_numa_info_t",
    "nv_ioctl_nvos02_parameters_with_fd",
    "nv_ioctl_nvos33_parameters_with_fd",
    "nv_ioctl_register_fd_t",
    "nv_ioctl_rm_api_version_t",
    "nv_ioctl_status_code_t",
    "nv_ioctl_sys_params_t",
    "nv_ioctl_wait_open_complete_t",
    "nv_ioctl_xfer_t",
    "nv_offline_addresses_t",
    "nv_pci_info_t",
];
