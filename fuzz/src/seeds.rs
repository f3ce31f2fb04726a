//! The seed corpus, built from typed operations (so a change of the input format changes the
//! seeds with it: `tests/corpus.rs` checks that `corpus/<target>/` holds exactly these and
//! rewrites them with `NVPROXY_FUZZ_REGEN=1`).
//!
//! Each seed encodes what a CUDA process does on its first run (libcuda's frontend
//! initialisation, then UVM's), or a hostile variation of it. Handles are named by their
//! position in the order the driver hands them out ([`H::Pool`]), opens and fds by the order
//! they were made, so the seeds do not depend on the numbers the simulator picks. Struct
//! offsets come from `nvproxy_abi::structs`.

use std::mem::offset_of;

use nvproxy_abi::ioctl::{IOC_READ, NV_IOCTL_MAGIC, ioc, nv_iowr};
use nvproxy_abi::structs::*;
use nvsim::SimConfig;

use crate::harness::Target;
use crate::input::*;

const INVALID_ID: u32 = 0xffff_ffff;

// UVM command numbers.
const UVM_INITIALIZE: u32 = 0x3000_0001;
const UVM_DEINITIALIZE: u32 = 0x3000_0002;
const UVM_CREATE_RANGE_GROUP: u32 = 0x17;
const UVM_DESTROY_RANGE_GROUP: u32 = 0x18;
const UVM_REGISTER_GPU_VASPACE: u32 = 0x19;
const UVM_UNREGISTER_GPU_VASPACE: u32 = 0x1a;
const UVM_REGISTER_CHANNEL: u32 = 0x1b;
const UVM_ENABLE_PEER_ACCESS: u32 = 0x1d;
const UVM_DISABLE_PEER_ACCESS: u32 = 0x1e;
const UVM_MAP_EXTERNAL_ALLOCATION: u32 = 0x21;
const UVM_FREE: u32 = 0x22;
const UVM_REGISTER_GPU: u32 = 0x25;
const UVM_UNREGISTER_GPU: u32 = 0x26;
const UVM_PAGEABLE_MEM_ACCESS: u32 = 0x27;
const UVM_SET_PREFERRED_LOCATION: u32 = 0x2a;
const UVM_SET_ACCESSED_BY: u32 = 0x2e;
const UVM_MIGRATE: u32 = 0x33;
const UVM_TOOLS_READ_PROCESS_MEMORY: u32 = 0x3e;
const UVM_MAP_DYNAMIC_PARALLELISM_REGION: u32 = 0x41;
const UVM_UNMAP_EXTERNAL: u32 = 0x42;
const UVM_ALLOC_SEMAPHORE_POOL: u32 = 0x44;
const UVM_VALIDATE_VA_RANGE: u32 = 0x48;
const UVM_CREATE_EXTERNAL_RANGE: u32 = 0x49;
const UVM_MM_INITIALIZE: u32 = 0x4b;

fn o(off: usize) -> u16 {
    off as u16
}

fn tbl(patches: Vec<Patch>) -> Ptr {
    Ptr::Buf(Blob::table(patches))
}

fn alloc(root: H, parent: H, class: u32, params: Ptr) -> Op {
    Op::Alloc {
        open: 0,
        nvos21: false,
        root,
        parent,
        new: H::Zero,
        class: NumSel::Raw(class),
        params,
        size: SizeField::Auto,
    }
}

fn ctrl(client: H, object: H, cmd: u32, params: Ptr) -> Op {
    Op::Control {
        open: 0,
        client,
        object,
        cmd: NumSel::Raw(cmd),
        flags: 0,
        params,
        size: SizeField::Auto,
    }
}

fn esc(open: u8, nr: u8, size: SizeSel, patches: Vec<Patch>) -> Op {
    Op::Escape {
        open,
        nr: EscSel::Raw(nr),
        size,
        top: Blob::table(patches),
    }
}

fn uvm(open: u8, cmd: u32, patches: Vec<Patch>) -> Op {
    Op::Uvm {
        open,
        cmd: NumSel::Raw(cmd),
        top: Blob::table(patches),
    }
}

const CLIENT: H = H::Pool(0);
const DEVICE: H = H::Pool(1);
const SUBDEVICE: H = H::Pool(2);

/// The instance's GPU id and device instance under config flags `flags` (GPU set bits).
fn our_gpu(flags: u8) -> (u32, u32) {
    let cfg = Config { version: 0, flags };
    let minor = cfg.gpus().0[0];
    let gpus = SimConfig::default_gpus(2).gpus;
    let i = gpus.iter().position(|g| g.minor == minor).unwrap();
    (gpus[i].gpu_id(), i as u32)
}

