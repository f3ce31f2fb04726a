//! The channel front end: what a channel executes when its doorbell rings.
//!
//! On a real GPU the client writes GPFIFO entries and the pushbuffer segments they name into
//! memory, advances `GP_PUT` in the channel's USERD and writes the channel's work-submit token
//! to `NOTIFY_CHANNEL_PENDING` (offset 0x90) of the `*_USERMODE_A` page. Host then fetches the
//! entries between `GP_GET` and `GP_PUT` through the channel's GPU virtual address space,
//! decodes the methods and hands them to the engines, and advances `GP_GET` in USERD.
//!
//! The simulator does the same with the facts of the class headers (`clc86f.h`
//! HOPPER_CHANNEL_GPFIFO_A: GPFIFO entry and method-header formats, host methods; `clc8b5.h`
//! HOPPER_DMA_COPY_A; `clc6c0.h` for the compute class' inline-to-memory, report-semaphore and
//! launch methods, whose offsets the open Hopper header `clcbc0.h` does not publish and which
//! are taken to be Ampere's; `clc361.h` the doorbell):
//! - the doorbell page is a memfd the client maps: a watcher thread (running while channels
//!   exist) polls `NOTIFY_CHANNEL_PENDING` every [`POLL`] (it holds 0xffffffff, not a token,
//!   until the client writes one), resets it, and services every
//!   scheduled channel of that GPU whose `GP_PUT` differs from `GP_GET` (a memfd has no write
//!   trap, so a second doorbell written while the first is being consumed would otherwise be
//!   lost); [`SimDriver::ring_doorbell`] does the same synchronously;
//! - GPU virtual addresses resolve through the UVM va_space that registered the channel's RM VA
//!   space for the GPU (`UVM_REGISTER_GPU_VASPACE`): external mappings
//!   (`UVM_MAP_EXTERNAL_ALLOCATION`) to the memory block's memfd, managed memory (the
//!   va_space memfd, offset == VA, where a client mapping makes it a managed range). An
//!   address outside them is an MMU fault: the channel gets the error a real fault gives
//!   (`ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT` in its error notifier) and stops;
//! - host methods: `SET_OBJECT`, `NOP`, the semaphore methods (`SEM_ADDR_*`, `SEM_PAYLOAD_*`,
//!   `SEM_EXECUTE` with acquire / strict and circular GEQ / AND / NOR, release with 32- or
//!   64-bit payload and optional timestamp, reductions with signed and unsigned formats; and
//!   the legacy `SEMAPHOREA..D`), `NON_STALL_INTERRUPT`, `SET_REFERENCE` (USERD `Reference`),
//!   `WFI`, `FB_FLUSH`, `MEM_OP_*`, `YIELD`, `CLEAR_FAULTED` (no caches or TLBs to maintain,
//!   nothing in flight: no effect); an acquire that is not satisfied blocks the channel where it
//!   stands and is retried on every poll;
//! - `HOPPER_DMA_COPY_A`: pitch-layout copies between virtual addresses (single and
//!   multi-line), remapped writes (`SET_REMAP_*`: the memset of `cuMemsetD8/D16/D32`), the
//!   semaphore release / reduction after the copy (one or four words, optional timestamp),
//!   non-blocking interrupts; block-linear layouts, physical addressing, secure copies and the
//!   conditional-interrupt semaphore are refused with the CE's channel error
//!   (`ROBUST_CHANNEL_CE0_ERROR + n`): not simulated; a blocking interrupt (RM's stall
//!   interrupt) has no effect;
//! - `HOPPER_COMPUTE_A`: inline-to-memory (`LINE_LENGTH_IN`, `LINE_COUNT`, `OFFSET_OUT*`,
//!   `PITCH_OUT`, `LAUNCH_DMA`, `LOAD_INLINE_DATA`, the I2M semaphore) and
//!   `SET_REPORT_SEMAPHORE_*` releases, which are front-end work; every other method is
//!   recorded (its last value per method) without effect: state for the SMs; a launch (`SEND_PCAS_A` then
//!   `SEND_PCAS_B`/`SEND_SIGNALING_PCAS_B`/`SEND_SIGNALING_PCAS2_B`) needs the SMs, which are
//!   not simulated: it raises the channel error of a faulting launch
//!   (`ROBUST_CHANNEL_GR_EXCEPTION`, engine GR0, status 0xffff in the error notifier, as
//!   `krcErrorWriteNotifier` writes it) and the channel stops.
//!
//! Non-stall interrupts (the host method, a CE's non-blocking interrupt) notify the RM events
//! on the channel's subdevice with the engine's notifier index (`NV2080_NOTIFIERS_GR0`,
//! `_CE0 + n`): their OS events count the notification ([`SimDriver::os_event_notifications`]).
//! Waking a `poll` on the client's file needs a poll hook in the `HostDriver` boundary, which
//! does not exist yet: not done here.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::channel::{Channel, GP_ENTRY_BYTES};
use crate::driver::{Kind, SimDriver, State};
use crate::gpfifo_state::{CeState, ChannelExec, ExecStats, Mode, Pending};

/// How often the doorbell watcher looks at the usermode pages (500 µs).
pub(crate) const POLL: Duration = Duration::from_micros(500);

/// `NVC361_NOTIFY_CHANNEL_PENDING`.
const NOTIFY_CHANNEL_PENDING: u64 = 0x90;
/// `NVC361_TIME_0`, `NVC361_TIME_1`: the GPU's time (ns), low and high word.
const TIME_0: u64 = 0x80;
const TIME_1: u64 = 0x84;
/// What the doorbell holds when nothing was written since the last one was consumed: not a
/// token (`NV_CTRL_VF_DOORBELL` uses bits 22:0), while 0 is the token of channel 0 of
/// runlist 0.
const DOORBELL_IDLE: u32 = 0xffff_ffff;
/// USERD (`Nvc86fControl`): `Reference`, `GPGet`, `GPPut`.
const USERD_REFERENCE: u64 = 0x48;
const USERD_GP_GET: u64 = 0x88;
const USERD_GP_PUT: u64 = 0x8c;

/// `nverror.h`.
const ROBUST_CHANNEL_GR_EXCEPTION: u32 = 13;
const ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT: u32 = 31;
const ROBUST_CHANNEL_PBDMA_ERROR: u32 = 32;
const ROBUST_CHANNEL_CE0_ERROR: u32 = 39;
/// `NV2080_NOTIFIERS_GR0`, `NV2080_NOTIFIERS_CE0`.
const NOTIFIERS_GR0: u32 = 12;
const NOTIFIERS_CE0: u32 = 23;

