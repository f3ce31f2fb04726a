//! The books of each simulated GPU's video memory: which byte ranges are allocated to which
//! memory block, as the driver's physical memory allocator keeps them
//! (`src/nvidia/src/kernel/gpu/mem_mgr/phys_mem_allocator/`, PMA, used by `vidmemConstruct`
//! through `vidmemPmaAlloc` in `src/nvidia/src/kernel/mem_mgr/video_mem.c`).
//!
//! What is taken from the driver:
//! - **Contiguity.** Without NUMA, `vidmemPmaAlloc` asks for contiguous pages unless the
//!   allocation's `NVOS32_ATTR_PHYSICALITY` is `_NONCONTIGUOUS`; a contiguous request that
//!   fails is retried noncontiguous only for `_ALLOW_NONCONTIGUOUS`
//!   (`PDB_PROP_HEAP_NONCONTIG_ALLOC_BY_DEFAULT`, which would extend that to `_DEFAULT`, is
//!   never set). So `_DEFAULT` and `_CONTIGUOUS` need one free run of the whole size: a
//!   fragmented GPU refuses them with `NV_ERR_NO_MEMORY` even when enough bytes are free in
//!   total, as PMA does. The physicality obtained is reported back in `attr`.
//! - **Placement.** The lowest free run that fits (PMA's default search is bottom-up);
//!   noncontiguous allocations take the lowest free runs in order.
//! - **Answers.** Free bytes (`pmaGetFreeMemory`: `HEAP_FREE`) and the largest free run
//!   (`pmaGetLargestFree`: `LARGEST_FREE_REGION_SIZE_KB`; its offset is the "bad value" `~0`
//!   the driver returns, `LARGEST_FREE_REGION_BASE_KB`).
//!
//! Simplified: one region starting at 0 covering the whole memory (no RM reservation, no
//! protected or NUMA regions), 4 KiB pages whatever `NVOS32_ATTR_PAGE_SIZE` asks, no alignment
//! beyond the page (`NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE`, fixed-address and range allocations
//! are not modelled), no eviction.

use std::collections::{BTreeMap, HashMap};

/// The books' granule.
pub(crate) const FB_PAGE: u64 = 4096;

/// `NVOS32_ATTR_PHYSICALITY` (bits 28:27 of `attr`).
const ATTR_PHYSICALITY_SHIFT: u32 = 27;
const ATTR_PHYSICALITY_MASK: u32 = 3 << ATTR_PHYSICALITY_SHIFT;
/// `NVOS32_ATTR_PHYSICALITY_NONCONTIGUOUS`, `_CONTIGUOUS`, `_ALLOW_NONCONTIGUOUS`.
pub(crate) const PHYSICALITY_NONCONTIGUOUS: u32 = 1;
pub(crate) const PHYSICALITY_CONTIGUOUS: u32 = 2;
const PHYSICALITY_ALLOW_NONCONTIGUOUS: u32 = 3;

/// `attr`'s `NVOS32_ATTR_PHYSICALITY`.
pub(crate) fn physicality(attr: u32) -> u32 {
    (attr & ATTR_PHYSICALITY_MASK) >> ATTR_PHYSICALITY_SHIFT
}

/// `attr` with its physicality set to `p` (what the driver reports back as obtained).
pub(crate) fn with_physicality(attr: u32, p: u32) -> u32 {
    (attr & !ATTR_PHYSICALITY_MASK) | (p << ATTR_PHYSICALITY_SHIFT)
}

/// Where an allocation landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    /// Offset of its first byte (the lowest of its runs).
    pub offset: u64,
    /// `attr` with the physicality obtained (`_CONTIGUOUS` or `_NONCONTIGUOUS`).
    pub attr: u32,
}

/// One GPU's video memory books.
#[derive(Debug, Default)]
pub(crate) struct FbBooks {
    /// Allocated runs: start → (length, block). Disjoint, page multiples.
    runs: BTreeMap<u64, (u64, u64)>,
    /// The starts of each block's runs.
    by_block: HashMap<u64, Vec<u64>>,
    /// Bytes allocated.
    used: u64,
}

impl FbBooks {
    /// Bytes allocated.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Bytes free of `total`.
    pub(crate) fn free(&self, total: u64) -> u64 {
        total.saturating_sub(self.used)
    }

    /// The free runs of `[0, total)`, lowest first: (start, length).
    fn gaps(&self, total: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut at = 0u64;
        let mut runs = self.runs.iter();
        let mut done = false;
        std::iter::from_fn(move || {
            while !done {
                match runs.next() {
                    Some((&start, &(len, _))) => {
                        let gap = (at, start.saturating_sub(at));
                        at = start + len;
                        if gap.1 > 0 {
                            return Some(gap);
                        }
                    }
                    None => {
                        done = true;
                        if total > at {
                            return Some((at, total - at));
                        }
                    }
                }
            }
            None
        })
    }

    /// The largest free run of `[0, total)`.
    pub(crate) fn largest_free(&self, total: u64) -> u64 {
        self.gaps(total).map(|(_, len)| len).max().unwrap_or(0)
    }

