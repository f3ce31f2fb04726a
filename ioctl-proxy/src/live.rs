//! A serving proxy's state handed to another process (a live upgrade of the worker).
//!
//! Unlike a checkpoint (`checkpoint.rs`), which records what to *re-create* on a fresh driver,
//! this moves the state of a proxy whose driver keeps everything: the same host files (the
//! real driver's fds travel with `SCM_RIGHTS`, a simulated driver process's by handle,
//! [`HostFile::hand_over`]), the same RM handles, the same open ids (the kernel's CUSE `fh`
//! of each open file). Nothing is refused for being unreplayable: channels, mmap contexts and
//! DMA mappings stay in the driver as they are. The new proxy is built as usual
//! ([`Proxy::new`]) and takes the tables over ([`Proxy::adopt_live`]) before it serves.
//!
//! The caller guarantees no request runs on the exporting proxy (the CUSE sessions are
//! suspended); the export holds the RM mutation lock besides.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use host_driver::{HandedFile, HostFile};

use crate::audit::CountRow;
use crate::checkpoint::{SavedClient, SavedOpen};
use crate::error::ProxyError;
use crate::mapping_slot::MappingSlot;
use crate::objects::{Client, OwnerId};
use crate::policy::{InstancePolicy, Mode};
use crate::proxy::{Node, OpenFile, Proxy, lock};

/// One frontend open while it serves: its saved form (as a checkpoint has it) and what a
/// live upgrade carries besides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveOpen {
    /// Its id (the CUSE `fh` the kernel keeps for the client's open file), node, record.
    #[serde(flatten)]
    pub saved: SavedOpen,
    /// Its host file: an index into the handed files.
    pub host: usize,
    /// Its mapping host file, if it was ever an mmap target: an index into the handed files.
    #[serde(default)]
    pub mapping: Option<usize>,
    /// The mapping file holds an mmap context.
    #[serde(default)]
    pub context: bool,
    /// More OS events than recorded.
    #[serde(default)]
    pub os_events_overflow: bool,
    /// Closed by the tenant, kept by another open's `REGISTER_FD` (`Proxy::release`);
    /// written only when set, so the layout stays the older workers'.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lingering: bool,
}

/// A frontend proxy's tables while it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveProxy {
    /// The next open id to give.
    pub next_open: u64,
    /// The frontend opens.
    pub opens: Vec<LiveOpen>,
    /// The RM clients and their objects (with their records, so a later checkpoint works).
    pub clients: Vec<SavedClient>,
    /// Device instance → GPU id learned from the driver's answers.
    #[serde(default)]
    pub devices: Vec<(u32, u32)>,
    /// Live `RM_MAP_MEMORY_DMA` mappings: (client, hDma, hMemory, count).
    #[serde(default)]
    pub dma_maps: Vec<(u32, u32, u32, u32)>,
    /// More DMA mappings than tracked.
    #[serde(default)]
    pub dma_overflow: bool,
    /// Client handle translations of an earlier restore: (tenant, host).
    #[serde(default)]
    pub clients_map: Vec<(u32, u32)>,
    /// The instance's audit counts.
    #[serde(default)]
    pub counts: Vec<CountRow>,
    /// Video memory the instance's files keep counted besides its objects (exports, UVM
    /// external mappings): (owner open, key, charge) (absent in an older worker's state).
    #[serde(default)]
    pub vid_holds: Vec<(u64, u64, crate::objects::VidCharge)>,
}

/// An instance's policy as it was served (a live upgrade keeps it: the new worker serves what
/// the old one did, whatever its configuration files say now).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivePolicy {
    /// The instance.
    pub name: String,
    /// Capability names.
    pub caps: Vec<String>,
    /// Host minors in the tenant's order.
    pub gpus: Vec<u32>,
    /// `enforce` or `audit`.
    pub mode: String,
    /// Allowed beyond the caps.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Denied although the caps allow.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Allowlist-only entries.
    #[serde(default)]
    pub only: Option<Vec<String>>,
    /// `uvm_mmap`.
    pub uvm_mmap: bool,
    /// Quotas: open files, objects, in flight.
    pub quotas: [usize; 3],
    /// `Quotas::os_descriptor_bytes` (absent in an older worker's state: the default).
    #[serde(default)]
    pub os_descriptor_bytes: Option<u64>,
    /// `Quotas::gpu_memory` (absent: no quota).
    #[serde(default)]
    pub gpu_memory: Option<u64>,
    /// `Quotas::system_memory` (absent: no quota, all an older worker had).
    #[serde(default)]
    pub system_memory: Option<u64>,
    /// The interleave level of the instance's channel groups (absent in an older worker's
    /// state: medium, all there was).
    #[serde(default)]
    pub priority: crate::schedule::Priority,
}

