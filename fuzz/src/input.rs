//! The fuzz input format: a two-byte configuration, then a sequence of operations, each
//! decoded from the bytes that follow. Decoding is total (missing bytes read as zero, so every
//! byte string is an input) and [`Op::encode`] writes exactly what [`Op::decode`] reads, so the
//! seed generator (`seeds.rs`) builds inputs from typed operations.
//!
//! Selectors name things by index into what the run has seen so far (handles returned by the
//! driver, opens made, fds handed out) or into the ABI table of the configured version, so a
//! mutated byte still names something meaningful most of the time; each selector also has raw
//! escapes (an arbitrary number) for the hostile cases.

/// Nested buffer depth: top-level (0), a buffer a top-level pointer names (1), a buffer named
/// from inside that one (2), one more (3).
pub const MAX_DEPTH: usize = 3;
/// Operations decoded per input (the rest of a longer input is ignored).
pub const MAX_OPS: usize = 256;
/// Patches per buffer.
pub const MAX_PATCHES: usize = 12;

/// Reads the input; past its end every read is zero.
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts at the beginning of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }
    /// Whether every byte was read.
    pub fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    /// One byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    /// Little-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    /// Little-endian `u32`.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    /// Little-endian `u64`.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    /// Up to `n` bytes: as many as the input still has.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let start = self.pos.min(self.data.len());
        let end = start.saturating_add(n).min(self.data.len());
        self.pos = self.pos.saturating_add(n);
        self.data[start..end].to_vec()
    }
}

/// Builds an input (the seed generator).
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// One byte.
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    /// Little-endian `u16`.
    pub fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Little-endian `u32`.
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Little-endian `u64`.
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Raw bytes.
    pub fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
}

/// The run's setup: driver version and instance policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Index into [`crate::harness::VERSIONS`].
    pub version: u8,
    /// bit 0: retry transport (reads return `Pending` until fetched); bit 1: audit mode;
    /// bit 2: all container caps (else compute+utility); bits 3-4: GPU set (host minors
    /// `[1]`, `[0]`, `[0, 1]`, `[1, 0]`); bit 5: small quotas; bit 6: `uvm_mmap` off.
    pub flags: u8,
}

impl Config {
    /// Reads the two configuration bytes.
    pub fn decode(r: &mut Reader) -> Self {
        Self {
            version: r.u8(),
            flags: r.u8(),
        }
    }
    /// Writes them.
    pub fn encode(&self, w: &mut Writer) {
        w.u8(self.version);
        w.u8(self.flags);
    }
    /// Retry transport.
    pub fn retry(&self) -> bool {
        self.flags & 1 != 0
    }
    /// Audit mode.
    pub fn audit(&self) -> bool {
        self.flags & 2 != 0
    }
    /// All container caps.
    pub fn all_caps(&self) -> bool {
        self.flags & 4 != 0
    }
    /// The instance's host minors, and the other instance's.
    pub fn gpus(&self) -> (Vec<u32>, Vec<u32>) {
        match (self.flags >> 3) & 3 {
            0 => (vec![1], vec![0]),
            1 => (vec![0], vec![1]),
            2 => (vec![0, 1], vec![1]),
            _ => (vec![1, 0], vec![0]),
        }
    }
    /// Small quotas (the quota paths are reached).
    pub fn small_quotas(&self) -> bool {
        self.flags & 0x20 != 0
    }
    /// `uvm_mmap` switched off.
    pub fn uvm_mmap_off(&self) -> bool {
        self.flags & 0x40 != 0
    }
}

/// An RM handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum H {
    /// The i-th handle (mod count) this instance got from the driver (0 while none).
    Pool(u8),
    /// 0.
    Zero,
    /// Any number.
    Raw(u32),
    /// One of the other instance's handles (its client, device, subdevice).
    Foreign(u8),
    /// A pool handle plus one (a neighbour in the driver's numbering).
    Next(u8),
}