    /// Allocates `bytes` (a multiple of [`FB_PAGE`], not 0) of `[0, total)` to `block` as
    /// `attr`'s physicality asks (see the module's doc); `None` is the driver's
    /// `NV_ERR_NO_MEMORY`.
    pub(crate) fn alloc(
        &mut self,
        total: u64,
        bytes: u64,
        block: u64,
        attr: u32,
    ) -> Option<Placed> {
        debug_assert!(bytes > 0 && bytes.is_multiple_of(FB_PAGE));
        let physicality = physicality(attr);
        let with = |p: u32| with_physicality(attr, p);
        let fit = self.gaps(total).find(|&(_, len)| len >= bytes);
        if physicality != PHYSICALITY_NONCONTIGUOUS
            && let Some((start, _)) = fit
        {
            self.take(block, &[(start, bytes)]);
            return Some(Placed {
                offset: start,
                attr: with(PHYSICALITY_CONTIGUOUS),
            });
        }
        let may_split = matches!(
            physicality,
            PHYSICALITY_NONCONTIGUOUS | PHYSICALITY_ALLOW_NONCONTIGUOUS
        );
        if !may_split || self.free(total) < bytes {
            return None;
        }
        let mut pieces = Vec::new();
        let mut left = bytes;
        for (start, len) in self.gaps(total) {
            let n = len.min(left);
            pieces.push((start, n));
            left -= n;
            if left == 0 {
                break;
            }
        }
        debug_assert_eq!(left, 0, "free bytes were counted");
        self.take(block, &pieces);
        Some(Placed {
            offset: pieces[0].0,
            attr: with(PHYSICALITY_NONCONTIGUOUS),
        })
    }

    fn take(&mut self, block: u64, pieces: &[(u64, u64)]) {
        let starts = self.by_block.entry(block).or_default();
        for &(start, len) in pieces {
            self.runs.insert(start, (len, block));
            starts.push(start);
            self.used += len;
        }
    }

    /// Gives back what `block` holds (nothing when it holds nothing).
    pub(crate) fn release(&mut self, block: u64) {
        for start in self.by_block.remove(&block).unwrap_or_default() {
            if let Some((len, _)) = self.runs.remove(&start) {
                self.used -= len;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const CONTIG: u32 = PHYSICALITY_CONTIGUOUS << ATTR_PHYSICALITY_SHIFT;
    const NONCONTIG: u32 = PHYSICALITY_NONCONTIGUOUS << ATTR_PHYSICALITY_SHIFT;
    const ALLOW: u32 = PHYSICALITY_ALLOW_NONCONTIGUOUS << ATTR_PHYSICALITY_SHIFT;

    #[test]
    fn test_lowest_fit_and_give_back() {
        let mut fb = FbBooks::default();
        let total = 10 * MIB;
        let a = fb.alloc(total, 2 * MIB, 1, 0).unwrap();
        let b = fb.alloc(total, 3 * MIB, 2, 0).unwrap();
        assert_eq!((a.offset, b.offset), (0, 2 * MIB));
        assert_eq!(a.attr, CONTIG, "default physicality is contiguous");
        assert_eq!((fb.used(), fb.free(total)), (5 * MIB, 5 * MIB));
        fb.release(1);
        assert_eq!(fb.largest_free(total), 5 * MIB);
        // A smaller allocation goes into the hole at the bottom.
        assert_eq!(fb.alloc(total, MIB, 3, 0).unwrap().offset, 0);
        assert_eq!(fb.free(total), 6 * MIB);
        fb.release(2);
        fb.release(3);
        fb.release(3); // twice: nothing more
        assert_eq!((fb.used(), fb.largest_free(total)), (0, total));
    }

    #[test]
    fn test_fragmentation_refuses_contiguous_but_not_noncontiguous() {
        let mut fb = FbBooks::default();
        let total = 8 * MIB;
        for b in 0..8 {
            fb.alloc(total, MIB, b, 0).unwrap();
        }
        assert_eq!(fb.alloc(total, MIB, 99, 0), None, "full");
        for b in [1, 3, 5] {
            fb.release(b);
        }
        assert_eq!((fb.free(total), fb.largest_free(total)), (3 * MIB, MIB));
        assert_eq!(fb.alloc(total, 2 * MIB, 10, 0), None, "no run of 2 MiB");
        assert_eq!(fb.alloc(total, 2 * MIB, 10, CONTIG), None);
        let p = fb.alloc(total, 2 * MIB, 10, ALLOW).unwrap();
        assert_eq!((p.offset, p.attr), (MIB, NONCONTIG));
        assert_eq!(fb.free(total), MIB);
        assert_eq!(fb.alloc(total, 2 * MIB, 11, NONCONTIG), None, "1 MiB left");
        let p = fb.alloc(total, MIB, 11, NONCONTIG).unwrap();
        assert_eq!(p.offset, 5 * MIB);
        fb.release(10);
        assert_eq!((fb.free(total), fb.largest_free(total)), (2 * MIB, MIB));
    }

    #[test]
    fn test_other_attr_bits_are_kept() {
        let mut fb = FbBooks::default();
        let attr = 0x0180_0000; // PAGE_SIZE bits
        let p = fb.alloc(MIB, FB_PAGE, 1, attr).unwrap();
        assert_eq!(p.attr, attr | CONTIG);
    }
}
