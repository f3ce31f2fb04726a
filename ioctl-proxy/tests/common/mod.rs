//! Fakes for the proxy tests: a recording host driver that answers like the driver for the
//! calls the tests need, sparse client memory (with a retry-transport variant), an fd table,
//! and an audit sink that keeps events.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use ioctl_proxy::*;
use nvproxy_abi::ioctl::{ioc_nr, nv_iowr};

pub const INVALID_ID: u32 = 0xffff_ffff;

/// One call as the host saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub file: i32,
    pub node: NodeKind,
    pub call: HostCall,
}

#[derive(Default)]
struct State {
    calls: Vec<Seen>,
    next_handle: u32,
    /// Status the host answers for an RM control command or an alloc class.
    control_status: HashMap<u32, u32>,
    class_status: HashMap<u32, u32>,
    /// errno the host fails an escape (by `_IOC_NR`) with.
    escape_errno: HashMap<u8, i32>,
    open_files: Vec<i32>,
    /// Files opened with `open_mapping`, still open.
    mapping_files: Vec<(i32, NodeKind)>,
    /// Files `mmap_fd` was asked of.
    mmap_fd_calls: Vec<i32>,
    /// `open_mapping` fails: "Landlock unavailable" (`ErrorKind::Unsupported`).
    no_mmap_path: bool,
}

/// A recording fake driver. GPUs are `(minor, gpu_id)`.
pub struct FakeHost {
    pub gpus: Vec<(u32, u32)>,
    version: String,
    state: Mutex<State>,
    next_fd: AtomicI32,
}

impl FakeHost {
    pub fn new(version: &str, gpus: &[(u32, u32)]) -> Arc<Self> {
        Arc::new(Self {
            gpus: gpus.to_vec(),
            version: version.into(),
            state: Mutex::new(State {
                next_handle: 0xc1d0_0001,
                ..State::default()
            }),
            next_fd: AtomicI32::new(100),
        })
    }

    pub fn calls(&self) -> Vec<Seen> {
        self.state.lock().unwrap().calls.clone()
    }

    /// Calls with `_IOC_NR == nr` (CARD_INFO calls the proxy makes itself included).
    pub fn calls_nr(&self, nr: u8) -> Vec<Seen> {
        self.calls()
            .into_iter()
            .filter(|s| ioc_nr(s.call.cmd) == nr)
            .collect()
    }

    /// RM controls the host saw with command `cmd`.
    pub fn controls(&self, cmd: u32) -> Vec<Seen> {
        self.calls_nr(0x2a)
            .into_iter()
            .filter(|s| rd32(&s.call.params, 8) == cmd)
            .collect()
    }

    pub fn clear(&self) {
        self.state.lock().unwrap().calls.clear();
    }

    pub fn set_control_status(&self, cmd: u32, status: u32) {
        self.state
            .lock()
            .unwrap()
            .control_status
            .insert(cmd, status);
    }

    pub fn set_class_status(&self, class: u32, status: u32) {
        self.state
            .lock()
            .unwrap()
            .class_status
            .insert(class, status);
    }

    pub fn set_escape_errno(&self, nr: u8, errno: i32) {
        self.state.lock().unwrap().escape_errno.insert(nr, errno);
    }

    pub fn clear_escape_errno(&self, nr: u8) {
        self.state.lock().unwrap().escape_errno.remove(&nr);
    }

    pub fn open_files(&self) -> usize {
        self.state.lock().unwrap().open_files.len()
    }

    /// The mapping files still open: (id, node).
    pub fn mapping_files(&self) -> Vec<(i32, NodeKind)> {
        self.state.lock().unwrap().mapping_files.clone()
    }

    /// Ids of the files `mmap_fd` was called on, in order.
    pub fn mmap_fd_calls(&self) -> Vec<i32> {
        self.state.lock().unwrap().mmap_fd_calls.clone()
    }

    /// Makes `open_mapping` fail as a host without Landlock ABI 5 does.
    pub fn set_no_mmap_path(&self) {
        self.state.lock().unwrap().no_mmap_path = true;
    }
}

pub fn rd32(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().unwrap())
}
pub fn rd64(b: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(b[off..off + 8].try_into().unwrap())
}
pub fn wr32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}
pub fn wr64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

fn nested_at(call: &mut HostCall, parent: Option<usize>, off: usize) -> Option<usize> {
    call.nested
        .iter()
        .position(|n| n.parent == parent && n.offset == off)
}

