//! `shell::fs::*` and `shell::workspace::*` through the real executor process (no engine):
//! path policy, symlink escapes and races, redaction, modes, caps, every op's response shape,
//! atomic writes, and the workspace picker. Streamed reads/writes need an engine and live in
//! `fs_engine.rs`; here file contents are read back with `shell::workspace::read-bytes`.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use common::*;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::WireError;
use serde_json::{json, Value};

fn b64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v["content"].as_str().expect("content"))
        .expect("base64")
}

/// The whole file through `workspace::read-bytes`, chunk by chunk.
async fn read_all(h: &Harness, path: &str) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    loop {
        let r = h
            .call(
                "shell::workspace::read-bytes",
                json!({"path": path, "offset": out.len()}),
            )
            .await?;
        out.extend(b64(&r));
        if r["eof"] == true {
            return Ok(out);
        }
        assert!(
            r["length"].as_u64().unwrap() > 0,
            "no progress and no eof: {r}"
        );
    }
}

/// Like `Harness::ok`, without echoing a (large) payload on failure.
async fn quiet_ok(h: &Harness, function: &str, payload: Value) -> Value {
    match h.call(function, payload).await {
        Ok(v) => v,
        Err(e) => panic!("{function} failed: {e:?}"),
    }
}

// ---------------------------------------------------------------- ls / stat

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_and_stat_report_fs_entries() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    let root = &j.root;
    std::fs::create_dir(root.join("sub")).unwrap();
    std::fs::write(root.join("file.txt"), "hello").unwrap();
    std::fs::set_permissions(
        root.join("file.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::os::unix::fs::symlink("sub", root.join("link-in")).unwrap();
    std::os::unix::fs::symlink(&j.outside, root.join("link-out")).unwrap();
    std::os::unix::fs::symlink("nowhere", root.join("dangling")).unwrap();
    std::fs::write(root.join(".env"), "TOKEN=1").unwrap();

    let r = h.ok("shell::fs::ls", json!({"path": "."})).await;
    let entries = r["entries"].as_array().unwrap();
    let got: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    // Sorted by name; the protected `.env` is not listed.
    assert_eq!(
        got,
        ["dangling", "file.txt", "link-in", "link-out", "sub"],
        "{r}"
    );
    let by = |n: &str| entries.iter().find(|e| e["name"] == n).unwrap().clone();
    let f = by("file.txt");
    let md = std::fs::metadata(root.join("file.txt")).unwrap();
    assert_eq!(
        f,
        json!({"name": "file.txt", "is_dir": false, "is_symlink": false, "mode": "0640", "size": 5, "mtime": md.mtime()})
    );
    assert_eq!(by("sub")["is_dir"], true);
    assert_eq!(by("sub")["is_symlink"], false);
    assert_eq!(by("link-in")["is_symlink"], true);
    assert_eq!(
        by("link-in")["is_dir"],
        true,
        "a link to a directory inside the jail follows its target"
    );
    assert_eq!(by("link-out")["is_symlink"], true);
    assert_eq!(
        by("link-out")["is_dir"],
        false,
        "a link leading outside is never followed"
    );
    assert_eq!(by("dangling")["is_symlink"], true);
    for e in entries {
        let m = e["mode"].as_str().unwrap();
        assert!(
            m.len() == 4 && m.bytes().all(|b| (b'0'..=b'7').contains(&b)),
            "{e}"
        );
        assert!(e["mtime"].is_i64() && e["size"].is_u64(), "{e}");
    }

    // stat: the path itself (lstat) for is_symlink, the target for is_dir/size.
    let st = h.ok("shell::fs::stat", json!({"path": "file.txt"})).await;
    assert_eq!(st, f);
    let st = h.ok("shell::fs::stat", json!({"path": "link-in"})).await;
    assert_eq!(
        (
            st["name"].as_str(),
            st["is_symlink"].as_bool(),
            st["is_dir"].as_bool()
        ),
        (Some("link-in"), Some(true), Some(true))
    );
    let st = h.ok("shell::fs::stat", json!({"path": "link-out"})).await;
    assert_eq!(
        (st["is_symlink"].as_bool(), st["is_dir"].as_bool()),
        (Some(true), Some(false)),
        "{st}"
    );
    let st = h.ok("shell::fs::stat", json!({"path": "."})).await;
    assert_eq!(st["is_dir"], true);
    let st = h.ok("shell::fs::stat", json!({"path": s(root)})).await;
    assert_eq!(st["is_dir"], true);

    // ls on a symlinked directory inside the jail lists the target.
    let r = h.ok("shell::fs::ls", json!({"path": "link-in"})).await;
    assert_eq!(r["entries"], json!([]));

    // Errors.
    for (function, payload, code) in [
        ("shell::fs::ls", json!({"path": "file.txt"}), "S212"),
        ("shell::fs::ls", json!({"path": "missing"}), "S211"),
        ("shell::fs::ls", json!({"path": "link-out"}), "S215"),
        ("shell::fs::ls", json!({"path": ".."}), "S215"),
        ("shell::fs::ls", json!({"path": ""}), "S210"),
        ("shell::fs::ls", json!({"path": 7}), "S210"),
        ("shell::fs::ls", json!({}), "S210"),
        ("shell::fs::stat", json!({"path": "missing"}), "S211"),
        (
            "shell::fs::stat",
            json!({"path": "link-out/secret.txt"}),
            "S215",
        ),
        (
            "shell::fs::stat",
            json!({"path": s(&j.outside.join("secret.txt"))}),
            "S215",
        ),
        ("shell::fs::stat", json!({"path": ".env"}), "S211"),
    ] {
        expect_code(&h, function, payload, code).await;
    }
    // A filter list longer than the executor compiles (1000 globs) is refused whole.
    for (function, payload, field) in [
        (
            "shell::fs::grep",
            json!({"path": ".", "pattern": "x", "include_glob": vec!["*.rs"; 1001]}),
            "include_glob",
        ),
        (
            "shell::fs::sed",
            json!({"path": ".", "pattern": "x", "replacement": "y", "exclude_glob": vec!["*.rs"; 1001]}),
            "exclude_glob",
        ),
    ] {
        let e = expect_code(&h, function, payload, "S210").await;
        assert!(
            e.message
                .starts_with(&format!("{field}: 1001 globs, at most 1000 are accepted")),
            "{function}: {e:?}"
        );
    }
    j.outside_untouched();
}

// ---------------------------------------------------------------- mkdir

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mkdir_creates_reports_and_is_idempotent_with_parents() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    let root = &j.root;

    let r = h.ok("shell::fs::mkdir", json!({"path": "a"})).await;
    assert_eq!(
        r,
        json!({"created": true, "path": s(&root.join("a")), "already_existed": false})
    );
    assert!(root.join("a").is_dir());
    assert_eq!(mode_of(&root.join("a")), 0o755);

    // Existing path without parents: S213, for a directory and for a file.
    expect_code(&h, "shell::fs::mkdir", json!({"path": "a"}), "S213").await;
    std::fs::write(root.join("f"), "x").unwrap();
    expect_code(&h, "shell::fs::mkdir", json!({"path": "f"}), "S213").await;
    expect_code(
        &h,
        "shell::fs::mkdir",
        json!({"path": "f", "parents": true}),
        "S213",
    )
    .await;

    // parents: true is idempotent.
    let r = h
        .ok("shell::fs::mkdir", json!({"path": "a", "parents": true}))
        .await;
    assert_eq!(
        r,
        json!({"created": false, "path": s(&root.join("a")), "already_existed": true})
    );

    // Missing parent without parents: S211 and nothing created.
    expect_code(&h, "shell::fs::mkdir", json!({"path": "x/y/z"}), "S211").await;
    assert!(!root.join("x").exists());
    // With parents: every level, and an exact mode despite the umask.
    let r = h
        .ok(
            "shell::fs::mkdir",
            json!({"path": "x/y/z", "parents": true, "mode": "0700"}),
        )
        .await;
    assert_eq!(r["created"], true);
    assert!(root.join("x/y/z").is_dir());
    assert_eq!(mode_of(&root.join("x/y/z")), 0o700);
    let r = h
        .ok(
            "shell::fs::mkdir",
            json!({"path": "x/y/z", "parents": true}),
        )
        .await;
    assert_eq!(r["already_existed"], true);
    let r = h
        .ok("shell::fs::mkdir", json!({"path": "odd", "mode": "777"}))
        .await;
    assert_eq!(r["created"], true);
    assert_eq!(mode_of(&root.join("odd")), 0o777);

    // Modes: bad octal and special bits are S210; nothing is created.
    for m in ["", "abc", "0999", "77777", "-1", "0o755", "rwx"] {
        let e = expect_code(
            &h,
            "shell::fs::mkdir",
            json!({"path": "bad", "mode": m}),
            "S210",
        )
        .await;
        assert!(e.message.contains("octal"), "{m}: {e:?}");
    }
    for m in ["4755", "2755", "1777", "6755", "7777"] {
        expect_code(
            &h,
            "shell::fs::mkdir",
            json!({"path": "bad", "mode": m}),
            "S210",
        )
        .await;
    }
    expect_code(
        &h,
        "shell::fs::mkdir",
        json!({"path": "bad", "mode": 755}),
        "S210",
    )
    .await;
    assert!(!root.join("bad").exists());

    // Escapes.
    for payload in [
        json!({"path": "../evil"}),
        json!({"path": s(&j.outside.join("evil"))}),
        json!({"path": "../evil/deeper", "parents": true}),
    ] {
        expect_code(&h, "shell::fs::mkdir", payload, "S215").await;
    }
    j.outside_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_bits_need_allow_special_bits() {
    let j = Jail::new();
    let mut c = jailed(&j.root);
    c.fs.allow_special_bits = true;
    let h = Harness::new(c).await;
    let root = &j.root;
    let r = h
        .ok(
            "shell::fs::mkdir",
            json!({"path": "sticky", "mode": "1777"}),
        )
        .await;
    assert_eq!(r["created"], true);
    assert_eq!(mode_of(&root.join("sticky")), 0o1777);
    h.ok(
        "shell::fs::write",
        json!({"path": "suid", "content": "#!/bin/sh\n", "mode": "4755"}),
    )
    .await;
    assert_eq!(mode_of(&root.join("suid")), 0o4755);
    h.ok("shell::fs::chmod", json!({"path": "suid", "mode": "2750"}))
        .await;
    assert_eq!(mode_of(&root.join("suid")), 0o2750);
    let st = h.ok("shell::fs::stat", json!({"path": "suid"})).await;
    assert_eq!(st["mode"], "2750");
    // Still only octal strings.
    expect_code(
        &h,
        "shell::fs::chmod",
        json!({"path": "suid", "mode": "8000"}),
        "S210",
    )
    .await;
    expect_code(
        &h,
        "shell::fs::chmod",
        json!({"path": "suid", "mode": "17777"}),
        "S210",
    )
    .await;

    // Without the opt-in, every mode-taking call refuses them.
    drop(h);
    let h = Harness::new(jailed(&j.root)).await;
    for (f, p) in [
        ("shell::fs::mkdir", json!({"path": "s2", "mode": "2755"})),
        ("shell::fs::chmod", json!({"path": "suid", "mode": "4755"})),
        (
            "shell::fs::chmod",
            json!({"path": "suid", "mode": "1644", "recursive": true}),
        ),
        (
            "shell::fs::write",
            json!({"path": "w", "content": "x", "mode": "4644"}),
        ),
        (
            "shell::fs::write",
            json!({"files": [{"path": "w1", "content": "x"}, {"path": "w2", "content": "x", "mode": "6755"}]}),
        ),
    ] {
        let e = expect_code(&h, f, p.clone(), "S210").await;
        assert!(
            e.message.contains("setuid") || e.message.contains("special"),
            "{f} {p}: {e:?}"
        );
    }
    assert!(!root.join("s2").exists() && !root.join("w").exists());
    assert!(
        !root.join("w1").exists(),
        "a batch with a bad mode must write nothing"
    );
    assert_eq!(mode_of(&root.join("suid")), 0o2750);
}

// ---------------------------------------------------------------- rm

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rm_removes_files_and_trees_and_refuses_roots() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    let root = &j.root;
    std::fs::write(root.join("f"), "x").unwrap();
    std::fs::create_dir_all(root.join("tree/a/b")).unwrap();
    std::fs::write(root.join("tree/a/b/leaf"), "x").unwrap();
    std::fs::create_dir(root.join("empty")).unwrap();
    std::os::unix::fs::symlink(&j.outside, root.join("tree/out")).unwrap();
    std::os::unix::fs::symlink(&j.outside, root.join("link-out")).unwrap();

    let r = h.ok("shell::fs::rm", json!({"path": "f"})).await;
    assert_eq!(
        r,
        json!({"removed": true, "path": s(&root.join("f")), "was_present": true})
    );
    assert!(!root.join("f").exists());
    expect_code(&h, "shell::fs::rm", json!({"path": "f"}), "S211").await;
    expect_code(
        &h,
        "shell::fs::rm",
        json!({"path": "missing/deeper"}),
        "S211",
    )
    .await;

    let r = h.ok("shell::fs::rm", json!({"path": "empty"})).await;
    assert_eq!(r["removed"], true);
    let e = expect_code(&h, "shell::fs::rm", json!({"path": "tree"}), "S214").await;
    assert!(e.message.contains("not empty"), "{e:?}");
    assert!(root.join("tree/a/b/leaf").exists());

    // A recursive rm never follows links: the outside directory survives.
    let r = h
        .ok("shell::fs::rm", json!({"path": "tree", "recursive": true}))
        .await;
    assert_eq!(
        r,
        json!({"removed": true, "path": s(&root.join("tree")), "was_present": true})
    );
    assert!(!root.join("tree").exists());
    // A link to the outside is removed as a link.
    h.ok(
        "shell::fs::rm",
        json!({"path": "link-out", "recursive": true}),
    )
    .await;
    assert!(!root.join("link-out").exists());
    j.outside_untouched();

    // The jail root itself, however it is spelled.
    for p in [
        ".",
        "./",
        s(root).as_str(),
        &format!("{}/", s(root)),
        &format!("{}//.", s(root)),
        "sub/..",
        "a/../",
    ] {
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(root.join("a")).unwrap();
        let e = expect_code(
            &h,
            "shell::fs::rm",
            json!({"path": p, "recursive": true}),
            "S210",
        )
        .await;
        assert!(
            e.message.contains("root") || e.message.contains("entry"),
            "{p}: {e:?}"
        );
        assert!(root.is_dir());
        assert!(root.join("sub").is_dir());
    }
    for (payload, code) in [
        (json!({"path": ".."}), "S215"),
        (json!({"path": "../outside/secret.txt"}), "S215"),
        (json!({"path": s(&j.outside)}), "S215"),
        (json!({"path": ""}), "S210"),
    ] {
        expect_code(&h, "shell::fs::rm", payload, code).await;
    }
    j.outside_untouched();
}

