//! The user pointers embedded in RM control params that the driver itself copies
//! (`src/nvidia/src/kernel/rmapi/embedded_param_copy.c`; abi-facts `embedded_pointer_controls`),
//! for the controls in our tables. Offsets come from the `nvproxy-abi` structs, which the parity
//! test checks against every driver version.

use core::mem::offset_of;

use nvproxy_abi::structs::*;

/// How many elements a pointer names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    /// The `u32` at this offset of the params.
    Field(usize),
    /// The square of the `u32` at this offset (`GET_P2P_CAPS`: `gpuCount * gpuCount`); zero
    /// when the pointer is null, as the driver computes it.
    Square(usize),
}

/// One embedded pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Embedded {
    /// Offset of the `NvP64` in the params.
    pub(crate) ptr: usize,
    /// Element count.
    pub(crate) count: Count,
    /// Element size in bytes.
    pub(crate) elem: usize,
    /// Copied in from the client (else zero-filled: `SKIP_COPYIN | ZERO_BUFFER`).
    pub(crate) copy_in: bool,
    /// Copied back to the client (else `SKIP_COPYOUT`).
    pub(crate) copy_out: bool,
}

const fn list(ptr: usize, count: usize, elem: usize) -> Embedded {
    Embedded {
        ptr,
        count: Count::Field(count),
        elem,
        copy_in: true,
        copy_out: true,
    }
}

const fn caps(ptr: usize, count: usize) -> Embedded {
    Embedded {
        ptr,
        count: Count::Field(count),
        elem: 1,
        copy_in: false,
        copy_out: true,
    }
}

macro_rules! off {
    ($t:ty, $f:ident) => {
        offset_of!($t, $f)
    };
}

const GET_ENGINES: [Embedded; 1] = [list(
    off!(NV2080_CTRL_GPU_GET_ENGINES_PARAMS, engineList),
    off!(NV2080_CTRL_GPU_GET_ENGINES_PARAMS, engineCount),
    4,
)];
const BUS_GET_INFO: [Embedded; 1] = [list(
    off!(NV2080_CTRL_BUS_GET_INFO_PARAMS, busInfoList),
    off!(NV2080_CTRL_BUS_GET_INFO_PARAMS, busInfoListSize),
    8,
)];
const FB_GET_INFO: [Embedded; 1] = [list(
    off!(NV2080_CTRL_FB_GET_INFO_PARAMS, fbInfoList),
    off!(NV2080_CTRL_FB_GET_INFO_PARAMS, fbInfoListSize),
    8,
)];
const GR_GET_INFO_2080: [Embedded; 1] = [list(
    off!(NV2080_CTRL_GR_GET_INFO_PARAMS, grInfoList),
    off!(NV2080_CTRL_GR_GET_INFO_PARAMS, grInfoListSize),
    8,
)];
const GR_GET_INFO_0080: [Embedded; 1] = [list(
    off!(NV0080_CTRL_GR_GET_INFO_PARAMS, grInfoList),
    off!(NV0080_CTRL_GR_GET_INFO_PARAMS, grInfoListSize),
    8,
)];
const BIOS_GET_INFO: [Embedded; 1] = [list(
    off!(NV2080_CTRL_BIOS_GET_INFO_PARAMS, biosInfoList),
    off!(NV2080_CTRL_BIOS_GET_INFO_PARAMS, biosInfoListSize),
    8,
)];
const SURFACE_INFO: [Embedded; 1] = [list(
    off!(NV0041_CTRL_GET_SURFACE_INFO_PARAMS, surfaceInfoList),
    off!(NV0041_CTRL_GET_SURFACE_INFO_PARAMS, surfaceInfoListSize),
    8,
)];
const CLASSLIST: [Embedded; 1] = [list(
    off!(NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS, classList),
    off!(NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS, numClasses),
    4,
)];
const EXEC_REG_OPS: [Embedded; 1] = [list(
    off!(NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS, regOps),
    off!(NV2080_CTRL_GPU_EXEC_REG_OPS_PARAMS, regOpCount),
    32,
)];
const CHANNELLIST: [Embedded; 2] = [
    Embedded {
        copy_out: false,
        ..list(
            off!(NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS, pChannelHandleList),
            off!(NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS, numChannels),
            4,
        )
    },
    list(
        off!(NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS, pChannelList),
        off!(NV0080_CTRL_FIFO_GET_CHANNELLIST_PARAMS, numChannels),
        4,
    ),
];
const GR_GET_CAPS: [Embedded; 1] = [caps(
    off!(NV0080_CTRL_GR_GET_CAPS_PARAMS, capsTbl),
    off!(NV0080_CTRL_GR_GET_CAPS_PARAMS, capsTblSize),
)];
const FB_GET_CAPS: [Embedded; 1] = [caps(
    off!(NV0080_CTRL_FB_GET_CAPS_PARAMS, capsTbl),
    off!(NV0080_CTRL_FB_GET_CAPS_PARAMS, capsTblSize),
)];
const FIFO_GET_CAPS: [Embedded; 1] = [caps(
    off!(NV0080_CTRL_FIFO_GET_CAPS_PARAMS, capsTbl),
    off!(NV0080_CTRL_FIFO_GET_CAPS_PARAMS, capsTblSize),
)];
const MSENC_GET_CAPS: [Embedded; 1] = [caps(
    off!(NV0080_CTRL_MSENC_GET_CAPS_PARAMS, capsTbl),
    off!(NV0080_CTRL_MSENC_GET_CAPS_PARAMS, capsTblSize),
)];
const READ_MEMORY: [Embedded; 1] = [caps(
    off!(NV83DE_CTRL_DEBUG_READ_MEMORY_PARAMS, buffer),
    off!(NV83DE_CTRL_DEBUG_READ_MEMORY_PARAMS, length),
)];
const P2P_CAPS: [Embedded; 1] = [Embedded {
    ptr: off!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS, busPeerIds),
    count: Count::Square(off!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS, gpuCount)),
    elem: 4,
    copy_in: false,
    copy_out: true,
}];
const P2P_CAPS_V550: [Embedded; 2] = [
    Embedded {
        ptr: off!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550, busPeerIds),
        ..P2P_CAPS[0]
    },
    Embedded {
        ptr: off!(NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550, busEgmPeerIds),
        ..P2P_CAPS[0]
    },
];

