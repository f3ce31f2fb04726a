//! The UVM proxy tests' environment on the kit's fakes (`test-kit`: a recording host driver
//! that records UVM calls and answers them with a settable status, client memory with the
//! read-once check, an fd table, an audit sink).
#![allow(dead_code)]

use std::sync::Arc;

use ioctl_proxy::*;
use nvproxy_abi::Caps;
use nvproxy_abi::ioctl::nv_iowr;
pub use test_kit::*;
use uvm::UvmProxy;

/// The UUID the tests give host GPU `minor`.
pub fn gpu_uuid(minor: u32) -> [u8; 16] {
    let mut u = [0x42u8; 16];
    u[0] = u8::try_from(minor).expect("test GPU minors fit a byte");
    u
}

/// `NV_PROCESSOR_UUID_CPU_DEFAULT`.
pub const CPU_UUID: [u8; 16] = uvm::nv::NV_PROCESSOR_UUID_CPU_DEFAULT;

pub const TOP: u64 = 0x50_0000;
pub const FD_CTL: i32 = 10;
pub const FD_UVM2: i32 = 11;
pub const FD_GPU: i32 = 12;

/// An instance on the fake host: its frontend proxy with a control open and an RM client, its
/// UVM proxy with one UVM open, client memory and fds (`FD_CTL` → the control open,
/// `FD_UVM2` → a second UVM open).
pub struct Env {
    pub host: Arc<FakeHost>,
    pub proxy: Arc<Proxy>,
    pub uvm: UvmProxy,
    pub events: Arc<Events>,
    pub ctl: OpenId,
    pub client: u32,
    pub open: OpenId,
    pub open2: OpenId,
    pub mem: FakeMem,
    pub fds: FakeFds,
}

impl Env {
    pub fn with(host: &Arc<FakeHost>, policy: InstancePolicy) -> Self {
        let events = Arc::new(Events::default());
        let uuids = policy.gpus.iter().map(|&m| gpu_uuid(m)).collect();
        let proxy = Arc::new(
            Proxy::for_host(policy, Arc::new(Driver(host.clone())))
                .unwrap()
                .with_audit(events.clone()),
        );
        let uvm = UvmProxy::with_gpu_uuids(proxy.clone(), uuids);
        let ctl = proxy.open(FrontendNode::Ctl).unwrap();
        let open = uvm.open().unwrap();
        let open2 = uvm.open().unwrap();
        let mut env = Self {
            host: host.clone(),
            proxy,
            uvm,
            events,
            ctl,
            client: 0,
            open,
            open2,
            mem: FakeMem::default(),
            fds: FakeFds::default(),
        };
        env.fds.add(FD_CTL, ctl);
        env.fds.add(FD_UVM2, open2);
        env.client = env.alloc_client();
        env.host.clear();
        env
    }

    /// Compute+utility, host GPUs 1 and 2, enforce mode, `version`.
    pub fn version(version: &str) -> Self {
        let host = FakeHost::new(version, &HOST_GPUS);
        Self::with(
            &host,
            InstancePolicy::new("job42", Caps::COMPUTE_UTILITY, vec![1, 2]),
        )
    }

    pub fn new() -> Self {
        Self::version("535.261.03")
    }

    fn alloc_client(&mut self) -> u32 {
        let addr = 0x10_0000;
        let mut p = vec![0u8; 48];
        wr32(&mut p, 12, 0x41);
        self.mem.map(addr, &p);
        let r = self
            .proxy
            .ioctl(
                self.ctl,
                &CALLER,
                nv_iowr(0x2b, 48),
                addr,
                &mut self.mem,
                &self.fds,
            )
            .unwrap();
        assert_eq!(r, 0);
        rd32(&self.mem.get(addr, 48), 8)
    }

    /// Runs UVM command `cmd` on the main open with `params` at `TOP`; returns the result and
    /// the client's params after.
    pub fn uvm(&mut self, cmd: u32, params: &[u8]) -> (Result<i32, ProxyError>, Vec<u8>) {
        self.mem.map(TOP, params);
        self.mem.begin_request();
        let r = self
            .uvm
            .ioctl(self.open, &CALLER, cmd, TOP, &mut self.mem, &self.fds);
        (r, self.mem.get(TOP, params.len()))
    }

    /// The table size of `cmd` in this instance's version.
    pub fn size(&self, cmd: u32) -> usize {
        self.proxy.abi().uvm[&cmd].param_size as usize
    }
}
