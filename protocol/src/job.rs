//! `shell::job::*`: background jobs a caller drives. Started like `shell::exec_bg` but with
//! stdin kept open as a pipe (`start`), fed any number of times (`write`), their output read
//! from an offset with long polling (`read`), signalled (`signal`) and waited for (`wait`).
//! Additions beside the seed's `shell::exec_bg` / `status` / `kill`, whose shapes stay as
//! they are.
//!
//! The JSON request/response types are the public ones; [`JobChunk`] and [`JobSignal`] also
//! cross the executor socket (postcard: no attribute it cannot round-trip on them).

use std::collections::BTreeMap;

use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::exec::JobStatus;

/// The longest `wait_ms` of `shell::job::read` and `timeout_ms` of `shell::job::wait`, in
/// ms: under the broker's 60 s call deadline, so a waiting caller is always answered.
pub const MAX_WAIT_MS: u64 = 30_000;
/// `shell::job::wait` without `timeout_ms` waits this long.
pub const DEFAULT_WAIT_MS: u64 = MAX_WAIT_MS;
/// `shell::job::read` without `max_bytes` returns at most this many bytes.
pub const DEFAULT_READ_BYTES: u64 = 64 * 1024;
/// The largest `max_bytes` of one `shell::job::read`.
pub const MAX_READ_BYTES: u64 = 1024 * 1024;

/// Wire request for `shell::job::start`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "JobStartRequest")]
pub struct JobStartRequest {
    /// Program name (PATH-resolved) or path to an executable, as a string; put arguments in `args`.
    pub command: String,
    /// Arguments, in order (all strings). Omit/null to tokenize `command` shell-words style; pass an array (even empty) to use it verbatim.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// Working directory; jail-confined like shell::fs::* paths (S215 on escape), must be an existing directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Per-call env values; exec-hijacking keys (PATH, IFS, HOME, LD_*/DYLD_*, …) reject the whole call S210.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Text written to the program's stdin first; stdin stays open for shell::job::write either way.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Ignored, as for host background jobs of shell::exec_bg (max_bg_timeout_ms bounds the job).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Wire request for `shell::job::write`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "JobWriteRequest")]
pub struct JobWriteRequest {
    /// The job, from shell::job::start.
    pub job_id: String,
    /// Text to write to the job's stdin (UTF-8). At most one of `data` and `data_base64`.
    #[serde(default)]
    pub data: Option<String>,
    /// Bytes to write to the job's stdin, base64 (standard alphabet, padded).
    #[serde(default)]
    pub data_base64: Option<String>,
    /// Close the job's stdin after writing (the program reads end-of-file); allowed with no data.
    #[serde(default)]
    pub close: bool,
}

/// Reply of `shell::job::write`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "JobWriteResponse")]
pub struct JobWriteResponse {
    pub job_id: String,
    /// Bytes written to the job's stdin: all that were given, unless the program stopped reading (then fewer, and the rest was not written).
    pub written: u64,
    /// True when the job's stdin is closed now.
    pub closed: bool,
}

/// Which output stream a read follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobStream {
    Stdout,
    Stderr,
    /// stdout and stderr interleaved in the order their bytes arrived.
    #[default]
    Merged,
}

/// Wire request for `shell::job::read`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "JobReadRequest")]
pub struct JobReadRequest {
    /// The job, from shell::job::start or shell::exec_bg.
    pub job_id: String,
    /// `stdout`, `stderr` or `merged` (both, in arrival order; the default). Each has its own offsets.
    #[serde(default)]
    pub stream: JobStream,
    /// Absolute offset in the stream to read from: 0 for the start, then the last reply's `next_offset`.
    #[serde(default)]
    pub offset: u64,
    /// At most this many bytes in the reply (1 to 1048576; default 65536).
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// When no byte is past `offset` yet and the stream has not ended, wait up to this many ms for one (0 to 30000; default 0).
    #[serde(default)]
    pub wait_ms: u64,
}

/// Reply of `shell::job::read`. The bytes are `data` when they are valid UTF-8, else `data_base64`: exactly one of the two is present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "JobReadResponse")]
pub struct JobReadResponse {
    pub job_id: String,
    pub stream: JobStream,
    /// Absolute offset of the first byte returned (the asked offset plus `missed`).
    pub offset: u64,
    /// The bytes, as text: present when they are valid UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// The bytes, base64: present when they are not valid UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
    /// The offset to read from next.
    pub next_offset: u64,
    /// Bytes between the asked offset and `offset` that fell out of the job's bounded output buffer: lost to this reader.
    pub missed: u64,
    /// True when the stream has ended (its pipe reached end-of-file and the job is done) and this reply reached its end: nothing more will come.
    pub ended: bool,
    /// The job's status now.
    pub status: JobStatus,
}

/// One read of a job's output, as the executor returns it (raw bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobChunk {
    pub offset: u64,
    #[serde(with = "crate::bytes")]
    pub bytes: Vec<u8>,
    pub next_offset: u64,
    pub missed: u64,
    pub ended: bool,
    pub status: JobStatus,
}

