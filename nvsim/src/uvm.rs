//! `/dev/nvidia-uvm`: the UVM file model (`kernel-open/nvidia-uvm/`: `uvm.c`,
//! `uvm_va_space.c`, `uvm_gpu.c`, `uvm_map_external.c`, `uvm_va_range.c`, `uvm_policy.c`,
//! `uvm_migrate.c`, `uvm_range_group.c`, `uvm_user_channel.c`).
//!
//! A UVM file is uninitialised, a va_space (after `UVM_INITIALIZE`) or an mm file (after a
//! successful `UVM_MM_INITIALIZE`, which holds the va_space's file open, as `fget` does).
//! Every command except `INITIALIZE`, `MM_INITIALIZE` and `DEINITIALIZE` needs a va_space
//! (`NV_ERR_ILLEGAL_ACTION` otherwise, `__UVM_ROUTE_CMD_*`); commands outside the version's
//! table fail with `EINVAL`, the driver's unknown-command answer; the params must be exactly
//! the table's size (`EFAULT` otherwise: the driver's copy would fault).
//!
//! # Memory
//! Each va_space has a sparse memfd of 2^47 bytes whose offset is the virtual address:
//! [`HostFile::mmap_fd`](host_driver::HostFile::mmap_fd) of the file is a dup of it with
//! offset adjust 0, so a client's `mmap(addr, len, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_FIXED,
//! fd, addr)` (UVM's offset == VA rule) maps the bytes the simulated driver reads and writes
//! at `addr` ([`SimDriver::uvm_read`], [`SimDriver::uvm_write`], semaphore releases).
//!
//! The driver learns of a client's mapping in its `mmap` handler and creates a *managed*
//! va_range for it. The simulator has no `mmap` handler (the client maps a memfd), so it
//! reads the kernel's VMA list instead: a managed range is a `MAP_SHARED` read-write mapping
//! of the va_space's memfd at an address equal to its file offset, in any process whose
//! `/proc/<pid>/maps` the simulator can read. Mappings that break the rule (offset ≠ VA,
//! private or read-only), which the driver's `uvm_mmap` would have refused with `EINVAL`,
//! are simply not ranges.
//!
//! # What is modelled
//! `INITIALIZE` (flag validation, a second call with the same flags is `NV_OK`, other flags
//! or an mm file `NV_ERR_INVALID_ARGUMENT`), `MM_INITIALIZE` (`NV_WARN_NOTHING_TO_DO` in
//! multi-process sharing mode), `PAGEABLE_MEM_ACCESS` (false in multi-process sharing mode or
//! with `DISABLE_HMM`: HMM needs the va_space's mm), `PAGEABLE_MEM_ACCESS_ON_GPU`,
//! `REGISTER_GPU` / `UNREGISTER_GPU` (the UUID must be a configured GPU, the calling process
//! must hold its node open), `REGISTER_GPU_VASPACE` / `UNREGISTER_GPU_VASPACE` (an RM
//! `FERMI_VASPACE_A` of that GPU), `REGISTER_CHANNEL` (a channel of the GPU VA space's RM VA space;
//! no context buffers, so no channel VA range) / `UNREGISTER_CHANNEL`,
//! `ENABLE/DISABLE_PEER_ACCESS` (PCIe peers; every pair of simulated GPUs can peer),
//! range groups, `CREATE_EXTERNAL_RANGE`, `MAP_EXTERNAL_ALLOCATION` (an RM memory object),
//! `UNMAP_EXTERNAL`, `MAP_DYNAMIC_PARALLELISM_REGION`, `ALLOC_SEMAPHORE_POOL`, `FREE`,
//! `VALIDATE_VA_RANGE`, and the policy commands (`SET/UNSET_PREFERRED_LOCATION`,
//! `SET/UNSET_ACCESSED_BY`, `ENABLE/DISABLE_READ_DUPLICATION`) and `MIGRATE` with their
//! argument, range and processor checks; their effect (residency, mappings on the GPU) has
//! nothing to show without a GPU, except `MIGRATE`'s semaphore release, which is written.
//!
//! # What is not
//! `SET_RANGE_GROUP` checks its range and group as the driver does (membership itself is not
//! kept: only range-group migration reads it), `MIGRATE_RANGE_GROUP` answers
//! `NV_ERR_NOT_SUPPORTED`; HMM/ATS
//! (pageable memory: only managed ranges are ranges); `rmCtrlFd` is not read (nor is it by the
//! driver: "Bug 1624521" in `uvm_va_space.c`); `hClient`/`hSmcPartRef` of `REGISTER_GPU` are
//! not read (the driver reads them for MIG partitions only); RM object references that the
//! driver's dups would hold (an RM free does not see the UVM registration).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io;
use std::mem::offset_of;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, MetadataExt};

use host_driver::{HostCall, NodeKind};
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::driver::{Kind, SimDriver, State};
use crate::status::*;
use crate::uvm_state::{FdState, Range, RangeKind, RegGpu, VaSpace};
use nvproxy_abi::class::FERMI_VASPACE_A;

/// `NV_WARN_NOTHING_TO_DO`.
const NV_WARN_NOTHING_TO_DO: u32 = 0x0001_0006;

/// Size of a va_space's memfd: every user address below 2^47 (x86_64 4-level paging) is an
/// offset inside it.
pub const UVM_MEMFD_SIZE: u64 = 1 << 47;

/// `PAGE_SIZE`, the alignment `uvm_api_range_invalid` asks for.
const PAGE: u64 = 4096;

/// `NV_PROCESSOR_UUID_CPU_DEFAULT` (`nvCpuUuid.c`).
const CPU_UUID: [u8; 16] = [
    0xa6, 0x5e, 0x0f, 0x4e, 0xd7, 0xd4, 0x7b, 0xa2, 0x50, 0x47, 0x41, 0x2c, 0x14, 0x2a, 0x77, 0x73,
];

/// `EBADFD`: the driver's `uvm_mmap` on a file without a va_space.
const EBADFD: i32 = 77;

/// Whether `[base, base + length)` is a valid user range with `align` alignment
/// (`uvm_api_range_invalid_aligned`).
fn range_ok(base: u64, length: u64, align: u64) -> bool {
    base.is_multiple_of(align)
        && length.is_multiple_of(align)
        && base != 0
        && length != 0
        && base.checked_add(length).is_some()
}

