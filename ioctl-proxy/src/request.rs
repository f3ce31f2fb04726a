//! One request on its way through the proxy: client memory access, the escape dispatcher and
//! the escape handlers. RM_CONTROL, RM_ALLOC and the GPU-set handling live in their own modules
//! as further `impl Req` blocks.

use std::borrow::Cow;
use std::mem::offset_of;
use std::sync::Arc;

use host_driver::NestedData;
use nvproxy_abi::fd_field;
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::{
    NVOS00_PARAMETERS, NVOS02_PARAMETERS, NVOS30_PARAMETERS, NVOS32_PARAMETERS, NVOS33_PARAMETERS,
    NVOS34_PARAMETERS, NVOS39_PARAMETERS, NVOS46_PARAMETERS, NVOS46_PARAMETERS_V580,
    NVOS47_PARAMETERS, NVOS47_PARAMETERS_V550, NVOS55_PARAMETERS, NVOS56_PARAMETERS,
    NVOS57_PARAMETERS, nv_ioctl_alloc_os_event_t, nv_ioctl_nvos02_parameters_with_fd,
    nv_ioctl_nvos33_parameters_with_fd, nv_ioctl_register_fd_t, nv_ioctl_xfer_t,
};
use nvproxy_abi::{EscapeSpec, RMAPI_PARAM_COPY_MAX_PARAMS_SIZE};
use tracing::debug;
use zerocopy::{FromZeros, IntoBytes};

use crate::audit::{Decision, Kind};
use crate::error::ProxyError;
use crate::kit::{Note, Stop, answer_ok, deny, fail, nested_err, top_err};
use crate::memory::ClientMemory;
use crate::nv::*;
use crate::objects::Origin;
use crate::plan::{Buf, Params, Plan, rd32, rd64, wr32};
use crate::proxy::{FdError, FdResolver, OpenFile, OpenId, Proxy};

/// Which way a nested buffer is copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// Read from the client; the driver only reads it.
    In,
    /// Zero-filled; copied back (`SKIP_COPYIN | ZERO_BUFFER`).
    Out,
    /// Read from the client and copied back.
    InOut,
}

impl Dir {
    pub(crate) fn new(copy_in: bool, copy_out: bool) -> Self {
        match (copy_in, copy_out) {
            (true, false) => Dir::In,
            (false, _) => Dir::Out,
            (true, true) => Dir::InOut,
        }
    }
    fn copy_in(self) -> bool {
        self != Dir::Out
    }
    fn copy_out(self) -> bool {
        self != Dir::In
    }
}

/// One request.
pub(crate) struct Req<'a> {
    pub(crate) px: &'a Proxy,
    pub(crate) open: OpenId,
    pub(crate) file: Arc<OpenFile>,
    pub(crate) mem: &'a mut dyn ClientMemory,
    pub(crate) fds: &'a dyn FdResolver,
    /// What the entry ([`crate::service::ioctl`]) will account.
    pub(crate) note: &'a mut Note,
    /// The video memory books' update a control makes on success (`vidmem.rs`).
    pub(crate) vid_op: Option<crate::vid_books::VidOp>,
    /// The client ranges this request has read.
    reads: ReadLog,
}

/// The client byte ranges one request has read. Every client byte is read at most once per
/// request: a buffer that overlaps one already read (a nested pointer into the top-level
/// params, an XFER pointing at itself, two nested pointers at the same bytes) is refused
/// rather than read again, so no decision can rest on one read while the driver gets
/// another. The driver itself would copy such buffers twice; no client that does not race
/// its own memory needs them. A request reads a handful of buffers: they live inline.
#[derive(Default)]
struct ReadLog {
    inline: [(u64, u64); ReadLog::INLINE],
    n: usize,
    more: Vec<(u64, u64)>,
}

impl ReadLog {
    const INLINE: usize = 8;

    /// Records `len` bytes at `addr`; `false` (nothing recorded) if they overlap a range
    /// already read. Empty ranges overlap nothing.
    fn note(&mut self, addr: u64, len: usize) -> bool {
        if len == 0 {
            return true;
        }
        let end = addr.saturating_add(len as u64);
        let n = self.n.min(Self::INLINE);
        let clash = self.inline[..n]
            .iter()
            .chain(&self.more)
            .any(|&(a, e)| a < end && addr < e);
        if clash {
            return false;
        }
        if self.n < Self::INLINE {
            self.inline[self.n] = (addr, end);
        } else {
            self.more.push((addr, end));
        }
        self.n += 1;
        true
    }
}

/// Why a handle check refused a call (the audit's reason).
pub(crate) const UNKNOWN_CLIENT: &str = "client of another instance or unknown";
/// Why an object check refused a call.
pub(crate) const UNKNOWN_OBJECT: &str = "object unknown in this client";
/// Why the object quota refused a call.
pub(crate) const NO_ROOM: &str = "instance object quota reached";

impl<'a> Req<'a> {
    pub(crate) fn new(
        px: &'a Proxy,
        open: OpenId,
        file: Arc<OpenFile>,
        mem: &'a mut dyn ClientMemory,
        fds: &'a dyn FdResolver,
        note: &'a mut Note,
    ) -> Self {
        Self {
            px,
            open,
            file,
            mem,
            fds,
            note,
            vid_op: None,
            reads: ReadLog::default(),
        }
    }

    pub(crate) fn set_decision(&mut self, decision: Decision, reason: &'static str) {
        self.note.decision = decision;
        self.note.reason = Some(reason);
    }

    /// Applies the policy to a table entry. `Ok(true)`: go on. `Ok(false)`: denied (the note
    /// says so; the caller answers as if the entry were absent).
    pub(crate) fn check_policy(&mut self, name: &str, caps: nvproxy_abi::Caps) -> bool {
        self.note.judged(self.px.policy.judge(name, caps))
    }

    // ---- client memory -------------------------------------------------------------------

