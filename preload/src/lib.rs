//! `libnvproxy_preload.so`, the in-container mmap shim.
//!
//! CUSE has no `mmap`, so `mmap()` of one of nvproxy's nodes fails with `ENODEV` in the kernel.
//! Preloaded into a client (`LD_PRELOAD`; `nvproxy exec`/`run` inject it), this library
//! interposes `mmap` and `mmap64` and, for our nodes only, maps a host file descriptor the daemon
//! hands over instead (the protocol is in [`proto`], the `preload-proto` crate the daemon shares):
//!
//! - `MAP_ANONYMOUS` or a negative fd: the next `mmap` at once, no extra syscall.
//! - Any other file: one `fstat`. Not a character device whose number is in `NVPROXY_NODES`:
//!   the next `mmap`, unchanged.
//! - A listed device number: `NVPROXY_IOC_HELLO` confirms it is ours, once per file identity
//!   (`st_dev`, `st_ino`, `st_rdev`; see `cache`). Then the kernel's and libc's argument checks
//!   (errno as on the real node), a ticket from the node (`NVPROXY_IOC_MMAP_TICKET`), the ticket
//!   sent over the instance socket, the host fd received by `SCM_RIGHTS`, the next `mmap` of that
//!   fd with the caller's exact addr, length, prot and flags at offset + the daemon's adjustment,
//!   and the fd closed again. Errors: the errno the driver (through the daemon) or the kernel
//!   gives; `ENODEV` when the daemon cannot be reached (as without the shim), `EACCES` when it
//!   refuses the ticket. `NVPROXY_SHIM_DEBUG=1` prints one line on stderr per failed proxied mmap.
//!
//! The shim is a convenience, never a security boundary: the daemon checks every ticket itself.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub use nvproxy_preload_proto as proto;

mod cache;
#[allow(unsafe_code)]
mod channel;
mod config;
#[allow(unsafe_code)]
mod devpoll;
#[allow(unsafe_code)]
mod devshim;
mod route;
#[allow(unsafe_code)]
mod shim;
