//! The fuzz harnesses of nvproxy's request path, shared by the cargo-fuzz targets
//! (`fuzz_targets/`) and the corpus tests (`tests/corpus.rs`).
//!
//! - [`input`]: the input format (decoding is total; [`input::Op::encode`] is its inverse).
//! - [`mem`]: the tenant's memory and fd table as one request sees them, with the read-once
//!   and reservation checks.
//! - [`harness`]: two instances on one `nvsim::SimDriver`, the operations, the invariants.
//! - [`fd_frames`]: frames with surplus fds through the worker's fd receive path.
//! - [`seeds`]: the deterministic seed corpus (CUDA-like initialisations and a few hostile
//!   variations), written to `corpus/<target>/` by `tests/corpus.rs`.

pub mod fd_frames;
pub mod harness;
pub mod input;
pub mod mem;
pub mod seeds;