/// Host methods (`clc86f.h`).
mod host {
    pub const SET_OBJECT: u32 = 0x00;
    pub const NOP: u32 = 0x08;
    pub const SEMAPHOREA: u32 = 0x10;
    pub const SEMAPHOREB: u32 = 0x14;
    pub const SEMAPHOREC: u32 = 0x18;
    pub const SEMAPHORED: u32 = 0x1c;
    pub const NON_STALL_INTERRUPT: u32 = 0x20;
    pub const FB_FLUSH: u32 = 0x24;
    pub const MEM_OP_A: u32 = 0x28;
    pub const MEM_OP_D: u32 = 0x34;
    pub const SET_REFERENCE: u32 = 0x50;
    pub const SEM_ADDR_LO: u32 = 0x5c;
    pub const SEM_ADDR_HI: u32 = 0x60;
    pub const SEM_PAYLOAD_LO: u32 = 0x64;
    pub const SEM_PAYLOAD_HI: u32 = 0x68;
    pub const SEM_EXECUTE: u32 = 0x6c;
    pub const WFI: u32 = 0x78;
    pub const YIELD: u32 = 0x80;
    pub const CLEAR_FAULTED: u32 = 0x84;
    /// Host methods end here; higher methods go to the subchannel's engine.
    pub const END: u32 = 0x100;
}

/// `HOPPER_DMA_COPY_A` methods (`clc8b5.h`).
mod ce {
    pub const NOP: u32 = 0x100;
    pub const PM_TRIGGER: u32 = 0x140;
    pub const SET_SEMAPHORE_A: u32 = 0x240;
    pub const SET_SEMAPHORE_B: u32 = 0x244;
    pub const SET_SEMAPHORE_PAYLOAD: u32 = 0x248;
    pub const SET_SEMAPHORE_PAYLOAD_UPPER: u32 = 0x24c;
    pub const SET_SRC_PHYS_MODE: u32 = 0x260;
    pub const SET_DST_PHYS_MODE: u32 = 0x264;
    pub const LAUNCH_DMA: u32 = 0x300;
    pub const OFFSET_IN_UPPER: u32 = 0x400;
    pub const OFFSET_IN_LOWER: u32 = 0x404;
    pub const OFFSET_OUT_UPPER: u32 = 0x408;
    pub const OFFSET_OUT_LOWER: u32 = 0x40c;
    pub const PITCH_IN: u32 = 0x410;
    pub const PITCH_OUT: u32 = 0x414;
    pub const LINE_LENGTH_IN: u32 = 0x418;
    pub const LINE_COUNT: u32 = 0x41c;
    pub const SET_REMAP_CONST_A: u32 = 0x700;
    pub const SET_REMAP_CONST_B: u32 = 0x704;
    pub const SET_REMAP_COMPONENTS: u32 = 0x708;
}

/// Compute-class methods of the front end (`clc6c0.h` offsets, see the module docs).
mod gr {
    pub const LINE_LENGTH_IN: u32 = 0x180;
    pub const LINE_COUNT: u32 = 0x184;
    pub const OFFSET_OUT_UPPER: u32 = 0x188;
    pub const OFFSET_OUT: u32 = 0x18c;
    pub const PITCH_OUT: u32 = 0x190;
    pub const LAUNCH_DMA: u32 = 0x1b0;
    pub const LOAD_INLINE_DATA: u32 = 0x1b4;
    pub const SET_I2M_SEMAPHORE_A: u32 = 0x1dc;
    pub const SET_I2M_SEMAPHORE_B: u32 = 0x1e0;
    pub const SET_I2M_SEMAPHORE_C: u32 = 0x1e4;
    pub const SEND_PCAS_A: u32 = 0x2b4;
    pub const SEND_PCAS_B: u32 = 0x2b8;
    pub const SEND_SIGNALING_PCAS_B: u32 = 0x2bc;
    pub const SEND_SIGNALING_PCAS2_B: u32 = 0x2c0;
    pub const SET_REPORT_SEMAPHORE_A: u32 = 0x1b00;
    pub const SET_REPORT_SEMAPHORE_B: u32 = 0x1b04;
    pub const SET_REPORT_SEMAPHORE_C: u32 = 0x1b08;
    pub const SET_REPORT_SEMAPHORE_D: u32 = 0x1b0c;
}

/// What a channel's state looks like to a test or a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelStatus {
    /// The channel id.
    pub chid: u32,
    /// The work-submit token to write to the doorbell.
    pub work_submit_token: u32,
    /// Host's `GP_GET` (also written to USERD).
    pub gp_get: u32,
    /// Blocked on a semaphore acquire.
    pub blocked: bool,
    /// The channel error raised, if any (`ROBUST_CHANNEL_*`).
    pub error: Option<u32>,
    /// What it executed.
    pub stats: ExecStats,
}

/// The result of one method.
enum Step {
    Next,
    Block,
    Error(u32),
}

/// What a run needs from the channel, copied out so that the state can be borrowed freely.
struct Ctx {
    gpu: usize,
    engine_type: u32,
    userd: Option<(u64, u64)>,
    error_notifier: Option<u64>,
    objects: Vec<(u32, u32)>,
    view: Option<crate::uvm::GpuView>,
}

impl Ctx {
    fn new(st: &State, c: &Channel) -> Ctx {
        let rm_vas = st
            .clients
            .get(&c.h_client)
            .and_then(|cl| cl.objects().get(&c.h_vaspace))
            .and_then(|o| match o.kind {
                Kind::VaSpace { id, .. } => Some(id),
                _ => None,
            });
        Ctx {
            gpu: c.gpu,
            engine_type: c.engine_type,
            userd: c.userd,
            error_notifier: c.error_notifier,
            objects: c.objects.values().copied().collect(),
            view: rm_vas.and_then(|v| crate::uvm::gpu_view(st, c.gpu, v)),
        }
    }

    /// Reads GPU virtual memory; `Err(va)` at the first unmapped byte.
    fn read(&self, st: &State, mut va: u64, buf: &mut [u8]) -> Result<(), u64> {
        let view = self.view.as_ref().ok_or(va)?;
        let mut done = 0;
        while done < buf.len() {
            let rest = &mut buf[done..];
            let n = if let Some(&(base, end, block, off)) =
                view.external.iter().find(|m| m.0 <= va && va < m.1)
            {
                let n = rest
                    .len()
                    .min(usize::try_from(end - va).unwrap_or(usize::MAX));
                if !st.block_read(block, off + (va - base), &mut rest[..n]) {
                    return Err(va);
                }
                n
            } else if let Some(&(_, end)) = view.managed().iter().find(|m| m.0 <= va && va < m.1) {
                let n = rest
                    .len()
                    .min(usize::try_from(end - va).unwrap_or(usize::MAX));
                let f: &File = view.memfd.as_ref().ok_or(va)?;
                f.read_exact_at(&mut rest[..n], va).map_err(|_| va)?;
                n
            } else {
                return Err(va);
            };
            done += n;
            va += n as u64;
        }
        Ok(())
    }

