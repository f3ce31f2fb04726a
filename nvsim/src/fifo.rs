//! Channels: `KEPLER_CHANNEL_GROUP_A` (a TSG), `FERMI_CONTEXT_SHARE_A` (a subcontext of a
//! TSG), `HOPPER_CHANNEL_GPFIFO_A` (a channel: GPFIFO ring, USERD, channel id, work-submit
//! token, error notifier), the engine objects a channel carries (`HOPPER_COMPUTE_A`,
//! `HOPPER_DMA_COPY_A`) and the channel and TSG controls, with the parameter checks and
//! statuses of `kchangrpapiConstruct`, `kctxshareapiConstruct`/`kctxshareInitCommon`,
//! `kchannelConstruct`, `chandesConstruct`, `kceContextConstruct` and
//! `kfifoGenerateWorkSubmitToken_GA100` (`src/nvidia/src/kernel/gpu/fifo/*.c`,
//! `gpu/ce/kernel_ce_context.c`, driver 535). What the channel *executes* is `gpfifo.rs`.
//!
//! Simplified, and said where it matters: one runlist per engine (GR0 is runlist 0, COPYn is
//! runlist n + 1; the real map is the board's); the TSG's internal `KERNEL_GRAPHICS_CONTEXT`
//! child and the context buffers RM allocates for it are not modelled (no handle is taken for
//! them); a channel without `hUserdMemory` gets no USERD the client can see (libcuda always
//! passes its own); MIG, vGPU and confidential-computing channels are not simulated.

use std::collections::{BTreeMap, BTreeSet};

use nvproxy_abi::structs::{
    NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS, NV_CTXSHARE_ALLOCATION_PARAMETERS,
};

use crate::channel::{
    Channel, GP_ENTRY_BYTES, HOPPER_COMPUTE_A, HOPPER_DMA_COPY_A, Tsg, USERD_BYTES, cmd,
    work_submit_token,
};
use crate::driver::{Kind, SimDriver, State};
use crate::rm::AllocArgs;
use crate::status::*;

/// `NV_DEVICE_ALLOCATION_VAMODE_MULTIPLE_VASPACES`.
pub(crate) const VAMODE_MULTIPLE_VASPACES: u32 = 2;

/// `NV2080_ENGINE_TYPE_GR0`.
const ENGINE_GR0: u32 = 0x01;
/// `NV2080_ENGINE_TYPE_GR1..GR7`.
const ENGINE_GR_LAST: u32 = 0x08;
/// `NV2080_ENGINE_TYPE_COPY0..COPY9`.
const ENGINE_COPY0: u32 = 0x09;
const ENGINE_COPY9: u32 = 0x12;

/// The subcontexts of a Hopper TSG (`NV_PFIFO_... MAX_SUBCONTEXT`: 64 VEIDs).
const MAX_SUBCONTEXTS: u32 = 64;
/// Channels per runlist the simulator hands out (`NV_CHRAM_CHANNEL__SIZE_1` is 2048 on GH100).
const CHANNELS_PER_RUNLIST: u32 = 2048;

/// `NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT` (1:0): `_SYNC` 0, `_ASYNC` 1, `_SPECIFIED` 2.
const SUBCONTEXT_SYNC: u32 = 0;
const SUBCONTEXT_ASYNC: u32 = 1;
const SUBCONTEXT_SPECIFIED: u32 = 2;

/// `NV_CHANNEL_ALLOC_PARAMS` (`alloc/alloc_channel.h`, 535: 360 bytes; 570 appends
/// `tpcConfigID` and padding, 610 inserts `hHandleVASpace`): the offsets the simulator reads.
/// A private layout because nvproxy-abi does not model the struct (it has no pointers).
mod chan {
    pub const H_OBJECT_ERROR: usize = 0;
    pub const GPFIFO_OFFSET: usize = 8;
    pub const GPFIFO_ENTRIES: usize = 16;
    pub const FLAGS: usize = 20;
    pub const H_CONTEXT_SHARE: usize = 24;
    pub const H_VASPACE: usize = 28;
    pub const H_USERD_MEMORY: usize = 32;
    pub const USERD_OFFSET: usize = 64;
    pub const ENGINE_TYPE: usize = 128;
    pub const CID: usize = 132;
    pub const SUBDEVICE_ID: usize = 136;
    pub const H_OBJECT_ECC_ERROR: usize = 140;
}

