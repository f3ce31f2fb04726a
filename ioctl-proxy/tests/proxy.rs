//! The frontend request path against a recording fake driver.

mod common;

use std::sync::Arc;

use common::*;
use ioctl_proxy::*;
use nvproxy_abi::Caps;
use nvproxy_abi::ioctl::{IOC_READ, IOC_WRITE, ioc, nv_iowr};

const A: u64 = 0x40_0000; // a top-level struct
const B: u64 = 0x41_0000; // a nested buffer

const NV_ERR_INSUFFICIENT_RESOURCES: u32 = 0x1a;
const NV_ERR_INSUFFICIENT_PERMISSIONS: u32 = 0x1b;
const NV_ERR_INVALID_ADDRESS: u32 = 0x1e;
const NV_ERR_INVALID_ARGUMENT: u32 = 0x1f;
const NV_ERR_INVALID_CLASS: u32 = 0x22;
const NV_ERR_INVALID_CLIENT: u32 = 0x23;
const NV_ERR_NOT_SUPPORTED: u32 = 0x56;
const NV_ERR_OBJECT_NOT_FOUND: u32 = 0x57;
const NV_ERR_STATE_IN_USE: u32 = 0x63;

const CLASSLIST: u32 = 0x80_0201;
const ECC_COUNTS: u32 = 0x2080_3401; // admin-only (no caps) in every table

fn graphics_env() -> Env {
    Env::with(
        VERSION,
        InstancePolicy::new(
            "gfx",
            Caps::COMPUTE_UTILITY
                .union(Caps::GRAPHICS)
                .union(Caps::VIDEO),
            vec![1, 2],
        ),
    )
}

// ---- escapes: dispatch and syntax ------------------------------------------------------------

#[test]
fn test_check_version_str_is_forwarded_unchanged() {
    let mut env = Env::new();
    let mut p = vec![0u8; 72];
    p[0] = b'2';
    p[8..18].copy_from_slice(b"535.261.03");
    env.mem.map(A, &p);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, 0xc048_46d2, A).unwrap(), 0);
    let seen = env.host.calls();
    assert_eq!((seen.len(), seen[0].call.cmd), (1, 0xc048_46d2));
    assert_eq!(seen[0].call.params.as_slice(), p);
}

#[test]
fn test_sys_params_is_forwarded() {
    let mut env = Env::new();
    env.mem.map(A, &4096u64.to_ne_bytes());
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0xd6, 8), A).unwrap(), 0);
    assert_eq!(env.host.calls_nr(0xd6).len(), 1);
}

#[test]
fn test_wait_open_complete_exists_from_550() {
    let mut env = Env::with(
        "550.163.01",
        InstancePolicy::new("t", Caps::COMPUTE, vec![1]),
    );
    env.mem.map(A, &[0; 8]);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0xda, 8), A).unwrap(), 0);
    assert_eq!(env.host.calls_nr(0xda).len(), 1);
}

#[test]
fn test_unknown_escape_is_einval_and_audited() {
    let mut env = Env::new();
    env.mem.map(A, &[0; 20]);
    let ctl = env.ctl;
    let err = env.ioctl(ctl, nv_iowr(0x28, 20), A).unwrap_err(); // NV_ESC_RM_ALLOC_OBJECT
    assert_eq!(err.errno(), libc::EINVAL);
    assert!(env.host.calls().is_empty());
    let ev = &env.events.all()[0];
    assert_eq!(
        (ev.kind, ev.decision, ev.errno),
        (Kind::Escape, Decision::Denied, Some(libc::EINVAL))
    );
    assert_eq!(ev.name, "NV_ESC_0x28");
}

#[test]
fn test_numa_info_is_forwarded_without_host_physical_addresses() {
    let mut env = Env::with(
        "545.29.06",
        InstancePolicy::new("t", Caps::COMPUTE, vec![1]),
    );
    let gpu = env.proxy.open(FrontendNode::Gpu(0)).unwrap();
    env.host.clear();
    // nv_ioctl_numa_info_t as a coherent GPU's driver fills it (the fake host echoes the
    // buffer): nid 1, ONLINE, memblock 512 MiB, memory at host PA 0x4000_0000_0000, 2 retired
    // pages.
    let mut p = vec![0u8; 560];
    wr32(&mut p, 0, 1);
    wr32(&mut p, 4, 3);
    wr64(&mut p, 8, 512 << 20);
    wr64(&mut p, 16, 0x4000_0000_0000);
    wr64(&mut p, 24, 80 << 30);
    p[32] = 1;
    wr64(&mut p, 40, 0x4000_0010_0000);
    wr64(&mut p, 48, 0x4000_0020_0000);
    wr32(&mut p, 40 + 512, 2);
    env.mem.map(A, &p);
    assert_eq!(env.ioctl(gpu, nv_iowr(0xd7, 560), A).unwrap(), 0);
    let calls = env.host.calls_nr(0xd7);
    assert_eq!(calls.len(), 1, "forwarded once");
    assert_eq!(calls[0].node, NodeKind::Gpu(1));
    let out = env.mem.get(A, 560);
    // The NUMA node and its state and sizes are the tenant's; the physical addresses are not.
    assert_eq!(
        (
            rd32(&out, 0),
            rd32(&out, 4),
            rd64(&out, 8),
            rd64(&out, 24),
            out[32]
        ),
        (1, 3, 512 << 20, 80 << 30, 1)
    );
    assert_eq!(rd64(&out, 16), 0, "numa_mem_addr");
    assert!(out[40..560].iter().all(|&b| b == 0), "offline addresses");
    // The driver's own errno (NV_ACTUAL_DEVICE_ONLY on the control node) reaches the tenant.
    env.host.set_escape_errno(0xd7, libc::EINVAL);
    let ctl = env.ctl;
    assert_eq!(
        env.ioctl(ctl, nv_iowr(0xd7, 560), A).unwrap_err().errno(),
        libc::EINVAL
    );
}

#[test]
fn test_non_nvidia_ioctl_type_is_enotty() {
    let mut env = Env::new();
    env.mem.map(A, &[0; 72]);
    let ctl = env.ctl;
    let cmd = ioc(IOC_READ | IOC_WRITE, b'G', 0xd2, 72);
    assert_eq!(env.ioctl(ctl, cmd, A).unwrap_err().errno(), libc::ENOTTY);
    assert!(env.host.calls().is_empty());
}

#[test]
fn test_undersized_ioc_size_is_einval() {
    let mut env = Env::new();
    env.mem.map(A, &[0; 64]);
    let ctl = env.ctl;
    assert_eq!(
        env.ioctl(ctl, nv_iowr(0x2a, 16), A).unwrap_err().errno(),
        libc::EINVAL
    );
    assert!(env.host.calls().is_empty());
}

#[test]
fn test_oversized_ioc_size_is_einval() {
    let mut env = Env::new();
    env.mem.map(A, &[0; 64]);
    let ctl = env.ctl;
    assert_eq!(
        env.ioctl(ctl, nv_iowr(0x2b, 40), A).unwrap_err().errno(),
        libc::EINVAL
    );
    assert!(env.host.calls().is_empty());
}

#[test]
fn test_bad_top_level_pointer_is_efault() {
    let mut env = Env::new();
    let ctl = env.ctl;
    assert_eq!(
        env.ioctl(ctl, 0xc048_46d2, 0xdead_0000)
            .unwrap_err()
            .errno(),
        libc::EFAULT
    );
}

#[test]
fn test_unknown_open_is_ebadf() {
    let mut env = Env::new();
    let err = env.ioctl(OwnerId(999), 0xc048_46d2, A).unwrap_err();
    assert_eq!(err.errno(), libc::EBADF);
}

#[test]
fn test_xfer_cmd_is_unwrapped() {
    let mut env = Env::new();
    env.mem.map(B, &[0; 72]);
    let mut x = vec![0u8; 16];
    wr32(&mut x, 0, 0xd2);
    wr32(&mut x, 4, 72);
    wr64(&mut x, 8, B);
    env.mem.map(A, &x);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0xd3, 16), A).unwrap(), 0);
    assert_eq!(env.host.calls()[0].call.cmd, nv_iowr(0xd2, 72));
}

#[test]
fn test_xfer_above_absolute_max_is_einval() {
    let mut env = Env::new();
    let mut x = vec![0u8; 16];
    wr32(&mut x, 0, 0xd4);
    wr32(&mut x, 4, 16388);
    wr64(&mut x, 8, B);
    env.mem.map(A, &x);
    let ctl = env.ctl;
    assert_eq!(
        env.ioctl(ctl, nv_iowr(0xd3, 16), A).unwrap_err().errno(),
        libc::EINVAL
    );
    assert!(env.host.calls().is_empty());
}

#[test]
fn test_xfer_struct_of_wrong_size_is_einval() {
    let mut env = Env::new();
    env.mem.map(A, &[0; 24]);
    let ctl = env.ctl;
    assert_eq!(
        env.ioctl(ctl, nv_iowr(0xd3, 24), A).unwrap_err().errno(),
        libc::EINVAL
    );
}

#[test]
fn test_export_dmabuf_needs_rdma_cap() {
    let mut env = Env::new();
    env.mem.map(A, &[0; 2600]);
    let ctl = env.ctl;
    let err = env.ioctl(ctl, nv_iowr(0xd9, 2600), A).unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL);
    assert!(env.host.calls().is_empty());
    assert_eq!(env.events.all()[0].decision, Decision::Denied);
}

// ---- CARD_INFO and the GPU set ---------------------------------------------------------------

#[test]
fn test_card_info_is_filtered_and_renumbered() {
    let mut env = Env::new();
    env.mem.map(A, &[0; 32 * 72]);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0xc8, 32 * 72), A).unwrap(), 0);
    let out = env.mem.get(A, 32 * 72);
    let entry = |i: usize| &out[i * 72..(i + 1) * 72];
    assert_eq!(
        (entry(0)[0], rd32(entry(0), 16), rd32(entry(0), 56)),
        (1, 0x200, 0)
    );
    assert_eq!(
        (entry(1)[0], rd32(entry(1), 16), rd32(entry(1), 56)),
        (1, 0x300, 1)
    );
    assert!(out[2 * 72..].iter().all(|&b| b == 0));
}

