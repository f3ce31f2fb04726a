//! The UVM request path against a recording fake driver: what reaches the host, byte for
//! byte, and what the client sees.

mod common;

use std::sync::Arc;

use common::*;
use ioctl_proxy::{Decision, FdError, InstancePolicy, Kind, Mode, ProxyError};
use nvproxy_abi::Caps;
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use uvm::nv::*;

fn errno(r: &Result<i32, ProxyError>) -> Option<i32> {
    r.as_ref().err().map(ProxyError::errno)
}

/// Params of `size` bytes with the UUID of the instance's first GPU at every offset in
/// `uuids`.
fn params(size: usize, uuids: &[usize]) -> Vec<u8> {
    let mut p = vec![0u8; size];
    for &o in uuids {
        p[o..o + 16].copy_from_slice(&gpu_uuid(1));
    }
    p
}

#[test]
fn test_every_allowlisted_command_uses_the_table_size_in_every_version() {
    for node in nvproxy_abi::nodes() {
        let version = node.version.to_string();
        let host = FakeHost::new(&version, &HOST_GPUS);
        let mut policy = InstancePolicy::new("t", Caps::ALL_CONTAINER, vec![1]);
        policy.mode = Mode::Enforce;
        let mut env = Env::with(&host, policy);
        for e in node.tables().uvm.values() {
            host.clear();
            env.mem.reads.clear();
            let size = e.param_size as usize;
            let (r, _) = env.uvm(e.cmd, &vec![0u8; size.max(1)]);
            assert!(r.is_ok(), "{version} {}: {r:?}", e.name);
            if size == 0 {
                // UVM_DEINITIALIZE: nothing read, forwarded without params.
                assert!(env.mem.reads.is_empty(), "{version} {}", e.name);
                assert_eq!(host.uvm_calls()[0].params.len(), 0);
                continue;
            }
            assert_eq!(env.mem.reads, vec![(TOP, size)], "{version} {}", e.name);
            // A zero UUID names no GPU of the instance: those commands stop in the proxy;
            // the others reach the host with exactly the table's size.
            for c in host.uvm_calls() {
                assert_eq!(c.params.len(), size, "{version} {}", e.name);
                assert_eq!(c.cmd, e.cmd);
            }
        }
    }
}

#[test]
fn test_sizes_that_changed_between_versions() {
    for (version, free, unreg, ext, pool) in [
        ("535.261.03", 24, 28, 1200, 1184),
        ("550.163.01", 24, 28, 9264, 9248),
        ("580.142", 24, 28, 9264, 9248),
        ("590.48.01", 16, 12, 9264, 9248),
        ("595.45.04", 16, 12, 9264, 9248),
    ] {
        let env = Env::version(version);
        assert_eq!(env.size(UVM_FREE), free, "{version}");
        assert_eq!(env.size(UVM_UNREGISTER_CHANNEL), unreg, "{version}");
        assert_eq!(env.size(UVM_MAP_EXTERNAL_ALLOCATION), ext, "{version}");
        assert_eq!(env.size(UVM_ALLOC_SEMAPHORE_POOL), pool, "{version}");
        let mut env = env;
        env.host.clear();
        let (r, _) = env.uvm(UVM_FREE, &vec![0; free]);
        assert_eq!(r.unwrap(), 0);
        assert_eq!(env.host.uvm_calls()[0].params.len(), free, "{version}");
        // UNREGISTER_CHANNEL with the instance's client and, before 590, GPU.
        let mut p = vec![0u8; unreg];
        let at = if unreg == 28 {
            p[..16].copy_from_slice(&gpu_uuid(1));
            16
        } else {
            0
        };
        wr32(&mut p, at, env.client);
        wr32(&mut p, at + 4, env.client);
        env.host.clear();
        let (r, _) = env.uvm(UVM_UNREGISTER_CHANNEL, &p);
        assert_eq!(r.unwrap(), 0);
        assert_eq!(env.host.uvm_calls()[0].params, p, "{version}");
    }
}

