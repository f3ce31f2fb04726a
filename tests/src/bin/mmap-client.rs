//! `mmap-client`: the test client of nvproxy's mmap path (the shim, tickets, the instance
//! socket). Run under `nvproxy exec`/`run` (the shim preloaded, the socket at
//! `/run/nvproxy/mmap.sock`) or, for the cross-instance scenario, on the host next to
//! `nvproxy serve`.
//!
//! `mmap-client SCENARIO [ARGS]`:
//!
//! - `map --node P [--len N] [--offset O] [--private] [--read-only] [--prot-read]
//!   --expect ok|ERRNO`: one
//!   `mmap()` of the node through whatever `mmap` this process links; checks the outcome.
//! - `unrelated`: with the shim loaded, anonymous, memfd, regular-file and `/dev/zero`
//!   mappings work as without it.
//! - `hello --node P`: `NVPROXY_IOC_HELLO` answers the magic; the daemon's identify ioctl is
//!   refused (`EPERM`) to a client.
//! - hostile, speaking the socket by hand (`--socket`, default `/run/nvproxy/mmap.sock`):
//!   `replay` (the second redemption of a ticket gets nothing), `expired --wait-ms N` (a ticket
//!   presented after N ms gets nothing), `wrong-peer` (a child process presenting our ticket
//!   gets nothing, and the ticket still works for us), `unknown` (a made-up ticket gets
//!   nothing), `cross --own-socket S` (our ticket gets nothing at `--socket`, another
//!   instance's, and a reply at S, our own);
//! - `redeem --ticket T --expect nothing|reply`: presents T (the child of `wrong-peer`);
//! - `socket-info`: the inode of `/run/nvproxy/mmap.sock` and the entries of `/run/nvproxy`.
//! - `uvm-map [--count N]`: `UVM_INITIALIZE`, then N times the `cudaMallocManaged` pattern
//!   (a 4 MiB anonymous `PROT_NONE` reservation, a 2 MiB `MAP_SHARED|MAP_FIXED` mapping of the
//!   UVM fd at a 2 MiB-aligned VA inside it, with offset == VA): each must land exactly there
//!   and `UVM_VALIDATE_VA_RANGE` must accept it (the driver sees a managed range); a child
//!   process (`uvm-peek`, inheriting the fd) maps the same VA and reads and writes the bytes.
//! - `rm-map --expect-fd-ioctl ERRNO`: a CUDA-like session allocates `NV01_MEMORY_SYSTEM`, maps
//!   it with `NV_ESC_RM_MAP_MEMORY` onto two nvidiactl files, `mmap()`s both through the shim
//!   and checks that bytes written through one mapping are read through the other, both ways;
//!   then takes the host fd by hand and checks a device ioctl on it fails with ERRNO; frees all.
//!
//! Output: one JSON line (`scenario`, `ok`, details). Exit status 0 when every check passed, 1
//! otherwise, 2 on usage errors.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::{Parser, Subcommand};
use nvproxy_abi::ioctl::{NV_ESC_CHECK_VERSION_STR, UVM_INITIALIZE, UVM_VALIDATE_VA_RANGE};
use nvproxy_preload_proto::{DEFAULT_SOCKET_PATH, NVPROXY_HELLO_MAGIC, NVPROXY_IOC_IDENTIFY};
use serde_json::{Value, json};
use tests::mmapc::{self, Answer, Mapping, RmMemory};

#[derive(Parser)]
#[command(name = "mmap-client")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(clap::Args, Clone)]
struct Sock {
    /// The mmap socket.
    #[arg(long, default_value = DEFAULT_SOCKET_PATH)]
    socket: PathBuf,
}

#[derive(clap::Args, Clone)]
struct Node {
    /// The node to map.
    #[arg(long, default_value = "/dev/nvidiactl")]
    node: PathBuf,
}

