//! A kubelet device plugin (API v1beta1) for nvproxy: every GPU of the node is a device of
//! the resource `nvproxy.dev/gpu`; `Allocate` creates a fresh nvproxy instance of the devices
//! asked for through a [`Backend`] (the daemon's instance API) and answers with its CDI device
//! name; instances whose pod the kubelet's PodResources API no longer lists are removed.
//! Optionally a second resource, `nvproxy.dev/gpu-share`: N devices per GPU, each an instance
//! of that GPU with a video memory quota. See
//! docs/architecture/device-plugin.md.

#![deny(unsafe_code)]

pub mod api;
mod plugin;
pub mod topology;
mod unix;

pub use plugin::{
    Backend, Config, Error, Gpu, Instance, MAX_SHARES_PER_GPU, Node, Shares, run, run_until_signal,
    share_id,
};
pub use unix::{connect, serve_on};
