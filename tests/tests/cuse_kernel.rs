//! Real-kernel CUSE tests: each test starts the `cuse-example` device (a `cuse-dev` server) as a
//! child process and acts as its client with plain syscalls.
//!
//! They need `/dev/cuse` and root, so they are `#[ignore]`d and run by
//! `tests/run-kernel-tests.sh` (natively or in the CUSE VM) with `--ignored --test-threads=1`.
//! A missing `/dev/cuse` fails every test loudly; nothing is skipped.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};
use tests::harness::require_cuse;

use tests::cuse_example::*;

const EXAMPLE: &str = env!("CARGO_BIN_EXE_cuse-example");
/// Generous: the VM guest runs 10-50x slower than the host.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `cuse-example` and the lines it printed (stdout and stderr).
struct Device {
    child: Child,
    path: PathBuf,
    major: u32,
    minor: u32,
    lines: mpsc::Receiver<String>,
}

impl Device {
    fn start(name: &str, extra: &[&str]) -> Device {
        match Self::try_start(name, extra) {
            Ok(d) => d,
            Err((status, lines)) => {
                panic!(
                    "cuse-example {name} did not become ready: {status:?}\n{}",
                    lines.join("\n")
                )
            }
        }
    }

    /// Starts the device and waits for `READY`; on failure returns its exit status (if it
    /// exited) and everything it printed.
    fn try_start(name: &str, extra: &[&str]) -> Result<Device, (Option<ExitStatus>, Vec<String>)> {
        require_cuse();
        let mut child = Command::new(EXAMPLE)
            .arg("--name")
            .arg(name)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cuse-example");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        for (stream, tag) in [
            (Box::new(out) as Box<dyn Read + Send>, "out"),
            (Box::new(err), "err"),
        ] {
            let tx = tx.clone();
            thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { return };
                    eprintln!("[device {tag}] {line}");
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        drop(tx);
        let deadline = Instant::now() + START_TIMEOUT;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(numbers) = line.strip_prefix("READY ") {
                        let (ma, mi) = numbers.split_once(':').expect("READY M:m");
                        return Ok(Device {
                            child,
                            path: PathBuf::from("/dev").join(name),
                            major: ma.parse().unwrap(),
                            minor: mi.parse().unwrap(),
                            lines,
                        });
                    }
                    seen.push(line);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().ok();
                    return Err((status, seen));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    seen.push("(timed out waiting for READY)".into());
                    return Err((None, seen));
                }
            }
        }
    }

    fn open(&self) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .unwrap_or_else(|e| panic!("open {}: {e}", self.path.display()))
    }

    /// Waits for a printed line containing `needle`.
    fn wait_line(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.kill();
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `ioctl(fd, cmd, arg)` with `arg` passed by value; `Err(errno)` on failure.
fn ioctl(f: &File, cmd: u32, arg: u64) -> Result<i32, i32> {
    // SAFETY: `f` is open for the whole call. `arg` is either a plain value or the address of
    // a buffer the caller keeps alive and exclusively borrowed for the call; the example server
    // only names the regions that the argument describes, and the kernel checks every user
    // address it copies.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), cmd as libc::Ioctl, arg) };
    if rc < 0 { Err(errno()) } else { Ok(rc) }
}

fn ioctl_ptr<T>(f: &File, cmd: u32, p: &mut T) -> Result<i32, i32> {
    ioctl(f, cmd, p as *mut T as u64)
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    u32::try_from(tid).expect("a tid is positive")
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// Installs a do-nothing SIGUSR1 handler without SA_RESTART, so a blocked ioctl sees EINTR.
fn install_sigusr1() {
    // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler is an
    // `extern "C"` fn that does nothing, which is async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore_signal as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
}

/// Sends SIGUSR1 to `thread` every 200 ms until `done` reports, up to `timeout`.
fn interrupt_until<T>(thread: libc::pthread_t, done: &mpsc::Receiver<T>, timeout: Duration) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        // SAFETY: `thread` is alive until it sends on `done`, which we have not received yet.
        unsafe { libc::pthread_kill(thread, libc::SIGUSR1) };
        match done.recv_timeout(Duration::from_millis(200)) {
            Ok(v) => return v,
            Err(_) => assert!(
                Instant::now() < deadline,
                "the blocked ioctl was not interrupted"
            ),
        }
    }
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn nested_name_node_read_write_and_removal() {
    let mut dev = Device::start("nvproxy-test/a/dev", &[]);
    let meta = std::fs::metadata("/dev/nvproxy-test/a/dev").unwrap();
    assert!(meta.file_type().is_char_device());
    assert_eq!(major_minor(meta.rdev()), (dev.major, dev.minor));
    assert_eq!(meta.mode() & 0o777, 0o600, "CUSE nodes are created 0600");
    let sys = std::fs::read_to_string("/sys/class/cuse/nvproxy-test!a!dev/dev").unwrap();
    assert_eq!(sys.trim(), format!("{}:{}", dev.major, dev.minor));

    let mut a = dev.open();
    let mut b = dev.open();
    assert_eq!(a.write(b"hello cuse").unwrap(), 10);
    let mut buf = [0u8; 64];
    let n = b.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello cuse");
    let (fa, fb) = (
        ioctl(&a, EX_GETFH, 0).unwrap(),
        ioctl(&b, EX_GETFH, 0).unwrap(),
    );
    assert_ne!(fa, fb, "each open gets its own fh");
    assert_eq!(
        u32::try_from(ioctl(&a, EX_PID, 0).unwrap()).expect("a pid"),
        gettid(),
        "pid is the calling thread id"
    );
    drop((a, b));

    dev.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new("/dev/nvproxy-test").exists() {
        assert!(
            Instant::now() < deadline,
            "node or its directories outlived the server"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn restricted_ioctls() {
    let dev = Device::start("cuse-kt-restricted", &["--restricted"]);
    let f = dev.open();
    let mut v: i32 = 41;
    assert_eq!(ioctl_ptr(&f, EX_SET, &mut v), Ok(0));
    let mut out: i32 = 0;
    assert_eq!(ioctl_ptr(&f, EX_GET, &mut out), Ok(0));
    assert_eq!(out, 41);
    assert_eq!(ioctl_ptr(&f, EX_INCR, &mut out), Ok(0));
    assert_eq!(out, 42);
    // `_IO` commands carry no data when restricted; the server's retry is refused (EIO).
    let mut x = Xform::default();
    assert_eq!(ioctl_ptr(&f, EX_XFORM, &mut x), Err(libc::EIO));
    assert_eq!(ioctl(&f, EX_SLEEP, 0), Ok(0));
    assert_eq!(ioctl(&f, 0x5401, 0), Err(libc::ENOTTY));
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn unrestricted_ioctls_with_one_two_and_three_retry_rounds() {
    let dev = Device::start("cuse-kt-unrestricted", &[]);
    let f = dev.open();
    // One round each: SET/GET/INCR name `arg` as in and/or out region.
    let mut v: i32 = 9;
    assert_eq!(ioctl_ptr(&f, EX_SET, &mut v), Ok(0));
    let mut out: i32 = 0;
    assert_eq!(ioctl_ptr(&f, EX_GET, &mut out), Ok(0));
    assert_eq!(out, 9);
    assert_eq!(ioctl_ptr(&f, EX_INCR, &mut out), Ok(0));
    assert_eq!(out, 10);

    // Two rounds: the struct, then the buffer it points to (and the output buffer).
    let input = b"two retry rounds".to_vec();
    let mut output = vec![0u8; input.len()];
    let mut x = Xform {
        in_ptr: input.as_ptr() as u64,
        out_ptr: output.as_mut_ptr() as u64,
        len: u32::try_from(input.len()).expect("small input"),
        pad: 0,
    };
    assert_eq!(
        ioctl_ptr(&f, EX_XFORM, &mut x),
        Ok(i32::try_from(input.len()).expect("small input"))
    );
    assert_eq!(output, b"TWO RETRY ROUNDS");

    // Three rounds: a pointer, the struct it points to, then the buffers.
    let input = b"three retry rounds".to_vec();
    let mut output = vec![0u8; input.len()];
    let mut x = Xform {
        in_ptr: input.as_ptr() as u64,
        out_ptr: output.as_mut_ptr() as u64,
        len: u32::try_from(input.len()).expect("small input"),
        pad: 0,
    };
    let mut ptr: u64 = &mut x as *mut Xform as u64;
    assert_eq!(
        ioctl_ptr(&f, EX_NESTED, &mut ptr),
        Ok(i32::try_from(input.len()).expect("small input"))
    );
    let mut expect = input.clone();
    expect.reverse();
    assert_eq!(output, expect);

    // A large region (60 KiB each way) goes through in one round.
    let input: Vec<u8> = (0..60 * 1024)
        .map(|i| b'a' + u8::try_from(i % 26).expect("below 26"))
        .collect();
    let mut output = vec![0u8; input.len()];
    let mut x = Xform {
        in_ptr: input.as_ptr() as u64,
        out_ptr: output.as_mut_ptr() as u64,
        len: u32::try_from(input.len()).expect("small input"),
        pad: 0,
    };
    assert_eq!(
        ioctl_ptr(&f, EX_XFORM, &mut x),
        Ok(i32::try_from(input.len()).expect("small input"))
    );
    assert_eq!(output, input.to_ascii_uppercase());

    // A bad pointer faults in the kernel's copy.
    assert_eq!(ioctl(&f, EX_INCR, 8), Err(libc::EFAULT));
    assert_eq!(ioctl(&f, 0x5401, 0), Err(libc::ENOTTY));
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn poll_wakes_on_a_write_from_another_client() {
    let dev = Device::start("cuse-kt-poll", &[]);
    let reader = dev.open();
    let (tx, rx) = mpsc::channel();
    let poller = thread::spawn(move || {
        let mut pfd = libc::pollfd {
            fd: reader.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one live pollfd for the call and `reader` stays open until we return.
        let n = unsafe { libc::poll(&mut pfd, 1, 60_000) };
        tx.send((n, pfd.revents)).unwrap();
        drop(reader);
    });
    // Still blocked: nothing written yet.
    assert!(
        rx.recv_timeout(Duration::from_millis(1500)).is_err(),
        "poll returned early"
    );
    let mut writer = dev.open();
    assert_eq!(writer.write(b"wake").unwrap(), 4);
    let (n, revents) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("poll was not woken");
    assert_eq!(n, 1);
    assert_ne!(revents & libc::POLLIN, 0, "revents {revents:#x}");
    poller.join().unwrap();
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn sigkill_frees_a_client_blocked_in_an_ioctl() {
    let dev = Device::start("cuse-kt-sigkill", &[]);
    let f = dev.open();
    // SAFETY: the child only calls async-signal-safe functions (ioctl, _exit) on an fd it
    // inherited, so forking a multi-threaded test process is fine.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: see above; `f` was inherited and is open.
        unsafe {
            libc::ioctl(f.as_raw_fd(), EX_SLEEP as libc::Ioctl, 120_000u64);
            libc::_exit(0);
        }
    }
    assert!(
        dev.wait_line("SLEEP start", Duration::from_secs(30)),
        "server never got the ioctl"
    );
    let t = Instant::now();
    // SAFETY: `pid` is our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let mut status = 0;
    loop {
        // SAFETY: `status` is a live int for the call; `pid` is our child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "client not reaped after SIGKILL"
        );
        thread::sleep(Duration::from_millis(20));
    }
    eprintln!("SIGKILLed client reaped after {:?}", t.elapsed());
    assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL);
    assert!(dev.wait_line("SLEEP interrupted", Duration::from_secs(10)));
    // The server goes on serving.
    let mut v: i32 = 1;
    assert_eq!(ioctl_ptr(&f, EX_INCR, &mut v), Ok(0));
    assert_eq!(v, 2);
    assert_eq!(ioctl_ptr(&dev.open(), EX_INCR, &mut v), Ok(0));
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn concurrent_clients_are_not_stalled_by_a_slow_ioctl() {
    install_sigusr1();
    let dev = Device::start("cuse-kt-concurrent", &[]);
    let slow_file = dev.open();
    let (done_tx, done_rx) = mpsc::channel();
    let (tid_tx, tid_rx) = mpsc::channel();
    let slow = thread::spawn(move || {
        // SAFETY: pthread_self has no preconditions.
        tid_tx.send(unsafe { libc::pthread_self() }).unwrap();
        let r = ioctl(&slow_file, EX_SLEEP, 120_000);
        done_tx.send(r).unwrap();
    });
    let slow_thread = tid_rx.recv().unwrap();
    assert!(dev.wait_line("SLEEP start", Duration::from_secs(30)));

    let t = Instant::now();
    let barrier = Arc::new(Barrier::new(16));
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let f = dev.open();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                let mut v: i32 = i * 100;
                for _ in 0..10 {
                    assert_eq!(ioctl_ptr(&f, EX_INCR, &mut v), Ok(0));
                }
                assert_eq!(v, i * 100 + 10);
                let input = format!("client {i}").into_bytes();
                let mut output = vec![0u8; input.len()];
                let mut x = Xform {
                    in_ptr: input.as_ptr() as u64,
                    out_ptr: output.as_mut_ptr() as u64,
                    len: u32::try_from(input.len()).expect("small input"),
                    pad: 0,
                };
                assert_eq!(
                    ioctl_ptr(&f, EX_XFORM, &mut x),
                    Ok(i32::try_from(input.len()).expect("small input"))
                );
                assert_eq!(output, input.to_ascii_uppercase());
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    eprintln!(
        "16 clients x 11 ioctls took {:?} while a slow ioctl was pending",
        t.elapsed()
    );
    assert!(done_rx.try_recv().is_err(), "the slow ioctl finished early");

    // A plain signal interrupts the slow one: the kernel sends FUSE_INTERRUPT, we reply EINTR.
    let r = interrupt_until(slow_thread, &done_rx, Duration::from_secs(30));
    assert_eq!(r, Err(libc::EINTR));
    slow.join().unwrap();
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn fixed_major_and_minor() {
    let dev = Device::start("cuse-kt-fixed", &["--major", "121", "--minor", "5"]);
    assert_eq!((dev.major, dev.minor), (121, 5));
    let meta = std::fs::metadata(&dev.path).unwrap();
    assert_eq!(major_minor(meta.rdev()), (121, 5));
    let f = dev.open();
    assert!(ioctl(&f, EX_GETFH, 0).is_ok());
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn a_taken_name_or_number_ends_the_connection() {
    let first = Device::start("cuse-kt-taken", &["--major", "122", "--minor", "1"]);
    // Same name: the kernel aborts the second connection silently; the self-check sees the
    // first server's node (EPERM), and run() returns Ok.
    let (status, lines) = Device::try_start("cuse-kt-taken", &[])
        .err()
        .expect("name reused");
    eprintln!("same name: {status:?} {lines:?}");
    assert_eq!(status.and_then(|s| s.code()), Some(3));
    // Same number, other name: "CUSE: failed to register chrdev region", no node.
    let (status, lines) = Device::try_start("cuse-kt-taken2", &["--major", "122", "--minor", "1"])
        .err()
        .expect("number reused");
    eprintln!("same number: {status:?} {lines:?}");
    assert_eq!(status.and_then(|s| s.code()), Some(3));
    assert!(!Path::new("/dev/cuse-kt-taken2").exists());
    // The first device is unharmed.
    assert!(ioctl(&first.open(), EX_GETFH, 0).is_ok());
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn server_death_gives_clients_errors_not_hangs() {
    let mut dev = Device::start("cuse-kt-death", &[]);
    let f = Arc::new(dev.open());
    let (tx, rx) = mpsc::channel();
    let blocked = {
        let f = f.clone();
        thread::spawn(move || tx.send(ioctl(&f, EX_SLEEP, 120_000)).unwrap())
    };
    assert!(dev.wait_line("SLEEP start", Duration::from_secs(30)));
    dev.kill();
    let in_flight = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("blocked client hangs");
    blocked.join().unwrap();
    let after = ioctl(&f, EX_GETFH, 0);
    let mut buf = [0u8; 4];
    let read_after = (&*f)
        .read(&mut buf)
        .map_err(|e| e.raw_os_error().unwrap_or(0));
    let reopen = OpenOptions::new()
        .read(true)
        .open(&dev.path)
        .map_err(|e| e.raw_os_error());
    eprintln!(
        "after server death: in-flight ioctl {in_flight:?}, next ioctl {after:?}, read {read_after:?}, reopen {:?}",
        reopen.as_ref().map(|_| ())
    );
    assert_eq!(in_flight, Err(libc::ECONNABORTED));
    assert_eq!(after, Err(libc::ENOTCONN));
    assert_eq!(read_after, Err(libc::ENOTCONN));
    assert!(
        reopen.is_err(),
        "the node must not open after the server died"
    );
}

#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn a_handler_can_call_its_own_device_and_close_it() {
    // Two workers suffice for one caller: the outer ioctl's, and one for the nested open,
    // ioctl and RELEASE, which the reader keeps reading while the outer handler waits.
    let dev = Device::start("cuse-kt-self2", &["--max-workers", "2"]);
    let f = dev.open();
    let own = ioctl(&f, EX_GETFH, 0).unwrap();
    let nested = ioctl(&f, EX_SELF, 0).unwrap();
    assert!(nested > own, "nested open got fh {nested}, ours is {own}");
    drop((f, dev));

    // Many callers at once with the default pool.
    let dev = Device::start("cuse-kt-self", &[]);
    let t = Instant::now();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let f = dev.open();
            thread::spawn(move || {
                let own = ioctl(&f, EX_GETFH, 0).unwrap();
                for _ in 0..5 {
                    let nested = ioctl(&f, EX_SELF, 0).unwrap();
                    assert_ne!(nested, own);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    eprintln!("8 clients x 5 self-calls took {:?}", t.elapsed());
}

/// The live device changes server process three times (`--handover`: suspend, hand the
/// `/dev/cuse` channel and the state to a fresh process, which resumes) while a client holds the
/// node open and loops ioctls (`EX_INCR` with its retry round, `EX_GETFH`, `EX_GET`): no call
/// fails, the open file's fh and the register survive, and each new server answers.
#[test]
#[ignore = "needs /dev/cuse (root); run by tests/run-kernel-tests.sh"]
fn the_device_changes_server_process_under_a_busy_client() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let dev = Device::start("nvproxy-test/handover", &["--handover"]);
    let f = dev.open();
    let mut five = 5i32;
    assert_eq!(ioctl_ptr(&f, EX_SET, &mut five), Ok(0));
    let fh = ioctl(&f, EX_GETFH, 0).expect("EX_GETFH");
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let client = {
        let (stop, calls) = (stop.clone(), calls.clone());
        thread::spawn(move || {
            let mut errors = Vec::new();
            let mut i = 0i32;
            while !stop.load(Ordering::SeqCst) {
                let mut v = i;
                match ioctl_ptr(&f, EX_INCR, &mut v) {
                    Ok(0) if v == i + 1 => {}
                    other => errors.push(format!("EX_INCR({i}): {other:?}, {v}")),
                }
                match ioctl(&f, EX_GETFH, 0) {
                    Ok(x) if x == fh => {}
                    other => errors.push(format!("EX_GETFH: {other:?}, want {fh}")),
                }
                let mut r = 0i32;
                match ioctl_ptr(&f, EX_GET, &mut r) {
                    Ok(_) if r == 5 => {}
                    other => errors.push(format!("EX_GET: {other:?}, {r}")),
                }
                calls.fetch_add(3, Ordering::SeqCst);
                i = i.wrapping_add(1);
                if errors.len() > 20 {
                    break;
                }
            }
            errors
        })
    };
    let wait_calls = |more: u64| {
        let target = calls.load(Ordering::SeqCst) + more;
        let deadline = Instant::now() + START_TIMEOUT;
        while calls.load(Ordering::SeqCst) < target {
            assert!(Instant::now() < deadline, "the client made no progress");
            thread::sleep(Duration::from_millis(10));
        }
    };
    wait_calls(30);
    let mut server = dev.child.id() as i32;
    let mut servers = vec![server];
    for round in 1..=3 {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(server),
            nix::sys::signal::Signal::SIGUSR1,
        )
        .unwrap();
        let deadline = Instant::now() + START_TIMEOUT;
        let next = loop {
            let line = dev
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|e| panic!("round {round}: no HANDED line ({e:?})"));
            if let Some(pid) = line.strip_prefix("HANDED ") {
                break pid.trim().parse::<i32>().unwrap();
            }
        };
        assert!(
            dev.wait_line(&format!("RESUMED {next} "), START_TIMEOUT),
            "round {round}: server {next} did not resume"
        );
        servers.push(next);
        server = next;
        // The client goes on with the new server.
        wait_calls(30);
    }
    stop.store(true, Ordering::SeqCst);
    let errors = client.join().unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert!(
        errors.is_empty(),
        "the client saw errors across the handovers: {errors:#?}"
    );
    let distinct: std::collections::BTreeSet<i32> = servers.iter().copied().collect();
    assert_eq!(distinct.len(), 4, "four server processes: {servers:?}");
    eprintln!(
        "{} calls across servers {servers:?}",
        calls.load(Ordering::SeqCst)
    );
}
