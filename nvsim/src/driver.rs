//! The simulated driver instance: its files, RM clients, OS events and GPU state, behind one
//! mutex.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use host_driver::NodeKind;
use nvproxy_abi::{DriverAbi, DriverVersion};

use crate::config::{SimConfig, SimError};

/// `RS_UNIQUE_HANDLE_BASE`: driver-chosen object handles start here.
pub const RS_UNIQUE_HANDLE_BASE: u32 = 0xcaf0_0000;
/// `RS_UNIQUE_HANDLE_RANGE`: how many of them there are.
const RS_UNIQUE_HANDLE_RANGE: u32 = 0x0008_0000;

/// Number of driver instances created so far; gives each its own range of file ids.
static INSTANCES: AtomicU32 = AtomicU32::new(0);

/// What a simulated open file is (one `open()` of a node).
#[derive(Debug)]
pub(crate) struct FileState {
    /// The node it is open on.
    pub node: NodeKind,
    /// Whether the daemon still holds it (its [`SimFile`](crate::dispatch::SimFile) is alive). A file that was dropped
    /// but is still referenced by a `REGISTER_FD` of another file stays, like a `struct file`
    /// kept alive by `fget`, until the last reference goes.
    pub held: bool,
    /// The control file this file was linked to with `NV_ESC_REGISTER_FD`.
    pub ctl: Option<i32>,
    /// How many files registered this one as their control file.
    pub holders: u32,
    /// GPU ids given to `NV_ESC_ATTACH_GPUS_TO_FD` (once per file), zeros included.
    pub attached: Option<Vec<u32>>,
    /// Opened with `HostDriver::open_mapping`: only an mmap target. Every ioctl on it fails
    /// with `EACCES`, as on the real driver's Landlock-restricted mapping files.
    pub mapping: bool,
}

/// Runtime state of one simulated GPU.
#[derive(Debug, Default)]
pub(crate) struct GpuState {
    /// References taken by `NV_ESC_ATTACH_GPUS_TO_FD` (`nvidia_dev_get`).
    pub dev_refs: u32,
    /// The video memory's books (`fb.rs`).
    pub fb: crate::fb::FbBooks,
    /// The client holding the compute-mode reservation (`hComputeModeReservation`).
    pub compute_reservation: Option<u32>,
    /// Files open on the GPU's node and not yet released (held or still referenced).
    pub node_files: u32,
    /// Those of them the daemon still holds.
    pub held_node_files: u32,
}

/// An RM object other than a client.
#[derive(Debug, Clone)]
pub(crate) struct Object {
    /// External class number.
    pub class: u32,
    /// Parent handle (the client's own handle for top-level objects).
    pub parent: u32,
    /// Class-specific state.
    pub kind: Kind,
}

/// Class-specific state of an object.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// `NV01_DEVICE_0` on GPU `gpu` (device instance = `gpu`), with its `vaMode` and its CUDA
    /// clock-limit reference count (`Device.nCudaLimitRefCnt`, `perf.rs`).
    Device {
        gpu: usize,
        va_mode: u32,
        cuda_limit_refs: u32,
    },
    /// `NV20_SUBDEVICE_0` under a device of GPU `gpu`.
    Subdevice { gpu: usize, inst: u32 },
    /// A memory object referencing a block (shared by dups).
    Memory { block: u64 },
    /// `FERMI_VASPACE_A` of GPU `gpu`, referencing VA space `id` (`State::vaspaces`, shared
    /// by dups).
    VaSpace { gpu: usize, id: u64 },
    /// `NV50_MEMORY_VIRTUAL`: the range at `addr` of VA space `id`, a dependant of the VA
    /// space object `vas_handle`.
    VirtMem { id: u64, vas_handle: u32, addr: u64 },
    /// `NV01_EVENT_OS_EVENT`, holding a reference on the OS event with this id, notified by
    /// `src` (client, object) for notifier `index` (`notifyIndex`).
    Event {
        os_event: u64,
        src: (u32, u32),
        index: u32,
    },
    /// `NV_CONFIDENTIAL_COMPUTE` under a client: the system's confidential-computing state.
    ConfCompute,
    /// `KEPLER_CHANNEL_GROUP_A`: TSG `id` (`fifo.rs`), a dependant of its VA space object.
    ChannelGroup { gpu: usize, id: u64, h_vaspace: u32 },
    /// `FERMI_CONTEXT_SHARE_A`: subcontext `subctx` of TSG `tsg`, a dependant of its VA space.
    CtxShare {
        tsg: u64,
        subctx: u32,
        h_vaspace: u32,
    },
    /// A GPFIFO channel: channel `id` (`fifo.rs`), a dependant of its context share.
    Channel { id: u64, h_ctxshare: u32 },
    /// An engine object (compute, copy) on channel `channel`.
    EngineObject { channel: u64 },
    /// `GT200_DEBUGGER` (`KernelSMDebuggerSession`) of GPU `gpu` on compute object
    /// `h_object`, a dependant of it (the debugger session `_ShareDebugger` makes).
    Debugger { gpu: usize, h_object: u32 },
}

