//! A test device: a byte buffer, an int register, ioctls that need 0-3 retry rounds, a slow
//! ioctl, poll with notify, and ioctls whose replies the session must refuse.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuse_dev::{Errno, Handler, InitInfo, IoVec, Ioctl, IoctlReply, Opened, PollHandle, Request};

pub const fn ioc(dir: u32, nr: u8, size: u32) -> u32 {
    (dir << 30) | (size << 16) | ((b'T' as u32) << 8) | nr as u32
}
/// `_IOR('T', 1, int)`: read the register.
pub const GET: u32 = ioc(2, 1, 4);
/// `_IOW('T', 2, int)`: set the register.
pub const SET: u32 = ioc(1, 2, 4);
/// `_IOWR('T', 3, int)`: `*arg += 1` (one retry round when unrestricted).
pub const INCR: u32 = ioc(3, 3, 4);
/// `_IO('T', 4)`: `arg` → `Xform`; upper-cases `len` bytes from `in_ptr` into `out_ptr`
/// (two retry rounds). Returns `len`.
pub const XFORM: u32 = ioc(0, 4, 0);
/// `_IO('T', 5)`: `arg` → `u64` pointer → `Xform`; reverses the bytes (three retry rounds).
pub const NESTED: u32 = ioc(0, 5, 0);
/// `_IO('T', 6)`: waits `arg` ms or until interrupted (EINTR). Returns 1.
pub const SLOW: u32 = ioc(0, 6, 0);
/// `_IO('T', 7)`: returns 7 at once.
pub const FAST: u32 = ioc(0, 7, 0);
/// Retry naming 257 iovecs.
pub const BIG_IOV: u32 = ioc(0, 8, 0);
/// Retry naming 128 KiB + 1 input bytes.
pub const BIG_BYTES: u32 = ioc(0, 9, 0);
/// Panics.
pub const PANIC: u32 = ioc(0, 10, 0);
/// Returns a negative result.
pub const NEGATIVE: u32 = ioc(0, 11, 0);
/// Returns more output than `out_size`.
pub const OUT_TOO_LONG: u32 = ioc(0, 12, 0);
/// Asks for a retry even when restricted.
pub const ALWAYS_RETRY: u32 = ioc(0, 13, 0);
/// 256 one-byte input iovecs at `arg..arg+256` (the most the kernel takes); returns their sum.
pub const MANY_IOV: u32 = ioc(0, 14, 0);

/// `_IO('T', 15)`: waits up to `arg` ms for a FAST ioctl to be served meanwhile (as a handler
/// that sends a request to its own device and waits for it). Returns 1, or ETIMEDOUT.
pub const WAIT_FAST: u32 = ioc(0, 15, 0);

/// `_IO('T', 16)`: arms a client wait and then blocks `arg` ms whatever happens (as a
/// `process_vm_readv` on a page the client's `userfaultfd` holds); returns 1, or EFAULT when
/// the wait fired (a reply the session must drop).
pub const CLIENT_WAIT: u32 = ioc(0, 16, 0);

/// Size of `Xform { in_ptr: u64, out_ptr: u64, len: u32, pad: u32 }`.
pub const XFORM_SIZE: u64 = 24;

/// `_IOR('T', 17, int)`: answers at once ([`cuse_dev::EarlyAnswer`]) with result 5 and the
/// register, then waits up to `arg` ms for [`TestDevice::early_gate`] and returns 99 (an
/// answer the session must not send: the request was answered).
pub const EARLY: u32 = ioc(2, 17, 4);
/// `_IOR('T', 18, int)`: an early answer with 8 bytes (more than the 4 the kernel copies
/// back), which must not go out; then returns 6.
pub const EARLY_TOO_LONG: u32 = ioc(2, 18, 4);

#[derive(Default)]
pub struct TestDevice {
    next_fh: AtomicU64,
    pub register: Mutex<i32>,
    pub buffer: Mutex<Vec<u8>>,
    pub pollers: Mutex<Vec<PollHandle>>,
    pub calls: Mutex<HashMap<u32, usize>>,
    pub releases: Mutex<Vec<u64>>,
    pub init: Mutex<Option<InitInfo>>,
    pub poll_notify_seen: Mutex<Vec<bool>>,
    /// For each CLIENT_WAIT that finished: whether its wait fired.
    pub client_waits_fired: Mutex<Vec<bool>>,
    /// Lets a waiting EARLY handler return.
    pub early_gate: std::sync::atomic::AtomicBool,
    /// For each EARLY / EARLY_TOO_LONG: whether its early answer was sent.
    pub early_sent: Mutex<Vec<bool>>,
    /// EARLY handlers that returned.
    pub early_returned: AtomicU64,
}

