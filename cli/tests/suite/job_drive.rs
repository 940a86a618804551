//! `shell::job::*` end to end through the test engine: real interactive programs (`sh`
//! reading lines, `python3 -i -u` when the machine has it) fed with `shell::job::write`,
//! their answers long-polled with `shell::job::read`, signalled, closed and waited for; a
//! reader that fell behind the bounded buffer told exactly what it missed; the merged
//! stream's order; the signal set; writes to a closed or an exec_bg job; the bounds; and the
//! jobs of an executor that died.

use crate::common;

use std::sync::Arc;

use common::*;
use iii_shell_protocol::config::Config;
use iii_test_engine::{TestClient, TestEngine};
use serde_json::{json, Value};

const ECHO_LINES: &str = r#"while read l; do echo "got $l"; done"#;

async fn worker(engine: &TestEngine, config: Option<Config>) -> Worker {
    let w = match config {
        Some(c) => Worker::builder().engine(engine).seed(&c).start(),
        None => Worker::start(engine),
    };
    wait_ready(engine, &w).await;
    w
}

async fn start(caller: &TestClient, args: &[&str]) -> String {
    let r = caller
        .call(
            "shell::job::start",
            json!({"command": args[0], "args": &args[1..]}),
        )
        .await
        .unwrap_or_else(|e| panic!("shell::job::start {args:?}: {e:?}"));
    r["job_id"].as_str().expect("job_id").to_string()
}

async fn write(caller: &TestClient, id: &str, data: &str) -> Value {
    caller
        .call("shell::job::write", json!({"job_id": id, "data": data}))
        .await
        .unwrap_or_else(|e| panic!("write {data:?}: {e:?}"))
}

/// Long-polls `stream` from `offset` until the text read holds `needle`; the text and the
/// next offset.
async fn read_until(
    caller: &TestClient,
    id: &str,
    stream: &str,
    mut offset: u64,
    needle: &str,
) -> (String, u64) {
    let mut text = String::new();
    for _ in 0..20 {
        let r = caller
            .call(
                "shell::job::read",
                json!({"job_id": id, "stream": stream, "offset": offset, "wait_ms": 10_000}),
            )
            .await
            .unwrap_or_else(|e| panic!("read: {e:?}"));
        assert_eq!(r["missed"], 0, "{r}");
        assert_eq!(r["offset"], offset, "{r}");
        text.push_str(r["data"].as_str().unwrap_or_else(|| panic!("text: {r}")));
        offset = r["next_offset"].as_u64().expect("next_offset");
        if text.contains(needle) {
            return (text, offset);
        }
        assert_eq!(r["ended"], false, "{needle:?} never came: {text:?}");
    }
    panic!("{needle:?} never came on {stream}: {text:?}");
}

async fn wait(caller: &TestClient, id: &str) -> Value {
    let r = caller
        .call(
            "shell::job::wait",
            json!({"job_id": id, "timeout_ms": 20_000}),
        )
        .await
        .unwrap_or_else(|e| panic!("wait: {e:?}"));
    r["job"].clone()
}

/// `sh` reading lines: a line written is answered (the read waiting for it, started before
/// the write), a second line too, then stdin is closed and the job ends by itself, exit 0,
/// its merged stream ended at the exact byte count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sh_reading_lines_is_fed_read_closed_and_waited_for() {
    let engine = TestEngine::start().await;
    let _w = worker(&engine, None).await;
    let caller = Arc::new(engine.client().await);
    let id = start(&caller, &["sh", "-c", ECHO_LINES]).await;

    // A read that starts before anything is written waits for the answer.
    let pending = {
        let (caller, id) = (caller.clone(), id.clone());
        tokio::spawn(async move { read_until(&caller, &id, "stdout", 0, "got hello\n").await })
    };
    let w1 = write(&caller, &id, "hello\n").await;
    assert_eq!(w1, json!({"job_id": id, "written": 6, "closed": false}));
    let (text, next) = pending.await.unwrap();
    assert_eq!((text.as_str(), next), ("got hello\n", 10));

    write(&caller, &id, "world\n").await;
    let (text, next) = read_until(&caller, &id, "stdout", next, "got world\n").await;
    assert_eq!((text.as_str(), next), ("got world\n", 20));

    let c = caller
        .call("shell::job::write", json!({"job_id": id, "close": true}))
        .await
        .unwrap();
    assert_eq!(c, json!({"job_id": id, "written": 0, "closed": true}));
    let job = wait(&caller, &id).await;
    assert_eq!(job["status"], "finished", "{job}");
    assert_eq!(job["exit_code"], 0, "{job}");
    assert_eq!(job["stdout"], "got hello\ngot world\n", "{job}");

    let r = caller
        .call("shell::job::read", json!({"job_id": id, "offset": 0}))
        .await
        .unwrap();
    assert_eq!(r["stream"], "merged");
    assert_eq!(r["data"], "got hello\ngot world\n");
    assert_eq!(
        (r["next_offset"].as_u64(), r["ended"].as_bool()),
        (Some(20), Some(true))
    );
    assert_eq!(r["status"], "finished");

    // Writing after the close, or to the ended job: S210.
    let e = caller
        .call("shell::job::write", json!({"job_id": id, "data": "late\n"}))
        .await
        .unwrap_err();
    assert_eq!(e.code, "S210", "{e:?}");
    assert!(e.message.contains("has ended"), "{e:?}");
}

