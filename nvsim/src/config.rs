//! What the simulated driver simulates: its version and its GPUs, and why a configuration
//! cannot be simulated ([`SimError`]).

use nvproxy_abi::DriverVersion;

/// One simulated GPU. The defaults ([`SimGpu::h100`]) describe an NVIDIA H100 SXM5 80GB
/// (Hopper GH100, public specifications).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimGpu {
    /// Marketing name (`GPU_GET_NAME_STRING`), at most 63 bytes.
    pub name: String,
    /// Chip name (`GPU_GET_SHORT_NAME_STRING`), at most 63 bytes.
    pub short_name: String,
    /// The 16 bytes of the GPU UUID (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
    pub uuid: [u8; 16],
    /// PCI domain.
    pub pci_domain: u32,
    /// PCI bus.
    pub pci_bus: u8,
    /// PCI device (slot).
    pub pci_device: u8,
    /// PCI function.
    pub pci_function: u8,
    /// PCI vendor id (0x10de).
    pub pci_vendor_id: u16,
    /// PCI device id (0x2330 for H100 SXM5 80GB).
    pub pci_device_id: u16,
    /// PCI subsystem vendor id.
    pub pci_subsystem_vendor_id: u16,
    /// PCI subsystem id.
    pub pci_subsystem_id: u16,
    /// PCI revision id.
    pub pci_revision_id: u8,
    /// Video memory in bytes: the books `NV01_MEMORY_LOCAL_USER` allocations are placed in
    /// (`fb.rs`).
    pub memory_bytes: u64,
    /// BAR1 aperture in bytes (`CARD_INFO.fb_size`, `FB_INFO_INDEX_BAR1_SIZE`).
    pub bar1_bytes: u64,
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
    /// SMs per TPC.
    pub sm_per_tpc: u32,
    /// Number of GPCs.
    pub gpc_count: u32,
    /// Compute capability (major, minor), 9.0 for Hopper.
    pub compute_capability: (u32, u32),
    /// L2 cache size in bytes.
    pub l2_cache_bytes: u32,
    /// Memory bus width in bits.
    pub memory_bus_width: u32,
    /// The `/dev/nvidia<minor>` node of this GPU.
    pub minor: u32,
    /// `NV2080_CTRL_MC_GET_ARCH_INFO.architecture` (0x180: GH100, from the `PMC_BOOT_0`
    /// architecture encoding; the open headers omit the GH100 constant).
    pub arch: u32,
    /// `NV2080_CTRL_MC_GET_ARCH_INFO.implementation` (0 for GH100).
    pub arch_impl: u32,
    /// Register BAR0 CPU physical address (`CARD_INFO.reg_address`).
    pub bar0_address: u64,
    /// BAR1 CPU physical address (`CARD_INFO.fb_address`).
    pub bar1_address: u64,
    /// PCIe generation of the GPU's link and of the root port it is attached to (5 for an H100
    /// SXM5: 32 GT/s).
    pub pcie_gen: u32,
    /// PCIe link width in lanes (16).
    pub pcie_width: u32,
    /// Maximum graphics (GPC) clock in kHz (1980 MHz for an H100 SXM5).
    pub max_gpc_clock_khz: u32,
    /// Maximum memory clock in kHz as CUDA reports it (2619 MHz for an H100 SXM5's HBM3).
    pub max_memory_clock_khz: u32,
}

/// PCI bus numbers of the eight GPUs of a typical HGX H100 board.
const HGX_BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

impl SimGpu {
    /// An H100 SXM5 80GB as GPU number `index` of a machine: minor `index`, a bus of an HGX
    /// board, and a UUID derived from `index` (stable across runs).
    pub fn h100(index: u32) -> SimGpu {
        let bus = match HGX_BUSES.get(index as usize) {
            Some(&b) => b,
            // The low byte of `index`: buses wrap within 0x00-0xff.
            None => 0x18u8.wrapping_add(index.to_le_bytes()[0].wrapping_mul(0x10)),
        };
        SimGpu {
            name: "NVIDIA H100 80GB HBM3".to_owned(),
            short_name: "GH100".to_owned(),
            uuid: uuid_for(index),
            pci_domain: 0,
            pci_bus: bus,
            pci_device: 0,
            pci_function: 0,
            pci_vendor_id: 0x10de,
            pci_device_id: 0x2330,
            pci_subsystem_vendor_id: 0x10de,
            pci_subsystem_id: 0x16c1,
            pci_revision_id: 0xa1,
            memory_bytes: 80 << 30,
            bar1_bytes: 128 << 30,
            sm_count: 132,
            sm_per_tpc: 2,
            gpc_count: 8,
            compute_capability: (9, 0),
            l2_cache_bytes: 50 << 20,
            memory_bus_width: 5120,
            minor: index,
            arch: 0x180,
            arch_impl: 0,
            bar0_address: 0x9000_0000_0000 + u64::from(index) * 0x1_0000_0000,
            bar1_address: 0xa000_0000_0000 + u64::from(index) * 0x40_0000_0000,
            pcie_gen: 5,
            pcie_width: 16,
            max_gpc_clock_khz: 1_980_000,
            max_memory_clock_khz: 2_619_000,
        }
    }

    /// The RM GPU id: `domain[15:0] << 16 | bus << 8 | device`, as the driver derives it from
    /// the PCI address (`gpuGenerate32BitId`).
    pub fn gpu_id(&self) -> u32 {
        ((self.pci_domain & 0xffff) << 16)
            | (u32::from(self.pci_bus) << 8)
            | u32::from(self.pci_device)
    }

