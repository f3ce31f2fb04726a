//! [`Errno`]: a positive error number as sent (negated) in `fuse_out_header.error`.

use std::fmt;
use std::io;
use std::num::NonZeroI32;

/// A Linux error number (positive, below 512), sent to the kernel as `-errno`.
///
/// The kernel rejects replies whose error is not in `-511..=0` (`fs/fuse/dev.c`,
/// `fuse_dev_do_write`), so the constructors keep the value in `1..512` and fall back to `EIO`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(NonZeroI32);

macro_rules! errnos {
    ($($name:ident),* $(,)?) => {
        impl Errno {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                pub const $name: Errno = Errno::from_const(libc::$name);
            )*
        }
    };
}

errnos!(
    EPERM,
    ENOENT,
    ESRCH,
    EINTR,
    EIO,
    ENXIO,
    E2BIG,
    EBADF,
    EAGAIN,
    ENOMEM,
    EACCES,
    EFAULT,
    EBUSY,
    EEXIST,
    EXDEV,
    ENODEV,
    EINVAL,
    ENOSPC,
    ENOTTY,
    EPIPE,
    ERANGE,
    ENOSYS,
    EPROTO,
    EOVERFLOW,
    EOPNOTSUPP,
    ECONNABORTED,
    ENOTCONN,
    ETIMEDOUT,
);

impl Errno {
    /// Largest errno the kernel accepts in a reply, plus one.
    const LIMIT: i32 = 512;

    const fn from_const(n: i32) -> Self {
        match NonZeroI32::new(n) {
            Some(v) if n > 0 && n < Self::LIMIT => Errno(v),
            _ => panic!("errno constant out of range"),
        }
    }

    /// `Some` if `n` is a valid errno (`1..512`).
    pub fn new(n: i32) -> Option<Self> {
        if n > 0 && n < Self::LIMIT {
            NonZeroI32::new(n).map(Errno)
        } else {
            None
        }
    }

    /// Like [`Errno::new`], but anything out of range becomes `EIO`.
    pub fn from_i32(n: i32) -> Self {
        Self::new(n).unwrap_or(Self::EIO)
    }

    /// The errno of an I/O error; `EIO` if it has none.
    pub fn from_io(err: &io::Error) -> Self {
        err.raw_os_error().map_or(Self::EIO, Self::from_i32)
    }

    /// The positive number.
    pub fn raw(self) -> i32 {
        self.0.get()
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Errno({} {})",
            self.0,
            io::Error::from_raw_os_error(self.0.get())
        )
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&io::Error::from_raw_os_error(self.0.get()), f)
    }
}

impl From<Errno> for io::Error {
    fn from(e: Errno) -> Self {
        io::Error::from_raw_os_error(e.raw())
    }
}

impl From<&io::Error> for Errno {
    fn from(e: &io::Error) -> Self {
        Self::from_io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_is_enforced() {
        assert_eq!(Errno::new(0), None);
        assert_eq!(Errno::new(-5), None);
        assert_eq!(Errno::new(512), None);
        assert_eq!(Errno::from_i32(4095), Errno::EIO);
        assert_eq!(Errno::from_i32(libc::ENOTTY), Errno::ENOTTY);
        assert_eq!(Errno::from_io(&io::Error::other("x")), Errno::EIO);
        assert_eq!(
            Errno::from_io(&io::Error::from_raw_os_error(libc::EBADF)).raw(),
            libc::EBADF
        );
    }
}
