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

use cuse_dev::{ClientWaits, EarlyAnswer, ReplyData};
use ioctl_proxy::{ClientMemory, MemError};
use smallvec::SmallVec;

use crate::ratelimit::tenant_log;
use crate::sys;

/// Client memory through `process_vm_readv`/`writev` on thread `tid`.
///
/// **The window.** On the frontend nodes the process-vm transport uses restricted CUSE ioctls
/// (`device.rs`, `unrestricted_ioctls`): for an `_IOWR` command the kernel copies the `_IOC_SIZE` bytes at
/// `arg` (the top-level params) into the request and copies the reply's data back to `arg`,
/// as `nvidia_ioctl` copies them in and out. [`VmMemory::for_ioctl`] keeps those bytes as a
/// window: reads inside it need no syscall, writes inside it go into the reply
/// ([`VmMemory::reply_data`]).
///
/// **Writes** outside the window are buffered and made together, in order, with one
/// `process_vm_writev` (one remote iovec per write) by [`ClientMemory::flush`] (`ioctl-proxy`
/// calls it after a request's last write, the top-level struct) or [`VmMemory::finish`],
/// which the device calls before it replies. A read makes the buffered writes first, so a
/// handler always reads what it wrote. A write that faults is reported by `finish` (the device
/// answers `EFAULT`, as the driver's `copy_to_user` failure); the writes after it are not made,
/// as when each was made on its own and the first failure ended the handler. Buffered writes
/// not finished are made when the value is dropped.
pub struct VmMemory {
    tid: u32,
    /// Deadlines on the syscalls, whose page faults the client controls (cuse-dev
    /// `watchdog.rs`): past one the request has been answered and every further access fails.
    waits: ClientWaits,
    /// (address, bytes) of the writes not made yet, in order.
    pending: Pending,
    window: Option<Window>,
    /// How [`ClientMemory::answer_now`] answers (a CUSE request's early answer), if it can.
    early: Option<EarlyAnswer>,
    /// The call was answered early: later writes are refused.
    answered: bool,
    /// Buffered writes that faulted while answering early, for [`VmMemory::finish`] to report.
    faulted: bool,
}

/// Buffered writes: an ioctl makes a few small ones (nested params, outputs), kept inline so
/// the request path does not allocate for them.
type Pending = SmallVec<[(u64, WriteBytes); 4]>;
type WriteBytes = SmallVec<[u8; 64]>;

/// The top-level params copied in by the kernel, with the writes made to them since.
struct Window {
    addr: u64,
    bytes: ReplyData,
    /// Written to: the reply carries the bytes back.
    dirty: bool,
}

impl Window {
    fn offset(&self, addr: u64, len: usize) -> Option<usize> {
        let off = usize::try_from(addr.checked_sub(self.addr)?).ok()?;
        (off.checked_add(len)? <= self.bytes.len()).then_some(off)
    }

    fn overlaps(&self, addr: u64, len: usize) -> bool {
        let end = addr.saturating_add(len as u64);
        let wend = self.addr.saturating_add(self.bytes.len() as u64);
        len > 0 && addr < wend && self.addr < end
    }

    /// Applies the part of a write at `addr` that falls inside the window (one copy of the
    /// intersection; a write past the end of the address space ends there).
    fn apply(&mut self, addr: u64, data: &[u8]) {
        let start = addr.max(self.addr);
        let end = addr
            .saturating_add(data.len() as u64)
            .min(self.addr.saturating_add(self.bytes.len() as u64));
        if start >= end {
            return;
        }
        let (Ok(at), Ok(from), Ok(n)) = (
            usize::try_from(start - self.addr),
            usize::try_from(start - addr),
            usize::try_from(end - start),
        ) else {
            return;
        };
        if let (Some(dst), Some(src)) = (self.bytes.get_mut(at..at + n), data.get(from..from + n)) {
            dst.copy_from_slice(src);
            self.dirty = true;
        }
    }
}

