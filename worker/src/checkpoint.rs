//! `nvproxy instance checkpoint NAME FILE` and `nvproxy instance restore FILE [--remap
//! OLD=NEW ...]`, and the worker's side of them.
//!
//! Both talk to the instance's worker on its socket (`/run/nvproxy/<instance>/worker.sock`,
//! root or the worker's user only), one JSON line each way. The worker saves with
//! `UvmProxy::checkpoint` (the frontend and UVM parts; refused, naming each item, when
//! anything cannot be replayed) and restores *in place*: it replays the checkpoint onto fresh
//! host files of its driver (`ioctl_proxy::Proxy::restore`, `uvm::UvmProxy::restore`), then
//! puts the new proxies behind the instance's nodes, so the tenant's open files (their `fh`
//! are the saved open ids) and handles work again; the old proxies' host files are closed
//! (the driver frees what they held). The tenant must be paused meanwhile (e.g. by
//! `cuda-checkpoint`). The formats are ARCHITECTURE.md "Save and restore by replay".

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ioctl_proxy::checkpoint::MAX_CHECKPOINT_BYTES;
use ioctl_proxy::{Checkpoint, HostDriver, Proxy, RemapRule};
use serde::{Deserialize, Serialize};
use uvm::UvmProxy;

use crate::audit_log::JsonLinesSink;
use crate::backend::{ProxyBackend, UvmBackend};

/// `nvproxy instance checkpoint`.
#[derive(Debug, clap::Args)]
pub struct CheckpointArgs {
    /// The instance.
    pub name: String,
    /// Where to write its state (mode 0600).
    pub file: PathBuf,
    /// The supervisor's control socket: the instance's worker socket is beside it
    /// (`<run dir>/<instance>/worker.sock`).
    #[command(flatten)]
    pub socket: crate::paths::SocketArg,
}

/// `nvproxy instance restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// A file `nvproxy instance checkpoint` wrote; it names its instance, which must be
    /// served.
    pub file: PathBuf,
    /// Restore the saved GPU OLD (its minor or UUID) onto this host's GPU NEW (minor or
    /// UUID); saved GPUs not named go to the host GPU with their UUID.
    #[arg(long, value_name = "OLD=NEW")]
    pub remap: Vec<String>,
    /// The supervisor's control socket: the instance's worker socket is beside it
    /// (`<run dir>/<instance>/worker.sock`).
    #[command(flatten)]
    pub socket: crate::paths::SocketArg,
}

/// A request on the worker socket (besides the plain `stats` line).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Save the instance.
    Checkpoint,
    /// Restore it from `checkpoint` (a checkpoint's JSON text) with `remap` rules.
    Restore {
        /// The checkpoint.
        checkpoint: String,
        /// `OLD=NEW` rules.
        remap: Vec<String>,
    },
}

/// The worker's answer.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Answer {
    /// Whether it was done.
    pub ok: bool,
    /// What was done, or why not.
    pub message: String,
    /// The checkpoint's JSON text (for `checkpoint`).
    #[serde(default)]
    pub checkpoint: Option<String>,
}

/// What a worker needs to save and restore its instance.
pub struct Control {
    name: String,
    frontend: Arc<ProxyBackend>,
    uvm: Arc<UvmBackend>,
    /// The driver the proxies serve (a restore onto a new sim-driver process replaces it).
    host: Mutex<Arc<dyn HostDriver>>,
    sink: Arc<JsonLinesSink>,
    /// One save or restore at a time.
    busy: Mutex<()>,
    /// `[sim] process = true`: the sim-driver's socket. A restore connects to it anew (a
    /// new session, on whatever driver process serves it now: after a driver "reload" a fresh
    /// one), as a restore on a real host opens fresh files of the driver.
    sim_socket: Option<std::path::PathBuf>,
    /// The instance's GPU set (host minors) as configured: a restore creates objects on these
    /// GPUs only, whatever the checkpoint names (`Proxy::restore` refuses the rest).
    gpu_set: Vec<u32>,
}

