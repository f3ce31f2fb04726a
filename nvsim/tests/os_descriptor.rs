//! `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR` through `HostFile::ioctl_with_pages`: the client's pages
//! (a file it maps at `pMemory`) back the memory object, with the checks and statuses of
//! escape.c `RmAllocOsDescriptor` / `RmCreateOsDescriptor` and
//! `osCreateOsDescriptorFromPageArray`.

mod common;

use std::fs::File as StdFile;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use common::*;
use host_driver::ClientPages;
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use nvsim::status::*;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const H_OSDESC: u32 = 0xd000_0071;
const PAGE: u64 = 4096;
/// libcuda's flags: non-contiguous, cached, `MAPPING_NO_MAP`.
const LIBCUDA_FLAGS: u32 = 0x4000_1010;
const VA: u64 = 0x7f00_0020_0000;
const PTR: usize = std::mem::offset_of!(nv_ioctl_nvos02_parameters_with_fd, params)
    + std::mem::offset_of!(NVOS02_PARAMETERS, pMemory);

fn memfd(len: u64) -> Arc<StdFile> {
    let fd =
        nix::sys::memfd::memfd_create(c"osdesc-test", nix::sys::memfd::MemFdCreateFlag::empty())
            .unwrap();
    let f = StdFile::from(fd);
    f.set_len(len).unwrap();
    Arc::new(f)
}

fn params(
    s: &Stack,
    parent: u32,
    flags: u32,
    addr: u64,
    limit: u64,
) -> nv_ioctl_nvos02_parameters_with_fd {
    let mut p = nv_ioctl_nvos02_parameters_with_fd::new_zeroed();
    p.params.hRoot = s.client;
    p.params.hObjectParent = parent;
    p.params.hObjectNew = H_OSDESC;
    p.params.hClass = 0x71;
    p.params.flags = flags;
    p.params.pMemory = addr;
    p.params.limit = limit;
    p.fd = -1;
    p
}

fn with_pages(
    f: &File,
    p: &nv_ioctl_nvos02_parameters_with_fd,
    file: &Arc<StdFile>,
    len: u64,
) -> (std::io::Result<i32>, NVOS02_PARAMETERS) {
    let mut call = esc_call(NV_ESC_RM_ALLOC_MEMORY, p.as_bytes());
    let pages = ClientPages {
        file: file.clone(),
        len,
        ptr_offset: PTR,
    };
    let r = f.ioctl_with_pages(&mut call, &pages);
    let out = nv_ioctl_nvos02_parameters_with_fd::read_from_bytes(&call.params).unwrap();
    (r, out.params)
}

#[test]
fn test_os_descriptor_memory_is_the_clients_file_both_ways() {
    let d = sim(1);
    let s = stack(&d, 0);
    let before = d.live_objects();
    let file = memfd(2 * 1024 * 1024);
    file.write_all_at(b"tenant", 0x1234).unwrap();
    let p = params(&s, s.device, LIBCUDA_FLAGS, VA, 2 * 1024 * 1024 - 1);
    let (r, out) = with_pages(&s.gpu, &p, &file, 2 * 1024 * 1024);
    assert_eq!((r.unwrap(), out.status), (0, NV_OK));
    assert_eq!(out.pMemory, VA, "pMemory is left as it was");
    assert_eq!(d.live_objects(), before + 1);
    // What the client wrote, the GPU reads; what the GPU writes, the client reads.
    assert_eq!(
        d.memory_read(s.client, H_OSDESC, 0x1234, 6).unwrap(),
        b"tenant"
    );
    d.memory_write(s.client, H_OSDESC, 0x1f_fff0, b"gpu")
        .unwrap();
    let mut back = [0u8; 3];
    file.read_exact_at(&mut back, 0x1f_fff0).unwrap();
    assert_eq!(&back, b"gpu");
    // The object is system memory, and its free lets go of the client's file.
    assert_eq!(free(&s.ctl, s.client, H_OSDESC), NV_OK);
    assert_eq!(d.live_objects(), before);
    assert_eq!(Arc::strong_count(&file), 1);
}