impl VmMemory {
    /// Memory of the thread that issued the ioctl; every syscall on it is bounded by `waits`
    /// (the request's client-wait deadline; `ClientWaits::unbounded` for none).
    pub fn new(tid: u32, waits: ClientWaits) -> Self {
        VmMemory {
            tid,
            waits,
            pending: SmallVec::new(),
            window: None,
            early: None,
            answered: false,
            faulted: false,
        }
    }

    /// Memory of the thread that issued ioctl `arg`, with the bytes the kernel copied in for a
    /// restricted ioctl (`in_data`) as the window when they are also what it copies back
    /// (`out_size` equal: an `_IOWR` command). Otherwise no window: everything through the
    /// syscalls, as [`VmMemory::new`].
    /// `early`: how to answer the request before the handler returns (`answer_now`).
    pub fn for_ioctl(
        tid: u32,
        arg: u64,
        in_data: &[u8],
        out_size: u32,
        waits: ClientWaits,
        early: Option<EarlyAnswer>,
    ) -> Self {
        // Built in place (a `new` then a change would copy the struct's inline write list).
        let window =
            (!in_data.is_empty() && usize::try_from(out_size) == Ok(in_data.len())).then(|| {
                Window {
                    addr: arg,
                    bytes: ReplyData::from_slice(in_data),
                    dirty: false,
                }
            });
        VmMemory {
            tid,
            waits,
            pending: SmallVec::new(),
            window,
            early,
            answered: false,
            faulted: false,
        }
    }

    /// Makes the buffered writes, with one `process_vm_writev`. `Fault` if any of them could
    /// not be made (the ones before it were).
    #[inline]
    pub fn finish(&mut self) -> Result<(), MemError> {
        // Most calls find nothing buffered (before each read, after the request's flush):
        // inline, they cost a test, not a call.
        if self.pending.is_empty() {
            if self.faulted {
                self.faulted = false;
                return Err(MemError::Fault);
            }
            return Ok(());
        }
        self.write_pending()
    }

    fn write_pending(&mut self) -> Result<(), MemError> {
        // Written in place and cleared after (taking the list would copy its inline storage).
        if self.waits.fired() {
            self.pending.clear();
            return Err(MemError::Fault);
        }
        let wait = self.waits.arm();
        let r = write_all(self.tid, &self.pending).map_err(vm_error);
        self.pending.clear();
        if wait.fired() {
            return Err(MemError::Fault);
        }
        r
    }

    /// What the reply must carry for the kernel to copy back to `arg`: the window when it was
    /// written to, else nothing (the kernel then copies nothing). Call after [`finish`]
    /// succeeded, for a successful ioctl.
    ///
    /// [`finish`]: VmMemory::finish
    pub fn reply_data(&mut self) -> ReplyData {
        match self.window.take() {
            Some(w) if w.dirty => w.bytes,
            _ => ReplyData::new(),
        }
    }

