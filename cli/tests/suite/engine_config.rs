//! The configuration lifecycle through the real binary and the test engine's configuration
//! worker: boot (seed, stored value, fail-closed) and hot reload (applied, rejected,
//! widening, running jobs), plus the shapes of `shell::config-status` and
//! `shell::on-config-change`.

use crate::common;

use std::time::Duration;

use common::*;
use iii_shell_protocol::config::Config;
use iii_test_engine::{TestEngine, WorkerInfo};
use serde_json::{json, Value};

const DRAFT_07: &str = "http://json-schema.org/draft-07/schema#";

/// The worker's `invokefunction` frames for `function_id`, in order.
fn calls_to(info: &WorkerInfo, function_id: &str) -> Vec<Value> {
    info.received_of_type("invokefunction")
        .into_iter()
        .filter(|f| f["function_id"] == function_id)
        .collect()
}

/// Fail-closed ordering: no `shell::*` function was registered before a `configuration::get`
/// that the engine answered with a valid configuration.
fn assert_functions_follow_a_confirmed_config(info: &WorkerInfo) {
    let frames: Vec<Value> = info
        .received
        .iter()
        .filter_map(|f| f.json.clone())
        .collect();
    let first_reg = frames
        .iter()
        .position(|f| {
            f["type"] == "registerfunction"
                && f["id"].as_str().is_some_and(|id| id.starts_with("shell::"))
        })
        .expect("functions registered");
    let confirm = frames[..first_reg]
        .iter()
        .rev()
        .find(|f| f["type"] == "invokefunction" && f["function_id"] == "configuration::get")
        .unwrap_or_else(|| {
            panic!("no configuration::get before the first registerfunction: {frames:?}")
        });
    let answer = info
        .sent
        .iter()
        .find(|f| f["type"] == "invocationresult" && f["invocation_id"] == confirm["invocation_id"])
        .expect("the engine answered that get");
    let value = &answer["result"]["value"];
    assert!(
        Config::from_value(value).is_ok(),
        "registered after an answer without a valid value: {answer}"
    );
}

