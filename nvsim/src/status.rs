//! The NV status codes the simulated driver returns (`nvstatuscodes.h`), and the errnos its
//! ioctls fail with.

pub use nvproxy_abi::status::*;

/// The name of a status code (for messages and `Debug` output).
pub fn status_name(status: u32) -> &'static str {
    nvproxy_abi::status::status_name(status).unwrap_or("unknown status")
}

/// `EINVAL`.
pub const EINVAL: i32 = 22;
/// `EFAULT`.
pub const EFAULT: i32 = 14;
/// `ENOTTY`.
pub const ENOTTY: i32 = 25;
/// `ENODEV`.
pub const ENODEV: i32 = 19;
/// `EBUSY`.
pub const EBUSY: i32 = 16;
/// `EBADF`.
pub const EBADF: i32 = 9;
/// `EACCES`.
pub const EACCES: i32 = 13;
