//! The controls NVIDIA's own clients issue at initialisation beyond the frontend part modelled in
//! `control.rs`: what `libcuda.so.1` (`cuInit`, `cuCtxCreate`, ...) and `nvidia-smi` / NVML ask
//! (observed through the proxy's audit log and the `cuda-probe` ioctl recorder with Debian's
//! 535.216.03 and 535.261.03 userspace), answered as the driver answers them for the configured
//! GPU. Each control names the driver function it follows; values that real hardware reports
//! come from the GPU's public specifications (see [`SimGpu`](crate::SimGpu)); where the driver
//! would ask GSP firmware for something the simulator does not model, the control says what it
//! answers instead.

use nvproxy_abi::structs::NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS;

use crate::control::{Ctx, Target};
use crate::driver::State;
use crate::status::*;

/// Control command numbers answered here.
pub mod cmd {
    /// `NV0000_CTRL_CMD_SYNC_GPU_BOOST_GROUP_INFO`.
    pub const SYNC_GPU_BOOST_GROUP_INFO: u32 = 0x0000_0a04;
    /// `NV0000_CTRL_CMD_GPU_DETACH_IDS`.
    pub const GPU_DETACH_IDS: u32 = 0x0000_0216;
    /// `NV0000_CTRL_CMD_GPU_QUERY_DRAIN_STATE`.
    pub const GPU_QUERY_DRAIN_STATE: u32 = 0x0000_0279;
    /// `NV0080_CTRL_CMD_HOST_GET_CAPS_V2`.
    pub const DEVICE_HOST_GET_CAPS_V2: u32 = 0x0080_1402;
    /// `NV0080_CTRL_CMD_GPU_GET_VIRTUALIZATION_MODE`.
    pub const DEVICE_GPU_GET_VIRTUALIZATION_MODE: u32 = 0x0080_0289;
    /// `NV2080_CTRL_CMD_GPU_GET_ACTIVE_PARTITION_IDS`.
    pub const GPU_GET_ACTIVE_PARTITION_IDS: u32 = 0x2080_018b;
    /// `NV2080_CTRL_CMD_BUS_GET_INFO_V2`.
    pub const BUS_GET_INFO_V2: u32 = 0x2080_1823;
    /// `NV2080_CTRL_CMD_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO`.
    pub const TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO: u32 = 0x2080_0406;
    /// `NV2080_CTRL_CMD_BUS_GET_PCI_BAR_INFO`.
    pub const BUS_GET_PCI_BAR_INFO: u32 = 0x2080_1803;
}

/// `NV0000_CTRL_GPU_INVALID_ID`.
const INVALID_ID: u32 = 0xffff_ffff;
/// `NV0000_CTRL_GPU_DETACH_ALL_ATTACHED_IDS`.
const DETACH_ALL_ATTACHED_IDS: u32 = 0x0000_ffff;
/// `NV0080_CTRL_HOST_CAPS_GPU_COHERENT_MAPPING_SUPPORTED` (byte 0, bit 0x04).
const HOST_CAPS_GPU_COHERENT_MAPPING_SUPPORTED: u8 = 0x04;

/// One control of the initialisation set; `None` when the command (or this target for it) is
/// not one of them.
pub(crate) fn control(st: &mut State, mut c: Ctx<'_>, command: u32, target: Target) -> Option<u32> {
    let input = hex_prefix(&mut c);
    let status = answer(st, &mut c, command, target);
    if status != Some(NV_OK) {
        // What a client asked that the simulator does not answer, or answers with an error
        // (`RUST_LOG=nvsim=debug`).
        tracing::debug!(
            cmd = format_args!("{command:#x}"),
            size = c.size,
            status = ?status.map(|s| format!("{s:#x}")),
            params = input,
            "control not simulated or failed"
        );
    }
    status
}

