//! The request kit both request paths use, the frontend's ([`crate::Proxy`]) and UVM's (the
//! `uvm` crate): what a request's audit record says ([`Note`]), a handler's early exit
//! ([`Stop`]: an errno, or an NV status answered with ioctl success) and its constructors, the
//! mapping of client-memory failures to the driver's answers, and the accounting of a finished
//! request ([`crate::Proxy::account`]: one rule for what counts as failed, counts, audit
//! events). One copy, so the two paths cannot drift.

use std::borrow::Cow;

use crate::audit::{Decision, Kind};
use crate::error::ProxyError;
use crate::memory::MemError;
use crate::nv::*;
use crate::policy::Verdict;

/// What the audit event of a request says.
#[derive(Debug, Clone)]
pub struct Note {
    /// Which table the entry is from.
    pub kind: Kind,
    /// The entry's name; empty for an entry the table does not know, named at the end from
    /// `kind` and `number` ([`Kind::unknown_name`]) so that known entries, the
    /// common case, cost no formatting.
    pub name: Cow<'static, str>,
    /// The escape number, control command, class or UVM command.
    pub number: u32,
    /// The decision so far.
    pub decision: Decision,
    /// Why, when the proxy refused or failed the call itself.
    pub reason: Option<&'static str>,
    /// The NV status the client saw, when the call has one.
    pub nv_status: Option<u32>,
}

impl Note {
    /// A note for entry `number` of `kind`, allowed until a handler says otherwise, named by
    /// the table later (empty: unknown).
    pub fn new(kind: Kind, number: u32) -> Self {
        Self {
            kind,
            name: Cow::Borrowed(""),
            number,
            decision: Decision::Allowed,
            reason: None,
            nv_status: None,
        }
    }

    /// Records the policy's verdict on the call's table entry; whether the call goes on
    /// (`false`: denied, and the handler answers as if the entry were absent).
    pub fn judged(&mut self, verdict: Verdict) -> bool {
        let (decision, go_on) = match verdict {
            Verdict::Allow => return true,
            Verdict::AuditWouldDeny => (Decision::AuditWouldDeny, true),
            Verdict::Deny => (Decision::Denied, false),
        };
        self.decision = decision;
        self.reason = Some("policy");
        go_on
    }

    /// Records a [`Stop::Status`] answer. An audit-mode "would deny" stays unless the stop is
    /// itself a denial or failure.
    pub fn stopped(&mut self, status: u32, decision: Decision, reason: &'static str) {
        if self.decision != Decision::AuditWouldDeny || decision != Decision::Allowed {
            self.decision = decision;
        }
        self.reason = Some(reason);
        self.nv_status = Some(status);
    }
}

/// Whether an NV status is a failure: anything but `NV_OK` and the warnings (`NV_WARN_*` are
/// answers: `MM_INITIALIZE` in multi-process sharing mode says `NV_WARN_NOTHING_TO_DO` to every
/// CUDA process).
pub fn status_failed(status: u32) -> bool {
    status != NV_OK && !nvproxy_abi::status::is_warning(status)
}

/// A handler's early exit: an errno, or an NV status answered with ioctl success.
#[derive(Debug)]
pub enum Stop {
    /// Fail the ioctl with this error.
    Err(ProxyError),
    /// Answer this NV status in the params, with ioctl success.
    Status {
        /// The status.
        status: u32,
        /// What the audit records.
        decision: Decision,
        /// Why, in a few words.
        reason: &'static str,
    },
}

impl From<ProxyError> for Stop {
    fn from(e: ProxyError) -> Self {
        Stop::Err(e)
    }
}

/// Refused before the host saw it (isolation, unknown entry, policy): decision `denied`.
pub fn deny<T>(status: u32, reason: &'static str) -> Result<T, Stop> {
    Err(Stop::Status {
        status,
        decision: Decision::Denied,
        reason,
    })
}

/// Answered by the proxy with the driver's error status for malformed input: `failed`.
pub fn fail<T>(status: u32, reason: &'static str) -> Result<T, Stop> {
    Err(Stop::Status {
        status,
        decision: Decision::Failed,
        reason,
    })
}

/// Answered by the proxy with `NV_OK` without reaching the host (the driver's no-ops).
pub fn answer_ok<T>(reason: &'static str) -> Result<T, Stop> {
    Err(Stop::Status {
        status: NV_OK,
        decision: Decision::Allowed,
        reason,
    })
}

/// A failed access to the top-level params: `EFAULT`, as `copy_from_user` in `nvidia_ioctl`.
pub fn top_err(e: MemError) -> ProxyError {
    match e {
        MemError::Pending => ProxyError::Pending,
        MemError::Fault | MemError::TooLarge(_) => ProxyError::Fault,
    }
}

/// Maps a failed nested-buffer access to what the driver says: `os_memcpy_from_user` fails
/// with `NV_ERR_INVALID_ADDRESS` (`kernel-open/nvidia/os-interface.c`), which
/// `rmapiParamsAcquire` puts in the call's status; the ioctl itself succeeds.
pub fn nested_err(e: MemError) -> Stop {
    match e {
        MemError::Pending => Stop::Err(ProxyError::Pending),
        MemError::Fault => Stop::Status {
            status: NV_ERR_INVALID_ADDRESS,
            decision: Decision::Failed,
            reason: "bad nested pointer",
        },
        MemError::TooLarge(_) => Stop::Status {
            status: NV_ERR_INVALID_ARGUMENT,
            decision: Decision::Failed,
            reason: "nested buffer too large",
        },
    }
}
