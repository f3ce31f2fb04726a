//! Handing a live session to another server (`SessionControl::suspend`, `Session::resume`):
//! the open files, a retry round in progress and requests queued meanwhile all survive, against
//! the in-process kernel peer. (The real kernel's side: `tests/tests/cuse_kernel.rs`.)

mod common;

use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::device::*;
use common::{Memory, Peer, wait};
use cuse_dev::wire::{FUSE_IOCTL_RETRY, FUSE_IOCTL_UNRESTRICTED, fuse_ioctl_out};
use cuse_dev::{CuseError, DeviceConfig, IoVec, PendingRetry, RetryRound, Session, seqpacket_pair};

const T: Duration = Duration::from_secs(10);

fn cfg() -> DeviceConfig {
    DeviceConfig::new("nvproxy-test/handover")
}

#[test]
fn a_suspended_session_resumes_elsewhere_with_its_files_retries_and_queued_requests() {
    let dev = TestDevice::new();
    let (ours, theirs) = seqpacket_pair().unwrap();
    let peer = Peer::new(UnixDatagram::from(theirs));
    let a = Session::from_fd(ours, cfg()).unwrap();
    let a_ctl = a.control();
    let handler: Arc<dyn cuse_dev::Handler> = dev.clone();
    let a_thread = thread::spawn(move || a.run_handover(handler));
    assert_eq!(peer.init(7, 41, 1).errno(), 0);
    let init = a_ctl.wait_init(T).unwrap();
    let fh = peer.open();
    let mem = Memory::default();
    mem.write(0x1000, &41i32.to_ne_bytes());
    assert_eq!(peer.ioctl(fh, INCR, 0x1000, true, &mem).result, Ok(0));

    // A first round answered RETRY: the caller's next round is still to come.
    let (u, rx) = peer.start_ioctl(fh, FUSE_IOCTL_UNRESTRICTED, INCR, 0x1000, &[], 0);
    let first = wait(&rx, u);
    let out: fuse_ioctl_out = first.parse();
    assert_ne!(out.flags & FUSE_IOCTL_RETRY, 0, "a RETRY reply");

    a_ctl.suspend();
    let suspended = a_thread
        .join()
        .unwrap()
        .expect("run_handover")
        .expect("suspended, not stopped");
    assert_eq!(suspended.init, init);
    assert_eq!(
        suspended.retries,
        [PendingRetry {
            fh,
            tid: 4242,
            round: RetryRound {
                in_iovs: vec![IoVec::new(0x1000, 4)],
                out_iovs: vec![IoVec::new(0x1000, 4)],
            },
        }]
    );
    // Nobody reads now: the kernel queues. The continuation and a new request wait.
    let (u2, rx2) = peer.start_ioctl(
        fh,
        FUSE_IOCTL_UNRESTRICTED,
        INCR,
        0x1000,
        &42i32.to_ne_bytes(),
        4,
    );
    let (u3, rx3) = peer.start_ioctl(fh, FUSE_IOCTL_UNRESTRICTED, FAST, 0, &[], 0);
    assert!(
        rx2.recv_timeout(Duration::from_millis(200)).is_err(),
        "answered while suspended"
    );

    let b = Session::resume(suspended.channel, cfg(), suspended.init, suspended.retries).unwrap();
    let b_ctl = b.control();
    let handler: Arc<dyn cuse_dev::Handler> = dev.clone();
    let b_thread = thread::spawn(move || b.run_handover(handler));
    let r2 = wait(&rx2, u2);
    assert_eq!(r2.errno(), 0);
    assert_eq!(&r2.body[r2.body.len() - 4..], 43i32.to_ne_bytes());
    assert_eq!(wait(&rx3, u3).parse::<fuse_ioctl_out>().result, 7);
    assert_eq!(b_ctl.init_info(), Some(init), "no CUSE_INIT again");
    // The file opened under the first server works under the second, retries included.
    mem.write(0x1000, &1i32.to_ne_bytes());
    assert_eq!(peer.ioctl(fh, INCR, 0x1000, true, &mem).result, Ok(0));
    assert_eq!(mem.read(0x1000, 4).unwrap(), 2i32.to_ne_bytes());
    assert!(b_ctl.poll_handle(7).is_some());
    peer.release(fh);
    b_ctl.stop();
    assert!(
        b_thread.join().unwrap().unwrap().is_none(),
        "stopped, not suspended"
    );
    assert!(
        a_ctl.poll_handle(7).is_none(),
        "the first server's channel is gone"
    );
    let v = &peer.violations.lock().unwrap().0;
    assert!(v.is_empty(), "{v:?}");
    assert!(
        peer.answered().values().all(|&n| n == 1),
        "a request answered twice"
    );
}

