//! Turn history (`shell::turns::*`) on the broker↔executor socket.
//!
//! The store lives in the executor (the broker opens no files). The broker forwards each
//! turns function's JSON payload verbatim; the executor parses it against the seed schema
//! itself (nothing the broker sends is trusted) and answers with the JSON response.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `Request::Turns`: `function` is the full function id (`shell::turns::list`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnsCall {
    pub function: String,
    pub payload_json: String,
}

/// `Reply::Turns`: the response document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnsReply {
    pub json: String,
}

// ---- The harness hook targets' typed requests (the seed's `TurnEvent` and `HookInput`).
//
// Parsed by the broker before it forwards them and again by the executor, with
// [`parse_request`]: a field of the wrong type, or a `call` without its `function_id`, is
// S210 naming the field, never an empty event.

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ParentRef {
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub turn_id: Option<String>,
}

/// `TurnEvent` (every field optional, unknown fields ignored).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TurnEvent {
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub turn_id: Option<String>,
    #[serde(default)]
    pub message_preview: Option<String>,
    #[serde(default)]
    pub parent: Option<ParentRef>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct HookCall {
    pub function_id: String,
    #[serde(default)]
    pub arguments: Value,
}

/// `HookInput`. `result` is read only as `{is_error}`; any other JSON is "not failed".
#[derive(Debug, Clone, Default, Deserialize)]
pub struct HookInput {
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub turn_id: Option<String>,
    #[serde(default)]
    pub call: Option<HookCall>,
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub metadata: Option<Value>,
}

impl HookInput {
    pub fn is_error(&self) -> bool {
        self.result
            .as_ref()
            .and_then(|r| r.get("is_error"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    fn meta_str(&self, pointer: &str) -> Option<String> {
        self.metadata
            .as_ref()
            .and_then(|m| m.pointer(pointer))
            .and_then(Value::as_str)
            .map(String::from)
    }

    /// `metadata.fs_scope.root`.
    pub fn scope_root(&self) -> Option<String> {
        self.meta_str("/fs_scope/root")
    }

    pub fn parent(&self) -> Option<(String, Option<String>)> {
        self.meta_str("/parent_session_id")
            .map(|s| (s, self.meta_str("/parent_turn_id")))
    }

    pub fn agent_name(&self) -> Option<String> {
        self.meta_str("/subagent_display/name")
    }
}

/// The typed request of a turns function: `Err` is the S210 message, naming the field that
/// did not fit (`malformed payload: call: missing field `function_id``). A payload that is not
/// an object is refused too (serde would take an array for a struct, field by field).
pub fn parse_request<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, String> {
    if !v.is_object() {
        return Err("the request must be an object".into());
    }
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            format!("malformed payload: {}", e.inner())
        } else {
            format!("malformed payload: {path}: {}", e.inner())
        }
    })
}

// ---- The history functions' typed requests, and the one parser both halves use.

/// `shell::turns::list` request (`ListInput`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ListRequest {
    pub session_id: String,
}

/// `shell::turns::get` request (`GetInput`): the newest turn when `turn_id` is absent.
/// `fs_scope` is the caller's harness-stamped scope, put in by the broker from the invocation
/// metadata (or sent as a hidden payload field, as for `coder::*`): bodies outside its
/// `scope_root` read as not kept. Not in the seed schema (which allows extra keys).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GetRequest {
    pub session_id: String,
    #[serde(default)]
    pub turn_id: Option<String>,
    #[serde(default)]
    pub fs_scope: Option<crate::coder::FsScope>,
}

/// `shell::turns::revert` request (`RevertInput`). `force` (not in the seed) reverts a file
/// whose after-revision was never recorded; `fs_scope` is as for [`GetRequest`] (a file
/// outside its `scope_root` is not written).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RevertRequest {
    pub session_id: String,
    pub turn_id: String,
    #[serde(default)]
    pub paths: Option<Vec<String>>,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub fs_scope: Option<crate::coder::FsScope>,
}

