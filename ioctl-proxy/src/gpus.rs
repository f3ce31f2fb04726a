//! Keeping a tenant inside its GPU set: `NV_ESC_CARD_INFO` filtered and renumbered, GPU id
//! lists filtered, GPUs outside the set unreachable, `NV_ESC_NUMA_INFO` without the host's
//! physical addresses.
//!
//! The tenant's GPU `i` is host minor `InstancePolicy::gpus[i]`; in `CARD_INFO` it appears as
//! entry `i` with `minor_number = i`, so the tenant's first GPU is its `/dev/nvidia0`. GPU ids
//! (the driver's `gpu_id`, used by NV0000 controls) are not renumbered: they are opaque to
//! clients and the same ids reach the host.

use nvproxy_abi::ioctl::{NV_ESC_ATTACH_GPUS_TO_FD, NV_ESC_NUMA_INFO, nv_iowr};
use nvproxy_abi::structs::{
    NV0000_CTRL_GPU_GET_ACTIVE_DEVICE_IDS_PARAMS, NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS,
    NV0000_CTRL_GPU_INVALID_ID, NV0000_CTRL_GPU_MAX_GPUS, NV0000_SYNC_GPU_BOOST_GROUP_INFO_PARAMS,
    nv_ioctl_card_info_t, nv_ioctl_numa_info_t, nv_offline_addresses_t,
};
use tracing::debug;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::error::ProxyError;
use crate::hostctl::{NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2, host_cards};
use crate::nv::NV_OK;
use crate::plan::{Plan, rd32, wr32};
use crate::proxy::Proxy;
use crate::request::Req;
use host_driver::HostCall;

const CARD: usize = size_of::<nv_ioctl_card_info_t>();

