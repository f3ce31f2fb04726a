//! What the shim learns once from its environment: our nodes' device numbers, the socket path,
//! the page size. Stored in atomics (no locks, no allocation), published once by the thread that
//! initialises it.

use std::sync::atomic::{AtomicI32, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use crate::proto::{self, MAX_NODES};

/// `sizeof(sockaddr_un.sun_path)` on Linux, including the terminating NUL.
pub const SUN_PATH_LEN: usize = 108;

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
const READY: u8 = 2;

/// The shim's configuration.
pub struct Config {
    state: AtomicU8,
    /// Thread id of the initialising thread (to recognise re-entry from that thread).
    init_tid: AtomicI32,
    nodes: [AtomicU64; MAX_NODES],
    n_nodes: AtomicUsize,
    socket: [AtomicU8; SUN_PATH_LEN],
    /// Length of the socket path; 0: no usable path (proxied mmaps fail with ENODEV).
    socket_len: AtomicUsize,
    page_size: AtomicUsize,
    debug: AtomicU8,
}

/// What [`Config::begin`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// The configuration is ready.
    Ready,
    /// The caller must load it now and then call [`Config::publish`].
    Load,
    /// The caller's own thread is loading it (re-entry): treat as not configured.
    Reentered,
}

impl Config {
    /// An empty, uninitialised configuration.
    pub const fn new() -> Self {
        Config {
            state: AtomicU8::new(UNINIT),
            init_tid: AtomicI32::new(0),
            nodes: [const { AtomicU64::new(0) }; MAX_NODES],
            n_nodes: AtomicUsize::new(0),
            socket: [const { AtomicU8::new(0) }; SUN_PATH_LEN],
            socket_len: AtomicUsize::new(0),
            page_size: AtomicUsize::new(4096),
            debug: AtomicU8::new(0),
        }
    }

    /// Whether the configuration is published.
    pub fn is_ready(&self) -> bool {
        self.state.load(Ordering::Acquire) == READY
    }

