//! A serving proxy's tables handed to a new proxy on the same driver (a live upgrade's request
//! path part, `ioctl_proxy::live`): the tenant goes on with its opens and handles, channels
//! included (no replay: the driver keeps everything), and nothing leaks. The driver here is
//! `nvsim` behind a stand-in for a driver two processes share: a handed-over file is kept by
//! token until the other side adopts it, as a simulated driver process keeps a session's files.

mod common;

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

use common::*;
use ioctl_proxy::live::LiveProxy;
use ioctl_proxy::*;
use nvproxy_abi::Caps;
use nvproxy_abi::ioctl::nv_iowr;
use nvsim::{SimConfig, SimDriver, SimStats};

const ROOT: u32 = 0x41;
const DEVICE: u32 = 0x80;
const SUBDEVICE: u32 = 0x2080;
const VIDMEM: u32 = 0x40;
const TSG: u32 = 0xa06c;
const VASPACE: u32 = 0x90f1;
/// `NV2080_CTRL_CMD_GPU_GET_INFO_V2`.
const GPU_GET_INFO_V2: u32 = 0x2080_0110;
const CTL_FD: i32 = 3;

/// Files handed over by one "process", by token (kept, as a driver session keeps them).
#[derive(Default)]
struct Transit {
    files: Mutex<HashMap<u64, Arc<dyn HostFile>>>,
    next: Mutex<u64>,
}

/// `nvsim` with hand-over: each file can be handed to the other proxy.
struct Shared {
    sim: Arc<SimDriver>,
    transit: Arc<Transit>,
}

#[derive(Debug)]
struct SharedFile {
    inner: Arc<dyn HostFile>,
    transit: Arc<Transit>,
}

impl std::fmt::Debug for Transit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Transit")
    }
}

impl HostFile for SharedFile {
    fn node(&self) -> NodeKind {
        self.inner.node()
    }
    fn id(&self) -> i32 {
        self.inner.id()
    }
    fn ioctl(&self, call: &mut HostCall) -> io::Result<i32> {
        self.inner.ioctl(call)
    }
    fn mmap_fd(&self) -> io::Result<(std::os::fd::OwnedFd, u64)> {
        self.inner.mmap_fd()
    }
    fn hand_over(&self) -> io::Result<HandedFile> {
        let mut n = self.transit.next.lock().unwrap();
        *n += 1;
        self.transit
            .files
            .lock()
            .unwrap()
            .insert(*n, self.inner.clone());
        Ok(HandedFile {
            node: self.inner.node(),
            fd: None,
            token: *n,
            id: self.inner.id(),
            mapping: false,
        })
    }
}

impl Shared {
    fn wrap(&self, f: Arc<dyn HostFile>) -> Arc<dyn HostFile> {
        Arc::new(SharedFile {
            inner: f,
            transit: self.transit.clone(),
        })
    }
}

impl HostDriver for Shared {
    fn version(&self) -> &str {
        self.sim.version()
    }
    fn open(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        Ok(self.wrap(self.sim.open(node)?))
    }
    fn open_mapping(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        Ok(self.wrap(self.sim.open_mapping(node)?))
    }
    fn adopt(&self, file: HandedFile) -> io::Result<Arc<dyn HostFile>> {
        let f = self
            .transit
            .files
            .lock()
            .unwrap()
            .get(&file.token)
            .cloned()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        Ok(self.wrap(f))
    }
}

fn proxy(driver: &Arc<Shared>) -> Proxy {
    let policy = InstancePolicy::new("job", Caps::COMPUTE_UTILITY, vec![0]);
    Proxy::for_host(policy, driver.clone() as Arc<dyn HostDriver>).unwrap()
}

fn mem_params(size: u64) -> Vec<u8> {
    let mut p = vec![0u8; 120];
    wr64(&mut p, 64, size);
    p
}

struct Tree {
    ctl: OpenId,
    gpu: OpenId,
    client: u32,
    device: u32,
    subdevice: u32,
    memory: u32,
}