    /// Writes GPU virtual memory; `Err(va)` at the first unmapped byte.
    fn write(&self, st: &mut State, mut va: u64, data: &[u8]) -> Result<(), u64> {
        let view = self.view.as_ref().ok_or(va)?;
        let mut done = 0;
        while done < data.len() {
            let rest = &data[done..];
            let n = if let Some(&(base, end, block, off)) =
                view.external.iter().find(|m| m.0 <= va && va < m.1)
            {
                let n = rest
                    .len()
                    .min(usize::try_from(end - va).unwrap_or(usize::MAX));
                if !st.block_write(block, off + (va - base), &rest[..n]) {
                    return Err(va);
                }
                n
            } else if let Some(&(_, end)) = view.managed().iter().find(|m| m.0 <= va && va < m.1) {
                let n = rest
                    .len()
                    .min(usize::try_from(end - va).unwrap_or(usize::MAX));
                let f: &File = view.memfd.as_ref().ok_or(va)?;
                f.write_all_at(&rest[..n], va).map_err(|_| va)?;
                n
            } else {
                return Err(va);
            };
            done += n;
            va += n as u64;
        }
        Ok(())
    }

    fn read_u32(&self, st: &State, va: u64) -> Result<u32, u64> {
        let mut b = [0; 4];
        self.read(st, va, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn read_u64(&self, st: &State, va: u64) -> Result<u64, u64> {
        let mut b = [0; 8];
        self.read(st, va, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn userd_u32(&self, st: &State, off: u64) -> Option<u32> {
        let (block, base) = self.userd?;
        let mut b = [0; 4];
        st.block_read(block, base + off, &mut b)
            .then(|| u32::from_le_bytes(b))
    }

    fn set_userd_u32(&self, st: &mut State, off: u64, v: u32) {
        if let Some((block, base)) = self.userd {
            st.block_write(block, base + off, &v.to_le_bytes());
        }
    }
}

/// The GPU's time in ns (PTIMER), as the usermode page and the time controls report it.
fn gpu_time() -> u64 {
    crate::control_init::gpu_time_ns()
}

/// A semaphore release: 32- or 64-bit payload, or the four-word form with the timestamp at +8.
/// How much of a copy line the simulated copy engine holds at once: lines are up to 2^32 - 1
/// pixels (64 GiB remapped), which no buffer may be sized by.
const CE_CHUNK: u64 = 1 << 20;

/// One line of a plain pitch copy of `len` bytes, [`CE_CHUNK`] at a time: a fault stops it
/// where the mapping ends, after the pieces before it were written.
fn copy_line(ctx: &Ctx, st: &mut State, src: u64, dst: u64, len: u64) -> Result<(), u64> {
    let mut done = 0;
    while done < len {
        let n = CE_CHUNK.min(len - done);
        let mut buf = vec![0; usize::try_from(n).map_err(|_| src + done)?];
        ctx.read(st, src + done, &mut buf)?;
        ctx.write(st, dst + done, &buf)?;
        done += n;
    }
    Ok(())
}

fn release(ctx: &Ctx, st: &mut State, va: u64, payload: u64, wide: bool, timestamp: bool) -> Step {
    let mut out = Vec::with_capacity(16);
    if wide || timestamp {
        out.extend_from_slice(&payload.to_le_bytes());
        if !wide {
            // Four-word semaphore with a 32-bit payload: the second word is 0.
            out[4..8].fill(0);
        }
    } else {
        out.extend_from_slice(&lo32(payload).to_le_bytes());
    }
    if timestamp {
        out.extend_from_slice(&gpu_time().to_le_bytes());
    }
    match ctx.write(st, va, &out) {
        Ok(()) => Step::Next,
        Err(_) => Step::Error(ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT),
    }
}

/// `SEM_EXECUTE_REDUCTION_*` (and the CE's): the new value, or `None` for an invalid op.
fn reduce(op: u32, signed: bool, wide: bool, old: u64, payload: u64) -> Option<u64> {
    let mask = if wide { u64::MAX } else { u64::from(u32::MAX) };
    let (o, p) = (old & mask, payload & mask);
    let sx = |v: u64| -> i64 {
        if wide {
            v as i64
        } else {
            i64::from(lo32(v) as i32)
        }
    };
    let v = match op {
        0 => {
            if signed {
                if sx(o) <= sx(p) { o } else { p }
            } else {
                o.min(p)
            }
        }
        1 => {
            if signed {
                if sx(o) >= sx(p) { o } else { p }
            } else {
                o.max(p)
            }
        }
        2 => o ^ p,
        3 => o & p,
        4 => o | p,
        5 => o.wrapping_add(p),
        // INC: wraps to 0 at the payload.
        6 => {
            if o >= p {
                0
            } else {
                o + 1
            }
        }
        // DEC: wraps to the payload at 0 (and above it).
        7 => {
            if o == 0 || o > p {
                p
            } else {
                o - 1
            }
        }
        _ => return None,
    };
    Some(v & mask)
}

fn reduction(
    ctx: &Ctx,
    st: &mut State,
    va: u64,
    op: u32,
    signed: bool,
    wide: bool,
    payload: u64,
) -> Step {
    let old = if wide {
        ctx.read_u64(st, va)
    } else {
        ctx.read_u32(st, va).map(u64::from)
    };
    let Ok(old) = old else {
        return Step::Error(ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT);
    };
    let Some(new) = reduce(op, signed, wide, old, payload) else {
        return Step::Error(ROBUST_CHANNEL_PBDMA_ERROR);
    };
    release(ctx, st, va, new, wide, false)
}

impl ChannelExec {
    /// `SEM_EXECUTE`.
    fn sem_execute(&mut self, ctx: &Ctx, st: &mut State, data: u32) -> Step {
        let va = (u64::from(self.sem[1] & 0x1ff_ffff) << 32) | u64::from(self.sem[0] & !3);
        let wide = data >> 24 & 1 == 1;
        let payload = u64::from(self.sem[2])
            | if wide {
                u64::from(self.sem[3]) << 32
            } else {
                0
            };
        match data & 7 {
            // RELEASE
            1 => {
                self.stats.semaphore_writes += 1;
                release(ctx, st, va, payload, wide, data >> 25 & 1 == 1)
            }
            // REDUCTION
            6 => {
                self.stats.semaphore_writes += 1;
                reduction(
                    ctx,
                    st,
                    va,
                    data >> 27 & 0xf,
                    data >> 31 == 0,
                    wide,
                    payload,
                )
            }
            op @ (0 | 2..=5) => {
                let cur = if wide {
                    ctx.read_u64(st, va)
                } else {
                    ctx.read_u32(st, va).map(u64::from)
                };
                let Ok(cur) = cur else {
                    return Step::Error(ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT);
                };
                let ok = match op {
                    0 => cur == payload,
                    2 => cur >= payload,
                    3 => {
                        if wide {
                            (cur.wrapping_sub(payload) as i64) >= 0
                        } else {
                            lo32(cur).wrapping_sub(lo32(payload)) as i32 >= 0
                        }
                    }
                    4 => cur & payload != 0,
                    _ => {
                        let m = if wide { u64::MAX } else { u64::from(u32::MAX) };
                        !(cur | payload) & m != 0
                    }
                };
                if ok {
                    Step::Next
                } else {
                    self.stats.acquire_waits += 1;
                    Step::Block
                }
            }
            _ => Step::Error(ROBUST_CHANNEL_PBDMA_ERROR),
        }
    }

    /// The legacy `SEMAPHORED`.
    fn semaphore_d(&mut self, ctx: &Ctx, st: &mut State, data: u32) -> Step {
        let va = (u64::from(self.legacy_sem[0] & 0xff) << 32) | u64::from(self.legacy_sem[1] & !3);
        let payload = u64::from(self.legacy_sem[2]);
        match data & 0x1f {
            0x2 => {
                self.stats.semaphore_writes += 1;
                // RELEASE_SIZE 16BYTE (0): payload, 0, timestamp; 4BYTE (1): the payload.
                release(ctx, st, va, payload, false, data >> 24 & 1 == 0)
            }
            0x10 => {
                self.stats.semaphore_writes += 1;
                reduction(
                    ctx,
                    st,
                    va,
                    data >> 27 & 0xf,
                    data >> 31 == 0,
                    false,
                    payload,
                )
            }
            op @ (0x1 | 0x4 | 0x8) => {
                let Ok(cur) = ctx.read_u32(st, va) else {
                    return Step::Error(ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT);
                };
                let p = lo32(payload);
                let ok = match op {
                    0x1 => cur == p,
                    0x4 => cur.wrapping_sub(p) as i32 >= 0,
                    _ => cur & p != 0,
                };
                if ok {
                    Step::Next
                } else {
                    self.stats.acquire_waits += 1;
                    Step::Block
                }
            }
            _ => Step::Error(ROBUST_CHANNEL_PBDMA_ERROR),
        }
    }

    /// One method on subchannel `subch`.
    fn method(&mut self, ctx: &Ctx, st: &mut State, subch: u32, m: u32, data: u32) -> Step {
        self.stats.methods += 1;
        if m < host::END {
            return match m {
                host::SET_OBJECT => {
                    // The class must be one of the channel's objects (else the PBDMA faults
                    // the channel with an illegal class).
                    let class = data & 0xffff;
                    if !ctx.objects.iter().any(|&(c, _)| c & 0xffff == class) {
                        return Step::Error(ROBUST_CHANNEL_PBDMA_ERROR);
                    }
                    self.subch[subch as usize] = class;
                    Step::Next
                }
                host::SEMAPHOREA => {
                    self.legacy_sem[0] = data;
                    Step::Next
                }
                host::SEMAPHOREB => {
                    self.legacy_sem[1] = data;
                    Step::Next
                }
                host::SEMAPHOREC => {
                    self.legacy_sem[2] = data;
                    Step::Next
                }
                host::SEMAPHORED => self.semaphore_d(ctx, st, data),
                host::NON_STALL_INTERRUPT => {
                    self.nonstall(ctx, st);
                    Step::Next
                }
                host::SET_REFERENCE => {
                    ctx.set_userd_u32(st, USERD_REFERENCE, data);
                    Step::Next
                }
                host::SEM_ADDR_LO => {
                    self.sem[0] = data;
                    Step::Next
                }
                host::SEM_ADDR_HI => {
                    self.sem[1] = data;
                    Step::Next
                }
                host::SEM_PAYLOAD_LO => {
                    self.sem[2] = data;
                    Step::Next
                }
                host::SEM_PAYLOAD_HI => {
                    self.sem[3] = data;
                    Step::Next
                }
                host::SEM_EXECUTE => self.sem_execute(ctx, st, data),
                // Nothing is cached, in flight or faulted in the simulator.
                host::NOP | host::FB_FLUSH | host::WFI | host::YIELD | host::CLEAR_FAULTED => {
                    Step::Next
                }
                host::MEM_OP_A..=host::MEM_OP_D => Step::Next,
                _ => Step::Error(ROBUST_CHANNEL_PBDMA_ERROR),
            };
        }
        match self.subch[subch as usize] {
            0xc8b5 => self.copy_method(ctx, st, m, data),
            0xcbc0 => self.compute_method(ctx, st, m, data),
            // No object bound: the method has nowhere to go.
            _ => Step::Error(ROBUST_CHANNEL_PBDMA_ERROR),
        }
    }

    /// A non-stall interrupt of the channel's engine (or of copy engine `ce`).
    fn nonstall_engine(&mut self, ctx: &Ctx, st: &mut State, engine_type: u32) {
        self.stats.nonstall_interrupts += 1;
        let index = if engine_type == 0x01 {
            NOTIFIERS_GR0
        } else {
            NOTIFIERS_CE0 + engine_type.saturating_sub(0x09)
        };
        notify_subdevice_events(st, ctx.gpu, index);
    }

    fn nonstall(&mut self, ctx: &Ctx, st: &mut State) {
        self.nonstall_engine(ctx, st, ctx.engine_type);
    }

    fn copy_method(&mut self, ctx: &Ctx, st: &mut State, m: u32, data: u32) -> Step {
        let c = &mut self.ce;
        match m {
            ce::NOP | ce::PM_TRIGGER => {}
            ce::SET_SEMAPHORE_A => c.sem[0] = data,
            ce::SET_SEMAPHORE_B => c.sem[1] = data,
            ce::SET_SEMAPHORE_PAYLOAD => c.sem[2] = data,
            ce::SET_SEMAPHORE_PAYLOAD_UPPER => c.sem[3] = data,
            ce::SET_SRC_PHYS_MODE => c.phys[0] = data,
            ce::SET_DST_PHYS_MODE => c.phys[1] = data,
            ce::OFFSET_IN_UPPER => c.offset_in[0] = data,
            ce::OFFSET_IN_LOWER => c.offset_in[1] = data,
            ce::OFFSET_OUT_UPPER => c.offset_out[0] = data,
            ce::OFFSET_OUT_LOWER => c.offset_out[1] = data,
            ce::PITCH_IN => c.pitch_in = data,
            ce::PITCH_OUT => c.pitch_out = data,
            ce::LINE_LENGTH_IN => c.line_length = data,
            ce::LINE_COUNT => c.line_count = data,
            ce::SET_REMAP_CONST_A => c.remap_const[0] = data,
            ce::SET_REMAP_CONST_B => c.remap_const[1] = data,
            ce::SET_REMAP_COMPONENTS => c.remap_components = data,
            ce::LAUNCH_DMA => return self.launch_dma(ctx, st, data),
            // Secure copy (confidential computing), scrub parameters and the rest: not
            // simulated.
            _ => {
                let ce_engine = ctx
                    .objects
                    .iter()
                    .find(|o| o.0 == 0xc8b5)
                    .map_or(0x09, |o| o.1);
                return Step::Error(ROBUST_CHANNEL_CE0_ERROR + (ce_engine - 0x09).min(2));
            }
        }
        Step::Next
    }

    /// `NVC8B5_LAUNCH_DMA`.
    fn launch_dma(&mut self, ctx: &Ctx, st: &mut State, d: u32) -> Step {
        let c = self.ce.clone();
        let ce_engine = ctx
            .objects
            .iter()
            .find(|o| o.0 == 0xc8b5)
            .map_or(0x09, |o| o.1);
        let ce_error = Step::Error(ROBUST_CHANNEL_CE0_ERROR + (ce_engine - 0x09).min(2));
        let transfer = d & 3;
        if transfer != 0 {
            let src_pitch = d >> 7 & 1 == 1;
            let dst_pitch = d >> 8 & 1 == 1;
            let multi = d >> 9 & 1 == 1;
            let remap = d >> 10 & 1 == 1;
            let physical = d >> 12 & 3 != 0;
            // Block-linear surfaces, physical addressing and secure copies are not simulated.
            if !dst_pitch || (!remap && !src_pitch) || physical || d >> 20 & 3 == 1 {
                return ce_error;
            }
            let src = (u64::from(c.offset_in[0] & 0x1ff_ffff) << 32) | u64::from(c.offset_in[1]);
            let dst = (u64::from(c.offset_out[0] & 0x1ff_ffff) << 32) | u64::from(c.offset_out[1]);
            let lines = if multi { c.line_count } else { 1 };
            let comp = u64::from((c.remap_components >> 16 & 3) + 1);
            let n_src = u64::from((c.remap_components >> 20 & 3) + 1);
            let n_dst = u64::from((c.remap_components >> 24 & 3) + 1);
            for line in 0..u64::from(lines) {
                let (s, t) = (
                    src + line * u64::from(c.pitch_in),
                    dst + line * u64::from(c.pitch_out),
                );
                let r = if remap {
                    self.remap_line(ctx, st, &c, s, t, comp, n_src, n_dst)
                } else {
                    copy_line(ctx, st, s, t, u64::from(c.line_length))
                };
                if r.is_err() {
                    return Step::Error(ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT);
                }
            }
            self.stats.copies += 1;
        }
        // The semaphore after the transfer.
        let sem_va = (u64::from(c.sem[0] & 0x1ff_ffff) << 32) | u64::from(c.sem[1]);
        let wide = d >> 27 & 1 == 1;
        let payload = u64::from(c.sem[2]) | if wide { u64::from(c.sem[3]) << 32 } else { 0 };
        let step = match d >> 3 & 3 {
            0 => Step::Next,
            kind @ (1 | 2) => {
                self.stats.semaphore_writes += 1;
                if d >> 19 & 1 == 1 {
                    reduction(
                        ctx,
                        st,
                        sem_va,
                        d >> 14 & 0xf,
                        d >> 18 & 1 == 0,
                        wide,
                        payload,
                    )
                } else {
                    release(ctx, st, sem_va, payload, wide, kind == 2)
                }
            }
            // RELEASE_CONDITIONAL_INTR_SEMAPHORE: not simulated.
            _ => return ce_error,
        };
        if let Step::Next = step
            && d >> 5 & 3 == 2
        {
            self.nonstall_engine(ctx, st, ce_engine);
        }
        step
    }

    /// One line of a remapped transfer: `line_length` destination pixels of `n_dst`
    /// components of `comp` bytes, each from CONST_A, CONST_B or a source component, or left
    /// as it is (NO_WRITE). Worked through [`CE_CHUNK`] bytes at a time, as an engine streams
    /// it: a fault stops it where the mapping ends, after the pieces before it were written.
    #[allow(clippy::too_many_arguments)]
    fn remap_line(
        &mut self,
        ctx: &Ctx,
        st: &mut State,
        c: &CeState,
        src: u64,
        dst: u64,
        comp: u64,
        n_src: u64,
        n_dst: u64,
    ) -> Result<(), u64> {
        let pixels = u64::from(c.line_length);
        let sel = |i: u64| c.remap_components >> (4 * i) & 7;
        let reads = (0..n_dst).any(|i| sel(i) <= 3);
        let skip = (0..n_dst).any(|i| sel(i) > 5);
        // comp, n_src and n_dst are 1 to 4: a pixel is at most 16 bytes on either side.
        let per_chunk = CE_CHUNK / (n_src.max(n_dst) * comp);
        let k = usize::try_from(comp).map_err(|_| dst)?;
        let consts = c.remap_const.map(u32::to_le_bytes);
        let mut at_pixel = 0;
        while at_pixel < pixels {
            let n = per_chunk.min(pixels - at_pixel);
            let (s0, d0) = (src + at_pixel * n_src * comp, dst + at_pixel * n_dst * comp);
            // Both under CE_CHUNK bytes.
            let src_len =
                usize::try_from(if reads { n * n_src * comp } else { 0 }).map_err(|_| s0)?;
            let out_len = usize::try_from(n * n_dst * comp).map_err(|_| d0)?;
            let mut src_buf = vec![0; src_len];
            ctx.read(st, s0, &mut src_buf)?;
            let mut out = vec![0u8; out_len];
            for p in 0..n {
                for i in 0..n_dst {
                    let at = usize::try_from((p * n_dst + i) * comp).map_err(|_| d0)?;
                    let piece = match sel(i) {
                        s @ 0..=3 => {
                            let from = usize::try_from((p * n_src + u64::from(s)) * comp).ok();
                            from.and_then(|f| src_buf.get(f..f + k))
                        }
                        4 => consts[0].get(..k),
                        5 => consts[1].get(..k),
                        _ => None,
                    };
                    if let (Some(b), Some(o)) = (piece, out.get_mut(at..at + k)) {
                        o.copy_from_slice(b);
                    }
                }
            }
            if skip {
                for p in 0..n {
                    for i in (0..n_dst).filter(|&i| sel(i) <= 5) {
                        let off = (p * n_dst + i) * comp;
                        let at = usize::try_from(off).map_err(|_| d0)?;
                        ctx.write(st, d0 + off, &out[at..at + k])?;
                        self.stats.bytes_written += comp;
                    }
                }
            } else {
                ctx.write(st, d0, &out)?;
                self.stats.bytes_written += n * n_dst * comp;
            }
            at_pixel += n;
        }
        Ok(())
    }

    fn compute_method(&mut self, ctx: &Ctx, st: &mut State, m: u32, data: u32) -> Step {
        let i = &mut self.i2m;
        match m {
            gr::LINE_LENGTH_IN => i.line_length = data,
            gr::LINE_COUNT => i.line_count = data,
            gr::OFFSET_OUT_UPPER => i.offset_out[0] = data,
            gr::OFFSET_OUT => i.offset_out[1] = data,
            gr::PITCH_OUT => i.pitch_out = data,
            gr::LAUNCH_DMA => {
                // Pitch layout only (DST_MEMORY_LAYOUT 0:0).
                if data & 1 == 0 {
                    return Step::Error(ROBUST_CHANNEL_GR_EXCEPTION);
                }
                i.active = Some((data, 0));
                if u64::from(i.line_length) * u64::from(i.line_count.max(1)) == 0 {
                    return self.i2m_done(ctx, st);
                }
            }
            gr::LOAD_INLINE_DATA => {
                let Some((flags, got)) = i.active else {
                    return Step::Error(ROBUST_CHANNEL_GR_EXCEPTION);
                };
                let (len, lines) = (u64::from(i.line_length), u64::from(i.line_count.max(1)));
                let total = len * lines;
                let base =
                    (u64::from(i.offset_out[0] & 0x1ffff) << 32) | u64::from(i.offset_out[1]);
                let pitch = u64::from(i.pitch_out);
                let bytes = data.to_le_bytes();
                let mut at = got;
                for b in bytes {
                    if at >= total {
                        break;
                    }
                    let va = base + (at / len) * pitch + at % len;
                    if ctx.write(st, va, &[b]).is_err() {
                        return Step::Error(ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT);
                    }
                    at += 1;
                }
                self.stats.bytes_written += at - got;
                self.i2m.active = Some((flags, at));
                if at >= total {
                    return self.i2m_done(ctx, st);
                }
            }
            gr::SET_I2M_SEMAPHORE_A => i.sem[0] = data,
            gr::SET_I2M_SEMAPHORE_B => i.sem[1] = data,
            gr::SET_I2M_SEMAPHORE_C => i.sem[2] = data,
            gr::SET_REPORT_SEMAPHORE_A => i.report[0] = data,
            gr::SET_REPORT_SEMAPHORE_B => i.report[1] = data,
            gr::SET_REPORT_SEMAPHORE_C => i.report[2] = data,
            gr::SET_REPORT_SEMAPHORE_D => {
                let va = (u64::from(i.report[0] & 0xff) << 32) | u64::from(i.report[1]);
                let payload = u64::from(i.report[2]);
                return match data & 3 {
                    // RELEASE: one word, or four words with the timestamp.
                    0 => {
                        self.stats.semaphore_writes += 1;
                        let step = release(ctx, st, va, payload, false, data >> 28 & 1 == 0);
                        if data >> 20 & 1 == 1 {
                            self.nonstall(ctx, st);
                        }
                        step
                    }
                    // TRAP and the rest: not simulated.
                    _ => Step::Error(ROBUST_CHANNEL_GR_EXCEPTION),
                };
            }
            gr::SEND_PCAS_A => i.pcas_a = data,
            gr::SEND_PCAS_B | gr::SEND_SIGNALING_PCAS_B | gr::SEND_SIGNALING_PCAS2_B => {
                // A compute launch of the QMD at pcas_a << 8: the SMs would run it. They are
                // not simulated, so the launch faults as a failing launch does.
                tracing::debug!(
                    qmd = format_args!("{:#x}", u64::from(i.pcas_a) << 8),
                    "compute launch: SMs not simulated, raising the channel error"
                );
                return Step::Error(ROBUST_CHANNEL_GR_EXCEPTION);
            }
            _ => {
                i.state.insert(m, data);
                self.stats.compute_state_methods += 1;
            }
        }
        Step::Next
    }

    /// The end of an inline-to-memory transfer: its completion semaphore and interrupt.
    fn i2m_done(&mut self, ctx: &Ctx, st: &mut State) -> Step {
        let Some((flags, _)) = self.i2m.active.take() else {
            return Step::Next;
        };
        self.stats.copies += 1;
        let mut step = Step::Next;
        // COMPLETION_TYPE (5:4) RELEASE_SEMAPHORE: one word or four words (12:12).
        if flags >> 4 & 3 == 2 {
            let va = (u64::from(self.i2m.sem[0] & 0xff) << 32) | u64::from(self.i2m.sem[1]);
            let payload = u64::from(self.i2m.sem[2]);
            self.stats.semaphore_writes += 1;
            step = if flags >> 1 & 1 == 1 {
                reduction(
                    ctx,
                    st,
                    va,
                    reduce_op_i2m(flags >> 13 & 7),
                    flags >> 2 & 3 == 1,
                    false,
                    payload,
                )
            } else {
                release(ctx, st, va, payload, false, flags >> 12 & 1 == 0)
            };
        }
        if flags >> 8 & 3 == 1 {
            self.nonstall(ctx, st);
        }
        step
    }
}

/// The I2M reduction ops (ADD, MIN, MAX, INC, DEC, AND, OR, XOR) as host reduction ops.
fn reduce_op_i2m(op: u32) -> u32 {
    [5, 0, 1, 6, 7, 3, 4, 2][op as usize & 7]
}

/// Notifies the RM events of GPU `gpu`'s subdevices with notifier `index`: their OS events
/// count one notification each.
fn notify_subdevice_events(st: &mut State, gpu: usize, index: u32) {
    let mut hit = Vec::new();
    for c in st.clients.values() {
        for o in c.objects().values() {
            if let Kind::Event {
                os_event,
                src,
                index: i,
            } = o.kind
            {
                let is_sub = st
                    .clients
                    .get(&src.0)
                    .and_then(|sc| sc.objects().get(&src.1))
                    .is_some_and(
                        |so| matches!(so.kind, Kind::Subdevice { gpu: g, .. } if g == gpu),
                    );
                if is_sub && i == index {
                    hit.push(os_event);
                }
            }
        }
    }
    for e in st.os_events.iter_mut().filter(|e| hit.contains(&e.id)) {
        e.notified += 1;
    }
}

/// The low 32 bits of `v` (a 32-bit semaphore payload, a timestamp's low word).
const fn lo32(v: u64) -> u32 {
    (v & 0xffff_ffff) as u32
}

/// `NvNotification` of the channel's error notifier (entry 0,
/// `NV_CHANNELGPFIFO_NOTIFICATION_TYPE_ERROR`): `timeStamp` (high word first, as
/// `notifyFillNvNotification` writes it), `info32` the exception, `info16` the engine,
/// `status` 0xffff.
fn raise_error(st: &mut State, ctx: &Ctx, exec: &mut ChannelExec, exception: u32) {
    exec.error = Some(exception);
    tracing::debug!(exception, "channel error");
    if let Some(block) = ctx.error_notifier {
        let t = gpu_time();
        let mut n = [0u8; 16];
        n[0..4].copy_from_slice(&((t >> 32) as u32).to_le_bytes());
        n[4..8].copy_from_slice(&lo32(t).to_le_bytes());
        n[8..12].copy_from_slice(&exception.to_le_bytes());
        // info16: the low 16 bits of the engine type.
        n[12..14].copy_from_slice(&((ctx.engine_type & 0xffff) as u16).to_le_bytes());
        n[14..16].copy_from_slice(&0xffffu16.to_le_bytes());
        st.block_write(block, 0, &n);
    }
}

/// Services channel `id`: executes the GPFIFO entries between `GP_GET` and USERD's `GP_PUT`.
pub(crate) fn run_channel(st: &mut State, id: u64) {
    let Some(ch) = st.fifo.channels.get_mut(&id) else {
        return;
    };
    if ch.exec.error.is_some() || !ch.scheduled {
        return;
    }
    // Nothing to do unless GP_PUT moved or an acquire waits (checked before the VA space is
    // looked at, which costs more).
    if ch.exec.resume.is_none() {
        let Some((block, off)) = ch.userd else {
            return;
        };
        let (gp_get, entries) = (ch.exec.gp_get, ch.gpfifo_entries);
        let mut b = [0u8; 4];
        if !st.block_read(block, off + USERD_GP_PUT, &mut b)
            || u32::from_le_bytes(b) % entries == gp_get
        {
            return;
        }
    }
    let ch = st.fifo.channels.get_mut(&id).expect("looked up above");
    let mut exec = std::mem::take(&mut ch.exec);
    let (gpfifo_va, entries) = (ch.gpfifo_va, ch.gpfifo_entries);
    let ch = &st.fifo.channels[&id];
    let ctx = Ctx::new(st, ch);
    let (chid, before) = (ch.chid, exec.stats);
    run(st, &ctx, &mut exec, gpfifo_va, entries);
    if exec.stats != before || exec.error.is_some() {
        tracing::debug!(
            chid,
            engine = format_args!("{:#x}", ctx.engine_type),
            gp_get = exec.gp_get,
            blocked = exec.resume.is_some(),
            error = ?exec.error,
            stats = ?exec.stats,
            "channel serviced"
        );
    }
    if let Some(ch) = st.fifo.channels.get_mut(&id) {
        ch.exec = exec;
    }
}

fn run(st: &mut State, ctx: &Ctx, exec: &mut ChannelExec, gpfifo_va: u64, entries: u32) {
    let Some(gp_put) = ctx.userd_u32(st, USERD_GP_PUT) else {
        return;
    };
    let gp_put = gp_put % entries;
    while exec.gp_get != gp_put {
        let entry_va = gpfifo_va + u64::from(exec.gp_get) * GP_ENTRY_BYTES;
        let Ok(entry) = ctx.read_u64(st, entry_va) else {
            return raise_error(st, ctx, exec, ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT);
        };
        let (e0, e1) = (lo32(entry), (entry >> 32) as u32);
        let length = e1 >> 10 & 0x1f_ffff;
        if length > 0 {
            // 40 bits in the entry, the bits above from SET_PB_SEGMENT_EXTENDED_BASE.
            let pb =
                (exec.pb_extended_base << 40) | (u64::from(e1 & 0xff) << 32) | u64::from(e0 & !3);
            let mut seg = vec![0u8; length as usize * 4];
            if ctx.read(st, pb, &mut seg).is_err() {
                return raise_error(st, ctx, exec, ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT);
            }
            let dwords: Vec<u32> = seg
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let start = exec.resume.take().unwrap_or(0);
            match segment(st, ctx, exec, &dwords, start) {
                Ok(()) => {}
                Err(None) => return, // blocked on an acquire: resume saved
                Err(Some(e)) => return raise_error(st, ctx, exec, e),
            }
        } else {
            match e1 & 0xff {
                // OPCODE_ILLEGAL
                1 => return raise_error(st, ctx, exec, ROBUST_CHANNEL_PBDMA_ERROR),
                // SET_PB_SEGMENT_EXTENDED_BASE: PB_EXTENDED_BASE_OPERAND (24:8), address
                // bits 56:40 of the following segments.
                4 => exec.pb_extended_base = u64::from(e0 >> 8 & 0x1_ffff),
                // NOP, GP_CRC, PB_CRC (no CRC checking is simulated).
                _ => {}
            }
        }
        exec.gp_get = (exec.gp_get + 1) % entries;
        exec.stats.gp_entries += 1;
        ctx.set_userd_u32(st, USERD_GP_GET, exec.gp_get);
    }
}

/// Executes the dwords of one pushbuffer segment from `start`. `Err(None)`: blocked (the
/// position is saved); `Err(Some(e))`: channel error `e`.
fn segment(
    st: &mut State,
    ctx: &Ctx,
    exec: &mut ChannelExec,
    dwords: &[u32],
    start: u32,
) -> Result<(), Option<u32>> {
    // A u32 like `exec.resume`: a segment has at most 2^21 - 1 dwords.
    let mut i = start;
    while let Some(&d) = dwords.get(i as usize) {
        if let Some(p) = exec.pending {
            match exec.method(ctx, st, p.subch, p.method, d) {
                Step::Next => {}
                Step::Block => {
                    exec.resume = Some(i);
                    return Err(None);
                }
                Step::Error(e) => return Err(Some(e)),
            }
            let left = p.left - 1;
            exec.pending = (left > 0).then_some(Pending {
                left,
                method: match p.mode {
                    Mode::Inc => p.method + 4,
                    Mode::NonInc => p.method,
                    Mode::OneInc => p.method + 4,
                },
                mode: if p.mode == Mode::OneInc {
                    Mode::NonInc
                } else {
                    p.mode
                },
                ..p
            });
            i += 1;
            continue;
        }
        let sec_op = d >> 29;
        let count = d >> 16 & 0x1fff;
        let subch = d >> 13 & 7;
        let method = (d & 0xfff) << 2;
        match sec_op {
            // GRP0_USE_TERT: 0 is a NOP; the sub-device mask operations select GPUs of an SLI
            // group, and the one simulated GPU is always selected.
            0 => {}
            1 | 3 | 5 => {
                let mode = match sec_op {
                    1 => Mode::Inc,
                    3 => Mode::NonInc,
                    _ => Mode::OneInc,
                };
                if count > 0 {
                    exec.pending = Some(Pending {
                        subch,
                        method,
                        left: count,
                        mode,
                    });
                }
            }
            // IMMD_DATA_METHOD: the data is in the header.
            4 => match exec.method(ctx, st, subch, method, count) {
                Step::Next => {}
                Step::Block => {
                    exec.resume = Some(i);
                    return Err(None);
                }
                Step::Error(e) => return Err(Some(e)),
            },
            // END_PB_SEGMENT
            7 => return Ok(()),
            // GRP2_USE_TERT (old non-incrementing format), RESERVED6.
            _ => return Err(Some(ROBUST_CHANNEL_PBDMA_ERROR)),
        }
        i += 1;
    }
    Ok(())
}

/// Puts the idle value into the doorbell of usermode page `block` (once, when its memfd is
/// created for a client mapping).
pub(crate) fn arm_doorbell(st: &mut State, block: u64) {
    if st.fifo.armed_doorbells.insert(block) {
        st.block_write(block, NOTIFY_CHANNEL_PENDING, &DOORBELL_IDLE.to_le_bytes());
    }
}

/// Polls the doorbells of every GPU: a written `NOTIFY_CHANNEL_PENDING` is consumed and the
/// GPU's channels with work are serviced; blocked channels retry their acquire. The pages'
/// `TIME_0`/`TIME_1` get the GPU time (so they advance in steps of [`POLL`]).
pub(crate) fn poll(drv: &SimDriver, st: &mut State) {
    st.fifo
        .armed_doorbells
        .retain(|b| st.blocks.contains_key(b));
    let t = gpu_time();
    for gpu in 0..drv.config.gpus.len() {
        let mut rung = false;
        for page in st.usermode_pages(gpu) {
            arm_doorbell(st, page);
            st.block_write(page, TIME_0, &lo32(t).to_le_bytes());
            st.block_write(page, TIME_1, &((t >> 32) as u32).to_le_bytes());
            let mut b = [0u8; 4];
            if st.block_read(page, NOTIFY_CHANNEL_PENDING, &mut b)
                && u32::from_le_bytes(b) != DOORBELL_IDLE
            {
                st.block_write(page, NOTIFY_CHANNEL_PENDING, &DOORBELL_IDLE.to_le_bytes());
                rung = true;
            }
        }
        service(st, gpu, rung);
    }
}

/// Services the channels of `gpu`: all of them after a doorbell, else the blocked ones.
fn service(st: &mut State, gpu: usize, rung: bool) {
    let ids: Vec<u64> = st
        .fifo
        .channels
        .iter()
        .filter(|(_, c)| c.gpu == gpu && (rung || c.exec.resume.is_some()))
        .map(|(&id, _)| id)
        .collect();
    for id in ids {
        run_channel(st, id);
    }
}

/// Starts the doorbell watcher of `drv` unless it runs. Called with the state locked.
pub(crate) fn ensure_watcher(drv: &SimDriver) {
    if drv.watcher.swap(true, Ordering::AcqRel) {
        return;
    }
    let weak = drv.me.clone();
    let spawned = std::thread::Builder::new()
        .name("nvsim-doorbell".into())
        .spawn(move || {
            loop {
                std::thread::sleep(POLL);
                let Some(drv) = weak.upgrade() else {
                    return;
                };
                let mut st = drv.lock();
                if st.fifo.channels.is_empty() {
                    drv.watcher.store(false, Ordering::Release);
                    return;
                }
                poll(&drv, &mut st);
            }
        });
    if spawned.is_err() {
        drv.watcher.store(false, Ordering::Release);
    }
}

impl SimDriver {
    /// Rings GPU `gpu`'s doorbell (config order) with `token`, as a client's write to
    /// `NOTIFY_CHANNEL_PENDING` does, and services the GPU's channels now (the watcher would
    /// within 500 µs).
    pub fn ring_doorbell(&self, gpu: usize, token: u32) {
        let mut st = self.lock();
        let _ = token; // every pending channel of the GPU is serviced (see the module docs)
        if gpu < self.config.gpus.len() {
            service(&mut st, gpu, true);
        }
    }

    /// The front-end state of channel `h_channel` of client `h_client`.
    pub fn channel_status(&self, h_client: u32, h_channel: u32) -> Option<ChannelStatus> {
        let st = self.lock();
        let Kind::Channel { id, .. } = st.clients.get(&h_client)?.objects().get(&h_channel)?.kind
        else {
            return None;
        };
        let c = st.fifo.channels.get(&id)?;
        Some(ChannelStatus {
            chid: c.chid,
            work_submit_token: crate::channel::work_submit_token(c),
            gp_get: c.exec.gp_get,
            blocked: c.exec.resume.is_some(),
            error: c.exec.error,
            stats: c.exec.stats,
        })
    }

    /// The last value channel `h_channel` of `h_client` wrote to compute-class state method
    /// `method` (recorded without effect; see the module docs).
    pub fn compute_state(&self, h_client: u32, h_channel: u32, method: u32) -> Option<u32> {
        let st = self.lock();
        let Kind::Channel { id, .. } = st.clients.get(&h_client)?.objects().get(&h_channel)?.kind
        else {
            return None;
        };
        st.fifo
            .channels
            .get(&id)?
            .exec
            .i2m
            .state
            .get(&method)
            .copied()
    }

    /// The notifications delivered to the OS event registered for file `file` under `fd`.
    pub fn os_event_notifications(&self, file: i32, fd: u32) -> Option<u64> {
        let st = self.lock();
        st.os_events
            .iter()
            .find(|e| e.file == file && e.fd == fd)
            .map(|e| e.notified)
    }
}

#[cfg(test)]
mod tests {
    use super::reduce;

    #[test]
    fn reductions_follow_the_class_header() {
        // IMIN/IMAX signed and unsigned, 32-bit.
        assert_eq!(reduce(0, true, false, 0xffff_fffe, 1), Some(0xffff_fffe));
        assert_eq!(reduce(0, false, false, 0xffff_fffe, 1), Some(1));
        assert_eq!(reduce(1, true, false, 0xffff_fffe, 1), Some(1));
        assert_eq!(reduce(2, false, false, 0b1100, 0b1010), Some(0b0110));
        assert_eq!(reduce(3, false, false, 0b1100, 0b1010), Some(0b1000));
        assert_eq!(reduce(4, false, false, 0b1100, 0b1010), Some(0b1110));
        assert_eq!(reduce(5, false, false, 0xffff_ffff, 2), Some(1));
        assert_eq!(reduce(5, false, true, 0xffff_ffff, 2), Some(0x1_0000_0001));
        // INC wraps to 0 at the payload, DEC to the payload at 0.
        assert_eq!(reduce(6, false, false, 3, 4), Some(4));
        assert_eq!(reduce(6, false, false, 4, 4), Some(0));
        assert_eq!(reduce(7, false, false, 0, 4), Some(4));
        assert_eq!(reduce(7, false, false, 2, 4), Some(1));
        assert_eq!(reduce(8, false, false, 0, 0), None);
    }
}
