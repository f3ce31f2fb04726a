//! `cudart-probe`: drives NVIDIA's CUDA runtime (`libcudart.so.12`, e.g. from PyPI's
//! `nvidia-cuda-runtime-cu12`) the way an application does, and says where it stops.
//!
//! `cudart-probe [--lib PATH] [--bytes N] STEP...`
//!
//! The runtime is `dlopen`ed (`libcudart.so.12` from the loader's path, or `--lib`); it loads
//! `libcuda.so.1` itself. No CUDA headers are needed: the few prototypes are declared here, and
//! of `cudaDeviceProp` only the leading fields, whose offsets CUDA 12's `driver_types.h` fixes
//! (`name[256]` at 0, then `cudaUUID_t uuid`, `char luid[8]`, `unsigned luidDeviceNodeMask`,
//! `size_t totalGlobalMem` at 288; `major`/`minor` at 360/364), are read, and cross-checked
//! against `cudaDeviceGetAttribute`. Steps, run in this order whatever the order given:
//!
//! - `init`: `cudaRuntimeGetVersion`, `cudaDriverGetVersion`, `cudaGetDeviceCount`, and per
//!   device `cudaGetDeviceProperties_v2` and the SM-count / compute-capability attributes;
//! - `malloc`: `cudaSetDevice(0)`, `cudaMalloc` of two buffers, `cudaMemGetInfo`,
//!   `cudaMemcpy` host-to-device into both and device-to-host back, every byte checked,
//!   `cudaFree`;
//! - `host`: `cudaMallocHost`, copies through the device from and into it, `cudaFreeHost`;
//! - `stream`: `cudaStreamCreate`, two `cudaEventCreate`, `cudaEventRecord` around
//!   `cudaMemcpyAsync` both ways between pinned buffers, `cudaStreamSynchronize`,
//!   `cudaEventSynchronize`, `cudaEventElapsedTime`, destroyed;
//! - `dtod`: a device-to-device `cudaMemcpy` and `cudaDeviceSynchronize` (libcuda runs it as
//!   a compute kernel: on the simulated GPU, which has no SMs, it fails; see RESULTS.md).
//!
//! Output: one JSON line (`steps`, `failed`); exit status 0 when every step passed.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::process::ExitCode;

use clap::Parser;
use serde_json::{Value, json};
use tests::dl::sym;

#[derive(Parser)]
#[command(name = "cudart-probe", about = "Drives libcudart.so.12 step by step")]
struct Cli {
    /// The runtime to load (default: `libcudart.so.12` from the loader's search path).
    #[arg(long, default_value = "libcudart.so.12")]
    lib: String,
    /// Buffer size of the memory steps.
    #[arg(long, default_value_t = 1 << 20)]
    bytes: usize,
    /// Steps: init, malloc, host, stream, dtod.
    #[arg(required = true, value_parser = ORDER)]
    steps: Vec<String>,
}

/// Every step, in the order they run.
const ORDER: [&str; 5] = ["init", "malloc", "host", "stream", "dtod"];

type CudaError = c_int;
const CUDA_SUCCESS: CudaError = 0;
/// `cudaMemcpyKind`.
const HOST_TO_DEVICE: c_int = 1;
const DEVICE_TO_HOST: c_int = 2;
const DEVICE_TO_DEVICE: c_int = 3;
/// `cudaDeviceAttr`.
const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
const ATTR_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const ATTR_COMPUTE_CAPABILITY_MINOR: c_int = 76;
/// `cudaDeviceProp` fields read (CUDA 12 `driver_types.h`; the struct is 1008 bytes there).
const PROP_TOTAL_GLOBAL_MEM: usize = 288;
const PROP_MAJOR: usize = 360;
const PROP_MINOR: usize = 364;
/// Room for `cudaDeviceProp` of any CUDA 12 runtime.
const PROP_ROOM: usize = 4096;

