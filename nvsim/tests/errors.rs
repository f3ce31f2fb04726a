//! Every failure the simulator models, with the exact errno or NV status of the driver.

mod common;

use common::*;
use host_driver::{HostCall, HostDriver, NodeKind};
use nvproxy_abi::ioctl::*;
use nvproxy_abi::structs::*;
use nvsim::control::cmd;
use nvsim::status::*;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

// ---- errnos of the frontend ---------------------------------------------------------------

#[test]
fn test_open_minor_without_gpu_is_enodev() {
    let d = sim(1);
    assert_eq!(
        d.open(NodeKind::Gpu(1)).unwrap_err().raw_os_error(),
        Some(ENODEV)
    );
}

#[test]
fn test_uvm_command_outside_the_table_is_einval() {
    // The UVM file model is in tests/uvm.rs; UVM_POPULATE_PAGEABLE (0x47) is a driver
    // command outside every table, an escape number on it no UVM command at all.
    let d = sim(1);
    let uvm = open(&d, NodeKind::Uvm);
    let mut call = HostCall {
        cmd: 0x47,
        params: vec![0; 32].into(),
        nested: Default::default(),
    };
    assert_eq!(errno(uvm.ioctl(&mut call)), Some(EINVAL));
    let mut call = esc_call(NV_ESC_CARD_INFO, &[0; 72]);
    assert_eq!(errno(uvm.ioctl(&mut call)), Some(EINVAL));
}

#[test]
fn test_unknown_escape_is_einval() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let mut call = esc_call(0x00, &[]);
    assert_eq!(errno(ctl.ioctl(&mut call)), Some(EINVAL));
}

#[test]
fn test_wrong_ioc_size_is_einval() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let mut call = esc_call(NV_ESC_CHECK_VERSION_STR, &[0; 64]);
    assert_eq!(errno(ctl.ioctl(&mut call)), Some(EINVAL));
    let mut call = esc_call(NV_ESC_RM_ALLOC, &[0; 40]);
    assert_eq!(errno(ctl.ioctl(&mut call)), Some(EINVAL));
    let mut call = esc_call(NV_ESC_RM_CONTROL, &[0; 24]);
    assert_eq!(errno(ctl.ioctl(&mut call)), Some(EINVAL));
}

#[test]
fn test_params_shorter_than_ioc_size_is_efault() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let mut call = esc_call(NV_ESC_RM_FREE, &[0; 16]);
    call.params.truncate(8);
    assert_eq!(errno(ctl.ioctl(&mut call)), Some(EFAULT));
}

#[test]
fn test_control_node_escape_on_gpu_file_is_einval() {
    let d = sim(1);
    let gpu = open(&d, NodeKind::Gpu(0));
    let mut call = esc_call(NV_ESC_CARD_INFO, &[0; 72]);
    assert_eq!(errno(gpu.ioctl(&mut call)), Some(EINVAL));
    let (r, _, _) = alloc_full(&gpu, 0, 0, 0, 0x41, None);
    assert_eq!(errno(r), Some(EINVAL));
}

#[test]
fn test_non_event_alloc_on_gpu_file_is_einval() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (r, _, _) = alloc_full(&s.gpu, s.client, s.device, 0x99, 0x90f1, Some(&[0; 48]));
    assert_eq!(errno(r), Some(EINVAL));
}

#[test]
fn test_version_mismatch_is_einval_with_driver_version() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let mut p = nv_ioctl_rm_api_version_t::new_zeroed();
    p.versionString[..10].copy_from_slice(b"535.216.03");
    let (r, p) = esc(&ctl, NV_ESC_CHECK_VERSION_STR, &p);
    assert_eq!(errno(r), Some(EINVAL));
    assert_eq!(p.reply, NV_RM_API_VERSION_REPLY_RECOGNIZED);
    assert_eq!(cstr(&p.versionString), "535.261.03");
}

