//! An instance's policy: its GPUs, its driver capabilities, the admin's overrides, its mode.
//!
//! # What a denial looks like to the client
//!
//! A denied entry looks exactly as if the driver lacked it:
//!
//! - a denied **control** answers `NV_ERR_NOT_SUPPORTED` (0x56) in `NVOS54_PARAMETERS.status`
//!   with ioctl success, the driver's answer for a control it does not have
//!   (`resControlLookup` failure);
//! - a denied **alloc class** answers `NV_ERR_INVALID_CLASS` (0x22) in the status, with ioctl
//!   success;
//! - a denied **escape** fails the ioctl with `EINVAL`, the driver's answer for an escape it does
//!   not know (`nvidia_ioctl`, `kernel-open/nvidia/nv.c`).
//!
//! Why not `NV_ERR_INSUFFICIENT_PERMISSIONS` or `EPERM`: CUDA and NVML probe optional features
//! by trying them, and treat "not supported" / "invalid class" as "this GPU or driver lacks the
//! feature" and go on (gVisor commit ba5367228: CUDA *requires* `NV_ERR_INVALID_CLASS` for
//! `NV_CONFIDENTIAL_COMPUTE` to proceed; gVisor facts section 0). An errno from
//! `NV_ESC_RM_CONTROL` or `NV_ESC_RM_ALLOC` means a broken driver to libcuda, and permission
//! statuses surface as hard `CUDA_ERROR_NOT_PERMITTED` on some paths. So a workload that merely
//! probes a denied feature keeps working, and the audit trail (decision `denied`, not
//! `allowed`) is where the admin sees the difference.
//!
//! # Audit mode
//!
//! In [`Mode::Audit`] every entry the ABI table knows is allowed, and what enforce mode would
//! have denied is recorded as `audit-would-deny`. Audit mode relaxes only the allowlist
//! (capabilities, admin-only entries, the admin's `deny` list). It never relaxes isolation:
//! handles of other instances, GPUs outside the set and foreign fds are refused in both modes,
//! and entries the table does not know get the driver's "unknown" answers in both modes.
//!
//! # Allowlist-only policies
//!
//! By default an entry is permitted by its table capabilities ([`InstancePolicy::caps`]), with
//! the admin's [`InstancePolicy::allow`] and [`InstancePolicy::deny`] on top. A policy with
//! [`InstancePolicy::only`] set ignores the caps and [`ADMIN_ONLY`]: an entry is permitted iff
//! it is named in `only` (or in `allow`) and not in `deny`. The names are the driver names the
//! audit trail uses (`NV_ESC_*`, controls, classes, `UVM_*`), so the set can be built from an
//! audit log (`nvproxy policy suggest --from-audit`). Two things follow from the dispatch order:
//!
//! - a control or class reaches its own check only through its escape: a policy that names
//!   controls must name `NV_ESC_RM_CONTROL`, one that names classes `NV_ESC_RM_ALLOC` (the
//!   audit trail counts such a call once, under the control's or class's name);
//! - entries the table does not know are never permitted by any policy, `only` included: they
//!   get the driver's "unknown" answers (an escape or UVM ioctl `EINVAL`, a control
//!   `NV_ERR_NOT_SUPPORTED`, a class `NV_ERR_INVALID_CLASS`) and are audited as `denied`, in
//!   both modes, before the policy is asked. Naming them in `only` changes nothing (the daemon
//!   refuses such names when it loads a policy file).
//!
//! # Pass-through controls
//!
//! Two control families have no table entries and are forwarded as opaque bytes (see
//! `control.rs`): legacy GSS controls (`cmd & 0x8000 != 0`, which the driver hands to GSP
//! firmware) and `NV2081_BINAPI` controls (`cmd >> 16 == 0x2081`); a command with both
//! properties is a legacy GSS control, as the driver routes it. A policy names them either as
//! the family ([`RM_GSS_LEGACY`], [`NV2081_BINAPI`]: every command of it; both families carry
//! the caps compute and utility) or as one command, in the form the audit trail names them:
//! `RM_GSS_LEGACY 0x20808159` (family, one space, `{:#010x}`; see [`pass_through_name`]). The
//! check for such a command asks for both names: `deny` holding either denies it; `allow`, or
//! with [`InstancePolicy::only`] set the `only` set, holding either permits it. Privileged
//! legacy GSS controls (`cmd & 0xC000 == 0xC000`) are refused before the policy is asked, in
//! both modes, so no policy can name them.

