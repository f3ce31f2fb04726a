//! The socket transport: the shim's messages to an instance's worker when the container has no
//! NVIDIA device nodes at all (no CUSE).
//!
//! - **Open.** The shim connects to the instance's device socket ([`ENV_DEV_SOCKET`], default
//!   [`DEFAULT_DEV_SOCKET_PATH`]; `SOCK_SEQPACKET`) and sends an [`OpenRequest`]. The worker
//!   takes the caller from `SO_PEERCRED`, opens the node with its request path, makes a
//!   `socketpair` and answers an [`OpenReply`] with the client end attached (`SCM_RIGHTS`) when
//!   `errno` is 0. That socket **is** the open file: `dup`, `fork`, `close` and fd passing are
//!   the kernel's; the worker releases the open when its end sees the last client reference go.
//! - **Channels.** Calls do not go on the open's socket itself (several threads, and after
//!   `fork` several processes, share it, and one socket cannot tell their answers apart).
//!   The first call of a thread on an open makes a `socketpair` and sends an
//!   [`AttachRequest`] on the open's socket with one end attached (`SCM_RIGHTS`); the worker
//!   checks the caller holds the open (below) and answers a [`CallReply`] on that channel.
//!   From then on each `ioctl` or `mmap` of that thread on that open is one [`CallRequest`]
//!   sent on its channel and one [`CallReply`] back on it (for `mmap`, with the host fd to map
//!   attached): one round trip, no fd passed, no socket made. A reply with
//!   [`CallReply::retry`] (the worker was suspended for a live upgrade before it read the
//!   call) means "not served": attach a new channel and send again. A channel is the thread's
//!   own; a forked child attaches its own.
//! - **Trust.** The worker takes the caller from each message's `SCM_CREDENTIALS` (filled in
//!   by the kernel), checks at attach that the fd the request names is this open in the
//!   caller's fd table (`pidfd_getfd`, compared by socket cookie), and again for any call
//!   whose sender is not the process that attached; it reads and writes the caller's memory
//!   itself (`process_vm_readv`/`writev`): nothing in a message is trusted beyond what the
//!   caller could pass to the real driver.
//! - **Versions.** Every request carries [`DEV_PROTOCOL_VERSION`]; a worker refuses an open of
//!   another version with `EPROTONOSUPPORT` (and logs both versions), so an old shim against
//!   a new worker fails its `open` clearly instead of misreading answers.
//! - **Recognition.** The worker's end of each open's connection is bound to an abstract name
//!   starting with [`OPEN_PEER_PREFIX`] and naming the node, so the shim recognises its sockets
//!   (`getpeername`) after `exec` or fd passing too. The rest of the name is 128 random bits
//!   (nothing another process in the network namespace could guess and bind first); an open
//!   whose name cannot be bound is refused.
//!
//! All integers native-endian (both ends run on one machine).

use crate::{u32_at, u64_at};

/// Where the shim finds the device socket when [`ENV_DEV_SOCKET`] is unset.
pub const DEFAULT_DEV_SOCKET_PATH: &str = "/run/nvproxy/dev.sock";
/// Environment variable naming the device socket; its presence switches the shim's socket
/// transport on (open/stat/ioctl/poll/mmap of `/dev/nvidia*` are served through it).
pub const ENV_DEV_SOCKET: &str = "NVPROXY_DEV_SOCKET";
/// Environment variable with the instance's GPU count (`/dev/nvidia0..N-1` exist).
pub const ENV_DEV_GPUS: &str = "NVPROXY_DEV_GPUS";
/// Environment variable with the major number `/dev/nvidia-uvm` shows (the host driver's, from
/// `/proc/devices`; libcuda compares the two); default [`DEFAULT_UVM_MAJOR`].
pub const ENV_DEV_UVM_MAJOR: &str = "NVPROXY_DEV_UVM_MAJOR";
/// The major `/dev/nvidia-uvm` shows when the host has no `nvidia-uvm` entry.
pub const DEFAULT_UVM_MAJOR: u32 = 510;
/// The device socket's file name in an instance's run directory.
pub const DEV_SOCKET_NAME: &str = "dev.sock";
/// The socket protocol's version: 2 calls on per-thread channels ([`AttachRequest`]); 1 sent a
/// reply socket with every call.
pub const DEV_PROTOCOL_VERSION: u32 = 2;
/// The most GPUs a node name may number (`/dev/nvidia0` .. `/dev/nvidia255`).
pub const MAX_GPU_NODES: u32 = 256;

