//! The mmap path, daemon side: tickets and the per-instance socket.
//!
//! CUSE has no `mmap`: `mmap()` on our nodes fails with `ENODEV` in the kernel, and the daemon
//! never hears of it. The in-container shim (`libnvproxy_preload.so`, crate `preload`) turns an
//! mmap of our node into three steps (protocol: crate `preload-proto`):
//!
//! 1. `NVPROXY_IOC_MMAP_TICKET` on the node's fd. [`InstanceMmap::ticket_ioctl`] reads the
//!    caller's arguments (with the instance's client-memory transport), and issues a ticket:
//!    64 random bits, bound to this instance (each instance has its own [`TicketStore`]), to the
//!    open file it came in on (node and `fh`), and to the calling thread group; single use;
//!    expiring after [`TICKET_TTL`]; at most [`MAX_TICKETS`] outstanding (else `EAGAIN`).
//! 2. The shim connects to the instance socket (`/run/nvproxy/<instance>/mmap.sock`, bind-mounted
//!    at `/run/nvproxy/mmap.sock` inside `nvproxy exec`/`run`) and sends the ticket. The
//!    [`MmapSocket`] thread takes the peer's pid from `SO_PEERCRED` (the thread group that
//!    connected, in our pid namespace): unless it is the ticket's thread group, and the ticket
//!    is live and unused, nothing is sent and the connection is closed. A peer with a wrong pid
//!    does not use the ticket up.
//! 3. For a redeemed ticket it asks the node's backend for the mapping fd
//!    (`Backend::mapping_fd(fh)`: the driver decides what the open file maps, and its errno is
//!    the mmap's errno) and sends `{errno, offset_adjust}` with the fd attached by `SCM_RIGHTS`.
//!    The shim maps it with the caller's exact arguments and closes it.
//!
//! A client without the shim gets `ENODEV` from the kernel. The daemon cannot see that mmap,
//! so it says so where it can: once per instance at start (info), and once per client process
//! that opens a node without the shim mapped (`/proc/<pid>/maps`, checked at open; info).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cuse_dev::{Errno, IoVec, Ioctl, IoctlReply, Request};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{self, ControlMessage, MsgFlags, sockopt};
use nix::sys::time::TimeVal;
use nvproxy_preload_proto::{MmapReply, MmapRequest, MmapTicketArgs};

use crate::config::MemoryTransport;
use crate::device::{Backend, NodeRef};
use crate::sys;

/// How long a ticket stays valid. The shim redeems it right after the ioctl returns; a few
/// seconds leave room for a slow (emulated, overloaded) machine.
pub const TICKET_TTL: Duration = Duration::from_secs(5);
/// Tickets outstanding per instance.
pub const MAX_TICKETS: usize = 256;
/// Where instance sockets live on the host: `<RUN_DIR>/<instance>/mmap.sock`.
pub const RUN_DIR: &str = "/run/nvproxy";
/// The socket's file name in the instance directory.
pub const SOCKET_NAME: &str = "mmap.sock";
/// How long the socket thread waits for a connected peer's request.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// The shim's file name, looked for next to the `nvproxy` binary.
pub const SHIM_NAME: &str = "libnvproxy_preload.so";

/// One outstanding ticket.
#[derive(Debug, Clone)]
pub struct Ticket<T> {
    /// What to ask for the mapping fd (the node's backend, in the daemon).
    pub target: T,
    /// The open file the ticket was issued on.
    pub fh: u64,
    /// The thread group that asked for it (the only peer that may redeem it).
    pub tgid: u32,
    /// When it stops being valid.
    pub expires: Instant,
    /// The mmap call it was issued for (logged).
    pub args: MmapTicketArgs,
}

/// Why a ticket was not redeemed. Whatever the reason, the peer gets nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No such ticket (never issued here, already used, or dropped with its open file).
    Unknown,
    /// The ticket's time is up (it is dropped).
    Expired,
    /// The ticket belongs to another thread group (it stays valid for its owner).
    WrongPeer {
        /// The ticket's thread group.
        owner: u32,
    },
}

struct Tickets<T> {
    map: HashMap<u64, Ticket<T>>,
    random: Box<dyn FnMut() -> io::Result<u64> + Send>,
}

/// One instance's tickets.
pub struct TicketStore<T> {
    inner: Mutex<Tickets<T>>,
    ttl: Duration,
    max: usize,
}

impl<T: Clone> TicketStore<T> {
    /// A store whose tickets come from `random`, live `ttl` and number at most `max`.
    pub fn new(
        ttl: Duration,
        max: usize,
        random: Box<dyn FnMut() -> io::Result<u64> + Send>,
    ) -> Self {
        TicketStore {
            inner: Mutex::new(Tickets {
                map: HashMap::new(),
                random,
            }),
            ttl,
            max,
        }
    }

    /// A store with tickets from `/dev/urandom`.
    pub fn with_urandom(ttl: Duration, max: usize) -> io::Result<Self> {
        let mut urandom = File::open("/dev/urandom")?;
        Ok(Self::new(
            ttl,
            max,
            Box::new(move || {
                let mut b = [0u8; 8];
                urandom.read_exact(&mut b)?;
                Ok(u64::from_ne_bytes(b))
            }),
        ))
    }