struct FakeFile {
    host: Arc<FakeHost>,
    node: NodeKind,
    id: i32,
    mapping: bool,
}

impl std::fmt::Debug for FakeFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FakeFile({})", self.id)
    }
}

impl Drop for FakeFile {
    fn drop(&mut self) {
        self.host
            .state
            .lock()
            .unwrap()
            .open_files
            .retain(|&f| f != self.id);
        self.host
            .state
            .lock()
            .unwrap()
            .mapping_files
            .retain(|&(f, _)| f != self.id);
    }
}

impl HostFile for FakeFile {
    fn node(&self) -> NodeKind {
        self.node
    }
    fn id(&self) -> i32 {
        self.id
    }
    /// Mapping files only; a dup of `/dev/null` stands for the mappable fd.
    fn mmap_fd(&self) -> io::Result<(std::os::fd::OwnedFd, u64)> {
        self.host.state.lock().unwrap().mmap_fd_calls.push(self.id);
        if !self.mapping {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        Ok((std::fs::File::open("/dev/null")?.into(), 0))
    }
    fn ioctl(&self, call: &mut HostCall) -> io::Result<i32> {
        let mut st = self.host.state.lock().unwrap();
        assert!(!self.mapping, "the proxy issued an ioctl on a mapping file");
        st.calls.push(Seen {
            file: self.id,
            node: self.node,
            call: call.clone(),
        });
        let nr = ioc_nr(call.cmd);
        if let Some(&e) = st.escape_errno.get(&nr) {
            return Err(io::Error::from_raw_os_error(e));
        }
        let gpus = &self.host.gpus;
        match nr {
            0xc8 => {
                for (i, &(minor, id)) in gpus.iter().enumerate() {
                    let e = &mut call.params[i * 72..(i + 1) * 72];
                    e[0] = 1;
                    wr32(e, 4, 0x10 + i as u32); // pci domain
                    wr32(e, 16, id);
                    wr32(e, 56, minor);
                }
            }
            0x2b => {
                let class = rd32(&call.params, 12);
                if rd32(&call.params, 8) == 0 {
                    let h = st.next_handle;
                    st.next_handle += 1;
                    wr32(&mut call.params, 8, h);
                }
                let status = st.class_status.get(&class).copied().unwrap_or(0);
                wr32(&mut call.params, 40, status);
            }
            0x29 => wr32(&mut call.params, 12, 0),
            0x34 if rd32(&call.params, 8) == 0 => {
                let h = st.next_handle;
                st.next_handle += 1;
                wr32(&mut call.params, 8, h);
            }
            0x2a => {
                let cmd = rd32(&call.params, 8);
                let p = nested_at(call, None, 16);
                let ids: Vec<u32> = gpus.iter().map(|g| g.1).collect();
                match (cmd, p) {
                    (0x214 | 0x201, Some(p)) => {
                        let d = &mut call.nested[p].data;
                        for i in 0..32 {
                            wr32(d, 4 * i, ids.get(i).copied().unwrap_or(INVALID_ID));
                            if cmd == 0x214 {
                                wr32(d, 128 + 4 * i, INVALID_ID);
                            }
                        }
                    }
                    // GET_DEVICE_IDS: every host GPU's device instance (its index).
                    (0x204, Some(p)) => {
                        let mask = (0..gpus.len()).fold(0u32, |m, i| m | 1 << i);
                        wr32(&mut call.nested[p].data, 0, mask);
                    }
                    // SYNC_GPU_BOOST_GROUP_INFO: one group of every host GPU.
                    (0xa04, Some(p)) => {
                        let d = &mut call.nested[p].data;
                        wr32(d, 0, 1);
                        wr32(d, 4, gpus.len() as u32);
                        for (i, g) in gpus.iter().enumerate() {
                            wr32(d, 8 + 4 * i, g.1);
                        }
                        wr32(d, 4 + 132, 7);
                    }
                    // NVLINK_GET_NVLINK_STATUS (535 layout: linkInfo at 8, 184-byte entries,
                    // remoteDeviceInfo at 88): link i connects to host GPU i (a GPU, type 2,
                    // PCI domain 0x10 + i as CARD_INFO says).
                    (0x2080_3002, Some(p)) => {
                        let d = &mut call.nested[p].data;
                        wr32(d, 0, (1 << gpus.len()) - 1);
                        for i in 0..gpus.len() {
                            let e = 8 + 184 * i;
                            d[e + 56] = 1;
                            let r = e + 88;
                            wr32(d, r + 4, 0x10 + i as u32);
                            wr64(d, r + 24, 2);
                            d[r + 32..r + 48].fill(0xa0 + i as u8);
                        }
                    }
                    // GPU_GET_PIDS: this process and two others.
                    (0x2080_018d, Some(p)) => {
                        let d = &mut call.nested[p].data;
                        wr32(d, 8, 3);
                        wr32(d, 12, std::process::id());
                        wr32(d, 16, 1);
                        wr32(d, 20, 2);
                    }
                    (0x205, Some(p)) => {
                        let d = &mut call.nested[p].data;
                        let id = rd32(d, 0);
                        if let Some(i) = ids.iter().position(|&g| g == id) {
                            wr32(d, 8, i as u32);
                        }
                    }
                    (0x80_0201, Some(p)) => {
                        if let Some(l) = nested_at(call, Some(p), 8) {
                            let list = &mut call.nested[l].data;
                            for (i, c) in list.chunks_exact_mut(4).enumerate() {
                                c.copy_from_slice(&(0xc000 + i as u32).to_ne_bytes());
                            }
                        }
                    }
                    _ => {}
                }
                let status = st.control_status.get(&cmd).copied().unwrap_or(0);
                wr32(&mut call.params, 28, status);
            }
            0x4a => {
                // VID_HEAP ALLOC_SIZE: pick hMemory, write the address output.
                if rd32(&call.params, 44) == 0 {
                    let h = st.next_handle;
                    st.next_handle += 1;
                    wr32(&mut call.params, 44, h);
                }
                if let Some(a) = nested_at(call, None, 120) {
                    call.nested[a]
                        .data
                        .copy_from_slice(&0xfeed_0000u64.to_ne_bytes());
                }
            }
            _ => {}
        }
        Ok(0)
    }
}

/// The fake as a `HostDriver`.
pub struct Driver(pub Arc<FakeHost>);

impl HostDriver for Driver {
    fn version(&self) -> &str {
        &self.0.version
    }
    fn open(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        let id = self.0.next_fd.fetch_add(1, Ordering::Relaxed);
        self.0.state.lock().unwrap().open_files.push(id);
        Ok(Arc::new(FakeFile {
            host: self.0.clone(),
            node,
            id,
            mapping: false,
        }))
    }
    fn open_mapping(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        let mut st = self.0.state.lock().unwrap();
        if st.no_mmap_path {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "Landlock ABI 5 unavailable",
            ));
        }
        let id = self.0.next_fd.fetch_add(1, Ordering::Relaxed);
        st.open_files.push(id);
        st.mapping_files.push((id, node));
        Ok(Arc::new(FakeFile {
            host: self.0.clone(),
            node,
            id,
            mapping: true,
        }))
    }
}

