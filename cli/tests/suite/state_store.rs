//! The worker's own state (turn store, pane store) against jailed commands, end to end:
//! `iii-shell serve` against the test engine, a jail next to an outside secret.
//!
//! * A `turns.data_dir` inside the root moves to the worker's state directory on start-up
//!   (once, with its history, said at INFO), private (0700/0600), and neither a command nor an
//!   fs or coder call reaches it there.
//! * When no state directory outside the roots exists, the store stays inside the root: then
//!   every link, hardlink and FIFO a command plants in it (at a session log, a blob bucket, a
//!   change-index bucket, a pane) is never followed, served, written through or waited on.

use crate::common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::s as sp;
use common::*;
use iii_shell_protocol::config::Config;
use iii_test_engine::{TestClient, TestEngine};
use serde_json::{json, Value};

struct Setup {
    _engine: TestEngine,
    worker: Worker,
    client: TestClient,
    jail: Jail,
    config: Config,
}

/// A file the root holds that `code.non_accessible_globs` protects (JSON, so a pane or a log
/// that served it would parse).
const PRIVATE: &str = r#"{"private":"in the root, never served"}"#;

fn private_json(j: &Jail) -> PathBuf {
    j.root.join("private.json")
}

/// A worker jailed to `jail.root` with `turns.data_dir` inside it; `env` for the worker.
async fn start(jail: Jail, env: &[(&str, &str)], tweak: impl FnOnce(&mut Config)) -> Setup {
    std::fs::write(private_json(&jail), PRIVATE).unwrap();
    let mut config = jail.config();
    config.code.non_accessible_globs = vec!["private.json".into()];
    config.turns.data_dir = sp(&jail.root.join("data/shell/turns"));
    tweak(&mut config);
    let engine = TestEngine::start().await;
    let mut b = Worker::builder().engine(&engine).seed(&config);
    for (k, v) in env {
        b = b.env(k, v);
    }
    let worker = b.start();
    wait_ready(&engine, &worker).await;
    let client = engine.client().await;
    Setup {
        _engine: engine,
        worker,
        client,
        jail,
        config,
    }
}

impl Setup {
    async fn call(&self, f: &str, v: Value) -> Result<Value, String> {
        // A call that never answers is a wedge: fail loudly rather than hang the suite.
        match tokio::time::timeout(Duration::from_secs(60), self.client.call(f, v.clone())).await {
            Ok(r) => r.map_err(|e| format!("{e:?}")),
            Err(_) => panic!("{f} {v} never answered; {}", self.worker.stderr()),
        }
    }

    async fn ok(&self, f: &str, v: Value) -> Value {
        let r = self.call(f, v.clone()).await;
        r.unwrap_or_else(|e| panic!("{f} {v}: {e}; {}", self.worker.stderr()))
    }

    /// Runs `script` as a jailed command (`sh -c`).
    async fn sh(&self, script: &str) -> Value {
        self.ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", script]}),
        )
        .await
    }

    async fn pane(&self, key: &str) -> Value {
        self.ok("shell::ui-state::get", json!({"key": key})).await["state"].clone()
    }
}

/// Where the worker keeps its state once it moved out of the root.
fn moved_place(config: &Config) -> PathBuf {
    let id = iii_shell_files::home::identity(config);
    worker_state_home().join("iii-shell").join(format!(
        "{:016x}",
        iii_shell_policy::home::fnv1a64(id.as_bytes())
    ))
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .mode()
        & 0o7777
}

