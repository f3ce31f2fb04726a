//! An example CUSE device on `cuse-dev`, driven by the real-kernel tests.
//!
//! `cuse-example --name DEVNAME [--restricted] [--major M --minor N] [--max-workers N]`
//!
//! Serves `/dev/DEVNAME`: read/write of one shared buffer, poll (readable once the buffer is
//! non-empty; a write wakes pollers), and the ioctls of `tests::cuse_example`. Prints
//! `READY <major>:<minor>` on stdout once `CUSE_INIT` was answered **and** a self-check (open
//! the node, send the secret ioctl) proved the node is ours; `ENDED` when the kernel ends the
//! connection. Exit status: 0 after `ENDED` following `READY`, 2 on usage errors, 3 when the
//! device never became ours (name or number taken: the kernel aborts the connection silently).
//!
//! `--handover`: on SIGUSR1 the server suspends its session (`SessionControl::suspend`) and
//! hands it to a fresh process of this binary: the channel fd (inherited), the state (register,
//! buffer, next fh, secret) and the `CUSE_INIT` outcome and retry rounds on its command line
//! (`--resume-fd N --state JSON`, internal). It prints `HANDED <new pid>` and exits 0; the new
//! process resumes the session, checks the node is now its own, prints `RESUMED <pid>` and
//! serves (with `--handover` again) until the kernel ends the connection.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cuse_dev::{
    DeviceConfig, Errno, Handler, IoVec, Ioctl, IoctlReply, Opened, PollHandle, Request, Session,
};
use tests::cuse_example::*;

struct Example {
    path: PathBuf,
    secret: u64,
    next_fh: AtomicU64,
    register: Mutex<i32>,
    buffer: Mutex<Vec<u8>>,
    pollers: Mutex<Vec<PollHandle>>,
}

fn retry(in_iovs: Vec<IoVec>, out_iovs: Vec<IoVec>) -> Result<IoctlReply, Errno> {
    Ok(IoctlReply::Retry { in_iovs, out_iovs })
}

fn int(bytes: &[u8]) -> Option<i32> {
    bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(i32::from_ne_bytes)
}

impl Example {
    fn xform(&self, io: &Ioctl<'_>) -> Result<IoctlReply, Errno> {
        let (arg, d) = (io.arg, io.in_data);
        let x_len = XFORM_SIZE as u64;
        let Some(x) = Xform::from_bytes(d) else {
            return retry(vec![IoVec::new(arg, x_len)], vec![]);
        };
        if x.len > XFORM_MAX {
            return Err(Errno::EINVAL);
        }
        let len = u64::from(x.len);
        if d.len() == XFORM_SIZE {
            return retry(
                vec![IoVec::new(arg, x_len), IoVec::new(x.in_ptr, len)],
                vec![IoVec::new(x.out_ptr, len)],
            );
        }
        let data = d.get(XFORM_SIZE..).ok_or(Errno::EPROTO)?;
        if data.len() as u64 != len || u64::from(io.out_size) != len {
            return Err(Errno::EPROTO);
        }
        Ok(IoctlReply::Done {
            result: x.len as i32,
            out: data.to_ascii_uppercase().into(),
        })
    }

    fn nested(&self, io: &Ioctl<'_>) -> Result<IoctlReply, Errno> {
        let (arg, d) = (io.arg, io.in_data);
        let x_len = XFORM_SIZE as u64;
        let Some(ptr) = d
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_ne_bytes)
        else {
            return retry(vec![IoVec::new(arg, 8)], vec![]);
        };
        let Some(x) = d.get(8..).and_then(Xform::from_bytes) else {
            return retry(vec![IoVec::new(arg, 8), IoVec::new(ptr, x_len)], vec![]);
        };
        if x.len > XFORM_MAX {
            return Err(Errno::EINVAL);
        }
        let len = u64::from(x.len);
        let head = 8 + XFORM_SIZE;
        if d.len() == head {
            return retry(
                vec![
                    IoVec::new(arg, 8),
                    IoVec::new(ptr, x_len),
                    IoVec::new(x.in_ptr, len),
                ],
                vec![IoVec::new(x.out_ptr, len)],
            );
        }
        let mut data = d.get(head..).ok_or(Errno::EPROTO)?.to_vec();
        if data.len() as u64 != len || u64::from(io.out_size) != len {
            return Err(Errno::EPROTO);
        }
        data.reverse();
        Ok(IoctlReply::Done {
            result: x.len as i32,
            out: data.into(),
        })
    }
}

