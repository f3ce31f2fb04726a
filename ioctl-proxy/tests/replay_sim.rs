//! Save and restore by replay on `nvsim`: a tenant builds an object tree through the proxy, the
//! instance is checkpointed, the driver is replaced by a fresh one (GPUs in another order, or
//! other GPUs of the same kind), the instance restored with a remap, and the tenant's old
//! handles and opens keep working on the right GPUs; nothing leaks in either driver.

mod common;

use std::sync::Arc;

use common::*;
use ioctl_proxy::checkpoint::CHECKPOINT_VERSION;
use ioctl_proxy::*;
use nvproxy_abi::Caps;
use nvproxy_abi::ioctl::nv_iowr;
use nvsim::{SimConfig, SimDriver, SimGpu, SimStats};

const ROOT: u32 = 0x41;
const DEVICE: u32 = 0x80;
const SUBDEVICE: u32 = 0x2080;
const VASPACE: u32 = 0x90f1;
const VIDMEM: u32 = 0x40;
const EVENT_OS: u32 = 0x79;
const TSG: u32 = 0xa06c;
/// `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2`.
const GET_ID_INFO_V2: u32 = 0x205;
/// `NV0000_CTRL_CMD_GPU_GET_PROBED_IDS`.
const GET_PROBED_IDS: u32 = 0x214;
/// `NV2080_CTRL_CMD_GPU_GET_INFO_V2`.
const GPU_GET_INFO_V2: u32 = 0x2080_0110;
/// The fd number of the tenant's control open.
const CTL_FD: i32 = 3;

fn policy(minors: Vec<u32>) -> InstancePolicy {
    InstancePolicy::new("job", Caps::COMPUTE_UTILITY, minors)
}

fn mem_params(size: u64) -> Vec<u8> {
    let mut p = vec![0u8; 120];
    wr64(&mut p, 64, size); // NV_MEMORY_ALLOCATION_PARAMS.size
    p
}

/// What the tenant built.
struct Tree {
    ctl: OpenId,
    gpus: Vec<OpenId>,
    client: u32,
    /// Per tenant GPU: (device, subdevice, VA space, memory).
    devices: Vec<(u32, u32, u32, u32)>,
    event: u32,
}

fn device_instance(t: &mut SimTenant, ctl: OpenId, client: u32, gpu_id: u32) -> u32 {
    let mut info = vec![0u8; 32];
    wr32(&mut info, 0, gpu_id);
    let (s, info) = t.control(ctl, client, client, GET_ID_INFO_V2, &info);
    assert_eq!(s, 0);
    rd32(&info, 8)
}

/// A CUDA-like tree: root client, every nvidia<N> registered to the control file, per GPU a device,
/// subdevice, VA space and video memory, an OS event and an event object on the first
/// subdevice.
fn build(t: &mut SimTenant, sim: &SimDriver, minors: &[u32]) -> Tree {
    let ctl = t.proxy.open(FrontendNode::Ctl).unwrap();
    t.fds.add(CTL_FD, ctl);
    let mut gpus = Vec::new();
    for i in 0..u32::try_from(minors.len()).unwrap() {
        let gpu = t.proxy.open(FrontendNode::Gpu(i)).unwrap();
        let (r, _) = t.ioctl(gpu, nv_iowr(0xc9, 4), &CTL_FD.to_ne_bytes());
        assert_eq!(r, 0);
        gpus.push(gpu);
    }
    let (s, client) = t.alloc(ctl, 0, 0, ROOT, &[]);
    assert_eq!(s, 0);
    let mut devices = Vec::new();
    for &m in minors {
        let gpu_id = sim
            .config()
            .gpus
            .iter()
            .find(|g| g.minor == m)
            .unwrap()
            .gpu_id();
        let inst = device_instance(t, ctl, client, gpu_id);
        let mut dp = vec![0u8; 56];
        wr32(&mut dp, 0, inst);
        let (s, dev) = t.alloc(ctl, client, client, DEVICE, &dp);
        assert_eq!(s, 0, "device");
        let (s, sub) = t.alloc(ctl, client, dev, SUBDEVICE, &[0; 4]);
        assert_eq!(s, 0, "subdevice");
        let (s, vas) = t.alloc(ctl, client, dev, VASPACE, &[0; 48]);
        assert_eq!(s, 0, "VA space");
        let (s, mem) = t.alloc(ctl, client, dev, VIDMEM, &mem_params(2 << 20));
        assert_eq!(s, 0, "video memory");
        devices.push((dev, sub, vas, mem));
    }
    // NV_ESC_ALLOC_OS_EVENT keyed by the control fd, then an NV01_EVENT_OS_EVENT on it.
    let mut ev = vec![0u8; 16];
    wr32(&mut ev, 0, client);
    wr32(&mut ev, 4, devices[0].0);
    wr32(&mut ev, 8, CTL_FD as u32);
    let (_, out) = t.ioctl(ctl, nv_iowr(0xce, 16), &ev);
    assert_eq!(rd32(&out, 12), 0, "OS event");
    let mut ep = vec![0u8; 24];
    wr32(&mut ep, 0, client);
    wr32(&mut ep, 8, EVENT_OS);
    wr32(&mut ep, 12, 1);
    wr64(&mut ep, 16, CTL_FD as u64);
    let (s, event) = t.alloc(ctl, client, devices[0].1, 0x05, &ep);
    assert_eq!(s, 0, "event object");
    Tree {
        ctl,
        gpus,
        client,
        devices,
        event,
    }
}

