//! The controls `nvidia-smi` (NVML) asks beyond `-L` and the frontend part: for `nvidia-smi -q`
//! and `nvidia-smi topo -m` (issue 15; found with the proxy's audit log and
//! `RUST_LOG=nvsim=debug`, Debian's 535.216.03 and 535.261.03 userspace).
//!
//! Most of them are `ROUTE_TO_PHYSICAL` in the driver (their NVOC flags, `g_device_nvoc.c` /
//! `g_subdevice_nvoc.c`): the kernel driver forwards them to GSP firmware, whose handlers are not
//! in the open source. Their layouts and meaning are public (the SDK headers), so each one here
//! gives the answer that header defines for the state of the simulated GPU: a data-center H100
//! at rest, never reset, drained or repaired, no branding but NVIDIA's own, and no firmware
//! image (see each control). What NVML shows from them is listed in
//! `tests/nvidia-userspace/RESULTS.md`.

use std::mem::offset_of;

use nvproxy_abi::structs::{
    NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS, NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550,
};

use crate::buf::{Loc, bytes_mut, child};
use crate::control_ctx::{Ctx, Target};
use crate::driver::State;
use crate::status::*;

/// Control command numbers answered here.
pub mod cmd {
    /// `NV0000_CTRL_CMD_SYSTEM_GET_P2P_CAPS` (embedded `busPeerIds` pointer).
    pub const SYSTEM_GET_P2P_CAPS: u32 = 0x0000_0127;
    /// `NV0080_CTRL_CMD_GPU_QUERY_SW_STATE_PERSISTENCE`.
    pub const DEVICE_GPU_QUERY_SW_STATE_PERSISTENCE: u32 = 0x0080_0288;
    /// `NV0080_CTRL_CMD_GPU_GET_VGX_CAPS`.
    pub const DEVICE_GPU_GET_VGX_CAPS: u32 = 0x0080_028e;
    /// `NV0080_CTRL_CMD_GPU_GET_BRAND_CAPS`.
    pub const DEVICE_GPU_GET_BRAND_CAPS: u32 = 0x0080_0294;
    /// `NV2080_CTRL_CMD_GPU_GET_RESET_STATUS`.
    pub const GPU_GET_RESET_STATUS: u32 = 0x2080_01ab;
    /// `NV2080_CTRL_CMD_GPU_GET_DRAIN_AND_RESET_STATUS`.
    pub const GPU_GET_DRAIN_AND_RESET_STATUS: u32 = 0x2080_01ae;
    /// `NV2080_CTRL_CMD_BIOS_GET_INFO` (embedded `biosInfoList` pointer).
    pub const BIOS_GET_INFO: u32 = 0x2080_0802;
    /// `NV2080_CTRL_CMD_FB_GET_REMAPPED_ROWS`.
    pub const FB_GET_REMAPPED_ROWS: u32 = 0x2080_1344;
}

/// `NV0080_CTRL_GPU_SW_STATE_PERSISTENCE_DISABLED` (`ctrl0080gpu.h`; `_ENABLED` is 0).
const SW_STATE_PERSISTENCE_DISABLED: u32 = 1;
/// `NV2080_CTRL_BIOS_INFO_MAX_SIZE` (`ctrl2080bios.h`): indices below it are valid.
const BIOS_INFO_MAX_SIZE: u32 = 0xf;
/// `NV0000_P2P_CAPS_STATUS_NOT_SUPPORTED` (`ctrl0000system.h`).
const P2P_CAPS_STATUS_NOT_SUPPORTED: u8 = 0x05;
/// `NV0000_CTRL_SYSTEM_MAX_ATTACHED_GPUS`.
const MAX_ATTACHED_GPUS: u32 = 32;
/// `BUS_INVALID_PEER` (`g_kern_bus_nvoc.h`): no peer mapping between the two GPUs.
const BUS_INVALID_PEER: u32 = 0xffff_ffff;

/// One `nvidia-smi` control; `None` when the command (or this target for it) is not one of them.
pub(crate) fn control(st: &State, c: &mut Ctx<'_>, command: u32, target: Target) -> Option<u32> {
    Some(match (command, target) {
        (cmd::SYSTEM_GET_P2P_CAPS, Target::Client) => p2p_caps(st, c),
        (cmd::DEVICE_GPU_QUERY_SW_STATE_PERSISTENCE, Target::Device) => {
            // deviceCtrlCmdGpuQueryGpuSwStatePersistence (device_ctrl.c, in the kernel):
            // PDB_PROP_GPU_PERSISTENT_SW_STATE is set only by persistence mode (`nvidia-smi
            // -pm 1` or nvidia-persistenced), which nothing enables on the simulated host.
            c.put(0, &SW_STATE_PERSISTENCE_DISABLED);
            NV_OK
        }
        (cmd::DEVICE_GPU_GET_VGX_CAPS, Target::Device) => {
            // deviceCtrlCmdGpuGetVgxCaps (device_ctrl.c): NV_FALSE, constant, up to 545; from 550
            // gpuIsVgxBranded, GSP's static info for the board's VGX (GRID) branding fuse, which
            // a data-center H100 does not carry.
            c.put(0, &0u8);
            NV_OK
        }
        (cmd::DEVICE_GPU_GET_BRAND_CAPS, Target::Device) => {
            // ROUTE_TO_PHYSICAL: GSP reports the board's brands as QUADRO | NVS | TITAN bits;
            // an H100 is none of them (NVIDIA's data-center brand), so no bit is set.
            c.put(0, &0u32);
            NV_OK
        }
        (cmd::GPU_GET_RESET_STATUS, Target::Subdevice(_)) => {
            // ROUTE_TO_PHYSICAL: bResetRequired, set after an error that needs a GPU reset;
            // the simulated GPU never has one.
            c.put(0, &0u8);
            NV_OK
        }
        (cmd::GPU_GET_DRAIN_AND_RESET_STATUS, Target::Subdevice(_)) => {
            // ROUTE_TO_PHYSICAL: bDrainRecommended, for the same errors under MIG; MIG is off.
            c.put(0, &0u8);
            NV_OK
        }
        (cmd::FB_GET_REMAPPED_ROWS, Target::Subdevice(_)) => {
            // ROUTE_TO_PHYSICAL: the rows the InfoROM records as remapped. The simulated HBM has
            // had no ECC error, so none: entryCount 0, flags 0 (nothing pending, no failure),
            // no entries.
            c.bytes_mut().fill(0);
            NV_OK
        }
        (cmd::BIOS_GET_INFO, Target::Subdevice(_)) => bios_info(c),
        _ => return None,
    })
}

