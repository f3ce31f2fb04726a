//! The resource manager: clients, objects and handles, `RM_ALLOC`, `RM_FREE`,
//! `RM_DUP_OBJECT`, `RM_SHARE`, with the status codes of the driver's resource server
//! (`rs_server.c`, `rs_client.c`, `alloc_free.c`, `event.c`, `device.c`, `subdevice.c`).

use crate::driver::{Client, Kind, MemBlock, Object, SimDriver, State};
use crate::status::*;
pub use nvproxy_abi::class::*;

/// `NVC661_NV_USERMODE__SIZE`: one 64 KiB page.
const USERMODE_BYTES: u64 = 0x1_0000;

/// `RS_CLIENT_HANDLE_BASE`: driver-chosen client handles are `0xc1d00000 | index`.
pub const RS_CLIENT_HANDLE_BASE: u32 = 0xc1d0_0000;
pub use crate::driver::RS_UNIQUE_HANDLE_BASE;
const RS_CLIENT_HANDLE_MAX: u32 = 0x0010_0000;
const RS_CLIENT_HANDLE_BUCKET_COUNT: u32 = 0x400;
const RS_CLIENT_HANDLE_BUCKET_MASK: u32 = 0x3ff;
/// `NV_MAX_DEVICES`.
const NV_MAX_DEVICES: u32 = 32;
/// `NV2080_MAX_SUBDEVICES`.
const NV2080_MAX_SUBDEVICES: u32 = 8;
/// `RS_SHARE_TYPE_MAX`.
const RS_SHARE_TYPE_MAX: u16 = 8;
/// `RS_SHARE_TYPE_CLIENT`.
const RS_SHARE_TYPE_CLIENT: u16 = 3;

/// Whether `class` is one of the client classes.
pub(crate) fn is_root_class(class: u32) -> bool {
    matches!(class, NV01_ROOT | NV01_ROOT_NON_PRIV | NV01_ROOT_CLIENT)
}

/// Whether `class` is an event class (allowed on `/dev/nvidia#` as well as on the control node).
pub(crate) fn is_event_class(class: u32) -> bool {
    matches!(
        class,
        NV01_EVENT
            | NV01_EVENT_OS_EVENT
            | NV01_EVENT_KERNEL_CALLBACK
            | NV01_EVENT_KERNEL_CALLBACK_EX
    )
}

/// The alloc params an allocation came with: the bytes of the `pAllocParms` buffer, or `None`
/// for a NULL pointer.
pub(crate) struct AllocArgs<'a> {
    pub h_client: u32,
    pub h_parent: u32,
    pub h_new: u32,
    pub class: u32,
    pub params: Option<&'a mut [u8]>,
    /// The file the call came on, and the file whose clients it may use (`clientOSInfo`).
    pub os_info: i32,
}

/// Which allocation params a modeled class takes: (size for this version, required).
fn class_params(drv: &SimDriver, class: u32) -> Option<(usize, bool)> {
    let table = |c: u32, fallback: usize| {
        drv.abi
            .classes
            .get(&c)
            .map_or(fallback, |s| s.param_size as usize)
    };
    Some(match class {
        NV01_ROOT | NV01_ROOT_NON_PRIV | NV01_ROOT_CLIENT => (table(class, 4), false),
        NV01_EVENT
        | NV01_EVENT_OS_EVENT
        | NV01_EVENT_KERNEL_CALLBACK
        | NV01_EVENT_KERNEL_CALLBACK_EX => (table(NV01_EVENT_OS_EVENT, 24), true),
        NV01_DEVICE_0 => (table(class, 56), false),
        NV20_SUBDEVICE_0 => (table(class, 4), false),
        NV01_MEMORY_SYSTEM
        | NV01_MEMORY_LOCAL_USER
        | NV_MEMORY_EXTENDED_USER
        | NV50_MEMORY_VIRTUAL => (table(class, 120), true),
        FERMI_VASPACE_A => (table(class, 48), true),
        // RS_OPTIONAL(NV_HOPPER_USERMODE_A_PARAMS)
        HOPPER_USERMODE_A => (table(class, 2), false),
        // RS_OPTIONAL(NV_CONFIDENTIAL_COMPUTE_ALLOC_PARAMS)
        NV_CONFIDENTIAL_COMPUTE => (table(class, 4), false),
        // RS_REQUIRED(NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS) and the context share's.
        KEPLER_CHANNEL_GROUP_A => (table(class, 20), true),
        FERMI_CONTEXT_SHARE_A => (table(class, 12), true),
        // RS_REQUIRED(NV_CHANNEL_ALLOC_PARAMS): 360 bytes at 535, 368 at 570, 376 at 610.
        crate::channel::HOPPER_CHANNEL_GPFIFO_A => (table(class, 360), true),
        // RS_OPTIONAL(NV_GR_ALLOCATION_PARAMETERS); the copy class RS_REQUIRED(NVB0B5_...).
        crate::channel::HOPPER_COMPUTE_A => (table(class, 16), false),
        crate::channel::HOPPER_DMA_COPY_A => (table(class, 8), true),
        // RS_REQUIRED(NV83DE_ALLOC_PARAMETERS).
        GT200_DEBUGGER => (table(class, 12), true),
        _ => return None,
    })
}

