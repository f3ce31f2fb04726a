//! Save by record: an instance's state as a versioned, documented [`Checkpoint`], and the
//! identities devices are remapped by. The restore side (replay) is `replay.rs`.
//!
//! What is saved is what the instance *asked for*, never driver memory: every RM client and
//! object with its parent, class, the alloc params exactly as the client gave them, the
//! objects those params name and the opens their fd fields named (`objects.rs` records them as
//! the calls succeed), every open with its node, `REGISTER_FD` link, `ATTACH_GPUS_TO_FD` list
//! and OS events, the UVM opens with their registered GPUs and GPU VA spaces (filled in by the
//! `uvm` crate), and the identity of each of the instance's GPUs. A save refuses (naming each
//! one) anything a replay could not re-create exactly, so a restore never starts from a
//! partial picture.
//!
//! The format is JSON with a `format` tag and a `version`: a reader reads every version up to
//! its own ([`CHECKPOINT_VERSION`]) and refuses a newer one with both numbers
//! (docs/architecture/checkpoint.md).

use std::fmt;

use host_driver::{HostDriver, NodeKind};
use nvproxy_abi::structs::NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::error::ProxyError;
use crate::hostctl::{gpu_uuid, host_cards, host_control, temp_root_client};
use crate::nv::*;
use crate::objects::{Client, Object, Origin, OwnerId};
use crate::proxy::{Node, OpenRecord, Proxy, lock, lock_record};

/// The `format` tag of a checkpoint file.
pub const CHECKPOINT_FORMAT: &str = "nvproxy-checkpoint";
/// The newest checkpoint version this build writes and reads (it reads every older one).
pub const CHECKPOINT_VERSION: u32 = 1;
/// The largest checkpoint [`Checkpoint::from_json`] parses (a bound on what a file can make
/// the daemon allocate).
pub const MAX_CHECKPOINT_BYTES: usize = 256 << 20;

/// Why a save or restore did not happen. Nothing is left half done in either case.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The save found state a replay cannot re-create; each entry names one.
    #[error("instance {instance} cannot be checkpointed: {} item(s) cannot be replayed: {}", .items.len(), .items.join("; "))]
    Unreplayable {
        /// The instance.
        instance: String,
        /// What cannot be replayed, one entry each.
        items: Vec<String>,
    },
    /// The file is not a checkpoint, or is malformed.
    #[error("not a valid nvproxy checkpoint: {0}")]
    Format(String),
    /// The file's format version is newer than this build reads.
    #[error(
        "checkpoint format version {found} is newer than this nvproxy reads (up to {supported}); restore it with a newer nvproxy"
    )]
    Version {
        /// The file's version.
        found: u32,
        /// The newest this build reads.
        supported: u32,
    },
    /// The host driver is not the one the checkpoint was made on (alloc params are
    /// version-specific layouts).
    #[error(
        "checkpoint was made on driver {saved}, the host runs {host}: alloc params are version-specific, replay refused"
    )]
    Driver {
        /// The checkpoint's driver version.
        saved: String,
        /// The host's.
        host: String,
    },
    /// The devices cannot be remapped (missing, heterogeneous, non-zero subdevice instance).
    #[error("device remapping refused: {0}")]
    Remap(String),
    /// Re-creating something on the host failed; everything re-created was released.
    #[error("replay failed at {what}: {why}")]
    Replay {
        /// What was being re-created.
        what: String,
        /// The driver's answer.
        why: String,
    },
    /// A host or proxy error outside the replay proper.
    #[error(transparent)]
    Proxy(#[from] ProxyError),
}

