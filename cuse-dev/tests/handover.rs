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
