//! The shim's decision for one `mmap()` call, over a small [`Os`] trait so that the syscalls it
//! costs can be counted in tests.

use crate::cache::{FileKey, NodeCache};
use crate::config::{Config, SUN_PATH_LEN};
use crate::proto::MmapTicketArgs;

/// One `mmap()` call as the caller made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// `addr`.
    pub addr: usize,
    /// `length`.
    pub len: usize,
    /// `prot`.
    pub prot: i32,
    /// `flags`.
    pub flags: i32,
    /// `fd`.
    pub fd: i32,
    /// `offset`.
    pub offset: i64,
}

/// What `fstat` says about a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// `st_mode`.
    pub mode: u32,
    /// `st_dev`, `st_ino`, `st_rdev`.
    pub key: FileKey,
}

/// The syscalls the decision may make.
pub trait Os {
    /// `fstat(fd)`; `None` when it fails.
    fn fstat(&self, fd: i32) -> Option<Stat>;
    /// `ioctl(fd, NVPROXY_IOC_HELLO, 0) == NVPROXY_HELLO_MAGIC`.
    fn hello(&self, fd: i32) -> bool;
    /// `fcntl(fd, F_GETFL) & O_ACCMODE`, or the errno.
    fn access_mode(&self, fd: i32) -> Result<i32, i32>;
    /// `ioctl(fd, NVPROXY_IOC_MMAP_TICKET, args)`, or the errno.
    fn ticket(&self, fd: i32, args: &mut MmapTicketArgs) -> Result<(), i32>;
    /// Redeems `ticket` at the socket `path`: the host fd and the offset adjustment, or why not.
    fn redeem(&self, path: &[u8], ticket: u64) -> Result<(i32, u64), Failure>;
    /// `close(fd)`.
    fn close(&self, fd: i32);
}

/// Why a proxied mmap failed: the errno the caller sees and a line for `NVPROXY_SHIM_DEBUG`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// The errno.
    pub errno: i32,
    /// What went wrong.
    pub why: &'static str,
}

impl Failure {
    /// A failure with errno `errno`.
    pub const fn new(errno: i32, why: &'static str) -> Self {
        Failure { errno, why }
    }
}

/// The decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Not our node: the real `mmap` with the caller's arguments.
    Real,
    /// Our node: the real `mmap` of host fd `fd` at `offset` (the caller's plus the daemon's
    /// adjustment), with the caller's addr, len, prot and flags; then close `fd`.
    Host {
        /// The host fd received from the daemon (owned by the shim).
        fd: i32,
        /// The offset to map at.
        offset: i64,
    },
    /// Our node, and the mmap fails with this errno.
    Fail(Failure),
}

fn is_shared(flags: i32) -> bool {
    matches!(
        flags & 0x0f, // MAP_TYPE
        libc::MAP_SHARED | libc::MAP_SHARED_VALIDATE
    )
}

/// Decides what to do with `call`. Costs: `MAP_ANONYMOUS`, a negative fd, or no configured
/// nodes: no syscall. Any other file: one `fstat`. A listed device number seen for the first
/// time: one `NVPROXY_IOC_HELLO`. Our node: `fcntl`, the ticket ioctl and the socket exchange.
pub fn route(os: &impl Os, cfg: &Config, cache: &NodeCache, call: &Call) -> Route {
    if call.flags & libc::MAP_ANONYMOUS != 0 || call.fd < 0 || !cfg.has_nodes() {
        return Route::Real;
    }
    let Some(st) = os.fstat(call.fd) else {
        return Route::Real;
    };
    if st.mode & libc::S_IFMT != libc::S_IFCHR || !cfg.is_node(st.key.rdev) {
        return Route::Real;
    }
    if !cache.contains(st.key) {
        if !os.hello(call.fd) {
            // A listed number that does not answer as ours (or an O_PATH fd, which fails every
            // ioctl): the kernel's own answer is the right one.
            return Route::Real;
        }
        cache.insert(st.key);
    }
    proxied(os, cfg, call)
}

