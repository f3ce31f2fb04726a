//! RM memory as the CPU sees it: memfd backing of memory objects, CPU mappings
//! (`NV_ESC_RM_MAP_MEMORY` / `NV_ESC_RM_UNMAP_MEMORY`), the mmap contexts of files, and
//! `NV_ESC_RM_ALLOC_MEMORY` for system memory.
//!
//! The driver's protocol (`src/nvidia/arch/nvalloc/unix/src/escape.c`, `osapi.c`
//! `RmCreateMmapContextLocked`, `kernel-open/nvidia/nv-usermap.c`, `nv-mmap.c`): a map escape
//! validates the request against the memory object and records a CPU mapping, then stores an
//! *mmap context* in the private data of the file named by `fd` (one per file, for the file's
//! lifetime); an `mmap` of that file at offset 0 maps what the context names.
//!
//! The simulator backs each memory block (an object and its dups) with a memfd of the block's
//! size, created when the block is first mapped or written. A file's
//! [`HostFile::mmap_fd`](host_driver::HostFile::mmap_fd) is a dup of the memfd of the block its
//! context names, with the context's page-aligned offset into the block as the offset to add:
//! the tenant's "`mmap(F, offset 0)`" becomes a map of the memfd at that offset, so bytes
//! written through the mapping are what [`SimDriver::memory_read`] sees, and the reverse.
//!
//! Simplified: the memfd is not a device, so the driver's `mmap`-time checks (`vm_pgoff == 0`,
//! the VMA size of a BAR mapping equal to the context's, `-ERANGE` past a system allocation)
//! are not made, and a mapping past the block's end faults (`SIGBUS`) on access instead;
//! caching types are ignored; a mapping of a device or subdevice (registers) is not supported.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;

use host_driver::{ClientPages, HostCall, NodeKind};
use nvproxy_abi::structs::{
    NV_MEMORY_ALLOCATION_PARAMS, NVOS33_PARAMETERS, NVOS34_PARAMETERS,
    nv_ioctl_nvos02_parameters_with_fd, nv_ioctl_nvos33_parameters_with_fd,
};
use zerocopy::{FromZeros, IntoBytes};

use crate::buf::{Loc, read_at, write_at};
use crate::driver::{Kind, SimDriver, State};
use crate::memory_state::{CpuMapping, MmapContext, file_writable};
use crate::rm::{self, AllocArgs};
use crate::status::*;

/// `NV01_MEMORY_LOCAL_PRIVILEGED`.
const NV01_MEMORY_LOCAL_PRIVILEGED: u32 = 0x3f;
/// `NV01_MEMORY_SYSTEM_DYNAMIC`.
const NV01_MEMORY_SYSTEM_DYNAMIC: u32 = 0x70;
/// `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`.
const NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: u32 = 0x71;
/// `NV01_MEMORY_FRAMEBUFFER_CONSOLE`.
const NV01_MEMORY_FRAMEBUFFER_CONSOLE: u32 = 0x76;
/// `NV01_MEMORY_LIST_SYSTEM`, `_FBMEM`, `_OBJECT`.
const NV01_MEMORY_LIST: [u32; 3] = [0x81, 0x82, 0x83];
/// `NV01_MEMORY_FLA`.
const NV01_MEMORY_FLA: u32 = 0xf3;