impl TestDevice {
    pub fn new() -> Arc<Self> {
        Arc::new(TestDevice {
            next_fh: AtomicU64::new(100),
            ..Default::default()
        })
    }

    pub fn calls(&self, cmd: u32) -> usize {
        self.calls.lock().unwrap().get(&cmd).copied().unwrap_or(0)
    }
}

fn xform(bytes: &[u8]) -> Option<(u64, u64, u64)> {
    let b = bytes.get(..24)?;
    let in_ptr = u64::from_ne_bytes(b[0..8].try_into().ok()?);
    let out_ptr = u64::from_ne_bytes(b[8..16].try_into().ok()?);
    let len = u32::from_ne_bytes(b[16..20].try_into().ok()?);
    Some((in_ptr, out_ptr, u64::from(len)))
}

fn int(bytes: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?))
}

impl Handler for TestDevice {
    fn init_done(&self, info: &InitInfo) {
        *self.init.lock().unwrap() = Some(*info);
    }

    fn open(&self, _req: &Request, flags: u32) -> Result<Opened, Errno> {
        if flags & libc::O_EXCL as u32 != 0 {
            return Err(Errno::EACCES);
        }
        Ok(Opened {
            fh: self.next_fh.fetch_add(1, Ordering::SeqCst),
            open_flags: 0,
        })
    }

    fn release(&self, _req: &Request, fh: u64, _flags: u32) {
        self.releases.lock().unwrap().push(fh);
    }

    fn read(&self, _req: &Request, fh: u64, _offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let buf = self.buffer.lock().unwrap();
        if fh == 999 {
            // A handler bug: more than asked for.
            return Ok(vec![0; size as usize + 1]);
        }
        Ok(buf[..buf.len().min(size as usize)].to_vec())
    }

    fn write(&self, _req: &Request, _fh: u64, _offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let mut buf = self.buffer.lock().unwrap();
        *buf = data.to_vec();
        for p in self.pollers.lock().unwrap().drain(..) {
            let _ = p.notify();
        }
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
    }

    fn poll(
        &self,
        _req: &Request,
        _fh: u64,
        _events: u32,
        notify: Option<PollHandle>,
    ) -> Result<u32, Errno> {
        self.poll_notify_seen.lock().unwrap().push(notify.is_some());
        let buf = self.buffer.lock().unwrap();
        let mut revents = libc::POLLOUT as u32;
        if !buf.is_empty() {
            revents |= libc::POLLIN as u32;
        }
        if let Some(n) = notify {
            self.pollers.lock().unwrap().push(n);
        }
        Ok(revents)
    }