impl State {
    /// The status the resource server gives for a client handle it does not know. Before 555
    /// the sorted per-bucket search of `_serverFindClientEntry` ends on a larger handle
    /// (`NV_ERR_INVALID_OBJECT`) or at the end of the bucket (`NV_ERR_INVALID_OBJECT_HANDLE`);
    /// from 555 on (`_serverFindClientEntryByHandle`) it is always the latter.
    pub(crate) fn unknown_client_status(&self, h: u32) -> u32 {
        let bucket = h & RS_CLIENT_HANDLE_BUCKET_MASK;
        if self.sorted_client_buckets
            && self
                .clients
                .keys()
                .any(|&c| (c & RS_CLIENT_HANDLE_BUCKET_MASK) == bucket && c > h)
        {
            NV_ERR_INVALID_OBJECT
        } else {
            NV_ERR_INVALID_OBJECT_HANDLE
        }
    }

    /// Looks up client `h` for an operation from `os_info` the way the resource server does:
    /// unknown handle → the lookup status; a client of another file → `NV_ERR_INVALID_CLIENT`
    /// (`rmclientValidate` with the strict client check the driver enables by default).
    pub(crate) fn client_for(&self, h: u32, os_info: i32) -> Result<&Client, u32> {
        let c = self
            .clients
            .get(&h)
            .ok_or_else(|| self.unknown_client_status(h))?;
        if c.os_info != os_info {
            return Err(NV_ERR_INVALID_CLIENT);
        }
        Ok(c)
    }

    /// The class of `h_object` in client `h_client` (the client's class for its own handle).
    pub(crate) fn class_of(&self, h_client: u32, h_object: u32) -> Option<u32> {
        self.clients.get(&h_client)?.class_of(h_object)
    }

    fn new_client_handle(&mut self) -> Option<u32> {
        for _ in 0..RS_CLIENT_HANDLE_BUCKET_COUNT {
            let idx = self.client_index;
            self.client_index = (self.client_index + 1) % RS_CLIENT_HANDLE_MAX;
            let mut h = RS_CLIENT_HANDLE_BASE | idx;
            while self.clients.contains_key(&h) {
                h = h.wrapping_add(RS_CLIENT_HANDLE_BUCKET_COUNT);
            }
            if h & !(RS_CLIENT_HANDLE_MAX - 1) == RS_CLIENT_HANDLE_BASE {
                return Some(h);
            }
        }
        None
    }