impl Proxy {
    /// The 16-byte UUIDs of the instance's GPUs, in the tenant's order, asked from the host
    /// driver: `NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID` (binary, SHA-1) on a root client of
    /// a fresh control file, with each GPU's node held open meanwhile (the driver answers for
    /// attached GPUs only, and opening the node attaches it). The client goes with the control
    /// file when this returns (`RmFreeUnusedClients`). The UVM handlers refuse UUIDs outside
    /// this set.
    pub fn query_gpu_uuids(&self) -> Result<Vec<[u8; 16]>, ProxyError> {
        let host = self.host_driver();
        let ctl = host
            .open(host_driver::NodeKind::Ctl)
            .map_err(ProxyError::Host)?;
        let _nodes = self
            .gpus
            .iter()
            .map(|g| host.open(host_driver::NodeKind::Gpu(g.minor)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ProxyError::Host)?;
        let h_client = crate::hostctl::temp_root_client(&*ctl, "the GPU UUIDs")?;
        self.gpus
            .iter()
            .map(|g| crate::hostctl::gpu_uuid(&*ctl, h_client, g.gpu_id, g.minor))
            .collect()
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
                size: u32::try_from(size).unwrap_or(u32::MAX),
            });
        }
        for (i, g) in self.px.gpus.iter().enumerate() {
            let Some(card) = cards.iter().find(|c| c.minor_number == g.minor) else {
                continue; // gone from the host: the tenant sees it invalid
            };
            let mut card = *card;
            card.minor_number = u32::try_from(i).unwrap_or(u32::MAX);
            out[i * CARD..(i + 1) * CARD].copy_from_slice(card.as_bytes());
        }
        self.write_top(addr, &out)?;
        Ok(0)
    }

    /// `NV_ESC_NUMA_INFO` (on a GPU node; the driver answers `EINVAL` on the control node,
    /// `NV_ACTUAL_DEVICE_ONLY` in `nvidia_ioctl`): forwarded, and the answer filtered. The
    /// tenant keeps what describes its GPU's memory as a NUMA node: `nid` (a node of the host
    /// kernel the tenant itself runs on, the same node `/sys/devices/system/node` shows it, and
    /// what CUDA binds memory to on a coherent system), `status`, `memblock_size`,
    /// `numa_mem_size` and `use_auto_online`. The proxy removes the two host physical address
    /// kinds, `numa_mem_addr` (where the GPU's memory sits in the host's physical address
    /// space, `coherentCpuFbBase + numaOnlineBase`) and the offline list (the physical
    /// addresses of retired pages, `subdeviceCtrlCmdFbGetNumaInfo`): only the privileged code
    /// that onlines that memory (`/sys/devices/system/memory/probe`) uses them, and a physical
    /// address is what an exploit wants. Both read as none (0, and `numEntries` 0). On a GPU
    /// that is no NUMA node (PCIe on x86) the driver's answer is unchanged by this: `nid` -1,
    /// `DISABLED`, no memory, no entries. gVisor refuses the escape ("the host's NUMA view is
    /// not the sandbox's"); a runc container shares the host kernel's view, and `nvidia-smi
    /// topo -m` fails without an answer. The tables of the 535 branch do not have the escape
    /// (their facts come from `src/nvidia/arch/nvalloc/unix/include`, and 535 keeps
    /// `nv-ioctl-numa.h` only under `kernel-open/common/inc`), so there it stays an unknown
    /// escape, `EINVAL`, which NVML 535 reads as "no GPU NUMA node".
    pub(crate) fn numa_info(&mut self, addr: u64) -> Result<i32, ProxyError> {
        type P = nv_ioctl_numa_info_t;
        let p = self.read_params::<P>(addr)?;
        let mut plan = Plan::new(nv_iowr(NV_ESC_NUMA_INFO, size_of::<P>()), p.as_bytes());
        let ret = self.exec(&mut plan)?;
        let mut out = plan.get::<P>(None);
        out.numa_mem_addr = 0;
        out.offline_addresses = nv_offline_addresses_t::new_zeroed();
        plan.overwrite(None, 0, out.as_bytes());
        self.finish(addr, &mut plan, None, ret)
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
            nested: Default::default(),
        };
        let ret = self.file.host.ioctl(&mut call).map_err(ProxyError::Host)?;
        if ret == 0 {
            // At most the instance's GPUs (checked above), each once.
            let mut ids: Vec<u32> = Vec::new();
            for id in top
                .chunks_exact(4)
                .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            {
                if id != 0 && !ids.contains(&id) {
                    ids.push(id);
                }
            }
            crate::proxy::lock_record(&self.file).attached = Some(ids);
        }
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
        let q = plan.get::<NV0000_CTRL_GPU_GET_ACTIVE_DEVICE_IDS_PARAMS>(Some(p));
        let n = (q.numDevices as usize).min(q.devices.len());
        let mut out = NV0000_CTRL_GPU_GET_ACTIVE_DEVICE_IDS_PARAMS::new_zeroed();
        let mut kept = 0;
        for d in q.devices[..n]
            .iter()
            .filter(|d| self.px.gpu_in_set(d.gpuId))
        {
            out.devices[kept] = *d;
            kept += 1;
        }
        out.numDevices = u32::try_from(kept).unwrap_or(u32::MAX);
        plan.overwrite(Some(p), 0, out.as_bytes());
    }

    /// Whether device instance `device` (an `NV01_DEVICE_0` `deviceId`) is one of the
    /// instance's GPUs. Unknown instances are looked up on the host ([`Req::learn_devices`]).
    pub(crate) fn device_in_set(&self, h_client: u32, device: u32) -> bool {
        if let Some(gpu) = self.px.device_gpu(device) {
            return self.px.gpu_in_set(gpu);
        }
        self.learn_devices(h_client);
        self.px
            .device_gpu(device)
            .is_some_and(|gpu| self.px.gpu_in_set(gpu))
    }

    /// Learns the device instance of each instance GPU from the host with
    /// `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2`, through the tenant's own client `h_client` (a
    /// query; nothing changes).
    fn learn_devices(&self, h_client: u32) {
        type Info = NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS;
        // The driver's handle for the tenant's client (translated after some restores).
        let h = self.px.host_client(h_client);
        for g in &self.px.gpus {
            let mut info = Info::new_zeroed();
            info.gpuId = g.gpu_id;
            let cmd = NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2;
            let params = info.as_bytes().to_vec();
            if let Ok((NV_OK, out)) =
                crate::hostctl::host_control(&*self.file.host, h, h, cmd, params)
            {
                let Ok(out) = Info::read_from_bytes(&out) else {
                    continue;
                };
                let inst = out.deviceInstance;
                debug!(gpu_id = g.gpu_id, device = inst, "learned device instance");
                self.px.learn_device(inst, g.gpu_id);
            }
        }
    }

    /// `NV0000_CTRL_CMD_GPU_GET_DEVICE_IDS` (a mask of device instances): keeps the instance's
    /// devices (`gpumgrGetDeviceInstanceMask` of the GPUs the tenant can see).
    pub(crate) fn filter_device_mask(&self, h_client: u32, plan: &mut Plan, p: usize) {
        let (mut mask, found) = self.px.known_device_mask();
        if found < self.px.gpus.len() {
            self.learn_devices(h_client);
            mask = self.px.known_device_mask().0;
        }
        let host = rd32(plan.buf(Some(p)), 0);
        plan.set32(Some(p), 0, host & mask);
    }

    /// `NV0000_CTRL_CMD_SYNC_GPU_BOOST_GROUP_INFO`: each group keeps the instance's GPUs;
    /// groups left empty are dropped and the rest packed to the front.
    pub(crate) fn filter_boost_groups(&self, plan: &mut Plan, p: usize) {
        let Ok(mut info) =
            NV0000_SYNC_GPU_BOOST_GROUP_INFO_PARAMS::read_from_bytes(plan.buf(Some(p)))
        else {
            return;
        };
        let n = (info.groupCount as usize).min(info.pBoostGroups.len());
        let mut kept = Vec::with_capacity(n);
        for g in &info.pBoostGroups[..n] {
            let count = (g.gpuCount as usize).min(g.gpuIds.len());
            let ids: Vec<u32> = g.gpuIds[..count]
                .iter()
                .copied()
                .filter(|&id| self.px.gpu_in_set(id))
                .collect();
            if ids.is_empty() {
                continue;
            }
            let mut g = *g;
            g.gpuIds = [0; 32];
            g.gpuIds[..ids.len()].copy_from_slice(&ids);
            g.gpuCount = u32::try_from(ids.len()).unwrap_or(u32::MAX);
            kept.push(g);
        }
        info.groupCount = u32::try_from(kept.len()).unwrap_or(u32::MAX);
        info.pBoostGroups = FromZeros::new_zeroed();
        info.pBoostGroups[..kept.len()].copy_from_slice(&kept);
        plan.overwrite(Some(p), 0, info.as_bytes());
    }

    /// `NV2080_CTRL_CMD_NVLINK_GET_NVLINK_STATUS`: a link whose remote end is a GPU outside the
    /// set reads as unconnected, with no remote device (type `NONE`, PCI and UUID zero). The
    /// layout is the version's ([`nvlink_status_layout`]); a size no layout knows is refused
    /// before the call (`control_prepare`).
    pub(crate) fn filter_nvlink_status(&self, plan: &mut Plan, p: usize, size: u32) {
        let Some(l) = nvlink_status_layout(size) else {
            return;
        };
        let mut buf = plan.buf(Some(p)).to_vec();
        for i in 0..l.links {
            let e = l.link_info + i * l.entry;
            let r = e + l.remote;
            let Some(remote) = buf.get(r..r + l.remote_size) else {
                break;
            };
            let device_type = u64::from_ne_bytes(
                remote[NVLINK_DEVICE_TYPE..NVLINK_DEVICE_TYPE + 8]
                    .try_into()
                    .unwrap_or([0; 8]),
            );
            if device_type != NVLINK_DEVICE_TYPE_GPU {
                continue;
            }
            let pci = (
                rd32(remote, NVLINK_DEVICE_DOMAIN),
                u16::from_ne_bytes([remote[NVLINK_DEVICE_BUS], remote[NVLINK_DEVICE_BUS + 1]]),
                u16::from_ne_bytes([
                    remote[NVLINK_DEVICE_DEVICE],
                    remote[NVLINK_DEVICE_DEVICE + 1],
                ]),
            );
            let ours = self
                .px
                .gpus
                .iter()
                .any(|g| (g.pci.0, u16::from(g.pci.1), u16::from(g.pci.2)) == pci);
            if ours {
                continue;
            }
            buf[r..r + l.remote_size].fill(0);
            buf[r + NVLINK_DEVICE_TYPE..r + NVLINK_DEVICE_TYPE + 8]
                .copy_from_slice(&NVLINK_DEVICE_TYPE_NONE.to_ne_bytes());
            buf[e + NVLINK_LINK_CONNECTED] = 0;
            buf[e + NVLINK_REMOTE_LINK_NUMBER] = 0;
        }
        plan.overwrite(Some(p), 0, &buf);
    }

    /// `NV2080_CTRL_CMD_GPU_GET_PIDS`: only this process's pid stays. Every RM client of an
    /// instance belongs to the daemon process serving it; the others are other tenants'
    /// workers or host processes, which a tenant must not see.
    pub(crate) fn filter_pids(&self, plan: &mut Plan, p: usize) {
        // NV2080_CTRL_GPU_GET_PIDS_PARAMS (not modelled; the same in every version of the
        // tree, abi-facts): idType, id, pidTblCount, pidTbl[950].
        const COUNT: usize = 8;
        const TABLE: usize = 12;
        let me = std::process::id();
        let buf = plan.buf(Some(p));
        let max = buf.len().saturating_sub(TABLE) / 4;
        let n = (rd32(buf, COUNT) as usize).min(max);
        let mine = (0..n).any(|i| rd32(buf, TABLE + 4 * i) == me);
        let mut table = vec![0u8; 4 * max];
        if mine {
            wr32(&mut table, 0, me);
        }
        plan.set32(Some(p), COUNT, u32::from(mine));
        plan.overwrite(Some(p), TABLE, &table);
    }
}