impl H {
    /// Decodes one handle selector.
    pub fn decode(r: &mut Reader) -> Self {
        match r.u8() {
            0xf0 => H::Zero,
            0xf1 => H::Raw(r.u32()),
            0xf2 => H::Foreign(r.u8()),
            0xf3 => H::Next(r.u8()),
            b => H::Pool(b),
        }
    }
    /// Encodes it (`Pool` indices must be below 0xf0).
    pub fn encode(&self, w: &mut Writer) {
        match *self {
            H::Pool(i) => {
                assert!(i < 0xf0);
                w.u8(i)
            }
            H::Zero => w.u8(0xf0),
            H::Raw(v) => {
                w.u8(0xf1);
                w.u32(v)
            }
            H::Foreign(i) => {
                w.u8(0xf2);
                w.u8(i)
            }
            H::Next(i) => {
                w.u8(0xf3);
                w.u8(i)
            }
        }
    }
}

/// An fd number of the calling thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fd {
    /// The fd of the i-th open (mod count) made so far, also when it was closed since.
    Open(u8),
    /// -1.
    Minus1,
    /// Any number.
    Raw(i32),
    /// An fd whose resolution fails with an errno (the thread exited).
    Errno,
    /// fd 0: open, but not one of the instance's nodes.
    Stdin,
}

impl Fd {
    /// Decodes one fd selector.
    pub fn decode(r: &mut Reader) -> Self {
        match r.u8() {
            0xf0 => Fd::Minus1,
            0xf1 => Fd::Raw(r.u32() as i32),
            0xf2 => Fd::Errno,
            0xf3 => Fd::Stdin,
            b => Fd::Open(b),
        }
    }
    /// Encodes it.
    pub fn encode(&self, w: &mut Writer) {
        match *self {
            Fd::Open(i) => {
                assert!(i < 0xf0);
                w.u8(i)
            }
            Fd::Minus1 => w.u8(0xf0),
            Fd::Raw(v) => {
                w.u8(0xf1);
                w.u32(v as u32)
            }
            Fd::Errno => w.u8(0xf2),
            Fd::Stdin => w.u8(0xf3),
        }
    }
}

/// A GPU UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uuid {
    /// The instance's i-th GPU (mod count).
    Ours(u8),
    /// `NV_PROCESSOR_UUID_CPU_DEFAULT` (all zero).
    Cpu,
    /// The simulator's i-th GPU (mod count), in the set or not.
    Host(u8),
    /// Any 16 bytes.
    Raw([u8; 16]),
}

impl Uuid {
    fn decode(r: &mut Reader) -> Self {
        match r.u8() % 4 {
            0 => Uuid::Ours(r.u8()),
            1 => Uuid::Cpu,
            2 => Uuid::Host(r.u8()),
            _ => {
                let mut u = [0u8; 16];
                for b in &mut u {
                    *b = r.u8();
                }
                Uuid::Raw(u)
            }
        }
    }
    fn encode(&self, w: &mut Writer) {
        match *self {
            Uuid::Ours(i) => {
                w.u8(0);
                w.u8(i)
            }
            Uuid::Cpu => w.u8(1),
            Uuid::Host(i) => {
                w.u8(2);
                w.u8(i)
            }
            Uuid::Raw(u) => {
                w.u8(3);
                w.bytes(&u)
            }
        }
    }
}

/// The value of a pointer field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ptr {
    /// NULL.
    Null,
    /// A fresh buffer of its own (no other pointer names it).
    Buf(Blob),
    /// A fresh buffer, pointed at 4 bytes before its end: a longer read runs off the mapping.
    BufEnd(Blob),
    /// An unmapped address.
    Unmapped,
    /// Any address.
    Raw(u64),
    /// A kernel address.
    Kernel,
}

impl Ptr {
    /// Decodes a pointer at nesting `depth` (its buffer is at `depth + 1`).
    pub fn decode(r: &mut Reader, depth: usize) -> Self {
        match r.u8() % 6 {
            0 => Ptr::Null,
            1 if depth < MAX_DEPTH => Ptr::Buf(Blob::decode(r, depth + 1)),
            2 if depth < MAX_DEPTH => Ptr::BufEnd(Blob::decode(r, depth + 1)),
            1 | 2 => Ptr::Null,
            3 => Ptr::Unmapped,
            4 => Ptr::Raw(r.u64()),
            _ => Ptr::Kernel,
        }
    }
    /// Encodes it.
    pub fn encode(&self, w: &mut Writer) {
        match self {
            Ptr::Null => w.u8(0),
            Ptr::Buf(b) => {
                w.u8(1);
                b.encode(w)
            }
            Ptr::BufEnd(b) => {
                w.u8(2);
                b.encode(w)
            }
            Ptr::Unmapped => w.u8(3),
            Ptr::Raw(v) => {
                w.u8(4);
                w.u64(*v)
            }
            Ptr::Kernel => w.u8(5),
        }
    }
}