async fn status(caller: &iii_test_engine::TestClient) -> Value {
    caller
        .call("shell::config-status", json!({}))
        .await
        .expect("config-status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_without_stored_value_or_seed_registers_the_builtin_default() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let info = w.info(&engine).unwrap();

    assert_eq!(
        engine.config_get("shell"),
        Some(shipped_value()),
        "the stored value is the shipped config.yaml"
    );
    let gets = calls_to(&info, "configuration::get");
    let regs = calls_to(&info, "configuration::register");
    assert_eq!(regs.len(), 1, "{regs:?}");
    let reg = &regs[0]["data"];
    assert_eq!(reg["id"], "shell");
    assert_eq!(reg["initial_value"], shipped_value());
    assert_eq!(reg["schema"]["$schema"], DRAFT_07);
    assert_eq!(reg["schema"]["type"], "object");
    assert!(
        reg["name"].is_string() && reg["description"].is_string(),
        "{reg}"
    );
    // The initial value satisfies the registered schema.
    iii_test_engine::schema_check::validate(&reg["schema"], &reg["initial_value"])
        .expect("seed fits the schema");
    assert_eq!(gets[0]["data"], json!({"id": "shell"}));
    assert!(!w.stderr().contains("configuration 'coder'"));
    assert!(calls_to(&info, "configuration::get")
        .iter()
        .all(|g| g["data"]["id"] == "shell"));

    let entry = engine.config_entry("shell").unwrap();
    assert_eq!(
        entry.schema.as_ref().map(|s| s["$schema"].clone()),
        Some(json!(DRAFT_07))
    );
    let binding = engine
        .triggers()
        .into_iter()
        .find(|t| t.trigger_type == "configuration")
        .expect("binding");
    assert_eq!(binding.function_id, "shell::on-config-change");
    assert_eq!(binding.config["configuration_id"], "shell");
    assert_functions_follow_a_confirmed_config(&info);

    let caller = engine.client().await;
    assert_eq!(
        status(&caller).await,
        json!({"last_outcome": "applied", "last_error": null, "rejected_reloads": 0, "config_id": "shell"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_file_is_the_initial_value() {
    let engine = TestEngine::start().await;
    let root = tempfile::tempdir().unwrap();
    let mut seed = jailed(root.path());
    seed.max_output_bytes = 4096;
    let w = Worker::builder().engine(&engine).seed(&seed).start();
    wait_ready(&engine, &w).await;
    let info = w.info(&engine).unwrap();
    let regs = calls_to(&info, "configuration::register");
    assert_eq!(
        regs[0]["data"]["initial_value"],
        serde_json::to_value(&seed).unwrap()
    );
    assert_eq!(
        engine.config_get("shell"),
        Some(serde_json::to_value(&seed).unwrap())
    );
    assert_functions_follow_a_confirmed_config(&info);

    let caller = engine.client().await;
    assert_code(&caller.call("shell::exec", pwd_in("..")).await, "S215");
    let r = caller
        .call(
            "shell::exec",
            json!({"command": "head", "args": ["-c", "10000", "/dev/zero"]}),
        )
        .await
        .unwrap();
    assert_eq!(
        r["stdout_truncated"], true,
        "the seed's max_output_bytes is in force"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_value_wins_and_is_registered_without_initial_value() {
    let engine = TestEngine::start().await;
    let root = tempfile::tempdir().unwrap();
    let stored = jailed_value(root.path());
    engine.config_seed("shell", stored.clone());
    // An unjailed seed file that must lose.
    let w = Worker::builder()
        .engine(&engine)
        .seed(&Config::builtin_default())
        .start();
    wait_ready(&engine, &w).await;
    let info = w.info(&engine).unwrap();

    let regs = calls_to(&info, "configuration::register");
    assert!(!regs.is_empty());
    for r in &regs {
        assert!(
            r["data"].get("initial_value").is_none(),
            "register with a stored value sent initial_value: {r}"
        );
        assert_eq!(r["data"]["schema"]["$schema"], DRAFT_07);
    }
    assert_eq!(engine.config_get("shell"), Some(stored));
    assert_functions_follow_a_confirmed_config(&info);

    let caller = engine.client().await;
    assert_code(&caller.call("shell::exec", pwd_in("..")).await, "S215");
    let r = caller.call("shell::exec", pwd_in(".")).await.unwrap();
    assert_eq!(
        r["stdout"].as_str().unwrap().trim(),
        std::fs::canonicalize(root.path())
            .unwrap()
            .to_str()
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_file_that_does_not_parse_aborts_boot() {
    let engine = TestEngine::start().await;
    for (yaml, want) in [
        (
            "allowlist: []\nfs:\n  allow_unjailed: true\n",
            "`allowlist` (removed in 0.8.0, no replacement)",
        ),
        (
            "inherit_env: true\nfs:\n  allow_unjailed: true\n",
            "config keys removed in 0.7.0",
        ),
        (
            "fs:\n  host_roots: []\n  allow_unjailed: false\n",
            "refusing to start unjailed",
        ),
        ("max_timeout_ms: [unclosed\n", "not valid YAML"),
    ] {
        let mut w = Worker::builder().engine(&engine).seed_yaml(yaml).start();
        let status = w
            .wait_exit(WAIT)
            .await
            .unwrap_or_else(|| panic!("{yaml:?}: still running; stderr:\n{}", w.stderr()));
        assert!(!status.success(), "{yaml:?}: {status:?}");
        let err = w.stderr();
        assert!(
            err.contains(want),
            "{yaml:?}: stderr does not mention {want:?}:\n{err}"
        );
        assert!(
            err.contains("seed.yaml"),
            "{yaml:?}: the file is named:\n{err}"
        );
    }
    assert!(
        engine.functions().is_empty(),
        "{:?}",
        engine.functions().iter().map(|f| &f.id).collect::<Vec<_>>()
    );
    assert!(
        engine.workers().is_empty(),
        "the worker should not even connect"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nulled_store_fails_closed_until_a_valid_value_is_set() {
    let engine = TestEngine::start().await;
    engine.config_seed("shell", Value::Null);
    let w = Worker::start(&engine);
    w.wait_connected(&engine).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    assert!(
        shell_functions(&engine).is_empty(),
        "{:?}",
        shell_functions(&engine)
    );
    assert!(engine.triggers().is_empty());
    assert!(alive(w.pid), "the worker must keep running");
    let lines = w.log_lines("fail-closed");
    assert!(
        lines.iter().any(|l| l.contains("null")),
        "the log says why:\n{}",
        w.stderr()
    );
    // It keeps retrying (every 2 s), without repeating the same error line every time.
    let gets = calls_to(&w.info(&engine).unwrap(), "configuration::get").len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        calls_to(&w.info(&engine).unwrap(), "configuration::get").len() > gets,
        "no retry"
    );
    assert_eq!(
        w.log_lines("fail-closed").len(),
        lines.len(),
        "the same error was logged again:\n{}",
        w.stderr()
    );
    assert!(lines.len() <= 2, "{lines:?}");
    assert_eq!(
        engine.config_get("shell"),
        Some(Value::Null),
        "the worker must not overwrite the nulled value"
    );

    engine.config_set("shell", unjailed_value()).await;
    wait_ready(&engine, &w).await;
    let info = w.info(&engine).unwrap();
    assert_functions_follow_a_confirmed_config(&info);
    let caller = engine.client().await;
    assert_eq!(
        caller
            .call("shell::exec", json!({"command": "echo", "args": ["open"]}))
            .await
            .unwrap()["stdout"],
        "open\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_stored_value_fails_closed_with_the_migration_hint() {
    let engine = TestEngine::start().await;
    let mut bad = unjailed_value();
    bad["inherit_env"] = json!(true);
    engine.config_seed("shell", bad);
    let w = Worker::start(&engine);
    w.wait_connected(&engine).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    assert!(
        shell_functions(&engine).is_empty(),
        "{:?}",
        shell_functions(&engine)
    );
    assert!(alive(w.pid));
    let err = w.stderr();
    assert!(err.contains("config keys removed in 0.7.0"), "{err}");
    assert!(err.contains("`inherit_env` -> `env.inherit`"), "{err}");

    // Fixed in the store (no event): the next retry picks it up.
    let root = tempfile::tempdir().unwrap();
    engine.config_seed("shell", jailed_value(root.path()));
    wait_ready(&engine, &w).await;
    assert_functions_follow_a_confirmed_config(&w.info(&engine).unwrap());
    let caller = engine.client().await;
    assert_code(&caller.call("shell::exec", pwd_in("..")).await, "S215");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowing_reload_is_applied() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = engine.client().await;
    assert_eq!(
        caller.call("shell::exec", pwd_in("/")).await.unwrap()["stdout"],
        "/\n"
    );

    let root = tempfile::tempdir().unwrap();
    let fanout = engine.config_set("shell", jailed_value(root.path())).await;
    assert_eq!(fanout.len(), 1, "{fanout:?}");
    assert_eq!(fanout[0].function_id, "shell::on-config-change");
    assert_eq!(
        fanout[0].outcome,
        Some(Ok(json!({"ok": true}))),
        "{fanout:?}; stderr:\n{}",
        w.stderr()
    );

    assert_code(&caller.call("shell::exec", pwd_in("..")).await, "S215");
    assert_code(&caller.call("shell::exec", pwd_in("/")).await, "S215");
    assert_eq!(
        status(&caller).await,
        json!({"last_outcome": "applied", "last_error": null, "rejected_reloads": 0, "config_id": "shell"})
    );
    assert!(
        w.stderr().contains("configuration reloaded"),
        "{}",
        w.stderr()
    );
    assert!(
        !w.stderr().contains("privilege change"),
        "narrowing is not a privilege change:\n{}",
        w.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_reloads_keep_the_last_good_policy() {
    let engine = TestEngine::start().await;
    let root = tempfile::tempdir().unwrap();
    let w = Worker::builder()
        .engine(&engine)
        .seed(&jailed(root.path()))
        .start();
    wait_ready(&engine, &w).await;
    let caller = engine.client().await;
    let good = jailed_value(root.path());

    let mut bad_regex = good.clone();
    bad_regex["denylist_patterns"] = json!(["("]);
    let mut unjailed_without_opt_in = good.clone();
    unjailed_without_opt_in["fs"]["host_roots"] = json!([]);
    unjailed_without_opt_in["fs"]["allow_unjailed"] = json!(false);
    let mut removed_key = unjailed_value();
    removed_key["allowed_env"] = json!(["PATH"]);
    let cases = [
        (bad_regex, "denylist_patterns[0]"),
        (unjailed_without_opt_in, "refusing to start unjailed"),
        (removed_key, "config keys removed in 0.7.0"),
        (Value::Null, "null"),
    ];
    for (n, (value, why)) in cases.into_iter().enumerate() {
        let fanout = engine.config_set("shell", value.clone()).await;
        assert_eq!(
            fanout[0].outcome,
            Some(Ok(json!({"ok": false}))),
            "{value}: {fanout:?}"
        );
        let s = status(&caller).await;
        assert_eq!(s["last_outcome"], "rejected", "{value}: {s}");
        assert_eq!(s["rejected_reloads"], n as u64 + 1, "{value}: {s}");
        let err = s["last_error"].as_str().unwrap_or_default();
        assert!(
            err.contains(why),
            "{value}: last_error {err:?} does not explain ({why:?})"
        );
        // The last-good (jailed) policy is still enforced.
        assert_code(&caller.call("shell::exec", pwd_in("..")).await, "S215");
        let r = caller.call("shell::exec", pwd_in(".")).await.unwrap();
        assert_eq!(
            r["stdout"].as_str().unwrap().trim(),
            std::fs::canonicalize(root.path())
                .unwrap()
                .to_str()
                .unwrap()
        );
    }
    // Deleting the entry is no reason to drop the policy either.
    let fanout = engine.config_delete("shell").await;
    assert_eq!(
        fanout[0].outcome,
        Some(Ok(json!({"ok": false}))),
        "{fanout:?}"
    );
    let s = status(&caller).await;
    assert_eq!(
        (s["last_outcome"].as_str(), s["rejected_reloads"].as_u64()),
        (Some("rejected"), Some(5)),
        "{s}"
    );
    assert!(s["last_error"].as_str().unwrap().contains("deleted"), "{s}");
    assert_code(&caller.call("shell::exec", pwd_in("..")).await, "S215");

    assert!(
        w.log_lines("configuration reload rejected").len() >= 5,
        "{}",
        w.stderr()
    );
    assert!(w
        .log_lines("configuration reload rejected")
        .iter()
        .all(|l| l.contains("ERROR")));

    // A good value again: applied, the count is kept.
    let other = tempfile::tempdir().unwrap();
    let fanout = engine.config_set("shell", jailed_value(other.path())).await;
    assert_eq!(
        fanout[0].outcome,
        Some(Ok(json!({"ok": true}))),
        "{fanout:?}"
    );
    let s = status(&caller).await;
    assert_eq!(s["last_outcome"], "applied", "{s}");
    assert_eq!(s["rejected_reloads"], 5, "{s}");
    let r = caller.call("shell::exec", pwd_in(".")).await.unwrap();
    assert_eq!(
        r["stdout"].as_str().unwrap().trim(),
        std::fs::canonicalize(other.path())
            .unwrap()
            .to_str()
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_widening_reload_is_applied_and_logged_as_a_privilege_change() {
    let engine = TestEngine::start().await;
    let root = tempfile::tempdir().unwrap();
    let w = Worker::builder()
        .engine(&engine)
        .seed(&jailed(root.path()))
        .start();
    wait_ready(&engine, &w).await;
    let caller = engine.client().await;
    assert_code(&caller.call("shell::exec", pwd_in("/")).await, "S215");

    let fanout = engine.config_set("shell", unjailed_value()).await;
    assert_eq!(
        fanout[0].outcome,
        Some(Ok(json!({"ok": true}))),
        "{fanout:?}"
    );
    assert_eq!(
        caller.call("shell::exec", pwd_in("/")).await.unwrap()["stdout"],
        "/\n"
    );
    let lines = w.log_lines("privilege change");
    assert_eq!(lines.len(), 1, "{}", w.stderr());
    assert!(lines[0].contains("host_roots"), "{}", lines[0]);
    assert_eq!(status(&caller).await["last_outcome"], "applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_jobs_are_not_rechecked_by_a_reload() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = engine.client().await;
    let m = w.marker(2);
    let job = caller
        .call("shell::exec_bg", json!({"command": "sh", "args": ["-c", format!("sleep {m}; pwd; echo finished")], "cwd": "/tmp"}))
        .await
        .unwrap();
    let id = job["job_id"].as_str().unwrap().to_string();
    assert!(eventually(WAIT, || !procs_with(&format!("sleep {m}")).is_empty()).await);

    let root = tempfile::tempdir().unwrap();
    let fanout = engine.config_set("shell", jailed_value(root.path())).await;
    assert_eq!(
        fanout[0].outcome,
        Some(Ok(json!({"ok": true}))),
        "{fanout:?}"
    );
    assert_code(&caller.call("shell::exec", pwd_in("/tmp")).await, "S215");
    let s = caller
        .call("shell::status", json!({"job_id": id}))
        .await
        .unwrap();
    assert_eq!(s["job"]["status"], "running", "{s}");

    let deadline = std::time::Instant::now() + WAIT;
    let done = loop {
        let s = caller
            .call("shell::status", json!({"job_id": id}))
            .await
            .unwrap();
        if s["job"]["status"] != "running" || std::time::Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["job"]["status"], "finished", "{done}");
    assert_eq!(done["job"]["exit_code"], 0, "{done}");
    assert_eq!(done["job"]["stdout"], "/tmp\nfinished\n", "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_status_and_on_config_change_follow_the_seed_schemas() {
    let engine = TestEngine::start().await;
    let _w = start_ready(&engine).await;
    let caller = engine.client().await;

    let cs = engine.function("shell::config-status").unwrap();
    let req = cs.request_format.clone().unwrap();
    assert_eq!(req["title"], "ConfigStatusRequest");
    assert_eq!(req["type"], "object");
    let resp = cs.response_format.clone().unwrap();
    assert_eq!(resp["title"], "ReloadStatus");
    assert_eq!(
        resp["required"],
        json!(["last_outcome", "rejected_reloads"])
    );
    assert_eq!(
        resp["properties"]["last_error"]["type"],
        json!(["string", "null"])
    );
    assert_eq!(resp["properties"]["rejected_reloads"]["type"], "integer");
    assert_eq!(
        resp["properties"]["last_outcome"]["$ref"],
        "#/definitions/ReloadOutcome"
    );
    let outcomes: Vec<Value> = resp["definitions"]["ReloadOutcome"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["enum"][0].clone())
        .collect();
    assert_eq!(outcomes, vec![json!("applied"), json!("rejected")]);

    let s = status(&caller).await;
    let keys: Vec<&String> = s.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        // The seed's three fields, plus the configuration id in use (the seed's schema
        // allows additional properties).
        vec![
            "config_id",
            "last_error",
            "last_outcome",
            "rejected_reloads"
        ],
        "{s}"
    );
    iii_test_engine::schema_check::validate(&resp, &s).expect("status fits its schema");

    let oc = engine.function("shell::on-config-change").unwrap();
    let req = oc.request_format.clone().unwrap();
    let resp = oc.response_format.clone().unwrap();
    assert_eq!(req["title"], "OnConfigChangeEvent");
    assert_eq!(req["properties"]["id"]["type"], json!(["string", "null"]));
    assert!(req.get("required").is_none(), "{req}");
    assert_eq!(resp["title"], "OnConfigChangeResponse");
    assert_eq!(resp["required"], json!(["ok"]));
    assert_eq!(resp["properties"]["ok"]["type"], "boolean");

    // The handler ignores what it is given (the id is advisory) and re-fetches.
    for payload in [
        json!({}),
        json!({"id": "shell"}),
        json!({"id": null}),
        json!({"id": "other", "type": "configuration", "x": [1]}),
    ] {
        let r = caller
            .call("shell::on-config-change", payload.clone())
            .await
            .unwrap();
        assert_eq!(r, json!({"ok": true}), "{payload}");
        iii_test_engine::schema_check::validate(&resp, &r).expect("ack fits its schema");
    }
    // A bad store answers ok: false and counts as a rejected reload.
    let mut bad = unjailed_value();
    bad["max_timeout_ms"] = json!(0);
    engine.config_seed("shell", bad);
    assert_eq!(
        caller
            .call("shell::on-config-change", json!({"id": "shell"}))
            .await
            .unwrap(),
        json!({"ok": false})
    );
    let s = status(&caller).await;
    assert_eq!(s["last_outcome"], "rejected");
    assert_eq!(s["rejected_reloads"], 1);
    assert!(
        s["last_error"].as_str().unwrap().contains("max_timeout_ms"),
        "{s}"
    );
    iii_test_engine::schema_check::validate(&resp, &json!({"ok": false})).unwrap();
    iii_test_engine::schema_check::validate(&cs.response_format.unwrap(), &s)
        .expect("status fits its schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_value_is_not_counted_again_on_every_reconnect() {
    let engine = TestEngine::start().await;
    let root = tempfile::tempdir().unwrap();
    let w = Worker::builder()
        .engine(&engine)
        .seed(&jailed(root.path()))
        .start();
    wait_ready(&engine, &w).await;
    let mut bad = jailed_value(root.path());
    bad["denylist_patterns"] = json!(["("]);
    let fanout = engine.config_set("shell", bad).await;
    assert_eq!(
        fanout[0].outcome,
        Some(Ok(json!({"ok": false}))),
        "{fanout:?}"
    );

    for round in 0..2 {
        let before = w.connections(&engine).len();
        engine.drop_connections().await;
        assert!(
            engine
                .wait_until(WAIT, |e| w.connections(e).len() > before
                    && w.connections(e).iter().any(|c| c.connected)
                    && e.function("shell::exec").is_some())
                .await,
            "round {round}: no reconnect; stderr:\n{}",
            w.stderr()
        );
        // Let the post-reconnect resync run (it re-fetches the stored value).
        let gets = |e: &TestEngine| {
            w.info(e)
                .map(|i| calls_to(&i, "configuration::get").len())
                .unwrap_or(0)
        };
        assert!(engine.wait_until(WAIT, |e| gets(e) >= 1).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let caller = engine.client().await;
    let s = status(&caller).await;
    assert_eq!(s["last_outcome"], "rejected", "{s}");
    assert_eq!(
        s["rejected_reloads"],
        1,
        "the same stored value was counted again: {s}; stderr:\n{}",
        w.stderr()
    );
    assert_code(&caller.call("shell::exec", pwd_in("..")).await, "S215");
}

/// The original worker's own end-to-end configuration sets `working_dir: ./data`: it starts,
/// and commands without a `cwd` run in `data` under the worker's start-up directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_working_dir_resolves_against_the_start_up_directory() {
    let engine = TestEngine::start().await;
    let w = Worker::builder()
        .engine(&engine)
        .seed_yaml("fs:\n  allow_unjailed: true\nworking_dir: ./data\n")
        .start();
    wait_ready(&engine, &w).await;
    // The store holds what the operator wrote; the worker resolves it for itself.
    assert_eq!(
        engine.config_get("shell").unwrap()["working_dir"],
        "./data",
        "stored value"
    );
    let data = w.dir().join("data");
    std::fs::create_dir(&data).unwrap();
    let caller = engine.client().await;
    let r = caller
        .call("shell::exec", json!({"command": "pwd"}))
        .await
        .unwrap();
    let want = format!("{}\n", data.canonicalize().unwrap().display());
    assert_eq!(r["stdout"], want, "stderr:\n{}", w.stderr());

    // A reload to another relative directory resolves against the same start-up directory.
    std::fs::create_dir(w.dir().join("other")).unwrap();
    let mut v = unjailed_value();
    v["working_dir"] = json!("other");
    let fanout = engine.config_set("shell", v).await;
    assert_eq!(
        fanout[0].outcome,
        Some(Ok(json!({"ok": true}))),
        "{fanout:?}"
    );
    let r = caller
        .call("shell::exec", json!({"command": "pwd"}))
        .await
        .unwrap();
    let want = format!(
        "{}\n",
        w.dir().join("other").canonicalize().unwrap().display()
    );
    assert_eq!(r["stdout"], want);
}

/// `last_error` describes the last outcome: a reload that applies after a rejected one
/// clears it, while `rejected_reloads` keeps counting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_reload_clears_the_last_error() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = engine.client().await;
    let mut bad = unjailed_value();
    bad["max_timeout_ms"] = json!(0);
    let fanout = engine.config_set("shell", bad).await;
    assert_eq!(
        fanout[0].outcome,
        Some(Ok(json!({"ok": false}))),
        "{fanout:?}"
    );
    let s = status(&caller).await;
    assert_eq!(s["last_outcome"], "rejected", "{s}");
    assert!(
        s["last_error"].as_str().unwrap().contains("max_timeout_ms"),
        "{s}"
    );

    let fanout = engine.config_set("shell", unjailed_value()).await;
    assert_eq!(
        fanout[0].outcome,
        Some(Ok(json!({"ok": true}))),
        "{fanout:?}"
    );
    let s = status(&caller).await;
    assert_eq!(s["last_outcome"], "applied", "{s}");
    assert_eq!(s["last_error"], Value::Null, "{s}; stderr:\n{}", w.stderr());
    assert_eq!(s["rejected_reloads"], 1, "{s}");
}

/// An operator who sends the same bad value twice made two rejected reloads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_bad_value_sent_twice_counts_twice() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = engine.client().await;
    let mut bad = unjailed_value();
    bad["denylist_patterns"] = json!(["("]);
    for n in 1..=2 {
        let fanout = engine.config_set("shell", bad.clone()).await;
        assert_eq!(
            fanout[0].outcome,
            Some(Ok(json!({"ok": false}))),
            "{fanout:?}"
        );
        let s = status(&caller).await;
        assert_eq!(s["last_outcome"], "rejected", "{s}");
        assert_eq!(
            s["rejected_reloads"],
            n,
            "send {n}: {s}; stderr:\n{}",
            w.stderr()
        );
    }
    assert_eq!(
        w.log_lines("configuration reload rejected").len(),
        2,
        "{}",
        w.stderr()
    );
}

/// The walk for protected entries runs after a policy is accepted, and a reload walks again
/// only when it changes the roots, the denylist or the globs: a reload that adds a glob
/// makes the matching file unopenable by commands (and hidden from the fs surface), and a
/// later reload that changes only a limit keeps that carve-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_walks_again_only_when_the_protected_entries_can_change() {
    let engine = TestEngine::start().await;
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("notes.private"), "PRIVATE").unwrap();
    let w = Worker::builder()
        .engine(&engine)
        .seed(&jailed(root.path()))
        .start();
    wait_ready(&engine, &w).await;
    let caller = engine.client().await;
    let cat = json!({"command": "cat", "args": ["notes.private"]});
    let read = json!({"path": "notes.private"});
    let r = caller.call("shell::exec", cat.clone()).await.unwrap();
    assert_eq!(r["stdout"], "PRIVATE", "{r}");

    let mut c = jailed(root.path());
    c.code.non_accessible_globs.push("**/*.private".into());
    let mut limits_only = c.clone();
    limits_only.max_timeout_ms += 1;
    for (step, value) in [("new glob", &c), ("a limit only", &limits_only)] {
        let fanout = engine
            .config_set("shell", serde_json::to_value(value).unwrap())
            .await;
        assert_eq!(
            fanout[0].outcome,
            Some(Ok(json!({"ok": true}))),
            "{step}: {fanout:?}\n{}",
            w.stderr()
        );
        let r = caller.call("shell::exec", cat.clone()).await.unwrap();
        assert_ne!(r["exit_code"], 0, "{step}: {r}");
        assert!(
            r["stderr"]
                .as_str()
                .is_some_and(|e| e.contains("Permission denied")),
            "{step}: {r}"
        );
        assert_code(
            &caller
                .call("shell::workspace::read-bytes", read.clone())
                .await,
            "S211",
        );
    }
}
