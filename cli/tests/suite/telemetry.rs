//! Telemetry through the engine's own channel, against the test engine's `/otel` (the same
//! checks run against a real engine in `interop_real_engine`): every call a span in its
//! caller's trace, with the exec steps and their attributes, no argument, environment or file
//! content anywhere in what is stored, error status and code on denied calls; WARN and ERROR
//! logs with their trace id; the memory gauge in `engine::workers::info`; the off switch; and
//! a telemetry socket that is refused costs the calls nothing.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use iii_test_engine::TestEngine;
use serde_json::{json, Value};

const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn traceparent(trace: &str) -> String {
    format!("00-{trace}-{CALLER_SPAN}-01")
}

/// A fresh trace id per test.
fn new_trace() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A worker whose gauges are sampled every second.
async fn worker(engine: &TestEngine, extra: &str) -> Worker {
    let w = Worker::builder()
        .engine(engine)
        .seed_yaml(&format!(
            "fs:\n  allow_unjailed: true\ntelemetry:\n  metrics_interval_ms: 1000\n{extra}"
        ))
        .start();
    wait_ready(engine, &w).await;
    w
}

/// A `kB` field of `/proc/<pid>/<file>` (`VmRSS:` of `status`), in bytes.
fn kib_of(pid: i32, file: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a str> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|kv| kv[0] == key)
        .and_then(|kv| kv[1].as_str())
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// Waits until the stored spans of `trace` satisfy `done`; returns them.
async fn spans_of(engine: &TestEngine, trace: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let spans: Vec<Value> = engine
            .spans()
            .into_iter()
            .filter(|s| s["trace_id"] == trace)
            .collect();
        if done(&spans) {
            return spans;
        }
        assert!(
            Instant::now() < deadline,
            "spans of trace {trace} incomplete: {}\nerrors: {:?}",
            serde_json::to_string_pretty(&spans).unwrap(),
            engine.telemetry_errors()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn child_of<'a>(spans: &'a [Value], parent: &Value, name: &str) -> &'a Value {
    spans
        .iter()
        .find(|s| s["name"] == name && s["parent_span_id"] == parent["span_id"])
        .unwrap_or_else(|| {
            panic!(
                "no {name} under {}: {}",
                parent["name"],
                serde_json::to_string_pretty(spans).unwrap()
            )
        })
}

