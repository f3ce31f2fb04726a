//! The channel books of a driver instance: the channel classes, the TSG and channel records
//! kept in `State` (`FifoState`), and the channel and TSG control numbers. `fifo.rs` allocates
//! and controls them; `gpfifo.rs` executes the channels.

use std::collections::{BTreeMap, BTreeSet};

/// `HOPPER_CHANNEL_GPFIFO_A`.
pub const HOPPER_CHANNEL_GPFIFO_A: u32 = 0xc86f;
/// `HOPPER_COMPUTE_A`.
pub const HOPPER_COMPUTE_A: u32 = 0xcbc0;
/// `HOPPER_DMA_COPY_A`.
pub const HOPPER_DMA_COPY_A: u32 = 0xc8b5;

/// `NVC36F_GP_ENTRY__SIZE`: a GPFIFO entry is 8 bytes.
pub(crate) const GP_ENTRY_BYTES: u64 = 8;
/// The USERD of a Volta+ channel is 512 bytes (`NV_RAMUSERD_CHAN_SIZE`).
pub(crate) const USERD_BYTES: u64 = 512;

/// A TSG (`KernelChannelGroup`).
#[derive(Debug)]
pub(crate) struct Tsg {
    pub gpu: usize,
    /// The `NV2080_ENGINE_TYPE_*` of its runlist.
    pub engine_type: u32,
    /// The VA space of the TSG (`hVASpace`, 0: none given).
    pub h_vaspace: u32,
    /// Subcontext ids in use.
    pub subctx: BTreeSet<u32>,
    /// Channels in it.
    pub channels: u32,
    /// `NVA06C_CTRL_CMD_GPFIFO_SCHEDULE` enabled it.
    pub scheduled: bool,
    /// `NVA06C_CTRL_CMD_SET_TIMESLICE` (µs); the default of `kfifoChannelGroupGetDefaultTimeslice`.
    pub timeslice_us: u64,
    /// `NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL`.
    pub interleave: u32,
    /// Legacy mode (`kchangrpapiSetLegacyMode`): its channels came without a context share,
    /// and it holds RM-allocated SYNC and ASYNC context shares (these handles).
    pub legacy: Option<(u32, u32)>,
}

/// A channel (`KernelChannel`).
#[derive(Debug)]
pub(crate) struct Channel {
    pub gpu: usize,
    pub h_client: u32,
    /// The TSG it is in (its `Kind::ChannelGroup` id).
    pub tsg: u64,
    /// `NV2080_ENGINE_TYPE_*` of its runlist.
    pub engine_type: u32,
    pub runlist: u32,
    pub chid: u32,
    /// The RM VA space (`FERMI_VASPACE_A` handle) its context share uses.
    pub h_vaspace: u32,
    /// GPU VA of the GPFIFO ring and its entry count.
    pub gpfifo_va: u64,
    pub gpfifo_entries: u32,
    /// USERD: (memory block, offset into it).
    pub userd: Option<(u64, u64)>,
    /// The error notifier (`hObjectError`): (block, offset 0) of a memory object, if given.
    pub error_notifier: Option<u64>,
    /// `NVA06F_CTRL_CMD_GPFIFO_SCHEDULE` / the TSG's schedule enabled it.
    pub scheduled: bool,
    /// The engine objects on it: handle → (class, `NV2080_ENGINE_TYPE_*` of its engine).
    pub objects: BTreeMap<u32, (u32, u32)>,
    /// Front-end state (`gpfifo.rs`).
    pub exec: crate::gpfifo_state::ChannelExec,
}

/// Channel state of a driver instance (in [`State`](crate::driver::State)).
#[derive(Debug, Default)]
pub(crate) struct FifoState {
    pub tsgs: BTreeMap<u64, Tsg>,
    /// Channels by id (their `Kind::Channel` id).
    pub channels: BTreeMap<u64, Channel>,
    /// Channel ids in use per (GPU, runlist).
    pub chids: BTreeSet<(usize, u32, u32)>,
    /// Usermode pages whose doorbell holds the "nothing written" value (`gpfifo.rs`).
    pub armed_doorbells: BTreeSet<u64>,
}

