//! Native-endian integers in byte buffers (the params the fakes and tests build and read).

/// The `u32` at byte `off` of `b`.
pub fn rd32(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().unwrap())
}

/// The `u64` at byte `off` of `b`.
pub fn rd64(b: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(b[off..off + 8].try_into().unwrap())
}

/// Writes `v` at byte `off` of `b`.
pub fn wr32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

/// Writes `v` at byte `off` of `b`.
pub fn wr64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}
