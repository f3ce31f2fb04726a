//! [`InstanceMmap`]: the node-side protocol: the ticket ioctl (with the instance's
//! client-memory transport), opens and releases, the "no shim" warnings.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use cuse_dev::{Errno, IoVec, Ioctl, IoctlReply, Request};
use nix::sys::socket::{self, MsgFlags, sockopt};
use nix::sys::time::TimeVal;
use nvproxy_preload_proto::{MmapReply, MmapRequest, MmapTicketArgs};

use super::*;
use crate::node::{Backend, Node};
use crate::ratelimit::tenant_log;
use crate::sys;
use nvproxy_config::MemoryTransport;

/// The node a ticket was issued on and the backend that answers for it.
#[derive(Clone)]
pub struct Target {
    /// The node.
    pub node: Node,
    /// Its backend.
    pub backend: Arc<dyn Backend>,
}

/// An mmap ticket in a live upgrade's state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LiveTicket {
    /// The ticket number.
    pub ticket: u64,
    /// Its node (`nvidiactl`, `nvidia0`, `nvidia-uvm`).
    pub node: String,
    /// The open file it was issued on.
    pub fh: u64,
    /// The thread group that may redeem it.
    pub tgid: u32,
    /// The mmap call: addr, len, prot, flags, offset.
    pub args: [u64; 5],
    /// Milliseconds it has left.
    pub left_ms: u64,
}

/// One instance's mmap state: its tickets and the shim check of its clients.
pub struct InstanceMmap {
    pub(super) instance: String,
    tickets: TicketStore<Target>,
    /// Thread ids already checked for the shim at open (bounded).
    checked: Mutex<HashSet<u32>>,
}

impl InstanceMmap {
    /// The mmap state of `instance`.
    pub fn new(instance: &str) -> io::Result<Self> {
        Ok(InstanceMmap {
            instance: instance.to_owned(),
            tickets: TicketStore::with_urandom(TICKET_TTL, MAX_TICKETS)?,
            checked: Mutex::new(HashSet::new()),
        })
    }

    /// The live tickets for a live upgrade: (ticket, node, fh, tgid, args, time left).
    pub fn export_tickets(&self) -> Vec<LiveTicket> {
        self.tickets
            .export(Instant::now())
            .into_iter()
            .map(|(id, k, left)| LiveTicket {
                ticket: id,
                node: k.target.node.to_string(),
                fh: k.fh,
                tgid: k.tgid,
                args: [
                    k.args.addr,
                    k.args.len,
                    u64::from(bits32(k.args.prot)),
                    u64::from(bits32(k.args.flags)),
                    u64::from_ne_bytes(k.args.offset.to_ne_bytes()),
                ],
                left_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
            })
            .collect()
    }

    /// Takes the tickets of [`InstanceMmap::export_tickets`]; `backend` gives each node's
    /// backend (a ticket of a node this instance lacks is dropped).
    pub fn import_tickets(
        &self,
        tickets: Vec<LiveTicket>,
        backend: impl Fn(Node) -> Option<Arc<dyn Backend>>,
    ) {
        let now = Instant::now();
        let list = tickets
            .into_iter()
            .filter_map(|t| {
                let node = Node::parse(&t.node)?;
                let args = nvproxy_preload_proto::MmapTicketArgs {
                    addr: t.args[0],
                    len: t.args[1],
                    prot: i32::from_ne_bytes(u32::try_from(t.args[2]).ok()?.to_ne_bytes()),
                    flags: i32::from_ne_bytes(u32::try_from(t.args[3]).ok()?.to_ne_bytes()),
                    offset: i64::from_ne_bytes(t.args[4].to_ne_bytes()),
                    ticket: t.ticket,
                };
                let k = super::tickets::Ticket {
                    target: Target {
                        node,
                        backend: backend(node)?,
                    },
                    fh: t.fh,
                    tgid: t.tgid,
                    expires: now,
                    args,
                };
                Some((t.ticket, k, Duration::from_millis(t.left_ms)))
            })
            .collect();
        self.tickets.import(list, now);
    }

