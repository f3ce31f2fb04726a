//! `nvproxy cdi generate`: a CDI (Container Device Interface) spec with one device per served
//! instance, and `nvproxy cdi-hook` (hidden): the OCI `createContainer` hooks that spec names.
//!
//! A device `<vendor>/<class>=<instance>` (default `nvproxy.dev/gpu=job42`) gives the container:
//! - the instance's CUSE nodes at the paths NVIDIA's userspace opens (`/dev/nvidiactl`,
//!   `/dev/nvidia0..`, `/dev/nvidia-uvm`), `hostPath` our node, type/major/minor from `stat` of
//!   the live node (so the runtime's device cgroup allows exactly those numbers);
//! - the mmap shim, bind-mounted read-only at [`SHIM_IN_CONTAINER`] and preloaded with
//!   `LD_PRELOAD` (not `/etc/ld.so.preload`: docs/containers.md), `NVPROXY_NODES` = the nodes'
//!   numbers, and the instance's mmap socket at `/run/nvproxy/mmap.sock`;
//! - `createContainer` hooks (`nvproxy cdi-hook`, run by the runtime in the container's mount
//!   namespace before `pivot_root`): `/proc/driver/nvidia/params` with `ModifyDeviceFiles: 0`
//!   (NVIDIA's `disable-device-node-modification`), `/dev/char/195:*` links to our nodes and
//!   the libraries' soname links (NVIDIA's `create-symlinks`);
//! - the host's NVIDIA userspace (libraries `lib*.so.<driver version>`, `nvidia-smi` & co.),
//!   found in the usual directories as `nvidia-ctk cdi generate` finds them, or the mounts of an
//!   existing NVIDIA CDI spec (`--nvidia-spec`), in both cases only what the instance's
//!   capabilities use (the table of libnvidia-container's legacy injector);
//! - `NVIDIA_VISIBLE_DEVICES=void` (NVIDIA's runtime hook then injects nothing more: no raw
//!   195:N node next to ours) and `NVIDIA_DRIVER_CAPABILITIES=<the instance's caps>`.
//!
//! The spec says `cdiVersion` 0.5.0, the lowest that has `deviceNodes[].hostPath`
//! ([`min_cdi_version`] computes it from the fields used).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// Where the shim appears in the container.
pub const SHIM_IN_CONTAINER: &str = "/usr/lib/nvproxy/libnvproxy_preload.so";
/// Where instance nodes live on the host (`instance::node_path`'s directory).
pub const NODES_DIR: &str = "/dev/nvproxy";
/// Container directory for host libraries found outside the standard directories.
pub const LIB_IN_CONTAINER: &str = "/usr/lib/x86_64-linux-gnu";
/// Container directory for host binaries found outside the standard directories.
pub const BIN_IN_CONTAINER: &str = "/usr/bin";

// ------------------------------------------------------------------ the CDI document

/// A CDI spec (the fields we write; names as in the CDI `SPEC.md`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One device.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    pub name: String,
    pub container_edits: ContainerEdits,
}

/// Container edits.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
    }
}

/// `deviceNodes[]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// `mounts[]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// `hooks[]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
}

/// The lowest `cdiVersion` that has every field `spec` uses (CDI `SPEC.md`'s version history:
/// 0.4.0 mount `type`; 0.5.0 `hostPath`, device names starting with a digit). We never write the
/// fields of later versions (annotations 0.6.0, additionalGids/intelRdt 0.7.0, netDevices 1.1.0).
pub fn min_cdi_version(spec: &Spec) -> &'static str {
    let edits = std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits));
    let mut v = "0.3.0";
    for e in edits {
        if e.mounts.iter().any(|m| m.kind.is_some()) {
            v = v.max("0.4.0");
        }
        if e.device_nodes.iter().any(|n| n.host_path.is_some()) {
            v = v.max("0.5.0");
        }
    }
    if spec
        .devices
        .iter()
        .any(|d| d.name.starts_with(|c: char| c.is_ascii_digit()))
    {
        v = v.max("0.5.0");
    }
    v
}

// ------------------------------------------------------------------ NVIDIA userspace

/// What a host library or binary is for: the legacy injector's table
/// (libnvidia-container `nvc_info.c`), by file-name prefix. A name in no row is `graphics`
/// (what remains of the driver's `*.so.<version>` files are GL/Vulkan/EGL pieces).
const CAPABILITY_FILES: &[(&str, &[&str])] = &[
    (
        "utility",
        &[
            "libnvidia-ml.so",
            "libnvidia-cfg.so",
            "libnvidia-nscq.so",
            "nvidia-smi",
            "nvidia-debugdump",
            "nvidia-persistenced",
            "nv-fabricmanager",
        ],
    ),
    (
        "compute",
        &[
            "libcuda.so",
            "libcudadebugger.so",
            "libnvidia-opencl.so",
            "libnvidia-ptxjitcompiler.so",
            "libnvidia-nvvm.so",
            "libnvidia-gpucomp.so",
            "libnvidia-allocator.so",
            "libnvidia-pkcs11",
            "libnvidia-fatbinaryloader.so",
            "libnvidia-compiler.so",
            "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server",
        ],
    ),
    (
        "video",
        &[
            "libvdpau_nvidia.so",
            "libnvidia-encode.so",
            "libnvcuvid.so",
            "libnvidia-opticalflow.so",
        ],
    ),
    ("ngx", &["libnvidia-ngx.so"]),
];

/// The capability a library or binary (by file name) belongs to; `always` for what is neither
/// in the table nor a library (an NVIDIA spec's firmware files, sockets, configuration).
pub fn capability_of(file_name: &str) -> &'static str {
    for (cap, prefixes) in CAPABILITY_FILES {
        if prefixes.iter().any(|p| {
            file_name == *p
                || file_name
                    .strip_prefix(p)
                    .is_some_and(|rest| rest.starts_with('.') || p.ends_with("pkcs11"))
        }) {
            return cap;
        }
    }
    if file_name.starts_with("lib") && file_name.contains(".so") {
        "graphics"
    } else {
        "always"
    }
}

/// Whether an instance with capabilities `caps` gets the files of capability `cap`.
fn wants(caps: &BTreeSet<String>, cap: &str) -> bool {
    cap == "always" || caps.contains("all") || caps.contains(cap)
}

/// The NVIDIA binaries `nvidia-ctk` and libnvidia-container look for.
const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// Library directories searched under the driver root, and where their files appear in the
/// container: the standard ones at the same path; Debian's `nvidia/current` (found through its
/// ld.so.conf.d entry on the host, which a container does not have) in the multiarch directory.
const LIB_DIRS: &[(&str, &str)] = &[
    ("usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"),
    ("lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"),
    ("usr/lib64", "/usr/lib64"),
    ("lib64", "/lib64"),
    ("usr/lib", "/usr/lib"),
    ("usr/lib/x86_64-linux-gnu/nvidia/current", LIB_IN_CONTAINER),
];
/// Binary directories, likewise (Debian keeps `nvidia-smi` in `/usr/lib/nvidia/current`).
const BIN_DIRS: &[(&str, &str)] = &[
    ("usr/bin", "/usr/bin"),
    ("usr/sbin", "/usr/sbin"),
    ("bin", "/bin"),
    ("sbin", "/sbin"),
    ("usr/lib/nvidia/current", BIN_IN_CONTAINER),
];

/// One host file to mount into the container, with the soname links that point at it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostFile {
    pub host: PathBuf,
    pub container: PathBuf,
    /// Symlinks next to it in the container: (link name, target file name).
    pub links: Vec<(String, String)>,
}

/// The host's NVIDIA userspace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Userspace {
    pub files: Vec<HostFile>,
    /// Hooks taken over from an NVIDIA spec (its `create-symlinks`/`update-ldcache`).
    pub hooks: Vec<Hook>,
}