#[test]
fn test_relaxed_version_of_other_branch_is_einval() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let mut p = nv_ioctl_rm_api_version_t::new_zeroed();
    p.cmd = u32::from(b'1');
    p.versionString[..5].copy_from_slice(b"550.1");
    assert_eq!(
        errno(esc(&ctl, NV_ESC_CHECK_VERSION_STR, &p).0),
        Some(EINVAL)
    );
}

#[test]
fn test_card_info_smaller_than_gpu_count_is_einval() {
    let d = sim(2);
    let ctl = open(&d, NodeKind::Ctl);
    let mut call = esc_call(NV_ESC_CARD_INFO, &[0xff; 72]);
    assert_eq!(errno(ctl.ioctl(&mut call)), Some(EINVAL));
    assert!(call.params.iter().all(|&b| b == 0));
}

#[test]
fn test_sys_params_changed_memblock_is_ebusy() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let a = nv_ioctl_sys_params_t {
        memblock_size: 1 << 27,
    };
    let b = nv_ioctl_sys_params_t {
        memblock_size: 1 << 28,
    };
    assert_eq!(esc(&ctl, NV_ESC_SYS_PARAMS, &a).0.unwrap(), 0);
    assert_eq!(esc(&ctl, NV_ESC_SYS_PARAMS, &a).0.unwrap(), 0);
    assert_eq!(errno(esc(&ctl, NV_ESC_SYS_PARAMS, &b).0), Some(EBUSY));
}

#[test]
fn test_register_fd_with_unknown_fd_is_einval() {
    let d = sim(1);
    let gpu = open(&d, NodeKind::Gpu(0));
    let (r, _) = esc(
        &gpu,
        NV_ESC_REGISTER_FD,
        &nv_ioctl_register_fd_t { ctl_fd: 3 },
    );
    assert_eq!(errno(r), Some(EINVAL));
}

#[test]
fn test_register_fd_with_gpu_file_as_ctl_is_einval() {
    let d = sim(1);
    let a = open(&d, NodeKind::Gpu(0));
    let b = open(&d, NodeKind::Gpu(0));
    assert_eq!(errno(register(&a, &b)), Some(EINVAL));
}

#[test]
fn test_register_fd_twice_is_einval() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let gpu = open(&d, NodeKind::Gpu(0));
    register(&gpu, &ctl).unwrap();
    assert_eq!(errno(register(&gpu, &ctl)), Some(EINVAL));
}

#[test]
fn test_register_fd_self_or_chained_is_einval() {
    let d = sim(1);
    let c1 = open(&d, NodeKind::Ctl);
    let c2 = open(&d, NodeKind::Ctl);
    assert_eq!(errno(register(&c1, &c1)), Some(EINVAL));
    // A control file may be linked to another one (the driver allows it) ...
    assert_eq!(register(&c1, &c2).unwrap(), 0);
    // ... but not to one that is itself linked.
    let gpu = open(&d, NodeKind::Gpu(0));
    assert_eq!(errno(register(&gpu, &c1)), Some(EINVAL));
}

#[test]
fn test_register_fd_with_other_drivers_ctl_is_einval() {
    let d1 = sim(1);
    let d2 = sim(1);
    let ctl2 = open(&d2, NodeKind::Ctl);
    let gpu1 = open(&d1, NodeKind::Gpu(0));
    assert_eq!(errno(register(&gpu1, &ctl2)), Some(EINVAL));
}