#[test]
fn test_card_info_smaller_than_the_set_is_einval_and_zeroed() {
    let mut env = Env::new();
    env.mem.map(A, &[0xaa; 72]);
    let ctl = env.ctl;
    assert_eq!(
        env.ioctl(ctl, nv_iowr(0xc8, 72), A).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(env.mem.get(A, 72), vec![0; 72]);
}

#[test]
fn test_tenant_gpu_node_maps_to_host_minor() {
    let env = Env::new();
    env.proxy.open(FrontendNode::Gpu(0)).unwrap();
    let err = env.proxy.open(FrontendNode::Gpu(2)).unwrap_err();
    assert_eq!(err.errno(), libc::ENODEV);
    assert_eq!(
        env.proxy.gpus()[0],
        GpuInfo {
            minor: 1,
            gpu_id: 0x200,
            pci: (0x11, 0, 0),
        }
    );
}

#[test]
fn test_proxy_refuses_gpu_the_host_lacks() {
    let host = FakeHost::new(VERSION, &HOST_GPUS);
    let policy = InstancePolicy::new("t", Caps::COMPUTE, vec![7]);
    let err = Proxy::for_host(policy, Arc::new(Driver(host))).unwrap_err();
    assert!(matches!(err, ProxyError::Config(_)));
}

#[test]
fn test_probed_ids_are_filtered_to_the_set() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (status, out) = env.control(c, c, 0x214, &[0; 256]);
    assert_eq!(status, 0);
    assert_eq!(
        (rd32(&out, 0), rd32(&out, 4), rd32(&out, 8)),
        (0x200, 0x300, INVALID_ID)
    );
}

#[test]
fn test_probed_ids_580_layout_filters_gpu_flags_too() {
    let mut env = Env::with("580.142", InstancePolicy::new("t", Caps::COMPUTE, vec![2]));
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0u8; 384];
    wr32(&mut p, 256 + 8, 0x77); // flags of host GPU index 2 (0x300) — the fake keeps input
    let (status, out) = env.control(c, c, 0x214, &p);
    assert_eq!(status, 0);
    assert_eq!((rd32(&out, 0), rd32(&out, 4)), (0x300, INVALID_ID));
    assert_eq!((rd32(&out, 256), rd32(&out, 260)), (0x77, 0));
}

#[test]
fn test_attached_ids_are_filtered_to_the_set() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (_, out) = env.control(c, c, 0x201, &[0; 128]);
    assert_eq!(
        (rd32(&out, 0), rd32(&out, 4), rd32(&out, 8)),
        (0x200, 0x300, INVALID_ID)
    );
}

#[test]
fn test_attach_ids_outside_the_set_is_invalid_argument() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0xffu8; 132];
    wr32(&mut p, 0, 0x100);
    let (status, _) = env.control(c, c, 0x215, &p);
    assert_eq!(status, NV_ERR_INVALID_ARGUMENT);
    assert!(env.host.controls(0x215).is_empty());
}

#[test]
fn test_attach_all_probed_becomes_the_instance_gpus() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0xffu8; 132];
    wr32(&mut p, 0, 0xffff);
    let (status, out) = env.control(c, c, 0x215, &p);
    assert_eq!(status, 0);
    let seen = &env.host.controls(0x215)[0].call.nested[0].data;
    assert_eq!(
        (rd32(seen, 0), rd32(seen, 4), rd32(seen, 8)),
        (0x200, 0x300, INVALID_ID)
    );
    assert_eq!(rd32(&out, 0), 0xffff);
}

#[test]
fn test_gpu_id_query_outside_the_set_is_refused() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0u8; 32];
    wr32(&mut p, 0, 0x100);
    // gpumgrGetGpuIdInfoV2: an unknown gpuId is NV_ERR_INVALID_ARGUMENT.
    assert_eq!(env.control(c, c, 0x205, &p).0, NV_ERR_INVALID_ARGUMENT);
    let mut p = vec![0u8; 268];
    wr32(&mut p, 0, 0x100);
    // GET_UUID_FROM_GPU_ID: NV_ERR_OBJECT_NOT_FOUND, as GET_PCI_INFO.
    assert_eq!(env.control(c, c, 0x275, &p).0, NV_ERR_OBJECT_NOT_FOUND);
    assert!(env.host.calls_nr(0x2a).is_empty());
}

#[test]
fn test_attach_gpus_to_fd_outside_the_set_is_einval() {
    let mut env = Env::new();
    let mut p = vec![0u8; 8];
    wr32(&mut p, 0, 0x200);
    wr32(&mut p, 4, 0x100);
    env.mem.map(A, &p);
    let ctl = env.ctl;
    assert_eq!(
        env.ioctl(ctl, nv_iowr(0xd4, 8), A).unwrap_err().errno(),
        libc::EINVAL
    );
    assert!(env.host.calls().is_empty());
    wr32(&mut p, 4, 0x300);
    env.mem.map(A, &p);
    assert_eq!(env.ioctl(ctl, nv_iowr(0xd4, 8), A).unwrap(), 0);
    assert_eq!(env.host.calls_nr(0xd4)[0].call.params.as_slice(), p);
}

#[test]
fn test_device_of_a_gpu_outside_the_set_is_refused() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0u8; 56];
    wr32(&mut p, 0, 0); // device instance 0 = host GPU 0x100
    let (status, _) = env.alloc(c, c, 0x80, &p);
    // deviceConstruct_IMPL: an invalid device instance is NV_ERR_INVALID_CLASS.
    assert_eq!(status, NV_ERR_INVALID_CLASS);
    assert!(
        env.host
            .calls_nr(0x2b)
            .iter()
            .all(|s| rd32(&s.call.params, 12) != 0x80)
    );
    let (dev, sub) = env.device(c, 1); // device instance 1 = 0x200, in the set
    assert!(dev != 0 && sub != 0);
}

// ---- RM_ALLOC, RM_FREE, DUP, SHARE and the object table ----------------------------------------

#[test]
fn test_root_client_handle_chosen_by_the_driver_is_recorded() {
    let mut env = Env::new();
    let ctl = env.ctl;
    let h = env.alloc_client(ctl);
    assert!(env.proxy.has_client(h));
    assert_eq!(env.proxy.object_count(), 1);
}

#[test]
fn test_nvos21_alloc_reaches_host_as_nvos64_and_returns_nvos21() {
    let mut env = Env::new();
    let mut p = vec![0u8; 32];
    wr32(&mut p, 12, 0x41);
    env.mem.map(A, &p);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x2b, 32), A).unwrap(), 0);
    assert_eq!(env.host.calls_nr(0x2b)[0].call.cmd, 0xc030_462b);
    let out = env.mem.get(A, 32);
    assert!(env.proxy.has_client(rd32(&out, 8)));
    assert_eq!(rd32(&out, 28), 0);
}

#[test]
fn test_alloc_params_are_nested_and_the_client_pointer_restored() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0u8; 56];
    wr32(&mut p, 0, 1);
    env.alloc(c, c, 0x80, &p);
    let seen = env.host.calls_nr(0x2b).pop().unwrap().call;
    assert_eq!(rd64(&seen.params, 16), NESTED_PTR_PLACEHOLDER);
    assert_eq!((seen.nested.len(), seen.nested[0].data.len()), (1, 56));
    assert_eq!(rd64(&env.mem.get(0x11_0000, 48), 16), 0x12_0000);
}

#[test]
fn test_unknown_class_answers_invalid_class_with_ioctl_success() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (status, _) = env.alloc(c, c, 0xbeef, &[]);
    assert_eq!(status, NV_ERR_INVALID_CLASS);
    assert_eq!(env.host.calls_nr(0x2b).len(), 1); // only the client
    let ev = env.events.all().last().unwrap().clone();
    assert_eq!(
        (ev.decision, ev.name.as_str()),
        (Decision::Denied, "class 0xbeef")
    );
}

#[test]
fn test_alloc_under_unknown_parent_is_refused() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (status, _) = env.alloc(c, 0x1234, 0x2080, &[0; 4]);
    assert_eq!(status, 0x36); // NV_ERR_INVALID_OBJECT_PARENT
}

#[test]
fn test_double_free_is_ok_and_reaches_the_host_once() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    let mut p = vec![0u8; 16];
    wr32(&mut p, 0, c);
    wr32(&mut p, 4, c);
    wr32(&mut p, 8, dev);
    let ctl = env.ctl;
    for _ in 0..2 {
        env.mem.map(A, &p);
        assert_eq!(env.ioctl(ctl, nv_iowr(0x29, 16), A).unwrap(), 0);
        assert_eq!(rd32(&env.mem.get(A, 16), 12), 0);
    }
    assert_eq!(env.host.calls_nr(0x29).len(), 1);
    assert_eq!(env.proxy.object_count(), 1); // device and subdevice gone
}

#[test]
fn test_free_of_the_client_forgets_it() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0u8; 16];
    wr32(&mut p, 0, c);
    wr32(&mut p, 8, c);
    env.mem.map(A, &p);
    let ctl = env.ctl;
    env.ioctl(ctl, nv_iowr(0x29, 16), A).unwrap();
    assert!(!env.proxy.has_client(c));
}

#[test]
fn test_release_frees_the_opens_clients_and_closes_its_host_file() {
    let mut env = Env::new();
    let second = env.proxy.open(FrontendNode::Ctl).unwrap();
    let files = env.host.open_files();
    let c = env.alloc_client(second);
    let kept = env.alloc_client(env.ctl);
    assert_eq!(env.proxy.release(second), vec![c]);
    assert!(!env.proxy.has_client(c) && env.proxy.has_client(kept));
    assert_eq!(env.host.open_files(), files - 1);
}

#[test]
fn test_dup_and_share_within_the_instance() {
    let mut env = Env::new();
    let c1 = env.alloc_client(env.ctl);
    let c2 = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c1, 1);
    let mut p = vec![0u8; 28];
    for (i, v) in [c2, c2, 0, c1, dev].into_iter().enumerate() {
        wr32(&mut p, 4 * i, v);
    }
    env.mem.map(A, &p);
    let before = env.proxy.object_count();
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x34, 28), A).unwrap(), 0);
    assert_eq!(env.proxy.object_count(), before + 1);
    let out = env.mem.get(A, 28);
    assert_eq!(rd32(&out, 24), 0);
    let new = rd32(&out, 8);
    assert!(new != 0);
    // SHARE of the dup with a client-targeted policy naming our other client.
    let mut s = vec![0u8; 24];
    wr32(&mut s, 0, c2);
    wr32(&mut s, 4, new);
    wr32(&mut s, 8, c1);
    s[16..18].copy_from_slice(&3u16.to_ne_bytes());
    env.mem.map(B, &s);
    assert_eq!(env.ioctl(ctl, nv_iowr(0x35, 24), B).unwrap(), 0);
    assert_eq!(rd32(&env.mem.get(B, 24), 20), 0);
    assert_eq!(env.host.calls_nr(0x35).len(), 1);
}

