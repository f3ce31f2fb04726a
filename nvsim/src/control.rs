//! `NV_ESC_RM_CONTROL`: the checks of `_rmapiRmControl` and `serverControl`, and the controls a
//! CUDA or `nvidia-smi` initialisation issues, answered with the configured GPU's values.

use host_driver::HostCall;
use nvproxy_abi::RMAPI_PARAM_COPY_MAX_PARAMS_SIZE;
use nvproxy_abi::structs::*;

use crate::buf::{Loc, bytes, bytes_mut, child, put_cstr, read_at};
use crate::config::SimGpu;
use crate::control_ctx::{Ctx, Target};
use crate::driver::{Kind, SimDriver, State};
use crate::rm;
use crate::status::*;

/// Control command numbers the simulator answers.
pub mod cmd {
    /// `NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION` (embedded string pointers).
    pub const SYSTEM_GET_BUILD_VERSION: u32 = 0x0000_0101;
    /// `NV0000_CTRL_CMD_SYSTEM_GET_FABRIC_STATUS`.
    pub const SYSTEM_GET_FABRIC_STATUS: u32 = 0x0000_0136;
    /// `NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2`.
    pub const SYSTEM_GET_BUILD_VERSION_V2: u32 = 0x0000_013e;
    /// `NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS`.
    pub const GPU_GET_ATTACHED_IDS: u32 = 0x0000_0201;
    /// `NV0000_CTRL_CMD_GPU_GET_ID_INFO`.
    pub const GPU_GET_ID_INFO: u32 = 0x0000_0202;
    /// `NV0000_CTRL_CMD_GPU_GET_DEVICE_IDS`.
    pub const GPU_GET_DEVICE_IDS: u32 = 0x0000_0204;
    /// `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2`.
    pub const GPU_GET_ID_INFO_V2: u32 = 0x0000_0205;
    /// `NV0000_CTRL_CMD_GPU_GET_PROBED_IDS`.
    pub const GPU_GET_PROBED_IDS: u32 = 0x0000_0214;
    /// `NV0000_CTRL_CMD_GPU_ATTACH_IDS`.
    pub const GPU_ATTACH_IDS: u32 = 0x0000_0215;
    /// `NV0000_CTRL_CMD_GPU_GET_PCI_INFO`.
    pub const GPU_GET_PCI_INFO: u32 = 0x0000_021b;
    /// `NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID`.
    pub const GPU_GET_UUID_FROM_GPU_ID: u32 = 0x0000_0275;
    /// `NV0000_CTRL_CMD_CLIENT_SET_INHERITED_SHARE_POLICY`.
    pub const CLIENT_SET_INHERITED_SHARE_POLICY: u32 = 0x0000_0d04;
    /// `NV0080_CTRL_CMD_GPU_GET_CLASSLIST` (embedded list pointer).
    pub const DEVICE_GPU_GET_CLASSLIST: u32 = 0x0080_0201;
    /// `NV0080_CTRL_CMD_GPU_GET_NUM_SUBDEVICES`.
    pub const DEVICE_GPU_GET_NUM_SUBDEVICES: u32 = 0x0080_0280;
    /// `NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2`.
    pub const DEVICE_GPU_GET_CLASSLIST_V2: u32 = 0x0080_0292;
    /// `NV2080_CTRL_CMD_GPU_GET_INFO_V2`.
    pub const GPU_GET_INFO_V2: u32 = 0x2080_0102;
    /// `NV2080_CTRL_CMD_GPU_GET_NAME_STRING`.
    pub const GPU_GET_NAME_STRING: u32 = 0x2080_0110;
    /// `NV2080_CTRL_CMD_GPU_GET_SHORT_NAME_STRING`.
    pub const GPU_GET_SHORT_NAME_STRING: u32 = 0x2080_0111;
    /// `NV2080_CTRL_CMD_GPU_GET_SIMULATION_INFO`.
    pub const GPU_GET_SIMULATION_INFO: u32 = 0x2080_0119;
    /// `NV2080_CTRL_CMD_GPU_GET_GID_INFO`.
    pub const GPU_GET_GID_INFO: u32 = 0x2080_014a;
    /// `NV2080_CTRL_CMD_GR_GET_INFO` (embedded list pointer).
    pub const GR_GET_INFO: u32 = 0x2080_1201;
    /// `NV2080_CTRL_CMD_GR_GET_INFO_V2`.
    pub const GR_GET_INFO_V2: u32 = 0x2080_1228;
    /// `NV2080_CTRL_CMD_FB_GET_INFO` (embedded list pointer).
    pub const FB_GET_INFO: u32 = 0x2080_1301;
    /// `NV2080_CTRL_CMD_FB_GET_INFO_V2`.
    pub const FB_GET_INFO_V2: u32 = 0x2080_1303;
    /// `NV2080_CTRL_CMD_MC_GET_ARCH_INFO`.
    pub const MC_GET_ARCH_INFO: u32 = 0x2080_1701;
    /// `NV2080_CTRL_CMD_BUS_GET_PCI_INFO`.
    pub const BUS_GET_PCI_INFO: u32 = 0x2080_1801;
    /// `NV2080_CTRL_CMD_GPU_ACQUIRE_COMPUTE_MODE_RESERVATION` (no params).
    pub const GPU_ACQUIRE_COMPUTE_MODE_RESERVATION: u32 = 0x2080_0145;
    /// `NV2080_CTRL_CMD_GPU_RELEASE_COMPUTE_MODE_RESERVATION` (no params).
    pub const GPU_RELEASE_COMPUTE_MODE_RESERVATION: u32 = 0x2080_0146;
    /// `NV2080_CTRL_CMD_RC_RELEASE_WATCHDOG_REQUESTS` (no params).
    pub const RC_RELEASE_WATCHDOG_REQUESTS: u32 = 0x2080_220c;
    /// `NV2080_CTRL_CMD_RC_SOFT_DISABLE_WATCHDOG` (no params).
    pub const RC_SOFT_DISABLE_WATCHDOG: u32 = 0x2080_2210;
}

