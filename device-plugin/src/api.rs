//! The messages of the kubelet APIs the plugin speaks, written from the published definitions
//! (field numbers and types as there; a field we never use is left out, which protobuf
//! decoding skips), and the tonic clients and servers `build.rs` generates for them.

/// `k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1` (package `v1beta1`): the `Registration`
/// service the kubelet serves on `kubelet.sock` and the `DevicePlugin` service a plugin serves.
pub mod v1beta1 {
    use std::collections::HashMap;

    /// The API version a plugin registers with.
    pub const VERSION: &str = "v1beta1";
    /// `Device.health` of a usable device.
    pub const HEALTHY: &str = "Healthy";
    /// `Device.health` of a device the kubelet must not hand out.
    pub const UNHEALTHY: &str = "Unhealthy";
    /// The kubelet's registration socket's file name in the device plugin directory.
    pub const KUBELET_SOCKET: &str = "kubelet.sock";

    /// `DevicePluginOptions`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct DevicePluginOptions {
        /// The kubelet calls `PreStartContainer` before each container start.
        #[prost(bool, tag = "1")]
        pub pre_start_required: bool,
        /// `GetPreferredAllocation` is implemented.
        #[prost(bool, tag = "2")]
        pub get_preferred_allocation_available: bool,
    }

    /// `RegisterRequest`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct RegisterRequest {
        /// The API version ([`VERSION`]).
        #[prost(string, tag = "1")]
        pub version: String,
        /// The plugin's socket: a file name in the device plugin directory.
        #[prost(string, tag = "2")]
        pub endpoint: String,
        /// The extended resource, `vendor-domain/resource`.
        #[prost(string, tag = "3")]
        pub resource_name: String,
        /// The plugin's options.
        #[prost(message, optional, tag = "4")]
        pub options: Option<DevicePluginOptions>,
    }

    /// `Empty`.
    #[derive(Clone, Copy, PartialEq, ::prost::Message)]
    pub struct Empty {}

    /// `ListAndWatchResponse`: every device, sent again on each change.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ListAndWatchResponse {
        /// The devices.
        #[prost(message, repeated, tag = "1")]
        pub devices: Vec<Device>,
    }

    /// `TopologyInfo`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct TopologyInfo {
        /// The NUMA nodes the device is attached to.
        #[prost(message, repeated, tag = "1")]
        pub nodes: Vec<NumaNode>,
    }

    /// `NUMANode`.
    #[derive(Clone, Copy, PartialEq, ::prost::Message)]
    pub struct NumaNode {
        /// Its id.
        #[prost(int64, tag = "1")]
        pub id: i64,
    }

    /// `Device`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Device {
        /// The plugin's id for it (at most 63 characters).
        #[prost(string, tag = "1")]
        pub id: String,
        /// [`HEALTHY`] or [`UNHEALTHY`].
        #[prost(string, tag = "2")]
        pub health: String,
        /// Its NUMA affinity, when known.
        #[prost(message, optional, tag = "3")]
        pub topology: Option<TopologyInfo>,
    }

    /// `PreStartContainerRequest`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct PreStartContainerRequest {
        /// The container's devices.
        #[prost(string, repeated, tag = "1")]
        pub devices_ids: Vec<String>,
    }

    /// `PreStartContainerResponse`.
    #[derive(Clone, Copy, PartialEq, ::prost::Message)]
    pub struct PreStartContainerResponse {}

    /// `PreferredAllocationRequest`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct PreferredAllocationRequest {
        /// One per container.
        #[prost(message, repeated, tag = "1")]
        pub container_requests: Vec<ContainerPreferredAllocationRequest>,
    }

    /// `ContainerPreferredAllocationRequest`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ContainerPreferredAllocationRequest {
        /// The devices to choose from.
        #[prost(string, repeated, tag = "1")]
        pub available_device_ids: Vec<String>,
        /// The devices the choice must include.
        #[prost(string, repeated, tag = "2")]
        pub must_include_device_ids: Vec<String>,
        /// How many devices to choose.
        #[prost(int32, tag = "3")]
        pub allocation_size: i32,
    }

    /// `PreferredAllocationResponse`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct PreferredAllocationResponse {
        /// One per container request, in order.
        #[prost(message, repeated, tag = "1")]
        pub container_responses: Vec<ContainerPreferredAllocationResponse>,
    }

    /// `ContainerPreferredAllocationResponse`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ContainerPreferredAllocationResponse {
        /// The preferred devices.
        #[prost(string, repeated, tag = "1")]
        pub device_ids: Vec<String>,
    }

    /// `AllocateRequest`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct AllocateRequest {
        /// One per container.
        #[prost(message, repeated, tag = "1")]
        pub container_requests: Vec<ContainerAllocateRequest>,
    }

    /// `ContainerAllocateRequest`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ContainerAllocateRequest {
        /// The devices the kubelet gives the container.
        #[prost(string, repeated, tag = "1")]
        pub devices_ids: Vec<String>,
    }

    /// `AllocateResponse`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct AllocateResponse {
        /// One per container request, in order.
        #[prost(message, repeated, tag = "1")]
        pub container_responses: Vec<ContainerAllocateResponse>,
    }

    /// `ContainerAllocateResponse`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ContainerAllocateResponse {
        /// Environment variables for the container.
        #[prost(map = "string, string", tag = "1")]
        pub envs: HashMap<String, String>,
        /// Host paths to mount.
        #[prost(message, repeated, tag = "2")]
        pub mounts: Vec<Mount>,
        /// Host device nodes to give the container.
        #[prost(message, repeated, tag = "3")]
        pub devices: Vec<DeviceSpec>,
        /// Annotations for the container runtime.
        #[prost(map = "string, string", tag = "4")]
        pub annotations: HashMap<String, String>,
        /// Fully qualified CDI device names (`vendor/class=name`), passed to the runtime
        /// through the CRI by kubelets from 1.28 on.
        #[prost(message, repeated, tag = "5")]
        pub cdi_devices: Vec<CdiDevice>,
    }

    /// `Mount`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Mount {
        /// In the container.
        #[prost(string, tag = "1")]
        pub container_path: String,
        /// On the host.
        #[prost(string, tag = "2")]
        pub host_path: String,
        /// Read-only.
        #[prost(bool, tag = "3")]
        pub read_only: bool,
    }

    /// `DeviceSpec`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct DeviceSpec {
        /// In the container.
        #[prost(string, tag = "1")]
        pub container_path: String,
        /// On the host.
        #[prost(string, tag = "2")]
        pub host_path: String,
        /// Cgroup permissions (`rwm`).
        #[prost(string, tag = "3")]
        pub permissions: String,
    }

    /// `CDIDevice`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct CdiDevice {
        /// The fully qualified CDI device name.
        #[prost(string, tag = "1")]
        pub name: String,
    }

    include!(concat!(env!("OUT_DIR"), "/v1beta1.Registration.rs"));
    include!(concat!(env!("OUT_DIR"), "/v1beta1.DevicePlugin.rs"));
}

