//! The simulated driver as a process of its own (`nvproxy sim-driver`, `[sim] process =
//! true`), the way the kernel driver is one for all processes: workers reach it through
//! [`RemoteSim`], a [`HostDriver`] over a unix socket, and it outlives them. So a worker that
//! crashes loses what it held (the driver closes a dead process's files, as the kernel does at
//! exit) while the driver keeps its state for everyone else, and a worker can be replaced
//! without the driver going with it.
//!
//! **Wire.** Length-prefixed, versioned frames on a `SOCK_STREAM` connection (a request, then
//! its answer): a `u32` length, a `u16` [`FRAME_VERSION`], then the message in `postcard`'s
//! encoding. An answer that carries an fd (`mmap_fd`'s memfd) sends it with `SCM_RIGHTS` on the
//! frame's first byte. Every frame is bounded ([`MAX_FRAME`]). The driver process outlives
//! workers, so an upgraded worker can meet a driver of an older build: a frame of another
//! version is refused by name on either side, never decoded as something else (the
//! unversioned frames of earlier builds read as version 0).
//!
//! **Sessions.** A client's first connection says `Hello` and gets a session; it is the
//! session's *anchor* and stays idle. Further connections (one per concurrent call) attach to
//! the session. Files belong to the session, and when its anchor closes, every file it still
//! holds is closed (the process-exit rule), whatever connection opened it.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use host_driver::{HostCall, HostDriver, HostFile, NestedBuf, NodeKind};
use nvproxy_abi::DriverVersion;
use nvsim::{SimConfig, SimDriver, SimStats};
use serde::{Deserialize, Serialize};

use crate::listener::Stop;
use crate::node::WireNode;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The largest frame either side accepts: a call's params and nested buffers (each bounded by
/// the ABI tables well below this) with room to spare.
pub const MAX_FRAME: usize = 64 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct WireCall {
    cmd: u32,
    params: Vec<u8>,
    nested: Vec<(Option<usize>, usize, Vec<u8>)>,
    /// Whether the calling thread holds `RS_ACCESS_NICE`, for the calls whose answer depends
    /// on it (`nvsim::caller`); the driver process cannot see the caller's thread.
    nice: Option<bool>,
}

impl WireCall {
    fn from_call(c: &HostCall) -> Self {
        WireCall {
            cmd: c.cmd,
            nice: None,
            params: c.params.to_vec(),
            nested: c
                .nested
                .iter()
                .map(|n| (n.parent, n.offset, n.data.to_vec()))
                .collect(),
        }
    }

    /// A call of this thread, with what the driver asks of its caller.
    fn from_caller(c: &HostCall) -> Self {
        WireCall {
            nice: nvsim::caller::call_needs_nice(c).then(nvsim::caller::caller_has_nice),
            ..Self::from_call(c)
        }
    }

    /// Performs the call on `f` as its caller would (the driver's answer can depend on the
    /// caller's capabilities, `nvsim::caller`).
    fn perform(
        self,
        f: impl FnOnce(&mut HostCall) -> io::Result<i32>,
    ) -> (HostCall, io::Result<i32>) {
        let nice = self.nice;
        let mut call = self.into_call();
        let ret = match nice {
            Some(n) => nvsim::caller::with_caller_nice(n, || f(&mut call)),
            None => f(&mut call),
        };
        (call, ret)
    }

    /// Writes the driver's answer back into `c`: params and buffers keep their sizes (the
    /// driver writes in place), anything else is a protocol error.
    fn write_back(self, c: &mut HostCall) -> io::Result<()> {
        let bad = || io::Error::other("sim-driver answered a call of another shape");
        if self.params.len() != c.params.len() || self.nested.len() != c.nested.len() {
            return Err(bad());
        }
        for (mine, (_, _, data)) in c.nested.iter().zip(&self.nested) {
            if mine.data.len() != data.len() {
                return Err(bad());
            }
        }
        c.params = self.params.into();
        for (mine, (_, _, data)) in c.nested.iter_mut().zip(self.nested) {
            mine.data = data.into();
        }
        Ok(())
    }