/// `NVOS33_FLAGS_PERSISTENT` (bit 4) `_ENABLE`.
const NVOS33_FLAGS_PERSISTENT_ENABLE: u32 = 1 << 4;
/// `NVOS33_FLAGS_CACHING_TYPE` (bits 25:23).
const NVOS33_FLAGS_CACHING_TYPE_MASK: u32 = 7 << 23;
/// `NVOS33_FLAGS_CACHING_TYPE_DEFAULT`.
const NVOS33_FLAGS_CACHING_TYPE_DEFAULT: u32 = 6;
/// `NVOS02_FLAGS_LOCATION` (bits 11:8); `_PCI` is 0.
const NVOS02_FLAGS_LOCATION_SHIFT: u32 = 8;
/// `NVOS02_FLAGS_ALLOC` (bits 17:16); `_NONE` is 1.
const NVOS02_FLAGS_ALLOC_SHIFT: u32 = 16;
/// `NVOS02_FLAGS_MAPPING` (bits 31:30): `_DEFAULT` 0, `_NO_MAP` 1, `_NEVER_MAP` 2.
const NVOS02_FLAGS_MAPPING_SHIFT: u32 = 30;
/// `NVOS02_FLAGS_PHYSICALITY` (bits 7:4); `_CONTIGUOUS` is 0.
const NVOS02_FLAGS_PHYSICALITY_SHIFT: u32 = 4;
/// `NVOS02_FLAGS_COHERENCY` (bits 15:12): `_UNCACHED` 0, `_CACHED` 1, `_WRITE_BACK` 5.
const NVOS02_FLAGS_COHERENCY_SHIFT: u32 = 12;
/// `NVOS02_FLAGS_ALLOC_USER_READ_ONLY` (bit 21).
const NVOS02_FLAGS_ALLOC_USER_READ_ONLY: u32 = 1 << 21;

/// The simulator's stand-in for the "physical" address a CPU mapping returns in
/// `pLinearAddress` (the driver gives the page's physical address for system memory,
/// `nv_alloc_user_mapping`, and the BAR address for video memory): an opaque cookie, unique per
/// block and offset, that `RM_UNMAP_MEMORY` must name again.
const SYSMEM_ADDRESS_BASE: u64 = 0x0000_2000_0000_0000;
const VIDMEM_ADDRESS_BASE: u64 = 0x0000_4000_0000_0000;
const BLOCK_ADDRESS_SHIFT: u32 = 40;
const PAGE: u64 = 4096;

fn address_base(block: u64, video: bool) -> u64 {
    let base = if video {
        VIDMEM_ADDRESS_BASE
    } else {
        SYSMEM_ADDRESS_BASE
    };
    base.wrapping_add(block << BLOCK_ADDRESS_SHIFT)
}

/// A memory object: its block, size and kind.
struct MemObject {
    block: u64,
    bytes: u64,
    video: bool,
    gpu: usize,
}

impl State {
    /// The memory object `h_memory` of client `h_client`: `NV_ERR_OBJECT_NOT_FOUND` for an
    /// unknown handle (`clientGetResourceRef`), `not_memory` for another kind of object.
    fn mem_object(&self, h_client: u32, h_memory: u32, not_memory: u32) -> Result<MemObject, u32> {
        let client = self.clients.get(&h_client).ok_or(NV_ERR_INVALID_CLIENT)?;
        if h_memory == h_client {
            return Err(not_memory);
        }
        let obj = client
            .objects()
            .get(&h_memory)
            .ok_or(NV_ERR_OBJECT_NOT_FOUND)?;
        let Kind::Memory { block } = obj.kind else {
            return Err(not_memory);
        };
        let b = self.blocks.get(&block).ok_or(NV_ERR_OBJECT_NOT_FOUND)?;
        Ok(MemObject {
            block,
            bytes: b.bytes,
            video: b.video || b.regs,
            gpu: b.gpu,
        })
    }

