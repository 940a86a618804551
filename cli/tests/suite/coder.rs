//! `coder::*` through the real executor process behind the broker library (the same path an
//! engine call takes after the WebSocket): path policy and redaction, every error code, the
//! wire shapes of every function, budgets, windows, revisions, edits, trees and search.
//! `coder_engine.rs` repeats the essentials through `iii-shell serve` and the test engine.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::*;
use iii_shell_protocol::config::Config;
use serde_json::{json, Value};

/// A [`Jail`] with a harness jailed to its root.
struct Jailed {
    _jail: Jail,
    root: PathBuf,
    outside: PathBuf,
    h: Harness,
}

async fn jailed_with(tweak: impl FnOnce(&mut Config, &Path)) -> Jailed {
    let jail = Jail::new();
    let mut c = jailed(&jail.root);
    tweak(&mut c, &jail.root);
    let h = Harness::new(c).await;
    Jailed {
        root: jail.root.clone(),
        outside: jail.outside.clone(),
        _jail: jail,
        h,
    }
}

async fn jailed_root() -> Jailed {
    jailed_with(|_, _| {}).await
}

// ---------------------------------------------------------------------------------------------
// coder::info
// ---------------------------------------------------------------------------------------------

/// CODER-02, CODER-11..14: jailed info reports the canonical roots, caps, budgets and globs.
#[tokio::test]
async fn info_reports_the_jailed_contract() {
    let j = jailed_with(|c, root| {
        let second = root.parent().unwrap().join("outside");
        c.fs.host_roots.push(s(&second));
        c.fs.max_read_bytes = 1234;
        c.fs.max_write_bytes = 5678;
        c.max_output_bytes = 999;
    })
    .await;
    let v = j.h.ok("coder::info", json!({})).await;
    assert_eq!(v["mode"], "jailed");
    assert_eq!(v["base_paths"], json!([s(&j.root), s(&j.outside)]));
    assert_eq!(v["primary_root"], s(&j.root));
    assert_eq!(v["session_root"], Value::Null);
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["max_read_bytes"], 1234);
    assert_eq!(v["max_write_bytes"], 5678);
    assert_eq!(v["max_output_bytes"], 999);
    assert_eq!(v["batch_read_budget_bytes"], 262144);
    assert_eq!(v["list_default_page_size"], 200);
    assert_eq!(v["list_max_page_size"], 1000);
    assert_eq!(v["search_default_max_matches"], 200);
    assert_eq!(v["search_default_max_line_bytes"], 512);
    assert_eq!(v["search_response_budget_bytes"], 65536);
    assert_eq!(v["tree_default_depth"], 3);
    assert_eq!(v["tree_per_folder_limit"], 100);
    let c = Config::builtin_default();
    assert_eq!(
        v["non_accessible_globs"],
        json!(c.code.non_accessible_globs)
    );
    assert_eq!(
        v["default_exclude_globs"],
        json!(c.code.default_exclude_globs)
    );
}

/// CODER-03: unjailed, the fallback roots (the executor's cwd, then /tmp) anchor relative
/// paths, and absolute paths are accepted anywhere.
#[tokio::test]
async fn info_and_paths_when_unjailed() {
    let h = Harness::default().await;
    let v = h.ok("coder::info", json!({})).await;
    assert_eq!(v["mode"], "unjailed");
    let cwd = canon(&std::env::current_dir().unwrap());
    let mut expect = vec![s(&cwd)];
    if cwd != Path::new("/tmp") {
        expect.push("/tmp".to_string());
    }
    assert_eq!(v["base_paths"], json!(expect));
    assert_eq!(v["primary_root"], s(&cwd));

    // An absolute path anywhere on the host.
    let dir = tempdir();
    let f = canon(dir.path()).join("a.txt");
    std::fs::write(&f, "x\n").unwrap();
    let r = h.ok("coder::read-file", json!({"path": s(&f)})).await;
    assert_eq!(r["content"], "x\n");
    assert_eq!(r["path"], s(&f));
    // A relative path anchors on the executor's cwd (this test's cwd: the crate dir).
    let r = h
        .ok(
            "coder::read-file",
            json!({"path": "Cargo.toml", "stat": true}),
        )
        .await;
    assert_eq!(r["path"], s(&cwd.join("Cargo.toml")));
    // The denylist still applies, with the wording of a missing path.
    let e = expect_code(
        &h,
        "coder::read-file",
        json!({"path": "/etc/shadow"}),
        "C211",
    )
    .await;
    let m = expect_code(
        &h,
        "coder::read-file",
        json!({"path": "/etc/no-such-x"}),
        "C211",
    )
    .await;
    assert_eq!(
        e.message.replace("/etc/shadow", "P"),
        m.message.replace("/etc/no-such-x", "P")
    );
}

// ---------------------------------------------------------------------------------------------
// Path policy (CODER-01, 04, 05, 07, 08, SEC-14..18)
// ---------------------------------------------------------------------------------------------

/// CODER-05, 07, 08 / SEC-18: denied (denylist, non_accessible glob, permission) and missing
/// paths give the same code and the same message (the input echoed), on every function that
/// takes a path; a non-accessible name cannot be read, written, moved or created.
#[tokio::test]
async fn redaction_parity_between_denied_and_missing() {
    let j = jailed_with(|c, root| {
        c.fs.denylist_paths.push(s(&root.join("deny")));
    })
    .await;
    std::fs::create_dir_all(j.root.join("deny")).unwrap();
    std::fs::write(j.root.join("deny/f.txt"), "d").unwrap();
    std::fs::write(j.root.join(".env"), "SECRET=1").unwrap();
    type Payload = Box<dyn Fn(&str) -> Value>;
    let calls: Vec<(&str, Payload)> = vec![
        ("coder::read-file", Box::new(|p| json!({"path": p}))),
        (
            "coder::read-file",
            Box::new(|p| json!({"path": p, "stat": true})),
        ),
        (
            "coder::read-file",
            Box::new(|p| json!({"path": p, "line_from": 1, "line_to": 2})),
        ),
        ("coder::list-folder", Box::new(|p| json!({"path": p}))),
        ("coder::tree", Box::new(|p| json!({"path": p}))),
    ];
    for (f, payload) in &calls {
        for denied in ["deny/f.txt", "deny", ".env"] {
            let missing = "no-such-entry";
            let d = expect_code(&j.h, f, payload(denied), "C211").await;
            let m = expect_code(&j.h, f, payload(missing), "C211").await;
            assert_eq!(
                d.message.replace(denied, "P"),
                m.message.replace(missing, "P"),
                "{f} {denied}"
            );
        }
    }
    // Batch entries too.
    let v =
        j.h.ok(
            "coder::read-file",
            json!({"paths": ["deny/f.txt", ".env", "no-such-entry"]}),
        )
        .await;
    let r = v["results"].as_array().unwrap();
    let msgs: Vec<String> = r
        .iter()
        .zip(["deny/f.txt", ".env", "no-such-entry"])
        .map(|(e, p)| {
            assert_eq!(e["success"], false);
            assert_eq!(e["error"]["code"], "C211");
            assert_eq!(e["content"], Value::Null);
            e["error"]["message"].as_str().unwrap().replace(p, "P")
        })
        .collect();
    assert!(msgs.windows(2).all(|w| w[0] == w[1]), "{msgs:?}");

    // The write side and search: the entry's (or the call's) code and message, denied vs
    // missing, with the path replaced. Nothing denied is changed.
    let entry = |v: &Value| -> (String, String) {
        let e = if v["results"].is_array() {
            v["results"][0]["error"].clone()
        } else {
            v.clone()
        };
        (
            e["code"].as_str().unwrap_or("").to_string(),
            e["message"].as_str().unwrap_or("").to_string(),
        )
    };
    let writes: Vec<(&str, Payload)> = vec![
        (
            "coder::update-file",
            Box::new(
                |p| json!({"files": [{"path": p, "ops": [{"op": "insert", "at_line": 1, "content": "x"}]}]}),
            ),
        ),
        (
            "coder::move",
            Box::new(|p| json!({"files": [{"from": p, "to": "moved.txt"}]})),
        ),
        (
            "coder::search",
            Box::new(|p| json!({"query": "S", "path": p})),
        ),
    ];
    for (f, payload) in &writes {
        for denied in ["deny/f.txt", ".env"] {
            let missing = "no-such-entry";
            let got = |p: &'static str| {
                let h = &j.h;
                let body = payload(p);
                async move {
                    match h.call(f, body).await {
                        Ok(v) => entry(&v),
                        Err(e) => (e.code.to_string(), e.message),
                    }
                }
            };
            let (dc, dm) = got(denied).await;
            let (mc, mm) = got(missing).await;
            assert_eq!((dc.as_str(), mc.as_str()), ("C211", "C211"), "{f} {denied}");
            assert_eq!(
                dm.replace(denied, "P"),
                mm.replace(missing, "P"),
                "{f} {denied}"
            );
        }
    }
    // A non-accessible name reads the same whether or not the file exists.
    let create = |p: &str| json!({"files": [{"path": p, "content": "x", "overwrite": true}]});
    let (ec, em) = entry(&j.h.ok("coder::create-file", create(".env")).await);
    let (nc, nm) = entry(&j.h.ok("coder::create-file", create("sub/.env")).await);
    assert_eq!((ec.as_str(), nc.as_str()), ("C211", "C211"));
    assert_eq!(em.replace(".env", "P"), nm.replace("sub/.env", "P"));
    assert!(
        !j.root.join("sub").exists(),
        "a refused create made its parent"
    );
    assert!(!j.root.join("moved.txt").exists());
    assert_eq!(
        std::fs::read_to_string(j.root.join(".env")).unwrap(),
        "SECRET=1"
    );
    assert_eq!(
        std::fs::read_to_string(j.root.join("deny/f.txt")).unwrap(),
        "d"
    );
}

/// SEC-17: a permission error reads like a missing path. The executor keeps uid 0 but no
/// capabilities (no CAP_DAC_OVERRIDE), so a mode-000 directory owned by `nobody` denies it.
#[tokio::test]
async fn permission_denied_reads_like_missing() {
    let j = jailed_root().await;
    let locked = j.root.join("locked");
    std::fs::create_dir_all(&locked).unwrap();
    std::fs::write(locked.join("f"), "x").unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    // The executor keeps uid 0 but no capabilities, so DAC applies only if the owner is not
    // root; make the directory owned by nobody.
    nix::unistd::chown(&locked, Some(nix::unistd::Uid::from_raw(65534)), None).ok();
    let probe = std::fs::read_to_string(locked.join("f"));
    let e =
        j.h.call("coder::read-file", json!({"path": "locked/f"}))
            .await;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    match e {
        Err(e) => {
            assert_eq!(e.code, "C211", "{e:?}");
            let m = expect_code(
                &j.h,
                "coder::read-file",
                json!({"path": "locked/g"}),
                "C211",
            )
            .await;
            // Same wording (the missing one names another path).
            assert_eq!(
                e.message.replace("locked/f", "P"),
                m.message.replace("locked/g", "P")
            );
        }
        Ok(v) => {
            // Only possible when the executor kept CAP_DAC_OVERRIDE: then the test process
            // (root with capabilities) could read it too.
            assert!(probe.is_ok(), "read succeeded without DAC bypass: {v}");
            panic!("executor bypassed file permissions: it kept CAP_DAC_OVERRIDE ({v})");
        }
    }
}

