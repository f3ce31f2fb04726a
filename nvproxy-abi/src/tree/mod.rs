//! The sparse driver version tree.
//!
//! Each [`AbiNode`] builds its tables by calling its parent's builder and then inserting,
//! overriding or removing only the entries its version changed (STYLE.md section 3, after
//! gVisor's `version.go`). A node exists for every version we have facts for (`abi-facts/`);
//! versions without an ABI change reuse their parent's builder (535.288.01).
//!
//! # Shape, and why
//!
//! NVIDIA maintains release branches in parallel with the main line, so a higher version is not
//! always a later release (570.211.01, January 2026, is newer than 575.64.05, July 2025), and a
//! branch tip can carry backports the next branch does not have. A child must therefore hang off
//! the point where its branch forked, never off a later tip of another branch. What the facts
//! show (tables restricted to our entries; `abi-import suggest` prints the comparisons):
//!
//! - **535 branch.** 535.216.03 → 535.261.03 reworks the ECC counter controls
//!   (`0x20803400` 40 → 96 bytes, `0x20803401` ECI_COUNTERS → VOLATILE_COUNTS, `0x20803402` gone).
//!   545.29.06 still has the 40-byte `0x20803400`, i.e. 535.216.03's state, so the main line
//!   forks from 535.216.03 and 535.261.03 is a branch-only change. The same rework shows up on the
//!   main line only at 565.77 (555 and 560 still have the old numbering) and as a backport in
//!   550.163.01: so it is a 565 change, backported to the 535 and 550 branches.
//! - **550.** 550.163.01 (April 2025) carries backports that 555.58.02 (July 2024) lacks (the ECC
//!   rework, `GET_KEY_ROTATION_STATE`), so 555 is not its child. The changes both share are
//!   the 550 branch point's; they are written once in `r550_branch_point` and applied by both.
//! - **570 / 575.** The DRAM encryption controls arrive at the 570 branch point as
//!   `0x20801355/58/59`; 575 renumbers two of them (`INFOROM_SUPPORT` 0x58 → 0x57, `STATUS`
//!   0x59 → 0x58) and the 570 branch keeps the old numbers (gVisor facts f). So 570.211.01 and
//!   575.64.05 are siblings under 565.77 sharing `r570_branch_point`.
//! - **580 / 590.** 580.142 (March 2026) is newer than 590.48.01 (December 2025) and has
//!   backports 590 lacks (`NVLINK_GET_PLATFORM_INFO` 39 bytes vs 38), so 590 is 580.142's
//!   sibling, sharing `r580_branch_point`, as gVisor forks 590.44.01 from an early 580 release.
//!
//! The branch points themselves (gVisor's unqualified 550.40.07, 570.86.15, 580.65.06) are not
//! nodes: we have no facts for them, so their tables would be unchecked guesses. The shared
//! helpers carry their changes instead. Where a release lies on the main line between two of our
//! nodes (545 → 550 → 555 → 560 → 565), its tip is used as the parent, as gVisor does.
//!
//! ```text
//! 535.216.03 S
//! ├── 535.261.03 S            535 branch: ECC rework backport
//! │   └── 535.288.01 S        identical to 535.261.03
//! └── 545.29.06 U
//!     ├── 550.163.01 S        550 branch point + 550 backports
//!     └── 555.58.02 U         550 branch point + 555
//!         └── 560.35.03 U
//!             └── 565.77 U    ECC rework on the main line
//!                 ├── 570.211.01 S   570 branch point
//!                 └── 575.64.05 S    570 branch point + DRAM renumbering
//!                     ├── 580.142 S      580 branch point + 580 backports
//!                     └── 590.48.01 S    580 branch point + 590
//!                         └── 595.45.04 S
//! ```
//!
//! Installer checksums: supported nodes are meant to carry the SHA-256 of NVIDIA's `.run`
//! installer (DESIGN.md section 6). We have none that we could verify, so every node has `None`
//! today; none were made up.

#[rustfmt::skip] // one entry per line: the tables read like the allowlist
mod base;
#[rustfmt::skip] // one change per line
mod deltas;

use crate::table::DriverAbi;
use crate::{AbiError, DriverVersion};
use deltas::*;

/// Capability shorthands used by the builders.
mod caps_consts {
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
}

/// Whether a node's version has been tested and qualified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Tested and qualified.
    Supported,
    /// Present so that its ABI changes are inherited correctly; not qualified. nvproxy serves
    /// it like a supported version: there is no separate gate or override for it.
    Unqualified,
}

/// One version in the tree.
#[derive(Debug)]
pub struct AbiNode {
    /// The exact driver version.
    pub version: DriverVersion,
    /// The node this one's builder starts from (`None` for the root).
    pub parent: Option<DriverVersion>,
    /// Supported or unqualified.
    pub support: Support,
    /// SHA-256 of NVIDIA's x86_64 `.run` installer, lower-case hex. `None` for every node today:
    /// no checksum has been verified by us yet.
    pub installer_sha256: Option<&'static str>,
    /// One line on where the node sits and what it changes.
    pub note: &'static str,
    /// Whether the node reuses its parent's builder: same tables, no ABI change of its own.
    pub same_as_parent: bool,
    build: fn() -> DriverAbi,
}

