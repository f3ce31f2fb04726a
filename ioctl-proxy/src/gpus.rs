//! Keeping a tenant inside its GPU set: `NV_ESC_CARD_INFO` filtered and renumbered, GPU id
//! lists filtered, GPUs outside the set unreachable.
//!
//! The tenant's GPU `i` is host minor `InstancePolicy::gpus[i]`; in `CARD_INFO` it appears as
//! entry `i` with `minor_number = i`, so the tenant's first GPU is its `/dev/nvidia0`. GPU ids
//! (the driver's `gpu_id`, used by NV0000 controls) are not renumbered: they are opaque to
//! clients and the same ids reach the host.

use core::mem::offset_of;

use nvproxy_abi::ioctl::{NV_ESC_ATTACH_GPUS_TO_FD, nv_iowr};
use nvproxy_abi::structs::{
    NV0000_CTRL_GPU_ACTIVE_DEVICE, NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS,
    NV0000_CTRL_GPU_INVALID_ID, NV0000_CTRL_GPU_MAX_GPUS, nv_ioctl_card_info_t,
};
use tracing::debug;
use zerocopy::IntoBytes;

use crate::error::ProxyError;
use crate::host::{HostCall, NESTED_PTR_PLACEHOLDER, NestedBuf};
use crate::nv::NV_OK;
use crate::plan::{Plan, rd32, wr32};
use crate::proxy::{Proxy, host_cards};
use crate::request::Req;

const CARD: usize = size_of::<nv_ioctl_card_info_t>();

/// `NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID` (`ctrl0000gpu.h`).
const NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID: u32 = 0x0000_0275;
/// `NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT_BINARY` (bits 1:0; `TYPE` bit 2
/// left 0: SHA-1, the UUID UVM compares).
const UUID_FLAGS_FORMAT_BINARY: u32 = 2;

