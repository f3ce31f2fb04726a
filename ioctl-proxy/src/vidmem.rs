//! Per-instance memory quotas: video memory per GPU (`Quotas::gpu_memory`) and the system
//! memory the driver allocates for the instance (`Quotas::system_memory`).
//!
//! # What is counted
//!
//! The allocations that take video memory on the tenant's behalf, from the driver source
//! (`docs/architecture/nvsim.md` lists the same set for the simulated driver's books):
//! - `NV_ESC_RM_ALLOC` of `NV01_MEMORY_LOCAL_USER` (`vidmemConstruct`, `video_mem.c`): the size
//!   in `NV_MEMORY_ALLOCATION_PARAMS`;
//! - `NV_ESC_RM_VID_HEAP_CONTROL` `ALLOC_SIZE` with location `VIDMEM` and not virtual
//!   (`rmapi_deprecated_vidheapctrl.c` turns it into the same `RM_ALLOC`).
//!
//! And the allocations of system memory, counted in one pool for the host ([`HOST_POOL`]),
//! whatever GPU they are made under:
//! - `NV_ESC_RM_ALLOC` of `NV01_MEMORY_SYSTEM` (`sysmemConstruct`, `system_mem.c`): the size
//!   in `NV_MEMORY_ALLOCATION_PARAMS`;
//! - `NV_ESC_RM_VID_HEAP_CONTROL` `ALLOC_SIZE` of another location, not virtual (the same
//!   `RM_ALLOC` of `NV01_MEMORY_SYSTEM`), or from 550 with `NVOS32_ATTR2_USE_EGM` (an `RM_ALLOC`
//!   of `NV_MEMORY_EXTENDED_USER`: EGM, host memory on self-hosted systems, "the same as sysmem
//!   pool", `egmmemValidateParams` in `egm_mem.c`; before 550 the bit is unused, so only a
//!   version whose table says so, [`nvproxy_abi::DriverAbi::vid_heap_egm`], reads it);
//! - `NV_ESC_RM_ALLOC_MEMORY` of `NV01_MEMORY_SYSTEM` (`_rmAllocMemorySystem`): `limit + 1`.
//!
//! RM takes these pages from the kernel itself (`nv_alloc_system_pages` /
//! `nv_alloc_contig_pages`, `kernel-open/nvidia/nv-vm.c`, without `__GFP_ACCOUNT`): no memory
//! cgroup, the container's or the worker's, sees them, so without a quota a tenant can take
//! the host's memory. OS descriptors are the tenant's own pages and have their own bound
//! (`Quotas::os_descriptor_bytes`); from kernel 5.14 UVM charges its pages to a memory cgroup
//! (`kernel-open/nvidia-uvm/uvm_linux.h`).
//!
//! Each counted allocation is one *block* ([`crate::objects::VidCharge`], its pool the GPU id
//! or [`HOST_POOL`]); a dup of it (`NV_ESC_RM_DUP_OBJECT`), an object exported to an fd
//! (`OS_UNIX_EXPORT_OBJECT_TO_FD`: the driver keeps the memory in its export client until the
//! fd's file is released), an object imported from that fd and a UVM mapping name the same
//! block, which stays counted until the last of them goes. Every teardown path of the object
//! table (free, a freed client or parent, a released file, a removed instance) drops the
//! references, so the memory is given back with the object; a control file another file
//! registered (`NV_ESC_REGISTER_FD`) is released with the last of those, as in the driver
//! (`Proxy::release`).
//!
//! Not counted: OS descriptors, virtual memory, `RM_ALLOC_MEMORY` of `NV01_MEMORY_LOCAL_USER`
//! (a system-memory placeholder for a non-root client, `_rmAllocMemoryLocalUser`; its `limit`,
//! the heap size, is answered as the quota), UVM managed memory (evictable) and UVM's own
//! allocations, and what RM allocates for itself (channel instance blocks, GR context buffers,
//! page tables: their sizes are not in the request). Refused in an instance with a quota
//! because their backing cannot be counted from the request: `NV_MEMORY_FABRIC` under a GPU
//! memory quota (`NV_ERR_INVALID_CLASS`, as a class the driver lacks) and
//! `OS_UNIX_EXPORT_OBJECTS_TO_FD` of memory counted under a quota (`NV_ERR_NOT_SUPPORTED`).
//!
//! Past a quota an allocation gets `NV_ERR_NO_MEMORY` without reaching the driver, the
//! driver's answer for a full GPU (`pmaAllocatePages` failing in `vidmemPmaAlloc`,
//! `video_mem.c`; nvsim's books answer the same) and for a host without pages, so
//! `cuMemAlloc` and `cuMemHostAlloc` return `CUDA_ERROR_OUT_OF_MEMORY`. The check is made
//! under the RM mutation lock, so two threads cannot both take the last room. A request is
//! admitted by its size rounded up to 4 KiB and counted by the larger of that and the size the
//! driver reports back.
//!
//! # What the tenant sees
//!
//! With a quota the FB info controls (`NV2080_CTRL_CMD_FB_GET_INFO` and `_V2`) answer the
//! quota as the memory's size (`RAM_SIZE`, `TOTAL_RAM_SIZE`, `HEAP_SIZE`, `MAPPABLE_HEAP_SIZE`,
//! `USABLE_RAM_SIZE`, never more than the driver's own answer) and the quota less the
//! instance's own use as free (`HEAP_FREE`, `LARGEST_FREE_REGION_SIZE_KB`), whatever other
//! tenants hold.

