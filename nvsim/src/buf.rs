//! Reading and writing the buffers of a [`HostCall`] by position.

use host_driver::HostCall;
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// Where a buffer of a call lives: the top-level params or one of the nested buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loc {
    /// `HostCall::params`.
    Params,
    /// `HostCall::nested[i]`.
    Nested(usize),
}

impl Loc {
    fn as_parent(self) -> Option<usize> {
        match self {
            Loc::Params => None,
            Loc::Nested(i) => Some(i),
        }
    }
}

/// The bytes at `loc`.
pub(crate) fn bytes(call: &HostCall, loc: Loc) -> &[u8] {
    match loc {
        Loc::Params => &call.params,
        Loc::Nested(i) => call.nested.get(i).map_or(&[][..], |n| &n.data[..]),
    }
}

/// The bytes at `loc`, writable.
pub(crate) fn bytes_mut(call: &mut HostCall, loc: Loc) -> &mut [u8] {
    match loc {
        Loc::Params => &mut call.params,
        Loc::Nested(i) => call
            .nested
            .get_mut(i)
            .map_or(&mut [][..], |n| &mut n.data[..]),
    }
}

/// The buffer named by the pointer at `offset` inside the buffer at `parent`, or `None` when the
/// pointer is NULL (no nested buffer was supplied for it).
pub(crate) fn child(call: &HostCall, parent: Loc, offset: usize) -> Option<Loc> {
    call.nested
        .iter()
        .position(|n| n.parent == parent.as_parent() && n.offset == offset)
        .map(Loc::Nested)
}

/// A copy of the `T` at `offset` in `buf`, if it fits.
pub(crate) fn read<T: FromBytes>(buf: &[u8], offset: usize) -> Option<T> {
    T::read_from_prefix(buf.get(offset..)?).ok().map(|(t, _)| t)
}

/// Writes `value` at `offset` in `buf`; false if it does not fit.
pub(crate) fn write<T: IntoBytes + Immutable>(buf: &mut [u8], offset: usize, value: &T) -> bool {
    let src = value.as_bytes();
    match offset
        .checked_add(src.len())
        .and_then(|end| buf.get_mut(offset..end))
    {
        Some(dst) => {
            dst.copy_from_slice(src);
            true
        }
        None => false,
    }
}

/// Reads the `T` at `offset` of the buffer at `loc`.
pub(crate) fn read_at<T: FromBytes>(call: &HostCall, loc: Loc, offset: usize) -> Option<T> {
    read(bytes(call, loc), offset)
}

/// Writes `value` at `offset` of the buffer at `loc`.
pub(crate) fn write_at<T: IntoBytes + Immutable>(
    call: &mut HostCall,
    loc: Loc,
    offset: usize,
    value: &T,
) -> bool {
    write(bytes_mut(call, loc), offset, value)
}

/// Copies `s` into `dst` as a NUL-terminated C string (truncated to fit), zeroing the rest.
pub(crate) fn put_cstr(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let n = s.len().min(dst.len().saturating_sub(1));
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}
