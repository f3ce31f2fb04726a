//! What to tell a user whose host lacks CUSE ([`cuse_state`], [`cuse_advice`]), and the
//! command line they ran ([`this_command_line`]): `nvproxy doctor` and a worker whose CUSE node
//! cannot be registered say the same thing. Imports nothing of the crate.

use std::fs;
use std::path::Path;

/// What this host has of CUSE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CuseState {
    /// `/dev/cuse` exists.
    Present,
    /// The module is loaded (or built in) but there is no `/dev/cuse` node.
    LoadedNoNode,
    /// The running kernel has a cuse module that is not loaded.
    Loadable,
    /// The running kernel has no cuse module: `modprobe cuse` cannot work here.
    NoModule {
        /// `uname -r`.
        kernel: String,
        /// What was looked at, for the message.
        why: String,
    },
}

/// Looks at `/dev/cuse`, `/sys/module/cuse` and the running kernel's module directory
/// (`/lib/modules/$(uname -r)`: `modules.builtin` and `modules.dep`).
pub fn cuse_state() -> CuseState {
    if Path::new("/dev/cuse").exists() {
        return CuseState::Present;
    }
    if Path::new("/sys/module/cuse").exists() {
        return CuseState::LoadedNoNode;
    }
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let dir = Path::new("/lib/modules").join(&kernel);
    if !dir.is_dir() {
        return CuseState::NoModule {
            why: format!("{} does not exist", dir.display()),
            kernel,
        };
    }
    let lists = |name: &str| {
        fs::read_to_string(dir.join(name)).is_ok_and(|t| {
            t.lines()
                .any(|l| l.split(':').next().is_some_and(|p| p.contains("/cuse.ko")))
        })
    };
    if lists("modules.dep") || lists("modules.builtin") {
        CuseState::Loadable
    } else {
        CuseState::NoModule {
            why: format!("{} lists no cuse.ko", dir.display()),
            kernel,
        }
    }
}

/// The nvproxy checkout this binary was built in, found by its `tests/vm/cuse-vm`: above the
/// binary (`<checkout>/target/<profile>/`), else where it was compiled, when that is still there
/// (a target dir elsewhere, `CARGO_TARGET_DIR` or a link to one). None for a binary installed
/// away from any checkout.
pub fn checkout() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok();
    checkout_of(exe.as_deref(), Path::new(env!("CARGO_MANIFEST_DIR")))
}

/// [`checkout`] for the executable `exe` of the crate compiled in `crate_dir`.
fn checkout_of(exe: Option<&Path>, crate_dir: &Path) -> Option<std::path::PathBuf> {
    let is_checkout = |d: &Path| d.join("tests/vm/cuse-vm").is_file() && d.join("run.sh").is_file();
    let above = exe.and_then(|e| e.ancestors().find(|d| is_checkout(d)));
    above
        .or_else(|| crate_dir.parent().filter(|d| is_checkout(d)))
        .map(Path::to_path_buf)
}

/// A file of the checkout, by its full path when the checkout is known.
fn in_checkout(rel: &str) -> String {
    checkout().map_or_else(
        || format!("{rel} (in the nvproxy checkout)"),
        |d| d.join(rel).display().to_string(),
    )
}

/// What the advice about CUSE is for.
pub enum CuseUse<'a> {
    /// `nvproxy doctor`: every way.
    Any,
    /// A command that serves and uses its nodes itself (`exec`): it can run in the VM as is.
    SelfContained(&'a str),
    /// `serve` or `run`: the daemon and its clients must share one VM run.
    ServeAndRun,
}

/// What to do about a missing `/dev/cuse`, ending in a command that works on this host.
pub fn cuse_advice(state: &CuseState, what: &CuseUse<'_>) -> String {
    match state {
        CuseState::Present => "/dev/cuse is present".to_owned(),
        CuseState::LoadedNoNode => "the cuse module is loaded but /dev/cuse is missing (no \
             devtmpfs on /dev?): as root, mknod /dev/cuse c 10 203"
            .to_owned(),
        CuseState::Loadable => "the cuse module is not loaded: as root, run `modprobe cuse` \
             (systemd/nvproxy-cuse.conf loads it at boot)"
            .to_owned(),
        CuseState::NoModule { kernel, why } => {
            let vm = in_checkout("tests/vm/cuse-vm");
            let run_sh = in_checkout("run.sh");
            let nvproxy = std::env::current_exe()
                .map_or_else(|_| "nvproxy".to_owned(), |p| p.display().to_string());
            let how = match what {
                CuseUse::Any => format!(
                    "`{vm} -- {nvproxy} exec --driver sim -- PROGRAM` for one command with its own instance, or \
                     `{run_sh} [CONFIG] -- COMMAND` to serve a config and run COMMAND against \
                     its instances in one VM run"
                ),
                CuseUse::SelfContained(cmd) => format!("{vm} -- {cmd}"),
                CuseUse::ServeAndRun => format!(
                    "a daemon and its clients must share one VM run, which \
                     `{run_sh} [CONFIG] -- COMMAND` does (COMMAND e.g. `{nvproxy} run \
                     --instance NAME -- PROGRAM`), or give one command its own instance with \
                     `{vm} -- {nvproxy} exec --driver sim -- PROGRAM`"
                ),
            };
            format!(
                "this kernel ({kernel}) has no CUSE module ({why}), so `modprobe cuse` cannot \
                 help: leave the transport `auto` (the default) or choose `--transport socket` / \
                 `transport = \"socket\"`, which need no CUSE; or run nvproxy in the project's \
                 VM, whose kernel has CUSE: {how}"
            )
        }
    }
}

