//! Escape payloads of `/dev/nvidiactl` and `/dev/nvidia#` (`nvos.h`, `nv-ioctl.h`,
//! `nv-unix-nvos-params-wrappers.h`).
#![allow(missing_docs)] // every struct is documented; fields keep the C member names of the header

use core::mem::{align_of, offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::nvtypes::{NvHandle, NvP64};

/// `NVOS00_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS00_PARAMETERS {
    pub hRoot: NvHandle,
    pub hObjectParent: NvHandle,
    pub hObjectOld: u32,
    pub status: u32,
}
const _: () = assert!(size_of::<NVOS00_PARAMETERS>() == 16);
const _: () = assert!(align_of::<NVOS00_PARAMETERS>() == 4);
const _: () = assert!(offset_of!(NVOS00_PARAMETERS, hObjectParent) == 4);
const _: () = assert!(offset_of!(NVOS00_PARAMETERS, hObjectOld) == 8);
const _: () = assert!(offset_of!(NVOS00_PARAMETERS, status) == 12);

/// `NVOS02_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS02_PARAMETERS {
    pub hRoot: NvHandle,
    pub hObjectParent: NvHandle,
    pub hObjectNew: NvHandle,
    pub hClass: u32,
    pub flags: u32,
    pub _pad0: [u8; 4],
    pub pMemory: NvP64,
    pub limit: u64,
    pub status: u32,
    pub _pad1: [u8; 4],
}
const _: () = assert!(size_of::<NVOS02_PARAMETERS>() == 48);
const _: () = assert!(align_of::<NVOS02_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NVOS02_PARAMETERS, hObjectParent) == 4);
const _: () = assert!(offset_of!(NVOS02_PARAMETERS, hObjectNew) == 8);
const _: () = assert!(offset_of!(NVOS02_PARAMETERS, hClass) == 12);
const _: () = assert!(offset_of!(NVOS02_PARAMETERS, flags) == 16);
const _: () = assert!(offset_of!(NVOS02_PARAMETERS, pMemory) == 24);
const _: () = assert!(offset_of!(NVOS02_PARAMETERS, limit) == 32);
const _: () = assert!(offset_of!(NVOS02_PARAMETERS, status) == 40);

/// `nv_ioctl_nvos02_parameters_with_fd` (`nv-unix-nvos-params-wrappers.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_nvos02_parameters_with_fd {
    pub params: NVOS02_PARAMETERS,
    pub fd: i32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<nv_ioctl_nvos02_parameters_with_fd>() == 56);
const _: () = assert!(align_of::<nv_ioctl_nvos02_parameters_with_fd>() == 8);
const _: () = assert!(offset_of!(nv_ioctl_nvos02_parameters_with_fd, fd) == 48);

/// `NVOS05_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS05_PARAMETERS {
    pub hRoot: NvHandle,
    pub hObjectParent: NvHandle,
    pub hObjectNew: NvHandle,
    pub hClass: u32,
    pub status: u32,
}
const _: () = assert!(size_of::<NVOS05_PARAMETERS>() == 20);
const _: () = assert!(align_of::<NVOS05_PARAMETERS>() == 4);
const _: () = assert!(offset_of!(NVOS05_PARAMETERS, hObjectParent) == 4);
const _: () = assert!(offset_of!(NVOS05_PARAMETERS, hObjectNew) == 8);
const _: () = assert!(offset_of!(NVOS05_PARAMETERS, hClass) == 12);
const _: () = assert!(offset_of!(NVOS05_PARAMETERS, status) == 16);

/// `NVOS21_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS21_PARAMETERS {
    pub hRoot: NvHandle,
    pub hObjectParent: NvHandle,
    pub hObjectNew: NvHandle,
    pub hClass: u32,
    pub pAllocParms: NvP64,
    pub paramsSize: u32,
    pub status: u32,
}
const _: () = assert!(size_of::<NVOS21_PARAMETERS>() == 32);
const _: () = assert!(align_of::<NVOS21_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NVOS21_PARAMETERS, hObjectParent) == 4);
const _: () = assert!(offset_of!(NVOS21_PARAMETERS, hObjectNew) == 8);
const _: () = assert!(offset_of!(NVOS21_PARAMETERS, hClass) == 12);
const _: () = assert!(offset_of!(NVOS21_PARAMETERS, pAllocParms) == 16);
const _: () = assert!(offset_of!(NVOS21_PARAMETERS, paramsSize) == 24);
const _: () = assert!(offset_of!(NVOS21_PARAMETERS, status) == 28);

