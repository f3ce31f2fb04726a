//! The plugin: its state, the `DevicePlugin` service, registration with the kubelet (again
//! whenever the kubelet restarts), the health poll and the reconciliation with PodResources.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::api::podresources::ListPodResourcesRequest;
use crate::api::podresources::pod_resources_lister_client::PodResourcesListerClient;
use crate::api::v1beta1::{
    self, AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    NumaNode, PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, RegisterRequest, TopologyInfo,
    device_plugin_server::{DevicePlugin, DevicePluginServer},
    registration_client::RegistrationClient,
};

/// One GPU of the node, as the daemon reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Its host minor (`/dev/nvidia<minor>`), how instances name it.
    pub minor: u32,
    /// `GPU-…`, or empty when unknown.
    pub uuid: String,
    /// `dddd:bb:dd.f`.
    pub bus_id: String,
    /// Its sysfs device path's components (PCI root, bridges, the GPU); empty when unknown.
    pub pci_path: Vec<String>,
    /// Its NUMA node, when known.
    pub numa_node: Option<i64>,
    /// Its video memory in bytes, when the daemon knows it.
    pub memory: Option<u64>,
}

impl Gpu {
    /// The device id the kubelet sees: the UUID, else `gpu<minor>`.
    pub fn device_id(&self) -> String {
        if self.uuid.is_empty() || self.uuid.len() > 63 {
            format!("gpu{}", self.minor)
        } else {
            self.uuid.clone()
        }
    }
}

/// What the daemon serves on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its GPUs.
    pub gpus: Vec<Gpu>,
    /// The CDI kind of its instances' devices (`nvproxy.dev/gpu`).
    pub cdi_kind: String,
    /// Whether the daemon lets quotas add up past a GPU's memory.
    pub overcommit: bool,
}

/// One instance of the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Its name.
    pub name: String,
    /// Its GPUs' host minors.
    pub gpus: Vec<u32>,
    /// Its worker's pid, to watch for its exit (0: none, or not one this process can see).
    pub pid: u32,
    /// Its worker is running and answers.
    pub up: bool,
}

/// The daemon, as the plugin uses it. Calls block (the plugin runs them off its runtime's
/// threads); errors are messages for the log and the kubelet.
pub trait Backend: Send + Sync + 'static {
    /// The node's GPUs.
    fn node(&self) -> Result<Node, String>;
    /// Every instance.
    fn instances(&self) -> Result<Vec<Instance>, String>;
    /// A new instance `name` of the GPUs `gpus` (host minors, in this order), with the video
    /// memory quota `gpu_memory` (bytes per GPU) if any.
    fn create(&self, name: &str, gpus: &[u32], gpu_memory: Option<u64>) -> Result<(), String>;
    /// Removes instance `name`, revoking its open files.
    fn remove(&self, name: &str) -> Result<(), String>;
}

/// The plugin's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The kubelet's device plugin directory (its `kubelet.sock`, and ours).
    pub device_plugin_dir: PathBuf,
    /// The kubelet's PodResources socket.
    pub pod_resources_socket: PathBuf,
    /// Our socket's file name in `device_plugin_dir`.
    pub endpoint: String,
    /// The extended resource.
    pub resource_name: String,
    /// The names of the instances the plugin creates start with this; it removes no other.
    pub instance_prefix: String,
    /// How often the daemon is asked for health and the sockets are looked at.
    pub poll: Duration,
    /// How often instances are compared with the pods the kubelet lists.
    pub reconcile: Duration,
    /// How long an instance may go unlisted by the kubelet before it is removed (the kubelet
    /// records an allocation after `Allocate` answers).
    pub grace: Duration,
    /// Timeout of each call to the kubelet.
    pub call_timeout: Duration,
    /// `Some`: the resource is shares of GPUs (`nvproxy.dev/gpu-share`), not whole GPUs.
    pub shares: Option<Shares>,
}

/// The most shares of one GPU (bounds the device list the kubelet is sent).
pub const MAX_SHARES_PER_GPU: u32 = 64;

/// Shares of GPUs: `per_gpu` devices per GPU, each an instance of that GPU with the video
/// memory quota `gpu_memory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    /// Devices per GPU (1 to [`MAX_SHARES_PER_GPU`]).
    pub per_gpu: u32,
    /// Each share's instance's quota, in bytes.
    pub gpu_memory: u64,
}

impl Shares {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if self.per_gpu == 0 || self.per_gpu > MAX_SHARES_PER_GPU {
            return Err(format!(
                "the shares per GPU must be 1 to {MAX_SHARES_PER_GPU}, not {}",
                self.per_gpu
            ));
        }
        if self.gpu_memory == 0 {
            return Err("a share's GPU memory must not be zero".into());
        }
        Ok(())
    }

    /// Whether the shares fit GPU `g`: they add up to no more than its memory, or the daemon
    /// allows overcommit, or its memory is unknown. Err: why not.
    pub fn fit(&self, g: &Gpu, overcommit: bool) -> Result<(), String> {
        let sum = self.gpu_memory.saturating_mul(u64::from(self.per_gpu));
        match g.memory {
            Some(m) if !overcommit && sum > m => {
                let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
                Err(format!(
                    "{} shares of {:.1} GiB add up to {:.1} GiB, more than the {:.1} GiB of \
                     GPU {}, and the daemon does not allow overcommit \
                     ([daemon] overcommit_gpu_memory = false)",
                    self.per_gpu,
                    gib(self.gpu_memory),
                    gib(sum),
                    gib(m),
                    g.device_id()
                ))
            }
            _ => Ok(()),
        }
    }
}