/// `NVOS04_FLAGS_CHANNEL_TYPE` (1:0): only `_PHYSICAL` (0) is supported.
const NVOS04_FLAGS_CHANNEL_TYPE_MASK: u32 = 0x3;
/// `NVOS04_FLAGS_CHANNEL_USERD_INDEX_FIXED` (11:11) and `_PAGE_FIXED` (21:21).
const NVOS04_FLAGS_USERD_INDEX_FIXED: u32 = 1 << 11;
const NVOS04_FLAGS_USERD_INDEX_PAGE_FIXED: u32 = 1 << 21;
/// `NVOS04_FLAGS_CHANNEL_SKIP_SCRUBBER` (23:23): kernel clients only.
const NVOS04_FLAGS_SKIP_SCRUBBER: u32 = 1 << 23;
/// `NVOS04_FLAGS_DELAY_CHANNEL_SCHEDULING` (6:6).
const NVOS04_FLAGS_DELAY_CHANNEL_SCHEDULING: u32 = 1 << 6;
/// `NVOS04_FLAGS_PRIVILEGED_CHANNEL` (5:5): GSP-vGPU plugin only, ignored otherwise.
/// `NVOS04_FLAGS_GROUP_CHANNEL_THREAD` (29:28).
const NVOS04_FLAGS_GROUP_CHANNEL_THREAD_MASK: u32 = 0x3 << 28;

/// The runlist of an engine (see the module docs).
fn runlist_of(engine_type: u32) -> u32 {
    if engine_type == ENGINE_GR0 {
        0
    } else {
        engine_type - ENGINE_COPY0 + 1
    }
}

fn is_gr(engine_type: u32) -> bool {
    (ENGINE_GR0..=ENGINE_GR_LAST).contains(&engine_type)
}

fn is_copy(engine_type: u32) -> bool {
    (ENGINE_COPY0..=ENGINE_COPY9).contains(&engine_type)
}

/// Whether the simulated GPU has the engine (`NV2080_CTRL_CMD_GPU_GET_ENGINES_V2`'s list).
fn engine_exists(engine_type: u32) -> bool {
    crate::control_init::engines().contains(&engine_type)
}

impl State {
    /// The `FERMI_VASPACE_A` object `h` of `h_client` on GPU `gpu`: its VA space id.
    fn vaspace_of(&self, h_client: u32, h: u32, gpu: usize) -> Result<u64, u32> {
        match self.clients[&h_client].objects().get(&h).map(|o| &o.kind) {
            Some(Kind::VaSpace { gpu: g, id }) if *g == gpu => Ok(*id),
            Some(_) => Err(NV_ERR_INVALID_OBJECT_HANDLE),
            None => Err(NV_ERR_OBJECT_NOT_FOUND),
        }
    }

    /// The device object `h` of `h_client`: (GPU, vaMode).
    fn device_of(&self, h_client: u32, h: u32) -> Option<(usize, u32)> {
        match self.clients[&h_client].objects().get(&h)?.kind {
            Kind::Device { gpu, va_mode, .. } => Some((gpu, va_mode)),
            _ => None,
        }
    }