/// A driver with `n` GPUs and a tenant of all of them that built its [`Tree`].
fn tenant_with_tree(n: u32) -> (Arc<SimDriver>, SimTenant, Tree) {
    let sim = SimDriver::new(SimConfig::default_gpus(n as usize));
    let minors: Vec<u32> = (0..n).collect();
    let mut t = SimTenant::new(&sim, "job", minors.clone());
    let tree = build(&mut t, &sim, &minors);
    (sim, t, tree)
}

/// The policy of an instance whose set is every GPU of `sim` (a restore stays inside its set).
fn all_of(sim: &SimDriver) -> InstancePolicy {
    policy(sim.config().gpus.iter().map(|g| g.minor).collect())
}

fn reordered(gpus: &[u32]) -> Arc<SimDriver> {
    SimDriver::new(SimConfig {
        gpus: gpus.iter().map(|&i| SimGpu::h100(i)).collect(),
        ..SimConfig::default_gpus(0)
    })
}

/// Position (device instance) of the GPU with `uuid` in `sim`.
fn index_of(sim: &SimDriver, uuid: &str) -> usize {
    sim.config()
        .gpus
        .iter()
        .position(|g| g.uuid_string() == uuid)
        .unwrap()
}

/// Checkpoint the tree, drop the old instance (its driver must be empty), restore on `new`.
fn save_and_restore(
    t: SimTenant,
    old: &SimDriver,
    new: &Arc<SimDriver>,
    rules: &[RemapRule],
) -> (SimTenant, Vec<(DeviceIdentity, DeviceIdentity)>) {
    let ckpt = t.proxy.checkpoint().unwrap();
    let text = ckpt.to_json();
    let ckpt = Checkpoint::from_json(&text).unwrap();
    let fds = t.fds;
    t.proxy.release_all();
    drop(t.proxy);
    assert_eq!(old.stats(), SimStats::default(), "old driver holds nothing");
    let restored = Proxy::restore(&ckpt, all_of(new), new.clone(), rules).unwrap();
    let mut t2 = SimTenant::from_proxy(restored.proxy);
    t2.fds = fds;
    (t2, restored.gpus)
}

