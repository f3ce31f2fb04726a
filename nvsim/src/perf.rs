//! The CUDA clock limit: `NV0080_CTRL_CMD_PERF_CUDA_LIMIT_SET_CONTROL` (0x801909), which
//! libcuda sends with `bCudaLimit = 1` as the last call of context creation and with 0 at
//! context destruction (native traces: `shared/reference/native-traces.md` §2, §3.4).
//!
//! From 550.40.07 the kernel serves it (`deviceCtrlCmdKPerfCudaLimitSetControl_IMPL`,
//! `src/nvidia/src/kernel/gpu/perf/kern_cuda_limit.c`); 535's kernel has the same function but
//! exports no control for it, so libcuda 535 sends the legacy form 0x809909, which the kernel
//! forwards to GSP-RM (`RmGssLegacyRpcCmd`), whose answer a real H100 gives is `NV_OK` (the
//! context creation that ends with it succeeds natively, derpsteb/libcuda-debug traces). Both
//! are served here with the kernel function's semantics, the only open implementation:
//! - a reference count per `NV01_DEVICE_0` object (`Device.nCudaLimitRefCnt`): `TRUE` adds
//!   one, `FALSE` removes one, and `FALSE` at zero is `NV_ERR_INVALID_REQUEST`
//!   (`kperfCudaLimitCliSet`);
//! - the GPU's clocks are limited while any device of it holds a reference (the internal
//!   `NV0080_CTRL_CMD_INTERNAL_PERF_CUDA_LIMIT_SET_CONTROL` is sent only on a 0↔1 edge of
//!   a device's count, and `..._DISABLE` when a device with references is freed,
//!   `deviceKPerfCudaLimitCliDisable` from `deviceDestruct`): freeing the device object drops
//!   its references with it;
//! - the parameter byte is left as sent (a native GA106 with 580.159.04 answers `01` → `01`
//!   and `00` → `00`, nvkvm-old `traces/nvdiff_w274/host_vh/ce_r1.jsonl` records 396, 430).

use crate::driver::{Kind, State};
use crate::status::*;

/// `NV0080_CTRL_CMD_PERF_CUDA_LIMIT_SET_CONTROL`: class 0x0080, category PERF (0x19),
/// message `NV0080_CTRL_PERF_CUDA_LIMIT_CONTROL_PARAMS_MESSAGE_ID` (0x09).
pub const PERF_CUDA_LIMIT_SET_CONTROL: u32 = 0x0080_1909;
/// `sizeof(NV0080_CTRL_PERF_CUDA_LIMIT_CONTROL_PARAMS)`: one `NvBool`.
pub const PERF_CUDA_LIMIT_CONTROL_PARAMS_SIZE: u32 = 1;

/// `deviceCtrlCmdKPerfCudaLimitSetControl` on device `h_device` of client `h_client` with
/// `bCudaLimit = on`. `None` when the object is not a device (the control is a device's).
pub(crate) fn cuda_limit_set(
    st: &mut State,
    h_client: u32,
    h_device: u32,
    on: bool,
) -> Option<u32> {
    let cuda_limit_refs = st
        .clients
        .get_mut(&h_client)?
        .cuda_limit_refs_mut(h_device)?;
    Some(if on {
        // The count is an NvU32 in the driver; a client cannot hold 2^32 contexts, but the
        // simulator refuses the wrap rather than overflow.
        match cuda_limit_refs.checked_add(1) {
            Some(n) => {
                *cuda_limit_refs = n;
                NV_OK
            }
            None => NV_ERR_INVALID_REQUEST,
        }
    } else if *cuda_limit_refs > 0 {
        *cuda_limit_refs -= 1;
        NV_OK
    } else {
        NV_ERR_INVALID_REQUEST
    })
}

/// Whether GPU `gpu`'s clocks are under the CUDA limit: some device object of it holds a
/// reference.
pub(crate) fn cuda_limited(st: &State, gpu: usize) -> bool {
    st.clients.values().any(|c| {
        c.objects().values().any(|o| {
            matches!(o.kind, Kind::Device { gpu: g, cuda_limit_refs, .. } if g == gpu && cuda_limit_refs > 0)
        })
    })
}
