//! Passing fds (`SCM_RIGHTS`): the one send and the one receive path of the daemon's unix
//! sockets, and the framings built on them ([`send_with_fd`], [`send_all`], [`recv_with_fd`],
//! [`send_fds`]/[`recv_fds`]).
//!
//! Sending goes through nix's `sendmsg` ([`send_to`]). Receiving is hand-written: the
//! kernel installs every fd a peer attaches into our table before `recvmsg` returns, as
//! many as fit in the control buffer; whatever does not fit it closes itself and flags the
//! message `MSG_CTRUNC`. So each fd that arrived is ours to close, whether or not the message
//! is one we want, and nothing here may skip a control message because the buffer was short
//! (nix's `cmsgs()` refuses to iterate a truncated buffer, which leaked every fd in it).
//!
//! [`recv`] sizes its control buffer for the most a unix socket can carry in one message
//! (credentials and [`SCM_MAX_FD`] fds), walks whatever the kernel wrote (truncated or not)
//! and returns every fd as an [`OwnedFd`]: a caller that expected fewer drops the surplus, and
//! dropping closes it. The caller refuses a frame whose fd count or truncation it does not
//! accept ([`Received::fds`], [`Received::truncated`]).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};

/// The most fds one `SCM_RIGHTS` message carries (`SCM_MAX_FD`, include/net/scm.h).
pub const SCM_MAX_FD: usize = 253;

/// `CMSG_SPACE(len)`: a header and `len` bytes of data, rounded up to the header's alignment.
const fn cmsg_space(len: usize) -> usize {
    let align = size_of::<usize>();
    (size_of::<libc::cmsghdr>() + len).div_ceil(align) * align
}

/// Room for one `SCM_CREDENTIALS` (`struct ucred`) and one `SCM_RIGHTS` of [`SCM_MAX_FD`]
/// fds, with headroom for one small message more; in `u64`s, so the buffer is aligned for
/// `cmsghdr`.
const CONTROL_WORDS: usize = (cmsg_space(size_of::<libc::ucred>())
    + cmsg_space(SCM_MAX_FD * size_of::<RawFd>())
    + cmsg_space(16))
.div_ceil(8);

/// One message as received.
#[derive(Debug)]
pub struct Received {
    /// Bytes of the message read into the buffer.
    pub bytes: usize,
    /// The message was longer than the buffer (`MSG_TRUNC`) or its control data was cut
    /// (`MSG_CTRUNC`: fds beyond the buffer were closed by the kernel).
    pub truncated: bool,
    /// The sender's pid from `SCM_CREDENTIALS` (only with `SO_PASSCRED` on the socket).
    pub pid: Option<u32>,
    /// Every fd that arrived (close-on-exec when asked with `MSG_CMSG_CLOEXEC`).
    pub fds: Vec<OwnedFd>,
}

/// `recvmsg(sock, buf, flags)` (retried on `EINTR`) with room for every fd a peer can attach;
/// all of them are returned (see the module docs).
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8], flags: libc::c_int) -> io::Result<Received> {
    let mut control = [0u64; CONTROL_WORDS];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all zeroes is a valid value (no name, no control).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control);
    let n = loop {
        // SAFETY: `msg` names `iov` (describing `buf`) and `control`, both live and writable
        // for their stated lengths, and `sock` is borrowed for the call; recvmsg writes only
        // inside them and updates `msg`'s lengths and flags.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, flags) };
        if let Ok(n) = usize::try_from(n) {
            break n;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            // A failed recvmsg installs nothing.
            return Err(e);
        }
    };
    let written = msg.msg_controllen.min(size_of_val(&control));
    let bytes: Vec<u8> = control.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let (pid, raw) = parse_control(&bytes[..written]);
    let fds = raw
        .into_iter()
        .map(|fd| {
            // SAFETY: the kernel installed `fd` in our table for this message alone (it is in
            // the SCM_RIGHTS data it wrote); nothing else in the process knows it, so this is
            // its only owner.
            unsafe { OwnedFd::from_raw_fd(fd) }
        })
        .collect();
    Ok(Received {
        bytes: n,
        truncated: msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0,
        pid,
        fds,
    })
}