/// The device id of share `k` of the GPU whose device id is `gpu`.
pub fn share_id(gpu: &str, k: u32) -> String {
    format!("{gpu}::{k}")
}

impl Config {
    /// The defaults for the kubelet directory `dir` (`/var/lib/kubelet/device-plugins`): the
    /// PodResources socket beside it (`../pod-resources/kubelet.sock`).
    pub fn new(dir: &Path) -> Config {
        let pod_resources_socket = dir
            .parent()
            .unwrap_or(Path::new("/var/lib/kubelet"))
            .join("pod-resources/kubelet.sock");
        Config {
            device_plugin_dir: dir.to_owned(),
            pod_resources_socket,
            endpoint: "nvproxy-gpu.sock".to_owned(),
            resource_name: "nvproxy.dev/gpu".to_owned(),
            instance_prefix: "k8s-".to_owned(),
            poll: Duration::from_secs(1),
            reconcile: Duration::from_secs(10),
            grace: Duration::from_secs(60),
            call_timeout: Duration::from_secs(10),
            shares: None,
        }
    }

    /// The settings of the share resource: `nvproxy.dev/gpu-share` on its own socket, its
    /// instances named `k8sshare-<share>-…` (a prefix the whole-GPU resource's is not one of).
    pub fn for_shares(dir: &Path, shares: Shares) -> Config {
        Config {
            endpoint: "nvproxy-gpu-share.sock".to_owned(),
            resource_name: "nvproxy.dev/gpu-share".to_owned(),
            instance_prefix: "k8sshare-".to_owned(),
            shares: Some(shares),
            ..Config::new(dir)
        }
    }
}

/// Why the plugin stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket or file of ours.
    #[error("{what}: {source}")]
    Io {
        /// What was done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// Our gRPC server.
    #[error("serving the device plugin API: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// A bad setting.
    #[error("{0}")]
    Config(String),
}

/// What the plugin knows.
struct State {
    /// Every GPU seen since start, by device id; `present`: in the daemon's last answer.
    gpus: BTreeMap<String, (Gpu, bool)>,
    /// Whether the daemon answered last time.
    daemon_up: bool,
    cdi_kind: String,
    /// The daemon allows quotas past a GPU's memory.
    overcommit: bool,
    /// Our instances (by the prefix), from the daemon's last list and our creates.
    owned: BTreeMap<String, Owned>,
}

struct Owned {
    ids: BTreeSet<String>,
    /// When this plugin first saw it (created it, or found it at start).
    since: Instant,
    up: bool,
    /// The worker pid being watched, and the watch (a task that marks the instance down the
    /// moment that process exits, without waiting for a poll).
    watched: Option<(u32, tokio::task::JoinHandle<()>)>,
    /// A worker pid seen to exit: down whatever an older answer of the daemon says.
    exited: Option<u32>,
    /// Being removed by us: its worker's end is no failure.
    removing: bool,
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some((_, w)) = self.watched.take() {
            w.abort();
        }
    }
}

/// A pidfd of process `pid`, registered with the runtime (call it inside one): it turns
/// readable once the process exits. Opened at once, when the pid is learned, so that a process
/// that exits later is seen whenever it does. `None` when it cannot be watched (another pid
/// namespace, an old kernel, gone already).
#[allow(unsafe_code)] // tokio's AsyncFd registration
fn pidfd_of(pid: u32) -> Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)?;
    let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()?;
    // SAFETY: the AsyncFd owns `fd` (an OwnedFd, whose as_raw_fd is always that open
    // descriptor) until it is dropped.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .ok()
}