#[test]
fn test_os_descriptor_statuses_as_the_driver() {
    let d = sim(1);
    let s = stack(&d, 0);
    let file = memfd(4 * PAGE);
    let lim = 2 * PAGE - 1;
    let no_map = 1 << 30;
    for (what, flags, addr, limit, len, want) in [
        (
            "default mapping",
            LIBCUDA_FLAGS & !no_map,
            VA,
            lim,
            lim + 1,
            NV_ERR_INVALID_FLAGS,
        ),
        (
            "video memory",
            LIBCUDA_FLAGS | 2 << 8,
            VA,
            lim,
            lim + 1,
            NV_ERR_INVALID_FLAGS,
        ),
        (
            "write-combined",
            (LIBCUDA_FLAGS & !0xf000) | 2 << 12,
            VA,
            lim,
            lim + 1,
            NV_ERR_INVALID_FLAGS,
        ),
        (
            "uncached",
            LIBCUDA_FLAGS & !0xf000,
            VA,
            lim,
            lim + 1,
            NV_ERR_INVALID_FLAGS,
        ),
        (
            "contiguous",
            LIBCUDA_FLAGS & !0xf0,
            VA,
            lim,
            lim + 1,
            NV_ERR_INVALID_FLAGS,
        ),
        (
            "limit overflow",
            LIBCUDA_FLAGS,
            VA,
            u64::MAX,
            0,
            NV_ERR_INVALID_LIMIT,
        ),
        (
            "shorter pages",
            LIBCUDA_FLAGS,
            VA,
            lim,
            lim,
            NV_ERR_INVALID_ADDRESS,
        ),
        (
            "past the pages",
            LIBCUDA_FLAGS,
            VA,
            5 * PAGE - 1,
            5 * PAGE,
            NV_ERR_INVALID_ADDRESS,
        ),
    ] {
        let p = params(&s, s.device, flags, addr, limit);
        let (r, out) = with_pages(&s.gpu, &p, &file, len);
        assert_eq!((r.unwrap(), out.status), (0, want), "{what}");
    }
    // The parent: a device or subdevice of this client.
    let p = params(&s, 0xbad, LIBCUDA_FLAGS, VA, lim);
    assert_eq!(
        with_pages(&s.gpu, &p, &file, lim + 1).1.status,
        NV_ERR_OBJECT_NOT_FOUND
    );
    let (st, h_vas) = alloc(
        &s.ctl,
        s.client,
        s.device,
        0xd000_0090,
        0x90f1,
        Some(&[0u8; 48]),
    );
    assert_eq!(st, NV_OK);
    let p = params(&s, h_vas, LIBCUDA_FLAGS, VA, lim);
    assert_eq!(
        with_pages(&s.gpu, &p, &file, lim + 1).1.status,
        NV_ERR_INVALID_OBJECT_PARENT
    );
    let p = params(&s, s.subdevice, LIBCUDA_FLAGS, VA, lim);
    assert_eq!(with_pages(&s.gpu, &p, &file, lim + 1).1.status, NV_OK);
    // The handle is taken now.
    let p = params(&s, s.device, LIBCUDA_FLAGS, VA, lim);
    assert_eq!(
        with_pages(&s.gpu, &p, &file, lim + 1).1.status,
        NV_ERR_INSERT_DUPLICATE_NAME
    );
    // NV_ACTUAL_DEVICE_ONLY: not on the control node.
    assert_eq!(
        errno(with_pages(&s.ctl, &p, &file, lim + 1).0),
        Some(EINVAL)
    );
}

#[test]
fn test_os_descriptor_read_only_file_pins_only_read_only_memory() {
    let d = sim(1);
    let s = stack(&d, 0);
    let rw = memfd(PAGE);
    rw.write_all_at(b"ro", 0).unwrap();
    // The same memfd opened read-only (as a client's O_RDONLY fd would be).
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&*rw));
    let ro = Arc::new(StdFile::open(path).unwrap());
    let p = params(&s, s.device, LIBCUDA_FLAGS, VA, PAGE - 1);
    assert_eq!(
        with_pages(&s.gpu, &p, &ro, PAGE).1.status,
        NV_ERR_INVALID_ADDRESS
    );
    let user_read_only = 1 << 21;
    let p = params(&s, s.device, LIBCUDA_FLAGS | user_read_only, VA, PAGE - 1);
    assert_eq!(with_pages(&s.gpu, &p, &ro, PAGE).1.status, NV_OK);
    assert_eq!(d.memory_read(s.client, H_OSDESC, 0, 2).unwrap(), b"ro");
    // A GPU write to it fails (the file is read-only), the client's bytes stay.
    assert!(d.memory_write(s.client, H_OSDESC, 0, b"xx").is_err());
    assert_eq!(d.memory_read(s.client, H_OSDESC, 0, 2).unwrap(), b"ro");
}

#[test]
fn test_plain_os_descriptor_escape_without_pages_is_not_supported() {
    let d = sim(1);
    let s = stack(&d, 0);
    let p = params(&s, s.device, LIBCUDA_FLAGS, VA, PAGE - 1);
    let (r, out) = esc(&s.gpu, NV_ESC_RM_ALLOC_MEMORY, &p);
    assert_eq!((r.unwrap(), out.params.status), (0, NV_ERR_NOT_SUPPORTED));
    // Pages for any other escape are refused.
    let file = memfd(PAGE);
    let mut call = esc_call(NV_ESC_RM_FREE, NVOS00_PARAMETERS::new_zeroed().as_bytes());
    let pages = ClientPages {
        file,
        len: PAGE,
        ptr_offset: PTR,
    };
    assert_eq!(
        errno(s.gpu.ioctl_with_pages(&mut call, &pages)),
        Some(EINVAL)
    );
}

#[test]
fn test_one_file_sent_for_many_allocations_is_kept_once() {
    let d = sim(1);
    let s = stack(&d, 0);
    let file = memfd(PAGE);
    // Each allocation brings its own fd of the same file, as the driver process receives them.
    let fds: Vec<Arc<StdFile>> = (0..50)
        .map(|_| Arc::new(file.try_clone().unwrap()))
        .collect();
    for (i, f) in fds.iter().enumerate() {
        let mut p = params(&s, s.device, LIBCUDA_FLAGS, VA, PAGE - 1);
        p.params.hObjectNew = H_OSDESC + u32::try_from(i).expect("50 files");
        let (r, out) = with_pages(&s.gpu, &p, f, PAGE);
        assert_eq!((r.unwrap(), out.status), (0, NV_OK), "allocation {i}");
    }
    let kept = fds.iter().filter(|f| Arc::strong_count(f) > 1).count();
    assert_eq!(kept, 1, "fds kept for one file");
    for i in 0..50 {
        assert_eq!(free(&s.ctl, s.client, H_OSDESC + i), NV_OK);
    }
    assert!(fds.iter().all(|f| Arc::strong_count(f) == 1));
}
