//! The `shell::changed` trigger type end to end: `iii-shell serve` against the test engine,
//! a second engine connection binding the trigger and serving the bound function. Writes
//! through `shell::exec`, through an fs call and from outside the engine each arrive as one
//! coalesced event carrying the binding's metadata (and reaching the binding's namespace);
//! bursts stay bounded with no gap; unbinding stops the feed; bad bindings are refused, and
//! answered again when the engine offers them again.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use iii_shell_protocol::config::Config;
use iii_test_engine::{TestClient, TestEngine};
use serde_json::{json, Value};

type Seen = Arc<Mutex<Vec<(Value, Option<Value>)>>>;

struct Setup {
    engine: TestEngine,
    worker: Worker,
    /// Binds the trigger; its function lives in namespace `ns1`.
    binder: TestClient,
    /// Calls shell functions (namespace default).
    caller: TestClient,
    seen: Seen,
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

const TARGET: &str = "test::on-changed";

async fn setup(tweak: impl FnOnce(&mut Config)) -> Setup {
    setup_wrapped(tweak, &[]).await
}

/// The worker in its own user namespace (uids and gids 0-65535 mapped to the host's, so the
/// broker can still drop to `nobody`) whose inotify watch limit is `watches`:
/// `/proc/sys/user/max_inotify_watches` is per user namespace, so the host's limit and every
/// other process are untouched and nothing needs restoring. The outer shell `exec`s into
/// `unshare`, which `exec`s into the worker: the spawned pid stays the worker's. A background
/// subshell (still in the host namespace, with its privileges) writes the id maps once the
/// worker's pid has entered the new namespace; the shell there waits for them, then `exec`s a
/// fresh shell (root with capabilities in the namespace now that uid 0 is mapped) to set the
/// limit and `exec` the worker.
fn low_inotify_limit(watches: u32) -> Vec<String> {
    let inner = format!(
        r#"until grep -q . /proc/self/uid_map; do sleep 0.02; done; exec sh -c "echo {watches} > /proc/sys/user/max_inotify_watches && exec \"\$0\" \"\$@\"" "$0" "$@""#
    );
    let script = format!(
        r#"p=$$; me=$(readlink /proc/self/ns/user)
( while [ "$(readlink /proc/$p/ns/user)" = "$me" ]; do sleep 0.02; done
  echo "0 0 65536" > /proc/$p/uid_map; echo "0 0 65536" > /proc/$p/gid_map ) &
exec unshare -U sh -c '{inner}' "$0" "$@""#
    );
    vec!["sh".into(), "-c".into(), script]
}

async fn setup_wrapped(tweak: impl FnOnce(&mut Config), wrapper: &[String]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let root = base.join("root");
    let outside = base.join("outside");
    std::fs::create_dir_all(root.join("secrets")).unwrap();
    std::fs::create_dir_all(root.join("private")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(root.join("plain.txt"), "x").unwrap();
    let mut config = jailed(&root);
    config
        .fs
        .denylist_paths
        .push(root.join("private").to_string_lossy().into_owned());
    tweak(&mut config);
    let engine = TestEngine::start().await;
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let worker = Worker::builder()
        .engine(&engine)
        .fast_keepalive()
        .seed(&config)
        .wrapper(&wrapper)
        .start();
    wait_ready(&engine, &worker).await;
    let ok = engine
        .wait_until(WAIT, |e| {
            e.trigger_types().iter().any(|t| t.id == "shell::changed")
        })
        .await;
    assert!(ok, "shell::changed never registered; {}", worker.stderr());
    let binder = engine.client_in_namespace("binder", "ns1").await;
    let seen: Seen = Arc::default();
    let s = seen.clone();
    binder
        .register_function(TARGET, move |data, meta| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push((data, meta));
                Ok(json!({}))
            }
        })
        .await
        .unwrap();
    let caller = engine.client().await;
    Setup {
        engine,
        worker,
        binder,
        caller,
        seen,
        _dir: dir,
        root,
        outside,
    }
}

