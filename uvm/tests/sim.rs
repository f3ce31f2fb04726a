//! The UVM proxy in front of `nvsim`: a CUDA-like UVM initialisation of a tenant that owns the
//! second of two GPUs, managed memory mapped at VA == offset through the proxy's mmap fd and
//! shared with the simulated driver, isolation between two instances, and nothing left behind.

mod common;

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use common::{CALLER, FakeFds, FakeMem, rd32, rd64, wr32, wr64};
use ioctl_proxy::{FrontendNode, InstancePolicy, OpenId, Proxy};
use nvproxy_abi::Caps;
use nvproxy_abi::ioctl::*;
use nvsim::{SimConfig, SimDriver};
use uvm::UvmProxy;
use uvm::nv::*;

const TOP: u64 = 0x50_0000;
const PARAMS: u64 = 0x60_0000;
const FD_CTL: i32 = 3;
const FD_UVM: i32 = 4;
const FD_UVM_MM: i32 = 5;
const MB2: usize = 2 << 20;

struct Tenant {
    proxy: Arc<Proxy>,
    uvm: UvmProxy,
    mem: FakeMem,
    fds: FakeFds,
    ctl: OpenId,
    gpu: OpenId,
    client: u32,
}

impl Tenant {
    fn new(sim: &Arc<SimDriver>, name: &str, minors: Vec<u32>) -> Self {
        let policy = InstancePolicy::new(name, Caps::COMPUTE_UTILITY, minors);
        let proxy = Arc::new(Proxy::for_host(policy, sim.clone()).unwrap());
        let uvm = UvmProxy::new(proxy.clone()).unwrap();
        let ctl = proxy.open(FrontendNode::Ctl).unwrap();
        let gpu = proxy.open(FrontendNode::Gpu(0)).unwrap();
        let mut t = Tenant {
            proxy,
            uvm,
            mem: FakeMem::default(),
            fds: FakeFds::default(),
            ctl,
            gpu,
            client: 0,
        };
        t.fds.add(FD_CTL, ctl);
        // NVOS64 root client.
        let mut p = vec![0u8; 48];
        wr32(&mut p, 12, 0x41);
        t.mem.map(TOP, &p);
        t.proxy
            .ioctl(ctl, &CALLER, nv_iowr(0x2b, 48), TOP, &mut t.mem, &t.fds)
            .unwrap();
        let out = t.mem.get(TOP, 48);
        assert_eq!(rd32(&out, 40), 0);
        t.client = rd32(&out, 8);
        t
    }

    fn uvm(&mut self, open: OpenId, cmd: u32, params: &[u8]) -> Vec<u8> {
        self.mem.map(TOP, params);
        let r = self
            .uvm
            .ioctl(open, &CALLER, cmd, TOP, &mut self.mem, &self.fds)
            .unwrap();
        assert_eq!(r, 0);
        self.mem.get(TOP, params.len())
    }

    fn frontend(&mut self, open: OpenId, cmd: u32, params: &[u8]) -> Vec<u8> {
        self.mem.map(TOP, params);
        self.proxy
            .ioctl(open, &CALLER, cmd, TOP, &mut self.mem, &self.fds)
            .unwrap();
        self.mem.get(TOP, params.len())
    }

    fn control(&mut self, object: u32, cmd: u32, params: &[u8]) -> (u32, Vec<u8>) {
        let mut p = vec![0u8; 32];
        wr32(&mut p, 0, self.client);
        wr32(&mut p, 4, object);
        wr32(&mut p, 8, cmd);
        self.mem.map(PARAMS, params);
        wr64(&mut p, 16, PARAMS);
        wr32(&mut p, 24, u32::try_from(params.len()).unwrap());
        let out = self.frontend(self.ctl, nv_iowr(0x2a, 32), &p);
        (rd32(&out, 28), self.mem.get(PARAMS, params.len()))
    }

    fn alloc(&mut self, parent: u32, class: u32, params: &[u8]) -> (u32, u32) {
        let mut p = vec![0u8; 48];
        wr32(&mut p, 0, self.client);
        wr32(&mut p, 4, parent);
        wr32(&mut p, 12, class);
        self.mem.map(PARAMS, params);
        wr64(&mut p, 16, PARAMS);
        wr32(&mut p, 32, u32::try_from(params.len()).unwrap());
        let out = self.frontend(self.ctl, nv_iowr(0x2b, 48), &p);
        (rd32(&out, 40), rd32(&out, 8))
    }

