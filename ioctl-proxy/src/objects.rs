//! The object table: every RM client and object an instance's clients created, with its parent
//! and the objects it depends on.
//!
//! It mirrors the driver's resource tree closely enough to answer, before anything reaches the
//! driver, whether a handle belongs to this instance, and to know what a free or a client file's
//! release takes with it. As in RM, freeing an object frees its children and every object that
//! depends on it (recursively); freeing a client frees all its objects; releasing an open file
//! frees the clients allocated through it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use smallvec::{SmallVec, smallvec};
use thiserror::Error;

/// The most alloc-params bytes (input plus output) recorded for one object. Every class's
/// params are bounded by the ABI table (the largest, `NV_CHANNEL_ALLOC_PARAMS`, is 376 bytes);
/// a record that would be larger is not kept and the object is unreplayable.
pub const MAX_RECORD_BYTES: usize = 2048;

/// Recorded bytes an instance may hold per object of its quota, on average: the records count
/// toward the object quota ([`ObjectTable::recorded_bytes`], `Proxy::object_room`).
pub const RECORD_BYTES_PER_OBJECT: usize = 512;

/// The handles one free took, in ascending order (a client's own handle last): most frees
/// are of a leaf, so a few are kept inline.
pub type Freed = SmallVec<[u32; 4]>;

/// An fd field of alloc params and the open it named (translated again on replay).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdUse {
    /// Byte offset of the field in the alloc params.
    pub offset: usize,
    /// The open of this instance the tenant's fd resolved to.
    pub open: u64,
}

/// An allocation's params as given and as returned, one after the other in one buffer: a
/// record of up to 128 bytes (most are) needs no allocation besides its object's box.
type RecordData = SmallVec<[u8; 128]>;

/// An `NV_ESC_RM_ALLOC` as the client gave it: what replay sends again. In the checkpoint
/// format as `class`, `params`, `out` (hex or null), `rights`, `fds`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "AllocRecordWire", into = "AllocRecordWire")]
pub struct AllocRecord {
    /// The class in the client's `hClass` (`NV01_EVENT` for an OS event, whose real class is
    /// in its params).
    pub class: u32,
    /// [`AllocRecord::params`] then [`AllocRecord::out`].
    data: RecordData,
    /// Length of the params in `data`; `None`: NULL.
    params_len: Option<u32>,
    /// Length of the out bytes in `data`, after the params; `None`: none recorded.
    out_len: Option<u32>,
    /// `*pRightsRequested`, when the client gave one (NVOS64).
    pub rights: Option<u32>,
    /// fd fields of the params and the opens they named.
    pub fds: Vec<FdUse>,
}

/// A record's length field (saturating: a record is bounded far below).
fn len_u32(b: &[u8]) -> u32 {
    u32::try_from(b.len()).unwrap_or(u32::MAX)
}

/// [`AllocRecord`] as the checkpoint format writes it.
#[derive(Serialize, Deserialize)]
struct AllocRecordWire {
    class: u32,
    #[serde(with = "hex_opt", default)]
    params: Option<Vec<u8>>,
    #[serde(with = "hex_opt", default)]
    out: Option<Vec<u8>>,
    #[serde(default)]
    rights: Option<u32>,
    #[serde(default)]
    fds: Vec<FdUse>,
}

impl From<AllocRecordWire> for AllocRecord {
    fn from(w: AllocRecordWire) -> Self {
        AllocRecord::new(
            w.class,
            w.params.as_deref(),
            w.out.as_deref(),
            w.rights,
            w.fds,
        )
    }
}

impl From<AllocRecord> for AllocRecordWire {
    fn from(r: AllocRecord) -> Self {
        AllocRecordWire {
            class: r.class,
            params: r.params().map(<[u8]>::to_vec),
            out: r.out().map(<[u8]>::to_vec),
            rights: r.rights,
            fds: r.fds,
        }
    }
}

impl AllocRecord {
    /// A record of `pAllocParms` as given (`params`, `None`: NULL) and as returned (`out`).
    pub fn new(
        class: u32,
        params: Option<&[u8]>,
        out: Option<&[u8]>,
        rights: Option<u32>,
        fds: Vec<FdUse>,
    ) -> Self {
        let mut r = AllocRecord::given(class, params);
        r.set_out(out);
        r.rights = rights;
        r.fds = fds;
        r
    }

    /// A record of the params as the client gave them (`None`: NULL), before the driver
    /// answered: no output yet ([`AllocRecord::set_out`]), no rights, no fds.
    pub fn given(class: u32, params: Option<&[u8]>) -> Self {
        AllocRecord {
            class,
            data: params.map_or_else(RecordData::new, RecordData::from_slice),
            params_len: params.map(len_u32),
            out_len: None,
            rights: None,
            fds: Vec::new(),
        }
    }

    /// Sets the params as returned (replacing any set before).
    pub fn set_out(&mut self, out: Option<&[u8]>) {
        self.data.truncate(self.split());
        self.data.extend_from_slice(out.unwrap_or(&[]));
        self.out_len = out.map(len_u32);
    }

    /// Where the params end in `data`.
    fn split(&self) -> usize {
        (self.params_len.unwrap_or(0) as usize).min(self.data.len())
    }

    /// `pAllocParms` as the client gave it (a copy before any translation); `None`: NULL.
    pub fn params(&self) -> Option<&[u8]> {
        self.params_len.map(|_| &self.data[..self.split()])
    }

    /// The params as the driver returned them to the client (the client may keep outputs:
    /// addresses, sizes); replay checks the new driver answers the same.
    pub fn out(&self) -> Option<&[u8]> {
        self.out_len.map(|_| &self.data[self.split()..])
    }