/// One GPU as save and restore identify it (the seed's `DeviceRemapID`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceIdentity {
    /// Host minor (`/dev/nvidia<minor>`), from `NV_ESC_CARD_INFO`.
    pub minor: u32,
    /// PCI vendor id (`nv_pci_info_t.vendor_id`).
    pub pci_vendor_id: u16,
    /// PCI device id.
    pub pci_device_id: u16,
    /// The driver's GPU id (`nv_ioctl_card_info_t.gpu_id`).
    pub gpu_id: u32,
    /// Broadcast device instance (`NV0080_ALLOC_PARAMETERS.deviceId`), from
    /// `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2`.
    pub device_instance: u32,
    /// Unicast subdevice instance (`NV2080_ALLOC_PARAMETERS.subDeviceId`), same control.
    pub subdevice_instance: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, from `GET_UUID_FROM_GPU_ID`.
    pub uuid: String,
}

impl fmt::Display for DeviceIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{minor {} pci {:04x}:{:04x} gpu id {:#x} device {} subdevice {} {}}}",
            self.minor,
            self.pci_vendor_id,
            self.pci_device_id,
            self.gpu_id,
            self.device_instance,
            self.subdevice_instance,
            self.uuid
        )
    }
}

/// The text form of a GPU UUID, as `nvidia-smi -L` prints it.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(&u[0..4]),
        hex(&u[4..6]),
        hex(&u[6..8]),
        hex(&u[8..10]),
        hex(&u[10..16])
    )
}

/// The 16 bytes of a UUID in text form, or `None`.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s
        .strip_prefix("GPU-")?
        .chars()
        .filter(|&c| c != '-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The seed's `CheckDevicesRemappable`: all devices of one kind (PCI vendor and device ids),
/// and every subdevice instance 0 (the open driver's `gpumgrCreateDevice` makes one subdevice
/// per device, so each device has its own device instance and a remap need not rearrange
/// device/subdevice pairs).
pub fn check_remappable(ids: &[DeviceIdentity]) -> Result<(), String> {
    if let Some(first) = ids.first() {
        for id in &ids[1..] {
            if (id.pci_vendor_id, id.pci_device_id) != (first.pci_vendor_id, first.pci_device_id) {
                return Err(format!(
                    "can't remap with heterogeneous GPUs: devices {first} and {id} have different PCI vendor/device IDs"
                ));
            }
        }
    }
    if let Some(id) = ids.iter().find(|i| i.subdevice_instance != 0) {
        return Err(format!("device {id} has a non-zero subdevice instance"));
    }
    Ok(())
}

/// A client open as saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedOpen {
    /// Its id (the daemon's `fh`), kept across the restore.
    pub id: u64,
    /// Its node, in the tenant's numbering.
    pub node: SavedNode,
    /// The control open it was registered to (`NV_ESC_REGISTER_FD`).
    #[serde(default)]
    pub registered_ctl: Option<u64>,
    /// GPU ids it attached (`NV_ESC_ATTACH_GPUS_TO_FD`), old host ids.
    #[serde(default)]
    pub attached: Option<Vec<u32>>,
    /// OS events registered on it.
    #[serde(default)]
    pub os_events: Vec<SavedOsEvent>,
}

/// A frontend node in the tenant's numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SavedNode {
    /// `/dev/nvidiactl`.
    Ctl,
    /// `/dev/nvidia<N>`, the tenant's N-th GPU.
    Gpu(u32),
}

/// An `NV_ESC_ALLOC_OS_EVENT` registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedOsEvent {
    /// `hClient`.
    pub h_client: u32,
    /// `hDevice`.
    pub h_device: u32,
    /// The open whose fd keyed it.
    pub fd_open: u64,
}

/// An RM client with its objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedClient {
    /// The tenant's handle for it.
    pub handle: u32,
    /// The open it was allocated through.
    pub owner: u64,
    /// Its class (`NV01_ROOT*`).
    pub class: u32,
    /// How it was allocated.
    pub origin: Origin,
    /// Its objects, by handle.
    pub objects: Vec<SavedObject>,
}

