//! `nvproxy device-plugin` against a kubelet's side of the device plugin API, natively: a real
//! `nvproxy serve` (simulated driver, 4 GPUs, socket-transport instances) in a mount namespace
//! of its own with a fresh tmpfs on `/run` (the host's `/run/nvproxy` is never touched), the
//! plugin as its own process, and here, written from the same API: the kubelet's
//! `Registration` server, a `DevicePlugin` client and a fake PodResources server.
//!
//! What is checked: registration (version, resource, endpoint, options); `ListAndWatch` lists
//! one healthy device per GPU, named by UUID; `GetPreferredAllocation` picks near GPUs;
//! `Allocate` of 1 and of 2 GPUs answers with nothing but the CDI name of a fresh instance of
//! exactly those GPUs, which serves (`nvfe-client init`); instances of pods the kubelet no
//! longer lists are removed, and a device allocated again gets a fresh instance; a killed
//! worker turns its device Unhealthy and Healthy again; a kubelet restart (sockets removed,
//! `kubelet.sock` re-created) and a plugin restart each re-register and lose no instance.
//!
//! Needs root (namespaces, `process_vm_readv`, `pidfd_getfd`), `unshare`/`nsenter`
//! (util-linux) and the binaries (`cargo build -p daemon -p preload`).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tests::harness::nvproxy_bin_with_shim;

use device_plugin::api::podresources::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
    pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
};
use device_plugin::api::v1beta1::{
    self, AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    ListAndWatchResponse, PreferredAllocationRequest, RegisterRequest,
    device_plugin_client::DevicePluginClient,
    registration_server::{Registration, RegistrationServer},
};
use serde_json::Value;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

const NVFE: &str = env!("CARGO_BIN_EXE_nvfe-client");
const TIMEOUT: Duration = Duration::from_secs(60);
const RESOURCE: &str = "nvproxy.dev/gpu";

