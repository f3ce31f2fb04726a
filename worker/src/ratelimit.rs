//! Rate limits of what a tenant can make the daemon write: the audit trail (`audit_log.rs`)
//! and every log line a tenant's calls can cause ([`tenant_log!`]).
//!
//! A tenant chooses how often it is refused, so a `WARN` per refused open or ioctl is a write
//! it controls: under systemd, journald's own rate limit would then drop every instance's
//! messages. So each instance has a token bucket for its tenant-caused lines
//! ([`tenant_log::LINES_PER_SECOND`], burst [`tenant_log::BURST`]); a line past it is
//! counted, not written, and the next line admitted is preceded by one `WARN` saying how many
//! were suppressed (as is the instance's stop, [`flush`]).
//!
//! The buckets are the `tenant-log` crate's, keyed by instance name: the lines `cuse-dev` and
//! `ioctl-proxy` write for an instance's tenants (malformed requests, stuck waits, missing
//! mapping files) share the same limit.

pub use tenant_log::{TokenBucket, flush};

/// `tracing::<level>!(...)` of a line a tenant can cause, through its instance's limit
/// (module docs): `tenant_log!(warn, instance, fields..., "message")`, the `tenant-log`
/// crate's macro (the line carries `instance`).
pub(crate) use tenant_log::tenant_log;

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use tenant_log::capture::captured;

    #[test]
    fn test_a_flood_of_refused_opens_writes_a_bounded_log_with_a_summary() {
        use crate::node::{Backend, Node};
        let sim = nvsim::SimDriver::new(nvsim::SimConfig::default_gpus(1));
        let mut policy = ioctl_proxy::InstancePolicy::new(
            "log-flood",
            nvproxy_abi::Caps::COMPUTE_UTILITY,
            vec![0],
        );
        policy.quotas.open_files = 1;
        let proxy = Arc::new(
            ioctl_proxy::Proxy::for_host(policy, sim as Arc<dyn ioctl_proxy::HostDriver>).unwrap(),
        );
        let backend = crate::backend::ProxyBackend::new(proxy);
        let first = backend.open(Node::Ctl, 1).unwrap();
        let refused = 5_000;
        let log = captured(|| {
            for _ in 0..refused {
                assert!(backend.open(Node::Ctl, 1).is_err());
            }
            flush("log-flood");
        });
        let lines = log.lines().filter(|l| l.contains("open failed")).count();
        assert!(
            lines as f64 <= tenant_log::BURST + 2.0,
            "{lines} lines for {refused} refused opens"
        );
        let summary = log
            .lines()
            .find(|l| l.contains("suppressed"))
            .expect("a summary");
        assert!(summary.contains("log-flood"), "{summary}");
        // Every refused open is either written or counted.
        let counted: usize = log
            .lines()
            .filter_map(|l| l.split("suppressed=").nth(1))
            .map(|n| {
                n.split_whitespace()
                    .next()
                    .unwrap()
                    .parse::<usize>()
                    .unwrap()
            })
            .sum();
        assert_eq!(lines + counted, refused, "{log}");
        backend.release(first);
    }
}
