//! Save and restore of a UVM va_space with a registered GPU and GPU VA space, by replay onto a
//! fresh `nvsim` with the GPUs in another order; the tenant's UVM opens keep working on the
//! same GPU, and nothing leaks in either driver.

mod common;

use std::sync::Arc;

use common::{CALLER, FakeFds, FakeMem, rd32, wr32, wr64};
use ioctl_proxy::checkpoint::Checkpoint;
use ioctl_proxy::{CheckpointError, FrontendNode, InstancePolicy, OpenId, Proxy};
use nvproxy_abi::Caps;
use nvproxy_abi::ioctl::*;
use nvsim::{SimConfig, SimDriver, SimGpu, SimStats};
use uvm::UvmProxy;
use uvm::nv::*;

const TOP: u64 = 0x50_0000;
const PARAMS: u64 = 0x60_0000;
const FD_CTL: i32 = 3;
const FD_UVM: i32 = 4;
const FD_UVM_MM: i32 = 5;

struct Tenant {
    proxy: Arc<Proxy>,
    uvm: UvmProxy,
    mem: FakeMem,
    fds: FakeFds,
}

struct Handles {
    ctl: OpenId,
    gpu: OpenId,
    va: OpenId,
    mm: OpenId,
    client: u32,
    uuid: [u8; 16],
}