/// What a missing `/dev/cuse` is about, in one short clause.
pub fn cuse_short(state: &CuseState) -> String {
    match state {
        CuseState::Present => "present".to_owned(),
        CuseState::LoadedNoNode => "the module is loaded but the node is missing (as root: \
             mknod /dev/cuse c 10 203)"
            .to_owned(),
        CuseState::Loadable => "the module is not loaded (as root: modprobe cuse)".to_owned(),
        CuseState::NoModule { kernel, .. } => format!(
            "this kernel ({kernel}) has no cuse module; {} runs nvproxy in a VM that has one",
            in_checkout("tests/vm/cuse-vm")
        ),
    }
}

/// The environment variable through which a worker knows the command line that started it
/// (the supervisor's or `nvproxy exec`'s), for advice that names a command the user ran.
pub const FOR_COMMAND_ENV: &str = "NVPROXY_FOR_COMMAND";
/// The subcommand (`exec`, `serve`) that started a worker.
pub const FOR_SUBCOMMAND_ENV: &str = "NVPROXY_FOR_SUBCOMMAND";

/// The subcommand the user ran: ours, or for a worker the one that started it.
pub fn user_subcommand() -> Option<String> {
    std::env::var(FOR_SUBCOMMAND_ENV)
        .ok()
        .or_else(|| std::env::args().nth(1))
}

/// This process's command line, quoted for a shell, with the executable's full path (for a
/// worker: the command line of the process that started it).
pub fn this_command_line() -> String {
    // A worker reports its supervisor's (or exec's) command line: that is what the user ran.
    if let Ok(line) = std::env::var(FOR_COMMAND_ENV) {
        return line;
    }
    std::env::args()
        .enumerate()
        .map(|(i, a)| {
            let a = if i == 0 {
                std::env::current_exe().map_or(a, |p| p.display().to_string())
            } else {
                a
            };
            if !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=,:@%+".contains(&b))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_checkout_of_a_binary_built_into_a_target_dir_elsewhere_is_where_it_was_built() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = here.parent().unwrap();
        let inside = root.join("target/debug/nvproxy");
        assert_eq!(checkout_of(Some(&inside), here).as_deref(), Some(root));
        let elsewhere = Path::new("/nonexistent-cache/target/debug/nvproxy");
        assert_eq!(checkout_of(Some(elsewhere), here).as_deref(), Some(root));
        assert_eq!(checkout_of(None, here).as_deref(), Some(root));
        // Installed away from any checkout, and the checkout gone: none.
        assert_eq!(
            checkout_of(Some(elsewhere), Path::new("/nonexistent/worker")),
            None
        );
    }

    #[test]
    fn test_cuse_advice_without_a_module_points_at_the_vm_not_modprobe() {
        let state = CuseState::NoModule {
            kernel: "6.18.44-x".into(),
            why: "/lib/modules/6.18.44-x does not exist".into(),
        };
        let exec = cuse_advice(&state, &CuseUse::SelfContained("nvproxy exec -- true"));
        assert!(
            exec.contains("this kernel (6.18.44-x) has no CUSE module")
                && exec.contains("`modprobe cuse` cannot help")
                && exec.contains("--transport socket")
                && exec.ends_with("tests/vm/cuse-vm -- nvproxy exec -- true"),
            "{exec}"
        );
        let serve = cuse_advice(&state, &CuseUse::ServeAndRun);
        assert!(serve.contains("run.sh [CONFIG] -- COMMAND"), "{serve}");
        let any = cuse_advice(&state, &CuseUse::Any);
        assert!(
            any.contains("tests/vm/cuse-vm -- ") && any.contains("run.sh"),
            "{any}"
        );
    }

    #[test]
    fn test_cuse_advice_with_a_module_says_modprobe() {
        let s = cuse_advice(&CuseState::Loadable, &CuseUse::Any);
        assert!(s.contains("as root, run `modprobe cuse`"), "{s}");
        assert!(!s.contains("cuse-vm"), "{s}");
    }

    #[test]
    fn test_this_command_line_is_shell_quoted() {
        let line = this_command_line();
        assert!(line.starts_with('/') || line.starts_with('\''), "{line}");
    }
}
