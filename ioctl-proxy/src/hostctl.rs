//! The proxy's own calls to the host driver, outside any tenant request: the card list
//! (`NV_ESC_CARD_INFO`), one RM control (as the current thread or through a [`NiceCaller`]), a
//! temporary root client and a GPU's UUID. Checkpoint, GPU isolation and scheduling use them.

use std::fmt;
use std::mem::offset_of;

use host_driver::{HostCall, HostFile, NESTED_PTR_PLACEHOLDER, NestedBuf};
use nvproxy_abi::structs::{
    NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS, NVOS21_PARAMETERS, NVOS54_PARAMETERS,
    nv_ioctl_card_info_t,
};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::error::ProxyError;
use crate::nv::*;

/// `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2` (`ctrl0000gpu.h`).
pub(crate) const NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2: u32 = 0x0000_0205;

/// `NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID` (`ctrl0000gpu.h`).
pub(crate) const NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID: u32 = 0x0000_0275;
/// `NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT_BINARY` (bits 1:0; `TYPE` bit 2
/// left 0: SHA-1, the UUID UVM compares).
pub(crate) const UUID_FLAGS_FORMAT_BINARY: u32 = 2;

/// Entries of the host's `NV_ESC_CARD_INFO` array the proxy asks for (`NV_MAX_DEVICES`).
pub(crate) const HOST_CARDS: usize = 32;

/// Issues `NV_ESC_CARD_INFO` on a host file and returns the valid entries.
pub(crate) fn host_cards(file: &dyn HostFile) -> Result<Vec<nv_ioctl_card_info_t>, ProxyError> {
    let size = HOST_CARDS * size_of::<nv_ioctl_card_info_t>();
    let mut call = HostCall {
        cmd: nvproxy_abi::ioctl::nv_iowr(nvproxy_abi::ioctl::NV_ESC_CARD_INFO, size),
        params: vec![0; size].into(),
        nested: Default::default(),
    };
    file.ioctl(&mut call).map_err(ProxyError::Host)?;
    Ok(call
        .params
        .chunks_exact(size_of::<nv_ioctl_card_info_t>())
        .filter_map(|c| nv_ioctl_card_info_t::read_from_bytes(c).ok())
        .filter(|c| c.valid != 0)
        .collect())
}

/// Makes the host calls that the driver grants only to a caller with `CAP_SYS_NICE` (or
/// `CAP_SYS_ADMIN`): the daemon's request threads run without both, so that tenants' calls
/// get an unprivileged caller's answers, and the proxy's own interleave settings go through
/// this. The default ([`InlineNice`]) calls on the current thread.
pub trait NiceCaller: Send + Sync + fmt::Debug {
    /// Performs `call` on `file` as a caller the driver grants `RS_ACCESS_NICE`.
    fn ioctl_nice(&self, file: &dyn HostFile, call: &mut HostCall) -> std::io::Result<i32>;
}

/// Calls on the current thread, with whatever capabilities it has.
#[derive(Debug, Default)]
pub struct InlineNice;

impl NiceCaller for InlineNice {
    fn ioctl_nice(&self, file: &dyn HostFile, call: &mut HostCall) -> std::io::Result<i32> {
        file.ioctl(call)
    }
}

/// One RM control on a host file; returns (status, params after).
pub(crate) fn host_control(
    file: &dyn HostFile,
    h_client: u32,
    h_object: u32,
    cmd: u32,
    params: Vec<u8>,
) -> Result<(u32, Vec<u8>), ProxyError> {
    host_control_via(&InlineNice, file, h_client, h_object, cmd, params)
}

/// [`host_control`] made by `via` (the scheduling controls need CAP_SYS_NICE, `schedule.rs`).
pub(crate) fn host_control_via(
    via: &dyn NiceCaller,
    file: &dyn HostFile,
    h_client: u32,
    h_object: u32,
    cmd: u32,
    params: Vec<u8>,
) -> Result<(u32, Vec<u8>), ProxyError> {
    let mut top = NVOS54_PARAMETERS::new_zeroed();
    top.hClient = h_client;
    top.hObject = h_object;
    top.cmd = cmd;
    top.params = NESTED_PTR_PLACEHOLDER;
    // Saved params are bounded by the ABI tables (kilobytes).
    top.paramsSize = u32::try_from(params.len()).unwrap_or(u32::MAX);
    let mut call = HostCall {
        cmd: nvproxy_abi::ioctl::NV_ESC_RM_CONTROL_CMD,
        params: top.as_bytes().into(),
        nested: vec![NestedBuf {
            parent: None,
            offset: offset_of!(NVOS54_PARAMETERS, params),
            data: params.into(),
        }]
        .into(),
    };
    via.ioctl_nice(file, &mut call).map_err(ProxyError::Host)?;
    let status = NVOS54_PARAMETERS::read_from_bytes(&call.params)
        .map(|t| t.status)
        .unwrap_or(NV_ERR_INVALID_ARGUMENT);
    let out = call
        .nested
        .pop()
        .map(|n| n.data.into_vec())
        .unwrap_or_default();
    Ok((status, out))
}

/// Allocates a root client on `ctl` for the proxy's own queries (freed with the file,
/// `RmFreeUnusedClients`); `why` names the use in the error.
pub(crate) fn temp_root_client(ctl: &dyn HostFile, why: &str) -> Result<u32, ProxyError> {
    let mut alloc = NVOS21_PARAMETERS::new_zeroed();
    alloc.hClass = NV01_ROOT_CLIENT;
    let mut call = HostCall {
        cmd: nvproxy_abi::ioctl::NV_ESC_RM_ALLOC_NVOS21,
        params: alloc.as_bytes().into(),
        nested: Default::default(),
    };
    ctl.ioctl(&mut call).map_err(ProxyError::Host)?;
    let alloc = NVOS21_PARAMETERS::read_from_bytes(&call.params)
        .map_err(|_| ProxyError::Config("RM_ALLOC answer of the wrong size".into()))?;
    if alloc.status != NV_OK {
        return Err(ProxyError::Config(format!(
            "allocating an RM client for {why}: status {:#x}",
            alloc.status
        )));
    }
    Ok(alloc.hObjectNew)
}

/// The UUID of GPU `gpu_id` (`/dev/nvidia<minor>`), binary, from
/// `NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID` on client `h` of `ctl`.
pub(crate) fn gpu_uuid(
    ctl: &dyn HostFile,
    h: u32,
    gpu_id: u32,
    minor: u32,
) -> Result<[u8; 16], ProxyError> {
    let mut q = NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS::new_zeroed();
    q.gpuId = gpu_id;
    q.flags = UUID_FLAGS_FORMAT_BINARY;
    let (s, out) = host_control(
        ctl,
        h,
        h,
        NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID,
        q.as_bytes().to_vec(),
    )?;
    let q = NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS::read_from_bytes(&out)
        .ok()
        .filter(|q| s == NV_OK && q.uuidStrLen == 16)
        .ok_or_else(|| {
            ProxyError::Config(format!(
                "GPU /dev/nvidia{minor}: no UUID from the driver (status {s:#x})"
            ))
        })?;
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&q.gpuUuid[..16]);
    Ok(uuid)
}
