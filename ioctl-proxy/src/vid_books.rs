//! The video memory books' pieces a request carries: the granule sizes are counted by
//! ([`pages`]) and what a control does to the books ([`VidOp`]). The quota itself is
//! `vidmem.rs`.

use crate::objects::{OwnerId, VidCharge};

/// The granule a request is admitted by.
const PAGE: u64 = 4096;

/// A size rounded up to [`PAGE`].
pub(crate) fn pages(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE).saturating_mul(PAGE)
}

/// What a control does to the video memory books once the driver said `NV_OK`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum VidOp {
    /// An object exported to the file of `open` holds `charge` while that file lives.
    Export {
        /// The open the export fd named.
        open: OwnerId,
        /// The exported object's memory.
        charge: VidCharge,
    },
    /// An object imported from the file of `open` names what that file holds.
    Import {
        /// The open the import fd named.
        open: OwnerId,
    },
}
