//! A `Session` against the in-process kernel peer (`common/`): INIT, the file operations,
//! restricted and unrestricted ioctls with 1-3 retry rounds, concurrency, interrupts, poll
//! notify, and the protocol-level refusals.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::device::*;
use common::{Harness, Memory};
use cuse_dev::wire::{
    FUSE_IOCTL, FUSE_IOCTL_32BIT, FUSE_IOCTL_COMPAT, FUSE_IOCTL_UNRESTRICTED, FUSE_NOTIFY_POLL,
    FUSE_OPEN, FUSE_POLL, FUSE_POLL_SCHEDULE_NOTIFY, FUSE_WRITE, cuse_init_out, fuse_in_header,
    fuse_ioctl_in, fuse_notify_poll_wakeup_out, fuse_open_in, fuse_poll_in, fuse_poll_out,
    fuse_write_in,
};
use cuse_dev::{CuseError, DeviceConfig};
use zerocopy::IntoBytes;

fn cfg() -> DeviceConfig {
    DeviceConfig::new("nvproxy-test/peer")
}

/// A session with restricted ioctls (the kernel copies `_IOC_SIZE` itself).
fn restricted(dev: &Arc<TestDevice>) -> Harness {
    Harness::started(
        DeviceConfig {
            unrestricted_ioctl: false,
            ..cfg()
        },
        dev.clone(),
    )
}

#[test]
fn init_reply_carries_name_numbers_and_flags() {
    let dev = TestDevice::new();
    let cfg = DeviceConfig {
        dev_major: 120,
        dev_minor: 7,
        max_read: 8192,
        max_write: 16384,
        ..DeviceConfig::new("nvproxy-test/a/dev")
    };
    let h = Harness::start(cfg, dev.clone());
    let r = h.peer.init(7, 41, 1);
    assert_eq!(r.errno(), 0);
    assert_eq!(
        r.header.len as usize,
        16 + 72 + "DEVNAME=nvproxy-test/a/dev\0".len()
    );
    let out: cuse_init_out = r.parse();
    assert_eq!((out.major, out.minor), (7, 31));
    assert_eq!(out.flags, 1, "CUSE_UNRESTRICTED_IOCTL");
    assert_eq!((out.max_read, out.max_write), (8192, 16384));
    assert_eq!((out.dev_major, out.dev_minor), (120, 7));
    assert_eq!(&r.body[72..], b"DEVNAME=nvproxy-test/a/dev\0");
    let info = h.control.wait_init(Duration::from_secs(5)).unwrap();
    assert_eq!(
        (info.kernel_minor, info.minor, info.dev_major),
        (41, 31, 120)
    );
    assert_eq!(*dev.init.lock().unwrap(), Some(info));
    h.finish();
}

#[test]
fn init_answers_the_kernels_lower_minor_and_restricted_flags() {
    let h = Harness::start(
        DeviceConfig {
            unrestricted_ioctl: false,
            ..cfg()
        },
        TestDevice::new(),
    );
    let out: cuse_init_out = h.peer.init(7, 20, 1).parse();
    assert_eq!((out.major, out.minor, out.flags), (7, 20, 0));
    h.finish();
}

#[test]
fn unsupported_protocol_is_an_error() {
    for (major, minor) in [(8, 0), (6, 40), (7, 10)] {
        let mut h = Harness::start(cfg(), TestDevice::new());
        assert_eq!(h.peer.init(major, minor, 1).errno(), libc::EPROTO);
        match h.join() {
            Err(CuseError::UnsupportedProtocol {
                major: m,
                minor: n,
                ours: 31,
            }) => {
                assert_eq!((m, n), (major, minor));
            }
            other => panic!("{major}.{minor}: {other:?}"),
        }
    }
}

#[test]
fn requests_before_init_get_eio_and_end_before_init_is_an_error() {
    let h = Harness::start(cfg(), TestDevice::new());
    let r = h.peer.call(FUSE_OPEN, fuse_open_in::default().as_bytes());
    assert_eq!(r.errno(), libc::EIO);
    assert_eq!(h.peer.init(7, 41, 1).errno(), 0);
    h.finish();

    let mut h = Harness::start(cfg(), TestDevice::new());
    h.peer.close();
    assert!(matches!(h.join(), Err(CuseError::EndedBeforeInit)));
}

