//! Sparse client memory with the read-once check.

use std::collections::{BTreeMap, HashMap};
use std::io;

use ioctl_proxy::{ClientMemory, MemError};

use crate::rd32;

/// Sparse client memory: mapped regions; everything else faults. With `retry`, reads of bytes
/// not yet "fetched" return `Pending` and are remembered, as the CUSE retry transport does.
#[derive(Default)]
pub struct FakeMem {
    regions: BTreeMap<u64, Vec<u8>>,
    reserved: Vec<(u64, usize)>,
    /// Every read asked for, `(addr, len)`, in order.
    pub reads: Vec<(u64, usize)>,
    /// The longest read asked for.
    pub largest_read: usize,
    retry: bool,
    fetched: Vec<(u64, usize)>,
    wanted: Vec<(u64, usize)>,
    /// Retry rounds ([`FakeMem::fetch`]) so far.
    pub rounds: usize,
    /// Ranges read since [`FakeMem::begin_request`]: a second read of any byte of them panics
    /// (the request path reads each client byte once).
    request_reads: Vec<(u64, usize)>,
    /// `(addr, bytes)`: written at `addr` right after the first read that covers `addr`, as
    /// another tenant thread racing the daemon would.
    flips: Vec<(u64, Vec<u8>)>,
    /// Whether the read-once check is on (from the first `begin_request`).
    checking: bool,
    /// The caller's fds that [`ClientMemory::client_fd`] can duplicate.
    pub files: HashMap<i32, std::fs::File>,
}

impl FakeMem {
    /// Memory with nothing mapped.
    pub fn new() -> Self {
        Self::default()
    }

    /// Memory of the CUSE retry transport: a read of bytes not fetched yet is `Pending`.
    pub fn retrying() -> Self {
        Self {
            retry: true,
            ..Self::default()
        }
    }

    /// Maps `bytes` at `addr`.
    pub fn map(&mut self, addr: u64, bytes: &[u8]) {
        self.regions.insert(addr, bytes.to_vec());
    }

    /// `len` bytes at `addr` (as the test sees them, unchecked); panics where unmapped.
    pub fn get(&self, addr: u64, len: usize) -> Vec<u8> {
        let (base, r) = self.regions.range(..=addr).next_back().unwrap();
        let o = usize::try_from(addr - base).unwrap();
        r[o..o + len].to_vec()
    }

    /// The `u32` at `addr`.
    pub fn u32_at(&self, addr: u64) -> u32 {
        rd32(&self.get(addr, 4), 0)
    }

    /// Starts a new request (one run of a handler): the read-once check starts over.
    pub fn begin_request(&mut self) {
        self.request_reads.clear();
        self.checking = true;
    }

    /// After the first read covering `addr`, `bytes` are written there (a racing thread).
    pub fn flip_after_read(&mut self, addr: u64, bytes: &[u8]) {
        self.flips.push((addr, bytes.to_vec()));
    }

    /// Makes every range asked for so far available (one retry round).
    pub fn fetch(&mut self) {
        self.rounds += 1;
        let w = std::mem::take(&mut self.wanted);
        self.fetched.extend(w);
    }

    fn region(&mut self, addr: u64, len: usize) -> Option<(&mut Vec<u8>, usize)> {
        let (base, r) = self.regions.range_mut(..=addr).next_back()?;
        let o = usize::try_from(addr - base).ok()?;
        (o.checked_add(len)? <= r.len()).then_some((r, o))
    }

    fn covered(list: &[(u64, usize)], addr: u64, len: usize) -> bool {
        list.iter()
            .any(|&(a, l)| a <= addr && addr + len as u64 <= a + l as u64)
    }
}

impl ClientMemory for FakeMem {
    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
        self.reads.push((addr, len));
        self.largest_read = self.largest_read.max(len);
        let end = addr.saturating_add(len as u64);
        if let Some(&(a, l)) = self
            .request_reads
            .iter()
            .find(|&&(a, l)| self.checking && a < end && addr < a + l as u64)
        {
            panic!(
                "client bytes read twice in one request: {len} bytes at {addr:#x} overlap \
                 the earlier read of {l} bytes at {a:#x}"
            );
        }
        self.request_reads.push((addr, len));
        if self.retry && !Self::covered(&self.fetched, addr, len) {
            self.wanted.push((addr, len));
            return Err(MemError::Pending);
        }
        let (r, o) = self.region(addr, len).ok_or(MemError::Fault)?;
        let data = r[o..o + len].to_vec();
        if let Some(i) = self.flips.iter().position(|(a, _)| *a >= addr && *a < end) {
            let (a, bytes) = self.flips.remove(i);
            if let Some((r, o)) = self.region(a, bytes.len()) {
                r[o..o + bytes.len()].copy_from_slice(&bytes);
            }
        }
        Ok(data)
    }

    fn client_fd(&mut self, fd: i32) -> io::Result<std::os::fd::OwnedFd> {
        let f = self
            .files
            .get(&fd)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        Ok(std::os::fd::OwnedFd::from(f.try_clone()?))
    }

    fn reserve_write(&mut self, addr: u64, len: usize) -> Result<(), MemError> {
        self.region(addr, len).ok_or(MemError::Fault)?;
        self.reserved.push((addr, len));
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        assert!(
            Self::covered(&self.reserved, addr, data.len()),
            "write of {} bytes at {addr:#x} was not reserved",
            data.len()
        );
        let (r, o) = self.region(addr, data.len()).ok_or(MemError::Fault)?;
        r[o..o + data.len()].copy_from_slice(data);
        Ok(())
    }
}
