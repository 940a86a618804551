//! The console page's worker side, end to end without a browser: `iii-shell serve` against
//! the test engine, a second connection playing the iii console (it owns the `console:script`
//! and `console:style` trigger types, receives our bindings, fetches the assets through
//! `shell::ui-content` and acknowledges or rejects them), and `shell::ui-state::*` through the
//! engine with the pane files checked on disk.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use iii_shell_protocol::config::Config;
use iii_test_engine::{TestClient, TestEngine};
use serde_json::{json, Value};

struct Setup {
    engine: TestEngine,
    worker: Worker,
    _dir: tempfile::TempDir,
    base: PathBuf,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let root = base.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let mut config: Config = jailed(&root);
    config.turns.data_dir = base.join("data/turns").to_string_lossy().into_owned();
    // No scratch paths: /tmp (a default one) holds the store, which stays in place only out of
    // commands' reach.
    config.confinement.scratch_paths = Vec::new();
    let engine = TestEngine::start().await;
    let worker = Worker::builder().engine(&engine).seed(&config).start();
    wait_ready(&engine, &worker).await;
    Setup {
        engine,
        worker,
        _dir: dir,
        base,
    }
}

/// A connection that owns the console's asset trigger types, as the console worker does.
async fn console(engine: &TestEngine) -> TestClient {
    let c = engine.client_named("console").await;
    for ty in ["console:script", "console:style"] {
        c.send_raw(
            json!({"type": "registertriggertype", "id": ty, "description": "console asset",
            "trigger_request_format": {}, "call_request_format": {}}),
        );
    }
    c
}

fn bindings(c: &TestClient, ty: &str) -> Vec<Value> {
    c.received()
        .into_iter()
        .filter(|f| f["type"] == "registertrigger" && f["trigger_type"] == ty)
        .collect()
}

async fn wait_binding(c: &TestClient, ty: &str, count: usize) -> Value {
    let ok = c
        .wait_for_frame(WAIT, |_| bindings(c, ty).len() >= count)
        .await;
    assert!(
        ok.is_some(),
        "no {count}th {ty} binding: {:?}",
        c.received()
    );
    bindings(c, ty).pop().unwrap()
}