    /// `kchangrpapiConstruct`.
    pub(crate) fn construct_tsg(&mut self, id: u64, a: &mut AllocArgs<'_>) -> Result<Kind, u32> {
        let p = a.params.as_deref().ok_or(NV_ERR_INVALID_ARGUMENT)?;
        let tp: NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS =
            crate::buf::read(p, 0).ok_or(NV_ERR_INVALID_ADDRESS)?;
        // deviceGetByHandle on the parent.
        let (gpu, va_mode) = self
            .device_of(a.h_client, a.h_parent)
            .ok_or(NV_ERR_INVALID_ARGUMENT)?;
        // kfifoIsPerRunlistChramSupportedInHw (Ampere and later): a valid engine is required.
        if !engine_exists(tp.engineType) {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        // Only GR0 without MIG.
        if is_gr(tp.engineType) && tp.engineType != ENGINE_GR0 {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        if !is_gr(tp.engineType) && !is_copy(tp.engineType) {
            // Video engines, SEC2, OFA: their channels are not simulated.
            return Err(NV_ERR_NOT_SUPPORTED);
        }
        if va_mode != VAMODE_MULTIPLE_VASPACES || tp.hVASpace != 0 {
            if tp.hVASpace == 0 {
                // vaspaceGetByHandleOrDeviceDefault: the device's own VA space, not simulated.
                return Err(NV_ERR_NOT_SUPPORTED);
            }
            self.vaspace_of(a.h_client, tp.hVASpace, gpu)?;
        }
        self.fifo.tsgs.insert(
            id,
            Tsg {
                gpu,
                engine_type: tp.engineType,
                h_vaspace: tp.hVASpace,
                subctx: BTreeSet::new(),
                channels: 0,
                scheduled: false,
                // kfifoChannelGroupGetDefaultTimeslice_GV100: TIMEOUT_128 << SCALE_3.
                timeslice_us: 1024,
                // kchangrpapiConstruct_IMPL: NVA06C_CTRL_INTERLEAVE_LEVEL_MEDIUM.
                interleave: 1,
                legacy: None,
            },
        );
        Ok(Kind::ChannelGroup {
            gpu,
            id,
            h_vaspace: tp.hVASpace,
        })
    }

    /// `kctxshareapiConstruct` and `kctxshareInitCommon`.
    pub(crate) fn construct_ctxshare(&mut self, a: &mut AllocArgs<'_>) -> Result<Kind, u32> {
        let (tsg, gpu) = match self.clients[&a.h_client]
            .objects()
            .get(&a.h_parent)
            .map(|o| &o.kind)
        {
            Some(Kind::ChannelGroup { id, gpu, .. }) => (*id, *gpu),
            _ => return Err(NV_ERR_INVALID_OBJECT_HANDLE),
        };
        let p = a.params.as_deref_mut().ok_or(NV_ERR_INVALID_ARGUMENT)?;
        let mut cp: NV_CTXSHARE_ALLOCATION_PARAMETERS =
            crate::buf::read(p, 0).ok_or(NV_ERR_INVALID_ADDRESS)?;
        // A client-allocated share names its VA space (vaspaceGetByHandleOrDeviceDefault: 0 is
        // the device's default VA space, not simulated); only the legacy shares a TSG
        // allocates itself take the TSG's (set_legacy_mode).
        let h_vaspace = cp.hVASpace;
        if h_vaspace == 0 {
            return Err(NV_ERR_NOT_SUPPORTED);
        }
        self.vaspace_of(a.h_client, h_vaspace, gpu)?;
        let t = self.fifo.tsgs.get_mut(&tsg).expect("a TSG object's state");
        let id = match cp.flags & 0x3 {
            SUBCONTEXT_SYNC => 0,
            // eheap grows down: the highest free VEID in 1..=63, else 0.
            SUBCONTEXT_ASYNC => (1..MAX_SUBCONTEXTS)
                .rev()
                .find(|i| !t.subctx.contains(i))
                .unwrap_or(0),
            SUBCONTEXT_SPECIFIED => cp.subctxId,
            _ => return Err(NV_ERR_INVALID_ARGUMENT),
        };
        if id >= MAX_SUBCONTEXTS || t.subctx.contains(&id) {
            // eheapAlloc of a fixed address that is taken or outside the heap.
            return Err(NV_ERR_NO_MEMORY);
        }
        t.subctx.insert(id);
        cp.subctxId = id;
        crate::buf::write(p, 0, &cp);
        Ok(Kind::CtxShare {
            tsg,
            subctx: id,
            h_vaspace,
        })
    }

    /// `kchannelConstruct` for `HOPPER_CHANNEL_GPFIFO_A`.
    pub(crate) fn construct_channel(
        &mut self,
        drv: &SimDriver,
        id: u64,
        a: &mut AllocArgs<'_>,
    ) -> Result<Kind, u32> {
        let p = a.params.as_deref_mut().ok_or(NV_ERR_INVALID_ARGUMENT)?;
        let rd = |off: usize| crate::buf::read::<u32>(p, off).unwrap_or(0);
        let h_error = rd(chan::H_OBJECT_ERROR);
        let gpfifo_va: u64 = crate::buf::read(p, chan::GPFIFO_OFFSET).unwrap_or(0);
        let entries = rd(chan::GPFIFO_ENTRIES);
        let flags = rd(chan::FLAGS);
        let h_ctxshare = rd(chan::H_CONTEXT_SHARE);
        let h_vas_param = rd(chan::H_VASPACE);
        let h_userd = rd(chan::H_USERD_MEMORY);
        let userd_offset: u64 = crate::buf::read(p, chan::USERD_OFFSET).unwrap_or(0);
        let engine_type = rd(chan::ENGINE_TYPE);
        let subdevice = rd(chan::SUBDEVICE_ID);
        let _ecc = rd(chan::H_OBJECT_ECC_ERROR);
        let _ = drv;
        // hContextShare and hVASpace are exclusive.
        if h_ctxshare != 0 && h_vas_param != 0 {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        // The parent: a TSG (a bare channel under a device would get an internal TSG; libcuda
        // never asks for one and it is not simulated).
        let (tsg, gpu) = match self.clients[&a.h_client]
            .objects()
            .get(&a.h_parent)
            .map(|o| &o.kind)
        {
            Some(Kind::ChannelGroup { id, gpu, .. }) => (*id, *gpu),
            Some(Kind::Device { .. }) => return Err(NV_ERR_NOT_SUPPORTED),
            _ => return Err(NV_ERR_INVALID_OBJECT_PARENT),
        };
        if h_vas_param != 0 {
            // A channel in a TSG takes its VA space from the context share.
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        if flags & NVOS04_FLAGS_CHANNEL_TYPE_MASK != 0 {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        if flags & NVOS04_FLAGS_SKIP_SCRUBBER != 0 {
            // Only kernel clients may skip the scrubber.
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        if flags & NVOS04_FLAGS_USERD_INDEX_PAGE_FIXED != 0
            && flags & NVOS04_FLAGS_USERD_INDEX_FIXED == 0
        {
            return Err(NV_ERR_INVALID_STATE);
        }
        let thread = (flags & NVOS04_FLAGS_GROUP_CHANNEL_THREAD_MASK) >> 28;
        if subdevice > 1 {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        let tsg_engine = self.fifo.tsgs[&tsg].engine_type;
        // The channel's engine, when given, must be its TSG's.
        if engine_type != 0 && engine_type != tsg_engine {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        // A TSG's channels all name a context share, or none does (legacy mode).
        let (chan_count, legacy) = {
            let t = &self.fifo.tsgs[&tsg];
            (t.channels, t.legacy)
        };
        if chan_count != 0 && (legacy.is_some() == (h_ctxshare != 0)) {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        let h_share = if h_ctxshare != 0 {
            h_ctxshare
        } else {
            let (sync, asynch) = match legacy {
                Some(l) => l,
                None => self.set_legacy_mode(a.h_client, a.h_parent, tsg)?,
            };
            // NVOS04_FLAGS_GROUP_CHANNEL_THREAD picks the legacy share: 0 SYNC, 1 ASYNC.
            match thread {
                0 => sync,
                1 => asynch,
                _ => return Err(NV_ERR_INVALID_ARGUMENT),
            }
        };
        // The context share: a FERMI_CONTEXT_SHARE_A of this TSG.
        let h_vaspace = match self.clients[&a.h_client].objects().get(&h_share) {
            Some(o) if o.parent == a.h_parent => match o.kind {
                Kind::CtxShare { h_vaspace, .. } => h_vaspace,
                _ => return Err(NV_ERR_INVALID_OBJECT_PARENT),
            },
            _ => return Err(NV_ERR_INVALID_OBJECT_PARENT),
        };
        // GPFIFO: a power of two of entries (kchannelAllocHwID_HAL / the RAMFC GP_BASE limit).
        if entries == 0 || !entries.is_power_of_two() || !gpfifo_va.is_multiple_of(GP_ENTRY_BYTES) {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        // Client-allocated USERD: a memory object of this client, 512 bytes inside it.
        let userd = if h_userd != 0 {
            let block = match self.clients[&a.h_client]
                .objects()
                .get(&h_userd)
                .map(|o| &o.kind)
            {
                Some(Kind::Memory { block }) => *block,
                Some(_) => return Err(NV_ERR_INVALID_OBJECT),
                None => return Err(NV_ERR_OBJECT_NOT_FOUND),
            };
            let bytes = self.blocks.get(&block).map_or(0, |b| b.bytes);
            if !userd_offset.is_multiple_of(USERD_BYTES)
                || userd_offset
                    .checked_add(USERD_BYTES)
                    .is_none_or(|e| e > bytes)
            {
                return Err(NV_ERR_INVALID_ARGUMENT);
            }
            Some((block, userd_offset))
        } else {
            None
        };
        let error_notifier = if h_error != 0 {
            match self.clients[&a.h_client]
                .objects()
                .get(&h_error)
                .map(|o| &o.kind)
            {
                Some(Kind::Memory { block }) => Some(*block),
                Some(_) => return Err(NV_ERR_INVALID_OBJECT),
                None => return Err(NV_ERR_OBJECT_NOT_FOUND),
            }
        } else {
            None
        };
        let runlist = runlist_of(tsg_engine);
        let chid = (0..CHANNELS_PER_RUNLIST)
            .find(|c| !self.fifo.chids.contains(&(gpu, runlist, *c)))
            .ok_or(NV_ERR_INSUFFICIENT_RESOURCES)?;
        self.fifo.chids.insert((gpu, runlist, chid));
        let t = self.fifo.tsgs.get_mut(&tsg).expect("a TSG object's state");
        t.channels += 1;
        let scheduled = t.scheduled && flags & NVOS04_FLAGS_DELAY_CHANNEL_SCHEDULING == 0;
        // The driver reports the channel id back in `cid`.
        crate::buf::write(p, chan::CID, &chid);
        self.fifo.channels.insert(
            id,
            Channel {
                gpu,
                h_client: a.h_client,
                tsg,
                engine_type: tsg_engine,
                runlist,
                chid,
                h_vaspace,
                gpfifo_va,
                gpfifo_entries: entries,
                userd,
                error_notifier,
                scheduled,
                objects: BTreeMap::new(),
                exec: Default::default(),
            },
        );
        Ok(Kind::Channel {
            id,
            h_ctxshare: h_share,
        })
    }

    /// `kchangrpapiSetLegacyMode`: the TSG allocates its SYNC and ASYNC context shares (two
    /// RM objects under it with driver-chosen handles, in its VA space; a Volta+ TSG has two
    /// legacy subcontexts). Returns their handles.
    fn set_legacy_mode(&mut self, h_client: u32, h_tsg: u32, tsg: u64) -> Result<(u32, u32), u32> {
        let h_vaspace = self.fifo.tsgs[&tsg].h_vaspace;
        if !self.fifo.tsgs[&tsg].subctx.is_empty() {
            return Err(NV_ERR_INVALID_STATE);
        }
        if h_vaspace == 0 {
            // The device's default VA space, not simulated.
            return Err(NV_ERR_NOT_SUPPORTED);
        }
        let mut handles = [0u32; 2];
        for (subctx, h) in (0u32..).zip(handles.iter_mut()) {
            *h = self.assign_handle(h_client, 0)?;
            self.clients
                .get_mut(&h_client)
                .expect("checked")
                .insert_object(
                    *h,
                    crate::driver::Object {
                        class: crate::rm::FERMI_CONTEXT_SHARE_A,
                        parent: h_tsg,
                        kind: Kind::CtxShare {
                            tsg,
                            subctx,
                            h_vaspace,
                        },
                    },
                );
        }
        let t = self.fifo.tsgs.get_mut(&tsg).expect("a TSG object's state");
        t.subctx.extend([0, 1]);
        t.legacy = Some((handles[0], handles[1]));
        Ok((handles[0], handles[1]))
    }

    /// `chandesConstruct` + the engine's constructor, for the compute and copy classes.
    pub(crate) fn construct_engine_object(
        &mut self,
        h_new: u32,
        a: &mut AllocArgs<'_>,
    ) -> Result<Kind, u32> {
        let chan = match self.clients[&a.h_client]
            .objects()
            .get(&a.h_parent)
            .map(|o| &o.kind)
        {
            Some(Kind::Channel { id, .. }) => *id,
            _ => return Err(NV_ERR_INVALID_OBJECT_PARENT),
        };
        let engine = self.fifo.channels[&chan].engine_type;
        let object_engine = match a.class {
            HOPPER_COMPUTE_A => {
                // kgrobjConstruct: a GR class needs the channel on a GR runlist.
                if !is_gr(engine) {
                    return Err(NV_ERR_INVALID_CLASS);
                }
                engine
            }
            HOPPER_DMA_COPY_A => {
                // kceContextConstruct: NVB0B5_ALLOCATION_PARAMETERS {version, engineType}.
                let (version, ce) = match a.params.as_deref() {
                    Some(p) => (
                        crate::buf::read::<u32>(p, 0).unwrap_or(0),
                        crate::buf::read::<u32>(p, 4).unwrap_or(0),
                    ),
                    None => return Err(NV_ERR_INVALID_ARGUMENT),
                };
                let ce_engine = match version {
                    // VERSION_0: engineType is a CE index.
                    0 => ENGINE_COPY0.checked_add(ce).filter(|&e| e <= ENGINE_COPY9),
                    1 => Some(ce).filter(|&e| is_copy(e)),
                    _ => return Err(NV_ERR_INVALID_ARGUMENT),
                }
                .ok_or(NV_ERR_INVALID_ARGUMENT)?;
                // The channel's runlist must serve the CE: its own COPY runlist, or the GR
                // runlist (a GRCE, partner of GR0).
                if is_copy(engine) && ce_engine != engine {
                    return Err(NV_ERR_INVALID_CLASS);
                }
                let grce =
                    crate::control_init::ce_caps()[(ce_engine - ENGINE_COPY0) as usize][0] & 0x01;
                if is_gr(engine) && grce == 0 {
                    return Err(NV_ERR_INVALID_CLASS);
                }
                ce_engine
            }
            _ => return Err(NV_ERR_INVALID_CLASS),
        };
        let c = self
            .fifo
            .channels
            .get_mut(&chan)
            .expect("a channel object's state");
        c.objects.insert(h_new, (a.class, object_engine));
        Ok(Kind::EngineObject { channel: chan })
    }

    /// Releases the channel state of a freed object.
    pub(crate) fn destroy_fifo(&mut self, h: u32, kind: &Kind) {
        match *kind {
            Kind::ChannelGroup { id, .. } => {
                self.fifo.tsgs.remove(&id);
            }
            Kind::CtxShare { tsg, subctx, .. } => {
                if let Some(t) = self.fifo.tsgs.get_mut(&tsg) {
                    t.subctx.remove(&subctx);
                }
            }
            Kind::Channel { id, .. } => {
                if let Some(c) = self.fifo.channels.remove(&id) {
                    self.fifo.chids.remove(&(c.gpu, c.runlist, c.chid));
                    if let Some(t) = self.fifo.tsgs.get_mut(&c.tsg) {
                        t.channels -= 1;
                    }
                }
            }
            Kind::EngineObject { channel } => {
                if let Some(c) = self.fifo.channels.get_mut(&channel) {
                    c.objects.remove(&h);
                }
            }
            _ => {}
        }
    }
}

/// The smallest timeslice accepted (`kfifoRunlistGetMinTimeSlice`; the simulator's floor).
const TIMESLICE_MIN_US: u64 = 1;
/// `sizeof(NvNotification)`.
pub(crate) const NOTIFICATION_BYTES: u64 = 16;

/// A control on a TSG or channel object; `None` when the object is neither.
pub(crate) fn control(
    st: &mut State,
    c: &mut crate::control_ctx::Ctx<'_>,
    h_client: u32,
    h_object: u32,
    command: u32,
) -> Option<u32> {
    let kind = st
        .clients
        .get(&h_client)?
        .objects()
        .get(&h_object)?
        .kind
        .clone();
    Some(match (command, kind) {
        (cmd::TSG_GPFIFO_SCHEDULE, Kind::ChannelGroup { id, .. }) => {
            // {bEnable, bSkipSubmit (545+)}: schedule every channel of the TSG.
            let enable = c.get::<u8>(0).unwrap_or(0) != 0;
            if let Some(t) = st.fifo.tsgs.get_mut(&id) {
                t.scheduled = enable;
            }
            for ch in st.fifo.channels.values_mut().filter(|ch| ch.tsg == id) {
                ch.scheduled = enable;
            }
            NV_OK
        }
        (cmd::TSG_SET_TIMESLICE, Kind::ChannelGroup { id, .. }) => {
            let us: u64 = c.get(0).unwrap_or(0);
            if us < TIMESLICE_MIN_US {
                return Some(NV_ERR_INVALID_ARGUMENT);
            }
            if let Some(t) = st.fifo.tsgs.get_mut(&id) {
                t.timeslice_us = us;
            }
            NV_OK
        }
        (cmd::TSG_GET_TIMESLICE, Kind::ChannelGroup { id, .. }) => {
            let us = st.fifo.tsgs.get(&id).map_or(0, |t| t.timeslice_us);
            c.put(0, &us);
            NV_OK
        }
        (cmd::TSG_PREEMPT, Kind::ChannelGroup { .. }) => {
            // The front end runs work to completion when the doorbell rings: nothing is ever
            // resident to preempt.
            NV_OK
        }
        (cmd::TSG_GET_INFO, Kind::ChannelGroup { id, .. }) => {
            // tsgID is an NvU32: the id's low 32 bits.
            c.put(0, &((id & 0xffff_ffff) as u32));
            NV_OK
        }
        // RS_ACCESS_NICE (accessRight 0x2 in the method tables), checked before the control
        // runs; the GET forms are in no exported method table (NV_ERR_NOT_SUPPORTED, as any
        // control the simulator lacks). kchangrpSetInterleaveLevel_IMPL: LOW/MEDIUM/HIGH or
        // NV_ERR_INVALID_ARGUMENT; the channel's form sets its whole TSG's level.
        (cmd::TSG_SET_INTERLEAVE_LEVEL, Kind::ChannelGroup { id: tsg, .. })
        | (cmd::CHANNEL_SET_INTERLEAVE_LEVEL, Kind::Channel { id: tsg, .. }) => {
            if !crate::caller::caller_has_nice() {
                return Some(NV_ERR_INSUFFICIENT_PERMISSIONS);
            }
            let level: u32 = c.get(0).unwrap_or(u32::MAX);
            if level > 2 {
                return Some(NV_ERR_INVALID_ARGUMENT);
            }
            let tsg = if command == cmd::CHANNEL_SET_INTERLEAVE_LEVEL {
                st.fifo.channels.get(&tsg).map_or(u64::MAX, |ch| ch.tsg)
            } else {
                tsg
            };
            if let Some(t) = st.fifo.tsgs.get_mut(&tsg) {
                t.interleave = level;
            }
            NV_OK
        }
        (cmd::CHANNEL_GPFIFO_SCHEDULE, Kind::Channel { id, .. }) => {
            let enable = c.get::<u8>(0).unwrap_or(0) != 0;
            if let Some(ch) = st.fifo.channels.get_mut(&id) {
                ch.scheduled = enable;
            }
            NV_OK
        }
        (cmd::GET_CLASS_ENGINEID | cmd::GET_CLASS_ENGINEID_906F, Kind::Channel { id, .. }) => {
            // kchannelCtrlCmdGetClassEngineid / kchannelGetClassEngineID_GM107:
            // {hObject, classEngineID, classID, engineID}; classEngineID is the class in
            // NV906F_SET_OBJECT_NVCLASS (15:0).
            let h: u32 = c.get(0).unwrap_or(0);
            if h == 0 {
                return Some(NV_ERR_OBJECT_NOT_FOUND);
            }
            let Some(&(class, engine)) =
                st.fifo.channels.get(&id).and_then(|ch| ch.objects.get(&h))
            else {
                return Some(NV_ERR_OBJECT_NOT_FOUND);
            };
            c.put(4, &(class & 0xffff));
            c.put(8, &class);
            c.put(12, &engine);
            NV_OK
        }
        (cmd::RESET_CHANNEL, Kind::Channel { .. }) => {
            // kchannelCtrlCmdResetChannel: {engineID, subdeviceInstance, resetReason}; a
            // reason past NV906F_CTRL_CMD_RESET_CHANNEL_REASON_ENUM_MAX (3) from a client is
            // NV_ERR_INVALID_PARAMETER; the reset itself is GSP's (not public). The simulated
            // engines hold no state between pushbuffers, so there is nothing to reset; a
            // channel error already raised stays (RC: the client frees the channel).
            let reason: u32 = c.get(8).unwrap_or(u32::MAX);
            if reason >= 3 {
                return Some(NV_ERR_INVALID_PARAMETER);
            }
            NV_OK
        }
        (cmd::DEBUG_SET_EXCEPTION_MASK, Kind::Debugger { .. }) => {
            // {exceptionMask}: NV83DE_CTRL_DEBUG_SET_EXCEPTION_MASK_* bits within _ALL
            // (0xffff). Which SM exceptions raise debug events; no SM ever raises one here.
            let mask: u32 = c.get(0).unwrap_or(u32::MAX);
            if mask & !0xffff != 0 {
                return Some(NV_ERR_INVALID_ARGUMENT);
            }
            NV_OK
        }
        (cmd::DEBUG_SET_MODE_MMU_DEBUG, Kind::Debugger { .. }) => {
            // {action}: _ENABLE (1) or _DISABLE (2).
            let action: u32 = c.get(0).unwrap_or(0);
            if !matches!(action, 1 | 2) {
                return Some(NV_ERR_INVALID_ARGUMENT);
            }
            NV_OK
        }
        (cmd::GET_WORK_SUBMIT_TOKEN, Kind::Channel { id, .. }) => {
            let Some(ch) = st.fifo.channels.get(&id) else {
                return Some(NV_ERR_INVALID_CHANNEL);
            };
            c.put(0, &work_submit_token(ch));
            NV_OK
        }
        (cmd::SET_WORK_SUBMIT_TOKEN_NOTIF_INDEX, Kind::Channel { id, .. }) => {
            // kchannelUpdateWorkSubmitTokenNotifIndex: the notifier entry of the error
            // notifier memory where RM writes the token; entry 0 is the error's own
            // (NV_CHANNELGPFIFO_NOTIFICATION_TYPE_ERROR), and the entry must fit the memory.
            let index: u32 = c.get(0).unwrap_or(u32::MAX);
            if index == 0 {
                return Some(NV_ERR_INVALID_ARGUMENT);
            }
            let Some(ch) = st.fifo.channels.get(&id) else {
                return Some(NV_ERR_INVALID_CHANNEL);
            };
            if let Some(block) = ch.error_notifier {
                let bytes = st.blocks.get(&block).map_or(0, |b| b.bytes);
                if (u64::from(index) + 1) * NOTIFICATION_BYTES > bytes {
                    return Some(NV_ERR_OUT_OF_RANGE);
                }
            }
            if let Some(ch) = st.fifo.channels.get_mut(&id) {
                ch.exec.token_notif_index = Some(index);
            }
            NV_OK
        }
        _ => return None,
    })
}

/// `NV0080_CTRL_FIFO_GET_CHANNELLIST_INVALID_CHANNEL`.
const INVALID_CHANNEL: u32 = 0xffff_ffff;

/// The channel controls of a device object; `None` for the others.
pub(crate) fn device_control(
    st: &mut State,
    c: &mut crate::control_ctx::Ctx<'_>,
    h_client: u32,
    command: u32,
) -> Option<u32> {
    if command != cmd::DEVICE_FIFO_GET_CHANNELLIST {
        return None;
    }
    // deviceCtrlCmdFifoGetChannelList: for each handle, the channel id of that channel of the
    // client, or INVALID_CHANNEL.
    let n: u32 = c.get(0)?;
    if n == 0 {
        return Some(NV_ERR_INVALID_ARGUMENT);
    }
    let (Some(handles), Some(out)) = (
        crate::buf::child(c.call, c.pl, 8),
        crate::buf::child(c.call, c.pl, 16),
    ) else {
        return Some(NV_ERR_INVALID_ARGUMENT);
    };
    let want = 4 * n as usize;
    if crate::buf::bytes(c.call, handles).len() < want
        || crate::buf::bytes(c.call, out).len() < want
    {
        return Some(NV_ERR_INVALID_ARGUMENT);
    }
    let objects = st.clients.get(&h_client)?.objects();
    for i in 0..n as usize {
        let h: u32 = crate::buf::read_at(c.call, handles, 4 * i).unwrap_or(0);
        let chid = match objects.get(&h).map(|o| &o.kind) {
            Some(Kind::Channel { id, .. }) => {
                st.fifo.channels.get(id).map_or(INVALID_CHANNEL, |c| c.chid)
            }
            _ => INVALID_CHANNEL,
        };
        crate::buf::write_at(c.call, out, 4 * i, &chid);
    }
    Some(NV_OK)
}

/// The channel controls of a subdevice object; `None` for the others.
pub(crate) fn subdevice_control(
    st: &mut State,
    c: &mut crate::control_ctx::Ctx<'_>,
    h_client: u32,
    command: u32,
) -> Option<u32> {
    if command == cmd::MC_SERVICE_INTERRUPTS {
        // subdeviceCtrlCmdMcServiceInterrupts: {engines}; RM services the stall interrupts
        // of the engines (NV2080_CTRL_MC_ENGINE_ID_ALL or _GRAPHICS). The simulated front end
        // delivers its notifications when it executes (gpfifo.rs), so none is ever pending:
        // there is nothing to service, and the driver's answer is NV_OK.
        return Some(NV_OK);
    }
    if command == cmd::GR_SET_CTXSW_PREEMPTION_MODE {
        return Some(set_ctxsw_preemption_mode(st, c, h_client));
    }
    if command != cmd::GR_GET_CTX_BUFFER_SIZE {
        return None;
    }
    // subdeviceCtrlCmdKGrGetCtxBufferSize: {hChannel, totalBufferSize}, the aligned sum of the
    // GR context buffers of the channel's context. The simulated GR engine keeps no context
    // state, so the simulated driver allocates no context buffers: the true total is 0.
    let h: u32 = c.get(0)?;
    let objects = st.clients.get(&h_client)?.objects();
    let Some(Kind::Channel { id, .. }) = objects.get(&h).map(|o| &o.kind) else {
        return Some(NV_ERR_INVALID_CHANNEL);
    };
    if !st
        .fifo
        .channels
        .get(id)
        .is_some_and(|ch| is_gr(ch.engine_type))
    {
        // kgrctxFromKernelChannel: a channel without a GR context.
        return Some(NV_ERR_OBJECT_NOT_FOUND);
    }
    c.put(8, &0u64);
    Some(NV_OK)
}

/// `NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE` ({flags, hChannel, gfxpPreemptMode,
/// cilpPreemptMode, grRouteInfo}): `subdeviceCtrlCmdKGrSetCtxswPreemptionMode` routes it to
/// GSP firmware, whose code is not public, so only what the header defines is checked: the
/// channel (or a TSG with channels, for its channels) must have a GR context (as
/// `GR_GET_CTX_BUFFER_SIZE`: `NV_ERR_INVALID_CHANNEL` for no channel, `NV_ERR_OBJECT_NOT_FOUND`
/// for one without GR); a mode the flags select must be
/// one of the defined values (`NV_ERR_INVALID_ARGUMENT`); graphics preemption (`GFXP`) on the
/// simulated compute-only H100 is what the header's "does not support preemption context switch
/// mode changes" means: `NV_ERR_NOT_SUPPORTED`. The compute mode (WFI, CTA, CILP) is accepted
/// and has no effect: nothing runs on SMs to be preempted.
fn set_ctxsw_preemption_mode(
    st: &State,
    c: &mut crate::control_ctx::Ctx<'_>,
    h_client: u32,
) -> u32 {
    let (Some(flags), Some(h), Some(gfxp), Some(cilp)) = (
        c.get::<u32>(0),
        c.get::<u32>(4),
        c.get::<u32>(8),
        c.get::<u32>(12),
    ) else {
        return NV_ERR_INVALID_ARGUMENT;
    };
    // A channel, or a TSG (kchannelGetFromDualHandle: a TSG handle stands for its channels).
    let objects = st.clients.get(&h_client).map(|cl| cl.objects());
    let engine = match objects.and_then(|o| o.get(&h)).map(|o| &o.kind) {
        Some(Kind::Channel { id, .. }) => st.fifo.channels.get(id).map(|ch| ch.engine_type),
        Some(Kind::ChannelGroup { id, .. }) => st
            .fifo
            .tsgs
            .get(id)
            .filter(|t| t.channels > 0)
            .map(|t| t.engine_type),
        _ => None,
    };
    let Some(engine) = engine else {
        return NV_ERR_INVALID_CHANNEL;
    };
    if !is_gr(engine) {
        return NV_ERR_OBJECT_NOT_FOUND;
    }
    let (cilp_set, gfxp_set) = (flags & 1 != 0, flags & 2 != 0);
    if (cilp_set && cilp > 2) || (gfxp_set && gfxp > 2) {
        return NV_ERR_INVALID_ARGUMENT;
    }
    if gfxp_set {
        return NV_ERR_NOT_SUPPORTED;
    }
    NV_OK
}
