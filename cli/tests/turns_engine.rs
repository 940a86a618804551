//! `shell::turns::*` end to end: `iii-shell serve` against the test engine, a second engine
//! connection playing the harness (turn events and the pre/post-trigger hooks around real
//! `shell::fs::*` calls). A turn that creates, modifies, deletes and moves files is reverted to
//! a byte-identical tree (every file hashed); an executor SIGKILLed mid-turn leaves a store
//! that opens, lists and reverts; the hooks always continue.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use iii_shell_protocol::config::Config;
use iii_test_engine::{TestClient, TestEngine};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use support::*;

struct Setup {
    engine: TestEngine,
    worker: Worker,
    harness: TestClient,
    _dir: tempfile::TempDir,
    root: PathBuf,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let root = base.join("root");
    std::fs::create_dir_all(root.join("src")).unwrap();
    let mut config: Config = jailed(&root);
    config.turns.data_dir = base.join("turns").to_string_lossy().into_owned();
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
    let before = hashes(&s.root);
    s.call(
        "shell::turns::on-turn-started",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    let h = json!({"session_id": "s1", "turn_id": "t1",
        "call": {"function_id": "shell::fs::write", "arguments": {"path": "a.txt", "content": "x"}}});
    s.call("shell::turns::on-pre-trigger", h).await;
    s.call(
        "shell::fs::write",
        json!({"path": "a.txt", "content": "agent wrote this\n"}),
    )
    .await;
    let pid = s.worker.executor_pid().expect("executor");
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    s.worker.wait_executor(Some(pid)).await;
    // The supervisor first kills what the dead executor left, then starts the new one and
    // hands it to the broker: until then calls answer S216 ("the executor went away").
    let deadline = std::time::Instant::now() + WAIT;
    let list = loop {
        match s
            .harness
            .call("shell::turns::list", json!({"session_id": "s1"}))
            .await
        {
            Ok(v) => break v,
            Err(e) if e.code == "S216" && std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            Err(e) => panic!("shell::turns::list: {e:?}; {}", s.worker.stderr()),
        }
    };
    // The respawned executor has no memory of the turn: only the store.
    assert_eq!(list["turns"][0]["files"][0]["kind"], "modified", "{list}");
    let got = s
        .call("shell::turns::get", json!({"session_id": "s1"}))
        .await;
    assert_eq!(got["turn"]["files"][0]["before"]["content"], "original\n");
    // No post-trigger was recorded, so there is no after-revision: revert asks for force.
    let rv = s
        .call(
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1"}),
        )
        .await;
    assert_eq!(rv["failed"], 1, "{rv}");
    let rv = s
        .call(
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1", "force": true}),
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
    let out = s
        .call("shell::turns::on-post-trigger", json!("not even an object"))
        .await;
    assert_eq!(out, json!({"decision": "continue"}));
    let bad = s.harness.call("shell::turns::list", json!({})).await;
    assert_code(&bad, "S210");
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
