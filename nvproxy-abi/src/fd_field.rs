//! File-descriptor fields of the driver's structs, read and written as the driver does: a
//! 32-bit field holds an `NvS32`/`int`; a 64-bit one (`NvU64`, `NvP64`) is read as `(NvS32)` of
//! it, its low 32 bits, signed (`escape.c` `RmGetDeviceFd`: `*pFd =
//! (NvS32)...->devDescriptor`). The proxy translates the fd the driver would see, so a tenant's
//! high bits change nothing, and writes the host fd back in the field's own width.

/// The fd a 64-bit field names: its low 32 bits as `NvS32`.
pub fn from_u64(field: u64) -> i32 {
    let b = field.to_le_bytes();
    i32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The fd a 32-bit field holds.
pub fn from_u32(field: u32) -> i32 {
    i32::from_ne_bytes(field.to_ne_bytes())
}

/// `fd` as a 32-bit field's bits.
pub fn to_u32(fd: i32) -> u32 {
    u32::from_ne_bytes(fd.to_ne_bytes())
}

/// `fd` as a 64-bit field (sign-extended, as an `NvS32` assigned to an `NvU64`).
pub fn to_u64(fd: i32) -> u64 {
    u64::from_ne_bytes(i64::from(fd).to_ne_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_fields_read_and_write_as_the_driver_does() {
        assert_eq!(from_u64(7), 7);
        assert_eq!(from_u64(0x1_0000_0007), 7, "high bits are not the fd's");
        assert_eq!(from_u64(0xffff_ffff), -1);
        assert_eq!(from_u32(0xffff_fffe), -2);
        assert_eq!(to_u32(-1), 0xffff_ffff);
        assert_eq!(to_u64(-1), u64::MAX);
        assert_eq!(to_u64(42), 42);
        for fd in [0, 3, 1 << 20, i32::MAX, -1] {
            assert_eq!(from_u32(to_u32(fd)), fd);
            assert_eq!(from_u64(to_u64(fd)), fd);
        }
    }
}