/// The runtime functions the probe calls.
struct Rt {
    get_error_name: unsafe extern "C" fn(CudaError) -> *const c_char,
    runtime_get_version: unsafe extern "C" fn(*mut c_int) -> CudaError,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> CudaError,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> CudaError,
    get_device_properties: unsafe extern "C" fn(*mut u8, c_int) -> CudaError,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CudaError,
    set_device: unsafe extern "C" fn(c_int) -> CudaError,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> CudaError,
    free: unsafe extern "C" fn(*mut c_void) -> CudaError,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CudaError,
    memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> CudaError,
    memcpy_async:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, *mut c_void) -> CudaError,
    malloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> CudaError,
    free_host: unsafe extern "C" fn(*mut c_void) -> CudaError,
    stream_create: unsafe extern "C" fn(*mut *mut c_void) -> CudaError,
    stream_synchronize: unsafe extern "C" fn(*mut c_void) -> CudaError,
    stream_destroy: unsafe extern "C" fn(*mut c_void) -> CudaError,
    event_create: unsafe extern "C" fn(*mut *mut c_void) -> CudaError,
    event_record: unsafe extern "C" fn(*mut c_void, *mut c_void) -> CudaError,
    event_synchronize: unsafe extern "C" fn(*mut c_void) -> CudaError,
    event_elapsed_time: unsafe extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> CudaError,
    event_destroy: unsafe extern "C" fn(*mut c_void) -> CudaError,
    device_synchronize: unsafe extern "C" fn() -> CudaError,
}

impl Rt {
    fn load(path: &str) -> Result<Rt, String> {
        let lib = tests::dl::open(path)?;
        // SAFETY: each type below is the function's prototype in cuda_runtime_api.h (CUDA
        // 12); cudaGetDeviceProperties_v2 is what the header maps cudaGetDeviceProperties to.
        unsafe {
            Ok(Rt {
                get_error_name: sym(lib, "cudaGetErrorName")?,
                runtime_get_version: sym(lib, "cudaRuntimeGetVersion")?,
                driver_get_version: sym(lib, "cudaDriverGetVersion")?,
                get_device_count: sym(lib, "cudaGetDeviceCount")?,
                get_device_properties: sym(lib, "cudaGetDeviceProperties_v2")?,
                device_get_attribute: sym(lib, "cudaDeviceGetAttribute")?,
                set_device: sym(lib, "cudaSetDevice")?,
                malloc: sym(lib, "cudaMalloc")?,
                free: sym(lib, "cudaFree")?,
                mem_get_info: sym(lib, "cudaMemGetInfo")?,
                memcpy: sym(lib, "cudaMemcpy")?,
                memcpy_async: sym(lib, "cudaMemcpyAsync")?,
                malloc_host: sym(lib, "cudaMallocHost")?,
                free_host: sym(lib, "cudaFreeHost")?,
                stream_create: sym(lib, "cudaStreamCreate")?,
                stream_synchronize: sym(lib, "cudaStreamSynchronize")?,
                stream_destroy: sym(lib, "cudaStreamDestroy")?,
                event_create: sym(lib, "cudaEventCreate")?,
                event_record: sym(lib, "cudaEventRecord")?,
                event_synchronize: sym(lib, "cudaEventSynchronize")?,
                event_elapsed_time: sym(lib, "cudaEventElapsedTime")?,
                event_destroy: sym(lib, "cudaEventDestroy")?,
                device_synchronize: sym(lib, "cudaDeviceSynchronize")?,
            })
        }
    }

    fn error_name(&self, e: CudaError) -> String {
        if e < 0 {
            return "probe check".into();
        }
        // SAFETY: cudaGetErrorName returns a static string for any value.
        let p = unsafe { (self.get_error_name)(e) };
        if p.is_null() {
            return format!("cudaError {e}");
        }
        // SAFETY: a static NUL-terminated string of the runtime.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Where a step stopped: the call and what it returned (-1: the probe's own check).
struct Failure {
    call: &'static str,
    error: CudaError,
}

fn check(call: &'static str, error: CudaError) -> Result<(), Failure> {
    if error == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Failure { call, error })
    }
}

fn expect(ok: bool, what: &'static str) -> Result<(), Failure> {
    if ok {
        Ok(())
    } else {
        Err(Failure {
            call: what,
            error: -1,
        })
    }
}

fn pattern(bytes: usize, seed: usize) -> Vec<u8> {
    (0..bytes)
        .map(|i| u8::try_from((i * seed + seed) % 253).expect("below 253"))
        .collect()
}

