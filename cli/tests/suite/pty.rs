//! Terminal sessions end to end: the real `iii-shell serve` against the test engine, a real
//! shell on a real PTY, and a consumer function on another engine connection standing in
//! for the console page that receives the output.

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use iii_test_engine::{TestClient, TestEngine};
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A console page: an output function that records every payload it is sent.
struct Page {
    id: String,
    got: Arc<Mutex<Vec<Value>>>,
    _client: TestClient,
}

impl Page {
    async fn new(engine: &TestEngine, ui: &str) -> Page {
        Self::with_delay(engine, ui, Duration::ZERO).await
    }

    /// A page whose handler takes `delay` per frame (a slow consumer).
    async fn with_delay(engine: &TestEngine, ui: &str, delay: Duration) -> Page {
        let id = format!("iii::{ui}-ui::pty-output::console-{}", uuid::Uuid::new_v4());
        Self::registering(engine, id, delay).await
    }

    /// A page that answers small deliveries at once and never answers (sleeps 25 s on) the
    /// first larger than `small` bytes, and every one after it.
    async fn stalling_past(engine: &TestEngine, ui: &str, small: usize) -> Page {
        let id = format!("iii::{ui}-ui::pty-output::console-{}", uuid::Uuid::new_v4());
        let client = engine.client().await;
        let got: Arc<Mutex<Vec<Value>>> = Arc::default();
        let sink = got.clone();
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        client
            .register_function(&id, move |data, _| {
                let (sink, stalled) = (sink.clone(), stalled.clone());
                async move {
                    let len = data["data"]
                        .as_str()
                        .map(|d| B64.decode(d).unwrap().len())
                        .unwrap_or(0);
                    if len > small {
                        stalled.store(true, Ordering::SeqCst);
                    }
                    if stalled.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_secs(25)).await;
                    }
                    sink.lock().unwrap().push(data);
                    Ok(json!({}))
                }
            })
            .await
            .expect("register the output function");
        Page {
            id,
            got,
            _client: client,
        }
    }

    /// A page whose output function is `id`.
    async fn registering(engine: &TestEngine, id: String, delay: Duration) -> Page {
        let client = engine.client().await;
        let got: Arc<Mutex<Vec<Value>>> = Arc::default();
        let sink = got.clone();
        client
            .register_function(&id, move |data, _| {
                let sink = sink.clone();
                async move {
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    sink.lock().unwrap().push(data);
                    Ok(json!({}))
                }
            })
            .await
            .expect("register the output function");
        Page {
            id,
            got,
            _client: client,
        }
    }

    fn payloads(&self) -> Vec<Value> {
        self.got.lock().unwrap().clone()
    }

    /// Whether the `eof` delivery of `session` arrived (without copying every payload).
    fn has_eof(&self, session: &str) -> bool {
        self.got
            .lock()
            .unwrap()
            .iter()
            .any(|p| p["session_id"] == session && p["eof"] == true)
    }

    /// Everything delivered so far for `session`, in order.
    fn bytes(&self, session: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for p in self.payloads() {
            if p["session_id"] == session {
                if let Some(d) = p["data"].as_str() {
                    out.extend(B64.decode(d).expect("data is base64"));
                }
            }
        }
        out
    }

    fn text(&self, session: &str) -> String {
        String::from_utf8_lossy(&self.bytes(session)).into_owned()
    }

    async fn wait_text(&self, session: &str, needle: &str) {
        let ok = eventually(WAIT, || self.text(session).contains(needle)).await;
        assert!(ok, "{needle:?} never arrived; got {:?}", self.text(session));
    }

    /// The last sequence delivered for `session`.
    fn last_sequence(&self, session: &str) -> u64 {
        self.payloads()
            .iter()
            .filter(|p| p["session_id"] == session)
            .filter_map(|p| p["sequence"].as_u64())
            .max()
            .unwrap_or(0)
    }
}

struct Session {
    id: String,
    key: String,
    token: String,
    pid: i32,
}

fn session_of(r: &Value) -> Session {
    Session {
        id: r["session_id"].as_str().unwrap().to_string(),
        key: r["access_key"].as_str().unwrap().to_string(),
        token: r["reconnect_token"].as_str().unwrap().to_string(),
        pid: r["pid"].as_i64().unwrap_or(0) as i32,
    }
}

async fn open(caller: &TestClient, page: &Page, extra: Value) -> Session {
    let mut req = json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": page.id,
                         "program": "sh"});
    for (k, v) in extra.as_object().unwrap() {
        req[k] = v.clone();
    }
    let r = caller
        .call("shell::pty::open", req)
        .await
        .expect("shell::pty::open");
    session_of(&r)
}

async fn write(caller: &TestClient, s: &Session, text: &str) -> Value {
    caller
        .call(
            "shell::pty::write",
            json!({"session_id": s.id, "access_key": s.key, "data": B64.encode(text)}),
        )
        .await
        .expect("shell::pty::write")
}

async fn summary(caller: &TestClient, id: &str) -> Option<Value> {
    let r = caller
        .call("shell::pty::sessions", json!({}))
        .await
        .unwrap();
    r["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session_id"] == id)
        .cloned()
}