#[test]
fn test_handles_of_another_instance_are_refused() {
    let host = FakeHost::new(VERSION, &HOST_GPUS);
    let (a, _) = proxy_on(&host, InstancePolicy::new("a", Caps::COMPUTE, vec![1]));
    let (b, b_events) = proxy_on(&host, InstancePolicy::new("b", Caps::COMPUTE, vec![2]));
    let (a_ctl, b_ctl) = (
        a.open(FrontendNode::Ctl).unwrap(),
        b.open(FrontendNode::Ctl).unwrap(),
    );
    let mut mem = FakeMem::new();
    let fds = FakeFds::default();
    let mut p = vec![0u8; 48];
    wr32(&mut p, 12, 0x41);
    mem.map(A, &p);
    a.ioctl(a_ctl, &CALLER, nv_iowr(0x2b, 48), A, &mut mem, &fds)
        .unwrap();
    let a_client = rd32(&mem.get(A, 48), 8);
    host.clear();

    // B: a control, a free and a dup naming A's client.
    let mut ctl = vec![0u8; 32];
    wr32(&mut ctl, 0, a_client);
    wr32(&mut ctl, 4, a_client);
    wr32(&mut ctl, 8, 0x214);
    mem.map(A, &ctl);
    b.ioctl(b_ctl, &CALLER, nv_iowr(0x2a, 32), A, &mut mem, &fds)
        .unwrap();
    assert_eq!(rd32(&mem.get(A, 32), 28), NV_ERR_INVALID_CLIENT);
    let mut free = vec![0u8; 16];
    wr32(&mut free, 0, a_client);
    wr32(&mut free, 8, a_client);
    mem.map(A, &free);
    b.ioctl(b_ctl, &CALLER, nv_iowr(0x29, 16), A, &mut mem, &fds)
        .unwrap();
    assert_eq!(rd32(&mem.get(A, 16), 12), NV_ERR_INVALID_CLIENT);
    mem.map(B, &p);
    b.ioctl(b_ctl, &CALLER, nv_iowr(0x2b, 48), B, &mut mem, &fds)
        .unwrap();
    let b_client = rd32(&mem.get(B, 48), 8);
    let mut dup = vec![0u8; 28];
    for (i, v) in [b_client, b_client, 0, a_client, a_client]
        .into_iter()
        .enumerate()
    {
        wr32(&mut dup, 4 * i, v);
    }
    mem.map(A, &dup);
    b.ioctl(b_ctl, &CALLER, nv_iowr(0x34, 28), A, &mut mem, &fds)
        .unwrap();
    assert_eq!(rd32(&mem.get(A, 28), 24), NV_ERR_INVALID_CLIENT);

    assert!(host.calls_nr(0x2a).is_empty() && host.calls_nr(0x29).is_empty());
    assert!(host.calls_nr(0x34).is_empty());
    assert!(a.has_client(a_client));
    assert!(b_events.all().iter().all(|e| e.instance == "b"));
}

// ---- RM_CONTROL ---------------------------------------------------------------------------------

#[test]
fn test_control_with_embedded_list_nests_and_copies_back() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    env.mem.map(B, &[0; 16]);
    let mut p = vec![0u8; 16];
    wr32(&mut p, 0, 4);
    wr64(&mut p, 8, B);
    let (status, out) = env.control(c, dev, CLASSLIST, &p);
    assert_eq!(status, 0);
    assert_eq!(rd64(&out, 8), B); // the client's pointer, not the daemon's
    assert_eq!(
        (env.mem.u32_at(B), env.mem.u32_at(B + 12)),
        (0xc000, 0xc003)
    );
    let seen = &env.host.controls(CLASSLIST)[0].call;
    assert_eq!(seen.nested[1].parent, Some(0));
    assert_eq!(rd64(&seen.nested[0].data, 8), NESTED_PTR_PLACEHOLDER);
}

#[test]
fn test_params_size_other_than_the_controls_is_invalid_argument() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    let (status, _) = env.control(c, dev, CLASSLIST, &[0; 32]);
    assert_eq!(status, NV_ERR_INVALID_ARGUMENT);
    assert!(env.host.controls(CLASSLIST).is_empty());
}

#[test]
fn test_hostile_params_size_is_refused_without_reading_it() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    env.mem.reads.clear();
    env.mem.largest_read = 0;
    let mut p = vec![0u8; 32];
    wr32(&mut p, 0, c);
    wr32(&mut p, 4, c);
    wr32(&mut p, 8, 0x2080_8001); // legacy GSS: opaque, no table size
    wr64(&mut p, 16, B);
    wr32(&mut p, 24, 0xffff_0000);
    env.mem.map(A, &p);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x2a, 32), A).unwrap(), 0);
    assert_eq!(rd32(&env.mem.get(A, 32), 28), NV_ERR_INVALID_ARGUMENT);
    assert!(env.mem.largest_read <= 32);
    assert!(env.host.calls_nr(0x2a).is_empty());
}

#[test]
fn test_hostile_embedded_count_is_refused_without_reading_it() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    env.mem.largest_read = 0;
    let mut p = vec![0u8; 16];
    wr32(&mut p, 0, 0x4000_0000);
    wr64(&mut p, 8, B);
    let (status, _) = env.control(c, dev, CLASSLIST, &p);
    assert_eq!(status, NV_ERR_INVALID_ARGUMENT);
    assert!(env.mem.largest_read <= 56);
    assert!(env.host.controls(CLASSLIST).is_empty());
}

#[test]
fn test_opaque_pass_through_control_is_forwarded_within_the_bound() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (status, _) = env.control(c, c, 0x2080_8001, &[7; 64]);
    assert_eq!(status, 0);
    assert_eq!(
        env.host.controls(0x2080_8001)[0].call.nested[0]
            .data
            .to_vec(),
        vec![7; 64]
    );
}

#[test]
fn test_privileged_legacy_gss_control_is_insufficient_permissions_without_the_host() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    env.host.clear();
    let (status, _) = env.control(c, sub, 0x2080_c159, &[7; 64]);
    assert_eq!(status, NV_ERR_INSUFFICIENT_PERMISSIONS);
    assert!(env.host.calls().is_empty());
    let ev = env.events.all().last().unwrap().clone();
    assert_eq!(
        (ev.kind, ev.number, ev.decision, ev.nv_status),
        (
            Kind::Control,
            0x2080_c159,
            Decision::Denied,
            Some(NV_ERR_INSUFFICIENT_PERMISSIONS)
        )
    );
}

#[test]
fn test_privileged_legacy_gss_control_is_refused_in_audit_mode() {
    let mut policy = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![1]);
    policy.mode = Mode::Audit;
    let mut env = Env::with(VERSION, policy);
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    env.host.clear();
    let (status, _) = env.control(c, sub, 0x2080_c159, &[7; 64]);
    assert_eq!(status, NV_ERR_INSUFFICIENT_PERMISSIONS);
    assert!(env.host.calls().is_empty());
}

#[test]
fn test_privileged_legacy_gss_control_on_an_unknown_object_is_object_not_found() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    env.host.clear();
    let (status, _) = env.control(c, 0xcafe_0001, 0x2080_c159, &[7; 64]);
    assert_eq!(status, NV_ERR_OBJECT_NOT_FOUND);
    assert!(env.host.calls().is_empty());
}

#[test]
fn test_privileged_legacy_gss_control_with_disagreeing_params_is_invalid_argument() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    env.host.clear();
    let mut p = vec![0u8; 32];
    wr32(&mut p, 0, c);
    wr32(&mut p, 4, sub);
    wr32(&mut p, 8, 0x2080_c159);
    wr32(&mut p, 24, 64); // a size without a pointer
    env.mem.map(A, &p);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x2a, 32), A).unwrap(), 0);
    assert_eq!(rd32(&env.mem.get(A, 32), 28), NV_ERR_INVALID_ARGUMENT);
    assert!(env.host.calls().is_empty());
}

#[test]
fn test_non_privileged_legacy_gss_control_is_still_forwarded() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    env.host.clear();
    let (status, _) = env.control(c, sub, 0x2080_8159, &[7; 64]);
    assert_eq!(status, 0);
    let seen = env.host.controls(0x2080_8159);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].call.nested[0].data.to_vec(), vec![7; 64]);
}

#[test]
fn test_bad_params_pointer_is_invalid_address_status() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0u8; 32];
    wr32(&mut p, 0, c);
    wr32(&mut p, 4, c);
    wr32(&mut p, 8, 0x214);
    wr64(&mut p, 16, 0xbad0_0000);
    wr32(&mut p, 24, 256);
    env.mem.map(A, &p);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x2a, 32), A).unwrap(), 0);
    assert_eq!(rd32(&env.mem.get(A, 32), 28), NV_ERR_INVALID_ADDRESS);
    assert!(env.host.calls_nr(0x2a).is_empty());
}

#[test]
fn test_bad_embedded_pointer_is_invalid_address_status() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    let mut p = vec![0u8; 16];
    wr32(&mut p, 0, 4);
    wr64(&mut p, 8, 0xbad0_0000);
    assert_eq!(env.control(c, dev, CLASSLIST, &p).0, NV_ERR_INVALID_ADDRESS);
    assert!(env.host.controls(CLASSLIST).is_empty());
}

#[test]
fn test_unknown_control_is_not_supported_with_ioctl_success() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    assert_eq!(
        env.control(c, c, 0x0000_0b7f, &[0; 4]).0,
        NV_ERR_NOT_SUPPORTED
    );
    assert!(env.host.calls_nr(0x2a).is_empty());
    let ev = env.events.all().last().unwrap().clone();
    assert_eq!(
        (ev.kind, ev.name.as_str()),
        (Kind::Control, "control 0x00000b7f")
    );
}

#[test]
fn test_null_control_is_ok_without_the_host() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    assert_eq!(env.control(c, c, 0x2080_0000, &[]).0, 0);
    assert!(env.host.calls_nr(0x2a).is_empty());
}

#[test]
fn test_control_on_unknown_object_is_object_not_found() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    assert_eq!(
        env.control(c, 0x5555, 0x214, &[0; 256]).0,
        NV_ERR_OBJECT_NOT_FOUND
    );
}

#[test]
fn test_host_status_reaches_the_client_and_is_audited_as_failed() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    env.host.set_control_status(0x214, 0x65);
    assert_eq!(env.control(c, c, 0x214, &[0; 256]).0, 0x65);
    let ev = env.events.all().pop().unwrap();
    assert_eq!((ev.decision, ev.nv_status), (Decision::Failed, Some(0x65)));
}