/// Root client, device, subdevice, video memory and a channel group (which replay refuses:
/// a live hand-over does not care).
fn build(t: &mut SimTenant) -> Tree {
    let ctl = t.proxy.open(FrontendNode::Ctl).unwrap();
    t.fds.add(CTL_FD, ctl);
    let gpu = t.proxy.open(FrontendNode::Gpu(0)).unwrap();
    let (r, _) = t.ioctl(gpu, nv_iowr(0xc9, 4), &CTL_FD.to_ne_bytes());
    assert_eq!(r, 0, "REGISTER_FD");
    let (s, client) = t.alloc(ctl, 0, 0, ROOT, &[]);
    assert_eq!(s, 0);
    let (s, device) = t.alloc(ctl, client, client, DEVICE, &[0; 56]);
    assert_eq!(s, 0, "device");
    let (s, subdevice) = t.alloc(ctl, client, device, SUBDEVICE, &[0; 4]);
    assert_eq!(s, 0, "subdevice");
    let (s, memory) = t.alloc(ctl, client, device, VIDMEM, &mem_params(2 << 20));
    assert_eq!(s, 0, "video memory");
    let (s, vas) = t.alloc(ctl, client, device, VASPACE, &[0; 48]);
    assert_eq!(s, 0, "VA space");
    let mut p = vec![0u8; 20];
    wr32(&mut p, 8, vas); // hVASpace
    wr32(&mut p, 12, 1); // engineType: GR0
    let (s, _tsg) = t.alloc(ctl, client, device, TSG, &p);
    assert_eq!(s, 0, "channel group");
    Tree {
        ctl,
        gpu,
        client,
        device,
        subdevice,
        memory,
    }
}

fn setup() -> (Arc<SimDriver>, Arc<Shared>, SimTenant, Tree) {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let driver = Arc::new(Shared {
        sim: sim.clone(),
        transit: Arc::default(),
    });
    let mut t = SimTenant::from_proxy(proxy(&driver));
    let tree = build(&mut t);
    (sim, driver, t, tree)
}

/// Exports, round-trips the tables through JSON, adopts into a new proxy on the same driver.
fn hand_over(t: SimTenant, driver: &Arc<Shared>) -> (SimTenant, LiveProxy) {
    let (live, files) = t.proxy.export_live().unwrap();
    let live: LiveProxy = serde_json::from_str(&serde_json::to_string(&live).unwrap()).unwrap();
    let new = proxy(driver);
    let mut files: Vec<Option<HandedFile>> = files.into_iter().map(Some).collect();
    new.adopt_live(live.clone(), &mut files).unwrap();
    assert!(files.iter().all(Option::is_none), "every file adopted");
    let fds = t.fds;
    // The old proxy goes as a process exits after handing over: nothing released (its
    // references go, the driver's files stay with the new proxy's).
    drop(t.proxy);
    driver.transit.files.lock().unwrap().clear();
    let mut t2 = SimTenant::from_proxy(new);
    t2.fds = fds;
    (t2, live)
}

