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

use host_driver::NestedData;
use nvproxy_abi::Translation;
use nvproxy_abi::fd_field;
use nvproxy_abi::ioctl::NV_ESC_RM_ALLOC_NVOS64;
use nvproxy_abi::structs::{
    NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS, NV_CONTEXT_DMA_ALLOCATION_PARAMS,
    NV_CTXSHARE_ALLOCATION_PARAMETERS, NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS,
    NV00FD_ALLOCATION_PARAMETERS, NV00FD_ALLOCATION_PARAMETERS_V545,
    NV00FD_ALLOCATION_PARAMETERS_V590, NV0005_ALLOC_PARAMETERS, NV0080_ALLOC_PARAMETERS,
    NV83DE_ALLOC_PARAMETERS, NVOS21_PARAMETERS, NVOS64_PARAMETERS,
};
use tracing::debug;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::audit::Kind;
use crate::error::ProxyError;
use crate::kit::{Stop, deny, fail};
use crate::nv::*;
use crate::objects::{AllocRecord, FdUse, ObjectError, Origin};
use crate::plan::{Plan, rd32, rd64};
use crate::request::{Dir, NO_ROOM, Req, UNKNOWN_CLIENT, UNKNOWN_OBJECT};

/// `NVOS64_PARAMETERS.pAllocParms`.
const P_ALLOC_PARMS: usize = offset_of!(NVOS64_PARAMETERS, pAllocParms);
/// `NVOS64_PARAMETERS.pRightsRequested`.
const P_RIGHTS_REQUESTED: usize = offset_of!(NVOS64_PARAMETERS, pRightsRequested);

/// The client's NVOS21 as NVOS64 (pRightsRequested NULL, flags 0).
fn nvos21_to_64(p: &NVOS21_PARAMETERS) -> NVOS64_PARAMETERS {
    let mut o = NVOS64_PARAMETERS::new_zeroed();
    o.hRoot = p.hRoot;
    o.hObjectParent = p.hObjectParent;
    o.hObjectNew = p.hObjectNew;
    o.hClass = p.hClass;
    o.pAllocParms = p.pAllocParms;
    o.paramsSize = p.paramsSize;
    o.status = p.status;
    o
}

/// The host's NVOS64 back in the client's NVOS21 layout.
fn nvos64_to_21(p: &NVOS64_PARAMETERS) -> NVOS21_PARAMETERS {
    NVOS21_PARAMETERS {
        hRoot: p.hRoot,
        hObjectParent: p.hObjectParent,
        hObjectNew: p.hObjectNew,
        hClass: p.hClass,
        pAllocParms: p.pAllocParms,
        paramsSize: p.paramsSize,
        status: p.status,
    }
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
    Object {
        deps: Vec<u32>,
        fds: Vec<FdUse>,
        /// An event whose `hParentClient` is not its client: the driver allocates it under
        /// the client instead of `hParent` (`rmapiFixupAllocParams`, rmapi_specific.c), so
        /// freeing its source resource leaves it alive.
        under_client: bool,
    },
}