// ---------------------------------------------------------------- chmod

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chmod_changes_modes_owners_and_never_follows_links() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    let root = &j.root;
    std::fs::create_dir_all(root.join("d/e")).unwrap();
    std::fs::write(root.join("d/f1"), "1").unwrap();
    std::fs::write(root.join("d/e/f2"), "2").unwrap();
    std::os::unix::fs::symlink(j.outside.join("secret.txt"), root.join("d/out-file")).unwrap();
    std::os::unix::fs::symlink(&j.outside, root.join("d/out-dir")).unwrap();
    std::os::unix::fs::symlink("f1", root.join("d/in-link")).unwrap();
    std::fs::write(root.join("single"), "x").unwrap();

    let r = h
        .ok(
            "shell::fs::chmod",
            json!({"path": "single", "mode": "0600"}),
        )
        .await;
    assert_eq!(
        r,
        json!({"entries_changed": 1, "path": s(&root.join("single")), "recursive": false})
    );
    assert_eq!(mode_of(&root.join("single")), 0o600);

    // Recursive: d, e, f1, f2 — the three links are skipped, and the outside file is untouched.
    let r = h
        .ok(
            "shell::fs::chmod",
            json!({"path": "d", "mode": "0700", "recursive": true}),
        )
        .await;
    assert_eq!(
        r,
        json!({"entries_changed": 4, "path": s(&root.join("d")), "recursive": true})
    );
    for p in ["d", "d/e", "d/f1", "d/e/f2"] {
        assert_eq!(mode_of(&root.join(p)), 0o700, "{p}");
    }
    j.outside_untouched();
    assert_eq!(mode_of(&j.outside), 0o755);

    // A symlink given as the path itself: S212, nothing changed either side.
    for p in ["d/out-file", "d/out-dir", "d/in-link"] {
        expect_code(
            &h,
            "shell::fs::chmod",
            json!({"path": p, "mode": "0777"}),
            "S212",
        )
        .await;
    }
    assert_eq!(mode_of(&root.join("d/f1")), 0o700);
    j.outside_untouched();
    // Through a link leading outside: S215.
    expect_code(
        &h,
        "shell::fs::chmod",
        json!({"path": "d/out-dir/secret.txt", "mode": "0777"}),
        "S215",
    )
    .await;
    j.outside_untouched();

    // chown: to our own ids it always works. To other ids the executor needs CAP_CHOWN (it
    // drops every capability unless configured otherwise): either it works, or it is
    // "not accessible" (S211) and nothing changed.
    let (uid, gid) = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    let r = h
        .ok(
            "shell::fs::chmod",
            json!({"path": "d", "mode": "0750", "uid": uid, "gid": gid, "recursive": true}),
        )
        .await;
    assert_eq!(r["entries_changed"], 4);
    for p in ["d", "d/e", "d/f1", "d/e/f2"] {
        let md = std::fs::symlink_metadata(root.join(p)).unwrap();
        assert_eq!(
            (md.uid(), md.gid(), md.mode() & 0o7777),
            (uid, gid, 0o750),
            "{p}"
        );
    }
    match h
        .call(
            "shell::fs::chmod",
            json!({"path": "d", "mode": "0750", "uid": 4321, "gid": 8765, "recursive": true}),
        )
        .await
    {
        Ok(r) => {
            assert_eq!(r["entries_changed"], 4);
            for p in ["d", "d/e", "d/f1", "d/e/f2"] {
                let md = std::fs::symlink_metadata(root.join(p)).unwrap();
                assert_eq!(
                    (md.uid(), md.gid(), md.mode() & 0o7777),
                    (4321, 8765, 0o750),
                    "{p}"
                );
            }
            let md = std::fs::symlink_metadata(root.join("d/out-file")).unwrap();
            assert_ne!(md.uid(), 4321, "a link inside the walk was chowned");
        }
        Err(e) => {
            // Refused before anything changed: the mode is still 0750 from above... and the
            // executor says why.
            assert_eq!(e.code, "S210", "{e:?}");
            assert!(e.message.contains("CAP_CHOWN"), "{e:?}");
            assert_eq!(std::fs::metadata(root.join("d")).unwrap().uid(), uid);
        }
    }
    let md = std::fs::metadata(j.outside.join("secret.txt")).unwrap();
    assert_ne!(md.uid(), 4321, "the outside file was chowned");
    let r = h
        .ok(
            "shell::fs::chmod",
            json!({"path": "single", "mode": "0640", "gid": gid}),
        )
        .await;
    assert_eq!(r["entries_changed"], 1);
    assert_eq!(std::fs::metadata(root.join("single")).unwrap().gid(), gid);
    for (payload, code) in [
        (json!({"path": "missing", "mode": "0644"}), "S211"),
        (json!({"path": "single"}), "S210"),
        (json!({"path": "single", "mode": "0644", "uid": -1}), "S210"),
    ] {
        expect_code(&h, "shell::fs::chmod", payload, code).await;
    }
    j.outside_untouched();
}

// ---------------------------------------------------------------- mv

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mv_moves_refuses_overwrites_and_escapes() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    let root = &j.root;
    std::fs::write(root.join("a"), "A").unwrap();
    std::fs::write(root.join("b"), "B").unwrap();
    std::fs::create_dir(root.join("dir")).unwrap();
    std::os::unix::fs::symlink(&j.outside, root.join("out")).unwrap();

    let r = h
        .ok("shell::fs::mv", json!({"src": "a", "dst": "dir/a2"}))
        .await;
    assert_eq!(
        r,
        json!({"moved": true, "src": s(&root.join("a")), "dst": s(&root.join("dir/a2")), "overwrote": false})
    );
    same_bytes(std::fs::read(root.join("dir/a2")).unwrap(), b"A", "");

    let e = expect_code(
        &h,
        "shell::fs::mv",
        json!({"src": "dir/a2", "dst": "b"}),
        "S213",
    )
    .await;
    assert!(e.message.contains('b'), "{e:?}");
    same_bytes(std::fs::read(root.join("b")).unwrap(), b"B", "");
    same_bytes(std::fs::read(root.join("dir/a2")).unwrap(), b"A", "");
    expect_code(
        &h,
        "shell::fs::mv",
        json!({"src": "b", "dst": "dir"}),
        "S213",
    )
    .await;

    let r = h
        .ok(
            "shell::fs::mv",
            json!({"src": "dir/a2", "dst": "b", "overwrite": true}),
        )
        .await;
    assert_eq!(r["overwrote"], true);
    same_bytes(std::fs::read(root.join("b")).unwrap(), b"A", "");
    assert!(!root.join("dir/a2").exists());

    for (payload, code) in [
        (json!({"src": "missing", "dst": "x"}), "S211"),
        (json!({"src": "b", "dst": "missing-dir/x"}), "S211"),
        // Both ends are confined.
        (json!({"src": "b", "dst": "../stolen"}), "S215"),
        (json!({"src": "b", "dst": "out/stolen"}), "S215"),
        (
            json!({"src": "b", "dst": s(&j.outside.join("stolen"))}),
            "S215",
        ),
        (json!({"src": "out/secret.txt", "dst": "got"}), "S215"),
        (
            json!({"src": "../outside/secret.txt", "dst": "got"}),
            "S215",
        ),
    ] {
        expect_code(&h, "shell::fs::mv", payload, code).await;
    }
    assert!(root.join("b").exists() && !root.join("got").exists());
    // Moving the link itself is fine: it stays a link, inside.
    h.ok("shell::fs::mv", json!({"src": "out", "dst": "dir/out2"}))
        .await;
    assert!(std::fs::symlink_metadata(root.join("dir/out2"))
        .unwrap()
        .file_type()
        .is_symlink());
    // A root cannot be moved; a directory cannot go into itself.
    for payload in [
        json!({"src": ".", "dst": "x"}),
        json!({"src": "dir", "dst": "dir/inner"}),
        json!({"src": "", "dst": "x"}),
        json!({"src": "b"}),
    ] {
        expect_code(&h, "shell::fs::mv", payload, "S210").await;
    }
    j.outside_untouched();
}

// ---------------------------------------------------------------- write (inline, batch)

