//! The top of the simulator: the [`HostDriver`] and [`HostFile`] impls that open files,
//! dispatch their calls to the handlers and release them when dropped, and the queries that
//! read the handlers' books ([`SimDriver::stats`], [`SimDriver::cuda_limited`]).

use std::fmt;
use std::io;
use std::sync::Arc;

use host_driver::{HostCall, HostDriver, HostFile, NodeKind};

use crate::driver::{FileState, SimDriver, SimStats, State};
use crate::status::ENODEV;

impl SimDriver {
    /// Whether GPU `gpu`'s clocks are under the CUDA limit (`perf.rs`): some device object of
    /// it holds a `PERF_CUDA_LIMIT_SET_CONTROL` reference.
    pub fn cuda_limited(&self, gpu: usize) -> bool {
        crate::perf::cuda_limited(&self.lock(), gpu)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SimStats {
        let st = self.lock();
        SimStats {
            open_files: st.files.len(),
            live_clients: st.clients.len(),
            live_objects: st.clients.values().map(|c| c.objects().len()).sum(),
            os_events: st.os_events.len(),
            allocated_memory: st
                .blocks
                .values()
                .filter(|b| !b.regs)
                .map(|b| b.bytes)
                // Saturating: the blocks' sizes are tenant-chosen and may sum past u64 (a
                // fuzz input did; debug builds then panicked here).
                .fold(0u64, u64::saturating_add),
            attached_gpus: (0..self.config.gpus.len())
                .filter(|&g| self.gpu_attached(&st, g))
                .count(),
            uvm_va_spaces: crate::uvm::counts(&st).0,
            uvm_registered_gpus: crate::uvm::counts(&st).1,
            uvm_ranges: crate::uvm::counts(&st).2,
            mapping_files: st.files.values().filter(|f| f.mapping).count(),
            mmap_contexts: st.mem.mmap_contexts(),
            cpu_mappings: st.mem.cpu_mappings(),
            memfds: st.mem.memfds(),
        }
    }

    /// The daemon dropped file `id`: release it unless another file still references it.
    fn drop_file(&self, id: i32) {
        let mut st = self.lock();
        let node = match st.files.get_mut(&id) {
            Some(f) if f.held => {
                f.held = false;
                Some(f.node)
            }
            _ => None,
        };
        if let Some(g) = node.and_then(|n| self.gpu_of_node(n)) {
            st.gpus[g].held_node_files -= 1;
        }
        self.maybe_release(&mut st, id);
    }

    /// Releases file `id` if it is no longer held nor referenced: frees the RM clients
    /// allocated through it and its OS events, drops its GPU references and its link to a
    /// control file (which may release that one in turn).
    fn maybe_release(&self, st: &mut State, id: i32) {
        let releasable = st.files.get(&id).is_some_and(|f| !f.held && f.holders == 0);
        if !releasable {
            return;
        }
        let f = st.files.remove(&id).expect("checked above");
        if let Some(g) = self.gpu_of_node(f.node) {
            st.gpus[g].node_files -= 1;
        }
        // A UVM mm file holds its va_space's file (uvm_mm_release: fput).
        let uvm_held = crate::uvm::file_released(st, id);
        st.mem.file_released(id);
        // RmFreeUnusedClients: every client whose OS info is this file.
        let doomed: Vec<u32> = st
            .clients
            .iter()
            .filter(|(_, c)| c.os_info == id)
            .map(|(&h, _)| h)
            .collect();
        for h in doomed {
            st.free_client(self, h);
        }
        // free_os_events(nvfp, 0)
        st.os_events.retain_mut(|e| {
            if e.file == id {
                e.active = false;
            }
            e.active || e.refcount > 0
        });
        if let Some(ids) = f.attached {
            for gid in ids.into_iter().filter(|&g| g != 0) {
                if let Some(g) = self.gpu_by_id(gid) {
                    st.gpus[g].dev_refs = st.gpus[g].dev_refs.saturating_sub(1);
                }
            }
        }
        if let Some(ctl) = f.ctl {
            if let Some(c) = st.files.get_mut(&ctl) {
                c.holders = c.holders.saturating_sub(1);
            }
            self.maybe_release(st, ctl);
        }
        if let Some(va_space_file) = uvm_held {
            self.maybe_release(st, va_space_file);
        }
    }
}

impl HostDriver for SimDriver {
    fn version(&self) -> &str {
        &self.version_string
    }

