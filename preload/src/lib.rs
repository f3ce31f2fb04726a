//! `libnvproxy_preload.so`, the in-container mmap shim, and the small definitions it shares with
//! the daemon (private ioctls). The mmap interception itself is the UVM/mmap issue's work: today
//! this library intercepts nothing.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

/// nvproxy's private ioctls on its own device nodes.
///
/// They are plain command numbers with a by-value argument (the devices use unrestricted ioctls,
/// where the `_IOC` encoding means nothing to the kernel). The type byte `'n'` keeps them apart
/// from NVIDIA's escapes (type `'F'`) and from the UVM commands (small integers and
/// `0x3000000x`).
pub mod proto {
    /// `ioctl(fd, NVPROXY_IOC_IDENTIFY, secret)`: answered only for the daemon's own threads
    /// with the instance secret; returns the open file's handle (`fh`). Anyone else gets `EPERM`.
    pub const NVPROXY_IOC_IDENTIFY: u32 = (b'n' as u32) << 8 | 0x01;
}

#[cfg(test)]
mod tests {
    use super::proto::*;

    #[test]
    fn test_private_ioctls_do_not_collide_with_nvidia_numbers() {
        // NVIDIA escapes have _IOC_TYPE 'F'; UVM numbers are < 0x100 or 0x3000000x.
        assert_ne!((NVPROXY_IOC_IDENTIFY >> 8) & 0xff, u32::from(b'F'));
        assert!(NVPROXY_IOC_IDENTIFY > 0xff && NVPROXY_IOC_IDENTIFY < 0x3000_0000);
    }
}
