//! A kubelet device plugin (API v1beta1) for nvproxy: every GPU of the node is a device of
//! the resource `nvproxy.dev/gpu`; `Allocate` creates a fresh nvproxy instance of the devices
//! asked for through a [`Backend`] (the daemon's instance API) and answers with its CDI device
//! name; instances whose pod the kubelet's PodResources API no longer lists are removed. See
//! docs/architecture/device-plugin.md.

pub mod api;
mod plugin;
pub mod topology;
mod unix;

pub use plugin::{Backend, Config, Error, Gpu, Instance, Node, run, run_until_signal};
pub use unix::{connect, serve_on};