/// `NVOS30_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS30_PARAMETERS {
    pub hClient: NvHandle,
    pub hDevice: NvHandle,
    pub hChannel: u32,
    pub numChannels: u32,
    pub phClients: NvP64,
    pub phDevices: NvP64,
    pub phChannels: NvP64,
    pub flags: u32,
    pub timeout: u32,
    pub status: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<NVOS30_PARAMETERS>() == 56);
const _: () = assert!(align_of::<NVOS30_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NVOS30_PARAMETERS, hDevice) == 4);
const _: () = assert!(offset_of!(NVOS30_PARAMETERS, hChannel) == 8);
const _: () = assert!(offset_of!(NVOS30_PARAMETERS, numChannels) == 12);
const _: () = assert!(offset_of!(NVOS30_PARAMETERS, phClients) == 16);
const _: () = assert!(offset_of!(NVOS30_PARAMETERS, phDevices) == 24);
const _: () = assert!(offset_of!(NVOS30_PARAMETERS, phChannels) == 32);
const _: () = assert!(offset_of!(NVOS30_PARAMETERS, flags) == 40);
const _: () = assert!(offset_of!(NVOS30_PARAMETERS, timeout) == 44);
const _: () = assert!(offset_of!(NVOS30_PARAMETERS, status) == 48);

/// `NVOS32_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS32_PARAMETERS {
    pub hRoot: NvHandle,
    pub hObjectParent: NvHandle,
    pub function: u32,
    pub hVASpace: NvHandle,
    pub ivcHeapNumber: u16,
    pub _pad0: [u8; 2],
    pub status: u32,
    pub total: u64,
    pub free: u64,
    pub data: [u8; 144],
}
const _: () = assert!(size_of::<NVOS32_PARAMETERS>() == 184);
const _: () = assert!(align_of::<NVOS32_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NVOS32_PARAMETERS, hObjectParent) == 4);
const _: () = assert!(offset_of!(NVOS32_PARAMETERS, function) == 8);
const _: () = assert!(offset_of!(NVOS32_PARAMETERS, hVASpace) == 12);
const _: () = assert!(offset_of!(NVOS32_PARAMETERS, ivcHeapNumber) == 16);
const _: () = assert!(offset_of!(NVOS32_PARAMETERS, status) == 20);
const _: () = assert!(offset_of!(NVOS32_PARAMETERS, total) == 24);
const _: () = assert!(offset_of!(NVOS32_PARAMETERS, free) == 32);
const _: () = assert!(offset_of!(NVOS32_PARAMETERS, data) == 40);

/// `NVOS33_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS33_PARAMETERS {
    pub hClient: NvHandle,
    pub hDevice: NvHandle,
    pub hMemory: NvHandle,
    pub _pad0: [u8; 4],
    pub offset: u64,
    pub length: u64,
    pub pLinearAddress: NvP64,
    pub status: u32,
    pub flags: u32,
}
const _: () = assert!(size_of::<NVOS33_PARAMETERS>() == 48);
const _: () = assert!(align_of::<NVOS33_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NVOS33_PARAMETERS, hDevice) == 4);
const _: () = assert!(offset_of!(NVOS33_PARAMETERS, hMemory) == 8);
const _: () = assert!(offset_of!(NVOS33_PARAMETERS, offset) == 16);
const _: () = assert!(offset_of!(NVOS33_PARAMETERS, length) == 24);
const _: () = assert!(offset_of!(NVOS33_PARAMETERS, pLinearAddress) == 32);
const _: () = assert!(offset_of!(NVOS33_PARAMETERS, status) == 40);
const _: () = assert!(offset_of!(NVOS33_PARAMETERS, flags) == 44);

