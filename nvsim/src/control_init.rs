//! The controls NVIDIA's own clients issue at initialisation beyond the frontend part modelled in
//! `control.rs`: what `libcuda.so.1` (`cuInit`, `cuCtxCreate`, ...) and `nvidia-smi` / NVML ask
//! (observed through the proxy's audit log and the `cuda-probe` ioctl recorder with Debian's
//! 535.216.03 and 535.261.03 userspace), answered as the driver answers them for the configured
//! GPU. Each control names the driver function it follows; values that real hardware reports
//! come from the GPU's public specifications (see [`SimGpu`](crate::SimGpu)); where the driver
//! would ask GSP firmware for something the simulator does not model, the control says what it
//! answers instead.

use std::mem::offset_of;

use nvproxy_abi::structs::*;
use zerocopy::FromZeros;

use crate::control_ctx::{Ctx, Target};
use crate::driver::{Kind, State};
use crate::status::*;

/// Control command numbers answered here.
pub mod cmd {
    /// `NV0000_CTRL_CMD_SYNC_GPU_BOOST_GROUP_INFO`.
    pub const SYNC_GPU_BOOST_GROUP_INFO: u32 = 0x0000_0a04;
    /// `NV0000_CTRL_CMD_GPU_DETACH_IDS`.
    pub const GPU_DETACH_IDS: u32 = 0x0000_0216;
    /// `NV0000_CTRL_CMD_GPU_QUERY_DRAIN_STATE`.
    pub const GPU_QUERY_DRAIN_STATE: u32 = 0x0000_0279;
    /// `NV0080_CTRL_CMD_HOST_GET_CAPS_V2`.
    pub const DEVICE_HOST_GET_CAPS_V2: u32 = 0x0080_1402;
    /// `NV0080_CTRL_CMD_GPU_GET_VIRTUALIZATION_MODE`.
    pub const DEVICE_GPU_GET_VIRTUALIZATION_MODE: u32 = 0x0080_0289;
    /// `NV2080_CTRL_CMD_GPU_GET_ACTIVE_PARTITION_IDS`.
    pub const GPU_GET_ACTIVE_PARTITION_IDS: u32 = 0x2080_018b;
    /// `NV2080_CTRL_CMD_BUS_GET_INFO_V2`.
    pub const BUS_GET_INFO_V2: u32 = 0x2080_1823;
    /// `NV2080_CTRL_CMD_BUS_GET_INFO` (embedded `busInfoList` pointer).
    pub const BUS_GET_INFO: u32 = 0x2080_1802;
    /// `NV2080_CTRL_CMD_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO`.
    pub const TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO: u32 = 0x2080_0406;
    /// `NV2080_CTRL_CMD_BUS_GET_PCI_BAR_INFO`.
    pub const BUS_GET_PCI_BAR_INFO: u32 = 0x2080_1803;
    /// `NV2080_CTRL_CMD_GPU_GET_ENGINES_V2`.
    pub const GPU_GET_ENGINES_V2: u32 = 0x2080_0170;
    /// `NV0000_CTRL_CMD_GPU_GET_MEMOP_ENABLE`.
    pub const GPU_GET_MEMOP_ENABLE: u32 = 0x0000_027b;
    /// `NV2080_CTRL_CMD_GR_GET_CAPS_V2`.
    pub const GR_GET_CAPS_V2: u32 = 0x2080_1227;
    /// `NV2080_CTRL_CMD_CE_GET_ALL_CAPS`.
    pub const CE_GET_ALL_CAPS: u32 = 0x2080_2a0a;
    /// `NV2080_CTRL_CMD_GR_GET_SM_ISSUE_RATE_MODIFIER`.
    pub const GR_GET_SM_ISSUE_RATE_MODIFIER: u32 = 0x2080_1230;
    /// `NV2080_CTRL_CMD_GR_GET_GLOBAL_SM_ORDER`.
    pub const GR_GET_GLOBAL_SM_ORDER: u32 = 0x2080_121b;
    /// `NV2080_CTRL_CMD_GR_GET_GPC_MASK`.
    pub const GR_GET_GPC_MASK: u32 = 0x2080_122a;
    /// `NV2080_CTRL_CMD_GR_GET_TPC_MASK`.
    pub const GR_GET_TPC_MASK: u32 = 0x2080_122b;
    /// `NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE`.
    pub const CLIENT_GET_ADDR_SPACE_TYPE: u32 = 0x0000_0d01;
    /// `NV2080_CTRL_CMD_GSP_GET_FEATURES`.
    pub const GSP_GET_FEATURES: u32 = 0x2080_3601;
    /// `NV2080_CTRL_CMD_GPU_QUERY_COMPUTE_MODE_RULES`.
    pub const GPU_QUERY_COMPUTE_MODE_RULES: u32 = 0x2080_0131;
    /// `NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO`.
    pub const GET_GPU_FABRIC_PROBE_INFO: u32 = 0x2080_01a3;
    /// `NV_CONF_COMPUTE_CTRL_CMD_SYSTEM_GET_CAPABILITIES`.
    pub const CONF_COMPUTE_GET_CAPABILITIES: u32 = 0xcb33_0101;
    /// `NV_CONF_COMPUTE_CTRL_CMD_SYSTEM_GET_GPUS_STATE`.
    pub const CONF_COMPUTE_GET_GPUS_STATE: u32 = 0xcb33_0104;
    /// `NV0080_CTRL_CMD_FB_GET_CAPS_V2`.
    pub const DEVICE_FB_GET_CAPS_V2: u32 = 0x0080_1307;
    /// `NV2080_CTRL_CMD_BUS_GET_C2C_INFO`.
    pub const BUS_GET_C2C_INFO: u32 = 0x2080_182b;
    /// `NV2080_CTRL_CMD_RC_GET_WATCHDOG_INFO`.
    pub const RC_GET_WATCHDOG_INFO: u32 = 0x2080_2209;
    /// `NV2080_CTRL_CMD_BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS`.
    pub const BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS: u32 = 0x2080_182a;
    /// `NV2080_CTRL_CMD_NVLINK_GET_NVLINK_STATUS`.
    pub const NVLINK_GET_NVLINK_STATUS: u32 = 0x2080_3002;
    /// `NV2080_CTRL_CMD_PERF_BOOST`.
    pub const PERF_BOOST: u32 = 0x2080_200a;
}

