//! The simulated GPUs' place in the machine's PCI tree, as the kernel shows it under `/sys`
//! (`drivers/pci/pci-sysfs.c`, `probe.c`), so that a namespace running NVIDIA's userspace
//! against the simulator (`nvproxy exec --driver sim`) finds the GPUs where NVML looks for
//! them.
//!
//! What NVIDIA's clients read (strace of Debian's 535.261.03 `nvidia-smi topo -m` with two
//! simulated GPUs): NVML scans `/sys/bus/pci/devices/*/config` for NVIDIA functions, lists
//! `/sys/bus/pci/drivers/`, and its embedded hwloc builds the PCI tree from every device of
//! `/sys/bus/pci/devices/` (`config`, for the bridges' secondary and subordinate bus numbers
//! and the PCIe link, then `class`, `vendor`, `device`, `subsystem_vendor`,
//! `subsystem_device`, `current_link_speed`, `current_link_width`) and `/sys/bus/pci/slots/`.
//! The matrix needs both GPUs in that tree to find their common ancestor; without them
//! `topo -m` prints `Failed to run topology matrix`.
//!
//! # The simulated topology
//! The default GPUs are H100 SXM5s on the PCI buses of an 8-GPU HGX H100 board
//! ([`SimGpu::h100`]). On such machines every GPU sits behind a PCIe Gen5 switch of its own
//! (Broadcom PEX890xx, `1000:c030`: an upstream and a downstream port), which hangs off a root
//! port of its own PCIe root complex (host bridge); the first four GPUs are on the first CPU
//! socket, the other four on the second. `lspci` of such hosts shows that chain, e.g.
//! `c0:01.1` root port, `c1:00.0` and `c2:00.0` PEX890xx, `c3:00.0` the GPU. So each GPU at
//! bus `B` gets:
//!
//! - host bridge `pci<dom>:<B-3>`, root port `<B-3>:01.0` (Intel Sapphire Rapids root port
//!   `8086:352c`), secondary bus `B-2`;
//! - switch upstream port `<B-2>:00.0` (`1000:c030`), secondary bus `B-1`;
//! - switch downstream port `<B-1>:00.0` (`1000:c030`), secondary bus `B`;
//! - the GPU `<B>:<dev>.<fn>`, bound to the `nvidia` driver.
//!
//! Two GPUs of one socket are then on different host bridges of one NUMA node, which
//! `nvidia-smi topo -m` prints as `NODE`; GPUs of different sockets as `SYS`. There is no
//! NVLink (the simulator does not model it), so PCIe is the only path. A GPU whose bus is below
//! 3, or whose chain would overlap another GPU's buses, is instead put directly on a root bus of
//! its own (`pci<dom>:<B>`).
//!
//! The CPUs and NUMA nodes are the host's real ones (the command runs on them): socket `s`
//! (0 for buses below `0x80`, else 1) is the host's NUMA node `s mod n`, with that node's own
//! `cpumap` and `cpulist` as the devices' `local_cpus` and `local_cpulist`.
//!
//! Config space is the PCI specification's type-0 (GPU) and type-1 (bridge) header with one
//! capability, the PCI Express capability (device/port type, link capabilities and status:
//! Gen5 x16 for the whole chain, [`SimGpu::pcie_gen`] / [`SimGpu::pcie_width`]), and no
//! extended capabilities; BARs are not shown (nothing here reads them).

use crate::config::{SimConfig, SimGpu};

/// One entry under `/sys`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SysNode {
    /// A directory.
    Dir,
    /// A file with these bytes.
    File(Vec<u8>),
    /// A symbolic link to this (relative) target.
    Link(String),
}

/// An entry and its path relative to `/sys` (`/`-separated, parents listed before children).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysEntry {
    /// Path relative to `/sys`, e.g. `bus/pci/devices/0000:18:00.0`.
    pub path: String,
    /// What is there.
    pub node: SysNode,
}

/// A NUMA node of the host, as `/sys/devices/system/node/node<id>/{cpumap,cpulist}` show it
/// (`id` -1 with the online CPUs on a kernel without NUMA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaNode {
    /// The node's number (`numa_node` of the devices on it).
    pub id: i32,
    /// Its CPUs as a mask (`cpumap`, without the newline).
    pub cpumap: String,
    /// Its CPUs as a list (`cpulist`, without the newline).
    pub cpulist: String,
}

