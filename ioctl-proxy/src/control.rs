//! `NV_ESC_RM_CONTROL`: the third dispatch level.
//!
//! The checks follow the driver's order in `_rmapiRmControl`
//! (`src/nvidia/src/kernel/rmapi/control.c`): the NULL command is `NV_OK` at once; an unknown
//! client is `NV_ERR_INVALID_CLIENT`; then the params pointer and size must agree and, for a
//! control the driver knows, `paramsSize` must equal the control's params size
//! (`NV_ERR_INVALID_ARGUMENT`); then an unknown `hObject` is `NV_ERR_OBJECT_NOT_FOUND`
//! (`serverControl` → `clientGetResourceRef`, `rs_server.c`); then an unknown control is
//! `NV_ERR_NOT_SUPPORTED` (`resControlLookup`). All with ioctl success. Opaque pass-through
//! controls (legacy GSS, NV2081) are bounded by `RMAPI_PARAM_COPY_MAX_PARAMS_SIZE`, as
//! `rmapiParamsAcquire` bounds them. The policy names them by family (`RM_GSS_LEGACY`,
//! `NV2081_BINAPI`) or by command (`RM_GSS_LEGACY 0x20808159`, the audit trail's name), see
//! `policy.rs`.
//!
//! A privileged legacy GSS control (`cmd & 0xC000 == 0xC000`, `RM_GSS_LEGACY_MASK_PRIVILEGED`)
//! is never forwarded: after the client and params/size checks (and the object check, so an
//! unknown `hObject` keeps its `NV_ERR_OBJECT_NOT_FOUND`) it is answered
//! `NV_ERR_INSUFFICIENT_PERMISSIONS` and audited as denied, in both modes. `RmGssLegacyRpcCmd`
//! (`src/nvidia/interface/deprecated/rmapi_gss_legacy_control.c`) gives that answer to every
//! caller below `RS_PRIV_LEVEL_USER_ROOT`, and the daemon's request threads run without
//! `CAP_SYS_ADMIN` (`os_is_administrator`), so this is defence in depth. One difference: the
//! driver refuses before its own params/size check, so a malformed privileged legacy control
//! gets `NV_ERR_INSUFFICIENT_PERMISSIONS` there and `NV_ERR_INVALID_ARGUMENT` here.

use nvproxy_abi::fd_field;
use nvproxy_abi::ioctl::NV_ESC_RM_CONTROL_CMD;
use std::mem::offset_of;

use nvproxy_abi::structs::{
    NV0000_CTRL_GPU_ASYNC_ATTACH_ID_PARAMS, NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS,
    NV0000_CTRL_GPU_GET_ID_INFO_PARAMS, NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS,
    NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS, NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS,
    NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580, NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS,
    NV0000_CTRL_GPU_INVALID_ID, NV0000_CTRL_GPU_MAX_GPUS, NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS,
    NV0000_CTRL_GPU_WAIT_ATTACH_ID_PARAMS, NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS,
    NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS,
    NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS,
    NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS,
    NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS, NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS,
    NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS, NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS,
    NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550, NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS,
    NV00FD_CTRL_ATTACH_GPU_PARAMS, NV503C_CTRL_REGISTER_VA_SPACE_PARAMS,
    NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS, NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS,
    NVOS54_PARAMETERS,
};
use nvproxy_abi::{
    Caps, RM_GSS_LEGACY_MASK_PRIVILEGED, RMAPI_PARAM_COPY_MAX_PARAMS_SIZE, Translation,
};
use tracing::debug;
use zerocopy::IntoBytes;

use crate::audit::Kind;
use crate::embedded::{Count, embedded};
use crate::error::ProxyError;
use crate::kit::{Stop, answer_ok, deny, fail};
use crate::nv::*;
use crate::objects::{MAX_HOLDS_PER_OPEN, Origin, OwnerId};
use crate::plan::{Plan, rd32, rd64};
use crate::policy::pass_through_family;
use crate::request::{Dir, Req, UNKNOWN_CLIENT, UNKNOWN_OBJECT};
use crate::vid_books::VidOp;
use crate::vidmem::{FB_GET_INFO, FB_GET_INFO_V2};