impl LivePolicy {
    /// The policy `p` as the state carries it.
    pub fn of(p: &InstancePolicy) -> LivePolicy {
        LivePolicy {
            name: p.name.clone(),
            caps: p.caps.names().map(str::to_owned).collect(),
            gpus: p.gpus.clone(),
            mode: match p.mode {
                Mode::Enforce => "enforce".into(),
                Mode::Audit => "audit".into(),
            },
            allow: p.allow.iter().cloned().collect(),
            deny: p.deny.iter().cloned().collect(),
            only: p.only.as_ref().map(|o| o.iter().cloned().collect()),
            uvm_mmap: p.uvm_mmap,
            quotas: [p.quotas.open_files, p.quotas.objects, p.quotas.in_flight],
            os_descriptor_bytes: Some(p.quotas.os_descriptor_bytes),
            gpu_memory: p.quotas.gpu_memory,
            system_memory: p.quotas.system_memory,
            priority: p.priority,
        }
    }

    /// The policy again; an unknown capability or mode is refused.
    pub fn to_policy(&self) -> Result<InstancePolicy, ProxyError> {
        let mut caps = nvproxy_abi::Caps::NONE;
        for c in &self.caps {
            caps = caps.union(
                nvproxy_abi::Caps::from_name(c)
                    .ok_or_else(|| bad(format!("unknown capability {c:?}")))?,
            );
        }
        let mut p = InstancePolicy::new(self.name.clone(), caps, self.gpus.clone());
        p.mode = match self.mode.as_str() {
            "enforce" => Mode::Enforce,
            "audit" => Mode::Audit,
            m => return Err(bad(format!("unknown mode {m:?}"))),
        };
        p.allow = self.allow.iter().cloned().collect();
        p.deny = self.deny.iter().cloned().collect();
        p.only = self.only.as_ref().map(|o| o.iter().cloned().collect());
        p.uvm_mmap = self.uvm_mmap;
        p.quotas = crate::policy::Quotas {
            open_files: self.quotas[0],
            objects: self.quotas[1],
            in_flight: self.quotas[2],
            os_descriptor_bytes: self
                .os_descriptor_bytes
                .unwrap_or(crate::policy::Quotas::default().os_descriptor_bytes),
            gpu_memory: self.gpu_memory,
            system_memory: self.system_memory,
        };
        p.priority = self.priority;
        Ok(p)
    }
}

fn bad(what: String) -> ProxyError {
    ProxyError::Config(format!("live state: {what}"))
}

/// Takes file `i` of `files` (each may be taken once).
pub fn take_file(files: &mut [Option<HandedFile>], i: usize) -> Result<HandedFile, ProxyError> {
    files
        .get_mut(i)
        .and_then(Option::take)
        .ok_or_else(|| bad(format!("host file {i} missing or named twice")))
}

