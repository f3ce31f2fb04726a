//! Live upgrade: a worker hands its instance to a new worker process without its clients
//! noticing (`nvproxy instance upgrade NAME`, the supervisor's SIGHUP).
//!
//! The new worker (`nvproxy worker` with `take_over` in its spec, started by the supervisor
//! from the binary on disk now) connects to the old one's worker socket and asks for the
//! instance. The old worker:
//!
//! 1. suspends its CUSE sessions (`InstanceNodes::suspend`: running handlers answer first;
//!    requests that arrive meanwhile wait in the kernel's queue) and its mmap socket (the
//!    listener stays bound; connections wait in its backlog);
//! 2. exports its state ([`WorkerState`], versioned JSON) and sends it with every fd it
//!    names over the socket (`SCM_RIGHTS`, [`fdpass::FDS_PER_MESSAGE`] a message): the
//!    `/dev/cuse` channels, the mmap listener (with the socket transport instead: the device
//!    socket's listener and every open's connection), every host file (real driver: the fds;
//!    a simulated driver process: its session's anchor, the files by handle);
//! 3. waits for the new worker's `ready` (it has rebuilt the proxies, adopted every file and
//!    serves nothing yet), answers `commit` and exits at once, without closing anything
//!    (no destructor runs: its host files must not be closed, they are the new worker's now).
//!
//! Anything else — a refusal, a new worker that fails or dies before `ready`, no `ready` in
//! [`READY_TIMEOUT`] — and the old worker resumes its sessions and socket itself: the upgrade
//! did not happen, nothing was half done. The new worker, after `commit`, resumes the sessions
//! (`Session::resume`: the kernel's device, its open files and queued requests are the same)
//! and serves; without `commit` it exits, again without closing what it adopted.
//!
//! What a tenant keeps across it: its open files (the kernel's, with their `fh`), every RM
//! handle and host file (the same driver state), mmap tickets and mappings (the mappings are
//! the tenant's; tickets carry over with the time they had left), the audit counts.
//!
//! The state format is [`STATE_FORMAT`] version [`STATE_VERSION`]: a worker reads states of
//! its version and older; a newer one is refused with both numbers.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use cuse_dev::{InitInfo, IoVec, PendingRetry, RetryRound};
use host_driver::HandedFile;
use ioctl_proxy::HostDriver;
use ioctl_proxy::live::LiveProxy;
use uvm::live::LiveUvmOpen;

use crate::fdid::FdIdentity;
use crate::fdpass;
use crate::instance::{InstanceNodes, SuspendedNode};
use crate::mmap::{InstanceMmap, LiveTicket, MmapSocket};
use crate::node::{Node, WireNode};
use crate::running::{Parts, RunningInstance, Serving};
use crate::socket_transport::{DevSocket, SuspendedOpen, SuspendedSocket};
use crate::worker_spec::WorkerSpec;

/// The `format` field of a worker's state.
pub const STATE_FORMAT: &str = "nvproxy-worker-state";
/// The state version this binary writes (and the newest it reads).
pub const STATE_VERSION: u32 = 1;
/// How long the old worker waits for the new one to have taken everything over.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the new worker waits for the old one's `commit`.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(20);
/// The largest state accepted (the tables are bounded by the instance's quotas).
const MAX_STATE_BYTES: u64 = 512 << 20;
/// The most fds a state may name (the open-file quota's bound, twice for mapping files).
const MAX_FDS: usize = 1 << 18;

/// A host file in the state; its fd, if any, is `fds[fd]` of the transfer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireFile {
    /// Its node.
    pub node: WireNode,
    /// Index of its fd in the transfer.
    pub fd: Option<usize>,
    /// The driver's name for it (a simulated driver process's handle).
    pub token: u64,
    /// Its id in translated params.
    pub id: i32,
    /// A mapping file.
    pub mapping: bool,
}

/// A retry round in progress on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireRetry {
    /// The open file.
    pub fh: u64,
    /// The calling thread.
    pub tid: u32,
    /// The regions the next round carries in: (address, length).
    pub in_iovs: Vec<(u64, u64)>,
    /// The regions it carries out.
    pub out_iovs: Vec<(u64, u64)>,
}

