//! Restore by replay: a [`Checkpoint`] re-created on fresh host files of a (possibly reset,
//! reloaded or other) driver, with the devices remapped by identity and the tenant's handles
//! and open ids kept.
//!
//! Order: the instance's GPUs are identified on the host and matched to the saved ones
//! ([`RemapRule`]s first, then by UUID), refused unless every pair is of one kind and every
//! subdevice instance is 0 (the seed's rules); a fresh host file is opened per saved open,
//! `REGISTER_FD` and `ATTACH_GPUS_TO_FD` replayed; the RM clients are allocated with their
//! handles (a handle the driver already uses elsewhere gets a driver-chosen one, which the
//! proxy then translates: [`Proxy::host_client`]); the OS events registered; then every object
//! in topological order (parent, the objects its params name, a dup's source first), with its
//! recorded params: fd fields to the new host files, `NV0080_ALLOC_PARAMETERS.deviceId` to the
//! new device instance, client handles translated. Each object must get its own handle back
//! and, where the client may keep outputs, the same outputs. Any failure drops every host
//! file opened so far, which makes the driver free everything replayed (`RmFreeUnusedClients`):
//! no partial restore.

use std::collections::{BTreeMap, HashMap};
use std::mem::offset_of;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use host_driver::{HostCall, HostDriver, HostFile, NESTED_PTR_PLACEHOLDER, NestedBuf, NodeKind};
use nvproxy_abi::fd_field;
use nvproxy_abi::ioctl::{NV_ESC_RM_ALLOC_NVOS64, nv_iowr};
use nvproxy_abi::structs::{
    NV0005_ALLOC_PARAMETERS, NV0080_ALLOC_PARAMETERS, NV83DE_ALLOC_PARAMETERS, NVOS55_PARAMETERS,
    NVOS64_PARAMETERS, nv_ioctl_alloc_os_event_t, nv_ioctl_register_fd_t,
};
use tracing::{debug, info};
use zerocopy::{FromZeros, IntoBytes};

use crate::checkpoint::{
    Checkpoint, CheckpointError, DeviceIdentity, SavedNode, check_remappable, identify_host_gpus,
};
use crate::nv::*;
use crate::objects::{AllocRecord, Client, ObjectTable, Origin, OwnerId};
use crate::plan::{rd32, wr32, wr64};
use crate::policy::InstancePolicy;
use crate::proxy::{OpenFile, Proxy};

/// Names a GPU in a remap rule: its host minor or its UUID (`GPU-...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuRef {
    /// `/dev/nvidia<minor>`.
    Minor(u32),
    /// `GPU-xxxxxxxx-...`.
    Uuid(String),
}

impl GpuRef {
    fn matches(&self, id: &DeviceIdentity) -> bool {
        match self {
            GpuRef::Minor(m) => id.minor == *m,
            GpuRef::Uuid(u) => id.uuid.eq_ignore_ascii_case(u),
        }
    }
}

impl std::fmt::Display for GpuRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuRef::Minor(m) => write!(f, "GPU {m}"),
            GpuRef::Uuid(u) => f.write_str(u),
        }
    }
}

impl FromStr for GpuRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.starts_with("GPU-") {
            return crate::checkpoint::parse_uuid(s)
                .map(|_| GpuRef::Uuid(s.to_owned()))
                .ok_or_else(|| format!("{s:?} is not a GPU UUID"));
        }
        s.parse()
            .map(GpuRef::Minor)
            .map_err(|_| format!("{s:?} is neither a minor number nor a GPU UUID"))
    }
}

/// `OLD=NEW`: the saved GPU `old` is restored onto the host's GPU `new`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemapRule {
    /// A GPU of the checkpoint (its saved minor or UUID).
    pub old: GpuRef,
    /// A GPU of this host.
    pub new: GpuRef,
}

impl FromStr for RemapRule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: a remap is OLD=NEW"))?;
        Ok(RemapRule {
            old: a.trim().parse()?,
            new: b.trim().parse()?,
        })
    }
}

