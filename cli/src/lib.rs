//! The `iii-shell` binary's library: the CLI and one module per subcommand. This is the only
//! crate that links both halves: `serve` (the supervisor) starts them, `executor` runs the
//! executor, `broker` runs the broker, and the rest are tools (`call`, `check-config`,
//! `doctor`, `probe`).

pub mod cli;
pub mod cmd_broker;
pub mod cmd_call;
pub mod cmd_check_config;
pub mod cmd_doctor;
pub mod cmd_executor;
pub mod cmd_probe;
pub mod cmd_serve;
pub mod heap;
pub mod probe_limits;
pub mod probe_network;
pub mod respawn_backoff;
pub mod seed;
pub mod spawn_executor;