async fn wait_exited(caller: &TestClient, id: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let s = summary(caller, id).await.expect("session listed");
        if s["status"].get("exited").is_some() {
            return s;
        }
        assert!(Instant::now() < deadline, "never exited: {s}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn decode_frames(frames: &Value) -> Vec<u8> {
    frames
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| B64.decode(f["data"].as_str().unwrap()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_input_is_echoed_and_resize_changes_stty_size() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let s = open(&caller, &page, json!({})).await;

    let w = write(&caller, &s, "echo hel''lo-from-pty\n").await;
    assert_eq!(w["written"], 22);
    page.wait_text(&s.id, "hello-from-pty").await;

    write(&caller, &s, "stty size\n").await;
    page.wait_text(&s.id, "24 80").await;
    let r = caller
        .call(
            "shell::pty::resize",
            json!({"session_id": s.id, "access_key": s.key, "cols": 132, "rows": 43}),
        )
        .await
        .unwrap();
    assert_eq!(r, json!({"cols": 132, "rows": 43}));
    write(&caller, &s, "stty size\n").await;
    page.wait_text(&s.id, "43 132").await;

    // Every payload carries a strictly increasing sequence.
    let seqs: Vec<u64> = page
        .payloads()
        .iter()
        .map(|p| p["sequence"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    // A wrong key is refused, like an unknown session.
    let bad = caller
        .call(
            "shell::pty::write",
            json!({"session_id": s.id, "access_key": "0".repeat(64), "data": "eA=="}),
        )
        .await;
    assert_code(&bad, "S211");
    let unknown = caller
        .call(
            "shell::pty::write",
            json!({"session_id": "nope", "access_key": s.key, "data": "eA=="}),
        )
        .await;
    assert_code(&unknown, "S211");
    assert_eq!(
        bad.unwrap_err().message.replace(&s.id, "nope"),
        unknown.unwrap_err().message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_then_attach_replays_what_was_missed_byte_for_byte() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let s = open(&caller, &page, json!({})).await;
    write(&caller, &s, "echo before-$((40+2))\n").await;
    // The output and root's prompt after it: the shell is idle, nothing more is on its way.
    page.wait_text(&s.id, "before-42\r\n# ").await;
    let seen = page.last_sequence(&s.id);
    let live_before = page.bytes(&s.id);

    let d = caller
        .call(
            "shell::pty::detach",
            json!({"session_id": s.id, "access_key": s.key}),
        )
        .await
        .unwrap();
    assert_eq!(d, json!({"status": "detached"}));
    let listed = summary(&caller, &s.id).await.unwrap();
    assert_eq!(listed["status"], "detached");
    assert_eq!(listed["output_function_id"], Value::Null);
    assert_eq!(listed["ui"], "shell");

    let before_bytes = summary(&caller, &s.id).await.unwrap()["frame_bytes"]
        .as_u64()
        .unwrap();
    write(&caller, &s, "for i in 1 2 3; do echo while-away-$i; done\n").await;
    // Wait until the program is done producing it (the ring stops growing).
    let deadline = Instant::now() + WAIT;
    let mut last = (0, 0);
    let mut stable = 0;
    while stable < 4 {
        assert!(Instant::now() < deadline, "output never settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = summary(&caller, &s.id).await.unwrap();
        let cur = (
            now["frame_bytes"].as_u64().unwrap(),
            now["sequence"].as_u64().unwrap(),
        );
        // The echo of the typed line alone is 45 bytes; the three output lines add 42 more,
        // so past 85 the last line has arrived (settling on the echo alone raced under load).
        if cur == last && cur.0 > before_bytes + 85 {
            stable += 1;
        } else {
            stable = 0;
            last = cur;
        }
    }
    let replay = caller
        .call(
            "shell::pty::attach",
            json!({"session_id": s.id, "reconnect_token": s.token, "after_sequence": 0,
                   "cols": 80, "rows": 24, "output_function_id": page.id}),
        )
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&decode_frames(&replay["frames"])).contains("while-away-3\r\n"));
    // Nothing was delivered live while detached.
    assert_eq!(page.bytes(&s.id), live_before);
    assert!(!String::from_utf8_lossy(&live_before).contains("while-away"));
    assert_eq!(replay["truncated"], false);
    assert_eq!(replay["status"], "attached");
    assert_eq!(
        replay["access_key"],
        s.key.as_str(),
        "attach does not rotate"
    );
    let full = decode_frames(&replay["frames"]);

    // From what the page had seen: exactly the rest, no gap, no duplicate.
    let rest = caller
        .call(
            "shell::pty::attach",
            json!({"session_id": s.id, "reconnect_token": s.token, "after_sequence": seen,
                   "cols": 80, "rows": 24, "output_function_id": page.id}),
        )
        .await
        .unwrap();
    let rest_bytes = decode_frames(&rest["frames"]);
    let mut joined = live_before.clone();
    joined.extend_from_slice(&rest_bytes);
    assert_eq!(joined, full, "live + replay after {seen} == full replay");
    assert!(rest["frames"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["sequence"].as_u64().unwrap() > seen));
    let next = rest["next_sequence"].as_u64().unwrap();

    // Live output resumes after the replay, starting at next_sequence.
    write(&caller, &s, "echo after-attach\n").await;
    page.wait_text(&s.id, "after-attach").await;
    let live_after: Vec<u64> = page
        .payloads()
        .iter()
        .filter_map(|p| p["sequence"].as_u64())
        .filter(|&q| q > seen)
        .collect();
    assert!(
        live_after.iter().all(|&q| q >= next),
        "{live_after:?} vs {next}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_rotates_credentials_and_keeps_to_its_rules() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "claude").await;
    let s = open(&caller, &page, json!({})).await;
    write(&caller, &s, "echo one\n").await;
    page.wait_text(&s.id, "one").await;

    let other_browser = Page::new(&engine, "claude").await;
    let other_page = Page::new(&engine, "pi").await;
    let adopt = |target: &str| json!({"session_id": s.id, "output_function_id": target, "cols": 80, "rows": 24});
    // Someone is attached: refused.
    let r = caller
        .call("shell::pty::adopt", adopt(&other_browser.id))
        .await;
    assert_code(&r, "S210");
    assert!(r.unwrap_err().message.contains("attached"));

    caller
        .call(
            "shell::pty::detach",
            json!({"session_id": s.id, "access_key": s.key}),
        )
        .await
        .unwrap();
    // Another page family: refused.
    let r = caller
        .call("shell::pty::adopt", adopt(&other_page.id))
        .await;
    assert_code(&r, "S210");
    // The same page from another browser: adopted, with fresh credentials and the replay.
    let a = caller
        .call("shell::pty::adopt", adopt(&other_browser.id))
        .await
        .unwrap();
    assert_ne!(a["access_key"], s.key.as_str());
    assert_ne!(a["reconnect_token"], s.token.as_str());
    assert_eq!(a["access_key"].as_str().unwrap().len(), 64);
    assert!(String::from_utf8_lossy(&decode_frames(&a["frames"])).contains("one"));
    assert_eq!(a["status"], "attached");

    // The old credentials stop working at once; the new ones work.
    let old_write = caller
        .call(
            "shell::pty::write",
            json!({"session_id": s.id, "access_key": s.key, "data": "eA=="}),
        )
        .await;
    assert_code(&old_write, "S211");
    let old_attach = caller
        .call(
            "shell::pty::attach",
            json!({"session_id": s.id, "reconnect_token": s.token, "after_sequence": 0,
                   "cols": 80, "rows": 24, "output_function_id": page.id}),
        )
        .await;
    assert_code(&old_attach, "S211");
    let new = Session {
        id: s.id.clone(),
        key: a["access_key"].as_str().unwrap().into(),
        token: a["reconnect_token"].as_str().unwrap().into(),
        pid: s.pid,
    };
    write(&caller, &new, "echo two\n").await;
    other_browser.wait_text(&s.id, "two").await;
    assert!(
        !page.text(&s.id).contains("two"),
        "the old page gets nothing"
    );

    // `sessions` shows the page family, never a credential.
    let listing = caller
        .call("shell::pty::sessions", json!({}))
        .await
        .unwrap()
        .to_string();
    for secret in [&s.key, &s.token, &new.key, &new.token] {
        assert!(!listing.contains(secret.as_str()), "{listing}");
    }
    let mine = summary(&caller, &s.id).await.unwrap();
    assert_eq!(mine["ui"], "claude");
    assert_eq!(mine["output_function_id"], other_browser.id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_status_after_exit_3_and_after_kill_9() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;

    let s = open(&caller, &page, json!({})).await;
    write(&caller, &s, "echo bye; exit 3\n").await;
    let listed = wait_exited(&caller, &s.id).await;
    assert_eq!(
        listed["status"],
        json!({"exited": {"exit_code": 3, "signal": null, "error": null}})
    );
    // The exit is delivered after the output, as the last event.
    assert!(
        eventually(WAIT, || page
            .payloads()
            .iter()
            .any(|p| p["session_id"] == s.id && p["eof"] == true))
        .await
    );
    let last = page
        .payloads()
        .into_iter()
        .rfind(|p| p["session_id"] == s.id)
        .unwrap();
    assert_eq!(last["eof"], true);
    assert_eq!(last["exit_code"], 3);
    assert!(page.text(&s.id).contains("bye"));
    // Still replayable after the exit.
    let r = caller
        .call(
            "shell::pty::attach",
            json!({"session_id": s.id, "reconnect_token": s.token, "after_sequence": 0,
                   "cols": 80, "rows": 24, "output_function_id": page.id}),
        )
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&decode_frames(&r["frames"])).contains("bye"));
    assert_eq!(r["status"]["exited"]["exit_code"], 3);

    let k = open(&caller, &page, json!({})).await;
    assert!(k.pid > 0);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(k.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let listed = wait_exited(&caller, &k.id).await;
    assert_eq!(
        listed["status"],
        json!({"exited": {"exit_code": null, "signal": "SIGKILL", "error": null}})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_leaves_no_process_behind() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let s = open(&caller, &page, json!({})).await;
    let m = w.marker(600);
    // A background child and a child that left the session (setsid).
    write(
        &caller,
        &s,
        &format!("sleep {m} & setsid sleep {m} & echo started\n"),
    )
    .await;
    page.wait_text(&s.id, "started").await;
    let needle = format!("sleep {m}");
    assert!(eventually(WAIT, || procs_with(&needle).len() == 2).await);
    let r = caller
        .call(
            "shell::pty::close",
            json!({"session_id": s.id, "access_key": s.key}),
        )
        .await
        .unwrap();
    assert_eq!(r, json!({"closed": true}));
    assert!(!alive(s.pid), "the shell is still there");
    assert!(
        eventually(Duration::from_secs(5), || procs_with(&needle).is_empty()).await,
        "left behind: {:?}",
        procs_with(&needle)
    );
    assert!(summary(&caller, &s.id).await.is_none());
    let again = caller
        .call(
            "shell::pty::close",
            json!({"session_id": s.id, "access_key": s.key}),
        )
        .await;
    assert_code(&again, "S211");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_targets_of_the_wrong_shape_are_refused() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    for bad in [
        "shell::exec",
        "iii::shell-ui::pty-output::console-",
        "iii::shell::pty-output::console-abc",
        "iii::shell-ui::pty-output::console-a::b",
    ] {
        let r = caller
            .call(
                "shell::pty::open",
                json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": bad}),
            )
            .await;
        assert_code(&r, "S210");
        assert!(r
            .unwrap_err()
            .message
            .contains("iii::<name>-ui::pty-output::console-<browser-id>"));
    }
    let s = open(&caller, &page, json!({})).await;
    let r = caller
        .call(
            "shell::pty::attach",
            json!({"session_id": s.id, "reconnect_token": s.token, "after_sequence": 0,
                   "cols": 80, "rows": 24, "output_function_id": "shell::exec"}),
        )
        .await;
    assert_code(&r, "S210");
    caller
        .call(
            "shell::pty::detach",
            json!({"session_id": s.id, "access_key": s.key}),
        )
        .await
        .unwrap();
    let r = caller
        .call(
            "shell::pty::adopt",
            json!({"session_id": s.id, "output_function_id": "engine::functions::list",
                   "cols": 80, "rows": 24}),
        )
        .await;
    assert_code(&r, "S210");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_is_deny_only_and_the_default_is_a_login_shell() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    for (key, code) in [
        ("PATH", "S210"),
        ("PATH=/tmp/evil", "S210"),
        ("LD_PRELOAD", "S210"),
    ] {
        let r = caller
            .call(
                "shell::pty::open",
                json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": page.id,
                       "env": {key: "x"}}),
            )
            .await;
        assert_code(&r, code);
    }
    let s = open(
        &caller,
        &page,
        json!({"program": "sh", "args": ["-c", "echo foo=$FOO term=$TERM pager=${PAGER-unset} rust_log=${RUST_LOG-unset}; sleep 30"], "env": {"FOO": "bar"}}),
    )
    .await;
    page.wait_text(&s.id, "foo=bar term=").await;
    // A terminal has someone at the keyboard: no `PAGER=cat` default (that is for commands),
    // and none of the worker's own variables (the worker runs with RUST_LOG set).
    if std::env::var_os("PAGER").is_none() {
        page.wait_text(&s.id, "pager=unset rust_log=unset").await;
    }

    // No program: the login shell, told so by a leading '-' in argv[0].
    let r = caller
        .call(
            "shell::pty::open",
            json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": page.id,
                   "args": ["ignored"]}),
        )
        .await
        .unwrap();
    assert_eq!(r["program"], Value::Null);
    let pid = r["pid"].as_i64().unwrap() as i32;
    // The spawn returns once the exec has begun (the vfork is released when the new image
    // replaces the old), but the kernel sets the new command line up a moment later: read
    // it once it is there.
    assert!(
        eventually(WAIT, || cmdline(pid).is_some_and(|c| !c.is_empty())).await,
        "the session's process never showed a command line"
    );
    assert!(
        cmdline(pid).is_some_and(|c| c.starts_with('-') && !c.contains("ignored")),
        "{:?}",
        cmdline(pid)
    );
    // cwd goes through the jail: a missing directory reads as missing.
    let r = caller
        .call(
            "shell::pty::open",
            json!({"cwd": "/nonexistent/dir", "cols": 80, "rows": 24, "output_function_id": page.id}),
        )
        .await;
    assert_code(&r, "S211");
}

/// `sh -c` that waits for a line, then writes `n` copies of `c` and `\nEND\n`, and exits.
fn flood(n: usize, c: char) -> Value {
    json!({"program": "sh", "args": ["-c", format!("read x; head -c {n} /dev/zero | tr '\\0' {c}; printf '\\nEND\\n'")]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_past_the_ring_replays_its_tail_and_says_truncated() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let s = open(&caller, &page, flood(3_000_000, 'x')).await;
    caller
        .call(
            "shell::pty::detach",
            json!({"session_id": s.id, "access_key": s.key}),
        )
        .await
        .unwrap();
    write(&caller, &s, "\n").await;
    let listed = wait_exited(&caller, &s.id).await;
    assert_eq!(listed["status"]["exited"]["exit_code"], 0);
    assert_eq!(listed["truncated"], true);
    let attach = |after: u64| {
        json!({"session_id": s.id, "reconnect_token": s.token, "after_sequence": after,
               "cols": 80, "rows": 24, "output_function_id": page.id})
    };
    let r = caller.call("shell::pty::attach", attach(0)).await.unwrap();
    assert_eq!(r["truncated"], true);
    let data = decode_frames(&r["frames"]);
    assert_eq!(data.len() as u64, listed["frame_bytes"].as_u64().unwrap());
    assert!(data.len() <= 2 * 1024 * 1024 && data.len() > 2 * 1024 * 1024 - 70 * 1024);
    let body = data.strip_suffix(b"\r\nEND\r\n").expect("ends with END");
    assert!(body.iter().all(|&b| b == b'x'), "only the flood's tail");
    // From just before the oldest frame held, nothing is missing; from earlier, it is.
    let first = r["frames"][0]["sequence"].as_u64().unwrap();
    assert!(first >= 2);
    let r2 = caller
        .call("shell::pty::attach", attach(first - 1))
        .await
        .unwrap();
    assert_eq!(r2["truncated"], false);
    assert_eq!(decode_frames(&r2["frames"]), data);
    let r3 = caller
        .call("shell::pty::attach", attach(first - 2))
        .await
        .unwrap();
    assert_eq!(r3["truncated"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_loses_nothing_the_ring_holds_and_never_stalls_the_program() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::with_delay(&engine, "shell", Duration::from_millis(300)).await;
    let n = 1_500_000;
    let s = open(&caller, &page, flood(n, 'y')).await;
    write(&caller, &s, "\n").await;
    wait_exited(&caller, &s.id).await;
    let mut expected = b"\r\n".to_vec();
    expected.extend(std::iter::repeat_n(b'y', n));
    expected.extend_from_slice(b"\r\nEND\r\n");
    assert!(
        page.bytes(&s.id).len() < expected.len(),
        "the program finished before the consumer had it all"
    );
    assert!(
        eventually(WAIT, || page
            .payloads()
            .iter()
            .any(|p| p["session_id"] == s.id && p["eof"] == true))
        .await
    );
    let got = page.bytes(&s.id);
    assert_eq!(got.len(), expected.len());
    assert!(
        got == expected,
        "delivered bytes differ from the program's output"
    );
    let payloads = page.payloads();
    assert!(payloads.iter().all(|p| p["truncated"] == false));
    let seqs: Vec<u64> = payloads
        .iter()
        .map(|p| p["sequence"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    // Coalesced: far fewer invocations than reads.
    assert!(payloads.len() < 20, "{} invocations", payloads.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_flood_of_several_mib_is_delivered_in_order_and_truncation_is_reported() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let n = 6 * 1024 * 1024;
    let s = open(&caller, &page, flood(n, 'z')).await;
    write(&caller, &s, "\n").await;
    assert!(
        eventually(Duration::from_secs(60), || page
            .payloads()
            .iter()
            .any(|p| p["session_id"] == s.id && p["eof"] == true))
        .await
    );
    let got = page.bytes(&s.id);
    let body = got.strip_suffix(b"\r\nEND\r\n").expect("ends with END");
    let body = body.strip_prefix(b"\r\n").unwrap_or(body);
    assert!(body.iter().all(|&b| b == b'z'));
    let truncated = page.payloads().iter().any(|p| p["truncated"] == true);
    if truncated {
        assert!(body.len() < n, "a gap was reported but nothing is missing");
    } else {
        assert_eq!(body.len(), n, "bytes lost without a gap being reported");
    }
}

/// A consumer that keeps up gets all of a flood many times the ring, byte for byte and in
/// order, without a gap: while it acknowledges, the reader waits for room instead of evicting
/// output it was about to be sent (the program blocks in `write`, as on any terminal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_many_times_the_ring_reaches_a_consumer_that_keeps_up_whole() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let n = 16 * 1024 * 1024;
    let s = open(&caller, &page, flood(n, 'w')).await;
    write(&caller, &s, "\n").await;
    assert!(
        eventually(Duration::from_secs(120), || page.has_eof(&s.id)).await,
        "the flood never ended"
    );
    let payloads: Vec<Value> = page
        .payloads()
        .into_iter()
        .filter(|p| p["session_id"] == s.id)
        .collect();
    let gaps = payloads.iter().filter(|p| p["truncated"] == true).count();
    assert_eq!(
        gaps,
        0,
        "{gaps} of {} deliveries reported a gap",
        payloads.len()
    );
    assert!(payloads.iter().all(|p| p["repeat"] == false));
    let seqs: Vec<u64> = payloads
        .iter()
        .map(|p| p["sequence"].as_u64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "out of order: {seqs:?}"
    );
    let got = page.bytes(&s.id);
    let mut expected = b"\r\n".to_vec();
    expected.extend(std::iter::repeat_n(b'w', n));
    expected.extend_from_slice(b"\r\nEND\r\n");
    assert_eq!(got.len(), expected.len(), "bytes delivered");
    assert!(
        got == expected,
        "delivered bytes differ from the program's output"
    );
    // Each delivery carries at most DELIVERY_BYTES.
    let most = payloads
        .iter()
        .filter_map(|p| p["data"].as_str())
        .map(|d| B64.decode(d).unwrap().len())
        .max()
        .unwrap();
    assert!(most <= iii_shell_protocol::pty::DELIVERY_BYTES, "{most}");
}

/// The wait for a consumer is bounded: one that stops answering holds the program up once,
/// for at most the pacing limit (250 ms), and from then on the program runs free (what the
/// ring cannot keep is a gap, as before), until that consumer has caught up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_stops_answering_holds_the_program_up_once_at_most() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::with_delay(&engine, "shell", Duration::from_secs(25)).await;
    let n = 12 * 1024 * 1024;
    let s = open(&caller, &page, flood(n, 'v')).await;
    let t = Instant::now();
    write(&caller, &s, "\n").await;
    let listed = wait_exited(&caller, &s.id).await;
    let took = t.elapsed();
    assert_eq!(listed["status"]["exited"]["exit_code"], 0);
    assert!(
        took < Duration::from_secs(10),
        "the program took {took:?}: it was held up by a consumer that does not answer"
    );
    assert!(
        page.got.lock().unwrap().is_empty(),
        "the consumer answered something"
    );
    // The ring kept the tail; what it dropped is reported.
    assert_eq!(listed["truncated"], true);
}

/// Floods in several sessions take turns through the engine (so an echo never waits behind
/// more than one delivery), but a page that stops answering gives its turn back after a
/// moment: another session's flood to a page that answers still arrives whole, in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_stops_answering_does_not_hold_up_another_sessions_output() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let stuck = Page::stalling_past(&engine, "shell", 16 * 1024).await;
    let page = Page::new(&engine, "shell").await;
    let a = open(&caller, &stuck, flood(8 * 1024 * 1024, 'a')).await;
    write(&caller, &a, "\n").await;
    // The stuck page holds a large delivery (it answered only the small ones before it).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = 4 * 1024 * 1024;
    let b = open(&caller, &page, flood(n, 'b')).await;
    let t = Instant::now();
    write(&caller, &b, "\n").await;
    assert!(
        eventually(Duration::from_secs(15), || page.has_eof(&b.id)).await,
        "the other session's flood was held up behind the stuck page ({:?}, {} bytes arrived)",
        t.elapsed(),
        page.bytes(&b.id).len()
    );
    let got = page.bytes(&b.id);
    assert_eq!(got.len(), 2 + n + 7, "bytes delivered");
    assert!(page.payloads().iter().all(|p| p["truncated"] == false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_survive_an_engine_reconnect() {
    let engine = TestEngine::start().await;
    let w = Worker::builder().engine(&engine).fast_keepalive().start();
    wait_ready(&engine, &w).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let s = open(&caller, &page, json!({})).await;
    write(&caller, &s, "echo first\n").await;
    page.wait_text(&s.id, "first").await;
    let before = w.connections(&engine).len();
    engine.drop_connections().await;
    assert!(
        eventually(WAIT, || w.connections(&engine).len() > before
            && w.info(&engine).is_some_and(|i| i.connected))
        .await
    );
    engine
        .wait_for_function("shell::pty::write", WAIT)
        .await
        .expect("re-registered");
    // The page's own connection was dropped too: it registers again.
    let page2 = Page::new(&engine, "shell").await;
    let caller = engine.client().await;
    let r = caller
        .call(
            "shell::pty::attach",
            json!({"session_id": s.id, "reconnect_token": s.token, "after_sequence": 0,
                   "cols": 80, "rows": 24, "output_function_id": page2.id}),
        )
        .await
        .expect("the session outlived the reconnect");
    assert!(String::from_utf8_lossy(&decode_frames(&r["frames"])).contains("first"));
    write(&caller, &s, "echo second\n").await;
    page2.wait_text(&s.id, "second").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_configuration_keys() {
    let engine = TestEngine::start().await;
    let mut cfg = iii_shell_protocol::config::Config::builtin_default();
    cfg.pty.max_sessions = 1;
    cfg.pty.exited_retention_secs = 1;
    let w = Worker::builder().engine(&engine).seed(&cfg).start();
    wait_ready(&engine, &w).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let s = open(&caller, &page, json!({})).await;
    let r = caller
        .call(
            "shell::pty::open",
            json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": page.id}),
        )
        .await;
    assert_code(&r, "invocation_failed");
    assert!(r.unwrap_err().message.contains("max pty sessions reached"));
    // An exited session is dropped once its retention ran out, which frees the slot.
    write(&caller, &s, "exit 0\n").await;
    wait_exited(&caller, &s.id).await;
    let deadline = Instant::now() + WAIT;
    while summary(&caller, &s.id).await.is_some() {
        assert!(
            Instant::now() < deadline,
            "the exited session was never dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    open(&caller, &page, json!({})).await;
}

/// A child process killed (with its session) on drop.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_in(dir: &std::path::Path, args: &[&str], engine: &TestEngine, log: &str) -> Proc {
    let child = std::process::Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("III_URL", engine.url())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env_remove("III_WORKER_NAME")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join(log)).unwrap())
        .spawn()
        .expect("spawn iii-shell");
    Proc(child)
}

/// Two-unit deployment: the broker is killed and a new one started while the executor stays
/// up. The session is still there, and its output reaches the page through the new broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_survive_a_broker_restart_while_the_executor_stays_up() {
    if !is_root() {
        panic!(
            "this test needs root (the broker drops to `nobody`, the executor hands it the socket)"
        );
    }
    let engine = TestEngine::start().await;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("executor.sock");
    let sock_s = sock.to_string_lossy().into_owned();
    let _executor = spawn_in(
        dir.path(),
        &["executor", "--socket", &sock_s, "--peer-uid", "65534"],
        &engine,
        "executor.log",
    );
    assert!(
        eventually(WAIT, || sock.exists()).await,
        "executor never listened"
    );
    let mut broker = spawn_in(
        dir.path(),
        &["broker", "--executor-socket", &sock_s],
        &engine,
        "broker1.log",
    );
    let log = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    assert!(
        engine
            .wait_for_function("shell::pty::open", WAIT)
            .await
            .is_some(),
        "broker never registered; log:\n{}",
        log("broker1.log")
    );
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let s = open(&caller, &page, json!({})).await;
    write(&caller, &s, "echo first-$((40+2))\n").await;
    page.wait_text(&s.id, "first-42").await;

    // The broker dies; output the program produces meanwhile waits in the ring.
    let _ = broker.0.kill();
    let _ = broker.0.wait();
    assert!(
        engine
            .wait_until(WAIT, |e| e.function("shell::pty::write").is_none())
            .await
    );
    drop(broker);
    let _broker2 = spawn_in(
        dir.path(),
        &["broker", "--executor-socket", &sock_s],
        &engine,
        "broker2.log",
    );
    assert!(
        engine
            .wait_for_function("shell::pty::write", WAIT)
            .await
            .is_some(),
        "the new broker never registered; log:\n{}",
        log("broker2.log")
    );
    let listed = summary(&caller, &s.id)
        .await
        .expect("the session outlived its broker");
    assert_eq!(listed["status"], "attached");
    write(&caller, &s, "echo second-$((40+2))\n").await;
    page.wait_text(&s.id, "second-42").await;
    // What the dead broker had delivered but not acknowledged comes again, flagged, with
    // the bounds the executor pushed it with, never merged with new output: dropping every
    // delivery whose sequence is not above the last one leaves each byte exactly once. The
    // dead broker may have coalesced several pushes into one delivery, so a repeat's bounds
    // need not be a delivery's: its bytes are those that ended at or before the first
    // delivery whose sequence reached the repeat's.
    let mut applied = Vec::new();
    let mut end_at: Vec<(u64, usize)> = Vec::new();
    let mut top = 0;
    for p in page.payloads().iter().filter(|p| p["session_id"] == s.id) {
        let seq = p["sequence"].as_u64().unwrap();
        let data = p["data"]
            .as_str()
            .map(|d| B64.decode(d).unwrap())
            .unwrap_or_default();
        if seq <= top {
            assert_eq!(
                p["repeat"], true,
                "an old sequence not flagged as a repeat: {p}"
            );
            let &(reached, end) = end_at
                .iter()
                .find(|(t, _)| *t >= seq)
                .expect("a delivery reached every sequence up to the top");
            let before = &applied[..end];
            let matches = if reached == seq {
                before.ends_with(&data)
            } else {
                before
                    .windows(data.len().max(1))
                    .any(|w| w == data.as_slice())
                    || data.is_empty()
            };
            assert!(matches, "a repeat with bytes never delivered: {p}");
            continue;
        }
        top = seq;
        applied.extend(data);
        end_at.push((seq, applied.len()));
    }
    let text = String::from_utf8_lossy(&applied).into_owned();
    // The typed line is echoed once and its output appears once (the shell computes the
    // marker, so the echo does not contain it).
    for (typed, output) in [
        ("echo first-$((40+2))\r\n", "first-42\r\n"),
        ("echo second-$((40+2))\r\n", "second-42\r\n"),
    ] {
        assert_eq!(text.matches(typed).count(), 1, "echo once: {text:?}");
        assert_eq!(text.matches(output).count(), 1, "output once: {text:?}");
    }
}

/// A page that went away (its output function is gone) leaves the session unattached, its
/// output waiting in the ring, so the same page from another browser can adopt it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_output_function_detaches_the_session_and_its_output_waits() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "pi").await;
    let s = open(&caller, &page, json!({})).await;
    write(&caller, &s, "echo one-$((40+2))\n").await;
    page.wait_text(&s.id, "one-42").await;
    page._client.unregister_function(&page.id);
    assert!(
        engine
            .wait_until(WAIT, |e| e.function(&page.id).is_none())
            .await
    );
    write(&caller, &s, "echo two-while-gone\n").await;
    let deadline = Instant::now() + WAIT;
    while summary(&caller, &s.id).await.unwrap()["status"] != "detached" {
        assert!(Instant::now() < deadline, "never detached");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let other = Page::new(&engine, "pi").await;
    let a = caller
        .call(
            "shell::pty::adopt",
            json!({"session_id": s.id, "output_function_id": other.id, "cols": 80, "rows": 24,
                   "after_sequence": page.last_sequence(&s.id)}),
        )
        .await
        .unwrap();
    let replay = String::from_utf8_lossy(&decode_frames(&a["frames"])).into_owned();
    assert!(replay.contains("two-while-gone\r\n"), "{replay:?}");
    assert!(
        !replay.contains("one-42"),
        "only what the page missed: {replay:?}"
    );
}

/// A session is confined like a command: jailed `cwd` (relative to the primary root, escapes
/// refused), the command Landlock domain (no writes outside the roots and scratch paths),
/// its own job cgroup and no_new_privs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_run_jailed_and_confined_like_commands() {
    let engine = TestEngine::start().await;
    let root = tempfile::tempdir().unwrap();
    let root_path = std::fs::canonicalize(root.path()).unwrap();
    std::fs::create_dir(root_path.join("sub")).unwrap();
    let w = Worker::builder()
        .engine(&engine)
        .seed(&jailed(&root_path))
        .start();
    wait_ready(&engine, &w).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;

    for cwd in ["/etc", "sub/../.."] {
        let payload = json!({"cwd": cwd, "cols": 80, "rows": 24, "output_function_id": page.id});
        expect_engine_code(&caller, "shell::pty::open", payload, "S215").await;
    }

    let outside = format!("/root/iii-pty-probe-{}", uuid::Uuid::new_v4());
    let script = format!(
        "pwd; echo x > {outside}; echo write-rc=$?; grep NoNewPrivs /proc/self/status; cat /proc/self/cgroup; echo done-probing"
    );
    let r = caller
        .call(
            "shell::pty::open",
            json!({"cwd": "sub", "cols": 80, "rows": 24, "output_function_id": page.id,
                   "program": "sh", "args": ["-c", script]}),
        )
        .await
        .unwrap();
    let expected_cwd = root_path.join("sub").to_string_lossy().into_owned();
    assert_eq!(r["cwd"], expected_cwd.as_str(), "the canonical cwd");
    let s = session_of(&r);
    page.wait_text(&s.id, "done-probing").await;
    let text = page.text(&s.id);
    assert!(text.contains(&format!("{expected_cwd}\r\n")), "{text}");
    assert!(
        !text.contains("write-rc=0"),
        "wrote outside the jail: {text}"
    );
    assert!(!std::path::Path::new(&outside).exists());
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    assert!(text.contains("/job-"), "not in a job cgroup: {text}");
}

/// Sessions act as the command user (`confinement.run_as`), exactly like commands: a root
/// worker jailed with `run_as: 4242:4242` starts the login shell as uid/gid 4242 with no
/// other group, and it cannot change the mode of a root-owned file outside the jail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_run_as_the_command_user() {
    if !is_root() {
        panic!("this test needs root (the executor switches to confinement.run_as)");
    }
    let engine = TestEngine::start().await;
    let root = tempfile::tempdir().unwrap();
    let root_path = std::fs::canonicalize(root.path()).unwrap();
    std::os::unix::fs::chown(&root_path, Some(4242), Some(4242)).unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("root-owned");
    std::fs::write(&victim, "x").unwrap();
    std::fs::set_permissions(
        outside.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&victim, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let mut config = jailed(&root_path);
    config.confinement.run_as = Some("4242:4242".into());
    let w = Worker::builder().engine(&engine).seed(&config).start();
    wait_ready(&engine, &w).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let script = format!(
        "grep -E '^(Uid|Gid|Groups):' /proc/self/status; chmod 4755 {v}; echo chmod-rc=$?; echo done-probing",
        v = victim.display()
    );
    let r = caller
        .call(
            "shell::pty::open",
            json!({"cwd": ".", "cols": 80, "rows": 24, "output_function_id": page.id,
                   "program": "sh", "args": ["-c", script]}),
        )
        .await
        .unwrap();
    let s = session_of(&r);
    page.wait_text(&s.id, "done-probing").await;
    let text = page.text(&s.id);
    assert!(text.contains("Uid:\t4242\t4242\t4242\t4242"), "{text}");
    assert!(text.contains("Gid:\t4242\t4242\t4242\t4242"), "{text}");
    assert!(
        text.contains("Groups:\t4242 \r\n"),
        "only the gid, no root group: {text}"
    );
    assert!(!text.contains("chmod-rc=0"), "{text}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&victim).unwrap().permissions().mode() & 0o7777,
        0o644
    );
}

/// A program that never reads its input cannot wedge a write: the call returns what went in.
/// Oversized and malformed writes are refused before they reach the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_does_not_read_cannot_wedge_a_write() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    // Raw mode: the line discipline keeps what it cannot hand on, until it is full.
    let s = open(
        &caller,
        &page,
        json!({"program": "sh", "args": ["-c", "stty raw -echo; echo raw-now; sleep 60"]}),
    )
    .await;
    page.wait_text(&s.id, "raw-now").await;
    let big = vec![b'q'; 1024 * 1024];
    let t = Instant::now();
    let r = caller
        .call(
            "shell::pty::write",
            json!({"session_id": s.id, "access_key": s.key, "data": B64.encode(&big)}),
        )
        .await
        .unwrap();
    let written = r["written"].as_u64().unwrap();
    assert!(written < big.len() as u64, "{written}");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    for (function, payload, code) in [
        (
            "shell::pty::write",
            json!({"session_id": s.id, "access_key": s.key,
                   "data": B64.encode(vec![0u8; 1024 * 1024 + 1])}),
            "S218",
        ),
        (
            "shell::pty::write",
            json!({"session_id": s.id, "access_key": s.key, "data": "%%%"}),
            "S210",
        ),
        (
            "shell::pty::resize",
            json!({"session_id": s.id, "access_key": s.key, "cols": 0, "rows": 10}),
            "S210",
        ),
    ] {
        expect_engine_code(&caller, function, payload, code).await;
    }
}

/// A command can reach only the terminals it creates itself. An operator's session
/// (`shell::pty::open`) lives in the executor's devpts instance, where commands also allocate
/// theirs; a command that opens the session's `/dev/pts/N` by path, to write fake output or
/// to read what is typed there, is refused (EACCES), and the session still works (its shell
/// got its pty from the master and `tty` names it). Unjailed as root, and jailed as a
/// `run_as` user (root only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cannot_open_a_session_pty_by_path() {
    let root = tempfile::tempdir().unwrap();
    let root_path = std::fs::canonicalize(root.path()).unwrap();
    std::fs::set_permissions(
        &root_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mut configs = vec![(
        "unjailed",
        iii_shell_protocol::config::Config::builtin_default(),
        None,
    )];
    if is_root() {
        let mut c = jailed(&root_path);
        c.confinement.run_as = Some("4242:4242".into());
        configs.push(("jailed run_as 4242", c, Some(".")));
    }
    for (what, config, cwd) in configs {
        let engine = TestEngine::start().await;
        let w = Worker::builder().engine(&engine).seed(&config).start();
        wait_ready(&engine, &w).await;
        let caller = engine.client().await;
        let page = Page::new(&engine, "shell").await;
        let extra = match cwd {
            Some(c) => json!({"cwd": c}),
            None => json!({}),
        };
        let s = open(&caller, &page, extra).await;
        // The marker is computed by the shell, so the terminal's echo of the typed line
        // (`tty-$((40+2))`) never matches it before the output arrives.
        write(&caller, &s, "tty; echo tty-$((40+2))\n").await;
        page.wait_text(&s.id, "tty-42\r\n").await;
        let text = page.text(&s.id);
        let at = text
            .rfind("/dev/pts/")
            .unwrap_or_else(|| panic!("{what}: the session has no tty: {text:?}"));
        let pts: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '/')
            .collect();
        for script in [
            format!("echo FAKE-OUTPUT > {pts}"),
            format!("head -c1 {pts}"),
            format!("chmod 666 {pts}"),
        ] {
            let mut req = json!({"command": "sh", "args": ["-c", script], "timeout_ms": 10000});
            if let Some(c) = cwd {
                req["cwd"] = json!(c);
            }
            let r = caller.call("shell::exec", req).await.expect("shell::exec");
            assert_ne!(r["exit_code"], 0, "{what}: {script}: {r}");
            let stderr = r["stderr"].as_str().unwrap_or_default();
            assert!(
                stderr.contains("Permission denied") || stderr.contains("Operation not permitted"),
                "{what}: {script}: {r}"
            );
        }
        write(&caller, &s, "echo still-$((40+2))\n").await;
        page.wait_text(&s.id, "still-42\r\n").await;
        assert!(
            !page.text(&s.id).contains("FAKE-OUTPUT\r\n"),
            "{what}: a command wrote into the session: {:?}",
            page.text(&s.id)
        );
    }
}

/// A page registers its output function and then opens the session, but the engine gives no
/// answer to a registration and may apply it after it routed the open. Deliveries that meet
/// `function_not_found` in the first seconds of an attachment wait for the function (in
/// order) instead of detaching the session; a function that never appears still detaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_waits_for_an_output_function_registered_just_after_the_open() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let id = format!(
        "iii::shell-ui::pty-output::console-{}",
        uuid::Uuid::new_v4()
    );
    let open_with = |id: &str| json!({"cwd": "/tmp", "cols": 80, "rows": 24, "program": "sh", "output_function_id": id});
    let r = caller
        .call("shell::pty::open", open_with(&id))
        .await
        .expect("shell::pty::open");
    let s = session_of(&r);
    write(&caller, &s, "echo late-$((40+2))\n").await;
    // Deliveries have met function_not_found meanwhile.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let page = Page::registering(&engine, id, Duration::ZERO).await;
    page.wait_text(&s.id, "late-42\r\n").await;
    assert_eq!(summary(&caller, &s.id).await.unwrap()["status"], "attached");
    // Every byte once, from the first: the prompt came before the typed line.
    let text = page.text(&s.id);
    assert_eq!(text.matches("echo late-$((40+2))").count(), 1, "{text:?}");

    // Nobody ever registers this one: the session ends up detached, its output kept.
    let nobody = format!(
        "iii::shell-ui::pty-output::console-{}",
        uuid::Uuid::new_v4()
    );
    let r = caller
        .call("shell::pty::open", open_with(&nobody))
        .await
        .expect("shell::pty::open");
    let lost = session_of(&r);
    let deadline = Instant::now() + WAIT;
    while summary(&caller, &lost.id).await.unwrap()["status"] != "detached" {
        assert!(Instant::now() < deadline, "never detached");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A session's program starts in a pre-started process, as a command does, with the
/// terminal as its stdin, stdout, stderr and controlling terminal, in its own session and
/// job cgroup; a program that cannot be executed is the open's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_starts_in_a_pre_started_process_on_its_own_terminal() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    caller
        .call("shell::exec", json!({"command": "true"}))
        .await
        .unwrap();
    let executor = w.executor_pid().expect("executor pid");
    assert!(
        eventually(WAIT, || waiting_of(executor as u32).len() == 2).await,
        "two waiting processes: {:?}",
        waiting_of(executor as u32)
    );
    let waiting = waiting_of(executor as u32);
    let script = "[ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all-three-are-the-tty; \
                  [ \"$(cut -d' ' -f7 /proc/self/stat)\" != 0 ] && echo has-a-controlling-tty; \
                  [ \"$(cut -d' ' -f6 /proc/self/stat)\" = $$ ] && echo own-session; \
                  grep -c '/job-' /proc/self/cgroup; stty size; echo done-probing";
    let s = open(&caller, &page, json!({"args": ["-c", script]})).await;
    assert!(
        waiting.contains(&s.pid),
        "the session's program is pid {}, not one of the waiting processes {waiting:?}",
        s.pid
    );
    page.wait_text(&s.id, "done-probing").await;
    let text = page.text(&s.id);
    for needle in [
        "all-three-are-the-tty",
        "has-a-controlling-tty",
        "own-session",
        "24 80",
    ] {
        assert!(text.contains(needle), "{needle} missing: {text}");
    }
    // The pool is topped up after the open.
    assert!(
        eventually(WAIT, || waiting_of(executor as u32).len() == 2).await,
        "two waiting processes again: {:?}",
        waiting_of(executor as u32)
    );

    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("not-a-program");
    std::fs::write(&prog, b"\x00\x01\x02\x03 not an executable format").unwrap();
    std::fs::set_permissions(&prog, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let e = caller
        .call(
            "shell::pty::open",
            json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": page.id,
                   "program": prog.to_str().unwrap()}),
        )
        .await
        .expect_err("a program that cannot be executed");
    assert!(
        e.message.contains("Exec format error (os error 8)"),
        "{e:?}"
    );
    assert!(
        eventually(WAIT, || zombies_of(executor as u32).is_empty()).await,
        "zombies: {:?}",
        zombies_of(executor as u32)
    );
}

/// A terminal handed to a waiting process that was stopped before it took the program (a
/// same-uid process can do that) waits for it on its own: other calls are answered meanwhile,
/// and the open still returns, within the confirmation bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_handed_to_a_stopped_process_holds_up_no_other_call() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = std::sync::Arc::new(engine.client().await);
    let page = Page::new(&engine, "shell").await;
    caller
        .call("shell::exec", json!({"command": "true"}))
        .await
        .unwrap();
    let executor = w.executor_pid().expect("executor pid") as u32;
    assert!(
        eventually(WAIT, || waiting_of(executor).len() == 2).await,
        "two waiting processes: {:?}",
        waiting_of(executor)
    );
    let waiting = waiting_of(executor);
    for &pid in &waiting {
        // SAFETY: kill(2) on processes this test just listed; no memory is passed.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }
    let open = {
        let (c, id) = (caller.clone(), page.id.clone());
        tokio::spawn(async move {
            c.call(
                "shell::pty::open",
                json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": id,
                       "program": "true"}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !open.is_finished(),
        "the open waits for the program to start"
    );
    let t = Instant::now();
    caller
        .call("shell::fs::stat", json!({"path": "/tmp"}))
        .await
        .expect("stat while an open waits");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "another call waited {:?} behind the open",
        t.elapsed()
    );
    let r = tokio::time::timeout(Duration::from_secs(15), open)
        .await
        .expect("the open returned within the confirmation bound")
        .unwrap();
    assert!(r.is_ok(), "{r:?}");
    for &pid in &waiting {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
}

/// `detach` with the session's own credentials.
async fn detach(caller: &TestClient, s: &Session) {
    caller
        .call(
            "shell::pty::detach",
            json!({"session_id": s.id, "access_key": s.key}),
        )
        .await
        .expect("shell::pty::detach");
}

/// Polls `sessions` until the session holds `bytes` bytes of output.
async fn wait_frame_bytes(caller: &TestClient, id: &str, bytes: u64) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let s = summary(caller, id).await.expect("session listed");
        if s["frame_bytes"].as_u64() == Some(bytes) {
            return s;
        }
        assert!(Instant::now() < deadline, "never held {bytes} bytes: {s}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The `sequence` that `sessions` reports names a frame that no longer grows: output that
/// arrives after the listing goes into a later frame, so a page that resumes from the listed
/// sequence with `attach {after_sequence}` gets it (before, it was appended to the listed
/// frame and such a page never saw it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_sequence_names_a_frame_that_no_longer_grows() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let script = "stty -echo; printf READY; read a; printf AAA; read b; printf BBB; exec sleep 60";
    let s = open(&caller, &page, json!({"args": ["-c", script]})).await;
    page.wait_text(&s.id, "READY").await;
    detach(&caller, &s).await;
    let base = summary(&caller, &s.id).await.unwrap()["frame_bytes"]
        .as_u64()
        .unwrap();
    write(&caller, &s, "\n").await;
    let listed = wait_frame_bytes(&caller, &s.id, base + 3).await;
    let seq = listed["sequence"].as_u64().unwrap();
    write(&caller, &s, "\n").await;
    wait_frame_bytes(&caller, &s.id, base + 6).await;
    let a = caller
        .call(
            "shell::pty::attach",
            json!({"session_id": s.id, "reconnect_token": s.token, "after_sequence": seq,
                   "cols": 80, "rows": 24, "output_function_id": page.id}),
        )
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&decode_frames(&a["frames"])),
        "BBB",
        "resumed after the listed sequence {seq}: {a}"
    );
}

/// A worker whose `pty` section is tweaked, ready, with a page of family `shell`.
async fn pty_worker(
    engine: &TestEngine,
    tweak: impl FnOnce(&mut iii_shell_policy::config::PtyConfig),
) -> Worker {
    let mut cfg = iii_shell_protocol::config::Config::builtin_default();
    tweak(&mut cfg.pty);
    let w = Worker::builder().engine(engine).seed(&cfg).start();
    wait_ready(engine, &w).await;
    w
}

/// The review's attack: a caller opening sessions whose program exits at once held every
/// slot for the whole exited retention (an hour), and only it could close them. Now an
/// exited session keeps its output replayable until an open needs its slot (the one that
/// exited first goes first), and one caller (engine worker) holds at most
/// `pty.max_sessions_per_caller` running sessions, so another caller always finds a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_caller_can_hold_every_terminal_slot() {
    let engine = TestEngine::start().await;
    let _w = pty_worker(&engine, |p| {
        p.max_sessions = 3;
        p.max_sessions_per_caller = 2;
    })
    .await;
    let hog = engine.client().await;
    let other = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    // Sessions whose program exits at once, as many as there are slots.
    let mut exited = Vec::new();
    for i in 0..3 {
        let s = open(
            &hog,
            &page,
            json!({"args": ["-c", format!("echo gone-{i}")]}),
        )
        .await;
        wait_exited(&hog, &s.id).await;
        exited.push(s);
    }
    // Exited, each still replayable.
    let a = hog
        .call(
            "shell::pty::attach",
            json!({"session_id": exited[0].id, "reconnect_token": exited[0].token,
                   "after_sequence": 0, "cols": 80, "rows": 24, "output_function_id": page.id}),
        )
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&decode_frames(&a["frames"])).contains("gone-0"));
    // Another caller still opens: the session that exited first made room.
    let mine = open(&other, &page, json!({})).await;
    assert!(summary(&other, &exited[0].id).await.is_none());
    assert!(summary(&other, &exited[1].id).await.is_some());
    let closed = hog
        .call(
            "shell::pty::close",
            json!({"session_id": exited[0].id, "access_key": exited[0].key}),
        )
        .await;
    assert_code(&closed, "S211");
    // Running sessions: the hog gets two, never the last slot.
    open(&hog, &page, json!({})).await;
    open(&hog, &page, json!({})).await;
    let r = hog
        .call(
            "shell::pty::open",
            json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": page.id}),
        )
        .await;
    assert_code(&r, "invocation_failed");
    let m = r.unwrap_err().message;
    assert!(
        m.starts_with("max pty sessions per caller reached (2 running for caller ")
            && m.ends_with("of pty.max_sessions_per_caller = 2): close one with shell::pty::close, or raise pty.max_sessions_per_caller"),
        "{m}"
    );
    // Every slot is running now: the total cap still holds, for everyone.
    let r = other
        .call(
            "shell::pty::open",
            json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": page.id}),
        )
        .await;
    assert_eq!(
        r.unwrap_err().message,
        "max pty sessions reached (3 of pty.max_sessions = 3): close one with shell::pty::close, or raise pty.max_sessions"
    );
    // The other caller's own session frees a slot when it is closed.
    other
        .call(
            "shell::pty::close",
            json!({"session_id": mine.id, "access_key": mine.key}),
        )
        .await
        .unwrap();
    open(&other, &page, json!({})).await;
}

