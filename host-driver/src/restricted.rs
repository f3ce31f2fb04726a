//! Files that can be mapped but not ioctl'd: opened by a thread that restricted itself with
//! Landlock.
//!
//! The mmap path hands a host fd to the tenant (DESIGN.md section 5). For RM memory that fd is
//! a host `/dev/nvidiactl` or `/dev/nvidia<N>` file whose only job is to carry an mmap context;
//! the tenant must be able to `mmap` it but never issue a driver ioctl on it, or it would have
//! a raw, unproxied channel to the driver. Landlock's `LANDLOCK_ACCESS_FS_IOCTL_DEV` (ABI 5,
//! Linux 6.10) gives exactly that: the right to issue device ioctls is decided when the file
//! is *opened*, from the opener's Landlock domain, and stays with the open file. A file opened
//! by a thread whose ruleset handles `IOCTL_DEV` without granting it fails every device ioctl
//! with `EACCES`, in whichever process later holds it; `mmap` is not mediated, and the VFS's
//! own `FIOCLEX`/`FIONBIO` still work (measured on 6.12 and 6.18, `shared/vm/README.md`).
//!
//! Landlock domains are per thread, so one long-lived thread ([`open_restricted`]'s *opener*)
//! restricts itself once and serves every open of the process over a channel; the rest of the
//! daemon keeps its full rights. The opener's ruleset handles only `IOCTL_DEV`, so it can still
//! open (read, write) anything the daemon can; it also sets `no_new_privs` on itself, which only
//! matters for an `execve` from that thread, and it never execs.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::mpsc;

use landlock::{AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetStatus};

type Reply = mpsc::SyncSender<io::Result<OwnedFd>>;

struct Opener {
    requests: mpsc::Sender<(PathBuf, Reply)>,
}

/// The opener thread, or why it could not restrict itself (kept: the kernel will not change).
static OPENER: OnceLock<Result<Opener, String>> = OnceLock::new();

/// Restricts the calling thread: device ioctls handled, not granted. Fails unless the ruleset is
/// fully enforced (a kernel without Landlock ABI 5 cannot express `IOCTL_DEV`).
fn restrict_this_thread() -> Result<(), String> {
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::IoctlDev)
        .and_then(|r| r.create())
        .and_then(|r| r.restrict_self())
        .map_err(|e| e.to_string())?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(format!(
            "Landlock ruleset not enforced ({:?})",
            status.ruleset
        ));
    }
    Ok(())
}

fn open_rw(path: &Path) -> io::Result<OwnedFd> {
    // std opens with O_CLOEXEC; the NVIDIA driver needs read-write.
    Ok(OwnedFd::from(
        OpenOptions::new().read(true).write(true).open(path)?,
    ))
}

fn start_opener() -> Result<Opener, String> {
    let (requests, rx) = mpsc::channel::<(PathBuf, Reply)>();
    let (ready_tx, ready_rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("nvproxy-mmap-opener".into())
        .spawn(move || {
            let restricted = restrict_this_thread();
            let ok = restricted.is_ok();
            let _ = ready_tx.send(restricted);
            if !ok {
                return;
            }
            for (path, reply) in rx {
                let _ = reply.send(open_rw(&path));
            }
        })
        .map_err(|e| format!("cannot start the restricted opener thread: {e}"))?;
    ready_rx
        .recv()
        .map_err(|_| "the restricted opener thread died".to_owned())??;
    Ok(Opener { requests })
}

fn unsupported(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "cannot open files whose device ioctls are denied: Landlock \
             LANDLOCK_ACCESS_FS_IOCTL_DEV (ABI 5, Linux 6.10) is unavailable: {why}"
        ),
    )
}

fn opener() -> io::Result<&'static Opener> {
    match OPENER.get_or_init(start_opener) {
        Ok(o) => Ok(o),
        Err(why) => Err(unsupported(why)),
    }
}

/// Opens `path` read-write (`O_CLOEXEC`) from this process's Landlock-restricted opener thread:
/// the returned file can be `mmap`ped, read and written, but every device ioctl on it fails
/// with `EACCES`, in any process that comes to hold it (`FIOCLEX`/`FIONBIO` excepted).
///
/// Fails with [`io::ErrorKind::Unsupported`] (and a message saying why) when the kernel cannot
/// restrict device ioctls (Landlock missing, disabled, or below ABI 5); that answer is cached.
/// Other errors are the `open`'s.
pub fn open_restricted(path: &Path) -> io::Result<OwnedFd> {
    let opener = opener()?;
    let (tx, rx) = mpsc::sync_channel(1);
    opener
        .requests
        .send((path.to_path_buf(), tx))
        .map_err(|_| io::Error::other("the restricted opener thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("the restricted opener thread is gone"))?
}

/// Whether [`open_restricted`] works on this kernel (starts the opener thread on first use).
pub fn ioctl_dev_restriction_available() -> bool {
    opener().is_ok()
}