/// `shell::turns::adopt-root` request.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AdoptRootRequest {
    pub session_id: String,
    pub turn_id: String,
    pub root: String,
}

/// A `shell::turns::*` request, typed: what the broker checks before it forwards a payload
/// and what the executor serves, parsed by the same [`TurnsRequest::parse`] on both sides.
#[derive(Debug, Clone)]
pub enum TurnsRequest {
    TurnStarted(TurnEvent),
    TurnCompleted(TurnEvent),
    PreTrigger(HookInput),
    PostTrigger(HookInput),
    List(ListRequest),
    Sessions(SessionsRequest),
    Get(GetRequest),
    Revert(RevertRequest),
    AdoptRoot(AdoptRootRequest),
}

impl TurnsRequest {
    /// Parses `payload` as the request of `function`. `Err` is the S210 message: an unknown
    /// function, a payload that is not an object, or the field that did not fit
    /// (`malformed payload: force: invalid type: string "yes", expected a boolean`). The
    /// broker reads a null `sessions` payload as `{}` before it parses.
    pub fn parse(function: &str, payload: &Value) -> Result<TurnsRequest, String> {
        let r = Self::parse_typed(function, payload)?;
        r.check_lengths()?;
        Ok(r)
    }

    fn parse_typed(function: &str, payload: &Value) -> Result<TurnsRequest, String> {
        Ok(match function {
            "shell::turns::on-turn-started" => Self::TurnStarted(parse_request(payload)?),
            "shell::turns::on-turn-completed" => Self::TurnCompleted(parse_request(payload)?),
            "shell::turns::on-pre-trigger" => Self::PreTrigger(parse_request(payload)?),
            "shell::turns::on-post-trigger" => Self::PostTrigger(parse_request(payload)?),
            "shell::turns::list" => Self::List(parse_request(payload)?),
            "shell::turns::sessions" => {
                let r: SessionsRequest = parse_request(payload)?;
                sessions_page(&r)?;
                Self::Sessions(r)
            }
            "shell::turns::get" => Self::Get(parse_request(payload)?),
            "shell::turns::revert" => Self::Revert(parse_request(payload)?),
            "shell::turns::adopt-root" => Self::AdoptRoot(parse_request(payload)?),
            other => return Err(format!("unknown turns function {other}")),
        })
    }
}

// ---- Length bounds of ids and paths: every id a caller names is kept in memory (the hooks'
// maps) and written into every record, so none may be of any length.

/// The longest id accepted, in bytes: `session_id`, `turn_id`, the parent links, a hooked
/// call's `function_id` (harness ids are UUID-sized; `shell.outside-turns` turns are
/// `call-<32 hex>`).
pub const MAX_ID_BYTES: usize = 256;
/// The longest path accepted, in bytes (`PATH_MAX`): `metadata.fs_scope.root`, `root`,
/// `paths[]`, `fs_scope.*`.
pub const MAX_PATH_BYTES: usize = 4096;

/// `Err` (the S210 message) when `value` of `field` is longer than `max` bytes.
pub fn check_length(field: &str, value: Option<&str>, max: usize) -> Result<(), String> {
    match value {
        Some(v) if v.len() > max => Err(format!(
            "'{field}' is {} bytes; it may be at most {max} bytes",
            v.len()
        )),
        _ => Ok(()),
    }
}