/// The client mappings of a memfd that are managed ranges (see the module docs), as
/// `[start, end)`, sorted.
fn managed_ranges(memfd: &File) -> Vec<(u64, u64)> {
    let Ok(meta) = memfd.metadata() else {
        return Vec::new();
    };
    let (dev, ino) = (meta.dev(), meta.ino());
    // gnu_dev_major / gnu_dev_minor
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let want_dev = format!("{major:02x}:{minor:02x}");
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(maps) = std::fs::read_to_string(p.path().join("maps")) else {
            continue;
        };
        for line in maps.lines() {
            let mut it = line.split_whitespace();
            let (Some(range), Some(perms), Some(off), Some(d), Some(i)) =
                (it.next(), it.next(), it.next(), it.next(), it.next())
            else {
                continue;
            };
            if i.parse::<u64>().ok() != Some(ino) || d != want_dev || perms.get(..4) != Some("rw-s")
            {
                continue;
            }
            let Some((s, e)) = range.split_once('-') else {
                continue;
            };
            let (Ok(s), Ok(e), Ok(off)) = (
                u64::from_str_radix(s, 16),
                u64::from_str_radix(e, 16),
                u64::from_str_radix(off, 16),
            ) else {
                continue;
            };
            if s == off {
                out.push((s, e));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// `uvm_api_range_type_check` without HMM/ATS: the range is valid and covered, without a
/// gap, by managed ranges.
fn managed_covered(vs: &VaSpace, base: u64, length: u64) -> bool {
    if !range_ok(base, length, PAGE) {
        return false;
    }
    let end = base + length;
    let mut at = base;
    for (s, e) in managed_ranges(&vs.memfd) {
        if s <= at && at < e {
            at = e;
            if at >= end {
                return true;
            }
        }
    }
    false
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

fn get<T: FromBytes>(call: &HostCall) -> T {
    T::read_from_bytes(&call.params).expect("size checked by the caller")
}

fn put<T: IntoBytes + Immutable>(call: &mut HostCall, p: &T) {
    call.params.copy_from_slice(p.as_bytes());
}

/// One ioctl on UVM file `file`.
pub(crate) fn ioctl(drv: &SimDriver, file: i32, call: &mut HostCall) -> io::Result<i32> {
    if call.cmd == UVM_DEINITIALIZE {
        return Ok(0);
    }
    let Some(spec) = drv.abi.uvm.get(&call.cmd) else {
        return Err(errno(EINVAL));
    };
    if call.params.len() != spec.param_size as usize {
        return Err(errno(EFAULT));
    }
    let Some(status_off) = status_offset(drv, call.cmd, call.params.len()) else {
        return Err(errno(EINVAL));
    };
    let mut st = drv.lock();
    if !st.files.contains_key(&file) {
        return Err(errno(EBADF));
    }
    let status = match call.cmd {
        UVM_INITIALIZE => initialize(&mut st, file, call),
        UVM_MM_INITIALIZE => mm_initialize(drv, &mut st, file, call),
        cmd => {
            let uvm = st.uvm.entry(file).or_default();
            if !matches!(uvm.state, FdState::VaSpace(_)) {
                NV_ERR_ILLEGAL_ACTION
            } else {
                va_space_cmd(drv, &mut st, file, cmd, call)
            }
        }
    };
    call.params[status_off..status_off + 4].copy_from_slice(&status.to_ne_bytes());
    Ok(0)
}

/// Where `rmStatus` sits in command `cmd`'s params of `size` bytes.
fn status_offset(drv: &SimDriver, cmd: u32, size: usize) -> Option<usize> {
    macro_rules! at {
        ($($t:ty),+) => {{
            let mut off = None;
            $(if off.is_none() && size == size_of::<$t>() {
                off = Some(offset_of!($t, rmStatus));
            })+
            off
        }};
    }
    match cmd {
        UVM_INITIALIZE => at!(UVM_INITIALIZE_PARAMS),
        UVM_MM_INITIALIZE => at!(UVM_MM_INITIALIZE_PARAMS),
        UVM_CREATE_RANGE_GROUP => at!(UVM_CREATE_RANGE_GROUP_PARAMS),
        UVM_DESTROY_RANGE_GROUP => at!(UVM_DESTROY_RANGE_GROUP_PARAMS),
        UVM_REGISTER_GPU_VASPACE => at!(UVM_REGISTER_GPU_VASPACE_PARAMS),
        UVM_UNREGISTER_GPU_VASPACE => at!(UVM_UNREGISTER_GPU_VASPACE_PARAMS),
        UVM_REGISTER_CHANNEL => at!(UVM_REGISTER_CHANNEL_PARAMS),
        UVM_UNREGISTER_CHANNEL => {
            at!(
                UVM_UNREGISTER_CHANNEL_PARAMS,
                UVM_UNREGISTER_CHANNEL_PARAMS_V590
            )
        }
        UVM_ENABLE_PEER_ACCESS => at!(UVM_ENABLE_PEER_ACCESS_PARAMS),
        UVM_DISABLE_PEER_ACCESS => at!(UVM_DISABLE_PEER_ACCESS_PARAMS),
        UVM_SET_RANGE_GROUP => at!(UVM_SET_RANGE_GROUP_PARAMS),
        UVM_MAP_EXTERNAL_ALLOCATION => at!(
            UVM_MAP_EXTERNAL_ALLOCATION_PARAMS,
            UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550
        ),
        UVM_FREE => at!(UVM_FREE_PARAMS, UVM_FREE_PARAMS_V590),
        UVM_REGISTER_GPU => at!(UVM_REGISTER_GPU_PARAMS),
        UVM_UNREGISTER_GPU => at!(UVM_UNREGISTER_GPU_PARAMS),
        UVM_PAGEABLE_MEM_ACCESS => at!(UVM_PAGEABLE_MEM_ACCESS_PARAMS),
        UVM_SET_PREFERRED_LOCATION if uvm_preferred_location_v550(&drv.abi) => {
            at!(UVM_SET_PREFERRED_LOCATION_PARAMS_V550)
        }
        UVM_SET_PREFERRED_LOCATION => at!(UVM_SET_PREFERRED_LOCATION_PARAMS),
        UVM_UNSET_PREFERRED_LOCATION => at!(UVM_UNSET_PREFERRED_LOCATION_PARAMS),
        UVM_ENABLE_READ_DUPLICATION => at!(UVM_ENABLE_READ_DUPLICATION_PARAMS),
        UVM_DISABLE_READ_DUPLICATION => at!(UVM_DISABLE_READ_DUPLICATION_PARAMS),
        UVM_SET_ACCESSED_BY => at!(UVM_SET_ACCESSED_BY_PARAMS),
        UVM_UNSET_ACCESSED_BY => at!(UVM_UNSET_ACCESSED_BY_PARAMS),
        UVM_MIGRATE => at!(UVM_MIGRATE_PARAMS),
        UVM_MIGRATE_RANGE_GROUP => at!(UVM_MIGRATE_RANGE_GROUP_PARAMS),
        UVM_MAP_DYNAMIC_PARALLELISM_REGION => at!(UVM_MAP_DYNAMIC_PARALLELISM_REGION_PARAMS),
        UVM_UNMAP_EXTERNAL => at!(UVM_UNMAP_EXTERNAL_PARAMS),
        UVM_ALLOC_SEMAPHORE_POOL => at!(
            UVM_ALLOC_SEMAPHORE_POOL_PARAMS,
            UVM_ALLOC_SEMAPHORE_POOL_PARAMS_V550
        ),
        UVM_PAGEABLE_MEM_ACCESS_ON_GPU => at!(UVM_PAGEABLE_MEM_ACCESS_ON_GPU_PARAMS),
        UVM_VALIDATE_VA_RANGE => at!(UVM_VALIDATE_VA_RANGE_PARAMS),
        UVM_CREATE_EXTERNAL_RANGE => at!(UVM_CREATE_EXTERNAL_RANGE_PARAMS),
        _ => None,
    }
}

fn initialize(st: &mut State, file: i32, call: &mut HostCall) -> u32 {
    let p: UVM_INITIALIZE_PARAMS = get(call);
    let uvm = st.uvm.entry(file).or_default();
    match &uvm.state {
        FdState::Uninitialized => {
            if p.flags & !UVM_INIT_FLAGS_MASK != 0 {
                return NV_ERR_INVALID_ARGUMENT;
            }
            let memfd = match new_memfd() {
                Ok(f) => f,
                Err(_) => return NV_ERR_NO_MEMORY,
            };
            uvm.state = FdState::VaSpace(Box::new(VaSpace {
                flags: p.flags,
                memfd,
                mm_alive: false,
                gpus: BTreeMap::new(),
                peers: BTreeSet::new(),
                channels: BTreeSet::new(),
                range_groups: BTreeSet::new(),
                range_group_counter: 0,
                ranges: BTreeMap::new(),
            }));
            NV_OK
        }
        FdState::VaSpace(vs) if vs.flags == p.flags => NV_OK,
        FdState::VaSpace(_) | FdState::Mm { .. } => NV_ERR_INVALID_ARGUMENT,
    }
}

fn new_memfd() -> io::Result<File> {
    let fd =
        nix::sys::memfd::memfd_create(c"nvsim-uvm", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)
            .map_err(io::Error::from)?;
    let f = File::from(fd);
    f.set_len(UVM_MEMFD_SIZE)?;
    Ok(f)
}

/// `uvm_api_mm_initialize`.
fn mm_initialize(drv: &SimDriver, st: &mut State, file: i32, call: &mut HostCall) -> u32 {
    let p: UVM_MM_INITIALIZE_PARAMS = get(call);
    let target = p.uvmFd;
    if drv.file_node(st, target) != Some(NodeKind::Uvm) {
        return NV_ERR_INVALID_ARGUMENT;
    }
    let Some(FdState::VaSpace(vs)) = st.uvm.get(&target).map(|u| &u.state) else {
        return NV_ERR_INVALID_ARGUMENT;
    };
    if !vs.mm_enabled() {
        return NV_WARN_NOTHING_TO_DO;
    }
    if !matches!(
        st.uvm.get(&file).map(|u| &u.state),
        None | Some(FdState::Uninitialized)
    ) {
        return NV_ERR_IN_USE;
    }
    let Some(FdState::VaSpace(vs)) = st.uvm.get_mut(&target).map(|u| &mut u.state) else {
        unreachable!("checked above");
    };
    if vs.mm_alive {
        return NV_ERR_INVALID_STATE;
    }
    vs.mm_alive = true;
    st.uvm.entry(file).or_default().state = FdState::Mm {
        va_space_file: target,
    };
    if let Some(f) = st.files.get_mut(&target) {
        f.holders += 1;
    }
    NV_OK
}

fn va_space(st: &mut State, file: i32) -> &mut VaSpace {
    match st.uvm.get_mut(&file).map(|u| &mut u.state) {
        Some(FdState::VaSpace(vs)) => vs,
        _ => unreachable!("the caller checked the va_space"),
    }
}

/// The registered GPU with this UUID.
fn registered(drv: &SimDriver, vs: &VaSpace, uuid: &[u8; 16]) -> Option<usize> {
    drv.config
        .gpus
        .iter()
        .position(|g| &g.uuid == uuid)
        .filter(|g| vs.gpus.contains_key(g))
}

/// The registered GPU with a GPU VA space (`uvm_va_space_get_gpu_by_uuid_with_gpu_va_space`).
fn with_gpu_va_space(drv: &SimDriver, vs: &VaSpace, uuid: &[u8; 16]) -> Option<usize> {
    registered(drv, vs, uuid).filter(|g| vs.gpus[g].va_space.is_some())
}

/// CPU or a registered GPU: `Some(None)` for the CPU.
fn processor(drv: &SimDriver, vs: &VaSpace, uuid: &[u8; 16]) -> Option<Option<usize>> {
    if uuid == &CPU_UUID {
        Some(None)
    } else {
        registered(drv, vs, uuid).map(Some)
    }
}

fn va_space_cmd(drv: &SimDriver, st: &mut State, file: i32, cmd: u32, call: &mut HostCall) -> u32 {
    match cmd {
        UVM_PAGEABLE_MEM_ACCESS => {
            let mut p: UVM_PAGEABLE_MEM_ACCESS_PARAMS = get(call);
            p.pageableMemAccess = u8::from(va_space(st, file).pageable_mem_access());
            put(call, &p);
            NV_OK
        }
        UVM_PAGEABLE_MEM_ACCESS_ON_GPU => {
            let mut p: UVM_PAGEABLE_MEM_ACCESS_ON_GPU_PARAMS = get(call);
            let vs = va_space(st, file);
            if registered(drv, vs, &p.gpu_uuid.uuid).is_none() {
                return NV_ERR_INVALID_DEVICE;
            }
            // Hopper has replayable faults: the va_space's answer decides.
            p.pageableMemAccess = u8::from(vs.pageable_mem_access());
            put(call, &p);
            NV_OK
        }
        UVM_REGISTER_GPU => register_gpu(drv, st, file, call),
        UVM_UNREGISTER_GPU => {
            let p: UVM_UNREGISTER_GPU_PARAMS = get(call);
            let vs = va_space(st, file);
            let Some(g) = registered(drv, vs, &p.gpu_uuid.uuid) else {
                return NV_ERR_INVALID_DEVICE;
            };
            unregister_gpu(vs, g);
            NV_OK
        }
        UVM_REGISTER_GPU_VASPACE => register_gpu_va_space(drv, st, file, call),
        UVM_UNREGISTER_GPU_VASPACE => {
            let p: UVM_UNREGISTER_GPU_VASPACE_PARAMS = get(call);
            let vs = va_space(st, file);
            let Some(g) = with_gpu_va_space(drv, vs, &p.gpuUuid.uuid) else {
                return NV_ERR_INVALID_DEVICE;
            };
            drop_gpu_va_space(vs, g);
            NV_OK
        }
        UVM_REGISTER_CHANNEL => {
            let p: UVM_REGISTER_CHANNEL_PARAMS = get(call);
            let vs = va_space(st, file);
            let Some(g) = with_gpu_va_space(drv, vs, &p.gpuUuid.uuid) else {
                return NV_ERR_INVALID_DEVICE;
            };
            let (vas_client, vas_handle) = vs.gpus[&g].va_space.expect("checked above");
            // nvUvmInterfaceRetainChannel -> nvGpuOpsVerifyChannel: a channel of the client,
            // in the GPU VA space's RM VA space.
            let Some(client) = st.clients.get(&p.hClient) else {
                return NV_ERR_INVALID_CLIENT;
            };
            let Some(crate::driver::Kind::Channel { id, .. }) =
                client.objects().get(&p.hChannel).map(|o| &o.kind)
            else {
                return NV_ERR_INVALID_OBJECT_HANDLE;
            };
            let Some(ch) = st.fifo.channels.get(id) else {
                return NV_ERR_INVALID_OBJECT_HANDLE;
            };
            let rm_vas = |h_client: u32, h: u32| match st
                .clients
                .get(&h_client)
                .and_then(|c| c.objects().get(&h))
                .map(|o| &o.kind)
            {
                Some(crate::driver::Kind::VaSpace { id, .. }) => Some(*id),
                _ => None,
            };
            if ch.gpu != g {
                return NV_ERR_OTHER_DEVICE_FOUND;
            }
            if rm_vas(ch.h_client, ch.h_vaspace) != rm_vas(vas_client, vas_handle) {
                return NV_ERR_INVALID_CHANNEL;
            }
            // uvm_register_channel_under_write: a handle pair registers once. The channel's
            // resources to map (get_rm_channel_resources) are its engine context buffers; the
            // simulated driver allocates none (GR_GET_CTX_BUFFER_SIZE says 0), so, as for CE
            // channels on a real GPU, base and length are not used and no range is created.
            let vs = va_space(st, file);
            if !vs.channels.insert((p.hClient, p.hChannel)) {
                return NV_ERR_INVALID_CHANNEL;
            }
            NV_OK
        }
        UVM_UNREGISTER_CHANNEL => {
            let (h_client, h_channel) =
                if call.params.len() == size_of::<UVM_UNREGISTER_CHANNEL_PARAMS>() {
                    let p: UVM_UNREGISTER_CHANNEL_PARAMS = get(call);
                    (p.hClient, p.hChannel)
                } else {
                    let p: UVM_UNREGISTER_CHANNEL_PARAMS_V590 = get(call);
                    (p.hClient, p.hChannel)
                };
            if va_space(st, file).channels.remove(&(h_client, h_channel)) {
                NV_OK
            } else {
                NV_ERR_INVALID_CHANNEL
            }
        }
        UVM_ENABLE_PEER_ACCESS | UVM_DISABLE_PEER_ACCESS => {
            let p: UVM_ENABLE_PEER_ACCESS_PARAMS = get(call);
            let vs = va_space(st, file);
            let (Some(a), Some(b)) = (
                registered(drv, vs, &p.gpuUuidA.uuid),
                registered(drv, vs, &p.gpuUuidB.uuid),
            ) else {
                return NV_ERR_INVALID_DEVICE;
            };
            if a == b {
                return NV_ERR_INVALID_DEVICE;
            }
            let pair = (a.min(b), a.max(b));
            let enable = cmd == UVM_ENABLE_PEER_ACCESS;
            // Enabling twice, or disabling peers that are not enabled: NV_ERR_INVALID_DEVICE.
            let changed = if enable {
                vs.peers.insert(pair)
            } else {
                vs.peers.remove(&pair)
            };
            if changed {
                NV_OK
            } else {
                NV_ERR_INVALID_DEVICE
            }
        }
        UVM_CREATE_RANGE_GROUP => {
            let mut p: UVM_CREATE_RANGE_GROUP_PARAMS = get(call);
            let vs = va_space(st, file);
            vs.range_group_counter += 1;
            vs.range_groups.insert(vs.range_group_counter);
            p.rangeGroupId = vs.range_group_counter;
            put(call, &p);
            NV_OK
        }
        UVM_DESTROY_RANGE_GROUP => {
            let p: UVM_DESTROY_RANGE_GROUP_PARAMS = get(call);
            if va_space(st, file).range_groups.remove(&p.rangeGroupId) {
                NV_OK
            } else {
                NV_ERR_OBJECT_NOT_FOUND
            }
        }
        UVM_CREATE_EXTERNAL_RANGE => {
            let p: UVM_CREATE_EXTERNAL_RANGE_PARAMS = get(call);
            create_range(
                va_space(st, file),
                p.base,
                p.length,
                RangeKind::External {
                    mapped: BTreeMap::new(),
                },
            )
        }
        UVM_MAP_EXTERNAL_ALLOCATION => map_external(drv, st, file, call),
        UVM_UNMAP_EXTERNAL => {
            let p: UVM_UNMAP_EXTERNAL_PARAMS = get(call);
            let vs = va_space(st, file);
            if !range_ok(p.base, p.length, PAGE) {
                return NV_ERR_INVALID_ADDRESS;
            }
            let Some(g) = with_gpu_va_space(drv, vs, &p.gpuUuid.uuid) else {
                return NV_ERR_INVALID_DEVICE;
            };
            let Some((start, _)) = vs.range_at(p.base) else {
                return NV_ERR_INVALID_ADDRESS;
            };
            match vs.ranges.get_mut(&start).map(|r| &mut r.kind) {
                Some(RangeKind::External { mapped })
                    if mapped
                        .get(&g)
                        .is_some_and(|m| (m.0, m.1) == (p.base, p.base + p.length)) =>
                {
                    mapped.remove(&g);
                    NV_OK
                }
                _ => NV_ERR_INVALID_ADDRESS,
            }
        }
        UVM_MAP_DYNAMIC_PARALLELISM_REGION => {
            let p: UVM_MAP_DYNAMIC_PARALLELISM_REGION_PARAMS = get(call);
            let vs = va_space(st, file);
            if !range_ok(p.base, p.length, PAGE) {
                return NV_ERR_INVALID_ADDRESS;
            }
            if with_gpu_va_space(drv, vs, &p.gpuUuid.uuid).is_none() {
                return NV_ERR_INVALID_DEVICE;
            }
            create_range(vs, p.base, p.length, RangeKind::Sked)
        }
        UVM_ALLOC_SEMAPHORE_POOL => alloc_semaphore_pool(drv, st, file, call),
        UVM_FREE => {
            let (base, length) = if call.params.len() == size_of::<UVM_FREE_PARAMS>() {
                let p: UVM_FREE_PARAMS = get(call);
                (p.base, Some(p.length))
            } else {
                let p: UVM_FREE_PARAMS_V590 = get(call);
                (p.base, None)
            };
            free(va_space(st, file), base, length)
        }
        UVM_VALIDATE_VA_RANGE => {
            let p: UVM_VALIDATE_VA_RANGE_PARAMS = get(call);
            let vs = va_space(st, file);
            let end = p.base.wrapping_add(p.length);
            let exact_ioctl = vs.ranges.get(&p.base).is_some_and(|r| r.end == end);
            let exact_managed = managed_ranges(&vs.memfd).contains(&(p.base, end));
            if exact_ioctl || exact_managed {
                NV_OK
            } else {
                NV_ERR_INVALID_ADDRESS
            }
        }
        UVM_SET_PREFERRED_LOCATION => {
            let (base, length, uuid, nid) = if uvm_preferred_location_v550(&drv.abi) {
                let p: UVM_SET_PREFERRED_LOCATION_PARAMS_V550 = get(call);
                let l = p.preferredLocation.uuid;
                (p.requestedBase, p.length, l, p.preferredCpuNumaNode)
            } else {
                let p: UVM_SET_PREFERRED_LOCATION_PARAMS = get(call);
                (p.requestedBase, p.length, p.preferredLocation.uuid, -1)
            };
            let status = policy(drv, va_space(st, file), base, length, Some(&uuid));
            // 550+: a CPU NUMA node must be -1 or a node with memory (the simulated host has
            // one, node 0).
            if status == NV_OK && uuid == CPU_UUID && !matches!(nid, -1 | 0) {
                return NV_ERR_INVALID_ARGUMENT;
            }
            status
        }
        UVM_SET_ACCESSED_BY | UVM_UNSET_ACCESSED_BY => {
            let p: UVM_SET_ACCESSED_BY_PARAMS = get(call);
            policy(
                drv,
                va_space(st, file),
                p.requestedBase,
                p.length,
                Some(&p.accessedByUuid.uuid),
            )
        }
        UVM_UNSET_PREFERRED_LOCATION
        | UVM_ENABLE_READ_DUPLICATION
        | UVM_DISABLE_READ_DUPLICATION => {
            let p: UVM_UNSET_PREFERRED_LOCATION_PARAMS = get(call);
            policy(drv, va_space(st, file), p.requestedBase, p.length, None)
        }
        UVM_MIGRATE => migrate(drv, va_space(st, file), call),
        UVM_SET_RANGE_GROUP => {
            // uvm_api_set_range_group (uvm_range_group.c, 535.261.03 :295-373): an unaligned
            // or empty range is NV_ERR_INVALID_ADDRESS, an unknown group other than
            // UVM_RANGE_GROUP_ID_NONE (0) NV_ERR_OBJECT_NOT_FOUND, a range not covered end to
            // end by managed ranges NV_ERR_INVALID_ADDRESS. Groups are created migratable
            // and nothing here prevents migration (no PREVENT_MIGRATION_RANGE_GROUPS), so
            // the assignment migrates nothing; membership is read only by range-group
            // migration, which is not simulated.
            let p: UVM_SET_RANGE_GROUP_PARAMS = get(call);
            let vs = va_space(st, file);
            if !range_ok(p.requestedBase, p.length, PAGE) {
                NV_ERR_INVALID_ADDRESS
            } else if p.rangeGroupId != 0 && !vs.range_groups.contains(&p.rangeGroupId) {
                NV_ERR_OBJECT_NOT_FOUND
            } else if !managed_covered(vs, p.requestedBase, p.length) {
                NV_ERR_INVALID_ADDRESS
            } else {
                NV_OK
            }
        }
        // Range-group migration is not simulated.
        UVM_MIGRATE_RANGE_GROUP => NV_ERR_NOT_SUPPORTED,
        _ => NV_ERR_NOT_SUPPORTED,
    }
}

/// `uvm_va_space_register_gpu`.
fn register_gpu(drv: &SimDriver, st: &mut State, file: i32, call: &mut HostCall) -> u32 {
    let mut p: UVM_REGISTER_GPU_PARAMS = get(call);
    // nvUvmInterfaceRegisterGpu: a UUID no GPU of the system has.
    let Some(g) = drv
        .config
        .gpus
        .iter()
        .position(|c| c.uuid == p.gpu_uuid.uuid)
    else {
        return NV_ERR_GPU_UUID_NOT_FOUND;
    };
    // nvGpuOpsGetGpuInfo: osIsGpuAccessible, the calling process holds the GPU's node open.
    if !drv.gpu_accessible(st, g) {
        return NV_ERR_INSUFFICIENT_PERMISSIONS;
    }
    let vs = va_space(st, file);
    if vs.gpus.contains_key(&g) {
        return NV_ERR_INVALID_DEVICE;
    }
    vs.gpus.insert(g, RegGpu::default());
    p.numaEnabled = 0;
    p.numaNodeId = u32::MAX; // -1: no GPU memory NUMA node on a PCIe/SXM x86 host
    put(call, &p);
    NV_OK
}

fn unregister_gpu(vs: &mut VaSpace, g: usize) {
    drop_gpu_va_space(vs, g);
    vs.gpus.remove(&g);
    vs.peers.retain(|&(a, b)| a != g && b != g);
}

/// Unregistering a GPU VA space destroys its channels and the GPU's external mappings.
fn drop_gpu_va_space(vs: &mut VaSpace, g: usize) {
    if let Some(r) = vs.gpus.get_mut(&g) {
        r.va_space = None;
    }
    for r in vs.ranges.values_mut() {
        if let RangeKind::External { mapped } = &mut r.kind {
            mapped.remove(&g);
        }
    }
}

/// `uvm_va_space_register_gpu_va_space`.
fn register_gpu_va_space(drv: &SimDriver, st: &mut State, file: i32, call: &mut HostCall) -> u32 {
    let p: UVM_REGISTER_GPU_VASPACE_PARAMS = get(call);
    let Some(g) = registered(drv, va_space(st, file), &p.gpuUuid.uuid) else {
        return NV_ERR_INVALID_DEVICE;
    };
    // create_gpu_va_space dups the RM VA space: the client and object must exist.
    let Some(client) = st.clients.get(&p.hClient) else {
        return NV_ERR_INVALID_CLIENT;
    };
    let Some(obj) = client.objects().get(&p.hVaSpace) else {
        return NV_ERR_OBJECT_NOT_FOUND;
    };
    match obj.kind {
        Kind::VaSpace { gpu, .. } if obj.class == FERMI_VASPACE_A && gpu == g => {}
        Kind::VaSpace { .. } => return NV_ERR_INVALID_DEVICE,
        _ => return NV_ERR_INVALID_ARGUMENT,
    }
    let vs = va_space(st, file);
    let reg = vs.gpus.get_mut(&g).expect("registered");
    if reg.va_space.is_some() {
        return NV_ERR_INVALID_DEVICE;
    }
    reg.va_space = Some((p.hClient, p.hVaSpace));
    NV_OK
}

/// A range created by an ioctl; collisions with any range or client mapping are
/// `NV_ERR_UVM_ADDRESS_IN_USE` (`uvm_va_range_create_*` → `uvm_range_tree_add`).
fn create_range(vs: &mut VaSpace, base: u64, length: u64, kind: RangeKind) -> u32 {
    if !range_ok(base, length, PAGE) {
        return NV_ERR_INVALID_ADDRESS;
    }
    let end = base + length;
    if vs.overlaps_ioctl_range(base, end)
        || managed_ranges(&vs.memfd)
            .iter()
            .any(|&(s, e)| s < end && base < e)
    {
        return NV_ERR_UVM_ADDRESS_IN_USE;
    }
    vs.ranges.insert(base, Range { end, kind });
    NV_OK
}

/// `uvm_map_external_allocation`.
fn map_external(drv: &SimDriver, st: &mut State, file: i32, call: &mut HostCall) -> u32 {
    macro_rules! go {
        ($t:ty) => {{
            let p: $t = get(call);
            (
                p.base,
                p.length,
                p.offset,
                p.gpuAttributesCount,
                p.perGpuAttributes
                    .iter()
                    .take(usize::try_from(p.gpuAttributesCount).unwrap_or(usize::MAX))
                    .map(|a| a.gpuUuid.uuid)
                    .collect::<Vec<_>>(),
                p.perGpuAttributes.len() as u64,
                p.hClient,
                p.hMemory,
            )
        }};
    }
    let (base, length, offset, count, uuids, max, h_client, h_memory) =
        if call.params.len() == size_of::<UVM_MAP_EXTERNAL_ALLOCATION_PARAMS>() {
            go!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS)
        } else {
            go!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550)
        };
    if !range_ok(base, length, PAGE) {
        return NV_ERR_INVALID_ADDRESS;
    }
    if count == 0 || count > max {
        return NV_ERR_INVALID_ARGUMENT;
    }
    let end = base + length;
    {
        let vs = va_space(st, file);
        match vs.range_at(base) {
            Some((_, r)) if matches!(r.kind, RangeKind::External { .. }) && end <= r.end => {}
            _ => return NV_ERR_INVALID_ADDRESS,
        }
    }
    let mut gpus = Vec::new();
    for u in &uuids {
        let Some(g) = with_gpu_va_space(drv, va_space(st, file), u) else {
            return NV_ERR_INVALID_DEVICE;
        };
        gpus.push(g);
    }
    // nvUvmInterfaceDupMemory: the client and its memory object must exist.
    let Some(client) = st.clients.get(&h_client) else {
        return NV_ERR_INVALID_CLIENT;
    };
    let Some(obj) = client.objects().get(&h_memory) else {
        return NV_ERR_OBJECT_NOT_FOUND;
    };
    let Kind::Memory { block } = obj.kind else {
        return NV_ERR_INVALID_ARGUMENT;
    };
    let bytes = st.blocks.get(&block).map_or(0, |b| b.bytes);
    if offset.checked_add(length).is_none_or(|e| e > bytes) {
        return NV_ERR_INVALID_ARGUMENT;
    }
    let vs = va_space(st, file);
    let start = vs.range_at(base).map(|(s, _)| s).expect("checked above");
    if let Some(RangeKind::External { mapped }) = vs.ranges.get_mut(&start).map(|r| &mut r.kind) {
        for g in gpus {
            mapped.insert(g, (base, end, block, offset));
        }
    }
    NV_OK
}

/// `uvm_api_alloc_semaphore_pool`.
fn alloc_semaphore_pool(drv: &SimDriver, st: &mut State, file: i32, call: &mut HostCall) -> u32 {
    macro_rules! go {
        ($t:ty) => {{
            let p: $t = get(call);
            (
                p.base,
                p.length,
                p.gpuAttributesCount,
                p.perGpuAttributes
                    .iter()
                    .take(usize::try_from(p.gpuAttributesCount).unwrap_or(usize::MAX))
                    .map(|a| a.gpuUuid.uuid)
                    .collect::<Vec<_>>(),
                p.perGpuAttributes.len() as u64,
            )
        }};
    }
    let (base, length, count, uuids, max) =
        if call.params.len() == size_of::<UVM_ALLOC_SEMAPHORE_POOL_PARAMS>() {
            go!(UVM_ALLOC_SEMAPHORE_POOL_PARAMS)
        } else {
            go!(UVM_ALLOC_SEMAPHORE_POOL_PARAMS_V550)
        };
    // Past the end of the process's address space (the va_space memfd spans it) there is
    // nothing to map: the driver's VA range checks answer NV_ERR_INVALID_ADDRESS.
    if !range_ok(base, length, PAGE) || base.saturating_add(length) > UVM_MEMFD_SIZE {
        return NV_ERR_INVALID_ADDRESS;
    }
    if count > max {
        return NV_ERR_INVALID_ARGUMENT;
    }
    let vs = va_space(st, file);
    for u in &uuids {
        if registered(drv, vs, u).is_none() {
            return NV_ERR_INVALID_DEVICE;
        }
    }
    let status = create_range(vs, base, length, RangeKind::SemaphorePool);
    if status == NV_OK {
        // The pool is zeroed memory (it may be mapped by the client).
        let _ = zero(&vs.memfd, base, length);
    }
    status
}

/// Zeroes `length` bytes at `base` by punching a hole: the range reads as zeros and holds no
/// memory until it is written (writing zeros would allocate every page, so one tenant ioctl
/// could fill the host's memory: fuzz finding F1, `fuzz/regressions/README.md`).
fn zero(memfd: &File, base: u64, length: u64) -> io::Result<()> {
    use nix::fcntl::{FallocateFlags, fallocate};
    let (Ok(off), Ok(len)) = (i64::try_from(base), i64::try_from(length)) else {
        return Err(io::Error::from_raw_os_error(
            nix::errno::Errno::EINVAL as i32,
        ));
    };
    use std::os::fd::AsRawFd;
    fallocate(
        memfd.as_raw_fd(),
        FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
        off,
        len,
    )
    .map_err(io::Error::from)
}

/// `uvm_free` (`uvm_map_external.c` before 590, `uvm_va_range.c` since): ioctl-created ranges
/// only, found by their start; before 590 the length must match too.
fn free(vs: &mut VaSpace, base: u64, length: Option<u64>) -> u32 {
    if let Some(length) = length
        && !range_ok(base, length, PAGE)
    {
        return NV_ERR_INVALID_ADDRESS;
    }
    let Some(r) = vs.ranges.get(&base) else {
        return NV_ERR_INVALID_ADDRESS;
    };
    if length.is_some_and(|l| r.end != base + l) {
        return NV_ERR_INVALID_ADDRESS;
    }
    if r.kind == RangeKind::SemaphorePool
        && managed_ranges(&vs.memfd)
            .iter()
            .any(|&(s, e)| s < r.end && base < e)
    {
        // "Semaphore pools must be first unmapped from the CPU with munmap".
        return NV_ERR_INVALID_ARGUMENT;
    }
    vs.ranges.remove(&base);
    NV_OK
}

/// The policy commands: a managed range (`NV_ERR_INVALID_ADDRESS`), then the processor, the
/// CPU or a registered GPU (`NV_ERR_INVALID_DEVICE`).
fn policy(drv: &SimDriver, vs: &VaSpace, base: u64, length: u64, uuid: Option<&[u8; 16]>) -> u32 {
    if !managed_covered(vs, base, length) {
        return NV_ERR_INVALID_ADDRESS;
    }
    if let Some(u) = uuid
        && processor(drv, vs, u).is_none()
    {
        return NV_ERR_INVALID_DEVICE;
    }
    NV_OK
}

/// `uvm_api_migrate`.
fn migrate(drv: &SimDriver, vs: &mut VaSpace, call: &mut HostCall) -> u32 {
    const ASYNC: u32 = 0x1;
    const TEST_ALL: u32 = 0x2 | 0x4;
    const NO_GPU_VA_SPACE: u32 = 0x4;
    let p: UVM_MIGRATE_PARAMS = get(call);
    let synchronous = p.flags & ASYNC == 0;
    if (p.length > 0 || synchronous || p.semaphoreAddress == 0) && !range_ok(p.base, p.length, PAGE)
    {
        return NV_ERR_INVALID_ADDRESS;
    }
    if p.flags & !(ASYNC | TEST_ALL) != 0 || p.flags & TEST_ALL != 0 {
        // Test flags need uvm_enable_builtin_tests.
        return NV_ERR_INVALID_ARGUMENT;
    }
    if synchronous {
        if p.semaphoreAddress != 0 {
            return NV_ERR_INVALID_ARGUMENT;
        }
    } else if p.semaphoreAddress == 0 {
        if p.semaphorePayload != 0 {
            return NV_ERR_INVALID_ARGUMENT;
        }
    } else {
        let in_pool = vs
            .range_at(p.semaphoreAddress)
            .is_some_and(|(_, r)| r.kind == RangeKind::SemaphorePool);
        if !p.semaphoreAddress.is_multiple_of(4) || !in_pool {
            return NV_ERR_INVALID_ADDRESS;
        }
    }
    if p.destinationUuid.uuid != CPU_UUID {
        let g = if p.flags & NO_GPU_VA_SPACE != 0 {
            registered(drv, vs, &p.destinationUuid.uuid)
        } else {
            with_gpu_va_space(drv, vs, &p.destinationUuid.uuid)
        };
        if g.is_none() {
            return NV_ERR_INVALID_DEVICE;
        }
    }
    if p.length > 0 && !managed_covered(vs, p.base, p.length) {
        return NV_ERR_INVALID_ADDRESS;
    }
    // Residency is not observable here; the semaphore release is.
    if p.semaphoreAddress != 0 {
        let _ = vs
            .memfd
            .write_all_at(&p.semaphorePayload.to_ne_bytes(), p.semaphoreAddress);
    }
    NV_OK
}

/// The file `file` was released: drops its UVM state. Returns the va_space file an mm file
/// held, whose reference the caller drops.
pub(crate) fn file_released(st: &mut State, file: i32) -> Option<i32> {
    match st.uvm.remove(&file)?.state {
        FdState::Mm { va_space_file } => {
            if let Some(f) = st.files.get_mut(&va_space_file) {
                f.holders = f.holders.saturating_sub(1);
            }
            if let Some(FdState::VaSpace(vs)) = st.uvm.get_mut(&va_space_file).map(|u| &mut u.state)
            {
                vs.mm_alive = false;
            }
            Some(va_space_file)
        }
        _ => None,
    }
}

/// `(va_spaces, registered GPUs, ioctl-created ranges)` for [`SimStats`](crate::SimStats).
pub(crate) fn counts(st: &State) -> (usize, usize, usize) {
    let mut out = (0, 0, 0);
    for u in st.uvm.values() {
        if let FdState::VaSpace(vs) = &u.state {
            out.0 += 1;
            out.1 += vs.gpus.len();
            out.2 += vs.ranges.len();
        }
    }
    out
}

/// `HostFile::mmap_fd` of UVM file `file`: its va_space's memfd (offset == VA, adjust 0), or
/// `EBADFD` without a va_space (`uvm_mmap`: `uvm_fd_va_space` is NULL).
pub(crate) fn mmap_fd(drv: &SimDriver, file: i32) -> io::Result<(OwnedFd, u64)> {
    let st = drv.lock();
    match st.uvm.get(&file).map(|u| &u.state) {
        Some(FdState::VaSpace(vs)) => Ok((OwnedFd::from(vs.memfd.try_clone()?), 0)),
        _ => Err(errno(EBADFD)),
    }
}

impl SimDriver {
    fn with_memfd<T>(&self, file: i32, f: impl FnOnce(&File) -> io::Result<T>) -> io::Result<T> {
        let st = self.lock();
        match st.uvm.get(&file).map(|u| &u.state) {
            Some(FdState::VaSpace(vs)) => f(&vs.memfd),
            _ => Err(errno(EBADFD)),
        }
    }

    /// Reads `len` bytes at virtual address `va` of UVM file `file`'s va_space, as the
    /// simulated driver (or GPU) sees them: what clients wrote through their mappings.
    /// `EBADFD` for a file without a va_space.
    pub fn uvm_read(&self, file: i32, va: u64, len: usize) -> io::Result<Vec<u8>> {
        self.with_memfd(file, |m| {
            let mut buf = vec![0u8; len];
            m.read_exact_at(&mut buf, va)?;
            Ok(buf)
        })
    }

    /// Writes `data` at virtual address `va` of UVM file `file`'s va_space, as the simulated
    /// driver (or GPU) would: clients see it through their mappings.
    pub fn uvm_write(&self, file: i32, va: u64, data: &[u8]) -> io::Result<()> {
        self.with_memfd(file, |m| m.write_all_at(data, va))
    }

    /// The managed ranges of UVM file `file`'s va_space: client mappings of its memfd at
    /// VA == offset (see the `uvm` module docs), as `[start, end)`.
    pub fn uvm_managed_ranges(&self, file: i32) -> io::Result<Vec<(u64, u64)>> {
        self.with_memfd(file, |m| Ok(managed_ranges(m)))
    }
}

/// What GPU `gpu` sees through the UVM va_space that registered RM VA space `rm_vas` (a
/// `State::vaspaces` id) for it: the external mappings `(base, end, block, offset)`, and the
/// va_space's memfd (offset == VA) with its managed ranges (`[start, end)`), for the front end
/// (`gpfifo.rs`). `None` when no va_space registered that VA space for the GPU.
pub(crate) fn gpu_view(st: &State, gpu: usize, rm_vas: u64) -> Option<GpuView> {
    for u in st.uvm.values() {
        let FdState::VaSpace(vs) = &u.state else {
            continue;
        };
        let Some((h_client, h_vas)) = vs.gpus.get(&gpu).and_then(|r| r.va_space) else {
            continue;
        };
        let same = st
            .clients
            .get(&h_client)
            .and_then(|c| c.objects().get(&h_vas))
            .is_some_and(|o| matches!(o.kind, Kind::VaSpace { id, .. } if id == rm_vas));
        if !same {
            continue;
        }
        let external = vs
            .ranges
            .values()
            .filter_map(|r| match &r.kind {
                RangeKind::External { mapped } => mapped.get(&gpu).copied(),
                _ => None,
            })
            .collect();
        return Some(GpuView {
            external,
            memfd: vs.memfd.try_clone().ok(),
            managed: std::cell::OnceCell::new(),
        });
    }
    None
}

/// See [`gpu_view`].
#[derive(Debug)]
pub(crate) struct GpuView {
    pub external: Vec<(u64, u64, u64, u64)>,
    pub memfd: Option<File>,
    /// Read from `/proc/*/maps` when first needed (an address outside the external mappings).
    managed: std::cell::OnceCell<Vec<(u64, u64)>>,
}

impl GpuView {
    /// The managed ranges `[start, end)` of the va_space.
    pub(crate) fn managed(&self) -> &[(u64, u64)] {
        self.managed
            .get_or_init(|| self.memfd.as_ref().map(managed_ranges).unwrap_or_default())
    }
}
