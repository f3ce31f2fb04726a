//! Ioctl numbers: the `_IOC` encoding as `const fn`s, escape numbers, UVM command numbers.
//!
//! Commands are `u32`, which is what `fuse_ioctl_in.cmd` carries; cast to the libc ioctl request
//! type only at the syscall (STYLE.md section 2).

use crate::structs::frontend::{
    NVOS21_PARAMETERS, NVOS54_PARAMETERS, NVOS64_PARAMETERS, nv_ioctl_register_fd_t,
    nv_ioctl_rm_api_version_t,
};

/// Number of bits of the `_IOC_NR` field.
pub const IOC_NRBITS: u32 = 8;
/// Number of bits of the `_IOC_TYPE` field.
pub const IOC_TYPEBITS: u32 = 8;
/// Number of bits of the `_IOC_SIZE` field (x86_64, arm64).
pub const IOC_SIZEBITS: u32 = 14;
/// Shift of the `_IOC_NR` field.
pub const IOC_NRSHIFT: u32 = 0;
/// Shift of the `_IOC_TYPE` field.
pub const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
/// Shift of the `_IOC_SIZE` field.
pub const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
/// Shift of the `_IOC_DIR` field.
pub const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;
/// `_IOC_WRITE`: userspace writes the argument (the kernel reads it).
pub const IOC_WRITE: u32 = 1;
/// `_IOC_READ`: the kernel writes the argument back.
pub const IOC_READ: u32 = 2;

/// `_IOC(dir, ty, nr, size)`. Panics (at compile time in a `const`) if `size` does not fit the
/// 14-bit size field; such payloads go through `NV_ESC_IOCTL_XFER_CMD`.
#[expect(
    clippy::cast_possible_truncation,
    reason = "size is asserted below 2^14 first"
)]
pub const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
    assert!(
        size < (1 << IOC_SIZEBITS),
        "argument too large for the _IOC size field"
    );
    (dir << IOC_DIRSHIFT)
        | ((ty as u32) << IOC_TYPESHIFT)
        | ((nr as u32) << IOC_NRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)
}

/// `_IOWR('F', nr, size)`: how the NVIDIA user-space libraries encode every escape.
pub const fn nv_iowr(nr: u8, size: usize) -> u32 {
    ioc(IOC_READ | IOC_WRITE, NV_IOCTL_MAGIC, nr, size)
}

/// `_IOC_NR(cmd)`.
pub const fn ioc_nr(cmd: u32) -> u8 {
    ((cmd >> IOC_NRSHIFT) & ((1 << IOC_NRBITS) - 1)) as u8
}

/// `_IOC_TYPE(cmd)`.
pub const fn ioc_type(cmd: u32) -> u8 {
    ((cmd >> IOC_TYPESHIFT) & ((1 << IOC_TYPEBITS) - 1)) as u8
}

/// `_IOC_SIZE(cmd)`.
pub const fn ioc_size(cmd: u32) -> u32 {
    (cmd >> IOC_SIZESHIFT) & ((1 << IOC_SIZEBITS) - 1)
}

/// `_IOC_DIR(cmd)`.
pub const fn ioc_dir(cmd: u32) -> u32 {
    cmd >> IOC_DIRSHIFT
}