/// The tenant's next calls on its old handles and opens, and where they land.
fn use_old_handles(
    t: &mut SimTenant,
    tree: &Tree,
    sim: &SimDriver,
    gpus: &[(DeviceIdentity, DeviceIdentity)],
) {
    let (s, probed) = t.control(
        tree.ctl,
        tree.client,
        tree.client,
        GET_PROBED_IDS,
        &[0; 256],
    );
    assert_eq!(s, 0, "client control");
    let mut seen: Vec<u32> = (0..gpus.len()).map(|i| rd32(&probed, 4 * i)).collect();
    let mut want: Vec<u32> = gpus.iter().map(|(_, n)| n.gpu_id).collect();
    seen.sort_unstable();
    want.sort_unstable();
    assert_eq!(seen, want, "the instance's GPUs are the new ones");
    for (i, &(dev, sub, _, mem)) in tree.devices.iter().enumerate() {
        let (s, _) = t.control(tree.ctl, tree.client, sub, GPU_GET_INFO_V2, &[0; 132]);
        assert_eq!(s, 0, "subdevice control on an old handle");
        // New memory under the old device lands on the GPU it was remapped to.
        let g = index_of(sim, &gpus[i].1.uuid);
        let before = sim.allocated_video_memory(g);
        let (s, _) = t.alloc(tree.ctl, tree.client, dev, VIDMEM, &mem_params(4 << 20));
        assert_eq!(s, 0, "alloc under an old device");
        assert_eq!(
            sim.allocated_video_memory(g),
            before + (4 << 20),
            "on the remapped GPU"
        );
        // The old memory is there (on the same GPU) and frees by its old handle.
        let mut free = vec![0u8; 16];
        wr32(&mut free, 0, tree.client);
        wr32(&mut free, 4, dev);
        wr32(&mut free, 8, mem);
        let (_, out) = t.ioctl(tree.ctl, nv_iowr(0x29, 16), &free);
        assert_eq!(rd32(&out, 12), 0, "free of old memory");
        assert_eq!(sim.allocated_video_memory(g), 4 << 20);
    }
    // The event object and the OS event it names are alive: freeing the OS event while the
    // object holds it is fine, and the object frees by its handle.
    let mut free = vec![0u8; 16];
    wr32(&mut free, 0, tree.client);
    wr32(&mut free, 4, tree.devices[0].1);
    wr32(&mut free, 8, tree.event);
    let (_, out) = t.ioctl(tree.ctl, nv_iowr(0x29, 16), &free);
    assert_eq!(rd32(&out, 12), 0, "free of the event object");
}

fn close(t: SimTenant, tree: &Tree) {
    for &g in &tree.gpus {
        t.proxy.release(g);
    }
    t.proxy.release(tree.ctl);
    assert_eq!(t.proxy.object_count(), 0);
}

#[test]
fn test_restore_onto_a_fresh_driver_with_gpus_reordered_keeps_handles_and_gpus() {
    let (old, t, tree) = tenant_with_tree(2);
    let objects = t.proxy.object_count();

    // The fresh driver has the same GPUs in the other order: device instances swap.
    let new = reordered(&[1, 0]);
    let (mut t, pairs) = save_and_restore(t, &old, &new, &[]);
    assert_eq!(t.proxy.object_count(), objects);
    assert_eq!(pairs[0].0.uuid, pairs[0].1.uuid);
    assert_ne!(pairs[0].0.device_instance, pairs[0].1.device_instance);
    assert_eq!(new.live_clients(), 1);

    use_old_handles(&mut t, &tree, &new, &pairs);
    close(t, &tree);
    assert_eq!(new.stats(), SimStats::default(), "new driver holds nothing");
}

#[test]
fn test_restore_onto_other_gpus_of_the_same_kind_with_a_remap() {
    let (old, t, tree) = tenant_with_tree(2);
    // Other GPUs (minors 2, 3; other UUIDs): old 0 → new 3, old 1 → new 2.
    let new = reordered(&[2, 3]);
    let rules = ["0=3".parse().unwrap(), "1=2".parse().unwrap()];
    let (mut t, pairs) = save_and_restore(t, &old, &new, &rules);
    assert_eq!(
        pairs
            .iter()
            .map(|(o, n)| (o.minor, n.minor))
            .collect::<Vec<_>>(),
        vec![(0, 3), (1, 2)]
    );
    use_old_handles(&mut t, &tree, &new, &pairs);
    close(t, &tree);
    assert_eq!(new.stats(), SimStats::default());
}

#[test]
fn test_restore_without_a_remap_for_a_missing_gpu_is_refused_and_leaves_nothing() {
    let (_old, t, _tree) = tenant_with_tree(1);
    let ckpt = t.proxy.checkpoint().unwrap();
    let new = reordered(&[5]);
    let err = Proxy::restore(&ckpt, all_of(&new), new.clone(), &[]).unwrap_err();
    assert!(matches!(err, CheckpointError::Remap(_)), "{err}");
    assert!(err.to_string().contains("not on this host"), "{err}");
    assert_eq!(new.stats(), SimStats::default());
}

