//! `/dev/nvidia-uvm` in the simulator: va_space lifecycle, GPU registration, ranges, the
//! policy commands, and the memfd that makes a client's mapping (at VA == offset) and the
//! simulated driver see the same bytes.

mod common;

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use common::*;
use host_driver::{HostCall, NodeKind};
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use nvsim::status::*;
use nvsim::{SimConfig, SimDriver};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes};

const NV_ERR_GPU_UUID_NOT_FOUND: u32 = 0x12;
const NV_ERR_INVALID_CHANNEL: u32 = 0x21;
const NV_ERR_INVALID_DEVICE: u32 = 0x26;
const NV_ERR_UVM_ADDRESS_IN_USE: u32 = 0x68;
const NV_WARN_NOTHING_TO_DO: u32 = 0x0001_0006;
const CPU_UUID: [u8; 16] = [
    0xa6, 0x5e, 0x0f, 0x4e, 0xd7, 0xd4, 0x7b, 0xa2, 0x50, 0x47, 0x41, 0x2c, 0x14, 0x2a, 0x77, 0x73,
];
const MPS: u64 = UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE;
const MB2: usize = 2 << 20;

/// Runs UVM command `cmd` with `p` as params; the syscall result and the params after.
fn uvm<T: IntoBytes + FromBytes + Immutable>(
    f: &File,
    cmd: u32,
    p: &T,
) -> (std::io::Result<i32>, T) {
    let mut call = HostCall {
        cmd,
        params: p.as_bytes().into(),
        nested: Default::default(),
    };
    let r = f.ioctl(&mut call);
    (r, T::read_from_bytes(&call.params).expect("same size"))
}

/// `rmStatus` of a command that must succeed at the syscall level.
fn status<T: IntoBytes + FromBytes + Immutable>(f: &File, cmd: u32, p: &T, at: usize) -> u32 {
    let (r, out) = uvm(f, cmd, p);
    assert_eq!(r.expect("UVM ioctl"), 0);
    u32::from_ne_bytes(out.as_bytes()[at..at + 4].try_into().unwrap())
}

fn init(f: &File, flags: u64) -> u32 {
    let mut p = UVM_INITIALIZE_PARAMS::new_zeroed();
    p.flags = flags;
    status(f, UVM_INITIALIZE, &p, 8)
}

fn uuid(d: &SimDriver, i: usize) -> NvProcessorUuid {
    NvProcessorUuid {
        uuid: d.config().gpus[i].uuid,
    }
}

fn register_gpu(f: &File, u: NvProcessorUuid) -> u32 {
    let mut p = UVM_REGISTER_GPU_PARAMS::new_zeroed();
    p.gpu_uuid = u;
    p.rmCtrlFd = -1;
    status(f, UVM_REGISTER_GPU, &p, 36)
}

fn register_va_space(f: &File, u: NvProcessorUuid, h_client: u32, h_va: u32) -> u32 {
    let mut p = UVM_REGISTER_GPU_VASPACE_PARAMS::new_zeroed();
    p.gpuUuid = u;
    p.rmCtrlFd = -1;
    p.hClient = h_client;
    p.hVaSpace = h_va;
    status(f, UVM_REGISTER_GPU_VASPACE, &p, 28)
}

fn range_cmd<T: IntoBytes + FromBytes + Immutable + FromZeros>(
    f: &File,
    cmd: u32,
    base: u64,
    length: u64,
) -> u32 {
    let mut b = T::new_zeroed().as_bytes().to_vec();
    b[..8].copy_from_slice(&base.to_ne_bytes());
    b[8..16].copy_from_slice(&length.to_ne_bytes());
    let p = T::read_from_bytes(&b).unwrap();
    status(f, cmd, &p, 16)
}

fn validate(f: &File, base: u64, length: u64) -> u32 {
    range_cmd::<UVM_VALIDATE_VA_RANGE_PARAMS>(f, UVM_VALIDATE_VA_RANGE, base, length)
}

/// A GPU stack (control file, GPU node open, client, device) plus an initialised UVM file.
struct Uvm {
    d: Arc<SimDriver>,
    s: Stack,
    uvm: File,
}

fn setup(version: &str, flags: u64) -> Uvm {
    let d = SimDriver::new(SimConfig::default_gpus(2).with_version(version.parse().unwrap()));
    let s = stack(&d, 0);
    let uvm = open(&d, NodeKind::Uvm);
    assert_eq!(init(&uvm, flags), NV_OK);
    Uvm { d, s, uvm }
}

/// A shared read-write mapping of the UVM memfd at VA == offset, made as CUDA makes managed
/// memory: reserve anonymous address space, then `MAP_FIXED` the file over it.
struct VaMapping {
    addr: u64,
    len: usize,
}