/// `NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION`.
const BUILD_VERSION: u32 = 0x101;
/// The driver's own string buffers are 256 bytes (`..._GET_BUILD_VERSION_V2`); it never writes
/// more into the client's.
const BUILD_VERSION_MAX_STRING: u32 = 256;
/// `NV0000_CTRL_CMD_GPU_GET_ID_INFO`.
const GET_ID_INFO: u32 = 0x202;
/// `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2`.
const GET_ID_INFO_V2: u32 = 0x205;
/// `NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS`.
const GET_ATTACHED_IDS: u32 = 0x201;
/// `NV0000_CTRL_CMD_GPU_GET_PROBED_IDS`.
const GET_PROBED_IDS: u32 = 0x214;
/// `NV0000_CTRL_CMD_GPU_ATTACH_IDS`.
const ATTACH_IDS: u32 = 0x215;
/// `NV0000_CTRL_CMD_GPU_DETACH_IDS`.
const DETACH_IDS: u32 = 0x216;
/// `NV0000_CTRL_CMD_GPU_GET_ACTIVE_DEVICE_IDS`.
const GET_ACTIVE_DEVICE_IDS: u32 = 0x288;
/// NV0000 controls whose first field is an input `gpuId` and whose answer for an unknown one is
/// `NV_ERR_INVALID_ARGUMENT`: `QUERY_DRAIN_STATE`, `ASYNC_ATTACH_ID`, `WAIT_ATTACH_ID`,
/// `GPUACCT_GET_ACCOUNTING_STATE`.
const GPU_ID_FIRST: [u32; 4] = [0x279, 0x289, 0x290, 0xb02];
/// `NV0000_CTRL_CMD_GPU_GET_DEVICE_IDS`: a mask of device instances.
const GET_DEVICE_IDS: u32 = 0x204;
/// `NV0000_CTRL_CMD_SYNC_GPU_BOOST_GROUP_INFO`: groups of gpuIds.
const SYNC_GPU_BOOST_GROUP_INFO: u32 = 0xa04;
/// `NV2080_CTRL_CMD_NVLINK_GET_NVLINK_STATUS`: per link, the remote device's PCI id and UUID.
const NVLINK_GET_NVLINK_STATUS: u32 = 0x2080_3002;
/// `NV2080_CTRL_CMD_GPU_GET_PIDS`: pids of the processes with clients on the GPU.
const GPU_GET_PIDS: u32 = 0x2080_018d;
/// Of the gpuId-first controls, those whose driver answer for an unknown gpuId is
/// `NV_ERR_OBJECT_NOT_FOUND`: `GPU_GET_PCI_INFO`, `GPU_GET_UUID_FROM_GPU_ID`.
const GPU_ID_NOT_FOUND: [u32; 2] = [0x21b, 0x275];
/// `NV0000_CTRL_CMD_SYSTEM_GET_P2P_CAPS` and `..._V2`: `gpuIds[gpuCount]` input.
const P2P_CAPS: [u32; 2] = [0x127, 0x12b];
/// `NV0000_CTRL_CMD_SYSTEM_GET_P2P_CAPS_MATRIX`.
const P2P_CAPS_MATRIX: u32 = 0x13a;
/// `NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS`.
const DISABLE_CHANNELS: u32 = 0x2080_110b;
/// `NV2080_CTRL_CMD_GPU_EXEC_REG_OPS`.
const EXEC_REG_OPS: u32 = 0x2080_0122;
/// `NV503C_CTRL_CMD_REGISTER_VA_SPACE`.
const REGISTER_VA_SPACE: u32 = 0x503c_0102;
/// `NV00FD_CTRL_CMD_ATTACH_GPU`.
const ATTACH_GPU: u32 = 0x00fd_0104;
/// `NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD` ... `IMPORT_OBJECTS_FROM_FD`.
const UNIX_EXPORT_OBJECT: u32 = 0x3d05;
const UNIX_IMPORT_OBJECT: u32 = 0x3d06;
const UNIX_GET_EXPORT_INFO: u32 = 0x3d08;
const UNIX_EXPORT_OBJECTS: u32 = 0x3d0b;
const UNIX_IMPORT_OBJECTS: u32 = 0x3d0c;
/// `NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM`.
const EXPORT_OBJECT_TYPE_RM: u32 = 1;
/// Class recorded for objects created by an import (the driver knows the real one).
const IMPORTED_CLASS: u32 = 0xffff_ffff;
/// `NV_ERR_INVALID_PARAMETER`: the OS_UNIX controls' answer for an fd that is no nvidiactl file
/// (`nv_get_file_private` failure, `src/nvidia/arch/nvalloc/unix/src/os.c`).
const NV_ERR_INVALID_PARAMETER: u32 = 0x3b;
/// `NV_ERR_INSUFFICIENT_PERMISSIONS`: `RmGssLegacyRpcCmd`'s answer to a privileged legacy GSS
/// control from a caller below `RS_PRIV_LEVEL_USER_ROOT` (`rmapi_gss_legacy_control.c`).
const NV_ERR_INSUFFICIENT_PERMISSIONS: u32 = 0x1b;
/// `NV_ERR_INVALID_DEVICE`: escape.c's answer when `NV00FD_CTRL_CMD_ATTACH_GPU`'s
/// `devDescriptor` is no NVIDIA device file.
const NV_ERR_INVALID_DEVICE: u32 = 0x26;

