//! An instance's CUSE nodes: one session per node, registered as
//! `/dev/nvproxy/<instance>/<node>` and checked to be ours before anyone is told about them.

use std::fs::OpenOptions;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cuse_dev::{
    CuseError, DeviceConfig, InitInfo, PendingRetry, Session, SessionControl, Suspended,
};

use crate::device::{Backend, Node, NodeDevice};
use crate::fdid::FdIdentity;
use crate::mmap::InstanceMmap;
use nvproxy_config::MemoryTransport;

/// How long registration and the self-check may take (the VM's emulated CPU is slow).
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// One served node: its CUSE session's thread.
struct Served {
    node: Node,
    path: PathBuf,
    cfg: DeviceConfig,
    handler: Arc<NodeDevice>,
    control: SessionControl,
    thread: Option<JoinHandle<Result<Option<Suspended>, CuseError>>>,
}

/// A node whose session was suspended ([`InstanceNodes::suspend`]): its channel (the kernel's
/// device and open files stay), what `CUSE_INIT` settled and the retry rounds in progress.
#[derive(Debug)]
pub struct SuspendedNode {
    /// The node.
    pub node: Node,
    /// The `/dev/cuse` channel.
    pub channel: std::os::fd::OwnedFd,
    /// `CUSE_INIT`'s outcome.
    pub init: InitInfo,
    /// Retry rounds in progress.
    pub retries: Vec<PendingRetry>,
}

fn node_config(instance: &str, node: Node, transport: MemoryTransport) -> DeviceConfig {
    let devname = format!("nvproxy/{instance}/{}", node.dev_name());
    let mut cfg = DeviceConfig::new(devname);
    cfg.unrestricted_ioctl = crate::device::unrestricted_ioctls(node, transport);
    cfg.max_workers = 128;
    // Its tenant-caused log lines share the instance's limit (`ratelimit.rs`).
    cfg.log_key = instance.to_owned();
    cfg
}

fn spawn_session(
    node: Node,
    session: Session,
    handler: Arc<NodeDevice>,
) -> std::io::Result<JoinHandle<Result<Option<Suspended>, CuseError>>> {
    // Every serving thread gives up CAP_SYS_ADMIN before its first request; the handlers
    // check again and refuse requests on a thread where that failed.
    let session = session.on_thread_start(|| {
        let _ = crate::device::drop_admin_on_this_thread();
    });
    let handler: Arc<dyn cuse_dev::Handler> = handler;
    std::thread::Builder::new()
        .name(format!("cuse-{}", node.dev_name()))
        .spawn(move || session.run_handover(handler))
}

/// A running instance's devices.
pub struct InstanceNodes {
    nodes: Vec<Served>,
}

/// Where an instance's node lives on the host.
pub fn node_path(instance: &str, node: Node) -> PathBuf {
    Path::new("/dev/nvproxy")
        .join(instance)
        .join(node.dev_name())
}

