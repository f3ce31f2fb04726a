//! GPU memory quotas and UVM (`ioctl_proxy` `vidmem.rs`): `UVM_MAP_EXTERNAL_ALLOCATION` keeps
//! its own reference to RM video memory, so a tenant that maps an allocation and frees the RM
//! object still holds the memory: it stays counted until the range is freed or the UVM file is
//! released.

mod common;

use common::*;
use ioctl_proxy::{InstancePolicy, ProxyError};
use nvproxy_abi::Caps;
use nvproxy_abi::ioctl::*;
use nvproxy_abi::status::NV_ERR_NO_MEMORY;

const GIB: u64 = 1 << 30;
const H_MEM: u32 = 0xcafe_0100;
const BASE: u64 = 0x7f00_0000_0000;
const PARAMS_AT: u64 = 0x20_0000;

fn env() -> Env {
    let host = FakeHost::new("535.261.03", &HOST_GPUS);
    let mut policy = InstancePolicy::new("q", Caps::COMPUTE_UTILITY, vec![1]);
    policy.quotas.gpu_memory = Some(10 * GIB);
    Env::with(&host, policy)
}

/// `RM_ALLOC` of `NV01_MEMORY_LOCAL_USER` of `bytes` under the client: its status.
fn vid(env: &mut Env, h: u32, bytes: u64) -> u32 {
    let mut mp = vec![0u8; 120];
    wr64(&mut mp, 64, bytes);
    env.mem.map(PARAMS_AT, &mp);
    let mut p = vec![0u8; 48];
    wr32(&mut p, 0, env.client);
    wr32(&mut p, 4, env.client);
    wr32(&mut p, 8, h);
    wr32(&mut p, 12, 0x40);
    wr64(&mut p, 16, PARAMS_AT);
    wr32(&mut p, 32, 120);
    frontend(env, nv_iowr(0x2b, 48), &p, 40)
}

fn free(env: &mut Env, h: u32) -> u32 {
    let mut p = vec![0u8; 16];
    wr32(&mut p, 0, env.client);
    wr32(&mut p, 4, env.client);
    wr32(&mut p, 8, h);
    frontend(env, nv_iowr(0x29, 16), &p, 12)
}

fn frontend(env: &mut Env, cmd: u32, p: &[u8], status: usize) -> u32 {
    let at = 0x30_0000;
    env.mem.map(at, p);
    env.mem.begin_request();
    let r: Result<i32, ProxyError> =
        env.proxy
            .ioctl(env.ctl, &CALLER, cmd, at, &mut env.mem, &env.fds);
    assert_eq!(r.unwrap(), 0);
    rd32(&env.mem.get(at, p.len()), status)
}

fn map_external(env: &mut Env) {
    let ext = env.size(UVM_MAP_EXTERNAL_ALLOCATION);
    let mut p = vec![0u8; ext];
    wr64(&mut p, 0, BASE);
    wr64(&mut p, 8, 8 * GIB);
    p[24..40].copy_from_slice(&gpu_uuid(1));
    wr64(&mut p, ext - 24, 1);
    wr32(&mut p, ext - 16, FD_CTL as u32);
    wr32(&mut p, ext - 12, env.client);
    wr32(&mut p, ext - 8, H_MEM);
    let (r, out) = env.uvm(UVM_MAP_EXTERNAL_ALLOCATION, &p);
    assert_eq!(r.unwrap(), 0);
    assert_eq!(rd32(&out, ext - 4), 0, "mapped");
}

fn used(env: &Env) -> u64 {
    env.proxy.gpu_memory_used()[0].1
}

#[test]
fn test_bypass_a_uvm_mapping_then_free_keeps_the_memory_counted_until_the_range_goes() {
    let mut env = env();
    assert_eq!(vid(&mut env, H_MEM, 8 * GIB), 0);
    map_external(&mut env);
    assert_eq!(free(&mut env, H_MEM), 0);
    assert_eq!(used(&env), 8 * GIB, "UVM's reference keeps the memory");
    assert_eq!(vid(&mut env, H_MEM + 1, 4 * GIB), NV_ERR_NO_MEMORY);
    // UVM_FREE of the range lets it go.
    let mut f = vec![0u8; env.size(UVM_FREE)];
    wr64(&mut f, 0, BASE);
    wr64(&mut f, 8, 8 * GIB);
    let (r, _) = env.uvm(UVM_FREE, &f);
    assert_eq!(r.unwrap(), 0);
    assert_eq!(used(&env), 0);
    assert_eq!(vid(&mut env, H_MEM + 1, 4 * GIB), 0);
}

#[test]
fn test_bypass_a_uvm_mapping_is_given_back_with_the_uvm_file() {
    let mut env = env();
    assert_eq!(vid(&mut env, H_MEM, 8 * GIB), 0);
    map_external(&mut env);
    assert_eq!(free(&mut env, H_MEM), 0);
    assert_eq!(used(&env), 8 * GIB);
    env.uvm.release(env.open);
    assert_eq!(used(&env), 0);
}