    /// [`AllocRecord::params`] and [`AllocRecord::out`], to change.
    pub fn params_and_out_mut(&mut self) -> (Option<&mut [u8]>, Option<&mut [u8]>) {
        let at = self.split();
        let (p, o) = self.data.split_at_mut(at);
        (self.params_len.map(|_| p), self.out_len.map(|_| o))
    }

    fn bytes(&self) -> usize {
        self.data.len()
    }
}

/// How an object came to be, with what is needed to create it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// `NV_ESC_RM_ALLOC` (boxed: an object is moved several times inside its table's B-tree
    /// nodes, and a record is most of its size).
    Alloc(Box<AllocRecord>),
    /// `NV_ESC_RM_DUP_OBJECT` of `src_object` of `src_client` (a client of this instance).
    Dup {
        /// `hClientSrc`.
        src_client: u32,
        /// `hObjectSrc`.
        src_object: u32,
        /// `flags`.
        flags: u32,
    },
    /// Cannot be replayed; why.
    Unreplayable(String),
}

impl Origin {
    fn bytes(&self) -> usize {
        match self {
            Origin::Alloc(a) => a.bytes(),
            Origin::Dup { .. } => 12,
            Origin::Unreplayable(s) => s.len(),
        }
    }

    /// An `Alloc` origin, or `Unreplayable` when the record would exceed [`MAX_RECORD_BYTES`].
    pub fn alloc(rec: AllocRecord) -> Origin {
        if rec.bytes() > MAX_RECORD_BYTES {
            Origin::Unreplayable(format!(
                "alloc params of {} bytes exceed the record bound",
                rec.bytes()
            ))
        } else {
            Origin::Alloc(Box::new(rec))
        }
    }
}

/// Hex strings for optional byte vectors in the checkpoint format.
mod hex_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            None => s.serialize_none(),
            Some(b) => s.serialize_str(&b.iter().map(|x| format!("{x:02x}")).collect::<String>()),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let Some(s) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        if s.len() % 2 != 0 || s.len() > 2 * super::MAX_RECORD_BYTES {
            return Err(serde::de::Error::custom("bad hex byte string"));
        }
        (0..s.len())
            .step_by(2)
            .map(|i| {
                s.get(i..i + 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| serde::de::Error::custom("bad hex byte string"))
            })
            .collect::<Result<Vec<u8>, _>>()
            .map(Some)
    }
}

/// Identifies the open file (one client `open()` of a frontend node) that allocated a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(pub u64);

/// Why a table operation was refused. Each maps to the NV status the driver would give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ObjectError {
    /// The client handle is not one of ours.
    #[error("client {0:#x} unknown to this instance")]
    UnknownClient(u32),
    /// The object handle is not in the client.
    #[error("object {1:#x} of client {0:#x} unknown")]
    UnknownObject(u32, u32),
    /// The parent named by an allocation does not exist in the client.
    #[error("parent {1:#x} of client {0:#x} unknown")]
    UnknownParent(u32, u32),
    /// The handle is already in use in the client (or, for clients, globally).
    #[error("handle {1:#x} already used in client {0:#x}")]
    Duplicate(u32, u32),
    /// Handle 0 is never a valid object.
    #[error("handle 0 is not a valid object handle")]
    NullHandle,
}

