//! Edits keep a file's form, and the coder surface's remaining seed points, through the real
//! executor behind the broker library: bytes on disk after `coder::update-file`,
//! `coder::create-file` and `shell::fs::write` (line ends, BOM, no final newline, non-UTF-8),
//! batch entries that fail alone, context lines of near matches, and the exact messages of
//! recovery hints and budgets.

use crate::common;

use std::path::PathBuf;

use common::*;
use iii_shell_protocol::config::Config;
use serde_json::{json, Value};

struct Jailed {
    _jail: Jail,
    root: PathBuf,
    h: Harness,
}

async fn jailed_with(tweak: impl FnOnce(&mut Config)) -> Jailed {
    let jail = Jail::new();
    let mut c = jailed(&jail.root);
    tweak(&mut c);
    let h = Harness::new(c).await;
    Jailed {
        root: jail.root.clone(),
        _jail: jail,
        h,
    }
}

fn result(v: &Value, i: usize) -> &Value {
    &v["results"][i]
}

async fn update(j: &Jailed, path: &str, ops: Value) -> Value {
    let v =
        j.h.ok(
            "coder::update-file",
            json!({"files": [{"path": path, "ops": ops}]}),
        )
        .await;
    result(&v, 0).clone()
}

/// Line ops and replace ops keep the file's line ends: a CRLF file stays CRLF (new lines
/// take CRLF), and in a mixed file each untouched line keeps its own end.
#[tokio::test]
async fn update_file_keeps_line_ends() {
    let j = jailed_with(|_| {}).await;
    let f = j.root.join("crlf.txt");
    std::fs::write(&f, "a\r\nb\r\nc\r\nd\n").unwrap();
    let r = update(
        &j,
        "crlf.txt",
        json!([{"op": "update_lines", "from_line": 2, "to_line": 2, "content": "B\n"}]),
    )
    .await;
    assert_eq!(r["success"], true, "{r}");
    assert_eq!(std::fs::read(&f).unwrap(), b"a\r\nB\r\nc\r\nd\n");
    let r = update(
        &j,
        "crlf.txt",
        json!([
            {"op": "insert", "at_line": 5, "content": "e\nf"},
            {"op": "replace", "pattern": "c.*", "replacement": "c1\nc2"},
        ]),
    )
    .await;
    assert_eq!(r["success"], true, "{r}");
    assert_eq!(
        std::fs::read(&f).unwrap(),
        b"a\r\nB\r\nc1\r\nc2\r\nd\ne\r\nf\r\n"
    );
    assert_eq!(r["new_line_count"], 7);
}

/// A UTF-8 BOM stays first: an insert at line 1 goes after it.
#[tokio::test]
async fn update_file_keeps_the_bom_first() {
    let j = jailed_with(|_| {}).await;
    let f = j.root.join("bom.txt");
    std::fs::write(&f, b"\xEF\xBB\xBFfirst\nsecond\n").unwrap();
    let r = update(
        &j,
        "bom.txt",
        json!([{"op": "insert", "at_line": 1, "content": "zero"}]),
    )
    .await;
    assert_eq!(r["success"], true, "{r}");
    assert_eq!(
        std::fs::read(&f).unwrap(),
        b"\xEF\xBB\xBFzero\nfirst\nsecond\n"
    );
    assert_eq!(r["echoes"][0]["lines"], json!(["zero", "first", "second"]));
}

