//! The mechanism behind RM memory mapping fds on a real kernel: a file opened by
//! `host_driver::restricted::open_restricted` (a thread restricted with Landlock,
//! `LANDLOCK_ACCESS_FS_IOCTL_DEV` handled, not granted) can be `mmap`ped, but device ioctls on
//! it fail with `EACCES`, in this process and in another one that inherits it; the VFS's own
//! `FIOCLEX`/`FIONBIO` still work; the rest of the process keeps its ioctls.
//!
//! `/dev/zero` stands for the NVIDIA node: it is a character device with an `mmap` handler and
//! no ioctls of its own (so an allowed `FIONREAD` reaches it and answers `ENOTTY`).
//!
//! Needs Landlock ABI >= 5 (Linux 6.10): run by `tests/run-kernel-tests.sh` (natively as root
//! where `/dev/cuse` exists, else in the VM, whose 6.12 kernel has ABI 6).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::process::Command;

use host_driver::restricted::{ioctl_dev_restriction_available, open_restricted};
use nix::fcntl::{FcntlArg, FdFlag, fcntl};

const ZERO: &str = "/dev/zero";
/// Set in the child process: the number of the inherited restricted fd.
const CHILD_FD_ENV: &str = "NVPROXY_LANDLOCK_TEST_FD";

/// `ioctl(fd, req, &mut int)`: Ok or the errno.
fn ioctl_int(fd: BorrowedFd<'_>, req: libc::Ioctl) -> Result<(), i32> {
    let mut arg: libc::c_int = 0;
    // SAFETY: `fd` is borrowed, so it stays open for the call; every request used here
    // (FIONREAD, FIOCLEX, FIONBIO) reads or writes at most one int at `arg`, a live local.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req, &mut arg) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(())
    }
}

fn restricted_zero() -> OwnedFd {
    open_restricted(Path::new(ZERO)).expect("open_restricted needs Landlock ABI >= 5")
}

#[test]
#[ignore = "needs Landlock ABI >= 5; run by tests/run-kernel-tests.sh"]
fn test_restriction_is_available() {
    assert!(ioctl_dev_restriction_available());
}

#[test]
#[ignore = "needs Landlock ABI >= 5; run by tests/run-kernel-tests.sh"]
fn test_restricted_fd_can_be_mapped_but_not_ioctld() {
    let fd = restricted_zero();
    assert_eq!(ioctl_int(fd.as_fd(), libc::FIONREAD), Err(libc::EACCES));
    assert_eq!(ioctl_int(fd.as_fd(), libc::FIOCLEX), Ok(()), "VFS-handled");
    assert_eq!(ioctl_int(fd.as_fd(), libc::FIONBIO), Ok(()), "VFS-handled");
    // SAFETY: a fresh shared mapping at a kernel-chosen address of a live fd; unmapped below
    // before anything else could refer to it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    let bytes = p.cast::<u8>();
    // SAFETY: offset 10 lies inside the 4096-byte writable mapping made above.
    let seen = unsafe {
        bytes.add(10).write_volatile(0x5a);
        bytes.add(10).read_volatile()
    };
    assert_eq!(seen, 0x5a);
    // SAFETY: exactly the mapping made above, unmapped once.
    assert_eq!(unsafe { libc::munmap(p, 4096) }, 0);
}

#[test]
#[ignore = "needs Landlock ABI >= 5; run by tests/run-kernel-tests.sh"]
fn test_other_threads_keep_their_device_ioctls() {
    let _ = restricted_zero(); // the opener thread exists and is restricted
    let plain = OwnedFd::from(std::fs::File::open(ZERO).unwrap());
    assert_eq!(
        ioctl_int(plain.as_fd(), libc::FIONREAD),
        Err(libc::ENOTTY),
        "reaches the device, which has no ioctls"
    );
}

#[test]
#[ignore = "needs Landlock ABI >= 5; run by tests/run-kernel-tests.sh"]
fn test_restriction_follows_the_file_into_another_process() {
    let fd = restricted_zero();
    // Inherited across exec: no close-on-exec on this fd for the spawn.
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty())).unwrap();
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_probe_inherited_fd",
            "--ignored",
            "--test-threads=1",
        ])
        .env(CHILD_FD_ENV, fd.as_raw_fd().to_string())
        .status()
        .unwrap();
    assert!(status.success(), "child: {status}");
}

/// Runs in the child of `test_restriction_follows_the_file_into_another_process` (a fresh
/// process that never touched Landlock); a no-op anywhere else.
#[test]
#[ignore = "needs Landlock ABI >= 5; run by tests/run-kernel-tests.sh"]
fn child_probe_inherited_fd() {
    let Ok(n) = std::env::var(CHILD_FD_ENV) else {
        return;
    };
    let n: i32 = n.parse().unwrap();
    // SAFETY: the parent passed this fd number open (it cleared close-on-exec before the
    // spawn), and it stays open for this process's life.
    let fd = unsafe { BorrowedFd::borrow_raw(n) };
    assert_eq!(ioctl_int(fd, libc::FIONREAD), Err(libc::EACCES));
}