impl Proxy {
    /// The proxy's tables and its host files, handed over (each file stays this process's
    /// too). Fails when the driver cannot hand its files to another process (a simulated
    /// driver inside this process).
    pub fn export_live(&self) -> Result<(LiveProxy, Vec<HandedFile>), ProxyError> {
        let _rm = self.rm_lock();
        let mut files = Vec::new();
        let mut push = |f: &Arc<dyn HostFile>| -> Result<usize, ProxyError> {
            files.push(f.hand_over().map_err(|e| {
                ProxyError::Config(format!(
                    "the driver cannot hand its files to another process ({e}); a live \
                     upgrade needs the host driver or a simulated driver process \
                     ([sim] process = true)"
                ))
            })?);
            Ok(files.len() - 1)
        };
        let mut opens = Vec::new();
        let live_opens = self.opens();
        let lingering = self.lingering();
        let all = live_opens
            .iter()
            .map(|(&id, f)| (id, f, false))
            .chain(lingering.iter().map(|(&id, f)| (id, f, true)));
        for (id, f, lingers) in all {
            let rec = lock(&f.record).clone();
            let Some(saved) = SavedOpen::of(id, f.node, &rec) else {
                continue;
            };
            let host = push(&f.host)?;
            let (mfile, context) = lock(&f.mapping).live_parts();
            let mapping = match &mfile {
                Some(m) => Some(push(m)?),
                None => None,
            };
            opens.push(LiveOpen {
                saved,
                host,
                mapping,
                context,
                os_events_overflow: rec.os_events_overflow,
                lingering: lingers,
            });
        }
        drop((lingering, live_opens));
        opens.sort_by_key(|o| o.saved.id);
        let clients = self
            .objects()
            .clients
            .iter()
            .map(|(&h, c)| SavedClient::of(h, c))
            .collect();
        let (dma_maps, dma_overflow) = {
            let d = lock(&self.dma_maps);
            (
                d.live.iter().map(|(&(c, a, m), &n)| (c, a, m, n)).collect(),
                d.overflow,
            )
        };
        let live = LiveProxy {
            next_open: self.next_open.load(std::sync::atomic::Ordering::Acquire),
            opens,
            clients,
            devices: lock(&self.devices).iter().map(|(&a, &b)| (a, b)).collect(),
            dma_maps,
            dma_overflow,
            clients_map: lock(&self.clients_map)
                .to_host
                .iter()
                .map(|(&t, &h)| (t, h))
                .collect(),
            counts: self.counts.snapshot(),
            vid_holds: self
                .objects()
                .vid_holds()
                .into_iter()
                .map(|(o, k, c)| (o.0, k, c))
                .collect(),
        };
        Ok((live, files))
    }

