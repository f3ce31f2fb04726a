//! Building a [`HostCall`] from client bytes, and putting the results back: the one way both
//! request paths (the frontend's and the `uvm` crate's) prepare a host call.
//!
//! A [`Plan`] holds the translated call plus what the copy-out needs: where each buffer goes in
//! the client (only the buffers the driver writes), and the original bytes of every field the
//! proxy rewrote (pointers, fds), which are restored before anything is written back. The
//! client therefore sees its own pointer and fd values, as after the real driver's
//! `copy_to_user` of the whole struct.
//!
//! A plan's copy of the params is the request's one read of the client's bytes: handlers check
//! and read it ([`Plan::get`], [`Plan::buf`]) instead of reading the client again.

use host_driver::{HostCall, HostFile, NESTED_PTR_PLACEHOLDER, NestedBuf};
pub use host_driver::{NestedData, zeroed_nested};
use smallvec::SmallVec;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// What a handler reads client params as: a `#[repr(C)]` struct of `nvproxy-abi` whose layout
/// the parity test checks for every driver version.
pub trait Params: FromBytes + IntoBytes + Immutable + KnownLayout + Copy {}
impl<T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy> Params for T {}

pub(crate) use crate::bytes::{rd32, rd64, wr32, wr64};
use crate::error::ProxyError;

/// A buffer of a plan: `None`, the top-level params, or `Some(i)`, the nested buffer `i`
/// added by the request path. A buffer the plan does not have reads as empty and ignores
/// writes.
pub type Buf = Option<usize>;

/// The client's own bytes of a field the proxy rewrote (a pointer or an fd: at most 8).
#[derive(Debug, Clone, Copy)]
struct Restore {
    buf: Buf,
    off: usize,
    bytes: [u8; 8],
    len: u8,
}

/// A request names a handful of buffers and rewrites a handful of fields: the plan keeps
/// their bookkeeping inline, so the request path allocates only the buffers themselves.
const INLINE: usize = 6;

/// The nested buffers to copy back after a call, as `(client address, bytes)`.
pub type Outputs = SmallVec<[(u64, Vec<u8>); INLINE]>;

/// A host call under construction, with its copy-out plan.
#[derive(Debug)]
pub struct Plan {
    pub(crate) call: HostCall,
    /// Per nested buffer: the client address to copy it back to, if the driver writes it.
    outs: SmallVec<[Option<u64>; INLINE]>,
    restores: SmallVec<[Restore; INLINE]>,
}

impl Plan {
    /// A plan for `cmd` whose top-level params are a copy of `params` (the client's, already
    /// read; up to 64 bytes are kept inline).
    pub fn new(cmd: u32, params: &[u8]) -> Self {
        Self::with_params(cmd, NestedData::from_slice(params))
    }

    /// A plan for `cmd` whose top-level params are `params`.
    pub fn with_params(cmd: u32, params: NestedData) -> Self {
        Self {
            call: HostCall {
                cmd,
                params,
                nested: Default::default(),
            },
            outs: SmallVec::new(),
            restores: SmallVec::new(),
        }
    }

    /// A buffer's leading bytes as `T` (zeros where the buffer is shorter: callers size
    /// buffers by `T` first).
    pub fn get<T: Params>(&self, b: Buf) -> T {
        crate::bytes::read_prefix(self.buf(b))
    }

    /// The bytes of a buffer (the host's answer once the plan has run).
    pub fn buf(&self, b: Buf) -> &[u8] {
        match b {
            None => &self.call.params,
            Some(i) => self.call.nested.get(i).map_or(&[], |n| &n.data),
        }
    }

    /// The bytes of a buffer to write; `None` for a buffer the plan does not have.
    fn buf_mut(&mut self, b: Buf) -> Option<&mut [u8]> {
        match b {
            None => Some(&mut self.call.params[..]),
            Some(i) => self.call.nested.get_mut(i).map(|n| &mut n.data[..]),
        }
    }

    /// Writes `bytes` at `off` of a buffer (ignored where out of range).
    fn write(&mut self, b: Buf, off: usize, bytes: &[u8]) {
        let end = off.saturating_add(bytes.len());
        if let Some(s) = self.buf_mut(b).and_then(|d| d.get_mut(off..end)) {
            s.copy_from_slice(bytes);
        }
    }

    /// Keeps the client's `len` (4 or 8) bytes at `off` of `b` for [`Plan::into_outputs`]
    /// (the first value, if the field is rewritten twice).
    fn remember<const N: usize>(&mut self, b: Buf, off: usize) {
        const { assert!(N <= 8) };
        let end = off.saturating_add(N);
        let Some(src) = self.buf(b).get(off..end) else {
            return;
        };
        let mut bytes = [0u8; 8];
        bytes[..N].copy_from_slice(src);
        if !self.restores.iter().any(|r| r.buf == b && r.off == off) {
            #[expect(clippy::cast_possible_truncation, reason = "N <= 8")]
            self.restores.push(Restore {
                buf: b,
                off,
                bytes,
                len: N as u8,
            });
        }
    }

    /// Rewrites the 32-bit field at `off` (`offset_of!` of the params struct) for the host;
    /// the client gets its own value back, whatever the host writes there.
    pub fn rewrite32(&mut self, b: Buf, off: usize, v: u32) {
        self.remember::<4>(b, off);
        self.write(b, off, &v.to_ne_bytes());
    }

    /// Rewrites a 64-bit field for the host; the client gets its own value back.
    pub fn rewrite64(&mut self, b: Buf, off: usize, v: u64) {
        self.remember::<8>(b, off);
        self.write(b, off, &v.to_ne_bytes());
    }

