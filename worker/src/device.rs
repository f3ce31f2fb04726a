//! One proxied node (`nvidiactl`, `nvidia<N>`) as a `cuse_dev::Handler`.
//!
//! The handler is thin: it answers our private identify ioctl itself, picks the client-memory
//! transport, keeps the retry plans between CUSE retry rounds, and hands every other ioctl to the
//! instance's [`Backend`] (the `ioctl-proxy` request path).
//!
//! The threads that run these handlers call the host driver on the tenant's behalf, and the
//! NVIDIA driver takes an RM caller's privilege from the calling thread's capabilities
//! (`os_is_administrator()` is `capable(CAP_SYS_ADMIN)`): they give up `CAP_SYS_ADMIN` for good
//! ([`drop_admin_on_this_thread`]) when they start and, failing that, refuse every request.

use std::cell::Cell;
use std::io;
use std::sync::Arc;

use cuse_dev::{Errno, Handler, IoVec, Ioctl, IoctlReply, Opened, Request};
use ioctl_proxy::Caller;
use nvproxy_preload_proto::{
    NVPROXY_HELLO_MAGIC, NVPROXY_IOC_HELLO, NVPROXY_IOC_IDENTIFY, NVPROXY_IOC_MMAP_TICKET,
};

use crate::fdid::FdIdentity;
use crate::memory::{RetryMemory, RetryPlan, VmMemory};
use crate::mmap::InstanceMmap;
use crate::ratelimit::tenant_log;
use crate::sys;
use nvproxy_config::MemoryTransport;

thread_local! {
    /// Whether this thread has given up `CAP_SYS_ADMIN` ([`drop_admin_on_this_thread`]).
    static WITHOUT_ADMIN: Cell<bool> = const { Cell::new(false) };
}

/// Makes the calling thread an unprivileged caller of the host driver, once per thread: removes
/// `CAP_SYS_ADMIN` from its effective, permitted and inheritable sets and keeps every other
/// capability (the request path needs e.g. `CAP_SYS_PTRACE` for `process_vm_readv` and
/// `pidfd_getfd`). Capabilities are per thread, so the rest of the daemon keeps it; the threads
/// this one starts later inherit the drop.
///
/// Why: the driver asks the calling thread (`os_is_administrator()` = `capable(CAP_SYS_ADMIN)`,
/// kernel-open/common/inc/nv-linux.h `NV_IS_SUSER`) on every RM call, caches the answer in each
/// RM client it creates (`cachedPrivilege`, rmapi/client.c), and lets only root-level callers
/// through privileged controls, allocations and legacy GSS controls
/// (`RmGssLegacyRpcCmd`). A thread of a root daemon would make every tenant an RM
/// administrator; without `CAP_SYS_ADMIN` a tenant gets what an unprivileged process gets.
///
/// Runs when a serving thread starts (the session's thread-start hook, `instance.rs`) and
/// again at the start of each request that may reach the driver: after the first success a
/// thread-local flag makes that free. On failure the request is refused with `EPERM` (and
/// logged), never forwarded with admin rights; the next request tries again.
pub fn drop_admin_on_this_thread() -> Result<(), Errno> {
    if WITHOUT_ADMIN.get() {
        return Ok(());
    }
    // CAP_SYS_NICE leaves the effective set too (the driver grants RS_ACCESS_NICE for it,
    // `ioctl_proxy::schedule`) but stays permitted: the proxy raises it for its own calls
    // ([`RaiseNice`]).
    let dropped = sys::drop_thread_capability(sys::CAP_SYS_ADMIN)
        .and_then(|()| sys::set_thread_effective(sys::CAP_SYS_NICE, false));
    match dropped {
        Ok(()) => {
            WITHOUT_ADMIN.set(true);
            tracing::debug!(
                tid = sys::gettid(),
                "request thread runs without CAP_SYS_ADMIN and CAP_SYS_NICE"
            );
            Ok(())
        }
        Err(e) => {
            tracing::error!(
                tid = sys::gettid(),
                error = %e,
                "cannot drop CAP_SYS_ADMIN and CAP_SYS_NICE on a request thread: refusing its \
                 requests (EPERM)"
            );
            Err(Errno::EPERM)
        }
    }
}