    /// The UUID in the driver's text form, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub fn uuid_string(&self) -> String {
        let u = &self.uuid;
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            hex(&u[0..4]),
            hex(&u[4..6]),
            hex(&u[6..8]),
            hex(&u[8..10]),
            hex(&u[10..16])
        )
    }

    /// Number of TPCs (SMs / SMs per TPC).
    pub fn tpc_count(&self) -> u32 {
        self.sm_count / self.sm_per_tpc.max(1)
    }
}

/// A deterministic, UUID-looking 16 bytes for GPU `index` (version 4 / variant bits set).
fn uuid_for(index: u32) -> [u8; 16] {
    let mut x: u64 = 0x6e76_7369_6d00_0000 ^ u64::from(index).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut out = [0u8; 16];
    for chunk in out.chunks_mut(8) {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_be_bytes());
    }
    out[6] = (out[6] & 0x0f) | 0x40;
    out[8] = (out[8] & 0x3f) | 0x80;
    out
}

/// The simulated driver: its version (selects the ABI layouts it speaks) and its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Driver version; must be a node of `nvproxy-abi`'s version tree.
    pub version: DriverVersion,
    /// The GPUs, in probe order (device instance = position). Minor numbers must be unique.
    pub gpus: Vec<SimGpu>,
    /// Where the driver's client-handle counter starts (`0xc1d00000 | index`). The real
    /// driver has one counter for every process on the host, so two processes never get the
    /// same client handle; a simulated driver per worker process starts each at its own place
    /// so that its handles are not another instance's ([`SimConfig::with_client_index_base`]).
    pub client_index_base: u32,
    /// The simulated host's memory in bytes: what the driver's system-memory allocations
    /// (`NV01_MEMORY_SYSTEM`, pages the kernel gives `osAllocPages`) may take together before
    /// it answers `NV_ERR_NO_MEMORY`, as a host out of pages does ([`DEFAULT_HOST_MEMORY`]).
    pub host_memory_bytes: u64,
}

/// The default simulated host memory: 256 GiB, a plausible GPU server's.
pub const DEFAULT_HOST_MEMORY: u64 = 256 << 30;

/// The default simulated driver version.
pub const DEFAULT_VERSION: DriverVersion = DriverVersion::new(535, 261, Some(3));

impl SimConfig {
    /// Driver 535.261.03 with `n` H100 GPUs (minors 0..n).
    pub fn default_gpus(n: usize) -> SimConfig {
        SimConfig {
            version: DEFAULT_VERSION,
            gpus: (0u32..).take(n).map(SimGpu::h100).collect(),
            client_index_base: 0,
            host_memory_bytes: DEFAULT_HOST_MEMORY,
        }
    }

    /// The same driver with its client-handle counter starting at a place derived from `key`
    /// (a worker's instance name): one of 4096 slots of 256 clients, so that the simulated
    /// drivers of two workers hand out different handles (unless their names hash alike,
    /// 1 in 4096), as the real driver, shared by every process, does.
    pub fn with_client_index_base(mut self, key: &str) -> SimConfig {
        // FNV-1a: stable across runs and builds.
        let mut h: u32 = 0x811c_9dc5;
        for b in key.bytes() {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        self.client_index_base = (h % 4096) * 256;
        self
    }

    /// The same GPUs under another driver version.
    pub fn with_version(mut self, version: DriverVersion) -> SimConfig {
        self.version = version;
        self
    }
}

impl Default for SimConfig {
    /// One H100 on driver 535.261.03.
    fn default() -> SimConfig {
        SimConfig::default_gpus(1)
    }
}

/// Why a [`SimConfig`] cannot be simulated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The version has no node in the ABI tree, so its layouts are unknown.
    #[error(transparent)]
    Version(nvproxy_abi::AbiError),
    /// Two GPUs share a minor number.
    #[error("two GPUs on minor {0}")]
    DuplicateMinor(u32),
    /// Two GPUs share a PCI address (hence an RM GPU id).
    #[error("two GPUs with GPU id {0:#x} (same PCI domain/bus/device)")]
    DuplicateGpuId(u32),
    /// The driver supports at most 32 GPUs.
    #[error("{0} GPUs configured; the driver supports at most 32")]
    TooManyGpus(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_gpu_id_encodes_domain_bus_device() {
        let mut g = SimGpu::h100(0);
        g.pci_domain = 2;
        g.pci_device = 3;
        assert_eq!(g.gpu_id(), 0x0002_1803);
    }

    #[test]
    fn test_uuid_string_has_driver_format() {
        let s = SimGpu::h100(1).uuid_string();
        assert_eq!(s.len(), 40);
        assert!(s.starts_with("GPU-"));
        assert_eq!(s.matches('-').count(), 5);
    }

    #[test]
    fn test_default_gpus_are_distinct() {
        let c = SimConfig::default_gpus(3);
        assert_ne!(c.gpus[0].uuid, c.gpus[1].uuid);
        assert_ne!(c.gpus[1].gpu_id(), c.gpus[2].gpu_id());
        assert_eq!(c.gpus[2].minor, 2);
    }
}

#[cfg(test)]
mod handle_base_tests {
    use super::*;

    #[test]
    fn test_instances_get_different_client_handle_bases() {
        let a = SimConfig::default_gpus(1).with_client_index_base("a");
        let b = SimConfig::default_gpus(1).with_client_index_base("b");
        assert_ne!(a.client_index_base, b.client_index_base);
        assert_eq!(a.client_index_base % 256, 0);
        assert!(a.client_index_base < 0x0010_0000);
        assert_eq!(
            a.client_index_base,
            SimConfig::default_gpus(1)
                .with_client_index_base("a")
                .client_index_base,
            "stable"
        );
    }
}