    fn into_call(self) -> HostCall {
        HostCall {
            cmd: self.cmd,
            params: self.params.into(),
            nested: self
                .nested
                .into_iter()
                .map(|(parent, offset, data)| NestedBuf {
                    parent,
                    offset,
                    data: data.into(),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum Req {
    /// A new session (this connection is its anchor), or attach to one.
    Hello {
        session: Option<u64>,
    },
    Version,
    Open {
        node: WireNode,
        mapping: bool,
    },
    Ioctl {
        file: u64,
        call: WireCall,
    },
    /// `HostFile::ioctl_with_pages`: the pages' file comes with the frame.
    IoctlPages {
        file: u64,
        call: WireCall,
        len: u64,
        ptr_offset: u64,
    },
    MmapFd {
        file: u64,
    },
    Close {
        file: u64,
    },
    Stats,
}

#[derive(Debug, Serialize, Deserialize)]
enum Resp {
    Session(u64),
    Version(String),
    Opened {
        file: u64,
        id: i32,
    },
    Ioctl {
        ret: i32,
        call: WireCall,
    },
    /// The fd comes with the frame.
    Mmap {
        offset: u64,
    },
    Done,
    Stats([u64; 14]),
    Errno(i32),
}

fn stats_to_wire(s: &SimStats) -> [u64; 14] {
    [
        s.open_files as u64,
        s.live_clients as u64,
        s.live_objects as u64,
        s.os_events as u64,
        s.allocated_memory,
        s.attached_gpus as u64,
        s.uvm_va_spaces as u64,
        s.uvm_registered_gpus as u64,
        s.uvm_ranges as u64,
        s.mapping_files as u64,
        s.mmap_contexts as u64,
        s.cpu_mappings as u64,
        s.memfds as u64,
        0,
    ]
}

fn stats_from_wire(w: [u64; 14]) -> SimStats {
    let u = |i: usize| usize::try_from(w[i]).unwrap_or(usize::MAX);
    SimStats {
        open_files: u(0),
        live_clients: u(1),
        live_objects: u(2),
        os_events: u(3),
        allocated_memory: w[4],
        attached_gpus: u(5),
        uvm_va_spaces: u(6),
        uvm_registered_gpus: u(7),
        uvm_ranges: u(8),
        mapping_files: u(9),
        mmap_contexts: u(10),
        cpu_mappings: u(11),
        memfds: u(12),
    }
}

// ---------------------------------------------------------------- framing

/// The layout of the messages below; raised whenever `Req`, `Resp` or what they carry change.
pub const FRAME_VERSION: u16 = 3;

/// Why a frame of another version is refused.
fn version_error(got: u16) -> io::Error {
    let who = if got < FRAME_VERSION {
        "an older nvproxy build"
    } else {
        "a newer nvproxy build"
    };
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "sim-driver frame version {got} ({who}), this side speaks {FRAME_VERSION}: the \
             sim-driver process and the worker come from different builds; restart `nvproxy \
             serve` (it restarts the sim-driver) to bring them together"
        ),
    )
}

fn encode_frame<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    let mut frame = vec![0u8; 6];
    frame[4..6].copy_from_slice(&FRAME_VERSION.to_le_bytes());
    let frame = postcard::to_extend(msg, frame).map_err(io::Error::other)?;
    let len = frame.len() - 4;
    if len > MAX_FRAME {
        return Err(io::Error::other("frame too large"));
    }
    let len = u32::try_from(len).map_err(|_| io::Error::other("frame too large"))?;
    let mut frame = frame;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    Ok(frame)
}

fn send_frame<T: Serialize>(s: &UnixStream, msg: &T, fd: Option<RawFd>) -> io::Result<()> {
    let frame = encode_frame(msg)?;
    let mut w = s;
    match fd {
        None => w.write_all(&frame),
        Some(fd) => {
            crate::fdpass::send_all(s.as_fd(), &frame[..1], &[fd])?;
            w.write_all(&frame[1..])
        }
    }
}

/// Reads one frame; `want_fd`: the frame may carry an fd (returned).
fn recv_frame<T: for<'de> Deserialize<'de>>(
    s: &UnixStream,
    want_fd: bool,
) -> io::Result<Option<(T, Option<OwnedFd>)>> {
    let mut first = [0u8; 1];
    let fd = if want_fd {
        let (n, fd) = crate::fdpass::recv_with_fd(s.as_fd(), &mut first)?;
        if n == 0 {
            return Ok(None);
        }
        fd
    } else {
        let mut r = s;
        if r.read(&mut first)? == 0 {
            return Ok(None);
        }
        None
    };
    let mut rest = [0u8; 3];
    let mut r = s;
    r.read_exact(&mut rest)?;
    let len = u32::from_le_bytes([first[0], rest[0], rest[1], rest[2]]) as usize;
    if !(2..=MAX_FRAME).contains(&len) {
        return Err(io::Error::other(format!("frame of {len} bytes")));
    }
    let mut version = [0u8; 2];
    r.read_exact(&mut version)?;
    let version = u16::from_le_bytes(version);
    if version != FRAME_VERSION {
        return Err(version_error(version));
    }
    let mut body = vec![0u8; len - 2];
    r.read_exact(&mut body)?;
    let msg = postcard::from_bytes(&body).map_err(io::Error::other)?;
    Ok(Some((msg, fd)))
}

// ---------------------------------------------------------------- the server

/// The files of one session.
#[derive(Default)]
struct Session {
    files: HashMap<u64, Arc<dyn HostFile>>,
}

struct Server {
    sim: Arc<SimDriver>,
    sessions: Mutex<HashMap<u64, Session>>,
    next: AtomicU64,
}

/// Most files one session may hold (the kernel's per-process fd limit plays this part).
const MAX_SESSION_FILES: usize = 1 << 20;

impl Server {
    fn serve(self: &Arc<Self>, conn: UnixStream) {
        let session = match recv_frame::<Req>(&conn, false) {
            Ok(Some((Req::Hello { session }, _))) => session,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                tracing::error!(error = %e, "sim-driver: a client's frames refused");
                return;
            }
            _ => return,
        };
        let (id, anchor) = match session {
            None => {
                let id = self.next.fetch_add(1, Ordering::SeqCst);
                lock(&self.sessions).insert(id, Session::default());
                (id, true)
            }
            Some(id) if lock(&self.sessions).contains_key(&id) => (id, false),
            Some(_) => {
                let _ = send_frame(&conn, &Resp::Errno(libc::ESRCH), None);
                return;
            }
        };
        if send_frame(&conn, &Resp::Session(id), None).is_err() {
            return;
        }
        loop {
            // Any request may come with an fd; only IoctlPages keeps it (others close it).
            let (req, sent) = match recv_frame::<Req>(&conn, true) {
                Ok(Some(r)) => r,
                _ => break,
            };
            let (resp, fd) = match req {
                Req::IoctlPages {
                    file,
                    call,
                    len,
                    ptr_offset,
                } => (
                    self.ioctl_pages(id, file, call, len, ptr_offset, sent),
                    None,
                ),
                req => self.answer(id, req),
            };
            if send_frame(&conn, &resp, fd.as_ref().map(|f| f.as_raw_fd())).is_err() {
                break;
            }
        }
        if anchor {
            // The process is gone: its files close, as at exit.
            let gone = lock(&self.sessions).remove(&id);
            let n = gone.as_ref().map_or(0, |s| s.files.len());
            drop(gone);
            tracing::info!(
                session = id,
                files = n,
                "sim-driver: session ended; its files closed"
            );
        }
    }

    /// An ioctl whose pages are the file `sent` (OS-descriptor memory, `HostFile::ioctl_with_pages`).
    fn ioctl_pages(
        &self,
        session: u64,
        h: u64,
        call: WireCall,
        len: u64,
        ptr_offset: u64,
        sent: Option<OwnedFd>,
    ) -> Resp {
        let Some(fd) = sent else {
            return Resp::Errno(libc::EBADF);
        };
        let Some(f) = lock(&self.sessions)
            .get(&session)
            .and_then(|s| s.files.get(&h).cloned())
        else {
            return Resp::Errno(libc::EBADF);
        };
        let Ok(ptr_offset) = usize::try_from(ptr_offset) else {
            return Resp::Errno(libc::EINVAL);
        };
        let pages = host_driver::ClientPages {
            file: Arc::new(std::fs::File::from(fd)),
            len,
            ptr_offset,
        };
        let (call, ret) = call.perform(|c| f.ioctl_with_pages(c, &pages));
        match ret {
            Ok(ret) => Resp::Ioctl {
                ret,
                call: WireCall::from_call(&call),
            },
            Err(e) => Resp::Errno(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }

    fn answer(&self, session: u64, req: Req) -> (Resp, Option<OwnedFd>) {
        let errno = |e: io::Error| Resp::Errno(e.raw_os_error().unwrap_or(libc::EIO));
        let file = |f: u64| {
            lock(&self.sessions)
                .get(&session)
                .and_then(|s| s.files.get(&f).cloned())
        };
        match req {
            Req::Hello { .. } | Req::IoctlPages { .. } => (Resp::Errno(libc::EINVAL), None),
            Req::Version => (Resp::Version(self.sim.version().to_owned()), None),
            Req::Open { node, mapping } => {
                let opened = if mapping {
                    self.sim.open_mapping(node.into())
                } else {
                    self.sim.open(node.into())
                };
                match opened {
                    Ok(f) => {
                        let mut sessions = lock(&self.sessions);
                        let Some(s) = sessions.get_mut(&session) else {
                            return (Resp::Errno(libc::ESRCH), None);
                        };
                        if s.files.len() >= MAX_SESSION_FILES {
                            return (Resp::Errno(libc::EMFILE), None);
                        }
                        let handle = self.next.fetch_add(1, Ordering::SeqCst);
                        let id = f.id();
                        s.files.insert(handle, f);
                        (Resp::Opened { file: handle, id }, None)
                    }
                    Err(e) => (errno(e), None),
                }
            }
            Req::Ioctl { file: h, call } => match file(h) {
                None => (Resp::Errno(libc::EBADF), None),
                Some(f) => {
                    let (call, ret) = call.perform(|c| f.ioctl(c));
                    match ret {
                        Ok(ret) => (
                            Resp::Ioctl {
                                ret,
                                call: WireCall::from_call(&call),
                            },
                            None,
                        ),
                        Err(e) => (errno(e), None),
                    }
                }
            },
            Req::MmapFd { file: h } => match file(h) {
                None => (Resp::Errno(libc::EBADF), None),
                Some(f) => match f.mmap_fd() {
                    Ok((fd, offset)) => (Resp::Mmap { offset }, Some(fd)),
                    Err(e) => (errno(e), None),
                },
            },
            Req::Close { file: h } => {
                let f = lock(&self.sessions)
                    .get_mut(&session)
                    .and_then(|s| s.files.remove(&h));
                match f {
                    Some(f) => {
                        drop(f);
                        (Resp::Done, None)
                    }
                    None => (Resp::Errno(libc::EBADF), None),
                }
            }
            Req::Stats => (Resp::Stats(stats_to_wire(&self.sim.stats())), None),
        }
    }
}

/// `nvproxy sim-driver` options.
#[derive(Debug, clap::Args)]
pub struct SimDriverArgs {
    /// The socket to serve on.
    #[arg(long)]
    pub socket: PathBuf,
    /// Simulated GPUs.
    #[arg(long, default_value_t = 1)]
    pub gpus: u32,
    /// The driver version it reports.
    #[arg(long, default_value = nvproxy_config::DEFAULT_SIM_VERSION)]
    pub driver_version: String,
    /// Where its client-handle counter starts (the instance name).
    #[arg(long)]
    pub handle_key: Option<String>,
    /// A uid besides root (and our own) that may connect: the worker's own user.
    #[arg(long)]
    pub allow_uid: Option<u32>,
}

/// Runs `nvproxy sim-driver`.
pub fn run(args: &SimDriverArgs) -> Result<()> {
    crate::sys::block_termination_signals().context("blocking signals")?;
    let sim = sim_driver(args.gpus, &args.driver_version, args.handle_key.as_deref())?;
    serve(sim, &args.socket, args.allow_uid)
}

/// A simulated driver with `gpus` GPUs of `version` (`--sim-gpus`, `--sim-driver-version`);
/// `handle_key`: where its client-handle counter starts (`SimConfig::with_client_index_base`).
pub fn sim_driver(gpus: u32, version: &str, handle_key: Option<&str>) -> Result<Arc<SimDriver>> {
    let version: DriverVersion = version
        .parse()
        .map_err(|e| anyhow::anyhow!("--sim-driver-version: {e}"))?;
    nvproxy_abi::find(&version)
        .map_err(|e| anyhow::anyhow!("--sim-driver-version {version}: {e}"))?;
    if gpus == 0 || gpus > nvproxy_config::MAX_SIM_GPUS {
        bail!(
            "--sim-gpus {gpus}: the simulated driver has 1 to {} GPUs",
            nvproxy_config::MAX_SIM_GPUS
        );
    }
    let mut cfg = SimConfig::default_gpus(gpus as usize).with_version(version);
    if let Some(key) = handle_key {
        cfg = cfg.with_client_index_base(key);
    }
    let sim = SimDriver::try_new(cfg).map_err(|e| anyhow::anyhow!("simulated driver: {e}"))?;
    Ok(sim)
}

/// Serves `sim` on `socket` until SIGTERM/SIGINT/SIGHUP; prints `READY` once it listens.
/// `allow_uid`: a uid besides root and our own that may connect (the socket is given to it).
pub fn serve(sim: Arc<SimDriver>, socket: &Path, allow_uid: Option<u32>) -> Result<()> {
    let server = start(sim.clone(), socket, allow_uid)?;
    println!("READY");
    std::io::stdout().flush().ok();
    let sig = crate::sys::wait_for_termination().context("waiting for a signal")?;
    tracing::info!(signal = ?sig, stats = %sim.stats(), "sim-driver stopping");
    drop(server);
    let _ = std::fs::remove_file(socket);
    Ok(())
}

/// A listening sim-driver: serves until the process ends (the accept thread is detached).
pub struct Listening {
    _server: Arc<Server>,
}

/// Binds `socket` and serves `sim` on it from a thread of its own.
pub fn start(sim: Arc<SimDriver>, socket: &Path, allow_uid: Option<u32>) -> Result<Listening> {
    let _ = std::fs::remove_file(socket);
    let listener =
        UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    }
    if let Some(uid) = allow_uid {
        nix::unistd::chown(socket, Some(nix::unistd::Uid::from_raw(uid)), None)
            .with_context(|| format!("giving {} to uid {uid}", socket.display()))?;
    }
    let server = Arc::new(Server {
        sim,
        sessions: Mutex::new(HashMap::new()),
        next: AtomicU64::new(1),
    });
    let s2 = server.clone();
    std::thread::Builder::new()
        .name("sim-accept".into())
        .spawn(move || {
            use std::ops::ControlFlow;
            crate::listener::accept_loop(listener.as_fd(), Stop::Never, |turn| {
                let Ok(conn) = turn else {
                    return ControlFlow::Continue(());
                };
                let conn = UnixStream::from(conn);
                // Only root, our own user, or the worker's (the socket is 0600 as well).
                let me = nix::unistd::geteuid().as_raw();
                match nix::sys::socket::getsockopt(
                    &conn,
                    nix::sys::socket::sockopt::PeerCredentials,
                ) {
                    Ok(c) if c.uid() == 0 || c.uid() == me || Some(c.uid()) == allow_uid => {}
                    _ => return ControlFlow::Continue(()),
                }
                let s = s2.clone();
                let _ = std::thread::Builder::new()
                    .name("sim-conn".into())
                    .spawn(move || s.serve(conn));
                ControlFlow::Continue(())
            });
        })?;
    Ok(Listening { _server: server })
}

// ---------------------------------------------------------------- the client

struct Inner {
    path: PathBuf,
    session: u64,
    /// Held for the session's life: its close is the process's exit to the driver.
    _anchor: UnixStream,
    idle: Mutex<Vec<UnixStream>>,
    version: String,
}

impl Inner {
    fn call(&self, req: &Req, want_fd: bool) -> io::Result<(Resp, Option<OwnedFd>)> {
        self.call_with(req, None, want_fd)
    }

    /// [`Inner::call`] with `send` attached to the request.
    fn call_with(
        &self,
        req: &Req,
        send: Option<RawFd>,
        want_fd: bool,
    ) -> io::Result<(Resp, Option<OwnedFd>)> {
        let conn = match lock(&self.idle).pop() {
            Some(c) => c,
            None => {
                let c = UnixStream::connect(&self.path)?;
                send_frame(
                    &c,
                    &Req::Hello {
                        session: Some(self.session),
                    },
                    None,
                )?;
                match recv_frame::<Resp>(&c, false)? {
                    Some((Resp::Session(s), _)) if s == self.session => c,
                    _ => return Err(io::Error::other("sim-driver refused the session")),
                }
            }
        };
        send_frame(&conn, req, send)?;
        let (resp, fd) = recv_frame::<Resp>(&conn, want_fd)?
            .ok_or_else(|| io::Error::other("sim-driver closed"))?;
        lock(&self.idle).push(conn);
        Ok((resp, fd))
    }
}

fn unexpected(r: Resp) -> io::Error {
    match r {
        Resp::Errno(e) => io::Error::from_raw_os_error(e),
        other => io::Error::other(format!("unexpected sim-driver answer {other:?}")),
    }
}

/// The simulated driver of a `nvproxy sim-driver` process.
pub struct RemoteSim {
    inner: Arc<Inner>,
}

impl RemoteSim {
    /// Connects to the driver at `path` and opens a session.
    pub fn connect(path: &Path) -> Result<RemoteSim> {
        let anchor = UnixStream::connect(path)
            .with_context(|| format!("connecting to the sim-driver at {}", path.display()))?;
        send_frame(&anchor, &Req::Hello { session: None }, None)?;
        let session = match recv_frame::<Resp>(&anchor, false)? {
            Some((Resp::Session(s), _)) => s,
            // A driver of a build before versioned frames cannot read ours and hangs up.
            None => anyhow::bail!(
                "sim-driver {}: it closed the connection at hello (a sim-driver of an older \
                 nvproxy build, which refuses frame version {FRAME_VERSION}?); restart `nvproxy \
                 serve` (it restarts the sim-driver)",
                path.display()
            ),
            Some((other, _)) => {
                anyhow::bail!("sim-driver {}: no session ({other:?})", path.display())
            }
        };
        let mut inner = Inner {
            path: path.to_owned(),
            session,
            _anchor: anchor,
            idle: Mutex::new(Vec::new()),
            version: String::new(),
        };
        inner.version = match inner.call(&Req::Version, false)?.0 {
            Resp::Version(v) => v,
            other => return Err(unexpected(other).into()),
        };
        Ok(RemoteSim {
            inner: Arc::new(inner),
        })
    }

    /// Takes over the session another worker held (a live upgrade): `anchor` is a copy of
    /// its anchor connection, so the session lives as long as either process holds one; the
    /// files come with [`HostDriver::adopt`] by their handles.
    pub fn adopt_session(path: &Path, session: u64, anchor: OwnedFd) -> Result<RemoteSim> {
        let mut inner = Inner {
            path: path.to_owned(),
            session,
            _anchor: UnixStream::from(anchor),
            idle: Mutex::new(Vec::new()),
            version: String::new(),
        };
        inner.version = match inner.call(&Req::Version, false)?.0 {
            Resp::Version(v) => v,
            other => return Err(unexpected(other).into()),
        };
        Ok(RemoteSim {
            inner: Arc::new(inner),
        })
    }

    /// The session id and a copy of its anchor (for [`RemoteSim::adopt_session`]).
    pub fn hand_over_session(&self) -> io::Result<(u64, OwnedFd)> {
        Ok((self.inner.session, self.inner._anchor.try_clone()?.into()))
    }

    /// What the driver holds (all its sessions).
    pub fn stats(&self) -> io::Result<SimStats> {
        match self.inner.call(&Req::Stats, false)?.0 {
            Resp::Stats(w) => Ok(stats_from_wire(w)),
            other => Err(unexpected(other)),
        }
    }

    fn open_file(&self, node: NodeKind, mapping: bool) -> io::Result<Arc<dyn HostFile>> {
        let req = Req::Open {
            node: node.into(),
            mapping,
        };
        match self.inner.call(&req, false)?.0 {
            Resp::Opened { file, id } => Ok(Arc::new(RemoteFile {
                inner: self.inner.clone(),
                file,
                id,
                node,
            })),
            other => Err(unexpected(other)),
        }
    }
}

impl HostDriver for RemoteSim {
    fn version(&self) -> &str {
        &self.inner.version
    }

    fn open(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        self.open_file(node, false)
    }

    fn open_mapping(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        self.open_file(node, true)
    }

    /// The session: its id and a copy of its anchor connection.
    fn hand_over_driver(&self) -> io::Result<Option<host_driver::HandedFile>> {
        let (session, anchor) = self.hand_over_session()?;
        Ok(Some(host_driver::HandedFile {
            node: NodeKind::Ctl,
            fd: Some(anchor),
            token: session,
            id: 0,
            mapping: false,
        }))
    }

    /// A file of the adopted session, by its handle.
    fn adopt(&self, file: host_driver::HandedFile) -> io::Result<Arc<dyn HostFile>> {
        Ok(Arc::new(RemoteFile {
            inner: self.inner.clone(),
            file: file.token,
            id: file.id,
            node: file.node,
        }))
    }
}

struct RemoteFile {
    inner: Arc<Inner>,
    file: u64,
    id: i32,
    node: NodeKind,
}

impl std::fmt::Debug for RemoteFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteFile")
            .field("file", &self.file)
            .field("id", &format_args!("{:#x}", self.id))
            .finish()
    }
}

