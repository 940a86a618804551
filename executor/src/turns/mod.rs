//! Turn history: per-session records of the files a harness turn changed through shell or
//! coder calls, with pre-images, and their revert.
//!
//! **The pre-image API** (for `shell::fs::*` and `coder::*` alike): [`Turns::before_call`]
//! takes a call's function id and arguments, works out the files it is about to change
//! ([`model::touches`]), resolves each through the jail, keeps its bytes in the blob store and
//! appends a durable `pre` record; [`Turns::after_call`] appends the `post` record (the
//! after-revision). The harness hooks `on-pre-trigger`/`on-post-trigger` call exactly these.
//! The executor's own `shell::fs::*` and `coder::*` requests record into the open turn without
//! a hook ([`calls`]: `begin`/`finish` around the request, at dispatch).
//!
//! Records (one JSON line each, `store.rs`): `start`, `end`, `pre`, `post`, `drop_if_same`,
//! `meta`, `change`, `discard`. Loading folds them into [`model::TurnRecord`]s; a `pre` with no
//! `post` (the executor died mid-call) still lists, with no after-revision; a `discard` removes
//! a one-call turn that changed nothing.
//!
//! **`shell::turns::sessions`** ([`sessions`]): the sessions with recorded turns, newest
//! first, a page at a time (not in the seed: an addition for the console page).
//!
//! **`coder::change-diff`** is a view of these records ([`changes`]): each coder change is a
//! `change` record of the turn it was made in, and its id resolves only through that record.

pub mod calls;
pub mod changes;
pub mod coder_calls;
pub mod model;
pub mod sessions;
pub mod store;
pub mod tree;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use iii_shell_policy::sync::lock;
use iii_shell_protocol::clock::now_ms;
use serde_json::{json, Value};

use crate::policy::Policy;
use iii_shell_files::error::ExecError;
use model::*;
use store::Store;

/// Bodies up to this size are kept whole in the blob store (UTF-8 or not).
pub const MAX_STORED_BODY: u64 = 16 * 1024 * 1024;
/// `get` fills in at most this much of one body (`MAX_PRE_IMAGE_BYTES`)…
pub const MAX_PRE_IMAGE_BYTES: usize = 64 * 1024;
/// …and this much across one response.
pub const MAX_RESPONSE_BODIES: usize = 1024 * 1024;
/// Sub-agent parent links followed at most this far.
const MAX_HOPS: usize = 16;
/// `title` is the first characters of the message preview.
const TITLE_CHARS: usize = 80;

/// Who is calling: the top-level session/turn the change is recorded under.
#[derive(Debug, Clone)]
pub struct TurnCtx {
    pub session: String,
    pub turn: String,
    pub root: Option<String>,
    pub agent: Option<AgentRef>,
}

#[derive(Default)]
pub struct Turns {
    store: Mutex<Option<Store>>,
    /// Sub-agent session → (parent session, parent turn).
    parents: Mutex<HashMap<String, (String, Option<String>)>>,
    /// Session → its newest turn.
    active: Mutex<HashMap<String, String>>,
    /// Top-level turns started and not completed (`calls`: where requests record).
    open: Mutex<Vec<calls::OpenTurn>>,
    seen: std::sync::atomic::AtomicU64,
}

fn invalid(e: serde_json::Error) -> ExecError {
    ExecError::Invalid(format!("bad request: {e}"))
}

impl Turns {
    fn with_store<R>(&self, policy: &Policy, f: impl FnOnce(&Store) -> R) -> Result<R, ExecError> {
        let dir = PathBuf::from(&policy.config.turns.data_dir);
        let mut g = lock(&self.store);
        let reopen = g.as_ref().is_none_or(|s| s.dir() != dir.as_path());
        if reopen {
            let s = Store::open(&dir, policy.config.turns.max_blob_bytes).map_err(|e| {
                ExecError::Internal(format!(
                    "cannot open the turn store {}: {e}; make turns.data_dir writable",
                    dir.display()
                ))
            })?;
            *g = Some(s);
        }
        match g.as_ref() {
            Some(s) => Ok(f(s)),
            None => Err(ExecError::Internal("turn store unavailable".into())),
        }
    }

    /// Serves one `shell::turns::*` function.
    pub fn call(&self, policy: &Policy, function: &str, payload: &str) -> Result<Value, ExecError> {
        let v: Value = serde_json::from_str(payload).map_err(invalid)?;
        match function {
            "shell::turns::on-turn-started" => {
                let ev: TurnEvent = serde_json::from_value(v).unwrap_or_default();
                self.turn_started(policy, &ev)?;
                Ok(json!({"ok": true}))
            }
            "shell::turns::on-turn-completed" => {
                let ev: TurnEvent = serde_json::from_value(v).unwrap_or_default();
                self.turn_completed(policy, &ev)?;
                Ok(json!({"ok": true}))
            }
            "shell::turns::on-pre-trigger" | "shell::turns::on-post-trigger" => {
                let h: HookInput = serde_json::from_value(v).unwrap_or_default();
                let pre = function.ends_with("pre-trigger");
                if let (Some(ctx), Some(call)) = (self.ctx(&h), h.call.as_ref()) {
                    if pre {
                        self.before_call(policy, &ctx, &call.function_id, &call.arguments)?;
                    } else {
                        self.after_call(
                            policy,
                            &ctx,
                            &call.function_id,
                            &call.arguments,
                            h.is_error(),
                        )?;
                    }
                }
                Ok(json!({"decision": "continue"}))
            }
            "shell::turns::list" => {
                let session = req_str(&v, "session_id")?;
                let turns = self.with_store(policy, |s| fold(&s.records(&session)))?;
                let turns: Vec<Value> = turns
                    .iter()
                    .rev()
                    .map(|t| {
                        let files: Vec<Value> = t
                            .files
                            .iter()
                            .map(|f| {
                                let mut h = json!({"path": f.path, "kind": f.kind});
                                if let Some(r) = &f.root {
                                    h["root"] = json!(r);
                                }
                                if let Some(a) = &f.agent {
                                    h["agent"] = json!(a);
                                }
                                h
                            })
                            .collect();
                        let mut s = json!({"turn_id": t.turn_id, "started_at": t.started_at, "file_count": files.len(), "files": files});
                        if let Some(e) = t.ended_at {
                            s["ended_at"] = json!(e);
                        }
                        if let Some(x) = &t.title {
                            s["title"] = json!(x);
                        }
                        s
                    })
                    .collect();
                Ok(json!({"session_id": session, "turns": turns}))
            }
            "shell::turns::sessions" => {
                if !v.is_object() {
                    return Err(ExecError::Invalid("the request must be an object".into()));
                }
                let r: iii_shell_protocol::turns::SessionsRequest =
                    serde_json::from_value(v).map_err(invalid)?;
                let page =
                    iii_shell_protocol::turns::sessions_page(&r).map_err(ExecError::Invalid)?;
                // Read outside the store's lock: a page reads up to `limit` logs, and the hooks
                // must not wait for it.
                let dir = self.with_store(policy, |s| s.dir().join("sessions"))?;
                serde_json::to_value(sessions::list(&dir, &page))
                    .map_err(|e| ExecError::Internal(format!("sessions: {e}")))
            }
            "shell::turns::get" => {
                let session = req_str(&v, "session_id")?;
                let want = v.get("turn_id").and_then(Value::as_str).map(String::from);
                let turn = self.with_store(policy, |s| {
                    let turns = fold(&s.records(&session));
                    let idx = match &want {
                        Some(id) => turns.iter().position(|t| &t.turn_id == id),
                        None => turns.len().checked_sub(1),
                    };
                    idx.map(|i| inflate(s, &turns, i))
                })?;
                Ok(json!({"session_id": session, "turn": turn}))
            }
            "shell::turns::revert" => {
                let session = req_str(&v, "session_id")?;
                let turn_id = req_str(&v, "turn_id")?;
                let paths: Option<Vec<String>> = match v.get("paths") {
                    None | Some(Value::Null) => None,
                    Some(p) => Some(serde_json::from_value(p.clone()).map_err(invalid)?),
                };
                let force = v.get("force").and_then(Value::as_bool).unwrap_or(false);
                self.revert(policy, &session, &turn_id, paths.as_deref(), force)
            }
            "shell::turns::adopt-root" => {
                let session = req_str(&v, "session_id")?;
                let turn_id = req_str(&v, "turn_id")?;
                let root = req_str(&v, "root")?;
                let n = self.adopt_root(policy, &session, &turn_id, &root)?;
                Ok(json!({"recorded": n}))
            }
            other => Err(ExecError::Invalid(format!(
                "unknown turns function {other}"
            ))),
        }
    }