/// `python3 -i -u` (skipped where the machine has no python3): an expression written is
/// evaluated, INT interrupts a running loop (KeyboardInterrupt) without ending the
/// interpreter, which then answers again; closing stdin ends it with exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_is_driven_through_an_interrupt() {
    if std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .map_or(true, |s| !s.success())
    {
        eprintln!("skipped: no python3 on this machine");
        return;
    }
    let engine = TestEngine::start().await;
    let _w = worker(&engine, None).await;
    let caller = engine.client().await;
    let id = start(&caller, &["python3", "-i", "-u", "-q"]).await;

    write(&caller, &id, "print(6 * 7)\n").await;
    let (_, out) = read_until(&caller, &id, "stdout", 0, "42\n").await;
    write(
        &caller,
        &id,
        "import time\nprint('looping')\nwhile True: time.sleep(0.05)\n\n",
    )
    .await;
    let (_, out) = read_until(&caller, &id, "stdout", out, "looping\n").await;
    let s = caller
        .call("shell::job::signal", json!({"job_id": id, "signal": "INT"}))
        .await
        .unwrap();
    assert_eq!(
        s,
        json!({"job_id": id, "signal": "INT", "sent": true, "status": "running", "reason": null})
    );
    read_until(&caller, &id, "stderr", 0, "KeyboardInterrupt").await;
    write(&caller, &id, "print('still here')\n").await;
    read_until(&caller, &id, "stdout", out, "still here\n").await;

    caller
        .call("shell::job::write", json!({"job_id": id, "close": true}))
        .await
        .unwrap();
    let job = wait(&caller, &id).await;
    assert_eq!(
        (job["status"].as_str(), job["exit_code"].as_i64()),
        (Some("finished"), Some(0)),
        "{job}"
    );
}

/// A reader behind the bounded buffer (`jobs.output_buffer_bytes` = 1000) is told exactly
/// how many bytes it missed: 5000 bytes written, the first 4000 lost to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_behind_the_buffer_gets_the_exact_missed_count() {
    let engine = TestEngine::start().await;
    let mut config = Config::builtin_default();
    config.jobs.output_buffer_bytes = 1000;
    let _w = worker(&engine, Some(config)).await;
    let caller = engine.client().await;
    let r = caller
        .call(
            "shell::exec_bg",
            json!({"command": "sh", "args": ["-c", "printf '%05000d' 7"]}),
        )
        .await
        .unwrap();
    let id = r["job_id"].as_str().unwrap().to_string();
    wait(&caller, &id).await;
    let r = caller
        .call(
            "shell::job::read",
            json!({"job_id": id, "stream": "stdout", "offset": 10, "max_bytes": 600}),
        )
        .await
        .unwrap();
    assert_eq!(
        (
            r["offset"].as_u64(),
            r["missed"].as_u64(),
            r["next_offset"].as_u64(),
            r["ended"].as_bool()
        ),
        (Some(4000), Some(3990), Some(4600), Some(false)),
        "{r}"
    );
    assert_eq!(r["data"], "0".repeat(600));
    let r = caller
        .call(
            "shell::job::read",
            json!({"job_id": id, "stream": "stdout", "offset": 4600}),
        )
        .await
        .unwrap();
    assert_eq!(
        (
            r["missed"].as_u64(),
            r["next_offset"].as_u64(),
            r["ended"].as_bool()
        ),
        (Some(0), Some(5000), Some(true)),
        "{r}"
    );
    assert_eq!(r["data"], format!("{}7", "0".repeat(399)));
    // Past the end: S210.
    let e = caller
        .call(
            "shell::job::read",
            json!({"job_id": id, "stream": "stdout", "offset": 5001}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, "S210", "{e:?}");
}

