//! The turn history against hostile callers and a changing policy: bodies served under the
//! policy in force, bounded hook state, no store-wide lock across a fold, revert racing a
//! command that swaps the file, a deleted root, concurrent hooks on one session.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use iii_shell_policy::sync::lock;
use serde_json::{json, Value};

use super::model::revision;
use super::{Turns, MAX_HOOK_SESSIONS};
use crate::policy::Policy;

struct Setup {
    _d: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    data: PathBuf,
}

fn setup() -> Setup {
    let d = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(d.path()).unwrap();
    let (root, data) = (base.join("root"), base.join("data"));
    std::fs::create_dir_all(root.join("sub")).unwrap();
    Setup {
        _d: d,
        base,
        root,
        data,
    }
}

/// A policy over `roots` with the store in `data` and `extra` merged in at the top level.
fn policy_with(roots: &[&Path], data: &Path, code: Value, deny: &[PathBuf]) -> Policy {
    // No scratch paths: the store in the temp dir stays out of commands' reach in place.
    let v = json!({"fs": {"host_roots": roots, "denylist_paths": deny},
        "confinement": {"scratch_paths": []},
        "code": code, "turns": {"data_dir": data, "max_blob_bytes": 1u64 << 30}});
    Policy::build(1, &v.to_string()).expect("policy")
}

fn call(t: &Turns, p: &Policy, f: &str, v: Value) -> Value {
    t.call(p, f, &v.to_string()).unwrap()
}

fn start(t: &Turns, p: &Policy) {
    call(
        t,
        p,
        "shell::turns::on-turn-started",
        json!({"session_id": "s1", "turn_id": "t1"}),
    );
}

/// A hooked `shell::fs::write` of `path` (absolute) to `body`.
fn write_hooked(t: &Turns, p: &Policy, path: &Path, body: &str) {
    let h = json!({"session_id": "s1", "turn_id": "t1",
        "call": {"function_id": "shell::fs::write", "arguments": {"path": path}}});
    call(t, p, "shell::turns::on-pre-trigger", h.clone());
    std::fs::write(path, body).unwrap();
    let mut post = h;
    post["result"] = json!({"is_error": false});
    call(t, p, "shell::turns::on-post-trigger", post);
}

fn file<'a>(got: &'a Value, path: &Path) -> &'a Value {
    got["turn"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path.to_string_lossy().as_ref())
        .unwrap_or_else(|| panic!("{} not in {got}", path.display()))
}

fn result<'a>(rv: &'a Value, path: &Path) -> &'a Value {
    rv["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["path"] == path.to_string_lossy().as_ref())
        .unwrap_or_else(|| panic!("{} not in {rv}", path.display()))
}

/// Removes the blob of `body` from the store: the body is then "no longer kept".
fn evict(data: &Path, body: &str) {
    let r = revision(body.as_bytes());
    let h = &r["sha256:".len()..];
    std::fs::remove_file(data.join("objects").join(&h[..2]).join(h)).unwrap();
}

/// Why a file is unreachable, the policy and request fields that make it so, and the files
/// (with their recorded revisions) it hides.
type Case<'a> = (&'a str, &'a Policy, Value, Vec<(&'a PathBuf, &'a str)>);