/// `nv_ioctl_nvos33_parameters_with_fd` (`nv-unix-nvos-params-wrappers.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_nvos33_parameters_with_fd {
    pub params: NVOS33_PARAMETERS,
    pub fd: i32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<nv_ioctl_nvos33_parameters_with_fd>() == 56);
const _: () = assert!(align_of::<nv_ioctl_nvos33_parameters_with_fd>() == 8);
const _: () = assert!(offset_of!(nv_ioctl_nvos33_parameters_with_fd, fd) == 48);

/// `NVOS34_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS34_PARAMETERS {
    pub hClient: NvHandle,
    pub hDevice: NvHandle,
    pub hMemory: NvHandle,
    pub _pad0: [u8; 4],
    pub pLinearAddress: NvP64,
    pub status: u32,
    pub flags: u32,
}
const _: () = assert!(size_of::<NVOS34_PARAMETERS>() == 32);
const _: () = assert!(align_of::<NVOS34_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NVOS34_PARAMETERS, hDevice) == 4);
const _: () = assert!(offset_of!(NVOS34_PARAMETERS, hMemory) == 8);
const _: () = assert!(offset_of!(NVOS34_PARAMETERS, pLinearAddress) == 16);
const _: () = assert!(offset_of!(NVOS34_PARAMETERS, status) == 24);
const _: () = assert!(offset_of!(NVOS34_PARAMETERS, flags) == 28);

/// `NVOS39_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS39_PARAMETERS {
    pub hObjectParent: NvHandle,
    pub hSubDevice: NvHandle,
    pub hObjectNew: NvHandle,
    pub hClass: u32,
    pub flags: u32,
    pub selector: u32,
    pub hMemory: NvHandle,
    pub _pad0: [u8; 4],
    pub offset: u64,
    pub limit: u64,
    pub status: u32,
    pub _pad1: [u8; 4],
}
const _: () = assert!(size_of::<NVOS39_PARAMETERS>() == 56);
const _: () = assert!(align_of::<NVOS39_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NVOS39_PARAMETERS, hSubDevice) == 4);
const _: () = assert!(offset_of!(NVOS39_PARAMETERS, hObjectNew) == 8);
const _: () = assert!(offset_of!(NVOS39_PARAMETERS, hClass) == 12);
const _: () = assert!(offset_of!(NVOS39_PARAMETERS, flags) == 16);
const _: () = assert!(offset_of!(NVOS39_PARAMETERS, selector) == 20);
const _: () = assert!(offset_of!(NVOS39_PARAMETERS, hMemory) == 24);
const _: () = assert!(offset_of!(NVOS39_PARAMETERS, offset) == 32);
const _: () = assert!(offset_of!(NVOS39_PARAMETERS, limit) == 40);
const _: () = assert!(offset_of!(NVOS39_PARAMETERS, status) == 48);

/// `NVOS54_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS54_PARAMETERS {
    pub hClient: NvHandle,
    pub hObject: NvHandle,
    pub cmd: u32,
    pub flags: u32,
    pub params: NvP64,
    pub paramsSize: u32,
    pub status: u32,
}
const _: () = assert!(size_of::<NVOS54_PARAMETERS>() == 32);
const _: () = assert!(align_of::<NVOS54_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NVOS54_PARAMETERS, hObject) == 4);
const _: () = assert!(offset_of!(NVOS54_PARAMETERS, cmd) == 8);
const _: () = assert!(offset_of!(NVOS54_PARAMETERS, flags) == 12);
const _: () = assert!(offset_of!(NVOS54_PARAMETERS, params) == 16);
const _: () = assert!(offset_of!(NVOS54_PARAMETERS, paramsSize) == 24);
const _: () = assert!(offset_of!(NVOS54_PARAMETERS, status) == 28);

