//! The small protocol between nvproxy's nodes, the in-container mmap shim
//! (`libnvproxy_preload.so`) and the daemon's per-instance mmap socket.
//!
//! CUSE has no `mmap`, so a client's `mmap()` of one of our nodes fails with `ENODEV` in the
//! kernel. The shim turns it into an mmap of a *host* file descriptor:
//!
//! 1. **Recognise the node.** The daemon tells the shim its nodes' device numbers
//!    ([`ENV_NODES`], `maj:min,...`). Only for a character device whose `st_rdev` is in that list
//!    does the shim send [`NVPROXY_IOC_HELLO`]; our nodes answer it with [`NVPROXY_HELLO_MAGIC`].
//!    No private ioctl ever goes to a device that is not in the list.
//! 2. **Ticket.** [`NVPROXY_IOC_MMAP_TICKET`] on the same fd, argument a pointer to
//!    [`MmapTicketArgs`] (the caller's addr, len, prot, flags, offset in; `ticket` out). The
//!    daemon binds the ticket to the instance, the open file, and the calling thread group; it is
//!    single-use and expires after a few seconds.
//! 3. **Redeem.** The shim connects to the instance socket ([`ENV_SOCKET`], default
//!    [`DEFAULT_SOCKET_PATH`]; `SOCK_SEQPACKET`), sends an [`MmapRequest`] and receives an
//!    [`MmapReply`]; when its `errno` is 0 the reply carries exactly one fd (`SCM_RIGHTS`), to be
//!    mapped at the caller's offset plus [`MmapReply::offset_adjust`]. A refused ticket (unknown,
//!    used, expired, other instance, or a peer whose pid is not the ticket's thread group) gets
//!    no reply at all: the daemon closes the connection.
//!
//! [`NVPROXY_IOC_IDENTIFY`] is the daemon's own fd-identity ioctl; clients get `EPERM` for it.
//!
//! All ioctls are plain numbers with type byte `'n'` (the nodes use unrestricted CUSE ioctls,
//! where the `_IOC` direction and size bits mean nothing to the kernel). All integers travel in
//! native byte order: both ends run on the same machine.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod socket;

/// A private ioctl number: type byte `'n'`, number `nr`, no direction or size bits.
pub const fn private_ioctl(nr: u8) -> u32 {
    (b'n' as u32) << 8 | nr as u32
}

/// `ioctl(fd, NVPROXY_IOC_IDENTIFY, secret)`: answered only for the daemon's own threads with the
/// instance secret; returns the open file's handle (`fh`). Anyone else gets `EPERM`.
pub const NVPROXY_IOC_IDENTIFY: u32 = private_ioctl(0x01);

/// `ioctl(fd, NVPROXY_IOC_HELLO, 0)`: any caller; our nodes return [`NVPROXY_HELLO_MAGIC`]. The
/// shim sends it only to character devices whose number the daemon listed ([`ENV_NODES`]).
pub const NVPROXY_IOC_HELLO: u32 = private_ioctl(0x02);

/// What [`NVPROXY_IOC_HELLO`] returns on our nodes (`"NvPx"`, positive as an `int`).
pub const NVPROXY_HELLO_MAGIC: i32 = 0x4e76_5078;
const _: () = assert!(NVPROXY_HELLO_MAGIC > 0, "ioctl results are non-negative");

/// `ioctl(fd, NVPROXY_IOC_MMAP_TICKET, &mut MmapTicketArgs)`: returns 0 and fills
/// [`MmapTicketArgs::ticket`], or fails with an errno (`EAGAIN`: too many tickets outstanding;
/// `EFAULT`: bad pointer).
pub const NVPROXY_IOC_MMAP_TICKET: u32 = private_ioctl(0x03);

/// The argument of [`NVPROXY_IOC_MMAP_TICKET`]: the `mmap()` call being proxied (the daemon
/// records it with the ticket) and the ticket it returns. 40 bytes, native endian.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MmapTicketArgs {
    /// `addr` as the caller passed it.
    pub addr: u64,
    /// `length`.
    pub len: u64,
    /// `prot`.
    pub prot: i32,
    /// `flags`.
    pub flags: i32,
    /// `offset`.
    pub offset: i64,
    /// Out: the ticket.
    pub ticket: u64,
}

