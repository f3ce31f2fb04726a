//! A cheap hasher for maps keyed by our own words (open ids, addresses of our own strings, the
//! ABI table's numbers): keys no tenant chooses or adds, so there is no flooding to resist and
//! SipHash's cost buys nothing (a tenant's number may be looked up, never inserted). Maps
//! keyed by tenant-chosen values (handles) keep the standard hasher or a B-tree.

use std::hash::{BuildHasherDefault, Hasher};

/// `BuildHasher` of [`WordHasher`].
pub(crate) type WordHash = BuildHasherDefault<WordHasher>;

/// A multiplicative hasher (the rustc/Firefox "Fx" mix) over 8-byte words.
#[derive(Default)]
pub(crate) struct WordHasher(u64);

impl Hasher for WordHasher {
    /// The product's high bits, which every input bit reaches, rotated into the low ones the
    /// table indexes by (a key's low bits alone would decide the bucket otherwise: control
    /// numbers differing only in their class would share one).
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
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
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::hash::BuildHasher;

    /// Control numbers share their low bits across classes (`0x20800101`, `0x00800101`): the
    /// buckets a table indexes by the hash's low bits must still spread them.
    #[test]
    fn test_a_tables_control_numbers_spread_over_the_low_bits() {
        let version = "535.261.03".parse().unwrap();
        let abi = nvproxy_abi::find(&version).unwrap().tables();
        let keys: Vec<u32> = abi.controls.keys().copied().collect();
        let low = |k: &u32| WordHash::default().hash_one(k) & 0xfff;
        let buckets: BTreeSet<u64> = keys.iter().map(low).collect();
        // Random hashes of its 193 keys would take ~189 of 4,096 buckets; the product's low
        // bits alone take 139.
        assert!(
            buckets.len() * 10 >= keys.len() * 9,
            "{} keys in {} buckets",
            keys.len(),
            buckets.len()
        );
    }
}