/// Finds the NVIDIA userspace of `version` as `nvidia-ctk cdi generate` does (every
/// `lib*.so.<version>` of the library directories, the known binaries), under `root` (`/` or a
/// `--driver-root`), plus `extra_lib_dirs`/`extra_bin_dirs` (mounted at [`LIB_IN_CONTAINER`] /
/// [`BIN_IN_CONTAINER`]). The soname links (`libcuda.so.1 -> libcuda.so.<version>`) are the
/// host's own links in the same directory, which ldconfig made.
pub fn find_userspace(
    root: &Path,
    version: &str,
    extra_lib_dirs: &[PathBuf],
    extra_bin_dirs: &[PathBuf],
) -> Result<Userspace> {
    let suffix = format!(".so.{version}");
    let mut files: BTreeMap<String, HostFile> = BTreeMap::new();
    let lib_dirs = LIB_DIRS
        .iter()
        .map(|(d, c)| (root.join(d), PathBuf::from(c)))
        .chain(
            extra_lib_dirs
                .iter()
                .map(|d| (d.clone(), PathBuf::from(LIB_IN_CONTAINER))),
        );
    for (dir, in_container) in lib_dirs {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        let mut names = Vec::new();
        let mut links = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_symlink() {
                if let Ok(t) = fs::read_link(e.path()) {
                    links.push((name, t.to_string_lossy().into_owned()));
                }
            } else if ft.is_file() && name.starts_with("lib") && name.ends_with(&suffix) {
                names.push(name);
            }
        }
        for name in names {
            if files.contains_key(&name) {
                continue; // the first directory wins (usr/lib/x86_64-linux-gnu before lib/...)
            }
            let mut l: Vec<(String, String)> =
                links.iter().filter(|(_, t)| *t == name).cloned().collect();
            // Links to those links (libcuda.so -> libcuda.so.1).
            let first: Vec<String> = l.iter().map(|(n, _)| n.clone()).collect();
            l.extend(links.iter().filter(|(_, t)| first.contains(t)).cloned());
            l.sort();
            files.insert(
                name.clone(),
                HostFile {
                    host: dir.join(&name),
                    container: in_container.join(&name),
                    links: l,
                },
            );
        }
    }
    let bin_dirs = BIN_DIRS
        .iter()
        .map(|(d, c)| (root.join(d), PathBuf::from(c)))
        .chain(
            extra_bin_dirs
                .iter()
                .map(|d| (d.clone(), PathBuf::from(BIN_IN_CONTAINER))),
        );
    for (dir, in_container) in bin_dirs {
        for b in BINARIES {
            let p = dir.join(b);
            if !files.contains_key(*b) && fs::metadata(&p).is_ok_and(|m| m.is_file()) {
                files.insert(
                    (*b).to_owned(),
                    HostFile {
                        host: p,
                        container: in_container.join(b),
                        links: Vec::new(),
                    },
                );
            }
        }
    }
    Ok(Userspace {
        files: files.into_values().collect(),
        hooks: Vec::new(),
    })
}

/// Takes the NVIDIA userspace from an NVIDIA CDI spec (`nvidia-ctk cdi generate`): the mounts
/// of its top-level and device edits (libraries, binaries, firmware, sockets), and its
/// `create-symlinks` / `update-ldcache` hooks. Its device nodes, its other hooks (ours replace
/// `disable-device-node-modification`) and its env are not taken.
pub fn userspace_from_nvidia_spec(text: &str) -> Result<Userspace> {
    let v: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(text).context("parsing the NVIDIA CDI spec")?;
    let mut edits: Vec<&serde_yaml_ng::Value> = Vec::new();
    if let Some(e) = v.get("containerEdits") {
        edits.push(e);
    }
    for d in v
        .get("devices")
        .and_then(|d| d.as_sequence())
        .into_iter()
        .flatten()
    {
        if let Some(e) = d.get("containerEdits") {
            edits.push(e);
        }
    }
    let mut out = Userspace::default();
    let mut seen = BTreeSet::new();
    for e in edits {
        for m in e
            .get("mounts")
            .and_then(|m| m.as_sequence())
            .into_iter()
            .flatten()
        {
            let m: Mount =
                serde_yaml_ng::from_value(m.clone()).context("a mount of the NVIDIA spec")?;
            if seen.insert(m.container_path.clone()) {
                out.files.push(HostFile {
                    host: m.host_path.into(),
                    container: m.container_path.into(),
                    links: Vec::new(),
                });
            }
        }
        for h in e
            .get("hooks")
            .and_then(|h| h.as_sequence())
            .into_iter()
            .flatten()
        {
            let h: Hook =
                serde_yaml_ng::from_value(h.clone()).context("a hook of the NVIDIA spec")?;
            if h.args
                .iter()
                .any(|a| a == "create-symlinks" || a == "update-ldcache")
                && !out.hooks.contains(&h)
            {
                out.hooks.push(h);
            }
        }
    }
    if out.files.is_empty() {
        bail!("the NVIDIA CDI spec mounts nothing (no containerEdits.mounts)");
    }
    Ok(out)
}

/// The host driver's version (`/sys/module/nvidia/version`, else `/proc/driver/nvidia/version`).
fn host_driver_version() -> Option<String> {
    if let Ok(v) = fs::read_to_string("/sys/module/nvidia/version") {
        return Some(v.trim().to_owned());
    }
    let text = fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    text.split_whitespace()
        .find(|w| w.split('.').count() >= 2 && w.split('.').all(|p| p.parse::<u32>().is_ok()))
        .map(str::to_owned)
}

// ------------------------------------------------------------------ served instances

/// One node of an instance, as found on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveNode {
    /// `nvidiactl`, `nvidia<N>`, `nvidia-uvm`.
    pub name: String,
    pub host_path: PathBuf,
    pub major: u64,
    pub minor: u64,
}

/// An instance to describe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceInfo {
    pub name: String,
    /// `None`: unknown (no config given): every capability's files are mounted.
    pub caps: Option<Vec<String>>,
    /// Its CUSE nodes (none for a socket-transport instance).
    pub nodes: Vec<LiveNode>,
    /// A socket-transport instance: its device socket, no nodes.
    pub socket: Option<SocketInstance>,
}

/// What a socket-transport instance's container gets instead of nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketInstance {
    /// Its device socket on the host (`<run dir>/<instance>/dev.sock`).
    pub host_path: PathBuf,
    /// Its GPU count (`NVPROXY_DEV_GPUS`).
    pub gpus: usize,
}

/// The socket-transport side of `instance` under `run_dir`: `None` when it has no device
/// socket (a CUSE instance); its GPU count from its worker's state file.
pub fn socket_instance(run_dir: &Path, instance: &str) -> Result<Option<SocketInstance>> {
    let dir = nvproxy_worker::paths::run_dir(run_dir, instance);
    let socket = dir.join(nvproxy_preload_proto::socket::DEV_SOCKET_NAME);
    if !socket.exists() {
        return Ok(None);
    }
    let state = dir.join(nvproxy_worker::paths::STATE_FILE);
    let text = fs::read_to_string(&state)
        .with_context(|| format!("instance {instance}: reading {}", state.display()))?;
    let state: nvproxy_worker::worker_spec::WorkerState = serde_json::from_str(&text)
        .with_context(|| format!("instance {instance}: parsing {}", state.display()))?;
    Ok(Some(SocketInstance {
        host_path: socket,
        gpus: state.spec.instance.gpus.len(),
    }))
}

/// `instance` as served: its device socket, else its live CUSE nodes.
fn served_instance(
    nodes_dir: &Path,
    run_dir: &Path,
    name: &str,
    caps: Option<Vec<String>>,
) -> Result<InstanceInfo> {
    let socket = socket_instance(run_dir, name)?;
    let nodes = match socket {
        Some(_) => Vec::new(),
        None => live_nodes(nodes_dir, name, &nvproxy_worker::host::stat_node)?,
    };
    Ok(InstanceInfo {
        name: name.to_owned(),
        caps,
        nodes,
        socket,
    })
}

