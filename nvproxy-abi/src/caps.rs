//! Capability bits and translation kinds carried by every table entry.

use core::fmt;

/// A set of driver capabilities, as in gVisor's `nvconf.DriverCaps` and the
/// `NVIDIA_DRIVER_CAPABILITIES` names of nvidia-container-toolkit.
///
/// An entry is usable by an instance when its caps intersect the instance's enabled caps.
/// An entry with **no** caps ([`Caps::NONE`]) is known to the table (so it can be named in audit
/// events and in an admin policy) but no capability enables it: only an explicit admin allowlist
/// entry can (DESIGN.md section 4: ECC, clocks, firmware, ... stay denied unless named).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Caps(u8);

impl Caps {
    /// No capability: reachable only through an explicit admin allowlist entry.
    pub const NONE: Caps = Caps(0);
    /// `compute`: CUDA.
    pub const COMPUTE: Caps = Caps(1 << 0);
    /// `utility`: nvidia-smi / NVML.
    pub const UTILITY: Caps = Caps(1 << 1);
    /// `graphics`: Vulkan / OpenGL.
    pub const GRAPHICS: Caps = Caps(1 << 2);
    /// `video`: NVENC / NVDEC.
    pub const VIDEO: Caps = Caps(1 << 3);
    /// `rdma` (privileged): GPUDirect RDMA, dma-buf export.
    pub const RDMA: Caps = Caps(1 << 4);
    /// `profiling` (privileged): performance counters, register ops (a side channel).
    pub const PROFILING: Caps = Caps(1 << 5);
    /// `fabric-imex-mgmt` (privileged): IMEX daemon and NVLink fabric management.
    pub const FABRIC_IMEX_MGMT: Caps = Caps(1 << 6);
    /// `compute` and `utility`, the default set.
    pub const COMPUTE_UTILITY: Caps = Caps::COMPUTE.union(Caps::UTILITY);
    /// Every capability a container may ask for with `all` (the privileged ones excluded).
    pub const ALL_CONTAINER: Caps = Caps::COMPUTE_UTILITY
        .union(Caps::GRAPHICS)
        .union(Caps::VIDEO);

    const NAMES: [(Caps, &'static str); 7] = [
        (Caps::COMPUTE, "compute"),
        (Caps::UTILITY, "utility"),
        (Caps::GRAPHICS, "graphics"),
        (Caps::VIDEO, "video"),
        (Caps::RDMA, "rdma"),
        (Caps::PROFILING, "profiling"),
        (Caps::FABRIC_IMEX_MGMT, "fabric-imex-mgmt"),
    ];

    /// The union of two sets.
    pub const fn union(self, other: Caps) -> Caps {
        Caps(self.0 | other.0)
    }

    /// Whether the two sets share at least one capability (the gating rule).
    pub const fn intersects(self, other: Caps) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether every capability of `other` is in `self`.
    pub const fn contains(self, other: Caps) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The raw bits.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Parses one capability name (`compute`, `utility`, `graphics`, `video`, `rdma`,
    /// `profiling`, `fabric-imex-mgmt`).
    pub fn from_name(name: &str) -> Option<Caps> {
        Caps::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(c, _)| *c)
    }

    /// The names of the capabilities in the set, in a fixed order.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Caps::NAMES
            .into_iter()
            .filter(move |(c, _)| self.contains(*c))
            .map(|(_, n)| n)
    }
}

impl fmt::Display for Caps {
    /// Comma-separated names, or `admin-only` for the empty set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("admin-only");
        }
        let mut first = true;
        for name in self.names() {
            if !first {
                f.write_str(",")?;
            }
            f.write_str(name)?;
            first = false;
        }
        Ok(())
    }
}

impl fmt::Debug for Caps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Caps({self})")
    }
}

/// What the proxy must do with an entry's parameters besides copying them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Translation {
    /// Copied in and out unchanged (for controls: the opaque params buffer of `paramsSize`).
    Simple,
    /// Contains file descriptor numbers of the caller that must be swapped for host fds.
    Fd,
    /// Contains user pointers that must be redirected to daemon buffers.
    Pointer,
    /// Needs more than translation: object tracking, client checks, flag forcing, rejection.
    Special,
}

impl Translation {
    /// Lower-case name as used in the allowlist (`simple`, `fd`, `pointer`, `special`).
    pub const fn name(self) -> &'static str {
        match self {
            Translation::Simple => "simple",
            Translation::Fd => "fd",
            Translation::Pointer => "pointer",
            Translation::Special => "special",
        }
    }
}

impl fmt::Display for Translation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_caps_display_lists_names_in_order() {
        let caps = Caps::VIDEO.union(Caps::COMPUTE);
        assert_eq!(caps.to_string(), "compute,video");
    }

    #[test]
    fn test_caps_empty_displays_admin_only() {
        assert_eq!(Caps::NONE.to_string(), "admin-only");
    }

    #[test]
    fn test_caps_from_name_roundtrips() {
        assert_eq!(
            Caps::from_name("fabric-imex-mgmt"),
            Some(Caps::FABRIC_IMEX_MGMT)
        );
        assert_eq!(Caps::from_name("display"), None);
    }
}
