//! Public JSON types of `shell::fs::*` and `shell::workspace::*` (ide 0.12.9 shapes), and the
//! typed filesystem operations the executor accepts.
//!
//! Response types are also carried over the executor socket, so they use no serde attribute
//! that postcard cannot round-trip.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::exec::Target;

fn default_target() -> Target {
    Target::Host
}
fn yes() -> bool {
    true
}
fn mode_0755() -> String {
    "0755".to_string()
}
fn mode_0644() -> String {
    "0644".to_string()
}
fn ten_thousand() -> u64 {
    10_000
}
fn four_k() -> u64 {
    4096
}

/// Request for `shell::fs::ls`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "LsRequest")]
pub struct LsRequest {
    /// Jail-relative when fs.host_roots are set, else absolute.
    pub path: String,
    /// host (default) or { kind: "sandbox", sandbox_id }.
    #[serde(default = "default_target")]
    pub target: Target,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "StatRequest")]
pub struct StatRequest {
    /// Jail-relative when fs.host_roots are set, else absolute.
    pub path: String,
    /// host (default) or { kind: "sandbox", sandbox_id }.
    #[serde(default = "default_target")]
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "FsEntry")]
pub struct FsEntry {
    pub name: String,
    pub is_dir: bool,
    pub is_symlink: bool,
    pub mode: String,
    pub size: u64,
    pub mtime: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "LsResponse")]
pub struct LsResponse {
    /// Metadata for each entry in the directory.
    pub entries: Vec<FsEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "MkdirRequest")]
pub struct MkdirRequest {
    /// Jail-relative when fs.host_roots are set, else absolute.
    pub path: String,
    /// Octal permission string, e.g. "0755".
    #[serde(default = "mode_0755")]
    pub mode: String,
    /// Create missing parent directories.
    #[serde(default)]
    pub parents: bool,
    /// host (default) or { kind: "sandbox", sandbox_id }.
    #[serde(default = "default_target")]
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "MkdirResponse")]
pub struct MkdirResponse {
    /// True when a new directory was created; false when it already existed (only possible with `parents: true`, which is idempotent).
    pub created: bool,
    /// The directory path that was targeted. Empty for sandbox targets.
    #[serde(default)]
    pub path: String,
    /// True when the path already existed and `parents` was set. Host only; sandbox targets default this to false (not a signal there).
    #[serde(default)]
    pub already_existed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "RmRequest")]
pub struct RmRequest {
    /// Jail-relative when fs.host_roots are set, else absolute.
    pub path: String,
    /// Required to delete a non-empty directory.
    #[serde(default)]
    pub recursive: bool,
    /// host (default) or { kind: "sandbox", sandbox_id }.
    #[serde(default = "default_target")]
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "RmResponse")]
pub struct RmResponse {
    /// True when the path was removed.
    pub removed: bool,
    /// The path that was targeted. Empty for sandbox targets.
    #[serde(default)]
    pub path: String,
    /// True when the path existed before removal. Host only; sandbox targets default this to false, which does NOT mean the path was absent.
    #[serde(default)]
    pub was_present: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ChmodRequest")]
pub struct ChmodRequest {
    /// Jail-relative when fs.host_roots are set, else absolute.
    pub path: String,
    /// Octal permission string, e.g. "0755".
    pub mode: String,
    /// Optional chown to this numeric uid.
    #[serde(default)]
    pub uid: Option<u32>,
    /// Optional chown to this numeric gid.
    #[serde(default)]
    pub gid: Option<u32>,
    /// Apply mode/owner change to all files under the path recursively.
    #[serde(default)]
    pub recursive: bool,
    /// host (default) or { kind: "sandbox", sandbox_id }.
    #[serde(default = "default_target")]
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ChmodResponse")]
pub struct ChmodResponse {
    /// Number of filesystem entries whose mode/owner changed.
    #[serde(alias = "updated")]
    pub entries_changed: u64,
    /// The path that was targeted. Empty for sandbox targets.
    #[serde(default)]
    pub path: String,
    /// Whether the change was applied recursively. Host only.
    #[serde(default)]
    pub recursive: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "MvRequest")]
pub struct MvRequest {
    /// Source path; jail-relative when fs.host_roots are set, else absolute.
    pub src: String,
    /// Destination path; jail-relative when fs.host_roots are set, else absolute.
    pub dst: String,
    /// Replace an existing destination instead of returning an error.
    #[serde(default)]
    pub overwrite: bool,
    /// host (default) or { kind: "sandbox", sandbox_id }.
    #[serde(default = "default_target")]
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "MvResponse")]
pub struct MvResponse {
    /// True when the move/rename succeeded.
    pub moved: bool,
    /// Source path. Empty for sandbox targets.
    #[serde(default)]
    pub src: String,
    /// Destination path. Empty for sandbox targets.
    #[serde(default)]
    pub dst: String,
    /// True when an existing destination was overwritten. Host only (sandbox targets default this to false, not a signal there). Best-effort: derived from a pre-rename existence check, so under a concurrent writer racing the destination it may under-report (and an `overwrite:false` move can still replace a file created in that window).
    #[serde(default)]
    pub overwrote: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "GrepRequest")]