#[test]
fn test_restore_onto_heterogeneous_hardware_is_refused_with_the_reason() {
    let (_old, t, _tree) = tenant_with_tree(1);
    let ckpt = t.proxy.checkpoint().unwrap();
    let mut other = SimGpu::h100(1);
    other.pci_device_id = 0x20b0; // an A100's
    let new = SimDriver::new(SimConfig {
        gpus: vec![other],
        ..SimConfig::default_gpus(0)
    });
    let err =
        Proxy::restore(&ckpt, all_of(&new), new.clone(), &["0=1".parse().unwrap()]).unwrap_err();
    assert!(err.to_string().contains("heterogeneous"), "{err}");
    assert_eq!(new.stats(), SimStats::default());
}

/// An OS event whose `hParentClient` is not its client is allocated under the client, not
/// under the resource it names (`rmapiFixupAllocParams`): freeing that resource leaves it in
/// the driver, and so in the books (before, the books dropped it with the resource, and a
/// tenant could hold events past its object quota). Replay records events under their
/// resource, so a save refuses this one, naming it.
#[test]
fn test_an_event_of_another_parent_client_lives_under_its_client() {
    let (sim, mut t, tree) = tenant_with_tree(1);
    let counted = |t: &SimTenant| t.proxy.object_count();
    let held = |sim: &SimDriver| {
        let st = sim.stats();
        st.live_clients + st.live_objects
    };
    let mut ep = vec![0u8; 24];
    // hParentClient 0: "the allocating client" for the notification, yet not the client.
    wr32(&mut ep, 8, EVENT_OS);
    wr32(&mut ep, 12, 2);
    wr64(&mut ep, 16, CTL_FD as u64);
    let (s, event) = t.alloc(tree.ctl, tree.client, tree.devices[0].1, 0x05, &ep);
    assert_eq!(s, 0, "event object");
    assert_eq!(counted(&t), held(&sim));
    let err = t.proxy.checkpoint().unwrap_err().to_string();
    assert!(
        err.contains(&format!("{event:#x}")) && err.contains("hParentClient"),
        "{err}"
    );
    let mut free = vec![0u8; 16];
    wr32(&mut free, 0, tree.client);
    wr32(&mut free, 4, tree.devices[0].0);
    wr32(&mut free, 8, tree.devices[0].1);
    let (_, out) = t.ioctl(tree.ctl, nv_iowr(0x29, 16), &free);
    assert_eq!(rd32(&out, 12), 0, "free of the subdevice");
    assert_eq!(counted(&t), held(&sim), "the event outlives its resource");
    assert!(t.proxy.owns_object(tree.client, event));
    wr32(&mut free, 4, tree.client);
    wr32(&mut free, 8, event);
    let (_, out) = t.ioctl(tree.ctl, nv_iowr(0x29, 16), &free);
    assert_eq!(rd32(&out, 12), 0, "free of the event under the client");
    assert_eq!(counted(&t), held(&sim));
}

/// A control open the tenant closed while a GPU open that registered it lives on lingers in
/// the driver with its clients (`Proxy::release`); replay cannot re-create a file without an
/// fd, so a save refuses, naming it, until the GPU open goes too.
#[test]
fn test_save_with_a_lingering_control_open_fails_naming_it() {
    let (sim, t, tree) = tenant_with_tree(1);
    t.proxy.release(tree.ctl);
    assert_eq!(t.proxy.lingering_opens(), 1, "GPU open registered it");
    let err = t.proxy.checkpoint().unwrap_err();
    let CheckpointError::Unreplayable { items, .. } = &err else {
        panic!("{err}");
    };
    assert!(
        items
            .iter()
            .any(|i| i.contains(&format!("open {}", tree.ctl.0)) && i.contains("REGISTER_FD")),
        "{items:?}"
    );
    for &g in &tree.gpus {
        t.proxy.release(g);
    }
    assert_eq!(t.proxy.lingering_opens(), 0);
    assert_eq!(sim.stats(), SimStats::default());
    assert!(t.proxy.checkpoint().is_ok());
}