/// `NVOS55_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS55_PARAMETERS {
    pub hClient: NvHandle,
    pub hParent: NvHandle,
    pub hObject: NvHandle,
    pub hClientSrc: NvHandle,
    pub hObjectSrc: NvHandle,
    pub flags: u32,
    pub status: u32,
}
const _: () = assert!(size_of::<NVOS55_PARAMETERS>() == 28);
const _: () = assert!(align_of::<NVOS55_PARAMETERS>() == 4);
const _: () = assert!(offset_of!(NVOS55_PARAMETERS, hParent) == 4);
const _: () = assert!(offset_of!(NVOS55_PARAMETERS, hObject) == 8);
const _: () = assert!(offset_of!(NVOS55_PARAMETERS, hClientSrc) == 12);
const _: () = assert!(offset_of!(NVOS55_PARAMETERS, hObjectSrc) == 16);
const _: () = assert!(offset_of!(NVOS55_PARAMETERS, flags) == 20);
const _: () = assert!(offset_of!(NVOS55_PARAMETERS, status) == 24);

/// `NVOS56_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS56_PARAMETERS {
    pub hClient: NvHandle,
    pub hDevice: NvHandle,
    pub hMemory: NvHandle,
    pub _pad0: [u8; 4],
    pub pOldCpuAddress: NvP64,
    pub pNewCpuAddress: NvP64,
    pub status: u32,
    pub _pad1: [u8; 4],
}
const _: () = assert!(size_of::<NVOS56_PARAMETERS>() == 40);
const _: () = assert!(align_of::<NVOS56_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NVOS56_PARAMETERS, hDevice) == 4);
const _: () = assert!(offset_of!(NVOS56_PARAMETERS, hMemory) == 8);
const _: () = assert!(offset_of!(NVOS56_PARAMETERS, pOldCpuAddress) == 16);
const _: () = assert!(offset_of!(NVOS56_PARAMETERS, pNewCpuAddress) == 24);
const _: () = assert!(offset_of!(NVOS56_PARAMETERS, status) == 32);

/// `NVOS57_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS57_PARAMETERS {
    pub hClient: NvHandle,
    pub hObject: NvHandle,
    pub sharePolicy: RS_SHARE_POLICY,
    pub status: u32,
}
const _: () = assert!(size_of::<NVOS57_PARAMETERS>() == 24);
const _: () = assert!(align_of::<NVOS57_PARAMETERS>() == 4);
const _: () = assert!(offset_of!(NVOS57_PARAMETERS, hObject) == 4);
const _: () = assert!(offset_of!(NVOS57_PARAMETERS, sharePolicy) == 8);
const _: () = assert!(offset_of!(NVOS57_PARAMETERS, status) == 20);

/// `RS_SHARE_POLICY` (`rs_access.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct RS_SHARE_POLICY {
    pub target: u32,
    pub accessMask: u32,
    pub r#type: u16,
    pub action: u8,
    pub _pad0: [u8; 1],
}
const _: () = assert!(size_of::<RS_SHARE_POLICY>() == 12);
const _: () = assert!(align_of::<RS_SHARE_POLICY>() == 4);
const _: () = assert!(offset_of!(RS_SHARE_POLICY, accessMask) == 4);
const _: () = assert!(offset_of!(RS_SHARE_POLICY, r#type) == 8);
const _: () = assert!(offset_of!(RS_SHARE_POLICY, action) == 10);

/// `NVOS64_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS64_PARAMETERS {
    pub hRoot: NvHandle,
    pub hObjectParent: NvHandle,
    pub hObjectNew: NvHandle,
    pub hClass: u32,
    pub pAllocParms: NvP64,
    pub pRightsRequested: NvP64,
    pub paramsSize: u32,
    pub flags: u32,
    pub status: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<NVOS64_PARAMETERS>() == 48);
const _: () = assert!(align_of::<NVOS64_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NVOS64_PARAMETERS, hObjectParent) == 4);
const _: () = assert!(offset_of!(NVOS64_PARAMETERS, hObjectNew) == 8);
const _: () = assert!(offset_of!(NVOS64_PARAMETERS, hClass) == 12);
const _: () = assert!(offset_of!(NVOS64_PARAMETERS, pAllocParms) == 16);
const _: () = assert!(offset_of!(NVOS64_PARAMETERS, pRightsRequested) == 24);
const _: () = assert!(offset_of!(NVOS64_PARAMETERS, paramsSize) == 32);
const _: () = assert!(offset_of!(NVOS64_PARAMETERS, flags) == 36);
const _: () = assert!(offset_of!(NVOS64_PARAMETERS, status) == 40);

