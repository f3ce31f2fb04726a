//! A client of NVIDIA's frontend ABI (`/dev/nvidiactl`, `/dev/nvidia<N>`) that speaks raw
//! ioctls, built on the `nvproxy-abi` structs and tables: the CUDA-initialisation sequence of
//! libcuda (gVisor facts, section i) as [`Session`] steps, and the single calls the hostile
//! scenarios of `nvfe-client` need.
//!
//! Every driver answer is checked: an ioctl that fails or a status other than `NV_OK` becomes an
//! [`Error`] naming the call. The only `unsafe` code is in `sys`.

pub mod status;
// The ioctls and mmaps on the nodes.
#[allow(unsafe_code)]
mod sys;

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use nvproxy_abi::{DriverAbi, DriverVersion};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

pub use status::{NV_OK, describe_errno, describe_status};
pub use sys::{inaccessible_address, parked_page, pipe};

/// `NV_MAX_DEVICES`: how many `nv_ioctl_card_info_t` entries libcuda passes to `CARD_INFO`.
pub const CARD_INFO_ENTRIES: usize = 32;
/// PCI vendor id of NVIDIA.
pub const PCI_VENDOR_NVIDIA: u16 = 0x10de;
/// `NV0000_CTRL_GPU_INVALID_ID`.
pub const GPU_INVALID_ID: u32 = 0xffff_ffff;
/// `NV2080_NOTIFIERS_SW`: the notifier index the test event uses.
pub const NV2080_NOTIFIERS_SW: u32 = 0;
/// `RS_SHARE_TYPE_PID`.
pub const RS_SHARE_TYPE_PID: u16 = 4;
/// `NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY` (with `TYPE_SHA1` = 0).
pub const GID_FLAGS_FORMAT_BINARY: u32 = 2;
/// Default `memblock_size` for `NV_ESC_SYS_PARAMS` when sysfs has none (128 MiB, x86_64).
pub const DEFAULT_MEMBLOCK_SIZE: u64 = 0x800_0000;

/// `NV2080_CTRL_GPU_INFO_INDEX_*` the init sequence asks for.
pub const GPU_INFO_INDICES: &[(u32, &str)] = &[
    (0x04, "minor_revision_ext"),
    (0x1f, "sysmem_access"),
    (0x2c, "gpu_sm_version"),
    (0x36, "profiling_capability"),
];
/// `NV2080_CTRL_FB_INFO_INDEX_*` the init sequence asks for (values in KiB, widths in bits).
pub const FB_INFO_INDICES: &[(u32, &str)] = &[
    (0x07, "ram_size_kib"),
    (0x08, "total_ram_size_kib"),
    (0x09, "heap_size_kib"),
    (0x0b, "bus_width"),
];
/// `NV2080_CTRL_GR_INFO_INDEX_*` the init sequence asks for.
pub const GR_INFO_INDICES: &[(u32, &str)] = &[
    (0x0c, "sm_version"),
    (0x0d, "max_warps_per_sm"),
    (0x14, "litter_num_gpcs"),
    (0x17, "litter_num_tpc_per_gpc"),
    (0x13, "max_sp_per_sm"),
    (0x1d, "gpu_core_count"),
    (0x20, "litter_num_sm_per_tpc"),
    (0x07, "shader_pipe_count"),
    (0x09, "shader_pipe_sub_count"),
    (0x08, "thread_stack_scaling_factor"),
];

/// A buffer an embedded pointer of a [`Call`] names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nested {
    /// The buffer holding the pointer: `None` for the top-level params, `Some(i)` for
    /// `nested[i]` (which must come earlier).
    pub parent: Option<usize>,
    /// Byte offset of the 8-byte pointer in its parent.
    pub offset: usize,
    /// The buffer; the device reads and writes it in place.
    pub data: Vec<u8>,
}

/// One ioctl: the command, the top-level params, and the buffers its pointers name. The
/// pointers are written into the params by `sys::ioctl` just before the syscall.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The full ioctl command number.
    pub cmd: u32,
    /// The top-level argument (at least `_IOC_SIZE(cmd)` bytes).
    pub params: Vec<u8>,
    /// Nested buffers, parents before children.
    pub nested: Vec<Nested>,
}

impl Call {
    /// A call without nested buffers.
    pub fn new(cmd: u32, params: Vec<u8>) -> Call {
        Call {
            cmd,
            params,
            nested: Default::default(),
        }
    }

    /// Adds a nested buffer whose address goes at `offset` of `parent`; returns its index.
    pub fn nest(&mut self, parent: Option<usize>, offset: usize, data: Vec<u8>) -> usize {
        self.nested.push(Nested {
            parent,
            offset,
            data,
        });
        self.nested.len() - 1
    }
}

/// What a single driver call came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The ioctl failed with this errno.
    Errno(i32),
    /// The ioctl succeeded and the params carry this NV status.
    Status(u32),
    /// The ioctl succeeded; the escape has no status field.
    Ok,
}

impl Outcome {
    /// Parses an expectation: `E*` names and `errno:N` are errnos, `NV_*` names and numbers
    /// are statuses, `ok` is [`Outcome::Ok`].
    pub fn parse(s: &str) -> Option<Outcome> {
        if s.eq_ignore_ascii_case("ok") {
            return Some(Outcome::Ok);
        }
        if let Some(n) = s.strip_prefix("errno:") {
            return status::parse_errno(n).map(Outcome::Errno);
        }
        if s.starts_with('E') {
            return status::parse_errno(s).map(Outcome::Errno);
        }
        status::parse_status(s).map(Outcome::Status)
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Outcome::Errno(e) => write!(f, "errno {}", describe_errno(e)),
            Outcome::Status(s) => write!(f, "status {}", describe_status(s)),
            Outcome::Ok => write!(f, "success"),
        }
    }
}

