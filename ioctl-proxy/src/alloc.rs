//! `NV_ESC_RM_ALLOC`: the fourth dispatch level.
//!
//! The client may use `NVOS21_PARAMETERS` (32 bytes) or `NVOS64_PARAMETERS` (48); the host
//! always gets NVOS64, which the driver treats identically (escape.c: `Nv04AllocWithSecInfo`
//! vs `Nv04AllocWithAccessSecInfo`; gVisor does the same), and the client gets its own layout
//! back. `pAllocParms` is copied with the size of the *class* (the driver derives it from the
//! class too, `rmapiGetClassAllocParamSize`), never with the client's `paramsSize`.
//!
//! Answers with ioctl success, as the driver: an unknown class (or one the policy denies)
//! `NV_ERR_INVALID_CLASS`; a client of another instance `NV_ERR_INVALID_CLIENT`; an unknown
//! parent `NV_ERR_INVALID_OBJECT_PARENT`; a handle in use `NV_ERR_INSERT_DUPLICATE_NAME`; an
//! `NV01_DEVICE_0` whose `deviceId` is not one of the instance's GPUs `NV_ERR_INVALID_CLASS`
//! (`deviceConstruct_IMPL`, `src/nvidia/src/kernel/gpu/device.c`: an invalid device instance;
//! GPUs outside the set are invisible, so they answer as if they did not exist).

use std::mem::offset_of;

use nvproxy_abi::Translation;
use nvproxy_abi::ioctl::NV_ESC_RM_ALLOC_NVOS64;
use nvproxy_abi::structs::{NV0005_ALLOC_PARAMETERS, NVOS64_PARAMETERS};
use tracing::debug;

use crate::audit::Kind;
use crate::error::ProxyError;
use crate::nv::*;
use crate::plan::{Plan, rd32, rd64, wr32};
use crate::request::{Dir, Req, Stop, deny, fail};

/// `NVOS64_PARAMETERS.pAllocParms`.
const P_ALLOC_PARMS: usize = offset_of!(NVOS64_PARAMETERS, pAllocParms);
/// `NVOS64_PARAMETERS.pRightsRequested`.
const P_RIGHTS_REQUESTED: usize = offset_of!(NVOS64_PARAMETERS, pRightsRequested);

/// `NVOS21_PARAMETERS` size.
const NVOS21: usize = 32;
/// `NVOS64_PARAMETERS` size.
const NVOS64: usize = 48;

/// The client's NVOS21 as NVOS64 (pRightsRequested NULL, flags 0).
fn nvos21_to_64(b: &[u8]) -> Vec<u8> {
    let mut o = vec![0u8; NVOS64];
    o[..24].copy_from_slice(&b[..24]);
    wr32(&mut o, 32, rd32(b, 24)); // paramsSize
    wr32(&mut o, 40, rd32(b, 28)); // status
    o
}

/// The host's NVOS64 back in the client's NVOS21 layout.
fn nvos64_to_21(b: &[u8]) -> Vec<u8> {
    let mut o = vec![0u8; NVOS21];
    o[..24].copy_from_slice(&b[..24]);
    wr32(&mut o, 24, rd32(b, 32));
    wr32(&mut o, 28, rd32(b, 40));
    o
}

/// Classes whose alloc params carry fds (or need more than handle tracking) and that
/// `alloc_prepare` translates.
const FD_CLASSES: [u32; 3] = [
    NV01_EVENT_OS_EVENT,
    NV_MEMORY_MULTICAST_FABRIC,
    NV_IMEX_SESSION,
];

/// Whether the proxy can forward an allocation of `class` whose table translation is `t`: simple
/// and special (handle tracking only: no pointers, no fds) classes always, fd and pointer
/// classes only when handled here.
pub(crate) fn class_handled(class: u32, t: Translation) -> bool {
    matches!(t, Translation::Simple | Translation::Special) || FD_CLASSES.contains(&class)
}

/// What to record after a successful allocation.
enum Record {
    Client,
    Object { deps: Vec<u32> },
}

