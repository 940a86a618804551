//! Types shared by the two halves of iii-shell.
//!
//! * [`clock`]: [`clock::now_ms`], the wall clock in the unit of every `*_at_ms` field.
//! * [`frame`]: the length-prefixed postcard framing used on the broker↔executor socket.
//! * [`sink`]: writing frames to a socket shared by many tasks.
//! * [`bytes`]: bulk `Vec<u8>` fields copied in one piece by postcard.
//! * [`messages`]: the closed set of requests the executor accepts, its replies and events.
//! * [`error`]: the `{code, message}` wire error and the S-codes (from `iii_shell_policy`).
//! * [`exec`]: the public JSON request/response types of the exec family.
//! * [`job`]: the public JSON types of `shell::job::*` (jobs a caller drives) and their limits.
//! * [`trace`]: the telemetry that crosses the socket (trace context, spans, logs, usage).
//! * [`coder`]: the public JSON types of `coder::*`, its budgets and executor operations.
//! * [`config`]: the `shell` configuration document (the newest, ide 0.12.9 shape; from
//!   `iii_shell_policy`).

pub mod bytes;
pub mod call_trace;
pub mod clock;
pub mod coder;
pub mod doctor;
pub mod exec;
pub mod frame;
pub mod fs;
pub mod functions;
pub mod job;
pub mod messages;
pub mod pty;
pub mod sink;
pub mod trace;
pub mod turns;
pub mod ui_state;
pub mod watch;

/// The configuration model and the wire error live in the shared policy crate; re-exported
/// here so every message type and its vocabulary are reachable from one place.
pub use iii_shell_policy::{config, error};
pub use iii_shell_policy::{Code, WireCode, WireError};

/// Version of the broker↔executor protocol. Bumped on any incompatible change to
/// [`messages`]; a peer that speaks another version is refused during the handshake.
pub const PROTOCOL_VERSION: u32 = 9;

/// Package version, reported by `--version` and registered with the engine.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
