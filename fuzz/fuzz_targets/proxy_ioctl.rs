//! Fuzzes the frontend request path (`ioctl_proxy::Proxy::ioctl`) on the simulated driver with
//! sequences of tenant operations; the invariants are `nvproxy_fuzz::harness`'s.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvproxy_fuzz::harness::{Target, run};

fuzz_target!(|data: &[u8]| {
    nvproxy_fuzz::harness::start_shmem_watchdog(1024);
    run(Target::Proxy, data);
});
