//! Per-node deltas: each builder calls its parent's builder, then applies only its own changes.
//!
//! Drafted from the facts with the same comparison `abi-import suggest` prints, then arranged by
//! branch (see the module documentation of `tree`). A `// A -> B` comment on a resize gives the
//! old and new size in bytes.

use super::base::v535_216_03;
use super::caps_consts::*;
use crate::Translation::{Fd, Simple, Special};
use crate::table::{DriverAbi, ParamSize};

/// 535.261.03 (535 branch). The ECC counter controls were reworked on the main line in 565
/// and backported here: `0x20803400` grows from 40 to 96 bytes, `0x20803401` becomes
/// `ECC_GET_VOLATILE_COUNTS` (it was `ECC_GET_ECI_COUNTERS`) and `0x20803402` disappears.
/// 535.288.01 is identical (WITHIN-BRANCH.md) and reuses this builder.
pub(super) fn v535_261_03() -> DriverAbi {
    let mut abi = v535_216_03();
    abi.resize_control(0x20803400, 96); // NV2080_CTRL_CMD_ECC_GET_CLIENT_EXPOSED_COUNTERS: 40 -> 96
    abi.add_control(0x20803401, "NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS", Some("NV2080_CTRL_ECC_GET_VOLATILE_COUNTS_PARAMS"), 40, Simple, ADMIN); // was NV2080_CTRL_CMD_ECC_GET_ECI_COUNTERS (96)
    abi.remove_control(0x20803402); // NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS
    abi
}

/// 545.29.06 (unqualified; main line after the 535 branch point). It still has 535.216.03's
/// 40-byte `ECC_GET_CLIENT_EXPOSED_COUNTERS`, so it forks from the 535 branch *before* the
/// 535.261.03 backport: its parent is 535.216.03.
pub(super) fn v545_29_06() -> DriverAbi {
    let mut abi = v535_216_03();
    abi.add_escape(0xd7, "NV_ESC_NUMA_INFO", &["nv_ioctl_numa_info_t"], ParamSize::Fixed(560), Special, CU);
    abi.add_control(0x288, "NV0000_CTRL_CMD_GPU_GET_ACTIVE_DEVICE_IDS", Some("NV0000_CTRL_GPU_GET_ACTIVE_DEVICE_IDS_PARAMS"), 3076, Simple, CU);
    abi.resize_control(0x3d08, 80); // NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO: 76 -> 80
    abi.add_control(0xde0001, "NV00DE_CTRL_CMD_REQUEST_DATA_POLL", Some("NV00DE_CTRL_REQUEST_DATA_POLL_PARAMS"), 8, Simple, CU);
    abi.resize_control(0xf80102, 2120); // NV00F8_CTRL_CMD_DESCRIBE: 2072 -> 2120
    abi.resize_control(0x20800102, 524); // NV2080_CTRL_CMD_GPU_GET_INFO_V2: 516 -> 524
    abi.resize_control(0x2080012f, 1024); // NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS: 984 -> 1024
    abi.resize_control(0x20800170, 256); // NV2080_CTRL_CMD_GPU_GET_ENGINES_V2: 252 -> 256
    abi.resize_control(0x208001a3, 48); // NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO: 40 -> 48
    abi.resize_control(0x20801303, 444); // NV2080_CTRL_CMD_FB_GET_INFO_V2: 436 -> 444
    abi.resize_control(0x20801346, 3848); // NV2080_CTRL_CMD_FB_GET_FS_INFO: 3080 -> 3848
    abi.resize_control(0x20802a0a, 136); // NV2080_CTRL_CMD_CE_GET_ALL_CAPS: 68 -> 136
    abi.remove_control(0x20803401); // NV2080_CTRL_CMD_ECC_GET_ECI_COUNTERS
    abi.remove_control(0x20803402); // NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS
    abi.resize_class(0x3e, 128); // NV01_MEMORY_SYSTEM: 120 -> 128
    abi.resize_class(0x40, 128); // NV01_MEMORY_LOCAL_USER: 120 -> 128
    abi.resize_class(0xde, 8); // RM_USER_SHARED_DATA: 4 -> 8
    abi.resize_class(0xfd, 80); // NV_MEMORY_MULTICAST_FABRIC: 40 -> 80
    abi.resize_class(0x50a0, 128); // NV50_MEMORY_VIRTUAL: 120 -> 128
    abi.resize_class(0xb8fa, 12); // NVB8FA_VIDEO_OFA: 8 -> 12
    abi.resize_class(0xc6fa, 12); // NVC6FA_VIDEO_OFA: 8 -> 12
    abi.resize_class(0xc7fa, 12); // NVC7FA_VIDEO_OFA: 8 -> 12
    abi.resize_class(0xc9fa, 12); // NVC9FA_VIDEO_OFA: 8 -> 12
    abi
}