    /// The top-level session/turn a hook input records under (TURNS-03).
    pub fn ctx(&self, h: &HookInput) -> Option<TurnCtx> {
        let session = h.session_id.clone()?;
        if let Some(p) = h.parent() {
            lock(&self.parents).insert(session.clone(), p);
        }
        let (top, top_turn) = self.top_of(&session, h.turn_id.clone());
        let turn = top_turn.or_else(|| lock(&self.active).get(&top).cloned())?;
        let agent = (top != session).then(|| AgentRef {
            session_id: session.clone(),
            name: h.agent_name(),
        });
        self.mark_seen(&top, &turn, h.scope_root().as_deref());
        Some(TurnCtx {
            session: top,
            turn,
            root: h.scope_root(),
            agent,
        })
    }

    fn top_of(&self, session: &str, turn: Option<String>) -> (String, Option<String>) {
        let parents = lock(&self.parents);
        let (mut s, mut t) = (session.to_string(), turn);
        for _ in 0..MAX_HOPS {
            match parents.get(&s) {
                Some((ps, pt)) => {
                    s = ps.clone();
                    t = pt.clone().or(t);
                }
                None => break,
            }
        }
        (s, t)
    }

    fn turn_started(&self, policy: &Policy, ev: &TurnEvent) -> Result<(), ExecError> {
        let (Some(session), Some(turn)) = (ev.session_id.clone(), ev.turn_id.clone()) else {
            return Ok(());
        };
        if let Some(p) = &ev.parent {
            if let Some(ps) = p.session_id.clone() {
                lock(&self.parents).insert(session, (ps, p.turn_id.clone()));
                return Ok(());
            }
        }
        lock(&self.active).insert(session.clone(), turn.clone());
        self.mark_open(&session, &turn);
        let title: Option<String> = ev
            .message_preview
            .as_deref()
            .map(|m| m.trim().chars().take(TITLE_CHARS).collect());
        self.with_store(policy, |s| {
            s.append(
                &session,
                &json!({"t": "start", "turn_id": turn, "started_at": now_ms(), "title": title}),
            )
        })?
        .map_err(|e| ExecError::Internal(format!("turn store: {e}")))
    }

    fn turn_completed(&self, policy: &Policy, ev: &TurnEvent) -> Result<(), ExecError> {
        let (Some(session), Some(turn)) = (ev.session_id.clone(), ev.turn_id.clone()) else {
            return Ok(());
        };
        if ev.parent.as_ref().is_some_and(|p| p.session_id.is_some()) {
            return Ok(());
        }
        self.mark_closed(&session, &turn);
        self.with_store(policy, |s| {
            s.append(
                &session,
                &json!({"t": "end", "turn_id": turn, "ended_at": now_ms()}),
            )
        })?
        .map_err(|e| ExecError::Internal(format!("turn store: {e}")))
    }

