//! Items of the seed checklist that the worker once answered differently from the contract,
//! each checked through the real executor process: a no-argument function ignores its
//! payload (GEN-04), `duration_ms` runs from spawn to exit (EXEC-13), `stat` of a link
//! describes its target (FS-05), and `grep` skips a line longer than `max_line_bytes`
//! (FS-17).

use crate::common;

use std::time::Instant;

use common::*;
use serde_json::{json, Value};

/// GEN-04: the functions that take no arguments answer whatever payload they are sent (the
/// engine may add fields, a caller may send a non-object); `coder::info` is not C210.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_argument_functions_ignore_their_payload() {
    let j = Jail::new();
    let h = Harness::new(j.config()).await;
    for function in [
        "coder::info",
        "shell::list",
        "shell::config-status",
        "shell::pty::sessions",
        "shell::workspace::roots",
    ] {
        let want = h.ok(function, json!({})).await;
        for payload in [
            json!("text"),
            json!([1, 2]),
            json!(7),
            json!(null),
            json!({"_caller_worker_id": "w", "anything": [1]}),
        ] {
            let got = h.ok(function, payload.clone()).await;
            if function != "shell::config-status" {
                assert_eq!(got, want, "{function} {payload}");
            }
        }
    }
}

/// EXEC-13: `duration_ms` is the time from spawn to the root's exit. A grandchild that keeps
/// the output pipes open makes the call wait up to the drain grace (2 s) for its output, but
/// that wait is not the command's duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_ms_ends_at_the_roots_exit_not_after_the_drain() {
    let h = Harness::default().await;
    let started = Instant::now();
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", "sleep 30 & echo started; exit 0"]}),
        )
        .await;
    let call_ms = started.elapsed().as_millis() as u64;
    assert_eq!(
        (r["exit_code"].clone(), r["timed_out"].clone()),
        (json!(0), json!(false)),
        "{r}"
    );
    assert_eq!(r["stdout"], "started\n");
    let ms = r["duration_ms"].as_u64().unwrap();
    // The call itself waited out the drain grace for the sleeping grandchild's pipes…
    assert!(call_ms >= 2000, "the call took {call_ms} ms: {r}");
    // …and duration_ms does not count that wait.
    assert!(
        ms + 2000 <= call_ms,
        "duration_ms {ms} includes the drain wait (call took {call_ms} ms)"
    );
}

/// FS-05: `stat` of a link reports `is_symlink` for the link itself and `is_dir`, `size`,
/// `mode` of its target, jailed (a target inside the jail) and unjailed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stat_of_a_link_describes_its_target() {
    let j = Jail::new();
    let root = &j.root;
    std::fs::write(root.join("five.txt"), "12345").unwrap();
    std::fs::create_dir(root.join("dir")).unwrap();
    std::os::unix::fs::symlink("five.txt", root.join("to-file")).unwrap();
    std::os::unix::fs::symlink("dir", root.join("to-dir")).unwrap();
    let check = |st: Value, is_dir: bool, size: Option<u64>| {
        assert_eq!(st["is_symlink"], true, "{st}");
        assert_eq!(st["is_dir"], is_dir, "{st}");
        if let Some(size) = size {
            assert_eq!(st["size"], size, "{st}");
        }
    };
    let dir_size = std::fs::metadata(root.join("dir")).unwrap().len();
    let jailed_h = Harness::new(j.config()).await;
    for (p, is_dir, size) in [("to-file", false, 5), ("to-dir", true, dir_size)] {
        check(
            jailed_h.ok("shell::fs::stat", json!({"path": p})).await,
            is_dir,
            Some(size),
        );
    }
    drop(jailed_h);
    let unjailed = Harness::default().await;
    for (p, is_dir, size) in [("to-file", false, 5), ("to-dir", true, dir_size)] {
        let path = s(&root.join(p));
        check(
            unjailed.ok("shell::fs::stat", json!({"path": path})).await,
            is_dir,
            Some(size),
        );
    }
}

/// FS-17: a matching line longer than `max_line_bytes` is skipped, not cut, and marks the
/// reply `truncated`; a line of exactly `max_line_bytes` is returned whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_skips_lines_longer_than_max_line_bytes() {
    let j = Jail::new();
    let h = Harness::new(j.config()).await;
    let long = format!("needle {}", "x".repeat(100));
    let exact = format!("needle {}", "y".repeat(13));
    assert_eq!(exact.len(), 20);
    std::fs::write(j.root.join("f.txt"), format!("{long}\n{exact}\nneedle\n")).unwrap();
    let r = h
        .ok(
            "shell::fs::grep",
            json!({"path": "f.txt", "pattern": "needle", "max_line_bytes": 20}),
        )
        .await;
    let path = s(&j.root.join("f.txt"));
    assert_eq!(
        r,
        json!({"matches": [
            {"path": path, "line": 2, "content": exact},
            {"path": path, "line": 3, "content": "needle"},
        ], "truncated": true}),
    );
    // Only the long line matches: nothing is returned, and the reply says a line was skipped.
    let r = h
        .ok(
            "shell::fs::grep",
            json!({"path": ".", "pattern": "x{100}", "max_line_bytes": 20}),
        )
        .await;
    assert_eq!(r, json!({"matches": [], "truncated": true}));
    // Under the cap nothing is skipped.
    let r = h
        .ok(
            "shell::fs::grep",
            json!({"path": ".", "pattern": "x{100}", "max_line_bytes": 1000}),
        )
        .await;
    assert_eq!(r["matches"][0]["content"], long.as_str());
    assert_eq!(r["truncated"], false);
}
