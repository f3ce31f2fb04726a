//! Capability shorthands used by the builders.

use crate::Caps;

/// compute, utility.
pub const CU: Caps = Caps::COMPUTE_UTILITY;
/// compute, utility, graphics.
pub const CUG: Caps = Caps::COMPUTE_UTILITY.union(Caps::GRAPHICS);
/// compute, utility, video.
pub const CUV: Caps = Caps::COMPUTE_UTILITY.union(Caps::VIDEO);
/// graphics.
pub const G: Caps = Caps::GRAPHICS;
/// video.
pub const V: Caps = Caps::VIDEO;
/// graphics, video.
pub const GV: Caps = Caps::GRAPHICS.union(Caps::VIDEO);
/// profiling (privileged).
pub const P: Caps = Caps::PROFILING;
/// rdma (privileged).
pub const RDMA: Caps = Caps::RDMA;
/// fabric-imex-mgmt (privileged).
pub const IMEX: Caps = Caps::FABRIC_IMEX_MGMT;
/// No capability: admin allowlist only.
pub const ADMIN: Caps = Caps::NONE;