#[test]
fn test_build_version_strings_are_bounded_and_copied_back() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    for (i, a) in [B, B + 0x1000, B + 0x2000].into_iter().enumerate() {
        env.mem.map(a, &[u8::try_from(i).unwrap(); 4096]);
    }
    let mut p = vec![0u8; 40];
    wr32(&mut p, 0, 4096);
    wr64(&mut p, 8, B);
    wr64(&mut p, 16, B + 0x1000);
    wr64(&mut p, 24, B + 0x2000);
    let (status, out) = env.control(c, c, 0x101, &p);
    assert_eq!((status, rd32(&out, 0)), (0, 4096));
    let seen = &env.host.controls(0x101)[0].call;
    assert_eq!(seen.nested.len(), 4);
    assert!(seen.nested[1..].iter().all(|n| n.data.len() == 256));
    assert_eq!(rd32(&seen.nested[0].data, 0), 256);
}

// ---- fds ----------------------------------------------------------------------------------------

#[test]
fn test_register_fd_carries_the_host_file_of_the_named_open() {
    let mut env = Env::new();
    let gpu = env.proxy.open(FrontendNode::Gpu(0)).unwrap();
    env.fds.add(7, env.ctl);
    env.mem.map(A, &7i32.to_ne_bytes());
    assert_eq!(env.ioctl(gpu, nv_iowr(0xc9, 4), A).unwrap(), 0);
    let seen = env.host.calls_nr(0xc9).pop().unwrap();
    assert_eq!(
        rd32(&seen.call.params, 0) as i32,
        env.proxy.host_file_id(env.ctl).unwrap()
    );
    assert_eq!(seen.node, NodeKind::Gpu(1));
    assert_eq!(env.mem.u32_at(A), 7);
}

#[test]
fn test_register_fd_with_a_foreign_fd_is_ebadf() {
    let mut env = Env::new();
    let gpu = env.proxy.open(FrontendNode::Gpu(0)).unwrap();
    env.mem.map(A, &9i32.to_ne_bytes());
    assert_eq!(
        env.ioctl(gpu, nv_iowr(0xc9, 4), A).unwrap_err().errno(),
        libc::EBADF
    );
    assert!(env.host.calls_nr(0xc9).is_empty());
}

#[test]
fn test_resolver_errno_is_passed_on() {
    struct Failing;
    impl FdResolver for Failing {
        fn resolve(&self, _fd: i32) -> Result<OpenId, FdError> {
            Err(FdError::Errno(libc::ESRCH))
        }
    }
    let mut env = Env::new();
    let gpu = env.proxy.open(FrontendNode::Gpu(0)).unwrap();
    env.mem.map(A, &7i32.to_ne_bytes());
    let err = env
        .proxy
        .ioctl(gpu, &CALLER, nv_iowr(0xc9, 4), A, &mut env.mem, &Failing)
        .unwrap_err();
    assert_eq!(err.errno(), libc::ESRCH);
}

fn map_memory_params(c: u32, dev: u32, mem: u32, fd: i32) -> Vec<u8> {
    let mut p = vec![0u8; 56];
    wr32(&mut p, 0, c);
    wr32(&mut p, 4, dev);
    wr32(&mut p, 8, mem);
    wr64(&mut p, 24, 0x1000);
    wr32(&mut p, 48, nvproxy_abi::fd_field::to_u32(fd));
    p
}

#[test]
fn test_map_memory_substitutes_the_targets_mapping_file() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, sub) = env.device(c, 1);
    let target = env.proxy.open(FrontendNode::Gpu(0)).unwrap();
    env.fds.add(11, target);
    env.mem.map(A, &map_memory_params(c, dev, sub, 11));
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x4e, 56), A).unwrap(), 0);
    let seen = env.host.calls_nr(0x4e).pop().unwrap();
    let mapping = env.host.mapping_files();
    assert_eq!(mapping.len(), 1);
    assert_eq!(mapping[0].1, NodeKind::Gpu(1)); // the target's node, as the host numbers it
    assert_eq!(rd32(&seen.call.params, 48) as i32, mapping[0].0);
    assert_ne!(mapping[0].0, env.proxy.host_file_id(target).unwrap());
    assert_eq!(rd32(&env.mem.get(A, 56), 48), 11);
    assert_eq!(env.proxy.mapping_file_count(), 1);
}

/// Maps memory `mem` of `c` with the target open as fd 11; returns the status.
fn map_into(env: &mut Env, c: u32, dev: u32, mem: u32, target: OpenId) -> u32 {
    env.fds.add(11, target);
    env.mem.map(A, &map_memory_params(c, dev, mem, 11));
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x4e, 56), A).unwrap(), 0);
    rd32(&env.mem.get(A, 56), 40)
}

#[test]
fn test_map_memory_second_context_on_one_open_is_state_in_use() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, sub) = env.device(c, 1);
    let target = env.proxy.open(FrontendNode::Ctl).unwrap();
    assert_eq!(map_into(&mut env, c, dev, sub, target), 0);
    env.host.clear();
    assert_eq!(map_into(&mut env, c, dev, sub, target), NV_ERR_STATE_IN_USE);
    assert!(env.host.calls_nr(0x4e).is_empty());
    assert_eq!(env.host.mapping_files().len(), 1);
    assert_eq!(env.events.all().last().unwrap().decision, Decision::Failed);
}

#[test]
fn test_map_memory_failed_on_the_host_leaves_the_open_without_context() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, sub) = env.device(c, 1);
    let target = env.proxy.open(FrontendNode::Ctl).unwrap();
    env.host.set_escape_errno(0x4e, libc::EINVAL);
    env.fds.add(11, target);
    env.mem.map(A, &map_memory_params(c, dev, sub, 11));
    let ctl = env.ctl;
    assert_eq!(
        env.ioctl(ctl, nv_iowr(0x4e, 56), A).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(
        env.proxy.mapping_fd(target).unwrap_err().errno(),
        libc::EINVAL
    );
    let host = env.host.clone();
    host.clear_escape_errno(0x4e);
    assert_eq!(map_into(&mut env, c, dev, sub, target), 0);
    let seen = env.host.calls_nr(0x4e);
    assert_eq!(seen.len(), 2);
    assert_eq!(
        rd32(&seen[0].call.params, 48),
        rd32(&seen[1].call.params, 48)
    );
}

#[test]
fn test_map_memory_with_a_foreign_fd_creates_no_mapping_file() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, sub) = env.device(c, 1);
    env.mem.map(A, &map_memory_params(c, dev, sub, 12));
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x4e, 56), A).unwrap(), 0);
    assert_eq!(rd32(&env.mem.get(A, 56), 40), NV_ERR_INVALID_ARGUMENT);
    assert!(env.host.mapping_files().is_empty());
}

#[test]
fn test_map_memory_without_an_mmap_path_is_not_supported_before_the_host() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, sub) = env.device(c, 1);
    let target = env.proxy.open(FrontendNode::Ctl).unwrap();
    env.host.set_no_mmap_path();
    assert_eq!(
        map_into(&mut env, c, dev, sub, target),
        NV_ERR_NOT_SUPPORTED
    );
    assert!(env.host.calls_nr(0x4e).is_empty());
    let ev = env.events.all().pop().unwrap();
    assert_eq!(
        (ev.decision, ev.nv_status),
        (Decision::Denied, Some(NV_ERR_NOT_SUPPORTED))
    );
}

use tenant_log::capture::captured;

/// Issue 20, 3: a tenant that names mmap targets on a host without an mmap path (each is
/// refused, each used to log "no mapping file") writes at most its instance's burst of lines,
/// then a summary of the rest.
#[test]
fn test_a_flood_of_refused_mmap_targets_writes_a_bounded_log_with_a_summary() {
    let name = "mapping-log-flood";
    let mut env = Env::with(
        VERSION,
        InstancePolicy::new(name, Caps::COMPUTE_UTILITY, vec![1, 2]),
    );
    let c = env.alloc_client(env.ctl);
    let (dev, sub) = env.device(c, 1);
    let target = env.proxy.open(FrontendNode::Ctl).unwrap();
    env.host.set_no_mmap_path();
    let refused = 2_000;
    let log = captured(|| {
        for _ in 0..refused {
            assert_eq!(
                map_into(&mut env, c, dev, sub, target),
                NV_ERR_NOT_SUPPORTED
            );
        }
        tenant_log::flush(name);
    });
    let lines = log
        .lines()
        .filter(|l| l.contains("no mapping file"))
        .count();
    assert!(
        lines >= 1 && lines as f64 <= tenant_log::BURST + 2.0,
        "{lines} lines for {refused} refusals"
    );
    let counted: usize = log
        .lines()
        .filter(|l| l.contains(name))
        .filter_map(|l| l.split("suppressed=").nth(1))
        .map(|n| {
            n.split_whitespace()
                .next()
                .unwrap()
                .parse::<usize>()
                .unwrap()
        })
        .sum();
    assert_eq!(lines + counted, refused, "{log}");
}

#[test]
fn test_mapping_fd_is_the_mapping_files_mmap_fd() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, sub) = env.device(c, 1);
    let target = env.proxy.open(FrontendNode::Ctl).unwrap();
    assert_eq!(map_into(&mut env, c, dev, sub, target), 0);
    let (_fd, adjust) = env.proxy.mapping_fd(target).unwrap();
    assert_eq!(adjust, 0);
    assert_eq!(
        env.host.mmap_fd_calls(),
        vec![env.host.mapping_files()[0].0]
    );
}

#[test]
fn test_mapping_fd_of_an_open_without_context_is_einval() {
    let env = Env::new();
    let other = env.proxy.open(FrontendNode::Ctl).unwrap();
    assert_eq!(
        env.proxy.mapping_fd(other).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(
        env.proxy.mapping_fd(OwnerId(999)).unwrap_err().errno(),
        libc::EBADF
    );
    assert!(env.host.mmap_fd_calls().is_empty());
}

#[test]
fn test_release_closes_the_opens_mapping_file() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, sub) = env.device(c, 1);
    let target = env.proxy.open(FrontendNode::Ctl).unwrap();
    assert_eq!(map_into(&mut env, c, dev, sub, target), 0);
    let before = env.host.open_files();
    env.proxy.release(target);
    assert!(env.host.mapping_files().is_empty());
    assert_eq!(env.host.open_files(), before - 2); // the open's host file and its mapping file
    assert_eq!(env.proxy.mapping_file_count(), 0);
}