/// The registrations a restore replays hold their control open as before the save: closed
/// first, it lingers until the GPU opens go.
#[test]
fn test_a_restored_registration_keeps_its_control_open() {
    let (old, t, tree) = tenant_with_tree(1);
    let new = SimDriver::new(SimConfig::default_gpus(1));
    let (t, _) = save_and_restore(t, &old, &new, &[]);
    let objects = t.proxy.object_count();
    t.proxy.release(tree.ctl);
    assert_eq!(
        (t.proxy.lingering_opens(), t.proxy.object_count()),
        (1, objects)
    );
    assert_eq!(new.live_clients(), 1, "the driver keeps the file");
    for &g in &tree.gpus {
        t.proxy.release(g);
    }
    assert_eq!((t.proxy.lingering_opens(), t.proxy.object_count()), (0, 0));
    assert_eq!(new.stats(), SimStats::default());
}

#[test]
fn test_save_with_a_channel_group_fails_naming_it() {
    let (sim, mut t, tree) = tenant_with_tree(1);
    let (_, _, vas, _) = tree.devices[0];
    let mut p = vec![0u8; 20];
    wr32(&mut p, 8, vas); // hVASpace
    wr32(&mut p, 12, 1); // engineType: GR0
    let (s, tsg) = t.alloc(tree.ctl, tree.client, tree.devices[0].0, TSG, &p);
    assert_eq!(s, 0, "TSG");
    let err = t.proxy.checkpoint().unwrap_err();
    let CheckpointError::Unreplayable { items, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(items.len(), 1, "{items:?}");
    assert!(
        items[0].contains(&format!("object {tsg:#x}")),
        "{}",
        items[0]
    );
    assert!(items[0].contains("KEPLER_CHANNEL_GROUP_A"), "{}", items[0]);
    // Nothing changed: the tenant goes on.
    let (s, _) = t.control(
        tree.ctl,
        tree.client,
        tree.client,
        GET_PROBED_IDS,
        &[0; 256],
    );
    assert_eq!(s, 0);
    close(t, &tree);
    assert_eq!(sim.stats(), SimStats::default());
}

#[test]
fn test_checkpoint_format_round_trips_and_refuses_newer_versions() {
    let (sim, t, tree) = tenant_with_tree(1);
    let ckpt = t.proxy.checkpoint().unwrap();
    assert_eq!(ckpt.version, CHECKPOINT_VERSION);
    assert_eq!(Checkpoint::from_json(&ckpt.to_json()).unwrap(), ckpt);
    let newer = ckpt.to_json().replace("\"version\": 1,", "\"version\": 2,");
    let err = Checkpoint::from_json(&newer).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::Version {
                found: 2,
                supported: 1
            }
        ),
        "{err}"
    );
    assert!(
        Checkpoint::from_json("{\"version\": 1}").is_err(),
        "no format tag"
    );
    // Fields a version added later are optional for older files: a file without them reads.
    let mut v: serde_json::Value = serde_json::from_str(&ckpt.to_json()).unwrap();
    v.as_object_mut().unwrap().remove("uvm");
    for o in v["opens"].as_array_mut().unwrap() {
        o.as_object_mut().unwrap().remove("os_events");
    }
    let older = Checkpoint::from_json(&v.to_string()).unwrap();
    assert!(older.uvm.is_empty() && older.opens.iter().all(|o| o.os_events.is_empty()));
    close(t, &tree);
    assert_eq!(sim.stats(), SimStats::default());
}

#[test]
fn test_restore_onto_another_driver_version_is_refused() {
    let (sim, t, tree) = tenant_with_tree(1);
    let ckpt = t.proxy.checkpoint().unwrap();
    let other = SimDriver::new(SimConfig::default_gpus(1).with_version("580.142".parse().unwrap()));
    let err = Proxy::restore(&ckpt, all_of(&other), other, &[]).unwrap_err();
    assert!(matches!(err, CheckpointError::Driver { .. }), "{err}");
    close(t, &tree);
    assert_eq!(sim.stats(), SimStats::default());
}

