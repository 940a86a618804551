//! Invocation routing (§3, §4): forwarding, `_caller_worker_id`, errors, void
//! calls and `invocation_stopped`.

mod common;

use std::time::Duration;

use common::{RawWorker, WAIT};
use iii_test_engine::{ErrorBody, TestEngine};
use serde_json::{json, Value};

#[tokio::test]
async fn routes_calls_and_injects_caller_worker_id() {
    let engine = TestEngine::start().await;
    let callee = engine.client().await;
    callee
        .register_function("demo::echo", |data, metadata| async move {
            Ok(json!({"data": data, "metadata": metadata}))
        })
        .await
        .unwrap();
    let caller = engine.client().await;
    let out = caller
        .call_with_metadata(
            "demo::echo",
            json!({"message": "hello"}),
            json!({"request_id": "r-1"}),
        )
        .await
        .unwrap();
    assert_eq!(
        out,
        json!({"data": {"message": "hello", "_caller_worker_id": caller.worker_id().to_string()},
               "metadata": {"request_id": "r-1"}})
    );

    // Non-object payloads travel untouched.
    for data in [json!("a string"), json!([1, 2]), json!(42), Value::Null] {
        let out = caller.call("demo::echo", data.clone()).await.unwrap();
        assert_eq!(out["data"], data);
    }

    // Engine-originated calls carry no _caller_worker_id.
    let out = engine.invoke("demo::echo", json!({"k": 1})).await.unwrap();
    assert_eq!(out["data"], json!({"k": 1}));
}

#[tokio::test]
async fn forwards_frames_like_the_engine() {
    let engine = TestEngine::start().await;
    let mut callee = RawWorker::connect(&engine.url()).await;
    callee.register(json!({"name": "callee"})).await;
    callee
        .send(json!({"type": "registerfunction", "id": "demo::raw"}))
        .await;
    engine.wait_for_function("demo::raw", WAIT).await.unwrap();

    let mut caller = RawWorker::connect(&engine.url()).await;
    let call_id = "c6065636-afd2-42ce-82f0-62caa148ba3b";
    caller
        .send(
            json!({"type": "invokefunction", "invocation_id": call_id, "function_id": "demo::raw",
                     "data": {"n": 7}, "metadata": {"m": 1}}),
        )
        .await;
    let invoke = callee.recv().await;
    assert_eq!(
        invoke,
        json!({"type": "invokefunction", "invocation_id": call_id, "function_id": "demo::raw",
               "data": {"n": 7, "_caller_worker_id": caller.worker_id}, "metadata": {"m": 1}})
    );
    callee
        .send(
            json!({"type": "invocationresult", "invocation_id": call_id, "function_id": "demo::raw",
                     "error": {"code": "S211", "message": "quota exceeded", "stacktrace": "x.py:1"},
                     "traceparent": "00-aa-bb-01"}),
        )
        .await;
    assert_eq!(
        caller.recv().await,
        json!({"type": "invocationresult", "invocation_id": call_id, "function_id": "demo::raw",
               "error": {"code": "S211", "message": "quota exceeded", "stacktrace": "x.py:1"}})
    );

    // A result from a connection that was not invoked is ignored.
    let other = "0d9e0000-0000-4000-8000-000000000000";
    caller
        .send(json!({"type": "invokefunction", "invocation_id": other, "function_id": "demo::raw", "data": {}}))
        .await;
    callee.recv_type("invokefunction").await;
    let mut stranger = RawWorker::connect(&engine.url()).await;
    stranger
        .send(json!({"type": "invocationresult", "invocation_id": other, "function_id": "demo::raw", "result": 1}))
        .await;
    callee
        .send(json!({"type": "invocationresult", "invocation_id": other, "function_id": "demo::raw", "result": null}))
        .await;
    // `null` result: the caller gets a frame without `result`.
    assert_eq!(
        caller.recv().await,
        json!({"type": "invocationresult", "invocation_id": other, "function_id": "demo::raw"})
    );
}

#[tokio::test]
async fn function_not_found_matches_the_engine_message() {
    let engine = TestEngine::start().await;
    let mut caller = RawWorker::connect(&engine.url()).await;
    let id = "545e82a4-c834-4ee7-913d-df8e2fadd711";
    caller
        .send(json!({"type": "invokefunction", "invocation_id": id, "function_id": "demo::missing", "data": {}}))
        .await;
    assert_eq!(
        caller.recv().await,
        json!({"type": "invocationresult", "invocation_id": id, "function_id": "demo::missing",
               "error": {"code": "function_not_found",
                         "message": "Function demo::missing not found in namespace default."}})
    );
}