const _: () = assert!(size_of::<MmapTicketArgs>() == MmapTicketArgs::SIZE);
const _: () =
    assert!(std::mem::offset_of!(MmapTicketArgs, ticket) == MmapTicketArgs::TICKET_OFFSET);

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl MmapTicketArgs {
    /// Size in bytes.
    pub const SIZE: usize = 40;
    /// Offset of [`MmapTicketArgs::ticket`] (the only field the daemon writes).
    pub const TICKET_OFFSET: usize = 32;

    /// The bytes as the C layout has them.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..8].copy_from_slice(&self.addr.to_ne_bytes());
        b[8..16].copy_from_slice(&self.len.to_ne_bytes());
        b[16..20].copy_from_slice(&self.prot.to_ne_bytes());
        b[20..24].copy_from_slice(&self.flags.to_ne_bytes());
        b[24..32].copy_from_slice(&self.offset.to_ne_bytes());
        b[32..40].copy_from_slice(&self.ticket.to_ne_bytes());
        b
    }

    /// Decodes the first [`Self::SIZE`] bytes; `None` if there are fewer.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        Some(MmapTicketArgs {
            addr: u64_at(b, 0)?,
            len: u64_at(b, 8)?,
            prot: u32_at(b, 16)? as i32,
            flags: u32_at(b, 20)? as i32,
            offset: u64_at(b, 24)? as i64,
            ticket: u64_at(b, 32)?,
        })
    }
}

/// `ioctl(fd, NVPROXY_IOC_ALLOC_OS_DESCRIPTOR, &OsDescriptorArgs)` on a GPU node: the
/// `NV_ESC_RM_ALLOC_MEMORY` of `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR` whose params are at
/// [`OsDescriptorArgs::params`], with the pages at `pMemory` being a shared mapping of the
/// caller's fd [`OsDescriptorArgs::memfd`] from offset 0 (the driver pins the pages at `pMemory`
/// of the *calling* process, which is the daemon, so the plain escape is refused). The daemon
/// takes its own duplicate of the fd (`pidfd_getfd`: the caller's access mode stays) and
/// answers as the escape does (status in the params; the ioctl's own errno for the fd).
pub const NVPROXY_IOC_ALLOC_OS_DESCRIPTOR: u32 = private_ioctl(0x04);

/// The argument of [`NVPROXY_IOC_ALLOC_OS_DESCRIPTOR`]. 16 bytes, native endian.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OsDescriptorArgs {
    /// Address of the caller's `nv_ioctl_nvos02_parameters_with_fd` (read and written as by
    /// the escape).
    pub params: u64,
    /// The caller's fd whose first `limit + 1` bytes are mapped shared at `pMemory`.
    pub memfd: i32,
    /// Must be 0.
    pub reserved: u32,
}

const _: () = assert!(size_of::<OsDescriptorArgs>() == OsDescriptorArgs::SIZE);

impl OsDescriptorArgs {
    /// Size in bytes.
    pub const SIZE: usize = 16;

    /// The bytes as the C layout has them.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..8].copy_from_slice(&self.params.to_ne_bytes());
        b[8..12].copy_from_slice(&self.memfd.to_ne_bytes());
        b[12..16].copy_from_slice(&self.reserved.to_ne_bytes());
        b
    }

    /// Decodes the first [`Self::SIZE`] bytes; `None` if there are fewer.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        Some(OsDescriptorArgs {
            params: u64_at(b, 0)?,
            memfd: u32_at(b, 8)? as i32,
            reserved: u32_at(b, 12)?,
        })
    }
}

