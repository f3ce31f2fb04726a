//! Frames with fds as the socket transport's worker receives them from a tenant: the worker's
//! one receive path (`nvproxy_worker::fdpass`) gets a frame of any bytes with any number of fds attached, up to the kernel's
//! `SCM_MAX_FD`, into a buffer of any size.
//!
//! Invariants: every fd that was sent arrives as an owned fd (none is left installed and
//! unowned, the leak of a truncated control buffer), the bytes and the truncation flag are what
//! was sent, and dropping the frame closes every fd it brought.
//!
//! Input: `[fds, buffer, flags, payload...]`: `fds` scaled to `0..=SCM_MAX_FD`, `buffer` the
//! receive buffer's length, `flags` bit 0 credentials on (`SO_PASSCRED`), the payload at most
//! 256 bytes.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

use nix::sys::socket::{
    self, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, sockopt,
};
use nvproxy_worker::fdpass;

/// The most payload bytes one input sends.
pub const MAX_PAYLOAD: usize = 256;

/// `(st_dev, st_ino)` of the file `fd` names, if it is open.
fn identity(fd: RawFd) -> Option<(u64, u64)> {
    let f = std::fs::metadata(format!("/proc/self/fd/{fd}")).ok()?;
    Some((f.dev(), f.ino()))
}

/// Sends one frame as `data` says and receives it; panics when an invariant breaks.
pub fn run(data: &[u8]) {
    let [fds, buffer, flags, payload @ ..] = data else {
        return;
    };
    let nfds = usize::from(*fds) * fdpass::SCM_MAX_FD / 255;
    let buffer = usize::from(*buffer);
    let payload = &payload[..payload.len().min(MAX_PAYLOAD)];
    let (tx, rx) = socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .expect("socketpair");
    if flags & 1 != 0 {
        socket::setsockopt(&rx, sockopt::PassCred, &true).expect("SO_PASSCRED");
    }
    // The fds sent: copies of one end of a pipe made for this input, so that what arrives can
    // be told from any other file of the process.
    let (pipe_r, _pipe_w) = nix::unistd::pipe().expect("pipe");
    let sent = identity(pipe_r.as_raw_fd()).expect("the pipe");
    let raw = vec![pipe_r.as_raw_fd(); nfds];
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if nfds == 0 { &[] } else { &rights };
    socket::sendmsg::<()>(
        tx.as_raw_fd(),
        &[IoSlice::new(payload)],
        cmsgs,
        MsgFlags::empty(),
        None,
    )
    .expect("sendmsg");
    let mut buf = vec![0u8; buffer];
    let got = fdpass::recv(rx.as_fd(), &mut buf, libc::MSG_CMSG_CLOEXEC).expect("recv");
    assert_eq!(got.fds.len(), nfds, "every fd sent arrives, owned");
    assert_eq!(got.bytes, payload.len().min(buffer));
    assert_eq!(&buf[..got.bytes], &payload[..got.bytes]);
    assert_eq!(got.truncated, payload.len() > buffer, "MSG_TRUNC only");
    if flags & 1 != 0 {
        assert_eq!(got.pid, Some(std::process::id()));
    }
    for fd in &got.fds {
        assert_eq!(identity(fd.as_raw_fd()), Some(sent), "an fd that was sent");
    }
    let numbers: Vec<RawFd> = got.fds.iter().map(OwnedFd::as_raw_fd).collect();
    drop(got);
    // Closed: the numbers are free, or (another thread of a test binary) name another file.
    for fd in numbers {
        assert_ne!(
            identity(fd),
            Some(sent),
            "fd {fd} still open after the frame"
        );
    }
}

#[cfg(test)]
mod frame_tests {
    #[test]
    fn test_frames_with_surplus_fds() {
        for fds in [0u8, 1, 4, 5, 8, 64, 254, 255] {
            for buffer in [0u8, 4, 96, 255] {
                for flags in [0u8, 1] {
                    let mut input = vec![fds, buffer, flags];
                    input.extend((0..100u8).map(|b| b.wrapping_mul(7)));
                    super::run(&input);
                }
            }
        }
    }
}
