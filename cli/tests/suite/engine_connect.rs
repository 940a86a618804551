//! `iii-shell serve` against the test engine: where it connects, how it introduces itself,
//! what it registers, and how it behaves when nothing listens yet.

use crate::common;

use std::time::Duration;

use common::*;
use iii_test_engine::{NamespaceSource, TestEngine};
use serde_json::{json, Value};

fn version_output() -> String {
    let out = std::process::Command::new(BIN)
        .arg("--version")
        .output()
        .expect("run --version");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    text.trim()
        .strip_prefix("iii-shell ")
        .unwrap_or_else(|| panic!("unexpected --version output {text:?}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introduces_itself_first_then_registers_every_function() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let info = w.wait_connected(&engine).await;

    // The very first frame is the fire-and-forget engine::workers::register call.
    let first = info
        .received
        .first()
        .and_then(|f| f.json.clone())
        .expect("a first frame");
    assert_eq!(first["type"], "invokefunction", "{first}");
    assert_eq!(first["function_id"], "engine::workers::register", "{first}");
    assert_eq!(first["invocation_id"], Value::Null, "{first}");
    assert_eq!(first["action"], json!({"type": "void"}), "{first}");
    assert!(
        info.registered_before_registrations(),
        "{:?}",
        info.received_types()
    );
    assert_eq!(info.namespace_source, Some(NamespaceSource::RegisterCall));
    assert_eq!(info.namespace.as_deref(), Some("default"));

    let data = &first["data"];
    assert_eq!(data["name"], "shell");
    assert!(
        data.get("namespace").is_none(),
        "no III_NAMESPACE → no namespace field: {data}"
    );
    assert_eq!(info.name.as_deref(), Some("shell"));
    assert_eq!(info.version.as_deref(), Some(version_output().as_str()));
    assert_eq!(info.runtime.as_deref(), Some("rust"));
    assert!(
        info.os
            .as_deref()
            .is_some_and(|os| os.contains(std::env::consts::OS)),
        "{:?}",
        info.os
    );
    assert_eq!(info.pid, Some(w.pid as u64));
    // Nothing was answered for the void call.
    assert!(
        !info
            .sent
            .iter()
            .any(|f| f["type"] == "invocationresult"
                && f["function_id"] == "engine::workers::register"),
        "{:?}",
        info.sent
    );

    // Every implemented function, with description, schemas and metadata exactly as the
    // catalogue defines them.
    let mut defs = iii_shell_broker::functions::catalogue();
    defs.extend(
        iii_shell_broker::lifecycle::all_function_defs()
            .into_iter()
            .filter(|d| d.id == "shell::on-config-change"),
    );
    let ids: Vec<&str> = defs.iter().map(|d| d.id).collect();
    for core in CORE_FUNCTIONS {
        assert!(ids.contains(core), "{core} is not implemented: {ids:?}");
    }
    for def in &defs {
        let id = def.id;
        let f = engine
            .function(id)
            .unwrap_or_else(|| panic!("{id} not registered"));
        assert_eq!(f.owner, info.worker_id, "{id}");
        assert!(
            f.description.as_deref().is_some_and(|d| !d.is_empty()),
            "{id}: {:?}",
            f.frame
        );
        assert_eq!(f.description.as_deref(), Some(def.description), "{id}");
        assert_eq!(f.frame["request_format"], def.request_format, "{id}");
        assert_eq!(f.frame["response_format"], def.response_format, "{id}");
        assert_eq!(f.metadata.as_ref(), Some(&def.metadata), "{id}");
        for key in ["request_format", "response_format"] {
            let s = &f.frame[key];
            assert_eq!(
                s["$schema"], "http://json-schema.org/draft-07/schema#",
                "{id}.{key}: {s}"
            );
            assert!(s["title"].is_string(), "{id}.{key}: {s}");
        }
        assert!(
            f.metadata.as_ref().is_some_and(Value::is_object),
            "{id}: {:?}",
            f.frame
        );
    }
    // The seed's metadata flags.
    assert_eq!(
        engine.function("shell::config-status").unwrap().metadata,
        Some(json!({"internal": true}))
    );
    assert_eq!(
        engine.function("shell::on-config-change").unwrap().metadata,
        Some(json!({"internal": true}))
    );
    assert_eq!(
        engine.function("shell::exec").unwrap().metadata,
        Some(json!({}))
    );
    // Nothing else under shell:: or coder::.
    let mut ours: Vec<String> = shell_functions(&engine);
    ours.sort();
    let mut want = all_function_ids();
    want.sort();
    assert_eq!(ours, want);

    // The configuration binding.
    let trig = engine
        .triggers()
        .into_iter()
        .find(|t| t.trigger_type == "configuration")
        .expect("a configuration trigger binding");
    assert_eq!(trig.function_id, "shell::on-config-change");
    assert_eq!(trig.config, json!({"configuration_id": "shell"}));
    assert_eq!(trig.owner, info.worker_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_flag_beats_iii_url_beats_iii_engine_url() {
    let (a, b, c) = (
        TestEngine::start().await,
        TestEngine::start().await,
        TestEngine::start().await,
    );
    let pid_on = |e: &TestEngine, pid: i32| e.workers().iter().any(|w| w.pid == Some(pid as u64));

    // --url wins over both variables.
    let w1 = Worker::builder()
        .arg("--url")
        .arg(&a.url())
        .env("III_URL", &b.url())
        .env("III_ENGINE_URL", &c.url())
        .start();
    w1.wait_connected(&a).await;
    // III_URL wins over III_ENGINE_URL.
    let w2 = Worker::builder()
        .env("III_URL", &b.url())
        .env("III_ENGINE_URL", &c.url())
        .start();
    w2.wait_connected(&b).await;
    // III_ENGINE_URL alone; a blank III_URL counts as unset.
    let w3 = Worker::builder()
        .env("III_URL", "  ")
        .env("III_ENGINE_URL", &c.url())
        .start();
    w3.wait_connected(&c).await;
    // `iii-shell` without the subcommand serves too.
    let d = TestEngine::start().await;
    let w4 = Worker::builder()
        .without_subcommand()
        .env("III_ENGINE_URL", &d.url())
        .start();
    w4.wait_connected(&d).await;

    assert!(!pid_on(&b, w1.pid) && !pid_on(&c, w1.pid));
    assert!(!pid_on(&a, w2.pid) && !pid_on(&c, w2.pid));
    assert!(!pid_on(&a, w3.pid) && !pid_on(&b, w3.pid));
    for (e, w) in [(&a, &w1), (&b, &w2), (&c, &w3), (&d, &w4)] {
        wait_ready(e, w).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_url_is_local_port_49134() {
    // Only if the default port is free on this machine.
    if std::net::TcpListener::bind("127.0.0.1:49134").is_err() {
        iii_shell_confine::requirement::unmet("127.0.0.1:49134 is in use");
        return;
    }
    let engine = TestEngine::builder().port(49134).start().await;
    let w = Worker::builder().start();
    w.wait_connected(&engine).await;
    wait_ready(&engine, &w).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_name_and_namespace_come_from_the_environment() {
    let engine = TestEngine::start().await;
    let w = Worker::builder()
        .engine(&engine)
        .env("III_WORKER_NAME", "shell-7")
        .env("III_NAMESPACE", "tenant-a")
        .start();
    let info = w.wait_connected(&engine).await;
    assert!(
        engine
            .wait_until(WAIT, |e| e.function_in("tenant-a", "shell::exec").is_some())
            .await,
        "{}",
        w.stderr()
    );
    let info = w.info(&engine).unwrap_or(info);
    assert_eq!(info.name.as_deref(), Some("shell-7"));
    assert_eq!(info.namespace.as_deref(), Some("tenant-a"));
    assert_eq!(
        info.register_data.as_ref().unwrap()["namespace"],
        "tenant-a"
    );
    assert!(
        engine.function("shell::exec").is_none(),
        "nothing in default"
    );

    let caller = engine.client().await;
    let r = caller
        .call_in_namespace(
            "tenant-a",
            "shell::exec",
            json!({"command": "echo", "args": ["ns"]}),
        )
        .await
        .unwrap();
    assert_eq!(r["stdout"], "ns\n");

    // The configuration binding targets the worker's own namespace, so hot reload works there.
    assert!(
        engine
            .wait_until(WAIT, |e| e
                .function_in("tenant-a", "shell::on-config-change")
                .is_some())
            .await
    );
    let root = tempfile::tempdir().unwrap();
    // A namespaced worker keeps its own entry, `shell-<namespace>`.
    assert!(engine.config_get("shell").is_none());
    let fanout = engine
        .config_set("shell-tenant-a", jailed_value(root.path()))
        .await;
    let ours: Vec<_> = fanout
        .iter()
        .filter(|r| r.function_id == "shell::on-config-change")
        .collect();
    assert_eq!(ours.len(), 1, "{fanout:?}");
    assert_eq!(ours[0].namespace, "tenant-a", "{fanout:?}");
    assert_eq!(
        ours[0].outcome.as_ref().and_then(|o| o.as_ref().ok()),
        Some(&json!({"ok": true})),
        "{fanout:?}"
    );
    let e = caller
        .call_in_namespace("tenant-a", "shell::exec", pwd_in(".."))
        .await;
    assert_code(&e, "S215");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blank_name_and_namespace_mean_unset() {
    let engine = TestEngine::start().await;
    let w = Worker::builder()
        .engine(&engine)
        .env("III_WORKER_NAME", " ")
        .env("III_NAMESPACE", "  ")
        .start();
    wait_ready(&engine, &w).await;
    let info = w.info(&engine).unwrap();
    assert_eq!(info.name.as_deref(), Some("shell"));
    assert_eq!(info.namespace.as_deref(), Some("default"));
    let data = info.register_data.unwrap();
    assert!(data.get("namespace").is_none(), "{data}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_engine_is_reported_once_and_the_worker_waits_for_it() {
    let port = free_port();
    let mut w = Worker::builder()
        .arg("--url")
        .arg(&format!("ws://127.0.0.1:{port}"))
        .start();
    let needle = format!("engine unreachable at 127.0.0.1:{port}");
    w.expect_log(&needle).await;
    let lines = w.log_lines(&needle);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("--url") && lines[0].contains("III_URL"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("ERROR"), "{}", lines[0]);

    // Several retry periods later: still running, still one line.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        w.try_exit().is_none(),
        "the worker exited; stderr:\n{}",
        w.stderr()
    );
    assert_eq!(w.log_lines(&needle).len(), 1, "{}", w.stderr());

    // An engine appears on that port: the worker connects and registers.
    let engine = TestEngine::builder().port(port).start().await;
    wait_ready(&engine, &w).await;
    let info = w.info(&engine).unwrap();
    assert!(info.registered_before_registrations());
    assert_eq!(w.log_lines(&needle).len(), 1, "{}", w.stderr());
    let caller = engine.client().await;
    let r = caller
        .call("shell::exec", json!({"command": "echo", "args": ["up"]}))
        .await
        .unwrap();
    assert_eq!(r["stdout"], "up\n");
}
