//! RM memory as the CPU sees it: memfd-backed objects, `RM_MAP_MEMORY` / `RM_UNMAP_MEMORY`,
//! mmap contexts, `RM_ALLOC_MEMORY` for system memory, mapping files, and what the tenant's
//! `mmap` of `HostFile::mmap_fd` shares with the simulated driver.

mod common;

use std::os::fd::{AsRawFd, OwnedFd};

use common::*;
use host_driver::{HostDriver, NodeKind};
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use nvsim::SimStats;
use nvsim::status::*;
use zerocopy::FromZeros;

const H_SYSMEM: u32 = 0xd000_0010;
const H_VIDMEM: u32 = 0xd000_0011;
const PAGE: usize = 4096;

/// A shared read-write mapping of an fd in this process.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(fd: &OwnedFd, len: usize, offset: u64) -> Mapping {
        // SAFETY: a fresh mapping chosen by the kernel (no address given), of a live fd
        // borrowed for the call; nothing else in this process refers to that range.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        Mapping { ptr: p.cast(), len }
    }

    fn read(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.len);
        let mut out = vec![0; n];
        // SAFETY: `off + n <= len` (checked), so the source lies inside the live mapping;
        // `out` is a distinct buffer of `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), n) };
        out
    }

    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: as in `read`; the mapping is writable (PROT_WRITE, MAP_SHARED).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// `NV01_MEMORY_SYSTEM` (or `_LOCAL_USER` with `video`) of `bytes` under the stack's device.
fn memory(s: &Stack, h: u32, bytes: u64, video: bool) {
    let class = if video { 0x40 } else { 0x3e };
    let (st, got) = alloc(
        &s.ctl,
        s.client,
        s.device,
        h,
        class,
        Some(&mem_params(bytes, 120)),
    );
    assert_eq!((st, got), (NV_OK, h), "memory alloc");
}

/// `NV_ESC_RM_MAP_MEMORY` on the stack's control file; returns the params after.
fn map(s: &Stack, h_memory: u32, offset: u64, length: u64, fd: i32) -> NVOS33_PARAMETERS {
    map_with(s, s.device, h_memory, offset, length, 0, fd)
}

fn map_with(
    s: &Stack,
    h_device: u32,
    h_memory: u32,
    offset: u64,
    length: u64,
    flags: u32,
    fd: i32,
) -> NVOS33_PARAMETERS {
    let mut p = nv_ioctl_nvos33_parameters_with_fd::new_zeroed();
    p.params.hClient = s.client;
    p.params.hDevice = h_device;
    p.params.hMemory = h_memory;
    p.params.offset = offset;
    p.params.length = length;
    p.params.flags = flags;
    p.fd = fd;
    let (r, out) = esc(&s.ctl, NV_ESC_RM_MAP_MEMORY, &p);
    assert_eq!(r.unwrap(), 0);
    out.params
}

fn unmap(s: &Stack, h_memory: u32, address: u64) -> u32 {
    let mut p = NVOS34_PARAMETERS::new_zeroed();
    p.hClient = s.client;
    p.hDevice = s.device;
    p.hMemory = h_memory;
    p.pLinearAddress = address;
    let (r, out) = esc(&s.ctl, NV_ESC_RM_UNMAP_MEMORY, &p);
    assert_eq!(r.unwrap(), 0);
    out.status
}

// ---- coherence through a real mmap ---------------------------------------------------------

#[test]
fn test_bytes_written_through_a_sysmem_mapping_are_seen_by_the_driver_and_back() {
    let d = sim(1);
    let s = stack(&d, 0);
    memory(&s, H_SYSMEM, 2 * PAGE as u64, false);
    let target = d.open_mapping(NodeKind::Ctl).unwrap();
    let out = map(&s, H_SYSMEM, 0, 2 * PAGE as u64, target.id());
    assert_eq!(out.status, NV_OK);
    assert_ne!(out.pLinearAddress, 0);
    let (fd, adjust) = target.mmap_fd().unwrap();
    assert_eq!(adjust, 0);
    let m = Mapping::new(&fd, 2 * PAGE, adjust);
    m.write(100, b"tenant");
    assert_eq!(
        d.memory_read(s.client, H_SYSMEM, 100, 6).unwrap(),
        b"tenant"
    );
    d.memory_write(s.client, H_SYSMEM, PAGE as u64 + 8, b"driver")
        .unwrap();
    assert_eq!(m.read(PAGE + 8, 6), b"driver");
}