impl JobReadResponse {
    /// The public reply of a chunk: text when its bytes are valid UTF-8, else base64.
    pub fn from_chunk(job_id: String, stream: JobStream, c: JobChunk) -> Self {
        let (data, data_base64) = match String::from_utf8(c.bytes) {
            Ok(text) => (Some(text), None),
            Err(e) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(e.as_bytes())),
            ),
        };
        JobReadResponse {
            job_id,
            stream,
            offset: c.offset,
            data,
            data_base64,
            next_offset: c.next_offset,
            missed: c.missed,
            ended: c.ended,
            status: c.status,
        }
    }
}

/// The signals `shell::job::signal` sends; no other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobSignal {
    Term,
    Int,
    Hup,
    Quit,
    Kill,
    Stop,
    Cont,
    Usr1,
    Usr2,
}

impl JobSignal {
    pub const ALL: [JobSignal; 9] = [
        JobSignal::Term,
        JobSignal::Int,
        JobSignal::Hup,
        JobSignal::Quit,
        JobSignal::Kill,
        JobSignal::Stop,
        JobSignal::Cont,
        JobSignal::Usr1,
        JobSignal::Usr2,
    ];

    /// Its name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            JobSignal::Term => "TERM",
            JobSignal::Int => "INT",
            JobSignal::Hup => "HUP",
            JobSignal::Quit => "QUIT",
            JobSignal::Kill => "KILL",
            JobSignal::Stop => "STOP",
            JobSignal::Cont => "CONT",
            JobSignal::Usr1 => "USR1",
            JobSignal::Usr2 => "USR2",
        }
    }

    /// A signal by its wire name (`TERM`, or `SIGTERM`; upper case only). `None` for any
    /// name outside the set.
    pub fn parse(name: &str) -> Option<JobSignal> {
        let bare = name.strip_prefix("SIG").unwrap_or(name);
        JobSignal::ALL.into_iter().find(|s| s.name() == bare)
    }

    /// The message of a refused name (S210).
    pub fn refusal(name: &str) -> String {
        let set: Vec<&str> = JobSignal::ALL.iter().map(|s| s.name()).collect();
        let shown: String = name.chars().take(32).collect();
        format!(
            "signal {shown:?} is not one shell::job::signal sends: use one of {}",
            set.join(", ")
        )
    }
}

/// Wire request for `shell::job::signal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "JobSignalRequest")]
pub struct JobSignalRequest {
    /// The job, from shell::job::start or shell::exec_bg.
    pub job_id: String,
    /// One of TERM, INT, HUP, QUIT, KILL, STOP, CONT, USR1, USR2 (a `SIG` prefix is allowed); any other is S210. Sent to the job's process group.
    pub signal: String,
}

/// Reply of `shell::job::signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "JobSignalResponse")]
pub struct JobSignalResponse {
    pub job_id: String,
    /// The signal's name, without `SIG`.
    pub signal: String,
    /// True when the signal was sent; false when the job had already ended (see `reason`).
    pub sent: bool,
    pub status: JobStatus,
    pub reason: Option<String>,
}

/// Wire request for `shell::job::wait`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "JobWaitRequest")]
pub struct JobWaitRequest {
    /// The job, from shell::job::start or shell::exec_bg.
    pub job_id: String,
    /// Wait at most this many ms for the job to end (0 to 30000; default 30000), then return its record, `running` if it has not ended.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_exact_values() {
        let names: Vec<&str> = JobSignal::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            ["TERM", "INT", "HUP", "QUIT", "KILL", "STOP", "CONT", "USR1", "USR2"]
        );
        assert_eq!(JobSignal::parse("INT"), Some(JobSignal::Int));
        assert_eq!(JobSignal::parse("SIGUSR2"), Some(JobSignal::Usr2));
        for bad in [
            "",
            "SIG",
            "int",
            "SEGV",
            "SIGSEGV",
            "9",
            "SIGSIGINT",
            "TERM ",
        ] {
            assert_eq!(JobSignal::parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            JobSignal::refusal("SEGV"),
            "signal \"SEGV\" is not one shell::job::signal sends: use one of TERM, INT, HUP, QUIT, KILL, STOP, CONT, USR1, USR2"
        );
    }

    #[test]
    fn a_chunk_is_text_when_it_is_utf8_else_base64() {
        let chunk = |bytes: &[u8]| JobChunk {
            offset: 3,
            bytes: bytes.to_vec(),
            next_offset: 3 + bytes.len() as u64,
            missed: 1,
            ended: false,
            status: JobStatus::Running,
        };
        let r = JobReadResponse::from_chunk("j".into(), JobStream::Stdout, chunk("é\n".as_bytes()));
        assert_eq!(
            (r.data.as_deref(), r.data_base64.as_deref()),
            (Some("é\n"), None)
        );
        assert_eq!((r.offset, r.next_offset, r.missed), (3, 6, 1));
        let r = JobReadResponse::from_chunk("j".into(), JobStream::Merged, chunk(&[0xff, b'a']));
        assert_eq!(
            (r.data.as_deref(), r.data_base64.as_deref()),
            (None, Some("/2E="))
        );
        let json = serde_json::to_value(&r).unwrap();
        assert!(json.get("data").is_none(), "{json}");
        assert_eq!(json["stream"], "merged");
    }
}