const INVALID_ID: u32 = 0xffff_ffff;
/// `NV0000_CTRL_GET_SYSTEM_FABRIC_STATUS_SKIP`: no externally managed fabric.
const FABRIC_STATUS_SKIP: u32 = 1;

/// `sizeof` the control's params for this driver version, when RM knows the control.
fn expected_size(drv: &SimDriver, c: u32) -> Option<u32> {
    if let Some(spec) = drv.abi.controls.get(&c) {
        return Some(spec.param_size);
    }
    let major = drv.config.version.major();
    match c {
        // driverBranch[256] joined the V2 params in 560.
        cmd::SYSTEM_GET_BUILD_VERSION_V2 => Some(if major >= 560 { 1032 } else { 776 }),
        cmd::GR_GET_INFO_V2 => Some(24 + 8 * gr_info_max(drv)),
        // {NvU32 tsgInterleaveLevel} / {NvU32 channelInterleaveLevel} in every version; not
        // in the proxy's tables (tenants never reach them, `ioctl_proxy::schedule`).
        crate::channel::cmd::TSG_SET_INTERLEAVE_LEVEL
        | crate::channel::cmd::CHANNEL_SET_INTERLEAVE_LEVEL => Some(4),
        _ => None,
    }
}

/// `NV2080_CTRL_GR_INFO_MAX_SIZE` of this driver version.
fn gr_info_max(drv: &SimDriver) -> u32 {
    match drv.config.version.major() {
        0..=544 => 53,
        545..=569 => 56,
        570..=589 => 58,
        _ => 59,
    }
}