#[test]
fn test_a_replay_failing_midway_leaves_nothing_in_the_new_driver() {
    let (old, t, tree) = tenant_with_tree(1);
    let ckpt = t.proxy.checkpoint().unwrap();
    // The same GPU with too little memory for the tenant's 2 MiB: the memory's replay fails
    // after the client, device, subdevice and VA space were re-created.
    let mut small = SimGpu::h100(0);
    small.memory_bytes = 1 << 20;
    let new = SimDriver::new(SimConfig {
        gpus: vec![small],
        ..SimConfig::default_gpus(0)
    });
    let err = Proxy::restore(&ckpt, all_of(&new), new.clone(), &[]).unwrap_err();
    let CheckpointError::Replay { what, .. } = &err else {
        panic!("{err}");
    };
    assert!(
        what.contains(&format!("object {:#x}", tree.devices[0].3)),
        "{err}"
    );
    assert_eq!(new.stats(), SimStats::default(), "nothing replayed stays");
    close(t, &tree);
    assert_eq!(old.stats(), SimStats::default());
}

/// Another process of the host allocates a client asking for handle `h` (`hRoot`).
fn take_client_handle(sim: &Arc<SimDriver>, h: u32) -> (SimTenant, OpenId) {
    let mut other = SimTenant::new(sim, "other", vec![0]);
    let ctl = other.proxy.open(FrontendNode::Ctl).unwrap();
    let mut p = vec![0u8; 48];
    wr32(&mut p, 0, h); // hRoot: the handle asked for
    wr32(&mut p, 12, ROOT);
    let (_, out) = other.ioctl(ctl, nv_iowr(0x2b, 48), &p);
    assert_eq!((rd32(&out, 40), rd32(&out, 8)), (0, h));
    (other, ctl)
}

/// Restores `ckpt` on `sim` for a tenant with the fd table `fds`.
fn restored_tenant(
    ckpt: &Checkpoint,
    sim: &Arc<SimDriver>,
    fds: FakeFds,
) -> (SimTenant, Vec<(DeviceIdentity, DeviceIdentity)>) {
    let restored = Proxy::restore(ckpt, all_of(sim), sim.clone(), &[]).unwrap();
    let mut t = SimTenant::from_proxy(restored.proxy);
    t.fds = fds;
    (t, restored.gpus)
}

#[test]
fn test_a_client_handle_taken_on_the_new_host_is_translated() {
    let (old, mut t, tree) = tenant_with_tree(1);
    let ckpt = t.proxy.checkpoint().unwrap();
    let fds = std::mem::take(&mut t.fds);
    t.proxy.release_all();
    drop(t);
    // On the new driver another process already holds the tenant's client handle.
    let new = SimDriver::new(SimConfig::default_gpus(1));
    let (other, other_ctl) = take_client_handle(&new, tree.client);
    let (mut t, pairs) = restored_tenant(&ckpt, &new, fds);
    assert!(t.proxy.translates_clients());
    let host = t.proxy.host_client(tree.client);
    assert_ne!(host, tree.client);
    assert_eq!(new.client_handles(), {
        let mut v = vec![tree.client, host];
        v.sort_unstable();
        v
    });
    // The tenant's old handles reach its own client, not the other process's.
    use_old_handles(&mut t, &tree, &new, &pairs);
    let mut free = vec![0u8; 16];
    wr32(&mut free, 0, tree.client);
    wr32(&mut free, 8, tree.client);
    let (_, out) = t.ioctl(tree.ctl, nv_iowr(0x29, 16), &free);
    assert_eq!(rd32(&out, 12), 0);
    assert_eq!(
        new.client_handles(),
        vec![tree.client],
        "only the other's client is left"
    );
    assert!(!t.proxy.translates_clients());
    close(t, &tree);
    assert_eq!(old.stats(), SimStats::default());
    other.proxy.release(other_ctl);
    assert_eq!(new.stats(), SimStats::default());
}

#[test]
fn test_a_checkpoint_naming_an_open_twice_is_refused_before_anything_is_opened() {
    let (sim, t, tree) = tenant_with_tree(1);
    let mut ckpt = t.proxy.checkpoint().unwrap();
    let first = ckpt.opens[0].clone();
    ckpt.opens.push(first);
    let err = Checkpoint::from_json(&ckpt.to_json()).unwrap_err();
    assert!(matches!(err, CheckpointError::Format(_)), "{err}");
    let new = SimDriver::new(SimConfig::default_gpus(1));
    let err = Proxy::restore(&ckpt, all_of(&new), new.clone(), &[]).unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");
    assert_eq!(new.stats(), SimStats::default());
    close(t, &tree);
    assert_eq!(sim.stats(), SimStats::default());
}

