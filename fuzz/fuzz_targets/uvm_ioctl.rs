//! Fuzzes the `/dev/nvidia-uvm` request path (`uvm::UvmProxy::ioctl`) on the simulated driver,
//! with the frontend operations its RM setup needs; the invariants are
//! `nvproxy_fuzz::harness`'s.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvproxy_fuzz::harness::{Target, run};

fuzz_target!(|data: &[u8]| {
    nvproxy_fuzz::harness::start_shmem_watchdog(1024);
    run(Target::Uvm, data);
});
