//! The proxy tests' environments on the kit's fakes (`test-kit`: a recording host driver,
//! client memory with the read-once check, an fd table, an audit sink): a proxy on the fake
//! host, and a tenant of a proxy on `nvsim`.
#![allow(dead_code)]

use std::sync::Arc;

use ioctl_proxy::*;
use nvproxy_abi::ioctl::nv_iowr;
pub use test_kit::*;

/// A proxy on a fake host with GPUs (minor, id) 0:0x100, 1:0x200, 2:0x300; the instance gets
/// host GPUs `gpus` (minors) with `caps`.
pub struct Env {
    pub host: Arc<FakeHost>,
    pub proxy: ioctl_proxy::Proxy,
    pub events: Arc<Events>,
    pub ctl: OpenId,
    pub mem: FakeMem,
    pub fds: FakeFds,
}

pub const VERSION: &str = "535.261.03";

pub fn proxy_on(host: &Arc<FakeHost>, policy: InstancePolicy) -> (Proxy, Arc<Events>) {
    let events = Arc::new(Events::default());
    let proxy = Proxy::for_host(policy, Arc::new(Driver(host.clone())))
        .unwrap()
        .with_audit(events.clone());
    (proxy, events)
}

impl Env {
    pub fn with(version: &str, policy: InstancePolicy) -> Self {
        let host = FakeHost::new(version, &HOST_GPUS);
        let (proxy, events) = proxy_on(&host, policy);
        let ctl = proxy.open(FrontendNode::Ctl).unwrap();
        host.clear();
        Self {
            host,
            proxy,
            events,
            ctl,
            mem: FakeMem::new(),
            fds: FakeFds::default(),
        }
    }

    /// Compute+utility, host GPUs 1 and 2 (ids 0x200, 0x300), enforce mode, 535.261.03.
    pub fn new() -> Self {
        Self::with(
            VERSION,
            InstancePolicy::new("job42", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![1, 2]),
        )
    }

    pub fn ioctl(&mut self, open: OpenId, cmd: u32, arg: u64) -> Result<i32, ProxyError> {
        self.mem.begin_request();
        self.proxy
            .ioctl(open, &CALLER, cmd, arg, &mut self.mem, &self.fds)
    }

    /// Runs an ioctl through retry rounds until it completes.
    pub fn ioctl_retrying(&mut self, open: OpenId, cmd: u32, arg: u64) -> Result<i32, ProxyError> {
        loop {
            match self.ioctl(open, cmd, arg) {
                Err(ProxyError::Pending) => self.mem.fetch(),
                r => return r,
            }
        }
    }

    /// `NV_ESC_RM_ALLOC` (NVOS64) of a root client; returns its handle.
    pub fn alloc_client(&mut self, open: OpenId) -> u32 {
        let addr = 0x10_0000;
        let mut p = vec![0u8; 48];
        wr32(&mut p, 12, 0x41);
        self.mem.map(addr, &p);
        assert_eq!(self.ioctl(open, nv_iowr(0x2b, 48), addr).unwrap(), 0);
        assert_eq!(rd32(&self.mem.get(addr, 48), 40), 0);
        rd32(&self.mem.get(addr, 48), 8)
    }

    /// `NV_ESC_RM_ALLOC` (NVOS64) of `class` under `parent` with alloc params `params`;
    /// returns (status, new handle).
    pub fn alloc(&mut self, h_client: u32, parent: u32, class: u32, params: &[u8]) -> (u32, u32) {
        let (addr, paddr) = (0x11_0000, 0x12_0000);
        let mut p = vec![0u8; 48];
        wr32(&mut p, 0, h_client);
        wr32(&mut p, 4, parent);
        wr32(&mut p, 12, class);
        if !params.is_empty() {
            self.mem.map(paddr, params);
            wr64(&mut p, 16, paddr);
            wr32(&mut p, 32, u32::try_from(params.len()).unwrap());
        }
        self.mem.map(addr, &p);
        let ctl = self.ctl;
        assert_eq!(self.ioctl(ctl, nv_iowr(0x2b, 48), addr).unwrap(), 0);
        let out = self.mem.get(addr, 48);
        (rd32(&out, 40), rd32(&out, 8))
    }

    /// A device (NV01_DEVICE_0, deviceId `dev`) and a subdevice under it.
    pub fn device(&mut self, h_client: u32, dev: u32) -> (u32, u32) {
        let mut p = vec![0u8; 56];
        wr32(&mut p, 0, dev);
        let (s, d) = self.alloc(h_client, h_client, 0x80, &p);
        assert_eq!(s, 0, "device alloc status");
        let (s, sd) = self.alloc(h_client, d, 0x2080, &[0; 4]);
        assert_eq!(s, 0, "subdevice alloc status");
        (d, sd)
    }