#[test]
fn test_initialize_forces_multi_process_sharing_and_hides_it() {
    for (client, host_sees) in [(0u64, 2u64), (2, 2), (1, 3), (3, 3)] {
        let mut env = Env::new();
        let mut p = vec![0u8; 16];
        wr64(&mut p, 0, client);
        let (r, out) = env.uvm(UVM_INITIALIZE, &p);
        assert_eq!(r.unwrap(), 0);
        let seen = &env.host.uvm_calls()[0];
        assert_eq!(
            (seen.cmd, rd64(&seen.params, 0)),
            (UVM_INITIALIZE, host_sees)
        );
        assert_eq!(rd64(&out, 0), client, "the client reads back its own flags");
    }
    // The driver's status reaches the client.
    let mut env = Env::new();
    env.host.set_uvm_status(8, NV_ERR_INVALID_ARGUMENT);
    let (_, out) = env.uvm(UVM_INITIALIZE, &[0u8; 16]);
    assert_eq!((rd32(&out, 8), rd64(&out, 0)), (NV_ERR_INVALID_ARGUMENT, 0));
}

#[test]
fn test_mm_initialize_translates_only_uvm_fds() {
    let mut env = Env::new();
    let host_uvm2 = env.uvm.host_file(env.open2).unwrap().id();
    let mut p = vec![0u8; 8];
    wr32(&mut p, 0, FD_UVM2 as u32);
    let (r, out) = env.uvm(UVM_MM_INITIALIZE, &p);
    assert_eq!(r.unwrap(), 0);
    let seen = env.host.uvm_calls();
    assert_eq!(rd32(&seen[0].params, 0) as i32, host_uvm2);
    assert_eq!(
        rd32(&out, 0) as i32,
        FD_UVM2,
        "the client keeps its fd number"
    );

    // A frontend fd, an unknown fd, a negative fd: NV_ERR_INVALID_ARGUMENT, host untouched.
    for fd in [FD_CTL, 99, -1] {
        env.host.clear();
        wr32(&mut p, 0, nvproxy_abi::fd_field::to_u32(fd));
        let (r, out) = env.uvm(UVM_MM_INITIALIZE, &p);
        assert_eq!(r.unwrap(), 0, "fd {fd}");
        assert_eq!(rd32(&out, 4), NV_ERR_INVALID_ARGUMENT, "fd {fd}");
        assert!(env.host.uvm_calls().is_empty());
    }
    // A resolution failure is the resolver's errno.
    env.fds.0.insert(7, Err(FdError::Errno(libc::EPERM)));
    wr32(&mut p, 0, 7);
    let (r, _) = env.uvm(UVM_MM_INITIALIZE, &p);
    assert_eq!(errno(&r), Some(libc::EPERM));
    // (Another instance's fds never resolve: the daemon's resolver only knows the
    // instance's own nodes.)
}

