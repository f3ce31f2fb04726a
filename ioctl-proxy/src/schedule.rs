//! Scheduling priority: the interleave level of every channel group (TSG) an instance creates,
//! and the scheduling controls a tenant may not use.
//!
//! The driver's contract (open-gpu-kernel-modules 535.216.01 and 580.95.05):
//! - `NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL` (0xa06c0107, `{NvU32 tsgInterleaveLevel}`, LOW 0,
//!   MEDIUM 1, HIGH 2) sets how often a TSG appears in its runlist (`ctrla06c.h`: "setting this
//!   property requires PRIVILEGED user level"). Its method-table entry requires
//!   `RS_ACCESS_NICE` (`g_kernel_channel_group_api_nvoc.c`, accessRight 0x2), an uncached right
//!   the driver grants per call to a thread with `CAP_SYS_ADMIN` (`_rsAccessGrantCallback`:
//!   privLevel ≥ USER_ROOT) or `CAP_SYS_NICE` (`os_check_access`); anyone else gets
//!   `NV_ERR_INSUFFICIENT_PERMISSIONS` for every value, LOW included. A new TSG starts at
//!   MEDIUM (`kchangrpapiConstruct_IMPL`), and no alloc params carry a level.
//! - The channel form `NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL` (0xa06f0109) sets the level of the
//!   channel's whole TSG; `NVA06C_CTRL_CMD_MAKE_REALTIME` (0xa06c0110) and
//!   `NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY` (0x20801115) need the same right.
//! - The GET forms (0xa06c0108, 0xa06f0110) are in no exported method table: the driver
//!   answers `NV_ERR_NOT_SUPPORTED`, so the level is only known to whoever set it.
//! - `NVA06C_CTRL_CMD_SET_TIMESLICE` (0xa06c0103, `{NvU64 timesliceUs}`) needs no right: any
//!   client may set any timeslice (default 1024 µs, `kfifoChannelGroupGetDefaultTimeslice`).
//!   libcuda sets 2048 µs on each TSG it creates (shared/reference/native-traces.md).
//!
//! What the proxy does with it:
//! - An instance's priority is a level: after each of its TSG allocations succeeds, the proxy
//!   sets the instance's level on the new TSG (nothing for `medium`, the driver's default) with
//!   `CAP_SYS_NICE` ([`NiceCaller`]: the daemon's request threads run without it). Where that
//!   fails the TSG is freed and the allocation answered with the driver's status: a TSG never
//!   runs at a level the instance does not have.
//! - A tenant's own use of the four controls that need `RS_ACCESS_NICE` gets the driver's
//!   answer to an unprivileged caller, `NV_ERR_INSUFFICIENT_PERMISSIONS`, after the object
//!   checks the driver makes first (an unknown object, or one of another class, answers as
//!   the driver does), and never reaches the driver.
//! - A tenant's `SET_TIMESLICE` above [`MAX_TIMESLICE_US`] is forwarded with that value
//!   (the driver takes any value, so a tenant could otherwise hold the engine for seconds per
//!   turn whatever its level); the tenant's own memory keeps the value it wrote.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use nvproxy_abi::ioctl::{NV_ESC_RM_FREE, nv_iowr};
use nvproxy_abi::structs::NVOS00_PARAMETERS;
use zerocopy::IntoBytes;

pub use crate::hostctl::{InlineNice, NiceCaller};
use crate::nv::{NV_ERR_OPERATING_SYSTEM, NV_OK};
use host_driver::{HostCall, HostFile};

/// `NVA06C_CTRL_CMD_SET_TIMESLICE`.
pub const NVA06C_CTRL_CMD_SET_TIMESLICE: u32 = 0xa06c_0103;
/// `NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL`.
pub const NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL: u32 = 0xa06c_0107;
/// `NVA06C_CTRL_CMD_MAKE_REALTIME`.
pub const NVA06C_CTRL_CMD_MAKE_REALTIME: u32 = 0xa06c_0110;
/// `NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL` (a channel's: its whole TSG).
pub const NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL: u32 = 0xa06f_0109;
/// `NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY`.
pub const NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY: u32 = 0x2080_1115;

/// The largest timeslice a tenant's `SET_TIMESLICE` reaches the driver with: what libcuda
/// asks for natively (2048 µs; twice the driver's default).
pub const MAX_TIMESLICE_US: u64 = 2048;

/// An instance's scheduling priority: the interleave level of its channel groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// `NVA06C_CTRL_INTERLEAVE_LEVEL_LOW`: once per runlist round.
    Low,
    /// `NVA06C_CTRL_INTERLEAVE_LEVEL_MEDIUM`, the driver's default for a new TSG.
    #[default]
    Medium,
    /// `NVA06C_CTRL_INTERLEAVE_LEVEL_HIGH`.
    High,
}

impl Priority {
    /// The `tsgInterleaveLevel` value.
    pub fn interleave_level(self) -> u32 {
        match self {
            Priority::Low => 0,
            Priority::Medium => 1,
            Priority::High => 2,
        }
    }

