//! `shell::turns::*` end to end: `iii-shell serve` against the test engine, a second engine
//! connection playing the harness (turn events and the pre/post-trigger hooks around real
//! `shell::fs::*` calls). A turn that creates, modifies, deletes and moves files is reverted to
//! a byte-identical tree (every file hashed); an executor SIGKILLed mid-turn leaves a store
//! that opens, lists and reverts; `coder::change-diff` answers from the same records (across a
//! restart, past the blob cap, outside any turn); the hooks continue on what they cannot use,
//! and a malformed hook event is S210 naming the field.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use iii_shell_protocol::config::Config;
use iii_test_engine::{TestClient, TestEngine};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

struct Setup {
    engine: TestEngine,
    worker: Worker,
    harness: TestClient,
    _dir: tempfile::TempDir,
    root: PathBuf,
}

async fn setup() -> Setup {
    setup_with(|_| {}).await
}

async fn setup_with(tweak: impl FnOnce(&mut Config)) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let root = base.join("root");
    std::fs::create_dir_all(root.join("src")).unwrap();
    let mut config: Config = jailed(&root);
    config.turns.data_dir = base.join("turns").to_string_lossy().into_owned();
    // No scratch paths: /tmp (a default one) holds the store, which stays in place only out of
    // commands' reach.
    config.confinement.scratch_paths = Vec::new();
    tweak(&mut config);
    let engine = TestEngine::start().await;
    let worker = Worker::builder().engine(&engine).seed(&config).start();
    wait_ready(&engine, &worker).await;
    assert!(engine
        .wait_for_function("shell::turns::revert", WAIT)
        .await
        .is_some());
    let harness = engine.client().await;
    Setup {
        engine,
        worker,
        harness,
        _dir: dir,
        root,
    }
}

