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

use std::collections::BTreeSet;

use nvproxy_abi::Caps;
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
    pub allow: BTreeSet<String>,
    /// Entry names the admin denies although the caps would allow them (wins over `allow`
    /// and `only`).
    pub deny: BTreeSet<String>,
    /// Allowlist-only: when set, exactly these entries (and those in `allow`) are permitted,
    /// whatever the caps; see the module docs.
    pub only: Option<BTreeSet<String>>,
    /// Whether a client may `mmap` `/dev/nvidia-uvm` (default `true`). The mapping is made on
    /// the instance's own host UVM file, handed to the tenant, which can then issue raw UVM
    /// ioctls on its va_space around the proxy (ARCHITECTURE.md, "UVM"); `false` turns the
    /// path off (the mmap fails with `ENODEV`, as on a CUSE node), at the price of CUDA's
    /// managed memory and its UVM initialisation.
    pub uvm_mmap: bool,
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
    /// by the caps and not [`ADMIN_ONLY`].
    pub fn permits(&self, name: &str, caps: Caps) -> bool {
        if self.deny.contains(name) {
            return false;
        }
        if self.allow.contains(name) {
            return true;
        }
        if let Some(only) = &self.only {
            return only.contains(name);
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

    #[test]
    fn test_audit_mode_judges_would_deny() {
        let mut p = InstancePolicy::new("t", Caps::COMPUTE, vec![0]);
        p.mode = Mode::Audit;
        assert_eq!(p.judge("X", Caps::VIDEO), Verdict::AuditWouldDeny);
    }
}