use std::collections::BTreeSet;

use nvproxy_abi::{Caps, NV2081_BINAPI_CLASS, RM_GSS_LEGACY_MASK, RM_GSS_LEGACY_MASK_PRIVILEGED};
use serde::Serialize;

/// Enforce the policy, or only record what it would deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Deny what the policy does not allow.
    #[default]
    Enforce,
    /// Allow every entry the table knows; record what enforce mode would deny.
    Audit,
}

/// Entries that stay denied unless the admin names them in [`InstancePolicy::allow`], whatever
/// their table capabilities (DESIGN.md section 4: firmware/InfoROM, ECC, clocks and power, reset,
/// MIG). The table already gives ECC controls no capability; these are the ones it gives
/// `compute,utility` that still touch firmware.
pub const ADMIN_ONLY: &[&str] = &["NV208F_CTRL_CMD_GPU_VERIFY_INFOROM"];

/// Policy name of the legacy GSS control family (`cmd & 0x8000 != 0`), and the first word of
/// its commands' names.
pub const RM_GSS_LEGACY: &str = "RM_GSS_LEGACY";
/// Policy name of the `NV2081_BINAPI` control family (`cmd >> 16 == 0x2081`), and the first
/// word of its commands' names. (A class of the same name exists; the flat policy sets do not
/// tell the two apart, so naming that class permits every `NV2081_BINAPI` control too.)
pub const NV2081_BINAPI: &str = "NV2081_BINAPI";
/// The control families the proxy passes through without table entries.
pub const PASS_THROUGH_FAMILIES: [&str; 2] = [RM_GSS_LEGACY, NV2081_BINAPI];

/// The pass-through family of control `cmd`, as the dispatcher decides it (legacy GSS first,
/// as the driver's `RmDeprecatedGetControlHandler` routes it before the resource server), or
/// `None` for a control that is looked up in the table.
pub fn pass_through_family(cmd: u32) -> Option<&'static str> {
    if cmd & RM_GSS_LEGACY_MASK != 0 {
        Some(RM_GSS_LEGACY)
    } else if cmd >> 16 == NV2081_BINAPI_CLASS {
        Some(NV2081_BINAPI)
    } else {
        None
    }
}

/// The family of a pass-through command's name (`RM_GSS_LEGACY 0x20808159` →
/// `RM_GSS_LEGACY`), without checking the number: used on the request path, where the name was
/// built by the proxy. `None` for every other name (table names have no space).
fn family_of_command_name(name: &str) -> Option<&'static str> {
    if is_legacy_name(name) {
        return Some(RM_GSS_LEGACY);
    }
    let (family, _) = name.split_once(' ')?;
    PASS_THROUGH_FAMILIES.into_iter().find(|f| *f == family)
}

/// Whether `name` has the shape of a legacy GSS command's name from the headers
/// (`nvproxy_abi::LegacyControl`): `CONTROL (legacy)` or `NVxxxx_CTRL_<CATEGORY>_LEGACY_*
/// 0xNN`. Used on the request path, where the proxy built the name from the table.
pub fn is_legacy_name(name: &str) -> bool {
    name.ends_with(nvproxy_abi::legacy::LEGACY_SUFFIX)
        || name.split_once(' ').is_some_and(|(cat, _)| {
            cat.ends_with("_LEGACY_NON_PRIVILEGED") || cat.ends_with("_LEGACY_PRIVILEGED")
        })
}