/// `pty.adopt`: `any` (the default, the seed's rule) lets any caller take a detached
/// session; `opener` only the engine worker that holds it; `off` nobody. Refusals are S210.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_can_be_narrowed_to_the_opener_or_turned_off() {
    use iii_shell_policy::config::PtyAdopt;
    for mode in [PtyAdopt::Any, PtyAdopt::Opener, PtyAdopt::Off] {
        let engine = TestEngine::start().await;
        let _w = pty_worker(&engine, |p| p.adopt = mode).await;
        let opener = engine.client().await;
        let stranger = engine.client().await;
        let page = Page::new(&engine, "shell").await;
        let s = open(&opener, &page, json!({})).await;
        detach(&opener, &s).await;
        let adopt =
            json!({"session_id": s.id, "output_function_id": page.id, "cols": 80, "rows": 24});
        let by_stranger = stranger.call("shell::pty::adopt", adopt.clone()).await;
        if mode == PtyAdopt::Any {
            assert_eq!(by_stranger.unwrap()["status"], "attached");
            continue;
        }
        let e = by_stranger.unwrap_err();
        assert_eq!(e.code, "S210", "{e:?}");
        match mode {
            PtyAdopt::Any => unreachable!(),
            PtyAdopt::Opener => assert_eq!(
                e.message,
                format!("pty session {} is held by another engine worker: with pty.adopt: opener only the worker that opened it (or last attached to it) may adopt it", s.id)
            ),
            PtyAdopt::Off => assert_eq!(
                e.message,
                "shell::pty::adopt is turned off on this worker (pty.adopt: off): a session is taken back only with its reconnect token (shell::pty::attach)"
            ),
        }
        let by_opener = opener.call("shell::pty::adopt", adopt.clone()).await;
        if mode == PtyAdopt::Off {
            assert_code(&by_opener, "S210");
        } else {
            assert_eq!(by_opener.unwrap()["status"], "attached");
        }
        if mode == PtyAdopt::Off {
            // The refused adoptions changed nothing: the old credentials still work.
            assert_eq!(write(&opener, &s, "true\n").await["written"], 5);
        }
    }
}

