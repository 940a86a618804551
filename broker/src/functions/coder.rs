//! `coder::*`: registration, validation (C-codes) and dispatch to the executor, which checks
//! every request again and does the work.

use std::sync::Arc;

use iii_shell_protocol::coder::*;
use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::WireError;
use serde_json::Value;

use super::definition::{meta, to_value, CallMeta, FunctionDef};
use crate::schema::schema_for;
use crate::services::{unexpected_reply, Services};

macro_rules! def {
    ($id:expr, $desc:expr, $meta:expr, $req:ty, $resp:ty) => {
        FunctionDef {
            id: $id,
            description: $desc,
            metadata: $meta,
            request_format: schema_for::<$req>(),
            response_format: schema_for::<$resp>(),
        }
    };
}

pub fn definitions() -> Vec<FunctionDef> {
    let plain = || meta(false, false, false);
    let display = || meta(false, false, true);
    vec![
        def!("coder::info", "Report the coder access contract: mode (jailed | unjailed), allowed roots (primary first), the session_root relative paths anchor against, size caps, response budgets, listing/search limits, non-accessible globs and default_exclude_globs. Call it first when a path is rejected.", plain(), InfoInput, InfoOutput),
        def!("coder::read-file", "Read a file. stat: true probes size/mtime/total_lines without content; line_from/line_to (1-based, inclusive) read a window of a file of any size; numbered: true prefixes absolute line numbers; paths[] (XOR path) batch-reads. Paths: relative to the primary root or absolute inside an allowed root (see coder::info).", plain(), ReadFileInput, ReadFileOutput),
        def!("coder::search", "Search file contents (literal or regex) and/or paths (files and dirs); first match per line only. default_exclude_globs noise is skipped unless use_default_excludes: false. truncated: true means refine the query, not paginate. Paths: relative to the primary root or absolute inside an allowed root (see coder::info).", plain(), SearchInput, SearchOutput),
        def!("coder::list-folder", "List one folder, paginated and sorted by name. Entries carry only name; entry path = response path + '/' + name. Non-accessible entries are listed with non_accessible: true. Paths: relative to the primary root or absolute inside an allowed root (see coder::info).", plain(), ListFolderInput, ListFolderOutput),
        def!("coder::tree", "Show a directory tree, bounded by max_depth, per_folder_limit and a node budget. Nodes carry only name (child path = parent path + '/' + name); over-limit folders are truncated stubs to paginate with coder::list-folder. Paths: relative to the primary root or absolute inside an allowed root (see coder::info).", plain(), TreeInput, TreeOutput),
        def!("coder::create-file", "Create one or more files atomically; per-file overwrite and parents flags. For a conflict-safe overwrite pass the revision from coder::read-file as expected_revision (stale revision: C221, nothing written). Paths: relative to the primary root or absolute inside an allowed root (see coder::info).", display(), CreateFileInput, CreateFileOutput),
        def!("coder::update-file", "Edit one or more files: batched line ops (1-based, inclusive, applied bottom-up), then regex replace ops; each file commits atomically. To replace a large region use two short anchors joined by .*? with dot_matches_newline: true instead of quoting it. Paths: relative to the primary root or absolute inside an allowed root (see coder::info).", display(), UpdateFileInput, UpdateFileOutput),
        def!("coder::delete-file", "Remove one or more paths. Directories need recursive: true; missing paths succeed; recursion refuses to descend through non-accessible entries. Paths: relative to the primary root or absolute inside an allowed root (see coder::info).", display(), DeleteFileInput, DeleteFileOutput),
        def!("coder::move", "Move or rename one or more paths; per-entry overwrite and parents flags. Same-root moves rename atomically; cross-root moves copy+delete files only (move directory contents individually) and remove the copy if the delete fails. Paths: relative to the primary root or absolute inside an allowed root (see coder::info).", plain(), MoveFileInput, MoveFileOutput),
        def!("coder::change-diff", "Internal console UI: retrieve an exact before/after snapshot by change id.", meta(true, false, false), ChangeDiffInput, ChangeDiffOutput),
    ]
}

fn invalid(msg: impl Into<String>) -> WireError {
    WireError::new(iii_shell_protocol::Code::C210, msg)
}

/// Deserializes a payload (C210 naming what did not fit). Unknown fields are ignored.
fn parse<T: serde::de::DeserializeOwned>(value: &Value) -> Result<T, WireError> {
    let v = if value.is_null() {
        Value::Object(Default::default())
    } else {
        value.clone()
    };
    serde_json::from_value(v).map_err(|e| invalid(format!("malformed payload: {e}")))
}

