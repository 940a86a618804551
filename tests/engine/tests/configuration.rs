//! The built-in configuration worker and `configuration` trigger (§6).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{RawWorker, WAIT};
use iii_test_engine::{BindingState, TestClient, TestEngine, TriggerProvider};
use serde_json::{json, Value};

fn demo_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_items": {"type": "integer", "minimum": 1},
            "mode": {"type": "string", "enum": ["fast", "safe"]},
            "endpoint": {"type": "string"}
        },
        "required": ["max_items", "mode"],
        "additionalProperties": false
    })
}

type Seen = Arc<Mutex<Vec<(Value, Option<Value>)>>>;

/// A client with `demo::on_config` bound to the `configuration` trigger.
async fn subscriber(engine: &TestEngine, config: Value) -> (TestClient, Seen) {
    let client = engine.client().await;
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    client
        .register_function("demo::on_config", move |data, metadata| {
            let sink = sink.clone();
            async move {
                sink.lock().unwrap().push((data, metadata));
                Ok(Value::Null)
            }
        })
        .await
        .unwrap();
    client.send_raw(json!({"type": "registertrigger", "id": "b-1", "trigger_type": "configuration",
                           "function_id": "demo::on_config", "config": config, "metadata": {"why": "lab"}}));
    assert!(
        engine
            .wait_until(WAIT, |e| e.triggers().iter().any(
                |t| t.id == "b-1" && t.state == BindingState::Active(TriggerProvider::Engine)
            ))
            .await
    );
    (client, seen)
}

async fn wait_events(engine: &TestEngine, seen: &Seen, n: usize) -> Vec<(Value, Option<Value>)> {
    assert!(
        engine
            .wait_until(WAIT, |_| seen.lock().unwrap().len() >= n)
            .await,
        "expected {n} events, got {:?}",
        seen.lock().unwrap()
    );
    seen.lock().unwrap().clone()
}

