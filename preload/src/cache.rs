//! Which files the shim has confirmed to be our nodes.
//!
//! Keyed by file identity, `(st_dev, st_ino, st_rdev)` from the `fstat` the shim does on every
//! file-backed mmap anyway, never by fd number: a reused fd number, `dup2`/`dup3` over it,
//! `close_range`, a fork, raw syscalls or io_uring cannot make a stale entry answer for another
//! file, and the shim need not interpose `close`/`dup*` (which would tax every close in the
//! process). The answer to `NVPROXY_IOC_HELLO` belongs to the node, not to one open file, so the
//! identity of the node is the right key. Only positive answers are kept.
//!
//! A fixed table read under a sequence lock (all atomics: no allocation, no blocking, safe in a
//! signal handler); writers that find the write lock taken simply do not cache.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

/// Slots; a process sees a handful of nodes at most.
const SLOTS: usize = 16;

/// A file's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileKey {
    /// `st_dev`: the filesystem the node's inode lives on.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// `st_rdev`: the device number.
    pub rdev: u64,
}

struct Slot {
    dev: AtomicU64,
    ino: AtomicU64,
    rdev: AtomicU64,
}

/// The table.
pub struct NodeCache {
    seq: AtomicU64,
    writing: AtomicBool,
    next: AtomicUsize,
    slots: [Slot; SLOTS],
}

impl NodeCache {
    /// An empty table.
    pub const fn new() -> Self {
        NodeCache {
            seq: AtomicU64::new(0),
            writing: AtomicBool::new(false),
            next: AtomicUsize::new(0),
            slots: [const {
                Slot {
                    dev: AtomicU64::new(0),
                    ino: AtomicU64::new(0),
                    rdev: AtomicU64::new(0),
                }
            }; SLOTS],
        }
    }

    /// Whether `key` was confirmed. A read racing with a write answers `false` (the caller then
    /// asks the node again).
    pub fn contains(&self, key: FileKey) -> bool {
        if key
            == (FileKey {
                dev: 0,
                ino: 0,
                rdev: 0,
            })
        {
            return false;
        }
        let before = self.seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            return false;
        }
        let found = self.slots.iter().any(|s| {
            s.dev.load(Ordering::Relaxed) == key.dev
                && s.ino.load(Ordering::Relaxed) == key.ino
                && s.rdev.load(Ordering::Relaxed) == key.rdev
        });
        fence(Ordering::Acquire);
        found && self.seq.load(Ordering::Relaxed) == before
    }

    /// The `rdev` recorded for the file `(dev, ino)`, if any (the socket transport keeps its
    /// sockets' node codes there). A read racing with a write answers `None`.
    pub fn find(&self, dev: u64, ino: u64) -> Option<u64> {
        if dev == 0 && ino == 0 {
            return None;
        }
        let before = self.seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            return None;
        }
        let found = self.slots.iter().find_map(|s| {
            (s.dev.load(Ordering::Relaxed) == dev && s.ino.load(Ordering::Relaxed) == ino)
                .then(|| s.rdev.load(Ordering::Relaxed))
        });
        fence(Ordering::Acquire);
        found.filter(|_| self.seq.load(Ordering::Relaxed) == before)
    }

    /// Records `key` as confirmed (replacing the oldest entry when full). Does nothing when
    /// another thread is writing.
    pub fn insert(&self, key: FileKey) {
        if self.contains(key)
            || self
                .writing
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % SLOTS;
        self.seq.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
        let s = &self.slots[i];
        s.dev.store(key.dev, Ordering::Relaxed);
        s.ino.store(key.ino, Ordering::Relaxed);
        s.rdev.store(key.rdev, Ordering::Relaxed);
        self.seq.fetch_add(1, Ordering::Release);
        self.writing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u64) -> FileKey {
        FileKey {
            dev: 6,
            ino: n,
            rdev: 244 << 8 | n,
        }
    }

    #[test]
    fn test_inserted_key_is_found() {
        let c = NodeCache::new();
        c.insert(key(1));
        assert!(c.contains(key(1)));
    }

    #[test]
    fn test_other_inode_same_device_number_is_not_found() {
        let c = NodeCache::new();
        c.insert(key(1));
        assert!(!c.contains(FileKey { ino: 99, ..key(1) }));
    }

    #[test]
    fn test_find_returns_the_recorded_rdev() {
        let c = NodeCache::new();
        c.insert(key(3));
        assert_eq!(c.find(6, 3), Some(key(3).rdev));
        assert_eq!(c.find(6, 4), None);
        assert_eq!(c.find(0, 0), None);
    }

    #[test]
    fn test_zero_key_is_never_found() {
        let c = NodeCache::new();
        assert!(!c.contains(FileKey {
            dev: 0,
            ino: 0,
            rdev: 0
        }));
    }

    #[test]
    fn test_full_table_forgets_the_oldest() {
        let c = NodeCache::new();
        for n in 1..=(SLOTS as u64 + 1) {
            c.insert(key(n));
        }
        assert!(!c.contains(key(1)));
        assert!(c.contains(key(2)) && c.contains(key(SLOTS as u64 + 1)));
    }

    #[test]
    fn test_concurrent_inserts_and_reads_never_see_unknown_keys() {
        let c = NodeCache::new();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let c = &c;
                s.spawn(move || {
                    for i in 0..10_000u64 {
                        c.insert(key(1 + (i + t) % 8));
                        assert!(!c.contains(key(100 + i % 8)));
                    }
                });
            }
        });
    }
}