    /// Notes a top-level read of `len` bytes at `addr` ([`ReadLog`]): `EINVAL` (decision
    /// `denied`) if those bytes were already read in this request.
    fn note_top_read(&mut self, addr: u64, len: usize) -> Result<(), ProxyError> {
        if self.reads.note(addr, len) {
            return Ok(());
        }
        self.set_decision(Decision::Denied, "params overlap bytes already read");
        Err(ProxyError::Unsupported(
            "params overlapping bytes this request already read",
        ))
    }

    /// Reads the top-level struct `buf` at `addr`, once. A fault is `EFAULT`.
    pub(crate) fn read_top_into(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), ProxyError> {
        self.note_top_read(addr, buf.len())?;
        self.mem.read_into(addr, buf).map_err(top_err)
    }

    /// Reads the top-level params and declares their write-back (the driver always copies
    /// the whole struct back). A fault is `EFAULT`, as `copy_from_user` in `nvidia_ioctl`.
    pub(crate) fn read_top(&mut self, addr: u64, len: usize) -> Result<NestedData, ProxyError> {
        self.note_top_read(addr, len)?;
        let mut b = host_driver::zeroed_nested(len);
        self.mem
            .read_for_update_into(addr, &mut b)
            .map_err(top_err)?;
        Ok(b)
    }

    /// Reads the top-level params as `T`, once, and declares their write-back. A fault is
    /// `EFAULT`, as `copy_from_user` in `nvidia_ioctl`.
    pub(crate) fn read_params<T: Params>(&mut self, addr: u64) -> Result<T, ProxyError> {
        let mut p = T::new_zeroed();
        self.note_top_read(addr, size_of::<T>())?;
        self.mem
            .read_for_update_into(addr, p.as_mut_bytes())
            .map_err(top_err)?;
        Ok(p)
    }

    /// Copies the top-level params back: always a request's last write, so the transport's
    /// buffered writes (nested outputs first) are flushed here, with one syscall.
    pub(crate) fn write_top(&mut self, addr: u64, data: &[u8]) -> Result<(), ProxyError> {
        self.mem.write(addr, data).map_err(top_err)?;
        self.mem.flush().map_err(top_err)
    }

    /// Adds a daemon buffer of `len` bytes for the client pointer `addr` found at `off` in
    /// `parent`: read from the client when `copy_in` (else zeroed), copied back when
    /// `copy_out`. A null `addr` leaves the field null for the host. Callers bound `len`.
    pub(crate) fn nested(
        &mut self,
        plan: &mut Plan,
        parent: Buf,
        off: usize,
        addr: u64,
        len: usize,
        dir: Dir,
    ) -> Result<Option<usize>, Stop> {
        let (copy_in, copy_out) = (dir.copy_in(), dir.copy_out());
        if addr == 0 {
            plan.null_ptr(parent, off);
            return Ok(None);
        }
        let data = if copy_in {
            if !self.reads.note(addr, len) {
                return deny(
                    NV_ERR_INVALID_ADDRESS,
                    "nested buffer overlaps bytes already read",
                );
            }
            // Read in place: a buffer of up to 64 bytes (most params) needs no allocation.
            let mut d = host_driver::zeroed_nested(len);
            let r = if copy_out {
                self.mem.read_for_update_into(addr, &mut d)
            } else {
                self.mem.read_into(addr, &mut d)
            };
            r.map_err(nested_err)?;
            d
        } else {
            self.mem.reserve_write(addr, len).map_err(nested_err)?;
            host_driver::zeroed_nested(len)
        };
        Ok(Some(plan.nest(parent, off, data, copy_out.then_some(addr))))
    }