impl Kind {
    /// The object this one is a dependant of (`refAddDependant`), freed with it, if any.
    pub(crate) fn dependency(&self) -> Option<u32> {
        match *self {
            Kind::VirtMem { vas_handle, .. } => Some(vas_handle),
            Kind::ChannelGroup { h_vaspace, .. } | Kind::CtxShare { h_vaspace, .. } => {
                (h_vaspace != 0).then_some(h_vaspace)
            }
            // kchannelConstruct: of its context share (and TSG, its parent here).
            Kind::Channel { h_ctxshare, .. } => Some(h_ctxshare),
            Kind::Debugger { h_object, .. } => Some(h_object),
            _ => None,
        }
    }
}

impl Object {
    /// The objects whose free frees this one: its parent and what it is a dependant of.
    fn freed_with(&self) -> impl Iterator<Item = u32> {
        std::iter::once(self.parent).chain(self.kind.dependency())
    }

    /// This object's (`h`) edges in the index of client `me`: none from the client's handle.
    fn edges(&self, me: u32, h: u32) -> impl Iterator<Item = (u32, u32)> {
        self.freed_with()
            .filter(move |&r| r != me)
            .map(move |r| (r, h))
    }
}

/// An RM client (`NV01_ROOT*`).
#[derive(Debug)]
pub(crate) struct Client {
    /// The file whose clients these are: the allocating file, or the control file it was
    /// registered to (the driver's `clientOSInfo`).
    pub os_info: i32,
    /// The class it was allocated with (always `NV01_ROOT_CLIENT` from user space).
    pub class: u32,
    /// Its objects by handle (changed only through [`Client::insert_object`] and
    /// [`Client::remove_object`], which keep `edges` and `devices`).
    objects: BTreeMap<u32, Object>,
    /// Generator index for driver-chosen object handles.
    pub handle_gen: u32,
    /// (parent or object depended on, object) for every object: the resource server's
    /// per-object child and dependant lists, so a free walks only what it frees. None from
    /// the client's own handle (`me`): its free takes every object without a walk.
    edges: BTreeSet<(u32, u32)>,
    /// Its own handle.
    me: u32,
    /// Bit `g` set: the client has a device of GPU `g` (`deviceGetByInstance`, which the
    /// driver answers from the client's children, not its whole table).
    devices: u64,
}

impl Client {
    /// A client without objects.
    pub(crate) fn new(me: u32, os_info: i32, class: u32) -> Client {
        Client {
            me,
            os_info,
            class,
            objects: BTreeMap::new(),
            handle_gen: 0,
            // (0, 0) names no object (handle 0 is never one; `dependants` starts at 1): it
            // keeps the set's node allocated, which an alloc/free loop would otherwise
            // allocate and free each time.
            edges: BTreeSet::from([(0, 0)]),
            devices: 0,
        }
    }

    /// Its objects by handle.
    pub(crate) fn objects(&self) -> &BTreeMap<u32, Object> {
        &self.objects
    }

    /// Its objects, the client gone.
    pub(crate) fn into_objects(self) -> BTreeMap<u32, Object> {
        self.objects
    }

    /// The CUDA clock-limit count of device `h` (`perf.rs`); `None` when `h` is not a device.
    pub(crate) fn cuda_limit_refs_mut(&mut self, h: u32) -> Option<&mut u32> {
        match &mut self.objects.get_mut(&h)?.kind {
            Kind::Device {
                cuda_limit_refs, ..
            } => Some(cuda_limit_refs),
            _ => None,
        }
    }

    /// The class of `h` (this client's own for its own handle).
    pub(crate) fn class_of(&self, h: u32) -> Option<u32> {
        if h == self.me {
            return Some(self.class);
        }
        self.objects.get(&h).map(|o| o.class)
    }