fn is_node_name(n: &str) -> bool {
    n == "nvidiactl"
        || n == "nvidia-uvm"
        || n.strip_prefix("nvidia")
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// Sorts nodes as a container lists them: nvidiactl, nvidia0.., nvidia-uvm.
fn node_order(n: &str) -> (u8, u32) {
    match n {
        "nvidiactl" => (0, 0),
        "nvidia-uvm" => (2, 0),
        _ => (1, n["nvidia".len()..].parse().unwrap_or(u32::MAX)),
    }
}

/// The live nodes of `instance` under `nodes_dir`, each `stat`ed (`stat` is given so that tests
/// can describe fake nodes). Fails unless they include `nvidiactl` and a GPU.
pub fn live_nodes(
    nodes_dir: &Path,
    instance: &str,
    stat: &dyn Fn(&Path) -> std::io::Result<(bool, u64)>,
) -> Result<Vec<LiveNode>> {
    let dir = nodes_dir.join(instance);
    let mut nodes = Vec::new();
    for e in fs::read_dir(&dir).with_context(|| {
        format!(
            "instance {instance} is not being served ({} cannot be read): start `nvproxy serve`",
            dir.display()
        )
    })? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !is_node_name(&name) {
            continue;
        }
        let path = e.path();
        let (is_char, rdev) = stat(&path).with_context(|| format!("stat {}", path.display()))?;
        if !is_char {
            bail!("{} is not a character device", path.display());
        }
        nodes.push(LiveNode {
            name,
            host_path: path,
            major: u64::from(libc::major(rdev)),
            minor: u64::from(libc::minor(rdev)),
        });
    }
    nodes.sort_by_key(|n| node_order(&n.name));
    if !nodes.iter().any(|n| n.name == "nvidiactl")
        || !nodes.iter().any(|n| node_order(&n.name).0 == 1)
    {
        bail!(
            "instance {instance}: {} has no nvidiactl or no nvidia<N> node (is it still starting?)",
            dir.display()
        );
    }
    Ok(nodes)
}

// ------------------------------------------------------------------ the spec

/// Everything [`build_spec`] needs, gathered from the host by [`GenerateArgs`].
#[derive(Debug, Clone)]
pub struct SpecInputs {
    pub vendor: String,
    pub class: String,
    pub instances: Vec<InstanceInfo>,
    /// The `nvproxy` binary the hooks run (host path).
    pub hook_bin: PathBuf,
    /// The mmap shim on the host; `None`: no shim (mmap of the nodes fails with ENODEV).
    pub shim: Option<PathBuf>,
    /// The host's run directory (`nvproxy_worker::paths::host_run_dir`).
    pub run_dir: PathBuf,
    pub userspace: Userspace,
    /// The host driver's `nvidia-uvm` major, for socket-transport instances (libcuda compares
    /// it with `/proc/devices`); `None`: the shim's default.
    pub uvm_major: Option<u32>,
}

/// The hooks' whole environment.
const HOOK_ENV: &str = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";

const LIB_MOUNT_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "rbind", "rprivate"];

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The spec for `inputs`.
pub fn build_spec(inputs: &SpecInputs) -> Result<Spec> {
    let kind = format!("{}/{}", inputs.vendor, inputs.class);
    check_kind(&inputs.vendor, &inputs.class)?;
    let hook = |args: Vec<String>| Hook {
        hook_name: "createContainer".to_owned(),
        path: s(&inputs.hook_bin),
        args: ["nvproxy".to_owned(), "cdi-hook".to_owned()]
            .into_iter()
            .chain(args)
            .collect(),
        // An explicit environment: with none, runc runs createContainer hooks with the
        // container's own environment (its init has set it by then), so an image's LD_PRELOAD
        // would load image code into a host-root process (CVE-2025-23266 in NVIDIA's hook).
        env: vec![HOOK_ENV.to_owned()],
        timeout: None,
    };
    let mut devices = Vec::new();
    for inst in &inputs.instances {
        let caps: BTreeSet<String> = match &inst.caps {
            Some(c) => c.iter().cloned().collect(),
            None => ["all".to_owned()].into(),
        };
        let mut e = ContainerEdits::default();
        e.env.push("NVIDIA_VISIBLE_DEVICES=void".to_owned());
        if let Some(c) = &inst.caps {
            e.env
                .push(format!("NVIDIA_DRIVER_CAPABILITIES={}", c.join(",")));
        }
        for n in &inst.nodes {
            e.device_nodes.push(DeviceNode {
                path: format!("/dev/{}", n.name),
                host_path: Some(s(&n.host_path)),
                kind: Some("c".to_owned()),
                major: Some(n.major),
                minor: Some(n.minor),
                // NVIDIA's DeviceFileMode default: any uid in the container may open the
                // nodes; the proxy's policy, not the mode, is the boundary.
                file_mode: Some(0o666),
                permissions: Some("rw".to_owned()),
                uid: None,
                gid: None,
            });
        }
        if let Some(sock) = &inst.socket {
            use nvproxy_preload_proto::socket::{
                DEFAULT_DEV_SOCKET_PATH, ENV_DEV_GPUS, ENV_DEV_SOCKET, ENV_DEV_UVM_MAJOR,
            };
            // The shim is the transport: without it the container has no GPU at all.
            let shim = inputs.shim.as_ref().with_context(|| {
                format!(
                    "instance {} is served with the socket transport, which needs the shim \
                     in the container: drop --no-preload",
                    inst.name
                )
            })?;
            e.env.push(format!("LD_PRELOAD={SHIM_IN_CONTAINER}"));
            e.env
                .push(format!("{ENV_DEV_SOCKET}={DEFAULT_DEV_SOCKET_PATH}"));
            e.env.push(format!("{ENV_DEV_GPUS}={}", sock.gpus));
            if let Some(major) = inputs.uvm_major {
                e.env.push(format!("{ENV_DEV_UVM_MAJOR}={major}"));
            }
            e.mounts.push(Mount {
                host_path: s(shim),
                container_path: SHIM_IN_CONTAINER.to_owned(),
                kind: None,
                options: LIB_MOUNT_OPTIONS.iter().map(|o| (*o).to_owned()).collect(),
            });
            e.mounts.push(Mount {
                host_path: s(&sock.host_path),
                container_path: DEFAULT_DEV_SOCKET_PATH.to_owned(),
                kind: None,
                options: ["rbind", "nosuid", "nodev", "noexec"]
                    .iter()
                    .map(|o| (*o).to_owned())
                    .collect(),
            });
        } else if let Some(shim) = &inputs.shim {
            let ids: Vec<String> = inst
                .nodes
                .iter()
                .map(|n| format!("{}:{}", n.major, n.minor))
                .collect();
            e.env.push(format!("LD_PRELOAD={SHIM_IN_CONTAINER}"));
            e.env.push(format!(
                "{}={}",
                nvproxy_preload_proto::ENV_NODES,
                ids.join(",")
            ));
            e.mounts.push(Mount {
                host_path: s(shim),
                container_path: SHIM_IN_CONTAINER.to_owned(),
                kind: None,
                options: LIB_MOUNT_OPTIONS.iter().map(|o| (*o).to_owned()).collect(),
            });
            e.mounts.push(Mount {
                host_path: s(&inputs
                    .run_dir
                    .join(&inst.name)
                    .join(nvproxy_worker::paths::MMAP_SOCKET)),
                container_path: nvproxy_preload_proto::DEFAULT_SOCKET_PATH.to_owned(),
                kind: None,
                options: ["rbind", "nosuid", "nodev", "noexec"]
                    .iter()
                    .map(|o| (*o).to_owned())
                    .collect(),
            });
        }
        let mut links = Vec::new();
        for f in &inputs.userspace.files {
            let name = f
                .container
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !wants(&caps, capability_of(&name)) {
                continue;
            }
            e.mounts.push(Mount {
                host_path: s(&f.host),
                container_path: s(&f.container),
                kind: None,
                options: LIB_MOUNT_OPTIONS.iter().map(|o| (*o).to_owned()).collect(),
            });
            let dir = f.container.parent().unwrap_or(Path::new("/"));
            for (link, target) in &f.links {
                links.push(format!("{target}::{}", s(&dir.join(link))));
            }
        }
        e.hooks.push(hook(vec!["params".to_owned()]));
        if !inst.nodes.is_empty() {
            let mut pin = vec!["pin-nodes".to_owned()];
            for n in &inst.nodes {
                pin.push("--node".to_owned());
                pin.push(format!("/dev/{}", n.name));
            }
            e.hooks.push(hook(pin));
        }
        let mut char_links = Vec::new();
        for n in &inst.nodes {
            if let Some(l) = char_link_name(&n.name) {
                char_links.push(format!("../{}::/dev/char/{l}", n.name));
            }
        }
        let mut args = vec!["create-symlinks".to_owned()];
        for l in char_links.into_iter().chain(links) {
            args.push("--link".to_owned());
            args.push(l);
        }
        e.hooks.push(hook(args));
        for h in &inputs.userspace.hooks {
            e.hooks.push(h.clone());
        }
        devices.push(Device {
            name: inst.name.clone(),
            container_edits: e,
        });
    }
    if devices.is_empty() {
        bail!("no instance is being served: a CDI spec needs at least one device");
    }
    let mut spec = Spec {
        cdi_version: String::new(),
        kind,
        devices,
        container_edits: ContainerEdits::default(),
    };
    spec.cdi_version = min_cdi_version(&spec).to_owned();
    Ok(spec)
}