#[test]
fn test_attach_gpus_to_fd_rules() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let gpu = open(&d, NodeKind::Gpu(0));
    let ids = |v: &[u32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
    let mut call = esc_call(NV_ESC_ATTACH_GPUS_TO_FD, &ids(&[0x1800]));
    assert_eq!(
        errno(gpu.ioctl(&mut call)),
        Some(EINVAL),
        "control node only"
    );
    let mut call = esc_call(NV_ESC_ATTACH_GPUS_TO_FD, &ids(&[0x1800, 0x4200]));
    assert_eq!(errno(ctl.ioctl(&mut call)), Some(EINVAL), "unknown GPU id");
    let mut call = esc_call(NV_ESC_ATTACH_GPUS_TO_FD, &ids(&[0x1800, 0]));
    assert_eq!(ctl.ioctl(&mut call).unwrap(), 0);
    let mut call = esc_call(NV_ESC_ATTACH_GPUS_TO_FD, &ids(&[0x1800]));
    assert_eq!(
        errno(ctl.ioctl(&mut call)),
        Some(EINVAL),
        "only once per file"
    );
}

#[test]
fn test_status_code_of_unknown_adapter_is_einval() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let mut p = nv_ioctl_status_code_t::new_zeroed();
    p.bus = 0x18;
    let (r, p) = esc(&ctl, NV_ESC_STATUS_CODE, &p);
    assert_eq!((r.unwrap(), p.status), (0, NV_OK));
    let mut q = nv_ioctl_status_code_t::new_zeroed();
    q.bus = 0x77;
    assert_eq!(errno(esc(&ctl, NV_ESC_STATUS_CODE, &q).0), Some(EINVAL));
}

#[test]
fn test_memory_escapes_check_their_node() {
    let d = sim(1);
    let s = stack(&d, 0);
    let mut call = esc_call(NV_ESC_RM_MAP_MEMORY, &[0; 56]);
    assert_eq!(s.ctl.ioctl(&mut call).unwrap(), 0);
    let p = nv_ioctl_nvos33_parameters_with_fd::read_from_bytes(&call.params).unwrap();
    assert_eq!(
        p.params.status, NV_ERR_INVALID_OBJECT,
        "client 0 is unknown (below the bucket-0 client, before 555)"
    );
    let mut call = esc_call(NV_ESC_RM_MAP_MEMORY, &[0; 56]);
    assert_eq!(
        errno(s.gpu.ioctl(&mut call)),
        Some(EINVAL),
        "control node only"
    );
    let mut call = esc_call(NV_ESC_RM_ALLOC_MEMORY, &[0; 56]);
    assert_eq!(s.gpu.ioctl(&mut call).unwrap(), 0);
    let p = nv_ioctl_nvos02_parameters_with_fd::read_from_bytes(&call.params).unwrap();
    assert_eq!(
        p.params.status, NV_ERR_INVALID_CLASS,
        "class 0 is no memory class"
    );
    let mut call = esc_call(NV_ESC_RM_ALLOC_MEMORY, &[0; 56]);
    assert_eq!(errno(s.ctl.ioctl(&mut call)), Some(EINVAL), "GPU node only");
    let mut call = esc_call(NV_ESC_RM_VID_HEAP_CONTROL, &[0; 184]);
    assert_eq!(s.ctl.ioctl(&mut call).unwrap(), 0);
    let p = NVOS32_PARAMETERS::read_from_bytes(&call.params).unwrap();
    assert_eq!(
        p.status, NV_ERR_INVALID_ARGUMENT,
        "function 0 is none of the driver's"
    );
    let mut call = esc_call(NV_ESC_RM_VID_HEAP_CONTROL, &[0; 184]);
    assert_eq!(
        errno(s.gpu.ioctl(&mut call)),
        Some(EINVAL),
        "control node only"
    );
}

// ---- RM statuses: clients, objects, handles ---------------------------------------------

#[test]
fn test_alloc_in_unknown_client_is_invalid_object_handle() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let (s, _) = alloc(&ctl, 0xc1d0_0000, 0xc1d0_0000, 0x1, 0x80, None);
    assert_eq!(s, NV_ERR_INVALID_OBJECT_HANDLE);
}

