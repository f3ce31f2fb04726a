//! The socket transport: an instance served without CUSE nodes.
//!
//! The container has no NVIDIA device nodes at all. The shim (`libnvproxy_preload.so`, loaded
//! into every process) turns `open` of `/dev/nvidiactl`, `/dev/nvidia<N>`, `/dev/nvidia-uvm` into
//! a connection to the instance's device socket, and `ioctl`/`mmap` on the fd it returns into
//! messages to this server (protocol: `preload-proto`'s `socket` module). The requests are
//! served by the same [`Backend`]s as the CUSE nodes' (`backend.rs`: `Proxy`, `UvmProxy`), with
//! the caller's memory read and written by `process_vm_readv`/`writev` ([`VmMemory`]).
//!
//! **The connection is the open file.** For each open the worker makes a `socketpair`, keeps
//! one end and hands the other over (`SCM_RIGHTS`): `dup`, `fork`, `close`, `close_range` and fd
//! passing are the kernel's, and when the last reference to the client's end goes, this end
//! reads EOF and the open is released, as CUSE's RELEASE. A process that bypasses the shim
//! holds a unix socket: a raw `ioctl` on it is the socket layer's `ENOTTY`, and nothing reaches
//! the driver.
//!
//! **Channels.** A client thread's calls on an open go on its own channel (protocol 2): it
//! attaches one once, sending a socketpair end on the open's connection, and from then on
//! each call is one message on the channel and one answer back, served by the channel's
//! thread itself: one round trip, no socket made, no fd passed, no hand-off between threads.
//!
//! **Nothing from the client is trusted.** The caller of a call is the message's
//! `SCM_CREDENTIALS` pid (the kernel fills it in; a sender can only name another pid with
//! `CAP_SYS_ADMIN` over its pid namespace). At attach, the fd number the request names must be
//! this open's connection in that process's fd table: `pidfd_getfd` of it, compared with the
//! client end's socket cookie (`SO_COOKIE`, unique for the boot), else `EBADF`; a call on the
//! channel from that process (alive: its pidfd) naming that fd needs no new check, any other
//! is checked the same way. Fds inside params (`REGISTER_FD`'s `ctl_fd`, ...) are resolved the
//! same way against every open of the instance. Each message is read once into a fixed
//! buffer, decoded whole (size, magic, version, reserved fields) or answered `EINVAL`; a frame
//! on an open without exactly one channel is dropped, an open or call of another protocol
//! version answered `EPROTONOSUPPORT`; replies never block the server (`MSG_DONTWAIT`);
//! channels are bounded per instance (`MAX_CHANNELS`, then `EAGAIN`). Client memory is read
//! with deadlines (cuse-dev's client waits).
//!
//! **Threads.** One thread accepts opens (with a stop pipe); each open has one thread that
//! reads its attaches, and each channel one thread that reads and serves its calls, so calls
//! of one open from several threads run concurrently as on a CUSE node, and a call waiting on
//! the client's memory or the driver holds up no other channel. The open is released when its
//! connection reads EOF and its calls in flight are done; its channels end with it. A
//! suspension (live upgrade) drains the running calls and has each channel's thread retire
//! its channel, answering what was sent meanwhile "retry": clients attach anew on their opens,
//! which move to the next worker. Every thread that calls the driver gives up `CAP_SYS_ADMIN` first
//! (`device::drop_admin_on_this_thread`).

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use cuse_dev::{ClientWaits, Errno};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, sockopt};
use nvproxy_preload_proto::socket::{
    AttachRequest, CallOp, CallReply, CallRequest, DEV_PROTOCOL_VERSION, DEV_SOCKET_NAME, DevNode,
    OPEN_PEER_PREFIX, OPEN_REQUEST_MAGIC, OpenReply, OpenRequest, version_of,
};

use crate::device::drop_admin_on_this_thread;
use crate::fdpass::send_with_fd;
use crate::memory::VmMemory;
use crate::node::{Backend, Node};
use crate::seqpacket::{SeqpacketServer, make_private_dir, make_run_root};
use crate::{fdpass, ratelimit, sys};

/// How long the accepting thread waits for a connected peer's open request.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// The deadline of one wait on the caller's memory (as CUSE's client waits).
const CLIENT_WAIT: Duration = Duration::from_secs(10);
/// How long a suspension (a live upgrade) lets running calls finish as usual; past it, calls
/// waiting on their client's memory are answered `EFAULT` at once.
const SUSPEND_GRACE: Duration = Duration::from_secs(1);
/// The client-wait deadline of calls that start while a suspension is past its grace.
const SUSPEND_CLIENT_WAIT: Duration = Duration::from_millis(100);
/// Opens served at once (each has a thread); beyond, `open` fails with `ENFILE`. The proxy's
/// own quota (`max_open_files`) usually refuses earlier.
const MAX_OPENS: usize = 4096;

/// The `nvproxy ns-exec` arguments that give a command the socket transport of `instance`:
/// its device socket (bound at `/run/nvproxy/dev.sock` in the namespace), the shim, the GPU
/// count. No `--node`: the namespace has no NVIDIA nodes at all.
pub fn ns_exec_args(
    cmd: &mut std::process::Command,
    root: &Path,
    instance: &str,
    shim: &Path,
    gpus: usize,
) {
    cmd.arg("--dev-socket")
        .arg(root.join(instance).join(DEV_SOCKET_NAME))
        .arg("--dev-gpus")
        .arg(gpus.to_string())
        .arg("--preload")
        .arg(shim);
}

/// `nvproxy run` of an instance served with the socket transport (its device socket exists):
/// the `nvproxy ns-exec` argv, or `None` for a CUSE instance. The GPU count comes from the
/// worker's state file.
pub fn run_argv(
    root: &Path,
    instance: &str,
    shim: Option<&Path>,
    command: &[String],
) -> Result<Option<Vec<String>>> {
    let dir = crate::paths::run_dir(root, instance);
    let socket = dir.join(DEV_SOCKET_NAME);
    if !socket.exists() {
        return Ok(None);
    }
    let shim = shim.with_context(|| {
        format!(
            "instance {instance} is served with the socket transport, which needs the shim \
             ({}): drop --no-preload",
            crate::mmap::SHIM_NAME
        )
    })?;
    let state = dir.join(crate::paths::STATE_FILE);
    let text = std::fs::read_to_string(&state)
        .with_context(|| format!("instance {instance}: reading {}", state.display()))?;
    let state: crate::worker_spec::WorkerState = serde_json::from_str(&text)
        .with_context(|| format!("instance {instance}: parsing {}", state.display()))?;
    let mut argv = vec!["ns-exec".to_owned(), "--driver-params".to_owned()];
    let mut cmd = std::process::Command::new("unused");
    ns_exec_args(
        &mut cmd,
        root,
        instance,
        shim,
        state.spec.instance.gpus.len(),
    );
    argv.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    argv.push("--".to_owned());
    argv.extend(command.iter().cloned());
    Ok(Some(argv))
}

/// Whether this host can serve the socket transport: `SO_COOKIE` on a unix socket and
/// `pidfd_getfd` (Linux 5.6), tried on our own fds; the shim must be installed. The reason
/// when not.
pub fn host_support() -> std::result::Result<(), String> {
    let (a, _b) = socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| format!("socketpair: {e}"))?;
    let cookie = sys::socket_cookie(a.as_fd()).map_err(|e| format!("SO_COOKIE: {e}"))?;
    let me = sys::pidfd_open_process(std::process::id()).map_err(|e| format!("pidfd_open: {e}"))?;
    let dup =
        sys::pidfd_getfd(me.as_fd(), a.as_raw_fd()).map_err(|e| format!("pidfd_getfd: {e}"))?;
    if sys::socket_cookie(dup.as_fd()).ok() != Some(cookie) {
        return Err("a duplicate's socket cookie differs".to_owned());
    }
    crate::mmap::shim_path(None).map_err(|e| format!("{e:#}"))?;
    Ok(())
}

/// The nodes of an instance and the backends that serve them.
#[derive(Clone)]
pub struct Nodes {
    /// `nvidiactl` and `nvidia<N>`.
    pub frontend: Arc<dyn Backend>,
    /// `nvidia-uvm`, if served.
    pub uvm: Option<Arc<dyn Backend>>,
    /// The tenant's GPU count (`nvidia0..gpus-1`).
    pub gpus: u32,
}

impl Nodes {
    fn backend(&self, node: DevNode) -> Option<(Node, Arc<dyn Backend>)> {
        match node {
            DevNode::Ctl => Some((Node::Ctl, self.frontend.clone())),
            DevNode::Gpu(n) if n < self.gpus => Some((Node::Gpu(n), self.frontend.clone())),
            DevNode::Gpu(_) => None,
            DevNode::Uvm => self.uvm.clone().map(|u| (Node::Uvm, u)),
        }
    }
}

/// One open file: the worker's end of its connection and what it names.
struct Open {
    id: u64,
    node: Node,
    backend: Arc<dyn Backend>,
    /// `SO_COOKIE` of the client's end.
    cookie: u64,
    /// `O_ACCMODE` of the caller's open flags.
    access: i32,
    conn: OwnedFd,
    calls: Calls,
}

impl Open {
    fn calls(&self) -> &Calls {
        &self.calls
    }
}

/// The instance's opens, by client-end cookie (for fd resolution) and for stopping.
#[derive(Default)]
struct Table {
    by_cookie: HashMap<u64, Arc<Open>>,
    threads: Vec<JoinHandle<()>>,
}

struct Shared {
    instance: String,
    nodes: Nodes,
    table: Mutex<Table>,
    stopping: AtomicBool,
    runs: Runs,
    /// Channels the instance may have at once ([`MAX_CHANNELS`]).
    max_channels: usize,
    /// Written by [`DevSocket::suspend`]: the opens' threads stop reading (what a client sends
    /// meanwhile stays in its connection for whoever serves it next).
    suspend_r: OwnedFd,
    suspend_w: OwnedFd,
    /// Frames refused for their fds (an attach without exactly one channel, a call with any);
    /// the fds were closed.
    refused_frames: AtomicU64,
    /// The random bytes of the opens' peer names ([`peer_name`]).
    urandom: std::fs::File,
}

/// An open of a suspended device socket ([`DevSocket::suspend`]), for [`DevSocket::adopt`].
#[derive(Debug)]
pub struct SuspendedOpen {
    /// The backend's open id.
    pub id: u64,
    /// Its node.
    pub node: Node,
    /// `SO_COOKIE` of the client's end.
    pub cookie: u64,
    /// `O_ACCMODE` of the caller's open flags.
    pub access: i32,
    /// The worker's end of the connection.
    pub conn: OwnedFd,
}

/// A suspended device socket: its listener (bound, listening) and its opens.
#[derive(Debug)]
pub struct SuspendedSocket {
    /// The listener.
    pub listener: OwnedFd,
    /// The opens.
    pub opens: Vec<SuspendedOpen>,
}

/// An instance's device socket (`<root>/<instance>/dev.sock`) and its threads. Dropping it stops
/// them, ends every open's connection (later calls fail with `ENOTCONN`) and removes the socket.
pub struct DevSocket {
    server: Option<SeqpacketServer>,
    dir: PathBuf,
    shared: Arc<Shared>,
    /// Handed to [`DevSocket::suspend`]'s caller: dropping ends nothing.
    handed_over: bool,
}

