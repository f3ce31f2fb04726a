//! NV status codes (`nvstatuscodes.h` of 535.261.03) and errno names, for messages and for
//! parsing expectations given on the command line.

pub use nvproxy_abi::status::*;

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
