//! `target: {kind: "sandbox", sandbox_id}` end to end: the real `iii-shell serve` against the
//! test engine, with mock `sandbox::*` functions registered by a second engine client.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use iii_shell_protocol::config::Config;
use iii_test_engine::{ErrorBody, Message, TestClient, TestEngine};
use serde_json::{json, Value};

const SANDBOX_ID: &str = "0b8f6a57-3f0e-4a59-9b8e-1a2b3c4d5e6f";

fn sandbox() -> Value {
    json!({"kind": "sandbox", "sandbox_id": SANDBOX_ID})
}

/// Payloads the mock sandbox worker received, as `(function_id, data)`, without the
/// engine-added `_caller_worker_id`.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, Value)>>>);

impl Seen {
    fn push(&self, function_id: &str, mut data: Value) -> Value {
        if let Some(o) = data.as_object_mut() {
            o.remove("_caller_worker_id");
        }
        self.0
            .lock()
            .unwrap()
            .push((function_id.to_string(), data.clone()));
        data
    }

    fn all(&self) -> Vec<(String, Value)> {
        self.0.lock().unwrap().clone()
    }

    fn last(&self, function_id: &str) -> Value {
        self.all()
            .into_iter()
            .rev()
            .find(|(f, _)| f == function_id)
            .map(|(_, d)| d)
            .unwrap_or_else(|| panic!("{function_id} was never called"))
    }
}

struct Setup {
    engine: TestEngine,
    worker: Worker,
    caller: TestClient,
    /// The mock sandbox worker's connection.
    sandbox: Arc<TestClient>,
    seen: Seen,
}

impl Setup {
    async fn start(config: Config) -> Setup {
        let engine = TestEngine::start().await;
        let worker = Worker::builder().engine(&engine).seed(&config).start();
        Self::finish(engine, worker).await
    }

    async fn finish(engine: TestEngine, worker: Worker) -> Setup {
        wait_ready(&engine, &worker).await;
        let caller = engine.client().await;
        let sandbox = Arc::new(engine.client_named("iii-sandbox").await);
        Setup {
            engine,
            worker,
            caller,
            sandbox,
            seen: Seen::default(),
        }
    }

    async fn ok(&self, function: &str, payload: Value) -> Value {
        match self.caller.call(function, payload.clone()).await {
            Ok(v) => v,
            Err(e) => panic!(
                "{function} {payload} failed: {e:?}\nworker stderr:\n{}",
                self.worker.stderr()
            ),
        }
    }

    async fn err(&self, function: &str, payload: Value) -> ErrorBody {
        match self.caller.call(function, payload.clone()).await {
            Ok(v) => panic!("{function} {payload} succeeded: {v}"),
            Err(e) => e,
        }
    }

    /// Registers the mock `sandbox::exec` (behaviour chosen by `cmd`, see [`exec_mock`]).
    async fn mock_exec(&self) {
        let seen = self.seen.clone();
        self.sandbox
            .register_function("sandbox::exec", move |data, _| {
                let data = seen.push("sandbox::exec", data);
                exec_mock(data)
            })
            .await
            .expect("register sandbox::exec");
    }

    async fn status(&self, id: &str) -> Value {
        self.ok("shell::status", json!({"job_id": id})).await["job"].clone()
    }