#[test]
fn test_unknown_client_before_a_larger_one_in_its_bucket_is_invalid_object() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let h = client(&ctl); // 0xc1d00000, bucket 0
    assert_eq!(free(&ctl, h - 0x400, h - 0x400), NV_ERR_INVALID_OBJECT);
    assert_eq!(
        free(&ctl, h + 0x400, h + 0x400),
        NV_ERR_INVALID_OBJECT_HANDLE
    );
}

#[test]
fn test_control_with_unknown_client_is_invalid_client() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let (s, _) = ctrl(&ctl, 0x1234, 0x1234, cmd::SYSTEM_GET_FABRIC_STATUS, &0u32);
    assert_eq!(s, NV_ERR_INVALID_CLIENT);
}

#[test]
fn test_client_of_another_file_is_invalid_client() {
    let d = sim(1);
    let s = stack(&d, 0);
    let other = open(&d, NodeKind::Ctl);
    let (st, _) = ctrl(
        &other,
        s.client,
        s.client,
        cmd::SYSTEM_GET_FABRIC_STATUS,
        &0u32,
    );
    assert_eq!(st, NV_ERR_INVALID_CLIENT);
    let (st, _) = alloc(&other, s.client, s.device, 0x77, 0x90f1, Some(&[0; 48]));
    assert_eq!(st, NV_ERR_INVALID_CLIENT);
    assert_eq!(free(&other, s.client, s.device), NV_ERR_INVALID_CLIENT);
    assert_eq!(d.live_objects(), 2);
}

#[test]
fn test_unknown_parent_is_object_not_found() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = alloc(&s.ctl, s.client, 0xbad, 0x77, 0x90f1, Some(&[0; 48]));
    assert_eq!(st, NV_ERR_OBJECT_NOT_FOUND);
}

#[test]
fn test_parent_of_wrong_class_is_invalid_object_parent() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = alloc(&s.ctl, s.client, s.client, 0x77, 0x2080, None);
    assert_eq!(st, NV_ERR_INVALID_OBJECT_PARENT);
    let (st, _) = alloc(
        &s.ctl,
        s.client,
        s.subdevice,
        0x77,
        0x3e,
        Some(&mem_params(4096, 120)),
    );
    assert_eq!(st, NV_ERR_INVALID_OBJECT_PARENT);
}

#[test]
fn test_object_with_client_handle_is_invalid_object_parent() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = alloc(&s.ctl, s.client, s.device, s.client, 0x90f1, Some(&[0; 48]));
    assert_eq!(st, NV_ERR_INVALID_OBJECT_PARENT);
}

#[test]
fn test_duplicate_handle_is_insert_duplicate_name() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = alloc(
        &s.ctl,
        s.client,
        s.device,
        s.subdevice,
        0x90f1,
        Some(&[0; 48]),
    );
    assert_eq!(st, NV_ERR_INSERT_DUPLICATE_NAME);
    let (st, _) = alloc(&s.ctl, s.client, 0, 0, 0x41, None);
    assert_eq!(
        st, NV_ERR_INSERT_DUPLICATE_NAME,
        "explicit client handle in use"
    );
}

#[test]
fn test_double_free_is_ok_in_compatibility_mode() {
    let d = sim(1);
    let s = stack(&d, 0);
    assert_eq!(free(&s.ctl, s.client, s.subdevice), NV_OK);
    assert_eq!(free(&s.ctl, s.client, s.subdevice), NV_OK);
    assert_eq!(d.live_objects(), 1);
}

#[test]
fn test_free_of_freed_client_is_invalid_object_handle() {
    let d = sim(1);
    let s = stack(&d, 0);
    assert_eq!(free(&s.ctl, s.client, s.client), NV_OK);
    assert_eq!(
        free(&s.ctl, s.client, s.client),
        NV_ERR_INVALID_OBJECT_HANDLE
    );
}

