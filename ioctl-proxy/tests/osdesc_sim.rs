//! OS-descriptor memory through the proxy on `nvsim` (`osdesc.rs`): the shim's
//! `NVPROXY_IOC_ALLOC_OS_DESCRIPTOR` names the caller's memfd, the proxy duplicates it from the
//! caller (`ClientMemory::client_fd`) and the simulated driver backs the memory object with it;
//! the plain escape stays refused; the tenant's bounds and fds are checked.

mod common;

use std::fs::File;
use std::os::unix::fs::FileExt;

use common::*;
use ioctl_proxy::*;
use nvproxy_abi::ioctl::nv_iowr;
use nvproxy_abi::status::*;
use nvproxy_preload_proto::{NVPROXY_IOC_ALLOC_OS_DESCRIPTOR, OsDescriptorArgs};
use nvsim::{SimConfig, SimDriver};

use common::SimTenant as Tenant;

const ARGS: u64 = 0x70_0000;
const PARAMS: u64 = 0x71_0000;
const VA: u64 = 0x7f00_0020_0000;
const MB2: u64 = 2 << 20;
const H_OSDESC: u32 = 0xcafe_0071;
/// libcuda's flags: non-contiguous, cached, `MAPPING_NO_MAP`.
const FLAGS: u32 = 0x4000_1010;
const MEMFD: i32 = 7;

fn memfd(len: u64) -> File {
    let fd = nix::sys::memfd::memfd_create(c"osdesc", nix::sys::memfd::MemFdCreateFlag::empty())
        .unwrap();
    let f = File::from(fd);
    f.set_len(len).unwrap();
    f
}

fn nvos02(client: u32, parent: u32, addr: u64, limit: u64) -> Vec<u8> {
    let mut p = vec![0u8; 56];
    wr32(&mut p, 0, client);
    wr32(&mut p, 4, parent);
    wr32(&mut p, 8, H_OSDESC);
    wr32(&mut p, 12, 0x71);
    wr32(&mut p, 16, FLAGS);
    wr64(&mut p, 24, addr);
    wr64(&mut p, 32, limit);
    wr32(&mut p, 48, u32::MAX); // fd -1
    p
}

struct Ctx {
    sim: std::sync::Arc<SimDriver>,
    t: Tenant,
    ctl: OpenId,
    gpu: OpenId,
    client: u32,
    device: u32,
}

fn setup() -> Ctx {
    setup_with(Quotas::default())
}

fn setup_with(quotas: Quotas) -> Ctx {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut policy = InstancePolicy::new("t", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0]);
    policy.quotas = quotas;
    let mut t = Tenant::from_proxy(Proxy::for_host(policy, sim.clone()).unwrap());
    let ctl = t.proxy.open(FrontendNode::Ctl).unwrap();
    let gpu = t.proxy.open(FrontendNode::Gpu(0)).unwrap();
    // libcuda registers the GPU file with its control file (NV_ESC_REGISTER_FD).
    t.fds.add(3, ctl);
    let (r, _) = t.ioctl(gpu, nv_iowr(0xc9, 4), &3i32.to_ne_bytes());
    assert_eq!(r, 0);
    let (s, client) = t.alloc(ctl, 0, 0, 0x41, &[]);
    assert_eq!(s, 0);
    let (s, device) = t.alloc(ctl, client, client, 0x80, &[0; 56]);
    assert_eq!(s, 0);
    Ctx {
        sim,
        t,
        ctl,
        gpu,
        client,
        device,
    }
}

impl Ctx {
    /// The private ioctl with `params` at [`PARAMS`] and `args`; (result, status, params after).
    fn ask(
        &mut self,
        open: OpenId,
        params: &[u8],
        args: OsDescriptorArgs,
    ) -> (Result<i32, ProxyError>, u32, Vec<u8>) {
        self.t.mem.map(PARAMS, params);
        self.t.mem.map(ARGS, &args.to_bytes());
        self.t.mem.begin_request();
        let r = self.t.proxy.ioctl(
            open,
            &CALLER,
            NVPROXY_IOC_ALLOC_OS_DESCRIPTOR,
            ARGS,
            &mut self.t.mem,
            &self.t.fds,
        );
        let after = self.t.mem.get(PARAMS, 56);
        (r, rd32(&after, 40), after)
    }
}

fn args(memfd: i32) -> OsDescriptorArgs {
    OsDescriptorArgs {
        params: PARAMS,
        memfd,
        reserved: 0,
    }
}