/// libcuda's frontend initialisation up to a client, device and subdevice (pool 0, 1, 2),
/// with opens 0 (control) and 1 (the GPU, registered with the control fd).
fn frontend_init(flags: u8) -> Vec<Op> {
    let (gpu_id, dev_inst) = our_gpu(flags);
    let mut attach = gpu_id.to_ne_bytes().to_vec();
    attach.extend(std::iter::repeat_n(0xff, 4 * 31));
    vec![
        Op::Open(0),
        // Version query ('2'), then the strict check of libcuda's own version string.
        esc(
            0,
            0xd2,
            SizeSel::Table,
            vec![Patch::U32(0, u32::from(b'2'))],
        ),
        Op::Escape {
            open: 0,
            nr: EscSel::Raw(0xd2),
            size: SizeSel::Table,
            top: Blob {
                len: 0,
                bytes: [&[0u8; 8][..], b"535.261.03"].concat(),
                patches: vec![],
            },
        },
        esc(0, 0xd6, SizeSel::Table, vec![]),
        esc(0, 0xc8, SizeSel::Alt(31), vec![]),
        alloc(H::Zero, H::Zero, 0x41, Ptr::Null),
        ctrl(CLIENT, CLIENT, 0x214, tbl(vec![])),
        ctrl(CLIENT, CLIENT, 0x201, tbl(vec![])),
        ctrl(
            CLIENT,
            CLIENT,
            0x215,
            Ptr::Buf(Blob {
                len: 0,
                bytes: attach,
                patches: vec![],
            }),
        ),
        Op::Open(1),
        Op::RegisterFd {
            open: 1,
            fd: Fd::Open(0),
        },
        ctrl(CLIENT, CLIENT, 0x205, tbl(vec![Patch::U32(0, gpu_id)])),
        ctrl(CLIENT, CLIENT, 0x204, tbl(vec![])),
        ctrl(CLIENT, CLIENT, 0x101, tbl(vec![])),
        alloc(CLIENT, CLIENT, 0x80, tbl(vec![Patch::U32(0, dev_inst)])),
        alloc(CLIENT, DEVICE, 0x2080, tbl(vec![])),
    ]
}

/// The controls libcuda issues on the device and subdevice, embedded pointers included.
fn gpu_queries() -> Vec<Op> {
    let classlist = off(offset_of!(NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS, classList));
    let engines = off(offset_of!(NV2080_CTRL_GPU_GET_ENGINES_PARAMS, engineList));
    let mut v = vec![
        ctrl(CLIENT, DEVICE, 0x80_0201, tbl(vec![])),
        ctrl(
            CLIENT,
            DEVICE,
            0x80_0201,
            tbl(vec![
                Patch::U32(0, 64),
                Patch::Ptr(classlist, Ptr::Buf(Blob::sized(256, vec![]))),
            ]),
        ),
        ctrl(CLIENT, DEVICE, 0x80_0280, tbl(vec![])),
        ctrl(CLIENT, DEVICE, 0x80_0292, tbl(vec![])),
        ctrl(
            CLIENT,
            SUBDEVICE,
            0x2080_0123,
            tbl(vec![
                Patch::U32(0, 16),
                Patch::Ptr(engines, Ptr::Buf(Blob::sized(64, vec![]))),
            ]),
        ),
    ];
    for cmd in [
        0x2080_0110,
        0x2080_0111,
        0x2080_0102,
        0x2080_0119,
        0x2080_014a,
        0x2080_1303,
        0x2080_1228,
        0x2080_1701,
        0x2080_1801,
        0x2080_018d,
        0x2080_3002,
        0x2080_0170,
        0x2080_1823,
        0x2080_01a3,
        0x2080_0145,
        0x2080_220c,
    ] {
        v.push(ctrl(CLIENT, SUBDEVICE, cmd, tbl(vec![])));
    }
    for cmd in [0x0a04, 0x0136, 0x013e, 0x0288, 0x0279, 0x0b02, 0x0d04] {
        v.push(ctrl(CLIENT, CLIENT, cmd, tbl(vec![])));
    }
    v
}

fn off(x: usize) -> u16 {
    x as u16
}