/// `kfifoGenerateWorkSubmitToken_GA100`: `NV_CTRL_VF_DOORBELL_RUNLIST_ID` (22:16) and
/// `_VECTOR` (11:0, the channel id).
pub(crate) fn work_submit_token(c: &Channel) -> u32 {
    ((c.runlist & 0x7f) << 16) | (c.chid & 0xfff)
}

/// Channel and TSG control numbers.
pub mod cmd {
    /// `NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE`.
    pub const GR_GET_CTX_BUFFER_SIZE: u32 = 0x2080_1218;
    /// `NV2080_CTRL_CMD_MC_SERVICE_INTERRUPTS`.
    pub const MC_SERVICE_INTERRUPTS: u32 = 0x2080_1702;
    /// `NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST` (two embedded `u32` arrays).
    pub const DEVICE_FIFO_GET_CHANNELLIST: u32 = 0x0080_170d;
    /// `NV906F_CTRL_CMD_RESET_CHANNEL`.
    pub const RESET_CHANNEL: u32 = 0x906f_0102;
    /// `NV83DE_CTRL_CMD_DEBUG_SET_MODE_MMU_DEBUG`.
    pub const DEBUG_SET_MODE_MMU_DEBUG: u32 = 0x83de_0307;
    /// `NV83DE_CTRL_CMD_DEBUG_SET_EXCEPTION_MASK`.
    pub const DEBUG_SET_EXCEPTION_MASK: u32 = 0x83de_0309;
    /// `NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE`.
    pub const GR_SET_CTXSW_PREEMPTION_MODE: u32 = 0x2080_1210;
    /// `NVA06C_CTRL_CMD_GPFIFO_SCHEDULE`.
    pub const TSG_GPFIFO_SCHEDULE: u32 = 0xa06c_0101;
    /// `NVA06C_CTRL_CMD_SET_TIMESLICE`.
    pub const TSG_SET_TIMESLICE: u32 = 0xa06c_0103;
    /// `NVA06C_CTRL_CMD_GET_TIMESLICE`.
    pub const TSG_GET_TIMESLICE: u32 = 0xa06c_0104;
    /// `NVA06C_CTRL_CMD_PREEMPT`.
    pub const TSG_PREEMPT: u32 = 0xa06c_0105;
    /// `NVA06C_CTRL_CMD_GET_INFO`.
    pub const TSG_GET_INFO: u32 = 0xa06c_0106;
    /// `NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL`.
    pub const TSG_SET_INTERLEAVE_LEVEL: u32 = 0xa06c_0107;
    /// `NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL`.
    pub const CHANNEL_SET_INTERLEAVE_LEVEL: u32 = 0xa06f_0109;
    /// `NVA06F_CTRL_CMD_GPFIFO_SCHEDULE`.
    pub const CHANNEL_GPFIFO_SCHEDULE: u32 = 0xa06f_0103;
    /// `NV906F_CTRL_GET_CLASS_ENGINEID` in the Volta channel's range (until 555).
    pub const GET_CLASS_ENGINEID: u32 = 0xc36f_0101;
    /// `NV906F_CTRL_GET_CLASS_ENGINEID`.
    pub const GET_CLASS_ENGINEID_906F: u32 = 0x906f_0101;
    /// `NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN`.
    pub const GET_WORK_SUBMIT_TOKEN: u32 = 0xc36f_0108;
    /// `NVC36F_CTRL_CMD_GPFIFO_SET_WORK_SUBMIT_TOKEN_NOTIF_INDEX`.
    pub const SET_WORK_SUBMIT_TOKEN_NOTIF_INDEX: u32 = 0xc36f_010a;
}
