//! `coder::*`: the public JSON types (ide 0.12.9 shapes, checked against the seed by
//! `broker/tests/schema_conformance.rs`), the budgets, and the typed operations the executor
//! accepts.
//!
//! The JSON request types are parsed by the broker. Two of them cannot cross the postcard
//! socket as they are (`ReadTarget` is untagged, `UpdateOp` internally tagged), so the broker
//! turns every request into a [`CoderOp`] of plain types; the response types are plain
//! structs and travel as they are.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

// ---- budgets (reported by coder::info; decisions documented in the README) ----

/// Aggregate returned-content budget of one batch `coder::read-file` (`paths[]`).
pub const BATCH_READ_BUDGET_BYTES: u64 = 256 * 1024;
/// `coder::list-folder` page size when the caller gives none.
pub const LIST_DEFAULT_PAGE_SIZE: u32 = 200;
/// Largest `page_size` `coder::list-folder` accepts (larger values are clamped).
pub const LIST_MAX_PAGE_SIZE: u32 = 1000;
/// `coder::search` `max_matches` when the caller gives none.
pub const SEARCH_DEFAULT_MAX_MATCHES: u32 = 200;
/// `coder::search` `max_line_bytes` when the caller gives none.
pub const SEARCH_DEFAULT_MAX_LINE_BYTES: u32 = 512;
/// Payload bytes (paths + matched text + context lines) of one `coder::search` response.
pub const SEARCH_RESPONSE_BUDGET_BYTES: u64 = 64 * 1024;
/// Most context lines before or after a match (C210 above).
pub const SEARCH_MAX_CONTEXT_LINES: u32 = 10;
/// `coder::tree` `max_depth` when the caller gives none.
pub const TREE_DEFAULT_DEPTH: u32 = 3;
/// Largest `max_depth` `coder::tree` honours (larger values are clamped), so a response can
/// never nest deeper than this.
pub const TREE_MAX_DEPTH: u32 = 32;
/// `coder::tree` children per folder when the caller gives none.
pub const TREE_PER_FOLDER_LIMIT: u32 = 100;
/// Nodes in one `coder::tree` snapshot; the folders it cuts get `reason: "max_nodes"`.
pub const TREE_MAX_NODES: u32 = 2000;
/// Echo bytes (all echoed lines together) of one `coder::update-file` result.
pub const ECHO_BUDGET_BYTES: usize = 4096;
/// Lines one line-op echo shows before its middle is elided.
pub const ECHO_MAX_LINES: usize = 12;
/// Context lines around a line-op echo.
pub const ECHO_CONTEXT_LINES: usize = 2;
/// Match sites one `replace` op echoes.
pub const ECHO_MAX_REPLACE_SITES: usize = 5;

fn dot() -> String {
    ".".to_string()
}
fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}
fn mode_0644() -> String {
    "0644".to_string()
}

/// Structured per-entry error as it appears on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(
    rename = "WireError",
    description = "Structured per-entry error as it appears on the wire.\n\nUse `code` for stable programmatic branching (e.g. `\"C211\"` for not-found-or-denied). `message` carries the human/LLM-readable problem description plus the corrective next call."
)]
pub struct EntryError {
    /// Stable error code, e.g. "C211". See the README error table.
    pub code: String,
    /// Human/LLM-readable message: problem + actual values + corrective next call.
    pub message: String,
}

impl From<crate::WireError> for EntryError {
    fn from(e: crate::WireError) -> Self {
        EntryError {
            code: e.code.to_string(),
            message: e.message,
        }
    }
}

// ---- coder::info ----

/// No arguments — `coder::info` is a pure discovery call.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "InfoInput", example = json!({}))]
pub struct InfoInput {}

/// Effective access mode of the coder surface — the same deny-only policy switch `shell::fs::*` runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AccessMode {
    /// Paths are confined to `base_paths`; anything outside is rejected.
    Jailed,
    /// Operator opt-in (`fs.allow_unjailed: true`, empty `fs.host_roots`): absolute paths anywhere on the host are accepted, confined only by `fs.denylist_paths` and `non_accessible_globs`. `base_paths` only anchor relative wire paths.
    Unjailed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "InfoOutput")]
