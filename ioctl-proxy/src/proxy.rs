//! [`Proxy`]: one instance's request path for `/dev/nvidiactl` and `/dev/nvidia<N>`.
//!
//! Every client `open()` of a frontend node gets its own host file ([`Proxy::open`]); every
//! ioctl on it goes through [`Proxy::ioctl`], which decodes it with the driver version's ABI
//! table, applies the instance's policy, checks every handle against the instance's
//! [`ObjectTable`], translates fd fields through the daemon's [`FdResolver`] and pointer fields
//! into daemon buffers, calls the host, post-processes outputs (GPU lists filtered to the
//! instance), copies results back and records an audit event.
//!
//! # Client memory and retries
//!
//! Each call first reads everything it needs and declares everything it will write
//! ([`ClientMemory::reserve_write`](crate::memory::ClientMemory::reserve_write)); only then does it touch the host or the object table. A
//! [`MemError::Pending`](crate::MemError::Pending) anywhere before that point makes
//! [`Proxy::ioctl`] return [`ProxyError::Pending`] with no side effect, and the transport re-runs
//! the call once it has the data.
//!
//! # Concurrency
//!
//! `Proxy` is `Send + Sync`; calls run concurrently. The object table sits behind one mutex that
//! is never held across a host ioctl. Calls that create or destroy RM objects (allocs, frees,
//! dups, imports) additionally hold the *RM mutation lock* across their host ioctl and table
//! update, so the table sees those changes in the driver's order (a handle freed and re-used by
//! two threads cannot be recorded in the wrong order). The driver serialises the same calls under
//! its RM API write lock, so this costs no parallelism the driver would have given. Controls and
//! the other escapes run without it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use nvproxy_abi::{ClassSpec, ControlSpec, DriverAbi, DriverVersion};
use tracing::debug;

use crate::audit::{AuditCounts, AuditEvent, AuditSink, Decision, Kind, NullSink};
use crate::error::ProxyError;
use crate::hash::WordHash;
use crate::hostctl::host_cards;
use crate::kit::Note;
use crate::mapping_slot::MappingSlot;
use crate::objects::{ObjectTable, OwnerId};
use crate::policy::InstancePolicy;
use host_driver::{HostDriver, HostFile, NodeKind};

/// Identifies one client open of a frontend node (the owner of the RM clients allocated
/// through it).
pub type OpenId = OwnerId;

/// A node of an instance as the tenant sees it (tenant numbering: `Gpu(0)` is the tenant's
/// first GPU, whatever its host minor, [`host_driver::NodeKind`]). The one node type of the
/// request path and the daemon; [`Proxy`] serves `Ctl` and `Gpu`, the `uvm` crate `Uvm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Node {
    /// `/dev/nvidiactl`.
    Ctl,
    /// `/dev/nvidia<N>`: the tenant's N-th GPU (index into [`InstancePolicy::gpus`]).
    Gpu(u32),
    /// `/dev/nvidia-uvm`.
    Uvm,
}

/// The frontend nodes' name of [`Node`] (`Ctl` and `Gpu`).
pub type FrontendNode = Node;

impl Node {
    /// The node's name under `/dev`.
    pub fn dev_name(self) -> String {
        match self {
            Node::Ctl => "nvidiactl".to_owned(),
            Node::Gpu(i) => format!("nvidia{i}"),
            Node::Uvm => "nvidia-uvm".to_owned(),
        }
    }

    /// The node of a [`Display`](fmt::Display) name (`ctl`, `gpu0`, `uvm`).
    pub fn parse(s: &str) -> Option<Node> {
        match s {
            "ctl" => Some(Node::Ctl),
            "uvm" => Some(Node::Uvm),
            _ => s
                .strip_prefix("gpu")
                .filter(|n| !n.starts_with('+'))
                .and_then(|n| n.parse().ok())
                .map(Node::Gpu),
        }
    }
}

impl fmt::Display for Node {
    /// The audit trail's name: `ctl`, `gpu0`, `uvm`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ctl => f.write_str("ctl"),
            Self::Gpu(i) => write!(f, "gpu{i}"),
            Self::Uvm => f.write_str("uvm"),
        }
    }
}

/// The calling thread, as the FUSE header names it (in the daemon's pid namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caller {
    /// Thread group id; 0: not looked up yet (it is only needed for an audit event, and is
    /// then read from `/proc/<tid>/status`, [`Caller::process`]).
    pub pid: u32,
    /// Thread id (the FUSE header's pid).
    pub tid: u32,
    /// When the request reached the daemon ([`service::monotonic_ns`](crate::service::monotonic_ns)),
    /// for the latency an audit event records; `None`: from the request path's entry. The
    /// transports time every request already, so they pass their start instead of the request
    /// path reading the clock again.
    pub since: Option<u64>,
}

