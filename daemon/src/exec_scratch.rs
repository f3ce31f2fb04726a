//! `nvproxy exec`'s scratch directory on the host: `<tmp>/nvproxy-exec-<pid>/`, 0700, holding
//! the simulated driver's `/proc` and `/sys` files that `ns-exec` copies into the command's
//! namespace. The exec holds an exclusive `flock` on it while it lives and removes it when it
//! ends; an exec killed with SIGKILL cannot, so every exec first removes the scratch
//! directories of execs that are gone ([`sweep`]): their pid is dead and their lock free (a
//! live exec in another pid namespace that shares the directory keeps its lock), and the
//! instance directories of execs whose worker was killed too ([`sweep_run_dir`]).

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use nix::fcntl::{Flock, FlockArg};

/// The name prefix of the scratch directories.
const PREFIX: &str = "nvproxy-exec-";

/// This exec's scratch directory, removed when dropped.
pub struct Scratch {
    dir: PathBuf,
    _lock: Flock<File>,
}

impl Scratch {
    /// Creates `<tmp>/nvproxy-exec-<our pid>` (a dead exec's leftover of the same pid is
    /// removed first) and locks it. The `mkdir` is exclusive, so the directory is ours: in a
    /// sticky `/tmp` nobody else can rename or remove it.
    pub fn create(tmp: &Path) -> Result<Scratch> {
        let dir = tmp.join(format!("{PREFIX}{}", std::process::id()));
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                tracing::debug!(dir = %dir.display(), "a dead exec's scratch directory of our pid removed")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", dir.display())),
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let lock = lock_dir(&dir)
            .with_context(|| format!("locking {}", dir.display()))?
            .with_context(|| format!("{} is locked by another process", dir.display()))?;
        Ok(Scratch { dir, _lock: lock })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "removing the exec's scratch directory");
        }
    }
}

/// Opens `dir` (not following a link) and takes its lock without waiting; `None` when another
/// process holds it.
fn lock_dir(dir: &Path) -> Result<Option<Flock<File>>> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => bail!("flock: {e}"),
    }
}

/// The exec pid a scratch directory's name carries: `nvproxy-exec-<pid>`, and (as execs
/// before the single directory named them) `nvproxy-exec-<pid>-proc` and `-sys`.
fn exec_pid(name: &str) -> Option<(u32, bool)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, locked) = match rest.split_once('-') {
        Some((pid, "proc" | "sys")) => (pid, false),
        Some(_) => return None,
        None => (rest, true),
    };
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((pid.parse().ok()?, locked))
}

/// Whether a process `pid` exists (in our pid namespace).
fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// Removes the scratch directories under `tmp` that dead execs left: those named by a pid
/// that is gone, ours (owned by our uid, not a link) and, for the locked kind, unlocked.
/// Returns the directories removed.
pub fn sweep(tmp: &Path) -> Vec<PathBuf> {
    let me = nix::unistd::geteuid().as_raw();
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return removed;
    };
    for e in entries.flatten() {
        let Some((pid, locked)) = e.file_name().to_str().and_then(exec_pid) else {
            continue;
        };
        if pid == std::process::id() || alive(pid) {
            continue;
        }
        let path = e.path();
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == me);
        if !ours {
            continue;
        }
        // Held while removing: an exec that still lives (another pid namespace) keeps it.
        let _lock = if locked {
            match lock_dir(&path) {
                Ok(Some(l)) => Some(l),
                _ => continue,
            }
        } else {
            None
        };
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::info!(dir = %path.display(), pid, "a dead exec's scratch directory removed");
                removed.push(path);
            }
            Err(e) => {
                tracing::warn!(dir = %path.display(), error = %e, "removing a dead exec's scratch directory")
            }
        }
    }
    removed
}