/// Memory, mappings, events, VA spaces, dup, XFER, frees: pool 3.. after [`frontend_init`].
fn memory_and_more() -> Vec<Op> {
    let size_off = o(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, size));
    vec![
        // 3: video memory, 4: system memory.
        alloc(
            CLIENT,
            DEVICE,
            0x40,
            tbl(vec![Patch::U64(size_off, 0x20_0000)]),
        ),
        alloc(CLIENT, DEVICE, 0x3e, tbl(vec![Patch::U64(size_off, 8192)])),
        // Open 2: the mmap target of RM_MAP_MEMORY, as libcuda makes it.
        Op::Open(0),
        esc(
            0,
            0x4e,
            SizeSel::Table,
            vec![
                Patch::Handle(0, CLIENT),
                Patch::Handle(4, DEVICE),
                Patch::Handle(8, H::Pool(4)),
                Patch::U64(24, 8192),
                Patch::Fd(48, Fd::Open(2)),
            ],
        ),
        Op::Mmap(2),
        // OS event on the control fd, then an NV01_EVENT_OS_EVENT on the subdevice (5).
        esc(
            0,
            0xce,
            SizeSel::Table,
            vec![
                Patch::Handle(0, CLIENT),
                Patch::Handle(4, DEVICE),
                Patch::Fd(8, Fd::Open(0)),
            ],
        ),
        alloc(
            CLIENT,
            SUBDEVICE,
            0x79,
            tbl(vec![
                Patch::Handle(0, CLIENT),
                Patch::Handle(4, SUBDEVICE),
                Patch::U32(8, 0x79),
                Patch::U32(12, 0),
                Patch::Fd(16, Fd::Open(0)),
            ]),
        ),
        // 6: a GPU VA space; 7: a virtual memory range in it.
        alloc(CLIENT, DEVICE, 0x90f1, tbl(vec![])),
        alloc(
            CLIENT,
            DEVICE,
            0x50a0,
            tbl(vec![
                Patch::U32(o(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, flags)), 0x8_0000),
                Patch::U64(size_off, 0x10_0000),
                Patch::Handle(
                    o(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, hVASpace)),
                    H::Pool(6),
                ),
            ]),
        ),
        // VID_HEAP_CONTROL ALLOC_SIZE: system memory through the deprecated interface (8).
        esc(
            0,
            0x4a,
            SizeSel::Table,
            vec![
                Patch::Handle(0, CLIENT),
                Patch::Handle(4, DEVICE),
                Patch::U32(8, 2),
                Patch::U64(88, 0x1_0000),
                Patch::Ptr(120, Ptr::Buf(Blob::sized(8, vec![]))),
            ],
        ),
        // A dup of the video memory (9).
        Op::Dup {
            open: 0,
            client: CLIENT,
            parent: DEVICE,
            new: H::Zero,
            src_client: CLIENT,
            src_object: H::Pool(3),
            flags: 0,
        },
        // XFER around an RM_CONTROL with its own params buffer: three levels of pointers.
        esc(
            0,
            0xd3,
            SizeSel::Raw(16),
            vec![
                Patch::U32(0, 0x2a),
                Patch::U32(4, 32),
                Patch::Ptr(
                    8,
                    Ptr::Buf(Blob::sized(
                        32,
                        vec![
                            Patch::Handle(0, CLIENT),
                            Patch::Handle(4, SUBDEVICE),
                            Patch::U32(8, 0x2080_0110),
                            Patch::Ptr(16, Ptr::Buf(Blob::sized(132, vec![]))),
                            Patch::U32(24, 132),
                        ],
                    )),
                ),
            ],
        ),
        esc(0, 0xd1, SizeSel::Table, vec![]),
        Op::Free {
            open: 0,
            root: CLIENT,
            parent: DEVICE,
            object: H::Pool(4),
        },
        esc(
            0,
            0xcf,
            SizeSel::Table,
            vec![
                Patch::Handle(0, CLIENT),
                Patch::Handle(4, DEVICE),
                Patch::Fd(8, Fd::Open(0)),
            ],
        ),
    ]
}

fn teardown() -> Vec<Op> {
    vec![
        Op::Free {
            open: 0,
            root: CLIENT,
            parent: DEVICE,
            object: SUBDEVICE,
        },
        Op::Free {
            open: 0,
            root: CLIENT,
            parent: CLIENT,
            object: CLIENT,
        },
        Op::Close(1),
        Op::Close(0),
    ]
}

fn cuda_init(version: u8, flags: u8) -> Vec<u8> {
    let mut ops = frontend_init(flags);
    ops.extend(gpu_queries());
    ops.extend(memory_and_more());
    ops.extend(teardown());
    Input {
        config: Config { version, flags },
        ops,
    }
    .encode()
}