impl Control {
    /// The control of `running`, served by `host`.
    pub fn new(running: &crate::running::RunningInstance, host: Arc<dyn HostDriver>) -> Self {
        let (frontend, uvm, sink) = running.parts();
        Self::from_parts(running.name(), frontend, uvm, host, sink)
    }

    /// The control of the instance `name` behind these backends.
    pub fn from_parts(
        name: &str,
        frontend: Arc<ProxyBackend>,
        uvm: Arc<UvmBackend>,
        host: Arc<dyn HostDriver>,
        sink: Arc<JsonLinesSink>,
    ) -> Self {
        let gpu_set = frontend.proxy().policy().gpus.clone();
        Control {
            name: name.to_owned(),
            gpu_set,
            frontend,
            uvm,
            host: Mutex::new(host),
            sink,
            busy: Mutex::new(()),
            sim_socket: None,
        }
    }

    /// Restores connect to the sim-driver at `path` anew (`Control::sim_socket`).
    pub fn with_sim_socket(mut self, path: Option<std::path::PathBuf>) -> Self {
        self.sim_socket = path;
        self
    }

    /// The instance's configured GPU set (`[[instance]] gpus`), which restores stay inside
    /// (by default the set the proxy served when the control was made).
    pub fn with_gpu_set(mut self, gpus: Vec<u32>) -> Self {
        self.gpu_set = gpus;
        self
    }

