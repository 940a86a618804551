//! The fs surface's resource-exhaustion suite: trees a hostile command could build (deep,
//! wide, looping), replies that outgrow a frame and edits that outgrow their input, all
//! through the real executor process. Every case asserts that the call answers (within a
//! bound, never a hang), with the documented code, and that the executor is still the same
//! live process afterwards. Cases that could use much memory run the executor under its own
//! RLIMIT_AS, so a regression fails the test instead of harming the machine.

use crate::common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::WireError;
use serde_json::{json, Value};

/// Deeper than PATH_MAX allows to address by path, as in the issue (9,000 levels).
const DEEP: usize = 9000;
/// The executor's documented bound (`fs::walk::MAX_TREE_DEPTH`).
const MAX_TREE_DEPTH: usize = 256;

/// A temp dir removed with `rm -rf` (which handles trees deeper than PATH_MAX), not
/// `remove_dir_all`.
struct Tree {
    dir: PathBuf,
}

impl Tree {
    fn new() -> Tree {
        let t = tempdir();
        let dir = canon(&t.keep());
        Tree { dir }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chmod")
            .args(["-R", "u+rwx"])
            .arg(&self.dir)
            .status();
        let _ = std::process::Command::new("rm")
            .arg("-rf")
            .arg(&self.dir)
            .status();
    }
}

