//! Save and restore of the UVM part of an instance (the frontend part is
//! `ioctl_proxy::checkpoint` / `replay`): each UVM open's va_space, its `UVM_INITIALIZE`
//! flags, the mm file link (`UVM_MM_INITIALIZE`), and the GPUs and GPU VA spaces registered in
//! it. Anything else a va_space holds (ranges, external mappings, semaphore pools, channels,
//! peer access, policies, managed memory the tenant mapped) makes a save fail with its name.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ioctl_proxy::bytes::read_prefix;
use ioctl_proxy::checkpoint::{
    Checkpoint, CheckpointError, SavedUvmGpu, SavedUvmGpuVaSpace, SavedUvmOpen, parse_uuid,
    uuid_string,
};
use ioctl_proxy::{
    DeviceIdentity, HostFile, InstancePolicy, NodeKind, OpenId, OwnerId, Params, Plan, Proxy,
    ProxyError, RemapRule,
};
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::{
    UVM_INITIALIZE_PARAMS, UVM_MM_INITIALIZE_PARAMS, UVM_REGISTER_GPU_PARAMS,
    UVM_REGISTER_GPU_VASPACE_PARAMS, UVM_UNREGISTER_GPU_PARAMS, UVM_UNREGISTER_GPU_VASPACE_PARAMS,
};
use tracing::info;
use zerocopy::FromZeros;

use crate::nv::*;
use crate::proxy::{Resolved, UvmOpen, UvmProxy, lock};

/// Most registrations recorded per open (the driver allows at most one per GPU, and
/// `UVM_MAX_GPUS` is 256 in the newest layouts).
const MAX_REGISTRATIONS: usize = 256;

/// Commands that change no va_space state a replay would have to bring back.
const QUERIES: &[u32] = &[
    UVM_PAGEABLE_MEM_ACCESS,
    UVM_PAGEABLE_MEM_ACCESS_ON_GPU,
    UVM_VALIDATE_VA_RANGE,
];

/// What one UVM open did that a replay needs (or cannot do).
#[derive(Debug, Default)]
pub(crate) struct UvmRecord {
    pub(crate) init_flags: Option<u64>,
    pub(crate) mm_of: Option<OpenId>,
    pub(crate) gpus: Vec<SavedUvmGpu>,
    pub(crate) va_spaces: Vec<SavedUvmGpuVaSpace>,
    /// Successful state-changing commands replay does not re-create, by name, counted.
    pub(crate) unreplayable: BTreeMap<&'static str, u64>,
    /// The tenant was handed the va_space's mmap fd (managed memory).
    pub(crate) mapped: bool,
}

impl UvmRecord {
    /// A command succeeded with the client's params `top` (before translation; sized by the
    /// table for `cmd`'s struct).
    pub(crate) fn note(&mut self, name: &'static str, cmd: u32, top: &[u8], r: Resolved) {
        let full = self.gpus.len() + self.va_spaces.len() >= MAX_REGISTRATIONS;
        match cmd {
            UVM_INITIALIZE => {
                self.init_flags = Some(read_prefix::<UVM_INITIALIZE_PARAMS>(top).flags);
            }
            UVM_MM_INITIALIZE => self.mm_of = r.uvm_fd,
            UVM_REGISTER_GPU if !full => {
                let p = read_prefix::<UVM_REGISTER_GPU_PARAMS>(top);
                self.gpus.push(SavedUvmGpu {
                    uuid: uuid_string(&p.gpu_uuid.uuid),
                    rm_ctrl_open: r.rm_ctrl.map(|o| o.0),
                    h_client: p.hClient,
                    h_smc_part_ref: p.hSmcPartRef,
                });
            }
            UVM_UNREGISTER_GPU => {
                // Unregistering a GPU unregisters its GPU VA space too (uvm_va_space.c).
                let u = uuid_string(&read_prefix::<UVM_UNREGISTER_GPU_PARAMS>(top).gpu_uuid.uuid);
                self.gpus.retain(|g| g.uuid != u);
                self.va_spaces.retain(|g| g.uuid != u);
            }
            UVM_REGISTER_GPU_VASPACE if !full => {
                let p = read_prefix::<UVM_REGISTER_GPU_VASPACE_PARAMS>(top);
                self.va_spaces.push(SavedUvmGpuVaSpace {
                    uuid: uuid_string(&p.gpuUuid.uuid),
                    rm_ctrl_open: r.rm_ctrl.map(|o| o.0),
                    h_client: p.hClient,
                    h_va_space: p.hVaSpace,
                });
            }
            UVM_UNREGISTER_GPU_VASPACE => {
                let p = read_prefix::<UVM_UNREGISTER_GPU_VASPACE_PARAMS>(top);
                let u = uuid_string(&p.gpuUuid.uuid);
                self.va_spaces.retain(|g| g.uuid != u);
            }
            UVM_DEINITIALIZE => {}
            c if QUERIES.contains(&c) => {}
            _ => *self.unreplayable.entry(name).or_insert(0) += 1,
        }
        if full && matches!(cmd, UVM_REGISTER_GPU | UVM_REGISTER_GPU_VASPACE) {
            *self
                .unreplayable
                .entry("registrations past the bound")
                .or_insert(0) += 1;
        }
    }
}

