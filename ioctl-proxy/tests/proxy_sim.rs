//! The proxy in front of `nvsim`, the simulated driver: a CUDA-like frontend initialisation of a
//! tenant that owns the second of two GPUs, then isolation between two instances on one driver.

mod common;

use common::*;
use ioctl_proxy::*;
use nvproxy_abi::ioctl::nv_iowr;
use nvsim::{SimConfig, SimDriver};

const LIST: u64 = 0x70_0000;

use common::SimTenant as Tenant;

#[test]
fn test_cuda_like_init_through_the_proxy_sees_only_its_gpu() {
    let sim = SimDriver::new(SimConfig::default_gpus(2));
    let ours = sim.config().gpus[1].gpu_id();
    let theirs = sim.config().gpus[0].gpu_id();
    let mut t = Tenant::new(&sim, "job", vec![1]);
    let ctl = t.proxy.open(FrontendNode::Ctl).unwrap();

    // Version query, as libcuda's first ioctl.
    let mut v = vec![0u8; 72];
    wr32(&mut v, 0, u32::from(b'2'));
    let (r, v) = t.ioctl(ctl, 0xc048_46d2, &v);
    assert_eq!((r, rd32(&v, 4)), (0, 1));
    assert!(v[8..].starts_with(b"535.261.03"));

    // CARD_INFO: one valid entry, the host's minor 1 as the tenant's 0.
    let (r, cards) = t.ioctl(ctl, nv_iowr(0xc8, 32 * 72), &[0; 32 * 72]);
    assert_eq!(r, 0);
    assert_eq!((cards[0], rd32(&cards, 16), rd32(&cards, 56)), (1, ours, 0));
    assert_eq!(cards[72], 0);

    // Root client, then the probed and attached ids.
    let (s, client) = t.alloc(ctl, 0, 0, 0x41, &[]);
    assert_eq!(s, 0);
    let (s, probed) = t.control(ctl, client, client, 0x214, &[0; 256]);
    assert_eq!(
        (s, rd32(&probed, 0), rd32(&probed, 4)),
        (0, ours, INVALID_ID)
    );
    let mut attach = vec![0xffu8; 132];
    wr32(&mut attach, 0, theirs);
    assert_eq!(t.control(ctl, client, client, 0x215, &attach).0, 0x1f);
    wr32(&mut attach, 0, ours);
    assert_eq!(t.control(ctl, client, client, 0x215, &attach).0, 0);

    // The GPU node (opening it attaches the GPU), registered with the control fd.
    let gpu = t.proxy.open(FrontendNode::Gpu(0)).unwrap();
    t.fds.add(3, ctl);
    let (r, _) = t.ioctl(gpu, nv_iowr(0xc9, 4), &3i32.to_ne_bytes());
    assert_eq!(r, 0);

    // The device instance of our GPU, then device and subdevice; the other GPU's is refused.
    let mut info = vec![0u8; 32];
    wr32(&mut info, 0, ours);
    let (s, info) = t.control(ctl, client, client, 0x205, &info);
    assert_eq!(s, 0);
    let dev_inst = rd32(&info, 8);
    let mut dev_params = vec![0u8; 56];
    wr32(&mut dev_params, 0, 1 - dev_inst);
    assert_eq!(t.alloc(ctl, client, client, 0x80, &dev_params).0, 0x22); // NV_ERR_INVALID_CLASS
    wr32(&mut dev_params, 0, dev_inst);
    let (s, device) = t.alloc(ctl, client, client, 0x80, &dev_params);
    assert_eq!(s, 0);
    let (s, subdevice) = t.alloc(ctl, client, device, 0x2080, &[0; 4]);
    assert_eq!(s, 0);

    // A class list through an embedded pointer: size query, then the list.
    let (s, q) = t.control(ctl, client, device, 0x80_0201, &[0; 16]);
    assert_eq!(s, 0);
    let n = rd32(&q, 0);
    assert!(n > 0);
    t.mem.map(LIST, &vec![0; 4 * n as usize]);
    let mut q = vec![0u8; 16];
    wr32(&mut q, 0, n);
    wr64(&mut q, 8, LIST);
    let (s, q) = t.control(ctl, client, device, 0x80_0201, &q);
    assert_eq!((s, rd64(&q, 8)), (0, LIST));
    assert!((0..n as u64).any(|i| t.mem.u32_at(LIST + 4 * i) == 0x2080));

    // A subdevice control the simulator answers.
    let (s, _) = t.control(ctl, client, subdevice, 0x2080_0110, &[0; 132]);
    assert_eq!(s, 0);

    // Free the client; release everything; the driver is empty again.
    let mut free = vec![0u8; 16];
    wr32(&mut free, 0, client);
    wr32(&mut free, 8, client);
    let (_, out) = t.ioctl(ctl, nv_iowr(0x29, 16), &free);
    assert_eq!(rd32(&out, 12), 0);
    assert_eq!(t.proxy.object_count(), 0);
    t.proxy.release(gpu);
    t.proxy.release(ctl);
    assert_eq!((sim.live_clients(), sim.open_files()), (0, 0));
}