/// One suspended CUSE node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    /// The node (`ctl`, `gpu0`, `uvm`).
    pub node: String,
    /// Index of its `/dev/cuse` channel in the transfer.
    pub channel: usize,
    /// `CUSE_INIT`: kernel major, kernel minor, minor, flags, max_read, max_write, device
    /// major, device minor.
    pub init: [u32; 8],
    /// Retry rounds in progress.
    #[serde(default)]
    pub retries: Vec<WireRetry>,
}

/// The socket transport's device socket in the state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketState {
    /// Index of its listener.
    pub listener: usize,
    /// Its opens.
    pub opens: Vec<SocketOpenState>,
}

/// One open of the socket transport: its connection and what it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketOpenState {
    /// The backend's open id.
    pub id: u64,
    /// Its node (`ctl`, `gpu0`, `uvm`).
    pub node: String,
    /// `SO_COOKIE` of the client's end.
    pub cookie: u64,
    /// `O_ACCMODE` of the caller's open flags.
    pub access: i32,
    /// Index of the worker's end of the connection.
    pub conn: usize,
}

/// A worker's state as the new worker receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerState {
    /// Always [`STATE_FORMAT`].
    pub format: String,
    /// The version it was written with.
    pub version: u32,
    /// The instance.
    pub instance: String,
    /// The old worker's pid.
    pub from_pid: u32,
    /// The driver's version (the new worker's driver must report the same).
    pub driver_version: String,
    /// How many fds follow.
    pub fds: usize,
    /// The CUSE nodes.
    pub nodes: Vec<NodeState>,
    /// Index of the mmap socket's listener (CUSE transport).
    #[serde(default)]
    pub mmap_listener: Option<usize>,
    /// The device socket (socket transport).
    #[serde(default)]
    pub socket: Option<SocketState>,
    /// The nodes' device numbers → node index (fd resolution).
    pub fdid_devices: Vec<(u64, usize)>,
    /// The driver's own state (a simulated driver process's session and anchor).
    #[serde(default)]
    pub driver: Option<WireFile>,
    /// Host files, indexed by the proxies' tables.
    pub files: Vec<WireFile>,
    /// The policy served (the new worker serves the same).
    pub policy: ioctl_proxy::live::LivePolicy,
    /// The frontend proxy.
    pub proxy: LiveProxy,
    /// The UVM opens.
    #[serde(default)]
    pub uvm: Vec<LiveUvmOpen>,
    /// Live mmap tickets.
    #[serde(default)]
    pub tickets: Vec<LiveTicket>,
}

impl WorkerState {
    /// Parses a state: the format must match and the version be at most [`STATE_VERSION`]
    /// (a newer one is refused with both numbers, never guessed at).
    pub fn from_json(text: &[u8]) -> Result<WorkerState> {
        let v: serde_json::Value =
            serde_json::from_slice(text).context("the worker state is not JSON")?;
        if v.get("format").and_then(|f| f.as_str()) != Some(STATE_FORMAT) {
            bail!("the worker state has no \"format\": \"{STATE_FORMAT}\"");
        }
        let version = v
            .get("version")
            .and_then(serde_json::Value::as_u64)
            .context("the worker state has no numeric version")?;
        if version > u64::from(STATE_VERSION) {
            bail!(
                "the old worker's state is version {version}; this binary reads versions up to \
                 {STATE_VERSION} (a downgrade across state versions is refused)"
            );
        }
        if version == 0 {
            bail!("worker state version 0 does not exist");
        }
        // Version 1 is the first; converting an older version's fields goes here.
        let s: WorkerState = serde_json::from_value(v).context("the worker state")?;
        if s.fds > MAX_FDS {
            bail!("the worker state names {} fds (at most {MAX_FDS})", s.fds);
        }
        Ok(s)
    }
}