fn ack(c: &TestClient, binding: &Value, error: Option<Value>) {
    let mut f = json!({"type": "triggerregistrationresult", "id": binding["id"],
        "trigger_type": binding["trigger_type"], "function_id": binding["function_id"]});
    if let Some(e) = error {
        f["error"] = e;
    }
    c.send_raw(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_assets_are_bound_served_and_bound_again_after_a_reconnect() {
    let s = setup().await;
    let c = console(&s.engine).await;
    let script = wait_binding(&c, "console:script", 1).await;
    let style = wait_binding(&c, "console:style", 1).await;
    assert_eq!(script["function_id"], "shell::ui-content");
    assert_eq!(script["config"], json!({"path": "shell/page.js"}));
    assert_eq!(style["function_id"], "shell::ui-content");
    assert_eq!(style["config"], json!({"path": "shell/page.css"}));

    // The console fetches each asset through the content function.
    for (binding, ty) in [
        (&script, "text/javascript; charset=utf-8"),
        (&style, "text/css; charset=utf-8"),
    ] {
        let path = binding["config"]["path"].as_str().unwrap();
        let got = c
            .call("shell::ui-content", json!({"path": path}))
            .await
            .unwrap();
        let asset = iii_shell_broker::console_ui::content_for(path).unwrap();
        assert_eq!(got["content"], asset.content, "{path} served verbatim");
        assert_eq!(got["content_type"], ty);
        ack(&c, binding, None);
    }
    let js = iii_shell_broker::console_ui::content_for("shell/page.js")
        .unwrap()
        .content;
    assert!(
        js.contains("export{") || js.contains("export {"),
        "an ES module"
    );
    assert!(js.contains("from\"react\""), "React stays external");
    let unknown = c
        .call("shell::ui-content", json!({"path": "shell/other.js"}))
        .await
        .unwrap_err();
    assert_eq!(unknown.code, "S211");
    assert!(
        unknown.message.starts_with(
            "UNKNOWN_UI_ASSET: 'shell/other.js' is not one of this worker's ui assets"
        ),
        "{}",
        unknown.message
    );
    let missing = c.call("shell::ui-content", json!({})).await.unwrap_err();
    assert_eq!(missing.code, "S210");

    // A lost connection: the worker comes back and binds both assets again, same ids.
    let info = s.worker.wait_connected(&s.engine).await;
    s.engine.drop_worker(info.worker_id).await;
    let again = wait_binding(&c, "console:script", 2).await;
    assert_eq!(again["id"], script["id"]);
    assert_eq!(again["config"], script["config"]);
    let again = wait_binding(&c, "console:style", 2).await;
    assert_eq!(again["id"], style["id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_asset_binding_is_logged_with_its_reason() {
    let s = setup().await;
    let c = console(&s.engine).await;
    let style = wait_binding(&c, "console:style", 1).await;
    ack(
        &c,
        &style,
        Some(json!({"code": "asset_fetch_failed", "message": "content over 8 MiB"})),
    );
    assert!(
        s.worker
            .wait_log("the console refused this worker's page asset", WAIT)
            .await,
        "{}",
        s.worker.stderr()
    );
    let line = s
        .worker
        .log_lines("the console refused this worker's page asset")
        .join("\n");
    assert!(line.contains("content over 8 MiB"), "{line}");
    assert!(line.contains("asset_fetch_failed"), "{line}");
    assert!(line.contains("shell/page.css"), "{line}");
    assert!(line.contains("ERROR"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_state_is_one_file_per_pane_beside_the_turn_store() {
    let s = setup().await;
    let c = s.engine.client().await;
    let get = |key: &str, legacy: Option<&str>| {
        let mut p = json!({"key": key});
        if let Some(l) = legacy {
            p["legacy_key"] = json!(l);
        }
        c.call("shell::ui-state::get", p)
    };
    assert_eq!(
        get("pane-1", None).await.unwrap(),
        json!({"key": "pane-1", "state": null})
    );
    let set = c
        .call(
            "shell::ui-state::set",
            json!({"key": "pane-1", "state": {"root": "/w", "open": ["a.rs"]}}),
        )
        .await
        .unwrap();
    let stored = r#"{"open":["a.rs"],"root":"/w"}"#;
    assert_eq!(set, json!({"key": "pane-1", "bytes": stored.len()}));
    c.call(
        "shell::ui-state::set",
        json!({"key": "../../escape", "state": {"x": 1}}),
    )
    .await
    .unwrap();
    assert_eq!(
        get("pane-1", None).await.unwrap()["state"],
        json!({"root": "/w", "open": ["a.rs"]})
    );
    assert_eq!(
        get("pane-2", Some("pane-1")).await.unwrap(),
        json!({"key": "pane-2", "state": {"root": "/w", "open": ["a.rs"]}}),
        "the legacy key is read when the pane has nothing"
    );
    let dir = s.base.join("data/ui-state");
    assert_eq!(
        std::fs::read_to_string(dir.join("pane-1.json")).unwrap(),
        stored
    );
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["%2E%2E%2F%2E%2E%2Fescape.json", "pane-1.json"]);
    assert!(!s.base.join("escape.json").exists());

    // Bad input: a clear S-code, and nothing stored or lost.
    for (payload, code) in [
        (json!({"key": "", "state": {}}), "S210"),
        (json!({"key": "k".repeat(513), "state": {}}), "S210"),
        (json!({"key": "pane-1", "state": [1, 2]}), "S210"),
        (json!({"key": "pane-1"}), "S210"),
        (
            json!({"key": "pane-1", "state": {"big": "x".repeat(4 * 1024 * 1024)}}),
            "S218",
        ),
    ] {
        let e = c
            .call("shell::ui-state::set", payload.clone())
            .await
            .unwrap_err();
        assert_eq!(
            e.code,
            code,
            "{}: {e:?}",
            &payload.to_string()[..40.min(payload.to_string().len())]
        );
    }
    let e = c
        .call("shell::ui-state::get", json!({"key": ""}))
        .await
        .unwrap_err();
    assert_eq!(e.code, "S210");
    assert_eq!(
        std::fs::read_to_string(dir.join("pane-1.json")).unwrap(),
        stored,
        "a refused write leaves the pane as it was"
    );
    let _ = Duration::ZERO;
}