    /// The instance's name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// `NVPROXY_IOC_MMAP_TICKET` on `node`'s open file `io.fh`.
    pub fn ticket_ioctl(
        &self,
        node: Node,
        backend: &Arc<dyn Backend>,
        req: &Request,
        io: &Ioctl<'_>,
        transport: MemoryTransport,
    ) -> Result<IoctlReply, Errno> {
        let tid = req.pid();
        if tid == 0 {
            // The caller lives outside our pid namespace: it can never be a socket peer we know.
            return Err(Errno::EPERM);
        }
        let ticket_addr = io
            .arg
            .checked_add(MmapTicketArgs::TICKET_OFFSET as u64)
            .ok_or(Errno::EFAULT)?;
        let args = match transport {
            MemoryTransport::ProcessVm => {
                let mut b = [0u8; MmapTicketArgs::SIZE];
                // A wait on the caller's memory, bounded like every other (cuse-dev
                // watchdog.rs): past the deadline the request is answered EFAULT.
                let waits = req.client_waits();
                let wait = waits.arm();
                let read = sys::process_vm_read(tid, io.arg, &mut b);
                if wait.fired() {
                    return Err(Errno::EFAULT);
                }
                read.map_err(|_| Errno::EFAULT)?;
                MmapTicketArgs::from_bytes(&b).ok_or(Errno::EFAULT)?
            }
            MemoryTransport::Retry => {
                if !io.is_unrestricted() {
                    return Err(Errno::EINVAL);
                }
                if io.in_data.is_empty() {
                    // First round: ask the kernel for the struct, and for the ticket's bytes as
                    // the output region. The second round carries the struct; no state needed.
                    return Ok(IoctlReply::Retry {
                        in_iovs: vec![IoVec::new(io.arg, MmapTicketArgs::SIZE as u64)],
                        out_iovs: vec![IoVec::new(ticket_addr, 8)],
                    });
                }
                if io.in_data.len() != MmapTicketArgs::SIZE {
                    return Err(Errno::EINVAL);
                }
                MmapTicketArgs::from_bytes(io.in_data).ok_or(Errno::EINVAL)?
            }
        };
        let tgid = tgid_of(tid).map_err(|_| Errno::ESRCH)?;
        let target = Target {
            node,
            backend: backend.clone(),
        };
        let ticket = self
            .tickets
            .issue(target, io.fh, tgid, args, Instant::now())
            .inspect_err(|_| {
                tenant_log!(
                    warn,
                    &self.instance,
                    tgid,
                    "too many mmap tickets outstanding"
                );
            })?;
        tracing::debug!(instance = %self.instance, ?node, fh = io.fh, tid, tgid, len = args.len, offset = args.offset, "mmap ticket issued");
        match transport {
            MemoryTransport::ProcessVm => {
                let waits = req.client_waits();
                let wait = waits.arm();
                let written = sys::process_vm_write(tid, ticket_addr, &ticket.to_ne_bytes());
                if written.is_err() || wait.fired() {
                    // The caller never learns the ticket: withdraw it.
                    let _ = self.tickets.redeem(ticket, tgid, Instant::now());
                    return Err(Errno::EFAULT);
                }
                Ok(IoctlReply::result(0))
            }
            MemoryTransport::Retry => Ok(IoctlReply::Done {
                result: 0,
                out: ticket.to_ne_bytes()[..].into(),
            }),
        }
    }

    /// Open file `fh` of `node` is gone: its tickets go with it.
    pub fn released(&self, node: Node, fh: u64) {
        self.tickets.forget(|t, f| t.node == node && f == fh);
    }

    /// A client thread `tid` opened `node`: once per thread, say so if its process does not
    /// have the shim mapped (its mmaps of the node will fail with ENODEV).
    pub fn opened(&self, node: Node, tid: u32) {
        if tid == 0 || sys::is_own_thread(tid) {
            return;
        }
        {
            let mut checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
            if checked.len() >= 4096 {
                checked.clear();
            }
            if !checked.insert(tid) {
                return;
            }
        }
        if let Ok(false) = has_shim(tid) {
            let comm = std::fs::read_to_string(format!("/proc/{tid}/comm")).unwrap_or_default();
            tenant_log!(
                info,
                &self.instance,
                node = %node.dev_name(),
                pid = tid,
                comm = comm.trim(),
                "client opened a node without the mmap shim ({SHIM_NAME}): its mmap() of the node will fail with ENODEV (CUSE has no mmap); run it with `nvproxy exec`/`nvproxy run`, or LD_PRELOAD the shim and mount the instance socket"
            );
        }
    }

