//! NV status codes (`nvstatuscodes.h` of 535.261.03) and errno names, for messages and for
//! parsing expectations given on the command line.

/// `NV_OK`.
pub const NV_OK: u32 = 0;
/// `NV_ERR_INVALID_ADDRESS`.
pub const NV_ERR_INVALID_ADDRESS: u32 = 0x1e;
/// `NV_ERR_INVALID_ARGUMENT`.
pub const NV_ERR_INVALID_ARGUMENT: u32 = 0x1f;
/// `NV_ERR_INVALID_CLASS`.
pub const NV_ERR_INVALID_CLASS: u32 = 0x22;
/// `NV_ERR_INVALID_CLIENT`.
pub const NV_ERR_INVALID_CLIENT: u32 = 0x23;
/// `NV_ERR_NOT_SUPPORTED`.
pub const NV_ERR_NOT_SUPPORTED: u32 = 0x56;

/// Every status code of the driver header with its name.
const STATUS_NAMES: &[(u32, &str)] = &[
    (0x0, "NV_OK"),
    (0xFFFF, "NV_ERR_GENERIC"),
    (0x0001, "NV_ERR_BROKEN_FB"),
    (0x0002, "NV_ERR_BUFFER_TOO_SMALL"),
    (0x0003, "NV_ERR_BUSY_RETRY"),
    (0x0004, "NV_ERR_CALLBACK_NOT_SCHEDULED"),
    (0x0005, "NV_ERR_CARD_NOT_PRESENT"),
    (0x0006, "NV_ERR_CYCLE_DETECTED"),
    (0x0007, "NV_ERR_DMA_IN_USE"),
    (0x0008, "NV_ERR_DMA_MEM_NOT_LOCKED"),
    (0x0009, "NV_ERR_DMA_MEM_NOT_UNLOCKED"),
    (0x000A, "NV_ERR_DUAL_LINK_INUSE"),
    (0x000B, "NV_ERR_ECC_ERROR"),
    (0x000C, "NV_ERR_FIFO_BAD_ACCESS"),
    (0x000D, "NV_ERR_FREQ_NOT_SUPPORTED"),
    (0x000E, "NV_ERR_GPU_DMA_NOT_INITIALIZED"),
    (0x000F, "NV_ERR_GPU_IS_LOST"),
    (0x0010, "NV_ERR_GPU_IN_FULLCHIP_RESET"),
    (0x0011, "NV_ERR_GPU_NOT_FULL_POWER"),
    (0x0012, "NV_ERR_GPU_UUID_NOT_FOUND"),
    (0x0013, "NV_ERR_HOT_SWITCH"),
    (0x0014, "NV_ERR_I2C_ERROR"),
    (0x0015, "NV_ERR_I2C_SPEED_TOO_HIGH"),
    (0x0016, "NV_ERR_ILLEGAL_ACTION"),
    (0x0017, "NV_ERR_IN_USE"),
    (0x0018, "NV_ERR_INFLATE_COMPRESSED_DATA_FAILED"),
    (0x0019, "NV_ERR_INSERT_DUPLICATE_NAME"),
    (0x001A, "NV_ERR_INSUFFICIENT_RESOURCES"),
    (0x001B, "NV_ERR_INSUFFICIENT_PERMISSIONS"),
    (0x001C, "NV_ERR_INSUFFICIENT_POWER"),
    (0x001D, "NV_ERR_INVALID_ACCESS_TYPE"),
    (0x001E, "NV_ERR_INVALID_ADDRESS"),
    (0x001F, "NV_ERR_INVALID_ARGUMENT"),
    (0x0020, "NV_ERR_INVALID_BASE"),
    (0x0021, "NV_ERR_INVALID_CHANNEL"),
    (0x0022, "NV_ERR_INVALID_CLASS"),
    (0x0023, "NV_ERR_INVALID_CLIENT"),
    (0x0024, "NV_ERR_INVALID_COMMAND"),
    (0x0025, "NV_ERR_INVALID_DATA"),
    (0x0026, "NV_ERR_INVALID_DEVICE"),
    (0x0027, "NV_ERR_INVALID_DMA_SPECIFIER"),
    (0x0028, "NV_ERR_INVALID_EVENT"),
    (0x0029, "NV_ERR_INVALID_FLAGS"),
    (0x002A, "NV_ERR_INVALID_FUNCTION"),
    (0x002B, "NV_ERR_INVALID_HEAP"),
    (0x002C, "NV_ERR_INVALID_INDEX"),
    (0x002D, "NV_ERR_INVALID_IRQ_LEVEL"),
    (0x002E, "NV_ERR_INVALID_LIMIT"),
    (0x002F, "NV_ERR_INVALID_LOCK_STATE"),
    (0x0030, "NV_ERR_INVALID_METHOD"),
    (0x0031, "NV_ERR_INVALID_OBJECT"),
    (0x0032, "NV_ERR_INVALID_OBJECT_BUFFER"),
    (0x0033, "NV_ERR_INVALID_OBJECT_HANDLE"),
    (0x0034, "NV_ERR_INVALID_OBJECT_NEW"),
    (0x0035, "NV_ERR_INVALID_OBJECT_OLD"),
    (0x0036, "NV_ERR_INVALID_OBJECT_PARENT"),
    (0x0037, "NV_ERR_INVALID_OFFSET"),
    (0x0038, "NV_ERR_INVALID_OPERATION"),
    (0x0039, "NV_ERR_INVALID_OWNER"),
    (0x003A, "NV_ERR_INVALID_PARAM_STRUCT"),
    (0x003B, "NV_ERR_INVALID_PARAMETER"),
    (0x003C, "NV_ERR_INVALID_PATH"),
    (0x003D, "NV_ERR_INVALID_POINTER"),
    (0x003E, "NV_ERR_INVALID_REGISTRY_KEY"),
    (0x003F, "NV_ERR_INVALID_REQUEST"),
    (0x0040, "NV_ERR_INVALID_STATE"),
    (0x0041, "NV_ERR_INVALID_STRING_LENGTH"),
    (0x0042, "NV_ERR_INVALID_READ"),
    (0x0043, "NV_ERR_INVALID_WRITE"),
    (0x0044, "NV_ERR_INVALID_XLATE"),
    (0x0045, "NV_ERR_IRQ_NOT_FIRING"),
    (0x0046, "NV_ERR_IRQ_EDGE_TRIGGERED"),
    (0x0047, "NV_ERR_MEMORY_TRAINING_FAILED"),
    (0x0048, "NV_ERR_MISMATCHED_SLAVE"),
    (0x0049, "NV_ERR_MISMATCHED_TARGET"),
    (0x004A, "NV_ERR_MISSING_TABLE_ENTRY"),
    (0x004B, "NV_ERR_MODULE_LOAD_FAILED"),
    (0x004C, "NV_ERR_MORE_DATA_AVAILABLE"),
    (0x004D, "NV_ERR_MORE_PROCESSING_REQUIRED"),
    (0x004E, "NV_ERR_MULTIPLE_MEMORY_TYPES"),
    (0x004F, "NV_ERR_NO_FREE_FIFOS"),
    (0x0050, "NV_ERR_NO_INTR_PENDING"),
    (0x0051, "NV_ERR_NO_MEMORY"),
    (0x0052, "NV_ERR_NO_SUCH_DOMAIN"),
    (0x0053, "NV_ERR_NO_VALID_PATH"),
    (0x0054, "NV_ERR_NOT_COMPATIBLE"),
    (0x0055, "NV_ERR_NOT_READY"),
    (0x0056, "NV_ERR_NOT_SUPPORTED"),
    (0x0057, "NV_ERR_OBJECT_NOT_FOUND"),
    (0x0058, "NV_ERR_OBJECT_TYPE_MISMATCH"),
    (0x0059, "NV_ERR_OPERATING_SYSTEM"),
    (0x005A, "NV_ERR_OTHER_DEVICE_FOUND"),
    (0x005B, "NV_ERR_OUT_OF_RANGE"),
    (0x005C, "NV_ERR_OVERLAPPING_UVM_COMMIT"),
    (0x005D, "NV_ERR_PAGE_TABLE_NOT_AVAIL"),
    (0x005E, "NV_ERR_PID_NOT_FOUND"),
    (0x005F, "NV_ERR_PROTECTION_FAULT"),
    (0x0060, "NV_ERR_RC_ERROR"),
    (0x0061, "NV_ERR_REJECTED_VBIOS"),
    (0x0062, "NV_ERR_RESET_REQUIRED"),
    (0x0063, "NV_ERR_STATE_IN_USE"),
    (0x0064, "NV_ERR_SIGNAL_PENDING"),
    (0x0065, "NV_ERR_TIMEOUT"),
    (0x0066, "NV_ERR_TIMEOUT_RETRY"),
    (0x0067, "NV_ERR_TOO_MANY_PRIMARIES"),
    (0x0068, "NV_ERR_UVM_ADDRESS_IN_USE"),
    (0x0069, "NV_ERR_MAX_SESSION_LIMIT_REACHED"),
    (0x006A, "NV_ERR_LIB_RM_VERSION_MISMATCH"),
    (0x006B, "NV_ERR_PRIV_SEC_VIOLATION"),
    (0x006C, "NV_ERR_GPU_IN_DEBUG_MODE"),
    (0x006D, "NV_ERR_FEATURE_NOT_ENABLED"),
    (0x006E, "NV_ERR_RESOURCE_LOST"),
    (0x006F, "NV_ERR_PMU_NOT_READY"),
    (0x0070, "NV_ERR_FLCN_ERROR"),
    (0x0071, "NV_ERR_FATAL_ERROR"),
    (0x0072, "NV_ERR_MEMORY_ERROR"),
    (0x0073, "NV_ERR_INVALID_LICENSE"),
    (0x0074, "NV_ERR_NVLINK_INIT_ERROR"),
    (0x0075, "NV_ERR_NVLINK_MINION_ERROR"),
    (0x0076, "NV_ERR_NVLINK_CLOCK_ERROR"),
    (0x0077, "NV_ERR_NVLINK_TRAINING_ERROR"),
    (0x0078, "NV_ERR_NVLINK_CONFIGURATION_ERROR"),
    (0x0079, "NV_ERR_RISCV_ERROR"),
    (0x007A, "NV_ERR_FABRIC_MANAGER_NOT_PRESENT"),
    (0x007B, "NV_ERR_ALREADY_SIGNALLED"),
    (0x00010001, "NV_WARN_HOT_SWITCH"),
    (0x00010002, "NV_WARN_INCORRECT_PERFMON_DATA"),
    (0x00010003, "NV_WARN_MISMATCHED_SLAVE"),
    (0x00010004, "NV_WARN_MISMATCHED_TARGET"),
    (0x00010005, "NV_WARN_MORE_PROCESSING_REQUIRED"),
    (0x00010006, "NV_WARN_NOTHING_TO_DO"),
    (0x00010007, "NV_WARN_NULL_OBJECT"),
    (0x00010008, "NV_WARN_OUT_OF_RANGE"),
];