    fn ioctl(&self, req: &Request, io: &Ioctl<'_>) -> Result<IoctlReply, Errno> {
        *self.calls.lock().unwrap().entry(io.cmd).or_default() += 1;
        let arg = io.arg;
        let retry = |i: Vec<IoVec>, o: Vec<IoVec>| {
            Ok(IoctlReply::Retry {
                in_iovs: i,
                out_iovs: o,
            })
        };
        match io.cmd {
            GET => {
                if io.out_size < 4 {
                    if !io.is_unrestricted() {
                        return Err(Errno::EINVAL);
                    }
                    return retry(vec![], vec![IoVec::new(arg, 4)]);
                }
                let v = *self.register.lock().unwrap();
                Ok(IoctlReply::Done {
                    result: 0,
                    out: v.to_ne_bytes()[..].into(),
                })
            }
            SET => match int(io.in_data) {
                Some(v) => {
                    *self.register.lock().unwrap() = v;
                    Ok(IoctlReply::result(0))
                }
                None if io.is_unrestricted() => retry(vec![IoVec::new(arg, 4)], vec![]),
                None => Err(Errno::EINVAL),
            },
            INCR => match int(io.in_data) {
                Some(v) if io.out_size >= 4 => Ok(IoctlReply::Done {
                    result: 0,
                    out: (v + 1).to_ne_bytes()[..].into(),
                }),
                _ if io.is_unrestricted() => {
                    retry(vec![IoVec::new(arg, 4)], vec![IoVec::new(arg, 4)])
                }
                _ => Err(Errno::EINVAL),
            },
            XFORM => {
                let d = io.in_data;
                let Some((src, dst, len)) = xform(d) else {
                    return retry(vec![IoVec::new(arg, XFORM_SIZE)], vec![]);
                };
                if len > 4096 {
                    return Err(Errno::EINVAL);
                }
                if d.len() as u64 == XFORM_SIZE {
                    return retry(
                        vec![IoVec::new(arg, XFORM_SIZE), IoVec::new(src, len)],
                        vec![IoVec::new(dst, len)],
                    );
                }
                let data = d.get(24..).ok_or(Errno::EPROTO)?;
                if data.len() as u64 != len || u64::from(io.out_size) != len {
                    return Err(Errno::EPROTO);
                }
                Ok(IoctlReply::Done {
                    result: i32::try_from(len).map_err(|_| Errno::EINVAL)?,
                    out: data.to_ascii_uppercase().into(),
                })
            }
            NESTED => {
                let d = io.in_data;
                let Some(ptr) = d
                    .get(..8)
                    .map(|b| u64::from_ne_bytes(b.try_into().unwrap()))
                else {
                    return retry(vec![IoVec::new(arg, 8)], vec![]);
                };
                let Some((src, dst, len)) = d.get(8..).and_then(xform) else {
                    return retry(
                        vec![IoVec::new(arg, 8), IoVec::new(ptr, XFORM_SIZE)],
                        vec![],
                    );
                };
                if len > 4096 {
                    return Err(Errno::EINVAL);
                }
                if d.len() == 32 {
                    return retry(
                        vec![
                            IoVec::new(arg, 8),
                            IoVec::new(ptr, XFORM_SIZE),
                            IoVec::new(src, len),
                        ],
                        vec![IoVec::new(dst, len)],
                    );
                }
                let mut data = d.get(32..).ok_or(Errno::EPROTO)?.to_vec();
                if data.len() as u64 != len {
                    return Err(Errno::EPROTO);
                }
                data.reverse();
                Ok(IoctlReply::Done {
                    result: i32::try_from(len).map_err(|_| Errno::EINVAL)?,
                    out: data.into(),
                })
            }
            SLOW => {
                if req.wait_interrupted(Duration::from_millis(arg)) {
                    return Err(Errno::EINTR);
                }
                Ok(IoctlReply::result(1))
            }
            FAST => Ok(IoctlReply::result(7)),
            CLIENT_WAIT => {
                let waits = req.client_waits();
                let fired = {
                    let w = waits.arm();
                    std::thread::sleep(Duration::from_millis(arg));
                    w.fired()
                };
                self.client_waits_fired.lock().unwrap().push(fired);
                if fired {
                    Err(Errno::EFAULT)
                } else {
                    Ok(IoctlReply::result(1))
                }
            }
            EARLY => {
                let v = *self.register.lock().unwrap();
                let sent = req.early_answer(io.out_size).ioctl(5, &v.to_ne_bytes());
                self.early_sent.lock().unwrap().push(sent);
                let deadline = std::time::Instant::now() + Duration::from_millis(arg);
                while !self.early_gate.load(Ordering::SeqCst)
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                self.early_returned.fetch_add(1, Ordering::SeqCst);
                Ok(IoctlReply::Done {
                    result: 99,
                    out: [0u8; 4][..].into(),
                })
            }
            EARLY_TOO_LONG => {
                let sent = req.early_answer(io.out_size).ioctl(5, &[1; 8]);
                self.early_sent.lock().unwrap().push(sent);
                Ok(IoctlReply::result(6))
            }
            WAIT_FAST => {
                let before = self.calls(FAST);
                let deadline = std::time::Instant::now() + Duration::from_millis(arg);
                while self.calls(FAST) == before {
                    if std::time::Instant::now() > deadline {
                        return Err(Errno::ETIMEDOUT);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(IoctlReply::result(1))
            }
            BIG_IOV => retry((0..257).map(|i| IoVec::new(arg + i, 1)).collect(), vec![]),
            BIG_BYTES => retry(vec![IoVec::new(arg, 128 * 1024 + 1)], vec![]),
            MANY_IOV => {
                if io.in_data.len() == 256 {
                    let sum: u32 = io.in_data.iter().map(|&b| u32::from(b)).sum();
                    return Ok(IoctlReply::result(sum as i32));
                }
                retry((0..256).map(|i| IoVec::new(arg + i, 1)).collect(), vec![])
            }
            PANIC => panic!("test handler panics on purpose"),
            NEGATIVE => Ok(IoctlReply::result(-5)),
            OUT_TOO_LONG => Ok(IoctlReply::Done {
                result: 0,
                out: vec![1; io.out_size as usize + 1].into(),
            }),
            ALWAYS_RETRY => retry(vec![IoVec::new(arg, 4)], vec![]),
            _ => Err(Errno::ENOTTY),
        }
    }
}
