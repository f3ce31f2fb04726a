//! NVIDIA driver ioctl ABI: `#[repr(C)]` parameter structs named as in the driver headers, the
//! escape / UVM / control / class numbers, and the sparse tree of driver versions whose nodes
//! build the four per-version dispatch tables. Data only: no I/O, no logging, no `unsafe`.
#![forbid(unsafe_code)]