/// The `/dev/char` link NVIDIA's tools keep for a node (`195:255`, `195:<N>`), whatever our
/// node's number: what `nvproxy ns-exec` makes, and NVIDIA's `create-dev-char-symlinks`.
pub(crate) fn char_link_name(node: &str) -> Option<String> {
    if node == "nvidiactl" {
        return Some("195:255".to_owned());
    }
    let minor: u32 = node.strip_prefix("nvidia")?.parse().ok()?;
    Some(format!("195:{minor}"))
}

/// CDI's rules for the kind: vendor a DNS name, class `[A-Za-z0-9][A-Za-z0-9_.-]*[A-Za-z0-9]`.
fn check_kind(vendor: &str, class: &str) -> Result<()> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if vendor.is_empty() || !vendor.split('.').all(label_ok) {
        bail!("CDI vendor {vendor:?} must be a DNS name (e.g. nvproxy.dev)");
    }
    // At least two characters, as the pattern says (podman 4.3's CDI library panics on one).
    let ok_class = class.len() >= 2
        && class.len() <= 63
        && class
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        && class.as_bytes()[0].is_ascii_alphanumeric()
        && class.as_bytes()[class.len() - 1].is_ascii_alphanumeric();
    if !ok_class {
        bail!("CDI class {class:?} must match [A-Za-z0-9][A-Za-z0-9_.-]*[A-Za-z0-9]");
    }
    Ok(())
}

/// The spec as YAML (the default) or JSON (`json`).
pub fn render(spec: &Spec, json: bool) -> Result<String> {
    Ok(if json {
        let mut t = serde_json::to_string_pretty(spec)?;
        t.push('\n');
        t
    } else {
        serde_yaml_ng::to_string(spec)?
    })
}

// ------------------------------------------------------------------ the command

/// `nvproxy cdi ...`.
#[derive(Debug, clap::Subcommand)]
pub enum CdiCommand {
    /// Print (or write) a CDI spec with one device per served instance.
    Generate(GenerateArgs),
}

/// `nvproxy cdi generate` options.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// The daemon's config: its instances (that are being served) and their caps. Without it,
    /// every instance under /dev/nvproxy, with every capability's files.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Write the spec here (atomically; `.json` writes JSON, anything else YAML), e.g.
    /// /var/run/cdi/nvproxy.yaml. Default: stdout, YAML.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Take NVIDIA's libraries and binaries from this CDI spec (`nvidia-ctk cdi generate`'s)
    /// instead of looking for them.
    #[arg(long, value_name = "FILE")]
    pub nvidia_spec: Option<PathBuf>,
    /// CDI vendor (the kind is VENDOR/CLASS).
    #[arg(long, default_value = "nvproxy.dev")]
    pub vendor: String,
    /// CDI class.
    #[arg(long, default_value = "gpu")]
    pub class: String,
    /// Where NVIDIA's userspace is installed (as nvidia-ctk's --driver-root).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub driver_root: PathBuf,
    /// The driver version whose `lib*.so.<version>` are mounted (default: the host driver's;
    /// with a config whose driver is "sim", its sim.driver_version).
    #[arg(long)]
    pub driver_version: Option<String>,
    /// More directories holding NVIDIA libraries (mounted at /usr/lib/x86_64-linux-gnu).
    #[arg(long, value_name = "DIR")]
    pub lib_dir: Vec<PathBuf>,
    /// More directories holding NVIDIA binaries (mounted at /usr/bin).
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Vec<PathBuf>,
    /// The mmap shim (default: libnvproxy_preload.so next to the nvproxy binary).
    #[arg(long, value_name = "PATH")]
    pub preload: Option<PathBuf>,
    /// No shim in the container (mmap of the nodes then fails with ENODEV).
    #[arg(long, conflicts_with = "preload")]
    pub no_preload: bool,
}

/// Runs `nvproxy cdi ...`.
pub fn run(cmd: &CdiCommand) -> Result<()> {
    match cmd {
        CdiCommand::Generate(args) => generate(args),
    }
}

fn generate(args: &GenerateArgs) -> Result<()> {
    let nodes_dir = Path::new(NODES_DIR);
    let mut sim_version = None;
    let mut run_dir = nvproxy_worker::paths::host_run_dir(None);
    let instances: Vec<InstanceInfo> = match &args.config {
        Some(path) => {
            let cfg = nvproxy_config::Config::load(path, &nvproxy_worker::host::ThisHost)?;
            run_dir = nvproxy_worker::paths::host_run_dir(cfg.daemon.run_dir.as_deref());
            if cfg.driver == nvproxy_config::DriverKind::Sim {
                sim_version = Some(cfg.sim.driver_version.clone());
            }
            cfg.instances
                .iter()
                .map(|i| served_instance(nodes_dir, &run_dir, &i.name, Some(i.caps.clone())))
                .collect::<Result<_>>()?
        }
        None => {
            // CUSE instances by their nodes, socket-transport ones by their device socket.
            let names_in = |dir: &Path, what: fn(&Path) -> bool| -> Vec<String> {
                fs::read_dir(dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| what(&e.path()))
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| nvproxy_config::validate_instance_name(n).is_ok())
                    .collect()
            };
            let mut names: BTreeSet<String> = names_in(nodes_dir, |_| true).into_iter().collect();
            names.extend(names_in(&run_dir, |p| {
                p.join(nvproxy_preload_proto::socket::DEV_SOCKET_NAME)
                    .exists()
            }));
            if names.is_empty() {
                bail!(
                    "no instance is being served (no nodes under {NODES_DIR}, no device socket \
                     under {}): start `nvproxy serve`",
                    run_dir.display()
                );
            }
            names
                .into_iter()
                .map(|name| served_instance(nodes_dir, &run_dir, &name, None))
                .collect::<Result<_>>()?
        }
    };
    let spec = spec_from(args, instances, sim_version, run_dir)?;
    match &args.out {
        None => {
            print!("{}", render(&spec, false)?);
            Ok(())
        }
        Some(out) => write_spec(out, &spec),
    }
}