pub struct InfoOutput {
    /// `jailed`: paths must stay inside `base_paths`. `unjailed`: absolute paths anywhere on the host are accepted (deny-only, like `shell::fs::*`) and `base_paths` only anchor relative paths.
    pub mode: AccessMode,
    /// Canonical absolute paths of the allowed roots, in configuration order. The primary root (index 0) is where relative wire paths resolve; an absolute path is accepted when it canonicalises inside ANY of these (in `unjailed` mode: anywhere on the host). In `jailed` mode paths outside every root are rejected — use `shell::fs::*` instead.
    pub base_paths: Vec<String>,
    /// Convenience duplicate of `base_paths[0]` — the primary allowed root. Relative paths resolve against this directory UNLESS `session_root` is set, which takes precedence.
    pub primary_root: String,
    /// The session's working directory when the caller runs under a harness-stamped filesystem scope; `null` otherwise. When set, THIS is what relative wire paths (and `coder::search` glob matching) anchor against — not `primary_root`. In `unjailed` mode it may sit outside every `base_paths` entry, so a relative path that looks wrong against the allowed roots can still be correct here. Check it first when a relative path was rejected.
    pub session_root: Option<String>,
    /// Coder worker version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// Per-file IO ceiling for `coder::read-file`. Full reads of files larger than this are rejected with C218; windowed reads cap the returned window bytes instead, so larger files stay readable window by window. Also the ceiling for `coder::search` content scanning — larger files are silently skipped during search.
    pub max_read_bytes: u64,
    /// Maximum bytes that `coder::create-file` or `coder::update-file` will accept for a single file write. Larger writes are rejected with C218.
    pub max_write_bytes: u64,
    /// Context budget for single-path FULL reads in `coder::read-file`, in bytes of returned content. Full reads larger than this return C218 with the file's size/line count and window/stat recovery guidance; a per-call `max_output_bytes` override is available on `coder::read-file` (clamped to `max_read_bytes`).
    pub max_output_bytes: u64,
    /// Aggregate budget across a single `paths[]` batch call to `coder::read-file`, measured in bytes of returned content (after UTF-8 sanitization — invalid bytes expand to U+FFFD before being counted, so the cap bounds what the caller actually receives). Entries are collected in request order; each entry may consume up to `min(remaining_budget, max_read_bytes)`. An entry reached with zero remaining budget receives a per-entry C218 naming this key, its value, and the bytes already consumed, with recovery guidance. Budget topology: batch reads are governed by this key; single-path full reads by `max_output_bytes`; windowed reads by `max_read_bytes` applied per returned window — `max_read_bytes` is also the per-file IO ceiling for all of them.
    pub batch_read_budget_bytes: u64,
    /// Default `page_size` used by `coder::list-folder` when the caller omits it.
    pub list_default_page_size: u32,
    /// Hard cap on `page_size` accepted by `coder::list-folder`.
    pub list_max_page_size: u32,
    /// Default `max_matches` used by `coder::search` when the caller omits it.
    pub search_default_max_matches: u32,
    /// Per-line byte cap in `coder::search`: matching considers at most this many bytes of each line, and matched/context lines are truncated to it.
    pub search_default_max_line_bytes: u32,
    /// Aggregate byte budget for one `coder::search` response, measured in payload bytes (paths + matched text + context lines). When the budget is hit the response sets `truncated: true` — refine the query or add `include_globs`.
    pub search_response_budget_bytes: u64,
    /// Default `max_depth` used by `coder::tree` when the caller omits it.
    pub tree_default_depth: u32,
    /// Maximum entries returned per folder node by `coder::tree`; folders that exceed this are flagged `truncated`.
    pub tree_per_folder_limit: u32,
    /// Glob patterns matched per root (root-relative). Files whose root-relative path matches are listable but not readable/writable/deletable/creatable; they return C211.
    pub non_accessible_globs: Vec<String>,
    /// Noise-exclusion globs (root-relative, same matching as `non_accessible_globs`): matching paths (node_modules, .git, …) are omitted from `coder::search` results and pruned from `coder::tree` descent — the directory surfaces as a childless `truncated` stub. Hide-only — no access protection. Pass `use_default_excludes: false` on those calls to look inside.
    pub default_exclude_globs: Vec<String>,
}

// ---- coder::read-file ----

/// Wire encoding for returned `content`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReadEncoding {
    /// UTF-8 text; invalid bytes replaced by U+FFFD.
    #[default]
    Text,
    /// Exact file bytes, base64-encoded (standard alphabet, padded).
    Base64,
}

/// One batch entry: a bare path string (whole-file read) or an object with a per-entry window, stat or numbered flag.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ReadTarget {
    /// Bare path string: read the whole file.
    Path(String),
    /// Object form: path plus optional window and flags.
    Entry {
        /// File to read.
        path: String,
        /// First line of the window, 1-based inclusive (>= 1); defaults to 1 when only `line_to` is set.
        #[serde(default)]
        #[schemars(range(min = 1))]
        line_from: Option<u64>,
        /// Last line of the window, 1-based inclusive, >= `line_from`; omit to read to EOF.
        #[serde(default)]
        #[schemars(range(min = 1))]
        line_to: Option<u64>,
        /// Prefix this entry's lines with their absolute 1-based line numbers (`N→`); prefix bytes count toward the batch budget.
        #[serde(default)]
        numbered: bool,
        /// Metadata probe for this entry: size/mode/mtime plus total_lines, content null, no budget consumed; C210 with a window or `numbered`.
        #[serde(default)]
        stat: bool,
    },
}