/// The `NV_*` name of a status code, if it is one.
pub fn status_name(status: u32) -> Option<&'static str> {
    STATUS_NAMES
        .iter()
        .find(|(code, _)| *code == status)
        .map(|(_, name)| *name)
}

/// The status code named `name` (`NV_ERR_INVALID_CLIENT`), or a number (`0x23`, `35`).
pub fn parse_status(name: &str) -> Option<u32> {
    STATUS_NAMES
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(code, _)| *code)
        .or_else(|| parse_number(name))
}

/// `NV_ERR_INVALID_CLIENT (0x23)`.
pub fn describe_status(status: u32) -> String {
    match status_name(status) {
        Some(name) => format!("{name} ({status:#x})"),
        None => format!("unknown status {status:#x}"),
    }
}

const ERRNO_NAMES: &[(i32, &str)] = &[
    (libc::EPERM, "EPERM"),
    (libc::ENOENT, "ENOENT"),
    (libc::EINTR, "EINTR"),
    (libc::EIO, "EIO"),
    (libc::ENXIO, "ENXIO"),
    (libc::EBADF, "EBADF"),
    (libc::EAGAIN, "EAGAIN"),
    (libc::ENOMEM, "ENOMEM"),
    (libc::EACCES, "EACCES"),
    (libc::EFAULT, "EFAULT"),
    (libc::EBUSY, "EBUSY"),
    (libc::ENODEV, "ENODEV"),
    (libc::EINVAL, "EINVAL"),
    (libc::ENOTTY, "ENOTTY"),
    (libc::E2BIG, "E2BIG"),
    (libc::ENOSYS, "ENOSYS"),
    (libc::EPROTO, "EPROTO"),
    (libc::EOPNOTSUPP, "EOPNOTSUPP"),
    (libc::ENOTCONN, "ENOTCONN"),
    (libc::ECONNABORTED, "ECONNABORTED"),
];

