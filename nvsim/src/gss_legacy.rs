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
//! A legacy command is an ordinary control number with `NVxxxx_CTRL_LEGACY_NON_PRIVILEGED`
//! (0x80) or `_PRIVILEGED` (0xC0) or-ed into its category byte (`ctrlxxxx.h`; the categories
//! are in `nvproxy_abi::legacy`), and GSP-RM serves it as the control with those bits cleared.
//! Where the open source implements that control, the simulator serves it the same way (the
//! CUDA clock limit, `0x809909` = `NV0080_CTRL_CMD_PERF_CUDA_LIMIT_SET_CONTROL`, in
//! `perf.rs`). The other messages libcuda sends are named by no header of any tag (a scan of
//! every tag's `ctrl2080gpu.h`/`ctrl2080clk.h`): their answer lives only in the firmware, so
//! the simulator answers only those whose answer on a real GPU has been **measured**, and only
//! with the measured shape; every other legacy GSS command gets `NV_ERR_NOT_SUPPORTED`, the
//! status of a command the firmware does not serve (measured for `NV2080_CTRL_CLK_LEGACY_
//! NON_PRIVILEGED 0x38`; not known for `NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x61`, see
//! `tests/nvidia-userspace/RESULTS.md`).
//!
//! The one public measurement available to us (we have no GPU) is an ioctl trace of `libcuda`'s
//! `cuInit` on a real GA106 with driver 580.159.04, published in the `reindertpelsma/kayfabe`
//! repository (`traces/real_ga106/cuinit_ioctl_trace_real_ga106.txt`, rows 80 and 85 there). It
//! was taken on an Ampere consumer part and a newer driver than the simulated H100 with 535, so
//! the answers below are the measured behaviour of *a* GSP firmware, not of the simulated GPU's:
//! see `tests/nvidia-userspace/RESULTS.md`.

use host_driver::HostCall;
use nvproxy_abi::structs::NVOS54_PARAMETERS;
use nvproxy_abi::{RM_GSS_LEGACY_MASK, RM_GSS_LEGACY_MASK_PRIVILEGED};

use crate::buf::{Loc, bytes, bytes_mut, child};
use crate::config::SimGpu;
use crate::driver::{SimDriver, State};
use crate::status::*;

/// One measured firmware answer.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// The command: its category is a legacy one the headers define, its message none
    /// (each entry's comment gives the name [`nvproxy_abi::LegacyControl`] prints).
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
    /// `NV_OK` with the whole buffer replaced: these little-endian words, then zeros (the
    /// zero tail was measured too).
    Words(&'static [u32]),
}

/// The legacy GSS commands whose answer has been measured on a real GPU (GA106, 580.159.04;
/// see the module documentation). `libcuda` 535's `cuInit` sends `0x20808159` with the same
/// size and the same request words (`2, 0xc, 0, 0x25`, the rest zero) as in the measurement.
pub const MEASURED: &[Measured] = &[
    // NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x59 (GPU category 0x01; no header names message
    // 0x59).
    Measured {
        cmd: 0x2080_8159,
        size: 332,
        answer: Answer::Unchanged,
    },
    // NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x62.
    Measured {
        cmd: 0x2080_8162,
        size: 1,
        answer: Answer::Bytes(&[1]),
    },
    // The CLK/PERF legacy controls libcuda sends for cuDeviceGetAttribute and the CUDA
    // runtime at its initialisation; measured replies of the same GA106
    // (`reindertpelsma/kayfabe`, `crates/kayfabe-rmrpc/src/cudartinit.rs`: "[measured
    // 2026-08-20, real GA106 (RTX 3060) on 580.159.04]").
    // NV2080_CTRL_CLK_LEGACY_NON_PRIVILEGED 0x09 (CLK category 0x10; ctrl2080clk.h defines
    // no command in any tag).
    Measured {
        cmd: 0x2080_9009,
        size: 8,
        answer: Answer::Words(&[0x0, 0xd]),
    },
    // NV2080_CTRL_CLK_LEGACY_NON_PRIVILEGED 0x01.
    Measured {
        cmd: 0x2080_9001,
        size: 8,
        answer: Answer::Words(&[0x03fc_007f, 0x0]),
    },
    // NV2080_CTRL_CLK_LEGACY_NON_PRIVILEGED 0x64.
    Measured {
        cmd: 0x2080_9064,
        size: 520,
        answer: Answer::Words(&[0x0, 0x2, 0x1, 0x1, 0x1, 0x64, 0x4, 0x10, 0x1, 0x64]),
    },
];

