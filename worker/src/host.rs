//! Facts read from this host's driver (sysfs, procfs): the probes configuration and policy
//! checks use ([`ThisHost`] answers `nvproxy_config`'s [`HostProbe`]). Imports nothing of the
//! crate.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use nvproxy_config::HostProbe;

/// This host, probed when a config check asks.
pub struct ThisHost;

impl HostProbe for ThisHost {
    fn driver_version(&self) -> Option<String> {
        host_driver_version()
    }
    fn gpu_minors(&self) -> Option<Vec<u32>> {
        host_gpu_minors()
    }
    fn cuse_usable(&self) -> bool {
        cuse_usable()
    }
}

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

/// A GPU of the host driver, from `/proc/driver/nvidia/gpus/<bus id>/information`.
pub struct HostGpu {
    /// Its minor (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// `dddd:bb:dd.f`, lowercase.
    pub bus_id: String,
}

/// The host driver's GPUs (none without a driver).
pub fn host_gpu_table() -> Vec<HostGpu> {
    let Ok(dir) = std::fs::read_dir("/proc/driver/nvidia/gpus") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let bus_id = e.file_name().to_string_lossy().to_ascii_lowercase();
            let text = std::fs::read_to_string(e.path().join("information")).ok()?;
            parse_information(&bus_id, &text)
        })
        .collect()
}

fn parse_information(bus_id: &str, text: &str) -> Option<HostGpu> {
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_owned())
    };
    Some(HostGpu {
        minor: field("Device Minor:")?.parse().ok()?,
        uuid: field("GPU UUID:")?,
        bus_id: bus_id.to_owned(),
    })
}

/// The host driver's `nvidia-uvm` major (`/proc/devices`), if it has one.
pub fn uvm_major() -> Option<u32> {
    fs::read_to_string("/proc/devices")
        .ok()?
        .lines()
        .find_map(|l| {
            let (major, name) = l.trim().split_once(' ')?;
            (name.trim() == "nvidia-uvm").then(|| major.parse().ok())?
        })
}

/// `stat` of a real node: (is a character device, st_rdev).
pub fn stat_node(path: &Path) -> std::io::Result<(bool, u64)> {
    let m = fs::metadata(path)?;
    Ok((m.file_type().is_char_device(), m.rdev()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_gpu_information_is_parsed() {
        let text =
            "Model: \t\t NVIDIA H100\nIRQ:   \t\t 42\nGPU UUID: \t GPU-1234\nDevice Minor: \t 3\n";
        let g = parse_information("0000:18:00.0", text).unwrap();
        assert_eq!(
            (g.minor, g.uuid.as_str(), g.bus_id.as_str()),
            (3, "GPU-1234", "0000:18:00.0")
        );
    }
}