/// A file that is not UTF-8 is refused by `update-file` (C210 saying so, nothing written),
/// and the call the message names (`shell::fs::sed`) edits it keeping every other byte.
#[tokio::test]
async fn non_utf8_files_are_refused_or_edited_byte_exactly() {
    let j = jailed_with(|_| {}).await;
    let f = j.root.join("latin1.txt");
    let bytes = b"caf\xe9 one\r\nna\xefve two\n".to_vec();
    std::fs::write(&f, &bytes).unwrap();
    let r = update(
        &j,
        "latin1.txt",
        json!([{"op": "replace", "pattern": "one", "replacement": "1"}]),
    )
    .await;
    assert_eq!(r["success"], false);
    assert_eq!(r["error"]["code"], "C210");
    assert_eq!(
        r["error"]["message"],
        "latin1.txt is not UTF-8 text (byte 3 is not valid UTF-8): coder::update-file edits UTF-8 text only, and nothing was written; replace bytes in it with shell::fs::sed, which leaves every other byte as it is"
    );
    assert_eq!(std::fs::read(&f).unwrap(), bytes);
    let v =
        j.h.ok(
            "shell::fs::sed",
            json!({"files": [s(&f)], "pattern": "one", "replacement": "1"}),
        )
        .await;
    assert_eq!(v["total_replacements"], 1, "{v}");
    assert_eq!(std::fs::read(&f).unwrap(), b"caf\xe9 1\r\nna\xefve two\n");
}

/// `coder::create-file` and `shell::fs::write` write the bytes exactly as given: CRLF, a
/// BOM, no final newline.
#[tokio::test]
async fn writes_keep_the_bytes_given() {
    let j = jailed_with(|_| {}).await;
    let body = "\u{feff}one\r\ntwo\nthree";
    let v =
        j.h.ok(
            "coder::create-file",
            json!({"files": [{"path": "c.txt", "content": body}]}),
        )
        .await;
    assert_eq!(result(&v, 0)["success"], true, "{v}");
    assert_eq!(result(&v, 0)["bytes_written"], body.len());
    assert_eq!(
        std::fs::read(j.root.join("c.txt")).unwrap(),
        body.as_bytes()
    );
    let w = j.root.join("w.txt");
    j.h.ok("shell::fs::write", json!({"path": s(&w), "content": body}))
        .await;
    assert_eq!(std::fs::read(&w).unwrap(), body.as_bytes());
}

/// One bad entry of a batch (`line_to` before `line_from`) fails alone, in the seed's
/// per-entry shape; the others are read.
#[tokio::test]
async fn a_bad_batch_entry_fails_alone() {
    let j = jailed_with(|_| {}).await;
    std::fs::write(j.root.join("a"), "a1\na2\n").unwrap();
    let v =
        j.h.ok(
            "coder::read-file",
            json!({"paths": [
                "a",
                {"path": "a", "line_from": 2, "line_to": 1},
                {"path": "a", "stat": true, "numbered": true},
                {"path": "a", "line_from": 2},
            ]}),
        )
        .await;
    let r = v["results"].as_array().unwrap();
    assert_eq!(r.len(), 4);
    assert_eq!(r[0]["content"], "a1\na2\n");
    // The seed's failed-entry shape: `path`, `success: false` and `error`, the rest null.
    let failed = json!({"path": "a", "success": false, "error": {
        "code": "C210",
        "message": "line_to (1) is before line_from (2); pass line_to >= line_from",
    }, "content": null, "size": null, "mode": null, "mtime": null, "lines_returned": null,
       "total_lines": null, "more_lines": null, "is_utf8": null});
    assert_eq!(r[1], failed);
    assert_eq!(r[2]["success"], false);
    assert_eq!(
        r[2]["error"]["message"],
        "stat cannot be combined with a window or numbered"
    );
    assert_eq!(r[3]["content"], "a2\n");
}

/// Context lines follow the seed when matches are near each other: each match has the
/// lines immediately before and after it, a matched line included.
#[tokio::test]
async fn near_matches_each_have_their_context() {
    let j = jailed_with(|_| {}).await;
    std::fs::write(
        j.root.join("t.txt"),
        "one\nhit a\ntwo\nhit b\nthree\nfour\n",
    )
    .unwrap();
    let v =
        j.h.ok(
            "coder::search",
            json!({"query": "hit", "path": "t.txt", "search_paths": false,
                   "context_lines_before": 2, "context_lines_after": 2}),
        )
        .await;
    let ms = v["content_matches"].as_array().unwrap();
    assert_eq!(ms.len(), 2, "{v}");
    assert_eq!(ms[0]["line"], 2);
    assert_eq!(ms[0]["before"], json!(["one"]));
    assert_eq!(ms[0]["after"], json!(["two", "hit b"]));
    assert_eq!(ms[1]["line"], 4);
    assert_eq!(ms[1]["before"], json!(["hit a", "two"]));
    assert_eq!(ms[1]["after"], json!(["three", "four"]));
}

