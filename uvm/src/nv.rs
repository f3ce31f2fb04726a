//! NV status codes and UVM constants the handlers use (`nvstatuscodes.h`, `uvm_types.h`,
//! `nvCpuUuid.c`).

pub use nvproxy_abi::status::*;

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