#[tokio::test]
async fn register_get_set_semantics_and_events() {
    let engine = TestEngine::start().await;
    let (_sub, seen) = subscriber(&engine, json!({"configuration_id": "demo-settings"})).await;
    let op = engine.client().await;

    let err = op
        .call("configuration::get", json!({"id": "demo-settings"}))
        .await
        .unwrap_err();
    assert_eq!(err.code, "NOT_FOUND");
    assert_eq!(err.message, "configuration 'demo-settings' not found");

    let entry = op
        .call(
            "configuration::register",
            json!({
            "id": "demo-settings", "name": "Demo settings", "description": "Settings",
            "schema": demo_schema(), "initial_value": {"max_items": 10, "mode": "safe"},
            "metadata": {"owner": "lab"}}),
        )
        .await
        .unwrap();
    assert_eq!(
        entry,
        json!({"id": "demo-settings", "name": "Demo settings", "description": "Settings",
               "schema": demo_schema(), "value": {"max_items": 10, "mode": "safe"}, "metadata": {"owner": "lab"}})
    );
    let events = wait_events(&engine, &seen, 1).await;
    assert_eq!(
        events[0].0,
        json!({"type": "configuration", "event_type": "configuration:registered", "id": "demo-settings",
               "name": "Demo settings", "description": "Settings", "schema": demo_schema(),
               "old_value": null, "new_value": {"max_items": 10, "mode": "safe"}, "metadata": {"owner": "lab"}})
    );
    assert_eq!(
        events[0].1,
        Some(json!({"why": "lab"})),
        "binding metadata is the invocation metadata"
    );

    let got = op
        .call("configuration::get", json!({"id": "demo-settings"}))
        .await
        .unwrap();
    assert_eq!(
        got,
        json!({"id": "demo-settings", "value": {"max_items": 10, "mode": "safe"}})
    );

    let changed = op
        .call(
            "configuration::set",
            json!({"id": "demo-settings", "value": {"max_items": 25, "mode": "fast"}}),
        )
        .await
        .unwrap();
    assert_eq!(
        changed,
        json!({"old_value": {"max_items": 10, "mode": "safe"}, "new_value": {"max_items": 25, "mode": "fast"}})
    );
    let events = wait_events(&engine, &seen, 2).await;
    assert_eq!(events[1].0["event_type"], "configuration:updated");
    assert_eq!(
        events[1].0["old_value"],
        json!({"max_items": 10, "mode": "safe"})
    );
    assert_eq!(
        events[1].0["new_value"],
        json!({"max_items": 25, "mode": "fast"})
    );

    let err = op
        .call(
            "configuration::set",
            json!({"id": "demo-settings", "value": {"max_items": 0, "mode": "turbo"}}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, "SCHEMA_INVALID");
    assert_eq!(
        err.message,
        "schema validation failed: 0 is less than the minimum of 1; \"turbo\" is not one of [\"fast\",\"safe\"]"
    );
    assert_eq!(
        engine.config_get("demo-settings").unwrap(),
        json!({"max_items": 25, "mode": "fast"})
    );

    let err = op
        .call(
            "configuration::set",
            json!({"id": "nope-not-here", "value": {}}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, "NOT_REGISTERED");
    assert_eq!(
        err.message,
        "configuration 'nope-not-here' is not registered; call configuration::register first"
    );
    let err = op
        .call(
            "configuration::register",
            json!({"id": "Bad ID!", "name": "x", "description": "x", "schema": {}}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, "INVALID_ID");
    assert_eq!(
        err.message,
        "invalid configuration id 'Bad ID!': must match [a-z0-9_-]{1,64}"
    );

    // Re-register without initial_value keeps the value, replaces metadata, emits updated.
    let entry = op
        .call(
            "configuration::register",
            json!({
            "id": "demo-settings", "name": "Demo settings v2", "description": "re-registered",
            "schema": demo_schema()}),
        )
        .await
        .unwrap();
    assert_eq!(entry["value"], json!({"max_items": 25, "mode": "fast"}));
    assert!(entry.get("metadata").is_none());
    let events = wait_events(&engine, &seen, 3).await;
    assert_eq!(events[2].0["event_type"], "configuration:updated");
    assert_eq!(events[2].0["old_value"], events[2].0["new_value"]);
    assert_eq!(events.len(), 3, "SCHEMA_INVALID set did not fire");
}

#[tokio::test]
async fn list_schema_and_input_errors() {
    let engine = TestEngine::start().await;
    let op = engine.client().await;
    for id in ["zeta", "alpha"] {
        op.call(
            "configuration::register",
            json!({"id": id, "name": id, "description": "", "schema": {"type": "object"}}),
        )
        .await
        .unwrap();
    }
    let list = op.call("configuration::list", json!({})).await.unwrap();
    let ids: Vec<&str> = list["configurations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alpha", "zeta"]);
    assert!(
        list["configurations"][0].get("value").is_none(),
        "list never returns values"
    );

    let err = op
        .call("configuration::list", Value::Null)
        .await
        .unwrap_err();
    assert_eq!(err.code, "deserialization_error");
    let err = op
        .call("configuration::register", json!({"id": "x"}))
        .await
        .unwrap_err();
    assert_eq!(err.code, "deserialization_error");
    let err = op
        .call("configuration::set", json!({"id": "alpha"}))
        .await
        .unwrap_err();
    assert_eq!(err.code, "deserialization_error", "value is required");

    let schema = op
        .call("configuration::schema", json!({"id": "alpha"}))
        .await
        .unwrap();
    assert_eq!(
        schema,
        json!({"id": "alpha", "name": "alpha", "description": "", "schema": {"type": "object"}})
    );

    // Registered without initial_value: value null fails get under an object schema.
    let err = op
        .call("configuration::get", json!({"id": "alpha"}))
        .await
        .unwrap_err();
    assert_eq!(err.code, "SCHEMA_INVALID");
    let raw = op
        .call("configuration::get", json!({"id": "alpha", "raw": true}))
        .await
        .unwrap();
    assert_eq!(raw, json!({"id": "alpha", "value": null}));

    // A namespaced worker must call builtins in default.
    let ns = engine.client_in_namespace("nsw", "orders").await;
    let err = ns
        .call_in_namespace("orders", "configuration::get", json!({"id": "alpha"}))
        .await
        .unwrap_err();
    assert_eq!(err.code, "function_not_found");
}

#[tokio::test]
async fn forgotten_schemas_make_set_unavailable_until_reregistered() {
    let engine = TestEngine::start().await;
    engine.config_seed("shell", json!({"port": 3111}));
    let op = engine.client().await;
    assert_eq!(
        op.call("configuration::get", json!({"id": "shell"}))
            .await
            .unwrap(),
        json!({"id": "shell", "value": {"port": 3111}})
    );
    let err = op
        .call(
            "configuration::set",
            json!({"id": "shell", "value": {"port": 1}}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, "SCHEMA_UNAVAILABLE");

    let schema = json!({"type": "object", "properties": {"port": {"type": "integer"}}});
    let entry = op
        .call(
            "configuration::register",
            json!({"id": "shell", "name": "Shell", "description": "", "schema": schema}),
        )
        .await
        .unwrap();
    assert_eq!(entry["value"], json!({"port": 3111}), "stored value kept");
    op.call(
        "configuration::set",
        json!({"id": "shell", "value": {"port": 3112}}),
    )
    .await
    .unwrap();

    engine.config_forget_schemas();
    let err = op
        .call(
            "configuration::set",
            json!({"id": "shell", "value": {"port": 1}}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, "SCHEMA_UNAVAILABLE");
    assert_eq!(engine.config_entry("shell").unwrap().schema, None);
}

#[tokio::test]
async fn fan_out_is_sequential_filtered_and_awaited_by_test_helpers() {
    let engine = TestEngine::start().await;
    let (_sub, seen) = subscriber(&engine, json!({"event_types": ["configuration:updated"]})).await;

    // A second, namespaced subscriber bound with namespace = its own.
    let ns_client = engine.client_in_namespace("ns-sub", "orders").await;
    ns_client
        .register_function("orders::on_config", |data, _| async move {
            Ok(data["event_type"].clone())
        })
        .await
        .unwrap();
    ns_client.send_raw(json!({"type": "registertrigger", "id": "b-2", "trigger_type": "configuration",
                              "function_id": "orders::on_config", "config": {"configuration_id": "x"},
                              "namespace": "orders"}));
    assert!(engine.wait_until(WAIT, |e| e.triggers().len() == 2).await);

    let results = engine.config_set("x", json!({"a": 1})).await; // new id → registered
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].function_id, "orders::on_config");
    assert_eq!(results[0].namespace, "orders");
    assert_eq!(
        results[0].outcome.clone().unwrap().unwrap(),
        "configuration:registered"
    );

    let results = engine.config_set("x", json!({"a": 2})).await;
    assert_eq!(results.len(), 2);
    assert_eq!(results[0].function_id, "demo::on_config");
    let events = wait_events(&engine, &seen, 1).await;
    assert_eq!(events[0].0["old_value"], json!({"a": 1}));
    assert_eq!(events[0].0["new_value"], json!({"a": 2}));
    // Trigger fires do not carry _caller_worker_id.
    assert!(events[0].0.get("_caller_worker_id").is_none());

    let results = engine.config_delete("x").await;
    assert_eq!(
        results.len(),
        1,
        "deleted only reaches the unfiltered subscriber"
    );
    assert!(engine.config_get("x").is_none());
}

#[tokio::test]
async fn bad_trigger_config_is_refused() {
    let engine = TestEngine::start().await;
    let mut w = RawWorker::connect(&engine.url()).await;
    w.register(json!({"name": "w"})).await;
    w.send(
        json!({"type": "registertrigger", "id": "t-1", "trigger_type": "configuration",
                  "function_id": "demo::f", "config": {"configuration_id": 7}}),
    )
    .await;
    let result = w.recv().await;
    assert_eq!(result["type"], "triggerregistrationresult");
    assert_eq!(result["id"], "t-1");
    assert_eq!(result["error"]["code"], "trigger_registration_failed");
}

#[tokio::test]
async fn unanswered_handler_blocks_only_its_event() {
    let engine = TestEngine::start().await;
    let slow = engine.client().await;
    slow.register_function("demo::slow", |_, _| async {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(Value::Null)
    })
    .await
    .unwrap();
    slow.register_trigger("t-slow", "configuration", "demo::slow", json!({}));
    assert!(engine.wait_until(WAIT, |e| e.triggers().len() == 1).await);
    let op = engine.client().await;
    // set answers right away even though the fan-out is stuck.
    op.call(
        "configuration::register",
        json!({"id": "c", "name": "", "description": "", "schema": {}}),
    )
    .await
    .unwrap();
    op.call("configuration::set", json!({"id": "c", "value": 1}))
        .await
        .unwrap();
    // When the subscriber goes away its pending calls are stopped.
    let slow_id = slow.worker_id();
    engine.drop_worker(slow_id).await;
    assert!(
        engine.triggers().is_empty(),
        "bindings die with their connection"
    );
}