/// Controls whose pointers or fds this module translates beyond the generic embedded-pointer
/// table.
const HANDLED_SPECIALLY: [u32; 10] = [
    BUILD_VERSION,
    GET_ID_INFO,
    DISABLE_CHANNELS,
    REGISTER_VA_SPACE,
    ATTACH_GPU,
    UNIX_EXPORT_OBJECT,
    UNIX_IMPORT_OBJECT,
    UNIX_GET_EXPORT_INFO,
    UNIX_EXPORT_OBJECTS,
    UNIX_IMPORT_OBJECTS,
];

/// Whether the proxy knows how to translate control `cmd` of translation kind `t`. A table
/// entry marked pointer, fd or special that nobody handles must never be forwarded as opaque
/// bytes: the driver would dereference a client address in the daemon.
pub(crate) fn control_handled(cmd: u32, t: Translation) -> bool {
    t == Translation::Simple
        || HANDLED_SPECIALLY.contains(&cmd)
        || !embedded(cmd, 0).is_empty()
        || !embedded(cmd, u32::MAX).is_empty()
}

/// `NVOS54_PARAMETERS.status`.
const STATUS: usize = offset_of!(NVOS54_PARAMETERS, status);
/// `NVOS54_PARAMETERS.params`.
const PARAMS: usize = offset_of!(NVOS54_PARAMETERS, params);

// The gpuId-first controls read their gpuId at 0, the P2P caps their ids and count as V1 does,
// and the id-info learning reads V2's fields from V1 too.
const _: () = {
    assert!(offset_of!(NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS, gpuId) == 0);
    assert!(offset_of!(NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS, gpuId) == 0);
    assert!(offset_of!(NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS, gpuId) == 0);
    assert!(offset_of!(NV0000_CTRL_GPU_ASYNC_ATTACH_ID_PARAMS, gpuId) == 0);
    assert!(offset_of!(NV0000_CTRL_GPU_WAIT_ATTACH_ID_PARAMS, gpuId) == 0);
    assert!(
        offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS, gpuCount)
            == offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS, gpuCount)
    );
    assert!(
        offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550, gpuCount)
            == offset_of!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS, gpuCount)
    );
    assert!(
        offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_PARAMS, deviceInstance)
            == offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, deviceInstance)
    );
    assert!(
        offset_of!(NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS, excludedGpuIds)
            == offset_of!(NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580, excludedGpuIds)
    );
};

/// The audit reason of a legacy GSS command whose category no header of the version defines:
/// it is forwarded as opaque bytes (gVisor's rule), named by number.
pub const OPAQUE_LEGACY: &str = "legacy GSS category the headers do not define: forwarded opaque";