/// Messages carry the real numbers and the caller's own words.
#[tokio::test]
async fn messages_say_the_real_numbers() {
    let j = jailed_with(|c| c.max_output_bytes = 4096).await;
    // 1000 lines of "a\n": 2000 bytes, numbered 2000 + 9*4 + 90*5 + 900*6 + 1*7 bytes.
    let f = j.root.join("n.txt");
    std::fs::write(&f, "a\n".repeat(1000)).unwrap();
    let e = expect_code(
        &j.h,
        "coder::read-file",
        json!({"path": "n.txt", "numbered": true}),
        "C218",
    )
    .await;
    let returned = 2000 + 9 * 4 + 90 * 5 + 900 * 6 + 7;
    assert_eq!(
        e.message,
        format!(
            "n.txt is 2000 bytes (1000 lines); a full read would return {returned} bytes, over the budget of 4096 bytes: read a window (line_from/line_to), probe with stat: true, or raise max_output_bytes (up to max_read_bytes, 16777216)"
        )
    );
    // A bad regex is shown as the caller wrote it.
    let e = expect_code(
        &j.h,
        "coder::search",
        json!({"query": "foo(", "path": ".", "regex": true}),
        "C210",
    )
    .await;
    assert!(
        e.message
            .starts_with("invalid regex: regex parse error:\n    foo(\n"),
        "{e:?}"
    );
    assert!(!e.message.contains("(?:"), "{e:?}");
    // Moving a directory into itself says what is wrong.
    std::fs::create_dir_all(j.root.join("d/sub")).unwrap();
    let v =
        j.h.ok(
            "coder::move",
            json!({"files": [{"from": "d", "to": "d/sub/d"}]}),
        )
        .await;
    let r = result(&v, 0);
    assert_eq!(r["success"], false);
    assert_eq!(r["error"]["code"], "C210");
    assert_eq!(
        r["error"]["message"],
        format!(
            "cannot move the directory d into itself: d/sub/d lies inside it; pick a destination outside {}",
            s(&j.root.join("d"))
        )
    );
    assert!(j.root.join("d/sub").is_dir());
}

/// Recovery hints name a call that works on that file.
#[tokio::test]
async fn recovery_hints_lead_somewhere() {
    let j = jailed_with(|c| {
        c.fs.max_read_bytes = 64;
        c.fs.max_write_bytes = 64;
    })
    .await;
    // A file over max_read_bytes: shell::fs::sed refuses it too, so the hint names a command.
    let big = j.root.join("big.txt");
    std::fs::write(&big, "x".repeat(100)).unwrap();
    let r = update(
        &j,
        "big.txt",
        json!([{"op": "replace", "pattern": "x", "replacement": "y"}]),
    )
    .await;
    assert_eq!(r["error"]["code"], "C218");
    assert_eq!(
        r["error"]["message"],
        "big.txt is 100 bytes, over max_read_bytes (64): no file call edits it (shell::fs::sed has the same limit); change it with a command through shell::exec (for example sed -i), or raise fs.max_read_bytes"
    );
    let v =
        j.h.ok(
            "shell::fs::sed",
            json!({"files": [s(&big)], "pattern": "x", "replacement": "y"}),
        )
        .await;
    assert_eq!(v["total_replacements"], 0, "sed does not edit it: {v}");
    // Content over max_write_bytes: shell::fs::write has the same cap.
    let v =
        j.h.ok(
            "coder::create-file",
            json!({"files": [{"path": "c.txt", "content": "z".repeat(65)}]}),
        )
        .await;
    assert_eq!(
        result(&v, 0)["error"]["message"],
        "content is 65 bytes, over max_write_bytes (64): no file call writes a file that large (shell::fs::write has the same limit); split it into smaller files, write it with a command through shell::exec, or raise fs.max_write_bytes"
    );
    // A window over a line longer than max_read_bytes: C218 naming read-bytes and the offset,
    // and that call returns the line.
    std::fs::write(&big, format!("ab\n{}\n", "x".repeat(100))).unwrap();
    let e = expect_code(
        &j.h,
        "coder::read-file",
        json!({"path": "big.txt", "line_from": 2}),
        "C218",
    )
    .await;
    assert_eq!(
        e.message,
        "line 2 of big.txt is longer than a window can return (max_read_bytes, 64): read its bytes with shell::workspace::read-bytes (the line starts at offset 3)"
    );
    let v =
        j.h.ok(
            "shell::workspace::read-bytes",
            json!({"path": "big.txt", "offset": 3, "length": 101}),
        )
        .await;
    assert_eq!(v["length"], 101, "{v}");
    // The same line as a batch entry.
    let v =
        j.h.ok(
            "coder::read-file",
            json!({"paths": [{"path": "big.txt", "line_from": 2}]}),
        )
        .await;
    assert_eq!(result(&v, 0)["error"]["code"], "C218", "{v}");
}