impl ObjectError {
    /// The NV status code the real driver returns in the same situation (nvstatuscodes.h).
    pub fn nv_status(&self) -> u32 {
        match self {
            Self::UnknownClient(_) => 0x23,  // NV_ERR_INVALID_CLIENT
            Self::UnknownObject(..) => 0x33, // NV_ERR_INVALID_OBJECT_HANDLE
            Self::UnknownParent(..) => 0x36, // NV_ERR_INVALID_OBJECT_PARENT
            Self::Duplicate(..) => 0x19,     // NV_ERR_INSERT_DUPLICATE_NAME
            Self::NullHandle => 0x34,        // NV_ERR_INVALID_OBJECT_NEW
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Object {
    pub(crate) parent: u32,
    pub(crate) class: u32,
    pub(crate) deps: Vec<u32>,
    pub(crate) origin: Origin,
    /// Bytes of the tenant's memory the object pins (OS-descriptor memory), else 0.
    pub(crate) pinned: u64,
    /// The counted memory the object holds ([`VidCharge`]), shared with its dups and imports.
    pub(crate) vid: Option<VidCharge>,
}

/// The pool of system memory in a [`VidCharge`], where a GPU's is its id (RM GPU ids are made of
/// the PCI domain, bus and device, whose device is at most `0x1f`, so none is this).
pub const HOST_POOL: u32 = u32::MAX;

/// Counted memory an object holds on the tenant's behalf: one driver memory block, of video
/// memory on one GPU or of the host's system memory (`vidmem.rs`).
/// A dup or an import of the object names the same block; the block's bytes count once, for as
/// long as any object or export hold names it (the driver frees the memory with its last
/// reference).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VidCharge {
    /// The block: a number unique in the table.
    pub block: u64,
    /// The pool: the driver's GPU id (`nv_ioctl_card_info_t.gpu_id`) for video memory, or the
    /// host's ([`HOST_POOL`]) for system memory.
    pub gpu: u32,
    /// Bytes counted.
    pub bytes: u64,
}

/// The most export holds ([`ObjectTable::hold`]) one open keeps: an export fd names at most a
/// few objects (`NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD` takes up to 512 per call).
pub const MAX_HOLDS_PER_OPEN: usize = 4096;

/// The memory books of a table: the blocks its objects and export holds name and what they add
/// up to per pool (a GPU's video memory, the host's system memory).
#[derive(Debug, Default, Clone)]
struct VidBooks {
    /// block → (charge, references).
    blocks: HashMap<u64, (VidCharge, u32)>,
    /// Pool (GPU id or [`HOST_POOL`]) → bytes held.
    used: BTreeMap<u32, u64>,
    /// The next block number.
    next: u64,
    /// Holds: the open whose file holds the memory → (key, block), with repeats. Key 0: an
    /// export; else the UVM mapping's base address.
    holds: HashMap<OwnerId, Vec<(u64, u64)>>,
}

impl VidBooks {
    fn add_ref(&mut self, c: VidCharge) {
        self.next = self.next.max(c.block.saturating_add(1));
        let e = self.blocks.entry(c.block).or_insert((c, 0));
        if e.1 == 0 {
            let u = self.used.entry(c.gpu).or_default();
            *u = u.saturating_add(c.bytes);
        }
        e.1 += 1;
    }

    fn drop_ref(&mut self, block: u64) {
        let Some(e) = self.blocks.get_mut(&block) else {
            return;
        };
        e.1 = e.1.saturating_sub(1);
        if e.1 == 0 {
            let c = e.0;
            self.blocks.remove(&block);
            if let Some(u) = self.used.get_mut(&c.gpu) {
                *u = u.saturating_sub(c.bytes);
                if *u == 0 {
                    self.used.remove(&c.gpu);
                }
            }
        }
    }

    fn of<'a>(objects: impl IntoIterator<Item = &'a Object>) -> VidBooks {
        let mut b = VidBooks::default();
        for o in objects {
            if let Some(c) = o.vid {
                b.add_ref(c);
            }
        }
        b
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Client {
    /// Its own handle.
    me: u32,
    pub(crate) owner: OwnerId,
    pub(crate) class: u32,
    pub(crate) origin: Origin,
    pub(crate) objects: BTreeMap<u32, Object>,
    /// Every "freed with" edge among the objects: (an object's parent or dependency, the
    /// object). A free walks these from the freed object, so it costs the size of what it
    /// frees, not of the client's table (as the driver's per-object child lists). The
    /// client's own handle has none: its free takes the whole table without a walk, so a
    /// top-level object (a device) is indexed by nothing.
    edges: BTreeSet<(u32, u32)>,
}

impl Client {
    /// A client holding `objects`, with its edge index built from them.
    pub(crate) fn new(
        me: u32,
        owner: OwnerId,
        class: u32,
        origin: Origin,
        objects: BTreeMap<u32, Object>,
    ) -> Client {
        // (0, 0) names no object (handle 0 is never one; `dependants` starts at 1): it keeps
        // the set's node allocated, which an alloc/free loop would otherwise allocate and
        // free each time.
        let edges = objects
            .iter()
            .flat_map(|(&h, o)| o.edges(me, h))
            .chain([(0, 0)])
            .collect();
        Client {
            me,
            owner,
            class,
            origin,
            objects,
            edges,
        }
    }

    /// The objects freed with `h` directly: its children and its dependants.
    fn dependants(&self, h: u32) -> impl Iterator<Item = u32> + '_ {
        self.edges.range((h, 1)..=(h, u32::MAX)).map(|&(_, d)| d)
    }

    /// Whether nothing is freed with `h` (no child, no dependant): one search of the index
    /// (a bounded range searches for both of its ends).
    fn is_leaf(&self, h: u32) -> bool {
        self.edges
            .range((h, 1)..)
            .next()
            .is_none_or(|&(r, _)| r != h)
    }

    /// Whether `h` is this client (its own handle) or one of its objects.
    fn has(&self, h: u32) -> bool {
        h == self.me || self.objects.contains_key(&h)
    }

    /// Removes object `h` and its edges.
    fn remove(&mut self, h: u32) -> Option<Object> {
        let o = self.objects.remove(&h)?;
        for e in o.edges(self.me, h) {
            self.edges.remove(&e);
        }
        Some(o)
    }
}

impl Object {
    /// The objects whose free frees this one: its parent and its dependencies.
    fn freed_with(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::once(self.parent).chain(self.deps.iter().copied())
    }

    /// This object's (`h`) edges in the index of client `me`: none from the client's handle.
    fn edges(&self, me: u32, h: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.freed_with()
            .filter(move |&r| r != me)
            .map(move |r| (r, h))
    }
}

/// The per-instance table of RM clients and objects.
#[derive(Debug, Default)]
pub struct ObjectTable {
    pub(crate) clients: BTreeMap<u32, Client>,
    /// Bytes of the records (alloc params) held, against the quota.
    recorded: usize,
    /// Bytes and number of the objects that pin memory ([`Object::pinned`]).
    pinned: Pinned,
    /// The video memory the objects hold ([`Object::vid`]).
    vid: VidBooks,
    /// Clients plus objects ([`ObjectTable::len`]), kept as they come and go: the quota
    /// check before every allocation reads it.
    count: usize,
}

/// What the pinning objects of a table add up to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    /// Bytes pinned.
    pub bytes: u64,
    /// Objects that pin some.
    pub objects: usize,
}

impl Pinned {
    fn of<'a>(objects: impl IntoIterator<Item = &'a Object>) -> Pinned {
        let mut p = Pinned::default();
        for o in objects {
            p.add(o.pinned);
        }
        p
    }

    fn add(&mut self, bytes: u64) {
        if bytes > 0 {
            self.bytes = self.bytes.saturating_add(bytes);
            self.objects += 1;
        }
    }

    fn sub(&mut self, other: Pinned) {
        self.bytes = self.bytes.saturating_sub(other.bytes);
        self.objects = self.objects.saturating_sub(other.objects);
    }
}