/// Where the per-link `remoteDeviceInfo` lies in `NV2080_CTRL_CMD_NVLINK_GET_NVLINK_STATUS_PARAMS`
/// of one driver version (from the abi-facts of each version; the test
/// `test_every_versions_nvlink_status_size_has_a_layout` keeps the table complete).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NvlinkStatusLayout {
    /// Offset of `linkInfo[]`.
    pub(crate) link_info: usize,
    /// `sizeof(NV2080_CTRL_NVLINK_LINK_STATUS_INFO)`.
    pub(crate) entry: usize,
    /// Offset of `remoteDeviceInfo` in a link entry.
    pub(crate) remote: usize,
    /// `sizeof(NV2080_CTRL_NVLINK_DEVICE_INFO)`.
    pub(crate) remote_size: usize,
    /// Entries of `linkInfo[]` (`NV2080_CTRL_NVLINK_MAX_LINKS`).
    pub(crate) links: usize,
}

/// `NV2080_CTRL_NVLINK_DEVICE_INFO` fields (not modelled; the same in every version of the
/// tree, abi-facts): `domain`, `bus`, `device`, `deviceType`.
const NVLINK_DEVICE_DOMAIN: usize = 4;
const NVLINK_DEVICE_BUS: usize = 8;
const NVLINK_DEVICE_DEVICE: usize = 10;
const NVLINK_DEVICE_TYPE: usize = 24;
/// `NV2080_CTRL_NVLINK_LINK_STATUS_INFO.connected` (the same in every version).
const NVLINK_LINK_CONNECTED: usize = 56;
/// `NV2080_CTRL_NVLINK_LINK_STATUS_INFO.remoteDeviceLinkNumber`.
const NVLINK_REMOTE_LINK_NUMBER: usize = 58;
/// `NV2080_CTRL_NVLINK_DEVICE_INFO_DEVICE_TYPE_GPU`.
const NVLINK_DEVICE_TYPE_GPU: u64 = 2;
/// `NV2080_CTRL_NVLINK_DEVICE_INFO_DEVICE_TYPE_NONE`.
const NVLINK_DEVICE_TYPE_NONE: u64 = 0xff;

