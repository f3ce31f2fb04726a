//! Access to the calling process's memory.
//!
//! Two transports stand behind this trait: `process_vm_readv`/`writev` on the caller (synchronous),
//! and the CUSE unrestricted-ioctl retry protocol, in which the kernel copies the iovecs the server
//! names and re-sends the ioctl. With the retry transport a handler learns its data a round at a
//! time: a read of bytes not yet delivered fails with [`MemError::Pending`], the transport answers
//! the kernel with a retry that names every region asked for so far, and the handler runs again
//! from the start with more data. So handlers must (1) do all reads and declare all writes
//! ([`ClientMemory::reserve_write`]) before any side effect such as the host ioctl, and (2) be
//! deterministic up to that point.

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
    /// Writes `data` at `addr` (inside a reserved range).
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError>;
}