impl Handler for Example {
    fn open(&self, _req: &Request, _flags: u32) -> Result<Opened, Errno> {
        Ok(Opened {
            fh: self.next_fh.fetch_add(1, Ordering::SeqCst),
            open_flags: 0,
        })
    }

    fn read(&self, _req: &Request, _fh: u64, _offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let buf = self.buffer.lock().map_err(|_| Errno::EIO)?;
        Ok(buf[..buf.len().min(size as usize)].to_vec())
    }

    fn write(&self, _req: &Request, _fh: u64, _offset: u64, data: &[u8]) -> Result<u32, Errno> {
        // Update and wake under one lock order (buffer, then pollers), as poll() takes them.
        let mut buf = self.buffer.lock().map_err(|_| Errno::EIO)?;
        *buf = data.to_vec();
        let pollers = std::mem::take(&mut *self.pollers.lock().map_err(|_| Errno::EIO)?);
        drop(buf);
        for p in pollers {
            if let Err(e) = p.notify() {
                eprintln!("cuse-example: poll notify failed: {e}");
            }
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
        let buf = self.buffer.lock().map_err(|_| Errno::EIO)?;
        let mut revents = libc::POLLOUT as u32;
        if !buf.is_empty() {
            revents |= libc::POLLIN as u32;
        }
        if let Some(n) = notify {
            self.pollers.lock().map_err(|_| Errno::EIO)?.push(n);
        }
        Ok(revents)
    }

    fn ioctl(&self, req: &Request, io: &Ioctl<'_>) -> Result<IoctlReply, Errno> {
        let arg = io.arg;
        match io.cmd {
            EX_GET => {
                if io.out_size < 4 {
                    if !io.is_unrestricted() {
                        return Err(Errno::EINVAL);
                    }
                    return retry(vec![], vec![IoVec::new(arg, 4)]);
                }
                let v = *self.register.lock().map_err(|_| Errno::EIO)?;
                Ok(IoctlReply::Done {
                    result: 0,
                    out: v.to_ne_bytes()[..].into(),
                })
            }
            EX_SET => match int(io.in_data) {
                Some(v) => {
                    *self.register.lock().map_err(|_| Errno::EIO)? = v;
                    Ok(IoctlReply::result(0))
                }
                None if io.is_unrestricted() => retry(vec![IoVec::new(arg, 4)], vec![]),
                None => Err(Errno::EINVAL),
            },
            EX_INCR => match int(io.in_data) {
                Some(v) if io.out_size >= 4 => Ok(IoctlReply::Done {
                    result: 0,
                    out: v.wrapping_add(1).to_ne_bytes()[..].into(),
                }),
                _ if io.is_unrestricted() => {
                    retry(vec![IoVec::new(arg, 4)], vec![IoVec::new(arg, 4)])
                }
                _ => Err(Errno::EINVAL),
            },
            EX_XFORM => self.xform(io),
            EX_NESTED => self.nested(io),
            EX_SLEEP => {
                eprintln!("cuse-example: SLEEP start {arg} ms (pid {})", req.pid());
                if req.wait_interrupted(Duration::from_millis(arg)) {
                    eprintln!("cuse-example: SLEEP interrupted (pid {})", req.pid());
                    return Err(Errno::EINTR);
                }
                Ok(IoctlReply::result(0))
            }
            EX_GETFH => Ok(IoctlReply::result(
                i32::try_from(io.fh).map_err(|_| Errno::ERANGE)?,
            )),
            EX_PID => Ok(IoctlReply::result(req.pid() as i32)),
            EX_SELF => {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&self.path)
                    .map_err(|e| Errno::from_io(&e))?;
                // SAFETY: `f` is open for the whole call; EX_GETFH passes no memory.
                let fh = unsafe { libc::ioctl(f.as_raw_fd(), EX_GETFH as libc::Ioctl, 0u64) };
                if fh < 0 {
                    return Err(Errno::from_io(&std::io::Error::last_os_error()));
                }
                // The last reference: close() returns only after our RELEASE reply.
                drop(f);
                Ok(IoctlReply::result(fh))
            }
            EX_SECRET if arg == self.secret => Ok(IoctlReply::result(1)),
            EX_SECRET => Err(Errno::EPERM),
            _ => Err(Errno::ENOTTY),
        }
    }
}