/// Why a step failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The ioctl failed.
    Errno {
        /// The call.
        what: String,
        /// Its errno.
        errno: i32,
    },
    /// The driver answered with a status other than `NV_OK`.
    Status {
        /// The call.
        what: String,
        /// The status.
        status: u32,
    },
    /// A check on an answer failed, or something outside the driver did.
    Check(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Errno { what, errno } => {
                write!(f, "{what}: ioctl failed with {}", describe_errno(*errno))
            }
            Error::Status { what, status } => {
                write!(f, "{what}: status {}", describe_status(*status))
            }
            Error::Check(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for Error {}

/// A short list's length or index as a u32 field.
fn len32(n: usize) -> u32 {
    u32::try_from(n).expect("a short list")
}

fn check(cond: bool, msg: impl FnOnce() -> String) -> Result<(), Error> {
    if cond {
        Ok(())
    } else {
        Err(Error::Check(msg()))
    }
}

fn status_ok(what: impl Into<String>, status: u32) -> Result<(), Error> {
    if status == NV_OK {
        Ok(())
    } else {
        Err(Error::Status {
            what: what.into(),
            status,
        })
    }
}

/// Reads a native-endian `u32` at `off`.
pub fn get_u32(buf: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(buf[off..off + 4].try_into().expect("4 bytes"))
}

/// Writes a native-endian `u32` at `off`.
pub fn put_u32(buf: &mut [u8], off: usize, v: u32) {
    buf[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

/// The bytes up to the first NUL, as text.
pub fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Formats a 16-byte GPU UUID the way `nvidia-smi -L` prints it.
pub fn format_uuid(b: &[u8]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    if hex.len() != 32 {
        return format!("GPU-{hex}");
    }
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Opens a device node read-write (close-on-exec, as libcuda does).
pub fn open_node(path: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::Check(format!("open {}: {e}", path.display())))
}

/// Speaks one driver version's frontend ABI and counts the ioctls it issues.
#[derive(Debug, Clone)]
pub struct Frontend {
    abi: DriverAbi,
    version: String,
    ioctls: u64,
}

/// What `NV_ESC_RM_CONTROL` left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlReply {
    /// `NVOS54_PARAMETERS.status`.
    pub status: u32,
    /// The control's params.
    pub params: Vec<u8>,
    /// The buffers the params point to, in the order given.
    pub inner: Vec<Vec<u8>>,
}

/// An RM control's number and `sizeof` its params, from the ABI table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlRef {
    /// The command number.
    pub cmd: u32,
    /// `sizeof` the params.
    pub size: u32,
}

impl Frontend {
    /// The frontend of driver `version` (must be a node of the ABI tree).
    pub fn new(version: &str) -> Result<Frontend, Error> {
        let v: DriverVersion = version
            .parse()
            .map_err(|e| Error::Check(format!("driver version {version:?}: {e}")))?;
        let node = nvproxy_abi::find(&v)
            .map_err(|e| Error::Check(format!("driver version {version}: {e}")))?;
        Ok(Frontend {
            abi: node.tables(),
            version: version.to_string(),
            ioctls: 0,
        })
    }

    /// The version this frontend speaks.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The ABI tables of that version.
    pub fn abi(&self) -> &DriverAbi {
        &self.abi
    }

    /// How many ioctls this frontend issued.
    pub fn ioctls(&self) -> u64 {
        self.ioctls
    }

    /// The control named `name` in this version's table.
    pub fn control(&self, name: &str) -> Result<ControlRef, Error> {
        self.abi
            .control_by_name(name)
            .map(|c| ControlRef {
                cmd: c.cmd,
                size: c.param_size,
            })
            .ok_or_else(|| Error::Check(format!("{name} is not in the {} table", self.version)))
    }

    /// The class number of `name` in this version's table.
    pub fn class(&self, name: &str) -> Result<u32, Error> {
        self.abi
            .class_by_name(name)
            .map(|c| c.class)
            .ok_or_else(|| Error::Check(format!("{name} is not in the {} table", self.version)))
    }

    /// Issues one ioctl (counted). `Err` is the errno.
    pub fn ioctl(&mut self, fd: &impl AsRawFd, call: &mut Call) -> Result<i32, i32> {
        self.ioctl_raw(fd.as_raw_fd(), call)
    }

    /// [`Frontend::ioctl`] on a raw descriptor number.
    pub fn ioctl_raw(&mut self, fd: RawFd, call: &mut Call) -> Result<i32, i32> {
        self.ioctls += 1;
        sys::ioctl(fd, call)
    }

    /// `_IOWR('F', nr, size_of_val(params))` with the params in and out.
    pub fn escape<T: IntoBytes + FromBytes + zerocopy::Immutable>(
        &mut self,
        fd: &impl AsRawFd,
        nr: u8,
        params: &mut T,
    ) -> Result<i32, i32> {
        let mut call = Call::new(nv_iowr(nr, size_of::<T>()), params.as_bytes().to_vec());
        let r = self.ioctl(fd, &mut call);
        *params = T::read_from_bytes(&call.params).expect("same size");
        r
    }

    /// `NV_ESC_CHECK_VERSION_STR` with `cmd` and this frontend's version string; returns the
    /// driver's `reply` (the ioctl fails with EINVAL when the versions differ).
    pub fn check_version(&mut self, ctl: &File, cmd: u32) -> Result<u32, Error> {
        let mut p = nv_ioctl_rm_api_version_t::new_zeroed();
        p.cmd = cmd;
        let v = self.version.as_bytes();
        p.versionString[..v.len()].copy_from_slice(v);
        self.escape(ctl, NV_ESC_CHECK_VERSION_STR, &mut p)
            .map_err(|errno| Error::Errno {
                what: format!("NV_ESC_CHECK_VERSION_STR {:?}", self.version),
                errno,
            })?;
        Ok(p.reply)
    }

    /// `NV_ESC_SYS_PARAMS` with `memblock_size`.
    pub fn sys_params(&mut self, ctl: &File, memblock_size: u64) -> Result<(), Error> {
        let mut p = nv_ioctl_sys_params_t::new_zeroed();
        p.memblock_size = memblock_size;
        self.escape(ctl, NV_ESC_SYS_PARAMS, &mut p)
            .map(drop)
            .map_err(|errno| Error::Errno {
                what: "NV_ESC_SYS_PARAMS".into(),
                errno,
            })
    }

    /// `NV_ESC_CARD_INFO` with `entries` entries; returns them all (valid or not).
    pub fn card_info(
        &mut self,
        ctl: &File,
        entries: usize,
    ) -> Result<Vec<nv_ioctl_card_info_t>, Error> {
        let size = entries * size_of::<nv_ioctl_card_info_t>();
        let mut call = Call::new(nv_iowr(NV_ESC_CARD_INFO, size), vec![0; size]);
        self.ioctl(ctl, &mut call).map_err(|errno| Error::Errno {
            what: "NV_ESC_CARD_INFO".into(),
            errno,
        })?;
        Ok(call
            .params
            .chunks_exact(size_of::<nv_ioctl_card_info_t>())
            .map(|c| nv_ioctl_card_info_t::read_from_bytes(c).expect("72 bytes"))
            .collect())
    }

    /// `NV_ESC_RM_ALLOC` (NVOS64) with `params` as `pAllocParms` (NULL when `None`). Returns the
    /// NVOS64 as the driver left it (`status`, and `hObjectNew` for driver-chosen handles).
    pub fn rm_alloc_raw(
        &mut self,
        ctl: &File,
        h_root: u32,
        h_parent: u32,
        h_new: u32,
        class: u32,
        params: Option<Vec<u8>>,
    ) -> Result<NVOS64_PARAMETERS, i32> {
        let mut p = NVOS64_PARAMETERS::new_zeroed();
        p.hRoot = h_root;
        p.hObjectParent = h_parent;
        p.hObjectNew = h_new;
        p.hClass = class;
        p.paramsSize = params.as_ref().map_or(0, |b| len32(b.len()));
        let mut call = Call::new(NV_ESC_RM_ALLOC_NVOS64, p.as_bytes().to_vec());
        if let Some(data) = params {
            call.nest(None, 16, data); // pAllocParms
        }
        self.ioctl(ctl, &mut call)?;
        Ok(NVOS64_PARAMETERS::read_from_bytes(&call.params).expect("48 bytes"))
    }

    /// [`Frontend::rm_alloc_raw`] that must succeed with `NV_OK`; returns the new handle.
    pub fn rm_alloc(
        &mut self,
        ctl: &File,
        h_root: u32,
        h_parent: u32,
        h_new: u32,
        class: u32,
        params: Option<Vec<u8>>,
    ) -> Result<u32, Error> {
        let what = format!(
            "NV_ESC_RM_ALLOC class {class:#x} (hRoot {h_root:#x}, parent {h_parent:#x}, new {h_new:#x})"
        );
        let p = self
            .rm_alloc_raw(ctl, h_root, h_parent, h_new, class, params)
            .map_err(|errno| Error::Errno {
                what: what.clone(),
                errno,
            })?;
        status_ok(what.clone(), p.status)?;
        check(p.hObjectNew != 0, || format!("{what}: handle 0 returned"))?;
        Ok(p.hObjectNew)
    }

    /// `NV_ESC_RM_FREE`; returns the status.
    pub fn rm_free_raw(
        &mut self,
        ctl: &File,
        h_root: u32,
        h_parent: u32,
        h_object: u32,
    ) -> Result<u32, i32> {
        let mut p = NVOS00_PARAMETERS::new_zeroed();
        p.hRoot = h_root;
        p.hObjectParent = h_parent;
        p.hObjectOld = h_object;
        self.escape(ctl, NV_ESC_RM_FREE, &mut p)?;
        Ok(p.status)
    }

    /// [`Frontend::rm_free_raw`] that must succeed with `NV_OK`.
    pub fn rm_free(
        &mut self,
        ctl: &File,
        h_root: u32,
        h_parent: u32,
        h_object: u32,
    ) -> Result<(), Error> {
        let what = format!("NV_ESC_RM_FREE {h_object:#x} (client {h_root:#x})");
        let status = self
            .rm_free_raw(ctl, h_root, h_parent, h_object)
            .map_err(|errno| Error::Errno {
                what: what.clone(),
                errno,
            })?;
        status_ok(what, status)
    }

    /// `NV_ESC_RM_CONTROL` with `params` (NULL when empty) and, inside them, a pointer at each
    /// `inner.0` offset to the buffer `inner.1`. Returns the NVOS54 status, the params and the
    /// inner buffers as the driver left them.
    pub fn rm_control_raw(
        &mut self,
        ctl: &File,
        h_client: u32,
        h_object: u32,
        cmd: u32,
        params: Vec<u8>,
        inner: Vec<(usize, Vec<u8>)>,
    ) -> Result<ControlReply, i32> {
        let mut p = NVOS54_PARAMETERS::new_zeroed();
        p.hClient = h_client;
        p.hObject = h_object;
        p.cmd = cmd;
        p.paramsSize = len32(params.len());
        let mut call = Call::new(NV_ESC_RM_CONTROL_CMD, p.as_bytes().to_vec());
        let has_params = !params.is_empty();
        if has_params {
            let top = call.nest(None, 16, params); // NVOS54.params
            for (offset, data) in inner {
                call.nest(Some(top), offset, data);
            }
        }
        self.ioctl(ctl, &mut call)?;
        let out = NVOS54_PARAMETERS::read_from_bytes(&call.params).expect("32 bytes");
        let mut nested = call.nested.into_iter().map(|n| n.data);
        let params = if has_params {
            nested.next().expect("params")
        } else {
            Vec::new()
        };
        Ok(ControlReply {
            status: out.status,
            params,
            inner: nested.collect(),
        })
    }

    /// [`Frontend::rm_control_raw`] of the control `name`, which must answer `NV_OK`.
    pub fn rm_control(
        &mut self,
        ctl: &File,
        h_client: u32,
        h_object: u32,
        name: &str,
        params: Vec<u8>,
        inner: Vec<(usize, Vec<u8>)>,
    ) -> Result<(Vec<u8>, Vec<Vec<u8>>), Error> {
        let c = self.control(name)?;
        let what = format!("NV_ESC_RM_CONTROL {name} on {h_object:#x}");
        let r = self
            .rm_control_raw(ctl, h_client, h_object, c.cmd, params, inner)
            .map_err(|errno| Error::Errno {
                what: what.clone(),
                errno,
            })?;
        status_ok(what, r.status)?;
        Ok((r.params, r.inner))
    }

    /// `NV_ESC_REGISTER_FD` on `dev` naming descriptor `ctl_fd`.
    pub fn register_fd(&mut self, dev: &impl AsRawFd, ctl_fd: i32) -> Result<i32, i32> {
        let mut p = nv_ioctl_register_fd_t::new_zeroed();
        p.ctl_fd = ctl_fd;
        self.escape(dev, NV_ESC_REGISTER_FD, &mut p)
    }

    /// `NV_ESC_ALLOC_OS_EVENT` on `file` for descriptor `fd`; returns the `Status` field.
    pub fn alloc_os_event(
        &mut self,
        file: &impl AsRawFd,
        h_client: u32,
        h_device: u32,
        fd: i32,
    ) -> Result<u32, i32> {
        let mut p = nv_ioctl_alloc_os_event_t::new_zeroed();
        p.hClient = h_client;
        p.hDevice = h_device;
        p.fd = fd;
        self.escape(file, NV_ESC_ALLOC_OS_EVENT, &mut p)?;
        Ok(p.Status)
    }

    /// `NV_ESC_FREE_OS_EVENT` on `file` for descriptor `fd`; returns the `Status` field.
    pub fn free_os_event(
        &mut self,
        file: &impl AsRawFd,
        h_client: u32,
        h_device: u32,
        fd: i32,
    ) -> Result<u32, i32> {
        let mut p = nv_ioctl_free_os_event_t::new_zeroed();
        p.hClient = h_client;
        p.hDevice = h_device;
        p.fd = fd;
        self.escape(file, NV_ESC_FREE_OS_EVENT, &mut p)?;
        Ok(p.Status)
    }
}

/// The `memblock_size` libcuda passes to `NV_ESC_SYS_PARAMS`: sysfs's memory block size.
pub fn memblock_size() -> u64 {
    std::fs::read_to_string("/sys/devices/system/memory/block_size_bytes")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim(), 16).ok())
        .unwrap_or(DEFAULT_MEMBLOCK_SIZE)
}