#[test]
fn test_unknown_class_is_invalid_class_with_ioctl_success() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = alloc(&s.ctl, s.client, s.device, 0x77, 0xbeef, None);
    assert_eq!(st, NV_ERR_INVALID_CLASS);
    let (st, _) = alloc(&s.ctl, s.client, s.device, 0x77, 0xcb97, Some(&[0; 16]));
    assert_eq!(st, NV_ERR_INVALID_CLASS, "HOPPER_A (3D) is not simulated");
    // KEPLER_CHANNEL_GROUP_A is (fifo.rs): without an engine, its constructor's answer.
    let (st, _) = alloc(&s.ctl, s.client, s.device, 0x77, 0xa06c, Some(&[0; 20]));
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);
}

#[test]
fn test_required_params_missing_is_invalid_argument() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = alloc(&s.ctl, s.client, s.device, 0x77, 0x40, None);
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);
}

// ---- devices, subdevices, events, memory -------------------------------------------------

#[test]
fn test_device_of_unattached_gpu_is_invalid_class() {
    let d = sim(2);
    let s = stack(&d, 0);
    let mut p = NV0080_ALLOC_PARAMETERS::new_zeroed();
    p.deviceId = 1; // GPU 1: nothing opened it
    let (st, _) = alloc(&s.ctl, s.client, s.client, 0x77, 0x80, Some(p.as_bytes()));
    assert_eq!(st, NV_ERR_INVALID_CLASS);
    p.deviceId = 40;
    let (st, _) = alloc(&s.ctl, s.client, s.client, 0x77, 0x80, Some(p.as_bytes()));
    assert_eq!(st, NV_ERR_INVALID_CLASS);
}

#[test]
fn test_device_of_gpu_not_open_by_the_process_is_insufficient_permissions() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let h = client(&ctl);
    let mut call = esc_call(NV_ESC_ATTACH_GPUS_TO_FD, &0x1800u32.to_ne_bytes());
    ctl.ioctl(&mut call).unwrap(); // attached, but /dev/nvidia0 is not open
    let (st, _) = alloc(
        &ctl,
        h,
        h,
        0x77,
        0x80,
        Some(NV0080_ALLOC_PARAMETERS::new_zeroed().as_bytes()),
    );
    assert_eq!(st, NV_ERR_INSUFFICIENT_PERMISSIONS);
}

#[test]
fn test_second_device_of_same_instance_is_insufficient_resources() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = alloc(&s.ctl, s.client, s.client, 0x77, 0x80, None);
    assert_eq!(st, NV_ERR_INSUFFICIENT_RESOURCES);
}

#[test]
fn test_subdevice_rules() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = alloc(
        &s.ctl,
        s.client,
        s.device,
        0x77,
        0x2080,
        Some(&1u32.to_ne_bytes()),
    );
    assert_eq!(st, NV_ERR_INVALID_CLASS, "only subdevice 0 exists");
    let (st, _) = alloc(
        &s.ctl,
        s.client,
        s.device,
        0x77,
        0x2080,
        Some(&0u32.to_ne_bytes()),
    );
    assert_eq!(
        st, NV_ERR_INSUFFICIENT_RESOURCES,
        "subdevice 0 already allocated"
    );
}

#[test]
fn test_os_event_object_without_registered_fd_is_object_not_found() {
    let d = sim(1);
    let s = stack(&d, 0);
    let mut ep = NV0005_ALLOC_PARAMETERS::new_zeroed();
    ep.hClass = 0x79;
    ep.data = u64::try_from(s.gpu.id()).expect("an open fd");
    let (st, _) = alloc(
        &s.gpu,
        s.client,
        s.subdevice,
        0x77,
        0x79,
        Some(ep.as_bytes()),
    );
    assert_eq!(st, NV_ERR_OBJECT_NOT_FOUND);
    // Through NV01_EVENT with the subclass in the params, once the fd is registered.
    let mut ev = nv_ioctl_alloc_os_event_t::new_zeroed();
    ev.hClient = s.client;
    ev.fd = s.gpu.id();
    assert_eq!(esc(&s.gpu, NV_ESC_ALLOC_OS_EVENT, &ev).1.Status, NV_OK);
    assert_eq!(
        esc(&s.gpu, NV_ESC_ALLOC_OS_EVENT, &ev).1.Status,
        NV_ERR_INSUFFICIENT_RESOURCES,
        "one event per (client, fd)"
    );
    let (st, h) = alloc(
        &s.gpu,
        s.client,
        s.subdevice,
        0x77,
        0x5,
        Some(ep.as_bytes()),
    );
    assert_eq!((st, h), (NV_OK, 0x77));
}