#[test]
fn test_two_instances_on_one_simulated_driver_are_isolated() {
    let sim = SimDriver::new(SimConfig::default_gpus(2));
    let mut a = Tenant::new(&sim, "a", vec![0]);
    let mut b = Tenant::new(&sim, "b", vec![1]);
    let (a_ctl, b_ctl) = (
        a.proxy.open(FrontendNode::Ctl).unwrap(),
        b.proxy.open(FrontendNode::Ctl).unwrap(),
    );
    let (s, a_client) = a.alloc(a_ctl, 0, 0, 0x41, &[]);
    assert_eq!(s, 0);
    let (s, b_client) = b.alloc(b_ctl, 0, 0, 0x41, &[]);
    assert_eq!(s, 0);
    assert_eq!(
        b.control(b_ctl, a_client, a_client, 0x214, &[0; 256]).0,
        0x23
    );
    assert_eq!(b.alloc(b_ctl, a_client, a_client, 0x80, &[0; 56]).0, 0x23);
    let mut dup = vec![0u8; 28];
    for (i, v) in [b_client, b_client, 0, a_client, a_client]
        .into_iter()
        .enumerate()
    {
        wr32(&mut dup, 4 * i, v);
    }
    let (_, out) = b.ioctl(b_ctl, nv_iowr(0x34, 28), &dup);
    assert_eq!(rd32(&out, 24), 0x23);
    assert_eq!(sim.live_clients(), 2);
    // Releasing B's open frees only B's client, in the proxy and in the driver.
    assert_eq!(b.proxy.release(b_ctl), vec![b_client]);
    assert_eq!(sim.live_clients(), 1);
    assert!(a.proxy.has_client(a_client));
}

#[test]
fn test_sim_driver_version_selects_the_table() {
    let sim = SimDriver::new(SimConfig::default_gpus(1).with_version("580.142".parse().unwrap()));
    let mut t = Tenant::new(&sim, "t", vec![0]);
    let ctl = t.proxy.open(FrontendNode::Ctl).unwrap();
    let (s, client) = t.alloc(ctl, 0, 0, 0x41, &[]);
    assert_eq!(s, 0);
    let (s, probed) = t.control(ctl, client, client, 0x214, &[0; 384]);
    assert_eq!(s, 0);
    assert_eq!(rd32(&probed, 0), sim.config().gpus[0].gpu_id());
}

/// A shared read-write mapping of `fd` in this process, as the mmap shim makes it.
struct Mapped {
    ptr: *mut u8,
    len: usize,
}