impl TurnsRequest {
    /// Every id of the request within [`MAX_ID_BYTES`] and every path within
    /// [`MAX_PATH_BYTES`]; `Err` names the first field that is not.
    pub fn check_lengths(&self) -> Result<(), String> {
        let id = |f: &str, v: Option<&str>| check_length(f, v, MAX_ID_BYTES);
        let path = |f: &str, v: Option<&str>| check_length(f, v, MAX_PATH_BYTES);
        let scope = |s: &Option<crate::coder::FsScope>| {
            let s = s.as_ref();
            path(
                "fs_scope.scope_root",
                s.and_then(|s| s.scope_root.as_deref()),
            )?;
            path(
                "fs_scope.session_root",
                s.and_then(|s| s.session_root.as_deref()),
            )
        };
        match self {
            Self::TurnStarted(e) | Self::TurnCompleted(e) => {
                id("session_id", e.session_id.as_deref())?;
                id("turn_id", e.turn_id.as_deref())?;
                let p = e.parent.as_ref();
                id("parent.session_id", p.and_then(|p| p.session_id.as_deref()))?;
                id("parent.turn_id", p.and_then(|p| p.turn_id.as_deref()))
            }
            Self::PreTrigger(h) | Self::PostTrigger(h) => {
                id("session_id", h.session_id.as_deref())?;
                id("turn_id", h.turn_id.as_deref())?;
                id(
                    "call.function_id",
                    h.call.as_ref().map(|c| c.function_id.as_str()),
                )?;
                let parent = h.parent();
                id(
                    "metadata.parent_session_id",
                    parent.as_ref().map(|p| p.0.as_str()),
                )?;
                let pt = parent.as_ref().and_then(|p| p.1.as_deref());
                id("metadata.parent_turn_id", pt)?;
                id("metadata.subagent_display.name", h.agent_name().as_deref())?;
                path("metadata.fs_scope.root", h.scope_root().as_deref())
            }
            Self::List(r) => id("session_id", Some(&r.session_id)),
            Self::Sessions(_) => Ok(()),
            Self::Get(r) => {
                id("session_id", Some(&r.session_id))?;
                id("turn_id", r.turn_id.as_deref())?;
                scope(&r.fs_scope)
            }
            Self::Revert(r) => {
                id("session_id", Some(&r.session_id))?;
                id("turn_id", Some(&r.turn_id))?;
                for p in r.paths.iter().flatten() {
                    path("paths[]", Some(p))?;
                }
                scope(&r.fs_scope)
            }
            Self::AdoptRoot(r) => {
                id("session_id", Some(&r.session_id))?;
                id("turn_id", Some(&r.turn_id))?;
                path("root", Some(&r.root))
            }
        }
    }
}

// ---- `shell::turns::sessions`: the sessions that have recorded turns, newest first.
//
// Not in the ide 0.12.9 contract (it has no function that lists sessions): an addition, so a
// console page can offer the sessions instead of asking for an id. Checked by the broker and
// again by the executor with the same functions.

/// Sessions in one page when `limit` is omitted.
pub const DEFAULT_SESSIONS_PAGE: usize = 50;
/// The most sessions one page holds.
pub const MAX_SESSIONS_PAGE: usize = 200;
/// The longest cursor accepted, in bytes (`<20 digits>:<stem of at most 128>`).
pub const MAX_CURSOR_BYTES: usize = 160;

/// `shell::turns::sessions` request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "SessionsInput")]
pub struct SessionsRequest {
    /// Most sessions to return, 1 to 200 (default 50).
    #[serde(default)]
    #[schemars(range(min = 1, max = MAX_SESSIONS_PAGE))]
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page, for the sessions older than it; omit for the newest.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// One session with recorded turns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionSummary {
    /// The harness session id: what `shell::turns::list`, `get` and `revert` take.
    pub session_id: String,
    /// How many turns `shell::turns::list` lists for it.
    pub turn_count: usize,
    /// `started_at` of its oldest turn (ms since the epoch).
    pub first_started_at: u64,
    /// `started_at` of its newest turn (ms since the epoch).
    pub last_started_at: u64,
    /// When its history last changed (ms since the epoch): the time of the last record written to its log. The list is ordered by this, newest first.
    pub updated_at: u64,
    /// The title of its newest turn, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_title: Option<String>,
}

