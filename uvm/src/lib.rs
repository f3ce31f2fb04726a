//! `/dev/nvidia-uvm` handlers. Filled by the UVM/mmap issue; nothing here is usable yet.
#![forbid(unsafe_code)]
