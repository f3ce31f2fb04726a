//! Writing to the CUSE channel: every message is one `writev` ([`write_all_once`]); replies
//! and their logging (`send_*`), used by the serving threads, the handler's late replies and
//! the client-wait watchdog alike. Imports nothing above `wire`.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::AsFd;

use tenant_log::tenant_log;
use tracing::debug;
use zerocopy::IntoBytes;

use crate::errno::Errno;
use crate::wire::{self, FUSE_INTERRUPT, ReplyBody, fuse_in_header};

/// Writes `parts` (at most 4) as one message with one `writev`, retrying only on EINTR.
pub(crate) fn write_all_once(chan: &File, parts: &[&[u8]]) -> io::Result<()> {
    let mut slices = [IoSlice::new(&[]); 4];
    if parts.len() > slices.len() {
        return Err(io::Error::other("too many parts for one CUSE message"));
    }
    for (s, p) in slices.iter_mut().zip(parts) {
        *s = IoSlice::new(p);
    }
    let slices = &slices[..parts.len()];
    let want: usize = parts.iter().map(|p| p.len()).sum();
    loop {
        match crate::sys::writev(chan.as_fd(), slices) {
            Ok(n) if n == want => return Ok(()),
            Ok(n) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("short write to CUSE channel: {n} of {want} bytes"),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Writes one reply (header + body) with one `writev`.
pub(crate) fn send_reply(
    chan: &File,
    unique: u64,
    reply: Result<&ReplyBody, Errno>,
) -> io::Result<()> {
    let (hdr, [a, b]) = match reply {
        Ok(body) => (wire::reply_header(unique, None, body.len()), body.parts()),
        Err(e) => (wire::reply_header(unique, Some(e), 0), [&[][..], &[][..]]),
    };
    let hdr = hdr.map_err(io::Error::other)?;
    write_all_once(chan, &[hdr.as_bytes(), a, b])
}

/// Sends a reply and logs a failure: ENOENT (the request is gone: interrupted, aborted) at
/// debug, anything else as an error.
pub(crate) fn send_logged(chan: &File, key: &str, unique: u64, reply: Result<&ReplyBody, Errno>) {
    match send_reply(chan, unique, reply) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            debug!("reply target gone (ENOENT): request was interrupted or aborted");
        }
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
            debug!("reply after the connection ended (ENODEV)");
        }
        Err(e) => tenant_log!(error, key, error = %e, "cannot write reply"),
    }
}

/// An error reply from outside a handler (the client-wait watchdog).
pub(crate) fn send_error(chan: &File, key: &str, unique: u64, errno: Errno) {
    send_logged(chan, key, unique, Err(errno));
}

/// A reply written by the reader itself (protocol errors); never for unique 0 or INTERRUPT.
pub(crate) fn reply_direct(
    chan: &File,
    key: &str,
    hdr: &fuse_in_header,
    reply: Result<&ReplyBody, Errno>,
) {
    if hdr.unique == 0 || hdr.opcode == FUSE_INTERRUPT {
        tenant_log!(
            warn,
            key,
            opcode = hdr.opcode,
            unique = hdr.unique,
            "not answering this request"
        );
        return;
    }
    send_logged(chan, key, hdr.unique, reply);
}