    /// Sets a 32-bit field for the host *and* for the client (the driver's own answer, e.g. a
    /// status).
    pub fn set32(&mut self, b: Buf, off: usize, v: u32) {
        self.write(b, off, &v.to_ne_bytes());
    }

    /// Sets a 64-bit field for the host and the client (before the call: a value the client's
    /// answer is computed from afterwards, with another `set64`).
    pub fn set64(&mut self, b: Buf, off: usize, v: u64) {
        self.write(b, off, &v.to_ne_bytes());
    }

    /// Overwrites bytes of a buffer for host and client alike (output post-processing).
    pub(crate) fn overwrite(&mut self, b: Buf, off: usize, bytes: &[u8]) {
        self.write(b, off, bytes);
    }

    /// Runs the call on `host`; the buffers then hold the driver's answer. An errno of the
    /// host is [`ProxyError::Host`].
    pub fn exec(&mut self, host: &dyn HostFile) -> Result<i32, ProxyError> {
        host.ioctl(&mut self.call).map_err(ProxyError::Host)
    }

    /// Adds a daemon buffer for the pointer at `off` in `parent`: the host sees a non-null
    /// placeholder there (patched to the buffer's address by the real driver backend), the
    /// client gets its pointer back. `out` is the client address to copy the buffer back to,
    /// when the driver writes it. Returns the buffer's index.
    pub(crate) fn nest(
        &mut self,
        parent: Buf,
        off: usize,
        data: NestedData,
        out: Option<u64>,
    ) -> usize {
        self.rewrite64(parent, off, NESTED_PTR_PLACEHOLDER);
        self.call.nested.push(NestedBuf {
            parent,
            offset: off,
            data,
        });
        self.outs.push(out);
        self.call.nested.len() - 1
    }

    /// Nulls the pointer at `off` in `parent` for the host (no buffer).
    pub(crate) fn null_ptr(&mut self, parent: Buf, off: usize) {
        self.rewrite64(parent, off, 0);
    }

    /// After the host call: restores the client's field values and returns the top-level bytes
    /// plus the nested buffers to copy back as `(client address, bytes)`. Before it (a call
    /// refused by the proxy), the top-level bytes are the client's own, with what was `set`.
    pub fn into_outputs(mut self) -> (NestedData, Outputs) {
        self.restore_client_values();
        let mut outs = Outputs::new();
        for (n, out) in self.call.nested.into_iter().zip(self.outs) {
            if let Some(a) = out {
                outs.push((a, n.data.into_vec()));
            }
        }
        (self.call.params, outs)
    }

    /// After the host call: puts the client's own values back into the fields the proxy
    /// rewrote ([`Plan::into_outputs`] in steps, for a caller that writes the buffers out
    /// without moving them).
    pub(crate) fn restore_client_values(&mut self) {
        for i in 0..self.restores.len() {
            let r = self.restores[i];
            self.write(r.buf, r.off, &r.bytes[..usize::from(r.len)]);
        }
        self.restores.clear();
    }

    /// The nested buffers to copy back, as `(client address, bytes)`, in order.
    pub(crate) fn outputs(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.call
            .nested
            .iter()
            .zip(&self.outs)
            .filter_map(|(n, out)| out.map(|a| (a, n.data.as_slice())))
    }

    /// The top-level params (the client's, once [`Plan::restore_client_values`] ran), taken
    /// out of the plan (left empty).
    pub(crate) fn take_params(&mut self) -> NestedData {
        std::mem::take(&mut self.call.params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_nest_hides_client_pointer_and_restores_it() {
        let mut top = vec![0u8; 32];
        wr64(&mut top, 16, 0x7fff_0000_1000);
        let mut plan = Plan::new(1, &top);
        let i = plan.nest(
            None,
            16,
            NestedData::from_slice(&[1, 2, 3]),
            Some(0x7fff_0000_1000),
        );
        assert_eq!(rd64(&plan.call.params, 16), NESTED_PTR_PLACEHOLDER);
        assert_eq!(plan.call.nested[i].parent, None);
        let (top, outs) = plan.into_outputs();
        assert_eq!(rd64(&top, 16), 0x7fff_0000_1000);
        assert_eq!(outs.as_slice(), [(0x7fff_0000_1000, vec![1, 2, 3])]);
    }

    #[test]
    fn test_set_reaches_host_and_client_rewrite_only_the_host() {
        let mut plan = Plan::new(1, &[0; 16]);
        plan.rewrite32(None, 0, 5);
        plan.set32(None, 4, 6);
        plan.set64(None, 8, 7);
        assert_eq!((rd32(plan.buf(None), 0), rd32(plan.buf(None), 4)), (5, 6));
        let (top, _) = plan.into_outputs();
        assert_eq!((rd32(&top, 0), rd32(&top, 4), rd64(&top, 8)), (0, 6, 7));
    }

    #[test]
    fn test_a_buffer_the_plan_lacks_reads_empty_and_ignores_writes() {
        let mut plan = Plan::new(1, &[0; 8]);
        plan.rewrite32(Some(3), 0, 1);
        plan.set64(None, 4, u64::MAX);
        assert!(plan.buf(Some(3)).is_empty());
        assert_eq!(plan.into_outputs().0.as_slice(), [0; 8]);
    }

    #[test]
    fn test_rewrite_twice_restores_the_first_original() {
        let mut plan = Plan::new(1, &[7, 0, 0, 0]);
        plan.rewrite32(None, 0, 1);
        plan.rewrite32(None, 0, 2);
        assert_eq!(plan.into_outputs().0.as_slice(), [7, 0, 0, 0]);
    }
}
