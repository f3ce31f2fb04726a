//! An in-process "kernel peer": speaks the CUSE protocol to a [`Session`] over a
//! `SOCK_SEQPACKET` socketpair, playing the kernel's part (including the unrestricted-ioctl
//! retry loop against a simulated client memory).
#![allow(dead_code)] // each test binary uses a different part

pub mod device;

/// A test message's length as the FUSE headers hold it.
pub fn len32(n: usize) -> u32 {
    u32::try_from(n).expect("a short test message")
}

use std::collections::{BTreeMap, HashMap};
use std::net::Shutdown;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use cuse_dev::wire::{
    CUSE_INIT, FUSE_INTERRUPT, FUSE_IOCTL, FUSE_IOCTL_MAX_BYTES, FUSE_IOCTL_MAX_IOV,
    FUSE_IOCTL_RETRY, FUSE_IOCTL_UNRESTRICTED, FUSE_OPEN, FUSE_READ, FUSE_RELEASE, FUSE_WRITE,
    cuse_init_in, cuse_init_out, fuse_in_header, fuse_interrupt_in, fuse_ioctl_in,
    fuse_ioctl_iovec, fuse_ioctl_out, fuse_open_in, fuse_open_out, fuse_out_header, fuse_read_in,
    fuse_release_in, fuse_write_in, fuse_write_out,
};
use cuse_dev::{CuseError, DeviceConfig, Handler, Session, SessionControl, seqpacket_pair};
use zerocopy::{FromBytes, IntoBytes};

/// How long a test waits for any one reply before failing.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// One message from the session.
#[derive(Debug, Clone)]
pub struct Reply {
    pub header: fuse_out_header,
    pub body: Vec<u8>,
}

impl Reply {
    /// The errno of an error reply (positive), or 0.
    pub fn errno(&self) -> i32 {
        -self.header.error
    }

    pub fn parse<T: FromBytes>(&self) -> T {
        T::read_from_prefix(&self.body)
            .expect("reply body too short")
            .0
    }
}

/// Things the peer's reader saw that a correct server never sends.
#[derive(Debug, Default)]
pub struct Violations(pub Vec<String>);

pub struct Peer {
    sock: Arc<UnixDatagram>,
    pending: Arc<Mutex<HashMap<u64, mpsc::Sender<Reply>>>>,
    answered: Arc<Mutex<HashMap<u64, usize>>>,
    notifications: Mutex<mpsc::Receiver<Reply>>,
    unmatched: Mutex<mpsc::Receiver<Reply>>,
    pub violations: Arc<Mutex<Violations>>,
    next: AtomicU64,
    reader: Option<JoinHandle<()>>,
}