/// A body made non-accessible, denylisted, outside the roots or outside the caller's scope
/// since it was recorded reads exactly like a body no longer kept (an evicted one), in `get`
/// and in `revert`, and revert never writes it, forced or not.
#[test]
fn a_body_made_unreachable_reads_like_one_no_longer_kept_and_is_never_written() {
    let s = setup();
    let (secret, inner, evicted) = (s.root.join("a.env"), s.root.join("sub/b"), s.root.join("c"));
    for (f, b) in [(&secret, "secret"), (&inner, "bee"), (&evicted, "sea")] {
        std::fs::write(f, b).unwrap();
    }
    let open = policy_with(&[&s.root], &s.data, json!({}), &[]);
    let t = Turns::default();
    start(&t, &open);
    for (f, b) in [(&secret, "secret2"), (&inner, "bee2"), (&evicted, "sea2")] {
        write_hooked(&t, &open, f, b);
    }
    evict(&s.data, "sea");
    let get = |p: &Policy, extra: Value| {
        let mut req = json!({"session_id": "s1", "turn_id": "t1"});
        if let Some(o) = extra.as_object() {
            for (k, v) in o {
                req[k] = v.clone();
            }
        }
        call(&t, p, "shell::turns::get", req)
    };
    let got = get(&open, json!({}));
    assert_eq!(file(&got, &secret)["before"]["content"], "secret", "{got}");
    let gone = file(&got, &evicted)["before"].clone();
    assert_eq!(gone["stored"], false, "{got}");
    // The shape of a body no longer kept, with the file's own revision.
    let like_gone = |rev: &str| {
        let mut v = gone.clone();
        v["revision"] = json!(rev);
        v
    };
    let (rev_secret, rev_inner) = (revision(b"secret"), revision(b"bee"));

    let glob = policy_with(
        &[&s.root],
        &s.data,
        json!({"non_accessible_globs": ["**/*.env"]}),
        &[],
    );
    let deny = policy_with(&[&s.root], &s.data, json!({}), &[s.root.join("sub")]);
    let other = s.base.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let moved_root = policy_with(&[&other], &s.data, json!({}), &[]);
    let cases: [Case<'_>; 4] = [
        (
            "non-accessible glob",
            &glob,
            json!({}),
            vec![(&secret, &rev_secret)],
        ),
        ("denylist", &deny, json!({}), vec![(&inner, &rev_inner)]),
        (
            "root removed",
            &moved_root,
            json!({}),
            vec![(&secret, &rev_secret), (&inner, &rev_inner)],
        ),
        (
            "outside the fs_scope",
            &open,
            json!({"fs_scope": {"scope_root": s.root.join("sub")}}),
            vec![(&secret, &rev_secret)],
        ),
    ];
    for (why, p, extra, hidden) in &cases {
        let got = get(p, extra.clone());
        for (path, rev) in hidden {
            assert_eq!(file(&got, path)["before"], like_gone(rev), "{why}: {got}");
        }
        // Only the hidden files and the evicted one: the others would be restored.
        let mut paths: Vec<&PathBuf> = hidden.iter().map(|(p, _)| *p).collect();
        paths.push(&evicted);
        let mut req = json!({"session_id": "s1", "turn_id": "t1", "force": true, "paths": paths});
        if let Some(scope) = extra.get("fs_scope") {
            req["fs_scope"] = scope.clone();
        }
        let rv = call(&t, p, "shell::turns::revert", req);
        let evicted_error = result(&rv, &evicted)["error"].as_str().map(String::from);
        for (path, _) in hidden {
            let r = result(&rv, path);
            assert_eq!(
                (&r["action"], &r["success"]),
                (&json!("restored"), &json!(false)),
                "{why}: {rv}"
            );
            // The evicted file's error, naming this file.
            if let Some(e) = &evicted_error {
                let want = e.replace(&*evicted.to_string_lossy(), &path.to_string_lossy());
                assert_eq!(r["error"], want.as_str(), "{why}: {rv}");
            }
        }
        assert_eq!(
            std::fs::read_to_string(&secret).unwrap(),
            "secret2",
            "{why}"
        );
        assert_eq!(std::fs::read_to_string(&inner).unwrap(), "bee2", "{why}");
    }
    // Under the policy it was recorded in, the same turn still reverts.
    let rv = call(
        &t,
        &open,
        "shell::turns::revert",
        json!({"session_id": "s1", "turn_id": "t1", "paths": [secret, inner]}),
    );
    assert_eq!(rv["reverted"], 2, "{rv}");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "secret");
}

/// A body recorded through a link (the path named a link to another file of the root) is
/// served only while the file it resolved to is reachable too.
#[test]
fn a_body_read_through_a_link_follows_the_policy_of_its_target() {
    let s = setup();
    std::fs::create_dir_all(s.root.join("keys")).unwrap();
    std::fs::write(s.root.join("keys/k"), "key").unwrap();
    std::os::unix::fs::symlink("keys", s.root.join("alias")).unwrap();
    let open = policy_with(&[&s.root], &s.data, json!({}), &[]);
    let t = Turns::default();
    start(&t, &open);
    let via = s.root.join("alias/k");
    write_hooked(&t, &open, &via, "key2");
    std::fs::remove_file(s.root.join("alias")).unwrap();
    let deny = policy_with(&[&s.root], &s.data, json!({}), &[s.root.join("keys")]);
    let got = call(
        &t,
        &deny,
        "shell::turns::get",
        json!({"session_id": "s1", "turn_id": "t1"}),
    );
    assert_eq!(file(&got, &via)["before"]["stored"], false, "{got}");
    assert!(file(&got, &via)["before"].get("content").is_none(), "{got}");
}