#[test]
fn test_vidmem_mapping_at_an_offset_maps_from_its_page() {
    let d = sim(1);
    let s = stack(&d, 0);
    memory(&s, H_VIDMEM, 4 * PAGE as u64, true);
    let target = d.open_mapping(NodeKind::Gpu(0)).unwrap();
    let out = map(&s, H_VIDMEM, 2 * PAGE as u64 + 16, 64, target.id());
    assert_eq!(out.status, NV_OK);
    let (fd, adjust) = target.mmap_fd().unwrap();
    assert_eq!(adjust, 2 * PAGE as u64); // the page holding the mapped offset
    let m = Mapping::new(&fd, PAGE, adjust);
    d.memory_write(s.client, H_VIDMEM, 2 * PAGE as u64 + 16, b"fb")
        .unwrap();
    assert_eq!(m.read(16, 2), b"fb");
    m.write(32, b"cpu");
    assert_eq!(
        d.memory_read(s.client, H_VIDMEM, 2 * PAGE as u64 + 32, 3)
            .unwrap(),
        b"cpu"
    );
}

#[test]
fn test_a_dup_shares_the_memory_of_its_source() {
    let d = sim(1);
    let s = stack(&d, 0);
    memory(&s, H_SYSMEM, PAGE as u64, false);
    let mut p = NVOS55_PARAMETERS::new_zeroed();
    p.hClient = s.client;
    p.hParent = s.device;
    p.hObject = 0xd000_0020;
    p.hClientSrc = s.client;
    p.hObjectSrc = H_SYSMEM;
    let (r, out) = esc(&s.ctl, NV_ESC_RM_DUP_OBJECT, &p);
    assert_eq!((r.unwrap(), out.status), (0, NV_OK));
    d.memory_write(s.client, 0xd000_0020, 0, b"dup").unwrap();
    assert_eq!(d.memory_read(s.client, H_SYSMEM, 0, 3).unwrap(), b"dup");
}

#[test]
fn test_never_written_memory_reads_as_zeros_without_a_memfd() {
    let d = sim(1);
    let s = stack(&d, 0);
    memory(&s, H_SYSMEM, PAGE as u64, false);
    assert_eq!(
        d.memory_read(s.client, H_SYSMEM, 0, 16).unwrap(),
        vec![0; 16]
    );
    assert_eq!(d.stats().memfds, 0);
}

// ---- RM_MAP_MEMORY statuses ------------------------------------------------------------------

#[test]
fn test_map_memory_range_statuses_follow_mem_map() {
    let d = sim(1);
    let s = stack(&d, 0);
    memory(&s, H_SYSMEM, PAGE as u64, false);
    let t = d.open_mapping(NodeKind::Ctl).unwrap();
    let page = PAGE as u64;
    let cases = [
        (page, 1, NV_ERR_INVALID_BASE),
        (0, 0, NV_ERR_INVALID_LIMIT),
        (16, page, NV_ERR_INVALID_LIMIT),
        (16, u64::MAX, NV_ERR_INVALID_LIMIT),
    ];
    for (offset, length, want) in cases {
        let out = map(&s, H_SYSMEM, offset, length, t.id());
        assert_eq!(out.status, want, "offset {offset:#x} length {length:#x}");
    }
    assert_eq!(d.stats().cpu_mappings, 0);
    assert_eq!(d.stats().mmap_contexts, 0);
}