/// `NV2080_CTRL_RC_GET_WATCHDOG_INFO_FLAGS_DISABLED` | `_INITIALIZED` (`ctrl2080rc.h`).
const WATCHDOG_DISABLED_INITIALIZED: u32 = 0x1 | 0x4;

/// `NV0000_CTRL_GPU_INVALID_ID`.
const INVALID_ID: u32 = 0xffff_ffff;
/// `NV0000_CTRL_GPU_DETACH_ALL_ATTACHED_IDS`.
const DETACH_ALL_ATTACHED_IDS: u32 = 0x0000_ffff;
/// `NV0080_CTRL_HOST_CAPS_GPU_COHERENT_MAPPING_SUPPORTED` (byte 0, bit 0x04).
const HOST_CAPS_GPU_COHERENT_MAPPING_SUPPORTED: u8 = 0x04;

/// One control of the initialisation set; `None` when the command (or this target for it) is
/// not one of them.
pub(crate) fn control(
    st: &mut State,
    mut c: Ctx<'_>,
    h_client: u32,
    command: u32,
    target: Target,
) -> Option<u32> {
    let input = hex_prefix(&mut c);
    let status = answer(st, &mut c, h_client, command, target);
    if status != Some(NV_OK) {
        // What a client asked that the simulator does not answer, or answers with an error
        // (`RUST_LOG=nvsim=debug`).
        tracing::debug!(
            cmd = format_args!("{command:#x}"),
            size = c.size,
            status = ?status.map(|s| format!("{s:#x}")),
            params = input,
            "control not simulated or failed"
        );
    }
    status
}