/// Polls `f` until it gives something, or panics with `what` after [`TIMEOUT`].
async fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < TIMEOUT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the suite can run here (root, util-linux's tools); says why not.
fn runnable() -> bool {
    tests::harness::runnable("namespaces, pidfd_getfd", &["unshare", "nsenter"])
}

fn sigterm_and_wait(child: &mut Child) -> String {
    // SAFETY: kill sends SIGTERM to a process this test started (its pid).
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let status = child.wait().ok();
    let mut err = String::new();
    let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
    format!("exit {status:?}\n{err}")
}

/// `nvproxy serve` in its own mount namespace, and the scratch directory; both gone on drop.
struct Served {
    child: Option<Child>,
    scratch: PathBuf,
}

impl Served {
    fn start(scratch: &Path) -> Served {
        Served::start_with(scratch, "")
    }

    /// With `daemon` as the config's `[daemon]` table.
    fn start_with(scratch: &Path, daemon: &str) -> Served {
        let cfg = scratch.join("config.toml");
        std::fs::write(
            &cfg,
            format!("driver = \"sim\"\n[daemon]\n{daemon}\n[sim]\ngpus = 4\n[cdi]\nspec = \"\"\n"),
        )
        .expect("config");
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount -t tmpfs -o mode=0755 nvproxy-test /run && exec \"$0\" serve --config \"$1\"")
            .arg(nvproxy_bin_with_shim())
            .arg(&cfg)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning unshare ... nvproxy serve");
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line);
        let mut s = Served {
            child: Some(child),
            scratch: scratch.to_owned(),
        };
        if !line.starts_with("READY") {
            let err = sigterm_and_wait(s.child.as_mut().unwrap());
            panic!("serve did not start: {line:?}\n{err}");
        }
        s
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("serving").id()
    }

    /// The control socket, seen from here.
    fn socket(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/root/run/nvproxy/nvproxy.sock",
            self.pid()
        ))
    }

    /// One instance API request (JSON), its answer.
    fn api(&self, req: &str) -> Value {
        let mut s = UnixStream::connect(self.socket()).expect("the control socket");
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.write_all(format!("{req}\n").as_bytes()).unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).expect("a JSON answer")
    }

    /// Every instance: (name, GPU minors, worker pid).
    fn instances(&self) -> Vec<(String, Vec<u64>, u64)> {
        let a = self.api(r#"{"op":"list"}"#);
        a["instances"]
            .as_array()
            .expect("instances")
            .iter()
            .map(|i| {
                (
                    i["name"].as_str().unwrap().to_owned(),
                    i["gpus"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|g| g.as_u64().unwrap())
                        .collect(),
                    i["pid"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    /// The worker's stats of instance `name`, once it reports.
    async fn stats(&self, name: &str) -> serde_json::Value {
        until(&format!("{name}'s stats"), || {
            let a = self.api(r#"{"op":"list"}"#);
            let i = a["instances"]
                .as_array()?
                .iter()
                .find(|i| i["name"] == name)?;
            i["stats"].is_object().then(|| i["stats"].clone())
        })
        .await
    }

    /// The quota on each GPU of instance `name` (`None`: no quota).
    async fn quotas(&self, name: &str) -> Vec<Option<u64>> {
        let s = self.stats(name).await;
        let m = s["gpu_memory"].as_array().cloned().unwrap_or_default();
        m.iter().map(|g| g["quota"].as_u64()).collect()
    }

    /// The system memory quota of instance `name` (`None`: no quota).
    async fn system_quota(&self, name: &str) -> Option<u64> {
        self.stats(name).await["system_memory_quota"].as_u64()
    }

    fn instance(&self, name: &str) -> Option<(Vec<u64>, u64)> {
        self.instances()
            .into_iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, g, p)| (g, p))
    }

    /// `nvproxy run --instance NAME -- ARGS` in the daemon's namespace.
    fn run(&self, instance: &str, args: &[&str]) -> std::process::Output {
        Command::new("nsenter")
            .arg(format!("--mount=/proc/{}/ns/mnt", self.pid()))
            .arg("--")
            .arg(nvproxy_bin_with_shim())
            .args(["run", "--instance", instance, "--"])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .expect("nvproxy run")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            sigterm_and_wait(&mut c);
        }
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// The kubelet's Registration service: passes each request on.
struct Kubelet(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.0.send(req.into_inner());
        Ok(Response::new(Empty {}))
    }
}

/// Serves Registration on `sock` until the returned sender is dropped or sent to.
fn start_kubelet(
    sock: &Path,
    tx: mpsc::UnboundedSender<RegisterRequest>,
) -> tokio::sync::oneshot::Sender<()> {
    let incoming = device_plugin::serve_on(sock).expect("binding kubelet.sock");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder().serve_with_incoming_shutdown(
            RegistrationServer::new(Kubelet(tx)),
            incoming,
            async {
                let _ = stopped.await;
            },
        ),
    );
    stop
}

/// The kubelet's PodResources: whatever the test puts in; counts the calls.
#[derive(Clone, Default)]
struct Pods {
    pods: Arc<Mutex<Vec<PodResources>>>,
    calls: Arc<Mutex<u64>>,
}

impl Pods {
    fn set(&self, pods: &[(&str, &[&str])]) {
        self.set_of(RESOURCE, pods);
    }

    /// Pods holding devices of `resource`.
    fn set_of(&self, resource: &str, pods: &[(&str, &[&str])]) {
        *self.pods.lock().unwrap() = pods
            .iter()
            .map(|(name, ids)| PodResources {
                name: name.to_string(),
                namespace: "default".into(),
                containers: vec![ContainerResources {
                    name: "main".into(),
                    devices: vec![ContainerDevices {
                        resource_name: resource.into(),
                        device_ids: ids.iter().map(|s| s.to_string()).collect(),
                    }],
                }],
            })
            .collect();
    }

    fn calls(&self) -> u64 {
        *self.calls.lock().unwrap()
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Pods {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        *self.calls.lock().unwrap() += 1;
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: self.pods.lock().unwrap().clone(),
        }))
    }
}

/// The plugin process; stopped on drop, its log printed when the test fails.
struct Plugin {
    child: Option<Child>,
    log: PathBuf,
}

impl Plugin {
    fn stop(&mut self) -> String {
        if let Some(mut c) = self.child.take() {
            sigterm_and_wait(&mut c);
        }
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let log = self.stop();
        if std::thread::panicking() {
            eprintln!("--- the plugin's log ---\n{log}");
        }
    }
}

/// The plugin process.
fn start_plugin(served: &Served, dp: &Path, pod_resources: &Path) -> Plugin {
    start_plugin_with(served, dp, pod_resources, &[])
}

/// The plugin process with `extra` arguments.
fn start_plugin_with(served: &Served, dp: &Path, pod_resources: &Path, extra: &[&str]) -> Plugin {
    static STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = served.scratch.join(format!("plugin-{n}.log"));
    let file = std::fs::File::create(&log).expect("plugin log");
    let child = Command::new(nvproxy_bin_with_shim())
        .arg("device-plugin")
        .arg("--socket")
        .arg(served.socket())
        .arg("--device-plugin-dir")
        .arg(dp)
        .arg("--pod-resources-socket")
        .arg(pod_resources)
        .args(["--transport", "socket", "--poll", "50ms"])
        .args(["--reconcile", "100ms", "--grace", "500ms"])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("nvproxy device-plugin");
    Plugin {
        child: Some(child),
        log,
    }
}

type Stream = tonic::codec::Streaming<ListAndWatchResponse>;

/// The next `ListAndWatch` update that `ok` accepts.
async fn next_matching(
    stream: &mut Stream,
    what: &str,
    ok: impl Fn(&ListAndWatchResponse) -> bool,
) -> ListAndWatchResponse {
    let r = tokio::time::timeout(TIMEOUT, async {
        loop {
            match stream.message().await {
                Ok(Some(m)) if ok(&m) => return m,
                Ok(Some(_)) => {}
                other => panic!("ListAndWatch ended waiting for {what}: {other:?}"),
            }
        }
    })
    .await;
    r.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn health_of<'a>(m: &'a ListAndWatchResponse, id: &str) -> Option<&'a str> {
    m.devices
        .iter()
        .find(|d| d.id == id)
        .map(|d| d.health.as_str())
}