    /// `NV_ESC_RM_ALLOC` after the escape's checks. Returns the status and the new handle.
    pub(crate) fn alloc(&mut self, drv: &SimDriver, mut a: AllocArgs<'_>) -> (u32, u32) {
        // serverAllocApiCopyIn: the class decides the param size (paramsSize is ignored).
        let Some((psize, required)) = class_params(drv, a.class) else {
            return (NV_ERR_INVALID_CLASS, a.h_new);
        };
        if let Some(p) = a.params.as_deref() {
            if p.len() < psize {
                return (NV_ERR_INVALID_ADDRESS, a.h_new);
            }
        } else if required {
            return (NV_ERR_INVALID_ARGUMENT, a.h_new);
        }
        if is_root_class(a.class) {
            return self.alloc_client(a.h_client, a.class, a.os_info, a.h_new);
        }
        // serverAllocResource: the client, and the strict check that it is this file's.
        let status = match self.client_for(a.h_client, a.os_info) {
            Ok(_) => NV_OK,
            Err(s) => s,
        };
        if status != NV_OK {
            return (status, a.h_new);
        }
        // serverAllocResourceUnderLock, which starts with _fixupAllocParams for events.
        let mut notifier = None;
        if is_event_class(a.class) {
            let p = a.params.as_deref_mut().expect("required above");
            let mut ev: nvproxy_abi::structs::NV0005_ALLOC_PARAMETERS =
                crate::buf::read(p, 0).expect("size checked");
            if a.class == NV01_EVENT {
                a.class = ev.hClass;
            }
            if !is_event_class(a.class) || a.class == NV01_EVENT {
                return (NV_ERR_INVALID_CLASS, a.h_new);
            }
            ev.hSrcResource = a.h_parent;
            crate::buf::write(p, 0, &ev);
            let notifier_client = if ev.hParentClient == 0 {
                a.h_client
            } else {
                ev.hParentClient
            };
            // The raw hParentClient decides: 0 puts the event under the client as well.
            if ev.hParentClient != a.h_client {
                a.h_parent = a.h_client;
            }
            notifier = Some((notifier_client, ev.hSrcResource, ev.data, ev.notifyIndex));
        }
        if a.h_new == a.h_client {
            return (NV_ERR_INVALID_OBJECT_PARENT, a.h_new);
        }
        // The parent's class and the new handle under one lookup of the client.
        let c = self.clients.get_mut(&a.h_client).expect("checked above");
        let Some(parent_class) = c.class_of(a.h_parent) else {
            return (NV_ERR_OBJECT_NOT_FOUND, a.h_new);
        };
        let parent_ok = match a.class {
            NV01_DEVICE_0 => is_root_class(parent_class),
            NV20_SUBDEVICE_0 | NV01_MEMORY_SYSTEM => parent_class == NV01_DEVICE_0,
            HOPPER_USERMODE_A => parent_class == NV20_SUBDEVICE_0,
            NV_CONFIDENTIAL_COMPUTE => is_root_class(parent_class),
            NV01_MEMORY_LOCAL_USER
            | NV_MEMORY_EXTENDED_USER
            | FERMI_VASPACE_A
            | NV50_MEMORY_VIRTUAL => matches!(parent_class, NV01_DEVICE_0 | NV20_SUBDEVICE_0),
            KEPLER_CHANNEL_GROUP_A => parent_class == NV01_DEVICE_0,
            FERMI_CONTEXT_SHARE_A => parent_class == KEPLER_CHANNEL_GROUP_A,
            crate::channel::HOPPER_CHANNEL_GPFIFO_A => {
                matches!(parent_class, NV01_DEVICE_0 | KEPLER_CHANNEL_GROUP_A)
            }
            crate::channel::HOPPER_COMPUTE_A | crate::channel::HOPPER_DMA_COPY_A => {
                parent_class == crate::channel::HOPPER_CHANNEL_GPFIFO_A
            }
            GT200_DEBUGGER => parent_class == NV01_DEVICE_0,
            _ => true, // events: RS_ANY_PARENT
        };
        if !parent_ok {
            return (NV_ERR_INVALID_OBJECT_PARENT, a.h_new);
        }
        let h_new = match c.assign_handle(a.h_new) {
            Ok(h) => h,
            Err(s) => return (s, a.h_new),
        };
        let kind = match self.construct(drv, h_new, &mut a, notifier) {
            Ok(k) => k,
            Err(s) => return (s, a.h_new),
        };
        let client = self.clients.get_mut(&a.h_client).expect("checked above");
        client.insert_object(
            h_new,
            Object {
                class: a.class,
                parent: a.h_parent,
                kind,
            },
        );
        (NV_OK, h_new)
    }

    fn alloc_client(&mut self, h_root: u32, class: u32, os_info: i32, h_new: u32) -> (u32, u32) {
        let h = if h_root == 0 {
            match self.new_client_handle() {
                Some(h) => h,
                None => return (NV_ERR_INSUFFICIENT_RESOURCES, h_new),
            }
        } else if self.clients.contains_key(&h_root) {
            return (NV_ERR_INSERT_DUPLICATE_NAME, h_new);
        } else {
            h_root
        };
        self.clients.insert(h, Client::new(h, os_info, class));
        (NV_OK, h)
    }

    /// `clientAssignResourceHandle`: 0 → a driver-chosen handle; the client's own handle →
    /// `NV_ERR_INVALID_OBJECT_HANDLE`; a used one → `NV_ERR_INSERT_DUPLICATE_NAME`.
    pub(crate) fn assign_handle(&mut self, h_client: u32, h: u32) -> Result<u32, u32> {
        self.clients
            .get_mut(&h_client)
            .ok_or(NV_ERR_INVALID_CLIENT)?
            .assign_handle(h)
    }

    /// The GPU an object (device, subdevice, memory, VA space) belongs to.
    pub(crate) fn gpu_of(&self, h_client: u32, h: u32) -> Option<usize> {
        let o = self.clients.get(&h_client)?.objects().get(&h)?;
        match o.kind {
            Kind::Device { gpu, .. }
            | Kind::Subdevice { gpu, .. }
            | Kind::VaSpace { gpu, .. }
            | Kind::ChannelGroup { gpu, .. } => Some(gpu),
            Kind::CtxShare { tsg, .. } => self.fifo.tsgs.get(&tsg).map(|t| t.gpu),
            Kind::Channel { id, .. } | Kind::EngineObject { channel: id } => {
                self.fifo.channels.get(&id).map(|c| c.gpu)
            }
            Kind::VirtMem { id, .. } => self.vaspaces.get(&id).map(|v| v.gpu),
            Kind::Memory { block } => self.blocks.get(&block).map(|b| b.gpu),
            Kind::Debugger { gpu, .. } => Some(gpu),
            Kind::Event { .. } | Kind::ConfCompute => None,
        }
    }

