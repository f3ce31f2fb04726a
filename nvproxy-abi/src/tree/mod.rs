//! The driver version tree: one node for every NVIDIA open-gpu-kernel-modules release tag from 535
//! on, plus the newer releases gVisor's version tree knows (no tag in our mirror).
//!
//! Each [`AbiNode`] builds its tables by calling its parent's builder and then inserting,
//! overriding or removing only the entries its version changed (STYLE.md section 3, after
//! gVisor's `version.go`); a node whose tables equal its parent's reuses the parent's builder.
//! The builders and the node list are generated (`generated.rs`, by `abi-import tree
//! nvproxy-abi/facts/index.tsv`) from two inputs:
//!
//! - **The index** (`facts/index.tsv`): per version its parent, its facts file, the tag's commit,
//!   the installer checksum, support and a note. Versions with the same ABI (the same extract:
//!   tables and modelled structs) share one facts file, so 149 versions need 24 files.
//! - **The facts** (`facts/<version>.json`, written by `abi-import extract` from the abi-facts
//!   file `abi-import from-source` derives from the tag's sources). A node's delta is the
//!   difference between the tables its facts and its parent's facts imply (`abi-import delta`);
//!   translation kind and caps, which are policy, come from the existing nodes.
//!
//! # Shape: the branch history of NVIDIA's repository
//!
//! A node's parent is the release its tag's commit was made on in NVIDIA/open-gpu-kernel-modules
//! (the nearest tagged ancestor, `git describe --tags <tag>^`; four parents are named by the
//! parent commit's message where that commit is an untagged copy of a release, noted in the
//! index). NVIDIA maintains branches in parallel, so a higher version is not always a later
//! release (570.211.01, January 2026, is newer than 575.64.05), and a branch tip can carry
//! backports the next branch lacks; following the commits puts each change where it happened.
//! What the history says, in short:
//!
//! - 535.43.02 is the root (its parent is 530.41.03). The 535 branch runs 535.54.03 → 535.86.05 →
//!   … → 535.288.01; the 535.43.08–535.43.28 releases are a side line of 535.43.02.
//! - Each new branch starts from a release of the one before: 545.23.06 from 535.113.01,
//!   550.40.07 from 545.29.06, 555.42.02 from 550.78, 560.28.03 from 555.58.02, 565.57.01 from
//!   560.35.03, 570.86.15 from 565.77, 575.51.02 from 570.133.20, 580.65.06 from 575.64.05,
//!   590.44.01 from 580.105.08, 595.44.02 and 595.45.04 from 590.48.01.
//! - So 550.163.01 carries backports 555 never had (555 forks at 550.78), 575 renumbers two DRAM
//!   encryption controls that the 570 branch keeps (575 forks at 570.133.20), and 580.142 has
//!   backports 590 lacks (590 forks at 580.105.08).
//!
//! The root's builder starts from `base.rs`, the table generated once from 535.216.03's facts and
//! gVisor's allowlist, and applies the delta 535.216.03 → 535.43.02.
//!
//! # The versions without a tag
//!
//! 535.309.01, 580.159.03, 580.159.04 and 580.173.02 are in gVisor's tree with the ABI of
//! 535.288.01, 580.126.20, 580.126.20 and 580.159.04 (gVisor supports them); they share those
//! versions' facts. 595.71.05 is in gVisor's tree (unsupported there) with 590.48.01's ABI; our
//! 590.48.01 and 595.45.04 tables differ in sizes gVisor does not check, so the node takes
//! 595.45.04's tables, its predecessor on the 595 branch, and is unqualified.
//!
//! # Support and checksums
//!
//! A node is supported when its tables and every modelled struct pass the parity test against
//! its facts (`tests/parity.rs`, which also checks that every unqualified node has a reason and
//! every failing node is unqualified). The installer checksums are the x86_64 `.run` SHA-256
//! values gVisor's `version.go` lists for the versions it supports: copied, not computed by us.

#[rustfmt::skip] // one entry per line: the tables read like the allowlist
mod base;
mod caps_consts;
#[rustfmt::skip] // one node and one change per line
mod generated;
mod node;

pub use node::{AbiNode, Support};

use crate::table::DriverAbi;
use crate::{AbiError, DriverVersion};

/// The first major version whose `VID_HEAP_CONTROL` allocates EGM
/// ([`DriverAbi::vid_heap_egm`]; read in the driver source at 545.29.06 and 550.40.07).
const VID_HEAP_EGM_SINCE: u16 = 550;

impl AbiNode {
    /// Builds this version's four tables (the parent's, then this node's changes).
    pub fn tables(&self) -> DriverAbi {
        let mut t = (self.build)();
        t.legacy_categories = crate::legacy_categories(self.version).collect();
        t.vid_heap_egm = self.version.major() >= VID_HEAP_EGM_SINCE;
        t
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

/// The table `base.rs` holds (535.216.03's, generated once from its facts and gVisor's
/// allowlist): the root's builder starts from it. For `abi-import tree`, which derives every
/// node's delta from the facts.
pub fn base_table() -> DriverAbi {
    base::table_535_216_03()
}

/// Every node, parents before children.
pub fn nodes() -> &'static [AbiNode] {
    &generated::NODES
}

fn node(version: &DriverVersion) -> Option<&'static AbiNode> {
    nodes().iter().find(|n| n.version == *version)
}

/// The node for exactly `version`. An unknown version is an error that names the nearest known
/// version on the same branch that is not newer ([`AbiError::UnknownVersion`]).
pub fn find(version: &DriverVersion) -> Result<&'static AbiNode, AbiError> {
    node(version).ok_or_else(|| AbiError::UnknownVersion {
        version: *version,
        nearest: nearest_ancestor(version).map(|n| n.version),
        neighbours: neighbours(version),
    })
}

/// The known versions just below and just above `version` (whatever their branch).
fn neighbours(version: &DriverVersion) -> Vec<DriverVersion> {
    let below = nodes()
        .iter()
        .map(|n| n.version)
        .filter(|v| v < version)
        .max();
    let above = nodes()
        .iter()
        .map(|n| n.version)
        .filter(|v| v > version)
        .min();
    below.into_iter().chain(above).collect()
}

/// The newest known node of `version`'s branch (same major) that is not newer than `version`.
pub fn nearest_ancestor(version: &DriverVersion) -> Option<&'static AbiNode> {
    nodes()
        .iter()
        .filter(|n| n.version.major() == version.major() && n.version <= *version)
        .max_by_key(|n| n.version)
}

/// The children of a node, in tree order.
pub fn children(version: &DriverVersion) -> impl Iterator<Item = &'static AbiNode> + '_ {
    nodes()
        .iter()
        .filter(move |n| n.parent.as_ref() == Some(version))
}
