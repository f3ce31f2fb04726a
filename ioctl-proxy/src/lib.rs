//! The nvproxy request path. Filled by the frontend-proxy issue; nothing here is usable yet.
#![forbid(unsafe_code)]
