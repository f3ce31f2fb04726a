//! The caller's side of a request besides its memory: who calls, its fd table, and an audit
//! sink that keeps what the proxy reports.

use std::collections::HashMap;
use std::sync::Mutex;

use ioctl_proxy::{AuditEvent, AuditSink, Caller, FdError, FdResolver, OpenId};

/// The process and thread every test request comes from.
pub const CALLER: Caller = Caller {
    pid: 4242,
    tid: 4243,
    since: None,
};

/// The caller's fd table: fd number → open, or the error resolving it gives; any other fd is
/// [`FdError::Foreign`].
#[derive(Default)]
pub struct FakeFds(pub HashMap<i32, Result<OpenId, FdError>>);

impl FakeFds {
    /// `fd` names `open`.
    pub fn add(&mut self, fd: i32, open: OpenId) {
        self.0.insert(fd, Ok(open));
    }
}

impl FdResolver for FakeFds {
    fn resolve(&self, fd: i32) -> Result<OpenId, FdError> {
        self.0.get(&fd).copied().unwrap_or(Err(FdError::Foreign))
    }
}

/// Keeps every audit event.
#[derive(Default)]
pub struct Events(pub Mutex<Vec<AuditEvent>>);

impl AuditSink for Events {
    fn record(&self, ev: &AuditEvent) {
        self.0.lock().unwrap().push(ev.clone());
    }
}

impl Events {
    /// The events so far, oldest first.
    pub fn all(&self) -> Vec<AuditEvent> {
        self.0.lock().unwrap().clone()
    }
}