impl InstanceNodes {
    /// Registers `nvidiactl` and `nvidia0..gpus-1` for `instance`, serving them with
    /// `backend`, and `nvidia-uvm` served by `uvm` (if given), and checks each node is ours
    /// (it answers our identify ioctl; a worker that may not open it, running under its own
    /// uid, compares its device number with the kernel's record of the CUSE device instead).
    /// `channels`: `/dev/cuse` files opened for us (by the supervisor, for a worker that runs
    /// under its own uid and cannot open `/dev/cuse`), one per node in that order; the nodes
    /// past them open their own.
    // Eight inputs, each one thing the nodes need; a struct for them would only be a bag.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        instance: &str,
        gpus: u32,
        backend: Arc<dyn Backend>,
        uvm: Option<Arc<dyn Backend>>,
        fdid: Arc<FdIdentity>,
        transport: MemoryTransport,
        mmap: Arc<InstanceMmap>,
        channels: Vec<std::os::fd::OwnedFd>,
    ) -> Result<InstanceNodes> {
        let mut this = InstanceNodes { nodes: Vec::new() };
        let mut channels = channels.into_iter();
        let wanted = std::iter::once(Node::Ctl)
            .chain((0..gpus).map(Node::Gpu))
            .chain(uvm.is_some().then_some(Node::Uvm));
        for (index, node) in wanted.enumerate() {
            let path = node_path(instance, node);
            let cfg = node_config(instance, node, transport);
            let devname = cfg.devname.clone();
            let opened = match channels.next() {
                Some(fd) => Session::from_fd(fd, cfg.clone()),
                None => Session::open(cfg.clone()),
            };
            let session = opened.map_err(|e| {
                let advice = match crate::advice::cuse_state() {
                    crate::advice::CuseState::Present => {
                        "opening it needs root (`nvproxy doctor` checks the host)".to_owned()
                    }
                    state => {
                        let line = crate::advice::this_command_line();
                        let what = if crate::advice::user_subcommand().as_deref() == Some("exec") {
                            crate::advice::CuseUse::SelfContained(&line)
                        } else {
                            crate::advice::CuseUse::ServeAndRun
                        };
                        crate::advice::cuse_advice(&state, &what)
                    }
                };
                anyhow::anyhow!(
                    "registering the CUSE node {devname}: {:#}; {advice}",
                    anyhow::Error::from(e)
                )
            })?;
            let control = session.control();
            let node_backend = match (node, &uvm) {
                (Node::Uvm, Some(u)) => u.clone(),
                _ => backend.clone(),
            };
            let handler = Arc::new(NodeDevice::new(
                node,
                node_backend,
                fdid.clone(),
                transport,
                mmap.clone(),
            ));
            let thread = spawn_session(node, session, handler.clone())?;
            this.nodes.push(Served {
                node,
                path: path.clone(),
                cfg,
                handler,
                control: control.clone(),
                thread: Some(thread),
            });
            if control.wait_init(START_TIMEOUT).is_none() {
                bail!("{devname}: the kernel did not finish CUSE_INIT within {START_TIMEOUT:?}");
            }
            let rdev = self_check(&path, &devname, &fdid).with_context(|| {
                format!("{devname}: the node is not ours (name or number taken?)")
            })?;
            fdid.add_device(rdev, index);
            tracing::info!(instance, node = %path.display(), rdev = format_args!("{}:{}", libc::major(rdev), libc::minor(rdev)), "node ready");
        }
        Ok(this)
    }

    /// Serves nodes another worker suspended (a live upgrade): the same devices, open files
    /// and queued requests; `fdid` must know their device numbers already.
    #[allow(clippy::too_many_arguments)]
    pub fn resume(
        instance: &str,
        suspended: Vec<SuspendedNode>,
        backend: Arc<dyn Backend>,
        uvm: Option<Arc<dyn Backend>>,
        fdid: Arc<FdIdentity>,
        transport: MemoryTransport,
        mmap: Arc<InstanceMmap>,
    ) -> Result<InstanceNodes> {
        let mut this = InstanceNodes { nodes: Vec::new() };
        for s in suspended {
            let node = s.node;
            let cfg = node_config(instance, node, transport);
            let node_backend = match (node, &uvm) {
                (Node::Uvm, Some(u)) => u.clone(),
                (Node::Uvm, None) => bail!("a UVM node without a UVM backend"),
                _ => backend.clone(),
            };
            let handler = Arc::new(NodeDevice::new(
                node,
                node_backend,
                fdid.clone(),
                transport,
                mmap.clone(),
            ));
            let session = Session::resume(s.channel, cfg.clone(), s.init, s.retries)
                .with_context(|| format!("resuming {}", cfg.devname))?;
            let control = session.control();
            let thread = spawn_session(node, session, handler.clone())?;
            this.nodes.push(Served {
                node,
                path: node_path(instance, node),
                cfg,
                handler,
                control,
                thread: Some(thread),
            });
        }
        Ok(this)
    }

    /// Stops reading every node and waits for the running handlers' replies: requests that
    /// arrive meanwhile wait in the kernel. Returns the suspended sessions (for
    /// [`InstanceNodes::resume`] elsewhere, or [`InstanceNodes::resume_here`]). When one node
    /// cannot be suspended, the others are served again here and the error is returned.
    pub fn suspend(&mut self) -> Result<Vec<SuspendedNode>> {
        for n in &self.nodes {
            n.control.suspend();
        }
        let mut done = Vec::new();
        let mut failed = None;
        for n in &mut self.nodes {
            let Some(t) = n.thread.take() else {
                failed.get_or_insert_with(|| format!("{}: not served", n.path.display()));
                continue;
            };
            match t.join() {
                Ok(Ok(Some(s))) => done.push(SuspendedNode {
                    node: n.node,
                    channel: s.channel,
                    init: s.init,
                    retries: s.retries,
                }),
                Ok(Ok(None)) => {
                    failed
                        .get_or_insert_with(|| format!("{}: the session ended", n.path.display()));
                }
                Ok(Err(e)) => {
                    failed.get_or_insert_with(|| format!("{}: {e}", n.path.display()));
                }
                Err(_) => {
                    failed.get_or_insert_with(|| {
                        format!("{}: session thread panicked", n.path.display())
                    });
                }
            }
        }
        if let Some(why) = failed {
            if let Err(e) = self.resume_here(done) {
                tracing::error!(error = %format!("{e:#}"), "a node could not be served again after a failed suspension");
            }
            bail!("suspending the nodes: {why}");
        }
        Ok(done)
    }

    /// Serves suspended nodes again in this process (a handover that did not complete).
    pub fn resume_here(&mut self, suspended: Vec<SuspendedNode>) -> Result<()> {
        for s in suspended {
            let Some(n) = self.nodes.iter_mut().find(|n| n.node == s.node) else {
                bail!("node {} is not this instance's", s.node.dev_name());
            };
            let session = Session::resume(s.channel, n.cfg.clone(), s.init, s.retries)
                .with_context(|| format!("resuming {}", n.cfg.devname))?;
            n.control = session.control();
            n.thread = Some(spawn_session(n.node, session, n.handler.clone())?);
        }
        Ok(())
    }

    /// Unregisters every node (clients still holding one get ENOTCONN).
    pub fn stop(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        for n in &self.nodes {
            n.control.stop();
        }
        for n in &mut self.nodes {
            if let Some(t) = n.thread.take() {
                match t.join() {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(node = %n.path.display(), error = %e, "session ended with an error")
                    }
                    Err(_) => tracing::error!(node = %n.path.display(), "session thread panicked"),
                }
            }
        }
    }
}

