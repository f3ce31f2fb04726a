//! Native-endian field access on params bytes, for the request paths of every node (the
//! frontend's `Plan` and UVM's): one copy of `rd32` and friends. Out-of-range
//! reads are zero and out-of-range writes are ignored: callers size the buffers by the table
//! first, so a short buffer is a bug the zeros keep harmless. Handlers prefer typed reads
//! ([`read_prefix`]) and `offset_of!` over literal offsets (STYLE.md, section 12).

use zerocopy::{FromBytes, IntoBytes};

/// Reads a native-endian `u32` at `off`; 0 when out of range (callers size buffers first).
pub fn rd32(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .map_or(0, |s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

/// Reads a native-endian `u64` at `off`; 0 when out of range.
pub fn rd64(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8).map_or(0, |s| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_ne_bytes(a)
    })
}

/// Writes a native-endian `u32` at `off` (ignored when out of range).
pub fn wr32(b: &mut [u8], off: usize, v: u32) {
    if let Some(s) = b.get_mut(off..off + 4) {
        s.copy_from_slice(&v.to_ne_bytes());
    }
}

/// Writes a native-endian `u64` at `off` (ignored when out of range).
pub fn wr64(b: &mut [u8], off: usize, v: u64) {
    if let Some(s) = b.get_mut(off..off + 8) {
        s.copy_from_slice(&v.to_ne_bytes());
    }
}

/// The 16 bytes of a UUID at `off`; zeros when out of range.
pub fn uuid_at(b: &[u8], off: usize) -> [u8; 16] {
    let mut u = [0u8; 16];
    if let Some(s) = b.get(off..off + 16) {
        u.copy_from_slice(s);
    }
    u
}

/// The leading bytes of `b` as `T`, zeros where `b` is shorter (callers size buffers by `T`
/// first). The frontend's `Plan::get` and UVM's use it.
pub fn read_prefix<T: FromBytes + IntoBytes>(b: &[u8]) -> T {
    match T::read_from_prefix(b) {
        Ok((t, _)) => t,
        Err(_) => {
            let mut t = T::new_zeroed();
            let n = b.len().min(size_of::<T>());
            t.as_mut_bytes()[..n].copy_from_slice(&b[..n]);
            t
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_out_of_range_reads_are_zero() {
        assert_eq!((rd32(&[1, 2], 0), rd64(&[0; 4], 0)), (0, 0));
        assert_eq!(uuid_at(&[1; 8], 0), [0; 16]);
    }

    #[test]
    fn test_read_prefix_zero_fills_a_short_buffer() {
        assert_eq!(read_prefix::<u64>(&[1, 0, 0, 0]), 1);
        assert_eq!(read_prefix::<u32>(&5u32.to_ne_bytes()), 5);
    }
}