    /// Adds a nested array of `count` elements of `elem` bytes, bounded like the driver's
    /// `rmapiParamsAcquire` (`src/nvidia/src/kernel/rmapi/param_copy.c`): a null pointer with a
    /// non-zero size or the reverse, or more than `RMAPI_PARAM_COPY_MAX_PARAMS_SIZE` bytes, is
    /// `NV_ERR_INVALID_ARGUMENT`. Nothing proportional to the size is allocated before the
    /// bound is checked.
    pub(crate) fn nested_array(
        &mut self,
        plan: &mut Plan,
        parent: Buf,
        off: usize,
        count: u64,
        elem: usize,
        dir: Dir,
    ) -> Result<Option<usize>, Stop> {
        let addr = rd64(plan.buf(parent), off);
        let len = count.saturating_mul(elem as u64);
        if (addr == 0) != (len == 0) {
            return fail(NV_ERR_INVALID_ARGUMENT, "nested pointer and size disagree");
        }
        if len > u64::from(RMAPI_PARAM_COPY_MAX_PARAMS_SIZE) {
            return fail(NV_ERR_INVALID_ARGUMENT, "nested buffer above 1 MiB");
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        self.nested(plan, parent, off, addr, len, dir)
    }

    /// The host file id for the caller's fd `fd`, and the open it is (resolved once).
    pub(crate) fn host_fd_open(&self, fd: i32) -> Result<(i32, OpenId), FdError> {
        if fd < 0 {
            return Err(FdError::Foreign);
        }
        let open = self.fds.resolve(fd)?;
        self.px
            .file(open)
            .map(|f| (f.host.id(), open))
            .ok_or(FdError::Foreign)
    }

    /// Translates an fd field whose failure the driver reports as an NV status: a foreign fd
    /// gets `status` (ioctl success), a failed resolution the resolver's errno.
    pub(crate) fn translate_fd_status(&self, fd: i32, status: u32) -> Result<i32, Stop> {
        self.translate_fd_status_open(fd, status).map(|(h, _)| h)
    }

    /// [`Req::translate_fd_status`], also returning the open the fd named.
    pub(crate) fn translate_fd_status_open(
        &self,
        fd: i32,
        status: u32,
    ) -> Result<(i32, OpenId), Stop> {
        match self.host_fd_open(fd) {
            Ok(h) => Ok(h),
            Err(FdError::Foreign) => deny(status, "fd is not a node of this instance"),
            Err(FdError::Errno(e)) => Err(Stop::Err(ProxyError::ForeignFd { fd, errno: e })),
        }
    }

    /// Translates an fd field whose failure the driver reports as an errno: `EBADF` for a
    /// foreign fd, else the resolver's errno.
    /// Also returns the open the fd named.
    pub(crate) fn translate_fd_open_errno(&mut self, fd: i32) -> Result<(i32, OpenId), ProxyError> {
        self.host_fd_open(fd).map_err(|e| {
            if e == FdError::Foreign {
                self.set_decision(Decision::Denied, "fd is not a node of this instance");
            }
            ProxyError::ForeignFd {
                fd,
                errno: e.errno(),
            }
        })
    }

    // ---- host calls and write-back -------------------------------------------------------

    pub(crate) fn exec(&self, plan: &mut Plan) -> Result<i32, ProxyError> {
        self.px.translate_clients(plan, false);
        self.exec_raw(plan)
    }

    /// [`Req::exec`] without client translation (an `RM_ALLOC` of a client translates
    /// itself).
    pub(crate) fn exec_raw(&self, plan: &mut Plan) -> Result<i32, ProxyError> {
        plan.exec(&*self.file.host)
    }

    /// Copies the results back: nested outputs first, then the top-level struct (converted
    /// by `convert` to the client's layout), and notes the status at `status_off`.
    pub(crate) fn finish_with(
        &mut self,
        addr: u64,
        plan: &mut Plan,
        status_off: Option<usize>,
        ret: i32,
        convert: impl FnOnce(NestedData) -> NestedData,
    ) -> Result<i32, ProxyError> {
        plan.restore_client_values();
        if let Some(off) = status_off {
            self.note.nv_status = Some(rd32(plan.buf(None), off));
        }
        for (a, data) in plan.outputs() {
            self.mem.write(a, data).map_err(top_err)?;
        }
        let top = convert(plan.take_params());
        self.write_top(addr, &top)?;
        Ok(ret)
    }

    pub(crate) fn finish(
        &mut self,
        addr: u64,
        plan: &mut Plan,
        status_off: Option<usize>,
        ret: i32,
    ) -> Result<i32, ProxyError> {
        self.finish_with(addr, plan, status_off, ret, |t| t)
    }

    /// Runs an RM escape handler on its params `T` (read once), whose NV status is at
    /// `status_off`: a [`Stop::Status`] from it is written into the client's own copy of the
    /// struct and the ioctl succeeds.
    pub(crate) fn with_params<T: Params>(
        &mut self,
        addr: u64,
        status_off: usize,
        f: impl FnOnce(&mut Self, T) -> Result<i32, Stop>,
    ) -> Result<i32, ProxyError> {
        let p = self.read_params::<T>(addr)?;
        let res = f(self, p);
        if let Ok(r) = res {
            return Ok(r);
        }
        let mut note = std::mem::replace(self.note, Note::new(Kind::Escape, 0));
        let answered = crate::service::settle(&mut note, res, |status| {
            let mut answer = p;
            wr32(answer.as_mut_bytes(), status_off, status);
            self.write_top(addr, answer.as_bytes())
        });
        *self.note = note;
        answered
    }

    /// Room for one more RM client or object in the instance's quota, or
    /// `NV_ERR_INSUFFICIENT_RESOURCES` (decision `denied`) before the driver sees the call.
    pub(crate) fn need_room(&self) -> Result<(), Stop> {
        if self.px.object_room() {
            Ok(())
        } else {
            deny(NV_ERR_INSUFFICIENT_RESOURCES, NO_ROOM)
        }
    }

    /// Whether `h_client` is ours, or the denial.
    pub(crate) fn need_client(&self, h_client: u32) -> Result<(), Stop> {
        if self.px.objects().contains(h_client, h_client) {
            Ok(())
        } else {
            deny(NV_ERR_INVALID_CLIENT, UNKNOWN_CLIENT)
        }
    }

    /// Whether `h` is `h_client` or one of its objects, or `status`.
    pub(crate) fn need_object(&self, h_client: u32, h: u32, status: u32) -> Result<(), Stop> {
        if self.px.objects().contains(h_client, h) {
            Ok(())
        } else {
            deny(status, UNKNOWN_OBJECT)
        }
    }

    // ---- dispatch ------------------------------------------------------------------------

    /// Decodes `cmd` and runs the escape's handler.
    pub(crate) fn dispatch(&mut self, cmd: u32, arg: u64) -> Result<i32, ProxyError> {
        let mut nr = u32::from(ioc_nr(cmd));
        self.note.number = nr;
        self.note.name = Cow::Borrowed("");
        if cmd == nvproxy_preload_proto::NVPROXY_IOC_ALLOC_OS_DESCRIPTOR {
            return self.alloc_os_descriptor(arg);
        }
        if ioc_type(cmd) != NV_IOCTL_MAGIC {
            self.set_decision(Decision::Denied, "not an NVIDIA ioctl");
            return Err(ProxyError::NotNvidia { cmd });
        }
        let mut size = ioc_size(cmd);
        let mut addr = arg;
        if nr == u32::from(NV_ESC_IOCTL_XFER_CMD) {
            // nv.c: the XFER struct must be exactly nv_ioctl_xfer_t, its size at most
            // NV_ABSOLUTE_MAX_IOCTL_SIZE; then the escape runs on the named buffer.
            if size as usize != size_of::<nvproxy_abi::structs::nv_ioctl_xfer_t>() {
                self.set_decision(Decision::Failed, "bad XFER size");
                return Err(ProxyError::BadSize {
                    name: "NV_ESC_IOCTL_XFER_CMD",
                    size,
                });
            }
            let mut x = nv_ioctl_xfer_t::new_zeroed();
            self.read_top_into(arg, x.as_mut_bytes())?;
            (nr, size, addr) = (x.cmd, x.size, x.ptr);
            self.note.number = nr;
            self.note.name = Cow::Borrowed("");
            if size > NV_ABSOLUTE_MAX_IOCTL_SIZE {
                self.set_decision(
                    Decision::Failed,
                    "XFER size above NV_ABSOLUTE_MAX_IOCTL_SIZE",
                );
                return Err(ProxyError::BadSize {
                    name: "NV_ESC_IOCTL_XFER_CMD",
                    size,
                });
            }
        }
        let Ok(nr8) = u8::try_from(nr) else {
            self.set_decision(Decision::Denied, "unknown escape");
            return Err(ProxyError::UnknownEscape { nr });
        };
        let Some(spec) = self.px.abi.escape(nr8).copied() else {
            self.set_decision(Decision::Denied, "unknown escape");
            return Err(ProxyError::UnknownEscape { nr });
        };
        self.note.name = spec.name.into();
        if !spec.size.accepts(size) {
            self.set_decision(Decision::Failed, "bad payload size");
            return Err(ProxyError::BadSize {
                name: spec.name,
                size,
            });
        }
        if !self.check_policy(spec.name, spec.caps) {
            return Err(ProxyError::Denied(spec.name));
        }
        let size = size as usize;
        debug!(escape = spec.name, size, "dispatch");
        match nr8 {
            NV_ESC_RM_ALLOC_MEMORY => self.rm_alloc_memory(addr),
            NV_ESC_RM_FREE => self.rm_free(addr),
            NV_ESC_RM_CONTROL => self.rm_control(addr),
            NV_ESC_RM_ALLOC => self.rm_alloc(addr, size),
            NV_ESC_RM_DUP_OBJECT => self.rm_dup(addr),
            NV_ESC_RM_SHARE => self.rm_share(addr),
            NV_ESC_RM_IDLE_CHANNELS => self.rm_idle_channels(addr),
            NV_ESC_RM_VID_HEAP_CONTROL => self.rm_vid_heap(addr),
            NV_ESC_RM_MAP_MEMORY => self.rm_map_memory(addr),
            NV_ESC_RM_UNMAP_MEMORY
            | NV_ESC_RM_MAP_MEMORY_DMA
            | NV_ESC_RM_UNMAP_MEMORY_DMA
            | NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO => self.rm_handles(&spec, addr, size),
            NV_ESC_RM_ALLOC_CONTEXT_DMA2 => self.rm_context_dma2(addr),
            NV_ESC_CARD_INFO => self.card_info(addr, size),
            NV_ESC_NUMA_INFO => self.numa_info(addr),
            NV_ESC_REGISTER_FD => self.register_fd(addr),
            NV_ESC_ALLOC_OS_EVENT | NV_ESC_FREE_OS_EVENT => self.os_event(nr8, addr),
            NV_ESC_CHECK_VERSION_STR | NV_ESC_SYS_PARAMS | NV_ESC_WAIT_OPEN_COMPLETE => {
                self.simple(nr8, addr, size)
            }
            NV_ESC_ATTACH_GPUS_TO_FD => self.attach_gpus_to_fd(addr, size),
            NV_ESC_EXPORT_TO_DMABUF_FD => {
                // The driver creates the dma-buf fd in the calling process, the daemon; there
                // is no way yet to hand it to the tenant.
                self.set_decision(Decision::Failed, "dma-buf fd passing not implemented");
                Err(ProxyError::Unsupported(
                    "NV_ESC_EXPORT_TO_DMABUF_FD: dma-buf fd passing is not implemented",
                ))
            }
            _ => {
                self.set_decision(Decision::Denied, "no handler for this escape");
                Err(ProxyError::Unsupported("escape has no handler"))
            }
        }
    }

    // ---- escapes ---------------------------------------------------------------------------

    /// Escapes copied in and out unchanged: `CHECK_VERSION_STR`, `SYS_PARAMS`,
    /// `WAIT_OPEN_COMPLETE`.
    fn simple(&mut self, nr: u8, addr: u64, size: usize) -> Result<i32, ProxyError> {
        let top = self.read_top(addr, size)?;
        let mut plan = Plan::with_params(nv_iowr(nr, size), top);
        let ret = self.exec(&mut plan)?;
        self.finish(addr, &mut plan, None, ret)
    }

    /// `NV_ESC_REGISTER_FD`: `ctl_fd` becomes the host id of the control file it names.
    fn register_fd(&mut self, addr: u64) -> Result<i32, ProxyError> {
        let p = self.read_params::<nv_ioctl_register_fd_t>(addr)?;
        let (host, ctl) = self.translate_fd_open_errno(p.ctl_fd)?;
        let mut plan = Plan::new(NV_ESC_REGISTER_FD_CMD, p.as_bytes());
        plan.rewrite32(
            None,
            offset_of!(nv_ioctl_register_fd_t, ctl_fd),
            fd_field::to_u32(host),
        );
        // The link keeps the control file in the driver until this file goes; counted before
        // the call, so a close of the control file racing it keeps its books (`Proxy::release`).
        let held = self.px.hold_ctl(ctl);
        let ret = self.exec(&mut plan);
        match ret {
            Ok(0) if held => crate::proxy::lock_record(&self.file).registered_ctl = Some(ctl),
            _ if held => {
                self.px.unhold_ctl(ctl);
            }
            _ => {}
        }
        let ret = ret?;
        self.finish(addr, &mut plan, None, ret)
    }

    /// `NV_ESC_ALLOC_OS_EVENT` / `NV_ESC_FREE_OS_EVENT` (the same layout): the client must be
    /// ours; `fd` is the key the driver files the event under (and
    /// `NV0005_ALLOC_PARAMETERS.data` names later), translated the same way everywhere.
    fn os_event(&mut self, nr: u8, addr: u64) -> Result<i32, ProxyError> {
        type P = nv_ioctl_alloc_os_event_t;
        const STATUS: usize = offset_of!(P, Status);
        self.with_params(addr, STATUS, |r, p: P| {
            r.need_client(p.hClient)?;
            let (host, target) = r.translate_fd_status_open(p.fd, NV_ERR_INVALID_ARGUMENT)?;
            let mut plan = Plan::new(nv_iowr(nr, size_of::<P>()), p.as_bytes());
            plan.rewrite32(None, offset_of!(P, fd), fd_field::to_u32(host));
            let ret = r.exec(&mut plan)?;
            if ret == 0 && plan.get::<P>(None).Status == NV_OK {
                let mut rec = crate::proxy::lock_record(&r.file);
                let key = (p.hClient, p.hDevice, target);
                if nr == NV_ESC_ALLOC_OS_EVENT {
                    if rec.os_events.len() < crate::proxy::MAX_OS_EVENTS_PER_OPEN {
                        rec.os_events.push(key);
                    } else {
                        rec.os_events_overflow = true;
                    }
                } else if let Some(i) = rec
                    .os_events
                    .iter()
                    .position(|&(c, _, t)| c == p.hClient && t == target)
                {
                    rec.os_events.remove(i);
                }
            }
            Ok(r.finish(addr, &mut plan, Some(STATUS), ret)?)
        })
    }

    /// `NV_ESC_RM_FREE`. Freeing an object the instance does not know in one of its clients
    /// answers `NV_OK` without reaching the host: the driver's `serverFreeResourceTree` treats
    /// an unknown handle as a no-op under `RS_COMPATABILITY_MODE` (`rs_server.c`, set by
    /// `src/nvidia/Makefile`), so a double free is `NV_OK` too.
    fn rm_free(&mut self, addr: u64) -> Result<i32, ProxyError> {
        type P = NVOS00_PARAMETERS;
        const STATUS: usize = offset_of!(P, status);
        self.with_params(addr, STATUS, |r, p: P| {
            let (h_root, h_old) = (p.hRoot, p.hObjectOld);
            let (has_client, has_object) = r.px.objects().client_and_object(h_root, h_old);
            if !has_client {
                return deny(NV_ERR_INVALID_CLIENT, UNKNOWN_CLIENT);
            }
            if !has_object {
                return answer_ok("free of an unknown object is a no-op");
            }
            let mut plan = Plan::new(nv_iowr(NV_ESC_RM_FREE, size_of::<P>()), p.as_bytes());
            let _g = r.px.rm_lock();
            let ret = r.exec(&mut plan)?;
            if plan.get::<P>(None).status != NV_OK {
                return Ok(r.finish(addr, &mut plan, Some(STATUS), ret)?);
            }
            // An object (a client's free stays answered after its books) is answered before
            // the books forget it when the request is the instance's only one
            // (`Proxy::alone`), with the table locked from before the answer to after: the
            // client goes on meanwhile, and whatever it sends next finds the object gone. The
            // DMA mappings of what went are forgotten under the RM lock, which any new object
            // under the same handle must take first.
            let client = h_old == h_root;
            let early =
                (!client && r.px.alone()).then(|| r.finish(addr, &mut plan, Some(STATUS), ret));
            let mut t = r.px.objects();
            if let Some(Ok(ret)) = early {
                r.mem.answer_now(ret);
            }
            let freed = t.free(h_root, h_old);
            drop(t);
            if let Ok(f) = &freed {
                r.px.forget_dma_mappings(h_root, f);
                if client {
                    r.px.unmap_client(h_root);
                }
            }
            debug!(?freed, "freed");
            match early {
                Some(done) => Ok(done?),
                None => Ok(r.finish(addr, &mut plan, Some(STATUS), ret)?),
            }
        })
    }

    /// `NV_ESC_RM_DUP_OBJECT`: both clients must be ours; the new object is recorded with the
    /// source's class.
    fn rm_dup(&mut self, addr: u64) -> Result<i32, ProxyError> {
        type P = NVOS55_PARAMETERS;
        const STATUS: usize = offset_of!(P, status);
        self.with_params(addr, STATUS, |r, p: P| {
            r.need_client(p.hClient)?;
            r.need_object(p.hClient, p.hParent, NV_ERR_INVALID_OBJECT_PARENT)?;
            r.need_client(p.hClientSrc)?;
            r.need_object(p.hClientSrc, p.hObjectSrc, NV_ERR_OBJECT_NOT_FOUND)?;
            r.need_room()?;
            let class =
                r.px.objects()
                    .class_of(p.hClientSrc, p.hObjectSrc)
                    .unwrap_or(0);
            let mut plan = Plan::new(nv_iowr(NV_ESC_RM_DUP_OBJECT, size_of::<P>()), p.as_bytes());
            let _g = r.px.rm_lock();
            let ret = r.exec(&mut plan)?;
            let out = plan.get::<P>(None);
            if out.status == NV_OK {
                // The dup depends on its source: replay makes the source first.
                let origin = crate::objects::Origin::Dup {
                    src_client: p.hClientSrc,
                    src_object: p.hObjectSrc,
                    flags: p.flags,
                };
                // A dup names the source's memory block (vidmem.rs): it stays counted while
                // either lives.
                let mut t = r.px.objects();
                let charge = t.vid_of(p.hClientSrc, p.hObjectSrc);
                let added = t.add_vid_object(
                    p.hClient,
                    p.hParent,
                    out.hObject,
                    class,
                    &[],
                    origin,
                    charge,
                );
                debug!(?added, h_new = out.hObject, "dup recorded");
            }
            Ok(r.finish(addr, &mut plan, Some(STATUS), ret)?)
        })
    }

    /// `NV_ESC_RM_SHARE`: the object must be ours; a share policy that names a client
    /// (`RS_SHARE_TYPE_CLIENT`) must name one of ours.
    fn rm_share(&mut self, addr: u64) -> Result<i32, ProxyError> {
        type P = NVOS57_PARAMETERS;
        const STATUS: usize = offset_of!(P, status);
        self.with_params(addr, STATUS, |r, p: P| {
            r.need_client(p.hClient)?;
            r.need_object(p.hClient, p.hObject, NV_ERR_OBJECT_NOT_FOUND)?;
            if p.sharePolicy.r#type == RS_SHARE_TYPE_CLIENT {
                r.need_client(p.sharePolicy.target)?;
            }
            let mut plan = Plan::new(nv_iowr(NV_ESC_RM_SHARE, size_of::<P>()), p.as_bytes());
            let ret = r.exec(&mut plan)?;
            Ok(r.finish(addr, &mut plan, Some(STATUS), ret)?)
        })
    }