    /// `Nv04MapMemory` (`serverMap`, `serverMap_Prologue`, `memMap`): validates and records a
    /// CPU mapping; returns its address.
    fn cpu_map(&mut self, os_info: i32, p: &NVOS33_PARAMETERS) -> Result<u64, u32> {
        // serverMap: the client (strict validation: it must be this file's).
        self.client_for(p.hClient, os_info)?;
        // clientGetResourceRef(hMemory).
        let client = &self.clients[&p.hClient];
        let obj = if p.hMemory == p.hClient {
            None
        } else {
            Some(
                client
                    .objects()
                    .get(&p.hMemory)
                    .ok_or(NV_ERR_OBJECT_NOT_FOUND)?,
            )
        };
        // serverMap_Prologue: persistent mappings are gone; the mapping context must be a
        // device or subdevice unless the client itself is named.
        if p.flags & NVOS33_FLAGS_PERSISTENT_ENABLE != 0 {
            return Err(NV_ERR_INVALID_FLAGS);
        }
        if p.hDevice != p.hClient {
            if obj.is_none_or(|o| o.parent == p.hClient) {
                return Err(NV_ERR_INVALID_OBJECT_PARENT);
            }
            let ctx = client
                .objects()
                .get(&p.hDevice)
                .ok_or(NV_ERR_OBJECT_NOT_FOUND)?;
            if !matches!(ctx.kind, Kind::Device { .. } | Kind::Subdevice { .. }) {
                return Err(NV_ERR_INVALID_OBJECT_PARENT);
            }
        }
        // memMap: only memory (register mappings of devices are not simulated).
        let m = self.mem_object(p.hClient, p.hMemory, NV_ERR_NOT_SUPPORTED)?;
        if p.offset >= m.bytes {
            return Err(NV_ERR_INVALID_BASE);
        }
        if p.length == 0 {
            return Err(NV_ERR_INVALID_LIMIT);
        }
        if p.offset
            .checked_add(p.length)
            .is_none_or(|end| end > m.bytes)
        {
            return Err(NV_ERR_INVALID_LIMIT);
        }
        let address = address_base(m.block, m.video).wrapping_add(p.offset);
        self.mem.cpu_maps.push(CpuMapping {
            h_client: p.hClient,
            h_memory: p.hMemory,
            block: m.block,
            address,
        });
        Ok(address)
    }

    /// Removes the CPU mapping at `address` of `h_memory` (`refFindCpuMappingWithFilter`:
    /// `NV_ERR_OBJECT_NOT_FOUND` when there is none).
    fn cpu_unmap(&mut self, h_client: u32, h_memory: u32, address: u64) -> u32 {
        match self
            .mem
            .cpu_maps
            .iter()
            .position(|m| m.h_client == h_client && m.h_memory == h_memory && m.address == address)
        {
            Some(i) => {
                self.mem.cpu_maps.remove(i);
                NV_OK
            }
            None => NV_ERR_OBJECT_NOT_FOUND,
        }
    }

    /// `rm_create_mmap_context` (`RmCreateMmapContextLocked`, `nv_add_mapping_context_to_file`):
    /// stores in file `fd` a context for `length` bytes at `address` of `h_memory`.
    #[allow(clippy::too_many_arguments)]
    fn create_mmap_context(
        &mut self,
        drv: &SimDriver,
        h_client: u32,
        h_device: u32,
        h_memory: u32,
        address: u64,
        fd: i32,
    ) -> u32 {
        let m = match self.mem_object(h_client, h_memory, NV_ERR_INVALID_OBJECT) {
            Ok(m) => m,
            Err(s) => return s,
        };
        // Video memory is a BAR mapping of the device's GPU (its file must be a /dev/nvidia#
        // of that GPU); system memory, or any mapping without a device, goes to the control
        // device (its file must be /dev/nvidiactl), after RmGetAllocPrivate found the pages.
        let want = if m.video {
            if h_device == h_client {
                return NV_ERR_OBJECT_NOT_FOUND; // RmGetAllocPrivate: not system memory
            }
            NodeKind::Gpu(drv.config.gpus[m.gpu].minor)
        } else {
            NodeKind::Ctl
        };
        // os_match_mmap_offset: the address must lie in the allocation.
        let base = address_base(m.block, m.video);
        let Some(offset) = address.checked_sub(base).filter(|&o| o < m.bytes) else {
            return NV_ERR_INVALID_ARGUMENT;
        };
        // nv_get_file_private(fd, ctl): an open NVIDIA file of the right kind; for a GPU
        // mapping, of that GPU (NV_STATE_PTR(nvlfp->nvptr) != nv).
        if drv.file_node(self, fd) != Some(want) {
            return NV_ERR_INVALID_ARGUMENT;
        }
        if self.mem.contexts.contains_key(&fd) {
            return NV_ERR_STATE_IN_USE;
        }
        let memfd = match self.mem.memfd(m.block, m.bytes) {
            Ok(f) => f,
            Err(_) => return NV_ERR_OPERATING_SYSTEM,
        };
        if self.blocks.get(&m.block).is_some_and(|b| b.regs) {
            crate::gpfifo::arm_doorbell(self, m.block);
        }
        self.mem.contexts.insert(
            fd,
            MmapContext {
                memfd,
                offset: offset & !(PAGE - 1),
            },
        );
        NV_OK
    }
}

