//! Where the daemon's processes meet on the host: the run directory and the names of the
//! files and sockets in it. Every side (supervisor, worker, CLI verbs, CDI, the socket
//! transport) takes them from here; this module imports nothing of the crate.
//!
//! The host's run directory is, first found: the `--run-dir` flag, `NVPROXY_RUN_DIR`, the
//! config's `[daemon] run_dir` (`serve`), [`DEFAULT_RUN_DIR`]. Inside a command's namespace
//! (`nvproxy exec`/`run`, CDI containers) the instance's sockets are always at
//! `/run/nvproxy/...` (`preload-proto`'s defaults), wherever the host keeps them.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The host's run directory when nothing names another: `<DEFAULT_RUN_DIR>/<instance>/`.
pub const DEFAULT_RUN_DIR: &str = "/run/nvproxy";
/// The environment variable that names the host's run directory.
pub const RUN_DIR_ENV: &str = "NVPROXY_RUN_DIR";
/// The supervisor's control socket (the instance API) in the run directory.
pub const CONTROL_SOCKET: &str = "nvproxy.sock";
/// The mmap socket's file name in the instance directory.
pub const MMAP_SOCKET: &str = "mmap.sock";
/// The worker's state file in the instance's run directory.
pub const STATE_FILE: &str = "worker.json";
/// The worker's stats socket in the instance's run directory.
pub const WORKER_SOCKET: &str = "worker.sock";
/// The lock file `serve` holds for its life in the run directory (one supervisor per run
/// directory); it holds the supervisor's pid.
pub const SERVE_LOCK: &str = "serve.lock";

/// The `--run-dir` flag, set once by `main`.
static FLAG: OnceLock<PathBuf> = OnceLock::new();

/// Records the `--run-dir` flag (first call wins).
pub fn set_run_dir_flag(dir: PathBuf) {
    let _ = FLAG.set(dir);
}

/// The host's run directory: the `--run-dir` flag, else `NVPROXY_RUN_DIR` (when not empty),
/// else `config` (`[daemon] run_dir`), else [`DEFAULT_RUN_DIR`]; a relative one is taken
/// from the current directory (workers, hooks and CDI specs get absolute paths).
pub fn host_run_dir(config: Option<&Path>) -> PathBuf {
    let dir = resolve(
        FLAG.get().map(PathBuf::as_path),
        std::env::var_os(RUN_DIR_ENV).as_deref().map(Path::new),
        config,
    );
    match std::env::current_dir() {
        Ok(cwd) if dir.is_relative() => cwd.join(dir),
        _ => dir,
    }
}

fn resolve(flag: Option<&Path>, env: Option<&Path>, config: Option<&Path>) -> PathBuf {
    flag.or(env.filter(|p| !p.as_os_str().is_empty()))
        .or(config)
        .unwrap_or(Path::new(DEFAULT_RUN_DIR))
        .to_path_buf()
}

/// The run directory of an instance: `<root>/<instance>`.
pub fn run_dir(root: &Path, instance: &str) -> PathBuf {
    root.join(instance)
}

/// `--socket PATH`.
#[derive(Debug, clap::Args)]
pub struct SocketArg {
    /// The supervisor's control socket [default: nvproxy.sock in the run directory,
    /// /run/nvproxy unless --run-dir or NVPROXY_RUN_DIR say otherwise].
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

impl SocketArg {
    /// `--socket`, or the run directory's control socket.
    pub fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| host_run_dir(None).join(CONTROL_SOCKET))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_run_dir_is_flag_then_env_then_config_then_default() {
        let (f, e, c) = (Path::new("/f"), Path::new("/e"), Path::new("/c"));
        assert_eq!(resolve(Some(f), Some(e), Some(c)), f);
        assert_eq!(resolve(None, Some(e), Some(c)), e);
        assert_eq!(resolve(None, Some(Path::new("")), Some(c)), c);
        assert_eq!(resolve(None, None, Some(c)), c);
        assert_eq!(resolve(None, None, None), Path::new(DEFAULT_RUN_DIR));
    }
}