fn read_at<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b[at..at + N].try_into().expect("inside the buffer")
}

struct Probe {
    rt: Rt,
    bytes: usize,
}

impl Probe {
    fn init(&self, out: &mut Value) -> Result<(), Failure> {
        let r = &self.rt;
        let (mut runtime, mut driver, mut count) = (0, 0, 0);
        // SAFETY: prototypes from cuda_runtime_api.h; pointers to live locals.
        check("cudaRuntimeGetVersion", unsafe {
            (r.runtime_get_version)(&mut runtime)
        })?;
        // SAFETY: as above.
        check("cudaDriverGetVersion", unsafe {
            (r.driver_get_version)(&mut driver)
        })?;
        out["runtime_version"] = runtime.into();
        out["driver_version"] = driver.into();
        // SAFETY: as above.
        check("cudaGetDeviceCount", unsafe {
            (r.get_device_count)(&mut count)
        })?;
        out["count"] = count.into();
        let mut devices = Vec::new();
        for dev in 0..count {
            let mut prop = vec![0u8; PROP_ROOM];
            // SAFETY: PROP_ROOM bytes, more than any CUDA 12 cudaDeviceProp.
            check("cudaGetDeviceProperties_v2", unsafe {
                (r.get_device_properties)(prop.as_mut_ptr(), dev)
            })?;
            let name = CStr::from_bytes_until_nul(&prop[..256])
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            let attr = |a: c_int| -> Result<c_int, Failure> {
                let mut v = 0;
                // SAFETY: as above.
                check("cudaDeviceGetAttribute", unsafe {
                    (r.device_get_attribute)(&mut v, a, dev)
                })?;
                Ok(v)
            };
            let (sms, major, minor) = (
                attr(ATTR_MULTIPROCESSOR_COUNT)?,
                attr(ATTR_COMPUTE_CAPABILITY_MAJOR)?,
                attr(ATTR_COMPUTE_CAPABILITY_MINOR)?,
            );
            let prop_major = c_int::from_ne_bytes(read_at(&prop, PROP_MAJOR));
            let prop_minor = c_int::from_ne_bytes(read_at(&prop, PROP_MINOR));
            devices.push(json!({
                "name": name,
                "total_global_mem": u64::from_ne_bytes(read_at(&prop, PROP_TOTAL_GLOBAL_MEM)),
                "multiprocessor_count": sms,
                "compute_capability": format!("{major}.{minor}"),
                "properties_agree": prop_major == major && prop_minor == minor,
            }));
            expect(
                prop_major == major && prop_minor == minor,
                "cudaDeviceProp agrees with cudaDeviceGetAttribute",
            )?;
        }
        out["devices"] = devices.into();
        Ok(())
    }

    fn malloc(&self, out: &mut Value) -> Result<(), Failure> {
        let (r, bytes) = (&self.rt, self.bytes);
        // SAFETY: device 0 exists (init ran).
        check("cudaSetDevice", unsafe { (r.set_device)(0) })?;
        let (mut free0, mut total) = (0usize, 0usize);
        // SAFETY: pointers to live locals.
        check("cudaMemGetInfo", unsafe {
            (r.mem_get_info)(&mut free0, &mut total)
        })?;
        let mut d = [std::ptr::null_mut::<c_void>(); 2];
        let res = (|| {
            for p in &mut d {
                // SAFETY: a pointer to a live local.
                check("cudaMalloc", unsafe { (r.malloc)(p, bytes) })?;
            }
            let mut free1 = 0usize;
            // SAFETY: as above.
            check("cudaMemGetInfo", unsafe {
                (r.mem_get_info)(&mut free1, &mut total)
            })?;
            out["mem_total"] = total.into();
            out["free_drop"] = free0.saturating_sub(free1).into();
            let mut ok = true;
            for (i, &p) in d.iter().enumerate() {
                let src = pattern(bytes, 11 + i);
                let mut back = vec![0u8; bytes];
                // SAFETY: `bytes` at the host buffers and at the device buffer.
                check("cudaMemcpy", unsafe {
                    (r.memcpy)(p, src.as_ptr().cast(), bytes, HOST_TO_DEVICE)
                })?;
                // SAFETY: as above.
                check("cudaMemcpy", unsafe {
                    (r.memcpy)(back.as_mut_ptr().cast(), p, bytes, DEVICE_TO_HOST)
                })?;
                ok &= back == src;
            }
            out["copies_equal"] = ok.into();
            expect(ok, "cudaMemcpy bytes")
        })();
        for p in d.into_iter().filter(|p| !p.is_null()) {
            // SAFETY: the allocations above.
            check("cudaFree", unsafe { (r.free)(p) })?;
        }
        res
    }