/// `NV_ESC_RM_MAP_MEMORY` after the escape's node and size checks.
pub(crate) fn map_memory(
    drv: &SimDriver,
    st: &mut State,
    os_info: i32,
    call: &mut HostCall,
    loc: Loc,
) -> io::Result<i32> {
    let mut p: nv_ioctl_nvos33_parameters_with_fd = read_at(call, loc, 0).expect("size checked");
    // escape.c: "Don't allow userspace to override the caching type".
    p.params.flags = (p.params.flags & !NVOS33_FLAGS_CACHING_TYPE_MASK)
        | (NVOS33_FLAGS_CACHING_TYPE_DEFAULT << 23);
    p.params.status = match st.cpu_map(os_info, &p.params) {
        Ok(address) => {
            p.params.pLinearAddress = address;
            let s = st.create_mmap_context(
                drv,
                p.params.hClient,
                p.params.hDevice,
                p.params.hMemory,
                address,
                p.fd,
            );
            if s != NV_OK {
                // escape.c unmaps again when the context cannot be created.
                st.cpu_unmap(p.params.hClient, p.params.hMemory, address);
            }
            s
        }
        Err(s) => s,
    };
    write_at(call, loc, 0, &p);
    Ok(0)
}

/// `NV_ESC_RM_UNMAP_MEMORY` after the escape's node and size checks.
pub(crate) fn unmap_memory(
    st: &mut State,
    os_info: i32,
    call: &mut HostCall,
    loc: Loc,
) -> io::Result<i32> {
    let mut p: NVOS34_PARAMETERS = read_at(call, loc, 0).expect("size checked");
    p.status = match st.client_for(p.hClient, os_info) {
        Err(s) => s,
        Ok(c) if p.hMemory != p.hClient && !c.objects().contains_key(&p.hMemory) => {
            NV_ERR_OBJECT_NOT_FOUND
        }
        Ok(_) => st.cpu_unmap(p.hClient, p.hMemory, p.pLinearAddress),
    };
    write_at(call, loc, 0, &p);
    Ok(0)
}

/// `NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO` (`RmUpdateDeviceMappingInfo`): the client tells RM
/// the address it mapped a CPU mapping at (libcuda moves its mappings after `RM_MAP_MEMORY`);
/// the mapping is found by its old address and unmapped by the new one from then on.
pub(crate) fn update_mapping_info(
    st: &mut State,
    os_info: i32,
    call: &mut HostCall,
    loc: Loc,
) -> io::Result<i32> {
    let mut p: nvproxy_abi::structs::NVOS56_PARAMETERS =
        read_at(call, loc, 0).expect("size checked");
    p.status = (|| {
        let c = st.client_for(p.hClient, os_info)?;
        // deviceGetByHandle, else subdeviceGetByHandle.
        match c.objects().get(&p.hDevice).map(|o| &o.kind) {
            Some(Kind::Device { .. } | Kind::Subdevice { .. }) => {}
            Some(_) => return Err(NV_ERR_INVALID_OBJECT_HANDLE),
            None => return Err(NV_ERR_OBJECT_NOT_FOUND),
        }
        // A Memory or a KernelChannel.
        match c.objects().get(&p.hMemory).map(|o| &o.kind) {
            Some(Kind::Memory { .. } | Kind::Channel { .. }) => {}
            Some(_) => return Err(NV_ERR_INVALID_OBJECT_HANDLE),
            None => return Err(NV_ERR_OBJECT_NOT_FOUND),
        }
        let m = st
            .mem
            .cpu_maps
            .iter_mut()
            .find(|m| {
                m.h_client == p.hClient && m.h_memory == p.hMemory && m.address == p.pOldCpuAddress
            })
            .ok_or(NV_ERR_OBJECT_NOT_FOUND)?;
        m.address = p.pNewCpuAddress;
        Ok(())
    })()
    .err()
    .unwrap_or(NV_OK);
    write_at(call, loc, 0, &p);
    Ok(0)
}