#[test]
fn test_the_new_proxy_serves_the_old_opens_and_handles_and_nothing_leaks() {
    let (sim, driver, t, tree) = setup();
    let objects = t.proxy.object_count();
    let counted = t
        .proxy
        .counts()
        .get(Kind::Escape, "NV_ESC_RM_ALLOC", Decision::Allowed);
    let before = sim.stats();
    let (mut t, live) = hand_over(t, &driver);
    assert_eq!(sim.stats(), before, "the driver lost or gained something");
    assert_eq!(live.opens.len(), 2);
    assert_eq!(t.proxy.object_count(), objects);
    assert_eq!(t.proxy.open_files(), 2);
    assert_eq!(
        t.proxy
            .counts()
            .get(Kind::Escape, "NV_ESC_RM_ALLOC", Decision::Allowed),
        counted,
        "the audit counts came along"
    );
    // The records came along: a checkpoint of the adopted proxy names the channel group as
    // what it cannot replay, and only that.
    match t.proxy.checkpoint() {
        Err(CheckpointError::Unreplayable { items, .. }) => {
            assert_eq!(items.len(), 1, "{items:?}");
            assert!(items[0].contains("KEPLER_CHANNEL_GROUP_A"), "{items:?}");
        }
        other => panic!("checkpoint of the adopted proxy: {other:?}"),
    }
    // The tenant goes on: a control on the old subdevice, an alloc under the old device, the
    // free of the old memory, on the old opens.
    let (s, _) = t.control(
        tree.ctl,
        tree.client,
        tree.subdevice,
        GPU_GET_INFO_V2,
        &[0; 132],
    );
    assert_eq!(s, 0, "control on an old handle");
    let (s, _) = t.alloc(
        tree.ctl,
        tree.client,
        tree.device,
        VIDMEM,
        &mem_params(4 << 20),
    );
    assert_eq!(s, 0, "alloc under an old handle");
    let mut free = vec![0u8; 16];
    wr32(&mut free, 0, tree.client);
    wr32(&mut free, 4, tree.device);
    wr32(&mut free, 8, tree.memory);
    let (_, out) = t.ioctl(tree.ctl, nv_iowr(0x29, 16), &free);
    assert_eq!(rd32(&out, 12), 0, "free of old memory");
    // Ownership stays: a new open cannot use the old client... but the old open can.
    let other = t.proxy.open(FrontendNode::Ctl).unwrap();
    assert!(
        other.0 > tree.gpu.0,
        "new open ids continue after the old ones"
    );
    t.proxy.release(other);

    // A second hand-over of the adopted proxy works the same way.
    let (t, _) = hand_over(t, &driver);
    t.proxy.release(tree.gpu);
    t.proxy.release(tree.ctl);
    assert_eq!(t.proxy.object_count(), 0);
    drop(t);
    assert_eq!(sim.stats(), SimStats::default(), "the driver holds nothing");
}

#[test]
fn test_bad_tables_are_refused() {
    let (_sim, driver, t, tree) = setup();
    let (live, files) = t.proxy.export_live().unwrap();
    let handed = |files: &[HandedFile]| -> Vec<Option<HandedFile>> {
        files
            .iter()
            .map(|f| {
                Some(HandedFile {
                    node: f.node,
                    fd: None,
                    token: f.token,
                    id: f.id,
                    mapping: f.mapping,
                })
            })
            .collect()
    };
    let refused = |live: LiveProxy, why: &str| {
        let e = proxy(&driver)
            .adopt_live(live, &mut handed(&files))
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{e}");
    };
    let mut twice = live.clone();
    twice.opens[1].saved.id = twice.opens[0].saved.id;
    refused(twice, "taken");
    let mut orphan = live.clone();
    orphan.clients[0].owner = 999;
    refused(orphan, "owner open 999 unknown");
    let mut lost = live.clone();
    lost.opens[0].host = 77;
    refused(lost, "host file 77 missing");
    let mut shared = live.clone();
    shared.opens[1].host = shared.opens[0].host;
    refused(shared, "named twice");
    let mut parentless = live.clone();
    parentless.clients[0].objects[0].parent = 0xdead;
    refused(parentless, "parent");
    // A proxy that serves already takes nothing.
    let busy = proxy(&driver);
    let open = busy.open(FrontendNode::Ctl).unwrap();
    let e = busy
        .adopt_live(live.clone(), &mut handed(&files))
        .unwrap_err()
        .to_string();
    assert!(e.contains("already serves"), "{e}");
    busy.release(open);
    drop(files);
    t.proxy.release(tree.gpu);
    t.proxy.release(tree.ctl);
}

#[test]
fn test_a_driver_in_this_process_cannot_hand_over() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut t = SimTenant::new(&sim, "job", vec![0]);
    let _ = build(&mut t);
    let e = t.proxy.export_live().unwrap_err().to_string();
    assert!(e.contains("[sim] process = true"), "{e}");
}

/// The bytes of video memory `p` counts on GPU `minor`.
fn video_used(p: &Proxy, minor: u32) -> u64 {
    p.gpu_memory_used()
        .iter()
        .find(|g| g.0 == minor)
        .map_or(0, |g| g.1)
}