/// Changes that entered the main line with the 550 branch (gVisor places them at its
/// unqualified 550.40.07 / 550.54.14 nodes): shared by the 550 branch tip and by 555, which
/// descends from the 550 branch point. Not a node of its own: there are no facts for a 550
/// version before the branch tip's backports, so it is applied by both children.
fn r550_branch_point(abi: &mut DriverAbi) {
    abi.resize_escape(0x58, 48); // NV_ESC_RM_UNMAP_MEMORY_DMA: 40 -> 48
    abi.add_escape(0xda, "NV_ESC_WAIT_OPEN_COMPLETE", &["nv_ioctl_wait_open_complete_t"], ParamSize::Fixed(8), Simple, CU);
    abi.resize_uvm(0x21, 9264); // UVM_MAP_EXTERNAL_ALLOCATION: 1200 -> 9264
    abi.resize_uvm(0x44, 9248); // UVM_ALLOC_SEMAPHORE_POOL: 1184 -> 9248
    abi.resize_control(0x127, 176); // NV0000_CTRL_CMD_SYSTEM_GET_P2P_CAPS: 168 -> 176
    abi.resize_control(0x12b, 8348); // NV0000_CTRL_CMD_SYSTEM_GET_P2P_CAPS_V2: 4252 -> 8348
    abi.add_control(0x289, "NV0000_CTRL_CMD_GPU_ASYNC_ATTACH_ID", Some("NV0000_CTRL_GPU_ASYNC_ATTACH_ID_PARAMS"), 4, Simple, CU);
    abi.add_control(0x290, "NV0000_CTRL_CMD_GPU_WAIT_ATTACH_ID", Some("NV0000_CTRL_GPU_WAIT_ATTACH_ID_PARAMS"), 4, Simple, CU);
    abi.add_control(0x801909, "NV0080_CTRL_CMD_PERF_CUDA_LIMIT_SET_CONTROL", Some("NV0080_CTRL_PERF_CUDA_LIMIT_CONTROL_PARAMS"), 1, Simple, CU);
    abi.add_control(0xe00102, "NV00E0_CTRL_CMD_IMPORT_MEM", Some("NV00E0_CTRL_IMPORT_MEM_PARAMS"), 1540, Simple, IMEX);
    abi.add_control(0xf10001, "NV00F1_CTRL_CMD_GET_FABRIC_EVENTS", Some("NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS"), 8200, Simple, IMEX);
    abi.add_control(0xf10002, "NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT", Some("NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS"), 2056, Simple, IMEX);
    abi.add_control(0xf10003, "NV00F1_CTRL_CMD_DISABLE_IMPORTERS", Some("NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS"), 2, Simple, IMEX);
    abi.add_control(0xfb0101, "NV00FB_CTRL_CMD_VALIDATE", Some("NV00FB_CTRL_VALIDATE_PARAMS"), 2120, Simple, IMEX);
    abi.add_control(0xfd0106, "NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU", Some("NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS"), 24, Simple, IMEX);
    abi.add_control(0xfd0107, "NV00FD_CTRL_CMD_SET_FAILURE", Some("NV00FD_CTRL_SET_FAILURE_PARAMS"), 4, Simple, IMEX);
    abi.resize_control(0x20800170, 260); // NV2080_CTRL_CMD_GPU_GET_ENGINES_V2: 256 -> 260
    abi.add_control(0x20802068, "NV2080_CTRL_CMD_PERF_GET_CURRENT_PSTATE", Some("NV2080_CTRL_PERF_GET_CURRENT_PSTATE_PARAMS"), 4, Simple, CU);
    abi.resize_control(0x20802096, 50704); // NV2080_CTRL_CMD_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2: 34000 -> 50704
    abi.resize_control(0x906f0102, 16); // NV906F_CTRL_CMD_RESET_CHANNEL: 12 -> 16
    abi.resize_control(0xc56f010b, 128); // NVC56F_CTRL_CMD_GET_KMB: 124 -> 128
    abi.resize_control(0xcb330101, 6); // NV_CONF_COMPUTE_CTRL_CMD_SYSTEM_GET_CAPABILITIES: 5 -> 6
    abi.add_class(0xe0, "NV_MEMORY_EXPORT", Some("NV00E0_ALLOCATION_PARAMETERS"), 244, Simple, IMEX);
    abi.add_class(0xf1, "NV_IMEX_SESSION", Some("NV00F1_ALLOCATION_PARAMETERS"), 32, Fd, IMEX);
    abi.add_class(0xfb, "NV_MEMORY_FABRIC_IMPORTED_REF", Some("NV00FB_ALLOCATION_PARAMETERS"), 32, Simple, IMEX);
    abi.add_class(0xa0bc, "NVENC_SW_SESSION", Some("NVA0BC_ALLOC_PARAMETERS"), 20, Simple, V);
    abi.resize_class(0xfe, 8); // NV_MEMORY_MAPPER: 1 -> 8
    abi.set_class_caps(0xfe, V); // NV_MEMORY_MAPPER now serves video (gVisor, 550.40.07)
}

