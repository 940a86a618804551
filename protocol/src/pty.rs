//! Terminal sessions (`shell::pty::*`): the public JSON types exactly as the ide 0.12.9
//! registry page publishes them, the output-target rule, and the messages that carry
//! sessions over the executor socket.
//!
//! Types carried over the executor socket use no serde attribute that postcard (not
//! self-describing) cannot round-trip.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

fn uint16(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "integer", "format": "uint16", "minimum": 0})
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "OpenRequest")]
pub struct OpenRequest {
    pub cwd: String,
    #[schemars(schema_with = "uint16")]
    pub cols: u16,
    #[schemars(schema_with = "uint16")]
    pub rows: u16,
    pub output_function_id: String,
    /// Program to run instead of the user's login shell (an agent CLI, REPL, TUI), resolved on the worker's PATH.
    #[serde(default)]
    pub program: Option<String>,
    /// argv for `program`. Ignored without `program` (a login shell takes no arguments here).
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// Extra environment on top of what the worker forwards; exec-hijacking keys (PATH, LD_*, DYLD_*, BASH_ENV, …) fail the call.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub request_id: Option<String>,
    /// What network the session's processes may reach, only ever tighter than the configured `confinement.network`: `allow` < `deny_bind` < `loopback` < `deny`; a wider value is S210.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::config::NetworkAccess>,
    /// Tighter limits for this session's job: memory_max_bytes, cpu_max_percent, pids_max; each at most the worker's confinement.job_limits (S210 naming the field above it).
    #[serde(default)]
    pub limits: Option<iii_shell_policy::call_limits::CallLimits>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "OpenResponse")]
pub struct OpenResponse {
    pub session_id: String,
    pub access_key: String,
    pub reconnect_token: String,
    pub cwd: String,
    pub pid: Option<u32>,
    /// The program the session runs; absent for a login shell.
    pub program: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "WriteRequest")]
pub struct WriteRequest {
    pub session_id: String,
    pub access_key: String,
    pub data: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "WriteResponse")]
pub struct WriteResponse {
    pub written: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ResizeRequest")]
pub struct ResizeRequest {
    pub session_id: String,
    pub access_key: String,
    #[schemars(schema_with = "uint16")]
    pub cols: u16,
    #[schemars(schema_with = "uint16")]
    pub rows: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ResizeResponse")]
pub struct ResizeResponse {
    #[schemars(schema_with = "uint16")]
    pub cols: u16,
    #[schemars(schema_with = "uint16")]
    pub rows: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "AttachRequest")]
pub struct AttachRequest {
    pub session_id: String,
    pub reconnect_token: String,
    pub after_sequence: u64,
    #[schemars(schema_with = "uint16")]
    pub cols: u16,
    #[schemars(schema_with = "uint16")]
    pub rows: u16,
    pub output_function_id: String,
    #[serde(default)]
    pub request_id: Option<String>,
}

/// Take back a session whose reconnect token is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "AdoptRequest")]
pub struct AdoptRequest {
    pub session_id: String,
    /// Where output goes next; must belong to the same console page family as the target it replaces.
    pub output_function_id: String,
    #[schemars(schema_with = "uint16")]
    pub cols: u16,
    #[schemars(schema_with = "uint16")]
    pub rows: u16,
    #[serde(default)]
    pub after_sequence: u64,
}

// One replayed frame: `data` is the frame's bytes, base64 (standard alphabet, padded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OutputFrame {
    pub sequence: u64,
    pub data: String,
}

// `"attached"`, `"detached"` or `{exited: {exit_code, signal, error}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionStatus {
    Attached,
    Detached,
    Exited {
        exit_code: Option<u32>,
        signal: Option<String>,
        error: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "AttachResponse")]
pub struct AttachResponse {
    pub access_key: String,
    pub reconnect_token: String,
    pub cwd: String,
    pub frames: Vec<OutputFrame>,
    pub next_sequence: u64,
    pub truncated: bool,
    pub status: SessionStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "DetachRequest")]
pub struct DetachRequest {
    pub session_id: String,
    pub access_key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "DetachResponse")]
pub struct DetachResponse {
    pub status: SessionStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "CloseRequest")]
pub struct CloseRequest {
    pub session_id: String,
    pub access_key: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "CloseResponse")]
pub struct CloseResponse {
    pub closed: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "SessionsRequest")]
pub struct SessionsRequest {}

/// One live session, without credentials: enough to tell a terminal that shows nothing apart from one that was never fed. A page that counts the frames it applied compares its own count against `sequence` — equal means the frames arrived and the browser is at fault, far behind means delivery is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionSummary {
    pub session_id: String,
    pub cwd: String,
    pub status: SessionStatus,
    /// Sequence number of the last frame the session produced.
    pub sequence: u64,
    /// Frames still replayable from the ring buffer.
    pub frames: usize,
    pub frame_bytes: usize,
    /// Whether the buffer has dropped frames a full replay would need.
    pub truncated: bool,
    pub pid: Option<u32>,
    pub program: Option<String>,
    /// Where output is being delivered; absent while detached.
    pub output_function_id: Option<String>,
    /// The console page family this session belongs to — the `<name>` in `iii::<name>-ui::pty-output::console-<browser>`. Present whether or not anyone is attached, because it is what a page uses to recognise its own orphaned session; it names a page, never a browser.
    pub ui: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "SessionsResponse")]