/// Why a name that starts with a pass-through family is no valid policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PassThroughNameError {
    /// Not `FAMILY` nor `FAMILY 0x` followed by 1 to 8 hex digits.
    #[error(
        "{name:?} is not a valid {family} policy name: want {family:?} (every command) or \
         \"{family} 0x\" and up to 8 hex digits (one command, e.g. \"{family} {example:#010x}\")"
    )]
    Malformed {
        /// The name as written.
        name: String,
        /// The family it starts with.
        family: &'static str,
        /// A command of that family.
        example: u32,
    },
    /// The command is not in the family it was named under.
    #[error("{name:?}: {cmd:#010x} is outside the {family} family ({why})")]
    WrongFamily {
        /// The name as written.
        name: String,
        /// The family it was named under.
        family: &'static str,
        /// The command.
        cmd: u32,
        /// What the command is instead.
        why: String,
    },
    /// A privileged legacy GSS control (`cmd & 0xC000 == 0xC000`).
    #[error(
        "{name:?}: never forwarded: the proxy refuses privileged legacy GSS controls \
         ({cmd:#010x} & 0xc000 == 0xc000)"
    )]
    Privileged {
        /// The name as written.
        name: String,
        /// The command.
        cmd: u32,
    },
}

/// Checks and normalises a policy name of a pass-through control. `Ok(None)`: the name does
/// not start with a pass-through family followed by a non-identifier character (a table name,
/// or nothing; the caller checks it against the table). `Ok(Some(name))`: the family itself,
/// or one command of it in the audit trail's form, `FAMILY 0x%08x` (the hex digits are read in
/// any case, written lowercase). An error for a malformed number, a privileged legacy GSS
/// command (`cmd & 0xC000 == 0xC000`, under either family) and a command outside the family
/// (`RM_GSS_LEGACY`: `cmd & 0x8000 != 0`; `NV2081_BINAPI`: `cmd >> 16 == 0x2081` and bit
/// 0x8000 clear, else the command is a legacy GSS one).
pub fn pass_through_name(name: &str) -> Result<Option<String>, PassThroughNameError> {
    let Some((family, rest)) = PASS_THROUGH_FAMILIES.into_iter().find_map(|f| {
        let rest = name.strip_prefix(f)?;
        let word_goes_on = rest
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        (!word_goes_on).then_some((f, rest))
    }) else {
        return Ok(None);
    };
    if rest.is_empty() {
        return Ok(Some(family.to_owned()));
    }
    let example = if family == RM_GSS_LEGACY {
        0x2080_8159
    } else {
        0x2081_0108
    };
    let malformed = || PassThroughNameError::Malformed {
        name: name.to_owned(),
        family,
        example,
    };
    let digits = rest
        .strip_prefix(" 0x")
        .or_else(|| rest.strip_prefix(" 0X"))
        .ok_or_else(malformed)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(malformed());
    }
    let cmd = u32::from_str_radix(digits, 16).map_err(|_| malformed())?;
    if cmd & RM_GSS_LEGACY_MASK_PRIVILEGED == RM_GSS_LEGACY_MASK_PRIVILEGED {
        return Err(PassThroughNameError::Privileged {
            name: name.to_owned(),
            cmd,
        });
    }
    let actual = pass_through_family(cmd);
    if actual != Some(family) {
        return Err(PassThroughNameError::WrongFamily {
            name: name.to_owned(),
            family,
            cmd,
            why: match actual {
                Some(RM_GSS_LEGACY) => {
                    format!("bit 0x8000 makes it a legacy GSS control: {RM_GSS_LEGACY} {cmd:#010x}")
                }
                Some(other) => format!("bit 0x8000 is clear: {other} {cmd:#010x}"),
                None if family == RM_GSS_LEGACY => "bit 0x8000 is clear".into(),
                None => format!(
                    "its class is {:#06x}, not {NV2081_BINAPI_CLASS:#06x}",
                    cmd >> 16
                ),
            },
        });
    }
    Ok(Some(format!("{family} {cmd:#010x}")))
}