#[derive(Subcommand)]
enum Scenario {
    /// One mmap of the node.
    Map {
        #[command(flatten)]
        node: Node,
        #[arg(long, default_value_t = 4096)]
        len: usize,
        #[arg(long, default_value_t = 0)]
        offset: i64,
        /// MAP_PRIVATE instead of MAP_SHARED.
        #[arg(long)]
        private: bool,
        /// Open the node read-only (the mapping stays read/write unless --prot-read).
        #[arg(long)]
        read_only: bool,
        /// Map with PROT_READ only.
        #[arg(long)]
        prot_read: bool,
        /// `ok` or an errno name (ENODEV, EINVAL, EACCES, ...).
        #[arg(long)]
        expect: String,
    },
    /// Other mmaps are untouched by the shim.
    Unrelated,
    /// HELLO answers, IDENTIFY is refused.
    Hello {
        #[command(flatten)]
        node: Node,
    },
    /// A ticket redeems once.
    Replay {
        #[command(flatten)]
        node: Node,
        #[command(flatten)]
        sock: Sock,
    },
    /// A ticket expires.
    Expired {
        #[command(flatten)]
        node: Node,
        #[command(flatten)]
        sock: Sock,
        #[arg(long, default_value_t = 6000)]
        wait_ms: u64,
    },
    /// Only the thread group that asked may redeem.
    WrongPeer {
        #[command(flatten)]
        node: Node,
        #[command(flatten)]
        sock: Sock,
    },
    /// A made-up ticket gets nothing.
    Unknown {
        #[command(flatten)]
        sock: Sock,
    },
    /// Our ticket gets nothing at another instance's socket.
    Cross {
        #[command(flatten)]
        node: Node,
        #[command(flatten)]
        sock: Sock,
        /// Our own instance's socket.
        #[arg(long)]
        own_socket: PathBuf,
    },
    /// Presents a ticket.
    Redeem {
        #[command(flatten)]
        sock: Sock,
        #[arg(long)]
        ticket: u64,
        /// `nothing` or `reply`.
        #[arg(long)]
        expect: String,
    },
    /// Which socket this namespace shows.
    SocketInfo,
    /// The cudaMallocManaged pattern on /dev/nvidia-uvm: reserve with an anonymous mapping,
    /// MAP_FIXED the UVM fd over it at VA == offset, many times; each lands where asked, the
    /// driver sees the range, and a child process mapping the same VA shares the bytes.
    UvmMap {
        /// How many 2 MiB ranges.
        #[arg(long, default_value_t = 16)]
        count: usize,
    },
    /// (child of uvm-map) Maps 2 MiB of the inherited UVM fd `--fd` at `--addr` (VA ==
    /// offset), checks `--expect` is there, writes `--reply` at +64.
    UvmPeek {
        #[arg(long)]
        fd: i32,
        #[arg(long)]
        addr: usize,
        #[arg(long)]
        expect: String,
        #[arg(long)]
        reply: String,
    },
    /// RM system memory mapped through the shim twice (two RM_MAP_MEMORY contexts), bytes
    /// visible both ways; the handed-over fd refuses a device ioctl.
    /// Loops until `--stop-file` exists: through two mappings of one RM memory object a
    /// pattern is written and read back, RM controls run on the session's client, every 7th
    /// round a new mmap (ticket, socket) of the object, every 10th a whole new session that
    /// allocates and frees. Any error counts (a live upgrade under it must cause none).
    Live {
        /// The driver version to speak.
        #[arg(long, default_value = "535.261.03")]
        driver_version: String,
        /// Stop when this file exists.
        #[arg(long)]
        stop_file: PathBuf,
        /// Stop after this many seconds anyway.
        #[arg(long, default_value_t = 600)]
        max_seconds: u64,
    },
    RmMap {
        /// The driver version to speak.
        #[arg(long, default_value = "535.261.03")]
        driver_version: String,
        /// What a device ioctl on the handed-over fd gives: EACCES on the real driver (a
        /// Landlock'd open), ENOTTY with the simulated one (the fd is a memfd).
        #[arg(long)]
        expect_fd_ioctl: String,
    },
}

fn errno_name(e: i32) -> String {
    match e {
        libc::ENODEV => "ENODEV".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::EACCES => "EACCES".into(),
        libc::EPERM => "EPERM".into(),
        libc::EBADF => "EBADF".into(),
        libc::ENOMEM => "ENOMEM".into(),
        libc::EAGAIN => "EAGAIN".into(),
        libc::EFAULT => "EFAULT".into(),
        libc::ENOTTY => "ENOTTY".into(),
        libc::EOVERFLOW => "EOVERFLOW".into(),
        n => format!("errno {n}"),
    }
}