/// `"NVOQ"`: first word of an [`OpenRequest`].
pub const OPEN_REQUEST_MAGIC: u32 = u32::from_be_bytes(*b"NVOQ");
/// `"NVOP"`: first word of an [`OpenReply`].
pub const OPEN_REPLY_MAGIC: u32 = u32::from_be_bytes(*b"NVOP");
/// `"NVCQ"`: first word of a [`CallRequest`].
pub const CALL_REQUEST_MAGIC: u32 = u32::from_be_bytes(*b"NVCQ");
/// `"NVAQ"`: first word of an [`AttachRequest`].
pub const ATTACH_REQUEST_MAGIC: u32 = u32::from_be_bytes(*b"NVAQ");
/// `"NVCP"`: first word of a [`CallReply`].
pub const CALL_REPLY_MAGIC: u32 = u32::from_be_bytes(*b"NVCP");

/// The abstract socket name prefix of the worker's end of an open (`getpeername` on the
/// client's end shows it): `\0nvproxy-open-<node code in hex>-<32 hex digits, random>`.
pub const OPEN_PEER_PREFIX: &[u8] = b"\0nvproxy-open-";

/// A node as the socket transport names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevNode {
    /// `/dev/nvidiactl`.
    Ctl,
    /// `/dev/nvidia<N>`.
    Gpu(u32),
    /// `/dev/nvidia-uvm`.
    Uvm,
}

impl DevNode {
    /// The node a path names: exactly `/dev/nvidiactl`, `/dev/nvidia-uvm` or `/dev/nvidia<N>`
    /// (decimal, no leading zero, below [`MAX_GPU_NODES`]).
    pub fn from_path(path: &[u8]) -> Option<DevNode> {
        Self::from_name(path.strip_prefix(b"/dev/")?)
    }

    /// The node a file name in `/dev` names: exactly `nvidiactl`, `nvidia-uvm` or `nvidia<N>`
    /// (as [`DevNode::from_path`] without the directory).
    pub fn from_name(name: &[u8]) -> Option<DevNode> {
        match name {
            b"nvidiactl" => Some(DevNode::Ctl),
            b"nvidia-uvm" => Some(DevNode::Uvm),
            _ => {
                let digits = name.strip_prefix(b"nvidia")?;
                if digits.is_empty()
                    || digits.len() > 3
                    || (digits.len() > 1 && digits[0] == b'0')
                    || !digits.iter().all(u8::is_ascii_digit)
                {
                    return None;
                }
                let n = digits
                    .iter()
                    .fold(0u32, |v, d| v * 10 + u32::from(d - b'0'));
                (n < MAX_GPU_NODES).then_some(DevNode::Gpu(n))
            }
        }
    }

    /// A non-zero code (for caches and the peer name): 1 ctl, 2 uvm, 0x100 + N for GPU N.
    pub const fn code(self) -> u64 {
        match self {
            DevNode::Ctl => 1,
            DevNode::Uvm => 2,
            DevNode::Gpu(n) => 0x100 + n as u64,
        }
    }

    /// The node of a [`DevNode::code`].
    pub fn from_code(code: u64) -> Option<DevNode> {
        match code {
            1 => Some(DevNode::Ctl),
            2 => Some(DevNode::Uvm),
            c if (0x100..0x100 + MAX_GPU_NODES as u64).contains(&c) => {
                u32::try_from(c - 0x100).ok().map(DevNode::Gpu)
            }
            _ => None,
        }
    }

    /// The device number NVIDIA's driver gives the node (`makedev(195, 255)` for nvidiactl,
    /// `makedev(195, N)` for `nvidia<N>`); UVM's major is dynamic in the driver, the shim shows
    /// `uvm_major`.
    pub const fn rdev(self, uvm_major: u32) -> u64 {
        match self {
            DevNode::Ctl => crate::makedev(195, 255),
            DevNode::Gpu(n) => crate::makedev(195, n),
            DevNode::Uvm => crate::makedev(uvm_major, 0),
        }
    }
}