/// `nv_ioctl_card_info_t` (`nv-ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_card_info_t {
    pub valid: u8,
    pub _pad0: [u8; 3],
    pub pci_info: nv_pci_info_t,
    pub gpu_id: u32,
    pub interrupt_line: u16,
    pub _pad1: [u8; 2],
    pub reg_address: u64,
    pub reg_size: u64,
    pub fb_address: u64,
    pub fb_size: u64,
    pub minor_number: u32,
    pub dev_name: [u8; 10],
    pub _pad2: [u8; 2],
}
const _: () = assert!(size_of::<nv_ioctl_card_info_t>() == 72);
const _: () = assert!(align_of::<nv_ioctl_card_info_t>() == 8);
const _: () = assert!(offset_of!(nv_ioctl_card_info_t, pci_info) == 4);
const _: () = assert!(offset_of!(nv_ioctl_card_info_t, gpu_id) == 16);
const _: () = assert!(offset_of!(nv_ioctl_card_info_t, interrupt_line) == 20);
const _: () = assert!(offset_of!(nv_ioctl_card_info_t, reg_address) == 24);
const _: () = assert!(offset_of!(nv_ioctl_card_info_t, reg_size) == 32);
const _: () = assert!(offset_of!(nv_ioctl_card_info_t, fb_address) == 40);
const _: () = assert!(offset_of!(nv_ioctl_card_info_t, fb_size) == 48);
const _: () = assert!(offset_of!(nv_ioctl_card_info_t, minor_number) == 56);
const _: () = assert!(offset_of!(nv_ioctl_card_info_t, dev_name) == 60);

/// `nv_pci_info_t` (`nv-ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_pci_info_t {
    pub domain: u32,
    pub bus: u8,
    pub slot: u8,
    pub function: u8,
    pub _pad0: [u8; 1],
    pub vendor_id: u16,
    pub device_id: u16,
}
const _: () = assert!(size_of::<nv_pci_info_t>() == 12);
const _: () = assert!(align_of::<nv_pci_info_t>() == 4);
const _: () = assert!(offset_of!(nv_pci_info_t, bus) == 4);
const _: () = assert!(offset_of!(nv_pci_info_t, slot) == 5);
const _: () = assert!(offset_of!(nv_pci_info_t, function) == 6);
const _: () = assert!(offset_of!(nv_pci_info_t, vendor_id) == 8);
const _: () = assert!(offset_of!(nv_pci_info_t, device_id) == 10);

/// `nv_ioctl_register_fd_t` (`nv-ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_register_fd_t {
    pub ctl_fd: i32,
}
const _: () = assert!(size_of::<nv_ioctl_register_fd_t>() == 4);
const _: () = assert!(align_of::<nv_ioctl_register_fd_t>() == 4);

/// `nv_ioctl_alloc_os_event_t` (`nv-ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_alloc_os_event_t {
    pub hClient: NvHandle,
    pub hDevice: NvHandle,
    pub fd: i32,
    pub Status: u32,
}
const _: () = assert!(size_of::<nv_ioctl_alloc_os_event_t>() == 16);
const _: () = assert!(align_of::<nv_ioctl_alloc_os_event_t>() == 4);
const _: () = assert!(offset_of!(nv_ioctl_alloc_os_event_t, hDevice) == 4);
const _: () = assert!(offset_of!(nv_ioctl_alloc_os_event_t, fd) == 8);
const _: () = assert!(offset_of!(nv_ioctl_alloc_os_event_t, Status) == 12);

/// `nv_ioctl_free_os_event_t` (`nv-ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_free_os_event_t {
    pub hClient: NvHandle,
    pub hDevice: NvHandle,
    pub fd: i32,
    pub Status: u32,
}
const _: () = assert!(size_of::<nv_ioctl_free_os_event_t>() == 16);
const _: () = assert!(align_of::<nv_ioctl_free_os_event_t>() == 4);
const _: () = assert!(offset_of!(nv_ioctl_free_os_event_t, hDevice) == 4);
const _: () = assert!(offset_of!(nv_ioctl_free_os_event_t, fd) == 8);
const _: () = assert!(offset_of!(nv_ioctl_free_os_event_t, Status) == 12);