/// One `NV_ESC_RM_CONTROL`; returns the status for `NVOS54_PARAMETERS.status`.
pub(crate) fn control(
    drv: &SimDriver,
    st: &mut State,
    os_info: i32,
    call: &mut HostCall,
    loc: Loc,
) -> u32 {
    let p: NVOS54_PARAMETERS = read_at(call, loc, 0).expect("size checked by the escape");
    // RmDeprecatedGetControlHandler runs before the resource server: a legacy GSS command on a
    // GPU object goes to GSP firmware past all of the checks below.
    if let Some(status) = crate::gss_legacy::control(drv, st, &p, call, loc) {
        return status;
    }
    // NULL commands (class-wide too) succeed without looking at anything.
    if p.cmd & 0xffff == 0 {
        return NV_OK;
    }
    // NVOS54_FLAGS_IRQL_RAISED / NVOS54_FLAGS_LOCK_BYPASS: kernel clients only.
    if p.flags & 0x3 != 0 {
        return NV_ERR_INVALID_ARGUMENT;
    }
    // One lookup of the client for the checks below (its answers stay in the driver's order).
    let client = st.clients.get(&p.hClient);
    if client.is_none() {
        return NV_ERR_INVALID_CLIENT;
    }
    let pbuf = child(call, loc, 16);
    let size = p.paramsSize;
    let expected = expected_size(drv, p.cmd);
    if (size != 0 && pbuf.is_none())
        || (size == 0 && pbuf.is_some())
        || expected.is_some_and(|e| e != size)
    {
        return NV_ERR_INVALID_ARGUMENT;
    }
    if size > RMAPI_PARAM_COPY_MAX_PARAMS_SIZE {
        return NV_ERR_INVALID_ARGUMENT;
    }
    if let Some(l) = pbuf
        && bytes(call, l).len() < size as usize
    {
        return NV_ERR_INVALID_ADDRESS;
    }
    // serverControl (`State::client_for`: the client must be the caller's)
    let Some(client) = client.filter(|c| c.os_info == os_info) else {
        return NV_ERR_INVALID_CLIENT;
    };
    let target = if p.hObject == p.hClient {
        Target::Client
    } else {
        match client.objects().get(&p.hObject) {
            None => return NV_ERR_OBJECT_NOT_FOUND,
            Some(o) => match o.kind {
                Kind::Device { .. } => Target::Device,
                Kind::Subdevice { gpu, .. } => Target::Subdevice(gpu),
                Kind::ConfCompute => Target::ConfCompute,
                _ => Target::Other,
            },
        }
    };
    // Controls without params.
    if size == 0 && expected == Some(0) {
        return match (p.cmd, target) {
            // krcWatchdogChangeState: releasing and soft-disabling never conflict with another
            // client's request (only enable against disable does); MIG is off.
            (
                cmd::RC_RELEASE_WATCHDOG_REQUESTS | cmd::RC_SOFT_DISABLE_WATCHDOG,
                Target::Subdevice(_),
            ) => NV_OK,
            // subdeviceCtrlCmdGpuAcquireComputeModeReservation: the simulated GPUs are in
            // compute mode NONE (QUERY_COMPUTE_MODE_RULES), where the caller always gets it.
            (cmd::GPU_ACQUIRE_COMPUTE_MODE_RESERVATION, Target::Subdevice(g)) => {
                st.gpus[g].compute_reservation = Some(p.hClient);
                NV_OK
            }
            // ...Release: only the holder may release it.
            (cmd::GPU_RELEASE_COMPUTE_MODE_RESERVATION, Target::Subdevice(g)) => {
                if st.gpus[g].compute_reservation == Some(p.hClient) {
                    st.gpus[g].compute_reservation = None;
                    NV_OK
                } else {
                    NV_ERR_STATE_IN_USE
                }
            }
            _ => {
                tracing::debug!(
                    cmd = format_args!("{:#x}", p.cmd),
                    "control without params not simulated"
                );
                NV_ERR_NOT_SUPPORTED
            }
        };
    }
    // Every simulated control has a known size (checked above); anything else is not simulated.
    let (Some(pl), Some(_)) = (pbuf, expected) else {
        tracing::debug!(
            cmd = format_args!("{:#x}", p.cmd),
            size,
            params = pbuf.map(|l| {
                let b = bytes(call, l);
                b[..b.len().min(256)]
                    .iter()
                    .map(|x| format!("{x:02x}"))
                    .collect::<String>()
            }),
            "control of unknown size not simulated"
        );
        return NV_ERR_NOT_SUPPORTED;
    };
    let mut c = Ctx {
        drv,
        call,
        pl,
        size: size as usize,
    };
    // The controls of TSGs and channels (fifo.rs).
    if matches!(target, Target::Other)
        && let Some(status) = crate::fifo::control(st, &mut c, p.hClient, p.hObject, p.cmd)
    {
        return status;
    }
    if matches!(target, Target::Device)
        && let Some(status) = crate::fifo::device_control(st, &mut c, p.hClient, p.cmd)
    {
        return status;
    }
    if matches!(target, Target::Subdevice(_))
        && let Some(status) = crate::fifo::subdevice_control(st, &mut c, p.hClient, p.cmd)
    {
        return status;
    }
    match (p.cmd, target) {
        // Exported by the kernel from 550.40.07 (535's table has no entry: not reached there).
        (crate::perf::PERF_CUDA_LIMIT_SET_CONTROL, Target::Device) => {
            let on: u8 = c.get(0).expect("size checked");
            crate::perf::cuda_limit_set(st, p.hClient, p.hObject, on != 0)
                .expect("the target is a device")
        }
        (cmd::SYSTEM_GET_BUILD_VERSION, Target::Client) => build_version(c),
        (cmd::SYSTEM_GET_BUILD_VERSION_V2, Target::Client) => build_version_v2(c),
        (cmd::SYSTEM_GET_FABRIC_STATUS, Target::Client) => {
            c.put(0, &FABRIC_STATUS_SKIP);
            NV_OK
        }
        (cmd::GPU_GET_ATTACHED_IDS, Target::Client) => {
            let mut out = NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS {
                gpuIds: [INVALID_ID; 32],
            };
            let attached = (0..drv.config.gpus.len()).filter(|&g| drv.gpu_attached(st, g));
            for (slot, g) in attached.enumerate() {
                out.gpuIds[slot] = drv.config.gpus[g].gpu_id();
            }
            c.put(0, &out);
            NV_OK
        }
        (cmd::GPU_GET_ID_INFO | cmd::GPU_GET_ID_INFO_V2, Target::Client) => id_info(st, c, p.cmd),
        (cmd::GPU_GET_DEVICE_IDS, Target::Client) => {
            let mask = (0..drv.config.gpus.len())
                .filter(|&g| drv.gpu_attached(st, g))
                .fold(0u32, |m, g| m | (1 << g));
            c.put(0, &mask);
            NV_OK
        }
        (cmd::GPU_GET_PROBED_IDS, Target::Client) => {
            // gpuIds, excludedGpuIds and (580+) gpuFlags, each 32 entries.
            let lists = c.size / 128;
            let out = c.bytes_mut();
            for i in 0..32 {
                let id = drv.config.gpus.get(i).map_or(INVALID_ID, SimGpu::gpu_id);
                crate::buf::write(out, 4 * i, &id);
                crate::buf::write(out, 128 + 4 * i, &INVALID_ID);
                if lists > 2 {
                    crate::buf::write(out, 256 + 4 * i, &0u32);
                }
            }
            NV_OK
        }
        (cmd::GPU_ATTACH_IDS, Target::Client) => {
            // On Linux this only checks the ids are probed GPUs; the attach happens on open.
            let ids: [u32; 32] = c.get(0).expect("size checked");
            if ids[0] == NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS {
                return NV_OK;
            }
            for &id in ids.iter().take_while(|&&id| id != INVALID_ID) {
                if drv.gpu_by_id(id).is_none() {
                    return NV_ERR_INVALID_ARGUMENT;
                }
            }
            NV_OK
        }
        (cmd::GPU_GET_PCI_INFO, Target::Client) => {
            let mut q: NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS = c.get(0).expect("size checked");
            let Some(g) = drv.gpu_by_id(q.gpuId) else {
                return NV_ERR_OBJECT_NOT_FOUND;
            };
            let gpu = &drv.config.gpus[g];
            q.domain = gpu.pci_domain;
            q.bus = u16::from(gpu.pci_bus);
            q.slot = u16::from(gpu.pci_device);
            c.put(0, &q);
            NV_OK
        }
        (cmd::GPU_GET_UUID_FROM_GPU_ID, Target::Client) => {
            let mut q: NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS =
                c.get(0).expect("size checked");
            let Some(g) = drv.gpu_by_id(q.gpuId) else {
                return NV_ERR_OBJECT_NOT_FOUND;
            };
            // Only the SHA-1 UUID exists; asking for the SHA-256 type fails.
            if q.flags & 0x4 != 0 {
                return if drv.gpu_attached(st, g) {
                    NV_ERR_INVALID_FLAGS
                } else {
                    NV_ERR_OBJECT_NOT_FOUND
                };
            }
            let len = put_uuid(&drv.config.gpus[g], &mut q.gpuUuid, q.flags & 0x3 == 0x2);
            q.uuidStrLen = len;
            c.put(0, &q);
            NV_OK
        }
        (cmd::CLIENT_SET_INHERITED_SHARE_POLICY, Target::Client) => {
            let q: NV0000_CTRL_CLIENT_SET_INHERITED_SHARE_POLICY_PARAMS =
                c.get(0).expect("size checked");
            if q.sharePolicy.r#type >= 8 {
                NV_ERR_INVALID_ARGUMENT
            } else {
                NV_OK
            }
        }
        (cmd::DEVICE_GPU_GET_CLASSLIST, Target::Device) => classlist(c),
        (cmd::DEVICE_GPU_GET_CLASSLIST_V2, Target::Device) => {
            let cap = (c.size - 4) / 4;
            let list = class_list();
            let Some(count) = u32::try_from(list.len()).ok().filter(|_| list.len() <= cap) else {
                return NV_ERR_INVALID_PARAM_STRUCT;
            };
            c.put(0, &count);
            for (i, k) in list.iter().enumerate() {
                c.put(4 + 4 * i, k);
            }
            NV_OK
        }
        (cmd::DEVICE_GPU_GET_NUM_SUBDEVICES, Target::Device) => {
            c.put(0, &1u32);
            NV_OK
        }
        (cmd::GPU_GET_INFO_V2, Target::Subdevice(g)) => {
            let max = u32::try_from((c.size - 4) / 8).unwrap_or(u32::MAX);
            let n: u32 = c.get(0).expect("size checked");
            let gpu = &drv.config.gpus[g];
            info_list(c.call, c.pl, 4, n, max, |i| gpu_info(gpu, i))
        }
        (cmd::GPU_GET_NAME_STRING, Target::Subdevice(g)) => {
            let flags: u32 = c.get(0).expect("size checked");
            let name = &drv.config.gpus[g].name;
            let out = &mut c.bytes_mut()[4..];
            match flags {
                0 => put_cstr(&mut out[..64], name),
                1 if out.len() >= 128 => {
                    out[..128].fill(0);
                    for (i, u) in name.encode_utf16().take(63).enumerate() {
                        out[2 * i..2 * i + 2].copy_from_slice(&u.to_ne_bytes());
                    }
                }
                _ => return NV_ERR_INVALID_ARGUMENT,
            }
            NV_OK
        }
        (cmd::GPU_GET_SHORT_NAME_STRING, Target::Subdevice(g)) => {
            put_cstr(&mut c.bytes_mut()[..64], &drv.config.gpus[g].short_name);
            NV_OK
        }
        (cmd::GPU_GET_SIMULATION_INFO, Target::Subdevice(_)) => {
            // NV2080_CTRL_GPU_GET_SIMULATION_INFO_TYPE_NONE: it answers as silicon.
            c.put(0, &0u32);
            NV_OK
        }
        (cmd::GPU_GET_GID_INFO, Target::Subdevice(g)) => {
            let mut q: NV2080_CTRL_GPU_GET_GID_INFO_PARAMS = c.get(0).expect("size checked");
            if q.flags & 0x4 != 0 {
                return NV_ERR_INVALID_FLAGS; // only the SHA-1 type exists
            }
            q.length = put_uuid(&drv.config.gpus[g], &mut q.data, q.flags & 0x3 == 0x2);
            c.put(0, &q);
            NV_OK
        }
        (cmd::GR_GET_INFO, Target::Subdevice(g)) => {
            let n: u32 = c.get(0).expect("size checked");
            let max = gr_info_max(drv);
            let Some(list) = child(c.call, c.pl, 8) else {
                return NV_ERR_INVALID_ARGUMENT;
            };
            let gpu = &drv.config.gpus[g];
            info_list(c.call, list, 0, n.min(max), max, |i| gr_info(gpu, i))
        }
        (cmd::GR_GET_INFO_V2, Target::Subdevice(g)) => {
            let max = gr_info_max(drv);
            let n: u32 = c.get(0).expect("size checked");
            let gpu = &drv.config.gpus[g];
            info_list(c.call, c.pl, 4, n, max, |i| gr_info(gpu, i))
        }
        (cmd::FB_GET_INFO_V2, Target::Subdevice(g)) => {
            let max = u32::try_from((c.size - 4) / 8).unwrap_or(u32::MAX);
            let n: u32 = c.get(0).expect("size checked");
            let books = FbView::of(drv, st, g);
            let gpu = &drv.config.gpus[g];
            info_list(c.call, c.pl, 4, n, max, |i| fb_info(gpu, books, i))
        }
        (cmd::FB_GET_INFO, Target::Subdevice(g)) => {
            let n: u32 = c.get(0).expect("size checked");
            let max = fb_info_max(drv);
            let Some(list) = child(c.call, c.pl, 8) else {
                return NV_ERR_INVALID_ARGUMENT;
            };
            let books = FbView::of(drv, st, g);
            let gpu = &drv.config.gpus[g];
            info_list(c.call, list, 0, n, max, |i| fb_info(gpu, books, i))
        }
        (cmd::MC_GET_ARCH_INFO, Target::Subdevice(g)) => {
            let gpu = &drv.config.gpus[g];
            c.put(
                0,
                &NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS {
                    architecture: gpu.arch,
                    implementation: gpu.arch_impl,
                    revision: u32::from(gpu.pci_revision_id),
                    subRevision: 0,
                    _pad0: [0; 3],
                },
            );
            NV_OK
        }
        (cmd::BUS_GET_PCI_INFO, Target::Subdevice(g)) => {
            let gpu = &drv.config.gpus[g];
            c.put(
                0,
                &NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS {
                    pciDeviceId: (u32::from(gpu.pci_device_id) << 16)
                        | u32::from(gpu.pci_vendor_id),
                    pciSubSystemId: (u32::from(gpu.pci_subsystem_id) << 16)
                        | u32::from(gpu.pci_subsystem_vendor_id),
                    pciRevisionId: u32::from(gpu.pci_revision_id),
                    pciExtDeviceId: u32::from(gpu.pci_device_id),
                },
            );
            NV_OK
        }
        // The controls of libcuda's and nvidia-smi's initialisation (control_init.rs); the
        // rest is not exported by the target's class, or not simulated.
        // nvidia-smi's -q and topo -m (control_smi.rs).
        _ => match crate::control_smi::control(st, &mut c, p.cmd, target) {
            Some(status) => status,
            None => crate::control_init::control(st, c, p.hClient, p.cmd, target)
                .unwrap_or(NV_ERR_NOT_SUPPORTED),
        },
    }
}