/// The first 256 bytes of the params, in hex.
fn hex_prefix(c: &mut Ctx<'_>) -> String {
    let size = c.size;
    c.bytes_mut()[..size.min(256)]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn answer(
    st: &mut State,
    c: &mut Ctx<'_>,
    h_client: u32,
    command: u32,
    target: Target,
) -> Option<u32> {
    let drv = c.drv;
    Some(match (command, target) {
        (cmd::SYNC_GPU_BOOST_GROUP_INFO, Target::Client) => {
            // cliresCtrlCmdSyncGpuBoostGroupInfo -> gpuboostmgrQueryGroups: the groups created
            // with SYNC_GPU_BOOST_GROUP_CREATE (none here); only groupCount and the filled
            // entries are written.
            c.put(0, &0u32);
            NV_OK
        }
        (cmd::GPU_DETACH_IDS, Target::Client) => {
            // cliresCtrlCmdGpuDetachIds: DETACH_ALL is accepted; otherwise the first id must be
            // an attached GPU (the driver's loop breaks after the first id either way, and
            // detaching itself is a no-op on Linux: GPUs detach when their last file closes).
            let ids: [u32; 32] = c.get(0).expect("size checked");
            if ids[0] == DETACH_ALL_ATTACHED_IDS || ids[0] == INVALID_ID {
                return Some(NV_OK);
            }
            let attached = drv
                .gpu_by_id(ids[0])
                .is_some_and(|g| drv.gpu_attached(st, g));
            if attached {
                NV_OK
            } else {
                NV_ERR_INVALID_ARGUMENT
            }
        }
        (cmd::GPU_QUERY_DRAIN_STATE, Target::Client) => {
            // cliresCtrlCmdGpuQueryGpuDrainState -> gpumgrQueryGpuDrainState: any probed GPU
            // (attached or not); nothing is ever drained here (no MODIFY_DRAIN_STATE).
            let mut q: NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS = c.get(0).expect("size checked");
            if drv.gpu_by_id(q.gpuId).is_none() {
                return Some(NV_ERR_OBJECT_NOT_FOUND);
            }
            q.drainState = 0; // NV0000_CTRL_GPU_DRAIN_STATE_DISABLED
            q.flags = 0;
            c.put(0, &q);
            NV_OK
        }
        (cmd::DEVICE_HOST_GET_CAPS_V2, Target::Device) => {
            // deviceCtrlCmdHostGetCapsV2 -> kbusGetDeviceCaps on x86: the chipset is I/O
            // coherent (no EXPLICIT_CACHE_FLUSH_REQD), no BR04/C73 bridge, and GPU-coherent
            // mappings are always supported. One subdevice, so nothing is ANDed.
            c.put(0, &[HOST_CAPS_GPU_COHERENT_MAPPING_SUPPORTED, 0u8, 0u8]);
            NV_OK
        }
        (cmd::DEVICE_GPU_GET_VIRTUALIZATION_MODE, Target::Device) => {
            // deviceCtrlCmdGpuGetVirtualizationMode: bare metal, neither a vGPU guest, a
            // passthrough guest nor a vGPU host: NV0080_CTRL_GPU_VIRTUALIZATION_MODE_NONE; from
            // 555 also isGridBuild (offset 4), false for the regular driver.
            c.put(0, &0u32);
            if c.size >= 5 {
                c.put(4, &0u8);
            }
            NV_OK
        }
        (cmd::GPU_GET_ACTIVE_PARTITION_IDS, Target::Subdevice(_)) => {
            // subdeviceCtrlCmdGpuGetActivePartitionIds (kernel_mig_manager.c, 535.261.03
            // :6114-6118): MIG mode is off (as an H100 ships) -> NV_ERR_NOT_SUPPORTED; on an
            // error nothing is copied back (control.c :322-334), so the caller's buffer stays.
            NV_ERR_NOT_SUPPORTED
        }
        (cmd::RC_GET_WATCHDOG_INFO, Target::Subdevice(_)) => {
            // subdeviceCtrlCmdRcGetWatchdogInfo (kernel_rc_watchdog_ctrl.c :29-62), served by
            // the kernel: RmInitAdapter initialises the RC watchdog and disables it at once
            // (osinit.c :1788-1796); only a display client re-enables it. So a GPU without a
            // display reports DISABLED | INITIALIZED (5), not RUNNING: libcuda reads it for the
            // kernel-run-time-limit attribute, and the CUDA runtime fails to start without it.
            // A native GA106 (580.159.04) answers the same 4 bytes {5} (kayfabe
            // `crates/kayfabe-abi/src/cudartinit.rs`, shared/reference/native-traces.md §3.4).
            c.put(0, &WATCHDOG_DISABLED_INITIALIZED);
            NV_OK
        }
        (cmd::BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS, Target::Subdevice(_)) => {
            // Served by GSP-RM (flags ROUTE_TO_PHYSICAL | CACHEABLE, g_subdevice_nvoc.c), from
            // the PCIe atomics mask the kernel probed (kbifProbePcieReqAtomicCaps_GH100): the
            // kernel enables AtomicOp requests to the root port only on the CPUs of its allow
            // list (chipset_pcie.c :210-245, IceLake-SP, Sapphire Rapids, Milan, Genoa, Grace);
            // the simulated host is on none, so no atomic is supported: every entry
            // {bSupported = 0, attributes = 0}. NV_OK as natively (a GA106's CUDA program has
            // this control and one non-OK status elsewhere, native-traces.md §3.1).
            c.bytes_mut().fill(0);
            NV_OK
        }
        (cmd::PERF_BOOST, Target::Subdevice(_)) => {
            // subdeviceCtrlCmdKPerfBoost (kern_perf_boost.c, 535.261.03 :42-86): the kernel
            // hands flags and duration to GSP-RM (NV2080_CTRL_CMD_INTERNAL_PERF_BOOST_SET_2X)
            // and writes nothing back. libcuda boosts to max (flags 0x12, duration infinite)
            // at cuCtxCreate and clears (0x10, 0) at destroy; a native GA106 answers both
            // NV_OK with the bytes unchanged (native-traces.md §3.4, record 448). Boosts are
            // the firmware's per-client clock policy, which the simulated GPU does not have.
            NV_OK
        }
        (cmd::NVLINK_GET_NVLINK_STATUS, Target::Subdevice(_)) => {
            // subdeviceCtrlCmdBusGetNvlinkStatus (common_nvlinkapi.c :658, :682-689): the
            // simulated GPU has no NVLink (no KernelNvlink engine, kernel_nvlinkstate.c
            // :247-270): enabledLinkMask = 0, the rest as the caller sent it, NV_OK.
            // enabledLinkMask is the first field of NV2080_CTRL_CMD_NVLINK_GET_NVLINK_STATUS_PARAMS.
            c.put(0, &0u32);
            NV_OK
        }
        (cmd::BUS_GET_INFO_V2, Target::Subdevice(g)) => {
            // subdeviceCtrlCmdBusGetInfoV2 -> getBusInfos.
            let n: u32 = c.get(0).expect("size checked");
            let pl = c.pl;
            bus_infos(&drv.config.gpus[g], c.call, pl, 4, n)
        }
        (cmd::BUS_GET_INFO, Target::Subdevice(g)) => {
            // The deprecated form with a list pointer: RmDeprecatedGetControlHandler converts it
            // to _V2 (copy-in of busInfoListSize entries, V2, copy-out).
            let n: u32 = c.get(0).expect("size checked");
            let Some(list) = crate::buf::child(c.call, c.pl, 8) else {
                return Some(NV_ERR_INVALID_ARGUMENT);
            };
            if crate::buf::bytes(c.call, list).len() < 8 * n.min(BUS_INFO_MAX_LIST_SIZE) as usize {
                return Some(NV_ERR_INVALID_ADDRESS);
            }
            bus_infos(&drv.config.gpus[g], c.call, list, 0, n)
        }
        (cmd::TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO, Target::Subdevice(_)) => time_correlation(c),
        (cmd::BUS_GET_PCI_BAR_INFO, Target::Subdevice(g)) => {
            // subdeviceCtrlCmdBusGetPciBarInfo: pciBarCount = totalPciBars, then per BAR
            // {flags 0, barSize in MiB, barSizeBytes, barOffset = its CPU physical address};
            // the remaining entries zeroed.
            let bars = pci_bars(&drv.config.gpus[g]);
            let mut q = NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS::new_zeroed();
            #[expect(clippy::cast_possible_truncation, reason = "pci_bars() returns 3 BARs")]
            let count = bars.len() as u32;
            q.pciBarCount = count;
            for (out, &(size, addr)) in q.pciBarInfo.iter_mut().zip(bars.iter()) {
                *out = NV2080_CTRL_BUS_PCI_BAR_INFO {
                    flags: 0,
                    barSize: u32::try_from(size >> 20).unwrap_or(u32::MAX),
                    barSizeBytes: size,
                    barOffset: addr,
                };
            }
            c.put(0, &q);
            NV_OK
        }
        (cmd::GPU_GET_ENGINES_V2, Target::Subdevice(_)) => {
            // subdeviceCtrlCmdGpuGetEnginesV2: the engine database, filtered by MIG (off): the
            // whole list, engineCount written.
            let list = engines();
            #[expect(
                clippy::cast_possible_truncation,
                reason = "engines() is a fixed list of a few dozen engines"
            )]
            let count = list.len() as u32;
            c.put(0, &count);
            for (i, e) in list.iter().enumerate() {
                c.put(4 + 4 * i, e);
            }
            NV_OK
        }
        (cmd::GPU_GET_MEMOP_ENABLE, Target::Client) => {
            // cliresCtrlCmdGpuGetMemOpEnable: MEMOP_ENABLE only with the EnableStreamMemOPs
            // module parameter, which is 0 (the default, and what the params file says).
            c.put(0, &0u32);
            NV_OK
        }
        (cmd::GR_GET_CAPS_V2, Target::Subdevice(_)) => {
            // subdeviceCtrlCmdKGrGetCapsV2: unless bCapsPopulated (offset 40) is already set,
            // copy the static info's 23-byte caps table and set it. The table comes from GSP and
            // its bits are not defined in the open headers (only NV0080_CTRL_GR_CAPS_TBL_SIZE):
            // the simulator reports no caps bits. grRouteInfo (offset 24) names GR0 or nothing
            // without MIG.
            let mut q: NV2080_CTRL_GR_GET_CAPS_V2_PARAMS = c.get(0).expect("size checked");
            if q.bCapsPopulated == 0 {
                q.capsTbl = [0; 23];
                q.bCapsPopulated = 1;
                c.put(0, &q);
            }
            NV_OK
        }
        (cmd::CE_GET_ALL_CAPS, Target::Subdevice(_)) => {
            // subdeviceCtrlCmdCeGetAllCaps: capsTbl[NV2080_CTRL_MAX_PCES][2] in copy-engine
            // order and the `present` mask of the usable ones: COPY0..COPY9 (see `engines`).
            // NV2080_CTRL_MAX_PCES is 32 with a u32 mask (68 bytes) before 545, then 64 with a
            // u64 mask (136 bytes).
            let caps = ce_caps();
            let pces = if c.size == 68 { 32 } else { 64 };
            let mut tbl = vec![0u8; 2 * pces];
            for (i, cap) in caps.iter().enumerate() {
                tbl[2 * i..2 * i + 2].copy_from_slice(cap);
            }
            c.bytes_mut()[..2 * pces].copy_from_slice(&tbl);
            let present = (1u64 << caps.len()) - 1;
            if pces == 32 {
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "ce_caps() has 10 entries: a 10-bit mask"
                )]
                let present = present as u32;
                c.put(2 * pces, &present);
            } else {
                c.put(2 * pces, &present);
            }
            NV_OK
        }
        (cmd::GR_GET_SM_ISSUE_RATE_MODIFIER, Target::Subdevice(_)) => {
            // The SM issue rates after grRouteInfo (16 bytes): imla0, fmla16, dp, fmla32, ffma,
            // imla1..imla4, from GSP's static info. A data-center Hopper runs every class of
            // instruction at full speed (*_FULL_SPEED = 0), including double precision.
            let mut q: NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_PARAMS =
                c.get(0).expect("size checked");
            (q.imla0, q.fmla16, q.dp, q.fmla32, q.ffma) = (0, 0, 0, 0, 0);
            (q.imla1, q.imla2, q.imla3, q.imla4) = (0, 0, 0, 0);
            c.put(0, &q);
            NV_OK
        }
        (cmd::GR_GET_GLOBAL_SM_ORDER, Target::Subdevice(g)) => {
            // subdeviceCtrlCmdKGrGetGlobalSmOrder: the static info's SM order in
            // globalSmId[512], entries of u16s {gpcId, localTpcId, localSmId, globalTpcId,
            // virtualGpcId, migratableTpcId} (12 bytes), + ugpuId (14 bytes, 575) + physicalCpcId,
            // virtualTpcId (18 bytes, 580+; all 0 here: one uGPU, CPC = TPC numbering not
            // modelled); then numSm and numTpc; grRouteInfo last (16 bytes, 8-aligned).
            let entry = (c.size - 24) / SM_ORDER_MAX;
            let gpu = &drv.config.gpus[g];
            let order = global_sm_order(gpu);
            if order.len() > SM_ORDER_MAX {
                return Some(NV_ERR_INVALID_LIMIT);
            }
            for (i, e) in order.iter().enumerate() {
                c.put(entry * i, e);
            }
            #[expect(
                clippy::cast_possible_truncation,
                reason = "order.len() <= SM_ORDER_MAX = 512, checked above"
            )]
            let count = order.len() as u16;
            c.put(entry * SM_ORDER_MAX, &count);
            let tpcs = u16::try_from(gpu.tpc_count()).unwrap_or(u16::MAX);
            c.put(entry * SM_ORDER_MAX + 2, &tpcs);
            NV_OK
        }
        (cmd::GR_GET_GPC_MASK, Target::Subdevice(g)) => {
            // subdeviceCtrlCmdKGrGetGpcMask without MIG: kgrmgrGetLegacyGpcMask, every GPC.
            let n = drv.config.gpus[g].gpc_count.min(32);
            let mut q: NV2080_CTRL_GR_GET_GPC_MASK_PARAMS = c.get(0).expect("size checked");
            q.gpcMask = if n == 32 { u32::MAX } else { (1u32 << n) - 1 };
            c.put(0, &q);
            NV_OK
        }
        (cmd::GR_GET_TPC_MASK, Target::Subdevice(g)) => {
            // subdeviceCtrlCmdKGrGetTpcMask without MIG: kgrmgrGetLegacyTpcMask(gpcId), 0 for a
            // GPC that does not exist.
            let mut q: NV2080_CTRL_GR_GET_TPC_MASK_PARAMS = c.get(0).expect("size checked");
            let tpcs = tpcs_per_gpc(&drv.config.gpus[g]);
            q.tpcMask = tpcs
                .get(q.gpcId as usize)
                .map_or(0, |&n| if n >= 32 { u32::MAX } else { (1u32 << n) - 1 });
            c.put(0, &q);
            NV_OK
        }
        (cmd::CLIENT_GET_ADDR_SPACE_TYPE, Target::Client) => {
            // cliresCtrlCmdClientGetAddrSpaceType: a memory object's aperture (memGetMapAddrSpace:
            // system memory SYSMEM = 1, video memory VIDMEM = 2, a usermode page REGMEM = 3); a
            // device or subdevice maps its registers (gpuresGetMapAddrSpace: REGMEM); anything
            // else NV_ERR_INVALID_OBJECT; an unknown handle fails clientGetResourceRef.
            let mut q: NV0000_CTRL_CLIENT_GET_ADDR_SPACE_TYPE_PARAMS =
                c.get(0).expect("size checked");
            let h = q.hObject;
            let Some(obj) = st
                .clients
                .get(&h_client)
                .and_then(|cl| cl.objects().get(&h))
            else {
                return Some(NV_ERR_OBJECT_NOT_FOUND);
            };
            let space = match obj.kind {
                Kind::Memory { block } => match st.blocks.get(&block) {
                    Some(b) if b.regs => 3,
                    Some(b) if b.video => 2,
                    Some(_) => 1,
                    None => return Some(NV_ERR_OBJECT_NOT_FOUND),
                },
                Kind::Device { .. } | Kind::Subdevice { .. } => 3,
                _ => return Some(NV_ERR_INVALID_OBJECT),
            };
            q.addrSpaceType = space;
            c.put(0, &q);
            NV_OK
        }
        (cmd::GSP_GET_FEATURES, Target::Subdevice(_)) => {
            // Answered by the GSP-RM client (the handler is not in the open tree; semantics from
            // ctrl2080gsp.h): an H100 runs GSP-RM, by default, so bValid and bDefaultGspRmGpu
            // are true, UVM_ENABLED (bit 0) is set, and firmwareVersion is the firmware's build
            // version, the driver's own.
            let mut q = NV2080_CTRL_GSP_GET_FEATURES_PARAMS::new_zeroed();
            q.gspFeatures = 1; // NV2080_CTRL_GSP_GET_FEATURES_UVM_ENABLED_TRUE
            q.bValid = 1;
            q.bDefaultGspRmGpu = 1;
            crate::buf::put_cstr(&mut q.firmwareVersion, &drv.version_string);
            c.put(0, &q);
            NV_OK
        }
        (cmd::GPU_QUERY_COMPUTE_MODE_RULES, Target::Subdevice(_)) => {
            // subdeviceCtrlCmdGpuQueryComputeModeRules: the rules set by
            // GPU_SET_COMPUTE_MODE_RULES (nvidia-smi -c), default
            // NV2080_CTRL_GPU_COMPUTE_MODE_RULES_NONE (the "Default" compute mode).
            c.put(0, &0u32);
            NV_OK
        }
        (cmd::BUS_GET_C2C_INFO, Target::Subdevice(_)) => {
            // Answered by GSP firmware (no kernel handler). A PCIe H100 has no C2C link (that
            // is Grace Hopper's), so: link down, no links, no bandwidth, NV_OK; this is also
            // what a real GA106 with 580.159.04 answers (reindertpelsma/kayfabe,
            // traces/real_ga106/cuinit_ioctl_trace_real_ga106.txt row 86: 28 zero bytes, NV_OK).
            c.bytes_mut().fill(0);
            NV_OK
        }
        (cmd::GET_GPU_FABRIC_PROBE_INFO, Target::Subdevice(_)) => {
            // subdeviceCtrlCmdGetGpuFabricProbeInfo: no fabric probe was started for a GPU that
            // is in no NVSwitch fabric (SYSTEM_GET_FABRIC_STATUS says SKIP), so state (offset 0
            // in every version) = NV2080_CTRL_GPU_FABRIC_PROBE_STATE_UNSUPPORTED, NV_OK.
            c.put(0, &0u8);
            NV_OK
        }
        (cmd::CONF_COMPUTE_GET_CAPABILITIES, Target::ConfCompute) => {
            // confComputeApiCtrlCmdSystemGetCapabilities from the GPU manager's ccCaps, which
            // the first GPU to attach sets (gpumgrSetGpuCcCaps): an H100 is HCC-capable
            // (PDB_PROP_GPU_CC_FEATURE_CAPABLE) with CC off and no dev-tools mode. Bytes:
            // cpuCapability (NONE: not a SEV/TDX guest), gpusCapability (HCC = 2 once a GPU
            // is attached; the simulator does not keep the caps after the last GPU detaches),
            // environment (UNAVAILABLE), ccFeature (DISABLED), devToolsMode (DISABLED), and from
            // 550 multiGpuMode (NONE).
            let attached = (0..drv.config.gpus.len()).any(|g| drv.gpu_attached(st, g));
            let size = c.size;
            let out = c.bytes_mut();
            out.fill(0);
            out[1] = if attached { 2 } else { 0 };
            debug_assert!(size >= 5);
            NV_OK
        }
        (cmd::CONF_COMPUTE_GET_GPUS_STATE, Target::ConfCompute) => {
            // confComputeApiCtrlCmdSystemGetGpusState: bAcceptClientRequest, set only in
            // dev-tools mode (or by SET_GPUS_STATE from a privileged client): false.
            c.put(0, &0u8);
            NV_OK
        }
        (cmd::DEVICE_FB_GET_CAPS_V2, Target::Device) => {
            // deviceCtrlCmdFbGetCapsV2 -> memmgrGetDeviceCaps for one GPU: RENDER_TO_SYSMEM,
            // BLOCKLINEAR, SUPPORT_CACHED_SYSMEM (GPU caching on) | BLOCKLINEAR_GOBS_512,
            // GENERIC_PAGE_KIND | VIDMEM_ALLOCS_ARE_CLEARED (scrub on free); no scanout (no
            // display), no sysmem compression, no ECC scrub by the OS (Pascal+), no PLC WARs.
            c.put(0, &[0x01u8 | 0x02 | 0x08, 0x01 | 0x80, 0x02]);
            NV_OK
        }
        _ => return None,
    })
}