impl Caller {
    /// The calling thread's process: `pid`, or when it was not given, the `Tgid` of
    /// `/proc/<tid>/status` (the thread itself when that cannot be read: it exited).
    pub fn process(&self) -> u32 {
        if self.pid != 0 {
            return self.pid;
        }
        std::fs::read_to_string(format!("/proc/{}/status", self.tid))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Tgid:"))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(self.tid)
    }
}

/// Why an fd number of the caller could not be resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdError {
    /// The fd is not an open of one of *this instance's* nodes: another file, another
    /// instance's node, a closed or negative fd.
    Foreign,
    /// Resolution itself failed (the thread exited, no memory, ...): this errno is returned.
    Errno(i32),
}

impl FdError {
    /// The errno for an fd field whose failure the driver reports as an errno: `EBADF` for a
    /// foreign fd.
    pub fn errno(self) -> i32 {
        match self {
            Self::Foreign => libc::EBADF,
            Self::Errno(e) => e,
        }
    }
}

/// Resolves fd numbers of the calling thread to this instance's opens. The daemon implements
/// it kernel-side (`pidfd_getfd` on the calling thread, `fstat`, the private identify ioctl;
/// DESIGN.md section 3 step 5), never by trusting the client. One resolver serves one call.
pub trait FdResolver {
    /// The open that fd `fd` of the calling thread refers to.
    fn resolve(&self, fd: i32) -> Result<OpenId, FdError>;
}

/// An instance GPU: host minor number and the driver's GPU id (`nv_ioctl_card_info_t.gpu_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuInfo {
    /// Host minor (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// The driver's GPU id, as NV0000 GPU controls name it.
    pub gpu_id: u32,
    /// PCI domain, bus and slot (device) from the host's `NV_ESC_CARD_INFO`.
    pub pci: (u32, u8, u8),
}

/// One client open of a frontend node (the frontend's [`NodeService::File`](crate::service::NodeService::File)).
#[derive(Debug)]
pub struct OpenFile {
    pub(crate) node: FrontendNode,
    pub(crate) host: Arc<dyn HostFile>,
    /// The open's mapping host file and its mmap context (`mapping.rs`).
    pub(crate) mapping: Mutex<MappingSlot>,
    /// What replay needs besides the objects (`checkpoint.rs`).
    pub(crate) record: Mutex<OpenRecord>,
}

/// Most OS events recorded per open; past it the open is unreplayable (the driver has no
/// bound of its own, the record must have one).
pub(crate) const MAX_OS_EVENTS_PER_OPEN: usize = 1024;

/// The per-open state a replay re-creates: `REGISTER_FD`, `ATTACH_GPUS_TO_FD`, OS events.
#[derive(Debug, Default, Clone)]
pub(crate) struct OpenRecord {
    /// The control open this open was registered to with `NV_ESC_REGISTER_FD`.
    pub(crate) registered_ctl: Option<OpenId>,
    /// How many opens registered this one and are not released yet (`Proxy::release`: while
    /// any are, its release only makes it linger). Not saved: rebuilt from `registered_ctl`.
    pub(crate) holders: u32,
    /// GPU ids attached with `NV_ESC_ATTACH_GPUS_TO_FD` (host ids, zeros dropped).
    pub(crate) attached: Option<Vec<u32>>,
    /// OS events registered on this open: (hClient, hDevice, the open the fd named).
    pub(crate) os_events: Vec<(u32, u32, OpenId)>,
    /// More OS events than [`MAX_OS_EVENTS_PER_OPEN`] were registered.
    pub(crate) os_events_overflow: bool,
}

/// Client handle translation (empty unless a restore needed it).
#[derive(Debug, Default)]
pub(crate) struct ClientMap {
    pub(crate) to_host: BTreeMap<u32, u32>,
    pub(crate) to_tenant: BTreeMap<u32, u32>,
}

/// Most distinct DMA mappings tracked; past it `overflow` makes a save refuse.
const MAX_DMA_MAPS: usize = 4096;

/// Live DMA mappings (counts per key), bounded.
#[derive(Debug, Default)]
pub(crate) struct DmaMaps {
    pub(crate) live: BTreeMap<(u32, u32, u32), u32>,
    pub(crate) overflow: bool,
}

