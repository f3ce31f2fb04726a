//! `libnvproxy_preload.so`, the in-container mmap shim. Filled by the UVM/mmap issue: this
//! library intercepts nothing yet.
#![forbid(unsafe_code)]
