//! Where the daemon's processes meet on the host: the run directory and the names of the
//! files and sockets in it. Every side (supervisor, worker, CLI verbs, CDI, the socket
//! transport) takes them from here; this module imports nothing of the crate.

use std::path::{Path, PathBuf};

/// Where instance directories live on the host: `<RUN_DIR>/<instance>/`.
pub const RUN_DIR: &str = "/run/nvproxy";
/// The mmap socket's file name in the instance directory.
pub const MMAP_SOCKET: &str = "mmap.sock";
/// The worker's state file in the instance's run directory.
pub const STATE_FILE: &str = "worker.json";
/// The worker's stats socket in the instance's run directory.
pub const WORKER_SOCKET: &str = "worker.sock";

/// The run directory of an instance: `/run/nvproxy/<instance>`.
pub fn run_dir(root: &Path, instance: &str) -> PathBuf {
    root.join(instance)
}