/// `NV_IOCTL_MAGIC` ('F'), the ioctl type of every escape. The driver ignores the type.
pub const NV_IOCTL_MAGIC: u8 = b'F';
/// `NV_IOCTL_BASE`: first escape number of the Unix-specific escapes.
pub const NV_IOCTL_BASE: u8 = 200;
/// `NV_ABSOLUTE_MAX_IOCTL_SIZE`: the largest payload accepted through `NV_ESC_IOCTL_XFER_CMD`.
pub const NV_ABSOLUTE_MAX_IOCTL_SIZE: u32 = 16384;
/// `NV_RM_API_VERSION_STRING_LENGTH`.
pub const NV_RM_API_VERSION_STRING_LENGTH: usize = 64;
/// `NV_RM_API_VERSION_CMD_STRICT`: the whole version string must match.
pub const NV_RM_API_VERSION_CMD_STRICT: u32 = 0;
/// `NV_RM_API_VERSION_CMD_RELAXED` ('1'): only the branch number must match.
pub const NV_RM_API_VERSION_CMD_RELAXED: u32 = b'1' as u32;
/// `NV_RM_API_VERSION_CMD_QUERY` ('2'): return the version without checking.
pub const NV_RM_API_VERSION_CMD_QUERY: u32 = b'2' as u32;
/// `NV_RM_API_VERSION_REPLY_RECOGNIZED`.
pub const NV_RM_API_VERSION_REPLY_RECOGNIZED: u32 = 1;
/// `NV_DMABUF_EXPORT_MAX_HANDLES`.
pub const NV_DMABUF_EXPORT_MAX_HANDLES: usize = 128;