/// Sparse client memory: mapped regions; everything else faults. With `retry`, reads of bytes
/// not yet "fetched" return `Pending` and are remembered, as the CUSE retry transport does.
#[derive(Default)]
pub struct FakeMem {
    regions: BTreeMap<u64, Vec<u8>>,
    reserved: Vec<(u64, usize)>,
    pub reads: Vec<(u64, usize)>,
    pub largest_read: usize,
    retry: bool,
    fetched: Vec<(u64, usize)>,
    wanted: Vec<(u64, usize)>,
    pub rounds: usize,
    /// Ranges read since [`FakeMem::begin_request`]: a second read of any byte of them panics
    /// (the request path reads each client byte once).
    request_reads: Vec<(u64, usize)>,
    /// `(addr, bytes)`: written at `addr` right after the first read that covers `addr`, as
    /// another tenant thread racing the daemon would.
    flips: Vec<(u64, Vec<u8>)>,
    /// Whether the read-once check is on (from the first `begin_request`).
    checking: bool,
    /// The caller's fds that [`ClientMemory::client_fd`] can duplicate.
    pub files: HashMap<i32, std::fs::File>,
}

impl FakeMem {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn retrying() -> Self {
        Self {
            retry: true,
            ..Self::default()
        }
    }

    /// Maps `bytes` at `addr`.
    pub fn map(&mut self, addr: u64, bytes: &[u8]) {
        self.regions.insert(addr, bytes.to_vec());
    }

    pub fn get(&self, addr: u64, len: usize) -> Vec<u8> {
        let (base, r) = self.regions.range(..=addr).next_back().unwrap();
        let o = (addr - base) as usize;
        r[o..o + len].to_vec()
    }

