//! Where the fields the proxy checks sit in each allowlisted UVM command's params, for the
//! layout the driver version uses (picked by the table's param size; see
//! `nvproxy_abi::structs::uvm_more`). Offsets come from the `nvproxy-abi` structs, which the
//! parity test checks against every version's headers.

use core::mem::{offset_of, size_of};

use nvproxy_abi::DriverAbi;
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;

use crate::nv::*;

/// Which processors a UUID field may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UuidRule {
    /// One of the instance's GPUs.
    Gpu,
    /// One of the instance's GPUs or the CPU (`NV_PROCESSOR_UUID_CPU_DEFAULT`), where the
    /// driver tests `uvm_uuid_is_cpu` first.
    GpuOrCpu,
}

/// A UUID field and the status the driver gives when it names no GPU it can use here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UuidField {
    pub(crate) off: usize,
    pub(crate) rule: UuidRule,
    pub(crate) foreign: u32,
}

/// An array of `UvmGpuMappingAttributes` (`gpuUuid` first in each 36-byte element) and its
/// `NvU64` count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PerGpu {
    pub(crate) array: usize,
    pub(crate) count: usize,
    /// `UVM_MAX_GPUS` of the layout (the array's length).
    pub(crate) max: u64,
    /// Whether a count of 0 is refused (`MAP_EXTERNAL_ALLOCATION`) or allowed (semaphore
    /// pools).
    pub(crate) zero_invalid: bool,
}

/// RM handles: a client and objects of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handles {
    pub(crate) client: usize,
    /// Objects of the client; `None` where the field does not exist.
    pub(crate) objects: [Option<usize>; 1],
    /// Whether a zero client (and then zero objects) is accepted: `REGISTER_GPU` without MIG
    /// (`UvmRegisterGpu` passes no client; the driver reads `hClient`/`hSmcPartRef` only for
    /// SMC partitions, `nvGpuOpsGetGpuInfo`).
    pub(crate) zero_ok: bool,
    /// Status for a client (or object) that is not this instance's.
    pub(crate) foreign_client: u32,
    pub(crate) foreign_object: u32,
}

/// What the proxy checks and translates in one command's params.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fields {
    pub(crate) status: usize,
    pub(crate) uuids: Vec<UuidField>,
    pub(crate) per_gpu: Option<PerGpu>,
    pub(crate) handles: Option<Handles>,
    pub(crate) rm_ctrl_fd: Option<usize>,
}

impl Fields {
    fn status(status: usize) -> Self {
        Fields {
            status,
            uuids: Vec::new(),
            per_gpu: None,
            handles: None,
            rm_ctrl_fd: None,
        }
    }

    fn uuid(mut self, off: usize, rule: UuidRule, foreign: u32) -> Self {
        self.uuids.push(UuidField { off, rule, foreign });
        self
    }

    fn gpu(self, off: usize) -> Self {
        self.uuid(off, UuidRule::Gpu, NV_ERR_INVALID_DEVICE)
    }

    fn gpu_or_cpu(self, off: usize) -> Self {
        self.uuid(off, UuidRule::GpuOrCpu, NV_ERR_INVALID_DEVICE)
    }

    fn handles(mut self, client: usize, object: Option<usize>, foreign_object: u32) -> Self {
        self.handles = Some(Handles {
            client,
            objects: [object],
            zero_ok: false,
            foreign_client: NV_ERR_INVALID_CLIENT,
            foreign_object,
        });
        self
    }

    fn fd(mut self, off: usize) -> Self {
        self.rm_ctrl_fd = Some(off);
        self
    }
}

/// `UvmGpuMappingAttributes` per element.
const ATTR: usize = size_of::<UvmGpuMappingAttributes>();

