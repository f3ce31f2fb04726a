//! The files the simulated driver shows under `/proc/driver/nvidia`, as the kernel module's
//! `nv-procfs.c` prints them, so that a namespace running NVIDIA's userspace against the
//! simulator (`nvproxy exec --driver sim`) sees the simulated driver rather than none (or the
//! host's).
//!
//! What NVIDIA's clients need from them (observed with Debian's 535.216.03 and 535.261.03
//! `libcuda.so.1` and `nvidia-smi` through the proxy): only `params`, for its
//! `ModifyDeviceFiles: 0` (without it libcuda recreates the device nodes as 195:N instead of
//! opening ours); `version` and `gpus/<pci>/information` are what tools and people read.

use crate::config::{SimConfig, SimGpu};

/// One file under `/proc/driver/nvidia`: its path relative to that directory and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcFile {
    /// Relative path, `/`-separated (`params`, `gpus/0000:18:00.0/information`).
    pub path: String,
    /// The file's contents.
    pub text: String,
}

/// The module parameters `nv_procfs_read_params` prints (`nv-reg.h`'s `nv_parms[]` with their
/// defaults, then the string parameters), except `ModifyDeviceFiles`, which is 0: the nodes
/// belong to the proxy, and the clients must open them as they are.
const PARAMS: &[(&str, u32)] = &[
    ("ResmanDebugLevel", u32::MAX),
    ("RmLogonRC", 1),
    ("ModifyDeviceFiles", 0),
    ("DeviceFileUID", 0),
    ("DeviceFileGID", 0),
    ("DeviceFileMode", 0o666),
    ("InitializeSystemMemoryAllocations", 1),
    ("UsePageAttributeTable", u32::MAX),
    ("EnableMSI", 1),
    ("EnablePCIeGen3", 0),
    ("MemoryPoolSize", 0),
    ("KMallocHeapMaxSize", 0),
    ("VMallocHeapMaxSize", 0),
    ("IgnoreMMIOCheck", 0),
    ("TCEBypassMode", 0),
    ("EnableStreamMemOPs", 0),
    ("EnableUserNUMAManagement", 1),
    ("NvLinkDisable", 0),
    ("RmProfilingAdminOnly", 1),
    ("PreserveVideoMemoryAllocations", 0),
    ("EnableS0ixPowerManagement", 0),
    ("S0ixPowerManagementVideoMemoryThreshold", 256),
    ("DynamicPowerManagement", 3),
    ("DynamicPowerManagementVideoMemoryThreshold", 200),
    ("RegisterPCIDriver", 1),
    ("EnablePCIERelaxedOrderingMode", 0),
    ("EnableResizableBar", 0),
    // NV_REG_ENABLE_GPU_FIRMWARE_DEFAULT_VALUE (0x12) and _LOGS_ENABLE_ON_DEBUG (2).
    ("EnableGpuFirmware", 18),
    ("EnableGpuFirmwareLogs", 2),
    ("EnableDbgBreakpoint", 0),
    ("OpenRmEnableUnsupportedGpus", 0),
    ("DmaRemapPeerMmio", 1),
];

const STRING_PARAMS: &[&str] = &[
    "RegistryDwords",
    "RegistryDwordsPerDevice",
    "RmMsg",
    "GpuBlacklist",
    "TemporaryFilePath",
    "ExcludedGpus",
];

/// `/proc/driver/nvidia/params`.
pub fn params_text() -> String {
    let mut s = String::new();
    for (name, value) in PARAMS {
        s.push_str(&format!("{name}: {value}\n"));
    }
    for name in STRING_PARAMS {
        s.push_str(&format!("{name}: \"\"\n"));
    }
    s
}

/// The PCI address as the driver prints it (`%04x:%02x:%02x.%x`).
pub fn pci_address(gpu: &SimGpu) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        gpu.pci_domain, gpu.pci_bus, gpu.pci_device, gpu.pci_function
    )
}

/// `/proc/driver/nvidia/gpus/<pci>/information` (`nv_procfs_read_gpu_info`). The VBIOS version
/// is what the driver prints when it cannot read one (the simulator has no VBIOS); the firmware
/// is GSP-RM of the driver's own version.
fn information(config: &SimConfig, gpu: &SimGpu, minor: u32) -> String {
    format!(
        "Model: \t\t {}\nIRQ:   \t\t 0\nGPU UUID: \t {}\nVideo BIOS: \t ??.??.??.??.??\n\
         Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n\
         Bus Location: \t {}\nDevice Minor: \t {}\nGPU Firmware: \t {}\nGPU Excluded:\t No\n",
        gpu.name,
        gpu.uuid_string(),
        pci_address(gpu),
        minor,
        config.version,
    )
}

/// Everything under `/proc/driver/nvidia` for `config` as an instance that was given the GPUs on
/// host minors `visible` sees it: `params`, `version` and `gpus/<pci>/information` of each of
/// those GPUs only, with the minor the instance sees (its position in `visible`, as the proxy
/// renumbers the nodes). Minors without a GPU are skipped.
pub fn proc_files(config: &SimConfig, visible: &[u32]) -> Vec<ProcFile> {
    let mut out = vec![
        ProcFile {
            path: "params".to_owned(),
            text: params_text(),
        },
        ProcFile {
            path: "version".to_owned(),
            text: format!(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  (nvsim, simulated)\n\
                 GCC version:  none (simulated driver)\n",
                config.version
            ),
        },
    ];
    for (tenant_minor, host_minor) in (0u32..).zip(visible.iter()) {
        let Some(gpu) = config.gpus.iter().find(|g| g.minor == *host_minor) else {
            continue;
        };
        out.push(ProcFile {
            path: format!("gpus/{}/information", pci_address(gpu)),
            text: information(config, gpu, tenant_minor),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_params_open_the_nodes_as_they_are() {
        let p = params_text();
        assert!(p.contains("\nModifyDeviceFiles: 0\n"));
        assert!(p.starts_with("ResmanDebugLevel: 4294967295\n"));
        assert!(p.contains("DeviceFileMode: 438\n"));
        assert!(p.ends_with("ExcludedGpus: \"\"\n"));
    }

    #[test]
    fn test_each_gpu_has_its_information_file() {
        let cfg = SimConfig::default_gpus(2);
        let files = proc_files(&cfg, &[0, 1]);
        let info: Vec<_> = files
            .iter()
            .filter(|f| f.path.ends_with("/information"))
            .collect();
        assert_eq!(info.len(), 2);
        assert_eq!(info[1].path, "gpus/0000:2a:00.0/information");
        assert!(info[1].text.contains("Device Minor: \t 1\n"));
        assert!(info[1].text.contains(&cfg.gpus[1].uuid_string()));
        assert!(files[1].text.contains(" 535.261.03 "));
    }

    #[test]
    fn test_an_instance_sees_only_its_gpus_renumbered() {
        let cfg = SimConfig::default_gpus(2);
        let files = proc_files(&cfg, &[1, 7]);
        let info: Vec<_> = files
            .iter()
            .filter(|f| f.path.ends_with("/information"))
            .collect();
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].path, "gpus/0000:2a:00.0/information");
        assert!(info[0].text.contains("Device Minor: \t 0\n"));
    }
}
