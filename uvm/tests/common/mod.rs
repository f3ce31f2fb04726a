//! Fakes for the UVM proxy tests: a recording host driver (frontend escapes just enough for a
//! `Proxy` and its RM clients; UVM calls recorded and answered with a settable status),
//! sparse client memory with a retry-transport variant, an fd table, an audit sink.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use ioctl_proxy::*;
use nvproxy_abi::Caps;
use nvproxy_abi::ioctl::{ioc_nr, ioc_type, nv_iowr};
use uvm::UvmProxy;

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

/// One UVM call as the host saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub file: i32,
    pub cmd: u32,
    pub params: Vec<u8>,
}

#[derive(Default)]
struct State {
    uvm_calls: Vec<Seen>,
    next_handle: u32,
    open: Vec<i32>,
    /// Status the host writes into a UVM call's `rmStatus` (at `status_at`).
    uvm_status: Option<(usize, u32)>,
    mmap_fd_calls: Vec<i32>,
}

/// A recording fake driver; GPUs are `(minor, gpu_id)`.
pub struct FakeHost {
    gpus: Vec<(u32, u32)>,
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

    pub fn uvm_calls(&self) -> Vec<Seen> {
        self.state.lock().unwrap().uvm_calls.clone()
    }

    pub fn clear(&self) {
        self.state.lock().unwrap().uvm_calls.clear();
    }

    pub fn set_uvm_status(&self, at: usize, status: u32) {
        self.state.lock().unwrap().uvm_status = Some((at, status));
    }

    pub fn open_files(&self) -> usize {
        self.state.lock().unwrap().open.len()
    }

    pub fn mmap_fd_calls(&self) -> Vec<i32> {
        self.state.lock().unwrap().mmap_fd_calls.clone()
    }
}

struct FakeFile {
    host: Arc<FakeHost>,
    node: NodeKind,
    id: i32,
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
            .open
            .retain(|&f| f != self.id);
    }
}

impl HostFile for FakeFile {
    fn node(&self) -> NodeKind {
        self.node
    }
    fn id(&self) -> i32 {
        self.id
    }
    /// UVM files: a dup of `/dev/null` stands for the host UVM fd.
    fn mmap_fd(&self) -> io::Result<(std::os::fd::OwnedFd, u64)> {
        self.host.state.lock().unwrap().mmap_fd_calls.push(self.id);
        if self.node != NodeKind::Uvm {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        Ok((std::fs::File::open("/dev/null")?.into(), 0))
    }
    fn ioctl(&self, call: &mut HostCall) -> io::Result<i32> {
        let mut st = self.host.state.lock().unwrap();
        if self.node == NodeKind::Uvm {
            st.uvm_calls.push(Seen {
                file: self.id,
                cmd: call.cmd,
                params: call.params.clone(),
            });
            if let Some((at, s)) = st.uvm_status {
                if at + 4 <= call.params.len() {
                    wr32(&mut call.params, at, s);
                }
            }
            return Ok(0);
        }
        assert_eq!(ioc_type(call.cmd), b'F');
        match ioc_nr(call.cmd) {
            0xc8 => {
                for (i, &(minor, id)) in self.host.gpus.iter().enumerate() {
                    let e = &mut call.params[i * 72..(i + 1) * 72];
                    e[0] = 1;
                    wr32(e, 16, id);
                    wr32(e, 56, minor);
                }
            }
            0x2b => {
                // NVOS64: handle at 8, status at 40.
                if rd32(&call.params, 8) == 0 {
                    let h = st.next_handle;
                    st.next_handle += 1;
                    wr32(&mut call.params, 8, h);
                }
                wr32(&mut call.params, 40, 0);
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
        self.0.state.lock().unwrap().open.push(id);
        Ok(Arc::new(FakeFile {
            host: self.0.clone(),
            node,
            id,
        }))
    }
}

/// Sparse client memory; with `retry`, reads of bytes not yet fetched are `Pending`.
#[derive(Default)]
pub struct FakeMem {
    regions: BTreeMap<u64, Vec<u8>>,
    reserved: Vec<(u64, usize)>,
    pub reads: Vec<(u64, usize)>,
    retry: bool,
    fetched: Vec<(u64, usize)>,
    wanted: Vec<(u64, usize)>,
    /// Ranges read since [`FakeMem::begin_request`]: a second read of any byte panics (the
    /// request path reads each client byte once).
    request_reads: Vec<(u64, usize)>,
    checking: bool,
}

impl FakeMem {
    /// Starts a new request: the read-once check starts over.
    pub fn begin_request(&mut self) {
        self.request_reads.clear();
        self.checking = true;
    }

    pub fn retrying() -> Self {
        Self {
            retry: true,
            ..Self::default()
        }
    }

    pub fn map(&mut self, addr: u64, bytes: &[u8]) {
        self.regions.insert(addr, bytes.to_vec());
    }

    pub fn get(&self, addr: u64, len: usize) -> Vec<u8> {
        let (base, r) = self.regions.range(..=addr).next_back().unwrap();
        let o = (addr - base) as usize;
        r[o..o + len].to_vec()
    }

    pub fn fetch(&mut self) {
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
        let end = addr.saturating_add(len as u64);
        if self.checking
            && self
                .request_reads
                .iter()
                .any(|&(a, l)| a < end && addr < a + l as u64)
        {
            panic!("client bytes read twice in one request: {len} bytes at {addr:#x}");
        }
        self.request_reads.push((addr, len));
        if self.retry && !Self::covered(&self.fetched, addr, len) {
            self.wanted.push((addr, len));
            return Err(MemError::Pending);
        }
        let (r, o) = self.region(addr, len).ok_or(MemError::Fault)?;
        Ok(r[o..o + len].to_vec())
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

/// The caller's fd table: fd number → open, or a resolution errno.
#[derive(Default)]
pub struct FakeFds(pub HashMap<i32, Result<OpenId, FdError>>);

impl FakeFds {
    pub fn add(&mut self, fd: i32, open: OpenId) {
        self.0.insert(fd, Ok(open));
    }
}

impl FdResolver for FakeFds {
    fn resolve(&self, fd: i32) -> Result<OpenId, FdError> {
        self.0.get(&fd).copied().unwrap_or(Err(FdError::Foreign))
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

/// Host GPUs (minor, id); the default instance gets minors 1 and 2.
pub const HOST_GPUS: [(u32, u32); 3] = [(0, 0x100), (1, 0x200), (2, 0x300)];

/// The UUID the tests give host GPU `minor`.
pub fn gpu_uuid(minor: u32) -> [u8; 16] {
    let mut u = [0x42u8; 16];
    u[0] = minor as u8;
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