fn open_dir(p: &Path) -> OwnedFd {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: open of a NUL-terminated path; the fd is fresh and owned here.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    assert!(fd >= 0, "open {p:?}: {}", std::io::Error::last_os_error());
    // SAFETY: a new descriptor nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `depth` nested `d` directories below `base/name`, each holding a `f` file, made with
/// fd-relative calls (as `sh -c 'while mkdir d && cd d; do :; done'` would), so the depth is
/// not limited by PATH_MAX.
fn nest(base: &Path, name: &str, depth: usize) {
    std::fs::create_dir(base.join(name)).unwrap();
    let mut cur = open_dir(&base.join(name));
    for _ in 0..depth {
        // SAFETY: *at calls on a directory fd we own with NUL-terminated names.
        unsafe {
            assert_eq!(libc::mkdirat(cur.as_raw_fd(), c"d".as_ptr(), 0o755), 0);
            let f = libc::openat(
                cur.as_raw_fd(),
                c"f".as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                0o644,
            );
            assert!(f >= 0);
            assert_eq!(libc::write(f, b"needle\n".as_ptr().cast(), 7), 7);
            libc::close(f);
            let next = libc::openat(
                cur.as_raw_fd(),
                c"d".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            );
            assert!(next >= 0);
            cur = OwnedFd::from_raw_fd(next);
        }
    }
}

/// How many `d` levels are below `base/name` (fd-relative, like `nest`).
fn depth_of(base: &Path, name: &str) -> usize {
    let mut cur = open_dir(&base.join(name));
    let mut n = 0;
    loop {
        // SAFETY: openat on a directory fd we own with a NUL-terminated name.
        let next = unsafe {
            libc::openat(
                cur.as_raw_fd(),
                c"d".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if next < 0 {
            return n;
        }
        n += 1;
        // SAFETY: a new descriptor nothing else owns.
        cur = unsafe { OwnedFd::from_raw_fd(next) };
    }
}

/// A wide tree (`width` files in each of `dirs` directories) and symlink loops.
fn wide_and_looping(base: &Path) {
    let w = base.join("wide");
    for d in 0..20 {
        let dir = w.join(format!("dir{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            std::fs::write(dir.join(format!("f{f}")), "needle\n").unwrap();
        }
    }
    let l = base.join("loops/a/b");
    std::fs::create_dir_all(&l).unwrap();
    std::os::unix::fs::symlink("..", l.join("up")).unwrap();
    std::os::unix::fs::symlink("../..", l.join("top")).unwrap();
    std::os::unix::fs::symlink("self", l.join("self")).unwrap();
    std::os::unix::fs::symlink(base.join("loops"), l.join("abs")).unwrap();
    std::fs::write(l.join("f"), "needle\n").unwrap();
}

async fn call_within(h: &Harness, function: &str, payload: Value) -> Result<Value, WireError> {
    match tokio::time::timeout(Duration::from_secs(120), h.call(function, payload.clone())).await {
        Ok(r) => r,
        Err(_) => panic!("{function} {payload} did not answer within 120 s"),
    }
}

/// The executor that served the harness's first call is still alive and serving.
async fn executor_alive(h: &Harness, root: &Path) {
    let stat =
        std::fs::read_to_string(format!("/proc/{}/stat", h.executor_pid)).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.trim().chars().next());
    assert!(
        matches!(state, Some(c) if c != 'Z' && c != 'X'),
        "the executor died: {stat:?}"
    );
    let r = h.call("shell::fs::stat", json!({"path": s(root)})).await;
    assert!(r.is_ok(), "the executor no longer serves: {r:?}");
}

fn config(root: &Path) -> Config {
    jailed(root)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_recursive_operation_survives_deep_wide_and_looping_trees() {
    let t = Tree::new();
    let root = t.dir.join("root");
    std::fs::create_dir(&root).unwrap();
    nest(&root, "deep", DEEP);
    nest(&root, "bounded", MAX_TREE_DEPTH);
    nest(&root, "chmod-bounded", MAX_TREE_DEPTH);
    wide_and_looping(&root);
    let h = Harness::new(config(&root)).await;

    // Past the bound: S218, and nothing changed (rm deleted nothing, chmod changed nothing).
    for (f, p) in [
        ("shell::fs::rm", json!({"path": "deep", "recursive": true})),
        (
            "shell::fs::chmod",
            json!({"path": "deep", "mode": "0700", "recursive": true}),
        ),
    ] {
        let e = call_within(&h, f, p.clone()).await.unwrap_err();
        assert_eq!(e.code, "S218", "{f} {p}: {e:?}");
        assert!(
            e.message.contains("deeper than 256 levels")
                && e.message.contains("nothing was changed"),
            "{e:?}"
        );
        executor_alive(&h, &root).await;
    }
    assert_eq!(depth_of(&root, "deep"), DEEP, "rm deleted part of the tree");
    assert_eq!(
        std::fs::metadata(root.join("deep/d"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755,
        "chmod changed part of the tree"
    );
    // grep and sed walk by path: they search what they can address and answer.
    for (f, p) in [
        (
            "shell::fs::grep",
            json!({"path": "deep", "pattern": "needle"}),
        ),
        (
            "shell::fs::sed",
            json!({"path": "deep", "pattern": "needle", "replacement": "NEEDLE"}),
        ),
    ] {
        let r = call_within(&h, f, p.clone()).await;
        assert!(r.is_ok(), "{f} {p}: {r:?}");
        executor_alive(&h, &root).await;
    }

    // Up to the bound: the whole tree, deepest level included.
    let r = call_within(
        &h,
        "shell::fs::chmod",
        json!({"path": "chmod-bounded", "mode": "0700", "recursive": true}),
    )
    .await
    .unwrap();
    // The root, and at each of the 256 levels one directory and one file.
    assert_eq!(r["entries_changed"], 1 + 2 * MAX_TREE_DEPTH as u64, "{r}");
    let r = call_within(
        &h,
        "shell::fs::rm",
        json!({"path": "bounded", "recursive": true}),
    )
    .await
    .unwrap();
    assert_eq!(r["removed"], true);
    assert!(!root.join("bounded").exists());

    // Wide and looping trees: links are entries, never followed.
    let r = call_within(
        &h,
        "shell::fs::grep",
        json!({"path": "loops", "pattern": "needle"}),
    )
    .await
    .unwrap();
    assert_eq!(r["matches"].as_array().unwrap().len(), 1, "{r}");
    let r = call_within(
        &h,
        "shell::fs::grep",
        json!({"path": "wide", "pattern": "needle", "max_matches": 100000}),
    )
    .await
    .unwrap();
    assert_eq!(r["matches"].as_array().unwrap().len(), 2000);
    let r = call_within(
        &h,
        "shell::fs::sed",
        json!({"path": "loops", "pattern": "needle", "replacement": "x"}),
    )
    .await
    .unwrap();
    assert_eq!(r["total_replacements"], 1, "{r}");
    let r = call_within(
        &h,
        "shell::fs::chmod",
        json!({"path": "loops", "mode": "0750", "recursive": true}),
    )
    .await
    .unwrap();
    assert_eq!(r["entries_changed"], 4, "{r}"); // loops, a, b, f
    for f in ["shell::fs::rm"] {
        for p in ["loops", "wide"] {
            let r = call_within(&h, f, json!({"path": p, "recursive": true})).await;
            assert!(r.is_ok(), "{f} {p}: {r:?}");
            assert!(!root.join(p).exists());
        }
    }
    executor_alive(&h, &root).await;
}

/// Caps the executor's address space, so an unbounded allocation fails there (and is seen as
/// a crash) instead of using the machine's memory.
fn limit_memory(pid: u32, bytes: u64) {
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: prlimit on a child we spawned, with a valid rlimit and no old-value buffer.
    let rc = unsafe { libc::prlimit(pid as i32, libc::RLIMIT_AS, &lim, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sed_stops_at_its_budget_and_never_allocates_past_it() {
    let t = Tree::new();
    let root = t.dir.join("root");
    std::fs::create_dir(&root).unwrap();
    // 1 MiB of one byte, an 8 KiB replacement: 8 GiB if built whole.
    let data = vec![b'a'; 1 << 20];
    std::fs::write(root.join("big.txt"), &data).unwrap();
    let replacement = "R".repeat(8 << 10);
    let mut c = config(&root);
    c.fs.max_write_bytes = 16 << 20;
    let h = Harness::new(c).await;
    limit_memory(h.executor_pid, 2 << 30);

    let r = call_within(
        &h,
        "shell::fs::sed",
        json!({"files": ["big.txt"], "pattern": "a", "replacement": replacement}),
    )
    .await
    .unwrap();
    let res = &r["results"][0];
    assert_eq!(res["success"], false, "{res}");
    assert!(
        res["error"]
            .as_str()
            .unwrap()
            .contains("fs.max_write_bytes"),
        "{res}"
    );
    // `$0` expansion grows the same way and is bounded the same way.
    let r = call_within(
        &h,
        "shell::fs::sed",
        json!({"path": "big.txt", "pattern": "a+", "replacement": "$0".repeat(4096), "regex": true}),
    )
    .await
    .unwrap();
    assert_eq!(r["results"][0]["success"], false, "{r}");
    assert_eq!(std::fs::read(root.join("big.txt")).unwrap(), data);
    executor_alive(&h, &root).await;
    // And within the budget the edit happens.
    std::fs::write(root.join("small.txt"), "a-a").unwrap();
    let r = call_within(
        &h,
        "shell::fs::sed",
        json!({"files": ["small.txt"], "pattern": "(a)", "replacement": "<$1>", "regex": true}),
    )
    .await
    .unwrap();
    assert_eq!(r["total_replacements"], 2);
    assert_eq!(std::fs::read(root.join("small.txt")).unwrap(), b"<a>-<a>");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sed_with_no_write_cap_fails_cleanly_when_memory_runs_out() {
    let t = Tree::new();
    let root = t.dir.join("root");
    std::fs::create_dir(&root).unwrap();
    let data = vec![b'a'; 1 << 20];
    std::fs::write(root.join("big.txt"), &data).unwrap();
    let mut c = config(&root);
    c.fs.max_write_bytes = 0;
    let h = Harness::new(c).await;
    limit_memory(h.executor_pid, 2 << 30);
    let r = call_within(
        &h,
        "shell::fs::sed",
        json!({"files": ["big.txt"], "pattern": "a", "replacement": "R".repeat(8 << 10)}),
    )
    .await
    .unwrap();
    let res = &r["results"][0];
    assert_eq!(res["success"], false, "{res}");
    assert!(res["error"].as_str().unwrap().contains("memory"), "{res}");
    assert_eq!(std::fs::read(root.join("big.txt")).unwrap(), data);
    executor_alive(&h, &root).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grep_reply_over_the_frame_limit_is_truncated_not_lost() {
    let t = Tree::new();
    let root = t.dir.join("root");
    std::fs::create_dir(&root).unwrap();
    // 500,000 matching lines of 100 bytes: about 75 MB of matches with their paths.
    let line = format!("{}\n", "x".repeat(99));
    let body = line.repeat(500_000);
    std::fs::write(root.join("many.txt"), &body).unwrap();
    let h = Harness::new(config(&root)).await;
    let r = call_within(
        &h,
        "shell::fs::grep",
        json!({"path": "many.txt", "pattern": "x", "max_matches": 10_000_000u64}),
    )
    .await
    .unwrap();
    assert_eq!(r["truncated"], true);
    let n = r["matches"].as_array().unwrap().len();
    assert!(n > 100_000 && n < 500_000, "{n} matches");
    // The first ones in order: lines 1..=n.
    assert_eq!(r["matches"][0]["line"], 1);
    assert_eq!(r["matches"][n - 1]["line"], n as u64);
    executor_alive(&h, &root).await;
}

/// A small deterministic PRNG (xorshift64*), so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Every path below `dir` (links not followed), with its kind, sorted: a tree's fingerprint.
fn fingerprint(dir: &Path) -> Vec<(PathBuf, bool)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                todo.push(e.path());
            }
            out.push((e.path(), is_dir));
        }
    }
    out.sort();
    out
}

/// A random tree below `base/name`: a chain of `depth` directories, with files, hidden
/// entries, and symlinks (loops, links to the root, to `/`) scattered along it and beside it.
/// Returns (depth, holds a hidden entry).
fn random_tree(rng: &mut Rng, base: &Path, name: &str, max_depth: u64) -> (usize, bool) {
    let top = base.join(name);
    std::fs::create_dir(&top).unwrap();
    let depth = rng.below(max_depth) as usize;
    let mut hidden = false;
    let mut cur = top.clone();
    for level in 0..=depth {
        for w in 0..rng.below(4) {
            let side = cur.join(format!("w{w}"));
            std::fs::create_dir(&side).unwrap();
            std::fs::write(side.join("f"), "needle\n").unwrap();
        }
        match rng.below(8) {
            0 => std::os::unix::fs::symlink("..", cur.join("up")).unwrap(),
            1 => std::os::unix::fs::symlink("loop", cur.join("loop")).unwrap(),
            2 => std::os::unix::fs::symlink(&top, cur.join("top")).unwrap(),
            3 => std::os::unix::fs::symlink("/", cur.join("slash")).unwrap(),
            4 if rng.below(6) == 0 => {
                std::fs::write(cur.join(".env"), "SECRET").unwrap();
                hidden = true;
            }
            5 if rng.below(6) == 0 => {
                std::fs::write(cur.join("k.pem"), "SECRET").unwrap();
                hidden = true;
            }
            _ => std::fs::write(cur.join("f"), "needle\n").unwrap(),
        }
        if level < depth {
            cur = cur.join("d");
            std::fs::create_dir(&cur).unwrap();
        }
    }
    (depth, hidden)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_hostile_trees_for_every_recursive_operation() {
    let t = Tree::new();
    let root = t.dir.join("root");
    std::fs::create_dir(&root).unwrap();
    let h = Harness::new(config(&root)).await;
    let seed0 = 0x9e37_79b9_7f4a_7c15u64;
    for case in 0..16u64 {
        let seed = seed0 ^ (case + 1).wrapping_mul(0x1000_0000_01b3);
        let mut rng = Rng(seed);
        let name = format!("t{case}");
        // Every fourth case may pass the walk bound.
        let max = if case % 4 == 3 { 400 } else { 60 };
        let (depth, hidden) = random_tree(&mut rng, &root, &name, max);
        let what = format!("case {case} (seed {seed:#x}, depth {depth}, hidden {hidden})");
        let too_deep = depth > MAX_TREE_DEPTH;

        for (f, p) in [
            (
                "shell::fs::grep",
                json!({"path": name, "pattern": "needle"}),
            ),
            (
                "shell::fs::sed",
                json!({"path": name, "pattern": "needle", "replacement": "needle"}),
            ),
        ] {
            let r = call_within(&h, f, p).await;
            assert!(r.is_ok(), "{what}: {f}: {r:?}");
        }
        let r = call_within(
            &h,
            "shell::fs::chmod",
            json!({"path": name, "mode": "0750", "recursive": true}),
        )
        .await;
        match r {
            Ok(_) => assert!(!too_deep, "{what}: chmod walked past the bound"),
            Err(e) => assert!(too_deep && e.code == "S218", "{what}: chmod: {e:?}"),
        }
        let before = fingerprint(&root.join(&name));
        let r = call_within(
            &h,
            "shell::fs::rm",
            json!({"path": name, "recursive": true}),
        )
        .await;
        match r {
            Ok(r) if r["removed"] == true => {
                assert!(!hidden && !too_deep, "{what}: rm removed it");
                assert!(!root.join(&name).exists(), "{what}: still there");
            }
            Ok(r) => {
                // Protected entries are skipped silently; the directories holding them stay.
                assert!(hidden, "{what}: rm kept a tree without hidden entries: {r}");
                assert!(root.join(&name).exists(), "{what}: {r}");
            }
            Err(e) => {
                // The scan met the bound (protected entries are not entered): nothing goes.
                assert!(too_deep && e.code == "S218", "{what}: rm: {e:?}");
                assert_eq!(
                    fingerprint(&root.join(&name)),
                    before,
                    "{what}: rm deleted part"
                );
            }
        }
        executor_alive(&h, &root).await;
    }
}

/// `coder::update-file` builds a replace op's result within `fs.max_write_bytes`: 200 KB of
/// one byte and a 60 KB replacement (12 GB if built whole) is C218 with the file unchanged,
/// under a 1 GiB address-space limit on the executor, which stays the same live process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_file_stops_a_replace_at_its_budget_and_never_allocates_past_it() {
    let t = Tree::new();
    let root = t.dir.join("root");
    std::fs::create_dir(&root).unwrap();
    let data = vec![b'a'; 200_000];
    std::fs::write(root.join("big.txt"), &data).unwrap();
    let mut c = config(&root);
    c.fs.max_write_bytes = 16 << 20;
    let h = Harness::new(c).await;
    limit_memory(h.executor_pid, 1 << 30);
    for (pattern, replacement) in [("a", "R".repeat(60_000)), ("a+", "$0".repeat(30_000))] {
        let r = call_within(
            &h,
            "coder::update-file",
            json!({"files": [{"path": "big.txt", "ops": [
                {"op": "replace", "pattern": pattern, "replacement": replacement}
            ]}]}),
        )
        .await
        .unwrap();
        let res = &r["results"][0];
        assert_eq!(res["success"], false, "{res}");
        assert_eq!(res["error"]["code"], "C218", "{res}");
        assert_eq!(std::fs::read(root.join("big.txt")).unwrap(), data);
    }
    executor_alive(&h, &root).await;
}

/// `coder::search` with `respect_gitignore` reads ignore files only as regular files of at
/// most 1 MiB: a FIFO named `.ignore` (an open for reading would wait for a writer forever),
/// a sparse 64 GiB `.gitignore` (one 64 GiB line), a FIFO as `.git/info/exclude` and a
/// symlinked `.gitignore` are skipped, the search answers with what they would have hidden,
/// and good ignore files beside them still apply. The executor runs under a 1 GiB
/// address-space limit and stays the same live process; a retry answers the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_skips_hostile_ignore_files_and_answers() {
    let t = Tree::new();
    let root = t.dir.join("root");
    let repo = root.join("repo");
    for d in [".git/info", "fifo", "sparse", "linked", "good"] {
        std::fs::create_dir_all(repo.join(d)).unwrap();
    }
    let mkfifo = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo of a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    };
    mkfifo(&repo.join("fifo/.ignore"));
    mkfifo(&repo.join(".git/info/exclude"));
    let big = std::fs::File::create(repo.join("sparse/.gitignore")).unwrap();
    big.set_len(64 << 30).unwrap();
    std::fs::write(root.join("patterns"), "*.txt\n").unwrap();
    std::os::unix::fs::symlink("../../patterns", repo.join("linked/.gitignore")).unwrap();
    std::fs::write(repo.join("good/.gitignore"), "hidden.txt\n").unwrap();
    for d in ["fifo", "sparse", "linked", "good"] {
        std::fs::write(repo.join(d).join("seen.txt"), "needle\n").unwrap();
    }
    std::fs::write(repo.join("good/hidden.txt"), "needle\n").unwrap();
    let h = Harness::new(config(&root)).await;
    limit_memory(h.executor_pid, 1 << 30);
    for _ in 0..2 {
        let call = h.call(
            "coder::search",
            json!({"query": "needle", "path": s(&repo), "respect_gitignore": true, "search_paths": false}),
        );
        let r = tokio::time::timeout(Duration::from_secs(60), call)
            .await
            .expect("coder::search did not answer within 60 s")
            .unwrap();
        let mut got: Vec<String> = r["content_matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["path"].as_str().unwrap().to_string())
            .collect();
        got.sort();
        let want: Vec<String> = ["fifo", "good", "linked", "sparse"]
            .iter()
            .map(|d| s(&repo.join(d).join("seen.txt")))
            .collect();
        assert_eq!(got, want, "{r}");
    }
    executor_alive(&h, &root).await;
}

/// A hostile tree for `coder::search` (content and paths, ignore files respected): symlink
/// loops and links out of the jail (never followed), a FIFO and a sparse 64 GiB file with the
/// query's name (never read: not regular / over max_read_bytes), a 3,000-deep tree, and a
/// command renaming folders back and forth during the search. Every call answers (within
/// the response budget), with matches in regular files inside the root only (a deep tree's
/// entries past what a path can address are skipped, as missing), under a 1 GiB
/// address-space limit, and the executor lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_survives_links_fifos_sparse_files_deep_trees_and_a_racing_renamer() {
    let t = Tree::new();
    let root = t.dir.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(t.dir.join("outside.txt"), "needle outside\n").unwrap();
    wide_and_looping(&root);
    std::os::unix::fs::symlink(t.dir.join("outside.txt"), root.join("out-link")).unwrap();
    std::os::unix::fs::symlink(&t.dir, root.join("out-dir")).unwrap();
    let fifo =
        std::ffi::CString::new(root.join("needle.fifo").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo of a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let big = std::fs::File::create(root.join("needle.sparse")).unwrap();
    big.set_len(64 << 30).unwrap();
    nest(&root, "deep", 3_000);
    std::fs::create_dir_all(root.join("race/x")).unwrap();
    std::fs::write(root.join("race/x/f"), "needle race\n").unwrap();
    let mut c = config(&root);
    c.fs.max_read_bytes = 1 << 20;
    let h = Harness::new(c).await;
    limit_memory(h.executor_pid, 1 << 30);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renamer = {
        let (stop, race) = (stop.clone(), root.join("race"));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::fs::rename(race.join("x"), race.join("y"));
                let _ = std::fs::rename(race.join("y"), race.join("x"));
            }
        })
    };
    for respect in [false, true] {
        let r = call_within(
            &h,
            "coder::search",
            json!({"query": "needle", "path": s(&root), "respect_gitignore": respect,
                   "max_matches": 100000}),
        )
        .await
        .unwrap();
        let matches = r["content_matches"].as_array().unwrap();
        for m in matches {
            let p = m["path"].as_str().unwrap();
            assert!(p.starts_with(&s(&root)), "{p}");
            assert!(!p.contains("out-") && !p.contains("needle."), "{p}");
            assert!(
                !p.contains("/up/") && !p.contains("/top/") && !p.contains("/abs/"),
                "{p}"
            );
        }
        assert!(!matches.is_empty(), "{r}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    renamer.join().unwrap();
    executor_alive(&h, &root).await;
}