/// `NV_ESC_RM_NVLOG_CTRL`: escape 95 on the 535 branch (`NV_ESC_RM_LOCKLESS_DIAGNOSTIC` later).
pub const NV_ESC_RM_NVLOG_CTRL: u8 = 0x5f;
// Escape numbers (`_IOC_NR`), from `nv_escape.h` / `nv-ioctl-numbers.h`. Stable across the
// versions in the tree (95 is `NV_ESC_RM_NVLOG_CTRL` on 535 and `NV_ESC_RM_LOCKLESS_DIAGNOSTIC` later).
/// `NV_ESC_RM_ALLOC_MEMORY`.
pub const NV_ESC_RM_ALLOC_MEMORY: u8 = 0x27;
/// `NV_ESC_RM_ALLOC_OBJECT`.
pub const NV_ESC_RM_ALLOC_OBJECT: u8 = 0x28;
/// `NV_ESC_RM_FREE`.
pub const NV_ESC_RM_FREE: u8 = 0x29;
/// `NV_ESC_RM_CONTROL`.
pub const NV_ESC_RM_CONTROL: u8 = 0x2a;
/// `NV_ESC_RM_ALLOC`.
pub const NV_ESC_RM_ALLOC: u8 = 0x2b;
/// `NV_ESC_RM_CONFIG_GET`.
pub const NV_ESC_RM_CONFIG_GET: u8 = 0x32;
/// `NV_ESC_RM_CONFIG_SET`.
pub const NV_ESC_RM_CONFIG_SET: u8 = 0x33;
/// `NV_ESC_RM_DUP_OBJECT`.
pub const NV_ESC_RM_DUP_OBJECT: u8 = 0x34;
/// `NV_ESC_RM_SHARE`.
pub const NV_ESC_RM_SHARE: u8 = 0x35;
/// `NV_ESC_RM_CONFIG_GET_EX`.
pub const NV_ESC_RM_CONFIG_GET_EX: u8 = 0x37;
/// `NV_ESC_RM_CONFIG_SET_EX`.
pub const NV_ESC_RM_CONFIG_SET_EX: u8 = 0x38;
/// `NV_ESC_RM_I2C_ACCESS`.
pub const NV_ESC_RM_I2C_ACCESS: u8 = 0x39;
/// `NV_ESC_RM_IDLE_CHANNELS`.
pub const NV_ESC_RM_IDLE_CHANNELS: u8 = 0x41;
/// `NV_ESC_RM_VID_HEAP_CONTROL`.
pub const NV_ESC_RM_VID_HEAP_CONTROL: u8 = 0x4a;
/// `NV_ESC_RM_ACCESS_REGISTRY`.
pub const NV_ESC_RM_ACCESS_REGISTRY: u8 = 0x4d;
/// `NV_ESC_RM_MAP_MEMORY`.
pub const NV_ESC_RM_MAP_MEMORY: u8 = 0x4e;
/// `NV_ESC_RM_UNMAP_MEMORY`.
pub const NV_ESC_RM_UNMAP_MEMORY: u8 = 0x4f;
/// `NV_ESC_RM_GET_EVENT_DATA`.
pub const NV_ESC_RM_GET_EVENT_DATA: u8 = 0x52;
/// `NV_ESC_RM_ALLOC_CONTEXT_DMA2`.
pub const NV_ESC_RM_ALLOC_CONTEXT_DMA2: u8 = 0x54;
/// `NV_ESC_RM_ADD_VBLANK_CALLBACK`.
pub const NV_ESC_RM_ADD_VBLANK_CALLBACK: u8 = 0x56;
/// `NV_ESC_RM_MAP_MEMORY_DMA`.
pub const NV_ESC_RM_MAP_MEMORY_DMA: u8 = 0x57;
/// `NV_ESC_RM_UNMAP_MEMORY_DMA`.
pub const NV_ESC_RM_UNMAP_MEMORY_DMA: u8 = 0x58;
/// `NV_ESC_RM_BIND_CONTEXT_DMA`.
pub const NV_ESC_RM_BIND_CONTEXT_DMA: u8 = 0x59;
/// `NV_ESC_RM_EXPORT_OBJECT_TO_FD`.
pub const NV_ESC_RM_EXPORT_OBJECT_TO_FD: u8 = 0x5c;
/// `NV_ESC_RM_IMPORT_OBJECT_FROM_FD`.
pub const NV_ESC_RM_IMPORT_OBJECT_FROM_FD: u8 = 0x5d;
/// `NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO`.
pub const NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO: u8 = 0x5e;
/// `NV_ESC_RM_LOCKLESS_DIAGNOSTIC`.
pub const NV_ESC_RM_LOCKLESS_DIAGNOSTIC: u8 = 0x5f;
/// `NV_ESC_CARD_INFO`.
pub const NV_ESC_CARD_INFO: u8 = 0xc8;
/// `NV_ESC_REGISTER_FD`.
pub const NV_ESC_REGISTER_FD: u8 = 0xc9;
/// `NV_ESC_ALLOC_OS_EVENT`.
pub const NV_ESC_ALLOC_OS_EVENT: u8 = 0xce;
/// `NV_ESC_FREE_OS_EVENT`.
pub const NV_ESC_FREE_OS_EVENT: u8 = 0xcf;
/// `NV_ESC_STATUS_CODE`.
pub const NV_ESC_STATUS_CODE: u8 = 0xd1;
/// `NV_ESC_CHECK_VERSION_STR`.
pub const NV_ESC_CHECK_VERSION_STR: u8 = 0xd2;
/// `NV_ESC_IOCTL_XFER_CMD`.
pub const NV_ESC_IOCTL_XFER_CMD: u8 = 0xd3;
/// `NV_ESC_ATTACH_GPUS_TO_FD`.
pub const NV_ESC_ATTACH_GPUS_TO_FD: u8 = 0xd4;
/// `NV_ESC_QUERY_DEVICE_INTR`.
pub const NV_ESC_QUERY_DEVICE_INTR: u8 = 0xd5;
/// `NV_ESC_SYS_PARAMS`.
pub const NV_ESC_SYS_PARAMS: u8 = 0xd6;
/// `NV_ESC_NUMA_INFO`.
pub const NV_ESC_NUMA_INFO: u8 = 0xd7;
/// `NV_ESC_SET_NUMA_STATUS`.
pub const NV_ESC_SET_NUMA_STATUS: u8 = 0xd8;
/// `NV_ESC_EXPORT_TO_DMABUF_FD`.
pub const NV_ESC_EXPORT_TO_DMABUF_FD: u8 = 0xd9;
/// `NV_ESC_WAIT_OPEN_COMPLETE`.
pub const NV_ESC_WAIT_OPEN_COMPLETE: u8 = 0xda;

