//! GPU virtual address spaces (`FERMI_VASPACE_A`) and the virtual-address reservations in them
//! (`NV50_MEMORY_VIRTUAL`).
//!
//! `vaspaceapiConstruct` (`src/kernel/gpu/mem_mgr/vaspace_api.c`) creates the address space and
//! reports its range back in `vaBase`/`vaSize`; `gvaspaceConstruct` (`mem_mgr/gpu_vaspace.c`,
//! `_gvaspaceSetVaLimits`) starts it at `vaBase`, or at the reserved base of 1 MiB
//! (`gvaspaceGetReservedVaspaceBase`) when `vaBase` is 0, and ends it at `vaSize - 1`, or at the
//! MMU format's maximum when `vaSize` is 0 (Hopper's version-3 page tables: 57-bit addresses);
//! a limit above that maximum is `NV_ERR_INVALID_ARGUMENT`.
//!
//! `virtmemConstruct` (`mem_mgr/virtual_mem.c`) needs `NVOS32_ALLOC_FLAGS_VIRTUAL`
//! (`NV_ERR_INVALID_ARGUMENT`), finds the VA space by `hVASpace` (the device's default VA space
//! is not simulated: `NV_ERR_NOT_SUPPORTED`), and on a GSP client has GSP firmware reserve the
//! range (`NV_RM_RPC_ALLOC_VIRTMEM`), then reports `offset` = the address, `size`, and `limit` =
//! `size - 1`; the object becomes a dependant of the VA space. How the firmware places a
//! non-fixed range is not in the open source: the simulator takes the lowest free range (the
//! highest with `FORCE_MEM_GROWS_DOWN`) at 64 KiB granularity (Hopper's default big page), and
//! a fixed-address request (`FIXED_ADDRESS_ALLOCATE`) outside the space or over a reserved
//! range fails with `NV_ERR_NO_MEMORY`, the heap's answer for a range it cannot give.

use std::collections::BTreeMap;

use crate::status::*;

/// `gvaspaceGetReservedVaspaceBase` on a GPU without the reserved-VA workaround.
pub(crate) const VA_START_MIN: u64 = 1 << 20;
/// Hopper (MMU version 3): 57-bit virtual addresses.
pub(crate) const VA_LIMIT_MAX: u64 = (1 << 57) - 1;
/// The granularity of reservations (RM_PAGE_SIZE_64K).
pub(crate) const VA_ALIGN: u64 = 64 << 10;

/// `NVOS32_ALLOC_FLAGS_FORCE_MEM_GROWS_DOWN`.
const FLAGS_GROWS_DOWN: u32 = 0x4;
/// `NVOS32_ALLOC_FLAGS_FIXED_ADDRESS_ALLOCATE`.
const FLAGS_FIXED_ADDRESS: u32 = 0x10;
/// `NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE`.
const FLAGS_ALIGNMENT_FORCE: u32 = 0x100;
/// `NVOS32_ALLOC_FLAGS_VIRTUAL`.
pub(crate) const FLAGS_VIRTUAL: u32 = 0x8_0000;

/// One GPU VA space, shared by the `FERMI_VASPACE_A` object and its dups.
#[derive(Debug)]
pub(crate) struct VaSpace {
    pub gpu: usize,
    pub start: u64,
    pub limit: u64,
    /// Reserved ranges: start → end (inclusive).
    pub reserved: BTreeMap<u64, u64>,
    /// Objects referencing it (the object and its dups).
    pub refs: u32,
}