    /// The handle a new object of this client gets: `h`, or a driver-chosen one for 0
    /// (`serverAllocResourceUnderLock`'s `clientGenResourceHandle`); the driver's status when
    /// `h` cannot be used.
    pub(crate) fn assign_handle(&mut self, h: u32) -> Result<u32, u32> {
        let me = self.me;
        use crate::status::{
            NV_ERR_INSERT_DUPLICATE_NAME, NV_ERR_INSUFFICIENT_RESOURCES,
            NV_ERR_INVALID_OBJECT_HANDLE,
        };
        if h == 0 {
            for _ in 0..RS_UNIQUE_HANDLE_RANGE {
                let cand = RS_UNIQUE_HANDLE_BASE + (self.handle_gen % RS_UNIQUE_HANDLE_RANGE);
                self.handle_gen = self.handle_gen.wrapping_add(1);
                if cand != me && !self.objects.contains_key(&cand) {
                    return Ok(cand);
                }
            }
            return Err(NV_ERR_INSUFFICIENT_RESOURCES);
        }
        if h == me {
            return Err(NV_ERR_INVALID_OBJECT_HANDLE);
        }
        if self.objects.contains_key(&h) {
            return Err(NV_ERR_INSERT_DUPLICATE_NAME);
        }
        Ok(h)
    }

    /// Whether the client has a device of GPU `gpu`.
    pub(crate) fn has_device(&self, gpu: usize) -> bool {
        device_bit(gpu) & self.devices != 0
    }

    /// Adds object `h`.
    pub(crate) fn insert_object(&mut self, h: u32, o: Object) {
        let me = self.me;
        self.edges.extend(o.edges(me, h));
        let device = match o.kind {
            Kind::Device { gpu, .. } => Some(gpu),
            _ => None,
        };
        if let Some(old) = self.objects.insert(h, o) {
            // Not reached: handles are checked unused first. The indexes stay exact anyway.
            let now: Vec<(u32, u32)> = self.objects[&h].edges(me, h).collect();
            for e in old.edges(me, h).filter(|e| !now.contains(e)) {
                self.edges.remove(&e);
            }
            self.forget_device(&old);
        }
        if let Some(gpu) = device {
            self.devices |= device_bit(gpu);
        }
    }

    /// Removes object `h`.
    pub(crate) fn remove_object(&mut self, h: u32) -> Option<Object> {
        let o = self.objects.remove(&h)?;
        for e in o.edges(self.me, h) {
            self.edges.remove(&e);
        }
        self.forget_device(&o);
        Some(o)
    }

    /// `o` left the table: its GPU's bit goes (a client has one device per GPU at most:
    /// a second is refused, and devices cannot be duplicated).
    fn forget_device(&mut self, o: &Object) {
        if let Kind::Device { gpu, .. } = o.kind {
            self.devices &= !device_bit(gpu);
        }
    }

    /// The objects whose parent is `h` or that are dependants of `h`, by handle (`h` an
    /// object: the client's own handle has no edges).
    pub(crate) fn dependants(&self, h: u32) -> impl Iterator<Item = u32> + '_ {
        self.edges.range((h, 1)..=(h, u32::MAX)).map(|&(_, d)| d)
    }

    /// Whether nothing is freed with `h` (no child, no dependant): one search of the index.
    pub(crate) fn is_leaf(&self, h: u32) -> bool {
        self.edges
            .range((h, 1)..)
            .next()
            .is_none_or(|&(r, _)| r != h)
    }
}

/// A GPU index's bit in [`Client`]'s device mask (none past 63: the driver's `NV_MAX_DEVICES`
/// is 32, and allocations past it are refused before a device exists).
fn device_bit(gpu: usize) -> u64 {
    u32::try_from(gpu)
        .ok()
        .and_then(|g| 1u64.checked_shl(g))
        .unwrap_or(0)
}

/// An OS event registered with `NV_ESC_ALLOC_OS_EVENT`.
#[derive(Debug)]
pub(crate) struct OsEvent {
    /// Identity, for the references RM event objects hold.
    pub id: u64,
    /// The client handle it was registered for.
    pub h_parent: u32,
    /// The file the escape came on.
    pub file: i32,
    /// The fd number it is keyed by.
    pub fd: u32,
    /// False once freed while RM event objects still reference it.
    pub active: bool,
    /// RM event objects referencing it.
    pub refcount: u32,
    /// Notifications delivered to it (the driver queues an event and wakes `poll`; see
    /// `gpfifo.rs` for what the simulator cannot wake).
    pub notified: u64,
}