fn drop_encoding_default(schema: &mut schemars::Schema) {
    if let Some(enc) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("encoding"))
        .and_then(|e| e.as_object_mut())
    {
        enc.remove("default");
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(
    title = "ReadFileInput",
    transform = drop_encoding_default,
    example = json!({"line_from": 10, "line_to": 50, "path": "src/main.rs"}),
    example = json!({"paths": ["src/lib.rs", {"line_from": 1, "line_to": 30, "path": "src/config.rs"}]})
)]
pub struct ReadFileInput {
    /// Single file to read; XOR with `paths` (C210 if both or neither is set).
    #[serde(default)]
    pub path: Option<String>,
    /// Batch of files to read in one call (bare path strings or window objects), processed in order against batch_read_budget_bytes; XOR with `path`.
    pub paths: Option<Vec<ReadTarget>>,
    /// Metadata probe: size/mode/mtime plus total_lines/is_utf8, no content; C210 with line_from/line_to/numbered/max_output_bytes.
    #[serde(default)]
    pub stat: bool,
    /// First line (1-based, >= 1) of a windowed read; windows keep files over max_read_bytes readable slice by slice. `path` mode only.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub line_from: Option<u64>,
    /// Last line of the window, 1-based inclusive, >= `line_from`; omit to read from `line_from` to EOF. `path` mode only.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub line_to: Option<u64>,
    /// Prefix each line with its absolute 1-based file line number (`N→`), matching coder::update-file line ops; C210 with `stat`. `path` mode only.
    #[serde(default)]
    pub numbered: bool,
    /// Content encoding for full reads; `base64` returns the exact file bytes (encoded length is budgeted). C210 with stat/window/numbered.
    #[serde(default)]
    pub encoding: ReadEncoding,
    /// Full-read byte budget (returned bytes, clamped to max_read_bytes); over budget fails C218 naming size/total_lines. C210 with a window.
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
}

/// Per-entry result in a batch `paths[]` response.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct ReadEntryResult {
    /// Canonical absolute path of the file (resolved through the jail). If resolution failed, this echoes the caller's input verbatim.
    pub path: String,
    /// `true` when the read succeeded (content/metadata fields are populated); `false` when an error occurred (only `error` is set).
    pub success: bool,
    /// File content as a UTF-8 string — the whole file or the requested window. Binary bytes are replaced by U+FFFD (`is_utf8: false`). `null` on failure.
    pub content: Option<String>,
    /// Size of the FILE in bytes (from metadata). `null` on failure or when the entry budget was exhausted before the file was opened.
    pub size: Option<u64>,
    /// Unix permission bits (lower 9 bits of `st_mode`), e.g. 0o644. `null` on failure.
    pub mode: Option<u32>,
    /// Last-modified time as a Unix epoch in seconds. `null` on failure.
    pub mtime: Option<i64>,
    /// Number of lines returned in `content`. `null` on failure.
    pub lines_returned: Option<u64>,
    /// Total lines in the file; present when the stream reached EOF during this entry's read. `null` when not traversed or on failure.
    pub total_lines: Option<u64>,
    /// `true` when the file has content beyond what `content` includes (window ended before EOF, or byte budget cut the window short). `null` on failure.
    pub more_lines: Option<bool>,
    /// Whether `content` survived UTF-8 conversion without losing bytes. `null` on failure.
    pub is_utf8: Option<bool>,
    /// Structured error — present only when `success: false`.
    pub error: Option<EntryError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ReadFileOutput")]
pub struct ReadFileOutput {
    /// Canonical absolute path of the file read (resolved through the jail). **Single-path mode only; null when the request used `paths[]`.**
    pub path: Option<String>,
    /// File content as a UTF-8 string — the whole file, or just the requested window when `line_from`/`line_to` was given (window lines keep their newline terminators). Binary content is returned with invalid bytes replaced by U+FFFD; request `encoding: "base64"` when exact bytes matter (content is then the file's bytes base64-encoded). **Single-path mode only; null when the request used `paths[]`.**
    pub content: Option<String>,
    /// Size of the FILE in bytes (from metadata) — not the size of `content`; in windowed mode the two differ. **Single-path mode only; null when the request used `paths[]`.**
    pub size: Option<u64>,
    /// Unix permission bits (lower 9 bits of `st_mode`), e.g. 0o644. **Single-path mode only; null when the request used `paths[]`.**
    pub mode: Option<u32>,
    /// Last-modified time as a Unix epoch in seconds. **Single-path mode only; null when the request used `paths[]`.**
    pub mtime: Option<i64>,
    /// Number of lines in `content`. For full reads this equals the file's total line count. **Single-path mode only; null when the request used `paths[]`.**
    pub lines_returned: Option<u64>,
    /// Total number of lines in the file. Present only when the read traversed the whole file: always for full reads; for windowed reads only when the stream naturally reached EOF within the byte cap. Never computed by forcing an extra full scan — absent means the file was not fully traversed. **Single-path mode only; null when the request used `paths[]`.**
    pub total_lines: Option<u64>,
    /// True when the file has content beyond what `content` includes: the window ended before EOF, or the byte budget cut the window short. Always false for full reads. **Single-path mode only; null when the request used `paths[]`.**
    pub more_lines: Option<bool>,
    /// Whether `content` survived UTF-8 conversion without losing bytes. Reflects the RETURNED content only: a clean window inside an otherwise-binary file is still `true`. **Single-path mode only; null when the request used `paths[]`.**
    pub is_utf8: Option<bool>,
    /// Opaque identity of the file's exact bytes. Present for complete single-path reads only; pass it as `expected_revision` to `coder::create-file` for a conflict-safe whole-file overwrite.
    pub revision: Option<String>,
    /// Per-entry results for a batch `paths[]` request. **Present only when the request used `paths[]`; null in single-path mode.**
    pub results: Option<Vec<ReadEntryResult>>,
}