#[test]
fn test_map_memory_handle_statuses() {
    let d = sim(1);
    let s = stack(&d, 0);
    memory(&s, H_SYSMEM, PAGE as u64, false);
    let t = d.open_mapping(NodeKind::Ctl).unwrap();
    let id = t.id();
    assert_eq!(
        map(&s, 0xd000_0099, 0, 1, id).status,
        NV_ERR_OBJECT_NOT_FOUND
    );
    assert_eq!(map(&s, s.subdevice, 0, 1, id).status, NV_ERR_NOT_SUPPORTED);
    assert_eq!(
        map_with(&s, 0xd000_0098, H_SYSMEM, 0, 1, 0, id).status,
        NV_ERR_OBJECT_NOT_FOUND,
        "unknown mapping device"
    );
    assert_eq!(
        map_with(&s, H_SYSMEM, H_SYSMEM, 0, 1, 0, id).status,
        NV_ERR_INVALID_OBJECT_PARENT,
        "the mapping device must be a device or subdevice"
    );
    assert_eq!(
        map_with(&s, s.device, H_SYSMEM, 0, 1, 1 << 4, id).status,
        NV_ERR_INVALID_FLAGS,
        "persistent mappings"
    );
    let other_file = open(&d, NodeKind::Ctl);
    let mut p = nv_ioctl_nvos33_parameters_with_fd::new_zeroed();
    p.params.hClient = s.client;
    p.params.hDevice = s.device;
    p.params.hMemory = H_SYSMEM;
    p.params.length = 1;
    p.fd = id;
    let (_, out) = esc(&other_file, NV_ESC_RM_MAP_MEMORY, &p);
    assert_eq!(
        out.params.status, NV_ERR_INVALID_CLIENT,
        "another file's client"
    );
    assert_eq!(d.stats().cpu_mappings, 0);
}

#[test]
fn test_map_memory_target_must_be_a_file_of_the_memorys_device() {
    let d = sim(2);
    let s = stack(&d, 0);
    memory(&s, H_SYSMEM, PAGE as u64, false);
    memory(&s, H_VIDMEM, PAGE as u64, true);
    let ctl_t = d.open_mapping(NodeKind::Ctl).unwrap();
    let gpu0_t = d.open_mapping(NodeKind::Gpu(0)).unwrap();
    let gpu1_t = d.open_mapping(NodeKind::Gpu(1)).unwrap();
    let bad = NV_ERR_INVALID_ARGUMENT;
    assert_eq!(
        map(&s, H_SYSMEM, 0, 1, gpu0_t.id()).status,
        bad,
        "sysmem → GPU file"
    );
    assert_eq!(
        map(&s, H_VIDMEM, 0, 1, ctl_t.id()).status,
        bad,
        "vidmem → control file"
    );
    assert_eq!(
        map(&s, H_VIDMEM, 0, 1, gpu1_t.id()).status,
        bad,
        "vidmem → other GPU"
    );
    assert_eq!(map(&s, H_SYSMEM, 0, 1, 0x7777).status, bad, "no such file");
    assert_eq!(d.stats().cpu_mappings, 0, "a failed context unmaps again");
    assert_eq!(map(&s, H_VIDMEM, 0, 1, gpu0_t.id()).status, NV_OK);
}

#[test]
fn test_second_mmap_context_on_one_file_is_state_in_use() {
    let d = sim(1);
    let s = stack(&d, 0);
    memory(&s, H_SYSMEM, PAGE as u64, false);
    let t = d.open_mapping(NodeKind::Ctl).unwrap();
    assert_eq!(map(&s, H_SYSMEM, 0, 1, t.id()).status, NV_OK);
    assert_eq!(map(&s, H_SYSMEM, 0, 1, t.id()).status, NV_ERR_STATE_IN_USE);
    assert_eq!(d.stats().cpu_mappings, 1);
}

