//! The frontend: escapes on `/dev/nvidiactl` and `/dev/nvidia#` (`nv.c: nvidia_ioctl`,
//! `escape.c: RmIoctl`, `osapi.c`).
//!
//! Errno rules, as in the driver: an escape the driver does not know, a payload of the wrong
//! `_IOC_SIZE`, an escape on the wrong kind of node (control-only vs. GPU-only) and an RM-level
//! failure of the escape itself all fail the syscall with `EINVAL`; RM operations (alloc, free,
//! control, dup, share, OS events) succeed at the syscall level and report their NV status in
//! the params.

use std::io;

use host_driver::{HostCall, NodeKind};
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use zerocopy::FromZeros;

use crate::buf::{self, Loc, bytes, bytes_mut, child, read_at, write_at};
use crate::driver::{OsEvent, SimDriver, State};
use crate::rm::{self, AllocArgs};
use crate::status::*;

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// Escapes that exist in the driver but that the simulator does not implement: they pass the
/// driver's node and size checks and then report `NV_ERR_NOT_SUPPORTED` in their status
/// field (the RM's own answer for an operation it cannot do), never pretending to succeed.
/// `(escape, true: control node only / false: GPU node only, offset of the status field from
/// the end of the payload)`.
const NOT_SUPPORTED_ESCAPES: &[(u8, bool, usize)] = &[
    (NV_ESC_RM_IDLE_CHANNELS, true, 8), // NVOS30 status at 48 of 56
    (NV_ESC_RM_ALLOC_CONTEXT_DMA2, true, 8), // NVOS39 status at 48 of 56
    (NV_ESC_RM_MAP_MEMORY_DMA, true, 8), // NVOS46 status 8 before the end (56 or 64)
    (NV_ESC_RM_UNMAP_MEMORY_DMA, true, 8), // NVOS47 status 8 before the end (40 or 48)
    (NV_ESC_EXPORT_TO_DMABUF_FD, false, 8), // status 8 before the end (2600 or 2608)
];

/// [`HostFile::ioctl_with_pages`](host_driver::HostFile::ioctl_with_pages) on file `file`:
/// only `NV_ESC_RM_ALLOC_MEMORY` of OS-descriptor memory names client pages (`EINVAL` for
/// anything else), with the checks of the plain escape before it.
pub(crate) fn ioctl_with_pages(
    drv: &SimDriver,
    file: i32,
    node: NodeKind,
    call: &mut HostCall,
    pages: &host_driver::ClientPages,
) -> io::Result<i32> {
    let size = size_of::<nv_ioctl_nvos02_parameters_with_fd>();
    if ioc_nr(call.cmd) != NV_ESC_RM_ALLOC_MEMORY
        || ioc_size(call.cmd) as usize != size
        || call.params.len() != size
        || pages.ptr_offset
            != std::mem::offset_of!(nv_ioctl_nvos02_parameters_with_fd, params)
                + std::mem::offset_of!(nvproxy_abi::structs::NVOS02_PARAMETERS, pMemory)
    {
        return Err(errno(EINVAL));
    }
    // NV_ACTUAL_DEVICE_ONLY: a GPU node.
    if !matches!(node, NodeKind::Gpu(_)) {
        return Err(errno(EINVAL));
    }
    let mut st = drv.lock();
    let os_info = caller_os_info(&st, file)?;
    crate::memory::alloc_os_descriptor(drv, &mut st, os_info, call, Loc::Params, pages)
}

/// The `clientOSInfo` of an ioctl on `file` (its control file once registered); `EBADF` for an
/// unknown file, `EACCES` for a mapping file (one opened under Landlock with device ioctls
/// denied).
fn caller_os_info(st: &crate::driver::State, file: i32) -> io::Result<i32> {
    let f = st.files.get(&file).ok_or_else(|| errno(EBADF))?;
    if f.mapping {
        return Err(errno(EACCES));
    }
    Ok(f.ctl.unwrap_or(file))
}