#[test]
fn test_free_unknown_os_event_is_invalid_event() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let mut fe = nv_ioctl_free_os_event_t::new_zeroed();
    fe.hClient = 1;
    fe.fd = 5;
    let (r, fe) = esc(&ctl, NV_ESC_FREE_OS_EVENT, &fe);
    assert_eq!((r.unwrap(), fe.Status), (0, NV_ERR_INVALID_EVENT));
}

#[test]
fn test_video_memory_exhaustion_is_no_memory() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = alloc(
        &s.ctl,
        s.client,
        s.device,
        0x71,
        0x40,
        Some(&mem_params(81 << 30, 120)),
    );
    assert_eq!(st, NV_ERR_NO_MEMORY);
    let (st, _) = alloc(
        &s.ctl,
        s.client,
        s.device,
        0x72,
        0x40,
        Some(&mem_params(60 << 30, 120)),
    );
    assert_eq!(st, NV_OK);
    let (st, _) = alloc(
        &s.ctl,
        s.client,
        s.subdevice,
        0x73,
        0x40,
        Some(&mem_params(30 << 30, 120)),
    );
    assert_eq!(st, NV_ERR_NO_MEMORY);
    assert_eq!(d.allocated_video_memory(0), 60 << 30);
}

#[test]
fn test_memory_params_report_rounded_size() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (_, p, out) = alloc_full(
        &s.ctl,
        s.client,
        s.device,
        0x71,
        0x40,
        Some(&mem_params(5000, 120)),
    );
    assert_eq!(p.status, NV_OK);
    let m = NV_MEMORY_ALLOCATION_PARAMS::read_from_bytes(&out.unwrap()).unwrap();
    assert_eq!((m.size, m.limit), (8192, 8191));
}

// ---- controls -----------------------------------------------------------------------------

#[test]
fn test_unknown_control_is_not_supported() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = control(&s.ctl, s.client, s.subdevice, 0x2080_01ee, &[0; 8]);
    assert_eq!(st, NV_ERR_NOT_SUPPORTED);
    // Known to the driver (GPU_QUERY_ECC_STATUS, 984 bytes on 535) but not simulated.
    let (st, _) = control(&s.ctl, s.client, s.subdevice, 0x2080_012f, &[0; 984]);
    assert_eq!(st, NV_ERR_NOT_SUPPORTED);
}

#[test]
fn test_wrong_params_size_is_invalid_argument() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = control(
        &s.ctl,
        s.client,
        s.subdevice,
        cmd::GPU_GET_NAME_STRING,
        &[0; 68],
    );
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);
    let (st, _) = control(&s.ctl, s.client, s.subdevice, 0x2080_0170, &[0; 16]);
    assert_eq!(
        st, NV_ERR_INVALID_ARGUMENT,
        "size checked for controls RM knows"
    );
    let (st, _) = control(
        &s.ctl,
        s.client,
        s.client,
        cmd::SYSTEM_GET_FABRIC_STATUS,
        &[],
    );
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT, "NULL params, size 0");
}

#[test]
fn test_control_on_object_of_wrong_class_is_not_supported() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = control(
        &s.ctl,
        s.client,
        s.device,
        cmd::GPU_GET_NAME_STRING,
        &[0; 132],
    );
    assert_eq!(st, NV_ERR_NOT_SUPPORTED);
    let (st, _) = ctrl(
        &s.ctl,
        s.client,
        s.subdevice,
        cmd::SYSTEM_GET_FABRIC_STATUS,
        &0u32,
    );
    assert_eq!(st, NV_ERR_NOT_SUPPORTED);
}