/// A field written into a buffer at a byte offset (ignored when it does not fit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Patch {
    /// A `u32`.
    U32(u16, u32),
    /// A `u64`.
    U64(u16, u64),
    /// An RM handle.
    Handle(u16, H),
    /// An fd number (`i32`).
    Fd(u16, Fd),
    /// A pointer (`u64`), possibly to a buffer of its own.
    Ptr(u16, Ptr),
    /// A 16-byte GPU UUID.
    Uuid(u16, Uuid),
}

impl Patch {
    fn decode(r: &mut Reader, depth: usize) -> Self {
        let off = r.u16();
        match r.u8() % 6 {
            0 => Patch::U32(off, r.u32()),
            1 => Patch::U64(off, r.u64()),
            2 => Patch::Handle(off, H::decode(r)),
            3 => Patch::Fd(off, Fd::decode(r)),
            4 => Patch::Ptr(off, Ptr::decode(r, depth)),
            _ => Patch::Uuid(off, Uuid::decode(r)),
        }
    }
    fn encode(&self, w: &mut Writer) {
        match self {
            Patch::U32(o, v) => {
                w.u16(*o);
                w.u8(0);
                w.u32(*v)
            }
            Patch::U64(o, v) => {
                w.u16(*o);
                w.u8(1);
                w.u64(*v)
            }
            Patch::Handle(o, h) => {
                w.u16(*o);
                w.u8(2);
                h.encode(w)
            }
            Patch::Fd(o, f) => {
                w.u16(*o);
                w.u8(3);
                f.encode(w)
            }
            Patch::Ptr(o, p) => {
                w.u16(*o);
                w.u8(4);
                p.encode(w)
            }
            Patch::Uuid(o, u) => {
                w.u16(*o);
                w.u8(5);
                u.encode(w)
            }
        }
    }
}

/// One buffer of client memory: `len` bytes (0: the size the ABI table gives for where it is
/// used), starting with `bytes`, zero after them, then `patches` applied in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Blob {
    /// Length in bytes; 0 for the table's size.
    pub len: u16,
    /// The first bytes (truncated to the length).
    pub bytes: Vec<u8>,
    /// Fields written over them.
    pub patches: Vec<Patch>,
}

impl Blob {
    /// A buffer of the table's size, zero but for `patches`.
    pub fn table(patches: Vec<Patch>) -> Self {
        Self {
            len: 0,
            bytes: Vec::new(),
            patches,
        }
    }
    /// A zeroed buffer of `len` bytes with `patches`.
    pub fn sized(len: u16, patches: Vec<Patch>) -> Self {
        Self {
            len,
            bytes: Vec::new(),
            patches,
        }
    }
    fn decode(r: &mut Reader, depth: usize) -> Self {
        let len = r.u16();
        let n = r.u16() as usize;
        let bytes = r.bytes(n);
        let np = r.u8() as usize % (MAX_PATCHES + 1);
        let patches = (0..np).map(|_| Patch::decode(r, depth)).collect();
        Self {
            len,
            bytes,
            patches,
        }
    }
    /// Decodes a top-level buffer.
    pub fn decode_top(r: &mut Reader) -> Self {
        Self::decode(r, 0)
    }
    /// Encodes it.
    pub fn encode(&self, w: &mut Writer) {
        assert!(self.patches.len() <= MAX_PATCHES);
        w.u16(self.len);
        w.u16(self.bytes.len() as u16);
        w.bytes(&self.bytes);
        w.u8(self.patches.len() as u8);
        for p in &self.patches {
            p.encode(w);
        }
    }
}

/// Which escape (`_IOC_NR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EscSel {
    /// The i-th (mod count) escape of the version's table.
    Table(u8),
    /// Any number.
    Raw(u8),
}