#[test]
fn test_rm_ctrl_fd_translation() {
    let mut env = Env::new();
    let host_ctl = env.proxy.host_file_id(env.ctl).unwrap();
    let reg = |fd: i32, client: u32| {
        let mut p = params(40, &[0]);
        wr32(&mut p, 24, nvproxy_abi::fd_field::to_u32(fd));
        wr32(&mut p, 28, client);
        p
    };
    // A frontend fd becomes its host file; the client sees its own number back.
    let (r, out) = env.uvm(UVM_REGISTER_GPU, &reg(FD_CTL, env.client));
    assert_eq!(r.unwrap(), 0);
    assert_eq!(rd32(&env.host.uvm_calls()[0].params, 24) as i32, host_ctl);
    assert_eq!(rd32(&out, 24) as i32, FD_CTL);
    // Negative passes through untranslated (the driver never reads it).
    env.host.clear();
    let (r, _) = env.uvm(UVM_REGISTER_GPU, &reg(-1, 0));
    assert_eq!(r.unwrap(), 0);
    assert_eq!(rd32(&env.host.uvm_calls()[0].params, 24) as i32, -1);
    // A UVM fd or a foreign fd: EINVAL (gVisor's answer), nothing forwarded.
    for fd in [FD_UVM2, 99] {
        env.host.clear();
        let (r, _) = env.uvm(UVM_REGISTER_GPU, &reg(fd, env.client));
        assert_eq!(errno(&r), Some(libc::EINVAL), "fd {fd}");
        assert!(env.host.uvm_calls().is_empty());
    }
    // Every rmCtrlFd-carrying struct is translated.
    let ext = env.size(UVM_MAP_EXTERNAL_ALLOCATION);
    let client = env.client;
    let cases: Vec<(u32, Vec<u8>, usize)> = vec![
        (
            UVM_REGISTER_GPU_VASPACE,
            {
                let mut p = params(32, &[0]);
                wr32(&mut p, 16, FD_CTL as u32);
                wr32(&mut p, 20, client);
                wr32(&mut p, 24, client);
                p
            },
            16,
        ),
        (
            UVM_REGISTER_CHANNEL,
            {
                let mut p = params(56, &[0]);
                wr32(&mut p, 16, FD_CTL as u32);
                wr32(&mut p, 20, client);
                wr32(&mut p, 24, client);
                p
            },
            16,
        ),
        (
            UVM_MAP_EXTERNAL_ALLOCATION,
            {
                let mut p = params(ext, &[24]);
                wr64(&mut p, ext - 24, 1);
                wr32(&mut p, ext - 16, FD_CTL as u32);
                wr32(&mut p, ext - 12, client);
                wr32(&mut p, ext - 8, client);
                p
            },
            ext - 16,
        ),
    ];
    for (cmd, p, at) in cases {
        env.host.clear();
        let (r, out) = env.uvm(cmd, &p);
        assert_eq!(r.unwrap(), 0, "{cmd:#x}");
        assert_eq!(
            rd32(&env.host.uvm_calls()[0].params, at) as i32,
            host_ctl,
            "{cmd:#x}"
        );
        assert_eq!(out, p, "{cmd:#x}: the client's struct comes back unchanged");
    }
}

/// Every UUID-carrying struct in the 535-550 layouts: (cmd, UUID offset, status offset,
/// size, whether the CPU UUID is accepted).
fn uuid_fields(env: &Env) -> Vec<(u32, usize, usize, usize, bool)> {
    let pref = if uvm_preferred_location_v550(env.proxy.abi()) {
        36
    } else {
        32
    };
    vec![
        (UVM_REGISTER_GPU, 0, 36, 40, false),
        (UVM_UNREGISTER_GPU, 0, 16, 20, false),
        (UVM_REGISTER_GPU_VASPACE, 0, 28, 32, false),
        (UVM_UNREGISTER_GPU_VASPACE, 0, 16, 20, false),
        (UVM_REGISTER_CHANNEL, 0, 48, 56, false),
        (UVM_ENABLE_PEER_ACCESS, 0, 32, 36, false),
        (UVM_ENABLE_PEER_ACCESS, 16, 32, 36, false),
        (UVM_DISABLE_PEER_ACCESS, 0, 32, 36, false),
        (UVM_DISABLE_PEER_ACCESS, 16, 32, 36, false),
        (UVM_SET_PREFERRED_LOCATION, 16, pref, 40, true),
        (UVM_SET_ACCESSED_BY, 16, 32, 40, true),
        (UVM_UNSET_ACCESSED_BY, 16, 32, 40, true),
        (UVM_MIGRATE, 16, 72, 80, true),
        (UVM_MIGRATE_RANGE_GROUP, 8, 24, 32, true),
        (UVM_MAP_DYNAMIC_PARALLELISM_REGION, 16, 32, 40, false),
        (UVM_UNMAP_EXTERNAL, 16, 32, 40, false),
        (UVM_PAGEABLE_MEM_ACCESS_ON_GPU, 0, 20, 24, false),
    ]
}