    /// Opens a file on `node`. A GPU node whose minor has no GPU fails with `ENODEV`, as the
    /// driver's `nvidia_open` does when `find_minor` finds nothing. `/dev/nvidia-uvm` opens as an
    /// uninitialised UVM file (`uvm.rs`).
    fn open(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        self.open_file(node, false)
    }

    /// Opens a file on `node` (control or GPU node) that only takes an mmap context: every
    /// ioctl on it fails with `EACCES`, as on a real mapping file opened under Landlock. Its
    /// [`HostFile::mmap_fd`] is the memfd of the memory its context names. (A memfd is not a
    /// device, so the Landlock restriction itself has nothing to apply to here.)
    fn open_mapping(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        if node == NodeKind::Uvm {
            return Err(io::Error::from_raw_os_error(crate::status::EINVAL));
        }
        self.open_file(node, true)
    }
}

impl SimDriver {
    /// The GPU whose node `node` is, if it is a GPU's.
    fn gpu_of_node(&self, node: NodeKind) -> Option<usize> {
        match node {
            NodeKind::Gpu(minor) => self.gpu_by_minor(minor),
            _ => None,
        }
    }

    fn open_file(&self, node: NodeKind, mapping: bool) -> io::Result<Arc<dyn HostFile>> {
        if let NodeKind::Gpu(minor) = node
            && self.gpu_by_minor(minor).is_none()
        {
            return Err(io::Error::from_raw_os_error(ENODEV));
        }
        let me = self
            .me
            .upgrade()
            .ok_or_else(|| io::Error::from_raw_os_error(ENODEV))?;
        let mut st = self.lock();
        let n = st.next_file;
        if n >= 0xffff {
            return Err(io::Error::from_raw_os_error(crate::status::EBUSY));
        }
        st.next_file += 1;
        let id = self.id_base + n;
        if let Some(g) = self.gpu_of_node(node) {
            st.gpus[g].node_files += 1;
            st.gpus[g].held_node_files += 1;
        }
        st.files.insert(
            id,
            FileState {
                node,
                held: true,
                ctl: None,
                holders: 0,
                attached: None,
                mapping,
            },
        );
        Ok(Arc::new(SimFile {
            driver: me,
            id,
            node,
        }))
    }
}

/// A file open on the simulated driver. Dropping the last reference closes it.
pub struct SimFile {
    driver: Arc<SimDriver>,
    id: i32,
    node: NodeKind,
}

impl fmt::Debug for SimFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFile")
            .field("id", &format_args!("{:#x}", self.id))
            .field("node", &self.node)
            .finish()
    }
}

impl HostFile for SimFile {
    fn node(&self) -> NodeKind {
        self.node
    }

    fn id(&self) -> i32 {
        self.id
    }

    fn ioctl(&self, call: &mut HostCall) -> io::Result<i32> {
        crate::escape::ioctl(&self.driver, self.id, self.node, call)
    }

    /// OS-descriptor memory backed by the client's file (`memory.rs` `alloc_os_descriptor`).
    fn ioctl_with_pages(
        &self,
        call: &mut HostCall,
        pages: &host_driver::ClientPages,
    ) -> io::Result<i32> {
        crate::escape::ioctl_with_pages(&self.driver, self.id, self.node, call, pages)
    }

    /// A dup of the memfd behind the memory this file's mmap context names, and the context's
    /// offset into it; `EINVAL` without a context (`nv-mmap.c`).
    fn mmap_fd(&self) -> io::Result<(std::os::fd::OwnedFd, u64)> {
        if self.node == NodeKind::Uvm {
            // The va_space's memfd, offset == VA (`uvm.rs`).
            return crate::uvm::mmap_fd(&self.driver, self.id);
        }
        crate::memory::mmap_fd(&self.driver, self.id)
    }
}

impl Drop for SimFile {
    fn drop(&mut self) {
        self.driver.drop_file(self.id);
    }
}