/// Hostile session ids on every call that takes one: each is S211, exactly like an unknown
/// session, and the refusal repeats at most 64 bytes of the id, quoted and escaped (a
/// 200 KiB id came back whole before, and a NUL or newline in it raw).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_session_ids_are_unknown_sessions_and_never_echoed_whole() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let s = open(&caller, &page, json!({})).await;
    let long = "a".repeat(200 * 1024);
    let ids = [
        ("".to_string(), "\"\"".to_string()),
        ("../../etc/passwd".into(), "\"../../etc/passwd\"".into()),
        ("x\u{0}y\nz".into(), "\"x\\0y\\nz\"".into()),
        (format!("{}x", s.id), format!("\"{}x\"", s.id)),
        (long.clone(), format!("\"{}\"…", &long[..64])),
        ("é".repeat(40), format!("\"{}\"…", "é".repeat(32))),
    ];
    for (id, shown) in &ids {
        let calls = [
            (
                "shell::pty::write",
                json!({"session_id": id, "access_key": s.key, "data": "eA=="}),
            ),
            (
                "shell::pty::resize",
                json!({"session_id": id, "access_key": s.key, "cols": 9, "rows": 9}),
            ),
            (
                "shell::pty::detach",
                json!({"session_id": id, "access_key": s.key}),
            ),
            (
                "shell::pty::close",
                json!({"session_id": id, "access_key": s.key}),
            ),
            (
                "shell::pty::attach",
                json!({"session_id": id, "reconnect_token": s.token,
                "after_sequence": 0, "cols": 80, "rows": 24, "output_function_id": page.id}),
            ),
        ];
        for (f, req) in calls {
            let e = caller.call(f, req).await.unwrap_err();
            assert_eq!(e.code, "S211", "{f}");
            assert_eq!(
                e.message,
                format!("no such pty session, or the credential does not match: {shown}"),
                "{f}"
            );
        }
    }
    // The real session is untouched and the worker is fine.
    write(&caller, &s, "echo still-$((40+2))\n").await;
    page.wait_text(&s.id, "still-42").await;
    let mut w = w;
    assert!(w.try_exit().is_none(), "{}", w.stderr());
}