/// One GPU of a [`Session`] and what the controls said about it.
#[derive(Debug)]
pub struct Gpu {
    /// Minor number from `CARD_INFO` (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// RM GPU id.
    pub gpu_id: u32,
    /// PCI device id.
    pub pci_device_id: u16,
    /// `deviceInstance` from `GPU_GET_ID_INFO_V2`.
    pub device_instance: u32,
    /// `subDeviceInstance` from `GPU_GET_ID_INFO_V2`.
    pub subdevice_instance: u32,
    /// The open `/dev/nvidia<minor>` (registered with the session's ctl fd).
    pub dev: Option<File>,
    /// Our `NV01_DEVICE_0` handle (0 until allocated).
    pub h_device: u32,
    /// Our `NV20_SUBDEVICE_0` handle (0 until allocated).
    pub h_subdevice: u32,
    /// What the NV0080/NV2080 queries returned.
    pub info: serde_json::Map<String, serde_json::Value>,
}

/// An OS event: the extra nvidiactl file it lives on and its RM object.
#[derive(Debug)]
pub struct OsEvent {
    /// The nvidiactl file the event was allocated on (its descriptor is the event's `fd`).
    pub file: File,
    /// The GPU (index into [`Session::gpus`]) whose device and subdevice it hangs off.
    pub gpu: usize,
    /// The `NV01_EVENT_OS_EVENT` handle (0 until allocated).
    pub h_event: u32,
}

