//! Facts read from this host's driver (sysfs, procfs): the probes configuration and policy
//! checks use. Imports nothing of the crate.

use std::fs;

/// The loaded NVIDIA kernel module's version, from sysfs or procfs.
pub fn host_driver_version() -> Option<String> {
    if let Ok(v) = fs::read_to_string("/sys/module/nvidia/version") {
        return Some(v.trim().to_owned());
    }
    // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed ..."
    let text = fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| {
            w.split('.').count() >= 2
                && w.split('.')
                    .all(|p| p.chars().all(|c| c.is_ascii_digit()) && !p.is_empty())
        })
        .map(str::to_owned)
}

/// The minors of the host driver's GPUs (`Device Minor:` of
/// `/proc/driver/nvidia/gpus/*/information`), sorted; None when the driver lists none.
pub fn host_gpu_minors() -> Option<Vec<u32>> {
    let mut minors: Vec<u32> = fs::read_dir("/proc/driver/nvidia/gpus")
        .ok()?
        .filter_map(|e| fs::read_to_string(e.ok()?.path().join("information")).ok())
        .filter_map(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("Device Minor:"))
                .and_then(|m| m.trim().parse().ok())
        })
        .collect();
    minors.sort_unstable();
    (!minors.is_empty()).then_some(minors)
}

/// Whether this process can open `/dev/cuse` (read-write, as a CUSE server does): what
/// `transport = "auto"` chooses by. An open that is never initialised is torn down by the
/// kernel on close; nothing is created.
pub fn cuse_usable() -> bool {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/cuse")
        .is_ok()
}