/// `k8s.io/kubelet/pkg/apis/podresources/v1` (package `v1`): what the kubelet assigned to the
/// containers it runs, served on `/var/lib/kubelet/pod-resources/kubelet.sock`. Only `List`
/// and the fields the plugin reads (CPU, memory, topology and DRA fields are skipped).
pub mod podresources {
    /// `ListPodResourcesRequest`.
    #[derive(Clone, Copy, PartialEq, ::prost::Message)]
    pub struct ListPodResourcesRequest {}

    /// `ListPodResourcesResponse`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ListPodResourcesResponse {
        /// Every pod.
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<PodResources>,
    }

    /// `PodResources`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct PodResources {
        /// The pod's name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// Its namespace.
        #[prost(string, tag = "2")]
        pub namespace: String,
        /// Its containers.
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<ContainerResources>,
    }

    /// `ContainerResources` (without `cpu_ids` = 3, `memory` = 4, `dynamic_resources` = 5).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ContainerResources {
        /// The container's name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// Its devices, per resource.
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<ContainerDevices>,
    }

    /// `ContainerDevices` (without `topology` = 3).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ContainerDevices {
        /// The extended resource.
        #[prost(string, tag = "1")]
        pub resource_name: String,
        /// The device ids the plugin of that resource gave.
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
    }

    include!(concat!(env!("OUT_DIR"), "/v1.PodResourcesLister.rs"));
}