#[test]
fn test_map_memory_forces_the_default_caching_type() {
    let d = sim(1);
    let s = stack(&d, 0);
    memory(&s, H_SYSMEM, PAGE as u64, false);
    let t = d.open_mapping(NodeKind::Ctl).unwrap();
    let out = map_with(&s, s.device, H_SYSMEM, 0, 1, 1 << 23, t.id()); // UNCACHED asked
    assert_eq!((out.status, (out.flags >> 23) & 7), (NV_OK, 6));
}

#[test]
fn test_unmap_memory_needs_the_address_the_map_returned() {
    let d = sim(1);
    let s = stack(&d, 0);
    memory(&s, H_SYSMEM, PAGE as u64, false);
    let t = d.open_mapping(NodeKind::Ctl).unwrap();
    let out = map(&s, H_SYSMEM, 0, 1, t.id());
    assert_eq!(
        unmap(&s, H_SYSMEM, out.pLinearAddress + 1),
        NV_ERR_OBJECT_NOT_FOUND
    );
    assert_eq!(
        unmap(&s, 0xd000_0099, out.pLinearAddress),
        NV_ERR_OBJECT_NOT_FOUND
    );
    assert_eq!(unmap(&s, H_SYSMEM, out.pLinearAddress), NV_OK);
    assert_eq!(
        unmap(&s, H_SYSMEM, out.pLinearAddress),
        NV_ERR_OBJECT_NOT_FOUND
    );
    assert_eq!(d.stats().cpu_mappings, 0);
    assert!(t.mmap_fd().is_ok(), "the file keeps its context");
}

#[test]
fn test_map_and_unmap_memory_are_control_node_escapes() {
    let d = sim(1);
    let s = stack(&d, 0);
    let mut call = esc_call(NV_ESC_RM_UNMAP_MEMORY, &[0; 32]);
    assert_eq!(errno(s.gpu.ioctl(&mut call)), Some(EINVAL));
}

// ---- mapping files and mmap_fd -----------------------------------------------------------------

#[test]
fn test_every_ioctl_on_a_mapping_file_is_eacces() {
    let d = sim(1);
    let t = d.open_mapping(NodeKind::Ctl).unwrap();
    let mut call = esc_call(NV_ESC_CARD_INFO, &[0; 72]);
    assert_eq!(errno(t.ioctl(&mut call)), Some(EACCES));
    let t = d.open_mapping(NodeKind::Gpu(0)).unwrap();
    let mut call = esc_call(NV_ESC_REGISTER_FD, &[0; 4]);
    assert_eq!(errno(t.ioctl(&mut call)), Some(EACCES));
    assert!(d.open_mapping(NodeKind::Uvm).is_err());
    assert!(d.open_mapping(NodeKind::Gpu(5)).is_err());
}

#[test]
fn test_mmap_fd_without_a_context_is_einval() {
    let d = sim(1);
    let t = d.open_mapping(NodeKind::Ctl).unwrap();
    assert_eq!(t.mmap_fd().unwrap_err().raw_os_error(), Some(EINVAL));
    let plain = open(&d, NodeKind::Ctl);
    assert_eq!(plain.mmap_fd().unwrap_err().raw_os_error(), Some(EINVAL));
}

#[test]
fn test_a_mapping_outlives_the_free_of_its_memory() {
    let d = sim(1);
    let s = stack(&d, 0);
    memory(&s, H_SYSMEM, PAGE as u64, false);
    let t = d.open_mapping(NodeKind::Ctl).unwrap();
    assert_eq!(map(&s, H_SYSMEM, 0, PAGE as u64, t.id()).status, NV_OK);
    let (fd, adjust) = t.mmap_fd().unwrap();
    let m = Mapping::new(&fd, PAGE, adjust);
    d.memory_write(s.client, H_SYSMEM, 0, b"kept").unwrap();
    assert_eq!(free(&s.ctl, s.client, H_SYSMEM), NV_OK);
    let st = d.stats();
    assert_eq!((st.cpu_mappings, st.memfds, st.mmap_contexts), (0, 0, 1));
    assert_eq!(m.read(0, 4), b"kept");
}