/// `sendmsg(sock, bytes, flags, addr)` with `fds` attached in one `SCM_RIGHTS` control
/// message (none when `fds` is empty): the one send path. `addr`: the destination of an
/// unconnected datagram socket, else `None`. Returns the bytes sent.
pub fn send_to(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[RawFd],
    flags: MsgFlags,
    addr: Option<&UnixAddr>,
) -> nix::Result<usize> {
    let iov = [io::IoSlice::new(bytes)];
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
    sendmsg(sock.as_raw_fd(), &iov, cmsgs, flags, addr)
}

/// Sends one message `bytes` on `conn` with `fd` attached (`SCM_RIGHTS`) when given;
/// `MSG_NOSIGNAL` always, plus `flags`.
pub fn send_with_fd(
    conn: BorrowedFd<'_>,
    bytes: &[u8],
    fd: Option<&OwnedFd>,
    flags: MsgFlags,
) -> nix::Result<usize> {
    let raw = fd.map(|f| [f.as_raw_fd()]);
    send_to(
        conn,
        bytes,
        raw.as_ref().map_or(&[], |r| &r[..]),
        flags | MsgFlags::MSG_NOSIGNAL,
        None,
    )
}

/// Sends all of `bytes` on the stream socket `sock` with `fds` attached (`MSG_NOSIGNAL`); a
/// short send is an error.
pub fn send_all(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let n = send_to(sock, bytes, fds, MsgFlags::MSG_NOSIGNAL, None)?;
    if n != bytes.len() {
        return Err(io::Error::other("short sendmsg"));
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes from the stream socket `sock` and the fd attached to them,
/// if any (close-on-exec). Returns the byte count (0: the peer closed). A message with more
/// than one fd, or whose fds were cut short, is refused (every fd that came with it closed).
pub fn recv_with_fd(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut msg = recv(sock, buf, libc::MSG_CMSG_CLOEXEC)?;
    if msg.fds.len() > 1 {
        return Err(io::Error::other(format!(
            "{} fds attached, at most one expected (closed)",
            msg.fds.len()
        )));
    }
    Ok((msg.bytes, msg.fds.pop()))
}

/// Most fds one [`send_fds`] message carries (the kernel's `SCM_MAX_FD` is 253).
pub const FDS_PER_MESSAGE: usize = 250;

/// Sends one byte on the stream socket `sock` with `fds` attached (at most
/// [`FDS_PER_MESSAGE`]).
pub fn send_fds(sock: BorrowedFd<'_>, fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > FDS_PER_MESSAGE {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    send_all(sock, b"F", fds)
}

/// Receives the one byte of a [`send_fds`] message and its fds (close-on-exec); fails when
/// the peer closed, the byte is not ours, the kernel truncated the fds or more than
/// [`FDS_PER_MESSAGE`] came (whatever arrived is closed then).
pub fn recv_fds(sock: BorrowedFd<'_>) -> io::Result<Vec<OwnedFd>> {
    let mut byte = [0u8; 1];
    let msg = recv(sock, &mut byte, libc::MSG_CMSG_CLOEXEC)?;
    if msg.bytes != 1 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed",
        ));
    }
    if msg.truncated {
        return Err(io::Error::other("fds truncated (fd limit?)"));
    }
    if byte != *b"F" {
        return Err(io::Error::other("not an fd message"));
    }
    if msg.fds.len() > FDS_PER_MESSAGE {
        return Err(io::Error::other(format!(
            "{} fds in one message, at most {FDS_PER_MESSAGE} expected",
            msg.fds.len()
        )));
    }
    Ok(msg.fds)
}

