//! What a [`Session`] itself costs per request, natively (no kernel, no VM): a client thread
//! plays the kernel over a `SOCK_SEQPACKET` pair and sends restricted `FUSE_IOCTL`s one at a
//! time (32 bytes in, 32 out, as an `_IOWR` `NVOS54_PARAMETERS`), answered either by a
//! `Session` whose handler echoes the input, or by the floor: one thread that reads each
//! request and writes the same reply, nothing else. Batches alternate between the two; the
//! output is ns per request for each and the ratio per batch (median, range).
//!
//! `cargo run --release -p cuse-dev --example session_cost -- [ITERS] [BATCHES] [session|floor]`
//! (`FLOOR_THREADS=N`: N floor threads reading the socket, as the session's pool does).

use std::io::{IoSlice, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use cuse_dev::wire::{
    CUSE_INIT, FUSE_IOCTL, FUSE_KERNEL_MINOR_VERSION, FUSE_KERNEL_VERSION, FUSE_OPEN, cuse_init_in,
    fuse_in_header, fuse_ioctl_in, fuse_ioctl_out, fuse_open_in, fuse_out_header,
};
use cuse_dev::{
    DeviceConfig, Errno, Handler, Ioctl, IoctlReply, Opened, Request, Session, seqpacket_pair,
};
use zerocopy::{FromBytes, IntoBytes};

/// `_IOWR('F', 0x2a, NVOS54_PARAMETERS)`.
const CMD: u32 = (3 << 30) | (32 << 16) | ((b'F' as u32) << 8) | 0x2a;
const SIZE: u32 = 32;

struct Echo;

impl Handler for Echo {
    fn open(&self, _req: &Request, _flags: u32) -> Result<Opened, Errno> {
        Ok(Opened::default())
    }
    fn ioctl(&self, _req: &Request, io: &Ioctl<'_>) -> Result<IoctlReply, Errno> {
        Ok(IoctlReply::Done {
            result: 0,
            out: io.in_data.into(),
        })
    }
}

fn message(unique: u64, opcode: u32, body: &[u8]) -> Vec<u8> {
    let hdr = fuse_in_header {
        len: u32::try_from(size_of::<fuse_in_header>() + body.len()).expect("small"),
        opcode,
        unique,
        nodeid: 0,
        uid: 0,
        gid: 0,
        pid: std::process::id(),
        total_extlen: 0,
        padding: 0,
    };
    let mut m = hdr.as_bytes().to_vec();
    m.extend_from_slice(body);
    m
}

/// The client: `n` ioctls, one at a time; returns ns per ioctl.
fn run(sock: &UnixDatagram, fh: u64, n: u32, unique: &mut u64) -> f64 {
    let a = fuse_ioctl_in {
        fh,
        flags: 0,
        cmd: CMD,
        arg: 0x1000,
        in_size: SIZE,
        out_size: SIZE,
    };
    let mut body = a.as_bytes().to_vec();
    body.extend_from_slice(&[7u8; SIZE as usize]);
    let mut msg = message(0, FUSE_IOCTL, &body);
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    for _ in 0..n {
        *unique += 2;
        msg[8..16].copy_from_slice(&unique.to_ne_bytes());
        sock.send(&msg).expect("send");
        let got = sock.recv(&mut buf).expect("recv");
        let (h, _) = fuse_out_header::read_from_prefix(&buf[..got]).expect("reply header");
        assert_eq!((h.unique, h.error), (*unique, 0), "reply");
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// The floor: read a request, write the reply an echoing handler's session writes.
fn floor(fd: OwnedFd) {
    let sock = UnixDatagram::from(fd);
    // Replies go out with one writev, as the session's (a connected seqpacket socket: one
    // writev is one message, as `/dev/cuse` takes it).
    let wfile = match sock.try_clone() {
        Ok(s) => std::fs::File::from(OwnedFd::from(s)),
        Err(_) => return,
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match sock.recv(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let Ok((h, rest)) = fuse_in_header::read_from_prefix(&buf[..n]) else {
            return;
        };
        let data = rest.get(size_of::<fuse_ioctl_in>()..).unwrap_or(&[]);
        let out = fuse_ioctl_out {
            result: 0,
            flags: 0,
            in_iovs: 0,
            out_iovs: 0,
        };
        let len = size_of::<fuse_out_header>() + size_of::<fuse_ioctl_out>() + data.len();
        let oh = fuse_out_header {
            len: u32::try_from(len).expect("small"),
            error: 0,
            unique: h.unique,
        };
        let iov = [
            IoSlice::new(oh.as_bytes()),
            IoSlice::new(out.as_bytes()),
            IoSlice::new(data),
        ];
        if Write::write_vectored(&mut &wfile, &iov).is_err() {
            return;
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let iters: u32 = args.next().map_or(20_000, |a| a.parse().expect("ITERS"));
    let batches: usize = args.next().map_or(7, |a| a.parse().expect("BATCHES"));
    // `session` or `floor`: time only that side (for an instruction count of one side).
    let only = args.next();
    let (with_session, with_floor) = match only.as_deref() {
        None | Some("both") => (true, true),
        Some("session") => (true, false),
        Some("floor") => (false, true),
        Some(o) => panic!("unknown side {o:?}: session, floor or both"),
    };

    // The session, after CUSE_INIT and one open.
    let (ours, theirs) = seqpacket_pair().expect("socketpair");
    let session = Session::from_fd(ours, DeviceConfig::new("bench/session-cost")).expect("session");
    let control = session.control();
    let server = thread::spawn(move || session.run(Arc::new(Echo)));
    let client = UnixDatagram::from(theirs);
    let mut buf = vec![0u8; 4096];
    let init = cuse_init_in {
        major: FUSE_KERNEL_VERSION,
        minor: FUSE_KERNEL_MINOR_VERSION,
        unused: 0,
        flags: 0,
    };
    client
        .send(&message(2, CUSE_INIT, init.as_bytes()))
        .expect("init");
    client.recv(&mut buf).expect("init reply");
    let open = fuse_open_in {
        flags: libc::O_RDWR as u32,
        open_flags: 0,
    };
    client
        .send(&message(4, FUSE_OPEN, open.as_bytes()))
        .expect("open");
    client.recv(&mut buf).expect("open reply");

    let (f_ours, f_theirs) = seqpacket_pair().expect("socketpair");
    let floor_threads =
        std::env::var("FLOOR_THREADS").map_or(1, |v| v.parse().expect("FLOOR_THREADS"));
    let f_ours = Arc::new(f_ours);
    let floor_threads: Vec<_> = (0..floor_threads)
        .map(|_| {
            let fd = f_ours.try_clone().expect("dup");
            thread::spawn(move || floor(fd))
        })
        .collect();
    drop(f_ours);
    let floor_client = UnixDatagram::from(f_theirs);

    let mut unique = 4;
    let mut funique = 0;
    // Warm-up.
    run(&client, 0, iters / 10 + 1, &mut unique);
    run(&floor_client, 0, iters / 10 + 1, &mut funique);
    let (mut s, mut f, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..batches {
        let a = if with_session {
            run(&client, 0, iters, &mut unique)
        } else {
            f64::NAN
        };
        let b = if with_floor {
            run(&floor_client, 0, iters, &mut funique)
        } else {
            f64::NAN
        };
        s.push(a);
        f.push(b);
        r.push(a / b);
    }
    let (lo, hi) = r
        .iter()
        .fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
    println!(
        "session {:.0} ns/ioctl, floor {:.0} ns/ioctl, session / floor {:.2}x ({lo:.2}-{hi:.2}), \
         {batches} batches of {iters}",
        median(&mut s),
        median(&mut f),
        median(&mut r)
    );
    control.stop();
    drop(client);
    drop(floor_client);
    let _ = server.join();
    for t in floor_threads {
        let _ = t.join();
    }
}
