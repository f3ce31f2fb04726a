//! The socket transport's per-thread channels (protocol: `preload-proto`'s `socket` module,
//! "Channels"): a call on an open is one message on the calling thread's channel for that
//! open and one answer back, one round trip with no socket made and no fd passed.
//!
//! Each thread keeps up to [`SLOTS`] channels, keyed by the open's socket inode and the pid
//! that attached them. A channel is used only while its fd number still names the channel's
//! own inode (a program may `close` or `dup2` over any fd), by the process that attached it
//! (a forked child's copies are closed, not used, and it attaches its own), and by one call at
//! a time (a call made from a signal handler while the thread's call runs uses a temporary
//! channel). A thread's channels are closed when it exits (a pthread key's destructor); the
//! oldest is closed when a thread uses more opens than it has slots.
//!
//! No allocation, no locks: the table is a `Cell` in a thread-local without a destructor.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::devshim::{close, errno, receive, send};
use crate::proto::socket::{AttachRequest, CallOp, CallReply, CallRequest};

/// Channels a thread keeps.
const SLOTS: usize = 16;
/// Sends of one call (the first, and after channels the worker retired unread).
const ATTEMPTS: usize = 3;

#[derive(Clone, Copy)]
struct Chan {
    /// The open's socket (`st_dev`, `st_ino`); `open_ino` 0: a free slot.
    open_dev: u64,
    open_ino: u64,
    /// The process that attached it.
    pid: i32,
    fd: c_int,
    /// The channel's own socket (`st_dev`, `st_ino`).
    dev: u64,
    ino: u64,
    busy: bool,
    used: u64,
}

const FREE: Chan = Chan {
    open_dev: 0,
    open_ino: 0,
    pid: 0,
    fd: -1,
    dev: 0,
    ino: 0,
    busy: false,
    used: 0,
};

struct Table {
    slots: Cell<[Chan; SLOTS]>,
    tick: Cell<u64>,
    /// The pthread key's value is set on this thread (its destructor closes the channels).
    registered: Cell<bool>,
}

thread_local! {
    static TABLE: Table = const {
        Table {
            slots: Cell::new([FREE; SLOTS]),
            tick: Cell::new(0),
            registered: Cell::new(false),
        }
    };
}

fn getpid() -> i32 {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "getpid returns a pid_t, an int"
    )]
    // SAFETY: getpid takes no arguments and cannot fail.
    let pid = unsafe { libc::syscall(libc::SYS_getpid) as i32 };
    pid
}

/// `(st_dev, st_ino)` of `fd`, if it is open.
pub(crate) fn inode(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: `struct stat` is plain data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the raw fstat syscall writes at most sizeof(struct stat) into `st`, a live local.
    let r = unsafe { libc::syscall(libc::SYS_fstat, fd, &mut st as *mut libc::stat) };
    (r == 0).then_some((st.st_dev, st.st_ino))
}

/// Closes `c.fd` if the number still names the channel (else it is another file now).
fn retire(c: &Chan) {
    if c.fd >= 0 && inode(c.fd) == Some((c.dev, c.ino)) {
        close(c.fd);
    }
}

/// The pthread key whose destructor closes an exiting thread's channels (`u32::MAX`: none yet).
static KEY: AtomicU32 = AtomicU32::new(u32::MAX);

extern "C" fn thread_exit(_: *mut c_void) {
    let _ = TABLE.try_with(|t| {
        let pid = getpid();
        for c in t.slots.replace([FREE; SLOTS]) {
            if c.open_ino != 0 && c.pid == pid {
                retire(&c);
            }
        }
    });
}