/// Writes `spec` to `out` atomically (`.json`: JSON, else YAML).
fn write_spec(out: &Path, spec: &Spec) -> Result<()> {
    let json = out.extension().is_some_and(|e| e == "json");
    write_atomically(out, render(spec, json)?.as_bytes())
}

/// The spec of `instances` under `args` (NVIDIA's userspace looked up or taken from
/// `--nvidia-spec`, the shim, the hooks).
fn spec_from(
    args: &GenerateArgs,
    instances: Vec<InstanceInfo>,
    sim_version: Option<String>,
    run_dir: PathBuf,
) -> Result<Spec> {
    let userspace = match &args.nvidia_spec {
        Some(p) => userspace_from_nvidia_spec(
            &fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| p.display().to_string())?,
        None => {
            let version = args
                .driver_version
                .clone()
                .or(sim_version)
                .or_else(host_driver_version);
            match version {
                Some(v) => find_userspace(&args.driver_root, &v, &args.lib_dir, &args.bin_dir)?,
                None => {
                    tracing::warn!(
                        "no NVIDIA driver version known (no host driver, no --driver-version): \
                         the spec mounts no NVIDIA libraries"
                    );
                    Userspace::default()
                }
            }
        }
    };
    if userspace.files.is_empty() {
        tracing::warn!(
            "no NVIDIA libraries or binaries found: the containers must bring their own"
        );
    }
    let shim = if args.no_preload {
        None
    } else {
        Some(nvproxy_worker::mmap::shim_path(args.preload.as_deref())?)
    };
    let hook_bin = fs::canonicalize(std::env::current_exe()?)?;
    build_spec(&SpecInputs {
        vendor: args.vendor.clone(),
        class: args.class.clone(),
        instances,
        hook_bin,
        shim,
        run_dir,
        userspace,
        uvm_major: nvproxy_worker::host::uvm_major(),
    })
}

/// `serve`'s `[cdi]`: writes the spec of the instances `instances` names (name, caps) whose
/// nodes are live to `[cdi] spec`, atomically; nothing when `spec = ""`.
pub fn write_current(
    cfg: &nvproxy_config::Config,
    instances: &[(String, Vec<String>)],
) -> Result<()> {
    let out = &cfg.cdi.spec;
    if out.as_os_str().is_empty() {
        return Ok(());
    }
    let nodes_dir = Path::new(NODES_DIR);
    let run_dir = nvproxy_worker::paths::host_run_dir(cfg.daemon.run_dir.as_deref());
    let mut infos = Vec::new();
    for (name, caps) in instances {
        match served_instance(nodes_dir, &run_dir, name, Some(caps.clone())) {
            Ok(info) => infos.push(info),
            Err(e) => {
                tracing::warn!(instance = %name, error = %format!("{e:#}"), "not in the CDI spec")
            }
        }
    }
    let args = GenerateArgs {
        config: None,
        out: Some(out.clone()),
        nvidia_spec: cfg.cdi.nvidia_spec.clone(),
        vendor: cfg.cdi.vendor.clone(),
        class: cfg.cdi.class.clone(),
        driver_root: cfg.cdi.driver_root.clone(),
        driver_version: None,
        lib_dir: Vec::new(),
        bin_dir: Vec::new(),
        preload: None,
        no_preload: false,
    };
    let sim_version =
        (cfg.driver == nvproxy_config::DriverKind::Sim).then(|| cfg.sim.driver_version.clone());
    let spec = spec_from(&args, infos, sim_version, run_dir)?;
    write_spec(out, &spec).with_context(|| format!("[cdi] spec = {}", out.display()))
}

/// Writes `path` through a temporary file in its directory and a rename, so that a runtime
/// watching the directory never reads half a spec.
fn write_atomically(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path.file_name().context("--out names no file")?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

// ------------------------------------------------------------------ the hooks

/// `nvproxy cdi-hook` (internal): OCI `createContainer` hooks. The runtime runs them in the
/// container's mount namespace before `pivot_root`, with the container's state (JSON) on stdin;
/// they find the rootfs in the bundle's `config.json`. Every path inside the rootfs is resolved
/// with `openat2(RESOLVE_IN_ROOT)`, so an image's symlinks cannot point the hook at host files.
#[derive(Debug, clap::Args)]
pub struct HookArgs {
    #[command(subcommand)]
    pub hook: HookCommand,
    /// The rootfs (instead of reading the OCI state from stdin; for tests).
    #[arg(long, global = true, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub enum HookCommand {
    /// /proc/driver/nvidia/params with `ModifyDeviceFiles: 0` (the host's file with that line
    /// changed, or that one line without a host driver), bind-mounted over the container's.
    Params,
    /// Bind-mounts each device node (a path in the container) onto itself, so that it cannot
    /// be unlinked (`EBUSY`): libcuda replaces `/dev/nvidia-uvm` with a node of the UVM major
    /// it reads from `/proc/devices`, whatever `ModifyDeviceFiles` says.
    PinNodes {
        #[arg(long = "node", value_name = "PATH")]
        nodes: Vec<PathBuf>,
    },
    /// Symlinks in the rootfs: `--link TARGET::LINK` (LINK absolute inside the container).
    CreateSymlinks {
        #[arg(long = "link", value_name = "TARGET::LINK")]
        links: Vec<String>,
    },
}

/// Runs a hook.
pub fn hook(args: &HookArgs) -> Result<()> {
    let rootfs = match &args.rootfs {
        Some(r) => r.clone(),
        None => {
            let mut state = String::new();
            std::io::stdin()
                .read_to_string(&mut state)
                .context("reading the OCI state from stdin")?;
            rootfs_from_state(&state)?
        }
    };
    let root = open_path(&rootfs, libc::O_DIRECTORY)
        .with_context(|| format!("opening the rootfs {}", rootfs.display()))?;
    match &args.hook {
        HookCommand::Params => hook_params(&root),
        HookCommand::PinNodes { nodes } => {
            for n in nodes {
                pin_node(&root, n).with_context(|| format!("pinning {}", n.display()))?;
            }
            Ok(())
        }
        HookCommand::CreateSymlinks { links } => {
            for l in links {
                let (target, link) = l
                    .split_once("::")
                    .with_context(|| format!("--link {l:?}: expected TARGET::LINK"))?;
                create_symlink(&root, target, link).with_context(|| format!("link {link}"))?;
            }
            Ok(())
        }
    }
}

/// The rootfs named by the OCI state's bundle (`config.json`'s `root.path`, relative to the
/// bundle unless absolute).
pub fn rootfs_from_state(state: &str) -> Result<PathBuf> {
    let state: serde_json::Value = serde_json::from_str(state).context("parsing the OCI state")?;
    let bundle = PathBuf::from(
        state["bundle"]
            .as_str()
            .context("the OCI state has no bundle")?,
    );
    let cfg_path = bundle.join("config.json");
    let cfg: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(&cfg_path)
            .with_context(|| format!("reading {}", cfg_path.display()))?,
    )
    .with_context(|| format!("parsing {}", cfg_path.display()))?;
    let root = cfg["root"]["path"]
        .as_str()
        .with_context(|| format!("{} has no root.path", cfg_path.display()))?;
    Ok(bundle.join(root))
}

fn cstr(p: &Path) -> Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).context("path contains a NUL byte")
}

/// `open(path, O_PATH|O_CLOEXEC|flags)` on the host.
fn open_path(path: &Path, flags: i32) -> Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let c = cstr(path)?;
    let flags = OFlags::PATH
        | OFlags::CLOEXEC
        | OFlags::from_bits_retain(u32::from_ne_bytes(flags.to_ne_bytes()));
    Ok(rustix::fs::open(c.as_c_str(), flags, Mode::empty()).map_err(std::io::Error::from)?)
}

