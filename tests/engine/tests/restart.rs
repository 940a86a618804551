//! Fault injection: drop/close connections, stop, restart on the same port.

mod common;

use std::time::Duration;

use common::{RawWorker, WAIT};
use iii_test_engine::TestEngine;
use serde_json::json;

#[tokio::test]
async fn restart_keeps_port_and_config_values_but_forgets_registrations() {
    let engine = TestEngine::builder()
        .restart_pause(Duration::from_millis(100))
        .start()
        .await;
    let port = engine.port();
    let owner = engine.client_named("owner").await;
    owner
        .register_function("demo::f", |_, _| async { Ok(json!(1)) })
        .await
        .unwrap();
    owner.register_trigger("t", "configuration", "demo::f", json!({}));
    owner
        .call("configuration::register", json!({"id": "shell", "name": "Shell", "description": "",
                                                 "schema": {"type": "object"}, "initial_value": {"port": 1}}))
        .await
        .unwrap();
    let mut raw = RawWorker::connect(&engine.url()).await;

    engine.restart().await;

    assert_eq!(engine.port(), port);
    assert!(raw.closed_within(WAIT).await, "sockets are dropped");
    assert_eq!(
        owner.call("demo::f", json!({})).await.unwrap_err().code,
        "NotConnected"
    );
    assert!(engine.functions().is_empty());
    assert!(engine.triggers().is_empty());
    assert!(engine.workers().iter().all(|w| !w.connected));

    let again = engine.client_named("owner").await;
    let got = again
        .call("configuration::get", json!({"id": "shell"}))
        .await
        .unwrap();
    assert_eq!(got["value"], json!({"port": 1}), "stored values survive");
    let err = again
        .call(
            "configuration::set",
            json!({"id": "shell", "value": {"port": 2}}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, "SCHEMA_UNAVAILABLE", "schemas do not survive");
    assert_eq!(
        again.call("demo::f", json!({})).await.unwrap_err().code,
        "function_not_found"
    );
}

#[tokio::test]
async fn stop_refuses_connections_until_restart() {
    let engine = TestEngine::builder()
        .restart_pause(Duration::from_millis(10))
        .start()
        .await;
    engine.stop().await;
    assert!(tokio_tungstenite::connect_async(engine.url().as_str())
        .await
        .is_err());
    engine.restart().await;
    let _w = RawWorker::connect(&engine.url()).await;
}

#[tokio::test]
async fn drop_and_close_connections_clean_up() {
    let engine = TestEngine::start().await;
    let mut a = RawWorker::connect(&engine.url()).await;
    a.register(json!({"name": "a"})).await;
    a.send(json!({"type": "registerfunction", "id": "demo::a"}))
        .await;
    engine.wait_for_function("demo::a", WAIT).await.unwrap();
    engine.drop_connections().await;
    assert!(a.closed_within(WAIT).await);
    assert!(engine.function("demo::a").is_none());

    let mut b = RawWorker::connect(&engine.url()).await;
    engine.close_connections().await;
    assert!(b.closed_within(WAIT).await);
    assert!(engine.workers().iter().all(|w| !w.connected));
}
