//! Interop with a real iii engine (not the in-process test engine).
//!
//! Opt-in: set `III_ENGINE_BIN` to an `iii` engine binary. Each test starts it on a free
//! loopback port with a minimal configuration in a temporary directory (its working directory,
//! so everything the engine persists stays there) and `iii-shell serve` against it, and drives
//! them from a raw WebSocket client: `shell::exec` and `shell::config-status`; a hot reload
//! through the engine's configuration worker, and a rejected one; the
//! `shell::changed` trigger type bound to a function of the client, which sees a command's new
//! file arrive; `shell::fs::read`/`write` streaming through the engine's data channels; a
//! terminal session whose output reaches the client's own output function;
//! three namespaced workers (one jail each), every call reaching the host its
//! namespace names; telemetry on `/otel` stored by the engine's observability worker (its
//! memory exporter) and read back through `engine::traces::list`/`tree`,
//! `engine::logs::list` and `engine::workers::info`. All are `#[ignore]`d, so that an ordinary run (and CI, which has no
//! engine binary) lists them as ignored instead of passing them unrun; run them with
//! `III_ENGINE_BIN=/path/to/iii cargo test -p iii-shell --test suite -- --ignored
//! interop_real_engine::`. Run that way without the variable, they fail and say why.
//!
//! The engine configuration used (engine `config.yaml` format, a `workers:` list):
//! `iii-worker-manager` listens on `127.0.0.1:<port>`; the `configuration` worker's `fs`
//! adapter stores under the temporary directory; `iii-telemetry` is disabled (also through
//! `III_TELEMETRY_ENABLED=false`); `IIIWORKER_DISABLE_BUILTIN_DAEMONS=1` keeps the engine from
//! spawning auxiliary daemons. The telemetry test adds `iii-observability` with
//! `exporter: memory`, `metrics_enabled` and `logs_enabled` ([`OBSERVABILITY`]).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, BIN};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const NEEDS: &str =
    "III_ENGINE_BIN is not set: set it to an iii engine binary to run the interop tests";

/// The engine binary the interop tests run, from `III_ENGINE_BIN`.
fn engine_bin() -> PathBuf {
    let bin = std::env::var_os("III_ENGINE_BIN")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("{NEEDS}"));
    PathBuf::from(bin)
}