    /// Device of the tenant's GPU and a `FERMI_VASPACE_A` on it.
    fn gpu_va_space(&mut self, sim: &SimDriver) -> u32 {
        let id = self.proxy.gpus()[0].gpu_id;
        let mut info = vec![0u8; 32];
        wr32(&mut info, 0, id);
        let (s, info) = self.control(self.client, 0x205, &info);
        assert_eq!(s, 0);
        let mut dev = vec![0u8; 56];
        wr32(&mut dev, 0, rd32(&info, 8));
        let (s, device) = self.alloc(self.client, 0x80, &dev);
        assert_eq!(s, 0);
        let size = nvproxy_abi::find(&sim.driver_version())
            .unwrap()
            .tables()
            .classes[&0x90f1]
            .param_size as usize;
        let (s, va) = self.alloc(device, 0x90f1, &vec![0; size]);
        assert_eq!(s, 0);
        va
    }
}

/// A shared read-write mapping of `fd` at VA == offset, made as cudaMallocManaged does.
struct VaMapping {
    addr: u64,
    len: usize,
}

impl VaMapping {
    fn new(fd: &OwnedFd, len: usize) -> Self {
        // SAFETY: a fresh reservation at an address of the kernel's choice.
        let resv = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(resv, libc::MAP_FAILED);
        // SAFETY: MAP_FIXED over the reservation this test just made and owns.
        let p = unsafe {
            libc::mmap(
                resv,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                resv as libc::off_t,
            )
        };
        assert_eq!(p, resv, "{}", std::io::Error::last_os_error());
        VaMapping {
            addr: p as u64,
            len,
        }
    }

    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: inside the live writable shared mapping (checked).
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.addr as *mut u8).add(off),
                data.len(),
            )
        };
    }

    fn read(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.len);
        let mut out = vec![0; n];
        // SAFETY: inside the live mapping (checked); `out` is a distinct buffer.
        unsafe {
            std::ptr::copy_nonoverlapping((self.addr as *const u8).add(off), out.as_mut_ptr(), n)
        };
        out
    }
}