/// 550.163.01 (550 branch tip, April 2025). On top of the 550 branch point it carries
/// backports that the main line only got later (ECC counter rework from 565, key rotation
/// state) and a larger `GET_CLASSLIST_V2`; 555.58.02 has none of them.
pub(super) fn v550_163_01() -> DriverAbi {
    let mut abi = v545_29_06();
    r550_branch_point(&mut abi);
    abi.resize_control(0x800292, 700); // NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2: 644 -> 700
    abi.resize_control(0x20803400, 96); // NV2080_CTRL_CMD_ECC_GET_CLIENT_EXPOSED_COUNTERS: 40 -> 96
    abi.add_control(0x20803401, "NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS", Some("NV2080_CTRL_ECC_GET_VOLATILE_COUNTS_PARAMS"), 40, Simple, ADMIN);
    abi.add_control(0xcb33010c, "NV_CONF_COMPUTE_CTRL_CMD_GPU_GET_KEY_ROTATION_STATE", Some("NV_CONF_COMPUTE_CTRL_CMD_GPU_GET_KEY_ROTATION_STATE_PARAMS"), 8, Simple, CU);
    abi
}

/// 555.58.02 (unqualified; main line). Forks from the 550 branch point, not from the 550 tip.
pub(super) fn v555_58_02() -> DriverAbi {
    let mut abi = v545_29_06();
    r550_branch_point(&mut abi);
    abi.resize_control(0x800289, 8); // NV0080_CTRL_CMD_GPU_GET_VIRTUALIZATION_MODE: 4 -> 8
    abi.resize_control(0x800292, 404); // NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2: 644 -> 404
    abi.resize_control(0x2080012f, 1224); // NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS: 1024 -> 1224
    abi.resize_control(0x20803002, 6152); // NV2080_CTRL_CMD_NVLINK_GET_NVLINK_STATUS: 5896 -> 6152
    abi.add_control(0x20803401, "NV2080_CTRL_CMD_ECC_GET_ECI_COUNTERS", Some("NV2080_CTRL_ECC_GET_ECI_COUNTERS_PARAMS"), 96, Simple, ADMIN);
    abi.add_control(0x20803402, "NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS", Some("NV2080_CTRL_ECC_GET_VOLATILE_COUNTS_PARAMS"), 40, Simple, ADMIN);
    abi.remove_control(0xc36f0101); // NVC36F_CTRL_GET_CLASS_ENGINEID
    abi.resize_class(0xfe, 24); // NV_MEMORY_MAPPER: 8 -> 24
    abi
}

