//! The recording mode (`--record FILE`, `[[instance]] record`): every call that reaches the
//! driver, written as one JSON line each, so that a run on a real GPU gives the bytes a
//! simulated driver's answers can be checked against (or replaced by).
//!
//! The record sits at the driver boundary: [`RecordingDriver`] wraps the instance's
//! [`HostDriver`] and every file it opens, so it sees exactly the [`HostCall`]s the request
//! path (frontend and UVM alike) hands the driver, after translation (fd fields hold host file
//! ids, embedded pointers [`ioctl_proxy::NESTED_PTR_PLACEHOLDER`], the buffers they name
//! listed apart), and the driver's answer in the same buffers. Calls the proxy answers itself
//! (refusals, the identify ioctl) never reach the driver and are not recorded; the audit log
//! has those.
//!
//! One line per event, `op` saying which:
//! - `open` / `open_mapping` / `adopt`: `node` (`nvidiactl`, `nvidia<minor>`, `nvidia-uvm`),
//!   `file` (the host file id), `errno` (null on success);
//! - `ioctl`: `node`, `file`, `cmd` (hex), `name` (`NV_ESC_*` / `UVM_*`, null when the
//!   table has none), for `NV_ESC_RM_CONTROL` `control` and `control_name`, for
//!   `NV_ESC_RM_ALLOC` `class` and `class_name`; `request` and `reply` (the top-level params,
//!   hex), `request_nested` / `reply_nested` (`parent`, `offset`, `data` per buffer), `ret`,
//!   `errno`, `nv_status` and `status_name` (where the params carry a status), `pages` (the
//!   byte count of client pages the call used in place, OS-descriptor memory);
//! - `close`: the daemon dropped its last handle of the file (after a live upgrade, the old
//!   worker's handle: the file stays open in the new one);
//! - `truncated`: the file reached its limit (`--record-limit`, default
//!   [`DEFAULT_LIMIT`]); nothing is recorded after it.
//!
//! Every line carries `seq` (from 0 per process) and `us` (microseconds since recording
//! started in this process); a live upgrade's new worker appends to the same file.

use std::fs::File;
use std::io::{self, Write};
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};
use ioctl_proxy::{HandedFile, HostCall, HostDriver, HostFile, NestedBuf, NodeKind};
use nvproxy_abi::DriverAbi;
use serde_json::{Value, json};

/// The default bound of a record file: 16 MiB (an `nvidia-smi -q` records about 1 MiB).
pub const DEFAULT_LIMIT: u64 = 16 << 20;

/// The file a recording is written to, bounded in size.
pub struct Recorder {
    abi: DriverAbi,
    limit: u64,
    seq: AtomicU64,
    start: Instant,
    out: Mutex<Output>,
}

struct Output {
    file: File,
    /// Bytes in the file (what an earlier process of the instance wrote included).
    written: u64,
    /// The limit was reached and said so.
    full: bool,
}

