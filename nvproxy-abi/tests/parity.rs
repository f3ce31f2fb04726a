//! ABI parity: every node's tables and every modeled struct against the facts extracted from
//! the driver headers of that version (`facts/<node.facts>.json`, written by `abi-import
//! extract`; versions with the same ABI share one file, `facts/index.tsv`).
//!
//! Checked per node: for every table entry, its number, param struct name(s), size and
//! array-ness; that every entry any node knows and the driver has is in the table
//! (completeness); for every modeled struct the driver has, that one of its Rust layouts matches
//! it: size, alignment and each field's offset and size (C field names; padding fields
//! excluded), with the Rust fields covering every top-level C member. A node that fails is
//! unqualified with a reason; a supported node passes everything.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::{align_of, offset_of, size_of};

use nvproxy_abi::structs::*;
use nvproxy_abi::{DriverAbi, ParamSize, Support, nodes};
use serde_json::Value;

struct Layout {
    c_name: &'static str,
    rust: &'static str,
    size: usize,
    align: usize,
    fields: Vec<(&'static str, usize, usize)>,
}

fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

macro_rules! layout {
    ($c:literal => $t:ident { $($f:ident),* $(,)? }) => {
        Layout {
            c_name: $c,
            rust: stringify!($t),
            size: size_of::<$t>(),
            align: align_of::<$t>(),
            fields: vec![$((
                stringify!($f).trim_start_matches("r#"),
                offset_of!($t, $f),
                field_size(|s: &$t| &s.$f),
            )),*],
        }
    };
}

fn layouts() -> Vec<Layout> {
    vec![
        layout!("NV0005_ALLOC_PARAMETERS" => NV0005_ALLOC_PARAMETERS { hParentClient, hSrcResource, hClass, notifyIndex, data }),
        layout!("NV00F1_ALLOCATION_PARAMETERS" => NV00F1_ALLOCATION_PARAMETERS { capDescriptor, flags, pOsEvent, nodeId }),
        layout!("NV_MEMORY_ALLOCATION_PARAMS" => NV_MEMORY_ALLOCATION_PARAMS_V545 { owner, r#type, flags, width, height, pitch, attr, attr2, format, comprCovg, zcullCovg, rangeLo, rangeHi, size, alignment, offset, limit, address, ctagOffset, hVASpace, internalflags, tag, numaNode }),
        layout!("NV00FD_ALLOCATION_PARAMETERS" => NV00FD_ALLOCATION_PARAMETERS_V545 { expPacket, index, alignment, allocSize, pageSize, allocFlags, numGpus, pOsEvent }),
        layout!("NV0080_ALLOC_PARAMETERS" => NV0080_ALLOC_PARAMETERS { deviceId, hClientShare, hTargetClient, hTargetDevice, flags, vaSpaceSize, vaStartInternal, vaLimitInternal, vaMode }),
        layout!("NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS" => NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS { offset, limit, hVASpace }),
        layout!("NV_CONTEXT_DMA_ALLOCATION_PARAMS" => NV_CONTEXT_DMA_ALLOCATION_PARAMS { hSubDevice, flags, hMemory, offset, limit }),
        layout!("NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS" => NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS { hObjectError, hObjectEccError, hVASpace, engineType, bIsCallingContextVgpuPlugin }),
        layout!("NV_CTXSHARE_ALLOCATION_PARAMETERS" => NV_CTXSHARE_ALLOCATION_PARAMETERS { hVASpace, flags, subctxId }),
        layout!("NV83DE_ALLOC_PARAMETERS" => NV83DE_ALLOC_PARAMETERS { hDebuggerClient_Obsolete, hAppClient, hClass3dObject }),
        layout!("NV_MEMORY_ALLOCATION_PARAMS" => NV_MEMORY_ALLOCATION_PARAMS { owner, r#type, flags, width, height, pitch, attr, attr2, format, comprCovg, zcullCovg, rangeLo, rangeHi, size, alignment, offset, limit, address, ctagOffset, hVASpace, internalflags, tag }),
        layout!("NV00FD_ALLOCATION_PARAMETERS" => NV00FD_ALLOCATION_PARAMETERS { alignment, allocSize, pageSize, allocFlags, numGpus, pOsEvent }),
        layout!("NV00FD_ALLOCATION_PARAMETERS" => NV00FD_ALLOCATION_PARAMETERS_V590 { expPacket, index, alignment, allocSize, pageSize, allocFlags, numGpus, pOsEvent }),
        layout!("NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS" => NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS { sizeOfStrings, pDriverVersionBuffer, pVersionBuffer, pTitleBuffer, changelistNumber, officialChangelistNumber }),
        layout!("NV0000_CTRL_GPU_GET_ID_INFO_PARAMS" => NV0000_CTRL_GPU_GET_ID_INFO_PARAMS { gpuId, gpuFlags, deviceInstance, subDeviceInstance, szName, sliStatus, boardId, gpuInstance, numaId }),
        layout!("NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS" => NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS { object, fd, flags }),
        layout!("NV0000_CTRL_OS_UNIX_EXPORT_OBJECT" => NV0000_CTRL_OS_UNIX_EXPORT_OBJECT { r#type, data }),
        layout!("NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS" => NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS { fd, object }),
        layout!("NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS" => NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS { fd, hDevice, maxObjects, metadata, objects, numObjects, index }),
        layout!("NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS" => NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS { fd, hParent, objects, objectTypes, numObjects, index }),
        layout!("NV0041_CTRL_GET_SURFACE_INFO_PARAMS" => NV0041_CTRL_GET_SURFACE_INFO_PARAMS { surfaceInfoListSize, surfaceInfoList }),
        layout!("NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS" => NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS { numClasses, classList }),
        layout!("NV0080_CTRL_GR_GET_CAPS_PARAMS" => NV0080_CTRL_GR_GET_CAPS_PARAMS { capsTblSize, capsTbl }),
        layout!("NV0080_CTRL_FB_GET_CAPS_PARAMS" => NV0080_CTRL_FB_GET_CAPS_PARAMS { capsTblSize, capsTbl }),
        layout!("NV0080_CTRL_FIFO_GET_CAPS_PARAMS" => NV0080_CTRL_FIFO_GET_CAPS_PARAMS { capsTblSize, capsTbl }),
        layout!("NV0080_CTRL_MSENC_GET_CAPS_PARAMS" => NV0080_CTRL_MSENC_GET_CAPS_PARAMS { capsTblSize, capsTbl }),
        layout!("NV0080_CTRL_GR_GET_INFO_PARAMS" => NV0080_CTRL_GR_GET_INFO_PARAMS { grInfoListSize, grInfoList }),
        layout!("NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS" => NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS { numChannels, pChannelHandleList, pChannelList }),
        layout!("NV00FD_CTRL_ATTACH_GPU_PARAMS" => NV00FD_CTRL_ATTACH_GPU_PARAMS { hSubdevice, flags, devDescriptor }),
        layout!("NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS" => NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS { hClientTarget, hChannelTarget, bNonTransactional, reserved00, regOpCount, regOps, grRouteInfo }),
        layout!("NV2080_CTRL_GR_ROUTE_INFO" => NV2080_CTRL_GR_ROUTE_INFO { flags, route }),
        layout!("NV2080_CTRL_GPU_GET_ENGINES_PARAMS" => NV2080_CTRL_GPU_GET_ENGINES_PARAMS { engineCount, engineList }),
        layout!("NV2080_CTRL_BIOS_GET_INFO_PARAMS" => NV2080_CTRL_BIOS_GET_INFO_PARAMS { biosInfoListSize, biosInfoList }),
        layout!("NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS" => NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS { bDisable, numChannels, bOnlyDisableScheduling, bRewindGpPut, pRunlistPreemptEvent, hClientList, hChannelList }),
        layout!("NV2080_CTRL_GR_GET_INFO_PARAMS" => NV2080_CTRL_GR_GET_INFO_PARAMS { grInfoListSize, grInfoList, grRouteInfo }),
        layout!("NV2080_CTRL_FB_GET_INFO_PARAMS" => NV2080_CTRL_FB_GET_INFO_PARAMS { fbInfoListSize, fbInfoList }),
        layout!("NV2080_CTRL_BUS_GET_INFO_PARAMS" => NV2080_CTRL_BUS_GET_INFO_PARAMS { busInfoListSize, busInfoList }),
        layout!("NV503C_CTRL_REGISTER_VA_SPACE_PARAMS" => NV503C_CTRL_REGISTER_VA_SPACE_PARAMS { hVASpace, vaSpaceToken }),
        layout!("NV83DE_CTRL_DEBUG_READ_MEMORY_PARAMS" => NV83DE_CTRL_DEBUG_READ_MEMORY_PARAMS { hMemory, length, offset, buffer }),
        layout!("NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS" => NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550 { gpuIds, gpuCount, p2pCaps, p2pOptimalReadCEs, p2pOptimalWriteCEs, p2pCapsStatus, busPeerIds, busEgmPeerIds }),
        layout!("NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS" => NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS_V545 { fd, deviceInstance, gpuInstanceId, maxObjects, metadata }),
        layout!("NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS" => NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS { gpuIds, gpuCount, p2pCaps, p2pOptimalReadCEs, p2pOptimalWriteCEs, p2pCapsStatus, busPeerIds }),
        layout!("NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS" => NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS { fd, deviceInstance, maxObjects, metadata }),
        layout!("NVOS00_PARAMETERS" => NVOS00_PARAMETERS { hRoot, hObjectParent, hObjectOld, status }),
        layout!("NVOS02_PARAMETERS" => NVOS02_PARAMETERS { hRoot, hObjectParent, hObjectNew, hClass, flags, pMemory, limit, status }),
        layout!("nv_ioctl_nvos02_parameters_with_fd" => nv_ioctl_nvos02_parameters_with_fd { params, fd }),
        layout!("NVOS05_PARAMETERS" => NVOS05_PARAMETERS { hRoot, hObjectParent, hObjectNew, hClass, status }),
        layout!("NVOS21_PARAMETERS" => NVOS21_PARAMETERS { hRoot, hObjectParent, hObjectNew, hClass, pAllocParms, paramsSize, status }),
        layout!("NVOS30_PARAMETERS" => NVOS30_PARAMETERS { hClient, hDevice, hChannel, numChannels, phClients, phDevices, phChannels, flags, timeout, status }),
        layout!("NVOS32_PARAMETERS" => NVOS32_PARAMETERS { hRoot, hObjectParent, function, hVASpace, ivcHeapNumber, status, total, free, data }),
        layout!("NVOS33_PARAMETERS" => NVOS33_PARAMETERS { hClient, hDevice, hMemory, offset, length, pLinearAddress, status, flags }),
        layout!("nv_ioctl_nvos33_parameters_with_fd" => nv_ioctl_nvos33_parameters_with_fd { params, fd }),
        layout!("NVOS34_PARAMETERS" => NVOS34_PARAMETERS { hClient, hDevice, hMemory, pLinearAddress, status, flags }),
        layout!("NVOS39_PARAMETERS" => NVOS39_PARAMETERS { hObjectParent, hSubDevice, hObjectNew, hClass, flags, selector, hMemory, offset, limit, status }),
        layout!("NVOS54_PARAMETERS" => NVOS54_PARAMETERS { hClient, hObject, cmd, flags, params, paramsSize, status }),
        layout!("NVOS55_PARAMETERS" => NVOS55_PARAMETERS { hClient, hParent, hObject, hClientSrc, hObjectSrc, flags, status }),
        layout!("NVOS56_PARAMETERS" => NVOS56_PARAMETERS { hClient, hDevice, hMemory, pOldCpuAddress, pNewCpuAddress, status }),
        layout!("NVOS57_PARAMETERS" => NVOS57_PARAMETERS { hClient, hObject, sharePolicy, status }),
        layout!("RS_SHARE_POLICY" => RS_SHARE_POLICY { target, accessMask, r#type, action }),
        layout!("NVOS64_PARAMETERS" => NVOS64_PARAMETERS { hRoot, hObjectParent, hObjectNew, hClass, pAllocParms, pRightsRequested, paramsSize, flags, status }),
        layout!("nv_ioctl_card_info_t" => nv_ioctl_card_info_t { valid, pci_info, gpu_id, interrupt_line, reg_address, reg_size, fb_address, fb_size, minor_number, dev_name }),
        layout!("nv_pci_info_t" => nv_pci_info_t { domain, bus, slot, function, vendor_id, device_id }),
        layout!("nv_ioctl_register_fd_t" => nv_ioctl_register_fd_t { ctl_fd }),
        layout!("nv_ioctl_alloc_os_event_t" => nv_ioctl_alloc_os_event_t { hClient, hDevice, fd, Status }),
        layout!("nv_ioctl_free_os_event_t" => nv_ioctl_free_os_event_t { hClient, hDevice, fd, Status }),
        layout!("nv_ioctl_rm_api_version_t" => nv_ioctl_rm_api_version_t { cmd, reply, versionString }),
        layout!("nv_ioctl_sys_params_t" => nv_ioctl_sys_params_t { memblock_size }),
        layout!("nv_ioctl_xfer_t" => nv_ioctl_xfer_t { cmd, size, ptr }),
        layout!("nv_ioctl_wait_open_complete_t" => nv_ioctl_wait_open_complete_t { rc, adapterStatus }),
        layout!("NVOS46_PARAMETERS" => NVOS46_PARAMETERS_V580 { hClient, hDevice, hDma, hMemory, offset, length, flags, flags2, kindOverride, dmaOffset, status }),
        layout!("nv_ioctl_export_to_dma_buf_fd_t" => nv_ioctl_export_to_dma_buf_fd_t_V580 { fd, hClient, totalObjects, numObjects, index, totalSize, mappingType, bAllowMmap, handles, offsets, sizes, status }),
        layout!("NVOS46_PARAMETERS" => NVOS46_PARAMETERS { hClient, hDevice, hDma, hMemory, offset, length, flags, dmaOffset, status }),
        layout!("NVOS47_PARAMETERS" => NVOS47_PARAMETERS { hClient, hDevice, hDma, hMemory, flags, dmaOffset, status }),
        layout!("nv_ioctl_export_to_dma_buf_fd_t" => nv_ioctl_export_to_dma_buf_fd_t { fd, hClient, totalObjects, numObjects, index, totalSize, handles, offsets, sizes, status }),
        layout!("NVOS47_PARAMETERS" => NVOS47_PARAMETERS_V550 { hClient, hDevice, hDma, hMemory, flags, dmaOffset, size, status }),
        layout!("nv_ioctl_export_to_dma_buf_fd_t" => nv_ioctl_export_to_dma_buf_fd_t_V570 { fd, hClient, totalObjects, numObjects, index, totalSize, mappingType, handles, offsets, sizes, status }),
        layout!("NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS" => NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS { gpuIds }),
        layout!("NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS" => NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS { gpuIds, excludedGpuIds }),
        layout!("NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS" => NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580 { gpuIds, excludedGpuIds, gpuFlags }),
        layout!("NV0000_CTRL_GPU_ATTACH_IDS_PARAMS" => NV0000_CTRL_GPU_ATTACH_IDS_PARAMS { gpuIds, failedId }),
        layout!("NV0000_CTRL_GPU_DETACH_IDS_PARAMS" => NV0000_CTRL_GPU_DETACH_IDS_PARAMS { gpuIds }),
        layout!("NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS" => NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS { gpuId, gpuFlags, deviceInstance, subDeviceInstance, sliStatus, boardId, gpuInstance, numaId }),
        layout!("NV0000_CTRL_GPU_ACTIVE_DEVICE" => NV0000_CTRL_GPU_ACTIVE_DEVICE { gpuId, gpuInstanceId, computeInstanceId }),
        layout!("NV0000_CTRL_GPU_GET_ACTIVE_DEVICE_IDS_PARAMS" => NV0000_CTRL_GPU_GET_ACTIVE_DEVICE_IDS_PARAMS { numDevices, devices }),
        layout!("NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS" => NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS { gpuId, flags, gpuUuid, uuidStrLen }),
        layout!("NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS" => NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS { gpuId, domain, bus, slot }),
        layout!("NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS" => NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS { gpuId, drainState, flags }),
        layout!("NV0000_CTRL_GPU_ASYNC_ATTACH_ID_PARAMS" => NV0000_CTRL_GPU_ASYNC_ATTACH_ID_PARAMS { gpuId }),
        layout!("NV0000_CTRL_GPU_WAIT_ATTACH_ID_PARAMS" => NV0000_CTRL_GPU_WAIT_ATTACH_ID_PARAMS { gpuId }),
        layout!("NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS" => NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS { gpuIds, gpuCount, p2pCaps, p2pOptimalReadCEs, p2pOptimalWriteCEs, p2pCapsStatus, busPeerIds }),
        layout!("NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS" => NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS_V550 { gpuIds, gpuCount, p2pCaps, p2pOptimalReadCEs, p2pOptimalWriteCEs, p2pCapsStatus, busPeerIds, busEgmPeerIds }),
        layout!("NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS" => NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS { grpACount, grpBCount, gpuIdGrpA, gpuIdGrpB, p2pCaps, a2bOptimalReadCes, a2bOptimalWriteCes, b2aOptimalReadCes, b2aOptimalWriteCes }),
        layout!("NV2080_ALLOC_PARAMETERS" => NV2080_ALLOC_PARAMETERS { subDeviceId }),
        layout!("nv_ioctl_status_code_t" => nv_ioctl_status_code_t { domain, bus, slot, status }),
        layout!("NV0000_CTRL_SYSTEM_GET_FABRIC_STATUS_PARAMS" => NV0000_CTRL_SYSTEM_GET_FABRIC_STATUS_PARAMS { fabricStatus }),
        layout!("NV0000_CTRL_CLIENT_SET_INHERITED_SHARE_POLICY_PARAMS" => NV0000_CTRL_CLIENT_SET_INHERITED_SHARE_POLICY_PARAMS { sharePolicy }),
        layout!("NV0000_CTRL_GPU_GET_DEVICE_IDS_PARAMS" => NV0000_CTRL_GPU_GET_DEVICE_IDS_PARAMS { deviceIds }),
        layout!("NV0000_CTRL_CLIENT_GET_ADDR_SPACE_TYPE_PARAMS" => NV0000_CTRL_CLIENT_GET_ADDR_SPACE_TYPE_PARAMS { hObject, mapFlags, addrSpaceType }),
        layout!("NV0080_CTRL_GPU_GET_NUM_SUBDEVICES_PARAMS" => NV0080_CTRL_GPU_GET_NUM_SUBDEVICES_PARAMS { numSubDevices }),
        layout!("NV2080_CTRL_GPU_INFO" => NV2080_CTRL_GPU_INFO { index, data }),
        layout!("NV2080_CTRL_FB_INFO" => NV2080_CTRL_FB_INFO { index, data }),
        layout!("NV2080_CTRL_GR_INFO" => NV2080_CTRL_GR_INFO { index, data }),
        layout!("NV2080_CTRL_GPU_GET_SHORT_NAME_STRING_PARAMS" => NV2080_CTRL_GPU_GET_SHORT_NAME_STRING_PARAMS { gpuShortNameString }),
        layout!("NV2080_CTRL_GPU_GET_GID_INFO_PARAMS" => NV2080_CTRL_GPU_GET_GID_INFO_PARAMS { index, flags, length, data }),
        layout!("NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS" => NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS { pciDeviceId, pciSubSystemId, pciRevisionId, pciExtDeviceId }),
        layout!("NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS" => NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS { architecture, implementation, revision, subRevision }),
        layout!("NV2080_CTRL_GPU_GET_SIMULATION_INFO_PARAMS" => NV2080_CTRL_GPU_GET_SIMULATION_INFO_PARAMS { r#type }),
        layout!("UVM_INITIALIZE_PARAMS" => UVM_INITIALIZE_PARAMS { flags, rmStatus }),
        layout!("UVM_MM_INITIALIZE_PARAMS" => UVM_MM_INITIALIZE_PARAMS { uvmFd, rmStatus }),
        layout!("UVM_REGISTER_GPU_PARAMS" => UVM_REGISTER_GPU_PARAMS { gpu_uuid, numaEnabled, numaNodeId, rmCtrlFd, hClient, hSmcPartRef, rmStatus }),
        layout!("UVM_REGISTER_GPU_VASPACE_PARAMS" => UVM_REGISTER_GPU_VASPACE_PARAMS { gpuUuid, rmCtrlFd, hClient, hVaSpace, rmStatus }),
        layout!("UVM_REGISTER_CHANNEL_PARAMS" => UVM_REGISTER_CHANNEL_PARAMS { gpuUuid, rmCtrlFd, hClient, hChannel, base, length, rmStatus }),
        layout!("UVM_MAP_EXTERNAL_ALLOCATION_PARAMS" => UVM_MAP_EXTERNAL_ALLOCATION_PARAMS { base, length, offset, perGpuAttributes, gpuAttributesCount, rmCtrlFd, hClient, hMemory, rmStatus }),
        layout!("UvmGpuMappingAttributes" => UvmGpuMappingAttributes { gpuUuid, gpuMappingType, gpuCachingType, gpuFormatType, gpuElementBits, gpuCompressionType }),
        layout!("NvProcessorUuid" => NvProcessorUuid { uuid }),
        layout!("UVM_MAP_EXTERNAL_ALLOCATION_PARAMS" => UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550 { base, length, offset, perGpuAttributes, gpuAttributesCount, rmCtrlFd, hClient, hMemory, rmStatus }),
        layout!("UVM_CREATE_RANGE_GROUP_PARAMS" => UVM_CREATE_RANGE_GROUP_PARAMS { rangeGroupId, rmStatus }),
        layout!("UVM_DESTROY_RANGE_GROUP_PARAMS" => UVM_DESTROY_RANGE_GROUP_PARAMS { rangeGroupId, rmStatus }),
        layout!("UVM_UNREGISTER_GPU_VASPACE_PARAMS" => UVM_UNREGISTER_GPU_VASPACE_PARAMS { gpuUuid, rmStatus }),
        layout!("UVM_UNREGISTER_CHANNEL_PARAMS" => UVM_UNREGISTER_CHANNEL_PARAMS { gpuUuid, hClient, hChannel, rmStatus }),
        layout!("UVM_UNREGISTER_CHANNEL_PARAMS" => UVM_UNREGISTER_CHANNEL_PARAMS_V590 { hClient, hChannel, rmStatus }),
        layout!("UVM_ENABLE_PEER_ACCESS_PARAMS" => UVM_ENABLE_PEER_ACCESS_PARAMS { gpuUuidA, gpuUuidB, rmStatus }),
        layout!("UVM_DISABLE_PEER_ACCESS_PARAMS" => UVM_DISABLE_PEER_ACCESS_PARAMS { gpuUuidA, gpuUuidB, rmStatus }),
        layout!("UVM_SET_RANGE_GROUP_PARAMS" => UVM_SET_RANGE_GROUP_PARAMS { rangeGroupId, requestedBase, length, rmStatus }),
        layout!("UVM_FREE_PARAMS" => UVM_FREE_PARAMS { base, length, rmStatus }),
        layout!("UVM_FREE_PARAMS" => UVM_FREE_PARAMS_V590 { base, rmStatus }),
        layout!("UVM_UNREGISTER_GPU_PARAMS" => UVM_UNREGISTER_GPU_PARAMS { gpu_uuid, rmStatus }),
        layout!("UVM_PAGEABLE_MEM_ACCESS_PARAMS" => UVM_PAGEABLE_MEM_ACCESS_PARAMS { pageableMemAccess, rmStatus }),
        layout!("UVM_SET_PREFERRED_LOCATION_PARAMS" => UVM_SET_PREFERRED_LOCATION_PARAMS { requestedBase, length, preferredLocation, rmStatus }),
        layout!("UVM_SET_PREFERRED_LOCATION_PARAMS" => UVM_SET_PREFERRED_LOCATION_PARAMS_V550 { requestedBase, length, preferredLocation, preferredCpuNumaNode, rmStatus }),
        layout!("UVM_UNSET_PREFERRED_LOCATION_PARAMS" => UVM_UNSET_PREFERRED_LOCATION_PARAMS { requestedBase, length, rmStatus }),
        layout!("UVM_ENABLE_READ_DUPLICATION_PARAMS" => UVM_ENABLE_READ_DUPLICATION_PARAMS { requestedBase, length, rmStatus }),
        layout!("UVM_DISABLE_READ_DUPLICATION_PARAMS" => UVM_DISABLE_READ_DUPLICATION_PARAMS { requestedBase, length, rmStatus }),
        layout!("UVM_SET_ACCESSED_BY_PARAMS" => UVM_SET_ACCESSED_BY_PARAMS { requestedBase, length, accessedByUuid, rmStatus }),
        layout!("UVM_UNSET_ACCESSED_BY_PARAMS" => UVM_UNSET_ACCESSED_BY_PARAMS { requestedBase, length, accessedByUuid, rmStatus }),
        layout!("UVM_MIGRATE_PARAMS" => UVM_MIGRATE_PARAMS { base, length, destinationUuid, flags, semaphoreAddress, semaphorePayload, cpuNumaNode, userSpaceStart, userSpaceLength, rmStatus }),
        layout!("UVM_MIGRATE_RANGE_GROUP_PARAMS" => UVM_MIGRATE_RANGE_GROUP_PARAMS { rangeGroupId, destinationUuid, rmStatus }),
        layout!("UVM_MAP_DYNAMIC_PARALLELISM_REGION_PARAMS" => UVM_MAP_DYNAMIC_PARALLELISM_REGION_PARAMS { base, length, gpuUuid, rmStatus }),
        layout!("UVM_UNMAP_EXTERNAL_PARAMS" => UVM_UNMAP_EXTERNAL_PARAMS { base, length, gpuUuid, rmStatus }),
        layout!("UVM_ALLOC_SEMAPHORE_POOL_PARAMS" => UVM_ALLOC_SEMAPHORE_POOL_PARAMS { base, length, perGpuAttributes, gpuAttributesCount, rmStatus }),
        layout!("UVM_ALLOC_SEMAPHORE_POOL_PARAMS" => UVM_ALLOC_SEMAPHORE_POOL_PARAMS_V550 { base, length, perGpuAttributes, gpuAttributesCount, rmStatus }),
        layout!("UVM_PAGEABLE_MEM_ACCESS_ON_GPU_PARAMS" => UVM_PAGEABLE_MEM_ACCESS_ON_GPU_PARAMS { gpu_uuid, pageableMemAccess, rmStatus }),
        layout!("UVM_VALIDATE_VA_RANGE_PARAMS" => UVM_VALIDATE_VA_RANGE_PARAMS { base, length, rmStatus }),
        layout!("UVM_CREATE_EXTERNAL_RANGE_PARAMS" => UVM_CREATE_EXTERNAL_RANGE_PARAMS { base, length, rmStatus }),
        // client.rs
        layout!("NV0000_SYNC_GPU_BOOST_GROUP_CONFIG" => NV0000_SYNC_GPU_BOOST_GROUP_CONFIG { gpuCount, gpuIds, boostGroupId, bBridgeless }),
        layout!("NV0000_SYNC_GPU_BOOST_GROUP_INFO_PARAMS" => NV0000_SYNC_GPU_BOOST_GROUP_INFO_PARAMS { groupCount, pBoostGroups }),
        layout!("NV0000_CTRL_GPU_GET_MEMOP_ENABLE_PARAMS" => NV0000_CTRL_GPU_GET_MEMOP_ENABLE_PARAMS { enableMask }),
        layout!("NV0080_CTRL_HOST_GET_CAPS_V2_PARAMS" => NV0080_CTRL_HOST_GET_CAPS_V2_PARAMS { capsTbl }),
        layout!("NV0080_CTRL_FB_GET_CAPS_V2_PARAMS" => NV0080_CTRL_FB_GET_CAPS_V2_PARAMS { capsTbl }),
        layout!("NV2080_CTRL_GPU_GET_ACTIVE_PARTITION_IDS_PARAMS" => NV2080_CTRL_GPU_GET_ACTIVE_PARTITION_IDS_PARAMS { swizzId, partitionCount }),
        layout!("NV2080_CTRL_GPU_QUERY_COMPUTE_MODE_RULES_PARAMS" => NV2080_CTRL_GPU_QUERY_COMPUTE_MODE_RULES_PARAMS { rules }),
        layout!("NV2080_CTRL_BUS_INFO" => NV2080_CTRL_BUS_INFO { index, data }),
        layout!("NV2080_CTRL_BUS_GET_INFO_V2_PARAMS" => NV2080_CTRL_BUS_GET_INFO_V2_PARAMS { busInfoListSize, busInfoList }),
        layout!("NV2080_CTRL_BUS_PCI_BAR_INFO" => NV2080_CTRL_BUS_PCI_BAR_INFO { flags, barSize, barSizeBytes, barOffset }),
        layout!("NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS" => NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS { pciBarCount, pciBarInfo }),
        layout!("NV2080_CTRL_TIMER_GPU_CPU_TIME_SAMPLE" => NV2080_CTRL_TIMER_GPU_CPU_TIME_SAMPLE { cpuTime, gpuTime }),
        layout!("NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS" => NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS { cpuClkId, sampleCount, samples }),
        layout!("NV2080_CTRL_GSP_GET_FEATURES_PARAMS" => NV2080_CTRL_GSP_GET_FEATURES_PARAMS { gspFeatures, bValid, bDefaultGspRmGpu, firmwareVersion }),
        layout!("NV2080_CTRL_GR_GET_CAPS_V2_PARAMS" => NV2080_CTRL_GR_GET_CAPS_V2_PARAMS { capsTbl, grRouteInfo, bCapsPopulated }),
        layout!("NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_PARAMS" => NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_PARAMS { grRouteInfo, imla0, fmla16, dp, fmla32, ffma, imla1, imla2, imla3, imla4 }),
        layout!("NV2080_CTRL_GR_GET_GPC_MASK_PARAMS" => NV2080_CTRL_GR_GET_GPC_MASK_PARAMS { grRouteInfo, gpcMask }),
        layout!("NV2080_CTRL_GR_GET_TPC_MASK_PARAMS" => NV2080_CTRL_GR_GET_TPC_MASK_PARAMS { grRouteInfo, gpcId, tpcMask }),
        layout!("NV_HOPPER_USERMODE_A_PARAMS" => NV_HOPPER_USERMODE_A_PARAMS { bBar1Mapping, bPriv }),
    ]
}

mod common;

use common::facts;

fn type_size(f: &Value, name: &str) -> Option<u64> {
    match name {
        "NvHandle" | "NvU32" | "NvU32[]" => Some(4),
        _ => f["struct_sizes"][name].as_u64(),
    }
}

fn params_of(v: &Value) -> Vec<String> {
    match v {
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Value::String(s) => vec![s.clone()],
        _ => Vec::new(),
    }
}

/// Checks one entry of a table; returns the mismatches.
fn check_entry(
    f: &Value,
    table: &str,
    num_key: &str,
    name: &str,
    key: u64,
    params: &[&str],
    size: u64,
) -> Vec<String> {
    let mut errs = Vec::new();
    let fact = &f[table][name];
    let (fact_key, fact_params) = if fact.is_null() {
        // A nameless NVOC control method kept under gVisor's name.
        let m = f["unnamed_control_methods"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m[0].as_u64() == Some(key)));
        match (table, m) {
            ("controls", Some(m)) => (key, params_of(&m[1])),
            _ => return vec![format!("{table} {name}: not in the driver")],
        }
    } else {
        (
            fact[num_key].as_u64().unwrap_or(u64::MAX),
            params_of(&fact["params"]),
        )
    };
    if fact_key != key {
        errs.push(format!(
            "{table} {name}: number {key:#x}, driver {fact_key:#x}"
        ));
    }
    if fact_params != params {
        errs.push(format!(
            "{table} {name}: params {params:?}, driver {fact_params:?}"
        ));
    }
    let want: Option<u64> = fact_params.iter().map(|p| type_size(f, p)).sum();
    if fact_params.len() <= 1 && want.unwrap_or(0) != size {
        errs.push(format!("{table} {name}: size {size}, driver {want:?}"));
    }
    errs
}

/// Every name any node knows, per table: what completeness checks for.
fn known_names() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    let mut known: BTreeMap<&str, BTreeSet<&'static str>> = BTreeMap::new();
    for n in nodes().iter().filter(|n| !n.same_as_parent) {
        let t = n.tables();
        known
            .entry("escapes")
            .or_default()
            .extend(t.escapes.values().map(|e| e.name));
        known
            .entry("uvm_ioctls")
            .or_default()
            .extend(t.uvm.values().map(|e| e.name));
        known
            .entry("controls")
            .or_default()
            .extend(t.controls.values().map(|e| e.name));
        known
            .entry("classes")
            .or_default()
            .extend(t.classes.values().map(|e| e.name));
    }
    known
}

/// The distinct facts files of the tree.
fn facts_files() -> BTreeSet<&'static str> {
    nodes().iter().map(|n| n.facts).collect()
}

fn check_tables(
    version: &str,
    abi: &DriverAbi,
    f: &Value,
    known: &BTreeMap<&'static str, BTreeSet<&'static str>>,
) -> Vec<String> {
    let mut errs = Vec::new();
    for e in abi.escapes.values() {
        let params: Vec<&str> = e.params.to_vec();
        let is_array = f["escapes"][e.name]["size_check"] == "array";
        let sizes: Vec<Option<u64>> = e.params.iter().map(|p| type_size(f, p)).collect();
        match e.size {
            ParamSize::Fixed(n) => {
                errs.extend(check_entry(
                    f,
                    "escapes",
                    "nr",
                    e.name,
                    e.nr.into(),
                    &params,
                    n.into(),
                ));
                if is_array {
                    errs.push(format!("escape {}: driver takes an array", e.name));
                }
            }
            ParamSize::OneOf(ns) => {
                errs.extend(check_entry(
                    f,
                    "escapes",
                    "nr",
                    e.name,
                    e.nr.into(),
                    &params,
                    0,
                ));
                let ns: Vec<Option<u64>> = ns.iter().map(|n| Some(u64::from(*n))).collect();
                if ns != sizes {
                    errs.push(format!("escape {}: sizes {ns:?}, driver {sizes:?}", e.name));
                }
            }
            ParamSize::Array { elem } => {
                errs.extend(check_entry(
                    f,
                    "escapes",
                    "nr",
                    e.name,
                    e.nr.into(),
                    &params,
                    elem.into(),
                ));
                if !is_array {
                    errs.push(format!("escape {}: not an array in the driver", e.name));
                }
            }
        }
    }
    for e in abi.uvm.values() {
        let p: Vec<&str> = e.params.into_iter().collect();
        errs.extend(check_entry(
            f,
            "uvm_ioctls",
            "cmd",
            e.name,
            e.cmd.into(),
            &p,
            e.param_size.into(),
        ));
    }
    for e in abi.controls.values() {
        let p: Vec<&str> = e.params.into_iter().collect();
        errs.extend(check_entry(
            f,
            "controls",
            "cmd",
            e.name,
            e.cmd.into(),
            &p,
            e.param_size.into(),
        ));
    }
    for e in abi.classes.values() {
        let p: Vec<&str> = e.params.into_iter().collect();
        errs.extend(check_entry(
            f,
            "classes",
            "class",
            e.name,
            e.class.into(),
            &p,
            e.param_size.into(),
        ));
    }
    // Completeness: an entry any node knows must be in this node's table if the driver has it.
    let mine: BTreeSet<&str> = abi
        .escapes
        .values()
        .map(|e| e.name)
        .chain(abi.uvm.values().map(|e| e.name))
        .chain(abi.controls.values().map(|e| e.name))
        .chain(abi.classes.values().map(|e| e.name))
        .collect();
    for (table, names) in known {
        for name in names.iter().copied() {
            if f[table].get(name).is_some() && !mine.contains(name) {
                errs.push(format!(
                    "{version}: driver has {table} {name}, the table does not"
                ));
            }
        }
    }
    errs
}

fn check_layout(l: &Layout, s: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    let who = format!("{} ({})", l.rust, l.c_name);
    if s["size"].as_u64() != Some(l.size as u64) || s["align"].as_u64() != Some(l.align as u64) {
        errs.push(format!(
            "{who}: size/align {}/{}, driver {}/{}",
            l.size, l.align, s["size"], s["align"]
        ));
    }
    let c_fields: BTreeMap<&str, (u64, u64)> = s["fields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| Some((x[0].as_str()?, (x[1].as_u64()?, x[2].as_u64()?))))
        .collect();
    for (name, off, size) in &l.fields {
        match c_fields.get(name) {
            None => errs.push(format!("{who}: field {name} is not in the driver's struct")),
            Some(&(o, sz)) if (o, sz) != (*off as u64, *size as u64) => errs.push(format!(
                "{who}: field {name} at {off} size {size}, driver at {o} size {sz}"
            )),
            Some(_) => {}
        }
    }
    for name in c_fields
        .keys()
        .filter(|n| !n.contains('.') && !n.contains('['))
    {
        if !l.fields.iter().any(|(f, _, _)| f == name) {
            errs.push(format!("{who}: driver member {name} has no Rust field"));
        }
    }
    errs
}

/// Every modelled struct of the facts that no Rust layout matches, with the first candidate's
/// mismatches.
fn layout_errors(layouts: &[Layout], f: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    for c_name in MODELED_STRUCTS {
        let s = &f["structs"][*c_name];
        if s.is_null() {
            continue;
        }
        let tried: Vec<(&Layout, Vec<String>)> = layouts
            .iter()
            .filter(|l| l.c_name == *c_name)
            .map(|l| (l, check_layout(l, s)))
            .collect();
        if tried.iter().any(|(_, e)| e.is_empty()) {
            continue;
        }
        let detail: Vec<String> = tried.iter().flat_map(|(_, e)| e.clone()).collect();
        errs.push(format!(
            "struct {c_name} ({} bytes): no Rust layout matches: {}",
            s["size"],
            detail.join("; ")
        ));
    }
    errs
}

/// Every node's parity errors: tables (number, params, size, completeness) and layouts.
fn parity_errors() -> BTreeMap<String, Vec<String>> {
    let layouts = layouts();
    let known = known_names();
    let mut by_facts: BTreeMap<&str, (Value, Vec<String>)> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for node in nodes() {
        let (f, layout_errs) = by_facts.entry(node.facts).or_insert_with(|| {
            let f = facts(node.facts);
            let e = layout_errors(&layouts, &f);
            (f, e)
        });
        let v = node.version.to_string();
        let mut errs = check_tables(&v, &node.tables(), f, &known);
        errs.extend(layout_errs.iter().cloned());
        out.insert(v, errs);
    }
    out
}

#[test]
fn test_every_node_passes_parity_or_is_unqualified_with_a_reason() {
    let errs = parity_errors();
    let mut problems = Vec::new();
    for node in nodes() {
        let v = node.version.to_string();
        let e = &errs[&v];
        match (node.support, node.reason) {
            (Support::Supported, _) if !e.is_empty() => {
                problems.extend(e.iter().map(|e| format!("{v} (supported): {e}")))
            }
            (Support::Unqualified, None | Some("")) => {
                problems.push(format!("{v}: unqualified without a reason"))
            }
            (Support::Supported, Some(r)) => {
                problems.push(format!("{v}: supported with a reason {r:?}"))
            }
            _ => {}
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
    let checked: usize = nodes().len();
    assert!(checked >= 149, "only {checked} nodes");
}

#[test]
fn test_every_node_names_an_existing_facts_file_of_its_abi() {
    for node in nodes() {
        let f = facts(node.facts);
        assert!(
            f["structs"].as_object().is_some_and(|m| m.len() > 70),
            "{}",
            node.version
        );
        // A version's own facts file carries its own version and commit.
        if node.facts == node.version.to_string() {
            assert_eq!(f["commit"].as_str(), node.commit, "{}", node.version);
        }
    }
}

#[test]
fn test_every_modeled_struct_has_a_layout_and_is_in_the_newest_facts() {
    let layouts = layouts();
    let newest = facts(nodes().iter().max_by_key(|n| n.version).unwrap().facts);
    for c_name in MODELED_STRUCTS {
        assert!(
            layouts.iter().any(|l| l.c_name == *c_name),
            "{c_name} has no layout entry"
        );
        assert!(
            !newest["structs"][*c_name].is_null(),
            "{c_name} is not in the 595.45.04 facts"
        );
    }
    assert!(layouts.iter().all(|l| MODELED_STRUCTS.contains(&l.c_name)));
}

#[test]
fn test_nvos32_alloc_size_address_accessor_matches_every_version() {
    for v in facts_files() {
        let fields = facts(v)["structs"]["NVOS32_PARAMETERS"]["fields"].clone();
        let address = fields
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x[0] == "data.AllocSize.address");
        let at = address.and_then(|x| x[1].as_u64());
        let want =
            offset_of!(NVOS32_PARAMETERS, data) + NVOS32_PARAMETERS::ALLOC_SIZE_ADDRESS_OFFSET;
        assert_eq!(at, Some(want as u64), "{v}");
    }
}

#[test]
fn test_preferred_location_layout_choice_matches_every_version() {
    for node in nodes() {
        let v = node.version.to_string();
        let fields =
            facts(node.facts)["structs"]["UVM_SET_PREFERRED_LOCATION_PARAMS"]["fields"].clone();
        let status = fields
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x[0] == "rmStatus")
            .and_then(|x| x[1].as_u64());
        let want = if uvm_preferred_location_v550(&node.tables()) {
            offset_of!(UVM_SET_PREFERRED_LOCATION_PARAMS_V550, rmStatus)
        } else {
            offset_of!(UVM_SET_PREFERRED_LOCATION_PARAMS, rmStatus)
        };
        assert_eq!(status, Some(want as u64), "{v}");
    }
}