/// The directories under `/sys` the entries of [`pci_entries`] replace: the command sees the
/// simulated machine's PCI devices instead of the host's.
pub const REPLACED: &[&str] = &["bus/pci", "devices/pci*"];

const CLASS_BRIDGE_PCI: u32 = 0x06_04_00;
const CLASS_3D_CONTROLLER: u32 = 0x03_02_00;
/// Intel Sapphire Rapids PCIe root port.
const ROOT_PORT_ID: (u16, u16) = (0x8086, 0x352c);
/// Broadcom / LSI PEX890xx PCIe Gen 5 switch (upstream and downstream ports).
const SWITCH_ID: (u16, u16) = (0x1000, 0xc030);

/// PCI Express capability: device/port type (PCIe base spec 7.5.3.2).
#[derive(Debug, Clone, Copy)]
enum PortType {
    Endpoint = 0,
    RootPort = 4,
    Upstream = 5,
    Downstream = 6,
}

/// One function of the tree.
#[derive(Debug, Clone)]
struct Function {
    domain: u32,
    bus: u8,
    device: u8,
    function: u8,
    vendor: u16,
    device_id: u16,
    subsystem: (u16, u16),
    revision: u8,
    class: u32,
    port: PortType,
    /// Secondary and subordinate bus of a bridge.
    buses: Option<(u8, u8)>,
    driver: &'static str,
}

impl Function {
    fn address(&self) -> String {
        format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// The first 4096 bytes of config space, as `config` shows them to root.
    fn config(&self, pcie_gen: u32, width: u32) -> Vec<u8> {
        let mut c = vec![0u8; 4096];
        let put16 =
            |c: &mut [u8], off: usize, v: u16| c[off..off + 2].copy_from_slice(&v.to_le_bytes());
        let put32 =
            |c: &mut [u8], off: usize, v: u32| c[off..off + 4].copy_from_slice(&v.to_le_bytes());
        put16(&mut c, 0x00, self.vendor);
        put16(&mut c, 0x02, self.device_id);
        // Command: memory space and bus master enabled; status: capabilities list.
        put16(&mut c, 0x04, 0x0006);
        put16(&mut c, 0x06, 0x0010);
        c[0x08] = self.revision;
        c[0x09] = (self.class & 0xff) as u8;
        c[0x0a] = ((self.class >> 8) & 0xff) as u8;
        c[0x0b] = ((self.class >> 16) & 0xff) as u8;
        c[0x34] = 0x40;
        match self.buses {
            Some((secondary, subordinate)) => {
                c[0x0e] = 0x01; // header type 1 (bridge)
                c[0x18] = self.bus;
                c[0x19] = secondary;
                c[0x1a] = subordinate;
            }
            None => {
                c[0x0e] = 0x00;
                put16(&mut c, 0x2c, self.subsystem.0);
                put16(&mut c, 0x2e, self.subsystem.1);
                c[0x3d] = 0x01; // INTA
            }
        }
        // PCI Express capability at 0x40, the last in the list.
        let cap = 0x40;
        c[cap] = 0x10;
        c[cap + 1] = 0x00;
        put16(&mut c, cap + 2, 0x0002 | ((self.port as u16) << 4));
        let link = (pcie_gen & 0xf) | ((width & 0x3f) << 4);
        put32(&mut c, cap + 0x0c, link);
        #[expect(
            clippy::cast_possible_truncation,
            reason = "link is 10 bits: 4 of gen, 6 of width"
        )]
        let link = link as u16;
        put16(&mut c, cap + 0x12, link);
        c
    }
}

/// `current_link_speed` / `max_link_speed` text (`pci_speed_string`).
fn link_speed(pcie_gen: u32) -> &'static str {
    match pcie_gen {
        1 => "2.5 GT/s PCIe",
        2 => "5.0 GT/s PCIe",
        3 => "8.0 GT/s PCIe",
        4 => "16.0 GT/s PCIe",
        5 => "32.0 GT/s PCIe",
        6 => "64.0 GT/s PCIe",
        _ => "Unknown",
    }
}