pub struct SessionsResponse {
    pub sessions: Vec<SessionSummary>,
}

/// A parsed output target `iii::<ui>-ui::pty-output::console-<browser>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputTarget<'a> {
    /// The page family (`<name>`).
    pub ui: &'a str,
    /// The browser id.
    pub browser: &'a str,
}

/// The longest page family and browser id accepted in an output target.
pub const MAX_UI_LEN: usize = 64;
pub const MAX_BROWSER_LEN: usize = 128;

/// Parses an output function id. The page family is `[A-Za-z0-9][A-Za-z0-9_.-]*` (at most
/// [`MAX_UI_LEN`]), the browser id `[A-Za-z0-9][A-Za-z0-9_-]*` (at most [`MAX_BROWSER_LEN`]);
/// anything else (another prefix, a `:` or a space inside, an empty part) is `None`.
pub fn parse_output_target(id: &str) -> Option<OutputTarget<'_>> {
    let rest = id.strip_prefix("iii::")?;
    let (ui_part, browser_part) = rest.split_once("::pty-output::console-")?;
    let ui = ui_part.strip_suffix("-ui")?;
    let ok_ui = !ui.is_empty()
        && ui.len() <= MAX_UI_LEN
        && ui.starts_with(|c: char| c.is_ascii_alphanumeric())
        && ui
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    let ok_browser = !browser_part.is_empty()
        && browser_part.len() <= MAX_BROWSER_LEN
        && browser_part.starts_with(|c: char| c.is_ascii_alphanumeric())
        && browser_part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    (ok_ui && ok_browser).then_some(OutputTarget {
        ui,
        browser: browser_part,
    })
}

/// The refusal text for an output id of the wrong shape.
pub fn bad_output_target(id: &str) -> String {
    format!(
        "output_function_id must have the shape iii::<name>-ui::pty-output::console-<browser-id>: got {id:?}"
    )
}

/// The longest caller id kept; a longer `_caller_worker_id` is cut to its first bytes at
/// a character boundary (engine worker ids are UUIDs).
pub const MAX_CALLER_LEN: usize = 128;

/// Who a call comes from: the `_caller_worker_id` the engine adds to the payload of a call
/// made by another worker connection, or `""` for a call without one (a call the engine
/// makes itself, e.g. a trigger fire). Every call without one counts as the same caller.
pub fn caller_of(payload: &serde_json::Value) -> String {
    let id = payload
        .get("_caller_worker_id")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    let mut end = id.len().min(MAX_CALLER_LEN);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    id[..end].to_string()
}

/// Largest decoded `write` payload.
pub const MAX_WRITE_BYTES: usize = 1024 * 1024;

/// Most output one invocation of a session's output function carries (decoded): the executor
/// pushes at most this much at a time and the broker coalesces pushes up to it. A keystroke's
/// echo in another session can wait behind one such delivery at each hop (the broker takes
/// floods in turns), so this is a trade: measured (BENCHMARKS.md), 128 KiB left a flood below
/// half the engine's own speed in 2 of 9 rounds with the echo at +1.4–1.7 ms under four
/// floods, 256 KiB put the echo at +3.2–4.4 ms, 192 KiB met both goals in every round.
pub const DELIVERY_BYTES: usize = 192 * 1024;

// ---- Executor socket ----

/// `open` after the broker has validated it; the executor checks every field again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenSpec {
    pub cwd: String,
    pub cols: u16,
    pub rows: u16,
    pub output_function_id: String,
    /// `None`: the login shell. `Some`: argv[0] is the program (PATH-resolved) and the rest
    /// its arguments.
    pub argv: Option<Vec<String>>,
    pub env: Vec<(String, String)>,
    /// Who opens it ([`caller_of`]): the session's holder, for the per-caller cap and
    /// `pty.adopt: opener`.
    pub caller: String,
    /// The session's own network mode (`None`: the configured one).
    pub network: Option<crate::config::NetworkAccess>,
    /// The call's `limits` (none asked: the default), checked again by the executor.
    pub limits: iii_shell_policy::call_limits::CallLimits,
}

