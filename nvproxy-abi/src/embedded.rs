//! The user pointers embedded in RM control params that the driver itself copies in or out
//! (`src/nvidia/src/kernel/rmapi/embedded_param_copy.c`, `embeddedParamCopyIn`; abi-facts
//! `embedded_pointer_controls`), for the controls in our tables.
//!
//! This is safety data: a control whose params carry such a pointer must never reach the driver
//! with the tenant's address in it (the driver would copy from or to the *daemon's* address
//! space). The request path redirects each pointer listed here to a daemon buffer of `count *
//! elem` bytes. Offsets come from the structs in [`crate::structs`], whose layouts the parity
//! test checks against every driver version; `tests/pointers.rs` checks this table against the
//! facts' `embedded_pointer_controls` of every node, and that every entry marked
//! [`Translation::Simple`](crate::Translation::Simple) has no pointer or fd member other than the
//! address values of [`ADDRESS_MEMBERS`].

use core::mem::offset_of;

use crate::structs::*;

/// How many elements a pointer names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// The `u32` at this offset of the params (facts: `count` names a member).
    Field(usize),
    /// The square of the `u32` at this offset (`GET_P2P_CAPS`: `gpuCount * gpuCount`); zero
    /// when the pointer is null, as the driver computes it (facts: `count` is the local
    /// `numEntries` of `embeddedParamCopyIn`).
    Square(usize),
}

/// One embedded pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Embedded {
    /// Offset of the `NvP64` in the params.
    pub ptr: usize,
    /// Element count.
    pub count: Count,
    /// Element size in bytes.
    pub elem: usize,
    /// Copied in from the client (else zero-filled: `SKIP_COPYIN`, with or without
    /// `ZERO_BUFFER`; zero-filling is the safe choice either way).
    pub copy_in: bool,
    /// Copied back to the client (else `SKIP_COPYOUT`).
    pub copy_out: bool,
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

/// The embedded pointers of control `cmd` whose params are `params_size` bytes (empty for a
/// control without any). The size picks the layout where one changed (`GET_P2P_CAPS` gained
/// `busEgmPeerIds` in 550).
///
/// `NV0080_CTRL_CMD_MSENC_GET_CAPS` is deep-copied by RM up to 550 only; from 555 on the driver
/// lists no copy for it, and it has no RM method either (RM answers `NV_ERR_NOT_SUPPORTED`
/// before any copy), so redirecting its pointer stays harmless there.
pub fn embedded(cmd: u32, params_size: u32) -> &'static [Embedded] {
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

/// `NvP64` members that the driver reads as an address *value* and never dereferences, so an
/// entry whose params have them may still be copied to the driver unchanged
/// ([`Translation::Simple`](crate::Translation::Simple)): `(struct, member, where the driver uses
/// it)`. Every other pointer member of a simple entry's params fails the parity test
/// (`tests/pointers.rs`). The abi-facts README lists the first two ("carry the CPU mapping
/// address"); the others were read in the driver sources of 580.142.
pub const ADDRESS_MEMBERS: [(&str, &str, &str); 4] = [
    (
        "NVOS34_PARAMETERS",
        "pLinearAddress",
        "NV_ESC_RM_UNMAP_MEMORY: the key of the CPU mapping to remove (mapping_cpu.c, \
         refFindCpuMappingWithFilter)",
    ),
    (
        "NVOS56_PARAMETERS",
        "pOldCpuAddress",
        "NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO: the key of the CPU mapping (osapi.c, \
         RmUpdateDeviceMappingInfo)",
    ),
    (
        "NVOS56_PARAMETERS",
        "pNewCpuAddress",
        "NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO: stored as the mapping's new address (osapi.c, \
         RmUpdateDeviceMappingInfo)",
    ),
    (
        "NV_MEMORY_ALLOCATION_PARAMS",
        "address",
        "[OUT] in nvos.h; stdmemValidateParams (standard_mem.c) sets it to NULL",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_offsets_match_abi_facts() {
        // From abi-facts embedded_pointer_controls (ptr_offset); tests/pointers.rs checks the
        // whole table against every version.
        assert_eq!(embedded(0x2080_0122, 48)[0].ptr, 24);
        assert_eq!(embedded(0x0000_0127, 168)[0].ptr, 160);
        assert_eq!(embedded(0x0000_0127, 176)[1].ptr, 168);
        assert_eq!(embedded(0x83de_0315, 24)[0].ptr, 16);
        assert_eq!(embedded(0x0080_170d, 24)[1].ptr, 16);
        assert!(embedded(0x2080_0101, 8).is_empty());
    }
}
