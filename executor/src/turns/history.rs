//! Reading the history: a session's records folded into its turns ([`fold`]), and `get`'s
//! view of one turn with its bodies filled in within the budgets ([`inflate`]).

use serde_json::Value;

use super::model::*;
use super::state::{MAX_PRE_IMAGE_BYTES, MAX_RESPONSE_BODIES};
use super::store::Store;

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
pub(super) fn inflate(s: &Store, turns: &[TurnRecord], i: usize) -> TurnRecord {
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