fn open_node(path: &Path, read_only: bool) -> Result<File, String> {
    OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(path)
        .map_err(|e| format!("open {}: {e}", path.display()))
}

fn answer_json(a: &std::io::Result<Answer>) -> Value {
    match a {
        Ok(Answer::Nothing) => json!("nothing"),
        Ok(Answer::Reply(r, fd)) => {
            json!({"errno": r.errno, "offset_adjust": r.offset_adjust, "fd": fd.is_some()})
        }
        Err(e) => json!(format!("error: {e}")),
    }
}

fn is_nothing(a: &std::io::Result<Answer>) -> bool {
    matches!(a, Ok(Answer::Nothing))
}

fn is_reply(a: &std::io::Result<Answer>) -> bool {
    matches!(a, Ok(Answer::Reply(..)))
}

fn run(s: Scenario) -> Result<Value, String> {
    Ok(match s {
        Scenario::Map {
            node,
            len,
            offset,
            private,
            read_only,
            prot_read,
            expect,
        } => {
            let f = open_node(&node.node, read_only)?;
            let prot = if prot_read {
                libc::PROT_READ
            } else {
                libc::PROT_READ | libc::PROT_WRITE
            };
            let flags = if private {
                libc::MAP_PRIVATE
            } else {
                libc::MAP_SHARED
            };
            let r = Mapping::map(0, len, prot, flags, f.as_raw_fd(), offset);
            let got = match &r {
                Ok(_) => "ok".to_owned(),
                Err(e) => errno_name(*e),
            };
            json!({"scenario": "map", "ok": got == expect, "got": got, "expect": expect,
                   "shim_loaded": mmapc::shim_loaded()})
        }
        Scenario::Unrelated => {
            let mut checks = Vec::new();
            let anon = Mapping::map(
                0,
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            checks.push(("anonymous", anon.is_ok()));
            let mfd = mmapc::memfd(8192).map_err(|e| format!("memfd: {e}"))?;
            let m = Mapping::map(
                0,
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                mfd.as_raw_fd(),
                4096,
            );
            let memfd_ok = m.as_ref().is_ok_and(|m| {
                m.write(0, b"xyz");
                let mut b = [0u8; 3];
                std::os::unix::fs::FileExt::read_exact_at(
                    &File::from(mfd.try_clone().expect("dup")),
                    &mut b,
                    4096,
                )
                .is_ok()
                    && &b == b"xyz"
            });
            checks.push(("memfd shared, offset 4096", memfd_ok));
            let exe = File::open("/proc/self/exe").map_err(|e| format!("exe: {e}"))?;
            let file = Mapping::map(
                0,
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                exe.as_raw_fd(),
                0,
            );
            let file_ok = file.as_ref().is_ok_and(|m| {
                let mut b = [0u8; 4];
                m.read(0, &mut b);
                &b == b"\x7fELF"
            });
            checks.push(("regular file", file_ok));
            let zero = open_node(Path::new("/dev/zero"), false)?;
            let z = Mapping::map(
                0,
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                zero.as_raw_fd(),
                0,
            );
            checks.push(("/dev/zero", z.is_ok()));
            let closed = Mapping::map(0, 4096, libc::PROT_READ, libc::MAP_SHARED, 999, 0);
            checks.push(("closed fd: EBADF", closed.err() == Some(libc::EBADF)));
            let ok = checks.iter().all(|c| c.1);
            json!({"scenario": "unrelated", "ok": ok && mmapc::shim_loaded(),
                   "shim_loaded": mmapc::shim_loaded(),
                   "checks": checks.iter().map(|(n, v)| json!({"check": n, "ok": v})).collect::<Vec<_>>()})
        }
        Scenario::Hello { node } => {
            let f = open_node(&node.node, false)?;
            let hello = mmapc::hello(&f);
            let identify = mmapc::ioctl_value(&f, NVPROXY_IOC_IDENTIFY, 0x1234);
            json!({"scenario": "hello",
                   "ok": hello == Ok(NVPROXY_HELLO_MAGIC) && identify == Err(libc::EPERM),
                   "hello": format!("{hello:?}"), "identify": format!("{identify:?}")})
        }
        Scenario::Replay { node, sock } => {
            let f = open_node(&node.node, false)?;
            let t = mmapc::simple_ticket(&f).map_err(|e| format!("ticket: {}", errno_name(e)))?;
            let first = mmapc::redeem(&sock.socket, t);
            let second = mmapc::redeem(&sock.socket, t);
            json!({"scenario": "replay", "ok": is_reply(&first) && is_nothing(&second),
                   "first": answer_json(&first), "second": answer_json(&second)})
        }
        Scenario::Expired {
            node,
            sock,
            wait_ms,
        } => {
            let f = open_node(&node.node, false)?;
            let t = mmapc::simple_ticket(&f).map_err(|e| format!("ticket: {}", errno_name(e)))?;
            std::thread::sleep(Duration::from_millis(wait_ms));
            let late = mmapc::redeem(&sock.socket, t);
            let fresh_t =
                mmapc::simple_ticket(&f).map_err(|e| format!("ticket: {}", errno_name(e)))?;
            let fresh = mmapc::redeem(&sock.socket, fresh_t);
            json!({"scenario": "expired", "ok": is_nothing(&late) && is_reply(&fresh),
                   "late": answer_json(&late), "fresh": answer_json(&fresh)})
        }
        Scenario::WrongPeer { node, sock } => {
            let f = open_node(&node.node, false)?;
            let t = mmapc::simple_ticket(&f).map_err(|e| format!("ticket: {}", errno_name(e)))?;
            let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
            let child = Command::new(exe)
                .arg("redeem")
                .arg("--socket")
                .arg(&sock.socket)
                .args(["--ticket", &t.to_string(), "--expect", "nothing"])
                .status()
                .map_err(|e| format!("child: {e}"))?;
            let ours = mmapc::redeem(&sock.socket, t);
            json!({"scenario": "wrong-peer", "ok": child.success() && is_reply(&ours),
                   "child": format!("{child}"), "ours": answer_json(&ours)})
        }
        Scenario::Unknown { sock } => {
            let a = mmapc::redeem(&sock.socket, 0x0123_4567_89ab_cdef);
            json!({"scenario": "unknown", "ok": is_nothing(&a), "answer": answer_json(&a)})
        }
        Scenario::Cross {
            node,
            sock,
            own_socket,
        } => {
            let f = open_node(&node.node, false)?;
            let t = mmapc::simple_ticket(&f).map_err(|e| format!("ticket: {}", errno_name(e)))?;
            let other = mmapc::redeem(&sock.socket, t);
            let own = mmapc::redeem(&own_socket, t);
            json!({"scenario": "cross", "ok": is_nothing(&other) && is_reply(&own),
                   "other": answer_json(&other), "own": answer_json(&own)})
        }
        Scenario::Redeem {
            sock,
            ticket,
            expect,
        } => {
            let a = mmapc::redeem(&sock.socket, ticket);
            let ok = match expect.as_str() {
                "nothing" => is_nothing(&a),
                "reply" => is_reply(&a),
                other => return Err(format!("--expect {other}: nothing or reply")),
            };
            json!({"scenario": "redeem", "ok": ok, "answer": answer_json(&a)})
        }
        Scenario::RmMap {
            driver_version,
            expect_fd_ioctl,
        } => rm_map(&driver_version, &expect_fd_ioctl)?,
        Scenario::UvmMap { count } => uvm_map(count)?,
        Scenario::Live {
            driver_version,
            stop_file,
            max_seconds,
        } => live(&driver_version, &stop_file, max_seconds)?,
        Scenario::UvmPeek {
            fd,
            addr,
            expect,
            reply,
        } => uvm_peek(fd, addr, &expect, &reply)?,
        Scenario::SocketInfo => {
            let m = std::fs::metadata(DEFAULT_SOCKET_PATH)
                .map_err(|e| format!("{DEFAULT_SOCKET_PATH}: {e}"))?;
            let dir = Path::new(DEFAULT_SOCKET_PATH)
                .parent()
                .expect("socket path has a directory");
            let mut entries: Vec<String> = std::fs::read_dir(dir)
                .map_err(|e| format!("{}: {e}", dir.display()))?
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect();
            entries.sort();
            json!({"scenario": "socket-info", "ok": true, "ino": m.ino(), "dev": m.dev(),
                   "entries": entries})
        }
    })
}

fn rm_map(version: &str, expect_fd_ioctl: &str) -> Result<Value, String> {
    let len = 2 * 4096;
    let mut rm = RmMemory::new(version, len as u64)?;
    // Two mapping files, each with its own mmap context on the same memory.
    let a = open_node(Path::new("/dev/nvidiactl"), false)?;
    let b = open_node(Path::new("/dev/nvidiactl"), false)?;
    let addr_a = rm.map_onto(a.as_raw_fd())?;
    let addr_b = rm.map_onto(b.as_raw_fd())?;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let map = |f: &File| {
        Mapping::map(0, len, rw, libc::MAP_SHARED, f.as_raw_fd(), 0)
            .map_err(|e| format!("mmap: {}", errno_name(e)))
    };
    let (ma, mb) = (map(&a)?, map(&b)?);
    ma.write(0, b"written through A");
    mb.write(4096, b"written through B");
    let mut seen_b = [0u8; 17];
    let mut seen_a = [0u8; 17];
    mb.read(0, &mut seen_b);
    ma.read(4096, &mut seen_a);
    let both_ways = &seen_b == b"written through A" && &seen_a == b"written through B";
    drop((ma, mb));

    // The fd the shim receives, taken by hand: a device ioctl on it must not reach the driver.
    // With the socket transport (the shim's NVPROXY_DEV_SOCKET is set) it comes over the
    // open's own socket; with CUSE, for a ticket at the mmap socket.
    let socket_transport = std::env::var_os("NVPROXY_DEV_SOCKET").is_some();
    let answer = if socket_transport {
        match mmapc::socket_host_fd(&a) {
            Ok((r, fd)) => Ok(Answer::Reply(
                nvproxy_preload_proto::MmapReply {
                    errno: r.errno,
                    offset_adjust: r.offset_adjust,
                },
                fd,
            )),
            Err(e) => Err(e),
        }
    } else {
        let t = mmapc::simple_ticket(&a).map_err(|e| format!("ticket: {}", errno_name(e)))?;
        mmapc::redeem(Path::new(DEFAULT_SOCKET_PATH), t)
    };
    let host_ioctl = match answer {
        Ok(Answer::Reply(r, Some(fd))) if r.errno == 0 => {
            let cmd = nvproxy_abi::ioctl::nv_iowr(NV_ESC_CHECK_VERSION_STR, 72);
            match mmapc::ioctl_value(&fd, cmd, 0) {
                Ok(r) => format!("ok {r}"),
                Err(e) => errno_name(e),
            }
        }
        other => format!("no fd: {}", answer_json(&other)),
    };

    rm.unmap(addr_a)?;
    rm.unmap(addr_b)?;
    rm.close()?;
    Ok(
        json!({"scenario": "rm-map", "ok": both_ways && host_ioctl == expect_fd_ioctl,
              "both_ways": both_ways, "host_fd_ioctl": host_ioctl,
              "expect_fd_ioctl": expect_fd_ioctl, "shim_loaded": mmapc::shim_loaded()}),
    )
}

fn live(version: &str, stop_file: &Path, max_seconds: u64) -> Result<Value, String> {
    let len = 2 * 4096;
    let mut rm = RmMemory::new(version, len as u64)?;
    let a = open_node(Path::new("/dev/nvidiactl"), false)?;
    let b = open_node(Path::new("/dev/nvidiactl"), false)?;
    let addr_a = rm.map_onto(a.as_raw_fd())?;
    let addr_b = rm.map_onto(b.as_raw_fd())?;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let map = |f: &File| {
        Mapping::map(0, len, rw, libc::MAP_SHARED, f.as_raw_fd(), 0)
            .map_err(|e| format!("mmap: {}", errno_name(e)))
    };
    let (ma, mb) = (map(&a)?, map(&b)?);
    // A UVM va_space with one managed-style range (the cudaMallocManaged pattern).
    let uvm = open_node(Path::new("/dev/nvidia-uvm"), false)?;
    let mut p = [0u8; 16];
    mmapc::uvm_ioctl(&uvm, UVM_INITIALIZE, &mut p)
        .map_err(|e| format!("UVM_INITIALIZE: {}", errno_name(e)))?;
    let reservation =
        Mapping::reserve(2 * MB2).map_err(|e| format!("reserve: {}", errno_name(e)))?;
    let va = (reservation.addr() + MB2 - 1) & !(MB2 - 1);
    let managed = Mapping::map(
        va,
        MB2,
        rw,
        libc::MAP_SHARED | libc::MAP_FIXED,
        uvm.as_raw_fd(),
        va as i64,
    )
    .map_err(|e| format!("UVM mmap: {}", errno_name(e)))?;
    println!("{}", json!({"scenario": "live", "started": true}));
    let start = std::time::Instant::now();
    let mut errors: Vec<String> = Vec::new();
    let mut error_count = 0u64;
    let mut rounds = 0u64;
    let mut note = |e: String, errors: &mut Vec<String>| {
        error_count += 1;
        if errors.len() < 10 {
            errors.push(e);
        }
    };
    let mut round_us: Vec<u64> = Vec::new();
    while !stop_file.exists() && start.elapsed() < Duration::from_secs(max_seconds) {
        rounds += 1;
        let round_start = std::time::Instant::now();
        let text = format!("round {rounds:08}");
        ma.write(100, text.as_bytes());
        let mut seen = vec![0u8; text.len()];
        mb.read(100, &mut seen);
        if seen != text.as_bytes() {
            note(
                format!("round {rounds}: the mappings disagree"),
                &mut errors,
            );
        }
        if let Err(e) = rm.ping() {
            note(format!("round {rounds}: controls: {e}"), &mut errors);
        }
        managed.write(MB2 - 64, text.as_bytes());
        let mut seen = vec![0u8; text.len()];
        managed.read(MB2 - 64, &mut seen);
        let mut v = [0u8; 24];
        v[0..8].copy_from_slice(&(va as u64).to_ne_bytes());
        v[8..16].copy_from_slice(&(MB2 as u64).to_ne_bytes());
        match mmapc::uvm_ioctl(&uvm, UVM_VALIDATE_VA_RANGE, &mut v) {
            Ok(_) if u32::from_ne_bytes(v[16..20].try_into().expect("4 bytes")) == 0 => {}
            Ok(_) => note(
                format!("round {rounds}: UVM_VALIDATE_VA_RANGE status"),
                &mut errors,
            ),
            Err(e) => note(
                format!("round {rounds}: UVM ioctl: {}", errno_name(e)),
                &mut errors,
            ),
        }
        if seen != text.as_bytes() {
            note(
                format!("round {rounds}: the UVM range lost its bytes"),
                &mut errors,
            );
        }
        if rounds.is_multiple_of(7) {
            let r = (|| -> Result<(), String> {
                let c = open_node(Path::new("/dev/nvidiactl"), false)?;
                let addr = rm.map_onto(c.as_raw_fd())?;
                let m = map(&c)?;
                let mut seen = vec![0u8; text.len()];
                m.read(100, &mut seen);
                drop(m);
                rm.unmap(addr)?;
                if seen != text.as_bytes() {
                    return Err("a new mapping shows other bytes".into());
                }
                Ok(())
            })();
            if let Err(e) = r {
                note(format!("round {rounds}: new mapping: {e}"), &mut errors);
            }
        }
        if rounds.is_multiple_of(10) {
            let r = RmMemory::new(version, 4096).and_then(RmMemory::close);
            if let Err(e) = r {
                note(format!("round {rounds}: new session: {e}"), &mut errors);
            }
        }
        round_us.push(u64::try_from(round_start.elapsed().as_micros()).unwrap_or(u64::MAX));
        std::thread::sleep(Duration::from_millis(20));
    }
    round_us.sort_unstable();
    let median_us = round_us.get(round_us.len() / 2).copied().unwrap_or(0);
    let max_us = round_us.last().copied().unwrap_or(0);
    drop((ma, mb, managed, reservation));
    let mut end = Vec::new();
    for r in [rm.unmap(addr_a), rm.unmap(addr_b)] {
        if let Err(e) = r {
            end.push(e);
        }
    }
    if let Err(e) = rm.close() {
        end.push(e);
    }
    let ok = error_count == 0 && end.is_empty() && rounds > 0 && stop_file.exists();
    Ok(
        json!({"scenario": "live", "ok": ok, "rounds": rounds, "errors": error_count,
              "first_errors": errors, "teardown_errors": end,
              "median_round_us": median_us, "max_round_us": max_us,
              "stopped_by_file": stop_file.exists()}),
    )
}

const MB2: usize = 2 << 20;

fn uvm_map(count: usize) -> Result<Value, String> {
    let uvm = open_node(Path::new("/dev/nvidia-uvm"), false)?;
    let mut p = [0u8; 16]; // UVM_INITIALIZE_PARAMS: flags 0
    mmapc::uvm_ioctl(&uvm, UVM_INITIALIZE, &mut p)
        .map_err(|e| format!("UVM_INITIALIZE: {}", errno_name(e)))?;
    let status = u32::from_ne_bytes(p[8..12].try_into().expect("4 bytes"));
    if status != 0 {
        return Err(format!("UVM_INITIALIZE: rmStatus {status:#x}"));
    }
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let mut reservations = Vec::new();
    let mut ranges = Vec::new();
    let mut landed = 0;
    let mut validated = 0;
    let mut wrong = Vec::new();
    for i in 0..count {
        let r = Mapping::reserve(2 * MB2).map_err(|e| format!("reserve: {}", errno_name(e)))?;
        let va = (r.addr() + MB2 - 1) & !(MB2 - 1);
        match Mapping::map(
            va,
            MB2,
            rw,
            libc::MAP_SHARED | libc::MAP_FIXED,
            uvm.as_raw_fd(),
            va as i64,
        ) {
            Ok(m) if m.addr() == va => {
                landed += 1;
                m.write(0, format!("uvm range {i}").as_bytes());
                m.write(MB2 - 16, b"end of the range");
                ranges.push(m);
            }
            Ok(m) => wrong.push(format!("asked {va:#x}, got {:#x}", m.leak())),
            Err(e) => wrong.push(format!("{va:#x}: {}", errno_name(e))),
        }
        let mut v = [0u8; 24];
        v[0..8].copy_from_slice(&(va as u64).to_ne_bytes());
        v[8..16].copy_from_slice(&(MB2 as u64).to_ne_bytes());
        if mmapc::uvm_ioctl(&uvm, UVM_VALIDATE_VA_RANGE, &mut v).is_ok()
            && u32::from_ne_bytes(v[16..20].try_into().expect("4 bytes")) == 0
        {
            validated += 1;
        }
        reservations.push(r);
    }
    // Another process maps the first range at the same VA through its own shim and ticket.
    let first = ranges.first().ok_or("no range landed")?;
    let va0 = first.addr();
    mmapc::inherit(&uvm).map_err(|e| format!("fcntl: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let out = Command::new(exe)
        .args(["uvm-peek", "--fd", &uvm.as_raw_fd().to_string()])
        .args(["--addr", &va0.to_string(), "--expect", "uvm range 0"])
        .args(["--reply", "written by the child"])
        .output()
        .map_err(|e| format!("child: {e}"))?;
    let child: Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or(json!({"ok": false, "error": "no output"}));
    let mut seen = [0u8; 20];
    first.read(64, &mut seen);
    let child_seen = &seen == b"written by the child";
    // The ranges first, then the reservations around them.
    drop(ranges);
    drop(reservations);
    Ok(json!({"scenario": "uvm-map",
              "ok": landed == count && validated == count && child["ok"] == true && child_seen,
              "count": count, "landed": landed, "validated": validated, "wrong": wrong,
              "child": child, "child_bytes_seen": child_seen,
              "shim_loaded": mmapc::shim_loaded()}))
}

fn uvm_peek(fd: i32, addr: usize, expect: &str, reply: &str) -> Result<Value, String> {
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let m = Mapping::map(
        addr,
        MB2,
        rw,
        libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
        fd,
        addr as i64,
    )
    .map_err(|e| format!("mmap at {addr:#x}: {}", errno_name(e)))?;
    let mut seen = vec![0u8; expect.len()];
    m.read(0, &mut seen);
    m.write(64, reply.as_bytes());
    Ok(
        json!({"scenario": "uvm-peek", "ok": m.addr() == addr && seen == expect.as_bytes(),
              "landed": m.addr() == addr, "seen": String::from_utf8_lossy(&seen)}),
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.scenario) {
        Ok(v) => {
            println!("{v}");
            if v["ok"] == true {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            println!("{}", json!({"scenario": "error", "ok": false, "error": e}));
            ExitCode::FAILURE
        }
    }
}