/// `NV2080_CTRL_CMD_GR_GET_GLOBAL_SM_ORDER_MAX_SM_COUNT`.
const SM_ORDER_MAX: usize = 512;

/// TPCs per GPC: the GPU's TPCs spread over its GPCs, the first GPCs taking one more where they
/// do not divide evenly (an H100 SXM5: 66 TPCs in 8 GPCs, two of 9 and six of 8).
pub(crate) fn tpcs_per_gpc(gpu: &crate::config::SimGpu) -> Vec<u32> {
    let gpcs = gpu.gpc_count.max(1);
    let tpcs = gpu.tpc_count();
    (0..gpcs)
        .map(|i| tpcs / gpcs + u32::from(i < tpcs % gpcs))
        .collect()
}

/// The global SM order: TPCs numbered across GPCs in turn (local TPC 0 of every GPC, then local
/// TPC 1, ...), each TPC's SMs consecutively; as 6 u16s per SM.
#[expect(
    clippy::cast_possible_truncation,
    reason = "GPU shapes are small (an H100: 8 GPCs of 9 TPCs, 2 SMs each); global_tpc is a u16 too"
)]
fn global_sm_order(gpu: &crate::config::SimGpu) -> Vec<[u16; 6]> {
    let tpcs = tpcs_per_gpc(gpu);
    let max = tpcs.iter().copied().max().unwrap_or(0);
    let mut out = Vec::new();
    let mut global_tpc = 0u16;
    for local_tpc in 0..max {
        for (gpc, &n) in tpcs.iter().enumerate() {
            if local_tpc >= n {
                continue;
            }
            for sm in 0..gpu.sm_per_tpc {
                out.push([
                    gpc as u16,
                    local_tpc as u16,
                    sm as u16,
                    global_tpc,
                    gpc as u16,
                    local_tpc as u16,
                ]);
            }
            global_tpc += 1;
        }
    }
    out
}

