//! The UVM books of a driver instance kept in `State` (`UvmFile` by file id): each UVM file's
//! state, and a va_space's registered GPUs, peers, channels, range groups and ioctl-created
//! ranges. `uvm.rs` handles the ioctls that change them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;

use nvproxy_abi::ioctl::{UVM_INIT_FLAGS_DISABLE_HMM, UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE};

/// One open UVM file.
#[derive(Debug, Default)]
pub(crate) struct UvmFile {
    pub state: FdState,
}

#[derive(Debug, Default)]
pub(crate) enum FdState {
    #[default]
    Uninitialized,
    VaSpace(Box<VaSpace>),
    /// An mm file: holds the va_space file open.
    Mm {
        va_space_file: i32,
    },
}

/// A registered GPU.
#[derive(Debug, Default)]
pub(crate) struct RegGpu {
    /// `(hClient, hVaSpace)` of the registered GPU VA space.
    pub va_space: Option<(u32, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RangeKind {
    /// `CREATE_EXTERNAL_RANGE`; GPUs with a mapping by `MAP_EXTERNAL_ALLOCATION`.
    /// The value per GPU: `(base, end, block, offset)`: `[base, end)` maps memory block
    /// `block` from `offset` on (what the front end reads and writes, `gpfifo.rs`).
    External {
        mapped: BTreeMap<usize, (u64, u64, u64, u64)>,
    },
    /// `ALLOC_SEMAPHORE_POOL`.
    SemaphorePool,
    /// `MAP_DYNAMIC_PARALLELISM_REGION` (SKED reflected).
    Sked,
}

/// A range created by an ioctl, `[start, end)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Range {
    pub end: u64,
    pub kind: RangeKind,
}

/// A UVM va_space.
#[derive(Debug)]
pub(crate) struct VaSpace {
    pub flags: u64,
    pub memfd: File,
    /// The va_space mm was initialised by `MM_INITIALIZE` (not in multi-process mode).
    pub mm_alive: bool,
    pub gpus: BTreeMap<usize, RegGpu>,
    pub peers: BTreeSet<(usize, usize)>,
    pub channels: BTreeSet<(u32, u32)>,
    pub range_groups: BTreeSet<u64>,
    pub range_group_counter: u64,
    pub ranges: BTreeMap<u64, Range>,
}

impl VaSpace {
    pub(crate) fn mm_enabled(&self) -> bool {
        self.flags & UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE == 0
    }

    /// HMM needs the mm association and is off with `DISABLE_HMM` (`uvm_hmm.c`); the
    /// simulated host is x86_64 without ATS.
    pub(crate) fn pageable_mem_access(&self) -> bool {
        self.mm_enabled() && self.flags & UVM_INIT_FLAGS_DISABLE_HMM == 0
    }

    /// The ioctl-created range containing `addr`.
    pub(crate) fn range_at(&self, addr: u64) -> Option<(u64, &Range)> {
        self.ranges
            .range(..=addr)
            .next_back()
            .filter(|(_, r)| addr < r.end)
            .map(|(&s, r)| (s, r))
    }

    pub(crate) fn overlaps_ioctl_range(&self, start: u64, end: u64) -> bool {
        self.ranges
            .range(..end)
            .any(|(&s, r)| s < end && start < r.end)
    }
}
