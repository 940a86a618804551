//! The closed set of messages on the broker↔executor socket.
//!
//! The broker sends [`ClientFrame`]s, the executor answers with [`ServerFrame`]s. Requests carry
//! a broker-chosen id, so many calls can be in flight on one connection; replies and stream
//! chunks name the id they belong to. Events (job exits, …) are pushed without a request.
//!
//! Nothing here is trusted by the executor: every request is checked again on arrival.

use serde::{Deserialize, Serialize};

use crate::coder::{CoderCall, CoderReply};
use crate::exec::{ExecBgResponse, ExecResponse, KillResponse, ListResponse, StatusResponse};
use crate::fs::{FsOp, FsReply};
use crate::WireError;

/// First frame of a connection, sent by the broker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`MAGIC`]; guards against a stray client speaking something else.
    pub magic: [u8; 8],
    pub version: u32,
}

pub const MAGIC: [u8; 8] = *b"iiishell";

/// Frames the broker sends.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ClientFrame {
    Hello(Hello),
    Request {
        id: u64,
        request: Request,
        /// The broker span this request runs under, when telemetry is on (version 6).
        trace: Option<crate::trace::TraceContext>,
    },
    /// Abandon a request: the executor stops work on it (kills a foreground exec).
    Cancel {
        id: u64,
    },
    /// A chunk of a request's input stream (a streamed write).
    StreamData {
        id: u64,
        data: Vec<u8>,
    },
    /// End of a request's input stream; `error` when the source failed.
    StreamEnd {
        id: u64,
        error: Option<String>,
    },
    /// One chunk of the executor's output stream was consumed (credit for one more).
    StreamAck {
        id: u64,
    },
}

/// Frames the executor sends.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ServerFrame {
    HelloAck {
        version: u32,
        pid: u32,
    },
    /// The handshake was refused; the connection closes after this frame.
    Refused {
        reason: String,
    },
    Reply {
        id: u64,
        result: Result<Reply, WireError>,
    },
    Event(Event),
    /// A chunk of a request's output stream (a streamed read), after its reply.
    StreamData {
        id: u64,
        data: Vec<u8>,
    },
    /// End of a request's output stream; `error` when reading failed midway.
    StreamEnd {
        id: u64,
        error: Option<String>,
    },
    /// One chunk of the broker's input stream was consumed (credit for one more).
    StreamAck {
        id: u64,
    },
    /// Spans the executor measured for traced requests (version 6), after their replies.
    Spans(Vec<crate::trace::SpanRecord>),
    /// The executor's WARN and ERROR events (version 6), for the broker to ship.
    Logs(Vec<crate::trace::LogRecord>),
}

/// How many stream chunks may be in flight, unacknowledged, per request.
pub const STREAM_WINDOW: usize = 8;
/// Size of one stream chunk.
pub const STREAM_CHUNK: usize = 64 * 1024;

/// A command after the broker has validated it. The executor re-checks every field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecSpec {
    /// Final argv; `argv[0]` is the program (PATH-resolved by the executor when it has no `/`).
    pub argv: Vec<String>,
    /// Working directory as the caller wrote it; resolved through the jail by the executor.
    pub cwd: Option<String>,
    /// Per-call overrides, applied over the forwarded base environment.
    pub env: Vec<(String, String)>,
    /// Bytes written to stdin, then EOF. `None` means stdin is `/dev/null`.
    pub stdin: Option<Vec<u8>>,
    /// Timeout in ms, already resolved against the policy by the broker (re-clamped by the
    /// executor). Ignored by host background jobs.
    pub timeout_ms: u64,
    /// The call's own network mode (`None`: the configured one); the executor checks it is
    /// not wider ([`iii_shell_policy::network::for_call`]).
    pub network: Option<crate::config::NetworkAccess>,
    /// The call's `limits` (none asked: the default), checked again by the executor.
    pub limits: iii_shell_policy::call_limits::CallLimits,
}