/// `nv_ioctl_rm_api_version_t` (`nv-ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_rm_api_version_t {
    pub cmd: u32,
    pub reply: u32,
    pub versionString: [u8; 64],
}
const _: () = assert!(size_of::<nv_ioctl_rm_api_version_t>() == 72);
const _: () = assert!(align_of::<nv_ioctl_rm_api_version_t>() == 4);
const _: () = assert!(offset_of!(nv_ioctl_rm_api_version_t, reply) == 4);
const _: () = assert!(offset_of!(nv_ioctl_rm_api_version_t, versionString) == 8);

/// `nv_ioctl_sys_params_t` (`nv-ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_sys_params_t {
    pub memblock_size: u64,
}
const _: () = assert!(size_of::<nv_ioctl_sys_params_t>() == 8);
const _: () = assert!(align_of::<nv_ioctl_sys_params_t>() == 8);

/// `NV_IOCTL_NUMA_INFO_MAX_OFFLINE_ADDRESSES` (`nv-ioctl-numa.h`).
pub const NV_IOCTL_NUMA_INFO_MAX_OFFLINE_ADDRESSES: usize = 64;
/// `NV_IOCTL_NUMA_STATUS_DISABLED` (`nv-ioctl-numa.h`): the GPU's memory is no NUMA node.
pub const NV_IOCTL_NUMA_STATUS_DISABLED: i32 = 0;

/// `nv_offline_addresses_t` (`nv-ioctl-numa.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_offline_addresses_t {
    pub addresses: [u64; NV_IOCTL_NUMA_INFO_MAX_OFFLINE_ADDRESSES],
    pub numEntries: u32,
    pub _pad0: [u8; 4],
}
const _: () = assert!(size_of::<nv_offline_addresses_t>() == 520);
const _: () = assert!(offset_of!(nv_offline_addresses_t, numEntries) == 512);

/// `nv_ioctl_numa_info_t` (`nv-ioctl-numa.h`): the payload of `NV_ESC_NUMA_INFO`.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_numa_info_t {
    pub nid: i32,
    pub status: i32,
    pub memblock_size: u64,
    pub numa_mem_addr: u64,
    pub numa_mem_size: u64,
    pub use_auto_online: u8,
    pub _pad0: [u8; 7],
    pub offline_addresses: nv_offline_addresses_t,
}
const _: () = assert!(size_of::<nv_ioctl_numa_info_t>() == 560);
const _: () = assert!(align_of::<nv_ioctl_numa_info_t>() == 8);
const _: () = assert!(offset_of!(nv_ioctl_numa_info_t, numa_mem_addr) == 16);
const _: () = assert!(offset_of!(nv_ioctl_numa_info_t, use_auto_online) == 32);
const _: () = assert!(offset_of!(nv_ioctl_numa_info_t, offline_addresses) == 40);

/// `nv_ioctl_xfer_t` (`nv-ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_xfer_t {
    pub cmd: u32,
    pub size: u32,
    pub ptr: NvP64,
}
const _: () = assert!(size_of::<nv_ioctl_xfer_t>() == 16);
const _: () = assert!(align_of::<nv_ioctl_xfer_t>() == 8);
const _: () = assert!(offset_of!(nv_ioctl_xfer_t, size) == 4);
const _: () = assert!(offset_of!(nv_ioctl_xfer_t, ptr) == 8);

/// `nv_ioctl_wait_open_complete_t` (`nv-ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_wait_open_complete_t {
    pub rc: u32,
    pub adapterStatus: u32,
}
const _: () = assert!(size_of::<nv_ioctl_wait_open_complete_t>() == 8);
const _: () = assert!(align_of::<nv_ioctl_wait_open_complete_t>() == 4);
const _: () = assert!(offset_of!(nv_ioctl_wait_open_complete_t, adapterStatus) == 4);

