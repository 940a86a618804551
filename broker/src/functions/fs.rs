//! `shell::fs::*`: validation, host dispatch to the executor, streaming through engine
//! channels, and sandbox forwarding.

use std::sync::Arc;
use std::time::Duration;

use iii_shell_protocol::exec::Target;
use iii_shell_protocol::fs::*;
use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::{Code, WireError};
use serde_json::Value;

use super::definition::{meta, to_value, FunctionDef};
use super::sandbox;
use crate::engine::channel;
use crate::schema::schema_for;
use crate::services::{unexpected_reply, Services};
use crate::snapshot::ConfigSnapshot;
use crate::validate::parse;

/// Longest pause a channel may make before a stream is abandoned.
const CHANNEL_IDLE: Duration = Duration::from_secs(30);

macro_rules! def {
    ($id:expr, $desc:expr, $req:ty, $resp:ty) => {
        FunctionDef {
            id: $id,
            description: $desc,
            metadata: meta(false, false, false),
            request_format: schema_for::<$req>(),
            response_format: schema_for::<$resp>(),
        }
    };
}

pub fn definitions() -> Vec<FunctionDef> {
    vec![
        def!("shell::fs::ls", "List the files and subdirectories of a directory on the filesystem. Errors return { code, message }; common: S210 bad path, S211 not found or not accessible, S212 not a directory, S215 jail escape. For paginated or recursive listings prefer coder::list-folder / coder::tree.", LsRequest, LsResponse),
        def!("shell::fs::stat", "Stat one file or directory: its type, size, mode, and mtime (paths jail-relative when fs.host_roots are set). Errors return { code, message }; common: S211 not found or not accessible, S215 jail escape. coder::read-file with stat: true additionally reports total_lines.", StatRequest, FsEntry),
        def!("shell::fs::mkdir", "Create a directory. `mode` is an octal string like \"0755\". `parents: true` creates missing parents and is idempotent. Returns { created, path, already_existed }. Errors return { code, message }; common: S210 bad mode, S213 exists, S215 jail escape.", MkdirRequest, MkdirResponse),
        def!("shell::fs::rm", "Delete a file or directory. `recursive: true` is required for a non-empty directory. Returns { removed, path, was_present }. Errors return { code, message }; common: S211 not found or not accessible, S214 dir not empty, S215 jail escape. coder::delete-file removes several paths per call.", RmRequest, RmResponse),
        def!("shell::fs::chmod", "Change a file or directory's permissions. `mode` is an octal string like \"0644\". `uid`/`gid` optionally chown. `recursive: true` walks the tree (symlinks skipped). Returns { entries_changed, path, recursive }. Errors return { code, message }; common: S210 bad mode, S211 not found or not accessible, S215 jail escape.", ChmodRequest, ChmodResponse),
        def!("shell::fs::mv", "Move or rename a file or directory. `overwrite: true` allows replacing an existing dst. Returns { moved, src, dst, overwrote }. Errors return { code, message }; common: S211 src not found or not accessible, S213 dst exists, S215 jail escape. coder::move moves several paths per call.", MvRequest, MvResponse),
        def!("shell::fs::grep", "Search file contents for a pattern (Rust regex, RE2-like); `include_glob`/`exclude_glob` filter paths. Returns { matches, truncated }. Errors return { code, message }; common: S217 bad regex, S215 jail escape. coder::search adds context lines and noise filtering.", GrepRequest, GrepResponse),
        def!("shell::fs::sed", "Find-and-replace across files. `pattern` is a Rust regex (regex: false for a literal). Provide either `files` or `path` (+ recursive). Returns { results, total_replacements }. Errors return { code, message }; common: S217 bad regex, S211 not found, S215 jail escape.", SedRequest, SedResponse),
        def!("shell::fs::write", "Write a file. A string `content` is written inline (host only); large payloads or a sandbox target need a ContentRef { channel_id, access_key, direction } from a write stream channel. `files: [...]` writes several files (host, inline). Errors return { code, message }; common: S210 bad mode or inline-on-sandbox, S218 over max_write_bytes.", WriteRequest, WriteResponse),
        def!("shell::fs::read", "Stream a file: returns a ContentRef handle (channel_id/access_key) plus size/mode/mtime, NOT the text — for text use coder::read-file, which returns content inline. Errors return { code, message }; common: S211 not found or not accessible, S212 is a directory, S218 over max_read_bytes, S216 channel/IO error.", ReadRequest, ReadResponseWire),
    ]
}

