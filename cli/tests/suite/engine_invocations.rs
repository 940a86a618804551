//! Invocations through the engine: concurrency, void calls, payload validation, executor
//! death and respawn, broker death, and SIGTERM shutdown.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use iii_test_engine::TestEngine;
use nix::sys::signal::Signal;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invocations_are_handled_concurrently() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = Arc::new(engine.client().await);
    let flag = w.dir().join("flag");
    let flag_s = flag.to_string_lossy().into_owned();

    // A only finishes once B has run: B must be served while A is still in flight.
    let a = {
        let caller = caller.clone();
        let flag = flag_s.clone();
        tokio::spawn(async move {
            caller
                .call(
                    "shell::exec",
                    json!({"command": "sh", "args": ["-c", "while [ ! -e \"$0\" ]; do sleep 0.02; done; echo done", flag],
                           "timeout_ms": 60000}),
                )
                .await
        })
    };
    // Make sure A is running before B is sent.
    assert!(
        eventually(WAIT, || descendants(w.pid)
            .iter()
            .any(|p| cmdline(*p).is_some_and(|c| c.contains(&flag_s))))
        .await
    );
    let b = caller
        .call("shell::exec", json!({"command": "touch", "args": [flag_s]}))
        .await
        .unwrap();
    assert_eq!(b["exit_code"], 0);
    let a = tokio::time::timeout(WAIT, a)
        .await
        .expect("A finished")
        .unwrap()
        .unwrap();
    assert_eq!(a["stdout"], "done\n");

    // Many at once: every one is answered with its own result.
    let calls: Vec<_> = (0..24)
        .map(|i| {
            let caller = caller.clone();
            tokio::spawn(async move {
                let r = caller
                    .call(
                        "shell::exec",
                        json!({"command": "echo", "args": [format!("n{i}")]}),
                    )
                    .await;
                (i, r)
            })
        })
        .collect();
    for c in calls {
        let (i, r) = c.await.unwrap();
        assert_eq!(r.unwrap()["stdout"], format!("n{i}\n"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn void_calls_are_still_answered_with_an_invocation_result() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = engine.client().await;
    let token = format!("void-{}", unique_sleep_arg(0));
    caller.call_void("shell::exec", json!({"command": "echo", "args": [token]}));
    caller.call_void("shell::config-status", json!({"void": token}));

    // The engine invoked the worker with an id of its own; the worker answered that id.
    let w = &w;
    let answered = |fid: &'static str| {
        let token = token.clone();
        move |e: &TestEngine| {
            let Some(info) = w.info(e) else { return false };
            let ids: Vec<Value> = info
                .sent
                .iter()
                .filter(|f| {
                    f["type"] == "invokefunction"
                        && f["function_id"] == fid
                        && f["data"].to_string().contains(&token)
                })
                .map(|f| f["invocation_id"].clone())
                .collect();
            ids.len() == 1
                && ids[0].is_string()
                && info
                    .received_of_type("invocationresult")
                    .iter()
                    .any(|r| r["invocation_id"] == ids[0])
        }
    };
    assert!(
        engine.wait_until(WAIT, answered("shell::exec")).await,
        "{}",
        w.stderr()
    );
    assert!(
        engine
            .wait_until(WAIT, answered("shell::config-status"))
            .await,
        "{}",
        w.stderr()
    );
    let info = w.info(&engine).unwrap();
    let id = info
        .sent
        .iter()
        .find(|f| f["function_id"] == "shell::exec" && f["data"].to_string().contains(&token))
        .unwrap()["invocation_id"]
        .clone();
    let result = info
        .received_of_type("invocationresult")
        .into_iter()
        .find(|r| r["invocation_id"] == id)
        .unwrap();
    assert_eq!(result["function_id"], "shell::exec");
    assert_eq!(result["result"]["stdout"], format!("{token}\n"));
    // The void caller itself got nothing back.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !caller
            .received()
            .iter()
            .any(|f| f["type"] == "invocationresult"),
        "{:?}",
        caller.received()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_payload_fields_are_tolerated() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = engine.client().await;
    let r = caller
        .call(
            "shell::exec",
            json!({"command": "echo", "args": ["x"], "some_future_field": {"a": 1}}),
        )
        .await
        .unwrap();
    assert_eq!(r["stdout"], "x\n");
    let s = caller
        .call("shell::config-status", json!({"whatever": true}))
        .await
        .unwrap();
    assert_eq!(s["last_outcome"], "applied");
    assert_eq!(
        caller.call("shell::list", json!({"x": 1})).await.unwrap()["count"],
        0
    );
    // The engine really did add `_caller_worker_id` to what the worker received.
    let info = w.info(&engine).unwrap();
    let invokes: Vec<&Value> = info
        .sent
        .iter()
        .filter(|f| f["type"] == "invokefunction" && f["function_id"] == "shell::exec")
        .collect();
    assert!(!invokes.is_empty());
    assert!(
        invokes
            .iter()
            .all(|f| f["data"]["_caller_worker_id"] == caller.worker_id().to_string()),
        "{invokes:?}"
    );
    // An explicit one is fine as well.
    let r = caller
        .call(
            "shell::exec",
            json!({"command": "true", "_caller_worker_id": "someone"}),
        )
        .await
        .unwrap();
    assert_eq!(r["exit_code"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_payloads_are_refused_before_the_executor() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = engine.client().await;
    let canary = w.dir().join("canary");
    let p = canary.to_string_lossy().into_owned();

    for payload in [
        json!({"command": "touch", "args": [p], "stdin": 5}),
        json!({"command": "touch", "args": [p], "cwd": 7}),
        json!({"command": "touch", "args": [p], "env": ["A=1"]}),
        json!({"command": "touch", "args": [p], "target": {"kind": "vm"}}),
        json!({"command": "touch", "args": [p], "cwd": "/tmp",
               "target": {"kind": "sandbox", "sandbox_id": "7f9c1d7e-3b1a-4c1e-9a51-6f1b2d3c4e5f"}}),
        json!({"command": "touch", "args": [p], "env": {"LD_PRELOAD": "/x.so"}}),
        json!({"args": [p]}),
        json!("touch"),
    ] {
        let e = caller.call("shell::exec", payload.clone()).await;
        assert_code(&e, "S210");
        let e = caller.call("shell::exec_bg", payload.clone()).await;
        assert_code(&e, "S210");
    }
    // A `command`/`args` of the wrong JSON type is a malformed payload (S210).
    for (payload, want) in [
        (
            json!({"command": ["touch", p]}),
            "'command' must be a string",
        ),
        (
            json!({"command": "touch", "args": [p, 3]}),
            "'args[1]' must be a string",
        ),
        (
            json!({"command": "touch", "args": p}),
            "'args' must be an array of strings",
        ),
    ] {
        let e = caller
            .call("shell::exec", payload.clone())
            .await
            .unwrap_err();
        assert_eq!(e.code, "S210", "{payload}: {e:?}");
        assert!(e.message.contains(want), "{payload}: {e:?}");
    }
    assert_code(&caller.call("shell::status", json!({})).await, "S210");
    assert_code(
        &caller.call("shell::kill", json!({"job_id": 5})).await,
        "S210",
    );

    assert!(!canary.exists(), "a refused call reached the executor");
    // Nothing was spawned at all.
    assert!(procs_with(&p).is_empty());
    let ok = caller
        .call("shell::exec", json!({"command": "touch", "args": [p]}))
        .await
        .unwrap();
    assert_eq!(ok["exit_code"], 0);
    assert!(canary.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_death_answers_s216_and_the_respawned_executor_keeps_the_policy() {
    let engine = TestEngine::start().await;
    let root = tempfile::tempdir().unwrap();
    let w = Worker::builder()
        .engine(&engine)
        .seed(&jailed(root.path()))
        .start();
    wait_ready(&engine, &w).await;
    let caller = Arc::new(engine.client().await);
    assert_code(&caller.call("shell::exec", pwd_in("..")).await, "S215");
    let first = w.wait_executor(None).await;
    assert_eq!(w.log_lines("executor running").len(), 1, "{}", w.stderr());

    let m = w.marker(30);
    let call = {
        let caller = caller.clone();
        let m = m.clone();
        tokio::spawn(async move {
            caller
                .call("shell::exec", json!({"command": "sleep", "args": [m]}))
                .await
        })
    };
    assert!(
        eventually(WAIT, || !procs_with(&format!("sleep {m}")).is_empty()).await,
        "{}",
        w.stderr()
    );
    let started = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first), Signal::SIGKILL).unwrap();
    let r = tokio::time::timeout(WAIT, call)
        .await
        .expect("answered")
        .unwrap();
    assert_code(&r, "S216");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "answered only after {:?}",
        started.elapsed()
    );

    // Respawned, handed the current policy, serving again.
    let second = w.wait_executor(Some(first)).await;
    assert_ne!(first, second);
    assert!(
        eventually(WAIT, || w.log_lines("executor running").len() >= 2).await,
        "{}",
        w.stderr()
    );
    assert!(
        w.stderr()
            .contains("the executor was killed; its commands and jobs were killed with it"),
        "{}",
        w.stderr()
    );
    let r = caller
        .call("shell::exec", json!({"command": "echo", "args": ["again"]}))
        .await
        .unwrap();
    assert_eq!(r["stdout"], "again\n");
    assert_code(&caller.call("shell::exec", pwd_in("..")).await, "S215");
    let r = caller.call("shell::exec", pwd_in(".")).await.unwrap();
    assert_eq!(
        r["stdout"].as_str().unwrap().trim(),
        std::fs::canonicalize(root.path())
            .unwrap()
            .to_str()
            .unwrap()
    );
    assert!(alive(w.pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_death_takes_the_executor_and_its_jobs_down() {
    let engine = TestEngine::start().await;
    let mut w = start_ready(&engine).await;
    let caller = engine.client().await;
    let m = w.marker(600);
    let r = caller
        .call(
            "shell::exec_bg",
            json!({"command": "sh", "args": ["-c", format!("sleep {m} & sleep {m}; wait")]}),
        )
        .await
        .unwrap();
    assert!(r["job_id"].is_string(), "{r}");
    // `sh -c` carries "sleep <m>" in its own command line too: wait for all three.
    assert!(
        eventually(WAIT, || procs_with(&m).len() >= 3).await,
        "sh and two sleeps: {:?}\n{}",
        procs_with(&m),
        w.stderr()
    );
    let executor = w.executor_pid().expect("executor");

    w.signal(Signal::SIGKILL);
    assert!(w.wait_exit(WAIT).await.is_some());
    assert!(
        eventually(WAIT, || !alive(executor)).await,
        "the executor outlived the broker"
    );
    assert!(
        eventually(WAIT, || procs_with(&m).is_empty()).await,
        "job processes left: {:?}",
        procs_with(&m)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_the_call_in_flight_then_exits_zero() {
    let engine = TestEngine::start().await;
    let mut w = start_ready(&engine).await;
    let caller = Arc::new(engine.client().await);
    let executor = w.executor_pid().expect("executor");
    let m = w.marker(1);
    let call = {
        let caller = caller.clone();
        let m = m.clone();
        tokio::spawn(async move {
            caller
                .call("shell::exec", json!({"command": "sleep", "args": [m]}))
                .await
        })
    };
    assert!(
        eventually(WAIT, || !procs_with(&format!("sleep {m}")).is_empty()).await,
        "{}",
        w.stderr()
    );
    w.signal(Signal::SIGTERM);

    let r = tokio::time::timeout(WAIT, call)
        .await
        .expect("answered")
        .unwrap();
    let r =
        r.unwrap_or_else(|e| panic!("the call in flight failed: {e:?}; stderr:\n{}", w.stderr()));
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["timed_out"], false, "{r}");
    let status = w
        .wait_exit(Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("still running; stderr:\n{}", w.stderr()));
    assert_eq!(
        status.code(),
        Some(0),
        "{status:?}; stderr:\n{}",
        w.stderr()
    );
    assert!(
        eventually(WAIT, || !alive(executor)).await,
        "the executor outlived the worker"
    );
    assert!(w.stderr().contains("shutting down"), "{}", w.stderr());
    // It stopped taking calls: its functions are gone from the engine.
    assert!(
        engine
            .wait_until(WAIT, |e| shell_functions(e).is_empty())
            .await
    );
}