impl Setup {
    fn bind(&self, id: &str, config: Value) {
        self.binder.send_raw(json!({
            "type": "registertrigger", "id": id, "trigger_type": "shell::changed",
            "function_id": TARGET, "config": config,
            "metadata": {"subscription": id, "owner": "test"}, "namespace": "ns1",
        }));
    }

    /// The provider's answers for binding `id`, oldest first.
    fn results(&self, id: &str) -> Vec<Option<iii_test_engine::ErrorBody>> {
        self.engine
            .trigger_registration_results()
            .into_iter()
            .filter(|r| r.id == id)
            .map(|r| r.error)
            .collect()
    }

    async fn wait_results(&self, id: &str, n: usize) -> Vec<Option<iii_test_engine::ErrorBody>> {
        let ok = eventually(WAIT, || self.results(id).len() >= n).await;
        assert!(
            ok,
            "binding {id} answered {:?}; {}",
            self.results(id),
            self.worker.stderr()
        );
        self.results(id)
    }

    async fn bind_ok(&self, id: &str) {
        self.bind(id, json!({"path": self.root.to_string_lossy()}));
        let r = self.wait_results(id, 1).await;
        assert_eq!(r[0], None, "binding refused");
    }

    fn events_for(&self, path: &str) -> Vec<(Value, Option<Value>)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(d, _)| d["path"] == path)
            .cloned()
            .collect()
    }

    /// Waits for a first event of `path`, then for the rest of its window (and more) so that
    /// any second event would have arrived too.
    async fn settled_events(&self, path: &str) -> Vec<(Value, Option<Value>)> {
        let ok = eventually(WAIT, || !self.events_for(path).is_empty()).await;
        assert!(
            ok,
            "no event for {path}; seen {:?}; {}",
            self.seen.lock().unwrap(),
            self.worker.stderr()
        );
        tokio::time::sleep(Duration::from_millis(800)).await;
        self.events_for(path)
    }
}

