//! The pre-image API ([`Turns::before_call`], [`Turns::after_call`]): the files a call is
//! about to change, resolved through the jail, their bytes kept in the blob store and the
//! `pre` / `post` records appended; and `adopt-root`, which records the files of a new root.

use std::io::Read;
use std::path::Path;

use iii_shell_protocol::clock::now_ms;
use serde_json::{json, Value};

use super::history::fold;
use super::model::*;
use super::state::{TurnCtx, Turns, MAX_STORED_BODY};
use super::tree;
use crate::policy::Policy;
use iii_shell_files::error::ExecError;

impl Turns {
    pub(super) fn absolute(policy: &Policy, ctx: &TurnCtx, p: &str) -> String {
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

    /// [`Self::before_call`], returning each recorded path with its pre-image revision. The
    /// records go to the session's log in one append (one fsync), before the call runs.
    pub(super) fn before_inner(
        &self,
        policy: &Policy,
        ctx: &TurnCtx,
        function_id: &str,
        args: &Value,
    ) -> Result<Vec<(String, Option<String>)>, ExecError> {
        let records = std::cell::RefCell::new(Vec::new());
        let recorded = self.collect_pre(policy, ctx, function_id, args, &records)?;
        let records = records.into_inner();
        if !records.is_empty() {
            self.with_store(policy, |s| s.append_all(&ctx.session, &records))?
                .map_err(|e| ExecError::Internal(format!("turn store: {e}")))?;
        }
        Ok(recorded)
    }

    /// The records [`Self::before_inner`] appends (into `records`), and the recorded paths.
    fn collect_pre(
        &self,
        policy: &Policy,
        ctx: &TurnCtx,
        function_id: &str,
        args: &Value,
        records: &std::cell::RefCell<Vec<Value>>,
    ) -> Result<Vec<(String, Option<String>)>, ExecError> {
        let mut recorded = Vec::new();
        let append = |rec: &Value| -> Result<(), ExecError> {
            records.borrow_mut().push(rec.clone());
            Ok(())
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
            let Some((before, real)) = self.capture(policy, &path) else {
                return Ok(());
            };
            let rev = before.revision.clone();
            let mut rec = json!({"t": "pre", "turn_id": ctx.turn, "path": path, "kind": kind,
                "cause": function_id, "from": from, "root": ctx.root, "agent": ctx.agent,
                "before": before, "at": now_ms()});
            // Where the path resolved, when a link made it another name: served only while
            // both names are reachable (`reach`).
            if let Some(real) = real.filter(|r| Path::new(r) != Path::new(&path)) {
                rec["real"] = json!(real);
            }
            append(&rec)?;
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

    /// The pre-image API, after the call: records each file's after-revision. After a failed
    /// call (`is_error`) each file it named, and each file still inside a tree it reached into
    /// (a recursive `rm` that stopped half-way), is dropped again when it did not change, so
    /// the turn's record is as it was before the call (TURNS-05). One append for the call.
    pub fn after_call(
        &self,
        policy: &Policy,
        ctx: &TurnCtx,
        function_id: &str,
        args: &Value,
        is_error: bool,
    ) -> Result<usize, ExecError> {
        let mut records = Vec::new();
        let deep = is_error && tree::recursive_call(function_id, args);
        for t in touches(function_id, args) {
            let path = Self::absolute(policy, ctx, &t.path);
            let inside = deep.then(|| tree::scan(policy, &path)).flatten();
            for e in inside.iter().flatten().filter(|e| e.kind == "file") {
                if let Ok(now) = current_revision(policy, &e.path) {
                    records.push(json!({"t": "drop_if_same", "turn_id": ctx.turn, "path": e.path, "revision": now}));
                }
            }
            let Ok(now) = current_revision(policy, &path) else {
                continue;
            };
            records.push(if is_error {
                json!({"t": "drop_if_same", "turn_id": ctx.turn, "path": path, "revision": now})
            } else {
                json!({"t": "post", "turn_id": ctx.turn, "path": path, "after_revision": now, "at": now_ms()})
            });
        }
        if !records.is_empty() {
            self.with_store(policy, |s| s.append_all(&ctx.session, &records))?
                .map_err(|e| ExecError::Internal(format!("turn store: {e}")))?;
        }
        Ok(records.len())
    }

    /// Reads `path` through the jail and keeps its body, with where the path resolved (for
    /// an existing file); `None` for a denied path.
    pub(super) fn capture(
        &self,
        policy: &Policy,
        path: &str,
    ) -> Option<(PreImage, Option<String>)> {
        match read_capped_at(policy, path) {
            Ok(None) => Some((
                PreImage {
                    missing: true,
                    ..Default::default()
                },
                None,
            )),
            Ok(Some((data, complete, real))) => {
                let rev = revision(&data);
                let binary = std::str::from_utf8(&data).is_err();
                let stored = complete
                    && self
                        .with_store(policy, |s| s.put_blob(&rev, &data))
                        .unwrap_or(false);
                let pre = PreImage {
                    revision: complete.then_some(rev),
                    stored,
                    missing: false,
                    binary,
                    truncated: !complete,
                    content: None,
                };
                Some((pre, Some(real.to_string_lossy().into_owned())))
            }
            Err(()) => None,
        }
    }

    pub(super) fn adopt_root(
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

/// Reads a regular file through the jail: `None` when missing, `(bytes, complete)` where
/// `complete` is false past [`MAX_STORED_BODY`]. `Err` for a denied or unreadable path.
pub(super) fn read_capped(policy: &Policy, path: &str) -> Result<Option<(Vec<u8>, bool)>, ()> {
    Ok(read_capped_at(policy, path)?.map(|(d, c, _)| (d, c)))
}

/// [`read_capped`], with the path the file resolved to.
type ReadBody = (Vec<u8>, bool, std::path::PathBuf);
fn read_capped_at(policy: &Policy, path: &str) -> Result<Option<ReadBody>, ()> {
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
            Ok(Some((data, complete, r.path)))
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
pub(super) fn current_revision(policy: &Policy, path: &str) -> Result<Option<String>, ()> {
    Ok(read_capped(policy, path)?.map(|(d, _)| revision(&d)))
}