/// The copy engines' `NV2080_CTRL_CE_CAPS_*` bytes, COPY0 first: two GR-synchronous copy
/// engines (GRCE | SHARED) for the graphics/compute channels, one tuned for system-memory
/// reads and one for writes, and six for peer (NVLink) traffic; all copy system memory and
/// peers (SYSMEM, P2P), take block-linear copies over 64 KiB and both pipelined and
/// non-pipelined (byte 1). The real assignment is GSP's PCE-to-LCE map of the board; this one
/// is a plausible H100 SXM map.
pub(crate) fn ce_caps() -> [[u8; 2]; 10] {
    const COMMON: u8 = 0x20 | 0x40 | 0x80; // SYSMEM | P2P | BL_SIZE_GT_64K
    const BL: u8 = 0x01 | 0x02; // SUPPORTS_NONPIPELINED_BL | SUPPORTS_PIPELINED_BL
    let mut caps = [[COMMON | 0x10, BL]; 10]; // NVLINK_P2P
    caps[0] = [COMMON | 0x01 | 0x02, BL]; // GRCE | SHARED
    caps[1] = [COMMON | 0x01 | 0x02, BL];
    caps[2] = [COMMON | 0x04, BL]; // SYSMEM_READ
    caps[3] = [COMMON | 0x08, BL]; // SYSMEM_WRITE
    caps
}

