//! `coder::*` end to end: `iii-shell serve` against the test engine, with a second engine
//! connection as the caller. Registration (ids, metadata flags, schemas), a read/edit round
//! trip, C-codes as a caller sees them, and `fs_scope` stamped in the invocation metadata.

use crate::common;

use std::path::PathBuf;

use common::*;
use iii_shell_protocol::config::Config;
use iii_test_engine::TestEngine;
use serde_json::json;

#[tokio::test]
async fn coder_through_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let root: PathBuf = std::fs::canonicalize(dir.path()).unwrap().join("root");
    std::fs::create_dir_all(root.join("proj/src")).unwrap();
    std::fs::write(root.join("proj/src/lib.rs"), "pub fn a() {}\n").unwrap();
    std::fs::write(root.join("top.txt"), "top\n").unwrap();
    let config: Config = jailed(&root);
    let engine = TestEngine::start().await;
    let worker = Worker::builder().engine(&engine).seed(&config).start();
    wait_ready(&engine, &worker).await;
    assert!(
        engine
            .wait_for_function("coder::change-diff", WAIT)
            .await
            .is_some(),
        "{}",
        worker.stderr()
    );
    // All ten, with the seed's metadata flags.
    for (id, meta) in [
        ("coder::info", json!({})),
        ("coder::read-file", json!({})),
        ("coder::search", json!({})),
        ("coder::list-folder", json!({})),
        ("coder::tree", json!({})),
        ("coder::create-file", json!({"display": true})),
        ("coder::update-file", json!({"display": true})),
        ("coder::delete-file", json!({"display": true})),
        ("coder::move", json!({})),
        ("coder::change-diff", json!({"internal": true})),
    ] {
        let f = engine
            .function(id)
            .unwrap_or_else(|| panic!("{id} not registered"));
        assert_eq!(f.metadata.unwrap_or(json!({})), meta, "{id}");
        assert!(
            f.request_format.is_some() && f.response_format.is_some(),
            "{id}"
        );
    }
    let caller = engine.client().await;
    let info = caller.call("coder::info", json!({})).await.unwrap();
    assert_eq!(info["mode"], "jailed");
    assert_eq!(info["primary_root"], s(&root));

    let r = caller
        .call("coder::read-file", json!({"path": "proj/src/lib.rs"}))
        .await
        .unwrap();
    assert_eq!(r["content"], "pub fn a() {}\n");
    let rev = r["revision"].clone();
    let w = caller
        .call(
            "coder::create-file",
            json!({"files": [{"path": "proj/src/lib.rs", "content": "pub fn b() {}\n", "expected_revision": rev}]}),
        )
        .await
        .unwrap();
    assert_eq!(w["results"][0]["success"], true, "{w}");
    let u = caller
        .call(
            "coder::update-file",
            json!({"files": [{"path": "proj/src/lib.rs", "ops": [{"op": "replace", "pattern": "fn b", "replacement": "fn c", "expect_matches": 1}]}]}),
        )
        .await
        .unwrap();
    assert_eq!(u["results"][0]["success"], true, "{u}");
    assert_eq!(
        std::fs::read_to_string(root.join("proj/src/lib.rs")).unwrap(),
        "pub fn c() {}\n"
    );

    // Codes at the top level, as a caller sees them.
    let e = caller
        .call("coder::read-file", json!({"path": "../x"}))
        .await
        .unwrap_err();
    assert_eq!(e.code, "C215");
    let e = caller
        .call("coder::read-file", json!({"path": "nope"}))
        .await
        .unwrap_err();
    assert_eq!(e.code, "C211");
    assert_eq!(e.message, "path not found or not accessible: nope");
    let e = caller
        .call("coder::read-file", json!({}))
        .await
        .unwrap_err();
    assert_eq!(e.code, "C210");

    // A harness scope in the invocation metadata.
    let scope = json!({"fs_scope": {"scope_root": s(&root.join("proj")), "session_root": s(&root.join("proj/src"))}});
    let r = caller
        .call_with_metadata("coder::read-file", json!({"path": "lib.rs"}), scope.clone())
        .await
        .unwrap();
    assert_eq!(r["path"], s(&root.join("proj/src/lib.rs")));
    let e = caller
        .call_with_metadata("coder::read-file", json!({"path": "../../top.txt"}), scope)
        .await
        .unwrap_err();
    assert_eq!(e.code, "C220");
}