/// Matches each saved GPU to a host GPU: a rule naming it, else the host GPU with its UUID.
/// Refuses a missing GPU, two saved GPUs on one host GPU, a pair of different kinds
/// (heterogeneous hardware) and non-zero subdevice instances, each with its reason.
pub fn make_remapping(
    saved: &[DeviceIdentity],
    host: &[DeviceIdentity],
    rules: &[RemapRule],
) -> Result<Vec<(DeviceIdentity, DeviceIdentity)>, CheckpointError> {
    let remap = |m: String| CheckpointError::Remap(m);
    if saved.len() > host.len() {
        return Err(remap(format!(
            "can't remap {} saved devices to {} host devices",
            saved.len(),
            host.len()
        )));
    }
    for r in rules {
        if !saved.iter().any(|s| r.old.matches(s)) {
            return Err(remap(format!(
                "remap {}: no such GPU in the checkpoint",
                r.old
            )));
        }
    }
    check_remappable(saved).map_err(remap)?;
    let mut pairs: Vec<(DeviceIdentity, DeviceIdentity)> = Vec::with_capacity(saved.len());
    for s in saved {
        let new = match rules.iter().find(|r| r.old.matches(s)) {
            Some(r) => host.iter().find(|h| r.new.matches(h)).ok_or_else(|| {
                remap(format!("remap {}={}: no such GPU on this host", r.old, r.new))
            })?,
            None => host.iter().find(|h| h.uuid == s.uuid).ok_or_else(|| {
                remap(format!(
                    "saved GPU {s} is not on this host (no GPU with its UUID); name its new GPU with a remap OLD=NEW"
                ))
            })?,
        };
        if let Some((o, _)) = pairs.iter().find(|(_, n)| n.minor == new.minor) {
            return Err(remap(format!(
                "saved GPUs {o} and {s} both map to host GPU {new}"
            )));
        }
        if (s.pci_vendor_id, s.pci_device_id) != (new.pci_vendor_id, new.pci_device_id) {
            return Err(remap(format!(
                "can't remap with heterogeneous GPUs: saved device {s} and host device {new} have different PCI vendor/device IDs"
            )));
        }
        pairs.push((s.clone(), new.clone()));
    }
    let news: Vec<DeviceIdentity> = pairs.iter().map(|(_, n)| n.clone()).collect();
    check_remappable(&news).map_err(remap)?;
    Ok(pairs)
}

/// The instance's configuration is the contract, not the file being restored: every GPU a
/// restore would create objects on (each pair's new GPU, after the remap rules) must be one of
/// the instance's GPUs (`policy.gpus`, host minors). A checkpoint of another instance (its
/// `instance` field edited) or a remap onto another instance's GPU is refused, naming the
/// checkpoint's GPUs, where they would go, and the instance's set.
fn check_in_set(
    pairs: &[(DeviceIdentity, DeviceIdentity)],
    policy: &InstancePolicy,
    host: &[DeviceIdentity],
) -> Result<(), CheckpointError> {
    let outside: Vec<&DeviceIdentity> = pairs
        .iter()
        .map(|(_, n)| n)
        .filter(|n| !policy.gpus.contains(&n.minor))
        .collect();
    if outside.is_empty() {
        return Ok(());
    }
    let name = |m: u32| match host.iter().find(|h| h.minor == m) {
        Some(h) => format!("minor {m} {}", h.uuid),
        None => format!("minor {m}"),
    };
    let list = |v: Vec<String>| format!("[{}]", v.join(", "));
    Err(CheckpointError::Remap(format!(
        "instance {}'s GPU set is {}; the checkpoint's GPUs {} would be restored onto {}, \
         and {} outside the set: a restore only creates objects on the instance's GPUs \
         (name GPUs of its set with --remap OLD=NEW)",
        policy.name,
        list(policy.gpus.iter().map(|&m| name(m)).collect()),
        list(
            pairs
                .iter()
                .map(|(o, _)| format!("minor {} {}", o.minor, o.uuid))
                .collect()
        ),
        list(pairs.iter().map(|(_, n)| name(n.minor)).collect()),
        list(outside.iter().map(|n| name(n.minor)).collect()),
    )))
}

/// What a restore made: the proxy and the GPU pairs (saved, new) in the tenant's order.
#[derive(Debug)]
pub struct Restored {
    /// The instance's proxy on the new host files, with the saved opens, handles and table.
    pub proxy: Proxy,
    /// The remapping used.
    pub gpus: Vec<(DeviceIdentity, DeviceIdentity)>,
}

fn replay_err(what: impl Into<String>, why: impl Into<String>) -> CheckpointError {
    CheckpointError::Replay {
        what: what.into(),
        why: why.into(),
    }
}

