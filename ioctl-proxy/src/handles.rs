//! Client-handle translation on the way to the driver, for instances whose clients a restore
//! had to re-create under driver-chosen handles (`replay.rs`: the tenant's handle was taken on
//! the host). The tenant keeps its handles; the object table is keyed by them; only the host
//! call sees the driver's. Object handles never need it (each client is a fresh namespace).
//!
//! Translated: the client field of every RM escape's top-level params (offset 0 in each of
//! them), the object fields there that may name the client itself (a control or free on the
//! client, a parent that is the client), and, in `alloc.rs`, the alloc params fields that name
//! clients. The client gets its own values back (the plan restores rewritten fields). Not
//! translated: client handles inside RM control params and `RM_IDLE_CHANNELS`' arrays, and a
//! share policy's target client (docs/architecture/checkpoint.md).

use std::mem::offset_of;

use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::{
    NVOS00_PARAMETERS, NVOS02_PARAMETERS, NVOS32_PARAMETERS, NVOS54_PARAMETERS, NVOS55_PARAMETERS,
    NVOS57_PARAMETERS, NVOS64_PARAMETERS,
};

use crate::plan::{Plan, rd32};
use crate::proxy::Proxy;

/// For an escape: the object fields of its top-level params that may be the client itself
/// (its client field is at offset 0 in every RM escape). `None`: the escape names no client.
fn object_fields(nr: u8) -> Option<&'static [usize]> {
    const ALLOC: [usize; 1] = [offset_of!(NVOS64_PARAMETERS, hObjectParent)];
    const FREE: [usize; 2] = [
        offset_of!(NVOS00_PARAMETERS, hObjectParent),
        offset_of!(NVOS00_PARAMETERS, hObjectOld),
    ];
    const CONTROL: [usize; 1] = [offset_of!(NVOS54_PARAMETERS, hObject)];
    const DUP: [usize; 1] = [offset_of!(NVOS55_PARAMETERS, hParent)];
    const SHARE: [usize; 1] = [offset_of!(NVOS57_PARAMETERS, hObject)];
    const ALLOC_MEMORY: [usize; 1] = [offset_of!(NVOS02_PARAMETERS, hObjectParent)];
    const VID_HEAP: [usize; 1] = [offset_of!(NVOS32_PARAMETERS, hObjectParent)];
    Some(match nr {
        NV_ESC_RM_ALLOC => &ALLOC,
        NV_ESC_RM_FREE => &FREE,
        NV_ESC_RM_CONTROL => &CONTROL,
        NV_ESC_RM_DUP_OBJECT => &DUP,
        NV_ESC_RM_SHARE => &SHARE,
        NV_ESC_RM_ALLOC_MEMORY => &ALLOC_MEMORY,
        NV_ESC_RM_VID_HEAP_CONTROL => &VID_HEAP,
        NV_ESC_RM_MAP_MEMORY
        | NV_ESC_RM_UNMAP_MEMORY
        | NV_ESC_RM_MAP_MEMORY_DMA
        | NV_ESC_RM_UNMAP_MEMORY_DMA
        | NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO
        | NV_ESC_RM_ALLOC_CONTEXT_DMA2
        | NV_ESC_RM_IDLE_CHANNELS
        | NV_ESC_ALLOC_OS_EVENT
        | NV_ESC_FREE_OS_EVENT => &[],
        _ => return None,
    })
}

impl Proxy {
    /// Rewrites the client handles of a planned host call to the driver's (no-op unless a
    /// restore translated some). `root_alloc`: an `RM_ALLOC` of a client, whose `hRoot` is the
    /// handle asked for, not a client to translate.
    pub(crate) fn translate_clients(&self, plan: &mut Plan, root_alloc: bool) {
        if !self.translates_clients() {
            return;
        }
        let nr = ioc_nr(plan.call.cmd);
        let Some(objects) = object_fields(nr) else {
            return;
        };
        let tenant = rd32(plan.buf(None), 0);
        let host = self.host_client(tenant);
        if host == tenant || root_alloc {
            return;
        }
        plan.rewrite32(None, 0, host);
        for &off in objects {
            if rd32(plan.buf(None), off) == tenant {
                plan.rewrite32(None, off, host);
            }
        }
        if nr == NV_ESC_RM_DUP_OBJECT {
            let src_off = offset_of!(NVOS55_PARAMETERS, hClientSrc);
            let src = rd32(plan.buf(None), src_off);
            let src_host = self.host_client(src);
            if src_host != src {
                plan.rewrite32(None, src_off, src_host);
                let obj = offset_of!(NVOS55_PARAMETERS, hObjectSrc);
                if rd32(plan.buf(None), obj) == src {
                    plan.rewrite32(None, obj, src_host);
                }
            }
        }
    }

    /// The tenant's name for a client the driver just made as `host`: `host` itself, unless
    /// the tenant already knows another client by that name (a translated one), then a fresh
    /// name, translated.
    pub(crate) fn name_new_client(&self, host: u32) -> u32 {
        if !self.translates_clients() {
            return host;
        }
        let taken = |h: u32| self.objects().contains(h, h) || self.host_client(h) != h;
        if !taken(host) {
            return host;
        }
        // Client handles are 0xc1d00000 | index (20 bits); aliases come from above them.
        let mut alias = 0xc1e0_0000u32;
        while taken(alias) || self.tenant_client(alias) != alias {
            alias = alias.wrapping_add(1);
        }
        self.map_client(alias, host);
        alias
    }
}