    fn absolute(policy: &Policy, ctx: &TurnCtx, p: &str) -> String {
        if p.starts_with('/') {
            return p.to_string();
        }
        let base = ctx
            .root
            .clone()
            .or_else(|| {
                policy
                    .jail
                    .roots()
                    .first()
                    .map(|r| r.path.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "/".into());
        iii_shell_files::jail::normalize(&Path::new(&base).join(p))
            .to_string_lossy()
            .into_owned()
    }

    /// The pre-image API: keeps the bytes of every file `function_id` is about to change.
    pub fn before_call(
        &self,
        policy: &Policy,
        ctx: &TurnCtx,
        function_id: &str,
        args: &Value,
    ) -> Result<usize, ExecError> {
        self.before_inner(policy, ctx, function_id, args)
            .map(|v| v.len())
    }

    /// [`Self::before_call`], returning each recorded path with its pre-image revision.
    fn before_inner(
        &self,
        policy: &Policy,
        ctx: &TurnCtx,
        function_id: &str,
        args: &Value,
    ) -> Result<Vec<(String, Option<String>)>, ExecError> {
        let mut recorded = Vec::new();
        let append = |rec: &Value| -> Result<(), ExecError> {
            self.with_store(policy, |s| s.append(&ctx.session, rec))?
                .map_err(|e| ExecError::Internal(format!("turn store: {e}")))
        };
        let meta = |e: &tree::Entry, existed: bool| {
            json!({"t": "meta", "turn_id": ctx.turn, "path": e.path, "kind": e.kind,
                "existed": existed, "mode": e.mode, "link": e.link, "at": now_ms()})
        };
        let created_dir = |p: String| tree::Entry {
            path: p,
            kind: "dir",
            mode: 0,
            link: None,
        };
        let mut pre = |path: String, kind: &str, from: Option<String>| -> Result<(), ExecError> {
            let Some(before) = self.capture(policy, &path) else {
                return Ok(());
            };
            let rev = before.revision.clone();
            append(
                &json!({"t": "pre", "turn_id": ctx.turn, "path": path, "kind": kind,
                "cause": function_id, "from": from, "root": ctx.root, "agent": ctx.agent,
                "before": before, "at": now_ms()}),
            )?;
            recorded.push((path, rev));
            Ok(())
        };
        let deep = tree::recursive_call(function_id, args);
        // Structure-only calls: the directories mkdir makes, the modes chmod changes.
        if matches!(function_id, "shell::fs::mkdir" | "shell::fs::chmod") {
            let Some(path) = args.get("path").and_then(Value::as_str) else {
                return Ok(recorded);
            };
            let path = Self::absolute(policy, ctx, path);
            if function_id == "shell::fs::mkdir" {
                let parents = args
                    .get("parents")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let dirs = tree::missing_dirs(policy, &path, true);
                let n = if parents {
                    dirs.len()
                } else {
                    dirs.len().min(1)
                };
                for d in dirs.into_iter().rev().take(n) {
                    append(&meta(&created_dir(d), false))?;
                }
            } else {
                let entries = match deep.then(|| tree::scan(policy, &path)).flatten() {
                    Some(v) => v,
                    None => tree::stat_one(policy, &path).into_iter().collect(),
                };
                for e in entries.iter().filter(|e| e.kind != "link") {
                    append(&meta(e, true))?;
                }
            }
            return Ok(recorded);
        }
        for t in touches(function_id, args) {
            let path = Self::absolute(policy, ctx, &t.path);
            let from = t.from.as_deref().map(|f| Self::absolute(policy, ctx, f));
            // Directories the call creates on the way (write/create parents, a move's
            // destination directory) are removed again by revert when left empty.
            if t.kind != "deleted" {
                for d in tree::missing_dirs(policy, &path, false) {
                    append(&meta(&created_dir(d), false))?;
                }
            }
            if let Some(entries) = deep.then(|| tree::scan(policy, &path)).flatten() {
                // A deleting call: the tree's structure (directories, modes, links) comes back
                // too, not only its files' bodies.
                let rm = matches!(function_id, "shell::fs::rm" | "coder::delete-file");
                for e in entries {
                    match e.kind {
                        "file" => {
                            if rm {
                                append(&meta(&e, true))?;
                            }
                            pre(e.path, t.kind, None)?;
                        }
                        _ if rm => append(&meta(&e, true))?,
                        _ => {}
                    }
                }
                continue;
            }
            if t.kind == "deleted" {
                // A deleted symlink comes back as a link; a deleted file keeps its mode.
                if let Some(e) = tree::stat_one(policy, &path) {
                    append(&meta(&e, true))?;
                }
            }
            pre(path, t.kind, from)?;
        }
        Ok(recorded)
    }

    /// The pre-image API, after the call: records each file's after-revision.
    pub fn after_call(
        &self,
        policy: &Policy,
        ctx: &TurnCtx,
        function_id: &str,
        args: &Value,
        is_error: bool,
    ) -> Result<usize, ExecError> {
        let mut n = 0;
        for t in touches(function_id, args) {
            let path = Self::absolute(policy, ctx, &t.path);
            let now = current_revision(policy, &path);
            let Ok(now) = now else { continue };
            let rec = if is_error {
                json!({"t": "drop_if_same", "turn_id": ctx.turn, "path": path, "revision": now})
            } else {
                json!({"t": "post", "turn_id": ctx.turn, "path": path, "after_revision": now, "at": now_ms()})
            };
            self.with_store(policy, |s| s.append(&ctx.session, &rec))?
                .map_err(|e| ExecError::Internal(format!("turn store: {e}")))?;
            n += 1;
        }
        Ok(n)
    }

    /// Reads `path` through the jail and keeps its body; `None` for a denied path.
    fn capture(&self, policy: &Policy, path: &str) -> Option<PreImage> {
        match read_capped(policy, path) {
            Ok(None) => Some(PreImage {
                missing: true,
                ..Default::default()
            }),
            Ok(Some((data, complete))) => {
                let rev = revision(&data);
                let binary = std::str::from_utf8(&data).is_err();
                let stored = complete
                    && self
                        .with_store(policy, |s| s.put_blob(&rev, &data))
                        .unwrap_or(false);
                Some(PreImage {
                    revision: complete.then_some(rev),
                    stored,
                    missing: false,
                    binary,
                    truncated: !complete,
                    content: None,
                })
            }
            Err(()) => None,
        }
    }

    fn revert(
        &self,
        policy: &Policy,
        session: &str,
        turn_id: &str,
        paths: Option<&[String]>,
        force: bool,
    ) -> Result<Value, ExecError> {
        let (turns, bodies) = self.with_store(policy, |s| {
            let turns = fold(&s.records(session));
            let bodies: HashMap<String, Vec<u8>> = turns
                .iter()
                .filter(|t| t.turn_id == turn_id)
                .flat_map(|t| t.files.iter())
                .filter_map(|f| {
                    let r = f.before.as_ref()?.revision.clone()?;
                    Some((r.clone(), s.read_blob(&r)?))
                })
                .collect();
            (turns, bodies)
        })?;
        let Some(turn) = turns.iter().find(|t| t.turn_id == turn_id) else {
            return Err(ExecError::Missing(format!(
                "turn {turn_id} is not present in session {session}'s history"
            )));
        };
        let mut files: Vec<&FileRecord> = turn
            .files
            .iter()
            .filter(|f| paths.is_none_or(|p| p.iter().any(|x| x == &f.path)))
            .collect();
        files.sort_by_key(|f| std::cmp::Reverse(f.last_seen));
        let mut results = Vec::new();
        let (mut ok, mut failed) = (0u64, 0u64);
        for f in files {
            let (action, outcome) = revert_one(policy, f, &bodies, force);
            let mut r = json!({"path": f.path, "kind": f.kind, "action": action, "success": outcome.is_ok()});
            match outcome {
                Ok(()) => ok += 1,
                Err(e) => {
                    failed += 1;
                    r["error"] = json!(e);
                }
            }
            results.push(r);
        }
        let metas: Vec<&Meta> = turn
            .metas
            .iter()
            .filter(|m| paths.is_none_or(|p| p.iter().any(|x| x == &m.path)))
            .collect();
        // Structure is applied after the bodies and counted only when it fails.
        for (path, e) in revert_metas(policy, &metas) {
            failed += 1;
            results.push(json!({"path": path, "kind": "structure", "action": "skipped", "success": false, "error": e}));
        }
        Ok(
            json!({"session_id": session, "turn_id": turn_id, "reverted": ok, "failed": failed, "results": results}),
        )
    }

    fn adopt_root(
        &self,
        policy: &Policy,
        session: &str,
        turn_id: &str,
        root: &str,
    ) -> Result<u64, ExecError> {
        let resolved = policy
            .jail
            .resolve_with(root, libc::O_PATH | libc::O_DIRECTORY)?;
        let started = self.with_store(policy, |s| {
            fold(&s.records(session))
                .into_iter()
                .find(|t| t.turn_id == turn_id)
                .map(|t| t.started_at)
        })?;
        let Some(started) = started else {
            return Err(ExecError::Missing(format!(
                "turn {turn_id} is not present in session {session}'s history"
            )));
        };
        const SKIP: &[&str] = &[
            ".git",
            "node_modules",
            "target",
            "dist",
            "build",
            "out",
            "vendor",
            "__pycache__",
        ];
        let walk = ignore::WalkBuilder::new(&resolved.path)
            .standard_filters(false)
            .follow_links(false)
            .filter_entry(|e| !SKIP.iter().any(|s| e.file_name() == *s))
            .build();
        let mut n = 0u64;
        for e in walk.flatten() {
            if n >= 400 {
                break;
            }
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if !m.is_file() || policy.jail.is_denied(e.path()) {
                continue;
            }
            let mtime = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            if mtime + 1000 < started {
                continue;
            }
            let path = e.path().to_string_lossy().into_owned();
            let after = current_revision(policy, &path).ok().flatten();
            let at = now_ms();
            let recs = [
                json!({"t": "pre", "turn_id": turn_id, "path": path, "kind": "created", "cause": "console::working-directory::propose", "root": resolved.path, "before": {"missing": true}, "at": at}),
                json!({"t": "post", "turn_id": turn_id, "path": path, "after_revision": after, "at": at}),
            ];
            for r in recs {
                self.with_store(policy, |s| s.append(session, &r))?
                    .map_err(|e| ExecError::Internal(format!("turn store: {e}")))?;
            }
            n += 1;
        }
        Ok(n)
    }
}

fn req_str(v: &Value, k: &str) -> Result<String, ExecError> {
    v.get(k)
        .and_then(Value::as_str)
        .map(String::from)
        .ok_or_else(|| ExecError::Invalid(format!("{k} (string) is required")))
}

/// Reads a regular file through the jail: `None` when missing, `(bytes, complete)` where
/// `complete` is false past [`MAX_STORED_BODY`]. `Err` for a denied or unreadable path.
fn read_capped(policy: &Policy, path: &str) -> Result<Option<(Vec<u8>, bool)>, ()> {
    match policy
        .jail
        // O_NONBLOCK: a FIFO a command planted at the path (or swapped in after a tree scan)
        // must not block the open; the S_IFREG check below then refuses it.
        .resolve_with(
            path,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
        ) {
        Ok(r) => {
            let st = iii_shell_files::jail::fstat(&r.fd).map_err(|_| ())?;
            if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Err(());
            }
            let mut f = std::fs::File::from(r.fd);
            let mut data = Vec::new();
            (&mut f)
                .take(MAX_STORED_BODY + 1)
                .read_to_end(&mut data)
                .map_err(|_| ())?;
            let complete = data.len() as u64 <= MAX_STORED_BODY;
            Ok(Some((data, complete)))
        }
        Err(ExecError::NotFound(_)) => {
            // Missing and denied read alike; a denied path is never recorded.
            if policy.jail.is_denied(Path::new(path)) {
                Err(())
            } else {
                Ok(None)
            }
        }
        Err(_) => Err(()),
    }
}

/// The revision of `path` now (`None` when missing).
fn current_revision(policy: &Policy, path: &str) -> Result<Option<String>, ()> {
    Ok(read_capped(policy, path)?.map(|(d, _)| revision(&d)))
}

/// Folds a session's records into its turns, oldest first.
pub fn fold(records: &[Value]) -> Vec<TurnRecord> {
    let mut turns: Vec<TurnRecord> = Vec::new();
    let idx = |turns: &mut Vec<TurnRecord>, id: &str, at: u64| -> usize {
        match turns.iter().position(|t| t.turn_id == id) {
            Some(i) => i,
            None => {
                turns.push(TurnRecord {
                    turn_id: id.to_string(),
                    started_at: at,
                    ended_at: None,
                    title: None,
                    files: Vec::new(),
                    metas: Vec::new(),
                });
                turns.len() - 1
            }
        }
    };
    for r in records {
        let Some(id) = r.get("turn_id").and_then(Value::as_str) else {
            continue;
        };
        let at = r.get("at").and_then(Value::as_u64).unwrap_or(0);
        match r.get("t").and_then(Value::as_str) {
            Some("start") => {
                let i = idx(&mut turns, id, r["started_at"].as_u64().unwrap_or(0));
                turns[i].started_at = r["started_at"].as_u64().unwrap_or(0);
                turns[i].title = r["title"].as_str().map(String::from);
            }
            Some("end") => {
                let i = idx(&mut turns, id, 0);
                turns[i].ended_at = r["ended_at"].as_u64();
            }
            Some("pre") => {
                let i = idx(&mut turns, id, at);
                let path = r["path"].as_str().unwrap_or_default().to_string();
                let kind = r["kind"].as_str().unwrap_or("modified");
                let files = &mut turns[i].files;
                match files.iter_mut().find(|f| f.path == path) {
                    Some(f) => {
                        f.last_seen = at;
                        f.pending = Some((
                            kind.to_string(),
                            r["cause"].as_str().unwrap_or_default().to_string(),
                        ));
                    }
                    None => files.push(FileRecord {
                        path,
                        kind: kind.to_string(),
                        cause: r["cause"].as_str().unwrap_or_default().to_string(),
                        first_seen: at,
                        last_seen: at,
                        from: r["from"].as_str().map(String::from),
                        root: r["root"].as_str().map(String::from),
                        agent: serde_json::from_value(r["agent"].clone()).ok(),
                        before: serde_json::from_value(r["before"].clone()).ok(),
                        after: None,
                        after_revision: None,
                        pending: None,
                    }),
                }
            }
            Some("post") => {
                let i = idx(&mut turns, id, at);
                let path = r["path"].as_str().unwrap_or_default();
                if let Some(f) = turns[i].files.iter_mut().find(|f| f.path == path) {
                    f.after_revision = r["after_revision"].as_str().map(String::from);
                    f.last_seen = at.max(f.last_seen);
                    if let Some((kind, cause)) = f.pending.take() {
                        f.kind = compose(&f.kind, &kind).to_string();
                        f.cause = cause;
                    }
                }
            }
            Some("meta") => {
                let i = idx(&mut turns, id, at);
                let path = r["path"].as_str().unwrap_or_default();
                if !turns[i].metas.iter().any(|m| m.path == path) {
                    turns[i].metas.push(Meta {
                        path: path.to_string(),
                        kind: r["kind"].as_str().unwrap_or("file").to_string(),
                        existed: r["existed"].as_bool().unwrap_or(true),
                        mode: r["mode"].as_u64().map(|m| m as u32 & 0o7777),
                        link: r["link"].as_str().map(String::from),
                    });
                }
            }
            Some("discard") => {
                // A one-call turn (`calls::OUTSIDE_TURNS`) whose call changed nothing.
                turns.retain(|t| t.turn_id != id);
            }
            Some("drop_if_same") => {
                // A failed call: forget the path when it did not change (TURNS-05).
                let i = idx(&mut turns, id, at);
                let path = r["path"].as_str().unwrap_or_default();
                let now = r["revision"].as_str();
                turns[i].files.retain(|f| {
                    let before = f.before.as_ref().and_then(|b| b.revision.as_deref());
                    let unchanged = before == now && f.after_revision.is_none();
                    !(f.path == path && unchanged)
                });
                if let Some(f) = turns[i].files.iter_mut().find(|f| f.path == path) {
                    f.pending = None;
                }
            }
            _ => {}
        }
    }
    turns
}

/// `get`'s view of turn `i`: bodies filled in from the blob store within the budgets, and
/// `after` from a later turn that kept this turn's after-body as its own pre-image.
fn inflate(s: &Store, turns: &[TurnRecord], i: usize) -> TurnRecord {
    let mut t = turns[i].clone();
    let mut budget = MAX_RESPONSE_BODIES;
    let mut fill = |p: &mut PreImage| {
        p.stored = p.revision.as_deref().is_some_and(|r| s.has_blob(r));
        if !p.stored || p.binary {
            return;
        }
        let Some(data) = p.revision.as_deref().and_then(|r| s.read_blob(r)) else {
            p.stored = false;
            return;
        };
        if data.len() > MAX_PRE_IMAGE_BYTES || data.len() > budget {
            p.truncated = true;
            return;
        }
        budget -= data.len();
        p.content = String::from_utf8(data).ok();
    };
    for f in &mut t.files {
        if let Some(b) = f.before.as_mut() {
            fill(b);
        }
        let later = turns[i + 1..]
            .iter()
            .flat_map(|lt| lt.files.iter())
            .find(|lf| lf.path == f.path)
            .and_then(|lf| lf.before.clone())
            .filter(|b| b.revision.is_some() && b.revision == f.after_revision);
        if let Some(mut a) = later {
            fill(&mut a);
            f.after = Some(a);
        }
    }
    t
}

/// Undoes one file (TURNS-15, TURNS-17). Refuses a file changed since the turn (its current
/// revision is not the turn's `after_revision`) unless `force`.
fn revert_one(
    policy: &Policy,
    f: &FileRecord,
    bodies: &HashMap<String, Vec<u8>>,
    force: bool,
) -> (&'static str, Result<(), String>) {
    let before = f.before.clone().unwrap_or_default();
    let now = match current_revision(policy, &f.path) {
        Ok(r) => r,
        Err(()) => {
            return (
                "skipped",
                Err(format!("{}: not readable under the current policy", f.path)),
            )
        }
    };
    let changed_since = now != f.after_revision;
    let guard = |action: &'static str| -> Option<(&'static str, Result<(), String>)> {
        (changed_since && !force).then(|| {
            (action, Err(format!(
                "{} changed since this turn (current revision {} is not the turn's after_revision {}); pass force: true to revert it anyway",
                f.path,
                now.as_deref().unwrap_or("none (missing)"),
                f.after_revision.as_deref().unwrap_or("none (missing)")
            )))
        })
    };
    let body = |p: &PreImage| -> Result<&Vec<u8>, String> {
        p.revision
            .as_ref()
            .and_then(|r| bodies.get(r))
            .ok_or_else(|| format!("{}: the body before this turn was not kept (stored: false: too large, evicted or unreadable); not reverting it rather than guessing", f.path))
    };
    if let Some(from) = &f.from {
        if let Some(g) = guard("moved-back") {
            return g;
        }
        let r = iii_shell_files::fs::ops::mv(policy, &f.path, from, false)
            .map(|_| ())
            .map_err(|e| e.to_string());
        if r.is_ok() && !before.missing && before.revision.is_some() {
            if let Ok(b) = body(&before) {
                let _ = write_back(policy, &f.path, b);
            }
        }
        return ("moved-back", r);
    }
    if before.missing {
        if f.kind == "deleted" {
            return ("skipped", Ok(()));
        }
        if let Some(g) = guard("removed") {
            return g;
        }
        if now.is_none() {
            return ("removed", Ok(()));
        }
        let r = iii_shell_files::fs::ops::rm(policy, &f.path, false)
            .map(|_| ())
            .map_err(|e| e.to_string());
        return ("removed", r);
    }
    if let Some(g) = guard("restored") {
        return g;
    }
    match body(&before) {
        Ok(b) => ("restored", write_back(policy, &f.path, b)),
        Err(e) => ("restored", Err(e)),
    }
}

