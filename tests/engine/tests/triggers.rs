//! Worker-provided trigger types (§5), following the recorded b_trigger_type session.

mod common;

use common::{RawWorker, WAIT};
use iii_test_engine::{BindingState, TestEngine, TriggerProvider};
use serde_json::json;

async fn provider(engine: &TestEngine, types: &[&str]) -> RawWorker {
    let mut p = RawWorker::connect(&engine.url()).await;
    p.register(json!({"name": "lab-trigger-provider"})).await;
    for t in types {
        p.send(json!({"type": "registertriggertype", "id": t, "description": "d"}))
            .await;
    }
    let n = types.len();
    assert!(
        engine
            .wait_until(WAIT, |e| e.trigger_types().len() == n)
            .await
    );
    p
}

#[tokio::test]
async fn bindings_are_forwarded_rejected_parked_and_redelivered() {
    let engine = TestEngine::start().await;
    let mut prov = provider(&engine, &["demo::changed"]).await;

    let mut binder = RawWorker::connect(&engine.url()).await;
    binder.register(json!({"name": "lab-trigger-binder"})).await;
    binder
        .send(json!({"type": "registerfunction", "id": "demo::on_changed"}))
        .await;
    binder
        .send(
            json!({"type": "registertrigger", "id": "de10", "trigger_type": "demo::changed",
                     "function_id": "demo::on_changed", "config": {"path": "/srv"},
                     "metadata": {"owner": "lab"}}),
        )
        .await;
    binder
        .send(
            json!({"type": "registertrigger", "id": "3892", "trigger_type": "demo::changed",
                     "function_id": "demo::on_changed", "config": {"path": "/reject/me"}}),
        )
        .await;
    binder
        .send(json!({"type": "registertrigger", "id": "7332", "trigger_type": "demo::late",
                     "function_id": "demo::on_changed", "config": {"x": 1}, "namespace": "default"}))
        .await;

    assert_eq!(
        prov.recv().await,
        json!({"type": "registertrigger", "id": "de10", "trigger_type": "demo::changed",
               "function_id": "demo::on_changed", "config": {"path": "/srv"}, "metadata": {"owner": "lab"}})
    );
    prov.send(
        json!({"type": "triggerregistrationresult", "id": "de10", "trigger_type": "demo::changed",
                     "function_id": "demo::on_changed"}),
    )
    .await;
    let second = prov.recv().await;
    assert_eq!(second["id"], "3892");
    assert!(second.get("metadata").is_none());
    let error =
        json!({"code": "trigger_registration_failed", "message": "path /reject/me is not allowed"});
    prov.send(
        json!({"type": "triggerregistrationresult", "id": "3892", "trigger_type": "demo::changed",
                     "function_id": "demo::on_changed", "error": error}),
    )
    .await;
    assert_eq!(
        binder.recv_type("triggerregistrationresult").await,
        json!({"type": "triggerregistrationresult", "id": "3892", "trigger_type": "demo::changed",
               "function_id": "demo::on_changed", "error": error})
    );
    let results = engine.trigger_registration_results();
    assert_eq!(results.len(), 2);
    assert!(results[0].error.is_none());
    assert_eq!(
        results[1].error.as_ref().unwrap().code,
        "trigger_registration_failed"
    );

    let states: Vec<(String, BindingState)> = engine
        .triggers()
        .into_iter()
        .map(|t| (t.id, t.state))
        .collect();
    let prov_id = prov.worker_id.parse().unwrap();
    assert_eq!(
        states[0],
        (
            "de10".into(),
            BindingState::Active(TriggerProvider::Worker(prov_id))
        )
    );
    assert!(matches!(states[1].1, BindingState::Rejected(_)));
    assert_eq!(states[2], ("7332".into(), BindingState::Parked));

    // A type registered after the binding receives it (namespace default omitted).
    prov.send(json!({"type": "registertriggertype", "id": "demo::late", "description": "late"}))
        .await;
    assert_eq!(
        prov.recv().await,
        json!({"type": "registertrigger", "id": "7332", "trigger_type": "demo::late",
               "function_id": "demo::on_changed", "config": {"x": 1}})
    );

    // Provider lost: bindings are parked, then re-delivered (rejected ones too) to the new provider.
    engine.drop_worker(prov_id).await;
    assert!(engine
        .triggers()
        .iter()
        .all(|t| !matches!(t.state, BindingState::Active(_))));
    let mut prov2 = provider(&engine, &["demo::changed"]).await;
    let mut ids = vec![
        prov2.recv().await["id"].as_str().unwrap().to_string(),
        prov2.recv().await["id"].as_str().unwrap().to_string(),
    ];
    ids.sort();
    assert_eq!(ids, ["3892", "de10"]);

    // Explicit unregister is forwarded with id and type only.
    binder
        .send(json!({"type": "unregistertrigger", "id": "de10", "trigger_type": "demo::changed"}))
        .await;
    assert_eq!(
        prov2.recv().await,
        json!({"type": "unregistertrigger", "id": "de10", "trigger_type": "demo::changed"})
    );
    // Binder disconnect: its live bindings are unregistered at the provider.
    binder
        .send(
            json!({"type": "registertrigger", "id": "1218", "trigger_type": "demo::changed",
                       "function_id": "demo::on_changed", "config": {}}),
        )
        .await;
    assert_eq!(prov2.recv().await["id"], "1218");
    drop(binder);
    // 3892 was redelivered and not refused this time, so it is live as well.
    let mut gone = Vec::new();
    for _ in 0..2 {
        let frame = prov2.recv().await;
        assert_eq!(frame["type"], "unregistertrigger");
        gone.push(frame["id"].as_str().unwrap().to_string());
    }
    gone.sort();
    assert_eq!(gone, ["1218", "3892"]);
    assert!(engine.wait_until(WAIT, |e| e.triggers().is_empty()).await);
}

#[tokio::test]
async fn provider_fires_through_the_engine() {
    let engine = TestEngine::start().await;
    let mut prov = provider(&engine, &["demo::changed"]).await;
    let target = engine.client_in_namespace("binder", "orders").await;
    target
        .register_function("orders::on_changed", |data, metadata| async move {
            Ok(json!({"data": data, "metadata": metadata}))
        })
        .await
        .unwrap();
    target.send_raw(
        json!({"type": "registertrigger", "id": "b", "trigger_type": "demo::changed",
                           "function_id": "orders::on_changed", "config": {}, "namespace": "orders",
                           "trigger_namespace": "default", "metadata": {"sub": 1}}),
    );
    let reg = prov.recv().await;
    assert_eq!(reg["namespace"], "orders");
    assert!(reg.get("trigger_namespace").is_none(), "default is omitted");

    let call_id = "83827fa9-130c-4485-b9b3-c741e3109b3c";
    prov.send(json!({"type": "invokefunction", "invocation_id": call_id, "function_id": "orders::on_changed",
                     "data": {"seq": 1}, "metadata": reg["metadata"], "namespace": reg["namespace"]}))
        .await;
    let result = prov.recv().await;
    assert_eq!(result["invocation_id"], call_id);
    assert_eq!(
        result["result"]["data"],
        json!({"seq": 1, "_caller_worker_id": prov.worker_id})
    );
    assert_eq!(result["result"]["metadata"], json!({"sub": 1}));
}
