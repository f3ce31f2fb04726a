//! RM class numbers (`src/common/sdk/nvidia/inc/class/cl*.h`) the request path and the
//! simulator name, defined once for the workspace. The per-version class *tables* (which
//! classes a driver has, with their alloc params) are in [`crate::DriverAbi`].

/// `NV01_ROOT`.
pub const NV01_ROOT: u32 = 0x0000;
/// `NV01_ROOT_NON_PRIV`.
pub const NV01_ROOT_NON_PRIV: u32 = 0x0001;
/// `NV01_CONTEXT_DMA`.
pub const NV01_CONTEXT_DMA: u32 = 0x0002;
/// `NV01_EVENT`: the real class is `NV0005_ALLOC_PARAMETERS.hClass`.
pub const NV01_EVENT: u32 = 0x0005;
/// `NV01_MEMORY_SYSTEM`.
pub const NV01_MEMORY_SYSTEM: u32 = 0x003e;
/// `NV01_MEMORY_LOCAL_USER`.
pub const NV01_MEMORY_LOCAL_USER: u32 = 0x0040;
/// `NV01_ROOT_CLIENT`.
pub const NV01_ROOT_CLIENT: u32 = 0x0041;
/// `NV_MEMORY_EXTENDED_USER`.
pub const NV_MEMORY_EXTENDED_USER: u32 = 0x0042;
/// `NV01_MEMORY_VIRTUAL`.
pub const NV01_MEMORY_VIRTUAL: u32 = 0x0070;
/// `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`.
pub const NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: u32 = 0x0071;
/// `NV01_EVENT_KERNEL_CALLBACK`.
pub const NV01_EVENT_KERNEL_CALLBACK: u32 = 0x0078;
/// `NV01_EVENT_OS_EVENT`.
pub const NV01_EVENT_OS_EVENT: u32 = 0x0079;
/// `NV01_EVENT_KERNEL_CALLBACK_EX`.
pub const NV01_EVENT_KERNEL_CALLBACK_EX: u32 = 0x007e;
/// `NV01_DEVICE_0`.
pub const NV01_DEVICE_0: u32 = 0x0080;
/// `NV_IMEX_SESSION`.
pub const NV_IMEX_SESSION: u32 = 0x00f1;
/// `NV_MEMORY_MULTICAST_FABRIC`.
pub const NV_MEMORY_MULTICAST_FABRIC: u32 = 0x00fd;
/// `NV20_SUBDEVICE_0`.
pub const NV20_SUBDEVICE_0: u32 = 0x2080;
/// `NV50_MEMORY_VIRTUAL`.
pub const NV50_MEMORY_VIRTUAL: u32 = 0x50a0;
/// `GT200_DEBUGGER`.
pub const GT200_DEBUGGER: u32 = 0x83de;
/// `FERMI_CONTEXT_SHARE_A`.
pub const FERMI_CONTEXT_SHARE_A: u32 = 0x9067;
/// `FERMI_VASPACE_A`.
pub const FERMI_VASPACE_A: u32 = 0x90f1;
/// `KEPLER_CHANNEL_GROUP_A`.
pub const KEPLER_CHANNEL_GROUP_A: u32 = 0xa06c;
/// `HOPPER_USERMODE_A`: the page of BAR0 with the GPU's time and the channel doorbell.
pub const HOPPER_USERMODE_A: u32 = 0xc661;
/// `NV_CONFIDENTIAL_COMPUTE`: confidential-computing state and keys, under a client.
pub const NV_CONFIDENTIAL_COMPUTE: u32 = 0xcb33;

#[cfg(test)]
mod tests {
    /// Every class named here is a class of the root version's table (so a typo shows).
    #[test]
    fn test_named_classes_are_in_the_table_with_the_same_name() {
        let t = crate::nodes()[0].tables();
        for (n, c) in [
            ("NV01_ROOT", super::NV01_ROOT),
            ("NV01_ROOT_NON_PRIV", super::NV01_ROOT_NON_PRIV),
            ("NV01_CONTEXT_DMA", super::NV01_CONTEXT_DMA),
            ("NV01_EVENT", super::NV01_EVENT),
            ("NV01_MEMORY_SYSTEM", super::NV01_MEMORY_SYSTEM),
            ("NV01_MEMORY_LOCAL_USER", super::NV01_MEMORY_LOCAL_USER),
            ("NV01_ROOT_CLIENT", super::NV01_ROOT_CLIENT),
            ("NV_MEMORY_EXTENDED_USER", super::NV_MEMORY_EXTENDED_USER),
            ("NV01_MEMORY_VIRTUAL", super::NV01_MEMORY_VIRTUAL),
            (
                "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR",
                super::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR,
            ),
            (
                "NV01_EVENT_KERNEL_CALLBACK",
                super::NV01_EVENT_KERNEL_CALLBACK,
            ),
            ("NV01_EVENT_OS_EVENT", super::NV01_EVENT_OS_EVENT),
            (
                "NV01_EVENT_KERNEL_CALLBACK_EX",
                super::NV01_EVENT_KERNEL_CALLBACK_EX,
            ),
            ("NV01_DEVICE_0", super::NV01_DEVICE_0),
            ("NV_IMEX_SESSION", super::NV_IMEX_SESSION),
            (
                "NV_MEMORY_MULTICAST_FABRIC",
                super::NV_MEMORY_MULTICAST_FABRIC,
            ),
            ("NV20_SUBDEVICE_0", super::NV20_SUBDEVICE_0),
            ("NV50_MEMORY_VIRTUAL", super::NV50_MEMORY_VIRTUAL),
            ("GT200_DEBUGGER", super::GT200_DEBUGGER),
            ("FERMI_CONTEXT_SHARE_A", super::FERMI_CONTEXT_SHARE_A),
            ("FERMI_VASPACE_A", super::FERMI_VASPACE_A),
            ("KEPLER_CHANNEL_GROUP_A", super::KEPLER_CHANNEL_GROUP_A),
            ("HOPPER_USERMODE_A", super::HOPPER_USERMODE_A),
            ("NV_CONFIDENTIAL_COMPUTE", super::NV_CONFIDENTIAL_COMPUTE),
        ] {
            if let Some(e) = t.classes.get(&c) {
                assert_eq!(e.name, n, "{c:#x}");
            }
        }
    }
}