// ---- coder::search ----

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(
    title = "SearchInput",
    example = json!({"context_lines_after": 2, "context_lines_before": 2, "include_globs": ["**/*.rs"], "path": "src", "query": "fn handle", "search_content": true, "search_paths": false})
)]
pub struct SearchInput {
    /// Pattern to search for. Treated as a regex when `regex: true`, otherwise as a literal substring. May be empty only when `search_content` is false: a path-only search with no query lists every path (with `fuzzy_paths`, shallow and short paths first).
    pub query: String,
    /// Folder to search (default `.`); globs match relative to its root, result paths are absolute.
    #[serde(default = "dot")]
    pub path: String,
    #[serde(default)]
    pub regex: bool,
    #[serde(default)]
    pub ignore_case: bool,
    /// Search file contents (default true).
    #[serde(default = "yes")]
    pub search_content: bool,
    /// Search file paths (default true).
    #[serde(default = "yes")]
    pub search_paths: bool,
    /// Root-relative glob patterns paths must match; empty = everything.
    #[serde(default)]
    pub include_globs: Vec<String>,
    /// Glob patterns (same relative-to-root matching) that exclude paths.
    #[serde(default)]
    pub exclude_globs: Vec<String>,
    /// Lines of context before each content match (max 10, C210 above); truncated to max_line_bytes and counted in the budget. Default 0.
    #[serde(default)]
    pub context_lines_before: Option<u32>,
    /// Lines of context after each content match; same rules as `context_lines_before`.
    #[serde(default)]
    pub context_lines_after: Option<u32>,
    /// Optional explicit cap. Falls back to config when unset.
    #[serde(default)]
    pub max_matches: Option<u32>,
    /// Bytes per line to consider when scanning content; longer lines are truncated for the match snippet.
    #[serde(default)]
    pub max_line_bytes: Option<u32>,
    /// Skip paths matching default_exclude_globs (.git, node_modules, …; see coder::info) in content and path results; false searches inside them.
    #[serde(default = "yes")]
    pub use_default_excludes: bool,
    /// Walk dot-files and dot-folders (`.github`, `.env`, …); default true. `false` leaves them out, the way an editor's quick open does.
    #[serde(default = "yes")]
    pub include_hidden: bool,
    /// Honour `.gitignore`/`.ignore` rules (inside a Git repository) while walking, the way an editor's search does; default false keeps every non-excluded file searchable.
    #[serde(default)]
    pub respect_gitignore: bool,
    /// Rank path matches by fuzzy subsequence score (quick-open style) instead of substring/regex matching; `path_matches` then comes back best first. Content matching is unaffected.
    #[serde(default)]
    pub fuzzy_paths: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ContentMatch {
    /// Absolute path under the canonical parent; symlinks at the entry itself are not resolved. Operations on it re-validate through the jail.
    pub path: String,
    pub line: u32,
    pub column: u32,
    /// Matched line; truncated to `max_line_bytes` and never spans newlines.
    pub text: String,
    /// Context lines immediately before the matched line — same file only, in file order, each truncated to `max_line_bytes`. Omitted when empty (no `context_lines_before` requested, or the match is at the start of the file).
    pub before: Option<Vec<String>>,
    /// Context lines immediately after the matched line — same file only, in file order, each truncated to `max_line_bytes`. Omitted when empty (no `context_lines_after` requested, or the match is at the end of the file).
    pub after: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PathMatchKind {
    File,
    Dir,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PathMatch {
    /// Absolute path under the canonical parent; symlinks at the entry itself are not resolved. Operations on it re-validate through the jail.
    pub path: String,
    /// What matched: `file` or `dir`. Directories match by NAME only — content search never reads them.
    pub kind: PathMatchKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "SearchOutput")]
pub struct SearchOutput {
    pub content_matches: Vec<ContentMatch>,
    pub path_matches: Vec<PathMatch>,
    /// True if results were cut off — either match list hit the `max_matches` cap, or the response hit the `search_response_budget_bytes` byte budget. When true, refine the query or add include_globs rather than paginate.
    pub truncated: bool,
}

// ---- coder::list-folder ----

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ListFolderInput", example = json!({"page": 1, "page_size": 50, "path": "src"}))]
pub struct ListFolderInput {
    /// Folder to list (default `.`).
    #[serde(default = "dot")]
    pub path: String,
    #[serde(default = "one")]
    pub page: u32,
    /// Capped at list_max_page_size; defaults to list_default_page_size (see coder::info).
    #[serde(default)]
    pub page_size: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DirEntry {
    /// Entry basename. The absolute path is derivable from the response's `path`: entry path = folder path + "/" + name.
    pub name: String,
    pub kind: EntryKind,
    pub size: u64,
    pub mtime: i64,
    /// True if this entry matches `non_accessible_globs` — caller cannot read/write/delete it via `coder::*` even though it shows up here.
    pub non_accessible: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ListFolderOutput")]
pub struct ListFolderOutput {
    /// Canonical absolute path of the listed folder (resolved through the jail). Entries carry only `name`; derive an entry's absolute path by joining: entry path = this path + "/" + name. Operations on derived paths re-validate through the jail.
    pub path: String,
    pub entries: Vec<DirEntry>,
    pub total: u64,
    pub page: u32,
    pub page_size: u32,
    pub has_more: bool,
}

// ---- coder::tree ----

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "TreeInput", example = json!({"max_depth": 3, "path": "."}))]
pub struct TreeInput {
    /// Base folder for the snapshot (default `.`).
    #[serde(default = "dot")]
    pub path: String,
    /// Maximum depth to descend; the root node is depth 0.
    #[serde(default)]
    pub max_depth: Option<u32>,
    /// Maximum children listed per folder. When more exist, the folder is flagged `truncated` and callers should switch to `coder::list-folder`.
    #[serde(default)]
    pub per_folder_limit: Option<u32>,
    /// List dot-prefixed entries; false omits them at every level (they then don't count toward per_folder_limit). The requested root is exempt.
    #[serde(default = "yes")]
    pub include_hidden: bool,
    /// Prune directories matching default_exclude_globs (see coder::info) into childless `truncated` stubs; false lists everything.
    #[serde(default = "yes")]
    pub use_default_excludes: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TruncationInfo {
    /// Reason this folder was truncated: hit `per_folder_limit`, cut off by `max_depth`, matched `default_exclude_globs` (`default_exclude`), omitted matching non-directory children, or the snapshot's total node budget ran out (`max_nodes`).
    pub reason: String,
    /// Number of children actually returned.
    pub shown: u32,
    /// Total number of children eligible for listing in the folder, counted after hidden and default-exclude filtering (only populated when `reason == "per_folder_limit"`; for depth truncation we don't peek into the folder).
    pub total: Option<u32>,
    pub hint: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TreeNode {
    /// Entry basename. The ROOT node's path is the response's top-level `path` itself; every other node's path derives by joining from there: child path = parent path + "/" + name.
    pub name: String,
    pub kind: NodeKind,
    pub size: u64,
    pub mtime: i64,
    pub non_accessible: bool,
    pub children: Option<Vec<TreeNode>>,
    /// Set on directories whose `children` was capped at `per_folder_limit`, whose subtree was cut off by `max_depth`, which matched `default_exclude_globs` or omitted matching non-directory children (reason "default_exclude"), or where the snapshot's node budget ran out (reason "max_nodes").
    pub truncated: Option<TruncationInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "TreeOutput")]
pub struct TreeOutput {
    /// Canonical absolute path of the requested folder (resolved through the jail). Nodes carry only `name`, and the root node's path IS this `path` — do not join the root's `name` onto it; derive children by joining from here: child path = parent path + "/" + name. Operations on derived paths re-validate through the jail.
    pub path: String,
    /// Root node of the snapshot; its `name` is the folder's basename.
    pub root: TreeNode,
}

// ---- coder::create-file ----

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CreateFileSpec {
    /// File to create.
    pub path: String,
    pub content: String,
    /// When false (the default), refuse to write if `path` already exists.
    #[serde(default)]
    pub overwrite: bool,
    /// Create missing parent directories. Defaults to true so a single `coder::create-file` call can scaffold a fresh subtree.
    #[serde(default = "yes")]
    pub parents: bool,
    /// Octal permission bits as a string, e.g. "0644". Defaults to "0644".
    #[serde(default = "mode_0644")]
    pub mode: String,
    /// Optimistic-concurrency guard for an overwrite: the `revision` from coder::read-file; if the content changed the entry fails C221 unwritten.
    #[serde(default)]
    pub expected_revision: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(
    title = "CreateFileInput",
    example = json!({"files": [{"content": "pub mod utils;\n", "overwrite": false, "path": "src/lib.rs"}, {"content": "# scratch notes\n", "overwrite": true, "path": "/tmp/scratch/notes.md"}]})
)]
pub struct CreateFileInput {
    pub files: Vec<CreateFileSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CreateFileResult {
    /// Canonical absolute path (resolved through the jail); the caller's input verbatim when resolution failed.
    pub path: String,
    pub success: bool,
    pub bytes_written: u64,
    /// Opaque revision for the exact bytes written. Supply this as `expected_revision` on a later overwrite to avoid lost updates.
    pub revision: Option<String>,
    /// Structured error for this entry. `code` is stable for programmatic branching (e.g. `"C213"` means already-exists; pass `overwrite=true` to replace). `message` carries the corrective action an LLM agent needs to make a successful second call.
    pub error: Option<EntryError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "CreateFileOutput")]
pub struct CreateFileOutput {
    pub results: Vec<CreateFileResult>,
}

// ---- coder::update-file ----

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum UpdateOp {
    /// Insert `content` before line `at_line` (1-based). `at_line = lines+1` appends to end of file.
    Insert { at_line: u32, content: String },
    /// Delete lines `from_line..=to_line` (1-based, inclusive).
    Remove { from_line: u32, to_line: u32 },
    /// Overwrite lines `from_line..=to_line` with `content`.
    UpdateLines {
        from_line: u32,
        to_line: u32,
        content: String,
    },
    /// Replace all regex matches in the file body (after line ops).
    Replace {
        pattern: String,
        /// Substitution text; $1/${1}/$name/${name} expand captures ($0 = whole match), a literal $ is written $$ (`$${name}`). Unknown references fail C210.
        replacement: String,
        #[serde(default)]
        ignore_case: bool,
        /// When true `.` also matches newline, so a short pattern like `start.*?end` spans lines; by default a multi-line pattern matches nothing.
        #[serde(default)]
        dot_matches_newline: bool,
        /// Expected match count; a mismatch fails this file with C210 and writes nothing (0 asserts absence). Omit to replace all matches.
        #[serde(default)]
        expect_matches: Option<u64>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UpdateFileSpec {
    /// File to edit.
    pub path: String,
    pub ops: Vec<UpdateOp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(
    title = "UpdateFileInput",
    example = json!({"files": [{"ops": [{"at_line": 1, "content": "// generated by coder\n", "op": "insert"}, {"content": "pub fn hello() {\n    println!(\"hello\");\n}\n", "from_line": 5, "op": "update_lines", "to_line": 7}, {"dot_matches_newline": true, "expect_matches": 1, "op": "replace", "pattern": "// BEGIN legacy.*?// END legacy", "replacement": "// removed"}], "path": "src/lib.rs"}]})
)]
pub struct UpdateFileInput {
    pub files: Vec<UpdateFileSpec>,
}

/// Post-apply snapshot of the region affected by one op. Line ops echo the affected region with ±2 context lines; regex `replace` ops emit one echo per match site (up to 5, no context): the FIRST and LAST line of the post-replace region, with `elided` set to the inner line count when the region spans more than 2 lines (single-line replacements echo just that line). Each site carries `total_replacements`. Provides just enough context to verify the edit landed in the right place without flooding the LLM context with the full file body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OpEcho {
    /// Index of the op in the request's ops array (0-based).
    pub op_index: u32,
    /// 1-based line number of the first echoed line (after all ops applied).
    pub from_line: u64,
    /// The echoed lines, post-apply. When the region is large, middle lines are elided and `elided` is set to indicate how many were skipped.
    pub lines: Vec<String>,
    /// Number of middle lines elided from a large region: for line ops, set when the affected region exceeded the per-echo cap; for replace sites, the count of inner lines between the region's echoed first and last line (set when the region spans >2 lines).
    pub elided: Option<u64>,
    /// Total number of replacements the regex op made across the whole file (set only on replace-op site echoes, duplicated on each site). Sites are capped at 5 — when more matched, this count is the only record of the extras.
    pub total_replacements: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UpdateFileResult {
    /// Canonical absolute path (resolved through the jail); the caller's input verbatim when resolution failed.
    pub path: String,
    pub success: bool,
    /// Number of operations applied (only meaningful when `success`).
    pub applied: u32,
    /// Final line count after applying (only meaningful when `success`).
    pub new_line_count: u64,
    /// Per-op bounded post-apply echoes for edit verification; each applied op returns a snapshot of the affected region (±2 context lines) so the caller can confirm the edit landed at the right position without receiving the full file body. See `OpEcho` for field semantics. Empty on failure. Always present on the wire.
    pub echoes: Vec<OpEcho>,
    /// True when the total echo budget (~4 KiB) was exhausted before all op echoes could be emitted. Use `coder::read-file` to inspect the full result if needed. Always present on the wire.
    pub echoes_truncated: bool,
    /// Structured error for this entry. `code` is stable for programmatic branching (e.g. `"C211"` for not-found-or-denied; `"C210"` for bad input such as overlapping ops). `message` carries the corrective action an LLM agent needs to make a successful second call.
    pub error: Option<EntryError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "UpdateFileOutput")]
pub struct UpdateFileOutput {
    pub results: Vec<UpdateFileResult>,
}

// ---- coder::delete-file ----

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(
    title = "DeleteFileInput",
    example = json!({"paths": ["src/old_module.rs", "build/artifacts"], "recursive": true})
)]
pub struct DeleteFileInput {
    /// Paths to remove.
    pub paths: Vec<String>,
    /// Required for non-empty directories. Files and empty dirs ignore it.
    #[serde(default)]
    pub recursive: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DeleteFileResult {
    /// Canonical absolute path (resolved through the jail); the caller's input verbatim when resolution failed.
    pub path: String,
    pub success: bool,
    pub removed: bool,
    /// Structured error for this entry. `code` is stable for programmatic branching (e.g. `"C211"` for not-found-or-denied; `"C210"` for refusing to delete an allowed root). `message` carries the corrective action an LLM agent needs to make a successful second call.
    pub error: Option<EntryError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "DeleteFileOutput")]
pub struct DeleteFileOutput {
    pub results: Vec<DeleteFileResult>,
}

// ---- coder::move ----

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MoveFileSpec {
    /// Source path.
    pub from: String,
    /// Destination path.
    pub to: String,
    /// When false (the default), refuse to overwrite an existing destination. Pass `overwrite: true` to replace an existing file at `to`.
    #[serde(default)]
    pub overwrite: bool,
    /// Create missing parent directories of the destination. Defaults to true.
    #[serde(default = "yes")]
    pub parents: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(
    title = "MoveFileInput",
    example = json!({"files": [{"from": "src/old_name.rs", "to": "src/new_name.rs"}, {"from": "build/output.bin", "overwrite": true, "to": "/tmp/coder-cache/output.bin"}]})
)]
pub struct MoveFileInput {
    /// Entries to move. Each entry is processed independently so a single failure never aborts the rest.
    pub files: Vec<MoveFileSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MoveFileResult {
    /// Canonical absolute path of the source (resolved through the jail); the caller's input verbatim when resolution failed.
    pub from: String,
    /// Canonical absolute path of the destination (resolved through the jail); the caller's input verbatim when resolution failed.
    pub to: String,
    /// True only when the move fully completed; false for a no-op self-move (`from` and `to` resolve to the same file).
    pub moved: bool,
    pub success: bool,
    /// Structured error for this entry. `code` is stable for programmatic branching (e.g. `"C213"` means destination exists; pass `overwrite=true` to replace; `"C210"` for disallowed operations such as cross-root directory moves, moving a root itself, or a destination that is a directory — the message then names the corrected target path). `message` carries the corrective action an LLM agent needs to make a successful second call.
    pub error: Option<EntryError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "MoveFileOutput")]
pub struct MoveFileOutput {
    pub results: Vec<MoveFileResult>,
}

// ---- coder::change-diff ----

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ChangeDiffInput")]
pub struct ChangeDiffInput {
    pub change_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ChangeDiffOutput")]
pub struct ChangeDiffOutput {
    pub path: String,
    pub is_binary: bool,
    /// Exact pre-mutation body. Missing when either side is not UTF-8.
    pub old_contents: Option<String>,
    /// Exact post-mutation body. Missing when either side is not UTF-8.
    pub new_contents: Option<String>,
}

// ---- executor operations ----

/// The harness-stamped filesystem scope of a call (`fs_scope` metadata), as the caller sent
/// it; the executor canonicalizes and checks it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsScope {
    /// Paths must resolve under it (C220 otherwise).
    pub scope_root: Option<String>,
    /// Where relative paths anchor (defaults to `scope_root`).
    pub session_root: Option<String>,
}

/// One `coder::*` call after broker validation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CoderCall {
    pub scope: FsScope,
    pub op: CoderOp,
}

/// One `coder::read-file` batch entry, normalized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadItem {
    pub path: String,
    pub line_from: Option<u64>,
    pub line_to: Option<u64>,
    pub numbered: bool,
    pub stat: bool,
}

/// `coder::read-file`, normalized: exactly one of `path` / `paths`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadSpec {
    pub path: Option<String>,
    pub paths: Option<Vec<ReadItem>>,
    pub stat: bool,
    pub line_from: Option<u64>,
    pub line_to: Option<u64>,
    pub numbered: bool,
    pub base64: bool,
    pub max_output_bytes: Option<u64>,
}

