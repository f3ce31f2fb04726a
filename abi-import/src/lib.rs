//! `abi-import` as a library: the facts pipeline (`from_source`: facts from a driver source tree;
//! `extract`: the part the tables need), the tree generator (`tree_gen`; `add`: a new release
//! into the index and the tree in one step) and the host-side
//! self-service (`host`: check a driver tree against the tree, write and verify node files for
//! an unknown version), used by the `abi-import` tool and by `nvproxy abi` / `nvproxy serve`.

#![forbid(unsafe_code)]

pub mod add;
pub mod extract;
pub mod from_source;
pub mod host;
pub mod suggest;
pub mod tree_gen;