#[test]
fn resume_refuses_a_config_that_does_not_match_the_registration() {
    let (ours, _theirs) = seqpacket_pair().unwrap();
    let init = cuse_dev::InitInfo {
        kernel_major: 7,
        kernel_minor: 41,
        minor: 31,
        flags: 0, // registered restricted
        max_read: 4096,
        max_write: 4096,
        dev_major: 0,
        dev_minor: 0,
    };
    let err = Session::resume(ours, cfg(), init, Vec::new()).unwrap_err();
    assert!(matches!(err, CuseError::InvalidConfig(_)), "{err}");
}

/// A session serving `peer` in a thread, suspended on demand.
struct Served {
    control: cuse_dev::SessionControl,
    thread: thread::JoinHandle<Result<Option<cuse_dev::Suspended>, CuseError>>,
}

fn serve(peer_cfg: DeviceConfig, dev: &Arc<TestDevice>) -> (Peer, Served) {
    let (ours, theirs) = seqpacket_pair().unwrap();
    let peer = Peer::new(UnixDatagram::from(theirs));
    let s = Session::from_fd(ours, peer_cfg).unwrap();
    let control = s.control();
    let handler: Arc<dyn cuse_dev::Handler> = dev.clone();
    let thread = thread::spawn(move || s.run_handover(handler));
    assert_eq!(peer.init(7, 41, 1).errno(), 0);
    control.wait_init(T).unwrap();
    (peer, Served { control, thread })
}

/// Suspends, resumes the channel in a second session, and checks a request there; returns how
/// long the suspension took.
fn hand_over(peer: &Peer, a: Served, dev: &Arc<TestDevice>, fh: u64) -> (Duration, Served) {
    let t = std::time::Instant::now();
    a.control.suspend();
    let suspended = a
        .thread
        .join()
        .unwrap()
        .expect("the suspension completes")
        .expect("suspended, not stopped");
    let took = t.elapsed();
    let b = Session::resume(suspended.channel, cfg(), suspended.init, suspended.retries).unwrap();
    let control = b.control();
    let handler: Arc<dyn cuse_dev::Handler> = dev.clone();
    let thread = thread::spawn(move || b.run_handover(handler));
    assert_eq!(
        peer.ioctl(fh, FAST, 0, true, &Memory::default()).result,
        Ok(7)
    );
    (took, Served { control, thread })
}

/// Waits for the parked handler to come back, then checks it wrote nothing more.
fn parked_handler_returns_silently(peer: &Peer, dev: &TestDevice, b: Served) {
    common::eventually("the parked handler comes back", || {
        !dev.client_waits_fired.lock().unwrap().is_empty()
    });
    assert_eq!(*dev.client_waits_fired.lock().unwrap(), [true]);
    thread::sleep(Duration::from_millis(200));
    assert_eq!(
        peer.ioctl(0, FAST, 0, true, &Memory::default()).result,
        Ok(7),
        "the second server serves on"
    );
    b.control.stop();
    assert!(b.thread.join().unwrap().unwrap().is_none());
    let v = &peer.violations.lock().unwrap().0;
    assert!(v.is_empty(), "{v:?}");
    assert!(
        peer.answered().values().all(|&n| n == 1),
        "a request answered twice: {:?}",
        peer.answered()
    );
}