/// One ioctl on file `file` (open on `node`).
pub(crate) fn ioctl(
    drv: &SimDriver,
    file: i32,
    node: NodeKind,
    call: &mut HostCall,
) -> io::Result<i32> {
    if node == NodeKind::Uvm {
        return crate::uvm::ioctl(drv, file, call);
    }
    let mut nr = u32::from(ioc_nr(call.cmd));
    let mut size = ioc_size(call.cmd) as usize;
    let mut loc = Loc::Params;
    if nr == u32::from(NV_ESC_IOCTL_XFER_CMD) {
        if size != size_of::<nv_ioctl_xfer_t>() || call.params.len() != size {
            return Err(errno(EINVAL));
        }
        let x: nv_ioctl_xfer_t = read_at(call, Loc::Params, 0).ok_or_else(|| errno(EFAULT))?;
        if x.size > NV_ABSOLUTE_MAX_IOCTL_SIZE {
            return Err(errno(EINVAL));
        }
        nr = x.cmd;
        size = x.size as usize;
        loc = child(call, Loc::Params, 8).ok_or_else(|| errno(EFAULT))?;
    }
    // The driver copies exactly _IOC_SIZE bytes in and out; a buffer of another length means
    // that copy would fault.
    if bytes(call, loc).len() != size {
        return Err(errno(EFAULT));
    }
    let Ok(nr) = u8::try_from(nr) else {
        return Err(errno(EINVAL)); // unknown escape: RmIoctl's default case
    };
    let ctl = node == NodeKind::Ctl;
    let mut st = drv.lock();
    let os_info = caller_os_info(&st, file)?;
    let ok = Ok(0);
    match nr {
        NV_ESC_CARD_INFO => {
            if !ctl {
                return Err(errno(EINVAL));
            }
            card_info(drv, call, loc, size)
        }
        NV_ESC_ATTACH_GPUS_TO_FD => {
            if !ctl || size == 0 || !size.is_multiple_of(4) {
                return Err(errno(EINVAL));
            }
            if st.files[&file].attached.is_some() {
                return Err(errno(EINVAL));
            }
            let ids: Vec<u32> = bytes(call, loc)
                .chunks_exact(4)
                .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            // nvidia_dev_get on every non-zero id; any unknown one undoes the lot.
            if ids.iter().any(|&id| id != 0 && drv.gpu_by_id(id).is_none()) {
                return Err(errno(EINVAL));
            }
            for &id in ids.iter().filter(|&&id| id != 0) {
                let g = drv.gpu_by_id(id).expect("checked above");
                st.gpus[g].dev_refs += 1;
            }
            st.files.get_mut(&file).expect("present").attached = Some(ids);
            ok
        }
        NV_ESC_CHECK_VERSION_STR => {
            if !ctl {
                return Err(errno(EINVAL));
            }
            check_version(drv, call, loc, size)
        }
        NV_ESC_SYS_PARAMS => {
            if !ctl || size != size_of::<nv_ioctl_sys_params_t>() {
                return Err(errno(EINVAL));
            }
            let p: nv_ioctl_sys_params_t = read_at(call, loc, 0).expect("size checked");
            if st.memblock_size == 0 {
                st.memblock_size = p.memblock_size;
                ok
            } else if st.memblock_size == p.memblock_size {
                ok
            } else {
                Err(errno(EBUSY))
            }
        }
        NV_ESC_NUMA_INFO => {
            // nvidia_ioctl: NV_ACTUAL_DEVICE_ONLY, then the exact size.
            if ctl || size != size_of::<nv_ioctl_numa_info_t>() {
                return Err(errno(EINVAL));
            }
            let mut p: nv_ioctl_numa_info_t = read_at(call, loc, 0).expect("size checked");
            // rm_get_gpu_numa_info -> NV2080_CTRL_CMD_FB_GET_NUMA_INFO
            // (subdeviceCtrlCmdFbGetNumaInfo): a GPU that is not self-hosted (PCIe on x86, no
            // coherent link) has numaNodeId NV0000_CTRL_NO_NUMA_NODE and no NUMA memory, so no
            // retired page lies in its NUMA region and the offline list is empty. Then
            // nv_get_numa_status: DISABLED without a node; use_auto_online false;
            // memblock_size is the control device's, as NV_ESC_SYS_PARAMS set it.
            p.nid = -1;
            p.numa_mem_addr = 0;
            p.numa_mem_size = 0;
            p.offline_addresses.numEntries = 0;
            p.status = NV_IOCTL_NUMA_STATUS_DISABLED;
            p.use_auto_online = 0;
            p.memblock_size = st.memblock_size;
            write_at(call, loc, 0, &p);
            ok
        }
        NV_ESC_WAIT_OPEN_COMPLETE if drv.abi.escapes.contains_key(&NV_ESC_WAIT_OPEN_COMPLETE) => {
            if size != size_of::<nv_ioctl_wait_open_complete_t>() {
                return Err(errno(EINVAL));
            }
            // Opens complete synchronously in the simulator: rc 0, adapter status NV_OK.
            write_at(
                call,
                loc,
                0,
                &nv_ioctl_wait_open_complete_t {
                    rc: 0,
                    adapterStatus: NV_OK,
                },
            );
            ok
        }
        NV_ESC_REGISTER_FD => {
            if size != size_of::<nv_ioctl_register_fd_t>() {
                return Err(errno(EINVAL));
            }
            let p: nv_ioctl_register_fd_t = read_at(call, loc, 0).expect("size checked");
            if st.files[&file].ctl.is_some() {
                return Err(errno(EINVAL)); // NV_ERR_INVALID_STATE: already registered
            }
            // nv_get_file_private(ctl_fd, require ctl): must be an open control file.
            if drv.file_node(&st, p.ctl_fd) != Some(NodeKind::Ctl) {
                return Err(errno(EINVAL));
            }
            if p.ctl_fd == file || st.files[&p.ctl_fd].ctl.is_some() {
                return Err(errno(EINVAL));
            }
            st.files.get_mut(&file).expect("present").ctl = Some(p.ctl_fd);
            st.files.get_mut(&p.ctl_fd).expect("present").holders += 1;
            ok
        }
        NV_ESC_ALLOC_OS_EVENT => {
            if size != size_of::<nv_ioctl_alloc_os_event_t>() {
                return Err(errno(EINVAL));
            }
            let mut p: nv_ioctl_alloc_os_event_t = read_at(call, loc, 0).expect("size checked");
            #[expect(
                clippy::cast_sign_loss,
                reason = "the driver keeps the fd as an NvU32: a negative fd is a large key, as there"
            )]
            let fd = p.fd as u32;
            // allocate_os_event: one event per (client, fd); neither is validated.
            p.Status = if st
                .os_events
                .iter()
                .any(|e| e.active && e.h_parent == p.hClient && e.fd == fd)
            {
                NV_ERR_INSUFFICIENT_RESOURCES
            } else {
                let id = st.next_os_event;
                st.next_os_event += 1;
                st.os_events.push(OsEvent {
                    id,
                    h_parent: p.hClient,
                    file,
                    fd,
                    active: true,
                    refcount: 0,
                    notified: 0,
                });
                NV_OK
            };
            write_at(call, loc, 0, &p);
            ok
        }
        NV_ESC_FREE_OS_EVENT => {
            if size != size_of::<nv_ioctl_free_os_event_t>() {
                return Err(errno(EINVAL));
            }
            let mut p: nv_ioctl_free_os_event_t = read_at(call, loc, 0).expect("size checked");
            #[expect(
                clippy::cast_sign_loss,
                reason = "the driver keeps the fd as an NvU32: a negative fd is a large key, as there"
            )]
            let fd = p.fd as u32;
            p.Status = match st
                .os_events
                .iter()
                .position(|e| e.active && e.h_parent == p.hClient && e.fd == fd)
            {
                Some(i) => {
                    if st.os_events[i].refcount == 0 {
                        st.os_events.remove(i);
                    } else {
                        st.os_events[i].active = false;
                    }
                    NV_OK
                }
                None => NV_ERR_INVALID_EVENT,
            };
            write_at(call, loc, 0, &p);
            ok
        }
        NV_ESC_STATUS_CODE => {
            if !ctl || size != size_of::<nv_ioctl_status_code_t>() {
                return Err(errno(EINVAL));
            }
            let mut p: nv_ioctl_status_code_t = read_at(call, loc, 0).expect("size checked");
            let found =
                drv.config.gpus.iter().any(|g| {
                    g.pci_domain == p.domain && g.pci_bus == p.bus && g.pci_device == p.slot
                });
            if !found {
                return Err(errno(EINVAL));
            }
            p.status = NV_OK;
            write_at(call, loc, 0, &p);
            ok
        }
        NV_ESC_RM_ALLOC => rm_alloc(drv, &mut st, call, loc, size, ctl, os_info),
        NV_ESC_RM_ALLOC_OBJECT => {
            if !ctl || size != size_of::<NVOS05_PARAMETERS>() {
                return Err(errno(EINVAL));
            }
            // Nv01AllocObject: an RM_ALLOC without alloc params.
            let mut p: NVOS05_PARAMETERS = read_at(call, loc, 0).expect("size checked");
            let (status, h) = st.alloc(
                drv,
                AllocArgs {
                    h_client: p.hRoot,
                    h_parent: p.hObjectParent,
                    h_new: p.hObjectNew,
                    class: p.hClass,
                    params: None,
                    os_info,
                },
            );
            p.status = status;
            p.hObjectNew = h;
            write_at(call, loc, 0, &p);
            ok
        }
        NV_ESC_RM_VID_HEAP_CONTROL => {
            if !ctl || size != size_of::<NVOS32_PARAMETERS>() {
                return Err(errno(EINVAL));
            }
            crate::vidheap::vid_heap_control(drv, &mut st, call, loc, os_info);
            ok
        }
        NV_ESC_RM_FREE => {
            if !ctl || size != size_of::<NVOS00_PARAMETERS>() {
                return Err(errno(EINVAL));
            }
            let mut p: NVOS00_PARAMETERS = read_at(call, loc, 0).expect("size checked");
            p.status = st.free(drv, p.hRoot, p.hObjectOld, os_info);
            write_at(call, loc, 0, &p);
            ok
        }
        NV_ESC_RM_CONTROL => {
            if !ctl || size != size_of::<NVOS54_PARAMETERS>() {
                return Err(errno(EINVAL));
            }
            let status = crate::control::control(drv, &mut st, os_info, call, loc);
            write_at(call, loc, 28, &status);
            ok
        }
        NV_ESC_RM_DUP_OBJECT => {
            if !ctl || size != size_of::<NVOS55_PARAMETERS>() {
                return Err(errno(EINVAL));
            }
            let mut p: NVOS55_PARAMETERS = read_at(call, loc, 0).expect("size checked");
            let (status, h) = st.dup(
                p.hClient,
                p.hParent,
                p.hObject,
                p.hClientSrc,
                p.hObjectSrc,
                os_info,
            );
            p.status = status;
            if status == NV_OK {
                p.hObject = h;
            }
            write_at(call, loc, 0, &p);
            ok
        }
        NV_ESC_RM_MAP_MEMORY => {
            if !ctl || size != size_of::<nv_ioctl_nvos33_parameters_with_fd>() {
                return Err(errno(EINVAL));
            }
            crate::memory::map_memory(drv, &mut st, os_info, call, loc)
        }
        NV_ESC_RM_UNMAP_MEMORY => {
            if !ctl || size != size_of::<NVOS34_PARAMETERS>() {
                return Err(errno(EINVAL));
            }
            crate::memory::unmap_memory(&mut st, os_info, call, loc)
        }
        NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO => {
            if !ctl || size != size_of::<NVOS56_PARAMETERS>() {
                return Err(errno(EINVAL));
            }
            crate::memory::update_mapping_info(&mut st, os_info, call, loc)
        }
        NV_ESC_RM_ALLOC_MEMORY => {
            // NV_ACTUAL_DEVICE_ONLY: a GPU node.
            if ctl || size != size_of::<nv_ioctl_nvos02_parameters_with_fd>() {
                return Err(errno(EINVAL));
            }
            crate::memory::alloc_memory(drv, &mut st, os_info, call, loc)
        }
        NV_ESC_RM_SHARE => {
            if !ctl || size != size_of::<NVOS57_PARAMETERS>() {
                return Err(errno(EINVAL));
            }
            let mut p: NVOS57_PARAMETERS = read_at(call, loc, 0).expect("size checked");
            let pol = p.sharePolicy;
            p.status = st.share(p.hClient, p.hObject, pol.r#type, pol.target, os_info);
            write_at(call, loc, 0, &p);
            ok
        }
        _ => {
            let Some(&(_, ctl_only, from_end)) =
                NOT_SUPPORTED_ESCAPES.iter().find(|(n, _, _)| *n == nr)
            else {
                // Unknown to the driver, or known but not simulated (I2C, registry,
                // event data, ...): EINVAL, the driver's answer for an escape it rejects.
                return Err(errno(EINVAL));
            };
            let size_ok = drv
                .abi
                .escapes
                .get(&nr)
                .is_some_and(|e| u32::try_from(size).is_ok_and(|s| e.size.accepts(s)));
            if !size_ok || ctl != ctl_only {
                return Err(errno(EINVAL));
            }
            write_at(call, loc, size - from_end, &NV_ERR_NOT_SUPPORTED);
            ok
        }
    }
}