/// `UVM_UNREGISTER_CHANNEL`'s `gpuUuid` is read by no driver code (the channel is found by
/// client and handle), and libcuda 535 leaves it unset: any value goes through with the
/// instance's handles (refusing it left every libcuda channel registered in UVM).
#[test]
fn test_unregister_channel_ignores_its_gpu_uuid_as_the_driver_does() {
    let policy = InstancePolicy::new("t", Caps::ALL_CONTAINER, vec![1, 2]);
    let host = FakeHost::new("535.261.03", &HOST_GPUS);
    let mut env = Env::with(&host, policy);
    let client = env.client;
    for uuid in [gpu_uuid(2), gpu_uuid(0), [0u8; 16], [0xa5; 16]] {
        let mut p = vec![0u8; 28];
        p[..16].copy_from_slice(&uuid);
        wr32(&mut p, 16, client);
        wr32(&mut p, 20, client);
        host.clear();
        let (r, _) = env.uvm(UVM_UNREGISTER_CHANNEL, &p);
        assert_eq!(r.unwrap(), 0);
        assert_eq!(host.uvm_calls().len(), 1, "{uuid:02x?}");
    }
}

#[test]
fn test_foreign_gpu_uuids_are_refused_in_every_uuid_carrying_struct() {
    for version in ["535.261.03", "550.163.01"] {
        let mut policy = InstancePolicy::new("t", Caps::ALL_CONTAINER, vec![1, 2]);
        policy.mode = Mode::Enforce;
        let host = FakeHost::new(version, &HOST_GPUS);
        let mut env = Env::with(&host, policy);
        for (cmd, uuid_at, status_at, size, cpu_ok) in uuid_fields(&env) {
            let client = env.client;
            // Valid values everywhere, then one foreign UUID.
            let base = || {
                let mut p = vec![0u8; size];
                let peers = matches!(cmd, UVM_ENABLE_PEER_ACCESS | UVM_DISABLE_PEER_ACCESS);
                for o in if peers { vec![0, 16] } else { vec![uuid_at] } {
                    p[o..o + 16].copy_from_slice(&gpu_uuid(2));
                }
                match cmd {
                    UVM_REGISTER_GPU => wr32(&mut p, 24, u32::MAX),
                    UVM_REGISTER_GPU_VASPACE | UVM_REGISTER_CHANNEL => {
                        wr32(&mut p, 16, u32::MAX);
                        wr32(&mut p, 20, client);
                        wr32(&mut p, 24, client);
                    }
                    UVM_UNREGISTER_CHANNEL => {
                        wr32(&mut p, 16, client);
                        wr32(&mut p, 20, client);
                    }
                    _ => {}
                }
                p
            };
            let expect = if cmd == UVM_REGISTER_GPU {
                NV_ERR_GPU_UUID_NOT_FOUND
            } else {
                NV_ERR_INVALID_DEVICE
            };
            for (uuid, refused) in [
                (gpu_uuid(2), false),
                (gpu_uuid(0), true), // a host GPU of another instance
                ([0u8; 16], true),
                (CPU_UUID, !cpu_ok),
            ] {
                let mut p = base();
                p[uuid_at..uuid_at + 16].copy_from_slice(&uuid);
                env.host.clear();
                let (r, out) = env.uvm(cmd, &p);
                assert_eq!(r.unwrap(), 0, "{version} {cmd:#x}");
                if refused {
                    assert_eq!(
                        rd32(&out, status_at),
                        expect,
                        "{version} {cmd:#x} at {uuid_at}: {uuid:x?}"
                    );
                    assert!(env.host.uvm_calls().is_empty(), "{version} {cmd:#x}");
                } else {
                    assert_eq!(
                        env.host.uvm_calls().len(),
                        1,
                        "{version} {cmd:#x} at {uuid_at}: {uuid:x?}"
                    );
                }
            }
        }
    }
}