/// Makes the proxy's own scheduling calls (`ioctl_proxy::NiceCaller`) on a request thread:
/// `CAP_SYS_NICE` goes into the thread's effective set for that one ioctl and out again. A
/// worker whose permitted set lacks it makes the call without it (the driver then refuses, and
/// the proxy fails the allocation). Should it fail to leave the effective set, the thread
/// gives it up for good, or the process aborts: no tenant call may run with it.
#[derive(Debug, Default)]
pub struct RaiseNice;

impl ioctl_proxy::NiceCaller for RaiseNice {
    fn ioctl_nice(
        &self,
        file: &dyn ioctl_proxy::HostFile,
        call: &mut ioctl_proxy::HostCall,
    ) -> std::io::Result<i32> {
        let had = sys::thread_caps()?.has_effective(sys::CAP_SYS_NICE);
        if had {
            return file.ioctl(call);
        }
        if let Err(e) = sys::set_thread_effective(sys::CAP_SYS_NICE, true) {
            tracing::warn!(error = %e, "cannot raise CAP_SYS_NICE for the instance's interleave level");
            return file.ioctl(call);
        }
        let ret = file.ioctl(call);
        if let Err(e) = sys::set_thread_effective(sys::CAP_SYS_NICE, false) {
            tracing::error!(error = %e, "CAP_SYS_NICE stays raised: giving it up on this thread");
            if sys::drop_thread_capability(sys::CAP_SYS_NICE).is_err() {
                std::process::abort();
            }
        }
        ret
    }
}

pub use crate::node::{Backend, FdLookup, Node};

/// Whether `node`'s CUSE device asks for unrestricted ioctls. The retry transport needs them
/// (the kernel then copies only the regions we name), and so does the UVM node (its command
/// numbers carry no `_IOC` direction and size). With `process-vm` the frontend nodes use
/// restricted ioctls: for the driver's `_IOWR` commands the kernel copies the `_IOC_SIZE`
/// top-level params in with the request and back from the reply, as `nvidia_ioctl` copies
/// them, which saves a `process_vm_readv` and usually a `process_vm_writev` per ioctl
/// (`VmMemory`'s window); commands with other `_IOC` bits fall back to the syscalls. A
/// top-level pointer the kernel cannot copy fails with `EFAULT` before the daemon sees the
/// call, as in `nvidia_ioctl`, which copies `_IOC_SIZE` bytes in before any check. Our own
/// ioctls (identify, the shim's) carry no `_IOC` bits and take their argument by value or
/// through the transport.
pub fn unrestricted_ioctls(node: Node, transport: MemoryTransport) -> bool {
    transport == MemoryTransport::Retry || node == Node::Uvm
}

/// A proxied node.
pub struct NodeDevice {
    node: Node,
    backend: Arc<dyn Backend>,
    fdid: Arc<FdIdentity>,
    transport: MemoryTransport,
    /// The instance's mmap tickets (the shim's ioctls are answered here).
    mmap: Arc<InstanceMmap>,
}

impl NodeDevice {
    /// A handler for `node`.
    pub fn new(
        node: Node,
        backend: Arc<dyn Backend>,
        fdid: Arc<FdIdentity>,
        transport: MemoryTransport,
        mmap: Arc<InstanceMmap>,
    ) -> Self {
        NodeDevice {
            node,
            backend,
            fdid,
            transport,
            mmap,
        }
    }

    fn resolve_fd(&self, tid: u32, fd: i32) -> io::Result<u64> {
        self.fdid.resolve(tid, fd).map(|r| r.fh).inspect_err(|e| {
            tracing::debug!(tid, fd, error = %e, "fd field not resolved");
        })
    }