    fn lock(&self) -> MutexGuard<'_, Tickets<T>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Issues a ticket for open file `fh` (reached through `target`) to thread group `tgid`.
    /// `EAGAIN` when [`MAX_TICKETS`] live tickets are outstanding; `EIO` when no random number
    /// can be had.
    pub fn issue(
        &self,
        target: T,
        fh: u64,
        tgid: u32,
        args: MmapTicketArgs,
        now: Instant,
    ) -> Result<u64, Errno> {
        let mut t = self.lock();
        t.map.retain(|_, k| k.expires > now);
        if t.map.len() >= self.max {
            return Err(Errno::EAGAIN);
        }
        let id = loop {
            let id = (t.random)().map_err(|e| {
                tracing::error!(error = %e, "no random number for an mmap ticket");
                Errno::EIO
            })?;
            if id != 0 && !t.map.contains_key(&id) {
                break id;
            }
        };
        t.map.insert(
            id,
            Ticket {
                target,
                fh,
                tgid,
                expires: now + self.ttl,
                args,
            },
        );
        Ok(id)
    }

    /// Redeems `ticket` for a peer whose thread group is `peer`: the ticket, removed, or why not.
    pub fn redeem(&self, ticket: u64, peer: u32, now: Instant) -> Result<Ticket<T>, Refusal> {
        let mut t = self.lock();
        let Some(k) = t.map.get(&ticket) else {
            return Err(Refusal::Unknown);
        };
        if k.tgid != peer {
            return Err(Refusal::WrongPeer { owner: k.tgid });
        }
        let k = t.map.remove(&ticket).ok_or(Refusal::Unknown)?;
        if k.expires <= now {
            return Err(Refusal::Expired);
        }
        Ok(k)
    }

    /// Drops every ticket for which `issued_on(target, fh)` holds (its open file is gone).
    pub fn forget(&self, issued_on: impl Fn(&T, u64) -> bool) {
        self.lock().map.retain(|_, k| !issued_on(&k.target, k.fh));
    }

    /// Live tickets.
    #[cfg(test)]
    pub fn outstanding(&self, now: Instant) -> usize {
        self.lock().map.values().filter(|k| k.expires > now).count()
    }
}

/// The node a ticket was issued on and the backend that answers for it.
#[derive(Clone)]
pub struct Target {
    /// The node.
    pub node: NodeRef,
    /// Its backend.
    pub backend: Arc<dyn Backend>,
}

/// A bounded number of warnings per minute; the rest go to debug (a hostile tenant must not
/// flood the admin's log).
struct WarnLimit {
    window: Instant,
    count: u32,
}

const WARNINGS_PER_MINUTE: u32 = 20;

/// One instance's mmap state: its tickets and the shim check of its clients.
pub struct InstanceMmap {
    instance: String,
    tickets: TicketStore<Target>,
    /// Thread ids already checked for the shim at open (bounded).
    checked: Mutex<HashSet<u32>>,
    warn: Mutex<WarnLimit>,
}

impl InstanceMmap {
    /// The mmap state of `instance`.
    pub fn new(instance: &str) -> io::Result<Self> {
        Ok(InstanceMmap {
            instance: instance.to_owned(),
            tickets: TicketStore::with_urandom(TICKET_TTL, MAX_TICKETS)?,
            checked: Mutex::new(HashSet::new()),
            warn: Mutex::new(WarnLimit {
                window: Instant::now(),
                count: 0,
            }),
        })
    }

    fn may_warn(&self) -> bool {
        let mut w = self.warn.lock().unwrap_or_else(|e| e.into_inner());
        if w.window.elapsed() >= Duration::from_secs(60) {
            w.window = Instant::now();
            w.count = 0;
        }
        w.count += 1;
        w.count <= WARNINGS_PER_MINUTE
    }

