//! Coder calls inside the turn recording, and `coder::change-diff` (CODER-72, 73) as a view of
//! the turn history (`super::changes`).
//!
//! [`run`] serves a coder call with a [`TurnRecorder`] as its `coder::ChangeRecorder`: every
//! successful `create-file`, `update-file` and (file) `delete-file` entry reports the exact
//! bytes before and after to it. The id of a change is the revision of the bytes it left
//! (`sha256:<hex>`, the `revision` a create returns and a later `read-file` reports); a
//! deletion's id is `deleted:<canonical path>`. The call's files record into the open turn (or
//! a one-call turn of `shell.outside-turns`), and each change becomes a `change` record of
//! that turn, its bodies blobs of the store. A diff resolves an id through those records
//! only, so a diff is there exactly as long as the turn history holds the change and its
//! bodies; an unknown or evicted id is C211.

use std::sync::{Arc, Mutex};

use iii_shell_policy::sync::lock;
use iii_shell_protocol::coder::{ChangeDiffOutput, CoderCall, CoderReply, FsScope};
use iii_shell_protocol::WireError;

use super::changes::Change;
use super::model::revision;
use super::state::Turns;
use crate::policy::Policy;
use iii_shell_files::coder::recorder::{gone, ChangeRecorder};
use iii_shell_files::coder::{CErr, EditLocks};

/// The turn store as one coder call's change recorder.
pub struct TurnRecorder<'a> {
    turns: &'a Turns,
    policy: &'a Policy,
    /// The call records into a turn: its changes are kept.
    recording: bool,
    changes: Mutex<Vec<Change>>,
    /// The call's `fs_scope`: a diff of a path outside its scope root is gone.
    scope: FsScope,
}

impl<'a> TurnRecorder<'a> {
    /// A recorder into `turns`; with `recording` false (a call that records into no turn) it
    /// keeps nothing, but still serves diffs.
    pub fn new(turns: &'a Turns, policy: &'a Policy, recording: bool) -> Self {
        TurnRecorder {
            turns,
            policy,
            recording,
            changes: Mutex::new(Vec::new()),
            scope: FsScope::default(),
        }
    }

    /// The recorder of a call made with `scope`.
    pub fn scoped(mut self, scope: FsScope) -> Self {
        self.scope = scope;
        self
    }

    /// The changes recorded so far.
    pub fn take(&self) -> Vec<Change> {
        std::mem::take(&mut *lock(&self.changes))
    }
}

impl ChangeRecorder for TurnRecorder<'_> {
    /// Both bodies are kept as blobs now, the change is recorded with the call's other records
    /// once it is done (`Turns::finish`: only for a file the turn lists, so a write that left
    /// the bytes as they were gets none). A call that records into no turn keeps nothing.
    fn record(&self, id: String, path: String, old: &[u8], new: &[u8]) {
        if !self.recording {
            return;
        }
        let (old_rev, new_rev) = (revision(old), revision(new));
        // A body the store cannot keep leaves its revision recorded: the diff reads as gone.
        self.turns.keep_body(self.policy, old);
        self.turns.keep_body(self.policy, new);
        lock(&self.changes).push(Change {
            id,
            path,
            old: old_rev,
            new: new_rev,
        });
    }

    /// Served under the policy in force and the call's scope: a change to a path the caller
    /// cannot reach now is gone (C211, the same answer as an unknown id).
    fn diff(&self, id: &str) -> Result<ChangeDiffOutput, CErr> {
        let Ok(reach) = super::reach::Reach::new(self.policy, Some(&self.scope)) else {
            return Err(gone(id));
        };
        match self.turns.change_diff_by_id(self.policy, &reach, id) {
            Ok(Some(v)) => serde_json::from_value(v).map_err(|_| gone(id)),
            Ok(None) => Err(gone(id)),
            Err(e) => Err(CErr::io(format!("coder::change-diff {id}: {e}"))),
        }
    }
}

