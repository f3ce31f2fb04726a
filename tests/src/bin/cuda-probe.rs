//! `cuda-probe`: drives NVIDIA's own `libcuda.so.1` (the CUDA driver API) step by step and says
//! exactly where it stops.
//!
//! `cuda-probe [--lib PATH] [--expect-count N] [--expect-name S] [--expect-uuid U]
//!             [--expect-pci-bus-id B] STEP...`
//!
//! libcuda is `dlopen`ed (`libcuda.so.1` from the loader's path, e.g. `LD_LIBRARY_PATH`, or
//! `--lib`); no CUDA headers are needed, the few function types are declared here. Steps, run in
//! this order whatever the order given (each runs the ones it needs first):
//!
//! - `init`: `cuInit(0)` (its own ioctls and time are reported as `cuinit_ioctls`/`cuinit_ms`),
//!   `cuDriverGetVersion`, `cuDeviceGetCount`, and for each device
//!   `cuDeviceGet`, `cuDeviceGetName`, `cuDeviceGetUuid_v2`, `cuDeviceTotalMem_v2`, the compute
//!   capability, SM count and PCI attributes, `cuDeviceGetPCIBusId`;
//! - `ctx`: `cuCtxCreate_v2` on device 0 and `cuMemGetInfo_v2` (destroyed at the end);
//! - `mem`: `cuMemAlloc_v2` of two 1 MiB buffers, `cuMemcpyHtoD_v2` / `DtoD_v2` / `DtoH_v2`
//!   and `cuMemsetD8_v2` / `cuMemsetD32_v2` (half the buffer), every byte checked on the host
//!   (`htod_dtod_dtoh_equal`, `memset_d8_ok`, `memset_d32_ok`), `cuMemFree_v2`;
//! - `stream`: `cuStreamCreate`, `cuEventCreate`, `cuEventRecord`, `cuStreamSynchronize`,
//!   `cuEventSynchronize`, destroyed;
//! - `managed`: `cuMemAllocManaged` of 1 MiB (global), written and read back by the CPU, freed;
//! - `host-alloc`: `cuMemHostAlloc` of 1 MiB (portable), written and read back, `cuMemFreeHost`;
//! - `module-ptx`: `cuModuleLoadData` of a tiny PTX kernel, `cuModuleGetFunction`,
//!   `cuModuleUnload`;
//! - `launch`: `cuLaunchKernel` of that kernel and `cuCtxSynchronize`; on the simulated GPU a
//!   launch raises the channel error of a faulting launch (no SMs), so this step fails, at the
//!   call that reports it;
//! - `vector-add`: a PTX vector add (`c[i] = a[i] + b[i]`, 1 Mi u32) on device memory
//!   (`cuMemcpyHtoD`, launch, `cuMemcpyDtoH`, every element checked), then on managed memory
//!   (inputs written by the CPU, the output written by the GPU and read by the CPU, checked):
//!   for real GPUs (`tests/gpu/validate.sh`); on the simulated GPU it fails at the launch;
//! - `alloc-loop`: `--loops N` (default 1000) times `cuMemAlloc_v2` + `cuMemFree_v2` of 1 MiB,
//!   timed (`per_iteration_us`), or fewer when `--stop-file` appears (`loops`: how many;
//!   `--ready-file` is created once the first iteration is done);
//! - `mem-quota`: `cuMemGetInfo_v2` (`total`, `free_before`), `cuMemAlloc_v2` of `--bytes`
//!   (must succeed; `free_held`), `cuMemAlloc_v2` of `--more-bytes` (its `CUresult` in
//!   `more_result`, freed if it succeeded), `cuMemFree_v2` of the first, `--more-bytes` again
//!   (`more_after_free_result`), freed;
//! - `hold`: `cuMemAlloc_v2` of `--bytes`, then creates `--ready-file` and waits until killed
//!   or until `<ready-file>.release` exists, then frees it.
//!
//! Every ioctl the process makes on an NVIDIA node is counted, the last few are kept with their
//! decoded escape, control/class and NV status, and the GPU ids of the last successful
//! `GPU_GET_PROBED_IDS` are reported (`probed_gpu_ids`: the GPUs the driver showed libcuda): the binary exports its own `ioctl` (the
//! dynamic linker binds libcuda's `ioctl` to it), which records the call and issues the real
//! syscall. A step that fails prints the exact `CUresult` (number and name), the API call, and
//! the last proxied calls.
//!
//! Output: one JSON line on stdout (`steps`: one object per step with `ok`, `ms`, `ioctls`, and
//! its values; `failed`: the first failure). Exit status 0 when every step passed and every
//! expectation held, 1 otherwise, 2 on usage errors.

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulong, c_void};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use clap::Parser;
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use serde_json::{Value, json};
use tests::dl::sym;

#[derive(Parser)]
#[command(name = "cuda-probe", about = "Drives libcuda.so.1 step by step")]
struct Cli {
    /// libcuda to load (default: `libcuda.so.1` from the loader's search path).
    #[arg(long, default_value = "libcuda.so.1")]
    lib: String,
    /// Fail unless cuDeviceGetCount says this many devices.
    #[arg(long)]
    expect_count: Option<i32>,
    /// Fail unless every device has this name.
    #[arg(long)]
    expect_name: Option<String>,
    /// Fail unless device 0 has this UUID (`GPU-...`).
    #[arg(long)]
    expect_uuid: Option<String>,
    /// Fail unless device 0 has this PCI bus id (`0000:2a:00.0`).
    #[arg(long)]
    expect_pci_bus_id: Option<String>,
    /// Iterations of the `alloc-loop` step.
    #[arg(long, default_value_t = 1000)]
    loops: u32,
    /// Buffer size of the `mem`, `dtod`, `memset`, `host-alloc` and `stream` steps.
    #[arg(long, default_value_t = PROBE_BYTES, value_parser = clap::value_parser!(usize))]
    bytes: usize,
    /// Buffer size of the `memset` step, which sets the first half of it (libcuda sets more
    /// than 4 KiB with a compute kernel: on the simulated GPU, without SMs, that fails).
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(usize))]
    memset_bytes: usize,
    /// The second allocation of the `mem-quota` step.
    #[arg(long, default_value_t = PROBE_BYTES, value_parser = clap::value_parser!(usize))]
    more_bytes: usize,
    /// The file the `hold` step creates once it holds its memory.
    #[arg(long)]
    ready_file: Option<String>,
    /// `alloc-loop` stops early once this file exists (checked every 16 iterations): a client
    /// that loops while something is done to its instance (`tests/gpu/validate.sh`'s live
    /// upgrade).
    #[arg(long)]
    stop_file: Option<String>,
    /// Steps: init, ctx, mem, stream, managed, host-alloc, module-ptx, launch, vector-add,
    /// alloc-loop, mem-quota, hold.
    #[arg(required = true, value_parser = ORDER)]
    steps: Vec<String>,
}

// ---------------------------------------------------------------------------------- ioctl hook

/// Calls kept for the failure report (the last [`SHOWN`] are shown) and, with
/// `CUDA_PROBE_ALL_IOCTLS=1`, for the whole report: a context and the VM suite's steps make
/// 4,000–4,300 calls (how many depends on timing), so 4096 dropped the context's first ones.
const RING: usize = 16384;
/// Calls shown in a failure report (`CUDA_PROBE_ALL_IOCTLS=1`: every call kept).
const SHOWN: usize = 64;
/// Per call: request, fd, return value, errno, decoded code (control/class/function), status,
/// escape of an `NV_ESC_IOCTL_XFER_CMD` payload (0 if none), sequence number.
const FIELDS: usize = 10;
static RING_BUF: [[AtomicU64; FIELDS]; RING] =
    [const { [const { AtomicU64::new(0) }; FIELDS] }; RING];
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Ioctls on NVIDIA nodes so far.
static NV_IOCTLS: AtomicU64 = AtomicU64::new(0);
const NONE: u64 = u64::MAX;

/// Whether `request` is one of NVIDIA's: a frontend escape (type `'F'`) or a UVM command (plain
/// numbers below 0x1000, and `UVM_INITIALIZE`/`UVM_DEINITIALIZE`).
/// A host address that the driver or CUDA handed back as a u64.
fn host_ptr(addr: u64) -> *mut u8 {
    usize::try_from(addr).expect("a 64-bit host") as *mut u8
}

/// A name buffer's length as CUDA takes it.
fn buf_len(buf: &[c_char]) -> c_int {
    c_int::try_from(buf.len()).expect("a small buffer")
}

fn is_nvidia_request(request: u64) -> bool {
    (request >> 8) & 0xff == u64::from(b'F')
        || request < 0x1000
        || request == u64::from(UVM_INITIALIZE)
        || request == u64::from(UVM_DEINITIALIZE)
}