/// One client's view of the driver: a ctl file, an RM root client, the GPUs it attached.
#[derive(Debug)]
pub struct Session {
    /// The frontend (ABI, version, ioctl count).
    pub fe: Frontend,
    /// `/dev/nvidiactl`.
    pub ctl: File,
    /// Where the device nodes are (`/dev`).
    pub dev_dir: std::path::PathBuf,
    /// The root client handle (0 until allocated).
    pub h_client: u32,
    /// Valid `CARD_INFO` entries.
    pub cards: Vec<nv_ioctl_card_info_t>,
    /// The GPUs (one per valid card, in card order).
    pub gpus: Vec<Gpu>,
    /// Driver version string from `SYSTEM_GET_BUILD_VERSION`.
    pub build_version: String,
    /// The OS event, once allocated.
    pub event: Option<OsEvent>,
}

/// First handle the session picks for its own objects (device, subdevice, event per GPU).
const HANDLE_BASE: u32 = 0xcaf0_0000;

impl Session {
    /// Opens `<dev_dir>/nvidiactl` and checks the version (libcuda's first ioctl).
    pub fn open(version: &str, dev_dir: &Path) -> Result<Session, Error> {
        let mut fe = Frontend::new(version)?;
        let ctl = open_node(&dev_dir.join("nvidiactl"))?;
        let reply = fe.check_version(&ctl, NV_RM_API_VERSION_CMD_STRICT)?;
        check(reply == NV_RM_API_VERSION_REPLY_RECOGNIZED, || {
            format!("NV_ESC_CHECK_VERSION_STR: reply {reply}, want RECOGNIZED (1)")
        })?;
        Ok(Session {
            fe,
            ctl,
            dev_dir: dev_dir.to_path_buf(),
            h_client: 0,
            cards: Vec::new(),
            gpus: Vec::new(),
            build_version: String::new(),
            event: None,
        })
    }