#[test]
fn test_control_on_unknown_object_is_object_not_found() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, _) = control(
        &s.ctl,
        s.client,
        0xdead,
        cmd::GPU_GET_NAME_STRING,
        &[0; 132],
    );
    assert_eq!(st, NV_ERR_OBJECT_NOT_FOUND);
}

#[test]
fn test_null_control_command_is_ok() {
    let d = sim(1);
    let ctl = open(&d, NodeKind::Ctl);
    let (st, _) = control(&ctl, 0x1, 0x1, 0x2080_0000, &[]);
    assert_eq!(st, NV_OK);
}

#[test]
fn test_info_list_bounds_are_invalid_argument() {
    let d = sim(1);
    let s = stack(&d, 0);
    let mut gi = vec![0u8; 516];
    let (st, _) = control(&s.ctl, s.client, s.subdevice, cmd::GPU_GET_INFO_V2, &gi);
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT, "empty list");
    gi[..4].copy_from_slice(&1u32.to_ne_bytes());
    gi[4..8].copy_from_slice(&64u32.to_ne_bytes());
    let (st, _) = control(&s.ctl, s.client, s.subdevice, cmd::GPU_GET_INFO_V2, &gi);
    assert_eq!(
        st, NV_ERR_INVALID_ARGUMENT,
        "index >= NV2080_CTRL_GPU_INFO_MAX_LIST_SIZE"
    );
}

#[test]
fn test_id_info_of_unattached_gpu_is_invalid_argument() {
    let d = sim(2);
    let s = stack(&d, 0);
    let mut info = NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS::new_zeroed();
    info.gpuId = d.config().gpus[1].gpu_id();
    let (st, _) = ctrl(&s.ctl, s.client, s.client, cmd::GPU_GET_ID_INFO_V2, &info);
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);
    let mut pci = NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS::new_zeroed();
    pci.gpuId = 0x4242;
    let (st, _) = ctrl(&s.ctl, s.client, s.client, cmd::GPU_GET_PCI_INFO, &pci);
    assert_eq!(st, NV_ERR_OBJECT_NOT_FOUND);
    let mut att = NV0000_CTRL_GPU_ATTACH_IDS_PARAMS::new_zeroed();
    att.gpuIds = [0xffff_ffff; 32];
    att.gpuIds[0] = 0x4242;
    let (st, _) = ctrl(&s.ctl, s.client, s.client, cmd::GPU_ATTACH_IDS, &att);
    assert_eq!(st, NV_ERR_INVALID_ARGUMENT);
}

#[test]
fn test_build_version_buffers_too_small_is_invalid_param_struct() {
    let d = sim(1);
    let s = stack(&d, 0);
    let mut q = NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS::new_zeroed();
    q.sizeOfStrings = 4;
    let (st, _) = control_call(
        &s.ctl,
        s.client,
        s.client,
        cmd::SYSTEM_GET_BUILD_VERSION,
        q.as_bytes(),
        vec![(8, vec![0; 4]), (16, vec![0; 4]), (24, vec![0; 4])],
    );
    assert_eq!(st, NV_ERR_INVALID_PARAM_STRUCT);
}

#[test]
fn test_classlist_too_short_is_invalid_param_struct() {
    let d = sim(1);
    let s = stack(&d, 0);
    let mut cl = NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS::new_zeroed();
    cl.numClasses = 2;
    let (st, _) = control_call(
        &s.ctl,
        s.client,
        s.device,
        cmd::DEVICE_GPU_GET_CLASSLIST,
        cl.as_bytes(),
        vec![(8, vec![0; 8])],
    );
    assert_eq!(st, NV_ERR_INVALID_PARAM_STRUCT);
}