/// A UVM call of a replay with params `p`, whose `rmStatus` `status` reads (an errno or a
/// bad status is an error).
fn uvm_call<P: Params>(
    file: &dyn HostFile,
    cmd: u32,
    p: P,
    status: impl FnOnce(&P) -> u32,
    what: &str,
) -> Result<(), CheckpointError> {
    let mut plan = Plan::new(cmd, p.as_bytes());
    let err = |why: String| CheckpointError::Replay {
        what: what.to_owned(),
        why,
    };
    plan.exec(file).map_err(|e| match e {
        ProxyError::Host(e) => err(format!("host ioctl failed: {e}")),
        e => err(e.to_string()),
    })?;
    let s = status(&plan.get::<P>(None));
    if s != NV_OK {
        return Err(err(format!("status {s:#x}")));
    }
    Ok(())
}

impl UvmProxy {
    /// Saves the instance: the frontend's part ([`Proxy::checkpoint`]) and every UVM open.
    /// Fails, naming every item of both parts, when anything cannot be replayed.
    pub fn checkpoint(&self) -> Result<Checkpoint, CheckpointError> {
        let mut items = Vec::new();
        let mut uvm = Vec::new();
        let mut ids: Vec<OpenId> = lock(&self.opens).keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let Some(open) = lock(&self.opens).get(&id).cloned() else {
                continue;
            };
            let rec = lock(&open.record);
            for (name, n) in &rec.unreplayable {
                items.push(format!(
                    "UVM open {}: {name} ({n} call(s)) left va_space state replay does not re-create",
                    id.0
                ));
            }
            if rec.mapped {
                items.push(format!(
                    "UVM open {}: the tenant mapped the va_space (managed memory), whose contents and mappings are not saved",
                    id.0
                ));
            }
            uvm.push(SavedUvmOpen {
                id: id.0,
                init_flags: rec.init_flags,
                mm_of: rec.mm_of.map(|o| o.0),
                gpus: rec.gpus.clone(),
                gpu_va_spaces: rec.va_spaces.clone(),
            });
        }
        let mut ckpt = match self.proxy.checkpoint() {
            Ok(c) => c,
            Err(CheckpointError::Unreplayable {
                instance,
                items: mut rm,
            }) => {
                rm.extend(items);
                return Err(CheckpointError::Unreplayable {
                    instance,
                    items: rm,
                });
            }
            Err(e) => return Err(e),
        };
        if !items.is_empty() {
            return Err(CheckpointError::Unreplayable {
                instance: ckpt.instance,
                items,
            });
        }
        ckpt.uvm = uvm;
        Ok(ckpt)
    }

    /// Restores the UVM opens of `ckpt` next to `proxy`, the instance's frontend as
    /// [`Proxy::restore`] made it (`gpus`: its (saved, new) GPU pairs, which remap UUIDs). On
    /// failure every UVM file opened here is closed again.
    pub fn restore(
        proxy: Arc<Proxy>,
        ckpt: &Checkpoint,
        gpus: &[(DeviceIdentity, DeviceIdentity)],
    ) -> Result<UvmProxy, CheckpointError> {
        let me = UvmProxy::new(proxy.clone())?;
        if let Err(e) = me.replay(&proxy, ckpt, gpus) {
            // Closes every UVM file opened here and gives back its open slot.
            me.release_all();
            return Err(e);
        }
        info!(instance = %proxy.policy().name, uvm_opens = ckpt.uvm.len(), "UVM restored");
        Ok(me)
    }

    fn replay(
        &self,
        proxy: &Proxy,
        ckpt: &Checkpoint,
        gpus: &[(DeviceIdentity, DeviceIdentity)],
    ) -> Result<(), CheckpointError> {
        let me = self;
        let remap = |u: &str, what: &str| -> Result<[u8; 16], CheckpointError> {
            let new = gpus
                .iter()
                .find(|(o, _)| o.uuid.eq_ignore_ascii_case(u))
                .map(|(_, n)| n.uuid.as_str())
                .ok_or_else(|| CheckpointError::Replay {
                    what: what.to_owned(),
                    why: format!("GPU {u} is not one of the saved GPUs"),
                })?;
            parse_uuid(new).ok_or_else(|| CheckpointError::Format(format!("bad UUID {new}")))
        };
        let rm_fd = |o: Option<u64>, what: &str| -> Result<i32, CheckpointError> {
            match o {
                None => Ok(-1),
                Some(o) => proxy
                    .host_file_id(OwnerId(o))
                    .ok_or_else(|| CheckpointError::Replay {
                        what: what.to_owned(),
                        why: format!(
                            "rmCtrlFd's open {o} is not a frontend open of the checkpoint"
                        ),
                    }),
            }
        };
        for u in &ckpt.uvm {
            let what = format!("UVM open {}", u.id);
            // The record names the GPUs by their new UUIDs (what a later save identifies).
            let new_uuid = |old: &str| remap(old, &what).map(|u| uuid_string(&u));
            let mut gpus_now = u.gpus.clone();
            for g in &mut gpus_now {
                g.uuid = new_uuid(&g.uuid)?;
            }
            let mut va_spaces_now = u.gpu_va_spaces.clone();
            for v in &mut va_spaces_now {
                v.uuid = new_uuid(&v.uuid)?;
            }
            let host = match proxy.open_host(NodeKind::Uvm) {
                Ok(h) => h,
                Err(ProxyError::Host(e)) => {
                    return Err(CheckpointError::Replay {
                        what,
                        why: format!("host open failed: {e}"),
                    });
                }
                Err(e) => return Err(e.into()),
            };
            if let Some(flags) = u.init_flags {
                let mut p = UVM_INITIALIZE_PARAMS::new_zeroed();
                // As the request path: multi-process sharing mode forced on.
                p.flags = flags | UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE;
                let r = uvm_call(&*host, UVM_INITIALIZE, p, |p| p.rmStatus, &what);
                if let Err(e) = r {
                    proxy.release_open_slot();
                    return Err(e);
                }
            }
            lock(&me.opens).insert(
                OwnerId(u.id),
                Arc::new(UvmOpen {
                    host,
                    record: Mutex::new(UvmRecord {
                        init_flags: u.init_flags,
                        mm_of: u.mm_of.map(OwnerId),
                        gpus: gpus_now,
                        va_spaces: va_spaces_now,
                        ..UvmRecord::default()
                    }),
                }),
            );
        }
        for u in &ckpt.uvm {
            let file = lock(&me.opens)[&OwnerId(u.id)].host.clone();
            if let Some(target) = u.mm_of {
                let what = format!("UVM open {} MM_INITIALIZE", u.id);
                let fd = lock(&me.opens)
                    .get(&OwnerId(target))
                    .map(|o| o.host.id())
                    .ok_or_else(|| CheckpointError::Replay {
                        what: what.clone(),
                        why: format!("uvmFd's open {target} is not a UVM open of the checkpoint"),
                    })?;
                let mut p = UVM_MM_INITIALIZE_PARAMS::new_zeroed();
                p.uvmFd = fd;
                uvm_call(&*file, UVM_MM_INITIALIZE, p, |p| p.rmStatus, &what)?;
            }
            for g in &u.gpus {
                let what = format!("UVM open {} REGISTER_GPU {}", u.id, g.uuid);
                let mut p = UVM_REGISTER_GPU_PARAMS::new_zeroed();
                p.gpu_uuid.uuid = remap(&g.uuid, &what)?;
                p.rmCtrlFd = rm_fd(g.rm_ctrl_open, &what)?;
                p.hClient = if g.h_client == 0 {
                    0
                } else {
                    proxy.host_client(g.h_client)
                };
                p.hSmcPartRef = g.h_smc_part_ref;
                uvm_call(&*file, UVM_REGISTER_GPU, p, |p| p.rmStatus, &what)?;
            }
            for v in &u.gpu_va_spaces {
                let what = format!("UVM open {} REGISTER_GPU_VASPACE {}", u.id, v.uuid);
                let mut p = UVM_REGISTER_GPU_VASPACE_PARAMS::new_zeroed();
                p.gpuUuid.uuid = remap(&v.uuid, &what)?;
                p.rmCtrlFd = rm_fd(v.rm_ctrl_open, &what)?;
                p.hClient = proxy.host_client(v.h_client);
                p.hVaSpace = v.h_va_space;
                uvm_call(&*file, UVM_REGISTER_GPU_VASPACE, p, |p| p.rmStatus, &what)?;
            }
        }
        Ok(())
    }
}

/// Restores a whole instance, frontend then UVM ([`Proxy::restore`], [`UvmProxy::restore`]):
/// all of it or nothing (a UVM failure drops the frontend's files too).
pub fn restore_instance(
    ckpt: &Checkpoint,
    policy: InstancePolicy,
    host: Arc<dyn ioctl_proxy::HostDriver>,
    rules: &[RemapRule],
) -> Result<(Arc<Proxy>, UvmProxy), CheckpointError> {
    let restored = Proxy::restore(ckpt, policy, host, rules)?;
    let proxy = Arc::new(restored.proxy);
    match UvmProxy::restore(proxy.clone(), ckpt, &restored.gpus) {
        Ok(uvm) => Ok((proxy, uvm)),
        Err(e) => {
            proxy.release_all();
            Err(e)
        }
    }
}