/// Fills an `{index, data}` list of `n` entries at `off` in the buffer at `loc` (the params
/// themselves, or an embedded list buffer): `n == 0`, `n > max` and any index `>= max` are
/// `NV_ERR_INVALID_ARGUMENT`, as in the driver's `getGpuInfos`, `subdeviceCtrlCmdFbGetInfoV2`
/// and `_kgraphicsCtrlCmdGrGetInfoV2`.
fn info_list(
    call: &mut HostCall,
    loc: Loc,
    off: usize,
    n: u32,
    max: u32,
    value: impl Fn(u32) -> u32,
) -> u32 {
    if n == 0 || n > max {
        return NV_ERR_INVALID_ARGUMENT;
    }
    let end = off + 8 * n as usize;
    let buf = bytes_mut(call, loc);
    if buf.len() < end {
        return NV_ERR_INVALID_ADDRESS;
    }
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        let index: u32 = crate::buf::read(buf, off + 8 * i).expect("length checked");
        if index >= max {
            return NV_ERR_INVALID_ARGUMENT;
        }
        out.push(value(index));
    }
    for (i, d) in out.into_iter().enumerate() {
        crate::buf::write(buf, off + 8 * i + 4, &d);
    }
    NV_OK
}

/// `NV2080_CTRL_FB_INFO_MAX_LIST_SIZE` of this driver version (from `FB_GET_INFO_V2`'s size).
fn fb_info_max(drv: &SimDriver) -> u32 {
    expected_size(drv, cmd::FB_GET_INFO_V2).map_or(0x36, |s| (s - 4) / 8)
}