#[tokio::test]
async fn void_calls_invoke_with_a_real_id_and_reply_nothing() {
    let engine = TestEngine::start().await;
    let mut callee = RawWorker::connect(&engine.url()).await;
    callee.register(json!({"name": "callee"})).await;
    callee
        .send(json!({"type": "registerfunction", "id": "demo::sink"}))
        .await;
    engine.wait_for_function("demo::sink", WAIT).await.unwrap();

    let mut caller = RawWorker::connect(&engine.url()).await;
    let ignored_id = "00000000-0000-4000-8000-000000000009";
    caller
        .send(json!({"type": "invokefunction", "invocation_id": ignored_id, "function_id": "demo::sink",
                     "action": {"type": "void"}, "data": {"a": 1}}))
        .await;
    caller
        .send(json!({"type": "invokefunction", "function_id": "demo::sink", "data": {"a": 2}}))
        .await;
    for _ in 0..2 {
        let invoke = callee.recv().await;
        let id = invoke["invocation_id"].as_str().unwrap().to_string();
        assert_ne!(id, ignored_id, "void calls get a fresh id");
        uuid::Uuid::parse_str(&id).unwrap();
        callee
            .send(json!({"type": "invocationresult", "invocation_id": id, "function_id": "demo::sink", "result": 1}))
            .await;
    }
    caller.send(json!({"type": "ping"})).await;
    assert_eq!(
        caller.recv().await,
        json!({"type": "pong"}),
        "no result for void calls"
    );
    // Unknown function + void: nothing either.
    caller
        .send(json!({"type": "invokefunction", "invocation_id": null, "function_id": "demo::nope", "data": {}}))
        .await;
    caller.send(json!({"type": "ping"})).await;
    assert_eq!(caller.recv().await, json!({"type": "pong"}));
}

#[tokio::test]
async fn callee_disconnect_fails_pending_calls_with_invocation_stopped() {
    let engine = TestEngine::start().await;
    let callee = engine.client().await;
    callee
        .register_function("demo::slow", |_, _| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(Value::Null)
        })
        .await
        .unwrap();
    let callee_id = callee.worker_id();
    let caller = engine.client().await;
    let call = tokio::spawn(async move { caller.call("demo::slow", json!({"job": 1})).await });
    assert!(
        engine
            .wait_until(WAIT, |e| e.worker(callee_id).unwrap().sent.len() > 1)
            .await,
        "callee was invoked"
    );
    engine.drop_worker(callee_id).await;
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(
        err,
        ErrorBody::new("invocation_stopped", "Invocation stopped")
    );
}

#[tokio::test]
async fn caller_disconnect_drops_the_pending_call() {
    let engine = TestEngine::start().await;
    let mut callee = RawWorker::connect(&engine.url()).await;
    callee.register(json!({"name": "callee"})).await;
    callee
        .send(json!({"type": "registerfunction", "id": "demo::slow"}))
        .await;
    engine.wait_for_function("demo::slow", WAIT).await.unwrap();
    let caller = engine.client().await;
    let pending = tokio::spawn(async move { caller.call("demo::slow", json!({})).await });
    let invoke = callee.recv_type("invokefunction").await;
    pending.abort(); // drops the caller's socket
    let _ = pending.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The late result is ignored; the callee's socket stays healthy.
    callee
        .send(
            json!({"type": "invocationresult", "invocation_id": invoke["invocation_id"],
                     "function_id": "demo::slow", "result": {"slept": 4}}),
        )
        .await;
    callee.send(json!({"type": "ping"})).await;
    assert_eq!(callee.recv().await, json!({"type": "pong"}));
}

#[tokio::test]
async fn test_client_handlers_can_fail_and_timeouts_are_local() {
    let engine = TestEngine::start().await;
    let mock = engine.client_named("sandbox").await;
    mock.register_function("sandbox::exec", |data, _| async move {
        if data["cmd"] == "boom" {
            Err(ErrorBody::new("S100", "exploded"))
        } else {
            Ok(json!({"exit_code": 0}))
        }
    })
    .await
    .unwrap();
    let caller = engine.client().await;
    assert_eq!(
        caller
            .call("sandbox::exec", json!({"cmd": "ls"}))
            .await
            .unwrap(),
        json!({"exit_code": 0})
    );
    let err = caller
        .call("sandbox::exec", json!({"cmd": "boom"}))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code.as_str(), err.message.as_str()),
        ("S100", "exploded")
    );

    mock.register_function("sandbox::hang", |_, _| async {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(Value::Null)
    })
    .await
    .unwrap();
    let err = caller
        .call_with_timeout("sandbox::hang", json!({}), Duration::from_millis(100))
        .await
        .unwrap_err();
    assert_eq!(err.code, "Timeout");
}