/// Kills and reaps a child process on drop.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(40);
        format!(
            "--- last lines of {} log ({}) ---\n{}",
            self.name,
            self.log.display(),
            lines[start..].join("\n")
        )
    }

    fn ensure_running(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(format!(
                "{} exited early with {status}\n{}",
                self.name,
                self.log_tail()
            )),
            _ => Ok(()),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_logged(name: &'static str, mut cmd: Command, log: &Path) -> Proc {
    let out = std::fs::File::create(log).expect("create log file");
    let err = out.try_clone().unwrap();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    Proc {
        name,
        child,
        log: log.to_path_buf(),
    }
}

fn engine_config(port: u16, dir: &Path) -> String {
    engine_config_with(port, dir, "")
}

/// The observability worker with its in-memory exporter for traces, metrics and logs, so
/// `engine::traces::*`, `engine::logs::list` and `engine::workers::info` answer from what
/// workers sent on `/otel`.
const OBSERVABILITY: &str = r#"  - name: iii-observability
    config:
      enabled: true
      service_name: iii-interop
      exporter: memory
      memory_max_spans: 20000
      sampling_ratio: 1.0
      metrics_enabled: true
      metrics_exporter: memory
      logs_enabled: true
      logs_exporter: memory
      logs_console_output: false
"#;

fn engine_config_with(port: u16, dir: &Path, extra_workers: &str) -> String {
    let store = dir.join("configuration");
    format!(
        r#"workers:
  - name: iii-worker-manager
    config:
      host: 127.0.0.1
      port: {port}
  - name: configuration
    config:
      adapter:
        name: fs
        config:
          directory: "{store}"
  - name: iii-telemetry
    config:
      enabled: false
{extra_workers}"#,
        store = store.display()
    )
}

async fn wait_for_port(port: u16, engine: &mut Proc, deadline: Instant) {
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        if let Err(e) = engine.ensure_running() {
            panic!("{e}");
        }
        assert!(
            Instant::now() < deadline,
            "the engine did not listen on 127.0.0.1:{port}\n{}",
            engine.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn send(ws: &mut Ws, frame: Value) {
    ws.send(Message::text(frame.to_string()))
        .await
        .expect("send frame");
}

/// Invokes `function_id` and waits for its `invocationresult` (other frames are skipped).
async fn invoke(
    ws: &mut Ws,
    function_id: &str,
    data: Value,
    timeout: Duration,
) -> Result<Value, Value> {
    let id = uuid::Uuid::new_v4().to_string();
    send(ws, json!({"type": "invokefunction", "invocation_id": id, "function_id": function_id, "data": data})).await;
    result_of(ws, &id, function_id, timeout).await
}

/// The next JSON frame from the engine (frames that are not JSON are skipped); `None` once
/// the socket has ended. A Close frame from the engine is a failure of the test.
async fn next_frame(ws: &mut Ws) -> Option<Value> {
    while let Some(msg) = ws.next().await {
        let text = match msg.expect("read frame") {
            Message::Text(t) => t.to_string(),
            Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
            Message::Close(c) => panic!("the engine closed the client socket: {c:?}"),
            _ => continue,
        };
        if let Ok(frame) = serde_json::from_str::<Value>(&text) {
            return Some(frame);
        }
    }
    None
}

/// Waits for the `invocationresult` of invocation `id` (other frames are skipped).
async fn result_of(
    ws: &mut Ws,
    id: &str,
    function_id: &str,
    timeout: Duration,
) -> Result<Value, Value> {
    let wait = async {
        while let Some(frame) = next_frame(ws).await {
            if frame["type"] == "invocationresult" && frame["invocation_id"] == id {
                return match frame.get("error") {
                    Some(e) if !e.is_null() => Err(e.clone()),
                    _ => Ok(frame.get("result").cloned().unwrap_or(Value::Null)),
                };
            }
        }
        panic!("the engine closed the client socket");
    };
    tokio::time::timeout(timeout, wait)
        .await
        .unwrap_or_else(|_| panic!("no invocationresult for {function_id} within {timeout:?}"))
}

/// A real engine and `iii-shell serve` (the built-in default) against it, with a raw client
/// registered as a worker; returned once `shell::exec` answers through the engine.
struct Running {
    engine: Proc,
    worker: Proc,
    ws: Ws,
    dir: tempfile::TempDir,
    url: String,
}

async fn engine_and_worker() -> Running {
    engine_and_worker_with("", None).await
}

/// [`engine_and_worker`] with more engine workers and a seed configuration for the worker.
async fn engine_and_worker_with(extra_workers: &str, seed_yaml: Option<&str>) -> Running {
    let engine_bin = engine_bin();
    assert!(
        engine_bin.is_file(),
        "III_ENGINE_BIN={} is not a file",
        engine_bin.display()
    );

    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config_path = dir.path().join("config.yaml");
    std::fs::write(
        &config_path,
        engine_config_with(port, dir.path(), extra_workers),
    )
    .unwrap();

    let mut engine_cmd = Command::new(&engine_bin);
    engine_cmd
        .arg("--no-update-check")
        .arg("--config")
        .arg(&config_path)
        .current_dir(dir.path())
        .env("III_TELEMETRY_ENABLED", "false")
        .env("IIIWORKER_DISABLE_BUILTIN_DAEMONS", "1");
    let mut engine = spawn_logged("engine", engine_cmd, &dir.path().join("engine.log"));
    let deadline = Instant::now() + Duration::from_secs(60);
    wait_for_port(port, &mut engine, deadline).await;
    let url = format!("ws://127.0.0.1:{port}");

    let seed_path = dir.path().join("seed.yaml");
    if let Some(y) = seed_yaml {
        std::fs::write(&seed_path, y).unwrap();
    }
    let mut worker_cmd = Command::new(BIN);
    worker_cmd
        .arg("serve")
        .arg("--config")
        .arg(&seed_path) // missing without a seed: the built-in default is the seed
        .current_dir(dir.path())
        .env("III_URL", &url)
        .env_remove("III_ENGINE_URL")
        .env(
            "III_WORKER_NAME",
            format!("iii-shell-interop-{}", std::process::id()),
        );
    let mut worker = spawn_logged("iii-shell", worker_cmd, &dir.path().join("iii-shell.log"));

    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .expect("client connects to the engine");
    send(
        &mut ws,
        json!({
            "type": "invokefunction",
            "invocation_id": null,
            "function_id": "engine::workers::register",
            "action": {"type": "void"},
            "data": {"runtime": "rust", "name": format!("interop-client-{}", std::process::id()), "pid": std::process::id()}
        }),
    )
    .await;

    // The worker registers its functions once its configuration is confirmed; until then the
    // engine answers function_not_found.
    loop {
        match invoke(
            &mut ws,
            "shell::exec",
            json!({"command": "true"}),
            Duration::from_secs(30),
        )
        .await
        {
            Ok(_) => break,
            Err(e) if e["code"] == "function_not_found" && Instant::now() < deadline => {
                if let Err(msg) = worker.ensure_running() {
                    panic!("{msg}\n{}", engine.log_tail());
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!(
                "shell::exec failed: {e}\n{}\n{}",
                worker.log_tail(),
                engine.log_tail()
            ),
        }
    }
    Running {
        engine,
        worker,
        ws,
        dir,
        url,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real iii engine: III_ENGINE_BIN=/path/to/iii, run with --ignored"]
async fn shell_exec_through_a_real_engine() {
    let mut r = engine_and_worker().await;
    let result = invoke(
        &mut r.ws,
        "shell::exec",
        json!({"command": "echo", "args": ["interop"]}),
        Duration::from_secs(30),
    )
    .await
    .expect("shell::exec");
    assert_eq!(result["stdout"], "interop\n", "result: {result}");
    assert_eq!(result["exit_code"], 0, "result: {result}");
    assert_eq!(result["timed_out"], false, "result: {result}");

    // The worker's hot-reload status is reachable through the engine as well.
    let status = invoke(
        &mut r.ws,
        "shell::config-status",
        json!({}),
        Duration::from_secs(30),
    )
    .await
    .expect("shell::config-status");
    assert_eq!(status["last_outcome"], "applied", "status: {status}");

    let _ = r.ws.close(None).await;
}

/// The `shell::changed` trigger type through a real engine: a client binds it to a function
/// of its own on a directory, a command creates a file there, and the engine invokes the
/// client's function with the change (`{path, kind, root, dir}`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real iii engine: III_ENGINE_BIN=/path/to/iii, run with --ignored"]
async fn shell_changed_through_a_real_engine() {
    let mut r = engine_and_worker().await;
    let watched = r.dir.path().join("watched");
    std::fs::create_dir(&watched).unwrap();
    let watched = watched.canonicalize().unwrap();
    let sink = format!("interop::changed-sink-{}", std::process::id());
    send(&mut r.ws, json!({"type": "registerfunction", "id": sink})).await;
    send(
        &mut r.ws,
        json!({"type": "registertrigger", "id": uuid::Uuid::new_v4().to_string(),
               "trigger_type": "shell::changed", "function_id": sink,
               "config": {"path": watched.to_string_lossy()}}),
    )
    .await;
    // The watch is set up asynchronously after the binding: write until a change arrives.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    let change = loop {
        n += 1;
        let name = format!("new-{n}.txt");
        let script = format!("echo x > '{}/{name}'", watched.display());
        invoke(
            &mut r.ws,
            "shell::exec",
            json!({"command": "sh", "args": ["-c", script]}),
            Duration::from_secs(30),
        )
        .await
        .expect("shell::exec");
        let got = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(frame) = next_frame(&mut r.ws).await {
                if frame["type"] == "invokefunction" && frame["function_id"] == sink.as_str() {
                    if let Some(id) = frame["invocation_id"].as_str() {
                        send(&mut r.ws, json!({"type": "invocationresult", "invocation_id": id, "function_id": sink, "result": {}})).await;
                    }
                    return Some(frame["data"].clone());
                }
            }
            None
        })
        .await;
        match got {
            Ok(Some(data)) => break data,
            _ if Instant::now() < deadline => continue,
            _ => panic!(
                "no shell::changed invocation reached the client\n{}\n{}",
                r.worker.log_tail(),
                r.engine.log_tail()
            ),
        }
    };
    assert!(
        change["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("new-") && p.ends_with(".txt")),
        "{change}"
    );
    assert_eq!(change["kind"], "created", "{change}");
    assert_eq!(change["dir"], false, "{change}");
    assert_eq!(
        change["root"],
        watched.to_string_lossy().as_ref(),
        "{change}"
    );
    let _ = r.ws.close(None).await;
}

/// A terminal session through a real engine: its output is delivered to the client's own
/// output function (the console page's shape), typed input is echoed and run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real iii engine: III_ENGINE_BIN=/path/to/iii, run with --ignored"]
async fn a_terminal_session_through_a_real_engine() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut r = engine_and_worker().await;
    let out = format!(
        "iii::shell-ui::pty-output::console-{}",
        uuid::Uuid::new_v4()
    );
    send(&mut r.ws, json!({"type": "registerfunction", "id": out})).await;
    // One loop reads every frame: the session's first output can reach the output function
    // before the open's own result does, and an invocation left unanswered would hold up the
    // session's delivery lane.
    let open_id = uuid::Uuid::new_v4().to_string();
    send(&mut r.ws, json!({"type": "invokefunction", "invocation_id": open_id, "function_id": "shell::pty::open",
        "data": {"cwd": "/tmp", "cols": 80, "rows": 24, "program": "sh", "output_function_id": out}})).await;
    let write_id = uuid::Uuid::new_v4().to_string();
    let mut session = String::new();
    let mut text = String::new();
    let got = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(frame) = next_frame(&mut r.ws).await {
            let failed = frame.get("error").is_some_and(|e| !e.is_null());
            if frame["type"] == "invocationresult" && frame["invocation_id"] == open_id.as_str() {
                assert!(!failed, "shell::pty::open: {frame}");
                let opened = &frame["result"];
                session = opened["session_id"].as_str().expect("session_id").to_string();
                let key = opened["access_key"].as_str().expect("access_key");
                send(&mut r.ws, json!({"type": "invokefunction", "invocation_id": write_id, "function_id": "shell::pty::write",
                    "data": {"session_id": session, "access_key": key, "data": b64.encode("echo via-$((40+2))\n")}})).await;
            }
            if frame["type"] == "invocationresult" && frame["invocation_id"] == write_id.as_str() {
                assert!(!failed, "shell::pty::write: {frame}");
            }
            if frame["type"] == "invokefunction" && frame["function_id"] == out.as_str() {
                let data = &frame["data"];
                if let Some(d) = data["data"].as_str() {
                    text.push_str(&String::from_utf8_lossy(&b64.decode(d).expect("base64")));
                }
                if let Some(inv) = frame["invocation_id"].as_str() {
                    send(&mut r.ws, json!({"type": "invocationresult", "invocation_id": inv, "function_id": out, "result": {}})).await;
                }
                if !session.is_empty() {
                    assert_eq!(data["session_id"], session.as_str(), "{frame}");
                }
                if text.contains("via-42\r\n") {
                    return true;
                }
            }
        }
        false
    })
    .await;
    assert!(
        matches!(got, Ok(true)),
        "the command's output never reached the output function; got {text:?}\n{}",
        r.worker.log_tail()
    );
    let _ = r.ws.close(None).await;
}

/// Hot reload through the real engine's configuration worker: `configuration::set` of the
/// `shell` entry with `max_output_bytes: 4` reaches the worker, and the next command's output
/// is cut to 4 bytes. A value of the wrong type is refused by the engine against the schema
/// the worker registered; one the schema allows but the worker refuses is rejected
/// (`config-status` says so, counts it) and the last good configuration stays in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real iii engine: III_ENGINE_BIN=/path/to/iii, run with --ignored"]
async fn a_configuration_reload_through_a_real_engine() {
    let mut r = engine_and_worker().await;
    let t = Duration::from_secs(30);
    let stored = invoke(&mut r.ws, "configuration::get", json!({"id": "shell"}), t)
        .await
        .expect("configuration::get shell");
    let mut value = stored["value"].clone();
    assert!(
        value.is_object(),
        "the worker registered its seed: {stored}"
    );
    value["max_output_bytes"] = json!(4);
    invoke(
        &mut r.ws,
        "configuration::set",
        json!({"id": "shell", "value": value}),
        t,
    )
    .await
    .expect("configuration::set");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = invoke(
            &mut r.ws,
            "shell::exec",
            json!({"command": "echo", "args": ["hello world"]}),
            t,
        )
        .await
        .expect("shell::exec");
        if out["stdout"] == "hell" && out["stdout_truncated"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the reload never reached the worker: {out}\n{}",
            r.worker.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let applied = invoke(&mut r.ws, "shell::config-status", json!({}), t)
        .await
        .expect("config-status");
    assert_eq!(applied["last_outcome"], "applied", "{applied}");

    // A value of the wrong type never reaches the worker: the engine checks it against the
    // schema the worker registered.
    let mut wrong = value.clone();
    wrong["max_output_bytes"] = json!("lots");
    let e = invoke(
        &mut r.ws,
        "configuration::set",
        json!({"id": "shell", "value": wrong}),
        t,
    )
    .await
    .expect_err("a value against the registered schema");
    assert_eq!(e["code"], "SCHEMA_INVALID", "{e}");

    // A value the schema allows but the worker refuses (a jail root that does not exist):
    // rejected, counted, and the last good configuration stays.
    let missing = r.dir.path().join("no-such-root");
    value["fs"]["host_roots"] = json!([missing.to_string_lossy()]);
    invoke(
        &mut r.ws,
        "configuration::set",
        json!({"id": "shell", "value": value}),
        t,
    )
    .await
    .expect("configuration::set");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let st = invoke(&mut r.ws, "shell::config-status", json!({}), t)
            .await
            .expect("config-status");
        if st["last_outcome"] == "rejected" {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the bad value was never reported: {st}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        status["rejected_reloads"].as_u64().is_some_and(|n| n >= 1),
        "{status}"
    );
    assert!(
        status["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("no-such-root")),
        "{status}"
    );
    let out = invoke(
        &mut r.ws,
        "shell::exec",
        json!({"command": "echo", "args": ["hello world"]}),
        t,
    )
    .await
    .expect("shell::exec");
    assert_eq!(out["stdout"], "hell", "the last good configuration: {out}");
    let _ = r.ws.close(None).await;
}

/// One end of an engine data channel (`ref` is a `{channel_id, access_key, direction}`).
async fn open_channel(url: &str, r: &Value, dir: &str) -> Ws {
    let u = format!(
        "{url}/ws/channels/{}?key={}&dir={dir}",
        r["channel_id"].as_str().expect("channel_id"),
        r["access_key"].as_str().expect("access_key")
    );
    tokio_tungstenite::connect_async(u.as_str())
        .await
        .expect("open a channel end")
        .0
}

/// `shell::fs::read` and `shell::fs::write` through a real engine's data channels: a 300 KiB
/// file streams out through the reader end the worker hands back, and another streams in
/// through a channel the client creates, in 64 KiB binary frames; both arrive byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real iii engine: III_ENGINE_BIN=/path/to/iii, run with --ignored"]
async fn fs_read_and_write_stream_through_real_engine_channels() {
    let mut r = engine_and_worker().await;
    let body: Vec<u8> = (0..300 * 1024u32).map(|i| (i % 251) as u8).collect();
    let src = r.dir.path().join("out.bin");
    std::fs::write(&src, &body).unwrap();

    let read = invoke(
        &mut r.ws,
        "shell::fs::read",
        json!({"path": src.to_string_lossy()}),
        Duration::from_secs(30),
    )
    .await
    .expect("shell::fs::read");
    assert_eq!(read["size"], body.len() as u64, "{read}");
    let mut reader = open_channel(&r.url, &read["content"], "read").await;
    let mut got = Vec::new();
    while let Some(msg) = reader.next().await {
        match msg.expect("read the channel") {
            Message::Binary(b) => got.extend_from_slice(&b),
            Message::Close(_) => break,
            Message::Text(t) => panic!("the worker reported an error on the channel: {t}"),
            _ => {}
        }
    }
    assert!(
        got == body,
        "streamed out {} bytes, want {}",
        got.len(),
        body.len()
    );

    let pair = invoke(
        &mut r.ws,
        "engine::channels::create",
        json!({}),
        Duration::from_secs(30),
    )
    .await
    .expect("engine::channels::create");
    let dst = r.dir.path().join("in.bin");
    let id = uuid::Uuid::new_v4().to_string();
    send(
        &mut r.ws,
        json!({"type": "invokefunction", "invocation_id": id, "function_id": "shell::fs::write",
        "data": {"path": dst.to_string_lossy(), "content": pair["reader"]}}),
    )
    .await;
    let mut writer = open_channel(&r.url, &pair["writer"], "write").await;
    for chunk in body.chunks(64 * 1024) {
        writer
            .send(Message::binary(chunk.to_vec()))
            .await
            .expect("write the channel");
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    let _ = writer.close(None).await;
    let written = result_of(&mut r.ws, &id, "shell::fs::write", Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("shell::fs::write: {e}\n{}", r.worker.log_tail()));
    assert_eq!(written["bytes_written"], body.len() as u64, "{written}");
    assert!(
        std::fs::read(&dst).unwrap() == body,
        "the streamed-in file differs"
    );
    let _ = r.ws.close(None).await;
}

/// `invoke` with an explicit target namespace (strict routing: absent means `default`).
async fn invoke_in(
    ws: &mut Ws,
    namespace: &str,
    function_id: &str,
    data: Value,
    timeout: Duration,
) -> Result<Value, Value> {
    let id = uuid::Uuid::new_v4().to_string();
    send(ws, json!({"type": "invokefunction", "invocation_id": id, "function_id": function_id, "data": data, "namespace": namespace})).await;
    result_of(ws, &id, function_id, timeout).await
}

/// Three workers, one per host, each with its own `III_WORKER_NAME`, `III_NAMESPACE` and
/// jail, against one real engine: every call reaches the host its namespace names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real iii engine: III_ENGINE_BIN=/path/to/iii, run with --ignored"]
async fn three_namespaced_workers_through_a_real_engine() {
    let engine_bin = engine_bin();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config_path = dir.path().join("config.yaml");
    std::fs::write(&config_path, engine_config(port, dir.path())).unwrap();
    let mut engine_cmd = Command::new(engine_bin);
    engine_cmd
        .arg("--no-update-check")
        .arg("--config")
        .arg(&config_path)
        .current_dir(dir.path())
        .env("III_TELEMETRY_ENABLED", "false")
        .env("IIIWORKER_DISABLE_BUILTIN_DAEMONS", "1");
    let mut engine = spawn_logged("engine", engine_cmd, &dir.path().join("engine.log"));
    let deadline = Instant::now() + Duration::from_secs(60);
    wait_for_port(port, &mut engine, deadline).await;
    let url = format!("ws://127.0.0.1:{port}");

    let namespaces = ["host-a", "host-b", "host-c"];
    let mut roots = Vec::new();
    let mut workers = Vec::new();
    for ns in namespaces {
        let root = dir.path().join(ns);
        std::fs::create_dir(&root).unwrap();
        let root = root.canonicalize().unwrap();
        std::fs::write(root.join("whoami.txt"), ns).unwrap();
        let mut seed = iii_shell_protocol::config::Config::builtin_default();
        seed.fs.host_roots = vec![root.display().to_string()];
        seed.fs.allow_unjailed = false;
        let seed_path = dir.path().join(format!("{ns}.yaml"));
        std::fs::write(&seed_path, serde_norway::to_string(&seed).unwrap()).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--config")
            .arg(&seed_path)
            .current_dir(dir.path())
            .env("III_URL", &url)
            .env_remove("III_ENGINE_URL")
            .env("III_WORKER_NAME", format!("shell-{ns}"))
            .env("III_NAMESPACE", ns);
        let log = dir.path().join(format!("iii-shell-{ns}.log"));
        workers.push(spawn_logged("iii-shell", cmd, &log));
        roots.push(root);
    }

    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .expect("client connects to the engine");
    send(
        &mut ws,
        json!({
            "type": "invokefunction",
            "invocation_id": null,
            "function_id": "engine::workers::register",
            "action": {"type": "void"},
            "data": {"runtime": "rust", "name": format!("interop-hosts-{}", std::process::id()), "pid": std::process::id()}
        }),
    )
    .await;

    for i in 0..30 {
        let k = i % 3;
        let (ns, root) = (namespaces[k], &roots[k]);
        let payload = json!({"command": "cat", "args": ["whoami.txt"], "cwd": "."});
        let r = loop {
            match invoke_in(
                &mut ws,
                ns,
                "shell::exec",
                payload.clone(),
                Duration::from_secs(30),
            )
            .await
            {
                Ok(v) => break v,
                Err(e) if e["code"] == "function_not_found" && Instant::now() < deadline => {
                    if let Err(msg) = workers[k].ensure_running() {
                        panic!("{msg}\n{}", engine.log_tail());
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => panic!(
                    "call {i} to {ns} failed: {e}\n{}\n{}",
                    workers[k].log_tail(),
                    engine.log_tail()
                ),
            }
        };
        assert_eq!(
            r["stdout"],
            ns,
            "call {i} landed on the wrong host ({})",
            root.display()
        );
    }
    for ns in namespaces {
        let s = invoke_in(
            &mut ws,
            ns,
            "shell::config-status",
            json!({}),
            Duration::from_secs(30),
        )
        .await
        .expect("shell::config-status");
        assert_eq!(s["config_id"], format!("shell-{ns}"), "{s}");
    }
    let _ = ws.close(None).await;
    drop(workers);
    drop(engine);
}

/// Invokes `function_id` with W3C trace context and waits for its result.
async fn invoke_traced(
    ws: &mut Ws,
    function_id: &str,
    data: Value,
    traceparent: &str,
) -> Result<Value, Value> {
    let id = uuid::Uuid::new_v4().to_string();
    send(
        ws,
        json!({"type": "invokefunction", "invocation_id": id, "function_id": function_id,
                    "data": data, "traceparent": traceparent, "baggage": "tenant=interop"}),
    )
    .await;
    result_of(ws, &id, function_id, Duration::from_secs(30)).await
}

fn span_attr<'a>(span: &'a Value, key: &str) -> Option<&'a str> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|kv| kv[0] == key)
        .and_then(|kv| kv[1].as_str())
}

/// Every span the engine stored for `trace` (all of them, not only roots).
async fn stored_spans(ws: &mut Ws, trace: &str) -> Vec<Value> {
    let listed = invoke(
        ws,
        "engine::traces::list",
        json!({"trace_id": trace, "search_all_spans": true, "include_internal": true, "limit": 1000}),
        Duration::from_secs(30),
    )
    .await
    .expect("engine::traces::list");
    listed["spans"].as_array().cloned().unwrap_or_default()
}

/// Traces, logs and gauges through the engine's own telemetry channel: the real engine with
/// the observability worker's memory exporter stores what the worker sends on `/otel`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real iii engine: III_ENGINE_BIN=/path/to/iii, run with --ignored"]
async fn telemetry_reaches_a_real_engines_observability_worker() {
    let mut r = engine_and_worker_with(
        OBSERVABILITY,
        Some("fs:\n  allow_unjailed: true\ntelemetry:\n  metrics_interval_ms: 1000\n"),
    )
    .await;
    let trace = uuid::Uuid::new_v4().simple().to_string();
    let caller_span = "00f067aa0ba902b7";
    let tp = format!("00-{trace}-{caller_span}-01");
    let secret = format!("s3cr3t-{}", uuid::Uuid::new_v4().simple());
    let file = r.dir.path().join("telemetry-written.txt");

    for i in 0..10 {
        let out = invoke_traced(
            &mut r.ws,
            "shell::exec",
            json!({"command": "echo", "args": [format!("{secret}-{i}")], "env": {"TOKEN": secret}}),
            &tp,
        )
        .await
        .expect("shell::exec");
        assert_eq!(out["exit_code"], 0, "{out}");
    }
    invoke_traced(
        &mut r.ws,
        "shell::fs::write",
        json!({"path": file.to_string_lossy(), "content": secret}),
        &tp,
    )
    .await
    .expect("shell::fs::write");
    let denied = invoke_traced(
        &mut r.ws,
        "shell::exec",
        json!({"command": "rm", "args": ["-rf", "/"]}),
        &tp,
    )
    .await
    .expect_err("the denylist refuses it");
    assert_eq!(denied["code"], "invocation_failed", "{denied}");
    let hidden = invoke_traced(
        &mut r.ws,
        "shell::fs::read",
        json!({"path": "/etc/shadow"}),
        &tp,
    )
    .await
    .expect_err("a hidden path");
    assert_eq!(hidden["code"], "S211", "{hidden}");

    // Spans are batched: wait until the last call's are stored.
    let deadline = Instant::now() + Duration::from_secs(60);
    let spans = loop {
        let spans = stored_spans(&mut r.ws, &trace).await;
        let waits = spans.iter().filter(|s| s["name"] == "exec.wait").count();
        if waits == 10 && spans.iter().any(|s| s["name"] == "execute shell::fs::read") {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "the engine stored {} spans of trace {trace} ({waits} exec.wait)\n{}\n{}",
            spans.len(),
            r.worker.log_tail(),
            r.engine.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let by_id = |id: &Value| spans.iter().find(|s| s["span_id"] == *id);
    let execs: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == "execute shell::exec" && s["status"] != "error")
        .collect();
    assert_eq!(execs.len(), 10);
    for call in &execs {
        // A child of the caller's span.
        assert_eq!(call["parent_span_id"], caller_span, "{call}");
        assert_eq!(span_attr(call, "iii.function.id"), Some("shell::exec"));
        assert_eq!(span_attr(call, "iii.shell.exit_code"), Some("0"));
        assert_eq!(span_attr(call, "iii.shell.program"), Some("echo"));
        assert_eq!(span_attr(call, "iii.shell.timed_out"), Some("false"));
    }
    // Each exec step under the executor's handling, under the round trip, under a call.
    for step in ["exec.prepare", "exec.spawn", "exec.wait"] {
        let n = spans
            .iter()
            .filter(|s| s["name"] == step)
            .filter(|s| {
                let handled = by_id(&s["parent_span_id"]).expect("parent stored");
                let trip = by_id(&handled["parent_span_id"]).expect("round trip stored");
                let call = by_id(&trip["parent_span_id"]).expect("call stored");
                handled["name"] == "executor.exec"
                    && trip["name"] == "executor.call"
                    && call["name"] == "execute shell::exec"
            })
            .count();
        assert_eq!(n, 10, "{step}");
        assert!(spans
            .iter()
            .filter(|s| s["name"] == step)
            .all(|s| { s["end_time_unix_nano"].as_u64() >= s["start_time_unix_nano"].as_u64() }));
    }
    assert!(spans
        .iter()
        .filter(|s| s["name"] == "exec.wait")
        .all(|s| span_attr(s, "iii.shell.exit_code") == Some("0")));
    // The denied calls: error status with their wire codes.
    let refused = spans
        .iter()
        .find(|s| s["name"] == "execute shell::exec" && s["status"] == "error")
        .expect("the denylisted call's span");
    assert_eq!(
        refused["status_description"], "invocation_failed",
        "{refused}"
    );
    assert_eq!(span_attr(refused, "error.type"), Some("invocation_failed"));
    let read = spans
        .iter()
        .find(|s| s["name"] == "execute shell::fs::read")
        .unwrap();
    assert_eq!(read["status"], "error", "{read}");
    assert_eq!(read["status_description"], "S211", "{read}");
    // The tree nests them the same way.
    let tree = invoke(
        &mut r.ws,
        "engine::traces::tree",
        json!({"trace_id": trace}),
        Duration::from_secs(30),
    )
    .await
    .expect("engine::traces::tree");
    let roots = tree["roots"].as_array().expect("roots");
    let root = roots
        .iter()
        .find(|n| n["name"] == "execute shell::exec" && n["status"] == "ok")
        .unwrap_or_else(|| panic!("no exec root: {tree}"));
    let trip = root["children"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "executor.call")
        .unwrap_or_else(|| panic!("no round trip: {root}"));
    let handled = &trip["children"][0];
    assert_eq!(handled["name"], "executor.exec", "{trip}");
    let steps: Vec<&str> = handled["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for step in ["exec.prepare", "exec.spawn", "exec.wait"] {
        assert!(steps.contains(&step), "{steps:?}");
    }
    // No argument value, environment value or file content in anything the engine stored.
    let everything = invoke(
        &mut r.ws,
        "engine::traces::list",
        json!({"search_all_spans": true, "include_internal": true, "limit": 20000}),
        Duration::from_secs(30),
    )
    .await
    .expect("engine::traces::list");
    let text = everything.to_string();
    assert!(!text.contains(&secret), "a secret is in the stored spans");

    // The broker's WARN about the denylist hit, stored with the call's trace.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = invoke(
            &mut r.ws,
            "engine::logs::list",
            json!({"trace_id": trace}),
            Duration::from_secs(30),
        )
        .await
        .expect("engine::logs::list");
        let warn = logs["logs"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["severity_text"] == "WARN");
        if let Some(w) = warn {
            assert!(
                w["body"]
                    .as_str()
                    .unwrap()
                    .contains("refused by the denylist"),
                "{w}"
            );
            assert_eq!(w["span_id"], refused["span_id"], "{w}");
            assert!(!w.to_string().contains(&secret));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no WARN with trace {trace}: {logs}\n{}",
            r.engine.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The memory gauge, found by the engine through worker.id.
    let name = format!("iii-shell-interop-{}", std::process::id());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = invoke(
            &mut r.ws,
            "engine::workers::info",
            json!({"name": name}),
            Duration::from_secs(30),
        )
        .await
        .expect("engine::workers::info");
        let m = &info["worker"]["latest_metrics"];
        if let Some(rss) = m["memory_rss"].as_u64() {
            assert!(rss > 1 << 20, "{m}");
            assert!(m["uptime_seconds"].as_u64().is_some(), "{m}");
            assert!(m["cpu_percent"].as_f64().is_some(), "{m}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no latest_metrics for {name}: {info}\n{}",
            r.engine.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        !r.engine.log_tail().contains("ingestion error"),
        "{}",
        r.engine.log_tail()
    );
    let _ = r.ws.close(None).await;
}
