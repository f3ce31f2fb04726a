//! Fixtures shared by the tests of several crates, so that they are written once and cannot
//! drift apart: that is this crate's one job. It is a dev-dependency only (`publish = false`);
//! no crate's library or binary depends on it.
//!
//! - [`eventually`]: wait, bounded, for a condition instead of sleeping a fixed time and
//!   asserting afterwards.
//! - [`TestDir`]: a scratch directory removed when dropped, also when the test fails.
//! - with the default feature `fakes`, the request path's fakes for `ioctl-proxy` and `uvm`:
//!   a recording host driver ([`FakeHost`], [`Driver`]), sparse client memory that fails any
//!   test reading a client byte twice in one request ([`FakeMem`]), the caller's fd table
//!   ([`FakeFds`]), an audit sink that keeps events ([`Events`]), and byte helpers
//!   ([`rd32`], [`wr32`], …).
//!
//! `ioctl-proxy` and `uvm` take this crate as a dev-dependency while it depends on
//! `ioctl-proxy`: cargo allows that cycle for integration tests (`tests/*.rs`), which link the
//! same `ioctl-proxy` library as the kit. Unit tests inside `ioctl-proxy` (`#[cfg(test)]`)
//! cannot use the fakes: there the kit's `ioctl-proxy` is another copy of the crate.
#![forbid(unsafe_code)]

mod dir;
mod wait;
pub use dir::TestDir;
pub use wait::eventually;

#[cfg(feature = "fakes")]
mod bytes;
#[cfg(feature = "fakes")]
mod fds;
#[cfg(feature = "fakes")]
mod host;
#[cfg(feature = "fakes")]
mod mem;

#[cfg(feature = "fakes")]
pub use bytes::{rd32, rd64, wr32, wr64};
#[cfg(feature = "fakes")]
pub use fds::{CALLER, Events, FakeFds};
#[cfg(feature = "fakes")]
pub use host::{Driver, FakeHost, HOST_GPUS, INVALID_ID, Seen, UvmCall};
#[cfg(feature = "fakes")]
pub use mem::FakeMem;