fn exists(policy: &Policy, path: &str) -> bool {
    tree::stat_one(policy, path).is_some()
}

/// Applies a turn's structure records after its bodies were reverted: directories that
/// existed come back (outermost first), links come back, modes are restored (innermost
/// first), and directories the turn created are removed when empty (innermost first).
/// Returns the failures, path and reason.
fn revert_metas(policy: &Policy, metas: &[&Meta]) -> Vec<(String, String)> {
    let mut failed = Vec::new();
    let mut by_depth: Vec<&Meta> = metas.to_vec();
    by_depth.sort_by_key(|m| m.path.matches('/').count());
    for m in by_depth.iter().filter(|m| m.existed && m.kind == "dir") {
        if !exists(policy, &m.path) {
            if let Err(e) = iii_shell_files::fs::ops::mkdir(policy, &m.path, 0o700, true) {
                failed.push((m.path.clone(), e.to_string()));
            }
        }
    }
    for m in by_depth.iter().filter(|m| m.existed && m.kind == "link") {
        let Some(target) = &m.link else { continue };
        if exists(policy, &m.path) {
            continue;
        }
        if let Err(e) = symlink(policy, &m.path, target) {
            failed.push((m.path.clone(), e));
        }
    }
    for m in by_depth
        .iter()
        .rev()
        .filter(|m| m.existed && m.kind != "link")
    {
        let Some(mode) = m.mode else { continue };
        let now = tree::stat_one(policy, &m.path);
        if now
            .as_ref()
            .is_none_or(|e| e.mode == mode || e.kind == "link")
        {
            continue;
        }
        if let Err(e) = iii_shell_files::fs::ops::chmod(policy, &m.path, mode, None, None, false) {
            failed.push((m.path.clone(), e.to_string()));
        }
    }
    for m in by_depth
        .iter()
        .rev()
        .filter(|m| !m.existed && m.kind == "dir")
    {
        if tree::stat_one(policy, &m.path).is_some_and(|e| e.kind == "dir") {
            // Not empty: something the turn did not make is inside; leave it.
            let _ = iii_shell_files::fs::ops::rm(policy, &m.path, false);
        }
    }
    failed
}