#[test]
fn test_per_gpu_attribute_arrays_are_checked_to_their_count() {
    for version in ["535.261.03", "595.45.04"] {
        let mut env = Env::version(version);
        let client = env.client;
        for cmd in [UVM_MAP_EXTERNAL_ALLOCATION, UVM_ALLOC_SEMAPHORE_POOL] {
            let size = env.size(cmd);
            let (array, count) = if cmd == UVM_MAP_EXTERNAL_ALLOCATION {
                (24, size - 24)
            } else {
                (16, size - 16)
            };
            let max = ((count - array) / 36) as u64;
            let status_at = if cmd == UVM_MAP_EXTERNAL_ALLOCATION {
                size - 4
            } else {
                size - 8
            };
            let mk = |n: u64, foreign_at: Option<usize>| {
                let mut p = vec![0u8; size];
                for i in 0..usize::try_from(n.min(max)).unwrap() {
                    let u = if Some(i) == foreign_at {
                        gpu_uuid(0)
                    } else {
                        gpu_uuid(if i % 2 == 0 { 1 } else { 2 })
                    };
                    p[array + i * 36..array + i * 36 + 16].copy_from_slice(&u);
                }
                wr64(&mut p, count, n);
                if cmd == UVM_MAP_EXTERNAL_ALLOCATION {
                    wr32(&mut p, size - 16, u32::MAX);
                    wr32(&mut p, size - 12, client);
                    wr32(&mut p, size - 8, client);
                }
                p
            };
            let run = |env: &mut Env, p: &[u8]| {
                env.host.clear();
                let (r, out) = env.uvm(cmd, p);
                assert_eq!(r.unwrap(), 0);
                (rd32(&out, status_at), env.host.uvm_calls().len())
            };
            assert_eq!(run(&mut env, &mk(2, None)), (0, 1), "{version} {cmd:#x}");
            assert_eq!(
                run(&mut env, &mk(2, Some(1))),
                (NV_ERR_INVALID_DEVICE, 0),
                "{version} {cmd:#x}"
            );
            // Entries past the count are not looked at (the driver does not either).
            let mut p = mk(1, None);
            p[array + 36..array + 52].copy_from_slice(&gpu_uuid(0));
            assert_eq!(run(&mut env, &p), (0, 1), "{version} {cmd:#x}");
            assert_eq!(
                run(&mut env, &mk(max + 1, None)),
                (NV_ERR_INVALID_ARGUMENT, 0),
                "{version} {cmd:#x}"
            );
            let zero = run(&mut env, &mk(0, None));
            if cmd == UVM_MAP_EXTERNAL_ALLOCATION {
                assert_eq!(zero, (NV_ERR_INVALID_ARGUMENT, 0));
            } else {
                assert_eq!(zero, (0, 1));
            }
        }
    }
}