/// The H100's engines as `NV2080_ENGINE_TYPE_*`: GR0, the copy engines COPY0..COPY9 (the
/// most the 535 headers know), NVDEC0..6 and NVJPEG0..6 (7 each on GH100), OFA and SEC2.
pub(crate) fn engines() -> Vec<u32> {
    let mut v = vec![0x01]; // GR0
    v.extend(0x09..=0x12); // COPY0..COPY9
    v.push(0x13); // NVDEC0
    v.extend(0x14..=0x19); // NVDEC1..NVDEC6
    v.push(0x2b); // NVJPEG0
    v.extend(0x2c..=0x31); // NVJPEG1..NVJPEG6
    v.push(0x33); // OFA
    v.push(0x26); // SEC2
    v
}

/// The GPU's PCI BARs as RM counts them (64-bit BARs count once): (size, CPU physical
/// address). An H100 has BAR0 (16 MiB of registers), BAR1 (the framebuffer aperture) and BAR2
/// (32 MiB, RM's instance memory window), in `lspci` terms regions 0, 1 and 3.
pub(crate) fn pci_bars(gpu: &crate::config::SimGpu) -> [(u64, u64); 3] {
    [
        (16 << 20, gpu.bar0_address),
        (gpu.bar1_bytes, gpu.bar1_address),
        (32 << 20, gpu.bar1_address + gpu.bar1_bytes),
    ]
}