/// The code (control, class, function) and NV status an escape carries after the call.
/// `read(off)` reads a `u32` of the escape's payload.
fn decode_escape(nr: u8, size: usize, read: &dyn Fn(usize) -> u32) -> (u64, u64) {
    use std::mem::offset_of;
    let pair = |code: Option<usize>, status: usize| {
        (
            code.map_or(NONE, |o| u64::from(read(o))),
            u64::from(read(status)),
        )
    };
    match nr {
        NV_ESC_RM_CONTROL => pair(
            Some(offset_of!(NVOS54_PARAMETERS, cmd)),
            offset_of!(NVOS54_PARAMETERS, status),
        ),
        NV_ESC_RM_ALLOC if size == size_of::<NVOS64_PARAMETERS>() => pair(
            Some(offset_of!(NVOS64_PARAMETERS, hClass)),
            offset_of!(NVOS64_PARAMETERS, status),
        ),
        NV_ESC_RM_ALLOC => pair(
            Some(offset_of!(NVOS21_PARAMETERS, hClass)),
            offset_of!(NVOS21_PARAMETERS, status),
        ),
        NV_ESC_RM_FREE => pair(None, offset_of!(NVOS00_PARAMETERS, status)),
        NV_ESC_RM_ALLOC_MEMORY => pair(
            Some(offset_of!(NVOS02_PARAMETERS, hClass)),
            offset_of!(NVOS02_PARAMETERS, status),
        ),
        NV_ESC_RM_MAP_MEMORY => pair(None, offset_of!(NVOS33_PARAMETERS, status)),
        NV_ESC_RM_UNMAP_MEMORY => pair(None, offset_of!(NVOS34_PARAMETERS, status)),
        NV_ESC_RM_VID_HEAP_CONTROL => pair(
            Some(offset_of!(NVOS32_PARAMETERS, function)),
            offset_of!(NVOS32_PARAMETERS, status),
        ),
        NV_ESC_RM_DUP_OBJECT => pair(None, offset_of!(NVOS55_PARAMETERS, status)),
        NV_ESC_RM_MAP_MEMORY_DMA => pair(None, offset_of!(NVOS46_PARAMETERS, status)),
        NV_ESC_RM_UNMAP_MEMORY_DMA => pair(None, offset_of!(NVOS47_PARAMETERS, status)),
        NV_ESC_ALLOC_OS_EVENT => pair(None, offset_of!(nv_ioctl_alloc_os_event_t, Status)),
        _ => (NONE, NONE),
    }
}

/// Reads a `u32` at `base + off`.
///
/// # Safety
/// `base + off .. + 4` must be readable.
unsafe fn peek_u32(base: *const u8, off: usize) -> u32 {
    // SAFETY: the caller guarantees the range is readable; unaligned reads are fine.
    unsafe { std::ptr::read_unaligned(base.add(off).cast::<u32>()) }
}

fn record(fd: c_int, request: u64, arg: *mut c_void, ret: c_int, errno: c_int) {
    if !is_nvidia_request(request) {
        return;
    }
    let seq = NV_IOCTLS.fetch_add(1, Ordering::Relaxed);
    let (mut code, mut status, mut inner) = (NONE, NONE, 0u64);
    // RM_ALLOC_MEMORY's flags and limit (what is asked for, for the report).
    let (mut mem_flags, mut mem_limit) = (NONE, NONE);
    if ret == 0 && !arg.is_null() && (request >> 8) & 0xff == u64::from(b'F') {
        let nr = (request & 0xff) as u8;
        let size = ((request >> 16) & 0x3fff) as usize;
        let base = arg.cast::<u8>().cast_const();
        if nr == NV_ESC_IOCTL_XFER_CMD && size >= size_of::<nv_ioctl_xfer_t>() {
            // SAFETY: the driver accepted `size` bytes at `arg` (ret 0), so they are readable.
            let (cmd, len, ptr) = unsafe {
                (
                    peek_u32(base, 0),
                    peek_u32(base, 4) as usize,
                    std::ptr::read_unaligned(base.add(8).cast::<u64>()),
                )
            };
            inner = u64::from(cmd & 0xff) | 0x100;
            if ptr != 0 {
                let p = host_ptr(ptr).cast_const();
                let read = |off: usize| {
                    if off + 4 <= len {
                        // SAFETY: the driver copied `len` bytes from `ptr` in and out (ret 0).
                        unsafe { peek_u32(p, off) }
                    } else {
                        u32::MAX
                    }
                };
                (code, status) = decode_escape((cmd & 0xff) as u8, len, &read);
            }
        } else {
            let read = |off: usize| {
                if off + 4 <= size {
                    // SAFETY: as above, `size` bytes at `arg` were copied in and out.
                    unsafe { peek_u32(base, off) }
                } else {
                    u32::MAX
                }
            };
            (code, status) = decode_escape(nr, size, &read);
            if nr == NV_ESC_RM_ALLOC_MEMORY {
                use std::mem::offset_of;
                let l = offset_of!(NVOS02_PARAMETERS, limit);
                mem_flags = u64::from(read(offset_of!(NVOS02_PARAMETERS, flags)));
                mem_limit = u64::from(read(l)) | u64::from(read(l + 4)) << 32;
            }
            if nr == NV_ESC_RM_CONTROL && code == u64::from(GPU_GET_PROBED_IDS) && status == 0 {
                note_probed_ids(base, size);
            }
        }
    }
    let slot = &RING_BUF[NEXT.fetch_add(1, Ordering::Relaxed) % RING];
    #[expect(
        clippy::cast_sign_loss,
        reason = "the ring keeps raw bits: a negative fd, ret or errno as two's complement"
    )]
    let vals = [
        request,
        fd as u64,
        ret as i64 as u64,
        errno as u64,
        code,
        status,
        inner,
        seq,
        mem_flags,
        mem_limit,
    ];
    for (f, v) in slot.iter().zip(vals) {
        f.store(v, Ordering::Relaxed);
    }
}

/// `NV0000_CTRL_CMD_GPU_GET_PROBED_IDS`.
const GPU_GET_PROBED_IDS: u32 = 0x214;
/// The GPU ids of the last successful `GPU_GET_PROBED_IDS` the process made (its first
/// `PROBED_KEPT` entries; `u32::MAX` = none): which GPUs the driver showed libcuda.
const PROBED_KEPT: usize = 8;
static PROBED: [AtomicU64; PROBED_KEPT] = [const { AtomicU64::new(NONE) }; PROBED_KEPT];

/// Keeps the first gpuIds of a successful `GPU_GET_PROBED_IDS`, whose `NVOS54_PARAMETERS` are
/// the `size` bytes at `base`.
fn note_probed_ids(base: *const u8, size: usize) {
    use std::mem::offset_of;
    let (p_off, len_off) = (
        offset_of!(NVOS54_PARAMETERS, params),
        offset_of!(NVOS54_PARAMETERS, paramsSize),
    );
    if size < size_of::<NVOS54_PARAMETERS>() {
        return;
    }
    // SAFETY: the driver copied the whole NVOS54_PARAMETERS in and out (ret 0).
    let (ptr, len) = unsafe {
        (
            std::ptr::read_unaligned(base.add(p_off).cast::<u64>()),
            peek_u32(base, len_off) as usize,
        )
    };
    if ptr == 0 || len < 4 * PROBED_KEPT {
        return;
    }
    for (i, slot) in PROBED.iter().enumerate() {
        // SAFETY: the driver copied paramsSize (>= 4 * PROBED_KEPT) bytes out to `ptr` (ret 0
        // and NV_OK), the caller's own buffer.
        let id = unsafe { peek_u32(host_ptr(ptr).cast_const(), 4 * i) };
        slot.store(u64::from(id), Ordering::Relaxed);
    }
}

/// The process's `ioctl`: libcuda's calls bind here (the binary exports the symbol, see
/// `build.rs`). Records NVIDIA requests and issues the syscall. Declared with a fixed third
/// argument: on x86_64 a variadic caller passes it in the same register.
///
/// # Safety
/// As `ioctl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    // The next `ioctl` after ours: nvproxy's shim when preloaded (the socket transport serves
    // its opens' ioctls there), else libc's; the raw syscall if none resolves.
    type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut next = NEXT.load(Ordering::Acquire);
    if next == 0 {
        // SAFETY: dlsym takes a pseudo-handle and a NUL-terminated static name.
        next = unsafe { libc::dlsym(libc::RTLD_NEXT, c"ioctl".as_ptr()) } as usize;
        NEXT.store(next, Ordering::Release);
    }
    let ret = if next != 0 {
        // SAFETY: the address dlsym returned for "ioctl", whose C signature is IoctlFn, called
        // with the caller's arguments.
        unsafe { std::mem::transmute::<usize, IoctlFn>(next)(fd, request, arg) }
    } else {
        // SAFETY: a plain ioctl syscall with the caller's arguments, as libc's ioctl does.
        let r = unsafe { libc::syscall(libc::SYS_ioctl, fd, request, arg) };
        c_int::try_from(r).expect("ioctl returns an int")
    };
    let errno = if ret < 0 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    } else {
        0
    };
    record(fd, request, arg, ret, errno);
    if ret < 0 {
        // SAFETY: __errno_location is this thread's errno; restore it after our own work.
        unsafe { *libc::__errno_location() = errno };
    }
    ret
}