impl HostFile for RemoteFile {
    fn node(&self) -> NodeKind {
        self.node
    }

    fn id(&self) -> i32 {
        self.id
    }

    fn ioctl(&self, call: &mut HostCall) -> io::Result<i32> {
        let req = Req::Ioctl {
            file: self.file,
            call: WireCall::from_caller(call),
        };
        match self.inner.call(&req, false)?.0 {
            Resp::Ioctl { ret, call: out } => {
                out.write_back(call)?;
                Ok(ret)
            }
            other => Err(unexpected(other)),
        }
    }

    /// The pages' file travels with the request (`SCM_RIGHTS`); the driver process backs the
    /// memory object with it, as the in-process simulated driver does.
    fn ioctl_with_pages(
        &self,
        call: &mut HostCall,
        pages: &host_driver::ClientPages,
    ) -> io::Result<i32> {
        let req = Req::IoctlPages {
            file: self.file,
            call: WireCall::from_caller(call),
            len: pages.len,
            ptr_offset: pages.ptr_offset as u64,
        };
        match self
            .inner
            .call_with(&req, Some(pages.file.as_raw_fd()), false)?
            .0
        {
            Resp::Ioctl { ret, call: out } => {
                out.write_back(call)?;
                Ok(ret)
            }
            other => Err(unexpected(other)),
        }
    }