use std::mem::offset_of;

use nvproxy_abi::structs::{NV_MEMORY_ALLOCATION_PARAMS, NV0080_ALLOC_PARAMETERS};
use zerocopy::FromBytes;

use crate::kit::{Stop, deny};
use crate::nv::*;
use crate::objects::Origin;
use crate::plan::{Plan, rd32, rd64, wr32};
use crate::request::Req;
use crate::vid_books::pages;

pub(crate) use crate::objects::HOST_POOL;

/// `NV_MEMORY_ALLOCATION_PARAMS.size`.
pub(crate) const MEM_SIZE: usize = offset_of!(NV_MEMORY_ALLOCATION_PARAMS, size);

/// `NV2080_CTRL_CMD_FB_GET_INFO` (the list behind `fbInfoList`) and `_V2` (the list inline).
pub(crate) const FB_GET_INFO: u32 = 0x2080_1301;
/// `NV2080_CTRL_CMD_FB_GET_INFO_V2`.
pub(crate) const FB_GET_INFO_V2: u32 = 0x2080_1303;

/// `NV2080_CTRL_FB_INFO_INDEX_*` of the memory's size (KiB).
const SIZE_INDICES: [u32; 5] = [0x07, 0x08, 0x09, 0x0a, 0x20];
/// `NV2080_CTRL_FB_INFO_INDEX_*` of free memory (KiB): `LARGEST_FREE_REGION_SIZE_KB`,
/// `HEAP_FREE`.
const FREE_INDICES: [u32; 2] = [0x12, 0x16];