fn assert_one_event(
    events: &[(Value, Option<Value>)],
    root: &Path,
    path: &str,
    kinds: &[&str],
    id: &str,
) {
    assert_eq!(events.len(), 1, "{path}: {events:?}");
    let (data, meta) = &events[0];
    assert!(
        kinds.contains(&data["kind"].as_str().unwrap_or("")),
        "{data}"
    );
    assert_eq!(data["root"], root.to_string_lossy().as_ref(), "{data}");
    assert_eq!(data["dir"], false, "{data}");
    assert_eq!(
        meta.as_ref().unwrap(),
        &json!({"subscription": id, "owner": "test"}),
        "the binding's metadata travels with every fire"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_writer_produces_one_coalesced_event_with_the_bindings_metadata() {
    let s = setup(|_| {}).await;
    s.bind_ok("b1").await;
    let types = s.engine.trigger_types();
    let t = types.iter().find(|t| t.id == "shell::changed").unwrap();
    assert_eq!(
        t.frame["description"],
        iii_shell_broker::changed::DESCRIPTION
    );

    // A command's side effect: create, then write twice.
    s.caller
        .call(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", "echo a > by-exec.txt; echo b >> by-exec.txt"], "cwd": s.root.to_string_lossy()}),
        )
        .await
        .unwrap();
    let ev = s.settled_events("by-exec.txt").await;
    assert_one_event(&ev, &s.root, "by-exec.txt", &["created"], "b1");

    // An fs call (an atomic replace: its staging file is not a change of its own).
    s.caller
        .call(
            "shell::fs::write",
            json!({"path": "by-fs.txt", "content": "hello"}),
        )
        .await
        .unwrap();
    let ev = s.settled_events("by-fs.txt").await;
    assert_one_event(&ev, &s.root, "by-fs.txt", &["created", "modified"], "b1");

    // A writer outside the engine: modify an existing file several times.
    for i in 0..5 {
        std::fs::write(s.root.join("plain.txt"), format!("v{i}")).unwrap();
    }
    let ev = s.settled_events("plain.txt").await;
    assert_one_event(&ev, &s.root, "plain.txt", &["modified"], "b1");

    // A deletion; a directory is `dir: true`.
    std::fs::remove_file(s.root.join("by-exec.txt")).unwrap();
    std::fs::create_dir(s.root.join("newdir")).unwrap();
    let ev = s.settled_events("newdir").await;
    assert_eq!(ev[0].0["dir"], true, "{ev:?}");
    let gone: Vec<_> = s
        .events_for("by-exec.txt")
        .into_iter()
        .map(|(d, _)| d["kind"].clone())
        .collect();
    assert_eq!(gone, vec![json!("created"), json!("deleted")]);
    let all = s.seen.lock().unwrap().clone();
    assert!(
        all.iter()
            .all(|(d, _)| !d["path"].as_str().unwrap().contains(".iii-")),
        "staging files leaked: {all:?}"
    );
    // Nothing from outside the watched root, and nothing the policy denies.
    std::fs::write(s.outside.join("x"), "x").unwrap();
    std::fs::write(s.root.join("secrets/k.txt"), "k").unwrap();
    std::fs::write(s.root.join("private/p.txt"), "p").unwrap();
    std::fs::write(s.root.join(".env"), "E=1").unwrap();
    std::fs::write(s.root.join("last.txt"), "l").unwrap();
    s.settled_events("last.txt").await;
    let all = s.seen.lock().unwrap().clone();
    for p in ["x", "secrets/k.txt", "private/p.txt", "private", ".env"] {
        assert!(
            all.iter().all(|(d, _)| d["path"] != p),
            "{p} was delivered: {all:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_ten_thousand_writes_is_bounded_and_leaves_no_gap() {
    let s = setup(|_| {}).await;
    s.bind_ok("burst").await;
    let files = 100;
    let started = Instant::now();
    for i in 0..10_000 {
        std::fs::write(s.root.join(format!("f{}.txt", i % files)), format!("{i}")).unwrap();
    }
    let took = started.elapsed();
    let complete = eventually(WAIT, || {
        let seen = s.seen.lock().unwrap();
        seen.iter().any(|(d, _)| d["overflow"] == true)
            || (0..files).all(|i| {
                let p = format!("f{i}.txt");
                seen.iter().any(|(d, _)| d["path"] == p.as_str())
            })
    })
    .await;
    assert!(
        complete,
        "a file was never reported and no overflow signal came"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    let n = s.seen.lock().unwrap().len();
    // At most one event per file per 200 ms window the burst spanned (plus the edges).
    let windows = (took.as_millis() / 200) as usize + 2;
    assert!(
        n <= files * windows,
        "{n} events for {files} files over {took:?}"
    );
    assert!(n < 10_000, "not coalesced: {n} events");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_pending_bound_the_subscriber_gets_the_overflow_signal() {
    let s = setup(|c| c.watch.max_pending_paths = 50).await;
    s.bind_ok("ov").await;
    for i in 0..300 {
        std::fs::write(s.root.join(format!("g{i}.txt")), "x").unwrap();
    }
    let ok = eventually(WAIT, || {
        s.seen
            .lock()
            .unwrap()
            .iter()
            .any(|(d, _)| d["overflow"] == true && d["path"] == "." && d["kind"] == "modified")
    })
    .await;
    assert!(ok, "no overflow signal: {:?}", s.seen.lock().unwrap());
    s.worker
        .expect_log("exceeded watch.max_pending_paths")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_unbinding_nothing_more_arrives() {
    let s = setup(|_| {}).await;
    s.bind_ok("u1").await;
    std::fs::write(s.root.join("before.txt"), "x").unwrap();
    s.settled_events("before.txt").await;
    s.binder.send_raw(
        json!({"type": "unregistertrigger", "id": "u1", "trigger_type": "shell::changed"}),
    );
    s.worker.expect_log("shell::changed watcher stopped").await;
    std::fs::write(s.root.join("after.txt"), "x").unwrap();
    std::fs::write(s.root.join("before.txt"), "y").unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(s.events_for("after.txt").is_empty());
    assert_eq!(s.events_for("before.txt").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bindings_are_refused_and_answered_again_when_offered_again_and_a_replay_keeps_one_watcher(
) {
    let s = setup(|_| {}).await;
    s.bind_ok("good").await;
    let bad = [
        ("outside", json!({"path": s.outside.to_string_lossy()})),
        (
            "denied",
            json!({"path": s.root.join("private").to_string_lossy()}),
        ),
        (
            "file",
            json!({"path": s.root.join("plain.txt").to_string_lossy()}),
        ),
        (
            "missing",
            json!({"path": s.root.join("nope").to_string_lossy()}),
        ),
        ("noconfig", json!({})),
    ];
    for (id, cfg) in &bad {
        s.bind(id, cfg.clone());
    }
    for (id, _) in &bad {
        let r = s.wait_results(id, 1).await;
        let e = r[0].as_ref().unwrap_or_else(|| panic!("{id} was accepted"));
        assert_eq!(e.code, "trigger_registration_failed", "{id}: {e:?}");
    }
    let msg = |id: &str| s.results(id)[0].as_ref().unwrap().message.clone();
    assert!(msg("outside").contains("S215"), "{}", msg("outside"));
    assert!(msg("file").contains("S212"), "{}", msg("file"));
    // A denied path reads exactly like a missing one.
    assert_eq!(
        msg("denied").replace(&s.root.join("private").to_string_lossy().to_string(), "P"),
        msg("missing").replace(&s.root.join("nope").to_string_lossy().to_string(), "P")
    );

    // The worker reconnects: the engine re-offers every binding; the refused ones are
    // answered again, the good one keeps a single watcher.
    let info = s.worker.wait_connected(&s.engine).await;
    s.engine.drop_worker(info.worker_id).await;
    for (id, _) in &bad {
        let r = s.wait_results(id, 2).await;
        assert!(r[1].is_some(), "{id} accepted on replay");
    }
    s.wait_results("good", 2).await;
    assert_eq!(s.results("good")[1], None);
    s.seen.lock().unwrap().clear();
    std::fs::write(s.root.join("after-replay.txt"), "x").unwrap();
    let ev = s.settled_events("after-replay.txt").await;
    assert_eq!(
        ev.len(),
        1,
        "one watcher per binding id after the replay: {ev:?}"
    );
}

/// An executor respawn: the watchers are started again on the new executor, and every
/// binding gets the overflow signal (changes while no watcher ran are unknown), then the feed
/// goes on with one watcher per binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_executor_respawn_the_watcher_is_back_and_the_subscriber_was_told() {
    let s = setup(|_| {}).await;
    s.bind_ok("r1").await;
    std::fs::write(s.root.join("before.txt"), "x").unwrap();
    s.settled_events("before.txt").await;
    let overflow = |s: &Setup| {
        s.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(d, _)| d["overflow"] == true && d["path"] == "." && d["kind"] == "modified")
            .count()
    };
    assert_eq!(overflow(&s), 0);
    let pid = s.worker.executor_pid().expect("executor");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    s.worker.wait_executor(Some(pid)).await;
    let told = eventually(WAIT, || overflow(&s) == 1).await;
    assert!(
        told,
        "no overflow signal after the respawn: {:?}; {}",
        s.seen.lock().unwrap(),
        s.worker.stderr()
    );
    let (data, meta) = s
        .seen
        .lock()
        .unwrap()
        .iter()
        .find(|(d, _)| d["overflow"] == true)
        .cloned()
        .unwrap();
    assert_eq!(data["root"], s.root.to_string_lossy().as_ref(), "{data}");
    assert_eq!(meta, Some(json!({"subscription": "r1", "owner": "test"})));
    // Written while the new executor runs: delivered once.
    std::fs::write(s.root.join("after-respawn.txt"), "x").unwrap();
    let ev = s.settled_events("after-respawn.txt").await;
    assert_one_event(
        &ev,
        &s.root,
        "after-respawn.txt",
        &["created", "modified"],
        "r1",
    );
    assert_eq!(overflow(&s), 1);
}

/// `watch.max_watchers` through the engine: a binding past it is refused with the key named;
/// unbinding one makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_watchers_a_binding_is_refused_until_one_is_unbound() {
    let s = setup(|c| c.watch.max_watchers = 1).await;
    s.bind_ok("m1").await;
    s.bind("m2", json!({"path": s.root.to_string_lossy()}));
    let r = s.wait_results("m2", 1).await;
    let e = r[0].as_ref().expect("m2 accepted past watch.max_watchers");
    assert_eq!(e.code, "trigger_registration_failed");
    assert!(e.message.contains("watch.max_watchers = 1"), "{e:?}");
    s.binder.send_raw(
        json!({"type": "unregistertrigger", "id": "m1", "trigger_type": "shell::changed"}),
    );
    s.worker.expect_log("shell::changed watcher stopped").await;
    s.bind_ok("m3").await;
    std::fs::write(s.root.join("m3.txt"), "x").unwrap();
    let ev = s.settled_events("m3.txt").await;
    assert_one_event(&ev, &s.root, "m3.txt", &["created", "modified"], "m3");
}

/// A binder that disconnects takes its bindings with it: the engine unregisters them and the
/// watcher is torn down, while another binder's watcher carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binders_disconnect_tears_its_watcher_down() {
    let s = setup(|_| {}).await;
    s.bind_ok("stays").await;
    let other = s.engine.client_in_namespace("binder2", "ns1").await;
    other
        .register_function("test::other-changed", |_, _| async { Ok(json!({})) })
        .await
        .unwrap();
    other.send_raw(json!({
        "type": "registertrigger", "id": "leaves", "trigger_type": "shell::changed",
        "function_id": "test::other-changed", "config": {"path": s.root.to_string_lossy()},
        "namespace": "ns1",
    }));
    let r = s.wait_results("leaves", 1).await;
    assert_eq!(r[0], None);
    assert_eq!(
        s.worker.log_lines("shell::changed watcher stopped").len(),
        0
    );
    other.close().await;
    s.worker.expect_log("shell::changed watcher stopped").await;
    let stopped = s.worker.log_lines("shell::changed watcher stopped");
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    assert!(stopped[0].contains("leaves"), "{stopped:?}");
    std::fs::write(s.root.join("still.txt"), "x").unwrap();
    let ev = s.settled_events("still.txt").await;
    assert_one_event(&ev, &s.root, "still.txt", &["created", "modified"], "stays");
}

/// inotify watch exhaustion, under a real kernel limit (16 watches for the worker's user
/// namespace): a tree that needs more watches than are left refuses the binding with the
/// sysctl named; a watched tree that grows past the limit sends the subscriber the overflow
/// signal and logs an ERROR saying what to raise — never a silent gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inotify_watch_exhaustion_refuses_or_signals_overflow_and_is_logged() {
    let s = setup_wrapped(|_| {}, &low_inotify_limit(16)).await;
    let big = s.root.join("big");
    for i in 0..20 {
        std::fs::create_dir_all(big.join(format!("d{i}"))).unwrap();
    }
    s.bind("too-big", json!({"path": big.to_string_lossy()}));
    let r = s.wait_results("too-big", 1).await;
    let e = r[0]
        .as_ref()
        .expect("a tree past the watch limit was accepted");
    assert_eq!(e.code, "trigger_registration_failed");
    assert!(
        e.message.contains("inotify watch limit") && e.message.contains("max_user_watches"),
        "{e:?}"
    );
    // A small tree binds (its watches fit), then grows past the limit.
    let small = s.root.join("small");
    std::fs::create_dir_all(&small).unwrap();
    s.bind("grows", json!({"path": small.to_string_lossy()}));
    assert_eq!(s.wait_results("grows", 1).await[0], None);
    for i in 0..30 {
        std::fs::create_dir_all(small.join(format!("n{i}"))).unwrap();
    }
    let ok = eventually(WAIT, || {
        s.seen.lock().unwrap().iter().any(|(d, m)| {
            d["overflow"] == true
                && d["path"] == "."
                && d["kind"] == "modified"
                && d["root"] == small.to_string_lossy().as_ref()
                && m.as_ref().is_some_and(|m| m["subscription"] == "grows")
        })
    })
    .await;
    assert!(
        ok,
        "no overflow signal: {:?}; {}",
        s.seen.lock().unwrap(),
        s.worker.stderr()
    );
    s.worker
        .expect_log("raise fs.inotify.max_user_watches")
        .await;
    let errors = s.worker.log_lines("lost events");
    assert!(errors.iter().any(|l| l.contains("ERROR")), "{errors:?}");
}

/// TRIG-08, TRIG-09 through the engine, inside a Git repository: `.git` internals never
/// arrive; git-ignored paths arrive only for the binding with `include_ignored: true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_internals_never_arrive_and_ignored_paths_only_with_include_ignored() {
    let s = setup(|_| {}).await;
    let st = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&s.root)
        .status()
        .expect("git");
    assert!(st.success());
    std::fs::write(s.root.join(".gitignore"), "*.log\nbuild/\n").unwrap();
    s.bind_ok("plain").await;
    s.bind(
        "all",
        json!({"path": s.root.to_string_lossy(), "include_ignored": true}),
    );
    assert_eq!(s.wait_results("all", 1).await[0], None);
    std::fs::create_dir_all(s.root.join("build")).unwrap();
    std::fs::write(s.root.join("build/out.o"), "o").unwrap();
    std::fs::write(s.root.join("run.log"), "l").unwrap();
    std::fs::write(s.root.join(".git/objects/junk"), "g").unwrap();
    std::fs::write(s.root.join(".git/HEAD"), "ref: refs/heads/other\n").unwrap();
    std::fs::write(s.root.join("last.txt"), "x").unwrap();
    let for_binding = |id: &str| -> Vec<String> {
        s.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, m)| m.as_ref().is_some_and(|m| m["subscription"] == id))
            .map(|(d, _)| d["path"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let ok = eventually(WAIT, || {
        for_binding("plain").contains(&"last.txt".to_string())
            && for_binding("all").contains(&"last.txt".to_string())
    })
    .await;
    assert!(ok, "{:?}", s.seen.lock().unwrap());
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (plain, all) = (for_binding("plain"), for_binding("all"));
    for p in plain.iter().chain(all.iter()) {
        assert!(
            !p.starts_with(".git/") && p != ".git",
            "git internal {p} delivered"
        );
    }
    for p in ["run.log", "build", "build/out.o"] {
        assert!(
            !plain.iter().any(|x| x == p),
            "{p} (ignored) delivered: {plain:?}"
        );
    }
    for p in ["run.log", "build/out.o"] {
        assert!(
            all.iter().any(|x| x == p),
            "{p} missing with include_ignored: {all:?}"
        );
    }
}

/// TRIG-11: a subscriber that takes seconds per event delays neither the watcher nor another
/// subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_delays_nobody_else() {
    let s = setup(|_| {}).await;
    let slow = s.engine.client_in_namespace("slow", "ns1").await;
    let slow_calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n = slow_calls.clone();
    slow.register_function("test::slow-changed", move |_, _| {
        let n = n.clone();
        async move {
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(20)).await;
            Ok(json!({}))
        }
    })
    .await
    .unwrap();
    slow.send_raw(json!({
        "type": "registertrigger", "id": "slow", "trigger_type": "shell::changed",
        "function_id": "test::slow-changed", "config": {"path": s.root.to_string_lossy()},
        "namespace": "ns1",
    }));
    assert_eq!(s.wait_results("slow", 1).await[0], None);
    s.bind_ok("fast").await;
    for i in 0..5 {
        let t0 = Instant::now();
        let name = format!("s{i}.txt");
        std::fs::write(s.root.join(&name), "x").unwrap();
        let ok = eventually(WAIT, || !s.events_for(&name).is_empty()).await;
        assert!(ok, "no event for {name}");
        // The window is 200 ms; a fast subscriber queued behind a 20 s one would wait 20 s.
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{name} took {:?}",
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        slow_calls.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "the slow subscriber was fired at most once: fire-and-forget means every event goes out"
    );
}

/// A revert restores files through the same atomic replace as any fs call, in a
/// subdirectory as at the root: the watcher reports both (the console page saw an event for a
/// root-level file and none for `src/x`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_in_a_subdirectory_of_a_watched_root_produces_an_event_for_that_file() {
    let data = tempfile::tempdir().unwrap();
    let d = data.path().to_string_lossy().into_owned();
    let s = setup(|c| c.turns.data_dir = d).await;
    std::fs::create_dir_all(s.root.join("src/deep")).unwrap();
    std::fs::write(s.root.join("src/x"), "one\n").unwrap();
    std::fs::write(s.root.join("src/deep/y"), "one\n").unwrap();
    s.bind_ok("rv").await;
    let call = |f: &'static str, v: Value| {
        let c = &s.caller;
        async move { c.call(f, v).await.unwrap() }
    };
    call(
        "shell::turns::on-turn-started",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    call(
        "shell::fs::write",
        json!({"files": [{"path": "src/x", "content": "two\n"}, {"path": "src/deep/y", "content": "two\n"},
                         {"path": "plain.txt", "content": "two\n"}]}),
    )
    .await;
    call(
        "shell::turns::on-turn-completed",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    s.settled_events("src/x").await;
    s.settled_events("src/deep/y").await;
    s.seen.lock().unwrap().clear();
    let rv = call(
        "shell::turns::revert",
        json!({"session_id": "s1", "turn_id": "t1"}),
    )
    .await;
    assert_eq!(rv["reverted"], 3, "{rv}");
    assert_eq!(
        std::fs::read_to_string(s.root.join("src/x")).unwrap(),
        "one\n"
    );
    for p in ["plain.txt", "src/x", "src/deep/y"] {
        let ev = s.settled_events(p).await;
        assert_one_event(&ev, &s.root, p, &["modified", "created"], "rv");
    }
}

/// A binding served now, offered again (same id) with a config that is refused: the refusal
/// says the earlier binding was stopped, and from then on no watcher fires for that id, for
/// a config the broker refuses itself and for a path the executor refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reoffer_of_a_live_binding_stops_its_watcher_and_says_so() {
    let s = setup(|_| {}).await;
    let refusals = [
        ("by-broker", json!({"path": 7})),
        ("by-executor", json!({"path": s.outside.to_string_lossy()})),
    ];
    for (id, bad) in refusals {
        s.bind_ok(id).await;
        std::fs::write(s.root.join(format!("{id}-before.txt")), "x").unwrap();
        let ev = s.settled_events(&format!("{id}-before.txt")).await;
        // Every binding made so far watches the root: one event per binding still live.
        assert!(
            ev.iter()
                .any(|(_, m)| m.as_ref().unwrap()["subscription"] == id),
            "{id}: {ev:?}"
        );
        s.bind(id, bad);
        let r = s.wait_results(id, 2).await;
        let e = r[1]
            .as_ref()
            .unwrap_or_else(|| panic!("{id}: re-offer accepted"));
        assert_eq!(e.code, "trigger_registration_failed", "{id}: {e:?}");
        assert!(
            e.message.ends_with(&format!(
                "; the earlier binding {id} was stopped and fires no more"
            )),
            "{id}: {}",
            e.message
        );
        s.worker.expect_log("its earlier watcher was stopped").await;
        std::fs::write(s.root.join(format!("{id}-after.txt")), "x").unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let after = s.events_for(&format!("{id}-after.txt"));
        assert!(
            after
                .iter()
                .all(|(_, m)| m.as_ref().unwrap()["subscription"] != id),
            "{id}: the refused binding's old watcher still fires: {after:?}"
        );
    }
}