fn wire_file(f: HandedFile, fds: &mut Vec<OwnedFd>) -> WireFile {
    let fd = f.fd.map(|fd| {
        fds.push(fd);
        fds.len() - 1
    });
    WireFile {
        node: f.node.into(),
        fd,
        token: f.token,
        id: f.id,
        mapping: f.mapping,
    }
}

fn handed_file(w: &WireFile, fds: &mut [Option<OwnedFd>]) -> Result<HandedFile> {
    let fd = match w.fd {
        Some(i) => Some(
            fds.get_mut(i)
                .and_then(Option::take)
                .with_context(|| format!("fd {i} missing or named twice"))?,
        ),
        None => None,
    };
    Ok(HandedFile {
        node: w.node.into(),
        fd,
        token: w.token,
        id: w.id,
        mapping: w.mapping,
    })
}

fn take_fd(fds: &mut [Option<OwnedFd>], i: usize) -> Result<OwnedFd> {
    fds.get_mut(i)
        .and_then(Option::take)
        .with_context(|| format!("fd {i} missing or named twice"))
}

fn send_state(conn: &UnixStream, json: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let mut w = conn;
    w.write_all(&(json.len() as u64).to_le_bytes())?;
    w.write_all(json)?;
    for chunk in fds.chunks(fdpass::FDS_PER_MESSAGE) {
        fdpass::send_fds(conn.as_fd(), chunk)?;
    }
    Ok(())
}

fn send_refusal(conn: &UnixStream, why: &str) {
    let text = serde_json::json!({ "error": why }).to_string();
    let mut w = conn;
    let _ = w.write_all(&(text.len() as u64).to_le_bytes());
    let _ = w.write_all(text.as_bytes());
}

/// What the old worker suspended, to give back to itself when the handover fails.
enum Suspension {
    /// The CUSE nodes' sessions and the mmap socket's listener.
    Cuse {
        nodes: Vec<SuspendedNode>,
        mmap_listener: OwnedFd,
    },
    /// The device socket's listener and opens.
    Socket(SuspendedSocket),
}

/// How long a suspension waits for the socket transport's running calls.
const DRAIN: Duration = Duration::from_secs(15);

fn socket_nodes(running: &RunningInstance) -> crate::socket_transport::Nodes {
    let (frontend, uvm, _) = running.parts();
    crate::socket_transport::Nodes {
        frontend,
        uvm: Some(uvm),
        gpus: running.gpus,
    }
}

fn suspend(running: &RunningInstance) -> Result<Suspension> {
    let mut serving = running.serving();
    match serving.take() {
        None => bail!("the instance is not serving"),
        Some(Serving::Socket(dev)) => match dev.suspend(DRAIN) {
            Ok(s) => Ok(Suspension::Socket(s)),
            Err((dev, e)) => {
                *serving = Some(Serving::Socket(dev));
                Err(e)
            }
        },
        Some(Serving::Cuse {
            mut nodes,
            mmap_socket,
        }) => {
            let suspended = match nodes.suspend() {
                Ok(s) => s,
                Err(e) => {
                    *serving = Some(Serving::Cuse { nodes, mmap_socket });
                    return Err(e);
                }
            };
            // The sessions are suspended; the nodes' threads are gone, the channels are ours.
            drop(nodes);
            match mmap_socket.suspend() {
                Ok(listener) => Ok(Suspension::Cuse {
                    nodes: suspended,
                    mmap_listener: listener,
                }),
                Err(e) => {
                    // Never seen (the socket's server is there while it serves): serve the
                    // nodes again, with a new socket.
                    drop(serving);
                    let nodes = resume_nodes(running, suspended)?;
                    let mmap_socket = MmapSocket::start(running.mmap.clone(), running.root())?;
                    *running.serving() = Some(Serving::Cuse { nodes, mmap_socket });
                    Err(e)
                }
            }
        }
    }
}

/// Serves suspended CUSE sessions again with this worker's backends.
fn resume_nodes(running: &RunningInstance, nodes: Vec<SuspendedNode>) -> Result<InstanceNodes> {
    let (frontend, uvm, _) = running.parts();
    InstanceNodes::resume(
        running.name(),
        nodes,
        frontend,
        Some(uvm),
        running.fdid.clone(),
        running.transport,
        running.mmap.clone(),
    )
}

