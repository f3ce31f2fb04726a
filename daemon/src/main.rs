//! `nvproxy`: the daemon and its command line.

#![deny(unsafe_code)]

mod abi_cmd;
mod api;
mod audit_cmd;
mod cdi;
mod child;
mod device_plugin;
mod doctor;
mod exec_scratch;
mod metrics;
mod node_gpus;
mod nsexec;
mod policy_cmd;
mod serve;
mod supervisor;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nvproxy_worker::{host, paths, simd, sys, worker};
use tracing_subscriber::EnvFilter;

/// nvproxy: proxied NVIDIA device nodes for containers.
#[derive(Parser)]
#[command(name = "nvproxy", version, about)]
struct Cli {
    /// Log filter (tracing-subscriber EnvFilter syntax); RUST_LOG is used when absent.
    #[arg(long, global = true)]
    log: Option<String>,
    /// More log lines: -v for what nvproxy does (info), -vv for every request (debug).
    /// `serve` logs at info already; --log or RUST_LOG choose finer.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// The host's run directory (instance sockets, state files, the control socket); before
    /// NVPROXY_RUN_DIR and `[daemon] run_dir` [default: /run/nvproxy].
    #[arg(long, global = true, value_name = "DIR")]
    run_dir: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check whether this host can run nvproxy (CUSE, pidfd, Yama, Landlock, driver).
    Doctor,
    /// Inspect the driver ABI tables: the version tree, one version, or the difference of two.
    #[command(subcommand)]
    Abi(abi_cmd::AbiCommand),
    /// Run a command with its own proxied GPU instance (nodes bind-mounted at /dev/nvidia*).
    Exec(serve::ExecArgs),
    /// Serve the instances of a configuration file until SIGINT or SIGTERM (SIGHUP replaces
    /// every worker live).
    Serve(serve::ServeArgs),
    /// Run a command with the nodes of an instance that `serve` is serving.
    Run(serve::RunArgs),
    /// Build and check policy files: `suggest --from-audit LOG` prints the allowlist a run used.
    #[command(subcommand)]
    Policy(policy_cmd::PolicyCommand),
    /// Read audit logs: `summary LOG` prints a table of the entries used.
    #[command(subcommand)]
    Audit(audit_cmd::AuditCommand),
    /// CDI: `generate` prints a spec with one device per served instance (podman --device
    /// nvproxy.dev/gpu=NAME).
    #[command(subcommand)]
    Cdi(cdi::CdiCommand),
    /// (internal) The OCI createContainer hooks of the CDI spec.
    #[command(hide = true)]
    CdiHook(cdi::HookArgs),
    /// Check a configuration file and print the instances it defines.
    CheckConfig {
        /// The TOML file (see examples/config.toml).
        path: std::path::PathBuf,
    },
    /// Manage the instances of a running `nvproxy serve` (its control socket): create, list,
    /// show, rm, upgrade, checkpoint, restore.
    #[command(subcommand)]
    Instance(api::InstanceCommand),
    /// Print the metrics of a running `nvproxy serve` (Prometheus text format, from its control
    /// socket; `[daemon] metrics_listen` serves the same over HTTP).
    Metrics(api::SocketArg),
    /// Kubelet device plugin: serve nvproxy.dev/gpu, a fresh instance of the running
    /// `nvproxy serve` per allocation, handed to pods as a CDI device.
    DevicePlugin(device_plugin::DevicePluginArgs),
    /// (internal) The simulated driver of one instance as a process of its own.
    #[command(hide = true)]
    SimDriver(simd::SimDriverArgs),
    /// (internal) Serve one instance, its spec (JSON) on stdin: the supervisor's worker.
    #[command(hide = true)]
    Worker,
    /// (internal) Run a command in a private mount namespace with the given nodes as /dev/NAME.
    #[command(hide = true)]
    NsExec(nsexec::NsSpec),
}

