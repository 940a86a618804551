//! Pre-images of the executor's own mutations: every `shell::fs::*` and `coder::*` request
//! that changes files records into the open turn, whether or not a harness hook fired for it.
//!
//! A request does not say which session it belongs to, so it records under the **open turn**
//! ([`pick_open`]): a top-level turn that `on-turn-started` opened and `on-turn-completed` has
//! not closed. With several open (two chats at once), the one whose `fs_scope.root` (learned
//! from its hooks) holds the first path the request changes wins, else the one whose hooks
//! were seen last. With none open, a `shell::fs::*` request records nothing (it costs one mutex
//! check), and a `coder::*` mutation records a **one-call turn** of the session
//! [`OUTSIDE_TURNS`] ([`Turns::begin_coder`]): a `start` titled with the function id, the call's
//! records, an `end` — or a `discard` when it changed nothing, so no empty turn is listed. That
//! keeps every coder change in the one history `coder::change-diff` reads (`super::changes`),
//! as the original kept a `change-diff` snapshot of every coder mutation, session or not.
//!
//! The request is mapped to the call the harness would have hooked ([`request_call`]: the
//! function id and the arguments [`super::model::touches`] reads, every path made absolute the
//! way the executor resolves it), so the hook path and this one record the same files. Where
//! both run for one call, the first pre-image wins (TURNS-20) and the records agree.
//!
//! After the request, a file whose revision is still its pre-image's (a failed batch, an entry
//! refused inside a coder batch) is dropped again unless the turn changed it before; the others
//! get their after-revision, and each coder change to one of them its `change` record.

use std::collections::HashMap;
use std::path::Path;

use iii_shell_protocol::coder::{CoderCall, CoderOp};
use iii_shell_protocol::fs::FsOp;
use serde_json::{json, Value};

use super::changes::{change_record, Change};
use super::state::{OpenTurn, TurnCtx, Turns};
use crate::policy::Policy;
use iii_shell_policy::sync::lock;
use iii_shell_protocol::clock::now_ms;

/// Open turns remembered at most (the least recently seen is forgotten first).
pub const MAX_OPEN: usize = 1024;

/// The session a `coder::*` mutation made while no turn is open records under, as a turn of
/// its own (`call-<uuid>`). An ordinary session id for `shell::turns::list/get/revert`.
pub const OUTSIDE_TURNS: &str = "shell.outside-turns";

fn within(path: &str, root: &str) -> bool {
    let root = root.trim_end_matches('/');
    path == root
        || (path.starts_with(root) && path.as_bytes().get(root.len()) == Some(&b'/'))
        || root.is_empty()
}

/// The open turn a change to `path` records under (a pure function; exact-value tests).
pub fn pick_open<'a>(open: &'a [OpenTurn], path: Option<&str>) -> Option<&'a OpenTurn> {
    let by_root = path.and_then(|p| {
        open.iter()
            .filter(|o| o.root.as_deref().is_some_and(|r| within(p, r)))
            .max_by_key(|o| o.seen)
    });
    by_root.or_else(|| open.iter().max_by_key(|o| o.seen))
}

fn anchored(base: Option<&Path>, p: &str) -> String {
    match base {
        Some(b) if !p.starts_with('/') => iii_shell_files::jail::normalize(&b.join(p))
            .to_string_lossy()
            .into_owned(),
        _ => p.to_string(),
    }
}