/// `NV_ESC_RM_ALLOC_MEMORY` after the escape's node and size checks
/// (`RmDeprecatedAllocMemory`, `_rmAllocMemorySystem`, then escape.c's mmap context for
/// system memory mapped at once). Only `NV01_MEMORY_SYSTEM` is simulated; the other classes the
/// driver accepts here answer `NV_ERR_NOT_SUPPORTED`. A context that cannot be created fails
/// the ioctl with `EINVAL` and leaves the memory allocated, as the driver does.
pub(crate) fn alloc_memory(
    drv: &SimDriver,
    st: &mut State,
    os_info: i32,
    call: &mut HostCall,
    loc: Loc,
) -> io::Result<i32> {
    let mut p: nv_ioctl_nvos02_parameters_with_fd = read_at(call, loc, 0).expect("size checked");
    let class = p.params.hClass;
    let flags = p.params.flags;
    let table = [
        rm::NV01_MEMORY_SYSTEM,
        NV01_MEMORY_SYSTEM_DYNAMIC,
        NV01_MEMORY_SYSTEM_OS_DESCRIPTOR,
        rm::NV01_MEMORY_LOCAL_USER,
        NV01_MEMORY_LOCAL_PRIVILEGED,
        NV01_MEMORY_FRAMEBUFFER_CONSOLE,
        NV01_MEMORY_FLA,
    ];
    let alloc_none = (flags >> NVOS02_FLAGS_ALLOC_SHIFT) & 3 == 1;
    let mapping = (flags >> NVOS02_FLAGS_MAPPING_SHIFT) & 3;
    let status = if !table.contains(&class) && !NV01_MEMORY_LIST.contains(&class) {
        NV_ERR_INVALID_CLASS
    } else if class != rm::NV01_MEMORY_SYSTEM {
        NV_ERR_NOT_SUPPORTED
    } else if (flags >> NVOS02_FLAGS_LOCATION_SHIFT) & 0xf != 0 || alloc_none {
        NV_ERR_INVALID_FLAGS
    } else {
        alloc_system(drv, st, os_info, &mut p)
    };
    p.params.status = status;
    let mut result = Ok(0);
    if class == rm::NV01_MEMORY_SYSTEM && !alloc_none && mapping != 1 && status == NV_OK {
        let s = st.create_mmap_context(
            drv,
            p.params.hRoot,
            p.params.hObjectParent,
            p.params.hObjectNew,
            p.params.pMemory,
            p.fd,
        );
        if s != NV_OK {
            result = Err(io::Error::from_raw_os_error(EINVAL));
        }
    }
    write_at(call, loc, 0, &p);
    result
}