#[test]
fn open_read_write_release() {
    let dev = TestDevice::new();
    let h = Harness::started(cfg(), dev.clone());
    let fh = h.peer.open();
    let fh2 = h.peer.open();
    assert_ne!(fh, fh2);
    assert_eq!(h.peer.write(fh, b"hello cuse"), Ok(10));
    assert_eq!(h.peer.read(fh2, 100).unwrap(), b"hello cuse");
    assert_eq!(h.peer.read(fh, 5).unwrap(), b"hello");
    assert_eq!(
        h.peer.read(999, 5),
        Err(libc::EIO),
        "read reply longer than asked is refused"
    );
    let excl = fuse_open_in {
        flags: (libc::O_RDWR | libc::O_EXCL) as u32,
        open_flags: 0,
    };
    assert_eq!(
        h.peer.call(FUSE_OPEN, excl.as_bytes()).errno(),
        libc::EACCES
    );
    h.peer.release(fh);
    h.peer.release(fh2);
    assert_eq!(*dev.releases.lock().unwrap(), vec![fh, fh2]);
    h.finish();
}

#[test]
fn restricted_ioctls() {
    let dev = TestDevice::new();
    let h = restricted(&dev);
    let fh = h.peer.open();
    let mem = Memory::default();
    mem.write(0x1000, &41i32.to_ne_bytes());
    let r = h.peer.ioctl(fh, SET, 0x1000, false, &mem);
    assert_eq!((r.result, r.retries), (Ok(0), 0));
    assert_eq!(*dev.register.lock().unwrap(), 41);
    mem.write(0x2000, &[0; 4]);
    assert_eq!(h.peer.ioctl(fh, GET, 0x2000, false, &mem).result, Ok(0));
    assert_eq!(mem.read(0x2000, 4).unwrap(), 41i32.to_ne_bytes());
    assert_eq!(h.peer.ioctl(fh, INCR, 0x2000, false, &mem).result, Ok(0));
    assert_eq!(mem.read(0x2000, 4).unwrap(), 42i32.to_ne_bytes());
    // A retry on a restricted ioctl never reaches the kernel.
    assert_eq!(
        h.peer.ioctl(fh, ALWAYS_RETRY, 0x2000, false, &mem).result,
        Err(libc::EIO)
    );
    assert_eq!(
        h.peer.ioctl(fh, 0x5401, 0, false, &mem).result,
        Err(libc::ENOTTY)
    );
    h.finish();
}

/// A handler's early answer reaches the client while the handler still runs, and the
/// session sends nothing more when it returns (`Harness::finish` checks every request was
/// answered once); an early answer the kernel would refuse is not sent, and the handler's
/// return answers.
#[test]
fn an_early_answer_goes_out_before_the_handler_returns_and_only_once() {
    let dev = TestDevice::new();
    let h = restricted(&dev);
    let fh = h.peer.open();
    *dev.register.lock().unwrap() = 41;
    let (u, rx) = h.peer.start_ioctl(fh, 0, EARLY, 10_000, &[], 4);
    let r = common::wait(&rx, u);
    assert_eq!(r.errno(), 0);
    let out: cuse_dev::wire::fuse_ioctl_out = r.parse();
    assert_eq!(out.result, 5);
    let at = size_of::<cuse_dev::wire::fuse_ioctl_out>();
    assert_eq!(r.body[at..], 41i32.to_ne_bytes());
    assert_eq!(
        dev.early_returned.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "answered while the handler still runs"
    );
    dev.early_gate
        .store(true, std::sync::atomic::Ordering::SeqCst);
    common::eventually("the EARLY handler returned", || {
        dev.early_returned.load(std::sync::atomic::Ordering::SeqCst) == 1
    });

    let (u, rx) = h.peer.start_ioctl(fh, 0, EARLY_TOO_LONG, 0, &[], 4);
    let r = common::wait(&rx, u);
    assert_eq!(r.errno(), 0);
    assert_eq!(r.parse::<cuse_dev::wire::fuse_ioctl_out>().result, 6);
    assert_eq!(*dev.early_sent.lock().unwrap(), [true, false]);
    // A request after both is served as usual (the serving threads went back to reading).
    assert_eq!(
        h.peer
            .ioctl(fh, GET, 0x2000, false, &common::Memory::default())
            .result,
        Ok(0)
    );
    h.finish();
}