/// Sets this thread's value of [`KEY`] (creating the key once), so that its channels are
/// closed when it exits.
fn register(t: &Table) {
    if t.registered.get() {
        return;
    }
    let mut key = KEY.load(Ordering::Acquire);
    if key == u32::MAX {
        let mut k: libc::pthread_key_t = 0;
        // SAFETY: pthread_key_create writes the new key into `k`, a live local; the destructor
        // is an `extern "C"` function taking the value.
        if unsafe { libc::pthread_key_create(&mut k, Some(thread_exit)) } != 0 {
            return;
        }
        key = match KEY.compare_exchange(u32::MAX, k, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => k,
            Err(other) => {
                // SAFETY: `k` was created above and never handed out.
                unsafe { libc::pthread_key_delete(k) };
                other
            }
        };
    }
    // SAFETY: `key` is a live key; the value is only compared with null by the C library.
    if unsafe { libc::pthread_setspecific(key, std::ptr::dangling::<u8>().cast()) } == 0 {
        t.registered.set(true);
    }
}

/// Makes a channel for the open `fd` names: `(fd, dev, ino)` of our end, or the errno.
fn attach(fd: c_int) -> Result<(c_int, u64, u64), c_int> {
    let mut sv = [-1 as c_int; 2];
    // SAFETY: socketpair writes two fds into `sv`, a live local array of two ints.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(errno());
    }
    let sent = send(fd, &AttachRequest { fd }.encode(), Some(sv[1]));
    close(sv[1]);
    if let Err(e) = sent {
        close(sv[0]);
        // The worker is gone: as CUSE's later calls on the file of a stopped server.
        return Err(match e {
            libc::EPIPE | libc::ECONNRESET | libc::ECONNREFUSED => libc::ENOTCONN,
            e => e,
        });
    }
    let mut buf = [0u8; CallReply::SIZE + 1];
    let answer = match receive(sv[0], &mut buf, libc::MSG_CMSG_CLOEXEC) {
        Ok((n, extra, truncated)) => {
            if let Some(x) = extra {
                close(x);
            }
            match (truncated, CallReply::decode(&buf[..n])) {
                (false, Some(r)) if r.errno == 0 && !r.retry => Ok(()),
                (false, Some(r)) if r.errno != 0 => Err(r.errno),
                _ => Err(if n == 0 { libc::ENOTCONN } else { libc::EIO }),
            }
        }
        Err(e) => Err(e),
    };
    let me = inode(sv[0]);
    match (answer, me) {
        (Ok(()), Some((dev, ino))) => Ok((sv[0], dev, ino)),
        (Err(e), _) => {
            close(sv[0]);
            Err(e)
        }
        (Ok(()), None) => {
            close(sv[0]);
            Err(libc::EIO)
        }
    }
}

/// How one exchange on a channel ended.
enum Exchange {
    Reply(CallReply, Option<c_int>),
    /// The channel was closed before the call reached the worker (or the worker retired it
    /// unread): attach another and send again.
    Again,
    Failed(c_int),
}

fn exchange(chan: c_int, msg: &[u8]) -> Exchange {
    match send(chan, msg, None) {
        Ok(()) => {}
        Err(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN) => return Exchange::Again,
        Err(e) => return Exchange::Failed(e),
    }
    let mut buf = [0u8; CallReply::SIZE + 1];
    let (n, hostfd, truncated) = match receive(chan, &mut buf, libc::MSG_CMSG_CLOEXEC) {
        Ok(x) => x,
        Err(e) => return Exchange::Failed(e),
    };
    let reply = if truncated {
        None
    } else {
        CallReply::decode(&buf[..n])
    };
    match reply {
        Some(r) if r.retry => {
            if let Some(h) = hostfd {
                close(h);
            }
            Exchange::Again
        }
        Some(r) => Exchange::Reply(r, hostfd),
        None => {
            if let Some(h) = hostfd {
                close(h);
            }
            // No answer (the worker dropped the call or stopped).
            Exchange::Failed(if n == 0 { libc::ENOTCONN } else { libc::EIO })
        }
    }
}