/// Sizes: 0 in either dimension is S210 on open, resize and attach, and changes nothing;
/// 65535x65535 (the most a `u16` holds) is applied as it is; past it is a malformed payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_sizes_at_the_edges() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let s = open(&caller, &page, json!({"cols": 65535, "rows": 65535})).await;
    write(&caller, &s, "stty size; echo sized-$((40+2))\n").await;
    page.wait_text(&s.id, "65535 65535\r\nsized-42").await;
    for (cols, rows) in [(0, 0), (0, 5), (5, 0)] {
        let r = caller
            .call(
                "shell::pty::resize",
                json!({"session_id": s.id, "access_key": s.key, "cols": cols, "rows": rows}),
            )
            .await;
        let e = r.unwrap_err();
        assert_eq!(e.code, "S210");
        assert_eq!(
            e.message,
            format!("cols and rows must be at least 1 (got {cols}x{rows})")
        );
        let r = caller
            .call(
                "shell::pty::attach",
                json!({"session_id": s.id, "reconnect_token": s.token, "after_sequence": 0,
                       "cols": cols, "rows": rows, "output_function_id": page.id}),
            )
            .await;
        assert_code(&r, "S210");
        let r = caller
            .call(
                "shell::pty::open",
                json!({"cwd": "/tmp", "cols": cols, "rows": rows, "output_function_id": page.id}),
            )
            .await;
        assert_code(&r, "S210");
    }
    let r = caller
        .call(
            "shell::pty::resize",
            json!({"session_id": s.id, "access_key": s.key, "cols": 65536, "rows": 1}),
        )
        .await;
    assert_code(&r, "S210");
    // Nothing above changed the size.
    write(&caller, &s, "stty size; echo again-$((40+2))\n").await;
    page.wait_text(&s.id, "65535 65535\r\nagain-42").await;
    let r = caller
        .call(
            "shell::pty::resize",
            json!({"session_id": s.id, "access_key": s.key, "cols": 1, "rows": 1}),
        )
        .await
        .unwrap();
    assert_eq!(r, json!({"cols": 1, "rows": 1}));
}