#[test]
fn test_a_new_client_whose_driver_handle_the_tenant_already_uses_gets_an_alias() {
    // The tenant's client is 0xc1d00002 on the old driver.
    let old = SimDriver::new(SimConfig {
        client_index_base: 2,
        ..SimConfig::default_gpus(1)
    });
    let mut t = SimTenant::new(&old, "job", vec![0]);
    let tree = build(&mut t, &old, &[0]);
    assert_eq!(tree.client, 0xc1d0_0002);
    let ckpt = t.proxy.checkpoint().unwrap();
    let fds = std::mem::take(&mut t.fds);
    t.proxy.release_all();
    drop(t);
    // On the new driver another process holds 0xc1d00002: the tenant's client gets one the
    // driver chooses (its counter is at 1 then: the restore's GPU identification took 0).
    let new = SimDriver::new(SimConfig::default_gpus(1));
    let (other, other_ctl) = take_client_handle(&new, tree.client);
    let (mut t, _) = restored_tenant(&ckpt, &new, fds);
    let host = t.proxy.host_client(tree.client);
    assert_eq!(host, 0xc1d0_0001);
    // The other process goes; the driver's next client handle is 0xc1d00002, which the
    // tenant already uses for its own client: the new one gets another name.
    other.proxy.release(other_ctl);
    let (s, fresh) = t.alloc(tree.ctl, 0, 0, ROOT, &[]);
    assert_eq!(s, 0);
    assert_ne!(fresh, tree.client);
    assert_eq!(
        t.proxy.host_client(fresh),
        tree.client,
        "the driver's handle"
    );
    for c in [fresh, tree.client] {
        let (s, _) = t.control(tree.ctl, c, c, GET_PROBED_IDS, &[0; 256]);
        assert_eq!(s, 0, "client {c:#x}");
    }
    // Freeing the new one by its name frees the driver's 0xc1d00002, not the tenant's old one.
    let mut free = vec![0u8; 16];
    wr32(&mut free, 0, fresh);
    wr32(&mut free, 8, fresh);
    let (_, out) = t.ioctl(tree.ctl, nv_iowr(0x29, 16), &free);
    assert_eq!(rd32(&out, 12), 0);
    assert_eq!(new.client_handles(), vec![host]);
    close(t, &tree);
    assert_eq!(new.stats(), SimStats::default());
}

#[test]
fn test_a_restored_instance_checkpoints_and_restores_again() {
    let (first, t, tree) = tenant_with_tree(2);
    let second = reordered(&[1, 0]);
    let (t, _) = save_and_restore(t, &first, &second, &[]);
    let third = reordered(&[0, 1]);
    let (mut t, pairs) = save_and_restore(t, &second, &third, &[]);
    assert_eq!(
        pairs
            .iter()
            .map(|(o, n)| (o.device_instance, n.device_instance))
            .collect::<Vec<_>>(),
        vec![(1, 0), (0, 1)],
        "the second save saw the second driver's device instances"
    );
    use_old_handles(&mut t, &tree, &third, &pairs);
    close(t, &tree);
    assert_eq!(third.stats(), SimStats::default());
}