/// An RM object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedObject {
    /// The tenant's handle.
    pub handle: u32,
    /// Its parent (the client's handle for top-level objects).
    pub parent: u32,
    /// Its class (the real class: `NV01_EVENT_OS_EVENT`, not `NV01_EVENT`).
    pub class: u32,
    /// Objects of the same client it depends on (besides its parent).
    pub deps: Vec<u32>,
    /// How it was made.
    pub origin: Origin,
    /// Bytes of the tenant's memory it pins (OS-descriptor memory; a live upgrade carries it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pinned: u64,
    /// The video memory it holds (a live upgrade and a restore carry it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vid: Option<crate::objects::VidCharge>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

// One model of the saved state: a checkpoint (re-created by replay) and a live upgrade's
// state (`live.rs`: the same driver state handed over) write and read the tables through
// these conversions, so a field added to an open or an object is carried by both.

impl SavedOpen {
    /// A frontend open as saved (`None` for a UVM open: the `uvm` crate saves those).
    pub(crate) fn of(id: OwnerId, node: Node, rec: &OpenRecord) -> Option<SavedOpen> {
        let node = match node {
            Node::Ctl => SavedNode::Ctl,
            Node::Gpu(i) => SavedNode::Gpu(i),
            Node::Uvm => return None,
        };
        Some(SavedOpen {
            id: id.0,
            node,
            registered_ctl: rec.registered_ctl.map(|o| o.0),
            attached: rec.attached.clone(),
            os_events: rec
                .os_events
                .iter()
                .map(|&(h_client, h_device, o)| SavedOsEvent {
                    h_client,
                    h_device,
                    fd_open: o.0,
                })
                .collect(),
        })
    }

    /// The proxy's node for it (the caller checks the GPU index against the instance's).
    pub(crate) fn proxy_node(&self) -> Node {
        match self.node {
            SavedNode::Ctl => Node::Ctl,
            SavedNode::Gpu(i) => Node::Gpu(i),
        }
    }

    /// Its record as the proxy keeps it, with the attached GPU ids mapped by `gpu_id`
    /// (identity but for a restore onto other GPUs); `os_events_overflow`: more OS events were
    /// registered than the record holds.
    pub(crate) fn record(
        &self,
        gpu_id: impl Fn(u32) -> u32,
        os_events_overflow: bool,
    ) -> OpenRecord {
        OpenRecord {
            registered_ctl: self.registered_ctl.map(OwnerId),
            // Proxy::recount_holders sets it once every open is in place.
            holders: 0,
            attached: self
                .attached
                .as_ref()
                .map(|l| l.iter().map(|&id| gpu_id(id)).collect()),
            os_events: self
                .os_events
                .iter()
                .map(|e| (e.h_client, e.h_device, OwnerId(e.fd_open)))
                .collect(),
            os_events_overflow,
        }
    }
}

impl SavedClient {
    /// An RM client with its objects sorted by handle.
    pub(crate) fn of(handle: u32, c: &Client) -> SavedClient {
        let mut objects: Vec<SavedObject> = c
            .objects
            .iter()
            .map(|(&h, o)| SavedObject {
                handle: h,
                parent: o.parent,
                class: o.class,
                deps: o.deps.clone(),
                origin: o.origin.clone(),
                pinned: o.pinned,
                vid: o.vid,
            })
            .collect();
        objects.sort_by_key(|o| o.handle);
        SavedClient {
            handle,
            owner: c.owner.0,
            class: c.class,
            origin: c.origin.clone(),
            objects,
        }
    }
}

impl SavedObject {
    /// The object as the table keeps it, with `origin` (the saved one, or rebased by a
    /// restore).
    pub(crate) fn object(&self, origin: Origin) -> Object {
        Object {
            parent: self.parent,
            class: self.class,
            deps: self.deps.clone(),
            origin,
            pinned: self.pinned,
            vid: self.vid,
        }
    }
}