/// Writes the UUID into `out` (binary: 16 bytes; else the 41-byte string with its NUL);
/// returns the length.
fn put_uuid(gpu: &SimGpu, out: &mut [u8], binary: bool) -> u32 {
    out.fill(0);
    if binary {
        out[..16].copy_from_slice(&gpu.uuid);
        16
    } else {
        let s = gpu.uuid_string();
        out[..s.len()].copy_from_slice(s.as_bytes());
        #[expect(clippy::cast_possible_truncation, reason = "a UUID string is 40 bytes")]
        let len = s.len() as u32;
        len + 1
    }
}

/// `NV0000_CTRL_CMD_GPU_GET_ID_INFO(_V2)` (`gpumgrGetGpuIdInfoV2`): attached GPUs only.
fn id_info(st: &State, mut c: Ctx<'_>, which: u32) -> u32 {
    let drv = c.drv;
    let gpu_id: u32 = c.get(0).expect("size checked");
    let Some(g) = drv.gpu_by_id(gpu_id).filter(|&g| drv.gpu_attached(st, g)) else {
        return NV_ERR_INVALID_ARGUMENT;
    };
    let in_use = st.clients.values().any(|cl| {
        cl.objects()
            .values()
            .any(|o| matches!(o.kind, Kind::Device { gpu, .. } if gpu == g))
    });
    #[expect(
        clippy::cast_possible_truncation,
        reason = "g indexes config.gpus, at most 32 (SimDriver::try_new)"
    )]
    let instance = g as u32;
    let v2 = NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS {
        gpuId: gpu_id,
        gpuFlags: u32::from(in_use), // IN_USE; no SLI, not mobile, not boot primary, no SOC, no ATS
        deviceInstance: instance,
        subDeviceInstance: 0,
        sliStatus: 0,
        boardId: gpu_id,
        gpuInstance: instance,
        numaId: u32::MAX, // NV0000_CTRL_NO_NUMA_NODE
    };
    if which == cmd::GPU_GET_ID_INFO_V2 {
        c.put(0, &v2);
    } else {
        // The V1 layout has the (unused) szName pointer at 16 and the rest after it.
        c.put(4, &v2.gpuFlags);
        c.put(8, &v2.deviceInstance);
        c.put(12, &v2.subDeviceInstance);
        c.put(24, &v2.sliStatus);
        c.put(28, &v2.boardId);
        c.put(32, &v2.gpuInstance);
        c.put(36, &v2.numaId);
    }
    NV_OK
}