impl ObjectTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a new RM client `h_client` (class `NV01_ROOT*`) allocated through `owner`.
    pub fn add_client(
        &mut self,
        owner: OwnerId,
        h_client: u32,
        class: u32,
    ) -> Result<(), ObjectError> {
        self.add_client_with(
            owner,
            h_client,
            class,
            Origin::Unreplayable("not recorded".into()),
        )
    }

    /// [`ObjectTable::add_client`] with the record of its allocation.
    pub fn add_client_with(
        &mut self,
        owner: OwnerId,
        h_client: u32,
        class: u32,
        origin: Origin,
    ) -> Result<(), ObjectError> {
        if h_client == 0 {
            return Err(ObjectError::NullHandle);
        }
        if self.clients.contains_key(&h_client) {
            return Err(ObjectError::Duplicate(h_client, h_client));
        }
        self.recorded += origin.bytes();
        self.count += 1;
        self.clients.insert(
            h_client,
            Client::new(h_client, owner, class, origin, BTreeMap::new()),
        );
        Ok(())
    }

    /// Takes a client with all its objects as another worker's table held them (a live
    /// upgrade): no parent order is needed, but every parent and dependency must be in the
    /// client, as the table keeps them.
    pub(crate) fn insert_live_client(
        &mut self,
        h_client: u32,
        client: Client,
    ) -> Result<(), ObjectError> {
        if h_client == 0 {
            return Err(ObjectError::NullHandle);
        }
        if self.clients.contains_key(&h_client) {
            return Err(ObjectError::Duplicate(h_client, h_client));
        }
        for (&h, o) in &client.objects {
            if h == 0 || h == h_client {
                return Err(ObjectError::Duplicate(h_client, h));
            }
            let known = |x: u32| x == h_client || client.objects.contains_key(&x);
            if !known(o.parent) {
                return Err(ObjectError::UnknownParent(h_client, o.parent));
            }
            if let Some(&d) = o.deps.iter().find(|&&d| !known(d)) {
                return Err(ObjectError::UnknownObject(h_client, d));
            }
        }
        self.recorded += client.origin.bytes()
            + client
                .objects
                .values()
                .map(|o| o.origin.bytes())
                .sum::<usize>();
        let pinned = Pinned::of(client.objects.values());
        self.pinned.bytes = self.pinned.bytes.saturating_add(pinned.bytes);
        self.pinned.objects += pinned.objects;
        for c in client.objects.values().filter_map(|o| o.vid) {
            self.vid.add_ref(c);
        }
        self.count += 1 + client.objects.len();
        self.clients.insert(h_client, client);
        Ok(())
    }

    /// Records object `h_new` of `class` under `h_parent` (the client itself or one of its
    /// objects), depending also on `deps` (objects of the same client its params name).
    pub fn add_object(
        &mut self,
        h_client: u32,
        h_parent: u32,
        h_new: u32,
        class: u32,
        deps: &[u32],
    ) -> Result<(), ObjectError> {
        let origin = Origin::Unreplayable("not recorded".into());
        self.add_object_with(h_client, h_parent, h_new, class, deps, origin)
    }

    /// [`ObjectTable::add_object`] with the record of how the object was made.
    pub fn add_object_with(
        &mut self,
        h_client: u32,
        h_parent: u32,
        h_new: u32,
        class: u32,
        deps: &[u32],
        origin: Origin,
    ) -> Result<(), ObjectError> {
        self.add_pinning_object(h_client, h_parent, h_new, class, deps, origin, 0)
    }

    /// [`ObjectTable::add_object_with`] of an object that pins `pinned` bytes of the tenant's
    /// memory until it is freed ([`ObjectTable::pinned`]).
    #[allow(clippy::too_many_arguments)]
    pub fn add_pinning_object(
        &mut self,
        h_client: u32,
        h_parent: u32,
        h_new: u32,
        class: u32,
        deps: &[u32],
        origin: Origin,
        pinned: u64,
    ) -> Result<(), ObjectError> {
        self.add_full(h_client, h_parent, h_new, class, deps, origin, pinned, None)
    }

    /// [`ObjectTable::add_object_with`] of an object that holds video memory `vid` (a new
    /// block from [`ObjectTable::new_vid_charge`], or the charge of the object it duplicates
    /// or imports).
    #[allow(clippy::too_many_arguments)]
    pub fn add_vid_object(
        &mut self,
        h_client: u32,
        h_parent: u32,
        h_new: u32,
        class: u32,
        deps: &[u32],
        origin: Origin,
        vid: Option<VidCharge>,
    ) -> Result<(), ObjectError> {
        self.add_full(h_client, h_parent, h_new, class, deps, origin, 0, vid)
    }

    #[allow(clippy::too_many_arguments)]
    fn add_full(
        &mut self,
        h_client: u32,
        h_parent: u32,
        h_new: u32,
        class: u32,
        deps: &[u32],
        origin: Origin,
        pinned: u64,
        vid: Option<VidCharge>,
    ) -> Result<(), ObjectError> {
        let client = self
            .clients
            .get_mut(&h_client)
            .ok_or(ObjectError::UnknownClient(h_client))?;
        if h_new == 0 {
            return Err(ObjectError::NullHandle);
        }
        if h_new == h_client || client.objects.contains_key(&h_new) {
            return Err(ObjectError::Duplicate(h_client, h_new));
        }
        if h_parent != h_client && !client.objects.contains_key(&h_parent) {
            return Err(ObjectError::UnknownParent(h_client, h_parent));
        }
        if let Some(&d) = deps
            .iter()
            .find(|&&d| d != h_client && !client.objects.contains_key(&d))
        {
            return Err(ObjectError::UnknownObject(h_client, d));
        }
        self.recorded += origin.bytes();
        self.pinned.add(pinned);
        if let Some(c) = vid {
            self.vid.add_ref(c);
        }
        let object = Object {
            parent: h_parent,
            class,
            deps: deps.to_vec(),
            origin,
            pinned,
            vid,
        };
        client.edges.extend(object.edges(client.me, h_new));
        client.objects.insert(h_new, object);
        self.count += 1;
        Ok(())
    }

    /// Records that `h_object` depends on `dep` (both objects of `h_client`), as the driver does
    /// for `NV503C_CTRL_CMD_REGISTER_VA_SPACE`: freeing `dep` then frees `h_object` too.
    pub fn add_dependency(
        &mut self,
        h_client: u32,
        h_object: u32,
        dep: u32,
    ) -> Result<(), ObjectError> {
        let client = self
            .clients
            .get_mut(&h_client)
            .ok_or(ObjectError::UnknownClient(h_client))?;
        if !client.objects.contains_key(&dep) {
            return Err(ObjectError::UnknownObject(h_client, dep));
        }
        let obj = client
            .objects
            .get_mut(&h_object)
            .ok_or(ObjectError::UnknownObject(h_client, h_object))?;
        if !obj.deps.contains(&dep) {
            obj.deps.push(dep);
            client.edges.insert((dep, h_object));
        }
        Ok(())
    }

    /// Where a new object `h_new` under `h_parent` of `h_client` stands (an allocation's
    /// checks, in the driver's order, under one lookup of the client): `Err(UnknownClient)`,
    /// `Err(UnknownParent)`, `Err(Duplicate)` (a non-zero handle in use), else `Ok`.
    pub fn check_new(&self, h_client: u32, h_parent: u32, h_new: u32) -> Result<(), ObjectError> {
        let c = self
            .clients
            .get(&h_client)
            .ok_or(ObjectError::UnknownClient(h_client))?;
        if !c.has(h_parent) {
            return Err(ObjectError::UnknownParent(h_client, h_parent));
        }
        if h_new != 0 && c.has(h_new) {
            return Err(ObjectError::Duplicate(h_client, h_new));
        }
        Ok(())
    }

    /// Whether `h_client` is a client of the table, and whether `h_object` is it or one of its
    /// objects (one lookup of the client for both).
    pub fn client_and_object(&self, h_client: u32, h_object: u32) -> (bool, bool) {
        match self.clients.get(&h_client) {
            Some(c) => (true, c.has(h_object)),
            None => (false, false),
        }
    }

    /// Whether `h_object` is the client itself or one of its objects.
    pub fn contains(&self, h_client: u32, h_object: u32) -> bool {
        self.client_and_object(h_client, h_object).1
    }

    /// The class of `h_object` (the client's own class for `h_object == h_client`).
    pub fn class_of(&self, h_client: u32, h_object: u32) -> Result<u32, ObjectError> {
        let client = self
            .clients
            .get(&h_client)
            .ok_or(ObjectError::UnknownClient(h_client))?;
        if h_object == h_client {
            return Ok(client.class);
        }
        client
            .objects
            .get(&h_object)
            .map(|o| o.class)
            .ok_or(ObjectError::UnknownObject(h_client, h_object))
    }

    /// The open file that allocated `h_client`.
    pub fn owner_of(&self, h_client: u32) -> Result<OwnerId, ObjectError> {
        self.clients
            .get(&h_client)
            .map(|c| c.owner)
            .ok_or(ObjectError::UnknownClient(h_client))
    }

    /// Frees `h_object` of `h_client` with its subtree and dependants; freeing the client handle
    /// frees the client. Returns the freed handles (the client's own handle last).
    pub fn free(&mut self, h_client: u32, h_object: u32) -> Result<Freed, ObjectError> {
        let client = self
            .clients
            .get_mut(&h_client)
            .ok_or(ObjectError::UnknownClient(h_client))?;
        if h_object == h_client {
            let c = self.clients.remove(&h_client).expect("looked up above");
            self.count -= 1 + c.objects.len();
            self.recorded = self.recorded.saturating_sub(client_bytes(&c));
            self.pinned.sub(Pinned::of(c.objects.values()));
            self.drop_vid(c.objects.values());
            let mut freed: Freed = c.objects.keys().copied().collect();
            freed.sort_unstable();
            freed.push(h_client);
            return Ok(freed);
        }
        // An object that left its client: its share of the table's books goes (a closure:
        // it borrows the books, not the client map).
        let mut forget = |o: &Object| {
            self.count -= 1;
            self.recorded = self.recorded.saturating_sub(o.origin.bytes());
            self.pinned.sub(Pinned::of([o]));
            if let Some(c) = o.vid {
                self.vid.drop_ref(c.block);
            }
        };
        // Most frees are of a leaf: one search of the index, one removal.
        if client.is_leaf(h_object) {
            let o = client
                .remove(h_object)
                .ok_or(ObjectError::UnknownObject(h_client, h_object))?;
            forget(&o);
            return Ok(smallvec![h_object]);
        }
        if !client.objects.contains_key(&h_object) {
            return Err(ObjectError::UnknownObject(h_client, h_object));
        }
        // Everything reachable from h_object through "child of" and "depends on" edges.
        let mut seen = BTreeSet::from([h_object]);
        let mut todo = vec![h_object];
        while let Some(h) = todo.pop() {
            for d in client.dependants(h) {
                if seen.insert(d) {
                    todo.push(d);
                }
            }
        }
        let doomed: Freed = seen.into_iter().collect();
        for &h in &doomed {
            if let Some(o) = client.remove(h) {
                forget(&o);
            }
        }
        Ok(doomed)
    }

    /// Frees every client allocated through `owner` (its file was released). Returns the freed
    /// client handles.
    pub fn release_owner(&mut self, owner: OwnerId) -> Vec<u32> {
        let gone: Vec<u32> = self
            .clients
            .iter()
            .filter(|(_, c)| c.owner == owner)
            .map(|(&h, _)| h)
            .collect();
        for h in &gone {
            if let Some(c) = self.clients.remove(h) {
                self.count -= 1 + c.objects.len();
                self.recorded = self.recorded.saturating_sub(client_bytes(&c));
                self.pinned.sub(Pinned::of(c.objects.values()));
                self.drop_vid(c.objects.values());
            }
        }
        // The open's file held exports: its release drops them (the driver's export client
        // goes with the file).
        self.drop_holds(owner);
        gone
    }

    /// Drops every hold of `owner`'s file (the file was released).
    pub fn drop_holds(&mut self, owner: OwnerId) {
        for (_, b) in self.vid.holds.remove(&owner).unwrap_or_default() {
            self.vid.drop_ref(b);
        }
    }

    /// Drops the holds of `owner` whose key lies in `[lo, hi)` (a UVM range freed).
    pub fn drop_holds_in(&mut self, owner: OwnerId, lo: u64, hi: u64) {
        let Some(list) = self.vid.holds.get_mut(&owner) else {
            return;
        };
        let mut gone = Vec::new();
        list.retain(|&(k, b)| {
            let keep = !(lo..hi).contains(&k);
            if !keep {
                gone.push(b);
            }
            keep
        });
        if list.is_empty() {
            self.vid.holds.remove(&owner);
        }
        for b in gone {
            self.vid.drop_ref(b);
        }
    }

    fn drop_vid<'a>(&mut self, objects: impl IntoIterator<Item = &'a Object>) {
        for c in objects.into_iter().filter_map(|o| o.vid) {
            self.vid.drop_ref(c.block);
        }
    }

    /// Bytes the table's objects and export holds hold in pool `gpu_id` (a GPU's video memory,
    /// or the host's system memory for [`HOST_POOL`]).
    pub fn vid_used(&self, gpu_id: u32) -> u64 {
        self.vid.used.get(&gpu_id).copied().unwrap_or(0)
    }

    /// A charge of `bytes` on `gpu_id` in a new block (recorded once an object takes it).
    pub fn new_vid_charge(&mut self, gpu_id: u32, bytes: u64) -> VidCharge {
        let block = self.vid.next;
        self.vid.next = self.vid.next.saturating_add(1);
        VidCharge {
            block,
            gpu: gpu_id,
            bytes,
        }
    }

    /// The video memory `h_object` of `h_client` holds, if any.
    pub fn vid_of(&self, h_client: u32, h_object: u32) -> Option<VidCharge> {
        self.clients
            .get(&h_client)
            .and_then(|c| c.objects.get(&h_object))
            .and_then(|o| o.vid)
    }

    /// Keeps `charge` counted while `owner`'s file lives (an object exported to that file: the
    /// driver keeps the memory until the file is closed). `false`: the open holds
    /// [`MAX_HOLDS_PER_OPEN`] already.
    pub fn hold(&mut self, owner: OwnerId, charge: VidCharge) -> bool {
        self.hold_at(owner, 0, charge)
    }

    /// [`ObjectTable::hold`] under `key` (a UVM mapping's base, [`ObjectTable::drop_holds_in`]).
    pub fn hold_at(&mut self, owner: OwnerId, key: u64, charge: VidCharge) -> bool {
        let n = self.vid.holds.get(&owner).map_or(0, Vec::len);
        if n >= MAX_HOLDS_PER_OPEN {
            return false;
        }
        self.vid.add_ref(charge);
        self.vid
            .holds
            .entry(owner)
            .or_default()
            .push((key, charge.block));
        true
    }

    /// Every hold: (owner, key, charge), in no particular order (a live upgrade carries them).
    pub fn vid_holds(&self) -> Vec<(OwnerId, u64, VidCharge)> {
        self.vid
            .holds
            .iter()
            .flat_map(|(&o, hs)| {
                hs.iter()
                    .filter_map(move |&(k, b)| self.vid.blocks.get(&b).map(|e| (o, k, e.0)))
            })
            .collect()
    }

    /// How many holds `owner`'s file keeps.
    pub fn hold_count(&self, owner: OwnerId) -> usize {
        self.vid.holds.get(&owner).map_or(0, Vec::len)
    }

    /// The charges `owner`'s file holds for exports, in export order.
    pub fn holds_of(&self, owner: OwnerId) -> Vec<VidCharge> {
        self.vid
            .holds
            .get(&owner)
            .into_iter()
            .flatten()
            .filter(|(k, _)| *k == 0)
            .filter_map(|(_, b)| self.vid.blocks.get(b).map(|e| e.0))
            .collect()
    }

    /// The `NV01_DEVICE_0` object `h_object` of `h_client` lies under (itself if it is one).
    pub fn device_above(&self, h_client: u32, h_object: u32, device_class: u32) -> Option<u32> {
        let c = self.clients.get(&h_client)?;
        let mut h = h_object;
        // The tree is at most a few levels deep (device, subdevice, memory); bound the walk.
        for _ in 0..16 {
            let o = c.objects.get(&h)?;
            if o.class == device_class {
                return Some(h);
            }
            h = o.parent;
        }
        None
    }

    /// The origin of `h_object` of `h_client`.
    pub fn origin_of(&self, h_client: u32, h_object: u32) -> Option<&Origin> {
        self.clients
            .get(&h_client)
            .and_then(|c| c.objects.get(&h_object))
            .map(|o| &o.origin)
    }

    /// Bytes of alloc-params records held (bounded by [`RECORD_BYTES_PER_OBJECT`] times the
    /// object quota).
    pub fn recorded_bytes(&self) -> usize {
        self.recorded
    }

    /// What the live objects pin of the tenant's memory (bounded by
    /// `Quotas::os_descriptor_bytes`).
    pub fn pinned(&self) -> Pinned {
        self.pinned
    }

    /// The RM client handles, in order.
    pub fn client_handles(&self) -> Vec<u32> {
        self.clients.keys().copied().collect()
    }

    /// Rebuilds a table from restored clients (replay, `checkpoint.rs`).
    pub(crate) fn from_clients(clients: BTreeMap<u32, Client>) -> Self {
        let recorded = clients.values().map(client_bytes).sum();
        let pinned = Pinned::of(clients.values().flat_map(|c| c.objects.values()));
        let vid = VidBooks::of(clients.values().flat_map(|c| c.objects.values()));
        let count = clients.values().map(|c| 1 + c.objects.len()).sum();
        Self {
            clients,
            recorded,
            pinned,
            vid,
            count,
        }
    }

    /// Number of clients plus objects: zero when everything was freed.
    pub fn len(&self) -> usize {
        debug_assert_eq!(
            self.count,
            self.clients
                .values()
                .map(|c| 1 + c.objects.len())
                .sum::<usize>()
        );
        self.count
    }

    /// Whether the table holds nothing.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }
}