/// The merged stream keeps the order the bytes arrived in; each stream has its own offsets.
/// Bytes that are not UTF-8 come as base64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_is_arrival_order_and_binary_is_base64() {
    let engine = TestEngine::start().await;
    let _w = worker(&engine, None).await;
    let caller = engine.client().await;
    let script = r#"while read l; do case $l in e*) echo "$l" >&2;; b*) printf '\377\n';; *) echo "$l";; esac; done"#;
    let id = start(&caller, &["sh", "-c", script]).await;
    let mut at = 0;
    for line in ["o1", "e2", "o3"] {
        write(&caller, &id, &format!("{line}\n")).await;
        at = read_until(&caller, &id, "merged", at, &format!("{line}\n"))
            .await
            .1;
    }
    let read = |stream: &'static str| {
        let caller = &caller;
        let id = id.clone();
        async move {
            caller
                .call("shell::job::read", json!({"job_id": id, "stream": stream}))
                .await
                .unwrap()
        }
    };
    assert_eq!(read("merged").await["data"], "o1\ne2\no3\n");
    assert_eq!(read("stdout").await["data"], "o1\no3\n");
    assert_eq!(read("stderr").await["data"], "e2\n");
    write(&caller, &id, "b\n").await;
    let r = caller
        .call(
            "shell::job::read",
            json!({"job_id": id, "stream": "stdout", "offset": 6, "wait_ms": 10_000}),
        )
        .await
        .unwrap();
    assert_eq!(r["data_base64"], "/wo=", "{r}");
    assert!(r.get("data").is_none(), "{r}");
    // Bytes written as base64 reach the program as they are.
    caller
        .call(
            "shell::job::write",
            json!({"job_id": id, "data_base64": "bzQK", "close": true}),
        )
        .await
        .unwrap();
    let job = wait(&caller, &id).await;
    assert_eq!(job["stdout"], "o1\no3\n\u{fffd}\no4\n", "{job}");
}

/// Signals outside the documented set are S210; a write to a closed stdin or to a job of
/// `shell::exec_bg` is S210; read, signal and wait work on an exec_bg job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_exec_bg_jobs() {
    let engine = TestEngine::start().await;
    let w = worker(&engine, None).await;
    let caller = engine.client().await;
    let m = w.marker(600);
    let r = caller
        .call(
            "shell::exec_bg",
            json!({"command": "sh", "args": ["-c", format!("echo hi; exec sleep {m}")]}),
        )
        .await
        .unwrap();
    let bg = r["job_id"].as_str().unwrap().to_string();
    let (text, _) = read_until(&caller, &bg, "stdout", 0, "hi\n").await;
    assert_eq!(text, "hi\n");
    for bad in ["SEGV", "int", "9", "SIGKILLX", ""] {
        let e = caller
            .call("shell::job::signal", json!({"job_id": bg, "signal": bad}))
            .await
            .unwrap_err();
        assert_eq!(e.code, "S210", "{bad}: {e:?}");
    }
    let e = caller
        .call("shell::job::write", json!({"job_id": bg, "data": "x\n"}))
        .await
        .unwrap_err();
    assert_eq!(e.code, "S210", "{e:?}");
    assert!(e.message.contains("shell::exec_bg"), "{e:?}");

    let s = caller
        .call(
            "shell::job::signal",
            json!({"job_id": bg, "signal": "SIGTERM"}),
        )
        .await
        .unwrap();
    assert_eq!(s["sent"], true, "{s}");
    assert_eq!(s["signal"], "TERM", "{s}");
    let job = wait(&caller, &bg).await;
    assert_eq!(job["status"], "finished", "{job}");
    assert_eq!(job["exit_code"], Value::Null, "{job}");
    assert!(procs_with(&format!("sleep {m}")).is_empty());
    let s = caller
        .call(
            "shell::job::signal",
            json!({"job_id": bg, "signal": "TERM"}),
        )
        .await
        .unwrap();
    assert_eq!(
        (s["sent"].as_bool(), s["reason"].as_str()),
        (Some(false), Some("job already finished")),
        "{s}"
    );

    // A closed stdin refuses more.
    let id = start(
        &caller,
        &["sh", "-c", &format!("cat >/dev/null; exec sleep {m}")],
    )
    .await;
    caller
        .call(
            "shell::job::write",
            json!({"job_id": id, "data": "x\n", "close": true}),
        )
        .await
        .unwrap();
    let e = caller
        .call("shell::job::write", json!({"job_id": id, "data": "y\n"}))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code.as_str(), e.message.as_str()),
        ("S210", format!("the stdin of job {id} is closed").as_str())
    );
    let k = caller
        .call("shell::kill", json!({"job_id": id}))
        .await
        .unwrap();
    assert_eq!(k["killed"], true, "{k}");
    // An unknown job is S211, as for shell::status.
    let e = caller
        .call("shell::job::read", json!({"job_id": "nope"}))
        .await
        .unwrap_err();
    assert_eq!(e.code, "S211", "{e:?}");
}