impl Req<'_> {
    /// `NV_ESC_RM_ALLOC` with a 32- or 48-byte payload.
    pub(crate) fn rm_alloc(&mut self, addr: u64, size: usize) -> Result<i32, ProxyError> {
        self.note.kind = Kind::Class;
        let status_off = if size == NVOS21 { 28 } else { 40 };
        self.with_status(addr, size, status_off, |r, top| r.alloc(addr, top))
    }

    fn alloc(&mut self, addr: u64, top: Vec<u8>) -> Result<i32, Stop> {
        let nvos21 = top.len() == NVOS21;
        let host_top = if nvos21 { nvos21_to_64(&top) } else { top };
        let (h_root, h_parent, h_new) =
            (rd32(&host_top, 0), rd32(&host_top, 4), rd32(&host_top, 8));
        let class = rd32(&host_top, 12);
        let (p_alloc, p_rights) = (
            rd64(&host_top, P_ALLOC_PARMS),
            rd64(&host_top, P_RIGHTS_REQUESTED),
        );
        self.note.number = class;
        self.note.name = "".into(); // unknown until the table says otherwise

        // The alloc params are read once, into the buffer the host gets; every decision below
        // is made on that copy. NV01_EVENT: the driver takes the real class from
        // NV0005_ALLOC_PARAMETERS.hClass (_fixupAllocParams); only the OS event is a user-mode
        // class, and that is what its params are read as.
        let mut plan = Plan::new(NV_ESC_RM_ALLOC_NVOS64, host_top);
        let mut eff = class;
        let mut pbuf = None;
        let mut params_read = false;
        if class == NV01_EVENT && p_alloc != 0 {
            pbuf = self.nested(
                &mut plan,
                None,
                P_ALLOC_PARMS,
                p_alloc,
                size_of::<NV0005_ALLOC_PARAMETERS>(),
                Dir::InOut,
            )?;
            params_read = true;
            let h_class = pbuf.map_or(0, |p| {
                rd32(
                    plan.buf(Some(p)),
                    offset_of!(NV0005_ALLOC_PARAMETERS, hClass),
                )
            });
            if h_class == NV01_EVENT_OS_EVENT {
                eff = NV01_EVENT_OS_EVENT;
            }
        }
        let Some(spec) = self.px.abi.classes.get(&eff).copied() else {
            return deny(NV_ERR_INVALID_CLASS, "unknown class");
        };
        self.note.name = spec.name.into();
        if !self.check_policy(spec.name, spec.caps) {
            return deny(NV_ERR_INVALID_CLASS, "policy");
        }
        if !class_handled(eff, spec.translation) {
            return deny(NV_ERR_INVALID_CLASS, "no translation for this class");
        }
        let root = matches!(eff, NV01_ROOT | NV01_ROOT_NON_PRIV | NV01_ROOT_CLIENT);
        if !root {
            self.need_client(h_root)?;
            self.need_object(h_root, h_parent, NV_ERR_INVALID_OBJECT_PARENT)?;
            if h_new != 0 && self.px.objects().contains(h_root, h_new) {
                return fail(NV_ERR_INSERT_DUPLICATE_NAME, "handle in use");
            }
        } else if h_new != 0 && self.px.objects().contains(h_new, h_new) {
            return fail(NV_ERR_INSERT_DUPLICATE_NAME, "client handle in use");
        }
        self.need_room()?;

        let psize = spec.param_size as usize;
        if params_read {
            // NV01_EVENT_OS_EVENT's params are NV0005_ALLOC_PARAMETERS, already read above.
            debug_assert_eq!(psize, size_of::<NV0005_ALLOC_PARAMETERS>());
        } else if psize > 0 {
            pbuf = self.nested(&mut plan, None, P_ALLOC_PARMS, p_alloc, psize, Dir::InOut)?;
        } else {
            plan.null_ptr(None, P_ALLOC_PARMS);
        }
        if !nvos21 {
            // RS_ACCESS_MASK: one 32-bit limb; the driver only reads it.
            self.nested(&mut plan, None, P_RIGHTS_REQUESTED, p_rights, 4, Dir::In)?;
        }
        let record = if root {
            Record::Client
        } else {
            self.alloc_prepare(eff, spec.name, h_root, &mut plan, pbuf)?
        };

        let guard = self.px.rm_lock();
        if eff == NV01_DEVICE_0 {
            let device = pbuf.map_or(0, |p| rd32(plan.buf(Some(p)), 0));
            if !self.device_in_set(h_root, device) {
                return deny(
                    NV_ERR_INVALID_CLASS,
                    "device of a GPU outside the instance's set",
                );
            }
        }
        let ret = self.exec(&mut plan)?;
        let out = &plan.call.params;
        if rd32(out, 40) == NV_OK {
            let h = rd32(out, 8);
            let mut t = self.px.objects();
            let r = match record {
                Record::Client => t.add_client(self.open, h, eff),
                Record::Object { deps } => {
                    let deps: Vec<u32> = deps
                        .into_iter()
                        .filter(|&d| t.contains(h_root, d))
                        .collect();
                    t.add_object(h_root, h_parent, h, eff, &deps)
                }
            };
            debug!(?r, h, class = eff, "alloc recorded");
        }
        drop(guard);
        let convert = move |t: Vec<u8>| if nvos21 { nvos64_to_21(&t) } else { t };
        Ok(self.finish_with(addr, plan, Some(40), ret, convert)?)
    }

    /// Class-specific checks and translation; returns the dependencies to record.
    fn alloc_prepare(
        &mut self,
        class: u32,
        name: &str,
        h_root: u32,
        plan: &mut Plan,
        pbuf: Option<usize>,
    ) -> Result<Record, Stop> {
        let Some(p) = pbuf else {
            return Ok(Record::Object { deps: Vec::new() });
        };
        let pb = Some(p);
        let at = |plan: &Plan, off: usize| rd32(plan.buf(pb), off);
        let mut deps = Vec::new();
        match class {
            NV01_EVENT_OS_EVENT => {
                // NV0005_ALLOC_PARAMETERS: hParentClient, hSrcResource, hClass, notifyIndex,
                // data (the fd registered with NV_ESC_ALLOC_OS_EVENT).
                let parent_client = at(plan, 0);
                if parent_client != 0 {
                    self.need_client(parent_client)?;
                }
                let fd = rd64(plan.buf(pb), 16) as i32;
                let host = self.translate_fd_status(fd, NV_ERR_INVALID_ARGUMENT)?;
                plan.rewrite64(pb, 16, host as u64);
            }
            NV01_DEVICE_0 => {
                // NV0080_ALLOC_PARAMETERS: hClientShare and hTargetClient name clients.
                for off in [4, 8] {
                    let c = at(plan, off);
                    if c != 0 {
                        self.need_client(c)?;
                    }
                }
                let (target, target_dev) = (at(plan, 8), at(plan, 12));
                if target != 0 && target_dev != 0 {
                    self.need_object(target, target_dev, NV_ERR_INVALID_OBJECT_HANDLE)?;
                }
            }
            NV_MEMORY_MULTICAST_FABRIC => {
                // pOsEvent: optional fd (0 = none); at 32 in the 535 layout, 72 later.
                let off = if plan.buf(pb).len() == 40 { 32 } else { 72 };
                let fd = rd64(plan.buf(pb), off);
                if fd != 0 {
                    let host = self.translate_fd_status(fd as i32, NV_ERR_INVALID_ARGUMENT)?;
                    plan.rewrite64(pb, off, host as u64);
                }
            }
            NV_IMEX_SESSION => {
                return deny(NV_ERR_NOT_SUPPORTED, "IMEX sessions need nvidia-caps fds");
            }
            GT200_DEBUGGER => {
                // NV83DE_ALLOC_PARAMETERS.hAppClient names the debugged client.
                let app = at(plan, 4);
                self.need_client(app)?;
                if app == h_root {
                    deps.push(at(plan, 8));
                }
            }
            NV01_MEMORY_VIRTUAL => {
                let va = at(plan, 16);
                if va != 0 && va != 0xffff_ffff {
                    deps.push(va);
                }
            }
            NV01_CONTEXT_DMA => deps.push(at(plan, 8)),
            KEPLER_CHANNEL_GROUP_A => deps.push(at(plan, 8)),
            FERMI_CONTEXT_SHARE_A => deps.push(at(plan, 0)),
            // NV_CHANNEL_ALLOC_PARAMS: hContextShare at 24, hVASpace at 28 in every version of
            // the tree (abi-facts).
            _ if name.contains("CHANNEL_GPFIFO") => {
                deps.push(at(plan, 24));
                deps.push(at(plan, 28));
            }
            _ => {}
        }
        deps.retain(|&d| d != 0);
        Ok(Record::Object { deps })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::wr64;

    #[test]
    fn test_every_class_of_every_version_has_a_translation() {
        for node in nvproxy_abi::nodes() {
            for c in node.tables().classes.values() {
                assert!(
                    class_handled(c.class, c.translation),
                    "{}: {} ({}) has no translation",
                    node.version,
                    c.name,
                    c.translation
                );
            }
        }
    }

    #[test]
    fn test_nvos21_roundtrip_through_nvos64() {
        let mut b = vec![0u8; 32];
        for (i, v) in [1u32, 2, 3, 0x41].iter().enumerate() {
            wr32(&mut b, 4 * i, *v);
        }
        wr64(&mut b, 16, 0x1000);
        wr32(&mut b, 24, 4);
        wr32(&mut b, 28, 0x22);
        let wide = nvos21_to_64(&b);
        assert_eq!(
            (rd64(&wide, 16), rd32(&wide, 32), rd32(&wide, 40)),
            (0x1000, 4, 0x22)
        );
        assert_eq!(nvos64_to_21(&wide), b);
    }
}