/// A path resolving inside any root is accepted: a symlink in one root leading into another,
/// and a root configured (and named) through a symlink. A path resolving outside every root
/// stays C215, and a denied path reached through a link reads exactly like a missing one.
#[tokio::test]
async fn links_between_roots_and_roots_named_through_links() {
    let jail = Jail::new();
    let second = jail.base.join("second");
    std::fs::create_dir_all(&second).unwrap();
    std::fs::write(second.join("f.txt"), "in second\n").unwrap();
    std::fs::write(second.join("hidden.txt"), "denied\n").unwrap();
    let alias = jail.base.join("alias");
    std::os::unix::fs::symlink(&second, &alias).unwrap();
    std::os::unix::fs::symlink(&second, jail.root.join("to-second")).unwrap();
    std::os::unix::fs::symlink(&jail.outside, jail.root.join("to-outside")).unwrap();
    let mut c = jailed(&jail.root);
    c.fs.host_roots.push(s(&alias));
    c.fs.denylist_paths.push(s(&second.join("hidden.txt")));
    let h = Harness::new(c).await;
    let v = h
        .ok("coder::read-file", json!({"path": "to-second/f.txt"}))
        .await;
    assert_eq!(v["content"], "in second\n");
    assert_eq!(v["path"], s(&second.join("f.txt")));
    let alias_f = s(&alias.join("f.txt"));
    let v = h.ok("coder::read-file", json!({"path": alias_f})).await;
    assert_eq!(v["content"], "in second\n");
    // Writes too: through the link, and through the root's own spelling.
    let v = h
        .ok(
            "coder::update-file",
            json!({"files": [{"path": "to-second/f.txt", "ops": [
                {"op": "insert", "at_line": 2, "content": "more"}]}]}),
        )
        .await;
    assert_eq!(result(&v, 0)["success"], true, "{v}");
    let v = h
        .ok(
            "coder::create-file",
            json!({"files": [{"path": s(&alias.join("new.txt")), "content": "n"}]}),
        )
        .await;
    assert_eq!(result(&v, 0)["path"], s(&second.join("new.txt")), "{v}");
    assert_eq!(
        std::fs::read_to_string(second.join("f.txt")).unwrap(),
        "in second\nmore\n"
    );
    // Outside every root: C215 as before. Denied and missing read alike.
    expect_code(
        &h,
        "coder::read-file",
        json!({"path": "to-outside/secret.txt"}),
        "C215",
    )
    .await;
    let denied = expect_code(
        &h,
        "coder::read-file",
        json!({"path": "to-second/hidden.txt"}),
        "C211",
    )
    .await;
    let missing = expect_code(
        &h,
        "coder::read-file",
        json!({"path": "to-second/nothing.txt"}),
        "C211",
    )
    .await;
    assert_eq!(
        denied.message.replace("hidden", "X"),
        missing.message.replace("nothing", "X")
    );
}