/// The last span named `name` under `parent` (a retried step leaves one per attempt).
fn last_child_of<'a>(spans: &'a [Value], parent: &Value, name: &str) -> &'a Value {
    let all: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == name && s["parent_span_id"] == parent["span_id"])
        .collect();
    for earlier in &all[..all.len().saturating_sub(1)] {
        assert_eq!(
            attr(earlier, "iii.shell.outcome"),
            Some("never_started"),
            "{earlier}"
        );
    }
    all.last()
        .copied()
        .unwrap_or_else(|| panic!("no {name} under {}", parent["name"]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_is_a_span_in_the_callers_trace() {
    let engine = TestEngine::start().await;
    let w = worker(&engine, "").await;
    let client = engine.client().await;
    let trace = new_trace();
    let tp = traceparent(&trace);
    let secret = format!("s3cr3t-{}", uuid::Uuid::new_v4().simple());
    let file = w.dir().join("written.txt");

    // Ten calls, as an SDK caller with tracing on makes them.
    for i in 0..10 {
        let r = client
            .call_with_trace(
                "shell::exec",
                json!({"command": "echo", "args": [format!("{secret}-{i}")], "env": {"TOKEN": secret}, "stdin": secret}),
                &tp,
                Some("tenant=acme"),
            )
            .await
            .expect("shell::exec");
        assert_eq!(r["exit_code"], 0);
    }
    client
        .call_with_trace(
            "shell::fs::write",
            json!({"path": file.to_string_lossy(), "content": secret}),
            &tp,
            None,
        )
        .await
        .expect("shell::fs::write");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), secret);

    let spans = spans_of(&engine, &trace, |s| {
        named(s, "exec.wait").len() == 10
            && !named(s, "execute shell::fs::write").is_empty()
            && !named(s, "fs.write").is_empty()
    })
    .await;

    let calls = named(&spans, "execute shell::exec");
    assert_eq!(calls.len(), 10, "one span per call");
    for call in &calls {
        // A child of the caller's span.
        assert_eq!(call["parent_span_id"], CALLER_SPAN, "{call}");
        assert_eq!(call["kind"], 2, "server span: {call}");
        assert_eq!(call["status"], "ok");
        assert_eq!(attr(call, "iii.function.id"), Some("shell::exec"));
        assert_eq!(attr(call, "iii.namespace"), Some("default"));
        assert_eq!(attr(call, "iii.shell.program"), Some("echo"));
        assert_eq!(attr(call, "iii.shell.args_count"), Some("1"));
        assert_eq!(attr(call, "iii.shell.exit_code"), Some("0"));
        assert_eq!(attr(call, "iii.shell.timed_out"), Some("false"));
        assert_eq!(attr(call, "iii.shell.stdout_truncated"), Some("false"));
        assert!(
            attr(call, "iii.invocation.bytes_in").is_some_and(|b| b.parse::<u64>().unwrap() > 50)
        );
        assert!(
            attr(call, "iii.invocation.bytes_out").is_some_and(|b| b.parse::<u64>().unwrap() > 50)
        );
        let validate = child_of(&spans, call, "validate");
        let trip = child_of(&spans, call, "executor.call");
        assert_eq!(attr(trip, "iii.shell.request"), Some("exec"));
        let handled = child_of(&spans, trip, "executor.exec");
        let prepare = child_of(&spans, handled, "exec.prepare");
        // The last spawn: a pre-started process found gone leaves an earlier exec.spawn
        // marked never_started, and the call spawns again.
        let spawn = last_child_of(&spans, handled, "exec.spawn");
        let wait = child_of(&spans, handled, "exec.wait");
        assert!(attr(spawn, "process.pid").is_some(), "{spawn}");
        assert_eq!(attr(wait, "iii.shell.exit_code"), Some("0"));
        assert_eq!(attr(wait, "iii.shell.outcome"), Some("completed"));
        // In order, each with a duration, inside its parent.
        let t = |s: &Value, k: &str| s[k].as_u64().unwrap();
        for s in [validate, trip, handled, prepare, spawn, wait] {
            assert!(
                t(s, "end_time_unix_nano") >= t(s, "start_time_unix_nano"),
                "{s}"
            );
            assert!(
                t(s, "start_time_unix_nano") >= t(call, "start_time_unix_nano"),
                "{s}"
            );
            assert!(
                t(s, "end_time_unix_nano") <= t(call, "end_time_unix_nano"),
                "{s}"
            );
        }
        assert!(t(validate, "end_time_unix_nano") <= t(trip, "start_time_unix_nano"));
        assert!(t(prepare, "end_time_unix_nano") <= t(spawn, "start_time_unix_nano"));
        assert!(t(spawn, "end_time_unix_nano") <= t(wait, "start_time_unix_nano"));
    }
    let write = named(&spans, "execute shell::fs::write")[0];
    let trip = child_of(&spans, write, "executor.call");
    child_of(&spans, child_of(&spans, trip, "executor.fs"), "fs.write");

    // Nothing the caller sent or the command printed is stored: not the argument values,
    // the environment value, stdin, the command's output or the file's contents.
    let stored = serde_json::to_string(&engine.spans()).unwrap();
    assert!(
        !stored.contains(&secret),
        "a secret reached the stored spans: {stored}"
    );
    assert!(
        !stored.contains(&file.to_string_lossy().to_string()),
        "a path reached the stored spans"
    );

    // The engine's views of the trace: its root is our call (its parent is the caller's,
    // outside the engine), and the tree nests the exec steps.
    let listed = client
        .call(
            "engine::traces::list",
            json!({"trace_id": trace, "search_all_spans": true, "limit": 1000}),
        )
        .await
        .unwrap();
    assert_eq!(listed["total"], spans.len() as u64);
    let tree = client
        .call("engine::traces::tree", json!({"trace_id": trace}))
        .await
        .unwrap();
    let roots = tree["roots"].as_array().unwrap();
    assert_eq!(roots.len(), 11, "ten execs and a write: {tree}");
    let exec_root = roots
        .iter()
        .find(|r| r["name"] == "execute shell::exec")
        .unwrap();
    let names: Vec<&str> = exec_root["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["validate", "executor.call"], "{exec_root}");
    assert!(
        engine.telemetry_errors().is_empty(),
        "{:?}",
        engine.telemetry_errors()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_is_an_error_span_with_its_code_and_a_warn_log_with_its_trace() {
    let engine = TestEngine::start().await;
    let _w = worker(&engine, "").await;
    let client = engine.client().await;
    let trace = new_trace();
    let tp = traceparent(&trace);

    // Refused by the denylist in the broker: no executor round trip.
    let e = client
        .call_with_trace(
            "shell::exec",
            json!({"command": "rm", "args": ["-rf", "/"]}),
            &tp,
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, "invocation_failed");
    // A path the fs surface hides: the executor answers S211, like a missing one.
    let e = client
        .call_with_trace("shell::fs::read", json!({"path": "/etc/shadow"}), &tp, None)
        .await
        .unwrap_err();
    assert_eq!(e.code, "S211");

    let spans = spans_of(&engine, &trace, |s| {
        !named(s, "execute shell::exec").is_empty() && !named(s, "executor.fs").is_empty()
    })
    .await;
    let exec = named(&spans, "execute shell::exec")[0];
    assert_eq!(exec["status"], "error");
    assert_eq!(exec["status_description"], "invocation_failed");
    assert_eq!(attr(exec, "error.type"), Some("invocation_failed"));
    let validate = child_of(&spans, exec, "validate");
    assert_eq!(
        validate["status"], "error",
        "the refusal was the broker's validation"
    );
    assert!(
        !spans
            .iter()
            .any(|s| s["name"] == "executor.call" && s["parent_span_id"] == exec["span_id"]),
        "a refused command never reaches the executor"
    );
    let read = named(&spans, "execute shell::fs::read")[0];
    assert_eq!(read["status"], "error");
    assert_eq!(read["status_description"], "S211");
    let trip = child_of(&spans, read, "executor.call");
    assert_eq!(trip["status"], "error");
    let handled = child_of(&spans, trip, "executor.fs");
    assert_eq!(handled["status"], "error");
    assert_eq!(attr(handled, "error.type"), Some("S211"));

    // The broker's WARN about the denylist hit is stored with the call's trace and span.
    let deadline = Instant::now() + WAIT;
    let warn = loop {
        let logs = client
            .call("engine::logs::list", json!({"trace_id": trace}))
            .await
            .unwrap();
        if let Some(l) = logs["logs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["severity_text"] == "WARN")
        {
            break l.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no WARN log with trace {trace}: {:?}",
            engine.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        warn["body"]
            .as_str()
            .unwrap()
            .contains("refused by the denylist"),
        "{warn}"
    );
    assert_eq!(warn["span_id"], exec["span_id"]);
    assert_eq!(warn["attributes"]["iii.shell.process"], "broker");
    assert_eq!(warn["severity_number"], 13);
    assert!(
        !warn.to_string().contains("rm -rf /"),
        "the command line is not in the log: {warn}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_error_reaches_the_engine_with_the_calls_trace() {
    let engine = TestEngine::start().await;
    let w = worker(&engine, "").await;
    let client = engine.client().await;
    let trace = new_trace();
    // The tests' build panics on this stat (test-faults): the executor logs an ERROR.
    let e = client
        .call_with_trace(
            "shell::fs::stat",
            json!({"path": iii_shell_executor::panic_reply::FAULT_PATH}),
            &traceparent(&trace),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, "S216");
    w.expect_log("request handler panicked").await;
    let deadline = Instant::now() + WAIT;
    let err = loop {
        if let Some(l) = engine
            .logs()
            .into_iter()
            .find(|l| l["trace_id"] == trace.as_str() && l["severity_text"] == "ERROR")
        {
            break l;
        }
        assert!(
            Instant::now() < deadline,
            "no ERROR log with trace {trace}: {:?}",
            engine.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(err["attributes"]["iii.shell.process"], "executor");
    assert!(
        err["body"]
            .as_str()
            .unwrap()
            .contains("request handler panicked"),
        "{err}"
    );
    // Its span is the executor's handling of the request, inside the call.
    let spans = spans_of(&engine, &trace, |s| !named(s, "executor.fs").is_empty()).await;
    assert_eq!(err["span_id"], named(&spans, "executor.fs")[0]["span_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_traceparent_starts_a_new_trace() {
    let engine = TestEngine::start().await;
    let _w = worker(&engine, "").await;
    let client = engine.client().await;
    client
        .call("shell::exec", json!({"command": "true"}))
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || engine
            .spans()
            .iter()
            .any(|s| s["name"] == "exec.wait"))
        .await,
        "no spans: {:?}",
        engine.telemetry_errors()
    );
    let spans = engine.spans();
    let call = spans
        .iter()
        .find(|s| s["name"] == "execute shell::exec")
        .unwrap();
    assert_eq!(call["parent_span_id"], Value::Null, "a root: {call}");
    let trace = call["trace_id"].as_str().unwrap();
    assert_eq!(trace.len(), 32);
    assert!(spans
        .iter()
        .filter(|s| s["name"] == "exec.wait")
        .all(|s| s["trace_id"] == trace));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_gauges_are_in_workers_info() {
    let engine = TestEngine::start().await;
    let w = worker(&engine, "").await;
    let client = engine.client().await;
    let name = w.info(&engine).and_then(|i| i.name).expect("worker name");
    let deadline = Instant::now() + WAIT;
    let metrics = loop {
        let info = client
            .call("engine::workers::info", json!({"name": name}))
            .await
            .unwrap();
        if !info["worker"]["latest_metrics"].is_null() {
            break info["worker"]["latest_metrics"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "no gauges: {info} {:?}",
            engine.telemetry_errors()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The supervisor, the broker and the executor together, their shared file pages (the
    // binary) counted once: between the largest process and the three summed, and what the
    // kernel's own counters (status: RssAnon, RssFile) say of it.
    let rss = metrics["memory_rss"].as_u64().unwrap();
    let broker = children_of(w.pid)
        .into_iter()
        .find(|p| cmdline(*p).is_some_and(|c| c.contains(" broker ")))
        .expect("broker");
    let executor = w.executor_pid().expect("executor");
    let pids = [w.pid, broker, executor];
    let field = |f: &str| -> Vec<u64> { pids.iter().map(|p| kib_of(*p, "status", f)).collect() };
    let (total, anon, file) = (field("VmRSS:"), field("RssAnon:"), field("RssFile:"));
    let summed: u64 = total.iter().sum();
    let largest = *total.iter().max().unwrap();
    let kernel = anon.iter().sum::<u64>() + file.iter().max().unwrap();
    assert!(
        rss > largest && rss < summed,
        "memory_rss {rss}: largest {largest}, summed {summed}"
    );
    assert!(
        rss.abs_diff(kernel) < kernel / 4,
        "memory_rss {rss} vs {kernel} from /proc: {metrics}"
    );
    assert!(metrics["uptime_seconds"].as_u64().is_some(), "{metrics}");
    assert!(metrics["cpu_percent"].as_f64().is_some(), "{metrics}");
    // Counters and the other gauges carry their names and the connection's id.
    let id = w.info(&engine).unwrap().worker_id.to_string();
    let points = engine.metric_points();
    for gauge in [
        "iii.shell.jobs.running",
        "iii.shell.pty.sessions",
        "iii.worker.cpu.percent",
    ] {
        assert!(
            points
                .iter()
                .any(|(n, a, _, _)| n == gauge && a["worker.id"] == id.as_str()),
            "{gauge} with worker.id {id}"
        );
    }
    client
        .call("shell::exec", json!({"command": "true"}))
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || engine.metric_points().iter().any(
            |(n, a, v, _)| {
                n == "iii.shell.calls"
                    && a["function_id"] == "shell::exec"
                    && a["outcome"] == "ok"
                    && *v >= 1.0
            }
        ))
        .await,
        "no iii.shell.calls point"
    );
    assert!(
        eventually(WAIT, || engine
            .metric_points()
            .iter()
            .any(|(n, _, v, _)| n == "iii.shell.spawns" && *v >= 1.0))
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_telemetry_off_nothing_is_sent() {
    let engine = TestEngine::start().await;
    let _w = worker(&engine, "  enabled: false\n").await;
    let client = engine.client().await;
    for _ in 0..3 {
        client
            .call_with_trace(
                "shell::exec",
                json!({"command": "true"}),
                &traceparent(&new_trace()),
                None,
            )
            .await
            .unwrap();
    }
    let _ = client
        .call(
            "shell::exec",
            json!({"command": "rm", "args": ["-rf", "/"]}),
        )
        .await;
    // Gauges would have been sampled twice by now.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        engine.telemetry_frames(),
        0,
        "spans: {:?} logs: {:?}",
        engine.spans(),
        engine.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_telemetry_socket_costs_the_calls_nothing_and_what_was_queued_arrives() {
    let engine = TestEngine::start().await;
    let w = worker(&engine, "").await;
    let client = engine.client().await;
    let first = new_trace();
    client
        .call_with_trace(
            "shell::exec",
            json!({"command": "true"}),
            &traceparent(&first),
            None,
        )
        .await
        .unwrap();
    spans_of(&engine, &first, |s| !named(s, "exec.wait").is_empty()).await;

    // The engine closes the telemetry socket and refuses it for a while: calls go on at
    // their usual pace, and nothing reaches the engine.
    engine.set_otel_accepted(false);
    let frames = engine.telemetry_frames();
    let during = new_trace();
    let started = Instant::now();
    for _ in 0..20 {
        client
            .call_with_trace(
                "shell::exec",
                json!({"command": "true"}),
                &traceparent(&during),
                None,
            )
            .await
            .unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "calls waited: {:?}",
        started.elapsed()
    );
    // Long enough for several refused reconnects (1 s, then 2 s apart).
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(
        engine.telemetry_frames(),
        frames,
        "nothing arrives while refused"
    );

    // Taken again: what was queued during the outage arrives, and what follows.
    engine.set_otel_accepted(true);
    let after = new_trace();
    client
        .call_with_trace(
            "shell::exec",
            json!({"command": "true"}),
            &traceparent(&after),
            None,
        )
        .await
        .unwrap();
    spans_of(&engine, &during, |s| named(s, "exec.wait").len() == 20).await;
    spans_of(&engine, &after, |s| !named(s, "exec.wait").is_empty()).await;
    assert!(
        engine.telemetry_errors().is_empty(),
        "{:?}",
        engine.telemetry_errors()
    );
    assert!(w.log_lines("ERROR").is_empty(), "{}", w.stderr());
}