#[test]
fn test_map_memory_with_a_foreign_fd_is_invalid_argument_status() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, sub) = env.device(c, 1);
    env.mem.map(A, &map_memory_params(c, dev, sub, 12));
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x4e, 56), A).unwrap(), 0);
    assert_eq!(rd32(&env.mem.get(A, 56), 40), NV_ERR_INVALID_ARGUMENT);
    assert!(env.host.calls_nr(0x4e).is_empty());
}

#[test]
fn test_os_event_fd_is_translated_consistently_for_alloc_and_nv0005() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    let evfile = env.proxy.open(FrontendNode::Ctl).unwrap();
    env.fds.add(20, evfile);
    let host_id = nvproxy_abi::fd_field::to_u32(env.proxy.host_file_id(evfile).unwrap());
    let mut p = vec![0u8; 16];
    wr32(&mut p, 0, c);
    wr32(&mut p, 4, dev);
    wr32(&mut p, 8, 20);
    env.mem.map(A, &p);
    assert_eq!(env.ioctl(evfile, nv_iowr(0xce, 16), A).unwrap(), 0);
    assert_eq!(rd32(&env.host.calls_nr(0xce)[0].call.params, 8), host_id);
    let mut ev = vec![0u8; 24];
    wr32(&mut ev, 0, c);
    wr32(&mut ev, 4, dev);
    wr32(&mut ev, 8, 0x79);
    wr64(&mut ev, 16, 20);
    let (status, _) = env.alloc(c, dev, 0x79, &ev);
    assert_eq!(status, 0);
    let seen = env.host.calls_nr(0x2b).pop().unwrap().call;
    assert_eq!(rd64(&seen.nested[0].data, 16), u64::from(host_id));
    assert_eq!(rd64(&env.mem.get(0x12_0000, 24), 16), 20);
    wr32(&mut p, 12, 0);
    env.mem.map(A, &p);
    assert_eq!(env.ioctl(evfile, nv_iowr(0xcf, 16), A).unwrap(), 0);
    assert_eq!(rd32(&env.host.calls_nr(0xcf)[0].call.params, 8), host_id);
}

fn alloc_memory_params(c: u32, dev: u32, h: u32, fd: i32) -> Vec<u8> {
    let mut p = vec![0u8; 56];
    for (i, v) in [c, dev, h, 0x3e, 0].into_iter().enumerate() {
        wr32(&mut p, 4 * i, v);
    }
    wr32(&mut p, 48, nvproxy_abi::fd_field::to_u32(fd));
    p
}

#[test]
fn test_alloc_memory_map_now_substitutes_the_mapping_file_and_records_the_object() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    let mapfile = env.proxy.open(FrontendNode::Ctl).unwrap();
    env.fds.add(30, mapfile);
    env.mem
        .map(A, &alloc_memory_params(c, dev, 0xbee0_0001, 30));
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x27, 56), A).unwrap(), 0);
    let seen = env.host.calls_nr(0x27).pop().unwrap();
    let mapping = env.host.mapping_files();
    assert_eq!(
        mapping,
        vec![(rd32(&seen.call.params, 48) as i32, NodeKind::Ctl)]
    );
    assert!(env.proxy.mapping_fd(mapfile).is_ok());
    let before = env.proxy.object_count();
    let (s, _) = env.control(c, 0xbee0_0001, 0x2080_8001, &[0; 4]);
    assert_eq!((s, env.proxy.object_count()), (0, before));
}

#[test]
fn test_alloc_memory_map_now_into_a_target_with_context_is_einval_before_allocating() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    let mapfile = env.proxy.open(FrontendNode::Ctl).unwrap();
    env.fds.add(30, mapfile);
    env.mem
        .map(A, &alloc_memory_params(c, dev, 0xbee0_0001, 30));
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x27, 56), A).unwrap(), 0);
    env.mem
        .map(A, &alloc_memory_params(c, dev, 0xbee0_0002, 30));
    assert_eq!(
        env.ioctl(ctl, nv_iowr(0x27, 56), A).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(env.host.calls_nr(0x27).len(), 1);
}

#[test]
fn test_alloc_memory_os_descriptor_is_never_forwarded() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0u8; 56];
    for (i, v) in [c, c, 0xbee0_0002, 0x71].into_iter().enumerate() {
        wr32(&mut p, 4 * i, v);
    }
    wr64(&mut p, 24, 0x7fff_0000_0000);
    env.mem.map(A, &p);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x27, 56), A).unwrap(), 0);
    assert_eq!(rd32(&env.mem.get(A, 56), 40), NV_ERR_NOT_SUPPORTED);
    assert!(env.host.calls_nr(0x27).is_empty());
}

// ---- other escapes -------------------------------------------------------------------------------

#[test]
fn test_vid_heap_alloc_size_nests_address_and_records_memory() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    env.mem.map(B, &[0; 8]);
    let mut p = vec![0u8; 184];
    wr32(&mut p, 0, c);
    wr32(&mut p, 4, dev);
    wr32(&mut p, 8, 2); // NVOS32_FUNCTION_ALLOC_SIZE
    wr64(&mut p, 120, B);
    env.mem.map(A, &p);
    let before = env.proxy.object_count();
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x4a, 184), A).unwrap(), 0);
    assert_eq!(rd64(&env.mem.get(B, 8), 0), 0xfeed_0000);
    assert_eq!(rd64(&env.mem.get(A, 184), 120), B);
    assert_eq!(env.proxy.object_count(), before + 1);
}

#[test]
fn test_vid_heap_functions_other_than_alloc_size_are_refused() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0u8; 184];
    wr32(&mut p, 0, c);
    wr32(&mut p, 4, c);
    wr32(&mut p, 8, 27);
    env.mem.map(A, &p);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x4a, 184), A).unwrap(), 0);
    assert_eq!(rd32(&env.mem.get(A, 184), 20), NV_ERR_NOT_SUPPORTED);
    assert!(env.host.calls_nr(0x4a).is_empty());
}

#[test]
fn test_handle_only_escapes_check_and_forward() {
    let mut env = graphics_env();
    let c = env.alloc_client(env.ctl);
    let (dev, sub) = env.device(c, 1);
    let ctl = env.ctl;
    for (nr, size) in [(0x4f, 32), (0x57, 56), (0x58, 40), (0x5e, 40)] {
        let mut p = vec![0u8; size];
        wr32(&mut p, 0, c);
        wr32(&mut p, 4, dev);
        wr32(&mut p, 8, sub);
        env.mem.map(A, &p);
        assert_eq!(
            env.ioctl(ctl, nv_iowr(nr, size), A).unwrap(),
            0,
            "escape {nr:#x}"
        );
        assert_eq!(env.host.calls_nr(nr).len(), 1, "escape {nr:#x}");
        wr32(&mut p, 8, 0x7777);
        env.mem.map(A, &p);
        assert_eq!(env.ioctl(ctl, nv_iowr(nr, size), A).unwrap(), 0);
        assert_eq!(
            env.host.calls_nr(nr).len(),
            1,
            "unknown handle forwarded for {nr:#x}"
        );
    }
}

#[test]
fn test_idle_channels_checks_every_client_in_its_arrays() {
    let mut env = graphics_env();
    let c = env.alloc_client(env.ctl);
    let arrays = |v: u32| {
        [v, v]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect::<Vec<u8>>()
    };
    env.mem.map(B, &arrays(c));
    env.mem.map(B + 0x100, &arrays(1));
    env.mem.map(B + 0x200, &arrays(2));
    let mut p = vec![0u8; 56];
    wr32(&mut p, 0, c);
    wr32(&mut p, 12, 2);
    wr64(&mut p, 16, B);
    wr64(&mut p, 24, B + 0x100);
    wr64(&mut p, 32, B + 0x200);
    env.mem.map(A, &p);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x41, 56), A).unwrap(), 0);
    assert_eq!(env.host.calls_nr(0x41)[0].call.nested.len(), 3);
    env.mem.map(B, &arrays(0x6666));
    env.mem.map(A, &p);
    env.ioctl(ctl, nv_iowr(0x41, 56), A).unwrap();
    assert_eq!(rd32(&env.mem.get(A, 56), 48), NV_ERR_INVALID_CLIENT);
    assert_eq!(env.host.calls_nr(0x41).len(), 1);
}

#[test]
fn test_context_dma2_is_recorded_with_its_memory() {
    let mut env = graphics_env();
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    let mut p = vec![0u8; 56];
    for (i, v) in [c, sub, 0xd0a, 0x2, 0, 0, sub].into_iter().enumerate() {
        wr32(&mut p, 4 * i, v);
    }
    env.mem.map(A, &p);
    let before = env.proxy.object_count();
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x54, 56), A).unwrap(), 0);
    assert_eq!(env.proxy.object_count(), before + 1);
}

// ---- caps, policy, audit -----------------------------------------------------------------------

#[test]
fn test_graphics_escape_is_einval_without_graphics_cap() {
    let mut env = Env::new();
    env.mem.map(A, &[0; 56]);
    let ctl = env.ctl;
    assert_eq!(
        env.ioctl(ctl, nv_iowr(0x41, 56), A).unwrap_err().errno(),
        libc::EINVAL
    );
    assert!(env.host.calls().is_empty());
}

#[test]
fn test_graphics_control_is_not_supported_without_graphics_cap() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    let (status, _) = env.control(c, dev, 0x80_1102, &[0; 16]); // NV0080_CTRL_CMD_GR_GET_CAPS
    assert_eq!(status, NV_ERR_NOT_SUPPORTED);
    let ev = env.events.all().pop().unwrap();
    assert_eq!((ev.decision, ev.reason), (Decision::Denied, Some("policy")));
}

#[test]
fn test_video_class_is_invalid_class_without_video_cap() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    assert_eq!(env.alloc(c, dev, 0xc4b0, &[0; 12]).0, NV_ERR_INVALID_CLASS);
}

#[test]
fn test_admin_only_control_needs_the_admins_allowlist() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    assert_eq!(
        env.control(c, sub, ECC_COUNTS, &[0; 40]).0,
        NV_ERR_NOT_SUPPORTED
    );
    let mut policy = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![1]);
    policy
        .allow
        .insert("NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS".into());
    let mut env = Env::with(VERSION, policy);
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    assert_eq!(env.control(c, sub, ECC_COUNTS, &[0; 40]).0, 0);
    assert_eq!(env.host.controls(ECC_COUNTS).len(), 1);
}

#[test]
fn test_admin_deny_list_wins_over_caps() {
    let mut policy = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![1]);
    policy
        .deny
        .insert("NV0000_CTRL_CMD_GPU_GET_PROBED_IDS".into());
    let mut env = Env::with(VERSION, policy);
    let c = env.alloc_client(env.ctl);
    assert_eq!(env.control(c, c, 0x214, &[0; 256]).0, NV_ERR_NOT_SUPPORTED);
}