struct Args {
    cfg: DeviceConfig,
    handover: bool,
    resume: Option<(i32, serde_json::Value)>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut name = None;
    let (mut restricted, mut major, mut minor, mut workers) = (false, 0, 0, 64);
    let (mut handover, mut resume_fd, mut state) = (false, None, None);
    let num = |v: Option<String>, what: &str| -> Result<u32, String> {
        v.ok_or(format!("{what} needs a value"))?
            .parse()
            .map_err(|e| format!("{what}: {e}"))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--name" => name = Some(args.next().ok_or("--name needs a value")?),
            "--restricted" => restricted = true,
            "--major" => major = num(args.next(), "--major")?,
            "--minor" => minor = num(args.next(), "--minor")?,
            "--max-workers" => workers = num(args.next(), "--max-workers")? as usize,
            "--handover" => handover = true,
            "--resume-fd" => resume_fd = Some(num(args.next(), "--resume-fd")? as i32),
            "--state" => {
                let text = args.next().ok_or("--state needs a value")?;
                state = Some(
                    serde_json::from_str::<serde_json::Value>(&text)
                        .map_err(|e| format!("--state: {e}"))?,
                );
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let name = name.ok_or("--name DEVNAME is required")?;
    let cfg = DeviceConfig {
        dev_major: major,
        dev_minor: minor,
        unrestricted_ioctl: !restricted,
        max_workers: workers,
        ..DeviceConfig::new(name)
    };
    let resume = match (resume_fd, state) {
        (Some(fd), Some(st)) => Some((fd, st)),
        (None, None) => None,
        _ => return Err("--resume-fd and --state go together".into()),
    };
    Ok(Args {
        cfg,
        handover,
        resume,
    })
}

/// The handed-over state on the command line: the device's and the session's.
fn state_json(ex: &Example, s: &cuse_dev::Suspended) -> serde_json::Value {
    let i = &s.init;
    serde_json::json!({
        "register": *ex.register.lock().unwrap(),
        "buffer": ex.buffer.lock().unwrap().clone(),
        "next_fh": ex.next_fh.load(Ordering::SeqCst),
        "secret": ex.secret,
        "init": [i.kernel_major, i.kernel_minor, i.minor, i.flags, i.max_read, i.max_write,
                 i.dev_major, i.dev_minor],
        "retries": s.retries.iter().map(|r| serde_json::json!({
            "fh": r.fh, "tid": r.tid,
            "in": r.round.in_iovs.iter().map(|v| [v.base, v.len]).collect::<Vec<_>>(),
            "out": r.round.out_iovs.iter().map(|v| [v.base, v.len]).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// The session state out of [`state_json`].
fn parse_state(v: &serde_json::Value) -> Option<(cuse_dev::InitInfo, Vec<cuse_dev::PendingRetry>)> {
    let n: Vec<u32> = v["init"]
        .as_array()?
        .iter()
        .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
        .collect::<Option<_>>()?;
    let [
        kernel_major,
        kernel_minor,
        minor,
        flags,
        max_read,
        max_write,
        dev_major,
        dev_minor,
    ] = n[..]
    else {
        return None;
    };
    let init = cuse_dev::InitInfo {
        kernel_major,
        kernel_minor,
        minor,
        flags,
        max_read,
        max_write,
        dev_major,
        dev_minor,
    };
    let iovs = |a: &serde_json::Value| -> Option<Vec<IoVec>> {
        a.as_array()?
            .iter()
            .map(|p| Some(IoVec::new(p[0].as_u64()?, p[1].as_u64()?)))
            .collect()
    };
    let retries = v["retries"]
        .as_array()?
        .iter()
        .map(|r| {
            Some(cuse_dev::PendingRetry {
                fh: r["fh"].as_u64()?,
                tid: u32::try_from(r["tid"].as_u64()?).ok()?,
                round: cuse_dev::RetryRound {
                    in_iovs: iovs(&r["in"])?,
                    out_iovs: iovs(&r["out"])?,
                },
            })
        })
        .collect::<Option<_>>()?;
    Some((init, retries))
}

/// Blocks SIGUSR1 in this thread (and the threads started after it) and suspends the session
/// when it arrives.
fn suspend_on_sigusr1(control: cuse_dev::SessionControl) {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGUSR1);
    set.thread_block().expect("blocking SIGUSR1");
    thread::spawn(move || {
        if set.wait().is_ok() {
            control.suspend();
        }
    });
}

fn random_secret() -> u64 {
    let mut b = [0u8; 8];
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        b = (t
            .map(|d| (d.as_nanos() & 0xffff_ffff_ffff_ffff) as u64)
            .unwrap_or(1)
            ^ u64::from(std::process::id()))
        .to_ne_bytes();
    }
    u64::from_ne_bytes(b) | 1
}

/// Opens our node and sends the secret ioctl: proves the node is served by this process.
fn self_check(path: &Path, secret: u64, ended: &dyn Fn() -> bool) -> Result<(u32, u32), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let meta = loop {
        match std::fs::metadata(path) {
            Ok(m) if m.file_type().is_char_device() => break m,
            Ok(_) => return Err(format!("{} is not a character device", path.display())),
            Err(e) if Instant::now() > deadline || ended() => {
                return Err(format!("{}: {e}", path.display()));
            }
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    };
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    // SAFETY: `f` is open for the whole call; EX_SECRET takes its argument by value, so no
    // memory is passed to the kernel or the server.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), EX_SECRET as libc::Ioctl, secret) };
    if rc != 1 {
        return Err(format!(
            "self-check ioctl on {} failed ({}): the node is not ours",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(major_minor(meta.rdev()))
}

/// Starts the next server with the suspended session and this device's state.
fn hand_over(
    ex: &Example,
    s: &cuse_dev::Suspended,
    cfg: &DeviceConfig,
    handover: bool,
) -> ExitCode {
    use std::os::fd::AsRawFd;
    let fd = s.channel.as_raw_fd();
    // The next server inherits the channel: no close-on-exec on it.
    if let Err(e) = nix::fcntl::fcntl(
        fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    ) {
        eprintln!("cuse-example: clearing FD_CLOEXEC: {e}");
        return ExitCode::from(1);
    }
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("our executable"));
    cmd.arg("--name").arg(&cfg.devname);
    if !cfg.unrestricted_ioctl {
        cmd.arg("--restricted");
    }
    if handover {
        cmd.arg("--handover");
    }
    cmd.arg("--resume-fd")
        .arg(fd.to_string())
        .arg("--state")
        .arg(state_json(ex, s).to_string());
    match cmd.spawn() {
        Ok(child) => {
            println!("HANDED {}", child.id());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cuse-example: starting the next server: {e}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cuse-example: {e}");
            eprintln!("usage: cuse-example --name DEVNAME [--restricted] [--major M --minor N]");
            return ExitCode::from(2);
        }
    };
    let path = PathBuf::from("/dev").join(&args.cfg.devname);
    let cfg = args.cfg.clone();
    let resumed = args.resume.is_some();
    let (session, handler) = match &args.resume {
        None => {
            let session = match Session::open(args.cfg) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("cuse-example: {e}: {:?}", std::error::Error::source(&e));
                    return ExitCode::from(1);
                }
            };
            let handler = Arc::new(Example {
                path: path.clone(),
                secret: random_secret(),
                next_fh: AtomicU64::new(1),
                register: Mutex::new(0),
                buffer: Mutex::new(Vec::new()),
                pollers: Mutex::new(Vec::new()),
            });
            (session, handler)
        }
        Some((fd, st)) => {
            let Some((init, retries)) = parse_state(st) else {
                eprintln!("cuse-example: --state: malformed");
                return ExitCode::from(2);
            };
            let taken = match nix::unistd::dup(*fd) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("cuse-example: --resume-fd {fd}: {e}");
                    return ExitCode::from(2);
                }
            };
            let _ = nix::unistd::close(*fd);
            // SAFETY: `taken` is a new descriptor from dup; nothing else owns it.
            let channel =
                unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(taken) };
            let session = match Session::resume(channel, args.cfg, init, retries) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("cuse-example: resuming: {e}");
                    return ExitCode::from(1);
                }
            };
            let handler = Arc::new(Example {
                path: path.clone(),
                secret: st["secret"].as_u64().unwrap_or(0),
                next_fh: AtomicU64::new(st["next_fh"].as_u64().unwrap_or(1)),
                register: Mutex::new(
                    st["register"]
                        .as_i64()
                        .and_then(|r| i32::try_from(r).ok())
                        .unwrap_or(0),
                ),
                buffer: Mutex::new(
                    st["buffer"]
                        .as_array()
                        .map(|b| {
                            b.iter()
                                .filter_map(|x| x.as_u64())
                                .map(|x| (x & 0xff) as u8)
                                .collect()
                        })
                        .unwrap_or_default(),
                ),
                // Pollers of the previous server are not carried over: the example's clients
                // poll again after a handover.
                pollers: Mutex::new(Vec::new()),
            });
            (session, handler)
        }
    };
    let control = session.control();
    let secret = handler.secret;
    if args.handover {
        suspend_on_sigusr1(control.clone());
    }
    let h2 = handler.clone();
    let runner = thread::spawn(move || session.run_handover(h2));

    let ready = match control.wait_init(Duration::from_secs(30)) {
        None => Err("CUSE_INIT was not answered within 30 s".to_string()),
        Some(_) => self_check(&path, secret, &|| runner.is_finished()),
    };
    let mut out = std::io::stdout();
    let ok = match ready {
        Ok((major, minor)) if resumed => {
            let _ = writeln!(out, "RESUMED {} {major}:{minor}", std::process::id());
            let _ = out.flush();
            true
        }
        Ok((major, minor)) => {
            let _ = writeln!(out, "READY {major}:{minor}");
            let _ = out.flush();
            true
        }
        Err(e) => {
            eprintln!("cuse-example: {e}");
            control.stop();
            false
        }
    };
    let result = runner.join();
    if let Ok(Ok(Some(suspended))) = &result {
        return hand_over(&handler, suspended, &cfg, args.handover);
    }
    let _ = writeln!(out, "ENDED");
    let _ = out.flush();
    match result {
        Ok(Ok(_)) if ok => ExitCode::SUCCESS,
        Ok(Ok(_)) => ExitCode::from(3),
        Ok(Err(e)) => {
            eprintln!("cuse-example: session failed: {e}");
            ExitCode::from(1)
        }
        Err(_) => ExitCode::from(1),
    }
}