fn snapshot(services: &Services) -> Result<Arc<ConfigSnapshot>, WireError> {
    services
        .snapshots
        .get()
        .ok_or_else(|| WireError::new(Code::S216, "no configuration is in force yet"))
}

fn invalid(msg: impl Into<String>) -> WireError {
    WireError::new(Code::S210, msg)
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

fn mode(rt: &ConfigSnapshot, s: &str) -> Result<u32, WireError> {
    parse_mode(s, rt.config.fs.allow_special_bits).map_err(invalid)
}

/// The sandbox id of a sandbox target (after the enabled check), or None for the host.
fn sandbox_of(rt: &ConfigSnapshot, target: &Target) -> Result<Option<String>, WireError> {
    match target {
        Target::Host => Ok(None),
        Target::Sandbox { sandbox_id } => {
            if !rt.config.sandbox.enabled {
                return Err(invalid(
                    "sandbox targets are disabled (sandbox.enabled: false)",
                ));
            }
            if uuid::Uuid::parse_str(sandbox_id).is_err() {
                return Err(invalid(format!("sandbox_id {sandbox_id:?} is not a UUID")));
            }
            Ok(Some(sandbox_id.clone()))
        }
    }
}

tokio::task_local! {
    /// The call's `fs_scope.scope_root`, set around the whole of one `shell::fs::*` call
    /// ([`dispatch`]); every executor request of the call is built by [`request`] under it.
    static SCOPE: Option<String>;
}

/// The executor request of `op` in this call: scoped (`FsScoped`) when the call carries
/// `fs_scope.scope_root`. The executor resolves and enforces the scope itself.
fn request(op: FsOp) -> Request {
    match SCOPE.try_with(Clone::clone).ok().flatten() {
        Some(scope_root) => Request::FsScoped { scope_root, op },
        None => Request::Fs(op),
    }
}

async fn host(services: &Services, op: FsOp) -> Result<FsReply, WireError> {
    match services.executor.call(request(op)).await? {
        Reply::Fs(r) => Ok(r),
        _ => Err(unexpected_reply()),
    }
}

/// Runs a host operation and serializes whichever response it produced.
async fn host_value(services: &Services, op: FsOp) -> Result<Value, WireError> {
    match host(services, op).await? {
        FsReply::Ls(x) => to_value(&x),
        FsReply::Stat(x) => to_value(&x),
        FsReply::Mkdir(x) => to_value(&x),
        FsReply::Rm(x) => to_value(&x),
        FsReply::Chmod(x) => to_value(&x),
        FsReply::Mv(x) => to_value(&x),
        FsReply::Grep(x) => to_value(&x),
        FsReply::Sed(x) => to_value(&x),
        _ => Err(unexpected_reply()),
    }
}

/// The payload forwarded to `sandbox::fs::*`: the request minus host-only fields.
fn forward_body(payload: &Value) -> Value {
    let mut v = payload.clone();
    if let Some(o) = v.as_object_mut() {
        for k in ["target", "_caller_worker_id", "base_dir", "fs_scope"] {
            o.remove(k);
        }
    }
    v
}

/// Serves one `shell::fs::*` call. A harness-stamped `fs_scope.scope_root` (`scope`, read from
/// the invocation metadata or the hidden payload field) confines every path of the call:
/// S220 outside it.
pub async fn dispatch(
    services: &Arc<Services>,
    function_id: &str,
    payload: Value,
    scope: Option<String>,
) -> Result<Value, WireError> {
    SCOPE
        .scope(scope, dispatch_op(services, function_id, payload))
        .await
}

async fn dispatch_op(
    services: &Arc<Services>,
    function_id: &str,
    payload: Value,
) -> Result<Value, WireError> {
    let rt = snapshot(services)?;
    let op = function_id.trim_start_matches("shell::fs::");
    match op {
        "ls" => {
            let r: LsRequest = parse(&payload)?;
            if let Some(id) = sandbox_of(&rt, &r.target)? {
                return sandbox::fs(services, op, &id, forward_body(&payload)).await;
            }
            need_path(&r.path, "path")?;
            host_value(services, FsOp::Ls { path: r.path }).await
        }
        "stat" => {
            let r: StatRequest = parse(&payload)?;
            if let Some(id) = sandbox_of(&rt, &r.target)? {
                return sandbox::fs(services, op, &id, forward_body(&payload)).await;
            }
            need_path(&r.path, "path")?;
            host_value(services, FsOp::Stat { path: r.path }).await
        }
        "mkdir" => {
            let r: MkdirRequest = parse(&payload)?;
            let m = mode(&rt, &r.mode)?;
            if let Some(id) = sandbox_of(&rt, &r.target)? {
                return sandbox::fs(services, op, &id, forward_body(&payload)).await;
            }
            need_path(&r.path, "path")?;
            host_value(
                services,
                FsOp::Mkdir {
                    path: r.path,
                    mode: m,
                    parents: r.parents,
                },
            )
            .await
        }
        "rm" => {
            let r: RmRequest = parse(&payload)?;
            if let Some(id) = sandbox_of(&rt, &r.target)? {
                return sandbox::fs(services, op, &id, forward_body(&payload)).await;
            }
            need_path(&r.path, "path")?;
            host_value(
                services,
                FsOp::Rm {
                    path: r.path,
                    recursive: r.recursive,
                },
            )
            .await
        }
        "chmod" => {
            let r: ChmodRequest = parse(&payload)?;
            let m = mode(&rt, &r.mode)?;
            if let Some(id) = sandbox_of(&rt, &r.target)? {
                return sandbox::fs(services, op, &id, forward_body(&payload)).await;
            }
            need_path(&r.path, "path")?;
            iii_shell_policy::mode::check_owner_ids(r.uid, r.gid)?;
            host_value(
                services,
                FsOp::Chmod {
                    path: r.path,
                    mode: m,
                    uid: r.uid,
                    gid: r.gid,
                    recursive: r.recursive,
                },
            )
            .await
        }
        "mv" => {
            let r: MvRequest = parse(&payload)?;
            if let Some(id) = sandbox_of(&rt, &r.target)? {
                return sandbox::fs(services, op, &id, forward_body(&payload)).await;
            }
            need_path(&r.src, "src")?;
            need_path(&r.dst, "dst")?;
            host_value(
                services,
                FsOp::Mv {
                    src: r.src,
                    dst: r.dst,
                    overwrite: r.overwrite,
                },
            )
            .await
        }
        "grep" => {
            let r: GrepRequest = parse(&payload)?;
            if r.pattern.is_empty() {
                return Err(invalid("'pattern' is empty"));
            }
            if let Some(id) = sandbox_of(&rt, &r.target)? {
                return sandbox::fs(services, op, &id, forward_body(&payload)).await;
            }
            need_path(&r.path, "path")?;
            let spec = GrepSpec {
                path: r.path,
                pattern: r.pattern,
                recursive: r.recursive,
                ignore_case: r.ignore_case,
                include_glob: r.include_glob,
                exclude_glob: r.exclude_glob,
                max_matches: r.max_matches,
                max_line_bytes: r.max_line_bytes,
            };
            host_value(services, FsOp::Grep(spec)).await
        }
        "sed" => {
            let r: SedRequest = parse(&payload)?;
            if r.pattern.is_empty() {
                return Err(invalid("'pattern' is empty"));
            }
            if let Some(id) = sandbox_of(&rt, &r.target)? {
                return sandbox::fs(services, op, &id, forward_body(&payload)).await;
            }
            match (r.files.is_empty(), &r.path) {
                (false, Some(_)) => return Err(invalid("give either 'files' or 'path', not both")),
                (true, None) => return Err(invalid("give either 'files' or 'path'")),
                _ => {}
            }
            let spec = SedSpec {
                pattern: r.pattern,
                replacement: r.replacement,
                files: r.files,
                path: r.path,
                recursive: r.recursive,
                regex: r.regex,
                ignore_case: r.ignore_case,
                first_only: r.first_only,
                include_glob: r.include_glob,
                exclude_glob: r.exclude_glob,
            };
            host_value(services, FsOp::Sed(spec)).await
        }
        "write" => write(services, &rt, payload).await,
        "read" => read(services, payload).await,
        other => Err(invalid(format!("unknown function: shell::fs::{other}"))),
    }
}

/// One file of a write, after the form checks.
struct Planned {
    path: String,
    content: WriteContentWire,
    mode: u32,
    parents: bool,
}

async fn write(
    services: &Arc<Services>,
    rt: &ConfigSnapshot,
    payload: Value,
) -> Result<Value, WireError> {
    let r: WriteRequest = parse(&payload)?;
    let batch = r.files.is_some();
    if batch && (r.path.is_some() || r.content.is_some() || r.mode.is_some() || r.parents.is_some())
    {
        return Err(invalid(
            "give either the single-file fields (path/content/mode/parents) or 'files', not both",
        ));
    }
    let mut planned = Vec::new();
    if let Some(files) = r.files {
        if files.is_empty() {
            return Err(invalid("'files' is empty"));
        }
        for (i, f) in files.into_iter().enumerate() {
            need_path(&f.path, "files[].path")?;
            planned.push(Planned {
                mode: mode(rt, &f.mode).map_err(|e| name_failed_entry(e, i, &f.path))?,
                path: f.path,
                content: f.content,
                parents: f.parents,
            });
        }
    } else {
        let path = r
            .path
            .ok_or_else(|| invalid("missing 'path' (or use 'files')"))?;
        let content = r
            .content
            .ok_or_else(|| invalid("missing 'content': an inline string or a ContentRef"))?;
        need_path(&path, "path")?;
        planned.push(Planned {
            mode: mode(rt, r.mode.as_deref().unwrap_or("0644"))?,
            path,
            content,
            parents: r.parents.unwrap_or(false),
        });
    }

    if let Some(id) = sandbox_of(rt, &r.target)? {
        if planned
            .iter()
            .any(|p| matches!(p.content, WriteContentWire::Inline(_)))
        {
            return Err(invalid(
                "inline string content is host-only: on a sandbox target open a write stream channel (engine::channels::create) and pass its ContentRef as 'content'",
            ));
        }
        if !batch {
            return sandbox::fs(services, "write", &id, forward_body(&payload)).await;
        }
        let mut results = Vec::new();
        for p in planned {
            let body = serde_json::json!({"path": p.path, "content": p.content, "mode": format!("{:04o}", p.mode), "parents": p.parents});
            let v = sandbox::fs(services, "write", &id, body).await?;
            let w: WriteResponse = serde_json::from_value(v)
                .map_err(|e| WireError::new(Code::S216, format!("bad engine response: {e}")))?;
            results.push(WriteFileResult {
                path: w.path,
                bytes_written: w.bytes_written,
            });
        }
        return to_value(&WriteResponse {
            bytes_written: results.iter().map(|r| r.bytes_written).sum(),
            path: String::new(),
            files: results,
        });
    }

    // Host. Check what can be checked before anything is written, so a batch with a bad
    // entry writes nothing: relative paths while unjailed, and inline sizes over the cap.
    let cap = rt.config.fs.max_write_bytes;
    for p in &planned {
        if rt.config.fs.host_roots.is_empty() && !p.path.starts_with('/') {
            return Err(invalid(format!(
                "path must be absolute when unjailed (fs.host_roots is empty; `~` is not expanded): {}",
                p.path
            )));
        }
        if let WriteContentWire::Inline(text) = &p.content {
            if cap > 0 && text.len() as u64 > cap {
                return Err(WireError::new(
                    Code::S218,
                    format!(
                        "{}: {} bytes exceed fs.max_write_bytes ({cap})",
                        p.path,
                        text.len()
                    ),
                ));
            }
        }
    }
    // A batch of inline entries that fits one frame goes to the executor as one request,
    // which stages every entry as a fsynced temp file before renaming any: all or nothing.
    let inline_total = planned.iter().try_fold(0usize, |n, p| match &p.content {
        WriteContentWire::Inline(text) => Some(n + text.len()),
        WriteContentWire::Stream(_) => None,
    });
    if batch && inline_total.is_some_and(|n| n <= INLINE_FRAME_MAX) {
        let files = planned
            .into_iter()
            .map(|p| WriteFile {
                data: match p.content {
                    WriteContentWire::Inline(text) => text.into_bytes(),
                    WriteContentWire::Stream(_) => Vec::new(), // excluded above
                },
                path: p.path,
                mode: p.mode,
                parents: p.parents,
            })
            .collect::<Vec<_>>();
        let n = files.len();
        return match host(services, FsOp::Write { files }).await? {
            FsReply::Write(w) if n == 1 => to_value(&WriteResponse {
                bytes_written: w.bytes_written,
                path: String::new(),
                files: vec![WriteFileResult {
                    path: w.path,
                    bytes_written: w.bytes_written,
                }],
            }),
            FsReply::Write(w) => to_value(&w),
            _ => Err(unexpected_reply()),
        };
    }
    // Otherwise (streamed or large entries) a batch is staged entry by entry at the executor
    // and committed at once: all or nothing.
    if batch {
        return write_staged(services, planned).await;
    }
    // A single file; large inline content is streamed to the executor so no single socket
    // frame has to carry it.
    let Some(p) = planned.pop() else {
        return Err(invalid("missing 'path' (or use 'files')"));
    };
    let op = FsOp::WriteStream {
        path: p.path.clone(),
        mode: p.mode,
        parents: p.parents,
    };
    let w = match p.content {
        WriteContentWire::Inline(text) if text.len() > INLINE_FRAME_MAX => {
            write_inline_streamed(services, text.into_bytes(), op).await?
        }
        WriteContentWire::Inline(text) => {
            let file = WriteFile {
                path: p.path,
                mode: p.mode,
                parents: p.parents,
                data: text.into_bytes(),
            };
            match host(services, FsOp::Write { files: vec![file] }).await? {
                FsReply::Write(w) => w,
                _ => return Err(unexpected_reply()),
            }
        }
        WriteContentWire::Stream(cref) => write_stream(services, &cref, op).await?,
    };
    to_value(&WriteResponse {
        bytes_written: w.bytes_written,
        path: w.path,
        files: Vec::new(),
    })
}

/// Inline content above this size goes to the executor as a stream of chunks rather than in
/// one request frame (frames are capped at `MAX_FRAME_BYTES`).
const INLINE_FRAME_MAX: usize = 8 << 20;

/// Drops a staged batch at the executor unless it was committed: on an entry's failure, and
/// when the call is abandoned (its future dropped) part-way. The executor also drops it when
/// the connection ends, and its temp files are unnamed, so nothing is ever left on disk.
struct AbortUncommitted {
    services: Arc<Services>,
    batch: u64,
    committed: bool,
}

impl Drop for AbortUncommitted {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        let (services, batch) = (self.services.clone(), self.batch);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = host(&services, FsOp::WriteAbort { batch }).await;
            });
        }
    }
}