/// CODER-02, SEC-14: escapes are C215 (lexical, symlinked parent and leaf, prefix
/// confusion), in jailed mode.
#[tokio::test]
async fn escapes_are_c215() {
    let j = jailed_root().await;
    std::os::unix::fs::symlink(&j.outside, j.root.join("out")).unwrap();
    std::os::unix::fs::symlink(j.outside.join("secret.txt"), j.root.join("leaf")).unwrap();
    let evil = format!("{}-evil/x", s(&j.root));
    for p in [
        "../outside/secret.txt",
        "out/secret.txt",
        "leaf",
        evil.as_str(),
        "/etc/hostname",
    ] {
        expect_code(&j.h, "coder::read-file", json!({"path": p}), "C215").await;
        expect_code(&j.h, "coder::list-folder", json!({"path": p}), "C215").await;
    }
    expect_code(&j.h, "coder::tree", json!({"path": "out"}), "C215").await;
    // `..` that stays inside is fine.
    std::fs::create_dir_all(j.root.join("a")).unwrap();
    std::fs::write(j.root.join("b.txt"), "b").unwrap();
    let r =
        j.h.ok("coder::read-file", json!({"path": "a/../b.txt"}))
            .await;
    assert_eq!(r["path"], s(&j.root.join("b.txt")));
}

