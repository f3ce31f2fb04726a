//! The command of `nvproxy exec`: started, waited for, and sent the termination signals that
//! reach nvproxy, so that nvproxy itself outlives the command and always stops its instance
//! (which writes the audit counts), whether the command exits, fails or is killed, and whether
//! the signal was meant for nvproxy or for the command.

use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use nix::sys::signal::kill;
use nix::unistd::Pid;

use nvproxy_worker::sys;

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread; call it before any other thread starts
/// (threads inherit the mask). The command does not inherit it: `Command` resets the child's
/// signal mask.
pub fn block_termination_signals() -> Result<()> {
    sys::block_termination_signals().context("blocking termination signals")
}

/// Runs `cmd` to its end. SIGINT, SIGTERM and SIGHUP sent to nvproxy (blocked beforehand with
/// [`block_termination_signals`]) are forwarded to the command instead of ending nvproxy. (A
/// terminal's Ctrl-C also reaches the command directly, as it shares nvproxy's process group:
/// the command may then see SIGINT twice.)
///
/// The command is killed (SIGKILL, `PR_SET_PDEATHSIG`) when nvproxy dies, even by SIGKILL.
/// The kernel sends that signal when the *thread* that started the child exits, not the
/// process: call this from the thread that waits for the command (here: the caller's, which
/// then waits in this function).
pub fn run_forwarding_signals(cmd: &mut Command) -> Result<ExitStatus> {
    sys::killed_with_parent(cmd);
    let mut child = cmd.spawn().context("starting the command")?;
    let pid = Pid::from_raw(i32::try_from(child.id()).context("child pid")?);
    let done = Arc::new(AtomicBool::new(false));
    let done2 = done.clone();
    std::thread::Builder::new()
        .name("exec-signals".into())
        .spawn(move || {
            while let Ok(sig) = sys::wait_for_termination() {
                // Once the command is reaped its pid may be reused: forward nothing.
                if done2.load(Ordering::SeqCst) {
                    tracing::info!(signal = ?sig, "signal after the command ended: ignored");
                    return;
                }
                tracing::info!(signal = ?sig, pid = pid.as_raw(), "forwarding to the command");
                if let Err(e) = kill(pid, sig) {
                    tracing::warn!(signal = ?sig, error = %e, "forwarding a signal failed");
                }
            }
        })
        .context("starting the signal thread")?;
    let status = child.wait();
    done.store(true, Ordering::SeqCst);
    status.context("waiting for the command")
}
