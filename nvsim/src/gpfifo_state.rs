//! The front-end state of a channel (`ChannelExec`, kept in its `Channel` record): the
//! subchannel bindings, the method and engine state a run leaves behind, and the counters of
//! what it executed. `gpfifo.rs` executes with it.

/// How a method header's data dwords advance the method (`NVC86F_DMA_SEC_OP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Inc,
    NonInc,
    OneInc,
}

/// A method header whose data dwords are still coming (they may continue in the next
/// segment, as on hardware).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    pub subch: u32,
    pub method: u32,
    pub left: u32,
    pub mode: Mode,
}

/// The copy engine's method state.
#[derive(Debug, Default, Clone)]
pub(crate) struct CeState {
    pub sem: [u32; 4],
    pub phys: [u32; 2],
    pub offset_in: [u32; 2],
    pub offset_out: [u32; 2],
    pub pitch_in: u32,
    pub pitch_out: u32,
    pub line_length: u32,
    pub line_count: u32,
    pub remap_const: [u32; 2],
    pub remap_components: u32,
}

/// The compute class' inline-to-memory and report-semaphore state.
#[derive(Debug, Default, Clone)]
pub(crate) struct I2mState {
    pub line_length: u32,
    pub line_count: u32,
    pub offset_out: [u32; 2],
    pub pitch_out: u32,
    /// The inline transfer being filled: (launch flags, bytes received).
    pub active: Option<(u32, u64)>,
    pub sem: [u32; 3],
    pub report: [u32; 3],
    pub pcas_a: u32,
    /// The other compute methods: the last value written to each (state for the SMs).
    pub state: std::collections::BTreeMap<u32, u32>,
}

/// Counters of what a channel executed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ExecStats {
    /// GPFIFO entries consumed.
    pub gp_entries: u64,
    /// Methods executed (host and engine).
    pub methods: u64,
    /// Semaphore releases and reductions written.
    pub semaphore_writes: u64,
    /// Semaphore acquires that blocked the channel (each retry counts).
    pub acquire_waits: u64,
    /// Copy-engine transfers, and the bytes they wrote.
    pub copies: u64,
    /// Bytes written by copies, memsets and inline-to-memory.
    pub bytes_written: u64,
    /// Non-stall interrupts raised.
    pub nonstall_interrupts: u64,
    /// Compute-class methods recorded without effect.
    pub compute_state_methods: u64,
}

/// Front-end state of one channel.
#[derive(Debug, Default)]
pub(crate) struct ChannelExec {
    /// `NVC36F_CTRL_CMD_GPFIFO_SET_WORK_SUBMIT_TOKEN_NOTIF_INDEX`.
    pub token_notif_index: Option<u32>,
    /// Host's `GP_GET`.
    pub gp_get: u32,
    /// The class bound to each subchannel by `SET_OBJECT`.
    pub subch: [u32; 8],
    /// `SEM_ADDR_LO/HI`, `SEM_PAYLOAD_LO/HI`.
    pub sem: [u32; 4],
    /// `SEMAPHOREA..C`.
    pub legacy_sem: [u32; 3],
    pub pending: Option<Pending>,
    /// Where a blocked acquire stopped: the dword of the current GPFIFO entry to resume at.
    pub resume: Option<u32>,
    /// `SET_PB_SEGMENT_EXTENDED_BASE`: pushbuffer address bits 56:40.
    pub pb_extended_base: u64,
    pub ce: CeState,
    pub i2m: I2mState,
    /// The channel error raised (the `ROBUST_CHANNEL_*` exception type): it executes nothing
    /// more.
    pub error: Option<u32>,
    pub stats: ExecStats,
}