/// Close racing adopts of the same detached session: exactly one wins. Either the close
/// (every adopt after it is S211) or one adopt (the close then meets rotated credentials,
/// S211, and the adopter keeps a live session). Before, a close that had checked the key
/// could still kill a session an adopt had just taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_and_adopt_races_have_exactly_one_winner() {
    let engine = TestEngine::start().await;
    let _w = pty_worker(&engine, |p| p.max_sessions_per_caller = 32).await;
    let caller = Arc::new(engine.client().await);
    let page = Page::new(&engine, "shell").await;
    for round in 0..12 {
        let s = open(&caller, &page, json!({})).await;
        detach(&caller, &s).await;
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (c, id, key, target) =
                (caller.clone(), s.id.clone(), s.key.clone(), page.id.clone());
            tasks.push(tokio::spawn(async move {
                if i == 2 {
                    (
                        "close",
                        c.call(
                            "shell::pty::close",
                            json!({"session_id": id, "access_key": key}),
                        )
                        .await,
                    )
                } else {
                    (
                        "adopt",
                        c.call(
                            "shell::pty::adopt",
                            json!({"session_id": id,
                        "output_function_id": target, "cols": 80, "rows": 24}),
                        )
                        .await,
                    )
                }
            }));
        }
        let mut wins = Vec::new();
        for t in tasks {
            let (what, r) = t.await.unwrap();
            match r {
                Ok(v) => wins.push((what, v)),
                Err(e) => assert!(
                    e.code == "S211" || e.code == "S210",
                    "round {round}: {what}: {e:?}"
                ),
            }
        }
        assert_eq!(wins.len(), 1, "round {round}: {wins:?}");
        let listed = summary(&caller, &s.id).await;
        if wins[0].0 == "close" {
            assert!(listed.is_none(), "round {round}");
        } else {
            assert_eq!(listed.unwrap()["status"], "attached", "round {round}");
            let key = wins[0].1["access_key"].as_str().unwrap();
            caller
                .call(
                    "shell::pty::close",
                    json!({"session_id": s.id, "access_key": key}),
                )
                .await
                .unwrap();
        }
    }
}