/// A block of simulated memory, shared by an object and its dups.
#[derive(Debug)]
pub(crate) struct MemBlock {
    /// The GPU whose device it was allocated under.
    pub gpu: usize,
    /// Size in bytes (after rounding).
    pub bytes: u64,
    /// Video memory (counts against the GPU) or system memory.
    pub video: bool,
    /// A register aperture (a `*_USERMODE_A` object's page of BAR0): mapped through the GPU's
    /// node like video memory, but not memory (neither counted against the GPU nor in
    /// `allocated_memory`).
    pub regs: bool,
    /// System memory the driver took from the host's pages (`NV01_MEMORY_SYSTEM`): counts
    /// against `SimConfig::host_memory_bytes`. An OS descriptor's block is the client's own
    /// pages and does not.
    pub host_pages: bool,
    /// Objects referencing it.
    pub refs: u32,
}

/// All mutable state of a driver instance.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub files: BTreeMap<i32, FileState>,
    pub next_file: i32,
    pub clients: BTreeMap<u32, Client>,
    pub client_index: u32,
    pub os_events: Vec<OsEvent>,
    pub next_os_event: u64,
    pub blocks: BTreeMap<u64, MemBlock>,
    pub next_block: u64,
    /// Bytes of the host's memory the driver's system-memory blocks hold
    /// ([`MemBlock::host_pages`]; bounded by `SimConfig::host_memory_bytes`).
    pub host_pages_bytes: u64,
    /// GPU VA spaces by id (`vaspace.rs`); ids come from `next_block`.
    pub vaspaces: BTreeMap<u64, crate::vaspace::VaSpace>,
    pub gpus: Vec<GpuState>,
    /// `NV_ESC_SYS_PARAMS.memblock_size`, set once.
    pub memblock_size: u64,
    /// UVM files by id (`uvm.rs`).
    pub uvm: BTreeMap<i32, crate::uvm_state::UvmFile>,
    /// memfd backing, CPU mappings and mmap contexts (`memory.rs`).
    pub mem: crate::memory_state::MemState,
    /// TSGs and channels (`fifo.rs`).
    pub fifo: crate::channel::FifoState,
    /// The resource server before 555 searched a sorted client bucket and could answer an
    /// unknown client with `NV_ERR_INVALID_OBJECT`; from 555 on it is always
    /// `NV_ERR_INVALID_OBJECT_HANDLE`.
    pub sorted_client_buckets: bool,
}

/// Counters that show what a driver instance holds; all zero once every file is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimStats {
    /// Files not yet released.
    pub open_files: usize,
    /// RM clients.
    pub live_clients: usize,
    /// RM objects (clients not counted).
    pub live_objects: usize,
    /// OS events (registered, or freed but still referenced by an RM event).
    pub os_events: usize,
    /// Bytes of memory (video and system) allocated through memory objects.
    pub allocated_memory: u64,
    /// GPUs currently attached (initialised by the driver).
    pub attached_gpus: usize,
    /// UVM va_spaces (initialised UVM files).
    pub uvm_va_spaces: usize,
    /// GPUs registered in UVM va_spaces, summed over va_spaces.
    pub uvm_registered_gpus: usize,
    /// UVM ranges created by ioctls (external, semaphore pool, dynamic parallelism).
    pub uvm_ranges: usize,
    /// Files opened with `open_mapping` (included in `open_files`).
    pub mapping_files: usize,
    /// Files holding an mmap context.
    pub mmap_contexts: usize,
    /// CPU mappings made by `RM_MAP_MEMORY` and not yet unmapped or freed.
    pub cpu_mappings: usize,
    /// Memory blocks backed by a memfd.
    pub memfds: usize,
}

impl fmt::Display for SimStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} open files, {} clients, {} objects, {} OS events, {} bytes allocated, {} GPUs attached",
            self.open_files,
            self.live_clients,
            self.live_objects,
            self.os_events,
            self.allocated_memory,
            self.attached_gpus
        )?;
        if self.mapping_files + self.mmap_contexts + self.cpu_mappings + self.memfds > 0 {
            write!(
                f,
                ", {} mapping files, {} mmap contexts, {} CPU mappings, {} memfds",
                self.mapping_files, self.mmap_contexts, self.cpu_mappings, self.memfds
            )?;
        }
        Ok(())
    }
}

