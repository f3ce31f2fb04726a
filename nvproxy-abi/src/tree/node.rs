//! A node of the version tree: [`AbiNode`] and its [`Support`], plus `v`, the builders' way of
//! writing a version.

use crate::DriverVersion;
use crate::table::DriverAbi;

/// Whether a node's tables and modelled structs are qualified against its facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Its tables and every modelled struct pass the parity test against its facts.
    Supported,
    /// Not qualified, for the reason in [`AbiNode::reason`] (a modelled struct whose layout no
    /// Rust struct matches, or no facts of its own). nvproxy serves it like a supported
    /// version, saying so at start.
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
    /// Why the node is unqualified (`None` for a supported node).
    pub reason: Option<&'static str>,
    /// SHA-256 of NVIDIA's x86_64 `.run` installer, lower-case hex, as gVisor's `version.go`
    /// lists it for the versions it supports (copied, not computed by us); `None` elsewhere.
    pub installer_sha256: Option<&'static str>,
    /// Where the node sits (branch, git parent) and where its facts come from.
    pub note: &'static str,
    /// The facts file holding this version's extract (`facts/<facts>.json`), shared by every
    /// version with the same ABI.
    pub facts: &'static str,
    /// The commit of the release tag in NVIDIA/open-gpu-kernel-modules (`None`: no tag).
    pub commit: Option<&'static str>,
    /// Whether the node reuses its parent's builder: same tables, no ABI change of its own.
    pub same_as_parent: bool,
    pub(super) build: fn() -> DriverAbi,
}

pub(super) const fn v(major: u16, minor: u16, patch: Option<u8>) -> DriverVersion {
    DriverVersion::new(major, minor, patch)
}
