//! A cheap hasher for maps keyed by our own words (open ids, addresses of our own strings):
//! keys no tenant chooses, so there is no flooding to resist and SipHash's cost buys nothing.
//! Maps keyed by tenant-chosen values (handles) keep the standard hasher.

use std::hash::{BuildHasherDefault, Hasher};

/// `BuildHasher` of [`WordHasher`].
pub(crate) type WordHash = BuildHasherDefault<WordHasher>;

/// A multiplicative hasher (the rustc/Firefox "Fx" mix) over 8-byte words.
#[derive(Default)]
pub(crate) struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_ne_bytes(w));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}