/// A simulated NVIDIA kernel driver. Create it with [`SimDriver::new`]; it is the
/// [`HostDriver`](host_driver::HostDriver) the proxy talks to with `--driver sim` and in tests.
pub struct SimDriver {
    pub(crate) config: SimConfig,
    pub(crate) version_string: String,
    pub(crate) abi: DriverAbi,
    state: Mutex<State>,
    pub(crate) id_base: i32,
    pub(crate) me: Weak<SimDriver>,
    /// The doorbell watcher runs (`gpfifo.rs`).
    pub(crate) watcher: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for SimDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimDriver")
            .field("version", &self.version_string)
            .field("gpus", &self.config.gpus.len())
            .field("id_base", &self.id_base)
            .finish()
    }
}

impl SimDriver {
    /// A driver simulating `config`.
    ///
    /// # Panics
    /// If `config` is invalid (see [`SimDriver::try_new`]).
    pub fn new(config: SimConfig) -> Arc<SimDriver> {
        match SimDriver::try_new(config) {
            Ok(d) => d,
            Err(e) => panic!("invalid simulated driver configuration: {e}"),
        }
    }

    /// A driver simulating `config`, or why it cannot: a version without a node in the ABI
    /// tree, two GPUs on one minor or one PCI address, more than 32 GPUs.
    pub fn try_new(config: SimConfig) -> Result<Arc<SimDriver>, SimError> {
        let node = nvproxy_abi::find(&config.version).map_err(SimError::Version)?;
        if config.gpus.len() > 32 {
            return Err(SimError::TooManyGpus(config.gpus.len()));
        }
        for (i, g) in config.gpus.iter().enumerate() {
            if config.gpus[..i].iter().any(|o| o.minor == g.minor) {
                return Err(SimError::DuplicateMinor(g.minor));
            }
            if config.gpus[..i].iter().any(|o| o.gpu_id() == g.gpu_id()) {
                return Err(SimError::DuplicateGpuId(g.gpu_id()));
            }
        }
        let abi = node.tables();
        let instance = INSTANCES.fetch_add(1, Ordering::Relaxed);
        let id_base = (((instance % 0x7ffe) + 1) as i32) << 16;
        let state = State {
            client_index: config.client_index_base % 0x0010_0000,
            gpus: config.gpus.iter().map(|_| GpuState::default()).collect(),
            sorted_client_buckets: config.version.major() < 555,
            ..State::default()
        };
        Ok(Arc::new_cyclic(|me| SimDriver {
            version_string: config.version.to_string(),
            config,
            abi,
            state: Mutex::new(state),
            id_base,
            me: me.clone(),
            watcher: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// The configuration this driver simulates.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// The driver version.
    pub fn driver_version(&self) -> DriverVersion {
        self.config.version
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent-enough state for a simulator; keep
        // serving rather than poisoning every later call.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// RM clients alive.
    pub fn live_clients(&self) -> usize {
        self.stats().live_clients
    }

    /// RM objects alive (clients not counted).
    pub fn live_objects(&self) -> usize {
        self.stats().live_objects
    }

    /// Files not yet released.
    pub fn open_files(&self) -> usize {
        self.stats().open_files
    }

    /// Bytes allocated through memory objects.
    pub fn allocated_memory(&self) -> u64 {
        self.stats().allocated_memory
    }

    /// Bytes of the host's memory the driver's system-memory blocks hold (bounded by
    /// `SimConfig::host_memory_bytes`).
    pub fn allocated_host_memory(&self) -> u64 {
        self.lock().host_pages_bytes
    }

    /// Bytes of video memory allocated on GPU `index` (config order).
    pub fn allocated_video_memory(&self, index: usize) -> u64 {
        self.lock().gpus.get(index).map_or(0, |g| g.fb.used())
    }

    /// The live channel groups' (interleave level, timeslice in µs), in TSG id order: what
    /// `NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL` and `_SET_TIMESLICE` left (the driver exports no
    /// control that reads the level back).
    pub fn channel_group_schedules(&self) -> Vec<(u32, u64)> {
        self.lock()
            .fifo
            .tsgs
            .values()
            .map(|t| (t.interleave, t.timeslice_us))
            .collect()
    }

    /// The handles of the RM clients alive, in order.
    pub fn client_handles(&self) -> Vec<u32> {
        self.lock().clients.keys().copied().collect()
    }

    /// Index (config order) of the GPU with minor `minor`.
    pub(crate) fn gpu_by_minor(&self, minor: u32) -> Option<usize> {
        self.config.gpus.iter().position(|g| g.minor == minor)
    }

    /// Index of the GPU with RM GPU id `gpu_id`.
    pub(crate) fn gpu_by_id(&self, gpu_id: u32) -> Option<usize> {
        self.config.gpus.iter().position(|g| g.gpu_id() == gpu_id)
    }

    /// Whether GPU `g` is attached (initialised): some file of its node is open, or an
    /// `ATTACH_GPUS_TO_FD` holds it.
    pub(crate) fn gpu_attached(&self, st: &State, g: usize) -> bool {
        debug_assert_eq!(
            st.gpus[g].node_files as usize,
            self.node_files(st, g).count(),
            "GPU {g}'s file count"
        );
        st.gpus[g].dev_refs > 0 || st.gpus[g].node_files > 0
    }

    /// Whether the daemon holds an open file of GPU `g`'s node: the driver's
    /// `osIsGpuAccessible` (the calling process has the device open).
    pub(crate) fn gpu_accessible(&self, st: &State, g: usize) -> bool {
        debug_assert_eq!(
            st.gpus[g].held_node_files as usize,
            self.node_files(st, g).filter(|f| f.held).count(),
            "GPU {g}'s held file count"
        );
        st.gpus[g].held_node_files > 0
    }

    /// The files open on GPU `g`'s node (what the counts in [`GpuState`] count; a scan, for
    /// checking them).
    fn node_files<'a>(&self, st: &'a State, g: usize) -> impl Iterator<Item = &'a FileState> {
        let minor = self.config.gpus[g].minor;
        st.files
            .values()
            .filter(move |f| f.node == NodeKind::Gpu(minor))
    }

    /// Resolves `id` (an fd field value) to a file of this driver that is still open.
    pub(crate) fn file_node(&self, st: &State, id: i32) -> Option<NodeKind> {
        st.files.get(&id).filter(|f| f.held).map(|f| f.node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(parent: u32, kind: Kind) -> Object {
        Object {
            class: 0,
            parent,
            kind,
        }
    }

    #[test]
    fn test_a_clients_dependants_follow_its_inserts_and_removes() {
        const C: u32 = 0xc1d0_0001;
        let mut c = Client::new(C, 3, 0x41);
        let device = Kind::Device {
            gpu: 0,
            va_mode: 0,
            cuda_limit_refs: 0,
        };
        c.insert_object(0x10, object(C, device));
        c.insert_object(0x20, object(0x10, Kind::VaSpace { gpu: 0, id: 1 }));
        c.insert_object(0x30, object(0x10, Kind::Memory { block: 1 }));
        let virt = Kind::VirtMem {
            id: 1,
            vas_handle: 0x20,
            addr: 0,
        };
        c.insert_object(0x31, object(0x10, virt));
        let deps = |c: &Client, h| c.dependants(h).collect::<Vec<u32>>();
        assert!(
            deps(&c, C).is_empty(),
            "the client's own children are not indexed"
        );
        assert_eq!(deps(&c, 0x10), [0x20, 0x30, 0x31]);
        assert_eq!(deps(&c, 0x20), [0x31], "the VA space's dependant");
        assert!(deps(&c, 0).is_empty(), "the set's placeholder is no object");
        for (h, leaf) in [(0x10, false), (0x20, false), (0x30, true), (0x31, true)] {
            assert_eq!(c.is_leaf(h), leaf, "{h:#x}");
        }
        assert!(c.is_leaf(0) && c.is_leaf(u32::MAX) && c.is_leaf(0x99));
        assert!(c.has_device(0) && !c.has_device(1));
        c.remove_object(0x31).unwrap();
        assert_eq!(deps(&c, 0x10), [0x20, 0x30]);
        assert!(deps(&c, 0x20).is_empty() && c.is_leaf(0x20));
        // A handle inserted again (not done by the driver) keeps the index exact.
        c.insert_object(0x30, object(0x20, Kind::Memory { block: 2 }));
        assert_eq!(deps(&c, 0x10), [0x20]);
        assert_eq!(deps(&c, 0x20), [0x30]);
        assert!(c.remove_object(0x99).is_none());
        c.remove_object(0x10).unwrap();
        assert!(!c.has_device(0), "the device's GPU left the mask");
    }
}