/// `"NVMQ"`: first word of an [`MmapRequest`].
pub const MMAP_REQUEST_MAGIC: u32 = u32::from_be_bytes(*b"NVMQ");
/// `"NVMP"`: first word of an [`MmapReply`].
pub const MMAP_REPLY_MAGIC: u32 = u32::from_be_bytes(*b"NVMP");
/// The socket protocol's version (second word of a request).
pub const MMAP_PROTOCOL_VERSION: u32 = 1;

/// Shim → daemon, one `SOCK_SEQPACKET` message of [`MmapRequest::SIZE`] bytes:
/// `{ magic: u32, version: u32, ticket: u64 }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmapRequest {
    /// The ticket from [`NVPROXY_IOC_MMAP_TICKET`].
    pub ticket: u64,
}

impl MmapRequest {
    /// Size of the message.
    pub const SIZE: usize = 16;

    /// The message bytes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&MMAP_REQUEST_MAGIC.to_ne_bytes());
        b[4..8].copy_from_slice(&MMAP_PROTOCOL_VERSION.to_ne_bytes());
        b[8..16].copy_from_slice(&self.ticket.to_ne_bytes());
        b
    }

    /// Decodes a whole message: exactly [`Self::SIZE`] bytes, the right magic and version.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE
            || u32_at(b, 0)? != MMAP_REQUEST_MAGIC
            || u32_at(b, 4)? != MMAP_PROTOCOL_VERSION
        {
            return None;
        }
        Some(MmapRequest {
            ticket: u64_at(b, 8)?,
        })
    }
}

/// Daemon → shim, one message of [`MmapReply::SIZE`] bytes:
/// `{ magic: u32, errno: i32, offset_adjust: u64 }`, with one fd attached (`SCM_RIGHTS`)
/// exactly when `errno` is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmapReply {
    /// 0: the fd is attached. Otherwise the errno the mmap fails with (the driver's answer for
    /// this open file, e.g. `ENODEV` when it has nothing to map).
    pub errno: i32,
    /// Added to the caller's offset when mapping the fd.
    pub offset_adjust: u64,
}

impl MmapReply {
    /// Size of the message.
    pub const SIZE: usize = 16;

    /// The message bytes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&MMAP_REPLY_MAGIC.to_ne_bytes());
        b[4..8].copy_from_slice(&self.errno.to_ne_bytes());
        b[8..16].copy_from_slice(&self.offset_adjust.to_ne_bytes());
        b
    }

    /// Decodes a whole message: exactly [`Self::SIZE`] bytes with the right magic, and a
    /// non-negative errno.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE || u32_at(b, 0)? != MMAP_REPLY_MAGIC {
            return None;
        }
        let errno = u32_at(b, 4)? as i32;
        if errno < 0 {
            return None;
        }
        Some(MmapReply {
            errno,
            offset_adjust: u64_at(b, 8)?,
        })
    }
}

/// Where the shim finds the instance socket when [`ENV_SOCKET`] is unset. `nvproxy exec`/`run`
/// bind-mount the instance's socket here inside the command's mount namespace.
pub const DEFAULT_SOCKET_PATH: &str = "/run/nvproxy/mmap.sock";
/// Environment variable naming the socket (absolute path, at most 107 bytes).
pub const ENV_SOCKET: &str = "NVPROXY_SOCKET";
/// Environment variable listing our nodes' device numbers: `maj:min[,maj:min...]` (decimal).
pub const ENV_NODES: &str = "NVPROXY_NODES";
/// The most entries of [`ENV_NODES`] the shim reads.
pub const MAX_NODES: usize = 64;

/// `makedev(3)` (glibc's encoding of `dev_t`).
pub const fn makedev(major: u32, minor: u32) -> u64 {
    let (major, minor) = (major as u64, minor as u64);
    ((major & 0xffff_f000) << 32)
        | ((major & 0x0000_0fff) << 8)
        | ((minor & 0xffff_ff00) << 12)
        | (minor & 0x0000_00ff)
}

/// `major(3)`.
pub const fn major(dev: u64) -> u32 {
    ((dev >> 32) & 0xffff_f000) as u32 | ((dev >> 8) & 0x0000_0fff) as u32
}