/// A request in progress; dropping it leaves the instance's in-flight count.
#[derive(Debug)]
pub struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One instance's frontend proxy.
pub struct Proxy {
    pub(crate) abi: DriverAbi,
    /// `abi`'s controls and classes by number, hashed: the request path looks one up per
    /// control or allocation, where a B-tree search of a version's ~200 controls costs ~90
    /// instructions (callgrind). Built from `abi` and never changed: a tenant's number only probes the table's own keys
    /// (nothing to flood, so [`WordHash`] serves).
    pub(crate) controls: HashMap<u32, ControlSpec, WordHash>,
    pub(crate) classes: HashMap<u32, ClassSpec, WordHash>,
    pub(crate) policy: InstancePolicy,
    pub(crate) host: Arc<dyn HostDriver>,
    pub(crate) gpus: Vec<GpuInfo>,
    pub(crate) opens: Mutex<HashMap<OpenId, Arc<OpenFile>, WordHash>>,
    /// Control opens the tenant closed while another open's `NV_ESC_REGISTER_FD` names them:
    /// the driver holds such a file (`nv_get_file_private` keeps its reference until the
    /// registering file is closed, `escape.c`), and with it the RM clients allocated on it, so
    /// the books keep them too ([`Proxy::release`]). Each keeps its open-file slot. Locked
    /// after `opens`.
    pub(crate) lingering: Mutex<BTreeMap<OpenId, Arc<OpenFile>>>,
    pub(crate) next_open: AtomicU64,
    /// Opens of all the instance's nodes (frontend and UVM), against `quotas.open_files`.
    pub(crate) open_files: AtomicUsize,
    /// Requests in progress (frontend and UVM), against `quotas.in_flight`.
    in_flight: AtomicUsize,
    pub(crate) objects: Mutex<ObjectTable>,
    rm_lock: Mutex<()>,
    /// Device instance → GPU id, learned from `NV0000_CTRL_CMD_GPU_GET_ID_INFO(_V2)` replies.
    pub(crate) devices: Mutex<BTreeMap<u32, u32>>,
    /// Live `RM_MAP_MEMORY_DMA` mappings by (client, hDma, hMemory): driver state a replay
    /// does not re-create, so a save refuses while any exist (`checkpoint.rs`).
    pub(crate) dma_maps: Mutex<DmaMaps>,
    /// Client handles the tenant knows that the driver knows by another handle (a restore
    /// found the tenant's handle taken on the host): tenant → host and back.
    pub(crate) clients_map: Mutex<ClientMap>,
    audit: Arc<dyn AuditSink>,
    pub(crate) counts: AuditCounts,
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("instance", &self.policy.name)
            .field("gpus", &self.gpus)
            .finish_non_exhaustive()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The replay record of an open.
pub(crate) fn lock_record(f: &OpenFile) -> MutexGuard<'_, OpenRecord> {
    lock(&f.record)
}

impl Proxy {
    /// A proxy for one instance. Opens a host control file once to learn, from the host's
    /// `NV_ESC_CARD_INFO`, the GPU id of each of the instance's GPUs; fails if the host has no
    /// GPU with one of the instance's minors.
    pub fn new(
        abi: DriverAbi,
        policy: InstancePolicy,
        host: Arc<dyn HostDriver>,
    ) -> Result<Self, ProxyError> {
        let ctl = host.open(NodeKind::Ctl).map_err(ProxyError::Host)?;
        let cards = host_cards(&*ctl)?;
        let mut gpus = Vec::with_capacity(policy.gpus.len());
        for &minor in &policy.gpus {
            let card = cards
                .iter()
                .find(|c| c.minor_number == minor)
                .ok_or_else(|| ProxyError::Config(format!("host has no GPU /dev/nvidia{minor}")))?;
            if gpus.iter().any(|g: &GpuInfo| g.minor == minor) {
                return Err(ProxyError::Config(format!("GPU {minor} listed twice")));
            }
            gpus.push(GpuInfo {
                minor,
                gpu_id: card.gpu_id,
                pci: (card.pci_info.domain, card.pci_info.bus, card.pci_info.slot),
            });
        }
        let counts = AuditCounts::for_names(
            abi.escapes
                .values()
                .map(|e| (Kind::Escape, e.name))
                .chain(abi.controls.values().map(|c| (Kind::Control, c.name)))
                .chain(abi.classes.values().map(|c| (Kind::Class, c.name)))
                .chain(abi.uvm.values().map(|u| (Kind::Uvm, u.name)))
                .chain(std::iter::once((Kind::Uvm, "mmap"))),
        );
        Ok(Self {
            controls: abi.controls.iter().map(|(&k, &v)| (k, v)).collect(),
            classes: abi.classes.iter().map(|(&k, &v)| (k, v)).collect(),
            abi,
            policy,
            host,
            gpus,
            opens: Mutex::new(HashMap::default()),
            lingering: Mutex::default(),
            next_open: AtomicU64::new(1),
            open_files: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            objects: Mutex::new(ObjectTable::new()),
            rm_lock: Mutex::new(()),
            devices: Mutex::new(BTreeMap::new()),
            dma_maps: Mutex::default(),
            clients_map: Mutex::default(),
            audit: Arc::new(NullSink),
            counts,
        })
    }