impl From<ReadFileInput> for ReadSpec {
    fn from(r: ReadFileInput) -> Self {
        ReadSpec {
            path: r.path,
            paths: r.paths.map(|v| {
                v.into_iter()
                    .map(|t| match t {
                        ReadTarget::Path(path) => ReadItem {
                            path,
                            line_from: None,
                            line_to: None,
                            numbered: false,
                            stat: false,
                        },
                        ReadTarget::Entry {
                            path,
                            line_from,
                            line_to,
                            numbered,
                            stat,
                        } => ReadItem {
                            path,
                            line_from,
                            line_to,
                            numbered,
                            stat,
                        },
                    })
                    .collect()
            }),
            stat: r.stat,
            line_from: r.line_from,
            line_to: r.line_to,
            numbered: r.numbered,
            base64: r.encoding == ReadEncoding::Base64,
            max_output_bytes: r.max_output_bytes,
        }
    }
}

/// One `update-file` op, in a shape postcard can carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EditOp {
    Insert {
        at_line: u32,
        content: String,
    },
    Remove {
        from_line: u32,
        to_line: u32,
    },
    UpdateLines {
        from_line: u32,
        to_line: u32,
        content: String,
    },
    Replace {
        pattern: String,
        replacement: String,
        ignore_case: bool,
        dot_matches_newline: bool,
        expect_matches: Option<u64>,
    },
}