#[test]
fn test_gid_info_sha256_type_is_invalid_flags() {
    let d = sim(1);
    let s = stack(&d, 0);
    let mut gid = NV2080_CTRL_GPU_GET_GID_INFO_PARAMS::new_zeroed();
    gid.flags = 4;
    let (st, _) = ctrl(&s.ctl, s.client, s.subdevice, cmd::GPU_GET_GID_INFO, &gid);
    assert_eq!(st, NV_ERR_INVALID_FLAGS);
}

// ---- dup and share ----------------------------------------------------------------------

fn dup(
    f: &File,
    h_client: u32,
    h_parent: u32,
    h_new: u32,
    src_client: u32,
    src: u32,
) -> NVOS55_PARAMETERS {
    let p = NVOS55_PARAMETERS {
        hClient: h_client,
        hParent: h_parent,
        hObject: h_new,
        hClientSrc: src_client,
        hObjectSrc: src,
        flags: 0,
        status: 0,
    };
    let (r, p) = esc(f, NV_ESC_RM_DUP_OBJECT, &p);
    r.unwrap();
    p
}

#[test]
fn test_dup_memory_shares_the_allocation() {
    let d = sim(1);
    let s = stack(&d, 0);
    let (st, hmem) = alloc(
        &s.ctl,
        s.client,
        s.device,
        0x71,
        0x40,
        Some(&mem_params(1 << 20, 120)),
    );
    assert_eq!(st, NV_OK);
    let c2 = client(&s.ctl);
    let dev2 = device(&s.ctl, c2, 0x10, 0);
    let p = dup(&s.ctl, c2, dev2, 0, s.client, hmem);
    assert_eq!(p.status, NV_OK);
    assert_eq!(p.hObject, 0xcaf0_0000);
    assert_eq!(free(&s.ctl, s.client, hmem), NV_OK);
    assert_eq!(
        d.allocated_video_memory(0),
        1 << 20,
        "the dup still holds it"
    );
    assert_eq!(free(&s.ctl, c2, p.hObject), NV_OK);
    assert_eq!(d.allocated_video_memory(0), 0);
}

#[test]
fn test_dup_errors() {
    let d = sim(1);
    let s = stack(&d, 0);
    let c2 = client(&s.ctl);
    assert_eq!(
        dup(&s.ctl, c2, c2, 0x5, s.client, s.device).status,
        NV_ERR_INVALID_ARGUMENT,
        "devices cannot be copied"
    );
    assert_eq!(
        dup(&s.ctl, c2, c2, 0x5, s.client, 0xbad).status,
        NV_ERR_OBJECT_NOT_FOUND
    );
    assert_eq!(
        dup(&s.ctl, c2, c2, 0x5, 0x1234, 0x1).status,
        NV_ERR_INVALID_OBJECT_HANDLE
    );
    let other = open(&d, NodeKind::Ctl);
    let c3 = client(&other);
    assert_eq!(
        dup(&s.ctl, c3, c3, 0x5, s.client, s.device).status,
        NV_ERR_INVALID_CLIENT
    );
}

#[test]
fn test_share_checks_type_and_handles() {
    let d = sim(1);
    let s = stack(&d, 0);
    let share = |h_object: u32, ty: u16| {
        let mut p = NVOS57_PARAMETERS::new_zeroed();
        p.hClient = s.client;
        p.hObject = h_object;
        p.sharePolicy.r#type = ty;
        p.sharePolicy.target = s.client;
        esc(&s.ctl, NV_ESC_RM_SHARE, &p).1.status
    };
    assert_eq!(share(s.device, 4), NV_OK);
    assert_eq!(share(s.device, 3), NV_OK);
    assert_eq!(share(s.device, 8), NV_ERR_INVALID_ARGUMENT);
    assert_eq!(share(0xbad, 4), NV_ERR_OBJECT_NOT_FOUND);
}