/// Lays out `Xform { in_ptr, out_ptr, len }` at `at`, with `input` at 0x10_000 and a zeroed
/// output buffer at 0x20_000.
fn xform_in_memory(mem: &Memory, at: u64, input: &[u8]) {
    let mut x = Vec::new();
    x.extend_from_slice(&0x10_000u64.to_ne_bytes());
    x.extend_from_slice(&0x20_000u64.to_ne_bytes());
    x.extend_from_slice(&common::len32(input.len()).to_ne_bytes());
    x.extend_from_slice(&0u32.to_ne_bytes());
    mem.write(at, &x);
    mem.write(0x10_000, input);
    mem.write(0x20_000, &vec![0; input.len()]);
}

#[test]
fn unrestricted_ioctls_with_one_two_and_three_retry_rounds() {
    let dev = TestDevice::new();
    let h = Harness::started(cfg(), dev.clone());
    let fh = h.peer.open();
    let mem = Memory::default();

    mem.write(0x1000, &9i32.to_ne_bytes());
    let r = h.peer.ioctl(fh, INCR, 0x1000, true, &mem);
    assert_eq!((r.result, r.retries), (Ok(0), 1));
    assert_eq!(mem.read(0x1000, 4).unwrap(), 10i32.to_ne_bytes());

    xform_in_memory(&mem, 0x3000, b"two rounds");
    let r = h.peer.ioctl(fh, XFORM, 0x3000, true, &mem);
    assert_eq!((r.result, r.retries), (Ok(10), 2));
    assert_eq!(mem.read(0x20_000, 10).unwrap(), b"TWO ROUNDS");

    xform_in_memory(&mem, 0x5000, b"three rounds");
    mem.write(0x4000, &0x5000u64.to_ne_bytes());
    let r = h.peer.ioctl(fh, NESTED, 0x4000, true, &mem);
    assert_eq!((r.result, r.retries), (Ok(12), 3));
    assert_eq!(mem.read(0x20_000, 12).unwrap(), b"sdnuor eerht");

    // The kernel's limit itself is fine: 256 iovecs.
    mem.write(0x8000, &[1; 256]);
    let r = h.peer.ioctl(fh, MANY_IOV, 0x8000, true, &mem);
    assert_eq!((r.result, r.retries), (Ok(256), 1));
    // A fault in the named memory is the kernel's EFAULT.
    assert_eq!(
        h.peer.ioctl(fh, INCR, 0xdead_0000, true, &mem).result,
        Err(libc::EFAULT)
    );
    h.finish();
}

#[test]
fn oversized_retries_and_bad_handler_replies_are_refused() {
    let dev = TestDevice::new();
    let h = Harness::started(cfg(), dev.clone());
    let fh = h.peer.open();
    let mem = Memory::default();
    for (cmd, errno) in [
        (BIG_IOV, libc::E2BIG),
        (BIG_BYTES, libc::E2BIG),
        (NEGATIVE, libc::EIO),
        (OUT_TOO_LONG, libc::EIO),
        (PANIC, libc::EIO),
    ] {
        let r = h.peer.ioctl(fh, cmd, 0x1000, true, &mem);
        assert_eq!(r.result, Err(errno), "cmd {cmd:#x}");
    }
    // The session survived the panic.
    assert_eq!(h.peer.ioctl(fh, FAST, 0, true, &mem).result, Ok(7));
    h.finish();
}