    /// `NVPROXY_IOC_MMAP_TICKET` on `node`'s open file `io.fh`.
    pub fn ticket_ioctl(
        &self,
        node: NodeRef,
        backend: &Arc<dyn Backend>,
        req: &Request,
        io: &Ioctl<'_>,
        transport: MemoryTransport,
    ) -> Result<IoctlReply, Errno> {
        let tid = req.pid();
        if tid == 0 {
            // The caller lives outside our pid namespace: it can never be a socket peer we know.
            return Err(Errno::EPERM);
        }
        let ticket_addr = io
            .arg
            .checked_add(MmapTicketArgs::TICKET_OFFSET as u64)
            .ok_or(Errno::EFAULT)?;
        let args = match transport {
            MemoryTransport::ProcessVm => {
                let mut b = [0u8; MmapTicketArgs::SIZE];
                sys::process_vm_read(tid, io.arg, &mut b).map_err(|_| Errno::EFAULT)?;
                MmapTicketArgs::from_bytes(&b).ok_or(Errno::EFAULT)?
            }
            MemoryTransport::Retry => {
                if !io.is_unrestricted() {
                    return Err(Errno::EINVAL);
                }
                if io.in_data.is_empty() {
                    // First round: ask the kernel for the struct, and for the ticket's bytes as
                    // the output region. The second round carries the struct; no state needed.
                    return Ok(IoctlReply::Retry {
                        in_iovs: vec![IoVec::new(io.arg, MmapTicketArgs::SIZE as u64)],
                        out_iovs: vec![IoVec::new(ticket_addr, 8)],
                    });
                }
                if io.in_data.len() != MmapTicketArgs::SIZE {
                    return Err(Errno::EINVAL);
                }
                MmapTicketArgs::from_bytes(io.in_data).ok_or(Errno::EINVAL)?
            }
        };
        let tgid = tgid_of(tid).map_err(|_| Errno::ESRCH)?;
        let target = Target {
            node,
            backend: backend.clone(),
        };
        let ticket = self
            .tickets
            .issue(target, io.fh, tgid, args, Instant::now())
            .inspect_err(|_| {
                tracing::warn!(instance = %self.instance, tgid, "too many mmap tickets outstanding");
            })?;
        tracing::debug!(instance = %self.instance, ?node, fh = io.fh, tid, tgid, len = args.len, offset = args.offset, "mmap ticket issued");
        match transport {
            MemoryTransport::ProcessVm => {
                if sys::process_vm_write(tid, ticket_addr, &ticket.to_ne_bytes()).is_err() {
                    // The caller never learns the ticket: withdraw it.
                    let _ = self.tickets.redeem(ticket, tgid, Instant::now());
                    return Err(Errno::EFAULT);
                }
                Ok(IoctlReply::result(0))
            }
            MemoryTransport::Retry => Ok(IoctlReply::Done {
                result: 0,
                out: ticket.to_ne_bytes().to_vec(),
            }),
        }
    }

    /// Open file `fh` of `node` is gone: its tickets go with it.
    pub fn released(&self, node: NodeRef, fh: u64) {
        self.tickets.forget(|t, f| t.node == node && f == fh);
    }

    /// A client thread `tid` opened `node`: once per thread, say so if its process does not
    /// have the shim mapped (its mmaps of the node will fail with ENODEV).
    pub fn opened(&self, node: NodeRef, tid: u32) {
        if tid == 0 || sys::is_own_thread(tid) {
            return;
        }
        {
            let mut checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
            if checked.len() >= 4096 {
                checked.clear();
            }
            if !checked.insert(tid) {
                return;
            }
        }
        if let Ok(false) = has_shim(tid) {
            let comm = std::fs::read_to_string(format!("/proc/{tid}/comm")).unwrap_or_default();
            tracing::info!(
                instance = %self.instance,
                node = %node.dev_name(),
                pid = tid,
                comm = comm.trim(),
                "client opened a node without the mmap shim ({SHIM_NAME}): its mmap() of the node will fail with ENODEV (CUSE has no mmap); run it with `nvproxy exec`/`nvproxy run`, or LD_PRELOAD the shim and mount the instance socket"
            );
        }
    }

    /// Serves one connection of the instance socket.
    fn serve_peer(&self, conn: OwnedFd) {
        let peer = match socket::getsockopt(&conn, sockopt::PeerCredentials) {
            Ok(c) => u32::try_from(c.pid()).unwrap_or(0),
            Err(e) => {
                tracing::warn!(instance = %self.instance, error = %e, "SO_PEERCRED failed");
                return;
            }
        };
        let _ = socket::setsockopt(&conn, sockopt::ReceiveTimeout, &timeval(PEER_TIMEOUT));
        let _ = socket::setsockopt(&conn, sockopt::SendTimeout, &timeval(PEER_TIMEOUT));
        // A plain recv: fds a peer might attach are discarded by the kernel, never installed.
        let mut buf = [0u8; MmapRequest::SIZE + 1];
        let n = match socket::recv(conn.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(instance = %self.instance, peer, error = %e, "mmap socket: no request");
                return;
            }
        };
        let Some(req) = MmapRequest::decode(&buf[..n]) else {
            self.refused(peer, "malformed request");
            return;
        };
        let ticket = match self.tickets.redeem(req.ticket, peer, Instant::now()) {
            Ok(t) => t,
            Err(Refusal::Unknown) => {
                return self.refused(peer, "unknown or used ticket (replay, another instance's, or its open file is closed)");
            }
            Err(Refusal::Expired) => return self.refused(peer, "expired ticket"),
            Err(Refusal::WrongPeer { owner }) => {
                if self.may_warn() {
                    tracing::warn!(instance = %self.instance, peer, owner, "mmap ticket presented by a process that did not ask for it: refused, nothing sent");
                }
                return;
            }
        };
        let (reply, fd) = match ticket.target.backend.mapping_fd(ticket.fh) {
            Ok((fd, adjust)) => (
                MmapReply {
                    errno: 0,
                    offset_adjust: adjust,
                },
                Some(fd),
            ),
            Err(e) => (
                MmapReply {
                    errno: e.raw(),
                    offset_adjust: 0,
                },
                None,
            ),
        };
        tracing::debug!(instance = %self.instance, node = ?ticket.target.node, fh = ticket.fh, peer, errno = reply.errno, addr = format_args!("{:#x}", ticket.args.addr), len = ticket.args.len, offset = ticket.args.offset, "mmap ticket redeemed");
        let bytes = reply.encode();
        let iov = [io::IoSlice::new(&bytes)];
        let raw = fd.as_ref().map(|f| [f.as_raw_fd()]);
        let cmsgs: Vec<ControlMessage<'_>> = raw
            .as_ref()
            .map(|r| vec![ControlMessage::ScmRights(r)])
            .unwrap_or_default();
        if let Err(e) =
            socket::sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        {
            tracing::debug!(instance = %self.instance, peer, error = %e, "mmap socket: reply not sent");
        }
    }

    fn refused(&self, peer: u32, why: &str) {
        if self.may_warn() {
            tracing::warn!(instance = %self.instance, peer, "mmap ticket refused: {why}; nothing sent");
        } else {
            tracing::debug!(instance = %self.instance, peer, "mmap ticket refused: {why}");
        }
    }

    /// The ticket store (tests).
    #[cfg(test)]
    pub fn tickets(&self) -> &TicketStore<Target> {
        &self.tickets
    }
}

