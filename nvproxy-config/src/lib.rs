//! nvproxy's configuration as data and its validation: the daemon's config file ([`Config`],
//! the transport and client-memory enums), policy files and the ABI tables' names they are
//! checked against ([`policy`]), and the choice of tables for a host driver ([`abi_tables`]).
//! It probes nothing itself: what a check needs from the host comes in through [`HostProbe`].

#![forbid(unsafe_code)]

pub mod abi_tables;
mod config;
pub mod policy;
mod probe;

pub use config::*;
pub use probe::HostProbe;