/// Requests the executor accepts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Replace the policy. `config_json` is the whole `shell` configuration document; the
    /// executor parses and validates it itself.
    SetPolicy {
        generation: u64,
        config_json: String,
    },
    Exec(ExecSpec),
    ExecBg(ExecSpec),
    JobStatus {
        job_id: String,
    },
    JobList,
    JobKill {
        job_id: String,
    },
    Fs(FsOp),
    Doctor,
    Ping,
    /// A `coder::*` call (added in protocol version 2).
    Coder(Box<CoderCall>),
    /// A terminal-session operation (`shell::pty::*`; added in protocol version 3).
    Pty(crate::pty::PtyOp),
    /// The change feed: start or stop a binding's watcher (added in protocol version 4).
    Watch(crate::watch::WatchOp),
    /// Turn history: one `shell::turns::*` call (added in protocol version 4).
    Turns(crate::turns::TurnsCall),
    /// The console page's per-pane state (`shell::ui-state::*`; added in protocol version 5).
    UiState(crate::ui_state::UiStateOp),
    /// Memory and CPU of the executor (and its supervisor), running jobs and terminal
    /// sessions, for the worker's gauges (added in protocol version 6).
    Usage,
    /// Makes this connection the one live terminal output is pushed to (as
    /// [`crate::pty::PtyEvent::Output`]); the request stays open until the connection ends. A
    /// newer subscription replaces it, and everything not yet acknowledged is pushed again to
    /// the new one. (Version 7: a request of its own, no longer a `PtyOp`, so the session
    /// operations have no arm for it.)
    PtySubscribe,
    /// A `shell::fs::*` call scoped by the harness (`fs_scope.scope_root`): `op` with every
    /// path confined to `scope_root` (S220 outside it). The executor resolves and checks the
    /// scope itself. (Added in protocol version 8.)
    FsScoped {
        scope_root: String,
        op: FsOp,
    },
    /// `shell::job::start`: `ExecBg` with stdin kept open as a pipe (`stdin` is written first).
    /// (Added in protocol version 9, as are the other `Job*` requests below.)
    JobStart(ExecSpec),
    /// Write `data` to a job's stdin, then close it when `close`.
    JobWrite {
        job_id: String,
        #[serde(with = "crate::bytes")]
        data: Vec<u8>,
        close: bool,
    },
    /// Read a job's output from `offset`, waiting up to `wait_ms` for a first byte.
    JobRead {
        job_id: String,
        stream: crate::job::JobStream,
        offset: u64,
        max_bytes: u64,
        wait_ms: u64,
    },
    /// Send a signal to a job's process group.
    JobSignal {
        job_id: String,
        signal: crate::job::JobSignal,
    },
    /// Wait up to `timeout_ms` for a job to end; answered with its record.
    JobWait {
        job_id: String,
        timeout_ms: u64,
    },
}

impl Request {
    /// The filesystem operation of an `Fs` or `FsScoped` request.
    pub fn fs_op(&self) -> Option<&FsOp> {
        match self {
            Request::Fs(op) | Request::FsScoped { op, .. } => Some(op),
            _ => None,
        }
    }

    /// Short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::SetPolicy { .. } => "set_policy",
            Request::Exec(_) => "exec",
            Request::ExecBg(_) => "exec_bg",
            Request::JobStatus { .. } => "job_status",
            Request::JobList => "job_list",
            Request::JobKill { .. } => "job_kill",
            Request::Fs(_) | Request::FsScoped { .. } => "fs",
            Request::Doctor => "doctor",
            Request::Ping => "ping",
            Request::Coder(_) => "coder",
            Request::Pty(op) => op.kind(),
            Request::Watch(_) => "watch",
            Request::Turns(_) => "turns",
            Request::UiState(_) => "ui_state",
            Request::Usage => "usage",
            Request::PtySubscribe => "pty_subscribe",
            Request::JobStart(_) => "job_start",
            Request::JobWrite { .. } => "job_write",
            Request::JobRead { .. } => "job_read",
            Request::JobSignal { .. } => "job_signal",
            Request::JobWait { .. } => "job_wait",
        }
    }
}

/// Successful replies, one variant per request kind.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Reply {
    /// `warnings`: what holds under the accepted policy that commands will meet (a `HOME`
    /// they cannot use, a root or `working_dir` the command user cannot enter), each with
    /// its fix; `shell::config-status` shows them.
    PolicyAccepted {
        generation: u64,
        warnings: Vec<String>,
    },
    Exec(ExecResponse),
    ExecBg(ExecBgResponse),
    JobStatus(StatusResponse),
    JobList(ListResponse),
    JobKill(KillResponse),
    Fs(FsReply),
    Doctor(Box<crate::doctor::DoctorReport>),
    Pong,
    Coder(Box<CoderReply>),
    Pty(crate::pty::PtyReply),
    Watch(crate::watch::WatchReply),
    Turns(crate::turns::TurnsReply),
    UiState(crate::ui_state::UiStateReply),
    Usage(crate::trace::UsageReport),
    JobStart(ExecBgResponse),
    JobWrite(crate::job::JobWriteResponse),
    JobRead(crate::job::JobChunk),
    JobSignal(crate::job::JobSignalResponse),
    JobWait(StatusResponse),
}

/// Pushed by the executor without a request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Event {
    /// A background job left the `running` state.
    JobExited {
        job_id: String,
        status: crate::exec::JobStatus,
        exit_code: Option<i32>,
    },
    /// Terminal-session output, pushed only to the subscribed connection (never broadcast).
    Pty(crate::pty::PtyEvent),
    /// Coalesced changes of one binding's watched tree (one window's worth).
    Changed {
        binding_id: String,
        changes: Vec<crate::watch::Change>,
    },
    /// The executor dropped `count` events it could not hand to the broker in time: every
    /// binding may have missed changes (the broker sends each an overflow signal).
    EventsLost { count: u64 },
}