    /// A proxy using the ABI table of the host driver's own version (exact match required).
    pub fn for_host(policy: InstancePolicy, host: Arc<dyn HostDriver>) -> Result<Self, ProxyError> {
        let version: DriverVersion = host.version().trim().parse()?;
        let abi = nvproxy_abi::find(&version)?.tables();
        Self::new(abi, policy, host)
    }

    /// Sends audit events to `sink` (the default drops them).
    pub fn with_audit(mut self, sink: Arc<dyn AuditSink>) -> Self {
        self.audit = sink;
        self
    }

    /// The instance's policy.
    pub fn policy(&self) -> &InstancePolicy {
        &self.policy
    }

    /// The ABI tables in use.
    pub fn abi(&self) -> &DriverAbi {
        &self.abi
    }

    /// The instance's GPUs in the tenant's order.
    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    /// Calls per entry and decision so far.
    pub fn counts(&self) -> &AuditCounts {
        &self.counts
    }

    /// Takes one of the instance's open-file slots (`quotas.open_files`), for an open of any
    /// of its nodes; [`Proxy::release_open_slot`] gives it back.
    pub fn take_open_slot(&self) -> Result<(), ProxyError> {
        let limit = self.policy.quotas.open_files;
        self.open_files
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| ProxyError::OpenQuota {
                instance: self.policy.name.clone(),
                limit,
            })
    }

    /// Gives back an open-file slot.
    pub fn release_open_slot(&self) {
        let _ = self
            .open_files
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Open files of the instance's nodes now.
    pub fn open_files(&self) -> usize {
        self.open_files.load(Ordering::Acquire)
    }

    /// Whether the calling request is the instance's only one in flight (it entered with
    /// [`Proxy::enter_request`]). RM_ALLOC and RM_FREE answer before they keep the object
    /// table's books only then: that order holds the table's lock and the RM lock across the
    /// answer, which costs nothing to a lone client and stalls every other serving thread of
    /// the instance when the answering one is preempted (measured: RM_ALLOC+FREE at 16
    /// clients went from 1.49x to 2.68x the same-work floor with the order unconditional).
    pub(crate) fn alone(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) <= 1
    }

    /// Enters a request (`quotas.in_flight`); the guard leaves it.
    pub fn enter_request(&self) -> Result<InFlight<'_>, ProxyError> {
        let limit = self.policy.quotas.in_flight;
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .map(|_| InFlight(&self.in_flight))
            .map_err(|_| ProxyError::InFlightQuota {
                instance: self.policy.name.clone(),
                limit,
            })
    }

    /// Whether one more RM client or object fits the instance's quota.
    /// The records of alloc params count too: at most
    /// [`RECORD_BYTES_PER_OBJECT`](crate::objects::RECORD_BYTES_PER_OBJECT) bytes per object
    /// of the quota, on average.
    pub fn object_room(&self) -> bool {
        self.object_room_in(&lock(&self.objects))
    }

    /// [`Proxy::object_room`] on the table the caller has locked.
    pub(crate) fn object_room_in(&self, t: &ObjectTable) -> bool {
        let quota = self.policy.quotas.objects;
        t.len() < quota
            && t.recorded_bytes() < quota.saturating_mul(crate::objects::RECORD_BYTES_PER_OBJECT)
    }

    /// Takes one of the instance's open-file slots ([`Proxy::take_open_slot`]) and opens a
    /// host file of `node` for a client open of any of the instance's nodes; the slot is
    /// given back when the host open fails ([`ProxyError::Host`]).
    pub fn open_host(&self, node: NodeKind) -> Result<Arc<dyn HostFile>, ProxyError> {
        self.take_open_slot()?;
        self.host.open(node).map_err(|e| {
            self.release_open_slot();
            ProxyError::Host(e)
        })
    }

    /// Opens a new host file for a client open of `node`.
    pub fn open(&self, node: FrontendNode) -> Result<OpenId, ProxyError> {
        let host_node = match node {
            Node::Ctl => NodeKind::Ctl,
            // The UVM node is the `uvm` crate's.
            Node::Uvm => return Err(ProxyError::NotFrontend),
            Node::Gpu(i) => NodeKind::Gpu(
                self.gpus
                    .get(i as usize)
                    .ok_or(ProxyError::NoSuchGpu(i))?
                    .minor,
            ),
        };
        let host = self.open_host(host_node)?;
        let id = OwnerId(self.next_open.fetch_add(1, Ordering::Relaxed));
        lock(&self.opens).insert(
            id,
            Arc::new(OpenFile {
                node,
                host,
                mapping: Mutex::default(),
                record: Mutex::default(),
            }),
        );
        debug!(instance = %self.policy.name, open = id.0, %node, "open");
        Ok(id)
    }

    /// Forgets a client open: removes the RM clients allocated through it from the object
    /// table (the host file's close frees them in the driver, as `RmFreeUnusedClients` does)
    /// and drops the host file and the open's mapping file, if any (mappings the tenant made
    /// keep their own reference). Returns the freed client handles.
    ///
    /// A control open that another open's `NV_ESC_REGISTER_FD` names outlives the tenant's
    /// close as the driver's file does: it *lingers*, clients, memory and slot counted, until
    /// the last open registered to it is released, and goes with that one. Else closing the
    /// control file before the GPU file (as every process exit may) would drop from the books
    /// memory the driver still holds, and a tenant could hold past its quotas that way.
    pub fn release(&self, open: OpenId) -> Vec<u32> {
        let file = {
            let mut opens = lock(&self.opens);
            let file = opens.remove(&open);
            match &file {
                Some(f) if lock_record(f).holders > 0 => {
                    debug!(instance = %self.policy.name, open = open.0, "release: lingers, registered by another open");
                    lock(&self.lingering).insert(open, Arc::clone(f));
                    return Vec::new();
                }
                // Released twice: it goes with its holders, not now.
                None if lock(&self.lingering).contains_key(&open) => return Vec::new(),
                _ => {}
            }
            file
        };
        let next = file.as_ref().and_then(|f| lock_record(f).registered_ctl);
        let mut freed = self.release_now(open, file);
        if let Some(ctl) = next {
            freed.extend(self.unhold_ctl(ctl));
        }
        freed
    }

    /// Counts a registration (`NV_ESC_REGISTER_FD`) of the control open `ctl`, before the
    /// call, so that a close of `ctl` racing it lingers (a close that came first left it
    /// lingering or gone). False if `ctl` is gone.
    pub(crate) fn hold_ctl(&self, ctl: OpenId) -> bool {
        let opens = lock(&self.opens);
        let lingering = lock(&self.lingering);
        match opens.get(&ctl).or_else(|| lingering.get(&ctl)) {
            Some(f) => {
                lock_record(f).holders += 1;
                true
            }
            None => false,
        }
    }

    /// Drops one registration of `ctl` (the registering open was released, or the call
    /// failed): a lingering `ctl` without holders is released now, and with it the control
    /// open it registered itself, if that one lingers too (chains are at most two links long:
    /// the driver refuses a link to a file that has one). Returns the freed client handles.
    pub(crate) fn unhold_ctl(&self, ctl: OpenId) -> Vec<u32> {
        let mut freed = Vec::new();
        let mut next = Some(ctl);
        while let Some(ctl) = next {
            let file = {
                let opens = lock(&self.opens);
                let mut lingering = lock(&self.lingering);
                let Some(f) = opens.get(&ctl).or_else(|| lingering.get(&ctl)) else {
                    break;
                };
                let mut rec = lock_record(f);
                rec.holders = rec.holders.saturating_sub(1);
                if rec.holders > 0 || !lingering.contains_key(&ctl) {
                    break;
                }
                drop(rec);
                lingering.remove(&ctl)
            };
            next = file.as_ref().and_then(|f| lock_record(f).registered_ctl);
            freed.extend(self.release_now(ctl, file));
        }
        freed
    }

    /// Sets every open's holder count from the registrations recorded in the opens (after a
    /// restore or a live upgrade built them).
    pub(crate) fn recount_holders(&self) {
        let opens = lock(&self.opens);
        let lingering = lock(&self.lingering);
        let all = || opens.iter().chain(lingering.iter());
        for (_, f) in all() {
            lock_record(f).holders = 0;
        }
        let targets: Vec<OpenId> = all()
            .filter_map(|(_, f)| lock_record(f).registered_ctl)
            .collect();
        for ctl in targets {
            if let Some(f) = opens.get(&ctl).or_else(|| lingering.get(&ctl)) {
                lock_record(f).holders += 1;
            }
        }
    }

    /// [`Proxy::release`] of one open, now.
    fn release_now(&self, open: OpenId, file: Option<Arc<OpenFile>>) -> Vec<u32> {
        if file.is_some() {
            self.release_open_slot();
        }
        let freed = lock(&self.objects).release_owner(open);
        for &c in &freed {
            self.forget_dma_mappings(c, &[c]);
            self.unmap_client(c);
        }
        debug!(instance = %self.policy.name, open = open.0, clients = ?freed, "release");
        drop(file);
        freed
    }

    /// Control opens the tenant closed that the driver still holds (see [`Proxy::release`]).
    pub fn lingering_opens(&self) -> usize {
        lock(&self.lingering).len()
    }

    /// Per GPU of the instance (host minor, in the instance's order): the bytes of video memory
    /// its objects hold (`vidmem.rs`). The quota is `policy().quotas.gpu_memory`.
    pub fn gpu_memory_used(&self) -> Vec<(u32, u64)> {
        let t = lock(&self.objects);
        self.gpus
            .iter()
            .map(|g| (g.minor, t.vid_used(g.gpu_id)))
            .collect()
    }

    /// The bytes of system memory the instance's objects hold (`vidmem.rs`). The quota is
    /// `policy().quotas.system_memory`.
    pub fn system_memory_used(&self) -> u64 {
        lock(&self.objects).vid_used(crate::objects::HOST_POOL)
    }

    /// Before a UVM mapping of `h_memory` of `h_client` by the UVM open `open`: whether the
    /// open may hold one more block ([`crate::objects::MAX_HOLDS_PER_OPEN`]).
    pub fn vid_hold_room(&self, open: OpenId) -> bool {
        lock(&self.objects).hold_count(open) < crate::objects::MAX_HOLDS_PER_OPEN
    }

    /// After a UVM mapping at `base` of `h_memory` of `h_client` by the UVM open `open`: UVM
    /// keeps its own reference to the memory (`nvUvmInterfaceDupMemory`), so the memory stays
    /// counted until the range is freed or the UVM file released (`vidmem.rs`).
    pub fn vid_hold_mapping(&self, open: OpenId, base: u64, h_client: u32, h_memory: u32) {
        let mut t = lock(&self.objects);
        if let Some(c) = t.vid_of(h_client, h_memory) {
            let held = t.hold_at(open, base, c);
            debug!(held, base, "UVM mapping holds video memory");
        }
    }

    /// A UVM range `[lo, hi)` of `open` was freed: its mappings' holds go.
    pub fn vid_unhold_range(&self, open: OpenId, lo: u64, hi: u64) {
        lock(&self.objects).drop_holds_in(open, lo, hi);
    }

    /// The UVM open `open` was released: every hold of its file goes.
    pub fn vid_release_holds(&self, open: OpenId) {
        lock(&self.objects).drop_holds(open);
    }

    /// Releases every open still held (revocation: the instance stops while clients hold its
    /// files; their calls fail with `ENOTCONN` from the gone node, so nothing they hold can be
    /// used again). Returns how many.
    pub fn release_all(&self) -> usize {
        let ids: Vec<OpenId> = self.opens().keys().copied().collect();
        for &id in &ids {
            self.release(id);
        }
        // Every holder is gone, so nothing lingers; should a link have escaped the books,
        // the driver's files go with the instance all the same.
        let left = std::mem::take(&mut *self.lingering());
        for (id, f) in left {
            self.release_now(id, Some(f));
        }
        ids.len()
    }

    /// The host file id (`HostFile::id`) of an open: what an fd field naming it becomes. The
    /// UVM handlers use it for `rmCtrlFd`.
    pub fn host_file_id(&self, open: OpenId) -> Option<i32> {
        lock(&self.opens).get(&open).map(|f| f.host.id())
    }

    /// Whether `h_client` is an RM client of this instance.
    pub fn has_client(&self, h_client: u32) -> bool {
        lock(&self.objects).contains(h_client, h_client)
    }

    /// Whether `h_object` is `h_client` itself or one of its objects, and `h_client` is an RM
    /// client of this instance. The UVM handlers check the RM handles of UVM params with it.
    pub fn owns_object(&self, h_client: u32, h_object: u32) -> bool {
        lock(&self.objects).contains(h_client, h_object)
    }

    /// A fresh id from the instance's open-id space, for opens of nodes this proxy does not
    /// serve itself (`/dev/nvidia-uvm`): one id space for all the instance's nodes, so an fd
    /// resolved by the daemon to an id names exactly one open of one node.
    pub fn new_open_id(&self) -> OpenId {
        OwnerId(self.next_open.fetch_add(1, Ordering::Relaxed))
    }

    /// The host driver this proxy forwards to.
    pub fn host_driver(&self) -> &Arc<dyn HostDriver> {
        &self.host
    }

    /// The instance's audit sink (the UVM handlers record their events there too).
    pub fn audit_sink(&self) -> &Arc<dyn AuditSink> {
        &self.audit
    }

    /// Number of RM clients plus objects the instance holds.
    pub fn object_count(&self) -> usize {
        lock(&self.objects).len()
    }

    pub(crate) fn lingering(&self) -> MutexGuard<'_, BTreeMap<OpenId, Arc<OpenFile>>> {
        lock(&self.lingering)
    }

    pub(crate) fn file(&self, open: OpenId) -> Option<Arc<OpenFile>> {
        lock(&self.opens).get(&open).cloned()
    }

    pub(crate) fn opens(&self) -> MutexGuard<'_, HashMap<OpenId, Arc<OpenFile>, WordHash>> {
        lock(&self.opens)
    }

    pub(crate) fn objects(&self) -> MutexGuard<'_, ObjectTable> {
        lock(&self.objects)
    }

    pub(crate) fn rm_lock(&self) -> MutexGuard<'_, ()> {
        lock(&self.rm_lock)
    }

    /// The driver's handle for the tenant's client handle `h` (itself unless translated).
    pub fn host_client(&self, h: u32) -> u32 {
        lock(&self.clients_map)
            .to_host
            .get(&h)
            .copied()
            .unwrap_or(h)
    }

    /// The tenant's handle for the driver's client handle `h` (itself unless translated).
    pub fn tenant_client(&self, h: u32) -> u32 {
        lock(&self.clients_map)
            .to_tenant
            .get(&h)
            .copied()
            .unwrap_or(h)
    }

    /// Whether any client handle is translated.
    pub fn translates_clients(&self) -> bool {
        !lock(&self.clients_map).to_host.is_empty()
    }

    /// Records that the tenant's client `tenant` is the driver's `host`.
    pub(crate) fn map_client(&self, tenant: u32, host: u32) {
        let mut m = lock(&self.clients_map);
        m.to_host.insert(tenant, host);
        m.to_tenant.insert(host, tenant);
    }

    /// The tenant's client `tenant` is gone: its translation goes too.
    pub(crate) fn unmap_client(&self, tenant: u32) {
        let mut m = lock(&self.clients_map);
        if let Some(h) = m.to_host.remove(&tenant) {
            m.to_tenant.remove(&h);
        }
    }

    /// Open ids from now on start at `next` at least (a restore keeps the saved ones).
    pub(crate) fn bump_open_ids(&self, next: u64) {
        self.next_open.fetch_max(next, Ordering::AcqRel);
    }

    /// Records a successful `RM_MAP_MEMORY_DMA` (`map`) or `RM_UNMAP_MEMORY_DMA`.
    pub(crate) fn note_dma_mapping(&self, key: (u32, u32, u32), map: bool) {
        let mut d = lock(&self.dma_maps);
        if map {
            if d.live.len() >= MAX_DMA_MAPS && !d.live.contains_key(&key) {
                d.overflow = true;
                return;
            }
            *d.live.entry(key).or_insert(0) += 1;
        } else if let Some(n) = d.live.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                d.live.remove(&key);
            }
        }
    }

    /// Objects of `h_client` were freed (`freed`; the client's own handle among them when the
    /// client went): their DMA mappings went with them in the driver.
    pub(crate) fn forget_dma_mappings(&self, h_client: u32, freed: &[u32]) {
        let whole = freed.contains(&h_client);
        let mut d = lock(&self.dma_maps);
        // Only the client's own mappings are looked at (the map holds every client's).
        // An open-ended range: one search (a bounded one searches for both ends).
        let gone: Vec<(u32, u32, u32)> = d
            .live
            .range((h_client, 0, 0)..)
            .map(|(&k, _)| k)
            .take_while(|&(c, _, _)| c == h_client)
            .filter(|&(_, dma, mem)| whole || freed.contains(&dma) || freed.contains(&mem))
            .collect();
        for k in gone {
            d.live.remove(&k);
        }
    }

    pub(crate) fn device_gpu(&self, device_instance: u32) -> Option<u32> {
        lock(&self.devices).get(&device_instance).copied()
    }

    pub(crate) fn learn_device(&self, device_instance: u32, gpu_id: u32) {
        lock(&self.devices).insert(device_instance, gpu_id);
    }

    /// The device instances learned for the instance's GPUs, as a mask (bit = instance).
    pub(crate) fn known_device_mask(&self) -> (u32, usize) {
        let devices = lock(&self.devices);
        let mut mask = 0u32;
        let mut found = 0;
        for (&inst, &gpu) in devices.iter() {
            if self.gpu_in_set(gpu) && inst < 32 {
                mask |= 1 << inst;
                found += 1;
            }
        }
        (mask, found)
    }

    /// Whether `gpu_id` is one of the instance's GPUs.
    pub fn gpu_in_set(&self, gpu_id: u32) -> bool {
        self.gpus.iter().any(|g| g.gpu_id == gpu_id)
    }

    /// Accounts one finished request of any of the instance's nodes (the UVM path calls it
    /// too): a call that got an errno or a failing NV status ([`crate::kit::status_failed`])
    /// is `failed`; the call is counted; every call but an allowed one becomes an audit event
    /// (`node` names the node in it: `ctl`, `gpu0`, `uvm`).
    pub fn account(
        &self,
        caller: &Caller,
        node: &dyn fmt::Display,
        note: Note,
        res: &Result<i32, ProxyError>,
        start: u64,
    ) {
        let errno = res.as_ref().err().map(ProxyError::errno);
        let mut decision = note.decision;
        let failed = errno.is_some() || note.nv_status.is_some_and(crate::kit::status_failed);
        if decision == Decision::Allowed && failed {
            decision = Decision::Failed;
        }
        let unknown;
        let name: &str = if note.name.is_empty() {
            self.counts.add_unknown(note.kind, note.number, decision);
            unknown = note.kind.unknown_name(note.number);
            &unknown
        } else {
            self.counts
                .add(note.kind, &note.name, note.number, decision);
            &note.name
        };
        debug!(
            kind = ?note.kind,
            name = %name,
            decision = ?decision,
            reason = note.reason.unwrap_or(""),
            nv_status = note.nv_status.unwrap_or(0),
            errno = errno.unwrap_or(0),
            "decision"
        );
        if decision == Decision::Allowed {
            return;
        }
        let latency_us = crate::service::monotonic_ns().saturating_sub(start) / 1000;
        self.audit.record(&AuditEvent {
            instance: self.policy.name.clone(),
            pid: caller.process(),
            tid: caller.tid,
            node: node.to_string(),
            kind: note.kind,
            name: name.to_owned(),
            number: note.number,
            decision,
            reason: note.reason,
            nv_status: note.nv_status,
            errno,
            latency_us,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registration that counts itself after the tenant closed its control file (the close
    /// came between the fd's translation and the count) still holds the lingering file: it
    /// goes with the last holder, not with the first.
    #[test]
    fn test_a_registration_counted_after_the_close_holds_the_lingering_file() {
        let sim = nvsim::SimDriver::new(nvsim::SimConfig::default_gpus(1));
        let px = Proxy::for_host(
            InstancePolicy::new("t", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0]),
            sim,
        )
        .unwrap();
        let ctl = px.open(Node::Ctl).unwrap();
        assert!(px.hold_ctl(ctl), "one registration before the close");
        px.release(ctl);
        assert_eq!((px.lingering_opens(), px.open_files()), (1, 1));
        assert!(px.hold_ctl(ctl), "a racing registration finds it lingering");
        px.unhold_ctl(ctl);
        assert_eq!(px.lingering_opens(), 1, "the second holder keeps it");
        px.unhold_ctl(ctl);
        assert_eq!((px.lingering_opens(), px.open_files()), (0, 0));
    }

    /// A free forgets the DMA mappings of what it freed, in its own client only: another
    /// client's mappings of objects with the same handles stay, and a client's free forgets
    /// all of its own.
    #[test]
    fn test_a_free_forgets_the_dma_mappings_of_its_own_client_only() {
        let sim = nvsim::SimDriver::new(nvsim::SimConfig::default_gpus(1));
        let px = Proxy::for_host(
            InstancePolicy::new("t", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0]),
            sim,
        )
        .unwrap();
        for key in [
            (1, 10, 20),
            (1, 11, 21),
            (2, 10, 20),
            (2, 11, 21),
            (3, 10, 20),
        ] {
            px.note_dma_mapping(key, true);
        }
        let live = |px: &Proxy| lock(&px.dma_maps).live.keys().copied().collect::<Vec<_>>();
        px.forget_dma_mappings(2, &[20]);
        assert_eq!(
            live(&px),
            [(1, 10, 20), (1, 11, 21), (2, 11, 21), (3, 10, 20)]
        );
        px.forget_dma_mappings(1, &[11]);
        assert_eq!(live(&px), [(1, 10, 20), (2, 11, 21), (3, 10, 20)]);
        px.forget_dma_mappings(3, &[3]);
        assert_eq!(live(&px), [(1, 10, 20), (2, 11, 21)]);
    }
}
