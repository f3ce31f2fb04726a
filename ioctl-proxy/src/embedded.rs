//! The user pointers embedded in RM control params that the driver itself copies: the table is
//! safety data and lives in `nvproxy-abi` (`nvproxy_abi::embedded`), where the parity test checks
//! it against the facts of every driver version.

pub(crate) use nvproxy_abi::embedded::{Count, embedded};