/// TURNS-15: a turn reverted a second time reports every file `skipped` (a success), and
/// changes nothing.
#[test]
fn reverting_a_turn_twice_skips_the_second_time() {
    let s = setup();
    let (m, c) = (s.root.join("m"), s.root.join("c"));
    std::fs::write(&m, "one").unwrap();
    let p = policy_with(&[&s.root], &s.data, json!({}), &[]);
    let t = Turns::default();
    start(&t, &p);
    write_hooked(&t, &p, &m, "two");
    write_hooked(&t, &p, &c, "made");
    let rv = |t: &Turns| {
        call(
            t,
            &p,
            "shell::turns::revert",
            json!({"session_id": "s1", "turn_id": "t1"}),
        )
    };
    let first = rv(&t);
    assert_eq!(
        (&first["reverted"], &first["failed"]),
        (&json!(2), &json!(0)),
        "{first}"
    );
    let second = rv(&t);
    assert_eq!(
        (&second["reverted"], &second["failed"]),
        (&json!(2), &json!(0)),
        "{second}"
    );
    for r in second["results"].as_array().unwrap() {
        assert_eq!(
            (&r["action"], &r["success"]),
            (&json!("skipped"), &json!(true)),
            "{second}"
        );
    }
    assert_eq!(std::fs::read_to_string(&m).unwrap(), "one");
    assert!(!c.exists());
}

/// TURNS-05: a hooked recursive `rm` that failed without removing anything leaves the turn's
/// record as it was: none of the tree's files is listed.
#[test]
fn a_failed_hooked_recursive_rm_leaves_the_record_as_it_was() {
    let s = setup();
    let dir = s.root.join("tree");
    std::fs::create_dir_all(dir.join("d")).unwrap();
    for f in ["a", "d/b"] {
        std::fs::write(dir.join(f), f).unwrap();
    }
    let p = policy_with(&[&s.root], &s.data, json!({}), &[]);
    let t = Turns::default();
    start(&t, &p);
    let h = json!({"session_id": "s1", "turn_id": "t1", "call": {"function_id": "shell::fs::rm",
        "arguments": {"path": dir, "recursive": true}}});
    call(&t, &p, "shell::turns::on-pre-trigger", h.clone());
    // The call fails; nothing is removed.
    let mut post = h;
    post["result"] = json!({"is_error": true});
    call(&t, &p, "shell::turns::on-post-trigger", post);
    let list = call(&t, &p, "shell::turns::list", json!({"session_id": "s1"}));
    assert_eq!(list["turns"][0]["file_count"], 0, "{list}");
}

/// The hooks' per-session maps hold at most `MAX_HOOK_SESSIONS` sessions however many ids a
/// caller sends, and the most recent ones still work.
#[test]
fn the_hook_maps_are_bounded() {
    let s = setup();
    let data = Path::new("/dev/shm")
        .is_dir()
        .then(|| tempfile::tempdir_in("/dev/shm").unwrap());
    let data_dir = data
        .as_ref()
        .map_or(s.data.clone(), |d| d.path().to_path_buf());
    let p = policy_with(&[&s.root], &data_dir, json!({}), &[]);
    let t = Turns::default();
    let n = MAX_HOOK_SESSIONS + 50;
    for i in 0..n {
        // A sub-agent's hook: learns its parent link, records nothing.
        let h = json!({"session_id": format!("sub-{i}"), "turn_id": "x",
            "metadata": {"parent_session_id": format!("top-{i}"), "parent_turn_id": "t"}});
        call(&t, &p, "shell::turns::on-pre-trigger", h);
        call(
            &t,
            &p,
            "shell::turns::on-turn-started",
            json!({"session_id": format!("top-{i}"), "turn_id": "t"}),
        );
    }
    assert_eq!(lock(&t.parents).len(), MAX_HOOK_SESSIONS);
    assert_eq!(lock(&t.active).len(), MAX_HOOK_SESSIONS);
    // The newest sub-agent still records under its parent's turn.
    std::fs::write(s.root.join("f"), "x").unwrap();
    let h = json!({"session_id": format!("sub-{}", n - 1), "turn_id": "x",
        "call": {"function_id": "shell::fs::write", "arguments": {"path": s.root.join("f")}}});
    call(&t, &p, "shell::turns::on-pre-trigger", h);
    let list = call(
        &t,
        &p,
        "shell::turns::list",
        json!({"session_id": format!("top-{}", n - 1)}),
    );
    assert_eq!(list["turns"][0]["file_count"], 1, "{list}");
}