    /// For an ioctl that fails with an errno: the kernel copies nothing back then, so a window
    /// that was written to is written with `process_vm_writev` (as the driver copies the params
    /// back on every error but `EFAULT`), after the buffered writes.
    pub fn finish_failed(&mut self) {
        if let Some(w) = self.window.take().filter(|w| w.dirty) {
            self.pending.push((w.addr, SmallVec::from_slice(&w.bytes)));
        }
        let _ = self.finish();
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
fn write_all(tid: u32, writes: &[(u64, WriteBytes)]) -> std::io::Result<()> {
    use nix::sys::uio::RemoteIoVec;
    use std::io::IoSlice;
    /// `UIO_MAXIOV`.
    const MAX_IOV: usize = 1024;
    /// An ioctl's writes fit here: no allocation.
    const SMALL: usize = 8;
    let pid = nix::unistd::Pid::from_raw(
        libc::pid_t::try_from(tid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?,
    );
    let remote_of = |(addr, d): &(u64, WriteBytes)| {
        usize::try_from(*addr)
            .map(|base| RemoteIoVec { base, len: d.len() })
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EFAULT))
    };
    let one = |local: &[IoSlice<'_>], remote: &[RemoteIoVec]| {
        let want: usize = remote.iter().map(|r| r.len).sum();
        let n =
            nix::sys::uio::process_vm_writev(pid, local, remote).map_err(std::io::Error::from)?;
        if n != want {
            return Err(std::io::Error::from_raw_os_error(libc::EFAULT));
        }
        Ok(())
    };
    if writes.len() <= SMALL {
        let mut local = [IoSlice::new(&[]); SMALL];
        let mut remote = [RemoteIoVec { base: 0, len: 0 }; SMALL];
        for (i, w) in writes.iter().enumerate() {
            local[i] = IoSlice::new(&w.1);
            remote[i] = remote_of(w)?;
        }
        return one(&local[..writes.len()], &remote[..writes.len()]);
    }
    for chunk in writes.chunks(MAX_IOV) {
        let local: Vec<IoSlice<'_>> = chunk.iter().map(|(_, d)| IoSlice::new(d)).collect();
        let remote = chunk
            .iter()
            .map(remote_of)
            .collect::<std::io::Result<Vec<_>>>()?;
        one(&local, &remote)?;
    }
    Ok(())
}

fn vm_error(e: std::io::Error) -> MemError {
    if e.raw_os_error() != Some(libc::EFAULT) {
        // No instance at hand: the worker's own bucket (one instance per worker).
        tenant_log!(warn, "", error = %e, "process_vm access failed (ptrace rights? caller gone?)");
    }
    MemError::Fault
}

impl ClientMemory for VmMemory {
    /// `pidfd_getfd` of the calling thread's fd (the same open file, the caller's access mode).
    fn client_fd(&mut self, fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd;
        let pidfd = sys::pidfd_open_thread(self.tid)?;
        sys::pidfd_getfd(pidfd.as_fd(), fd)
    }

    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
        let mut buf = vec![0u8; len];
        self.read_into(addr, &mut buf)?;
        Ok(buf)
    }

    fn read_into(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let len = buf.len();
        if let Some(w) = &self.window
            && let Some(off) = w.offset(addr, len)
        {
            buf.copy_from_slice(&w.bytes[off..off + len]);
            return Ok(());
        }
        // Reads see the writes made before them: the buffered ones, and the window's when the
        // read overlaps it.
        if let Some(w) = self
            .window
            .as_ref()
            .filter(|w| w.dirty && w.overlaps(addr, len))
        {
            self.pending.push((w.addr, SmallVec::from_slice(&w.bytes)));
        }
        self.finish()?;
        if self.waits.fired() {
            return Err(MemError::Fault);
        }
        let wait = self.waits.arm();
        let r = sys::process_vm_read(self.tid, addr, buf).map_err(vm_error);
        if wait.fired() {
            // Answered EFAULT meanwhile: abandon the request (no side effect follows a failed
            // read).
            return Err(MemError::Fault);
        }
        r
    }

    fn reserve_write(&mut self, _addr: u64, _len: usize) -> Result<(), MemError> {
        Ok(())
    }

    /// A read; nothing to reserve (writes go out with the syscall or the reply).
    fn read_for_update_into(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.read_into(addr, buf)
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        if data.is_empty() {
            return Ok(());
        }
        if self.answered {
            // The client went on with the answer: nothing of this call may change its memory
            // any more (a bug in the caller, not the client's doing).
            debug_assert!(false, "a client write after the early answer");
            return Err(MemError::Fault);
        }
        if let Some(w) = &mut self.window {
            // The reply is copied back last, so it must carry every write to the window's
            // bytes; a write only partly inside goes out through the syscall too.
            let inside = w.offset(addr, data.len()).is_some();
            w.apply(addr, data);
            if inside {
                return Ok(());
            }
        }
        self.pending.push((addr, SmallVec::from_slice(data)));
        Ok(())
    }

    fn flush(&mut self) -> Result<(), MemError> {
        self.finish()
    }