/// The hooked call an fs request is (`None` for one that changes nothing: reads). `mkdir` and
/// `chmod` change no body; they record only structure (`tree`). Relative paths anchor on the primary root, as the jail resolves them.
pub fn fs_call(policy: &Policy, op: &FsOp) -> Option<(&'static str, Value)> {
    let roots = policy.jail.roots();
    let base = roots.first().map(|r| r.path.as_path());
    let a = |p: &str| anchored(base, p);
    Some(match op {
        FsOp::Write { files } => (
            "shell::fs::write",
            json!({"files": files.iter().map(|f| json!({"path": a(&f.path)})).collect::<Vec<_>>()}),
        ),
        FsOp::WriteStream { path, .. } => ("shell::fs::write", json!({"path": a(path)})),
        FsOp::Rm { path, recursive } => (
            "shell::fs::rm",
            json!({"path": a(path), "recursive": recursive}),
        ),
        FsOp::Mkdir { path, parents, .. } => (
            "shell::fs::mkdir",
            json!({"path": a(path), "parents": parents}),
        ),
        FsOp::Chmod {
            path, recursive, ..
        } => (
            "shell::fs::chmod",
            json!({"path": a(path), "recursive": recursive}),
        ),
        FsOp::Mv { src, dst, .. } => ("shell::fs::mv", json!({"src": a(src), "dst": a(dst)})),
        FsOp::Sed(s) => (
            "shell::fs::sed",
            json!({"files": s.files.iter().map(|p| a(p)).collect::<Vec<_>>(),
                   "path": s.path.as_deref().map(a)}),
        ),
        _ => return None,
    })
}

/// The hooked call a coder request is (`None` for the read side and `change-diff`). Relative
/// paths anchor where `coder::*` anchors them (the session root, else the primary root).
pub fn coder_call(policy: &Policy, call: &CoderCall) -> Option<(&'static str, Value)> {
    let mutating = matches!(
        call.op,
        CoderOp::Create(_) | CoderOp::Update(_) | CoderOp::Delete(_) | CoderOp::Move(_)
    );
    if !mutating {
        return None;
    }
    // A scope the call itself will refuse (C220) changes nothing.
    let ctx = iii_shell_files::coder::Ctx::new(policy, &call.scope).ok()?;
    let a = |p: &str| ctx.absolute(p).unwrap_or_else(|_| p.to_string());
    Some(match &call.op {
        CoderOp::Create(r) => (
            "coder::create-file",
            json!({"files": r.files.iter().map(|f| json!({"path": a(&f.path)})).collect::<Vec<_>>()}),
        ),
        CoderOp::Update(specs) => (
            "coder::update-file",
            json!({"files": specs.iter().map(|f| json!({"path": a(&f.path)})).collect::<Vec<_>>()}),
        ),
        CoderOp::Delete(r) => (
            "coder::delete-file",
            json!({"paths": r.paths.iter().map(|p| a(p)).collect::<Vec<_>>(), "recursive": r.recursive}),
        ),
        CoderOp::Move(r) => (
            "coder::move",
            json!({"files": r.files.iter().map(|f| json!({"from": a(&f.from), "to": a(&f.to)})).collect::<Vec<_>>()}),
        ),
        _ => return None,
    })
}

/// A request being recorded into an open turn: what [`Turns::finish`] needs afterwards.
pub struct Recording {
    ctx: TurnCtx,
    function: &'static str,
    args: Value,
    /// Path → its pre-image revision (`None`: missing), as captured before the request.
    before: Vec<(String, Option<String>)>,
    /// A one-call turn of [`OUTSIDE_TURNS`], started at this time: `finish` starts and ends it
    /// (or discards it).
    one_call: Option<u64>,
}

impl Turns {
    /// The open turn a call changing `path` records under.
    pub fn open_ctx(&self, path: Option<&str>) -> Option<TurnCtx> {
        let open = lock(&self.open);
        pick_open(&open, path).map(|o| TurnCtx {
            session: o.session.clone(),
            turn: o.turn.clone(),
            root: o.root.clone(),
            agent: None,
        })
    }

    /// Whether any turn is open (cheap: callers skip the rest when none is).
    pub fn any_open(&self) -> bool {
        !lock(&self.open).is_empty()
    }

    pub(super) fn mark_open(&self, session: &str, turn: &str) {
        let mut open = lock(&self.open);
        let seen = self.next_seen();
        open.retain(|o| o.session != session);
        // Turns whose completion never came must not grow this without bound.
        if open.len() >= MAX_OPEN {
            if let Some(i) = open
                .iter()
                .enumerate()
                .min_by_key(|(_, o)| o.seen)
                .map(|(i, _)| i)
            {
                open.swap_remove(i);
            }
        }
        open.push(OpenTurn {
            session: session.to_string(),
            turn: turn.to_string(),
            root: None,
            seen,
        });
    }