const MULTI_SCRIPT: &str = "English, Ελληνικά, Русский, עברית, العربية, हिन्दी, 中文, 日本語, 한국어, ไทย, emoji 🦀🚀👩‍👩‍👧, combining é, RTL\u{200f}mark, NUL-free \u{7f}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_and_batch_writes() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    let root = &j.root;

    let r = h
        .ok(
            "shell::fs::write",
            json!({"path": "utf8.txt", "content": MULTI_SCRIPT}),
        )
        .await;
    assert_eq!(
        r,
        json!({"bytes_written": MULTI_SCRIPT.len(), "path": s(&root.join("utf8.txt")), "files": []})
    );
    same_bytes(
        std::fs::read(root.join("utf8.txt")).unwrap(),
        MULTI_SCRIPT.as_bytes(),
        "",
    );
    same_bytes(
        read_all(&h, "utf8.txt").await.unwrap(),
        MULTI_SCRIPT.as_bytes(),
        "",
    );
    assert_eq!(mode_of(&root.join("utf8.txt")), 0o644, "default mode");

    // Empty content, and overwriting shrinks the file.
    let r = h
        .ok(
            "shell::fs::write",
            json!({"path": "utf8.txt", "content": ""}),
        )
        .await;
    assert_eq!(r["bytes_written"], 0);
    same_bytes(std::fs::read(root.join("utf8.txt")).unwrap(), b"", "");
    same_bytes(read_all(&h, "utf8.txt").await.unwrap(), b"", "");

    // 512 KiB and 3 MiB inline.
    for size in [512 * 1024, 3 * 1024 * 1024 + 17] {
        let text: String = (0..size)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let r = quiet_ok(
            &h,
            "shell::fs::write",
            json!({"path": format!("big-{size}"), "content": text}),
        )
        .await;
        assert_eq!(r["bytes_written"], size);
        same_bytes(
            read_all(&h, &format!("big-{size}")).await.unwrap(),
            text.as_bytes(),
            "",
        );
    }

    // mode and parents.
    let r = h
        .ok(
            "shell::fs::write",
            json!({"path": "p/q/r.sh", "content": "#!/bin/sh\n", "mode": "0750", "parents": true}),
        )
        .await;
    assert_eq!(r["path"], s(&root.join("p/q/r.sh")));
    assert_eq!(mode_of(&root.join("p/q/r.sh")), 0o750);
    expect_code(
        &h,
        "shell::fs::write",
        json!({"path": "n/o/p", "content": "x"}),
        "S211",
    )
    .await;
    expect_code(
        &h,
        "shell::fs::write",
        json!({"path": "n/o/p", "content": "x", "parents": false}),
        "S211",
    )
    .await;
    assert!(!root.join("n").exists());

    // Batch: per-file results in order, path "".
    let r = h
        .ok(
            "shell::fs::write",
            json!({"files": [
                {"path": "batch/one", "content": "1", "parents": true},
                {"path": "batch/two", "content": "22", "mode": "0600"},
                {"path": "utf8-2.txt", "content": MULTI_SCRIPT},
            ]}),
        )
        .await;
    assert_eq!(
        r,
        json!({"bytes_written": 3 + MULTI_SCRIPT.len(), "path": "", "files": [
            {"path": s(&root.join("batch/one")), "bytes_written": 1},
            {"path": s(&root.join("batch/two")), "bytes_written": 2},
            {"path": s(&root.join("utf8-2.txt")), "bytes_written": MULTI_SCRIPT.len()},
        ]})
    );
    assert_eq!(mode_of(&root.join("batch/two")), 0o600);
    assert_eq!(mode_of(&root.join("batch/one")), 0o644);
    // A batch of one is still a batch.
    let r = h
        .ok(
            "shell::fs::write",
            json!({"files": [{"path": "solo", "content": "s"}]}),
        )
        .await;
    assert_eq!(
        r,
        json!({"bytes_written": 1, "path": "", "files": [{"path": s(&root.join("solo")), "bytes_written": 1}]})
    );

    // Form errors: all S210, nothing written.
    for p in [
        json!({"files": []}),
        json!({"files": [], "path": "x"}),
        json!({"path": "x1", "content": "a", "files": [{"path": "x2", "content": "b"}]}),
        json!({"content": "a", "files": [{"path": "x2", "content": "b"}]}),
        json!({"mode": "0644", "files": [{"path": "x2", "content": "b"}]}),
        json!({"parents": true, "files": [{"path": "x2", "content": "b"}]}),
        json!({"path": "x1"}),
        json!({"content": "a"}),
        json!({}),
        json!({"path": "", "content": "a"}),
        json!({"files": [{"path": "", "content": "a"}]}),
        json!({"files": [{"path": "x2"}]}),
        json!({"path": "x1", "content": 5}),
        json!({"path": "x1", "content": {"channel_id": 1}}),
        json!({"path": "x1", "content": "a", "mode": "9"}),
    ] {
        expect_code(&h, "shell::fs::write", p, "S210").await;
    }
    assert!(!root.join("x1").exists() && !root.join("x2").exists());

    // Wrong type and escapes.
    std::fs::create_dir(root.join("adir")).unwrap();
    for (payload, code) in [
        (json!({"path": "adir", "content": "x"}), "S212"),
        (json!({"path": "../evil", "content": "x"}), "S215"),
        (
            json!({"path": s(&j.outside.join("secret.txt")), "content": "x"}),
            "S215",
        ),
        (
            json!({"path": "../outside/new/deeper", "content": "x", "parents": true}),
            "S215",
        ),
    ] {
        expect_code(&h, "shell::fs::write", payload, code).await;
    }
    j.outside_untouched();
    // No temp files anywhere.
    let leftovers: Vec<_> = walk(root)
        .into_iter()
        .filter(|p| p.file_name().unwrap().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_replaces_a_symlink_instead_of_following_it() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    let root = &j.root;
    std::os::unix::fs::symlink(j.outside.join("secret.txt"), root.join("abs-link")).unwrap();
    std::os::unix::fs::symlink("../outside/secret.txt", root.join("rel-link")).unwrap();
    std::os::unix::fs::symlink(j.outside.join("not-yet"), root.join("dangling")).unwrap();
    for p in ["abs-link", "rel-link", "dangling"] {
        let r = h
            .ok("shell::fs::write", json!({"path": p, "content": "inside"}))
            .await;
        assert_eq!(r["path"], s(&root.join(p)));
        let md = std::fs::symlink_metadata(root.join(p)).unwrap();
        assert!(md.file_type().is_file(), "{p} is still a link");
        same_bytes(std::fs::read(root.join(p)).unwrap(), b"inside", "");
    }
    j.outside_untouched();
    // mkdir onto a dangling link to the outside: exists (the link), nothing created there.
    std::os::unix::fs::symlink(j.outside.join("newdir"), root.join("dl2")).unwrap();
    for (function, payload, code) in [
        ("shell::fs::mkdir", json!({"path": "dl2"}), "S213"),
        (
            "shell::fs::mkdir",
            json!({"path": "dl2", "parents": true}),
            "S213",
        ),
        (
            "shell::fs::mkdir",
            json!({"path": "dl2/x", "parents": true}),
            "S215",
        ),
        (
            "shell::fs::write",
            json!({"path": "dl2/x", "content": "x", "parents": true}),
            "S215",
        ),
    ] {
        expect_code(&h, function, payload, code).await;
    }
    j.outside_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_caps_are_s218_and_zero_means_unlimited() {
    let j = Jail::new();
    let mut c = jailed(&j.root);
    c.fs.max_write_bytes = 1000;
    c.fs.max_read_bytes = 1000;
    let h = Harness::new(c).await;
    let root = &j.root;
    h.ok(
        "shell::fs::write",
        json!({"path": "exact", "content": "x".repeat(1000)}),
    )
    .await;
    let e = expect_code(
        &h,
        "shell::fs::write",
        json!({"path": "over", "content": "x".repeat(1001)}),
        "S218",
    )
    .await;
    assert!(e.message.contains("max_write_bytes"), "{e:?}");
    assert!(!root.join("over").exists());
    // In a batch, an oversized file fails the call before anything is written.
    expect_code(
        &h,
        "shell::fs::write",
        json!({"files": [{"path": "first", "content": "ok"}, {"path": "second", "content": "y".repeat(1001)}]}),
        "S218",
    )
    .await;
    assert!(
        !root.join("first").exists(),
        "the batch wrote a file before failing on the cap"
    );
    assert_eq!(names_in(root), ["exact"]);
    // read-bytes is a chunked console read: not bound by max_read_bytes.
    std::fs::write(root.join("large"), vec![7u8; 5000]).unwrap();
    assert_eq!(read_all(&h, "large").await.unwrap(), vec![7u8; 5000]);
    drop(h);

    let mut c = jailed(&j.root);
    c.fs.max_write_bytes = 0;
    c.fs.max_read_bytes = 0;
    let h = Harness::new(c).await;
    let big = "z".repeat(17 * 1024 * 1024);
    let r = quiet_ok(
        &h,
        "shell::fs::write",
        json!({"path": "unlimited", "content": big}),
    )
    .await;
    assert_eq!(r["bytes_written"], big.len());
    assert_eq!(
        std::fs::metadata(root.join("unlimited")).unwrap().len(),
        big.len() as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_write_larger_than_an_executor_frame_does_not_break_the_worker() {
    let j = Jail::new();
    let mut c = jailed(&j.root);
    c.fs.max_write_bytes = 0;
    let h = Harness::new(c).await;
    // Bigger than one executor-socket frame (40 MiB).
    let big: String = (0..45 * 1024 * 1024)
        .map(|i| char::from(b'A' + (i % 23) as u8))
        .collect();
    match h
        .call("shell::fs::write", json!({"path": "huge", "content": big}))
        .await
    {
        Ok(r) => {
            assert_eq!(r["bytes_written"], big.len());
            same_bytes(
                std::fs::read(j.root.join("huge")).unwrap(),
                big.as_bytes(),
                "",
            );
        }
        Err(e) => assert!(["S218", "S216"].contains(&e.code.as_str()), "{e:?}"),
    }
    drop(big);
    // The executor connection survived.
    let r = h
        .ok(
            "shell::fs::write",
            json!({"path": "after", "content": "still here"}),
        )
        .await;
    assert_eq!(r["bytes_written"], 10);
    assert_eq!(
        h.ok("shell::fs::ls", json!({"path": "."})).await["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "after")
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_leave_exactly_one_payload() {
    let j = Jail::new();
    let h = Arc::new(Harness::new(jailed(&j.root)).await);
    let root = j.root.clone();
    let payloads: Arc<Vec<String>> = Arc::new(
        (0..12)
            .map(|i| {
                let fill = char::from(b'a' + i as u8);
                format!(
                    "writer {i}:{}",
                    fill.to_string().repeat(768 * 1024 + i * 1013)
                )
            })
            .collect(),
    );
    for round in 0..3 {
        let tasks: Vec<_> = (0..payloads.len())
            .map(|i| {
                let (h, payloads) = (h.clone(), payloads.clone());
                tokio::spawn(async move {
                    h.call(
                        "shell::fs::write",
                        json!({"path": "same.txt", "content": payloads[i]}),
                    )
                    .await
                })
            })
            .collect();
        for t in tasks {
            let r = t.await.unwrap().unwrap();
            assert!(r["bytes_written"].as_u64().unwrap() > 768 * 1024);
        }
        let got = std::fs::read_to_string(root.join("same.txt")).unwrap();
        assert!(
            payloads.contains(&got),
            "round {round}: the file is not exactly one payload ({} bytes)",
            got.len()
        );
        assert_eq!(names_in(&root), ["same.txt"], "temp files left behind");
    }
}

// ---------------------------------------------------------------- paths

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jailed_path_forms() {
    let j = Jail::new();
    let second = tempdir();
    let second_root = canon(second.path());
    let mut c = jailed(&j.root);
    c.fs.host_roots.push(s(&second_root));
    let h = Harness::new(c).await;
    let root = &j.root;

    // Relative against the primary root; `~` is a literal name.
    let r = h
        .ok(
            "shell::fs::write",
            json!({"path": "~/notes", "content": "n", "parents": true}),
        )
        .await;
    assert_eq!(r["path"], s(&root.join("~/notes")));
    assert!(root.join("~").join("notes").exists());
    // Absolute inside either root.
    let r = h
        .ok(
            "shell::fs::write",
            json!({"path": s(&second_root.join("two")), "content": "2"}),
        )
        .await;
    assert_eq!(r["path"], s(&second_root.join("two")));
    same_bytes(std::fs::read(second_root.join("two")).unwrap(), b"2", "");
    let r = h
        .ok("shell::fs::stat", json!({"path": s(&root.join("~/notes"))}))
        .await;
    assert_eq!(r["size"], 1);
    // A relative path never lands in the second root.
    expect_code(&h, "shell::fs::stat", json!({"path": "two"}), "S211").await;

    // `//` and `.` collapse, in relative and absolute forms.
    let r = h
        .ok(
            "shell::fs::write",
            json!({"path": "a///b//c", "content": "abc", "parents": true}),
        )
        .await;
    assert_eq!(r["path"], s(&root.join("a/b/c")));
    let abs = format!("/{}//a///b/./c", s(root));
    let r = h.ok("shell::fs::stat", json!({"path": abs})).await;
    assert_eq!(r["size"], 3);
    let r = h
        .ok(
            "shell::fs::ls",
            json!({"path": format!("{}//a///b", s(root))}),
        )
        .await;
    assert_eq!(r["entries"][0]["name"], "c");
    assert_eq!(
        read_all(&h, &format!("/{}///a//b/c", s(root)))
            .await
            .unwrap(),
        b"abc"
    );
    // `..` inside the jail is fine; leaving it is not.
    let r = h.ok("shell::fs::stat", json!({"path": "a/b/../b/c"})).await;
    assert_eq!(r["size"], 3);
    for (function, payload) in [
        ("shell::fs::stat", json!({"path": "a/../../root/a/b/c"})),
        ("shell::fs::stat", json!({"path": "//a///b"})),
        (
            "shell::fs::stat",
            json!({"path": format!("{}-sibling", s(root))}),
        ),
        ("shell::fs::stat", json!({"path": "/"})),
        (
            "shell::fs::write",
            json!({"path": "/tmp/iii-shell-escape-test", "content": "x"}),
        ),
    ] {
        expect_code(&h, function, payload, "S215").await;
    }
    assert!(!Path::new("/tmp/iii-shell-escape-test").exists());

    // Unicode names.
    let names_u = [
        "данные",
        "ファイル 📄.txt",
        "ελληνικά",
        "עברית",
        "e\u{301}",
        "混合 mixed 🦀",
    ];
    for n in names_u {
        let p = format!("uni/{n}/{n}.txt");
        let r = h
            .ok(
                "shell::fs::write",
                json!({"path": p, "content": n, "parents": true}),
            )
            .await;
        assert_eq!(r["path"], s(&root.join(&p)));
        same_bytes(read_all(&h, &p).await.unwrap(), n.as_bytes(), "");
    }
    let r = h.ok("shell::fs::ls", json!({"path": "uni"})).await;
    let mut want: Vec<&str> = names_u.to_vec();
    want.sort();
    let got: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(got, want);
    h.ok(
        "shell::fs::mv",
        json!({"src": "uni/данные", "dst": "uni/🦀"}),
    )
    .await;
    assert!(root.join("uni/🦀/данные.txt").exists());

    // A path of ~3000 characters (nested 200-char directories, inside PATH_MAX).
    let seg = |i: usize| format!("{i:02}-{}", "ß".repeat(10) + &"x".repeat(180));
    let long: String = (0..16).map(seg).collect::<Vec<_>>().join("/") + "/leaf.bin";
    assert!(
        long.chars().count() > 3000 && s(root).len() + long.len() < 4000,
        "{}",
        long.len()
    );
    let r = h
        .ok(
            "shell::fs::mkdir",
            json!({"path": (0..16).map(seg).collect::<Vec<_>>().join("/"), "parents": true}),
        )
        .await;
    assert_eq!(r["created"], true);
    let r = h
        .ok("shell::fs::write", json!({"path": long, "content": "deep"}))
        .await;
    assert_eq!(r["path"], s(&root.join(&long)));
    same_bytes(read_all(&h, &long).await.unwrap(), b"deep", "");
    let st = h
        .ok(
            "shell::fs::stat",
            json!({"path": format!("{}/{long}", s(root))}),
        )
        .await;
    assert_eq!(st["size"], 4);
    h.ok("shell::fs::chmod", json!({"path": long, "mode": "0600"}))
        .await;
    h.ok(
        "shell::fs::mv",
        json!({"src": long, "dst": format!("{long}.moved")}),
    )
    .await;
    h.ok("shell::fs::rm", json!({"path": seg(0), "recursive": true}))
        .await;
    assert!(!root.join(seg(0)).exists());
    // Over PATH_MAX: a clean error, not a crash.
    let too_long: String = (0..30).map(seg).collect::<Vec<_>>().join("/");
    let e = h
        .err(
            "shell::fs::mkdir",
            json!({"path": too_long, "parents": true}),
        )
        .await;
    assert!(["S210", "S211"].contains(&e.code.as_str()), "{e:?}");
    // A NUL byte.
    expect_code(&h, "shell::fs::stat", json!({"path": "a\u{0}b"}), "S210").await;
    j.outside_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unjailed_accepts_only_absolute_paths() {
    let dir = tempdir();
    let base = canon(dir.path());
    let h = Harness::default().await;
    let p = s(&base.join("f"));
    let r = h
        .ok("shell::fs::write", json!({"path": p, "content": "u"}))
        .await;
    assert_eq!(r["path"], p);
    for rel in ["f", "./f", "~", "~/f", "../f", "tmp/x"] {
        let e = expect_code(&h, "shell::fs::stat", json!({"path": rel}), "S210").await;
        assert!(e.message.contains("absolute"), "{rel}: {e:?}");
        expect_code(
            &h,
            "shell::fs::write",
            json!({"path": rel, "content": "x"}),
            "S210",
        )
        .await;
        expect_code(
            &h,
            "shell::fs::mkdir",
            json!({"path": rel, "parents": true}),
            "S210",
        )
        .await;
    }
    expect_code(
        &h,
        "shell::fs::write",
        json!({"files": [{"path": p, "content": "x"}, {"path": "rel", "content": "x"}]}),
        "S210",
    )
    .await;
    let dbl = format!("/{}//a///b", s(&base));
    let r = h
        .ok("shell::fs::mkdir", json!({"path": dbl, "parents": true}))
        .await;
    assert_eq!(r["path"], s(&base.join("a/b")));
    assert!(base.join("a/b").is_dir());
    assert_eq!(
        read_all(&h, &format!("//{}///f", s(&base).trim_start_matches('/')))
            .await
            .unwrap(),
        b"u"
    );
    // The default denylist applies unjailed: /etc/shadow reads like a missing file.
    let a = expect_code(
        &h,
        "shell::workspace::read-bytes",
        json!({"path": "/etc/shadow"}),
        "S211",
    )
    .await;
    let b = expect_code(
        &h,
        "shell::workspace::read-bytes",
        json!({"path": "/etc/no-such-file-iii"}),
        "S211",
    )
    .await;
    assert_eq!(
        a.message.replace("/etc/shadow", "P"),
        b.message.replace("/etc/no-such-file-iii", "P")
    );
    for (function, payload, code) in [
        (
            "shell::fs::stat",
            json!({"path": "/etc/../etc/passwd"}),
            "S211",
        ),
        (
            "shell::fs::write",
            json!({"path": "/etc/passwd", "content": "x"}),
            "S211",
        ),
        // The filesystem root is never removed.
        (
            "shell::fs::rm",
            json!({"path": "/", "recursive": true}),
            "S210",
        ),
        (
            "shell::fs::rm",
            json!({"path": "//", "recursive": true}),
            "S210",
        ),
    ] {
        expect_code(&h, function, payload, code).await;
    }
}

// ---------------------------------------------------------------- escapes and races

/// Every fs function answers S215 through the broker for a path through a symlink out of the
/// jail. The broker checks no path itself: every other way to spell such a link (relative,
/// `/`, through an inner link, `..` after it) is the executor's, and
/// `executor/tests/fs_ops_jail.rs` walks them all for every operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_leading_outside_are_s215_everywhere_and_create_nothing() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    let root = &j.root;
    std::fs::create_dir_all(root.join("in/deep")).unwrap();
    std::os::unix::fs::symlink(&j.outside, root.join("in/deep/abs")).unwrap();

    let link = "in/deep/abs";
    let f = format!("{link}/secret.txt");
    for (func, p) in [
        ("shell::fs::stat", json!({"path": f})),
        ("shell::fs::ls", json!({"path": link})),
        ("shell::workspace::read-bytes", json!({"path": f})),
        ("shell::fs::write", json!({"path": f, "content": "pwned"})),
        (
            "shell::fs::write",
            json!({"path": format!("{link}/new/x"), "content": "pwned", "parents": true}),
        ),
        (
            "shell::fs::mkdir",
            json!({"path": format!("{link}/newdir")}),
        ),
        (
            "shell::fs::mkdir",
            json!({"path": format!("{link}/a/b/c"), "parents": true}),
        ),
        ("shell::fs::rm", json!({"path": f})),
        (
            "shell::fs::rm",
            json!({"path": format!("{link}/x"), "recursive": true}),
        ),
        ("shell::fs::chmod", json!({"path": f, "mode": "0777"})),
        (
            "shell::fs::chmod",
            json!({"path": f, "mode": "0777", "uid": 1, "recursive": true}),
        ),
        ("shell::fs::mv", json!({"src": f, "dst": "stolen"})),
        (
            "shell::fs::mv",
            json!({"src": "in", "dst": format!("{link}/moved")}),
        ),
        ("shell::workspace::list", json!({"path": link})),
        ("shell::workspace::validate", json!({"path": link})),
    ] {
        let e = h.err(func, p.clone()).await;
        assert_eq!(e.code, "S215", "{func} {p}: {e:?}");
        assert!(
            e.message.starts_with("path escapes the fs jail roots"),
            "{e:?}"
        );
    }
    assert!(root.join("in").is_dir() && !root.join("stolen").exists());
    j.outside_untouched();
    assert!(!Path::new("/tmp/secret.txt").exists());
}

/// `renameat2(RENAME_EXCHANGE)`.
fn exchange(a: &Path, b: &Path) -> bool {
    let a = std::ffi::CString::new(a.as_os_str().as_encoded_bytes()).unwrap();
    let b = std::ffi::CString::new(b.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: renameat2 with two NUL-terminated paths.
    unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        ) == 0
    }
}

/// Swaps `root/d` between a real directory and a symlink to the outside as fast as it can.
fn start_swapper(root: &Path, outside: &Path) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("d/x"), "inside x").unwrap();
    std::fs::set_permissions(root.join("d/x"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(outside, root.join("d-swap")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (d, swap, st) = (root.join("d"), root.join("d-swap"), stop.clone());
    let t = std::thread::spawn(move || {
        let mut n = 0u64;
        while !st.load(Ordering::Relaxed) {
            assert!(
                exchange(&d, &swap),
                "renameat2: {}",
                std::io::Error::last_os_error()
            );
            n += 1;
            if n & 63 == 0 {
                std::thread::yield_now();
            }
        }
        n
    });
    (stop, t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_swapped_for_an_outside_symlink_mid_call_never_escapes() {
    let j = Jail::new();
    // Give the outside its own `x`, so a read or a write that went through the link would show.
    std::fs::write(j.outside.join("x"), "OUTSIDE x").unwrap();
    std::fs::set_permissions(j.outside.join("x"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let outside_x_mtime = std::fs::metadata(j.outside.join("x")).unwrap().mtime_nsec();
    let h = Harness::new(jailed(&j.root)).await;
    let (stop, swapper) = start_swapper(&j.root, &j.outside);

    let (mut ok, mut escaped) = (0u32, 0u32);
    let mut tally = |r: Result<Value, WireError>, what: &str| -> Option<Value> {
        match r {
            Ok(v) => {
                ok += 1;
                Some(v)
            }
            Err(e) if e.code == "S215" => {
                escaped += 1;
                None
            }
            // The other name may hold the real directory at a given instant: a file made
            // through one name is "missing" through the other.
            Err(e) if e.code == "S211" || e.code == "S213" => None,
            // `d` itself is a symlink at that instant: chmod refuses links as its target.
            Err(e) if e.code == "S212" && what == "chmod -R" => None,
            Err(e) => panic!("{what}: unexpected {e:?}"),
        }
    };
    for i in 0..300 {
        tally(
            h.call(
                "shell::fs::write",
                json!({"path": format!("d/w{i}"), "content": "inside"}),
            )
            .await,
            "write",
        );
        tally(
            h.call(
                "shell::fs::write",
                json!({"path": format!("d/p{i}/q/w"), "content": "inside", "parents": true}),
            )
            .await,
            "write -p",
        );
        tally(
            h.call(
                "shell::fs::write",
                json!({"path": "d/x", "content": "inside x"}),
            )
            .await,
            "overwrite",
        );
        if let Some(v) = tally(
            h.call("shell::workspace::read-bytes", json!({"path": "d/x"}))
                .await,
            "read",
        ) {
            assert_eq!(
                b64(&v),
                b"inside x",
                "read the outside file through the swapped link"
            );
        }
        tally(
            h.call("shell::fs::mkdir", json!({"path": format!("d/m{i}")}))
                .await,
            "mkdir",
        );
        tally(
            h.call(
                "shell::fs::mkdir",
                json!({"path": format!("d/n{i}/a/b"), "parents": true}),
            )
            .await,
            "mkdir -p",
        );
        tally(
            h.call("shell::fs::chmod", json!({"path": "d/x", "mode": "0600"}))
                .await,
            "chmod",
        );
        tally(
            h.call(
                "shell::fs::chmod",
                json!({"path": "d", "mode": "0755", "recursive": true}),
            )
            .await,
            "chmod -R",
        );
        if let Some(v) = tally(
            h.call("shell::fs::stat", json!({"path": "d/x"})).await,
            "stat",
        ) {
            assert_eq!(v["size"], 8, "stat saw the outside file: {v}");
        }
        if let Some(v) = tally(h.call("shell::fs::ls", json!({"path": "d"})).await, "ls") {
            assert!(
                v["entries"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|e| e["name"] != "secret.txt"),
                "ls listed the outside: {v}"
            );
        }
        tally(
            h.call(
                "shell::fs::mv",
                json!({"src": format!("d/w{i}"), "dst": format!("d/v{i}")}),
            )
            .await,
            "mv",
        );
        tally(
            h.call("shell::fs::rm", json!({"path": format!("d/m{i}")}))
                .await,
            "rm",
        );
        tally(
            h.call(
                "shell::fs::rm",
                json!({"path": format!("d/p{i}"), "recursive": true}),
            )
            .await,
            "rm -r",
        );
        if i % 50 == 0 {
            j_outside_check(&j, outside_x_mtime);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    j_outside_check(&j, outside_x_mtime);
    assert!(swaps > 100, "the swapper barely ran ({swaps})");
    assert!(
        ok > 100 && escaped > 100,
        "the race was not exercised: {ok} ok, {escaped} S215"
    );
}

fn j_outside_check(j: &Jail, x_mtime_nsec: i64) {
    assert_eq!(
        names_in(&j.outside),
        ["secret.txt", "x"],
        "something appeared outside the jail"
    );
    same_bytes(
        std::fs::read(j.outside.join("x")).unwrap(),
        b"OUTSIDE x",
        "",
    );
    let md = std::fs::metadata(j.outside.join("x")).unwrap();
    assert_eq!(
        md.permissions().mode() & 0o7777,
        0o640,
        "the outside file's mode changed"
    );
    assert_eq!(
        md.mtime_nsec(),
        x_mtime_nsec,
        "the outside file was modified"
    );
    assert_eq!(mode_of(&j.outside), 0o755);
    same_bytes(
        std::fs::read(j.outside.join("secret.txt")).unwrap(),
        b"OUTSIDE SECRET",
        "",
    );
}

// ---------------------------------------------------------------- redaction

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_paths_read_exactly_like_missing_ones() {
    let j = Jail::new();
    let root = &j.root;
    std::fs::create_dir_all(root.join("private/inner")).unwrap();
    std::fs::write(root.join("private/inner/data"), "p").unwrap();
    std::fs::write(root.join("deny-file"), "d").unwrap();
    std::fs::write(root.join(".env"), "E").unwrap();
    std::fs::write(root.join(".env.local"), "E").unwrap();
    std::fs::create_dir_all(root.join("sub/secrets")).unwrap();
    std::fs::write(root.join("sub/secrets/k"), "K").unwrap();
    std::fs::write(root.join("sub/server.pem"), "PEM").unwrap();
    std::fs::write(root.join("ok.txt"), "ok").unwrap();
    std::os::unix::fs::symlink("deny-file", root.join("to-denied")).unwrap();
    std::os::unix::fs::symlink(".env", root.join("to-env")).unwrap();
    let mut c = jailed(&j.root);
    c.fs.denylist_paths = vec![
        s(&root.join("private")),
        s(&root.join("deny-file")),
        s(&root.join("box/inner-secret")),
    ];
    std::fs::create_dir_all(root.join("box/inner-secret")).unwrap();
    std::fs::write(root.join("box/inner-secret/k"), "K").unwrap();
    std::fs::write(root.join("box/plain"), "p").unwrap();
    let h = Harness::new(c).await;

    // Moving an ancestor of a denylisted path would expose it under a new name: refused, and
    // worded like a missing path.
    let m = h
        .err("shell::fs::mv", json!({"src": "no-box", "dst": "box2"}))
        .await;
    let e = h
        .err("shell::fs::mv", json!({"src": "box", "dst": "box2"}))
        .await;
    assert_eq!(
        (e.code.as_str(), e.message.replace("box", "P")),
        ("S211", m.message.replace("no-box", "P"))
    );
    assert!(root.join("box/inner-secret/k").exists() && !root.join("box2").exists());
    h.ok("shell::fs::mv", json!({"src": "box/plain", "dst": "plain"}))
        .await;
    let e = h
        .err(
            "shell::workspace::read-bytes",
            json!({"path": "box/inner-secret/k"}),
        )
        .await;
    assert_eq!(e.code, "S211");

    let denied = [
        "private",
        "private/inner",
        "private/inner/data",
        "deny-file",
        ".env",
        ".env.local",
        "sub/secrets/k",
        "sub/server.pem",
        "to-denied",
        "to-env",
        "private/../private/inner/data",
    ];
    let missing = "no-such-entry";
    for (func, template) in [
        ("shell::fs::stat", json!({"path": "P"})),
        ("shell::fs::ls", json!({"path": "P"})),
        ("shell::workspace::read-bytes", json!({"path": "P"})),
        ("shell::workspace::validate", json!({"path": "P"})),
        ("shell::workspace::list", json!({"path": "P"})),
        ("shell::fs::rm", json!({"path": "P", "recursive": true})),
        ("shell::fs::chmod", json!({"path": "P", "mode": "0777"})),
        ("shell::fs::mv", json!({"src": "P", "dst": "moved"})),
    ] {
        let with = |p: &str| {
            serde_json::from_str::<Value>(&template.to_string().replace("\"P\"", &format!("{p:?}")))
                .unwrap()
        };
        let m = h.err(func, with(missing)).await;
        assert_eq!(m.code, "S211", "{func} missing: {m:?}");
        for d in denied {
            if matches!(func, "shell::fs::stat" | "shell::fs::rm" | "shell::fs::mv")
                && d.starts_with("to-")
            {
                // The link itself is an ordinary entry; only following it is denied.
                continue;
            }
            if func == "shell::fs::chmod" && d.starts_with("to-") {
                continue;
            }
            let e = h.err(func, with(d)).await;
            assert_eq!(e.code, m.code, "{func} {d}: {e:?}");
            assert_eq!(
                e.message.replace(d, "P"),
                m.message.replace(missing, "P"),
                "{func} {d}"
            );
        }
    }
    // Writes and creations in denied places read the same way.
    for (func, template) in [
        ("shell::fs::write", json!({"path": "P", "content": "x"})),
        (
            "shell::fs::write",
            json!({"path": "P", "content": "x", "parents": true}),
        ),
        ("shell::fs::mkdir", json!({"path": "P", "parents": true})),
        ("shell::fs::mv", json!({"src": "ok.txt", "dst": "P"})),
    ] {
        let with = |p: &str| {
            serde_json::from_str::<Value>(&template.to_string().replace("\"P\"", &format!("{p:?}")))
                .unwrap()
        };
        // With `parents` a missing directory is created, so compare with the plain wording.
        let m = h.err("shell::fs::stat", json!({"path": "no-dir/x"})).await;
        assert_eq!(m.code, "S211", "{func}: {m:?}");
        for d in [
            "private/new",
            "private/inner/data",
            "deny-file",
            ".env",
            "sub/.env.prod",
            "sub/secrets/new",
            "new.key",
            "sub/x.pem",
        ] {
            let e = h.err(func, with(d)).await;
            assert_eq!(
                (e.code.as_str(), e.message.replace(d, "P")),
                ("S211", m.message.replace("no-dir/x", "P")),
                "{func} {d}"
            );
        }
    }
    // Nothing denied changed, and listings leave it out.
    same_bytes(std::fs::read(root.join("deny-file")).unwrap(), b"d", "");
    same_bytes(std::fs::read(root.join(".env")).unwrap(), b"E", "");
    same_bytes(
        std::fs::read(root.join("private/inner/data")).unwrap(),
        b"p",
        "",
    );
    assert!(
        root.join("ok.txt").exists()
            && !root.join("new.key").exists()
            && !root.join("sub/.env.prod").exists()
    );
    let ls = h.ok("shell::fs::ls", json!({"path": "."})).await;
    let listed: Vec<&str> = ls["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    for d in ["private", "deny-file", ".env", ".env.local"] {
        assert!(!listed.contains(&d), "{d} listed: {listed:?}");
    }
    let ls = h.ok("shell::fs::ls", json!({"path": "sub"})).await;
    assert!(
        ls["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["name"] != "server.pem"),
        "{ls}"
    );
    // A recursive chmod skips denied entries silently.
    h.ok(
        "shell::fs::chmod",
        json!({"path": ".", "mode": "0700", "recursive": true}),
    )
    .await;
    assert_ne!(
        std::fs::metadata(root.join("deny-file"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    assert_ne!(
        std::fs::metadata(root.join(".env"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    assert_ne!(
        std::fs::metadata(root.join("private/inner/data"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    // A denied target is never an S215.
    let e = h
        .err("shell::fs::stat", json!({"path": s(&root.join("private"))}))
        .await;
    assert_eq!(e.code, "S211");
}

/// Runs the permission-denied test as an unprivileged user (root bypasses permissions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_denied_reads_like_missing() {
    if !is_root() {
        permission_denied_body().await;
        return;
    }
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fs_host::permission_denied_as_unprivileged_user",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("III_SHELL_FS_TEST_UNPRIVILEGED", "1")
        .current_dir("/")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{log}");
    assert!(log.contains("1 passed"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by permission_denied_reads_like_missing as an unprivileged user"]
async fn permission_denied_as_unprivileged_user() {
    assert!(std::env::var_os("III_SHELL_FS_TEST_UNPRIVILEGED").is_some());
    permission_denied_body().await;
}

async fn permission_denied_body() {
    let j = Jail::new();
    let root = &j.root;
    std::fs::create_dir(root.join("locked")).unwrap();
    std::fs::write(root.join("locked/inner"), "i").unwrap();
    std::fs::set_permissions(root.join("locked"), std::fs::Permissions::from_mode(0o000)).unwrap();
    std::fs::write(root.join("unreadable"), "u").unwrap();
    std::fs::set_permissions(
        root.join("unreadable"),
        std::fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    std::fs::create_dir(root.join("ro")).unwrap();
    std::fs::set_permissions(root.join("ro"), std::fs::Permissions::from_mode(0o555)).unwrap();
    let h = Harness::new(jailed(&j.root)).await;
    let missing = "missing-entry";
    for (func, template) in [
        ("shell::fs::stat", json!({"path": "P"})),
        ("shell::fs::ls", json!({"path": "P"})),
        ("shell::workspace::read-bytes", json!({"path": "P"})),
        ("shell::workspace::list", json!({"path": "P"})),
        ("shell::fs::write", json!({"path": "P", "content": "x"})),
        ("shell::fs::mkdir", json!({"path": "P"})),
        ("shell::fs::rm", json!({"path": "P"})),
    ] {
        let with = |p: &str| {
            serde_json::from_str::<Value>(&template.to_string().replace("\"P\"", &format!("{p:?}")))
                .unwrap()
        };
        let m = h.err(func, with(&format!("{missing}/x"))).await;
        assert_eq!(m.code, "S211", "{func}: {m:?}");
        for d in ["locked/inner", "locked/x", "ro/new"] {
            // `ro/new` only matters to the creating calls (the others find it plainly missing).
            let e = h.err(func, with(d)).await;
            assert_eq!(e.code, "S211", "{func} {d}: {e:?}");
            assert_eq!(
                e.message.replace(d, "P"),
                m.message.replace(&format!("{missing}/x"), "P"),
                "{func} {d}"
            );
        }
    }
    let m = h
        .err("shell::workspace::read-bytes", json!({"path": missing}))
        .await;
    let e = h
        .err(
            "shell::workspace::read-bytes",
            json!({"path": "unreadable"}),
        )
        .await;
    assert_eq!(
        (e.code.as_str(), e.message.replace("unreadable", "P")),
        ("S211", m.message.replace(missing, "P"))
    );
    let m = h.err("shell::fs::ls", json!({"path": missing})).await;
    let e = h.err("shell::fs::ls", json!({"path": "locked"})).await;
    assert_eq!(
        (e.code.as_str(), e.message.replace("locked", "P")),
        ("S211", m.message.replace(missing, "P"))
    );
    std::fs::set_permissions(root.join("locked"), std::fs::Permissions::from_mode(0o755)).unwrap();
}

// ---------------------------------------------------------------- workspace

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_roots_list_validate_and_read_bytes() {
    let j = Jail::new();
    let second = tempdir();
    let root = &j.root;
    std::fs::create_dir_all(root.join("proj/src")).unwrap();
    for n in ["b", "a", "c", "z-denied", "secrets"] {
        std::fs::create_dir(root.join("proj").join(n)).unwrap();
    }
    std::fs::write(root.join("proj/file.txt"), "not a dir").unwrap();
    std::os::unix::fs::symlink("a", root.join("proj/link-a")).unwrap();
    std::os::unix::fs::symlink(&j.outside, root.join("proj/link-out")).unwrap();
    let mut c = jailed(&j.root);
    c.fs.host_roots.push(s(second.path()));
    c.fs.denylist_paths.push(s(&root.join("proj/z-denied")));
    let h = Harness::new(c).await;

    let r = h.ok("shell::workspace::roots", json!({"ignored": 1})).await;
    assert_eq!(r, json!({"roots": [s(root), s(&canon(second.path()))]}));

    let r = h
        .ok("shell::workspace::list", json!({"path": "proj"}))
        .await;
    assert_eq!(r["path"], s(&root.join("proj")));
    let names: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    // Directories only (a link to a directory inside the jail counts), sorted; files, links
    // leading outside and denied entries are left out. (`secrets` itself is listed: the
    // `**/secrets/**` glob protects what is inside it.)
    assert_eq!(names, ["a", "b", "c", "link-a", "secrets", "src"], "{r}");
    for e in r["entries"].as_array().unwrap() {
        assert_eq!(e["kind"], "dir");
        // Canonical: the symlinked child is listed at the directory it resolves to.
        let name = e["name"].as_str().unwrap();
        let want = if name == "link-a" { "a" } else { name };
        assert_eq!(e["path"], s(&root.join("proj").join(want)));
    }
    let r = h
        .ok(
            "shell::workspace::list",
            json!({"path": s(&root.join("proj")), "page_size": 2}),
        )
        .await;
    assert_eq!(r["entries"].as_array().unwrap().len(), 2);
    assert_eq!(r["entries"][0]["name"], "a");
    let r = h
        .ok(
            "shell::workspace::list",
            json!({"path": format!("{}//proj/./a/..", s(root))}),
        )
        .await;
    assert_eq!(r["path"], s(&root.join("proj")));
    for (payload, code) in [
        (json!({"path": "proj/file.txt"}), "S212"),
        (json!({"path": "nope"}), "S211"),
        (json!({"path": "proj/z-denied"}), "S211"),
        (json!({"path": "proj/link-out"}), "S215"),
        (json!({"path": ""}), "S210"),
        (json!({"path": "proj", "page_size": -1}), "S210"),
    ] {
        expect_code(&h, "shell::workspace::list", payload, code).await;
    }

    let r = h
        .ok("shell::workspace::validate", json!({"path": "proj/link-a"}))
        .await;
    assert_eq!(r, json!({"path": s(&root.join("proj/a"))}));
    let r = h
        .ok("shell::workspace::validate", json!({"path": "."}))
        .await;
    assert_eq!(r, json!({"path": s(root)}));
    expect_code(
        &h,
        "shell::workspace::validate",
        json!({"path": "proj/file.txt"}),
        "S212",
    )
    .await;
    expect_code(
        &h,
        "shell::workspace::validate",
        json!({"path": "proj/missing"}),
        "S211",
    )
    .await;
    let a = expect_code(
        &h,
        "shell::workspace::validate",
        json!({"path": "proj/z-denied"}),
        "S211",
    )
    .await;
    let b = expect_code(
        &h,
        "shell::workspace::validate",
        json!({"path": "proj/z-missin"}),
        "S211",
    )
    .await;
    assert_eq!(
        a.message.replace("z-denied", "X"),
        b.message.replace("z-missin", "X")
    );
    expect_code(
        &h,
        "shell::workspace::validate",
        json!({"path": "/"}),
        "S215",
    )
    .await;
    expect_code(&h, "shell::workspace::validate", json!({}), "S210").await;

    // read-bytes: ranges, eof, base64, size/mtime, the 4 MiB cap.
    let data: Vec<u8> = (0..(5 * 1024 * 1024 + 123))
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(root.join("blob.bin"), &data).unwrap();
    let mtime = std::fs::metadata(root.join("blob.bin")).unwrap().mtime();
    let r = h
        .ok("shell::workspace::read-bytes", json!({"path": "blob.bin"}))
        .await;
    assert_eq!(r["path"], s(&root.join("blob.bin")));
    assert_eq!(
        (
            r["offset"].as_u64(),
            r["length"].as_u64(),
            r["size"].as_u64(),
            r["eof"].as_bool()
        ),
        (Some(0), Some(4 << 20), Some(data.len() as u64), Some(false))
    );
    assert_eq!(r["mtime"], mtime);
    assert_eq!(b64(&r), &data[..4 << 20]);
    let r = h
        .ok(
            "shell::workspace::read-bytes",
            json!({"path": "blob.bin", "offset": 4 << 20, "length": 100 << 20}),
        )
        .await;
    assert_eq!(
        (r["length"].as_u64(), r["eof"].as_bool()),
        (Some(data.len() as u64 - (4 << 20)), Some(true))
    );
    assert_eq!(b64(&r), &data[4 << 20..]);
    let r = h
        .ok(
            "shell::workspace::read-bytes",
            json!({"path": "blob.bin", "offset": 10, "length": 5}),
        )
        .await;
    assert_eq!(
        (
            r["offset"].as_u64(),
            r["length"].as_u64(),
            r["eof"].as_bool()
        ),
        (Some(10), Some(5), Some(false))
    );
    assert_eq!(b64(&r), &data[10..15]);
    let r = h
        .ok(
            "shell::workspace::read-bytes",
            json!({"path": "blob.bin", "offset": data.len() - 3, "length": 3}),
        )
        .await;
    assert_eq!(
        (r["length"].as_u64(), r["eof"].as_bool()),
        (Some(3), Some(true))
    );
    let r = h
        .ok(
            "shell::workspace::read-bytes",
            json!({"path": "blob.bin", "offset": data.len() + 99}),
        )
        .await;
    assert_eq!(
        (
            r["length"].as_u64(),
            r["content"].as_str(),
            r["eof"].as_bool()
        ),
        (Some(0), Some(""), Some(true))
    );
    let r = h
        .ok(
            "shell::workspace::read-bytes",
            json!({"path": "blob.bin", "length": 0}),
        )
        .await;
    assert_eq!(
        (r["length"].as_u64(), r["eof"].as_bool()),
        (Some(0), Some(false))
    );
    std::fs::write(root.join("empty"), "").unwrap();
    let r = h
        .ok("shell::workspace::read-bytes", json!({"path": "empty"}))
        .await;
    assert_eq!(
        (
            r["length"].as_u64(),
            r["size"].as_u64(),
            r["eof"].as_bool(),
            r["content"].as_str()
        ),
        (Some(0), Some(0), Some(true), Some(""))
    );
    std::fs::write(root.join("nul.bin"), b"a\0b\0\0\xff\xfe").unwrap();
    same_bytes(
        read_all(&h, "nul.bin").await.unwrap(),
        b"a\0b\0\0\xff\xfe",
        "",
    );
    for (payload, code) in [
        (json!({"path": "proj"}), "S212"),
        (json!({"path": "nope"}), "S211"),
        (json!({"path": "proj/link-out/secret.txt"}), "S215"),
        (json!({"path": "blob.bin", "offset": -1}), "S210"),
    ] {
        expect_code(&h, "shell::workspace::read-bytes", payload, code).await;
    }
    j.outside_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_roots_unjailed_and_list_pages() {
    let h = Harness::default().await;
    let r = h.ok("shell::workspace::roots", json!({})).await;
    let roots: Vec<&str> = r["roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        roots.contains(&"/tmp")
            || roots
                .iter()
                .any(|r| canon(Path::new("/tmp")) == Path::new(r)),
        "{r}"
    );
    for root in &roots {
        assert_eq!(
            canon(Path::new(root)),
            Path::new(root),
            "not canonical: {root}"
        );
    }
    let dir = tempdir();
    let base = canon(dir.path());
    for i in 0..30 {
        std::fs::create_dir(base.join(format!("d{i:02}"))).unwrap();
        std::fs::write(base.join(format!("f{i:02}")), "").unwrap();
    }
    let r = h
        .ok("shell::workspace::list", json!({"path": s(&base)}))
        .await;
    assert_eq!(r["entries"].as_array().unwrap().len(), 30);
    let r = h
        .ok(
            "shell::workspace::list",
            json!({"path": s(&base), "page_size": 7}),
        )
        .await;
    let got: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(got, ["d00", "d01", "d02", "d03", "d04", "d05", "d06"]);
    expect_code(
        &h,
        "shell::workspace::list",
        json!({"path": "relative"}),
        "S210",
    )
    .await;
    expect_code(
        &h,
        "shell::workspace::validate",
        json!({"path": "~"}),
        "S210",
    )
    .await;
    let a = expect_code(
        &h,
        "shell::workspace::validate",
        json!({"path": "/etc/passwd"}),
        "S211",
    )
    .await;
    assert!(!a.message.contains("directory"), "{a:?}");
}

// ---------------------------------------------------------------- grep/sed smoke

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_and_sed_answer() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    std::fs::write(j.root.join("g.txt"), "alpha\nbeta\n").unwrap();
    let r = h
        .ok("shell::fs::grep", json!({"path": ".", "pattern": "bet"}))
        .await;
    assert!(r["matches"].is_array(), "{r}");
    let r = h
        .ok(
            "shell::fs::sed",
            json!({"files": ["g.txt"], "pattern": "alpha", "replacement": "gamma"}),
        )
        .await;
    assert!(r["results"].is_array(), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_stays_healthy_after_many_failures() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    for i in 0..200 {
        let _ = h
            .call("shell::fs::stat", json!({"path": format!("../{i}")}))
            .await;
        let _ = h
            .call(
                "shell::fs::write",
                json!({"path": format!("nope/{i}"), "content": "x"}),
            )
            .await;
    }
    tokio::time::timeout(
        Duration::from_secs(30),
        h.ok(
            "shell::fs::write",
            json!({"path": "alive", "content": "yes"}),
        ),
    )
    .await
    .unwrap();
    same_bytes(std::fs::read(j.root.join("alive")).unwrap(), b"yes", "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longest_names_and_special_files() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    let root = &j.root;
    // A name of NAME_MAX (255) bytes: writable and readable like any other.
    for name in [
        "n".repeat(255),
        "é".repeat(127) + "x",
        "🦀".repeat(63) + "abc",
    ] {
        assert_eq!(name.len(), 255);
        let r = h
            .ok(
                "shell::fs::write",
                json!({"path": name, "content": "long name"}),
            )
            .await;
        assert_eq!(r["bytes_written"], 9);
        same_bytes(read_all(&h, &name).await.unwrap(), b"long name", "");
        h.ok(
            "shell::fs::write",
            json!({"path": name, "content": "again"}),
        )
        .await;
        same_bytes(std::fs::read(root.join(&name)).unwrap(), b"again", "");
        h.ok(
            "shell::fs::mkdir",
            json!({"path": format!("dirs/{name}"), "parents": true}),
        )
        .await;
        assert!(root.join("dirs").join(&name).is_dir());
    }
    // One byte more is a clean error.
    let e = h
        .err(
            "shell::fs::write",
            json!({"path": "n".repeat(256), "content": "x"}),
        )
        .await;
    assert!(["S210", "S211"].contains(&e.code.as_str()), "{e:?}");
    assert!(
        names_in(root).iter().all(|n| !n.ends_with(".tmp")),
        "{:?}",
        names_in(root)
    );

    // A FIFO is not a regular file: refused at once, never blocking.
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let started = std::time::Instant::now();
    expect_code(
        &h,
        "shell::workspace::read-bytes",
        json!({"path": "fifo"}),
        "S212",
    )
    .await;
    let st = h.ok("shell::fs::stat", json!({"path": "fifo"})).await;
    assert_eq!(
        (st["is_dir"].as_bool(), st["size"].as_u64()),
        (Some(false), Some(0))
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // Writing replaces the FIFO with a file (temp + rename), it never opens it.
    h.ok(
        "shell::fs::write",
        json!({"path": "fifo", "content": "now a file"}),
    )
    .await;
    assert!(std::fs::symlink_metadata(root.join("fifo"))
        .unwrap()
        .file_type()
        .is_file());
}

/// Inline content over 8 MiB travels to the executor as a chunk stream; it must arrive whole,
/// promptly, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_inline_writes_are_streamed_whole() {
    let j = Jail::new();
    let mut c = jailed(&j.root);
    c.fs.max_write_bytes = 0;
    let h = Harness::new(c).await;
    for i in 0..6u8 {
        let text: String = (0..(9 << 20) + i as usize * 777)
            .map(|k| char::from(b'a' + ((k + i as usize) % 26) as u8))
            .collect();
        let started = std::time::Instant::now();
        let r = quiet_ok(
            &h,
            "shell::fs::write",
            json!({"path": format!("big{i}"), "content": text, "mode": "0600"}),
        )
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "write {i} took {:?}",
            started.elapsed()
        );
        assert_eq!(r["bytes_written"], text.len());
        same_bytes(
            std::fs::read(j.root.join(format!("big{i}"))).unwrap(),
            &text,
            "big",
        );
        assert_eq!(
            std::fs::metadata(j.root.join(format!("big{i}")))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777,
            0o600
        );
    }
    // The streamed path keeps the write rules: escapes and missing parents still fail.
    let text = "e".repeat(9 << 20);
    let e = h
        .call(
            "shell::fs::write",
            json!({"path": "../big", "content": text}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, "S215");
    let e = h
        .call(
            "shell::fs::write",
            json!({"path": "no/dir/big", "content": text}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, "S211");
    assert!(
        names_in(&j.root).iter().all(|n| n.starts_with("big")),
        "{:?}",
        names_in(&j.root)
    );
    j.outside_untouched();
}

// ---------------------------------------------------------------- fs calls

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mkdir_without_owner_read_reports_created() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    for m in ["0000", "0100", "0200", "0300"] {
        let name = format!("m{m}");
        let r = h
            .ok("shell::fs::mkdir", json!({"path": name, "mode": m}))
            .await;
        assert_eq!(
            r,
            json!({"created": true, "path": s(&j.root.join(&name)), "already_existed": false}),
            "{m}"
        );
        assert_eq!(format!("{:04o}", mode_of(&j.root.join(&name))), m);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chmod_refuses_a_chown_it_cannot_do_before_changing_anything() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    std::fs::create_dir_all(j.root.join("d/e")).unwrap();
    std::fs::write(j.root.join("d/e/f"), "x").unwrap();
    for p in ["d", "d/e", "d/e/f"] {
        std::fs::set_permissions(j.root.join(p), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // The test executor holds no capabilities (confinement.capabilities is empty).
    for (who, payload) in [
        (
            "uid",
            json!({"path": "d", "mode": "0700", "uid": 4321, "recursive": true}),
        ),
        ("gid", json!({"path": "d/e/f", "mode": "0700", "gid": 8765})),
    ] {
        let e = expect_code(&h, "shell::fs::chmod", payload, "S210").await;
        assert!(
            e.message.contains("CAP_CHOWN") && e.message.contains("nothing was changed"),
            "{who}: {e:?}"
        );
        for p in ["d", "d/e", "d/e/f"] {
            assert_eq!(mode_of(&j.root.join(p)), 0o755, "{who}: {p} changed");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recursive_chmod_to_0000_and_back_changes_the_whole_tree() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    std::fs::create_dir_all(j.root.join("d/e/g")).unwrap();
    std::fs::write(j.root.join("d/e/f"), "x").unwrap();
    std::fs::write(j.root.join("d/top"), "x").unwrap();
    let all = ["d", "d/e", "d/e/g", "d/e/f", "d/top"];
    let r = h
        .ok(
            "shell::fs::chmod",
            json!({"path": "d", "mode": "0000", "recursive": true}),
        )
        .await;
    assert_eq!(r["entries_changed"], 5, "{r}");
    for p in all {
        assert_eq!(mode_of(&j.root.join(p)), 0, "{p}");
    }
    // Opening it up again works too: a directory is changed before its children then.
    let r = h
        .ok(
            "shell::fs::chmod",
            json!({"path": "d", "mode": "0750", "recursive": true}),
        )
        .await;
    assert_eq!(r["entries_changed"], 5, "{r}");
    for p in all {
        assert_eq!(mode_of(&j.root.join(p)), 0o750, "{p}");
    }
}

/// FS-33: a recursive rm skips protected entries silently, as the walks of grep, sed and
/// chmod do: everything else goes, the protected entries and the directories holding them
/// stay, and the answer (`removed: false`) names none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rm_of_a_tree_holding_hidden_entries_skips_them_silently() {
    let j = Jail::new();
    let mut c = jailed(&j.root);
    c.fs.denylist_paths.push(s(&j.root.join("d3/deny")));
    let h = Harness::new(c).await;
    let root = &j.root;
    // One tree per kind of hidden entry: a glob on the name, one on the path, a denylist entry.
    for (d, hidden, kept) in [
        ("d1", "sub/.env", vec!["sub", "sub/.env"]),
        ("d2", "sub/key.pem", vec!["sub", "sub/key.pem"]),
        ("d3", "deny", vec!["deny"]),
    ] {
        std::fs::create_dir_all(root.join(d).join("sub/deeper")).unwrap();
        std::fs::write(root.join(d).join("a.txt"), "a").unwrap();
        std::fs::write(root.join(d).join("sub/deeper/b.txt"), "b").unwrap();
        std::fs::write(root.join(d).join(hidden), "SECRET").unwrap();
        let r = h
            .ok("shell::fs::rm", json!({"path": d, "recursive": true}))
            .await;
        assert_eq!(
            r,
            json!({"removed": false, "path": s(&root.join(d)), "was_present": true}),
            "{d}"
        );
        let want: Vec<_> = kept.iter().map(|k| root.join(d).join(k)).collect();
        assert_eq!(
            walk(&root.join(d)),
            want,
            "{d}: only the protected entry stays"
        );
        same_bytes(
            std::fs::read(root.join(d).join(hidden)).unwrap(),
            b"SECRET",
            d,
        );
        // What ls shows of it is gone: the listing is empty.
        let ls = h.ok("shell::fs::ls", json!({"path": d})).await;
        let names: Vec<&str> = ls["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["name"].as_str())
            .filter(|n| *n != "sub" && *n != "deny")
            .collect();
        assert!(names.is_empty(), "{d}: {ls}");
    }
    // Non-recursive: a directory whose only entries are hidden answers the same way; one with
    // a visible entry too is "not empty".
    std::fs::create_dir(root.join("only")).unwrap();
    std::fs::write(root.join("only/.env"), "SECRET").unwrap();
    let e = expect_code(&h, "shell::fs::rm", json!({"path": "only"}), "S211").await;
    assert_eq!(e.message, "path not found or not accessible: only");
    assert!(root.join("only/.env").exists());
    std::fs::write(root.join("only/visible"), "v").unwrap();
    expect_code(&h, "shell::fs::rm", json!({"path": "only"}), "S214").await;
    // Without hidden entries the tree goes.
    std::fs::create_dir_all(root.join("plain/x/y")).unwrap();
    std::fs::write(root.join("plain/x/y/z"), "z").unwrap();
    h.ok("shell::fs::rm", json!({"path": "plain", "recursive": true}))
        .await;
    assert!(!root.join("plain").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_write_with_a_failing_entry_changes_no_target() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    let root = &j.root;
    std::fs::write(root.join("old.txt"), "OLD").unwrap();
    std::fs::create_dir(root.join("adir")).unwrap();
    let before = names_in(root);
    for (bad, code, needle) in [
        (
            json!({"path": "adir", "content": "x"}),
            "S212",
            "files[2] (adir)",
        ),
        (
            json!({"path": "missing/f", "content": "x"}),
            "S211",
            "not accessible: missing/f",
        ),
        (
            json!({"path": "../escape", "content": "x"}),
            "S215",
            "../escape",
        ),
    ] {
        let e = expect_code(
            &h,
            "shell::fs::write",
            json!({"files": [
                {"path": "new.txt", "content": "NEW"},
                {"path": "old.txt", "content": "REPLACED"},
                bad,
            ]}),
            code,
        )
        .await;
        assert!(e.message.contains(needle), "{e:?}");
        assert_eq!(names_in(root), before, "a target or a temp file was left");
        assert_eq!(std::fs::read(root.join("old.txt")).unwrap(), b"OLD");
    }
    j.outside_untouched();
    // All valid: every entry lands.
    let r = h
        .ok(
            "shell::fs::write",
            json!({"files": [
                {"path": "new.txt", "content": "NEW"},
                {"path": "old.txt", "content": "REPLACED"},
            ]}),
        )
        .await;
    assert_eq!(r["bytes_written"], 11);
    assert_eq!(std::fs::read(root.join("old.txt")).unwrap(), b"REPLACED");
    assert_eq!(std::fs::read(root.join("new.txt")).unwrap(), b"NEW");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stat_with_a_trailing_slash_and_symlink_entries() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    let root = &j.root;
    std::fs::write(root.join("file"), "12345").unwrap();
    std::fs::set_permissions(root.join("file"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(root.join("dir")).unwrap();
    std::os::unix::fs::symlink("file", root.join("link")).unwrap();
    std::os::unix::fs::symlink("dir", root.join("dlink")).unwrap();
    for p in ["file/", "link/"] {
        let e = expect_code(&h, "shell::fs::stat", json!({"path": p}), "S212").await;
        assert_eq!(e.message, format!("not a directory: {p}"));
    }
    let st = h.ok("shell::fs::stat", json!({"path": "dir/"})).await;
    assert_eq!(st["is_dir"], true);
    let st = h.ok("shell::fs::stat", json!({"path": "dlink/"})).await;
    assert_eq!(st["is_dir"], true);
    // A link's entry describes its target, all of it; only is_symlink describes the link.
    let md = std::fs::metadata(root.join("file")).unwrap();
    let st = h.ok("shell::fs::stat", json!({"path": "link"})).await;
    assert_eq!(
        st,
        json!({"name": "link", "is_dir": false, "is_symlink": true, "mode": "0600", "size": 5, "mtime": md.mtime()})
    );
    let ls = h.ok("shell::fs::ls", json!({"path": "."})).await;
    let link = ls["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "link")
        .unwrap()
        .clone();
    assert_eq!(link, st);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_jail_root_says_roots_cannot_be_moved() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    std::fs::create_dir(j.root.join("sub")).unwrap();
    for (src, dst) in [
        (s(&j.root), "sub/moved".to_string()),
        (".".to_string(), "sub/moved".to_string()),
        ("sub".to_string(), s(&j.root)),
    ] {
        let e = expect_code(
            &h,
            "shell::fs::mv",
            json!({"src": src, "dst": dst, "overwrite": true}),
            "S210",
        )
        .await;
        assert!(e.message.contains("jail roots cannot be moved"), "{e:?}");
    }
    assert!(j.root.join("sub").is_dir());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_list_page_size_zero_and_relative_read_bytes_unjailed() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    std::fs::create_dir_all(j.root.join("p/a")).unwrap();
    let e = expect_code(
        &h,
        "shell::workspace::list",
        json!({"path": "p", "page_size": 0}),
        "S210",
    )
    .await;
    assert!(e.message.contains("page_size"), "{e:?}");
    drop(h);

    // Unjailed, a relative path anchors like coder::* anchors it: the working directory,
    // then /tmp.
    let mut c = Config::builtin_default();
    c.fs.host_roots.clear();
    c.fs.allow_unjailed = true;
    let h = Harness::new(c).await;
    let dir = tempfile::Builder::new()
        .prefix("iii-rb-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::write(dir.path().join("f.txt"), "anchored").unwrap();
    let name = dir
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let rel = format!("{name}/f.txt");
    let r = h
        .ok("shell::workspace::read-bytes", json!({"path": rel}))
        .await;
    assert_eq!(b64(&r), b"anchored");
    assert_eq!(r["path"], s(&canon(&dir.path().join("f.txt"))));
    let e = expect_code(
        &h,
        "shell::workspace::read-bytes",
        json!({"path": "no-such-dir-iii/f"}),
        "S211",
    )
    .await;
    assert_eq!(
        e.message,
        "path not found or not accessible: no-such-dir-iii/f"
    );
    expect_code(
        &h,
        "shell::workspace::read-bytes",
        json!({"path": "../etc/hostname"}),
        "S215",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chmod_chowns_when_the_pinned_envelope_keeps_cap_chown() {
    if !is_root() {
        panic!("this test needs root (CAP_CHOWN to keep); run it as root");
    }
    let j = Jail::new();
    let mut c = jailed(&j.root);
    c.confinement.capabilities = vec!["CAP_CHOWN".into()];
    let pin_dir = tempdir();
    let pin = pin_dir.path().join("envelope.yaml");
    std::fs::write(&pin, serde_norway::to_string(&c).unwrap()).unwrap();
    std::fs::set_permissions(&pin, std::fs::Permissions::from_mode(0o644)).unwrap();
    let pin = s(&pin);
    let h = Harness::with_args(c, &["--pin-config", &pin]).await;
    std::fs::create_dir_all(j.root.join("d/e")).unwrap();
    std::fs::write(j.root.join("d/e/f"), "x").unwrap();
    let r = h
        .ok(
            "shell::fs::chmod",
            json!({"path": "d", "mode": "0750", "uid": 4321, "gid": 8765, "recursive": true}),
        )
        .await;
    assert_eq!(r["entries_changed"], 3, "{r}");
    for p in ["d", "d/e", "d/e/f"] {
        let md = std::fs::symlink_metadata(j.root.join(p)).unwrap();
        assert_eq!(
            (md.uid(), md.gid(), md.mode() & 0o7777),
            (4321, 8765, 0o750),
            "{p}"
        );
    }
    // CAP_CHOWN would let a command chown another session's pty back to itself: doctor
    // says so among the gaps (and the executor warned when it took the policy).
    use iii_shell_protocol::messages::{Reply, Request};
    let Reply::Doctor(report) = h.services.executor.call(Request::Doctor).await.unwrap() else {
        panic!("not a doctor reply")
    };
    assert!(
        report
            .commands
            .gaps
            .iter()
            .any(|g| g.starts_with("confinement.capabilities grants CAP_CHOWN: ")),
        "{:?}",
        report.commands.gaps
    );
    // A test HOME outside the jail (root's /root) is replaced by the per-worker one in the
    // first scratch path; one inside a scratch path is kept. Doctor names it either way,
    // and has no HOME gap.
    let own = std::env::var("HOME").unwrap_or_default();
    if iii_shell_policy::home::inside(&own, &[], &c_scratch()) {
        assert_eq!(
            report.commands.home,
            format!("{own} (the worker's own HOME)")
        );
    } else {
        assert!(
            report.commands.home.starts_with("/tmp/iii-shell-home-0-")
                && report.commands.home.ends_with(" (the per-worker default: owned by uid 0, mode 0700, kept across calls and restarts)"),
            "{}",
            report.commands.home
        );
    }
    assert!(
        !report.commands.gaps.iter().any(|g| g.contains("HOME")),
        "{:?}",
        report.commands.gaps
    );
}

/// The shipped scratch paths.
fn c_scratch() -> Vec<String> {
    Config::builtin_default().confinement.scratch_paths
}

// ---------------------------------------------------------------- fs_scope

/// `fs_scope.scope_root` confines every `shell::fs::*` call as it does `coder::*`: a path
/// outside the scope (spelled outside it, relative from the primary root, or reached
/// through a link inside it) is S220 naming the scope, and nothing is read or written
/// there; a path that leaves the whole jail stays S215; inside the scope every function
/// works. The metadata form of the scope counts too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_call_reaches_only_its_scope() {
    let j = Jail::new();
    let h = Harness::new(jailed(&j.root)).await;
    let root = &j.root;
    let proj = root.join("proj");
    std::fs::create_dir_all(proj.join("src")).unwrap();
    std::fs::create_dir_all(root.join("other")).unwrap();
    std::fs::write(proj.join("src/in.txt"), "needle in\n").unwrap();
    std::fs::write(root.join("other/out.txt"), "needle out\n").unwrap();
    std::os::unix::fs::symlink("../other", proj.join("dirlink")).unwrap();
    std::os::unix::fs::symlink("../other/out.txt", proj.join("filelink")).unwrap();
    std::os::unix::fs::symlink(&j.outside, proj.join("jaillink")).unwrap();
    let scope = json!({"scope_root": s(&proj)});
    let scoped = |mut p: Value| {
        p["fs_scope"] = scope.clone();
        p
    };
    let out = s(&root.join("other/out.txt"));
    let outside_scope: Vec<(&str, Value)> = vec![
        ("shell::fs::stat", json!({"path": out})),
        ("shell::fs::stat", json!({"path": "other/out.txt"})),
        (
            "shell::fs::sed",
            json!({"path": s(&proj.join("filelink")), "pattern": "needle", "replacement": "x"}),
        ),
        ("shell::fs::ls", json!({"path": s(&proj.join("dirlink"))})),
        ("shell::fs::ls", json!({"path": s(&root.join("other"))})),
        (
            "shell::fs::mkdir",
            json!({"path": s(&root.join("other/new"))}),
        ),
        (
            "shell::fs::mkdir",
            json!({"path": s(&proj.join("dirlink/new2"))}),
        ),
        ("shell::fs::rm", json!({"path": out})),
        ("shell::fs::chmod", json!({"path": out, "mode": "0600"})),
        (
            "shell::fs::mv",
            json!({"src": out, "dst": s(&proj.join("stolen.txt"))}),
        ),
        (
            "shell::fs::mv",
            json!({"src": s(&proj.join("src/in.txt")), "dst": s(&root.join("other/put.txt"))}),
        ),
        (
            "shell::fs::grep",
            json!({"path": s(&root.join("other")), "pattern": "needle"}),
        ),
        (
            "shell::fs::sed",
            json!({"path": out, "pattern": "needle", "replacement": "x"}),
        ),
        (
            "shell::fs::write",
            json!({"path": s(&root.join("other/w.txt")), "content": "x"}),
        ),
        (
            "shell::fs::write",
            json!({"path": s(&proj.join("dirlink/w2.txt")), "content": "x"}),
        ),
        (
            "shell::fs::write",
            json!({"files": [
                {"path": s(&proj.join("src/ok.txt")), "content": "x"},
                {"path": s(&root.join("other/w3.txt")), "content": "x"},
            ]}),
        ),
    ];
    for (f, p) in outside_scope {
        let e = expect_code(&h, f, scoped(p.clone()), "S220").await;
        assert!(e.message.contains(&s(&proj)), "{f} {p}: {e:?}");
    }
    // The per-entry form of sed says so per entry.
    let r = h
        .ok(
            "shell::fs::sed",
            scoped(json!({"files": [out], "pattern": "needle", "replacement": "x"})),
        )
        .await;
    assert_eq!(r["results"][0]["success"], false, "{r}");
    assert!(
        r["results"][0]["error"]
            .as_str()
            .unwrap()
            .starts_with(&format!(
                "path is outside this session's scope root {}",
                s(&proj)
            )),
        "{r}"
    );
    let e = expect_code(
        &h,
        "shell::fs::ls",
        scoped(json!({"path": s(&proj.join("jaillink"))})),
        "S215",
    )
    .await;
    assert!(!e.message.contains("scope"), "{e:?}");
    // Nothing happened outside the scope.
    let mut other: Vec<String> = std::fs::read_dir(root.join("other"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    other.sort();
    assert_eq!(other, ["out.txt"]);
    assert_eq!(
        std::fs::read_to_string(root.join("other/out.txt")).unwrap(),
        "needle out\n"
    );
    assert!(!proj.join("stolen.txt").exists());
    assert!(proj.join("src/in.txt").exists());
    // Inside the scope everything works.
    h.ok(
        "shell::fs::stat",
        scoped(json!({"path": s(&proj.join("src/in.txt"))})),
    )
    .await;
    h.ok("shell::fs::ls", scoped(json!({"path": s(&proj)})))
        .await;
    h.ok(
        "shell::fs::write",
        scoped(json!({"path": s(&proj.join("new/w.txt")), "content": "w", "parents": true})),
    )
    .await;
    let g = h
        .ok(
            "shell::fs::grep",
            scoped(json!({"path": s(&proj), "pattern": "needle", "recursive": true})),
        )
        .await;
    assert_eq!(g["matches"].as_array().unwrap().len(), 1, "{g}");
    h.ok(
        "shell::fs::mv",
        scoped(json!({"src": s(&proj.join("new/w.txt")), "dst": s(&proj.join("w.txt"))})),
    )
    .await;
    // A scope that is not a directory inside the jail is refused as a bad request.
    let mut bad = json!({"path": s(&proj)});
    bad["fs_scope"] = json!({"scope_root": s(&j.outside)});
    expect_code(&h, "shell::fs::stat", bad, "S210").await;
    // The metadata form.
    let meta = iii_shell_broker::functions::CallMeta {
        metadata: Some(json!({"fs_scope": {"scope_root": s(&proj)}})),
    };
    let e = iii_shell_broker::functions::dispatch(
        &h.services,
        "shell::fs::stat",
        json!({"path": out}),
        meta,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, "S220");
    // Unscoped, the same path is fine.
    h.ok("shell::fs::stat", json!({"path": out})).await;
}