    /// The class constructors.
    fn construct(
        &mut self,
        drv: &SimDriver,
        h_new: u32,
        a: &mut AllocArgs<'_>,
        notifier: Option<(u32, u32, u64, u32)>,
    ) -> Result<Kind, u32> {
        match a.class {
            KEPLER_CHANNEL_GROUP_A => {
                let id = self.next_block;
                self.next_block += 1;
                self.construct_tsg(id, a)
            }
            FERMI_CONTEXT_SHARE_A => self.construct_ctxshare(a),
            crate::channel::HOPPER_CHANNEL_GPFIFO_A => {
                let id = self.next_block;
                self.next_block += 1;
                let kind = self.construct_channel(drv, id, a)?;
                crate::gpfifo::ensure_watcher(drv);
                Ok(kind)
            }
            crate::channel::HOPPER_COMPUTE_A | crate::channel::HOPPER_DMA_COPY_A => {
                self.construct_engine_object(h_new, a)
            }
            NV01_DEVICE_0 => {
                let (inst, flags, va_start, va_limit, va_mode) = match a.params.as_deref() {
                    None => (0, 0, 0, 0, 0),
                    Some(p) => {
                        let d: nvproxy_abi::structs::NV0080_ALLOC_PARAMETERS =
                            crate::buf::read(p, 0).ok_or(NV_ERR_INVALID_ADDRESS)?;
                        (
                            d.deviceId,
                            d.flags,
                            d.vaStartInternal,
                            d.vaLimitInternal,
                            d.vaMode,
                        )
                    }
                };
                // NV_DEVICE_ALLOCATION_FLAGS_RESTRICT_RESERVED_VALIMITS
                if flags & 0x800 != 0 && (va_limit < va_start || va_limit == 0) {
                    return Err(NV_ERR_INVALID_ARGUMENT);
                }
                let gpu = inst as usize;
                if inst >= NV_MAX_DEVICES
                    || gpu >= drv.config.gpus.len()
                    || !drv.gpu_attached(self, gpu)
                {
                    return Err(NV_ERR_INVALID_CLASS);
                }
                if self.clients[&a.h_client].has_device(gpu) {
                    return Err(NV_ERR_INSUFFICIENT_RESOURCES);
                }
                if !drv.gpu_accessible(self, gpu) {
                    return Err(NV_ERR_INSUFFICIENT_PERMISSIONS);
                }
                Ok(Kind::Device {
                    gpu,
                    va_mode,
                    cuda_limit_refs: 0,
                })
            }
            NV20_SUBDEVICE_0 => {
                let inst = match a.params.as_deref() {
                    None => 0,
                    Some(p) => crate::buf::read::<u32>(p, 0).ok_or(NV_ERR_INVALID_ADDRESS)?,
                };
                if inst >= NV2080_MAX_SUBDEVICES || inst != 0 {
                    // One GPU per device: only subdevice instance 0 exists.
                    return Err(NV_ERR_INVALID_CLASS);
                }
                let gpu = self
                    .gpu_of(a.h_client, a.h_parent)
                    .ok_or(NV_ERR_INVALID_CLASS)?;
                // The device's children, not the client's whole table.
                let c = &self.clients[&a.h_client];
                let dup = c.dependants(a.h_parent).any(|h| {
                    c.objects().get(&h).is_some_and(|o| {
                        o.parent == a.h_parent
                            && matches!(o.kind, Kind::Subdevice { inst: i, .. } if i == inst)
                    })
                });
                if dup {
                    return Err(NV_ERR_INSUFFICIENT_RESOURCES);
                }
                Ok(Kind::Subdevice { gpu, inst })
            }
            NV01_MEMORY_SYSTEM | NV01_MEMORY_LOCAL_USER => {
                let gpu = self
                    .gpu_of(a.h_client, a.h_parent)
                    .ok_or(NV_ERR_INVALID_OBJECT_PARENT)?;
                let p = a.params.as_deref().ok_or(NV_ERR_INVALID_ARGUMENT)?;
                let mp: nvproxy_abi::structs::NV_MEMORY_ALLOCATION_PARAMS =
                    crate::buf::read(p, 0).ok_or(NV_ERR_INVALID_ADDRESS)?;
                if mp.size == 0 {
                    return Err(NV_ERR_INVALID_ARGUMENT);
                }
                let video = a.class == NV01_MEMORY_LOCAL_USER;
                let id = self.next_block;
                // vidmemConstruct: pages from the GPU's books, or the allocator's
                // NV_ERR_NO_MEMORY (fb.rs); sysmemConstruct: the host's pages (sysmem.rs).
                let (bytes, attr, offset) = if video {
                    let bytes = mp
                        .size
                        .checked_next_multiple_of(crate::fb::FB_PAGE)
                        .ok_or(NV_ERR_NO_MEMORY)?;
                    let total = drv.config.gpus[gpu].memory_bytes;
                    let p = self.gpus[gpu].fb.alloc(total, bytes, id, mp.attr);
                    let p = p.ok_or(NV_ERR_NO_MEMORY)?;
                    (bytes, p.attr, p.offset)
                } else {
                    let total = drv.config.host_memory_bytes;
                    let o = crate::sysmem::obtain(mp.size, mp.attr, self.host_pages_bytes, total)?;
                    self.host_pages_bytes += o.bytes;
                    (o.bytes, o.attr, mp.offset)
                };
                self.next_block += 1;
                self.blocks.insert(
                    id,
                    MemBlock {
                        gpu,
                        bytes,
                        video,
                        regs: false,
                        host_pages: !video,
                        refs: 1,
                    },
                );
                // Report what was allocated, as the driver does in the params it copies out.
                if let Some(p) = a.params.as_deref_mut() {
                    let mut out = mp;
                    out.size = bytes;
                    out.limit = bytes - 1;
                    out.offset = offset;
                    out.attr = attr;
                    crate::buf::write(p, 0, &out);
                }
                Ok(Kind::Memory { block: id })
            }
            // egmmemConstruct → egmmemValidateParams (egm_mem.c): the simulated GPUs are not
            // self-hosted and have no local EGM, which it answers NV_ERR_INVALID_ARGUMENT.
            NV_MEMORY_EXTENDED_USER => {
                let p = a.params.as_deref().ok_or(NV_ERR_INVALID_ARGUMENT)?;
                crate::buf::read::<nvproxy_abi::structs::NV_MEMORY_ALLOCATION_PARAMS>(p, 0)
                    .ok_or(NV_ERR_INVALID_ADDRESS)?;
                Err(NV_ERR_INVALID_ARGUMENT)
            }
            // confComputeApiConstruct: points at the GPU manager's CC caps; nothing can fail.
            NV_CONFIDENTIAL_COMPUTE => Ok(Kind::ConfCompute),
            GT200_DEBUGGER => self.construct_debugger(a),
            HOPPER_USERMODE_A => {
                // usrmodeConstruct: bBar1Mapping picks the BAR1 alias of the page, bPriv the
                // privileged page, which needs BAR1 and a kernel caller.
                let (bar1, privileged) = match a.params.as_deref() {
                    None => (false, false),
                    Some(p) => (p[0] != 0, p[1] != 0),
                };
                if privileged && !bar1 {
                    return Err(NV_ERR_INVALID_PARAMETER);
                }
                if privileged {
                    return Err(NV_ERR_INSUFFICIENT_PERMISSIONS);
                }
                let gpu = self
                    .gpu_of(a.h_client, a.h_parent)
                    .ok_or(NV_ERR_INVALID_OBJECT_PARENT)?;
                let id = self.next_block;
                self.next_block += 1;
                self.blocks.insert(
                    id,
                    MemBlock {
                        gpu,
                        bytes: USERMODE_BYTES,
                        video: false,
                        regs: true,
                        host_pages: false,
                        refs: 1,
                    },
                );
                Ok(Kind::Memory { block: id })
            }
            FERMI_VASPACE_A => {
                let gpu = self
                    .gpu_of(a.h_client, a.h_parent)
                    .ok_or(NV_ERR_INVALID_OBJECT_PARENT)?;
                // NV_VASPACE_ALLOCATION_PARAMETERS: vaSize at 8, vaBase at 40 (both in/out).
                let p = a.params.as_deref_mut().ok_or(NV_ERR_INVALID_ARGUMENT)?;
                let size: u64 = crate::buf::read(p, 8).ok_or(NV_ERR_INVALID_ADDRESS)?;
                let base: u64 = crate::buf::read(p, 40).ok_or(NV_ERR_INVALID_ADDRESS)?;
                let vas = crate::vaspace::VaSpace::new(gpu, base, size)?;
                crate::buf::write(p, 40, &vas.start);
                crate::buf::write(p, 8, &(vas.limit + 1));
                let id = self.next_block;
                self.next_block += 1;
                self.vaspaces.insert(id, vas);
                Ok(Kind::VaSpace { gpu, id })
            }
            NV50_MEMORY_VIRTUAL => {
                let gpu = self
                    .gpu_of(a.h_client, a.h_parent)
                    .ok_or(NV_ERR_INVALID_OBJECT_PARENT)?;
                let p = a.params.as_deref_mut().ok_or(NV_ERR_INVALID_ARGUMENT)?;
                let mut mp: nvproxy_abi::structs::NV_MEMORY_ALLOCATION_PARAMS =
                    crate::buf::read(p, 0).ok_or(NV_ERR_INVALID_ADDRESS)?;
                if mp.flags & crate::vaspace::FLAGS_VIRTUAL == 0 {
                    return Err(NV_ERR_INVALID_ARGUMENT);
                }
                if mp.hVASpace == 0 {
                    // The device's default VA space is not simulated.
                    return Err(NV_ERR_NOT_SUPPORTED);
                }
                let id = match self.clients[&a.h_client].objects().get(&mp.hVASpace) {
                    None => return Err(NV_ERR_OBJECT_NOT_FOUND),
                    Some(o) => match o.kind {
                        Kind::VaSpace { gpu: g, id } if g == gpu => id,
                        _ => return Err(NV_ERR_INVALID_OBJECT_HANDLE),
                    },
                };
                let vas = self
                    .vaspaces
                    .get_mut(&id)
                    .expect("a VA space object's state");
                let (addr, size) = vas.reserve(mp.flags, mp.size, mp.alignment, mp.offset)?;
                mp.offset = addr;
                mp.size = size;
                mp.limit = size - 1;
                crate::buf::write(p, 0, &mp);
                Ok(Kind::VirtMem {
                    id,
                    vas_handle: mp.hVASpace,
                    addr,
                })
            }
            NV01_EVENT_KERNEL_CALLBACK | NV01_EVENT_KERNEL_CALLBACK_EX => {
                // eventConstruct: never from user space.
                Err(NV_ERR_ILLEGAL_ACTION)
            }
            NV01_EVENT_OS_EVENT => {
                let (nclient, nres, data, index) = notifier.expect("events carry a notifier");
                let nc = self.clients.get(&nclient).ok_or(NV_ERR_INVALID_CLIENT)?;
                let is_notifier = if nres == nclient {
                    true
                } else {
                    // eventConstruct: the source must be a Notifier (device, subdevice, a
                    // channel, a channel descendant such as an engine object, an SM debugger
                    // session); a TSG or memory is not.
                    nc.objects().get(&nres).is_some_and(|o| {
                        matches!(
                            o.kind,
                            Kind::Device { .. }
                                | Kind::Subdevice { .. }
                                | Kind::Channel { .. }
                                | Kind::EngineObject { .. }
                                | Kind::Debugger { .. }
                        )
                    })
                };
                if !is_notifier {
                    return Err(NV_ERR_INVALID_OBJECT);
                }
                // osUserHandleToKernelPtr: the fd must have an OS event for this client.
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "the driver does the same: NvU32 fd = (NvU64)hEvent"
                )]
                let fd = data as u32;
                let ev = self
                    .os_events
                    .iter_mut()
                    .find(|e| e.active && e.fd == fd && e.h_parent == a.h_client)
                    .ok_or(NV_ERR_OBJECT_NOT_FOUND)?;
                ev.refcount += 1;
                Ok(Kind::Event {
                    os_event: ev.id,
                    src: (nclient, nres),
                    index,
                })
            }
            _ => Err(NV_ERR_INVALID_CLASS),
        }
    }

    /// Releases what object `h` holds.
    fn destroy(&mut self, h: u32, kind: &Kind) {
        match *kind {
            Kind::ChannelGroup { .. }
            | Kind::CtxShare { .. }
            | Kind::Channel { .. }
            | Kind::EngineObject { .. } => self.destroy_fifo(h, kind),
            Kind::Memory { block } => {
                let gone = match self.blocks.get_mut(&block) {
                    Some(b) => {
                        b.refs -= 1;
                        b.refs == 0
                    }
                    None => false,
                };
                if gone {
                    let b = self.blocks.remove(&block).expect("present");
                    self.mem.block_freed(block);
                    if b.host_pages {
                        self.host_pages_bytes -= b.bytes;
                    }
                    if b.video {
                        self.gpus[b.gpu].fb.release(block);
                    }
                }
            }
            Kind::VaSpace { id, .. } => {
                let gone = self.vaspaces.get_mut(&id).is_some_and(|v| {
                    v.refs -= 1;
                    v.refs == 0
                });
                if gone {
                    self.vaspaces.remove(&id);
                }
            }
            Kind::VirtMem { id, addr, .. } => {
                if let Some(v) = self.vaspaces.get_mut(&id) {
                    v.release(addr);
                }
            }
            Kind::Event { os_event, .. } => {
                if let Some(i) = self.os_events.iter().position(|e| e.id == os_event) {
                    let e = &mut self.os_events[i];
                    e.refcount -= 1;
                    if !e.active && e.refcount == 0 {
                        self.os_events.remove(i);
                    }
                }
            }
            _ => {}
        }
    }

    /// Frees `h` of client `h_client` and everything under it, children first.
    fn free_subtree(&mut self, h_client: u32, h: u32) {
        // The children, and the dependants (refAddDependant): virtual memory in a VA space.
        let children: Vec<u32> = self.clients[&h_client].dependants(h).collect();
        for c in children {
            self.free_subtree(h_client, c);
        }
        if let Some(o) = self
            .clients
            .get_mut(&h_client)
            .and_then(|c| c.remove_object(h))
        {
            self.removed(h_client, h, &o);
        }
    }

    /// Object `h` of `h_client` left its client's table: its destructor.
    fn removed(&mut self, h_client: u32, h: u32, o: &Object) {
        // subdevicePreDestruct: the client's compute-mode reservation goes with it.
        if let Kind::Subdevice { gpu, .. } = o.kind
            && self.gpus[gpu].compute_reservation == Some(h_client)
        {
            self.gpus[gpu].compute_reservation = None;
        }
        self.destroy(h, &o.kind);
    }

    /// Frees client `h` with all its objects.
    pub(crate) fn free_client(&mut self, _drv: &SimDriver, h: u32) {
        let tops: Vec<u32> = match self.clients.get(&h) {
            // Its top-level objects (a client's own handle has no edges; this free takes
            // every object anyway).
            Some(c) => c
                .objects()
                .iter()
                .filter(|(_, o)| o.parent == h)
                .map(|(&k, _)| k)
                .collect(),
            None => return,
        };
        for t in tops {
            self.free_subtree(h, t);
        }
        // Objects whose parent vanished cannot exist, but never leak them.
        if let Some(c) = self.clients.remove(&h) {
            for (h, o) in c.into_objects() {
                self.destroy(h, &o.kind);
            }
        }
    }

    /// `NV_ESC_RM_FREE` (`serverFreeResourceTree`). Unknown objects of a known client are a
    /// no-op with `NV_OK` (the driver is built with `RS_COMPATABILITY_MODE`).
    pub(crate) fn free(
        &mut self,
        drv: &SimDriver,
        h_client: u32,
        h_object: u32,
        os_info: i32,
    ) -> u32 {
        // client_for, with the client kept for a leaf's free (most frees).
        let c = match self.clients.get_mut(&h_client) {
            Some(c) if c.os_info == os_info => c,
            Some(_) => return NV_ERR_INVALID_CLIENT,
            None => return self.unknown_client_status(h_client),
        };
        if h_object != h_client && c.is_leaf(h_object) {
            if let Some(o) = c.remove_object(h_object) {
                self.removed(h_client, h_object, &o);
            }
            return NV_OK;
        }
        if h_object == h_client {
            self.free_client(drv, h_client);
            // rm_client_free_os_events, done by the escape after a successful client free.
            self.os_events.retain_mut(|e| {
                if e.h_parent == h_client {
                    e.active = false;
                }
                e.active || e.refcount > 0
            });
            return NV_OK;
        }
        if self.clients[&h_client].objects().contains_key(&h_object) {
            self.free_subtree(h_client, h_object);
        }
        NV_OK
    }

    /// `NV_ESC_RM_DUP_OBJECT` (`serverCopyResource`, `clientCopyResource`). Returns the
    /// status and the destination handle.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dup(
        &mut self,
        h_client: u32,
        h_parent: u32,
        h_object: u32,
        h_client_src: u32,
        h_object_src: u32,
        os_info: i32,
    ) -> (u32, u32) {
        // _serverLockDualClientWithLockInfo: in handle order.
        let (first, second) = if h_client <= h_client_src {
            (h_client, h_client_src)
        } else {
            (h_client_src, h_client)
        };
        for h in [first, second] {
            if !self.clients.contains_key(&h) {
                return (self.unknown_client_status(h), h_object);
            }
        }
        if let Err(s) = self.client_for(h_client, os_info) {
            return (s, h_object);
        }
        let (src_kind, src_class) = if h_object_src == h_client_src {
            return (NV_ERR_INVALID_ARGUMENT, h_object); // a client cannot be copied
        } else {
            match self.clients[&h_client_src].objects().get(&h_object_src) {
                Some(o) => (o.kind.clone(), o.class),
                None => return (NV_ERR_OBJECT_NOT_FOUND, h_object),
            }
        };
        // resCanCopy: memory and VA spaces can be duplicated; devices, subdevices, events not.
        if !matches!(src_kind, Kind::Memory { .. } | Kind::VaSpace { .. }) {
            return (NV_ERR_INVALID_ARGUMENT, h_object);
        }
        let h_new = match self.assign_handle(h_client, h_object) {
            Ok(h) => h,
            Err(s) => return (s, h_object),
        };
        let parent_gpu = match self.clients[&h_client].objects().get(&h_parent) {
            Some(o) => match o.kind {
                Kind::Device { gpu, .. } | Kind::Subdevice { gpu, .. } => Some(gpu),
                _ => None,
            },
            None if h_parent == h_client => None,
            None => return (NV_ERR_OBJECT_NOT_FOUND, h_object),
        };
        let src_gpu = self.gpu_of(h_client_src, h_object_src);
        if parent_gpu.is_none() || parent_gpu != src_gpu {
            return (NV_ERR_INVALID_OBJECT_PARENT, h_object);
        }
        // Access: the owner has every right; other clients of the same process get
        // RS_ACCESS_DUP_OBJECT from the default RS_SHARE_TYPE_PID policy, and every client of a
        // simulated driver belongs to the one daemon process.
        match src_kind {
            Kind::Memory { block } => {
                if let Some(b) = self.blocks.get_mut(&block) {
                    b.refs += 1;
                }
            }
            Kind::VaSpace { id, .. } => {
                if let Some(v) = self.vaspaces.get_mut(&id) {
                    v.refs += 1;
                }
            }
            _ => {}
        }
        // Through the client's index: the copy is freed with its parent like any child.
        self.clients
            .get_mut(&h_client)
            .expect("checked above")
            .insert_object(
                h_new,
                Object {
                    class: src_class,
                    parent: h_parent,
                    kind: src_kind,
                },
            );
        (NV_OK, h_new)
    }

    /// `NV_ESC_RM_SHARE` (`serverShareResourceAccess`): checks the policy and the handles.
    /// Policies are not recorded: every client of a simulated driver is one process, which the
    /// default policy already lets duplicate.
    pub(crate) fn share(
        &mut self,
        h_client: u32,
        h_object: u32,
        share_type: u16,
        target: u32,
        os_info: i32,
    ) -> u32 {
        if share_type >= RS_SHARE_TYPE_MAX {
            return NV_ERR_INVALID_ARGUMENT;
        }
        if share_type == RS_SHARE_TYPE_CLIENT {
            let (first, second) = if h_client <= target {
                (h_client, target)
            } else {
                (target, h_client)
            };
            for h in [first, second] {
                if !self.clients.contains_key(&h) {
                    return self.unknown_client_status(h);
                }
            }
        } else if let Err(s) = self.client_for(h_client, os_info) {
            return s;
        }
        if self.class_of(h_client, h_object).is_none() {
            return NV_ERR_OBJECT_NOT_FOUND;
        }
        NV_OK
    }
}

