//! Keepalive, half-open detection, reattach + replay, engine restarts and network drops.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use iii_test_engine::TestEngine;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// True when every function of this build is registered and owned by connection `owner`.
fn all_owned_by(e: &TestEngine, owner: uuid::Uuid) -> bool {
    all_function_ids()
        .iter()
        .all(|id| e.function(id).is_some_and(|f| f.owner == owner))
}

fn config_binding(e: &TestEngine) -> Option<iii_test_engine::TriggerInfo> {
    e.triggers()
        .into_iter()
        .find(|t| t.trigger_type == "configuration" && t.function_id == "shell::on-config-change")
}

/// The test engine does not record WS Ping frames, so a bare WebSocket server stands in for it
/// here and counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_pings_are_sent_at_the_configured_period() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let w = Worker::builder()
        .arg("--url")
        .arg(&url)
        .fast_keepalive()
        .start();
    // The first TCP connection may be the start-up reachability probe (no upgrade).
    let mut ws = tokio::time::timeout(WAIT, async {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            if let Ok(ws) = tokio_tungstenite::accept_async(tcp).await {
                break ws;
            }
        }
    })
    .await
    .expect("the worker connects");
    let hello = json!({"type": "workerregistered", "worker_id": uuid::Uuid::new_v4().to_string(), "reattach_token": uuid::Uuid::new_v4().to_string()});
    ws.send(Message::text(hello.to_string())).await.unwrap();

    let window = Duration::from_millis(2000);
    let start = tokio::time::Instant::now();
    let mut pings = 0;
    while let Ok(Some(Ok(msg))) = tokio::time::timeout_at(start + window, ws.next()).await {
        if msg.is_ping() {
            pings += 1; // tungstenite queues the Pong and flushes it with the next read
        }
    }
    // Every 200 ms: about 10 in 2 s; demand a safe fraction of that.
    assert!(
        pings >= 4,
        "only {pings} WS Pings in {window:?}; stderr:\n{}",
        w.stderr()
    );
    assert!(pings <= 15, "{pings} WS Pings in {window:?}");
    // Answered Pings keep the link: still the first connection.
    assert!(!w.stderr().contains("reconnecting"), "{}", w.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_keep_an_idle_link_and_a_half_open_one_is_replaced_with_reattach_and_replay() {
    let engine = TestEngine::start().await;
    let w = Worker::builder().engine(&engine).fast_keepalive().start();
    wait_ready(&engine, &w).await;
    let first = w.info(&engine).unwrap();
    let binding = config_binding(&engine).expect("config binding");

    // The test engine does not record WS Ping frames, so the Pings are observed through their
    // effect: with a 1 s idle limit, an idle link survives only if Pongs keep coming back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let conns = w.connections(&engine);
    assert_eq!(
        conns.len(),
        1,
        "the idle link was recycled; stderr:\n{}",
        w.stderr()
    );
    assert!(conns[0].connected);

    // Half-open: the engine stops reading (and answering Pings).
    let token = first.sent[0]["reattach_token"]
        .as_str()
        .expect("workerregistered token")
        .to_string();
    assert_eq!(first.sent[0]["type"], "workerregistered");
    let paused = Instant::now();
    engine.pause_reads(first.worker_id, true);
    let replaced = engine
        .wait_until(WAIT, |e| {
            w.connections(e).iter().any(|c| {
                c.worker_id != first.worker_id && c.connected && all_owned_by(e, c.worker_id)
            })
        })
        .await;
    assert!(
        replaced,
        "no replacement connection; stderr:\n{}",
        w.stderr()
    );
    let took = paused.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "reconnected only after {took:?}"
    );

    let second = w.info(&engine).unwrap();
    assert_ne!(second.worker_id, first.worker_id);
    let frames: Vec<Value> = second
        .received
        .iter()
        .filter_map(|f| f.json.clone())
        .collect();
    assert_eq!(
        frames[0]["type"], "reattach",
        "first frame of the new connection: {}",
        frames[0]
    );
    assert_eq!(frames[0]["previous_worker_id"], first.worker_id.to_string());
    assert_eq!(frames[0]["reattach_token"], token);
    assert_eq!(
        frames[1]["function_id"], "engine::workers::register",
        "{}",
        frames[1]
    );
    assert!(second.registered_before_registrations());
    // The reattach evicted the half-open connection.
    assert!(
        engine
            .wait_until(WAIT, |e| e
                .worker(first.worker_id)
                .is_some_and(|c| !c.connected))
            .await
    );

    // Everything was replayed: functions and the same trigger binding.
    let again = config_binding(&engine).expect("config binding replayed");
    assert_eq!(
        again.id, binding.id,
        "binding ids stay stable across reconnects"
    );
    assert_eq!(again.owner, second.worker_id);
    let caller = engine.client().await;
    let r = caller
        .call("shell::exec", json!({"command": "echo", "args": ["back"]}))
        .await
        .unwrap();
    assert_eq!(r["stdout"], "back\n");
    // Hot reload still reaches the worker.
    let root = tempfile::tempdir().unwrap();
    let fanout = engine.config_set("shell", jailed_value(root.path())).await;
    assert!(
        fanout.iter().any(|f| f
            .outcome
            .as_ref()
            .is_some_and(|o| o == &Ok(json!({"ok": true})))),
        "{fanout:?}"
    );
    assert_code(&caller.call("shell::exec", pwd_in("..")).await, "S215");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_restart_reregisters_everything_within_three_seconds() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let first = w.info(&engine).unwrap();
    assert!(engine.config_entry("shell").unwrap().schema.is_some());

    engine.restart().await;
    let listening = Instant::now();
    let back = engine
        .wait_until(Duration::from_secs(10), |e| {
            w.connections(e).iter().any(|c| {
                c.connected && c.worker_id != first.worker_id && all_owned_by(e, c.worker_id)
            })
        })
        .await;
    let took = listening.elapsed();
    assert!(back, "functions never came back; stderr:\n{}", w.stderr());
    assert!(
        took <= Duration::from_secs(3),
        "re-registered {took:?} after the engine listened again"
    );

    let caller = engine.client().await;
    let r = caller
        .call(
            "shell::exec",
            json!({"command": "echo", "args": ["restarted"]}),
        )
        .await
        .unwrap();
    assert_eq!(r["stdout"], "restarted\n");
    // The engine forgot the schema; the worker registered it again, and the binding.
    assert!(
        engine
            .wait_until(WAIT, |e| e
                .config_entry("shell")
                .is_some_and(|c| c.schema.is_some()))
            .await
    );
    assert!(config_binding(&engine).is_some());
    assert_eq!(
        engine.config_get("shell"),
        Some(unjailed_value()),
        "the stored value was kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_while_the_engine_was_away_is_picked_up_after_reconnect() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let first = w.info(&engine).unwrap();
    let root = tempfile::tempdir().unwrap();

    engine.stop().await;
    // Nobody is bound while the engine is down: no event reaches the worker.
    let fanout = engine.config_set("shell", jailed_value(root.path())).await;
    assert!(fanout.is_empty(), "{fanout:?}");
    engine.restart().await;
    assert!(
        engine
            .wait_until(WAIT, |e| w.connections(e).iter().any(|c| c.connected
                && c.worker_id != first.worker_id
                && all_owned_by(e, c.worker_id)))
            .await,
        "{}",
        w.stderr()
    );
    let caller = engine.client().await;
    let mut last = None;
    let jailed = {
        let deadline = Instant::now() + WAIT;
        loop {
            let r = caller.call("shell::exec", pwd_in("..")).await;
            if matches!(&r, Err(e) if e.code == "S215") {
                break true;
            }
            last = Some(r);
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert!(
        jailed,
        "the new value was never applied: {last:?}; stderr:\n{}",
        w.stderr()
    );
    let s = caller
        .call("shell::config-status", json!({}))
        .await
        .unwrap();
    assert_eq!(s["last_outcome"], "applied", "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_drop_mid_call_fails_that_call_and_the_worker_recovers() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let first = w.info(&engine).unwrap();
    let socket_caller = Arc::new(engine.client().await);
    let (m1, m2) = (w.marker(2), w.marker(2));

    let from_engine = {
        let engine = engine.clone();
        let m = m1.clone();
        tokio::spawn(async move {
            engine
                .invoke("shell::exec", json!({"command": "sleep", "args": [m]}))
                .await
        })
    };
    let from_socket = {
        let c = socket_caller.clone();
        let m = m2.clone();
        tokio::spawn(async move {
            c.call("shell::exec", json!({"command": "sleep", "args": [m]}))
                .await
        })
    };
    assert!(
        eventually(WAIT, || !procs_with(&format!("sleep {m1}")).is_empty()
            && !procs_with(&format!("sleep {m2}")).is_empty())
        .await,
        "{}",
        w.stderr()
    );
    engine.drop_connections().await;

    let r = tokio::time::timeout(WAIT, from_engine)
        .await
        .unwrap()
        .unwrap();
    assert_code(&r, "invocation_stopped");
    let r = tokio::time::timeout(WAIT, from_socket)
        .await
        .unwrap()
        .unwrap();
    match &r {
        Err(e) if e.code == "invocation_stopped" || e.code == "NotConnected" => {}
        other => panic!("the dropped caller got {other:?}"),
    }

    // The worker reconnects and serves; the abandoned calls finish on their own.
    assert!(
        engine
            .wait_until(WAIT, |e| w.connections(e).iter().any(|c| c.connected
                && c.worker_id != first.worker_id
                && all_owned_by(e, c.worker_id)))
            .await,
        "{}",
        w.stderr()
    );
    let caller = engine.client().await;
    let r = caller
        .call(
            "shell::exec",
            json!({"command": "echo", "args": ["healthy"]}),
        )
        .await
        .unwrap();
    assert_eq!(r["stdout"], "healthy\n");
    assert!(
        eventually(WAIT, || procs_with(&m1).is_empty()
            && procs_with(&m2).is_empty())
        .await
    );
    for i in 0..5 {
        let r = caller
            .call(
                "shell::exec",
                json!({"command": "echo", "args": [i.to_string()]}),
            )
            .await
            .unwrap();
        assert_eq!(r["stdout"], format!("{i}\n"));
    }
    let s = caller
        .call("shell::config-status", json!({}))
        .await
        .unwrap();
    assert_eq!(s["last_outcome"], "applied");
    assert!(alive(w.pid));
    assert!(!w.stderr().contains("panicked"), "{}", w.stderr());
    // Exactly one live connection of this worker.
    assert_eq!(
        w.connections(&engine)
            .iter()
            .filter(|c| c.connected)
            .count(),
        1
    );
}
