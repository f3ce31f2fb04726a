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
        /// The known versions just below and above it, whatever their branch.
        neighbours: Vec<DriverVersion>,
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
                nearest,
                neighbours,
            } => {
                let major = version.major();
                let near = neighbours
                    .iter()
                    .map(DriverVersion::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                let tables = match nearest {
                    Some(n) => {
                        write!(
                            f,
                            "nvproxy has no ABI tables for driver {version} (`nvproxy abi \
                             versions` lists the versions it has). The nearest known version on \
                             branch {major} is {n}, but nvproxy uses only the tables of the exact \
                             version and {n}'s may differ."
                        )?;
                        n.to_string()
                    }
                    None => {
                        write!(
                            f,
                            "nvproxy has no ABI tables for driver {version}, nor for any earlier \
                             version of branch {major} (`nvproxy abi versions` lists the versions \
                             it has; the nearest are {near})."
                        )?;
                        "VERSION".to_owned()
                    }
                };
                write!(
                    f,
                    "\nThe choices: (1) make a node for {version} from its driver sources (its tag \
                     of NVIDIA/open-gpu-kernel-modules, or /usr/src/nvidia-{version} of a DKMS \
                     install):\n    `nvproxy abi check --from-source DIR` shows how it differs, \
                     `nvproxy abi import --from-source DIR --out \
                     /etc/nvproxy/abi.d/{version}.json` writes the node,\n    and `[daemon] \
                     abi_dir = \"/etc/nvproxy/abi.d\"` lets `nvproxy serve` load it;\n(2) serve \
                     {version} with the tables of a known version, at your own risk: `[daemon] \
                     abi_version = \"{tables}\"` or `nvproxy serve --abi-version {tables}`;\n(3) \
                     run a driver version nvproxy has tables for. ADDING_A_DRIVER_VERSION.md adds \
                     a version to the tree for everyone"
                )
            }
        }
    }
}

impl std::error::Error for AbiError {}