/// `_rmAllocMemorySystem`: an `RM_ALLOC` of `limit + 1` bytes, mapped (offset 0, the whole
/// size) unless the flags say `NO_MAP`/`NEVER_MAP`; a failed mapping frees the memory again.
/// The handle the driver may choose is not reported back (the driver passes a copy).
fn alloc_system(
    drv: &SimDriver,
    st: &mut State,
    os_info: i32,
    p: &mut nv_ioctl_nvos02_parameters_with_fd,
) -> u32 {
    let size = p.params.limit.wrapping_add(1);
    let mut mp = NV_MEMORY_ALLOCATION_PARAMS::new_zeroed();
    mp.owner = 0x7368_696d; // 'shim'
    mp.size = size;
    let psize = drv
        .abi
        .classes
        .get(&rm::NV01_MEMORY_SYSTEM)
        .map_or(size_of::<NV_MEMORY_ALLOCATION_PARAMS>(), |c| {
            c.param_size as usize
        });
    let mut buf = mp.as_bytes().to_vec();
    buf.resize(psize.max(buf.len()), 0);
    p.params.pMemory = 0;
    let (status, h) = st.alloc(
        drv,
        AllocArgs {
            h_client: p.params.hRoot,
            h_parent: p.params.hObjectParent,
            h_new: p.params.hObjectNew,
            class: rm::NV01_MEMORY_SYSTEM,
            params: Some(&mut buf),
            os_info,
        },
    );
    if status != NV_OK {
        return status;
    }
    if (p.params.flags >> NVOS02_FLAGS_MAPPING_SHIFT) & 3 == 0 {
        let mut map = NVOS33_PARAMETERS::new_zeroed();
        map.hClient = p.params.hRoot;
        map.hDevice = p.params.hObjectParent;
        map.hMemory = h;
        map.length = size;
        match st.cpu_map(os_info, &map) {
            Ok(address) => p.params.pMemory = address,
            Err(s) => {
                st.free(drv, p.params.hRoot, h, os_info);
                return s;
            }
        }
    }
    NV_OK
}

/// `NV_ESC_RM_ALLOC_MEMORY` of `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR` with the client's pages
/// (`HostFile::ioctl_with_pages`), after the escape's node and size checks: escape.c
/// `RmAllocOsDescriptor` (location PCI and `MAPPING_NO_MAP`, else `NV_ERR_INVALID_FLAGS`; a
/// coherency of cached/write-back or uncached), `RmCreateOsDescriptor` (`limit + 1 == 0`
/// `NV_ERR_INVALID_LIMIT`; the address's alignment is checked by the caller, which knows it;
/// `os_lock_user_pages` of every page, writable unless `ALLOC_USER_READ_ONLY`: pages the
/// client cannot give, here a file too short or opened read-only, `NV_ERR_INVALID_ADDRESS`),
/// then `osCreateOsDescriptorFromPageArray` (anonymous memory is write-back cacheable and not
/// contiguous: uncached or contiguous `NV_ERR_INVALID_FLAGS`) and the allocation of the object
/// under `hObjectParent` (`Nv04VidHeapControl` `ALLOC_OS_DESCRIPTOR`). The memory object's
/// block is backed by the client's file itself, so what the GPU (the front end) writes the
/// client reads in its own mapping and the reverse. `pMemory` is left as it was.
pub(crate) fn alloc_os_descriptor(
    drv: &SimDriver,
    st: &mut State,
    os_info: i32,
    call: &mut HostCall,
    loc: Loc,
    pages: &ClientPages,
) -> io::Result<i32> {
    let mut p: nv_ioctl_nvos02_parameters_with_fd = read_at(call, loc, 0).expect("size checked");
    if p.params.hClass != NV01_MEMORY_SYSTEM_OS_DESCRIPTOR {
        return Err(io::Error::from_raw_os_error(EINVAL));
    }
    p.params.status = os_descriptor(drv, st, os_info, &p.params, pages);
    write_at(call, loc, 0, &p);
    Ok(0)
}

