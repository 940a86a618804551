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
    /// default: ./config.yaml when it holds a shell configuration]. A launcher passes
    /// `--config` only when the worker's entry has a config block, and runs us in its own
    /// directory, whose `config.yaml` is the engine's: an implicit `./config.yaml` with no
    /// shell key at its top level is not ours, and is skipped with a warning.
    #[arg(long, global = true, env = "III_CONFIG", hide_env = true)]
    pub config: Option<PathBuf>,
    /// Configuration id to read and register [default: `shell`, or `shell-<III_NAMESPACE>`
    /// when a namespace is set]
    #[arg(long, global = true, env = "III_SHELL_CONFIG_ID")]
    pub config_id: Option<String>,
    /// `serve`: pin the executor to this root-owned envelope (the widest policy it accepts)
    #[arg(long = "pin-config", id = "serve_pin_config")]
    pub pin_config: Option<PathBuf>,
}

impl ServeArgs {
    /// The seed: `--config` (or `III_CONFIG`) when given, else `./config.yaml` (the seed's
    /// default) when it is a shell configuration, else the built-in default. A file that is
    /// named but missing falls back to the built-in default too; one that exists but does not
    /// parse is an error. An implicit `./config.yaml` whose top level has none of our keys
    /// (current or removed) is another program's, typically the engine's in the project
    /// directory a launcher runs us in: it is skipped with a warning.
    pub fn seed(&self) -> Result<iii_shell_protocol::config::Config, crate::seed::BootError> {
        match &self.config {
            Some(path) => crate::seed::load_seed(path),
            None => {
                let path = std::path::Path::new(IMPLICIT_CONFIG);
                match std::fs::read_to_string(path) {
                    Ok(text) if !is_shell_config(&text) => {
                        tracing::warn!(
                            path = IMPLICIT_CONFIG,
                            "not reading ./config.yaml: it has no shell configuration key at its top level (it looks like another program's, such as the engine's); the built-in default is the seed. Pass --config FILE to seed from a file"
                        );
                        Ok(iii_shell_protocol::config::Config::builtin_default())
                    }
                    _ => crate::seed::load_seed(path),
                }
            }
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
    /// Leave the worker's state alone: neither create its directories nor move an old store
    /// (what `doctor`'s own executor does: its environment may not be the service's)
    #[arg(long, hide = true)]
    pub no_state: bool,
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
    /// A descriptor, inherited from `serve`, holding the seed configuration (already
    /// validated) and the engine URL as JSON: never on the command line, which every local
    /// user can read in /proc
    #[arg(long, hide = true)]
    pub seed_fd: Option<i32>,
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

/// The seed file read when `--config` is not given (the seed's documented default).
pub const IMPLICIT_CONFIG: &str = "./config.yaml";

/// Top-level keys removed in older releases: a file holding one is a (stale) shell
/// configuration, refused loudly with its migration hint rather than skipped.
const REMOVED_TOP_LEVEL_KEYS: &[&str] = &[
    "inherit_env",
    "allowed_env",
    "allowlist",
    "migrated_from_coder",
];

/// Every current top-level key, read off the configuration model itself so that a key added
/// later counts without anyone remembering this list.
fn current_top_level_keys() -> Vec<String> {
    match serde_json::to_value(iii_shell_protocol::config::Config::builtin_default()) {
        Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Whether an implicit `./config.yaml` is ours to read. Anything that is not a YAML mapping
/// of only foreign keys is ours (so a broken shell configuration still aborts start-up, as
/// the seed says); a mapping with no shell key at its top level is another program's.
pub fn is_shell_config(text: &str) -> bool {
    match serde_norway::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => {
            let current = current_top_level_keys();
            map.is_empty()
                || map
                    .keys()
                    .any(|k| REMOVED_TOP_LEVEL_KEYS.contains(&k.as_str()) || current.contains(k))
        }
        _ => true,
    }
}

#[cfg(test)]
mod implicit_config_tests {
    use super::is_shell_config;

    #[test]
    fn which_implicit_files_are_ours() {
        // The engine's project config (what a launcher's working directory holds): not ours.
        assert!(!is_shell_config("workers:\n  - name: shell\n"));
        assert!(!is_shell_config("port: 49134\nmodules: []\n"));
        // Ours: the shipped file, a partial one, one with only a removed key, an empty one.
        assert!(is_shell_config(
            iii_shell_protocol::config::SHIPPED_CONFIG_YAML
        ));
        assert!(is_shell_config("fs: {allow_unjailed: true}\n"));
        assert!(is_shell_config("inherit_env: true\n"));
        assert!(is_shell_config("allowlist: []\nworkers: []\n"));
        assert!(is_shell_config(""));
        assert!(is_shell_config("{}"));
        // Not YAML at all, or not a mapping: read it as ours so the parse error aborts.
        assert!(is_shell_config("fs: [unclosed"));
        assert!(is_shell_config("- a\n- b\n"));
    }
}