fn new_shared(instance: &str, nodes: Nodes) -> Result<Arc<Shared>> {
    let (suspend_r, suspend_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .context("a suspension pipe for the device socket")?;
    Ok(Arc::new(Shared {
        instance: instance.to_owned(),
        nodes,
        table: Mutex::new(Table::default()),
        stopping: AtomicBool::new(false),
        runs: Runs::default(),
        max_channels: MAX_CHANNELS,
        suspend_r,
        suspend_w,
        refused_frames: AtomicU64::new(0),
        urandom: std::fs::File::open("/dev/urandom").context("/dev/urandom")?,
    }))
}

impl DevSocket {
    /// Serves `nodes` of `instance` at `<root>/<instance>/dev.sock` (`root`: the host run
    /// directory, `paths::host_run_dir`). Directories 0700, the socket 0666 (any uid in the
    /// container may open the nodes, as the driver's 0666 nodes).
    pub fn start(instance: &str, nodes: Nodes, root: &Path) -> Result<DevSocket> {
        make_run_root(root)?;
        let dir = root.join(instance);
        make_private_dir(&dir)?;
        let shared = new_shared(instance, nodes)?;
        let s = shared.clone();
        let server = SeqpacketServer::start(
            &dir.join(DEV_SOCKET_NAME),
            format!("dev-{instance}"),
            move |conn| serve_open(&s, conn),
        )
        .context("the device socket")?;
        tracing::info!(instance, socket = %server.path().display(), "socket transport serving (no CUSE nodes)");
        Ok(DevSocket {
            server: Some(server),
            dir,
            shared,
            handed_over: false,
        })
    }

    /// Stops serving without ending anything (a live upgrade, `upgrade.rs`): the opens'
    /// threads stop reading, the calls queued and running are answered, the listener stops
    /// accepting; returns the listener and every open with its connection. Clients' calls and
    /// opens made meanwhile wait in their sockets. `Err` (the device socket serving on) when
    /// calls are still running after `drain`.
    pub fn suspend(
        mut self,
        drain: Duration,
    ) -> Result<SuspendedSocket, (DevSocket, anyhow::Error)> {
        self.shared.runs.lock().suspended = true;
        if let Err(e) = nix::unistd::write(&self.shared.suspend_w, b"s") {
            self.shared.runs.lock().suspended = false;
            return Err((self, anyhow::anyhow!("signalling the open threads: {e}")));
        }
        let threads = std::mem::take(&mut self.shared.lock_table().threads);
        for t in threads {
            let _ = t.join();
        }
        // The channel threads wake from their reads (a call they run finishes and is answered).
        for c in self.shared.runs.lock().channels.values_mut() {
            c.shut = true;
            let _ = socket::shutdown(c.fd.as_raw_fd(), socket::Shutdown::Read);
        }
        // Every call read before is answered before the state moves: each channel thread
        // answers the call it runs, then what its client sent since ("retry"), ends its
        // channel and stops reading (a call read but not yet answered is never lost to the
        // channel's end). A call waiting on its
        // client's memory (a page the tenant holds with userfaultfd) cannot veto it: past
        // the grace its wait is answered EFAULT at once, as its deadline would, and calls
        // started meanwhile wait at most SUSPEND_CLIENT_WAIT; their threads stay parked, and
        // go with this process.
        let started = std::time::Instant::now();
        let mut hurried = false;
        while !self.shared.runs.drained() || !self.shared.runs.channels_quiet() {
            if !hurried && started.elapsed() >= SUSPEND_GRACE {
                hurried = true;
                let (running, _) = self.shared.runs.counts();
                tracing::warn!(instance = %self.shared.instance, running, "suspension: calls still running after {} ms; those waiting on their client's memory are answered EFAULT now", SUSPEND_GRACE.as_millis());
                self.shared.runs.hurry();
            }
            if started.elapsed() > drain {
                let (running, abandoned) = self.shared.runs.counts();
                let e = anyhow::anyhow!(
                    "{} call(s) still in the driver after {} s ({abandoned} more were \
                     answered EFAULT while waiting on their client's memory)",
                    running - abandoned,
                    drain.as_secs()
                );
                return Err((self.resume_in_place(), e));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.shared.runs.relax();
        retire_channels(&self.shared);
        let Some(server) = self.server.take() else {
            let e = anyhow::anyhow!("the device socket is not served");
            return Err((self.resume_in_place(), e));
        };
        let listener = match server.take_listener() {
            Ok(l) => l,
            // Its thread panicked: nothing accepts opens any more, the opens serve on.
            Err(e) => return Err((self.resume_in_place(), e)),
        };
        let mut opens = Vec::new();
        for o in self.shared.lock_table().by_cookie.values() {
            match o.conn.try_clone() {
                Ok(conn) => opens.push(SuspendedOpen {
                    id: o.id,
                    node: o.node,
                    cookie: o.cookie,
                    access: o.access,
                    conn,
                }),
                Err(e) => {
                    tracing::error!(instance = %self.shared.instance, open = o.id, error = %e, "an open's connection could not be duplicated: it is lost");
                }
            }
        }
        // The opens stay the clients' (nothing is shut down or released).
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.handed_over = true;
        Ok(SuspendedSocket { listener, opens })
    }

    /// A suspension that could not complete: the open threads and the channels' serve again
    /// (the listener was not taken: its thread accepts on).
    fn resume_in_place(self) -> DevSocket {
        self.shared.runs.relax();
        let mut byte = [0u8; 1];
        if let Err(e) = nix::unistd::read(self.shared.suspend_r.as_raw_fd(), &mut byte) {
            tracing::error!(error = %e, "the suspension pipe: the device socket's opens are not served again");
            return self;
        }
        // Channels whose thread stopped are retired (their clients attach anew); those whose
        // thread still runs a call answer it and end (their reading side is shut).
        let stopped: Vec<u64> = {
            let mut st = self.shared.runs.lock();
            st.suspended = false;
            st.channels
                .iter()
                .filter(|(_, c)| c.exited)
                .map(|(id, _)| *id)
                .collect()
        };
        if !stopped.is_empty() {
            let rest: HashMap<u64, Channel> = {
                let mut st = self.shared.runs.lock();
                let all = std::mem::take(&mut st.channels);
                let (gone, rest): (HashMap<_, _>, HashMap<_, _>) =
                    all.into_iter().partition(|(id, _)| stopped.contains(id));
                st.channels = gone;
                rest
            };
            retire_channels(&self.shared);
            self.shared.runs.lock().channels.extend(rest);
        }
        let opens: Vec<Arc<Open>> = self
            .shared
            .lock_table()
            .by_cookie
            .values()
            .cloned()
            .collect();
        for o in opens {
            spawn_open_thread(&self.shared, o);
        }
        self
    }

    /// Serves a device socket another worker suspended (or this one, after a failed upgrade):
    /// its listener and opens, with `nodes`' backends (which must have adopted the opens).
    pub fn adopt(
        instance: &str,
        nodes: Nodes,
        root: &Path,
        suspended: SuspendedSocket,
    ) -> Result<DevSocket> {
        let dir = root.join(instance);
        let shared = new_shared(instance, nodes)?;
        // Every open is known before any serves: a call may name another open's fd (UVM's
        // rmCtrlFd, REGISTER_FD's control fd), whatever the order they were handed over in.
        let mut adopted = Vec::with_capacity(suspended.opens.len());
        for o in suspended.opens {
            let backend = match o.node {
                Node::Uvm => shared.nodes.uvm.clone(),
                _ => Some(shared.nodes.frontend.clone()),
            }
            .context("a UVM open without a UVM backend")?;
            let open = Arc::new(Open {
                id: o.id,
                node: o.node,
                backend,
                cookie: o.cookie,
                access: o.access,
                conn: o.conn,
                calls: Calls::default(),
            });
            shared.lock_table().by_cookie.insert(o.cookie, open.clone());
            adopted.push(open);
        }
        for open in adopted {
            if !spawn_open_thread(&shared, open.clone()) {
                // Nothing would ever read its connection: end it (the client's next call
                // fails instead of waiting forever) and release its open in the backend.
                shared.lock_table().by_cookie.remove(&open.cookie);
                let _ = socket::shutdown(open.conn.as_raw_fd(), socket::Shutdown::Both);
                open.backend.release(open.id);
                ratelimit::tenant_log!(warn, instance, open = open.id, node = %open.node, "an adopted open could not be served: closed");
            }
        }
        let s = shared.clone();
        let server = SeqpacketServer::serve_listener(
            suspended.listener,
            &dir.join(DEV_SOCKET_NAME),
            format!("dev-{instance}"),
            move |conn| serve_open(&s, conn),
        )
        .context("the device socket")?;
        Ok(DevSocket {
            server: Some(server),
            dir,
            shared,
            handed_over: false,
        })
    }

    /// The socket's path on the host.
    #[cfg(test)]
    pub fn path(&self) -> &Path {
        self.server.as_ref().map_or(Path::new(""), |s| s.path())
    }

    /// Opens being served.
    #[cfg(test)]
    fn opens(&self) -> usize {
        self.shared.lock_table().by_cookie.len()
    }
}

impl Drop for DevSocket {
    fn drop(&mut self) {
        if self.handed_over {
            return;
        }
        self.shared.stopping.store(true, Ordering::SeqCst);
        // The accepting thread ends and the socket goes.
        drop(self.server.take());
        let (opens, threads) = {
            let mut t = self.shared.lock_table();
            let opens: Vec<Arc<Open>> = t.by_cookie.values().cloned().collect();
            (opens, std::mem::take(&mut t.threads))
        };
        for o in &opens {
            let _ = socket::shutdown(o.conn.as_raw_fd(), socket::Shutdown::Both);
        }
        for c in self.shared.runs.lock().channels.values() {
            let _ = socket::shutdown(c.fd.as_raw_fd(), socket::Shutdown::Both);
        }
        drop(opens);
        // A thread stuck on a client's memory is not waited for (its deadline only marks the
        // request failed); the others end at once.
        for t in threads {
            if t.is_finished() {
                let _ = t.join();
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

impl Shared {
    fn lock_table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The open a client-end cookie belongs to.
    fn by_cookie(&self, cookie: u64) -> Option<Arc<Open>> {
        self.lock_table().by_cookie.get(&cookie).cloned()
    }
}

fn timeval(d: Duration) -> nix::sys::time::TimeVal {
    nix::sys::time::TimeVal::new(d.as_secs() as i64, 0)
}

/// One connection to the device socket: an open request, answered with the open's socket or
/// the errno.
fn serve_open(shared: &Arc<Shared>, conn: OwnedFd) {
    let pid = match socket::getsockopt(&conn, sockopt::PeerCredentials) {
        Ok(c) => u32::try_from(c.pid()).unwrap_or(0),
        Err(e) => {
            ratelimit::tenant_log!(warn, &shared.instance, error = %e, "SO_PEERCRED failed");
            return;
        }
    };
    let _ = socket::setsockopt(&conn, sockopt::ReceiveTimeout, &timeval(PEER_TIMEOUT));
    let _ = socket::setsockopt(&conn, sockopt::SendTimeout, &timeval(PEER_TIMEOUT));
    // A plain recv: fds a peer attaches are discarded by the kernel, never installed.
    let mut buf = [0u8; OpenRequest::SIZE + 1];
    let n = match socket::recv(conn.as_raw_fd(), &mut buf, MsgFlags::empty()) {
        Ok(n) => n,
        Err(_) => return,
    };
    let (errno, client) = match OpenRequest::decode(&buf[..n]) {
        None if n == OpenRequest::SIZE
            && buf[..4] == OPEN_REQUEST_MAGIC.to_ne_bytes()
            && version_of(&buf[..n]) != Some(DEV_PROTOCOL_VERSION) =>
        {
            let theirs = version_of(&buf[..n]).unwrap_or(0);
            ratelimit::tenant_log!(
                warn,
                &shared.instance,
                pid,
                "an open of socket protocol version {theirs}; this worker speaks version {DEV_PROTOCOL_VERSION} (the shim and nvproxy are of different builds): EPROTONOSUPPORT"
            );
            (libc::EPROTONOSUPPORT, None)
        }
        None => (libc::EINVAL, None),
        Some(req) => match open(shared, &req, pid) {
            Ok(client) => (0, Some(client)),
            Err(e) => (e.raw(), None),
        },
    };
    let sent = send_with_fd(
        conn.as_fd(),
        &OpenReply { errno }.encode(),
        client.as_ref(),
        MsgFlags::empty(),
    );
    if let Err(e) = sent {
        // The client end is dropped here: the open's thread reads EOF and releases it.
        tracing::debug!(instance = %shared.instance, pid, error = %e, "device socket: open reply not sent");
    }
}

/// Opens `req.node` for `pid`: the backend's open, the connection, its thread. Returns the
/// client's end.
fn open(shared: &Arc<Shared>, req: &OpenRequest, pid: u32) -> Result<OwnedFd, Errno> {
    drop_admin_on_this_thread()?;
    if pid == 0 {
        // Outside our pid namespace: its memory cannot be named.
        return Err(Errno::from_i32(libc::ESRCH));
    }
    let Some((node, backend)) = shared.nodes.backend(req.node) else {
        return Err(Errno::from_i32(libc::ENOENT));
    };
    if shared.lock_table().by_cookie.len() >= MAX_OPENS {
        return Err(Errno::from_i32(libc::ENFILE));
    }
    let (ours, client) = socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| Errno::from_i32(e as i32))?;
    // Before the client can send: every message then carries the sender's credentials.
    socket::setsockopt(&ours, sockopt::PassCred, &true).map_err(|e| Errno::from_i32(e as i32))?;
    let cookie = sys::socket_cookie(client.as_fd()).map_err(|_| Errno::EIO)?;
    let mut random = || {
        let mut b = [0u8; 16];
        (&shared.urandom).read_exact(&mut b).map(|()| b)
    };
    bind_peer_name(ours.as_fd(), req.node, &mut random).map_err(|e| {
        ratelimit::tenant_log!(warn, &shared.instance, error = %e, "an open's socket could not be named: open refused");
        Errno::EIO
    })?;
    let id = backend.open(node, pid)?;
    let open = Arc::new(Open {
        id,
        node,
        backend,
        cookie,
        access: req.flags & libc::O_ACCMODE,
        conn: ours,
        calls: Calls::default(),
    });
    shared.lock_table().by_cookie.insert(cookie, open.clone());
    if !spawn_open_thread(shared, open.clone()) {
        shared.lock_table().by_cookie.remove(&cookie);
        open.backend.release(id);
        return Err(Errno::from_i32(libc::ENFILE));
    }
    tracing::debug!(instance = %shared.instance, node = %node, open = id, pid, "opened over the socket transport");
    Ok(client)
}

/// Random bytes in an open's peer name: 128 bits, so that nobody who shares the network
/// namespace (abstract names are per network namespace) can take a name before the worker.
const PEER_NAME_RANDOM: usize = 16;

/// The abstract name (without its leading NUL) of the worker's end of an open of `node`:
/// [`OPEN_PEER_PREFIX`], the node's code in hex, `-`, `random` in hex. Nothing in it is
/// guessable or says anything of the worker (no pid, no socket cookie).
fn peer_name(node: DevNode, random: &[u8; PEER_NAME_RANDOM]) -> Vec<u8> {
    let mut name = OPEN_PEER_PREFIX[1..].to_vec();
    name.extend(format!("{:x}-", node.code()).bytes());
    for b in random {
        name.extend(format!("{b:02x}").bytes());
    }
    name
}

/// Binds `sock` (the worker's end of an open) to a fresh [`peer_name`], by which the shim
/// recognises the client's end (`getpeername`) after `exec` or fd passing. A name taken (only by
/// chance: 128 random bits) is tried once more with new bytes; any other failure is the
/// caller's, which refuses the open rather than hand out a socket the shim cannot recognise.
fn bind_peer_name(
    sock: BorrowedFd<'_>,
    node: DevNode,
    random: &mut dyn FnMut() -> io::Result<[u8; PEER_NAME_RANDOM]>,
) -> io::Result<()> {
    let mut tries = 0;
    loop {
        let addr = UnixAddr::new_abstract(&peer_name(node, &random()?))?;
        match socket::bind(sock.as_raw_fd(), &addr) {
            Ok(()) => return Ok(()),
            Err(nix::errno::Errno::EADDRINUSE) if tries == 0 => tries += 1,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Starts the thread of an open (in the table already); false when none could be started.
fn spawn_open_thread(shared: &Arc<Shared>, open: Arc<Open>) -> bool {
    #[cfg(test)]
    if tests::FAIL_SPAWNS.with(|n| n.replace(n.get().saturating_sub(1)) > 0) {
        ratelimit::tenant_log!(
            warn,
            &shared.instance,
            "cannot start an open's thread (test)"
        );
        return false;
    }
    let s = shared.clone();
    let node = open.node;
    let thread = std::thread::Builder::new()
        .name(format!("dev-{}", node.dev_name()))
        .stack_size(256 << 10)
        .spawn(move || serve_calls(&s, &open));
    match thread {
        Ok(t) => {
            let mut table = shared.lock_table();
            table.threads.retain(|t| !t.is_finished());
            table.threads.push(t);
            true
        }
        Err(e) => {
            ratelimit::tenant_log!(warn, &shared.instance, error = %e, "cannot start an open's thread");
            false
        }
    }
}

/// Waits until the open's connection has a message or the device socket is suspended; false
/// for a suspension (checked first: nothing more is read then).
fn wait_readable(shared: &Shared, conn: BorrowedFd<'_>) -> bool {
    loop {
        let mut fds = [
            PollFd::new(shared.suspend_r.as_fd(), PollFlags::POLLIN),
            PollFd::new(conn, PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return true, // the read below reports it
        }
        if fds[0].any().unwrap_or(false) {
            return false;
        }
        if fds[1].any().unwrap_or(true) {
            return true;
        }
    }
}

/// One message read from an open's connection.
enum Received {
    /// The client's last reference is gone (or the server stops).
    Closed,
    /// A message: its bytes, the sender's pid, the fds attached.
    Message {
        len: usize,
        truncated: bool,
        pid: Option<u32>,
        fds: Vec<OwnedFd>,
    },
}

fn receive(conn: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    // Every fd the client attached arrives (as many as a message can carry) and is owned here:
    // what the caller does not keep is closed when dropped.
    let msg = fdpass::recv(conn, buf, libc::MSG_CMSG_CLOEXEC)?;
    let (truncated, pid, fds) = (msg.truncated, msg.pid, msg.fds);
    let len = msg.bytes;
    if len == 0 && fds.is_empty() && !truncated {
        // EOF, or an empty message (which a tenant can send): only a hang-up ends the open.
        // POLLHUP is always reported (asking for POLLRDHUP would make nix drop revents).
        let mut p = [PollFd::new(conn, PollFlags::POLLIN)];
        let _ = poll(&mut p, PollTimeout::ZERO);
        let hup = p[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLHUP));
        if hup {
            return Ok(Received::Closed);
        }
    }
    Ok(Received::Message {
        len,
        truncated,
        pid,
        fds,
    })
}

/// The thread of one open: reads its frames (each an [`AttachRequest`] with the new channel
/// attached) and starts a channel thread for each; at EOF the open is released once its calls
/// in flight are done.
fn serve_calls(shared: &Arc<Shared>, open: &Arc<Open>) {
    loop {
        if !wait_readable(shared, open.conn.as_fd()) {
            // Suspended: the open stays, unread messages stay in its connection.
            return;
        }
        let mut buf = [0u8; CallRequest::SIZE + 1];
        let got = receive(open.conn.as_fd(), &mut buf);
        let (len, truncated, pid, mut fds) = match got {
            Ok(Received::Message {
                len,
                truncated,
                pid,
                fds,
            }) => (len, truncated, pid, fds),
            Ok(Received::Closed) => break,
            Err(e) => {
                if !shared.stopping.load(Ordering::Relaxed) {
                    ratelimit::tenant_log!(warn, &shared.instance, open = open.id, error = %e, "reading an open's connection failed; releasing it");
                }
                break;
            }
        };
        if shared.stopping.load(Ordering::Relaxed) {
            break;
        }
        // Exactly one channel, or nobody to answer; every fd that came is closed here.
        if fds.len() != 1 {
            shared.refused_frames.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(instance = %shared.instance, open = open.id, fds = fds.len(), "frame without exactly one channel dropped");
            continue;
        }
        let chan = Arc::new(fds.remove(0));
        let frame = &buf[..len];
        let answer = match (truncated, AttachRequest::decode(frame)) {
            (false, Some(req)) => attach(shared, open, pid, req, &chan),
            _ if !truncated && is_old_call(frame) => {
                ratelimit::tenant_log!(
                    warn,
                    &shared.instance,
                    open = open.id,
                    "a call of socket protocol version 1 (the shim is older than this worker, which speaks version {DEV_PROTOCOL_VERSION}): EPROTONOSUPPORT; restart the program with the installed shim"
                );
                Err(Errno::from_i32(libc::EPROTONOSUPPORT))
            }
            _ => Err(Errno::EINVAL),
        };
        if let Err(e) = answer {
            send_reply(chan.as_fd(), &CallReply::error(e.raw()), None);
        }
    }
    if open.calls().close() {
        release(shared, open);
    }
}

/// Whether `frame` is a call of protocol version 1 (sent with a reply socket on the open's
/// own connection).
fn is_old_call(frame: &[u8]) -> bool {
    frame.len() == CallRequest::SIZE
        && frame[..4] == nvproxy_preload_proto::socket::CALL_REQUEST_MAGIC.to_ne_bytes()
        && version_of(frame) == Some(1)
}

/// An attach: the caller holds this open by `req.fd` (`pidfd_getfd`, socket cookie) and the
/// instance has room for one more channel; the channel's thread started and answered `Ok`.
fn attach(
    shared: &Arc<Shared>,
    open: &Arc<Open>,
    pid: Option<u32>,
    req: AttachRequest,
    chan: &Arc<OwnedFd>,
) -> Result<(), Errno> {
    let pid = match pid {
        None | Some(0) => return Err(Errno::from_i32(libc::ESRCH)),
        Some(p) => p,
    };
    let pidfd =
        sys::pidfd_open_process(pid).map_err(|e| Errno::from_i32(errno_of(&e, libc::ESRCH)))?;
    match resolve(shared, &pidfd, req.fd) {
        Ok(o) if o.cookie == open.cookie => {}
        _ => {
            tracing::debug!(instance = %shared.instance, open = open.id, pid, fd = req.fd, "attach naming an fd that is not this open: EBADF");
            return Err(Errno::EBADF);
        }
    }
    // Every call on the channel then carries its sender's credentials.
    socket::setsockopt(chan, sockopt::PassCred, &true).map_err(|e| Errno::from_i32(e as i32))?;
    let id = {
        let mut st = shared.runs.lock();
        if st.channels.len() >= shared.max_channels {
            tracing::debug!(instance = %shared.instance, open = open.id, "channel limit reached: EAGAIN");
            return Err(Errno::from_i32(libc::EAGAIN));
        }
        st.serial += 1;
        let id = st.serial;
        st.channels.insert(
            id,
            Channel {
                open: open.clone(),
                fd: chan.clone(),
                exited: false,
                parked: false,
                shut: false,
            },
        );
        id
    };
    let owner = Owner {
        pid,
        pidfd,
        fd: req.fd,
    };
    if !spawn_channel_thread(shared, id, owner) {
        shared.runs.lock().channels.remove(&id);
        return Err(Errno::from_i32(libc::EAGAIN));
    }
    send_reply(chan.as_fd(), &CallReply::error(0), None);
    Ok(())
}

/// The process that attached a channel and the fd it named: its calls need no new fd check.
struct Owner {
    pid: u32,
    pidfd: OwnedFd,
    fd: i32,
}

impl Owner {
    /// Whether a call of `pid` naming `fd` is the owner's (still alive: its pid not reused).
    fn covers(&self, pid: u32, fd: i32) -> bool {
        if pid != self.pid || fd != self.fd {
            return false;
        }
        // A pidfd polls readable once its process has exited.
        let mut p = [PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut p, PollTimeout::ZERO), Ok(0))
    }
}

/// Starts the thread of channel `id` (in the table already); false when none could start.
fn spawn_channel_thread(shared: &Arc<Shared>, id: u64, owner: Owner) -> bool {
    let s = shared.clone();
    std::thread::Builder::new()
        .name(format!("dev-chan-{}", shared.instance))
        .stack_size(1 << 20)
        .spawn(move || serve_channel(&s, id, owner))
        .map_err(|e| {
            ratelimit::tenant_log!(warn, &shared.instance, error = %e, "cannot start a channel's thread");
        })
        .is_ok()
}

/// A call's end: releases its open when that was the last call of a closed open.
fn finish(shared: &Shared, open: &Arc<Open>) {
    if open.calls().end() {
        release(shared, open);
    }
}

fn release(shared: &Shared, open: &Open) {
    shared.lock_table().by_cookie.remove(&open.cookie);
    tracing::debug!(instance = %shared.instance, node = %open.node, open = open.id, "released (last client reference gone)");
    // Its channels end first (their threads read EOF and go), so that once the backend's open
    // is gone no channel of it takes another call: a client sees its channel closed, not an
    // EBADF answer from a channel still open.
    for c in shared.runs.lock().channels.values() {
        if c.open.cookie == open.cookie {
            let _ = socket::shutdown(c.fd.as_raw_fd(), socket::Shutdown::Both);
        }
    }
    open.backend.release(open.id);
}

/// Calls in flight on one open, and whether its last client reference is gone: one atomic
/// word (the count, and [`Calls::CLOSED`]), so exactly one of [`Calls::close`] and the last
/// [`Calls::end`] sees the open's end, without a lock on the hot path.
#[derive(Default)]
struct Calls(std::sync::atomic::AtomicUsize);

impl Calls {
    const CLOSED: usize = 1 << (usize::BITS - 1);

    /// A call starts: false when the open is released already (nothing may reach it).
    fn begin(&self) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v != Self::CLOSED).then_some(v + 1)
            })
            .is_ok()
    }
    /// A call ended: whether the open is to be released now.
    fn end(&self) -> bool {
        self.0.fetch_sub(1, Ordering::AcqRel) == Self::CLOSED | 1
    }
    /// The connection reached EOF: whether the open is to be released now.
    fn close(&self) -> bool {
        self.0.fetch_or(Self::CLOSED, Ordering::AcqRel) == 0
    }
}

/// One channel: a client thread's connection for the calls on one open.
struct Channel {
    open: Arc<Open>,
    fd: Arc<OwnedFd>,
    /// Its thread stopped for a suspension, after answering what the client had sent.
    exited: bool,
    /// Its thread is parked in a call the client-wait watchdog answered (the channel is shut
    /// down): it reads nothing more, and a suspension does not wait for it.
    parked: bool,
    /// A suspension shut its reading side (it serves at most the call it runs).
    shut: bool,
}

#[derive(Default)]
struct RunState {
    /// Calls read from a channel and not finished.
    running: usize,
    /// Of the running calls, those the client-wait watchdog answered (`EFAULT`): their thread
    /// stays in `process_vm_readv` until the client's page fault resolves, but the call is
    /// over for its client and for a suspension.
    abandoned: usize,
    /// The client waits of each channel's thread (registered for the channel's life, not
    /// per call): a suspension past its grace interrupts them; a thread that is between
    /// calls makes new ones before its next call (the epoch changed).
    waits: HashMap<u64, ClientWaits>,
    /// A suspension is past its grace: calls started now wait at most
    /// [`SUSPEND_CLIENT_WAIT`] on their client's memory.
    hurry: bool,
    /// Changes when `hurry` does: a thread whose waits are of another epoch makes new ones
    /// (interrupted waits stay interrupted).
    epoch: u64,
    /// Channel ids handed out.
    serial: u64,
    /// A suspension runs: channel threads read nothing more.
    suspended: bool,
    /// The instance's channels, by id (at most `Shared::max_channels`).
    channels: HashMap<u64, Channel>,
}

/// The instance's channels and the calls running on them. Each channel has a thread that
/// reads its calls and serves each itself (no hand-off); so calls of one open from several
/// client threads run concurrently, as on a CUSE node, and a call waiting on its client's
/// memory holds up no other channel.
#[derive(Default)]
struct Runs {
    state: Mutex<RunState>,
}

/// Channels per instance; past it an attach (so the call that needed it) fails with `EAGAIN`.
#[cfg(not(test))]
const MAX_CHANNELS: usize = 1024;
#[cfg(test)]
const MAX_CHANNELS: usize = 16;

impl Runs {
    fn lock(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A channel thread read a call: counted running, with the state's `(hurry, epoch)`, or
    /// `None` while suspended.
    fn begin(&self) -> Option<(bool, u64)> {
        let mut st = self.lock();
        if st.suspended {
            return None;
        }
        st.running += 1;
        Some((st.hurry, st.epoch))
    }

    /// A call ended (answered): no longer running; `abandoned` when the watchdog had
    /// answered it (counted in `abandoned` by [`answering_waits`], under this lock).
    fn end(&self, abandoned: bool) {
        let mut st = self.lock();
        st.running = st.running.saturating_sub(1);
        if abandoned {
            st.abandoned = st.abandoned.saturating_sub(1);
        }
    }

    /// Whether no call is running (calls the watchdog answered are not).
    fn drained(&self) -> bool {
        let st = self.lock();
        st.running == st.abandoned
    }

    /// Whether every channel's thread has stopped reading (a suspension: it answered what
    /// its client had sent and ended the channel) or is parked in an abandoned call. Until
    /// then a thread may hold a call it read and has not answered yet.
    fn channels_quiet(&self) -> bool {
        self.lock().channels.values().all(|c| c.exited || c.parked)
    }

    /// Calls running, and of them those answered by the watchdog and still parked.
    fn counts(&self) -> (usize, usize) {
        let st = self.lock();
        (st.running, st.abandoned)
    }

    /// A suspension's grace is over: every running call waiting on its client's memory is
    /// answered now (its deadline brought forward), and calls started from now on get
    /// [`SUSPEND_CLIENT_WAIT`]. Undone by [`Runs::relax`].
    fn hurry(&self) {
        let mut st = self.lock();
        st.hurry = true;
        st.epoch += 1;
        for w in st.waits.values() {
            w.interrupt();
        }
    }

    /// Calls get the usual client-wait deadline again (the suspension ended).
    fn relax(&self) {
        let mut st = self.lock();
        if st.hurry {
            st.hurry = false;
            st.epoch += 1;
        }
    }
}

/// Who answers the call a channel's thread runs: the thread with the call's outcome, or its
/// client-wait watchdog with `EFAULT` when the call's wait on its client's memory passed its
/// deadline. One atomic word, claimed once per call by a compare-and-swap (no lock, no
/// reference count on the hot path).
#[derive(Default)]
struct ReplyClaim(std::sync::atomic::AtomicU8);

impl ReplyClaim {
    /// No call: nothing to answer.
    const IDLE: u8 = 0;
    /// A call runs; whoever moves it on answers it.
    const CALL: u8 = 1;
    /// The watchdog answered the running call.
    const TAKEN: u8 = 2;

    /// A call starts on the channel.
    fn open(&self) {
        self.0.store(Self::CALL, Ordering::Release);
    }

    /// The thread's claim when its call returns: true when it answers (else the watchdog did).
    fn close(&self) -> bool {
        self.0
            .compare_exchange(Self::CALL, Self::IDLE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The watchdog's claim: true when it answers the running call.
    fn take(&self) -> bool {
        self.0
            .compare_exchange(Self::CALL, Self::TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// Client waits that answer the call running on channel `chan` with `EFAULT` when they fire
/// (the deadline's answer, also when a suspension brings it forward), counting it abandoned.
/// The channel is then shut down: its thread stays parked until the page resolves, so the
/// client's next call fails to send and attaches a new channel.
fn answering_waits(
    shared: &Arc<Shared>,
    id: u64,
    chan: &Arc<OwnedFd>,
    claim: &Arc<ReplyClaim>,
    timeout: Duration,
) -> ClientWaits {
    let (chan, claim) = (chan.clone(), claim.clone());
    let weak = Arc::downgrade(shared);
    ClientWaits::standalone_answering(
        &shared.instance,
        timeout,
        Box::new(move |_| {
            // Claimed and counted under the instance's lock: a thread that finds its call
            // taken (`ReplyClaim::close` false) un-counts it under the same lock, so after.
            let shared = weak.upgrade();
            let mut st = shared.as_ref().map(|s| s.runs.lock());
            if !claim.take() {
                return;
            }
            if let Some(st) = st.as_mut() {
                st.abandoned += 1;
                if let Some(c) = st.channels.get_mut(&id) {
                    c.parked = true;
                }
            }
            drop(st);
            send_reply(chan.as_fd(), &CallReply::error(libc::EFAULT), None);
            let _ = socket::shutdown(chan.as_raw_fd(), socket::Shutdown::Both);
        }),
    )
}

/// The thread of channel `id`: reads its calls and serves each on this thread until the
/// channel ends, the device socket stops, or a suspension (which leaves the channel in the
/// table for [`retire_channels`] or a restart).
fn serve_channel(shared: &Arc<Shared>, id: u64, owner: Owner) {
    let admin = drop_admin_on_this_thread();
    let Some((open, chan)) = shared
        .runs
        .lock()
        .channels
        .get(&id)
        .map(|c| (c.open.clone(), c.fd.clone()))
    else {
        return;
    };
    let claim: Arc<ReplyClaim> = Arc::default();
    let (mut waits, mut epoch) = {
        let mut st = shared.runs.lock();
        let timeout = if st.hurry {
            SUSPEND_CLIENT_WAIT
        } else {
            CLIENT_WAIT
        };
        let waits = answering_waits(shared, id, &chan, &claim, timeout);
        st.waits.insert(id, waits.clone());
        (waits, st.epoch)
    };
    loop {
        // A blocking read: a suspension wakes it by shutting the channel's reading side.
        let mut buf = [0u8; CallRequest::SIZE + 1];
        let got = receive(chan.as_fd(), &mut buf);
        let message = match got {
            Ok(Received::Message {
                len,
                truncated,
                pid,
                fds,
            }) if len > 0 || truncated || !fds.is_empty() => Some((len, truncated, pid, fds)),
            // An empty message, or the reading side shut by a suspension.
            Ok(Received::Message { .. }) => None,
            Ok(Received::Closed) | Err(_) => break,
        };
        // Counted running unless a suspension began (checked under the same lock).
        let began = message.as_ref().and_then(|_| shared.runs.begin());
        let ((len, truncated, pid, fds), (hurry, now)) = match (message, began) {
            (Some(m), Some(b)) => (m, b),
            (message, _) => {
                let st = shared.runs.lock();
                let shut = st.channels.get(&id).is_none_or(|c| c.shut);
                if st.suspended {
                    drop(st);
                    if message.is_some() {
                        // Read after the suspension began: not served; the client sends it
                        // again on a new channel.
                        send_reply(chan.as_fd(), &CallReply::retry(), None);
                    }
                    // This thread is the channel's only reader: what else the client sent is
                    // answered here, before the suspension may end (it waits for `exited`).
                    retire_channel(&chan);
                    let mut st = shared.runs.lock();
                    st.waits.remove(&id);
                    if st.suspended {
                        if let Some(c) = st.channels.get_mut(&id) {
                            c.exited = true;
                        }
                    } else {
                        // The suspension failed meanwhile and has resumed: the channel is
                        // ended, so it leaves the table now rather than at the next one.
                        st.channels.remove(&id);
                    }
                    return;
                }
                drop(st);
                if shut {
                    break; // a suspension that failed shut it: the client attaches anew
                }
                send_reply(chan.as_fd(), &CallReply::error(libc::EINVAL), None);
                continue;
            }
        };
        if shared.stopping.load(Ordering::Relaxed) {
            shared.runs.end(false);
            break;
        }
        if !fds.is_empty() {
            // A call carries no fd; what came is closed here.
            shared.refused_frames.fetch_add(1, Ordering::Relaxed);
        }
        drop(fds);
        if !open.calls().begin() {
            send_reply(chan.as_fd(), &CallReply::error(libc::EBADF), None);
            shared.runs.end(false);
            continue;
        }
        claim.open();
        let (reply, host_fd) = match (&admin, pid, truncated) {
            (Err(e), _, _) => (CallReply::error(e.raw()), None),
            (_, None | Some(0), _) => (CallReply::error(libc::ESRCH), None),
            (_, _, true) => (CallReply::error(libc::EINVAL), None),
            (Ok(()), Some(pid), false) => match CallRequest::decode(&buf[..len]) {
                None => (CallReply::error(libc::EINVAL), None),
                Some(req) => {
                    if waits.fired() || now != epoch {
                        // Fired waits stay fired; a suspension's hurry (or its end) changes
                        // the deadline of calls started from now on.
                        epoch = now;
                        let timeout = if hurry {
                            SUSPEND_CLIENT_WAIT
                        } else {
                            CLIENT_WAIT
                        };
                        waits = answering_waits(shared, id, &chan, &claim, timeout);
                        shared.runs.lock().waits.insert(id, waits.clone());
                    }
                    call(shared, &open, &owner, pid, &req, &waits)
                }
            },
        };
        // The watchdog answered it (EFAULT) and counted it abandoned otherwise.
        let answered_here = claim.close();
        if answered_here {
            send_reply(chan.as_fd(), &reply, host_fd.as_ref());
        }
        finish(shared, &open);
        shared.runs.end(!answered_here);
    }
    let mut st = shared.runs.lock();
    st.channels.remove(&id);
    st.waits.remove(&id);
}

/// Ends every channel after a suspension drained the calls: what a client sent meanwhile was
/// not read, and is answered [`CallReply::retry`] (the client attaches a new channel on its
/// open, which the next worker serves); then the channel is shut down.
fn retire_channels(shared: &Shared) {
    let channels: Vec<Arc<OwnedFd>> = {
        let mut st = shared.runs.lock();
        st.channels.drain().map(|(_, c)| c.fd).collect()
    };
    for fd in channels {
        retire_channel(&fd);
    }
}

/// Ends one channel: the client can send no more, what it sent before is answered
/// [`CallReply::retry`], then its reading side sees EOF. Only for a channel nobody else reads
/// (its own thread, or one whose thread is gone or parked): a call another reader took
/// meanwhile would be answered after the end, i.e. never.
fn retire_channel(fd: &OwnedFd) {
    let _ = socket::shutdown(fd.as_raw_fd(), socket::Shutdown::Read);
    let mut buf = [0u8; CallRequest::SIZE + 1];
    // At most the socket's backlog of frames (bounded by its receive buffer).
    loop {
        match fdpass::recv(
            fd.as_fd(),
            &mut buf,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
        ) {
            Ok(m) if m.bytes > 0 || !m.fds.is_empty() || m.truncated => {
                send_reply(fd.as_fd(), &CallReply::retry(), None);
            }
            _ => break,
        }
    }
    let _ = socket::shutdown(fd.as_raw_fd(), socket::Shutdown::Write);
}

fn send_reply(to: BorrowedFd<'_>, reply: &CallReply, fd: Option<&OwnedFd>) {
    // Never blocks: a channel whose buffer the client filled loses the reply.
    let _ = send_with_fd(to, &reply.encode(), fd, MsgFlags::MSG_DONTWAIT);
}

/// The open a caller's fd number names, resolved kernel-side: a duplicate of the caller's fd
/// (`pidfd_getfd`) whose socket cookie is one of the instance's client ends. `EBADF` for
/// anything else (a closed fd, another file, another instance's socket).
fn resolve(shared: &Shared, pidfd: &OwnedFd, fd: i32) -> io::Result<Arc<Open>> {
    let ebadf = || io::Error::from_raw_os_error(libc::EBADF);
    if fd < 0 {
        return Err(ebadf());
    }
    let dup = sys::pidfd_getfd(pidfd.as_fd(), fd)?;
    let cookie = sys::socket_cookie(dup.as_fd()).map_err(|_| ebadf())?;
    drop(dup);
    shared.by_cookie(cookie).ok_or_else(ebadf)
}

/// One call of `pid` on `open` through a channel `owner` attached.
fn call(
    shared: &Shared,
    open: &Open,
    owner: &Owner,
    pid: u32,
    req: &CallRequest,
    waits: &ClientWaits,
) -> (CallReply, Option<OwnedFd>) {
    // The owner proved at attach that it holds this open by `req.fd`; anyone else (a process
    // the channel was passed to, another fd number) proves it now.
    let fresh;
    let pidfd = if owner.covers(pid, req.fd) {
        &owner.pidfd
    } else {
        fresh = match sys::pidfd_open_process(pid) {
            Ok(p) => p,
            Err(e) => return (CallReply::error(errno_of(&e, libc::ESRCH)), None),
        };
        match resolve(shared, &fresh, req.fd) {
            Ok(o) if o.cookie == open.cookie => {}
            Ok(_) | Err(_) => {
                tracing::debug!(instance = %shared.instance, open = open.id, pid, fd = req.fd, "call naming an fd that is not this open: EBADF");
                return (CallReply::error(libc::EBADF), None);
            }
        }
        &fresh
    };
    match req.op {
        CallOp::Ioctl { cmd, arg } => {
            let span = tracing::debug_span!("ioctl", node = ?open.node, pid, cmd = format_args!("{cmd:#010x}"));
            let _enter = span.enter();
            // Measured as the CUSE path measures (device.rs): the request with its client
            // memory, not the transport's round trip.
            let start = ioctl_proxy::service::monotonic_ns();
            let mut mem = VmMemory::new(pid, waits.clone());
            let lookup = |fd: i32| resolve(shared, pidfd, fd).map(|o| o.id);
            let caller = ioctl_proxy::Caller {
                pid: 0, // looked up only for an audit event (Caller::process)
                tid: pid,
                since: Some(start),
            };
            let result = open
                .backend
                .ioctl(open.id, caller, cmd, arg, &mut mem, &lookup);
            let reply = match result {
                Ok(result) => match mem.finish() {
                    Ok(()) => CallReply {
                        result,
                        ..CallReply::error(0)
                    },
                    Err(_) => CallReply::error(libc::EFAULT),
                },
                Err(e) => {
                    mem.finish_failed();
                    CallReply::error(e.raw())
                }
            };
            crate::latency::LATENCY.observe_since(start);
            (reply, None)
        }
        CallOp::Mmap {
            len,
            prot,
            flags,
            offset,
        } => match mmap_checks(open.access, len, prot, flags, offset)
            .and_then(|()| open.backend.mapping_fd(open.id))
        {
            Ok((fd, adjust)) => (
                CallReply {
                    offset_adjust: adjust,
                    ..CallReply::error(0)
                },
                Some(fd),
            ),
            Err(e) => (CallReply::error(e.raw()), None),
        },
    }
}

fn errno_of(e: &io::Error, default: i32) -> i32 {
    e.raw_os_error().unwrap_or(default)
}

/// The checks the kernel makes before a driver's mmap handler sees the call (mm/mmap.c
/// `do_mmap`): the access mode of the open (recorded from its flags; the client's socket is
/// always read-write), the map type, length and offset.
fn mmap_checks(access: i32, len: u64, prot: i32, flags: i32, offset: i64) -> Result<(), Errno> {
    let page = 4096;
    if len == 0 || offset & (page - 1) != 0 {
        return Err(Errno::EINVAL);
    }
    let shared = match flags & 0x0f {
        libc::MAP_SHARED | libc::MAP_SHARED_VALIDATE => true,
        libc::MAP_PRIVATE => false,
        _ => return Err(Errno::EINVAL),
    };
    if access == libc::O_WRONLY
        || (shared && prot & libc::PROT_WRITE != 0 && access == libc::O_RDONLY)
    {
        return Err(Errno::from_i32(libc::EACCES));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{ProxyBackend, UvmBackend};
    use nix::sys::socket::ControlMessage;
    use std::io::IoSlice;
    use std::os::fd::RawFd;
    use std::os::unix::net::UnixStream;
    use test_kit::eventually;

    /// Waits (bounded) until a thread faults on a page registered with `uffd` and nobody
    /// resolves it: the fault stays queued, so `uffd` is readable.
    fn wait_for_fault(uffd: std::os::fd::BorrowedFd<'_>) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [PollFd::new(uffd, PollFlags::POLLIN)];
        let n = poll(&mut fds, PollTimeout::from(10_000u16)).unwrap();
        assert_eq!(n, 1, "no thread faulted on the page");
    }

    struct Fixture {
        root: PathBuf,
        dev: Option<DevSocket>,
        proxy: Arc<ioctl_proxy::Proxy>,
        nodes: Nodes,
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            drop(self.dev.take());
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    fn fixture(tag: &str) -> Fixture {
        let root = std::env::temp_dir().join(format!("nvproxy-dev-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let sim = nvsim::SimDriver::new(nvsim::SimConfig::default_gpus(1));
        let proxy = Arc::new(
            ioctl_proxy::Proxy::for_host(
                ioctl_proxy::InstancePolicy::new("t", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0]),
                sim as Arc<dyn ioctl_proxy::HostDriver>,
            )
            .unwrap(),
        );
        let frontend = Arc::new(ProxyBackend::new(proxy.clone()));
        let uvm = Arc::new(uvm::UvmProxy::new(proxy.clone()).unwrap());
        let nodes = Nodes {
            frontend: frontend.clone(),
            uvm: Some(Arc::new(UvmBackend::new(uvm, frontend))),
            gpus: 1,
        };
        let dev = DevSocket::start("t", nodes.clone(), &root).unwrap();
        Fixture {
            root,
            dev: Some(dev),
            proxy,
            nodes,
        }
    }

    impl Fixture {
        fn socket(&self) -> PathBuf {
            self.dev.as_ref().unwrap().path().to_path_buf()
        }

        fn open_raw(&self, msg: &[u8]) -> (Option<OpenReply>, Option<OwnedFd>) {
            let s = socket::socket(
                AddressFamily::Unix,
                SockType::SeqPacket,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .unwrap();
            socket::connect(s.as_raw_fd(), &UnixAddr::new(&self.socket()).unwrap()).unwrap();
            socket::send(s.as_raw_fd(), msg, MsgFlags::empty()).unwrap();
            let mut buf = [0u8; 16];
            match receive(s.as_fd(), &mut buf).unwrap() {
                Received::Closed => (None, None),
                Received::Message { len, mut fds, .. } => {
                    (OpenReply::decode(&buf[..len]), fds.pop())
                }
            }
        }

        fn open(&self, node: DevNode) -> Result<OwnedFd, i32> {
            let (reply, fd) = self.open_raw(
                &OpenRequest {
                    node,
                    flags: libc::O_RDWR,
                }
                .encode(),
            );
            match (reply, fd) {
                (Some(OpenReply { errno: 0 }), Some(fd)) => Ok(fd),
                (Some(OpenReply { errno }), None) => Err(errno),
                other => panic!("bad open answer {other:?}"),
            }
        }

        fn wait_opens(&self, n: usize) {
            let dev = self.dev.as_ref().unwrap();
            assert!(
                eventually(Duration::from_secs(5), || {
                    dev.opens() == n && self.proxy.open_files() == n
                }),
                "opens {} / proxy files {}, wanted {n}",
                dev.opens(),
                self.proxy.open_files()
            );
        }
    }

    fn pair() -> (OwnedFd, OwnedFd) {
        socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    /// The answer on `mine` (5 s at most): the reply and its fd, `None` at EOF or timeout.
    fn answer(mine: &OwnedFd) -> Option<(CallReply, Option<OwnedFd>)> {
        socket::setsockopt(
            mine,
            sockopt::ReceiveTimeout,
            &timeval(Duration::from_secs(5)),
        )
        .unwrap();
        let mut buf = [0u8; 32];
        match receive(mine.as_fd(), &mut buf) {
            Ok(Received::Message { len, mut fds, .. }) if len > 0 => {
                Some((CallReply::decode(&buf[..len]).unwrap(), fds.pop()))
            }
            _ => None,
        }
    }

    /// Attaches a channel to the open `conn`, naming `fd`: the channel, or the errno answered.
    fn attach_raw(conn: &OwnedFd, fd: i32) -> Result<OwnedFd, i32> {
        let (mine, theirs) = pair();
        send_fds(conn, &AttachRequest { fd }.encode(), &[theirs.as_raw_fd()]);
        drop(theirs);
        match answer(&mine) {
            Some((r, None)) if r.errno == 0 => Ok(mine),
            Some((r, _)) => Err(r.errno),
            None => Err(-1),
        }
    }

    /// Sends `msg` on the channel `chan`; the reply and its fd.
    fn call_on(chan: &OwnedFd, msg: &[u8]) -> Option<(CallReply, Option<OwnedFd>)> {
        socket::send(chan.as_raw_fd(), msg, MsgFlags::MSG_NOSIGNAL).ok()?;
        answer(chan)
    }

    /// Sends `msg` on a new channel of `conn`; the reply and its fd.
    fn call_raw(conn: &OwnedFd, msg: &[u8]) -> Option<(CallReply, Option<OwnedFd>)> {
        let chan = attach_raw(conn, conn.as_raw_fd()).expect("an attached channel");
        call_on(&chan, msg)
    }

    fn ioctl(conn: &OwnedFd, fd: i32, cmd: u32, arg: &mut [u8]) -> CallReply {
        let req = CallRequest {
            fd,
            op: CallOp::Ioctl {
                cmd,
                arg: arg.as_mut_ptr() as u64,
            },
        };
        let r = call_raw(conn, &req.encode()).expect("a reply").0;
        std::hint::black_box(arg);
        r
    }

    fn version_check() -> Vec<u8> {
        let mut v = vec![0u8; 72];
        v[0..4].copy_from_slice(&u32::from(b'2').to_ne_bytes());
        v
    }

    const CHECK_VERSION: u32 = 0xc048_46d2;

    #[test]
    fn test_an_open_ends_once_at_its_close_or_its_last_call() {
        let calls = Calls::default();
        assert!(calls.begin() && calls.begin());
        assert!(!calls.end());
        assert!(!calls.close(), "a call still runs");
        assert!(
            calls.begin(),
            "a call the closed open's thread read still runs"
        );
        assert!(!calls.end());
        assert!(calls.end(), "the last call ends the open");
        assert!(!calls.begin(), "nothing reaches a released open");
        let idle = Calls::default();
        assert!(idle.close(), "no call runs: the close ends it");
        assert!(!idle.begin());
    }

    #[test]
    fn test_a_call_is_answered_once_by_the_thread_or_the_watchdog() {
        let claim = ReplyClaim::default();
        assert!(!claim.take(), "no call runs: the watchdog answers nothing");
        claim.open();
        assert!(claim.close(), "the thread answers its call");
        assert!(
            !claim.take(),
            "after the answer the watchdog has nothing to answer"
        );
        claim.open();
        assert!(
            claim.take(),
            "the watchdog answers a call past its deadline"
        );
        assert!(!claim.take(), "once");
        assert!(!claim.close(), "and the thread then does not");
    }

    #[test]
    fn test_open_ioctl_and_release_through_the_socket() {
        let f = fixture("basic");
        let ctl = f.open(DevNode::Ctl).unwrap();
        f.wait_opens(1);
        let mut v = version_check();
        let r = ioctl(&ctl, ctl.as_raw_fd(), CHECK_VERSION, &mut v);
        assert_eq!((r.errno, r.result), (0, 0));
        // The worker wrote the answer into our memory itself (process_vm_writev).
        assert_eq!(u32::from_ne_bytes(v[4..8].try_into().unwrap()), 1);
        assert!(v[8..].starts_with(b"535.261.03"));
        // A dup keeps the open alive; the last close releases it.
        let dup = ctl.try_clone().unwrap();
        drop(ctl);
        std::thread::sleep(Duration::from_millis(50));
        f.wait_opens(1);
        drop(dup);
        f.wait_opens(0);
    }

    #[test]
    fn test_a_call_waiting_on_client_memory_does_not_hold_up_the_opens_other_calls() {
        let f = fixture("waiting");
        let ctl = Arc::new(f.open(DevNode::Ctl).unwrap());
        // A page whose fault nobody resolves yet: the worker's read of it waits.
        let map = sys::AnonMap::new(4096).unwrap();
        let uffd = sys::uffd_register_missing(map.addr(), 4096)
            .expect("userfaultfd (root; CONFIG_USERFAULTFD)");
        let addr = map.addr();
        let c = ctl.clone();
        let waiting = std::thread::spawn(move || {
            let req = CallRequest {
                fd: c.as_raw_fd(),
                op: CallOp::Ioctl {
                    cmd: CHECK_VERSION,
                    arg: addr,
                },
            };
            call_raw(&c, &req.encode())
        });
        use std::os::fd::AsFd;
        wait_for_fault(uffd.as_fd());
        assert!(!waiting.is_finished(), "the call did not wait on the page");
        // Another call on the same open is served meanwhile.
        let mut v = version_check();
        let r = ioctl(&ctl, ctl.as_raw_fd(), CHECK_VERSION, &mut v);
        assert_eq!((r.errno, r.result), (0, 0));
        assert!(!waiting.is_finished());
        sys::uffd_zeropage(uffd.as_fd(), addr, 4096).unwrap();
        let (reply, _) = waiting
            .join()
            .unwrap()
            .expect("the waiting call is answered");
        // It read the (now zero) page: the answer to a zeroed request, not EFAULT.
        assert_ne!(reply.errno, libc::EFAULT, "{reply:?}");
        // The open is released once its last reference and its calls are gone.
        drop(ctl);
        f.wait_opens(0);
    }

    #[test]
    fn test_unknown_nodes_and_malformed_opens_are_refused() {
        let f = fixture("nodes");
        assert_eq!(f.open(DevNode::Gpu(1)).err(), Some(libc::ENOENT));
        assert!(f.open(DevNode::Gpu(0)).is_ok());
        assert!(f.open(DevNode::Uvm).is_ok());
        let (reply, fd) = f.open_raw(b"garbage");
        assert_eq!(
            (reply, fd.is_none()),
            (
                Some(OpenReply {
                    errno: libc::EINVAL
                }),
                true
            )
        );
        f.wait_opens(0);
    }

    #[test]
    fn test_forged_fd_and_malformed_calls_get_errnos_and_reach_nothing() {
        let f = fixture("forged");
        let ctl = f.open(DevNode::Ctl).unwrap();
        let other = f.open(DevNode::Ctl).unwrap();
        let unrelated = UnixStream::pair().unwrap().0;
        let mut v = version_check();
        // Naming another open's fd, a file that is not an open, a closed fd: EBADF.
        for fd in [other.as_raw_fd(), unrelated.as_raw_fd(), 1000, -1] {
            assert_eq!(
                ioctl(&ctl, fd, CHECK_VERSION, &mut v).errno,
                libc::EBADF,
                "fd {fd}"
            );
        }
        assert_eq!(v, version_check(), "nothing was answered into our memory");
        // Malformed or truncated messages: EINVAL.
        let good = CallRequest {
            fd: ctl.as_raw_fd(),
            op: CallOp::Ioctl {
                cmd: CHECK_VERSION,
                arg: v.as_mut_ptr() as u64,
            },
        }
        .encode();
        let mut bad = good;
        bad[0] ^= 1;
        assert_eq!(call_raw(&ctl, &bad).unwrap().0.errno, libc::EINVAL);
        assert_eq!(call_raw(&ctl, &good[..40]).unwrap().0.errno, libc::EINVAL);
        assert_eq!(
            call_raw(&ctl, &[good.as_slice(), &[0; 8]].concat())
                .unwrap()
                .0
                .errno,
            libc::EINVAL
        );
        // An empty message does not end the open.
        socket::send(ctl.as_raw_fd(), &[], MsgFlags::empty()).unwrap();
        // A bad pointer: the driver's EFAULT.
        let req = CallRequest {
            fd: ctl.as_raw_fd(),
            op: CallOp::Ioctl {
                cmd: CHECK_VERSION,
                arg: 8,
            },
        };
        assert_eq!(call_raw(&ctl, &req.encode()).unwrap().0.errno, libc::EFAULT);
        // The open still works.
        let r = ioctl(&ctl, ctl.as_raw_fd(), CHECK_VERSION, &mut v);
        assert_eq!((r.errno, r.result), (0, 0));
        // Without a reply socket, nothing is answered (and nothing breaks).
        socket::send(ctl.as_raw_fd(), &good, MsgFlags::empty()).unwrap();
        assert_eq!(ioctl(&ctl, ctl.as_raw_fd(), CHECK_VERSION, &mut v).errno, 0);
        f.wait_opens(2);
    }

    /// Sends `msg` on `conn` with `fds` attached.
    fn send_fds(conn: &OwnedFd, msg: &[u8], fds: &[RawFd]) {
        socket::sendmsg::<()>(
            conn.as_raw_fd(),
            &[IoSlice::new(msg)],
            &[ControlMessage::ScmRights(fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
    }

    #[test]
    fn test_surplus_fds_of_a_frame_are_closed_and_the_frame_refused() {
        let f = fixture("surplus");
        let ctl = f.open(DevNode::Ctl).unwrap();
        f.wait_opens(1);
        let mut v = version_check();
        let req = CallRequest {
            fd: ctl.as_raw_fd(),
            op: CallOp::Ioctl {
                cmd: CHECK_VERSION,
                arg: v.as_mut_ptr() as u64,
            },
        }
        .encode();
        // Copies of the open's own fd, more than a small control buffer holds: had the worker
        // kept any, they would hold the open after the client's last close.
        for n in [2, 5, 8, 64, fdpass::SCM_MAX_FD] {
            send_fds(&ctl, &req, &vec![ctl.as_raw_fd(); n]);
        }
        // A reply socket and surplus fds: refused, nobody answered.
        let (mine, theirs) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let mut fds = vec![theirs.as_raw_fd()];
        fds.extend([ctl.as_raw_fd(); 7]);
        send_fds(&ctl, &req, &fds);
        drop(theirs);
        socket::setsockopt(
            &mine,
            sockopt::ReceiveTimeout,
            &timeval(Duration::from_secs(5)),
        )
        .unwrap();
        let mut buf = [0u8; 32];
        assert_eq!(
            socket::recv(mine.as_raw_fd(), &mut buf, MsgFlags::empty()),
            Ok(0),
            "the reply socket was closed unanswered (not kept by the worker)"
        );
        // The open still serves, and counted what it refused.
        let r = ioctl(&ctl, ctl.as_raw_fd(), CHECK_VERSION, &mut v);
        assert_eq!((r.errno, r.result), (0, 0));
        assert_eq!(
            f.dev
                .as_ref()
                .unwrap()
                .shared
                .refused_frames
                .load(Ordering::Relaxed),
            6
        );
        drop(ctl);
        f.wait_opens(0);
    }

    /// The abstract name the client's end of an open shows (`getpeername`), without its NUL.
    fn peer_of(fd: &OwnedFd) -> Vec<u8> {
        let addr: UnixAddr = socket::getpeername(fd.as_raw_fd()).unwrap();
        addr.as_abstract().expect("an abstract name").to_vec()
    }

    #[test]
    fn test_open_peer_names_are_random_and_say_nothing_of_the_worker() {
        let f = fixture("names");
        let a = f.open(DevNode::Ctl).unwrap();
        let b = f.open(DevNode::Gpu(0)).unwrap();
        let (na, nb) = (peer_of(&a), peer_of(&b));
        // The shim still recognises them.
        let full = |n: &[u8]| [&[0u8][..], n].concat();
        use nvproxy_preload_proto::socket::node_of_peer_name;
        assert_eq!(node_of_peer_name(&full(&na)), Some(DevNode::Ctl));
        assert_eq!(node_of_peer_name(&full(&nb)), Some(DevNode::Gpu(0)));
        // Neither the cookie (which anyone can read and predict) nor the worker's pid: a
        // tenant in the workers' network namespace cannot take the next open's name.
        for (fd, name) in [(&a, &na), (&b, &nb)] {
            let text = String::from_utf8(name.clone()).unwrap();
            let cookie = sys::socket_cookie(fd.as_fd()).unwrap();
            let random = text.rsplit('-').next().unwrap();
            assert_eq!(random.len(), 2 * PEER_NAME_RANDOM, "{text}");
            assert!(random.bytes().all(|c| c.is_ascii_hexdigit()), "{text}");
            // The random part may contain the cookie's few hex digits by chance (a test that
            // failed about once in 150 runs): the fixed part must not, and the random part
            // must not be the cookie.
            let fixed = &text[..text.len() - random.len()];
            assert!(
                !fixed.contains(&format!("{cookie:x}")),
                "{text} names the cookie"
            );
            assert_ne!(
                random,
                format!("{cookie:0w$x}", w = 2 * PEER_NAME_RANDOM),
                "{text} is the cookie"
            );
            assert!(
                !fixed.contains(&format!("-{}", std::process::id())),
                "{text} names the pid"
            );
        }
        assert_ne!(na[na.len() - 32..], nb[nb.len() - 32..]);
    }

    #[test]
    fn test_a_name_taken_twice_fails_the_bind_instead_of_being_ignored() {
        let sock = || {
            socket::socket(
                AddressFamily::Unix,
                SockType::SeqPacket,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .unwrap()
        };
        let fixed = [0x5au8; PEER_NAME_RANDOM];
        let squatter = sock();
        let name = UnixAddr::new_abstract(&peer_name(DevNode::Ctl, &fixed)).unwrap();
        socket::bind(squatter.as_raw_fd(), &name).unwrap();
        let ours = sock();
        let err = bind_peer_name(ours.as_fd(), DevNode::Ctl, &mut || Ok(fixed)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EADDRINUSE));
        // With fresh bytes the second try binds.
        let mut n = 0u8;
        let mut fresh = || {
            n += 1;
            Ok(if n == 1 { fixed } else { [n; PEER_NAME_RANDOM] })
        };
        bind_peer_name(ours.as_fd(), DevNode::Ctl, &mut fresh).unwrap();
        assert_eq!(n, 2);
    }

    #[test]
    fn test_fds_in_params_are_resolved_kernel_side() {
        let f = fixture("regfd");
        let ctl = f.open(DevNode::Ctl).unwrap();
        let gpu = f.open(DevNode::Gpu(0)).unwrap();
        const REGISTER_FD: u32 = 0xc004_46c9;
        // A file that is not one of the instance's opens is refused; the control fd works.
        let unrelated = UnixStream::pair().unwrap().0;
        let mut arg = unrelated.as_raw_fd().to_ne_bytes();
        let bad = ioctl(&gpu, gpu.as_raw_fd(), REGISTER_FD, &mut arg);
        assert_ne!(bad.errno, 0);
        let mut arg = ctl.as_raw_fd().to_ne_bytes();
        let ok = ioctl(&gpu, gpu.as_raw_fd(), REGISTER_FD, &mut arg);
        assert_eq!((ok.errno, ok.result), (0, 0));
    }

    #[test]
    fn test_mmap_checks_the_access_mode_and_asks_the_backend() {
        let f = fixture("mmap");
        let (_, ro) = f.open_raw(
            &OpenRequest {
                node: DevNode::Ctl,
                flags: libc::O_RDONLY,
            }
            .encode(),
        );
        let ro = ro.unwrap();
        let mmap = |conn: &OwnedFd, prot, flags, len| {
            let req = CallRequest {
                fd: conn.as_raw_fd(),
                op: CallOp::Mmap {
                    len,
                    prot,
                    flags,
                    offset: 0,
                },
            };
            call_raw(conn, &req.encode()).unwrap()
        };
        let shared_rw = libc::PROT_READ | libc::PROT_WRITE;
        assert_eq!(
            mmap(&ro, shared_rw, libc::MAP_SHARED, 4096).0.errno,
            libc::EACCES
        );
        assert_eq!(mmap(&ro, libc::PROT_READ, 0x0f, 4096).0.errno, libc::EINVAL);
        assert_eq!(
            mmap(&ro, libc::PROT_READ, libc::MAP_SHARED, 0).0.errno,
            libc::EINVAL
        );
        // Nothing mapped on this open: the driver's answer (nvidia_mmap without a context).
        let (reply, fd) = mmap(&ro, libc::PROT_READ, libc::MAP_SHARED, 4096);
        assert!(reply.errno != 0 && fd.is_none(), "{reply:?}");
    }

    #[test]
    fn test_stopping_ends_the_connections_and_removes_the_socket() {
        let mut f = fixture("stop");
        let ctl = f.open(DevNode::Ctl).unwrap();
        let path = f.socket();
        drop(f.dev.take());
        assert!(!path.exists());
        let mut v = version_check();
        let req = CallRequest {
            fd: ctl.as_raw_fd(),
            op: CallOp::Ioctl {
                cmd: CHECK_VERSION,
                arg: v.as_mut_ptr() as u64,
            },
        };
        let sent = socket::send(ctl.as_raw_fd(), &req.encode(), MsgFlags::MSG_NOSIGNAL);
        assert!(sent.is_err(), "the connection is gone");
    }

    #[test]
    fn test_calls_on_one_channel_are_answered_on_it_without_fds() {
        let f = fixture("channel");
        let ctl = f.open(DevNode::Ctl).unwrap();
        let chan = attach_raw(&ctl, ctl.as_raw_fd()).unwrap();
        let mut v = version_check();
        let req = CallRequest {
            fd: ctl.as_raw_fd(),
            op: CallOp::Ioctl {
                cmd: CHECK_VERSION,
                arg: v.as_mut_ptr() as u64,
            },
        }
        .encode();
        for _ in 0..200 {
            let (r, fd) = call_on(&chan, &req).unwrap();
            assert_eq!(
                (r.errno, r.result, r.retry, fd.is_none()),
                (0, 0, false, true)
            );
        }
        assert!(v[8..].starts_with(b"535.261.03"));
        // The same process naming another open's fd on this channel: checked, EBADF.
        let other = f.open(DevNode::Ctl).unwrap();
        let forged = CallRequest {
            fd: other.as_raw_fd(),
            op: CallOp::Ioctl {
                cmd: CHECK_VERSION,
                arg: v.as_mut_ptr() as u64,
            },
        };
        assert_eq!(
            call_on(&chan, &forged.encode()).unwrap().0.errno,
            libc::EBADF
        );
        // A call carrying fds is served, its fds closed and counted.
        send_fds(&chan, &req, &[ctl.as_raw_fd()]);
        assert_eq!(answer(&chan).unwrap().0.errno, 0);
        // The open's release ends its channels.
        drop((ctl, other));
        f.wait_opens(0);
        assert!(
            call_on(&chan, &req).is_none(),
            "the channel ended with its open"
        );
    }

    #[test]
    fn test_attaching_needs_the_open_and_a_free_channel() {
        let f = fixture("attach");
        let ctl = f.open(DevNode::Ctl).unwrap();
        let other = f.open(DevNode::Ctl).unwrap();
        let unrelated = UnixStream::pair().unwrap().0;
        for fd in [other.as_raw_fd(), unrelated.as_raw_fd(), 1000, -1] {
            assert_eq!(attach_raw(&ctl, fd).err(), Some(libc::EBADF), "fd {fd}");
        }
        // A malformed attach: EINVAL on the channel it carried.
        let mut bad = AttachRequest {
            fd: ctl.as_raw_fd(),
        }
        .encode();
        bad[12] = 1;
        let (mine, theirs) = pair();
        send_fds(&ctl, &bad, &[theirs.as_raw_fd()]);
        drop(theirs);
        assert_eq!(answer(&mine).unwrap().0.errno, libc::EINVAL);
        // The instance's channels are bounded: past the bound, EAGAIN; a channel that ends
        // makes room.
        let mut chans: Vec<OwnedFd> = (0..MAX_CHANNELS)
            .map(|_| attach_raw(&ctl, ctl.as_raw_fd()).unwrap())
            .collect();
        assert_eq!(attach_raw(&ctl, ctl.as_raw_fd()).err(), Some(libc::EAGAIN));
        chans.pop();
        let mut again = Err(0);
        let attached = eventually(Duration::from_secs(5), || {
            again = attach_raw(&ctl, ctl.as_raw_fd());
            again.is_ok()
        });
        assert!(attached, "{again:?}");
    }

    #[test]
    fn test_other_protocol_versions_are_refused_clearly() {
        let f = fixture("version");
        let mut old = OpenRequest {
            node: DevNode::Ctl,
            flags: libc::O_RDWR,
        }
        .encode();
        old[4..8].copy_from_slice(&1u32.to_ne_bytes());
        let (reply, fd) = f.open_raw(&old);
        assert_eq!(
            (reply, fd.is_none()),
            (
                Some(OpenReply {
                    errno: libc::EPROTONOSUPPORT
                }),
                true
            )
        );
        // A version-1 call (its reply socket attached) on an open: EPROTONOSUPPORT on it.
        let ctl = f.open(DevNode::Ctl).unwrap();
        let mut call = CallRequest {
            fd: ctl.as_raw_fd(),
            op: CallOp::Ioctl { cmd: 1, arg: 0 },
        }
        .encode();
        call[4..8].copy_from_slice(&1u32.to_ne_bytes());
        let (mine, theirs) = pair();
        send_fds(&ctl, &call, &[theirs.as_raw_fd()]);
        drop(theirs);
        assert_eq!(answer(&mine).unwrap().0.errno, libc::EPROTONOSUPPORT);
    }

    #[test]
    fn test_a_suspension_closes_channels_to_new_calls_and_the_next_worker_serves_them() {
        let mut f = fixture("retry");
        let ctl = Arc::new(f.open(DevNode::Ctl).unwrap());
        let chan = attach_raw(&ctl, ctl.as_raw_fd()).unwrap();
        // A call waiting on a page nobody resolves holds the suspension until its grace ends.
        let map = sys::AnonMap::new(4096).unwrap();
        let uffd = sys::uffd_register_missing(map.addr(), 4096)
            .expect("userfaultfd (root; CONFIG_USERFAULTFD)");
        let addr = map.addr();
        let c = ctl.clone();
        let waiting = std::thread::spawn(move || {
            let req = CallRequest {
                fd: c.as_raw_fd(),
                op: CallOp::Ioctl {
                    cmd: CHECK_VERSION,
                    arg: addr,
                },
            };
            call_raw(&c, &req.encode())
        });
        use std::os::fd::AsFd;
        wait_for_fault(uffd.as_fd());
        let dev = f.dev.take().unwrap();
        let suspending = std::thread::spawn(move || dev.suspend(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(300));
        // While the suspension drains, the channels take nothing more: a send fails at once
        // (nothing reached the worker), and the shim attaches anew on the open, which waits
        // for the next worker.
        let mut v = version_check();
        let req = CallRequest {
            fd: ctl.as_raw_fd(),
            op: CallOp::Ioctl {
                cmd: CHECK_VERSION,
                arg: v.as_mut_ptr() as u64,
            },
        }
        .encode();
        assert_eq!(
            socket::send(chan.as_raw_fd(), &req, MsgFlags::MSG_NOSIGNAL),
            Err(nix::errno::Errno::EPIPE)
        );
        let c = ctl.clone();
        let attaching = std::thread::spawn(move || attach_raw(&c, c.as_raw_fd()));
        let suspended = suspending.join().unwrap().map_err(|(_, e)| e).unwrap();
        let (w, _) = waiting
            .join()
            .unwrap()
            .expect("the waiting call is answered");
        assert_eq!(w.errno, libc::EFAULT);
        assert!(
            !attaching.is_finished(),
            "the attach waits for the next worker"
        );
        f.dev = Some(DevSocket::adopt("t", f.nodes.clone(), &f.root, suspended).unwrap());
        let chan = attaching
            .join()
            .unwrap()
            .expect("attached by the next worker");
        let (r, _) = call_on(&chan, &req).unwrap();
        assert_eq!((r.errno, r.retry), (0, false));
        assert!(v[8..].starts_with(b"535.261.03"));
    }

    /// What the shim does on one open, as many times as it can until `stop`: calls on its
    /// channel, a new channel after a send that could not go or a retry answer. An answer
    /// that never comes (EOF on the channel) is the failure a tenant would see: counted.
    fn shim_loop(
        conn: Arc<OwnedFd>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> (usize, usize, Vec<String>) {
        let (mut ok, mut retries, mut lost) = (0, 0, Vec::new());
        let mut chan: Option<OwnedFd> = None;
        while !stop.load(Ordering::Relaxed) {
            let c = match chan.take() {
                Some(c) => c,
                None => match attach_raw(&conn, conn.as_raw_fd()) {
                    Ok(c) => c,
                    Err(e) => {
                        lost.push(format!("attach answered {e}"));
                        continue;
                    }
                },
            };
            let mut v = version_check();
            let req = CallRequest {
                fd: conn.as_raw_fd(),
                op: CallOp::Ioctl {
                    cmd: CHECK_VERSION,
                    arg: v.as_mut_ptr() as u64,
                },
            }
            .encode();
            match socket::send(c.as_raw_fd(), &req, MsgFlags::MSG_NOSIGNAL) {
                Ok(_) => {}
                Err(nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET) => {
                    retries += 1;
                    continue;
                }
                Err(e) => {
                    lost.push(format!("send: {e}"));
                    continue;
                }
            }
            match answer(&c) {
                Some((r, _)) if r.retry => retries += 1,
                Some((r, _)) if r.errno == 0 => {
                    ok += 1;
                    chan = Some(c);
                }
                Some((r, _)) => lost.push(format!("errno {}", r.errno)),
                None => lost.push("no answer (EOF)".into()),
            }
            std::hint::black_box(&v);
        }
        (ok, retries, lost)
    }

    #[test]
    fn test_calls_across_many_suspensions_are_answered_or_retried() {
        // A live upgrade must cost a tenant at most a retry: every call sent is answered by
        // the old worker, answered "retry", or refused at the send; none gets EOF.
        let mut f = fixture("cycles");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients: Vec<_> = (0..4)
            .map(|_| {
                let conn = Arc::new(f.open(DevNode::Ctl).unwrap());
                let stop = stop.clone();
                std::thread::spawn(move || shim_loop(conn, stop))
            })
            .collect();
        for _ in 0..60 {
            std::thread::sleep(Duration::from_millis(3));
            let dev = f.dev.take().unwrap();
            let suspended = dev
                .suspend(Duration::from_secs(10))
                .map_err(|(_, e)| e)
                .unwrap();
            f.dev = Some(DevSocket::adopt("t", f.nodes.clone(), &f.root, suspended).unwrap());
        }
        stop.store(true, Ordering::Relaxed);
        let mut total = 0;
        for c in clients {
            let (ok, retries, lost) = c.join().unwrap();
            assert!(
                lost.is_empty(),
                "{ok} answered, {retries} retried, lost: {lost:?}"
            );
            total += ok;
        }
        assert!(total > 0);
    }

    thread_local! {
        /// The next this many `spawn_open_thread` calls on this thread fail.
        pub(super) static FAIL_SPAWNS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn test_an_adopted_open_without_a_thread_is_closed_and_released() {
        // A live upgrade whose worker cannot start an open's thread: that open must not stay
        // in the table unserved (its client would wait forever, its backend open never be
        // released); the other opens are served.
        let mut f = fixture("adopt-nothread");
        let lost = f.open(DevNode::Ctl).unwrap();
        let kept = f.open(DevNode::Ctl).unwrap();
        f.wait_opens(2);
        let dev = f.dev.take().unwrap();
        let mut suspended = dev
            .suspend(Duration::from_secs(5))
            .map_err(|(_, e)| e)
            .unwrap();
        let lost_cookie = sys::socket_cookie(lost.as_fd()).unwrap();
        suspended
            .opens
            .sort_by_key(|o| u8::from(o.cookie != lost_cookie));
        FAIL_SPAWNS.with(|n| n.set(1));
        f.dev = Some(DevSocket::adopt("t", f.nodes.clone(), &f.root, suspended).unwrap());
        FAIL_SPAWNS.with(|n| n.set(0));
        assert_eq!(
            f.dev.as_ref().unwrap().opens(),
            1,
            "the unserved open left the table"
        );
        assert_eq!(f.proxy.open_files(), 1, "its backend open was released");
        // Its client reads EOF at once (its next call fails instead of waiting forever).
        let mut buf = [0u8; 8];
        assert_eq!(
            socket::recv(lost.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT),
            Ok(0),
            "the lost open's connection is ended"
        );
        let chan = attach_raw(&kept, kept.as_raw_fd()).expect("the other open is served");
        drop(chan);
    }

    #[test]
    fn test_an_adopted_open_serves_only_once_every_open_is_known() {
        // A live upgrade hands the opens over in any order. A call that the first adopted open
        // serves may name another open's fd (UVM's rmCtrlFd, REGISTER_FD's control fd): that
        // open must already be known, or the tenant's call fails for the upgrade's sake.
        let mut f = fixture("adopt-order");
        let ctl = f.open(DevNode::Ctl).unwrap();
        let gpu = Arc::new(f.open(DevNode::Gpu(0)).unwrap());
        // More opens, adopted between the GPU open and the control open below.
        let others: Vec<OwnedFd> = (0..400).map(|_| f.open(DevNode::Gpu(0)).unwrap()).collect();
        f.wait_opens(402);
        let dev = f.dev.take().unwrap();
        let mut suspended = dev
            .suspend(Duration::from_secs(5))
            .map_err(|(_, e)| e)
            .unwrap();
        let ctl_cookie = sys::socket_cookie(ctl.as_fd()).unwrap();
        let gpu_cookie = sys::socket_cookie(gpu.as_fd()).unwrap();
        // The GPU open first, the control open last.
        suspended.opens.sort_by_key(|o| match o.cookie {
            c if c == gpu_cookie => 0,
            c if c == ctl_cookie => 2,
            _ => 1,
        });
        // An attach waiting in the GPU open's connection, as the shim's after a suspension;
        // its first call registers the control fd.
        let g = gpu.clone();
        let ctl_fd = ctl.as_raw_fd();
        let calling = std::thread::spawn(move || {
            let chan = attach_raw(&g, g.as_raw_fd()).expect("attached by the next worker");
            const REGISTER_FD: u32 = 0xc004_46c9;
            let mut arg = ctl_fd.to_ne_bytes();
            let req = CallRequest {
                fd: g.as_raw_fd(),
                op: CallOp::Ioctl {
                    cmd: REGISTER_FD,
                    arg: arg.as_mut_ptr() as u64,
                },
            };
            let r = call_on(&chan, &req.encode()).expect("a reply").0;
            std::hint::black_box(&arg);
            r
        });
        // The attach is in the GPU open's connection (adopted first after the sort).
        let mut fds = [PollFd::new(
            suspended.opens[0].conn.as_fd(),
            PollFlags::POLLIN,
        )];
        assert_eq!(poll(&mut fds, PollTimeout::from(5000u16)).unwrap(), 1);
        f.dev = Some(DevSocket::adopt("t", f.nodes.clone(), &f.root, suspended).unwrap());
        let r = calling.join().unwrap();
        assert_eq!(
            (r.errno, r.result),
            (0, 0),
            "REGISTER_FD right after the adoption"
        );
        drop(others);
    }
}
