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
        /// the most likely ABI match, which an administrator may choose to use anyway.
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
                "driver {version} is not in the ABI table; the nearest known ancestor on branch \
                 {} is {n}. Its ABI may differ: an administrator can override the version check \
                 to use {n}'s tables anyway",
                version.major()
            ),
            AbiError::UnknownVersion {
                version,
                nearest: None,
            } => write!(
                f,
                "driver {version} is not in the ABI table and no known version on branch {} \
                 precedes it; add a node for it (ADDING_A_DRIVER_VERSION.md)",
                version.major()
            ),
        }
    }
}

impl std::error::Error for AbiError {}