#[test]
fn test_os_descriptor_memory_is_the_tenants_memfd_both_ways() {
    let mut c = setup();
    let f = memfd(MB2);
    f.write_all_at(b"tenant bytes", 0x1000).unwrap();
    c.t.mem.files.insert(MEMFD, f.try_clone().unwrap());
    let p = nvos02(c.client, c.device, VA, MB2 - 1);
    let (r, status, after) = c.ask(c.gpu, &p, args(MEMFD));
    assert_eq!((r.unwrap(), status), (0, 0));
    // The client gets its own pMemory back; the host never saw it.
    assert_eq!(rd64(&after, 24), VA);
    assert_eq!(
        c.sim.memory_read(c.client, H_OSDESC, 0x1000, 12).unwrap(),
        b"tenant bytes"
    );
    c.sim
        .memory_write(c.client, H_OSDESC, MB2 - 3, b"gpu")
        .unwrap();
    let mut back = [0u8; 3];
    f.read_exact_at(&mut back, MB2 - 3).unwrap();
    assert_eq!(&back, b"gpu");
    // Freed like any object; nothing leaks.
    let mut fp = vec![0u8; 16];
    wr32(&mut fp, 0, c.client);
    wr32(&mut fp, 4, c.device);
    wr32(&mut fp, 8, H_OSDESC);
    let (r, out) = c.t.ioctl(c.ctl, nv_iowr(0x29, 16), &fp);
    assert_eq!((r, rd32(&out, 12)), (0, 0));
    let (ctl, gpu) = (c.ctl, c.gpu);
    c.t.proxy.release(gpu);
    c.t.proxy.release(ctl);
    assert_eq!(c.sim.stats(), nvsim::SimStats::default());
}

#[test]
fn test_os_descriptor_hostile_requests() {
    let mut c = setup();
    c.t.mem.files.insert(MEMFD, memfd(MB2));
    c.t.mem.files.insert(8, memfd(4096));
    let (rd, _wr) = nix::unistd::pipe().unwrap();
    c.t.mem.files.insert(9, File::from(rd));
    let ro = File::open(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&c.t.mem.files[&MEMFD])
    ))
    .unwrap();
    c.t.mem.files.insert(10, ro);
    let ok = nvos02(c.client, c.device, VA, MB2 - 1);
    // The plain escape is still refused: the driver would pin the daemon's pages.
    let (r, out) = c.t.ioctl(c.gpu, nv_iowr(0x27, 56), &ok);
    assert_eq!((r, rd32(&out, 40)), (0, NV_ERR_NOT_SUPPORTED));
    // Reserved field, unknown fd, a pipe: the ioctl's own errno.
    let mut a = args(MEMFD);
    a.reserved = 1;
    assert_eq!(c.ask(c.gpu, &ok, a).0.unwrap_err().errno(), libc::EINVAL);
    assert_eq!(
        c.ask(c.gpu, &ok, args(42)).0.unwrap_err().errno(),
        libc::EBADF
    );
    assert_eq!(
        c.ask(c.gpu, &ok, args(9)).0.unwrap_err().errno(),
        libc::EBADF
    );
    // Statuses, as the driver answers them.
    for (what, p, fd, want) in [
        (
            "unaligned",
            nvos02(c.client, c.device, VA + 16, MB2 - 1),
            MEMFD,
            NV_ERR_NOT_SUPPORTED,
        ),
        (
            "null",
            nvos02(c.client, c.device, 0, MB2 - 1),
            MEMFD,
            NV_ERR_INVALID_ADDRESS,
        ),
        (
            "limit wraps",
            nvos02(c.client, c.device, VA, u64::MAX),
            MEMFD,
            NV_ERR_INVALID_LIMIT,
        ),
        (
            "above the bound",
            nvos02(c.client, c.device, VA, (1 << 30) + 4095),
            MEMFD,
            NV_ERR_INSUFFICIENT_RESOURCES,
        ),
        (
            "file too short",
            nvos02(c.client, c.device, VA, MB2 - 1),
            8,
            NV_ERR_INVALID_ADDRESS,
        ),
        (
            "read-only fd",
            nvos02(c.client, c.device, VA, MB2 - 1),
            10,
            NV_ERR_INVALID_ADDRESS,
        ),
        (
            "another client",
            nvos02(0xc1d0_0001, c.device, VA, MB2 - 1),
            MEMFD,
            NV_ERR_INVALID_CLIENT,
        ),
        (
            "unknown parent",
            nvos02(c.client, 0xbad, VA, MB2 - 1),
            MEMFD,
            NV_ERR_INVALID_OBJECT_PARENT,
        ),
    ] {
        let (r, status, _) = c.ask(c.gpu, &p, args(fd));
        assert_eq!((r.unwrap(), status), (0, want), "{what}");
    }
    // Not the OS-descriptor class.
    let mut sys = ok.clone();
    wr32(&mut sys, 12, 0x3e);
    assert_eq!(c.ask(c.gpu, &sys, args(MEMFD)).1, NV_ERR_INVALID_CLASS);
    // NV_ACTUAL_DEVICE_ONLY: the control node fails the ioctl (the driver's EINVAL).
    assert_eq!(
        c.ask(c.ctl, &ok, args(MEMFD)).0.unwrap_err().errno(),
        libc::EINVAL
    );
    let (ctl, gpu) = (c.ctl, c.gpu);
    c.t.proxy.release(gpu);
    c.t.proxy.release(ctl);
    assert_eq!(c.sim.stats(), nvsim::SimStats::default());
}