// UVM command numbers (`uvm_ioctl.h`, `uvm_linux_ioctl.h`): whole `cmd` values, no size bits.
/// `UVM_INITIALIZE`.
pub const UVM_INITIALIZE: u32 = 0x30000001;
/// `UVM_DEINITIALIZE`.
pub const UVM_DEINITIALIZE: u32 = 0x30000002;
/// `UVM_CREATE_RANGE_GROUP`.
pub const UVM_CREATE_RANGE_GROUP: u32 = 0x17;
/// `UVM_DESTROY_RANGE_GROUP`.
pub const UVM_DESTROY_RANGE_GROUP: u32 = 0x18;
/// `UVM_REGISTER_GPU_VASPACE`.
pub const UVM_REGISTER_GPU_VASPACE: u32 = 0x19;
/// `UVM_UNREGISTER_GPU_VASPACE`.
pub const UVM_UNREGISTER_GPU_VASPACE: u32 = 0x1a;
/// `UVM_REGISTER_CHANNEL`.
pub const UVM_REGISTER_CHANNEL: u32 = 0x1b;
/// `UVM_UNREGISTER_CHANNEL`.
pub const UVM_UNREGISTER_CHANNEL: u32 = 0x1c;
/// `UVM_ENABLE_PEER_ACCESS`.
pub const UVM_ENABLE_PEER_ACCESS: u32 = 0x1d;
/// `UVM_DISABLE_PEER_ACCESS`.
pub const UVM_DISABLE_PEER_ACCESS: u32 = 0x1e;
/// `UVM_SET_RANGE_GROUP`.
pub const UVM_SET_RANGE_GROUP: u32 = 0x1f;
/// `UVM_MAP_EXTERNAL_ALLOCATION`.
pub const UVM_MAP_EXTERNAL_ALLOCATION: u32 = 0x21;
/// `UVM_FREE`.
pub const UVM_FREE: u32 = 0x22;
/// `UVM_REGISTER_GPU`.
pub const UVM_REGISTER_GPU: u32 = 0x25;
/// `UVM_UNREGISTER_GPU`.
pub const UVM_UNREGISTER_GPU: u32 = 0x26;
/// `UVM_PAGEABLE_MEM_ACCESS`.
pub const UVM_PAGEABLE_MEM_ACCESS: u32 = 0x27;
/// `UVM_SET_PREFERRED_LOCATION`.
pub const UVM_SET_PREFERRED_LOCATION: u32 = 0x2a;
/// `UVM_UNSET_PREFERRED_LOCATION`.
pub const UVM_UNSET_PREFERRED_LOCATION: u32 = 0x2b;
/// `UVM_ENABLE_READ_DUPLICATION`.
pub const UVM_ENABLE_READ_DUPLICATION: u32 = 0x2c;
/// `UVM_DISABLE_READ_DUPLICATION`.
pub const UVM_DISABLE_READ_DUPLICATION: u32 = 0x2d;
/// `UVM_SET_ACCESSED_BY`.
pub const UVM_SET_ACCESSED_BY: u32 = 0x2e;
/// `UVM_UNSET_ACCESSED_BY`.
pub const UVM_UNSET_ACCESSED_BY: u32 = 0x2f;
/// `UVM_MIGRATE`.
pub const UVM_MIGRATE: u32 = 0x33;
/// `UVM_MIGRATE_RANGE_GROUP`.
pub const UVM_MIGRATE_RANGE_GROUP: u32 = 0x35;
/// `UVM_TOOLS_READ_PROCESS_MEMORY`.
pub const UVM_TOOLS_READ_PROCESS_MEMORY: u32 = 0x3e;
/// `UVM_TOOLS_WRITE_PROCESS_MEMORY`.
pub const UVM_TOOLS_WRITE_PROCESS_MEMORY: u32 = 0x3f;
/// `UVM_MAP_DYNAMIC_PARALLELISM_REGION`.
pub const UVM_MAP_DYNAMIC_PARALLELISM_REGION: u32 = 0x41;
/// `UVM_UNMAP_EXTERNAL`.
pub const UVM_UNMAP_EXTERNAL: u32 = 0x42;
/// `UVM_ALLOC_SEMAPHORE_POOL`.
pub const UVM_ALLOC_SEMAPHORE_POOL: u32 = 0x44;
/// `UVM_PAGEABLE_MEM_ACCESS_ON_GPU`.
pub const UVM_PAGEABLE_MEM_ACCESS_ON_GPU: u32 = 0x46;
/// `UVM_VALIDATE_VA_RANGE`.
pub const UVM_VALIDATE_VA_RANGE: u32 = 0x48;
/// `UVM_CREATE_EXTERNAL_RANGE`.
pub const UVM_CREATE_EXTERNAL_RANGE: u32 = 0x49;
/// `UVM_MM_INITIALIZE`.
pub const UVM_MM_INITIALIZE: u32 = 0x4b;

