//! The worker runtime of nvproxy: everything a process needs to serve one instance. It builds
//! the driver (the host's, or the simulated one in-process or as its own process), the
//! instance's request path (policy, audit sink, the frontend and UVM proxies) and its nodes on
//! either transport (CUSE devices or the socket transport, with the mmap path beside them),
//! and keeps the instance's state across checkpoints and live upgrades. The `nvproxy` binary
//! (`daemon/`: the command line, the supervisor, the instance API) drives it; this crate knows
//! nothing of them.
//!
//! Modules form layers, each importing only from lower ones (`tests/layout/imports.py
//! --check`; the table is in docs/architecture/daemon-modules.md):
//! - leaves: [`paths`], [`host`], [`advice`], [`fdpass`], [`listener`], [`node`], [`ratelimit`];
//! - the OS layer and servers: [`sys`], [`seqpacket`], [`unix_server`], [`audit_log`],
//!   [`worker_spec`], [`latency`];
//! - client memory and fds: [`memory`], [`fdid`]; the mmap path: [`mmap`];
//! - nodes and transports: [`device`], [`backend`], [`socket_transport`], [`instance`];
//! - the runtime: [`simd`], [`running`]; its state: [`checkpoint`], [`record`], [`upgrade`];
//! - the worker process: [`worker`].
//!
//! `unsafe` is denied except in [`sys`] and [`fdpass`] (docs/architecture/crates.md says why).

#![deny(unsafe_code)]

pub mod advice;
pub mod audit_log;
pub mod backend;
pub mod checkpoint;
pub mod device;
pub mod fdid;
// `recvmsg` with a control buffer walked by hand (see the module docs).
#[allow(unsafe_code)]
pub mod fdpass;
pub mod host;
pub mod instance;
pub mod latency;
pub mod listener;
pub mod memory;
pub mod mmap;
pub mod node;
pub mod paths;
pub mod ratelimit;
pub mod record;
pub mod running;
pub mod seqpacket;
pub mod simd;
pub mod socket_transport;
// The system calls no safe wrapper covers (see the module docs).
#[allow(unsafe_code)]
pub mod sys;
pub mod unix_server;
pub mod upgrade;
pub mod worker;
pub mod worker_spec;