impl AbiNode {
    /// Builds this version's four tables (the parent's, then this node's changes).
    pub fn tables(&self) -> DriverAbi {
        (self.build)()
    }

    /// The parent node, if any.
    pub fn parent_node(&self) -> Option<&'static AbiNode> {
        self.parent.and_then(|p| node(&p))
    }

    /// Whether `ancestor` is this node or one of its ancestors.
    pub fn descends_from(&self, ancestor: &DriverVersion) -> bool {
        let mut cur = Some(self);
        while let Some(n) = cur {
            if n.version == *ancestor {
                return true;
            }
            cur = n.parent_node();
        }
        false
    }
}

const fn v(major: u16, minor: u16, patch: Option<u8>) -> DriverVersion {
    DriverVersion::new(major, minor, patch)
}

const fn supported(
    version: DriverVersion,
    parent: Option<DriverVersion>,
    build: fn() -> DriverAbi,
    note: &'static str,
) -> AbiNode {
    let support = Support::Supported;
    AbiNode {
        version,
        parent,
        support,
        installer_sha256: None,
        note,
        same_as_parent: false,
        build,
    }
}

const fn unqualified(
    version: DriverVersion,
    parent: DriverVersion,
    build: fn() -> DriverAbi,
    note: &'static str,
) -> AbiNode {
    let support = Support::Unqualified;
    let parent = Some(parent);
    AbiNode {
        version,
        parent,
        support,
        installer_sha256: None,
        note,
        same_as_parent: false,
        build,
    }
}

/// A supported version whose tables equal its parent's: it reuses the parent's builder.
const fn supported_alias(parent: &AbiNode, version: DriverVersion, note: &'static str) -> AbiNode {
    AbiNode {
        version,
        parent: Some(parent.version),
        support: Support::Supported,
        installer_sha256: None,
        note,
        same_as_parent: true,
        build: parent.build,
    }
}

const V535_216_03: DriverVersion = v(535, 216, Some(3));
const V535_261_03: DriverVersion = v(535, 261, Some(3));
const V545_29_06: DriverVersion = v(545, 29, Some(6));
const V555_58_02: DriverVersion = v(555, 58, Some(2));
const V560_35_03: DriverVersion = v(560, 35, Some(3));
const V565_77: DriverVersion = v(565, 77, None);
const V575_64_05: DriverVersion = v(575, 64, Some(5));
const V590_48_01: DriverVersion = v(590, 48, Some(1));

const N535_261_03: AbiNode = supported(
    V535_261_03,
    Some(V535_216_03),
    v535_261_03,
    "535 branch: ECC rework backport",
);

static NODES: [AbiNode; 13] = [
    supported(
        V535_216_03,
        None,
        base::v535_216_03,
        "root; Debian libcuda1 userspace",
    ),
    N535_261_03,
    supported_alias(&N535_261_03, v(535, 288, Some(1)), "535 branch"),
    unqualified(
        V545_29_06,
        V535_216_03,
        v545_29_06,
        "main line after the 535 fork",
    ),
    supported(
        v(550, 163, Some(1)),
        Some(V545_29_06),
        v550_163_01,
        "550 branch point + backports",
    ),
    unqualified(
        V555_58_02,
        V545_29_06,
        v555_58_02,
        "550 branch point + 555 (main line)",
    ),
    unqualified(
        V560_35_03,
        V555_58_02,
        v560_35_03,
        "main line: Blackwell A classes",
    ),
    unqualified(V565_77, V560_35_03, v565_77, "main line: ECC rework"),
    supported(
        v(570, 211, Some(1)),
        Some(V565_77),
        v570_211_01,
        "570 branch point",
    ),
    supported(
        V575_64_05,
        Some(V565_77),
        v575_64_05,
        "570 branch point + DRAM renumbering",
    ),
    supported(
        v(580, 142, None),
        Some(V575_64_05),
        v580_142,
        "580 branch point + backports",
    ),
    supported(
        V590_48_01,
        Some(V575_64_05),
        v590_48_01,
        "580 branch point + 590 (main line)",
    ),
    supported(
        v(595, 45, Some(4)),
        Some(V590_48_01),
        v595_45_04,
        "main line, newest tag",
    ),
];

/// Every node, parents before children.
pub fn nodes() -> &'static [AbiNode] {
    &NODES
}

fn node(version: &DriverVersion) -> Option<&'static AbiNode> {
    NODES.iter().find(|n| n.version == *version)
}

/// The node for exactly `version`. An unknown version is an error that names the nearest known
/// version on the same branch that is not newer ([`AbiError::UnknownVersion`]).
pub fn find(version: &DriverVersion) -> Result<&'static AbiNode, AbiError> {
    node(version).ok_or_else(|| AbiError::UnknownVersion {
        version: *version,
        nearest: nearest_ancestor(version).map(|n| n.version),
    })
}

/// The newest known node of `version`'s branch (same major) that is not newer than `version`.
pub fn nearest_ancestor(version: &DriverVersion) -> Option<&'static AbiNode> {
    NODES
        .iter()
        .filter(|n| n.version.major() == version.major() && n.version <= *version)
        .max_by_key(|n| n.version)
}

/// The children of a node, in tree order.
pub fn children(version: &DriverVersion) -> impl Iterator<Item = &'static AbiNode> + '_ {
    NODES
        .iter()
        .filter(move |n| n.parent.as_ref() == Some(version))
}