/// `shell::turns::sessions` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "SessionsOutput")]
pub struct SessionsResponse {
    /// Newest first (by `updated_at`).
    pub sessions: Vec<SessionSummary>,
    /// Pass as `cursor` for the next, older page; absent when there is none. A page can hold fewer than `limit` sessions and still have a next one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Where a page of sessions resumes: strictly after the session whose log was last changed at
/// `mtime_ns` and whose log file is `<stem>.jsonl` (order: newest first, then by stem).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionsCursor {
    pub mtime_ns: u64,
    pub stem: String,
}

/// Whether `s` has the shape of a session log's stem: 1-128 of `[A-Za-z0-9_.-]`, not starting
/// with `.` (the executor's `session_stem` makes nothing else).
pub fn is_stem_shape(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

impl SessionsCursor {
    /// The wire form: `<mtime_ns>:<stem>`.
    pub fn encode(&self) -> String {
        format!("{}:{}", self.mtime_ns, self.stem)
    }

    /// The cursor in `s`, or why it is not one.
    pub fn parse(s: &str) -> Result<SessionsCursor, String> {
        let bad = || {
            format!(
                "'cursor' is not a cursor of shell::turns::sessions (pass the next_cursor of the previous page unchanged, or omit it for the newest sessions): {:?}",
                s.chars().take(40).collect::<String>()
            )
        };
        if s.len() > MAX_CURSOR_BYTES {
            return Err(bad());
        }
        let (ns, stem) = s.split_once(':').ok_or_else(bad)?;
        if ns.is_empty() || ns.len() > 20 || !ns.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let mtime_ns = ns.parse::<u64>().map_err(|_| bad())?;
        if !is_stem_shape(stem) {
            return Err(bad());
        }
        Ok(SessionsCursor {
            mtime_ns,
            stem: stem.to_string(),
        })
    }
}

/// A checked `shell::turns::sessions` request: the page size and where it resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionsPage {
    pub limit: usize,
    pub after: Option<SessionsCursor>,
}

