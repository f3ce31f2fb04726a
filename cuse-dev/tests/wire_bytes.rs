//! Byte-vector tests: every request kind parsed from, and every reply kind encoded to,
//! hand-written little-endian byte arrays (the layouts of include/uapi/linux/fuse.h).
#![cfg(target_endian = "little")]

use cuse_dev::Errno;
use cuse_dev::wire::*;

/// `fuse_in_header` bytes: len, opcode, unique, nodeid 0, uid 1000, gid 1000, pid 4660,
/// total_extlen 0, padding 0.
macro_rules! in_header {
    ($len:expr, $op_lo:expr, $op_hi:expr, $unique:expr) => {
        [
            $len, 0, 0, 0, $op_lo, $op_hi, 0, 0, // len, opcode
            $unique, 0, 0, 0, 0, 0, 0, 0, // unique
            0, 0, 0, 0, 0, 0, 0, 0, // nodeid
            0xe8, 0x03, 0, 0, 0xe8, 0x03, 0, 0, // uid 1000, gid 1000
            0x34, 0x12, 0, 0, 0, 0, 0, 0, // pid 0x1234, total_extlen, padding
        ]
    };
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn cuse_init_request() {
    let bytes = cat(&[
        &in_header!(56, 0x00, 0x10, 2), // CUSE_INIT = 4096
        &[7, 0, 0, 0, 41, 0, 0, 0],     // major 7, minor 41
        &[0, 0, 0, 0, 1, 0, 0, 0],      // unused, flags CUSE_UNRESTRICTED_IOCTL
    ]);
    let m = parse_request(&bytes).unwrap();
    assert_eq!(m.header.opcode, CUSE_INIT);
    assert_eq!(
        (m.header.unique, m.header.uid, m.header.gid, m.header.pid),
        (2, 1000, 1000, 0x1234)
    );
    assert_eq!(
        m.op,
        Op::Init(cuse_init_in {
            major: 7,
            minor: 41,
            unused: 0,
            flags: 1
        })
    );
}

#[test]
fn cuse_init_reply() {
    let out = cuse_init_out {
        major: 7,
        minor: 31,
        unused: 0,
        flags: CUSE_UNRESTRICTED_IOCTL,
        max_read: 0x2_0000,
        max_write: 0x1000,
        dev_major: 120,
        dev_minor: 3,
        spare: [0; 10],
    };
    let got = encode_reply(2, Ok(&ReplyBody::Init(out, devinfo("a/b")))).unwrap();
    let want = cat(&[
        &[100, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0], // len 16+72+12, error 0, unique 2
        &[7, 0, 0, 0, 31, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],  // major, minor, unused, flags
        &[0, 0, 2, 0, 0, 0x10, 0, 0],                        // max_read 128 KiB, max_write 4 KiB
        &[120, 0, 0, 0, 3, 0, 0, 0],                         // dev_major, dev_minor
        &[0; 40],                                            // spare
        b"DEVNAME=a/b\0",
    ]);
    assert_eq!(got, want);
}

#[test]
fn open_request_and_reply() {
    let bytes = cat(&[&in_header!(48, 14, 0, 4), &[2, 0, 0, 0, 0, 0, 0, 0]]); // O_RDWR
    let m = parse_request(&bytes).unwrap();
    assert_eq!(
        m.op,
        Op::Open(fuse_open_in {
            flags: 2,
            open_flags: 0
        })
    );

    let body = ReplyBody::Open(fuse_open_out {
        fh: 0x1122_3344_5566_7788,
        open_flags: 4,
        padding: 0,
    });
    let want = [
        32, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, // header
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // fh
        4, 0, 0, 0, 0, 0, 0, 0, // FOPEN_NONSEEKABLE, padding
    ];
    assert_eq!(encode_reply(4, Ok(&body)).unwrap(), want);
}

#[test]
fn release_flush_fsync_destroy_requests_and_empty_reply() {
    let release = cat(&[
        &in_header!(64, 18, 0, 6),
        &[7, 0, 0, 0, 0, 0, 0, 0], // fh 7
        &[2, 0, 0, 0, 1, 0, 0, 0], // flags O_RDWR, release_flags FUSE_RELEASE_FLUSH
        &[0; 8],                   // lock_owner
    ]);
    let m = parse_request(&release).unwrap();
    assert_eq!(
        m.op,
        Op::Release(fuse_release_in {
            fh: 7,
            flags: 2,
            release_flags: 1,
            lock_owner: 0
        })
    );

    let flush = cat(&[
        &in_header!(64, 25, 0, 8),
        &[7, 0, 0, 0, 0, 0, 0, 0],
        &[0; 16],
    ]);
    assert_eq!(
        parse_request(&flush).unwrap().op,
        Op::Flush(fuse_flush_in {
            fh: 7,
            ..Default::default()
        })
    );

    let fsync = cat(&[
        &in_header!(56, 20, 0, 10),
        &[7, 0, 0, 0, 0, 0, 0, 0],
        &[1, 0, 0, 0, 0, 0, 0, 0],
    ]);
    let want = fuse_fsync_in {
        fh: 7,
        fsync_flags: 1,
        padding: 0,
    };
    assert_eq!(parse_request(&fsync).unwrap().op, Op::Fsync(want));

    let destroy = in_header!(40, 38, 0, 12);
    assert_eq!(parse_request(&destroy).unwrap().op, Op::Destroy);

    let empty = [16, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(encode_reply(6, Ok(&ReplyBody::Empty)).unwrap(), empty);
}

#[test]
fn read_request_and_data_reply() {
    let bytes = cat(&[
        &in_header!(80, 15, 0, 14),
        &[7, 0, 0, 0, 0, 0, 0, 0],    // fh
        &[0x10, 0, 0, 0, 0, 0, 0, 0], // offset 16
        &[0, 0x10, 0, 0, 0, 0, 0, 0], // size 4096, read_flags 0
        &[0; 8],                      // lock_owner
        &[2, 0, 0, 0, 0, 0, 0, 0],    // flags, padding
    ]);
    let want = fuse_read_in {
        fh: 7,
        offset: 16,
        size: 4096,
        flags: 2,
        ..Default::default()
    };
    assert_eq!(parse_request(&bytes).unwrap().op, Op::Read(want));
    let reply = encode_reply(14, Ok(&ReplyBody::Data(b"abc".to_vec()))).unwrap();
    assert_eq!(
        reply,
        [
            19, 0, 0, 0, 0, 0, 0, 0, 14, 0, 0, 0, 0, 0, 0, 0, b'a', b'b', b'c'
        ]
    );
}

#[test]
fn write_request_and_reply() {
    let bytes = cat(&[
        &in_header!(83, 16, 0, 16),
        &[7, 0, 0, 0, 0, 0, 0, 0], // fh
        &[0; 8],                   // offset
        &[3, 0, 0, 0, 0, 0, 0, 0], // size 3, write_flags
        &[0; 8],                   // lock_owner
        &[2, 0, 0, 0, 0, 0, 0, 0], // flags, padding
        b"xyz",
    ]);
    let m = parse_request(&bytes).unwrap();
    let Op::Write(arg, data) = m.op else {
        panic!("{:?}", m.op)
    };
    assert_eq!((arg.fh, arg.size, &*data), (7, 3, &b"xyz"[..]));
    let reply = encode_reply(
        16,
        Ok(&ReplyBody::Write(fuse_write_out {
            size: 3,
            padding: 0,
        })),
    )
    .unwrap();
    assert_eq!(
        reply,
        [
            24, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0
        ]
    );
}

#[test]
fn interrupt_request() {
    let bytes = cat(&[&in_header!(48, 36, 0, 19), &[18, 0, 0, 0, 0, 0, 0, 0]]);
    assert_eq!(
        parse_request(&bytes).unwrap().op,
        Op::Interrupt(fuse_interrupt_in { unique: 18 })
    );
}

#[test]
fn ioctl_request_and_replies() {
    let bytes = cat(&[
        &in_header!(76, 39, 0, 20),
        &[7, 0, 0, 0, 0, 0, 0, 0],             // fh
        &[2, 0, 0, 0, 0x03, 0x54, 0x04, 0xc0], // flags UNRESTRICTED, cmd _IOWR('T', 3, 4)
        &[0x00, 0x10, 0, 0, 0xfd, 0x7f, 0, 0], // arg 0x7ffd_0000_1000
        &[4, 0, 0, 0, 4, 0, 0, 0],             // in_size 4, out_size 4
        &[41, 0, 0, 0],                        // in data
    ]);
    let m = parse_request(&bytes).unwrap();
    let Op::Ioctl(arg, data) = m.op else {
        panic!("{:?}", m.op)
    };
    let want = fuse_ioctl_in {
        fh: 7,
        flags: FUSE_IOCTL_UNRESTRICTED,
        cmd: 0xc004_5403,
        arg: 0x7ffd_0000_1000,
        in_size: 4,
        out_size: 4,
    };
    assert_eq!((arg, &*data), (want, &[41u8, 0, 0, 0][..]));

    let done = ReplyBody::Ioctl(
        fuse_ioctl_out {
            result: 5,
            ..Default::default()
        },
        [42, 0, 0, 0][..].into(),
    );
    let want = [
        36, 0, 0, 0, 0, 0, 0, 0, 20, 0, 0, 0, 0, 0, 0, 0, // header
        5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // result 5, flags, in_iovs, out_iovs
        42, 0, 0, 0, // out data
    ];
    assert_eq!(encode_reply(20, Ok(&done)).unwrap(), want);

    let retry = ReplyBody::IoctlRetry(
        fuse_ioctl_out {
            result: 0,
            flags: FUSE_IOCTL_RETRY,
            in_iovs: 1,
            out_iovs: 1,
        },
        vec![
            fuse_ioctl_iovec {
                base: 0x1000,
                len: 24,
            },
            fuse_ioctl_iovec {
                base: 0x2000,
                len: 0x100,
            },
        ],
    );
    let want = cat(&[
        &[64, 0, 0, 0, 0, 0, 0, 0, 20, 0, 0, 0, 0, 0, 0, 0],
        &[0, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0], // result, FUSE_IOCTL_RETRY, 1 in, 1 out
        &[0, 0x10, 0, 0, 0, 0, 0, 0, 24, 0, 0, 0, 0, 0, 0, 0], // in iovec
        &[0, 0x20, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0], // out iovec
    ]);
    assert_eq!(encode_reply(20, Ok(&retry)).unwrap(), want);
}

#[test]
fn poll_request_reply_and_notification() {
    let bytes = cat(&[
        &in_header!(64, 40, 0, 22),
        &[7, 0, 0, 0, 0, 0, 0, 0],    // fh
        &[0x99, 0, 0, 0, 0, 0, 0, 0], // kh
        &[1, 0, 0, 0, 1, 0, 0, 0],    // FUSE_POLL_SCHEDULE_NOTIFY, POLLIN
    ]);
    let want = fuse_poll_in {
        fh: 7,
        kh: 0x99,
        flags: 1,
        events: 1,
    };
    assert_eq!(parse_request(&bytes).unwrap().op, Op::Poll(want));
    let reply = encode_reply(
        22,
        Ok(&ReplyBody::Poll(fuse_poll_out {
            revents: 5,
            padding: 0,
        })),
    )
    .unwrap();
    assert_eq!(
        reply,
        [
            24, 0, 0, 0, 0, 0, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0
        ]
    );
    let notify = encode_poll_wakeup(0x99);
    // len 24, error = FUSE_NOTIFY_POLL (1), unique 0, kh.
    assert_eq!(
        notify,
        [
            24, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x99, 0, 0, 0, 0, 0, 0, 0
        ]
    );
}

#[test]
fn error_reply_and_unknown_opcode() {
    let reply = encode_reply(24, Err(Errno::ENOTTY)).unwrap();
    // error = -25 as i32.
    assert_eq!(
        reply,
        [16, 0, 0, 0, 0xe7, 0xff, 0xff, 0xff, 24, 0, 0, 0, 0, 0, 0, 0]
    );
    let lookup = cat(&[&in_header!(45, 1, 0, 24), b"name\0"]);
    assert_eq!(parse_request(&lookup).unwrap().op, Op::Unknown(1));
}

#[test]
fn malformed_requests() {
    assert_eq!(parse_request(&[0; 39]), Err(WireError::Short(39)));
    // len says 48, 40 bytes present.
    assert_eq!(
        parse_request(&in_header!(48, 14, 0, 2)),
        Err(WireError::LenMismatch {
            header: 48,
            read: 40
        })
    );
    // OPEN with 4 of 8 body bytes.
    let short = cat(&[&in_header!(44, 14, 0, 2), &[0; 4]]);
    assert_eq!(
        parse_request(&short),
        Err(WireError::BodyTooShort {
            opcode: 14,
            got: 4,
            want: 8
        })
    );
    // WRITE declaring 5 bytes, carrying 3.
    let write = cat(&[
        &in_header!(83, 16, 0, 2),
        &[0; 16],
        &[5, 0, 0, 0],
        &[0; 20],
        b"xyz",
    ]);
    assert_eq!(
        parse_request(&write),
        Err(WireError::PayloadMismatch {
            opcode: 16,
            declared: 5,
            present: 3
        })
    );
    // IOCTL with FUSE_IOCTL_DIR (never for CUSE) and an unknown bit.
    let ioctl = cat(&[
        &in_header!(72, 39, 0, 2),
        &[0; 8],
        &[0x10, 0x01, 0, 0],
        &[0; 20],
    ]);
    assert_eq!(
        parse_request(&ioctl),
        Err(WireError::UnknownFlags {
            opcode: 39,
            flags: 0x110
        })
    );
    // POLL with an unknown flag.
    let poll = cat(&[&in_header!(64, 40, 0, 2), &[0; 16], &[2, 0, 0, 0], &[0; 4]]);
    assert_eq!(
        parse_request(&poll),
        Err(WireError::UnknownFlags {
            opcode: 40,
            flags: 2
        })
    );
    assert_eq!(WireError::Short(1).errno(), Errno::EIO);
    assert_eq!(
        WireError::UnknownFlags {
            opcode: 40,
            flags: 2
        }
        .errno(),
        Errno::EINVAL
    );
}
