//! System memory as the driver takes it from the host: the size checks of an
//! `NV01_MEMORY_SYSTEM` allocation and the host's pages it draws on. On a discrete GPU
//! (read at 580.95.05): `sysmemConstruct` → `sysmemInitAllocRequest_HMM`
//! (`src/nvidia/src/kernel/mem_mgr/system_mem.c`) → `memmgrAllocResources` and
//! `sysmemAllocResources` → `memUtilsAllocMemDesc` → `memdescCreate`
//! (`src/nvidia/src/kernel/gpu/mem_mgr/mem_desc.c`), then the pages from
//! `nv_alloc_contig_pages` / `nv_alloc_system_pages` (`kernel-open/nvidia/nv-vm.c`).
//!
//! What is taken from the driver, in its order:
//! - **Rounding.** The size is rounded up to the 4 KiB page (`memmgrAllocDetermineAlignment`);
//!   a size that wraps doing so becomes 0, which `memdescCreate` refuses:
//!   `NV_ERR_INVALID_ARGUMENT`.
//! - **Descriptor.** A noncontiguous descriptor carries one 8-byte address per page and must
//!   stay under 4 GiB (`MdSize > 0xffffffff`): past about 2 TiB,
//!   `NV_ERR_INSUFFICIENT_RESOURCES`. Only `NVOS32_ATTR_PHYSICALITY_CONTIGUOUS` asks for a
//!   contiguous block; every other value is noncontiguous.
//! - **Pages.** A contiguous block is one `alloc_pages` of order `get_order(size)`: past the
//!   buddy allocator's largest order (x86-64: order 10, 4 MiB) it cannot be had,
//!   `NV_ERR_NO_MEMORY`. Every block's pages come from the host; when they run out,
//!   `NV_ERR_NO_MEMORY` ([`SimConfig::host_memory_bytes`](crate::SimConfig)).
//! - **Answer.** The params come back with the rounded size, `limit`, and the physicality
//!   obtained in `attr`; the client's `offset` is restored.
//!
//! Simplified: the host's pages are one pool of the configured size (no fragmentation, no
//! other users, no large-page retries), and the descriptor's own size is left out of its
//! limit (a few hundred bytes: the limit moves by some tens of pages).

use crate::fb::{
    FB_PAGE as PAGE, PHYSICALITY_CONTIGUOUS, PHYSICALITY_NONCONTIGUOUS, physicality,
    with_physicality,
};
use crate::status::{NV_ERR_INSUFFICIENT_RESOURCES, NV_ERR_INVALID_ARGUMENT, NV_ERR_NO_MEMORY};

/// The largest contiguous block the kernel's buddy allocator gives (x86-64
/// `MAX_PAGE_ORDER` 10).
const MAX_CONTIGUOUS: u64 = PAGE << 10;
/// Pages a noncontiguous descriptor may list: `8 * pages` under 4 GiB.
const MAX_DESCRIPTOR_PAGES: u64 = 0xffff_ffff / 8;

/// What an allocation obtains: its bytes (page multiple) and `attr` as reported back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Obtained {
    pub bytes: u64,
    pub attr: u32,
}

/// Sizes a system-memory allocation of `size` bytes (not 0) asked as `attr`, with `held`
/// bytes of the host's `total` already taken: what it obtains, or the driver's status.
pub(crate) fn obtain(size: u64, attr: u32, held: u64, total: u64) -> Result<Obtained, u32> {
    let bytes = size
        .checked_next_multiple_of(PAGE)
        .ok_or(NV_ERR_INVALID_ARGUMENT)?;
    let contiguous = physicality(attr) == PHYSICALITY_CONTIGUOUS;
    if !contiguous && bytes / PAGE > MAX_DESCRIPTOR_PAGES {
        return Err(NV_ERR_INSUFFICIENT_RESOURCES);
    }
    if contiguous && bytes > MAX_CONTIGUOUS {
        return Err(NV_ERR_NO_MEMORY);
    }
    if held.checked_add(bytes).is_none_or(|t| t > total) {
        return Err(NV_ERR_NO_MEMORY);
    }
    let obtained = if contiguous {
        PHYSICALITY_CONTIGUOUS
    } else {
        PHYSICALITY_NONCONTIGUOUS
    };
    Ok(Obtained {
        bytes,
        attr: with_physicality(attr, obtained),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const CONTIG: u32 = PHYSICALITY_CONTIGUOUS << 27;
    const NONCONTIG: u32 = PHYSICALITY_NONCONTIGUOUS << 27;

    #[test]
    fn rounds_to_pages_and_reports_the_physicality() {
        assert_eq!(
            obtain(1, 0, 0, GIB),
            Ok(Obtained {
                bytes: PAGE,
                attr: NONCONTIG
            })
        );
        // Other attr bits are kept; `_ALLOW_NONCONTIGUOUS` (3) is noncontiguous here.
        assert_eq!(
            obtain(PAGE + 1, (3 << 27) | 0x10, 0, GIB),
            Ok(Obtained {
                bytes: 2 * PAGE,
                attr: NONCONTIG | 0x10
            })
        );
        assert_eq!(
            obtain(MAX_CONTIGUOUS, CONTIG, 0, GIB).map(|o| o.attr),
            Ok(CONTIG)
        );
    }

    #[test]
    fn refuses_what_the_driver_refuses() {
        // The rounding wraps: memdescCreate's allocSize < Size.
        assert_eq!(
            obtain(u64::MAX, 0, 0, u64::MAX),
            Err(NV_ERR_INVALID_ARGUMENT)
        );
        assert_eq!(
            obtain(u64::MAX - PAGE + 2, 0, 0, u64::MAX),
            Err(NV_ERR_INVALID_ARGUMENT)
        );
        // A descriptor of 4 GiB or more, before any page is asked for.
        let past = (MAX_DESCRIPTOR_PAGES + 1) * PAGE;
        assert_eq!(
            obtain(past, 0, 0, u64::MAX),
            Err(NV_ERR_INSUFFICIENT_RESOURCES)
        );
        assert!(obtain(past - PAGE, 0, 0, u64::MAX).is_ok());
        // Contiguous past the buddy allocator's largest order.
        assert_eq!(
            obtain(MAX_CONTIGUOUS + 1, CONTIG, 0, u64::MAX),
            Err(NV_ERR_NO_MEMORY)
        );
    }

    #[test]
    fn the_hosts_pages_run_out() {
        assert!(obtain(GIB, 0, 3 * GIB, 4 * GIB).is_ok());
        assert_eq!(obtain(GIB + 1, 0, 3 * GIB, 4 * GIB), Err(NV_ERR_NO_MEMORY));
        // `held` near the top of u64 does not wrap into a pass.
        assert_eq!(
            obtain(GIB, 0, u64::MAX - 1, u64::MAX),
            Err(NV_ERR_NO_MEMORY)
        );
    }
}