#[test]
fn test_audit_mode_forwards_and_records_would_deny() {
    let mut policy = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![1]);
    policy.mode = Mode::Audit;
    let mut env = Env::with(VERSION, policy);
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    assert_eq!(env.control(c, sub, ECC_COUNTS, &[0; 40]).0, 0);
    assert_eq!(env.host.controls(ECC_COUNTS).len(), 1);
    let ev = env.events.all().pop().unwrap();
    assert_eq!(
        (ev.decision, ev.name.as_str()),
        (
            Decision::AuditWouldDeny,
            "NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS"
        )
    );
    // Unknown entries keep their NV answers, and isolation holds.
    assert_eq!(
        env.control(c, c, 0x0000_0b7f, &[0; 4]).0,
        NV_ERR_NOT_SUPPORTED
    );
    assert_eq!(
        env.control(0x9999, 0x9999, 0x214, &[0; 256]).0,
        NV_ERR_INVALID_CLIENT
    );
}

#[test]
fn test_audit_mode_lets_a_graphics_escape_through() {
    let mut policy = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![1]);
    policy.mode = Mode::Audit;
    let mut env = Env::with(VERSION, policy);
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0u8; 56];
    wr32(&mut p, 0, c);
    env.mem.map(A, &p);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x41, 56), A).unwrap(), 0);
    assert_eq!(env.host.calls_nr(0x41).len(), 1);
    assert_eq!(
        env.events.all().pop().unwrap().decision,
        Decision::AuditWouldDeny
    );
}

#[test]
fn test_allowed_calls_are_counted_not_logged() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    env.control(c, c, 0x214, &[0; 256]);
    env.control(c, c, 0x214, &[0; 256]);
    let counts = env.proxy.counts();
    assert_eq!(
        counts.get(
            Kind::Control,
            "NV0000_CTRL_CMD_GPU_GET_PROBED_IDS",
            Decision::Allowed
        ),
        2
    );
    assert_eq!(
        counts.get(Kind::Class, "NV01_ROOT_CLIENT", Decision::Allowed),
        1
    );
    assert!(env.events.all().is_empty());
}

// ---- retries and concurrency -----------------------------------------------------------------------

#[test]
fn test_retry_transport_reruns_alloc_without_duplicate_side_effects() {
    let mut env = Env::new();
    env.mem = FakeMem::retrying();
    let mut p = vec![0u8; 48];
    wr32(&mut p, 12, 0x41);
    wr64(&mut p, 16, B);
    env.mem.map(A, &p);
    env.mem.map(B, &[0; 4]);
    let ctl = env.ctl;
    assert_eq!(env.ioctl_retrying(ctl, nv_iowr(0x2b, 48), A).unwrap(), 0);
    assert_eq!(env.mem.rounds, 2);
    assert_eq!(env.host.calls_nr(0x2b).len(), 1);
    assert_eq!(env.proxy.object_count(), 1);
}

#[test]
fn test_retry_transport_reruns_control_with_embedded_list() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    env.mem = FakeMem::retrying();
    let mut top = vec![0u8; 32];
    wr32(&mut top, 0, c);
    wr32(&mut top, 4, dev);
    wr32(&mut top, 8, CLASSLIST);
    wr64(&mut top, 16, B);
    wr32(&mut top, 24, 16);
    let mut p = vec![0u8; 16];
    wr32(&mut p, 0, 2);
    wr64(&mut p, 8, B + 0x100);
    env.mem.map(A, &top);
    env.mem.map(B, &p);
    env.mem.map(B + 0x100, &[0; 8]);
    let ctl = env.ctl;
    assert_eq!(env.ioctl_retrying(ctl, nv_iowr(0x2a, 32), A).unwrap(), 0);
    assert_eq!(env.mem.rounds, 3);
    assert_eq!(env.host.controls(CLASSLIST).len(), 1);
    assert_eq!(env.mem.u32_at(B + 0x104), 0xc001);
}

#[test]
fn test_concurrent_allocs_and_frees_keep_the_table_consistent() {
    let host = FakeHost::new(VERSION, &HOST_GPUS);
    let (proxy, _) = proxy_on(&host, InstancePolicy::new("t", Caps::COMPUTE, vec![1]));
    let proxy = Arc::new(proxy);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let proxy = proxy.clone();
            std::thread::spawn(move || {
                let open = proxy.open(FrontendNode::Ctl).unwrap();
                let fds = FakeFds::default();
                let mut mem = FakeMem::new();
                for _ in 0..50 {
                    let mut p = vec![0u8; 48];
                    wr32(&mut p, 12, 0x41);
                    mem.map(A, &p);
                    proxy
                        .ioctl(open, &CALLER, nv_iowr(0x2b, 48), A, &mut mem, &fds)
                        .unwrap();
                    let h = rd32(&mem.get(A, 48), 8);
                    assert!(proxy.has_client(h), "thread {t}");
                    let mut f = vec![0u8; 16];
                    wr32(&mut f, 0, h);
                    wr32(&mut f, 8, h);
                    mem.map(A, &f);
                    proxy
                        .ioctl(open, &CALLER, nv_iowr(0x29, 16), A, &mut mem, &fds)
                        .unwrap();
                    assert_eq!(rd32(&mem.get(A, 16), 12), 0);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(proxy.object_count(), 0);
    assert_eq!(host.calls_nr(0x2b).len(), 200);
}

#[test]
fn test_proxy_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Proxy>();
}

#[test]
fn test_host_errno_is_passed_through() {
    let mut env = Env::new();
    env.host.set_escape_errno(0xd2, libc::EINVAL);
    env.mem.map(A, &[0; 72]);
    let ctl = env.ctl;
    assert_eq!(
        env.ioctl(ctl, 0xc048_46d2, A).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(env.events.all()[0].decision, Decision::Failed);
}

// ---- more fd and pointer fields ------------------------------------------------------------------

#[test]
fn test_os_unix_export_fd_is_translated_and_foreign_is_invalid_parameter() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    let export = env.proxy.open(FrontendNode::Ctl).unwrap();
    env.fds.add(40, export);
    let mut p = vec![0u8; 24]; // NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS
    wr32(&mut p, 0, 1); // type RM
    wr32(&mut p, 4, dev);
    wr32(&mut p, 8, c);
    wr32(&mut p, 12, dev);
    wr32(&mut p, 16, 40);
    let (status, out) = env.control(c, c, 0x3d05, &p);
    assert_eq!((status, rd32(&out, 16)), (0, 40));
    let seen = &env.host.controls(0x3d05)[0].call.nested[0].data;
    assert_eq!(
        rd32(seen, 16) as i32,
        env.proxy.host_file_id(export).unwrap()
    );
    wr32(&mut p, 16, 41);
    assert_eq!(env.control(c, c, 0x3d05, &p).0, 0x3b);
    assert_eq!(env.host.controls(0x3d05).len(), 1);
}

#[test]
fn test_os_unix_import_records_the_new_object() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    let export = env.proxy.open(FrontendNode::Ctl).unwrap();
    env.fds.add(40, export);
    let mut p = vec![0u8; 20]; // NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS
    wr32(&mut p, 0, 40);
    wr32(&mut p, 4, 1);
    wr32(&mut p, 8, dev);
    wr32(&mut p, 12, dev);
    wr32(&mut p, 16, 0xabc0_0001);
    let before = env.proxy.object_count();
    assert_eq!(env.control(c, c, 0x3d06, &p).0, 0);
    assert_eq!(env.proxy.object_count(), before + 1);
}

#[test]
fn test_multicast_attach_gpu_device_fd_is_translated() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    let gpu = env.proxy.open(FrontendNode::Gpu(0)).unwrap();
    env.fds.add(50, gpu);
    let mut p = vec![0u8; 16]; // NV00FD_CTRL_ATTACH_GPU_PARAMS
    wr32(&mut p, 0, sub);
    wr64(&mut p, 8, 50);
    assert_eq!(env.control(c, c, 0xfd_0104, &p).0, 0);
    let seen = &env.host.controls(0xfd_0104)[0].call.nested[0].data;
    assert_eq!(
        nvproxy_abi::fd_field::from_u64(rd64(seen, 8)),
        env.proxy.host_file_id(gpu).unwrap()
    );
    wr64(&mut p, 8, 51);
    assert_eq!(env.control(c, c, 0xfd_0104, &p).0, 0x26); // NV_ERR_INVALID_DEVICE
}

#[test]
fn test_alloc_memory_local_user_hides_the_fd() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    let mut p = vec![0u8; 56];
    for (i, v) in [c, dev, 0xbee0_0003, 0x40].into_iter().enumerate() {
        wr32(&mut p, 4 * i, v);
    }
    wr32(&mut p, 48, 1234);
    env.mem.map(A, &p);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x27, 56), A).unwrap(), 0);
    assert_eq!(rd32(&env.host.calls_nr(0x27)[0].call.params, 48) as i32, -1);
    assert_eq!(rd32(&env.mem.get(A, 56), 48), 1234);
}

#[test]
fn test_p2p_caps_550_nests_both_peer_id_arrays() {
    let mut env = Env::with(
        "550.163.01",
        InstancePolicy::new("t", Caps::COMPUTE, vec![1, 2]),
    );
    let c = env.alloc_client(env.ctl);
    env.mem.map(B, &[0; 16]);
    env.mem.map(B + 0x100, &[0; 16]);
    let mut p = vec![0u8; 176];
    wr32(&mut p, 0, 0x200);
    wr32(&mut p, 4, 0x300);
    wr32(&mut p, 128, 2);
    wr64(&mut p, 160, B);
    wr64(&mut p, 168, B + 0x100);
    assert_eq!(env.control(c, c, 0x127, &p).0, 0);
    let seen = &env.host.controls(0x127)[0].call;
    assert_eq!(seen.nested.len(), 3);
    assert!(seen.nested[1..].iter().all(|n| n.data.len() == 16));
    wr32(&mut p, 4, 0x100);
    assert_eq!(env.control(c, c, 0x127, &p).0, NV_ERR_INVALID_ARGUMENT);
}

#[test]
fn test_debugger_read_memory_length_is_bounded() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0u8; 24];
    wr32(&mut p, 4, 0xffff_ffff);
    wr64(&mut p, 16, B);
    env.mem.largest_read = 0;
    // hObject is the client itself: the check order reaches the size bound.
    assert_eq!(
        env.control(c, c, 0x83de_0315, &p).0,
        NV_ERR_INVALID_ARGUMENT
    );
    assert!(env.mem.largest_read <= 32);
}