/// A UVM open (`/dev/nvidia-uvm`) as saved (filled in by the `uvm` crate).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SavedUvmOpen {
    /// Its id, in the instance's open-id space.
    pub id: u64,
    /// The client's `UVM_INITIALIZE` flags, when it initialised a va_space.
    #[serde(default)]
    pub init_flags: Option<u64>,
    /// The UVM open its `UVM_MM_INITIALIZE` named, when it is an mm file.
    #[serde(default)]
    pub mm_of: Option<u64>,
    /// GPUs registered (`UVM_REGISTER_GPU`), in order.
    #[serde(default)]
    pub gpus: Vec<SavedUvmGpu>,
    /// GPU VA spaces registered (`UVM_REGISTER_GPU_VASPACE`), in order.
    #[serde(default)]
    pub gpu_va_spaces: Vec<SavedUvmGpuVaSpace>,
}

/// A `UVM_REGISTER_GPU`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedUvmGpu {
    /// The GPU's UUID (old).
    pub uuid: String,
    /// The frontend open `rmCtrlFd` named (`None`: negative, passed through).
    pub rm_ctrl_open: Option<u64>,
    /// `hClient`.
    pub h_client: u32,
    /// `hSmcPartRef`.
    pub h_smc_part_ref: u32,
}

/// A `UVM_REGISTER_GPU_VASPACE`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedUvmGpuVaSpace {
    /// The GPU's UUID (old).
    pub uuid: String,
    /// The frontend open `rmCtrlFd` named.
    pub rm_ctrl_open: Option<u64>,
    /// `hClient`.
    pub h_client: u32,
    /// `hVaSpace` (a `FERMI_VASPACE_A` of that client).
    pub h_va_space: u32,
}

/// An instance's saved state (format version [`CHECKPOINT_VERSION`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Always [`CHECKPOINT_FORMAT`].
    pub format: String,
    /// The format version it was written with.
    pub version: u32,
    /// The instance's name.
    pub instance: String,
    /// The host driver's version at the save.
    pub driver_version: String,
    /// The instance's GPUs in the tenant's order.
    pub gpus: Vec<DeviceIdentity>,
    /// The frontend opens, by id.
    pub opens: Vec<SavedOpen>,
    /// The RM clients, by handle.
    pub clients: Vec<SavedClient>,
    /// The UVM opens, by id.
    #[serde(default)]
    pub uvm: Vec<SavedUvmOpen>,
}

