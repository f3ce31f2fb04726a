//! The two transports behind `ioctl_proxy::ClientMemory`.
//!
//! - [`VmMemory`]: `process_vm_readv`/`writev` on the calling thread. One CUSE round trip per
//!   ioctl; needs ptrace rights over the caller (root / `CAP_SYS_PTRACE`, Yama < 3).
//! - [`RetryMemory`]: the CUSE unrestricted-ioctl retry protocol. The kernel copies the regions we
//!   name and sends the ioctl again; each level of pointers costs one more round trip. Needs no
//!   rights over the caller.
//!
//! Retry rounds carry no state of their own, so the device keeps a [`RetryPlan`] per
//! (open file, calling thread) between rounds: the regions asked for in the previous round, in
//! order, which is how the next round's input bytes are cut back into regions. A thread has at
//! most one ioctl in flight, and the first round of every unrestricted ioctl arrives with no data,
//! which starts a fresh plan.

use ioctl_proxy::{ClientMemory, MemError};

use crate::sys;

/// Client memory through `process_vm_readv`/`writev` on thread `tid`.
///
/// Writes are buffered and made together, in order, with one `process_vm_writev` (one remote
/// iovec per write) by [`ClientMemory::flush`] (`ioctl-proxy` calls it after a request's last
/// write, the top-level struct) or [`VmMemory::finish`], which the device calls before it
/// replies; a read makes the buffered writes first, so a handler always reads what it wrote. A write that
/// faults is reported by `finish` (the device answers `EFAULT`, as the driver's
/// `copy_to_user` failure); the writes after it in the buffer are not made, as when each was
/// made on its own and the first failure ended the handler. Buffered writes not finished are
/// made when the value is dropped.
pub struct VmMemory {
    tid: u32,
    /// (address, bytes) of the writes not made yet, in order.
    pending: Vec<(u64, Vec<u8>)>,
}

impl VmMemory {
    /// Memory of the thread that issued the ioctl.
    pub fn new(tid: u32) -> Self {
        VmMemory {
            tid,
            pending: Vec::new(),
        }
    }

    /// Makes the buffered writes, with one `process_vm_writev`. `Fault` if any of them could
    /// not be made (the ones before it were).
    pub fn finish(&mut self) -> Result<(), MemError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let writes = std::mem::take(&mut self.pending);
        write_all(self.tid, &writes).map_err(vm_error)
    }
}

impl Drop for VmMemory {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            tracing::debug!(writes = self.pending.len(), "client writes made at drop");
            let _ = self.finish();
        }
    }
}

/// Writes every `(address, bytes)` of `writes`, in order, with as few `process_vm_writev` calls
/// as the kernel's iovec limit allows (one for any ioctl). Short (a fault part way) is EFAULT.
fn write_all(tid: u32, writes: &[(u64, Vec<u8>)]) -> std::io::Result<()> {
    use nix::sys::uio::{RemoteIoVec, process_vm_writev};
    use std::io::IoSlice;
    /// `UIO_MAXIOV`.
    const MAX_IOV: usize = 1024;
    let pid =
        libc::pid_t::try_from(tid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    let writes: Vec<&(u64, Vec<u8>)> = writes.iter().filter(|(_, d)| !d.is_empty()).collect();
    for chunk in writes.chunks(MAX_IOV) {
        let local: Vec<IoSlice<'_>> = chunk.iter().map(|(_, d)| IoSlice::new(d)).collect();
        let mut remote = Vec::with_capacity(chunk.len());
        for (addr, d) in chunk {
            let base = usize::try_from(*addr)
                .map_err(|_| std::io::Error::from_raw_os_error(libc::EFAULT))?;
            remote.push(RemoteIoVec { base, len: d.len() });
        }
        let want: usize = chunk.iter().map(|(_, d)| d.len()).sum();
        let n = process_vm_writev(nix::unistd::Pid::from_raw(pid), &local, &remote)
            .map_err(std::io::Error::from)?;
        if n != want {
            return Err(std::io::Error::from_raw_os_error(libc::EFAULT));
        }
    }
    Ok(())
}

fn vm_error(e: std::io::Error) -> MemError {
    if e.raw_os_error() != Some(libc::EFAULT) {
        tracing::warn!(error = %e, "process_vm access failed (ptrace rights? caller gone?)");
    }
    MemError::Fault
}

impl ClientMemory for VmMemory {
    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
        // Reads see the writes made before them.
        self.finish()?;
        let mut buf = vec![0u8; len];
        sys::process_vm_read(self.tid, addr, &mut buf).map_err(vm_error)?;
        Ok(buf)
    }

    fn reserve_write(&mut self, _addr: u64, _len: usize) -> Result<(), MemError> {
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        self.pending.push((addr, data.to_vec()));
        Ok(())
    }

    fn flush(&mut self) -> Result<(), MemError> {
        self.finish()
    }
}