// ---- pass-through controls named per command ------------------------------------------------

/// An allowlist-only policy with what `Env` needs to make a client, a device and a subdevice,
/// plus `names`.
fn only_policy(names: &[&str]) -> InstancePolicy {
    let mut policy = InstancePolicy::new("t", Caps::NONE, vec![1]);
    let base = [
        "NV_ESC_RM_ALLOC",
        "NV_ESC_RM_CONTROL",
        "NV01_ROOT_CLIENT",
        "NV01_DEVICE_0",
        "NV20_SUBDEVICE_0",
    ];
    policy.only = Some(base.iter().chain(names).map(|n| (*n).to_owned()).collect());
    policy
}

/// The legacy GSS commands libcuda's `cuInit` sends, by the name the headers give them: GPU
/// legacy category (`NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED`, 0x81), messages 0x59 and 0x62,
/// which no header of the version names (`nvproxy_abi::legacy`).
const G59: &str = "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x59";
const G62: &str = "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x62";

fn only_env(names: &[&str]) -> Env {
    Env::with(VERSION, only_policy(names))
}

/// The last audit event: (name, number, decision, reason, NV status).
fn last_event(env: &Env) -> (String, u32, Decision, Option<&'static str>, Option<u32>) {
    let ev = env.events.all().pop().expect("an audit event");
    assert_eq!(ev.kind, Kind::Control);
    (ev.name, ev.number, ev.decision, ev.reason, ev.nv_status)
}

#[test]
fn test_only_naming_one_legacy_gss_command_forwards_it_and_denies_another() {
    let mut env = only_env(&[G59]);
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    env.host.clear();
    assert_eq!(env.control(c, sub, 0x2080_8159, &[7; 64]).0, 0);
    assert_eq!(env.host.controls(0x2080_8159).len(), 1);
    assert_eq!(
        env.control(c, sub, 0x2080_8162, &[7; 1]).0,
        NV_ERR_NOT_SUPPORTED
    );
    assert!(env.host.controls(0x2080_8162).is_empty());
    assert_eq!(
        last_event(&env),
        (
            G62.to_owned(),
            0x2080_8162,
            Decision::Denied,
            Some("policy"),
            Some(NV_ERR_NOT_SUPPORTED)
        )
    );
}

/// A legacy command of a category no header defines (NV2080 0x8b is none) keeps the opaque
/// name, and an event of it says why; the family name covers it.
#[test]
fn test_legacy_gss_command_of_an_undefined_category_is_opaque_and_says_so() {
    let mut policy = only_policy(&[G59]);
    policy.mode = Mode::Audit;
    let mut env = Env::with(VERSION, policy);
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    env.host.clear();
    assert_eq!(env.control(c, sub, 0x2080_8b01, &[7; 4]).0, 0);
    assert_eq!(env.host.controls(0x2080_8b01).len(), 1);
    let (name, number, decision, _, _) = last_event(&env);
    assert_eq!(
        (name.as_str(), number, decision),
        (
            "RM_GSS_LEGACY 0x20808b01",
            0x2080_8b01,
            Decision::AuditWouldDeny
        )
    );
    // A defined category's command is named by the headers.
    assert_eq!(env.control(c, sub, 0x2080_8159, &[7; 64]).0, 0);
    let counts = env.proxy.counts();
    assert_eq!(counts.get(Kind::Control, G59, Decision::Allowed), 1);
    // Allowed, the opaque command's event says why it has no name.
    let mut env = only_env(&["RM_GSS_LEGACY"]);
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    env.host
        .set_control_status(0x2080_8b01, NV_ERR_NOT_SUPPORTED);
    assert_eq!(
        env.control(c, sub, 0x2080_8b01, &[7; 4]).0,
        NV_ERR_NOT_SUPPORTED
    );
    let (_, _, decision, reason, _) = last_event(&env);
    assert_eq!(
        (decision, reason),
        (Decision::Failed, Some(ioctl_proxy::OPAQUE_LEGACY))
    );
}

#[test]
fn test_only_naming_the_legacy_gss_family_forwards_every_command_of_it() {
    let mut env = only_env(&["RM_GSS_LEGACY"]);
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    env.host.clear();
    assert_eq!(env.control(c, sub, 0x2080_8159, &[7; 64]).0, 0);
    assert_eq!(env.control(c, sub, 0x2080_8162, &[7; 1]).0, 0);
    assert_eq!(env.host.calls().len(), 2);
    // The family does not cover the other pass-through family.
    assert_eq!(
        env.control(c, sub, 0x2081_0108, &[7; 8]).0,
        NV_ERR_NOT_SUPPORTED
    );
}

#[test]
fn test_only_naming_one_nv2081_command_forwards_it_and_denies_another() {
    let mut env = only_env(&["NV2081_BINAPI 0x20810108"]);
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    env.host.clear();
    assert_eq!(env.control(c, sub, 0x2081_0108, &[7; 8]).0, 0);
    assert_eq!(
        env.control(c, sub, 0x2081_0109, &[7; 8]).0,
        NV_ERR_NOT_SUPPORTED
    );
    assert_eq!(env.host.calls().len(), 1);
    assert_eq!(last_event(&env).0, "NV2081_BINAPI 0x20810109");
}

#[test]
fn test_caps_policy_denying_one_legacy_gss_command_forwards_the_others() {
    let mut policy = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![1]);
    policy.deny.insert(G62.into());
    let mut env = Env::with(VERSION, policy);
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    env.host.clear();
    assert_eq!(
        env.control(c, sub, 0x2080_8162, &[7; 1]).0,
        NV_ERR_NOT_SUPPORTED
    );
    assert_eq!(env.control(c, sub, 0x2080_8159, &[7; 64]).0, 0);
    assert_eq!(env.host.calls().len(), 1);
    assert_eq!(env.host.controls(0x2080_8159).len(), 1);
}

#[test]
fn test_caps_policy_denying_the_legacy_gss_family_denies_each_command() {
    let mut policy = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![1]);
    policy.deny.insert("RM_GSS_LEGACY".into());
    let mut env = Env::with(VERSION, policy);
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    env.host.clear();
    assert_eq!(
        env.control(c, sub, 0x2080_8159, &[7; 64]).0,
        NV_ERR_NOT_SUPPORTED
    );
    assert!(env.host.calls().is_empty());
    assert_eq!(last_event(&env).0, G59);
}

#[test]
fn test_audit_mode_forwards_a_legacy_gss_command_the_only_set_leaves_out_as_would_deny() {
    let mut policy = only_policy(&[G59]);
    policy.mode = Mode::Audit;
    let mut env = Env::with(VERSION, policy);
    let c = env.alloc_client(env.ctl);
    let (_, sub) = env.device(c, 1);
    env.host.clear();
    assert_eq!(env.control(c, sub, 0x2080_8162, &[7; 1]).0, 0);
    assert_eq!(env.host.controls(0x2080_8162).len(), 1);
    assert_eq!(
        last_event(&env),
        (
            G62.to_owned(),
            0x2080_8162,
            Decision::AuditWouldDeny,
            Some("policy"),
            Some(0)
        )
    );
}

/// Issue 9 finding 3: `NV0005_ALLOC_PARAMETERS.hClass` flipped by another tenant thread from
/// `NV01_EVENT_OS_EVENT` to `NV01_EVENT_KERNEL_CALLBACK` (0x78) right after the proxy's read
/// must not reach the driver: the class is judged on the one copy the host gets.
#[test]
fn test_nv01_event_class_flipped_after_the_read_never_reaches_the_host() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (dev, _) = env.device(c, 1);
    let evfile = env.proxy.open(FrontendNode::Ctl).unwrap();
    env.fds.add(20, evfile);
    let mut ev = vec![0u8; 24];
    wr32(&mut ev, 0, c);
    wr32(&mut ev, 4, dev);
    wr32(&mut ev, 8, 0x79);
    wr64(&mut ev, 16, 20);
    // Env::alloc maps the alloc params at 0x12_0000; hClass is at offset 8.
    env.mem
        .flip_after_read(0x12_0000 + 8, &0x78u32.to_ne_bytes());
    let (status, _) = env.alloc(c, dev, 0x5, &ev);
    assert_eq!(status, 0);
    let seen = env.host.calls_nr(0x2b).pop().unwrap().call;
    assert_eq!(rd32(&seen.params, 12), 0x5, "NV01_EVENT forwarded");
    assert_eq!(
        rd32(&seen.nested[0].data, 8),
        0x79,
        "the driver got another hClass than the one judged"
    );
    // The audit trail names what the driver got.
    assert_eq!(
        env.proxy
            .counts()
            .get(Kind::Class, "NV01_EVENT_OS_EVENT", Decision::Allowed),
        1
    );
}

/// A nested pointer into the top-level params (found by the `proxy_ioctl` fuzzer: an
/// NVOS64 whose `pAllocParms` pointed one byte past its own start) would read those client
/// bytes twice: refused with `NV_ERR_INVALID_ADDRESS` before the driver sees it. Before the
/// fix the kit's read-once memory panicked here.
#[test]
fn test_nested_pointer_into_the_top_level_params_is_refused() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    env.host.clear();
    // NV01_DEVICE_0 (56-byte params) with pAllocParms at the NVOS64 plus one.
    let addr = 0x11_0000;
    let mut p = vec![0u8; 128];
    wr32(&mut p, 0, c);
    wr32(&mut p, 4, c);
    wr32(&mut p, 12, 0x80);
    wr64(&mut p, 16, addr + 1);
    wr32(&mut p, 32, 56);
    env.mem.map(addr, &p);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x2b, 48), addr).unwrap(), 0);
    assert_eq!(rd32(&env.mem.get(addr, 48), 40), NV_ERR_INVALID_ADDRESS);
    assert!(env.host.calls().is_empty(), "{:?}", env.host.calls());
    let ev = env.events.all().pop().expect("an audit event");
    assert_eq!(
        (ev.decision, ev.reason),
        (
            Decision::Denied,
            Some("nested buffer overlaps bytes already read")
        )
    );

    // The same for a control's params (NV0000_CTRL_CMD_GPU_GET_DEVICE_IDS, 4 bytes, inside
    // the NVOS54).
    let addr = 0x13_0000;
    let mut p = vec![0u8; 64];
    wr32(&mut p, 0, c);
    wr32(&mut p, 4, c);
    wr32(&mut p, 8, 0x204);
    wr64(&mut p, 16, addr + 8);
    wr32(&mut p, 24, 4);
    env.mem.map(addr, &p);
    assert_eq!(env.ioctl(ctl, nv_iowr(0x2a, 32), addr).unwrap(), 0);
    assert_eq!(rd32(&env.mem.get(addr, 32), 28), NV_ERR_INVALID_ADDRESS);
    assert!(env.host.calls().is_empty(), "{:?}", env.host.calls());
}