/// The embedded pointers of control `cmd` whose params are `params_size` bytes.
pub(crate) fn embedded(cmd: u32, params_size: u32) -> &'static [Embedded] {
    match cmd {
        0x0000_0127
            if params_size as usize == size_of::<NV0000_CTRL_SYSTEM_GET_P2P_CAPS_PARAMS_V550>() =>
        {
            &P2P_CAPS_V550
        }
        0x0000_0127 => &P2P_CAPS,
        0x0041_0110 => &SURFACE_INFO,
        0x0080_0201 => &CLASSLIST,
        0x0080_1102 => &GR_GET_CAPS,
        0x0080_1104 => &GR_GET_INFO_0080,
        0x0080_1301 => &FB_GET_CAPS,
        0x0080_1701 => &FIFO_GET_CAPS,
        0x0080_170d => &CHANNELLIST,
        0x0080_1b01 => &MSENC_GET_CAPS,
        0x2080_0122 => &EXEC_REG_OPS,
        0x2080_0123 => &GET_ENGINES,
        0x2080_0802 => &BIOS_GET_INFO,
        0x2080_1201 => &GR_GET_INFO_2080,
        0x2080_1301 => &FB_GET_INFO,
        0x2080_1802 => &BUS_GET_INFO,
        0x83de_0315 => &READ_MEMORY,
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_offsets_match_abi_facts() {
        // From abi-facts embedded_pointer_controls (ptr_offset).
        assert_eq!(embedded(0x2080_0122, 48)[0].ptr, 24);
        assert_eq!(embedded(0x0000_0127, 168)[0].ptr, 160);
        assert_eq!(embedded(0x0000_0127, 176)[1].ptr, 168);
        assert_eq!(embedded(0x83de_0315, 24)[0].ptr, 16);
        assert_eq!(embedded(0x0080_170d, 24)[1].ptr, 16);
    }
}