/// One host ioctl of a replay; an errno is a replay failure.
fn call(
    file: &dyn HostFile,
    c: &mut HostCall,
    what: &dyn Fn() -> String,
) -> Result<i32, CheckpointError> {
    file.ioctl(c)
        .map_err(|e| replay_err(what(), format!("host ioctl failed: {e}")))
}

/// The NVOS64 `RM_ALLOC` of a record; returns (status, handle, params after).
fn alloc_call(
    file: &dyn HostFile,
    h_root: u32,
    h_parent: u32,
    h_new: u32,
    rec: &AllocRecord,
    params: Option<Vec<u8>>,
    what: &dyn Fn() -> String,
) -> Result<(u32, u32, Option<Vec<u8>>), CheckpointError> {
    let mut top = NVOS64_PARAMETERS::new_zeroed();
    top.hRoot = h_root;
    top.hObjectParent = h_parent;
    top.hObjectNew = h_new;
    top.hClass = rec.class;
    let mut nested = host_driver::NestedBufs::new();
    if let Some(p) = params {
        top.pAllocParms = NESTED_PTR_PLACEHOLDER;
        top.paramsSize =
            u32::try_from(p.len()).map_err(|_| replay_err(what(), "params larger than 4 GiB"))?;
        nested.push(NestedBuf {
            parent: None,
            offset: offset_of!(NVOS64_PARAMETERS, pAllocParms),
            data: p.into(),
        });
    }
    if let Some(r) = rec.rights {
        top.pRightsRequested = NESTED_PTR_PLACEHOLDER;
        nested.push(NestedBuf {
            parent: None,
            offset: offset_of!(NVOS64_PARAMETERS, pRightsRequested),
            data: r.to_ne_bytes().as_slice().into(),
        });
    }
    let mut c = HostCall {
        cmd: NV_ESC_RM_ALLOC_NVOS64,
        params: top.as_bytes().into(),
        nested,
    };
    call(file, &mut c, what)?;
    let status = rd32(&c.params, offset_of!(NVOS64_PARAMETERS, status));
    let h = rd32(&c.params, offset_of!(NVOS64_PARAMETERS, hObjectNew));
    let out = c
        .nested
        .into_iter()
        .find(|n| n.offset == offset_of!(NVOS64_PARAMETERS, pAllocParms))
        .map(|n| n.data.into_vec());
    Ok((status, h, out))
}

/// Client-handle fields of alloc params (offset), by class.
pub(crate) fn client_fields(class: u32) -> &'static [usize] {
    const EVENT: [usize; 1] = [offset_of!(NV0005_ALLOC_PARAMETERS, hParentClient)];
    const DEVICE: [usize; 2] = [
        offset_of!(NV0080_ALLOC_PARAMETERS, hClientShare),
        offset_of!(NV0080_ALLOC_PARAMETERS, hTargetClient),
    ];
    const DEBUGGER: [usize; 1] = [offset_of!(NV83DE_ALLOC_PARAMETERS, hAppClient)];
    match class {
        NV01_EVENT_OS_EVENT => &EVENT,
        NV01_DEVICE_0 => &DEVICE,
        GT200_DEBUGGER => &DEBUGGER,
        _ => &[],
    }
}

/// The replay in progress: new host files by open id, the client translation, the device
/// instance remap.
struct Replay {
    files: BTreeMap<u64, Arc<dyn HostFile>>,
    clients: BTreeMap<u32, u32>,
    devices: BTreeMap<u32, u32>,
}

impl Replay {
    fn file(
        &self,
        open: u64,
        what: &dyn Fn() -> String,
    ) -> Result<Arc<dyn HostFile>, CheckpointError> {
        self.files
            .get(&open)
            .cloned()
            .ok_or_else(|| replay_err(what(), format!("open {open} is not in the checkpoint")))
    }

    fn host_client(&self, h: u32) -> u32 {
        self.clients.get(&h).copied().unwrap_or(h)
    }