    /// `NV_ESC_SYS_PARAMS`, `NV_ESC_CARD_INFO` (checked), and the root client.
    pub fn probe(&mut self) -> Result<(), Error> {
        self.fe.sys_params(&self.ctl, memblock_size())?;
        let cards = self.fe.card_info(&self.ctl, CARD_INFO_ENTRIES)?;
        self.cards = cards.into_iter().filter(|c| c.valid != 0).collect();
        let mut minors: Vec<u32> = self.cards.iter().map(|c| c.minor_number).collect();
        minors.sort_unstable();
        check(
            minors.iter().copied().eq((0u32..).take(minors.len())),
            || format!("CARD_INFO minors {minors:?}, want 0..{}", minors.len()),
        )?;
        for c in &self.cards {
            let (vendor, device) = (c.pci_info.vendor_id, c.pci_info.device_id);
            check(vendor == PCI_VENDOR_NVIDIA && device != 0, || {
                format!(
                    "CARD_INFO minor {}: PCI id {vendor:04x}:{device:04x}, want 10de:nonzero",
                    c.minor_number
                )
            })?;
            check(c.gpu_id != 0 && c.gpu_id != GPU_INVALID_ID, || {
                format!("CARD_INFO minor {}: gpu_id {:#x}", c.minor_number, c.gpu_id)
            })?;
        }
        self.alloc_root()
    }

    /// RM_ALLOC `NV01_ROOT_CLIENT` with `hObjectNew` 0: the driver picks the handle.
    pub fn alloc_root(&mut self) -> Result<(), Error> {
        let class = self.fe.class("NV01_ROOT_CLIENT")?;
        self.h_client = self.fe.rm_alloc(&self.ctl, 0, 0, 0, class, None)?;
        Ok(())
    }

    fn client_control(
        &mut self,
        name: &str,
        params: Vec<u8>,
        inner: Vec<(usize, Vec<u8>)>,
    ) -> Result<(Vec<u8>, Vec<Vec<u8>>), Error> {
        let h = self.h_client;
        self.fe.rm_control(&self.ctl, h, h, name, params, inner)
    }

    fn sized(&self, name: &str) -> Result<Vec<u8>, Error> {
        Ok(vec![0; self.fe.control(name)?.size as usize])
    }

    /// The first NV0000 controls of a CUDA initialisation: build version, share policy and the
    /// probed ids (checked against `CARD_INFO`).
    pub fn system_controls(&mut self) -> Result<(), Error> {
        // SYSTEM_GET_BUILD_VERSION: first the sizes (NULL buffers), then the strings.
        let bv = "NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION";
        let (p, _) = self.client_control(bv, self.sized(bv)?, vec![])?;
        let size = get_u32(&p, 0);
        check(size > 0 && size <= 256, || {
            format!("{bv}: sizeOfStrings {size}, want 1..=256")
        })?;
        let mut p = self.sized(bv)?;
        put_u32(&mut p, 0, size);
        let bufs = (0..3)
            .map(|i| (8 + 8 * i, vec![0; size as usize]))
            .collect();
        let (_, strings) = self.client_control(bv, p, bufs)?;
        self.build_version = c_string(&strings[0]);
        check(self.build_version == self.fe.version(), || {
            format!(
                "{bv}: driver version {:?}, want {:?}",
                self.build_version,
                self.fe.version()
            )
        })?;

        // CLIENT_SET_INHERITED_SHARE_POLICY: share with our own process only.
        let mut policy = RS_SHARE_POLICY::new_zeroed();
        policy.r#type = RS_SHARE_TYPE_PID;
        policy.accessMask = 1; // RS_ACCESS_DUP_OBJECT
        let sp = "NV0000_CTRL_CMD_CLIENT_SET_INHERITED_SHARE_POLICY";
        self.client_control(sp, policy.as_bytes().to_vec(), vec![])?;

        let probed = self.probed_ids()?;
        let mut sorted = probed.clone();
        sorted.sort_unstable();
        let card_ids = self.card_ids();
        check(sorted == card_ids, || {
            format!("GPU_GET_PROBED_IDS {probed:#x?} differ from CARD_INFO gpu ids {card_ids:#x?}")
        })?;
        Ok(())
    }