/// Runs one coder call against `policy` with its changes recorded in `turns` (blocking: call
/// it off the runtime). A mutation keeps the pre-images of its files in the turn it records
/// into (`Turns::begin_coder`), then their after-revisions and its changes (`Turns::finish`).
pub fn run(
    turns: &Arc<Turns>,
    policy: &Arc<Policy>,
    locks: &EditLocks,
    call: CoderCall,
) -> Result<CoderReply, WireError> {
    let rec = super::calls::coder_call(policy, &call)
        .and_then(|(f, args)| turns.begin_coder(policy, f, args));
    let recorder = TurnRecorder::new(turns, policy, rec.is_some()).scoped(call.scope.clone());
    let out = iii_shell_files::coder::handle(policy, call, locks, &recorder);
    let changes = recorder.take();
    if let Some(rec) = rec {
        turns.finish(policy, rec, &changes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turns::calls::OUTSIDE_TURNS;
    use serde_json::{json, Value};

    struct Setup {
        _d: tempfile::TempDir,
        root: std::path::PathBuf,
        data: std::path::PathBuf,
        policy: Arc<Policy>,
    }

    fn setup(max_blob_bytes: u64) -> Setup {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let (root, data) = (base.join("root"), base.join("data"));
        std::fs::create_dir_all(&root).unwrap();
        // No scratch paths: the store in the temp dir stays out of commands' reach in place.
        let v = json!({"fs": {"host_roots": [root]}, "confinement": {"scratch_paths": []},
            "turns": {"data_dir": data, "max_blob_bytes": max_blob_bytes}});
        let policy = Arc::new(Policy::build(1, &v.to_string()).unwrap());
        Setup {
            _d: d,
            root,
            data,
            policy,
        }
    }

    /// A coder call through [`run`] (`op` as `CoderOp` JSON); the reply as JSON, or the code.
    fn coder(t: &Arc<Turns>, p: &Arc<Policy>, op: Value) -> Result<Value, String> {
        let call: CoderCall = serde_json::from_value(json!({"scope": {}, "op": op})).unwrap();
        run(t, p, &EditLocks::default(), call)
            .map(|r| serde_json::to_value(r).unwrap())
            .map_err(|e| e.code.to_string())
    }

    fn diff_of(t: &Arc<Turns>, p: &Arc<Policy>, id: &str) -> Result<Value, String> {
        coder(t, p, json!({"ChangeDiff": {"change_id": id}})).map(|r| r["ChangeDiff"].clone())
    }

    fn turns(t: &Turns, p: &Policy, function: &str, v: Value) -> Value {
        t.call(p, function, &v.to_string()).unwrap()
    }

    #[test]
    fn a_change_diff_is_the_turn_records_view_and_outlives_the_executor() {
        let s = setup(1 << 20);
        std::fs::write(s.root.join("a.txt"), "one\n").unwrap();
        let t = Arc::new(Turns::default());
        turns(
            &t,
            &s.policy,
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        let out = coder(
            &t,
            &s.policy,
            json!({"Create": {"files": [{"path": "a.txt", "content": "two\n", "overwrite": true}]}}),
        )
        .unwrap();
        let id = out["Create"]["results"][0]["revision"]
            .as_str()
            .unwrap()
            .to_string();
        let path = s.root.join("a.txt").to_string_lossy().into_owned();
        let want = json!({"path": path, "is_binary": false, "old_contents": "one\n", "new_contents": "two\n"});
        assert_eq!(diff_of(&t, &s.policy, &id), Ok(want.clone()));
        let got = turns(
            &t,
            &s.policy,
            "shell::turns::get",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        assert_eq!(got["turn"]["files"][0]["after_revision"], id, "{got}");
        // A new executor has only the store.
        let fresh = Arc::new(Turns::default());
        assert_eq!(diff_of(&fresh, &s.policy, &id), Ok(want));
        assert_eq!(diff_of(&fresh, &s.policy, "nope"), Err("C211".into()));
        // The change is a record of the turn's log, its id in the index.
        let log = std::fs::read_to_string(s.data.join("sessions/s1.jsonl")).unwrap();
        let change: Vec<Value> = log
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["t"] == "change")
            .collect();
        assert_eq!(change.len(), 1, "{log}");
        assert_eq!(
            (
                &change[0]["change_id"],
                &change[0]["file"],
                &change[0]["turn_id"]
            ),
            (&json!(id), &json!(path), &json!("t1"))
        );
    }

    /// The history has no record of a write that left the bytes as they were, so change-diff
    /// has no change for its id either (it had one, in a map of its own).
    #[test]
    fn a_write_that_changed_nothing_has_no_change_id() {
        let s = setup(1 << 20);
        std::fs::write(s.root.join("same.txt"), "x\n").unwrap();
        let t = Arc::new(Turns::default());
        turns(
            &t,
            &s.policy,
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        let out = coder(
            &t,
            &s.policy,
            json!({"Create": {"files": [{"path": "same.txt", "content": "x\n", "overwrite": true}]}}),
        )
        .unwrap();
        assert_eq!(out["Create"]["results"][0]["success"], true, "{out}");
        let id = out["Create"]["results"][0]["revision"].as_str().unwrap();
        let list = turns(
            &t,
            &s.policy,
            "shell::turns::list",
            json!({"session_id": "s1"}),
        );
        assert_eq!(list["turns"][0]["file_count"], 0, "{list}");
        assert_eq!(diff_of(&t, &s.policy, id), Err("C211".into()));
    }

    /// With no turn open, a coder mutation is a one-call turn of `shell.outside-turns` (titled
    /// with its function, ended); one that changed nothing is discarded and never listed.
    #[test]
    fn outside_a_turn_a_coder_change_is_a_one_call_turn() {
        let s = setup(1 << 20);
        std::fs::write(s.root.join("kept.txt"), "kept\n").unwrap();
        let t = Arc::new(Turns::default());
        let out = coder(
            &t,
            &s.policy,
            json!({"Create": {"files": [{"path": "n.txt", "content": "n\n"}]}}),
        )
        .unwrap();
        let id = out["Create"]["results"][0]["revision"]
            .as_str()
            .unwrap()
            .to_string();
        let refused = coder(
            &t,
            &s.policy,
            json!({"Create": {"files": [{"path": "kept.txt", "content": "no\n"}]}}),
        )
        .unwrap();
        assert_eq!(refused["Create"]["results"][0]["success"], false);
        let list = turns(
            &t,
            &s.policy,
            "shell::turns::list",
            json!({"session_id": OUTSIDE_TURNS}),
        );
        let listed = list["turns"].as_array().unwrap();
        assert_eq!(listed.len(), 1, "{list}");
        assert_eq!(listed[0]["title"], "coder::create-file", "{list}");
        assert!(listed[0]["ended_at"].is_u64(), "{list}");
        assert!(
            listed[0]["turn_id"].as_str().unwrap().starts_with("call-"),
            "{list}"
        );
        assert_eq!(
            listed[0]["files"],
            json!([{"path": s.root.join("n.txt").to_string_lossy(), "kind": "created"}])
        );
        assert_eq!(
            diff_of(&t, &s.policy, &id).map(|d| d["new_contents"].clone()),
            Ok(json!("n\n"))
        );
        // The refused call's turn went in and was discarded.
        let log = std::fs::read_to_string(s.data.join(format!("sessions/{OUTSIDE_TURNS}.jsonl")))
            .unwrap();
        assert_eq!(log.matches("\"discard\"").count(), 1, "{log}");
        // Calls that change nothing record nothing.
        coder(&t, &s.policy, json!("Info")).unwrap();
        let again = turns(
            &t,
            &s.policy,
            "shell::turns::list",
            json!({"session_id": OUTSIDE_TURNS}),
        );
        assert_eq!(again, list);
    }

    /// `turns.max_blob_bytes` evicts a change's bodies with the turn's pre-images: the turn
    /// reads `stored: false` and change-diff is C211 for it, the newer change still answers.
    #[test]
    fn an_evicted_body_takes_the_diff_with_it() {
        let s = setup(1000);
        std::fs::write(s.root.join("a"), "a".repeat(600)).unwrap();
        std::fs::write(s.root.join("b"), "b".repeat(600)).unwrap();
        let t = Arc::new(Turns::default());
        turns(
            &t,
            &s.policy,
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": "t1"}),
        );
        let mut ids = Vec::new();
        for f in ["a", "b"] {
            let out = coder(
                &t,
                &s.policy,
                json!({"Create": {"files": [{"path": f, "content": "new\n", "overwrite": true}]}}),
            )
            .unwrap();
            ids.push(
                out["Create"]["results"][0]["revision"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // Both left "new\n": one id, the newest change (b's) answers.
        assert_eq!(ids[0], ids[1]);
        let d = diff_of(&t, &s.policy, &ids[1]).unwrap();
        assert_eq!(d["old_contents"], "b".repeat(600));
        let got = turns(
            &t,
            &s.policy,
            "shell::turns::get",
            json!({"session_id": "s1"}),
        );
        let before = |suffix: &str| {
            got["turn"]["files"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["path"].as_str().unwrap().ends_with(suffix))
                .unwrap()["before"]["stored"]
                .clone()
        };
        assert_eq!(
            (before("/a"), before("/b")),
            (json!(false), json!(true)),
            "{got}"
        );
        // A third change evicts b's body too (the oldest left), and its diff goes with it.
        std::fs::write(s.root.join("c"), "c".repeat(600)).unwrap();
        coder(
            &t,
            &s.policy,
            json!({"Create": {"files": [{"path": "c", "content": "c2\n", "overwrite": true}]}}),
        )
        .unwrap();
        assert_eq!(diff_of(&t, &s.policy, &ids[1]), Err("C211".into()));
    }

    /// `coder::change-diff` serves a change only while its path is reachable under the policy
    /// in force and the call's scope: made non-accessible, denylisted, its root removed, or
    /// outside the caller's `fs_scope`, the id answers exactly as an unknown one (C211, one
    /// message).
    #[test]
    fn a_change_diff_of_a_path_made_unreachable_reads_like_an_unknown_id() {
        let s = setup(1 << 20);
        std::fs::create_dir_all(s.root.join("sub")).unwrap();
        std::fs::write(s.root.join("a.env"), "secret\n").unwrap();
        let t = Arc::new(Turns::default());
        let out = coder(
            &t,
            &s.policy,
            json!({"Create": {"files": [{"path": "a.env", "content": "secret2\n", "overwrite": true}]}}),
        )
        .unwrap();
        let id = out["Create"]["results"][0]["revision"]
            .as_str()
            .unwrap()
            .to_string();
        let diff = |p: &Arc<Policy>, scope: Value| {
            let call: CoderCall = serde_json::from_value(
                json!({"scope": scope, "op": {"ChangeDiff": {"change_id": id}}}),
            )
            .unwrap();
            run(&t, p, &EditLocks::default(), call).map_err(|e| (e.code, e.message))
        };
        assert!(diff(&s.policy, json!({})).is_ok());
        let with = |fs: Value, code: Value| {
            let v = json!({"fs": fs, "code": code,
                "turns": {"data_dir": s.data, "max_blob_bytes": 1 << 20}});
            Arc::new(Policy::build(1, &v.to_string()).unwrap())
        };
        let other = s.root.parent().unwrap().join("other");
        std::fs::create_dir_all(&other).unwrap();
        let unknown = Err((
            iii_shell_protocol::WireCode::Known(iii_shell_protocol::Code::C211),
            gone(&id).message,
        ));
        let sub = s.root.join("sub");
        for (why, p, scope) in [
            (
                "non-accessible",
                with(
                    json!({"host_roots": [s.root]}),
                    json!({"non_accessible_globs": ["*.env"]}),
                ),
                json!({}),
            ),
            (
                "denylisted",
                with(
                    json!({"host_roots": [s.root], "denylist_paths": [s.root.join("a.env")]}),
                    json!({}),
                ),
                json!({}),
            ),
            (
                "root removed",
                with(json!({"host_roots": [other]}), json!({})),
                json!({}),
            ),
            (
                "outside the scope",
                Arc::clone(&s.policy),
                json!({"scope_root": sub, "session_root": sub}),
            ),
        ] {
            assert_eq!(diff(&p, scope).map(|_| ()), unknown.clone(), "{why}");
        }
    }

    #[test]
    fn a_recorder_of_no_turn_keeps_nothing() {
        let s = setup(1 << 20);
        let t = Turns::default();
        let r = TurnRecorder::new(&t, &s.policy, false);
        r.record("u".into(), "/p".into(), b"a", b"b");
        assert!(r.take().is_empty());
        assert_eq!(
            r.diff("u").unwrap_err().code,
            iii_shell_protocol::Code::C211
        );
    }
}