/// A FIFO planted as one session's log never blocks its `list` (the store opens it
/// non-blocking and reads only regular files), and a `list` holds no lock the other sessions
/// need: a turn of another session starts and records meanwhile.
#[test]
fn a_fold_holds_no_lock_other_sessions_wait_for() {
    let s = setup();
    let p = Arc::new(policy_with(&[&s.root], &s.data, json!({}), &[]));
    let t = Arc::new(Turns::default());
    call(&t, &p, "shell::turns::list", json!({"session_id": "warm"}));
    let fifo = s.data.join("sessions/stuck.jsonl");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let lister = {
        let (t, p) = (Arc::clone(&t), Arc::clone(&p));
        std::thread::spawn(move || {
            t.call(
                &p,
                "shell::turns::list",
                &json!({"session_id": "stuck"}).to_string(),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (t, p) = (Arc::clone(&t), Arc::clone(&p));
        std::thread::spawn(move || {
            let r = t.call(
                &p,
                "shell::turns::on-turn-started",
                &json!({"session_id": "other", "turn_id": "t"}).to_string(),
            );
            let _ = tx.send(r.is_ok());
        });
    }
    let other = rx.recv_timeout(Duration::from_secs(20));
    // Unblock a lister that did open the FIFO (a writer that closes at once: an empty log);
    // with no reader the non-blocking open fails, which is the expected case.
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo);
    let listed = lister.join().unwrap();
    assert_eq!(
        other,
        Ok(true),
        "another session's turn waited for the fold"
    );
    assert!(listed.is_ok(), "{listed:?}");
}

/// Hooked calls of one session from many threads at once: every change is recorded, and the
/// log's header is its first line.
#[test]
fn concurrent_hooked_calls_on_one_session_all_record() {
    let s = setup();
    let p = Arc::new(policy_with(&[&s.root], &s.data, json!({}), &[]));
    let t = Arc::new(Turns::default());
    start(&t, &p);
    let threads: Vec<_> = (0..8)
        .map(|k| {
            let (t, p, root) = (Arc::clone(&t), Arc::clone(&p), s.root.clone());
            std::thread::spawn(move || {
                for i in 0..25 {
                    write_hooked(&t, &p, &root.join(format!("f{k}-{i}")), "x");
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let list = call(&t, &p, "shell::turns::list", json!({"session_id": "s1"}));
    assert_eq!(list["turns"][0]["file_count"], 200, "{list}");
    let log = std::fs::read_to_string(s.data.join("sessions/s1.jsonl")).unwrap();
    let first: Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    assert_eq!(first, json!({"t": "session", "session_id": "s1"}));
    assert!(log
        .lines()
        .all(|l| serde_json::from_str::<Value>(l).is_ok()));
}

/// A command swaps the recorded file for a symlink out of the root, or a FIFO, between the
/// record and the revert: the revert neither follows the link (the file outside is untouched)
/// nor blocks on the FIFO, forced or not. Unforced, both are refused; forced, the link itself
/// is replaced by the body (never written through), and the FIFO is still left alone.
#[test]
fn a_revert_racing_a_swap_to_a_link_or_fifo_never_follows_it_or_blocks() {
    let s = setup();
    let outside = s.base.join("outside.txt");
    std::fs::write(&outside, "outside").unwrap();
    let (l, f) = (s.root.join("l"), s.root.join("f"));
    std::fs::write(&l, "one").unwrap();
    std::fs::write(&f, "one").unwrap();
    let p = Arc::new(policy_with(&[&s.root], &s.data, json!({}), &[]));
    let t = Arc::new(Turns::default());
    start(&t, &p);
    write_hooked(&t, &p, &l, "two");
    write_hooked(&t, &p, &f, "two");
    std::fs::remove_file(&l).unwrap();
    std::os::unix::fs::symlink(&outside, &l).unwrap();
    std::fs::remove_file(&f).unwrap();
    nix::unistd::mkfifo(&f, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    for force in [false, true] {
        let (tx, rx) = std::sync::mpsc::channel();
        let (t2, p2) = (Arc::clone(&t), Arc::clone(&p));
        std::thread::spawn(move || {
            let _ = tx.send(t2.call(
                &p2,
                "shell::turns::revert",
                &json!({"session_id": "s1", "turn_id": "t1", "force": force}).to_string(),
            ));
        });
        let rv = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("revert answered")
            .unwrap();
        // The FIFO is never read or written; unforced, the link is refused as changed since.
        let fifo = result(&rv, &f);
        assert_eq!(
            (&fifo["action"], &fifo["success"]),
            (&json!("skipped"), &json!(false)),
            "{rv}"
        );
        assert_eq!(
            std::fs::read_to_string(&outside).unwrap(),
            "outside",
            "force {force}"
        );
        let link = std::fs::symlink_metadata(&l).unwrap().file_type();
        assert!(std::fs::symlink_metadata(&f).unwrap().file_type().is_fifo());
        if force {
            // Forced, the link itself is replaced by the body before the turn.
            assert_eq!(result(&rv, &l)["success"], true, "{rv}");
            assert!(link.is_file());
            assert_eq!(std::fs::read_to_string(&l).unwrap(), "one");
        } else {
            assert_eq!(rv["failed"], 2, "{rv}");
            assert!(link.is_symlink());
        }
    }
}

/// The root a turn recorded in is deleted: list and get still answer, revert reports each
/// file failed and creates nothing.
#[test]
fn a_deleted_root_lists_gets_and_reverts_nothing() {
    let s = setup();
    let a = s.root.join("a");
    std::fs::write(&a, "one").unwrap();
    let p = policy_with(&[&s.root], &s.data, json!({}), &[]);
    let t = Turns::default();
    start(&t, &p);
    write_hooked(&t, &p, &a, "two");
    std::fs::remove_dir_all(&s.root).unwrap();
    let list = call(&t, &p, "shell::turns::list", json!({"session_id": "s1"}));
    assert_eq!(list["turns"][0]["file_count"], 1, "{list}");
    let got = call(&t, &p, "shell::turns::get", json!({"session_id": "s1"}));
    assert_eq!(file(&got, &a)["before"]["content"], "one", "{got}");
    let rv = call(
        &t,
        &p,
        "shell::turns::revert",
        json!({"session_id": "s1", "turn_id": "t1", "force": true}),
    );
    assert_eq!(
        (&rv["reverted"], &rv["failed"]),
        (&json!(0), &json!(1)),
        "{rv}"
    );
    assert!(!s.root.exists(), "nothing recreated");
}

/// Many entries in one turn: a turn of 20,000 recorded paths (half of them dropped again by a
/// failed call) lists each kept path once, in order.
#[test]
fn a_turn_of_many_paths_folds_each_once() {
    let n = 20_000;
    let recs: Vec<Value> = std::iter::once(json!({"t": "start", "turn_id": "t", "started_at": 1}))
        .chain((0..n).flat_map(|i| {
            let path = format!("/r/f{i}");
            let rev = format!("sha256:{i}");
            [
                json!({"t": "pre", "turn_id": "t", "path": path, "kind": "modified", "before": {"revision": rev}, "at": 2}),
                if i % 2 == 0 {
                    json!({"t": "post", "turn_id": "t", "path": path, "after_revision": "sha256:x", "at": 3})
                } else {
                    json!({"t": "drop_if_same", "turn_id": "t", "path": path, "revision": rev})
                },
            ]
        }))
        .collect();
    let turns = super::fold(&recs);
    let paths: Vec<&str> = turns[0].files.iter().map(|f| f.path.as_str()).collect();
    let want: Vec<String> = (0..n).step_by(2).map(|i| format!("/r/f{i}")).collect();
    assert_eq!(paths, want);
}