/// `UVM_INIT_FLAGS_*` (`uvm_types.h`).
/// `UVM_INIT_FLAGS_DISABLE_HMM`.
pub const UVM_INIT_FLAGS_DISABLE_HMM: u64 = 0x1;
/// `UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE`.
pub const UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE: u64 = 0x2;
/// `UVM_INIT_FLAGS_MASK`.
pub const UVM_INIT_FLAGS_MASK: u64 = 0x3;

/// `NV_ESC_RM_ALLOC` with an `NVOS21_PARAMETERS` payload: `_IOWR('F', 0x2b, 32)`.
pub const NV_ESC_RM_ALLOC_NVOS21: u32 = nv_iowr(NV_ESC_RM_ALLOC, size_of::<NVOS21_PARAMETERS>());
/// `NV_ESC_RM_ALLOC` with an `NVOS64_PARAMETERS` payload: `_IOWR('F', 0x2b, 48)`.
pub const NV_ESC_RM_ALLOC_NVOS64: u32 = nv_iowr(NV_ESC_RM_ALLOC, size_of::<NVOS64_PARAMETERS>());
/// `NV_ESC_RM_CONTROL`: `_IOWR('F', 0x2a, 32)`.
pub const NV_ESC_RM_CONTROL_CMD: u32 = nv_iowr(NV_ESC_RM_CONTROL, size_of::<NVOS54_PARAMETERS>());
/// `NV_ESC_CHECK_VERSION_STR`: `_IOWR('F', 0xd2, 72)`, libcuda's first ioctl.
pub const NV_ESC_CHECK_VERSION_STR_CMD: u32 = nv_iowr(
    NV_ESC_CHECK_VERSION_STR,
    size_of::<nv_ioctl_rm_api_version_t>(),
);
/// `NV_ESC_REGISTER_FD`: `_IOWR('F', 0xc9, 4)`.
pub const NV_ESC_REGISTER_FD_CMD: u32 =
    nv_iowr(NV_ESC_REGISTER_FD, size_of::<nv_ioctl_register_fd_t>());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_rm_alloc_nvos64_cmd_matches_c() {
        assert_eq!(NV_ESC_RM_ALLOC_NVOS64, 0xc030_462b);
    }

    #[test]
    fn test_rm_alloc_nvos21_cmd_matches_c() {
        assert_eq!(NV_ESC_RM_ALLOC_NVOS21, 0xc020_462b);
    }

    #[test]
    fn test_rm_control_cmd_matches_c() {
        assert_eq!(NV_ESC_RM_CONTROL_CMD, 0xc020_462a);
    }

    #[test]
    fn test_check_version_str_cmd_matches_strace() {
        assert_eq!(NV_ESC_CHECK_VERSION_STR_CMD, 0xc048_46d2);
    }

    #[test]
    fn test_register_fd_cmd_matches_c() {
        assert_eq!(NV_ESC_REGISTER_FD_CMD, 0xc004_46c9);
    }

    #[test]
    fn test_card_info_array_cmd_matches_trace() {
        assert_eq!(nv_iowr(NV_ESC_CARD_INFO, 32 * 72), 0xc900_46c8);
    }

    #[test]
    fn test_ioc_field_accessors_invert_ioc() {
        let cmd = nv_iowr(NV_ESC_ATTACH_GPUS_TO_FD, 128);
        assert_eq!(
            (ioc_dir(cmd), ioc_type(cmd), ioc_nr(cmd), ioc_size(cmd)),
            (IOC_READ | IOC_WRITE, b'F', 0xd4, 128)
        );
    }
}