/// Frees `h` (an object under the device) through the proxy; its status.
fn free_object(c: &mut Ctx, h: u32) -> u32 {
    let mut fp = vec![0u8; 16];
    wr32(&mut fp, 0, c.client);
    wr32(&mut fp, 4, c.device);
    wr32(&mut fp, 8, h);
    let (r, out) = c.t.ioctl(c.ctl, nv_iowr(0x29, 16), &fp);
    assert_eq!(r, 0);
    rd32(&out, 12)
}

#[test]
fn test_os_descriptor_memory_has_a_per_instance_total() {
    // 64 sparse GiB cost the tenant nothing; the worker would pin them all.
    const GIB: u64 = 1 << 30;
    let mut c = setup_with(Quotas {
        os_descriptor_bytes: 3 * GIB,
        ..Quotas::default()
    });
    c.t.mem.files.insert(MEMFD, memfd(GIB));
    let alloc = |c: &mut Ctx, h: u32| {
        let mut p = nvos02(c.client, c.device, VA, GIB - 1);
        wr32(&mut p, 8, h);
        let (r, status, _) = c.ask(c.gpu, &p, args(MEMFD));
        (r.unwrap(), status)
    };
    for h in 0..3 {
        assert_eq!(alloc(&mut c, H_OSDESC + h), (0, 0), "allocation {h}");
    }
    let before = c.sim.live_objects();
    // Past the total: the driver's answer when it cannot pin, and nothing reaches it.
    assert_eq!(alloc(&mut c, H_OSDESC + 3), (0, NV_ERR_INVALID_ADDRESS));
    assert_eq!(c.sim.live_objects(), before);
    // A free makes room again.
    assert_eq!(free_object(&mut c, H_OSDESC + 1), 0);
    assert_eq!(alloc(&mut c, H_OSDESC + 3), (0, 0));
    // Freeing the device (the allocations' parent) frees their total too.
    assert_eq!(free_object(&mut c, H_OSDESC), 0);
    assert_eq!(free_object(&mut c, H_OSDESC + 2), 0);
    assert_eq!(free_object(&mut c, H_OSDESC + 3), 0);
    for h in 0..3 {
        assert_eq!(alloc(&mut c, H_OSDESC + 10 + h), (0, 0), "again {h}");
    }
}

#[test]
fn test_os_descriptor_objects_are_bounded_in_number() {
    let mut c = setup();
    c.t.mem.files.insert(MEMFD, memfd(4096));
    let alloc = |c: &mut Ctx, h: u32| {
        let mut p = nvos02(c.client, c.device, VA, 4095);
        wr32(&mut p, 8, h);
        c.ask(c.gpu, &p, args(MEMFD)).1
    };
    let max = u32::try_from(ioctl_proxy::MAX_OS_DESCRIPTORS).unwrap();
    for h in 0..max {
        assert_eq!(alloc(&mut c, H_OSDESC + h), 0, "allocation {h}");
    }
    assert_eq!(alloc(&mut c, H_OSDESC + max), NV_ERR_INVALID_ADDRESS);
    // The simulated driver kept one fd for them all.
    assert_eq!(free_object(&mut c, H_OSDESC), 0);
    assert_eq!(alloc(&mut c, H_OSDESC + max), 0);
}