    /// Polls `shell::status` until the job has left `running`.
    async fn wait_done(&self, id: &str) -> Value {
        let start = Instant::now();
        loop {
            let job = self.status(id).await;
            if job["status"] != "running" {
                return job;
            }
            assert!(start.elapsed() < WAIT, "job {id} is still running: {job}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn spawn(&self, payload: Value) -> String {
        let r = self.ok("shell::exec_bg", payload).await;
        r["job_id"].as_str().expect("job_id").to_string()
    }
}

fn wrapped(code: &str, message: &str) -> ErrorBody {
    let payload = json!({
        "code": code,
        "docs_url": format!("https://github.com/iii-hq/iii/blob/main/crates/iii-worker/src/sandbox_daemon/README.md#{code}"),
        "fix": null,
        "fix_note": null,
        "message": message,
        "retryable": false,
        "type": "filesystem",
    });
    ErrorBody::new("invocation_failed", format!("handler error: {payload}"))
}

fn exec_ok(stdout: &str, stderr: &str, exit_code: i32) -> Value {
    json!({"stdout": stdout, "stderr": stderr, "exit_code": exit_code, "timed_out": false, "duration_ms": 41, "success": exit_code == 0})
}

/// The mock `sandbox::exec`, by `cmd`.
async fn exec_mock(data: Value) -> Result<Value, ErrorBody> {
    let args: Vec<String> = data["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    match data["cmd"].as_str().unwrap_or_default() {
        "echo" => Ok(exec_ok(&format!("{}\n", args.join(" ")), "", 0)),
        "exit3" => Ok(exec_ok("", "boom\n", 3)),
        "big" => Ok(exec_ok(&"x".repeat(100), &"e".repeat(100), 0)),
        "hang" => {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Ok(exec_ok("late output\n", "", 0))
        }
        "s200" => Err(wrapped(
            "S200",
            &format!("exec timed out after {} ms", data["timeout_ms"]),
        )),
        "s211" => Err(wrapped("S211", "file not found: /nope")),
        "in_vm_timeout" => Ok(json!({"stdout": "part", "stderr": "", "exit_code": null,
                                     "timed_out": true, "duration_ms": 1500, "success": false})),
        "s300" => Err(wrapped("S300", "VM boot failed")),
        "s002" => Err(ErrorBody::new("S002", "sandbox not found")),
        "s004" => Err(ErrorBody::new(
            "invocation_failed",
            "the sandbox said S004: it is stopped",
        )),
        "s299" => Err(wrapped("S299", "a code from the future")),
        "nocode" => Err(ErrorBody::new(
            "invocation_failed",
            "serialization error: missing field `cmd`",
        )),
        "malformed" => Ok(json!({"stdout": 1})),
        "no_exit_code" => {
            Ok(json!({"stdout": "", "stderr": "", "timed_out": false, "duration_ms": 1}))
        }
        other => Err(ErrorBody::new(
            "invocation_failed",
            format!("mock: unexpected cmd {other:?}"),
        )),
    }
}

fn exec(command: &str, args: &[&str]) -> Value {
    json!({"command": command, "args": args, "target": sandbox()})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_forwards_the_mapped_payload_and_maps_the_result() {
    let defaults = Config::builtin_default();
    let s = Setup::start(defaults.clone()).await;
    s.mock_exec().await;

    let r = s.ok("shell::exec", json!({"command": "echo", "args": ["a b", "c"], "target": sandbox(), "timeout_ms": 5000})).await;
    assert_eq!(
        r,
        json!({"stdout": "a b c\n", "stderr": "", "exit_code": 0, "timed_out": false,
               "stdout_truncated": false, "stderr_truncated": false, "duration_ms": 41})
    );
    assert_eq!(
        s.seen.last("sandbox::exec"),
        json!({"sandbox_id": SANDBOX_ID, "cmd": "echo", "args": ["a b", "c"], "timeout_ms": 5000}),
        "exactly these four fields: never env/workdir/stdin/argv/target"
    );

    // `command` alone is tokenized; no timeout → the default; over the cap → clamped.
    s.ok(
        "shell::exec",
        json!({"command": "echo 'x y' z", "target": sandbox()}),
    )
    .await;
    assert_eq!(
        s.seen.last("sandbox::exec"),
        json!({"sandbox_id": SANDBOX_ID, "cmd": "echo", "args": ["x y", "z"], "timeout_ms": defaults.default_timeout_ms})
    );
    s.ok(
        "shell::exec",
        json!({"command": "echo", "args": [], "target": sandbox(), "timeout_ms": 999_999_999u64}),
    )
    .await;
    assert_eq!(
        s.seen.last("sandbox::exec")["timeout_ms"],
        json!(defaults.max_timeout_ms)
    );
    assert_eq!(s.seen.last("sandbox::exec")["args"], json!([]));

    // A non-zero exit is a normal result.
    let r = s.ok("shell::exec", exec("exit3", &[])).await;
    assert_eq!(
        (r["exit_code"].clone(), r["stderr"].clone()),
        (json!(3), json!("boom\n"))
    );
}

/// ERR-02, SBX-07: S200 (an in-VM execution failure) is the call's error with that code,
/// never a timed-out success; a reply that says `timed_out: true` is the timed-out result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s200_is_the_calls_error_and_a_timed_out_reply_is_a_result() {
    let s = Setup::start(Config::builtin_default()).await;
    s.mock_exec().await;
    let e = s
        .err(
            "shell::exec",
            json!({"command": "s200", "target": sandbox(), "timeout_ms": 1500}),
        )
        .await;
    assert_eq!(e.code, "S200", "{e:?}");
    assert!(e.message.contains("exec timed out after 1500 ms"), "{e:?}");
    let r = s
        .ok(
            "shell::exec",
            json!({"command": "in_vm_timeout", "target": sandbox(), "timeout_ms": 1500}),
        )
        .await;
    assert_eq!(
        r,
        json!({"stdout": "part", "stderr": "", "exit_code": null, "timed_out": true,
               "stdout_truncated": false, "stderr_truncated": false, "duration_ms": 1500})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_error_codes_pass_through_or_collapse_to_s216() {
    let s = Setup::start(Config::builtin_default()).await;
    s.mock_exec().await;
    for (cmd, code) in [
        ("s211", "S211"),
        ("s300", "S300"),
        ("s002", "S002"),
        ("s004", "S004"),
        ("s299", "S216"),
        ("nocode", "S216"),
    ] {
        let e = s.err("shell::exec", exec(cmd, &[])).await;
        assert_eq!(e.code, code, "{cmd}: {e:?}");
        assert!(
            e.message.contains("forwarded from engine") || e.message.starts_with("engine error: "),
            "{cmd}: {e:?}"
        );
    }
    let e = s.err("shell::exec", exec("s211", &[])).await;
    assert!(
        e.message.contains("file not found: /nope"),
        "the sandbox's text is kept: {e:?}"
    );

    for cmd in ["malformed", "no_exit_code"] {
        let e = s.err("shell::exec", exec(cmd, &[])).await;
        assert_eq!(e.code, "S216", "{cmd}: {e:?}");
        assert!(
            e.message.starts_with("bad engine response: "),
            "{cmd}: {e:?}"
        );
    }

    // The fs path uses the same table.
    let seen = s.seen.clone();
    s.sandbox
        .register_function("sandbox::fs::stat", move |data, _| {
            let data = seen.push("sandbox::fs::stat", data);
            async move {
                match data["path"].as_str().unwrap_or_default() {
                    "/missing" => Err(wrapped("S211", "file not found: /missing")),
                    "/future" => Err(wrapped("S299", "future")),
                    _ => Ok(json!({"name": "x", "is_dir": true})),
                }
            }
        })
        .await
        .unwrap();
    let stat = |path: &str| json!({"path": path, "target": sandbox()});
    assert_eq!(
        s.err("shell::fs::stat", stat("/missing")).await.code,
        "S211"
    );
    assert_eq!(s.err("shell::fs::stat", stat("/future")).await.code, "S216");
    let e = s.err("shell::fs::stat", stat("/malformed")).await;
    assert!(
        e.code == "S216" && e.message.starts_with("bad engine response: "),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_sandbox_worker_calls_fail_s216_and_never_run_on_the_host() {
    let s = Setup::start(Config::builtin_default()).await;
    let marker = s.worker.dir().join("must-not-exist");
    let touch =
        json!({"command": "touch", "args": [marker.to_string_lossy()], "target": sandbox()});

    let e = s.err("shell::exec", touch.clone()).await;
    assert_eq!(e.code, "S216", "{e:?}");
    assert!(e.message.contains("function_not_found"), "{e:?}");
    let e = s
        .err("shell::fs::ls", json!({"path": "/", "target": sandbox()}))
        .await;
    assert_eq!(e.code, "S216", "{e:?}");

    // A background job is created, then fails with the reason in stderr.
    let id = s.spawn(touch).await;
    let job = s.wait_done(&id).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["exit_code"], Value::Null);
    let stderr = job["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("sandbox::exec failed: S216") && stderr.contains("function_not_found"),
        "{stderr}"
    );
    assert!(!marker.exists(), "a sandbox call ran on the host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fs_ops_forward_the_request_and_normalize_the_replies() {
    let s = Setup::start(Config::builtin_default()).await;
    let entry = json!({"name": "a.txt", "is_dir": false, "is_symlink": false, "mode": "0644", "size": 3, "mtime": 1700000000});
    let cref = json!({"channel_id": "ch-1", "access_key": "key-1", "direction": "read"});
    // (op, request fields, what the sandbox answers, what the caller gets)
    let cases = vec![
        (
            "ls",
            json!({"path": "/work"}),
            json!({"entries": [entry]}),
            json!({"entries": [entry]}),
        ),
        (
            "stat",
            json!({"path": "/work/a.txt"}),
            entry.clone(),
            entry.clone(),
        ),
        (
            "mkdir",
            json!({"path": "/work/d", "mode": "0700", "parents": true}),
            json!({"created": true}),
            json!({"created": true, "path": "", "already_existed": false}),
        ),
        (
            "rm",
            json!({"path": "/work/d", "recursive": true}),
            json!({"removed": true}),
            json!({"removed": true, "path": "", "was_present": false}),
        ),
        (
            "chmod",
            json!({"path": "/work/a.txt", "mode": "0600", "uid": null, "gid": 7, "recursive": false}),
            json!({"updated": 1}),
            json!({"entries_changed": 1, "path": "", "recursive": false}),
        ),
        (
            "mv",
            json!({"src": "/work/a", "dst": "/work/b", "overwrite": true}),
            json!({"moved": true}),
            json!({"moved": true, "src": "", "dst": "", "overwrote": false}),
        ),
        (
            "grep",
            json!({"path": "/work", "pattern": "fo+", "ignore_case": true, "include_glob": ["*.rs"], "max_matches": 5}),
            json!({"matches": [{"file": "/work/a.rs", "line": 2, "content": "foo"}], "truncated": false}),
            json!({"matches": [{"path": "/work/a.rs", "line": 2, "content": "foo"}], "truncated": false}),
        ),
        (
            "sed",
            json!({"files": ["/work/a.rs"], "pattern": "foo", "replacement": "bar", "regex": false}),
            json!({"results": [{"path": "/work/a.rs", "replacements": 2, "success": true}], "total_replacements": 2}),
            json!({"results": [{"path": "/work/a.rs", "replacements": 2, "success": true, "error": null}], "total_replacements": 2}),
        ),
        (
            "write",
            json!({"path": "/work/new.txt", "content": cref, "mode": "0640", "parents": true}),
            json!({"bytes_written": 12, "path": "/work/new.txt"}),
            json!({"bytes_written": 12, "path": "/work/new.txt", "files": []}),
        ),
        (
            "read",
            json!({"path": "/work/a.txt"}),
            json!({"content": cref, "body": "abc", "size": 3, "mode": "0644", "mtime": 1700000000}),
            json!({"content": cref, "size": 3, "mode": "0644", "mtime": 1700000000}),
        ),
    ];
    for (op, _, reply, _) in &cases {
        let id = format!("sandbox::fs::{op}");
        let (seen, reply, fid) = (s.seen.clone(), reply.clone(), id.clone());
        s.sandbox
            .register_function(&id, move |data, _| {
                seen.push(&fid, data);
                let reply = reply.clone();
                async move { Ok(reply) }
            })
            .await
            .unwrap();
    }
    for (op, request, _, expected) in cases {
        let mut payload = request.clone();
        payload["target"] = sandbox();
        payload["base_dir"] = json!("/host/project");
        payload["fs_scope"] = json!({"root": "/host/project"});
        let got = s.ok(&format!("shell::fs::{op}"), payload).await;
        assert_eq!(got, expected, "shell::fs::{op} reply");

        let mut forwarded = request.clone();
        forwarded["sandbox_id"] = json!(SANDBOX_ID);
        assert_eq!(
            s.seen.last(&format!("sandbox::fs::{op}")),
            forwarded,
            "shell::fs::{op} payload"
        );
    }
    assert_eq!(s.seen.all().len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_sandbox_write_is_not_held_to_max_write_bytes() {
    let mut config = Config::builtin_default();
    config.fs.max_write_bytes = 8;
    let s = Setup::start(config).await;
    // The mock reads the channel it was handed, as the real daemon does.
    let reader_client = Arc::new(s.engine.client().await);
    let seen = s.seen.clone();
    s.sandbox
        .register_function("sandbox::fs::write", move |data, _| {
            let data = seen.push("sandbox::fs::write", data);
            let reader_client = reader_client.clone();
            async move {
                let cref = serde_json::from_value(data["content"].clone())
                    .map_err(|e| ErrorBody::new("S001", e.to_string()))?;
                let (bytes, _) = reader_client.read_channel_bytes(&cref).await;
                Ok(json!({"bytes_written": bytes.len(), "path": data["path"]}))
            }
        })
        .await
        .unwrap();

    let (writer, reader) = s.caller.create_channel().await;
    let body = vec![b'z'; 1000];
    let write = {
        let client = s.engine.client().await;
        let body = body.clone();
        tokio::spawn(async move {
            client
                .write_channel(&writer, vec![Message::Binary(body.into())])
                .await
        })
    };
    let cref = serde_json::to_value(&reader).unwrap();
    let r = s
        .ok(
            "shell::fs::write",
            json!({"path": "/tmp/big.bin", "content": cref, "target": sandbox()}),
        )
        .await;
    write.await.unwrap();
    assert_eq!(
        r,
        json!({"bytes_written": 1000, "path": "/tmp/big.bin", "files": []})
    );
    assert_eq!(
        s.seen.last("sandbox::fs::write"),
        json!({"path": "/tmp/big.bin", "content": cref, "sandbox_id": SANDBOX_ID}),
        "the ContentRef passes through untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_before_dispatch() {
    let s = Setup::start(Config::builtin_default()).await;
    s.mock_exec().await;
    let seen = s.seen.clone();
    s.sandbox
        .register_function("sandbox::fs::write", move |data, _| {
            seen.push("sandbox::fs::write", data);
            async { Ok(json!({"bytes_written": 0, "path": ""})) }
        })
        .await
        .unwrap();

    // Host-only fields: S210 on exec and exec_bg alike (request validation keeps its code).
    for (field, value) in [
        ("cwd", json!("/tmp")),
        ("env", json!({"A": "1"})),
        ("stdin", json!("data")),
    ] {
        let mut p = exec("echo", &["hi"]);
        p[field] = value;
        let e = s.err("shell::exec", p.clone()).await;
        assert!(
            e.code == "S210" && e.message.contains(field),
            "{field}: {e:?}"
        );
        let e = s.err("shell::exec_bg", p).await;
        assert!(
            e.code == "S210" && e.message.contains(field),
            "{field}: {e:?}"
        );
    }
    // Inline write content is host-only.
    let e = s
        .err(
            "shell::fs::write",
            json!({"path": "/tmp/a", "content": "inline", "target": sandbox()}),
        )
        .await;
    assert!(e.code == "S210" && e.message.contains("inline"), "{e:?}");
    // The denylist applies to sandbox targets too.
    let e = s.err("shell::exec", exec("rm", &["-rf", "/"])).await;
    assert!(
        e.code == "invocation_failed" && e.message.starts_with("command matches denylist"),
        "{e:?}"
    );
    let e = s.err("shell::exec_bg", exec("rm", &["-rf", "/"])).await;
    assert!(e.message.contains("denylist"), "{e:?}");
    // Unknown target kind, non-UUID sandbox id.
    let vm = json!({"command": "echo", "target": {"kind": "vm", "sandbox_id": SANDBOX_ID}});
    assert_eq!(s.err("shell::exec", vm.clone()).await.code, "S210");
    assert_eq!(s.err("shell::exec_bg", vm).await.code, "S210");
    assert_eq!(
        s.err(
            "shell::fs::ls",
            json!({"path": "/", "target": {"kind": "vm"}})
        )
        .await
        .code,
        "S210"
    );
    let bad_id =
        json!({"command": "echo", "target": {"kind": "sandbox", "sandbox_id": "not-a-uuid"}});
    assert_eq!(s.err("shell::exec", bad_id.clone()).await.code, "S210");
    assert_eq!(s.err("shell::exec_bg", bad_id).await.code, "S210");

    assert!(
        s.seen.all().is_empty(),
        "nothing was forwarded: {:?}",
        s.seen.all()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_disabled_in_the_stored_config_is_s210() {
    let engine = TestEngine::start().await;
    let mut config = Config::builtin_default();
    config.sandbox.enabled = false;
    engine.config_seed("shell", serde_json::to_value(&config).unwrap());
    let worker = Worker::builder().engine(&engine).start();
    let s = Setup::finish(engine, worker).await;
    s.mock_exec().await;

    let e = s.err("shell::exec", exec("echo", &["hi"])).await;
    assert!(
        e.code == "S210" && e.message.contains("sandbox.enabled"),
        "{e:?}"
    );
    let e = s.err("shell::exec_bg", exec("echo", &["hi"])).await;
    assert!(
        e.code == "S210" && e.message.contains("sandbox.enabled"),
        "{e:?}"
    );
    let e = s
        .err("shell::fs::ls", json!({"path": "/", "target": sandbox()}))
        .await;
    assert_eq!(e.code, "S210", "{e:?}");
    assert!(s.seen.all().is_empty());
    // The host still works.
    let r = s
        .ok("shell::exec", json!({"command": "echo", "args": ["host"]}))
        .await;
    assert_eq!(r["stdout"], "host\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_sandbox_jobs() {
    let mut config = Config::builtin_default();
    config.max_output_bytes = 16;
    let s = Setup::start(config.clone()).await;
    s.mock_exec().await;

    // finished, with the reply's output and exit code.
    let r = s
        .ok(
            "shell::exec_bg",
            json!({"command": "echo", "args": ["hello"], "target": sandbox(), "timeout_ms": 4000}),
        )
        .await;
    assert_eq!(r["argv"], json!(["echo", "hello"]));
    let id = r["job_id"].as_str().unwrap().to_string();
    assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 4);
    let job = s.wait_done(&id).await;
    assert_eq!(job["status"], "finished", "{job}");
    assert_eq!(
        (
            job["exit_code"].clone(),
            job["stdout"].clone(),
            job["stderr"].clone()
        ),
        (json!(0), json!("hello\n"), json!(""))
    );
    assert_eq!(job["argv"], json!(["echo", "hello"]));
    assert!(job["finished_at_ms"].as_u64().unwrap() >= job["started_at_ms"].as_u64().unwrap());
    assert_eq!(
        s.seen.last("sandbox::exec"),
        json!({"sandbox_id": SANDBOX_ID, "cmd": "echo", "args": ["hello"], "timeout_ms": 4000}),
        "background jobs forward timeout_ms"
    );

    // A non-zero exit is still `finished` (as for host jobs), with its exit code.
    let job = s.wait_done(&s.spawn(exec("exit3", &[])).await).await;
    assert_eq!(
        (job["status"].clone(), job["exit_code"].clone()),
        (json!("finished"), json!(3))
    );

    // Output is capped at max_output_bytes.
    let job = s.wait_done(&s.spawn(exec("big", &[])).await).await;
    assert_eq!(job["stdout"], json!("x".repeat(16)));
    assert_eq!(
        (
            job["stdout_truncated"].clone(),
            job["stderr_truncated"].clone()
        ),
        (json!(true), json!(true))
    );

    // A sandbox error: failed, the reason in stderr.
    let job = s.wait_done(&s.spawn(exec("s211", &[])).await).await;
    assert_eq!(
        (job["status"].clone(), job["exit_code"].clone()),
        (json!("failed"), Value::Null)
    );
    assert!(
        job["stderr"]
            .as_str()
            .unwrap()
            .contains("sandbox::exec failed: S211"),
        "{job}"
    );

    // S200 (JOB-10): failed, with the reason in stderr; a reply's own timed_out: killed.
    let job = s.wait_done(&s.spawn(exec("s200", &[])).await).await;
    assert_eq!(
        (job["status"].clone(), job["exit_code"].clone()),
        (json!("failed"), Value::Null)
    );
    assert!(
        job["stderr"]
            .as_str()
            .unwrap()
            .contains("sandbox::exec failed: S200: "),
        "{job}"
    );
    let job = s
        .wait_done(&s.spawn(exec("in_vm_timeout", &[])).await)
        .await;
    assert_eq!(job["status"], "killed", "{job}");

    // shell::kill marks a running job killed at once, with the sandbox limit as the reason.
    let id = s.spawn(exec("hang", &[])).await;
    assert_eq!(s.status(&id).await["status"], "running");
    let k = s.ok("shell::kill", json!({"job_id": id})).await;
    assert_eq!(
        (
            k["job_id"].clone(),
            k["killed"].clone(),
            k["status"].clone()
        ),
        (json!(id), json!(true), json!("killed"))
    );
    assert!(k["reason"].as_str().unwrap().contains("sandbox"), "{k}");
    let job = s.status(&id).await;
    assert_eq!(job["status"], "killed");
    assert!(job["finished_at_ms"].is_u64());
    let again = s.ok("shell::kill", json!({"job_id": id})).await;
    assert_eq!(
        (again["killed"].clone(), again["status"].clone()),
        (json!(false), json!("killed"))
    );
    assert!(again["reason"].is_string(), "{again}");
    // The late reply is recorded; the status stays killed.
    let start = Instant::now();
    loop {
        let job = s.status(&id).await;
        if job["stdout"] == "late output\n" {
            assert_eq!(job["status"], "killed");
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "the late reply was never recorded: {job}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Unknown ids still reach the executor: S211.
    let e = s
        .err(
            "shell::status",
            json!({"job_id": uuid::Uuid::new_v4().to_string()}),
        )
        .await;
    assert_eq!(e.code, "S211", "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_merges_host_and_sandbox_jobs_and_the_cap_is_shared() {
    let mut config = Config::builtin_default();
    config.max_concurrent_jobs = 2;
    let s = Setup::start(config).await;
    s.mock_exec().await;

    let m = s.worker.marker(30);
    let host = s.spawn(json!({"command": "sleep", "args": [m]})).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let sandboxed = s.spawn(exec("hang", &[])).await;

    let l = s.ok("shell::list", json!({})).await;
    let jobs = l["jobs"].as_array().unwrap();
    assert_eq!(l["count"], json!(jobs.len()));
    let ids: Vec<&str> = jobs.iter().map(|j| j["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [host.as_str(), sandboxed.as_str()],
        "sorted by started_at_ms: {l}"
    );
    assert!(
        jobs.iter()
            .all(|j| j["status"] == "running" && j.get("argv").is_none()),
        "{l}"
    );
    assert_eq!(s.status(&host).await["argv"], json!(["sleep", m]));

    // One host + one sandbox job running: both kinds are refused.
    let e = s.err("shell::exec_bg", exec("echo", &["x"])).await;
    assert!(
        e.code == "invocation_failed" && e.message.contains("max concurrent jobs"),
        "{e:?}"
    );
    let e = s.err("shell::exec_bg", json!({"command": "true"})).await;
    assert!(e.message.contains("max concurrent jobs"), "{e:?}");

    // Killing the sandbox job frees its slot.
    assert_eq!(
        s.ok("shell::kill", json!({"job_id": sandboxed})).await["killed"],
        true
    );
    let third = s.spawn(exec("echo", &["x"])).await;
    assert_eq!(s.wait_done(&third).await["status"], "finished");

    // Killing the host job goes to the executor.
    let k = s.ok("shell::kill", json!({"job_id": host})).await;
    assert_eq!(
        (k["killed"].clone(), k["status"].clone()),
        (json!(true), json!("killed"))
    );
    let l = s.ok("shell::list", json!({})).await;
    assert_eq!(l["count"], json!(3), "{l}");
    let started: Vec<u64> = l["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["started_at_ms"].as_u64().unwrap())
        .collect();
    assert!(started.windows(2).all(|w| w[0] <= w[1]), "{l}");
}

/// Without an engine link (`iii-shell call`): S216 on exec, and a plain spawn-time failure
/// with the code embedded on exec_bg.
#[tokio::test]
async fn without_an_engine_link_sandbox_calls_fail_s216() {
    let h = common::Harness::default().await;
    let e = h.err("shell::exec", exec("echo", &["x"])).await;
    assert!(e.code == "S216" && e.message.contains("engine"), "{e:?}");
    // No engine is not a spawn-time failure: exec_bg answers the S216 code too.
    let e = h.err("shell::exec_bg", exec("echo", &["x"])).await;
    assert!(e.code == "S216" && e.message.contains("engine"), "{e:?}");
    let l = h.ok("shell::list", json!({})).await;
    assert_eq!(l["count"], 0, "no job was recorded: {l}");
}