/// A names B's handles; B names A's (Cross).
fn neighbour() -> Vec<u8> {
    let mut ops = frontend_init(0);
    let f = H::Foreign;
    ops.extend([
        ctrl(f(0), f(0), 0x214, tbl(vec![])),
        ctrl(f(0), f(2), 0x2080_0110, tbl(vec![])),
        ctrl(CLIENT, f(2), 0x2080_0110, tbl(vec![])),
        alloc(f(0), f(0), 0x80, tbl(vec![])),
        alloc(CLIENT, f(1), 0x2080, tbl(vec![])),
        Op::Free {
            open: 0,
            root: f(0),
            parent: f(0),
            object: f(0),
        },
        Op::Free {
            open: 0,
            root: CLIENT,
            parent: CLIENT,
            object: f(1),
        },
        Op::Dup {
            open: 0,
            client: CLIENT,
            parent: DEVICE,
            new: H::Zero,
            src_client: f(0),
            src_object: f(1),
            flags: 0,
        },
        // Client handle chosen by the tenant: B's.
        Op::Alloc {
            open: 0,
            nvos21: false,
            root: f(0),
            parent: H::Zero,
            new: f(0),
            class: NumSel::Raw(0x41),
            params: Ptr::Null,
            size: SizeField::Auto,
        },
        Op::Cross(Box::new(ctrl(CLIENT, CLIENT, 0x214, tbl(vec![])))),
        Op::Cross(Box::new(ctrl(CLIENT, SUBDEVICE, 0x2080_0110, tbl(vec![])))),
        Op::Cross(Box::new(alloc(CLIENT, DEVICE, 0x2080, tbl(vec![])))),
        Op::Cross(Box::new(Op::Dup {
            open: 0,
            client: H::Zero,
            parent: H::Zero,
            new: H::Zero,
            src_client: CLIENT,
            src_object: DEVICE,
            flags: 0,
        })),
        Op::Cross(Box::new(Op::Free {
            open: 0,
            root: CLIENT,
            parent: DEVICE,
            object: SUBDEVICE,
        })),
        Op::Cross(Box::new(Op::Free {
            open: 0,
            root: CLIENT,
            parent: CLIENT,
            object: CLIENT,
        })),
        ctrl(CLIENT, SUBDEVICE, 0x2080_0110, tbl(vec![])),
    ]);
    ops.extend(teardown());
    Input {
        config: Config {
            version: 0,
            flags: 0,
        },
        ops,
    }
    .encode()
}