async fn client(dp: &Path, endpoint: &str) -> DevicePluginClient<tonic::transport::Channel> {
    let ch = device_plugin::connect(&dp.join(endpoint), Duration::from_secs(10))
        .await
        .expect("connecting to the plugin");
    DevicePluginClient::new(ch)
}

/// The CDI name's instance of a one-container answer; checks that nothing else is in it.
fn allocated_instance(r: &v1beta1::AllocateResponse) -> String {
    allocated_instance_of(r, "k8s-")
}

/// [`allocated_instance`] whose name starts with `prefix`.
fn allocated_instance_of(r: &v1beta1::AllocateResponse, prefix: &str) -> String {
    assert_eq!(r.container_responses.len(), 1, "{r:?}");
    let c = &r.container_responses[0];
    assert!(
        c.devices.is_empty() && c.mounts.is_empty() && c.envs.is_empty(),
        "no host nodes, mounts or env: {c:?}"
    );
    assert_eq!(c.cdi_devices.len(), 1, "{c:?}");
    let name = c.cdi_devices[0]
        .name
        .strip_prefix("nvproxy.dev/gpu=")
        .unwrap_or_else(|| panic!("CDI name {:?}", c.cdi_devices[0].name))
        .to_owned();
    assert!(name.starts_with(prefix), "{name}");
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_the_device_plugin_against_a_kubelet_harness() {
    if !runnable() {
        return;
    }
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("device-plugin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let dp = scratch.join("device-plugins");
    std::fs::create_dir_all(&dp).unwrap();
    std::fs::create_dir_all(scratch.join("pod-resources")).unwrap();
    let served = Served::start(&scratch);

    // The GPUs' device ids, by minor, from the daemon.
    let gpus = served.api(r#"{"op":"gpus"}"#);
    let ids: Vec<String> = gpus["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 4, "{gpus}");
    assert_eq!(gpus["cdi_kind"], "nvproxy.dev/gpu");

    let (reg_tx, mut registrations) = mpsc::unbounded_channel();
    let kubelet_sock = dp.join("kubelet.sock");
    let kubelet = start_kubelet(&kubelet_sock, reg_tx.clone());
    let pods = Pods::default();
    let pr_sock = scratch.join("pod-resources/kubelet.sock");
    let pr_incoming = device_plugin::serve_on(&pr_sock).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .serve_with_incoming(PodResourcesListerServer::new(pods.clone()), pr_incoming),
    );
    let mut plugin = start_plugin(&served, &dp, &pr_sock);
    tokio::time::timeout(Duration::from_secs(300), async {
        // Registration.
        let reg = tokio::time::timeout(TIMEOUT, registrations.recv())
            .await
            .expect("the plugin registers")
            .unwrap();
        assert_eq!(reg.version, "v1beta1");
        assert_eq!(reg.resource_name, RESOURCE);
        assert!(!reg.endpoint.contains('/'), "{reg:?}");
        assert!(reg.options.unwrap().get_preferred_allocation_available);
        let mut dpc = client(&dp, &reg.endpoint).await;
        let opts = dpc
            .get_device_plugin_options(Empty {})
            .await
            .unwrap()
            .into_inner();
        assert!(!opts.pre_start_required);

        // One healthy device per GPU.
        let mut watch = dpc.list_and_watch(Empty {}).await.unwrap().into_inner();
        let first = next_matching(&mut watch, "4 devices", |m| m.devices.len() == 4).await;
        let listed: BTreeSet<&str> = first.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(listed, ids.iter().map(String::as_str).collect());
        assert!(
            first.devices.iter().all(|d| d.health == "Healthy"),
            "{first:?}"
        );

        // Near GPUs: the simulated buses are 18, 2a, 3a, 5d.
        let pref = dpc
            .get_preferred_allocation(PreferredAllocationRequest {
                container_requests: vec![
                    ContainerPreferredAllocationRequest {
                        available_device_ids: ids.clone(),
                        must_include_device_ids: vec![],
                        allocation_size: 2,
                    },
                    ContainerPreferredAllocationRequest {
                        available_device_ids: ids.clone(),
                        must_include_device_ids: vec![ids[3].clone()],
                        allocation_size: 2,
                    },
                ],
            })
            .await
            .unwrap()
            .into_inner();
        let got: Vec<BTreeSet<String>> = pref
            .container_responses
            .iter()
            .map(|c| c.device_ids.iter().cloned().collect())
            .collect();
        let set = |v: &[usize]| v.iter().map(|&i| ids[i].clone()).collect::<BTreeSet<_>>();
        assert_eq!(got, [set(&[1, 2]), set(&[2, 3])]);

        // Allocate 1 GPU, then 2: fresh instances of exactly those GPUs, named by CDI.
        let alloc = |devs: Vec<String>| AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: devs }],
        };
        let one = dpc
            .allocate(alloc(vec![ids[0].clone()]))
            .await
            .unwrap()
            .into_inner();
        let a = allocated_instance(&one);
        // The kubelet lists an allocation once `Allocate` has answered.
        pods.set(&[("a", &[&ids[0]])]);
        assert_eq!(served.instance(&a).map(|(g, _)| g), Some(vec![0]));
        let two = dpc
            .allocate(alloc(vec![ids[2].clone(), ids[1].clone()]))
            .await
            .unwrap()
            .into_inner();
        let b = allocated_instance(&two);
        pods.set(&[("a", &[&ids[0]]), ("b", &[&ids[1], &ids[2]])]);
        assert_ne!(a, b);
        assert_eq!(served.instance(&b).map(|(g, _)| g), Some(vec![1, 2]));
        let out = served.run(&b, &[NVFE, "init", "--expect-gpus", "2"]);
        assert!(out.status.success(), "the 2-GPU instance serves: {out:?}");
        // Bad requests are refused with a reason.
        let bad = dpc
            .allocate(alloc(vec!["GPU-nope".into()]))
            .await
            .unwrap_err();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
        let twice = dpc
            .allocate(alloc(vec![ids[3].clone(), ids[3].clone()]))
            .await
            .unwrap_err();
        assert!(twice.message().contains("twice"), "{twice:?}");

        // The kubelet lists both pods: after the grace period and a few reconciliations the
        // instances are still there. Then pod A is gone: its instance is removed.
        let start = Instant::now();
        let calls = pods.calls();
        until("reconciliations after the grace period", || {
            (start.elapsed() > Duration::from_secs(1) && pods.calls() >= calls + 5).then_some(())
        })
        .await;
        assert!(served.instance(&a).is_some() && served.instance(&b).is_some());
        pods.set(&[("b", &[&ids[1], &ids[2]])]);
        until("pod a's instance removed", || {
            served.instance(&a).is_none().then_some(())
        })
        .await;
        assert!(served.instance(&b).is_some());

        // A device allocated again (its earlier pod is gone) gets a fresh instance.
        let again = dpc
            .allocate(alloc(vec![ids[1].clone()]))
            .await
            .unwrap()
            .into_inner();
        let c = allocated_instance(&again);
        pods.set(&[("c", &[&ids[1]])]);
        assert!(
            served.instance(&b).is_none(),
            "the earlier pod's instance is removed"
        );
        assert_eq!(served.instance(&c).map(|(g, _)| g), Some(vec![1]));

        // A killed worker: its device turns Unhealthy, then Healthy with the new worker. (A
        // new stream: the first one holds the updates of the steps above.)
        let mut watch = dpc.list_and_watch(Empty {}).await.unwrap().into_inner();
        next_matching(&mut watch, "every device healthy", |m| {
            m.devices.len() == 4 && m.devices.iter().all(|d| d.health == "Healthy")
        })
        .await;
        let (_, pid) = served.instance(&c).unwrap();
        let raw_pid = libc::pid_t::try_from(pid).expect("a pid");
        // SAFETY: kill sends SIGKILL to the worker pid the daemon reported for an instance
        // this test created.
        assert_eq!(unsafe { libc::kill(raw_pid, libc::SIGKILL) }, 0);
        next_matching(&mut watch, "the killed worker's device unhealthy", |m| {
            health_of(m, &ids[1]) == Some("Unhealthy") && health_of(m, &ids[0]) == Some("Healthy")
        })
        .await;
        next_matching(&mut watch, "the restarted worker's device healthy", |m| {
            health_of(m, &ids[1]) == Some("Healthy")
        })
        .await;
        let (_, new_pid) = served.instance(&c).unwrap();
        assert_ne!(pid, new_pid, "the worker was restarted");

        // A kubelet restart: it removes every socket of the directory and makes a new
        // kubelet.sock; the plugin registers again, on a new socket, and keeps its instances.
        let _ = kubelet.send(());
        for e in std::fs::read_dir(&dp).unwrap().flatten() {
            std::fs::remove_file(e.path()).unwrap();
        }
        let _kubelet = start_kubelet(&kubelet_sock, reg_tx.clone());
        let reg = tokio::time::timeout(TIMEOUT, registrations.recv())
            .await
            .expect("the plugin registers again after a kubelet restart")
            .unwrap();
        assert_eq!(reg.resource_name, RESOURCE);
        let mut dpc = client(&dp, &reg.endpoint).await;
        let mut watch = dpc.list_and_watch(Empty {}).await.unwrap().into_inner();
        next_matching(&mut watch, "4 healthy devices", |m| {
            m.devices.len() == 4 && m.devices.iter().all(|d| d.health == "Healthy")
        })
        .await;
        assert!(
            served.instance(&c).is_some(),
            "kept over the kubelet restart"
        );

        // A plugin restart: registers again and finds its instance; the pod gone, it removes it.
        plugin.stop();
        assert!(
            !dp.join(&reg.endpoint).exists(),
            "the plugin removes its socket"
        );
        assert!(
            served.instance(&c).is_some(),
            "kept over the plugin restart"
        );
        plugin = start_plugin(&served, &dp, &pr_sock);
        tokio::time::timeout(TIMEOUT, registrations.recv())
            .await
            .expect("the restarted plugin registers")
            .unwrap();
        let calls = pods.calls();
        until("the restarted plugin reconciles", || {
            (pods.calls() >= calls + 3).then_some(())
        })
        .await;
        assert!(served.instance(&c).is_some(), "its pod is still listed");
        pods.set(&[]);
        until(
            "the gone pod's instance removed by the restarted plugin",
            || served.instance(&c).is_none().then_some(()),
        )
        .await;
    })
    .await
    .expect("the test timed out");
    let left: Vec<String> = served.instances().into_iter().map(|(n, _, _)| n).collect();
    assert!(left.is_empty(), "instances left: {left:?}");
    drop(plugin);
}