/// Serves the suspended sessions and sockets again in this process.
fn resume_here(running: &RunningInstance, s: Suspension) -> Result<()> {
    let name = running.name().to_owned();
    let root = running.root();
    let serving = match s {
        Suspension::Socket(sock) => {
            Serving::Socket(DevSocket::adopt(&name, socket_nodes(running), root, sock)?)
        }
        Suspension::Cuse {
            nodes,
            mmap_listener,
        } => {
            let nodes = resume_nodes(running, nodes)?;
            let mmap_socket = MmapSocket::adopt(running.mmap.clone(), root, mmap_listener)?;
            Serving::Cuse { nodes, mmap_socket }
        }
    };
    *running.serving() = Some(serving);
    Ok(())
}

fn export(
    running: &RunningInstance,
    host: &Arc<dyn HostDriver>,
    s: &Suspension,
) -> Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut fds: Vec<OwnedFd> = Vec::new();
    let driver = host
        .hand_over_driver()
        .map_err(|e| {
            anyhow::anyhow!(
                "the driver cannot be handed to another process ({e}): with driver = \"sim\", a \
                 live upgrade needs [sim] process = true"
            )
        })?
        .map(|d| wire_file(d, &mut fds));
    let mut nodes = Vec::new();
    let mut mmap_listener = None;
    let mut socket = None;
    match s {
        Suspension::Cuse {
            nodes: suspended,
            mmap_listener: listener,
        } => {
            for n in suspended {
                fds.push(n.channel.try_clone().context("dup of a channel")?);
                nodes.push(NodeState {
                    node: n.node.to_string(),
                    channel: fds.len() - 1,
                    init: [
                        n.init.kernel_major,
                        n.init.kernel_minor,
                        n.init.minor,
                        n.init.flags,
                        n.init.max_read,
                        n.init.max_write,
                        n.init.dev_major,
                        n.init.dev_minor,
                    ],
                    retries: n
                        .retries
                        .iter()
                        .map(|r| WireRetry {
                            fh: r.fh,
                            tid: r.tid,
                            in_iovs: r.round.in_iovs.iter().map(|v| (v.base, v.len)).collect(),
                            out_iovs: r.round.out_iovs.iter().map(|v| (v.base, v.len)).collect(),
                        })
                        .collect(),
                });
            }
            fds.push(listener.try_clone().context("dup of the mmap listener")?);
            mmap_listener = Some(fds.len() - 1);
        }
        Suspension::Socket(sock) => {
            fds.push(
                sock.listener
                    .try_clone()
                    .context("dup of the device socket")?,
            );
            let listener = fds.len() - 1;
            let mut opens = Vec::new();
            for o in &sock.opens {
                fds.push(o.conn.try_clone().context("dup of an open's connection")?);
                opens.push(SocketOpenState {
                    id: o.id,
                    node: o.node.to_string(),
                    cookie: o.cookie,
                    access: o.access,
                    conn: fds.len() - 1,
                });
            }
            socket = Some(SocketState { listener, opens });
        }
    }
    let (frontend, uvm, _) = running.parts();
    let (proxy, mut handed) = frontend.proxy().export_live()?;
    let uvm = uvm.uvm().export_live(&mut handed)?;
    let files = handed.into_iter().map(|f| wire_file(f, &mut fds)).collect();
    let state = WorkerState {
        format: STATE_FORMAT.into(),
        version: STATE_VERSION,
        instance: running.name().to_owned(),
        from_pid: std::process::id(),
        driver_version: host.version().trim().to_owned(),
        fds: fds.len(),
        nodes,
        mmap_listener,
        socket,
        fdid_devices: running.fdid.devices(),
        driver,
        files,
        policy: ioctl_proxy::live::LivePolicy::of(frontend.proxy().policy()),
        proxy,
        uvm,
        tickets: running.mmap.export_tickets(),
    };
    Ok((serde_json::to_vec(&state)?, fds))
}