/// Parses a peer name: the node of an abstract name starting with [`OPEN_PEER_PREFIX`]
/// followed by the node's code in lower-case hex and `-`.
pub fn node_of_peer_name(name: &[u8]) -> Option<DevNode> {
    let rest = name.strip_prefix(OPEN_PEER_PREFIX)?;
    let dash = rest.iter().position(|&c| c == b'-')?;
    let hex = &rest[..dash];
    if hex.is_empty() || hex.len() > 4 {
        return None;
    }
    let mut v = 0u64;
    for &c in hex {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        v = v * 16 + u64::from(d);
    }
    DevNode::from_code(v)
}

/// Shim → worker on the device socket: open `node` with `open(2)` flags `flags`.
/// `{ magic, version, kind (1 ctl, 2 uvm, 3 gpu), index, flags, 0 }`, 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenRequest {
    /// The node.
    pub node: DevNode,
    /// The caller's `open(2)` flags.
    pub flags: i32,
}

impl OpenRequest {
    /// Size of the message.
    pub const SIZE: usize = 24;

    /// The message bytes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let (kind, index) = match self.node {
            DevNode::Ctl => (1u32, 0u32),
            DevNode::Uvm => (2, 0),
            DevNode::Gpu(n) => (3, n),
        };
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&OPEN_REQUEST_MAGIC.to_ne_bytes());
        b[4..8].copy_from_slice(&DEV_PROTOCOL_VERSION.to_ne_bytes());
        b[8..12].copy_from_slice(&kind.to_ne_bytes());
        b[12..16].copy_from_slice(&index.to_ne_bytes());
        b[16..20].copy_from_slice(&self.flags.to_ne_bytes());
        b
    }

    /// Decodes a whole message: exactly [`Self::SIZE`] bytes, magic, version, a known kind
    /// (index 0 unless a GPU, below [`MAX_GPU_NODES`]), the reserved word 0.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE
            || u32_at(b, 0)? != OPEN_REQUEST_MAGIC
            || u32_at(b, 4)? != DEV_PROTOCOL_VERSION
            || u32_at(b, 20)? != 0
        {
            return None;
        }
        let index = u32_at(b, 12)?;
        let node = match (u32_at(b, 8)?, index) {
            (1, 0) => DevNode::Ctl,
            (2, 0) => DevNode::Uvm,
            (3, n) if n < MAX_GPU_NODES => DevNode::Gpu(n),
            _ => return None,
        };
        Some(OpenRequest {
            node,
            flags: u32_at(b, 16)? as i32,
        })
    }
}

/// Worker → shim: `{ magic, errno }`, 8 bytes; the open's socket attached when `errno` is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenReply {
    /// 0, or the errno `open(2)` fails with.
    pub errno: i32,
}

impl OpenReply {
    /// Size of the message.
    pub const SIZE: usize = 8;

    /// The message bytes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&OPEN_REPLY_MAGIC.to_ne_bytes());
        b[4..8].copy_from_slice(&self.errno.to_ne_bytes());
        b
    }

    /// Decodes a whole message (non-negative errno).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE || u32_at(b, 0)? != OPEN_REPLY_MAGIC {
            return None;
        }
        let errno = u32_at(b, 4)? as i32;
        (errno >= 0).then_some(OpenReply { errno })
    }
}

/// The version word of a request (the second word, after the magic): what a worker names when
/// it refuses a request of another version.
pub fn version_of(b: &[u8]) -> Option<u32> {
    u32_at(b, 4)
}

/// Shim → worker on an open's socket, with the new channel's worker end attached:
/// `{ magic, version, fd, 0 }`, 16 bytes. `fd` is the number the caller holds the open by (the
/// worker checks it is this open). Answered with one [`CallReply`] on the channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachRequest {
    /// The caller's fd number for this open.
    pub fd: i32,
}

impl AttachRequest {
    /// Size of the message.
    pub const SIZE: usize = 16;