// ---- RM_ALLOC_MEMORY -------------------------------------------------------------------------------

fn alloc_memory(
    f: &File,
    s: &Stack,
    h: u32,
    class: u32,
    flags: u32,
    limit: u64,
    fd: i32,
) -> (std::io::Result<i32>, NVOS02_PARAMETERS) {
    let mut p = nv_ioctl_nvos02_parameters_with_fd::new_zeroed();
    p.params.hRoot = s.client;
    p.params.hObjectParent = s.device;
    p.params.hObjectNew = h;
    p.params.hClass = class;
    p.params.flags = flags;
    p.params.limit = limit;
    p.fd = fd;
    let (r, out) = esc(f, NV_ESC_RM_ALLOC_MEMORY, &p);
    (r, out.params)
}

#[test]
fn test_alloc_memory_system_maps_at_once_into_the_named_file() {
    let d = sim(1);
    let s = stack(&d, 0);
    let t = d.open_mapping(NodeKind::Ctl).unwrap();
    let (r, out) = alloc_memory(&s.gpu, &s, H_SYSMEM, 0x3e, 0, 2 * PAGE as u64 - 1, t.id());
    assert_eq!((r.unwrap(), out.status), (0, NV_OK));
    assert_ne!(out.pMemory, 0);
    let (fd, adjust) = t.mmap_fd().unwrap();
    let m = Mapping::new(&fd, 2 * PAGE, adjust);
    m.write(PAGE, b"alloc");
    assert_eq!(
        d.memory_read(s.client, H_SYSMEM, PAGE as u64, 5).unwrap(),
        b"alloc"
    );
    assert_eq!(unmap(&s, H_SYSMEM, out.pMemory), NV_OK);
}

#[test]
fn test_alloc_memory_without_mapping_creates_no_context() {
    let d = sim(1);
    let s = stack(&d, 0);
    let no_map = 1 << 30;
    let (r, out) = alloc_memory(&s.gpu, &s, H_SYSMEM, 0x3e, no_map, PAGE as u64 - 1, -1);
    assert_eq!((r.unwrap(), out.status, out.pMemory), (0, NV_OK, 0));
    let st = d.stats();
    assert_eq!((st.cpu_mappings, st.mmap_contexts), (0, 0));
}

#[test]
fn test_alloc_memory_context_failure_is_einval_and_keeps_the_memory() {
    let d = sim(1);
    let s = stack(&d, 0);
    let before = d.live_objects();
    let (r, out) = alloc_memory(&s.gpu, &s, H_SYSMEM, 0x3e, 0, PAGE as u64 - 1, s.gpu.id());
    assert_eq!(errno(r), Some(EINVAL));
    assert_eq!(out.status, NV_OK);
    assert_eq!(d.live_objects(), before + 1);
}

#[test]
fn test_alloc_memory_flag_and_class_statuses() {
    let d = sim(1);
    let s = stack(&d, 0);
    let lim = PAGE as u64 - 1;
    let vidmem_location = 2 << 8;
    let alloc_none = 1 << 16;
    for (class, flags, want) in [
        (0x3e, vidmem_location, NV_ERR_INVALID_FLAGS),
        (0x3e, alloc_none, NV_ERR_INVALID_FLAGS),
        (0x40, 0, NV_ERR_NOT_SUPPORTED),
        (0x80, 0, NV_ERR_INVALID_CLASS),
    ] {
        let (r, out) = alloc_memory(&s.gpu, &s, H_SYSMEM, class, flags, lim, -1);
        assert_eq!(
            (r.unwrap(), out.status),
            (0, want),
            "class {class:#x} flags {flags:#x}"
        );
    }
    let (r, _) = alloc_memory(&s.ctl, &s, H_SYSMEM, 0x3e, 0, lim, -1);
    assert_eq!(errno(r), Some(EINVAL), "GPU node only");
}

