//! `iii worker add` compatibility: the binary started exactly the way the engine's launchers
//! start a binary worker, against the test engine.
//!
//! The binary launcher (`iii worker add` / `iii-worker start`) runs the worker binary with
//! `--config <file>` only when the worker's entry has a config block (the block written as
//! YAML to a file of mode 0600), sets `III_WORKER_NAME` to the entry's name and `III_URL` and
//! `III_ENGINE_URL` to the engine, puts it in a session of its own, and leaves its working
//! directory as its own: the project directory, whose `config.yaml` is the *engine's*.
//! A compose launcher sets `III_NAMESPACE`, and passes the config block's file as
//! `III_CONFIG` instead of `--config`.

use crate::common;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use common::*;
use iii_shell_protocol::config::Config;
use iii_test_engine::TestEngine;
use serde_json::{json, Value};

const MANIFEST: &str = include_str!("../../../iii.worker.yaml");

/// A project directory as the engine leaves it: its own `config.yaml` (which is not ours to
/// read) listing the worker, with or without a config block.
fn project_dir(block: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut engine_config = String::from("workers:\n  - name: shell\n");
    if let Some(block) = block {
        engine_config.push_str("    config:\n");
        for line in block.lines() {
            engine_config.push_str("      ");
            engine_config.push_str(line);
            engine_config.push('\n');
        }
    }
    std::fs::write(dir.path().join("config.yaml"), engine_config).unwrap();
    dir
}

/// The config block as the engine hands it over: a YAML file only its owner may read.
fn block_file(dir: &Path, block: &str) -> PathBuf {
    let path = dir.join("iii-shell-config.yaml");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut f, block.as_bytes()).unwrap();
    path
}

/// The binary launcher's environment for `name` on `engine`.
fn launched(engine: &TestEngine, name: &str, project: &Path) -> WorkerBuilder {
    Worker::builder()
        .without_subcommand()
        .without_config_flag()
        .current_dir(project)
        .setsid()
        .env("III_WORKER_NAME", name)
        .env("III_URL", &engine.url())
        .env("III_ENGINE_URL", &engine.url())
        .env("III_ENGINE_PID", &std::process::id().to_string())
}

async fn wait_functions(engine: &TestEngine, w: &Worker, namespace: Option<&str>) {
    let ok = engine
        .wait_until(WAIT, |e| match namespace {
            Some(ns) => e.function_in(ns, "shell::exec").is_some(),
            None => e.function("shell::exec").is_some(),
        })
        .await;
    assert!(
        ok,
        "shell::exec was never registered; stderr:\n{}",
        w.stderr()
    );
}

fn value_of(yaml: &str) -> Value {
    serde_json::to_value(Config::from_yaml(yaml).expect("block parses")).unwrap()
}

#[test]
fn the_manifest_names_the_worker_and_uses_only_keys_the_launcher_knows() {
    let m: serde_norway::Value = serde_norway::from_str(MANIFEST).expect("iii.worker.yaml parses");
    let m = m.as_mapping().expect("a mapping");
    // The keys the engine's manifest reference documents (docs/creating-workers/
    // worker-manifest.mdx); anything else is refused by `iii worker add`.
    let known = [
        "iii",
        "name",
        "description",
        "runtime",
        "scripts",
        "env",
        "dependencies",
        "resources",
        "deploy",
        "manifest",
        "tags",
    ];
    for k in m.keys() {
        let k = k.as_str().expect("string keys");
        assert!(known.contains(&k), "unknown manifest key {k:?}");
    }
    assert_eq!(
        m["name"].as_str(),
        Some("shell"),
        "the default III_WORKER_NAME"
    );
    assert_eq!(m["iii"].as_str(), Some("v1"));
    assert_eq!(m["deploy"].as_str(), Some("binary"));
    let scripts = m["scripts"].as_mapping().expect("scripts");
    for k in scripts.keys() {
        let k = k.as_str().unwrap();
        assert!(["setup", "install", "start"].contains(&k), "scripts.{k}");
    }
    // The start script runs the worker with no subcommand and no flags: the launcher adds
    // --config when there is a config block, and everything else comes from the environment.
    assert_eq!(
        scripts["start"].as_str(),
        Some("./target/release/iii-shell")
    );
    let env = m["env"].as_mapping().expect("env");
    for k in env.keys() {
        let k = k.as_str().unwrap();
        assert!(
            !["III_URL", "III_ENGINE_URL", "III_WORKER_NAME"].contains(&k),
            "the launcher owns {k}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launched_without_a_config_block_it_reads_no_file_and_seeds_the_builtin_default() {
    let engine = TestEngine::start().await;
    // The project's config.yaml is the engine's: reading it as ours would refuse to start
    // (`workers` is not one of our keys).
    let project = project_dir(None);
    let w = launched(&engine, "shell", project.path()).start();
    wait_functions(&engine, &w, None).await;
    let info = w.info(&engine).expect("connected");
    assert_eq!(info.name.as_deref(), Some("shell"));
    assert_eq!(engine.config_get("shell"), Some(shipped_value()));
    let caller = engine.client().await;
    let r = caller
        .call("shell::exec", json!({"command": "pwd"}))
        .await
        .expect("exec");
    assert_eq!(
        r["stdout"].as_str().map(str::trim_end),
        Some(
            std::fs::canonicalize(project.path())
                .unwrap()
                .to_str()
                .unwrap()
        ),
        "commands run in the launcher's directory"
    );
    assert!(
        w.log_lines("refusing to start").is_empty(),
        "{}",
        w.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launched_with_a_config_block_it_seeds_the_block() {
    let engine = TestEngine::start().await;
    let block = "fs:\n  allow_unjailed: true\nmax_output_bytes: 4242\ndefault_timeout_ms: 7777\n";
    let project = project_dir(Some(block));
    let file = block_file(project.path(), block);
    let w = launched(&engine, "shell-launched", project.path())
        .arg("--config")
        .arg(file.to_str().unwrap())
        .start();
    wait_functions(&engine, &w, None).await;
    let info = w.info(&engine).expect("connected");
    assert_eq!(info.name.as_deref(), Some("shell-launched"));
    assert_eq!(engine.config_get("shell"), Some(value_of(block)));
    let caller = engine.client().await;
    let r = caller
        .call(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", "yes | head -c 5000"]}),
        )
        .await
        .expect("exec");
    assert_eq!(r["stdout_truncated"], true, "{r}");
    assert_eq!(r["stdout"].as_str().map(str::len), Some(4242));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launched_by_compose_it_takes_the_namespace_and_the_config_from_the_environment() {
    let engine = TestEngine::start().await;
    let block = "fs:\n  allow_unjailed: true\nmax_output_bytes: 4343\n";
    let project = project_dir(None);
    let file = block_file(project.path(), block);
    let w = launched(&engine, "shell-c", project.path())
        .env("III_NAMESPACE", "orders-1")
        .env("III_CONFIG", file.to_str().unwrap())
        .start();
    wait_functions(&engine, &w, Some("orders-1")).await;
    let info = w.info(&engine).expect("connected");
    assert_eq!(info.name.as_deref(), Some("shell-c"));
    assert_eq!(info.namespace.as_deref(), Some("orders-1"));
    assert!(
        engine.function("shell::exec").is_none(),
        "nothing in default"
    );
    let caller = engine.client().await;
    let r = caller
        .call_in_namespace(
            "orders-1",
            "shell::exec",
            json!({"command": "sh", "args": ["-c", "yes | head -c 5000"]}),
        )
        .await
        .expect("exec");
    assert_eq!(r["stdout"].as_str().map(str::len), Some(4343), "{r}");
}