impl From<UpdateOp> for EditOp {
    fn from(op: UpdateOp) -> Self {
        match op {
            UpdateOp::Insert { at_line, content } => EditOp::Insert { at_line, content },
            UpdateOp::Remove { from_line, to_line } => EditOp::Remove { from_line, to_line },
            UpdateOp::UpdateLines {
                from_line,
                to_line,
                content,
            } => EditOp::UpdateLines {
                from_line,
                to_line,
                content,
            },
            UpdateOp::Replace {
                pattern,
                replacement,
                ignore_case,
                dot_matches_newline,
                expect_matches,
            } => EditOp::Replace {
                pattern,
                replacement,
                ignore_case,
                dot_matches_newline,
                expect_matches,
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditSpec {
    pub path: String,
    pub ops: Vec<EditOp>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CoderOp {
    Info,
    Read(ReadSpec),
    Search(SearchInput),
    ListFolder(ListFolderInput),
    Tree(TreeInput),
    Create(CreateFileInput),
    Update(Vec<EditSpec>),
    Delete(DeleteFileInput),
    Move(MoveFileInput),
    ChangeDiff(ChangeDiffInput),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CoderReply {
    Info(InfoOutput),
    Read(ReadFileOutput),
    Search(SearchOutput),
    ListFolder(ListFolderOutput),
    Tree(TreeOutput),
    Create(CreateFileOutput),
    Update(UpdateFileOutput),
    Delete(DeleteFileOutput),
    Move(MoveFileOutput),
    ChangeDiff(ChangeDiffOutput),
}

// ---- codes and shared checks ----

/// The coder twin of a code: same digits, `C` for `S`. Failure classes coder has no code of
/// its own for (wrong file type S212, non-empty directory S214, bad regex S217) are malformed
/// input, C210. A code that is already a C-code is kept.
pub fn coder_code(code: &str) -> &'static str {
    match code {
        "S211" | "C211" => "C211",
        "S213" | "C213" => "C213",
        "S215" | "C215" => "C215",
        "S218" | "C218" => "C218",
        "S220" | "C220" => "C220",
        "C221" => "C221",
        "S210" | "S212" | "S214" | "S217" | "C210" => "C210",
        _ => "C216",
    }
}

/// A wire error with its code turned into the coder twin (see [`coder_code`]).
pub fn to_coder(e: crate::WireError) -> crate::WireError {
    crate::WireError::forwarded(coder_code(e.code.as_str()), e.message)
}

/// Checks a line window: 1-based, inclusive, `line_to >= line_from`.
pub fn check_window(line_from: Option<u64>, line_to: Option<u64>) -> Result<(), String> {
    if line_from == Some(0) || line_to == Some(0) {
        return Err("line_from and line_to are 1-based: 0 is not a line number".into());
    }
    if let (Some(f), Some(t)) = (line_from, line_to) {
        if t < f {
            return Err(format!(
                "line_to ({t}) is before line_from ({f}); pass line_to >= line_from"
            ));
        }
    }
    Ok(())
}

/// The rules of one batch entry of `coder::read-file` (its failure is that entry's alone).
pub fn check_entry(item: &ReadItem) -> Result<(), String> {
    if item.stat && (item.line_from.is_some() || item.line_to.is_some() || item.numbered) {
        return Err("stat cannot be combined with a window or numbered".into());
    }
    check_window(item.line_from, item.line_to)
}

/// The request-level rules of `coder::read-file` (CODER-16..21), checked by the broker and
/// again by the executor.
pub fn check_read(spec: &ReadSpec) -> Result<(), String> {
    match (&spec.path, &spec.paths) {
        (Some(_), Some(_)) => {
            return Err("pass either `path` or `paths`, not both".into());
        }
        (None, None) => return Err("pass `path` (one file) or `paths` (a batch)".into()),
        _ => {}
    }
    let windowed = spec.line_from.is_some() || spec.line_to.is_some();
    if spec.paths.is_some() {
        if windowed || spec.numbered || spec.base64 || spec.max_output_bytes.is_some() || spec.stat
        {
            return Err("line_from, line_to, numbered, stat, encoding and max_output_bytes apply in `path` mode only; set them per entry in `paths` (object form)".into());
        }
        // An entry's own fields are checked with that entry (`check_entry`): one bad entry
        // fails alone and never aborts the others.
        return Ok(());
    }
    if spec.stat && (windowed || spec.numbered || spec.max_output_bytes.is_some() || spec.base64) {
        return Err("stat cannot be combined with line_from, line_to, numbered, max_output_bytes or encoding: base64".into());
    }
    if spec.base64 && (windowed || spec.numbered) {
        return Err(
            "encoding: base64 returns the exact bytes of the whole file; it cannot be combined with a window or numbered"
                .into(),
        );
    }
    if windowed && spec.max_output_bytes.is_some() {
        return Err("max_output_bytes applies to full reads; a window is capped by max_read_bytes instead (drop one of them)".into());
    }
    check_window(spec.line_from, spec.line_to)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(line_from: Option<u64>, line_to: Option<u64>, stat: bool) -> ReadItem {
        ReadItem {
            path: "a".into(),
            line_from,
            line_to,
            numbered: false,
            stat,
        }
    }

    /// A batch's entries are checked one by one: a bad entry never fails the request.
    #[test]
    fn batch_entries_are_checked_alone() {
        let spec = ReadSpec {
            path: None,
            paths: Some(vec![item(None, None, false), item(Some(2), Some(1), false)]),
            stat: false,
            line_from: None,
            line_to: None,
            numbered: false,
            base64: false,
            max_output_bytes: None,
        };
        assert_eq!(check_read(&spec), Ok(()));
        assert_eq!(check_entry(&item(None, None, false)), Ok(()));
        assert_eq!(
            check_entry(&item(Some(2), Some(1), false)),
            Err("line_to (1) is before line_from (2); pass line_to >= line_from".into())
        );
        assert_eq!(
            check_entry(&item(Some(1), None, true)),
            Err("stat cannot be combined with a window or numbered".into())
        );
        assert_eq!(
            check_entry(&item(Some(0), None, false)),
            Err("line_from and line_to are 1-based: 0 is not a line number".into())
        );
    }
}