    /// `NV_ESC_RM_IDLE_CHANNELS`: three client arrays of `numChannels` handles; every client
    /// in them must be ours.
    fn rm_idle_channels(&mut self, addr: u64) -> Result<i32, ProxyError> {
        type P = NVOS30_PARAMETERS;
        const STATUS: usize = offset_of!(P, status);
        self.with_params(addr, STATUS, |r, p: P| {
            r.need_client(p.hClient)?;
            let n = u64::from(p.numChannels);
            let mut plan = Plan::new(
                nv_iowr(NV_ESC_RM_IDLE_CHANNELS, size_of::<P>()),
                p.as_bytes(),
            );
            let clients =
                r.nested_array(&mut plan, None, offset_of!(P, phClients), n, 4, Dir::In)?;
            r.nested_array(&mut plan, None, offset_of!(P, phDevices), n, 4, Dir::In)?;
            r.nested_array(&mut plan, None, offset_of!(P, phChannels), n, 4, Dir::In)?;
            if let Some(i) = clients {
                let list = plan.buf(Some(i)).to_vec();
                for c in list.chunks_exact(4) {
                    r.need_client(u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))?;
                }
            }
            let ret = r.exec(&mut plan)?;
            Ok(r.finish(addr, &mut plan, Some(STATUS), ret)?)
        })
    }

    /// `NV_ESC_RM_VID_HEAP_CONTROL`: only `NVOS32_FUNCTION_ALLOC_SIZE`, as gVisor. The other
    /// functions include `ALLOC_OS_DESCRIPTOR`, which would pin pages of the *daemon* at a
    /// client-chosen address: never forwarded.
    fn rm_vid_heap(&mut self, addr: u64) -> Result<i32, ProxyError> {
        type P = NVOS32_PARAMETERS;
        const STATUS: usize = offset_of!(P, status);
        self.with_params(addr, STATUS, |r, p: P| {
            let (h_root, h_parent, h_vaspace) = (p.hRoot, p.hObjectParent, p.hVASpace);
            if p.function != nvproxy_abi::structs::NVOS32_FUNCTION_ALLOC_SIZE {
                return deny(NV_ERR_NOT_SUPPORTED, "VID_HEAP function not proxied");
            }
            r.need_client(h_root)?;
            r.need_object(h_root, h_parent, NV_ERR_INVALID_OBJECT_PARENT)?;
            if h_vaspace != 0 {
                r.need_object(h_root, h_vaspace, NV_ERR_INVALID_OBJECT_HANDLE)?;
            }
            r.need_room()?;
            let mut plan = Plan::new(
                nv_iowr(NV_ESC_RM_VID_HEAP_CONTROL, size_of::<P>()),
                p.as_bytes(),
            );
            let at = NVOS32_ALLOC_SIZE_ADDRESS;
            let ptr = rd64(plan.buf(None), at);
            r.nested(&mut plan, None, at, ptr, 8, Dir::InOut)?;
            // Counted memory (vidmem.rs): ALLOC_SIZE of location VIDMEM, not virtual, on the
            // device's GPU; of another location or EGM, not virtual, in the host's pool.
            let (flags, attr, attr2) = (
                rd32(plan.buf(None), NVOS32_ALLOC_SIZE_FLAGS),
                rd32(plan.buf(None), NVOS32_ALLOC_SIZE_ATTR),
                rd32(plan.buf(None), NVOS32_ALLOC_SIZE_ATTR2),
            );
            let egm = r.px.abi.vid_heap_egm;
            let asked = vid_heap_class(flags, attr, attr2, 0, egm).0;
            let pool = r.memory_pool(asked, h_root, h_parent);
            let vid = pool.map(|pool| (pool, rd64(plan.buf(None), NVOS32_ALLOC_SIZE_SIZE)));
            let _g = r.px.rm_lock();
            if let Some((gpu, size)) = vid {
                r.vid_admit(gpu, size)?;
            }
            let ret = r.exec(&mut plan)?;
            let out = plan.buf(None);
            if rd32(out, STATUS) == NV_OK {
                let h_memory = rd32(out, NVOS32_ALLOC_SIZE_HMEMORY);
                let flags = rd32(out, NVOS32_ALLOC_SIZE_FLAGS);
                let attr = rd32(out, NVOS32_ALLOC_SIZE_ATTR);
                let attr2 = rd32(out, NVOS32_ALLOC_SIZE_ATTR2);
                let (class, deps) = vid_heap_class(flags, attr, attr2, h_vaspace, egm);
                let mut t = r.px.objects();
                let deps: Vec<u32> = deps
                    .into_iter()
                    .filter(|&d| t.contains(h_root, d))
                    .collect();
                let charge = vid.filter(|_| class == asked).and_then(|(gpu, size)| {
                    let back = rd64(out, NVOS32_ALLOC_SIZE_SIZE);
                    let bytes = crate::vid_books::pages(size.max(back));
                    gpu.map(|g| t.new_vid_charge(g, bytes))
                });
                let origin = Origin::Unreplayable("not recorded".into());
                let added =
                    t.add_vid_object(h_root, h_parent, h_memory, class, &deps, origin, charge);
                debug!(?added, h_memory, class, "vid heap alloc recorded");
            }
            Ok(r.finish(addr, &mut plan, Some(STATUS), ret)?)
        })
    }

    /// `NV_ESC_RM_MAP_MEMORY`: handles checked; `fd` (the file the mmap context goes to) must
    /// be an open of this instance and becomes that open's *mapping file* (`mapping.rs`: the
    /// host file whose dup the tenant will `mmap`). A foreign fd gets `NV_ERR_INVALID_ARGUMENT`,
    /// the driver's answer when `nv_add_mapping_context_to_file` finds no NVIDIA file
    /// (`kernel-open/nvidia/nv-usermap.c`); an open whose mapping file already has a context
    /// `NV_ERR_STATE_IN_USE` (same function), without reaching the driver.
    fn rm_map_memory(&mut self, addr: u64) -> Result<i32, ProxyError> {
        type P = nv_ioctl_nvos33_parameters_with_fd;
        const STATUS: usize = offset_of!(P, params) + offset_of!(NVOS33_PARAMETERS, status);
        self.with_params(addr, STATUS, |r, p: P| {
            let h_client = p.params.hClient;
            r.need_client(h_client)?;
            r.need_object(h_client, p.params.hDevice, NV_ERR_INVALID_OBJECT_HANDLE)?;
            r.need_object(h_client, p.params.hMemory, NV_ERR_INVALID_OBJECT_HANDLE)?;
            let target = r.mapping_target_status(p.fd)?;
            let mut plan = Plan::new(nv_iowr(NV_ESC_RM_MAP_MEMORY, size_of::<P>()), p.as_bytes());
            plan.rewrite32(None, offset_of!(P, fd), fd_field::to_u32(target.id));
            let ret = r.exec(&mut plan);
            target.commit(ret.is_ok() && rd32(plan.buf(None), STATUS) == NV_OK);
            Ok(r.finish(addr, &mut plan, Some(STATUS), ret?)?)
        })
    }

    /// Escapes whose translation is only handle checks: `RM_UNMAP_MEMORY`,
    /// `RM_MAP_MEMORY_DMA`, `RM_UNMAP_MEMORY_DMA`, `RM_UPDATE_DEVICE_MAPPING_INFO`. CPU
    /// addresses in them are recorded by the driver, not dereferenced, and pass unchanged.
    /// The layout is the version's, chosen by the payload size (the escape's size rule admits
    /// only its versions' sizes).
    fn rm_handles(&mut self, spec: &EscapeSpec, addr: u64, size: usize) -> Result<i32, ProxyError> {
        macro_rules! checks {
            ($t:ty, $($h:ident),+) => {{
                const _: () = assert!(offset_of!($t, hClient) == 0);
                self.handle_checks::<$t>(
                    spec.nr,
                    addr,
                    offset_of!($t, status),
                    &[$(offset_of!($t, $h)),+],
                )
            }};
        }
        match (spec.nr, size) {
            (NV_ESC_RM_UNMAP_MEMORY, _) => checks!(NVOS34_PARAMETERS, hDevice, hMemory),
            (NV_ESC_RM_MAP_MEMORY_DMA, s) if s == size_of::<NVOS46_PARAMETERS_V580>() => {
                checks!(NVOS46_PARAMETERS_V580, hDevice, hDma, hMemory)
            }
            (NV_ESC_RM_MAP_MEMORY_DMA, _) => checks!(NVOS46_PARAMETERS, hDevice, hDma, hMemory),
            (NV_ESC_RM_UNMAP_MEMORY_DMA, s) if s == size_of::<NVOS47_PARAMETERS_V550>() => {
                checks!(NVOS47_PARAMETERS_V550, hDevice, hDma, hMemory)
            }
            (NV_ESC_RM_UNMAP_MEMORY_DMA, _) => checks!(NVOS47_PARAMETERS, hDevice, hDma, hMemory),
            // NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO
            _ => checks!(NVOS56_PARAMETERS, hDevice, hMemory),
        }
    }

    /// `hClient` (at 0) must be ours, and every non-zero handle at `handles` one of its
    /// objects.
    fn handle_checks<T: Params>(
        &mut self,
        nr: u8,
        addr: u64,
        status_off: usize,
        handles: &[usize],
    ) -> Result<i32, ProxyError> {
        self.with_params(addr, status_off, |r, p: T| {
            let b = p.as_bytes();
            let h_client = rd32(b, 0);
            r.need_client(h_client)?;
            for &off in handles {
                let h = rd32(b, off);
                if h != 0 {
                    r.need_object(h_client, h, NV_ERR_INVALID_OBJECT_HANDLE)?;
                }
            }
            let mut plan = Plan::new(nv_iowr(nr, size_of::<T>()), b);
            let ret = r.exec(&mut plan)?;
            if ret == 0 && rd32(plan.buf(None), status_off) == NV_OK {
                // GPU VA mappings are driver state no object records: a save names them.
                // (hDevice, hDma, hMemory) for both escapes.
                if let (NV_ESC_RM_MAP_MEMORY_DMA | NV_ESC_RM_UNMAP_MEMORY_DMA, [_, dma, mem]) =
                    (nr, handles)
                {
                    let key = (h_client, rd32(b, *dma), rd32(b, *mem));
                    r.px.note_dma_mapping(key, nr == NV_ESC_RM_MAP_MEMORY_DMA);
                }
            }
            Ok(r.finish(addr, &mut plan, Some(status_off), ret)?)
        })
    }

    /// `NV_ESC_RM_ALLOC_CONTEXT_DMA2`: `hObjectParent` is the client; the new context DMA
    /// depends on `hMemory`.
    fn rm_context_dma2(&mut self, addr: u64) -> Result<i32, ProxyError> {
        type P = NVOS39_PARAMETERS;
        const STATUS: usize = offset_of!(P, status);
        self.with_params(addr, STATUS, |r, p: P| {
            let h_client = p.hObjectParent;
            r.need_client(h_client)?;
            r.need_object(h_client, p.hSubDevice, NV_ERR_INVALID_OBJECT_HANDLE)?;
            r.need_object(h_client, p.hMemory, NV_ERR_INVALID_OBJECT_HANDLE)?;
            r.need_room()?;
            let mut plan = Plan::new(
                nv_iowr(NV_ESC_RM_ALLOC_CONTEXT_DMA2, size_of::<P>()),
                p.as_bytes(),
            );
            let _g = r.px.rm_lock();
            let ret = r.exec(&mut plan)?;
            if plan.get::<P>(None).status == NV_OK {
                let added = r.px.objects().add_object(
                    h_client,
                    h_client,
                    p.hObjectNew,
                    p.hClass,
                    &[p.hMemory],
                );
                debug!(?added, h_new = p.hObjectNew, "context dma recorded");
            }
            Ok(r.finish(addr, &mut plan, Some(STATUS), ret)?)
        })
    }

    /// `NV_ESC_RM_ALLOC_MEMORY` (NVOS02 with an fd), per class:
    /// - `NV01_MEMORY_SYSTEM` with "map now" flags: `fd` names the file that gets the mmap
    ///   context and becomes that open's mapping file (as for `RM_MAP_MEMORY`); a foreign fd
    ///   fails the ioctl (`EBADF`; the driver says `EINVAL` after allocating, escape.c
    ///   `rm_create_mmap_context` failure), a target that already has a context `EINVAL`
    ///   before anything is allocated;
    /// - `NV01_MEMORY_LOCAL_USER` and `NV01_MEMORY_SYSTEM` without mapping: the driver ignores
    ///   `fd`; the host sees -1;
    /// - `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`: pins pages at `pMemory` in the *calling process*,
    ///   the daemon: never forwarded (`NV_ERR_NOT_SUPPORTED`); the shim asks with
    ///   `NVPROXY_IOC_ALLOC_OS_DESCRIPTOR` and the pages as a file instead (`osdesc.rs`);
    /// - anything else: `NV_ERR_INVALID_CLASS`.
    fn rm_alloc_memory(&mut self, addr: u64) -> Result<i32, ProxyError> {
        type P = nv_ioctl_nvos02_parameters_with_fd;
        const STATUS: usize = offset_of!(P, params) + offset_of!(NVOS02_PARAMETERS, status);
        self.with_params(addr, STATUS, |r, p: P| {
            let q = p.params;
            let (h_root, h_parent, h_new, class, flags) =
                (q.hRoot, q.hObjectParent, q.hObjectNew, q.hClass, q.flags);
            if class == NV01_MEMORY_SYSTEM_OS_DESCRIPTOR {
                return deny(NV_ERR_NOT_SUPPORTED, "OS descriptor memory is not proxied");
            }
            let Some(spec) = r.px.classes.get(&class).copied() else {
                return deny(
                    NV_ERR_INVALID_CLASS,
                    "class not allowed through ALLOC_MEMORY",
                );
            };
            if !matches!(class, NV01_MEMORY_SYSTEM | NV01_MEMORY_LOCAL_USER) {
                return deny(
                    NV_ERR_INVALID_CLASS,
                    "class not allowed through ALLOC_MEMORY",
                );
            }
            if !r.check_policy(spec.name, spec.caps) {
                return deny(NV_ERR_INVALID_CLASS, "policy");
            }
            r.need_client(h_root)?;
            r.need_object(h_root, h_parent, NV_ERR_INVALID_OBJECT_PARENT)?;
            r.need_room()?;
            let map_now = class == NV01_MEMORY_SYSTEM
                && (flags >> 16) & 3 != NVOS02_FLAGS_ALLOC_NONE
                && (flags >> 30) & 3 != NVOS02_FLAGS_MAPPING_NO_MAP;
            let target = if map_now {
                Some(r.mapping_target_errno(p.fd)?)
            } else {
                None
            };
            let host_fd = target.as_ref().map_or(-1, |t| t.id);
            let mut plan = Plan::new(
                nv_iowr(NV_ESC_RM_ALLOC_MEMORY, size_of::<P>()),
                p.as_bytes(),
            );
            plan.rewrite32(None, offset_of!(P, fd), fd_field::to_u32(host_fd));
            // System memory in the host's pool (vidmem.rs): `limit + 1` bytes of what
            // `_rmAllocMemorySystem` allocates (location PCI, not ALLOC_NONE: the rest is its
            // NV_ERR_INVALID_FLAGS; a limit of all ones, size 0, is the driver's to refuse).
            let sys = (class == NV01_MEMORY_SYSTEM
                && (flags >> 8) & 0xf == NVOS02_FLAGS_LOCATION_PCI
                && (flags >> 16) & 3 != NVOS02_FLAGS_ALLOC_NONE)
                .then(|| q.limit.wrapping_add(1));
            let _g = r.px.rm_lock();
            if let Some(size) = sys {
                r.vid_admit(Some(crate::objects::HOST_POOL), size)?;
            }
            let ret = r.exec(&mut plan);
            let ok = rd32(plan.buf(None), STATUS) == NV_OK;
            if let Some(t) = target {
                t.commit(ret.is_ok() && ok);
            }
            let ret = ret?;
            if ok && class == NV01_MEMORY_LOCAL_USER {
                r.local_user_limit(
                    &mut plan,
                    offset_of!(P, params) + offset_of!(NVOS02_PARAMETERS, limit),
                );
            }
            if ok {
                let mut t = r.px.objects();
                let charge = sys.map(|size| {
                    let limit = rd64(
                        plan.buf(None),
                        offset_of!(P, params) + offset_of!(NVOS02_PARAMETERS, limit),
                    );
                    let bytes = crate::vid_books::pages(size.max(limit.wrapping_add(1)));
                    t.new_vid_charge(crate::objects::HOST_POOL, bytes)
                });
                let origin = Origin::Unreplayable("not recorded".into());
                let added = t.add_vid_object(h_root, h_parent, h_new, class, &[], origin, charge);
                debug!(?added, h_new, "alloc memory recorded");
            }
            Ok(r.finish(addr, &mut plan, Some(STATUS), ret)?)
        })
    }
}

/// The class a `VID_HEAP_CONTROL` allocation is recorded under, and its dependencies (as
/// gVisor's `rmVidHeapControlAllocSize`). `egm`: whether the version honours
/// `NVOS32_ATTR2_USE_EGM` ([`nvproxy_abi::DriverAbi::vid_heap_egm`]); before 550 the bit is
/// unused and the driver allocates by location, so it must not turn the allocation into an
/// uncounted class.
fn vid_heap_class(flags: u32, attr: u32, attr2: u32, h_vaspace: u32, egm: bool) -> (u32, Vec<u32>) {
    if flags & NVOS32_ALLOC_FLAGS_VIRTUAL != 0 {
        let deps = if h_vaspace != 0 {
            vec![h_vaspace]
        } else {
            Vec::new()
        };
        return (NV50_MEMORY_VIRTUAL, deps);
    }
    if egm && attr2 & NVOS32_ATTR2_USE_EGM != 0 {
        return (NV_MEMORY_EXTENDED_USER, Vec::new());
    }
    if (attr >> 25) & 3 == NVOS32_ATTR_LOCATION_VIDMEM {
        return (NV01_MEMORY_LOCAL_USER, Vec::new());
    }
    (NV01_MEMORY_SYSTEM, Vec::new())
}
