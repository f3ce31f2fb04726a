//! The daemon's only `unsafe` code: thin wrappers over syscalls that `libc` exposes only raw.

use std::io;

/// `LANDLOCK_CREATE_RULESET_VERSION` (linux/landlock.h): ask for the ABI version.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;

/// The kernel's Landlock ABI version, or the errno saying why there is none
/// (`ENOSYS`: not built in; `EOPNOTSUPP`: built in but disabled at boot).
pub fn landlock_abi_version() -> io::Result<u32> {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) reads no memory
    // (attr is NULL, size 0) and returns the ABI version as a non-negative int, or -1 and errno.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(ret).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Whether `pidfd_open(tid, PIDFD_THREAD)` works on this kernel (Linux 6.9+), tried on our own
/// thread. fd identity resolution needs it (DESIGN.md section 3, step 5).
pub fn pidfd_thread_supported() -> io::Result<()> {
    const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new fd or -1; no memory is
    // passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, PIDFD_THREAD) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: `fd` was just returned to us by pidfd_open and is owned by nobody else.
    unsafe { libc::close(fd) };
    Ok(())
}