/// Names entry `i` of a batch in a broker-side error (an executor-side one already does).
fn name_failed_entry(mut e: WireError, i: usize, path: &str) -> WireError {
    if !e.message.starts_with("files[") {
        e.message = format!("files[{i}] ({path}): {}; no file was written", e.message);
    }
    e
}

/// A `files[]` batch with streamed (or large) entries: every entry is staged at the executor
/// as a fsynced temp file under one batch id, and one commit renames them all into place. An
/// entry that fails (bad path, over a cap, a channel that breaks) aborts the batch: no target
/// changes, and the error names the entry.
async fn write_staged(services: &Arc<Services>, planned: Vec<Planned>) -> Result<Value, WireError> {
    let mut guard = AbortUncommitted {
        services: services.clone(),
        batch: uuid::Uuid::new_v4().as_u64_pair().0,
        committed: false,
    };
    let batch = guard.batch;
    let count = planned.len() as u32;
    for (i, p) in planned.into_iter().enumerate() {
        let op = FsOp::WriteStage {
            batch,
            index: i as u32,
            count,
            path: p.path.clone(),
            mode: p.mode,
            parents: p.parents,
        };
        let r = match p.content {
            WriteContentWire::Inline(text) => {
                write_inline_streamed(services, text.into_bytes(), op).await
            }
            WriteContentWire::Stream(cref) => write_stream(services, &cref, op).await,
        };
        r.map_err(|e| name_failed_entry(e, i, &p.path))?;
    }
    let reply = host(services, FsOp::WriteCommit { batch }).await;
    // Whatever the commit answered, the executor no longer holds the batch.
    guard.committed = true;
    match reply? {
        FsReply::Write(w) => to_value(&w),
        _ => Err(unexpected_reply()),
    }
}