// ---- accessors and leak counters -----------------------------------------------------------------

#[test]
fn test_memory_accessor_statuses() {
    let d = sim(1);
    let s = stack(&d, 0);
    memory(&s, H_SYSMEM, PAGE as u64, false);
    let page = PAGE as u64;
    assert_eq!(
        d.memory_read(s.client, H_SYSMEM, page, 1),
        Err(NV_ERR_INVALID_BASE)
    );
    assert_eq!(
        d.memory_read(s.client, H_SYSMEM, 8, PAGE),
        Err(NV_ERR_INVALID_LIMIT)
    );
    assert_eq!(
        d.memory_write(s.client, H_SYSMEM, 8, &[0; PAGE]),
        Err(NV_ERR_INVALID_LIMIT)
    );
    assert_eq!(
        d.memory_read(s.client, 0xd000_0099, 0, 1),
        Err(NV_ERR_OBJECT_NOT_FOUND)
    );
    assert_eq!(
        d.memory_read(s.client, s.device, 0, 1),
        Err(NV_ERR_INVALID_OBJECT)
    );
    assert!(d.memory_read(0xc1d0_0077, H_SYSMEM, 0, 1).is_err());
}

#[test]
fn test_leak_counters_cover_memory_contexts_and_mapping_files() {
    let d = sim(1);
    {
        let s = stack(&d, 0);
        memory(&s, H_SYSMEM, PAGE as u64, false);
        let t = d.open_mapping(NodeKind::Ctl).unwrap();
        assert_eq!(map(&s, H_SYSMEM, 0, 1, t.id()).status, NV_OK);
        let st = d.stats();
        assert_eq!(
            (
                st.mapping_files,
                st.mmap_contexts,
                st.cpu_mappings,
                st.memfds
            ),
            (1, 1, 1, 1)
        );
        drop(s);
        let st = d.stats();
        assert_eq!((st.cpu_mappings, st.memfds, st.mmap_contexts), (0, 0, 1));
    }
    assert_eq!(d.stats(), SimStats::default());
}

#[test]
fn test_update_device_mapping_info_moves_a_cpu_mapping() {
    let d = sim(1);
    let s = stack(&d, 0);
    memory(&s, H_SYSMEM, 2 * PAGE as u64, false);
    let target = d.open_mapping(NodeKind::Ctl).unwrap();
    let out = map(&s, H_SYSMEM, 0, 2 * PAGE as u64, target.id());
    assert_eq!(out.status, NV_OK);
    let update = |h_device: u32, h_memory: u32, old: u64, new: u64| {
        let mut p = NVOS56_PARAMETERS::new_zeroed();
        p.hClient = s.client;
        p.hDevice = h_device;
        p.hMemory = h_memory;
        p.pOldCpuAddress = old;
        p.pNewCpuAddress = new;
        let (r, out) = esc(&s.ctl, NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO, &p);
        assert_eq!(r.unwrap(), 0);
        out.status
    };
    let new = 0x7f00_1234_0000;
    assert_eq!(
        update(s.device, H_SYSMEM, out.pLinearAddress + 1, new),
        NV_ERR_OBJECT_NOT_FOUND
    );
    assert_eq!(
        update(H_SYSMEM, H_SYSMEM, out.pLinearAddress, new),
        NV_ERR_INVALID_OBJECT_HANDLE
    );
    assert_eq!(
        update(s.device, s.subdevice, out.pLinearAddress, new),
        NV_ERR_INVALID_OBJECT_HANDLE
    );
    assert_eq!(
        update(s.subdevice, H_SYSMEM, out.pLinearAddress, new),
        NV_OK
    );
    assert_eq!(
        unmap(&s, H_SYSMEM, out.pLinearAddress),
        NV_ERR_OBJECT_NOT_FOUND
    );
    assert_eq!(unmap(&s, H_SYSMEM, new), NV_OK);
    assert_eq!(d.stats().cpu_mappings, 0);
}
