//! The mmap path, daemon side: tickets and the per-instance socket.
//!
//! CUSE has no `mmap`: `mmap()` on our nodes fails with `ENODEV` in the kernel, and the daemon
//! never hears of it. The in-container shim (`libnvproxy_preload.so`, crate `preload`) turns an
//! mmap of our node into three steps (protocol: crate `preload-proto`):
//!
//! 1. `NVPROXY_IOC_MMAP_TICKET` on the node's fd. [`InstanceMmap::ticket_ioctl`] reads the
//!    caller's arguments (with the instance's client-memory transport), and issues a ticket:
//!    64 random bits, bound to this instance (each instance has its own [`TicketStore`]), to the
//!    open file it came in on (node and `fh`), and to the calling thread group; single use;
//!    expiring after [`TICKET_TTL`]; at most [`MAX_TICKETS`] outstanding (else `EAGAIN`).
//! 2. The shim connects to the instance socket (`/run/nvproxy/<instance>/mmap.sock`, bind-mounted
//!    at `/run/nvproxy/mmap.sock` inside `nvproxy exec`/`run`) and sends the ticket. The
//!    [`MmapSocket`] thread takes the peer's pid from `SO_PEERCRED` (the thread group that
//!    connected, in our pid namespace): unless it is the ticket's thread group, and the ticket
//!    is live and unused, nothing is sent and the connection is closed. A peer with a wrong pid
//!    does not use the ticket up.
//! 3. For a redeemed ticket it asks the node's backend for the mapping fd
//!    (`Backend::mapping_fd(fh)`: the driver decides what the open file maps, and its errno is
//!    the mmap's errno) and sends `{errno, offset_adjust}` with the fd attached by `SCM_RIGHTS`.
//!    The shim maps it with the caller's exact arguments and closes it.
//!
//! A client without the shim gets `ENODEV` from the kernel. The daemon cannot see that mmap,
//! so it says so where it can: once per instance at start (info), and once per client process
//! that opens a node without the shim mapped (`/proc/<pid>/maps`, checked at open; info).

mod handler;
mod inject;
mod socket;
mod tickets;

use std::time::Duration;

pub use handler::{InstanceMmap, LiveTicket};
pub use inject::{SHIM_NAME, ld_preload_with, node_ids, shim_path};
pub use socket::MmapSocket;
pub use tickets::{Refusal, TicketStore};