fn hashes(root: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, root, out);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                let sum: u64 = bytes
                    .iter()
                    .enumerate()
                    .fold(1469598103934665603u64, |h, (i, b)| {
                        (h ^ (*b as u64 + i as u64)).wrapping_mul(1099511628211)
                    });
                out.insert(
                    p.strip_prefix(root).unwrap().to_string_lossy().into_owned(),
                    format!("{sum:x}:{}", bytes.len()),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

impl Setup {
    async fn call(&self, f: &str, v: Value) -> Value {
        self.harness
            .call(f, v)
            .await
            .unwrap_or_else(|e| panic!("{f}: {e:?}; {}", self.worker.stderr()))
    }

    /// The harness's view of one agent call: pre-trigger hook, the call, post-trigger hook.
    async fn hooked(&self, function_id: &str, args: Value) {
        let h = json!({"point": "pre_trigger", "session_id": "s1", "turn_id": "t1", "step": 1,
            "call": {"id": "fc", "function_id": function_id, "arguments": args}});
        assert_eq!(
            self.call("shell::turns::on-pre-trigger", h.clone()).await,
            json!({"decision": "continue"})
        );
        self.call(function_id, args).await;
        let mut post = h;
        post["result"] = json!({"is_error": false, "content": []});
        assert_eq!(
            self.call("shell::turns::on-post-trigger", post).await,
            json!({"decision": "continue"})
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_reverted_through_the_engine_leaves_the_tree_byte_identical() {
    let s = setup().await;
    std::fs::write(s.root.join("src/keep.rs"), "fn keep() {}\n").unwrap();
    std::fs::write(s.root.join("src/gone.rs"), "fn gone() {}\n").unwrap();
    std::fs::write(s.root.join("old.txt"), "old\n").unwrap();
    let before = hashes(&s.root);
    let ok = s
        .call(
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": "t1", "message_preview": "tidy up"}),
        )
        .await;
    assert_eq!(ok, json!({"ok": true}));
    s.hooked(
        "shell::fs::write",
        json!({"path": "src/new.rs", "content": "new\n"}),
    )
    .await;
    s.hooked(
        "shell::fs::write",
        json!({"path": "src/keep.rs", "content": "changed\n"}),
    )
    .await;
    s.hooked("shell::fs::rm", json!({"path": "src/gone.rs"}))
        .await;
    s.hooked(
        "shell::fs::mv",
        json!({"src": "old.txt", "dst": "renamed.txt"}),
    )
    .await;
    s.call(
        "shell::turns::on-turn-completed",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    assert_ne!(hashes(&s.root), before);

    let list = s
        .call("shell::turns::list", json!({"session_id": "s1"}))
        .await;
    assert_eq!(list["turns"][0]["title"], "tidy up");
    assert_eq!(list["turns"][0]["file_count"], 4, "{list}");
    assert!(list["turns"][0]["ended_at"].is_u64());
    let rv = s
        .call(
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1"}),
        )
        .await;
    assert_eq!(
        (rv["reverted"].clone(), rv["failed"].clone()),
        (json!(4), json!(0)),
        "{rv}"
    );
    let mut actions: Vec<String> = rv["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap().to_string())
        .collect();
    actions.sort();
    assert_eq!(actions, ["moved-back", "removed", "restored", "restored"]);
    assert_eq!(hashes(&s.root), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_killed_mid_turn_leaves_a_store_that_lists_and_reverts() {
    let s = setup().await;
    std::fs::write(s.root.join("a.txt"), "original\n").unwrap();
    std::fs::write(s.root.join("b.txt"), "b before\n").unwrap();
    let before = hashes(&s.root);
    s.call(
        "shell::turns::on-turn-started",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    // A completed call (recorded by the executor itself: pre-image and after-revision)…
    s.call(
        "shell::fs::write",
        json!({"path": "b.txt", "content": "agent wrote b\n"}),
    )
    .await;
    // …and one caught in the middle: its pre-image is kept, its write lands, and the
    // executor dies before anything records the after-revision.
    let h = json!({"session_id": "s1", "turn_id": "t1",
        "call": {"function_id": "shell::fs::write", "arguments": {"path": "a.txt", "content": "x"}}});
    s.call("shell::turns::on-pre-trigger", h).await;
    std::fs::write(s.root.join("a.txt"), "agent wrote this\n").unwrap();
    s.restart_executor().await;
    let list = s
        .call("shell::turns::list", json!({"session_id": "s1"}))
        .await;
    // The respawned executor has no memory of the turn: only the store.
    let files = list["turns"][0]["files"].as_array().unwrap();
    assert_eq!(files.len(), 2, "{list}");
    assert!(files.iter().all(|f| f["kind"] == "modified"), "{list}");
    let got = s
        .call("shell::turns::get", json!({"session_id": "s1"}))
        .await;
    let a = got["turn"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with("a.txt"))
        .unwrap()
        .clone();
    assert_eq!(a["before"]["content"], "original\n");
    assert!(a.get("after_revision").is_none(), "{a}");
    // b.txt has its after-revision and reverts; a.txt has none, so revert asks for force.
    let rv = s
        .call(
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1"}),
        )
        .await;
    assert_eq!(
        (rv["reverted"].clone(), rv["failed"].clone()),
        (json!(1), json!(1)),
        "{rv}"
    );
    assert_eq!(
        std::fs::read_to_string(s.root.join("b.txt")).unwrap(),
        "b before\n"
    );
    let rv = s
        .call(
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1", "paths": [a["path"]], "force": true}),
        )
        .await;
    assert_eq!(rv["reverted"], 1, "{rv}");
    assert_eq!(hashes(&s.root), before);
}

/// The executor keeps the pre-images of its own `coder::*` and `shell::fs::*` mutations in the
/// open turn, with no harness hook around them (the harness may not hook every call): a turn of
/// coder creates, updates, deletes and moves plus an fs batch and a sed reverts to a
/// byte-identical tree. A sub-agent's hooked call records under the top-level turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coder_and_fs_calls_without_hooks_record_into_the_open_turn_and_revert_byte_identically() {
    let s = setup().await;
    std::fs::write(s.root.join("src/lib.rs"), "fn one() {}\n").unwrap();
    std::fs::write(s.root.join("src/dead.rs"), "fn dead() {}\n").unwrap();
    std::fs::write(s.root.join("from.txt"), "moving\n").unwrap();
    std::fs::write(s.root.join("over.txt"), "overwritten by the move\n").unwrap();
    std::fs::write(s.root.join("batch1"), "batch one\n").unwrap();
    std::fs::write(s.root.join("sed.txt"), "colour colour\n").unwrap();
    std::fs::write(s.root.join("bin.dat"), [0u8, 0xff, 0x80, 1]).unwrap();
    let before = hashes(&s.root);
    // No turn open: not in this session (a one-call turn of `shell.outside-turns`).
    s.call(
        "coder::create-file",
        json!({"files": [{"path": "untracked.txt", "content": "u\n"}]}),
    )
    .await;
    std::fs::remove_file(s.root.join("untracked.txt")).unwrap();
    s.call(
        "shell::turns::on-turn-started",
        json!({"session_id": "s1", "turn_id": "t1", "message_preview": "coder work"}),
    )
    .await;
    s.call(
        "shell::turns::on-turn-started",
        json!({"session_id": "sub1", "turn_id": "st1", "parent": {"session_id": "s1", "turn_id": "t1"}}),
    )
    .await;
    let c = |f: &'static str, v: Value| {
        let s = &s;
        async move {
            let out = s.call(f, v).await;
            if let Some(rs) = out["results"].as_array() {
                assert!(rs.iter().all(|r| r["success"] == true), "{f}: {out}");
            }
        }
    };
    c(
        "coder::create-file",
        json!({"files": [{"path": "src/new.rs", "content": "fn new() {}\n"},
                         {"path": "deep/er/n.txt", "content": "n\n"}]}),
    )
    .await;
    c(
        "coder::update-file",
        json!({"files": [{"path": "src/lib.rs", "ops": [{"op": "insert", "at_line": 2, "content": "fn two() {}\n"}]}]}),
    )
    .await;
    c("coder::delete-file", json!({"paths": ["src/dead.rs"]})).await;
    c(
        "coder::move",
        json!({"files": [{"from": "from.txt", "to": "over.txt", "overwrite": true}]}),
    )
    .await;
    c(
        "coder::create-file",
        json!({"files": [{"path": "bin.dat", "content": "text now", "overwrite": true}]}),
    )
    .await;
    s.call(
        "shell::fs::write",
        json!({"files": [{"path": "batch1", "content": "changed\n"}, {"path": "batch2", "content": "new\n"}]}),
    )
    .await;
    s.call(
        "shell::fs::sed",
        json!({"path": "sed.txt", "pattern": "colour", "replacement": "color"}),
    )
    .await;
    // A failed entry changes nothing and is not recorded.
    let out = s
        .call(
            "coder::create-file",
            json!({"files": [{"path": "src/lib.rs", "content": "no"}]}),
        )
        .await;
    assert_eq!(out["results"][0]["success"], false, "{out}");
    // The sub-agent's call, hooked, lands in the top-level turn with its agent.
    let h = json!({"session_id": "sub1", "turn_id": "st1",
        "metadata": {"parent_session_id": "s1", "parent_turn_id": "t1", "subagent_display": {"name": "helper"}},
        "call": {"function_id": "coder::create-file", "arguments": {"files": [{"path": "sub.txt", "content": "s"}]}}});
    s.call("shell::turns::on-pre-trigger", h.clone()).await;
    c(
        "coder::create-file",
        json!({"files": [{"path": "sub.txt", "content": "from the sub-agent\n"}]}),
    )
    .await;
    let mut post = h;
    post["result"] = json!({"is_error": false});
    s.call("shell::turns::on-post-trigger", post).await;
    s.call(
        "shell::turns::on-turn-completed",
        json!({"session_id": "sub1", "turn_id": "st1", "parent": {"session_id": "s1", "turn_id": "t1"}}),
    )
    .await;
    s.call(
        "shell::turns::on-turn-completed",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    // After the turn: not in it.
    std::fs::write(s.root.join("late.txt"), "x").unwrap();
    s.call("coder::delete-file", json!({"paths": ["late.txt"]}))
        .await;
    assert_ne!(hashes(&s.root), before);
    assert!(s
        .call("shell::turns::list", json!({"session_id": "sub1"}))
        .await["turns"]
        .as_array()
        .unwrap()
        .is_empty());

    let list = s
        .call("shell::turns::list", json!({"session_id": "s1"}))
        .await;
    assert_eq!(list["turns"].as_array().unwrap().len(), 1, "{list}");
    let mut files: Vec<(String, String)> = list["turns"][0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let p = f["path"].as_str().unwrap();
            let rel = p.strip_prefix(&*s.root.to_string_lossy()).unwrap_or(p);
            (rel.to_string(), f["kind"].as_str().unwrap().to_string())
        })
        .collect();
    files.sort();
    let want: Vec<(String, String)> = [
        ("/batch1", "modified"),
        ("/batch2", "modified"),
        ("/bin.dat", "created"),
        ("/deep/er/n.txt", "created"),
        ("/over.txt", "moved"),
        ("/sed.txt", "modified"),
        ("/src/dead.rs", "deleted"),
        ("/src/lib.rs", "modified"),
        ("/src/new.rs", "created"),
        ("/sub.txt", "created"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(files, want, "{list}");
    let got = s
        .call("shell::turns::get", json!({"session_id": "s1"}))
        .await;
    let sub = got["turn"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with("/sub.txt"))
        .unwrap()
        .clone();
    assert_eq!(
        sub["agent"],
        json!({"session_id": "sub1", "name": "helper"}),
        "{sub}"
    );
    let lib = got["turn"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with("/src/lib.rs"))
        .unwrap()
        .clone();
    assert_eq!(lib["cause"], "coder::update-file");
    assert_eq!(lib["before"]["content"], "fn one() {}\n");

    let rv = s
        .call(
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1"}),
        )
        .await;
    assert_eq!(
        (rv["reverted"].clone(), rv["failed"].clone()),
        (json!(10), json!(0)),
        "{rv}"
    );
    // The directories the creates made are removed with the files.
    assert!(!s.root.join("deep").exists(), "{rv}");
    assert_eq!(hashes(&s.root), before, "{rv}");
}

/// `turns.max_blob_bytes` through the engine: the second turn's pre-image takes the store
/// past the cap, the oldest turn's body is evicted (`stored: false`), and its revert fails
/// with an error and changes nothing, while the newer turn still reverts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_blob_cap_the_oldest_turns_bodies_go_and_their_revert_fails_cleanly() {
    let s = setup_with(|c| c.turns.max_blob_bytes = 1000).await;
    let (a0, b0) = ("a".repeat(600), "b".repeat(600));
    std::fs::write(s.root.join("a.txt"), &a0).unwrap();
    std::fs::write(s.root.join("b.txt"), &b0).unwrap();
    for (turn, file) in [("t1", "a.txt"), ("t2", "b.txt")] {
        s.call(
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": turn}),
        )
        .await;
        s.call(
            "shell::fs::write",
            json!({"path": file, "content": format!("{turn} wrote this\n")}),
        )
        .await;
        s.call(
            "shell::turns::on-turn-completed",
            json!({"session_id": "s1", "turn_id": turn}),
        )
        .await;
        // Blob mtimes order the eviction: keep the two turns apart on the clock.
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    }
    let get = |t: &'static str| {
        let s = &s;
        async move {
            s.call(
                "shell::turns::get",
                json!({"session_id": "s1", "turn_id": t}),
            )
            .await["turn"]["files"][0]["before"]
                .clone()
        }
    };
    // TURNS-10: newest first.
    let list = s
        .call("shell::turns::list", json!({"session_id": "s1"}))
        .await;
    let ids: Vec<&str> = list["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["turn_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["t2", "t1"], "{list}");
    // TURNS-11: no turn_id is the newest; a session with none is null.
    let newest = s
        .call("shell::turns::get", json!({"session_id": "s1"}))
        .await;
    assert_eq!(newest["turn"]["turn_id"], "t2");
    let none = s
        .call("shell::turns::get", json!({"session_id": "nobody"}))
        .await;
    assert_eq!(none, json!({"session_id": "nobody", "turn": null}));
    let b1 = get("t1").await;
    assert_eq!(b1["stored"], false, "{b1}");
    assert!(
        b1["revision"].as_str().unwrap().starts_with("sha256:"),
        "{b1}"
    );
    assert!(b1.get("content").is_none_or(Value::is_null), "{b1}");
    let b2 = get("t2").await;
    assert_eq!(
        (b2["stored"].clone(), b2["content"].clone()),
        (json!(true), json!(b0))
    );
    let after = hashes(&s.root);
    let rv = s
        .call(
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1"}),
        )
        .await;
    assert_eq!(
        (rv["reverted"].clone(), rv["failed"].clone()),
        (json!(0), json!(1)),
        "{rv}"
    );
    assert_eq!(rv["results"][0]["success"], false);
    assert_eq!(rv["results"][0]["action"], "restored");
    let err = rv["results"][0]["error"].as_str().unwrap();
    assert!(
        err.contains("stored: false") && err.contains("not reverting"),
        "{err}"
    );
    assert_eq!(hashes(&s.root), after, "a failed revert changes nothing");
    let rv = s
        .call(
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t2"}),
        )
        .await;
    assert_eq!(rv["reverted"], 1, "{rv}");
    assert_eq!(std::fs::read_to_string(s.root.join("b.txt")).unwrap(), b0);
    assert_eq!(
        std::fs::read_to_string(s.root.join("a.txt")).unwrap(),
        "t1 wrote this\n"
    );
}

/// The session `coder::*` changes made while no turn is open are recorded under.
const OUTSIDE_TURNS: &str = "shell.outside-turns";

impl Setup {
    /// SIGKILLs the executor and waits for the supervisor's new one to answer.
    async fn restart_executor(&self) {
        let pid = self.worker.executor_pid().expect("executor");
        kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
        self.worker.wait_executor(Some(pid)).await;
        // The supervisor first kills what the dead executor left, then starts the new one and
        // hands it to the broker: until then calls answer S216 ("the executor went away").
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match self
                .harness
                .call("shell::turns::list", json!({"session_id": "-"}))
                .await
            {
                Ok(_) => return,
                Err(e) if e.code == "S216" && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await
                }
                Err(e) => panic!("after the restart: {e:?}; {}", self.worker.stderr()),
            }
        }
    }

    /// `coder::change-diff` of `id`: the diff, or the error code.
    async fn change_diff(&self, id: &str) -> Result<Value, String> {
        self.harness
            .call("coder::change-diff", json!({"change_id": id}))
            .await
            .map_err(|e| e.code)
    }
}

/// The turn record of `path` (a suffix) in `get`'s answer.
fn file_of(got: &Value, path: &str) -> Value {
    got["turn"]["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no files: {got}"))
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with(path))
        .unwrap_or_else(|| panic!("{path} is not in the turn: {got}"))
        .clone()
}

/// `coder::change-diff` is a view of the turn store's records, not a history of its own: the
/// id of each change a turn made is in that turn's record (the `after_revision` of a create or
/// an update; a deletion's path), and its diff is there as long as the record is — across an
/// executor restart too, which left the turn listed but every change id unknown (C211).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_diff_ids_resolve_through_the_turn_record_and_survive_an_executor_restart() {
    let s = setup().await;
    std::fs::write(s.root.join("a.txt"), "one\n").unwrap();
    std::fs::write(s.root.join("gone.txt"), "bye\n").unwrap();
    s.call(
        "shell::turns::on-turn-started",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    s.call(
        "coder::update-file",
        json!({"files": [{"path": "a.txt", "ops": [{"op": "insert", "at_line": 2, "content": "two\n"}]}]}),
    )
    .await;
    let updated = s.call("coder::read-file", json!({"path": "a.txt"})).await["revision"]
        .as_str()
        .unwrap()
        .to_string();
    let created = s
        .call(
            "coder::create-file",
            json!({"files": [{"path": "n.txt", "content": "new\n"}]}),
        )
        .await["results"][0]["revision"]
        .as_str()
        .unwrap()
        .to_string();
    s.call("coder::delete-file", json!({"paths": ["gone.txt"]}))
        .await;
    let deleted = format!("deleted:{}", s.root.join("gone.txt").display());
    s.call(
        "shell::turns::on-turn-completed",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    let path = |f: &str| s.root.join(f).to_string_lossy().into_owned();
    let want = [
        (
            updated.clone(),
            json!({"path": path("a.txt"), "is_binary": false, "old_contents": "one\n", "new_contents": "one\ntwo\n"}),
        ),
        (
            created.clone(),
            json!({"path": path("n.txt"), "is_binary": false, "old_contents": "", "new_contents": "new\n"}),
        ),
        (
            deleted.clone(),
            json!({"path": path("gone.txt"), "is_binary": false, "old_contents": "bye\n", "new_contents": ""}),
        ),
    ];
    // The same change ids are in the turn record.
    let check_turn = |got: Value| {
        assert_eq!(file_of(&got, "/a.txt")["after_revision"], updated, "{got}");
        assert_eq!(file_of(&got, "/n.txt")["after_revision"], created, "{got}");
        let g = file_of(&got, "/gone.txt");
        assert_eq!(
            (g["path"].as_str(), g["kind"].as_str()),
            (Some(&deleted["deleted:".len()..]), Some("deleted")),
            "{got}"
        );
    };
    check_turn(
        s.call(
            "shell::turns::get",
            json!({"session_id": "s1", "turn_id": "t1"}),
        )
        .await,
    );
    for (id, diff) in &want {
        assert_eq!(
            s.change_diff(id).await.as_ref(),
            Ok(diff),
            "{id} before the restart"
        );
    }
    s.restart_executor().await;
    check_turn(
        s.call(
            "shell::turns::get",
            json!({"session_id": "s1", "turn_id": "t1"}),
        )
        .await,
    );
    for (id, diff) in &want {
        assert_eq!(
            s.change_diff(id).await.as_ref(),
            Ok(diff),
            "{id} after the restart"
        );
    }
    assert_eq!(s.change_diff("sha256:nope").await, Err("C211".to_string()));
}

/// A write that left a file's bytes as they were is in neither history: the turn drops it,
/// and `coder::change-diff` has no change for its revision (it served one from a map of its
/// own, a change the turn history did not list).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_changed_nothing_is_in_neither_history() {
    let s = setup().await;
    std::fs::write(s.root.join("same.txt"), "same\n").unwrap();
    s.call(
        "shell::turns::on-turn-started",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    let out = s
        .call(
            "coder::create-file",
            json!({"files": [{"path": "same.txt", "content": "same\n", "overwrite": true}]}),
        )
        .await;
    assert_eq!(out["results"][0]["success"], true, "{out}");
    let list = s
        .call("shell::turns::list", json!({"session_id": "s1"}))
        .await;
    assert_eq!(list["turns"][0]["file_count"], 0, "{list}");
    let id = out["results"][0]["revision"].as_str().unwrap();
    assert_eq!(s.change_diff(id).await, Err("C211".to_string()));
}

/// Past `turns.max_blob_bytes` a change's diff goes with its turn's bodies: the turn record
/// reads `stored: false` and `coder::change-diff` is C211 for the same change, while the newer
/// turn's record and diff are both still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_blob_cap_a_change_diff_is_gone_exactly_when_its_turn_body_is() {
    let s = setup_with(|c| c.turns.max_blob_bytes = 1000).await;
    std::fs::write(s.root.join("a.txt"), "a".repeat(600)).unwrap();
    std::fs::write(s.root.join("b.txt"), "b".repeat(600)).unwrap();
    let mut ids = Vec::new();
    for (turn, file) in [("t1", "a.txt"), ("t2", "b.txt")] {
        s.call(
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": turn}),
        )
        .await;
        let out = s
            .call(
                "coder::create-file",
                json!({"files": [{"path": file, "content": format!("{turn}\n"), "overwrite": true}]}),
            )
            .await;
        ids.push(out["results"][0]["revision"].as_str().unwrap().to_string());
        assert!(s.change_diff(&ids[ids.len() - 1]).await.is_ok());
        s.call(
            "shell::turns::on-turn-completed",
            json!({"session_id": "s1", "turn_id": turn}),
        )
        .await;
        // Blob mtimes order the eviction: keep the two turns apart on the clock.
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    }
    let get = |t: &'static str| {
        let s = &s;
        async move {
            s.call(
                "shell::turns::get",
                json!({"session_id": "s1", "turn_id": t}),
            )
            .await
        }
    };
    let t1 = get("t1").await;
    assert_eq!(file_of(&t1, "/a.txt")["after_revision"], ids[0], "{t1}");
    assert_eq!(file_of(&t1, "/a.txt")["before"]["stored"], false, "{t1}");
    assert_eq!(s.change_diff(&ids[0]).await, Err("C211".to_string()));
    let t2 = get("t2").await;
    assert_eq!(file_of(&t2, "/b.txt")["before"]["stored"], true, "{t2}");
    assert_eq!(
        s.change_diff(&ids[1])
            .await
            .map(|d| d["new_contents"].clone()),
        Ok(json!("t2\n"))
    );
}

/// A `coder::*` change made while no turn is open (no harness, or between turns) is recorded
/// as a one-call turn of the session `shell.outside-turns`: listed there with its change id,
/// its diff served from that record, revertable, and kept across a restart. A call that changed
/// nothing leaves no turn behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coder_changes_outside_a_turn_are_one_call_turns_of_the_outside_turns_session() {
    let s = setup().await;
    std::fs::write(s.root.join("kept.txt"), "kept\n").unwrap();
    let before = hashes(&s.root);
    let id = s
        .call(
            "coder::create-file",
            json!({"files": [{"path": "x.txt", "content": "x\n"}]}),
        )
        .await["results"][0]["revision"]
        .as_str()
        .unwrap()
        .to_string();
    // Refused (exists, no overwrite): changes nothing, records nothing.
    let out = s
        .call(
            "coder::create-file",
            json!({"files": [{"path": "kept.txt", "content": "no\n"}]}),
        )
        .await;
    assert_eq!(out["results"][0]["success"], false, "{out}");
    let list = s
        .call("shell::turns::list", json!({"session_id": OUTSIDE_TURNS}))
        .await;
    let turns = list["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 1, "{list}");
    assert_eq!(
        turns[0]["files"],
        json!([{"path": s.root.join("x.txt").to_string_lossy(), "kind": "created"}]),
        "{list}"
    );
    let turn_id = turns[0]["turn_id"].as_str().unwrap().to_string();
    let got = s
        .call(
            "shell::turns::get",
            json!({"session_id": OUTSIDE_TURNS, "turn_id": turn_id}),
        )
        .await;
    assert_eq!(file_of(&got, "/x.txt")["after_revision"], id, "{got}");
    assert_eq!(
        file_of(&got, "/x.txt")["cause"],
        "coder::create-file",
        "{got}"
    );
    assert!(got["turn"]["ended_at"].is_u64(), "{got}");
    assert_eq!(
        s.change_diff(&id).await.map(|d| d["new_contents"].clone()),
        Ok(json!("x\n"))
    );
    s.restart_executor().await;
    assert_eq!(
        s.change_diff(&id).await.map(|d| d["new_contents"].clone()),
        Ok(json!("x\n"))
    );
    let rv = s
        .call(
            "shell::turns::revert",
            json!({"session_id": OUTSIDE_TURNS, "turn_id": turn_id}),
        )
        .await;
    assert_eq!(rv["reverted"], 1, "{rv}");
    assert_eq!(hashes(&s.root), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_continue_on_payloads_they_cannot_use() {
    let s = setup().await;
    // Payloads that record nothing (no session, not an object) still continue.
    let out = s
        .call("shell::turns::on-pre-trigger", json!({"garbage": true}))
        .await;
    assert_eq!(out, json!({"decision": "continue"}));
    let bad = s.harness.call("shell::turns::list", json!({})).await;
    assert_code(&bad, "S210");
}

/// TURNS-06 through the engine: a hook input that does not fit `HookInput` (a wrong type, a
/// `call` without `function_id`, not an object, an id over 256 bytes) is answered
/// `{"decision": "continue"}` — a hook never blocks the agent's call — and records nothing.
/// A turn event that does not fit `TurnEvent`, or names an id over 256 bytes, is S210 naming
/// the field, and opens nothing; so is a history request with an over-long id. Ids of 256
/// bytes pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_hooks_continue_and_bad_turn_events_are_s210_naming_the_field() {
    let s = setup().await;
    let long = "x".repeat(257);
    s.call(
        "shell::turns::on-turn-started",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    std::fs::write(s.root.join("x"), "x").unwrap();
    for (function, payload) in [
        (
            "shell::turns::on-pre-trigger",
            json!({"session_id": 5, "turn_id": "t1"}),
        ),
        (
            "shell::turns::on-post-trigger",
            json!({"session_id": "s1", "turn_id": "t1", "call": {"arguments": {"path": "x"}}}),
        ),
        ("shell::turns::on-post-trigger", json!("not even an object")),
        ("shell::turns::on-pre-trigger", json!([1, 2])),
        ("shell::turns::on-post-trigger", json!(null)),
        (
            "shell::turns::on-pre-trigger",
            json!({"call": {"function_id": 7}}),
        ),
        (
            "shell::turns::on-pre-trigger",
            json!({"session_id": "s1", "turn_id": long, "call": {"function_id": "shell::fs::write", "arguments": {"path": "x"}}}),
        ),
    ] {
        let out = s.call(function, payload.clone()).await;
        assert_eq!(out, json!({"decision": "continue"}), "{function} {payload}");
    }
    let listed = s
        .call("shell::turns::list", json!({"session_id": "s1"}))
        .await;
    assert_eq!(listed["turns"][0]["file_count"], 0, "{listed}");
    let too_long = "'turn_id' is 257 bytes; it may be at most 256 bytes";
    for (function, payload, message) in [
        (
            "shell::turns::on-turn-started",
            json!({"session_id": "bad", "turn_id": ["t1"]}),
            "malformed payload: turn_id: invalid type: sequence, expected a string",
        ),
        (
            "shell::turns::on-turn-completed",
            json!({"session_id": "s1", "parent": "p"}),
            "malformed payload: parent: invalid type: string \"p\", expected struct ParentRef",
        ),
        (
            "shell::turns::on-turn-started",
            json!({"session_id": "bad", "turn_id": long}),
            too_long,
        ),
        (
            "shell::turns::get",
            json!({"session_id": "s1", "turn_id": long}),
            too_long,
        ),
        (
            "shell::turns::list",
            json!({"session_id": long}),
            "'session_id' is 257 bytes; it may be at most 256 bytes",
        ),
    ] {
        let r = s.harness.call(function, payload.clone()).await;
        assert_code(&r, "S210");
        let e = r.unwrap_err();
        assert_eq!(e.message, message, "{function} {payload}");
    }
    // The refused turn-started opened nothing; an id at the bound is served.
    let listed = s
        .call("shell::turns::list", json!({"session_id": "bad"}))
        .await;
    assert_eq!(listed["turns"], json!([]), "{listed}");
    let at_bound = s
        .call("shell::turns::list", json!({"session_id": "s".repeat(256)}))
        .await;
    assert_eq!(at_bound["turns"], json!([]), "{at_bound}");
}

/// The caller's `fs_scope` (invocation metadata) confines what the history serves: a body
/// recorded outside its `scope_root` reads in `shell::turns::get` like one no longer kept
/// (`stored: false`, no content), `shell::turns::revert` writes nothing there, and
/// `coder::change-diff` of a change there is C211 with the message of an unknown id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_fs_scope_confines_get_revert_and_change_diff() {
    let s = setup().await;
    std::fs::write(s.root.join("top.txt"), "top\n").unwrap();
    std::fs::write(s.root.join("src/in.txt"), "in\n").unwrap();
    s.call(
        "shell::turns::on-turn-started",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    let mut ids = Vec::new();
    for f in ["top.txt", "src/in.txt"] {
        let out = s
            .call(
                "coder::create-file",
                json!({"files": [{"path": f, "content": "changed\n", "overwrite": true}]}),
            )
            .await;
        ids.push(out["results"][0]["revision"].as_str().unwrap().to_string());
    }
    let src = s.root.join("src").to_string_lossy().into_owned();
    let scope = json!({"fs_scope": {"scope_root": src}});
    let got = s
        .harness
        .call_with_metadata(
            "shell::turns::get",
            json!({"session_id": "s1"}),
            scope.clone(),
        )
        .await
        .unwrap();
    let top = file_of(&got, "/top.txt")["before"].clone();
    assert_eq!(
        (&top["stored"], top.get("content")),
        (&json!(false), None),
        "{got}"
    );
    assert_eq!(file_of(&got, "/src/in.txt")["before"]["content"], "in\n");
    // Unscoped, both bodies are there.
    let all = s
        .call("shell::turns::get", json!({"session_id": "s1"}))
        .await;
    assert_eq!(file_of(&all, "/top.txt")["before"]["content"], "top\n");
    let unknown = s
        .harness
        .call("coder::change-diff", json!({"change_id": "sha256:0"}))
        .await
        .unwrap_err();
    // Both files were left "changed\n": one id, its newest change (in src) is in scope.
    assert_eq!(ids[0], ids[1]);
    let top_id = format!("deleted:{}", s.root.join("top.txt").display());
    s.call("coder::delete-file", json!({"paths": ["top.txt"]}))
        .await;
    let scoped_diff = |id: String| {
        let (h, scope) = (&s.harness, scope.clone());
        async move {
            h.call_with_metadata("coder::change-diff", json!({"change_id": id}), scope)
                .await
        }
    };
    assert!(s.change_diff(&top_id).await.is_ok());
    let e = scoped_diff(top_id.clone()).await.unwrap_err();
    assert_eq!(e.code, "C211");
    assert_eq!(e.message, unknown.message.replace("sha256:0", &top_id));
    assert!(scoped_diff(ids[1].clone()).await.is_ok());
    let rv = s
        .harness
        .call_with_metadata(
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1", "force": true}),
            scope,
        )
        .await
        .unwrap();
    assert!(!s.root.join("top.txt").exists(), "not written: {rv}");
    assert_eq!(
        std::fs::read_to_string(s.root.join("src/in.txt")).unwrap(),
        "in\n"
    );
}

/// The history functions' requests are typed too: a field of the wrong type is S210 naming
/// it, never a default put in its place (a `force: "yes"` is not read as `false`, a numeric
/// `turn_id` is not read as "the newest turn").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_history_requests_are_s210_naming_the_field() {
    let s = setup().await;
    for (function, payload, message) in [
        (
            "shell::turns::list",
            json!({}),
            "malformed payload: missing field `session_id`",
        ),
        (
            "shell::turns::get",
            json!({"session_id": "s1", "turn_id": 3}),
            "malformed payload: turn_id: invalid type: integer `3`, expected a string",
        ),
        (
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1", "force": "yes"}),
            "malformed payload: force: invalid type: string \"yes\", expected a boolean",
        ),
        (
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1", "paths": "/a"}),
            "malformed payload: paths: invalid type: string \"/a\", expected a sequence",
        ),
        (
            "shell::turns::adopt-root",
            json!({"session_id": "s1", "turn_id": "t1"}),
            "malformed payload: missing field `root`",
        ),
        (
            "shell::turns::get",
            json!(["s1"]),
            "the request must be an object",
        ),
    ] {
        let r = s.harness.call(function, payload.clone()).await;
        assert_code(&r, "S210");
        let e = r.unwrap_err();
        assert_eq!(e.message, message, "{function} {payload}");
    }
    // The well-formed spelling of the same requests is served.
    let got = s
        .call(
            "shell::turns::get",
            json!({"session_id": "s1", "turn_id": null}),
        )
        .await;
    assert_eq!(got, json!({"session_id": "s1", "turn": null}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hooks_are_bound_with_the_hyphenated_names_and_fail_open() {
    let s = setup().await;
    let want = [
        ("harness::hook::pre-trigger", "shell::turns::on-pre-trigger"),
        (
            "harness::hook::post-trigger",
            "shell::turns::on-post-trigger",
        ),
        ("harness::turn-started", "shell::turns::on-turn-started"),
        ("harness::turn-completed", "shell::turns::on-turn-completed"),
    ];
    let ok = s
        .engine
        .wait_until(WAIT, |e| {
            let t = e.triggers();
            want.iter().all(|(ty, f)| {
                t.iter()
                    .any(|b| b.trigger_type == *ty && b.function_id == *f)
            })
        })
        .await;
    assert!(ok, "{:?}", s.engine.triggers());
    for b in s.engine.triggers() {
        if b.trigger_type.starts_with("harness::hook::") {
            assert_eq!(b.config["on_error"], "fail_open");
            assert_eq!(b.config["functions"], json!(["shell::*", "coder::*"]));
        }
        assert!(
            !b.trigger_type.contains('_'),
            "underscore ids never fire: {}",
            b.trigger_type
        );
    }
}

/// TURNS-06 and the executor's own recording: a turn store that cannot be opened (its
/// directory is a file) blocks nothing — the hooks continue, the turn event says `ok: false`,
/// and fs and coder calls made while the turn is open succeed, with an ERROR logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_turn_store_blocks_no_call() {
    let blocker = tempfile::NamedTempFile::new().unwrap();
    let path = blocker.path().to_string_lossy().into_owned();
    let s = setup_with(|c| c.turns.data_dir = path).await;
    let ok = s
        .call(
            "shell::turns::on-turn-started",
            json!({"session_id": "s1", "turn_id": "t1"}),
        )
        .await;
    assert_eq!(ok, json!({"ok": false}));
    s.hooked(
        "shell::fs::write",
        json!({"path": "a.txt", "content": "written anyway\n"}),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(s.root.join("a.txt")).unwrap(),
        "written anyway\n"
    );
    let v = s
        .call(
            "coder::create-file",
            json!({"files": [{"path": "b.txt", "content": "b\n"}]}),
        )
        .await;
    assert_eq!(v["results"][0]["success"], true, "{v}");
    s.worker
        .expect_log("cannot keep the pre-images of a call in the open turn")
        .await;
}

/// Every entry below `root`: relative path → type, mode and content hash (a symlink by its
/// target), so a revert that loses a directory, a mode or a link shows as a difference.
fn full_tree(root: &Path) -> BTreeMap<String, String> {
    use std::os::unix::fs::PermissionsExt;
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let mode = m.permissions().mode() & 0o7777;
            let v = if m.file_type().is_symlink() {
                format!("link->{}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                walk(&p, root, out);
                format!("dir {mode:o}")
            } else {
                let bytes = std::fs::read(&p).unwrap();
                format!("file {mode:o} {}", iii_shell_test_sha(&bytes))
            };
            out.insert(rel, v);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn iii_shell_test_sha(bytes: &[u8]) -> String {
    let sum: u64 = bytes
        .iter()
        .enumerate()
        .fold(1469598103934665603u64, |h, (i, b)| {
            (h ^ (*b as u64 + i as u64)).wrapping_mul(1099511628211)
        });
    format!("{sum:x}:{}", bytes.len())
}

/// Recursive and structural changes: `rm -r` of a nested tree holding a 0600 file,
/// an empty directory and a symlink; `sed` over a tree; `mkdir -p` then a write inside;
/// `chmod` of a file and a directory. After revert the whole tree (entry set, types, modes,
/// contents, link targets) is what it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recursive_and_structural_changes_revert_to_an_identical_tree() {
    use std::os::unix::fs::PermissionsExt;
    let s = setup().await;
    let r = &s.root;
    std::fs::create_dir_all(r.join("gone/a/b")).unwrap();
    std::fs::create_dir_all(r.join("gone/empty")).unwrap();
    std::fs::write(r.join("gone/top.txt"), "top\n").unwrap();
    std::fs::write(r.join("gone/a/secret"), "only me\n").unwrap();
    std::fs::set_permissions(r.join("gone/a/secret"), PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::write(r.join("gone/a/b/deep.bin"), [0u8, 1, 2, 0xff]).unwrap();
    std::fs::set_permissions(r.join("gone/a/b"), PermissionsExt::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink("../top.txt", r.join("gone/a/link")).unwrap();
    std::fs::create_dir_all(r.join("cgone/x")).unwrap();
    std::fs::write(r.join("cgone/x/y.txt"), "coder deletes me\n").unwrap();
    std::fs::write(r.join("cgone/z.txt"), "me too\n").unwrap();
    std::fs::set_permissions(r.join("cgone/z.txt"), PermissionsExt::from_mode(0o640)).unwrap();
    std::fs::create_dir_all(r.join("src/m")).unwrap();
    std::fs::write(r.join("src/m/one.rs"), "colour\n").unwrap();
    std::fs::write(r.join("src/two.rs"), "colour colour\n").unwrap();
    std::fs::write(r.join("src/three.rs"), "no match\n").unwrap();
    std::fs::write(r.join("mode.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(r.join("mode.sh"), PermissionsExt::from_mode(0o644)).unwrap();
    let before = full_tree(r);

    s.call(
        "shell::turns::on-turn-started",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    s.call("shell::fs::rm", json!({"path": "gone", "recursive": true}))
        .await;
    assert!(!r.join("gone").exists());
    let del = s
        .call(
            "coder::delete-file",
            json!({"paths": ["cgone"], "recursive": true}),
        )
        .await;
    assert!(!r.join("cgone").exists(), "{del}");
    let sed = s
        .call(
            "shell::fs::sed",
            json!({"path": "src", "recursive": true, "pattern": "colour", "replacement": "color"}),
        )
        .await;
    assert_eq!(
        std::fs::read_to_string(r.join("src/m/one.rs")).unwrap(),
        "color\n",
        "{sed}"
    );
    s.call(
        "shell::fs::mkdir",
        json!({"path": "made/x/y", "parents": true}),
    )
    .await;
    s.call(
        "shell::fs::write",
        json!({"path": "made/x/y/f.txt", "content": "new\n"}),
    )
    .await;
    s.call(
        "shell::fs::write",
        json!({"path": "also/made/g.txt", "content": "new\n", "parents": true}),
    )
    .await;
    s.call(
        "shell::fs::chmod",
        json!({"path": "mode.sh", "mode": "0755"}),
    )
    .await;
    s.call("shell::fs::chmod", json!({"path": "src/m", "mode": "0700"}))
        .await;
    s.call(
        "shell::turns::on-turn-completed",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    assert_ne!(full_tree(r), before);

    let got = s
        .call(
            "shell::turns::get",
            json!({"session_id": "s1", "turn_id": "t1"}),
        )
        .await;
    let files: Vec<&str> = got["turn"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    for want in [
        "gone/top.txt",
        "gone/a/secret",
        "gone/a/b/deep.bin",
        "src/m/one.rs",
        "src/two.rs",
    ] {
        assert!(
            files.iter().any(|f| f.ends_with(want)),
            "{want} not recorded: {got}"
        );
    }
    assert!(
        !files.iter().any(|f| f.ends_with("src/three.rs")),
        "a file sed left alone is not in the turn: {got}"
    );

    let rv = s
        .call(
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1"}),
        )
        .await;
    assert_eq!(rv["failed"], 0, "{rv}");
    assert_eq!(full_tree(r), before, "{rv}");
}

/// `shell::turns::sessions` through the engine: registered with its schemas, the sessions
/// with recorded turns newest first (by the last change to their history), each with the
/// turn count and the first and last turn's start `shell::turns::list` shows, a session whose
/// log stem is a hash under its own id, pages that follow `next_cursor`, a session that gets
/// a new turn moving to the top, and bad requests refused with S210.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_lists_the_sessions_with_turns_newest_first_with_counts_and_times() {
    let s = setup().await;
    let f = s
        .engine
        .function("shell::turns::sessions")
        .expect("shell::turns::sessions is registered");
    let req = f.request_format.clone().unwrap_or_default();
    assert_eq!(
        req["properties"]["limit"]["type"],
        json!(["integer", "null"]),
        "{req}"
    );
    assert_eq!(
        req["properties"]["cursor"]["type"],
        json!(["string", "null"]),
        "{req}"
    );
    assert_eq!(
        (
            &req["properties"]["limit"]["minimum"],
            &req["properties"]["limit"]["maximum"]
        ),
        (&json!(1), &json!(200)),
        "{req}"
    );
    let resp = f.response_format.clone().unwrap_or_default();
    assert_eq!(resp["required"], json!(["sessions"]), "{resp}");

    let empty = s.call("shell::turns::sessions", json!({})).await;
    assert_eq!(empty, json!({"sessions": []}));

    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let t0 = now();
    let turn = |sid: &'static str, tid: &'static str, title: &'static str| {
        let s = &s;
        async move {
            s.call(
                "shell::turns::on-turn-started",
                json!({"session_id": sid, "turn_id": tid, "message_preview": title}),
            )
            .await;
            s.call(
                "shell::turns::on-turn-completed",
                json!({"session_id": sid, "turn_id": tid}),
            )
            .await;
        }
    };
    // File times move with the kernel's clock tick: keep the sessions' last writes apart.
    let tick = || tokio::time::sleep(std::time::Duration::from_millis(30));
    turn("s-old", "o1", "first of old").await;
    turn("s-old", "o2", "second of old").await;
    tick().await;
    turn("chat 2/with spaces", "c1", "hashed").await;
    tick().await;
    turn("s-new", "n1", "newest").await;
    let t1 = now();

    let got = s.call("shell::turns::sessions", json!({})).await;
    let sessions = got["sessions"].as_array().unwrap().clone();
    let ids: Vec<&str> = sessions
        .iter()
        .map(|x| x["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["s-new", "chat 2/with spaces", "s-old"], "{got}");
    let counts: Vec<u64> = sessions
        .iter()
        .map(|x| x["turn_count"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [1, 1, 2]);
    assert!(got.get("next_cursor").is_none(), "{got}");
    let mut keys: Vec<&str> = sessions[2]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "first_started_at",
            "last_started_at",
            "last_title",
            "session_id",
            "turn_count",
            "updated_at"
        ]
    );
    let updated: Vec<u64> = sessions
        .iter()
        .map(|x| x["updated_at"].as_u64().unwrap())
        .collect();
    assert!(
        updated[0] > updated[1] && updated[1] > updated[2],
        "{updated:?}"
    );
    // The file clock is the kernel's coarse one: a tick behind the precise clock at most.
    assert!(
        updated.iter().all(|u| *u + 20 >= t0 && *u <= t1),
        "{updated:?} not in {t0}..{t1}"
    );
    // Each session's times and title are what shell::turns::list shows for it.
    for x in &sessions {
        let list = s
            .call("shell::turns::list", json!({"session_id": x["session_id"]}))
            .await;
        let turns = list["turns"].as_array().unwrap();
        assert_eq!(
            turns.len() as u64,
            x["turn_count"].as_u64().unwrap(),
            "{list}"
        );
        assert_eq!(x["last_started_at"], turns[0]["started_at"], "{x} {list}");
        assert_eq!(
            x["first_started_at"],
            turns[turns.len() - 1]["started_at"],
            "{x} {list}"
        );
        assert_eq!(x["last_title"], turns[0]["title"], "{x} {list}");
        assert!(x["first_started_at"].as_u64().unwrap() >= t0);
    }
    assert_eq!(sessions[2]["last_title"], "second of old");
    assert!(sessions[2]["first_started_at"].as_u64() < sessions[2]["last_started_at"].as_u64());

    // Pages of two, then the rest.
    let p1 = s.call("shell::turns::sessions", json!({"limit": 2})).await;
    assert_eq!(p1["sessions"], json!(sessions[..2]), "{p1}");
    let cursor = p1["next_cursor"].as_str().expect("a next page").to_string();
    let p2 = s
        .call(
            "shell::turns::sessions",
            json!({"limit": 2, "cursor": cursor}),
        )
        .await;
    assert_eq!(p2, json!({"sessions": [sessions[2]]}));

    // A new turn in the oldest session takes it to the top.
    tick().await;
    turn("s-old", "o3", "third of old").await;
    let again = s.call("shell::turns::sessions", json!({"limit": 1})).await;
    assert_eq!(again["sessions"][0]["session_id"], "s-old", "{again}");
    assert_eq!(again["sessions"][0]["turn_count"], 3);
    assert_eq!(again["sessions"][0]["last_title"], "third of old");

    for bad in [
        json!({"limit": 0}),
        json!({"limit": 201}),
        json!({"limit": "2"}),
        json!({"cursor": "not a cursor"}),
        json!({"cursor": "1:../../etc/passwd"}),
        json!({"cursor": "9".repeat(100_000)}),
    ] {
        let r = s.harness.call("shell::turns::sessions", bad.clone()).await;
        assert_code(&r, "S210");
    }
}

/// TURNS-05, TURNS-15: a hooked call that failed (`is_error: true`, the file unchanged) leaves
/// the turn's record exactly as it was; reverting the turn a second time reports every file
/// `skipped` (a success), not `failed`, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_hooked_call_records_nothing_and_a_second_revert_skips() {
    let s = setup().await;
    std::fs::write(s.root.join("b.txt"), "b before\n").unwrap();
    let before = hashes(&s.root);
    s.call(
        "shell::turns::on-turn-started",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    s.hooked(
        "shell::fs::write",
        json!({"path": "a.txt", "content": "new\n"}),
    )
    .await;
    s.hooked(
        "shell::fs::write",
        json!({"path": "b.txt", "content": "b after\n"}),
    )
    .await;
    let recorded = s
        .call("shell::turns::get", json!({"session_id": "s1"}))
        .await;

    // A failed call on b.txt (create without overwrite): the file is unchanged.
    let args = json!({"files": [{"path": "b.txt", "content": "never", "overwrite": false}]});
    let h = json!({"session_id": "s1", "turn_id": "t1", "step": 3,
        "call": {"id": "fc3", "function_id": "coder::create-file", "arguments": args}});
    s.call("shell::turns::on-pre-trigger", h.clone()).await;
    let out = s.call("coder::create-file", args).await;
    assert_eq!(out["results"][0]["success"], false, "{out}");
    let mut post = h;
    post["result"] = json!({"is_error": true, "content": []});
    assert_eq!(
        s.call("shell::turns::on-post-trigger", post).await,
        json!({"decision": "continue"})
    );
    let after = s
        .call("shell::turns::get", json!({"session_id": "s1"}))
        .await;
    assert_eq!(after["turn"]["files"], recorded["turn"]["files"]);
    s.call(
        "shell::turns::on-turn-completed",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;

    let revert = json!({"session_id": "s1", "turn_id": "t1"});
    let rv = s.call("shell::turns::revert", revert.clone()).await;
    assert_eq!(
        (rv["reverted"].clone(), rv["failed"].clone()),
        (json!(2), json!(0)),
        "{rv}"
    );
    assert_eq!(hashes(&s.root), before);
    let again = s.call("shell::turns::revert", revert).await;
    assert_eq!(again["failed"], 0, "{again}");
    let results = again["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{again}");
    for r in results {
        assert_eq!(
            (r["action"].clone(), r["success"].clone()),
            (json!("skipped"), json!(true)),
            "{again}"
        );
        assert!(r.get("error").is_none(), "{again}");
    }
    assert_eq!(hashes(&s.root), before);
}