fn os_descriptor(
    drv: &SimDriver,
    st: &mut State,
    os_info: i32,
    q: &nvproxy_abi::structs::NVOS02_PARAMETERS,
    pages: &ClientPages,
) -> u32 {
    let flags = q.flags;
    if (flags >> NVOS02_FLAGS_LOCATION_SHIFT) & 0xf != 0
        || (flags >> NVOS02_FLAGS_MAPPING_SHIFT) & 3 != 1
    {
        return NV_ERR_INVALID_FLAGS;
    }
    let coherency = (flags >> NVOS02_FLAGS_COHERENCY_SHIFT) & 0xf;
    if !matches!(coherency, 0 | 1 | 5) {
        return NV_ERR_INVALID_FLAGS;
    }
    // RmCreateOsDescriptor's alignment check of pMemory is the caller's: the address field
    // stands for `pages` (offset 0 of the file, page-aligned by construction), and a client
    // address never reaches the host.
    let Some(size) = q.limit.checked_add(1) else {
        return NV_ERR_INVALID_LIMIT;
    };
    // os_lock_user_pages: every page of the range must be there (and writable unless the
    // client asked for read-only memory).
    let Some(bytes) = size.checked_add(PAGE - 1).map(|s| s & !(PAGE - 1)) else {
        return NV_ERR_INVALID_LIMIT;
    };
    if pages.len != size {
        return NV_ERR_INVALID_ADDRESS;
    }
    if pages.file.metadata().map_or(true, |m| m.len() < bytes) {
        return NV_ERR_INVALID_ADDRESS;
    }
    let writable = flags & NVOS02_FLAGS_ALLOC_USER_READ_ONLY == 0;
    if writable && !file_writable(&pages.file) {
        return NV_ERR_INVALID_ADDRESS;
    }
    // osCreateOsDescriptorFromPageArray.
    if coherency == 0 || (flags >> NVOS02_FLAGS_PHYSICALITY_SHIFT) & 0xf == 0 {
        return NV_ERR_INVALID_FLAGS;
    }
    match st.alloc_os_descriptor_object(drv, q, os_info, bytes) {
        Ok(block) => {
            let file = st.mem.client_file(&pages.file);
            st.mem.backing.insert(block, file);
            NV_OK
        }
        Err(s) => s,
    }
}

impl State {
    /// The object of an OS-descriptor allocation (`RmAlloc` of the class under
    /// `hObjectParent`, `serverAllocResource`): this file's client, a device or subdevice
    /// parent (`NV_ERR_OBJECT_NOT_FOUND` when absent, `NV_ERR_INVALID_OBJECT_PARENT`
    /// otherwise), the handle; a system-memory block of `bytes` with no memfd of its own.
    fn alloc_os_descriptor_object(
        &mut self,
        _drv: &SimDriver,
        q: &nvproxy_abi::structs::NVOS02_PARAMETERS,
        os_info: i32,
        bytes: u64,
    ) -> Result<u64, u32> {
        self.client_for(q.hRoot, os_info)?;
        let parent = self
            .class_of(q.hRoot, q.hObjectParent)
            .ok_or(NV_ERR_OBJECT_NOT_FOUND)?;
        if !matches!(parent, rm::NV01_DEVICE_0 | rm::NV20_SUBDEVICE_0) {
            return Err(NV_ERR_INVALID_OBJECT_PARENT);
        }
        let gpu = self
            .gpu_of(q.hRoot, q.hObjectParent)
            .ok_or(NV_ERR_INVALID_OBJECT_PARENT)?;
        // NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED: the client's handle, never 0.
        if q.hObjectNew == 0 {
            return Err(NV_ERR_INVALID_OBJECT_HANDLE);
        }
        let h = self.assign_handle(q.hRoot, q.hObjectNew)?;
        let id = self.next_block;
        self.next_block += 1;
        self.blocks.insert(
            id,
            crate::driver::MemBlock {
                gpu,
                bytes,
                video: false,
                regs: false,
                host_pages: false,
                refs: 1,
            },
        );
        let client = self.clients.get_mut(&q.hRoot).expect("checked above");
        client.insert_object(
            h,
            crate::driver::Object {
                class: NV01_MEMORY_SYSTEM_OS_DESCRIPTOR,
                parent: q.hObjectParent,
                kind: Kind::Memory { block: id },
            },
        );
        Ok(id)
    }
}

/// [`HostFile::mmap_fd`](host_driver::HostFile::mmap_fd) of file `file`: a dup of the memfd its
/// context names and the context's offset into it; `EINVAL` without a context (`nv-mmap.c`:
/// "invalid mmap").
pub(crate) fn mmap_fd(drv: &SimDriver, file: i32) -> io::Result<(OwnedFd, u64)> {
    let st = drv.lock();
    let ctx = st
        .mem
        .contexts
        .get(&file)
        .ok_or_else(|| io::Error::from_raw_os_error(EINVAL))?;
    Ok((OwnedFd::from(ctx.memfd.try_clone()?), ctx.offset))
}

