//! Reading the history: a session's records folded into its turns ([`fold`]), and `get`'s
//! view of one turn with its bodies filled in within the budgets ([`inflate`]).

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::model::*;
use super::reach::Reach;
use super::state::{MAX_PRE_IMAGE_BYTES, MAX_RESPONSE_BODIES};
use super::store::Store;

/// One turn while folding: its files and structure records, each indexed by path, so a
/// record costs O(1) whatever the number of paths the turn holds. A file dropped again
/// (`drop_if_same`) leaves a hole, removed at the end.
struct Folding {
    turn: TurnRecord,
    files: Vec<Option<FileRecord>>,
    by_path: HashMap<String, usize>,
    metas: HashSet<String>,
}

impl Folding {
    fn new(turn_id: &str, started_at: u64) -> Folding {
        Folding {
            turn: TurnRecord {
                turn_id: turn_id.to_string(),
                started_at,
                ended_at: None,
                title: None,
                files: Vec::new(),
                metas: Vec::new(),
            },
            files: Vec::new(),
            by_path: HashMap::new(),
            metas: HashSet::new(),
        }
    }

    fn file(&mut self, path: &str) -> Option<&mut FileRecord> {
        let i = *self.by_path.get(path)?;
        self.files[i].as_mut()
    }

    fn done(mut self) -> TurnRecord {
        self.turn.files = self.files.into_iter().flatten().collect();
        self.turn
    }
}

/// The turns of a log while folding, indexed by id. A discarded turn leaves a hole.
#[derive(Default)]
struct Log {
    turns: Vec<Option<Folding>>,
    by_id: HashMap<String, usize>,
}

impl Log {
    fn get(&mut self, id: &str, at: u64) -> &mut Folding {
        let i = match self.by_id.get(id) {
            Some(i) => *i,
            None => {
                self.turns.push(Some(Folding::new(id, at)));
                self.by_id.insert(id.to_string(), self.turns.len() - 1);
                self.turns.len() - 1
            }
        };
        self.turns[i].get_or_insert_with(|| Folding::new(id, at))
    }

    fn discard(&mut self, id: &str) {
        if let Some(i) = self.by_id.remove(id) {
            self.turns[i] = None;
        }
    }
}

/// Folds a session's records into its turns, oldest first. Linear in the number of records:
/// turns are found by id and files by path through hash maps.
pub fn fold(records: &[Value]) -> Vec<TurnRecord> {
    let mut turns = Log::default();
    for r in records {
        let Some(id) = r.get("turn_id").and_then(Value::as_str) else {
            continue;
        };
        let at = r.get("at").and_then(Value::as_u64).unwrap_or(0);
        match r.get("t").and_then(Value::as_str) {
            Some("start") => {
                let started = r["started_at"].as_u64().unwrap_or(0);
                let t = &mut turns.get(id, started).turn;
                t.started_at = started;
                t.title = r["title"].as_str().map(String::from);
            }
            Some("end") => turns.get(id, 0).turn.ended_at = r["ended_at"].as_u64(),
            Some("pre") => pre(turns.get(id, at), r, at),
            Some("post") => {
                let t = turns.get(id, at);
                if let Some(f) = t.file(r["path"].as_str().unwrap_or_default()) {
                    f.after_revision = r["after_revision"].as_str().map(String::from);
                    f.last_seen = at.max(f.last_seen);
                    if let Some((kind, cause)) = f.pending.take() {
                        f.kind = compose(&f.kind, &kind).to_string();
                        f.cause = cause;
                    }
                }
            }
            Some("meta") => meta(turns.get(id, at), r),
            // A one-call turn (`calls::OUTSIDE_TURNS`) whose call changed nothing.
            Some("discard") => turns.discard(id),
            Some("drop_if_same") => drop_if_same(turns.get(id, at), r),
            _ => {}
        }
    }
    turns
        .turns
        .into_iter()
        .flatten()
        .map(Folding::done)
        .collect()
}