/// CODER-01, CODER-04: a harness scope anchors relative paths on session_root and refuses
/// paths outside scope_root with C220 (even missing ones, and through a symlink).
#[tokio::test]
async fn scope_root_and_session_root() {
    let j = jailed_root().await;
    let proj = j.root.join("proj");
    std::fs::create_dir_all(proj.join("src")).unwrap();
    std::fs::write(proj.join("src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(j.root.join("other.txt"), "o").unwrap();
    std::os::unix::fs::symlink("../other.txt", proj.join("link")).unwrap();
    let scope = json!({"scope_root": s(&proj), "session_root": s(&proj.join("src"))});
    let with = |mut p: Value| {
        p["fs_scope"] = scope.clone();
        p
    };
    let v = j.h.ok("coder::info", with(json!({}))).await;
    assert_eq!(v["session_root"], s(&proj.join("src")));
    let r =
        j.h.ok("coder::read-file", with(json!({"path": "main.rs"})))
            .await;
    assert_eq!(r["content"], "fn main() {}\n");
    for p in [
        "../../other.txt",
        "/no/such/place",
        "../../missing",
        "../link",
    ] {
        let e = expect_code(&j.h, "coder::read-file", with(json!({"path": p})), "C220").await;
        assert!(e.message.contains(&s(&proj)), "{e:?}");
    }
    // Without the scope the same path is fine.
    j.h.ok("coder::read-file", json!({"path": "other.txt"}))
        .await;
    // The metadata form wins over the payload form.
    let meta = iii_shell_broker::functions::CallMeta {
        metadata: Some(json!({"fs_scope": {"scope_root": s(&proj)}})),
    };
    let e = iii_shell_broker::functions::dispatch(
        &j.h.services,
        "coder::read-file",
        json!({"path": s(&j.root.join("other.txt"))}),
        meta,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, "C220");
}

// ---------------------------------------------------------------------------------------------
// coder::read-file
// ---------------------------------------------------------------------------------------------

/// CODER-15, 17, 19, 20, 23, 24, 25: a full read's shape, revision and line counts;
/// numbered, base64 and stat reads.
#[tokio::test]
async fn full_read_shape_and_revision() {
    let j = jailed_root().await;
    let f = j.root.join("a.txt");
    std::fs::write(&f, "one\ntwo\nthree").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
    let v = j.h.ok("coder::read-file", json!({"path": "a.txt"})).await;
    assert_eq!(v["path"], s(&f));
    assert_eq!(v["content"], "one\ntwo\nthree");
    assert_eq!(v["size"], 13);
    assert_eq!(v["mode"], 0o640);
    assert!(v["mtime"].as_i64().unwrap() > 1_600_000_000);
    assert_eq!(v["lines_returned"], 3);
    assert_eq!(v["total_lines"], 3);
    assert_eq!(v["more_lines"], false);
    assert_eq!(v["is_utf8"], true);
    assert_eq!(v["results"], Value::Null);
    assert_eq!(
        v["revision"],
        format!("sha256:{}", sha256_hex(b"one\ntwo\nthree"))
    );
    // Numbered.
    let v =
        j.h.ok(
            "coder::read-file",
            json!({"path": "a.txt", "numbered": true}),
        )
        .await;
    assert_eq!(v["content"], "1→one\n2→two\n3→three");
    // base64: exact bytes, is_utf8 describes them.
    std::fs::write(j.root.join("bin"), b"\x00\xffab\n").unwrap();
    let v =
        j.h.ok(
            "coder::read-file",
            json!({"path": "bin", "encoding": "base64"}),
        )
        .await;
    assert_eq!(v["content"], "AP9hYgo=");
    assert_eq!(v["is_utf8"], false);
    // Text mode replaces invalid bytes.
    let v = j.h.ok("coder::read-file", json!({"path": "bin"})).await;
    assert_eq!(v["content"], "\u{0}\u{fffd}ab\n");
    assert_eq!(v["is_utf8"], false);
    // Windows and stat have no revision.
    let v =
        j.h.ok("coder::read-file", json!({"path": "a.txt", "line_from": 1}))
            .await;
    assert_eq!(v["revision"], Value::Null);
    let v =
        j.h.ok("coder::read-file", json!({"path": "a.txt", "stat": true}))
            .await;
    assert_eq!(v["revision"], Value::Null);
    assert_eq!(v["content"], Value::Null);
    assert_eq!(v["total_lines"], 3);
    assert_eq!(v["is_utf8"], true);
    assert_eq!(v["size"], 13);
}

fn sha256_hex(b: &[u8]) -> String {
    // Independent of the executor: the system's sha256sum.
    use std::io::Write;
    let mut c = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum");
    c.stdin.take().unwrap().write_all(b).unwrap();
    let out = c.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// CODER-18, 24: windows are 1-based inclusive, keep terminators, and report total_lines only
/// when they reached EOF.
#[tokio::test]
async fn windows() {
    let j = jailed_root().await;
    let body: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    std::fs::write(j.root.join("t.txt"), &body).unwrap();
    let w = |from: Value, to: Value| json!({"path": "t.txt", "line_from": from, "line_to": to});
    let v = j.h.ok("coder::read-file", w(json!(3), json!(4))).await;
    assert_eq!(v["content"], "line 3\nline 4\n");
    assert_eq!(v["lines_returned"], 2);
    assert_eq!(v["more_lines"], true);
    assert_eq!(v["total_lines"], Value::Null);
    assert_eq!(v["size"], body.len());
    let v = j.h.ok("coder::read-file", w(json!(9), Value::Null)).await;
    assert_eq!(v["content"], "line 9\nline 10\n");
    assert_eq!(v["more_lines"], false);
    assert_eq!(v["total_lines"], 10);
    let v = j.h.ok("coder::read-file", w(Value::Null, json!(1))).await;
    assert_eq!(v["content"], "line 1\n");
    let v =
        j.h.ok(
            "coder::read-file",
            json!({"path": "t.txt", "line_from": 10, "line_to": 12, "numbered": true}),
        )
        .await;
    assert_eq!(v["content"], "10→line 10\n");
    assert_eq!(v["total_lines"], 10);
    assert_eq!(v["more_lines"], false);
    for (from, to) in [
        (json!(0), json!(2)),
        (json!(1), json!(0)),
        (json!(5), json!(4)),
    ] {
        expect_code(&j.h, "coder::read-file", w(from, to), "C210").await;
    }
}

/// CODER-16, 17, 20, 21: the forbidden combinations are C210.
#[tokio::test]
async fn read_combinations_are_c210() {
    let j = jailed_root().await;
    std::fs::write(j.root.join("a"), "a\n").unwrap();
    for p in [
        json!({}),
        json!({"path": "a", "paths": ["a"]}),
        json!({"path": "a", "stat": true, "line_from": 1}),
        json!({"path": "a", "stat": true, "numbered": true}),
        json!({"path": "a", "stat": true, "max_output_bytes": 10}),
        json!({"path": "a", "stat": true, "encoding": "base64"}),
        json!({"path": "a", "encoding": "base64", "line_from": 1}),
        json!({"path": "a", "encoding": "base64", "numbered": true}),
        json!({"path": "a", "line_from": 1, "max_output_bytes": 10}),
        json!({"paths": ["a"], "numbered": true}),
        json!({"path": "a", "encoding": "utf16"}),
        json!({"path": ""}),
        json!({"path": 5}),
    ] {
        expect_code(&j.h, "coder::read-file", p, "C210").await;
    }
    std::fs::create_dir_all(j.root.join("d")).unwrap();
    let e = expect_code(&j.h, "coder::read-file", json!({"path": "d"}), "C210").await;
    assert!(e.message.contains("list-folder"), "{e:?}");
}

/// CODER-21, 22: budgets. Full reads over max_output_bytes (or the clamped override) fail
/// C218 naming size and total_lines; over max_read_bytes too; windows cap instead.
#[tokio::test]
async fn read_budgets() {
    let j = jailed_with(|c, _| {
        c.max_output_bytes = 20;
        c.fs.max_read_bytes = 40;
    })
    .await;
    let body: String = (1..=8).map(|i| format!("row{i}\n")).collect(); // 40 bytes
    std::fs::write(j.root.join("f"), &body).unwrap();
    let e = expect_code(&j.h, "coder::read-file", json!({"path": "f"}), "C218").await;
    assert!(
        e.message.contains("40 bytes") && e.message.contains("8 lines"),
        "{e:?}"
    );
    assert!(
        e.message.contains("line_from") && e.message.contains("stat"),
        "{e:?}"
    );
    // The override may raise it up to max_read_bytes...
    let v =
        j.h.ok(
            "coder::read-file",
            json!({"path": "f", "max_output_bytes": 40}),
        )
        .await;
    assert_eq!(v["content"], body);
    // ... and is clamped there.
    std::fs::write(j.root.join("g"), format!("{body}x\n")).unwrap();
    expect_code(
        &j.h,
        "coder::read-file",
        json!({"path": "g", "max_output_bytes": 1000}),
        "C218",
    )
    .await;
    // A window over a file larger than max_read_bytes is capped at max_read_bytes.
    let v =
        j.h.ok("coder::read-file", json!({"path": "g", "line_from": 1}))
            .await;
    assert_eq!(v["content"], body);
    assert_eq!(v["more_lines"], true);
    assert_eq!(v["total_lines"], Value::Null);
    let v =
        j.h.ok("coder::read-file", json!({"path": "g", "line_from": 9}))
            .await;
    assert_eq!(v["content"], "x\n");
    assert_eq!(v["total_lines"], 9);
}

/// CODER-26, 27, 28: batches run in order against the aggregate budget, with per-entry
/// errors and the single-path fields null.
#[tokio::test]
async fn batch_reads() {
    let j = jailed_root().await;
    std::fs::write(j.root.join("a"), "a1\na2\n").unwrap();
    let big = "x".repeat(100 * 1024) + "\n";
    for n in ["b1", "b2", "b3"] {
        std::fs::write(j.root.join(n), &big).unwrap();
    }
    let v =
        j.h.ok(
            "coder::read-file",
            json!({"paths": [
                "a",
                {"path": "a", "line_from": 2, "numbered": true},
                {"path": "a", "stat": true},
                "missing",
                "b1", "b2", "b3", "a",
                {"path": "a", "stat": true},
            ]}),
        )
        .await;
    for k in [
        "path",
        "content",
        "size",
        "mode",
        "mtime",
        "lines_returned",
        "total_lines",
        "more_lines",
        "is_utf8",
        "revision",
    ] {
        assert_eq!(v[k], Value::Null, "{k}");
    }
    let r = v["results"].as_array().unwrap();
    assert_eq!(r.len(), 9);
    assert_eq!(r[0]["content"], "a1\na2\n");
    assert_eq!(r[0]["path"], s(&j.root.join("a")));
    assert_eq!(r[0]["success"], true);
    assert_eq!(r[0]["error"], Value::Null);
    assert_eq!(r[1]["content"], "2→a2\n");
    assert_eq!(r[2]["content"], Value::Null);
    assert_eq!(r[2]["total_lines"], 2);
    assert_eq!(r[3]["success"], false);
    assert_eq!(r[3]["path"], "missing");
    assert_eq!(r[3]["error"]["code"], "C211");
    assert_eq!(r[3]["size"], Value::Null);
    assert_eq!(r[4]["content"], big);
    assert_eq!(r[5]["content"], big);
    // The third 100 KiB entry only gets what is left of the 256 KiB budget, cut at a line.
    assert_eq!(r[6]["success"], true);
    assert_eq!(r[6]["content"], "");
    assert_eq!(r[6]["more_lines"], true);
    // 6 + 5 + 2*102401 bytes used, 262144 - that left; the next entry still has budget...
    // ... but a whole entry that does not fit is cut to nothing, and once the budget is
    // exactly spent the next entry is a C218 naming the key.
    let used = 6 + "2→a2\n".len() + 2 * big.len();
    assert!(used < 262144);
    assert_eq!(r[7]["content"], "a1\na2\n");
    // A stat entry consumes nothing and still works.
    assert_eq!(r[8]["success"], true);

    // Spend the budget exactly, then the next entry fails C218.
    let exact = 262144 - 2;
    std::fs::write(j.root.join("e"), "y".repeat(exact - 1) + "\n").unwrap();
    std::fs::write(j.root.join("two"), "z\n").unwrap();
    let v =
        j.h.ok(
            "coder::read-file",
            json!({"paths": ["e", "two", "a", {"path": "a", "stat": true}]}),
        )
        .await;
    let r = v["results"].as_array().unwrap();
    assert_eq!(r[0]["success"], true);
    assert_eq!(r[1]["content"], "z\n");
    assert_eq!(r[2]["success"], false);
    assert_eq!(r[2]["error"]["code"], "C218");
    let m = r[2]["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("batch_read_budget_bytes") && m.contains("262144"),
        "{m}"
    );
    assert_eq!(r[3]["success"], true, "stat needs no budget");
}

// ---------------------------------------------------------------------------------------------
// coder::list-folder
// ---------------------------------------------------------------------------------------------

/// CODER-40, 41, 42, 07: sorted pages, kinds, totals, non_accessible entries listed,
/// denylisted ones not.
#[tokio::test]
async fn list_folder_pages() {
    let j = jailed_with(|c, root| c.fs.denylist_paths.push(s(&root.join("d/hidden")))).await;
    let d = j.root.join("d");
    std::fs::create_dir_all(d.join("sub")).unwrap();
    for n in ["b.txt", "a.txt", "c.txt", ".env", "hidden"] {
        std::fs::write(d.join(n), n).unwrap();
    }
    std::os::unix::fs::symlink("a.txt", d.join("ln")).unwrap();
    let v =
        j.h.ok("coder::list-folder", json!({"path": "d", "page_size": 3}))
            .await;
    assert_eq!(v["path"], s(&d));
    assert_eq!(v["total"], 6);
    assert_eq!(v["page"], 1);
    assert_eq!(v["page_size"], 3);
    assert_eq!(v["has_more"], true);
    let names: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, [".env", "a.txt", "b.txt"]);
    assert_eq!(v["entries"][0]["non_accessible"], true);
    assert_eq!(v["entries"][1]["non_accessible"], false);
    assert_eq!(v["entries"][1]["kind"], "file");
    assert_eq!(v["entries"][1]["size"], 5);
    let v =
        j.h.ok(
            "coder::list-folder",
            json!({"path": "d", "page": 2, "page_size": 3}),
        )
        .await;
    let e = v["entries"].as_array().unwrap();
    assert_eq!(e.len(), 3);
    assert_eq!(e[0]["name"], "c.txt");
    assert_eq!(e[1]["name"], "ln");
    assert_eq!(e[1]["kind"], "symlink");
    assert_eq!(e[2]["name"], "sub");
    assert_eq!(e[2]["kind"], "dir");
    assert_eq!(v["has_more"], false);
    // Defaults and clamping.
    let v = j.h.ok("coder::list-folder", json!({"path": "d"})).await;
    assert_eq!(v["page_size"], 200);
    let v =
        j.h.ok(
            "coder::list-folder",
            json!({"path": "d", "page_size": 100000}),
        )
        .await;
    assert_eq!(v["page_size"], 1000);
    let v = j.h.ok("coder::list-folder", json!({})).await;
    assert_eq!(v["path"], s(&j.root));
    expect_code(
        &j.h,
        "coder::list-folder",
        json!({"path": "d", "page": 0}),
        "C210",
    )
    .await;
    expect_code(
        &j.h,
        "coder::list-folder",
        json!({"path": "d/a.txt"}),
        "C210",
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// coder::tree
// ---------------------------------------------------------------------------------------------

fn child<'a>(node: &'a Value, name: &str) -> &'a Value {
    node["children"]
        .as_array()
        .unwrap_or_else(|| panic!("no children in {node}"))
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no child {name} in {node}"))
}

/// CODER-43..47: depth, per-folder limit, default excludes, hidden entries, root naming.
#[tokio::test]
async fn tree_bounds() {
    let j = jailed_root().await;
    let p = j.root.join("p");
    std::fs::create_dir_all(p.join("src/deep/deeper")).unwrap();
    std::fs::create_dir_all(p.join("node_modules/x")).unwrap();
    std::fs::create_dir_all(p.join(".git")).unwrap();
    std::fs::create_dir_all(p.join("many")).unwrap();
    for i in 0..7 {
        std::fs::write(p.join(format!("many/f{i}")), "x").unwrap();
    }
    std::fs::write(p.join(".hidden"), "h").unwrap();
    std::fs::write(p.join("src/main.rs"), "fn main(){}").unwrap();
    std::fs::write(p.join(".env"), "S=1").unwrap();
    let v =
        j.h.ok(
            "coder::tree",
            json!({"path": "p", "max_depth": 2, "per_folder_limit": 5}),
        )
        .await;
    assert_eq!(v["path"], s(&p));
    let root = &v["root"];
    assert_eq!(root["name"], "p");
    assert_eq!(root["kind"], "dir");
    let names: Vec<&str> = root["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, [".env", ".git", ".hidden", "many", "node_modules"]);
    assert_eq!(root["truncated"]["reason"], "per_folder_limit");
    assert_eq!(root["truncated"]["shown"], 5);
    assert_eq!(root["truncated"]["total"], 6);
    assert!(root["truncated"]["hint"]
        .as_str()
        .unwrap()
        .contains("coder::list-folder"));
    assert_eq!(child(root, ".env")["non_accessible"], true);
    let nm = child(root, "node_modules");
    assert_eq!(nm["truncated"]["reason"], "default_exclude");
    assert_eq!(nm["children"], Value::Null);
    assert_eq!(
        child(root, ".git")["truncated"]["reason"],
        "default_exclude"
    );
    let many = child(root, "many");
    assert_eq!(many["truncated"]["reason"], "per_folder_limit");
    assert_eq!(many["truncated"]["total"], 7);
    assert_eq!(many["children"].as_array().unwrap().len(), 5);

    // Hidden entries omitted at every level (not counted), the root exempt; depth cut-off.
    let v = j
        .h
        .ok(
            "coder::tree",
            json!({"path": "p", "max_depth": 2, "include_hidden": false, "use_default_excludes": false}),
        )
        .await;
    let root = &v["root"];
    let names: Vec<&str> = root["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["many", "node_modules", "src"]);
    assert_eq!(root["truncated"], Value::Null);
    let src = child(root, "src");
    let deep = child(src, "deep");
    assert_eq!(deep["truncated"]["reason"], "max_depth");
    assert_eq!(deep["truncated"]["total"], Value::Null);
    assert_eq!(deep["children"], Value::Null);
    assert_eq!(
        child(child(root, "node_modules"), "x")["truncated"]["reason"],
        "max_depth"
    );
    // Hidden requested root is exempt.
    let v =
        j.h.ok(
            "coder::tree",
            json!({"path": "p/.git", "include_hidden": false}),
        )
        .await;
    assert_eq!(v["root"]["name"], ".git");
    // A file is not a folder.
    expect_code(
        &j.h,
        "coder::tree",
        json!({"path": "p/src/main.rs"}),
        "C210",
    )
    .await;
}

/// CODER-46: a folder that omitted excluded non-directory children says so.
#[tokio::test]
async fn tree_marks_omitted_excluded_files() {
    let j = jailed_with(|c, _| c.code.default_exclude_globs.push("**/*.log".into())).await;
    std::fs::write(j.root.join("a.log"), "x").unwrap();
    std::fs::write(j.root.join("b.txt"), "x").unwrap();
    let v = j.h.ok("coder::tree", json!({})).await;
    let names: Vec<&str> = v["root"]["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["b.txt"]);
    assert_eq!(v["root"]["truncated"]["reason"], "default_exclude");
    let v =
        j.h.ok("coder::tree", json!({"use_default_excludes": false}))
            .await;
    assert_eq!(v["root"]["children"].as_array().unwrap().len(), 2);
    assert_eq!(v["root"]["truncated"], Value::Null);
}

/// CODER-48 and the symlink-loop case: a tree over symlink loops ends, lists the links as
/// symlinks, and a large tree stops at the node budget with reason max_nodes.
#[tokio::test]
async fn tree_symlink_loops_and_node_budget() {
    let j = jailed_root().await;
    let l = j.root.join("loop");
    std::fs::create_dir_all(l.join("a/b")).unwrap();
    std::os::unix::fs::symlink("..", l.join("a/b/up")).unwrap();
    std::os::unix::fs::symlink(&l, l.join("a/self")).unwrap();
    std::os::unix::fs::symlink("x2", l.join("x1")).unwrap();
    std::os::unix::fs::symlink("x1", l.join("x2")).unwrap();
    let v =
        j.h.ok("coder::tree", json!({"path": "loop", "max_depth": 30}))
            .await;
    let a = child(&v["root"], "a");
    assert_eq!(child(a, "self")["kind"], "symlink");
    assert_eq!(child(a, "self")["children"], Value::Null);
    assert_eq!(child(child(a, "b"), "up")["kind"], "symlink");
    assert_eq!(child(&v["root"], "x1")["kind"], "symlink");

    // 60 folders of 60 files: 3660 entries, over the 2000-node budget.
    let big = j.root.join("big");
    for d in 0..60 {
        let dir = big.join(format!("d{d:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..60 {
            std::fs::write(dir.join(format!("f{f:02}")), "").unwrap();
        }
    }
    let v =
        j.h.ok(
            "coder::tree",
            json!({"path": "big", "per_folder_limit": 100}),
        )
        .await;
    fn count(n: &Value) -> usize {
        1 + n["children"]
            .as_array()
            .map(|c| c.iter().map(count).sum())
            .unwrap_or(0)
    }
    assert_eq!(count(&v["root"]), 2000);
    let kids = v["root"]["children"].as_array().unwrap();
    assert_eq!(kids.len(), 60);
    let reasons: Vec<&str> = kids
        .iter()
        .map(|k| k["truncated"]["reason"].as_str().unwrap_or("none"))
        .collect();
    assert!(reasons.contains(&"max_nodes"), "{reasons:?}");
    assert_eq!(reasons[0], "none");
}

// ---------------------------------------------------------------------------------------------
// coder::create-file
// ---------------------------------------------------------------------------------------------

fn result(v: &Value, i: usize) -> &Value {
    &v["results"][i]
}

/// CODER-49, 50, 52, 09, 10: defaults (parents true, 0644), C213 without overwrite, C218,
/// per-entry isolation, revision of the bytes written.
#[tokio::test]
async fn create_file_entries() {
    let j = jailed_with(|c, _| c.fs.max_write_bytes = 64).await;
    std::fs::write(j.root.join("exists.txt"), "old").unwrap();
    let v =
        j.h.ok(
            "coder::create-file",
            json!({"files": [
                {"path": "new/deep/a.txt", "content": "hello\n"},
                {"path": "exists.txt", "content": "x"},
                {"path": "big.txt", "content": "y".repeat(65)},
                {"path": "m.sh", "content": "#!/bin/sh\n", "mode": "0750"},
                {"path": "bad.txt", "content": "z", "mode": "4755"},
                {"path": ".env", "content": "S=1"},
                {"path": "../outside/x", "content": "z"},
                {"path": "exists.txt", "content": "new", "overwrite": true},
            ]}),
        )
        .await;
    let r0 = result(&v, 0);
    assert_eq!(r0["success"], true);
    assert_eq!(r0["path"], s(&j.root.join("new/deep/a.txt")));
    assert_eq!(r0["bytes_written"], 6);
    assert_eq!(r0["revision"], format!("sha256:{}", sha256_hex(b"hello\n")));
    assert_eq!(r0["error"], Value::Null);
    let meta = std::fs::metadata(j.root.join("new/deep/a.txt")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
    let r1 = result(&v, 1);
    assert_eq!(r1["success"], false);
    assert_eq!(r1["error"]["code"], "C213");
    assert!(r1["error"]["message"]
        .as_str()
        .unwrap()
        .contains("overwrite=true"));
    assert_eq!(result(&v, 2)["error"]["code"], "C218");
    assert!(!j.root.join("big.txt").exists());
    assert_eq!(result(&v, 3)["success"], true);
    assert_eq!(mode_of(&j.root.join("m.sh")), 0o750);
    assert_eq!(result(&v, 4)["error"]["code"], "C210");
    assert_eq!(result(&v, 5)["error"]["code"], "C211");
    assert!(!j.root.join(".env").exists());
    assert_eq!(result(&v, 6)["error"]["code"], "C215");
    assert_eq!(result(&v, 6)["path"], "../outside/x");
    assert_eq!(result(&v, 7)["success"], true);
    assert_eq!(
        std::fs::read_to_string(j.root.join("exists.txt")).unwrap(),
        "new"
    );
    // parents: false refuses a missing parent.
    let v =
        j.h.ok(
            "coder::create-file",
            json!({"files": [{"path": "nope/x", "content": "", "parents": false}]}),
        )
        .await;
    assert_eq!(result(&v, 0)["error"]["code"], "C211");
    expect_code(&j.h, "coder::create-file", json!({"files": "x"}), "C210").await;
}

/// A create that fails after making its parent folders leaves none of them behind: a name
/// the policy protects once the folder is made (a link inside the scope leading out of it,
/// C220; a folder link into a protected tree, C211), and a target that became a folder.
/// Folders that existed before stay.
#[tokio::test]
async fn a_failed_create_leaves_no_folders_behind() {
    let j = jailed_root().await;
    let proj = j.root.join("proj");
    std::fs::create_dir_all(proj.join("kept")).unwrap();
    std::fs::create_dir_all(j.root.join("other")).unwrap();
    std::os::unix::fs::symlink("../other", proj.join("out")).unwrap();
    let scoped = json!({"fs_scope": {"scope_root": s(&proj)}, "files": [
        {"path": s(&proj.join("out/made/deeper/f.txt")), "content": "x"},
    ]});
    let v = j.h.ok("coder::create-file", scoped).await;
    assert_eq!(result(&v, 0)["error"]["code"], "C220", "{v}");
    assert!(
        !j.root.join("other/made").exists(),
        "a folder was left behind"
    );
    let before = list_tree(&j.root);
    let v =
        j.h.ok(
            "coder::create-file",
            json!({"files": [
                {"path": "proj/kept/new/sub/.env", "content": "S=1"},
                {"path": "proj/kept/a/b/c.pem", "content": "k"},
            ]}),
        )
        .await;
    assert_eq!(result(&v, 0)["error"]["code"], "C211", "{v}");
    assert_eq!(result(&v, 1)["error"]["code"], "C211", "{v}");
    assert_eq!(
        list_tree(&j.root),
        before,
        "a failed create changed the tree"
    );
}

fn list_tree(root: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(s(&p));
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// CODER-51: a stale expected_revision fails C221 and writes nothing; a current one
/// overwrites; the revision returned chains into the next write.
#[tokio::test]
async fn create_file_expected_revision() {
    let j = jailed_root().await;
    std::fs::write(j.root.join("f"), "v1").unwrap();
    let r = j.h.ok("coder::read-file", json!({"path": "f"})).await;
    let rev1 = r["revision"].as_str().unwrap().to_string();
    std::fs::write(j.root.join("f"), "v1-changed-behind-our-back").unwrap();
    let v =
        j.h.ok(
            "coder::create-file",
            json!({"files": [{"path": "f", "content": "v2", "expected_revision": rev1}]}),
        )
        .await;
    assert_eq!(result(&v, 0)["error"]["code"], "C221");
    assert_eq!(
        std::fs::read_to_string(j.root.join("f")).unwrap(),
        "v1-changed-behind-our-back"
    );
    let r = j.h.ok("coder::read-file", json!({"path": "f"})).await;
    let rev2 = r["revision"].as_str().unwrap().to_string();
    let v =
        j.h.ok(
            "coder::create-file",
            json!({"files": [{"path": "f", "content": "v3", "expected_revision": rev2}]}),
        )
        .await;
    assert_eq!(result(&v, 0)["success"], true, "{v}");
    let rev3 = result(&v, 0)["revision"].as_str().unwrap().to_string();
    let v =
        j.h.ok(
            "coder::create-file",
            json!({"files": [{"path": "f", "content": "v4", "expected_revision": rev3}]}),
        )
        .await;
    assert_eq!(result(&v, 0)["success"], true);
    assert_eq!(std::fs::read_to_string(j.root.join("f")).unwrap(), "v4");
    // A revision against a file that is gone is a conflict, not a create.
    let v =
        j.h.ok(
            "coder::create-file",
            json!({"files": [{"path": "gone", "content": "x", "expected_revision": rev3}]}),
        )
        .await;
    assert_eq!(result(&v, 0)["error"]["code"], "C221");
    assert!(!j.root.join("gone").exists());
}

/// Two concurrent create-file calls with the same expected_revision cannot both
/// succeed (the comparison happens under the write's lock).
#[tokio::test]
async fn concurrent_creates_with_one_revision_conflict() {
    let j = jailed_root().await;
    for round in 0..20 {
        std::fs::write(j.root.join("race"), format!("base {round}")).unwrap();
        let r = j.h.ok("coder::read-file", json!({"path": "race"})).await;
        let rev = r["revision"].as_str().unwrap().to_string();
        let calls = (0..4).map(|i| {
            j.h.call(
                "coder::create-file",
                json!({"files": [{"path": "race", "content": format!("writer {i}"), "expected_revision": rev}]}),
            )
        });
        let out = futures_util::future::join_all(calls).await;
        let wins: Vec<usize> = out
            .iter()
            .enumerate()
            .filter(|(_, r)| r.as_ref().unwrap()["results"][0]["success"] == true)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(wins.len(), 1, "round {round}: {out:?}");
        for (i, r) in out.iter().enumerate() {
            if i != wins[0] {
                assert_eq!(r.as_ref().unwrap()["results"][0]["error"]["code"], "C221");
            }
        }
        assert_eq!(
            std::fs::read_to_string(j.root.join("race")).unwrap(),
            format!("writer {}", wins[0])
        );
    }
}

// ---------------------------------------------------------------------------------------------
// coder::update-file
// ---------------------------------------------------------------------------------------------

/// An edit of a setuid/setgid file keeps those bits only when `fs.allow_special_bits`:
/// otherwise the rewritten copy drops them (sticky and permission bits stay), and the edit
/// succeeds although the executor's seccomp filter refuses setting them (it failed with an
/// I/O error before).
#[tokio::test]
async fn update_file_keeps_special_bits_only_when_allowed() {
    for (allow, want) in [(false, 0o1751), (true, 0o7751)] {
        let j = jailed_with(|c, _| c.fs.allow_special_bits = allow).await;
        let f = j.root.join("tool.sh");
        std::fs::write(&f, "a\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o7751)).unwrap();
        let v =
            j.h.ok(
                "coder::update-file",
                json!({"files": [{"path": "tool.sh", "ops": [
                    {"op": "insert", "at_line": 1, "content": "b\n"},
                ]}]}),
            )
            .await;
        assert_eq!(result(&v, 0)["success"], true, "allow {allow}: {v}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "b\na\n");
        let mode = mode_of(&f);
        assert_eq!(mode, want, "allow {allow}: mode {mode:o}");
    }
}

/// CODER-53..64: ops, echoes, mode and owner kept, result shape.
#[tokio::test]
async fn update_file_applies_and_echoes() {
    let j = jailed_root().await;
    let f = j.root.join("lib.rs");
    let src: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&f, &src).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o751)).unwrap();
    let v = j
        .h
        .ok(
            "coder::update-file",
            json!({"files": [{"path": "lib.rs", "ops": [
                {"op": "insert", "at_line": 1, "content": "// header\n"},
                {"op": "update_lines", "from_line": 5, "to_line": 6, "content": "five-six\n"},
                {"op": "remove", "from_line": 9, "to_line": 9},
                {"op": "replace", "pattern": "line (\\d+)", "replacement": "L$1", "expect_matches": 7},
            ]}]}),
        )
        .await;
    let r = result(&v, 0);
    assert_eq!(r["success"], true, "{v}");
    assert_eq!(r["path"], s(&f));
    assert_eq!(r["applied"], 4);
    assert_eq!(r["error"], Value::Null);
    let want = "// header\nL1\nL2\nL3\nL4\nfive-six\nL7\nL8\nL10\n";
    assert_eq!(std::fs::read_to_string(&f).unwrap(), want);
    assert_eq!(r["new_line_count"], 9);
    let e = r["echoes"].as_array().unwrap();
    assert_eq!(e[0]["op_index"], 0);
    assert_eq!(e[0]["from_line"], 1);
    assert_eq!(e[0]["lines"], json!(["// header", "line 1", "line 2"]));
    assert_eq!(e[1]["op_index"], 1);
    assert_eq!(e[1]["from_line"], 4);
    assert_eq!(
        e[1]["lines"],
        json!(["line 3", "line 4", "five-six", "line 7", "line 8"])
    );
    assert_eq!(e[2]["op_index"], 2);
    let rep: Vec<&Value> = e.iter().filter(|x| x["op_index"] == 3).collect();
    assert_eq!(rep.len(), 5, "at most 5 sites");
    assert!(rep.iter().all(|x| x["total_replacements"] == 7));
    assert_eq!(rep[0]["from_line"], 2);
    assert_eq!(rep[0]["lines"], json!(["L1"]));
    assert_eq!(r["echoes_truncated"], false);
    let meta = std::fs::metadata(&f).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.mode() & 0o7777, 0o751);
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    // No temp files left behind.
    let names: Vec<String> = std::fs::read_dir(&j.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["lib.rs"]);
}

/// CODER-55, 56, 59, 09: an edit whose fourth op fails leaves the file
/// byte-identical (and its inode untouched), while the other file in the batch is applied.
#[tokio::test]
async fn failing_fourth_op_leaves_the_file_byte_identical() {
    let j = jailed_root().await;
    let f = j.root.join("a.txt");
    // Non-ASCII UTF-8 (a file that is not UTF-8 is refused before any op is looked at).
    let original = "alpha\nbeta\ngamma\n\u{e9}delta\n".as_bytes().to_vec();
    std::fs::write(&f, &original).unwrap();
    std::fs::write(j.root.join("b.txt"), "one\n").unwrap();
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(&f).unwrap().ino();
    let bad_fourth = [
        json!({"op": "replace", "pattern": "(", "replacement": "x"}),
        json!({"op": "replace", "pattern": "alpha", "replacement": "x", "expect_matches": 2}),
        json!({"op": "replace", "pattern": "a", "replacement": "$9"}),
        json!({"op": "remove", "from_line": 3, "to_line": 9}),
        json!({"op": "insert", "at_line": 3, "content": "x"}),
        json!({"op": "update_lines", "from_line": 0, "to_line": 1, "content": "x"}),
    ];
    for bad in bad_fourth {
        let v =
            j.h.ok(
                "coder::update-file",
                json!({"files": [
                    {"path": "a.txt", "ops": [
                        {"op": "insert", "at_line": 1, "content": "top\n"},
                        {"op": "update_lines", "from_line": 2, "to_line": 3, "content": "B\n"},
                        {"op": "replace", "pattern": "gamma", "replacement": "G"},
                        bad.clone(),
                    ]},
                    {"path": "b.txt", "ops": [{"op": "insert", "at_line": 2, "content": "two\n"}]},
                ]}),
            )
            .await;
        let r = result(&v, 0);
        assert_eq!(r["success"], false, "{bad}: {v}");
        assert_eq!(r["error"]["code"], "C210", "{bad}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains("op 3"),
            "{bad}: {r}"
        );
        assert_eq!(r["echoes"], json!([]));
        assert_eq!(r["echoes_truncated"], false);
        assert_eq!(std::fs::read(&f).unwrap(), original, "{bad}");
        assert_eq!(
            std::fs::metadata(&f).unwrap().ino(),
            ino,
            "{bad}: file was replaced"
        );
        assert_eq!(result(&v, 1)["success"], true);
        std::fs::write(j.root.join("b.txt"), "one\n").unwrap();
    }
    // Missing, denied and escaping entries fail per entry.
    let v = j
        .h
        .ok(
            "coder::update-file",
            json!({"files": [
                {"path": "missing", "ops": [{"op": "insert", "at_line": 1, "content": "x"}]},
                {"path": "../outside/secret.txt", "ops": [{"op": "insert", "at_line": 1, "content": "x"}]},
            ]}),
        )
        .await;
    assert_eq!(result(&v, 0)["error"]["code"], "C211");
    assert_eq!(result(&v, 0)["path"], "missing");
    assert_eq!(result(&v, 1)["error"]["code"], "C215");
    assert_eq!(std::fs::read(j.outside.join("secret.txt")).unwrap(), SECRET);
}

/// CODER-59: a result over max_write_bytes is C218 and writes nothing.
#[tokio::test]
async fn update_over_max_write_is_c218() {
    let j = jailed_with(|c, _| c.fs.max_write_bytes = 10).await;
    std::fs::write(j.root.join("f"), "12345\n").unwrap();
    let v = j
        .h
        .ok(
            "coder::update-file",
            json!({"files": [{"path": "f", "ops": [{"op": "insert", "at_line": 2, "content": "678901\n"}]}]}),
        )
        .await;
    assert_eq!(result(&v, 0)["error"]["code"], "C218");
    assert_eq!(
        std::fs::read_to_string(j.root.join("f")).unwrap(),
        "12345\n"
    );
}

/// Owner and group of `p`.
fn owner_of(p: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

fn must_be_root() {
    if !is_root() {
        panic!("this test needs root (files owned by other users); run it as root");
    }
}

/// A replaced file keeps its owner and group when the executor may keep them
/// (root with `CAP_CHOWN` kept by the pinned envelope): update-file, an overwriting
/// create-file and a cross-root move. (Mode 0606: the executor holds no CAP_DAC_OVERRIDE, so
/// another user's file must be readable and writable by others for it to edit it at all.)
/// A file the executor may not write (0604) is never given back to its owner (the
/// chown would make the new content look like the owner's), so its edit is refused (C216,
/// nothing written) rather than handing it to the executor's user. A move carries the
/// owner's own bytes, so a 0604 file keeps its owner when moved.
#[tokio::test]
async fn writes_keep_owner_and_group_with_cap_chown() {
    must_be_root();
    let dir = tempdir();
    let base = canon(dir.path());
    let (root, other) = (base.join("root"), base.join("other"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    let mut c = jailed(&root);
    c.fs.host_roots.push(s(&other));
    c.confinement.capabilities = vec!["CAP_CHOWN".into()];
    let pin = base.join("envelope.yaml");
    std::fs::write(&pin, serde_norway::to_string(&c).unwrap()).unwrap();
    let h = Harness::with_args(c, &["--pin-config", &s(&pin)]).await;
    for (name, mode) in [
        ("u.txt", 0o606),
        ("c.txt", 0o606),
        ("m.txt", 0o604),
        ("ro.txt", 0o604),
    ] {
        let f = root.join(name);
        std::fs::write(&f, "one\ntwo\n").unwrap();
        std::os::unix::fs::chown(&f, Some(4321), Some(8765)).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let v = h
        .ok(
            "coder::update-file",
            json!({"files": (["u.txt", "ro.txt"].map(|p| json!({"path": p, "ops": [
                {"op": "update_lines", "from_line": 2, "to_line": 2, "content": "TWO\n"}]})))}),
        )
        .await;
    assert_eq!(result(&v, 0)["success"], true, "{v}");
    assert_eq!(result(&v, 1)["error"]["code"], "C216", "{v}");
    let v = h
        .ok(
            "coder::create-file",
            json!({"files": [{"path": "c.txt", "content": "new\n", "overwrite": true, "mode": "0606"}]}),
        )
        .await;
    assert_eq!(result(&v, 0)["success"], true, "{v}");
    let v = h
        .ok(
            "coder::move",
            json!({"files": [{"from": "m.txt", "to": s(&other.join("m.txt"))}]}),
        )
        .await;
    assert_eq!(result(&v, 0)["moved"], true, "{v}");
    assert_eq!(
        std::fs::read_to_string(root.join("u.txt")).unwrap(),
        "one\nTWO\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("ro.txt")).unwrap(),
        "one\ntwo\n",
        "a file the executor may not write is not replaced"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("c.txt")).unwrap(),
        "new\n"
    );
    for (f, mode) in [
        (root.join("u.txt"), 0o606),
        (root.join("c.txt"), 0o606),
        (other.join("m.txt"), 0o604),
    ] {
        assert_eq!(owner_of(&f), (4321, 8765), "{}", f.display());
        assert_eq!(mode_of(&f), mode, "{}", f.display());
    }
    assert_eq!(owner_of(&root.join("ro.txt")), (4321, 8765), "unchanged");
    assert_eq!(mode_of(&root.join("ro.txt")), 0o604);
}

/// `system.posix_acl_access` in the kernel's xattr form: version 2, then (tag, perm, id)
/// entries sorted by tag: owner rw-, user 5678 r--, group r--, mask r--, other ---, which is
/// what mode 0640 shows.
fn acl_0640_with_user_5678() -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 4, 5678),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn c_path(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

fn set_acl(p: &Path, acl: &[u8]) {
    // SAFETY: NUL-terminated path and name, a buffer of `acl.len()` bytes.
    let rc = unsafe {
        libc::lsetxattr(
            c_path(p).as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            acl.as_ptr().cast(),
            acl.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "setxattr {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

/// The `system.posix_acl_access` bytes of `p`, None when it has none.
fn acl_of(p: &Path) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: NUL-terminated path and name, a buffer of `buf.len()` bytes.
    let n = unsafe {
        libc::lgetxattr(
            c_path(p).as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::ENODATA),
            "getxattr {}: {e}",
            p.display()
        );
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

/// Every operation that rewrites an existing file through a temp file and a rename
/// keeps its owner, group, mode and POSIX ACL (`system.posix_acl_access`), as editors do:
/// `coder::update-file`, an overwriting `coder::create-file`, `shell::fs::sed` and
/// `shell::fs::write` over the file. The file is 1234:1234, mode 0640, with an ACL granting
/// uid 5678 read. Checked for an executor running as the file's owner (`run_as: 1234:1234`)
/// and for a root executor that may chown and write it (CAP_CHOWN and CAP_DAC_OVERRIDE kept
/// by the pinned envelope). Failed before the fix: the ACL was gone after every edit (and
/// `shell::fs::write`/`sed` left the root executor's file owned by 0:0).
#[tokio::test]
async fn rewrites_keep_owner_group_mode_and_acl() {
    must_be_root();
    for run_as in ["1234:1234", "root"] {
        let dir = tempdir();
        let base = canon(dir.path());
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = base.join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::os::unix::fs::chown(&root, Some(1234), Some(1234)).unwrap();
        let mut c = jailed(&root);
        c.confinement.run_as = Some(run_as.into());
        let h = if run_as == "root" {
            c.confinement.capabilities = vec!["CAP_CHOWN".into(), "CAP_DAC_OVERRIDE".into()];
            let pin = base.join("envelope.yaml");
            std::fs::write(&pin, serde_norway::to_string(&c).unwrap()).unwrap();
            Harness::with_args(c, &["--pin-config", &s(&pin)]).await
        } else {
            Harness::new(c).await
        };
        let acl = acl_0640_with_user_5678();
        let names = ["u.txt", "c.txt", "s.txt", "w.txt"];
        for name in names {
            let f = root.join(name);
            std::fs::write(&f, "one\ntwo\n").unwrap();
            std::os::unix::fs::chown(&f, Some(1234), Some(1234)).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
            set_acl(&f, &acl);
            assert_eq!(acl_of(&f).as_deref(), Some(&acl[..]));
        }
        let v = h
            .ok(
                "coder::update-file",
                json!({"files": [{"path": "u.txt", "ops": [
                    {"op": "update_lines", "from_line": 2, "to_line": 2, "content": "TWO\n"}]}]}),
            )
            .await;
        assert_eq!(result(&v, 0)["success"], true, "{run_as}: {v}");
        let v = h
            .ok(
                "coder::create-file",
                json!({"files": [{"path": "c.txt", "content": "one\nTWO\n", "overwrite": true, "mode": "0640"}]}),
            )
            .await;
        assert_eq!(result(&v, 0)["success"], true, "{run_as}: {v}");
        h.ok(
            "shell::fs::sed",
            json!({"files": [s(&root.join("s.txt"))], "pattern": "two", "replacement": "TWO"}),
        )
        .await;
        h.ok(
            "shell::fs::write",
            json!({"path": s(&root.join("w.txt")), "content": "one\nTWO\n", "mode": "0640"}),
        )
        .await;
        for name in names {
            let f = root.join(name);
            let what = format!("{run_as} {name}");
            assert_eq!(std::fs::read_to_string(&f).unwrap(), "one\nTWO\n", "{what}");
            assert_eq!(owner_of(&f), (1234, 1234), "{what}");
            assert_eq!(mode_of(&f), 0o640, "{what}");
            assert_eq!(acl_of(&f).as_deref(), Some(&acl[..]), "{what}: the ACL");
        }
        assert_eq!(
            names_in(&root),
            ["c.txt", "s.txt", "u.txt", "w.txt"],
            "{run_as}: no temp file is left"
        );
    }
}

/// Without `CAP_CHOWN` (the default), replacing another user's file would hand it
/// to the executor's user: update-file, an overwriting create-file and a cross-root move
/// refuse with C216 naming the owner and the fix, and nothing changes (bytes, owner, no temp
/// file left, the move's source still there). The executor's own files are edited as usual.
/// Checked for a root executor without capabilities and for `run_as: 4242:4242`.
#[tokio::test]
async fn writes_refuse_a_file_whose_owner_they_cannot_keep() {
    must_be_root();
    for run_as in ["root", "4242:4242"] {
        let dir = tempdir();
        let base = canon(dir.path());
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (root, other) = (base.join("root"), base.join("other"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let me = if run_as == "root" { 0 } else { 4242 };
        for d in [&root, &other] {
            std::os::unix::fs::chown(d, Some(me), Some(me)).unwrap();
        }
        let mut c = jailed(&root);
        c.fs.host_roots.push(s(&other));
        c.confinement.run_as = Some(run_as.into());
        let h = Harness::new(c).await;
        // Writable by everyone, owned by someone else.
        for name in ["theirs.txt", "mine.txt"] {
            let f = root.join(name);
            std::fs::write(&f, "one\ntwo\n").unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        }
        std::os::unix::fs::chown(root.join("theirs.txt"), Some(4343), Some(4343)).unwrap();
        std::os::unix::fs::chown(root.join("mine.txt"), Some(me), Some(me)).unwrap();
        let theirs = root.join("theirs.txt");
        let ino = || {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&theirs).unwrap().ino()
        };
        let before = ino();
        let check = |r: &Value, what: &str| {
            assert_eq!(r["success"], false, "{what} {r}");
            assert_eq!(r["error"]["code"], "C216", "{what} {r}");
            let m = r["error"]["message"].as_str().unwrap();
            assert!(
                m.contains("cannot keep the owner")
                    && m.contains("uid 4343")
                    && m.contains("CAP_CHOWN")
                    && m.contains("nothing was written"),
                "{what}: {m}"
            );
        };
        let v = h
            .ok(
                "coder::update-file",
                json!({"files": [
                    {"path": "theirs.txt", "ops": [{"op": "remove", "from_line": 1, "to_line": 1}]},
                    {"path": "mine.txt", "ops": [{"op": "remove", "from_line": 1, "to_line": 1}]},
                ]}),
            )
            .await;
        check(result(&v, 0), "update-file");
        assert_eq!(result(&v, 1)["success"], true, "{run_as}: {v}");
        let v = h
            .ok(
                "coder::create-file",
                json!({"files": [{"path": "theirs.txt", "content": "x\n", "overwrite": true}]}),
            )
            .await;
        check(result(&v, 0), "create-file");
        let v = h
            .ok(
                "coder::move",
                json!({"files": [{"from": "theirs.txt", "to": s(&other.join("t.txt"))}]}),
            )
            .await;
        check(result(&v, 0), "move");
        assert_eq!(result(&v, 0)["moved"], false);
        assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "one\ntwo\n");
        assert_eq!(owner_of(&theirs), (4343, 4343), "{run_as}");
        assert_eq!(ino(), before, "{run_as}: the file was replaced");
        assert_eq!(names_in(&root), ["mine.txt", "theirs.txt"], "{run_as}");
        assert!(names_in(&other).is_empty(), "{run_as}");
        assert_eq!(
            std::fs::read_to_string(root.join("mine.txt")).unwrap(),
            "two\n"
        );
        assert_eq!(owner_of(&root.join("mine.txt")), (me, me), "{run_as}");
        assert_eq!(mode_of(&root.join("mine.txt")), 0o666, "{run_as}");
    }
}

// ---------------------------------------------------------------------------------------------
// coder::delete-file
// ---------------------------------------------------------------------------------------------

/// CODER-65, 66, 67: missing succeeds (removed:false), denylisted reads like missing,
/// non-empty dirs need recursive, roots refused, recursion refuses non-accessible entries.
#[tokio::test]
async fn delete_file_entries() {
    let j = jailed_with(|c, root| c.fs.denylist_paths.push(s(&root.join("deny")))).await;
    std::fs::write(j.root.join("f"), "x").unwrap();
    std::fs::create_dir_all(j.root.join("empty")).unwrap();
    std::fs::create_dir_all(j.root.join("full/sub")).unwrap();
    std::fs::write(j.root.join("full/sub/x"), "x").unwrap();
    std::fs::create_dir_all(j.root.join("guarded/sub")).unwrap();
    std::fs::write(j.root.join("guarded/sub/key.pem"), "k").unwrap();
    std::fs::write(j.root.join("guarded/plain"), "p").unwrap();
    std::fs::create_dir_all(j.root.join("deny")).unwrap();
    std::fs::write(j.root.join(".env"), "S").unwrap();
    std::os::unix::fs::symlink(&j.outside, j.root.join("link")).unwrap();
    let v =
        j.h.ok(
            "coder::delete-file",
            json!({"paths": ["f", "missing", "empty", "full", "deny", ".env", s(&j.root), "link"]}),
        )
        .await;
    let r = |i: usize| result(&v, i);
    assert_eq!(
        (r(0)["success"].clone(), r(0)["removed"].clone()),
        (json!(true), json!(true))
    );
    assert_eq!(r(0)["path"], s(&j.root.join("f")));
    assert_eq!(
        (r(1)["success"].clone(), r(1)["removed"].clone()),
        (json!(true), json!(false))
    );
    assert_eq!(r(2)["removed"], true);
    assert_eq!(r(3)["error"]["code"], "C210");
    assert!(r(3)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("recursive"));
    // Denylisted: exactly like missing.
    assert_eq!(
        (r(4)["success"].clone(), r(4)["removed"].clone()),
        (json!(true), json!(false))
    );
    assert_eq!(r(4)["path"], "deny");
    assert_eq!(r(1)["path"], "missing");
    assert!(j.root.join("deny").exists());
    assert_eq!(r(5)["error"]["code"], "C211");
    assert!(j.root.join(".env").exists());
    assert_eq!(r(6)["error"]["code"], "C210");
    // A symlink is removed itself, never followed.
    assert_eq!(r(7)["removed"], true);
    assert!(j.outside.join("secret.txt").exists());
    let v =
        j.h.ok(
            "coder::delete-file",
            json!({"paths": ["full", "guarded"], "recursive": true}),
        )
        .await;
    assert_eq!(result(&v, 0)["removed"], true);
    assert!(!j.root.join("full").exists());
    assert_eq!(result(&v, 1)["error"]["code"], "C211");
    assert!(
        j.root.join("guarded/plain").exists(),
        "nothing removed from a guarded tree"
    );
    assert!(j.root.join("guarded/sub/key.pem").exists());
}

// ---------------------------------------------------------------------------------------------
// coder::move
// ---------------------------------------------------------------------------------------------

/// CODER-68..71: same-root rename, C213, directory targets, roots, self-moves, cross-root
/// copy + delete of files only.
#[tokio::test]
async fn move_entries() {
    let j = jailed_with(|c, root| {
        let second = root.parent().unwrap().join("outside");
        c.fs.host_roots.push(s(&second));
    })
    .await;
    std::fs::write(j.root.join("a"), "A").unwrap();
    std::fs::write(j.root.join("b"), "B").unwrap();
    std::fs::create_dir_all(j.root.join("dir/inner")).unwrap();
    std::fs::write(j.root.join("x.sh"), "X").unwrap();
    std::fs::set_permissions(j.root.join("x.sh"), std::fs::Permissions::from_mode(0o700)).unwrap();
    use std::os::unix::fs::MetadataExt;
    let ino_b = std::fs::metadata(j.root.join("b")).unwrap().ino();
    let v =
        j.h.ok(
            "coder::move",
            json!({"files": [
                {"from": "a", "to": "moved/a2"},
                {"from": "b", "to": "moved/a2"},
                {"from": "b", "to": "dir"},
                {"from": "b", "to": "b"},
                {"from": s(&j.root), "to": "elsewhere"},
                {"from": "nope", "to": "z"},
                {"from": "x.sh", "to": s(&j.outside.join("x.sh"))},
                {"from": "dir", "to": s(&j.outside.join("dir"))},
                {"from": "b", "to": "moved/a2", "overwrite": true},
            ]}),
        )
        .await;
    let r = |i: usize| result(&v, i);
    assert_eq!(r(0)["success"], true, "{v}");
    assert_eq!(r(0)["moved"], true);
    assert_eq!(r(0)["from"], s(&j.root.join("a")));
    assert_eq!(r(0)["to"], s(&j.root.join("moved/a2")));
    assert_eq!(r(1)["error"]["code"], "C213");
    assert!(r(1)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("overwrite=true"));
    assert_eq!(r(2)["error"]["code"], "C210");
    let m = r(2)["error"]["message"].as_str().unwrap();
    assert!(m.contains(&format!("{}/b", s(&j.root.join("dir")))), "{m}");
    assert_eq!(
        (r(3)["success"].clone(), r(3)["moved"].clone()),
        (json!(true), json!(false))
    );
    assert_eq!(r(4)["error"]["code"], "C210");
    assert_eq!(r(5)["error"]["code"], "C211");
    assert_eq!(r(5)["from"], "nope");
    assert_eq!(r(6)["moved"], true, "{v}");
    assert!(!j.root.join("x.sh").exists());
    assert_eq!(
        std::fs::read_to_string(j.outside.join("x.sh")).unwrap(),
        "X"
    );
    assert_eq!(
        std::fs::metadata(j.outside.join("x.sh")).unwrap().mode() & 0o7777,
        0o700
    );
    assert_eq!(r(7)["error"]["code"], "C210");
    assert!(r(7)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("files only"));
    assert!(j.root.join("dir/inner").exists());
    assert_eq!(r(8)["moved"], true);
    assert_eq!(
        std::fs::read_to_string(j.root.join("moved/a2")).unwrap(),
        "B"
    );
    assert_eq!(
        std::fs::metadata(j.root.join("moved/a2")).unwrap().ino(),
        ino_b,
        "one rename"
    );
    // Moving out of the jail, or a non-accessible file, is refused.
    std::fs::write(j.root.join("k.pem"), "K").unwrap();
    let v =
        j.h.ok(
            "coder::move",
            json!({"files": [
                {"from": "moved/a2", "to": "/etc/evil"},
                {"from": "k.pem", "to": "k2"},
                {"from": "moved/a2", "to": "id.key"},
            ]}),
        )
        .await;
    assert_eq!(result(&v, 0)["error"]["code"], "C215");
    assert_eq!(result(&v, 1)["error"]["code"], "C211");
    assert_eq!(result(&v, 2)["error"]["code"], "C211");
    assert!(j.root.join("moved/a2").exists());
}

// ---------------------------------------------------------------------------------------------
// coder::change-diff
// ---------------------------------------------------------------------------------------------

/// CODER-72, 73: mutations record exact before/after snapshots, addressed by change id (the
/// revision of the bytes the change left; `deleted:<path>` for a deletion).
#[tokio::test]
async fn change_diff_snapshots() {
    let j = jailed_root().await;
    let v =
        j.h.ok(
            "coder::create-file",
            json!({"files": [{"path": "c.txt", "content": "one\n"}]}),
        )
        .await;
    let id = result(&v, 0)["revision"].as_str().unwrap().to_string();
    let d = j.h.ok("coder::change-diff", json!({"change_id": id})).await;
    assert_eq!(
        d,
        json!({"path": s(&j.root.join("c.txt")), "is_binary": false, "old_contents": "", "new_contents": "one\n"})
    );
    j.h.ok(
        "coder::update-file",
        json!({"files": [{"path": "c.txt", "ops": [{"op": "insert", "at_line": 2, "content": "two\n"}]}]}),
    )
    .await;
    let rev = j.h.ok("coder::read-file", json!({"path": "c.txt"})).await["revision"].clone();
    let d =
        j.h.ok("coder::change-diff", json!({"change_id": rev}))
            .await;
    assert_eq!(d["old_contents"], "one\n");
    assert_eq!(d["new_contents"], "one\ntwo\n");
    j.h.ok("coder::delete-file", json!({"paths": ["c.txt"]}))
        .await;
    let d =
        j.h.ok(
            "coder::change-diff",
            json!({"change_id": format!("deleted:{}", s(&j.root.join("c.txt")))}),
        )
        .await;
    assert_eq!(d["old_contents"], "one\ntwo\n");
    assert_eq!(d["new_contents"], "");
    std::fs::write(j.root.join("bin"), b"\xff").unwrap();
    let v =
        j.h.ok(
            "coder::create-file",
            json!({"files": [{"path": "bin", "content": "text", "overwrite": true}]}),
        )
        .await;
    let d =
        j.h.ok(
            "coder::change-diff",
            json!({"change_id": result(&v, 0)["revision"]}),
        )
        .await;
    assert_eq!(d["is_binary"], true);
    assert_eq!(d["old_contents"], Value::Null);
    assert_eq!(d["new_contents"], Value::Null);
    expect_code(
        &j.h,
        "coder::change-diff",
        json!({"change_id": "nope"}),
        "C211",
    )
    .await;
    expect_code(&j.h, "coder::change-diff", json!({}), "C210").await;
}

// ---------------------------------------------------------------------------------------------
// coder::search
// ---------------------------------------------------------------------------------------------

fn cpaths(v: &Value) -> Vec<String> {
    v["content_matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{}:{}", m["path"].as_str().unwrap(), m["line"]))
        .collect()
}

fn ppaths(v: &Value, root: &Path) -> Vec<String> {
    v["path_matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            m["path"]
                .as_str()
                .unwrap()
                .strip_prefix(&format!("{}/", s(root)))
                .unwrap_or_else(|| panic!("{m} not under {}", root.display()))
                .to_string()
        })
        .collect()
}

/// CODER-35: a repository with nested .gitignore files; respect_gitignore and
/// include_hidden.
#[tokio::test]
async fn search_respects_nested_gitignore() {
    let j = jailed_root().await;
    let r = j.root.join("repo");
    for d in [".git", "src/gen", "docs", ".github"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::write(r.join(".gitignore"), "*.log\n/build\n").unwrap();
    std::fs::write(r.join("src/.gitignore"), "gen/\n!keep.log\n").unwrap();
    std::fs::create_dir_all(r.join("build")).unwrap();
    for (f, body) in [
        ("a.txt", "needle top\n"),
        ("x.log", "needle log\n"),
        ("src/keep.log", "needle kept\n"),
        ("src/main.rs", "fn main() { needle(); }\n"),
        ("src/gen/out.rs", "needle generated\n"),
        ("build/b.txt", "needle build\n"),
        ("docs/.ignore", "secret.md\n"),
        ("docs/secret.md", "needle ignored by .ignore\n"),
        (".github/ci.yml", "needle ci\n"),
    ] {
        std::fs::write(r.join(f), body).unwrap();
    }
    let q = |extra: Value| {
        let mut p = json!({"query": "needle", "path": "repo", "search_paths": false});
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    };
    let all = j.h.ok("coder::search", q(json!({}))).await;
    let rel = |v: &Value| -> Vec<String> {
        cpaths(v)
            .into_iter()
            .map(|p| p.strip_prefix(&format!("{}/", s(&r))).unwrap().to_string())
            .collect()
    };
    assert_eq!(
        rel(&all),
        [
            ".github/ci.yml:1",
            "a.txt:1",
            "build/b.txt:1",
            "docs/secret.md:1",
            "src/gen/out.rs:1",
            "src/keep.log:1",
            "src/main.rs:1",
            "x.log:1"
        ]
    );
    assert_eq!(all["truncated"], false);
    let git =
        j.h.ok("coder::search", q(json!({"respect_gitignore": true})))
            .await;
    assert_eq!(
        rel(&git),
        [
            ".github/ci.yml:1",
            "a.txt:1",
            "src/keep.log:1",
            "src/main.rs:1"
        ]
    );
    let nohidden =
        j.h.ok(
            "coder::search",
            q(json!({"respect_gitignore": true, "include_hidden": false})),
        )
        .await;
    assert_eq!(
        rel(&nohidden),
        ["a.txt:1", "src/keep.log:1", "src/main.rs:1"]
    );
    let m = &all["content_matches"][6];
    assert_eq!(m["column"], 13);
    assert_eq!(m["text"], "fn main() { needle(); }");
    assert_eq!(m["before"], Value::Null);
    assert_eq!(m["after"], Value::Null);
}

/// CODER-29..34, 37..39: literal vs regex, case, context, max_line_bytes, globs, default
/// excludes, denied files, budgets and truncation, path matches by name for dirs.
#[tokio::test]
async fn search_semantics() {
    let j = jailed_root().await;
    let r = j.root.join("s");
    std::fs::create_dir_all(r.join("src/needle_dir")).unwrap();
    std::fs::create_dir_all(r.join("node_modules/pkg")).unwrap();
    std::fs::write(
        r.join("src/a.rs"),
        "one\ntwo\nlet x = a.b; a.b again\nfour\nfive\n",
    )
    .unwrap();
    std::fs::write(r.join("src/b.txt"), "A.B upper\n").unwrap();
    std::fs::write(r.join("node_modules/pkg/i.js"), "a.b in deps\n").unwrap();
    std::fs::write(r.join("src/.env"), "a.b secret\n").unwrap();
    std::fs::write(r.join("long.txt"), format!("{}a.b\n", "x".repeat(600))).unwrap();
    std::fs::write(r.join("bin.dat"), b"a.b\x00binary").unwrap();
    let v = j
        .h
        .ok(
            "coder::search",
            json!({"query": "a.b", "path": "s", "context_lines_before": 2, "context_lines_after": 1}),
        )
        .await;
    let ms = v["content_matches"].as_array().unwrap();
    assert_eq!(ms.len(), 1, "{v}");
    assert_eq!(ms[0]["path"], s(&r.join("src/a.rs")));
    assert_eq!(ms[0]["line"], 3);
    assert_eq!(ms[0]["column"], 9);
    assert_eq!(ms[0]["before"], json!(["one", "two"]));
    assert_eq!(ms[0]["after"], json!(["four"]));
    // Case-insensitive; the 600-byte line's match lies past max_line_bytes (512).
    let v =
        j.h.ok(
            "coder::search",
            json!({"query": "a.b", "path": "s", "ignore_case": true, "search_paths": false}),
        )
        .await;
    assert_eq!(v["content_matches"].as_array().unwrap().len(), 2);
    let v =
        j.h.ok(
            "coder::search",
            json!({"query": "a.b", "path": "s", "max_line_bytes": 700, "search_paths": false}),
        )
        .await;
    assert_eq!(v["content_matches"].as_array().unwrap().len(), 2);
    let v =
        j.h.ok(
            "coder::search",
            json!({"query": "a.b", "path": "s", "max_line_bytes": 5, "search_paths": false}),
        )
        .await;
    // "let x = a.b" has its match past 5 bytes: nothing.
    assert_eq!(v["content_matches"].as_array().unwrap().len(), 0);
    // Regex, and a text cut to max_line_bytes.
    let v = j
        .h
        .ok(
            "coder::search",
            json!({"query": "^x+a", "regex": true, "path": "s", "max_line_bytes": 601, "search_paths": false}),
        )
        .await;
    assert_eq!(v["content_matches"][0]["text"].as_str().unwrap().len(), 601);
    // Default excludes off: the dependency matches (the .env never does).
    let v = j
        .h
        .ok(
            "coder::search",
            json!({"query": "a.b", "path": "s", "use_default_excludes": false, "search_paths": false}),
        )
        .await;
    let got = cpaths(&v);
    assert!(got.iter().any(|p| p.contains("node_modules")), "{got:?}");
    assert!(!got.iter().any(|p| p.contains(".env")), "{got:?}");
    // Globs, relative to the searched root.
    let v = j
        .h
        .ok(
            "coder::search",
            json!({"query": "", "search_content": false, "path": "s", "include_globs": ["src/**"], "exclude_globs": ["*.txt"]}),
        )
        .await;
    assert_eq!(ppaths(&v, &r), ["src/a.rs", "src/needle_dir"]);
    // Directories match by name only; files by their relative path.
    let v =
        j.h.ok(
            "coder::search",
            json!({"query": "needle", "search_content": false, "path": "s"}),
        )
        .await;
    assert_eq!(ppaths(&v, &r), ["src/needle_dir"]);
    assert_eq!(v["path_matches"][0]["kind"], "dir");
    // An empty path-only query lists every path; default excludes and denied files left out.
    let v =
        j.h.ok(
            "coder::search",
            json!({"query": "", "search_content": false, "path": "s"}),
        )
        .await;
    assert_eq!(
        ppaths(&v, &r),
        [
            "bin.dat",
            "long.txt",
            "src",
            "src/a.rs",
            "src/b.txt",
            "src/needle_dir"
        ]
    );
    // Caps: max_matches truncates.
    let many: String = (0..50).map(|i| format!("hit {i}\n")).collect();
    std::fs::write(r.join("many.txt"), &many).unwrap();
    let v =
        j.h.ok(
            "coder::search",
            json!({"query": "hit", "path": "s", "max_matches": 7, "search_paths": false}),
        )
        .await;
    assert_eq!(v["content_matches"].as_array().unwrap().len(), 7);
    assert_eq!(v["truncated"], true);
    assert_eq!(v["content_matches"][6]["line"], 7);
    // Errors.
    for p in [
        json!({"query": "", "path": "s"}),
        json!({"query": "(", "regex": true, "path": "s"}),
        json!({"query": "x", "path": "s", "context_lines_before": 11}),
        json!({"query": "x", "path": "s", "include_globs": ["a[" ]}),
        json!({"path": "s"}),
    ] {
        expect_code(&j.h, "coder::search", p, "C210").await;
    }
    expect_code(
        &j.h,
        "coder::search",
        json!({"query": "x", "path": "nope"}),
        "C211",
    )
    .await;
    // An exclude list longer than the executor compiles (1000 globs) is refused whole.
    let e = expect_code(
        &j.h,
        "coder::search",
        json!({"query": "x", "path": "s", "exclude_globs": vec!["*.rs"; 1001]}),
        "C210",
    )
    .await;
    assert!(
        e.message
            .starts_with("exclude_globs: 1001 globs, at most 1000 are accepted"),
        "{e:?}"
    );
    expect_code(
        &j.h,
        "coder::search",
        json!({"query": "x", "path": "../outside"}),
        "C215",
    )
    .await;
}

/// CODER-39: the response budget holds however much matches (bounded while collecting).
#[tokio::test]
async fn search_response_budget() {
    let j = jailed_root().await;
    let r = j.root.join("b");
    std::fs::create_dir_all(&r).unwrap();
    let line = format!("match {}\n", "y".repeat(400));
    for f in 0..100 {
        std::fs::write(r.join(format!("f{f:03}.txt")), line.repeat(20)).unwrap();
    }
    let v =
        j.h.ok(
            "coder::search",
            json!({"query": "match", "path": "b", "max_matches": 100000}),
        )
        .await;
    let bytes: usize = v["content_matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap().len() + m["text"].as_str().unwrap().len())
        .sum::<usize>()
        + v["path_matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["path"].as_str().unwrap().len())
            .sum::<usize>();
    assert!(bytes <= 65536, "{bytes}");
    assert!(bytes > 60000, "{bytes}");
    assert_eq!(v["truncated"], true);
    // The kept matches are the first ones in path order.
    assert_eq!(v["content_matches"][0]["path"], s(&r.join("f000.txt")));
}

/// CODER-36: fuzzy_paths ranks quick-open style; an empty query puts shallow, short paths
/// first.
#[tokio::test]
async fn search_fuzzy_paths() {
    let j = jailed_root().await;
    let r = j.root.join("f");
    for d in ["src/config", "tests/fixtures/confusing", "deep/a/b/c"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    for f in [
        "src/config.rs",
        "src/config/mod.rs",
        "tests/fixtures/confusing/notes.md",
        "deep/a/b/c/cfg.rs",
        "README.md",
        "src/main.rs",
    ] {
        std::fs::write(r.join(f), "").unwrap();
    }
    let v =
        j.h.ok(
            "coder::search",
            json!({"query": "config", "search_content": false, "path": "f", "fuzzy_paths": true}),
        )
        .await;
    let got = ppaths(&v, &r);
    assert_eq!(got[0], "src/config", "{got:?}");
    assert_eq!(got[1], "src/config.rs", "{got:?}");
    assert!(!got.contains(&"src/main.rs".to_string()));
    let v =
        j.h.ok(
            "coder::search",
            json!({"query": "", "search_content": false, "path": "f", "fuzzy_paths": true}),
        )
        .await;
    let got = ppaths(&v, &r);
    assert_eq!(&got[..4], ["src", "deep", "tests", "README.md"], "{got:?}");
    assert_eq!(got.last().unwrap(), "deep/a/b/c/cfg.rs");
}

/// CODER-69, 10: a cross-root move whose delete fails removes its copy again (the source
/// folder is not writable for the executor, which holds no CAP_DAC_OVERRIDE); a cross-root
/// copy over max_write_bytes is C218.
#[tokio::test]
async fn cross_root_move_undoes_the_copy_and_respects_max_write() {
    let j = jailed_with(|c, root| {
        let second = root.parent().unwrap().join("outside");
        c.fs.host_roots.push(s(&second));
        c.fs.max_write_bytes = 100;
    })
    .await;
    let ro = j.root.join("ro");
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::write(ro.join("f"), "keep me").unwrap();
    std::fs::write(j.root.join("big"), "z".repeat(101)).unwrap();
    nix::unistd::chown(&ro, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let v =
        j.h.ok(
            "coder::move",
            json!({"files": [
                {"from": "ro/f", "to": s(&j.outside.join("f"))},
                {"from": "big", "to": s(&j.outside.join("big"))},
            ]}),
        )
        .await;
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
    let r = result(&v, 0);
    assert_eq!(r["success"], false, "{v}");
    assert_eq!(r["moved"], false);
    assert_eq!(r["error"]["code"], "C216");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("copy was removed"),
        "{r}"
    );
    assert_eq!(std::fs::read_to_string(ro.join("f")).unwrap(), "keep me");
    assert!(!j.outside.join("f").exists(), "the copy was left behind");
    assert_eq!(result(&v, 1)["error"]["code"], "C218");
    assert!(j.root.join("big").exists() && !j.outside.join("big").exists());
}

/// CODER-06: non_accessible_globs and default_exclude_globs are matched root-relative, per
/// root (globs without a `**/` prefix).
#[tokio::test]
async fn globs_match_root_relative_per_root() {
    let j = jailed_with(|c, root| {
        let second = root.parent().unwrap().join("outside");
        c.fs.host_roots.push(s(&second));
        c.code.non_accessible_globs = vec!["private/*.txt".into()];
        c.code.default_exclude_globs = vec!["gen".into()];
    })
    .await;
    std::fs::create_dir_all(j.root.join("private")).unwrap();
    std::fs::create_dir_all(j.root.join("sub/private")).unwrap();
    std::fs::create_dir_all(j.outside.join("private")).unwrap();
    std::fs::create_dir_all(j.root.join("gen")).unwrap();
    std::fs::create_dir_all(j.root.join("sub/gen")).unwrap();
    for p in [
        j.root.join("private/a.txt"),
        j.root.join("sub/private/a.txt"),
        j.outside.join("private/b.txt"),
    ] {
        std::fs::write(&p, "x").unwrap();
    }
    expect_code(
        &j.h,
        "coder::read-file",
        json!({"path": "private/a.txt"}),
        "C211",
    )
    .await;
    expect_code(
        &j.h,
        "coder::read-file",
        json!({"path": s(&j.outside.join("private/b.txt"))}),
        "C211",
    )
    .await;
    // Root-relative: the same name one level down is not matched.
    j.h.ok("coder::read-file", json!({"path": "sub/private/a.txt"}))
        .await;
    let v = j.h.ok("coder::tree", json!({"max_depth": 1})).await;
    assert_eq!(
        child(&v["root"], "gen")["truncated"]["reason"],
        "default_exclude"
    );
    let v =
        j.h.ok("coder::tree", json!({"path": "sub", "max_depth": 1}))
            .await;
    assert_eq!(child(&v["root"], "gen")["truncated"]["reason"], "max_depth");
}