/// One instance's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstancePolicy {
    /// The instance's name (audit events carry it).
    pub name: String,
    /// Enabled driver capabilities (`compute`, `utility`, ...).
    pub caps: Caps,
    /// The instance's GPUs as host minor numbers, in the tenant's order: the tenant's
    /// `/dev/nvidia0` is host `/dev/nvidia<gpus[0]>`.
    pub gpus: Vec<u32>,
    /// Enforce or audit.
    pub mode: Mode,
    /// Entry names (`NV_ESC_*`, control, class names) the admin allows beyond the caps.
    /// Pass-through controls by family or command, normalised ([`pass_through_name`]).
    pub allow: BTreeSet<String>,
    /// Entry names the admin denies although the caps would allow them (wins over `allow`
    /// and `only`). A family's name denies each of its commands.
    pub deny: BTreeSet<String>,
    /// Allowlist-only: when set, exactly these entries (and those in `allow`) are permitted,
    /// whatever the caps; see the module docs. Pass-through names as in `allow`.
    pub only: Option<BTreeSet<String>>,
    /// Whether a client may `mmap` `/dev/nvidia-uvm` (default `true`). The mapping is made on
    /// the instance's own host UVM file, handed to the tenant, which can then issue raw UVM
    /// ioctls on its va_space around the proxy (docs/security.md, UVM); `false` turns the
    /// path off (the mmap fails with `ENODEV`, as on a CUSE node), at the price of CUDA's
    /// managed memory and its UVM initialisation.
    pub uvm_mmap: bool,
    /// What the instance may hold of the daemon's resources.
    pub quotas: Quotas,
    /// The interleave level of the instance's channel groups (`schedule.rs`).
    pub priority: crate::schedule::Priority,
}

/// Per-instance bounds on what a tenant can make the daemon hold (issue 9, finding 2). Each is
/// answered to the offending tenant only, with the driver's own answer for running out:
/// - `open_files`: opens of the instance's nodes (`/dev/nvidiactl`, `/dev/nvidia<N>`,
///   `/dev/nvidia-uvm`), each a host file of the daemon (a closed control open that another
///   open's `REGISTER_FD` keeps alive included, `Proxy::release`); past it `open` fails with `ENOMEM`,
///   what `nvidia_open` answers when it cannot allocate the open's state
///   (`nv_alloc_file_private`, `kernel-open/nvidia/nv.c`) and `uvm_open` when the va_space
///   cannot be created;
/// - `objects`: RM clients and objects in the instance's object table; an allocation past it
///   gets `NV_ERR_INSUFFICIENT_RESOURCES`, RM's answer when a client's handle space is
///   exhausted (`clientGenResourceHandle`, `rs_client.c`), without reaching the driver;
/// - `in_flight`: requests of the instance being handled at once, over all its nodes; past it
///   the ioctl fails with `EAGAIN` (the driver has no such bound; the serving threads are the
///   daemon's, and one tenant must not hold them all);
/// - `os_descriptor_bytes`: bytes of OS-descriptor memory (`osdesc.rs`) the instance's live
///   objects pin at once. With the real driver the pages are pinned through the worker's
///   mapping of the tenant's file, so a sparse file costs the tenant nothing and the worker
///   (its memory cgroup) everything; past it the allocation gets `NV_ERR_INVALID_ADDRESS`,
///   what the driver answers when it cannot pin the pages (`os_lock_user_pages`,
///   `kernel-open/nvidia/os-mlock.c`, then `os_lookup_user_io_memory` for memory that is no
///   I/O mapping), without reaching it;
/// - `gpu_memory`: video memory per GPU (`vidmem.rs`); past it the allocation gets
///   `NV_ERR_NO_MEMORY`, the driver's answer for a full GPU, without reaching it;
/// - `system_memory`: system memory the driver allocates for the instance (`vidmem.rs`: RM
///   takes these pages from the kernel unaccounted, so no memory cgroup of the tenant's bounds
///   them); past it `NV_ERR_NO_MEMORY`, the driver's answer when the host has no pages left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    /// Open files of the instance's nodes.
    pub open_files: usize,
    /// RM clients plus objects.
    pub objects: usize,
    /// Requests in progress at once.
    pub in_flight: usize,
    /// Bytes of OS-descriptor memory pinned at once.
    pub os_descriptor_bytes: u64,
    /// Bytes of video memory the instance's objects hold at once on each of its GPUs
    /// (`vidmem.rs`); `None`: no quota.
    pub gpu_memory: Option<u64>,
    /// Bytes of system memory the instance's objects hold at once (`vidmem.rs`); `None`: no
    /// quota.
    pub system_memory: Option<u64>,
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            open_files: 4096,
            objects: 131_072,
            in_flight: 256,
            os_descriptor_bytes: 4 << 30,
            gpu_memory: None,
            system_memory: None,
        }
    }
}