impl Drop for VaMapping {
    fn drop(&mut self) {
        // SAFETY: exactly the range mapped in `new`, unmapped once.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

#[test]
fn test_cuda_like_uvm_init_and_managed_memory_through_the_proxy() {
    let sim = SimDriver::new(SimConfig::default_gpus(2));
    let mut t = Tenant::new(&sim, "job", vec![1]);
    let ours = sim.config().gpus[1].uuid;
    assert_eq!(t.uvm.gpu_uuids(), [ours], "UUIDs learned from the driver");

    // Two UVM opens: the va_space and the mm file libcuda makes.
    let va = t.uvm.open().unwrap();
    let mm = t.uvm.open().unwrap();
    t.fds.add(FD_UVM, va);
    t.fds.add(FD_UVM_MM, mm);
    let out = t.uvm(va, UVM_INITIALIZE, &[0u8; 16]);
    assert_eq!((rd64(&out, 0), rd32(&out, 8)), (0, 0), "MPS forced, hidden");
    // The driver runs in multi-process sharing mode: no pageable memory access, and the mm
    // file has nothing to do.
    let out = t.uvm(va, UVM_PAGEABLE_MEM_ACCESS, &[0u8; 8]);
    assert_eq!((out[0], rd32(&out, 4)), (0, 0));
    let mut p = vec![0u8; 8];
    wr32(&mut p, 0, FD_UVM as u32);
    let out = t.uvm(mm, UVM_MM_INITIALIZE, &p);
    assert_eq!(
        (rd32(&out, 0) as i32, rd32(&out, 4)),
        (FD_UVM, NV_WARN_NOTHING_TO_DO)
    );

    // REGISTER_GPU with the control fd and the tenant's client; then its GPU VA space.
    let mut p = vec![0u8; 40];
    p[..16].copy_from_slice(&ours);
    wr32(&mut p, 24, FD_CTL as u32);
    wr32(&mut p, 28, t.client);
    let out = t.uvm(va, UVM_REGISTER_GPU, &p);
    assert_eq!(rd32(&out, 36), NV_OK);
    assert_eq!(rd32(&out, 24) as i32, FD_CTL);
    let h_va = t.gpu_va_space(&sim);
    let mut p = vec![0u8; 32];
    p[..16].copy_from_slice(&ours);
    wr32(&mut p, 16, FD_CTL as u32);
    wr32(&mut p, 20, t.client);
    wr32(&mut p, 24, h_va);
    assert_eq!(rd32(&t.uvm(va, UVM_REGISTER_GPU_VASPACE, &p), 28), NV_OK);
    assert_eq!(sim.stats().uvm_registered_gpus, 1);

    // Managed memory: the tenant maps the fd the proxy hands out at VA == offset.
    let (fd, adjust) = t.uvm.mmap_fd(&CALLER, va).unwrap();
    assert_eq!(adjust, 0);
    let m = VaMapping::new(&fd, MB2);
    let mut v = vec![0u8; 24];
    wr64(&mut v, 0, m.addr);
    wr64(&mut v, 8, MB2 as u64);
    assert_eq!(rd32(&t.uvm(va, UVM_VALIDATE_VA_RANGE, &v), 16), NV_OK);
    let host_id = t.uvm.host_file(va).unwrap().id();
    m.write(64, b"from the tenant");
    assert_eq!(
        sim.uvm_read(host_id, m.addr + 64, 15).unwrap(),
        b"from the tenant"
    );
    sim.uvm_write(host_id, m.addr + 4096, b"from the driver")
        .unwrap();
    assert_eq!(m.read(4096, 15), b"from the driver");

    // Preferred location on our GPU; the other GPU's UUID never reaches the driver.
    let mut p = vec![0u8; 40];
    wr64(&mut p, 0, m.addr);
    wr64(&mut p, 8, MB2 as u64);
    p[16..32].copy_from_slice(&ours);
    assert_eq!(rd32(&t.uvm(va, UVM_SET_PREFERRED_LOCATION, &p), 32), NV_OK);
    p[16..32].copy_from_slice(&sim.config().gpus[0].uuid);
    assert_eq!(
        rd32(&t.uvm(va, UVM_SET_PREFERRED_LOCATION, &p), 32),
        NV_ERR_INVALID_DEVICE
    );

    // Teardown: the mapping, the UVM opens, the frontend; the driver holds nothing.
    drop(m);
    drop(fd);
    t.uvm.release(mm);
    t.uvm.release(va);
    t.proxy.release(t.gpu);
    t.proxy.release(t.ctl);
    let s = sim.stats();
    assert_eq!(
        (
            s.uvm_va_spaces,
            s.uvm_registered_gpus,
            s.uvm_ranges,
            s.open_files,
            s.live_clients
        ),
        (0, 0, 0, 0, 0),
        "{s}"
    );
}

#[test]
fn test_two_instances_cannot_reach_each_others_gpu_or_client() {
    let sim = SimDriver::new(SimConfig::default_gpus(2));
    let mut a = Tenant::new(&sim, "a", vec![0]);
    let mut b = Tenant::new(&sim, "b", vec![1]);
    let a_uvm = a.uvm.open().unwrap();
    let b_uvm = b.uvm.open().unwrap();
    a.uvm(a_uvm, UVM_INITIALIZE, &[0u8; 16]);
    b.uvm(b_uvm, UVM_INITIALIZE, &[0u8; 16]);
    // b registers a's GPU: the UUID is outside b's set (a GPU "not found").
    let mut p = vec![0u8; 40];
    p[..16].copy_from_slice(&sim.config().gpus[0].uuid);
    wr32(&mut p, 24, u32::MAX);
    assert_eq!(
        rd32(&b.uvm(b_uvm, UVM_REGISTER_GPU, &p), 36),
        NV_ERR_GPU_UUID_NOT_FOUND
    );
    // b registers its own GPU naming a's client: refused before the driver.
    p[..16].copy_from_slice(&sim.config().gpus[1].uuid);
    wr32(&mut p, 28, a.client);
    assert_eq!(
        rd32(&b.uvm(b_uvm, UVM_REGISTER_GPU, &p), 36),
        NV_ERR_INVALID_CLIENT
    );
    wr32(&mut p, 28, 0);
    assert_eq!(rd32(&b.uvm(b_uvm, UVM_REGISTER_GPU, &p), 36), NV_OK);
    assert_eq!(sim.stats().uvm_registered_gpus, 1);
    drop(a);
    drop(b);
    let s = sim.stats();
    assert_eq!((s.uvm_va_spaces, s.open_files), (0, 0), "{s}");
}

#[test]
fn test_mmap_switch_off_refuses_the_mapping_fd() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut policy = InstancePolicy::new("off", Caps::COMPUTE_UTILITY, vec![0]);
    policy.uvm_mmap = false;
    let proxy = Arc::new(Proxy::for_host(policy, sim.clone()).unwrap());
    let uvm = UvmProxy::new(proxy).unwrap();
    let open = uvm.open().unwrap();
    let e = uvm.mmap_fd(&CALLER, open).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENODEV));
}
