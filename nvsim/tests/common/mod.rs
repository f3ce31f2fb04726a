//! Hand-built calls for driving the simulator through `HostDriver`/`HostFile`, as the proxy
//! would after translation.
#![allow(dead_code)]

use std::io;
use std::sync::Arc;

use host_driver::{HostCall, HostDriver, HostFile, NestedBuf, NodeKind};
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use nvsim::{SimConfig, SimDriver};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

pub type File = Arc<dyn HostFile>;

pub fn sim(n: usize) -> Arc<SimDriver> {
    SimDriver::new(SimConfig::default_gpus(n))
}

pub fn open(d: &Arc<SimDriver>, node: NodeKind) -> File {
    d.open(node).expect("open")
}

/// An escape whose payload is `payload`.
pub fn esc_call(nr: u8, payload: &[u8]) -> HostCall {
    HostCall {
        cmd: nv_iowr(nr, payload.len()),
        params: payload.into(),
        nested: Default::default(),
    }
}

/// Runs an escape with a struct payload; returns the syscall result and the payload after.
pub fn esc<T: IntoBytes + FromBytes + zerocopy::Immutable>(
    f: &File,
    nr: u8,
    payload: &T,
) -> (io::Result<i32>, T) {
    let mut call = esc_call(nr, payload.as_bytes());
    let r = f.ioctl(&mut call);
    (r, T::read_from_bytes(&call.params).expect("same size"))
}