    /// Its handle in the session (which the new worker adopts).
    fn hand_over(&self) -> io::Result<host_driver::HandedFile> {
        Ok(host_driver::HandedFile {
            node: self.node,
            fd: None,
            token: self.file,
            id: self.id,
            mapping: false,
        })
    }

    fn mmap_fd(&self) -> io::Result<(OwnedFd, u64)> {
        match self.inner.call(&Req::MmapFd { file: self.file }, true)? {
            (Resp::Mmap { offset }, Some(fd)) => Ok((fd, offset)),
            (Resp::Mmap { .. }, None) => Err(io::Error::other("sim-driver sent no fd")),
            (other, _) => Err(unexpected(other)),
        }
    }
}

impl Drop for RemoteFile {
    fn drop(&mut self) {
        if let Err(e) = self.inner.call(&Req::Close { file: self.file }, false) {
            tracing::warn!(file = self.file, error = %e, "closing a sim-driver file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sim-driver serving in a test directory (removed with the last of the tuple).
    fn served(tag: &str) -> (Arc<SimDriver>, PathBuf, (Listening, test_kit::TestDir)) {
        let dir = test_kit::TestDir::new(&format!("simd-{tag}"));
        let sim = SimDriver::new(nvsim::SimConfig::default_gpus(2));
        let path = dir.path().join("sim.sock");
        let l = start(sim.clone(), &path, None).unwrap();
        (sim, path, (l, dir))
    }

    fn wait_for(mut f: impl FnMut() -> bool) -> bool {
        for _ in 0..250 {
            if f() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        f()
    }

    /// The driver grants RS_ACCESS_NICE from the calling thread's capabilities; a served call
    /// carries its caller's answer, which the driver process makes its own while it serves.
    #[test]
    fn test_a_served_call_carries_its_callers_nice_right() {
        let mut top = vec![0u8; size_of::<nvproxy_abi::structs::NVOS54_PARAMETERS>()];
        let set_level = 0xa06c_0107u32;
        top[8..12].copy_from_slice(&set_level.to_ne_bytes());
        let call = HostCall {
            cmd: nvproxy_abi::ioctl::NV_ESC_RM_CONTROL_CMD,
            params: top.into(),
            nested: Default::default(),
        };
        for nice in [false, true] {
            let w = nvsim::caller::with_caller_nice(nice, || WireCall::from_caller(&call));
            assert_eq!(w.nice, Some(nice));
            let (_, seen) = w.perform(|_| Ok(i32::from(nvsim::caller::caller_has_nice())));
            assert_eq!(seen.unwrap(), i32::from(nice));
        }
        // Other calls do not ask.
        let mut other = call.clone();
        other.params[8..12].copy_from_slice(&0xa06c_0103u32.to_ne_bytes());
        assert_eq!(WireCall::from_caller(&other).nice, None);
    }

    /// Issue 24, item 3: frames were bincode without a version, so a worker of one build
    /// and a driver process of another would decode each other's messages as something else.
    #[test]
    fn test_a_frame_of_another_version_is_refused_by_name() {
        let (a, b) = UnixStream::pair().unwrap();
        // The frame as this build writes it: read back whole.
        send_frame(&a, &Req::Hello { session: Some(7) }, None).unwrap();
        match recv_frame::<Req>(&b, false).unwrap() {
            Some((Req::Hello { session: Some(7) }, None)) => {}
            other => panic!("{other:?}"),
        }
        // Another version, and an unversioned frame of an earlier build (bincode: a u32
        // variant index first, read as version 0).
        for (version, who) in [(1u16, "an older"), (9, "a newer"), (0, "an older")] {
            let mut frame = encode_frame(&Req::Stats).unwrap();
            frame[4..6].copy_from_slice(&version.to_le_bytes());
            (&a).write_all(&frame).unwrap();
            let err = recv_frame::<Req>(&b, false).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData);
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("frame version {version} ({who} nvproxy build)"))
                    && msg.contains(&format!("this side speaks {FRAME_VERSION}")),
                "{msg}"
            );
            // The rest of the refused frame is not read as a message: drain it.
            let mut rest = vec![0u8; frame.len() - 6];
            (&b).read_exact(&mut rest).unwrap();
        }
    }

    /// The driver hangs up on a client of another frame version, which says why.
    #[test]
    fn test_the_driver_refuses_a_client_of_another_frame_version() {
        let (sim, path, _l) = served("version");
        let c = UnixStream::connect(&path).unwrap();
        let mut frame = encode_frame(&Req::Hello { session: None }).unwrap();
        frame[4..6].copy_from_slice(&1u16.to_le_bytes());
        (&c).write_all(&frame).unwrap();
        // No answer: a hang-up (a reset, as the refused frame's body was never read).
        match recv_frame::<Resp>(&c, false) {
            Ok(None) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!("an answer to a refused client: {other:?}"),
        }
        assert_eq!(sim.stats().open_files, 0);
        // A current client is served as before.
        RemoteSim::connect(&path).unwrap();
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn test_a_proxy_runs_on_the_remote_driver_and_a_gone_session_closes_its_files() {
        let (sim, path, _l) = served("proxy");
        let remote = Arc::new(RemoteSim::connect(&path).unwrap());
        assert_eq!(remote.version(), sim.version());
        // The proxy's construction asks NV_ESC_CARD_INFO through the socket.
        let proxy = ioctl_proxy::Proxy::for_host(
            ioctl_proxy::InstancePolicy::new("a", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![1]),
            remote.clone() as Arc<dyn HostDriver>,
        )
        .unwrap();
        let ctl = remote.open(NodeKind::Ctl).unwrap();
        let gpu = remote.open(NodeKind::Gpu(1)).unwrap();
        assert_eq!(gpu.node(), NodeKind::Gpu(1));
        assert_ne!(ctl.id(), gpu.id());
        let err = remote.open(NodeKind::Gpu(7)).unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(libc::ENODEV),
            "the driver's errno, carried"
        );
        assert!(sim.stats().open_files >= 2);
        assert_eq!(remote.stats().unwrap(), sim.stats());
        // A file without an mmap context: the driver's EINVAL, carried.
        assert_eq!(
            ctl.mmap_fd().unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        drop((gpu, ctl, proxy, remote));
        assert!(wait_for(|| sim.stats().open_files == 0), "{}", sim.stats());

        // A worker that dies holding files (no Close for them): when its session's anchor
        // closes, the driver closes what the session held, whichever connection opened it.
        let anchor = UnixStream::connect(&path).unwrap();
        send_frame(&anchor, &Req::Hello { session: None }, None).unwrap();
        let Some((Resp::Session(id), _)) = recv_frame::<Resp>(&anchor, false).unwrap() else {
            panic!("no session");
        };
        let other = UnixStream::connect(&path).unwrap();
        send_frame(&other, &Req::Hello { session: Some(id) }, None).unwrap();
        recv_frame::<Resp>(&other, false).unwrap();
        for node in [WireNode::Ctl, WireNode::Gpu(0)] {
            send_frame(
                &other,
                &Req::Open {
                    node,
                    mapping: false,
                },
                None,
            )
            .unwrap();
            let r = recv_frame::<Resp>(&other, false).unwrap();
            assert!(matches!(r, Some((Resp::Opened { .. }, _))), "{r:?}");
        }
        assert_eq!(sim.stats().open_files, 2);
        drop(other);
        assert_eq!(
            sim.stats().open_files,
            2,
            "an attached connection is not the process"
        );
        drop(anchor);
        assert!(
            wait_for(|| sim.stats().open_files == 0),
            "files outlived their session: {}",
            sim.stats()
        );
    }

    #[test]
    fn test_a_made_up_session_or_file_is_refused() {
        let (_sim, path, _l) = served("forged");
        let c = UnixStream::connect(&path).unwrap();
        send_frame(&c, &Req::Hello { session: Some(999) }, None).unwrap();
        assert!(matches!(
            recv_frame::<Resp>(&c, false).unwrap(),
            Some((Resp::Errno(libc::ESRCH), _))
        ));
        let remote = RemoteSim::connect(&path).unwrap();
        let (resp, _) = remote
            .inner
            .call(&Req::Close { file: 123_456 }, false)
            .unwrap();
        assert!(matches!(resp, Resp::Errno(libc::EBADF)), "{resp:?}");
        // A frame above the bound is refused before it is read.
        let c = UnixStream::connect(&path).unwrap();
        (&c).write_all(&(u32::MAX).to_le_bytes()).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!((&c).read(&mut buf).unwrap(), 0, "the server hangs up");
    }
}