#[test]
fn test_rm_handles_of_another_instance_are_refused() {
    let host = FakeHost::new("535.261.03", &HOST_GPUS);
    let a = Env::with(
        &host,
        InstancePolicy::new("a", Caps::COMPUTE_UTILITY, vec![1]),
    );
    let mut b = Env::with(
        &host,
        InstancePolicy::new("b", Caps::COMPUTE_UTILITY, vec![2]),
    );
    let foreign = a.client;
    let own = b.client;
    assert_ne!(foreign, own);
    let ext = b.size(UVM_MAP_EXTERNAL_ALLOCATION);
    // (cmd, size, uuid offset, client offset, object offset, status offset, status)
    let cases = [
        (
            UVM_REGISTER_GPU_VASPACE,
            32,
            Some(0),
            20,
            24,
            28,
            NV_ERR_INVALID_CLIENT,
        ),
        (
            UVM_REGISTER_CHANNEL,
            56,
            Some(0),
            20,
            24,
            48,
            NV_ERR_INVALID_CLIENT,
        ),
        (
            UVM_UNREGISTER_CHANNEL,
            28,
            Some(0),
            16,
            20,
            24,
            NV_ERR_INVALID_CHANNEL,
        ),
        (
            UVM_MAP_EXTERNAL_ALLOCATION,
            ext,
            None,
            ext - 12,
            ext - 8,
            ext - 4,
            NV_ERR_INVALID_CLIENT,
        ),
        (
            UVM_REGISTER_GPU,
            40,
            Some(0),
            28,
            32,
            36,
            NV_ERR_INVALID_CLIENT,
        ),
    ];
    for (cmd, size, uuid_at, client_at, object_at, status_at, status) in cases {
        let mk = |client: u32, object: u32| {
            let mut p = vec![0u8; size];
            if let Some(u) = uuid_at {
                p[u..u + 16].copy_from_slice(&gpu_uuid(2));
            }
            if cmd == UVM_MAP_EXTERNAL_ALLOCATION {
                p[24..40].copy_from_slice(&gpu_uuid(2));
                wr64(&mut p, size - 24, 1);
                wr32(&mut p, size - 16, u32::MAX);
            }
            if matches!(cmd, UVM_REGISTER_GPU_VASPACE | UVM_REGISTER_CHANNEL) {
                wr32(&mut p, 16, u32::MAX);
            }
            if cmd == UVM_REGISTER_GPU {
                wr32(&mut p, 24, u32::MAX);
            }
            wr32(&mut p, client_at, client);
            wr32(&mut p, object_at, object);
            p
        };
        for (client, object, want) in [
            (own, own, None),
            (foreign, foreign, Some(status)),
            (
                own,
                0xdead_beef,
                Some(if cmd == UVM_UNREGISTER_CHANNEL {
                    NV_ERR_INVALID_CHANNEL
                } else {
                    NV_ERR_OBJECT_NOT_FOUND
                }),
            ),
        ] {
            host.clear();
            let (r, out) = b.uvm(cmd, &mk(client, object));
            assert_eq!(r.unwrap(), 0);
            match want {
                None => assert_eq!(host.uvm_calls().len(), 1, "{cmd:#x}"),
                Some(s) => {
                    assert_eq!(rd32(&out, status_at), s, "{cmd:#x} {client:#x}/{object:#x}");
                    assert!(host.uvm_calls().is_empty(), "{cmd:#x}");
                }
            }
        }
    }
    // REGISTER_GPU without a client (UvmRegisterGpu, no MIG) passes.
    host.clear();
    let mut p = params(40, &[0]);
    p[..16].copy_from_slice(&gpu_uuid(2));
    wr32(&mut p, 24, u32::MAX);
    let (r, _) = b.uvm(UVM_REGISTER_GPU, &p);
    assert_eq!(r.unwrap(), 0);
    assert_eq!(host.uvm_calls().len(), 1);
    drop(a);
}

#[test]
fn test_unknown_and_never_accepted_commands_are_einval() {
    let host = FakeHost::new("535.261.03", &HOST_GPUS);
    let mut policy = InstancePolicy::new("t", Caps::ALL_CONTAINER, vec![1]);
    policy.allow.insert("UVM_TOOLS_READ_PROCESS_MEMORY".into());
    let mut env = Env::with(&host, policy);
    for cmd in [
        0x47,
        0x30000003,
        UVM_TOOLS_READ_PROCESS_MEMORY,
        UVM_TOOLS_WRITE_PROCESS_MEMORY,
        0xc008_462a,
    ] {
        let (r, _) = env.uvm(cmd, &[0u8; 64]);
        assert_eq!(errno(&r), Some(libc::EINVAL), "{cmd:#x}");
    }
    assert!(host.uvm_calls().is_empty());
    let ev = env.events.all();
    assert!(
        ev.iter()
            .all(|e| e.kind == Kind::Uvm && e.decision == Decision::Denied && e.node == "uvm")
    );
    assert_eq!(ev.len(), 5);
}