/// `minor(3)`.
pub const fn minor(dev: u64) -> u32 {
    ((dev >> 12) & 0xffff_ff00) as u32 | (dev & 0x0000_00ff) as u32
}

fn parse_u32(b: &[u8]) -> Option<u32> {
    if b.is_empty() || b.len() > 10 {
        return None;
    }
    let mut v: u64 = 0;
    for &c in b {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u64::from(c - b'0');
    }
    u32::try_from(v).ok()
}

/// Parses one `maj:min` entry of [`ENV_NODES`] into a `dev_t`.
pub fn parse_dev(entry: &[u8]) -> Option<u64> {
    let colon = entry.iter().position(|&c| c == b':')?;
    let major = parse_u32(&entry[..colon])?;
    let minor = parse_u32(&entry[colon + 1..])?;
    Some(makedev(major, minor))
}

/// The entries of an [`ENV_NODES`] value, in order; a malformed entry yields `None` (the shim
/// skips it). Allocates nothing.
pub fn node_list(value: &[u8]) -> impl Iterator<Item = Option<u64>> + '_ {
    value
        .split(|&c| c == b',')
        .filter(|e| !e.is_empty())
        .map(parse_dev)
}

/// The `maj:min` text of one device number (the daemon's side of [`ENV_NODES`]).
pub fn format_dev(dev: u64) -> String {
    format!("{}:{}", major(dev), minor(dev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_private_ioctls_do_not_collide_with_nvidia_numbers() {
        // NVIDIA escapes have _IOC_TYPE 'F'; UVM numbers are < 0x100 or 0x3000000x.
        for cmd in [
            NVPROXY_IOC_IDENTIFY,
            NVPROXY_IOC_HELLO,
            NVPROXY_IOC_MMAP_TICKET,
            NVPROXY_IOC_ALLOC_OS_DESCRIPTOR,
        ] {
            assert_eq!((cmd >> 8) & 0xff, u32::from(b'n'));
            assert!(cmd > 0xff && cmd < 0x3000_0000, "{cmd:#x}");
        }
    }

    #[test]
    fn test_private_ioctl_numbers_are_fixed() {
        assert_eq!(
            (
                NVPROXY_IOC_IDENTIFY,
                NVPROXY_IOC_HELLO,
                NVPROXY_IOC_MMAP_TICKET
            ),
            (0x6e01, 0x6e02, 0x6e03)
        );
    }

    #[test]
    fn test_private_ioctls_are_distinct() {
        assert_ne!(NVPROXY_IOC_HELLO, NVPROXY_IOC_IDENTIFY);
        assert_ne!(NVPROXY_IOC_MMAP_TICKET, NVPROXY_IOC_IDENTIFY);
        assert_ne!(NVPROXY_IOC_MMAP_TICKET, NVPROXY_IOC_HELLO);
    }

    #[test]
    fn test_os_descriptor_ioctl_number_and_args() {
        assert_eq!(NVPROXY_IOC_ALLOC_OS_DESCRIPTOR, 0x6e04);
        let a = OsDescriptorArgs {
            params: 0x7ffd_0000_1230,
            memfd: 7,
            reserved: 0,
        };
        let b = a.to_bytes();
        assert_eq!(b[0..8], 0x7ffd_0000_1230u64.to_ne_bytes());
        assert_eq!(b[8..12], 7i32.to_ne_bytes());
        assert_eq!(OsDescriptorArgs::from_bytes(&b), Some(a));
        assert_eq!(OsDescriptorArgs::from_bytes(&b[..15]), None);
    }

    #[test]
    fn test_ticket_args_round_trip() {
        let a = MmapTicketArgs {
            addr: 0x7f00_0000_1000,
            len: 2 << 20,
            prot: 3,
            flags: 0x11,
            offset: -4096,
            ticket: 0xdead_beef_f00d_cafe,
        };
        assert_eq!(MmapTicketArgs::from_bytes(&a.to_bytes()), Some(a));
    }

    #[test]
    fn test_ticket_args_ticket_sits_at_its_offset() {
        let a = MmapTicketArgs {
            ticket: 0x0102_0304_0506_0708,
            ..Default::default()
        };
        let b = a.to_bytes();
        assert_eq!(
            &b[MmapTicketArgs::TICKET_OFFSET..],
            &0x0102_0304_0506_0708u64.to_ne_bytes()
        );
    }

    #[test]
    fn test_ticket_args_short_buffer_is_none() {
        assert_eq!(MmapTicketArgs::from_bytes(&[0u8; 39]), None);
    }

    #[test]
    fn test_request_round_trip() {
        let r = MmapRequest { ticket: 42 };
        assert_eq!(MmapRequest::decode(&r.encode()), Some(r));
    }

    #[test]
    fn test_request_bytes_are_magic_version_ticket() {
        let b = MmapRequest { ticket: 7 }.encode();
        assert_eq!(&b[0..4], &MMAP_REQUEST_MAGIC.to_ne_bytes());
        assert_eq!(&b[4..8], &1u32.to_ne_bytes());
        assert_eq!(&b[8..16], &7u64.to_ne_bytes());
    }

    #[test]
    fn test_request_wrong_magic_version_or_length_is_refused() {
        let good = MmapRequest { ticket: 7 }.encode();
        let mut bad_magic = good;
        bad_magic[0] ^= 1;
        let mut bad_version = good;
        bad_version[4] = 2;
        assert_eq!(MmapRequest::decode(&bad_magic), None);
        assert_eq!(MmapRequest::decode(&bad_version), None);
        assert_eq!(MmapRequest::decode(&good[..15]), None);
        assert_eq!(MmapRequest::decode(&[good.as_slice(), &[0]].concat()), None);
    }

    #[test]
    fn test_reply_round_trip() {
        let r = MmapReply {
            errno: 19,
            offset_adjust: 1 << 40,
        };
        assert_eq!(MmapReply::decode(&r.encode()), Some(r));
    }

    #[test]
    fn test_reply_negative_errno_or_wrong_magic_is_refused() {
        let mut neg = MmapReply {
            errno: 0,
            offset_adjust: 0,
        }
        .encode();
        neg[4..8].copy_from_slice(&(-1i32).to_ne_bytes());
        let mut magic = MmapReply {
            errno: 0,
            offset_adjust: 0,
        }
        .encode();
        magic[0..4].copy_from_slice(&MMAP_REQUEST_MAGIC.to_ne_bytes());
        assert_eq!(MmapReply::decode(&neg), None);
        assert_eq!(MmapReply::decode(&magic), None);
    }

    #[test]
    fn test_makedev_matches_libc() {
        for (ma, mi) in [
            (195, 255),
            (244, 0),
            (10, 203),
            (4095, 1 << 19),
            (0x0001_2345, 0xabcd),
        ] {
            let dev = makedev(ma, mi);
            assert_eq!(dev, libc::makedev(ma, mi), "{ma}:{mi}");
            assert_eq!(
                (major(dev), minor(dev)),
                (libc::major(dev), libc::minor(dev))
            );
            assert_eq!((major(dev), minor(dev)), (ma, mi));
        }
    }

    #[test]
    fn test_node_list_parses_entries_in_order() {
        let got: Vec<_> = node_list(b"244:0,243:1").collect();
        assert_eq!(got, vec![Some(makedev(244, 0)), Some(makedev(243, 1))]);
    }

    #[test]
    fn test_node_list_marks_malformed_entries() {
        let got: Vec<_> = node_list(b"244:0,x:1,244,:3,1:99999999999,,5:6").collect();
        assert_eq!(
            got,
            vec![
                Some(makedev(244, 0)),
                None,
                None,
                None,
                None,
                Some(makedev(5, 6))
            ]
        );
    }

    #[test]
    fn test_format_dev_parses_back() {
        let dev = makedev(511, 70000);
        assert_eq!(parse_dev(format_dev(dev).as_bytes()), Some(dev));
    }
}
