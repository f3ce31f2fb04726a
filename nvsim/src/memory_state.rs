//! The memory books of a driver instance kept in `State` (`MemState`): the memfd behind each
//! memory block, the CPU mappings and the files' mmap contexts. `memory.rs` handles the
//! escapes that change them.

use std::collections::{BTreeMap, HashMap};
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::sync::{Arc, Weak};

use nix::sys::memfd::{MemFdCreateFlag, memfd_create};

/// A CPU mapping made by `RM_MAP_MEMORY` (the resource server's `RsCpuMapping`).
#[derive(Debug)]
pub(crate) struct CpuMapping {
    pub h_client: u32,
    pub h_memory: u32,
    pub block: u64,
    pub address: u64,
}

/// A file's mmap context (`nv_alloc_mapping_context_t`): the memory it maps.
#[derive(Debug, Clone)]
pub(crate) struct MmapContext {
    pub memfd: Arc<File>,
    /// Page-aligned offset into the block of the first mapped byte.
    pub offset: u64,
}

/// Memory state of a driver instance (in [`State`](crate::driver::State)).
#[derive(Debug, Default)]
pub(crate) struct MemState {
    /// The memfd behind each block that was mapped or written, by block id.
    pub backing: BTreeMap<u64, Arc<File>>,
    pub cpu_maps: Vec<CpuMapping>,
    /// mmap contexts by file id.
    pub contexts: BTreeMap<i32, MmapContext>,
    /// The clients' files behind OS-descriptor blocks by `(st_dev, st_ino, writable fd)`: one
    /// open file is kept per file, however many blocks and fds name it (a driver process that
    /// kept each fd it was sent would hold one per allocation).
    pub client_files: HashMap<(u64, u64, bool), Weak<File>>,
}

impl MemState {
    /// Block `block` was freed: its memfd (mappings made from it keep their own reference) and
    /// the CPU mappings of it go (`refRemoveMapping` on the object's free).
    pub(crate) fn block_freed(&mut self, block: u64) {
        self.backing.remove(&block);
        self.cpu_maps.retain(|m| m.block != block);
    }

    /// File `file` was released: its mmap context goes.
    pub(crate) fn file_released(&mut self, file: i32) {
        self.contexts.remove(&file);
    }

    /// The file to keep for a block backed by the client's `file`: one already kept for the
    /// same file and access, else `file`.
    pub(crate) fn client_file(&mut self, file: &Arc<File>) -> Arc<File> {
        use std::os::unix::fs::MetadataExt;
        let Ok(m) = file.metadata() else {
            return file.clone();
        };
        let key = (m.dev(), m.ino(), file_writable(file));
        if let Some(kept) = self.client_files.get(&key).and_then(Weak::upgrade) {
            return kept;
        }
        // Entries of files no block holds any more go now and then (amortised).
        if self.client_files.len() >= 2 * self.backing.len() + 64 {
            self.client_files.retain(|_, w| w.strong_count() > 0);
        }
        self.client_files.insert(key, Arc::downgrade(file));
        file.clone()
    }

    /// Blocks with a memfd.
    pub(crate) fn memfds(&self) -> usize {
        self.backing.len()
    }

    /// CPU mappings recorded.
    pub(crate) fn cpu_mappings(&self) -> usize {
        self.cpu_maps.len()
    }

    /// Files with an mmap context.
    pub(crate) fn mmap_contexts(&self) -> usize {
        self.contexts.len()
    }

    /// The memfd of `block` (`bytes` long), created on first use.
    pub(crate) fn memfd(&mut self, block: u64, bytes: u64) -> io::Result<Arc<File>> {
        if let Some(f) = self.backing.get(&block) {
            return Ok(f.clone());
        }
        let name: &CStr = c"nvsim-memory";
        let fd = memfd_create(name, MemFdCreateFlag::MFD_CLOEXEC).map_err(io::Error::from)?;
        let file = File::from(fd);
        file.set_len(bytes)?;
        let file = Arc::new(file);
        self.backing.insert(block, file.clone());
        Ok(file)
    }
}

/// Whether `file` was opened for writing (`F_GETFL`): the driver pins writable pages only of
/// a mapping the client may write.
pub(crate) fn file_writable(file: &File) -> bool {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    use std::os::fd::AsRawFd;
    fcntl(file.as_raw_fd(), FcntlArg::F_GETFL)
        .map(OFlag::from_bits_truncate)
        .is_ok_and(|f| f & OFlag::O_ACCMODE != OFlag::O_RDONLY)
}