const SHARE: &str = "nvproxy.dev/gpu-share";

/// The next two registrations, the whole-GPU resource's and the shares'.
async fn both_registrations(
    regs: &mut mpsc::UnboundedReceiver<RegisterRequest>,
) -> (RegisterRequest, RegisterRequest) {
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(
            tokio::time::timeout(TIMEOUT, regs.recv())
                .await
                .expect("the plugin registers both resources")
                .unwrap(),
        );
    }
    got.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
    let share = got.pop().unwrap();
    let whole = got.pop().unwrap();
    assert_eq!(
        (whole.resource_name.as_str(), share.resource_name.as_str()),
        (RESOURCE, SHARE)
    );
    (whole, share)
}

/// `nvproxy.dev/gpu-share`: 3 shares of 10 GiB per GPU next to `nvproxy.dev/gpu`; two shares
/// of one GPU are two instances of it with the quota; a gone pod's share instance is removed
/// and the share can be allocated again; a plugin restart finds the share instances. Shares
/// past the GPU's memory (80 GiB simulated) are refused when the daemon allows no overcommit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_gpu_shares_against_a_kubelet_harness() {
    if !runnable() {
        return;
    }
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("device-plugin-share-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let dp = scratch.join("device-plugins");
    std::fs::create_dir_all(&dp).unwrap();
    std::fs::create_dir_all(scratch.join("pod-resources")).unwrap();
    let served = Served::start_with(&scratch, "overcommit_gpu_memory = false");
    let gpus = served.api(r#"{"op":"gpus"}"#);
    let ids: Vec<String> = gpus["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 4, "{gpus}");
    let share = |g: usize, k: u32| device_plugin::share_id(&ids[g], k);

    let (reg_tx, mut registrations) = mpsc::unbounded_channel();
    let _kubelet = start_kubelet(&dp.join("kubelet.sock"), reg_tx);
    let pods = Pods::default();
    let pr_sock = scratch.join("pod-resources/kubelet.sock");
    let pr_incoming = device_plugin::serve_on(&pr_sock).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .serve_with_incoming(PodResourcesListerServer::new(pods.clone()), pr_incoming),
    );
    const SHARES: [&str; 6] = [
        "--shares-per-gpu",
        "3",
        "--share-gpu-memory",
        "10GiB",
        "--system-memory",
        "8GiB",
    ];
    tokio::time::timeout(Duration::from_secs(300), async {
        // 3 x 30 GiB on an 80 GiB GPU without overcommit: refused, saying why.
        let mut bad = start_plugin_with(
            &served,
            &dp,
            &pr_sock,
            &["--shares-per-gpu", "3", "--share-gpu-memory", "30GiB"],
        );
        let status = until("the overcommitting plugin to exit", || {
            bad.child.as_mut().unwrap().try_wait().unwrap()
        })
        .await;
        let log = bad.stop();
        assert!(!status.success(), "{log}");
        assert!(
            log.contains("90.0 GiB") && log.contains("overcommit"),
            "the reason: {log}"
        );
        let half = std::process::Command::new(nvproxy_bin_with_shim())
            .args(["device-plugin", "--shares-per-gpu", "3"])
            .output()
            .unwrap();
        let why = String::from_utf8_lossy(&half.stderr);
        assert!(
            !half.status.success() && why.contains("--share-gpu-memory"),
            "--shares-per-gpu alone is refused: {why}"
        );

        let mut plugin = start_plugin_with(&served, &dp, &pr_sock, &SHARES);
        let (whole, reg) = both_registrations(&mut registrations).await;
        assert_ne!(whole.endpoint, reg.endpoint);
        assert!(!reg.endpoint.contains('/'), "{reg:?}");
        assert!(!reg.options.unwrap().get_preferred_allocation_available);
        // The whole GPUs are still served.
        let mut gpc = client(&dp, &whole.endpoint).await;
        let mut watch = gpc.list_and_watch(Empty {}).await.unwrap().into_inner();
        next_matching(&mut watch, "4 GPUs", |m| m.devices.len() == 4).await;

        // 3 healthy shares per GPU.
        let mut dpc = client(&dp, &reg.endpoint).await;
        let mut watch = dpc.list_and_watch(Empty {}).await.unwrap().into_inner();
        let first = next_matching(&mut watch, "12 shares", |m| m.devices.len() == 12).await;
        let listed: BTreeSet<String> = first.devices.iter().map(|d| d.id.clone()).collect();
        let want: BTreeSet<String> = (0..4)
            .flat_map(|g| (0..3).map(move |k| (g, k)))
            .map(|(g, k)| share(g, k))
            .collect();
        assert_eq!(listed, want);
        assert!(
            first.devices.iter().all(|d| d.health == "Healthy"),
            "{first:?}"
        );

        // Two shares of GPU 2: two instances of it, each with the 10 GiB quota.
        let alloc = |devs: Vec<String>| AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: devs }],
        };
        let a = allocated_instance_of(
            &dpc.allocate(alloc(vec![share(2, 0)]))
                .await
                .unwrap()
                .into_inner(),
            "k8sshare-0-",
        );
        pods.set_of(SHARE, &[("a", &[&share(2, 0)])]);
        let b = allocated_instance_of(
            &dpc.allocate(alloc(vec![share(2, 1)]))
                .await
                .unwrap()
                .into_inner(),
            "k8sshare-1-",
        );
        pods.set_of(SHARE, &[("a", &[&share(2, 0)]), ("b", &[&share(2, 1)])]);
        assert_ne!(a, b);
        for n in [&a, &b] {
            assert_eq!(served.instance(n).map(|(g, _)| g), Some(vec![2]));
            assert_eq!(served.quotas(n).await, [Some(10 << 30)], "{n}");
            assert_eq!(served.system_quota(n).await, Some(8 << 30), "{n}");
        }
        let out = served.run(&b, &[NVFE, "init", "--expect-gpus", "1"]);
        assert!(out.status.success(), "the share's instance serves: {out:?}");
        let two = dpc
            .allocate(alloc(vec![share(1, 0), share(1, 1)]))
            .await
            .unwrap_err();
        assert!(two.message().contains("one share"), "{two:?}");

        // Both pods listed: kept past the grace period. Pod a gone: its share's instance is
        // removed, b's stays, and the freed share is allocated again as a fresh instance.
        let start = Instant::now();
        let calls = pods.calls();
        until("reconciliations after the grace period", || {
            (start.elapsed() > Duration::from_secs(1) && pods.calls() >= calls + 5).then_some(())
        })
        .await;
        assert!(served.instance(&a).is_some() && served.instance(&b).is_some());
        pods.set_of(SHARE, &[("b", &[&share(2, 1)])]);
        until("pod a's share instance removed", || {
            served.instance(&a).is_none().then_some(())
        })
        .await;
        assert!(served.instance(&b).is_some());
        let c = allocated_instance_of(
            &dpc.allocate(alloc(vec![share(2, 0)]))
                .await
                .unwrap()
                .into_inner(),
            "k8sshare-0-",
        );
        pods.set_of(SHARE, &[("b", &[&share(2, 1)]), ("c", &[&share(2, 0)])]);
        assert_eq!(served.quotas(&c).await, [Some(10 << 30)]);

        // A plugin restart finds both share instances: kept while their pods are listed,
        // removed once they are gone.
        plugin.stop();
        plugin = start_plugin_with(&served, &dp, &pr_sock, &SHARES);
        both_registrations(&mut registrations).await;
        let calls = pods.calls();
        until("the restarted plugin reconciles", || {
            (pods.calls() >= calls + 6).then_some(())
        })
        .await;
        assert!(served.instance(&b).is_some() && served.instance(&c).is_some());
        pods.set_of(SHARE, &[]);
        until("the gone pods' share instances removed", || {
            (served.instance(&b).is_none() && served.instance(&c).is_none()).then_some(())
        })
        .await;
        drop(plugin);
    })
    .await
    .expect("the test timed out");
    let left: Vec<String> = served.instances().into_iter().map(|(n, _, _)| n).collect();
    assert!(left.is_empty(), "instances left: {left:?}");
}
