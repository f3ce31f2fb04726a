//! The UVM proxy's opens handed to another worker process (a live upgrade; see
//! `ioctl_proxy::live`): each open's host UVM file (the driver's va_space, with its
//! registrations, ranges and mappings, stays as it is) and its replay record.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use ioctl_proxy::checkpoint::{SavedUvmGpu, SavedUvmGpuVaSpace};
use ioctl_proxy::live::take_file;
use ioctl_proxy::{HandedFile, OwnerId, ProxyError};

use crate::proxy::{UvmOpen, UvmProxy, lock};
use crate::replay::UvmRecord;

/// One UVM open while it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveUvmOpen {
    /// Its id (in the instance's open-id space).
    pub id: u64,
    /// Its host UVM file: an index into the handed files.
    pub host: usize,
    /// `UVM_INITIALIZE` flags, when it initialised.
    #[serde(default)]
    pub init_flags: Option<u64>,
    /// The UVM open its `UVM_MM_INITIALIZE` named.
    #[serde(default)]
    pub mm_of: Option<u64>,
    /// Registered GPUs.
    #[serde(default)]
    pub gpus: Vec<SavedUvmGpu>,
    /// Registered GPU VA spaces.
    #[serde(default)]
    pub va_spaces: Vec<SavedUvmGpuVaSpace>,
    /// Commands replay does not re-create, by name, counted.
    #[serde(default)]
    pub unreplayable: Vec<(String, u64)>,
    /// The tenant was handed the va_space's mmap fd.
    #[serde(default)]
    pub mapped: bool,
}

impl UvmProxy {
    /// The UVM opens and their host files (appended to `files`, whose indices the opens
    /// name). Fails when the driver cannot hand its files over.
    pub fn export_live(&self, files: &mut Vec<HandedFile>) -> Result<Vec<LiveUvmOpen>, ProxyError> {
        let mut out = Vec::new();
        for (&id, o) in lock(&self.opens).iter() {
            files.push(o.host.hand_over().map_err(|e| {
                ProxyError::Config(format!(
                    "the driver cannot hand its UVM files to another process ({e})"
                ))
            })?);
            let r = lock(&o.record);
            out.push(LiveUvmOpen {
                id: id.0,
                host: files.len() - 1,
                init_flags: r.init_flags,
                mm_of: r.mm_of.map(|o| o.0),
                gpus: r.gpus.clone(),
                va_spaces: r.va_spaces.clone(),
                unreplayable: r
                    .unreplayable
                    .iter()
                    .map(|(&n, &c)| (n.to_owned(), c))
                    .collect(),
                mapped: r.mapped,
            });
        }
        out.sort_by_key(|o| o.id);
        Ok(out)
    }

    /// Takes over the opens of [`UvmProxy::export_live`] (after the frontend's
    /// `Proxy::adopt_live`, which set the open-id space), adopting their host files.
    pub fn adopt_live(
        &self,
        opens: Vec<LiveUvmOpen>,
        files: &mut [Option<HandedFile>],
    ) -> Result<(), ProxyError> {
        let bad = |m: String| ProxyError::Config(format!("live state: {m}"));
        let names: Vec<&'static str> = self.proxy.abi().uvm.values().map(|u| u.name).collect();
        let mut ids = std::collections::BTreeSet::new();
        let mut used = std::collections::BTreeSet::new();
        for o in &opens {
            if o.id == 0 || !ids.insert(o.id) || self.proxy.host_file_id(OwnerId(o.id)).is_some() {
                return Err(bad(format!("UVM open id {} is 0 or taken", o.id)));
            }
            if files.get(o.host).is_none_or(Option::is_none) || !used.insert(o.host) {
                return Err(bad(format!("host file {} missing or named twice", o.host)));
            }
        }
        // Checked: now the files (one dropped here would close the old worker's file).
        let mut table = std::collections::HashMap::new();
        for o in opens {
            let host = match take_file(files, o.host)
                .and_then(|f| self.proxy.host_driver().adopt(f).map_err(ProxyError::Host))
            {
                Ok(h) => h,
                Err(e) => {
                    std::mem::forget(table);
                    return Err(e);
                }
            };
            let mut rec = UvmRecord {
                init_flags: o.init_flags,
                mm_of: o.mm_of.map(OwnerId),
                gpus: o.gpus,
                va_spaces: o.va_spaces,
                mapped: o.mapped,
                ..UvmRecord::default()
            };
            for (name, n) in o.unreplayable {
                // Names of this version's table; one it lacks (a downgrade) keeps the count.
                let name = names
                    .iter()
                    .copied()
                    .find(|&k| k == name)
                    .unwrap_or("unknown");
                *rec.unreplayable.entry(name).or_insert(0) += n;
            }
            table.insert(
                OwnerId(o.id),
                Arc::new(UvmOpen {
                    host,
                    record: Mutex::new(rec),
                }),
            );
        }
        for _ in 0..table.len() {
            if let Err(e) = self.proxy.take_open_slot() {
                std::mem::forget(table);
                return Err(e);
            }
        }
        let mut mine = lock(&self.opens);
        if !mine.is_empty() {
            std::mem::forget(table);
            return Err(bad("the UVM proxy already serves".into()));
        }
        *mine = table;
        Ok(())
    }
}