    /// The message bytes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&ATTACH_REQUEST_MAGIC.to_ne_bytes());
        b[4..8].copy_from_slice(&DEV_PROTOCOL_VERSION.to_ne_bytes());
        b[8..12].copy_from_slice(&self.fd.to_ne_bytes());
        b
    }

    /// Decodes a whole message: exactly [`Self::SIZE`] bytes, magic, version, reserved word 0.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE
            || u32_at(b, 0)? != ATTACH_REQUEST_MAGIC
            || u32_at(b, 4)? != DEV_PROTOCOL_VERSION
            || u32_at(b, 12)? != 0
        {
            return None;
        }
        Some(AttachRequest {
            fd: u32_at(b, 8)? as i32,
        })
    }
}

/// What a [`CallRequest`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOp {
    /// `ioctl(fd, cmd, arg)`.
    Ioctl {
        /// The request number.
        cmd: u32,
        /// The argument (an address in the caller, or a value).
        arg: u64,
    },
    /// `mmap(addr, len, prot, flags, fd, offset)`: the host fd to map.
    Mmap {
        /// `length`.
        len: u64,
        /// `prot`.
        prot: i32,
        /// `flags`.
        flags: i32,
        /// `offset`.
        offset: i64,
    },
}

/// Shim → worker on a channel (no fd attached):
/// `{ magic, version, op (1 ioctl, 2 mmap), fd, cmd, 0, arg | len, prot, flags, offset }`,
/// 48 bytes (u32 x6, u64, i32 x2, i64): an ioctl has `cmd` and `arg` and zeroes after; an mmap
/// has `len` where `arg` is and a zero `cmd`. `fd` is the number the caller used (the worker
/// checks it is this open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallRequest {
    /// The caller's fd number for this open.
    pub fd: i32,
    /// The call.
    pub op: CallOp,
}

impl CallRequest {
    /// Size of the message.
    pub const SIZE: usize = 48;

    /// The message bytes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&CALL_REQUEST_MAGIC.to_ne_bytes());
        b[4..8].copy_from_slice(&DEV_PROTOCOL_VERSION.to_ne_bytes());
        b[12..16].copy_from_slice(&self.fd.to_ne_bytes());
        match self.op {
            CallOp::Ioctl { cmd, arg } => {
                b[8..12].copy_from_slice(&1u32.to_ne_bytes());
                b[16..20].copy_from_slice(&cmd.to_ne_bytes());
                b[24..32].copy_from_slice(&arg.to_ne_bytes());
            }
            CallOp::Mmap {
                len,
                prot,
                flags,
                offset,
            } => {
                b[8..12].copy_from_slice(&2u32.to_ne_bytes());
                b[24..32].copy_from_slice(&len.to_ne_bytes());
                b[32..36].copy_from_slice(&prot.to_ne_bytes());
                b[36..40].copy_from_slice(&flags.to_ne_bytes());
                b[40..48].copy_from_slice(&offset.to_ne_bytes());
            }
        }
        b
    }

    /// Decodes a whole message: exactly [`Self::SIZE`] bytes, magic, version, a known op, and
    /// the fields the op does not use zero.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE
            || u32_at(b, 0)? != CALL_REQUEST_MAGIC
            || u32_at(b, 4)? != DEV_PROTOCOL_VERSION
            || u32_at(b, 20)? != 0
        {
            return None;
        }
        let fd = u32_at(b, 12)? as i32;
        let op = match u32_at(b, 8)? {
            1 if b[32..48].iter().all(|&x| x == 0) => CallOp::Ioctl {
                cmd: u32_at(b, 16)?,
                arg: u64_at(b, 24)?,
            },
            2 if u32_at(b, 16)? == 0 => CallOp::Mmap {
                len: u64_at(b, 24)?,
                prot: u32_at(b, 32)? as i32,
                flags: u32_at(b, 36)? as i32,
                offset: u64_at(b, 40)? as i64,
            },
            _ => return None,
        };
        Some(CallRequest { fd, op })
    }
}