impl Req<'_> {
    /// The pool an allocation of memory class `class` under `h_parent` counts in (module
    /// docs): `Some(gpu)` for video memory (`Some(None)` when the device's GPU is unknown),
    /// the host's for system memory and EGM ("for self-hosted platforms which support EGM,
    /// EGM pool is the same as sysmem pool", `egmmemValidateParams`, egm_mem.c); `None` for a
    /// class that is not counted.
    pub(crate) fn memory_pool(
        &self,
        class: u32,
        h_client: u32,
        h_parent: u32,
    ) -> Option<Option<u32>> {
        match class {
            NV01_MEMORY_LOCAL_USER => Some(self.vid_gpu(h_client, h_parent)),
            NV01_MEMORY_SYSTEM | NV_MEMORY_EXTENDED_USER => Some(Some(HOST_POOL)),
            _ => None,
        }
    }

    /// The driver GPU id of the device `h_object` of `h_client` lies under (the device's
    /// `deviceId`, learned as the allocation of the device checked it), or for an instance of
    /// one GPU that GPU.
    pub(crate) fn vid_gpu(&self, h_client: u32, h_object: u32) -> Option<u32> {
        let mut at = (h_client, h_object);
        let mut device_instance = None;
        {
            let t = self.px.objects();
            // A dup of a device names its source; follow a few such links.
            for _ in 0..4 {
                let Some(dev) = t.device_above(at.0, at.1, NV01_DEVICE_0) else {
                    break;
                };
                match t.origin_of(at.0, dev) {
                    Some(Origin::Alloc(rec)) => {
                        // deviceConstruct (device.c): without params the instance is the
                        // class less NV01_DEVICE_0, i.e. 0.
                        device_instance = match rec.params() {
                            None => Some(0),
                            Some(p) => NV0080_ALLOC_PARAMETERS::read_from_prefix(p)
                                .ok()
                                .map(|(q, _)| q.deviceId),
                        };
                        break;
                    }
                    Some(Origin::Dup {
                        src_client,
                        src_object,
                        ..
                    }) => at = (*src_client, *src_object),
                    _ => break,
                }
            }
        }
        let only = match self.px.gpus.as_slice() {
            [only] => Some(only.gpu_id),
            _ => None,
        };
        device_instance.and_then(|d| self.px.device_gpu(d)).or(only)
    }

    /// The quota of `pool` (a GPU id or [`HOST_POOL`]), if any.
    pub(crate) fn pool_quota(&self, pool: u32) -> Option<u64> {
        let q = &self.px.policy.quotas;
        if pool == HOST_POOL {
            q.system_memory
        } else {
            q.gpu_memory
        }
    }

    /// Whether `bytes` more in `pool` (a GPU id, unknown: `None`, or [`HOST_POOL`]) fit the
    /// instance's quota; call under the RM lock.
    pub(crate) fn vid_admit(&self, pool: Option<u32>, bytes: u64) -> Result<(), Stop> {
        let quota = match pool {
            Some(p) => self.pool_quota(p),
            None => self.px.policy.quotas.gpu_memory,
        };
        let Some(quota) = quota else {
            return Ok(());
        };
        let Some(pool) = pool else {
            return deny(NV_ERR_NO_MEMORY, "the allocation's GPU is unknown");
        };
        if self
            .px
            .objects()
            .vid_used(pool)
            .saturating_add(pages(bytes))
            > quota
        {
            return deny(
                NV_ERR_NO_MEMORY,
                if pool == HOST_POOL {
                    "the instance's system memory quota is reached"
                } else {
                    "the instance's GPU memory quota is reached"
                },
            );
        }
        Ok(())
    }

    /// After a successful FB info control on `h_object`: the quota as the size, the quota less
    /// the instance's use as free (module docs). `list`: the buffer of `{index, data}` pairs
    /// and their offset.
    pub(crate) fn fb_info_view(
        &self,
        h_client: u32,
        h_object: u32,
        plan: &mut Plan,
        list: Option<usize>,
        off: usize,
        n: u32,
    ) {
        let Some(quota) = self.px.policy.quotas.gpu_memory else {
            return;
        };
        let Some(gpu) = self.vid_gpu(h_client, h_object) else {
            return;
        };
        let used = self.px.objects().vid_used(gpu);
        let kib = |b: u64| u32::try_from(b >> 10).unwrap_or(u32::MAX);
        let (size_kib, free_kib) = (kib(quota), kib(quota.saturating_sub(used)));
        let mut bytes = plan.buf(list).to_vec();
        let n = n as usize;
        for i in 0..n {
            let at = off + 8 * i;
            if bytes.len() < at + 8 {
                break;
            }
            let (index, data) = (rd32(&bytes, at), rd32(&bytes, at + 4));
            let v = if SIZE_INDICES.contains(&index) {
                data.min(size_kib)
            } else if FREE_INDICES.contains(&index) {
                free_kib
            } else {
                continue;
            };
            wr32(&mut bytes, at + 4, v);
        }
        plan.overwrite(list, 0, &bytes);
    }

    /// `RM_ALLOC_MEMORY` of `NV01_MEMORY_LOCAL_USER` for a non-root client reports the heap
    /// size in `limit` (`_rmAllocMemoryLocalUser`): with a quota, the quota.
    pub(crate) fn local_user_limit(&self, plan: &mut Plan, limit_off: usize) {
        let Some(quota) = self.px.policy.quotas.gpu_memory else {
            return;
        };
        let limit = rd64(plan.buf(None), limit_off);
        let q = quota.saturating_sub(1);
        if limit > q {
            plan.overwrite(None, limit_off, &q.to_ne_bytes());
        }
    }
}