fn timeval(d: Duration) -> TimeVal {
    TimeVal::new(d.as_secs() as i64, 0)
}

/// The thread group of thread `tid` (`Tgid:` in `/proc/<tid>/status`).
fn tgid_of(tid: u32) -> io::Result<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))
}

/// Whether process (thread) `tid` has the shim mapped. Reads at most 4 MiB of its maps.
fn has_shim(tid: u32) -> io::Result<bool> {
    let f = File::open(format!("/proc/{tid}/maps"))?;
    let mut r = BufReader::new(f.take(4 << 20));
    let mut line = Vec::new();
    while r.read_until(b'\n', &mut line)? != 0 {
        if line.ends_with(b"/libnvproxy_preload.so\n") || line.ends_with(b"/libnvproxy_preload.so")
        {
            return Ok(true);
        }
        line.clear();
    }
    Ok(false)
}

/// The instance socket and its accepting thread. Dropping it stops the thread and removes the
/// socket and its directory.
pub struct MmapSocket {
    path: PathBuf,
    dir: PathBuf,
    stop: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl MmapSocket {
    /// Serves `mmap` at `<root>/<instance>/mmap.sock` (`root` is [`RUN_DIR`] outside tests).
    /// The directories are 0700 (only root on the host reaches the socket by its path; clients
    /// reach it through the bind mount), the socket 0666 (any uid in the container may connect;
    /// tickets and `SO_PEERCRED` decide). A stale socket of an earlier run is replaced: the
    /// instance's nodes are registered first, so a live daemon serving this instance would have
    /// made us fail before.
    pub fn start(mmap: Arc<InstanceMmap>, root: &Path) -> Result<MmapSocket> {
        make_private_dir(root)?;
        let dir = root.join(&mmap.instance);
        make_private_dir(&dir)?;
        let path = dir.join(SOCKET_NAME);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(&path)
                .with_context(|| format!("removing stale {}", path.display()))?,
            Ok(_) => anyhow::bail!("{} exists and is not a socket", path.display()),
            Err(_) => {}
        }
        let listener = socket::socket(
            socket::AddressFamily::Unix,
            socket::SockType::SeqPacket,
            socket::SockFlag::SOCK_CLOEXEC | socket::SockFlag::SOCK_NONBLOCK,
            None,
        )
        .context("creating the mmap socket")?;
        let addr = socket::UnixAddr::new(&path).context("mmap socket path")?;
        socket::bind(listener.as_raw_fd(), &addr)
            .with_context(|| format!("binding {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        socket::listen(&listener, socket::Backlog::new(64).context("backlog")?)
            .context("listen on the mmap socket")?;
        let (stop_r, stop_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe for the mmap socket")?;
        let thread = std::thread::Builder::new()
            .name(format!("mmap-{}", mmap.instance))
            .spawn(move || accept_loop(&mmap, &listener, &stop_r))?;
        Ok(MmapSocket {
            path,
            dir,
            stop: Some(stop_w),
            thread: Some(thread),
        })
    }

    /// The socket's path on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for MmapSocket {
    fn drop(&mut self) {
        // Closing the pipe's write end wakes the thread (POLLHUP).
        drop(self.stop.take());
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!(socket = %self.path.display(), "mmap socket thread panicked");
        }
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn make_private_dir(dir: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(dir)?;
            if !m.is_dir() {
                anyhow::bail!("{} exists and is not a directory", dir.display());
            }
            if m.uid() != 0 && nix::unistd::geteuid().is_root() {
                anyhow::bail!("{} is not owned by root", dir.display());
            }
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("creating {}", dir.display())),
    }
}

fn accept_loop(mmap: &InstanceMmap, listener: &OwnedFd, stop: &OwnedFd) {
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::error!(instance = %mmap.instance, error = %e, "mmap socket: poll failed; no more mmaps for this instance");
                return;
            }
        }
        if fds[1].any().unwrap_or(true) {
            return;
        }
        match sys::accept_cloexec(listener.as_fd()) {
            Ok(conn) => mmap.serve_peer(conn),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EINTR | libc::ECONNABORTED)
                ) => {}
            Err(e) => {
                tracing::warn!(instance = %mmap.instance, error = %e, "mmap socket: accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// The value of `NVPROXY_NODES` for the nodes at `paths` (`maj:min,...`).
pub fn node_ids<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Result<String> {
    let mut ids = Vec::new();
    for p in paths {
        let m = std::fs::metadata(p).with_context(|| format!("node {}", p.display()))?;
        ids.push(nvproxy_preload_proto::format_dev(m.rdev()));
    }
    Ok(ids.join(","))
}

/// The shim to inject: `--preload PATH`, else `libnvproxy_preload.so` next to our binary. An
/// error says how to get it.
pub fn shim_path(explicit: Option<&Path>) -> Result<PathBuf> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .context("finding our own executable")?
            .parent()
            .context("our executable has no directory")?
            .join(SHIM_NAME),
    };
    if !path.is_file() {
        anyhow::bail!(
            "the mmap shim {} is missing: build it (`cargo build -p preload`, next to nvproxy), \
             pass --preload PATH, or --no-preload (mmap of the nodes then fails with ENODEV)",
            path.display()
        );
    }
    std::fs::canonicalize(&path).with_context(|| format!("resolving {}", path.display()))
}