/// The slot of this thread's channel for the open `(dev, ino)`, marked busy, attaching one if
/// needed; `None` when the table cannot be used (a call already runs on it: the caller uses a
/// temporary channel). Forked copies and stale slots are cleared on the way.
fn take(t: &Table, fd: c_int, open: (u64, u64)) -> Result<Option<usize>, c_int> {
    let pid = getpid();
    let mut slots = t.slots.get();
    let tick = t.tick.get() + 1;
    t.tick.set(tick);
    let mut found = None;
    for (i, c) in slots.iter_mut().enumerate() {
        if c.open_ino == 0 {
            continue;
        }
        if c.pid != pid {
            // A forked child's copy of its parent's channel: not ours to use.
            retire(c);
            *c = FREE;
            continue;
        }
        if (c.open_dev, c.open_ino) == open {
            if c.busy {
                t.slots.set(slots);
                return Ok(None);
            }
            if inode(c.fd) == Some((c.dev, c.ino)) {
                found = Some(i);
            } else {
                *c = FREE; // the program closed or replaced the fd: nothing of ours to close
            }
        }
    }
    let i = match found {
        Some(i) => i,
        None => {
            let i = slots
                .iter()
                .position(|c| c.open_ino == 0)
                .unwrap_or_else(|| {
                    let (i, _) = slots
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| !c.busy)
                        .min_by_key(|(_, c)| c.used)
                        .unwrap_or((0, &slots[0]));
                    i
                });
            if slots[i].busy {
                t.slots.set(slots);
                return Ok(None);
            }
            if slots[i].open_ino != 0 {
                retire(&slots[i]);
                slots[i] = FREE;
            }
            // Marked busy before the attach's round trip: a signal handler's call meanwhile
            // takes a temporary channel.
            slots[i] = Chan {
                open_dev: open.0,
                open_ino: open.1,
                pid,
                fd: -1,
                busy: true,
                used: tick,
                ..FREE
            };
            t.slots.set(slots);
            register(t);
            match attach(fd) {
                Ok((chan, dev, ino)) => {
                    let mut s = t.slots.get();
                    s[i] = Chan {
                        fd: chan,
                        dev,
                        ino,
                        ..s[i]
                    };
                    t.slots.set(s);
                    return Ok(Some(i));
                }
                Err(e) => {
                    let mut s = t.slots.get();
                    s[i] = FREE;
                    t.slots.set(s);
                    return Err(e);
                }
            }
        }
    };
    slots[i].busy = true;
    slots[i].used = tick;
    t.slots.set(slots);
    Ok(Some(i))
}

/// Ends the use of slot `i`: kept for the next call, or closed (`keep` false).
fn put(t: &Table, i: usize, keep: bool) {
    let mut s = t.slots.get();
    if keep {
        s[i].busy = false;
    } else {
        retire(&s[i]);
        s[i] = FREE;
    }
    t.slots.set(s);
}

/// One call on the open `fd` (whose socket is `open`): the reply and, for an mmap, the host fd.
pub(crate) fn call(
    fd: c_int,
    open: (u64, u64),
    op: CallOp,
) -> Result<(CallReply, Option<c_int>), c_int> {
    let msg = CallRequest { fd, op }.encode();
    // A channel for this call alone (a call already runs on this thread's channel, or the
    // thread is exiting).
    let alone = || -> Result<Exchange, c_int> {
        let (chan, _, _) = attach(fd)?;
        let r = exchange(chan, &msg);
        close(chan);
        Ok(r)
    };
    for _ in 0..ATTEMPTS {
        let r = TABLE
            .try_with(|t| match take(t, fd, open)? {
                Some(i) => {
                    let r = exchange(t.slots.get()[i].fd, &msg);
                    put(t, i, !matches!(r, Exchange::Again));
                    Ok(r)
                }
                None => alone(),
            })
            .unwrap_or_else(|_| alone())?;
        match r {
            Exchange::Reply(reply, host) => return Ok((reply, host)),
            Exchange::Failed(e) => return Err(e),
            Exchange::Again => continue,
        }
    }
    Err(libc::EAGAIN)
}
