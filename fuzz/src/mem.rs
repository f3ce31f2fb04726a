//! The tenant's side of one request: sparse client memory and the fd table.

use std::collections::{BTreeMap, HashMap};

use ioctl_proxy::{ClientMemory, FdError, FdResolver, MemError, OpenId};
use nvproxy_abi::RMAPI_PARAM_COPY_MAX_PARAMS_SIZE;

/// The largest single read or write-reservation the request path may ask for: RM's own bound
/// on copied params (1 MiB), above `NV_ABSOLUTE_MAX_IOCTL_SIZE` (16 KiB) of a top-level
/// struct. "Every length bounded by the table first" means nothing larger is ever asked for.
pub const MAX_ACCESS: usize = RMAPI_PARAM_COPY_MAX_PARAMS_SIZE as usize;

/// Client memory of one request: mapped regions, everything else faults. With `retry`, a
/// read of bytes not fetched yet returns [`MemError::Pending`] and is remembered; `fetch`
/// makes everything asked for so far available (one CUSE retry round).
///
/// Checked on every access (panics, so that the fuzzer reports them):
/// - no client byte is delivered twice in one run of a handler (the read-once rule; a read
///   that faults delivers nothing and is not counted);
/// - every write lies inside a range reserved before (`reserve_write`/`read_for_update`);
/// - no access is larger than [`MAX_ACCESS`];
/// - a run that ends in `Pending` wrote nothing (the host call comes after the last read).
#[derive(Default)]
pub struct FuzzMem {
    regions: BTreeMap<u64, Vec<u8>>,
    reserved: Vec<(u64, usize)>,
    retry: bool,
    fetched: Vec<(u64, usize)>,
    wanted: Vec<(u64, usize)>,
    /// Ranges delivered (or asked for, with the retry transport) in this run.
    run_reads: Vec<(u64, usize)>,
    /// Writes made in this run.
    pub run_writes: usize,
    /// Retry rounds so far.
    pub rounds: usize,
}

impl FuzzMem {
    /// Memory for one request; `retry` selects the CUSE retry transport's behaviour.
    pub fn new(retry: bool) -> Self {
        Self {
            retry,
            ..Self::default()
        }
    }

    /// Maps `bytes` at `addr` (regions never overlap: the harness spaces them).
    pub fn map(&mut self, addr: u64, bytes: Vec<u8>) {
        self.regions.insert(addr, bytes);
    }

    /// The bytes at `addr..addr+len` now (the harness reads results back), if mapped.
    pub fn get(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let (base, r) = self.regions.range(..=addr).next_back()?;
        let o = usize::try_from(addr - base).ok()?;
        r.get(o..o.checked_add(len)?)
    }

    /// Starts a run of the handler: the read-once check starts over.
    pub fn begin_run(&mut self) {
        self.run_reads.clear();
        self.run_writes = 0;
    }

    /// One retry round: everything asked for so far becomes available.
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
        let end = addr.saturating_add(len as u64);
        list.iter()
            .any(|&(a, l)| a <= addr && end <= a.saturating_add(l as u64))
    }

    fn note_read(&mut self, addr: u64, len: usize) {
        let end = addr.saturating_add(len as u64);
        if let Some(&(a, l)) = self
            .run_reads
            .iter()
            .find(|&&(a, l)| len > 0 && l > 0 && a < end && addr < a.saturating_add(l as u64))
        {
            panic!(
                "client bytes read twice in one request: {len} bytes at {addr:#x} overlap the \
                 earlier read of {l} bytes at {a:#x}"
            );
        }
        self.run_reads.push((addr, len));
    }
}

impl ClientMemory for FuzzMem {
    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
        assert!(
            len <= MAX_ACCESS,
            "read of {len} bytes at {addr:#x}: larger than any bound the driver has"
        );
        if self.retry && !Self::covered(&self.fetched, addr, len) {
            self.note_read(addr, len);
            self.wanted.push((addr, len));
            return Err(MemError::Pending);
        }
        if self.region(addr, len).is_none() {
            return Err(MemError::Fault);
        }
        self.note_read(addr, len);
        let (r, o) = self.region(addr, len).expect("checked above");
        Ok(r[o..o + len].to_vec())
    }

    fn reserve_write(&mut self, addr: u64, len: usize) -> Result<(), MemError> {
        assert!(
            len <= MAX_ACCESS,
            "write reservation of {len} bytes at {addr:#x}: larger than any bound"
        );
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
        self.run_writes += 1;
        let (r, o) = self.region(addr, data.len()).ok_or(MemError::Fault)?;
        r[o..o + data.len()].copy_from_slice(data);
        Ok(())
    }
}

/// The fd whose resolution fails with an errno (the calling thread exited mid-request).
pub const ERRNO_FD: i32 = 77;

/// The calling thread's fd table: fd number → open of an instance node.
#[derive(Default)]
pub struct FuzzFds(pub HashMap<i32, OpenId>);

impl FdResolver for FuzzFds {
    fn resolve(&self, fd: i32) -> Result<OpenId, FdError> {
        if fd == ERRNO_FD {
            return Err(FdError::Errno(libc::ESRCH));
        }
        self.0.get(&fd).copied().ok_or(FdError::Foreign)
    }
}
