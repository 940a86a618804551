use clap::Parser;
use iii_shell::cli::{Cli, Command};
use iii_shell::{cmd_broker, cmd_call, cmd_executor, cmd_serve};
use iii_shell_broker::logging;

fn main() {
    let mut cli = Cli::parse();
    let code = match cli.command {
        Some(Command::CheckConfig { file }) => iii_shell::cmd_check_config::run(&file),
        Some(Command::Doctor(args)) => {
            logging::init("warn");
            runtime(2).block_on(iii_shell::cmd_doctor::run(args, &cli.serve))
        }
        Some(Command::Probe { args }) => iii_shell::cmd_probe::run(&args),
        Some(Command::Executor(mut args)) => {
            // Before any thread exists (see `heap`).
            iii_shell::heap::one_arena();
            // Its WARN and ERROR events also go to the broker, which ships them.
            let (layer, relay) = iii_shell_executor::log_relay::RelayLayer::new();
            logging::init_with("info", Some(Box::new(layer)));
            match cmd_executor::resolve_peer_user(&mut args)
                .and_then(|()| cmd_executor::harden(&args))
            {
                Ok(hardened) => {
                    executor_runtime().block_on(cmd_executor::run(args, hardened, relay))
                }
                Err(code) => code,
            }
        }
        Some(Command::Call(args)) => {
            logging::init("warn");
            current_thread_runtime().block_on(cmd_call::run(args, cli.serve.config.as_deref()))
        }
        Some(Command::Broker(args)) => {
            // Its WARN and ERROR events also go to the engine, once telemetry is set up.
            logging::init_with(
                "info",
                Some(Box::new(iii_shell_broker::telemetry::log_layer::ShipLayer)),
            );
            match cmd_broker::prepare(&mut cli.serve, &args) {
                Ok((seed, source, own_stat)) => current_thread_runtime()
                    .block_on(cmd_broker::run(cli.serve, seed, source, own_stat)),
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
    built(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build(),
    )
}

/// The runtime, or exit 2 with the reason.
fn built(rt: std::io::Result<tokio::runtime::Runtime>) -> tokio::runtime::Runtime {
    match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("iii-shell: cannot start the async runtime: {e}");
            std::process::exit(2);
        }
    }
}

/// The executor's runtime. By default (`III_SHELL_EXECUTOR_THREADS` unset or 1) a
/// current-thread runtime: reading a request, handling it, spawning the command, waiting for
/// it and writing the reply all happen on one thread, so no request pays a cross-thread
/// wake-up (about 40 µs each on a small VM). Blocking work (fs operations, the orphan
/// reaper) runs on the blocking pool either way. A larger number gives a multi-thread
/// runtime with that many workers.
fn executor_runtime() -> tokio::runtime::Runtime {
    let threads = std::env::var("III_SHELL_EXECUTOR_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n: &usize| *n > 0)
        .unwrap_or(1);
    if threads > 1 {
        return runtime(threads);
    }
    current_thread_runtime()
}

/// One thread for every task. The broker and the executor are I/O-bound: each request is a
/// few tens of microseconds of work between socket reads and writes, and on one thread no
/// hand-off between them pays a cross-thread wake-up. Blocking work still goes to the
/// blocking pool.
fn current_thread_runtime() -> tokio::runtime::Runtime {
    built(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    )
}
