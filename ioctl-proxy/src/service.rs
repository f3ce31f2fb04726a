//! [`NodeService`]: the one entry of every node's request path. The frontend ([`Proxy`],
//! `/dev/nvidiactl` and `/dev/nvidia<N>`) and UVM (the `uvm` crate's `UvmProxy`,
//! `/dev/nvidia-uvm`) implement it with their own dispatch; [`ioctl`] wraps each call the same
//! way (tracing span, the open's lookup, the instance's in-flight quota, the call's [`Note`],
//! timing, accounting with [`Proxy::account`]) and hands the dispatch one [`Call`]; the daemon
//! serves every node through the trait. A handler's [`Stop`] becomes the client's answer with
//! [`settle`]. One copy, so the nodes cannot drift.

use std::io;
use std::os::fd::OwnedFd;

use crate::audit::Kind;
use crate::error::ProxyError;
use crate::kit::{Note, Stop};
use crate::memory::ClientMemory;
use crate::proxy::{Caller, FdResolver, Node, OpenId, Proxy};

/// One ioctl of a client open, as [`ioctl`] hands it to [`NodeService::dispatch`].
pub struct Call<'a> {
    /// The client's open.
    pub open: OpenId,
    /// The ioctl's command.
    pub cmd: u32,
    /// The ioctl's argument: the address of its params in the caller.
    pub arg: u64,
    /// The caller's memory.
    pub mem: &'a mut dyn ClientMemory,
    /// The caller's fd table.
    pub fds: &'a dyn FdResolver,
}

/// One node type's request path of an instance, as the transports see it.
pub trait NodeService: Send + Sync {
    /// What a call needs of its open (found before the request is entered).
    type File;

    /// The table the node's calls are counted and audited under (the [`Note`]'s kind).
    const KIND: Kind;

    /// The instance's frontend proxy: policy, in-flight quota, counts and audit sink.
    fn instance(&self) -> &Proxy;

    /// Whether this service serves `node`.
    fn serves(&self, node: Node) -> bool;

    /// A client opened `node` (one [`serves`](Self::serves)): a new open with its own host
    /// file.
    fn open_node(&self, node: Node) -> Result<OpenId, ProxyError>;

    /// The last reference to the client's open is gone.
    fn release_open(&self, open: OpenId);

    /// The fd the client maps for an `mmap` of `open`, and the offset to add.
    fn mmap_fd(&self, caller: &Caller, open: OpenId) -> io::Result<(OwnedFd, u64)>;

    /// The open `open`, if it is one of this service's.
    fn file(&self, open: OpenId) -> Option<Self::File>;

    /// The node `file` is an open of, as the audit trail names it.
    fn node(&self, file: &Self::File) -> Node;

    /// Runs `call` on `file` inside [`ioctl`]'s wrapper, saying in `note` (made for
    /// [`Self::KIND`] and the command) what its audit record says.
    fn dispatch(
        &self,
        file: Self::File,
        call: Call<'_>,
        note: &mut Note,
    ) -> Result<i32, ProxyError>;
}

/// Proxies one ioctl of the client open `open` of `svc`. `Ok(ret)` is the ioctl's return value
/// (driver-level failures are NV statuses written into the client's params, with `Ok`);
/// `Err(e)` fails the ioctl with `e.errno()`, except [`ProxyError::Pending`], which asks the
/// transport to fetch more client memory and call again (not accounted: the re-run is).
pub fn ioctl<S: NodeService + ?Sized>(
    svc: &S,
    open: OpenId,
    caller: &Caller,
    cmd: u32,
    arg: u64,
    mem: &mut dyn ClientMemory,
    fds: &dyn FdResolver,
) -> Result<i32, ProxyError> {
    let px = svc.instance();
    let span = tracing::debug_span!(
        "ioctl",
        instance = %px.policy().name,
        tid = caller.tid,
        cmd = format_args!("{cmd:#010x}")
    );
    let _enter = span.enter();
    let start = caller.since.unwrap_or_else(monotonic_ns);
    // A `match`, not `ok_or`: the error (with drop glue) is built only when needed.
    let Some(file) = svc.file(open) else {
        return Err(ProxyError::UnknownOpen(open.0));
    };
    let _in_flight = px.enter_request()?;
    let node = svc.node(&file);
    let mut note = Note::new(S::KIND, cmd);
    let call = Call {
        open,
        cmd,
        arg,
        mem: &mut *mem,
        fds,
    };
    let res = svc.dispatch(file, call, &mut note);
    // The answer is final: the client goes on while the books are kept (and whatever the
    // transport does after the call). A handler may have answered earlier still.
    if let Ok(ret) = res {
        mem.answer_now(ret);
    }
    if !matches!(res, Err(ProxyError::Pending)) {
        px.account(caller, &node, note, &res, start);
    }
    res
}

/// A handler's result as the client's answer: a [`Stop::Status`] is recorded in `note` and
/// written into the client's params by `answer`, and the ioctl succeeds; a [`Stop::Err`]
/// fails it.
pub fn settle(
    note: &mut Note,
    res: Result<i32, Stop>,
    answer: impl FnOnce(u32) -> Result<(), ProxyError>,
) -> Result<i32, ProxyError> {
    match res {
        Ok(r) => Ok(r),
        Err(Stop::Err(e)) => Err(e),
        Err(Stop::Status {
            status,
            decision,
            reason,
        }) => {
            note.stopped(status, decision, reason);
            answer(status)?;
            Ok(0)
        }
    }
}

/// The monotonic clock (`CLOCK_MONOTONIC`, what `Instant` reads) in nanoseconds: a request's
/// start and its latency, without `Instant`'s `Duration` arithmetic on every request.
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u64::try_from(t.tv_sec())
            .unwrap_or(0)
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::try_from(t.tv_nsec()).unwrap_or(0))
    })
}
