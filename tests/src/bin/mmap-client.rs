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
use nvproxy_preload_proto::{DEFAULT_SOCKET_PATH, NVPROXY_HELLO_MAGIC, NVPROXY_IOC_IDENTIFY};
use serde_json::{Value, json};
use tests::mmapc::{self, Answer, Mapping};

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