    fn ioctl_vm(&self, req: &Request, io: &Ioctl<'_>, caller: Caller) -> Result<IoctlReply, Errno> {
        let tid = caller.tid;
        // On a restricted node the kernel copied the top-level params in (`in_data`) and
        // copies the reply's data back: VmMemory's window.
        let early = Some(req.early_answer(io.out_size));
        let mut mem = VmMemory::for_ioctl(
            tid,
            io.arg,
            io.in_data,
            io.out_size,
            req.client_waits(),
            early,
        );
        let lookup = |fd: i32| self.resolve_fd(tid, fd);
        let result = self
            .backend
            .ioctl(io.fh, caller, io.cmd, io.arg, &mut mem, &lookup);
        let Ok(result) = result else {
            mem.finish_failed();
            return result.map(IoctlReply::result);
        };
        // Writes the backend left buffered; a fault there is the driver's copy_to_user EFAULT.
        mem.finish().map_err(|_| Errno::EFAULT)?;
        Ok(IoctlReply::Done {
            result,
            out: mem.reply_data(),
        })
    }

    fn ioctl_retry(&self, io: &Ioctl<'_>, caller: Caller) -> Result<IoctlReply, Errno> {
        let tid = caller.tid;
        // cuse-dev keeps the regions between rounds and hands back what the previous round
        // asked for; a round with data but no previous round is the protocol's error.
        let first_round = io.in_data.is_empty() && io.out_size == 0;
        let plan = match io.retry {
            Some(round) => RetryPlan::from_round(round),
            None if first_round => RetryPlan::default(),
            None => {
                tenant_log!(
                    warn,
                    self.mmap.instance(),
                    fh = io.fh,
                    tid,
                    "retry round without a previous round"
                );
                return Err(Errno::EIO);
            }
        };
        let mut mem = RetryMemory::new(plan, io.in_data, io.out_size).map_err(|_| {
            tenant_log!(
                warn,
                self.mmap.instance(),
                fh = io.fh,
                tid,
                "retry round does not match its plan"
            );
            Errno::EIO
        })?;
        let lookup = |fd: i32| self.resolve_fd(tid, fd);
        let result = self
            .backend
            .ioctl(io.fh, caller, io.cmd, io.arg, &mut mem, &lookup);
        if mem.needs_retry() {
            let next = mem.next_plan();
            let iov = |r: &(u64, usize)| IoVec::new(r.0, r.1 as u64);
            return Ok(IoctlReply::Retry {
                in_iovs: next.reads.iter().map(iov).collect(),
                out_iovs: next.writes.iter().map(iov).collect(),
            });
        }
        let result = result?;
        Ok(IoctlReply::Done {
            result,
            out: mem.into_output().into(),
        })
    }
}

impl Handler for NodeDevice {
    fn open(&self, req: &Request, _flags: u32) -> Result<Opened, Errno> {
        drop_admin_on_this_thread()?;
        let fh = self.backend.open(self.node, req.pid())?;
        self.mmap.opened(self.node, req.pid());
        Ok(Opened { fh, open_flags: 0 })
    }

    fn release(&self, _req: &Request, fh: u64, _flags: u32) {
        // Nothing to refuse here: release only closes host files, and the driver frees what a
        // closed file held through its internal RM API whatever the closer's capabilities
        // (`RmFreeUnusedClients`, osapi.c). A failure is logged.
        let _ = drop_admin_on_this_thread();
        self.mmap.released(self.node, fh);
        self.backend.release(fh);
    }

    fn read(&self, _req: &Request, _fh: u64, _offset: u64, _size: u32) -> Result<Vec<u8>, Errno> {
        Err(Errno::EINVAL)
    }

    fn write(&self, _req: &Request, _fh: u64, _offset: u64, _data: &[u8]) -> Result<u32, Errno> {
        Err(Errno::EINVAL)
    }

