//! `nvproxy doctor`: reports whether this host can run nvproxy, and what is missing.

use std::fmt;
use std::fs;

use nvproxy_worker::advice::{CuseState, CuseUse, cuse_advice, cuse_short, cuse_state};
use nvproxy_worker::host::host_driver_version;
use nvproxy_worker::sys;

/// One finding of `nvproxy doctor`.
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// Whether nvproxy can work with what was found.
    pub ok: bool,
    /// Worth knowing, though nvproxy works without it (printed `[note]`, not `[ok]`).
    pub note: bool,
    /// What was found, and what to do about it when not ok.
    pub detail: String,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = match (self.ok, self.note) {
            (false, _) => "FAIL",
            (true, true) => "note",
            (true, false) => "ok  ",
        };
        write!(f, "[{mark}] {:<26} {}", self.name, self.detail)
    }
}

fn check(name: &'static str, ok: bool, detail: impl Into<String>) -> Check {
    Check {
        name,
        ok,
        note: false,
        detail: detail.into(),
    }
}

fn note(name: &'static str, detail: impl Into<String>) -> Check {
    Check {
        note: true,
        ..check(name, true, detail)
    }
}

/// Runs every check. None of them changes the system.
pub fn run_checks() -> Vec<Check> {
    let mut out = Vec::new();

    let socket = nvproxy_worker::socket_transport::host_support();
    let cuse = nvproxy_worker::host::cuse_usable();
    out.push(match (cuse_state(), cuse) {
        (CuseState::Present, true) => check("/dev/cuse", true, "present and can be opened"),
        (CuseState::Present, false) => note(
            "/dev/cuse",
            "present but this process cannot open it (not root, or a device cgroup): the \
             cuse transport is unavailable to it",
        ),
        // Without CUSE, nvproxy works with the socket transport: a note, not a failure.
        (state, _) if socket.is_ok() => note(
            "/dev/cuse",
            format!(
                "missing, so instances use the socket transport; for CUSE: {}",
                cuse_short(&state)
            ),
        ),
        (state, _) => check(
            "/dev/cuse",
            false,
            format!("missing: {}", cuse_advice(&state, &CuseUse::Any)),
        ),
    });
    out.push(check(
        "transports",
        cuse || socket.is_ok(),
        format!(
            "cuse: {}; socket: {}; `auto` (the default) picks {}",
            if cuse { "yes" } else { "no" },
            match &socket {
                Ok(()) => "yes".to_owned(),
                Err(e) => format!("no ({e})"),
            },
            if cuse { "cuse" } else { "socket" },
        ),
    ));

    // The effective uid, from /proc/self/status (third field of "Uid:").
    let root = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false);
    out.push(check(
        "running as root",
        root,
        if root {
            "yes"
        } else {
            "no: /dev/cuse and pidfd_getfd on other users' processes need root"
        },
    ));

    out.push(match sys::pidfd_thread_supported() {
        Ok(()) => check("pidfd_open(PIDFD_THREAD)", true, "supported"),
        Err(e) => check(
            "pidfd_open(PIDFD_THREAD)",
            false,
            format!("not supported ({e}): fd identity resolution needs Linux 6.9 or newer"),
        ),
    });

    let yama = fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok();
    out.push(match yama.as_deref().map(str::trim) {
        None => check("yama ptrace_scope", true, "Yama not present"),
        Some("3") => check(
            "yama ptrace_scope",
            false,
            "3: no process may attach, so pidfd_getfd and process_vm_readv fail; set it to 0-2",
        ),
        Some(v) => check(
            "yama ptrace_scope",
            true,
            format!("{v} (needs CAP_SYS_PTRACE at 1-2)"),
        ),
    });

    out.push(match request_thread_drop() {
        Ok(()) => check(
            "RM privilege",
            true,
            "request threads run without CAP_SYS_ADMIN: the host driver treats tenants as \
             unprivileged (tried on a scratch thread)",
        ),
        Err(e) => check(
            "RM privilege",
            false,
            format!(
                "cannot drop CAP_SYS_ADMIN on a thread ({e}): every request to the nodes \
                 would be refused with EPERM"
            ),
        ),
    });

    out.push(match sys::landlock_abi_version() {
        Ok(v) if v >= 5 => check("landlock", true, format!("ABI {v} (IOCTL_DEV available)")),
        Ok(v) => check(
            "landlock",
            false,
            format!("ABI {v}: LANDLOCK_ACCESS_FS_IOCTL_DEV needs ABI 5 (Linux 6.10); the RM mmap path will be refused (unless [daemon] allow_unrestricted_mmap_fds)"),
        ),
        Err(e) => check("landlock", false, format!("unavailable ({e}); the RM mmap path will be refused (unless [daemon] allow_unrestricted_mmap_fds)")),
    });

    // CUSE has no mmap: clients map through the shim, or get ENODEV.
    out.push(match nvproxy_worker::mmap::shim_path(None) {
        Ok(p) => check(
            "mmap shim",
            true,
            format!(
                "{} (nvproxy exec/run inject it; clients without it get ENODEV from mmap() on the nodes)",
                p.display()
            ),
        ),
        Err(e) => check(
            "mmap shim",
            false,
            format!("{e:#}"),
        ),
    });

    out.push(match host_driver_version() {
        Some(v) => check("host NVIDIA driver", true, format!("version {v}")),
        None => check(
            "host NVIDIA driver",
            true,
            "not loaded (only `--driver sim` can serve on this host)",
        ),
    });
    out
}

/// Does what every request thread does when it starts (`device::drop_admin_on_this_thread`)
/// on a scratch thread, which then ends: capabilities are per thread, so doctor's own stay.
fn request_thread_drop() -> Result<(), String> {
    std::thread::spawn(|| {
        sys::drop_thread_capability(sys::CAP_SYS_ADMIN).map_err(|e| e.to_string())?;
        let caps = sys::thread_caps().map_err(|e| e.to_string())?;
        if caps.has_effective(sys::CAP_SYS_ADMIN) || caps.has_permitted(sys::CAP_SYS_ADMIN) {
            return Err("still held after the drop".to_owned());
        }
        Ok(())
    })
    .join()
    .unwrap_or_else(|_| Err("the scratch thread panicked".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_note_is_neither_ok_nor_a_failure() {
        let n = note(
            "/dev/cuse",
            "missing, so instances use the socket transport",
        );
        assert!(n.ok, "a note does not fail doctor");
        assert!(n.to_string().starts_with("[note] /dev/cuse "), "{n}");
        assert!(check("x", true, "").to_string().starts_with("[ok  ] x"));
        assert!(check("x", false, "").to_string().starts_with("[FAIL] x"));
    }
}