fn symlink(policy: &Policy, path: &str, target: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let parent = policy.jail.parent(path, true).map_err(|e| e.to_string())?;
    let t = std::ffi::CString::new(target).map_err(|e| e.to_string())?;
    let name = parent.c_name();
    // SAFETY: symlinkat with two NUL-terminated strings and a directory fd we own.
    let rc = unsafe { libc::symlinkat(t.as_ptr(), parent.dir.as_raw_fd(), name.as_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(())
}

fn write_back(policy: &Policy, path: &str, body: &[u8]) -> Result<(), String> {
    let parent = policy.jail.parent(path, true).map_err(|e| e.to_string())?;
    // A file still there keeps its owner, group, mode and ACL; a missing one comes back 0644.
    let keep = iii_shell_files::fs::keep::Replaced::of_entry(&parent)
        .map_err(|e| e.to_string())?
        .map(|old| old.keep(policy.config.fs.allow_special_bits));
    let mode = keep.as_ref().map_or(0o644, |k| k.mode);
    iii_shell_files::fs::atomic::write_atomic(&parent, body, mode, keep)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn policy(root: &Path, data: &Path, max_blob: u64) -> Arc<Policy> {
        let v = json!({"fs": {"host_roots": [root.to_string_lossy()]},
            "turns": {"data_dir": data.to_string_lossy(), "max_blob_bytes": max_blob}});
        Arc::new(Policy::build(1, &v.to_string()).expect("policy"))
    }

    fn tree(root: &Path) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        for e in ignore::WalkBuilder::new(root)
            .standard_filters(false)
            .build()
            .flatten()
        {
            if e.path().is_file() {
                let rel = e
                    .path()
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                m.insert(rel, revision(&std::fs::read(e.path()).unwrap()));
            }
        }
        m
    }

    fn call(t: &Turns, p: &Policy, f: &str, v: Value) -> Value {
        t.call(p, f, &v.to_string()).unwrap()
    }

    /// Plays the harness: pre-trigger, the call itself (done by `act`), post-trigger.
    fn hooked(t: &Turns, p: &Policy, function_id: &str, args: Value, act: impl FnOnce()) {
        let h = json!({"session_id": "s1", "turn_id": "t1", "call": {"function_id": function_id, "arguments": args}});
        assert_eq!(
            call(t, p, "shell::turns::on-pre-trigger", h.clone()),
            json!({"decision": "continue"})
        );
        act();
        let mut post = h;
        post["result"] = json!({"is_error": false});
        assert_eq!(
            call(t, p, "shell::turns::on-post-trigger", post),
            json!({"decision": "continue"})
        );
    }

    /// A command can plant a FIFO where the next fs call writes: keeping its pre-image must
    /// neither block on the open (no writer ever comes) nor record it.
    #[test]
    fn a_fifo_at_a_changed_path_neither_blocks_nor_is_recorded() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let (root, data) = (base.join("root"), base.join("data"));
        std::fs::create_dir_all(&root).unwrap();
        let fifo = std::ffi::CString::new(root.join("pipe").to_string_lossy().as_bytes()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let p = policy(&root, &data, 1 << 20);
        let (tx, rx) = std::sync::mpsc::channel();
        let r = root.clone();
        std::thread::spawn(move || {
            let t = Turns::default();
            call(
                &t,
                &p,
                "shell::turns::on-turn-started",
                json!({"session_id": "s1", "turn_id": "t1"}),
            );
            hooked(&t, &p, "shell::fs::write", json!({"path": "pipe"}), || {
                std::fs::remove_file(r.join("pipe")).unwrap();
                std::fs::write(r.join("pipe"), "now a file").unwrap();
            });
            let got = call(
                &t,
                &p,
                "shell::turns::get",
                json!({"session_id": "s1", "turn_id": "t1"}),
            );
            let _ = tx.send(got);
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("keeping the pre-image of a FIFO blocked the call");
        assert!(
            got["turn"]["files"]
                .as_array()
                .is_none_or(|f| f.iter().all(|f| f["before"]["exists"] != true)),
            "{got}"
        );
    }

    #[test]
    fn create_modify_delete_move_then_revert_leaves_the_tree_byte_identical() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let (root, data) = (base.join("root"), base.join("data"));
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/keep.rs"), "fn keep() {}\n").unwrap();
        std::fs::write(root.join("src/gone.rs"), "fn gone() {}\n").unwrap();
        std::fs::write(root.join("old.txt"), "old name\n").unwrap();
        std::fs::write(root.join("bin.dat"), [0u8, 159, 146, 150, 255]).unwrap();
        let before = tree(&root);
        let p = policy(&root, &data, 1 << 20);
        let t = Turns::default();
        call(
            &t,
            &p,
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": "t1", "message_preview": "  refactor the parser please  "}),
        );
        let r = root.clone();
        hooked(
            &t,
            &p,
            "coder::create-file",
            json!({"files": [{"path": "src/new.rs", "content": "x"}]}),
            || std::fs::write(r.join("src/new.rs"), "new\n").unwrap(),
        );
        hooked(
            &t,
            &p,
            "shell::fs::write",
            json!({"path": "src/keep.rs", "content": "y"}),
            || std::fs::write(r.join("src/keep.rs"), "changed\n").unwrap(),
        );
        hooked(
            &t,
            &p,
            "shell::fs::write",
            json!({"path": "bin.dat", "content": "y"}),
            || std::fs::write(r.join("bin.dat"), "text now").unwrap(),
        );
        hooked(
            &t,
            &p,
            "shell::fs::rm",
            json!({"path": "src/gone.rs"}),
            || std::fs::remove_file(r.join("src/gone.rs")).unwrap(),
        );
        hooked(
            &t,
            &p,
            "shell::fs::mv",
            json!({"src": "old.txt", "dst": "new-name.txt"}),
            || std::fs::rename(r.join("old.txt"), r.join("new-name.txt")).unwrap(),
        );
        call(
            &t,
            &p,
            "shell::turns::on-turn-completed",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        assert_ne!(tree(&root), before);

        let list = call(&t, &p, "shell::turns::list", json!({"session_id": "s1"}));
        assert_eq!(list["turns"][0]["turn_id"], "t1");
        assert_eq!(list["turns"][0]["title"], "refactor the parser please");
        assert_eq!(list["turns"][0]["file_count"], 5);
        let got = call(&t, &p, "shell::turns::get", json!({"session_id": "s1"}));
        let files = got["turn"]["files"].as_array().unwrap();
        let keep = files
            .iter()
            .find(|f| f["path"].as_str().unwrap().ends_with("keep.rs"))
            .unwrap();
        assert_eq!(keep["before"]["content"], "fn keep() {}\n");
        assert_eq!(keep["before"]["stored"], true);

        let rv = call(
            &t,
            &p,
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        assert_eq!(rv["failed"], 0, "{rv}");
        assert_eq!(rv["reverted"], 5, "{rv}");
        assert_eq!(tree(&root), before, "{rv}");
    }

    #[test]
    fn structure_folds_first_record_wins_and_stays_off_the_wire() {
        let recs = [
            json!({"t": "start", "turn_id": "t", "started_at": 1}),
            json!({"t": "meta", "turn_id": "t", "path": "/d", "kind": "dir", "existed": false, "mode": 0, "at": 2}),
            json!({"t": "meta", "turn_id": "t", "path": "/d", "kind": "dir", "existed": true, "mode": 493, "at": 3}),
            json!({"t": "meta", "turn_id": "t", "path": "/l", "kind": "link", "existed": true, "mode": 511, "link": "x", "at": 4}),
        ];
        let t = fold(&recs);
        assert_eq!(
            t[0].metas,
            [
                Meta {
                    path: "/d".into(),
                    kind: "dir".into(),
                    existed: false,
                    mode: Some(0),
                    link: None
                },
                Meta {
                    path: "/l".into(),
                    kind: "link".into(),
                    existed: true,
                    mode: Some(0o777),
                    link: Some("x".into())
                },
            ]
        );
        assert!(t[0].files.is_empty());
        assert!(serde_json::to_value(&t[0]).unwrap().get("metas").is_none());
    }

    #[test]
    fn a_failed_call_leaves_the_kind_and_cause_of_an_earlier_change() {
        let r = |v: Value| v;
        let recs = [
            r(json!({"t": "start", "turn_id": "t", "started_at": 1})),
            r(
                json!({"t": "pre", "turn_id": "t", "path": "/a", "kind": "modified", "cause": "coder::update-file", "before": {"revision": "sha256:1"}, "at": 2}),
            ),
            r(
                json!({"t": "post", "turn_id": "t", "path": "/a", "after_revision": "sha256:2", "at": 3}),
            ),
            // A create refused because /a exists: its pre, then nothing changed.
            r(
                json!({"t": "pre", "turn_id": "t", "path": "/a", "kind": "created", "cause": "coder::create-file", "before": {"revision": "sha256:2"}, "at": 4}),
            ),
            r(json!({"t": "drop_if_same", "turn_id": "t", "path": "/a", "revision": "sha256:2"})),
            // A later delete that completed composes.
            r(
                json!({"t": "pre", "turn_id": "t", "path": "/b", "kind": "created", "cause": "coder::create-file", "before": {"missing": true}, "at": 5}),
            ),
            r(
                json!({"t": "post", "turn_id": "t", "path": "/b", "after_revision": "sha256:3", "at": 6}),
            ),
            r(
                json!({"t": "pre", "turn_id": "t", "path": "/b", "kind": "deleted", "cause": "shell::fs::rm", "before": {"revision": "sha256:3"}, "at": 7}),
            ),
            r(json!({"t": "post", "turn_id": "t", "path": "/b", "after_revision": null, "at": 8})),
        ];
        let t = fold(&recs);
        let f: Vec<(&str, &str, &str)> = t[0]
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.kind.as_str(), f.cause.as_str()))
            .collect();
        assert_eq!(
            f,
            [
                ("/a", "modified", "coder::update-file"),
                ("/b", "deleted", "shell::fs::rm")
            ]
        );
        assert_eq!(
            t[0].files[0].before.as_ref().unwrap().revision.as_deref(),
            Some("sha256:1")
        );
    }

    /// TURNS-09: `get` fills in at most 64 KiB of one body and 1 MiB across the response;
    /// past either, `truncated: true` and no content (the body is still kept and reverts).
    #[test]
    fn get_caps_bodies_per_file_and_per_response() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let (root, data) = (base.join("root"), base.join("data"));
        std::fs::create_dir_all(&root).unwrap();
        let big = "b".repeat(MAX_PRE_IMAGE_BYTES + 1);
        std::fs::write(root.join("big"), &big).unwrap();
        for i in 0..20 {
            std::fs::write(
                root.join(format!("m{i:02}")),
                format!("{i:02}").repeat(30 * 1024),
            )
            .unwrap();
        }
        let p = policy(&root, &data, 1 << 30);
        let t = Turns::default();
        call(
            &t,
            &p,
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        let mut paths = vec!["big".to_string()];
        paths.extend((0..20).map(|i| format!("m{i:02}")));
        for f in &paths {
            let r = root.join(f);
            hooked(&t, &p, "shell::fs::write", json!({"path": f}), || {
                std::fs::write(&r, "new").unwrap()
            });
        }
        let got = call(
            &t,
            &p,
            "shell::turns::get",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        let files = got["turn"]["files"].as_array().unwrap();
        let b = &files[0]["before"];
        assert_eq!(
            (b["stored"].clone(), b["truncated"].clone()),
            (json!(true), json!(true)),
            "{b}"
        );
        assert!(b.get("content").is_none_or(Value::is_null), "{b}");
        // 60 KiB bodies: 17 fit in the 1 MiB budget, the rest are truncated.
        let filled = files[1..]
            .iter()
            .filter(|f| f["before"]["content"].is_string())
            .count();
        assert_eq!(filled, (MAX_RESPONSE_BODIES / (60 * 1024)), "{filled}");
        assert!(files[1..]
            .iter()
            .filter(|f| !f["before"]["content"].is_string())
            .all(|f| f["before"]["truncated"] == true));
        let rv = call(
            &t,
            &p,
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        assert_eq!(rv["reverted"], 21, "{rv}");
        assert_eq!(std::fs::read_to_string(root.join("big")).unwrap(), big);
    }

    /// TURNS-13: `after` is filled in only when a later turn kept this turn's after-body as
    /// its own pre-image; TURNS-18: `adopt-root` records the files created since the turn
    /// started under a new root as `created`, skipping build directories.
    #[test]
    fn after_comes_from_a_later_turns_pre_image_and_adopt_root_records_new_files() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let (root, data) = (base.join("root"), base.join("data"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("a"), "one\n").unwrap();
        let p = policy(&root, &data, 1 << 20);
        let t = Turns::default();
        call(
            &t,
            &p,
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        let r = root.clone();
        hooked(&t, &p, "shell::fs::write", json!({"path": "a"}), || {
            std::fs::write(r.join("a"), "two\n").unwrap()
        });
        let got = call(
            &t,
            &p,
            "shell::turns::get",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        assert!(got["turn"]["files"][0].get("after").is_none(), "{got}");
        let h = json!({"session_id": "s1", "turn_id": "t2", "call": {"function_id": "shell::fs::write", "arguments": {"path": "a"}}});
        call(
            &t,
            &p,
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": "t2"}),
        );
        call(&t, &p, "shell::turns::on-pre-trigger", h);
        let got = call(
            &t,
            &p,
            "shell::turns::get",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        let f = &got["turn"]["files"][0];
        assert_eq!(f["before"]["content"], "one\n", "{f}");
        assert_eq!(f["after"]["content"], "two\n", "{f}");

        let proj = root.join("proj");
        std::fs::create_dir_all(proj.join("src")).unwrap();
        std::fs::create_dir_all(proj.join("node_modules/x")).unwrap();
        std::fs::write(proj.join("src/main.rs"), "fn main() {}\n").unwrap();
        std::fs::write(proj.join("node_modules/x/i.js"), "x").unwrap();
        let n = call(
            &t,
            &p,
            "shell::turns::adopt-root",
            json!({"session_id": "s1", "turn_id": "t2", "root": proj.to_string_lossy()}),
        );
        assert_eq!(n, json!({"recorded": 1}));
        let list = call(&t, &p, "shell::turns::list", json!({"session_id": "s1"}));
        let files = list["turns"][0]["files"].as_array().unwrap();
        let adopted = files
            .iter()
            .find(|f| f["path"].as_str().unwrap().ends_with("src/main.rs"))
            .unwrap();
        assert_eq!(adopted["kind"], "created", "{list}");
        assert_eq!(adopted["root"], proj.to_string_lossy().as_ref(), "{list}");
    }

    #[test]
    fn a_file_changed_since_the_turn_is_refused_unless_forced() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let (root, data) = (base.join("root"), base.join("data"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("a"), "one").unwrap();
        let p = policy(&root, &data, 1 << 20);
        let t = Turns::default();
        call(
            &t,
            &p,
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        let r = root.clone();
        hooked(&t, &p, "shell::fs::write", json!({"path": "a"}), || {
            std::fs::write(r.join("a"), "two").unwrap()
        });
        std::fs::write(root.join("a"), "three (someone else)").unwrap();
        let rv = call(
            &t,
            &p,
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        assert_eq!(rv["failed"], 1);
        assert!(
            rv["results"][0]["error"]
                .as_str()
                .unwrap()
                .contains("force: true"),
            "{rv}"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("a")).unwrap(),
            "three (someone else)"
        );
        let rv = call(
            &t,
            &p,
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1", "force": true}),
        );
        assert_eq!(rv["reverted"], 1, "{rv}");
        assert_eq!(std::fs::read_to_string(root.join("a")).unwrap(), "one");
    }

    #[test]
    fn an_evicted_body_fails_its_revert_cleanly_and_a_store_reopened_after_a_crash_lists() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let (root, data) = (base.join("root"), base.join("data"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("a"), vec![b'a'; 600]).unwrap();
        std::fs::write(root.join("b"), vec![b'b'; 600]).unwrap();
        let p = policy(&root, &data, 1000);
        let t = Turns::default();
        call(
            &t,
            &p,
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        let r = root.clone();
        hooked(&t, &p, "shell::fs::write", json!({"path": "a"}), || {
            std::fs::write(r.join("a"), "A").unwrap()
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        call(
            &t,
            &p,
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": "t2"}),
        );
        let h = json!({"session_id": "s1", "turn_id": "t2", "call": {"function_id": "shell::fs::write", "arguments": {"path": "b"}}});
        call(&t, &p, "shell::turns::on-pre-trigger", h);
        std::fs::write(root.join("b"), "B").unwrap();
        // The executor dies here: no post-trigger, a torn record at the end of the log.
        let log = data.join("sessions/s1.jsonl");
        let mut f = std::fs::File::options().append(true).open(&log).unwrap();
        std::io::Write::write_all(&mut f, b"{\"t\":\"po").unwrap();
        let fresh = Turns::default();
        let list = call(
            &fresh,
            &p,
            "shell::turns::list",
            json!({"session_id": "s1"}),
        );
        assert_eq!(list["turns"].as_array().unwrap().len(), 2, "{list}");
        // t1's body was evicted to make room for t2's (oldest first).
        let rv = call(
            &fresh,
            &p,
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        assert_eq!(rv["failed"], 1, "{rv}");
        assert!(
            rv["results"][0]["error"]
                .as_str()
                .unwrap()
                .contains("not kept"),
            "{rv}"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("a")).unwrap(),
            "A",
            "nothing guessed"
        );
        let got = call(
            &fresh,
            &p,
            "shell::turns::get",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        assert_eq!(got["turn"]["files"][0]["before"]["stored"], false);
        // t2, recorded before the crash, reverts (forced: it has no after-revision).
        let rv = call(
            &fresh,
            &p,
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t2", "force": true}),
        );
        assert_eq!(rv["reverted"], 1, "{rv}");
        assert_eq!(std::fs::read(root.join("b")).unwrap(), vec![b'b'; 600]);
    }

    /// `shell::turns::sessions` is checked again here, whatever the broker let through, and a
    /// session whose log stem is a hash lists under its own id, which opens its turns.
    #[test]
    fn sessions_are_checked_again_and_list_under_their_own_ids() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let p = policy(&root, &d.path().join("turns"), 1 << 20);
        let t = Turns::default();
        for bad in [
            json!({"limit": 0}),
            json!({"limit": 201}),
            json!({"limit": -1}),
            json!({"limit": "5"}),
            json!({"cursor": "x"}),
            json!({"cursor": "1:../../etc"}),
            json!("not an object"),
            json!([1]),
            json!(null),
        ] {
            let r = t.call(&p, "shell::turns::sessions", &bad.to_string());
            assert!(matches!(r, Err(ExecError::Invalid(_))), "{bad}: {r:?}");
        }
        let id = "chat 7/with slashes";
        assert!(store::session_stem(id).starts_with("h-"));
        call(
            &t,
            &p,
            "shell::turns::on-turn-started",
            json!({"session_id": id, "turn_id": "t1", "message_preview": "  hello there "}),
        );
        let got = call(&t, &p, "shell::turns::sessions", json!({}));
        assert_eq!(got["sessions"].as_array().unwrap().len(), 1, "{got}");
        assert_eq!(got["sessions"][0]["session_id"], id);
        assert_eq!(got["sessions"][0]["turn_count"], 1);
        assert_eq!(got["sessions"][0]["last_title"], "hello there");
        assert!(got.get("next_cursor").is_none(), "{got}");
        let list = call(&t, &p, "shell::turns::list", json!({"session_id": id}));
        assert_eq!(list["turns"][0]["turn_id"], "t1", "{list}");
        assert_eq!(
            list["turns"][0]["started_at"],
            got["sessions"][0]["first_started_at"]
        );
    }
}