/// A session operation on the executor socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum PtyOp {
    Open(OpenSpec),
    Write {
        session_id: String,
        access_key: String,
        #[serde(with = "crate::bytes")]
        data: Vec<u8>,
    },
    Resize {
        session_id: String,
        access_key: String,
        cols: u16,
        rows: u16,
    },
    Attach {
        session_id: String,
        reconnect_token: String,
        after_sequence: u64,
        cols: u16,
        rows: u16,
        output_function_id: String,
        /// Who attaches ([`caller_of`]); the session's holder from then on.
        caller: String,
    },
    Adopt {
        session_id: String,
        output_function_id: String,
        cols: u16,
        rows: u16,
        after_sequence: u64,
        /// Who adopts ([`caller_of`]); the session's holder from then on.
        caller: String,
    },
    Detach {
        session_id: String,
        access_key: String,
    },
    Close {
        session_id: String,
        access_key: String,
    },
    Sessions,
    /// The broker delivered everything of `session_id` through `sequence` (and the exit,
    /// when `exit`) for the attachment `epoch`.
    Ack {
        session_id: String,
        epoch: u64,
        sequence: u64,
        exit: bool,
    },
    /// The broker has answered the open/attach/adopt that started attachment `epoch`: its
    /// live output may be pushed now (after the replay the answer carried).
    Release {
        session_id: String,
        epoch: u64,
    },
    /// The output function of attachment `epoch` no longer exists: the session is
    /// detached (its output waits in the ring).
    TargetGone {
        session_id: String,
        epoch: u64,
    },
}

impl PtyOp {
    pub fn kind(&self) -> &'static str {
        match self {
            PtyOp::Open(_) => "pty_open",
            PtyOp::Write { .. } => "pty_write",
            PtyOp::Resize { .. } => "pty_resize",
            PtyOp::Attach { .. } => "pty_attach",
            PtyOp::Adopt { .. } => "pty_adopt",
            PtyOp::Detach { .. } => "pty_detach",
            PtyOp::Close { .. } => "pty_close",
            PtyOp::Sessions => "pty_sessions",
            PtyOp::Ack { .. } => "pty_ack",
            PtyOp::Release { .. } => "pty_release",
            PtyOp::TargetGone { .. } => "pty_target_gone",
        }
    }
}

/// A frame over the executor socket: raw bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawFrame {
    pub sequence: u64,
    #[serde(with = "crate::bytes")]
    pub data: Vec<u8>,
}

/// `attach` / `adopt` as the executor answers them (frames still raw).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attached {
    pub access_key: String,
    pub reconnect_token: String,
    pub cwd: String,
    pub frames: Vec<RawFrame>,
    pub next_sequence: u64,
    pub truncated: bool,
    pub status: SessionStatus,
    /// The attachment this started (see [`PtyOp::Release`]).
    pub epoch: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum PtyReply {
    /// The session and the epoch of its first attachment.
    Opened(OpenResponse, u64),
    Written(WriteResponse),
    Resized(ResizeResponse),
    Attached(Attached),
    /// With the epoch the session is in now.
    Detached(DetachResponse, u64),
    Closed(CloseResponse),
    Sessions(SessionsResponse),
    Subscribed,
    Done,
}

/// How a session's program ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyExit {
    pub exit_code: Option<u32>,
    pub signal: Option<String>,
    pub error: Option<String>,
}

/// Pushed by the executor to the subscribed connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PtyEvent {
    /// Output for the current target of `session_id`: the frames `first..=sequence`
    /// coalesced into `data`. `gap` is set when frames before `first` that this target had
    /// not been sent were evicted from the ring first. `exit` comes with the last output.
    Output {
        session_id: String,
        epoch: u64,
        target: String,
        first: u64,
        sequence: u64,
        #[serde(with = "crate::bytes")]
        data: Vec<u8>,
        gap: bool,
        exit: Option<PtyExit>,
        /// Sent before, to a connection that ended without acknowledging it; the same
        /// bounds and bytes as then (deliver it alone, so its receiver can tell).
        repeat: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_targets() {
        let t = parse_output_target("iii::shell-ui::pty-output::console-3f2a-bb").unwrap();
        assert_eq!((t.ui, t.browser), ("shell", "3f2a-bb"));
        let t = parse_output_target("iii::my-page-ui::pty-output::console-x").unwrap();
        assert_eq!((t.ui, t.browser), ("my-page", "x"));
        for bad in [
            "",
            "shell::exec",
            "iii::shell-ui::pty-output::console-",
            "iii::-ui::pty-output::console-a",
            "iii::shell::pty-output::console-a",
            "iii::shell-ui::pty-output::browser-a",
            "iii::shell-ui::pty-output::console-a::b",
            "iii::shell-ui::pty-output::console-a b",
            "iii::sh:ell-ui::pty-output::console-a",
            "xiii::shell-ui::pty-output::console-a",
            "iii::shell-ui::pty-output::console-a\n",
            "iii::shell-ui::pty-output::console-_a",
        ] {
            assert!(parse_output_target(bad).is_none(), "{bad:?}");
        }
        let long = format!("iii::shell-ui::pty-output::console-{}", "a".repeat(129));
        assert!(parse_output_target(&long).is_none());
    }

    #[test]
    fn callers() {
        use serde_json::json;
        assert_eq!(caller_of(&json!({"_caller_worker_id": "w-1"})), "w-1");
        assert_eq!(caller_of(&json!({})), "");
        assert_eq!(caller_of(&json!(null)), "");
        assert_eq!(caller_of(&json!({"_caller_worker_id": 7})), "");
        let long = "é".repeat(100); // 200 bytes
        let cut = caller_of(&json!({ "_caller_worker_id": long }));
        assert_eq!(cut, "é".repeat(64));
    }
}