/// The video memory an export or a UVM external mapping keeps counted (a hold of an open, not
/// an object) comes along: before, the new worker forgot it and the tenant got it back.
#[test]
fn test_the_files_holds_of_video_memory_come_along() {
    let (_sim, driver, t, tree) = setup();
    let (mut live, files) = t.proxy.export_live().unwrap();
    let (gpu, minor) = (t.proxy.gpus()[0].gpu_id, t.proxy.gpus()[0].minor);
    let used = |p: &Proxy| video_used(p, minor);
    let before = used(&t.proxy);
    assert!(
        before >= 2 << 20,
        "the tree's video memory is counted: {before}"
    );
    // As an export to the control open would have left it (a block no object names).
    let charge = VidCharge {
        block: 1 << 40,
        gpu,
        bytes: 4 << 20,
    };
    live.vid_holds.push((tree.ctl.0, 0, charge));
    let live: LiveProxy = serde_json::from_str(&serde_json::to_string(&live).unwrap()).unwrap();
    let new = proxy(&driver);
    let mut files: Vec<Option<HandedFile>> = files.into_iter().map(Some).collect();
    new.adopt_live(live, &mut files).unwrap();
    drop(t.proxy);
    assert_eq!(used(&new), before + (4 << 20));
    // And it goes with the file that held it.
    let (again, _) = new.export_live().unwrap();
    assert_eq!(again.vid_holds, [(tree.ctl.0, 0, charge)]);
    // The GPU open registered the control open (REGISTER_FD): the control file goes with it.
    new.release(tree.ctl);
    assert_eq!(
        used(&new),
        before + (4 << 20),
        "the driver still holds the file"
    );
    new.release(tree.gpu);
    assert_eq!(used(&new), 0);
}

/// A control open the tenant closed while the GPU open that registered it lives on lingers
/// (the driver keeps its file, its clients and their memory): a live upgrade carries it, and
/// the new worker releases it with the GPU open.
#[test]
fn test_a_lingering_control_open_comes_along() {
    let (sim, driver, t, tree) = setup();
    let minor = t.proxy.gpus()[0].minor;
    let used = |p: &Proxy| video_used(p, minor);
    let before = used(&t.proxy);
    let objects = t.proxy.object_count();
    assert!(before > 0 && objects > 0);
    t.proxy.release(tree.ctl);
    assert_eq!((t.proxy.lingering_opens(), used(&t.proxy)), (1, before));
    let (live, files) = t.proxy.export_live().unwrap();
    assert_eq!(
        live.opens
            .iter()
            .filter(|o| o.lingering)
            .map(|o| o.saved.id)
            .collect::<Vec<_>>(),
        [tree.ctl.0]
    );
    let live: LiveProxy = serde_json::from_str(&serde_json::to_string(&live).unwrap()).unwrap();
    let new = proxy(&driver);
    let mut files: Vec<Option<HandedFile>> = files.into_iter().map(Some).collect();
    new.adopt_live(live, &mut files).unwrap();
    drop(t.proxy);
    driver.transit.files.lock().unwrap().clear();
    assert_eq!(
        (new.lingering_opens(), used(&new), new.object_count()),
        (1, before, objects)
    );
    new.release(tree.gpu);
    assert_eq!(
        (new.lingering_opens(), used(&new), new.object_count()),
        (0, 0, 0)
    );
    drop(new);
    assert_eq!(sim.stats().live_clients, 0);
}

#[test]
fn test_the_served_policy_travels_whole() {
    let mut p = InstancePolicy::new("job", Caps::COMPUTE_UTILITY, vec![3, 1]);
    p.mode = Mode::Audit;
    p.allow = ["NV_ESC_NUMA_INFO".to_owned()].into();
    p.deny = ["NV2080_CTRL_CMD_GPU_GET_NAME_STRING".to_owned()].into();
    p.only = Some(["NV_ESC_CARD_INFO".to_owned()].into());
    p.uvm_mmap = false;
    p.quotas.objects = 77;
    p.quotas.gpu_memory = Some(10 << 30);
    p.quotas.system_memory = Some(3 << 30);
    p.priority = Priority::Low;
    let live = ioctl_proxy::live::LivePolicy::of(&p);
    let text = serde_json::to_string(&live).unwrap();
    let back: ioctl_proxy::live::LivePolicy = serde_json::from_str(&text).unwrap();
    assert_eq!(back.to_policy().unwrap(), p);
    let mut bad = back.clone();
    bad.caps.push("display".into());
    assert!(bad.to_policy().is_err());
    let mut bad = back;
    bad.mode = "permissive".into();
    assert!(bad.to_policy().is_err());
}
