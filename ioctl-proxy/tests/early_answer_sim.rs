//! Early answers (`ClientMemory::answer_now`) on `nvsim`: an RM_FREE of an object and an
//! RM_ALLOC that are their instance's only request in flight are answered before the object
//! table is updated, with the table locked from before the answer to after the update (with
//! other requests in flight, after it, holding nothing). Another thread of the client that sends a request as soon as
//! it has the answer waits for the update and finds the table as the answer says; nothing of
//! the call is written after its answer, and it is answered once.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::*;
use ioctl_proxy::*;
use nvproxy_abi::ioctl::nv_iowr;
use nvsim::{SimConfig, SimDriver};

const TOP: u64 = 0x50_0000;
const PARAMS: u64 = 0x60_0000;
const NV01_DEVICE_0: u32 = 0x80;
const NV20_SUBDEVICE_0: u32 = 0x2080;
const H_DEVICE: u32 = 0xd00d_0001;
const H_SUBDEVICE: u32 = 0xd00d_0002;

/// What runs when the call is answered early (the client's next move).
type OnAnswer = Box<dyn FnMut(i32) + Send>;

/// Client memory that can answer early: `on_answer` runs at the answer.
struct AnsweringMem {
    inner: FakeMem,
    on_answer: Option<OnAnswer>,
    /// The return values answered early, in order.
    answered: Vec<i32>,
    /// Writes made after the answer (must stay empty).
    late_writes: Vec<u64>,
    /// Runs when the buffered writes are made (the client's memory is written).
    on_flush: Option<Box<dyn FnMut() + Send>>,
    /// Flushes seen before the answer.
    flushed_before_answer: usize,
}

impl AnsweringMem {
    fn new(on_answer: Option<OnAnswer>) -> Self {
        AnsweringMem {
            inner: FakeMem::new(),
            on_answer,
            answered: Vec::new(),
            late_writes: Vec::new(),
            on_flush: None,
            flushed_before_answer: 0,
        }
    }
}

impl ClientMemory for AnsweringMem {
    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
        self.inner.read(addr, len)
    }
    fn reserve_write(&mut self, addr: u64, len: usize) -> Result<(), MemError> {
        self.inner.reserve_write(addr, len)
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        if !self.answered.is_empty() {
            self.late_writes.push(addr);
        }
        self.inner.write(addr, data)
    }
    fn read_into(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.inner.read_into(addr, buf)
    }
    fn read_for_update_into(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.inner.read_for_update_into(addr, buf)
    }
    fn flush(&mut self) -> Result<(), MemError> {
        if self.answered.is_empty() {
            self.flushed_before_answer += 1;
            if let Some(f) = &mut self.on_flush {
                f();
            }
        }
        self.inner.flush()
    }
    fn answer_now(&mut self, ret: i32) -> bool {
        if !self.answered.is_empty() {
            return false; // answered once
        }
        self.answered.push(ret);
        if let Some(f) = &mut self.on_answer {
            f(ret);
        }
        true
    }
}

fn alloc_top(client: u32, parent: u32, h: u32, class: u32, psize: usize) -> Vec<u8> {
    let mut p = vec![0u8; 48];
    wr32(&mut p, 0, client);
    wr32(&mut p, 4, parent);
    wr32(&mut p, 8, h);
    wr32(&mut p, 12, class);
    if psize > 0 {
        wr64(&mut p, 16, PARAMS);
        wr32(&mut p, 32, u32::try_from(psize).unwrap());
    }
    p
}

fn free_top(client: u32, parent: u32, h: u32) -> Vec<u8> {
    let mut p = vec![0u8; 16];
    wr32(&mut p, 0, client);
    wr32(&mut p, 4, parent);
    wr32(&mut p, 8, h);
    p
}

/// One ioctl on `px` with `top` (and `params` at PARAMS); returns (NV status, memory).
fn call(
    px: &Proxy,
    ctl: OpenId,
    cmd: u32,
    top: &[u8],
    params: &[u8],
    mut mem: AnsweringMem,
) -> (u32, AnsweringMem) {
    mem.inner.map(TOP, top);
    if !params.is_empty() {
        mem.inner.map(PARAMS, params);
    }
    mem.inner.begin_request();
    let r = px.ioctl(ctl, &CALLER, cmd, TOP, &mut mem, &FakeFds::default());
    assert_eq!(r.unwrap(), 0);
    let status_off = top.len() - 4 - usize::from(top.len() == 48) * 4;
    let status = rd32(&mem.inner.get(TOP, top.len()), status_off);
    (status, mem)
}

const RM_ALLOC: u32 = nv_iowr(0x2b, 48);
const RM_FREE: u32 = nv_iowr(0x29, 16);

/// The client's next request, sent from another thread the moment the call is answered. With
/// `blocked`, it must wait for the table (the answering thread holds it while the hook sleeps)
/// and then find it as the answer says; without, the answer came after the books and holds
/// nothing, so it goes through while the answering thread is still in its answer.
fn next_request_at_answer(
    px: &Arc<Proxy>,
    ctl: OpenId,
    top: Vec<u8>,
    params: Vec<u8>,
    result: &Arc<Mutex<Option<u32>>>,
    blocked: bool,
) -> OnAnswer {
    let (px, result) = (Arc::clone(px), Arc::clone(result));
    Box::new(move |_| {
        let done = Arc::new(AtomicBool::new(false));
        let (px, result, d) = (Arc::clone(&px), Arc::clone(&result), Arc::clone(&done));
        let (top, params) = (top.clone(), params.clone());
        thread::spawn(move || {
            let (s, _) = call(&px, ctl, RM_ALLOC, &top, &params, AnsweringMem::new(None));
            *result.lock().unwrap() = Some(s);
            d.store(true, Ordering::SeqCst);
        });
        if blocked {
            thread::sleep(Duration::from_millis(100));
            assert!(
                !done.load(Ordering::SeqCst),
                "the next request went through before the table was updated"
            );
        } else {
            assert!(
                test_kit::eventually(Duration::from_secs(10), || done.load(Ordering::SeqCst)),
                "the next request waited for an answer that holds nothing"
            );
        }
    })
}