pub struct GrepRequest {
    /// Jail-relative when fs.host_roots are set, else absolute.
    pub path: String,
    /// Rust regex (RE2-like) matched against each line.
    pub pattern: String,
    /// Descend into subdirectories (default true).
    #[serde(default = "yes")]
    pub recursive: bool,
    /// Match pattern case-insensitively.
    #[serde(default)]
    pub ignore_case: bool,
    /// Glob filters restricting which file paths are searched.
    #[serde(default)]
    pub include_glob: Vec<String>,
    /// Glob filters excluding file paths from the search.
    #[serde(default)]
    pub exclude_glob: Vec<String>,
    /// Stop collecting matches after this many results (default 10 000).
    #[serde(default = "ten_thousand")]
    pub max_matches: u64,
    /// Skip lines longer than this many bytes (default 4 096).
    #[serde(default = "four_k")]
    pub max_line_bytes: u64,
    /// host (default) or { kind: "sandbox", sandbox_id }.
    #[serde(default = "default_target")]
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FsMatch {
    pub path: String,
    pub line: u64,
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "GrepResponse")]
pub struct GrepResponse {
    /// All collected match locations up to `max_matches`.
    pub matches: Vec<FsMatch>,
    /// True when the result was capped by `max_matches` or `max_line_bytes`.
    pub truncated: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "SedRequest")]
pub struct SedRequest {
    /// Rust regex by default; set regex:false for a literal string.
    pub pattern: String,
    /// String to substitute for each match.
    pub replacement: String,
    /// Explicit list of file paths to edit; provide either this or `path`, not both.
    #[serde(default)]
    pub files: Vec<String>,
    /// Root path to walk for files; used with `recursive`, `include_glob`, `exclude_glob`.
    #[serde(default)]
    pub path: Option<String>,
    /// Descend into subdirectories when `path` is set (default true).
    #[serde(default = "yes")]
    pub recursive: bool,
    /// Treat pattern as a regex (default true) or a literal string (false).
    #[serde(default = "yes")]
    pub regex: bool,
    /// Match pattern case-insensitively.
    #[serde(default)]
    pub ignore_case: bool,
    /// Replace only the first match per file instead of all matches.
    #[serde(default)]
    pub first_only: bool,
    /// Glob filters restricting which file paths are edited.
    #[serde(default)]
    pub include_glob: Vec<String>,
    /// Glob filters excluding file paths from editing.
    #[serde(default)]
    pub exclude_glob: Vec<String>,
    /// host (default) or { kind: "sandbox", sandbox_id }.
    #[serde(default = "default_target")]
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FsSedFileResult {
    pub path: String,
    pub replacements: u64,
    pub success: bool,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "SedResponse")]
pub struct SedResponse {
    /// Per-file replacement details.
    pub results: Vec<FsSedFileResult>,
    /// Sum of replacements made across all files.
    pub total_replacements: u64,
}

/// Direction of a channel end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ContentDirection {
    #[default]
    Read,
    Write,
}

/// Wire-identical mirror of `iii_sdk::channels::StreamChannelRef`. The SDK type lacks `JsonSchema` in 0.11.3, which would block typed registration of `shell::fs::write`/`read`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ContentRef {
    /// Opaque identifier for the open stream channel.
    pub channel_id: String,
    /// Secret key that authorises access to this channel.
    pub access_key: String,
    /// Direction of data flow: "read" (consume) or "write" (produce).
    #[serde(default)]
    pub direction: ContentDirection,
}

/// Write content: a plain string is written inline (host target only); an object is a streaming ContentRef { channel_id, access_key, direction }.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum WriteContentWire {
    /// Inline UTF-8 text, written verbatim. HOST target only.
    Inline(String),
    /// Open write-stream channel ref. Required for sandbox targets and large or streamed payloads.
    Stream(ContentRef),
}