/// Checks a request (`Err` is the S210 message): `limit` 1 to [`MAX_SESSIONS_PAGE`], a cursor
/// of the shape [`SessionsCursor::encode`] writes.
pub fn sessions_page(r: &SessionsRequest) -> Result<SessionsPage, String> {
    let limit = match r.limit {
        None => DEFAULT_SESSIONS_PAGE,
        Some(n) if (1..=MAX_SESSIONS_PAGE).contains(&n) => n,
        Some(n) => {
            return Err(format!(
                "'limit' is {n}; pass 1 to {MAX_SESSIONS_PAGE} (omit it for {DEFAULT_SESSIONS_PAGE}), and follow next_cursor for more"
            ))
        }
    };
    let after = r.cursor.as_deref().map(SessionsCursor::parse).transpose()?;
    Ok(SessionsPage { limit, after })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every turns function parses into its typed request; the wrong type is the field's
    /// message, and an unknown function is refused.
    #[test]
    fn turns_requests_parse_by_function() {
        use serde_json::json;
        let parse = |f: &str, v: Value| TurnsRequest::parse(f, &v);
        match parse(
            "shell::turns::revert",
            json!({"session_id": "s", "turn_id": "t", "paths": ["/a"], "extra": 1}),
        ) {
            Ok(TurnsRequest::Revert(r)) => assert_eq!(
                r,
                RevertRequest {
                    session_id: "s".into(),
                    turn_id: "t".into(),
                    paths: Some(vec!["/a".into()]),
                    force: false,
                    fs_scope: None,
                }
            ),
            other => panic!("{other:?}"),
        }
        match parse("shell::turns::get", json!({"session_id": "s"})) {
            Ok(TurnsRequest::Get(r)) => assert_eq!(r.turn_id, None),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse("shell::turns::sessions", json!({})),
            Ok(TurnsRequest::Sessions(r)) if r == SessionsRequest::default()
        ));
        let err = |f: &str, v: Value| parse(f, v).err();
        assert_eq!(
            err(
                "shell::turns::revert",
                json!({"session_id": "s", "turn_id": "t", "force": 1})
            ),
            Some("malformed payload: force: invalid type: integer `1`, expected a boolean".into())
        );
        assert_eq!(
            err(
                "shell::turns::adopt-root",
                json!({"session_id": "s", "root": "/r"})
            ),
            Some("malformed payload: missing field `turn_id`".into())
        );
        assert_eq!(
            err("shell::turns::list", json!(null)),
            Some("the request must be an object".into())
        );
        assert_eq!(
            err("shell::turns::nope", json!({})),
            Some("unknown turns function shell::turns::nope".into())
        );
    }

    /// A malformed hook event is refused with the field it names, never read as an empty one.
    #[test]
    fn malformed_hook_requests_name_their_field() {
        use serde_json::json;
        let hook = |v: Value| parse_request::<HookInput>(&v).map(|_| ());
        let event = |v: Value| parse_request::<TurnEvent>(&v).map(|_| ());
        assert_eq!(
            hook(json!({"call": {"function_id": "shell::exec"}})),
            Ok(())
        );
        assert_eq!(event(json!({"session_id": null, "extra": 1})), Ok(()));
        assert_eq!(
            hook(json!({"session_id": 5})),
            Err(
                "malformed payload: session_id: invalid type: integer `5`, expected a string"
                    .into()
            )
        );
        assert_eq!(
            hook(json!({"session_id": "s", "call": {"arguments": {}}})),
            Err("malformed payload: call: missing field `function_id`".into())
        );
        assert_eq!(
            hook(json!({"call": {"function_id": 7}})),
            Err(
                "malformed payload: call.function_id: invalid type: integer `7`, expected a string"
                    .into()
            )
        );
        assert_eq!(
            event(json!({"parent": {"turn_id": []}})),
            Err(
                "malformed payload: parent.turn_id: invalid type: sequence, expected a string"
                    .into()
            )
        );
        assert_eq!(
            event(json!([1])),
            Err("the request must be an object".into())
        );
    }

    /// Ids longer than [`MAX_ID_BYTES`] and paths longer than [`MAX_PATH_BYTES`] are refused,
    /// naming the field; ids of the harness's length pass.
    #[test]
    fn long_ids_and_paths_are_refused_naming_the_field() {
        use serde_json::json;
        let long = "x".repeat(MAX_ID_BYTES + 1);
        let ok = "s".repeat(MAX_ID_BYTES);
        let long_path = format!("/{}", "p".repeat(MAX_PATH_BYTES));
        let err = |f: &str, v: Value| TurnsRequest::parse(f, &v).err();
        let msg = |field: &str, n: usize, max: usize| {
            Some(format!(
                "'{field}' is {n} bytes; it may be at most {max} bytes"
            ))
        };
        let n = MAX_ID_BYTES + 1;
        assert_eq!(
            err("shell::turns::list", json!({"session_id": long})),
            msg("session_id", n, MAX_ID_BYTES)
        );
        assert_eq!(err("shell::turns::list", json!({"session_id": ok})), None);
        assert_eq!(
            err(
                "shell::turns::get",
                json!({"session_id": "s", "turn_id": long})
            ),
            msg("turn_id", n, MAX_ID_BYTES)
        );
        assert_eq!(
            err(
                "shell::turns::revert",
                json!({"session_id": "s", "turn_id": "t", "paths": ["/a", long_path]})
            ),
            msg("paths[]", MAX_PATH_BYTES + 1, MAX_PATH_BYTES)
        );
        assert_eq!(
            err(
                "shell::turns::adopt-root",
                json!({"session_id": long, "turn_id": "t", "root": "/r"})
            ),
            msg("session_id", n, MAX_ID_BYTES)
        );
        assert_eq!(
            err(
                "shell::turns::on-turn-started",
                json!({"session_id": "s", "turn_id": "t", "parent": {"session_id": long}})
            ),
            msg("parent.session_id", n, MAX_ID_BYTES)
        );
        assert_eq!(
            err(
                "shell::turns::on-pre-trigger",
                json!({"session_id": "s", "metadata": {"parent_session_id": "p", "parent_turn_id": long}})
            ),
            msg("metadata.parent_turn_id", n, MAX_ID_BYTES)
        );
        assert_eq!(
            err(
                "shell::turns::on-post-trigger",
                json!({"session_id": "s", "call": {"function_id": long}})
            ),
            msg("call.function_id", n, MAX_ID_BYTES)
        );
        assert_eq!(
            err(
                "shell::turns::on-pre-trigger",
                json!({"session_id": "s", "metadata": {"fs_scope": {"root": long_path}}})
            ),
            msg("metadata.fs_scope.root", MAX_PATH_BYTES + 1, MAX_PATH_BYTES)
        );
        let harness = json!({"session_id": "console-3f2a", "turn_id": "t_9",
            "metadata": {"fs_scope": {"root": "/home/me/proj"}, "parent_session_id": "s_root",
                "parent_turn_id": "t_1", "subagent_display": {"name": "reviewer"}},
            "call": {"id": "fc_12", "function_id": "coder::update-file", "arguments": {}}});
        assert_eq!(err("shell::turns::on-pre-trigger", harness), None);
    }

    #[test]
    fn cursors_round_trip_and_refuse_anything_else() {
        let c = SessionsCursor {
            mtime_ns: 1_700_000_000_123_456_789,
            stem: "ui-s1".into(),
        };
        assert_eq!(c.encode(), "1700000000123456789:ui-s1");
        assert_eq!(SessionsCursor::parse(&c.encode()), Ok(c));
        assert_eq!(
            SessionsCursor::parse("0:h-ab.c_d"),
            Ok(SessionsCursor {
                mtime_ns: 0,
                stem: "h-ab.c_d".into()
            })
        );
        for bad in [
            "",
            ":",
            "12",
            "12:",
            ":abc",
            "-1:abc",
            "+1:abc",
            "1.5:abc",
            "18446744073709551616:abc",
            "123456789012345678901:abc",
            "1:../x",
            "1:.hidden",
            "1:a/b",
            "1:a:b",
            "1:a b",
        ] {
            assert!(SessionsCursor::parse(bad).is_err(), "{bad:?}");
        }
        assert!(SessionsCursor::parse(&format!("1:{}", "a".repeat(128))).is_ok());
        assert!(SessionsCursor::parse(&format!("1:{}", "a".repeat(129))).is_err());
        assert!(SessionsCursor::parse(&"9".repeat(100_000)).is_err());
        assert_eq!(
            SessionsCursor::parse("x").unwrap_err(),
            "'cursor' is not a cursor of shell::turns::sessions (pass the next_cursor of the previous page unchanged, or omit it for the newest sessions): \"x\""
        );
    }

    #[test]
    fn pages_are_1_to_200_and_50_by_default() {
        let req = |limit, cursor: Option<&str>| SessionsRequest {
            limit,
            cursor: cursor.map(String::from),
        };
        assert_eq!(
            sessions_page(&req(None, None)),
            Ok(SessionsPage {
                limit: 50,
                after: None
            })
        );
        assert_eq!(sessions_page(&req(Some(1), None)).map(|p| p.limit), Ok(1));
        assert_eq!(
            sessions_page(&req(Some(200), None)).map(|p| p.limit),
            Ok(200)
        );
        assert_eq!(
            sessions_page(&req(Some(0), None)),
            Err(
                "'limit' is 0; pass 1 to 200 (omit it for 50), and follow next_cursor for more"
                    .into()
            )
        );
        assert!(sessions_page(&req(Some(201), None)).is_err());
        assert!(sessions_page(&req(Some(usize::MAX), None)).is_err());
        assert_eq!(
            sessions_page(&req(None, Some("5:s"))).map(|p| p.after),
            Ok(Some(SessionsCursor {
                mtime_ns: 5,
                stem: "s".into()
            }))
        );
        assert!(sessions_page(&req(None, Some("s"))).is_err());
    }
}