    /// The name used in configs, on the command line and in listings.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Medium => "medium",
            Priority::High => "high",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Priority {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "low" => Ok(Priority::Low),
            "medium" => Ok(Priority::Medium),
            "high" => Ok(Priority::High),
            _ => Err(format!("'{s}' is not a priority (low, medium or high)")),
        }
    }
}

/// The controls the driver grants only to a caller with `RS_ACCESS_NICE`, and the class of
/// the object each is a control of (`None`: any channel class).
pub(crate) fn nice_control(cmd: u32) -> Option<(&'static str, Option<u32>)> {
    Some(match cmd {
        NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL => (
            "NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL",
            Some(crate::nv::KEPLER_CHANNEL_GROUP_A),
        ),
        NVA06C_CTRL_CMD_MAKE_REALTIME => (
            "NVA06C_CTRL_CMD_MAKE_REALTIME",
            Some(crate::nv::KEPLER_CHANNEL_GROUP_A),
        ),
        NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL => ("NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL", None),
        NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY => (
            "NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY",
            Some(crate::nv::NV20_SUBDEVICE_0),
        ),
        _ => return None,
    })
}

static NICE: OnceLock<Arc<dyn NiceCaller>> = OnceLock::new();

/// Sets how this process makes its privileged scheduling calls (once, before the first
/// proxy serves; the capabilities it relies on are the process's). Returns false when one
/// was installed already.
pub fn install_nice_caller(caller: Arc<dyn NiceCaller>) -> bool {
    NICE.set(caller).is_ok()
}

/// The installed [`NiceCaller`], or [`InlineNice`].
pub(crate) fn nice_caller() -> &'static dyn NiceCaller {
    static INLINE: InlineNice = InlineNice;
    match NICE.get() {
        Some(c) => &**c,
        None => &INLINE,
    }
}

/// Sets `priority` on the new TSG `h_tsg` of host client `h_client` (nothing for medium, the
/// driver's default); where the driver refuses, frees the TSG and returns the driver's
/// status, so that no TSG of the instance runs at another level.
pub(crate) fn apply(
    file: &dyn HostFile,
    h_client: u32,
    h_parent: u32,
    h_tsg: u32,
    priority: Priority,
) -> Result<(), u32> {
    if priority == Priority::Medium {
        return Ok(());
    }
    let level = priority.interleave_level().to_ne_bytes().to_vec();
    let status = match crate::hostctl::host_control_via(
        nice_caller(),
        file,
        h_client,
        h_tsg,
        NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL,
        level,
    ) {
        Ok((NV_OK, _)) => {
            tracing::debug!(h_tsg, %priority, "interleave level set on a channel group");
            return Ok(());
        }
        Ok((s, _)) => s,
        Err(e) => {
            tracing::warn!(error = %e, "setting a channel group's interleave level failed");
            NV_ERR_OPERATING_SYSTEM
        }
    };
    tracing::error!(
        status = format_args!("{status:#x}"),
        %priority,
        "the driver refused the instance's interleave level (does the worker hold \
         CAP_SYS_NICE?): the channel group is freed and its allocation fails"
    );
    let p = NVOS00_PARAMETERS {
        hRoot: h_client,
        hObjectParent: h_parent,
        hObjectOld: h_tsg,
        status: 0,
    };
    let mut call = HostCall {
        cmd: nv_iowr(NV_ESC_RM_FREE, size_of::<NVOS00_PARAMETERS>()),
        params: p.as_bytes().into(),
        nested: Default::default(),
    };
    if let Err(e) = file.ioctl(&mut call) {
        tracing::warn!(error = %e, h_tsg, "freeing the channel group failed");
    }
    Err(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_priorities_parse_and_order_by_level() {
        for p in [Priority::Low, Priority::Medium, Priority::High] {
            assert_eq!(p.as_str().parse::<Priority>(), Ok(p));
        }
        assert!(Priority::Low < Priority::Medium && Priority::Medium < Priority::High);
        assert_eq!(
            [Priority::Low, Priority::Medium, Priority::High].map(Priority::interleave_level),
            [0, 1, 2]
        );
        assert_eq!(Priority::default(), Priority::Medium);
        let e = "urgent".parse::<Priority>().unwrap_err();
        assert!(e.contains("low, medium or high"), "{e}");
    }

    #[test]
    fn test_only_the_nice_controls_are_named() {
        for cmd in [0xa06c_0107, 0xa06c_0110, 0xa06f_0109, 0x2080_1115] {
            assert!(nice_control(cmd).is_some(), "{cmd:#x}");
        }
        for cmd in [
            0xa06c_0103,
            0xa06c_0104,
            0xa06c_0108,
            0xa06f_0110,
            0xa06c_0101,
        ] {
            assert!(nice_control(cmd).is_none(), "{cmd:#x}");
        }
    }
}