/// Bad pointers, sizes and numbers at every level.
fn hostile(flags: u8) -> Vec<u8> {
    let mut ops = frontend_init(flags);
    let classlist = off(offset_of!(NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS, classList));
    for p in [
        Ptr::Unmapped,
        Ptr::Kernel,
        Ptr::Raw(u64::MAX - 7),
        Ptr::BufEnd(Blob::table(vec![])),
        Ptr::Buf(Blob::sized(3, vec![])),
    ] {
        ops.push(ctrl(CLIENT, SUBDEVICE, 0x2080_0110, p.clone()));
        ops.push(alloc(CLIENT, CLIENT, 0x80, p));
    }
    ops.extend([
        // Embedded pointer: count far too large, pointer bad, pointer at the end.
        ctrl(
            CLIENT,
            DEVICE,
            0x80_0201,
            tbl(vec![
                Patch::U32(0, u32::MAX),
                Patch::Ptr(classlist, Ptr::Unmapped),
            ]),
        ),
        ctrl(
            CLIENT,
            DEVICE,
            0x80_0201,
            tbl(vec![
                Patch::U32(0, 64),
                Patch::Ptr(classlist, Ptr::BufEnd(Blob::sized(256, vec![]))),
            ]),
        ),
        ctrl(
            CLIENT,
            DEVICE,
            0x80_0201,
            tbl(vec![
                Patch::U32(0, 0x4_0001),
                Patch::Ptr(classlist, Ptr::Buf(Blob::sized(16, vec![]))),
            ]),
        ),
        // Sizes that disagree with the table.
        Op::Control {
            open: 0,
            client: CLIENT,
            object: SUBDEVICE,
            cmd: NumSel::Raw(0x2080_0110),
            flags: 0,
            params: Ptr::Buf(Blob::sized(8, vec![])),
            size: SizeField::Raw(0xffff_ffff),
        },
        Op::Alloc {
            open: 0,
            nvos21: true,
            root: CLIENT,
            parent: CLIENT,
            new: H::Raw(0xcaf0_0001),
            class: NumSel::Raw(0x80),
            params: tbl(vec![]),
            size: SizeField::Raw(0x10_0000),
        },
        // Unknown and pass-through controls, classes, escapes, other ioctl types.
        ctrl(CLIENT, SUBDEVICE, 0x2080_8159, tbl(vec![])),
        ctrl(
            CLIENT,
            SUBDEVICE,
            0x2081_0101,
            Ptr::Buf(Blob::sized(64, vec![])),
        ),
        ctrl(CLIENT, CLIENT, 0xdead_beef, Ptr::Null),
        alloc(CLIENT, CLIENT, 0xbeef, Ptr::Null),
        esc(0, 0xd7, SizeSel::Table, vec![]),
        esc(
            0,
            0xd3,
            SizeSel::Raw(16),
            vec![
                Patch::U32(0, 0xd3),
                Patch::U32(4, 16),
                Patch::Ptr(
                    8,
                    Ptr::Buf(Blob::sized(
                        16,
                        vec![Patch::U32(0, 0x2a), Patch::U32(4, 32)],
                    )),
                ),
            ],
        ),
        esc(
            0,
            0xd3,
            SizeSel::Raw(16),
            vec![
                Patch::U32(0, 0x2a),
                Patch::U32(4, 0x10_0000),
                Patch::Ptr(8, Ptr::Unmapped),
            ],
        ),
        esc(0, 0xc8, SizeSel::Raw(71), vec![]),
        esc(
            0,
            0xd4,
            SizeSel::Alt(3),
            vec![Patch::U32(0, INVALID_ID), Patch::U32(4, 0x100)],
        ),
        esc(0, 0x5d, SizeSel::Table, vec![Patch::Fd(0, Fd::Errno)]),
        esc(0, 0x5c, SizeSel::Table, vec![Patch::Fd(0, Fd::Open(1))]),
        esc(0, 0xd9, SizeSel::Table, vec![Patch::Fd(0, Fd::Stdin)]),
        Op::RegisterFd {
            open: 0,
            fd: Fd::Open(1),
        },
        Op::RegisterFd {
            open: 1,
            fd: Fd::Errno,
        },
        Op::Raw {
            open: 0,
            cmd: ioc(IOC_READ, b'U', 1, 8),
            top: Blob::default(),
        },
        Op::Raw {
            open: 0,
            cmd: ioc(IOC_READ, NV_IOCTL_MAGIC, 0x2a, 32),
            top: Blob::default(),
        },
        Op::Raw {
            open: 1,
            cmd: nv_iowr(0x2b, 0x3fff),
            top: Blob::default(),
        },
        // Handles: stale, neighbours of ours, the driver's own numbering.
        ctrl(H::Next(0), H::Next(2), 0x2080_0110, tbl(vec![])),
        ctrl(
            H::Raw(0xc1d0_0000),
            H::Raw(0xcaf0_0000),
            0x2080_0110,
            tbl(vec![]),
        ),
        Op::Free {
            open: 1,
            root: CLIENT,
            parent: CLIENT,
            object: CLIENT,
        },
        ctrl(CLIENT, SUBDEVICE, 0x2080_0110, tbl(vec![])),
        Op::Close(0),
        ctrl(CLIENT, SUBDEVICE, 0x2080_0110, tbl(vec![])),
        Op::Open(7),
        Op::Mmap(1),
    ]);
    Input {
        config: Config { version: 0, flags },
        ops,
    }
    .encode()
}

/// Many distinct numbers: the audit counts must stay bounded.
fn bursts() -> Vec<u8> {
    let mut ops = frontend_init(0);
    ops.extend([
        Op::Burst {
            kind: 0,
            n: 4,
            base: 0x2080_8100,
        },
        Op::Burst {
            kind: 0,
            n: 2,
            base: 0x2081_0000,
        },
        Op::Burst {
            kind: 0,
            n: 1,
            base: 0x1234_0000,
        },
        Op::Burst {
            kind: 1,
            n: 1,
            base: nv_iowr(0, 8),
        },
        Op::Burst {
            kind: 2,
            n: 1,
            base: 0xc000,
        },
    ]);
    ops.extend(teardown());
    Input {
        config: Config {
            version: 0,
            flags: 0,
        },
        ops,
    }
    .encode()
}