impl InstancePolicy {
    /// A policy with the given caps and GPUs, enforce mode, no overrides.
    pub fn new(name: impl Into<String>, caps: Caps, gpus: Vec<u32>) -> Self {
        Self {
            name: name.into(),
            caps,
            gpus,
            mode: Mode::Enforce,
            allow: BTreeSet::new(),
            deny: BTreeSet::new(),
            only: None,
            uvm_mmap: true,
            quotas: Quotas::default(),
            priority: crate::schedule::Priority::default(),
        }
    }

    /// The caps that gate entries: `compute` and `utility` are interchangeable (gVisor facts
    /// section g: every entry carries both or neither).
    pub fn effective_caps(&self) -> Caps {
        if self.caps.intersects(Caps::COMPUTE_UTILITY) {
            self.caps.union(Caps::COMPUTE_UTILITY)
        } else {
            self.caps
        }
    }

    /// Whether enforce mode allows the entry `name` with table caps `caps`: not in `deny`;
    /// then named in `allow`, or, with `only` set, named there (caps ignored), else enabled
    /// by the caps and not [`ADMIN_ONLY`]. A pass-through command's name
    /// (`RM_GSS_LEGACY 0x20808159`) is also named by its family's name (`RM_GSS_LEGACY`) in
    /// each of the three sets. Allocates nothing.
    pub fn permits(&self, name: &str, caps: Caps) -> bool {
        // The default policy names nothing: the caps decide, without a look at the sets.
        if self.deny.is_empty() && self.allow.is_empty() && self.only.is_none() {
            return caps.intersects(self.effective_caps()) && !ADMIN_ONLY.contains(&name);
        }
        // The family is looked for only when a set names anything (the default policy's
        // sets are empty: no string scan per request).
        let family = std::cell::OnceCell::new();
        let named = |set: &BTreeSet<String>| {
            !set.is_empty()
                && (set.contains(name)
                    || family
                        .get_or_init(|| family_of_command_name(name))
                        .is_some_and(|f| set.contains(f)))
        };
        if named(&self.deny) {
            return false;
        }
        if named(&self.allow) {
            return true;
        }
        if let Some(only) = &self.only {
            return named(only);
        }
        !ADMIN_ONLY.contains(&name) && caps.intersects(self.effective_caps())
    }

    /// The verdict for an entry under this policy's mode.
    pub fn judge(&self, name: &str, caps: Caps) -> Verdict {
        match (self.permits(name, caps), self.mode) {
            (true, _) => Verdict::Allow,
            (false, Mode::Enforce) => Verdict::Deny,
            (false, Mode::Audit) => Verdict::AuditWouldDeny,
        }
    }
}