/// Worker → shim on a channel: `{ magic, errno, result, flags, offset_adjust }`, 24 bytes;
/// for a successful `mmap`, the host fd attached. `flags` bit 0: [`CallReply::retry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallReply {
    /// 0, or the errno the call fails with.
    pub errno: i32,
    /// The `ioctl`'s non-negative result.
    pub result: i32,
    /// For `mmap`: added to the caller's offset when mapping the attached fd.
    pub offset_adjust: u64,
    /// Not served (the worker was suspended before reading it): attach a new channel and send
    /// the call again.
    pub retry: bool,
}

impl CallReply {
    /// Size of the message.
    pub const SIZE: usize = 24;

    /// A failure with `errno`.
    pub const fn error(errno: i32) -> Self {
        CallReply {
            errno,
            result: 0,
            offset_adjust: 0,
            retry: false,
        }
    }

    /// "Not served: attach a new channel and send again" (errno `EAGAIN` for a shim that
    /// ignored the flag).
    pub const fn retry() -> Self {
        CallReply {
            errno: libc_eagain(),
            result: 0,
            offset_adjust: 0,
            retry: true,
        }
    }

    /// The message bytes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&CALL_REPLY_MAGIC.to_ne_bytes());
        b[4..8].copy_from_slice(&self.errno.to_ne_bytes());
        b[8..12].copy_from_slice(&self.result.to_ne_bytes());
        b[12..16].copy_from_slice(&u32::from(self.retry).to_ne_bytes());
        b[16..24].copy_from_slice(&self.offset_adjust.to_ne_bytes());
        b
    }

    /// Decodes a whole message (errno and result non-negative, no unknown flag).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE || u32_at(b, 0)? != CALL_REPLY_MAGIC {
            return None;
        }
        let errno = u32_at(b, 4)? as i32;
        let result = u32_at(b, 8)? as i32;
        let flags = u32_at(b, 12)?;
        (errno >= 0 && result >= 0 && flags <= 1).then_some(CallReply {
            errno,
            result,
            offset_adjust: u64_at(b, 16)?,
            retry: flags == 1,
        })
    }
}