/// The old worker's side: answers a new worker's `handover` on `conn` (the worker socket,
/// peer already checked). Returns only when the upgrade did not happen (this worker serves
/// on); after `commit` it exits the process.
pub fn hand_over(running: &RunningInstance, host: &Arc<dyn HostDriver>, conn: UnixStream) {
    let name = running.name().to_owned();
    let peer = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials)
        .map(|c| c.pid())
        .unwrap_or(0);
    tracing::info!(instance = %name, new_worker = peer, "live upgrade: handing the instance over");
    let suspension = match suspend(running) {
        Ok(s) => s,
        Err(e) => {
            let why = format!("{e:#}");
            tracing::warn!(instance = %name, error = %why, "live upgrade refused");
            send_refusal(&conn, &why);
            return;
        }
    };
    let outcome = (|| -> Result<()> {
        let (json, fds) = export(running, host, &suspension)?;
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        send_state(&conn, &json, &raw).context("sending the state")?;
        drop(fds);
        conn.set_read_timeout(Some(READY_TIMEOUT))?;
        let mut line = String::new();
        BufReader::new(&conn)
            .read_line(&mut line)
            .context("waiting for the new worker")?;
        if line.trim() != "ready" {
            bail!(
                "the new worker did not take over ({})",
                if line.is_empty() {
                    "it closed the connection".to_owned()
                } else {
                    line.trim().to_owned()
                }
            );
        }
        Ok(())
    })();
    match outcome {
        Ok(()) => {
            // The point of no return: the new worker serves once it reads this.
            if (&conn).write_all(b"commit\n").is_ok() {
                let (_, _, sink) = running.parts();
                sink.sync();
                tracing::info!(instance = %name, new_worker = peer, "live upgrade: handed over; this worker exits");
                // Nothing is closed or freed: the host files, channels and sockets are the new
                // worker's now (destructors would close the simulated driver's files).
                std::process::exit(0);
            }
            tracing::warn!(instance = %name, "live upgrade: the commit could not be sent");
        }
        Err(e) => {
            let why = format!("{e:#}");
            tracing::warn!(instance = %name, error = %why, "live upgrade failed; this worker serves on");
            send_refusal(&conn, &why);
        }
    }
    if let Err(e) = resume_here(running, suspension) {
        tracing::error!(instance = %name, error = %format!("{e:#}"), "live upgrade: the instance could not be served again");
    }
}

/// Exits without running destructors: what was adopted (host files, sessions) is the old
/// worker's again and must not be closed.
fn abandon(instance: &str, e: &anyhow::Error) -> ! {
    eprintln!("nvproxy: instance {instance}: taking over failed: {e:#}");
    tracing::error!(instance, error = %format!("{e:#}"), "taking over failed; the old worker serves on");
    std::process::exit(1);
}