/// The chain from the host bridge down to `gpu`: the root bus and the functions, top first.
fn chain(gpu: &SimGpu, with_switch: bool) -> (u8, Vec<Function>) {
    let bridge = |bus: u8, device: u8, id: (u16, u16), port: PortType, secondary: u8| Function {
        domain: gpu.pci_domain,
        bus,
        device,
        function: 0,
        vendor: id.0,
        device_id: id.1,
        subsystem: (0, 0),
        revision: 0,
        class: CLASS_BRIDGE_PCI,
        port,
        buses: Some((secondary, gpu.pci_bus)),
        driver: "pcieport",
    };
    let end = Function {
        domain: gpu.pci_domain,
        bus: gpu.pci_bus,
        device: gpu.pci_device,
        function: gpu.pci_function,
        vendor: gpu.pci_vendor_id,
        device_id: gpu.pci_device_id,
        subsystem: (gpu.pci_subsystem_vendor_id, gpu.pci_subsystem_id),
        revision: gpu.pci_revision_id,
        class: CLASS_3D_CONTROLLER,
        port: PortType::Endpoint,
        buses: None,
        driver: "nvidia",
    };
    if !with_switch {
        return (gpu.pci_bus, vec![end]);
    }
    let b = gpu.pci_bus;
    (
        b - 3,
        vec![
            bridge(b - 3, 1, ROOT_PORT_ID, PortType::RootPort, b - 2),
            bridge(b - 2, 0, SWITCH_ID, PortType::Upstream, b - 1),
            bridge(b - 1, 0, SWITCH_ID, PortType::Downstream, b),
            end,
        ],
    )
}

/// Whether `gpu` gets the switch chain: its bus leaves room for it and no other GPU's chain or
/// bus falls in its bus range.
fn has_switch(config: &SimConfig, gpu: &SimGpu) -> bool {
    let range = |g: &SimGpu| (g.pci_bus.saturating_sub(3), g.pci_bus);
    if gpu.pci_bus < 3 {
        return false;
    }
    let (lo, hi) = range(gpu);
    config.gpus.iter().all(|g| {
        std::ptr::eq(g, gpu)
            || g.pci_domain != gpu.pci_domain
            || (g.pci_bus != gpu.pci_bus && {
                let (glo, ghi) = if g.pci_bus < 3 {
                    (g.pci_bus, g.pci_bus)
                } else {
                    range(g)
                };
                ghi < lo || glo > hi
            })
    })
}

/// A relative link from directory `from` (relative to `/sys`) to `to` (relative to `/sys`).
fn relative(from: &str, to: &str) -> String {
    let ups = from.split('/').filter(|s| !s.is_empty()).count();
    format!("{}{to}", "../".repeat(ups))
}