/// A store an older version left inside the root: one session, one blob, one pane, all
/// readable by everyone.
fn legacy_store(root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let t = root.join("data/shell/turns");
    for d in ["sessions", "changes", "objects/ab"] {
        std::fs::create_dir_all(t.join(d)).unwrap();
    }
    std::fs::create_dir_all(root.join("data/shell/ui-state")).unwrap();
    let files = [
        (
            t.join("sessions/s0.jsonl"),
            "{\"t\":\"session\",\"session_id\":\"s0\"}\n{\"t\":\"start\",\"turn_id\":\"t0\",\"started_at\":1000}\n".to_string(),
        ),
        (t.join(format!("objects/ab/ab{}", "0".repeat(62))), "old body".into()),
        (root.join("data/shell/ui-state/p.json"), "{\"open\":[\"a.rs\"]}".into()),
    ];
    for (p, body) in &files {
        std::fs::write(p, body).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
}

/// Upgrade: a store inside the root is moved out once (INFO), keeps its history, is private,
/// and nothing a command or an fs / coder call can name reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_inside_the_root_moves_out_of_reach_with_its_history() {
    let jail = Jail::new();
    legacy_store(&jail.root);
    let s = start(jail, &[], |_| {}).await;
    let place = moved_place(&s.config);
    let (turns, ui) = (place.join("turns"), place.join("ui-state"));
    s.worker
        .expect_log("moved the turn store out of the commands' reach")
        .await;
    s.worker
        .expect_log("moved the pane store out of the commands' reach")
        .await;
    let root = s.jail.root.clone();
    assert!(!root.join("data/shell/turns").exists() && !root.join("data/shell/ui-state").exists());

    // The history is all there.
    let listed = s.ok("shell::turns::sessions", json!({})).await;
    assert_eq!(listed["sessions"][0]["session_id"], "s0", "{listed}");
    assert_eq!(s.pane("p").await, json!({"open": ["a.rs"]}));

    // Private: directories 0700, files 0600 (the old 0644 ones tightened).
    for d in [
        &place,
        &turns,
        &turns.join("sessions"),
        &turns.join("objects/ab"),
        &ui,
    ] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
    let blob = turns.join(format!("objects/ab/ab{}", "0".repeat(62)));
    for f in [&turns.join("sessions/s0.jsonl"), &blob, &ui.join("p.json")] {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    // New files too.
    s.ok(
        "shell::ui-state::set",
        json!({"key": "q", "state": {"x": 1}}),
    )
    .await;
    s.ok(
        "shell::turns::on-turn-started",
        json!({"session_id": "s9", "turn_id": "t1"}),
    )
    .await;
    assert_eq!(mode(&ui.join("q.json")), 0o600);
    assert_eq!(mode(&turns.join("sessions/s9.jsonl")), 0o600);

    // A jailed command cannot list, read or write it.
    let t = sp(&turns);
    let r = s
        .sh(&format!(
            "ls {t}/sessions; cat {t}/sessions/s0.jsonl; echo x >> {t}/sessions/s0.jsonl; ls {}",
            sp(&ui)
        ))
        .await;
    assert_eq!(r["stdout"], "", "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .matches("Permission denied")
            .count()
            >= 3,
        "{r}"
    );
    assert!(!std::fs::read_to_string(turns.join("sessions/s0.jsonl"))
        .unwrap()
        .contains('x'));

    // An fs or coder call reads it exactly like a missing path outside the root.
    let missing = "/no-such-dir-anywhere/s0.jsonl";
    let log = format!("{t}/sessions/s0.jsonl");
    for (f, arg) in [
        ("shell::fs::read", json!({"path": log})),
        ("shell::fs::ls", json!({"path": format!("{t}/sessions")})),
    ] {
        let e = s.call(f, arg.clone()).await.unwrap_err();
        let m = s.call(f, json!({"path": missing})).await.unwrap_err();
        assert_eq!(
            e.split("message").next(),
            m.split("message").next(),
            "{f}: {e} vs {m}"
        );
    }
    let a = s
        .call("coder::read-file", json!({"path": log}))
        .await
        .unwrap_err();
    let b = s
        .call("coder::read-file", json!({"path": missing}))
        .await
        .unwrap_err();
    assert_eq!(
        a.split("message").next(),
        b.split("message").next(),
        "{a} vs {b}"
    );
}

/// The planting script: symlinks and hardlinks of the outside secret and of the root's
/// protected file at a session log, a blob bucket, every change-index bucket and two panes,
/// and FIFOs at a session log and a pane.
fn plant(turns: &str, ui: &str, outside: &str, private: &str) -> String {
    format!(
        "set -e
mkdir -p {turns}/sessions {turns}/objects {turns}/changes {ui}
ln -s {outside}/secret.txt {turns}/sessions/s1.jsonl
ln {private} {turns}/sessions/s2.jsonl
mkfifo {turns}/sessions/s3.jsonl
ln -s {outside} {turns}/objects/00
for a in 0 1 2 3 4 5 6 7 8 9 a b c d e f; do for b in 0 1 2 3 4 5 6 7 8 9 a b c d e f; do
  ln -s {outside}/secret.txt {turns}/changes/$a$b.jsonl
done; done
ln -s {private} {ui}/sym.json
ln {private} {ui}/hard.json
mkfifo {ui}/fifo.json
echo planted"
    )
}

/// No state directory outside the roots: the store stays in the root, and what a command plants
/// there is never followed, served, written through or waited on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_and_fifos_a_command_plants_in_the_store_are_never_followed() {
    let jail = Jail::new();
    let home = jail.root.join("home");
    std::fs::create_dir_all(&home).unwrap();
    // The secret is old: an eviction that followed the planted bucket would take it first.
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    std::fs::File::options()
        .append(true)
        .open(jail.outside.join("secret.txt"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let s = start(jail, &[("HOME", &sp(&home)), ("XDG_STATE_HOME", "")], |c| {
        c.turns.max_blob_bytes = 16
    })
    .await;
    s.worker
        .expect_log("no state directory outside them was found")
        .await;
    let root = s.jail.root.clone();
    let (turns, ui) = (
        root.join("data/shell/turns"),
        root.join("data/shell/ui-state"),
    );
    let r = s
        .sh(&plant(
            &sp(&turns),
            &sp(&ui),
            &sp(&s.jail.outside),
            &sp(&private_json(&s.jail)),
        ))
        .await;
    assert_eq!(r["stdout"], "planted\n", "{r}");

    // Session logs: a symlink, a hardlink and a FIFO. Each call answers; none writes through.
    for session in ["s1", "s2", "s3"] {
        s.ok(
            "shell::turns::on-turn-started",
            json!({"session_id": session, "turn_id": "t1"}),
        )
        .await;
        s.ok("shell::turns::get", json!({"session_id": session}))
            .await;
    }
    s.ok("shell::turns::sessions", json!({})).await;
    // Blobs past the cap (16 bytes) evict, the change index is written: outside a turn, each
    // coder change keeps its bodies and indexes its id.
    for (i, body) in ["first body", "second body", "third body"]
        .iter()
        .enumerate()
    {
        let v = s
            .ok(
                "coder::create-file",
                json!({"files": [{"path": format!("f{i}.txt"), "content": body}]}),
            )
            .await;
        assert_eq!(v["results"][0]["success"], true, "{v}");
        let id = v["results"][0]["change_id"].clone();
        if id.is_string() {
            s.call("coder::change-diff", json!({"change_id": id}))
                .await
                .ok();
        }
    }
    // Panes: a symlink, a hardlink (of the root's protected file) and a FIFO read as nothing
    // stored; a write replaces the entry, never what it points to.
    for key in ["sym", "hard", "fifo"] {
        assert_eq!(s.pane(key).await, Value::Null, "{key} was served");
    }
    for key in ["sym", "hard", "fifo"] {
        s.ok(
            "shell::ui-state::set",
            json!({"key": key, "state": {"mine": 1}}),
        )
        .await;
        assert_eq!(s.pane(key).await, json!({"mine": 1}), "{key}");
    }

    s.jail.outside_untouched();
    assert_eq!(
        std::fs::read_to_string(private_json(&s.jail)).unwrap(),
        PRIVATE
    );

    // fs and coder calls read the store in the root exactly like a missing path.
    for (f, p) in [
        ("shell::fs::read", "data/shell/turns/sessions/s9.jsonl"),
        ("shell::fs::ls", "data/shell/turns/sessions"),
        ("shell::fs::read", "data/shell/ui-state/sym.json"),
        ("coder::read-file", "data/shell/ui-state/sym.json"),
    ] {
        let e = s.call(f, json!({"path": p})).await.unwrap_err();
        let m = s
            .call(f, json!({"path": "data/shell/no-such"}))
            .await
            .unwrap_err();
        assert_eq!(
            e.replace(p, "P"),
            m.replace("data/shell/no-such", "P"),
            "{f} {p}"
        );
    }
}