impl Drop for InstanceNodes {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Opens the node, checks it answers our secret, and returns its device number. A worker
/// under its own uid may not open the node (devtmpfs makes it root's, mode 0600): then the
/// node's device number must be the one the kernel gave our CUSE device `devname`
/// (`/sys/class/cuse/<devname, '/' as '!'>/dev`; CUSE refuses a second device of a name, so
/// the number is ours).
fn self_check(path: &Path, devname: &str, fdid: &FdIdentity) -> Result<u64> {
    let deadline = Instant::now() + START_TIMEOUT;
    let file = loop {
        match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => break f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            // EACCES (file mode) for a worker that is not root; EPERM (a device cgroup, say)
            // stays an error.
            Err(e)
                if e.raw_os_error() == Some(libc::EACCES) && !nix::unistd::geteuid().is_root() =>
            {
                return rdev_matches_cuse_record(path, devname);
            }
            Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
        }
    };
    let rdev = file.metadata()?.rdev();
    fdid.identify(&file).context("identify ioctl")?;
    Ok(rdev)
}

fn rdev_matches_cuse_record(path: &Path, devname: &str) -> Result<u64> {
    let (is_char, rdev) =
        crate::host::stat_node(path).with_context(|| format!("stat {}", path.display()))?;
    let record = Path::new("/sys/class/cuse")
        .join(devname.replace('/', "!"))
        .join("dev");
    let text = std::fs::read_to_string(&record)
        .with_context(|| format!("reading {}", record.display()))?;
    let (maj, min) = text
        .trim()
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .with_context(|| format!("{}: {:?} is not MAJOR:MINOR", record.display(), text.trim()))?;
    if !is_char || rdev != libc::makedev(maj, min) {
        bail!(
            "{} is not the character device {maj}:{min} the kernel registered for {devname}",
            path.display()
        );
    }
    Ok(rdev)
}