/// The `E*` name of an errno.
pub fn errno_name(errno: i32) -> Option<&'static str> {
    ERRNO_NAMES
        .iter()
        .find(|(code, _)| *code == errno)
        .map(|(_, name)| *name)
}

/// The errno named `name` (`EINVAL`), or a number.
pub fn parse_errno(name: &str) -> Option<i32> {
    ERRNO_NAMES
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(code, _)| *code)
        .or_else(|| parse_number(name).and_then(|n| i32::try_from(n).ok()))
}

/// `EINVAL (22)`.
pub fn describe_errno(errno: i32) -> String {
    match errno_name(errno) {
        Some(name) => format!("{name} ({errno})"),
        None => format!("errno {errno}"),
    }
}

fn parse_number(s: &str) -> Option<u32> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_status_by_name_returns_code() {
        assert_eq!(
            parse_status("NV_ERR_INVALID_CLIENT"),
            Some(NV_ERR_INVALID_CLIENT)
        );
    }

    #[test]
    fn test_parse_status_by_hex_returns_code() {
        assert_eq!(parse_status("0x1e"), Some(NV_ERR_INVALID_ADDRESS));
    }

    #[test]
    fn test_describe_status_names_generic() {
        assert_eq!(describe_status(0xffff), "NV_ERR_GENERIC (0xffff)");
    }

    #[test]
    fn test_parse_errno_by_name_returns_code() {
        assert_eq!(parse_errno("EBADF"), Some(libc::EBADF));
    }
}