impl Proxy {
    /// The 16-byte UUIDs of the instance's GPUs, in the tenant's order, asked from the host
    /// driver: `NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID` (binary, SHA-1) on a root client of
    /// a fresh control file, with each GPU's node held open meanwhile (the driver answers for
    /// attached GPUs only, and opening the node attaches it). The client goes with the control
    /// file when this returns (`RmFreeUnusedClients`). The UVM handlers refuse UUIDs outside
    /// this set.
    pub fn query_gpu_uuids(&self) -> Result<Vec<[u8; 16]>, ProxyError> {
        use nvproxy_abi::ioctl::{NV_ESC_RM_ALLOC_NVOS21, NV_ESC_RM_CONTROL_CMD};
        use nvproxy_abi::structs::{
            NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS, NVOS21_PARAMETERS, NVOS54_PARAMETERS,
        };
        use zerocopy::{FromBytes, FromZeros};

        let host = self.host_driver();
        let ctl = host
            .open(crate::host::NodeKind::Ctl)
            .map_err(ProxyError::Host)?;
        let _nodes = self
            .gpus
            .iter()
            .map(|g| host.open(crate::host::NodeKind::Gpu(g.minor)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ProxyError::Host)?;
        let mut alloc = NVOS21_PARAMETERS::new_zeroed();
        alloc.hClass = crate::nv::NV01_ROOT_CLIENT;
        let mut call = HostCall {
            cmd: NV_ESC_RM_ALLOC_NVOS21,
            params: alloc.as_bytes().to_vec(),
            nested: Vec::new(),
        };
        ctl.ioctl(&mut call).map_err(ProxyError::Host)?;
        let alloc = NVOS21_PARAMETERS::read_from_bytes(&call.params)
            .map_err(|_| ProxyError::Config("RM_ALLOC answer of the wrong size".into()))?;
        if alloc.status != NV_OK {
            return Err(ProxyError::Config(format!(
                "allocating an RM client for the GPU UUIDs: status {:#x}",
                alloc.status
            )));
        }
        let h_client = alloc.hObjectNew;
        let mut uuids = Vec::with_capacity(self.gpus.len());
        for g in &self.gpus {
            let mut q = NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS::new_zeroed();
            q.gpuId = g.gpu_id;
            q.flags = UUID_FLAGS_FORMAT_BINARY;
            let mut ctrl = NVOS54_PARAMETERS::new_zeroed();
            ctrl.hClient = h_client;
            ctrl.hObject = h_client;
            ctrl.cmd = NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID;
            ctrl.params = NESTED_PTR_PLACEHOLDER;
            ctrl.paramsSize = size_of::<NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS>() as u32;
            let mut call = HostCall {
                cmd: NV_ESC_RM_CONTROL_CMD,
                params: ctrl.as_bytes().to_vec(),
                nested: vec![NestedBuf {
                    parent: None,
                    offset: offset_of!(NVOS54_PARAMETERS, params),
                    data: q.as_bytes().to_vec(),
                }],
            };
            ctl.ioctl(&mut call).map_err(ProxyError::Host)?;
            let status = rd32(&call.params, offset_of!(NVOS54_PARAMETERS, status));
            let q =
                NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS::read_from_bytes(&call.nested[0].data)
                    .map_err(|_| ProxyError::Config("UUID answer of the wrong size".into()))?;
            if status != NV_OK || q.uuidStrLen != 16 {
                return Err(ProxyError::Config(format!(
                    "GPU /dev/nvidia{}: no UUID from the driver (status {status:#x}, length {})",
                    g.minor, q.uuidStrLen
                )));
            }
            let mut uuid = [0u8; 16];
            uuid.copy_from_slice(&q.gpuUuid[..16]);
            uuids.push(uuid);
        }
        Ok(uuids)
    }
}

impl Req<'_> {
    /// `NV_ESC_CARD_INFO`: the host's array, reduced to the instance's GPUs in the tenant's
    /// order and renumbered. Like the driver (`nvidia_read_card_info`, nv.c), an array too
    /// small for the tenant's GPUs is zeroed and fails with `EINVAL`.
    pub(crate) fn card_info(&mut self, addr: u64, size: usize) -> Result<i32, ProxyError> {
        let _ = self.read_top(addr, size)?;
        let cards = host_cards(&*self.file.host)?;
        let mut out = vec![0u8; size];
        if size / CARD < self.px.gpus.len() {
            self.write_top(addr, &out)?;
            return Err(ProxyError::BadSize {
                name: "NV_ESC_CARD_INFO",
                size: size as u32,
            });
        }
        for (i, g) in self.px.gpus.iter().enumerate() {
            let Some(card) = cards.iter().find(|c| c.minor_number == g.minor) else {
                continue; // gone from the host: the tenant sees it invalid
            };
            let mut card = *card;
            card.minor_number = i as u32;
            out[i * CARD..(i + 1) * CARD].copy_from_slice(card.as_bytes());
        }
        self.write_top(addr, &out)?;
        Ok(0)
    }

    /// `NV_ESC_ATTACH_GPUS_TO_FD`: every non-zero id must be in the set; the driver answers an
    /// id it cannot take with `EINVAL` (`nvidia_dev_get` failure, nv.c). Arrays too large
    /// for `_IOC_SIZE` (through `NV_ESC_IOCTL_XFER_CMD`) reach the host without their zero
    /// entries, which the driver skips anyway.
    pub(crate) fn attach_gpus_to_fd(&mut self, addr: u64, size: usize) -> Result<i32, ProxyError> {
        let top = self.read_top(addr, size)?;
        for id in top
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        {
            if id != 0 && !self.px.gpu_in_set(id) {
                self.set_decision(
                    crate::audit::Decision::Denied,
                    "GPU outside the instance's set",
                );
                return Err(ProxyError::GpuNotInSet(id));
            }
        }
        let params = if size < (1 << nvproxy_abi::ioctl::IOC_SIZEBITS) {
            top.clone()
        } else {
            top.chunks_exact(4)
                .filter(|c| c != &[0, 0, 0, 0])
                .flatten()
                .copied()
                .collect()
        };
        let mut call = HostCall {
            cmd: nv_iowr(NV_ESC_ATTACH_GPUS_TO_FD, params.len()),
            params,
            nested: Vec::new(),
        };
        let ret = self.file.host.ioctl(&mut call).map_err(ProxyError::Host)?;
        // The driver only reads the ids; the client's copy comes back unchanged.
        self.write_top(addr, &top)?;
        Ok(ret)
    }