    fn ioctl(&self, req: &Request, io: &Ioctl<'_>) -> Result<IoctlReply, Errno> {
        drop_admin_on_this_thread()?;
        if io.cmd == NVPROXY_IOC_IDENTIFY {
            if !self.fdid.is_genuine(req.pid(), io.arg) {
                tenant_log!(
                    warn,
                    self.mmap.instance(),
                    pid = req.pid(),
                    "identify ioctl from a client refused"
                );
                return Err(Errno::EPERM);
            }
            let fh = i32::try_from(io.fh).map_err(|_| Errno::EOVERFLOW)?;
            return Ok(IoctlReply::result(fh));
        }
        // The mmap shim's ioctls (crate preload-proto): any client may send them.
        if io.cmd == NVPROXY_IOC_HELLO {
            return Ok(IoctlReply::result(NVPROXY_HELLO_MAGIC));
        }
        if io.cmd == NVPROXY_IOC_MMAP_TICKET {
            return self
                .mmap
                .ticket_ioctl(self.node, &self.backend, req, io, self.transport);
        }
        let span = tracing::debug_span!("ioctl", node = ?self.node, pid = req.pid(), cmd = format_args!("{:#010x}", io.cmd));
        let _enter = span.enter();
        let start = ioctl_proxy::service::monotonic_ns();
        let caller = Caller {
            pid: 0, // looked up only for an audit event (Caller::process)
            tid: req.pid(),
            since: Some(start),
        };
        let r = match self.transport {
            MemoryTransport::ProcessVm => self.ioctl_vm(req, io, caller),
            MemoryTransport::Retry => self.ioctl_retry(io, caller),
        };
        crate::latency::LATENCY.observe_since(start);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_drop_admin_on_this_thread_clears_cap_sys_admin_of_that_thread_only() {
        let before = sys::thread_caps().unwrap();
        let (first, second, caps) = std::thread::spawn(|| {
            let first = drop_admin_on_this_thread();
            let second = drop_admin_on_this_thread(); // the thread-local flag: no syscall
            (first, second, sys::thread_caps().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!((first, second), (Ok(()), Ok(())));
        assert!(!caps.has_effective(sys::CAP_SYS_ADMIN));
        assert!(!caps.has_permitted(sys::CAP_SYS_ADMIN));
        assert!(!caps.has_effective(sys::CAP_SYS_NICE));
        let admin = 1u64 << sys::CAP_SYS_ADMIN;
        assert_eq!(
            caps.permitted,
            before.permitted & !admin,
            "NICE stays permitted"
        );
        assert_eq!(sys::thread_caps().unwrap(), before);
    }

    /// Records whether the driver would grant RS_ACCESS_NICE to each call (nvsim's check).
    #[derive(Debug, Default)]
    struct NiceProbe(std::sync::Mutex<Vec<bool>>);

    impl ioctl_proxy::HostFile for NiceProbe {
        fn node(&self) -> ioctl_proxy::NodeKind {
            ioctl_proxy::NodeKind::Ctl
        }
        fn id(&self) -> i32 {
            -1
        }
        fn ioctl(&self, _call: &mut ioctl_proxy::HostCall) -> std::io::Result<i32> {
            self.0
                .lock()
                .unwrap()
                .push(nvsim::caller::caller_has_nice());
            Ok(0)
        }
    }

    /// A request thread is an unprivileged caller, but for the proxy's own scheduling call.
    #[test]
    fn test_raise_nice_grants_the_right_for_one_call_on_a_request_thread() {
        use ioctl_proxy::NiceCaller;
        if !sys::thread_caps().unwrap().has_permitted(sys::CAP_SYS_NICE) {
            eprintln!("SKIPPED: this test process lacks CAP_SYS_NICE (run as root)");
            return;
        }
        let seen = std::thread::spawn(|| {
            drop_admin_on_this_thread().unwrap();
            let probe = NiceProbe::default();
            let mut call = ioctl_proxy::HostCall {
                cmd: 0,
                params: Default::default(),
                nested: Default::default(),
            };
            ioctl_proxy::HostFile::ioctl(&probe, &mut call).unwrap();
            RaiseNice.ioctl_nice(&probe, &mut call).unwrap();
            ioctl_proxy::HostFile::ioctl(&probe, &mut call).unwrap();
            let caps = sys::thread_caps().unwrap();
            assert!(!caps.has_effective(sys::CAP_SYS_NICE));
            assert!(caps.has_permitted(sys::CAP_SYS_NICE));
            probe.0.into_inner().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(seen, [false, true, false]);
    }
}
