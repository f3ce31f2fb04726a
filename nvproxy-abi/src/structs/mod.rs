//! `#[repr(C)]` parameter structs, named exactly as in the driver headers.
//!
//! Every struct derives zerocopy's `FromBytes`, `IntoBytes`, `KnownLayout` and `Immutable`, names
//! each padding byte (`_padN`), and pins its size, alignment and field offsets at compile time.
//! The parity test (`tests/parity.rs`) checks the same numbers against the facts of every
//! version in the tree. Where a layout changed between versions, the newer layout is a separate
//! type with a `_Vxxx` suffix naming the branch that introduced it; the plain name is the oldest
//! layout in the tree (535). Unions are exposed as byte arrays with accessors where the proxy
//! needs a member.
//!
//! Which layout a version uses follows from the table entry's param size (the variants of one
//! struct differ in size), except for `nv_ioctl_export_to_dma_buf_fd_t_V570`/`_V580`, which have
//! the same size and differ only in a byte of tail padding the proxy does not read.
#![allow(non_camel_case_types, non_snake_case)]

mod alloc;
mod ctrl;
mod frontend;
mod uvm;

pub use alloc::*;
pub use ctrl::*;
pub use frontend::*;
pub use uvm::*;

/// `NvHandle` (`nvtypes.h`): an RM object handle.
pub type NvHandle = u32;
/// `NvP64` (`nvtypes.h`): a pointer in the *client's* address space, carried as 64 bits.
pub type NvP64 = u64;
/// `NvV32`: a 32-bit value of no particular type.
pub type NvV32 = u32;