    /// `NV_ESC_RM_CONTROL` with params `params` mapped at 0x20_0000; returns (status,
    /// params after the call).
    pub fn control(
        &mut self,
        h_client: u32,
        h_object: u32,
        cmd: u32,
        params: &[u8],
    ) -> (u32, Vec<u8>) {
        let (addr, paddr) = (0x13_0000, 0x20_0000);
        let mut p = vec![0u8; 32];
        wr32(&mut p, 0, h_client);
        wr32(&mut p, 4, h_object);
        wr32(&mut p, 8, cmd);
        if !params.is_empty() {
            self.mem.map(paddr, params);
            wr64(&mut p, 16, paddr);
            wr32(&mut p, 24, u32::try_from(params.len()).unwrap());
        }
        self.mem.map(addr, &p);
        let ctl = self.ctl;
        assert_eq!(self.ioctl(ctl, nv_iowr(0x2a, 32), addr).unwrap(), 0);
        let out = self.mem.get(addr, 32);
        let params_out = if params.is_empty() {
            Vec::new()
        } else {
            self.mem.get(paddr, params.len())
        };
        (rd32(&out, 28), params_out)
    }
}

pub const SIM_TOP: u64 = 0x50_0000;
pub const SIM_PARAMS: u64 = 0x60_0000;

/// A tenant of a proxy on `nvsim`: its client memory and fd table.
pub struct SimTenant {
    pub proxy: Proxy,
    pub mem: FakeMem,
    pub fds: FakeFds,
}

impl SimTenant {
    pub fn new(sim: &Arc<nvsim::SimDriver>, name: &str, minors: Vec<u32>) -> Self {
        let policy = InstancePolicy::new(name, nvproxy_abi::Caps::COMPUTE_UTILITY, minors);
        Self {
            proxy: Proxy::for_host(policy, sim.clone()).unwrap(),
            mem: FakeMem::new(),
            fds: FakeFds::default(),
        }
    }

    /// A tenant of an existing proxy (a restored one).
    pub fn from_proxy(proxy: Proxy) -> Self {
        Self {
            proxy,
            mem: FakeMem::new(),
            fds: FakeFds::default(),
        }
    }

    pub fn ioctl(&mut self, open: OpenId, cmd: u32, top: &[u8]) -> (i32, Vec<u8>) {
        self.mem.map(SIM_TOP, top);
        self.mem.begin_request();
        let r = self
            .proxy
            .ioctl(open, &CALLER, cmd, SIM_TOP, &mut self.mem, &self.fds)
            .unwrap();
        (r, self.mem.get(SIM_TOP, top.len()))
    }

    /// NVOS64 alloc; returns (status, handle).
    pub fn alloc(
        &mut self,
        open: OpenId,
        client: u32,
        parent: u32,
        class: u32,
        params: &[u8],
    ) -> (u32, u32) {
        let mut p = vec![0u8; 48];
        wr32(&mut p, 0, client);
        wr32(&mut p, 4, parent);
        wr32(&mut p, 12, class);
        if !params.is_empty() {
            self.mem.map(SIM_PARAMS, params);
            wr64(&mut p, 16, SIM_PARAMS);
            wr32(&mut p, 32, u32::try_from(params.len()).unwrap());
        }
        let (_, out) = self.ioctl(open, nv_iowr(0x2b, 48), &p);
        (rd32(&out, 40), rd32(&out, 8))
    }

    /// RM control; returns (status, params after).
    pub fn control(
        &mut self,
        open: OpenId,
        client: u32,
        object: u32,
        cmd: u32,
        params: &[u8],
    ) -> (u32, Vec<u8>) {
        let mut p = vec![0u8; 32];
        wr32(&mut p, 0, client);
        wr32(&mut p, 4, object);
        wr32(&mut p, 8, cmd);
        if !params.is_empty() {
            self.mem.map(SIM_PARAMS, params);
            wr64(&mut p, 16, SIM_PARAMS);
            wr32(&mut p, 24, u32::try_from(params.len()).unwrap());
        }
        let (_, out) = self.ioctl(open, nv_iowr(0x2a, 32), &p);
        let after = if params.is_empty() {
            Vec::new()
        } else {
            self.mem.get(SIM_PARAMS, params.len())
        };
        (rd32(&out, 28), after)
    }
}
