//! Quick end-to-end: `iii-shell serve` against the test engine.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use iii_test_engine::TestEngine;
use serde_json::json;

struct Worker(Child);
impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_registers_and_executes() {
    let engine = TestEngine::start().await;
    let dir = tempfile::tempdir().unwrap();
    let _w = Worker(
        Command::new(env!("CARGO_BIN_EXE_iii-shell"))
            .arg("--config")
            .arg(dir.path().join("missing.yaml"))
            .env("III_URL", engine.url())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(engine
        .wait_for_function("shell::exec", Duration::from_secs(10))
        .await
        .is_some());
    let client = engine.client().await;
    let r = client
        .call("shell::exec", json!({"command": "echo", "args": ["hi"]}))
        .await
        .unwrap();
    assert_eq!(r["stdout"], "hi\n");
    let s = client
        .call("shell::config-status", json!({}))
        .await
        .unwrap();
    assert_eq!(s["last_outcome"], "applied");
}