    /// The buffered writes, then the reply with the window's bytes, sent now.
    fn answer_now(&mut self, ret: i32) -> bool {
        if self.early.is_none() {
            return false;
        }
        if !self.pending.is_empty() && self.write_pending().is_err() {
            // Reported by `finish`, as without an early answer (the driver's EFAULT).
            self.faulted = true;
            return false;
        }
        let data: &[u8] = match &self.window {
            Some(w) if w.dirty => &w.bytes,
            _ => &[],
        };
        if !self.early.as_ref().is_some_and(|e| e.ioctl(ret, data)) {
            return false;
        }
        self.early = None;
        self.window = None;
        self.answered = true;
        true
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
    /// The plan a retry round's regions (kept by cuse-dev between rounds) stand for.
    pub fn from_round(round: &cuse_dev::RetryRound) -> Self {
        let regions = |v: &[cuse_dev::IoVec]| {
            v.iter()
                .map(|i| (i.base, usize::try_from(i.len).unwrap_or(usize::MAX)))
                .collect()
        };
        RetryPlan {
            reads: regions(&round.in_iovs),
            writes: regions(&round.out_iovs),
        }
    }

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
    use std::time::Duration;

    /// Issue 9 finding 6, shown with a real `userfaultfd`: a `process_vm_readv` of a page whose
    /// missing-page fault the "tenant" does not resolve blocks the reading thread (and no signal
    /// gets it out); the client-wait deadline fires meanwhile (the session answers the request
    /// EFAULT then), and when the fault finally resolves the read fails instead of going on.
    #[test]
    fn test_a_read_of_a_userfaultfd_page_is_bounded_by_the_client_wait_deadline() {
        let map = sys::AnonMap::new(4096).unwrap();
        let uffd = sys::uffd_register_missing(map.addr(), 4096)
            .expect("userfaultfd (the tests run as root; the kernel needs CONFIG_USERFAULTFD)");
        let waits = ClientWaits::standalone(Duration::from_millis(200));
        let addr = map.addr();
        let tid = std::process::id();
        let w = waits.clone();
        let reader = std::thread::spawn(move || {
            let mut mem = VmMemory::new(tid, w);
            let t = std::time::Instant::now();
            (mem.read(addr + 64, 8), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(600));
        assert!(
            !reader.is_finished(),
            "the read did not block on the unresolved fault"
        );
        assert!(waits.fired(), "the deadline did not fire");
        assert_eq!(waits.fired_count(), 1);
        use std::os::fd::AsFd;
        sys::uffd_zeropage(uffd.as_fd(), map.addr(), 4096).unwrap();
        let (res, took) = reader.join().unwrap();
        assert_eq!(
            res,
            Err(MemError::Fault),
            "a read after the deadline must fail"
        );
        assert!(took >= Duration::from_millis(500), "{took:?}");
        // A read that does not wait is untouched.
        let waits = ClientWaits::standalone(Duration::from_millis(200));
        let mut mem = VmMemory::new(tid, waits.clone());
        assert_eq!(mem.read(addr + 64, 8).unwrap(), vec![0; 8]);
        assert!(!waits.fired());
    }

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
        let mut m = VmMemory::new(tid, ClientWaits::unbounded());
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
        // More writes than fit the stack arrays.
        for i in 0..12u8 {
            m.write(base + u64::from(i), &[i + 100]).unwrap();
        }
        m.flush().unwrap();
        let b = std::hint::black_box(&buf);
        assert_eq!(b[..12], (100..112).collect::<Vec<u8>>()[..]);
    }

    #[test]
    fn test_vm_window_serves_the_top_struct_and_carries_its_write_back_in_the_reply() {
        // Address 8 is never mapped: only the window can serve it.
        let mut m = VmMemory::for_ioctl(
            std::process::id(),
            8,
            &[1, 2, 3, 4],
            4,
            ClientWaits::unbounded(),
            None,
        );
        assert_eq!(m.read(8, 4).unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(m.read(10, 2).unwrap(), vec![3, 4]);
        assert_eq!(
            m.read(6, 4),
            Err(MemError::Fault),
            "past the window: the syscall"
        );
        m.write(9, &[7]).unwrap();
        assert_eq!(m.read(8, 4).unwrap(), vec![1, 7, 3, 4]);
        m.flush().unwrap();
        m.finish().unwrap();
        assert_eq!(m.reply_data().as_slice(), [1, 7, 3, 4]);

        // Not written: the reply carries nothing (the kernel copies nothing back).
        let mut m = VmMemory::for_ioctl(
            std::process::id(),
            8,
            &[1, 2, 3, 4],
            4,
            ClientWaits::unbounded(),
            None,
        );
        assert_eq!(m.read(8, 4).unwrap(), vec![1, 2, 3, 4]);
        assert!(m.reply_data().is_empty());

        // Only an _IOWR command (in and out the same size) gets a window.
        let mut m = VmMemory::for_ioctl(
            std::process::id(),
            8,
            &[1, 2, 3, 4],
            0,
            ClientWaits::unbounded(),
            None,
        );
        assert_eq!(m.read(8, 4), Err(MemError::Fault));
    }

    /// An early answer that cannot go out (a request of no session, or none to answer with)
    /// leaves everything to the call's return: the buffered writes are made (as they must be
    /// before any answer) and the reply still carries the window.
    #[test]
    fn test_vm_answer_now_without_a_session_answers_nothing_and_keeps_the_reply() {
        let tid = std::process::id();
        let mut buf = vec![0u8; 32];
        let base = buf.as_mut_ptr() as u64;
        let req = cuse_dev::Request::detached(1, tid, 0, 0);
        let early = Some(req.early_answer(8));
        let mut m = VmMemory::for_ioctl(tid, base + 8, &[5; 8], 8, ClientWaits::unbounded(), early);
        m.write(base + 20, &[3; 4]).unwrap();
        m.write(base + 8, &[6; 2]).unwrap();
        assert!(!m.answer_now(0));
        assert_eq!(
            std::hint::black_box(&buf)[20..24],
            [3; 4],
            "made before answering"
        );
        m.write(base + 10, &[7; 2]).unwrap();
        m.finish().unwrap();
        assert_eq!(m.reply_data().as_slice(), [6, 6, 7, 7, 5, 5, 5, 5]);

        let mut m = VmMemory::for_ioctl(tid, base + 8, &[5; 8], 8, ClientWaits::unbounded(), None);
        m.write(base + 8, &[6; 2]).unwrap();
        assert!(!m.answer_now(0));
        assert_eq!(m.reply_data().as_slice(), [6, 6, 5, 5, 5, 5, 5, 5]);
    }

    #[test]
    fn test_vm_window_writes_reach_the_client_on_failure_and_overlaps_stay_ordered() {
        let tid = std::process::id();
        let mut buf = vec![0u8; 32];
        let base = buf.as_mut_ptr() as u64;
        // The window is buf[8..16] as the kernel copied it.
        let mut m = VmMemory::for_ioctl(tid, base + 8, &[5; 8], 8, ClientWaits::unbounded(), None);
        // A nested write overlapping the window's start, then the top struct.
        m.write(base + 4, &[1; 8]).unwrap();
        m.write(base + 8, &[2, 2]).unwrap();
        // A read overlapping the window sees the writes.
        assert_eq!(m.read(base + 6, 6).unwrap(), vec![1, 1, 2, 2, 1, 1]);
        m.finish_failed();
        let b = std::hint::black_box(&buf);
        assert_eq!(b[4..16], [1, 1, 1, 1, 2, 2, 1, 1, 5, 5, 5, 5]);

        // Success: the nested write goes through the syscall, the window through the reply,
        // which carries the nested write's overlapping bytes too.
        let mut m = VmMemory::for_ioctl(tid, base + 8, &[5; 8], 8, ClientWaits::unbounded(), None);
        m.write(base + 20, &[3; 4]).unwrap();
        m.write(base + 12, &[4; 8]).unwrap();
        m.finish().unwrap();
        assert_eq!(m.reply_data().as_slice(), [5, 5, 5, 5, 4, 4, 4, 4]);
        let b = std::hint::black_box(&buf);
        assert_eq!(b[16..24], [4, 4, 4, 4, 3, 3, 3, 3]);
    }

    #[test]
    fn test_contains_handles_wrapping_addresses() {
        assert_eq!(contains((u64::MAX - 1, 2), u64::MAX, 1), Some(1));
        assert_eq!(contains((u64::MAX - 1, 2), u64::MAX, 2), None);
        assert_eq!(contains((0x10, 4), 0x0, 1), None);
    }
}