/// `NV2080_CTRL_BUS_INFO_MAX_LIST_SIZE`.
const BUS_INFO_MAX_LIST_SIZE: u32 = 0x34;
/// `NV2080_CTRL_BUS_INFO_INDEX_MAX` (`SYSMEM_CONNECTION_TYPE`).
const BUS_INFO_INDEX_MAX: u32 = 0x33;
/// `NV2080_CTRL_BUS_INFO_TYPE_PCI_EXPRESS`.
const BUS_INFO_TYPE_PCI_EXPRESS: u32 = 3;

/// The `NV2080_CTRL_BUS_INFO_INDEX_*` values the kernel RM computes itself for a discrete PCIe
/// GPU on an I/O-coherent x86 host (`getBusInfos`); `None` for the PCIe link state and error
/// counters (read from the link or asked of GSP), which are not modelled.
/// `getBusInfos` over the `{index, data}` list of `n` entries at `off` in the buffer at `loc`.
fn bus_infos(
    gpu: &crate::config::SimGpu,
    call: &mut host_driver::HostCall,
    loc: crate::buf::Loc,
    off: usize,
    n: u32,
) -> u32 {
    if n == 0 || n > BUS_INFO_MAX_LIST_SIZE {
        return NV_ERR_INVALID_ARGUMENT;
    }
    let buf = crate::buf::bytes_mut(call, loc);
    for i in 0..n as usize {
        let at = off + 8 * i;
        let index: u32 = crate::buf::read(buf, at).expect("size checked");
        let Some(value) = bus_info(gpu, index) else {
            // getBusInfos: an index it does not know is INVALID_ARGUMENT (data 0); the PCIe
            // link and error counters (GSP RPCs on an H100) are not modelled.
            if index > BUS_INFO_INDEX_MAX {
                crate::buf::write(buf, at + 4, &0u32);
                return NV_ERR_INVALID_ARGUMENT;
            }
            tracing::debug!(index, "bus info index not modelled");
            return NV_ERR_NOT_SUPPORTED;
        };
        crate::buf::write(buf, at + 4, &value);
    }
    NV_OK
}