    /// The GPU ids of the valid `CARD_INFO` entries, sorted.
    pub fn card_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.cards.iter().map(|c| c.gpu_id).collect();
        ids.sort_unstable();
        ids
    }

    /// Opens `/dev/nvidia<minor>` of every card and registers the ctl fd on it (on Linux the
    /// driver attaches a GPU when its node is opened).
    pub fn open_gpus(&mut self) -> Result<(), Error> {
        let cards = self.cards.clone();
        for c in cards {
            self.gpus.push(Gpu {
                minor: c.minor_number,
                gpu_id: c.gpu_id,
                pci_device_id: c.pci_info.device_id,
                device_instance: 0,
                subdevice_instance: 0,
                dev: None,
                h_device: 0,
                h_subdevice: 0,
                info: serde_json::Map::new(),
            });
            self.open_gpu(self.gpus.len() - 1)?;
        }
        Ok(())
    }

    /// `GPU_ATTACH_IDS` of every GPU, `GPU_GET_ATTACHED_IDS` (must list exactly them) and
    /// `GPU_GET_ID_INFO_V2` of each (device and subdevice instances).
    pub fn attach(&mut self) -> Result<(), Error> {
        let ids: Vec<u32> = self.gpus.iter().map(|g| g.gpu_id).collect();
        let status = self.attach_ids(&ids)?;
        status_ok("NV_ESC_RM_CONTROL NV0000_CTRL_CMD_GPU_ATTACH_IDS", status)?;

        let ga = "NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS";
        let (p, _) = self.client_control(ga, self.sized(ga)?, vec![])?;
        let mut attached = id_list(&p);
        attached.sort_unstable();
        let card_ids = self.card_ids();
        check(attached == card_ids, || {
            format!("GPU_GET_ATTACHED_IDS {attached:#x?}, want {card_ids:#x?}")
        })?;

        for i in 0..self.gpus.len() {
            let info = self.id_info(self.gpus[i].gpu_id)?;
            self.gpus[i].device_instance = info.deviceInstance;
            self.gpus[i].subdevice_instance = info.subDeviceInstance;
        }
        let mut instances: Vec<u32> = self.gpus.iter().map(|g| g.device_instance).collect();
        instances.sort_unstable();
        instances.dedup();
        check(instances.len() == self.gpus.len(), || {
            format!("GPU_GET_ID_INFO_V2: device instances {instances:?} not distinct")
        })?;
        Ok(())
    }

    /// `GPU_GET_PROBED_IDS`: the valid ids.
    pub fn probed_ids(&mut self) -> Result<Vec<u32>, Error> {
        let name = "NV0000_CTRL_CMD_GPU_GET_PROBED_IDS";
        let (p, _) = self.client_control(name, self.sized(name)?, vec![])?;
        Ok(id_list(&p[..128]))
    }

    /// `GPU_ATTACH_IDS` of `ids`; returns the status.
    pub fn attach_ids(&mut self, ids: &[u32]) -> Result<u32, Error> {
        let c = self.fe.control("NV0000_CTRL_CMD_GPU_ATTACH_IDS")?;
        let mut p = vec![0xff; c.size as usize];
        for (i, id) in ids.iter().enumerate() {
            put_u32(&mut p, 4 * i, *id);
        }
        let h = self.h_client;
        let status = self
            .fe
            .rm_control_raw(&self.ctl, h, h, c.cmd, p, vec![])
            .map(|r| r.status)
            .map_err(|errno| Error::Errno {
                what: "NV_ESC_RM_CONTROL NV0000_CTRL_CMD_GPU_ATTACH_IDS".into(),
                errno,
            })?;
        Ok(status)
    }

    /// `GPU_GET_ID_INFO_V2` of `gpu_id` (must succeed).
    pub fn id_info(&mut self, gpu_id: u32) -> Result<NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, Error> {
        let (status, info) = self.id_info_raw(gpu_id)?;
        status_ok(
            format!("NV_ESC_RM_CONTROL NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2 {gpu_id:#x}"),
            status,
        )?;
        Ok(info)
    }

    /// `GPU_GET_ID_INFO_V2` of `gpu_id`: the status and the params.
    pub fn id_info_raw(
        &mut self,
        gpu_id: u32,
    ) -> Result<(u32, NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS), Error> {
        let c = self.fe.control("NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2")?;
        let mut p = NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS::new_zeroed();
        p.gpuId = gpu_id;
        let h = self.h_client;
        let r = self
            .fe
            .rm_control_raw(&self.ctl, h, h, c.cmd, p.as_bytes().to_vec(), vec![])
            .map_err(|errno| Error::Errno {
                what: "NV_ESC_RM_CONTROL NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2".into(),
                errno,
            })?;
        let info =
            NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS::read_from_bytes(&r.params).expect("32 bytes");
        Ok((r.status, info))
    }

    /// Opens `/dev/nvidia<minor>` of GPU `i` and registers the ctl fd on it.
    pub fn open_gpu(&mut self, i: usize) -> Result<(), Error> {
        let path = self.dev_dir.join(format!("nvidia{}", self.gpus[i].minor));
        let dev = open_node(&path)?;
        let ctl_fd = self.ctl.as_raw_fd();
        self.fe
            .register_fd(&dev, ctl_fd)
            .map_err(|errno| Error::Errno {
                what: format!("NV_ESC_REGISTER_FD on {}", path.display()),
                errno,
            })?;
        self.gpus[i].dev = Some(dev);
        Ok(())
    }

    /// RM_ALLOC `NV01_DEVICE_0` (deviceId from the id info) and `NV20_SUBDEVICE_0` for GPU `i`.
    pub fn alloc_device(&mut self, i: usize) -> Result<(), Error> {
        let dev_class = self.fe.class("NV01_DEVICE_0")?;
        let sub_class = self.fe.class("NV20_SUBDEVICE_0")?;
        let h_device = HANDLE_BASE + 0x100 * (len32(i) + 1);
        let mut dp = NV0080_ALLOC_PARAMETERS::new_zeroed();
        dp.deviceId = self.gpus[i].device_instance;
        dp.hClientShare = self.h_client;
        let h = self.h_client;
        self.fe.rm_alloc(
            &self.ctl,
            h,
            h,
            h_device,
            dev_class,
            Some(dp.as_bytes().to_vec()),
        )?;
        self.gpus[i].h_device = h_device;
        let mut sp = NV2080_ALLOC_PARAMETERS::new_zeroed();
        sp.subDeviceId = self.gpus[i].subdevice_instance;
        let h_sub = h_device + 1;
        self.fe.rm_alloc(
            &self.ctl,
            h,
            h_device,
            h_sub,
            sub_class,
            Some(sp.as_bytes().to_vec()),
        )?;
        self.gpus[i].h_subdevice = h_sub;
        Ok(())
    }

    /// The NV0080 and NV2080 queries of GPU `i`: class lists, GPU info, name, UUID, FB and GR
    /// info. Fills `gpus[i].info`.
    pub fn gpu_queries(&mut self, i: usize) -> Result<(), Error> {
        let (h, hd, hs) = (
            self.h_client,
            self.gpus[i].h_device,
            self.gpus[i].h_subdevice,
        );
        let mut info = serde_json::Map::new();

        // NV0080 GPU_GET_CLASSLIST: the count (NULL list), then the list.
        let cl = "NV0080_CTRL_CMD_GPU_GET_CLASSLIST";
        let (p, _) = self
            .fe
            .rm_control(&self.ctl, h, hd, cl, vec![0; 16], vec![])?;
        let n = get_u32(&p, 0);
        check(n > 0 && n <= 1024, || format!("{cl}: numClasses {n}"))?;
        let mut p = vec![0; 16];
        put_u32(&mut p, 0, n);
        let (_, lists) =
            self.fe
                .rm_control(&self.ctl, h, hd, cl, p, vec![(8, vec![0; 4 * n as usize])])?;
        let classes: Vec<u32> = lists[0].chunks_exact(4).map(|c| get_u32(c, 0)).collect();

        // NV0080 GPU_GET_CLASSLIST_V2: the same list inline.
        let cl2 = "NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2";
        let (p, _) = self
            .fe
            .rm_control(&self.ctl, h, hd, cl2, self.sized(cl2)?, vec![])?;
        let n2 = get_u32(&p, 0) as usize;
        let classes2: Vec<u32> = (0..n2.min(160)).map(|k| get_u32(&p, 4 + 4 * k)).collect();
        check(classes2 == classes, || {
            format!("{cl2} {classes2:#x?} differs from {cl} {classes:#x?}")
        })?;
        info.insert("classes".into(), classes.len().into());

        // NV2080 GPU_GET_INFO_V2.
        let gi = "NV2080_CTRL_CMD_GPU_GET_INFO_V2";
        let mut p = self.sized(gi)?;
        put_u32(&mut p, 0, len32(GPU_INFO_INDICES.len()));
        for (k, (index, _)) in GPU_INFO_INDICES.iter().enumerate() {
            put_u32(&mut p, 4 + 8 * k, *index);
        }
        let (p, _) = self.fe.rm_control(&self.ctl, h, hs, gi, p, vec![])?;
        for (k, (_, key)) in GPU_INFO_INDICES.iter().enumerate() {
            info.insert((*key).into(), get_u32(&p, 8 + 8 * k).into());
        }

        // NV2080 GPU_GET_NAME_STRING (ASCII).
        let ns = "NV2080_CTRL_CMD_GPU_GET_NAME_STRING";
        let (p, _) = self
            .fe
            .rm_control(&self.ctl, h, hs, ns, self.sized(ns)?, vec![])?;
        let name = c_string(&p[4..]);
        check(!name.is_empty(), || format!("{ns}: empty name"))?;
        info.insert("name".into(), name.into());

        // NV2080 GPU_GET_GID_INFO (binary SHA-1 UUID, 16 bytes).
        let gid = "NV2080_CTRL_CMD_GPU_GET_GID_INFO";
        let mut p = self.sized(gid)?;
        put_u32(&mut p, 4, GID_FLAGS_FORMAT_BINARY);
        let (p, _) = self.fe.rm_control(&self.ctl, h, hs, gid, p, vec![])?;
        let len = get_u32(&p, 8) as usize;
        check(len == 16, || format!("{gid}: length {len}, want 16"))?;
        let uuid = &p[12..12 + len];
        check(uuid.iter().any(|&b| b != 0), || format!("{gid}: zero UUID"))?;
        info.insert("uuid".into(), format_uuid(uuid).into());

        // NV2080 FB_GET_INFO_V2.
        let fb = "NV2080_CTRL_CMD_FB_GET_INFO_V2";
        let mut p = self.sized(fb)?;
        put_u32(&mut p, 0, len32(FB_INFO_INDICES.len()));
        for (k, (index, _)) in FB_INFO_INDICES.iter().enumerate() {
            put_u32(&mut p, 4 + 8 * k, *index);
        }
        let (p, _) = self.fe.rm_control(&self.ctl, h, hs, fb, p, vec![])?;
        for (k, (_, key)) in FB_INFO_INDICES.iter().enumerate() {
            info.insert((*key).into(), get_u32(&p, 8 + 8 * k).into());
        }
        let total_kib = get_u32(&p, 8 + 8);
        check(total_kib > 0, || format!("{fb}: total RAM 0"))?;
        info.insert("memory_mib".into(), (total_kib / 1024).into());

        // NV2080 GR_GET_INFO (pointer list).
        let gr = "NV2080_CTRL_CMD_GR_GET_INFO";
        let mut list = vec![0; 8 * GR_INFO_INDICES.len()];
        for (k, (index, _)) in GR_INFO_INDICES.iter().enumerate() {
            put_u32(&mut list, 8 * k, *index);
        }
        let mut p = self.sized(gr)?;
        put_u32(&mut p, 0, len32(GR_INFO_INDICES.len()));
        let (_, lists) = self
            .fe
            .rm_control(&self.ctl, h, hs, gr, p, vec![(8, list)])?;
        let mut gr_info = std::collections::BTreeMap::new();
        for (k, (_, key)) in GR_INFO_INDICES.iter().enumerate() {
            let v = get_u32(&lists[0], 8 * k + 4);
            gr_info.insert(*key, v);
            info.insert((*key).into(), v.into());
        }
        // Enabled TPCs (SHADER_PIPE_SUB_COUNT) times SMs per TPC; THREAD_STACK_SCALING_FACTOR
        // is the SM count too (a real GA106 answers 14 TPCs, 2 per TPC, 28).
        let sms = gr_info["shader_pipe_sub_count"] * gr_info["litter_num_sm_per_tpc"];
        check(sms > 0, || format!("{gr}: SM count 0 ({gr_info:?})"))?;
        check(sms == gr_info["thread_stack_scaling_factor"], || {
            format!("{gr}: {sms} SMs from the TPCs, not THREAD_STACK_SCALING_FACTOR ({gr_info:?})")
        })?;
        info.insert("sm_count".into(), sms.into());

        self.gpus[i].info = info;
        Ok(())
    }

    /// Opens a second nvidiactl, `NV_ESC_ALLOC_OS_EVENT` on it for its own descriptor, and
    /// RM_ALLOC `NV01_EVENT_OS_EVENT` under GPU `i`'s subdevice naming that descriptor.
    pub fn alloc_event(&mut self, i: usize) -> Result<(), Error> {
        let file = open_node(&self.dev_dir.join("nvidiactl"))?;
        let fd = file.as_raw_fd();
        let (h, hd, hs) = (
            self.h_client,
            self.gpus[i].h_device,
            self.gpus[i].h_subdevice,
        );
        let what = "NV_ESC_ALLOC_OS_EVENT";
        let status = self
            .fe
            .alloc_os_event(&file, h, hd, fd)
            .map_err(|errno| Error::Errno {
                what: what.into(),
                errno,
            })?;
        status_ok(what, status)?;
        self.event = Some(OsEvent {
            file,
            gpu: i,
            h_event: 0,
        });
        let class = self.fe.class("NV01_EVENT_OS_EVENT")?;
        let mut p = NV0005_ALLOC_PARAMETERS::new_zeroed();
        p.hParentClient = h;
        p.hSrcResource = hs;
        p.hClass = class;
        p.notifyIndex = NV2080_NOTIFIERS_SW;
        p.data = u64::try_from(fd).expect("an open fd");
        let h_event = hs + 1;
        self.fe.rm_alloc(
            &self.ctl,
            h,
            hs,
            h_event,
            class,
            Some(p.as_bytes().to_vec()),
        )?;
        if let Some(e) = self.event.as_mut() {
            e.h_event = h_event;
        }
        Ok(())
    }

    /// Frees everything in reverse order (event object, subdevices, devices), then
    /// `NV_ESC_FREE_OS_EVENT`, then the root client; closes the files.
    pub fn teardown(&mut self) -> Result<(), Error> {
        let h = self.h_client;
        if let Some(e) = &self.event
            && e.h_event != 0
        {
            let hs = self.gpus[e.gpu].h_subdevice;
            self.fe.rm_free(&self.ctl, h, hs, e.h_event)?;
        }
        for i in (0..self.gpus.len()).rev() {
            let (hd, hs) = (self.gpus[i].h_device, self.gpus[i].h_subdevice);
            if hs != 0 {
                self.fe.rm_free(&self.ctl, h, hd, hs)?;
                self.gpus[i].h_subdevice = 0;
            }
            if hd != 0 {
                self.fe.rm_free(&self.ctl, h, h, hd)?;
                self.gpus[i].h_device = 0;
            }
        }
        if let Some(e) = self.event.take() {
            let hd = self.gpus[e.gpu].h_device;
            let what = "NV_ESC_FREE_OS_EVENT";
            let status = self
                .fe
                .free_os_event(&e.file, h, hd, e.file.as_raw_fd())
                .map_err(|errno| Error::Errno {
                    what: what.into(),
                    errno,
                })?;
            status_ok(what, status)?;
        }
        if h != 0 {
            self.fe.rm_free(&self.ctl, h, 0, h)?;
            self.h_client = 0;
        }
        for g in &mut self.gpus {
            g.dev = None;
        }
        Ok(())
    }

    /// The whole CUDA-initialisation sequence up to (not including) the teardown.
    pub fn init_all(&mut self) -> Result<(), Error> {
        self.probe()?;
        self.system_controls()?;
        self.open_gpus()?;
        self.attach()?;
        for i in 0..self.gpus.len() {
            self.alloc_device(i)?;
            self.gpu_queries(i)?;
        }
        if !self.gpus.is_empty() {
            self.alloc_event(0)?;
        }
        Ok(())
    }

    /// The JSON summary of what the session saw.
    pub fn summary(&self) -> serde_json::Value {
        let gpus: Vec<serde_json::Value> = self
            .gpus
            .iter()
            .map(|g| {
                let mut m = g.info.clone();
                m.insert("minor".into(), g.minor.into());
                m.insert("gpu_id".into(), format!("{:#x}", g.gpu_id).into());
                m.insert(
                    "pci_device_id".into(),
                    format!("{:#06x}", g.pci_device_id).into(),
                );
                m.insert("device_instance".into(), g.device_instance.into());
                serde_json::Value::Object(m)
            })
            .collect();
        let first = self.gpus.first();
        let field = |k: &str| first.and_then(|g| g.info.get(k).cloned());
        serde_json::json!({
            "driver_version": self.fe.version(),
            "build_version": self.build_version,
            "gpus": self.gpus.len(),
            "name": field("name"),
            "uuid": field("uuid"),
            "memory_mib": field("memory_mib"),
            "sm_count": field("sm_count"),
            "gpu_list": gpus,
            "ioctls": self.fe.ioctls(),
        })
    }
}

