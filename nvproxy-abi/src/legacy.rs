//! Legacy GSS controls: RM control numbers with `RM_GSS_LEGACY_MASK` (bit 15) set.
//!
//! A legacy control is an ordinary control number whose category byte has
//! `NVxxxx_CTRL_LEGACY_NON_PRIVILEGED` (0x80) or `NVxxxx_CTRL_LEGACY_PRIVILEGED` (0xC0) or-ed in
//! (`ctrl/ctrlxxxx.h`); the SDK names the categories that have a legacy form
//! (`NV0080_CTRL_PERF_LEGACY_NON_PRIVILEGED (0x99)` in `ctrl0080base.h`,
//! `NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED (0x81)` in `ctrl2080base.h`, ...). The kernel sends
//! them unchanged to GSP-RM (`RmGssLegacyRpcCmd`, `rmapi_gss_legacy_control.c`), which serves
//! them as the control with the legacy bits cleared: `0x809909` is the legacy form of
//! `0x801909`, `NV0080_CTRL_CMD_PERF_CUDA_LIMIT_SET_CONTROL` (exported by the kernel from
//! 550.40.07; libcuda 535 sends the legacy form because 535's kernel has no entry for it).
//!
//! [`LEGACY_CATEGORIES`] lists the categories every supported version's headers define (checked
//! per version against the facts by `tests/parity.rs`), and [`DriverAbi::legacy_control`]
//! names a legacy command: by the table's control for its unmasked number where the version
//! has one, else by its category and message number. A command whose category the headers do
//! not define has no name.

use core::fmt;

use crate::{DriverAbi, DriverVersion, RM_GSS_LEGACY_MASK, RM_GSS_LEGACY_MASK_PRIVILEGED};

/// A legacy control category the SDK headers define.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LegacyCategory {
    /// The define's name (`NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED`).
    pub name: &'static str,
    /// The control class (`0x2080`).
    pub class: u32,
    /// The category byte, legacy bits included (`0x81`).
    pub category: u8,
    /// The first driver branch whose headers define it.
    pub since_major: u16,
}

impl LegacyCategory {
    /// Whether this is a privileged category (`0xC0` set): the driver answers
    /// `NV_ERR_INSUFFICIENT_PERMISSIONS` to a caller without `CAP_SYS_ADMIN`.
    pub const fn privileged(&self) -> bool {
        self.category & 0xc0 == 0xc0
    }

    /// The category the legacy form belongs to, legacy bits cleared (`0x01`, GPU).
    pub const fn base(&self) -> u8 {
        self.category & !0xc0
    }
}

const fn cat(name: &'static str, class: u32, category: u8, since_major: u16) -> LegacyCategory {
    LegacyCategory {
        name,
        class,
        category,
        since_major,
    }
}

/// Every legacy category of the supported versions (535 to 595), from `ctrl0080base.h`,
/// `ctrl2080base.h` and `ctrl90e7base.h` (`NV90E7_CTRL_BBX_LEGACY_PRIVILEGED` from 555.42.02).
pub const LEGACY_CATEGORIES: &[LegacyCategory] = &[
    cat("NV0080_CTRL_PERF_LEGACY_NON_PRIVILEGED", 0x0080, 0x99, 535),
    cat("NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED", 0x2080, 0x81, 535),
    cat("NV2080_CTRL_FUSE_LEGACY_NON_PRIVILEGED", 0x2080, 0x82, 535),
    cat(
        "NV2080_CTRL_THERMAL_LEGACY_NON_PRIVILEGED",
        0x2080,
        0x85,
        535,
    ),
    cat("NV2080_CTRL_THERMAL_LEGACY_PRIVILEGED", 0x2080, 0xc5, 535),
    cat("NV2080_CTRL_CLK_LEGACY_NON_PRIVILEGED", 0x2080, 0x90, 535),
    cat("NV2080_CTRL_CLK_LEGACY_PRIVILEGED", 0x2080, 0xd0, 535),
    cat("NV2080_CTRL_PERF_LEGACY_NON_PRIVILEGED", 0x2080, 0xa0, 535),
    cat("NV2080_CTRL_PERF_LEGACY_PRIVILEGED", 0x2080, 0xe0, 535),
    cat("NV2080_CTRL_GPIO_LEGACY_NON_PRIVILEGED", 0x2080, 0xa3, 535),
    cat("NV2080_CTRL_PMGR_LEGACY_NON_PRIVILEGED", 0x2080, 0xa6, 535),
    cat("NV2080_CTRL_PMGR_LEGACY_PRIVILEGED", 0x2080, 0xe6, 535),
    cat("NV2080_CTRL_POWER_LEGACY_NON_PRIVILEGED", 0x2080, 0xa7, 535),
    cat("NV2080_CTRL_LPWR_LEGACY_NON_PRIVILEGED", 0x2080, 0xa8, 535),
    cat("NV2080_CTRL_LPWR_LEGACY_PRIVILEGED", 0x2080, 0xe8, 535),
    cat("NV2080_CTRL_VOLT_LEGACY_NON_PRIVILEGED", 0x2080, 0xb2, 535),
    cat("NV2080_CTRL_VOLT_LEGACY_PRIVILEGED", 0x2080, 0xf2, 535),
    cat("NV2080_CTRL_NNE_LEGACY_NON_PRIVILEGED", 0x2080, 0xb7, 535),
    cat("NV90E7_CTRL_BBX_LEGACY_PRIVILEGED", 0x90e7, 0xc1, 555),
];