pub fn errno(r: io::Result<i32>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// `NV_ESC_RM_ALLOC` with `NVOS64_PARAMETERS`; returns (status, hObjectNew).
pub fn alloc(
    f: &File,
    h_root: u32,
    h_parent: u32,
    h_new: u32,
    class: u32,
    params: Option<&[u8]>,
) -> (u32, u32) {
    let (r, p, _) = alloc_full(f, h_root, h_parent, h_new, class, params);
    assert_eq!(r.expect("RM_ALLOC syscall"), 0);
    (p.status, p.hObjectNew)
}

/// `NV_ESC_RM_ALLOC` (NVOS64); returns the syscall result, the params and the alloc params after.
pub fn alloc_full(
    f: &File,
    h_root: u32,
    h_parent: u32,
    h_new: u32,
    class: u32,
    params: Option<&[u8]>,
) -> (io::Result<i32>, NVOS64_PARAMETERS, Option<Vec<u8>>) {
    let mut p = NVOS64_PARAMETERS::new_zeroed();
    p.hRoot = h_root;
    p.hObjectParent = h_parent;
    p.hObjectNew = h_new;
    p.hClass = class;
    p.paramsSize = params.map_or(0, |b| u32::try_from(b.len()).expect("small params"));
    p.pAllocParms = if params.is_some() { 0x7000_0000 } else { 0 };
    let mut call = HostCall {
        cmd: NV_ESC_RM_ALLOC_NVOS64,
        params: p.as_bytes().into(),
        nested: params
            .map(|b| NestedBuf {
                parent: None,
                offset: 16,
                data: b.to_vec().into(),
            })
            .into_iter()
            .collect(),
    };
    let r = f.ioctl(&mut call);
    let out = NVOS64_PARAMETERS::read_from_bytes(&call.params).expect("size");
    (r, out, call.nested.first().map(|n| n.data.to_vec()))
}

/// A root client, driver-chosen handle.
pub fn client(ctl: &File) -> u32 {
    let (s, h) = alloc(ctl, 0, 0, 0, 0x41, None);
    assert_eq!(s, 0, "client alloc");
    h
}

pub fn device(ctl: &File, h_client: u32, h: u32, device_id: u32) -> u32 {
    let mut p = NV0080_ALLOC_PARAMETERS::new_zeroed();
    p.deviceId = device_id;
    let (s, h) = alloc(ctl, h_client, h_client, h, 0x80, Some(p.as_bytes()));
    assert_eq!(s, 0, "device alloc");
    h
}

pub fn subdevice(ctl: &File, h_client: u32, h_device: u32, h: u32) -> u32 {
    let (s, h) = alloc(
        ctl,
        h_client,
        h_device,
        h,
        0x2080,
        Some(&0u32.to_ne_bytes()),
    );
    assert_eq!(s, 0, "subdevice alloc");
    h
}

/// `NV_ESC_RM_CONTROL`; returns (status, params after).
pub fn control(f: &File, h_client: u32, h_object: u32, cmd: u32, params: &[u8]) -> (u32, Vec<u8>) {
    let (s, call) = control_call(f, h_client, h_object, cmd, params, vec![]);
    (
        s,
        call.nested
            .first()
            .map(|n| n.data.to_vec())
            .unwrap_or_default(),
    )
}

/// `NV_ESC_RM_CONTROL` with extra nested buffers (pointers inside the params: parent Some(0)).
pub fn control_call(
    f: &File,
    h_client: u32,
    h_object: u32,
    cmd: u32,
    params: &[u8],
    inner: Vec<(usize, Vec<u8>)>,
) -> (u32, HostCall) {
    let mut p = NVOS54_PARAMETERS::new_zeroed();
    p.hClient = h_client;
    p.hObject = h_object;
    p.cmd = cmd;
    p.paramsSize = u32::try_from(params.len()).expect("small params");
    p.params = if params.is_empty() { 0 } else { 0x6000_0000 };
    let mut nested = Vec::new();
    if !params.is_empty() {
        nested.push(NestedBuf {
            parent: None,
            offset: 16,
            data: params.to_vec().into(),
        });
    }
    for (offset, data) in inner {
        nested.push(NestedBuf {
            parent: Some(0),
            offset,
            data: data.into(),
        });
    }
    let mut call = HostCall {
        cmd: NV_ESC_RM_CONTROL_CMD,
        params: p.as_bytes().into(),
        nested: nested.into(),
    };
    assert_eq!(f.ioctl(&mut call).expect("RM_CONTROL syscall"), 0);
    let out = NVOS54_PARAMETERS::read_from_bytes(&call.params).expect("size");
    (out.status, call)
}

/// A typed control: sends `params`, returns (status, params after).
pub fn ctrl<T: IntoBytes + FromBytes + zerocopy::Immutable>(
    f: &File,
    h_client: u32,
    h_object: u32,
    cmd: u32,
    params: &T,
) -> (u32, T) {
    let (s, out) = control(f, h_client, h_object, cmd, params.as_bytes());
    (s, T::read_from_bytes(&out).expect("same size"))
}

pub fn free(f: &File, h_client: u32, h_object: u32) -> u32 {
    let mut p = NVOS00_PARAMETERS::new_zeroed();
    p.hRoot = h_client;
    p.hObjectParent = h_client;
    p.hObjectOld = h_object;
    let (r, p) = esc(f, NV_ESC_RM_FREE, &p);
    assert_eq!(r.expect("RM_FREE syscall"), 0);
    p.status
}

/// `REGISTER_FD` of `gpu` onto `ctl`.
pub fn register(gpu: &File, ctl: &File) -> io::Result<i32> {
    esc(
        gpu,
        NV_ESC_REGISTER_FD,
        &nv_ioctl_register_fd_t { ctl_fd: ctl.id() },
    )
    .0
}

/// A C string from a byte buffer.
pub fn cstr(b: &[u8]) -> String {
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..n]).into_owned()
}

/// `NV_MEMORY_ALLOCATION_PARAMS` bytes of the given size for this driver version's layout.
pub fn mem_params(size: u64, layout_size: usize) -> Vec<u8> {
    let mut p = NV_MEMORY_ALLOCATION_PARAMS::new_zeroed();
    p.size = size;
    let mut v = p.as_bytes().to_vec();
    v.resize(layout_size, 0);
    v
}

/// A ctl file with one client, nvidia0 open and registered, a device and a subdevice.
pub struct Stack {
    pub ctl: File,
    pub gpu: File,
    pub client: u32,
    pub device: u32,
    pub subdevice: u32,
}

pub const H_DEVICE: u32 = 0xd000_0001;
pub const H_SUBDEVICE: u32 = 0xd000_0002;

pub fn stack(d: &Arc<SimDriver>, minor: u32) -> Stack {
    let ctl = open(d, NodeKind::Ctl);
    let gpu = open(d, NodeKind::Gpu(minor));
    register(&gpu, &ctl).expect("REGISTER_FD");
    let client = client(&ctl);
    let device = device(&ctl, client, H_DEVICE, minor);
    let subdevice = subdevice(&ctl, client, device, H_SUBDEVICE);
    Stack {
        ctl,
        gpu,
        client,
        device,
        subdevice,
    }
}