/// The first 256 bytes of the params, in hex.
fn hex_prefix(c: &mut Ctx<'_>) -> String {
    let size = c.size;
    c.bytes_mut()[..size.min(256)]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn answer(st: &mut State, c: &mut Ctx<'_>, command: u32, target: Target) -> Option<u32> {
    let drv = c.drv;
    Some(match (command, target) {
        (cmd::SYNC_GPU_BOOST_GROUP_INFO, Target::Client) => {
            // cliresCtrlCmdSyncGpuBoostGroupInfo -> gpuboostmgrQueryGroups: the groups created
            // with SYNC_GPU_BOOST_GROUP_CREATE (none here); only groupCount and the filled
            // entries are written.
            c.put(0, &0u32);
            NV_OK
        }
        (cmd::GPU_DETACH_IDS, Target::Client) => {
            // cliresCtrlCmdGpuDetachIds: DETACH_ALL is accepted; otherwise the first id must be
            // an attached GPU (the driver's loop breaks after the first id either way, and
            // detaching itself is a no-op on Linux: GPUs detach when their last file closes).
            let ids: [u32; 32] = c.get(0).expect("size checked");
            if ids[0] == DETACH_ALL_ATTACHED_IDS || ids[0] == INVALID_ID {
                return Some(NV_OK);
            }
            let attached = drv
                .gpu_by_id(ids[0])
                .is_some_and(|g| drv.gpu_attached(st, g));
            if attached {
                NV_OK
            } else {
                NV_ERR_INVALID_ARGUMENT
            }
        }
        (cmd::GPU_QUERY_DRAIN_STATE, Target::Client) => {
            // cliresCtrlCmdGpuQueryGpuDrainState -> gpumgrQueryGpuDrainState: any probed GPU
            // (attached or not); nothing is ever drained here (no MODIFY_DRAIN_STATE).
            let mut q: NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS = c.get(0).expect("size checked");
            if drv.gpu_by_id(q.gpuId).is_none() {
                return Some(NV_ERR_OBJECT_NOT_FOUND);
            }
            q.drainState = 0; // NV0000_CTRL_GPU_DRAIN_STATE_DISABLED
            q.flags = 0;
            c.put(0, &q);
            NV_OK
        }
        (cmd::DEVICE_HOST_GET_CAPS_V2, Target::Device) => {
            // deviceCtrlCmdHostGetCapsV2 -> kbusGetDeviceCaps on x86: the chipset is I/O
            // coherent (no EXPLICIT_CACHE_FLUSH_REQD), no BR04/C73 bridge, and GPU-coherent
            // mappings are always supported. One subdevice, so nothing is ANDed.
            c.put(0, &[HOST_CAPS_GPU_COHERENT_MAPPING_SUPPORTED, 0u8, 0u8]);
            NV_OK
        }
        (cmd::DEVICE_GPU_GET_VIRTUALIZATION_MODE, Target::Device) => {
            // deviceCtrlCmdGpuGetVirtualizationMode: bare metal, neither a vGPU guest, a
            // passthrough guest nor a vGPU host: NV0080_CTRL_GPU_VIRTUALIZATION_MODE_NONE.
            c.put(0, &0u32);
            NV_OK
        }
        (cmd::GPU_GET_ACTIVE_PARTITION_IDS, Target::Subdevice(_)) => {
            // subdeviceCtrlCmdGpuGetActivePartitionIds: partitionCount = 0, then MIG mode is
            // off (as an H100 ships) -> NV_ERR_NOT_SUPPORTED.
            c.put(0, &0u32);
            NV_ERR_NOT_SUPPORTED
        }
        (cmd::BUS_GET_INFO_V2, Target::Subdevice(g)) => {
            // subdeviceCtrlCmdBusGetInfoV2 -> getBusInfos.
            let n: u32 = c.get(0).expect("size checked");
            if n == 0 || n > BUS_INFO_MAX_LIST_SIZE {
                return Some(NV_ERR_INVALID_ARGUMENT);
            }
            let gpu = &drv.config.gpus[g];
            let mut status = NV_OK;
            for i in 0..n as usize {
                let index: u32 = c.get(4 + 8 * i).expect("size checked");
                let Some(value) = bus_info(gpu, index) else {
                    // getBusInfos: an index it does not know is INVALID_ARGUMENT (data 0);
                    // the PCIe link and error counters (GSP RPCs on an H100) are not modelled.
                    status = if index > BUS_INFO_INDEX_MAX {
                        c.put(4 + 8 * i + 4, &0u32);
                        NV_ERR_INVALID_ARGUMENT
                    } else {
                        NV_ERR_NOT_SUPPORTED
                    };
                    break;
                };
                c.put(4 + 8 * i + 4, &value);
            }
            status
        }
        (cmd::TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO, Target::Subdevice(_)) => time_correlation(c),
        (cmd::BUS_GET_PCI_BAR_INFO, Target::Subdevice(g)) => {
            // subdeviceCtrlCmdBusGetPciBarInfo: pciBarCount = totalPciBars, then per BAR
            // {flags 0, barSize in MiB, barSizeBytes, barOffset = its CPU physical address};
            // the remaining entries zeroed.
            let bars = pci_bars(&drv.config.gpus[g]);
            c.put(0, &(bars.len() as u32));
            for i in 0..PCI_MAX_BARS {
                let (size, addr) = bars.get(i).copied().unwrap_or((0, 0));
                let off = 8 + 24 * i;
                c.put(off, &0u32);
                c.put(off + 4, &((size >> 20) as u32));
                c.put(off + 8, &size);
                c.put(off + 16, &addr);
            }
            NV_OK
        }
        _ => return None,
    })
}

/// `NV2080_CTRL_BUS_MAX_PCI_BARS`.
const PCI_MAX_BARS: usize = 8;

/// The GPU's PCI BARs as RM counts them (64-bit BARs count once): (size, CPU physical
/// address). An H100 has BAR0 (16 MiB of registers), BAR1 (the framebuffer aperture) and BAR2
/// (32 MiB, RM's instance memory window), in `lspci` terms regions 0, 1 and 3.
pub(crate) fn pci_bars(gpu: &crate::SimGpu) -> [(u64, u64); 3] {
    [
        (16 << 20, gpu.bar0_address),
        (gpu.bar1_bytes, gpu.bar1_address),
        (32 << 20, gpu.bar1_address + gpu.bar1_bytes),
    ]
}

/// `NV2080_CTRL_BUS_INFO_MAX_LIST_SIZE`.
const BUS_INFO_MAX_LIST_SIZE: u32 = 0x34;
/// `NV2080_CTRL_BUS_INFO_INDEX_MAX` (`SYSMEM_CONNECTION_TYPE`).
const BUS_INFO_INDEX_MAX: u32 = 0x33;
/// `NV2080_CTRL_BUS_INFO_TYPE_PCI_EXPRESS`.
const BUS_INFO_TYPE_PCI_EXPRESS: u32 = 3;

/// The `NV2080_CTRL_BUS_INFO_INDEX_*` values the kernel RM computes itself for a discrete PCIe
/// GPU on an I/O-coherent x86 host (`getBusInfos`); `None` for the PCIe link state and error
/// counters (read from the link or asked of GSP), which are not modelled.
fn bus_info(gpu: &crate::SimGpu, index: u32) -> Option<u32> {
    Some(match index {
        // TYPE, INTERFACE_TYPE, GPU_INTERFACE_TYPE: kbifGetBusIntfType (no bridges any more).
        0x00 | 0x13 | 0x2e => BUS_INFO_TYPE_PCI_EXPRESS,
        0x01 => 0, // INTLINE: the legacy INTx line; MSI-X is used
        0x02 => 0, // CAPS: kbusControlGetCaps, CHIP_INTEGRATED only for Tegra
        // COHERENT_DMA_FLAGS / NONCOHERENT_DMA_FLAGS: kbifInitDmaCaps sets SNOOP and NOSNOOP
        // for context DMAs on an I/O-coherent chipset, and the GPU GART supports both (CTXDMA
        // bit 0, GPUGART bit 2).
        0x0b | 0x0c => 0x5,
        0x0e => 0x2, // GPU_GART_FLAGS: UNIFIED
        0x0f => u32::from(gpu.pci_bus),
        0x10 => u32::from(gpu.pci_device),
        0x2c => gpu.pci_domain,
        0x33 => 0, // SYSMEM_CONNECTION_TYPE_PCIE (no NVLink or C2C to system memory)
        // PCIE_GPU_LINK_CAPS, and ROOT_ / DOWNSTREAM_LINK_CAPS (no BR03/BR04 bridge: the root
        // port's): the Link Capabilities register, MAX_SPEED 3:0 (5 = 32 GT/s for gen 5) and
        // MAX_WIDTH 9:4; the GPU sits directly on a root port of the same generation and width,
        // no ASPM.
        0x03 | 0x04 | 0x06 => (gpu.pcie_gen & 0xf) | ((gpu.pcie_width & 0x3f) << 4),
        // PCIE_GPU_LINK_CTRL_STATUS, ROOT_ / DOWNSTREAM_LINK_CTRL_STATUS: Link Control in 15:0
        // (ASPM disabled), Link Status in 31:16: the link trained at its maximum (LINK_SPEED
        // 19:16, LINK_WIDTH 25:20).
        0x07 | 0x08 | 0x0a => ((gpu.pcie_gen & 0xf) << 16) | ((gpu.pcie_width & 0x3f) << 20),
        // PCIE_GEN_INFO (answered by GSP on an H100): GEN 15:12 (the link's maximum),
        // CURR_LEVEL 19:16 and GPU_GEN 23:20, each as gen - 1.
        0x2d => {
            let g = gpu.pcie_gen.saturating_sub(1) & 0xf;
            (g << 12) | (g << 16) | (g << 20)
        }
        _ => return None,
    })
}

/// `NV2080_CTRL_TIMER_GPU_CPU_TIME_MAX_SAMPLES`.
const TIME_MAX_SAMPLES: u8 = 16;

/// Nanoseconds of `clock`.
fn clock_ns(clock: nix::time::ClockId) -> u64 {
    nix::time::clock_gettime(clock).map_or(0, |t| {
        (t.tv_sec() as u64).wrapping_mul(1_000_000_000) + t.tv_nsec() as u64
    })
}

/// The GPU's PTIMER: nanoseconds, set from the OS's wall clock when RM initialises the GPU
/// (`tmrSetCurrentTime`), so it reads as the wall clock.
fn gpu_time_ns() -> u64 {
    clock_ns(nix::time::ClockId::CLOCK_REALTIME)
}

/// `subdeviceCtrlCmdTimerGetGpuCpuTimeCorrelationInfo` on a CPU-RM (not GSP-RM) build.
fn time_correlation(c: &mut Ctx<'_>) -> u32 {
    let clk: u8 = c.get(0).expect("size checked");
    let count: u8 = c.get(1).expect("size checked");
    if count > TIME_MAX_SAMPLES {
        return NV_ERR_INVALID_ARGUMENT;
    }
    match (clk >> 4, clk & 0xf) {
        // PROCESSOR_GSP: forwarded to GSP, which answers with its own clock: not modelled.
        (1, _) => NV_ERR_NOT_SUPPORTED,
        (0, 1) => {
            // OSTIME: cpuTime in microseconds of osGetCurrentTime (wall clock), gpuTime from
            // PTIMER, sampleCount pairs.
            for i in 0..usize::from(count) {
                let cpu_us = clock_ns(nix::time::ClockId::CLOCK_REALTIME) / 1000;
                c.put(8 + 16 * i, &gpu_time_ns());
                c.put(8 + 16 * i + 8, &cpu_us);
            }
            NV_OK
        }
        (0, 3) => {
            // PLATFORM_API: one pair, the GPU time between two osGetPerformanceCounter reads
            // (monotonic raw nanoseconds), the CPU time their mean.
            let before = clock_ns(nix::time::ClockId::CLOCK_MONOTONIC_RAW);
            let gpu = gpu_time_ns();
            let after = clock_ns(nix::time::ClockId::CLOCK_MONOTONIC_RAW);
            c.put(8, &gpu);
            c.put(16, &(before / 2 + after / 2));
            NV_OK
        }
        // TSC (tmrGetGpuAndCpuTimestampPair reads the CPU's time-stamp counter, which this
        // simulator does not read) and unknown sources.
        (0, _) => NV_ERR_NOT_SUPPORTED,
        _ => NV_ERR_INVALID_ARGUMENT,
    }
}