/// The legacy categories the headers of `version` define ([`DriverAbi::legacy_categories`] of
/// its tables).
pub fn legacy_categories(version: DriverVersion) -> impl Iterator<Item = &'static LegacyCategory> {
    LEGACY_CATEGORIES
        .iter()
        .filter(move |c| version.major() >= c.since_major)
}

/// The suffix of a legacy control's name when the version's table names its unmasked control.
pub const LEGACY_SUFFIX: &str = " (legacy)";

/// What a legacy command is, by the headers of one version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegacyControl {
    /// The legacy form of a control the version's table has (`control`, its name).
    Of {
        /// The unmasked command number.
        control: u32,
        /// Its name in the table.
        name: &'static str,
        /// The legacy category the command is in.
        category: &'static LegacyCategory,
    },
    /// A message of a defined legacy category that the version's table has no control for.
    Message {
        /// The legacy category.
        category: &'static LegacyCategory,
        /// The message number (the low byte).
        message: u8,
    },
}

impl LegacyControl {
    /// The legacy category.
    pub fn category(&self) -> &'static LegacyCategory {
        match *self {
            LegacyControl::Of { category, .. } | LegacyControl::Message { category, .. } => {
                category
            }
        }
    }
}

/// The name audit records and policies use: `NV0080_CTRL_CMD_PERF_CUDA_LIMIT_SET_CONTROL
/// (legacy)` for the legacy form of a named control, `NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED
/// 0x59` for a message the table does not name.
impl fmt::Display for LegacyControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LegacyControl::Of { name, .. } => write!(f, "{name}{LEGACY_SUFFIX}"),
            LegacyControl::Message { category, message } => {
                write!(f, "{} {message:#04x}", category.name)
            }
        }
    }
}

impl DriverAbi {
    /// What legacy command `cmd` is in this version's headers; `None` if bit 15 is clear or
    /// its category is none the headers define (an opaque legacy command).
    pub fn legacy_control(&self, cmd: u32) -> Option<LegacyControl> {
        if cmd & RM_GSS_LEGACY_MASK == 0 {
            return None;
        }
        let class = cmd >> 16;
        let [message, byte, ..] = cmd.to_le_bytes();
        let category = *self
            .legacy_categories
            .iter()
            .find(|c| c.class == class && c.category == byte)?;
        let unmasked = cmd & !RM_GSS_LEGACY_MASK_PRIVILEGED;
        Some(match self.controls.get(&unmasked) {
            Some(c) => LegacyControl::Of {
                control: unmasked,
                name: c.name,
                category,
            },
            None => LegacyControl::Message { category, message },
        })
    }