fn escape_name(nr: u8) -> String {
    let name = match nr {
        NV_ESC_RM_ALLOC_MEMORY => "RM_ALLOC_MEMORY",
        NV_ESC_RM_ALLOC_OBJECT => "RM_ALLOC_OBJECT",
        NV_ESC_RM_FREE => "RM_FREE",
        NV_ESC_RM_CONTROL => "RM_CONTROL",
        NV_ESC_RM_ALLOC => "RM_ALLOC",
        NV_ESC_RM_DUP_OBJECT => "RM_DUP_OBJECT",
        NV_ESC_RM_SHARE => "RM_SHARE",
        NV_ESC_RM_VID_HEAP_CONTROL => "RM_VID_HEAP_CONTROL",
        NV_ESC_RM_MAP_MEMORY => "RM_MAP_MEMORY",
        NV_ESC_RM_UNMAP_MEMORY => "RM_UNMAP_MEMORY",
        NV_ESC_RM_MAP_MEMORY_DMA => "RM_MAP_MEMORY_DMA",
        NV_ESC_RM_UNMAP_MEMORY_DMA => "RM_UNMAP_MEMORY_DMA",
        NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO => "RM_UPDATE_DEVICE_MAPPING_INFO",
        NV_ESC_CARD_INFO => "CARD_INFO",
        NV_ESC_REGISTER_FD => "REGISTER_FD",
        NV_ESC_ALLOC_OS_EVENT => "ALLOC_OS_EVENT",
        NV_ESC_FREE_OS_EVENT => "FREE_OS_EVENT",
        NV_ESC_STATUS_CODE => "STATUS_CODE",
        NV_ESC_CHECK_VERSION_STR => "CHECK_VERSION_STR",
        NV_ESC_IOCTL_XFER_CMD => "IOCTL_XFER_CMD",
        NV_ESC_ATTACH_GPUS_TO_FD => "ATTACH_GPUS_TO_FD",
        NV_ESC_SYS_PARAMS => "SYS_PARAMS",
        NV_ESC_NUMA_INFO => "NUMA_INFO",
        NV_ESC_WAIT_OPEN_COMPLETE => "WAIT_OPEN_COMPLETE",
        _ => return format!("escape {nr:#x}"),
    };
    name.to_owned()
}

/// The recorded calls, oldest first.
/// Whether every call is kept and reported (`CUDA_PROBE_ALL_IOCTLS=1`).
fn all_calls() -> bool {
    std::env::var_os("CUDA_PROBE_ALL_IOCTLS").is_some()
}

fn last_calls() -> Vec<Value> {
    let mut rows: Vec<[u64; FIELDS]> = RING_BUF
        .iter()
        .map(|s| std::array::from_fn(|i| s[i].load(Ordering::Relaxed)))
        .filter(|r| r[0] != 0)
        .collect();
    rows.sort_by_key(|r| r[7]);
    if !all_calls() {
        rows.drain(..rows.len().saturating_sub(SHOWN));
    }
    rows.iter()
        .map(|r| {
            let (request, ret, errno, code, status, inner) = (r[0], r[2], r[3], r[4], r[5], r[6]);
            let mut v = json!({
                "n": r[7] + 1,
                "fd": r[1] as i64,
                "request": format!("{request:#x}"),
                "ret": ret as i64,
            });
            if (request >> 8) & 0xff == u64::from(b'F') {
                v["escape"] = escape_name((request & 0xff) as u8).into();
                if inner != 0 {
                    v["xfer_escape"] = escape_name((inner & 0xff) as u8).into();
                }
            } else {
                v["uvm_cmd"] = format!("{request:#x}").into();
            }
            if ret as i64 != 0 {
                v["errno"] = errno.into();
            }
            if code != NONE {
                v["code"] = format!("{code:#x}").into();
            }
            if status != NONE {
                v["nv_status"] = format!("{status:#x}").into();
            }
            if r[8] != NONE {
                v["flags"] = format!("{:#x}", r[8]).into();
                v["limit"] = format!("{:#x}", r[9]).into();
            }
            v
        })
        .collect()
}

// ---------------------------------------------------------------------------------- libcuda

type CuResult = c_int;
type CuDevice = c_int;
type CuPtr = u64;
const CUDA_SUCCESS: CuResult = 0;
/// `CUDA_ERROR_LAUNCH_FAILED`: an exception on the device while executing a kernel.
const CUDA_ERROR_LAUNCH_FAILED: CuResult = 719;

/// The driver API functions the probe calls.
struct Cuda {
    get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    device_get_uuid: unsafe extern "C" fn(*mut [u8; 16], CuDevice) -> CuResult,
    device_total_mem: unsafe extern "C" fn(*mut usize, CuDevice) -> CuResult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult,
    device_get_pci_bus_id: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    ctx_create: unsafe extern "C" fn(*mut *mut c_void, c_uint, CuDevice) -> CuResult,
    ctx_destroy: unsafe extern "C" fn(*mut c_void) -> CuResult,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuPtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuPtr) -> CuResult,
    mem_alloc_managed: unsafe extern "C" fn(*mut CuPtr, usize, c_uint) -> CuResult,
    mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> CuResult,
    module_get_function:
        unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> CuResult,
    module_unload: unsafe extern "C" fn(*mut c_void) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(CuPtr, *const c_void, usize) -> CuResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuPtr, usize) -> CuResult,
    memcpy_dtod: unsafe extern "C" fn(CuPtr, CuPtr, usize) -> CuResult,
    memset_d8: unsafe extern "C" fn(CuPtr, u8, usize) -> CuResult,
    memset_d16: unsafe extern "C" fn(CuPtr, u16, usize) -> CuResult,
    memset_d32: unsafe extern "C" fn(CuPtr, c_uint, usize) -> CuResult,
    mem_alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> CuResult,
    mem_host_register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CuResult,
    mem_host_unregister: unsafe extern "C" fn(*mut c_void) -> CuResult,
    memcpy_htod_async: unsafe extern "C" fn(CuPtr, *const c_void, usize, *mut c_void) -> CuResult,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, CuPtr, usize, *mut c_void) -> CuResult,
    event_elapsed_time: unsafe extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut *mut c_void, CuDevice) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(*mut c_void) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(*mut c_void) -> CuResult,
    stream_destroy: unsafe extern "C" fn(*mut c_void) -> CuResult,
    event_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CuResult,
    event_record: unsafe extern "C" fn(*mut c_void, *mut c_void) -> CuResult,
    event_synchronize: unsafe extern "C" fn(*mut c_void) -> CuResult,
    event_destroy: unsafe extern "C" fn(*mut c_void) -> CuResult,
    #[allow(clippy::type_complexity)]
    launch_kernel: unsafe extern "C" fn(
        *mut c_void,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    ctx_synchronize: unsafe extern "C" fn() -> CuResult,
}

impl Cuda {
    fn load(path: &str) -> Result<Cuda, String> {
        let lib = tests::dl::open(path)?;
        // SAFETY: each type below is the function's prototype in cuda.h (CUDA 12), for the
        // versioned symbol the header maps the name to (_v2 where it does).
        unsafe {
            Ok(Cuda {
                get_error_name: sym(lib, "cuGetErrorName")?,
                init: sym(lib, "cuInit")?,
                driver_get_version: sym(lib, "cuDriverGetVersion")?,
                device_get_count: sym(lib, "cuDeviceGetCount")?,
                device_get: sym(lib, "cuDeviceGet")?,
                device_get_name: sym(lib, "cuDeviceGetName")?,
                device_get_uuid: sym(lib, "cuDeviceGetUuid_v2")?,
                device_total_mem: sym(lib, "cuDeviceTotalMem_v2")?,
                device_get_attribute: sym(lib, "cuDeviceGetAttribute")?,
                device_get_pci_bus_id: sym(lib, "cuDeviceGetPCIBusId")?,
                ctx_create: sym(lib, "cuCtxCreate_v2")?,
                ctx_destroy: sym(lib, "cuCtxDestroy_v2")?,
                mem_get_info: sym(lib, "cuMemGetInfo_v2")?,
                mem_alloc: sym(lib, "cuMemAlloc_v2")?,
                mem_free: sym(lib, "cuMemFree_v2")?,
                mem_alloc_managed: sym(lib, "cuMemAllocManaged")?,
                mem_host_alloc: sym(lib, "cuMemHostAlloc")?,
                mem_free_host: sym(lib, "cuMemFreeHost")?,
                module_load_data: sym(lib, "cuModuleLoadData")?,
                module_get_function: sym(lib, "cuModuleGetFunction")?,
                module_unload: sym(lib, "cuModuleUnload")?,
                memcpy_htod: sym(lib, "cuMemcpyHtoD_v2")?,
                memcpy_dtoh: sym(lib, "cuMemcpyDtoH_v2")?,
                memcpy_dtod: sym(lib, "cuMemcpyDtoD_v2")?,
                memset_d8: sym(lib, "cuMemsetD8_v2")?,
                memset_d16: sym(lib, "cuMemsetD16_v2")?,
                memset_d32: sym(lib, "cuMemsetD32_v2")?,
                mem_alloc_host: sym(lib, "cuMemAllocHost_v2")?,
                mem_host_register: sym(lib, "cuMemHostRegister_v2")?,
                mem_host_unregister: sym(lib, "cuMemHostUnregister")?,
                memcpy_htod_async: sym(lib, "cuMemcpyHtoDAsync_v2")?,
                memcpy_dtoh_async: sym(lib, "cuMemcpyDtoHAsync_v2")?,
                event_elapsed_time: sym(lib, "cuEventElapsedTime")?,
                primary_ctx_retain: sym(lib, "cuDevicePrimaryCtxRetain")?,
                primary_ctx_release: sym(lib, "cuDevicePrimaryCtxRelease_v2")?,
                ctx_set_current: sym(lib, "cuCtxSetCurrent")?,
                stream_create: sym(lib, "cuStreamCreate")?,
                stream_synchronize: sym(lib, "cuStreamSynchronize")?,
                stream_destroy: sym(lib, "cuStreamDestroy_v2")?,
                event_create: sym(lib, "cuEventCreate")?,
                event_record: sym(lib, "cuEventRecord")?,
                event_synchronize: sym(lib, "cuEventSynchronize")?,
                event_destroy: sym(lib, "cuEventDestroy_v2")?,
                launch_kernel: sym(lib, "cuLaunchKernel")?,
                ctx_synchronize: sym(lib, "cuCtxSynchronize")?,
            })
        }
    }