/// The bounds: bytes per write (S218, nothing written), `max_bytes` and `wait_ms` ranges
/// (S210), and callers waiting at once (`jobs.max_waiters` = 1: a second long poll is S218
/// while the first waits, and served once it is answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounds_of_writes_reads_and_waiters() {
    let engine = TestEngine::start().await;
    let mut config = Config::builtin_default();
    config.jobs.max_write_bytes = 8;
    config.jobs.max_waiters = 1;
    let _w = worker(&engine, Some(config)).await;
    let caller = Arc::new(engine.client().await);
    let id = start(&caller, &["sh", "-c", ECHO_LINES]).await;

    let e = caller
        .call(
            "shell::job::write",
            json!({"job_id": id, "data": "123456789"}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, "S218", "{e:?}");
    for bad in [
        json!({"job_id": id, "max_bytes": 0}),
        json!({"job_id": id, "max_bytes": 1_048_577}),
        json!({"job_id": id, "wait_ms": 30_001}),
    ] {
        let e = caller
            .call("shell::job::read", bad.clone())
            .await
            .unwrap_err();
        assert_eq!(e.code, "S210", "{bad}: {e:?}");
    }
    let e = caller
        .call(
            "shell::job::wait",
            json!({"job_id": id, "timeout_ms": 30_001}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, "S210", "{e:?}");

    let first = {
        let (caller, id) = (caller.clone(), id.clone());
        tokio::spawn(async move {
            // The probes below hold the one place for 10 ms each: retry past them.
            loop {
                let r = caller
                    .call(
                        "shell::job::read",
                        json!({"job_id": id, "stream": "stdout", "wait_ms": 30_000}),
                    )
                    .await;
                match r {
                    Err(e) if e.code == "S218" => {
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await
                    }
                    r => break r,
                }
            }
        })
    };
    // Once the first waits, a second waiting caller is refused (the first is the only other).
    let mut refused = None;
    for _ in 0..100 {
        match caller
            .call("shell::job::wait", json!({"job_id": id, "timeout_ms": 10}))
            .await
        {
            Err(e) => {
                refused = Some(e);
                break;
            }
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
    let e = refused.expect("a second waiter was never refused");
    assert_eq!(e.code, "S218", "{e:?}");
    assert!(e.message.contains("jobs.max_waiters"), "{e:?}");
    // The exact bytes of a write at the cap (8) pass; the first waiter gets its answer.
    write(&caller, &id, "12345\n\n\n").await;
    let r = first.await.unwrap().unwrap();
    assert!(
        r["data"]
            .as_str()
            .is_some_and(|d| d.starts_with("got 12345\n")),
        "{r}"
    );
    // Its place is free again.
    let job = caller
        .call("shell::job::wait", json!({"job_id": id, "timeout_ms": 10}))
        .await
        .unwrap();
    assert_eq!(job["job"]["status"], "running", "{job}");
    caller
        .call("shell::kill", json!({"job_id": id}))
        .await
        .unwrap();
}

/// A job driven through `shell::job::*` whose executor is SIGKILLed: once the next executor
/// serves, it answers as `shell::status` does: read ends with the restart note (its output
/// lost), wait returns the `killed` record, signal sends nothing, write is S210.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_executors_job_answers_like_status() {
    let engine = TestEngine::start().await;
    let w = worker(&engine, None).await;
    let caller = engine.client().await;
    let first = w.wait_executor(None).await;
    let id = start(&caller, &["sh", "-c", ECHO_LINES]).await;
    write(&caller, &id, "a\n").await;
    read_until(&caller, &id, "stdout", 0, "got a\n").await;

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    w.wait_executor(Some(first)).await;
    assert!(
        eventually(WAIT, || w.log_lines("executor running").len() >= 2).await,
        "{}",
        w.stderr()
    );
    let status = caller
        .call("shell::status", json!({"job_id": id}))
        .await
        .unwrap();
    let job = wait(&caller, &id).await;
    assert_eq!(job, status["job"]);
    assert_eq!(job["status"], "killed", "{job}");
    let r = caller
        .call("shell::job::read", json!({"job_id": id, "wait_ms": 1000}))
        .await
        .unwrap();
    assert_eq!(r["ended"], true, "{r}");
    assert_eq!(r["status"], "killed", "{r}");
    assert_eq!(r["data"], job["stderr"], "{r}");
    assert!(
        r["data"]
            .as_str()
            .is_some_and(|d| d.contains("executor restarted")),
        "{r}"
    );
    let s = caller
        .call(
            "shell::job::signal",
            json!({"job_id": id, "signal": "TERM"}),
        )
        .await
        .unwrap();
    assert_eq!(
        (s["sent"].as_bool(), s["status"].as_str()),
        (Some(false), Some("killed")),
        "{s}"
    );
    let e = caller
        .call("shell::job::write", json!({"job_id": id, "data": "b\n"}))
        .await
        .unwrap_err();
    assert_eq!(e.code, "S210", "{e:?}");
}
