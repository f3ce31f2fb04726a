//! NV status codes and UVM constants the handlers use (`nvstatuscodes.h`, `uvm_types.h`,
//! `nvCpuUuid.c`).

/// `NV_OK`.
pub const NV_OK: u32 = 0x0000_0000;
/// `NV_ERR_GPU_UUID_NOT_FOUND`.
pub const NV_ERR_GPU_UUID_NOT_FOUND: u32 = 0x0000_0012;
/// `NV_ERR_ILLEGAL_ACTION`.
pub const NV_ERR_ILLEGAL_ACTION: u32 = 0x0000_0016;
/// `NV_ERR_IN_USE`.
pub const NV_ERR_IN_USE: u32 = 0x0000_0017;
/// `NV_ERR_INVALID_ADDRESS`.
pub const NV_ERR_INVALID_ADDRESS: u32 = 0x0000_001e;
/// `NV_ERR_INVALID_ARGUMENT`.
pub const NV_ERR_INVALID_ARGUMENT: u32 = 0x0000_001f;
/// `NV_ERR_INVALID_CHANNEL`.
pub const NV_ERR_INVALID_CHANNEL: u32 = 0x0000_0021;
/// `NV_ERR_INVALID_CLIENT`.
pub const NV_ERR_INVALID_CLIENT: u32 = 0x0000_0023;
/// `NV_ERR_INVALID_DEVICE`.
pub const NV_ERR_INVALID_DEVICE: u32 = 0x0000_0026;
/// `NV_ERR_INVALID_STATE`.
pub const NV_ERR_INVALID_STATE: u32 = 0x0000_0040;
/// `NV_ERR_OBJECT_NOT_FOUND`.
pub const NV_ERR_OBJECT_NOT_FOUND: u32 = 0x0000_0057;
/// `NV_WARN_NOTHING_TO_DO`.
pub const NV_WARN_NOTHING_TO_DO: u32 = 0x0001_0006;

/// `NV_PROCESSOR_UUID_CPU_DEFAULT` (`nvCpuUuid.c`): the UUID that names the CPU in UVM params
/// (from `uuidgen`, 73772a14-2c41-4750-a27b-d4d74e0f5ea6, stored byte-reversed).
pub const NV_PROCESSOR_UUID_CPU_DEFAULT: [u8; 16] = [
    0xa6, 0x5e, 0x0f, 0x4e, 0xd7, 0xd4, 0x7b, 0xa2, 0x50, 0x47, 0x41, 0x2c, 0x14, 0x2a, 0x77, 0x73,
];

/// UVM commands never accepted from a client, whatever the table or the admin says:
/// `UVM_TOOLS_READ_PROCESS_MEMORY` and `UVM_TOOLS_WRITE_PROCESS_MEMORY` read and write the
/// memory of the process that *issues* them, which is the daemon (gVisor issues them only
/// itself, facts section d).
pub const NEVER_FROM_CLIENTS: &[u32] = &[
    nvproxy_abi::ioctl::UVM_TOOLS_READ_PROCESS_MEMORY,
    nvproxy_abi::ioctl::UVM_TOOLS_WRITE_PROCESS_MEMORY,
];