/// Everything under `/sys/bus/pci` and `/sys/devices/pci*` for `config` as an instance that was
/// given the GPUs on host minors `visible` sees it: the chains of those GPUs only (an instance
/// granted one GPU sees a machine with one), with the host's NUMA nodes `nodes` (at least one;
/// see the module documentation).
pub fn pci_entries(config: &SimConfig, visible: &[u32], nodes: &[NumaNode]) -> Vec<SysEntry> {
    let fallback = NumaNode {
        id: -1,
        cpumap: "1".to_owned(),
        cpulist: "0".to_owned(),
    };
    let dir = |path: String| SysEntry {
        path,
        node: SysNode::Dir,
    };
    let mut out = vec![
        dir("bus".to_owned()),
        dir("bus/pci".to_owned()),
        dir("bus/pci/devices".to_owned()),
        dir("bus/pci/slots".to_owned()),
        dir("bus/pci/drivers".to_owned()),
        dir("devices".to_owned()),
    ];
    let mut drivers: Vec<&str> = Vec::new();
    let mut host_bridges: Vec<String> = Vec::new();
    for minor in visible {
        let Some(gpu) = config.gpus.iter().find(|g| g.minor == *minor) else {
            continue;
        };
        let socket = usize::from(gpu.pci_bus >= 0x80);
        let node = if nodes.is_empty() {
            &fallback
        } else {
            &nodes[socket % nodes.len()]
        };
        let (root_bus, functions) = chain(gpu, has_switch(config, gpu));
        let mut parent = format!("devices/pci{:04x}:{root_bus:02x}", gpu.pci_domain);
        if !host_bridges.contains(&parent) {
            host_bridges.push(parent.clone());
            out.push(dir(parent.clone()));
        }
        for f in functions {
            let addr = f.address();
            let path = format!("{parent}/{addr}");
            if out.iter().any(|e| e.path == path) {
                parent = path;
                continue;
            }
            out.push(dir(path.clone()));
            let file = |name: &str, text: String| SysEntry {
                path: format!("{path}/{name}"),
                node: SysNode::File(text.into_bytes()),
            };
            out.push(SysEntry {
                path: format!("{path}/config"),
                node: SysNode::File(f.config(gpu.pcie_gen, gpu.pcie_width)),
            });
            out.push(file("vendor", format!("0x{:04x}\n", f.vendor)));
            out.push(file("device", format!("0x{:04x}\n", f.device_id)));
            out.push(file(
                "subsystem_vendor",
                format!("0x{:04x}\n", f.subsystem.0),
            ));
            out.push(file(
                "subsystem_device",
                format!("0x{:04x}\n", f.subsystem.1),
            ));
            out.push(file("revision", format!("0x{:02x}\n", f.revision)));
            out.push(file("class", format!("0x{:06x}\n", f.class)));
            out.push(file("numa_node", format!("{}\n", node.id)));
            out.push(file("local_cpus", format!("{}\n", node.cpumap)));
            out.push(file("local_cpulist", format!("{}\n", node.cpulist)));
            out.push(file("enable", "1\n".to_owned()));
            let speed = link_speed(gpu.pcie_gen);
            out.push(file("current_link_speed", format!("{speed}\n")));
            out.push(file("max_link_speed", format!("{speed}\n")));
            out.push(file("current_link_width", format!("{}\n", gpu.pcie_width)));
            out.push(file("max_link_width", format!("{}\n", gpu.pcie_width)));
            if let Some((secondary, subordinate)) = f.buses {
                out.push(file("secondary_bus_number", format!("{secondary}\n")));
                out.push(file("subordinate_bus_number", format!("{subordinate}\n")));
            }
            out.push(SysEntry {
                path: format!("{path}/subsystem"),
                node: SysNode::Link(relative(&path, "bus/pci")),
            });
            let driver_dir = format!("bus/pci/drivers/{}", f.driver);
            out.push(SysEntry {
                path: format!("{path}/driver"),
                node: SysNode::Link(relative(&path, &driver_dir)),
            });
            if !drivers.contains(&f.driver) {
                drivers.push(f.driver);
                out.push(dir(driver_dir.clone()));
            }
            out.push(SysEntry {
                path: format!("{driver_dir}/{addr}"),
                node: SysNode::Link(relative(&driver_dir, &path)),
            });
            out.push(SysEntry {
                path: format!("bus/pci/devices/{addr}"),
                node: SysNode::Link(relative("bus/pci/devices", &path)),
            });
            parent = path;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<NumaNode> {
        vec![NumaNode {
            id: 0,
            cpumap: "3".to_owned(),
            cpulist: "0-1".to_owned(),
        }]
    }

    fn find<'a>(e: &'a [SysEntry], path: &str) -> &'a SysNode {
        &e.iter()
            .find(|x| x.path == path)
            .unwrap_or_else(|| panic!("{path} missing"))
            .node
    }

    #[test]
    fn test_each_gpu_is_behind_its_own_switch_and_host_bridge() {
        let cfg = SimConfig::default_gpus(2);
        let e = pci_entries(&cfg, &[0, 1], &nodes());
        assert_eq!(
            find(&e, "bus/pci/devices/0000:18:00.0"),
            &SysNode::Link(
                "../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
                    .to_owned()
            )
        );
        assert_eq!(
            find(&e, "bus/pci/devices/0000:2a:00.0"),
            &SysNode::Link(
                "../../../devices/pci0000:27/0000:27:01.0/0000:28:00.0/0000:29:00.0/0000:2a:00.0"
                    .to_owned()
            )
        );
        let gpu = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0";
        assert_eq!(
            find(&e, &format!("{gpu}/class")),
            &SysNode::File(b"0x030200\n".to_vec())
        );
        assert_eq!(
            find(&e, &format!("{gpu}/driver")),
            &SysNode::Link("../../../../../../bus/pci/drivers/nvidia".to_owned())
        );
        assert_eq!(
            find(&e, "bus/pci/drivers/nvidia/0000:18:00.0"),
            &SysNode::Link(format!("../../../../{gpu}"))
        );
        // 8 functions in all (4 per GPU), each in bus/pci/devices.
        let listed = e
            .iter()
            .filter(|x| x.path.starts_with("bus/pci/devices/"))
            .count();
        assert_eq!(listed, 8);
    }

    #[test]
    fn test_config_space_is_a_bridge_chain() {
        let cfg = SimConfig::default_gpus(1);
        let e = pci_entries(&cfg, &[0], &nodes());
        let SysNode::File(root) = find(&e, "devices/pci0000:15/0000:15:01.0/config") else {
            panic!("config is a file")
        };
        assert_eq!(root.len(), 4096);
        assert_eq!(&root[0..4], &[0x86, 0x80, 0x2c, 0x35]);
        assert_eq!(root[0x0e], 1);
        assert_eq!((root[0x18], root[0x19], root[0x1a]), (0x15, 0x16, 0x18));
        assert_eq!(&root[0x09..0x0c], &[0x00, 0x04, 0x06]);
        // PCIe capability: root port, Gen5 x16 link.
        assert_eq!(root[0x34], 0x40);
        assert_eq!(root[0x40], 0x10);
        assert_eq!(root[0x42] >> 4, 4);
        assert_eq!(u16::from_le_bytes([root[0x52], root[0x53]]), 5 | (16 << 4));
        let gpu = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0";
        let SysNode::File(g) = find(&e, &format!("{gpu}/config")) else {
            panic!("config is a file")
        };
        assert_eq!(&g[0..4], &[0xde, 0x10, 0x30, 0x23]);
        assert_eq!(g[0x0e], 0);
        assert_eq!(&g[0x2c..0x30], &[0xde, 0x10, 0xc1, 0x16]);
        assert_eq!(
            find(&e, &format!("{gpu}/local_cpulist")),
            &SysNode::File(b"0-1\n".to_vec())
        );
        assert_eq!(
            find(&e, &format!("{gpu}/numa_node")),
            &SysNode::File(b"0\n".to_vec())
        );
    }

    #[test]
    fn test_an_instance_sees_only_its_gpus_and_sockets_map_to_nodes() {
        let cfg = SimConfig::default_gpus(8);
        let two = vec![
            nodes()[0].clone(),
            NumaNode {
                id: 1,
                cpumap: "c".to_owned(),
                cpulist: "2-3".to_owned(),
            },
        ];
        let e = pci_entries(&cfg, &[1, 4], &two);
        let gpus: Vec<_> = e
            .iter()
            .filter(|x| x.path.starts_with("bus/pci/drivers/nvidia/"))
            .map(|x| x.path.as_str())
            .collect();
        assert_eq!(
            gpus,
            [
                "bus/pci/drivers/nvidia/0000:2a:00.0",
                "bus/pci/drivers/nvidia/0000:9a:00.0"
            ]
        );
        assert_eq!(
            find(
                &e,
                "devices/pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:00.0/0000:9a:00.0/numa_node"
            ),
            &SysNode::File(b"1\n".to_vec())
        );
    }

    #[test]
    fn test_gpus_without_room_for_a_switch_sit_on_their_own_root_bus() {
        let mut cfg = SimConfig::default_gpus(2);
        cfg.gpus[0].pci_bus = 1;
        cfg.gpus[1].pci_bus = 0x2;
        let e = pci_entries(&cfg, &[0, 1], &nodes());
        assert_eq!(
            find(&e, "bus/pci/devices/0000:01:00.0"),
            &SysNode::Link("../../../devices/pci0000:01/0000:01:00.0".to_owned())
        );
        assert_eq!(
            find(&e, "bus/pci/devices/0000:02:00.0"),
            &SysNode::Link("../../../devices/pci0000:02/0000:02:00.0".to_owned())
        );
    }
}