    /// The driver the proxies serve now.
    pub fn host(&self) -> Arc<dyn HostDriver> {
        self.host.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The instance's frontend proxy now.
    pub fn proxy(&self) -> Arc<Proxy> {
        self.frontend.proxy()
    }

    fn checkpoint(&self) -> Answer {
        let _busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        match self.uvm.uvm().checkpoint() {
            Ok(c) => Answer {
                ok: true,
                message: format!(
                    "instance {}: {} opens, {} clients, {} objects, {} UVM opens saved",
                    self.name,
                    c.opens.len(),
                    c.clients.len(),
                    c.clients.iter().map(|c| c.objects.len()).sum::<usize>(),
                    c.uvm.len()
                ),
                checkpoint: Some(c.to_json()),
            },
            Err(e) => Answer {
                message: e.to_string(),
                ..Answer::default()
            },
        }
    }

    fn restore(&self, text: &str, remap: &[String]) -> Answer {
        let _busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        match self.try_restore(text, remap) {
            Ok(message) => Answer {
                ok: true,
                message,
                checkpoint: None,
            },
            Err(e) => Answer {
                message: format!("{e:#}"),
                ..Answer::default()
            },
        }
    }

    fn try_restore(&self, text: &str, remap: &[String]) -> Result<String> {
        let ckpt = Checkpoint::from_json(text)?;
        if ckpt.instance != self.name {
            bail!(
                "the checkpoint is of instance {}, this worker serves {}",
                ckpt.instance,
                self.name
            );
        }
        let rules = remap
            .iter()
            .map(|r| r.parse::<RemapRule>().map_err(anyhow::Error::msg))
            .collect::<Result<Vec<_>>>()?;
        let old = self.frontend.proxy();
        let host: Arc<dyn HostDriver> = match &self.sim_socket {
            Some(p) => Arc::new(
                crate::simd::RemoteSim::connect(p)
                    .with_context(|| format!("the sim-driver at {}", p.display()))?,
            ),
            None => self.host(),
        };
        // The configured set, not the proxy's GPUs now (a remap inside the set reorders them)
        // nor the checkpoint's.
        let mut policy = old.policy().clone();
        policy.gpus = self.gpu_set.clone();
        let restored = Proxy::restore(&ckpt, policy, host.clone(), &rules)?;
        let pairs = restored.gpus;
        let proxy = Arc::new(restored.proxy.with_audit(self.sink.clone()));
        let uvm = match UvmProxy::restore(proxy.clone(), &ckpt, &pairs) {
            Ok(u) => Arc::new(u),
            Err(e) => {
                proxy.release_all();
                return Err(e.into());
            }
        };
        let old = self.frontend.replace(proxy.clone());
        let old_uvm = self.uvm.replace(uvm);
        *self.host.lock().unwrap_or_else(|e| e.into_inner()) = host;
        // The old proxies' host files go: the driver frees what they held.
        let dropped = old_uvm.release_all() + old.release_all();
        let moved: Vec<String> = pairs
            .iter()
            .map(|(o, n)| {
                format!(
                    "{} (minor {}) -> {} (minor {})",
                    o.uuid, o.minor, n.uuid, n.minor
                )
            })
            .collect();
        tracing::info!(instance = %self.name, objects = proxy.object_count(), old_files = dropped, "restored from a checkpoint");
        Ok(format!(
            "instance {}: {} opens and {} RM clients/objects restored; GPUs {}",
            self.name,
            ckpt.opens.len() + ckpt.uvm.len(),
            proxy.object_count(),
            moved.join(", ")
        ))
    }

    /// Answers one request line on the worker socket.
    pub fn answer(&self, line: &str) -> Answer {
        match serde_json::from_str::<Request>(line) {
            Ok(Request::Checkpoint) => self.checkpoint(),
            Ok(Request::Restore { checkpoint, remap }) => self.restore(&checkpoint, &remap),
            Err(e) => Answer {
                message: format!("bad request: {e}"),
                ..Answer::default()
            },
        }
    }
}

/// Reads one request line of at most a checkpoint's size.
pub fn read_request(conn: &UnixStream) -> Option<String> {
    let mut line = String::new();
    let mut r = BufReader::new(conn.take(MAX_CHECKPOINT_BYTES as u64 + 4096));
    r.read_line(&mut line).ok()?;
    Some(line)
}

/// The run directory a control socket is in.
fn run_dir_of(socket: &crate::paths::SocketArg) -> PathBuf {
    match &socket.socket {
        Some(s) => s
            .parent()
            .map_or_else(|| crate::paths::host_run_dir(None), Path::to_path_buf),
        None => crate::paths::host_run_dir(None),
    }
}

fn call(run_dir: &Path, instance: &str, req: &Request) -> Result<Answer> {
    let path = crate::paths::run_dir(run_dir, instance).join(crate::paths::WORKER_SOCKET);
    let mut s = UnixStream::connect(&path).with_context(|| {
        format!(
            "connecting to {} (is instance {instance} served?)",
            path.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut text = serde_json::to_string(req)?;
    text.push('\n');
    s.write_all(text.as_bytes())?;
    let mut line = String::new();
    BufReader::new(s.take(MAX_CHECKPOINT_BYTES as u64 + 4096)).read_line(&mut line)?;
    if line.is_empty() {
        bail!("the worker closed the connection without an answer (not root?)");
    }
    serde_json::from_str(&line).context("the worker's answer")
}

/// `nvproxy instance checkpoint NAME FILE`.
pub fn checkpoint(args: &CheckpointArgs) -> Result<()> {
    let a = call(&run_dir_of(&args.socket), &args.name, &Request::Checkpoint)?;
    if !a.ok {
        bail!("{}", a.message);
    }
    let text = a.checkpoint.context("the worker sent no checkpoint")?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&args.file)
        .with_context(|| format!("creating {}", args.file.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", args.file.display()))?;
    println!("{} -> {}", a.message, args.file.display());
    Ok(())
}

/// `nvproxy instance restore FILE [--remap OLD=NEW ...]`.
pub fn restore(args: &RestoreArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    // Parsed here too: a bad file is refused before any worker sees it.
    let ckpt = Checkpoint::from_json(&text)?;
    for r in &args.remap {
        r.parse::<RemapRule>().map_err(anyhow::Error::msg)?;
    }
    let req = Request::Restore {
        checkpoint: text,
        remap: args.remap.clone(),
    };
    let a = call(&run_dir_of(&args.socket), &ckpt.instance, &req)?;
    if !a.ok {
        bail!("{}", a.message);
    }
    println!("{}", a.message);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ioctl_proxy::{Caller, ClientMemory, FdError, FdResolver, MemError, Node, OpenId};

    /// Client memory: one buffer at address 0x1000.
    struct Mem(Vec<u8>);
    const AT: u64 = 0x1000;
    impl ClientMemory for Mem {
        fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
            let o = usize::try_from(addr.checked_sub(AT).ok_or(MemError::Fault)?)
                .map_err(|_| MemError::Fault)?;
            self.0
                .get(o..o + len)
                .map(<[u8]>::to_vec)
                .ok_or(MemError::Fault)
        }
        fn reserve_write(&mut self, addr: u64, len: usize) -> Result<(), MemError> {
            self.read(addr, len).map(|_| ())
        }
        fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
            let o = usize::try_from(addr - AT).expect("a test address");
            self.0[o..o + data.len()].copy_from_slice(data);
            Ok(())
        }
    }
    struct NoFds;
    impl FdResolver for NoFds {
        fn resolve(&self, _: i32) -> Result<OpenId, FdError> {
            Err(FdError::Foreign)
        }
    }

    fn rm(proxy: &Proxy, open: OpenId, nr: u8, top: Vec<u8>) -> Vec<u8> {
        let cmd = nvproxy_abi::ioctl::nv_iowr(nr, top.len());
        let mut mem = Mem(top);
        let r = proxy.ioctl(open, &Caller::default(), cmd, AT, &mut mem, &NoFds);
        assert_eq!(r.unwrap(), 0);
        mem.0
    }

    fn rd32(b: &[u8], off: usize) -> u32 {
        u32::from_ne_bytes(b[off..off + 4].try_into().unwrap())
    }

    #[test]
    fn test_worker_restores_in_place_behind_the_same_backends() {
        let sim = nvsim::SimDriver::new(nvsim::SimConfig::default_gpus(1));
        let host: Arc<dyn HostDriver> = sim.clone();
        let policy =
            ioctl_proxy::InstancePolicy::new("job", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0]);
        let proxy = Arc::new(Proxy::for_host(policy, host.clone()).unwrap());
        let frontend = Arc::new(ProxyBackend::new(proxy.clone()));
        let uvm = Arc::new(UvmBackend::new(
            Arc::new(UvmProxy::new(proxy.clone()).unwrap()),
            frontend.clone(),
        ));
        let sink = Arc::new(JsonLinesSink::open(None).unwrap());
        let control = Control::from_parts("job", frontend.clone(), uvm, host, sink);
        // The tenant: a control open and a root client.
        let ctl = proxy.open(Node::Ctl).unwrap();
        let mut alloc = vec![0u8; 48];
        alloc[12..16].copy_from_slice(&0x41u32.to_ne_bytes());
        let out = rm(&proxy, ctl, 0x2b, alloc);
        let client = rd32(&out, 8);
        drop(proxy);

        let a = control.answer(r#"{"cmd":"checkpoint"}"#);
        assert!(a.ok, "{}", a.message);
        let req = serde_json::to_string(&Request::Restore {
            checkpoint: a.checkpoint.unwrap(),
            remap: vec![],
        })
        .unwrap();
        let a = control.answer(&req);
        assert!(a.ok, "{}", a.message);
        // The same backend serves a new proxy; the tenant's open and client handle work on
        // it (the old client was still alive when the new one was made: translated), and the
        // old proxy's client is gone from the driver.
        let now = frontend.proxy();
        assert!(now.translates_clients());
        assert_eq!(sim.live_clients(), 1, "the old proxy's client was freed");
        let mut free = vec![0u8; 16];
        free[0..4].copy_from_slice(&client.to_ne_bytes());
        free[8..12].copy_from_slice(&client.to_ne_bytes());
        let out = rm(&now, ctl, 0x29, free);
        assert_eq!(
            rd32(&out, 12),
            0,
            "free of the old client handle on the new proxy"
        );
        assert_eq!(sim.live_clients(), 0);
        now.release(ctl);
        assert_eq!(sim.stats(), nvsim::SimStats::default());
    }

    /// A worker's control of instance `name` on `gpus` of `sim`, with a root client of the
    /// tenant on a control open.
    fn instance_on(
        sim: &Arc<nvsim::SimDriver>,
        name: &str,
        gpus: Vec<u32>,
    ) -> (Control, Arc<ProxyBackend>, OpenId) {
        let host: Arc<dyn HostDriver> = sim.clone();
        let policy =
            ioctl_proxy::InstancePolicy::new(name, nvproxy_abi::Caps::COMPUTE_UTILITY, gpus);
        let proxy = Arc::new(Proxy::for_host(policy, host.clone()).unwrap());
        let frontend = Arc::new(ProxyBackend::new(proxy.clone()));
        let uvm = Arc::new(UvmBackend::new(
            Arc::new(UvmProxy::new(proxy.clone()).unwrap()),
            frontend.clone(),
        ));
        let sink = Arc::new(JsonLinesSink::open(None).unwrap());
        let control = Control::from_parts(name, frontend.clone(), uvm, host, sink);
        let ctl = proxy.open(Node::Ctl).unwrap();
        let mut alloc = vec![0u8; 48];
        alloc[12..16].copy_from_slice(&0x41u32.to_ne_bytes());
        rm(&proxy, ctl, 0x2b, alloc);
        (control, frontend, ctl)
    }

    fn restore_req(checkpoint: String, remap: &[&str]) -> String {
        serde_json::to_string(&Request::Restore {
            checkpoint,
            remap: remap.iter().map(|r| r.to_string()).collect(),
        })
        .unwrap()
    }

    /// Issue 20, items 5 and 6: alpha (GPU 1) and beta (GPU 0) on one host. Alpha's checkpoint
    /// with its `instance` edited to beta, and beta's own checkpoint remapped onto GPU 1, are
    /// refused by beta's worker naming both sets; nothing is created and beta serves on.
    #[test]
    fn test_a_restore_stays_inside_the_instances_gpu_set() {
        let sim = nvsim::SimDriver::new(nvsim::SimConfig::default_gpus(2));
        let (alpha, _alpha_fe, _) = instance_on(&sim, "alpha", vec![1]);
        let (beta, beta_fe, _) = instance_on(&sim, "beta", vec![0]);
        let saved = alpha.answer(r#"{"cmd":"checkpoint"}"#);
        assert!(saved.ok, "{}", saved.message);
        let mut edited: serde_json::Value =
            serde_json::from_str(saved.checkpoint.as_deref().unwrap()).unwrap();
        edited["instance"] = "beta".into();
        let before = sim.stats();
        let proxy_before = Arc::as_ptr(&beta_fe.proxy());
        let uuid = |m: usize| sim.config().gpus[m].uuid_string();

        let a = beta.answer(&restore_req(edited.to_string(), &[]));
        assert!(
            !a.ok,
            "alpha's checkpoint was restored into beta: {}",
            a.message
        );
        assert!(
            a.message
                .contains(&format!("GPU set is [minor 0 {}]", uuid(0)))
                && a.message
                    .contains(&format!("checkpoint's GPUs [minor 1 {}]", uuid(1))),
            "{}",
            a.message
        );
        let own = beta.answer(r#"{"cmd":"checkpoint"}"#);
        let a = beta.answer(&restore_req(own.checkpoint.unwrap(), &["0=1"]));
        assert!(
            !a.ok,
            "a remap onto alpha's GPU was accepted: {}",
            a.message
        );
        assert!(
            a.message
                .contains(&format!("would be restored onto [minor 1 {}]", uuid(1))),
            "{}",
            a.message
        );
        assert_eq!(sim.stats(), before, "the refused restores created nothing");
        assert_eq!(
            Arc::as_ptr(&beta_fe.proxy()),
            proxy_before,
            "beta serves on"
        );
    }

    #[test]
    fn test_requests_round_trip_as_one_json_line() {
        let r = Request::Restore {
            checkpoint: "{\n}".into(),
            remap: vec!["0=1".into()],
        };
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains('\n'));
        assert!(matches!(
            serde_json::from_str::<Request>(&text).unwrap(),
            Request::Restore { remap, .. } if remap == ["0=1"]
        ));
        assert!(matches!(
            serde_json::from_str::<Request>("{\"cmd\":\"checkpoint\"}").unwrap(),
            Request::Checkpoint
        ));
    }
}