impl Checkpoint {
    /// The JSON text of the checkpoint.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plain data serializes")
    }

    /// Parses a checkpoint: the `format` tag must match and the `version` be at most
    /// [`CHECKPOINT_VERSION`] (older versions are read, a newer one is refused with both
    /// numbers, never guessed at).
    pub fn from_json(text: &str) -> Result<Checkpoint, CheckpointError> {
        if text.len() > MAX_CHECKPOINT_BYTES {
            return Err(CheckpointError::Format(format!(
                "{} bytes, more than the {MAX_CHECKPOINT_BYTES} a checkpoint may have",
                text.len()
            )));
        }
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| CheckpointError::Format(e.to_string()))?;
        if v.get("format").and_then(|f| f.as_str()) != Some(CHECKPOINT_FORMAT) {
            return Err(CheckpointError::Format(format!(
                "no \"format\": \"{CHECKPOINT_FORMAT}\" field"
            )));
        }
        let version = v
            .get("version")
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| CheckpointError::Format("no numeric \"version\" field".into()))?;
        if version > CHECKPOINT_VERSION {
            return Err(CheckpointError::Version {
                found: version,
                supported: CHECKPOINT_VERSION,
            });
        }
        if version == 0 {
            return Err(CheckpointError::Format("version 0 does not exist".into()));
        }
        // Version 1 is the first; an older version's upgrade to the current structs goes here.
        let c: Checkpoint =
            serde_json::from_value(v).map_err(|e| CheckpointError::Format(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// Checks what the replay relies on: open ids unique across frontend and UVM opens,
    /// client handles unique, object handles unique in their client and never the client's.
    pub fn validate(&self) -> Result<(), CheckpointError> {
        let bad = |m: String| Err(CheckpointError::Format(m));
        let mut ids = std::collections::BTreeSet::new();
        for id in self
            .opens
            .iter()
            .map(|o| o.id)
            .chain(self.uvm.iter().map(|u| u.id))
        {
            if !ids.insert(id) {
                return bad(format!("open id {id} appears twice"));
            }
        }
        let mut clients = std::collections::BTreeSet::new();
        for c in &self.clients {
            if c.handle == 0 || !clients.insert(c.handle) {
                return bad(format!(
                    "client handle {:#x} is 0 or appears twice",
                    c.handle
                ));
            }
            let mut objects = std::collections::BTreeSet::new();
            for o in &c.objects {
                if o.handle == 0 || o.handle == c.handle || !objects.insert(o.handle) {
                    return bad(format!(
                        "object handle {:#x} of client {:#x} is 0, the client's or appears twice",
                        o.handle, c.handle
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The identity of every GPU of the host, from `NV_ESC_CARD_INFO` and, on a temporary root
/// client of a fresh control file (freed with the file), `GET_ID_INFO_V2` and
/// `GET_UUID_FROM_GPU_ID`. The GPU nodes are held open meanwhile (the driver answers only for
/// attached GPUs).
pub fn identify_host_gpus(host: &dyn HostDriver) -> Result<Vec<DeviceIdentity>, ProxyError> {
    let ctl = host.open(NodeKind::Ctl).map_err(ProxyError::Host)?;
    let cards = host_cards(&*ctl)?;
    let _nodes = cards
        .iter()
        .map(|c| host.open(NodeKind::Gpu(c.minor_number)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(ProxyError::Host)?;
    let h = temp_root_client(&*ctl, "identifying the GPUs")?;
    let mut ids = Vec::with_capacity(cards.len());
    for c in &cards {
        let mut info = NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS::new_zeroed();
        info.gpuId = c.gpu_id;
        let (s, out) = host_control(
            &*ctl,
            h,
            h,
            crate::hostctl::NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2,
            info.as_bytes().to_vec(),
        )?;
        let info = NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS::read_from_bytes(&out)
            .ok()
            .filter(|_| s == NV_OK)
            .ok_or_else(|| {
                ProxyError::Config(format!(
                    "GPU /dev/nvidia{}: no id info from the driver (status {s:#x})",
                    c.minor_number
                ))
            })?;
        let uuid = gpu_uuid(&*ctl, h, c.gpu_id, c.minor_number)?;
        ids.push(DeviceIdentity {
            minor: c.minor_number,
            pci_vendor_id: c.pci_info.vendor_id,
            pci_device_id: c.pci_info.device_id,
            gpu_id: c.gpu_id,
            device_instance: info.deviceInstance,
            subdevice_instance: info.subDeviceInstance,
            uuid: uuid_string(&uuid),
        });
    }
    // The temporary client goes with `ctl`.
    Ok(ids)
}

/// Whether replay can re-create an object of `class` (`name` from the table): `Err(why)` when
/// not. Conservative: only classes whose whole state is their alloc params. Channels (TSGs,
/// context shares, GPFIFO channels and their engine objects) hold GPU state replay cannot
/// bring back: submitted work, channel ids and work-submit tokens the client keeps.
pub(crate) fn class_replayable(class: u32, name: &str) -> Result<(), &'static str> {
    match class {
        NV01_ROOT
        | NV01_ROOT_NON_PRIV
        | NV01_ROOT_CLIENT
        | NV01_DEVICE_0
        | NV20_SUBDEVICE_0
        | NV01_EVENT_OS_EVENT
        | NV01_MEMORY_SYSTEM
        | NV01_MEMORY_LOCAL_USER
        | NV50_MEMORY_VIRTUAL
        | FERMI_VASPACE_A
        | NV_CONFIDENTIAL_COMPUTE => Ok(()),
        _ if name.ends_with("_USERMODE_A") => Ok(()),
        _ if name.contains("CHANNEL")
            || name.contains("CONTEXT_SHARE")
            || name.contains("COMPUTE")
            || name.contains("DMA_COPY") =>
        {
            Err(
                "channel state lives on the GPU (submitted work, channel ids and tokens the client holds)",
            )
        }
        _ => Err("class not known to be replayable"),
    }
}

impl Proxy {
    fn class_name(&self, class: u32) -> &'static str {
        self.abi
            .classes
            .get(&class)
            .map_or("unknown class", |c| c.name)
    }

    /// Saves the instance's frontend state (the `uvm` crate adds its part,
    /// `UvmProxy::checkpoint`). The tenant must be paused (e.g. by `cuda-checkpoint`); the
    /// snapshot is taken under the RM mutation lock, so no allocation or free is half seen.
    /// Fails, naming every item, when anything cannot be replayed.
    pub fn checkpoint(&self) -> Result<Checkpoint, CheckpointError> {
        let ids = identify_host_gpus(&*self.host)?;
        let mut gpus = Vec::with_capacity(self.gpus.len());
        let mut items = Vec::new();
        for g in &self.gpus {
            match ids.iter().find(|i| i.minor == g.minor) {
                Some(i) => gpus.push(i.clone()),
                None => items.push(format!("GPU /dev/nvidia{} is gone from the host", g.minor)),
            }
        }
        if let Err(e) = check_remappable(&gpus) {
            items.push(e);
        }
        let _rm = self.rm_lock();
        let mut opens: Vec<SavedOpen> = Vec::new();
        for (&id, f) in self.opens().iter() {
            let rec = lock_record(f).clone();
            let Some(saved) = SavedOpen::of(id, f.node, &rec) else {
                continue;
            };
            if lock(&f.mapping).has_context() {
                items.push(format!(
                    "open {} ({}): holds an mmap context (RM memory mapped by the tenant), which replay does not re-create",
                    id.0,
                    f.node.dev_name()
                ));
            }
            if rec.os_events_overflow {
                items.push(format!(
                    "open {}: more than {} OS events",
                    id.0,
                    crate::proxy::MAX_OS_EVENTS_PER_OPEN
                ));
            }
            opens.push(saved);
        }
        opens.sort_by_key(|o| o.id);
        for (id, f) in self.lingering().iter() {
            items.push(format!(
                "open {} ({}): closed, but another open's REGISTER_FD keeps it and its clients alive in the driver, which replay does not re-create",
                id.0,
                f.node.dev_name()
            ));
        }
        {
            let d = lock(&self.dma_maps);
            for &(c, dma, mem) in d.live.keys() {
                items.push(format!(
                    "client {c:#x}: memory {mem:#x} mapped into {dma:#x} (RM_MAP_MEMORY_DMA), a GPU mapping replay does not re-create"
                ));
            }
            if d.overflow {
                items.push("more DMA mappings than tracked".into());
            }
        }
        let mut clients = Vec::new();
        for (&h, c) in self.objects().clients.iter() {
            if let Origin::Unreplayable(why) = &c.origin {
                items.push(format!("client {h:#x}: {why}"));
            }
            let saved = SavedClient::of(h, c);
            for o in &saved.objects {
                let name = self.class_name(o.class);
                let why = match &o.origin {
                    Origin::Unreplayable(why) => Some(why.as_str()),
                    _ => class_replayable(o.class, name).err(),
                };
                if let Some(why) = why {
                    items.push(format!(
                        "client {h:#x} object {:#x} ({name} {:#06x}): {why}",
                        o.handle, o.class
                    ));
                }
            }
            clients.push(saved);
        }
        if !items.is_empty() {
            return Err(CheckpointError::Unreplayable {
                instance: self.policy.name.clone(),
                items,
            });
        }
        Ok(Checkpoint {
            format: CHECKPOINT_FORMAT.into(),
            version: CHECKPOINT_VERSION,
            instance: self.policy.name.clone(),
            driver_version: self.host.version().trim().to_owned(),
            gpus,
            opens,
            clients,
            uvm: Vec::new(),
        })
    }
}