/// How long a ticket stays valid. The shim redeems it right after the ioctl returns; a few
/// seconds leave room for a slow (emulated, overloaded) machine.
pub const TICKET_TTL: Duration = Duration::from_secs(5);
/// Tickets outstanding per instance.
pub const MAX_TICKETS: usize = 256;
/// How long the socket thread waits for a connected peer's request.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicU64, Ordering};

    use std::fs::File;
    use std::io;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::fs::MetadataExt;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};

    use std::time::{Duration, Instant};

    use anyhow::Result;
    use cuse_dev::{Errno, IoVec, Ioctl, IoctlReply, Request};

    use nix::sys::socket::{self, MsgFlags};

    use nvproxy_preload_proto::{MmapReply, MmapRequest, MmapTicketArgs};

    use super::handler::*;
    use super::socket::*;
    use super::tickets::*;
    use super::*;
    use crate::node::{Backend, Node};
    use nvproxy_config::MemoryTransport;
    use std::os::fd::AsFd;

    fn counter() -> Box<dyn FnMut() -> io::Result<u64> + Send> {
        let next = AtomicU64::new(100);
        Box::new(move || Ok(next.fetch_add(1, Ordering::Relaxed)))
    }

    fn store() -> TicketStore<&'static str> {
        TicketStore::new(Duration::from_secs(5), 4, counter())
    }

    fn args() -> MmapTicketArgs {
        MmapTicketArgs {
            len: 4096,
            ..Default::default()
        }
    }

    #[test]
    fn test_ticket_redeems_once() {
        let s = store();
        let now = Instant::now();
        let t = s.issue("ctl", 7, 1000, args(), now).unwrap();
        let got = s.redeem(t, 1000, now).map(|k| (k.target, k.fh));
        let again = s.redeem(t, 1000, now).map(|k| k.fh);
        assert_eq!((got, again), (Ok(("ctl", 7)), Err(Refusal::Unknown)));
    }

    #[test]
    fn test_expired_ticket_is_refused_and_dropped() {
        let s = store();
        let now = Instant::now();
        let t = s.issue("ctl", 7, 1000, args(), now).unwrap();
        let later = now + Duration::from_secs(5);
        let first = s.redeem(t, 1000, later).map(|k| k.fh);
        let second = s.redeem(t, 1000, now).map(|k| k.fh);
        assert_eq!(
            (first, second),
            (Err(Refusal::Expired), Err(Refusal::Unknown))
        );
    }

    #[test]
    fn test_ticket_of_another_store_is_unknown() {
        let (a, b) = (
            store(),
            TicketStore::<&str>::new(Duration::from_secs(5), 4, counter()),
        );
        let now = Instant::now();
        let t = a.issue("ctl", 7, 1000, args(), now).unwrap();
        // Even with the same number sequence, b never issued it.
        assert_eq!(b.redeem(t, 1000, now).map(|k| k.fh), Err(Refusal::Unknown));
    }

    #[test]
    fn test_wrong_peer_is_refused_and_does_not_use_the_ticket() {
        let s = store();
        let now = Instant::now();
        let t = s.issue("ctl", 7, 1000, args(), now).unwrap();
        let wrong = s.redeem(t, 1001, now).map(|k| k.fh);
        let right = s.redeem(t, 1000, now).map(|k| k.fh);
        assert_eq!(
            (wrong, right),
            (Err(Refusal::WrongPeer { owner: 1000 }), Ok(7))
        );
    }

    #[test]
    fn test_ticket_is_bound_to_its_open_file() {
        let s = store();
        let now = Instant::now();
        let t7 = s.issue("ctl", 7, 1000, args(), now).unwrap();
        let t8 = s.issue("ctl", 8, 1000, args(), now).unwrap();
        s.forget(|node, fh| *node == "ctl" && fh == 7);
        let r7 = s.redeem(t7, 1000, now).map(|k| k.fh);
        let r8 = s.redeem(t8, 1000, now).map(|k| k.fh);
        assert_eq!((r7, r8), (Err(Refusal::Unknown), Ok(8)));
    }

    #[test]
    fn test_forget_matches_node_as_well_as_fh() {
        let s = store();
        let now = Instant::now();
        let t = s.issue("gpu0", 7, 1000, args(), now).unwrap();
        s.forget(|node, fh| *node == "ctl" && fh == 7);
        assert_eq!(s.redeem(t, 1000, now).map(|k| k.fh), Ok(7));
    }

    #[test]
    fn test_store_is_bounded() {
        let s = store();
        let now = Instant::now();
        for _ in 0..4 {
            s.issue("ctl", 7, 1000, args(), now).unwrap();
        }
        assert_eq!(s.issue("ctl", 7, 1000, args(), now), Err(Errno::EAGAIN));
    }

    #[test]
    fn test_expired_tickets_free_their_places() {
        let s = store();
        let now = Instant::now();
        for _ in 0..4 {
            s.issue("ctl", 7, 1000, args(), now).unwrap();
        }
        let later = now + Duration::from_secs(6);
        assert!(s.issue("ctl", 7, 1000, args(), later).is_ok());
        assert_eq!(s.outstanding(later), 1);
    }

    #[test]
    fn test_zero_and_duplicate_numbers_are_skipped() {
        let seq = Mutex::new(vec![0u64, 5, 5, 6].into_iter());
        let s = TicketStore::new(
            Duration::from_secs(5),
            4,
            Box::new(move || Ok(seq.lock().unwrap().next().unwrap())),
        );
        let now = Instant::now();
        let a = s.issue("ctl", 1, 1, args(), now).unwrap();
        let b = s.issue("ctl", 1, 1, args(), now).unwrap();
        assert_eq!((a, b), (5, 6));
    }

    #[test]
    fn test_urandom_tickets_differ() {
        let s = TicketStore::with_urandom(Duration::from_secs(5), 4).unwrap();
        let now = Instant::now();
        let a = s.issue("ctl", 1, 1, args(), now).unwrap();
        let b = s.issue("ctl", 1, 1, args(), now).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn test_ld_preload_is_appended_once() {
        let shim = Path::new("/opt/nvproxy/libnvproxy_preload.so");
        assert_eq!(
            ld_preload_with(None, shim),
            "/opt/nvproxy/libnvproxy_preload.so"
        );
        assert_eq!(
            ld_preload_with(Some(" "), shim),
            "/opt/nvproxy/libnvproxy_preload.so"
        );
        assert_eq!(
            ld_preload_with(Some("libfoo.so"), shim),
            "libfoo.so:/opt/nvproxy/libnvproxy_preload.so"
        );
        assert_eq!(
            ld_preload_with(Some("/opt/nvproxy/libnvproxy_preload.so libfoo.so"), shim),
            "/opt/nvproxy/libnvproxy_preload.so libfoo.so"
        );
    }

    #[test]
    fn test_tgid_of_another_thread_is_our_pid() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(u32::try_from(nix::unistd::gettid().as_raw()).unwrap())
                .unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let got = tgid_of(tid).unwrap();
        done_tx.send(()).unwrap();
        t.join().unwrap();
        assert_eq!(
            (got == std::process::id(), tid == std::process::id()),
            (true, false)
        );
    }

    // ---- the socket, in-process ------------------------------------------------------------

    /// A backend whose every open maps a memfd holding "nvproxy" at offset 0.
    struct MemfdBackend;

    impl Backend for MemfdBackend {
        fn open(&self, _node: Node, _pid: u32) -> Result<u64, Errno> {
            Ok(1)
        }
        fn release(&self, _open: u64) {}
        fn mapping_fd(&self, open: u64) -> Result<(OwnedFd, u64), Errno> {
            if open != 7 {
                return Err(Errno::EINVAL);
            }
            let fd = nix::sys::memfd::memfd_create(
                c"mmap-test",
                nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
            )
            .map_err(|_| Errno::EIO)?;
            let f = File::from(fd);
            f.set_len(4096).map_err(|_| Errno::EIO)?;
            std::io::Write::write_all(&mut &f, b"nvproxy").map_err(|_| Errno::EIO)?;
            Ok((f.into(), 4096))
        }
        fn ioctl(
            &self,
            _open: u64,
            _caller: ioctl_proxy::Caller,
            _cmd: u32,
            _arg: u64,
            _mem: &mut dyn ioctl_proxy::ClientMemory,
            _fds: crate::node::FdLookup<'_>,
        ) -> Result<i32, Errno> {
            Err(Errno::ENOTTY)
        }
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nvproxy-mmap-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn served(tag: &str) -> (Arc<InstanceMmap>, MmapSocket, PathBuf) {
        let root = scratch(tag);
        let m = Arc::new(InstanceMmap::new("inst").unwrap());
        let s = MmapSocket::start(m.clone(), &root).unwrap();
        (m, s, root)
    }

    fn issue(m: &InstanceMmap, fh: u64, tgid: u32) -> u64 {
        let target = Target {
            node: Node::Ctl,
            backend: Arc::new(MemfdBackend),
        };
        m.tickets()
            .issue(target, fh, tgid, args(), Instant::now())
            .unwrap()
    }

    /// Sends `ticket` on a fresh connection; the reply and the fd, or None when the daemon
    /// closed without a word.
    fn ask(path: &Path, ticket: u64) -> Option<(MmapReply, Option<OwnedFd>)> {
        let s = socket::socket(
            socket::AddressFamily::Unix,
            socket::SockType::SeqPacket,
            socket::SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        socket::connect(s.as_raw_fd(), &socket::UnixAddr::new(path).unwrap()).unwrap();
        socket::send(
            s.as_raw_fd(),
            &MmapRequest { ticket }.encode(),
            MsgFlags::empty(),
        )
        .unwrap();
        let mut buf = [0u8; 32];
        let mut msg = crate::fdpass::recv(s.as_fd(), &mut buf, libc::MSG_CMSG_CLOEXEC).unwrap();
        let n = msg.bytes;
        if n == 0 {
            assert!(msg.fds.is_empty());
            return None;
        }
        assert!(msg.fds.len() <= 1);
        let fd = msg.fds.pop();
        Some((MmapReply::decode(&buf[..n]).unwrap(), fd))
    }

    #[test]
    fn test_socket_hands_the_mapping_fd_to_the_ticket_owner() {
        let (m, s, root) = served("owner");
        let t = issue(&m, 7, std::process::id());
        let (reply, fd) = ask(s.path(), t).expect("a reply");
        let mut got = [0u8; 7];
        let f = File::from(fd.expect("an fd"));
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut got, 0).unwrap();
        assert_eq!(
            (reply.errno, reply.offset_adjust, &got),
            (0, 4096, b"nvproxy")
        );
        drop(s);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_socket_replay_gets_nothing() {
        let (m, s, root) = served("replay");
        let t = issue(&m, 7, std::process::id());
        assert!(ask(s.path(), t).is_some());
        assert!(ask(s.path(), t).is_none());
        drop(s);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_socket_peer_other_than_the_ticket_owner_gets_nothing() {
        let (m, s, root) = served("peer");
        let t = issue(&m, 7, std::process::id() + 1);
        assert!(ask(s.path(), t).is_none());
        assert_eq!(m.tickets().outstanding(Instant::now()), 1);
        drop(s);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_socket_unknown_ticket_gets_nothing() {
        let (_m, s, root) = served("unknown");
        assert!(ask(s.path(), 0x1234_5678).is_none());
        drop(s);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_socket_driver_errno_comes_back_without_fd() {
        let (m, s, root) = served("errno");
        let t = issue(&m, 8, std::process::id());
        let (reply, fd) = ask(s.path(), t).expect("a reply");
        assert_eq!((reply.errno, fd.is_none()), (libc::EINVAL, true));
        drop(s);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_socket_ignores_a_stream_peer_and_serves_on() {
        let (m, s, root) = served("stream");
        // A SOCK_STREAM connect to a SEQPACKET socket fails; a silent SEQPACKET peer times out.
        assert!(UnixStream::connect(s.path()).is_err());
        let t = issue(&m, 7, std::process::id());
        assert!(ask(s.path(), t).is_some());
        drop(s);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_socket_path_is_per_instance_and_private() {
        let root = scratch("paths");
        let a = Arc::new(InstanceMmap::new("a").unwrap());
        let b = Arc::new(InstanceMmap::new("b").unwrap());
        let sa = MmapSocket::start(a, &root).unwrap();
        let sb = MmapSocket::start(b, &root).unwrap();
        let dir_mode = std::fs::metadata(root.join("a")).unwrap().mode() & 0o777;
        let sock_mode = std::fs::metadata(sa.path()).unwrap().mode() & 0o777;
        assert_eq!(
            (sa.path(), sb.path(), dir_mode, sock_mode),
            (
                root.join("a/mmap.sock").as_path(),
                root.join("b/mmap.sock").as_path(),
                0o700,
                0o666
            )
        );
        drop((sa, sb));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_stopping_removes_the_socket_and_its_directory() {
        let (_m, s, root) = served("stop");
        let path = s.path().to_path_buf();
        drop(s);
        assert!(!path.exists() && !root.join("inst").exists());
        let _ = std::fs::remove_dir_all(root);
    }

    // ---- the ticket ioctl ----------------------------------------------------------------

    fn memfd_target() -> Arc<dyn Backend> {
        Arc::new(MemfdBackend)
    }

    fn ioctl_at<'a>(fh: u64, arg: u64, in_data: &'a [u8], out_size: u32) -> Ioctl<'a> {
        Ioctl {
            fh,
            cmd: nvproxy_preload_proto::NVPROXY_IOC_MMAP_TICKET,
            arg,
            flags: cuse_dev::wire::FUSE_IOCTL_UNRESTRICTED,
            in_data,
            out_size,
            retry: None,
        }
    }

    fn me() -> Request {
        Request::detached(
            1,
            u32::try_from(nix::unistd::gettid().as_raw()).unwrap(),
            0,
            0,
        )
    }

    #[test]
    fn test_retry_ticket_first_round_asks_for_the_struct_and_the_ticket_bytes() {
        let m = InstanceMmap::new("inst").unwrap();
        let r = m.ticket_ioctl(
            Node::Ctl,
            &memfd_target(),
            &me(),
            &ioctl_at(7, 0x1000, &[], 0),
            MemoryTransport::Retry,
        );
        assert_eq!(
            r,
            Ok(IoctlReply::Retry {
                in_iovs: vec![IoVec::new(0x1000, 40)],
                out_iovs: vec![IoVec::new(0x1000 + 32, 8)],
            })
        );
    }

    #[test]
    fn test_retry_ticket_second_round_returns_a_redeemable_ticket() {
        let m = InstanceMmap::new("inst").unwrap();
        let data = args().to_bytes();
        let r = m.ticket_ioctl(
            Node::Ctl,
            &memfd_target(),
            &me(),
            &ioctl_at(7, 0x1000, &data, 8),
            MemoryTransport::Retry,
        );
        let Ok(IoctlReply::Done { result: 0, out }) = r else {
            panic!("{r:?}");
        };
        let ticket = u64::from_ne_bytes(out[..].try_into().unwrap());
        let got = m
            .tickets()
            .redeem(ticket, std::process::id(), Instant::now())
            .map(|t| (t.fh, t.target.node));
        assert_eq!(got.ok(), Some((7, Node::Ctl)));
    }

    #[test]
    fn test_retry_ticket_round_with_wrong_size_is_einval() {
        let m = InstanceMmap::new("inst").unwrap();
        let r = m.ticket_ioctl(
            Node::Ctl,
            &memfd_target(),
            &me(),
            &ioctl_at(7, 0x1000, &[0u8; 12], 8),
            MemoryTransport::Retry,
        );
        assert_eq!(r, Err(Errno::EINVAL));
    }

    #[test]
    fn test_process_vm_ticket_is_written_into_the_callers_struct() {
        let m = InstanceMmap::new("inst").unwrap();
        let mut buf = args().to_bytes();
        let r = m.ticket_ioctl(
            Node::Gpu(0),
            &memfd_target(),
            &me(),
            &ioctl_at(9, buf.as_mut_ptr() as u64, &[], 0),
            MemoryTransport::ProcessVm,
        );
        let written = MmapTicketArgs::from_bytes(&buf).unwrap().ticket;
        let got = m
            .tickets()
            .redeem(written, std::process::id(), Instant::now())
            .map(|t| t.fh);
        assert_eq!((r, got.ok()), (Ok(IoctlReply::result(0)), Some(9)));
    }

    #[test]
    fn test_process_vm_ticket_with_bad_pointer_is_efault_and_issues_nothing() {
        let m = InstanceMmap::new("inst").unwrap();
        let r = m.ticket_ioctl(
            Node::Ctl,
            &memfd_target(),
            &me(),
            &ioctl_at(7, 8, &[], 0),
            MemoryTransport::ProcessVm,
        );
        assert_eq!(
            (r, m.tickets().outstanding(Instant::now())),
            (Err(Errno::EFAULT), 0)
        );
    }

    #[test]
    fn test_ticket_from_outside_our_pid_namespace_is_eperm() {
        let m = InstanceMmap::new("inst").unwrap();
        let r = m.ticket_ioctl(
            Node::Ctl,
            &memfd_target(),
            &Request::detached(1, 0, 0, 0),
            &ioctl_at(7, 0x1000, &[], 0),
            MemoryTransport::Retry,
        );
        assert_eq!(r, Err(Errno::EPERM));
    }

    #[test]
    fn test_released_open_takes_its_tickets_along() {
        let m = InstanceMmap::new("inst").unwrap();
        let t = issue(&m, 7, std::process::id());
        m.released(Node::Gpu(0), 7);
        let other_node = m.tickets().outstanding(Instant::now());
        m.released(Node::Ctl, 7);
        let got = m.tickets().redeem(t, std::process::id(), Instant::now());
        assert_eq!((other_node, got.err()), (1, Some(Refusal::Unknown)));
    }

    #[test]
    fn test_ticket_of_another_instance_gets_nothing() {
        let root = scratch("cross");
        let a = Arc::new(InstanceMmap::new("a").unwrap());
        let b = Arc::new(InstanceMmap::new("b").unwrap());
        let _sa = MmapSocket::start(a.clone(), &root).unwrap();
        let sb = MmapSocket::start(b, &root).unwrap();
        let t = issue(&a, 7, std::process::id());
        assert!(ask(sb.path(), t).is_none());
        drop((_sa, sb));
        let _ = std::fs::remove_dir_all(root);
    }
}