impl Tenant {
    fn frontend(&mut self, open: OpenId, cmd: u32, params: &[u8]) -> Vec<u8> {
        self.mem.map(TOP, params);
        self.proxy
            .ioctl(open, &CALLER, cmd, TOP, &mut self.mem, &self.fds)
            .unwrap();
        self.mem.get(TOP, params.len())
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

    fn rm(&mut self, ctl: OpenId, nr: u8, top: Vec<u8>, params: &[u8]) -> (Vec<u8>, Vec<u8>) {
        self.mem.map(PARAMS, params);
        let out = self.frontend(ctl, nv_iowr(nr, top.len()), &top);
        (out, self.mem.get(PARAMS, params.len()))
    }

    fn alloc(&mut self, ctl: OpenId, client: u32, parent: u32, class: u32, p: &[u8]) -> u32 {
        let mut top = vec![0u8; 48];
        wr32(&mut top, 0, client);
        wr32(&mut top, 4, parent);
        wr32(&mut top, 12, class);
        if !p.is_empty() {
            wr64(&mut top, 16, PARAMS);
            wr32(&mut top, 32, u32::try_from(p.len()).unwrap());
        }
        let (out, _) = self.rm(ctl, 0x2b, top, p);
        assert_eq!(rd32(&out, 40), 0, "alloc of class {class:#x}");
        rd32(&out, 8)
    }

    fn register_gpu(&mut self, h: &Handles) -> u32 {
        let mut p = vec![0u8; 40];
        p[..16].copy_from_slice(&h.uuid);
        wr32(&mut p, 24, FD_CTL as u32);
        wr32(&mut p, 28, h.client);
        rd32(&self.uvm(h.va, UVM_REGISTER_GPU, &p), 36)
    }

    fn unregister_gpu_va_space(&mut self, h: &Handles) -> u32 {
        let mut p = vec![0u8; 20];
        p[..16].copy_from_slice(&h.uuid);
        rd32(&self.uvm(h.va, UVM_UNREGISTER_GPU_VASPACE, &p), 16)
    }
}

fn policy(minors: Vec<u32>) -> InstancePolicy {
    InstancePolicy::new("job", Caps::COMPUTE_UTILITY, minors)
}

/// The policy of an instance whose set is every GPU of `sim` (a restore stays inside its set).
fn all_of(sim: &SimDriver) -> InstancePolicy {
    policy(sim.config().gpus.iter().map(|g| g.minor).collect())
}

/// libcuda's sequence: root client, device and VA space of the tenant's GPU, a va_space and
/// its mm file, REGISTER_GPU, REGISTER_GPU_VASPACE.
fn build(sim: &Arc<SimDriver>, minor: u32) -> (Tenant, Handles) {
    let proxy = Arc::new(Proxy::for_host(policy(vec![minor]), sim.clone()).unwrap());
    let uvm = UvmProxy::new(proxy.clone()).unwrap();
    let mut t = Tenant {
        proxy,
        uvm,
        mem: FakeMem::default(),
        fds: FakeFds::default(),
    };
    let ctl = t.proxy.open(FrontendNode::Ctl).unwrap();
    let gpu = t.proxy.open(FrontendNode::Gpu(0)).unwrap();
    t.fds.add(FD_CTL, ctl);
    let client = t.alloc(ctl, 0, 0, 0x41, &[]);
    let gpu_id = t.proxy.gpus()[0].gpu_id;
    let mut info = vec![0u8; 32];
    wr32(&mut info, 0, gpu_id);
    let mut top = vec![0u8; 32];
    wr32(&mut top, 0, client);
    wr32(&mut top, 4, client);
    wr32(&mut top, 8, 0x205);
    wr64(&mut top, 16, PARAMS);
    wr32(&mut top, 24, 32);
    let (_, info) = t.rm(ctl, 0x2a, top, &info);
    let mut dev = vec![0u8; 56];
    wr32(&mut dev, 0, rd32(&info, 8));
    let device = t.alloc(ctl, client, client, 0x80, &dev);
    let vas = t.alloc(ctl, client, device, 0x90f1, &[0; 48]);
    let va = t.uvm.open().unwrap();
    let mm = t.uvm.open().unwrap();
    t.fds.add(FD_UVM, va);
    t.fds.add(FD_UVM_MM, mm);
    t.uvm(va, UVM_INITIALIZE, &[0u8; 16]);
    let mut p = vec![0u8; 8];
    wr32(&mut p, 0, FD_UVM as u32);
    t.uvm(mm, UVM_MM_INITIALIZE, &p);
    let uuid = sim
        .config()
        .gpus
        .iter()
        .find(|g| g.minor == minor)
        .unwrap()
        .uuid;
    let h = Handles {
        ctl,
        gpu,
        va,
        mm,
        client,
        uuid,
    };
    assert_eq!(t.register_gpu(&h), NV_OK);
    let mut p = vec![0u8; 32];
    p[..16].copy_from_slice(&uuid);
    wr32(&mut p, 16, FD_CTL as u32);
    wr32(&mut p, 20, client);
    wr32(&mut p, 24, vas);
    assert_eq!(rd32(&t.uvm(va, UVM_REGISTER_GPU_VASPACE, &p), 28), NV_OK);
    (t, h)
}

fn teardown(t: Tenant, h: &Handles) {
    t.uvm.release(h.mm);
    t.uvm.release(h.va);
    t.proxy.release(h.gpu);
    t.proxy.release(h.ctl);
}

#[test]
fn test_uvm_va_space_with_registered_gpu_is_replayed_onto_reordered_gpus() {
    let old = SimDriver::new(SimConfig::default_gpus(2));
    let (t, h) = build(&old, 1);
    assert_eq!(old.stats().uvm_registered_gpus, 1);
    let ckpt = Checkpoint::from_json(&t.uvm.checkpoint().unwrap().to_json()).unwrap();
    assert_eq!(ckpt.uvm.len(), 2);
    let fds = std::mem::take(&mut { t.fds });
    t.uvm.release_all();
    t.proxy.release_all();
    drop(t.uvm);
    drop(t.proxy);
    assert_eq!(old.stats(), SimStats::default(), "old driver holds nothing");

    let new = SimDriver::new(SimConfig {
        gpus: vec![SimGpu::h100(1), SimGpu::h100(0)],
        ..SimConfig::default_gpus(0)
    });
    let (proxy, uvm) = uvm::restore_instance(&ckpt, all_of(&new), new.clone(), &[]).unwrap();
    let s = new.stats();
    assert_eq!((s.uvm_va_spaces, s.uvm_registered_gpus), (1, 1), "{s}");
    let mut t = Tenant {
        proxy,
        uvm,
        mem: FakeMem::default(),
        fds,
    };
    // The va_space on the tenant's old open has the GPU (same UUID, now device instance 0)
    // registered and its GPU VA space: registering again is the driver's "already", the
    // GPU VA space unregisters once.
    assert_eq!(t.register_gpu(&h), NV_ERR_INVALID_DEVICE);
    assert_eq!(t.unregister_gpu_va_space(&h), NV_OK);
    assert_ne!(t.unregister_gpu_va_space(&h), NV_OK);
    assert_eq!(t.uvm.gpu_uuids(), [h.uuid]);
    teardown(t, &h);
    assert_eq!(new.stats(), SimStats::default(), "new driver holds nothing");
}

#[test]
fn test_save_with_uvm_state_replay_cannot_make_fails_naming_it() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let (mut t, h) = build(&sim, 0);
    let mut p = vec![0u8; 16];
    wr32(&mut p, 0, 0);
    let out = t.uvm(h.va, UVM_CREATE_RANGE_GROUP, &p);
    assert_eq!(rd32(&out, 8), NV_OK);
    let err = t.uvm.checkpoint().unwrap_err();
    let CheckpointError::Unreplayable { items, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(items.len(), 1, "{items:?}");
    assert!(items[0].contains("UVM_CREATE_RANGE_GROUP"), "{}", items[0]);
    assert!(
        items[0].contains(&format!("UVM open {}", h.va.0)),
        "{}",
        items[0]
    );
    teardown(t, &h);
    assert_eq!(sim.stats(), SimStats::default());
}

#[test]
fn test_uvm_registrations_follow_a_remap_onto_another_gpu() {
    let old = SimDriver::new(SimConfig::default_gpus(2));
    let (t, h) = build(&old, 1);
    let ckpt = t.uvm.checkpoint().unwrap();
    let fds = std::mem::take(&mut { t.fds });
    t.uvm.release_all();
    t.proxy.release_all();
    drop(t.uvm);
    drop(t.proxy);
    assert_eq!(old.stats(), SimStats::default());

    // Other GPUs of the same kind: the saved GPU 1 goes to the new driver's GPU 3.
    let new = SimDriver::new(SimConfig {
        gpus: vec![SimGpu::h100(2), SimGpu::h100(3)],
        ..SimConfig::default_gpus(0)
    });
    let rules = ["1=3".parse().unwrap()];
    let (proxy, uvm) = uvm::restore_instance(&ckpt, all_of(&new), new.clone(), &rules).unwrap();
    let moved = SimGpu::h100(3).uuid;
    assert_eq!(uvm.gpu_uuids(), [moved]);
    assert_eq!(new.stats().uvm_registered_gpus, 1);
    let mut t = Tenant {
        proxy,
        uvm,
        mem: FakeMem::default(),
        fds,
    };
    // The registration is the new GPU's: registering it again is the driver's "already".
    let h = Handles { uuid: moved, ..h };
    assert_eq!(t.register_gpu(&h), NV_ERR_INVALID_DEVICE);
    assert_eq!(t.unregister_gpu_va_space(&h), NV_OK);
    teardown(t, &h);
    assert_eq!(new.stats(), SimStats::default());
}

#[test]
fn test_a_remapped_va_space_checkpoints_and_restores_again() {
    let first = SimDriver::new(SimConfig::default_gpus(2));
    let (t, h) = build(&first, 1);
    let ckpt = t.uvm.checkpoint().unwrap();
    let fds = std::mem::take(&mut { t.fds });
    t.uvm.release_all();
    t.proxy.release_all();
    drop((t.uvm, t.proxy));
    let second = SimDriver::new(SimConfig {
        gpus: vec![SimGpu::h100(2), SimGpu::h100(3)],
        ..SimConfig::default_gpus(0)
    });
    let (proxy, uvm) = uvm::restore_instance(
        &ckpt,
        all_of(&second),
        second.clone(),
        &["1=3".parse().unwrap()],
    )
    .unwrap();
    // Saved again on the second driver, restored by UUID onto a third with the same GPUs.
    let again = uvm.checkpoint().unwrap();
    uvm.release_all();
    proxy.release_all();
    drop((uvm, proxy));
    assert_eq!(second.stats(), SimStats::default());
    let third = SimDriver::new(SimConfig {
        gpus: vec![SimGpu::h100(3), SimGpu::h100(2)],
        ..SimConfig::default_gpus(0)
    });
    let (proxy, uvm) = uvm::restore_instance(&again, all_of(&third), third.clone(), &[]).unwrap();
    assert_eq!(third.stats().uvm_registered_gpus, 1);
    let mut t = Tenant {
        proxy,
        uvm,
        mem: FakeMem::default(),
        fds,
    };
    let h = Handles {
        uuid: SimGpu::h100(3).uuid,
        ..h
    };
    assert_eq!(t.unregister_gpu_va_space(&h), NV_OK);
    teardown(t, &h);
    assert_eq!(third.stats(), SimStats::default());
}