fn client_bytes(c: &Client) -> usize {
    c.origin.bytes() + c.objects.values().map(|o| o.origin.bytes()).sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: u32 = 0x41;
    const DEVICE: u32 = 0x80;
    const SUBDEVICE: u32 = 0x2080;
    const VASPACE: u32 = 0x90f1;
    const CTXSHARE: u32 = 0x9067;

    fn table_with_device() -> ObjectTable {
        let mut t = ObjectTable::new();
        t.add_client(OwnerId(1), 0xc1d0_0001, ROOT).unwrap();
        t.add_object(0xc1d0_0001, 0xc1d0_0001, 0x10, DEVICE, &[])
            .unwrap();
        t.add_object(0xc1d0_0001, 0x10, 0x11, SUBDEVICE, &[])
            .unwrap();
        t
    }

    /// The index holds the edges among objects only: the client's own (its top-level
    /// objects) are never walked, its free taking the whole table.
    #[test]
    fn test_top_level_objects_are_not_indexed() {
        const C: u32 = 0xc1d0_0001;
        let mut t = table_with_device();
        let edges = |t: &ObjectTable| t.clients[&C].edges.iter().copied().collect::<Vec<_>>();
        assert_eq!(edges(&t), [(0, 0), (0x10, 0x11)], "placeholder, subdevice");
        t.add_object(C, C, 0x20, DEVICE, &[]).unwrap();
        assert_eq!(edges(&t).len(), 2, "a second device adds no edge");
        assert!(t.clients[&C].is_leaf(0x20) && !t.clients[&C].is_leaf(0x10));
        assert_eq!(t.free(C, 0x20).unwrap().as_slice(), [0x20]);
        assert_eq!(t.free(C, 0x10).unwrap().as_slice(), [0x10, 0x11]);
        assert_eq!(edges(&t), [(0, 0)]);
        assert_eq!(t.free(C, C).unwrap().as_slice(), [C]);
    }

    #[test]
    fn test_add_object_under_unknown_parent_is_invalid_parent() {
        let mut t = table_with_device();
        let err = t
            .add_object(0xc1d0_0001, 0x99, 0x12, SUBDEVICE, &[])
            .unwrap_err();
        assert_eq!(err.nv_status(), 0x36);
    }

    #[test]
    fn test_add_object_in_unknown_client_is_invalid_client() {
        let mut t = table_with_device();
        let err = t
            .add_object(0xc1d0_0002, 0xc1d0_0002, 0x12, DEVICE, &[])
            .unwrap_err();
        assert_eq!(err, ObjectError::UnknownClient(0xc1d0_0002));
    }

    #[test]
    fn test_duplicate_handle_is_refused() {
        let mut t = table_with_device();
        let err = t
            .add_object(0xc1d0_0001, 0xc1d0_0001, 0x10, DEVICE, &[])
            .unwrap_err();
        assert_eq!(err.nv_status(), 0x19);
    }

    #[test]
    fn test_free_removes_subtree_and_dependants() {
        let mut t = table_with_device();
        t.add_object(0xc1d0_0001, 0x10, 0x20, VASPACE, &[]).unwrap();
        t.add_object(0xc1d0_0001, 0x11, 0x21, CTXSHARE, &[0x20])
            .unwrap();
        let freed = t.free(0xc1d0_0001, 0x20).unwrap();
        assert_eq!(freed.as_slice(), [0x20, 0x21]);
        assert!(t.contains(0xc1d0_0001, 0x11));
        assert_eq!(t.len(), 3);
    }

    /// What a free must take, computed from the objects alone: everything whose parent or a
    /// dependency is taken, to a fixed point (the table answers it from its edge index).
    fn closure_of(t: &ObjectTable, h_client: u32, h: u32) -> Vec<u32> {
        let objects = &t.clients[&h_client].objects;
        let mut doomed = BTreeSet::from([h]);
        loop {
            let before = doomed.len();
            for (&k, o) in objects {
                if doomed.contains(&o.parent) || o.deps.iter().any(|d| doomed.contains(d)) {
                    doomed.insert(k);
                }
            }
            if doomed.len() == before {
                return doomed.into_iter().collect();
            }
        }
    }

    #[test]
    fn test_free_takes_exactly_the_closure_through_random_adds_dependencies_and_frees() {
        const C: u32 = 0xc1d0_0001;
        let mut t = ObjectTable::new();
        t.add_client(OwnerId(1), C, ROOT).unwrap();
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut live: Vec<u32> = Vec::new();
        let mut fresh = 0x100u32;
        let (mut frees, mut taken_with_others) = (0, 0);
        for _ in 0..4000 {
            let pick = |r: u64, live: &[u32]| {
                if live.is_empty() || r.is_multiple_of(5) {
                    C
                } else {
                    live[usize::try_from(r / 5 % live.len() as u64).expect("an index")]
                }
            };
            match next() % 10 {
                0..=5 => {
                    let parent = pick(next(), &live);
                    let deps = match next() % 4 {
                        0 => vec![pick(next(), &live)],
                        _ => vec![],
                    };
                    fresh += 1;
                    t.add_object(C, parent, fresh, DEVICE, &deps).unwrap();
                    live.push(fresh);
                }
                6 if live.len() >= 2 => {
                    let (a, b) = (pick(next(), &live), pick(next(), &live));
                    // A dependency on an object it holds would make the pair free each other.
                    if a != C && b != C && a != b && !closure_of(&t, C, a).contains(&b) {
                        t.add_dependency(C, b, a).unwrap();
                    }
                }
                _ if !live.is_empty() => {
                    let h = live[usize::try_from(next() % live.len() as u64).expect("an index")];
                    let want = closure_of(&t, C, h);
                    assert_eq!(t.free(C, h).unwrap().to_vec(), want, "free of {h:#x}");
                    frees += 1;
                    taken_with_others += usize::from(want.len() > 1);
                    live.retain(|x| !want.contains(x));
                    assert_eq!(t.len(), 1 + live.len());
                }
                _ => {}
            }
        }
        assert!(
            frees > 500 && taken_with_others > 100,
            "{frees} frees, {taken_with_others} took more"
        );
        assert_eq!(
            t.clients[&C].dependants(0).count(),
            0,
            "the set's placeholder"
        );
        let all = t.free(C, C).unwrap();
        assert_eq!(all.len(), live.len() + 1);
        assert!(t.is_empty());
    }

    #[test]
    fn test_free_device_takes_children() {
        let mut t = table_with_device();
        assert_eq!(t.free(0xc1d0_0001, 0x10).unwrap().as_slice(), [0x10, 0x11]);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn test_double_free_is_invalid_object_handle() {
        let mut t = table_with_device();
        t.free(0xc1d0_0001, 0x11).unwrap();
        assert_eq!(t.free(0xc1d0_0001, 0x11).unwrap_err().nv_status(), 0x33);
    }

    #[test]
    fn test_free_client_frees_everything() {
        let mut t = table_with_device();
        let freed = t.free(0xc1d0_0001, 0xc1d0_0001).unwrap();
        assert_eq!(freed.as_slice(), [0x10, 0x11, 0xc1d0_0001]);
        assert!(t.is_empty());
    }

    #[test]
    fn test_release_owner_frees_only_its_clients() {
        let mut t = table_with_device();
        t.add_client(OwnerId(2), 0xc1d0_0002, ROOT).unwrap();
        assert_eq!(t.release_owner(OwnerId(1)), vec![0xc1d0_0001]);
        assert_eq!(t.owner_of(0xc1d0_0002), Ok(OwnerId(2)));
        assert_eq!(t.len(), 1);
    }

    fn alloc_origin(params: usize) -> Origin {
        let p = vec![0; params];
        Origin::alloc(AllocRecord::new(
            VASPACE,
            Some(&p),
            Some(&p),
            None,
            Vec::new(),
        ))
    }

    #[test]
    fn test_recorded_bytes_follow_adds_frees_and_releases() {
        let mut t = table_with_device();
        assert_eq!(t.recorded_bytes(), "not recorded".len() * 3);
        let base = t.recorded_bytes();
        t.add_object_with(0xc1d0_0001, 0x10, 0x20, VASPACE, &[], alloc_origin(48))
            .unwrap();
        assert_eq!(t.recorded_bytes(), base + 96);
        t.free(0xc1d0_0001, 0x20).unwrap();
        assert_eq!(t.recorded_bytes(), base);
        t.release_owner(OwnerId(1));
        assert_eq!(t.recorded_bytes(), 0);
    }

    /// A record keeps the checkpoint layout of its separate fields (`params` and `out` as hex
    /// or null) however it stores them, and reads back equal, with NULL, empty and long
    /// (spilled) params alike.
    #[test]
    fn test_an_alloc_record_keeps_its_checkpoint_layout() {
        let rec = AllocRecord::new(
            0x80,
            Some(&[1, 2]),
            Some(&[3, 4]),
            Some(7),
            vec![FdUse { offset: 8, open: 2 }],
        );
        let json = serde_json::to_string(&rec).unwrap();
        assert_eq!(
            json,
            r#"{"class":128,"params":"0102","out":"0304","rights":7,"fds":[{"offset":8,"open":2}]}"#
        );
        assert_eq!(serde_json::from_str::<AllocRecord>(&json).unwrap(), rec);
        let old: AllocRecord = serde_json::from_str(r#"{"class":65,"params":null}"#).unwrap();
        assert_eq!((old.params(), old.out(), old.bytes()), (None, None, 0));
        let mut given = AllocRecord::given(0x80, Some(&[1, 2]));
        assert_eq!((given.params(), given.out()), (Some(&[1u8, 2][..]), None));
        given.set_out(Some(&[5, 6, 7]));
        given.set_out(Some(&[3, 4]));
        (given.rights, given.fds) = (Some(7), vec![FdUse { offset: 8, open: 2 }]);
        assert_eq!(
            given, rec,
            "given, then answered twice, keeps the last answer"
        );
        let long = vec![9u8; 300];
        for (params, out) in [(None, Some(&long[..])), (Some(&[][..]), Some(&long[..3]))] {
            let rec = AllocRecord::new(1, params, out, None, Vec::new());
            assert_eq!((rec.params(), rec.out()), (params, out));
            let back: AllocRecord =
                serde_json::from_str(&serde_json::to_string(&rec).unwrap()).unwrap();
            assert_eq!((back.params(), back.out()), (params, out));
        }
    }

    #[test]
    fn test_a_record_past_the_bound_is_kept_as_unreplayable_only() {
        let o = alloc_origin(MAX_RECORD_BYTES);
        assert!(matches!(&o, Origin::Unreplayable(why) if why.contains("record bound")));
        assert!(o.bytes() < 100);
    }

    #[test]
    fn test_class_of_client_and_object() {
        let t = table_with_device();
        assert_eq!(t.class_of(0xc1d0_0001, 0xc1d0_0001), Ok(ROOT));
        assert_eq!(t.class_of(0xc1d0_0001, 0x11), Ok(SUBDEVICE));
    }
}