    /// Serves one connection of the instance socket.
    pub(super) fn serve_peer(&self, conn: OwnedFd) {
        let peer = match socket::getsockopt(&conn, sockopt::PeerCredentials) {
            Ok(c) => u32::try_from(c.pid()).unwrap_or(0),
            Err(e) => {
                tenant_log!(warn, &self.instance, error = %e, "SO_PEERCRED failed");
                return;
            }
        };
        let _ = socket::setsockopt(&conn, sockopt::ReceiveTimeout, &timeval(PEER_TIMEOUT));
        let _ = socket::setsockopt(&conn, sockopt::SendTimeout, &timeval(PEER_TIMEOUT));
        // A plain recv: fds a peer might attach are discarded by the kernel, never installed.
        let mut buf = [0u8; MmapRequest::SIZE + 1];
        let n = match socket::recv(conn.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(instance = %self.instance, peer, error = %e, "mmap socket: no request");
                return;
            }
        };
        let Some(req) = MmapRequest::decode(&buf[..n]) else {
            self.refused(peer, "malformed request");
            return;
        };
        let ticket = match self.tickets.redeem(req.ticket, peer, Instant::now()) {
            Ok(t) => t,
            Err(Refusal::Unknown) => {
                return self.refused(peer, "unknown or used ticket (replay, another instance's, or its open file is closed)");
            }
            Err(Refusal::Expired) => return self.refused(peer, "expired ticket"),
            Err(Refusal::WrongPeer { owner }) => {
                tenant_log!(
                    warn,
                    &self.instance,
                    peer,
                    owner,
                    "mmap ticket presented by a process that did not ask for it: refused, nothing sent"
                );
                return;
            }
        };
        let (reply, fd) = match ticket.target.backend.mapping_fd(ticket.fh) {
            Ok((fd, adjust)) => (
                MmapReply {
                    errno: 0,
                    offset_adjust: adjust,
                },
                Some(fd),
            ),
            Err(e) => (
                MmapReply {
                    errno: e.raw(),
                    offset_adjust: 0,
                },
                None,
            ),
        };
        tracing::debug!(instance = %self.instance, node = ?ticket.target.node, fh = ticket.fh, peer, errno = reply.errno, addr = format_args!("{:#x}", ticket.args.addr), len = ticket.args.len, offset = ticket.args.offset, "mmap ticket redeemed");
        let sent = crate::fdpass::send_with_fd(
            conn.as_fd(),
            &reply.encode(),
            fd.as_ref(),
            MsgFlags::empty(),
        );
        if let Err(e) = sent {
            tracing::debug!(instance = %self.instance, peer, error = %e, "mmap socket: reply not sent");
        }
    }

    fn refused(&self, peer: u32, why: &str) {
        tenant_log!(
            warn,
            &self.instance,
            peer,
            "mmap ticket refused: {why}; nothing sent"
        );
    }

    /// The ticket store (tests).
    #[cfg(test)]
    pub fn tickets(&self) -> &TicketStore<Target> {
        &self.tickets
    }
}

fn timeval(d: Duration) -> TimeVal {
    TimeVal::new(d.as_secs() as i64, 0)
}

/// The thread group of thread `tid` (`Tgid:` in `/proc/<tid>/status`).
pub(super) fn tgid_of(tid: u32) -> io::Result<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))
}

/// Whether process (thread) `tid` has the shim mapped. Reads at most 4 MiB of its maps.
fn has_shim(tid: u32) -> io::Result<bool> {
    let f = File::open(format!("/proc/{tid}/maps"))?;
    let mut r = BufReader::new(f.take(4 << 20));
    let mut line = Vec::new();
    while r.read_until(b'\n', &mut line)? != 0 {
        if line.ends_with(b"/libnvproxy_preload.so\n") || line.ends_with(b"/libnvproxy_preload.so")
        {
            return Ok(true);
        }
        line.clear();
    }
    Ok(false)
}

/// An `i32`'s bits as a `u32` (a ticket's `prot` and `flags` travel as their bit patterns).
fn bits32(v: i32) -> u32 {
    u32::from_ne_bytes(v.to_ne_bytes())
}