#[test]
fn test_pageable_mem_access_on_gpu_needs_video() {
    let p = params(24, &[0]);
    let mut env = Env::new(); // compute, utility
    let (r, _) = env.uvm(UVM_PAGEABLE_MEM_ACCESS_ON_GPU, &p);
    assert_eq!(errno(&r), Some(libc::EINVAL));
    assert!(env.host.uvm_calls().is_empty());
    assert_eq!(
        env.proxy.counts().get(
            Kind::Uvm,
            "UVM_PAGEABLE_MEM_ACCESS_ON_GPU",
            Decision::Denied
        ),
        1
    );

    let host = FakeHost::new("535.261.03", &HOST_GPUS);
    let caps = Caps::COMPUTE_UTILITY.union(Caps::VIDEO);
    let mut env = Env::with(&host, InstancePolicy::new("v", caps, vec![1]));
    let (r, _) = env.uvm(UVM_PAGEABLE_MEM_ACCESS_ON_GPU, &p);
    assert_eq!(r.unwrap(), 0);
    assert_eq!(host.uvm_calls().len(), 1);

    // Audit mode lets it through and says so.
    let host = FakeHost::new("535.261.03", &HOST_GPUS);
    let mut policy = InstancePolicy::new("a", Caps::COMPUTE_UTILITY, vec![1]);
    policy.mode = Mode::Audit;
    let mut env = Env::with(&host, policy);
    let (r, _) = env.uvm(UVM_PAGEABLE_MEM_ACCESS_ON_GPU, &p);
    assert_eq!(r.unwrap(), 0);
    assert_eq!(host.uvm_calls().len(), 1);
    let ev = env.events.all();
    assert_eq!(ev.last().unwrap().decision, Decision::AuditWouldDeny);
    // Isolation stays on in audit mode.
    let (_, out) = env.uvm(UVM_PAGEABLE_MEM_ACCESS_ON_GPU, &params(24, &[]));
    assert_eq!(rd32(&out, 20), NV_ERR_INVALID_DEVICE);
}

#[test]
fn test_pending_client_memory_is_retried_without_side_effects() {
    let mut env = Env::new();
    env.mem = FakeMem::retrying();
    env.mem.map(TOP, &[0u8; 16]);
    let r = env.uvm.ioctl(
        env.open,
        &CALLER,
        UVM_INITIALIZE,
        TOP,
        &mut env.mem,
        &env.fds,
    );
    assert!(matches!(r, Err(ProxyError::Pending)));
    assert!(env.host.uvm_calls().is_empty());
    assert!(env.events.all().is_empty());
    env.mem.fetch();
    let r = env.uvm.ioctl(
        env.open,
        &CALLER,
        UVM_INITIALIZE,
        TOP,
        &mut env.mem,
        &env.fds,
    );
    assert_eq!(r.unwrap(), 0);
    assert_eq!(env.host.uvm_calls().len(), 1);
}

#[test]
fn test_bad_params_address_is_efault() {
    let mut env = Env::new();
    let r = env.uvm.ioctl(
        env.open,
        &CALLER,
        UVM_INITIALIZE,
        0xdead_0000,
        &mut env.mem,
        &env.fds,
    );
    assert_eq!(errno(&r), Some(libc::EFAULT));
}