    pub(super) fn mark_closed(&self, session: &str, turn: &str) {
        lock(&self.open).retain(|o| !(o.session == session && o.turn == turn));
    }

    /// A hook of `session`'s open turn `turn` was seen, with its scope root.
    pub(super) fn mark_seen(&self, session: &str, turn: &str, root: Option<&str>) {
        let seen = self.next_seen();
        let mut open = lock(&self.open);
        if let Some(o) = open
            .iter_mut()
            .find(|o| o.session == session && o.turn == turn)
        {
            o.seen = seen;
            if let Some(r) = root {
                o.root = Some(r.to_string());
            }
        }
    }

    fn next_seen(&self) -> u64 {
        self.seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Before the request `function`/`args` runs: keeps the pre-image of every file it is
    /// about to change in the open turn. `None` when no turn is open or nothing is changed.
    /// A store failure is logged and the request goes ahead unrecorded.
    pub fn begin(&self, policy: &Policy, function: &'static str, args: Value) -> Option<Recording> {
        let touches = super::model::touches(function, &args);
        let first = touches
            .first()
            .map(|t| t.path.clone())
            .or_else(|| args.get("path").and_then(Value::as_str).map(String::from))?;
        let ctx = self.open_ctx(Some(&first))?;
        match self.before_inner(policy, &ctx, function, &args) {
            Ok(before) if !before.is_empty() => Some(Recording {
                ctx,
                function,
                args,
                before,
                one_call: None,
            }),
            Ok(_) => None,
            Err(e) => {
                tracing::error!(error = %e, function, session = %ctx.session, turn = %ctx.turn,
                    "cannot keep the pre-images of a call in the open turn; its changes are not in the turn history: make turns.data_dir writable and with space");
                None
            }
        }
    }

    /// [`Self::begin`] for a `coder::*` mutation: into the open turn, else into a new
    /// one-call turn of [`OUTSIDE_TURNS`].
    pub fn begin_coder(
        &self,
        policy: &Policy,
        function: &'static str,
        args: Value,
    ) -> Option<Recording> {
        if self.any_open() {
            return self.begin(policy, function, args);
        }
        let ctx = TurnCtx {
            session: OUTSIDE_TURNS.to_string(),
            turn: format!("call-{}", uuid::Uuid::new_v4().simple()),
            root: None,
            agent: None,
        };
        let append = |r: &Value| {
            self.with_store(policy, |s| s.append(&ctx.session, r))
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
        };
        let started = now_ms();
        match self.before_inner(policy, &ctx, function, &args) {
            Ok(before) if !before.is_empty() => Some(Recording {
                ctx,
                function,
                args,
                before,
                one_call: Some(started),
            }),
            Ok(_) => {
                // Structure records may have gone in before it turned out nothing is kept.
                let _ = append(&json!({"t": "discard", "turn_id": ctx.turn}));
                None
            }
            Err(e) => {
                let _ = append(&json!({"t": "discard", "turn_id": ctx.turn}));
                tracing::error!(error = %e, function, session = OUTSIDE_TURNS,
                    "cannot keep the pre-images of a coder call made outside a turn; its changes are not in the turn history and coder::change-diff will not find them: make turns.data_dir writable and with space");
                None
            }
        }
    }

    /// After the request: each file's after-revision, or its record dropped again when the
    /// request left it as it was; the `change` record of each of `changes` (a coder call's,
    /// `coder::changes`) made to a file given an after-revision, with its id in the index.
    /// One append for the session's records.
    pub fn finish(&self, policy: &Policy, rec: Recording, changes: &[Change]) {
        let touches = super::model::touches(rec.function, &rec.args);
        let mut records = Vec::new();
        // Canonical path (as the coder reports it) → the turn's path, for files given a post.
        let mut posted: HashMap<String, &str> = HashMap::new();
        // Each path the call named → a move's source (one pass: a batch of many files).
        let mut froms: HashMap<String, Option<String>> = HashMap::new();
        for t in &touches {
            froms
                .entry(Self::absolute(policy, &rec.ctx, &t.path))
                .or_insert_with(|| t.from.clone());
        }
        // Every recorded path: the call's own and those inside a tree it reached into.
        for (path, before) in &rec.before {
            let from = froms.get(path).cloned().flatten();
            let Ok(now) = super::pre_images::current_revision(policy, path) else {
                continue;
            };
            // A move left nothing to undo only when its source is still there.
            let source_kept = from.as_deref().is_none_or(|f| {
                let from = Self::absolute(policy, &rec.ctx, f);
                matches!(
                    super::pre_images::current_revision(policy, &from),
                    Ok(Some(_))
                )
            });
            if now == *before && source_kept {
                records.push(json!({"t": "drop_if_same", "turn_id": rec.ctx.turn, "path": path, "revision": now}));
            } else {
                records.push(json!({"t": "post", "turn_id": rec.ctx.turn, "path": path, "after_revision": now, "at": now_ms()}));
                if !changes.is_empty() {
                    if let Ok(p) = policy.jail.parent(path, false) {
                        posted.insert(p.path.to_string_lossy().into_owned(), path.as_str());
                    }
                }
            }
        }
        let any_post = records.iter().any(|r| r["t"] == "post");
        let mut ids = Vec::new();
        for c in changes {
            // A change to a file the turn does not list (one the call reached through a link,
            // or left as it was) is not in the history, so it gets no id either.
            if let Some(file) = posted.get(&c.path) {
                records.push(change_record(&rec.ctx.turn, file, c));
                ids.push(c.id.as_str());
            }
        }
        if let Some(started) = rec.one_call {
            // Its start goes with its end, in the one append (a crash before it leaves a turn
            // listed with no title and no after-revisions, as for any call cut short).
            if any_post {
                records.push(json!({"t": "start", "turn_id": rec.ctx.turn, "started_at": started, "title": rec.function}));
                records.push(json!({"t": "end", "turn_id": rec.ctx.turn, "ended_at": now_ms()}));
            } else {
                records.push(json!({"t": "discard", "turn_id": rec.ctx.turn}));
            }
        }
        if records.is_empty() {
            return;
        }
        let (session, turn) = (&rec.ctx.session, &rec.ctx.turn);
        let ok = self.with_store(policy, |s| {
            // The index first: a crash between the two leaves an id whose record is not
            // there (gone, as the turn has no after-revision either), never a recorded
            // change its id cannot reach.
            let indexed = ids
                .iter()
                .try_for_each(|id| s.index_change(id, session, turn));
            (indexed, s.append_all(session, &records))
        });
        let (indexed, appended) = match ok {
            Ok((i, a)) => (i.map_err(|e| e.to_string()), a.map_err(|e| e.to_string())),
            Err(e) => (Ok(()), Err(e.to_string())),
        };
        if let Err(e) = appended {
            tracing::error!(error = %e, session = %session, "cannot record a call's after-revisions in the turn store; revert will ask for force and coder::change-diff will not find its changes: make turns.data_dir writable and with space");
        } else if let Err(e) = indexed {
            tracing::error!(error = %e, session = %session, "cannot index a coder change in the turn store; the turn lists it but coder::change-diff will not find it: make turns.data_dir writable and with space");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(session: &str, root: Option<&str>, seen: u64) -> OpenTurn {
        OpenTurn {
            session: session.into(),
            turn: format!("{session}-t"),
            root: root.map(String::from),
            seen,
        }
    }

    #[test]
    fn the_open_turn_a_change_records_under() {
        let open = [
            o("a", Some("/w/a"), 1),
            o("b", Some("/w/b"), 2),
            o("c", None, 3),
        ];
        let pick = |p: &str| pick_open(&open, Some(p)).map(|o| o.session.as_str());
        assert_eq!(pick("/w/a/x.rs"), Some("a"));
        assert_eq!(pick("/w/a"), Some("a"));
        assert_eq!(pick("/w/ab/x.rs"), Some("c"), "a prefix is not a parent");
        assert_eq!(pick("/w/b/deep/y"), Some("b"));
        assert_eq!(pick("/elsewhere"), Some("c"), "else the most recently seen");
        assert_eq!(
            pick_open(&open, None).map(|o| o.session.as_str()),
            Some("c")
        );
        assert_eq!(pick_open(&[], Some("/w/a")), None);
        let nested = [o("outer", Some("/w"), 5), o("inner", Some("/w/a"), 4)];
        assert_eq!(
            pick_open(&nested, Some("/w/a/x")).map(|o| o.session.as_str()),
            Some("outer"),
            "both hold it: the most recently seen"
        );
    }

    #[test]
    fn a_discarded_one_call_turn_is_not_listed() {
        let recs = [
            json!({"t": "pre", "turn_id": "call-1", "path": "/a", "kind": "created", "cause": "coder::create-file", "before": {"missing": true}, "at": 1}),
            json!({"t": "start", "turn_id": "call-1", "started_at": 1, "title": "coder::create-file"}),
            json!({"t": "drop_if_same", "turn_id": "call-1", "path": "/a", "revision": null}),
            json!({"t": "discard", "turn_id": "call-1"}),
            json!({"t": "start", "turn_id": "call-2", "started_at": 2, "title": "coder::delete-file"}),
        ];
        let turns = super::super::history::fold(&recs);
        assert_eq!(
            turns.iter().map(|t| t.turn_id.as_str()).collect::<Vec<_>>(),
            ["call-2"]
        );
    }

    #[test]
    fn open_turns_are_bounded_and_a_session_has_one() {
        let t = Turns::default();
        for i in 0..MAX_OPEN + 10 {
            t.mark_open(&format!("s{i}"), "t");
        }
        t.mark_open("s5000", "a");
        t.mark_open("s5000", "b");
        let open = lock(&t.open);
        assert_eq!(open.len(), MAX_OPEN);
        assert!(!open.iter().any(|o| o.session == "s0"), "the oldest went");
        assert_eq!(
            open.iter()
                .filter(|o| o.session == "s5000")
                .map(|o| o.turn.as_str())
                .collect::<Vec<_>>(),
            ["b"]
        );
    }

    #[test]
    fn requests_map_to_the_calls_the_hooks_would_see() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        let v = json!({"fs": {"host_roots": [root.to_string_lossy()]}});
        let p = Policy::build(1, &v.to_string()).unwrap();
        let r = root.to_string_lossy();
        assert_eq!(
            fs_call(
                &p,
                &FsOp::Mv {
                    src: "a".into(),
                    dst: "/x/b".into(),
                    overwrite: false
                }
            ),
            Some((
                "shell::fs::mv",
                json!({"src": format!("{r}/a"), "dst": "/x/b"})
            ))
        );
        assert_eq!(
            fs_call(
                &p,
                &FsOp::Rm {
                    path: "d/../e".into(),
                    recursive: false
                }
            ),
            Some((
                "shell::fs::rm",
                json!({"path": format!("{r}/e"), "recursive": false})
            ))
        );
        assert_eq!(fs_call(&p, &FsOp::Stat { path: "a".into() }), None);
        assert_eq!(
            fs_call(
                &p,
                &FsOp::Mkdir {
                    path: "a".into(),
                    mode: 0o755,
                    parents: true
                }
            ),
            Some((
                "shell::fs::mkdir",
                json!({"path": format!("{r}/a"), "parents": true})
            ))
        );
        let call = CoderCall {
            scope: Default::default(),
            op: CoderOp::Delete(iii_shell_protocol::coder::DeleteFileInput {
                paths: vec!["k".into()],
                recursive: true,
            }),
        };
        // `recursive` goes along: the turn records the whole tree a recursive delete takes.
        assert_eq!(
            coder_call(&p, &call),
            Some((
                "coder::delete-file",
                json!({"paths": [format!("{r}/k")], "recursive": true})
            ))
        );
    }
}