/// `NV2080_CTRL_CMD_BIOS_GET_INFO`: the deprecated form with a list pointer, which
/// `RmDeprecatedGetControlHandler` converts to `_V2` (copy-in of `biosInfoListSize` entries,
/// copy-out after), answered by GSP from the board's VBIOS image. The simulated GPU has no VBIOS:
/// `REVISION` and `OEM_REVISION` are 0 (`nvidia-smi` prints `00.00.00.00.00`), every other index
/// below `NV2080_CTRL_BIOS_INFO_MAX_SIZE` too. A real H100's version is a property of its
/// firmware, measured nowhere we could read. More entries than the `_V2` list holds, or an index
/// past it, are `NV_ERR_INVALID_ARGUMENT`, as for the other info lists.
fn bios_info(c: &mut Ctx<'_>) -> u32 {
    let n: u32 = c.get(0).expect("size checked");
    let Some(list) = child(c.call, c.pl, 8) else {
        return NV_ERR_INVALID_ARGUMENT;
    };
    if n == 0 || n > BIOS_INFO_MAX_SIZE {
        return NV_ERR_INVALID_ARGUMENT;
    }
    let buf = bytes_mut(c.call, list);
    let end = 8 * n as usize;
    if buf.len() < end {
        return NV_ERR_INVALID_ADDRESS;
    }
    for i in 0..n as usize {
        let index: u32 = crate::buf::read(buf, 8 * i).expect("length checked");
        if index >= BIOS_INFO_MAX_SIZE {
            return NV_ERR_INVALID_ARGUMENT;
        }
    }
    for i in 0..n as usize {
        crate::buf::write(buf, 8 * i + 4, &0u32);
    }
    NV_OK
}

/// `NV0000_CTRL_CMD_SYSTEM_GET_P2P_CAPS` (`cliresCtrlCmdSystemGetP2pCaps` ->
/// `CliGetSystemP2pCaps`, client_resource.c). The outputs start as "no peer-to-peer"; every id
/// must be an attached GPU (`gpumgrGetGpuFromId`), else `NV_ERR_INVALID_ARGUMENT` with those
/// outputs; `busPeerIds[local * count + peer]` is `kbusGetPeerId`, `BUS_INVALID_PEER` without a
/// peer mapping, which no simulated GPU has. Connectivity is then `p2pGetCapsStatus`'s: no NVLink
/// (the simulated GPUs have none), and over PCIe the verdict comes from GSP's
/// `INTERNAL_GET_PCIE_P2P_CAPS` and the chipset tables, which the simulator does not model, so it
/// answers what the driver answers when they find no path: `P2P_CONNECTIVITY_UNKNOWN`, `p2pCaps`
/// 0, every status `NOT_SUPPORTED` (`nvidia-smi topo -p2p` shows `NS`). The 550 layout's
/// `busEgmPeerIds` (`kbusGetEgmPeerId`) is likewise `BUS_INVALID_PEER`.
fn p2p_caps(st: &State, c: &mut Ctx<'_>) -> u32 {
    type P = NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS;
    let drv = c.drv;
    let p: P = c.get(0).expect("size checked");
    let n = p.gpuCount;
    if n == 0 || n > MAX_ATTACHED_GPUS {
        return NV_ERR_INVALID_ARGUMENT;
    }
    let attached = |id: u32| drv.gpu_by_id(id).is_some_and(|g| drv.gpu_attached(st, g));
    if !attached(p.gpuIds[0]) {
        return NV_ERR_INVALID_ARGUMENT;
    }
    c.put(offset_of!(P, p2pCaps), &0u32);
    c.put(offset_of!(P, p2pOptimalReadCEs), &0u32);
    c.put(offset_of!(P, p2pOptimalWriteCEs), &0u32);
    c.put(
        offset_of!(P, p2pCapsStatus),
        &[P2P_CAPS_STATUS_NOT_SUPPORTED; 9],
    );
    if !p.gpuIds[..n as usize].iter().all(|&id| attached(id)) {
        return NV_ERR_INVALID_ARGUMENT;
    }
    let peers = (n * n) as usize;
    let mut ptrs = vec![offset_of!(P, busPeerIds)];
    if c.size == size_of::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550>() {
        ptrs.push(offset_of!(
            NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550,
            busEgmPeerIds
        ));
    }
    for off in ptrs {
        if let Some(list) = child(c.call, c.pl, off) {
            fill_invalid_peers(c, list, peers);
        }
    }
    NV_OK
}

/// Writes `BUS_INVALID_PEER` into the first `peers` words of an embedded peer-id list.
fn fill_invalid_peers(c: &mut Ctx<'_>, list: Loc, peers: usize) {
    let buf = bytes_mut(c.call, list);
    for i in 0..peers.min(buf.len() / 4) {
        crate::buf::write(buf, 4 * i, &BUS_INVALID_PEER);
    }
}
