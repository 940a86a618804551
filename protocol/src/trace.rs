//! Telemetry that crosses the broker↔executor socket (added in protocol version 6).
//!
//! The executor talks to no network, so what it measures travels to the broker, which ships
//! it to the engine with its own:
//!
//! * [`TraceContext`] rides on a request (`ClientFrame::Request::trace`): the trace and the
//!   broker span the executor's spans are children of. No context, no executor span.
//! * [`SpanRecord`]s come back in `ServerFrame::Spans`, after the request's reply.
//! * [`LogRecord`]s (the executor's WARN and ERROR events) come in `ServerFrame::Logs`.
//! * `Request::Usage` asks for the executor's (and, under `serve`, the supervisor's) memory
//!   and CPU and the running jobs and terminal sessions ([`UsageReport`]).
//!
//! Attributes are a closed vocabulary chosen by the executor's code: counts, codes, flags and
//! durations, never argument values, environment values, file contents or terminal data.

use serde::{Deserialize, Serialize};

/// The W3C trace context of the broker span a request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    /// The broker's span the executor's spans hang under.
    pub span_id: [u8; 8],
    /// The W3C `sampled` flag.
    pub sampled: bool,
}

/// One attribute value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AttrValue {
    Str(String),
    Int(i64),
    Bool(bool),
}

/// A finished span measured by the executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanRecord {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_span_id: [u8; 8],
    pub name: String,
    /// Wall-clock times, nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub attributes: Vec<(String, AttrValue)>,
    /// The wire code of a failure (`S211`, `C210`, …); `None` for success.
    pub error_code: Option<String>,
}

/// Severity of a relayed log event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Severity {
    Info,
    Warn,
    Error,
}

/// A log event of the executor, relayed to the broker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogRecord {
    pub unix_ns: u64,
    pub severity: Severity,
    /// The `tracing` target (the module that logged it).
    pub target: String,
    /// The formatted message and fields, as the local log line shows them.
    pub body: String,
    /// The trace and span of the request being handled, when it carried a context.
    pub trace: Option<([u8; 16], [u8; 8])>,
}

/// Memory and CPU of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProcessUsage {
    pub rss_bytes: u64,
    /// The file-backed part of `rss_bytes` (pages of the binary and libraries).
    pub file_bytes: u64,
    /// User plus system CPU time since the process started.
    pub cpu_micros: u64,
}

/// The answer to `Request::Usage`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UsageReport {
    pub executor: ProcessUsage,
    /// The `serve` supervisor (the executor's parent) when the executor runs under one.
    pub supervisor: Option<ProcessUsage>,
    pub running_jobs: u64,
    pub pty_sessions: u64,
}