/// The valid ids of a `gpuIds[32]` list (up to the first `INVALID_ID`).
pub fn id_list(p: &[u8]) -> Vec<u32> {
    p[..128]
        .chunks_exact(4)
        .map(|c| get_u32(c, 0))
        .take_while(|&id| id != GPU_INVALID_ID)
        .filter(|&id| id != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_outcome_parse_errno_name() {
        assert_eq!(Outcome::parse("EBADF"), Some(Outcome::Errno(libc::EBADF)));
    }

    #[test]
    fn test_outcome_parse_status_name() {
        assert_eq!(
            Outcome::parse("NV_ERR_INVALID_ADDRESS"),
            Some(Outcome::Status(0x1e))
        );
    }

    #[test]
    fn test_outcome_parse_ok() {
        assert_eq!(Outcome::parse("ok"), Some(Outcome::Ok));
    }

    #[test]
    fn test_format_uuid_matches_nvidia_smi_layout() {
        let b: Vec<u8> = (0..16).collect();
        assert_eq!(format_uuid(&b), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
    }

    #[test]
    fn test_id_list_stops_at_invalid_id() {
        let mut p = vec![0xff; 128];
        put_u32(&mut p, 0, 0x100);
        put_u32(&mut p, 4, 0x200);
        assert_eq!(id_list(&p), vec![0x100, 0x200]);
    }

    #[test]
    fn test_frontend_knows_init_controls_for_default_version() {
        let fe = Frontend::new("535.261.03").unwrap();
        let names = [
            "NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION",
            "NV0000_CTRL_CMD_CLIENT_SET_INHERITED_SHARE_POLICY",
            "NV0000_CTRL_CMD_GPU_GET_PROBED_IDS",
            "NV0000_CTRL_CMD_GPU_ATTACH_IDS",
            "NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS",
            "NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2",
            "NV0080_CTRL_CMD_GPU_GET_CLASSLIST",
            "NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2",
            "NV2080_CTRL_CMD_GPU_GET_INFO_V2",
            "NV2080_CTRL_CMD_GPU_GET_NAME_STRING",
            "NV2080_CTRL_CMD_GPU_GET_GID_INFO",
            "NV2080_CTRL_CMD_FB_GET_INFO_V2",
            "NV2080_CTRL_CMD_GR_GET_INFO",
        ];
        let missing: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| fe.control(n).is_err())
            .collect();
        assert_eq!(missing, Vec::<&str>::new());
    }

    #[test]
    fn test_call_nest_returns_indices_in_order() {
        let mut call = Call::new(0, vec![0; 32]);
        let a = call.nest(None, 16, vec![0; 8]);
        let b = call.nest(Some(a), 0, vec![0; 4]);
        assert_eq!((a, b), (0, 1));
    }
}