/// The outcome of a policy check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed.
    Allow,
    /// Denied (enforce mode).
    Deny,
    /// Enforce mode would deny it; audit mode lets it through.
    AuditWouldDeny,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_compute_enables_utility_entries() {
        let p = InstancePolicy::new("t", Caps::COMPUTE, vec![0]);
        assert!(p.permits("X", Caps::UTILITY));
    }

    #[test]
    fn test_empty_caps_entry_needs_allow() {
        let mut p = InstancePolicy::new("t", Caps::ALL_CONTAINER, vec![0]);
        assert!(!p.permits("NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS", Caps::NONE));
        p.allow
            .insert("NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS".into());
        assert!(p.permits("NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS", Caps::NONE));
    }

    #[test]
    fn test_deny_wins_over_caps_and_allow() {
        let mut p = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![0]);
        p.allow.insert("A".into());
        p.deny.insert("A".into());
        assert!(!p.permits("A", Caps::COMPUTE));
    }

    #[test]
    fn test_admin_only_list_overrides_caps() {
        let p = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![0]);
        assert!(!p.permits(ADMIN_ONLY[0], Caps::COMPUTE_UTILITY));
    }

    #[test]
    fn test_graphics_only_instance_lacks_compute_entries() {
        let p = InstancePolicy::new("t", Caps::GRAPHICS, vec![0]);
        assert!(!p.permits("X", Caps::COMPUTE_UTILITY));
    }

    fn only(names: &[&str]) -> InstancePolicy {
        let mut p = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![0]);
        p.only = Some(names.iter().map(|n| (*n).to_owned()).collect());
        p
    }

    #[test]
    fn test_only_permits_exactly_the_named_entries_whatever_the_caps() {
        let p = only(&[
            "NV_ESC_CARD_INFO",
            "NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS",
        ]);
        assert!(p.permits("NV_ESC_CARD_INFO", Caps::COMPUTE_UTILITY));
        // Named but without caps (admin-only in the caps form): permitted.
        assert!(p.permits("NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS", Caps::NONE));
        // Enabled by the caps but not named: refused.
        assert!(!p.permits("NV_ESC_RM_CONTROL", Caps::COMPUTE_UTILITY));
        assert!(!p.permits("UVM_INITIALIZE", Caps::ALL_CONTAINER));
    }

    #[test]
    fn test_only_names_admin_only_entries_too() {
        let p = only(&[ADMIN_ONLY[0]]);
        assert!(p.permits(ADMIN_ONLY[0], Caps::COMPUTE_UTILITY));
    }

    #[test]
    fn test_only_empty_permits_nothing() {
        let p = only(&[]);
        assert!(!p.permits("NV_ESC_CHECK_VERSION_STR", Caps::ALL_CONTAINER));
    }

    #[test]
    fn test_deny_wins_over_only_and_allow_adds_to_it() {
        let mut p = only(&["A", "B"]);
        p.deny.insert("A".into());
        p.allow.insert("C".into());
        assert!(!p.permits("A", Caps::COMPUTE));
        assert!(p.permits("B", Caps::NONE));
        assert!(p.permits("C", Caps::NONE));
    }

    #[test]
    fn test_only_in_audit_mode_judges_would_deny() {
        let mut p = only(&["A"]);
        p.mode = Mode::Audit;
        assert_eq!(p.judge("A", Caps::NONE), Verdict::Allow);
        assert_eq!(p.judge("B", Caps::COMPUTE_UTILITY), Verdict::AuditWouldDeny);
        p.mode = Mode::Enforce;
        assert_eq!(p.judge("B", Caps::COMPUTE_UTILITY), Verdict::Deny);
    }

    // ---- pass-through controls: family and command names ----------------------------------

    const CMD: &str = "RM_GSS_LEGACY 0x20808159";
    const OTHER: &str = "RM_GSS_LEGACY 0x20808162";
    const BINAPI: &str = "NV2081_BINAPI 0x20810108";

    #[test]
    fn test_only_with_a_command_name_permits_that_command_alone() {
        let p = only(&[CMD]);
        assert_eq!(p.judge(CMD, Caps::COMPUTE_UTILITY), Verdict::Allow);
        assert_eq!(p.judge(OTHER, Caps::COMPUTE_UTILITY), Verdict::Deny);
        assert_eq!(p.judge(BINAPI, Caps::COMPUTE_UTILITY), Verdict::Deny);
    }

    #[test]
    fn test_only_with_a_family_name_permits_every_command_of_it() {
        let p = only(&[RM_GSS_LEGACY]);
        assert_eq!(p.judge(CMD, Caps::COMPUTE_UTILITY), Verdict::Allow);
        assert_eq!(p.judge(OTHER, Caps::COMPUTE_UTILITY), Verdict::Allow);
        assert_eq!(p.judge(BINAPI, Caps::COMPUTE_UTILITY), Verdict::Deny);
    }

    #[test]
    fn test_allow_with_a_command_name_adds_it_to_only() {
        let mut p = only(&[]);
        p.allow.insert(BINAPI.into());
        assert_eq!(p.judge(BINAPI, Caps::COMPUTE_UTILITY), Verdict::Allow);
        assert_eq!(
            p.judge("NV2081_BINAPI 0x20810109", Caps::COMPUTE_UTILITY),
            Verdict::Deny
        );
    }

    #[test]
    fn test_deny_of_the_command_or_its_family_wins_over_only() {
        let mut p = only(&[RM_GSS_LEGACY]);
        p.deny.insert(OTHER.into());
        assert_eq!(p.judge(CMD, Caps::COMPUTE_UTILITY), Verdict::Allow);
        assert_eq!(p.judge(OTHER, Caps::COMPUTE_UTILITY), Verdict::Deny);
        let mut p = only(&[CMD]);
        p.deny.insert(RM_GSS_LEGACY.into());
        assert_eq!(p.judge(CMD, Caps::COMPUTE_UTILITY), Verdict::Deny);
    }

    #[test]
    fn test_caps_form_permits_pass_through_commands_unless_denied_by_family_or_command() {
        let mut p = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![0]);
        assert_eq!(p.judge(CMD, Caps::COMPUTE_UTILITY), Verdict::Allow);
        p.deny.insert(CMD.into());
        assert_eq!(p.judge(CMD, Caps::COMPUTE_UTILITY), Verdict::Deny);
        assert_eq!(p.judge(OTHER, Caps::COMPUTE_UTILITY), Verdict::Allow);
        p.deny.insert(NV2081_BINAPI.into());
        assert_eq!(p.judge(BINAPI, Caps::COMPUTE_UTILITY), Verdict::Deny);
    }

    #[test]
    fn test_caps_form_without_caps_needs_the_family_or_the_command_in_allow() {
        let mut p = InstancePolicy::new("t", Caps::GRAPHICS, vec![0]);
        assert_eq!(p.judge(CMD, Caps::COMPUTE_UTILITY), Verdict::Deny);
        p.allow.insert(CMD.into());
        assert_eq!(p.judge(CMD, Caps::COMPUTE_UTILITY), Verdict::Allow);
        assert_eq!(p.judge(OTHER, Caps::COMPUTE_UTILITY), Verdict::Deny);
        p.allow.insert(RM_GSS_LEGACY.into());
        assert_eq!(p.judge(OTHER, Caps::COMPUTE_UTILITY), Verdict::Allow);
    }

    #[test]
    fn test_only_with_a_command_name_in_audit_mode_judges_others_would_deny() {
        let mut p = only(&[CMD]);
        p.mode = Mode::Audit;
        assert_eq!(p.judge(CMD, Caps::COMPUTE_UTILITY), Verdict::Allow);
        assert_eq!(
            p.judge(OTHER, Caps::COMPUTE_UTILITY),
            Verdict::AuditWouldDeny
        );
    }

    #[test]
    fn test_a_family_word_alone_in_a_table_name_is_no_family() {
        // Only "FAMILY <rest>" names are commands of a family.
        let p = only(&[RM_GSS_LEGACY]);
        assert!(!p.permits("RM_GSS_LEGACY_X", Caps::COMPUTE_UTILITY));
        assert!(!p.permits("NV2080_CTRL_CMD_X 0x1", Caps::COMPUTE_UTILITY));
    }

    #[test]
    fn test_pass_through_family_tests_legacy_gss_first() {
        assert_eq!(pass_through_family(0x2080_8159), Some(RM_GSS_LEGACY));
        assert_eq!(pass_through_family(0x2081_0108), Some(NV2081_BINAPI));
        assert_eq!(pass_through_family(0x2081_8001), Some(RM_GSS_LEGACY));
        assert_eq!(pass_through_family(0x2080_0110), None);
    }

    #[test]
    fn test_pass_through_name_accepts_families_and_normalises_commands() {
        for (name, want) in [
            ("RM_GSS_LEGACY", "RM_GSS_LEGACY"),
            ("NV2081_BINAPI", "NV2081_BINAPI"),
            (CMD, CMD),
            ("RM_GSS_LEGACY 0X2080815F", "RM_GSS_LEGACY 0x2080815f"),
            ("RM_GSS_LEGACY 0x8001", "RM_GSS_LEGACY 0x00008001"),
            ("NV2081_BINAPI 0x20810AbC", "NV2081_BINAPI 0x20810abc"),
        ] {
            assert_eq!(pass_through_name(name), Ok(Some(want.to_owned())), "{name}");
        }
    }

    #[test]
    fn test_pass_through_name_leaves_other_names_to_the_table() {
        for name in [
            "NV2080_CTRL_CMD_GPU_GET_NAME_STRING",
            "RM_GSS_LEGACYX",
            "",
            "rm_gss_legacy",
        ] {
            assert_eq!(pass_through_name(name), Ok(None), "{name}");
        }
    }

    #[test]
    fn test_pass_through_name_refuses_malformed_numbers() {
        for name in [
            "RM_GSS_LEGACY 20808159",
            "RM_GSS_LEGACY 0x",
            "RM_GSS_LEGACY 0x2080815g",
            "RM_GSS_LEGACY 0x120808159",
            "RM_GSS_LEGACY  0x20808159",
            "RM_GSS_LEGACY 0x20808159 ",
            "RM_GSS_LEGACY 0x+0808159",
            "RM_GSS_LEGACY\t0x20808159",
            "NV2081_BINAPI 0x2081_0108",
            "NV2081_BINAPI ",
        ] {
            let err = pass_through_name(name).unwrap_err();
            assert!(
                matches!(err, PassThroughNameError::Malformed { .. }),
                "{name}: {err}"
            );
            assert!(err.to_string().contains(&format!("{name:?}")), "{err}");
        }
    }

    #[test]
    fn test_pass_through_name_refuses_a_command_outside_its_family() {
        for (name, why) in [
            ("RM_GSS_LEGACY 0x20800159", "bit 0x8000 is clear"),
            (
                "RM_GSS_LEGACY 0x20810108",
                "bit 0x8000 is clear: NV2081_BINAPI 0x20810108",
            ),
            (
                "NV2081_BINAPI 0x20800108",
                "its class is 0x2080, not 0x2081",
            ),
            (
                "NV2081_BINAPI 0x20818001",
                "bit 0x8000 makes it a legacy GSS control: RM_GSS_LEGACY 0x20818001",
            ),
        ] {
            let err = pass_through_name(name).unwrap_err();
            assert!(
                matches!(err, PassThroughNameError::WrongFamily { .. }),
                "{name}: {err}"
            );
            let msg = err.to_string();
            assert!(msg.contains(why) && msg.contains(name), "{msg}");
        }
    }

    #[test]
    fn test_pass_through_name_refuses_privileged_legacy_gss_commands() {
        let err = pass_through_name("RM_GSS_LEGACY 0x2080C159").unwrap_err();
        assert_eq!(
            err,
            PassThroughNameError::Privileged {
                name: "RM_GSS_LEGACY 0x2080C159".into(),
                cmd: 0x2080_c159
            }
        );
        assert!(
            err.to_string()
                .contains("never forwarded: the proxy refuses privileged legacy GSS controls"),
            "{err}"
        );
    }

    #[test]
    fn test_no_table_control_is_named_as_a_pass_through_command() {
        // The dispatcher names a control by its table entry first; a table entry in a
        // pass-through family would make its command name in a policy match nothing.
        for node in nvproxy_abi::nodes() {
            for c in node.tables().controls.values() {
                assert_eq!(
                    pass_through_family(c.cmd),
                    None,
                    "{}: {} ({:#010x})",
                    node.version,
                    c.name,
                    c.cmd
                );
            }
        }
    }

    #[test]
    fn test_audit_mode_judges_would_deny() {
        let mut p = InstancePolicy::new("t", Caps::COMPUTE, vec![0]);
        p.mode = Mode::Audit;
        assert_eq!(p.judge("X", Caps::VIDEO), Verdict::AuditWouldDeny);
    }
}
