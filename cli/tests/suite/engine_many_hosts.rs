//! Many hosts on one engine: one worker per host, each with its own `III_WORKER_NAME`,
//! `III_NAMESPACE`, jail and configuration entry. A caller reaches each host by namespace,
//! and no call lands on another host's files.

use crate::common;

use std::path::PathBuf;

use common::*;
use iii_test_engine::TestEngine;
use serde_json::{json, Value};

/// One host: its namespace, the configuration id it must use, its jail root.
struct Host {
    namespace: &'static str,
    config_id: &'static str,
    explicit_id: bool,
    root: tempfile::TempDir,
}

impl Host {
    fn new(namespace: &'static str, config_id: &'static str, explicit_id: bool) -> Host {
        let root = tempfile::tempdir().unwrap();
        // A file whose content names the host, at the same relative path on every host.
        std::fs::write(root.path().join("whoami.txt"), namespace).unwrap();
        Host {
            namespace,
            config_id,
            explicit_id,
            root,
        }
    }

    fn root(&self) -> PathBuf {
        self.root.path().canonicalize().unwrap()
    }

    fn start(&self, engine: &TestEngine) -> Worker {
        let mut b = Worker::builder()
            .engine(engine)
            .env("III_WORKER_NAME", &format!("shell-{}", self.namespace))
            .env("III_NAMESPACE", self.namespace)
            .seed(&jailed(&self.root()));
        if self.explicit_id {
            b = b.arg("--config-id").arg(self.config_id);
        }
        b.start()
    }
}

fn pwd_of(v: &Value) -> String {
    v["stdout"]
        .as_str()
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_namespaced_workers_each_serve_their_own_host() {
    let engine = TestEngine::start().await;
    let hosts = [
        Host::new("host-a", "shell-host-a", false),
        Host::new("host-b", "shell-host-b", false),
        // An explicit --config-id wins over the namespace.
        Host::new("host-c", "edge-c", true),
    ];
    let workers: Vec<Worker> = hosts.iter().map(|h| h.start(&engine)).collect();
    for (h, w) in hosts.iter().zip(&workers) {
        let ready = engine
            .wait_until(WAIT, |e| {
                e.function_in(h.namespace, "shell::exec").is_some()
                    && e.triggers().iter().any(|t| {
                        t.trigger_type == "configuration"
                            && t.config["configuration_id"] == h.config_id
                    })
            })
            .await;
        assert!(
            ready,
            "{} never got ready; stderr:\n{}",
            h.namespace,
            w.stderr()
        );
        w.expect_log(&format!(
            "this worker's configuration id is '{}'",
            h.config_id
        ))
        .await;
    }
    // Each seed went to its own entry; nobody used (or overwrote) `shell`.
    assert_eq!(engine.config_get("shell"), None);
    for h in &hosts {
        let stored = engine
            .config_get(h.config_id)
            .unwrap_or_else(|| panic!("no entry {}", h.config_id));
        assert_eq!(
            stored["fs"]["host_roots"],
            json!([h.root().display().to_string()]),
            "{}",
            h.config_id
        );
    }
    assert!(
        engine.function("shell::exec").is_none(),
        "nothing in default"
    );

    // 30 calls, round-robin: every one answered by the host its namespace names.
    let caller = engine.client().await;
    for i in 0..30 {
        let h = &hosts[i % 3];
        let r = caller
            .call_in_namespace(
                h.namespace,
                "shell::exec",
                json!({"command": "cat", "args": ["whoami.txt"], "cwd": "."}),
            )
            .await
            .unwrap_or_else(|e| panic!("call {i} to {}: {e:?}", h.namespace));
        assert_eq!(
            r["stdout"], h.namespace,
            "call {i} landed on the wrong host"
        );
        let r = caller
            .call_in_namespace(
                h.namespace,
                "shell::exec",
                json!({"command": "pwd", "cwd": "."}),
            )
            .await
            .unwrap();
        assert_eq!(pwd_of(&r), h.root().display().to_string(), "call {i}");
    }
    // Another host's root is outside this host's jail.
    let r = caller
        .call_in_namespace(
            "host-a",
            "shell::exec",
            json!({"command": "pwd", "cwd": hosts[1].root().display().to_string()}),
        )
        .await;
    assert_code(&r, "S215");

    // config-status names the id in use, per host.
    for h in &hosts {
        let s = caller
            .call_in_namespace(h.namespace, "shell::config-status", json!({}))
            .await
            .unwrap();
        assert_eq!(s["config_id"], h.config_id, "{s}");
        assert_eq!(s["last_outcome"], "applied", "{s}");
    }

    // A reload of one host's entry changes that host only.
    let moved = tempfile::tempdir().unwrap();
    let moved_root = moved.path().canonicalize().unwrap();
    let fanout = engine
        .config_set("shell-host-b", jailed_value(&moved_root))
        .await;
    assert_eq!(fanout.len(), 1, "only host-b's binding fires: {fanout:?}");
    assert_eq!(
        fanout[0].outcome,
        Some(Ok(json!({"ok": true}))),
        "{fanout:?}"
    );
    for h in &hosts {
        let r = caller
            .call_in_namespace(
                h.namespace,
                "shell::exec",
                json!({"command": "pwd", "cwd": "."}),
            )
            .await
            .unwrap();
        let want = if h.namespace == "host-b" {
            moved_root.clone()
        } else {
            h.root()
        };
        assert_eq!(pwd_of(&r), want.display().to_string(), "{}", h.namespace);
    }
    drop(workers);
}

/// A worker alone keeps the seed's contract: the id `shell`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_alone_keeps_the_id_shell() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    w.expect_log("this worker's configuration id is 'shell'")
        .await;
    assert!(engine.config_get("shell").is_some());
    let caller = engine.client().await;
    let s = caller
        .call("shell::config-status", json!({}))
        .await
        .unwrap();
    assert_eq!(s["config_id"], "shell", "{s}");
}

/// A namespace that cannot make an id refuses to start with what to do, rather than
/// sharing (or guessing) an entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_that_makes_no_id_asks_for_config_id() {
    let engine = TestEngine::start().await;
    let mut w = Worker::builder()
        .engine(&engine)
        .env("III_NAMESPACE", "Tenant.A")
        .start();
    let status = w.wait_exit(WAIT).await;
    assert!(
        status.is_some_and(|s| !s.success()),
        "{status:?}; stderr:\n{}",
        w.stderr()
    );
    let err = w.stderr();
    assert!(err.contains("pass --config-id ID"), "{err}");
    assert!(shell_functions(&engine).is_empty());
}
