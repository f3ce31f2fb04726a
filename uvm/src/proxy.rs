//! [`UvmProxy`]: one instance's request path for `/dev/nvidia-uvm`.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use std::mem::offset_of;

use ioctl_proxy::bytes::{rd32, read_prefix, uuid_at};
use ioctl_proxy::kit::{Note, Stop, deny};
use ioctl_proxy::service::{Call, NodeService, settle};
use ioctl_proxy::{
    AuditEvent, Caller, ClientMemory, Decision, FdError, FdResolver, HostFile, Kind, MemError,
    Node, NodeKind, OpenId, Plan, Proxy, ProxyError,
};
use nvproxy_abi::fd_field;
use nvproxy_abi::ioctl::{
    UVM_FREE, UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE, UVM_INITIALIZE,
    UVM_MAP_EXTERNAL_ALLOCATION, UVM_MM_INITIALIZE,
};
use nvproxy_abi::structs::{
    UVM_FREE_PARAMS, UVM_FREE_PARAMS_V590, UVM_INITIALIZE_PARAMS,
    UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550,
    UVM_MM_INITIALIZE_PARAMS,
};
use tracing::debug;

use crate::layout::{Fields, UuidRule, fields};
use crate::nv::*;

/// Where `UVM_INITIALIZE` has its flags and `UVM_MM_INITIALIZE` its fd.
const INIT_FLAGS: usize = offset_of!(UVM_INITIALIZE_PARAMS, flags);
const UVM_FD: usize = offset_of!(UVM_MM_INITIALIZE_PARAMS, uvmFd);

/// Where `UVM_MAP_EXTERNAL_ALLOCATION` has its `base`, in both layouts (32 and 256 GPUs).
const EXT_BASE: usize = offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, base);
const _: () = assert!(EXT_BASE == offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550, base));

/// The node name in audit events.
const NODE: Node = Node::Uvm;

/// One client open of `/dev/nvidia-uvm`: its own host UVM file (the driver's va_space is the
/// open file).
#[derive(Debug)]
pub struct UvmOpen {
    pub(crate) host: Arc<dyn HostFile>,
    /// What a replay re-creates, and what it cannot (`replay.rs`).
    pub(crate) record: Mutex<crate::replay::UvmRecord>,
}

/// The opens fd fields of a call resolved to.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Resolved {
    /// `rmCtrlFd`'s frontend open.
    pub(crate) rm_ctrl: Option<OpenId>,
    /// `UVM_MM_INITIALIZE.uvmFd`'s UVM open.
    pub(crate) uvm_fd: Option<OpenId>,
}

/// One instance's `/dev/nvidia-uvm` request path, next to its frontend [`Proxy`].
///
/// It shares the frontend's policy (capabilities, admin lists, mode, `uvm_mmap`), audit sink
/// and counts, open-id space and RM object table: `rmCtrlFd` must name one of the instance's
/// frontend opens, RM handles in UVM params must be the instance's, and GPU UUIDs must be
/// those of the instance's GPUs, learned from the host driver when the proxy is built.
pub struct UvmProxy {
    pub(crate) proxy: Arc<Proxy>,
    pub(crate) uuids: Vec<[u8; 16]>,
    pub(crate) opens: Mutex<HashMap<OpenId, Arc<UvmOpen>>>,
}

impl fmt::Debug for UvmProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UvmProxy")
            .field("instance", &self.proxy.policy().name)
            .field("gpus", &self.uuids.len())
            .finish_non_exhaustive()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn mem_err(e: MemError) -> ProxyError {
    ioctl_proxy::kit::top_err(e)
}

impl UvmProxy {
    /// The UVM proxy of `proxy`'s instance. Asks the host driver for the instance's GPU
    /// UUIDs ([`Proxy::query_gpu_uuids`]).
    pub fn new(proxy: Arc<Proxy>) -> Result<Self, ProxyError> {
        let uuids = proxy.query_gpu_uuids()?;
        Ok(Self::with_gpu_uuids(proxy, uuids))
    }

    /// The UVM proxy of `proxy`'s instance with the GPU UUIDs given (tests, or a daemon that
    /// learned them otherwise).
    pub fn with_gpu_uuids(proxy: Arc<Proxy>, uuids: Vec<[u8; 16]>) -> Self {
        UvmProxy {
            proxy,
            uuids,
            opens: Mutex::new(HashMap::new()),
        }
    }