/// `NVOS46_PARAMETERS` (`nvos.h`): the layout since 580 (adds `flags2` and `kindOverride`; 64 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS46_PARAMETERS_V580 {
    pub hClient: NvHandle,
    pub hDevice: NvHandle,
    pub hDma: NvHandle,
    pub hMemory: NvHandle,
    pub offset: u64,
    pub length: u64,
    pub flags: u32,
    pub flags2: u32,
    pub kindOverride: u32,
    pub _pad0: [u8; 4],
    pub dmaOffset: u64,
    pub status: u32,
    pub _pad1: [u8; 4],
}
const _: () = assert!(size_of::<NVOS46_PARAMETERS_V580>() == 64);
const _: () = assert!(align_of::<NVOS46_PARAMETERS_V580>() == 8);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS_V580, hDevice) == 4);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS_V580, hDma) == 8);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS_V580, hMemory) == 12);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS_V580, offset) == 16);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS_V580, length) == 24);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS_V580, flags) == 32);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS_V580, flags2) == 36);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS_V580, kindOverride) == 40);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS_V580, dmaOffset) == 48);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS_V580, status) == 56);

/// `nv_ioctl_export_to_dma_buf_fd_t` (`nv-ioctl.h`): the layout since 580 (adds `bAllowMmap`; same size as V570).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_export_to_dma_buf_fd_t_V580 {
    pub fd: i32,
    pub hClient: NvHandle,
    pub totalObjects: u32,
    pub numObjects: u32,
    pub index: u32,
    pub _pad0: [u8; 4],
    pub totalSize: u64,
    pub mappingType: u8,
    pub bAllowMmap: u8,
    pub _pad1: [u8; 2],
    pub handles: [u32; 128],
    pub _pad2: [u8; 4],
    pub offsets: [u64; 128],
    pub sizes: [u64; 128],
    pub status: u32,
    pub _pad3: [u8; 4],
}
const _: () = assert!(size_of::<nv_ioctl_export_to_dma_buf_fd_t_V580>() == 2608);
const _: () = assert!(align_of::<nv_ioctl_export_to_dma_buf_fd_t_V580>() == 8);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V580, hClient) == 4);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V580, totalObjects) == 8);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V580, numObjects) == 12);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V580, index) == 16);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V580, totalSize) == 24);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V580, mappingType) == 32);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V580, bAllowMmap) == 33);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V580, handles) == 36);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V580, offsets) == 552);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V580, sizes) == 1576);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V580, status) == 2600);

/// `NVOS46_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS46_PARAMETERS {
    pub hClient: NvHandle,
    pub hDevice: NvHandle,
    pub hDma: NvHandle,
    pub hMemory: NvHandle,
    pub offset: u64,
    pub length: u64,
    pub flags: u32,
    pub _pad0: [u8; 4],
    pub dmaOffset: u64,
    pub status: u32,
    pub _pad1: [u8; 4],
}
const _: () = assert!(size_of::<NVOS46_PARAMETERS>() == 56);
const _: () = assert!(align_of::<NVOS46_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS, hDevice) == 4);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS, hDma) == 8);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS, hMemory) == 12);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS, offset) == 16);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS, length) == 24);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS, flags) == 32);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS, dmaOffset) == 40);
const _: () = assert!(offset_of!(NVOS46_PARAMETERS, status) == 48);

/// `NVOS47_PARAMETERS` (`nvos.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS47_PARAMETERS {
    pub hClient: NvHandle,
    pub hDevice: NvHandle,
    pub hDma: NvHandle,
    pub hMemory: NvHandle,
    pub flags: u32,
    pub _pad0: [u8; 4],
    pub dmaOffset: u64,
    pub status: u32,
    pub _pad1: [u8; 4],
}
const _: () = assert!(size_of::<NVOS47_PARAMETERS>() == 40);
const _: () = assert!(align_of::<NVOS47_PARAMETERS>() == 8);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS, hDevice) == 4);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS, hDma) == 8);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS, hMemory) == 12);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS, flags) == 16);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS, dmaOffset) == 24);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS, status) == 32);

