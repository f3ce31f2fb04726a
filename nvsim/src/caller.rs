//! Who is calling: the driver decides some rights per call from the calling thread's
//! capabilities, as `capable()` does in the kernel (open-gpu-kernel-modules 580.95.05,
//! `escape.c` `RmIoctl`: privLevel from `osIsAdministrator()` = `capable(CAP_SYS_ADMIN)` on
//! every ioctl; `os_check_access`: `RS_ACCESS_NICE` is `capable(CAP_SYS_NICE)`).
//!
//! In-process, the simulator asks the calling thread's effective capabilities
//! (`/proc/thread-self/status`). A simulated driver serving another process's calls (the
//! daemon's `sim-driver`) cannot see that thread, so the caller's answer travels with the call
//! and the server makes it this thread's with [`with_caller_nice`].

use std::cell::Cell;
use std::mem::offset_of;

use host_driver::HostCall;
use nvproxy_abi::ioctl::NV_ESC_RM_CONTROL_CMD;
use nvproxy_abi::structs::NVOS54_PARAMETERS;

use crate::channel::cmd;

/// `CAP_SYS_ADMIN`.
const CAP_SYS_ADMIN: u32 = 21;
/// `CAP_SYS_NICE`.
const CAP_SYS_NICE: u32 = 23;

thread_local! {
    static NICE: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Runs `f` with the calling thread taken to hold (or lack) `RS_ACCESS_NICE` whatever its own
/// capabilities: what a served call's caller had.
pub fn with_caller_nice<R>(nice: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<bool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            NICE.with(|n| n.set(self.0));
        }
    }
    let _restore = Restore(NICE.with(|n| n.replace(Some(nice))));
    f()
}

/// Whether the caller holds `RS_ACCESS_NICE`: `CAP_SYS_ADMIN` (the driver's admin, which
/// `_rsAccessGrantCallback` lets through) or `CAP_SYS_NICE` in the calling thread's effective
/// set, or what [`with_caller_nice`] says.
pub fn caller_has_nice() -> bool {
    if let Some(n) = NICE.with(Cell::get) {
        return n;
    }
    thread_effective_caps().is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN | 1 << CAP_SYS_NICE) != 0)
}

/// Whether the simulator asks [`caller_has_nice`] to answer `call`: a served call carries
/// the caller's answer only then (reading a thread's capabilities costs a file read).
pub fn call_needs_nice(call: &HostCall) -> bool {
    const CMD: usize = offset_of!(NVOS54_PARAMETERS, cmd);
    call.cmd == NV_ESC_RM_CONTROL_CMD
        && call
            .params
            .get(CMD..CMD + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
            .is_some_and(|c| {
                c == cmd::TSG_SET_INTERLEAVE_LEVEL || c == cmd::CHANNEL_SET_INTERLEAVE_LEVEL
            })
}

/// The calling thread's effective capability set (`CapEff:` of `/proc/thread-self/status`).
fn thread_effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_override_wins_and_is_undone() {
        let own = caller_has_nice();
        assert!(with_caller_nice(false, || !caller_has_nice()));
        assert!(with_caller_nice(true, || {
            with_caller_nice(false, || !caller_has_nice()) && caller_has_nice()
        }));
        assert_eq!(caller_has_nice(), own);
    }

    #[test]
    fn test_the_thread_capabilities_are_read() {
        assert!(thread_effective_caps().is_some());
    }
}