#[test]
fn test_uvm_mmap_switch() {
    let mut env = Env::new();
    let (_fd, adjust) = env.uvm.mmap_fd(&CALLER, env.open).unwrap();
    assert_eq!(adjust, 0);
    let host_id = env.uvm.host_file(env.open).unwrap().id();
    assert_eq!(env.host.mmap_fd_calls(), vec![host_id]);

    let host = FakeHost::new("535.261.03", &HOST_GPUS);
    let mut policy = InstancePolicy::new("off", Caps::COMPUTE_UTILITY, vec![1]);
    policy.uvm_mmap = false;
    env = Env::with(&host, policy);
    let e = env.uvm.mmap_fd(&CALLER, env.open).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENODEV));
    assert!(host.mmap_fd_calls().is_empty());
    let ev = env.events.all();
    assert_eq!(
        (ev[0].name.as_str(), ev[0].errno, ev[0].decision),
        ("mmap", Some(libc::ENODEV), Decision::Denied)
    );
    // An unknown open is EBADF.
    let e = env
        .uvm
        .mmap_fd(&CALLER, ioctl_proxy::OwnerId(9999))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBADF));
}

#[test]
fn test_opens_share_the_frontend_id_space_and_release_their_host_files() {
    let env = Env::new();
    assert_ne!(env.open, env.ctl);
    assert!(env.uvm.is_open(env.open) && !env.uvm.is_open(env.ctl));
    assert_eq!(env.proxy.host_file_id(env.open), None);
    let before = env.host.open_files();
    env.uvm.release(env.open);
    assert_eq!(env.host.open_files(), before - 1);
    assert_eq!(env.uvm.open_count(), 1);
}

#[test]
fn test_warnings_are_not_failures_and_failures_are_audited() {
    let mut env = Env::new();
    env.host.set_uvm_status(4, 0x0001_0006); // NV_WARN_NOTHING_TO_DO
    let mut p = vec![0u8; 8];
    wr32(&mut p, 0, FD_UVM2 as u32);
    let (_, out) = env.uvm(UVM_MM_INITIALIZE, &p);
    assert_eq!(rd32(&out, 4), 0x0001_0006);
    assert_eq!(
        env.proxy
            .counts()
            .get(Kind::Uvm, "UVM_MM_INITIALIZE", Decision::Allowed),
        1
    );
    assert!(env.events.all().is_empty());
    env.host.set_uvm_status(16, NV_ERR_INVALID_ADDRESS);
    let (_, out) = env.uvm(UVM_VALIDATE_VA_RANGE, &[0u8; 24]);
    assert_eq!(rd32(&out, 16), NV_ERR_INVALID_ADDRESS);
    let ev = env.events.all();
    assert_eq!(
        (
            ev[0].name.as_str(),
            ev[0].decision,
            ev[0].nv_status,
            ev[0].pid
        ),
        (
            "UVM_VALIDATE_VA_RANGE",
            Decision::Failed,
            Some(NV_ERR_INVALID_ADDRESS),
            CALLER.pid
        )
    );
    let _ = Arc::clone(&env.proxy);
}

/// Issue 9 finding 2: UVM opens count against the instance's open-file quota (with its
/// frontend opens); past it `open` fails with ENOMEM for that instance only, while another
/// instance on the same host still opens and initialises.
#[test]
fn test_uvm_opens_past_the_quota_fail_for_that_instance_only() {
    let host = FakeHost::new("535.261.03", &HOST_GPUS);
    let mut policy = InstancePolicy::new("a", Caps::COMPUTE_UTILITY, vec![1]);
    policy.quotas.open_files = 16;
    let a = Env::with(&host, policy);
    // Env holds the control file and two UVM opens.
    assert_eq!(a.proxy.open_files(), 3);
    let extra: Vec<_> = (0..13).map(|_| a.uvm.open().unwrap()).collect();
    let err = a.uvm.open().unwrap_err();
    assert_eq!(err.errno(), libc::ENOMEM);
    let b = Env::with(
        &host,
        InstancePolicy::new("b", Caps::COMPUTE_UTILITY, vec![2]),
    );
    b.uvm.open().unwrap();
    a.uvm.release(extra[0]);
    a.uvm.open().unwrap();
}