/// `nv_ioctl_export_to_dma_buf_fd_t` (`nv-ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_export_to_dma_buf_fd_t {
    pub fd: i32,
    pub hClient: NvHandle,
    pub totalObjects: u32,
    pub numObjects: u32,
    pub index: u32,
    pub _pad0: [u8; 4],
    pub totalSize: u64,
    pub handles: [u32; 128],
    pub offsets: [u64; 128],
    pub sizes: [u64; 128],
    pub status: u32,
    pub _pad1: [u8; 4],
}
const _: () = assert!(size_of::<nv_ioctl_export_to_dma_buf_fd_t>() == 2600);
const _: () = assert!(align_of::<nv_ioctl_export_to_dma_buf_fd_t>() == 8);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t, hClient) == 4);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t, totalObjects) == 8);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t, numObjects) == 12);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t, index) == 16);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t, totalSize) == 24);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t, handles) == 32);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t, offsets) == 544);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t, sizes) == 1568);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t, status) == 2592);

/// `NVOS47_PARAMETERS` (`nvos.h`): the layout since 550 (adds `size`; 48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS47_PARAMETERS_V550 {
    pub hClient: NvHandle,
    pub hDevice: NvHandle,
    pub hDma: NvHandle,
    pub hMemory: NvHandle,
    pub flags: u32,
    pub _pad0: [u8; 4],
    pub dmaOffset: u64,
    pub size: u64,
    pub status: u32,
    pub _pad1: [u8; 4],
}
const _: () = assert!(size_of::<NVOS47_PARAMETERS_V550>() == 48);
const _: () = assert!(align_of::<NVOS47_PARAMETERS_V550>() == 8);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS_V550, hDevice) == 4);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS_V550, hDma) == 8);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS_V550, hMemory) == 12);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS_V550, flags) == 16);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS_V550, dmaOffset) == 24);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS_V550, size) == 32);
const _: () = assert!(offset_of!(NVOS47_PARAMETERS_V550, status) == 40);

/// `nv_ioctl_export_to_dma_buf_fd_t` (`nv-ioctl.h`): the layout since 570 (adds `mappingType`; 2608 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_export_to_dma_buf_fd_t_V570 {
    pub fd: i32,
    pub hClient: NvHandle,
    pub totalObjects: u32,
    pub numObjects: u32,
    pub index: u32,
    pub _pad0: [u8; 4],
    pub totalSize: u64,
    pub mappingType: u8,
    pub _pad1: [u8; 3],
    pub handles: [u32; 128],
    pub _pad2: [u8; 4],
    pub offsets: [u64; 128],
    pub sizes: [u64; 128],
    pub status: u32,
    pub _pad3: [u8; 4],
}
const _: () = assert!(size_of::<nv_ioctl_export_to_dma_buf_fd_t_V570>() == 2608);
const _: () = assert!(align_of::<nv_ioctl_export_to_dma_buf_fd_t_V570>() == 8);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V570, hClient) == 4);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V570, totalObjects) == 8);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V570, numObjects) == 12);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V570, index) == 16);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V570, totalSize) == 24);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V570, mappingType) == 32);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V570, handles) == 36);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V570, offsets) == 552);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V570, sizes) == 1576);
const _: () = assert!(offset_of!(nv_ioctl_export_to_dma_buf_fd_t_V570, status) == 2600);

/// `NVOS32_FUNCTION_ALLOC_SIZE`: the only `NV_ESC_RM_VID_HEAP_CONTROL` function gVisor allows.
pub const NVOS32_FUNCTION_ALLOC_SIZE: u32 = 2;

impl NVOS32_PARAMETERS {
    /// Offset of `data.AllocSize.address` within `data` (120 in the struct).
    pub const ALLOC_SIZE_ADDRESS_OFFSET: usize = 80;

    /// `data.AllocSize.address`: for `NVOS32_FUNCTION_ALLOC_SIZE`, a pointer to a client `NvU64`
    /// (or 0).
    pub fn alloc_size_address(&self) -> NvP64 {
        let at = Self::ALLOC_SIZE_ADDRESS_OFFSET;
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.data[at..at + 8]);
        u64::from_ne_bytes(b)
    }

    /// Sets `data.AllocSize.address` (to redirect it to a daemon buffer).
    pub fn set_alloc_size_address(&mut self, address: NvP64) {
        let at = Self::ALLOC_SIZE_ADDRESS_OFFSET;
        self.data[at..at + 8].copy_from_slice(&address.to_ne_bytes());
    }
}