    /// Keeps only the instance's ids in the `u32[32]` list at `off` of nested buffer `p`,
    /// packed to the front and padded with `NV0000_CTRL_GPU_INVALID_ID`; a `parallel` list
    /// (`gpuFlags`) is packed the same way.
    pub(crate) fn filter_id_lists(
        &self,
        plan: &mut Plan,
        p: usize,
        offs: &[usize],
        parallel: Option<usize>,
    ) {
        let n = NV0000_CTRL_GPU_MAX_GPUS;
        for &off in offs {
            let buf = plan.buf(Some(p)).to_vec();
            let mut kept: Vec<(u32, u32)> = Vec::new();
            for i in 0..n {
                let id = rd32(&buf, off + 4 * i);
                if id != NV0000_CTRL_GPU_INVALID_ID && self.px.gpu_in_set(id) {
                    kept.push((id, parallel.map_or(0, |po| rd32(&buf, po + 4 * i))));
                }
            }
            for i in 0..n {
                let (id, flags) = kept
                    .get(i)
                    .copied()
                    .unwrap_or((NV0000_CTRL_GPU_INVALID_ID, 0));
                plan.set32(Some(p), off + 4 * i, id);
                if let Some(po) = parallel {
                    plan.set32(Some(p), po + 4 * i, flags);
                }
            }
        }
    }

    /// `GPU_GET_ACTIVE_DEVICE_IDS`: keeps the devices of the instance's GPUs.
    pub(crate) fn filter_active_devices(&self, plan: &mut Plan, p: usize) {
        const DEV: usize = size_of::<NV0000_CTRL_GPU_ACTIVE_DEVICE>();
        let buf = plan.buf(Some(p)).to_vec();
        let max = (buf.len().saturating_sub(4)) / DEV;
        let n = (rd32(&buf, 0) as usize).min(max);
        let kept: Vec<&[u8]> = (0..n)
            .map(|i| &buf[4 + i * DEV..4 + (i + 1) * DEV])
            .filter(|d| self.px.gpu_in_set(rd32(d, 0)))
            .collect();
        let mut out = vec![0u8; buf.len()];
        wr32(&mut out, 0, kept.len() as u32);
        for (i, d) in kept.iter().enumerate() {
            out[4 + i * DEV..4 + (i + 1) * DEV].copy_from_slice(d);
        }
        plan.overwrite(Some(p), 0, &out);
    }

    /// Whether device instance `device` (an `NV01_DEVICE_0` `deviceId`) is one of the
    /// instance's GPUs. Unknown instances are looked up on the host with
    /// `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2` for each instance GPU, through the tenant's own
    /// client `h_client` (a query; nothing changes).
    pub(crate) fn device_in_set(&self, h_client: u32, device: u32) -> bool {
        if let Some(gpu) = self.px.device_gpu(device) {
            return self.px.gpu_in_set(gpu);
        }
        for g in &self.px.gpus {
            let mut info = vec![0u8; size_of::<NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS>()];
            wr32(&mut info, 0, g.gpu_id);
            let mut top = vec![0u8; 32];
            wr32(&mut top, 0, h_client);
            wr32(&mut top, 4, h_client);
            wr32(&mut top, 8, 0x205);
            top[16..24].copy_from_slice(&NESTED_PTR_PLACEHOLDER.to_ne_bytes());
            wr32(&mut top, 24, info.len() as u32);
            let mut call = HostCall {
                cmd: nvproxy_abi::ioctl::NV_ESC_RM_CONTROL_CMD,
                params: top,
                nested: vec![NestedBuf {
                    parent: None,
                    offset: 16,
                    data: info,
                }],
            };
            let ok = self.file.host.ioctl(&mut call).is_ok() && rd32(&call.params, 28) == NV_OK;
            if ok {
                let out = &call.nested[0].data;
                let inst = rd32(
                    out,
                    offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, deviceInstance),
                );
                debug!(gpu_id = g.gpu_id, device = inst, "learned device instance");
                self.px.learn_device(inst, g.gpu_id);
            }
        }
        self.px
            .device_gpu(device)
            .is_some_and(|gpu| self.px.gpu_in_set(gpu))
    }
}