/// The `_IOC_SIZE` of an escape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeSel {
    /// The table's size (the first of several; one array element).
    Table,
    /// Another accepted size: the k-th layout, or k+1 array elements.
    Alt(u8),
    /// Any size (14 bits used).
    Raw(u16),
}

/// A class (`hClass`), control (`cmd`) or UVM command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumSel {
    /// The i-th (mod count) entry of the harness's list of interesting numbers.
    Curated(u8),
    /// The i-th (mod count) entry of the version's table.
    Table(u16),
    /// Any number.
    Raw(u32),
}

impl NumSel {
    fn decode(r: &mut Reader) -> Self {
        match r.u8() {
            0xff => NumSel::Raw(r.u32()),
            0xfe => NumSel::Table(r.u16()),
            b => NumSel::Curated(b),
        }
    }
    fn encode(&self, w: &mut Writer) {
        match *self {
            NumSel::Curated(i) => {
                assert!(i < 0xfe);
                w.u8(i)
            }
            NumSel::Table(i) => {
                w.u8(0xfe);
                w.u16(i)
            }
            NumSel::Raw(v) => {
                w.u8(0xff);
                w.u32(v)
            }
        }
    }
}

/// A size field (`paramsSize`): what the buffer has, or any number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeField {
    /// The buffer's length (0 for no buffer; the table's size for a bad pointer).
    Auto,
    /// Any number.
    Raw(u32),
}

impl SizeField {
    fn decode(r: &mut Reader) -> Self {
        match r.u8() {
            1 => SizeField::Raw(r.u32()),
            _ => SizeField::Auto,
        }
    }
    fn encode(&self, w: &mut Writer) {
        match *self {
            SizeField::Auto => w.u8(0),
            SizeField::Raw(v) => {
                w.u8(1);
                w.u32(v)
            }
        }
    }
}

/// One operation of the tenant (instance A unless said otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `open()` of a frontend node: 0 ctl, 1 the instance's GPU 0, 2 its GPU 1, 3 GPU n>>2.
    Open(u8),
    /// `close()` of the i-th open made (frontend or UVM).
    Close(u8),
    /// Any escape on an open with a top-level struct from the input.
    Escape {
        /// Which open.
        open: u8,
        /// Which escape.
        nr: EscSel,
        /// `_IOC_SIZE`.
        size: SizeSel,
        /// The struct (`len` 0: exactly `_IOC_SIZE`).
        top: Blob,
    },
    /// Any ioctl number (other types, directions, sizes).
    Raw {
        /// Which open.
        open: u8,
        /// The full command.
        cmd: u32,
        /// The struct at `arg` (`len` 0: `_IOC_SIZE`).
        top: Blob,
    },
    /// `NV_ESC_RM_ALLOC`.
    Alloc {
        /// Which open.
        open: u8,
        /// NVOS21 (32 bytes) instead of NVOS64 (48).
        nvos21: bool,
        /// `hRoot`.
        root: H,
        /// `hObjectParent`.
        parent: H,
        /// `hObjectNew` (0: the driver picks).
        new: H,
        /// `hClass`.
        class: NumSel,
        /// `pAllocParms` (a buffer of `len` 0 gets the class's table size).
        params: Ptr,
        /// `paramsSize` (NVOS64 only).
        size: SizeField,
    },
    /// `NV_ESC_RM_CONTROL`.
    Control {
        /// Which open.
        open: u8,
        /// `hClient`.
        client: H,
        /// `hObject`.
        object: H,
        /// `cmd`.
        cmd: NumSel,
        /// `flags`.
        flags: u32,
        /// `params` (a buffer of `len` 0 gets the control's table size).
        params: Ptr,
        /// `paramsSize`.
        size: SizeField,
    },
    /// `NV_ESC_RM_FREE`.
    Free {
        /// Which open.
        open: u8,
        /// `hRoot`.
        root: H,
        /// `hObjectParent`.
        parent: H,
        /// `hObjectOld`.
        object: H,
    },
    /// `NV_ESC_RM_DUP_OBJECT`.
    Dup {
        /// Which open.
        open: u8,
        /// `hClient`.
        client: H,
        /// `hParent`.
        parent: H,
        /// `hObject` (0: the driver picks).
        new: H,
        /// `hClientSrc`.
        src_client: H,
        /// `hObjectSrc`.
        src_object: H,
        /// `flags`.
        flags: u32,
    },
    /// The other instance (B) runs an Alloc/Control/Free/Dup naming this instance's handles
    /// (on its own control open).
    Cross(Box<Op>),
    /// Many calls with consecutive numbers from `base` (16 per unit of `n`): 0 controls,
    /// 1 escapes, 2 classes, 3 UVM commands.
    Burst {
        /// Which kind.
        kind: u8,
        /// Count / 16.
        n: u8,
        /// First number.
        base: u32,
    },
    /// The mmap path of an open (`Proxy::mapping_fd`).
    Mmap(u8),
    /// `open()` of `/dev/nvidia-uvm`.
    UvmOpen,
    /// `close()` of the i-th open made (same as [`Op::Close`]).
    UvmClose(u8),
    /// A UVM ioctl on the i-th open, params from the input.
    Uvm {
        /// Which open.
        open: u8,
        /// The command (`Curated`: an index into the version's UVM table).
        cmd: NumSel,
        /// The params (`len` 0: the table's size).
        top: Blob,
    },
    /// `mmap` of a UVM open (`UvmProxy::mmap_fd`).
    UvmMmap(u8),
    /// `NV_ESC_REGISTER_FD` on an open with a chosen fd.
    RegisterFd {
        /// Which open.
        open: u8,
        /// The control fd.
        fd: Fd,
    },
}