impl Req<'_> {
    /// `NV_ESC_RM_ALLOC` with a 32- or 48-byte payload.
    pub(crate) fn rm_alloc(&mut self, addr: u64, size: usize) -> Result<i32, ProxyError> {
        self.note.kind = Kind::Class;
        if size == size_of::<NVOS21_PARAMETERS>() {
            const STATUS: usize = offset_of!(NVOS21_PARAMETERS, status);
            self.with_params(addr, STATUS, |r, p: NVOS21_PARAMETERS| {
                r.alloc(addr, nvos21_to_64(&p), true)
            })
        } else {
            const STATUS: usize = offset_of!(NVOS64_PARAMETERS, status);
            self.with_params(addr, STATUS, |r, p: NVOS64_PARAMETERS| {
                r.alloc(addr, p, false)
            })
        }
    }

    /// One allocation, as NVOS64 for the host (`nvos21`: the client used NVOS21 and gets its
    /// own layout back).
    fn alloc(&mut self, addr: u64, top: NVOS64_PARAMETERS, nvos21: bool) -> Result<i32, Stop> {
        let (h_root, h_parent, h_new) = (top.hRoot, top.hObjectParent, top.hObjectNew);
        let class = top.hClass;
        let (p_alloc, p_rights) = (top.pAllocParms, top.pRightsRequested);
        self.note.number = class;
        self.note.name = "".into(); // unknown until the table says otherwise

        // The alloc params are read once, into the buffer the host gets; every decision below
        // is made on that copy. NV01_EVENT: the driver takes the real class from
        // NV0005_ALLOC_PARAMETERS.hClass (_fixupAllocParams); only the OS event is a user-mode
        // class, and that is what its params are read as.
        let mut plan = Plan::new(NV_ESC_RM_ALLOC_NVOS64, top.as_bytes());
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
            let h_class = pbuf.map_or(0, |p| plan.get::<NV0005_ALLOC_PARAMETERS>(Some(p)).hClass);
            if h_class == NV01_EVENT_OS_EVENT {
                eff = NV01_EVENT_OS_EVENT;
            }
        }
        let Some(spec) = self.px.classes.get(&eff).copied() else {
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
        {
            // The handles and the quota, under one lock of the table.
            let t = self.px.objects();
            if !root {
                match t.check_new(h_root, h_parent, h_new) {
                    Ok(()) => {}
                    Err(ObjectError::UnknownClient(_)) => {
                        return deny(NV_ERR_INVALID_CLIENT, UNKNOWN_CLIENT);
                    }
                    Err(ObjectError::UnknownParent(..)) => {
                        return deny(NV_ERR_INVALID_OBJECT_PARENT, UNKNOWN_OBJECT);
                    }
                    // Duplicate: the only other answer of check_new.
                    Err(_) => return fail(NV_ERR_INSERT_DUPLICATE_NAME, "handle in use"),
                }
            } else if h_new != 0 && t.contains(h_new, h_new) {
                return fail(NV_ERR_INSERT_DUPLICATE_NAME, "client handle in use");
            }
            if !self.px.object_room_in(&t) {
                return deny(NV_ERR_INSUFFICIENT_RESOURCES, NO_ROOM);
            }
        }

        let psize = spec.param_size as usize;
        if params_read {
            // NV01_EVENT_OS_EVENT's params are NV0005_ALLOC_PARAMETERS, already read above.
            debug_assert_eq!(psize, size_of::<NV0005_ALLOC_PARAMETERS>());
        } else if psize > 0 {
            pbuf = self.nested(&mut plan, None, P_ALLOC_PARMS, p_alloc, psize, Dir::InOut)?;
        } else {
            plan.null_ptr(None, P_ALLOC_PARMS);
        }
        let mut rights = None;
        if !nvos21 {
            // RS_ACCESS_MASK: one 32-bit limb; the driver only reads it.
            let r = self.nested(&mut plan, None, P_RIGHTS_REQUESTED, p_rights, 4, Dir::In)?;
            rights = r.map(|i| crate::plan::rd32(plan.buf(Some(i)), 0));
        }
        // The params as the client gave them, before any translation: what replay sends.
        let mut rec = AllocRecord::given(class, pbuf.map(|p| plan.buf(Some(p))));
        let record = if root {
            Record::Client
        } else {
            self.alloc_prepare(eff, spec.name, h_root, &mut plan, pbuf)?
        };

        if eff == NV_MEMORY_FABRIC && self.px.policy.quotas.gpu_memory.is_some() {
            return deny(
                NV_ERR_INVALID_CLASS,
                "fabric memory cannot be counted against a GPU memory quota",
            );
        }
        // Video memory on the device's GPU, system memory in the host's pool (vidmem.rs): the
        // pool and size, admitted under the RM lock below.
        let pool = self.memory_pool(eff, h_root, h_parent);
        let vid = pool.map(|pool| {
            let size = pbuf.map_or(0, |p| rd64(plan.buf(Some(p)), crate::vidmem::MEM_SIZE));
            (pool, size)
        });
        let guard = self.px.rm_lock();
        if let Some((gpu, size)) = vid {
            self.vid_admit(gpu, size)?;
        }
        if eff == NV01_DEVICE_0 {
            let device = pbuf.map_or(0, |p| plan.get::<NV0080_ALLOC_PARAMETERS>(Some(p)).deviceId);
            if !self.device_in_set(h_root, device) {
                return deny(
                    NV_ERR_INVALID_CLASS,
                    "device of a GPU outside the instance's set",
                );
            }
        }
        self.px.translate_clients(&mut plan, root);
        let ret = self.exec_raw(&mut plan)?;
        let mut out = plan.get::<NVOS64_PARAMETERS>(None);
        if out.status == NV_OK && eff == KEPLER_CHANNEL_GROUP_A {
            // The instance's interleave level, before anyone can use the TSG (schedule.rs).
            let prio = self.px.policy.priority;
            if let Err(status) = crate::schedule::apply(
                &*self.file.host,
                out.hRoot,
                out.hObjectParent,
                out.hObjectNew,
                prio,
            ) {
                plan.set32(None, offset_of!(NVOS64_PARAMETERS, status), status);
                out.status = status;
                self.note.reason = Some("the instance's interleave level was refused");
            }
        }
        let convert = move |t: NestedData| match NVOS64_PARAMETERS::read_from_bytes(&t) {
            Ok(p) if nvos21 => NestedData::from_slice(nvos64_to_21(&p).as_bytes()),
            _ => t,
        };
        const STATUS: usize = offset_of!(NVOS64_PARAMETERS, status);
        if out.status != NV_OK {
            drop(guard);
            return Ok(self.finish_with(addr, &mut plan, Some(STATUS), ret, convert)?);
        }
        let mut h = out.hObjectNew;
        if root {
            let name = self.px.name_new_client(h);
            if name != h {
                plan.set32(None, offset_of!(NVOS64_PARAMETERS, hObjectNew), name);
                h = name;
            }
        }
        rec.set_out(pbuf.map(|p| plan.buf(Some(p))));
        rec.rights = rights;
        // An object (not a client, whose name the books may change) is answered before it is
        // recorded when the request is the instance's only one (`Proxy::alone`), with the
        // table locked from before the answer to after the record: the client goes on
        // meanwhile, and whatever it sends next finds the object recorded.
        let early = (!root && self.px.alone())
            .then(|| self.finish_with(addr, &mut plan, Some(STATUS), ret, convert));
        // A client belongs to the file the driver files it under: the control file this open
        // registered (`NV_ESC_REGISTER_FD`), if any, else this open (`escape.c`:
        // `clientOSInfo = nvfp->ctl_nvfp`, else `nvfp`). It lives until that file goes.
        let owner = match record {
            Record::Client => crate::proxy::lock_record(&self.file)
                .registered_ctl
                .unwrap_or(self.open),
            Record::Object { .. } => self.open,
        };
        let mut t = self.px.objects();
        if let Some(Ok(r)) = early {
            self.mem.answer_now(r);
        }
        let r = match record {
            Record::Client => t.add_client_with(owner, h, eff, Origin::alloc(rec)),
            Record::Object {
                deps,
                fds,
                under_client,
            } => {
                // The client reads back its own fd values and client handles (the plan
                // restores what the proxy rewrote): record the params as it sees them.
                if let (Some(g), Some(o)) = rec.params_and_out_mut() {
                    let fields = fds.iter().map(|f| (f.offset, 8)).chain(
                        crate::replay::client_fields(eff)
                            .iter()
                            .map(|&off| (off, 4)),
                    );
                    for (off, len) in fields {
                        if let (Some(d), Some(s)) =
                            (o.get_mut(off..off + len), g.get(off..off + len))
                        {
                            d.copy_from_slice(s);
                        }
                    }
                }
                rec.fds = fds;
                let deps: Vec<u32> = deps
                    .into_iter()
                    .filter(|&d| t.contains(h_root, d))
                    .collect();
                let charge = vid.and_then(|(gpu, size)| {
                    let back = rec.out().map_or(0, |o| rd64(o, crate::vidmem::MEM_SIZE));
                    let bytes = crate::vid_books::pages(size.max(back));
                    gpu.map(|g| t.new_vid_charge(g, bytes))
                });
                let (parent, origin) = match under_client {
                    false => (h_parent, Origin::alloc(rec)),
                    // Replay allocates under the parent it records; this one's source is not
                    // its parent.
                    true => (
                        h_root,
                        Origin::Unreplayable(
                            "an OS event whose hParentClient is not its client (the driver files it under the client)"
                                .into(),
                        ),
                    ),
                };
                t.add_vid_object(h_root, parent, h, eff, &deps, origin, charge)
            }
        };
        drop(t);
        debug!(?r, h, class = eff, "alloc recorded");
        drop(guard);
        match early {
            Some(done) => Ok(done?),
            None => Ok(self.finish_with(addr, &mut plan, Some(STATUS), ret, convert)?),
        }
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
            return Ok(Record::Object {
                deps: Vec::new(),
                fds: Vec::new(),
                under_client: false,
            });
        };
        let pb = Some(p);
        let mut deps = Vec::new();
        let mut fds = Vec::new();
        let mut under_client = false;
        match class {
            NV01_EVENT_OS_EVENT => {
                // data: the fd registered with NV_ESC_ALLOC_OS_EVENT.
                type P = NV0005_ALLOC_PARAMETERS;
                let q = plan.get::<P>(pb);
                under_client = q.hParentClient != h_root;
                if q.hParentClient != 0 {
                    self.need_client(q.hParentClient)?;
                    let host = self.px.host_client(q.hParentClient);
                    plan.rewrite32(pb, offset_of!(P, hParentClient), host);
                }
                let (host, open) = self.translate_fd_status_open(
                    fd_field::from_u64(q.data),
                    NV_ERR_INVALID_ARGUMENT,
                )?;
                plan.rewrite64(pb, offset_of!(P, data), fd_field::to_u64(host));
                fds.push(FdUse {
                    offset: offset_of!(P, data),
                    open: open.0,
                });
            }
            NV01_DEVICE_0 => {
                // hClientShare and hTargetClient name clients.
                type P = NV0080_ALLOC_PARAMETERS;
                let q = plan.get::<P>(pb);
                for (c, off) in [
                    (q.hClientShare, offset_of!(P, hClientShare)),
                    (q.hTargetClient, offset_of!(P, hTargetClient)),
                ] {
                    if c != 0 {
                        self.need_client(c)?;
                        plan.rewrite32(pb, off, self.px.host_client(c));
                    }
                }
                if q.hTargetClient != 0 && q.hTargetDevice != 0 {
                    self.need_object(
                        q.hTargetClient,
                        q.hTargetDevice,
                        NV_ERR_INVALID_OBJECT_HANDLE,
                    )?;
                }
            }
            NV_MEMORY_MULTICAST_FABRIC => {
                // pOsEvent: optional fd (0 = none); the layout is the version's.
                let off = match plan.buf(pb).len() {
                    n if n == size_of::<NV00FD_ALLOCATION_PARAMETERS>() => {
                        offset_of!(NV00FD_ALLOCATION_PARAMETERS, pOsEvent)
                    }
                    n if n == size_of::<NV00FD_ALLOCATION_PARAMETERS_V590>() => {
                        const _: () = assert!(
                            offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, pOsEvent)
                                == offset_of!(NV00FD_ALLOCATION_PARAMETERS_V545, pOsEvent)
                        );
                        offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, pOsEvent)
                    }
                    _ => {
                        return deny(
                            NV_ERR_INVALID_CLASS,
                            "multicast fabric params of unknown size",
                        );
                    }
                };
                let fd = rd64(plan.buf(pb), off);
                if fd != 0 {
                    let (host, open) = self.translate_fd_status_open(
                        fd_field::from_u64(fd),
                        NV_ERR_INVALID_ARGUMENT,
                    )?;
                    plan.rewrite64(pb, off, fd_field::to_u64(host));
                    fds.push(FdUse {
                        offset: off,
                        open: open.0,
                    });
                }
            }
            NV_IMEX_SESSION => {
                return deny(NV_ERR_NOT_SUPPORTED, "IMEX sessions need nvidia-caps fds");
            }
            GT200_DEBUGGER => {
                // hAppClient names the debugged client.
                let q = plan.get::<NV83DE_ALLOC_PARAMETERS>(pb);
                self.need_client(q.hAppClient)?;
                let host = self.px.host_client(q.hAppClient);
                plan.rewrite32(pb, offset_of!(NV83DE_ALLOC_PARAMETERS, hAppClient), host);
                if q.hAppClient == h_root {
                    deps.push(q.hClass3dObject);
                }
            }
            NV01_MEMORY_VIRTUAL => {
                let va = plan.get::<NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS>(pb).hVASpace;
                if va != 0 && va != 0xffff_ffff {
                    deps.push(va);
                }
            }
            NV01_CONTEXT_DMA => deps.push(plan.get::<NV_CONTEXT_DMA_ALLOCATION_PARAMS>(pb).hMemory),
            KEPLER_CHANNEL_GROUP_A => {
                deps.push(
                    plan.get::<NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS>(pb)
                        .hVASpace,
                );
            }
            FERMI_CONTEXT_SHARE_A => {
                deps.push(plan.get::<NV_CTXSHARE_ALLOCATION_PARAMETERS>(pb).hVASpace);
            }
            _ if name.contains("CHANNEL_GPFIFO") => {
                // NV_CHANNEL_ALLOC_PARAMS (not modelled): hContextShare at 24, hVASpace at 28
                // in every version of the tree (abi-facts).
                const H_CONTEXT_SHARE: usize = 24;
                const H_VA_SPACE: usize = 28;
                deps.push(rd32(plan.buf(pb), H_CONTEXT_SHARE));
                deps.push(rd32(plan.buf(pb), H_VA_SPACE));
            }
            _ => {}
        }
        deps.retain(|&d| d != 0);
        Ok(Record::Object {
            deps,
            fds,
            under_client,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let p = NVOS21_PARAMETERS {
            hRoot: 1,
            hObjectParent: 2,
            hObjectNew: 3,
            hClass: 0x41,
            pAllocParms: 0x1000,
            paramsSize: 4,
            status: 0x22,
        };
        let wide = nvos21_to_64(&p);
        assert_eq!(
            (
                wide.pAllocParms,
                wide.paramsSize,
                wide.status,
                wide.pRightsRequested
            ),
            (0x1000, 4, 0x22, 0)
        );
        assert_eq!(nvos64_to_21(&wide).as_bytes(), p.as_bytes());
    }
}