/// Small quotas: opens and objects past them.
fn quotas() -> Vec<u8> {
    let mut ops = frontend_init(0x20);
    for _ in 0..6 {
        ops.push(alloc(CLIENT, DEVICE, 0x3e, tbl(vec![Patch::U64(64, 4096)])));
        ops.push(Op::Open(0));
    }
    ops.push(Op::Close(0));
    ops.push(alloc(H::Zero, H::Zero, 0x41, Ptr::Null));
    Input {
        config: Config {
            version: 0,
            flags: 0x20,
        },
        ops,
    }
    .encode()
}

/// UVM struct offsets of a version's layout (`v550`: 256 GPU attribute entries).
struct UvmOff {
    map_ext_count: u16,
    map_ext_fd: u16,
    map_ext_client: u16,
    map_ext_memory: u16,
    sema_count: u16,
}

fn uvm_off(v550: bool) -> UvmOff {
    if v550 {
        UvmOff {
            map_ext_count: o(offset_of!(
                UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550,
                gpuAttributesCount
            )),
            map_ext_fd: o(offset_of!(
                UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550,
                rmCtrlFd
            )),
            map_ext_client: o(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550, hClient)),
            map_ext_memory: o(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550, hMemory)),
            sema_count: o(offset_of!(
                UVM_ALLOC_SEMAPHORE_POOL_PARAMS_V550,
                gpuAttributesCount
            )),
        }
    } else {
        UvmOff {
            map_ext_count: o(offset_of!(
                UVM_MAP_EXTERNAL_ALLOCATION_PARAMS,
                gpuAttributesCount
            )),
            map_ext_fd: o(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, rmCtrlFd)),
            map_ext_client: o(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, hClient)),
            map_ext_memory: o(offset_of!(UVM_MAP_EXTERNAL_ALLOCATION_PARAMS, hMemory)),
            sema_count: o(offset_of!(
                UVM_ALLOC_SEMAPHORE_POOL_PARAMS,
                gpuAttributesCount
            )),
        }
    }
}