impl VaMapping {
    fn new(fd: &OwnedFd, len: usize) -> VaMapping {
        // SAFETY: a fresh reservation at an address of the kernel's choice; nothing refers
        // to it.
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
        VaMapping::fixed(fd, resv as u64, len, resv as libc::off_t)
    }

    /// Maps `fd` at `addr` (which this test owns) with file offset `offset`.
    fn fixed(fd: &OwnedFd, addr: u64, len: usize, offset: libc::off_t) -> VaMapping {
        // SAFETY: `addr..addr+len` is a reservation this test made and owns (MAP_FIXED
        // replaces only it); the fd is live for the call.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                offset,
            )
        };
        assert_eq!(p as u64, addr, "{}", std::io::Error::last_os_error());
        VaMapping { addr, len }
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

    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: inside the live, writable shared mapping (checked).
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.addr as *mut u8).add(off),
                data.len(),
            )
        };
    }
}

impl Drop for VaMapping {
    fn drop(&mut self) {
        // SAFETY: exactly the range this value mapped, unmapped once.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

#[test]
fn test_initialize_flags_and_second_initialize() {
    let d = sim(1);
    let f = open(&d, NodeKind::Uvm);
    // Before INITIALIZE every other command is NV_ERR_ILLEGAL_ACTION.
    let p = UVM_PAGEABLE_MEM_ACCESS_PARAMS::new_zeroed();
    assert_eq!(
        status(&f, UVM_PAGEABLE_MEM_ACCESS, &p, 4),
        NV_ERR_ILLEGAL_ACTION
    );
    assert_eq!(
        init(&f, 0x4),
        NV_ERR_INVALID_ARGUMENT,
        "flags outside the mask"
    );
    assert_eq!(d.stats().uvm_va_spaces, 0);
    assert_eq!(init(&f, MPS), NV_OK);
    assert_eq!(init(&f, MPS), NV_OK, "same flags again");
    assert_eq!(init(&f, 0), NV_ERR_INVALID_ARGUMENT, "other flags");
    assert_eq!(d.stats().uvm_va_spaces, 1);
    drop(f);
    assert_eq!(d.stats().uvm_va_spaces, 0);
    assert_eq!(d.stats().open_files, 0);
}

#[test]
fn test_unknown_command_size_and_deinitialize() {
    let d = sim(1);
    let f = open(&d, NodeKind::Uvm);
    let mut call = HostCall {
        cmd: 0x47, // UVM_POPULATE_PAGEABLE: not in the table
        params: vec![0; 32].into(),
        nested: Default::default(),
    };
    assert_eq!(errno(f.ioctl(&mut call)), Some(EINVAL));
    let mut call = HostCall {
        cmd: UVM_INITIALIZE,
        params: vec![0; 12].into(),
        nested: Default::default(),
    };
    assert_eq!(errno(f.ioctl(&mut call)), Some(EFAULT));
    let mut call = HostCall {
        cmd: UVM_DEINITIALIZE,
        params: vec![].into(),
        nested: Default::default(),
    };
    assert_eq!(f.ioctl(&mut call).unwrap(), 0);
}

#[test]
fn test_pageable_mem_access_is_off_in_multi_process_sharing_mode() {
    for (flags, want) in [(MPS, 0), (0, 1), (UVM_INIT_FLAGS_DISABLE_HMM, 0)] {
        let u = setup("535.261.03", flags);
        let (r, p) = uvm(
            &u.uvm,
            UVM_PAGEABLE_MEM_ACCESS,
            &UVM_PAGEABLE_MEM_ACCESS_PARAMS::new_zeroed(),
        );
        assert_eq!(
            (r.unwrap(), p.rmStatus, p.pageableMemAccess),
            (0, NV_OK, want),
            "{flags:#x}"
        );
    }
}

#[test]
fn test_mm_initialize_multi_process_mode_and_mm_files() {
    let u = setup("535.261.03", MPS);
    let mm = open(&u.d, NodeKind::Uvm);
    let p = UVM_MM_INITIALIZE_PARAMS {
        uvmFd: u.uvm.id(),
        rmStatus: 0,
    };
    assert_eq!(status(&mm, UVM_MM_INITIALIZE, &p, 4), NV_WARN_NOTHING_TO_DO);
    let not_uvm = UVM_MM_INITIALIZE_PARAMS {
        uvmFd: u.s.ctl.id(),
        rmStatus: 0,
    };
    assert_eq!(
        status(&mm, UVM_MM_INITIALIZE, &not_uvm, 4),
        NV_ERR_INVALID_ARGUMENT
    );
    let uninit = UVM_MM_INITIALIZE_PARAMS {
        uvmFd: mm.id(),
        rmStatus: 0,
    };
    assert_eq!(
        status(&mm, UVM_MM_INITIALIZE, &uninit, 4),
        NV_ERR_INVALID_ARGUMENT
    );

    // Without multi-process sharing mode the mm file takes the va_space's mm and holds the
    // va_space file open.
    let v = open(&u.d, NodeKind::Uvm);
    assert_eq!(init(&v, 0), NV_OK);
    let p = UVM_MM_INITIALIZE_PARAMS {
        uvmFd: v.id(),
        rmStatus: 0,
    };
    let mm2 = open(&u.d, NodeKind::Uvm);
    assert_eq!(status(&mm2, UVM_MM_INITIALIZE, &p, 4), NV_OK);
    assert_eq!(status(&mm2, UVM_MM_INITIALIZE, &p, 4), NV_ERR_IN_USE);
    let mm3 = open(&u.d, NodeKind::Uvm);
    assert_eq!(status(&mm3, UVM_MM_INITIALIZE, &p, 4), NV_ERR_INVALID_STATE);
    assert_eq!(
        init(&mm2, 0),
        NV_ERR_INVALID_ARGUMENT,
        "an mm file is no va_space"
    );
    let before = u.d.stats().uvm_va_spaces;
    drop(v);
    assert_eq!(
        u.d.stats().uvm_va_spaces,
        before,
        "the mm file holds the va_space"
    );
    drop(mm2);
    assert_eq!(u.d.stats().uvm_va_spaces, before - 1);
}

#[test]
fn test_register_gpu_statuses() {
    let u = setup("535.261.03", MPS);
    let mut foreign = uuid(&u.d, 0);
    foreign.uuid[0] ^= 0xff;
    assert_eq!(register_gpu(&u.uvm, foreign), NV_ERR_GPU_UUID_NOT_FOUND);
    // GPU 1's node is not open in this process: osIsGpuAccessible fails.
    assert_eq!(
        register_gpu(&u.uvm, uuid(&u.d, 1)),
        NV_ERR_INSUFFICIENT_PERMISSIONS
    );
    let mut p = UVM_REGISTER_GPU_PARAMS::new_zeroed();
    p.gpu_uuid = uuid(&u.d, 0);
    let (r, out) = uvm(&u.uvm, UVM_REGISTER_GPU, &p);
    assert_eq!(
        (
            r.unwrap(),
            out.rmStatus,
            out.numaEnabled,
            out.numaNodeId as i32
        ),
        (0, NV_OK, 0, -1)
    );
    assert_eq!(
        register_gpu(&u.uvm, uuid(&u.d, 0)),
        NV_ERR_INVALID_DEVICE,
        "twice"
    );
    assert_eq!(u.d.stats().uvm_registered_gpus, 1);
    let mut un = UVM_UNREGISTER_GPU_PARAMS::new_zeroed();
    un.gpu_uuid = uuid(&u.d, 0);
    assert_eq!(status(&u.uvm, UVM_UNREGISTER_GPU, &un, 16), NV_OK);
    assert_eq!(
        status(&u.uvm, UVM_UNREGISTER_GPU, &un, 16),
        NV_ERR_INVALID_DEVICE
    );
    assert_eq!(u.d.stats().uvm_registered_gpus, 0);
}

#[test]
fn test_gpu_va_space_channel_and_peers() {
    let u = setup("535.261.03", MPS);
    let gpu1 = open(&u.d, NodeKind::Gpu(1));
    let g0 = uuid(&u.d, 0);
    let g1 = uuid(&u.d, 1);
    let (st, h_va) = alloc(
        &u.s.ctl,
        u.s.client,
        u.s.device,
        0,
        0x90f1,
        Some(&[0u8; 48]),
    );
    assert_eq!(st, NV_OK);
    assert_eq!(
        register_va_space(&u.uvm, g0, u.s.client, h_va),
        NV_ERR_INVALID_DEVICE,
        "GPU not registered"
    );
    assert_eq!(register_gpu(&u.uvm, g0), NV_OK);
    assert_eq!(
        register_va_space(&u.uvm, g0, 0xbad, h_va),
        NV_ERR_INVALID_CLIENT
    );
    assert_eq!(
        register_va_space(&u.uvm, g0, u.s.client, 0xbad),
        NV_ERR_OBJECT_NOT_FOUND
    );
    assert_eq!(
        register_va_space(&u.uvm, g0, u.s.client, u.s.device),
        NV_ERR_INVALID_ARGUMENT
    );
    assert_eq!(register_va_space(&u.uvm, g0, u.s.client, h_va), NV_OK);
    assert_eq!(
        register_va_space(&u.uvm, g0, u.s.client, h_va),
        NV_ERR_INVALID_DEVICE
    );

    // A handle that is no channel (nvGpuOpsVerifyChannel); real channels: tests/channels.rs.
    let mut ch = UVM_REGISTER_CHANNEL_PARAMS::new_zeroed();
    ch.gpuUuid = g0;
    ch.hClient = u.s.client;
    ch.hChannel = 0x1234;
    assert_eq!(
        status(&u.uvm, UVM_REGISTER_CHANNEL, &ch, 48),
        NV_ERR_INVALID_OBJECT_HANDLE
    );
    let mut un = UVM_UNREGISTER_CHANNEL_PARAMS::new_zeroed();
    un.hClient = u.s.client;
    un.hChannel = 0x1234;
    assert_eq!(
        status(&u.uvm, UVM_UNREGISTER_CHANNEL, &un, 24),
        NV_ERR_INVALID_CHANNEL
    );

    let peers = |cmd| {
        let p = UVM_ENABLE_PEER_ACCESS_PARAMS {
            gpuUuidA: g0,
            gpuUuidB: g1,
            rmStatus: 0,
        };
        status(&u.uvm, cmd, &p, 32)
    };
    assert_eq!(
        peers(UVM_ENABLE_PEER_ACCESS),
        NV_ERR_INVALID_DEVICE,
        "GPU 1 not registered"
    );
    assert_eq!(register_gpu(&u.uvm, g1), NV_OK);
    assert_eq!(peers(UVM_ENABLE_PEER_ACCESS), NV_OK);
    assert_eq!(peers(UVM_ENABLE_PEER_ACCESS), NV_ERR_INVALID_DEVICE);
    assert_eq!(peers(UVM_DISABLE_PEER_ACCESS), NV_OK);
    assert_eq!(peers(UVM_DISABLE_PEER_ACCESS), NV_ERR_INVALID_DEVICE);

    let mut un = UVM_UNREGISTER_GPU_VASPACE_PARAMS::new_zeroed();
    un.gpuUuid = g0;
    assert_eq!(status(&u.uvm, UVM_UNREGISTER_GPU_VASPACE, &un, 16), NV_OK);
    assert_eq!(
        status(&u.uvm, UVM_UNREGISTER_GPU_VASPACE, &un, 16),
        NV_ERR_INVALID_DEVICE
    );
    drop(gpu1);
}

#[test]
fn test_range_groups() {
    let u = setup("535.261.03", MPS);
    let (_, a) = uvm(
        &u.uvm,
        UVM_CREATE_RANGE_GROUP,
        &UVM_CREATE_RANGE_GROUP_PARAMS::new_zeroed(),
    );
    let (_, b) = uvm(
        &u.uvm,
        UVM_CREATE_RANGE_GROUP,
        &UVM_CREATE_RANGE_GROUP_PARAMS::new_zeroed(),
    );
    assert_eq!((a.rmStatus, a.rangeGroupId, b.rangeGroupId), (NV_OK, 1, 2));
    let mut d = UVM_DESTROY_RANGE_GROUP_PARAMS::new_zeroed();
    d.rangeGroupId = 1;
    assert_eq!(status(&u.uvm, UVM_DESTROY_RANGE_GROUP, &d, 8), NV_OK);
    assert_eq!(
        status(&u.uvm, UVM_DESTROY_RANGE_GROUP, &d, 8),
        NV_ERR_OBJECT_NOT_FOUND
    );
    // uvm_api_set_range_group: an empty range, an unknown group, a range that is not
    // managed memory, then group 2 and group 0 (none) over a managed mapping.
    let set = |id: u64, base: u64, length: u64| {
        let mut s = UVM_SET_RANGE_GROUP_PARAMS::new_zeroed();
        (s.rangeGroupId, s.requestedBase, s.length) = (id, base, length);
        status(&u.uvm, UVM_SET_RANGE_GROUP, &s, 24)
    };
    assert_eq!(set(0, 0, 0), NV_ERR_INVALID_ADDRESS);
    let (fd, _) = u.uvm.mmap_fd().unwrap();
    let m = VaMapping::new(&fd, MB2);
    let len = MB2 as u64;
    assert_eq!(
        set(2, m.addr + 1, 4096),
        NV_ERR_INVALID_ADDRESS,
        "unaligned"
    );
    assert_eq!(set(1, m.addr, len), NV_ERR_OBJECT_NOT_FOUND, "destroyed");
    assert_eq!(
        set(2, m.addr, 2 * len),
        NV_ERR_INVALID_ADDRESS,
        "past the range"
    );
    assert_eq!(set(2, m.addr, len), NV_OK);
    assert_eq!(set(0, m.addr, 4096), NV_OK);
}

/// External range, map, unmap and free on a version's layouts.
fn external_cycle(version: &str) {
    let u = setup(version, MPS);
    let g0 = uuid(&u.d, 0);
    let h_va = u.gpu_va_space();
    assert_eq!(register_gpu(&u.uvm, g0), NV_OK);
    assert_eq!(register_va_space(&u.uvm, g0, u.s.client, h_va), NV_OK);
    let layout = u.abi().classes[&0x3e].param_size as usize;
    let (st, h_mem) = alloc(
        &u.s.ctl,
        u.s.client,
        u.s.device,
        0xd000_0100,
        0x3e,
        Some(&mem_params(MB2 as u64, layout)),
    );
    assert_eq!(st, NV_OK);
    let base = 0x7f00_0000_0000u64;
    let ext = |b, l| {
        range_cmd::<UVM_CREATE_EXTERNAL_RANGE_PARAMS>(&u.uvm, UVM_CREATE_EXTERNAL_RANGE, b, l)
    };
    assert_eq!(ext(base + 1, MB2 as u64), NV_ERR_INVALID_ADDRESS);
    assert_eq!(ext(base, MB2 as u64), NV_OK);
    assert_eq!(ext(base + 4096, 4096), NV_ERR_UVM_ADDRESS_IN_USE);
    assert_eq!(u.d.stats().uvm_ranges, 1);
    assert_eq!(validate(&u.uvm, base, MB2 as u64), NV_OK);

    // MAP_EXTERNAL_ALLOCATION in the version's layout (32 or 256 GPUs).
    let spec = u.d_abi_size(UVM_MAP_EXTERNAL_ALLOCATION);
    let mut b = vec![0u8; spec];
    b[0..8].copy_from_slice(&base.to_ne_bytes());
    b[8..16].copy_from_slice(&(MB2 as u64).to_ne_bytes());
    b[24..40].copy_from_slice(&g0.uuid);
    let tail = spec - 24; // gpuAttributesCount, rmCtrlFd, hClient, hMemory, rmStatus
    b[tail..tail + 8].copy_from_slice(&1u64.to_ne_bytes());
    b[tail + 8..tail + 12].copy_from_slice(&(-1i32).to_ne_bytes());
    b[tail + 12..tail + 16].copy_from_slice(&u.s.client.to_ne_bytes());
    b[tail + 16..tail + 20].copy_from_slice(&h_mem.to_ne_bytes());
    let mut call = HostCall {
        cmd: UVM_MAP_EXTERNAL_ALLOCATION,
        params: b.clone().into(),
        nested: Default::default(),
    };
    u.uvm.ioctl(&mut call).unwrap();
    assert_eq!(
        u32::from_ne_bytes(call.params[spec - 4..].try_into().unwrap()),
        NV_OK
    );
    b[tail + 16..tail + 20].copy_from_slice(&0xbadu32.to_ne_bytes());
    let mut call = HostCall {
        cmd: UVM_MAP_EXTERNAL_ALLOCATION,
        params: b.into(),
        nested: Default::default(),
    };
    u.uvm.ioctl(&mut call).unwrap();
    assert_eq!(
        u32::from_ne_bytes(call.params[spec - 4..].try_into().unwrap()),
        NV_ERR_OBJECT_NOT_FOUND
    );

    let mut un = UVM_UNMAP_EXTERNAL_PARAMS::new_zeroed();
    un.base = base;
    un.length = MB2 as u64;
    un.gpuUuid = g0;
    assert_eq!(status(&u.uvm, UVM_UNMAP_EXTERNAL, &un, 32), NV_OK);
    assert_eq!(
        status(&u.uvm, UVM_UNMAP_EXTERNAL, &un, 32),
        NV_ERR_INVALID_ADDRESS
    );

    // UVM_FREE: 24 bytes with a length before 590, 16 since.
    if spec == 9264 && u.d_abi_size(UVM_FREE) == 16 {
        let mut f = UVM_FREE_PARAMS_V590::new_zeroed();
        f.base = base + 4096;
        assert_eq!(status(&u.uvm, UVM_FREE, &f, 8), NV_ERR_INVALID_ADDRESS);
        f.base = base;
        assert_eq!(status(&u.uvm, UVM_FREE, &f, 8), NV_OK);
    } else {
        let mut f = UVM_FREE_PARAMS::new_zeroed();
        f.base = base;
        f.length = 4096;
        assert_eq!(
            status(&u.uvm, UVM_FREE, &f, 16),
            NV_ERR_INVALID_ADDRESS,
            "partial free"
        );
        f.length = MB2 as u64;
        assert_eq!(status(&u.uvm, UVM_FREE, &f, 16), NV_OK);
    }
    assert_eq!(u.d.stats().uvm_ranges, 0);
}

impl Uvm {
    fn abi(&self) -> nvproxy_abi::DriverAbi {
        nvproxy_abi::find(&self.d.driver_version())
            .unwrap()
            .tables()
    }

    fn d_abi_size(&self, cmd: u32) -> usize {
        self.abi().uvm[&cmd].param_size as usize
    }

    /// A `FERMI_VASPACE_A` of GPU 0 in the stack's client.
    fn gpu_va_space(&self) -> u32 {
        let size = self.abi().classes[&0x90f1].param_size as usize;
        let params = vec![0u8; size];
        let (st, h) = alloc(
            &self.s.ctl,
            self.s.client,
            self.s.device,
            0,
            0x90f1,
            Some(&params),
        );
        assert_eq!(st, NV_OK, "VA space alloc");
        h
    }
}

#[test]
fn test_external_ranges_535() {
    external_cycle("535.261.03");
}

#[test]
fn test_external_ranges_550() {
    external_cycle("550.163.01");
}

#[test]
fn test_external_ranges_590() {
    external_cycle("590.48.01");
}

#[test]
fn test_memfd_coherence_at_va_equals_offset() {
    let u = setup("535.261.03", MPS);
    let (fd, adjust) = u.uvm.mmap_fd().unwrap();
    assert_eq!(adjust, 0, "UVM maps at offset == VA");
    let m = VaMapping::new(&fd, MB2);
    // The client writes, the driver reads.
    m.write(0x1000, b"written by the client");
    assert_eq!(
        u.d.uvm_read(u.uvm.id(), m.addr + 0x1000, 21).unwrap(),
        b"written by the client"
    );
    // The driver writes, the client reads.
    u.d.uvm_write(u.uvm.id(), m.addr + MB2 as u64 - 8, b"by drv!!")
        .unwrap();
    assert_eq!(m.read(MB2 - 8, 8), b"by drv!!");
    // The mapping is a managed range: VALIDATE_VA_RANGE sees exactly it.
    assert!(
        u.d.uvm_managed_ranges(u.uvm.id())
            .unwrap()
            .contains(&(m.addr, m.addr + MB2 as u64))
    );
    assert_eq!(validate(&u.uvm, m.addr, MB2 as u64), NV_OK);
    assert_eq!(
        validate(&u.uvm, m.addr, 4096),
        NV_ERR_INVALID_ADDRESS,
        "not a whole range"
    );
    // Ranges created by ioctls cannot overlap it.
    let ext = range_cmd::<UVM_CREATE_EXTERNAL_RANGE_PARAMS>(
        &u.uvm,
        UVM_CREATE_EXTERNAL_RANGE,
        m.addr,
        4096,
    );
    assert_eq!(ext, NV_ERR_UVM_ADDRESS_IN_USE);
    let addr = m.addr;
    drop(m);
    assert_eq!(
        validate(&u.uvm, addr, MB2 as u64),
        NV_ERR_INVALID_ADDRESS,
        "munmap ends the range"
    );
}

#[test]
fn test_mapping_at_another_offset_is_no_range() {
    let u = setup("535.261.03", MPS);
    let (fd, _) = u.uvm.mmap_fd().unwrap();
    let m = VaMapping::new(&fd, MB2);
    let addr = m.addr;
    std::mem::forget(m);
    // Remap the same addresses at offset 0 (offset != VA): uvm_mmap would refuse it.
    let m = VaMapping::fixed(&fd, addr, MB2, 0);
    assert_eq!(validate(&u.uvm, addr, MB2 as u64), NV_ERR_INVALID_ADDRESS);
    drop(m);
}

#[test]
fn test_mmap_fd_needs_a_va_space() {
    let d = sim(1);
    let f = open(&d, NodeKind::Uvm);
    assert_eq!(f.mmap_fd().err().and_then(|e| e.raw_os_error()), Some(77)); // EBADFD
    assert_eq!(init(&f, MPS), NV_OK);
    assert!(f.mmap_fd().is_ok());
}

#[test]
fn test_semaphore_pool_and_migrate_release() {
    let u = setup("550.163.01", MPS);
    let g0 = uuid(&u.d, 0);
    assert_eq!(register_gpu(&u.uvm, g0), NV_OK);
    let (fd, _) = u.uvm.mmap_fd().unwrap();
    let managed = VaMapping::new(&fd, MB2);
    // Reserve address space for the pool and keep it out of every other mapping.
    let pool = VaMapping::new(&fd, 1 << 16);
    let pool_addr = pool.addr;
    drop(pool);
    let mut p = UVM_ALLOC_SEMAPHORE_POOL_PARAMS_V550::new_zeroed();
    p.base = pool_addr;
    p.length = 1 << 16;
    p.gpuAttributesCount = 1;
    p.perGpuAttributes[0].gpuUuid = g0;
    assert_eq!(status(&u.uvm, UVM_ALLOC_SEMAPHORE_POOL, &p, 9240), NV_OK);
    p.perGpuAttributes[0].gpuUuid.uuid[0] ^= 1;
    p.base += 1 << 20;
    assert_eq!(
        status(&u.uvm, UVM_ALLOC_SEMAPHORE_POOL, &p, 9240),
        NV_ERR_INVALID_DEVICE
    );

    // An asynchronous migration of the managed range to the CPU releases the semaphore.
    let mut m = UVM_MIGRATE_PARAMS::new_zeroed();
    m.base = managed.addr;
    m.length = MB2 as u64;
    m.destinationUuid.uuid = CPU_UUID;
    m.flags = 1; // ASYNC
    m.semaphoreAddress = pool_addr + 8;
    m.semaphorePayload = 0x5eed;
    assert_eq!(status(&u.uvm, UVM_MIGRATE, &m, 72), NV_OK);
    assert_eq!(
        u.d.uvm_read(u.uvm.id(), pool_addr + 8, 4).unwrap(),
        0x5eedu32.to_ne_bytes()
    );
    m.flags = 0;
    assert_eq!(
        status(&u.uvm, UVM_MIGRATE, &m, 72),
        NV_ERR_INVALID_ARGUMENT,
        "sync with a semaphore"
    );
    m.semaphoreAddress = 0;
    m.semaphorePayload = 0;
    m.destinationUuid = g0;
    assert_eq!(
        status(&u.uvm, UVM_MIGRATE, &m, 72),
        NV_ERR_INVALID_DEVICE,
        "no GPU VA space"
    );

    // A pool mapped by the client cannot be freed.
    let pool_map = VaMapping::fixed(&fd, pool_addr, 1 << 16, pool_addr as libc::off_t);
    let mut f = UVM_FREE_PARAMS::new_zeroed();
    f.base = pool_addr;
    f.length = 1 << 16;
    assert_eq!(status(&u.uvm, UVM_FREE, &f, 16), NV_ERR_INVALID_ARGUMENT);
    drop(pool_map);
    assert_eq!(status(&u.uvm, UVM_FREE, &f, 16), NV_OK);
    drop(managed);
}

#[test]
fn test_preferred_location_layouts_and_processors() {
    for (version, status_at) in [("535.261.03", 32), ("550.163.01", 36), ("595.45.04", 36)] {
        let u = setup(version, MPS);
        let g0 = uuid(&u.d, 0);
        let (fd, _) = u.uvm.mmap_fd().unwrap();
        let m = VaMapping::new(&fd, MB2);
        let set = |loc: [u8; 16], base: u64| {
            let mut b = [0u8; 40];
            b[0..8].copy_from_slice(&base.to_ne_bytes());
            b[8..16].copy_from_slice(&(MB2 as u64).to_ne_bytes());
            b[16..32].copy_from_slice(&loc);
            if status_at == 36 {
                b[32..36].copy_from_slice(&(-1i32).to_ne_bytes());
            }
            let mut call = HostCall {
                cmd: UVM_SET_PREFERRED_LOCATION,
                params: b.to_vec().into(),
                nested: Default::default(),
            };
            u.uvm.ioctl(&mut call).unwrap();
            u32::from_ne_bytes(call.params[status_at..status_at + 4].try_into().unwrap())
        };
        assert_eq!(set(CPU_UUID, m.addr), NV_OK, "{version}");
        assert_eq!(
            set(g0.uuid, m.addr),
            NV_ERR_INVALID_DEVICE,
            "{version}: not registered"
        );
        assert_eq!(register_gpu(&u.uvm, g0), NV_OK);
        assert_eq!(set(g0.uuid, m.addr), NV_OK, "{version}");
        assert_eq!(
            set(g0.uuid, m.addr + (4 << 20)),
            NV_ERR_INVALID_ADDRESS,
            "{version}"
        );
        let mut a = UVM_SET_ACCESSED_BY_PARAMS::new_zeroed();
        a.requestedBase = m.addr;
        a.length = MB2 as u64;
        a.accessedByUuid = g0;
        assert_eq!(status(&u.uvm, UVM_SET_ACCESSED_BY, &a, 32), NV_OK);
        a.accessedByUuid.uuid[3] ^= 1;
        assert_eq!(
            status(&u.uvm, UVM_UNSET_ACCESSED_BY, &a, 32),
            NV_ERR_INVALID_DEVICE
        );
        let rd = range_cmd::<UVM_ENABLE_READ_DUPLICATION_PARAMS>(
            &u.uvm,
            UVM_ENABLE_READ_DUPLICATION,
            m.addr,
            MB2 as u64,
        );
        assert_eq!(rd, NV_OK);
    }
}

#[test]
fn test_release_leaves_nothing() {
    let u = setup("535.261.03", MPS);
    assert_eq!(register_gpu(&u.uvm, uuid(&u.d, 0)), NV_OK);
    let base = 0x7e00_0000_0000u64;
    assert_eq!(
        range_cmd::<UVM_CREATE_EXTERNAL_RANGE_PARAMS>(
            &u.uvm,
            UVM_CREATE_EXTERNAL_RANGE,
            base,
            1 << 20
        ),
        NV_OK
    );
    let s = u.d.stats();
    assert_eq!(
        (s.uvm_va_spaces, s.uvm_registered_gpus, s.uvm_ranges),
        (1, 1, 1)
    );
    let Uvm { d, s, uvm } = u;
    drop(uvm);
    drop(s);
    let s = d.stats();
    assert_eq!(
        (
            s.uvm_va_spaces,
            s.uvm_registered_gpus,
            s.uvm_ranges,
            s.open_files
        ),
        (0, 0, 0, 0)
    );
}

#[test]
fn test_random_params_for_every_command_never_panic_and_leave_nothing() {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for version in ["535.261.03", "590.48.01"] {
        let d = SimDriver::new(SimConfig::default_gpus(2).with_version(version.parse().unwrap()));
        {
            let s = stack(&d, 0);
            let f = open(&d, NodeKind::Uvm);
            let abi = nvproxy_abi::find(&d.driver_version()).unwrap().tables();
            for round in 0..40 {
                for e in abi.uvm.values() {
                    let mut params: Vec<u8> =
                        (0..e.param_size).map(|_| next().to_le_bytes()[0]).collect();
                    if e.cmd == UVM_INITIALIZE && round % 2 == 0 {
                        params[..8].copy_from_slice(&MPS.to_ne_bytes());
                    }
                    // Sometimes a real GPU UUID or CPU UUID where UUIDs usually sit.
                    if params.len() >= 32 && next() % 3 == 0 {
                        let u = if next() % 2 == 0 {
                            d.config().gpus[0].uuid
                        } else {
                            CPU_UUID
                        };
                        let at = if next() % 2 == 0 { 0 } else { 16 };
                        params[at..at + 16].copy_from_slice(&u);
                    }
                    let mut call = HostCall {
                        cmd: e.cmd,
                        params: params.into(),
                        nested: Default::default(),
                    };
                    let _ = f.ioctl(&mut call);
                }
            }
            drop(s);
        }
        let st = d.stats();
        assert_eq!(
            (
                st.uvm_va_spaces,
                st.uvm_registered_gpus,
                st.uvm_ranges,
                st.open_files
            ),
            (0, 0, 0, 0),
            "{version}"
        );
    }
}

/// Fuzz finding F1 (`fuzz/regressions/README.md`): a huge semaphore pool must not make the
/// simulator write its zeros into the va_space memfd (every page written is host memory), and a
/// pool past the end of the address space is the driver's NV_ERR_INVALID_ADDRESS.
#[test]
fn test_a_huge_semaphore_pool_costs_no_memory_and_one_past_the_va_is_refused() {
    use std::os::unix::fs::MetadataExt;
    let u = setup("550.163.01", MPS);
    let g0 = uuid(&u.d, 0);
    assert_eq!(register_gpu(&u.uvm, g0), NV_OK);
    let (fd, _) = u.uvm.mmap_fd().unwrap();
    let file = std::fs::File::from(fd);
    let blocks_before = file.metadata().unwrap().blocks();
    let mut p = UVM_ALLOC_SEMAPHORE_POOL_PARAMS_V550::new_zeroed();
    p.base = 1 << 40;
    p.length = 64 << 30; // 64 GiB
    p.gpuAttributesCount = 1;
    p.perGpuAttributes[0].gpuUuid = g0;
    let t = std::time::Instant::now();
    assert_eq!(status(&u.uvm, UVM_ALLOC_SEMAPHORE_POOL, &p, 9240), NV_OK);
    assert!(t.elapsed().as_secs() < 5, "{:?}", t.elapsed());
    let grown = file.metadata().unwrap().blocks() - blocks_before;
    assert!(
        grown < 1024,
        "the pool took {grown} 512-byte blocks of memory"
    );
    p.base = 1 << 46;
    p.length = (1 << 46) + (2 << 20); // ends 2 MiB past 2^47
    assert_eq!(
        status(&u.uvm, UVM_ALLOC_SEMAPHORE_POOL, &p, 9240),
        NV_ERR_INVALID_ADDRESS
    );
}