    pub fn u32_at(&self, addr: u64) -> u32 {
        rd32(&self.get(addr, 4), 0)
    }

    /// Starts a new request (one run of a handler): the read-once check starts over.
    pub fn begin_request(&mut self) {
        self.request_reads.clear();
        self.checking = true;
    }

    /// After the first read covering `addr`, `bytes` are written there (a racing thread).
    pub fn flip_after_read(&mut self, addr: u64, bytes: &[u8]) {
        self.flips.push((addr, bytes.to_vec()));
    }

    /// Makes every range asked for so far available (one retry round).
    pub fn fetch(&mut self) {
        self.rounds += 1;
        let w = std::mem::take(&mut self.wanted);
        self.fetched.extend(w);
    }

    fn region(&mut self, addr: u64, len: usize) -> Option<(&mut Vec<u8>, usize)> {
        let (base, r) = self.regions.range_mut(..=addr).next_back()?;
        let o = usize::try_from(addr - base).ok()?;
        (o.checked_add(len)? <= r.len()).then_some((r, o))
    }

    fn covered(list: &[(u64, usize)], addr: u64, len: usize) -> bool {
        list.iter()
            .any(|&(a, l)| a <= addr && addr + len as u64 <= a + l as u64)
    }
}

impl ClientMemory for FakeMem {
    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
        self.reads.push((addr, len));
        self.largest_read = self.largest_read.max(len);
        let end = addr.saturating_add(len as u64);
        if let Some(&(a, l)) = self
            .request_reads
            .iter()
            .find(|&&(a, l)| self.checking && a < end && addr < a + l as u64)
        {
            panic!(
                "client bytes read twice in one request: {len} bytes at {addr:#x} overlap \
                 the earlier read of {l} bytes at {a:#x}"
            );
        }
        self.request_reads.push((addr, len));
        if self.retry && !Self::covered(&self.fetched, addr, len) {
            self.wanted.push((addr, len));
            return Err(MemError::Pending);
        }
        let (r, o) = self.region(addr, len).ok_or(MemError::Fault)?;
        let data = r[o..o + len].to_vec();
        if let Some(i) = self.flips.iter().position(|(a, _)| *a >= addr && *a < end) {
            let (a, bytes) = self.flips.remove(i);
            if let Some((r, o)) = self.region(a, bytes.len()) {
                r[o..o + bytes.len()].copy_from_slice(&bytes);
            }
        }
        Ok(data)
    }

    fn client_fd(&mut self, fd: i32) -> io::Result<std::os::fd::OwnedFd> {
        let f = self
            .files
            .get(&fd)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        Ok(std::os::fd::OwnedFd::from(f.try_clone()?))
    }

    fn reserve_write(&mut self, addr: u64, len: usize) -> Result<(), MemError> {
        self.region(addr, len).ok_or(MemError::Fault)?;
        self.reserved.push((addr, len));
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        assert!(
            Self::covered(&self.reserved, addr, data.len()),
            "write of {} bytes at {addr:#x} was not reserved",
            data.len()
        );
        let (r, o) = self.region(addr, data.len()).ok_or(MemError::Fault)?;
        r[o..o + data.len()].copy_from_slice(data);
        Ok(())
    }
}

/// The caller's fd table: fd number → open.
#[derive(Default)]
pub struct FakeFds(pub HashMap<i32, OpenId>);

impl FdResolver for FakeFds {
    fn resolve(&self, fd: i32) -> Result<OpenId, FdError> {
        self.0.get(&fd).copied().ok_or(FdError::Foreign)
    }
}

/// Keeps every audit event.
#[derive(Default)]
pub struct Events(pub Mutex<Vec<AuditEvent>>);

impl AuditSink for Events {
    fn record(&self, ev: &AuditEvent) {
        self.0.lock().unwrap().push(ev.clone());
    }
}

impl Events {
    pub fn all(&self) -> Vec<AuditEvent> {
        self.0.lock().unwrap().clone()
    }
}

pub const CALLER: Caller = Caller {
    pid: 4242,
    tid: 4243,
};

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

pub const HOST_GPUS: [(u32, u32); 3] = [(0, 0x100), (1, 0x200), (2, 0x300)];
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
            wr32(&mut p, 32, params.len() as u32);
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
            wr32(&mut p, 24, params.len() as u32);
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
            wr32(&mut p, 32, params.len() as u32);
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
            wr32(&mut p, 24, params.len() as u32);
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