/// The checks the kernel and libc make before a driver's mmap handler runs (mm/mmap.c
/// `do_mmap`, glibc `__mmap64`), so a bad call fails as it would on the real node and costs no
/// ticket.
fn precheck(os: &impl Os, cfg: &Config, call: &Call) -> Result<(), Failure> {
    let page = cfg.page_size() as i64;
    if call.offset & (page - 1) != 0 || call.len == 0 {
        return Err(Failure::new(libc::EINVAL, "bad offset or length"));
    }
    if !matches!(
        call.flags & 0x0f,
        libc::MAP_SHARED | libc::MAP_SHARED_VALIDATE | libc::MAP_PRIVATE
    ) {
        return Err(Failure::new(libc::EINVAL, "bad mapping type"));
    }
    let mode = os
        .access_mode(call.fd)
        .map_err(|e| Failure::new(e, "fcntl(F_GETFL) failed"))?;
    // FMODE_READ is needed for every mapping, FMODE_WRITE for a shared writable one.
    if mode == libc::O_WRONLY
        || (is_shared(call.flags) && call.prot & libc::PROT_WRITE != 0 && mode == libc::O_RDONLY)
    {
        return Err(Failure::new(
            libc::EACCES,
            "the fd's access mode forbids this mapping",
        ));
    }
    Ok(())
}