/// `NV_ESC_CARD_INFO` (`nvidia_read_card_info`): zero the array, fail with `EINVAL` if it has
/// fewer entries than there are GPUs, else one valid entry per GPU.
fn card_info(drv: &SimDriver, call: &mut HostCall, loc: Loc, size: usize) -> io::Result<i32> {
    let n = size / size_of::<nv_ioctl_card_info_t>();
    let out = bytes_mut(call, loc);
    out[..n * size_of::<nv_ioctl_card_info_t>()].fill(0);
    if n < drv.config.gpus.len() {
        return Err(errno(EINVAL));
    }
    for (i, g) in drv.config.gpus.iter().enumerate() {
        let mut ci = nv_ioctl_card_info_t::new_zeroed();
        ci.valid = 1;
        ci.pci_info.domain = g.pci_domain;
        ci.pci_info.bus = g.pci_bus;
        ci.pci_info.slot = g.pci_device;
        ci.pci_info.vendor_id = g.pci_vendor_id;
        ci.pci_info.device_id = g.pci_device_id;
        ci.gpu_id = g.gpu_id();
        ci.interrupt_line = 0;
        ci.reg_address = g.bar0_address;
        ci.reg_size = 16 << 20;
        ci.fb_address = g.bar1_address;
        ci.fb_size = g.bar1_bytes;
        ci.minor_number = g.minor;
        buf::write(out, i * size_of::<nv_ioctl_card_info_t>(), &ci);
    }
    Ok(0)
}