    fn error_name(&self, r: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a static string pointer (or fails for unknown values).
        let ok = unsafe { (self.get_error_name)(r, &mut p) } == CUDA_SUCCESS;
        if ok && !p.is_null() {
            // SAFETY: a static NUL-terminated string of libcuda.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            format!("CUresult {r}")
        }
    }
}

/// `CUdevice_attribute` values (cuda.h).
const ATTRS: &[(c_int, &str)] = &[
    (16, "multiprocessor_count"),
    (75, "compute_capability_major"),
    (76, "compute_capability_minor"),
    (33, "pci_bus"),
    (34, "pci_device"),
    (50, "pci_domain"),
    (13, "clock_rate_khz"),
    (36, "memory_clock_rate_khz"),
    (37, "global_memory_bus_width"),
    (38, "l2_cache_size"),
    (1, "max_threads_per_block"),
    (39, "max_threads_per_multiprocessor"),
    (10, "warp_size"),
    (8, "max_shared_memory_per_block"),
    (81, "max_shared_memory_per_multiprocessor"),
    (9, "total_constant_memory"),
    (32, "ecc_enabled"),
    (18, "integrated"),
    (20, "compute_mode"),
    (41, "unified_addressing"),
    (83, "managed_memory"),
    (89, "concurrent_managed_access"),
];
/// `CU_MEM_ATTACH_GLOBAL`.
const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
/// `CU_MEMHOSTALLOC_PORTABLE`.
const CU_MEMHOSTALLOC_PORTABLE: c_uint = 1;
const PROBE_BYTES: usize = 1 << 20;
/// A kernel that does nothing, for sm_50 and up (the driver JIT-compiles it for the device).
const PTX: &str = ".version 7.0\n.target sm_50\n.address_size 64\n\n\
.visible .entry nvproxy_probe(.param .u64 p)\n{\n\tret;\n}\n\0";

/// `c[i] = a[i] + b[i]` over `n` u32s, one thread per element, sm_50 and up.
const VADD_PTX: &str = ".version 7.0\n.target sm_50\n.address_size 64\n\n\
.visible .entry nvproxy_vadd(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u32 pn)\n\
{\n\
\t.reg .pred %p<2>;\n\t.reg .b32 %r<10>;\n\t.reg .b64 %rd<12>;\n\
\tld.param.u64 %rd1, [pa];\n\tld.param.u64 %rd2, [pb];\n\tld.param.u64 %rd3, [pc];\n\
\tld.param.u32 %r1, [pn];\n\
\tmov.u32 %r2, %ctaid.x;\n\tmov.u32 %r3, %ntid.x;\n\tmov.u32 %r4, %tid.x;\n\
\tmad.lo.s32 %r5, %r2, %r3, %r4;\n\
\tsetp.ge.u32 %p1, %r5, %r1;\n\t@%p1 bra DONE;\n\
\tcvta.to.global.u64 %rd4, %rd1;\n\tcvta.to.global.u64 %rd5, %rd2;\n\
\tcvta.to.global.u64 %rd6, %rd3;\n\tmul.wide.u32 %rd7, %r5, 4;\n\
\tadd.s64 %rd8, %rd4, %rd7;\n\tadd.s64 %rd9, %rd5, %rd7;\n\tadd.s64 %rd10, %rd6, %rd7;\n\
\tld.global.u32 %r6, [%rd8];\n\tld.global.u32 %r7, [%rd9];\n\
\tadd.s32 %r8, %r6, %r7;\n\tst.global.u32 [%rd10], %r8;\n\
DONE:\n\tret;\n}\n\0";
/// Elements of the vector add.
const VADD_N: u32 = 1 << 20;

/// One failed driver API call.
struct Failure {
    call: &'static str,
    result: CuResult,
}

/// Runs `f`, turning a non-success `CUresult` into a [`Failure`].
fn check(call: &'static str, result: CuResult) -> Result<(), Failure> {
    if result == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Failure { call, result })
    }
}

/// The state steps share.
struct Probe {
    cuda: Cuda,
    ctx: *mut c_void,
    devices: Vec<Value>,
}

impl Probe {
    fn init(&mut self, out: &mut Value) -> Result<(), Failure> {
        let c = &self.cuda;
        let (before, t) = (NV_IOCTLS.load(Ordering::Relaxed), Instant::now());
        // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
        let r = check("cuInit", unsafe { (c.init)(0) });
        out["cuinit_ms"] = (t.elapsed().as_secs_f64() * 1000.0).into();
        out["cuinit_ioctls"] = (NV_IOCTLS.load(Ordering::Relaxed) - before).into();
        r?;
        let mut version = 0;
        // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
        check("cuDriverGetVersion", unsafe {
            (c.driver_get_version)(&mut version)
        })?;
        out["driver_api_version"] = version.into();
        let mut count = 0;
        // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
        check("cuDeviceGetCount", unsafe {
            (c.device_get_count)(&mut count)
        })?;
        out["count"] = count.into();
        for ordinal in 0..count {
            let mut dev: CuDevice = 0;
            // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
            check("cuDeviceGet", unsafe { (c.device_get)(&mut dev, ordinal) })?;
            let mut name = [0 as c_char; 256];
            // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
            check("cuDeviceGetName", unsafe {
                (c.device_get_name)(name.as_mut_ptr(), buf_len(&name), dev)
            })?;
            let mut uuid = [0u8; 16];
            // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
            check("cuDeviceGetUuid_v2", unsafe {
                (c.device_get_uuid)(&mut uuid, dev)
            })?;
            let mut total = 0usize;
            // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
            check("cuDeviceTotalMem_v2", unsafe {
                (c.device_total_mem)(&mut total, dev)
            })?;
            let mut bus_id = [0 as c_char; 64];
            // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
            check("cuDeviceGetPCIBusId", unsafe {
                (c.device_get_pci_bus_id)(bus_id.as_mut_ptr(), buf_len(&bus_id), dev)
            })?;
            let mut d = json!({
                "ordinal": ordinal,
                // SAFETY: cuDeviceGetName NUL-terminates within the length given.
                "name": unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy(),
                "uuid": tests::nvfe::format_uuid(&uuid),
                "total_mem": total,
                // SAFETY: likewise for the bus id.
                "pci_bus_id": unsafe { CStr::from_ptr(bus_id.as_ptr()) }.to_string_lossy(),
            });
            for &(attr, key) in ATTRS {
                let mut v = 0;
                // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
                check("cuDeviceGetAttribute", unsafe {
                    (c.device_get_attribute)(&mut v, attr, dev)
                })?;
                d[key] = v.into();
            }
            self.devices.push(d);
        }
        out["devices"] = self.devices.clone().into();
        Ok(())
    }

    fn ctx(&mut self, out: &mut Value) -> Result<(), Failure> {
        let c = &self.cuda;
        let mut dev: CuDevice = 0;
        // SAFETY: the prototype from cuda.h; a pointer to a live local.
        check("cuDeviceGet", unsafe { (c.device_get)(&mut dev, 0) })?;
        // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
        check("cuCtxCreate_v2", unsafe {
            (c.ctx_create)(&mut self.ctx, 0, dev)
        })?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
        check("cuMemGetInfo_v2", unsafe {
            (c.mem_get_info)(&mut free, &mut total)
        })?;
        out["mem_free"] = free.into();
        out["mem_total"] = total.into();
        Ok(())
    }

    /// Two device buffers of `bytes` (`--bytes`), `f` run on them, both freed; `cuMemGetInfo`
    /// before and while they are held (`free_drop`: how much the free memory fell).
    fn with_two(
        &self,
        bytes: usize,
        out: &mut Value,
        f: impl FnOnce(&Self, CuPtr, CuPtr, &mut Value) -> Result<(), Failure>,
    ) -> Result<(), Failure> {
        let c = &self.cuda;
        let free_before = self.mem_free()?;
        let (mut a, mut b): (CuPtr, CuPtr) = (0, 0);
        // SAFETY: pointers to live locals; the pointers freed are the ones allocated.
        check("cuMemAlloc_v2", unsafe { (c.mem_alloc)(&mut a, bytes) })?;
        out["dptr"] = format!("{a:#x}").into();
        // SAFETY: as above.
        let r = check("cuMemAlloc_v2", unsafe { (c.mem_alloc)(&mut b, bytes) })
            .and_then(|()| {
                let held = self.mem_free()?;
                out["free_drop"] = free_before.saturating_sub(held).into();
                Ok(())
            })
            .and_then(|()| f(self, a, b, out));
        // SAFETY: the allocations above (b may be 0: cuMemFree then fails, reported).
        let f1 = check("cuMemFree_v2", unsafe { (c.mem_free)(a) });
        let f2 = if b != 0 {
            // SAFETY: as above.
            check("cuMemFree_v2", unsafe { (c.mem_free)(b) })
        } else {
            Ok(())
        };
        r.and(f1).and(f2)
    }