/// What a command tries on every terminal it can name: writing to it and pushing input into
/// it (`TIOCSTI`, 0x5412). One line per success; `tried N` at the end.
const TERMINAL_REACH: &str = r#"n=0
try() {
  n=$((n+1))
  if (printf INJECTED > "$1") 2>/dev/null; then echo "wrote $1"; fi
  if perl -e 'open(my $h, "<", $ARGV[0]) or exit 2; ioctl($h, 0x5412, "J") or exit 3; exit 0' "$1" 2>/dev/null; then echo "tiocsti $1"; fi
}
for l in /proc/[0-9]*/fd/*; do
  t=$(readlink "$l" 2>/dev/null) || continue
  case "$t" in /dev/pts/*|/dev/tty*) try "$l";; esac
done
for p in /dev/tty /dev/pts/[0-9]* "$@"; do [ -e "$p" ] && try "$p"; done
perl -e 'for my $f (0,1,2) { open(my $h, "<&=", $f) or next; ioctl($h, 0x5412, "J") and print "tiocsti fd $f\n" }'
echo "tried $n""#;

/// The terminal the worker was started from (its stdin and controlling terminal) and another
/// session's terminal are out of every command's reach, from `shell::exec` and from inside a
/// terminal session, jailed as another user and unjailed as root: no write, no `TIOCSTI`
/// (through `/proc/<pid>/fd`, `/dev/pts/N`, `/dev/tty` or an inherited descriptor), and
/// nothing arrives on either terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_command_reaches_the_workers_terminal_or_another_sessions() {
    use std::os::fd::AsRawFd;
    let root = tempfile::tempdir().unwrap();
    let root_path = std::fs::canonicalize(root.path()).unwrap();
    std::fs::set_permissions(
        &root_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mut configs = vec![(
        "unjailed",
        iii_shell_protocol::config::Config::builtin_default(),
        None,
    )];
    if is_root() {
        let mut c = jailed(&root_path);
        c.confinement.run_as = Some("4242:4242".into());
        configs.push(("jailed run_as 4242", c, Some(".")));
    }
    for (what, config, cwd) in configs {
        let tty = nix::pty::openpty(None, None).unwrap();
        let slave = nix::unistd::ttyname(&tty.slave).unwrap();
        let redirect = format!("exec setsid -c \"$@\" 0<>{}", slave.display());
        let engine = TestEngine::start().await;
        let w = Worker::builder()
            .engine(&engine)
            .seed(&config)
            .wrapper(&["sh", "-c", &redirect, "sh"])
            .start();
        wait_ready(&engine, &w).await;
        let caller = engine.client().await;
        let page = Page::new(&engine, "shell").await;
        let extra = match cwd {
            Some(c) => json!({"cwd": c}),
            None => json!({}),
        };
        let target = open(&caller, &page, extra.clone()).await;
        write(&caller, &target, "tty; echo tty-$((40+2))\n").await;
        page.wait_text(&target.id, "tty-42\r\n").await;
        let text = page.text(&target.id);
        let at = text.rfind("/dev/pts/").expect("the session has a tty");
        let pts: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '/')
            .collect();
        let slave_path = slave.to_string_lossy().into_owned();
        let mut req = json!({"command": "sh",
            "args": ["-c", TERMINAL_REACH, "sh", pts, slave_path], "timeout_ms": 30000});
        if let Some(c) = cwd {
            req["cwd"] = json!(c);
        }
        let r = caller.call("shell::exec", req).await.expect("shell::exec");
        let out = r["stdout"].as_str().unwrap();
        assert!(
            out.starts_with("tried ") && out.lines().count() == 1,
            "{what}: exec: {r}"
        );
        eprintln!("{what}: shell::exec {}", out.trim());
        // The same from inside a terminal session.
        let inside = open(&caller, &page, extra).await;
        write(&caller, &inside, &format!("sh -c '{}' sh {pts} {slave_path} 2>/dev/null | sed 's/^/got: /'; echo end-$((40+2))\n",
            TERMINAL_REACH.replace('\'', "'\\''"))).await;
        page.wait_text(&inside.id, "end-42\r\n").await;
        let got: Vec<String> = page
            .text(&inside.id)
            .lines()
            .filter(|l| l.starts_with("got: "))
            .map(str::to_string)
            .collect();
        assert_eq!(got.len(), 1, "{what}: session: {got:?}");
        assert!(
            got[0].starts_with("got: tried "),
            "{what}: session: {got:?}"
        );
        // Nothing reached the other session or the worker's terminal.
        write(&caller, &target, "echo after-$((40+2))\n").await;
        page.wait_text(&target.id, "after-42\r\n").await;
        let t = page.text(&target.id);
        assert!(!t.contains("INJECTED") && !t.contains('J'), "{what}: {t:?}");
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes one c_int through the pointer, which is valid.
        let rc = unsafe { libc::ioctl(tty.slave.as_raw_fd(), libc::FIONREAD, &mut queued) };
        assert_eq!(rc, 0);
        assert_eq!(
            queued, 0,
            "{what}: input was pushed into the worker's terminal"
        );
        nix::fcntl::fcntl(
            &tty.master,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .unwrap();
        let mut buf = [0u8; 4096];
        let n = nix::unistd::read(&tty.master, &mut buf).unwrap_or(0);
        let shown = String::from_utf8_lossy(&buf[..n]);
        assert!(
            !shown.contains("INJECTED") && !shown.contains('J'),
            "{what}: the worker's terminal shows {shown:?}"
        );
    }
}

/// Adopting a running session counts against `pty.max_sessions_per_caller` as opening one
/// does: a caller at its cap cannot collect more slots by adopting other callers' detached
/// sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopting_counts_against_the_per_caller_cap() {
    let engine = TestEngine::start().await;
    let _w = pty_worker(&engine, |p| {
        p.max_sessions = 4;
        p.max_sessions_per_caller = 1;
    })
    .await;
    let a = engine.client().await;
    let b = engine.client().await;
    let page = Page::new(&engine, "shell").await;
    let orphan = open(&a, &page, json!({})).await;
    detach(&a, &orphan).await;
    let own = open(&b, &page, json!({})).await;
    let adopt =
        json!({"session_id": orphan.id, "output_function_id": page.id, "cols": 80, "rows": 24});
    let e = b
        .call("shell::pty::adopt", adopt.clone())
        .await
        .unwrap_err();
    assert_eq!(e.code, "invocation_failed");
    assert!(
        e.message
            .starts_with("max pty sessions per caller reached (1 running for caller "),
        "{e:?}"
    );
    assert_eq!(summary(&b, &orphan.id).await.unwrap()["status"], "detached");
    b.call(
        "shell::pty::close",
        json!({"session_id": own.id, "access_key": own.key}),
    )
    .await
    .unwrap();
    let taken = b.call("shell::pty::adopt", adopt).await.unwrap();
    assert_eq!(taken["status"], "attached");
}

/// A first run as root: a root worker, a root-owned jail and no `confinement.run_as`, so
/// commands act as `nobody`. A terminal session without a program opens a shell that works
/// (`/bin/sh`, not nobody's `nologin`, which only says "This account is currently not
/// available"), the worker says once why it is not root's, and a `working_dir` nobody
/// cannot enter is reported at load, with the fix, by `shell::config-status` and `doctor`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_run_as_root_opens_a_working_shell_and_reports_what_nobody_cannot_enter() {
    if !is_root() {
        panic!("this test needs root (a root worker with a root-owned jail)");
    }
    let engine = TestEngine::start().await;
    let root = tempfile::tempdir().unwrap();
    let root_path = std::fs::canonicalize(root.path()).unwrap();
    std::fs::set_permissions(
        &root_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let private = root_path.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let mut config = jailed(&root_path);
    config.confinement.run_as = None;
    config.working_dir = Some(private.to_string_lossy().into_owned());
    let w = Worker::builder().engine(&engine).seed(&config).start();
    wait_ready(&engine, &w).await;
    let caller = engine.client().await;
    let gap = format!(
        "working_dir {} cannot be entered by uid 65534 that commands run as: every command without a cwd fails (S216); set confinement.run_as to a user that can enter it, or give uid 65534 access to it (chown the jail to that user)",
        private.display()
    );
    let status = caller
        .call("shell::config-status", json!({}))
        .await
        .unwrap();
    assert_eq!(status["warnings"], json!([gap]), "{status}");
    // The root itself nobody can enter: no gap for it.

    let page = Page::new(&engine, "shell").await;
    let r = caller
        .call(
            "shell::pty::open",
            json!({"cwd": ".", "cols": 80, "rows": 24, "output_function_id": page.id}),
        )
        .await
        .unwrap();
    let s = session_of(&r);
    write(&caller, &s, "echo ok$((40+2)); id -u\n").await;
    page.wait_text(&s.id, "ok42").await;
    page.wait_text(&s.id, "65534").await;
    let text = page.text(&s.id);
    assert!(!text.contains("currently not available"), "{text:?}");
    assert!(
        cmdline(s.pid).is_some_and(|c| c.starts_with("-sh")),
        "{:?}",
        cmdline(s.pid)
    );
    let note = "terminal sessions run as nobody (uid 65534), not root, like every command (confinement.run_as unset and a root-owned primary root: nobody); their shell is /bin/sh (nobody's login shell /usr/sbin/nologin is not one to log in with); to have them act as another user, set confinement.run_as to it, or make it the owner of the primary root";
    w.expect_log(note).await;
    assert_eq!(w.log_lines(note).len(), 1, "{}", w.stderr());
    assert_eq!(w.log_lines(&gap).len(), 1, "{}", w.stderr());

    // doctor says both.
    let cfg = w.dir().join("doctor.yaml");
    std::fs::write(&cfg, serde_norway::to_string(&config).unwrap()).unwrap();
    let o = std::process::Command::new(BIN)
        .args(["doctor", "--json", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["commands"]["terminal"], format!("/bin/sh: {note}"), "{v}");
    assert!(
        v["warnings"].as_array().unwrap().contains(&json!(gap)),
        "{v}"
    );
}