impl VaSpace {
    /// `_gvaspaceSetVaLimits` for a requested base and size (0: defaults).
    pub(crate) fn new(gpu: usize, va_base: u64, va_size: u64) -> Result<VaSpace, u32> {
        let limit = if va_size == 0 {
            VA_LIMIT_MAX
        } else {
            va_size - 1
        };
        if limit > VA_LIMIT_MAX {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        let start = if va_base == 0 { VA_START_MIN } else { va_base };
        if start > limit {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        Ok(VaSpace {
            gpu,
            start,
            limit,
            reserved: BTreeMap::new(),
            refs: 1,
        })
    }

    fn free_at(&self, lo: u64, hi: u64) -> bool {
        lo >= self.start
            && hi <= self.limit
            && self
                .reserved
                .range(..=hi)
                .next_back()
                .is_none_or(|(_, &end)| end < lo)
    }

    /// Reserves `size` bytes; returns (address, rounded size).
    pub(crate) fn reserve(
        &mut self,
        flags: u32,
        size: u64,
        alignment: u64,
        fixed: u64,
    ) -> Result<(u64, u64), u32> {
        if size == 0 {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        let align = if flags & FLAGS_ALIGNMENT_FORCE != 0 && alignment > VA_ALIGN {
            if !alignment.is_power_of_two() {
                return Err(NV_ERR_INVALID_ARGUMENT);
            }
            alignment
        } else {
            VA_ALIGN
        };
        let size = size
            .checked_next_multiple_of(VA_ALIGN)
            .ok_or(NV_ERR_NO_MEMORY)?;
        let addr = if flags & FLAGS_FIXED_ADDRESS != 0 {
            if !fixed.is_multiple_of(VA_ALIGN) {
                return Err(NV_ERR_INVALID_ARGUMENT);
            }
            let hi = fixed.checked_add(size - 1).ok_or(NV_ERR_NO_MEMORY)?;
            if !self.free_at(fixed, hi) {
                return Err(NV_ERR_NO_MEMORY);
            }
            fixed
        } else {
            self.find(size, align, flags & FLAGS_GROWS_DOWN != 0)
                .ok_or(NV_ERR_NO_MEMORY)?
        };
        self.reserved.insert(addr, addr + size - 1);
        Ok((addr, size))
    }

    /// The lowest (or highest) aligned free range of `size` bytes.
    fn find(&self, size: u64, align: u64, down: bool) -> Option<u64> {
        // The gaps between reservations, in address order.
        let mut gaps = Vec::new();
        let mut cursor = self.start;
        for (&lo, &hi) in &self.reserved {
            if lo > cursor {
                gaps.push((cursor, lo - 1));
            }
            cursor = cursor.max(hi.saturating_add(1));
        }
        if cursor <= self.limit {
            gaps.push((cursor, self.limit));
        }
        let fit = |&(lo, hi): &(u64, u64)| -> Option<u64> {
            if down {
                let top = hi.checked_sub(size - 1)?;
                let a = top - top % align;
                (a >= lo).then_some(a)
            } else {
                let a = lo.checked_next_multiple_of(align)?;
                (a.checked_add(size - 1)? <= hi).then_some(a)
            }
        };
        if down {
            gaps.iter().rev().find_map(fit)
        } else {
            gaps.iter().find_map(fit)
        }
    }

    pub(crate) fn release(&mut self, addr: u64) {
        self.reserved.remove(&addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_hoppers_range() {
        let v = VaSpace::new(0, 0, 0).unwrap();
        assert_eq!((v.start, v.limit), (1 << 20, (1 << 57) - 1));
        assert_eq!(
            VaSpace::new(0, 0, 1 << 58).unwrap_err(),
            NV_ERR_INVALID_ARGUMENT
        );
        let v = VaSpace::new(0, 1 << 30, 1 << 40).unwrap();
        assert_eq!((v.start, v.limit), (1 << 30, (1 << 40) - 1));
    }

    #[test]
    fn fixed_reservations_do_not_overlap() {
        let mut v = VaSpace::new(0, 0, 0).unwrap();
        let f = FLAGS_VIRTUAL | FLAGS_FIXED_ADDRESS;
        assert_eq!(
            v.reserve(f, 0x10000, 0, 0x2_0000_0000),
            Ok((0x2_0000_0000, 0x10000))
        );
        assert_eq!(
            v.reserve(f, 0x1000, 0, 0x2_0000_8000),
            Err(NV_ERR_INVALID_ARGUMENT)
        );
        assert_eq!(
            v.reserve(f, 0x1000, 0, 0x2_0000_0000),
            Err(NV_ERR_NO_MEMORY)
        );
        assert_eq!(
            v.reserve(f, 0x20000, 0, 0x1_ffff_0000),
            Err(NV_ERR_NO_MEMORY)
        );
        assert_eq!(
            v.reserve(f, 0x1000, 0, 0x1_ffff_0000),
            Ok((0x1_ffff_0000, 0x10000))
        );
        assert_eq!(v.reserve(f, 0x1000, 0, 0), Err(NV_ERR_NO_MEMORY)); // below the start
        v.release(0x2_0000_0000);
        assert_eq!(
            v.reserve(f, 0x1000, 0, 0x2_0000_0000),
            Ok((0x2_0000_0000, 0x10000))
        );
    }

    #[test]
    fn free_placement_is_first_fit_up_or_down() {
        let mut v = VaSpace::new(0, 0, 1 << 32).unwrap();
        let f = FLAGS_VIRTUAL;
        assert_eq!(v.reserve(f, 1, 0, 0), Ok((1 << 20, 0x10000)));
        assert_eq!(
            v.reserve(f, 0x10000, 0, 0),
            Ok(((1 << 20) + 0x10000, 0x10000))
        );
        assert_eq!(
            v.reserve(f | FLAGS_GROWS_DOWN, 0x10000, 0, 0),
            Ok(((1 << 32) - 0x10000, 0x10000))
        );
        let forced = f | FLAGS_ALIGNMENT_FORCE;
        assert_eq!(
            v.reserve(forced, 0x10000, 1 << 24, 0),
            Ok((1 << 24, 0x10000))
        );
        assert_eq!(v.reserve(f, 1 << 40, 0, 0), Err(NV_ERR_NO_MEMORY));
        assert_eq!(v.reserve(f, 0, 0, 0), Err(NV_ERR_INVALID_ARGUMENT));
    }
}