/// The new worker's side: takes the instance of `spec` over from the worker serving it now
/// (its socket `worker_socket`). Returns the running instance and its driver once it serves.
pub fn take_over(
    spec: &WorkerSpec,
    worker_socket: &Path,
) -> Result<(RunningInstance, crate::running::Driver)> {
    let name = &spec.instance.name;
    let conn = UnixStream::connect(worker_socket).with_context(|| {
        format!(
            "connecting to the old worker at {}",
            worker_socket.display()
        )
    })?;
    conn.set_read_timeout(Some(READY_TIMEOUT))?;
    let request = serde_json::json!({
        "op": "handover",
        "version": STATE_VERSION,
        "pid": std::process::id(),
    });
    (&conn).write_all(format!("{request}\n").as_bytes())?;
    let mut len = [0u8; 8];
    (&conn)
        .read_exact(&mut len)
        .context("the old worker closed the connection")?;
    let len = u64::from_le_bytes(len);
    if len > MAX_STATE_BYTES {
        bail!("the old worker's state is {len} bytes (at most {MAX_STATE_BYTES})");
    }
    let mut json = vec![0u8; usize::try_from(len)?];
    (&conn).read_exact(&mut json).context("reading the state")?;
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&json)
        && let Some(e) = v.get("error").and_then(|e| e.as_str())
    {
        bail!("the old worker refused: {e}");
    }
    let state = WorkerState::from_json(&json)?;
    if state.instance != *name {
        bail!("the old worker serves {}, not {name}", state.instance);
    }
    let mut fds: Vec<Option<OwnedFd>> = Vec::with_capacity(state.fds);
    while fds.len() < state.fds {
        let got = fdpass::recv_fds(conn.as_fd()).context("receiving the fds")?;
        if got.is_empty() || fds.len() + got.len() > state.fds {
            bail!(
                "the old worker sent {} fds, not {}",
                fds.len() + got.len(),
                state.fds
            );
        }
        fds.extend(got.into_iter().map(Some));
    }
    // A fault-injection point for the tests of a failed upgrade: when the file this variable
    // names exists, it is removed and the take-over fails here, after the state arrived.
    if let Some(trigger) = std::env::var_os("NVPROXY_FAULT_TAKE_OVER")
        && std::fs::remove_file(&trigger).is_ok()
    {
        let e = anyhow::anyhow!("fault injected (NVPROXY_FAULT_TAKE_OVER)");
        let _ = (&conn).write_all(format!("abort {e}\n").as_bytes());
        abandon(name, &e);
    }
    // From here on, what is adopted must never be closed by us unless the old worker commits.
    let prepared = match prepare(spec, state, &mut fds) {
        Ok(p) => p,
        Err(e) => {
            let _ = (&conn).write_all(format!("abort {e:#}\n").as_bytes());
            abandon(name, &e);
        }
    };
    if let Err(e) = (&conn).write_all(b"ready\n") {
        abandon(
            name,
            &anyhow::Error::from(e).context("telling the old worker"),
        );
    }
    conn.set_read_timeout(Some(COMMIT_TIMEOUT))?;
    let mut line = String::new();
    let _ = BufReader::new(&conn).read_line(&mut line);
    if line.trim() != "commit" {
        abandon(
            name,
            &anyhow::anyhow!("no commit from the old worker (it serves on)"),
        );
    }
    match prepared.serve(spec) {
        Ok(r) => Ok(r),
        Err(e) => abandon(name, &e),
    }
}

/// Everything rebuilt, nothing served yet.
struct Prepared {
    driver: crate::running::Driver,
    parts: Parts,
    serving: Suspension,
    fdid: Arc<FdIdentity>,
    mmap: Arc<InstanceMmap>,
}

