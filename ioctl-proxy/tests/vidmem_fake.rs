//! GPU memory quotas against the recording fake driver (`vidmem.rs`): the bypass attempts by
//! export and import through an fd (the simulated driver does not model them): an object
//! exported to an fd stays counted while that fd's file lives, an import names the same
//! memory, and exports of several counted objects at once are refused under a quota.

mod common;

use common::*;
use ioctl_proxy::*;
use nvproxy_abi::ioctl::nv_iowr;
use nvproxy_abi::status::*;

const GIB: u64 = 1 << 30;
const H_MEM: u32 = 0xcafe_0100;
const H_IMPORTED: u32 = 0xcafe_0200;
const FD_EXPORT: i32 = 9;
/// `NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD`, `_IMPORT_OBJECT_FROM_FD`,
/// `_EXPORT_OBJECTS_TO_FD`.
const EXPORT: u32 = 0x3d05;
const IMPORT: u32 = 0x3d06;
const EXPORT_MANY: u32 = 0x3d0b;

struct Q {
    env: Env,
    client: u32,
    export_ctl: OpenId,
}

fn setup() -> Q {
    let mut policy = InstancePolicy::new("q", nvproxy_abi::Caps::COMPUTE_UTILITY, vec![1]);
    policy.quotas.gpu_memory = Some(10 * GIB);
    let mut env = Env::with(VERSION, policy);
    let ctl = env.ctl;
    let client = env.alloc_client(ctl);
    let export_ctl = env.proxy.open(FrontendNode::Ctl).unwrap();
    env.fds.add(FD_EXPORT, export_ctl);
    Q {
        env,
        client,
        export_ctl,
    }
}

impl Q {
    fn vid(&mut self, h: u32, bytes: u64) -> u32 {
        let mut mp = vec![0u8; 120];
        wr64(&mut mp, 64, bytes);
        let (addr, paddr) = (0x11_0000, 0x12_0000);
        let mut p = vec![0u8; 48];
        wr32(&mut p, 0, self.client);
        wr32(&mut p, 4, self.client);
        wr32(&mut p, 8, h);
        wr32(&mut p, 12, 0x40);
        self.env.mem.map(paddr, &mp);
        wr64(&mut p, 16, paddr);
        wr32(&mut p, 32, 120);
        self.env.mem.map(addr, &p);
        let ctl = self.env.ctl;
        assert_eq!(self.env.ioctl(ctl, nv_iowr(0x2b, 48), addr).unwrap(), 0);
        rd32(&self.env.mem.get(addr, 48), 40)
    }

    fn free(&mut self, h: u32) -> u32 {
        let addr = 0x14_0000;
        let mut p = vec![0u8; 16];
        wr32(&mut p, 0, self.client);
        wr32(&mut p, 4, self.client);
        wr32(&mut p, 8, h);
        self.env.mem.map(addr, &p);
        let ctl = self.env.ctl;
        assert_eq!(self.env.ioctl(ctl, nv_iowr(0x29, 16), addr).unwrap(), 0);
        rd32(&self.env.mem.get(addr, 16), 12)
    }

    fn export(&mut self, h: u32) -> u32 {
        let mut p = vec![0u8; 24];
        wr32(&mut p, 0, 1); // NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM
        wr32(&mut p, 12, h); // data: hDevice 0, hParent 0, hObject
        wr32(&mut p, 16, FD_EXPORT as u32);
        let c = self.client;
        self.env.control(c, c, EXPORT, &p).0
    }

    fn import(&mut self, h: u32) -> u32 {
        let mut p = vec![0u8; 20];
        wr32(&mut p, 0, FD_EXPORT as u32);
        wr32(&mut p, 4, 1);
        wr32(&mut p, 12, self.client); // data[1]: hParent
        wr32(&mut p, 16, h); // data[2]: hObject
        let c = self.client;
        self.env.control(c, c, IMPORT, &p).0
    }

    fn used(&self) -> u64 {
        self.env.proxy.gpu_memory_used()[0].1
    }
}

#[test]
fn test_bypass_an_export_keeps_the_memory_counted_while_the_fd_lives() {
    let mut q = setup();
    assert_eq!(q.vid(H_MEM, 8 * GIB), NV_OK);
    assert_eq!(q.export(H_MEM), NV_OK);
    assert_eq!(q.free(H_MEM), NV_OK);
    assert_eq!(q.used(), 8 * GIB, "the export fd's file holds the memory");
    assert_eq!(q.vid(H_MEM + 1, 4 * GIB), NV_ERR_NO_MEMORY);
    // Closing the export fd's file gives it back.
    q.env.proxy.release(q.export_ctl);
    assert_eq!(q.used(), 0);
    assert_eq!(q.vid(H_MEM + 1, 4 * GIB), NV_OK);
}

#[test]
fn test_bypass_an_import_names_the_exported_memory() {
    let mut q = setup();
    assert_eq!(q.vid(H_MEM, 8 * GIB), NV_OK);
    assert_eq!(q.export(H_MEM), NV_OK);
    assert_eq!(q.import(H_IMPORTED), NV_OK);
    assert_eq!(q.used(), 8 * GIB, "one block, counted once");
    assert_eq!(q.free(H_MEM), NV_OK);
    q.env.proxy.release(q.export_ctl);
    assert_eq!(q.used(), 8 * GIB, "the import still holds it");
    assert_eq!(q.vid(H_MEM + 1, 4 * GIB), NV_ERR_NO_MEMORY);
    assert_eq!(q.free(H_IMPORTED), NV_OK);
    assert_eq!(q.used(), 0);
}

#[test]
fn test_bypass_exporting_several_counted_objects_is_refused_under_a_quota() {
    let mut q = setup();
    assert_eq!(q.vid(H_MEM, 8 * GIB), NV_OK);
    let mut p = vec![0u8; 2128];
    wr32(&mut p, 0, FD_EXPORT as u32);
    wr32(&mut p, 4, q.client); // hDevice
    p[8..10].copy_from_slice(&1u16.to_ne_bytes()); // maxObjects
    wr32(&mut p, 76, H_MEM); // objects[0]
    p[2124..2126].copy_from_slice(&1u16.to_ne_bytes()); // numObjects
    let c = q.client;
    q.env.host.clear();
    assert_eq!(q.env.control(c, c, EXPORT_MANY, &p).0, NV_ERR_NOT_SUPPORTED);
    assert!(q.env.host.controls(EXPORT_MANY).is_empty(), "not forwarded");
}
