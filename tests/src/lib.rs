//! Helpers shared by the integration and VM test suites.

#![deny(unsafe_code)]

// mmap and the shim's raw calls on the nodes.
pub mod harness;
#[allow(unsafe_code)]
pub mod mmapc;
pub mod nvfe;

/// The ioctl interface of the `cuse-example` device (`src/bin/cuse-example.rs`), shared with
/// the real-kernel tests (`tests/cuse_kernel.rs`).
pub mod cuse_example {
    /// `_IOC(dir, 'E', nr, size)`.
    pub const fn ioc(dir: u32, nr: u8, size: u32) -> u32 {
        (dir << 30) | (size << 16) | ((b'E' as u32) << 8) | nr as u32
    }
    /// `_IOC_WRITE`: the caller passes data in.
    pub const IOC_WRITE: u32 = 1;
    /// `_IOC_READ`: the caller gets data out.
    pub const IOC_READ: u32 = 2;

    /// `_IOR('E', 1, int)`: read the register.
    pub const EX_GET: u32 = ioc(IOC_READ, 1, 4);
    /// `_IOW('E', 2, int)`: set the register.
    pub const EX_SET: u32 = ioc(IOC_WRITE, 2, 4);
    /// `_IOWR('E', 3, int)`: `*arg += 1` (unrestricted: one retry round).
    pub const EX_INCR: u32 = ioc(IOC_READ | IOC_WRITE, 3, 4);
    /// `_IO('E', 4)`: `arg` points to an [`Xform`]; upper-cases `len` bytes from `in_ptr` into
    /// `out_ptr` and returns `len` (unrestricted only: two retry rounds).
    pub const EX_XFORM: u32 = ioc(0, 4, 0);
    /// `_IO('E', 5)`: `arg` points to a `u64` that points to an [`Xform`]; reverses the bytes
    /// into `out_ptr` and returns `len` (unrestricted only: three retry rounds).
    pub const EX_NESTED: u32 = ioc(0, 5, 0);
    /// `_IO('E', 6)`: blocks `arg` milliseconds or until interrupted (then `EINTR`); returns 0.
    pub const EX_SLEEP: u32 = ioc(0, 6, 0);
    /// `_IO('E', 7)`: returns the open file's `fh`.
    pub const EX_GETFH: u32 = ioc(0, 7, 0);
    /// `_IO('E', 8)`: returns the caller's thread id as the server saw it.
    pub const EX_PID: u32 = ioc(0, 8, 0);
    /// `_IO('E', 9)`: returns 1 if `arg` is the server's secret, else `EPERM` (self-check).
    pub const EX_SECRET: u32 = ioc(0, 9, 0);

    /// `_IO('E', 10)`: the handler opens the device's own node, sends [`EX_GETFH`] on it and
    /// closes it (the last reference, so the kernel sends RELEASE and waits for the reply), all
    /// while this request waits; returns the nested open's fh. Proves the reader is free.
    pub const EX_SELF: u32 = ioc(0, 10, 0);

    /// Longest buffer [`EX_XFORM`]/[`EX_NESTED`] accept.
    pub const XFORM_MAX: u32 = 64 * 1024;

    /// The argument of [`EX_XFORM`] (24 bytes, native endian).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Xform {
        /// Address of the input bytes.
        pub in_ptr: u64,
        /// Address of the output buffer (`len` bytes).
        pub out_ptr: u64,
        /// Number of bytes.
        pub len: u32,
        /// Zero.
        pub pad: u32,
    }

    /// Size of [`Xform`] on the wire.
    pub const XFORM_SIZE: usize = 24;

    impl Xform {
        /// Decodes the first 24 bytes.
        pub fn from_bytes(b: &[u8]) -> Option<Self> {
            let b = b.get(..XFORM_SIZE)?;
            let u64_at = |i: usize| {
                b.get(i..i + 8)
                    .and_then(|s| s.try_into().ok())
                    .map(u64::from_ne_bytes)
            };
            let u32_at = |i: usize| {
                b.get(i..i + 4)
                    .and_then(|s| s.try_into().ok())
                    .map(u32::from_ne_bytes)
            };
            Some(Xform {
                in_ptr: u64_at(0)?,
                out_ptr: u64_at(8)?,
                len: u32_at(16)?,
                pad: u32_at(20)?,
            })
        }
    }

    /// Splits a `dev_t` into (major, minor) as glibc's `major()`/`minor()` do.
    pub fn major_minor(dev: u64) -> (u32, u32) {
        let major = ((dev >> 32) & 0xffff_f000) as u32 | ((dev >> 8) & 0xfff) as u32;
        let minor = ((dev >> 12) & 0xffff_ff00) as u32 | (dev & 0xff) as u32;
        (major, minor)
    }
}

/// `dlopen` and `dlsym` for the probes that drive NVIDIA's libraries (`cuda-probe`,
/// `cudart-probe`).
#[allow(unsafe_code)]
pub mod dl {
    use std::ffi::{CStr, CString, c_void};

    /// `dlopen(path, RTLD_NOW | RTLD_GLOBAL)`; the library's constructors run.
    pub fn open(path: &str) -> Result<*mut c_void, String> {
        let c = CString::new(path).map_err(|_| "NUL in the library path".to_owned())?;
        // SAFETY: dlopen of a NUL-terminated path; running its constructors is what is asked.
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if !lib.is_null() {
            return Ok(lib);
        }
        // SAFETY: dlerror returns a thread-local C string or NULL.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            "unknown error".to_owned()
        } else {
            // SAFETY: non-NULL dlerror strings are NUL-terminated.
            unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        Err(format!("dlopen {path}: {msg}"))
    }

    /// Loads symbol `name` of `lib` as `T` (a function pointer type).
    ///
    /// # Safety
    /// `lib` is a live `dlopen` handle and `T` the symbol's real function type.
    pub unsafe fn sym<T: Copy>(lib: *mut c_void, name: &str) -> Result<T, String> {
        assert_eq!(size_of::<T>(), size_of::<*mut c_void>());
        let c = CString::new(name).expect("no NUL in symbol names");
        // SAFETY: lib is a live dlopen handle (the caller's promise), c a NUL-terminated name.
        let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
        if p.is_null() {
            return Err(format!("{name} not found"));
        }
        // SAFETY: T is a function pointer type of the same size; the caller vouches for it.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }
}