impl SimDriver {
    /// Reads `len` bytes at `offset` of memory object `h_memory` of client `h_client`, as the
    /// GPU would see them: what was written through any CPU mapping of it (or by
    /// [`SimDriver::memory_write`]); never-written memory reads as zeros. Errors are NV
    /// statuses: unknown client or object, not a memory object (`NV_ERR_INVALID_OBJECT`), a
    /// range outside the object (`NV_ERR_INVALID_BASE`, `NV_ERR_INVALID_LIMIT`).
    pub fn memory_read(
        &self,
        h_client: u32,
        h_memory: u32,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, u32> {
        let st = self.lock();
        let m = mem_range(&st, h_client, h_memory, offset, len)?;
        let mut out = vec![0; len];
        if let Some(f) = st.mem.backing.get(&m.block) {
            f.read_exact_at(&mut out, offset)
                .map_err(|_| NV_ERR_OPERATING_SYSTEM)?;
        }
        Ok(out)
    }

    /// Writes `data` at `offset` of memory object `h_memory` of client `h_client`, as the GPU
    /// would: CPU mappings of it see the bytes. Errors as [`SimDriver::memory_read`].
    pub fn memory_write(
        &self,
        h_client: u32,
        h_memory: u32,
        offset: u64,
        data: &[u8],
    ) -> Result<(), u32> {
        let mut st = self.lock();
        let m = mem_range(&st, h_client, h_memory, offset, data.len())?;
        let f = st
            .mem
            .memfd(m.block, m.bytes)
            .map_err(|_| NV_ERR_OPERATING_SYSTEM)?;
        f.write_all_at(data, offset)
            .map_err(|_| NV_ERR_OPERATING_SYSTEM)
    }
}

fn mem_range(
    st: &State,
    h_client: u32,
    h_memory: u32,
    offset: u64,
    len: usize,
) -> Result<MemObject, u32> {
    if !st.clients.contains_key(&h_client) {
        return Err(st.unknown_client_status(h_client));
    }
    let m = st.mem_object(h_client, h_memory, NV_ERR_INVALID_OBJECT)?;
    if offset >= m.bytes {
        return Err(NV_ERR_INVALID_BASE);
    }
    if offset
        .checked_add(len as u64)
        .is_none_or(|end| end > m.bytes)
    {
        return Err(NV_ERR_INVALID_LIMIT);
    }
    Ok(m)
}

impl State {
    /// Reads `buf.len()` bytes at `offset` of memory block `block` (never-written memory reads
    /// as zeros); false past the block's end or for a freed block.
    pub(crate) fn block_read(&self, block: u64, offset: u64, buf: &mut [u8]) -> bool {
        let Some(b) = self.blocks.get(&block) else {
            return false;
        };
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > b.bytes)
        {
            return false;
        }
        match self.mem.backing.get(&block) {
            Some(f) => f.read_exact_at(buf, offset).is_ok(),
            None => {
                buf.fill(0);
                true
            }
        }
    }

    /// Writes `data` at `offset` of memory block `block` (its memfd is created if needed);
    /// false past the block's end or for a freed block.
    pub(crate) fn block_write(&mut self, block: u64, offset: u64, data: &[u8]) -> bool {
        let Some(bytes) = self.blocks.get(&block).map(|b| b.bytes) else {
            return false;
        };
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > bytes)
        {
            return false;
        }
        match self.mem.memfd(block, bytes) {
            Ok(f) => f.write_all_at(data, offset).is_ok(),
            Err(_) => false,
        }
    }

    /// The blocks that are register pages (`*_USERMODE_A`) of GPU `gpu` and have a memfd
    /// (were mapped by a client): where doorbells are written.
    pub(crate) fn usermode_pages(&self, gpu: usize) -> Vec<u64> {
        self.blocks
            .iter()
            .filter(|(id, b)| b.regs && b.gpu == gpu && self.mem.backing.contains_key(id))
            .map(|(&id, _)| id)
            .collect()
    }
}