/// Regions of client memory named in a retry reply: `reads` become in-iovecs and `writes`
/// out-iovecs, in this order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryPlan {
    /// (address, length) of each input region.
    pub reads: Vec<(u64, usize)>,
    /// (address, length) of each output region.
    pub writes: Vec<(u64, usize)>,
}

impl RetryPlan {
    fn in_len(&self) -> usize {
        self.reads.iter().map(|r| r.1).sum()
    }
    fn out_len(&self) -> usize {
        self.writes.iter().map(|r| r.1).sum()
    }
}

/// The retry round did not match the plan it should continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanMismatch;

/// Client memory of one retry round.
pub struct RetryMemory {
    /// Regions fetched for this round, with their bytes.
    fetched: Vec<(u64, Vec<u8>)>,
    /// The plan this round continues (its writes are the out-iovecs the kernel expects).
    plan: RetryPlan,
    /// Regions asked for but not fetched yet: the next round's additions.
    more: RetryPlan,
    /// The reply to the out-iovecs, laid out as `plan.writes`.
    out: Vec<u8>,
}

fn contains(region: (u64, usize), addr: u64, len: usize) -> Option<usize> {
    let off = addr.checked_sub(region.0)?;
    let off = usize::try_from(off).ok()?;
    (off.checked_add(len)? <= region.1).then_some(off)
}

impl RetryMemory {
    /// Starts a round: `plan` is what the previous round asked for (empty for a first round),
    /// `in_data` and `out_size` what the kernel sent.
    pub fn new(plan: RetryPlan, in_data: &[u8], out_size: u32) -> Result<Self, PlanMismatch> {
        if plan.in_len() != in_data.len() || plan.out_len() != out_size as usize {
            return Err(PlanMismatch);
        }
        let mut fetched = Vec::with_capacity(plan.reads.len());
        let mut at = 0;
        for &(addr, len) in &plan.reads {
            fetched.push((addr, in_data[at..at + len].to_vec()));
            at += len;
        }
        // Output starts as the caller's own bytes where we fetched them, so a partial write
        // never clobbers the rest of an out-iovec with zeros.
        let mut out = vec![0u8; plan.out_len()];
        let mut at = 0;
        for &(addr, len) in &plan.writes {
            if let Some(bytes) = lookup(&fetched, addr, len) {
                out[at..at + len].copy_from_slice(bytes);
            }
            at += len;
        }
        Ok(RetryMemory {
            fetched,
            plan,
            more: RetryPlan::default(),
            out,
        })
    }

    /// Whether the handler asked for regions this round did not have.
    pub fn needs_retry(&self) -> bool {
        !self.more.reads.is_empty() || !self.more.writes.is_empty()
    }

    /// The plan for the next round: everything of this round plus what was missing.
    pub fn next_plan(&self) -> RetryPlan {
        let mut p = self.plan.clone();
        p.reads.extend(self.more.reads.iter().copied());
        p.writes.extend(self.more.writes.iter().copied());
        p
    }