/// `LD_PRELOAD` with `shim` appended to what the user set (unless already there).
pub fn ld_preload_with(existing: Option<&str>, shim: &Path) -> String {
    let shim = shim.to_string_lossy();
    match existing.map(str::trim).filter(|e| !e.is_empty()) {
        None => shim.into_owned(),
        Some(e) if e.split([' ', ':']).any(|p| p == shim) => e.to_owned(),
        Some(e) => format!("{e}:{shim}"),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    fn counter() -> Box<dyn FnMut() -> io::Result<u64> + Send> {
        let next = AtomicU64::new(100);
        Box::new(move || Ok(next.fetch_add(1, Ordering::Relaxed)))
    }

    fn store() -> TicketStore<&'static str> {
        TicketStore::new(Duration::from_secs(5), 4, counter())
    }

    fn args() -> MmapTicketArgs {
        MmapTicketArgs {
            len: 4096,
            ..Default::default()
        }
    }

    #[test]
    fn test_ticket_redeems_once() {
        let s = store();
        let now = Instant::now();
        let t = s.issue("ctl", 7, 1000, args(), now).unwrap();
        let got = s.redeem(t, 1000, now).map(|k| (k.target, k.fh));
        let again = s.redeem(t, 1000, now).map(|k| k.fh);
        assert_eq!((got, again), (Ok(("ctl", 7)), Err(Refusal::Unknown)));
    }

    #[test]
    fn test_expired_ticket_is_refused_and_dropped() {
        let s = store();
        let now = Instant::now();
        let t = s.issue("ctl", 7, 1000, args(), now).unwrap();
        let later = now + Duration::from_secs(5);
        let first = s.redeem(t, 1000, later).map(|k| k.fh);
        let second = s.redeem(t, 1000, now).map(|k| k.fh);
        assert_eq!(
            (first, second),
            (Err(Refusal::Expired), Err(Refusal::Unknown))
        );
    }

    #[test]
    fn test_ticket_of_another_store_is_unknown() {
        let (a, b) = (
            store(),
            TicketStore::<&str>::new(Duration::from_secs(5), 4, counter()),
        );
        let now = Instant::now();
        let t = a.issue("ctl", 7, 1000, args(), now).unwrap();
        // Even with the same number sequence, b never issued it.
        assert_eq!(b.redeem(t, 1000, now).map(|k| k.fh), Err(Refusal::Unknown));
    }

    #[test]
    fn test_wrong_peer_is_refused_and_does_not_use_the_ticket() {
        let s = store();
        let now = Instant::now();
        let t = s.issue("ctl", 7, 1000, args(), now).unwrap();
        let wrong = s.redeem(t, 1001, now).map(|k| k.fh);
        let right = s.redeem(t, 1000, now).map(|k| k.fh);
        assert_eq!(
            (wrong, right),
            (Err(Refusal::WrongPeer { owner: 1000 }), Ok(7))
        );
    }

    #[test]
    fn test_ticket_is_bound_to_its_open_file() {
        let s = store();
        let now = Instant::now();
        let t7 = s.issue("ctl", 7, 1000, args(), now).unwrap();
        let t8 = s.issue("ctl", 8, 1000, args(), now).unwrap();
        s.forget(|node, fh| *node == "ctl" && fh == 7);
        let r7 = s.redeem(t7, 1000, now).map(|k| k.fh);
        let r8 = s.redeem(t8, 1000, now).map(|k| k.fh);
        assert_eq!((r7, r8), (Err(Refusal::Unknown), Ok(8)));
    }

    #[test]
    fn test_forget_matches_node_as_well_as_fh() {
        let s = store();
        let now = Instant::now();
        let t = s.issue("gpu0", 7, 1000, args(), now).unwrap();
        s.forget(|node, fh| *node == "ctl" && fh == 7);
        assert_eq!(s.redeem(t, 1000, now).map(|k| k.fh), Ok(7));
    }

    #[test]
    fn test_store_is_bounded() {
        let s = store();
        let now = Instant::now();
        for _ in 0..4 {
            s.issue("ctl", 7, 1000, args(), now).unwrap();
        }
        assert_eq!(s.issue("ctl", 7, 1000, args(), now), Err(Errno::EAGAIN));
    }

    #[test]
    fn test_expired_tickets_free_their_places() {
        let s = store();
        let now = Instant::now();
        for _ in 0..4 {
            s.issue("ctl", 7, 1000, args(), now).unwrap();
        }
        let later = now + Duration::from_secs(6);
        assert!(s.issue("ctl", 7, 1000, args(), later).is_ok());
        assert_eq!(s.outstanding(later), 1);
    }

    #[test]
    fn test_zero_and_duplicate_numbers_are_skipped() {
        let seq = Mutex::new(vec![0u64, 5, 5, 6].into_iter());
        let s = TicketStore::new(
            Duration::from_secs(5),
            4,
            Box::new(move || Ok(seq.lock().unwrap().next().unwrap())),
        );
        let now = Instant::now();
        let a = s.issue("ctl", 1, 1, args(), now).unwrap();
        let b = s.issue("ctl", 1, 1, args(), now).unwrap();
        assert_eq!((a, b), (5, 6));
    }

    #[test]
    fn test_urandom_tickets_differ() {
        let s = TicketStore::with_urandom(Duration::from_secs(5), 4).unwrap();
        let now = Instant::now();
        let a = s.issue("ctl", 1, 1, args(), now).unwrap();
        let b = s.issue("ctl", 1, 1, args(), now).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn test_ld_preload_is_appended_once() {
        let shim = Path::new("/opt/nvproxy/libnvproxy_preload.so");
        assert_eq!(
            ld_preload_with(None, shim),
            "/opt/nvproxy/libnvproxy_preload.so"
        );
        assert_eq!(
            ld_preload_with(Some(" "), shim),
            "/opt/nvproxy/libnvproxy_preload.so"
        );
        assert_eq!(
            ld_preload_with(Some("libfoo.so"), shim),
            "libfoo.so:/opt/nvproxy/libnvproxy_preload.so"
        );
        assert_eq!(
            ld_preload_with(Some("/opt/nvproxy/libnvproxy_preload.so libfoo.so"), shim),
            "/opt/nvproxy/libnvproxy_preload.so libfoo.so"
        );
    }

    #[test]
    fn test_tgid_of_another_thread_is_our_pid() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw() as u32).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let got = tgid_of(tid).unwrap();
        done_tx.send(()).unwrap();
        t.join().unwrap();
        assert_eq!(
            (got == std::process::id(), tid == std::process::id()),
            (true, false)
        );
    }

    // ---- the socket, in-process ------------------------------------------------------------

    /// A backend whose every open maps a memfd holding "nvproxy" at offset 0.
    struct MemfdBackend;

    impl Backend for MemfdBackend {
        fn open(&self, _node: NodeRef, _pid: u32) -> Result<u64, Errno> {
            Ok(1)
        }
        fn release(&self, _open: u64) {}
        fn mapping_fd(&self, open: u64) -> Result<(OwnedFd, u64), Errno> {
            if open != 7 {
                return Err(Errno::EINVAL);
            }
            let fd = nix::sys::memfd::memfd_create(
                c"mmap-test",
                nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
            )
            .map_err(|_| Errno::EIO)?;
            let f = File::from(fd);
            f.set_len(4096).map_err(|_| Errno::EIO)?;
            std::io::Write::write_all(&mut &f, b"nvproxy").map_err(|_| Errno::EIO)?;
            Ok((f.into(), 4096))
        }
        fn ioctl(
            &self,
            _open: u64,
            _tid: u32,
            _cmd: u32,
            _arg: u64,
            _mem: &mut dyn ioctl_proxy::ClientMemory,
            _fds: crate::device::FdLookup<'_>,
        ) -> Result<i32, Errno> {
            Err(Errno::ENOTTY)
        }
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nvproxy-mmap-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn served(tag: &str) -> (Arc<InstanceMmap>, MmapSocket, PathBuf) {
        let root = scratch(tag);
        let m = Arc::new(InstanceMmap::new("inst").unwrap());
        let s = MmapSocket::start(m.clone(), &root).unwrap();
        (m, s, root)
    }

    fn issue(m: &InstanceMmap, fh: u64, tgid: u32) -> u64 {
        let target = Target {
            node: NodeRef::Ctl,
            backend: Arc::new(MemfdBackend),
        };
        m.tickets()
            .issue(target, fh, tgid, args(), Instant::now())
            .unwrap()
    }

    /// Sends `ticket` on a fresh connection; the reply and the fd, or None when the daemon
    /// closed without a word.
    fn ask(path: &Path, ticket: u64) -> Option<(MmapReply, Option<OwnedFd>)> {
        let s = socket::socket(
            socket::AddressFamily::Unix,
            socket::SockType::SeqPacket,
            socket::SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        socket::connect(s.as_raw_fd(), &socket::UnixAddr::new(path).unwrap()).unwrap();
        socket::send(
            s.as_raw_fd(),
            &MmapRequest { ticket }.encode(),
            MsgFlags::empty(),
        )
        .unwrap();
        let mut buf = [0u8; 32];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 2]);
        let mut iov = [io::IoSliceMut::new(&mut buf)];
        let msg = socket::recvmsg::<()>(
            s.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .unwrap();
        let n = msg.bytes;
        let mut fds = Vec::new();
        for c in msg.cmsgs().unwrap() {
            if let socket::ControlMessageOwned::ScmRights(v) = c {
                fds.extend(v);
            }
        }
        if n == 0 {
            assert!(fds.is_empty());
            return None;
        }
        assert!(fds.len() <= 1);
        let fd = fds.first().map(|&raw| {
            // The test owns what it received.
            sys::owned_from_received(raw)
        });
        Some((MmapReply::decode(&buf[..n]).unwrap(), fd))
    }

    #[test]
    fn test_socket_hands_the_mapping_fd_to_the_ticket_owner() {
        let (m, s, root) = served("owner");
        let t = issue(&m, 7, std::process::id());
        let (reply, fd) = ask(s.path(), t).expect("a reply");
        let mut got = [0u8; 7];
        let f = File::from(fd.expect("an fd"));
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut got, 0).unwrap();
        assert_eq!(
            (reply.errno, reply.offset_adjust, &got),
            (0, 4096, b"nvproxy")
        );
        drop(s);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_socket_replay_gets_nothing() {
        let (m, s, root) = served("replay");
        let t = issue(&m, 7, std::process::id());
        assert!(ask(s.path(), t).is_some());
        assert!(ask(s.path(), t).is_none());
        drop(s);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_socket_peer_other_than_the_ticket_owner_gets_nothing() {
        let (m, s, root) = served("peer");
        let t = issue(&m, 7, std::process::id() + 1);
        assert!(ask(s.path(), t).is_none());
        assert_eq!(m.tickets().outstanding(Instant::now()), 1);
        drop(s);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_socket_unknown_ticket_gets_nothing() {
        let (_m, s, root) = served("unknown");
        assert!(ask(s.path(), 0x1234_5678).is_none());
        drop(s);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_socket_driver_errno_comes_back_without_fd() {
        let (m, s, root) = served("errno");
        let t = issue(&m, 8, std::process::id());
        let (reply, fd) = ask(s.path(), t).expect("a reply");
        assert_eq!((reply.errno, fd.is_none()), (libc::EINVAL, true));
        drop(s);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_socket_ignores_a_stream_peer_and_serves_on() {
        let (m, s, root) = served("stream");
        // A SOCK_STREAM connect to a SEQPACKET socket fails; a silent SEQPACKET peer times out.
        assert!(UnixStream::connect(s.path()).is_err());
        let t = issue(&m, 7, std::process::id());
        assert!(ask(s.path(), t).is_some());
        drop(s);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_socket_path_is_per_instance_and_private() {
        let root = scratch("paths");
        let a = Arc::new(InstanceMmap::new("a").unwrap());
        let b = Arc::new(InstanceMmap::new("b").unwrap());
        let sa = MmapSocket::start(a, &root).unwrap();
        let sb = MmapSocket::start(b, &root).unwrap();
        let dir_mode = std::fs::metadata(root.join("a")).unwrap().mode() & 0o777;
        let sock_mode = std::fs::metadata(sa.path()).unwrap().mode() & 0o777;
        assert_eq!(
            (sa.path(), sb.path(), dir_mode, sock_mode),
            (
                root.join("a/mmap.sock").as_path(),
                root.join("b/mmap.sock").as_path(),
                0o700,
                0o666
            )
        );
        drop((sa, sb));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_stopping_removes_the_socket_and_its_directory() {
        let (_m, s, root) = served("stop");
        let path = s.path().to_path_buf();
        drop(s);
        assert!(!path.exists() && !root.join("inst").exists());
        let _ = std::fs::remove_dir_all(root);
    }

    // ---- the ticket ioctl ----------------------------------------------------------------

    fn memfd_target() -> Arc<dyn Backend> {
        Arc::new(MemfdBackend)
    }

    fn ioctl_at<'a>(fh: u64, arg: u64, in_data: &'a [u8], out_size: u32) -> Ioctl<'a> {
        Ioctl {
            fh,
            cmd: nvproxy_preload_proto::NVPROXY_IOC_MMAP_TICKET,
            arg,
            flags: cuse_dev::wire::FUSE_IOCTL_UNRESTRICTED,
            in_data,
            out_size,
        }
    }

    fn me() -> Request {
        Request::detached(1, nix::unistd::gettid().as_raw() as u32, 0, 0)
    }

    #[test]
    fn test_retry_ticket_first_round_asks_for_the_struct_and_the_ticket_bytes() {
        let m = InstanceMmap::new("inst").unwrap();
        let r = m.ticket_ioctl(
            NodeRef::Ctl,
            &memfd_target(),
            &me(),
            &ioctl_at(7, 0x1000, &[], 0),
            MemoryTransport::Retry,
        );
        assert_eq!(
            r,
            Ok(IoctlReply::Retry {
                in_iovs: vec![IoVec::new(0x1000, 40)],
                out_iovs: vec![IoVec::new(0x1000 + 32, 8)],
            })
        );
    }

    #[test]
    fn test_retry_ticket_second_round_returns_a_redeemable_ticket() {
        let m = InstanceMmap::new("inst").unwrap();
        let data = args().to_bytes();
        let r = m.ticket_ioctl(
            NodeRef::Ctl,
            &memfd_target(),
            &me(),
            &ioctl_at(7, 0x1000, &data, 8),
            MemoryTransport::Retry,
        );
        let Ok(IoctlReply::Done { result: 0, out }) = r else {
            panic!("{r:?}");
        };
        let ticket = u64::from_ne_bytes(out.try_into().unwrap());
        let got = m
            .tickets()
            .redeem(ticket, std::process::id(), Instant::now())
            .map(|t| (t.fh, t.target.node));
        assert_eq!(got.ok(), Some((7, NodeRef::Ctl)));
    }

    #[test]
    fn test_retry_ticket_round_with_wrong_size_is_einval() {
        let m = InstanceMmap::new("inst").unwrap();
        let r = m.ticket_ioctl(
            NodeRef::Ctl,
            &memfd_target(),
            &me(),
            &ioctl_at(7, 0x1000, &[0u8; 12], 8),
            MemoryTransport::Retry,
        );
        assert_eq!(r, Err(Errno::EINVAL));
    }

    #[test]
    fn test_process_vm_ticket_is_written_into_the_callers_struct() {
        let m = InstanceMmap::new("inst").unwrap();
        let mut buf = args().to_bytes();
        let r = m.ticket_ioctl(
            NodeRef::Gpu(0),
            &memfd_target(),
            &me(),
            &ioctl_at(9, buf.as_mut_ptr() as u64, &[], 0),
            MemoryTransport::ProcessVm,
        );
        let written = MmapTicketArgs::from_bytes(&buf).unwrap().ticket;
        let got = m
            .tickets()
            .redeem(written, std::process::id(), Instant::now())
            .map(|t| t.fh);
        assert_eq!((r, got.ok()), (Ok(IoctlReply::result(0)), Some(9)));
    }

    #[test]
    fn test_process_vm_ticket_with_bad_pointer_is_efault_and_issues_nothing() {
        let m = InstanceMmap::new("inst").unwrap();
        let r = m.ticket_ioctl(
            NodeRef::Ctl,
            &memfd_target(),
            &me(),
            &ioctl_at(7, 8, &[], 0),
            MemoryTransport::ProcessVm,
        );
        assert_eq!(
            (r, m.tickets().outstanding(Instant::now())),
            (Err(Errno::EFAULT), 0)
        );
    }

    #[test]
    fn test_ticket_from_outside_our_pid_namespace_is_eperm() {
        let m = InstanceMmap::new("inst").unwrap();
        let r = m.ticket_ioctl(
            NodeRef::Ctl,
            &memfd_target(),
            &Request::detached(1, 0, 0, 0),
            &ioctl_at(7, 0x1000, &[], 0),
            MemoryTransport::Retry,
        );
        assert_eq!(r, Err(Errno::EPERM));
    }

    #[test]
    fn test_released_open_takes_its_tickets_along() {
        let m = InstanceMmap::new("inst").unwrap();
        let t = issue(&m, 7, std::process::id());
        m.released(NodeRef::Gpu(0), 7);
        let other_node = m.tickets().outstanding(Instant::now());
        m.released(NodeRef::Ctl, 7);
        let got = m.tickets().redeem(t, std::process::id(), Instant::now());
        assert_eq!((other_node, got.err()), (1, Some(Refusal::Unknown)));
    }

    #[test]
    fn test_ticket_of_another_instance_gets_nothing() {
        let root = scratch("cross");
        let a = Arc::new(InstanceMmap::new("a").unwrap());
        let b = Arc::new(InstanceMmap::new("b").unwrap());
        let _sa = MmapSocket::start(a.clone(), &root).unwrap();
        let sb = MmapSocket::start(b, &root).unwrap();
        let t = issue(&a, 7, std::process::id());
        assert!(ask(sb.path(), t).is_none());
        drop((_sa, sb));
        let _ = std::fs::remove_dir_all(root);
    }
}
