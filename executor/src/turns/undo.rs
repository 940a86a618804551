//! Reverting a turn (`shell::turns::revert`): each file back to its pre-image unless it
//! changed since (TURNS-15, TURNS-17), then the turn's structure (directories, links, modes).
//!
//! A file already as the revert would leave it (reverted before, or never changed) is
//! `skipped`, a success. A file the policy in force does not let the caller reach
//! ([`super::reach`]: denied, outside the roots or the caller's scope now) is treated as a
//! missing file whose body is no longer kept, so it is never written: the result reads like
//! the one of such a file.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};

use super::history::fold;
use super::model::*;
use super::pre_images::current_revision;
use super::reach::Reach;
use super::state::Turns;
use super::tree;
use crate::policy::Policy;
use iii_shell_files::error::ExecError;

impl Turns {
    pub(super) fn revert(
        &self,
        reach: &Reach<'_>,
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
        let wanted: Option<HashSet<&str>> = paths.map(|p| p.iter().map(String::as_str).collect());
        let picked = |path: &str| wanted.as_ref().is_none_or(|w| w.contains(path));
        let mut files: Vec<&FileRecord> = turn.files.iter().filter(|f| picked(&f.path)).collect();
        files.sort_by_key(|f| std::cmp::Reverse(f.last_seen));
        let mut results = Vec::new();
        let (mut ok, mut failed) = (0u64, 0u64);
        for f in files {
            let (action, outcome) = revert_one(policy, f, &bodies, force, reach.allows_file(f));
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
        // Structure of a name the caller cannot reach now is left alone (never written).
        let metas: Vec<&Meta> = turn
            .metas
            .iter()
            .filter(|m| picked(&m.path) && reach.allows(&m.path))
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
}

/// Undoes one file (TURNS-15, TURNS-17). Refuses a file changed since the turn (its current
/// revision is not the turn's `after_revision`) unless `force`; skips one already as the
/// revert would leave it. A file not `allowed` (unreachable now) reads as missing, its body
/// as not kept: nothing is written.
pub(super) fn revert_one(
    policy: &Policy,
    f: &FileRecord,
    bodies: &HashMap<String, Vec<u8>>,
    force: bool,
    allowed: bool,
) -> (&'static str, Result<(), String>) {
    let before = f.before.clone().unwrap_or_default();
    let now = if allowed {
        match current_revision(policy, &f.path) {
            Ok(r) => r,
            Err(()) => {
                return (
                    "skipped",
                    Err(format!("{}: not readable under the current policy", f.path)),
                )
            }
        }
    } else {
        None
    };
    if let Some(action) = nothing_to_undo(policy, f, &before, now.as_deref(), allowed) {
        return (action, Ok(()));
    }
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
            .filter(|_| allowed)
            .and_then(|r| bodies.get(r))
            .ok_or_else(|| format!("{}: the body before this turn was not kept (stored: false: too large, evicted or unreadable); not reverting it rather than guessing", f.path))
    };
    if let Some(from) = &f.from {
        if let Some(g) = guard("moved-back") {
            return g;
        }
        if !allowed {
            // What moving back a file that is not there answers.
            return (
                "moved-back",
                Err(ExecError::NotFound(f.path.clone()).to_string()),
            );
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
        if let Some(g) = guard("removed") {
            return g;
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

/// `skipped` when the file is already as the revert would leave it (TURNS-15): a delete of a
/// file that never existed, a created file that is gone, a restored body that is back, a
/// moved file whose source is back. So a second revert of a turn skips what the first did.
fn nothing_to_undo(
    policy: &Policy,
    f: &FileRecord,
    before: &PreImage,
    now: Option<&str>,
    allowed: bool,
) -> Option<&'static str> {
    // What is at the path when the turn is undone: nothing, or the body before it.
    let as_before = if before.missing {
        now.is_none()
    } else {
        now.is_some() && now == before.revision.as_deref()
    };
    let done = match &f.from {
        Some(from) => as_before && allowed && matches!(current_revision(policy, from), Ok(Some(_))),
        None => as_before || (before.missing && f.kind == "deleted"),
    };
    done.then_some("skipped")
}

pub(super) fn exists(policy: &Policy, path: &str) -> bool {
    tree::stat_one(policy, path).is_some()
}

/// Applies a turn's structure records after its bodies were reverted: directories that
/// existed come back (outermost first), links come back, modes are restored (innermost
/// first), and directories the turn created are removed when empty (innermost first).
/// Returns the failures, path and reason.
pub(super) fn revert_metas(policy: &Policy, metas: &[&Meta]) -> Vec<(String, String)> {
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

pub(super) fn symlink(policy: &Policy, path: &str, target: &str) -> Result<(), String> {
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

pub(super) fn write_back(policy: &Policy, path: &str, body: &[u8]) -> Result<(), String> {
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