/// Removes the instance directories under the run directory `root` that execs left whose
/// worker was killed too (its `worker.json` stays behind): `exec-<pid>` with the exec's pid
/// gone, a state file that says `ephemeral` (an exec's worker, never a served instance's) and
/// names a pid that is gone. Returns the directories removed.
pub fn sweep_run_dir(root: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("exec-"))
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || alive(pid) {
            continue;
        }
        let path = e.path();
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let state = std::fs::read(path.join(nvproxy_worker::paths::STATE_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        let Some(state) = state else { continue };
        let ephemeral = state["spec"]["ephemeral"] == true;
        let worker_gone = state["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .is_some_and(|p| !alive(p));
        if !(ephemeral && worker_gone) {
            continue;
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::info!(dir = %path.display(), pid, "a dead exec's instance directory removed");
                removed.push(path);
            }
            Err(e) => {
                tracing::warn!(dir = %path.display(), error = %e, "removing a dead exec's instance directory")
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_scratch_names_carry_the_exec_pid() {
        assert_eq!(exec_pid("nvproxy-exec-42"), Some((42, true)));
        assert_eq!(exec_pid("nvproxy-exec-42-proc"), Some((42, false)));
        assert_eq!(exec_pid("nvproxy-exec-42-sys"), Some((42, false)));
        assert_eq!(exec_pid("nvproxy-exec-42-other"), None);
        assert_eq!(exec_pid("nvproxy-exec-"), None);
        assert_eq!(exec_pid("nvproxy-exec-+1"), None);
        assert_eq!(exec_pid("nvproxy-audit-42"), None);
    }

    /// A dead exec's instance directory goes when its killed worker's state file says
    /// `ephemeral`; a served instance's of the same name form, or a live exec's, stays.
    #[test]
    fn test_a_dead_execs_instance_directory_goes_when_its_worker_is_gone() {
        let d = test_kit::TestDir::new("sweep-run");
        let root = d.path();
        // Past PID_MAX_LIMIT: never a live pid.
        let dead = 4_194_304 + 9;
        let live = std::process::id();
        let state = |dir: &str, pid: u32, ephemeral: bool| {
            std::fs::create_dir(root.join(dir)).unwrap();
            std::fs::write(
                root.join(dir).join(nvproxy_worker::paths::STATE_FILE),
                format!("{{\"pid\":{pid},\"spec\":{{\"ephemeral\":{ephemeral}}}}}"),
            )
            .unwrap();
        };
        state(&format!("exec-{dead}"), dead, true);
        state(&format!("exec-{}", dead + 1), dead, false);
        state(&format!("exec-{}", dead + 2), live, true);
        state(&format!("exec-{live}"), dead, true);
        std::fs::create_dir(root.join(format!("exec-{}", dead + 3))).unwrap();
        assert_eq!(sweep_run_dir(root), vec![root.join(format!("exec-{dead}"))]);
        for kept in [dead + 1, dead + 2, live, dead + 3] {
            assert!(root.join(format!("exec-{kept}")).is_dir(), "exec-{kept}");
        }
    }

    /// Only dead execs' directories go: a live pid's stays, and so does a dead pid's whose lock
    /// a live process holds; ours is removed when dropped.
    #[test]
    fn test_sweep_removes_only_dead_unlocked_execs_directories() {
        let scratch = test_kit::TestDir::new("sweep");
        let tmp = scratch.path().to_path_buf();
        // A pid that is dead: a child we reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let live = std::process::id();
        let parent = u32::try_from(nix::unistd::getppid().as_raw()).expect("a pid");
        for name in [
            format!("nvproxy-exec-{dead}"),
            format!("nvproxy-exec-{dead}-proc"),
            format!("nvproxy-exec-{parent}"),
        ] {
            std::fs::create_dir_all(tmp.join(&name).join("proc")).unwrap();
        }
        // Past PID_MAX_LIMIT: never a live pid.
        let held_by_other = format!("nvproxy-exec-{}", 4_194_304 + 7);
        std::fs::create_dir(tmp.join(&held_by_other)).unwrap();
        let lock = lock_dir(&tmp.join(&held_by_other)).unwrap().unwrap();
        let mut removed = sweep(&tmp);
        removed.sort();
        drop(lock);
        let mut want = vec![
            tmp.join(format!("nvproxy-exec-{dead}")),
            tmp.join(format!("nvproxy-exec-{dead}-proc")),
        ];
        want.sort();
        assert_eq!(removed, want);
        assert!(tmp.join(format!("nvproxy-exec-{parent}")).is_dir());
        assert!(tmp.join(&held_by_other).is_dir());
        {
            let s = Scratch::create(&tmp).unwrap();
            assert!(s.path().is_dir());
            assert_eq!(s.path(), tmp.join(format!("nvproxy-exec-{live}")));
            assert!(
                lock_dir(s.path()).unwrap().is_none(),
                "locked while it lives"
            );
        }
        assert!(!tmp.join(format!("nvproxy-exec-{live}")).exists());
    }
}