/// Sends inline bytes to the executor as a streamed write (`op` is a `WriteStream` or a
/// `WriteStage`).
async fn write_inline_streamed(
    services: &Arc<Services>,
    data: Vec<u8>,
    op: FsOp,
) -> Result<WriteResponse, WireError> {
    let (tx, rx) = tokio::sync::mpsc::channel(iii_shell_protocol::messages::STREAM_WINDOW);
    let feed = tokio::spawn(async move {
        for chunk in data.chunks(iii_shell_protocol::messages::STREAM_CHUNK) {
            if tx.send(Ok(chunk.to_vec())).await.is_err() {
                return;
            }
        }
    });
    streamed_write(services, op, rx, feed).await
}

/// Relays the reader end of the caller's channel to the executor as a streamed write.
async fn write_stream(
    services: &Arc<Services>,
    cref: &ContentRef,
    op: FsOp,
) -> Result<WriteResponse, WireError> {
    let engine = services.engine()?;
    let ws = channel::open(&engine, cref, ContentDirection::Read)
        .await
        .map_err(|e| WireError::new(Code::S216, e))?;
    let (tx, rx) = tokio::sync::mpsc::channel(iii_shell_protocol::messages::STREAM_WINDOW);
    let pump = tokio::spawn(channel::pump_reader(ws, tx, CHANNEL_IDLE));
    streamed_write(services, op, rx, pump).await
}

