//! The channel front end: what a channel executes when its doorbell rings.

/// Front-end state of one channel.
#[derive(Debug, Default)]
pub(crate) struct ChannelExec {
    /// `NVC36F_CTRL_CMD_GPFIFO_SET_WORK_SUBMIT_TOKEN_NOTIF_INDEX`.
    pub token_notif_index: Option<u32>,
}