fn build_strings(drv: &SimDriver) -> [String; 3] {
    let major = drv.config.version.major();
    [
        drv.version_string.clone(),
        format!("rel/gpu_drv/r{major}/nvsim"),
        format!("Simulated r{major} nvsim"),
    ]
}

/// `NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION`: the deprecated V1 control with three string
/// pointers (`rmapi_deprecated_control.c`). Any NULL pointer: report the needed size.
fn build_version(mut c: Ctx<'_>) -> u32 {
    let strings = build_strings(c.drv);
    let max = strings.iter().map(|s| s.len() + 1).max().unwrap_or(1);
    let max = u32::try_from(max).unwrap_or(u32::MAX);
    let bufs: Vec<Option<Loc>> = [8, 16, 24]
        .iter()
        .map(|&o| child(c.call, c.pl, o))
        .collect();
    if bufs.iter().any(Option::is_none) {
        c.put(0, &max);
        return NV_OK;
    }
    let size_of_strings: u32 = c.get(0).expect("size checked");
    if size_of_strings < max {
        return NV_ERR_INVALID_PARAM_STRUCT;
    }
    for (s, l) in strings.iter().zip(bufs.into_iter().flatten()) {
        let out = bytes_mut(c.call, l);
        if out.len() < s.len() + 1 {
            return NV_ERR_INVALID_PARAM_STRUCT;
        }
        put_cstr(&mut out[..s.len() + 1], s);
    }
    c.put(32, &0u32); // changelistNumber
    c.put(36, &0u32); // officialChangelistNumber
    NV_OK
}

