//! Connection start-up, keepalive, namespace queue, reattach and leases (§1, §8).

mod common;

use std::time::Duration;

use common::{RawWorker, WAIT};
use iii_test_engine::{Message, NamespaceSource, TestEngine};
use serde_json::json;

#[tokio::test]
async fn sends_workerregistered_first_and_answers_ping() {
    let engine = TestEngine::start().await;
    assert_eq!(engine.url(), format!("ws://127.0.0.1:{}", engine.port()));
    let mut w = RawWorker::connect(&engine.url()).await;
    uuid::Uuid::parse_str(&w.worker_id).expect("worker_id is a UUID");
    uuid::Uuid::parse_str(&w.reattach_token).expect("reattach_token is a UUID");
    assert_eq!(w.hello.as_object().unwrap().len(), 3, "{}", w.hello);

    // Garbage and unknown types are ignored without a reply.
    w.send(json!({"type": "nosuchtype", "x": 1})).await;
    w.send_text("this is not json").await;
    w.send_text("   ").await;
    w.send(json!({"type": "ping"})).await;
    assert_eq!(w.recv().await, json!({"type": "pong"}));
    // WS-level Ping gets a Pong with the same payload.
    w.send_message(Message::Ping(b"lab-ws-ping".to_vec().into()))
        .await;
    assert_eq!(
        w.recv_message().await,
        Message::Pong(b"lab-ws-ping".to_vec().into())
    );

    let info = engine.worker(w.worker_id.parse().unwrap()).unwrap();
    assert!(info.connected);
    assert_eq!(info.sent[0]["type"], "workerregistered");
    assert_eq!(info.received_types(), ["nosuchtype", "?", "?", "ping"]);
}

#[tokio::test]
async fn registrations_wait_for_engine_workers_register() {
    let engine = TestEngine::start().await;
    let mut w = RawWorker::connect(&engine.url()).await;
    w.send(json!({"type": "registerfunction", "id": "demo::early", "description": "d"}))
        .await;
    w.send(json!({"type": "ping"})).await;
    w.recv_type("pong").await;
    // Processed but still queued: not routable yet.
    assert!(engine.function("demo::early").is_none());
    let client = engine.client().await;
    let err = client.call("demo::early", json!({})).await.unwrap_err();
    assert_eq!(err.code, "function_not_found");

    w.register(json!({"name": "lab-worker", "pid": 42, "version": "1.2.3", "runtime": "rust", "os": "linux"}))
        .await;
    let f = engine
        .wait_for_function("demo::early", WAIT)
        .await
        .expect("drained after register");
    assert_eq!(f.description.as_deref(), Some("d"));
    assert_eq!(f.owner_name.as_deref(), Some("lab-worker"));

    let info = engine.worker_info("lab-worker").unwrap();
    assert_eq!(info.pid, Some(42));
    assert_eq!(info.version.as_deref(), Some("1.2.3"));
    assert_eq!(info.runtime.as_deref(), Some("rust"));
    assert_eq!(info.os.as_deref(), Some("linux"));
    assert_eq!(info.namespace.as_deref(), Some("default"));
    assert_eq!(info.namespace_source, Some(NamespaceSource::RegisterCall));
    assert_eq!(info.worker_id.to_string(), w.worker_id);
    assert!(
        !info.registered_before_registrations(),
        "this worker registered late"
    );
    assert!(info.registrations_applied_at.unwrap() >= info.register_call_at.unwrap());
    assert!(f.registered_at >= info.register_call_at.unwrap());
    assert_eq!(
        info.register_data.unwrap()["_caller_worker_id"],
        json!(w.worker_id),
        "the engine injects _caller_worker_id"
    );
}

#[tokio::test]
async fn register_call_first_applies_immediately_and_is_answered_when_it_has_an_id() {
    let engine = TestEngine::start().await;
    let mut w = RawWorker::connect(&engine.url()).await;
    w.send(json!({
        "type": "invokefunction",
        "invocation_id": "6f1e8a62-0000-4000-8000-000000000001",
        "function_id": "engine::workers::register",
        "data": {"name": "ordered", "pid": 1},
    }))
    .await;
    let reply = w.recv().await;
    assert_eq!(
        reply,
        json!({"type": "invocationresult", "invocation_id": "6f1e8a62-0000-4000-8000-000000000001",
               "function_id": "engine::workers::register", "result": {"success": true}})
    );
    w.send(json!({"type": "registerfunction", "id": "demo::f"}))
        .await;
    engine.wait_for_function("demo::f", WAIT).await.unwrap();
    assert!(engine
        .worker_info("ordered")
        .unwrap()
        .registered_before_registrations());
}

#[tokio::test]
async fn grace_timer_pins_default_namespace() {
    let engine = TestEngine::builder()
        .namespace_grace(Duration::from_millis(300))
        .start()
        .await;
    let mut w = RawWorker::connect(&engine.url()).await;
    w.send(json!({"type": "registerfunction", "id": "demo::noreg"}))
        .await;
    let f = engine.wait_for_function("demo::noreg", WAIT).await.unwrap();
    let info = engine.worker(w.worker_id.parse().unwrap()).unwrap();
    assert_eq!(info.namespace_source, Some(NamespaceSource::GraceTimer));
    assert!(f.registered_at.duration_since(info.connected_at) >= Duration::from_millis(300));

    // A late register call cannot move the namespace.
    w.register(json!({"name": "late", "namespace": "orders"}))
        .await;
    assert!(
        engine
            .wait_until(WAIT, |e| e.worker_info("late").is_some())
            .await
    );
    assert_eq!(
        engine.worker_info("late").unwrap().namespace.as_deref(),
        Some("default")
    );
}

