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
#[cfg(test)]
mod fold_figure;
mod history;
mod hooks;
#[cfg(test)]
mod hostile_tests;
mod lru;
pub mod model;
mod pre_images;
pub mod reach;
pub mod sessions;
mod state;
pub mod store;
pub mod tree;
mod undo;

pub use history::fold;
use history::inflate;
pub use state::{
    OpenTurn, TurnCtx, Turns, MAX_HOOK_SESSIONS, MAX_PRE_IMAGE_BYTES, MAX_RESPONSE_BODIES,
    MAX_STORED_BODY,
};

use iii_shell_protocol::turns::TurnsRequest;
use serde_json::{json, Value};

use crate::policy::Policy;
use iii_shell_files::error::ExecError;

fn invalid(e: serde_json::Error) -> ExecError {
    ExecError::Invalid(format!("bad request: {e}"))
}

impl Turns {
    /// Serves one `shell::turns::*` function: its payload parsed into the typed request
    /// ([`TurnsRequest::parse`], the broker's parser too), then one exhaustive match.
    pub fn call(&self, policy: &Policy, function: &str, payload: &str) -> Result<Value, ExecError> {
        let v: Value = serde_json::from_str(payload).map_err(invalid)?;
        let request = TurnsRequest::parse(function, &v).map_err(ExecError::Invalid)?;
        match request {
            TurnsRequest::TurnStarted(ev) => {
                self.turn_started(policy, &ev)?;
                Ok(json!({"ok": true}))
            }
            TurnsRequest::TurnCompleted(ev) => {
                self.turn_completed(policy, &ev)?;
                Ok(json!({"ok": true}))
            }
            TurnsRequest::PreTrigger(h) | TurnsRequest::PostTrigger(h) => {
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
            TurnsRequest::List(r) => {
                let session = r.session_id;
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
            TurnsRequest::Sessions(r) => {
                let page =
                    iii_shell_protocol::turns::sessions_page(&r).map_err(ExecError::Invalid)?;
                // Read outside the store's lock: a page reads up to `limit` logs, and the hooks
                // must not wait for it.
                let dir = self
                    .with_store(policy, |s| s.sessions_dir())?
                    .map_err(|e| ExecError::Internal(format!("turn store: {e}")))?;
                serde_json::to_value(sessions::list(&dir, &page))
                    .map_err(|e| ExecError::Internal(format!("sessions: {e}")))
            }
            TurnsRequest::Get(r) => {
                let session = r.session_id;
                let want = r.turn_id;
                let reach = reach::Reach::new(policy, r.fs_scope.as_ref())?;
                let turn = self.with_store(policy, |s| {
                    let turns = fold(&s.records(&session));
                    let idx = match &want {
                        Some(id) => turns.iter().position(|t| &t.turn_id == id),
                        None => turns.len().checked_sub(1),
                    };
                    idx.map(|i| inflate(s, &turns, i, &reach))
                })?;
                Ok(json!({"session_id": session, "turn": turn}))
            }
            TurnsRequest::Revert(r) => {
                let reach = reach::Reach::new(policy, r.fs_scope.as_ref())?;
                self.revert(
                    &reach,
                    policy,
                    &r.session_id,
                    &r.turn_id,
                    r.paths.as_deref(),
                    r.force,
                )
            }
            TurnsRequest::AdoptRoot(r) => {
                let n = self.adopt_root(policy, &r.session_id, &r.turn_id, &r.root)?;
                Ok(json!({"recorded": n}))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::model::*;
    use super::*;
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::sync::Arc;

    fn policy(root: &Path, data: &Path, max_blob: u64) -> Arc<Policy> {
        // No scratch paths: the store in the temp dir stays out of commands' reach in place.
        let v = json!({"fs": {"host_roots": [root.to_string_lossy()]},
            "confinement": {"scratch_paths": []},
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