#[test]
fn a_slow_request_does_not_block_a_fast_one() {
    let dev = TestDevice::new();
    let h = Harness::started(cfg(), dev.clone());
    let fh = h.peer.open();
    let flags = FUSE_IOCTL_UNRESTRICTED;
    let (slow, slow_rx) = h.peer.start_ioctl(fh, flags, SLOW, 20_000, &[], 0);
    let started = Instant::now();
    for _ in 0..20 {
        let (u, rx) = h.peer.start_ioctl(fh, flags, FAST, 0, &[], 0);
        let r = common::wait(&rx, u);
        assert_eq!(r.errno(), 0);
    }
    // Other opens and releases are served too.
    let fh2 = h.peer.open();
    h.peer.release(fh2);
    assert!(
        slow_rx.try_recv().is_err(),
        "the slow request is still running"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    h.peer.interrupt(slow);
    let r = common::wait(&slow_rx, slow);
    assert_eq!(r.errno(), libc::EINTR);
    assert!(started.elapsed() < Duration::from_secs(15));
    h.finish();
}

#[test]
fn interrupt_wakes_a_waiting_handler() {
    let dev = TestDevice::new();
    let h = Harness::started(cfg(), dev.clone());
    let fh = h.peer.open();
    let (u, rx) = h
        .peer
        .start_ioctl(fh, FUSE_IOCTL_UNRESTRICTED, SLOW, 30_000, &[], 0);
    common::eventually("the handler runs", || dev.calls(SLOW) == 1);
    let t = Instant::now();
    h.peer.interrupt(u);
    let r = common::wait(&rx, u);
    assert_eq!(r.errno(), libc::EINTR);
    assert!(t.elapsed() < Duration::from_secs(5));
    // An interrupt for a finished request is ignored (no reply, no harm).
    h.peer.interrupt(u);
    h.peer.interrupt(123_456);
    assert_eq!(
        h.peer.ioctl(fh, FAST, 0, true, &Memory::default()).result,
        Ok(7)
    );
    h.finish();
}

#[test]
fn a_request_interrupted_in_the_queue_gets_eintr_without_its_handler() {
    let dev = TestDevice::new();
    let h = Harness::started(
        DeviceConfig {
            max_workers: 1,
            ..cfg()
        },
        dev.clone(),
    );
    let fh = h.peer.open();
    let flags = FUSE_IOCTL_UNRESTRICTED;
    let (slow, slow_rx) = h.peer.start_ioctl(fh, flags, SLOW, 500, &[], 0);
    common::eventually("the slow handler runs", || dev.calls(SLOW) == 1);
    let (fast, fast_rx) = h.peer.start_ioctl(fh, flags, FAST, 0, &[], 0);
    h.peer.interrupt(fast);
    assert_eq!(common::wait(&slow_rx, slow).errno(), 0);
    assert_eq!(common::wait(&fast_rx, fast).errno(), libc::EINTR);
    assert_eq!(dev.calls(FAST), 0);
    assert_eq!(h.control.worker_count(), 1);
    h.finish();
}

#[test]
fn the_pool_grows_to_its_bound_and_shrinks_when_idle() {
    let cfg = DeviceConfig {
        max_workers: 4,
        idle_timeout: Duration::from_millis(100),
        ..cfg()
    };
    let h = Harness::started(cfg, TestDevice::new());
    let fh = h.peer.open();
    let pending: Vec<_> = (0..6)
        .map(|_| {
            h.peer
                .start_ioctl(fh, FUSE_IOCTL_UNRESTRICTED, SLOW, 400, &[], 0)
        })
        .collect();
    common::eventually("four workers", || h.control.worker_count() == 4);
    for (u, rx) in pending {
        assert_eq!(common::wait(&rx, u).errno(), 0);
    }
    common::eventually("the workers shrink to one", || {
        h.control.worker_count() == 1
    });
    h.finish();
}

#[test]
fn poll_notify_wakes_pollers() {
    let dev = TestDevice::new();
    let h = Harness::started(cfg(), dev.clone());
    let fh = h.peer.open();
    let poll = |flags| {
        let arg = fuse_poll_in {
            fh,
            kh: 77,
            flags,
            events: libc::POLLIN as u32,
        };
        h.peer
            .call(FUSE_POLL, arg.as_bytes())
            .parse::<fuse_poll_out>()
            .revents
    };
    assert_eq!(poll(FUSE_POLL_SCHEDULE_NOTIFY), libc::POLLOUT as u32);
    assert!(
        h.peer
            .next_notification(Duration::from_millis(50))
            .is_none()
    );
    // A write from another thread (another open) makes the device readable.
    let fh2 = h.peer.open();
    assert_eq!(h.peer.write(fh2, b"x"), Ok(1));
    let n = h
        .peer
        .next_notification(Duration::from_secs(5))
        .expect("no FUSE_NOTIFY_POLL");
    assert_eq!(
        (n.header.error, n.header.unique, n.header.len),
        (FUSE_NOTIFY_POLL, 0, 24)
    );
    assert_eq!(n.parse::<fuse_notify_poll_wakeup_out>().kh, 77);
    assert_eq!(poll(0), (libc::POLLIN | libc::POLLOUT) as u32);
    assert_eq!(*dev.poll_notify_seen.lock().unwrap(), vec![true, false]);
    h.finish();
}

#[test]
fn a_poll_handle_outliving_the_session_reports_disconnected() {
    let dev = TestDevice::new();
    let h = Harness::started(cfg(), dev.clone());
    let fh = h.peer.open();
    let arg = fuse_poll_in {
        fh,
        kh: 5,
        flags: FUSE_POLL_SCHEDULE_NOTIFY,
        events: 1,
    };
    h.peer.call(FUSE_POLL, arg.as_bytes());
    h.finish();
    let handle = dev.pollers.lock().unwrap().pop().unwrap();
    // Workers may still hold the channel for a moment after run returned.
    assert!(
        test_kit::eventually(Duration::from_secs(5), || {
            matches!(handle.notify(), Err(CuseError::Disconnected))
        }),
        "handle kept the channel alive"
    );
}

#[test]
fn unknown_opcodes_get_enosys_and_compat_ioctls_enotty() {
    let dev = TestDevice::new();
    let h = Harness::started(cfg(), dev.clone());
    for opcode in [1, 3, 26, 41, 9999, u32::MAX] {
        assert_eq!(
            h.peer.call(opcode, &[0; 16]).errno(),
            libc::ENOSYS,
            "opcode {opcode}"
        );
    }
    let fh = h.peer.open();
    for flags in [
        FUSE_IOCTL_COMPAT,
        FUSE_IOCTL_COMPAT | FUSE_IOCTL_32BIT | FUSE_IOCTL_UNRESTRICTED,
    ] {
        let (u, rx) = h.peer.start_ioctl(fh, flags, FAST, 0, &[], 0);
        assert_eq!(common::wait(&rx, u).errno(), libc::ENOTTY);
    }
    assert_eq!(dev.calls(FAST), 0);
    h.finish();
}

#[test]
fn malformed_requests_get_errors_or_are_dropped() {
    let dev = TestDevice::new();
    let h = Harness::started(cfg(), dev.clone());
    let header = |len: u32, opcode, unique| fuse_in_header {
        len,
        opcode,
        unique,
        pid: 1,
        ..Default::default()
    };
    // Short: fewer bytes than a header: dropped, nothing to answer.
    // (No empty message: on a socket that reads as end-of-file, which /dev/cuse never gives.)
    h.peer.send_raw(&[1, 2, 3]);
    h.peer.send_raw(&[0; 39]);

    // Each case: raw bytes and the errno the session must answer for `unique`.
    let mut cases: Vec<(Vec<u8>, i32)> = Vec::new();
    // len larger than what was read.
    cases.push((
        header(100, FUSE_OPEN, 0).as_bytes()[..40].to_vec(),
        libc::EIO,
    ));
    // len smaller than what was read.
    let mut b = header(40, FUSE_OPEN, 0).as_bytes().to_vec();
    b.extend_from_slice(&[0; 8]);
    cases.push((b, libc::EIO));
    // OPEN body too short.
    let mut b = header(44, FUSE_OPEN, 0).as_bytes().to_vec();
    b.extend_from_slice(&[0; 4]);
    cases.push((b, libc::EINVAL));
    // WRITE whose size field disagrees with the data.
    let w = fuse_write_in {
        size: 10,
        ..Default::default()
    };
    let mut b = header(40 + 40 + 3, FUSE_WRITE, 0).as_bytes().to_vec();
    b.extend_from_slice(w.as_bytes());
    b.extend_from_slice(b"abc");
    cases.push((b, libc::EINVAL));
    // IOCTL with unknown flags, and with in_size past the end.
    for (flags, in_size) in [(1 << 9, 0), (FUSE_IOCTL_UNRESTRICTED, 1000)] {
        let a = fuse_ioctl_in {
            flags,
            cmd: FAST,
            in_size,
            ..Default::default()
        };
        let mut b = header(40 + 32, 39, 0).as_bytes().to_vec();
        b.extend_from_slice(a.as_bytes());
        cases.push((b, libc::EINVAL));
    }
    // POLL with unknown flags.
    let p = fuse_poll_in {
        flags: 2,
        ..Default::default()
    };
    let mut b = header(40 + 24, FUSE_POLL, 0).as_bytes().to_vec();
    b.extend_from_slice(p.as_bytes());
    cases.push((b, libc::EINVAL));

    for (mut bytes, errno) in cases {
        let unique = h.peer.unique();
        bytes[8..16].copy_from_slice(&unique.to_ne_bytes());
        let rx = h.peer.expect_raw(unique, &bytes);
        assert_eq!(common::wait(&rx, unique).errno(), errno, "case {bytes:?}");
    }

    // unique 0 is the notification id: never answered.
    let mut b = header(48, FUSE_OPEN, 0).as_bytes().to_vec();
    b.extend_from_slice(fuse_open_in::default().as_bytes());
    h.peer.send_raw(&b);

    // Still serving.
    let fh = h.peer.open();
    assert_eq!(h.peer.write(fh, b"ok"), Ok(2));
    assert!(h.peer.unmatched(Duration::from_millis(100)).is_none());
    h.finish();
}

#[test]
fn stop_ends_run_while_idle() {
    let mut h = Harness::started(cfg(), TestDevice::new());
    let _fh = h.peer.open();
    let t = Instant::now();
    h.control.stop();
    h.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(h.control.is_stopped());
    // Every serving thread left its blocking read and dropped the channel.
    assert!(h.peer.closed_by_session(Duration::from_secs(5)));
}

#[test]
fn stop_lets_a_running_handler_answer_and_then_closes() {
    let dev = TestDevice::new();
    let mut h = Harness::started(cfg(), dev.clone());
    let fh = h.peer.open();
    let (u, rx) = h
        .peer
        .start_ioctl(fh, FUSE_IOCTL_UNRESTRICTED, SLOW, 300, &[], 0);
    common::eventually("the handler runs", || dev.calls(SLOW) == 1);
    h.control.stop();
    h.join().unwrap();
    assert_eq!(common::wait(&rx, u).errno(), 0);
    assert!(h.peer.closed_by_session(Duration::from_secs(5)));
}

#[test]
fn a_handler_waiting_for_another_request_of_its_device_does_not_stall_reading() {
    // The daemon's handlers send an identify ioctl to their own device and wait for it: with
    // two handler slots, the nested request is read and served while the first handler waits.
    let dev = TestDevice::new();
    let h = Harness::started(
        DeviceConfig {
            max_workers: 2,
            ..cfg()
        },
        dev.clone(),
    );
    let fh = h.peer.open();
    let flags = FUSE_IOCTL_UNRESTRICTED;
    for _ in 0..20 {
        let (w, wrx) = h.peer.start_ioctl(fh, flags, WAIT_FAST, 5_000, &[], 0);
        thread::sleep(Duration::from_millis(2));
        let (f, frx) = h.peer.start_ioctl(fh, flags, FAST, 0, &[], 0);
        assert_eq!(common::wait(&frx, f).errno(), 0);
        let r = common::wait(&wrx, w);
        assert_eq!(r.errno(), 0, "the waiting handler timed out");
        assert!(h.control.worker_count() <= 2);
    }
    h.finish();
}

#[test]
fn an_interrupt_read_before_its_target_is_registered_still_reaches_it() {
    // With several threads reading, an interrupt can be read before the thread that read its
    // target has registered it. The session answers such an interrupt EAGAIN, and the kernel
    // (here the peer) queues it again while the target waits for its reply.
    let h = Harness::started(cfg(), TestDevice::new());
    let fh = h.peer.open();
    let u = h.peer.unique();
    let _early = h.peer.expect_raw(u, &common::interrupt_message(u));
    thread::sleep(Duration::from_millis(20));
    let a = fuse_ioctl_in {
        fh,
        flags: FUSE_IOCTL_UNRESTRICTED,
        cmd: SLOW,
        arg: 30_000,
        in_size: 0,
        out_size: 0,
    };
    let t = Instant::now();
    let rx = h.peer.send_with(u, FUSE_IOCTL, 4242, a.as_bytes());
    assert_eq!(common::wait(&rx, u).errno(), libc::EINTR);
    assert!(t.elapsed() < Duration::from_secs(5));
    h.finish();
}

#[test]
fn concurrent_callers_from_many_threads() {
    let dev = TestDevice::new();
    let h = Arc::new(Harness::started(
        DeviceConfig {
            max_workers: 8,
            ..cfg()
        },
        dev.clone(),
    ));
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let h = h.clone();
            thread::spawn(move || {
                let mem = Memory::default();
                let fh = h.peer.open();
                let addr = 0x1000 * (i + 1);
                let v = i32::try_from(i).expect("a few threads");
                mem.write(addr, &v.to_ne_bytes());
                for _ in 0..20 {
                    let r = h.peer.ioctl(fh, INCR, addr, true, &mem);
                    assert_eq!(r.result, Ok(0));
                }
                assert_eq!(mem.read(addr, 4).unwrap(), (v + 20).to_ne_bytes());
                h.peer.release(fh);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(dev.releases.lock().unwrap().len(), 16);
    assert!(h.control.worker_count() <= 8);
    Arc::into_inner(h).unwrap().finish();
}

/// Issue 9 finding 6: a handler stuck on the client's memory (a `process_vm_readv` on a page the
/// client's `userfaultfd` holds does not return, and ignores signals) is answered `EFAULT` by the
/// watchdog at the client-wait deadline; its own late reply is dropped; other requests are
/// served meanwhile.
#[test]
fn a_handler_stuck_on_client_memory_is_answered_at_the_deadline() {
    let dev = TestDevice::new();
    let cfg = DeviceConfig {
        client_wait_timeout: Duration::from_millis(200),
        ..cfg()
    };
    let h = Harness::started(cfg, dev.clone());
    let fh = h.peer.open();
    let t = Instant::now();
    let (u, rx) = h
        .peer
        .start_ioctl(fh, FUSE_IOCTL_UNRESTRICTED, CLIENT_WAIT, 1500, &[], 0);
    assert_eq!(
        h.peer.ioctl(fh, FAST, 0, true, &Memory::default()).result,
        Ok(7)
    );
    let r = common::wait(&rx, u);
    assert_eq!(r.errno(), libc::EFAULT);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(1200),
        "{took:?}"
    );
    // The handler finishes later; its reply is not sent a second time.
    common::eventually("the parked handler comes back", || {
        !dev.client_waits_fired.lock().unwrap().is_empty()
    });
    assert_eq!(*dev.client_waits_fired.lock().unwrap(), [true]);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(h.peer.answered().get(&u), Some(&1));
    // A wait that ends in time is not touched.
    let (u, rx) = h
        .peer
        .start_ioctl(fh, FUSE_IOCTL_UNRESTRICTED, CLIENT_WAIT, 10, &[], 0);
    let r = common::wait(&rx, u);
    assert_eq!(r.errno(), 0);
    h.finish();
}

/// A client interrupted (signalled, perhaps killed) while its request's handler is stuck on its
/// memory is released at once with `EINTR`: without it a killed client and the stuck thread
/// would wait for each other forever.
#[test]
fn an_interrupt_releases_a_client_whose_handler_is_stuck_on_its_memory() {
    let dev = TestDevice::new();
    let h = Harness::started(cfg(), dev.clone());
    let fh = h.peer.open();
    let (u, rx) = h
        .peer
        .start_ioctl(fh, FUSE_IOCTL_UNRESTRICTED, CLIENT_WAIT, 1500, &[], 0);
    common::eventually("the handler runs", || dev.calls(CLIENT_WAIT) == 1);
    let t = Instant::now();
    h.peer.interrupt(u);
    let r = common::wait(&rx, u);
    assert_eq!(r.errno(), libc::EINTR);
    assert!(
        t.elapsed() < Duration::from_millis(800),
        "{:?}",
        t.elapsed()
    );
    common::eventually("the parked handler comes back", || {
        !dev.client_waits_fired.lock().unwrap().is_empty()
    });
    thread::sleep(Duration::from_millis(100));
    assert_eq!(h.peer.answered().get(&u), Some(&1));
    h.finish();
}