/// The layout of the NVLink status params of `size` bytes.
pub(crate) fn nvlink_status_layout(size: u32) -> Option<NvlinkStatusLayout> {
    let (link_info, entry, remote, remote_size, links) = match size {
        5896 => (8, 184, 88, 48, 32),   // 535 .. 550
        6152 => (8, 192, 96, 48, 32),   // 555 .. 565
        13320 => (8, 208, 96, 56, 64),  // 570, 575
        13344 => (32, 208, 96, 56, 64), // 580
        13864 => (32, 216, 96, 56, 64), // 590, 595
        _ => return None,
    };
    Some(NvlinkStatusLayout {
        link_info,
        entry,
        remote,
        remote_size,
        links,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_every_versions_nvlink_status_size_has_a_layout() {
        for node in nvproxy_abi::nodes() {
            let t = node.tables();
            let Some(c) = t.controls.get(&0x2080_3002) else {
                continue;
            };
            let l = nvlink_status_layout(c.param_size).unwrap_or_else(|| {
                panic!("{}: NVLink status of {} bytes", node.version, c.param_size)
            });
            // 590 has a field after linkInfo[].
            let end = l.link_info + l.links * l.entry;
            assert!(
                end <= c.param_size as usize && end + 8 >= c.param_size as usize,
                "{}",
                node.version
            );
            assert!(l.remote + l.remote_size <= l.entry);
        }
    }
}
