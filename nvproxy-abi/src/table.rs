//! The four per-version dispatch tables and their entries.
//!
//! Every entry carries what a dispatcher needs: the driver's constant name, the number, the
//! parameter struct name(s) and size, the [`Translation`] kind and the [`Caps`] that enable it.
//! Sizes are those of the driver headers of the version (checked by `tests/parity.rs`).

use std::collections::BTreeMap;

use crate::ioctl::{IOC_READ, IOC_WRITE, NV_IOCTL_MAGIC, ioc};
use crate::{Caps, Translation};

/// The payload size rule of an escape (`_IOC_SIZE` of the ioctl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamSize {
    /// Exactly this many bytes.
    Fixed(u32),
    /// One of several layouts told apart by size, in the order of [`EscapeSpec::params`]
    /// (`NV_ESC_RM_ALLOC`: `NVOS21_PARAMETERS` 32 or `NVOS64_PARAMETERS` 48).
    OneOf(&'static [u32]),
    /// An array: the size must be a non-zero multiple of `elem` (`NV_ESC_CARD_INFO`,
    /// `NV_ESC_ATTACH_GPUS_TO_FD`).
    Array {
        /// Size of one element in bytes.
        elem: u32,
    },
}

impl ParamSize {
    /// Whether an `_IOC_SIZE` of `size` bytes is acceptable.
    pub fn accepts(&self, size: u32) -> bool {
        match *self {
            ParamSize::Fixed(n) => size == n,
            ParamSize::OneOf(ns) => ns.contains(&size),
            ParamSize::Array { elem } => size != 0 && elem != 0 && size.is_multiple_of(elem),
        }
    }
}

/// An escape (ioctl on `/dev/nvidiactl` or `/dev/nvidia#`), keyed by `_IOC_NR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EscapeSpec {
    /// `_IOC_NR` of the ioctl.
    pub nr: u8,
    /// The driver's `NV_ESC_*` name.
    pub name: &'static str,
    /// Payload struct name(s) as in the driver headers (`NvU32[]` for a bare id array).
    pub params: &'static [&'static str],
    /// Payload size rule.
    pub size: ParamSize,
    /// What the proxy must do with the payload.
    pub translation: Translation,
    /// Capabilities that enable it.
    pub caps: Caps,
}

impl EscapeSpec {
    /// The full `_IOWR('F', nr, size)` command for a payload of `size` bytes, if the size is
    /// acceptable for this escape.
    pub fn cmd_for_size(&self, size: u32) -> Option<u32> {
        if !self.size.accepts(size) || size >= (1 << crate::ioctl::IOC_SIZEBITS) {
            return None;
        }
        Some(ioc(
            IOC_READ | IOC_WRITE,
            NV_IOCTL_MAGIC,
            self.nr,
            size as usize,
        ))
    }
}

/// A UVM ioctl (on `/dev/nvidia-uvm`), keyed by the full command number. The number carries no
/// size, so the size always comes from here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UvmSpec {
    /// The command number (`UVM_INITIALIZE` = 0x30000001).
    pub cmd: u32,
    /// The driver's `UVM_*` name.
    pub name: &'static str,
    /// The `*_PARAMS` struct, `None` for `UVM_DEINITIALIZE`.
    pub params: Option<&'static str>,
    /// Size of the params in bytes (0 without params).
    pub param_size: u32,
    /// What the proxy must do with the params.
    pub translation: Translation,
    /// Capabilities that enable it.
    pub caps: Caps,
}

/// An RM control (`NV_ESC_RM_CONTROL`, `NVOS54_PARAMETERS.cmd`), keyed by command number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlSpec {
    /// The command number (`class << 16 | category << 8 | index`).
    pub cmd: u32,
    /// The driver's name (`NV2080_CTRL_CMD_*`; gVisor's name for methods without one).
    pub name: &'static str,
    /// The params struct, `None` when the control takes no params.
    pub params: Option<&'static str>,
    /// `sizeof` the params: what RM expects in `NVOS54_PARAMETERS.paramsSize`.
    pub param_size: u32,
    /// What the proxy must do with the params.
    pub translation: Translation,
    /// Capabilities that enable it ([`Caps::NONE`]: admin allowlist only).
    pub caps: Caps,
}

