//! NVIDIA driver ioctl ABI: `#[repr(C)]` parameter structs named as in the driver headers, the
//! escape / UVM / control / class numbers, and the sparse tree of driver versions whose nodes
//! build the four per-version dispatch tables. Data only: no I/O, no logging, no `unsafe`.
//!
//! - [`structs`]: the param structs (zerocopy), with compile-time layout asserts.
//! - [`ioctl`]: `_IOC` helpers and command numbers.
//! - [`DriverVersion`], [`find`], [`nodes`], [`AbiNode`]: the version tree ([`tree`] explains its
//!   shape).
//! - [`DriverAbi`]: one version's escapes, UVM ioctls, controls and classes, each entry with its
//!   param size, [`Translation`] kind and [`Caps`].
//! - [`embedded`]: the user pointers RM itself copies out of control params (safety data).
//! - [`render`]: text for `nvproxy abi versions | show | diff`.
//!
//! The layouts and numbers are checked against facts taken from the driver headers of every
//! version in the tree (`facts/*.json`, `tests/parity.rs`); `ADDING_A_DRIVER_VERSION.md` at the
//! repository root is the runbook for a new driver.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod caps;
pub mod class;
pub mod embedded;
mod error;
pub mod fd_field;
pub mod ioctl;
pub mod legacy;
pub mod render;
pub mod status;
pub mod structs;
mod table;
pub mod tree;
mod version;

pub use caps::{Caps, Translation};
pub use error::AbiError;
pub use legacy::{LEGACY_CATEGORIES, LegacyCategory, LegacyControl, legacy_categories};
pub use table::{
    ClassSpec, ControlSpec, DriverAbi, EscapeSpec, NV2081_BINAPI_CLASS, ParamSize,
    RM_GSS_LEGACY_MASK, RM_GSS_LEGACY_MASK_PRIVILEGED, RMAPI_PARAM_COPY_MAX_PARAMS_SIZE, UvmSpec,
};
pub use tree::{AbiNode, Support, find, nodes};
pub use version::DriverVersion;