    /// Every name [`DriverAbi::legacy_command`] accepts: each message of each non-privileged
    /// legacy category, named as [`LegacyControl`] displays it (privileged legacy commands are
    /// never forwarded, so no policy names them).
    pub fn legacy_names(&self) -> impl Iterator<Item = String> + '_ {
        self.legacy_categories
            .iter()
            .filter(|c| !c.privileged())
            .flat_map(move |c| {
                (0..=255u32).filter_map(move |m| {
                    let cmd = (c.class << 16) | (u32::from(c.category) << 8) | m;
                    self.legacy_control(cmd).map(|l| l.to_string())
                })
            })
    }

    /// The command a legacy name (as [`LegacyControl`] displays it) stands for in this version,
    /// `None` for any other name.
    pub fn legacy_command(&self, name: &str) -> Option<u32> {
        if let Some(base) = name.strip_suffix(LEGACY_SUFFIX) {
            let c = self.control_by_name(base)?;
            let [_, byte, ..] = c.cmd.to_le_bytes();
            let class = c.cmd >> 16;
            let category = self
                .legacy_categories
                .iter()
                .find(|l| l.class == class && !l.privileged() && l.base() == byte)?;
            return Some((c.cmd & !0xff00) | (u32::from(category.category) << 8));
        }
        let (cat_name, msg) = name.split_once(' ')?;
        let category = self.legacy_categories.iter().find(|c| c.name == cat_name)?;
        let digits = msg.strip_prefix("0x")?;
        if digits.len() != 2
            || !digits
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return None;
        }
        let message = u32::from_str_radix(digits, 16).ok()?;
        let cmd = (category.class << 16) | (u32::from(category.category) << 8) | message;
        // The table's name wins for a message it names.
        matches!(
            self.legacy_control(cmd),
            Some(LegacyControl::Message { .. })
        )
        .then_some(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::find;

    fn table(v: &str) -> DriverAbi {
        let v: DriverVersion = v.parse().unwrap();
        find(&v).unwrap().tables()
    }

    #[test]
    fn cuda_limit_is_named_by_message_on_535_and_by_control_from_550() {
        let t = table("535.261.03");
        let l = t.legacy_control(0x0080_9909).unwrap();
        assert_eq!(l.to_string(), "NV0080_CTRL_PERF_LEGACY_NON_PRIVILEGED 0x09");
        assert_eq!(t.legacy_command(&l.to_string()), Some(0x0080_9909));
        let t = table("550.163.01");
        let l = t.legacy_control(0x0080_9909).unwrap();
        assert_eq!(
            l.to_string(),
            "NV0080_CTRL_CMD_PERF_CUDA_LIMIT_SET_CONTROL (legacy)"
        );
        assert_eq!(t.legacy_command(&l.to_string()), Some(0x0080_9909));
        // The message form is not a second name for a control the table names.
        assert_eq!(
            t.legacy_command("NV0080_CTRL_PERF_LEGACY_NON_PRIVILEGED 0x09"),
            None
        );
    }

    #[test]
    fn undefined_categories_and_clear_bits_have_no_name() {
        let t = table("535.261.03");
        // 0x2080_8b..: category 0x8b is no legacy category of NV2080.
        assert_eq!(t.legacy_control(0x2080_8b01), None);
        assert_eq!(t.legacy_control(0x0080_1909), None);
        // BBX's privileged legacy category exists from 555 on.
        assert_eq!(t.legacy_control(0x90e7_c101), None);
        let t = table("555.58.02");
        assert!(
            t.legacy_control(0x90e7_c101)
                .unwrap()
                .category()
                .privileged()
        );
    }

    #[test]
    fn privileged_forms_name_the_same_control() {
        let t = table("550.163.01");
        // Any control of NV2080's GPU category (0x01), whose legacy category is 0x81.
        let named = t
            .controls
            .values()
            .find(|c| c.cmd >> 8 == 0x0020_8001)
            .unwrap();
        let legacy = (named.cmd & !0xff00) | 0x8100;
        assert_eq!(
            t.legacy_control(legacy).unwrap().to_string(),
            format!("{}{LEGACY_SUFFIX}", named.name)
        );
        assert_eq!(
            t.legacy_command(&format!("{}{LEGACY_SUFFIX}", named.name)),
            Some(legacy)
        );
        // A category without a legacy form names nothing.
        let fb = t
            .controls
            .values()
            .find(|c| c.cmd >> 8 == 0x0020_8013)
            .unwrap();
        assert_eq!(
            t.legacy_command(&format!("{}{LEGACY_SUFFIX}", fb.name)),
            None
        );
    }

    #[test]
    fn every_legacy_name_stands_for_its_command() {
        let t = table("550.163.01");
        let names: Vec<String> = t.legacy_names().collect();
        assert_eq!(
            names.len(),
            256 * 11 + 256,
            "11 NV2080 and one NV0080 category"
        );
        for n in &names {
            let cmd = t.legacy_command(n).unwrap_or_else(|| panic!("{n}"));
            assert_eq!(t.legacy_control(cmd).unwrap().to_string(), *n);
        }
        assert!(names.contains(&"NV0080_CTRL_CMD_PERF_CUDA_LIMIT_SET_CONTROL (legacy)".into()));
    }

    #[test]
    fn message_names_are_strict() {
        let t = table("535.261.03");
        for bad in [
            "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x5",
            "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 59",
            "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x059",
            "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED  0x59",
            "NV2080_CTRL_GPU_LEGACY 0x59",
            "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x5A",
            "NV90E7_CTRL_BBX_LEGACY_PRIVILEGED 0x01",
        ] {
            assert_eq!(t.legacy_command(bad), None, "{bad}");
        }
        assert_eq!(
            t.legacy_command("NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x59"),
            Some(0x2080_8159)
        );
    }
}