/// One file in a batch `shell::fs::write` (`files: [...]`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct WriteFileSpec {
    /// Jail-relative when fs.host_roots are set, else absolute.
    pub path: String,
    /// Inline string (recommended) or a streaming ContentRef.
    pub content: WriteContentWire,
    /// Octal permission string, e.g. "0644".
    #[serde(default = "mode_0644")]
    pub mode: String,
    /// Create missing parent directories.
    #[serde(default)]
    pub parents: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "WriteRequest")]
pub struct WriteRequest {
    /// Single-file form: the path to write. Jail-relative when fs.host_roots are set, else absolute. Omit when using `files`.
    #[serde(default)]
    pub path: Option<String>,
    /// Single-file content: an inline string (host only) or a ContentRef { channel_id, access_key, direction } for an open write stream; omit with `files`.
    // No `#[serde(default)]`: a missing Option field reads as None anyway, and the published
    // schema has no `default` here.
    pub content: Option<WriteContentWire>,
    /// Octal permission string for the single-file form, e.g. "0644" (the default); omit when using `files`.
    #[serde(default)]
    pub mode: Option<String>,
    /// Create missing parent directories (single-file form, default false); omit when using `files`.
    #[serde(default)]
    pub parents: Option<bool>,
    /// Batch form: write several files in one call. When present, the single-file fields (`path`/`content`/`mode`/`parents`) must be omitted.
    // No `#[serde(default)]`: a missing Option field reads as None anyway, and the published
    // schema has no `default` here.
    pub files: Option<Vec<WriteFileSpec>>,
    /// host (default) or { kind: "sandbox", sandbox_id }.
    #[serde(default = "default_target")]
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WriteFileResult {
    /// Path of the written file.
    pub path: String,
    /// Bytes written to this file.
    pub bytes_written: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "WriteResponse")]
pub struct WriteResponse {
    /// Bytes written: this file for a single write; the sum across `files` for a batch write.
    pub bytes_written: u64,
    /// Path written for a single write; empty for a batch (see `files`).
    pub path: String,
    /// Per-file results for a batch (`files: [...]`) write; empty for a single-file write.
    #[serde(default)]
    pub files: Vec<WriteFileResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ReadRequest")]
pub struct ReadRequest {
    /// Jail-relative when fs.host_roots are set, else absolute.
    pub path: String,
    /// host (default) or { kind: "sandbox", sandbox_id }.
    #[serde(default = "default_target")]
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ReadResponseWire")]
pub struct ReadResponseWire {
    /// Channel reference for streaming the file content back to the caller.
    pub content: ContentRef,
    /// File size in bytes at the time of the read.
    pub size: u64,
    /// Octal permission string of the file, e.g. "0644".
    pub mode: String,
    /// Last-modified time as a Unix timestamp (seconds).
    pub mtime: i64,
}

/// What the executor learns about a file it is about to stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadStart {
    pub size: u64,
    pub mode: String,
    pub mtime: i64,
}

// ---- shell::workspace::* ----

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "WorkspaceRootsRequest")]
pub struct WorkspaceRootsRequest {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "WorkspaceRootsResponse")]
pub struct WorkspaceRootsResponse {
    pub roots: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "WorkspaceListRequest")]
pub struct WorkspaceListRequest {
    pub path: String,
    #[serde(default)]
    pub page_size: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceEntryKind {
    Dir,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkspaceEntry {
    pub name: String,
    pub path: String,
    pub kind: WorkspaceEntryKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "WorkspaceListResponse")]
pub struct WorkspaceListResponse {
    pub path: String,
    pub entries: Vec<WorkspaceEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "WorkspaceValidateRequest")]
pub struct WorkspaceValidateRequest {
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "WorkspaceValidateResponse")]
pub struct WorkspaceValidateResponse {
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "WorkspaceReadBytesRequest")]
pub struct WorkspaceReadBytesRequest {
    /// Absolute path, or relative to the primary root (same rules as coder::read-file).
    pub path: String,
    /// First byte of the range (default 0).
    #[serde(default)]
    pub offset: u64,
    /// Bytes to return; omitted or over the cap = `READ_BYTES_MAX_CHUNK`.
    #[serde(default)]
    pub length: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "WorkspaceReadBytesResponse")]
pub struct WorkspaceReadBytesResponse {
    /// Canonical absolute path.
    pub path: String,
    /// Offset the returned range starts at.
    pub offset: u64,
    /// Raw bytes in this chunk (before base64).
    pub length: u64,
    /// The chunk, base64 (standard alphabet, padded).
    pub content: String,
    /// Size of the whole file in bytes.
    pub size: u64,
    /// Last-modified time as a Unix epoch in seconds.
    pub mtime: i64,
    /// True when `offset + length` reached the end of the file.
    pub eof: bool,
}