impl Mapped {
    fn new(fd: &std::os::fd::OwnedFd, len: usize, offset: u64) -> Mapped {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh mapping at a kernel-chosen address of a live, borrowed fd; nothing
        // else refers to that range.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Mapped { ptr: p.cast(), len }
    }

    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: inside the live, writable mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }

    fn read(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.len);
        let mut out = vec![0; n];
        // SAFETY: inside the live mapping (checked above); `out` is distinct.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), n) };
        out
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[test]
fn test_rm_memory_mapped_through_the_proxy_is_shared_with_the_driver() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut t = Tenant::new(&sim, "t", vec![0]);
    let ctl = t.proxy.open(FrontendNode::Ctl).unwrap();
    let gpu = t.proxy.open(FrontendNode::Gpu(0)).unwrap();
    let (s, client) = t.alloc(ctl, 0, 0, 0x41, &[]);
    assert_eq!(s, 0);
    let (s, device) = t.alloc(ctl, client, client, 0x80, &[0; 56]);
    assert_eq!(s, 0);
    let mut mp = vec![0u8; 120];
    wr64(&mut mp, 64, 8192); // NV_MEMORY_ALLOCATION_PARAMS.size
    let (s, memory) = t.alloc(ctl, client, device, 0x3e, &mp);
    assert_eq!(s, 0);

    // libcuda's protocol: a new control fd is the mmap target of RM_MAP_MEMORY.
    let target = t.proxy.open(FrontendNode::Ctl).unwrap();
    t.fds.add(9, target);
    let mut p = vec![0u8; 56];
    wr32(&mut p, 0, client);
    wr32(&mut p, 4, device);
    wr32(&mut p, 8, memory);
    wr64(&mut p, 24, 8192);
    wr32(&mut p, 48, 9);
    let (r, out) = t.ioctl(ctl, nv_iowr(0x4e, 56), &p);
    assert_eq!((r, rd32(&out, 40), rd32(&out, 48)), (0, 0, 9));
    assert_eq!(sim.stats().mapping_files, 1);
    assert_eq!(t.proxy.mapping_file_count(), 1);

    // The shim's view: the fd the ticket path hands over, mapped with the adjusted offset.
    let (fd, adjust) = t.proxy.mapping_fd(target).unwrap();
    let m = Mapped::new(&fd, 8192, adjust);
    m.write(4096, b"from the tenant");
    assert_eq!(
        sim.memory_read(client, memory, 4096, 15).unwrap(),
        b"from the tenant"
    );
    sim.memory_write(client, memory, 0, b"from the GPU")
        .unwrap();
    assert_eq!(m.read(0, 12), b"from the GPU");

    // A second context on the same open is refused by the proxy, as the driver would.
    let (_, out) = t.ioctl(ctl, nv_iowr(0x4e, 56), &p);
    assert_eq!(rd32(&out, 40), 0x63); // NV_ERR_STATE_IN_USE

    // An open that was never a target has nothing to map.
    assert_eq!(t.proxy.mapping_fd(gpu).unwrap_err().errno(), libc::EINVAL);

    // Releasing the target closes its mapping file; the mapping itself stays valid.
    t.proxy.release(target);
    let st = sim.stats();
    assert_eq!((st.mapping_files, st.mmap_contexts), (0, 0));
    assert_eq!(m.read(0, 12), b"from the GPU");
    drop(m);
    drop(fd);
    t.proxy.release(gpu);
    t.proxy.release(ctl);
    assert_eq!(sim.stats(), nvsim::SimStats::default());
}

/// Issue 9 finding 4 on the simulated driver: an instance granted host GPU 1 sees only its own
/// device instance in GET_DEVICE_IDS, while another instance holds GPU 0 open (attached).
#[test]
fn test_device_ids_hide_another_tenants_attached_gpu() {
    let sim = SimDriver::new(SimConfig::default_gpus(2));
    let a = Tenant::new(&sim, "a", vec![0]);
    let mut b = Tenant::new(&sim, "b", vec![1]);
    let a_gpu = a.proxy.open(FrontendNode::Gpu(0)).unwrap();
    let b_gpu = b.proxy.open(FrontendNode::Gpu(0)).unwrap();
    let b_ctl = b.proxy.open(FrontendNode::Ctl).unwrap();
    let (s, c) = b.alloc(b_ctl, 0, 0, 0x41, &[]);
    assert_eq!(s, 0);
    let mut info = vec![0u8; 32];
    wr32(&mut info, 0, sim.config().gpus[1].gpu_id());
    let (s, info) = b.control(b_ctl, c, c, 0x205, &info);
    assert_eq!(s, 0);
    let ours = rd32(&info, 8);
    let (s, ids) = b.control(b_ctl, c, c, 0x204, &[0; 4]);
    assert_eq!(s, 0);
    assert_eq!(
        rd32(&ids, 0),
        1 << ours,
        "device mask names another tenant's GPU"
    );
    for (t, o) in [(&a, a_gpu), (&b, b_gpu), (&b, b_ctl)] {
        t.proxy.release(o);
    }
}