/// Two nested pointers at the same bytes (NVOS64's `pRightsRequested` at its own alloc
/// params) would read them twice: refused the same way.
#[test]
fn test_two_nested_pointers_at_the_same_bytes_are_refused() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    env.host.clear();
    let (addr, paddr) = (0x11_0000, 0x12_0000);
    env.mem.map(paddr, &[0; 56]);
    let mut p = vec![0u8; 48];
    wr32(&mut p, 0, c);
    wr32(&mut p, 4, c);
    wr32(&mut p, 12, 0x80);
    wr64(&mut p, 16, paddr);
    wr32(&mut p, 32, 56);
    wr64(&mut p, 24, paddr + 4);
    env.mem.map(addr, &p);
    let ctl = env.ctl;
    assert_eq!(env.ioctl(ctl, nv_iowr(0x2b, 48), addr).unwrap(), 0);
    assert_eq!(rd32(&env.mem.get(addr, 48), 40), NV_ERR_INVALID_ADDRESS);
    assert!(env.host.calls().is_empty());
}

/// An XFER whose payload pointer names the XFER struct itself: `EINVAL`, nothing forwarded.
#[test]
fn test_xfer_pointing_at_itself_is_einval() {
    let mut env = Env::new();
    let addr = 0x14_0000;
    let mut x = vec![0u8; 72];
    wr32(&mut x, 0, 0xd2);
    wr32(&mut x, 4, 72);
    wr64(&mut x, 8, addr);
    env.mem.map(addr, &x);
    let ctl = env.ctl;
    assert_eq!(
        env.ioctl(ctl, nv_iowr(0xd3, 16), addr).unwrap_err().errno(),
        libc::EINVAL
    );
    assert!(env.host.calls().is_empty());
}

/// Issue 9 finding 1: distinct unknown control numbers (also under hClient 0, refused at once)
/// and pass-through commands must not grow the instance's counts without bound.
#[test]
fn test_distinct_unknown_numbers_keep_the_counts_bounded() {
    let mut env = Env::new();
    let rows_before = env.proxy.counts().len();
    for n in 0..20_000u32 {
        // Unknown NV2080 controls (no 0x8000 bit: not legacy GSS), hClient 0.
        let cmd = 0x2080_0000 | (n % 0x7fff + 1) | (n / 0x7fff) << 24;
        let (status, _) = env.control(0, 0, cmd, &[]);
        assert_eq!(status, NV_ERR_INVALID_CLIENT);
        // Legacy GSS pass-through commands, each named by its number.
        let (status, _) = env.control(0, 0, 0x2080_8000 | (n % 0x3fff + 1), &[]);
        assert_eq!(status, NV_ERR_INVALID_CLIENT);
    }
    let rows = env.proxy.counts().snapshot();
    // Bounded by the table (known controls among the numbers tried) plus the names built from
    // numbers (pass-through commands) up to the bound, plus the fold-over rows.
    let table = env.proxy.abi().controls.len();
    assert!(
        rows.len() <= rows_before + table + AuditCounts::MAX_NAMES + 2,
        "{} rows",
        rows.len()
    );
    let other = rows
        .iter()
        .find(|r| r.name == Kind::Control.other_row() && r.decision == Decision::Denied)
        .expect("fold-over row");
    assert!(other.count >= 20_000, "{other:?}");
    assert_eq!(other.numbers.len(), AuditCounts::FIRST_NUMBERS);
}

// ---- issue 9 finding 4: controls whose output names GPUs -----------------------------------

#[test]
fn test_get_device_ids_shows_only_the_instances_devices() {
    // Host GPUs 0, 1, 2 are device instances 0, 1, 2; the instance holds host GPUs 1 and 2.
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (status, out) = env.control(c, c, 0x204, &[0; 4]);
    assert_eq!(status, 0);
    assert_eq!(rd32(&out, 0), 0b110);
    // An instance of host GPU 1 alone.
    let mut env = Env::with(
        VERSION,
        InstancePolicy::new("one", Caps::COMPUTE_UTILITY, vec![1]),
    );
    let c = env.alloc_client(env.ctl);
    let (status, out) = env.control(c, c, 0x204, &[0; 4]);
    assert_eq!(status, 0);
    assert_eq!(rd32(&out, 0), 0b10, "another tenant's GPU 0 is visible");
}

#[test]
fn test_boost_groups_name_only_the_instances_gpus() {
    let mut env = Env::with(
        VERSION,
        InstancePolicy::new("one", Caps::COMPUTE_UTILITY, vec![1]),
    );
    let c = env.alloc_client(env.ctl);
    let (status, out) = env.control(c, c, 0xa04, &[0; 2244]);
    assert_eq!(status, 0);
    assert_eq!(rd32(&out, 0), 1, "groupCount");
    assert_eq!(rd32(&out, 4), 1, "gpuCount");
    assert_eq!(rd32(&out, 8), 0x200);
    assert_eq!(rd32(&out, 12), 0, "a second id left in the group");
    assert_eq!(rd32(&out, 4 + 132), 7, "boostGroupId kept");
}

#[test]
fn test_nvlink_status_hides_peers_outside_the_set() {
    let mut env = Env::with(
        VERSION,
        InstancePolicy::new("one", Caps::COMPUTE_UTILITY, vec![1]),
    );
    let c = env.alloc_client(env.ctl);
    let (_, sd) = env.device(c, 1);
    let (status, out) = env.control(c, sd, 0x2080_3002, &[0; 5896]);
    assert_eq!(status, 0);
    for i in 0..3 {
        let e = 8 + 184 * i;
        let r = e + 88;
        if i == 1 {
            assert_eq!(out[e + 56], 1, "the link to our own GPU stays");
            assert_eq!(rd64(&out, r + 24), 2);
            assert_eq!(rd32(&out, r + 4), 0x11);
        } else {
            assert_eq!(
                out[e + 56],
                0,
                "link {i} to a GPU outside the set still connected"
            );
            assert_eq!(rd64(&out, r + 24), 0xff, "remote device type");
            assert!(
                out[r..r + 48].iter().skip(24).skip(8).all(|&b| b == 0),
                "UUID left"
            );
            assert_eq!(rd32(&out, r + 4), 0, "PCI domain left");
        }
    }
}

#[test]
fn test_gpu_pids_list_only_this_process() {
    let mut env = Env::new();
    let c = env.alloc_client(env.ctl);
    let (_, sd) = env.device(c, 1);
    let (status, out) = env.control(c, sd, 0x2080_018d, &[0; 3812]);
    assert_eq!(status, 0);
    assert_eq!(rd32(&out, 8), 1);
    assert_eq!(rd32(&out, 12), std::process::id());
    assert_eq!(rd32(&out, 16), 0);
}

#[test]
fn test_accounting_state_of_a_gpu_outside_the_set_is_refused() {
    let mut env = Env::with(
        VERSION,
        InstancePolicy::new("g", Caps::ALL_CONTAINER, vec![1]),
    );
    let c = env.alloc_client(env.ctl);
    let mut p = vec![0u8; 12];
    wr32(&mut p, 0, 0x100);
    let (status, _) = env.control(c, c, 0xb02, &p);
    assert_eq!(status, NV_ERR_INVALID_ARGUMENT);
    assert!(env.host.controls(0xb02).is_empty());
    wr32(&mut p, 0, 0x200);
    let (status, _) = env.control(c, c, 0xb02, &p);
    assert_eq!(status, 0);
}

// ---- issue 9 finding 2: per-instance quotas --------------------------------------------------

fn quota_policy(name: &str, open_files: usize, objects: usize) -> InstancePolicy {
    let mut p = InstancePolicy::new(name, Caps::COMPUTE_UTILITY, vec![1]);
    p.quotas = Quotas {
        open_files,
        objects,
        in_flight: 4,
        ..Quotas::default()
    };
    p
}

#[test]
fn test_one_instance_at_its_open_quota_leaves_the_other_alone() {
    let host = FakeHost::new(VERSION, &HOST_GPUS);
    let (a, _) = proxy_on(&host, quota_policy("a", 8, 100));
    let (b, _) = proxy_on(&host, quota_policy("b", 8, 100));
    let opens: Vec<_> = (0..8).map(|_| a.open(FrontendNode::Ctl).unwrap()).collect();
    let err = a.open(FrontendNode::Ctl).unwrap_err();
    assert_eq!(err.errno(), libc::ENOMEM, "{err}");
    assert_eq!(
        a.open(FrontendNode::Gpu(0)).unwrap_err().errno(),
        libc::ENOMEM
    );
    // The other instance is untouched.
    for _ in 0..8 {
        b.open(FrontendNode::Ctl).unwrap();
    }
    // A release gives the slot back.
    a.release(opens[0]);
    assert_eq!(a.open_files(), 7);
    a.open(FrontendNode::Ctl).unwrap();
}

#[test]
fn test_allocations_past_the_object_quota_get_insufficient_resources() {
    let mut env = Env::with(VERSION, quota_policy("a", 100, 3));
    let c = env.alloc_client(env.ctl);
    let (d, _sd) = env.device(c, 1);
    assert_eq!(env.proxy.object_count(), 3);
    env.host.clear();
    let (status, _) = env.alloc(c, d, 0x2080, &[0; 4]);
    assert_eq!(status, NV_ERR_INSUFFICIENT_RESOURCES);
    assert!(
        env.host.calls_nr(0x2b).is_empty(),
        "the driver saw an allocation past the quota"
    );
    let (status, _) = env.alloc(0, 0, 0x41, &[]);
    assert_eq!(
        status, NV_ERR_INSUFFICIENT_RESOURCES,
        "root client past the quota"
    );
    let ev = env.events.all().pop().unwrap();
    assert_eq!(
        (ev.decision, ev.reason),
        (Decision::Denied, Some("instance object quota reached"))
    );
}

#[test]
fn test_requests_past_the_in_flight_quota_fail_with_eagain() {
    let env = Env::with(VERSION, quota_policy("a", 100, 100));
    let guards: Vec<_> = (0..4).map(|_| env.proxy.enter_request().unwrap()).collect();
    let err = env.proxy.enter_request().unwrap_err();
    assert_eq!(err.errno(), libc::EAGAIN);
    drop(guards);
    env.proxy.enter_request().unwrap();
}