    /// The params to send for `rec` of an object of `class`: fds, device instance and client
    /// handles translated.
    fn params_for(
        &self,
        class: u32,
        rec: &AllocRecord,
        what: &dyn Fn() -> String,
    ) -> Result<Option<Vec<u8>>, CheckpointError> {
        let Some(mut p) = rec.params().map(<[u8]>::to_vec) else {
            return Ok(None);
        };
        for f in &rec.fds {
            let id = self.file(f.open, what)?.id();
            if p.len() < f.offset + 8 {
                return Err(replay_err(what(), "fd field outside the params"));
            }
            wr64(&mut p, f.offset, fd_field::to_u64(id));
        }
        if class == NV01_DEVICE_0 {
            let off = offset_of!(NV0080_ALLOC_PARAMETERS, deviceId);
            let old = rd32(&p, off);
            let new = self.devices.get(&old).copied().ok_or_else(|| {
                replay_err(
                    what(),
                    format!("device instance {old} is not one of the saved GPUs"),
                )
            })?;
            wr32(&mut p, off, new);
        }
        for &off in client_fields(class) {
            let h = rd32(&p, off);
            if h != 0 {
                wr32(&mut p, off, self.host_client(h));
            }
        }
        Ok(Some(p))
    }

    /// What the client would now read back, to compare with what it read at the time: the
    /// fields replay translated are put back to the client's values.
    fn client_view(&self, class: u32, rec: &AllocRecord, mut out: Vec<u8>) -> Vec<u8> {
        let given = rec.params().unwrap_or(&[]);
        let mut keep = |off: usize, len: usize| {
            if let (Some(d), Some(s)) = (out.get_mut(off..off + len), given.get(off..off + len)) {
                d.copy_from_slice(s);
            }
        };
        for f in &rec.fds {
            keep(f.offset, 8);
        }
        if class == NV01_DEVICE_0 {
            keep(offset_of!(NV0080_ALLOC_PARAMETERS, deviceId), 4);
        }
        for &off in client_fields(class) {
            keep(off, 4);
        }
        out
    }
}

/// Objects of all clients in replay order: each after its parent, the objects it depends on
/// and a dup's source (the seed's depth-first topological sort). A cycle is refused.
fn replay_order(ckpt: &Checkpoint) -> Result<Vec<(u32, u32)>, CheckpointError> {
    let mut objs: HashMap<(u32, u32), Vec<(u32, u32)>> = HashMap::new();
    for c in &ckpt.clients {
        for o in &c.objects {
            let mut before = Vec::new();
            if o.parent != c.handle {
                before.push((c.handle, o.parent));
            }
            before.extend(
                o.deps
                    .iter()
                    .filter(|&&d| d != c.handle)
                    .map(|&d| (c.handle, d)),
            );
            if let Origin::Dup {
                src_client,
                src_object,
                ..
            } = o.origin
                && src_object != src_client
            {
                before.push((src_client, src_object));
            }
            objs.insert((c.handle, o.handle), before);
        }
    }
    let mut done: BTreeMap<(u32, u32), bool> = BTreeMap::new(); // false: in progress
    let mut order = Vec::with_capacity(objs.len());
    let mut keys: Vec<(u32, u32)> = objs.keys().copied().collect();
    keys.sort_unstable();
    for k in keys {
        // Iterative DFS: (node, next dependency index).
        let mut stack: Vec<((u32, u32), usize)> = vec![(k, 0)];
        while let Some(&mut (n, ref mut i)) = stack.last_mut() {
            if *i == 0 {
                match done.get(&n) {
                    Some(true) => {
                        stack.pop();
                        continue;
                    }
                    Some(false) => {
                        return Err(replay_err(
                            format!("client {:#x} object {:#x}", n.0, n.1),
                            "circular dependency",
                        ));
                    }
                    None => {
                        done.insert(n, false);
                    }
                }
            }
            let deps = objs.get(&n).map_or(&[][..], Vec::as_slice);
            if let Some(&d) = deps.get(*i) {
                *i += 1;
                if !objs.contains_key(&d) {
                    return Err(replay_err(
                        format!("client {:#x} object {:#x}", n.0, n.1),
                        format!(
                            "depends on {:#x}:{:#x}, which is not in the checkpoint",
                            d.0, d.1
                        ),
                    ));
                }
                if done.get(&d) != Some(&true) {
                    if done.get(&d) == Some(&false) {
                        return Err(replay_err(
                            format!("client {:#x} object {:#x}", n.0, n.1),
                            "circular dependency",
                        ));
                    }
                    stack.push((d, 0));
                }
                continue;
            }
            done.insert(n, true);
            order.push(n);
            stack.pop();
        }
    }
    Ok(order)
}