/// A `pre` record: the file's first pre-image opens its record; a later call's kind and cause
/// wait for its `post` (a failed call that changed nothing leaves the record as it was, its
/// `last_seen` too: TURNS-05).
fn pre(t: &mut Folding, r: &Value, at: u64) {
    let path = r["path"].as_str().unwrap_or_default();
    let kind = r["kind"].as_str().unwrap_or("modified");
    let cause = r["cause"].as_str().unwrap_or_default();
    if let Some(f) = t.file(path) {
        f.pending = Some((kind.to_string(), cause.to_string()));
        return;
    }
    t.files.push(Some(FileRecord {
        path: path.to_string(),
        kind: kind.to_string(),
        cause: cause.to_string(),
        first_seen: at,
        last_seen: at,
        from: r["from"].as_str().map(String::from),
        root: r["root"].as_str().map(String::from),
        agent: serde_json::from_value(r["agent"].clone()).ok(),
        before: serde_json::from_value(r["before"].clone()).ok(),
        after: None,
        after_revision: None,
        pending: None,
        real: r["real"].as_str().map(String::from),
    }));
    t.by_path.insert(path.to_string(), t.files.len() - 1);
}

/// A `meta` record: the first one of a path is the state before the turn.
fn meta(t: &mut Folding, r: &Value) {
    let path = r["path"].as_str().unwrap_or_default();
    if !t.metas.insert(path.to_string()) {
        return;
    }
    t.turn.metas.push(Meta {
        path: path.to_string(),
        kind: r["kind"].as_str().unwrap_or("file").to_string(),
        existed: r["existed"].as_bool().unwrap_or(true),
        mode: r["mode"].as_u64().map(|m| m as u32 & 0o7777),
        link: r["link"].as_str().map(String::from),
    });
}

/// A failed call: forget the path when it did not change (TURNS-05).
fn drop_if_same(t: &mut Folding, r: &Value) {
    let path = r["path"].as_str().unwrap_or_default();
    let now = r["revision"].as_str();
    let Some(&i) = t.by_path.get(path) else {
        return;
    };
    let Some(f) = t.files[i].as_mut() else {
        return;
    };
    let before = f.before.as_ref().and_then(|b| b.revision.as_deref());
    if before == now && f.after_revision.is_none() {
        t.files[i] = None;
        t.by_path.remove(path);
    } else {
        f.pending = None;
    }
}

/// `get`'s view of turn `i`: bodies filled in from the blob store within the budgets, and
/// `after` from a later turn that kept this turn's after-body as its own pre-image. A file
/// `reach` refuses (denied, outside the roots or the caller's scope now) has its bodies read
/// exactly like bodies no longer kept: `stored: false`, no content.
pub(super) fn inflate(s: &Store, turns: &[TurnRecord], i: usize, reach: &Reach<'_>) -> TurnRecord {
    let mut t = turns[i].clone();
    let mut budget = MAX_RESPONSE_BODIES;
    let mut fill = |p: &mut PreImage, allowed: bool| {
        p.stored = allowed && p.revision.as_deref().is_some_and(|r| s.has_blob(r));
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
    // Each path's pre-image in the first later turn that changed it, in one pass.
    let mut later: HashMap<&str, &Option<PreImage>> = HashMap::new();
    for lf in turns[i + 1..].iter().flat_map(|lt| lt.files.iter()) {
        later.entry(lf.path.as_str()).or_insert(&lf.before);
    }
    for f in &mut t.files {
        let allowed = reach.allows_file(f);
        if let Some(b) = f.before.as_mut() {
            fill(b, allowed);
        }
        let after = later
            .get(f.path.as_str())
            .and_then(|b| (*b).clone())
            .filter(|b| b.revision.is_some() && b.revision == f.after_revision);
        if let Some(mut a) = after {
            fill(&mut a, allowed);
            f.after = Some(a);
        }
    }
    t
}