struct Shared {
    cfg: Config,
    backend: Arc<dyn Backend>,
    state: Mutex<State>,
    devices: watch::Sender<Vec<Device>>,
    /// Held by `Allocate` and by reconciliation: one changes instances at a time.
    ops: tokio::sync::Mutex<()>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Backend) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let b = self.backend.clone();
        tokio::task::spawn_blocking(move || f(&*b))
            .await
            .unwrap_or_else(|e| Err(format!("the daemon call failed: {e}")))
    }

    /// Asks the daemon for its GPUs and instances and publishes the devices' health.
    async fn poll(self: &Arc<Self>) {
        let answer = self.blocking(|b| Ok((b.node()?, b.instances()?))).await;
        let devices = {
            let mut st = lock(&self.state);
            match answer {
                Ok((node, instances)) => {
                    if !st.daemon_up {
                        tracing::info!(gpus = node.gpus.len(), "the daemon answers");
                    }
                    st.daemon_up = true;
                    st.cdi_kind = node.cdi_kind;
                    st.overcommit = node.overcommit;
                    for (_, present) in st.gpus.values_mut() {
                        *present = false;
                    }
                    for g in node.gpus {
                        st.gpus.insert(g.device_id(), (g, true));
                    }
                    // Every GPU ever seen: an instance of a GPU the driver lost keeps its
                    // devices (and its pod).
                    let by_minor: BTreeMap<u32, String> = st
                        .gpus
                        .iter()
                        .map(|(id, (g, _))| (g.minor, id.clone()))
                        .collect();
                    let prefix = self.cfg.instance_prefix.clone();
                    let mut seen = BTreeSet::new();
                    for i in instances
                        .into_iter()
                        .filter(|i| i.name.starts_with(&prefix))
                    {
                        let ids = self.ids_of(&i, &by_minor);
                        let o = st.owned.entry(i.name.clone()).or_insert_with(|| Owned {
                            ids: BTreeSet::new(),
                            since: Instant::now(),
                            up: i.up,
                            watched: None,
                            exited: None,
                            removing: false,
                        });
                        let up = i.up && o.exited != Some(i.pid);
                        if o.up != up {
                            tracing::warn!(instance = %i.name, up, pid = i.pid, "instance worker");
                        }
                        o.ids = ids;
                        o.up = up;
                        let rewatch = o.watched.as_ref().is_none_or(|(p, _)| *p != i.pid);
                        if up && !o.removing && i.pid != 0 && rewatch {
                            if let Some((_, w)) = o.watched.take() {
                                w.abort();
                            }
                            o.watched = Some((i.pid, self.watch_worker(&i.name, i.pid)));
                        }
                        seen.insert(i.name);
                    }
                    st.owned.retain(|n, _| seen.contains(n));
                }
                Err(e) => {
                    if st.daemon_up {
                        tracing::warn!(error = %e, "the daemon does not answer: every device unhealthy");
                    }
                    st.daemon_up = false;
                }
            }
            device_list(&st, self.cfg.shares.as_ref())
        };
        self.publish(devices);
    }

    /// The device ids instance `i` of ours holds: its GPUs', or for a share instance
    /// (`<prefix><share>-…`, one GPU) that share's.
    fn ids_of(&self, i: &Instance, by_minor: &BTreeMap<u32, String>) -> BTreeSet<String> {
        let gpus = i.gpus.iter().filter_map(|m| by_minor.get(m).cloned());
        let Some(shares) = &self.cfg.shares else {
            return gpus.collect();
        };
        let k = i.name[self.cfg.instance_prefix.len()..]
            .split_once('-')
            .and_then(|(k, _)| k.parse::<u32>().ok())
            .filter(|k| *k < shares.per_gpu);
        match (k, i.gpus.len()) {
            (Some(k), 1) => gpus.map(|g| share_id(&g, k)).collect(),
            // Not one of ours as configured now (another share count): no device, so
            // reconciliation removes it once no pod holds it.
            _ => BTreeSet::new(),
        }
    }

    /// Marks instance `name` down when its worker `pid` exits.
    fn watch_worker(self: &Arc<Self>, name: &str, pid: u32) -> tokio::task::JoinHandle<()> {
        let (me, name) = (Arc::downgrade(self), name.to_owned());
        let pidfd = pidfd_of(pid);
        tokio::spawn(async move {
            let Some(pidfd) = pidfd else { return };
            if pidfd.readable().await.is_err() {
                return;
            }
            let Some(me) = me.upgrade() else { return };
            let devices = {
                let mut st = lock(&me.state);
                let Some(o) = st.owned.get_mut(&name).filter(|o| !o.removing) else {
                    return;
                };
                tracing::warn!(instance = %name, pid, "instance worker exited");
                o.up = false;
                o.exited = Some(pid);
                device_list(&st, me.cfg.shares.as_ref())
            };
            me.publish(devices);
        })
    }

    /// Sends `devices` to every `ListAndWatch` if they changed.
    fn publish(&self, devices: Vec<Device>) {
        self.devices.send_if_modified(|old| {
            if *old == devices {
                false
            } else {
                *old = devices;
                true
            }
        });
    }

    /// Removes the instances of ours that no container the kubelet lists holds (after the
    /// grace period). Nothing is removed when the kubelet does not answer.
    async fn reconcile(&self) {
        let listed = match self.pod_allocations().await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "PodResources: not reconciled");
                return;
            }
        };
        let _ops = self.ops.lock().await;
        let gone: Vec<String> = lock(&self.state)
            .owned
            .iter()
            .filter(|(_, o)| o.since.elapsed() >= self.cfg.grace && !listed.contains(&o.ids))
            .map(|(n, _)| n.clone())
            .collect();
        for name in gone {
            self.remove(&name, "no container the kubelet lists holds its devices")
                .await;
        }
    }

    /// The device sets of our resource the kubelet's containers hold.
    async fn pod_allocations(&self) -> Result<BTreeSet<BTreeSet<String>>, String> {
        let ch = crate::connect(&self.cfg.pod_resources_socket, self.cfg.call_timeout)
            .await
            .map_err(|e| format!("{}: {e}", self.cfg.pod_resources_socket.display()))?;
        let resp = PodResourcesListerClient::new(ch)
            .list(ListPodResourcesRequest {})
            .await
            .map_err(|s| format!("List: {}", s.message()))?
            .into_inner();
        Ok(resp
            .pod_resources
            .iter()
            .flat_map(|p| &p.containers)
            .flat_map(|c| &c.devices)
            .filter(|d| d.resource_name == self.cfg.resource_name)
            .map(|d| d.device_ids.iter().cloned().collect())
            .collect())
    }

    async fn remove(&self, name: &str, why: &str) {
        // Its worker's exit is ours, not a failure to report.
        if let Some(o) = lock(&self.state).owned.get_mut(name) {
            o.removing = true;
            if let Some((_, w)) = o.watched.take() {
                w.abort();
            }
        }
        let n = name.to_owned();
        match self.blocking(move |b| b.remove(&n)).await {
            Ok(()) => {
                tracing::info!(instance = %name, why, "instance removed");
                lock(&self.state).owned.remove(name);
            }
            Err(e) => {
                tracing::warn!(instance = %name, error = %e, "removing the instance");
                if let Some(o) = lock(&self.state).owned.get_mut(name) {
                    o.removing = false;
                }
            }
        }
    }

    /// A name of the prefix that no instance of ours has (with the share's number after it,
    /// for a share).
    fn fresh_name(&self, share: Option<u32>) -> String {
        let st = lock(&self.state);
        let share = share.map_or(String::new(), |k| format!("{k}-"));
        loop {
            let r = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish();
            let name = format!("{}{share}{:08x}", self.cfg.instance_prefix, r & 0xffff_ffff);
            if !st.owned.contains_key(&name) {
                return name;
            }
        }
    }

    async fn allocate(self: &Arc<Self>, req: AllocateRequest) -> Result<AllocateResponse, Status> {
        let r = self.allocate_instances(req).await;
        // Either way the daemon is asked again: after a failure, health may have changed (the
        // daemon went away); after a success, the new instances' workers are watched from now
        // (their pids), so one killed before the next poll, and restarted by the daemon
        // before it, still shows Unhealthy.
        self.poll().await;
        r
    }

    async fn allocate_instances(&self, req: AllocateRequest) -> Result<AllocateResponse, Status> {
        let _ops = self.ops.lock().await;
        let shares = self.cfg.shares;
        let (wanted, kind) = {
            let st = lock(&self.state);
            let mut wanted = Vec::new();
            // No device goes to two containers.
            let mut all = BTreeSet::new();
            let per_gpu = shares.map_or(1, |s| s.per_gpu as usize);
            let devices = st.gpus.len().saturating_mul(per_gpu);
            if req.container_requests.len() > devices {
                return Err(Status::invalid_argument(format!(
                    "{} containers asked for; this node has {devices} device(s)",
                    req.container_requests.len(),
                )));
            }
            for c in &req.container_requests {
                let mut minors = Vec::new();
                let mut ids = BTreeSet::new();
                let most = if shares.is_some() { 1 } else { st.gpus.len() };
                if c.devices_ids.is_empty() || c.devices_ids.len() > most {
                    return Err(Status::invalid_argument(if shares.is_some() {
                        format!(
                            "{} shares asked for by one container; a container gets one share \
                             ({}: 1)",
                            c.devices_ids.len(),
                            self.cfg.resource_name
                        )
                    } else {
                        format!(
                            "{} device ids asked for; this node has {} GPU(s)",
                            c.devices_ids.len(),
                            st.gpus.len()
                        )
                    }));
                }
                let mut share = None;
                for id in &c.devices_ids {
                    let (gpu_id, k) = match shares {
                        None => (id.as_str(), None),
                        // An id of no share ("" is no GPU's): refused below.
                        Some(s) => id
                            .rsplit_once("::")
                            .and_then(|(g, k)| {
                                k.parse::<u32>()
                                    .ok()
                                    .filter(|k| *k < s.per_gpu && share_id(g, *k) == *id)
                                    .map(|k| (g, Some(k)))
                            })
                            .unwrap_or_default(),
                    };
                    let Some((g, present)) = st.gpus.get(gpu_id) else {
                        return Err(Status::invalid_argument(format!(
                            "no device {:?} on this node",
                            id.chars().take(80).collect::<String>()
                        )));
                    };
                    if !present || !st.daemon_up {
                        return Err(Status::unavailable(format!("device {id} is unhealthy")));
                    }
                    if let Some(s) = shares {
                        s.fit(g, st.overcommit)
                            .map_err(Status::failed_precondition)?;
                    }
                    if !all.insert(id.clone()) {
                        return Err(Status::invalid_argument(format!("device {id} twice")));
                    }
                    ids.insert(id.clone());
                    minors.push(g.minor);
                    share = k;
                }
                minors.sort_unstable();
                wanted.push((ids, minors, share));
            }
            (wanted, st.cdi_kind.clone())
        };
        // The kubelet gives a device to one container at a time: an instance of ours that
        // holds one of these devices belongs to a container that is gone.
        let all: BTreeSet<&String> = wanted.iter().flat_map(|(ids, _, _)| ids).collect();
        let stale: Vec<String> = lock(&self.state)
            .owned
            .iter()
            .filter(|(_, o)| o.ids.iter().any(|id| all.contains(id)))
            .map(|(n, _)| n.clone())
            .collect();
        for name in stale {
            self.remove(&name, "its devices are allocated again").await;
        }
        let mut created: Vec<String> = Vec::new();
        let mut responses = Vec::new();
        let quota = shares.map(|s| s.gpu_memory);
        for (ids, minors, share) in wanted {
            let name = self.fresh_name(share);
            let (n, m) = (name.clone(), minors.clone());
            if let Err(e) = self.blocking(move |b| b.create(&n, &m, quota)).await {
                for done in &created {
                    self.remove(done, "the allocation failed").await;
                }
                tracing::warn!(error = %e, ?minors, "allocation failed");
                return Err(Status::unavailable(format!(
                    "creating an nvproxy instance of GPU(s) {minors:?}: {e}"
                )));
            }
            tracing::info!(instance = %name, ?minors, ?share, "instance created for an allocation");
            lock(&self.state).owned.insert(
                name.clone(),
                Owned {
                    ids,
                    since: Instant::now(),
                    up: true,
                    watched: None,
                    exited: None,
                    removing: false,
                },
            );
            let cdi = format!("{kind}={name}");
            let mut r = ContainerAllocateResponse {
                cdi_devices: vec![CdiDevice { name: cdi.clone() }],
                ..Default::default()
            };
            // Kubelets before 1.28 drop `cdi_devices`; runtimes with CDI enabled also read
            // the CDI annotations.
            r.annotations
                .insert(format!("cdi.k8s.io/nvproxy_{name}"), cdi);
            responses.push(r);
            created.push(name);
        }
        Ok(AllocateResponse {
            container_responses: responses,
        })
    }
}