    /// `cuMemGetInfo_v2`'s free bytes.
    fn mem_free(&self) -> Result<usize, Failure> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
        check("cuMemGetInfo_v2", unsafe {
            (self.cuda.mem_get_info)(&mut free, &mut total)
        })?;
        Ok(free)
    }

    /// The `mem-quota` step (module docs).
    fn mem_quota(&mut self, bytes: usize, more: usize, out: &mut Value) -> Result<(), Failure> {
        let c = &self.cuda;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the prototype from cuda.h; pointers to live locals of the declared types.
        check("cuMemGetInfo_v2", unsafe {
            (c.mem_get_info)(&mut free, &mut total)
        })?;
        out["total"] = total.into();
        out["free_before"] = free.into();
        let mut a: CuPtr = 0;
        // SAFETY: a pointer to a live local.
        check("cuMemAlloc_v2", unsafe { (c.mem_alloc)(&mut a, bytes) })?;
        out["free_held"] = self.mem_free()?.into();
        let try_more = |key: &str, out: &mut Value| -> Result<(), Failure> {
            let mut b: CuPtr = 0;
            // SAFETY: a pointer to a live local.
            let r = unsafe { (c.mem_alloc)(&mut b, more) };
            out[key] = r.into();
            if r == CUDA_SUCCESS {
                // SAFETY: the allocation just made.
                check("cuMemFree_v2", unsafe { (c.mem_free)(b) })?;
            }
            Ok(())
        };
        try_more("more_result", out)?;
        // SAFETY: the allocation above.
        check("cuMemFree_v2", unsafe { (c.mem_free)(a) })?;
        try_more("more_after_free_result", out)
    }

    /// The `hold` step: holds `bytes` of device memory until the process is killed.
    fn hold(&mut self, bytes: usize, ready: Option<&str>, out: &mut Value) -> Result<(), Failure> {
        let mut a: CuPtr = 0;
        // SAFETY: a pointer to a live local.
        check("cuMemAlloc_v2", unsafe {
            (self.cuda.mem_alloc)(&mut a, bytes)
        })?;
        out["dptr"] = format!("{a:#x}").into();
        if let Some(f) = ready
            && std::fs::write(f, b"held\n").is_err()
        {
            return Err(Failure {
                call: "writing --ready-file",
                result: CUDA_SUCCESS,
            });
        }
        // Until killed, or until `<ready-file>.release` exists (then the memory is freed).
        let release = ready.map(|f| format!("{f}.release"));
        loop {
            if release
                .as_deref()
                .is_some_and(|r| std::path::Path::new(r).exists())
            {
                // SAFETY: the allocation above.
                return check("cuMemFree_v2", unsafe { (self.cuda.mem_free)(a) });
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// `cuMemcpyHtoD` into two buffers and `cuMemcpyDtoH` back, every byte checked.
    fn mem(&mut self, bytes: usize, out: &mut Value) -> Result<(), Failure> {
        self.with_two(bytes, out, |p, a, b, out| {
            let c = &p.cuda;
            let src = pattern(bytes, 31);
            let src2 = pattern(bytes, 7);
            // SAFETY: host buffers of `bytes`, device buffers of `bytes`.
            check("cuMemcpyHtoD_v2", unsafe {
                (c.memcpy_htod)(a, src.as_ptr().cast(), bytes)
            })?;
            // SAFETY: as above.
            check("cuMemcpyHtoD_v2", unsafe {
                (c.memcpy_htod)(b, src2.as_ptr().cast(), bytes)
            })?;
            let (mut back, mut back2) = (vec![0u8; bytes], vec![0u8; bytes]);
            // SAFETY: as above.
            check("cuMemcpyDtoH_v2", unsafe {
                (c.memcpy_dtoh)(back.as_mut_ptr().cast(), a, bytes)
            })?;
            // SAFETY: as above.
            check("cuMemcpyDtoH_v2", unsafe {
                (c.memcpy_dtoh)(back2.as_mut_ptr().cast(), b, bytes)
            })?;
            out["htod_dtoh_equal"] = (back == src && back2 == src2).into();
            expect(back == src && back2 == src2, "HtoD/DtoH bytes")
        })
    }

    /// `cuMemcpyDtoD` between two device buffers, checked by a `cuMemcpyDtoH`.
    fn dtod(&mut self, bytes: usize, out: &mut Value) -> Result<(), Failure> {
        self.with_two(bytes, out, |p, a, b, out| {
            let c = &p.cuda;
            let src = pattern(bytes, 13);
            // SAFETY: host buffers of `bytes`, device buffers of `bytes`.
            check("cuMemcpyHtoD_v2", unsafe {
                (c.memcpy_htod)(a, src.as_ptr().cast(), bytes)
            })?;
            // SAFETY: as above.
            check("cuMemcpyDtoD_v2", unsafe { (c.memcpy_dtod)(b, a, bytes) })?;
            let mut back = vec![0u8; bytes];
            // SAFETY: as above.
            check("cuMemcpyDtoH_v2", unsafe {
                (c.memcpy_dtoh)(back.as_mut_ptr().cast(), b, bytes)
            })?;
            out["dtod_equal"] = (back == src).into();
            expect(back == src, "DtoD bytes")
        })
    }

    /// `cuMemsetD8`, `D16` and `D32` over the first half of a buffer whose second half keeps
    /// its bytes, each checked by a `cuMemcpyDtoH`.
    fn memset(&mut self, bytes: usize, out: &mut Value) -> Result<(), Failure> {
        self.with_two(bytes, out, |p, a, _, out| {
            let c = &p.cuda;
            let src = pattern(bytes, 17);
            let half = bytes / 2;
            let mut ok = true;
            for (width, word) in [(1usize, 0x5au32), (2, 0xbeef), (4, 0xdead_beef)] {
                // SAFETY: host and device buffers of `bytes`.
                check("cuMemcpyHtoD_v2", unsafe {
                    (c.memcpy_htod)(a, src.as_ptr().cast(), bytes)
                })?;
                let n = half / width;
                // SAFETY: n elements of `width` bytes inside the buffer.
                let (call, r) = unsafe {
                    match width {
                        1 => ("cuMemsetD8_v2", (c.memset_d8)(a, (word & 0xff) as u8, n)),
                        2 => (
                            "cuMemsetD16_v2",
                            (c.memset_d16)(a, (word & 0xffff) as u16, n),
                        ),
                        _ => ("cuMemsetD32_v2", (c.memset_d32)(a, word, n)),
                    }
                };
                check(call, r)?;
                let mut back = vec![0u8; bytes];
                // SAFETY: as above.
                check("cuMemcpyDtoH_v2", unsafe {
                    (c.memcpy_dtoh)(back.as_mut_ptr().cast(), a, bytes)
                })?;
                let le = word.to_le_bytes();
                let set = back[..n * width].chunks(width).all(|w| w == &le[..width]);
                let kept = back[n * width..] == src[n * width..];
                out[format!("memset_d{}_ok", width * 8)] = (set && kept).into();
                ok &= set && kept;
            }
            expect(ok, "memset bytes")
        })
    }

    /// A stream and two events around an asynchronous HtoD from one pinned buffer and a DtoH
    /// into another:
    /// `cuEventRecord` on the stream, `cuStreamSynchronize`, `cuEventSynchronize`,
    /// `cuEventElapsedTime` (`elapsed_ms`), the bytes checked.
    fn stream(&mut self, bytes: usize, out: &mut Value) -> Result<(), Failure> {
        let c = &self.cuda;
        let mut stream: *mut c_void = std::ptr::null_mut();
        // SAFETY: a pointer to a live local; the stream destroyed is the one created.
        check("cuStreamCreate", unsafe {
            (c.stream_create)(&mut stream, 0)
        })?;
        let mut ev = [std::ptr::null_mut::<c_void>(); 2];
        let mut host: *mut c_void = std::ptr::null_mut();
        let mut host2: *mut c_void = std::ptr::null_mut();
        let mut dev: CuPtr = 0;
        let r = (|| {
            for e in &mut ev {
                // SAFETY: a pointer to a live local; CU_EVENT_DEFAULT (timing enabled).
                check("cuEventCreate", unsafe { (c.event_create)(e, 0) })?;
            }
            // SAFETY: pointers to live locals.
            check("cuMemAllocHost_v2", unsafe {
                (c.mem_alloc_host)(&mut host, bytes)
            })?;
            // SAFETY: as above.
            check("cuMemAllocHost_v2", unsafe {
                (c.mem_alloc_host)(&mut host2, bytes)
            })?;
            // SAFETY: as above.
            check("cuMemAlloc_v2", unsafe { (c.mem_alloc)(&mut dev, bytes) })?;
            // SAFETY: cuMemAllocHost returned `bytes` of CPU memory at `host`.
            let h = unsafe { std::slice::from_raw_parts_mut(host.cast::<u8>(), bytes) };
            let src = pattern(bytes, 23);
            h.copy_from_slice(&src);
            // SAFETY: the live events and stream; pinned and device buffers of `bytes`.
            check("cuEventRecord", unsafe { (c.event_record)(ev[0], stream) })?;
            // SAFETY: as above.
            check("cuMemcpyHtoDAsync_v2", unsafe {
                (c.memcpy_htod_async)(dev, host, bytes, stream)
            })?;
            // SAFETY: as above; neither host buffer is touched until the stream is synchronized.
            check("cuMemcpyDtoHAsync_v2", unsafe {
                (c.memcpy_dtoh_async)(host2, dev, bytes, stream)
            })?;
            // SAFETY: as above.
            check("cuEventRecord", unsafe { (c.event_record)(ev[1], stream) })?;
            // SAFETY: the live stream.
            check("cuStreamSynchronize", unsafe {
                (c.stream_synchronize)(stream)
            })?;
            // SAFETY: the live event.
            check("cuEventSynchronize", unsafe {
                (c.event_synchronize)(ev[1])
            })?;
            let mut ms = -1.0f32;
            // SAFETY: a pointer to a live local; both events recorded and complete.
            check("cuEventElapsedTime", unsafe {
                (c.event_elapsed_time)(&mut ms, ev[0], ev[1])
            })?;
            out["elapsed_ms"] = f64::from(ms).into();
            // SAFETY: as above, the stream is idle.
            let h = unsafe { std::slice::from_raw_parts(host2.cast::<u8>(), bytes) };
            out["async_copies_equal"] = (h == src.as_slice()).into();
            expect(
                h == src.as_slice() && ms >= 0.0,
                "async copies and elapsed time",
            )
        })();
        out["synchronized"] = r.is_ok().into();
        // SAFETY: what was created above (null / 0 where creation failed is skipped).
        unsafe {
            if dev != 0 {
                (c.mem_free)(dev);
            }
            for h in [host, host2].into_iter().filter(|h| !h.is_null()) {
                (c.mem_free_host)(h);
            }
            for e in ev.into_iter().filter(|e| !e.is_null()) {
                (c.event_destroy)(e);
            }
        }
        // SAFETY: the stream created above.
        let d = check("cuStreamDestroy_v2", unsafe { (c.stream_destroy)(stream) });
        r.and(d)
    }

    /// Pinned host memory three ways: `cuMemHostAlloc` (portable), `cuMemAllocHost` and
    /// `cuMemHostRegister` of an ordinary page-aligned buffer; each written and read by the
    /// CPU and copied to the device and back, the bytes checked.
    fn host_alloc(&mut self, bytes: usize, out: &mut Value) -> Result<(), Failure> {
        let c = &self.cuda;
        let mut dev: CuPtr = 0;
        // SAFETY: a pointer to a live local.
        check("cuMemAlloc_v2", unsafe { (c.mem_alloc)(&mut dev, bytes) })?;
        let r = (|| {
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: a pointer to a live local.
            check("cuMemHostAlloc", unsafe {
                (c.mem_host_alloc)(&mut p, bytes, CU_MEMHOSTALLOC_PORTABLE)
            })?;
            out["ptr"] = format!("{:#x}", p as usize).into();
            let ok = cpu_round_trip(p.cast(), bytes) && self.through_device(p, dev, bytes)?;
            out["host_alloc_ok"] = ok.into();
            // SAFETY: the pointer allocated above.
            check("cuMemFreeHost", unsafe { (c.mem_free_host)(p) })?;
            let mut q: *mut c_void = std::ptr::null_mut();
            // SAFETY: a pointer to a live local.
            check("cuMemAllocHost_v2", unsafe {
                (c.mem_alloc_host)(&mut q, bytes)
            })?;
            let ok2 = cpu_round_trip(q.cast(), bytes) && self.through_device(q, dev, bytes)?;
            out["alloc_host_ok"] = ok2.into();
            // SAFETY: the pointer allocated above.
            check("cuMemFreeHost", unsafe { (c.mem_free_host)(q) })?;
            // An ordinary anonymous mapping, registered (CU_MEMHOSTREGISTER_PORTABLE).
            // SAFETY: a fresh private anonymous mapping of `bytes`, unmapped below.
            let m = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if m == libc::MAP_FAILED {
                return expect(false, "mmap for cuMemHostRegister");
            }
            // SAFETY: the mapping above, `bytes` long.
            let reg = check("cuMemHostRegister_v2", unsafe {
                (c.mem_host_register)(m, bytes, 1)
            })
            .and_then(|()| {
                let ok = cpu_round_trip(m.cast(), bytes) && self.through_device(m, dev, bytes)?;
                out["host_register_ok"] = ok.into();
                // SAFETY: the range registered above.
                check("cuMemHostUnregister", unsafe { (c.mem_host_unregister)(m) })?;
                Ok(ok)
            });
            // SAFETY: the mapping above.
            unsafe { libc::munmap(m, bytes) };
            let ok3 = reg?;
            expect(ok && ok2 && ok3, "pinned memory bytes")
        })();
        // SAFETY: the allocation above.
        let f = check("cuMemFree_v2", unsafe { (c.mem_free)(dev) });
        r.and(f)
    }

    /// Copies the `bytes` at CPU address `host` to `dev` and back into it after clearing it;
    /// whether the bytes came back.
    fn through_device(&self, host: *mut c_void, dev: CuPtr, bytes: usize) -> Result<bool, Failure> {
        let c = &self.cuda;
        // SAFETY: the caller's CPU buffer of `bytes`.
        let h = unsafe { std::slice::from_raw_parts_mut(host.cast::<u8>(), bytes) };
        let src = pattern(bytes, 29);
        h.copy_from_slice(&src);
        // SAFETY: `bytes` at host and at dev.
        check("cuMemcpyHtoD_v2", unsafe {
            (c.memcpy_htod)(dev, host, bytes)
        })?;
        h.fill(0);
        // SAFETY: as above.
        check("cuMemcpyDtoH_v2", unsafe {
            (c.memcpy_dtoh)(host, dev, bytes)
        })?;
        Ok(h == src.as_slice())
    }

    /// The device's primary context (`cuDevicePrimaryCtxRetain`) made current beside the
    /// probe's own: an allocation and a copy in it, then released and the own one current again.
    fn primary_ctx(&mut self, out: &mut Value) -> Result<(), Failure> {
        let c = &self.cuda;
        let mut dev: CuDevice = 0;
        // SAFETY: the prototype from cuda.h; a pointer to a live local.
        check("cuDeviceGet", unsafe { (c.device_get)(&mut dev, 0) })?;
        let mut primary: *mut c_void = std::ptr::null_mut();
        // SAFETY: as above.
        check("cuDevicePrimaryCtxRetain", unsafe {
            (c.primary_ctx_retain)(&mut primary, dev)
        })?;
        // SAFETY: the retained context.
        let r = check("cuCtxSetCurrent", unsafe { (c.ctx_set_current)(primary) }).and_then(|()| {
            let mut p: CuPtr = 0;
            // SAFETY: a pointer to a live local.
            check("cuMemAlloc_v2", unsafe { (c.mem_alloc)(&mut p, 4096) })?;
            let mut buf = pattern(4096, 3);
            let ok = self.through_device(buf.as_mut_ptr().cast(), p, 4096);
            // SAFETY: the allocation above.
            let f = check("cuMemFree_v2", unsafe { (c.mem_free)(p) });
            let ok = ok?;
            f?;
            out["primary_copy_ok"] = ok.into();
            expect(ok, "primary context copy")
        });
        // SAFETY: the probe's own context, then the retained primary context.
        let back = check("cuCtxSetCurrent", unsafe { (c.ctx_set_current)(self.ctx) });
        // SAFETY: as above.
        let rel = check("cuDevicePrimaryCtxRelease_v2", unsafe {
            (c.primary_ctx_release)(dev)
        });
        r.and(back).and(rel)
    }

    /// A second process (this binary again: `ctx mem`) with its own context while this one
    /// holds a context and a buffer; both succeed and this buffer keeps its bytes.
    fn second_process(&mut self, lib: &str, out: &mut Value) -> Result<(), Failure> {
        let c = &self.cuda;
        let bytes = 1 << 20;
        let mut p: CuPtr = 0;
        // SAFETY: a pointer to a live local.
        check("cuMemAlloc_v2", unsafe { (c.mem_alloc)(&mut p, bytes) })?;
        let src = pattern(bytes, 41);
        // SAFETY: `bytes` at src and at p.
        let r = check("cuMemcpyHtoD_v2", unsafe {
            (c.memcpy_htod)(p, src.as_ptr().cast(), bytes)
        })
        .and_then(|()| {
            let second = self.run_second(lib, out)?;
            let mut back = vec![0u8; bytes];
            // SAFETY: as above.
            check("cuMemcpyDtoH_v2", unsafe {
                (c.memcpy_dtoh)(back.as_mut_ptr().cast(), p, bytes)
            })?;
            out["own_buffer_kept"] = (back == src).into();
            expect(second && back == src, "second process")
        });
        // SAFETY: the allocation above.
        let f = check("cuMemFree_v2", unsafe { (c.mem_free)(p) });
        r.and(f)
    }

    /// A launch in a context of its own, synchronized (`launch_result`: what it gave), that
    /// context destroyed; then what a new context of this process gives
    /// (`same_process_ctx_result`, and the ioctls it made: none when libcuda answers from its
    /// own state) and a second process's context and copies (`second_ok`). CUDA documents
    /// a launch failure (719) as leaving the process "in an inconsistent state" in which
    /// "any further CUDA work will return the same error" (cuda.h), while the GPU keeps the
    /// fault to the faulting channel: another process gets a working context.
    fn fault_recovery(&mut self, lib: &str, out: &mut Value) -> Result<(), Failure> {
        let c = &self.cuda;
        let mut dev: CuDevice = 0;
        // SAFETY: the prototype from cuda.h; a pointer to a live local.
        check("cuDeviceGet", unsafe { (c.device_get)(&mut dev, 0) })?;
        let mut faulty: *mut c_void = std::ptr::null_mut();
        // SAFETY: pointers to live locals (cuCtxCreate makes the new context current).
        check("cuCtxCreate_v2", unsafe {
            (c.ctx_create)(&mut faulty, 0, dev)
        })?;
        let (result, call) = match self.launch_once() {
            Ok(()) => (CUDA_SUCCESS, "none"),
            Err(f) => (f.result, f.call),
        };
        out["launch_result"] = result.into();
        out["launch_result_name"] = self.cuda.error_name(result).into();
        out["launch_failed_at"] = call.into();
        // SAFETY: the context created above.
        out["faulty_destroy_result"] = unsafe { (c.ctx_destroy)(faulty) }.into();
        let before = NV_IOCTLS.load(Ordering::Relaxed);
        let mut again: *mut c_void = std::ptr::null_mut();
        // SAFETY: as above.
        let r = unsafe { (c.ctx_create)(&mut again, 0, dev) };
        out["same_process_ctx_result"] = r.into();
        out["same_process_ctx_ioctls"] = (NV_IOCTLS.load(Ordering::Relaxed) - before).into();
        if r == CUDA_SUCCESS {
            // SAFETY: the context just created.
            unsafe { (c.ctx_destroy)(again) };
        }
        let second = self.run_second(lib, out)?;
        // A launch that fails must fail with a launch error, not anything else.
        let launch_ok = result == CUDA_SUCCESS || result == CUDA_ERROR_LAUNCH_FAILED;
        expect(second && launch_ok, "a second process after a fault")
    }

    /// Runs this binary again (`ctx mem`, same libcuda) as a second process; whether it
    /// succeeded (its report in `second_ok` / `second_failed`).
    fn run_second(&self, lib: &str, out: &mut Value) -> Result<bool, Failure> {
        let child = std::env::current_exe()
            .and_then(|exe| {
                std::process::Command::new(exe)
                    .args(["--lib", lib, "ctx", "mem"])
                    .stderr(std::process::Stdio::inherit())
                    .output()
            })
            .map_err(|_| Failure {
                call: "spawn the second process",
                result: -1,
            })?;
        let text = String::from_utf8_lossy(&child.stdout);
        let report: Value = text
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null);
        out["second_ok"] = report["ok"].clone();
        if report["ok"] != true {
            out["second_failed"] = report["failed"].clone();
        }
        Ok(child.status.success() && report["ok"] == true)
    }

    /// `cuLaunchKernel` of the PTX kernel (1 block of 1 thread) and `cuCtxSynchronize`: on the
    /// simulated GPU the launch raises the channel error a faulting launch raises (no SMs),
    /// so this step is expected to fail, and says where.
    fn launch(&mut self, out: &mut Value) -> Result<(), Failure> {
        let r = self.launch_once();
        out["launched"] = r
            .as_ref()
            .map_or_else(|f| f.call != "cuLaunchKernel", |()| true)
            .into();
        r
    }

    /// Loads the PTX module, launches its kernel (1 block of 1 thread), `cuCtxSynchronize`,
    /// unloads the module.
    fn launch_once(&self) -> Result<(), Failure> {
        let c = &self.cuda;
        let mut module: *mut c_void = std::ptr::null_mut();
        // SAFETY: PTX is NUL-terminated text.
        check("cuModuleLoadData", unsafe {
            (c.module_load_data)(&mut module, PTX.as_ptr().cast())
        })?;
        let mut func: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live module and a NUL-terminated name.
        let r = check("cuModuleGetFunction", unsafe {
            (c.module_get_function)(&mut func, module, c"nvproxy_probe".as_ptr())
        })
        .and_then(|()| {
            let mut arg: u64 = 0;
            let mut params = [(&raw mut arg).cast::<c_void>()];
            // SAFETY: a live function taking one u64; params points at it; no extra.
            check("cuLaunchKernel", unsafe {
                (c.launch_kernel)(
                    func,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })
        })
        .and_then(|()| {
            // SAFETY: no arguments.
            check("cuCtxSynchronize", unsafe { (c.ctx_synchronize)() })
        });
        // SAFETY: the module loaded above (after a launch failure the context may refuse).
        unsafe { (c.module_unload)(module) };
        r
    }

    /// Launches `nvproxy_vadd` on (a, b, c, n) and waits.
    fn vadd_launch(
        &self,
        func: *mut c_void,
        a: CuPtr,
        b: CuPtr,
        c_out: CuPtr,
    ) -> Result<(), Failure> {
        let c = &self.cuda;
        let (mut pa, mut pb, mut pc, mut n) = (a, b, c_out, VADD_N);
        let mut params = [
            (&raw mut pa).cast::<c_void>(),
            (&raw mut pb).cast::<c_void>(),
            (&raw mut pc).cast::<c_void>(),
            (&raw mut n).cast::<c_void>(),
        ];
        let block = 256;
        // SAFETY: a live function taking (u64, u64, u64, u32); params point at live locals.
        check("cuLaunchKernel", unsafe {
            (c.launch_kernel)(
                func,
                VADD_N.div_ceil(block),
                1,
                1,
                block,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })?;
        // SAFETY: no arguments.
        check("cuCtxSynchronize", unsafe { (c.ctx_synchronize)() })
    }

    /// The vector add on device memory, then on managed memory; every element checked.
    fn vector_add(&mut self, out: &mut Value) -> Result<(), Failure> {
        let n = VADD_N as usize;
        let bytes = n * 4;
        let a: Vec<u32> = (0..VADD_N).collect();
        let b: Vec<u32> = (0..VADD_N)
            .map(|i| i.wrapping_mul(3).wrapping_add(7))
            .collect();
        let want = |i: usize| a[i].wrapping_add(b[i]);
        let mut module: *mut c_void = std::ptr::null_mut();
        // SAFETY: VADD_PTX is NUL-terminated PTX text.
        check("cuModuleLoadData", unsafe {
            (self.cuda.module_load_data)(&mut module, VADD_PTX.as_ptr().cast())
        })?;
        let mut func: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live module and a NUL-terminated name.
        let r = check("cuModuleGetFunction", unsafe {
            (self.cuda.module_get_function)(&mut func, module, c"nvproxy_vadd".as_ptr())
        })
        .and_then(|()| {
            let c = &self.cuda;
            let mut d = [0 as CuPtr; 3];
            for p in &mut d {
                // SAFETY: a pointer to a live local.
                check("cuMemAlloc_v2", unsafe { (c.mem_alloc)(p, bytes) })?;
            }
            let run = (|| {
                // SAFETY: device buffers of `bytes` each; host slices of `bytes`.
                check("cuMemcpyHtoD_v2", unsafe {
                    (c.memcpy_htod)(d[0], a.as_ptr().cast(), bytes)
                })?;
                // SAFETY: as above.
                check("cuMemcpyHtoD_v2", unsafe {
                    (c.memcpy_htod)(d[1], b.as_ptr().cast(), bytes)
                })?;
                self.vadd_launch(func, d[0], d[1], d[2])?;
                let mut back = vec![0u32; n];
                // SAFETY: `back` holds `bytes`; the device buffer too.
                check("cuMemcpyDtoH_v2", unsafe {
                    (c.memcpy_dtoh)(back.as_mut_ptr().cast(), d[2], bytes)
                })?;
                let wrong = (0..n).filter(|&i| back[i] != want(i)).count();
                out["device_wrong"] = wrong.into();
                Ok(wrong == 0)
            })();
            for p in d.into_iter().filter(|&p| p != 0) {
                // SAFETY: the allocations above.
                unsafe { (c.mem_free)(p) };
            }
            let device_ok = run?;
            // Managed: the CPU writes the inputs, the GPU the output, the CPU reads it.
            let mut m = [0 as CuPtr; 3];
            for p in &mut m {
                // SAFETY: a pointer to a live local.
                check("cuMemAllocManaged", unsafe {
                    (c.mem_alloc_managed)(p, bytes, CU_MEM_ATTACH_GLOBAL)
                })?;
            }
            let run = (|| {
                // SAFETY: managed buffers of `bytes` each, CPU-accessible between launches.
                let (ma, mb, mc) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(host_ptr(m[0]).cast::<u32>(), n),
                        std::slice::from_raw_parts_mut(host_ptr(m[1]).cast::<u32>(), n),
                        std::slice::from_raw_parts(host_ptr(m[2]).cast::<u32>().cast_const(), n),
                    )
                };
                ma.copy_from_slice(&a);
                mb.copy_from_slice(&b);
                self.vadd_launch(func, m[0], m[1], m[2])?;
                let wrong = (0..n).filter(|&i| mc[i] != want(i)).count();
                out["managed_wrong"] = wrong.into();
                Ok(wrong == 0)
            })();
            for p in m.into_iter().filter(|&p| p != 0) {
                // SAFETY: the allocations above.
                unsafe { (c.mem_free)(p) };
            }
            let managed_ok = run?;
            out["checked"] = n.into();
            if device_ok && managed_ok {
                Ok(())
            } else {
                Err(Failure {
                    call: "vector add result check",
                    result: -1,
                })
            }
        });
        // SAFETY: the module loaded above.
        unsafe { (self.cuda.module_unload)(module) };
        r
    }

    /// `loops` times cuMemAlloc + cuMemFree of 1 MiB, timed.
    fn alloc_loop(
        &mut self,
        loops: u32,
        stop_file: Option<&str>,
        ready_file: Option<&str>,
        out: &mut Value,
    ) -> Result<(), Failure> {
        let c = &self.cuda;
        let t = Instant::now();
        let mut done = 0u32;
        for i in 0..loops {
            if i % 16 == 0 && stop_file.is_some_and(|f| std::path::Path::new(f).exists()) {
                break;
            }
            done += 1;
            let mut p: CuPtr = 0;
            // SAFETY: a pointer to a live local.
            check("cuMemAlloc_v2", unsafe {
                (c.mem_alloc)(&mut p, PROBE_BYTES)
            })?;
            // SAFETY: the allocation just made.
            check("cuMemFree_v2", unsafe { (c.mem_free)(p) })?;
            if i == 0
                && let Some(f) = ready_file
            {
                std::fs::write(f, b"looping\n").map_err(|_| Failure {
                    call: "writing --ready-file",
                    result: CUDA_SUCCESS,
                })?;
            }
        }
        let us = t.elapsed().as_secs_f64() * 1e6;
        out["loops"] = done.into();
        out["per_iteration_us"] = (us / f64::from(done.max(1))).into();
        Ok(())
    }

    fn managed(&mut self, out: &mut Value) -> Result<(), Failure> {
        let c = &self.cuda;
        let mut p: CuPtr = 0;
        // SAFETY: a pointer to a live local.
        check("cuMemAllocManaged", unsafe {
            (c.mem_alloc_managed)(&mut p, PROBE_BYTES, CU_MEM_ATTACH_GLOBAL)
        })?;
        out["ptr"] = format!("{p:#x}").into();
        out["cpu_round_trip"] = cpu_round_trip(host_ptr(p), PROBE_BYTES).into();
        // SAFETY: the pointer allocated above.
        check("cuMemFree_v2", unsafe { (c.mem_free)(p) })
    }

    fn module_ptx(&mut self, out: &mut Value) -> Result<(), Failure> {
        let c = &self.cuda;
        let mut module: *mut c_void = std::ptr::null_mut();
        // SAFETY: PTX is NUL-terminated text, as cuModuleLoadData wants for PTX images.
        check("cuModuleLoadData", unsafe {
            (c.module_load_data)(&mut module, PTX.as_ptr().cast())
        })?;
        let mut func: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live module and a NUL-terminated name.
        check("cuModuleGetFunction", unsafe {
            (c.module_get_function)(&mut func, module, c"nvproxy_probe".as_ptr())
        })?;
        out["function"] = (!func.is_null()).into();
        // SAFETY: the module loaded above.
        check("cuModuleUnload", unsafe { (c.module_unload)(module) })
    }
}

/// `bytes` bytes of a pattern that differs per `seed` and is no multiple of a power of two.
fn pattern(bytes: usize, seed: usize) -> Vec<u8> {
    (0..bytes)
        .map(|i| u8::try_from((i * seed + seed) % 253).expect("below 253"))
        .collect()
}

/// `Ok` if `ok`, else a failure of the probe's own check `what` (result -1).
fn expect(ok: bool, what: &'static str) -> Result<(), Failure> {
    if ok {
        Ok(())
    } else {
        Err(Failure {
            call: what,
            result: -1,
        })
    }
}

/// Writes a pattern through `p` (`bytes` long) and reads it back.
fn cpu_round_trip(p: *mut u8, bytes: usize) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: the driver API just returned `bytes` of CPU-accessible memory at p.
    let buf = unsafe { std::slice::from_raw_parts_mut(p, bytes) };
    for (i, b) in buf.iter_mut().enumerate() {
        *b = u8::try_from(i % 251).expect("below 251");
    }
    buf.iter()
        .enumerate()
        .all(|(i, &b)| u8::try_from(i % 251) == Ok(b))
}