/// Handles `p` when the driver would route it to `RmGssLegacyRpcCmd`; `None` when the control
/// takes the normal path (not a legacy GSS command, unknown client, or an object that is not
/// a GPU's, for which `gpuGetByHandle` fails).
pub(crate) fn control(
    drv: &SimDriver,
    st: &mut State,
    p: &NVOS54_PARAMETERS,
    call: &mut HostCall,
    loc: Loc,
) -> Option<u32> {
    if p.cmd & RM_GSS_LEGACY_MASK == 0 || !st.clients.contains_key(&p.hClient) {
        return None;
    }
    let gpu = st.gpu_of(p.hClient, p.hObject)?;
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
    // GSP-RM serves a legacy command as the control with the legacy bits cleared; where the
    // open source implements that control, it is served with the same semantics.
    if p.cmd & !RM_GSS_LEGACY_MASK_PRIVILEGED == crate::perf::PERF_CUDA_LIMIT_SET_CONTROL {
        // The firmware's resource server checks the size against the control's params
        // (`_rmapiRmControl`, control.c: NV_ERR_INVALID_ARGUMENT) and finds the control only
        // on a device (`resControlLookup`: NV_ERR_NOT_SUPPORTED elsewhere).
        let Some(l) =
            pbuf.filter(|_| p.paramsSize == crate::perf::PERF_CUDA_LIMIT_CONTROL_PARAMS_SIZE)
        else {
            return Some(NV_ERR_INVALID_ARGUMENT);
        };
        let on = bytes(call, l)[0] != 0;
        return Some(
            crate::perf::cuda_limit_set(st, p.hClient, p.hObject, on)
                .unwrap_or(NV_ERR_NOT_SUPPORTED),
        );
    }
    if let Some(status) = clocks(&drv.config.gpus[gpu], p, call, pbuf) {
        return Some(status);
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
    match (m.answer, pbuf) {
        (Answer::Bytes(b), Some(l)) => bytes_mut(call, l)[..b.len()].copy_from_slice(b),
        (Answer::Words(w), Some(l)) => {
            let out = &mut bytes_mut(call, l)[..size];
            out.fill(0);
            for (i, word) in w.iter().enumerate() {
                out[4 * i..4 * i + 4].copy_from_slice(&word.to_le_bytes());
            }
        }
        _ => {}
    }
    Some(NV_OK)
}

/// `0x2080a084` (4 bytes) and `0x2080a026` (532 bytes), `NV2080_CTRL_PERF_LEGACY_NON_PRIVILEGED`
/// messages 0x84 and 0x26 (PERF category 0x20; no header names them): the clock queries libcuda sends for
/// `cuDeviceGetAttribute(CLOCK_RATE / MEMORY_CLOCK_RATE)` (and the CUDA runtime at its start).
///
/// Layout as measured on a real GA102 with 580.159.04 (`reindertpelsma/kayfabe`,
/// `crates/kf-abi/src/gssreplay.rs`, 136 bare-metal calls): `0x2080a084` is answered `NV_OK`
/// with nothing written. `0x2080a026`'s request carries `0x400` at 0 and an entry count at
/// 0x10, then 16-byte entries from 0x14 of `{domain, 0, kHz (out), 0}`, asked for the GPC
/// (`0x1`) and memory (`0x10`) clock domains; the firmware writes the maximum clock of each in
/// kHz, a byte 2 at 4 and the words 4 at 8 and 1 at 0x0c (their meaning is unknown; they are
/// written as measured). The clocks themselves are the simulated GPU's
/// ([`SimGpu::max_gpc_clock_khz`], [`SimGpu::max_memory_clock_khz`]). A request of another
/// shape, or for a domain other than these two, gets `NV_ERR_NOT_SUPPORTED`: that is not a
/// measured answer.
fn clocks(
    gpu: &SimGpu,
    p: &NVOS54_PARAMETERS,
    call: &mut HostCall,
    pbuf: Option<Loc>,
) -> Option<u32> {
    const DOMAIN_GPC: u32 = 0x1;
    const DOMAIN_MCLK: u32 = 0x10;
    match (p.cmd, p.paramsSize, pbuf) {
        (0x2080_a084, 4, Some(_)) => Some(NV_OK),
        (0x2080_a026, 532, Some(l)) => {
            let b = bytes_mut(call, l);
            let word = |b: &[u8], at: usize| {
                u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
            };
            let count = word(b, 0x10) as usize;
            if word(b, 0) != 0x400 || count == 0 || 0x14 + 16 * count > 532 {
                return Some(NV_ERR_NOT_SUPPORTED);
            }
            let mut khz = Vec::with_capacity(count);
            for i in 0..count {
                khz.push(match word(b, 0x14 + 16 * i) {
                    DOMAIN_GPC => gpu.max_gpc_clock_khz,
                    DOMAIN_MCLK => gpu.max_memory_clock_khz,
                    _ => return Some(NV_ERR_NOT_SUPPORTED),
                });
            }
            for (i, k) in khz.into_iter().enumerate() {
                let at = 0x14 + 16 * i + 8;
                b[at..at + 4].copy_from_slice(&k.to_le_bytes());
            }
            b[4] = 2;
            b[8..12].copy_from_slice(&4u32.to_le_bytes());
            b[12..16].copy_from_slice(&1u32.to_le_bytes());
            Some(NV_OK)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every measured command is a message of a legacy category the headers define, and the
    /// name the audit trail gives it is the category's and the message's.
    #[test]
    fn measured_commands_are_messages_of_defined_legacy_categories() {
        let v: nvproxy_abi::DriverVersion = "535.261.03".parse().unwrap();
        let t = nvproxy_abi::find(&v).unwrap().tables();
        let names: Vec<String> = MEASURED
            .iter()
            .map(|m| {
                t.legacy_control(m.cmd)
                    .expect("a defined category")
                    .to_string()
            })
            .collect();
        assert_eq!(
            names,
            [
                "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x59",
                "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x62",
                "NV2080_CTRL_CLK_LEGACY_NON_PRIVILEGED 0x09",
                "NV2080_CTRL_CLK_LEGACY_NON_PRIVILEGED 0x01",
                "NV2080_CTRL_CLK_LEGACY_NON_PRIVILEGED 0x64",
            ]
        );
        for cmd in [0x2080_a084, 0x2080_a026] {
            assert!(
                t.legacy_control(cmd)
                    .unwrap()
                    .to_string()
                    .starts_with("NV2080_CTRL_PERF_LEGACY_NON_PRIVILEGED ")
            );
        }
    }

    #[test]
    fn measured_answers_fit_their_sizes_and_are_not_privileged() {
        for m in MEASURED {
            assert_ne!(m.cmd & RM_GSS_LEGACY_MASK, 0);
            assert_ne!(
                m.cmd & RM_GSS_LEGACY_MASK_PRIVILEGED,
                RM_GSS_LEGACY_MASK_PRIVILEGED
            );
            match m.answer {
                Answer::Bytes(b) => assert!(b.len() <= m.size as usize),
                Answer::Words(w) => assert!(4 * w.len() <= m.size as usize),
                Answer::Unchanged => {}
            }
        }
    }
}
