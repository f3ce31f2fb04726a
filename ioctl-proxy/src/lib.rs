//! The nvproxy request path: the pieces that sit between a decoded CUSE ioctl and the host
//! driver. This crate does not depend on `cuse-dev`: it sees client memory through
//! [`ClientMemory`], the driver through [`HostDriver`], and the caller's fd table through
//! [`FdResolver`].
//!
//! - [`Proxy`]: one instance's frontend (`/dev/nvidiactl`, `/dev/nvidia<N>`) request path:
//!   dispatch by the ABI table, policy ([`InstancePolicy`]), handle checks ([`ObjectTable`]),
//!   fd and pointer translation, GPU-set isolation, audit ([`AuditSink`], [`AuditCounts`]).
//! - the driver boundary ([`HostDriver`], [`HostFile`]) is the `host-driver` crate, which also
//!   holds the real driver.
//! - [`service`]: [`NodeService`], the one entry of every node's request path (the frontend
//!   here, `/dev/nvidia-uvm` in the `uvm` crate): span, in-flight quota, accounting, the
//!   answer of a handler's stop; [`Plan`]: a host call under construction from the client's
//!   params (typed reads, rewritten fields the client gets back, copy-out); [`bytes`]: field
//!   access on params bytes. Both paths use them.
//! - [`memory`]: the caller's memory and the retry-transport contract.
//! - [`schedule`]: an instance's scheduling priority and the scheduling controls tenants may
//!   not use.
//!
//! The daemon implements three traits: [`ClientMemory`] (per request), [`FdResolver`] (per
//! request) and [`AuditSink`] (per instance).

#![deny(missing_docs)]
#![deny(unsafe_code)]

mod alloc;
pub mod audit;
pub mod bytes;
pub mod checkpoint;
mod control;
mod embedded;
mod error;
mod frontend;
mod gpus;
mod handles;
mod hash;
mod hostctl;
pub mod kit;
pub mod live;
mod mapping;
mod mapping_slot;
pub mod memory;
mod nv;
pub mod objects;
mod osdesc;
pub mod plan;
pub mod policy;
mod proxy;
mod replay;
mod request;
pub mod schedule;
pub mod service;
mod vid_books;
mod vidmem;

pub use audit::{AuditCounts, AuditEvent, AuditSink, CountRow, Decision, Kind, NullSink};
pub use checkpoint::{Checkpoint, CheckpointError, DeviceIdentity};
pub use control::OPAQUE_LEGACY;
pub use error::ProxyError;
pub use host_driver::{
    HandedFile, HostCall, HostDriver, HostFile, NESTED_PTR_PLACEHOLDER, NestedBuf, NodeKind,
};
pub use memory::{ClientMemory, MemError};
pub use objects::{HOST_POOL, ObjectError, ObjectTable, OwnerId, VidCharge};
pub use osdesc::{MAX_OS_DESCRIPTOR_BYTES, MAX_OS_DESCRIPTORS};
pub use plan::{Buf, Outputs, Params, Plan};
pub use policy::{InstancePolicy, Mode, Quotas, Verdict};
pub use proxy::{
    Caller, FdError, FdResolver, FrontendNode, GpuInfo, InFlight, Node, OpenId, Proxy,
};
pub use replay::{GpuRef, RemapRule, Restored, make_remapping};
pub use schedule::{InlineNice, NiceCaller, Priority, install_nice_caller};
pub use service::NodeService;
