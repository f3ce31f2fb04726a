//! Issue 20, 3: the log lines a tenant can cause through a session (32-bit ioctls refused,
//! malformed requests answered) go through the session's limit (`DeviceConfig::log_key`, the
//! `tenant-log` crate): a flood writes at most a burst of lines and a count of the rest.
//! Its own test binary: the serving threads log, so the capture is the process's subscriber.

mod common;

use common::Harness;
use common::device::*;
use cuse_dev::DeviceConfig;
use cuse_dev::wire::{FUSE_IOCTL_COMPAT, FUSE_OPEN, fuse_in_header};
use zerocopy::IntoBytes;

use tenant_log::capture::Capture;

#[test]
fn a_flood_of_refused_requests_writes_a_bounded_log_with_a_summary() {
    let out = Capture::default();
    tracing::subscriber::set_global_default(out.subscriber()).unwrap();
    let key = "log-flood-instance";
    let cfg = DeviceConfig {
        log_key: key.into(),
        ..DeviceConfig::new("nvproxy-test/log-flood")
    };
    let h = Harness::started(cfg, TestDevice::new());
    let fh = h.peer.open();
    let each = 1_000;
    for _ in 0..each {
        // A 32-bit process's ioctl.
        let (u, rx) = h.peer.start_ioctl(fh, FUSE_IOCTL_COMPAT, FAST, 0, &[], 0);
        assert_eq!(common::wait(&rx, u).errno(), libc::ENOTTY);
        // An OPEN whose body is too short (malformed).
        let unique = h.peer.unique();
        let mut b = fuse_in_header {
            len: 44,
            opcode: FUSE_OPEN,
            unique,
            pid: 1,
            ..Default::default()
        }
        .as_bytes()
        .to_vec();
        b.extend_from_slice(&[0; 4]);
        let rx = h.peer.expect_raw(unique, &b);
        assert_eq!(common::wait(&rx, unique).errno(), libc::EINVAL);
    }
    h.finish();
    tenant_log::flush(key);
    let log = out.text();
    let lines = log
        .lines()
        .filter(|l| l.contains("compat ioctl refused") || l.contains("malformed request"))
        .count();
    assert!(
        lines >= 1 && lines as f64 <= tenant_log::BURST + 2.0,
        "{lines} lines for {} refusals",
        2 * each
    );
    assert!(
        log.lines()
            .filter(|l| l.contains("compat ioctl refused") || l.contains("malformed request"))
            .all(|l| l.contains(key)),
        "every line names its instance"
    );
    let counted: usize = log
        .lines()
        .filter(|l| l.contains(key))
        .filter_map(|l| l.split("suppressed=").nth(1))
        .map(|n| {
            n.split_whitespace()
                .next()
                .unwrap()
                .parse::<usize>()
                .unwrap()
        })
        .sum();
    assert_eq!(lines + counted, 2 * each, "{log}");
}