fn prepare(spec: &WorkerSpec, state: WorkerState, fds: &mut [Option<OwnedFd>]) -> Result<Prepared> {
    let name = &spec.instance.name;
    let mut driver = match (&spec.sim_socket, spec.driver) {
        (Some(path), nvproxy_config::DriverKind::Sim) => {
            let d = state
                .driver
                .as_ref()
                .context("the old worker sent no sim-driver session")?;
            let anchor = handed_file(d, fds)?
                .fd
                .context("the sim-driver session came without its anchor")?;
            let remote = Arc::new(crate::simd::RemoteSim::adopt_session(
                path, d.token, anchor,
            )?);
            crate::running::Driver {
                host: remote.clone(),
                sim: None,
                remote: Some(remote),
                abi: None,
            }
        }
        (None, nvproxy_config::DriverKind::Sim) => {
            bail!(
                "instance {name}: its simulated driver lives in the worker; a live upgrade needs [sim] process = true"
            )
        }
        _ => crate::running::make_driver(
            spec.driver,
            spec.sim.gpus,
            &spec.sim.driver_version,
            spec.allow_unrestricted_mmap_fds,
            Some(name),
        )?,
    };
    if driver.host.version().trim() != state.driver_version {
        bail!(
            "the driver is {} now, the old worker served {}",
            driver.host.version().trim(),
            state.driver_version
        );
    }
    let choice = nvproxy_config::abi_tables::AbiChoice {
        abi_version: spec.abi_version.clone(),
        abi_dir: spec.abi_dir.clone(),
    };
    let (abi, from) = nvproxy_config::abi_tables::host_tables(driver.host.version(), &choice)?;
    tracing::info!(instance = %name, tables = %from, "ABI tables");
    driver.abi = Some(abi);
    crate::record::wrap(&mut driver, &spec.instance)?;
    // Never dropped before the commit: its proxies adopt the old worker's files, and a file
    // dropped here would be closed in the driver under the old worker (it serves on when we
    // fail). On an error it is leaked and the process exits (`abandon`).
    let served = state.policy.to_policy()?;
    let parts = std::mem::ManuallyDrop::new(Parts::build_with(
        &spec.instance,
        &driver,
        spec.audit.as_deref(),
        Some(served),
    )?);
    let mut handed: Vec<Option<HandedFile>> = state
        .files
        .iter()
        .map(|w| handed_file(w, fds).map(Some))
        .collect::<Result<_>>()?;
    parts.backend.proxy().adopt_live(state.proxy, &mut handed)?;
    parts.uvm_backend.uvm().adopt_live(state.uvm, &mut handed)?;
    let fdid = Arc::new(FdIdentity::new().context("reading a random secret")?);
    for (rdev, index) in state.fdid_devices {
        fdid.add_device(rdev, index);
    }
    let mmap = Arc::new(InstanceMmap::new(name).context("mmap tickets")?);
    let frontend: Arc<dyn crate::node::Backend> = parts.backend.clone();
    let uvm: Arc<dyn crate::node::Backend> = parts.uvm_backend.clone();
    mmap.import_tickets(state.tickets, |n| {
        Some(if n == Node::Uvm {
            uvm.clone()
        } else {
            frontend.clone()
        })
    });
    let mut nodes = Vec::new();
    for n in state.nodes {
        let node = Node::parse(&n.node).with_context(|| format!("node {:?}", n.node))?;
        let [
            kernel_major,
            kernel_minor,
            minor,
            flags,
            max_read,
            max_write,
            dev_major,
            dev_minor,
        ] = n.init;
        nodes.push(SuspendedNode {
            node,
            channel: take_fd(fds, n.channel)?,
            init: InitInfo {
                kernel_major,
                kernel_minor,
                minor,
                flags,
                max_read,
                max_write,
                dev_major,
                dev_minor,
            },
            retries: n
                .retries
                .into_iter()
                .map(|r| PendingRetry {
                    fh: r.fh,
                    tid: r.tid,
                    round: RetryRound {
                        in_iovs: r.in_iovs.iter().map(|&(b, l)| IoVec::new(b, l)).collect(),
                        out_iovs: r.out_iovs.iter().map(|&(b, l)| IoVec::new(b, l)).collect(),
                    },
                })
                .collect(),
        });
    }
    let serving = match (state.socket, state.mmap_listener) {
        (Some(sock), None) if nodes.is_empty() => {
            let listener = take_fd(fds, sock.listener)?;
            let mut opens = Vec::new();
            for o in sock.opens {
                opens.push(SuspendedOpen {
                    id: o.id,
                    node: Node::parse(&o.node).with_context(|| format!("node {:?}", o.node))?,
                    cookie: o.cookie,
                    access: o.access,
                    conn: take_fd(fds, o.conn)?,
                });
            }
            Suspension::Socket(SuspendedSocket { listener, opens })
        }
        (None, Some(l)) => Suspension::Cuse {
            nodes,
            mmap_listener: take_fd(fds, l)?,
        },
        _ => bail!("the state names neither CUSE nodes with an mmap socket nor a device socket"),
    };
    let transport = if matches!(serving, Suspension::Socket(_)) {
        nvproxy_config::Transport::Socket
    } else {
        nvproxy_config::Transport::Cuse
    };
    if transport != spec.instance.transport {
        bail!(
            "the old worker serves the {transport} transport, the spec says {}",
            spec.instance.transport
        );
    }
    Ok(Prepared {
        driver,
        parts: std::mem::ManuallyDrop::into_inner(parts),
        serving,
        fdid,
        mmap,
    })
}