#[tokio::test]
async fn namespaced_worker_functions_resolve_strictly() {
    let engine = TestEngine::start().await;
    let owner = engine.client_in_namespace("orders-worker", "orders").await;
    owner
        .register_function("orders::get", |_, _| async { Ok(json!("ok")) })
        .await
        .unwrap();
    assert!(engine.function("orders::get").is_none());
    assert_eq!(
        engine
            .function_in("orders", "orders::get")
            .unwrap()
            .namespace,
        "orders"
    );

    let caller = engine.client().await;
    let err = caller.call("orders::get", json!({})).await.unwrap_err();
    assert_eq!(err.code, "function_not_found");
    assert_eq!(
        err.message,
        "Function orders::get not found in namespace default. It is registered in namespace(s): orders."
    );
    assert_eq!(
        caller
            .call_in_namespace("orders", "orders::get", json!({}))
            .await
            .unwrap(),
        "ok"
    );
    let err = caller
        .call_in_namespace("  ", "orders::get", json!({}))
        .await
        .unwrap_err();
    assert_eq!(err.code, "INVALID_NAMESPACE");
}

#[tokio::test]
async fn function_id_conflicts_are_rejected_but_not_fatal() {
    let engine = TestEngine::start().await;
    let a = engine.client().await;
    a.register_function("demo::echo", |d, _| async move { Ok(d) })
        .await
        .unwrap();
    let mut b = RawWorker::connect(&engine.url()).await;
    b.register(json!({"name": "b"})).await;
    b.send(json!({"type": "registerfunction", "id": "demo::echo"}))
        .await;
    let rejected = b.recv().await;
    assert_eq!(
        rejected,
        json!({"type": "registrationrejected", "code": "FUNCTION_NAMESPACE_CONFLICT",
               "namespace": "default", "function_id": "demo::echo",
               "owner_worker_id": a.worker_id().to_string()})
    );
    assert_eq!(engine.function("demo::echo").unwrap().owner, a.worker_id());
    // engine:: ids only in default.
    let mut c = RawWorker::connect(&engine.url()).await;
    c.register(json!({"name": "c", "namespace": "ns"})).await;
    c.send(json!({"type": "registerfunction", "id": "engine::mine"}))
        .await;
    let rejected = c.recv().await;
    assert_eq!(rejected["owner_worker_id"], "");
    assert_eq!(rejected["namespace"], "ns");
}

#[tokio::test]
async fn worker_name_conflict_closes_the_second_socket() {
    let engine = TestEngine::start().await;
    let _first = engine.client_named("same").await;
    let mut second = RawWorker::connect(&engine.url()).await;
    second.register(json!({"name": "same"})).await;
    let rejected = second.recv().await;
    assert_eq!(rejected["type"], "registrationrejected");
    assert_eq!(rejected["code"], "WORKER_NAMESPACE_CONFLICT");
    assert_eq!(rejected["worker_name"], "same");
    assert!(second.closed_within(WAIT).await);
}

#[tokio::test]
async fn reattach_evicts_the_previous_connection_before_the_replay() {
    let engine = TestEngine::start().await;
    let mut old = RawWorker::connect(&engine.url()).await;
    old.register(json!({"name": "w"})).await;
    old.send(json!({"type": "registerfunction", "id": "demo::f"}))
        .await;
    engine.wait_for_function("demo::f", WAIT).await.unwrap();

    // Wrong token: ignored.
    let mut intruder = RawWorker::connect(&engine.url()).await;
    intruder
        .send(json!({"type": "reattach", "previous_worker_id": old.worker_id, "reattach_token": "nope"}))
        .await;
    intruder.send(json!({"type": "ping"})).await;
    intruder.recv_type("pong").await;
    assert!(engine.function("demo::f").is_some());

    let mut new = RawWorker::connect(&engine.url()).await;
    new.send(
        json!({"type": "reattach", "previous_worker_id": old.worker_id,
                    "reattach_token": old.reattach_token}),
    )
    .await;
    new.register(json!({"name": "w"})).await;
    new.send(json!({"type": "registerfunction", "id": "demo::f"}))
        .await;
    new.send(json!({"type": "ping"})).await;
    // No name or function conflict: the old connection was cleaned up first.
    assert_eq!(new.recv().await, json!({"type": "pong"}));
    assert_eq!(
        engine.function("demo::f").unwrap().owner.to_string(),
        new.worker_id
    );
    assert!(old.closed_within(WAIT).await);
    assert!(
        !engine
            .worker(old.worker_id.parse().unwrap())
            .unwrap()
            .connected
    );
}

#[tokio::test]
async fn disconnect_removes_functions() {
    let engine = TestEngine::start().await;
    let a = engine.client().await;
    a.register_function("demo::gone", |_, _| async { Ok(json!(null)) })
        .await
        .unwrap();
    a.close().await;
    assert!(engine.function("demo::gone").is_none());
    let b = engine.client().await;
    assert_eq!(
        b.call("demo::gone", json!({})).await.unwrap_err().code,
        "function_not_found"
    );
}

#[tokio::test]
async fn paused_reads_leave_pings_unanswered() {
    let engine = TestEngine::start().await;
    let mut w = RawWorker::connect(&engine.url()).await;
    let id = w.worker_id.parse().unwrap();
    engine.pause_reads(id, true);
    tokio::time::sleep(Duration::from_millis(50)).await;
    w.send(json!({"type": "ping"})).await;
    assert!(w.try_recv(Duration::from_millis(300)).await.is_none());
    engine.pause_reads(id, false);
    assert_eq!(w.recv().await, json!({"type": "pong"}));
}