/// Issue 20, 7 (CUSE): a request the client-wait watchdog answered while its handler stays
/// parked on the client's memory (`process_vm_readv` on a page the tenant holds with
/// userfaultfd) does not veto a live upgrade: the suspension counts it done and completes at
/// once, and the parked thread, when it comes back, writes no second reply.
#[test]
fn a_request_the_watchdog_answered_does_not_hold_a_suspension() {
    let dev = TestDevice::new();
    let a_cfg = DeviceConfig {
        client_wait_timeout: Duration::from_millis(200),
        ..cfg()
    };
    let (peer, a) = serve(a_cfg, &dev);
    let fh = peer.open();
    // Parked for longer than the suspension's whole wait (timeout + its 5 s margin).
    let (u, rx) = peer.start_ioctl(fh, FUSE_IOCTL_UNRESTRICTED, CLIENT_WAIT, 6500, &[], 0);
    assert_eq!(wait(&rx, u).errno(), libc::EFAULT);
    let (took, b) = hand_over(&peer, a, &dev, fh);
    assert!(
        took < Duration::from_secs(2),
        "the suspension took {took:?}"
    );
    parked_handler_returns_silently(&peer, &dev, b);
}

/// Issue 20, 7 (CUSE): a call that parks on its client's memory before a suspension, with the
/// usual 10 s client-wait deadline, is answered `EFAULT` once the suspension's 1 s grace is
/// over, and the suspension completes then.
#[test]
fn a_suspension_past_its_grace_answers_waits_on_client_memory_at_once() {
    let dev = TestDevice::new();
    let (peer, a) = serve(cfg(), &dev);
    let fh = peer.open();
    let (u, rx) = peer.start_ioctl(fh, FUSE_IOCTL_UNRESTRICTED, CLIENT_WAIT, 7000, &[], 0);
    common::eventually("the handler runs", || dev.calls(CLIENT_WAIT) == 1);
    let (took, b) = hand_over(&peer, a, &dev, fh);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "the suspension took {took:?}"
    );
    assert_eq!(wait(&rx, u).errno(), libc::EFAULT);
    parked_handler_returns_silently(&peer, &dev, b);
}

/// Issue 20, 7 (CUSE), the full pool: every handler slot held by a thread parked on its
/// client's memory (each request already answered `EFAULT` by the watchdog) and more requests
/// that will park queued behind them, when the suspension starts. The suspension completes in
/// bounded time (the queued requests go to the next server, or are answered by the hurried
/// watchdog), each request is answered once, and the pool stays bounded.
#[test]
fn a_full_pool_of_parked_threads_and_a_queue_do_not_hold_a_suspension() {
    let dev = TestDevice::new();
    let a_cfg = DeviceConfig {
        client_wait_timeout: Duration::from_millis(200),
        max_workers: 2,
        ..cfg()
    };
    let (peer, a) = serve(a_cfg, &dev);
    let fh = peer.open();
    let parked: Vec<_> = (0..2)
        .map(|_| peer.start_ioctl(fh, FUSE_IOCTL_UNRESTRICTED, CLIENT_WAIT, 6500, &[], 0))
        .collect();
    for (u, rx) in &parked {
        assert_eq!(wait(rx, *u).errno(), libc::EFAULT);
    }
    // Three more that park as soon as they run, read while both slots are held.
    let queued: Vec<_> = (0..3)
        .map(|_| peer.start_ioctl(fh, FUSE_IOCTL_UNRESTRICTED, CLIENT_WAIT, 6500, &[], 0))
        .collect();
    thread::sleep(Duration::from_millis(100));
    let (took, b) = hand_over(&peer, a, &dev, fh);
    assert!(
        took < Duration::from_secs(4),
        "the suspension took {took:?}"
    );
    for (u, rx) in &queued {
        assert_eq!(wait(rx, *u).errno(), libc::EFAULT);
    }
    b.control.stop();
    assert!(b.thread.join().unwrap().unwrap().is_none());
    let v = &peer.violations.lock().unwrap().0;
    assert!(v.is_empty(), "{v:?}");
    assert!(
        peer.answered().values().all(|&n| n == 1),
        "a request answered twice: {:?}",
        peer.answered()
    );
}