/// An RM allocation class (`NV_ESC_RM_ALLOC`, `hClass`), keyed by class number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassSpec {
    /// The class number.
    pub class: u32,
    /// The driver's class name.
    pub name: &'static str,
    /// The struct RM copies in as `pAllocParms` (`None`: the class takes none).
    pub params: Option<&'static str>,
    /// Its size in bytes (RM derives the copy size from the class, not from `paramsSize`).
    pub param_size: u32,
    /// What the proxy must do with the alloc params.
    pub translation: Translation,
    /// Capabilities that enable it.
    pub caps: Caps,
}

/// The four dispatch tables of one driver version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverAbi {
    /// Escapes by `_IOC_NR`.
    pub escapes: BTreeMap<u8, EscapeSpec>,
    /// UVM ioctls by command number.
    pub uvm: BTreeMap<u32, UvmSpec>,
    /// RM controls by command number.
    pub controls: BTreeMap<u32, ControlSpec>,
    /// RM allocation classes by class number.
    pub classes: BTreeMap<u32, ClassSpec>,
    /// The legacy GSS control categories the version's headers define ([`crate::legacy`]).
    pub legacy_categories: Vec<&'static crate::LegacyCategory>,
    /// Whether `NV_ESC_RM_VID_HEAP_CONTROL`'s `ALLOC_SIZE` honours `NVOS32_ATTR2_USE_EGM`
    /// (attr2 bit 24) and allocates EGM, `NV_MEMORY_EXTENDED_USER`: from 550
    /// (`_rmVidHeapControlAllocCommon`, `rmapi_deprecated_vidheapctrl.c`). Before it the bit
    /// is unused, and the location alone decides between video and system memory.
    pub vid_heap_egm: bool,
}