/// The harness-stamped filesystem scope: `fs_scope: {scope_root?, session_root?}` in the
/// invocation metadata, or (for callers that cannot set metadata) as a hidden payload field.
/// The metadata wins.
pub fn scope_of(payload: &Value, meta: &CallMeta) -> Result<FsScope, WireError> {
    let raw = meta
        .metadata
        .as_ref()
        .and_then(|m| m.get("fs_scope"))
        .filter(|v| !v.is_null())
        .or_else(|| payload.get("fs_scope").filter(|v| !v.is_null()));
    let Some(raw) = raw else {
        return Ok(FsScope::default());
    };
    let obj = raw
        .as_object()
        .ok_or_else(|| invalid("fs_scope must be an object {scope_root?, session_root?}"))?;
    let field = |k: &str| -> Result<Option<String>, WireError> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if !s.is_empty() && s.starts_with('/') => Ok(Some(s.clone())),
            Some(other) => Err(invalid(format!(
                "fs_scope.{k} must be an absolute path, got {other}"
            ))),
        }
    };
    let scope_root = field("scope_root")?;
    let session_root = field("session_root")?.or_else(|| scope_root.clone());
    Ok(FsScope {
        scope_root,
        session_root,
    })
}

fn need_path(p: &str, what: &str) -> Result<(), WireError> {
    if p.is_empty() {
        return Err(invalid(format!("'{what}' is empty")));
    }
    if p.contains('\0') {
        return Err(invalid(format!("'{what}' contains a NUL byte")));
    }
    Ok(())
}

/// Checks a call and turns it into the executor's operation. Per-entry problems of batched
/// calls are left to the executor, which reports them per entry.
fn op_of(function: &str, payload: &Value) -> Result<CoderOp, WireError> {
    Ok(match function {
        // A function that takes no arguments ignores its payload, whatever its shape.
        "coder::info" => CoderOp::Info,
        "coder::read-file" => {
            let r: ReadFileInput = parse(payload)?;
            let spec = ReadSpec::from(r);
            check_read(&spec).map_err(invalid)?;
            if let Some(p) = &spec.path {
                need_path(p, "path")?;
            }
            CoderOp::Read(spec)
        }
        "coder::search" => {
            let r: SearchInput = parse(payload)?;
            need_path(&r.path, "path")?;
            CoderOp::Search(r)
        }
        "coder::list-folder" => {
            let r: ListFolderInput = parse(payload)?;
            need_path(&r.path, "path")?;
            CoderOp::ListFolder(r)
        }
        "coder::tree" => {
            let r: TreeInput = parse(payload)?;
            need_path(&r.path, "path")?;
            CoderOp::Tree(r)
        }
        "coder::create-file" => CoderOp::Create(parse(payload)?),
        "coder::update-file" => {
            let r: UpdateFileInput = parse(payload)?;
            CoderOp::Update(
                r.files
                    .into_iter()
                    .map(|f| EditSpec {
                        path: f.path,
                        ops: f.ops.into_iter().map(EditOp::from).collect(),
                    })
                    .collect(),
            )
        }
        "coder::delete-file" => CoderOp::Delete(parse(payload)?),
        "coder::move" => CoderOp::Move(parse(payload)?),
        "coder::change-diff" => CoderOp::ChangeDiff(parse(payload)?),
        other => return Err(invalid(format!("unknown function: {other}"))),
    })
}

pub async fn dispatch(
    services: &Arc<Services>,
    function: &str,
    payload: Value,
    meta: CallMeta,
) -> Result<Value, WireError> {
    let scope = scope_of(&payload, &meta)?;
    let op = op_of(function, &payload)?;
    let reply = services
        .executor
        .call(Request::Coder(Box::new(CoderCall { scope, op })))
        .await
        .map_err(to_coder)?;
    let Reply::Coder(reply) = reply else {
        return Err(to_coder(unexpected_reply()));
    };
    match *reply {
        CoderReply::Info(x) => to_value(&x),
        CoderReply::Read(x) => to_value(&x),
        CoderReply::Search(x) => to_value(&x),
        CoderReply::ListFolder(x) => to_value(&x),
        CoderReply::Tree(x) => to_value(&x),
        CoderReply::Create(x) => to_value(&x),
        CoderReply::Update(x) => to_value(&x),
        CoderReply::Delete(x) => to_value(&x),
        CoderReply::Move(x) => to_value(&x),
        CoderReply::ChangeDiff(x) => to_value(&x),
    }
    .map_err(to_coder)
}
