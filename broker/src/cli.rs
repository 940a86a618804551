//! The command line of `iii-shell`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "iii-shell", version = iii_shell_protocol::VERSION, about = "Privilege-separated shell and filesystem worker for the iii engine")]
pub struct Cli {
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Options of `serve` (also accepted without the subcommand, as `iii worker add` runs it).
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// WebSocket URL of the iii engine [env: III_URL, then III_ENGINE_URL; default ws://127.0.0.1:49134]
    #[arg(long, global = true)]
    pub url: Option<String>,
    /// Seed configuration sent as `initial_value` on first registration only [env: III_CONFIG;
    /// default: none, the built-in default is the seed]. A launcher passes `--config` only when
    /// the worker's entry has a config block, and runs us in its own directory, whose
    /// `config.yaml` is the engine's: so nothing is read from the working directory unasked.
    #[arg(long, global = true, env = "III_CONFIG", hide_env = true)]
    pub config: Option<PathBuf>,
    /// `serve`: pin the executor to this root-owned envelope (the widest policy it accepts)
    #[arg(long = "pin-config", id = "serve_pin_config")]
    pub pin_config: Option<PathBuf>,
}

impl ServeArgs {
    /// The seed: `--config` (or `III_CONFIG`) when given, else the built-in default. A file
    /// that is named but missing falls back to the built-in default too; one that exists but
    /// does not parse is an error.
    pub fn seed(&self) -> Result<iii_shell_protocol::config::Config, crate::lifecycle::BootError> {
        match &self.config {
            Some(path) => crate::lifecycle::load_seed(path),
            None => Ok(iii_shell_protocol::config::Config::builtin_default()),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Connect to the engine and serve (the default)
    Serve,
    /// Run only the executor
    Executor(ExecutorArgs),
    /// Run only the broker (the network half)
    Broker(BrokerArgs),
    /// Make one call through the full validate → executor path and print the JSON result
    Call(CallArgs),
    /// Self-checks run as a command under the executor (used by doctor and tests)
    #[command(hide = true)]
    Probe {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Report what confines the broker, the executor and commands on this machine
    Doctor(DoctorArgs),
    /// Parse and validate a configuration file
    CheckConfig {
        /// The YAML file to check
        file: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct ExecutorArgs {
    /// Listen on this Unix socket path
    #[arg(long, conflicts_with = "fd", required_unless_present = "fd")]
    pub socket: Option<PathBuf>,
    /// Serve the one connection on this inherited socket fd (used by `serve` and `call`)
    #[arg(long)]
    pub fd: Option<i32>,
    /// The only uid allowed to connect (default: the executor's own uid)
    #[arg(long)]
    pub peer_uid: Option<u32>,
    /// The only user allowed to connect, by name (looked up at start-up; for units, which know
    /// the broker's user by name)
    #[arg(long, conflicts_with = "peer_uid")]
    pub peer_user: Option<String>,
    /// A root-owned configuration file: the widest policy this executor will ever accept
    /// (reloads can only narrow it), and the confinement it applies to itself at start-up
    #[arg(long)]
    pub pin_config: Option<PathBuf>,
    /// Start every command from scratch instead of in a pre-started process (the same as
    /// III_SHELL_PRESTART=0)
    #[arg(long)]
    pub no_prestart: bool,
}

#[derive(Debug, Args)]
pub struct BrokerArgs {
    /// Connect to the executor listening on this socket (separate units)
    #[arg(long, conflicts_with = "executor_fd")]
    pub executor_socket: Option<PathBuf>,
    /// The executor's socket, inherited from `serve`
    #[arg(long, hide = true)]
    pub executor_fd: Option<i32>,
    /// The supervisor's control socket, inherited from `serve`
    #[arg(long, hide = true)]
    pub control_fd: Option<i32>,
    /// The seed configuration, already validated by `serve`
    #[arg(long, hide = true)]
    pub seed_json: Option<String>,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Machine-readable output
    #[arg(long)]
    pub json: bool,
    /// Inspect the executor listening on this socket instead of starting one
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Start the executor with this pinned envelope
    #[arg(long)]
    pub pin_config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CallArgs {
    /// Talk to a running executor on this socket instead of spawning one
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Function id, e.g. shell::exec
    pub function: String,
    /// JSON payload (default {})
    pub json: Option<String>,
}