/// `openat2(root, rel, flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: `rel` resolved as if
/// `root` were `/`.
fn open_in_root(root: &OwnedFd, rel: &Path, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let rel = rel.strip_prefix("/").unwrap_or(rel);
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let c = cstr(rel).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    Ok(rustix::fs::openat2(
        root,
        c.as_c_str(),
        OFlags::from_bits_retain(u32::from_ne_bytes((flags | libc::O_CLOEXEC).to_ne_bytes())),
        Mode::from_bits_retain(mode),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// Opens directory `rel` in the rootfs, creating missing components (0755).
fn dir_in_root(root: &OwnedFd, rel: &Path) -> Result<OwnedFd> {
    let mut dir = open_in_root(root, Path::new("."), libc::O_PATH | libc::O_DIRECTORY, 0)?;
    let mut sofar = PathBuf::from("/");
    for comp in rel.components() {
        let std::path::Component::Normal(name) = comp else {
            continue;
        };
        sofar.push(name);
        match open_in_root(root, &sofar, libc::O_PATH | libc::O_DIRECTORY, 0) {
            Ok(d) => dir = d,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let c = cstr(Path::new(name))?;
                // An O_PATH directory fd works for mkdirat.
                let mode = rustix::fs::Mode::from_bits_retain(0o755);
                if let Err(e) = rustix::fs::mkdirat(&dir, c.as_c_str(), mode)
                    && e != rustix::io::Errno::EXIST
                {
                    return Err(std::io::Error::from(e))
                        .with_context(|| format!("mkdir {}", sofar.display()));
                }
                dir = open_in_root(root, &sofar, libc::O_PATH | libc::O_DIRECTORY, 0)?;
            }
            Err(e) => return Err(e).with_context(|| format!("opening {}", sofar.display())),
        }
    }
    Ok(dir)
}

/// Creates symlink `link` (a path in the container) -> `target`, replacing an existing link
/// (not a file or directory).
fn create_symlink(root: &OwnedFd, target: &str, link: &str) -> Result<()> {
    use rustix::fs::{AtFlags, FileType};
    let link = Path::new(link);
    let name = link.file_name().context("link names no file")?;
    let dir = dir_in_root(root, link.parent().unwrap_or(Path::new("/")))?;
    let cname = cstr(Path::new(name))?;
    let ctarget = cstr(Path::new(target))?;
    let e = match rustix::fs::symlinkat(ctarget.as_c_str(), &dir, cname.as_c_str()) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    if e != rustix::io::Errno::EXIST {
        return Err(std::io::Error::from(e).into());
    }
    let is_link = rustix::fs::statat(&dir, cname.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
    if !is_link {
        bail!("{} exists and is not a symlink", link.display());
    }
    let _ = rustix::fs::unlinkat(&dir, cname.as_c_str(), AtFlags::empty());
    rustix::fs::symlinkat(ctarget.as_c_str(), &dir, cname.as_c_str())
        .map_err(std::io::Error::from)?;
    Ok(())
}

/// Bind-mounts the device node `path` of the rootfs onto itself.
fn pin_node(root: &OwnedFd, path: &Path) -> Result<()> {
    let fd = open_in_root(root, path, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
    let st = rustix::fs::fstat(&fd).map_err(std::io::Error::from)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::CharacterDevice {
        bail!("not a character device");
    }
    let p = fd_path(&fd);
    nix::mount::mount(
        Some(&p),
        &p,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .context("bind mount")?;
    Ok(())
}

fn fs_magic(fd: &OwnedFd) -> Result<i64> {
    Ok(rustix::fs::fstatfs(fd)
        .map_err(std::io::Error::from)?
        .f_type)
}

fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The params text the container sees: the host's with `ModifyDeviceFiles: 0`, or that line.
pub fn params_text(host: Option<&str>) -> String {
    match host {
        Some(host) => {
            let mut out: String = host
                .lines()
                .filter(|l| !l.starts_with("ModifyDeviceFiles:"))
                .map(|l| format!("{l}\n"))
                .collect();
            out.push_str("ModifyDeviceFiles: 0\n");
            out
        }
        None => "ModifyDeviceFiles: 0\n".to_owned(),
    }
}

fn hook_params(root: &OwnedFd) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    let proc_driver = open_in_root(
        root,
        Path::new("/proc/driver"),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )
    .context("the container's /proc/driver (is /proc mounted?)")?;
    if fs_magic(&proc_driver)? != libc::PROC_SUPER_MAGIC {
        bail!("the container's /proc/driver is not on procfs");
    }
    let host = fs::read_to_string("/proc/driver/nvidia/params").ok();
    let text = params_text(host.as_deref());
    match open_in_root(
        root,
        Path::new("/proc/driver/nvidia/params"),
        libc::O_PATH,
        0,
    ) {
        Ok(params) => {
            // Stage the file on the container's /dev tmpfs (the runtime's, not the host's), bind
            // it over params, unlink it: the bind mount keeps the file.
            let dev = open_in_root(root, Path::new("/dev"), libc::O_PATH | libc::O_DIRECTORY, 0)?;
            if fs_magic(&dev)? != libc::TMPFS_MAGIC {
                bail!("the container's /dev is not a tmpfs: nowhere to stage the params file");
            }
            let staged = fd_path(&dev).join(".nvproxy-params");
            fs::write(&staged, &text).context("staging the params file")?;
            let r = mount(
                Some(&staged),
                &fd_path(&params),
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            );
            let _ = fs::remove_file(&staged);
            r.context("bind-mounting the params file")?;
            let _ = mount(
                None::<&str>,
                &fd_path(&params),
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                None::<&str>,
            );
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            // No NVIDIA driver on the host (the simulated one): a small tmpfs on /proc/driver
            // (procfs takes no new files) holding nvidia/params.
            mount(
                Some("tmpfs"),
                &fd_path(&proc_driver),
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("mode=755,size=64k"),
            )
            .context("mounting a tmpfs on the container's /proc/driver")?;
            let d = open_in_root(
                root,
                Path::new("/proc/driver"),
                libc::O_PATH | libc::O_DIRECTORY,
                0,
            )?;
            let nvidia = fd_path(&d).join("nvidia");
            fs::create_dir(&nvidia)?;
            fs::write(nvidia.join("params"), &text)?;
            let _ = mount(
                None::<&str>,
                &fd_path(&d),
                None::<&str>,
                MsFlags::MS_REMOUNT
                    | MsFlags::MS_RDONLY
                    | MsFlags::MS_NOSUID
                    | MsFlags::MS_NODEV
                    | MsFlags::MS_NOEXEC,
                None::<&str>,
            );
        }
        Err(e) => return Err(e).context("the container's /proc/driver/nvidia/params"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("nvproxy-cdi-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// A fixture: fake nodes (regular files, numbers from their names' table) of two
    /// instances, and a fake driver root with NVIDIA libraries and nvidia-smi.
    fn fixture() -> (PathBuf, SpecInputs) {
        let d = tmpdir("fixture");
        for (inst, nodes) in [
            ("job42", &["nvidiactl", "nvidia0", "nvidia-uvm"][..]),
            (
                "monitor",
                &["nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm"][..],
            ),
        ] {
            fs::create_dir_all(d.join("dev/nvproxy").join(inst)).unwrap();
            for n in nodes {
                fs::write(d.join("dev/nvproxy").join(inst).join(n), "").unwrap();
            }
        }
        fs::write(d.join("dev/nvproxy/job42/README"), "not a node").unwrap();
        let lib = d.join("root/usr/lib/x86_64-linux-gnu");
        fs::create_dir_all(&lib).unwrap();
        for f in [
            "libcuda.so.535.261.03",
            "libnvidia-ml.so.535.261.03",
            "libnvidia-ptxjitcompiler.so.535.261.03",
            "libnvidia-encode.so.535.261.03",
            "libnvidia-glcore.so.535.261.03",
            "libcuda.so.470.1",
            "libc.so.6",
        ] {
            fs::write(lib.join(f), "").unwrap();
        }
        std::os::unix::fs::symlink("libcuda.so.535.261.03", lib.join("libcuda.so.1")).unwrap();
        std::os::unix::fs::symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
        std::os::unix::fs::symlink("libnvidia-ml.so.535.261.03", lib.join("libnvidia-ml.so.1"))
            .unwrap();
        fs::create_dir_all(d.join("root/usr/bin")).unwrap();
        fs::write(d.join("root/usr/bin/nvidia-smi"), "").unwrap();
        // Fake stat: CUSE-like dynamic majors, one per instance, minors in name order.
        let stat = |p: &Path| -> std::io::Result<(bool, u64)> {
            let inst = p.parent().unwrap().file_name().unwrap().to_str().unwrap();
            let major = if inst == "job42" { 240 } else { 241 };
            let minor = match p.file_name().unwrap().to_str().unwrap() {
                "nvidiactl" => 0,
                "nvidia0" => 1,
                "nvidia1" => 2,
                _ => 3,
            };
            Ok((true, libc::makedev(major, minor)))
        };
        let nodes_dir = d.join("dev/nvproxy");
        let instances = vec![
            InstanceInfo {
                name: "job42".into(),
                caps: Some(vec!["compute".into(), "utility".into()]),
                nodes: live_nodes(&nodes_dir, "job42", &stat).unwrap(),
                socket: None,
            },
            InstanceInfo {
                name: "monitor".into(),
                caps: Some(vec!["utility".into()]),
                nodes: live_nodes(&nodes_dir, "monitor", &stat).unwrap(),
                socket: None,
            },
        ];
        let userspace = find_userspace(&d.join("root"), "535.261.03", &[], &[]).unwrap();
        let inputs = SpecInputs {
            vendor: "nvproxy.dev".into(),
            class: "gpu".into(),
            instances,
            hook_bin: "/usr/local/bin/nvproxy".into(),
            shim: Some("/usr/local/lib/nvproxy/libnvproxy_preload.so".into()),
            run_dir: "/run/nvproxy".into(),
            userspace,
            uvm_major: Some(510),
        };
        (d, inputs)
    }

    /// Replaces the fixture's temporary directory with `FIXTURE` for the golden text.
    fn normalise(text: &str, d: &Path) -> String {
        text.replace(&d.display().to_string(), "FIXTURE")
    }

    #[test]
    fn test_spec_matches_the_golden_yaml() {
        let (d, inputs) = fixture();
        let spec = build_spec(&inputs).unwrap();
        let got = normalise(&render(&spec, false).unwrap(), &d);
        let want = include_str!("../testdata/cdi/golden.yaml");
        if got != want {
            let out = std::env::temp_dir().join("nvproxy-cdi-golden.yaml");
            fs::write(&out, &got).unwrap();
            panic!(
                "spec differs from daemon/testdata/cdi/golden.yaml (got written to {}):\n{got}",
                out.display()
            );
        }
        let _ = fs::remove_dir_all(&d);
    }

    /// Issue 21, item 6: a socket-transport instance was missing from the spec (serve warned
    /// that its /dev/nvproxy directory could not be read). Its device has no nodes: the
    /// shim, preloaded, and the device socket where the shim looks for it.
    #[test]
    fn test_a_socket_instance_gets_the_shim_and_its_socket_not_nodes() {
        let (d, mut inputs) = fixture();
        inputs.instances[1] = InstanceInfo {
            name: "monitor".into(),
            caps: Some(vec!["utility".into()]),
            nodes: Vec::new(),
            socket: Some(SocketInstance {
                host_path: "/run/nvproxy/monitor/dev.sock".into(),
                gpus: 2,
            }),
        };
        let spec = build_spec(&inputs).unwrap();
        let e = &spec.devices[1].container_edits;
        assert_eq!(spec.devices[1].name, "monitor");
        assert!(e.device_nodes.is_empty(), "{:?}", e.device_nodes);
        for want in [
            "LD_PRELOAD=/usr/lib/nvproxy/libnvproxy_preload.so",
            "NVPROXY_DEV_SOCKET=/run/nvproxy/dev.sock",
            "NVPROXY_DEV_GPUS=2",
            "NVPROXY_DEV_UVM_MAJOR=510",
            "NVIDIA_VISIBLE_DEVICES=void",
        ] {
            assert!(e.env.iter().any(|v| v == want), "{want}: {:?}", e.env);
        }
        assert!(!e.env.iter().any(|v| v.starts_with("NVPROXY_NODES=")));
        assert!(
            e.mounts
                .iter()
                .any(|m| m.host_path == "/run/nvproxy/monitor/dev.sock"
                    && m.container_path == "/run/nvproxy/dev.sock"),
            "{:?}",
            e.mounts
        );
        assert!(!e.mounts.iter().any(|m| m.host_path.ends_with("mmap.sock")));
        let hooks: Vec<&str> = e.hooks.iter().map(|h| h.args[2].as_str()).collect();
        assert!(!hooks.contains(&"pin-nodes"), "{hooks:?}");
        // The CUSE instance beside it is as before.
        assert_eq!(spec.devices[0].container_edits.device_nodes.len(), 3);
        // Without the shim a socket instance has no GPU at all: refused, not written.
        inputs.shim = None;
        let err = build_spec(&inputs).unwrap_err();
        assert!(
            format!("{err:#}").contains("instance monitor is served with the socket transport"),
            "{err:#}"
        );
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn test_json_and_yaml_parse_back_to_the_same_spec() {
        let (d, inputs) = fixture();
        let spec = build_spec(&inputs).unwrap();
        let y: Spec = serde_yaml_ng::from_str(&render(&spec, false).unwrap()).unwrap();
        let j: Spec = serde_json::from_str(&render(&spec, true).unwrap()).unwrap();
        assert_eq!(y, spec);
        assert_eq!(j, spec);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn test_device_nodes_carry_the_live_numbers_and_host_paths() {
        let (d, inputs) = fixture();
        let spec = build_spec(&inputs).unwrap();
        assert_eq!(spec.kind, "nvproxy.dev/gpu");
        assert_eq!(spec.cdi_version, "0.5.0");
        let m = &spec.devices[1];
        assert_eq!(m.name, "monitor");
        let paths: Vec<_> = m
            .container_edits
            .device_nodes
            .iter()
            .map(|n| (n.path.as_str(), n.major, n.minor))
            .collect();
        assert_eq!(
            paths,
            [
                ("/dev/nvidiactl", Some(241), Some(0)),
                ("/dev/nvidia0", Some(241), Some(1)),
                ("/dev/nvidia1", Some(241), Some(2)),
                ("/dev/nvidia-uvm", Some(241), Some(3)),
            ]
        );
        for n in &m.container_edits.device_nodes {
            let host = n.host_path.as_deref().unwrap();
            assert!(
                host.ends_with(&format!("dev/nvproxy/monitor{}", &n.path[4..])),
                "{host}"
            );
        }
        assert!(
            m.container_edits
                .env
                .contains(&"NVPROXY_NODES=241:0,241:1,241:2,241:3".to_owned())
        );
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn test_libraries_follow_the_instance_caps() {
        let (d, inputs) = fixture();
        let spec = build_spec(&inputs).unwrap();
        let mounted = |dev: &Device| -> Vec<String> {
            dev.container_edits
                .mounts
                .iter()
                .map(|m| m.container_path.clone())
                .collect()
        };
        let job = mounted(&spec.devices[0]);
        assert!(job.contains(&"/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03".to_owned()));
        assert!(job.contains(&"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.261.03".to_owned()));
        assert!(job.contains(&"/usr/bin/nvidia-smi".to_owned()));
        assert!(
            !job.iter()
                .any(|p| p.contains("encode") || p.contains("glcore"))
        );
        assert!(
            !job.iter()
                .any(|p| p.contains("470") || p.ends_with("libc.so.6"))
        );
        let mon = mounted(&spec.devices[1]);
        assert!(!mon.iter().any(|p| p.contains("libcuda")), "{mon:?}");
        assert!(mon.contains(&"/usr/bin/nvidia-smi".to_owned()));
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn test_hooks_never_inherit_the_containers_environment() {
        let (d, inputs) = fixture();
        let spec = build_spec(&inputs).unwrap();
        for dev in &spec.devices {
            assert_eq!(dev.container_edits.hooks.len(), 3);
            for h in &dev.container_edits.hooks {
                assert_eq!(h.env, [HOOK_ENV], "{h:?}");
                assert_eq!(h.hook_name, "createContainer");
            }
        }
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn test_capability_table() {
        assert_eq!(capability_of("libcuda.so.535.261.03"), "compute");
        assert_eq!(capability_of("libnvidia-ml.so.1"), "utility");
        assert_eq!(capability_of("nvidia-smi"), "utility");
        assert_eq!(
            capability_of("libnvidia-pkcs11-openssl3.so.535.1"),
            "compute"
        );
        assert_eq!(capability_of("libnvcuvid.so.535.1"), "video");
        assert_eq!(capability_of("libnvidia-glcore.so.535.1"), "graphics");
        assert_eq!(capability_of("libcudart.so.12"), "graphics");
        assert_eq!(capability_of("gsp_ga10x.bin"), "always");
        assert_eq!(capability_of("socket"), "always");
        let compute: BTreeSet<String> = ["compute".to_owned()].into();
        assert!(wants(&compute, "always") && wants(&compute, "compute"));
        assert!(!wants(&compute, "utility") && !wants(&compute, "graphics"));
    }

    #[test]
    fn test_min_version_is_the_lowest_covering_the_fields() {
        let (d, inputs) = fixture();
        let mut spec = build_spec(&inputs).unwrap();
        assert_eq!(min_cdi_version(&spec), "0.5.0");
        for dev in &mut spec.devices {
            for n in &mut dev.container_edits.device_nodes {
                n.host_path = None;
            }
        }
        assert_eq!(min_cdi_version(&spec), "0.3.0");
        spec.devices[0].container_edits.mounts[0].kind = Some("bind".into());
        assert_eq!(min_cdi_version(&spec), "0.4.0");
        spec.devices[0].name = "0".into();
        assert_eq!(min_cdi_version(&spec), "0.5.0");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn test_kind_rules() {
        assert!(check_kind("nvproxy.dev", "gpu").is_ok());
        assert!(check_kind("example.com", "gpu.v1").is_ok());
        assert!(check_kind("nvproxy.dev/x", "gpu").is_err());
        assert!(check_kind("nvproxy.dev", "gpu-").is_err());
        assert!(check_kind("nvproxy.dev", "x").is_err());
        assert!(check_kind("", "gpu").is_err());
    }

    #[test]
    fn test_missing_or_partial_instances_are_errors() {
        let d = tmpdir("partial");
        let stat = |_: &Path| Ok((true, libc::makedev(240, 0)));
        assert!(live_nodes(&d, "nope", &stat).is_err());
        fs::create_dir_all(d.join("half")).unwrap();
        fs::write(d.join("half/nvidia-uvm"), "").unwrap();
        assert!(live_nodes(&d, "half", &stat).is_err());
        let notchar = |_: &Path| Ok((false, 0));
        fs::write(d.join("half/nvidiactl"), "").unwrap();
        fs::write(d.join("half/nvidia0"), "").unwrap();
        assert!(live_nodes(&d, "half", &notchar).is_err());
        assert_eq!(live_nodes(&d, "half", &stat).unwrap().len(), 3);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn test_nvidia_spec_mounts_and_library_hooks_are_taken() {
        let text = r#"
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - {path: /dev/nvidia0}
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void]
  deviceNodes:
    - {path: /dev/nvidiactl}
  hooks:
    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, create-symlinks, --link, libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so]}
    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, disable-device-node-modification]}
    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]}
  mounts:
    - {hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15, containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15, options: [ro, nosuid, nodev, bind]}
    - {hostPath: /usr/bin/nvidia-smi, containerPath: /usr/bin/nvidia-smi, options: [ro, nosuid, nodev, bind]}
"#;
        let u = userspace_from_nvidia_spec(text).unwrap();
        assert_eq!(u.files.len(), 2);
        assert_eq!(u.hooks.len(), 2);
        assert!(u.hooks.iter().all(|h| {
            !h.args
                .iter()
                .any(|a| a == "disable-device-node-modification")
        }));
        assert!(
            userspace_from_nvidia_spec("cdiVersion: 0.5.0\nkind: a.b/c\ndevices: []\n").is_err()
        );
    }

    #[test]
    fn test_params_text_forces_modify_device_files_off() {
        assert_eq!(params_text(None), "ModifyDeviceFiles: 0\n");
        assert_eq!(
            params_text(Some(
                "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileMode: 438\n"
            )),
            "ResmanDebugLevel: 4294967295\nDeviceFileMode: 438\nModifyDeviceFiles: 0\n"
        );
    }

    #[test]
    fn test_rootfs_from_the_oci_state() {
        let d = tmpdir("state");
        fs::write(d.join("config.json"), r#"{"root":{"path":"rootfs"}}"#).unwrap();
        let state = format!(
            r#"{{"ociVersion":"1.0.2","id":"x","status":"creating","pid":1,"bundle":"{}"}}"#,
            d.display()
        );
        assert_eq!(rootfs_from_state(&state).unwrap(), d.join("rootfs"));
        fs::write(d.join("config.json"), r#"{"root":{"path":"/abs/root"}}"#).unwrap();
        assert_eq!(
            rootfs_from_state(&state).unwrap(),
            PathBuf::from("/abs/root")
        );
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn test_symlinks_stay_inside_the_rootfs() {
        let d = tmpdir("links");
        let root = d.join("rootfs");
        let outside = d.join("outside");
        fs::create_dir_all(root.join("usr/lib")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        // An image's hostile link: /dev -> the host's directory `outside`.
        std::os::unix::fs::symlink(&outside, root.join("dev")).unwrap();
        let fd = open_path(&root, libc::O_DIRECTORY).unwrap();
        // Resolved in the rootfs, the link leads to rootfs/<outside>, which does not exist:
        // the hook fails rather than write into the host's directory.
        assert!(create_symlink(&fd, "../nvidiactl", "/dev/char/195:255").is_err());
        std::os::unix::fs::symlink("../../../outside", root.join("usr/escape")).unwrap();
        assert!(create_symlink(&fd, "x", "/usr/escape/char/195:0").is_err());
        assert!(
            fs::read_dir(&outside).unwrap().next().is_none(),
            "nothing written outside"
        );
        fs::remove_file(root.join("dev")).unwrap();
        create_symlink(&fd, "../nvidiactl", "/dev/char/195:255").unwrap();
        assert_eq!(
            fs::read_link(root.join("dev/char/195:255")).unwrap(),
            PathBuf::from("../nvidiactl")
        );
        create_symlink(&fd, "libcuda.so.1", "/usr/lib/libcuda.so").unwrap();
        create_symlink(&fd, "libcuda.so.1", "/usr/lib/libcuda.so").unwrap(); // replaced
        assert_eq!(
            fs::read_link(root.join("usr/lib/libcuda.so")).unwrap(),
            PathBuf::from("libcuda.so.1")
        );
        fs::write(root.join("usr/lib/libfoo.so"), "").unwrap();
        assert!(
            create_symlink(&fd, "x", "/usr/lib/libfoo.so").is_err(),
            "a file is not replaced"
        );
        let _ = fs::remove_dir_all(&d);
    }
}