fn proxied(os: &impl Os, cfg: &Config, call: &Call) -> Route {
    if let Err(f) = precheck(os, cfg, call) {
        return Route::Fail(f);
    }
    let mut args = MmapTicketArgs {
        addr: call.addr as u64,
        len: call.len as u64,
        prot: call.prot,
        flags: call.flags,
        offset: call.offset,
        ticket: 0,
    };
    if let Err(errno) = os.ticket(call.fd, &mut args) {
        return Route::Fail(Failure::new(errno, "the node refused a ticket"));
    }
    let mut path = [0u8; SUN_PATH_LEN];
    let n = cfg.socket_path(&mut path);
    if n == 0 {
        return Route::Fail(Failure::new(
            libc::ENODEV,
            "NVPROXY_SOCKET is not an absolute path of at most 107 bytes",
        ));
    }
    let (fd, adjust) = match os.redeem(&path[..n], args.ticket) {
        Ok(r) => r,
        Err(f) => return Route::Fail(f),
    };
    match i64::try_from(adjust)
        .ok()
        .and_then(|a| call.offset.checked_add(a))
    {
        Some(offset) => Route::Host { fd, offset },
        None => {
            os.close(fd);
            Route::Fail(Failure::new(libc::EOVERFLOW, "offset adjustment overflows"))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::config::Begin;
    use crate::proto::makedev;

    const NODE: u64 = makedev(244, 0);

    #[derive(Default)]
    struct Fake {
        calls: RefCell<Vec<&'static str>>,
        stat: Option<Stat>,
        hello: bool,
        mode: i32,
        ticket: Option<i32>,
        redeem: Option<Result<(i32, u64), Failure>>,
        closed: RefCell<Vec<i32>>,
    }

    impl Os for Fake {
        fn fstat(&self, _fd: i32) -> Option<Stat> {
            self.calls.borrow_mut().push("fstat");
            self.stat
        }
        fn hello(&self, _fd: i32) -> bool {
            self.calls.borrow_mut().push("hello");
            self.hello
        }
        fn access_mode(&self, _fd: i32) -> Result<i32, i32> {
            self.calls.borrow_mut().push("fcntl");
            Ok(self.mode)
        }
        fn ticket(&self, _fd: i32, args: &mut MmapTicketArgs) -> Result<(), i32> {
            self.calls.borrow_mut().push("ticket");
            match self.ticket {
                Some(e) => Err(e),
                None => {
                    args.ticket = 77;
                    Ok(())
                }
            }
        }
        fn redeem(&self, path: &[u8], ticket: u64) -> Result<(i32, u64), Failure> {
            assert_eq!((path, ticket), (b"/run/nvproxy/mmap.sock".as_slice(), 77));
            self.calls.borrow_mut().push("redeem");
            self.redeem.unwrap_or(Ok((50, 0)))
        }
        fn close(&self, fd: i32) {
            self.closed.borrow_mut().push(fd);
        }
    }

    fn cfg(nodes: &[u8]) -> Config {
        let c = Config::new();
        assert_eq!(c.begin(1), Begin::Load);
        c.load(Some(nodes), None, 4096, false);
        c.publish();
        c
    }

    fn node_stat() -> Option<Stat> {
        Some(Stat {
            mode: libc::S_IFCHR | 0o666,
            key: FileKey {
                dev: 6,
                ino: 140,
                rdev: NODE,
            },
        })
    }

    fn ours() -> Fake {
        Fake {
            stat: node_stat(),
            hello: true,
            mode: libc::O_RDWR,
            ..Default::default()
        }
    }

    fn call(flags: i32, fd: i32) -> Call {
        Call {
            addr: 0,
            len: 4096,
            prot: libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            offset: 0,
        }
    }

    #[test]
    fn test_anonymous_mapping_costs_no_syscall() {
        let os = ours();
        let r = route(
            &os,
            &cfg(b"244:0"),
            &NodeCache::new(),
            &call(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, 3),
        );
        assert_eq!((r, os.calls.take()), (Route::Real, vec![]));
    }

    #[test]
    fn test_negative_fd_costs_no_syscall() {
        let os = ours();
        let r = route(
            &os,
            &cfg(b"244:0"),
            &NodeCache::new(),
            &call(libc::MAP_SHARED, -1),
        );
        assert_eq!((r, os.calls.take()), (Route::Real, vec![]));
    }

    #[test]
    fn test_no_listed_nodes_costs_no_syscall() {
        let os = ours();
        let r = route(
            &os,
            &cfg(b""),
            &NodeCache::new(),
            &call(libc::MAP_SHARED, 3),
        );
        assert_eq!((r, os.calls.take()), (Route::Real, vec![]));
    }

    #[test]
    fn test_regular_file_costs_one_fstat() {
        let os = Fake {
            stat: Some(Stat {
                mode: libc::S_IFREG | 0o644,
                key: FileKey {
                    dev: 6,
                    ino: 140,
                    rdev: NODE,
                },
            }),
            ..Default::default()
        };
        let r = route(
            &os,
            &cfg(b"244:0"),
            &NodeCache::new(),
            &call(libc::MAP_SHARED, 3),
        );
        assert_eq!((r, os.calls.take()), (Route::Real, vec!["fstat"]));
    }

    #[test]
    fn test_unlisted_char_device_gets_no_ioctl() {
        let os = ours();
        let r = route(
            &os,
            &cfg(b"1:5"),
            &NodeCache::new(),
            &call(libc::MAP_SHARED, 3),
        );
        assert_eq!((r, os.calls.take()), (Route::Real, vec!["fstat"]));
    }

    #[test]
    fn test_listed_device_that_does_not_answer_hello_is_left_alone() {
        let os = Fake {
            hello: false,
            ..ours()
        };
        let r = route(
            &os,
            &cfg(b"244:0"),
            &NodeCache::new(),
            &call(libc::MAP_SHARED, 3),
        );
        assert_eq!((r, os.calls.take()), (Route::Real, vec!["fstat", "hello"]));
    }

    #[test]
    fn test_our_node_is_mapped_through_the_host_fd() {
        let os = Fake {
            redeem: Some(Ok((50, 8192))),
            ..ours()
        };
        let r = route(
            &os,
            &cfg(b"244:0"),
            &NodeCache::new(),
            &call(libc::MAP_SHARED, 3),
        );
        assert_eq!(
            (r, os.calls.take()),
            (
                Route::Host {
                    fd: 50,
                    offset: 8192
                },
                vec!["fstat", "hello", "fcntl", "ticket", "redeem"]
            )
        );
    }

    #[test]
    fn test_hello_is_cached_by_file_identity() {
        let os = ours();
        let (c, cache) = (cfg(b"244:0"), NodeCache::new());
        route(&os, &c, &cache, &call(libc::MAP_SHARED, 3));
        os.calls.take();
        route(&os, &c, &cache, &call(libc::MAP_SHARED, 9));
        assert_eq!(os.calls.take(), vec!["fstat", "fcntl", "ticket", "redeem"]);
    }

    #[test]
    fn test_ticket_errno_is_the_mmap_errno() {
        let os = Fake {
            ticket: Some(libc::EAGAIN),
            ..ours()
        };
        let r = route(
            &os,
            &cfg(b"244:0"),
            &NodeCache::new(),
            &call(libc::MAP_SHARED, 3),
        );
        assert!(
            matches!(r, Route::Fail(f) if f.errno == libc::EAGAIN),
            "{r:?}"
        );
    }

    #[test]
    fn test_daemon_errno_is_the_mmap_errno() {
        let os = Fake {
            redeem: Some(Err(Failure::new(libc::ENODEV, "x"))),
            ..ours()
        };
        let r = route(
            &os,
            &cfg(b"244:0"),
            &NodeCache::new(),
            &call(libc::MAP_SHARED, 3),
        );
        assert!(
            matches!(r, Route::Fail(f) if f.errno == libc::ENODEV),
            "{r:?}"
        );
    }

    #[test]
    fn test_unaligned_offset_fails_einval_without_a_ticket() {
        let os = ours();
        let mut c = call(libc::MAP_SHARED, 3);
        c.offset = 100;
        let r = route(&os, &cfg(b"244:0"), &NodeCache::new(), &c);
        assert!(
            matches!(r, Route::Fail(f) if f.errno == libc::EINVAL),
            "{r:?}"
        );
        assert!(!os.calls.take().contains(&"ticket"));
    }

    #[test]
    fn test_zero_length_fails_einval() {
        let os = ours();
        let mut c = call(libc::MAP_SHARED, 3);
        c.len = 0;
        let r = route(&os, &cfg(b"244:0"), &NodeCache::new(), &c);
        assert!(
            matches!(r, Route::Fail(f) if f.errno == libc::EINVAL),
            "{r:?}"
        );
    }

    #[test]
    fn test_shared_writable_map_of_read_only_fd_fails_eacces() {
        let os = Fake {
            mode: libc::O_RDONLY,
            ..ours()
        };
        let r = route(
            &os,
            &cfg(b"244:0"),
            &NodeCache::new(),
            &call(libc::MAP_SHARED, 3),
        );
        assert!(
            matches!(r, Route::Fail(f) if f.errno == libc::EACCES),
            "{r:?}"
        );
    }

    #[test]
    fn test_private_writable_map_of_read_only_fd_is_allowed() {
        let os = Fake {
            mode: libc::O_RDONLY,
            ..ours()
        };
        let r = route(
            &os,
            &cfg(b"244:0"),
            &NodeCache::new(),
            &call(libc::MAP_PRIVATE, 3),
        );
        assert!(matches!(r, Route::Host { .. }), "{r:?}");
    }

    #[test]
    fn test_write_only_fd_fails_eacces() {
        let os = Fake {
            mode: libc::O_WRONLY,
            ..ours()
        };
        let r = route(
            &os,
            &cfg(b"244:0"),
            &NodeCache::new(),
            &call(libc::MAP_PRIVATE, 3),
        );
        assert!(
            matches!(r, Route::Fail(f) if f.errno == libc::EACCES),
            "{r:?}"
        );
    }

    #[test]
    fn test_overflowing_adjustment_fails_eoverflow_and_closes_the_fd() {
        let os = Fake {
            redeem: Some(Ok((50, u64::MAX))),
            ..ours()
        };
        let r = route(
            &os,
            &cfg(b"244:0"),
            &NodeCache::new(),
            &call(libc::MAP_SHARED, 3),
        );
        assert!(
            matches!(r, Route::Fail(f) if f.errno == libc::EOVERFLOW),
            "{r:?}"
        );
        assert_eq!(os.closed.take(), vec![50]);
    }
}