/// Sends a streamed write whose chunks come from `rx`, fed by `feeder`, which is stopped once
/// the executor has answered.
async fn streamed_write(
    services: &Arc<Services>,
    op: FsOp,
    rx: tokio::sync::mpsc::Receiver<Result<Vec<u8>, String>>,
    feeder: tokio::task::JoinHandle<()>,
) -> Result<WriteResponse, WireError> {
    let reply = services.executor.call_with_input(request(op), rx).await;
    feeder.abort();
    match reply? {
        Reply::Fs(FsReply::Write(w)) => Ok(w),
        _ => Err(unexpected_reply()),
    }
}

async fn read(services: &Arc<Services>, payload: Value) -> Result<Value, WireError> {
    let r: ReadRequest = parse(&payload)?;
    let rt = snapshot(services)?;
    if let Some(id) = sandbox_of(&rt, &r.target)? {
        return sandbox::fs(services, "read", &id, forward_body(&payload)).await;
    }
    need_path(&r.path, "path")?;
    // Open the file first: a failed read (missing, denied, too large) creates no channel,
    // and its error comes before "this needs an engine" (`iii-shell call`). Without an
    // engine the opened stream is dropped, which cancels it in the executor.
    let (reply, mut stream) = services
        .executor
        .call_with_output(request(FsOp::Read { path: r.path }))
        .await?;
    let start = match reply {
        Reply::Fs(FsReply::ReadStart(s)) => s,
        _ => return Err(unexpected_reply()),
    };
    let engine = services.engine()?;
    let (writer, reader) = channel::create(&engine).await.map_err(|e| {
        WireError::new(
            Code::S216,
            format!("cannot create a channel: {}", e.message),
        )
    })?;
    let ws = channel::open(&engine, &writer, ContentDirection::Write)
        .await
        .map_err(|e| WireError::new(Code::S216, e))?;
    tokio::spawn(async move {
        let mut out = channel::ChannelWriter::new(ws);
        loop {
            match stream.next().await {
                Some(Ok(chunk)) => {
                    match tokio::time::timeout(CHANNEL_IDLE, out.send(chunk)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "read channel closed by the reader");
                            return;
                        }
                        Err(_) => {
                            tracing::warn!("read channel not drained for {CHANNEL_IDLE:?}; abandoning the stream");
                            return;
                        }
                    }
                }
                Some(Err(e)) => {
                    let _ = tokio::time::timeout(CHANNEL_IDLE, out.fail(&e)).await;
                    break;
                }
                None => break,
            }
        }
        let _ = tokio::time::timeout(CHANNEL_IDLE, out.close()).await;
    });
    to_value(&ReadResponseWire {
        content: ContentRef {
            direction: ContentDirection::Read,
            ..reader
        },
        size: start.size,
        mode: start.mode,
        mtime: start.mtime,
    })
}
