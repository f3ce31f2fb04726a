//! Legacy GSS controls: commands with `RM_GSS_LEGACY_MASK` (`0x8000`) set.
//!
//! The kernel driver does not implement them. `RmDeprecatedGetControlHandler`
//! (`src/nvidia/interface/deprecated/rmapi_deprecated_control.c`) sends every such command on a
//! GPU object of a GSP client GPU to `RmGssLegacyRpcCmd` (`rmapi_gss_legacy_control.c`), before
//! the resource server sees it, so none of `_rmapiRmControl`'s checks apply (no flags check, no
//! params/size agreement, no size table, no strict client-to-file check): the caller's
//! `paramsSize` bytes are copied in, a privileged command (`cmd & 0xC000 == 0xC000`) needs a
//! root-level caller, and the buffer is forwarded to GSP firmware, whose answer (status and, on
//! `NV_OK`, all `paramsSize` bytes) is copied back.
//!
//! What the firmware answers is in no open source: the commands have no names, no layouts and
//! no handlers outside the firmware. The simulator answers only the commands whose answer on a
//! real GPU has been **measured**, and only with the measured shape; every other legacy GSS
//! command gets `NV_ERR_NOT_SUPPORTED`, the status of a command the firmware does not serve.
//!
//! The one public measurement available to us (we have no GPU) is an ioctl trace of `libcuda`'s
//! `cuInit` on a real GA106 with driver 580.159.04, published in the `reindertpelsma/kayfabe`
//! repository (`traces/real_ga106/cuinit_ioctl_trace_real_ga106.txt`, rows 80 and 85 there). It
//! was taken on an Ampere consumer part and a newer driver than the simulated H100 with 535, so
//! the answers below are the measured behaviour of *a* GSP firmware, not of the simulated GPU's:
//! see `tests/nvidia-userspace/RESULTS.md`.

use ioctl_proxy::HostCall;
use nvproxy_abi::structs::NVOS54_PARAMETERS;

use crate::buf::{Loc, bytes, bytes_mut, child};
use crate::driver::State;
use crate::status::*;

/// `RM_GSS_LEGACY_MASK`.
pub const RM_GSS_LEGACY_MASK: u32 = 0x8000;
/// `RM_GSS_LEGACY_MASK_PRIVILEGED`.
pub const RM_GSS_LEGACY_MASK_PRIVILEGED: u32 = 0xc000;

/// One measured firmware answer.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// The command (unnamed: no open source names it).
    pub cmd: u32,
    /// The `paramsSize` the client declared in the measurement.
    pub size: u32,
    /// What the firmware did with the buffer.
    pub answer: Answer,
}

/// A measured firmware answer, applied to the caller's buffer.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    /// `NV_OK` with all bytes as the caller sent them (the driver copied the buffer back, so
    /// "unchanged" is what the firmware returned, not a skipped copy-out).
    Unchanged,
    /// `NV_OK` with these bytes written at offset 0.
    Bytes(&'static [u8]),
}

/// The legacy GSS commands whose answer has been measured on a real GPU (GA106, 580.159.04;
/// see the module documentation). `libcuda` 535's `cuInit` sends `0x20808159` with the same
/// size and the same request words (`2, 0xc, 0, 0x25`, the rest zero) as in the measurement.
pub const MEASURED: &[Measured] = &[
    Measured {
        cmd: 0x2080_8159,
        size: 332,
        answer: Answer::Unchanged,
    },
    Measured {
        cmd: 0x2080_8162,
        size: 1,
        answer: Answer::Bytes(&[1]),
    },
];

/// Handles `p` when the driver would route it to `RmGssLegacyRpcCmd`; `None` when the control
/// takes the normal path (not a legacy GSS command, unknown client, or an object that is not
/// a GPU's, for which `gpuGetByHandle` fails).
pub(crate) fn control(
    st: &State,
    p: &NVOS54_PARAMETERS,
    call: &mut HostCall,
    loc: Loc,
) -> Option<u32> {
    if p.cmd & RM_GSS_LEGACY_MASK == 0 || !st.clients.contains_key(&p.hClient) {
        return None;
    }
    st.gpu_of(p.hClient, p.hObject)?;
    // The simulator's callers are user-level (the proxy's tenants are unprivileged).
    if p.cmd & RM_GSS_LEGACY_MASK_PRIVILEGED == RM_GSS_LEGACY_MASK_PRIVILEGED {
        return Some(NV_ERR_INSUFFICIENT_PERMISSIONS);
    }
    let size = p.paramsSize as usize;
    // portMemExCopyFromUser of paramsSize bytes from params.
    let pbuf = child(call, loc, 16);
    if size != 0 && pbuf.is_none_or(|l| bytes(call, l).len() < size) {
        return Some(NV_ERR_INVALID_ADDRESS);
    }
    let Some(m) = MEASURED
        .iter()
        .find(|m| m.cmd == p.cmd && m.size == p.paramsSize)
    else {
        tracing::debug!(
            cmd = format_args!("{:#x}", p.cmd),
            size,
            "legacy GSS control without a measured firmware answer"
        );
        return Some(NV_ERR_NOT_SUPPORTED);
    };
    if let (Answer::Bytes(b), Some(l)) = (m.answer, pbuf) {
        bytes_mut(call, l)[..b.len()].copy_from_slice(b);
    }
    Some(NV_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_answers_fit_their_sizes_and_are_not_privileged() {
        for m in MEASURED {
            assert_ne!(m.cmd & RM_GSS_LEGACY_MASK, 0);
            assert_ne!(
                m.cmd & RM_GSS_LEGACY_MASK_PRIVILEGED,
                RM_GSS_LEGACY_MASK_PRIVILEGED
            );
            if let Answer::Bytes(b) = m.answer {
                assert!(b.len() <= m.size as usize);
            }
        }
    }
}