/// The fields of command `cmd` whose params are `size` bytes, or `None` when the proxy has no
/// handler for that command or layout (it is then refused, never forwarded unchecked).
///
/// Statuses for foreign values are what the driver answers when the value names nothing it
/// can use in this va_space (`kernel-open/nvidia-uvm/`): a GPU UUID in `REGISTER_GPU` that
/// no GPU of the system has → `NV_ERR_GPU_UUID_NOT_FOUND` (`nvUvmInterfaceRegisterGpu`,
/// `nv_uvm_interface.c`: `-ENODEV` from `nvidia_dev_get_uuid`); any other GPU UUID that is not
/// registered in the va_space → `NV_ERR_INVALID_DEVICE` (`uvm_va_space_get_gpu_by_uuid` misses:
/// `uvm_va_space.c`, `uvm_policy.c`, `uvm_migrate.c`, `uvm_map_external.c`,
/// `uvm_va_range.c`) — a GPU outside the instance is never registered through the proxy;
/// an RM client of another instance → `NV_ERR_INVALID_CLIENT` and an object not in the client
/// → `NV_ERR_OBJECT_NOT_FOUND` (the resource server's answers to the dup/retain UVM asks RM
/// for), except `UNREGISTER_CHANNEL`, a UVM-internal lookup: `NV_ERR_INVALID_CHANNEL`
/// (`uvm_user_channel.c`).
pub(crate) fn fields(abi: &DriverAbi, cmd: u32, size: usize) -> Option<Fields> {
    macro_rules! st {
        ($t:ty) => {
            (size == size_of::<$t>()).then(|| Fields::status(offset_of!($t, rmStatus)))
        };
    }
    let f = match cmd {
        UVM_INITIALIZE => st!(UVM_INITIALIZE_PARAMS)?,
        UVM_MM_INITIALIZE => st!(UVM_MM_INITIALIZE_PARAMS)?,
        UVM_CREATE_RANGE_GROUP => st!(UVM_CREATE_RANGE_GROUP_PARAMS)?,
        UVM_DESTROY_RANGE_GROUP => st!(UVM_DESTROY_RANGE_GROUP_PARAMS)?,
        UVM_SET_RANGE_GROUP => st!(UVM_SET_RANGE_GROUP_PARAMS)?,
        UVM_PAGEABLE_MEM_ACCESS => st!(UVM_PAGEABLE_MEM_ACCESS_PARAMS)?,
        UVM_UNSET_PREFERRED_LOCATION => st!(UVM_UNSET_PREFERRED_LOCATION_PARAMS)?,
        UVM_ENABLE_READ_DUPLICATION => st!(UVM_ENABLE_READ_DUPLICATION_PARAMS)?,
        UVM_DISABLE_READ_DUPLICATION => st!(UVM_DISABLE_READ_DUPLICATION_PARAMS)?,
        UVM_VALIDATE_VA_RANGE => st!(UVM_VALIDATE_VA_RANGE_PARAMS)?,
        UVM_CREATE_EXTERNAL_RANGE => st!(UVM_CREATE_EXTERNAL_RANGE_PARAMS)?,
        UVM_FREE => st!(UVM_FREE_PARAMS).or_else(|| st!(UVM_FREE_PARAMS_V590))?,
        UVM_REGISTER_GPU => {
            type P = UVM_REGISTER_GPU_PARAMS;
            let mut f = st!(P)?
                .uuid(
                    offset_of!(P, gpu_uuid),
                    UuidRule::Gpu,
                    NV_ERR_GPU_UUID_NOT_FOUND,
                )
                .handles(
                    offset_of!(P, hClient),
                    Some(offset_of!(P, hSmcPartRef)),
                    NV_ERR_OBJECT_NOT_FOUND,
                )
                .fd(offset_of!(P, rmCtrlFd));
            if let Some(h) = f.handles.as_mut() {
                h.zero_ok = true;
            }
            f
        }
        UVM_UNREGISTER_GPU => st!(UVM_UNREGISTER_GPU_PARAMS)?.gpu(0),
        UVM_REGISTER_GPU_VASPACE => {
            type P = UVM_REGISTER_GPU_VASPACE_PARAMS;
            st!(P)?
                .gpu(offset_of!(P, gpuUuid))
                .handles(
                    offset_of!(P, hClient),
                    Some(offset_of!(P, hVaSpace)),
                    NV_ERR_OBJECT_NOT_FOUND,
                )
                .fd(offset_of!(P, rmCtrlFd))
        }
        UVM_UNREGISTER_GPU_VASPACE => st!(UVM_UNREGISTER_GPU_VASPACE_PARAMS)?.gpu(0),
        UVM_REGISTER_CHANNEL => {
            type P = UVM_REGISTER_CHANNEL_PARAMS;
            st!(P)?
                .gpu(offset_of!(P, gpuUuid))
                .handles(
                    offset_of!(P, hClient),
                    Some(offset_of!(P, hChannel)),
                    NV_ERR_OBJECT_NOT_FOUND,
                )
                .fd(offset_of!(P, rmCtrlFd))
        }
        UVM_UNREGISTER_CHANNEL => {
            let mut f = if let Some(f) = st!(UVM_UNREGISTER_CHANNEL_PARAMS) {
                // The driver never reads this gpuUuid (uvm_api_unregister_channel,
                // uvm_user_channel.c, looks the channel up by client and handle only), so it
                // names nothing and is not checked: libcuda 535 sends one that is no GPU's.
                type P = UVM_UNREGISTER_CHANNEL_PARAMS;
                f.handles(
                    offset_of!(P, hClient),
                    Some(offset_of!(P, hChannel)),
                    NV_ERR_INVALID_CHANNEL,
                )
            } else {
                type P = UVM_UNREGISTER_CHANNEL_PARAMS_V590;
                st!(P)?.handles(
                    offset_of!(P, hClient),
                    Some(offset_of!(P, hChannel)),
                    NV_ERR_INVALID_CHANNEL,
                )
            };
            if let Some(h) = f.handles.as_mut() {
                h.foreign_client = NV_ERR_INVALID_CHANNEL;
            }
            f
        }
        UVM_ENABLE_PEER_ACCESS => {
            type P = UVM_ENABLE_PEER_ACCESS_PARAMS;
            st!(P)?
                .gpu(offset_of!(P, gpuUuidA))
                .gpu(offset_of!(P, gpuUuidB))
        }
        UVM_DISABLE_PEER_ACCESS => {
            type P = UVM_DISABLE_PEER_ACCESS_PARAMS;
            st!(P)?
                .gpu(offset_of!(P, gpuUuidA))
                .gpu(offset_of!(P, gpuUuidB))
        }
        UVM_SET_PREFERRED_LOCATION => {
            if uvm_preferred_location_v550(abi) {
                type P = UVM_SET_PREFERRED_LOCATION_PARAMS_V550;
                st!(P)?.gpu_or_cpu(offset_of!(P, preferredLocation))
            } else {
                type P = UVM_SET_PREFERRED_LOCATION_PARAMS;
                st!(P)?.gpu_or_cpu(offset_of!(P, preferredLocation))
            }
        }
        UVM_SET_ACCESSED_BY => {
            type P = UVM_SET_ACCESSED_BY_PARAMS;
            st!(P)?.gpu_or_cpu(offset_of!(P, accessedByUuid))
        }
        UVM_UNSET_ACCESSED_BY => {
            type P = UVM_UNSET_ACCESSED_BY_PARAMS;
            st!(P)?.gpu_or_cpu(offset_of!(P, accessedByUuid))
        }
        UVM_MIGRATE => {
            type P = UVM_MIGRATE_PARAMS;
            st!(P)?.gpu_or_cpu(offset_of!(P, destinationUuid))
        }
        UVM_MIGRATE_RANGE_GROUP => {
            type P = UVM_MIGRATE_RANGE_GROUP_PARAMS;
            st!(P)?.gpu_or_cpu(offset_of!(P, destinationUuid))
        }
        UVM_MAP_DYNAMIC_PARALLELISM_REGION => {
            type P = UVM_MAP_DYNAMIC_PARALLELISM_REGION_PARAMS;
            st!(P)?.gpu(offset_of!(P, gpuUuid))
        }
        UVM_UNMAP_EXTERNAL => {
            type P = UVM_UNMAP_EXTERNAL_PARAMS;
            st!(P)?.gpu(offset_of!(P, gpuUuid))
        }
        UVM_PAGEABLE_MEM_ACCESS_ON_GPU => {
            type P = UVM_PAGEABLE_MEM_ACCESS_ON_GPU_PARAMS;
            st!(P)?.gpu(offset_of!(P, gpu_uuid))
        }
        UVM_MAP_EXTERNAL_ALLOCATION => {
            macro_rules! ext {
                ($t:ty) => {
                    st!($t).map(|mut f| {
                        f.per_gpu = Some(PerGpu {
                            array: offset_of!($t, perGpuAttributes),
                            count: offset_of!($t, gpuAttributesCount),
                            max: ((offset_of!($t, gpuAttributesCount)
                                - offset_of!($t, perGpuAttributes))
                                / ATTR) as u64,
                            zero_invalid: true,
                        });
                        f.handles(
                            offset_of!($t, hClient),
                            Some(offset_of!($t, hMemory)),
                            NV_ERR_OBJECT_NOT_FOUND,
                        )
                        .fd(offset_of!($t, rmCtrlFd))
                    })
                };
            }
            ext!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS)
                .or_else(|| ext!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550))?
        }
        UVM_ALLOC_SEMAPHORE_POOL => {
            macro_rules! pool {
                ($t:ty) => {
                    st!($t).map(|mut f| {
                        f.per_gpu = Some(PerGpu {
                            array: offset_of!($t, perGpuAttributes),
                            count: offset_of!($t, gpuAttributesCount),
                            max: ((offset_of!($t, gpuAttributesCount)
                                - offset_of!($t, perGpuAttributes))
                                / ATTR) as u64,
                            zero_invalid: false,
                        });
                        f
                    })
                };
            }
            pool!(UVM_ALLOC_SEMAPHORE_POOL_PARAMS)
                .or_else(|| pool!(UVM_ALLOC_SEMAPHORE_POOL_PARAMS_V550))?
        }
        _ => return None,
    };
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_per_gpu_max_is_the_array_length() {
        let abi = nvproxy_abi::find(&"535.261.03".parse().unwrap())
            .unwrap()
            .tables();
        let f = fields(&abi, UVM_MAP_EXTERNAL_ALLOCATION, 1200).unwrap();
        assert_eq!(f.per_gpu.unwrap().max, 32);
        let f = fields(&abi, UVM_MAP_EXTERNAL_ALLOCATION, 9264).unwrap();
        assert_eq!(f.per_gpu.unwrap().max, 256);
        let f = fields(&abi, UVM_ALLOC_SEMAPHORE_POOL, 9248).unwrap();
        assert_eq!(f.per_gpu.unwrap().max, 256);
    }

    #[test]
    fn test_every_allowlisted_command_of_every_version_has_fields() {
        for node in nvproxy_abi::nodes() {
            let abi = node.tables();
            for e in abi.uvm.values().filter(|e| e.param_size != 0) {
                assert!(
                    fields(&abi, e.cmd, e.param_size as usize).is_some(),
                    "{}: {} ({} bytes) has no layout",
                    node.version,
                    e.name,
                    e.param_size
                );
            }
        }
    }

    #[test]
    fn test_status_is_inside_the_params() {
        for node in nvproxy_abi::nodes() {
            let abi = node.tables();
            for e in abi.uvm.values().filter(|e| e.param_size != 0) {
                let f = fields(&abi, e.cmd, e.param_size as usize).unwrap();
                assert!(f.status + 4 <= e.param_size as usize, "{}", e.name);
            }
        }
    }
}