fn bus_info(gpu: &crate::config::SimGpu, index: u32) -> Option<u32> {
    Some(match index {
        // TYPE, INTERFACE_TYPE, GPU_INTERFACE_TYPE: kbifGetBusIntfType (no bridges any more).
        0x00 | 0x13 | 0x2e => BUS_INFO_TYPE_PCI_EXPRESS,
        0x01 => 0, // INTLINE: the legacy INTx line; MSI-X is used
        0x02 => 0, // CAPS: kbusControlGetCaps, CHIP_INTEGRATED only for Tegra
        // COHERENT_DMA_FLAGS / NONCOHERENT_DMA_FLAGS: kbifInitDmaCaps sets SNOOP and NOSNOOP
        // for context DMAs on an I/O-coherent chipset, and the GPU GART supports both (CTXDMA
        // bit 0, GPUGART bit 2).
        0x0b | 0x0c => 0x5,
        0x0e => 0x2, // GPU_GART_FLAGS: UNIFIED
        0x0f => u32::from(gpu.pci_bus),
        0x10 => u32::from(gpu.pci_device),
        0x2c => gpu.pci_domain,
        0x33 => 0, // SYSMEM_CONNECTION_TYPE_PCIE (no NVLink or C2C to system memory)
        // PCIE_GPU_LINK_CAPS, and ROOT_ / DOWNSTREAM_LINK_CAPS (no BR03/BR04 bridge: the root
        // port's): the Link Capabilities register, MAX_SPEED 3:0 (5 = 32 GT/s for gen 5) and
        // MAX_WIDTH 9:4; the GPU sits directly on a root port of the same generation and width,
        // no ASPM.
        0x03 | 0x04 | 0x06 => (gpu.pcie_gen & 0xf) | ((gpu.pcie_width & 0x3f) << 4),
        // PCIE_GPU_LINK_CTRL_STATUS, ROOT_ / DOWNSTREAM_LINK_CTRL_STATUS: Link Control in 15:0
        // (ASPM disabled), Link Status in 31:16: the link trained at its maximum (LINK_SPEED
        // 19:16, LINK_WIDTH 25:20).
        0x07 | 0x08 | 0x0a => ((gpu.pcie_gen & 0xf) << 16) | ((gpu.pcie_width & 0x3f) << 20),
        // PCIE_GEN_INFO (answered by GSP on an H100): GEN 15:12 (the link's maximum),
        // CURR_LEVEL 19:16 and GPU_GEN 23:20, each as gen - 1.
        0x2d => {
            let g = gpu.pcie_gen.saturating_sub(1) & 0xf;
            (g << 12) | (g << 16) | (g << 20)
        }
        _ => return None,
    })
}

/// `NV2080_CTRL_TIMER_GPU_CPU_TIME_MAX_SAMPLES`.
const TIME_MAX_SAMPLES: u8 = 16;

/// Nanoseconds of `clock`.
fn clock_ns(clock: nix::time::ClockId) -> u64 {
    nix::time::clock_gettime(clock).map_or(0, |t| {
        // Both are non-negative for the clocks read here (a time before 1970 reads as 0s).
        u64::try_from(t.tv_sec())
            .unwrap_or(0)
            .wrapping_mul(1_000_000_000)
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

/// The GPU's PTIMER: nanoseconds, set from the OS's wall clock when RM initialises the GPU
/// (`tmrSetCurrentTime`), so it reads as the wall clock.
pub(crate) fn gpu_time_ns() -> u64 {
    clock_ns(nix::time::ClockId::CLOCK_REALTIME)
}

/// Offset of the samples in the correlation params.
const SAMPLES: usize = offset_of!(
    NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS,
    samples
);

/// `subdeviceCtrlCmdTimerGetGpuCpuTimeCorrelationInfo` on a CPU-RM (not GSP-RM) build.
fn time_correlation(c: &mut Ctx<'_>) -> u32 {
    let clk: u8 = c.get(0).expect("size checked");
    let count: u8 = c.get(1).expect("size checked");
    if count > TIME_MAX_SAMPLES {
        return NV_ERR_INVALID_ARGUMENT;
    }
    match (clk >> 4, clk & 0xf) {
        // PROCESSOR_GSP: forwarded to GSP, which answers with its own clock: not modelled.
        (1, _) => NV_ERR_NOT_SUPPORTED,
        (0, 1) => {
            // OSTIME: cpuTime in microseconds of osGetCurrentTime (wall clock), gpuTime from
            // PTIMER, sampleCount pairs.
            for i in 0..usize::from(count) {
                let cpu_us = clock_ns(nix::time::ClockId::CLOCK_REALTIME) / 1000;
                let sample = NV2080_CTRL_TIMER_GPU_CPU_TIME_SAMPLE {
                    cpuTime: cpu_us,
                    gpuTime: gpu_time_ns(),
                };
                c.put(SAMPLES + 16 * i, &sample);
            }
            NV_OK
        }
        (0, 3) => {
            // PLATFORM_API: one pair, the GPU time between two osGetPerformanceCounter reads
            // (monotonic raw nanoseconds), the CPU time their mean.
            let before = clock_ns(nix::time::ClockId::CLOCK_MONOTONIC_RAW);
            let gpu = gpu_time_ns();
            let after = clock_ns(nix::time::ClockId::CLOCK_MONOTONIC_RAW);
            let sample = NV2080_CTRL_TIMER_GPU_CPU_TIME_SAMPLE {
                cpuTime: before / 2 + after / 2,
                gpuTime: gpu,
            };
            c.put(SAMPLES, &sample);
            NV_OK
        }
        // TSC (tmrGetGpuAndCpuTimestampPair reads the CPU's time-stamp counter, which this
        // simulator does not read) and unknown sources.
        (0, _) => NV_ERR_NOT_SUPPORTED,
        _ => NV_ERR_INVALID_ARGUMENT,
    }
}
