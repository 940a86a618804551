//! Every error says what happened and what to do: the messages that used to leave a caller guessing, each through the
//! real broker and a real executor (or the real binary).

use crate::common;

use common::Harness;
use iii_shell_protocol::config::Config;
use serde_json::json;

const SANDBOX: &str = "6f1c9a52-7d0e-4c1b-9a44-2b7f3e0d5c11";

#[tokio::test]
async fn max_concurrent_jobs_zero_says_background_jobs_are_disabled() {
    let mut c = Config::builtin_default();
    c.max_concurrent_jobs = 0;
    let h = Harness::new(c).await;
    let e = h.err("shell::exec_bg", json!({"command": "true"})).await;
    assert_eq!(e.code, "invocation_failed", "{e:?}");
    assert!(
        e.message
            .starts_with("background jobs are disabled (max_concurrent_jobs: 0)"),
        "{e:?}"
    );
    assert!(e.message.contains("raise max_concurrent_jobs"), "{e:?}");
}

/// Without an engine (`iii-shell call`), a sandbox `exec_bg` cannot run: S216 as a code, as
/// every other sandbox call answers, not `invocation_failed` with "S216" in its message.
#[tokio::test]
async fn a_sandbox_exec_bg_without_an_engine_is_s216() {
    let h = Harness::default().await;
    let e = h
        .err(
            "shell::exec_bg",
            json!({"command": "ls", "target": {"kind": "sandbox", "sandbox_id": SANDBOX}}),
        )
        .await;
    assert_eq!(e.code, "S216", "{e:?}");
    assert!(e.message.contains("needs an engine"), "{e:?}");
    assert!(!e.message.starts_with("S216"), "{e:?}");
}

/// Without an engine, `shell::fs::read` still checks the path first: a missing, denied or
/// wrong-type path gets its own code; only a readable file is told it needs an engine.
#[tokio::test]
async fn fs_read_without_an_engine_checks_the_path_first() {
    let dir = common::tempdir();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("f.txt"), "x").unwrap();
    std::fs::write(root.join(".env"), "SECRET=1").unwrap();
    let h = Harness::new(common::jailed(&root)).await;
    for (path, code) in [
        ("missing.txt", "S211"),
        (".env", "S211"),
        ("../outside", "S215"),
        (".", "S212"),
    ] {
        let e = h.err("shell::fs::read", json!({"path": path})).await;
        assert_eq!(e.code, code, "{path}: {e:?}");
    }
    let e = h.err("shell::fs::read", json!({"path": "f.txt"})).await;
    assert_eq!(e.code, "S216", "{e:?}");
    assert!(e.message.contains("needs an engine"), "{e:?}");
}

/// An IPv6 engine URL is printed as a URL authority: `[::1]:port`, not `::1:port`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_engine_url_is_printed_with_brackets() {
    let port = common::free_port();
    let w = common::Worker::builder()
        .env("III_URL", &format!("ws://[::1]:{port}"))
        .start();
    let want = format!("engine unreachable at [::1]:{port}");
    w.expect_log(&want).await;
    assert!(
        w.log_lines(&format!("::1:{port} "))
            .iter()
            .all(|l| l.contains('[')),
        "{}",
        w.stderr()
    );
}