/// Every step, in the order they run.
const ORDER: [&str; 17] = [
    "init",
    "ctx",
    "primary-ctx",
    "mem",
    "dtod",
    "memset",
    "host-alloc",
    "managed",
    "stream",
    "module-ptx",
    "second-process",
    "alloc-loop",
    // After a launch fault the process's CUDA state is gone (CUDA's contract for 719):
    // the steps that fault run last.
    "fault-recovery",
    "launch",
    "vector-add",
    "mem-quota",
    "hold",
];

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cuda = match Cuda::load(&cli.lib) {
        Ok(c) => c,
        Err(e) => {
            println!("{}", json!({"ok": false, "error": e}));
            return ExitCode::from(1);
        }
    };
    let mut wanted: Vec<&str> = cli.steps.iter().map(String::as_str).collect();
    wanted.push("init");
    if wanted.iter().any(|s| *s != "init") {
        wanted.push("ctx");
    }
    let mut probe = Probe {
        cuda,
        ctx: std::ptr::null_mut(),
        devices: Vec::new(),
    };
    let mut steps = Vec::new();
    let mut failed = Value::Null;
    let mut ok = true;
    for step in ORDER.iter().filter(|s| wanted.contains(s)) {
        let mut out = json!({"step": step});
        let before = NV_IOCTLS.load(Ordering::Relaxed);
        let t = Instant::now();
        let r = match *step {
            "init" => probe.init(&mut out),
            "ctx" => probe.ctx(&mut out),
            "primary-ctx" => probe.primary_ctx(&mut out),
            "mem" => probe.mem(cli.bytes, &mut out),
            "dtod" => probe.dtod(cli.bytes, &mut out),
            "memset" => probe.memset(cli.memset_bytes, &mut out),
            "managed" => probe.managed(&mut out),
            "host-alloc" => probe.host_alloc(cli.bytes, &mut out),
            "stream" => probe.stream(cli.bytes, &mut out),
            "second-process" => probe.second_process(&cli.lib, &mut out),
            "fault-recovery" => probe.fault_recovery(&cli.lib, &mut out),
            "launch" => probe.launch(&mut out),
            "vector-add" => probe.vector_add(&mut out),
            "alloc-loop" => probe.alloc_loop(
                cli.loops,
                cli.stop_file.as_deref(),
                cli.ready_file.as_deref(),
                &mut out,
            ),
            "mem-quota" => probe.mem_quota(cli.bytes, cli.more_bytes, &mut out),
            "hold" => probe.hold(cli.bytes, cli.ready_file.as_deref(), &mut out),
            _ => probe.module_ptx(&mut out),
        };
        out["ms"] = (t.elapsed().as_secs_f64() * 1000.0).into();
        out["ioctls"] = (NV_IOCTLS.load(Ordering::Relaxed) - before).into();
        out["ok"] = r.is_ok().into();
        if let Err(f) = r {
            let name = probe.cuda.error_name(f.result);
            out["call"] = f.call.into();
            out["result"] = f.result.into();
            out["result_name"] = name.clone().into();
            failed = json!({
                "step": step,
                "call": f.call,
                "result": f.result,
                "result_name": name,
                "last_ioctls": last_calls(),
            });
            ok = false;
            steps.push(out);
            break;
        }
        steps.push(out);
    }
    if !probe.ctx.is_null() {
        // SAFETY: the context created by the ctx step.
        let r = unsafe { (probe.cuda.ctx_destroy)(probe.ctx) };
        if r != CUDA_SUCCESS && ok {
            ok = false;
            failed = json!({"step": "ctx", "call": "cuCtxDestroy_v2", "result": r,
                            "result_name": probe.cuda.error_name(r), "last_ioctls": last_calls()});
        }
    }
    let mut mismatches = Vec::new();
    if failed.is_null() {
        let devs = &probe.devices;
        if let Some(n) = cli.expect_count
            && usize::try_from(n) != Ok(devs.len())
        {
            mismatches.push(format!("count {} != {n}", devs.len()));
        }
        if let Some(name) = &cli.expect_name {
            for d in devs.iter().filter(|d| d["name"] != name.as_str()) {
                mismatches.push(format!(
                    "device {} name {} != {name}",
                    d["ordinal"], d["name"]
                ));
            }
        }
        let dev0 = |key: &str, want: &Option<String>, what: &str, mm: &mut Vec<String>| {
            if let Some(w) = want {
                let got = devs
                    .first()
                    .map(|d| d[key].as_str().unwrap_or("").to_owned());
                if !got.as_deref().is_some_and(|g| g.eq_ignore_ascii_case(w)) {
                    mm.push(format!("device 0 {what} {got:?} != {w}"));
                }
            }
        };
        dev0("uuid", &cli.expect_uuid, "uuid", &mut mismatches);
        dev0(
            "pci_bus_id",
            &cli.expect_pci_bus_id,
            "pci bus id",
            &mut mismatches,
        );
    }
    ok &= mismatches.is_empty();
    println!(
        "{}",
        json!({
            "ok": ok,
            "nv_ioctls": NV_IOCTLS.load(Ordering::Relaxed),
            "probed_gpu_ids": PROBED
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .filter(|&v| v != NONE && v != u64::from(u32::MAX))
                .map(|v| format!("{v:#x}"))
                .collect::<Vec<_>>(),
            "steps": steps,
            "failed": failed,
            // Every call kept, on success too, when asked (CUDA_PROBE_ALL_IOCTLS=1).
            "ioctls_seen": if all_calls() { Value::from(last_calls()) } else { Value::Null },
            "mismatches": mismatches,
        })
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