impl Prepared {
    fn serve(self, spec: &WorkerSpec) -> Result<(RunningInstance, crate::running::Driver)> {
        let name = &spec.instance.name;
        let frontend: Arc<dyn crate::node::Backend> = self.parts.backend.clone();
        let uvm: Arc<dyn crate::node::Backend> = self.parts.uvm_backend.clone();
        let root = spec.run_dir.as_path();
        let serving = match self.serving {
            Suspension::Cuse {
                nodes,
                mmap_listener,
            } => {
                let nodes = InstanceNodes::resume(
                    name,
                    nodes,
                    frontend,
                    Some(uvm),
                    self.fdid.clone(),
                    spec.memory,
                    self.mmap.clone(),
                )?;
                let mmap_socket = MmapSocket::adopt(self.mmap.clone(), root, mmap_listener)?;
                Serving::Cuse { nodes, mmap_socket }
            }
            Suspension::Socket(sock) => {
                let nodes = crate::socket_transport::Nodes {
                    frontend,
                    uvm: Some(uvm),
                    gpus: u32::try_from(spec.instance.gpus.len()).context("too many GPUs")?,
                };
                Serving::Socket(DevSocket::adopt(name, nodes, root, sock)?)
            }
        };
        tracing::info!(instance = %name, "live upgrade: serving the instance taken over");
        let running =
            RunningInstance::from_serving(spec, self.parts, serving, self.fdid, self.mmap)?;
        Ok((running, self.driver))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(version: u32) -> String {
        serde_json::json!({
            "format": STATE_FORMAT, "version": version, "instance": "a", "from_pid": 1,
            "driver_version": "535.261.03", "fds": 0, "nodes": [], "mmap_listener": 0,
            "fdid_devices": [], "files": [],
            "policy": {"name": "a", "caps": ["compute"], "gpus": [0], "mode": "enforce",
                       "uvm_mmap": true, "quotas": [1, 2, 3]},
            "proxy": {"next_open": 1, "opens": [], "clients": []},
        })
        .to_string()
    }

    #[test]
    fn test_a_state_of_this_version_parses() {
        let s = WorkerState::from_json(state(STATE_VERSION).as_bytes()).unwrap();
        assert_eq!((s.instance.as_str(), s.version), ("a", STATE_VERSION));
    }

    #[test]
    fn test_a_newer_state_is_refused_with_both_versions() {
        let e = WorkerState::from_json(state(STATE_VERSION + 1).as_bytes()).unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.contains(&format!("version {}", STATE_VERSION + 1))
                && text.contains(&format!("up to {STATE_VERSION}")),
            "{text}"
        );
    }

    #[test]
    fn test_other_formats_and_version_0_are_refused() {
        assert!(WorkerState::from_json(b"{\"format\":\"x\",\"version\":1}").is_err());
        assert!(WorkerState::from_json(state(0).as_bytes()).is_err());
        assert!(WorkerState::from_json(b"not json").is_err());
    }

    #[test]
    fn test_fds_travel_in_chunks_and_arrive_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        let files: Vec<OwnedFd> = (0..600)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
            .collect();
        let raw: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
        let sender = std::thread::spawn(move || send_state(&a, b"{}", &raw));
        let mut len = [0u8; 8];
        (&b).read_exact(&mut len).unwrap();
        let mut json = vec![0u8; usize::try_from(u64::from_le_bytes(len)).unwrap()];
        (&b).read_exact(&mut json).unwrap();
        assert_eq!(json, b"{}");
        let mut got = Vec::new();
        while got.len() < 600 {
            got.extend(fdpass::recv_fds(b.as_fd()).unwrap());
        }
        sender.join().unwrap().unwrap();
        use std::os::unix::fs::MetadataExt;
        let want = std::fs::metadata("/dev/null").unwrap().rdev();
        for f in &got {
            assert_eq!(
                std::fs::File::from(f.try_clone().unwrap())
                    .metadata()
                    .unwrap()
                    .rdev(),
                want
            );
        }
        drop(files);
    }
}