/// `tracing` to journald when stderr is systemd's journal stream (`JOURNAL_STREAM`, as
/// systemd documents for services: fields such as `instance` stay fields), else to stderr,
/// coloured only on a terminal (NO_COLOR turns colour off).
fn init_logging(filter: EnvFilter) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    if sys::stderr_is_journal() {
        match tracing_journald::layer() {
            Ok(layer) => {
                tracing_subscriber::registry()
                    .with(filter)
                    .with(layer.with_syslog_identifier("nvproxy".to_owned()))
                    .init();
                return;
            }
            Err(e) => eprintln!("nvproxy: journald unavailable ({e}); logging to stderr"),
        }
    }
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(dir) = &cli.run_dir {
        paths::set_run_dir_flag(dir.clone());
    }
    // --log, then -v, then RUST_LOG, then the command's default: `serve` (and the processes
    // it starts) log what they do; every other command, and the workers of `exec`, only
    // warnings, so that a command's terminal is its own.
    let env = std::env::var("RUST_LOG").ok().filter(|v| !v.is_empty());
    let chosen = cli.log.clone().or(match cli.verbose {
        0 => None,
        1 => Some("info".to_owned()),
        _ => Some("debug".to_owned()),
    });
    let default = if matches!(
        cli.command,
        Command::Serve(_) | Command::Worker | Command::SimDriver(_)
    ) {
        "info"
    } else {
        "warn"
    };
    // Workers log with the same filter (supervisor.rs passes it on); RUST_LOG reaches them
    // through the environment.
    let worker_filter = match (&chosen, &env, &cli.command) {
        (Some(f), _, _) => Some(f.clone()),
        (None, None, Command::Exec(_)) => Some(default.to_owned()),
        _ => None,
    };
    if let Some(f) = worker_filter {
        let _ = supervisor::LOG_FILTER.set(f);
    }
    let filter = match chosen.as_deref().or(env.as_deref()) {
        Some(f) => EnvFilter::try_new(f).unwrap_or_else(|e| {
            eprintln!("nvproxy: log filter {f:?}: {e}; using {default:?}");
            EnvFilter::new(default)
        }),
        None => EnvFilter::new(default),
    };
    init_logging(filter);

    if matches!(
        cli.command,
        Command::Serve(_)
            | Command::Exec(_)
            | Command::Run(_)
            | Command::Worker
            | Command::SimDriver(_)
    ) {
        // Tenants' opens hold daemon fds; the per-instance quotas bound each tenant below this.
        match sys::raise_nofile_limit() {
            Ok((soft, _)) => tracing::debug!(soft, "RLIMIT_NOFILE"),
            Err(e) => tracing::warn!(error = %e, "could not raise RLIMIT_NOFILE"),
        }
    }
    let result: anyhow::Result<ExitCode> = match &cli.command {
        Command::Doctor => {
            let checks = doctor::run_checks();
            for c in &checks {
                println!("{c}");
            }
            Ok(if checks.iter().all(|c| c.ok) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Abi(cmd) => abi_cmd::run(cmd).map(|()| ExitCode::SUCCESS),
        Command::Exec(args) => serve::exec(args),
        Command::Serve(args) => serve::serve(args),
        Command::Run(args) => serve::run(args).map(|never| match never {}),
        Command::Policy(cmd) => policy_cmd::run(cmd).map(|()| ExitCode::SUCCESS),
        Command::Audit(cmd) => audit_cmd::run(cmd).map(|()| ExitCode::SUCCESS),
        Command::CheckConfig { path } => {
            nvproxy_config::Config::load(path, &host::ThisHost).map(|cfg| {
                println!("{}", cfg.summary(&host::ThisHost));
                ExitCode::SUCCESS
            })
        }
        Command::Instance(cmd) => api::run(cmd).map(|()| ExitCode::SUCCESS),
        Command::Metrics(socket) => api::metrics(socket).map(|()| ExitCode::SUCCESS),
        Command::DevicePlugin(args) => device_plugin::run(args).map(|()| ExitCode::SUCCESS),
        Command::Worker => worker::run(),
        Command::SimDriver(args) => simd::run(args).map(|()| ExitCode::SUCCESS),
        Command::Cdi(cmd) => cdi::run(cmd).map(|()| ExitCode::SUCCESS),
        Command::CdiHook(args) => cdi::hook(args).map(|()| ExitCode::SUCCESS),
        Command::NsExec(spec) => nsexec::run(spec).map(|never| match never {}),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nvproxy: {e:#}");
            ExitCode::FAILURE
        }
    }
}