/// The devices' list for `ListAndWatch`, sorted by id: the GPUs, or `shares` of each.
fn device_list(st: &State, shares: Option<&Shares>) -> Vec<Device> {
    st.gpus
        .iter()
        .flat_map(|(gpu_id, (g, present))| {
            let ids: Vec<String> = match shares {
                None => vec![gpu_id.clone()],
                Some(s) => (0..s.per_gpu).map(|k| share_id(gpu_id, k)).collect(),
            };
            let fits = shares.is_none_or(|s| s.fit(g, st.overcommit).is_ok());
            ids.into_iter().map(move |id| (id, g, *present && fits))
        })
        .map(|(id, g, usable)| {
            let worker_down = st
                .owned
                .values()
                .any(|o| !o.up && !o.removing && o.ids.contains(&id));
            let healthy = st.daemon_up && usable && !worker_down;
            Device {
                id,
                health: if healthy {
                    v1beta1::HEALTHY
                } else {
                    v1beta1::UNHEALTHY
                }
                .to_owned(),
                topology: g.numa_node.filter(|n| *n >= 0).map(|n| TopologyInfo {
                    nodes: vec![NumaNode { id: n }],
                }),
            }
        })
        .collect()
}

/// The service of one registration: its streams end when `stop` turns true.
struct Service(Arc<Shared>, watch::Receiver<bool>);

type DeviceStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options(&self.0.cfg)))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<DeviceStream>, Status> {
        use tokio_stream::StreamExt;
        use tokio_stream::wrappers::WatchStream;
        let updates = WatchStream::new(self.0.devices.subscribe()).map(Some);
        let stop = WatchStream::new(self.1.clone())
            .filter(|s| *s)
            .map(|_| None);
        let stream = updates.merge(stop).take_while(Option::is_some).map(|d| {
            Ok(ListAndWatchResponse {
                devices: d.unwrap_or_default(),
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        if self.0.cfg.shares.is_some() {
            return Err(Status::unimplemented(
                "no preferred allocation of shares (the options say so)",
            ));
        }
        let gpus: BTreeMap<String, Gpu> = lock(&self.0.state)
            .gpus
            .iter()
            .map(|(id, (g, _))| (id.clone(), g.clone()))
            .collect();
        let req = req.into_inner();
        if req.container_requests.len() > gpus.len().max(1) {
            return Err(Status::invalid_argument(format!(
                "{} containers asked for; this node has {} GPU(s)",
                req.container_requests.len(),
                gpus.len()
            )));
        }
        let container_responses = req
            .container_requests
            .iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_ids: crate::topology::preferred(
                    &gpus,
                    &c.available_device_ids,
                    &c.must_include_device_ids,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        self.0.allocate(req.into_inner()).await.map(Response::new)
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// Shares have no preferred allocation: a container gets one, any of them.
fn options(cfg: &Config) -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: cfg.shares.is_none(),
    }
}

/// (device, inode) of `path`, if it exists.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Runs the plugin until `shutdown` completes: for each of `cfgs` (one per resource: the
/// kubelet takes one resource per registration and socket), serves the `DevicePlugin` API on
/// its socket, registers with the kubelet, and does both again whenever the kubelet
/// re-creates its socket or removes ours (a kubelet restart). Instances outlive the plugin: a
/// restarted plugin finds them again by their prefix.
pub async fn run(
    cfgs: Vec<Config>,
    backend: Arc<dyn Backend>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let mut seen = BTreeSet::new();
    for cfg in &cfgs {
        if cfg.endpoint.contains('/') || cfg.endpoint.is_empty() {
            return Err(Error::Config(format!(
                "the endpoint {:?} must be a file name",
                cfg.endpoint
            )));
        }
        if let Some(s) = &cfg.shares {
            s.validate().map_err(Error::Config)?;
        }
        if !seen.insert(cfg.endpoint.clone()) || !seen.insert(cfg.resource_name.clone()) {
            return Err(Error::Config(format!(
                "{} or {} is used twice",
                cfg.endpoint, cfg.resource_name
            )));
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    let mut socks = Vec::new();
    for cfg in cfgs {
        let (devices, _) = watch::channel(Vec::new());
        let shared = Arc::new(Shared {
            cfg,
            backend: backend.clone(),
            state: Mutex::new(State {
                gpus: BTreeMap::new(),
                daemon_up: false,
                cdi_kind: String::new(),
                overcommit: true,
                owned: BTreeMap::new(),
            }),
            devices,
            ops: tokio::sync::Mutex::new(()),
        });
        shared.poll().await;
        let s = shared.clone();
        tasks.spawn(async move {
            loop {
                tokio::time::sleep(s.cfg.poll).await;
                s.poll().await;
            }
        });
        let s = shared.clone();
        tasks.spawn(async move {
            loop {
                tokio::time::sleep(s.cfg.reconcile).await;
                s.reconcile().await;
            }
        });
        let sock = shared.cfg.device_plugin_dir.join(&shared.cfg.endpoint);
        socks.push(sock.clone());
        tasks.spawn(async move { serve_and_register(&shared, &sock).await });
    }
    let r = tokio::select! {
        r = tasks.join_next() => match r {
            Some(Ok(r)) => r,
            Some(Err(e)) => Err(Error::Config(format!("a plugin task failed: {e}"))),
            None => Ok(()),
        },
        () = shutdown => Ok(()),
    };
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    for sock in socks {
        let _ = std::fs::remove_file(&sock);
    }
    r
}

async fn serve_and_register(shared: &Arc<Shared>, sock: &Path) -> Result<(), Error> {
    let cfg = &shared.cfg;
    let kubelet = cfg.device_plugin_dir.join(v1beta1::KUBELET_SOCKET);
    loop {
        let incoming = crate::serve_on(sock).map_err(|source| Error::Io {
            what: format!("binding {}", sock.display()),
            source,
        })?;
        let ours = file_id(sock);
        let (stop, stopped) = watch::channel(false);
        let mut on_stop = stopped.clone();
        let server = tokio::spawn(
            tonic::transport::Server::builder().serve_with_incoming_shutdown(
                DevicePluginServer::new(Service(shared.clone(), stopped)),
                incoming,
                async move {
                    let _ = on_stop.wait_for(|s| *s).await;
                },
            ),
        );
        // Register until the kubelet takes it, or our socket is gone (a restarting kubelet
        // cleans the directory: serve a new one).
        let mut registered = None;
        let mut said = false;
        while file_id(sock) == ours {
            match register(cfg, &kubelet).await {
                Ok(()) => {
                    tracing::info!(resource = %cfg.resource_name, socket = %sock.display(), "registered with the kubelet");
                    registered = file_id(&kubelet);
                    break;
                }
                Err(e) => {
                    if !said {
                        tracing::warn!(error = %e, "registering with the kubelet; trying again");
                        said = true;
                    }
                    tokio::time::sleep(cfg.poll).await;
                }
            }
        }
        while registered.is_some() && file_id(sock) == ours && file_id(&kubelet) == registered {
            tokio::time::sleep(cfg.poll).await;
        }
        tracing::info!("the kubelet restarted (its socket or ours changed): registering again");
        let _ = stop.send(true);
        match server.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Error::Serve(e)),
            Err(e) => tracing::warn!(error = %e, "the gRPC server task"),
        }
    }
}

async fn register(cfg: &Config, kubelet: &Path) -> Result<(), String> {
    let ch = crate::connect(kubelet, cfg.call_timeout)
        .await
        .map_err(|e| format!("{}: {e}", kubelet.display()))?;
    RegistrationClient::new(ch)
        .register(RegisterRequest {
            version: v1beta1::VERSION.to_owned(),
            endpoint: cfg.endpoint.clone(),
            resource_name: cfg.resource_name.clone(),
            options: Some(options(cfg)),
        })
        .await
        .map_err(|s| format!("the kubelet refused: {}", s.message()))?;
    Ok(())
}

/// [`run`] on a runtime of its own until SIGTERM or SIGINT.
pub fn run_until_signal(cfgs: Vec<Config>, backend: Arc<dyn Backend>) -> Result<(), Error> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| Error::Io {
            what: "starting the async runtime".into(),
            source,
        })?;
    rt.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).map_err(|source| Error::Io {
            what: "SIGTERM handler".into(),
            source,
        })?;
        let mut int = signal(SignalKind::interrupt()).map_err(|source| Error::Io {
            what: "SIGINT handler".into(),
            source,
        })?;
        run(cfgs, backend, async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("stopping: the instances stay for their pods");
        })
        .await
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1beta1::ContainerAllocateRequest;

    /// A daemon in memory: its GPUs, instances, and whether it answers.
    #[derive(Default)]
    struct Fake {
        gpus: std::sync::Mutex<Vec<Gpu>>,
        instances: std::sync::Mutex<Vec<Instance>>,
        down: std::sync::atomic::AtomicBool,
        no_overcommit: std::sync::atomic::AtomicBool,
        /// The quota of each instance created, by name.
        quotas: std::sync::Mutex<BTreeMap<String, Option<u64>>>,
        /// The worker pid the next created instance reports (0: none).
        next_pid: std::sync::atomic::AtomicU32,
    }

    impl Backend for Fake {
        fn node(&self) -> Result<Node, String> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err("connection refused".into());
            }
            Ok(Node {
                gpus: self.gpus.lock().unwrap().clone(),
                cdi_kind: "nvproxy.dev/gpu".into(),
                overcommit: !self.no_overcommit.load(std::sync::atomic::Ordering::SeqCst),
            })
        }
        fn instances(&self) -> Result<Vec<Instance>, String> {
            self.node()?;
            Ok(self.instances.lock().unwrap().clone())
        }
        fn create(&self, name: &str, gpus: &[u32], quota: Option<u64>) -> Result<(), String> {
            self.quotas.lock().unwrap().insert(name.into(), quota);
            self.instances.lock().unwrap().push(Instance {
                name: name.into(),
                gpus: gpus.to_vec(),
                pid: self.next_pid.swap(0, std::sync::atomic::Ordering::SeqCst),
                up: true,
            });
            Ok(())
        }
        fn remove(&self, name: &str) -> Result<(), String> {
            self.instances.lock().unwrap().retain(|i| i.name != name);
            Ok(())
        }
    }

    fn gpu(minor: u32) -> Gpu {
        Gpu {
            minor,
            uuid: format!("GPU-{minor}"),
            bus_id: format!("0000:{:02x}:00.0", 0x18 + minor),
            pci_path: Vec::new(),
            numa_node: None,
            memory: Some(80 << 30),
        }
    }

    fn shared(fake: Arc<Fake>) -> Arc<Shared> {
        shared_with(fake, Config::new(Path::new("/nonexistent/device-plugins")))
    }

    fn shared_with(fake: Arc<Fake>, cfg: Config) -> Arc<Shared> {
        Arc::new(Shared {
            cfg,
            backend: fake,
            state: Mutex::new(State {
                gpus: BTreeMap::new(),
                daemon_up: false,
                cdi_kind: String::new(),
                overcommit: true,
                owned: BTreeMap::new(),
            }),
            devices: watch::channel(Vec::new()).0,
            ops: tokio::sync::Mutex::new(()),
        })
    }

    fn health(s: &Shared) -> Vec<(String, String)> {
        s.devices
            .borrow()
            .iter()
            .map(|d| (d.id.clone(), d.health.clone()))
            .collect()
    }

    fn alloc(ids: &[&[&str]]) -> AllocateRequest {
        AllocateRequest {
            container_requests: ids
                .iter()
                .map(|c| ContainerAllocateRequest {
                    devices_ids: c.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
        }
    }

    #[tokio::test]
    async fn test_a_lost_gpu_or_daemon_is_unhealthy_and_refused() {
        let fake = Arc::new(Fake::default());
        *fake.gpus.lock().unwrap() = vec![gpu(0), gpu(1)];
        let s = shared(fake.clone());
        s.poll().await;
        let ok = |id: &str, h: &str| (id.to_owned(), h.to_owned());
        assert_eq!(health(&s), [ok("GPU-0", "Healthy"), ok("GPU-1", "Healthy")]);
        // The driver loses GPU 1: still listed, unhealthy, not allocated.
        fake.gpus.lock().unwrap().pop();
        s.poll().await;
        assert_eq!(
            health(&s),
            [ok("GPU-0", "Healthy"), ok("GPU-1", "Unhealthy")]
        );
        let e = s.allocate(alloc(&[&["GPU-1"]])).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
        // The daemon goes away: everything unhealthy; back: healthy again.
        fake.down.store(true, std::sync::atomic::Ordering::SeqCst);
        s.poll().await;
        assert!(health(&s).iter().all(|(_, h)| h == "Unhealthy"));
        fake.down.store(false, std::sync::atomic::Ordering::SeqCst);
        s.poll().await;
        assert_eq!(health(&s)[0], ok("GPU-0", "Healthy"));
    }

    #[tokio::test]
    async fn test_allocations_are_checked_and_each_container_gets_its_instance() {
        let fake = Arc::new(Fake::default());
        *fake.gpus.lock().unwrap() = vec![gpu(0), gpu(1), gpu(2)];
        let s = shared(fake.clone());
        s.poll().await;
        for bad in [
            alloc(&[&[]]),
            alloc(&[&["GPU-9"]]),
            alloc(&[&["GPU-0"], &["GPU-0"]]),
            alloc(&[&["GPU-0"], &["GPU-1"], &["GPU-2"], &["GPU-0"]]),
        ] {
            let e = s.allocate(bad.clone()).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
        assert!(fake.instances.lock().unwrap().is_empty());
        let r = s
            .allocate(alloc(&[&["GPU-2", "GPU-0"], &["GPU-1"]]))
            .await
            .unwrap();
        let names: Vec<String> = r
            .container_responses
            .iter()
            .map(|c| c.cdi_devices[0].name.clone())
            .collect();
        let inst = fake.instances.lock().unwrap().clone();
        assert_eq!(inst.len(), 2);
        assert_eq!(names[0], format!("nvproxy.dev/gpu={}", inst[0].name));
        assert_eq!(
            (inst[0].gpus.clone(), inst[1].gpus.clone()),
            (vec![0, 2], vec![1])
        );
        // GPU 1 allocated again: the earlier instance of it goes.
        s.allocate(alloc(&[&["GPU-1"]])).await.unwrap();
        let inst = fake.instances.lock().unwrap().clone();
        assert_eq!(inst.len(), 2);
        assert!(
            inst.iter()
                .all(|i| i.name != names[1]["nvproxy.dev/gpu=".len()..])
        );
    }

    #[tokio::test]
    async fn test_a_worker_killed_before_the_next_poll_is_unhealthy() {
        let fake = Arc::new(Fake::default());
        *fake.gpus.lock().unwrap() = vec![gpu(0)];
        // The daemon is asked only at allocation here (no poll loop runs).
        let s = shared(fake.clone());
        s.poll().await;
        let mut worker = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        fake.next_pid
            .store(worker.id(), std::sync::atomic::Ordering::SeqCst);
        s.allocate(alloc(&[&["GPU-0"]])).await.unwrap();
        let mut devices = s.devices.subscribe();
        worker.kill().unwrap();
        worker.wait().unwrap();
        let unhealthy = |d: &Vec<Device>| d.iter().any(|d| d.health == v1beta1::UNHEALTHY);
        tokio::time::timeout(Duration::from_secs(10), devices.wait_for(unhealthy))
            .await
            .expect("the killed worker's device turns Unhealthy without a poll")
            .unwrap();
    }

    fn share_cfg(per_gpu: u32, gib: u64) -> Config {
        Config::for_shares(
            Path::new("/nonexistent/device-plugins"),
            Shares {
                per_gpu,
                gpu_memory: gib << 30,
            },
        )
    }

    #[test]
    fn test_share_settings_are_checked() {
        let s = |per_gpu, gpu_memory| Shares {
            per_gpu,
            gpu_memory,
        };
        assert!(s(0, 1).validate().unwrap_err().contains("1 to 64"));
        assert!(s(65, 1).validate().is_err());
        assert!(s(4, 0).validate().is_err());
        assert!(s(4, 1).validate().is_ok());
        let g = gpu(0);
        // 8 x 10 GiB = 80 GiB fits the 80 GiB GPU; 9 x 10 GiB fits only with overcommit.
        assert!(s(8, 10 << 30).fit(&g, false).is_ok());
        let e = s(9, 10 << 30).fit(&g, false).unwrap_err();
        assert!(e.contains("90.0 GiB") && e.contains("80.0 GiB"), "{e}");
        assert!(s(9, 10 << 30).fit(&g, true).is_ok());
        let unknown = Gpu { memory: None, ..g };
        assert!(s(9, 10 << 30).fit(&unknown, false).is_ok());
    }

    #[tokio::test]
    async fn test_shares_are_listed_and_each_gets_an_instance_with_the_quota() {
        let fake = Arc::new(Fake::default());
        *fake.gpus.lock().unwrap() = vec![gpu(0), gpu(1)];
        let s = shared_with(fake.clone(), share_cfg(3, 10));
        s.poll().await;
        let ids: Vec<String> = health(&s).into_iter().map(|(id, _)| id).collect();
        assert_eq!(
            ids,
            [
                "GPU-0::0", "GPU-0::1", "GPU-0::2", "GPU-1::0", "GPU-1::1", "GPU-1::2"
            ]
        );
        for bad in [
            alloc(&[&["GPU-0::0", "GPU-0::1"]]),
            alloc(&[&["GPU-0::3"]]),
            alloc(&[&["GPU-0"]]),
            alloc(&[&["GPU-0::01"]]),
            alloc(&[&["GPU-0::0"], &["GPU-0::0"]]),
        ] {
            let e = s.allocate(bad.clone()).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
        assert!(fake.instances.lock().unwrap().is_empty());
        let r = s
            .allocate(alloc(&[&["GPU-1::0"], &["GPU-1::2"]]))
            .await
            .unwrap();
        let inst = fake.instances.lock().unwrap().clone();
        assert_eq!(inst.len(), 2);
        for (i, c) in inst.iter().zip(&r.container_responses) {
            assert_eq!(c.cdi_devices[0].name, format!("nvproxy.dev/gpu={}", i.name));
            assert_eq!(i.gpus, [1]);
            assert_eq!(fake.quotas.lock().unwrap()[&i.name], Some(10 << 30));
        }
        assert!(inst[0].name.starts_with("k8sshare-0-"), "{}", inst[0].name);
        assert!(inst[1].name.starts_with("k8sshare-2-"), "{}", inst[1].name);
        // A plugin started afresh finds which share each instance is.
        let again = shared_with(fake.clone(), share_cfg(3, 10));
        again.poll().await;
        let owned: Vec<BTreeSet<String>> = lock(&again.state)
            .owned
            .values()
            .map(|o| o.ids.clone())
            .collect();
        let set = |id: &str| BTreeSet::from([id.to_owned()]);
        assert!(owned.contains(&set("GPU-1::0")) && owned.contains(&set("GPU-1::2")));
        // The whole-GPU resource's plugin does not take share instances for its own.
        let whole = shared(fake.clone());
        whole.poll().await;
        assert!(lock(&whole.state).owned.is_empty());
        // A down worker makes its share unhealthy, not its GPU's other shares.
        fake.instances.lock().unwrap()[0].up = false;
        again.poll().await;
        let h = health(&again);
        assert_eq!(h[3], ("GPU-1::0".to_owned(), "Unhealthy".to_owned()));
        assert!(
            h.iter().filter(|(_, h)| h == "Unhealthy").count() == 1,
            "{h:?}"
        );
        // The driver loses GPU 1: all its shares are unhealthy, GPU 0's are not.
        fake.gpus.lock().unwrap().pop();
        again.poll().await;
        let h = health(&again);
        assert!(h[..3].iter().all(|(_, h)| h == "Healthy"), "{h:?}");
        assert!(h[3..].iter().all(|(_, h)| h == "Unhealthy"), "{h:?}");
        let e = again.allocate(alloc(&[&["GPU-1::1"]])).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
    }

    #[tokio::test]
    async fn test_shares_past_the_gpus_memory_are_unhealthy_without_overcommit() {
        let fake = Arc::new(Fake::default());
        *fake.gpus.lock().unwrap() = vec![gpu(0)];
        fake.no_overcommit
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let s = shared_with(fake.clone(), share_cfg(3, 30));
        s.poll().await;
        assert!(health(&s).iter().all(|(_, h)| h == "Unhealthy"));
        let e = s.allocate(alloc(&[&["GPU-0::0"]])).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("overcommit"), "{e:?}");
        fake.no_overcommit
            .store(false, std::sync::atomic::Ordering::SeqCst);
        s.poll().await;
        assert!(health(&s).iter().all(|(_, h)| h == "Healthy"));
        s.allocate(alloc(&[&["GPU-0::0"]])).await.unwrap();
    }
}
