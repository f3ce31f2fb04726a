//! A proxied ioctl's work on the serving thread past cuse-dev's session, in process: the
//! worker's `NodeDevice` handler (what a CUSE serving thread calls for each request) over a
//! `Proxy` on the simulated driver, with `VmMemory` reading and writing this process's own
//! memory by `process_vm_readv`/`writev`, as the worker reads a client's. Restricted ioctls as
//! on the frontend nodes with `--memory process-vm`: the top-level params come in as the
//! request's data and go back as the reply's. Runs `N` simple controls
//! (`NV0000_CTRL_CMD_SYSTEM_GET_FABRIC_STATUS`) or RM_ALLOC+FREE pairs of `NV01_DEVICE_0`, as
//! nv-bench's kinds, and prints ns per ioctl. For counting instructions with callgrind at two
//! request counts, as `request_cost` (tests/bench/README.md, "Instructions per request"): the
//! difference to `request_cost` is the worker's glue.
//!
//! `cargo run --release -p nvproxy-worker --example node_cost -- [simple|alloc] [N]`

use std::sync::Arc;
use std::time::Instant;

use cuse_dev::{Handler, Ioctl, IoctlReply, Request};
use ioctl_proxy::{InstancePolicy, Proxy};
use nvproxy_abi::ioctl::nv_iowr;
use nvproxy_config::MemoryTransport;
use nvproxy_worker::backend::ProxyBackend;
use nvproxy_worker::device::NodeDevice;
use nvproxy_worker::fdid::FdIdentity;
use nvproxy_worker::mmap::InstanceMmap;
use nvproxy_worker::node::Node;
use nvsim::{SimConfig, SimDriver};

struct Client {
    dev: NodeDevice,
    req: Request,
    fh: u64,
}

impl Client {
    /// One restricted `_IOWR` ioctl whose top-level params are `top` (at its own address, as
    /// the kernel copies them in); `top` gets the reply's bytes.
    fn ioctl(&self, cmd: u32, top: &mut [u8]) {
        let arg = top.as_ptr() as u64;
        let io = Ioctl {
            fh: self.fh,
            cmd,
            arg,
            flags: 0,
            in_data: top,
            out_size: u32::try_from(top.len()).expect("small"),
            retry: None,
        };
        match self.dev.ioctl(&self.req, &io) {
            Ok(IoctlReply::Done { result: 0, out }) => {
                if !out.is_empty() {
                    top.copy_from_slice(&out);
                }
            }
            other => panic!("ioctl {cmd:#x}: {other:?}"),
        }
    }

    /// NVOS64 alloc of `class` under `parent` with `params`; returns the new handle.
    fn alloc(&self, client: u32, parent: u32, class: u32, params: &mut [u8]) -> u32 {
        let mut p = [0u8; 48];
        p[0..4].copy_from_slice(&client.to_ne_bytes());
        p[4..8].copy_from_slice(&parent.to_ne_bytes());
        p[12..16].copy_from_slice(&class.to_ne_bytes());
        if !params.is_empty() {
            p[16..24].copy_from_slice(&(params.as_ptr() as u64).to_ne_bytes());
            p[32..36].copy_from_slice(&u32::try_from(params.len()).expect("small").to_ne_bytes());
        }
        self.ioctl(nv_iowr(0x2b, 48), &mut p);
        assert_eq!(
            u32::from_ne_bytes(p[40..44].try_into().unwrap()),
            0,
            "alloc status"
        );
        u32::from_ne_bytes(p[8..12].try_into().unwrap())
    }

    fn free(&self, client: u32, parent: u32, object: u32) {
        let mut p = [0u8; 16];
        p[0..4].copy_from_slice(&client.to_ne_bytes());
        p[4..8].copy_from_slice(&parent.to_ne_bytes());
        p[8..12].copy_from_slice(&object.to_ne_bytes());
        self.ioctl(nv_iowr(0x29, 16), &mut p);
        assert_eq!(
            u32::from_ne_bytes(p[12..16].try_into().unwrap()),
            0,
            "free status"
        );
    }

    fn control(&self, client: u32, object: u32, cmd: u32, params: &mut [u8]) {
        let mut p = [0u8; 32];
        p[0..4].copy_from_slice(&client.to_ne_bytes());
        p[4..8].copy_from_slice(&object.to_ne_bytes());
        p[8..12].copy_from_slice(&cmd.to_ne_bytes());
        p[16..24].copy_from_slice(&(params.as_ptr() as u64).to_ne_bytes());
        p[24..28].copy_from_slice(&u32::try_from(params.len()).expect("small").to_ne_bytes());
        self.ioctl(nv_iowr(0x2a, 32), &mut p);
        assert_eq!(
            u32::from_ne_bytes(p[28..32].try_into().unwrap()),
            0,
            "control status"
        );
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "simple".into());
    let n: u32 = args.next().map_or(10_000, |a| a.parse().expect("N"));
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let policy = InstancePolicy::new("bench", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![0]);
    let proxy = Arc::new(Proxy::for_host(policy, sim).expect("proxy"));
    let backend = Arc::new(ProxyBackend::new(proxy));
    let fdid = Arc::new(FdIdentity::new().expect("fd identity"));
    let mmap = Arc::new(InstanceMmap::new("bench").expect("mmap state"));
    let node = |n| {
        NodeDevice::new(
            n,
            backend.clone(),
            fdid.clone(),
            MemoryTransport::ProcessVm,
            mmap.clone(),
        )
    };
    let (dev, gpu) = (node(Node::Ctl), node(Node::Gpu(0)));
    let tid = u32::try_from(nix::unistd::gettid().as_raw()).expect("a tid");
    let req = Request::detached(1, tid, 0, 0);
    let fh = dev.open(&req, 0).expect("open").fh;
    // The GPU's node open, as libcuda's before it allocates a device.
    let _gpu_fh = gpu.open(&req, 0).expect("open the GPU node").fh;
    let c = Client { dev, req, fh };
    let client = c.alloc(0, 0, 0x41, &mut []);
    let start = Instant::now();
    let ioctls = match kind.as_str() {
        "simple" => {
            let mut params = [0u8; 4];
            for _ in 0..n {
                c.control(client, client, 0x136, &mut params);
            }
            n
        }
        "alloc" => {
            let mut params = [0u8; 56];
            for _ in 0..n {
                params.fill(0);
                let d = c.alloc(client, client, 0x80, &mut params);
                c.free(client, client, d);
            }
            2 * n
        }
        other => panic!("unknown kind {other:?}: simple or alloc"),
    };
    let ns = start.elapsed().as_nanos() / u128::from(ioctls.max(1));
    println!("node_cost {kind}: {ioctls} ioctls, {ns} ns per ioctl");
}