/// CUDA's UVM initialisation and a managed/external-memory lifecycle. Opens: 0 control,
/// 1 GPU, 2 UVM (the va_space), 3 UVM (the mm file); pool: 0 client, 1 device,
/// 2 subdevice, 3 VA space, 4 video memory.
fn uvm_init(version: u8, flags: u8) -> Vec<u8> {
    let v550 = VERSIONS_V550[version as usize % VERSIONS_V550.len()];
    let u = uvm_off(v550);
    let size_off = o(offset_of!(NV_MEMORY_ALLOCATION_PARAMS, size));
    let ours = Uuid::Ours(0);
    let base = 0x7100_0000_0000u64;
    let mb2 = 0x20_0000u64;
    let mut ops = frontend_init(flags);
    ops.extend([
        alloc(CLIENT, DEVICE, 0x90f1, tbl(vec![])),
        alloc(CLIENT, DEVICE, 0x40, tbl(vec![Patch::U64(size_off, mb2)])),
        Op::UvmOpen,
        Op::UvmOpen,
        uvm(0, UVM_INITIALIZE, vec![]),
        uvm(0, UVM_PAGEABLE_MEM_ACCESS, vec![]),
        uvm(1, UVM_MM_INITIALIZE, vec![Patch::Fd(0, Fd::Open(2))]),
        uvm(
            0,
            UVM_REGISTER_GPU,
            vec![
                Patch::Uuid(0, ours),
                Patch::Fd(24, Fd::Open(0)),
                Patch::Handle(28, CLIENT),
            ],
        ),
        uvm(0, UVM_CREATE_RANGE_GROUP, vec![]),
        uvm(
            0,
            UVM_REGISTER_GPU_VASPACE,
            vec![
                Patch::Uuid(0, ours),
                Patch::Fd(16, Fd::Open(0)),
                Patch::Handle(20, CLIENT),
                Patch::Handle(24, H::Pool(3)),
            ],
        ),
        uvm(
            0,
            UVM_ENABLE_PEER_ACCESS,
            vec![Patch::Uuid(0, ours), Patch::Uuid(16, Uuid::Ours(1))],
        ),
        uvm(
            0,
            UVM_ALLOC_SEMAPHORE_POOL,
            vec![
                Patch::U64(0, base + 0x100_0000),
                Patch::U64(8, 0x1_0000),
                Patch::Uuid(16, ours),
                Patch::U64(u.sema_count, 1),
            ],
        ),
        uvm(
            0,
            UVM_CREATE_EXTERNAL_RANGE,
            vec![Patch::U64(0, base), Patch::U64(8, mb2)],
        ),
        uvm(
            0,
            UVM_MAP_EXTERNAL_ALLOCATION,
            vec![
                Patch::U64(0, base),
                Patch::U64(8, mb2),
                Patch::Uuid(24, ours),
                Patch::U64(u.map_ext_count, 1),
                Patch::Fd(u.map_ext_fd, Fd::Open(0)),
                Patch::Handle(u.map_ext_client, CLIENT),
                Patch::Handle(u.map_ext_memory, H::Pool(4)),
            ],
        ),
        uvm(
            0,
            UVM_SET_PREFERRED_LOCATION,
            vec![
                Patch::U64(0, base),
                Patch::U64(8, mb2),
                Patch::Uuid(16, ours),
            ],
        ),
        uvm(
            0,
            UVM_SET_ACCESSED_BY,
            vec![
                Patch::U64(0, base),
                Patch::U64(8, mb2),
                Patch::Uuid(16, ours),
            ],
        ),
        uvm(
            0,
            UVM_MIGRATE,
            vec![
                Patch::U64(0, base),
                Patch::U64(8, mb2),
                Patch::Uuid(16, ours),
            ],
        ),
        uvm(
            0,
            UVM_VALIDATE_VA_RANGE,
            vec![Patch::U64(0, base), Patch::U64(8, mb2)],
        ),
        uvm(
            0,
            UVM_MAP_DYNAMIC_PARALLELISM_REGION,
            vec![
                Patch::U64(0, base + 0x200_0000),
                Patch::U64(8, mb2),
                Patch::Uuid(16, ours),
            ],
        ),
        uvm(
            0,
            UVM_UNMAP_EXTERNAL,
            vec![
                Patch::U64(0, base),
                Patch::U64(8, mb2),
                Patch::Uuid(16, ours),
            ],
        ),
        uvm(0, UVM_FREE, vec![Patch::U64(0, base), Patch::U64(8, mb2)]),
        uvm(0, UVM_FREE, vec![Patch::U64(0, base + 0x100_0000)]),
        uvm(
            0,
            UVM_DISABLE_PEER_ACCESS,
            vec![Patch::Uuid(0, ours), Patch::Uuid(16, Uuid::Ours(1))],
        ),
        uvm(0, UVM_DESTROY_RANGE_GROUP, vec![Patch::U64(0, 1)]),
        uvm(0, UVM_UNREGISTER_GPU_VASPACE, vec![Patch::Uuid(0, ours)]),
        uvm(0, UVM_UNREGISTER_GPU, vec![Patch::Uuid(0, ours)]),
        Op::UvmMmap(0),
        uvm(0, UVM_DEINITIALIZE, vec![]),
        Op::UvmClose(3),
        Op::UvmClose(2),
    ]);
    ops.extend(teardown());
    Input {
        config: Config { version, flags },
        ops,
    }
    .encode()
}

/// Whether each of [`crate::harness::VERSIONS`] has the 550 UVM layouts (256 GPU entries).
const VERSIONS_V550: &[bool] = &[false, true, true, true, true];