// Builder helpers used by the version tree. They are called only on our own static data, and
// every builder runs in the tests, so a wrong key is a bug caught there: they panic with the key.
impl DriverAbi {
    pub(crate) fn add_escape(
        &mut self,
        nr: u8,
        name: &'static str,
        params: &'static [&'static str],
        size: ParamSize,
        translation: Translation,
        caps: Caps,
    ) {
        self.escapes.insert(
            nr,
            EscapeSpec {
                nr,
                name,
                params,
                size,
                translation,
                caps,
            },
        );
    }

    pub(crate) fn add_uvm(
        &mut self,
        cmd: u32,
        name: &'static str,
        params: Option<&'static str>,
        param_size: u32,
        translation: Translation,
        caps: Caps,
    ) {
        self.uvm.insert(
            cmd,
            UvmSpec {
                cmd,
                name,
                params,
                param_size,
                translation,
                caps,
            },
        );
    }

    pub(crate) fn add_control(
        &mut self,
        cmd: u32,
        name: &'static str,
        params: Option<&'static str>,
        param_size: u32,
        translation: Translation,
        caps: Caps,
    ) {
        self.controls.insert(
            cmd,
            ControlSpec {
                cmd,
                name,
                params,
                param_size,
                translation,
                caps,
            },
        );
    }

    pub(crate) fn add_class(
        &mut self,
        class: u32,
        name: &'static str,
        params: Option<&'static str>,
        param_size: u32,
        translation: Translation,
        caps: Caps,
    ) {
        self.classes.insert(
            class,
            ClassSpec {
                class,
                name,
                params,
                param_size,
                translation,
                caps,
            },
        );
    }

    pub(crate) fn resize_escape(&mut self, nr: u8, size: u32) {
        let e = self.escapes.get_mut(&nr);
        e.unwrap_or_else(|| panic!("no escape {nr:#x} to resize"))
            .size = ParamSize::Fixed(size);
    }

    pub(crate) fn resize_uvm(&mut self, cmd: u32, size: u32) {
        let e = self.uvm.get_mut(&cmd);
        e.unwrap_or_else(|| panic!("no UVM ioctl {cmd:#x} to resize"))
            .param_size = size;
    }

    pub(crate) fn resize_control(&mut self, cmd: u32, size: u32) {
        let e = self.controls.get_mut(&cmd);
        e.unwrap_or_else(|| panic!("no control {cmd:#x} to resize"))
            .param_size = size;
    }

    pub(crate) fn resize_class(&mut self, class: u32, size: u32) {
        let e = self.classes.get_mut(&class);
        e.unwrap_or_else(|| panic!("no class {class:#x} to resize"))
            .param_size = size;
    }

    // Used by the generated builders when a version drops an entry of that kind.
    #[allow(dead_code)]
    pub(crate) fn remove_escape(&mut self, nr: u8) {
        assert!(
            self.escapes.remove(&nr).is_some(),
            "no escape {nr:#x} to remove"
        );
    }

    #[allow(dead_code)]
    pub(crate) fn remove_uvm(&mut self, cmd: u32) {
        assert!(
            self.uvm.remove(&cmd).is_some(),
            "no UVM ioctl {cmd:#x} to remove"
        );
    }

    pub(crate) fn remove_class(&mut self, class: u32) {
        assert!(
            self.classes.remove(&class).is_some(),
            "no class {class:#x} to remove"
        );
    }

    pub(crate) fn remove_control(&mut self, cmd: u32) {
        assert!(
            self.controls.remove(&cmd).is_some(),
            "no control {cmd:#x} to remove"
        );
    }

    /// The escape with this `_IOC_NR`.
    pub fn escape(&self, nr: u8) -> Option<&EscapeSpec> {
        self.escapes.get(&nr)
    }

    /// The escape whose `NV_ESC_*` name is `name`.
    pub fn escape_by_name(&self, name: &str) -> Option<&EscapeSpec> {
        self.escapes.values().find(|e| e.name == name)
    }

    /// The control whose name is `name`.
    pub fn control_by_name(&self, name: &str) -> Option<&ControlSpec> {
        self.controls.values().find(|e| e.name == name)
    }

    /// The class whose name is `name`.
    pub fn class_by_name(&self, name: &str) -> Option<&ClassSpec> {
        self.classes.values().find(|e| e.name == name)
    }
}

/// Control commands with bit 15 set are GSP "legacy GSS" controls. gVisor forwards every one of
/// them as a simple control without a per-command allowlist or capability check (their params
/// cannot reasonably contain pointers). They are not table entries; a dispatcher that wants the
/// same behaviour tests `cmd & RM_GSS_LEGACY_MASK != 0` before the table lookup.
pub const RM_GSS_LEGACY_MASK: u32 = 0x8000;

/// `RM_GSS_LEGACY_MASK_PRIVILEGED` (`src/nvidia/interface/deprecated/rmapi_deprecated.h`): a
/// legacy GSS control with both bits set needs a root-level caller (`RmGssLegacyRpcCmd` answers
/// anyone else `NV_ERR_INSUFFICIENT_PERMISSIONS`).
pub const RM_GSS_LEGACY_MASK_PRIVILEGED: u32 = 0xc000;

/// Controls of class `NV2081_BINAPI` (`cmd >> 16 == 0x2081`) are forwarded by gVisor as simple
/// controls without a per-command allowlist (GSP passes them through). Like
/// [`RM_GSS_LEGACY_MASK`], a rule for the dispatcher, not table entries.
pub const NV2081_BINAPI_CLASS: u32 = 0x2081;

/// Upper bound gVisor applies to the opaque params of a simple control
/// (`RMAPI_PARAM_COPY_MAX_PARAMS_SIZE`, 1 MiB).
pub const RMAPI_PARAM_COPY_MAX_PARAMS_SIZE: u32 = 1 << 20;
