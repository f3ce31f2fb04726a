//! fd identity: turning an fd number in a caller's fd table into one of our open files.
//!
//! NVIDIA's params carry fd numbers (`REGISTER_FD.ctl_fd`, `ALLOC_OS_EVENT.fd`, ...) that mean
//! something only in the calling process. We never trust the number: we take a duplicate of the
//! caller's file kernel-side and ask it who it is (`reference/cuse-experiments.md` section 1):
//!
//! 1. `pidfd_open(tid, PIDFD_THREAD)` on the calling *thread* (the FUSE header's pid is a thread
//!    id; thread-group lookups pick the wrong fd table for threads that unshared theirs);
//! 2. `pidfd_getfd` for a duplicate of the caller's file;
//! 3. `fstat`: it must be a character device whose `st_rdev` is one of this instance's nodes,
//!    else nothing is sent to it (a foreign server could stall us) and the answer is `EBADF`;
//! 4. the private identify ioctl on the duplicate, with the instance secret: our own device
//!    answers it with that open file's `fh` — but only for our own threads with the secret;
//! 5. the duplicate is closed (which can make the kernel send a synchronous RELEASE: the reader
//!    thread keeps serving, see `cuse-dev`'s threading notes).
//!
//! Must run on a worker thread, never on the thread reading `/dev/cuse`.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::sync::RwLock;

use nvproxy_preload_proto::NVPROXY_IOC_IDENTIFY;

use crate::sys;

/// What an fd number resolved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    /// Index of the device (as registered with [`FdIdentity::add_device`]).
    pub device: usize,
    /// The open file's handle on that device.
    pub fh: u64,
}

/// The instance's secret and its devices' numbers.
pub struct FdIdentity {
    secret: u64,
    devices: RwLock<BTreeMap<u64, usize>>,
}

impl FdIdentity {
    /// A new identity with a random secret.
    pub fn new() -> io::Result<Self> {
        let mut b = [0u8; 8];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
        Ok(FdIdentity {
            secret: u64::from_ne_bytes(b),
            devices: RwLock::new(BTreeMap::new()),
        })
    }

    /// Whether an identify request is genuine: from one of our threads, with the secret.
    pub fn is_genuine(&self, tid: u32, arg: u64) -> bool {
        arg == self.secret && sys::is_own_thread(tid)
    }

    /// Records that device number `rdev` is our device `index` (after its self-check).
    pub fn add_device(&self, rdev: u64, index: usize) {
        self.devices
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(rdev, index);
    }

    /// Asks an open file of ours for its handle.
    /// The device numbers known ([`FdIdentity::add_device`]), for a live upgrade.
    pub fn devices(&self) -> Vec<(u64, usize)> {
        self.devices
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(&r, &i)| (r, i))
            .collect()
    }

    pub fn identify(&self, file: &impl AsFd) -> io::Result<u64> {
        let fh = sys::ioctl_by_value(file.as_fd(), NVPROXY_IOC_IDENTIFY, self.secret)?;
        // The device answers an open's `fh`, which it hands out below 2^31.
        u64::try_from(fh).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }

    /// Resolves fd number `fd` of thread `tid`. Errors are the errno the client should see:
    /// `EBADF` for a closed fd or a file that is not one of this instance's nodes, `ESRCH` when
    /// the caller cannot be named (pid 0: it lives outside our pid namespace), `EPERM` when we
    /// lack ptrace rights over it.
    pub fn resolve(&self, tid: u32, fd: i32) -> io::Result<Resolved> {
        if tid == 0 {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        if fd < 0 {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        let step = |what: &'static str| {
            move |e: io::Error| {
                tracing::debug!(tid, fd, error = %e, "fd identity: {what} failed");
                e
            }
        };
        let pidfd = sys::pidfd_open_thread(tid).map_err(step("pidfd_open"))?;
        let dup = sys::pidfd_getfd(pidfd.as_fd(), fd).map_err(step("pidfd_getfd"))?;
        drop(pidfd);
        let file = std::fs::File::from(dup);
        let meta = file.metadata()?;
        let is_chr = meta.mode() & libc::S_IFMT == libc::S_IFCHR;
        let device = self
            .devices
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&meta.rdev())
            .copied();
        let Some(device) = device.filter(|_| is_chr) else {
            tracing::debug!(
                fd,
                rdev = meta.rdev(),
                "fd is not one of this instance's nodes"
            );
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        };
        let fh = self.identify(&file).map_err(step("identify"))?;
        drop(file);
        Ok(Resolved { device, fh })
    }
}