/// UVM with what another instance owns and what no client may send.
fn uvm_hostile() -> Vec<u8> {
    let u = uvm_off(false);
    let mut ops = frontend_init(0);
    ops.extend([
        alloc(CLIENT, DEVICE, 0x90f1, tbl(vec![])),
        Op::UvmOpen,
        uvm(0, UVM_INITIALIZE, vec![Patch::U64(0, u64::MAX)]),
        uvm(0, UVM_INITIALIZE, vec![]),
        // The other GPU (B's), B's client, a UVM fd as rmCtrlFd, a failing fd.
        uvm(
            0,
            UVM_REGISTER_GPU,
            vec![
                Patch::Uuid(0, Uuid::Host(0)),
                Patch::Fd(24, Fd::Open(0)),
                Patch::Handle(28, CLIENT),
            ],
        ),
        uvm(
            0,
            UVM_REGISTER_GPU,
            vec![
                Patch::Uuid(0, Uuid::Ours(0)),
                Patch::Fd(24, Fd::Open(0)),
                Patch::Handle(28, H::Foreign(0)),
            ],
        ),
        uvm(
            0,
            UVM_REGISTER_GPU,
            vec![
                Patch::Uuid(0, Uuid::Ours(0)),
                Patch::Fd(24, Fd::Open(2)),
                Patch::Handle(28, CLIENT),
            ],
        ),
        uvm(
            0,
            UVM_REGISTER_GPU,
            vec![
                Patch::Uuid(0, Uuid::Ours(0)),
                Patch::Fd(24, Fd::Errno),
                Patch::Handle(28, CLIENT),
            ],
        ),
        uvm(
            0,
            UVM_REGISTER_GPU,
            vec![
                Patch::Uuid(0, Uuid::Cpu),
                Patch::Fd(24, Fd::Minus1),
                Patch::Handle(28, CLIENT),
            ],
        ),
        uvm(
            0,
            UVM_REGISTER_GPU_VASPACE,
            vec![
                Patch::Uuid(0, Uuid::Ours(0)),
                Patch::Fd(16, Fd::Open(0)),
                Patch::Handle(20, CLIENT),
                Patch::Handle(24, H::Foreign(1)),
            ],
        ),
        uvm(
            0,
            UVM_MAP_EXTERNAL_ALLOCATION,
            vec![
                Patch::U64(8, 0x20_0000),
                Patch::Uuid(24, Uuid::Ours(0)),
                Patch::U64(u.map_ext_count, 33),
                Patch::Fd(u.map_ext_fd, Fd::Open(0)),
                Patch::Handle(u.map_ext_client, CLIENT),
            ],
        ),
        uvm(
            0,
            UVM_MAP_EXTERNAL_ALLOCATION,
            vec![
                Patch::Uuid(24, Uuid::Ours(0)),
                Patch::Uuid(24 + 36, Uuid::Host(0)),
                Patch::U64(u.map_ext_count, 2),
                Patch::Fd(u.map_ext_fd, Fd::Raw(i32::MIN)),
                Patch::Handle(u.map_ext_client, CLIENT),
            ],
        ),
        uvm(
            0,
            UVM_ALLOC_SEMAPHORE_POOL,
            vec![Patch::U64(u.sema_count, 0)],
        ),
        uvm(
            0,
            UVM_REGISTER_CHANNEL,
            vec![Patch::Uuid(0, Uuid::Ours(0)), Patch::Handle(20, CLIENT)],
        ),
        uvm(0, UVM_TOOLS_READ_PROCESS_MEMORY, vec![]),
        Op::Uvm {
            open: 0,
            cmd: NumSel::Raw(0xdead),
            top: Blob::sized(16, vec![]),
        },
        Op::Uvm {
            open: 0,
            cmd: NumSel::Raw(UVM_REGISTER_GPU),
            top: Blob::sized(8, vec![]),
        },
        uvm(0, UVM_MM_INITIALIZE, vec![Patch::Fd(0, Fd::Open(0))]),
        uvm(0, UVM_MM_INITIALIZE, vec![Patch::Fd(0, Fd::Errno)]),
        Op::Burst {
            kind: 3,
            n: 1,
            base: 0x10,
        },
        Op::Close(0),
        uvm(
            0,
            UVM_REGISTER_GPU,
            vec![
                Patch::Uuid(0, Uuid::Ours(0)),
                Patch::Fd(24, Fd::Open(0)),
                Patch::Handle(28, CLIENT),
            ],
        ),
        Op::UvmMmap(0),
    ]);
    Input {
        config: Config {
            version: 0,
            flags: 0x40,
        },
        ops,
    }
    .encode()
}

/// The seeds of `target`: (file name, bytes).
pub fn seeds(target: Target) -> Vec<(&'static str, Vec<u8>)> {
    match target {
        Target::Proxy => vec![
            ("cuda_init_535", cuda_init(0, 0)),
            ("cuda_init_535_retry", cuda_init(0, 1)),
            ("cuda_init_570_gpu0", cuda_init(2, 1 << 3)),
            ("cuda_init_580", cuda_init(3, 0)),
            (
                "cuda_init_595_audit_two_gpus",
                cuda_init(4, 2 | 4 | (2 << 3)),
            ),
            ("neighbour", neighbour()),
            ("hostile", hostile(0)),
            ("hostile_retry_audit", hostile(1 | 2)),
            ("bursts", bursts()),
            ("quotas", quotas()),
        ],
        Target::Uvm => vec![
            ("uvm_init_535", uvm_init(0, 0)),
            ("uvm_init_535_retry", uvm_init(0, 1)),
            ("uvm_init_580_two_gpus", uvm_init(3, 2 << 3)),
            ("uvm_init_595_audit", uvm_init(4, 2)),
            ("uvm_hostile", uvm_hostile()),
        ],
    }
}