    /// Starts initialisation for thread `tid`: exactly one thread gets [`Begin::Load`]; other
    /// threads wait until it has published; the loading thread itself, re-entering, gets
    /// [`Begin::Reentered`].
    pub fn begin(&self, tid: i32) -> Begin {
        loop {
            match self.state.compare_exchange(
                UNINIT,
                INITIALIZING,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.init_tid.store(tid, Ordering::Relaxed);
                    return Begin::Load;
                }
                Err(READY) => return Begin::Ready,
                Err(_) => {
                    if self.init_tid.load(Ordering::Relaxed) == tid {
                        return Begin::Reentered;
                    }
                    std::hint::spin_loop();
                }
            }
        }
    }

    /// Stores what the environment says. `nodes`: the value of `NVPROXY_NODES`; `socket`: of
    /// `NVPROXY_SOCKET` (default [`proto::DEFAULT_SOCKET_PATH`]); `debug`: `NVPROXY_SHIM_DEBUG`
    /// is set to something other than `0`. Only the thread that got [`Begin::Load`] calls this.
    pub fn load(&self, nodes: Option<&[u8]>, socket: Option<&[u8]>, page_size: usize, debug: bool) {
        let mut n = 0;
        for dev in nodes.into_iter().flat_map(proto::node_list).flatten() {
            if n == MAX_NODES {
                break;
            }
            self.nodes[n].store(dev, Ordering::Relaxed);
            n += 1;
        }
        self.n_nodes.store(n, Ordering::Relaxed);
        let path = match socket {
            Some(p) if !p.is_empty() => p,
            _ => proto::DEFAULT_SOCKET_PATH.as_bytes(),
        };
        // Absolute, NUL-free, and short enough for sun_path with its NUL.
        let usable = path.first() == Some(&b'/') && !path.contains(&0) && path.len() < SUN_PATH_LEN;
        let len = if usable { path.len() } else { 0 };
        for (slot, &b) in self.socket.iter().zip(&path[..len]) {
            slot.store(b, Ordering::Relaxed);
        }
        self.socket_len.store(len, Ordering::Relaxed);
        if page_size.is_power_of_two() {
            self.page_size.store(page_size, Ordering::Relaxed);
        }
        self.debug.store(u8::from(debug), Ordering::Relaxed);
    }

    /// Makes what [`Config::load`] stored visible to every thread.
    pub fn publish(&self) {
        self.state.store(READY, Ordering::Release);
    }

    /// Whether there is any node to look for (false until published).
    pub fn has_nodes(&self) -> bool {
        self.is_ready() && self.n_nodes.load(Ordering::Relaxed) != 0
    }

    /// Whether `rdev` is one of the listed nodes.
    pub fn is_node(&self, rdev: u64) -> bool {
        let n = self.n_nodes.load(Ordering::Relaxed);
        self.nodes[..n]
            .iter()
            .any(|d| d.load(Ordering::Relaxed) == rdev)
    }

    /// Copies the socket path into `buf`; returns its length (0: no usable path).
    pub fn socket_path(&self, buf: &mut [u8; SUN_PATH_LEN]) -> usize {
        let len = self.socket_len.load(Ordering::Relaxed);
        for (b, slot) in buf.iter_mut().zip(&self.socket[..len]) {
            *b = slot.load(Ordering::Relaxed);
        }
        len
    }

    /// The page size.
    pub fn page_size(&self) -> usize {
        self.page_size.load(Ordering::Relaxed)
    }

    /// Whether failures of proxied mmaps are reported on stderr.
    pub fn debug(&self) -> bool {
        self.debug.load(Ordering::Relaxed) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::makedev;

    fn loaded(nodes: &[u8], socket: Option<&[u8]>) -> Config {
        let c = Config::new();
        assert_eq!(c.begin(1), Begin::Load);
        c.load(Some(nodes), socket, 4096, false);
        c.publish();
        c
    }

    #[test]
    fn test_unpublished_config_has_no_nodes() {
        let c = Config::new();
        assert_eq!(c.begin(1), Begin::Load);
        c.load(Some(b"244:0"), None, 4096, false);
        assert!(!c.has_nodes());
    }

    #[test]
    fn test_listed_nodes_are_recognised() {
        let c = loaded(b"244:0,243:7", None);
        assert!(c.has_nodes());
        assert!(c.is_node(makedev(244, 0)) && c.is_node(makedev(243, 7)));
        assert!(!c.is_node(makedev(1, 3)));
    }

    #[test]
    fn test_malformed_entries_are_skipped() {
        let c = loaded(b"junk,244:0", None);
        assert!(c.is_node(makedev(244, 0)));
    }

    #[test]
    fn test_empty_list_means_no_nodes() {
        let c = loaded(b"", None);
        assert!(!c.has_nodes());
    }

    #[test]
    fn test_socket_defaults_to_run_nvproxy() {
        let c = loaded(b"244:0", None);
        let mut buf = [0u8; SUN_PATH_LEN];
        let n = c.socket_path(&mut buf);
        assert_eq!(&buf[..n], b"/run/nvproxy/mmap.sock");
    }

    #[test]
    fn test_socket_from_environment() {
        let c = loaded(b"244:0", Some(b"/tmp/x.sock"));
        let mut buf = [0u8; SUN_PATH_LEN];
        let n = c.socket_path(&mut buf);
        assert_eq!(&buf[..n], b"/tmp/x.sock");
    }

    #[test]
    fn test_relative_or_too_long_socket_path_is_unusable() {
        let long = [b'/'; SUN_PATH_LEN];
        let mut buf = [0u8; SUN_PATH_LEN];
        assert_eq!(loaded(b"1:1", Some(b"rel.sock")).socket_path(&mut buf), 0);
        assert_eq!(loaded(b"1:1", Some(&long)).socket_path(&mut buf), 0);
    }

    #[test]
    fn test_second_begin_after_publish_is_ready() {
        let c = loaded(b"1:1", None);
        assert_eq!(c.begin(2), Begin::Ready);
    }

    #[test]
    fn test_reentry_from_the_loading_thread_is_reported() {
        let c = Config::new();
        assert_eq!(c.begin(7), Begin::Load);
        assert_eq!(c.begin(7), Begin::Reentered);
    }
}
