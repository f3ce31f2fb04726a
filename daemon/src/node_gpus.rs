//! The node's GPUs as the instance API's `gpus` answer reports them (the device plugin reads
//! it): minor, UUID, bus id, and what places them (sysfs PCI path, NUMA node).

use std::path::Path;

use serde::{Deserialize, Serialize};

use nvproxy_config::{Config, DriverKind};

/// One GPU of the node, as the instance API's `gpus` reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NodeGpu {
    /// Host minor.
    pub minor: u32,
    /// `GPU-…` (empty when unknown).
    pub uuid: String,
    /// `dddd:bb:dd.f`.
    pub bus_id: String,
    /// Components of its sysfs device path below `/sys/devices` (PCI root, bridges, the GPU);
    /// empty when there is none (the simulated driver).
    #[serde(default)]
    pub pci_path: Vec<String>,
    /// Its NUMA node, when the platform says.
    #[serde(default)]
    pub numa_node: Option<i64>,
    /// Its video memory in bytes, where the daemon knows it (the simulated GPUs; not read
    /// from a host driver).
    #[serde(default)]
    pub memory_bytes: Option<u64>,
}

/// The GPUs of this daemon's driver: the simulated driver's, or the host driver's from
/// `/proc/driver/nvidia/gpus` (a GPU the driver lost is missing).
pub fn node_gpus(cfg: &Config) -> Vec<NodeGpu> {
    if cfg.driver == DriverKind::Sim {
        return nvsim::SimConfig::default_gpus(cfg.sim.gpus as usize)
            .gpus
            .iter()
            .map(|g| NodeGpu {
                minor: g.minor,
                uuid: g.uuid_string(),
                bus_id: format!(
                    "{:04x}:{:02x}:{:02x}.{}",
                    g.pci_domain, g.pci_bus, g.pci_device, g.pci_function
                ),
                pci_path: Vec::new(),
                numa_node: None,
                memory_bytes: Some(g.memory_bytes),
            })
            .collect();
    }
    let mut gpus: Vec<NodeGpu> = nvproxy_worker::host::host_gpu_table()
        .into_iter()
        .map(
            |nvproxy_worker::host::HostGpu {
                 minor,
                 uuid,
                 bus_id,
             }| {
                let dev = Path::new("/sys/bus/pci/devices").join(&bus_id);
                NodeGpu {
                    minor,
                    uuid,
                    memory_bytes: None,
                    pci_path: std::fs::canonicalize(&dev)
                        .map(|p| sysfs_components(&p))
                        .unwrap_or_default(),
                    numa_node: std::fs::read_to_string(dev.join("numa_node"))
                        .ok()
                        .and_then(|s| s.trim().parse::<i64>().ok())
                        .filter(|n| *n >= 0),
                    bus_id,
                }
            },
        )
        .collect();
    gpus.sort_by_key(|g| g.minor);
    gpus
}

/// `/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0` → its components after `devices`.
fn sysfs_components(p: &Path) -> Vec<String> {
    let s: Vec<String> = p
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match s.iter().position(|c| c == "devices") {
        Some(i) => s[i + 1..].to_vec(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn test_sysfs_paths_are_cut_below_devices() {
        assert_eq!(
            sysfs_components(Path::new(
                "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0"
            )),
            ["pci0000:17", "0000:17:00.0", "0000:18:00.0"]
        );
        assert!(sysfs_components(Path::new("/elsewhere")).is_empty());
    }

    #[test]
    fn test_sim_gpus_have_uuids_and_hgx_buses() {
        let mut cfg = Config::parse(
            "driver = \"sim\"\n[sim]\ngpus = 2\n",
            &nvproxy_worker::host::ThisHost,
        )
        .unwrap();
        cfg.cdi.spec = PathBuf::new();
        let g = node_gpus(&cfg);
        assert_eq!(g.len(), 2);
        assert_eq!((g[0].minor, g[0].bus_id.as_str()), (0, "0000:18:00.0"));
        assert_eq!(g[1].bus_id, "0000:2a:00.0");
        assert!(g[0].uuid.starts_with("GPU-") && g[0].uuid != g[1].uuid);
    }
}
