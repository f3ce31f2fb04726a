//! Hostile input without a fuzzer (stable toolchain, deterministic): many pseudo-random and
//! mutated requests through the parser, and through a whole session against a test handler.
//! Nothing may panic, every reply must be well-formed, and the session must keep serving.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Harness, len32};
use cuse_dev::wire::{
    CUSE_INIT, FUSE_DESTROY, FUSE_FLUSH, FUSE_FSYNC, FUSE_INTERRUPT, FUSE_IOCTL,
    FUSE_IOCTL_UNRESTRICTED, FUSE_OPEN, FUSE_POLL, FUSE_POLL_SCHEDULE_NOTIFY, FUSE_READ,
    FUSE_RELEASE, FUSE_WRITE, Op, cuse_init_in, fuse_flush_in, fuse_fsync_in, fuse_in_header,
    fuse_interrupt_in, fuse_ioctl_in, fuse_open_in, fuse_open_out, fuse_poll_in, fuse_read_in,
    fuse_release_in, fuse_write_in, parse_request,
};
use cuse_dev::{
    DeviceConfig, Errno, Handler, IoVec, Ioctl, IoctlReply, Opened, PollHandle, Request,
};
use zerocopy::IntoBytes;

/// xorshift64*: small, deterministic, good enough to spread bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Below `n`, as an index or length.
    fn index(&mut self, n: usize) -> usize {
        usize::try_from(self.below(n as u64)).expect("below a usize")
    }

    /// Below `n`, as a u32 field.
    fn below32(&mut self, n: u32) -> u32 {
        u32::try_from(self.below(u64::from(n))).expect("below a u32")
    }

    /// A random u32 (the low half of the next value).
    fn u32(&mut self) -> u32 {
        (self.next() & 0xffff_ffff) as u32
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next().to_le_bytes()[0]).collect()
    }
}

const OPCODES: [u32; 12] = [
    CUSE_INIT,
    FUSE_OPEN,
    FUSE_RELEASE,
    FUSE_READ,
    FUSE_WRITE,
    FUSE_FLUSH,
    FUSE_FSYNC,
    FUSE_INTERRUPT,
    FUSE_IOCTL,
    FUSE_POLL,
    FUSE_DESTROY,
    1,
];

/// A well-formed request of a random kind, with a unique below 2^32.
fn valid_request(rng: &mut Rng) -> Vec<u8> {
    let opcode = OPCODES[rng.index(OPCODES.len())];
    let fh = rng.below(4);
    let body: Vec<u8> = match opcode {
        CUSE_INIT => cuse_init_in {
            major: 7,
            minor: 41,
            unused: 0,
            flags: 1,
        }
        .as_bytes()
        .to_vec(),
        FUSE_OPEN => fuse_open_in {
            flags: 2,
            open_flags: 0,
        }
        .as_bytes()
        .to_vec(),
        FUSE_RELEASE => fuse_release_in {
            fh,
            ..Default::default()
        }
        .as_bytes()
        .to_vec(),
        FUSE_READ => {
            let size = rng.below32(200);
            fuse_read_in {
                fh,
                size,
                ..Default::default()
            }
            .as_bytes()
            .to_vec()
        }
        FUSE_WRITE => {
            let n = rng.index(64);
            let data = rng.bytes(n);
            let arg = fuse_write_in {
                fh,
                size: len32(data.len()),
                ..Default::default()
            };
            [arg.as_bytes(), &data].concat()
        }
        FUSE_FLUSH => fuse_flush_in {
            fh,
            ..Default::default()
        }
        .as_bytes()
        .to_vec(),
        FUSE_FSYNC => fuse_fsync_in {
            fh,
            ..Default::default()
        }
        .as_bytes()
        .to_vec(),
        FUSE_INTERRUPT => fuse_interrupt_in {
            unique: rng.below(64) * 2,
        }
        .as_bytes()
        .to_vec(),
        FUSE_IOCTL => {
            let n = rng.index(3) * 4;
            let data = rng.bytes(n);
            let arg = fuse_ioctl_in {
                fh,
                flags: if rng.below(2) == 0 {
                    FUSE_IOCTL_UNRESTRICTED
                } else {
                    0
                },
                cmd: rng.below32(8),
                arg: rng.next(),
                in_size: len32(data.len()),
                out_size: rng.below32(16),
            };
            [arg.as_bytes(), &data].concat()
        }
        FUSE_POLL => {
            let flags = rng.below32(2) * FUSE_POLL_SCHEDULE_NOTIFY;
            fuse_poll_in {
                fh,
                kh: rng.next(),
                flags,
                events: 1,
            }
            .as_bytes()
            .to_vec()
        }
        _ => Vec::new(),
    };
    let hdr = fuse_in_header {
        len: len32(40 + body.len()),
        opcode,
        unique: rng.below(1 << 32),
        pid: rng.below32(100_000),
        ..Default::default()
    };
    [hdr.as_bytes(), &body].concat()
}