/// Largest raw chunk `shell::workspace::read-bytes` returns per call.
pub const READ_BYTES_MAX_CHUNK: u64 = 4 * 1024 * 1024;

// ---- executor operations ----

/// A filesystem operation after broker validation (modes parsed, forms resolved). The
/// executor re-checks paths, modes and caps against its own policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FsOp {
    Ls {
        path: String,
    },
    Stat {
        path: String,
    },
    Mkdir {
        path: String,
        mode: u32,
        parents: bool,
    },
    Rm {
        path: String,
        recursive: bool,
    },
    Chmod {
        path: String,
        mode: u32,
        uid: Option<u32>,
        gid: Option<u32>,
        recursive: bool,
    },
    Mv {
        src: String,
        dst: String,
        overwrite: bool,
    },
    Grep(GrepSpec),
    Sed(SedSpec),
    /// Inline writes, applied in order; each file is atomic on its own.
    Write {
        files: Vec<WriteFile>,
    },
    /// A streamed write: the data follows as stream chunks on the same request id.
    WriteStream {
        path: String,
        mode: u32,
        parents: bool,
    },
    /// One entry of a streamed `files[]` batch: validated and written to a fsynced temp file
    /// beside its target, kept under `batch` until [`FsOp::WriteCommit`]; the data follows as
    /// stream chunks on the same request id. Replies `Write` (the entry's path and size).
    /// `index` of `count` names the entry in an error.
    WriteStage {
        batch: u64,
        index: u32,
        count: u32,
        path: String,
        mode: u32,
        parents: bool,
    },
    /// Installs every staged entry of `batch` in order. Replies `Write` with `files`.
    WriteCommit {
        batch: u64,
    },
    /// Drops every staged entry of `batch`; nothing is written. Replies `Write` (empty).
    WriteAbort {
        batch: u64,
    },
    /// A streamed read: the reply carries [`ReadStart`], then the data follows as chunks.
    Read {
        path: String,
    },
    WorkspaceRoots,
    WorkspaceList {
        path: String,
        page_size: Option<usize>,
    },
    WorkspaceValidate {
        path: String,
    },
    WorkspaceReadBytes {
        path: String,
        offset: u64,
        length: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteFile {
    pub path: String,
    pub mode: u32,
    pub parents: bool,
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrepSpec {
    pub path: String,
    pub pattern: String,
    pub recursive: bool,
    pub ignore_case: bool,
    pub include_glob: Vec<String>,
    pub exclude_glob: Vec<String>,
    pub max_matches: u64,
    pub max_line_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SedSpec {
    pub pattern: String,
    pub replacement: String,
    pub files: Vec<String>,
    pub path: Option<String>,
    pub recursive: bool,
    pub regex: bool,
    pub ignore_case: bool,
    pub first_only: bool,
    pub include_glob: Vec<String>,
    pub exclude_glob: Vec<String>,
}

/// Executor replies to filesystem operations.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FsReply {
    Ls(LsResponse),
    Stat(FsEntry),
    Mkdir(MkdirResponse),
    Rm(RmResponse),
    Chmod(ChmodResponse),
    Mv(MvResponse),
    Grep(GrepResponse),
    Sed(SedResponse),
    Write(WriteResponse),
    ReadStart(ReadStart),
    WorkspaceRoots(WorkspaceRootsResponse),
    WorkspaceList(WorkspaceListResponse),
    WorkspaceValidate(WorkspaceValidateResponse),
    WorkspaceReadBytes(WorkspaceReadBytesResponse),
}

pub use iii_shell_policy::mode::{mode_string, parse_mode};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_content_forms() {
        let w: WriteRequest =
            serde_json::from_value(serde_json::json!({"path": "a", "content": "text"})).unwrap();
        assert_eq!(w.content, Some(WriteContentWire::Inline("text".into())));
        let w: WriteRequest = serde_json::from_value(
            serde_json::json!({"path": "a", "content": {"channel_id": "c", "access_key": "k"}}),
        )
        .unwrap();
        assert!(matches!(
            w.content,
            Some(WriteContentWire::Stream(ContentRef {
                direction: ContentDirection::Read,
                ..
            }))
        ));
        let c: ChmodResponse = serde_json::from_value(serde_json::json!({"updated": 3})).unwrap();
        assert_eq!(c.entries_changed, 3);
    }
}
