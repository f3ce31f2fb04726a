//! The mapping state of one client open ([`MappingSlot`]): its mapping host file and whether
//! the driver gave that file an mmap context. `mapping.rs` reserves and commits it.

use std::sync::{Arc, Mutex, MutexGuard};

use host_driver::HostFile;

/// Whether a mapping file holds an mmap context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Context {
    #[default]
    None,
    /// A host call that may create it is running.
    Pending,
    /// The driver created it.
    Set,
}

/// The mapping state of one client open (in [`OpenFile`](crate::proxy::OpenFile)).
#[derive(Debug, Default)]
pub(crate) struct MappingSlot {
    pub(crate) file: Option<Arc<dyn HostFile>>,
    pub(crate) context: Context,
}

pub(crate) fn lock(m: &Mutex<MappingSlot>) -> MutexGuard<'_, MappingSlot> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MappingSlot {
    /// Whether the driver gave (or is giving) the open's mapping file an mmap context.
    pub(crate) fn has_context(&self) -> bool {
        self.context != Context::None
    }

    /// The mapping file and whether it holds a context (a live upgrade's export; no host call
    /// runs then, so a pending slot counts as without one).
    pub(crate) fn live_parts(&self) -> (Option<Arc<dyn HostFile>>, bool) {
        (self.file.clone(), self.context == Context::Set)
    }

    /// A slot as another worker left it ([`MappingSlot::live_parts`]).
    pub(crate) fn from_live(file: Option<Arc<dyn HostFile>>, context: bool) -> MappingSlot {
        MappingSlot {
            context: if context && file.is_some() {
                Context::Set
            } else {
                Context::None
            },
            file,
        }
    }
}