    /// The frontend proxy of the instance.
    pub fn frontend(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    /// The instance's GPU UUIDs, in the tenant's order.
    pub fn gpu_uuids(&self) -> &[[u8; 16]] {
        &self.uuids
    }

    /// Number of client opens alive.
    pub fn open_count(&self) -> usize {
        lock(&self.opens).len()
    }

    /// A client opened `/dev/nvidia-uvm`: opens a host UVM file for it. The id comes from the
    /// frontend's open-id space ([`Proxy::new_open_id`]).
    pub fn open(&self) -> Result<OpenId, ProxyError> {
        let host = self.proxy.open_host(NodeKind::Uvm)?;
        let id = self.proxy.new_open_id();
        lock(&self.opens).insert(
            id,
            Arc::new(UvmOpen {
                host,
                record: Mutex::default(),
            }),
        );
        debug!(instance = %self.proxy.policy().name, open = id.0, "uvm open");
        Ok(id)
    }

    /// The last reference to the client's open is gone: drops the host UVM file (the driver
    /// destroys the va_space when the last reference to it goes, which includes the
    /// mappings and fds the tenant holds).
    pub fn release(&self, open: OpenId) {
        let file = lock(&self.opens).remove(&open);
        if file.is_some() {
            self.proxy.release_open_slot();
        }
        // The va_space goes with the file, and with it UVM's references to RM memory.
        self.proxy.vid_release_holds(open);
        debug!(instance = %self.proxy.policy().name, open = open.0, "uvm release");
        drop(file);
    }

    /// Releases every UVM open still held (see `Proxy::release_all`). Returns how many.
    pub fn release_all(&self) -> usize {
        let ids: Vec<OpenId> = lock(&self.opens).keys().copied().collect();
        for &id in &ids {
            self.release(id);
        }
        ids.len()
    }

    /// Whether `open` is one of this proxy's UVM opens.
    pub fn is_open(&self, open: OpenId) -> bool {
        lock(&self.opens).contains_key(&open)
    }

    /// The host UVM file of an open (for the daemon's mmap path and tests).
    pub fn host_file(&self, open: OpenId) -> Option<Arc<dyn HostFile>> {
        lock(&self.opens).get(&open).map(|o| o.host.clone())
    }

    /// The fd the client maps for an `mmap` of its open, and the offset to add (0: UVM
    /// requires offset == VA): the host UVM file's [`HostFile::mmap_fd`]. With the
    /// instance's `uvm_mmap` switch off this fails with `ENODEV` (CUSE's own answer to mmap)
    /// and an audit event; an unknown open is `EBADF`.
    pub fn mmap_fd(&self, caller: &Caller, open: OpenId) -> io::Result<(OwnedFd, u64)> {
        let file = lock(&self.opens)
            .get(&open)
            .cloned()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        if !self.proxy.policy().uvm_mmap {
            self.proxy
                .counts()
                .add(Kind::Uvm, "mmap", 0, Decision::Denied);
            self.proxy.audit_sink().record(&AuditEvent {
                instance: self.proxy.policy().name.clone(),
                pid: caller.process(),
                tid: caller.tid,
                node: NODE.to_string(),
                kind: Kind::Uvm,
                name: "mmap".into(),
                number: 0,
                decision: Decision::Denied,
                reason: Some("uvm_mmap is off for this instance"),
                nv_status: None,
                errno: Some(libc::ENODEV),
                latency_us: 0,
            });
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        self.proxy
            .counts()
            .add(Kind::Uvm, "mmap", 0, Decision::Allowed);
        lock(&file.record).mapped = true;
        file.host.mmap_fd()
    }

    /// Proxies one ioctl of the client open `open`: [`ioctl_proxy::service::ioctl`], the
    /// nodes' one entry, whose contract it has (driver-level failures are NV statuses in
    /// `rmStatus`; every read and write reservation happens before the host call).
    pub fn ioctl(
        &self,
        open: OpenId,
        caller: &Caller,
        cmd: u32,
        arg: u64,
        mem: &mut dyn ClientMemory,
        fds: &dyn FdResolver,
    ) -> Result<i32, ProxyError> {
        ioctl_proxy::service::ioctl(self, open, caller, cmd, arg, mem, fds)
    }

    /// One ioctl inside the nodes' entry wrapper ([`NodeService::dispatch`]).
    fn handle(&self, file: &UvmOpen, call: Call<'_>, note: &mut Note) -> Result<i32, ProxyError> {
        let Call {
            open,
            cmd,
            arg,
            mem,
            fds,
        } = call;
        let abi = self.proxy.abi();
        let spec = abi.uvm.get(&cmd).copied();
        if let Some(s) = &spec {
            note.name = s.name.into();
        }
        if NEVER_FROM_CLIENTS.contains(&cmd) {
            note.decision = Decision::Denied;
            note.reason = Some("never accepted from clients");
            return Err(ProxyError::UnknownUvm { cmd });
        }
        let Some(spec) = spec else {
            note.decision = Decision::Denied;
            note.reason = Some("unknown UVM ioctl");
            return Err(ProxyError::UnknownUvm { cmd });
        };
        if !note.judged(self.proxy.policy().judge(spec.name, spec.caps)) {
            // Denied entries look absent: the driver's answer to an unknown command.
            return Err(ProxyError::Denied(spec.name));
        }
        let size = spec.param_size as usize;
        if size == 0 {
            // UVM_DEINITIALIZE: no params; the driver returns 0 without reading `arg`.
            return Plan::new(cmd, &[]).exec(&*file.host);
        }
        let Some(fields) = fields(abi, cmd, size) else {
            note.decision = Decision::Denied;
            note.reason = Some("no handler for this UVM ioctl");
            return Err(ProxyError::Unsupported("UVM ioctl has no handler"));
        };
        // All client memory first: the whole struct, in and out (the driver copies it both
        // ways, `__UVM_ROUTE_CMD_STACK`/`_ALLOC` in uvm_api.h).
        // Read and declared for write-back in one go (one retry round, as the frontend); the
        // plan's copy is the one read of the client's bytes.
        let mut top = ioctl_proxy::plan::zeroed_nested(size);
        mem.read_for_update_into(arg, &mut top).map_err(mem_err)?;
        // The client's params as sent, for the records of a successful call.
        let client = top.clone();
        let mut plan = Plan::with_params(cmd, top);
        let forwarded = if cmd == UVM_MAP_EXTERNAL_ALLOCATION && !self.proxy.vid_hold_room(open) {
            // The mapping would hold video memory the books could not follow (vidmem.rs).
            deny(
                NV_ERR_INSUFFICIENT_RESOURCES,
                "external mappings of this UVM file",
            )
        } else {
            self.forward(file, &mut plan, &fields, cmd, fds, note)
        };
        let (ret, resolved) = match forwarded {
            Ok(forwarded) => forwarded,
            Err(stop) => {
                // Refused before the host: the client's own params with the status.
                return settle(note, Err(stop), |status| {
                    plan.set32(None, fields.status, status);
                    mem.write(arg, &plan.into_outputs().0).map_err(mem_err)
                });
            }
        };
        let (out, _) = plan.into_outputs();
        let status = rd32(&out, fields.status);
        note.nv_status = Some(status);
        if ret == 0 && status == NV_OK {
            lock(&file.record).note(spec.name, cmd, &client, resolved);
            self.vid_books(open, cmd, &client, &fields);
        }
        mem.write(arg, &out).map_err(mem_err)?;
        Ok(ret)
    }

    /// After a successful call: UVM's references to RM video memory (`ioctl_proxy` `vidmem.rs`).
    /// `UVM_MAP_EXTERNAL_ALLOCATION` dups the memory into UVM's own RM client
    /// (`uvm_map_external.c`, `nvUvmInterfaceDupMemory`): the memory stays counted, keyed by
    /// the mapping's base, until `UVM_FREE` of a range holding that base (the whole range with
    /// the length of the older layout; from 590, which has none, a mapping at the range's
    /// base) or the UVM file's release. `UVM_UNMAP_EXTERNAL` of one GPU leaves it counted (the
    /// mappings of other GPUs may keep it).
    fn vid_books(&self, open: OpenId, cmd: u32, top: &[u8], fields: &crate::layout::Fields) {
        match cmd {
            UVM_MAP_EXTERNAL_ALLOCATION => {
                let Some(h) = &fields.handles else { return };
                let Some(mem_at) = h.objects[0] else { return };
                let base = ioctl_proxy::bytes::rd64(top, EXT_BASE);
                self.proxy
                    .vid_hold_mapping(open, base, rd32(top, h.client), rd32(top, mem_at));
            }
            UVM_FREE => {
                // {base, length, rmStatus} before 590, {base, rmStatus} since (`fields` took
                // no other size).
                let (base, len) = if top.len() == size_of::<UVM_FREE_PARAMS>() {
                    let p = read_prefix::<UVM_FREE_PARAMS>(top);
                    (p.base, p.length)
                } else {
                    (read_prefix::<UVM_FREE_PARAMS_V590>(top).base, 1)
                };
                self.proxy
                    .vid_unhold_range(open, base, base.saturating_add(len.max(1)));
            }
            _ => {}
        }
    }

    /// Checks the client's params in `plan` and translates them for the host, then calls the
    /// host; `plan` then holds the answer, and gives the client its own fields back.
    fn forward(
        &self,
        file: &UvmOpen,
        plan: &mut Plan,
        f: &Fields,
        cmd: u32,
        fds: &dyn FdResolver,
        note: &mut Note,
    ) -> Result<(i32, Resolved), Stop> {
        let size = plan.buf(None).len();
        let mut resolved = Resolved::default();
        // GPU UUIDs.
        for u in &f.uuids {
            self.check_uuid(plan.buf(None), u.off, u.rule, u.foreign)?;
        }
        if let Some(pg) = f.per_gpu {
            let count = ioctl_proxy::bytes::rd64(plan.buf(None), pg.count);
            if count > pg.max || (pg.zero_invalid && count == 0) {
                // The driver's own first check (uvm_map_external_allocation,
                // uvm_api_alloc_semaphore_pool); answered here because the array cannot be
                // checked past its end.
                return Err(Stop::Status {
                    status: NV_ERR_INVALID_ARGUMENT,
                    decision: Decision::Failed,
                    reason: "gpuAttributesCount out of range",
                });
            }
            let elem = size_of::<nvproxy_abi::structs::UvmGpuMappingAttributes>();
            // Bounded by pg.max above.
            for i in 0..usize::try_from(count).unwrap_or(0) {
                self.check_uuid(
                    plan.buf(None),
                    pg.array + i * elem,
                    UuidRule::Gpu,
                    NV_ERR_INVALID_DEVICE,
                )?;
            }
        }
        // RM handles.
        if let Some(h) = f.handles {
            let top = plan.buf(None);
            let client = rd32(top, h.client);
            let objects: Vec<u32> = h.objects.iter().flatten().map(|&o| rd32(top, o)).collect();
            let skip = h.zero_ok && client == 0 && objects.iter().all(|&o| o == 0);
            if !skip {
                if !self.proxy.has_client(client) {
                    return deny(h.foreign_client, "RM client of another instance or unknown");
                }
                for o in objects {
                    let optional = h.zero_ok && o == 0;
                    if !optional && !self.proxy.owns_object(client, o) {
                        return deny(h.foreign_object, "RM object unknown in this client");
                    }
                }
            }
            // The RM client, as the driver knows it (translated after some restores); the
            // client reads its own handle back.
            plan.rewrite32(None, h.client, self.proxy.host_client(client));
        }
        // rmCtrlFd: a frontend open of this instance, or negative (passed through: the driver
        // never reads the field, Bug 1624521 in uvm_va_space.c / uvm_user_channel.c). The
        // client reads its own fd number back.
        if let Some(off) = f.rm_ctrl_fd {
            let fd = fd_field::from_u32(rd32(plan.buf(None), off));
            let mut host_fd = fd;
            if fd >= 0 {
                let host = match fds.resolve(fd) {
                    Ok(open) => {
                        resolved.rm_ctrl = Some(open);
                        self.proxy.host_file_id(open)
                    }
                    Err(FdError::Foreign) => None,
                    Err(FdError::Errno(e)) => {
                        return Err(Stop::Err(ProxyError::ForeignFd { fd, errno: e }));
                    }
                };
                let Some(host) = host else {
                    // gVisor's answer (uvm.go, uvmIoctlHasRMCtrlFD): EINVAL.
                    note.decision = Decision::Denied;
                    note.reason = Some("rmCtrlFd is not a frontend node of this instance");
                    return Err(Stop::Err(ProxyError::ForeignFd {
                        fd,
                        errno: libc::EINVAL,
                    }));
                };
                host_fd = host;
            }
            plan.rewrite32(None, off, fd_field::to_u32(host_fd));
        }
        // The two commands with their own rules.
        let mut client_flags = None;
        if cmd == UVM_INITIALIZE {
            // Multi-process sharing mode: the worker issues the UVM ioctls, the tenant maps
            // (DESIGN.md section 5); without it the va_space binds to the worker's mm and
            // the tenant's mmap fails (uvm_mmap: -EOPNOTSUPP when the mm differs). Set, not
            // rewritten: the client's flags are the driver's, computed below.
            let flags = plan.get::<UVM_INITIALIZE_PARAMS>(None).flags;
            client_flags = Some(flags);
            plan.set64(
                None,
                INIT_FLAGS,
                flags | UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE,
            );
        } else if cmd == UVM_MM_INITIALIZE {
            let fd = plan.get::<UVM_MM_INITIALIZE_PARAMS>(None).uvmFd;
            let host = match fds.resolve(fd) {
                Ok(open) => {
                    resolved.uvm_fd = Some(open);
                    lock(&self.opens).get(&open).map(|o| o.host.id())
                }
                Err(FdError::Foreign) => None,
                Err(FdError::Errno(e)) => {
                    return Err(Stop::Err(ProxyError::ForeignFd { fd, errno: e }));
                }
            };
            let Some(host) = host else {
                // uvm_api_mm_initialize: fget fails or the file is not nvidia-uvm →
                // NV_ERR_INVALID_ARGUMENT (as gVisor's uvmMMInitialize).
                return deny(
                    NV_ERR_INVALID_ARGUMENT,
                    "uvmFd is not a UVM node of this instance",
                );
            };
            plan.rewrite32(None, UVM_FD, fd_field::to_u32(host));
        }
        let ret = plan.exec(&*file.host)?;
        if plan.buf(None).len() != size {
            return Err(Stop::Err(ProxyError::Host(io::Error::other(
                "host returned params of another size",
            ))));
        }
        if let Some(flags) = client_flags {
            // Hide the forced flag unless the client set it itself.
            let host_flags = plan.get::<UVM_INITIALIZE_PARAMS>(None).flags;
            let shown = host_flags & !(UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE & !flags);
            plan.set64(None, INIT_FLAGS, shown);
        }
        Ok((ret, resolved))
    }

    fn check_uuid(&self, top: &[u8], off: usize, rule: UuidRule, foreign: u32) -> Result<(), Stop> {
        let u = uuid_at(top, off);
        if self.uuids.contains(&u) {
            return Ok(());
        }
        if rule == UuidRule::GpuOrCpu && u == NV_PROCESSOR_UUID_CPU_DEFAULT {
            return Ok(());
        }
        deny(foreign, "GPU UUID outside the instance's set")
    }
}

/// `/dev/nvidia-uvm` as a [`NodeService`] of the instance.
impl NodeService for UvmProxy {
    type File = Arc<UvmOpen>;

    const KIND: Kind = Kind::Uvm;

    fn instance(&self) -> &Proxy {
        &self.proxy
    }

    fn serves(&self, node: Node) -> bool {
        node == NODE
    }

    fn open_node(&self, _node: Node) -> Result<OpenId, ProxyError> {
        self.open()
    }

    fn release_open(&self, open: OpenId) {
        self.release(open);
    }

    fn mmap_fd(&self, caller: &Caller, open: OpenId) -> io::Result<(OwnedFd, u64)> {
        UvmProxy::mmap_fd(self, caller, open)
    }

    fn file(&self, open: OpenId) -> Option<Arc<UvmOpen>> {
        lock(&self.opens).get(&open).cloned()
    }

    fn node(&self, _file: &Arc<UvmOpen>) -> Node {
        NODE
    }

    fn dispatch(
        &self,
        file: Arc<UvmOpen>,
        call: Call<'_>,
        note: &mut Note,
    ) -> Result<i32, ProxyError> {
        self.handle(&file, call, note)
    }
}