    /// Takes over the tables of [`Proxy::export_live`] on a proxy that has served nothing yet,
    /// adopting the host files from `files` (by index; the rest, e.g. the UVM proxy's, are
    /// left). Checked as far as the tables' own rules go (unique ids and handles, parents and
    /// dependencies present, owners among the opens, each file used once) before any file is
    /// adopted; on an error the proxy must be dropped (it adopted nothing: a file it had
    /// adopted when the driver refused another is forgotten, never closed).
    pub fn adopt_live(
        &self,
        live: LiveProxy,
        files: &mut [Option<HandedFile>],
    ) -> Result<(), ProxyError> {
        let _rm = self.rm_lock();
        if !self.opens().is_empty() || !self.objects().clients.is_empty() {
            return Err(bad("the proxy already serves".into()));
        }
        // Everything is checked before the first file is adopted: an adopted file dropped
        // here would close the driver's file, which the old worker still serves.
        let mut nodes = Vec::with_capacity(live.opens.len());
        let mut ids = std::collections::BTreeSet::new();
        let mut used = std::collections::BTreeSet::new();
        for o in &live.opens {
            let id = o.saved.id;
            let node = o.saved.proxy_node();
            if let Node::Gpu(i) = node
                && !usize::try_from(i).is_ok_and(|i| i < self.gpus.len())
            {
                return Err(bad(format!("open {id}: no GPU {i}")));
            }
            if id == 0 || id >= live.next_open || !ids.insert(id) {
                return Err(bad(format!("open id {id} is 0, taken or past next_open")));
            }
            for i in std::iter::once(o.host).chain(o.mapping) {
                if files.get(i).is_none_or(Option::is_none) || !used.insert(i) {
                    return Err(bad(format!("host file {i} missing or named twice")));
                }
            }
            nodes.push(node);
        }
        let mut table = crate::objects::ObjectTable::new();
        for c in live.clients {
            let mut objects = std::collections::BTreeMap::new();
            for o in c.objects {
                if objects
                    .insert(o.handle, o.object(o.origin.clone()))
                    .is_some()
                {
                    return Err(bad(format!(
                        "object {:#x} of client {:#x} twice",
                        o.handle, c.handle
                    )));
                }
            }
            // Owners are frontend opens; a UVM open never allocates RM clients.
            if !ids.contains(&c.owner) {
                return Err(bad(format!(
                    "client {:#x}: owner open {} unknown",
                    c.handle, c.owner
                )));
            }
            table
                .insert_live_client(
                    c.handle,
                    Client::new(c.handle, OwnerId(c.owner), c.class, c.origin, objects),
                )
                .map_err(|e| bad(e.to_string()))?;
        }
        let mut opens: std::collections::HashMap<_, _, crate::hash::WordHash> =
            std::collections::HashMap::default();
        let mut lingering = std::collections::BTreeMap::new();
        for (o, node) in live.opens.iter().zip(nodes) {
            let adopted = (|| -> Result<_, ProxyError> {
                let host = self
                    .host
                    .adopt(take_file(files, o.host)?)
                    .map_err(ProxyError::Host)?;
                let mapping = match o.mapping {
                    Some(i) => Some(
                        self.host
                            .adopt(take_file(files, i)?)
                            .map_err(ProxyError::Host)?,
                    ),
                    None => None,
                };
                Ok((host, mapping))
            })();
            let (host, mapping) = match adopted {
                Ok(x) => x,
                Err(e) => {
                    // Not dropped: they are the old worker's files still.
                    std::mem::forget((opens, lingering));
                    return Err(e);
                }
            };
            let record = o.saved.record(|id| id, o.os_events_overflow);
            let file = Arc::new(OpenFile {
                node,
                host,
                mapping: Mutex::new(MappingSlot::from_live(mapping, o.context)),
                record: Mutex::new(record),
            });
            match o.lingering {
                false => opens.insert(OwnerId(o.saved.id), file),
                true => lingering.insert(OwnerId(o.saved.id), file),
            };
        }
        for _ in 0..opens.len() + lingering.len() {
            if let Err(e) = self.take_open_slot() {
                std::mem::forget((opens, lingering));
                return Err(e);
            }
        }
        // What the files keep counted besides the objects (exports, UVM external mappings):
        // without it a live upgrade would hand the tenant back the memory its exports hold.
        for &(owner, key, charge) in &live.vid_holds {
            if !table.hold_at(OwnerId(owner), key, charge) {
                std::mem::forget((opens, lingering));
                return Err(bad(format!(
                    "more than the holds an open may keep ({owner})"
                )));
            }
        }
        *self.opens() = opens;
        *self.lingering() = lingering;
        self.recount_holders();
        *self.objects() = table;
        self.bump_open_ids(live.next_open);
        lock(&self.devices).extend(live.devices);
        {
            let mut d = lock(&self.dma_maps);
            d.live = live
                .dma_maps
                .iter()
                .map(|&(c, a, m, n)| ((c, a, m), n))
                .collect();
            d.overflow = live.dma_overflow;
        }
        for (t, h) in live.clients_map {
            self.map_client(t, h);
        }
        self.counts.add_rows(&live.counts);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{SavedNode, SavedOsEvent};

    /// A live open is its saved form plus the live fields, in one flat JSON object: the
    /// layout an older worker wrote (`id`, `node`, ... beside `host`), so upgrades between
    /// versions keep reading each other's state.
    #[test]
    fn test_a_live_open_keeps_the_flat_layout_of_older_workers() {
        let old = r#"{"id":3,"node":{"gpu":1},"host":0,"mapping":1,"context":true,
            "registered_ctl":2,"attached":[256],
            "os_events":[{"h_client":7,"h_device":8,"fd_open":3}],"os_events_overflow":false}"#;
        let open: LiveOpen = serde_json::from_str(old).expect("an older worker's open");
        assert_eq!(
            open.saved,
            SavedOpen {
                id: 3,
                node: SavedNode::Gpu(1),
                registered_ctl: Some(2),
                attached: Some(vec![256]),
                os_events: vec![SavedOsEvent {
                    h_client: 7,
                    h_device: 8,
                    fd_open: 3
                }],
            }
        );
        assert_eq!((open.host, open.mapping, open.context), (0, Some(1), true));
        let again: serde_json::Value = serde_json::to_value(&open).expect("serializes");
        let old: serde_json::Value = serde_json::from_str(old).expect("JSON");
        assert_eq!(again, old);
    }
}