impl Peer {
    pub fn new(sock: UnixDatagram) -> Self {
        let sock = Arc::new(sock);
        let pending: Arc<Mutex<HashMap<u64, mpsc::Sender<Reply>>>> = Arc::default();
        let answered: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
        let violations: Arc<Mutex<Violations>> = Arc::default();
        let (ntx, nrx) = mpsc::channel();
        let (utx, urx) = mpsc::channel();
        let reader = {
            let (sock, pending, answered, violations) = (
                sock.clone(),
                pending.clone(),
                answered.clone(),
                violations.clone(),
            );
            thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = match sock.recv(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    let bytes = &buf[..n];
                    let Ok((header, body)) = fuse_out_header::read_from_prefix(bytes) else {
                        violations
                            .lock()
                            .unwrap()
                            .0
                            .push(format!("short reply of {n} bytes"));
                        continue;
                    };
                    if header.len as usize != n {
                        violations
                            .lock()
                            .unwrap()
                            .0
                            .push(format!("len {} but {n} bytes", header.len));
                    }
                    if header.unique != 0 && !(-511..=0).contains(&header.error) {
                        violations
                            .lock()
                            .unwrap()
                            .0
                            .push(format!("bad error {}", header.error));
                    }
                    if header.unique != 0 && header.error != 0 && !body.is_empty() {
                        violations
                            .lock()
                            .unwrap()
                            .0
                            .push("error reply with a body".into());
                    }
                    let reply = Reply {
                        header,
                        body: body.to_vec(),
                    };
                    if header.unique == 0 {
                        let _ = ntx.send(reply);
                        continue;
                    }
                    if header.unique & 1 == 1 && header.error == -libc::EAGAIN && body.is_empty() {
                        // A reply to an interrupt (the kernel's FUSE_INT_REQ_BIT): as
                        // `fuse_dev_do_write`, queue the interrupt again while its target waits
                        // for a reply, else drop it (the kernel's write fails with ENOENT).
                        let target = header.unique & !1;
                        if pending.lock().unwrap().contains_key(&target) {
                            let _ = sock.send(&interrupt_message(target));
                        }
                        continue;
                    }
                    *answered.lock().unwrap().entry(header.unique).or_default() += 1;
                    match pending.lock().unwrap().remove(&header.unique) {
                        Some(tx) => {
                            let _ = tx.send(reply);
                        }
                        None => {
                            let _ = utx.send(reply);
                        }
                    }
                }
            })
        };
        Peer {
            sock,
            pending,
            answered,
            notifications: Mutex::new(nrx),
            unmatched: Mutex::new(urx),
            violations,
            next: AtomicU64::new(2),
            reader: Some(reader),
        }
    }

    /// A fresh request id (even, as the kernel's; the kernel sets bit 0 only for interrupts).
    pub fn unique(&self) -> u64 {
        self.next.fetch_add(2, Ordering::SeqCst)
    }

    pub fn send_raw(&self, bytes: &[u8]) {
        self.sock.send(bytes).expect("send to session");
    }

    /// Sends raw bytes as a request whose reply (if any) is expected for `unique`.
    pub fn expect_raw(&self, unique: u64, bytes: &[u8]) -> mpsc::Receiver<Reply> {
        let (tx, rx) = mpsc::channel();
        self.pending.lock().unwrap().insert(unique, tx);
        self.send_raw(bytes);
        rx
    }

    /// Sends a request with the given unique and body; the reply comes on the receiver.
    pub fn send_with(
        &self,
        unique: u64,
        opcode: u32,
        pid: u32,
        body: &[u8],
    ) -> mpsc::Receiver<Reply> {
        let (tx, rx) = mpsc::channel();
        self.pending.lock().unwrap().insert(unique, tx);
        let hdr = fuse_in_header {
            len: len32(size_of::<fuse_in_header>() + body.len()),
            opcode,
            unique,
            nodeid: 0,
            uid: 1000,
            gid: 1000,
            pid,
            total_extlen: 0,
            padding: 0,
        };
        let mut msg = hdr.as_bytes().to_vec();
        msg.extend_from_slice(body);
        self.send_raw(&msg);
        rx
    }

    /// Sends a request; returns its unique and where its reply will come.
    pub fn start(&self, opcode: u32, body: &[u8]) -> (u64, mpsc::Receiver<Reply>) {
        let unique = self.unique();
        (unique, self.send_with(unique, opcode, 4242, body))
    }

    pub fn call(&self, opcode: u32, body: &[u8]) -> Reply {
        let (unique, rx) = self.start(opcode, body);
        wait(&rx, unique)
    }

    pub fn init(&self, major: u32, minor: u32, flags: u32) -> Reply {
        self.call(
            CUSE_INIT,
            cuse_init_in {
                major,
                minor,
                unused: 0,
                flags,
            }
            .as_bytes(),
        )
    }

    pub fn open(&self) -> u64 {
        let r = self.call(
            FUSE_OPEN,
            fuse_open_in {
                flags: libc::O_RDWR as u32,
                open_flags: 0,
            }
            .as_bytes(),
        );
        assert_eq!(r.errno(), 0, "open failed");
        r.parse::<fuse_open_out>().fh
    }

    pub fn release(&self, fh: u64) {
        let body = fuse_release_in {
            fh,
            flags: 0,
            release_flags: 0,
            lock_owner: 0,
        };
        let r = self.call(FUSE_RELEASE, body.as_bytes());
        assert_eq!((r.errno(), r.body.len()), (0, 0));
    }

    pub fn read(&self, fh: u64, size: u32) -> Result<Vec<u8>, i32> {
        let body = fuse_read_in {
            fh,
            offset: 0,
            size,
            ..Default::default()
        };
        let r = self.call(FUSE_READ, body.as_bytes());
        if r.errno() != 0 {
            Err(r.errno())
        } else {
            Ok(r.body)
        }
    }

    pub fn write(&self, fh: u64, data: &[u8]) -> Result<u32, i32> {
        let arg = fuse_write_in {
            fh,
            offset: 0,
            size: len32(data.len()),
            ..Default::default()
        };
        let mut body = arg.as_bytes().to_vec();
        body.extend_from_slice(data);
        let r = self.call(FUSE_WRITE, &body);
        if r.errno() != 0 {
            Err(r.errno())
        } else {
            Ok(r.parse::<fuse_write_out>().size)
        }
    }

    pub fn interrupt(&self, target: u64) {
        self.send_raw(&interrupt_message(target));
    }

    /// Sends one FUSE_IOCTL round.
    pub fn start_ioctl(
        &self,
        fh: u64,
        flags: u32,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        out_size: u32,
    ) -> (u64, mpsc::Receiver<Reply>) {
        let a = fuse_ioctl_in {
            fh,
            flags,
            cmd,
            arg,
            in_size: len32(in_data.len()),
            out_size,
        };
        let mut body = a.as_bytes().to_vec();
        body.extend_from_slice(in_data);
        self.start(FUSE_IOCTL, &body)
    }

    /// Plays the kernel's `fuse_do_ioctl`: restricted ioctls copy `_IOC_SIZE(cmd)` bytes as
    /// `_IOC_DIR(cmd)` says; unrestricted ones follow RETRY replies, copying the named regions
    /// from `mem`, until a final reply, whose data is written back to the last out regions.
    pub fn ioctl(
        &self,
        fh: u64,
        cmd: u32,
        arg: u64,
        unrestricted: bool,
        mem: &Memory,
    ) -> IoctlResult {
        let (mut in_iovs, mut out_iovs) = (Vec::new(), Vec::new());
        if !unrestricted {
            let size = u64::from((cmd >> 16) & 0x3fff);
            let dir = cmd >> 30;
            if dir & 1 != 0 {
                in_iovs.push((arg, size));
            }
            if dir & 2 != 0 {
                out_iovs.push((arg, size));
            }
        }
        let flags = if unrestricted {
            FUSE_IOCTL_UNRESTRICTED
        } else {
            0
        };
        let mut retries = 0;
        loop {
            let mut in_data = Vec::new();
            for &(base, len) in &in_iovs {
                match mem.read(base, len) {
                    Some(bytes) => in_data.extend_from_slice(&bytes),
                    None => {
                        return IoctlResult {
                            result: Err(libc::EFAULT),
                            retries,
                        };
                    }
                }
            }
            let out_size: u64 = out_iovs.iter().map(|&(_, l)| l).sum();
            let (unique, rx) = self.start_ioctl(
                fh,
                flags,
                cmd,
                arg,
                &in_data,
                u32::try_from(out_size).expect("small test iovecs"),
            );
            let reply = wait(&rx, unique);
            if reply.errno() != 0 {
                return IoctlResult {
                    result: Err(reply.errno()),
                    retries,
                };
            }
            let (out, rest) =
                fuse_ioctl_out::read_from_prefix(&reply.body).expect("short ioctl reply");
            if out.flags & FUSE_IOCTL_RETRY != 0 {
                assert!(
                    unrestricted,
                    "RETRY on a restricted ioctl reached the kernel"
                );
                let count = (out.in_iovs + out.out_iovs) as usize;
                assert!(
                    count <= FUSE_IOCTL_MAX_IOV,
                    "too many iovecs reached the kernel"
                );
                assert_eq!(rest.len(), count * 16, "iovec array length");
                let iovs = <[fuse_ioctl_iovec]>::ref_from_bytes(rest)
                    .map(|s| s.to_vec())
                    .unwrap_or_else(|_| {
                        rest.chunks_exact(16)
                            .map(|c| fuse_ioctl_iovec::read_from_bytes(c).unwrap())
                            .collect()
                    });
                let (i, o) = iovs.split_at(out.in_iovs as usize);
                in_iovs = i.iter().map(|v| (v.base, v.len)).collect();
                out_iovs = o.iter().map(|v| (v.base, v.len)).collect();
                for dir in [&in_iovs, &out_iovs] {
                    let total: u64 = dir.iter().map(|&(_, l)| l).sum();
                    assert!(
                        total <= FUSE_IOCTL_MAX_BYTES,
                        "oversized retry reached the kernel"
                    );
                }
                retries += 1;
                assert!(retries <= 32, "endless retry loop");
                continue;
            }
            assert!(rest.len() as u64 <= out_size, "more output than out_size");
            let mut data = rest;
            for &(base, len) in &out_iovs {
                let n = usize::try_from(len).unwrap_or(usize::MAX).min(data.len());
                mem.write(base, &data[..n]);
                data = &data[n..];
            }
            return IoctlResult {
                result: Ok(out.result),
                retries,
            };
        }
    }

    pub fn next_notification(&self, timeout: Duration) -> Option<Reply> {
        self.notifications
            .lock()
            .unwrap()
            .recv_timeout(timeout)
            .ok()
    }

    pub fn unmatched(&self, timeout: Duration) -> Option<Reply> {
        self.unmatched.lock().unwrap().recv_timeout(timeout).ok()
    }

    /// How many replies each unique got.
    pub fn answered(&self) -> HashMap<u64, usize> {
        self.answered.lock().unwrap().clone()
    }

    /// Whether the session closed its end of the connection (every thread holding it exited)
    /// within `timeout`.
    pub fn closed_by_session(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.reader.as_ref().is_none_or(|r| r.is_finished()) {
            if Instant::now() > deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Ends the connection (the session reads end-of-file) and stops the reader.
    pub fn close(&mut self) {
        let _ = self.sock.shutdown(Shutdown::Both);
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

/// A `FUSE_INTERRUPT` for `target`, as the kernel sends it: the target's unique with bit 0 set.
pub fn interrupt_message(target: u64) -> Vec<u8> {
    let hdr = fuse_in_header {
        len: len32(size_of::<fuse_in_header>() + 8),
        opcode: FUSE_INTERRUPT,
        unique: target | 1,
        pid: 4242,
        ..Default::default()
    };
    let mut msg = hdr.as_bytes().to_vec();
    msg.extend_from_slice(fuse_interrupt_in { unique: target }.as_bytes());
    msg
}

pub fn wait(rx: &mpsc::Receiver<Reply>, unique: u64) -> Reply {
    rx.recv_timeout(REPLY_TIMEOUT)
        .unwrap_or_else(|_| panic!("no reply to request {unique} in time"))
}

#[derive(Debug)]
pub struct IoctlResult {
    pub result: Result<i32, i32>,
    pub retries: usize,
}

/// Simulated client memory: a byte map keyed by address. Unmapped bytes fault (EFAULT).
#[derive(Debug, Default)]
pub struct Memory(Mutex<BTreeMap<u64, u8>>);

impl Memory {
    pub fn write(&self, addr: u64, bytes: &[u8]) {
        let mut m = self.0.lock().unwrap();
        for (i, b) in bytes.iter().enumerate() {
            m.insert(addr + i as u64, *b);
        }
    }

    pub fn read(&self, addr: u64, len: u64) -> Option<Vec<u8>> {
        let m = self.0.lock().unwrap();
        (0..len).map(|i| m.get(&(addr + i)).copied()).collect()
    }
}

/// A session on one end of a socketpair, run on its own thread, and the peer on the other end.
pub struct Harness {
    pub peer: Peer,
    pub control: SessionControl,
    thread: Option<JoinHandle<Result<(), CuseError>>>,
}

impl Harness {
    /// Starts the session; nothing is sent yet.
    pub fn start(cfg: DeviceConfig, handler: Arc<dyn Handler>) -> Self {
        let (ours, theirs) = seqpacket_pair().unwrap();
        let session = Session::from_fd(ours, cfg).unwrap();
        let control = session.control();
        let thread = thread::spawn(move || session.run(handler));
        Harness {
            peer: Peer::new(UnixDatagram::from(theirs)),
            control,
            thread: Some(thread),
        }
    }

    /// Starts the session and completes CUSE_INIT as a 7.41 kernel would.
    pub fn started(cfg: DeviceConfig, handler: Arc<dyn Handler>) -> Self {
        let h = Self::start(cfg, handler);
        let r = h.peer.init(7, 41, 1);
        assert_eq!(r.errno(), 0);
        let out: cuse_init_out = r.parse();
        assert_eq!(out.major, 7);
        assert!(h.control.wait_init(REPLY_TIMEOUT).is_some());
        h
    }

    /// Waits for `run` to return (after the peer closed or `stop`).
    pub fn join(&mut self) -> Result<(), CuseError> {
        let t = self.thread.take().expect("joined twice");
        let deadline = Instant::now() + REPLY_TIMEOUT;
        while !t.is_finished() {
            assert!(Instant::now() < deadline, "session did not return in time");
            thread::sleep(Duration::from_millis(5));
        }
        t.join().expect("session thread panicked")
    }

    /// Closes the connection and checks that the session returned `Ok` and nothing malformed
    /// or unmatched was sent.
    pub fn finish(mut self) {
        self.peer.close();
        self.join().expect("session returned an error");
        let v = &self.peer.violations.lock().unwrap().0;
        assert!(v.is_empty(), "protocol violations: {v:?}");
        assert!(
            self.peer.unmatched(Duration::ZERO).is_none(),
            "reply to an unknown request"
        );
        assert!(
            self.peer.answered().values().all(|&n| n == 1),
            "a request answered twice"
        );
    }
}

/// Waits until `cond` holds, polling every 5 ms, for at most `REPLY_TIMEOUT`; panics naming
/// `what` if it never does. Replaces sleep-then-assert: the test goes on as soon as the
/// state is there, and a slow machine only makes it wait longer, not fail.
pub fn eventually(what: &str, cond: impl FnMut() -> bool) {
    assert!(
        test_kit::eventually(REPLY_TIMEOUT, cond),
        "never happened: {what}"
    );
}