impl Op {
    /// Decodes one operation; `cross` limits it to what [`Op::Cross`] may carry.
    pub fn decode(r: &mut Reader) -> Self {
        let tag = r.u8() % 16;
        Self::decode_tag(r, tag)
    }

    fn decode_tag(r: &mut Reader, tag: u8) -> Self {
        match tag {
            0 => Op::Open(r.u8()),
            1 => Op::Close(r.u8()),
            2 => {
                let open = r.u8();
                let nr = match r.u8() {
                    0xff => EscSel::Raw(r.u8()),
                    b => EscSel::Table(b),
                };
                let size = match r.u8() {
                    1 => SizeSel::Alt(r.u8()),
                    2 => SizeSel::Raw(r.u16()),
                    _ => SizeSel::Table,
                };
                Op::Escape {
                    open,
                    nr,
                    size,
                    top: Blob::decode_top(r),
                }
            }
            3 => Op::Raw {
                open: r.u8(),
                cmd: r.u32(),
                top: Blob::decode_top(r),
            },
            4 => Op::Alloc {
                open: r.u8(),
                nvos21: r.u8() & 1 != 0,
                root: H::decode(r),
                parent: H::decode(r),
                new: H::decode(r),
                class: NumSel::decode(r),
                params: Ptr::decode(r, 0),
                size: SizeField::decode(r),
            },
            5 => Op::Control {
                open: r.u8(),
                client: H::decode(r),
                object: H::decode(r),
                cmd: NumSel::decode(r),
                flags: r.u32(),
                params: Ptr::decode(r, 0),
                size: SizeField::decode(r),
            },
            6 => Op::Free {
                open: r.u8(),
                root: H::decode(r),
                parent: H::decode(r),
                object: H::decode(r),
            },
            7 => Op::Dup {
                open: r.u8(),
                client: H::decode(r),
                parent: H::decode(r),
                new: H::decode(r),
                src_client: H::decode(r),
                src_object: H::decode(r),
                flags: r.u32(),
            },
            8 => {
                let inner = 4 + r.u8() % 4;
                Op::Cross(Box::new(Self::decode_tag(r, inner)))
            }
            9 => Op::Burst {
                kind: r.u8(),
                n: r.u8(),
                base: r.u32(),
            },
            10 => Op::Mmap(r.u8()),
            11 => Op::UvmOpen,
            12 => Op::UvmClose(r.u8()),
            13 => Op::Uvm {
                open: r.u8(),
                cmd: NumSel::decode(r),
                top: Blob::decode_top(r),
            },
            14 => Op::UvmMmap(r.u8()),
            _ => Op::RegisterFd {
                open: r.u8(),
                fd: Fd::decode(r),
            },
        }
    }