    /// The bytes for the out-iovecs of this round's plan.
    pub fn into_output(self) -> Vec<u8> {
        self.out
    }
}

fn lookup(fetched: &[(u64, Vec<u8>)], addr: u64, len: usize) -> Option<&[u8]> {
    fetched.iter().find_map(|(base, bytes)| {
        let off = contains((*base, bytes.len()), addr, len)?;
        bytes.get(off..off + len)
    })
}

impl ClientMemory for RetryMemory {
    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
        if let Some(bytes) = lookup(&self.fetched, addr, len) {
            return Ok(bytes.to_vec());
        }
        if !self.more.reads.contains(&(addr, len)) {
            self.more.reads.push((addr, len));
        }
        Err(MemError::Pending)
    }

    fn reserve_write(&mut self, addr: u64, len: usize) -> Result<(), MemError> {
        if self
            .plan
            .writes
            .iter()
            .any(|&r| contains(r, addr, len).is_some())
        {
            return Ok(());
        }
        if !self.more.writes.contains(&(addr, len)) {
            self.more.writes.push((addr, len));
            // Fetch the original bytes too, so untouched parts are written back unchanged.
            if lookup(&self.fetched, addr, len).is_none() && !self.more.reads.contains(&(addr, len))
            {
                self.more.reads.push((addr, len));
            }
        }
        Err(MemError::Pending)
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        let mut at = 0;
        for &(base, len) in &self.plan.writes {
            if let Some(off) = contains((base, len), addr, data.len()) {
                self.out[at + off..at + off + data.len()].copy_from_slice(data);
                return Ok(());
            }
            at += len;
        }
        // Writing outside a reserved region is a bug in the handler, not the client's fault.
        tracing::error!(
            addr,
            len = data.len(),
            "write to a region that was not reserved"
        );
        Err(MemError::Fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_first_round_asks_for_the_top_struct() {
        let mut m = RetryMemory::new(RetryPlan::default(), &[], 0).unwrap();
        assert_eq!(m.read(0x1000, 8), Err(MemError::Pending));
        assert!(m.needs_retry());
        assert_eq!(m.next_plan().reads, vec![(0x1000, 8)]);
    }

    #[test]
    fn test_second_round_serves_fetched_bytes_and_asks_for_nested() {
        let plan = RetryPlan {
            reads: vec![(0x1000, 4)],
            writes: vec![],
        };
        let mut m = RetryMemory::new(plan, &[1, 2, 3, 4], 0).unwrap();
        assert_eq!(m.read(0x1001, 2).unwrap(), vec![2, 3]);
        assert_eq!(m.read(0x2000, 16), Err(MemError::Pending));
        assert_eq!(m.next_plan().reads, vec![(0x1000, 4), (0x2000, 16)]);
    }

    #[test]
    fn test_reserve_write_adds_out_and_in_regions() {
        let mut m = RetryMemory::new(RetryPlan::default(), &[], 0).unwrap();
        assert_eq!(m.reserve_write(0x3000, 4), Err(MemError::Pending));
        let p = m.next_plan();
        assert_eq!(p.writes, vec![(0x3000, 4)]);
        assert_eq!(p.reads, vec![(0x3000, 4)]);
    }

    #[test]
    fn test_final_round_output_keeps_unwritten_bytes() {
        let plan = RetryPlan {
            reads: vec![(0x3000, 4)],
            writes: vec![(0x3000, 4)],
        };
        let mut m = RetryMemory::new(plan, &[9, 9, 9, 9], 4).unwrap();
        m.reserve_write(0x3000, 4).unwrap();
        m.write(0x3001, &[7]).unwrap();
        assert!(!m.needs_retry());
        assert_eq!(m.into_output(), vec![9, 7, 9, 9]);
    }

    #[test]
    fn test_round_not_matching_the_plan_is_refused() {
        let plan = RetryPlan {
            reads: vec![(0x1000, 4)],
            writes: vec![],
        };
        assert!(RetryMemory::new(plan, &[1, 2], 0).is_err());
    }

    #[test]
    fn test_read_across_region_end_is_pending_not_overread() {
        let plan = RetryPlan {
            reads: vec![(0x1000, 4)],
            writes: vec![],
        };
        let mut m = RetryMemory::new(plan, &[1, 2, 3, 4], 0).unwrap();
        assert_eq!(m.read(0x1002, 4), Err(MemError::Pending));
    }

    #[test]
    fn test_read_for_update_asks_for_read_and_write_back_in_one_round() {
        let mut m = RetryMemory::new(RetryPlan::default(), &[], 0).unwrap();
        assert_eq!(m.read_for_update(0x1000, 4), Err(MemError::Pending));
        let p = m.next_plan();
        assert_eq!(p.reads, vec![(0x1000, 4)]);
        assert_eq!(p.writes, vec![(0x1000, 4)]);
        // The next round has the bytes and the out-iovec: the nested level is asked for at
        // once, again read and write-back together.
        let mut m = RetryMemory::new(p, &[1, 2, 3, 4], 4).unwrap();
        assert_eq!(m.read_for_update(0x1000, 4).unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(m.read_for_update(0x2000, 8), Err(MemError::Pending));
        let p = m.next_plan();
        assert_eq!(p.reads, vec![(0x1000, 4), (0x2000, 8)]);
        assert_eq!(p.writes, vec![(0x1000, 4), (0x2000, 8)]);
        let mut m = RetryMemory::new(p, &[1, 2, 3, 4, 5, 5, 5, 5, 5, 5, 5, 5], 12).unwrap();
        assert_eq!(m.read_for_update(0x1000, 4).unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(m.read_for_update(0x2000, 8).unwrap(), vec![5; 8]);
        m.write(0x2000, &[6; 8]).unwrap();
        assert!(!m.needs_retry());
        assert_eq!(m.into_output(), [&[1, 2, 3, 4][..], &[6; 8]].concat());
    }

    #[test]
    fn test_vm_writes_are_buffered_until_flush_and_made_in_order() {
        let tid = std::process::id();
        let mut buf = vec![0u8; 64];
        let base = buf.as_mut_ptr() as u64;
        let mut m = VmMemory::new(tid);
        m.write(base, &[1; 8]).unwrap();
        m.write(base + 32, &[2; 8]).unwrap();
        m.write(base + 4, &[3; 2]).unwrap();
        assert_eq!(std::hint::black_box(&buf)[..8], [0; 8], "buffered");
        m.flush().unwrap();
        let b = std::hint::black_box(&buf);
        assert_eq!(b[..8], [1, 1, 1, 1, 3, 3, 1, 1]);
        assert_eq!(b[32..40], [2; 8]);
        // A read makes the buffered writes first.
        m.write(base + 40, &[4; 4]).unwrap();
        assert_eq!(m.read(base + 40, 4).unwrap(), vec![4; 4]);
        // A fault stops the writes at the faulting one; finish reports it.
        m.write(base + 48, &[5; 4]).unwrap();
        m.write(8, &[9; 4]).unwrap();
        m.write(base + 56, &[6; 4]).unwrap();
        assert_eq!(m.finish(), Err(MemError::Fault));
        let b = std::hint::black_box(&buf);
        assert_eq!(b[48..52], [5; 4]);
        assert_eq!(b[56..60], [0; 4]);
        assert_eq!(m.finish(), Ok(()), "nothing left buffered");
    }

    #[test]
    fn test_contains_handles_wrapping_addresses() {
        assert_eq!(contains((u64::MAX - 1, 2), u64::MAX, 1), Some(1));
        assert_eq!(contains((u64::MAX - 1, 2), u64::MAX, 2), None);
        assert_eq!(contains((0x10, 4), 0x0, 1), None);
    }
}
