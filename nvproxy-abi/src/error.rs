//! The crate's error type (hand-written: this crate depends on zerocopy only).

use core::fmt;

use crate::DriverVersion;

/// Errors from version parsing and version lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbiError {
    /// The text is not a driver version.
    BadVersion {
        /// What was given.
        input: String,
        /// Why it was rejected.
        why: &'static str,
    },
    /// The version is well formed but has no node in the tree.
    UnknownVersion {
        /// The version asked for.
        version: DriverVersion,
        /// The newest known version on the same branch that is not newer than `version`:
        /// the most likely ABI match (named in the message; nothing uses it in its place).
        nearest: Option<DriverVersion>,
    },
}

impl fmt::Display for AbiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbiError::BadVersion { input, why } => {
                write!(f, "{input:?} is not an NVIDIA driver version: {why}")
            }
            AbiError::UnknownVersion {
                version,
                nearest: Some(n),
            } => write!(
                f,
                "nvproxy has no ABI tables for driver {version} (`nvproxy abi versions` lists \
                 the versions it has). The nearest known version on branch {} is {n}, but \
                 nvproxy uses only the tables of the exact version and {n}'s may differ: \
                 {version} needs a node of its own (ADDING_A_DRIVER_VERSION.md)",
                version.major()
            ),
            AbiError::UnknownVersion {
                version,
                nearest: None,
            } => write!(
                f,
                "nvproxy has no ABI tables for driver {version}, nor for any earlier version of \
                 branch {} (`nvproxy abi versions` lists the versions it has): {version} needs \
                 a node of its own (ADDING_A_DRIVER_VERSION.md)",
                version.major()
            ),
        }
    }
}

impl std::error::Error for AbiError {}
