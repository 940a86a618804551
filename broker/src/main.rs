use clap::Parser;
use iii_shell_broker::cli::{Cli, Command};
use iii_shell_broker::{cmd_broker, cmd_call, cmd_executor, cmd_serve, logging};
use iii_shell_protocol::config::Config;

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Some(Command::CheckConfig { file }) => check_config(&file),
        Some(Command::Doctor(args)) => {
            logging::init("warn");
            runtime(2).block_on(iii_shell_broker::cmd_doctor::run(args, &cli.serve.config))
        }
        Some(Command::Probe { args }) => iii_shell_broker::cmd_probe::run(&args),
        Some(Command::Executor(args)) => {
            logging::init("info");
            match cmd_executor::harden(&args) {
                Ok(pinned) => runtime(executor_threads()).block_on(cmd_executor::run(args, pinned)),
                Err(code) => code,
            }
        }
        Some(Command::Call(args)) => {
            logging::init("warn");
            let explicit = std::env::args().any(|a| a == "--config" || a.starts_with("--config="));
            let path = explicit.then_some(cli.serve.config.as_path());
            runtime(2).block_on(cmd_call::run(args, path))
        }
        Some(Command::Broker(args)) => {
            logging::init("info");
            match cmd_broker::prepare(&cli.serve, &args) {
                Ok((seed, source)) => runtime(2).block_on(cmd_broker::run(cli.serve, seed, source)),
                Err(code) => code,
            }
        }
        Some(Command::Serve) | None => {
            logging::init("info");
            cmd_serve::run(cli.serve)
        }
    };
    std::process::exit(code);
}

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("iii-shell: cannot start the async runtime: {e}");
            std::process::exit(2);
        }
    }
}

fn check_config(file: &std::path::Path) -> i32 {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return 1;
        }
    };
    match Config::from_yaml(&text) {
        Ok(c) => {
            let mode = if c.fs.host_roots.is_empty() {
                "unjailed".to_string()
            } else {
                format!("jailed to {}", c.fs.host_roots.join(", "))
            };
            println!(
                "{}: ok ({mode}, {} denylist patterns)",
                file.display(),
                c.denylist_patterns.len()
            );
            0
        }
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            1
        }
    }
}

/// Worker threads of the executor's runtime (`III_SHELL_EXECUTOR_THREADS`, default 1: one
/// thread keeps every request on the thread that reads it, which saves a cross-thread wake-up
/// per hop; blocking work runs on the blocking pool either way).
fn executor_threads() -> usize {
    std::env::var("III_SHELL_EXECUTOR_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1)
}