/// The sender's pid and the fds in the control data the kernel wrote (`bytes`: exactly
/// `msg_controllen` of them). Walks `cmsghdr`s as `CMSG_NXTHDR` does, bounded by `bytes`: a
/// header cut short ends the walk, data cut short yields only the whole fds in it.
fn parse_control(bytes: &[u8]) -> (Option<u32>, Vec<RawFd>) {
    const HEADER: usize = size_of::<libc::cmsghdr>();
    const ALIGN: usize = size_of::<usize>();
    const LEVEL: usize = std::mem::offset_of!(libc::cmsghdr, cmsg_level);
    const TYPE: usize = std::mem::offset_of!(libc::cmsghdr, cmsg_type);
    let word = |at: usize| i32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let mut pid = None;
    let mut fds = Vec::new();
    let mut at = 0usize;
    while at + HEADER <= bytes.len() {
        let len = usize::from_ne_bytes(bytes[at..at + ALIGN].try_into().expect("a usize"));
        if len < HEADER {
            break;
        }
        let end = at.saturating_add(len).min(bytes.len());
        let data = at + HEADER..end;
        match (word(at + LEVEL), word(at + TYPE)) {
            (libc::SOL_SOCKET, libc::SCM_RIGHTS) => {
                let mut d = data.start;
                while d + 4 <= data.end {
                    let fd = word(d);
                    if fd >= 0 {
                        fds.push(fd);
                    }
                    d += 4;
                }
            }
            (libc::SOL_SOCKET, libc::SCM_CREDENTIALS) if data.len() >= 4 => {
                pid = u32::try_from(word(data.start)).ok();
            }
            _ => {}
        }
        at = match at.checked_add(len.div_ceil(ALIGN) * ALIGN) {
            Some(next) => next,
            None => break,
        };
    }
    (pid, fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{self, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType};
    use std::io::IoSlice;
    use std::os::fd::AsFd;

    fn pair() -> (OwnedFd, OwnedFd) {
        socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    fn send(s: &OwnedFd, bytes: &[u8], fds: &[RawFd]) {
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
        socket::sendmsg::<()>(
            s.as_raw_fd(),
            &[IoSlice::new(bytes)],
            cmsgs,
            MsgFlags::empty(),
            None,
        )
        .unwrap();
    }

    /// Whether every descriptor of `peer`'s other end is closed: the peer sees a hang-up only
    /// when the last reference to its partner's socket is gone. (Checking fd numbers would race
    /// with the other tests of this binary, which reuse them.)
    fn partner_is_gone(peer: &OwnedFd) -> bool {
        let mut poll = [nix::poll::PollFd::new(
            peer.as_fd(),
            nix::poll::PollFlags::empty(),
        )];
        nix::poll::poll(&mut poll, nix::poll::PollTimeout::ZERO).unwrap();
        poll[0]
            .revents()
            .is_some_and(|r| r.contains(nix::poll::PollFlags::POLLHUP))
    }

    #[test]
    fn test_every_fd_of_a_full_message_arrives_and_is_owned() {
        let (a, b) = pair();
        let (x, y) = pair();
        let many = vec![x.as_raw_fd(); SCM_MAX_FD];
        send(&a, b"hello", &many);
        drop(x);
        let mut buf = [0u8; 16];
        let got = recv(b.as_fd(), &mut buf, libc::MSG_CMSG_CLOEXEC).unwrap();
        assert_eq!((got.bytes, got.truncated), (5, false));
        assert_eq!(got.fds.len(), SCM_MAX_FD);
        assert!(!partner_is_gone(&y), "the received copies keep it open");
        drop(got);
        // Dropping the message closed every fd it brought.
        assert!(partner_is_gone(&y));
    }

    #[test]
    fn test_credentials_and_a_short_buffer() {
        let (a, b) = pair();
        socket::setsockopt(&b, socket::sockopt::PassCred, &true).unwrap();
        let (x, _y) = pair();
        send(&a, b"0123456789", &[x.as_raw_fd(), x.as_raw_fd()]);
        let mut buf = [0u8; 4];
        let got = recv(b.as_fd(), &mut buf, 0).unwrap();
        assert!(got.truncated, "MSG_TRUNC");
        assert_eq!(got.pid, Some(std::process::id()));
        assert_eq!(got.fds.len(), 2);
    }

    #[test]
    fn test_a_cut_control_buffer_yields_the_whole_fds_only() {
        let fd: i32 = 7;
        let mut bytes = vec![0u8; 0];
        let header = size_of::<libc::cmsghdr>();
        let len = header + 3 * 4;
        bytes.extend(len.to_ne_bytes());
        bytes.extend(libc::SOL_SOCKET.to_ne_bytes());
        bytes.extend(libc::SCM_RIGHTS.to_ne_bytes());
        for _ in 0..3 {
            bytes.extend(fd.to_ne_bytes());
        }
        // Cut in the middle of the third fd, and a header cut short after it.
        let (_, fds) = parse_control(&bytes[..header + 10]);
        assert_eq!(fds, vec![7, 7]);
        let (_, fds) = parse_control(&bytes[..header - 1]);
        assert!(fds.is_empty());
        // A zero length ends the walk instead of looping.
        let (_, fds) = parse_control(&[0u8; 64]);
        assert!(fds.is_empty());
    }
}