/// `NV_ESC_CHECK_VERSION_STR` (`RmPerformVersionCheck`).
fn check_version(drv: &SimDriver, call: &mut HostCall, loc: Loc, size: usize) -> io::Result<i32> {
    if size != size_of::<nv_ioctl_rm_api_version_t>() {
        return Err(errno(EINVAL));
    }
    let mut p: nv_ioctl_rm_api_version_t = read_at(call, loc, 0).expect("size checked");
    p.reply = NV_RM_API_VERSION_REPLY_RECOGNIZED;
    let mine = drv.version_string.as_bytes();
    let copy_mine = |v: &mut [u8; 64]| {
        v[..mine.len()].copy_from_slice(mine);
        v[mine.len()] = 0;
    };
    if p.cmd == NV_RM_API_VERSION_CMD_QUERY {
        copy_mine(&mut p.versionString);
        write_at(call, loc, 0, &p);
        return Ok(0);
    }
    let relaxed = p.cmd == NV_RM_API_VERSION_CMD_RELAXED;
    let mut matched = false;
    for i in 0..NV_RM_API_VERSION_STRING_LENGTH {
        let c = p.versionString[i];
        let r = mine.get(i).copied().unwrap_or(0);
        if c != r {
            break;
        }
        if (relaxed && c == b'.') || c == 0 {
            matched = true;
            break;
        }
    }
    if matched {
        write_at(call, loc, 0, &p);
        return Ok(0);
    }
    p.versionString[NV_RM_API_VERSION_STRING_LENGTH - 1] = 0;
    copy_mine(&mut p.versionString);
    write_at(call, loc, 0, &p);
    Err(errno(EINVAL))
}