    fn tag(&self) -> u8 {
        match self {
            Op::Open(_) => 0,
            Op::Close(_) => 1,
            Op::Escape { .. } => 2,
            Op::Raw { .. } => 3,
            Op::Alloc { .. } => 4,
            Op::Control { .. } => 5,
            Op::Free { .. } => 6,
            Op::Dup { .. } => 7,
            Op::Cross(_) => 8,
            Op::Burst { .. } => 9,
            Op::Mmap(_) => 10,
            Op::UvmOpen => 11,
            Op::UvmClose(_) => 12,
            Op::Uvm { .. } => 13,
            Op::UvmMmap(_) => 14,
            Op::RegisterFd { .. } => 15,
        }
    }

    /// Encodes it.
    pub fn encode(&self, w: &mut Writer) {
        w.u8(self.tag());
        self.encode_body(w);
    }

    fn encode_body(&self, w: &mut Writer) {
        match self {
            Op::Open(n) | Op::Close(n) | Op::Mmap(n) | Op::UvmClose(n) | Op::UvmMmap(n) => w.u8(*n),
            Op::UvmOpen => {}
            Op::Escape {
                open,
                nr,
                size,
                top,
            } => {
                w.u8(*open);
                match *nr {
                    EscSel::Table(i) => {
                        assert!(i < 0xff);
                        w.u8(i)
                    }
                    EscSel::Raw(v) => {
                        w.u8(0xff);
                        w.u8(v)
                    }
                }
                match *size {
                    SizeSel::Table => w.u8(0),
                    SizeSel::Alt(k) => {
                        w.u8(1);
                        w.u8(k)
                    }
                    SizeSel::Raw(s) => {
                        w.u8(2);
                        w.u16(s)
                    }
                }
                top.encode(w);
            }
            Op::Raw { open, cmd, top } => {
                w.u8(*open);
                w.u32(*cmd);
                top.encode(w);
            }
            Op::Alloc {
                open,
                nvos21,
                root,
                parent,
                new,
                class,
                params,
                size,
            } => {
                w.u8(*open);
                w.u8(u8::from(*nvos21));
                root.encode(w);
                parent.encode(w);
                new.encode(w);
                class.encode(w);
                params.encode(w);
                size.encode(w);
            }
            Op::Control {
                open,
                client,
                object,
                cmd,
                flags,
                params,
                size,
            } => {
                w.u8(*open);
                client.encode(w);
                object.encode(w);
                cmd.encode(w);
                w.u32(*flags);
                params.encode(w);
                size.encode(w);
            }
            Op::Free {
                open,
                root,
                parent,
                object,
            } => {
                w.u8(*open);
                root.encode(w);
                parent.encode(w);
                object.encode(w);
            }
            Op::Dup {
                open,
                client,
                parent,
                new,
                src_client,
                src_object,
                flags,
            } => {
                w.u8(*open);
                client.encode(w);
                parent.encode(w);
                new.encode(w);
                src_client.encode(w);
                src_object.encode(w);
                w.u32(*flags);
            }
            Op::Cross(inner) => {
                let t = inner.tag();
                assert!((4..8).contains(&t), "Cross carries Alloc/Control/Free/Dup");
                w.u8(t - 4);
                inner.encode_body(w);
            }
            Op::Burst { kind, n, base } => {
                w.u8(*kind);
                w.u8(*n);
                w.u32(*base);
            }
            Op::Uvm { open, cmd, top } => {
                w.u8(*open);
                cmd.encode(w);
                top.encode(w);
            }
            Op::RegisterFd { open, fd } => {
                w.u8(*open);
                fd.encode(w);
            }
        }
    }
}

/// A whole input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// Setup.
    pub config: Config,
    /// Operations in order.
    pub ops: Vec<Op>,
}

impl Input {
    /// Decodes `data` (total: any bytes are an input).
    pub fn decode(data: &[u8]) -> Self {
        let mut r = Reader::new(data);
        let config = Config::decode(&mut r);
        let mut ops = Vec::new();
        while !r.done() && ops.len() < MAX_OPS {
            ops.push(Op::decode(&mut r));
        }
        Self { config, ops }
    }
    /// Encodes it.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.config.encode(&mut w);
        for op in &self.ops {
            op.encode(&mut w);
        }
        w.0
    }
}
