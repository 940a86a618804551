//! iii-shell's broker: the unprivileged, network-facing half.
//!
//! It validates every request into a typed value and forwards it to the executor over a Unix
//! socket. It never touches the host filesystem or runs programs itself.

pub mod call_deadline;
pub mod changed;
pub mod confine;
pub mod console_ui;
pub mod engine;
pub mod executor_client;
pub mod executor_source;
pub mod functions;
pub mod job_book;
pub mod lifecycle;
pub mod logging;
pub mod pending_calls;
pub mod pty_delivery;
pub mod sandbox_jobs;
pub mod schema;
pub mod services;
pub mod slots;
pub mod snapshot;
pub mod telemetry;
pub mod validate;
pub mod worker_identity;