/// `NV_ESC_RM_ALLOC` with an `NVOS21_PARAMETERS` or `NVOS64_PARAMETERS` payload.
fn rm_alloc(
    drv: &SimDriver,
    st: &mut State,
    call: &mut HostCall,
    loc: Loc,
    size: usize,
    ctl: bool,
    os_info: i32,
) -> io::Result<i32> {
    let status_at = match size {
        32 => 28, // NVOS21_PARAMETERS.status
        48 => 40, // NVOS64_PARAMETERS.status
        _ => return Err(errno(EINVAL)),
    };
    let h_root: u32 = read_at(call, loc, 0).expect("size checked");
    let h_parent: u32 = read_at(call, loc, 4).expect("size checked");
    let h_new: u32 = read_at(call, loc, 8).expect("size checked");
    let mut class: u32 = read_at(call, loc, 12).expect("size checked");
    if rm::is_root_class(class) {
        if !ctl {
            return Err(errno(EINVAL));
        }
        // Force user-space client allocations to the _CLIENT class.
        class = rm::NV01_ROOT_CLIENT;
        write_at(call, loc, 12, &class);
    } else if !rm::is_event_class(class) && !ctl {
        return Err(errno(EINVAL));
    }
    let params_loc = child(call, loc, 16);
    let (status, h) = st.alloc(
        drv,
        AllocArgs {
            h_client: h_root,
            h_parent,
            h_new,
            class,
            params: params_loc.map(|l| bytes_mut(call, l)),
            os_info,
        },
    );
    write_at(call, loc, 8, &h);
    write_at(call, loc, status_at, &status);
    Ok(0)
}