/// Runs `first` (cmd, top, params), which must succeed and be answered early, once and with
/// nothing written after; at its answer another thread allocates with `next_top` (4 zero
/// bytes of params), `blocked` as in [`next_request_at_answer`]. Returns that allocation's
/// status.
fn answer_then(
    px: &Arc<Proxy>,
    ctl: OpenId,
    first: (u32, &[u8], &[u8]),
    next_top: Vec<u8>,
    blocked: bool,
) -> u32 {
    let result = Arc::new(Mutex::new(None));
    let hook = next_request_at_answer(px, ctl, next_top, vec![0; 4], &result, blocked);
    let (cmd, top, params) = first;
    let (s, mem) = call(px, ctl, cmd, top, params, AnsweringMem::new(Some(hook)));
    assert_eq!(s, 0);
    assert_eq!(
        (mem.answered.as_slice(), mem.late_writes.len()),
        (&[0][..], 0)
    );
    assert!(
        test_kit::eventually(Duration::from_secs(10), || result.lock().unwrap().is_some()),
        "the next request never finished"
    );
    result.lock().unwrap().expect("finished")
}

#[test]
fn test_a_request_right_after_an_early_answer_sees_the_table_as_answered() {
    // A client that knows its GPU's device instance (as `proxy_sim.rs`'s CUDA-like start).
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let gpu_id = sim.config().gpus[0].gpu_id();
    let mut t = SimTenant::new(&sim, "early", vec![0]);
    let ctl = t.proxy.open(FrontendNode::Ctl).unwrap();
    let (s, client) = t.alloc(ctl, 0, 0, 0x41, &[]);
    assert_eq!(s, 0);
    let mut attach = vec![0xffu8; 132];
    wr32(&mut attach, 0, gpu_id);
    assert_eq!(t.control(ctl, client, client, 0x215, &attach).0, 0);
    let gpu = t.proxy.open(FrontendNode::Gpu(0)).unwrap();
    t.fds.add(3, ctl);
    assert_eq!(t.ioctl(gpu, nv_iowr(0xc9, 4), &3i32.to_ne_bytes()).0, 0);
    let mut info = vec![0u8; 32];
    wr32(&mut info, 0, gpu_id);
    let (s, info) = t.control(ctl, client, client, 0x205, &info);
    assert_eq!(s, 0);
    let mut dev_params = vec![0u8; 56];
    wr32(&mut dev_params, 0, rd32(&info, 8));
    let px = Arc::new(t.proxy);

    // An allocation: the next request allocates a child of the new object.
    let child = alloc_top(client, H_DEVICE, H_SUBDEVICE, NV20_SUBDEVICE_0, 4);
    let device = alloc_top(client, client, H_DEVICE, NV01_DEVICE_0, 56);
    let next = answer_then(
        &px,
        ctl,
        (RM_ALLOC, &device, &dev_params),
        child.clone(),
        true,
    );
    assert_eq!(next, 0, "the child found its parent");
    // A free of the subdevice: the next request allocates the same handle again.
    let free = free_top(client, H_DEVICE, H_SUBDEVICE);
    let next = answer_then(&px, ctl, (RM_FREE, &free, &[]), child.clone(), true);
    assert_eq!(
        next, 0,
        "the handle was free again when the next request came"
    );

    // The client's memory is written before the answer and without the table locked: a
    // request that needs the table (a free of an unknown object) goes through meanwhile.
    let (px2, free2) = (Arc::clone(&px), free_top(client, H_DEVICE, 0xdead_0001));
    let mut mem = AnsweringMem::new(None);
    mem.on_flush = Some(Box::new(move || {
        let (px, top) = (Arc::clone(&px2), free2.clone());
        let t =
            thread::spawn(move || call(&px, ctl, RM_FREE, &top, &[], AnsweringMem::new(None)).0);
        assert!(
            test_kit::eventually(Duration::from_secs(10), || t.is_finished()),
            "the table was locked while the client's memory was written"
        );
        assert_eq!(t.join().unwrap(), 0);
    }));
    let (s, mem) = call(&px, ctl, RM_FREE, &free, &[], mem);
    assert_eq!(s, 0);
    assert_eq!(
        (mem.flushed_before_answer, mem.answered.as_slice()),
        (1, &[0][..])
    );
    let (s, _) = call(&px, ctl, RM_ALLOC, &child, &[0; 4], AnsweringMem::new(None));
    assert_eq!(s, 0);

    // With another request of the instance in flight, the free keeps its books first and
    // answers holding nothing (`Proxy::alone`).
    let busy = px.enter_request().unwrap();
    let next = answer_then(&px, ctl, (RM_FREE, &free, &[]), child, false);
    drop(busy);
    assert_eq!(next, 0, "the handle was free when the answer came");
}