impl State {
    /// `ksmdbgssnConstruct`: `hDebuggerClient_Obsolete` must be 0 (`NV_ERR_INVALID_ARGUMENT`);
    /// `hAppClient` 0 is the caller's client, an unknown one `NV_ERR_INVALID_CLIENT`; the
    /// debugged object `hClass3dObject` must exist in it (`NV_ERR_INVALID_OBJECT_PARENT`) and
    /// be a graphics/compute object (`NV_ERR_INVALID_OBJECT`) of the device's GPU
    /// (`NV_ERR_INVALID_ARGUMENT`), and the app client needs a subdevice of that GPU
    /// (`subdeviceGetByGpu`: `NV_ERR_OBJECT_NOT_FOUND`). The rights check: the kernel driver
    /// (not GSP, not a vGPU host) requires `RS_ACCESS_DEBUG` on the object, which its owner
    /// client has and no other client is given here (`RmShare` of debug rights is not
    /// simulated): another client's object `NV_ERR_INSUFFICIENT_PERMISSIONS`. The session
    /// records nothing else: the SMs it would debug are not simulated.
    fn construct_debugger(&mut self, a: &AllocArgs<'_>) -> Result<Kind, u32> {
        let p = a.params.as_deref().ok_or(NV_ERR_INVALID_ARGUMENT)?;
        let word = |i: usize| crate::buf::read::<u32>(p, i * 4).unwrap_or(0);
        let (obsolete, app, h_object) = (word(0), word(1), word(2));
        if obsolete != 0 {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        let app = if app == 0 { a.h_client } else { app };
        let client = self.clients.get(&app).ok_or(NV_ERR_INVALID_CLIENT)?;
        let obj = client
            .objects()
            .get(&h_object)
            .ok_or(NV_ERR_INVALID_OBJECT_PARENT)?;
        if app != a.h_client {
            return Err(NV_ERR_INSUFFICIENT_PERMISSIONS);
        }
        if obj.class != crate::channel::HOPPER_COMPUTE_A {
            return Err(NV_ERR_INVALID_OBJECT);
        }
        let gpu = self
            .gpu_of(a.h_client, a.h_parent)
            .ok_or(NV_ERR_INVALID_OBJECT_PARENT)?;
        if self.gpu_of(app, h_object) != Some(gpu) {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        let has_subdevice = self.clients[&app]
            .objects()
            .values()
            .any(|o| matches!(o.kind, Kind::Subdevice { gpu: g, .. } if g == gpu));
        if !has_subdevice {
            return Err(NV_ERR_OBJECT_NOT_FOUND);
        }
        Ok(Kind::Debugger { gpu, h_object })
    }
}