/// 560.35.03 (unqualified; main line): first Blackwell classes.
pub(super) fn v560_35_03() -> DriverAbi {
    let mut abi = v555_58_02();
    abi.resize_control(0xda0002, 40); // NV_SEMAPHORE_SURFACE_CTRL_CMD_BIND_CHANNEL: 24 -> 40
    abi.add_control(0xda0006, "NV_SEMAPHORE_SURFACE_CTRL_CMD_UNBIND_CHANNEL", Some("NV_SEMAPHORE_SURFACE_CTRL_UNBIND_CHANNEL_PARAMS"), 40, Simple, G);
    abi.resize_control(0x2080012f, 1264); // NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS: 1224 -> 1264
    abi.resize_control(0x20800170, 340); // NV2080_CTRL_CMD_GPU_GET_ENGINES_V2: 260 -> 340
    abi.resize_control(0x2080120f, 1944); // NV2080_CTRL_CMD_GR_GET_SM_TO_GPC_TPC_MAPPINGS: 1176 -> 1944
    abi.resize_control(0x20801303, 460); // NV2080_CTRL_CMD_FB_GET_INFO_V2: 444 -> 460
    abi.resize_control(0x20801829, 12); // NV2080_CTRL_CMD_BUS_GET_PCIE_REQ_ATOMICS_CAPS: 4 -> 12
    abi.resize_control(0x2080182a, 112); // NV2080_CTRL_CMD_BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS: 104 -> 112
    abi.add_control(0x20801830, "NV2080_CTRL_CMD_BUS_GET_PCIE_CPL_ATOMICS_CAPS", Some("NV2080_CTRL_CMD_BUS_GET_PCIE_CPL_ATOMICS_CAPS_PARAMS"), 4, Simple, G);
    abi.add_control(0x20803083, "NV2080_CTRL_CMD_NVLINK_GET_PLATFORM_INFO", Some("NV2080_CTRL_NVLINK_GET_PLATFORM_INFO_PARAMS"), 37, Simple, IMEX);
    abi.add_control(0xb0cc0115, "NVB0CC_CTRL_CMD_GET_CHIPLET_HS_CREDIT_POOL", Some("NVB0CC_CTRL_GET_CHIPLET_HS_CREDIT_POOL"), 124, Simple, P);
    abi.add_control(0xcb33010c, "NV_CONF_COMPUTE_CTRL_CMD_GPU_GET_KEY_ROTATION_STATE", Some("NV_CONF_COMPUTE_CTRL_CMD_GPU_GET_KEY_ROTATION_STATE_PARAMS"), 8, Simple, CU);
    abi.add_class(0xc96f, "BLACKWELL_CHANNEL_GPFIFO_A", Some("NV_CHANNEL_ALLOC_PARAMS"), 360, Special, CU);
    abi.add_class(0xc9b5, "BLACKWELL_DMA_COPY_A", Some("NVB0B5_ALLOCATION_PARAMETERS"), 8, Simple, CU);
    abi.add_class(0xcd40, "BLACKWELL_INLINE_TO_MEMORY_A", Some("NV_GR_ALLOCATION_PARAMETERS"), 16, Simple, G);
    abi.add_class(0xcd97, "BLACKWELL_A", Some("NV_GR_ALLOCATION_PARAMETERS"), 16, Simple, G);
    abi.add_class(0xcdb0, "NVCDB0_VIDEO_DECODER", Some("NV_BSP_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi.add_class(0xcdc0, "BLACKWELL_COMPUTE_A", Some("NV_GR_ALLOCATION_PARAMETERS"), 16, Simple, CU);
    abi.add_class(0xcdd1, "NVCDD1_VIDEO_NVJPG", Some("NV_NVJPG_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi.add_class(0xcdfa, "NVCDFA_VIDEO_OFA", Some("NV_OFA_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi
}

/// 565.77 (unqualified; main line): the ECC counter rework lands on the main line (the same
/// change 535.261.03 and 550.163.01 received as backports).
pub(super) fn v565_77() -> DriverAbi {
    let mut abi = v560_35_03();
    abi.resize_control(0x102, 108); // NV0000_CTRL_CMD_SYSTEM_GET_CPU_INFO: 104 -> 108
    abi.resize_control(0x2080012f, 1464); // NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS: 1264 -> 1464
    abi.add_control(0x208001b2, "NV2080_CTRL_CMD_GPU_GET_RECOVERY_ACTION", Some("NV2080_CTRL_GPU_GET_RECOVERY_ACTION_PARAMS"), 4, Simple, G);
    abi.resize_control(0x20803400, 96); // NV2080_CTRL_CMD_ECC_GET_CLIENT_EXPOSED_COUNTERS: 40 -> 96
    abi.add_control(0x20803401, "NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS", Some("NV2080_CTRL_ECC_GET_VOLATILE_COUNTS_PARAMS"), 40, Simple, ADMIN); // was NV2080_CTRL_CMD_ECC_GET_ECI_COUNTERS (96)
    abi.remove_control(0x20803402); // NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS
    abi
}

/// Changes that entered with the 570 branch point (gVisor's unqualified 570.86.15): Blackwell B
/// classes, 368-byte channel params, the 2608-byte dma-buf export, and the DRAM encryption
/// controls numbered 0x20801355/58/59. Shared by the 570 branch tip and by 575, which both
/// descend from that branch point (570.211.01 was released *after* 575.64.05, so it cannot be
/// 575's parent: a later 570 backport would leak into 575).
fn r570_branch_point(abi: &mut DriverAbi) {
    abi.resize_escape(0xd9, 2608); // NV_ESC_EXPORT_TO_DMABUF_FD: 2600 -> 2608
    abi.add_control(0x20801355, "NV2080_CTRL_CMD_FB_QUERY_DRAM_ENCRYPTION_PENDING_CONFIGURATION", Some("NV2080_CTRL_FB_QUERY_DRAM_ENCRYPTION_PENDING_CONFIGURATION_PARAMS"), 4, Simple, G);
    abi.resize_control(0x20802096, 55888); // NV2080_CTRL_CMD_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2: 50704 -> 55888
    abi.resize_control(0x20803001, 32); // NV2080_CTRL_CMD_NVLINK_GET_NVLINK_CAPS: 16 -> 32
    abi.resize_control(0x20803002, 13320); // NV2080_CTRL_CMD_NVLINK_GET_NVLINK_STATUS: 6152 -> 13320
    abi.add_control(0xb0cc0119, "NVB0CC_CTRL_CMD_RESERVE_CCU_PROF", Some("NVB0CC_CTRL_RESERVE_CCUPROF_PARAMS"), 1, Simple, P);
    abi.resize_class(0xc46f, 368); // TURING_CHANNEL_GPFIFO_A: 360 -> 368
    abi.resize_class(0xc56f, 368); // AMPERE_CHANNEL_GPFIFO_A: 360 -> 368
    abi.add_class(0xc761, "BLACKWELL_USERMODE_A", Some("NV_HOPPER_USERMODE_A_PARAMS"), 2, Simple, CU);
    abi.resize_class(0xc86f, 368); // HOPPER_CHANNEL_GPFIFO_A: 360 -> 368
    abi.resize_class(0xc96f, 368); // BLACKWELL_CHANNEL_GPFIFO_A: 360 -> 368
    abi.add_class(0xca6f, "BLACKWELL_CHANNEL_GPFIFO_B", Some("NV_CHANNEL_ALLOC_PARAMS"), 368, Special, CU);
    abi.add_class(0xcab5, "BLACKWELL_DMA_COPY_B", Some("NVB0B5_ALLOCATION_PARAMETERS"), 8, Simple, CU);
    abi.add_class(0xce97, "BLACKWELL_B", Some("NV_GR_ALLOCATION_PARAMETERS"), 16, Simple, G);
    abi.add_class(0xcec0, "BLACKWELL_COMPUTE_B", Some("NV_GR_ALLOCATION_PARAMETERS"), 16, Simple, CU);
    abi.add_class(0xcfb0, "NVCFB0_VIDEO_DECODER", Some("NV_BSP_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi.add_class(0xcfb7, "NVCFB7_VIDEO_ENCODER", Some("NV_MSENC_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi.add_class(0xcfd1, "NVCFD1_VIDEO_NVJPG", Some("NV_NVJPG_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi.add_class(0xcffa, "NVCFFA_VIDEO_OFA", Some("NV_OFA_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi.add_control(0x20801358, "NV2080_CTRL_CMD_FB_QUERY_DRAM_ENCRYPTION_INFOROM_SUPPORT", Some("NV2080_CTRL_FB_DRAM_ENCRYPTION_INFOROM_SUPPORT_PARAMS"), 4, Simple, CU);
    abi.add_control(0x20801359, "NV2080_CTRL_CMD_FB_QUERY_DRAM_ENCRYPTION_STATUS", Some("NV2080_CTRL_FB_QUERY_DRAM_ENCRYPTION_STATUS_PARAMS"), 4, Simple, CU);
}

/// 570.211.01 (570 branch tip). Nothing beyond the 570 branch point in our tables: the DRAM
/// encryption controls keep the 570 numbering.
pub(super) fn v570_211_01() -> DriverAbi {
    let mut abi = v565_77();
    r570_branch_point(&mut abi);
    abi
}

/// 575.64.05 (main line). Renumbers two DRAM encryption controls down by one (gVisor facts f:
/// main branch only), so `0x20801358` means INFOROM_SUPPORT on 570 and STATUS on 575 and later.
pub(super) fn v575_64_05() -> DriverAbi {
    let mut abi = v565_77();
    r570_branch_point(&mut abi);
    abi.remove_control(0x20801359); // STATUS moves to 0x20801358
    abi.resize_control(0x20800102, 532); // NV2080_CTRL_CMD_GPU_GET_INFO_V2: 524 -> 532
    abi.add_control(0x20800513, "NV2080_CTRL_CMD_THERMAL_SYSTEM_EXECUTE_V2", Some("NV2080_CTRL_THERMAL_SYSTEM_EXECUTE_V2_PARAMS"), 1432, Simple, CU);
    abi.resize_control(0x2080121b, 7192); // NV2080_CTRL_CMD_GR_GET_GLOBAL_SM_ORDER: 6168 -> 7192
    abi.add_control(0x2080123c, "NV2080_CTRL_CMD_GR_GET_SM_ISSUE_RATE_MODIFIER_V2", Some("NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_V2_PARAMS"), 2044, Simple, CU);
    abi.add_control(0x20801357, "NV2080_CTRL_CMD_FB_QUERY_DRAM_ENCRYPTION_INFOROM_SUPPORT", Some("NV2080_CTRL_FB_DRAM_ENCRYPTION_INFOROM_SUPPORT_PARAMS"), 4, Simple, CU);
    abi.add_control(0x20801358, "NV2080_CTRL_CMD_FB_QUERY_DRAM_ENCRYPTION_STATUS", Some("NV2080_CTRL_FB_QUERY_DRAM_ENCRYPTION_STATUS_PARAMS"), 4, Simple, CU);
    abi.resize_control(0xa06c0101, 3); // NVA06C_CTRL_CMD_GPFIFO_SCHEDULE: 2 -> 3
    abi.resize_control(0xa06f0103, 3); // NVA06F_CTRL_CMD_GPFIFO_SCHEDULE: 2 -> 3
    abi.resize_control(0xc56f010b, 144); // NVC56F_CTRL_CMD_GET_KMB: 128 -> 144
    abi
}

/// Changes that entered with the 580 branch point (gVisor's 580.65.06): 64-byte
/// `NVOS46_PARAMETERS`, 56-byte VA space params, new video classes, skyline info. Shared by the
/// 580 branch tip and by 590, which forks from an earlier 580 release (580.142 is newer than
/// 590.48.01 and carries backports 590 lacks, e.g. a 39-byte `NVLINK_GET_PLATFORM_INFO`).
fn r580_branch_point(abi: &mut DriverAbi) {
    abi.resize_escape(0x57, 64); // NV_ESC_RM_MAP_MEMORY_DMA: 56 -> 64
    abi.resize_control(0x214, 384); // NV0000_CTRL_CMD_GPU_GET_PROBED_IDS: 256 -> 384
    abi.resize_control(0x800292, 804); // NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2: 404 -> 804
    abi.resize_control(0xf80102, 2136); // NV00F8_CTRL_CMD_DESCRIBE: 2120 -> 2136
    abi.resize_control(0xfb0101, 2136); // NV00FB_CTRL_CMD_VALIDATE: 2120 -> 2136
    abi.resize_control(0x20800102, 564); // NV2080_CTRL_CMD_GPU_GET_INFO_V2: 532 -> 564
    abi.resize_control(0x208001a3, 56); // NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO: 48 -> 56
    abi.resize_control(0x2080121b, 9240); // NV2080_CTRL_CMD_GR_GET_GLOBAL_SM_ORDER: 7192 -> 9240
    abi.add_control(0x2080123d, "NV2080_CTRL_CMD_GR_GET_SM_ISSUE_THROTTLE_CTRL", Some("NV2080_CTRL_GR_GET_SM_ISSUE_THROTTLE_CTRL_PARAMS"), 2044, Simple, P);
    abi.resize_control(0x20801303, 1028); // NV2080_CTRL_CMD_FB_GET_INFO_V2: 460 -> 1028
    abi.resize_control(0x20801320, 904); // NV2080_CTRL_CMD_FB_GET_FB_REGION_INFO: 776 -> 904
    abi.resize_control(0x20803001, 48); // NV2080_CTRL_CMD_NVLINK_GET_NVLINK_CAPS: 32 -> 48
    abi.add_control(0x20803404, "NV2080_CTRL_CMD_ECC_GET_REPAIR_STATUS", Some("NV2080_CTRL_ECC_GET_REPAIR_STATUS_PARAMS"), 2, Simple, G);
    abi.resize_class(0x90f1, 56); // FERMI_VASPACE_A: 48 -> 56
    abi.add_class(0xceb0, "NVCEB0_VIDEO_DECODER", Some("NV_BSP_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi.add_class(0xceb7, "NVCEB7_VIDEO_ENCODER", Some("NV_MSENC_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi.add_class(0xcefa, "NVCEFA_VIDEO_OFA", Some("NV_OFA_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi.add_class(0xd1b0, "NVD1B0_VIDEO_DECODER", Some("NV_BSP_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi.add_class(0xd1b7, "NVD1B7_VIDEO_ENCODER", Some("NV_MSENC_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi.add_class(0xd1fa, "NVD1FA_VIDEO_OFA", Some("NV_OFA_ALLOCATION_PARAMETERS"), 12, Simple, V);
    abi.add_control(0x2080019f, "NV2080_CTRL_CMD_GPU_GET_SKYLINE_INFO", Some("NV2080_CTRL_GPU_GET_SKYLINE_INFO_PARAMS"), 220, Simple, CUG);
}

/// 580.142 (580 branch tip, March 2026).
pub(super) fn v580_142() -> DriverAbi {
    let mut abi = v575_64_05();
    r580_branch_point(&mut abi);
    abi.resize_control(0xf10001, 10248); // NV00F1_CTRL_CMD_GET_FABRIC_EVENTS: 8200 -> 10248
    abi.resize_control(0xfd0106, 32); // NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU: 24 -> 32
    abi.resize_control(0x20803002, 13344); // NV2080_CTRL_CMD_NVLINK_GET_NVLINK_STATUS: 13320 -> 13344
    abi.resize_control(0x20803083, 39); // NV2080_CTRL_CMD_NVLINK_GET_PLATFORM_INFO: 37 -> 39
    abi
}

/// 590.48.01 (main line): UVM_FREE and UVM_UNREGISTER_CHANNEL shrink, 88-byte NV50_P2P params.
pub(super) fn v590_48_01() -> DriverAbi {
    let mut abi = v575_64_05();
    r580_branch_point(&mut abi);
    abi.resize_uvm(0x1c, 12); // UVM_UNREGISTER_CHANNEL: 28 -> 12
    abi.resize_uvm(0x22, 16); // UVM_FREE: 24 -> 16
    abi.resize_control(0xf10001, 11272); // NV00F1_CTRL_CMD_GET_FABRIC_EVENTS: 8200 -> 11272
    abi.resize_control(0xfd0106, 40); // NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU: 24 -> 40
    abi.resize_control(0x2080012f, 1664); // NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS: 1464 -> 1664
    abi.resize_control(0x20803002, 13864); // NV2080_CTRL_CMD_NVLINK_GET_NVLINK_STATUS: 13320 -> 13864
    abi.resize_control(0x20803083, 38); // NV2080_CTRL_CMD_NVLINK_GET_PLATFORM_INFO: 37 -> 38
    abi.resize_class(0x503b, 88); // NV50_P2P: 72 -> 88
    abi.resize_control(0x2080019f, 400); // NV2080_CTRL_CMD_GPU_GET_SKYLINE_INFO: 220 -> 400
    abi
}

/// 595.45.04 (main line, newest tag).
pub(super) fn v595_45_04() -> DriverAbi {
    let mut abi = v590_48_01();
    abi.resize_control(0x20800110, 68); // NV2080_CTRL_CMD_GPU_GET_NAME_STRING: 132 -> 68
    abi.resize_control(0x20803083, 39); // NV2080_CTRL_CMD_NVLINK_GET_PLATFORM_INFO: 38 -> 39
    abi.add_control(0x2080309d, "NV2080_CTRL_CMD_NVLINK_LOCK_REMAP_TABLE_AND_MSE", Some("NV2080_CTRL_NVLINK_LOCK_REMAP_TABLE_AND_MSE_PARAMS"), 16, Simple, IMEX);
    abi
}