/// Issue 20, items 5 and 6: the instance's GPU set is the contract, not the checkpoint. A
/// checkpoint of GPU 1 restored into an instance of GPU 0 alone (another instance's file with
/// its `instance` field edited), and a remap onto a GPU outside the set, are refused naming both
/// sets, and the driver holds nothing afterwards.
#[test]
fn test_a_restore_never_creates_objects_outside_the_instances_gpu_set() {
    // "alpha" has GPU 1 of a two-GPU host and builds its tree there.
    let sim = SimDriver::new(SimConfig::default_gpus(2));
    let mut alpha = SimTenant::new(&sim, "alpha", vec![1]);
    let _tree = build(&mut alpha, &sim, &[1]);
    let ckpt = alpha.proxy.checkpoint().unwrap();
    let host_before = sim.stats();
    // Restored into "beta" (GPU 0 only): without a rule the saved GPU goes to its UUID, GPU 1.
    let beta = policy(vec![0]);
    let err = Proxy::restore(&ckpt, beta.clone(), sim.clone(), &[]).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, CheckpointError::Remap(_)), "{text}");
    let uuid = |m: usize| sim.config().gpus[m].uuid_string();
    assert!(
        text.contains(&format!("GPU set is [minor 0 {}]", uuid(0)))
            && text.contains(&format!("checkpoint's GPUs [minor 1 {}]", uuid(1)))
            && text.contains(&format!("[minor 1 {}] outside the set", uuid(1))),
        "{text}"
    );
    assert_eq!(sim.stats(), host_before, "nothing was created");
    // A remap onto a GPU outside the set: alpha's own set is GPU 1; GPU 0 is beta's.
    let err = Proxy::restore(
        &ckpt,
        policy(vec![1]),
        sim.clone(),
        &["1=0".parse().unwrap()],
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!("GPU set is [minor 1 {}]", uuid(1)))
            && text.contains(&format!("would be restored onto [minor 0 {}]", uuid(0))),
        "{text}"
    );
    assert_eq!(sim.stats(), host_before, "nothing was created");
    // Inside the set both work: beta's checkpoint remapped 1=0 into beta.
    alpha.proxy.release_all();
    drop(alpha);
    let restored = Proxy::restore(&ckpt, beta, sim.clone(), &["1=0".parse().unwrap()]).unwrap();
    assert_eq!(restored.gpus[0].1.minor, 0);
    restored.proxy.release_all();
    assert_eq!(sim.stats(), SimStats::default());
}

/// A restore holds to the instance's GPU memory quota as allocations do: a checkpoint whose
/// objects hold more video memory than the quota it is restored under is refused, before the
/// driver is asked anything.
#[test]
fn test_restore_past_the_gpu_memory_quota_is_refused() {
    let (old, t, _tree) = tenant_with_tree(1);
    let ckpt = t.proxy.checkpoint().unwrap();
    t.proxy.release_all();
    drop(t.proxy);
    assert_eq!(old.stats(), SimStats::default());
    let new = SimDriver::new(SimConfig::default_gpus(1));
    let mut small = all_of(&new);
    small.quotas.gpu_memory = Some(1 << 20); // the tree holds 2 MiB
    let err = Proxy::restore(&ckpt, small, new.clone(), &[]).unwrap_err();
    assert!(err.to_string().contains("quota"), "{err}");
    assert_eq!(
        new.stats(),
        SimStats::default(),
        "nothing reached the driver"
    );
    let mut enough = all_of(&new);
    enough.quotas.gpu_memory = Some(10 << 30);
    let restored = Proxy::restore(&ckpt, enough, new.clone(), &[]).unwrap();
    assert_eq!(restored.proxy.gpu_memory_used()[0].1, 2 << 20);
}

/// A restore onto another GPU (a remap rule) counts the restored video memory on that GPU: the
/// saved charges name the old GPU's id, and a charge left under it would leave the new GPU's
/// quota free for as much again while the restored objects hold their memory.
#[test]
fn test_a_remapped_restore_counts_the_memory_on_the_new_gpu() {
    let sim = SimDriver::new(SimConfig::default_gpus(2));
    let mut alpha = SimTenant::new(&sim, "alpha", vec![1]);
    let _tree = build(&mut alpha, &sim, &[1]);
    let before = alpha.proxy.gpu_memory_used();
    assert_eq!(before, [(1, 2 << 20)], "the tree's memory on GPU 1");
    let ckpt = alpha.proxy.checkpoint().unwrap();
    alpha.proxy.release_all();
    drop(alpha);
    let mut beta = policy(vec![0]);
    beta.quotas.gpu_memory = Some(10 << 30);
    let restored = Proxy::restore(&ckpt, beta, sim.clone(), &["1=0".parse().unwrap()]).unwrap();
    assert_eq!(restored.proxy.gpu_memory_used(), [(0, 2 << 20)]);
    restored.proxy.release_all();
    assert_eq!(sim.stats(), SimStats::default());
}
