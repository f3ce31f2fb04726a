//! A recording fake host driver that answers like the driver for the calls the tests need:
//! the frontend escapes a `Proxy` and its RM clients use, and UVM calls (recorded apart and
//! answered with a settable status).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use ioctl_proxy::{HostCall, HostDriver, HostFile, NodeKind};
use nvproxy_abi::ioctl::{ioc_nr, ioc_type};

use crate::{rd32, wr32, wr64};

/// Host GPUs `(minor, gpu_id)` most tests use: 0:0x100, 1:0x200, 2:0x300.
pub const HOST_GPUS: [(u32, u32); 3] = [(0, 0x100), (1, 0x200), (2, 0x300)];

/// The driver's "no GPU" id.
pub const INVALID_ID: u32 = 0xffff_ffff;

/// One frontend call as the host saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The host file's id.
    pub file: i32,
    /// The node the file is open on.
    pub node: NodeKind,
    /// The call, params and nested buffers as they reached the host.
    pub call: HostCall,
}

/// One UVM call as the host saw it.
#[derive(Debug, Clone)]
pub struct UvmCall {
    /// The host file's id.
    pub file: i32,
    /// The command number.
    pub cmd: u32,
    /// The params as they reached the host.
    pub params: Vec<u8>,
}

#[derive(Default)]
struct State {
    calls: Vec<Seen>,
    uvm_calls: Vec<UvmCall>,
    /// Status the host writes into a UVM call's `rmStatus` (at the offset given).
    uvm_status: Option<(usize, u32)>,
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
    /// The host's GPUs, `(minor, gpu_id)`.
    pub gpus: Vec<(u32, u32)>,
    version: String,
    state: Mutex<State>,
    next_fd: AtomicI32,
}

impl FakeHost {
    /// A host with driver `version` and GPUs `gpus` (`(minor, gpu_id)`).
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

    /// The frontend calls so far (UVM calls are in [`FakeHost::uvm_calls`]).
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

    /// The UVM calls so far.
    pub fn uvm_calls(&self) -> Vec<UvmCall> {
        self.state.lock().unwrap().uvm_calls.clone()
    }

    /// Forgets the calls seen so far (frontend and UVM).
    pub fn clear(&self) {
        let mut st = self.state.lock().unwrap();
        st.calls.clear();
        st.uvm_calls.clear();
    }

    /// Every later UVM call gets `status` written at byte `at` of its params (its
    /// `rmStatus`), where the params are long enough.
    pub fn set_uvm_status(&self, at: usize, status: u32) {
        self.state.lock().unwrap().uvm_status = Some((at, status));
    }

    /// RM controls with command `cmd` answer `status`.
    pub fn set_control_status(&self, cmd: u32, status: u32) {
        self.state
            .lock()
            .unwrap()
            .control_status
            .insert(cmd, status);
    }

    /// Allocations of `class` answer `status`.
    pub fn set_class_status(&self, class: u32, status: u32) {
        self.state
            .lock()
            .unwrap()
            .class_status
            .insert(class, status);
    }

    /// Escapes with `_IOC_NR == nr` fail with `errno`.
    pub fn set_escape_errno(&self, nr: u8, errno: i32) {
        self.state.lock().unwrap().escape_errno.insert(nr, errno);
    }

    /// Escapes with `_IOC_NR == nr` succeed again.
    pub fn clear_escape_errno(&self, nr: u8) {
        self.state.lock().unwrap().escape_errno.remove(&nr);
    }

    /// How many host files are open.
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
    /// Mapping files and UVM files only; a dup of `/dev/null` stands for the mappable fd.
    fn mmap_fd(&self) -> io::Result<(std::os::fd::OwnedFd, u64)> {
        self.host.state.lock().unwrap().mmap_fd_calls.push(self.id);
        if !self.mapping && self.node != NodeKind::Uvm {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        Ok((std::fs::File::open("/dev/null")?.into(), 0))
    }
    fn ioctl(&self, call: &mut HostCall) -> io::Result<i32> {
        let mut st = self.host.state.lock().unwrap();
        assert!(!self.mapping, "the proxy issued an ioctl on a mapping file");
        if self.node == NodeKind::Uvm {
            st.uvm_calls.push(UvmCall {
                file: self.id,
                cmd: call.cmd,
                params: call.params.to_vec(),
            });
            if let Some((at, s)) = st.uvm_status
                && at + 4 <= call.params.len()
            {
                wr32(&mut call.params, at, s);
            }
            return Ok(0);
        }
        assert_eq!(
            ioc_type(call.cmd),
            b'F',
            "a frontend call that is no escape"
        );
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
                    wr32(e, 4, 0x10 + u32::try_from(i).expect("a few GPUs")); // pci domain
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
                        wr32(d, 4, u32::try_from(gpus.len()).expect("a few GPUs"));
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
                            let i = u8::try_from(i).expect("a few GPUs");
                            wr32(d, r + 4, 0x10 + u32::from(i));
                            wr64(d, r + 24, 2);
                            d[r + 32..r + 48].fill(0xa0 + i);
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
                            wr32(d, 8, u32::try_from(i).expect("a few GPUs"));
                        }
                    }
                    (0x80_0201, Some(p)) => {
                        if let Some(l) = nested_at(call, Some(p), 8) {
                            let list = &mut call.nested[l].data;
                            for (i, c) in (0u32..).zip(list.chunks_exact_mut(4)) {
                                c.copy_from_slice(&(0xc000 + i).to_ne_bytes());
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