/// `EAGAIN` on Linux (this crate has no libc).
const fn libc_eagain() -> i32 {
    11
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_node_paths_are_recognised_exactly() {
        assert_eq!(DevNode::from_path(b"/dev/nvidiactl"), Some(DevNode::Ctl));
        assert_eq!(DevNode::from_path(b"/dev/nvidia-uvm"), Some(DevNode::Uvm));
        assert_eq!(DevNode::from_path(b"/dev/nvidia0"), Some(DevNode::Gpu(0)));
        assert_eq!(
            DevNode::from_path(b"/dev/nvidia255"),
            Some(DevNode::Gpu(255))
        );
        for p in [
            &b"/dev/nvidia256"[..],
            b"/dev/nvidia01",
            b"/dev/nvidia",
            b"/dev/nvidia-uvm-tools",
            b"/dev/nvidia-modeset",
            b"dev/nvidiactl",
            b"/dev//nvidiactl",
            b"/dev/nvidia1x",
        ] {
            assert_eq!(DevNode::from_path(p), None, "{p:?}");
        }
        assert_eq!(DevNode::from_name(b"nvidiactl"), Some(DevNode::Ctl));
        assert_eq!(DevNode::from_name(b"nvidia7"), Some(DevNode::Gpu(7)));
        for n in [
            &b"/nvidiactl"[..],
            b"nvidiactl/",
            b"",
            b".",
            b"..",
            b"nvidia-uvm-tools",
        ] {
            assert_eq!(DevNode::from_name(n), None, "{n:?}");
        }
    }

    #[test]
    fn test_codes_and_peer_names_round_trip() {
        for n in [
            DevNode::Ctl,
            DevNode::Uvm,
            DevNode::Gpu(0),
            DevNode::Gpu(255),
        ] {
            assert_eq!(DevNode::from_code(n.code()), Some(n));
            let mut name = OPEN_PEER_PREFIX.to_vec();
            name.extend(format!("{:x}-0123abcd", n.code()).bytes());
            assert_eq!(node_of_peer_name(&name), Some(n));
        }
        assert_eq!(DevNode::from_code(0), None);
        assert_eq!(DevNode::from_code(0x200), None);
        assert_eq!(node_of_peer_name(b"\0nvproxy-open-1"), None, "no dash");
        assert_eq!(node_of_peer_name(b"\0nvproxy-open--x"), None);
        assert_eq!(node_of_peer_name(b"\0nvproxy-open-XY-1"), None);
        assert_eq!(node_of_peer_name(b"\0other-1-2"), None);
    }

    #[test]
    fn test_messages_round_trip() {
        for node in [DevNode::Ctl, DevNode::Uvm, DevNode::Gpu(7)] {
            let r = OpenRequest { node, flags: 0o2 };
            assert_eq!(OpenRequest::decode(&r.encode()), Some(r));
        }
        let o = OpenReply { errno: 2 };
        assert_eq!(OpenReply::decode(&o.encode()), Some(o));
        for op in [
            CallOp::Ioctl {
                cmd: 0xc020_462a,
                arg: 0x7fff_0000_1000,
            },
            CallOp::Mmap {
                len: 4096,
                prot: 3,
                flags: 1,
                offset: -4096,
            },
        ] {
            let c = CallRequest { fd: 5, op };
            assert_eq!(CallRequest::decode(&c.encode()), Some(c));
        }
        let p = CallReply {
            errno: 0,
            result: 3,
            offset_adjust: 1 << 40,
            retry: false,
        };
        assert_eq!(CallReply::decode(&p.encode()), Some(p));
        let r = CallReply::retry();
        assert_eq!(CallReply::decode(&r.encode()), Some(r));
        assert!(r.retry && r.errno == libc::EAGAIN);
        let a = AttachRequest { fd: 9 };
        assert_eq!(AttachRequest::decode(&a.encode()), Some(a));
    }

    #[test]
    fn test_malformed_messages_are_refused() {
        let r = OpenRequest {
            node: DevNode::Ctl,
            flags: 2,
        }
        .encode();
        assert_eq!(OpenRequest::decode(&r[..23]), None);
        let mut bad = r;
        bad[12] = 1; // ctl with an index
        assert_eq!(OpenRequest::decode(&bad), None);
        let mut bad = r;
        bad[8] = 9; // unknown kind
        assert_eq!(OpenRequest::decode(&bad), None);
        let mut bad = r;
        bad[4] = 1; // version 1 (the reply-socket protocol)
        assert_eq!(OpenRequest::decode(&bad), None);
        assert_eq!(version_of(&bad), Some(1));
        let mut gpu = OpenRequest {
            node: DevNode::Gpu(0),
            flags: 0,
        }
        .encode();
        gpu[12..16].copy_from_slice(&MAX_GPU_NODES.to_ne_bytes());
        assert_eq!(OpenRequest::decode(&gpu), None);

        let c = CallRequest {
            fd: 3,
            op: CallOp::Ioctl { cmd: 1, arg: 2 },
        }
        .encode();
        let mut bad = c;
        bad[40] = 1; // an mmap field in an ioctl
        assert_eq!(CallRequest::decode(&bad), None);
        let mut bad = c;
        bad[8] = 3; // unknown op
        assert_eq!(CallRequest::decode(&bad), None);
        assert_eq!(CallRequest::decode(&[c.as_slice(), &[0]].concat()), None);
        let a = AttachRequest { fd: 3 }.encode();
        let mut bad = a;
        bad[12] = 1; // reserved
        assert_eq!(AttachRequest::decode(&bad), None);
        let mut bad = a;
        bad[4] = 1; // version 1
        assert_eq!(AttachRequest::decode(&bad), None);
        assert_eq!(AttachRequest::decode(&a[..15]), None);
        assert_eq!(CallRequest::decode(&a), None, "an attach is no call");
        let mut flags = CallReply::error(0).encode();
        flags[12] = 2; // an unknown flag
        assert_eq!(CallReply::decode(&flags), None);
        let mut neg = CallReply::error(0).encode();
        neg[8..12].copy_from_slice(&(-1i32).to_ne_bytes());
        assert_eq!(CallReply::decode(&neg), None);
    }
}