/// A mutated request: byte flips, truncation, extension, a wrong or fixed-up `len`, a random
/// opcode. Never empty (an empty message reads as end-of-file on a socket).
fn mutated_request(rng: &mut Rng) -> Vec<u8> {
    let mut m = valid_request(rng);
    for _ in 0..=rng.below(3) {
        match rng.below(6) {
            0 => {
                for _ in 0..=rng.below(4) {
                    let i = rng.index(m.len());
                    m[i] ^= 1 << rng.below(8);
                }
            }
            1 => m.truncate(1 + rng.index(m.len())),
            2 => {
                let n = 1 + rng.index(64);
                let extra = rng.bytes(n);
                m.extend_from_slice(&extra);
            }
            3 if m.len() >= 4 => m[..4].copy_from_slice(&rng.u32().to_ne_bytes()),
            4 if m.len() >= 8 => m[4..8].copy_from_slice(&rng.u32().to_ne_bytes()),
            // Random field values in the body (flags, sizes, handles).
            5 if m.len() > 48 => {
                let i = 40 + rng.index(m.len() - 44);
                m[i..i + 4].copy_from_slice(&rng.u32().to_ne_bytes());
            }
            _ => {}
        }
    }
    if rng.below(2) == 0 && m.len() >= 4 {
        // Make `len` agree so parsing gets past the header checks.
        let len = len32(m.len());
        m[..4].copy_from_slice(&len.to_ne_bytes());
    }
    m
}

#[test]
fn parser_survives_random_and_mutated_bytes() {
    let mut rng = Rng(0x5eed_cafe_f00d_1234);
    let mut ok = 0;
    for i in 0..100_000 {
        let bytes = match i % 3 {
            0 => {
                let n = 1 + rng.index(128);
                rng.bytes(n)
            }
            _ => mutated_request(&mut rng),
        };
        if let Ok(m) = parse_request(&bytes) {
            ok += 1;
            assert_eq!(m.header.len as usize, bytes.len());
            match &m.op {
                Op::Write(a, d) => assert_eq!(a.size as usize, d.len()),
                Op::Ioctl(a, d) => assert_eq!(a.in_size as usize, d.len()),
                _ => {}
            }
            let _ = m.op.into_owned();
        }
    }
    // The mutator keeps a fair share parseable, so the deeper paths are reached too.
    assert!(ok > 10_000, "only {ok} parsed");
}

/// Answers everything at once, with replies that are valid for the request.
struct QuickHandler {
    fh: AtomicU64,
}

impl Handler for QuickHandler {
    fn open(&self, _req: &Request, _flags: u32) -> Result<Opened, Errno> {
        Ok(Opened {
            fh: self.fh.fetch_add(1, Ordering::Relaxed),
            open_flags: 0,
        })
    }

    fn read(&self, _req: &Request, _fh: u64, _off: u64, size: u32) -> Result<Vec<u8>, Errno> {
        Ok(vec![7; size.min(16) as usize])
    }

    fn write(&self, _req: &Request, _fh: u64, _off: u64, data: &[u8]) -> Result<u32, Errno> {
        Ok(len32(data.len()))
    }

    fn ioctl(&self, _req: &Request, io: &Ioctl<'_>) -> Result<IoctlReply, Errno> {
        match io.cmd % 4 {
            0 => Ok(IoctlReply::Done {
                result: 1,
                out: vec![1; io.out_size.min(8) as usize].into(),
            }),
            1 if io.in_data.is_empty() => Ok(IoctlReply::Retry {
                in_iovs: vec![IoVec::new(io.arg, 4)],
                out_iovs: vec![IoVec::new(io.arg, 4)],
            }),
            2 => Ok(IoctlReply::Retry {
                in_iovs: vec![IoVec::new(io.arg, 1 << 20)],
                out_iovs: vec![],
            }),
            _ => Err(Errno::ENOTTY),
        }
    }

    fn poll(
        &self,
        _r: &Request,
        _fh: u64,
        _ev: u32,
        notify: Option<PollHandle>,
    ) -> Result<u32, Errno> {
        if let Some(n) = notify {
            let _ = n.notify();
        }
        Ok(1)
    }
}

#[test]
fn session_survives_random_and_mutated_requests() {
    let handler = Arc::new(QuickHandler {
        fh: AtomicU64::new(1),
    });
    let mut h = Harness::started(DeviceConfig::new("robustness"), handler);
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let mut sent = HashSet::new();
    for i in 0..4000 {
        let bytes = if i % 4 == 0 {
            valid_request(&mut rng)
        } else {
            mutated_request(&mut rng)
        };
        if bytes.len() >= 16 {
            sent.insert(u64::from_ne_bytes(bytes[8..16].try_into().unwrap()));
        }
        h.peer.send_raw(&bytes);
    }
    // Still serving, and in order with everything before it read: a fresh unique outside the
    // random range.
    let unique = 1 << 40;
    let open = fuse_in_header {
        len: 48,
        opcode: FUSE_OPEN,
        unique,
        ..Default::default()
    };
    let rx = h.peer.expect_raw(
        unique,
        &[open.as_bytes(), fuse_open_in::default().as_bytes()].concat(),
    );
    let reply = common::wait(&rx, unique);
    assert_eq!(reply.errno(), 0);
    let _: fuse_open_out = reply.parse();

    // Let the last replies arrive, then check what came back.
    std::thread::sleep(Duration::from_millis(200));
    let mut replies = 0;
    while let Some(r) = h.peer.unmatched(Duration::from_millis(50)) {
        assert!(
            sent.contains(&r.header.unique),
            "reply for a unique never sent: {r:?}"
        );
        replies += 1;
    }
    while let Some(n) = h.peer.next_notification(Duration::ZERO) {
        assert_eq!(
            (n.header.len, n.header.error),
            (24, 1),
            "bad notification {n:?}"
        );
    }
    assert!(replies > 1000, "only {replies} replies");
    h.peer.close();
    h.join().expect("session ended with an error");
    let v = &h.peer.violations.lock().unwrap().0;
    assert!(v.is_empty(), "malformed replies: {v:?}");
}
