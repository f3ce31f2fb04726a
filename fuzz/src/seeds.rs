//! Seed inputs.
use crate::harness::Target;

/// The seeds of `target`: (file name, bytes).
pub fn seeds(target: Target) -> Vec<(&'static str, Vec<u8>)> {
    let _ = target;
    Vec::new()
}
