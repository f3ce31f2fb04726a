//! The nvproxy request path: the pieces that sit between a decoded CUSE ioctl and the host
//! driver. This crate does not depend on `cuse-dev`: it sees client memory through
//! [`ClientMemory`] and the driver through [`HostDriver`].
//!
//! State today: the host-driver and client-memory interfaces and the object table exist and are
//! tested; the dispatcher that uses them (escape decoding, policy, fd and pointer translation,
//! audit) is the frontend-proxy issue's work and is not here yet.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod host;
pub mod memory;
pub mod objects;

pub use host::{HostCall, HostDriver, HostFile, NestedBuf, NodeKind};
pub use memory::{ClientMemory, MemError};
pub use objects::{ObjectError, ObjectTable, OwnerId};