/// `NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2`: 256-byte strings, plus `driverBranch` since
/// 560.
fn build_version_v2(mut c: Ctx<'_>) -> u32 {
    let [ver, branch_ver, title] = build_strings(c.drv);
    let major = c.drv.config.version.major();
    let size = c.size;
    let out = c.bytes_mut();
    put_cstr(&mut out[0..256], &ver);
    put_cstr(&mut out[256..512], &branch_ver);
    if size == 1032 {
        put_cstr(&mut out[512..768], &format!("r{major}_00"));
        put_cstr(&mut out[768..1024], &title);
    } else {
        put_cstr(&mut out[512..768], &title);
    }
    out[size - 8..].fill(0); // changelist numbers
    NV_OK
}

/// The classes an H100 exposes (approximately what `gpuGetClassList` reports for GH100).
fn class_list() -> &'static [u32] {
    &[
        rm::NV01_ROOT,
        rm::NV01_ROOT_NON_PRIV,
        0x0002, // NV01_CONTEXT_DMA
        rm::NV01_MEMORY_SYSTEM,
        rm::NV01_MEMORY_LOCAL_USER,
        rm::NV01_ROOT_CLIENT,
        0x0071, // NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
        rm::NV01_EVENT_OS_EVENT,
        rm::NV01_DEVICE_0,
        0x00de, // RM_USER_SHARED_DATA
        rm::NV20_SUBDEVICE_0,
        0x208f, // NV20_SUBDEVICE_DIAG
        0x503b, // NV50_P2P
        0x503c, // NV50_THIRD_PARTY_P2P
        0x50a0, // NV50_MEMORY_VIRTUAL
        0x83de, // GT200_DEBUGGER
        0x900e, // MPS_COMPUTE
        0x9067, // FERMI_CONTEXT_SHARE_A
        0x90e6, // GF100_SUBDEVICE_MASTER
        rm::FERMI_VASPACE_A,
        0xa06c, // KEPLER_CHANNEL_GROUP_A
        0xb8b0, // NVB8B0_VIDEO_DECODER
        0xb8d1, // NVB8D1_VIDEO_NVJPG
        0xb8fa, // NVB8FA_VIDEO_OFA
        0xc661, // HOPPER_USERMODE_A
        0xc86f, // HOPPER_CHANNEL_GPFIFO_A
        0xc8b5, // HOPPER_DMA_COPY_A
        0xcb33, // NV_CONFIDENTIAL_COMPUTE
        0xcb97, // HOPPER_A
        0xcba2, // HOPPER_SEC2_WORK_LAUNCH_A
        0xcbc0, // HOPPER_COMPUTE_A
    ]
}

/// `NV0080_CTRL_CMD_GPU_GET_CLASSLIST` (`gpuGetClassList`): NULL list → the count; a list too
/// short → `NV_ERR_INVALID_PARAM_STRUCT`.
fn classlist(mut c: Ctx<'_>) -> u32 {
    let list = class_list();
    #[expect(
        clippy::cast_possible_truncation,
        reason = "class_list() is a fixed list of a few dozen classes"
    )]
    let count = list.len() as u32;
    let Some(l) = child(c.call, c.pl, 8) else {
        c.put(0, &count);
        return NV_OK;
    };
    let n: u32 = c.get(0).expect("size checked");
    if n < count {
        return NV_ERR_INVALID_PARAM_STRUCT;
    }
    let out = bytes_mut(c.call, l);
    if out.len() < list.len() * 4 {
        return NV_ERR_INVALID_ADDRESS;
    }
    for (i, k) in list.iter().enumerate() {
        crate::buf::write(out, 4 * i, k);
    }
    c.put(0, &count);
    NV_OK
}

/// `NV2080_CTRL_GPU_INFO_INDEX_*` values. Indices the kernel RM answers itself get the value
/// it would give for this GPU; the rest (filled by GSP firmware on a real GPU) read 0.
fn gpu_info(gpu: &SimGpu, index: u32) -> u32 {
    match index {
        0x1f => 1,                                                          // SYSMEM_ACCESS: yes
        0x2c => (gpu.compute_capability.0 << 8) | gpu.compute_capability.1, // GPU_SM_VERSION
        0x2f => 1,        // PER_RUNLIST_CHANNEL_RAM
        0x36 | 0x37 => 1, // GPU_PROFILING / GPU_DEBUGGING_CAPABILITY: enabled on bare metal
        0x3d => 1,        // DMABUF_CAPABILITY
        _ => 0,
    }
}