impl Proxy {
    /// Restores `ckpt` onto `host`: the instance's policy is `policy` with its GPUs replaced by
    /// the remapped ones (tenant order kept). See the module docs; on any failure nothing
    /// stays allocated in the driver.
    pub fn restore(
        ckpt: &Checkpoint,
        mut policy: InstancePolicy,
        host: Arc<dyn HostDriver>,
        rules: &[RemapRule],
    ) -> Result<Restored, CheckpointError> {
        ckpt.validate()?;
        let host_version = host.version().trim().to_owned();
        if host_version != ckpt.driver_version {
            return Err(CheckpointError::Driver {
                saved: ckpt.driver_version.clone(),
                host: host_version,
            });
        }
        let ids = identify_host_gpus(&*host)?;
        let pairs = make_remapping(&ckpt.gpus, &ids, rules)?;
        check_in_set(&pairs, &policy, &ids)?;
        policy.gpus = pairs.iter().map(|(_, n)| n.minor).collect();
        // The instance's quotas hold for what it gets back too.
        let q = policy.quotas;
        let objects: usize = ckpt.clients.iter().map(|c| 1 + c.objects.len()).sum();
        if ckpt.opens.len() + ckpt.uvm.len() > q.open_files || objects > q.objects {
            return Err(replay_err(
                "the checkpoint",
                format!(
                    "{} opens and {objects} objects exceed the instance's quotas ({} and {})",
                    ckpt.opens.len() + ckpt.uvm.len(),
                    q.open_files,
                    q.objects
                ),
            ));
        }
        // And its memory quotas: what the objects held when saved (each block once), per GPU
        // and in the host's pool, must fit the quotas it is restored under.
        if q.gpu_memory.is_some() || q.system_memory.is_some() {
            let mut blocks = BTreeMap::new();
            for o in ckpt.clients.iter().flat_map(|c| &c.objects) {
                if let Some(v) = o.vid {
                    blocks.insert(v.block, (v.gpu, v.bytes));
                }
            }
            let mut per_pool: BTreeMap<u32, u64> = BTreeMap::new();
            for (pool, bytes) in blocks.into_values() {
                let e = per_pool.entry(pool).or_default();
                *e = e.saturating_add(bytes);
            }
            for (pool, bytes) in per_pool {
                let host = pool == crate::objects::HOST_POOL;
                let quota = if host { q.system_memory } else { q.gpu_memory };
                let Some(quota) = quota.filter(|&quota| bytes > quota) else {
                    continue;
                };
                let what = if host {
                    "system memory".to_owned()
                } else {
                    format!("video memory on GPU id {pool:#x}")
                };
                return Err(replay_err(
                    "the checkpoint",
                    format!(
                        "its objects hold {bytes} bytes of {what}, more than the instance's \
                         quota of {quota}"
                    ),
                ));
            }
        }
        let proxy = Proxy::for_host(policy, host)?;
        let mut r = Replay {
            files: BTreeMap::new(),
            clients: BTreeMap::new(),
            devices: pairs
                .iter()
                .map(|(o, n)| (o.device_instance, n.device_instance))
                .collect(),
        };
        let gpu_ids: BTreeMap<u32, u32> = pairs.iter().map(|(o, n)| (o.gpu_id, n.gpu_id)).collect();

        // Fresh host files, one per saved open.
        for o in &ckpt.opens {
            let node = match o.node {
                SavedNode::Ctl => NodeKind::Ctl,
                SavedNode::Gpu(i) => NodeKind::Gpu(
                    proxy
                        .gpus
                        .get(i as usize)
                        .ok_or_else(|| replay_err(format!("open {}", o.id), format!("no GPU {i}")))?
                        .minor,
                ),
            };
            let f = proxy.host.open(node).map_err(|e| {
                replay_err(format!("open {}", o.id), format!("host open failed: {e}"))
            })?;
            r.files.insert(o.id, f);
        }
        // REGISTER_FD and ATTACH_GPUS_TO_FD.
        for o in &ckpt.opens {
            let what = || format!("open {} REGISTER_FD", o.id);
            let f = r.file(o.id, &what)?;
            if let Some(ctl) = o.registered_ctl {
                let p = nv_ioctl_register_fd_t {
                    ctl_fd: r.file(ctl, &what)?.id(),
                };
                let mut c = HostCall {
                    cmd: nvproxy_abi::ioctl::NV_ESC_REGISTER_FD_CMD,
                    params: p.as_bytes().into(),
                    nested: Default::default(),
                };
                call(&*f, &mut c, &what)?;
            }
            if let Some(list) = &o.attached {
                let what = || format!("open {} ATTACH_GPUS_TO_FD", o.id);
                let mut params = Vec::with_capacity(4 * list.len());
                for id in list {
                    let new = gpu_ids.get(id).ok_or_else(|| {
                        replay_err(
                            what(),
                            format!("GPU id {id:#x} is not one of the saved GPUs"),
                        )
                    })?;
                    params.extend_from_slice(&new.to_ne_bytes());
                }
                let mut c = HostCall {
                    cmd: nv_iowr(nvproxy_abi::ioctl::NV_ESC_ATTACH_GPUS_TO_FD, params.len()),
                    params: params.into(),
                    nested: Default::default(),
                };
                call(&*f, &mut c, &what)?;
            }
        }
        // Clients, with their own handles where the driver lets them.
        for c in &ckpt.clients {
            let what = || format!("client {:#x}", c.handle);
            let Origin::Alloc(rec) = &c.origin else {
                return Err(replay_err(what(), "no allocation record"));
            };
            let f = r.file(c.owner, &what)?;
            let params = rec.params().map(<[u8]>::to_vec);
            let (mut s, mut h, _) = alloc_call(&*f, c.handle, 0, 0, rec, params.clone(), &what)?;
            if s == NV_ERR_INSERT_DUPLICATE_NAME {
                // Another process of the host holds that client handle now: take the driver's
                // choice and translate.
                (s, h, _) = alloc_call(&*f, 0, 0, 0, rec, params, &what)?;
            }
            if s != NV_OK {
                return Err(replay_err(what(), format!("status {s:#x}")));
            }
            if h != c.handle {
                info!(old = c.handle, new = h, "client handle translated");
                r.clients.insert(c.handle, h);
            }
        }
        // OS events.
        for o in &ckpt.opens {
            for e in &o.os_events {
                let what = || format!("open {} OS event of client {:#x}", o.id, e.h_client);
                let f = r.file(o.id, &what)?;
                let mut p = nv_ioctl_alloc_os_event_t::new_zeroed();
                p.hClient = r.host_client(e.h_client);
                p.hDevice = e.h_device;
                p.fd = r.file(e.fd_open, &what)?.id();
                let mut c = HostCall {
                    cmd: nv_iowr(
                        nvproxy_abi::ioctl::NV_ESC_ALLOC_OS_EVENT,
                        size_of::<nv_ioctl_alloc_os_event_t>(),
                    ),
                    params: p.as_bytes().into(),
                    nested: Default::default(),
                };
                call(&*f, &mut c, &what)?;
                let s = rd32(&c.params, offset_of!(nv_ioctl_alloc_os_event_t, Status));
                if s != NV_OK {
                    return Err(replay_err(what(), format!("status {s:#x}")));
                }
            }
        }
        // Objects, in dependency order.
        let by_client: BTreeMap<u32, &crate::checkpoint::SavedClient> =
            ckpt.clients.iter().map(|c| (c.handle, c)).collect();
        for (hc, ho) in replay_order(ckpt)? {
            let c = by_client[&hc];
            let o = c
                .objects
                .iter()
                .find(|o| o.handle == ho)
                .expect("in the order because it is in the checkpoint");
            let name = proxy.abi.classes.get(&o.class).map_or("?", |s| s.name);
            let what = || format!("client {hc:#x} object {ho:#x} ({name} {:#06x})", o.class);
            let f = r.file(c.owner, &what)?;
            let host_c = r.host_client(hc);
            let parent = if o.parent == hc { host_c } else { o.parent };
            match &o.origin {
                Origin::Alloc(rec) => {
                    let params = r.params_for(o.class, rec, &what)?;
                    let (s, h, out) = alloc_call(&*f, host_c, parent, ho, rec, params, &what)?;
                    if s != NV_OK {
                        return Err(replay_err(what(), format!("status {s:#x}")));
                    }
                    if h != ho {
                        return Err(replay_err(what(), format!("the driver gave handle {h:#x}")));
                    }

                    let seen = out.map(|b| r.client_view(o.class, rec, b));
                    if let (Some(was), Some(now)) = (rec.out(), &seen)
                        && was != now
                    {
                        let at = was.iter().zip(now).position(|(a, b)| a != b).unwrap_or(0);
                        return Err(replay_err(
                            what(),
                            format!(
                                "the driver's answer differs from the one the client kept (first at byte {at})"
                            ),
                        ));
                    }
                }
                Origin::Dup {
                    src_client,
                    src_object,
                    flags,
                } => {
                    let mut p = NVOS55_PARAMETERS::new_zeroed();
                    p.hClient = host_c;
                    p.hParent = parent;
                    p.hObject = ho;
                    p.hClientSrc = r.host_client(*src_client);
                    p.hObjectSrc = if src_object == src_client {
                        p.hClientSrc
                    } else {
                        *src_object
                    };
                    p.flags = *flags;
                    let mut c = HostCall {
                        cmd: nv_iowr(
                            nvproxy_abi::ioctl::NV_ESC_RM_DUP_OBJECT,
                            size_of::<NVOS55_PARAMETERS>(),
                        ),
                        params: p.as_bytes().into(),
                        nested: Default::default(),
                    };
                    call(&*f, &mut c, &what)?;
                    let s = rd32(&c.params, offset_of!(NVOS55_PARAMETERS, status));
                    let h = rd32(&c.params, offset_of!(NVOS55_PARAMETERS, hObject));
                    if s != NV_OK || h != ho {
                        return Err(replay_err(what(), format!("status {s:#x}, handle {h:#x}")));
                    }
                }
                Origin::Unreplayable(why) => return Err(replay_err(what(), why.clone())),
            }
            debug!(client = hc, object = ho, class = o.class, "replayed");
        }

        // The proxy takes the files, the table and the translation. The records speak of the
        // driver they now live on: a device's `deviceId` is the new device instance (the
        // identities of a later save are this driver's).
        let rebase = |class: u32, origin: &Origin| -> Origin {
            let mut origin = origin.clone();
            if let (NV01_DEVICE_0, Origin::Alloc(rec)) = (class, &mut origin) {
                let off = offset_of!(NV0080_ALLOC_PARAMETERS, deviceId);
                let (p, o) = rec.params_and_out_mut();
                for b in [p, o].into_iter().flatten() {
                    if let Some(new) = r.devices.get(&rd32(b, off)) {
                        wr32(b, off, *new);
                    }
                }
            }
            origin
        };
        let mut clients = BTreeMap::new();
        for c in &ckpt.clients {
            let objects = c
                .objects
                .iter()
                .map(|o| {
                    let mut object = o.object(rebase(o.class, &o.origin));
                    // The memory it holds counts on the GPU it now lives on.
                    if let Some(c) = object.vid.as_mut()
                        && c.gpu != crate::objects::HOST_POOL
                    {
                        c.gpu = gpu_ids.get(&c.gpu).copied().unwrap_or(c.gpu);
                    }
                    (o.handle, object)
                })
                .collect();
            clients.insert(
                c.handle,
                Client::new(
                    c.handle,
                    OwnerId(c.owner),
                    c.class,
                    c.origin.clone(),
                    objects,
                ),
            );
        }
        *proxy.objects() = ObjectTable::from_clients(clients);
        for (&t, &h) in &r.clients {
            proxy.map_client(t, h);
        }
        let max_id = ckpt
            .opens
            .iter()
            .map(|o| o.id)
            .chain(ckpt.uvm.iter().map(|u| u.id))
            .max()
            .unwrap_or(0);
        proxy.bump_open_ids(max_id + 1);
        {
            let mut opens = proxy.opens();
            for o in &ckpt.opens {
                let node = o.proxy_node();
                let rec = o.record(|id| gpu_ids.get(&id).copied().unwrap_or(id), false);
                let host = r.files.remove(&o.id).expect("opened above");
                opens.insert(
                    OwnerId(o.id),
                    Arc::new(OpenFile {
                        node,
                        host,
                        mapping: std::sync::Mutex::default(),
                        record: std::sync::Mutex::new(rec),
                    }),
                );
                proxy.open_files.fetch_add(1, Ordering::AcqRel);
            }
        }
        proxy.recount_holders();
        info!(
            instance = %proxy.policy.name,
            opens = ckpt.opens.len(),
            objects = proxy.object_count(),
            translated_clients = r.clients.len(),
            "restored"
        );
        Ok(Restored { proxy, gpus: pairs })
    }
}