    fn host(&self, out: &mut Value) -> Result<(), Failure> {
        let (r, bytes) = (&self.rt, self.bytes);
        let (mut h, mut d) = (
            std::ptr::null_mut::<c_void>(),
            std::ptr::null_mut::<c_void>(),
        );
        // SAFETY: pointers to live locals.
        check("cudaMallocHost", unsafe { (r.malloc_host)(&mut h, bytes) })?;
        let res = (|| {
            // SAFETY: as above.
            check("cudaMalloc", unsafe { (r.malloc)(&mut d, bytes) })?;
            // SAFETY: cudaMallocHost returned `bytes` of CPU memory at h.
            let host = unsafe { std::slice::from_raw_parts_mut(h.cast::<u8>(), bytes) };
            let src = pattern(bytes, 19);
            host.copy_from_slice(&src);
            // SAFETY: `bytes` at h and d.
            check("cudaMemcpy", unsafe {
                (r.memcpy)(d, h, bytes, HOST_TO_DEVICE)
            })?;
            host.fill(0);
            // SAFETY: as above.
            check("cudaMemcpy", unsafe {
                (r.memcpy)(h, d, bytes, DEVICE_TO_HOST)
            })?;
            out["pinned_copies_equal"] = (host == src.as_slice()).into();
            expect(host == src.as_slice(), "pinned cudaMemcpy bytes")
        })();
        // SAFETY: the allocations above.
        unsafe {
            if !d.is_null() {
                (r.free)(d);
            }
        }
        // SAFETY: as above.
        check("cudaFreeHost", unsafe { (r.free_host)(h) })?;
        res
    }

    fn stream(&self, out: &mut Value) -> Result<(), Failure> {
        let (r, bytes) = (&self.rt, self.bytes);
        let mut s: *mut c_void = std::ptr::null_mut();
        // SAFETY: a pointer to a live local.
        check("cudaStreamCreate", unsafe { (r.stream_create)(&mut s) })?;
        let mut ev = [std::ptr::null_mut::<c_void>(); 2];
        let mut h = [std::ptr::null_mut::<c_void>(); 2];
        let mut d: *mut c_void = std::ptr::null_mut();
        let res = (|| {
            for e in &mut ev {
                // SAFETY: a pointer to a live local.
                check("cudaEventCreate", unsafe { (r.event_create)(e) })?;
            }
            for p in &mut h {
                // SAFETY: as above.
                check("cudaMallocHost", unsafe { (r.malloc_host)(p, bytes) })?;
            }
            // SAFETY: as above.
            check("cudaMalloc", unsafe { (r.malloc)(&mut d, bytes) })?;
            let src = pattern(bytes, 37);
            // SAFETY: cudaMallocHost returned `bytes` at h[0].
            unsafe { std::slice::from_raw_parts_mut(h[0].cast::<u8>(), bytes) }
                .copy_from_slice(&src);
            // SAFETY: live events and stream; `bytes` at h[0], h[1] and d, untouched until
            // the stream is synchronized.
            unsafe {
                check("cudaEventRecord", (r.event_record)(ev[0], s))?;
                check(
                    "cudaMemcpyAsync",
                    (r.memcpy_async)(d, h[0], bytes, HOST_TO_DEVICE, s),
                )?;
                check(
                    "cudaMemcpyAsync",
                    (r.memcpy_async)(h[1], d, bytes, DEVICE_TO_HOST, s),
                )?;
                check("cudaEventRecord", (r.event_record)(ev[1], s))?;
                check("cudaStreamSynchronize", (r.stream_synchronize)(s))?;
                check("cudaEventSynchronize", (r.event_synchronize)(ev[1]))?;
            }
            let mut ms = -1.0f32;
            // SAFETY: both events recorded and complete.
            check("cudaEventElapsedTime", unsafe {
                (r.event_elapsed_time)(&mut ms, ev[0], ev[1])
            })?;
            out["elapsed_ms"] = f64::from(ms).into();
            // SAFETY: as above; the stream is idle.
            let back = unsafe { std::slice::from_raw_parts(h[1].cast::<u8>(), bytes) };
            out["async_copies_equal"] = (back == src.as_slice()).into();
            expect(
                back == src.as_slice() && ms >= 0.0,
                "async copies and elapsed time",
            )
        })();
        // SAFETY: what was created above.
        unsafe {
            if !d.is_null() {
                (r.free)(d);
            }
            for p in h.into_iter().filter(|p| !p.is_null()) {
                (r.free_host)(p);
            }
            for e in ev.into_iter().filter(|e| !e.is_null()) {
                (r.event_destroy)(e);
            }
        }
        // SAFETY: the stream created above.
        check("cudaStreamDestroy", unsafe { (r.stream_destroy)(s) })?;
        res
    }

