//! Access to the calling process's memory.
//!
//! Two transports stand behind this trait: `process_vm_readv`/`writev` on the caller (synchronous),
//! and the CUSE unrestricted-ioctl retry protocol, in which the kernel copies the iovecs the server
//! names and re-sends the ioctl. With the retry transport a handler learns its data a round at a
//! time: a read of bytes not yet delivered fails with [`MemError::Pending`], the transport answers
//! the kernel with a retry that names every region asked for so far, and the handler runs again
//! from the start with more data. So handlers must (1) do all reads and declare all writes
//! ([`ClientMemory::reserve_write`]) before any side effect such as the host ioctl, and (2) be
//! deterministic up to that point. A region that is read and later written back should be
//! asked for with [`ClientMemory::read_for_update`], so that both are asked for in the same
//! round: each level of pointers then costs one round, not two.

use thiserror::Error;

/// Why client memory could not be accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum MemError {
    /// The address range is not mapped in the caller (the driver's `copy_from_user` would fail).
    #[error("bad address in client memory")]
    Fault,
    /// The range is larger than the proxy accepts for this field.
    #[error("client buffer of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// Not available yet: the transport must fetch it in another round (retry transport only).
    #[error("client memory not fetched yet")]
    Pending,
}

/// The caller's memory, as one ioctl sees it.
pub trait ClientMemory {
    /// Reads `len` bytes at `addr` of the caller.
    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError>;
    /// Declares that `len` bytes at `addr` will be written by this call. Must be called for every
    /// later [`ClientMemory::write`] before the call's side effects.
    fn reserve_write(&mut self, addr: u64, len: usize) -> Result<(), MemError>;
    /// Writes `data` at `addr` (inside a reserved range). A transport may buffer the write
    /// until [`ClientMemory::flush`] (and must then make buffered writes before a later read).
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError>;

    /// A duplicate of the caller's file descriptor `fd` (`pidfd_getfd`: the same open file,
    /// with the caller's access mode), for a call that hands the driver the caller's own pages
    /// as a file (OS-descriptor memory, `osdesc.rs`). Default: `EOPNOTSUPP` (a transport that
    /// cannot reach the caller's fd table, such as the retry transport).
    fn client_fd(&mut self, fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
        let _ = fd;
        Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }

    /// Answers the call now with return value `ret`, its writes made (the buffered ones
    /// first), when the transport can: the client goes on while the caller finishes
    /// bookkeeping that does not change the answer. After `true` the answer is final: further
    /// writes reach nothing the client sees as this call's result, and the transport sends no
    /// second answer. `false`: nothing was answered (the transport cannot, or a write faulted;
    /// the fault is reported by [`ClientMemory::flush`] as usual) and the call's return
    /// answers. Default: `false`.
    fn answer_now(&mut self, ret: i32) -> bool {
        let _ = ret;
        false
    }

    /// Makes the writes a transport buffered (so that one ioctl's write-backs cost one
    /// syscall). Called after the last write of a request; a write that faults is reported
    /// here. Default: nothing is buffered.
    fn flush(&mut self) -> Result<(), MemError> {
        Ok(())
    }

    /// Reads `len` bytes at `addr` and declares that they will be written back: [`read`] and
    /// [`reserve_write`] of the same region, both asked for even when the read is not
    /// available yet (with the retry transport, one round fetches the bytes and prepares the
    /// write-back). The read's error comes first.
    ///
    /// [`read`]: ClientMemory::read
    /// [`reserve_write`]: ClientMemory::reserve_write
    fn read_for_update(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
        let data = self.read(addr, len);
        let reserved = self.reserve_write(addr, len);
        let data = data?;
        reserved?;
        Ok(data)
    }

    /// Reads `buf.len()` bytes at `addr` into `buf` (a typed params struct on the handler's
    /// stack): [`read`] without its allocation where the transport can. A short read is
    /// [`MemError::Fault`].
    ///
    /// [`read`]: ClientMemory::read
    fn read_into(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let data = self.read(addr, buf.len())?;
        if data.len() != buf.len() {
            return Err(MemError::Fault);
        }
        buf.copy_from_slice(&data);
        Ok(())
    }

    /// [`read_into`] and [`reserve_write`] of the same region, as [`read_for_update`].
    ///
    /// [`read_into`]: ClientMemory::read_into
    /// [`reserve_write`]: ClientMemory::reserve_write
    /// [`read_for_update`]: ClientMemory::read_for_update
    fn read_for_update_into(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let data = self.read_into(addr, buf);
        let reserved = self.reserve_write(addr, buf.len());
        data?;
        reserved
    }
}