/// `NV2080_CTRL_GR_INFO_INDEX_*` values (the `NV0080_CTRL_GR_INFO_INDEX_*` numbering).
///
/// GSP firmware fills these on a real GPU; the open headers name the indices but say little
/// about them. What each one counts follows a real GA106's answers (an RTX 3060, 28 SMs in
/// 14 TPCs over 3 GPCs, driver 580.159.04, published in `reindertpelsma/kayfabe`,
/// `docs` capture "GR_GET_INFO (0x20801201)", 58 entries): `SHADER_PIPE_COUNT` is the enabled
/// GPCs (3), `SHADER_PIPE_SUB_COUNT` the enabled TPCs (14), `THREAD_STACK_SCALING_FACTOR` the
/// SMs (28), the `LITTER_*` values are per-design maxima (`LITTER_NUM_TPC_PER_GPC` 6 on a part
/// with at most 5 enabled), `MAX_SP_PER_SM` is 0, and the subcontext counts are 64 / 2 (legacy)
/// / 64 (per engine). libcuda derives its multiprocessor count from these.
fn gr_info(gpu: &SimGpu, index: u32) -> u32 {
    let tpc = gpu.tpc_count();
    match index {
        0x07 => gpu.gpc_count, // SHADER_PIPE_COUNT
        0x08 => gpu.sm_count,  // THREAD_STACK_SCALING_FACTOR
        0x09 => tpc,           // SHADER_PIPE_SUB_COUNT
        0x0c => (gpu.compute_capability.0 << 8) | gpu.compute_capability.1, // SM_VERSION
        0x0d => 64,            // MAX_WARPS_PER_SM
        0x0e => 32,            // MAX_THREADS_PER_WARP
        0x14 => gpu.gpc_count, // LITTER_NUM_GPCS
        0x17 => tpc.div_ceil(gpu.gpc_count.max(1)), // LITTER_NUM_TPC_PER_GPC
        0x1d => gpu.sm_count * 128, // GPU_CORE_COUNT
        0x20 => gpu.sm_per_tpc, // LITTER_NUM_SM_PER_TPC
        0x23 => gpu.sm_count * 4, // TENSOR_CORE_COUNT
        0x24 => 1,             // LITTER_NUM_GRS
        0x2c | 0x2e => 64,     // MAX_SUBCONTEXT_COUNT, MAX_PER_ENGINE_SUBCONTEXT_COUNT
        0x2d => 2,             // MAX_LEGACY_SUBCONTEXT_COUNT
        _ => 0,
    }
}

/// What the books say of one GPU's video memory, for the FB info controls.
#[derive(Clone, Copy)]
struct FbView {
    /// `pmaGetFreeMemory`.
    free: u64,
    /// `pmaGetLargestFree`'s largest free run.
    largest_free: u64,
}

impl FbView {
    fn of(drv: &SimDriver, st: &State, g: usize) -> Self {
        let total = drv.config.gpus[g].memory_bytes;
        let fb = &st.gpus[g].fb;
        FbView {
            free: fb.free(total),
            largest_free: fb.largest_free(total),
        }
    }
}

/// `NV2080_CTRL_FB_INFO_INDEX_*` values (`kmemsysGetFbInfos`, `kern_mem_sys_ctrl.c`, with PMA
/// and without MIG); sizes are in KiB where the header says so. The heap is the whole memory
/// (no RM reservation: `FB_TAX_SIZE_KB`, `HEAP_BASE_KB`, `HEAP_START` 0); free and largest free
/// come from the books.
fn fb_info(gpu: &SimGpu, books: FbView, index: u32) -> u32 {
    let kib = |b: u64| u32::try_from(b >> 10).unwrap_or(u32::MAX);
    match index {
        0x05 | 0x1d | 0x1f => kib(gpu.bar1_bytes), // BAR1_SIZE, BAR1_AVAIL_SIZE, BAR1_MAX_CONTIGUOUS
        0x07 | 0x08 | 0x09 | 0x0a | 0x20 => kib(gpu.memory_bytes), // RAM, TOTAL_RAM, HEAP, MAPPABLE_HEAP, USABLE_RAM
        0x0b => gpu.memory_bus_width,                              // BUS_WIDTH
        0x0d => 0x14,                                              // RAM_TYPE: HBM3
        0x12 => kib(books.largest_free),                           // LARGEST_FREE_REGION_SIZE_KB
        // LARGEST_FREE_REGION_BASE_KB: pmaGetLargestFree's offset is always ~0 ("not being
        // used by any RM client"), shifted to KiB and truncated.
        0x13 => u32::MAX,
        0x16 => kib(books.free),    // HEAP_FREE
        0x1b => gpu.l2_cache_bytes, // L2CACHE_SIZE (bytes)
        _ => 0,
    }
}