impl Req<'_> {
    /// `NV_ESC_RM_CONTROL`.
    pub(crate) fn rm_control(&mut self, addr: u64) -> Result<i32, ProxyError> {
        self.note.kind = Kind::Control;
        self.with_params(addr, STATUS, |r, top: NVOS54_PARAMETERS| {
            r.control(addr, top)
        })
    }

    fn control(&mut self, addr: u64, top: NVOS54_PARAMETERS) -> Result<i32, Stop> {
        let (h_client, h_object, cmd) = (top.hClient, top.hObject, top.cmd);
        let (params, size) = (top.params, top.paramsSize);
        let spec = self.px.controls.get(&cmd).copied();
        let pass = pass_through_family(cmd);
        self.note.number = cmd;
        // A pass-through command's name is what the audit trail records and what a policy
        // names it by: a legacy GSS command by its category and message as this version's
        // headers define them (`NV0080_CTRL_CMD_PERF_CUDA_LIMIT_SET_CONTROL (legacy)`,
        // `NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x59`, `nvproxy_abi::legacy`); a command of
        // a category the headers do not define, and an `NV2081_BINAPI` one, by family and
        // number (`RM_GSS_LEGACY 0x20808b01`, `policy::pass_through_name`).
        self.note.name = match (spec, pass) {
            (Some(s), _) => s.name.into(),
            (None, Some(p)) => match self.px.abi.legacy_control(cmd) {
                Some(l) => l.to_string().into(),
                None => {
                    if p == crate::policy::RM_GSS_LEGACY {
                        self.note.reason = Some(OPAQUE_LEGACY);
                    }
                    format!("{p} {cmd:#010x}").into()
                }
            },
            (None, None) => "".into(), // unknown: named from kind and number at the end
        };
        if cmd == 0 || cmd & 0xffff == 0 {
            return answer_ok("NULL control");
        }
        // The client and the object, under one lock of the table; each answered where the
        // driver checks it.
        let (has_client, has_object) = self.px.objects().client_and_object(h_client, h_object);
        let need_object = || match has_object {
            true => Ok(()),
            false => deny(NV_ERR_OBJECT_NOT_FOUND, UNKNOWN_OBJECT),
        };
        if !has_client {
            return deny(NV_ERR_INVALID_CLIENT, UNKNOWN_CLIENT);
        }
        if (size != 0) != (params != 0) {
            return fail(NV_ERR_INVALID_ARGUMENT, "params and paramsSize disagree");
        }
        if let Some((name, class)) = crate::schedule::nice_control(cmd) {
            // The driver looks the object up, then the control in its class's method table
            // (`NV_ERR_NOT_SUPPORTED` where it has none), then checks RS_ACCESS_NICE, which a
            // caller without CAP_SYS_NICE or CAP_SYS_ADMIN lacks whatever the value. The
            // instance's level is the daemon's to set (`schedule.rs`): never forwarded.
            self.note.name = name.into();
            need_object()?;
            let of = self.px.objects().class_of(h_client, h_object).ok();
            let of_class = match (class, of) {
                (Some(want), Some(got)) => want == got,
                (None, Some(got)) => self
                    .px
                    .abi
                    .classes
                    .get(&got)
                    .is_some_and(|c| c.name.contains("CHANNEL_GPFIFO")),
                (_, None) => false,
            };
            if !of_class {
                return deny(NV_ERR_NOT_SUPPORTED, "not a control of the object's class");
            }
            return deny(
                NV_ERR_INSUFFICIENT_PERMISSIONS,
                "needs RS_ACCESS_NICE (CAP_SYS_NICE): the instance's priority is the daemon's",
            );
        }
        if cmd & RM_GSS_LEGACY_MASK_PRIVILEGED == RM_GSS_LEGACY_MASK_PRIVILEGED {
            // `RmGssLegacyRpcCmd` refuses these to a caller below RS_PRIV_LEVEL_USER_ROOT before
            // it copies the params; the daemon's request threads run without CAP_SYS_ADMIN, so
            // the driver would answer the same. Refused here in both modes, never forwarded. An
            // unknown object keeps the driver's normal-path answer.
            need_object()?;
            return deny(
                NV_ERR_INSUFFICIENT_PERMISSIONS,
                "privileged legacy GSS control (caller is not root-level)",
            );
        }
        // A control the policy denies (or that we cannot translate) looks exactly like one the
        // driver lacks: no size check, then the object lookup, then NOT_SUPPORTED.
        let usable: Result<Option<u32>, &'static str> = match (spec, pass) {
            (Some(s), _) if !control_handled(cmd, s.translation) => {
                Err("no translation for this control")
            }
            (Some(s), _) => match self.check_policy(s.name, s.caps) {
                true => Ok(Some(s.param_size)),
                false => Err("policy"),
            },
            (None, Some(_)) => {
                // Judged by the command's name, which the policy also matches by its family's
                // name; the name built for the note is lent to the check (no allocation).
                let name = std::mem::take(&mut self.note.name);
                let permitted = self.check_policy(&name, Caps::COMPUTE_UTILITY);
                self.note.name = name;
                match permitted {
                    true => Ok(None),
                    false => Err("policy"),
                }
            }
            (None, None) => Err("unknown control"),
        };
        match usable {
            Ok(Some(want)) if size != want => {
                return fail(NV_ERR_INVALID_ARGUMENT, "paramsSize is not the control's");
            }
            Ok(None) if size > RMAPI_PARAM_COPY_MAX_PARAMS_SIZE => {
                return fail(NV_ERR_INVALID_ARGUMENT, "paramsSize above 1 MiB");
            }
            _ => {}
        }
        need_object()?;
        if let Err(reason) = usable {
            return deny(NV_ERR_NOT_SUPPORTED, reason);
        }
        let mut plan = Plan::new(NV_ESC_RM_CONTROL_CMD, top.as_bytes());
        let pbuf = self.nested(&mut plan, None, PARAMS, params, size as usize, Dir::InOut)?;
        let mutates = match pbuf {
            Some(p) => self.control_prepare(cmd, size, h_client, &mut plan, p)?,
            None => false,
        };
        let guard = mutates.then(|| self.px.rm_lock());
        let ret = self.exec(&mut plan)?;
        if let Some(p) = pbuf
            && plan.get::<NVOS54_PARAMETERS>(None).status == NV_OK
        {
            self.control_post(cmd, size, h_client, h_object, &mut plan, p);
        }
        drop(guard);
        Ok(self.finish(addr, &mut plan, Some(STATUS), ret)?)
    }

    /// Control-specific checks and translation before the host call. Returns whether the
    /// control creates RM objects (and so runs under the RM mutation lock).
    fn control_prepare(
        &mut self,
        cmd: u32,
        size: u32,
        h_client: u32,
        plan: &mut Plan,
        p: usize,
    ) -> Result<bool, Stop> {
        let pb = Some(p);
        for e in embedded(cmd, size) {
            let buf = plan.buf(pb);
            let count = match e.count {
                Count::Field(o) => u64::from(rd32(buf, o)),
                Count::Square(_) if rd64(buf, e.ptr) == 0 => 0,
                Count::Square(o) => u64::from(rd32(buf, o)).pow(2),
            };
            self.nested_array(
                plan,
                pb,
                e.ptr,
                count,
                e.elem,
                Dir::new(e.copy_in, e.copy_out),
            )?;
        }
        let gpu_check = |r: &Self, id: u32, status: u32| -> Result<(), Stop> {
            if r.px.gpu_in_set(id) {
                Ok(())
            } else {
                deny(status, "GPU outside the instance's set")
            }
        };
        match cmd {
            crate::schedule::NVA06C_CTRL_CMD_SET_TIMESLICE => {
                // Any client may set any timeslice: the tenant's above the bound reaches the
                // driver as the bound (`schedule.rs`); its own memory keeps what it wrote.
                let max = crate::schedule::MAX_TIMESLICE_US;
                if rd64(plan.buf(pb), 0) > max {
                    plan.rewrite64(pb, 0, max);
                    self.note.reason = Some("timeslice above 2048 us: set to 2048 us");
                }
            }
            BUILD_VERSION => self.build_version(plan, p)?,
            // gpumgrGetGpuIdInfoV2 (gpu_mgr.c): a gpuId with no GPU is NV_ERR_INVALID_ARGUMENT.
            GET_ID_INFO => {
                type P = NV0000_CTRL_GPU_GET_ID_INFO_PARAMS;
                gpu_check(self, plan.get::<P>(pb).gpuId, NV_ERR_INVALID_ARGUMENT)?;
                // szName is unused by the driver (gVisor forces it NULL too).
                plan.null_ptr(pb, offset_of!(P, szName));
            }
            GET_ID_INFO_V2 => {
                let id = plan.get::<NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS>(pb).gpuId;
                gpu_check(self, id, NV_ERR_INVALID_ARGUMENT)?;
            }
            // GET_PCI_INFO (gpumgrGetProbedGpuDomainBusDevice) and GET_UUID_FROM_GPU_ID
            // (cliresCtrlCmdGpuGetUuidFromGpuId) answer an unknown gpuId with
            // NV_ERR_OBJECT_NOT_FOUND ("nvml wants to be able to tell this case apart").
            c if GPU_ID_NOT_FOUND.contains(&c) => {
                gpu_check(self, rd32(plan.buf(pb), 0), NV_ERR_OBJECT_NOT_FOUND)?;
            }
            c if GPU_ID_FIRST.contains(&c) => {
                gpu_check(self, rd32(plan.buf(pb), 0), NV_ERR_INVALID_ARGUMENT)?;
            }
            ATTACH_IDS | DETACH_IDS => self.gpu_id_list(plan, p)?,
            c if P2P_CAPS.contains(&c) => {
                // gpuIds[32] then gpuCount in every layout (V1, V2, _V550; asserted below).
                let q = plan.get::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS>(pb);
                let n = q.gpuCount as usize;
                if n > NV0000_CTRL_GPU_MAX_GPUS {
                    return fail(NV_ERR_INVALID_ARGUMENT, "gpuCount above 32");
                }
                for &id in &q.gpuIds[..n] {
                    gpu_check(self, id, NV_ERR_INVALID_ARGUMENT)?;
                }
            }
            P2P_CAPS_MATRIX => {
                let q = plan.get::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_MATRIX_PARAMS>(pb);
                let (a, b) = (q.grpACount as usize, q.grpBCount as usize);
                if a > q.gpuIdGrpA.len() || b > q.gpuIdGrpB.len() {
                    return fail(NV_ERR_INVALID_ARGUMENT, "group count above 8");
                }
                for &id in q.gpuIdGrpA[..a].iter().chain(&q.gpuIdGrpB[..b]) {
                    gpu_check(self, id, NV_ERR_INVALID_ARGUMENT)?;
                }
            }
            NVLINK_GET_NVLINK_STATUS if crate::gpus::nvlink_status_layout(size).is_none() => {
                // Its remote-device fields could not be filtered: refused as absent.
                return deny(NV_ERR_NOT_SUPPORTED, "NVLink status layout unknown");
            }
            DISABLE_CHANNELS => {
                let q = plan.get::<NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS>(pb);
                if q.pRunlistPreemptEvent != 0 {
                    return fail(NV_ERR_INVALID_ARGUMENT, "pRunlistPreemptEvent must be NULL");
                }
                let n = (q.numChannels as usize).min(q.hClientList.len());
                for &c in &q.hClientList[..n] {
                    self.need_client(c)?;
                }
            }
            EXEC_REG_OPS => {
                let target = plan
                    .get::<NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS>(pb)
                    .hClientTarget;
                if target != 0 {
                    self.need_client(target)?;
                }
            }
            REGISTER_VA_SPACE => {
                let va = plan
                    .get::<NV503C_CTRL_REGISTER_VA_SPACE_PARAMS>(pb)
                    .hVASpace;
                self.need_object(h_client, va, NV_ERR_OBJECT_NOT_FOUND)?;
            }
            ATTACH_GPU => {
                type P = NV00FD_CTRL_ATTACH_GPU_PARAMS;
                let q = plan.get::<P>(pb);
                self.need_object(h_client, q.hSubdevice, NV_ERR_OBJECT_NOT_FOUND)?;
                let host = self.translate_fd_status(
                    fd_field::from_u64(q.devDescriptor),
                    NV_ERR_INVALID_DEVICE,
                )?;
                plan.rewrite64(pb, offset_of!(P, devDescriptor), fd_field::to_u64(host));
            }
            UNIX_EXPORT_OBJECT => {
                type P = NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS;
                let q = plan.get::<P>(pb);
                let mut charge = None;
                if q.object.r#type == EXPORT_OBJECT_TYPE_RM {
                    // data: hDevice, hParent, hObject.
                    for h in q.object.data.into_iter().filter(|&h| h != 0) {
                        self.need_object(h_client, h, NV_ERR_OBJECT_NOT_FOUND)?;
                    }
                    charge = self.px.objects().vid_of(h_client, q.object.data[2]);
                }
                let open = self.unix_fd(plan, p, offset_of!(P, fd))?;
                if charge.is_some() && self.px.objects().hold_count(open) >= MAX_HOLDS_PER_OPEN {
                    return deny(
                        NV_ERR_INSUFFICIENT_RESOURCES,
                        "export holds of the fd's file",
                    );
                }
                // The driver keeps exported memory until the fd's file goes (vidmem.rs).
                self.vid_op = charge.map(|charge| VidOp::Export { open, charge });
            }
            UNIX_GET_EXPORT_INFO => {
                self.unix_fd(
                    plan,
                    p,
                    offset_of!(NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS, fd),
                )?;
            }
            UNIX_EXPORT_OBJECTS => {
                type P = NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS;
                let h_device = rd32(plan.buf(pb), offset_of!(P, hDevice));
                self.need_object(h_client, h_device, NV_ERR_OBJECT_NOT_FOUND)?;
                let quotas = &self.px.policy.quotas;
                if quotas.gpu_memory.is_some() || quotas.system_memory.is_some() {
                    let q = plan.get::<P>(pb);
                    let n = usize::from(q.numObjects).min(q.objects.len());
                    let counted = {
                        let t = self.px.objects();
                        q.objects[..n]
                            .iter()
                            .filter_map(|&h| t.vid_of(h_client, h))
                            .any(|c| self.pool_quota(c.gpu).is_some())
                    };
                    if counted {
                        return deny(
                            NV_ERR_NOT_SUPPORTED,
                            "exporting several objects of memory counted under a quota",
                        );
                    }
                }
                self.unix_fd(plan, p, offset_of!(P, fd))?;
            }
            UNIX_IMPORT_OBJECT => {
                type P = NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS;
                let q = plan.get::<P>(pb);
                if q.object.r#type == EXPORT_OBJECT_TYPE_RM {
                    // data: hParent, hObject (out).
                    self.need_object(h_client, q.object.data[1], NV_ERR_INVALID_OBJECT_PARENT)?;
                }
                self.need_room()?;
                let open = self.unix_fd(plan, p, offset_of!(P, fd))?;
                self.vid_op = Some(VidOp::Import { open });
                return Ok(true);
            }
            UNIX_IMPORT_OBJECTS => {
                type P = NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS;
                let parent = rd32(plan.buf(pb), offset_of!(P, hParent));
                self.need_object(h_client, parent, NV_ERR_INVALID_OBJECT_PARENT)?;
                self.need_room()?;
                self.unix_fd(plan, p, offset_of!(P, fd))?;
                return Ok(true);
            }
            _ => {}
        }
        Ok(false)
    }

    /// An OS_UNIX export fd field: an nvidiactl file of this instance.
    fn unix_fd(&mut self, plan: &mut Plan, p: usize, off: usize) -> Result<OwnerId, Stop> {
        let fd = fd_field::from_u32(rd32(plan.buf(Some(p)), off));
        let (host, open) = self.translate_fd_status_open(fd, NV_ERR_INVALID_PARAMETER)?;
        plan.rewrite32(Some(p), off, fd_field::to_u32(host));
        Ok(open)
    }

    /// `SYSTEM_GET_BUILD_VERSION` (the deprecated converter in
    /// `src/nvidia/interface/deprecated/rmapi_deprecated_control.c`): with any of the three
    /// string pointers NULL the driver only reports `sizeOfStrings`; otherwise it checks
    /// `sizeOfStrings` against its own (at most 256-byte) strings and copies each out.
    fn build_version(&mut self, plan: &mut Plan, p: usize) -> Result<(), Stop> {
        type P = NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS;
        const PTRS: [usize; 3] = [
            offset_of!(P, pDriverVersionBuffer),
            offset_of!(P, pVersionBuffer),
            offset_of!(P, pTitleBuffer),
        ];
        let pb = Some(p);
        let q = plan.get::<P>(pb);
        let ptrs = [q.pDriverVersionBuffer, q.pVersionBuffer, q.pTitleBuffer];
        if ptrs.contains(&0) {
            for off in PTRS {
                plan.null_ptr(pb, off);
            }
            return Ok(());
        }
        let size = q.sizeOfStrings;
        if size == 0 {
            return fail(NV_ERR_INVALID_PARAM_STRUCT, "sizeOfStrings is 0");
        }
        // The host sees buffers of at most 256 bytes and a sizeOfStrings that matches them;
        // the client gets its own value back.
        let len = size.min(BUILD_VERSION_MAX_STRING);
        plan.rewrite32(pb, offset_of!(P, sizeOfStrings), len);
        for (off, addr) in PTRS.into_iter().zip(ptrs) {
            self.nested(plan, pb, off, addr, len as usize, Dir::InOut)?;
        }
        Ok(())
    }

    /// `GPU_ATTACH_IDS` / `GPU_DETACH_IDS`: every id up to the first `INVALID_ID` must be in the
    /// set (else `NV_ERR_INVALID_ARGUMENT`, `cliresCtrlCmdGpuAttachIds`); "all" (`0xffff`) is
    /// rewritten to the instance's ids.
    fn gpu_id_list(&mut self, plan: &mut Plan, p: usize) -> Result<(), Stop> {
        let pb = Some(p);
        let first = rd32(plan.buf(pb), 0);
        if first == nvproxy_abi::structs::NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS {
            for i in 0..NV0000_CTRL_GPU_MAX_GPUS {
                let id = self
                    .px
                    .gpus
                    .get(i)
                    .map_or(NV0000_CTRL_GPU_INVALID_ID, |g| g.gpu_id);
                plan.rewrite32(pb, 4 * i, id);
            }
            return Ok(());
        }
        for i in 0..NV0000_CTRL_GPU_MAX_GPUS {
            let id = rd32(plan.buf(pb), 4 * i);
            if id == NV0000_CTRL_GPU_INVALID_ID {
                break;
            }
            if !self.px.gpu_in_set(id) {
                return deny(NV_ERR_INVALID_ARGUMENT, "GPU outside the instance's set");
            }
        }
        Ok(())
    }

    /// After a successful control: filter GPU lists to the instance, learn device instances,
    /// record dependencies and imported objects.
    fn control_post(
        &mut self,
        cmd: u32,
        size: u32,
        h_client: u32,
        h_object: u32,
        plan: &mut Plan,
        p: usize,
    ) {
        let pb = Some(p);
        match cmd {
            GET_ATTACHED_IDS => {
                let ids = offset_of!(NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS, gpuIds);
                self.filter_id_lists(plan, p, &[ids], None);
            }
            GET_PROBED_IDS => {
                type P = NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580;
                // gpuFlags (580+) runs parallel to gpuIds.
                let flags = (size as usize == size_of::<P>()).then_some(offset_of!(P, gpuFlags));
                self.filter_id_lists(plan, p, &[offset_of!(P, gpuIds)], flags);
                self.filter_id_lists(plan, p, &[offset_of!(P, excludedGpuIds)], None);
            }
            GET_ACTIVE_DEVICE_IDS => self.filter_active_devices(plan, p),
            GET_DEVICE_IDS => self.filter_device_mask(h_client, plan, p),
            SYNC_GPU_BOOST_GROUP_INFO => self.filter_boost_groups(plan, p),
            NVLINK_GET_NVLINK_STATUS => self.filter_nvlink_status(plan, p, size),
            GPU_GET_PIDS => self.filter_pids(plan, p),
            GET_ID_INFO | GET_ID_INFO_V2 => {
                // gpuId and deviceInstance lie alike in both (asserted below).
                let q = plan.get::<NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS>(pb);
                self.px.learn_device(q.deviceInstance, q.gpuId);
            }
            REGISTER_VA_SPACE => {
                let va = plan
                    .get::<NV503C_CTRL_REGISTER_VA_SPACE_PARAMS>(pb)
                    .hVASpace;
                let r = self.px.objects().add_dependency(h_client, h_object, va);
                debug!(?r, "VA space dependency");
            }
            UNIX_IMPORT_OBJECT => {
                let q = plan.get::<NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS>(pb);
                if q.object.r#type == EXPORT_OBJECT_TYPE_RM {
                    let (parent, h) = (q.object.data[1], q.object.data[2]);
                    let mut t = self.px.objects();
                    // The import names the memory its fd's file holds (vidmem.rs).
                    let charge = match self.vid_op {
                        Some(VidOp::Import { open }) => t.holds_of(open).last().copied(),
                        _ => None,
                    };
                    let origin = Origin::Unreplayable("not recorded".into());
                    let r =
                        t.add_vid_object(h_client, parent, h, IMPORTED_CLASS, &[], origin, charge);
                    debug!(?r, h, "imported object");
                }
            }
            FB_GET_INFO_V2 => {
                let n = rd32(plan.buf(pb), 0);
                self.fb_info_view(h_client, h_object, plan, pb, 4, n);
            }
            FB_GET_INFO => {
                let n = rd32(plan.buf(pb), 0);
                let list = plan
                    .call
                    .nested
                    .iter()
                    .position(|b| b.parent == pb && b.offset == 8);
                if let Some(l) = list {
                    self.fb_info_view(h_client, h_object, plan, Some(l), 0, n);
                }
            }
            UNIX_IMPORT_OBJECTS => {
                let q = plan.get::<NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS>(pb);
                let parent = q.hParent;
                let mut t = self.px.objects();
                for h in q.objects {
                    if h != 0 {
                        let r = t.add_object(h_client, parent, h, IMPORTED_CLASS, &[]);
                        debug!(?r, h, "imported object");
                    }
                }
            }
            _ => {}
        }
        if let Some(VidOp::Export { open, charge }) = self.vid_op {
            let held = self.px.objects().hold(open, charge);
            debug!(held, "exported video memory held by the export fd's file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_every_non_simple_control_of_every_version_has_a_translation() {
        for node in nvproxy_abi::nodes() {
            for c in node.tables().controls.values() {
                assert!(
                    control_handled(c.cmd, c.translation),
                    "{}: {} ({}) has no translation",
                    node.version,
                    c.name,
                    c.translation
                );
            }
        }
    }
}