    fn dtod(&self, out: &mut Value) -> Result<(), Failure> {
        let (r, bytes) = (&self.rt, self.bytes);
        let mut d = [std::ptr::null_mut::<c_void>(); 2];
        let res = (|| {
            for p in &mut d {
                // SAFETY: a pointer to a live local.
                check("cudaMalloc", unsafe { (r.malloc)(p, bytes) })?;
            }
            let src = pattern(bytes, 43);
            // SAFETY: `bytes` at the host buffer and the device buffers.
            check("cudaMemcpy", unsafe {
                (r.memcpy)(d[0], src.as_ptr().cast(), bytes, HOST_TO_DEVICE)
            })?;
            // SAFETY: as above.
            check("cudaMemcpy", unsafe {
                (r.memcpy)(d[1], d[0], bytes, DEVICE_TO_DEVICE)
            })?;
            // SAFETY: no arguments.
            check("cudaDeviceSynchronize", unsafe { (r.device_synchronize)() })?;
            let mut back = vec![0u8; bytes];
            // SAFETY: as above.
            check("cudaMemcpy", unsafe {
                (r.memcpy)(back.as_mut_ptr().cast(), d[1], bytes, DEVICE_TO_HOST)
            })?;
            out["dtod_equal"] = (back == src).into();
            expect(back == src, "device-to-device bytes")
        })();
        for p in d.into_iter().filter(|p| !p.is_null()) {
            // SAFETY: the allocations above (after a device fault cudaFree may fail too).
            unsafe { (r.free)(p) };
        }
        res
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match Rt::load(&cli.lib) {
        Ok(r) => r,
        Err(e) => {
            println!("{}", json!({"ok": false, "error": e}));
            return ExitCode::from(1);
        }
    };
    let probe = Probe {
        rt,
        bytes: cli.bytes,
    };
    let mut wanted: Vec<&str> = cli.steps.iter().map(String::as_str).collect();
    wanted.push("init");
    let (mut steps, mut failed) = (Vec::new(), Value::Null);
    for step in ORDER.iter().filter(|s| wanted.contains(s)) {
        let mut out = json!({"step": step});
        let t = std::time::Instant::now();
        let r = match *step {
            "init" => probe.init(&mut out),
            "malloc" => probe.malloc(&mut out),
            "host" => probe.host(&mut out),
            "stream" => probe.stream(&mut out),
            _ => probe.dtod(&mut out),
        };
        out["ms"] = (t.elapsed().as_secs_f64() * 1000.0).into();
        out["ok"] = r.is_ok().into();
        if let Err(f) = r {
            let name = probe.rt.error_name(f.error);
            out["call"] = f.call.into();
            out["error"] = f.error.into();
            out["error_name"] = name.clone().into();
            failed = json!({"step": step, "call": f.call, "error": f.error, "error_name": name});
            steps.push(out);
            break;
        }
        steps.push(out);
    }
    let ok = failed.is_null();
    println!("{}", json!({"ok": ok, "steps": steps, "failed": failed}));
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