impl Recorder {
    /// Appends to `path` (created 0600 if missing) up to `limit` bytes in all, naming calls
    /// from `abi`.
    pub fn open(path: &Path, limit: u64, abi: DriverAbi) -> Result<Recorder> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("opening the record file {}", path.display()))?;
        let written = file.metadata()?.len();
        Ok(Recorder {
            abi,
            limit,
            seq: AtomicU64::new(0),
            start: Instant::now(),
            out: Mutex::new(Output {
                file,
                written,
                full: written >= limit,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Output> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether lines are still written (checked before copying a call's buffers).
    fn active(&self) -> bool {
        !self.lock().full
    }

    /// Writes one event (`seq` and `us` added), or the `truncated` line once when it does not
    /// fit. Write errors are logged once and end the recording: the tenant's calls go on.
    fn write(&self, mut event: Value) {
        let mut out = self.lock();
        if out.full {
            return;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        if let Some(m) = event.as_object_mut() {
            m.insert("seq".into(), seq.into());
            m.insert("us".into(), us.into());
        }
        let mut line = event.to_string();
        line.push('\n');
        let len = line.len() as u64;
        if out.written.saturating_add(len) > self.limit {
            out.full = true;
            tracing::warn!(limit = self.limit, seq, "record file full: recording stops");
            let note = json!({"op": "truncated", "limit": self.limit, "seq": seq, "us": us});
            let _ = out.file.write_all(format!("{note}\n").as_bytes());
            return;
        }
        // One write per line (O_APPEND): a line is never split, whichever thread writes.
        match out.file.write_all(line.as_bytes()) {
            Ok(()) => out.written += len,
            Err(e) => {
                out.full = true;
                tracing::warn!(error = %e, "writing the record file: recording stops");
            }
        }
    }

    fn file_event(&self, op: &str, node: NodeKind, result: &io::Result<Arc<dyn HostFile>>) {
        let (file, errno) = match result {
            Ok(f) => (Some(f.id()), None),
            Err(e) => (None, Some(e.raw_os_error().unwrap_or(libc::EIO))),
        };
        self.write(json!({"op": op, "node": node_name(node), "file": file, "errno": errno}));
    }

    /// The line of one ioctl: `before` as handed to the driver, `after` as it came back.
    fn ioctl_event(
        &self,
        file: &dyn HostFile,
        before: &HostCall,
        after: &HostCall,
        result: &io::Result<i32>,
        pages: Option<u64>,
    ) -> Value {
        let node = file.node();
        let mut ev = json!({
            "op": "ioctl",
            "node": node_name(node),
            "file": file.id(),
            "cmd": format!("{:#010x}", before.cmd),
            "request": hex(&before.params),
            "request_nested": nested(&before.nested),
            "reply": hex(&after.params),
            "reply_nested": nested(&after.nested),
            "ret": result.as_ref().ok(),
            "errno": result.as_ref().err().map(|e| e.raw_os_error().unwrap_or(libc::EIO)),
        });
        let m = ev.as_object_mut().expect("an object");
        let size = before.params.len();
        let (name, status_at) = match node {
            NodeKind::Uvm => (
                self.abi.uvm.get(&before.cmd).map(|u| u.name),
                uvm::status_offset(&self.abi, before.cmd, size),
            ),
            NodeKind::Ctl | NodeKind::Gpu(_) => {
                let nr = nvproxy_abi::ioctl::ioc_nr(before.cmd);
                let name = self.abi.escape(nr).map(|e| e.name);
                (name, name.and_then(|n| escape_status_offset(n, size)))
            }
        };
        m.insert("name".into(), name.into());
        match name {
            Some("NV_ESC_RM_CONTROL") => {
                let cmd = u32_at(
                    &before.params,
                    offset_of!(nvproxy_abi::structs::NVOS54_PARAMETERS, cmd),
                );
                let cname = cmd.and_then(|c| self.abi.controls.get(&c)).map(|c| c.name);
                m.insert("control".into(), cmd.map(|c| format!("{c:#010x}")).into());
                m.insert("control_name".into(), cname.into());
            }
            Some("NV_ESC_RM_ALLOC") => {
                // hClass sits at the same offset in both layouts (NVOS21, NVOS64).
                const {
                    assert!(
                        offset_of!(nvproxy_abi::structs::NVOS21_PARAMETERS, hClass)
                            == offset_of!(nvproxy_abi::structs::NVOS64_PARAMETERS, hClass)
                    )
                };
                let class = u32_at(
                    &before.params,
                    offset_of!(nvproxy_abi::structs::NVOS21_PARAMETERS, hClass),
                );
                let cname = class.and_then(|c| self.abi.classes.get(&c)).map(|c| c.name);
                m.insert("class".into(), class.map(|c| format!("{c:#06x}")).into());
                m.insert("class_name".into(), cname.into());
            }
            _ => {}
        }
        let status = match result {
            Ok(_) => status_at.and_then(|o| u32_at(&after.params, o)),
            Err(_) => None,
        };
        m.insert("nv_status".into(), status.into());
        m.insert(
            "status_name".into(),
            status.and_then(nvproxy_abi::status::status_name).into(),
        );
        if let Some(p) = pages {
            m.insert("pages".into(), p.into());
        }
        ev
    }
}

/// The driver, recorded.
pub struct RecordingDriver {
    inner: Arc<dyn HostDriver>,
    rec: Arc<Recorder>,
}

impl RecordingDriver {
    /// `inner`, with every file it opens or adopts recorded to `rec`.
    pub fn new(inner: Arc<dyn HostDriver>, rec: Arc<Recorder>) -> RecordingDriver {
        RecordingDriver { inner, rec }
    }

    fn wrap(
        &self,
        op: &str,
        node: NodeKind,
        r: io::Result<Arc<dyn HostFile>>,
    ) -> io::Result<Arc<dyn HostFile>> {
        self.rec.file_event(op, node, &r);
        r.map(|inner| {
            Arc::new(RecordingFile {
                inner,
                rec: self.rec.clone(),
            }) as Arc<dyn HostFile>
        })
    }
}

impl HostDriver for RecordingDriver {
    fn version(&self) -> &str {
        self.inner.version()
    }

    fn open(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        self.wrap("open", node, self.inner.open(node))
    }

    fn open_mapping(&self, node: NodeKind) -> io::Result<Arc<dyn HostFile>> {
        self.wrap("open_mapping", node, self.inner.open_mapping(node))
    }

    fn hand_over_driver(&self) -> io::Result<Option<HandedFile>> {
        self.inner.hand_over_driver()
    }

    fn adopt(&self, file: HandedFile) -> io::Result<Arc<dyn HostFile>> {
        let node = file.node;
        self.wrap("adopt", node, self.inner.adopt(file))
    }
}

/// A host file, recorded.
struct RecordingFile {
    inner: Arc<dyn HostFile>,
    rec: Arc<Recorder>,
}

impl std::fmt::Debug for RecordingFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingFile")
            .field("inner", &self.inner)
            .finish()
    }
}

impl HostFile for RecordingFile {
    fn node(&self) -> NodeKind {
        self.inner.node()
    }

    fn id(&self) -> i32 {
        self.inner.id()
    }

    fn ioctl(&self, call: &mut HostCall) -> io::Result<i32> {
        let before = self.rec.active().then(|| call.clone());
        let r = self.inner.ioctl(call);
        if let Some(b) = before {
            let ev = self.rec.ioctl_event(&*self.inner, &b, call, &r, None);
            self.rec.write(ev);
        }
        r
    }

    fn mmap_fd(&self) -> io::Result<(std::os::fd::OwnedFd, u64)> {
        self.inner.mmap_fd()
    }

    fn ioctl_with_pages(
        &self,
        call: &mut HostCall,
        pages: &host_driver::ClientPages,
    ) -> io::Result<i32> {
        let before = self.rec.active().then(|| call.clone());
        let r = self.inner.ioctl_with_pages(call, pages);
        if let Some(b) = before {
            let ev = self
                .rec
                .ioctl_event(&*self.inner, &b, call, &r, Some(pages.len));
            self.rec.write(ev);
        }
        r
    }

    fn hand_over(&self) -> io::Result<HandedFile> {
        self.inner.hand_over()
    }
}

impl Drop for RecordingFile {
    fn drop(&mut self) {
        self.rec.write(json!({
            "op": "close",
            "node": node_name(self.inner.node()),
            "file": self.inner.id(),
        }));
    }
}

/// The node's name under `/dev`, as the record names it.
fn node_name(node: NodeKind) -> String {
    match node {
        NodeKind::Ctl => "nvidiactl".to_owned(),
        NodeKind::Gpu(minor) => format!("nvidia{minor}"),
        NodeKind::Uvm => "nvidia-uvm".to_owned(),
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn nested(bufs: &[NestedBuf]) -> Value {
    bufs.iter()
        .map(|b| json!({"parent": b.parent, "offset": b.offset, "data": hex(&b.data)}))
        .collect()
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    let s = b.get(off..off.checked_add(4)?)?;
    Some(u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

/// Where escape `name`'s params of `size` bytes carry their NV status: the driver's struct
/// of that size (`nvproxy_abi::structs`, checked against every version's headers). `None`
/// for escapes without a status field (`CARD_INFO`, `CHECK_VERSION_STR`, ...) and sizes of no
/// known layout.
fn escape_status_offset(name: &str, size: usize) -> Option<usize> {
    use nvproxy_abi::structs::*;
    macro_rules! at {
        ($t:ty, $($f:tt)+) => {
            (size == size_of::<$t>()).then_some(offset_of!($t, $($f)+))
        };
    }
    let os02 = offset_of!(NVOS02_PARAMETERS, status);
    let os33 = offset_of!(NVOS33_PARAMETERS, status);
    match name {
        "NV_ESC_RM_FREE" => at!(NVOS00_PARAMETERS, status),
        "NV_ESC_RM_CONTROL" => at!(NVOS54_PARAMETERS, status),
        "NV_ESC_RM_ALLOC" => at!(NVOS21_PARAMETERS, status).or(at!(NVOS64_PARAMETERS, status)),
        "NV_ESC_RM_ALLOC_MEMORY" => {
            at!(nv_ioctl_nvos02_parameters_with_fd, params).map(|o| o + os02)
        }
        "NV_ESC_RM_DUP_OBJECT" => at!(NVOS55_PARAMETERS, status),
        "NV_ESC_RM_SHARE" => at!(NVOS57_PARAMETERS, status),
        "NV_ESC_RM_IDLE_CHANNELS" => at!(NVOS30_PARAMETERS, status),
        "NV_ESC_RM_VID_HEAP_CONTROL" => at!(NVOS32_PARAMETERS, status),
        "NV_ESC_RM_MAP_MEMORY" => at!(nv_ioctl_nvos33_parameters_with_fd, params).map(|o| o + os33),
        "NV_ESC_RM_UNMAP_MEMORY" => at!(NVOS34_PARAMETERS, status),
        "NV_ESC_RM_ALLOC_CONTEXT_DMA2" => at!(NVOS39_PARAMETERS, status),
        "NV_ESC_RM_MAP_MEMORY_DMA" => {
            at!(NVOS46_PARAMETERS, status).or(at!(NVOS46_PARAMETERS_V580, status))
        }
        "NV_ESC_RM_UNMAP_MEMORY_DMA" => {
            at!(NVOS47_PARAMETERS, status).or(at!(NVOS47_PARAMETERS_V550, status))
        }
        "NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO" => at!(NVOS56_PARAMETERS, status),
        "NV_ESC_ALLOC_OS_EVENT" => at!(nv_ioctl_alloc_os_event_t, Status),
        "NV_ESC_FREE_OS_EVENT" => at!(nv_ioctl_free_os_event_t, Status),
        "NV_ESC_EXPORT_TO_DMABUF_FD" => at!(nv_ioctl_export_to_dma_buf_fd_t, status)
            .or(at!(nv_ioctl_export_to_dma_buf_fd_t_V570, status))
            .or(at!(nv_ioctl_export_to_dma_buf_fd_t_V580, status)),
        _ => None,
    }
}

/// Wraps `driver`'s host in a recording of `inst`'s calls when the instance asks for one
/// (`[[instance]] record`, `exec --record`); the tables must be chosen (`driver.abi`).
pub fn wrap(
    driver: &mut crate::running::Driver,
    inst: &nvproxy_config::InstanceConfig,
) -> Result<()> {
    let Some(path) = &inst.record else {
        return Ok(());
    };
    let abi =
        match &driver.abi {
            Some(a) => a.clone(),
            None => {
                nvproxy_abi::find(&driver.host.version().trim().parse().map_err(|e| {
                    anyhow::anyhow!("driver version {:?}: {e}", driver.host.version())
                })?)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .tables()
            }
        };
    let limit = inst.record_limit.map_or(DEFAULT_LIMIT, |b| b.0);
    let rec = Arc::new(Recorder::open(path, limit, abi)?);
    tracing::info!(instance = %inst.name, file = %path.display(), limit, "recording driver calls");
    driver.host = Arc::new(RecordingDriver::new(driver.host.clone(), rec));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvproxy_abi::structs::NVOS21_PARAMETERS;

    fn recorded(limit: u64) -> (test_kit::TestDir, std::path::PathBuf, RecordingDriver) {
        let dir = test_kit::TestDir::new("record");
        let path = dir.path().join("calls.jsonl");
        let sim = nvsim::SimDriver::new(nvsim::SimConfig::default_gpus(1));
        let abi = nvproxy_abi::find(&sim.version().parse().unwrap())
            .unwrap()
            .tables();
        let rec = Arc::new(Recorder::open(&path, limit, abi).unwrap());
        (dir, path, RecordingDriver::new(sim, rec))
    }

    /// `NV_ESC_RM_ALLOC` (NVOS21 layout) of class `class` under no parent: a root client.
    fn alloc_call(d: &RecordingDriver, class: u32) -> HostCall {
        let abi = nvproxy_abi::find(&d.version().parse().unwrap())
            .unwrap()
            .tables();
        let size = size_of::<NVOS21_PARAMETERS>();
        let mut params = vec![0u8; size];
        let at = offset_of!(NVOS21_PARAMETERS, hClass);
        params[at..at + 4].copy_from_slice(&class.to_ne_bytes());
        let esc = abi.escape_by_name("NV_ESC_RM_ALLOC").unwrap();
        HostCall {
            cmd: esc.cmd_for_size(u32::try_from(size).unwrap()).unwrap(),
            params: params.into(),
            nested: Default::default(),
        }
    }

    fn lines(path: &Path) -> Vec<Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn test_record_writes_open_ioctl_and_close_with_names_and_status() {
        let (_dir, path, d) = recorded(DEFAULT_LIMIT);
        let ctl = d.open(NodeKind::Ctl).unwrap();
        let mut call = alloc_call(&d, 0x41);
        assert_eq!(ctl.ioctl(&mut call).unwrap(), 0);
        let reply = hex(&call.params);
        drop(ctl);

        let l = lines(&path);
        assert_eq!(l.len(), 3, "{l:?}");
        assert_eq!(
            (l[0]["op"].as_str(), l[0]["node"].as_str()),
            (Some("open"), Some("nvidiactl"))
        );
        let io = &l[1];
        assert_eq!(io["op"], "ioctl");
        assert_eq!(io["name"], "NV_ESC_RM_ALLOC");
        assert_eq!(
            (io["class"].as_str(), io["class_name"].as_str()),
            (Some("0x0041"), Some("NV01_ROOT_CLIENT"))
        );
        assert_eq!(
            io["request"].as_str().unwrap().len(),
            2 * size_of::<NVOS21_PARAMETERS>()
        );
        assert_eq!(io["reply"].as_str(), Some(reply.as_str()));
        assert_eq!(
            (io["nv_status"].as_u64(), io["status_name"].as_str()),
            (Some(0), Some("NV_OK"))
        );
        assert_eq!((io["ret"].as_i64(), io["errno"].as_i64()), (Some(0), None));
        assert_eq!(l[2]["op"], "close");
        assert_eq!(
            l.iter()
                .map(|v| v["seq"].as_u64().unwrap())
                .collect::<Vec<_>>(),
            [0, 1, 2]
        );
    }

    #[test]
    fn test_record_notes_the_drivers_failing_status() {
        let (_dir, path, d) = recorded(DEFAULT_LIMIT);
        let ctl = d.open(NodeKind::Ctl).unwrap();
        let mut call = alloc_call(&d, 0xdead);
        ctl.ioctl(&mut call).unwrap();

        let io = &lines(&path)[1];
        assert_ne!(io["nv_status"].as_u64(), Some(0));
        assert!(
            io["status_name"].as_str().unwrap().starts_with("NV_ERR_"),
            "{io}"
        );
    }

    #[test]
    fn test_record_stops_at_its_limit_with_one_truncated_line() {
        let (_dir, path, d) = recorded(600);
        let ctl = d.open(NodeKind::Ctl).unwrap();
        for _ in 0..10 {
            let mut call = alloc_call(&d, 0x41);
            ctl.ioctl(&mut call).unwrap();
        }
        drop(ctl);

        let l = lines(&path);
        let last = l.last().unwrap();
        assert_eq!(last["op"], "truncated");
        assert_eq!(last["limit"], 600);
        assert_eq!(l.iter().filter(|v| v["op"] == "truncated").count(), 1);
        let kept: usize = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .rev()
            .skip(1)
            .map(|s| s.len() + 1)
            .sum();
        assert!(kept <= 600, "{kept} bytes before the truncated line");
    }
}
