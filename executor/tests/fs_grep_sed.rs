//! `shell::fs::grep` and `shell::fs::sed` against real temp trees.

mod common;

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use iii_shell_executor::policy::Policy;
use iii_shell_files::fs::grep::grep;
use iii_shell_files::fs::sed::sed;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::fs::{GrepResponse, GrepSpec, SedSpec};

use common::{code_of, Tree};

fn gspec(path: &str, pattern: &str) -> GrepSpec {
    GrepSpec {
        path: path.into(),
        pattern: pattern.into(),
        recursive: true,
        ignore_case: false,
        include_glob: vec![],
        exclude_glob: vec![],
        max_matches: 10_000,
        max_line_bytes: 4096,
    }
}

fn sspec(pattern: &str, replacement: &str) -> SedSpec {
    SedSpec {
        pattern: pattern.into(),
        replacement: replacement.into(),
        files: vec![],
        path: None,
        recursive: true,
        regex: true,
        ignore_case: false,
        first_only: false,
        include_glob: vec![],
        exclude_glob: vec![],
    }
}

/// `(path relative to root, line)` of each match, in order.
fn hits(t: &Tree, r: &GrepResponse) -> Vec<(String, u64)> {
    r.matches
        .iter()
        .map(|m| {
            let rel = Path::new(&m.path)
                .strip_prefix(&t.root)
                .unwrap_or_else(|_| panic!("{} outside root", m.path));
            (rel.to_string_lossy().into_owned(), m.line)
        })
        .collect()
}

fn pairs(v: &[(&str, u64)]) -> Vec<(String, u64)> {
    v.iter().map(|(p, l)| (p.to_string(), *l)).collect()
}

fn basic_tree() -> Tree {
    let t = Tree::new();
    t.write("a.txt", "hello\nworld\nsay Hello again\nhello!\n");
    t.write("sub/b.rs", "fn main() {\n    hello();\n}\n");
    t.write("sub/deep/c.md", "# hello\n");
    t.write(".hidden/h.txt", "hello hidden\n");
    t.write(".gitignore", "ignored.txt\n");
    t.write("ignored.txt", "hello ignored\n");
    t
}

#[test]
fn grep_reports_one_based_lines_and_canonical_paths() {
    let t = basic_tree();
    let p = t.policy();
    let r = grep(&p, &gspec(".", "hello")).unwrap();
    assert!(!r.truncated);
    assert_eq!(
        hits(&t, &r),
        pairs(&[
            (".hidden/h.txt", 1),
            ("a.txt", 1),
            ("a.txt", 4),
            ("ignored.txt", 1),
            ("sub/b.rs", 2),
            ("sub/deep/c.md", 1)
        ])
    );
    let b = r.matches.iter().find(|m| m.path.ends_with("b.rs")).unwrap();
    assert_eq!(b.path, t.abs("sub/b.rs"));
    assert_eq!(b.content, "    hello();");
    // An absolute path inside the jail, with `..` and `//`, gives the same canonical paths.
    let r2 = grep(
        &p,
        &gspec(&format!("{}//sub/../sub", t.root.display()), "hello"),
    )
    .unwrap();
    assert_eq!(
        hits(&t, &r2),
        pairs(&[("sub/b.rs", 2), ("sub/deep/c.md", 1)])
    );
    // A single file as the root.
    let r3 = grep(&p, &gspec("a.txt", "^hello")).unwrap();
    assert_eq!(hits(&t, &r3), pairs(&[("a.txt", 1), ("a.txt", 4)]));
    assert_eq!(r3.matches[1].content, "hello!");
}

#[test]
fn grep_ignore_case() {
    let t = basic_tree();
    let p = t.policy();
    let mut s = gspec("a.txt", "HELLO");
    assert!(grep(&p, &s).unwrap().matches.is_empty());
    s.ignore_case = true;
    assert_eq!(
        hits(&t, &grep(&p, &s).unwrap()),
        pairs(&[("a.txt", 1), ("a.txt", 3), ("a.txt", 4)])
    );
}

#[test]
fn grep_globs_and_recursive() {
    let t = basic_tree();
    let p = t.policy();
    let mut s = gspec(".", "hello");
    s.include_glob = vec!["*.rs".into(), "*.md".into()];
    assert_eq!(
        hits(&t, &grep(&p, &s).unwrap()),
        pairs(&[("sub/b.rs", 2), ("sub/deep/c.md", 1)])
    );
    // A glob with a slash matches the whole relative path and `*` does not cross `/`.
    s.include_glob = vec!["sub/*".into()];
    assert_eq!(hits(&t, &grep(&p, &s).unwrap()), pairs(&[("sub/b.rs", 2)]));
    s.include_glob = vec!["sub/**".into()];
    assert_eq!(
        hits(&t, &grep(&p, &s).unwrap()),
        pairs(&[("sub/b.rs", 2), ("sub/deep/c.md", 1)])
    );
    // Exclusions: a file pattern, and a directory (pruned).
    s.include_glob = vec![];
    s.exclude_glob = vec!["*.txt".into(), "deep".into()];
    assert_eq!(hits(&t, &grep(&p, &s).unwrap()), pairs(&[("sub/b.rs", 2)]));
    // Include and exclude together: exclude wins.
    s.include_glob = vec!["*.rs".into(), "*.md".into()];
    s.exclude_glob = vec!["sub/deep/**".into()];
    assert_eq!(hits(&t, &grep(&p, &s).unwrap()), pairs(&[("sub/b.rs", 2)]));
    // Not recursive: only the files directly in the directory.
    let mut s = gspec(".", "hello");
    s.recursive = false;
    assert_eq!(
        hits(&t, &grep(&p, &s).unwrap()),
        pairs(&[("a.txt", 1), ("a.txt", 4), ("ignored.txt", 1)])
    );
    // A bad glob is an invalid request.
    let mut s = gspec(".", "hello");
    s.include_glob = vec!["a[".into()];
    assert_eq!(code_of(grep(&p, &s)), "S210");
}

#[test]
fn grep_max_matches_keeps_first_in_path_order() {
    let t = Tree::new();
    for name in ["d", "b", "a", "c"] {
        t.write(&format!("{name}.txt"), "x1\nno\nx2\nx3\n");
    }
    let p = t.policy();
    let mut s = gspec(".", "x");
    s.max_matches = 5;
    let r = grep(&p, &s).unwrap();
    assert!(r.truncated);
    assert_eq!(
        hits(&t, &r),
        pairs(&[
            ("a.txt", 1),
            ("a.txt", 3),
            ("a.txt", 4),
            ("b.txt", 1),
            ("b.txt", 3)
        ])
    );
    // Exactly the number of matches: not truncated.
    s.max_matches = 12;
    let r = grep(&p, &s).unwrap();
    assert!(!r.truncated);
    assert_eq!(r.matches.len(), 12);
    // Deterministic across runs (the walk is parallel).
    s.max_matches = 7;
    let first = grep(&p, &s).unwrap();
    for _ in 0..5 {
        assert_eq!(grep(&p, &s).unwrap(), first);
    }
    // Zero: nothing returned, but the cap is reported.
    s.max_matches = 0;
    let r = grep(&p, &s).unwrap();
    assert!(r.matches.is_empty() && r.truncated);
    s.pattern = "nothing-matches-this".into();
    assert!(!grep(&p, &s).unwrap().truncated);
}

/// The seed skips a line longer than `max_line_bytes` (it is never cut) and reports
/// `truncated`; a line of exactly that many bytes is matched whole.
#[test]
fn grep_skips_lines_longer_than_max_line_bytes() {
    let t = Tree::new();
    t.write("u.txt", format!("short x\n{}x\n", "é".repeat(100)));
    let p = t.policy();
    let mut s = gspec("u.txt", "x");
    s.max_line_bytes = 11;
    let r = grep(&p, &s).unwrap();
    assert!(r.truncated);
    assert_eq!(r.matches.len(), 1);
    assert_eq!(r.matches[0].content, "short x");
    s.max_line_bytes = 201;
    let r = grep(&p, &s).unwrap();
    assert!(!r.truncated);
    assert_eq!(r.matches[1].content, format!("{}x", "é".repeat(100)));
}

#[test]
fn grep_skips_binary_files() {
    let t = Tree::new();
    t.write("text.txt", "needle\n");
    t.write("bin.dat", b"needle\0needle\n");
    // A NUL far past the first buffer: matches before it must not leak out either.
    let mut late = b"needle\n".to_vec();
    late.extend(std::iter::repeat_n(b'a', 300_000));
    late.extend(b"\n\0needle\n");
    t.write("late.dat", late);
    let p = t.policy();
    assert_eq!(
        hits(&t, &grep(&p, &gspec(".", "needle")).unwrap()),
        pairs(&[("text.txt", 1)])
    );
}

#[test]
fn grep_and_sed_never_follow_symlinks_out_of_the_jail() {
    let t = Tree::new();
    std::fs::write(t.outside.join("secret.txt"), "topsecret value\n").unwrap();
    std::fs::create_dir_all(t.outside.join("dir")).unwrap();
    std::fs::write(t.outside.join("dir/inner.txt"), "topsecret inner\n").unwrap();
    symlink(t.outside.join("secret.txt"), t.root.join("link.txt")).unwrap();
    symlink(t.outside.join("dir"), t.root.join("linkdir")).unwrap();
    t.write("own.txt", "not a topsecret\n");
    let p = t.policy();
    let r = grep(&p, &gspec(".", "topsecret")).unwrap();
    assert_eq!(hits(&t, &r), pairs(&[("own.txt", 1)]));
    assert!(r
        .matches
        .iter()
        .all(|m| !m.content.contains("value") && !m.content.contains("inner")));
    // Naming the link itself is an escape.
    assert_eq!(code_of(grep(&p, &gspec("link.txt", "topsecret"))), "S215");
    assert_eq!(code_of(grep(&p, &gspec("linkdir", "topsecret"))), "S215");
    // sed over the tree leaves the outside files alone.
    let mut s = sspec("topsecret", "public");
    s.path = Some(".".into());
    let r = sed(&p, &s).unwrap();
    assert_eq!(r.total_replacements, 1);
    assert_eq!(
        std::fs::read_to_string(t.outside.join("secret.txt")).unwrap(),
        "topsecret value\n"
    );
    assert_eq!(
        std::fs::read_to_string(t.outside.join("dir/inner.txt")).unwrap(),
        "topsecret inner\n"
    );
    assert!(std::fs::symlink_metadata(t.root.join("link.txt"))
        .unwrap()
        .file_type()
        .is_symlink());
    // And the files form reports the escape for that file only.
    let mut s = sspec("topsecret", "public");
    s.files = vec!["link.txt".into(), "own.txt".into()];
    let r = sed(&p, &s).unwrap();
    assert!(!r.results[0].success);
    assert!(
        r.results[0].error.as_deref().unwrap().contains("escapes"),
        "{:?}",
        r.results[0]
    );
    assert!(r.results[1].success);
    assert_eq!(
        std::fs::read_to_string(t.outside.join("secret.txt")).unwrap(),
        "topsecret value\n"
    );
}

#[test]
fn denied_entries_are_invisible_to_grep_and_sed() {
    let t = Tree::new();
    t.write("ok.txt", "token\n");
    t.write(".env", "token=1\n");
    t.write("sub/.env", "token=2\n");
    t.write("private/keys.txt", "token\n");
    t.write("blocked.txt", "token\n");
    let private = t.abs("private");
    let blocked = t.abs("blocked.txt");
    let p = t.policy_with(|c| c.fs.denylist_paths = vec![private.clone(), blocked.clone()]);
    let r = grep(&p, &gspec(".", "token")).unwrap();
    assert_eq!(hits(&t, &r), pairs(&[("ok.txt", 1)]));
    assert!(!r.truncated);
    // Naming a denied entry reads like a missing one.
    assert_eq!(code_of(grep(&p, &gspec(".env", "token"))), "S211");
    assert_eq!(code_of(grep(&p, &gspec("private", "token"))), "S211");

    let mut s = sspec("token", "TOKEN");
    s.path = Some(".".into());
    let r = sed(&p, &s).unwrap();
    assert_eq!(r.results.len(), 1);
    assert_eq!(r.results[0].path, t.abs("ok.txt"));
    assert_eq!(t.read(".env"), b"token=1\n");
    assert_eq!(t.read("sub/.env"), b"token=2\n");
    assert_eq!(t.read("private/keys.txt"), b"token\n");
    assert_eq!(t.read("blocked.txt"), b"token\n");

    let mut s = sspec("token", "TOKEN");
    s.files = vec![
        ".env".into(),
        "private/keys.txt".into(),
        "missing.txt".into(),
    ];
    let r = sed(&p, &s).unwrap();
    let errs: Vec<_> = r
        .results
        .iter()
        .map(|x| {
            x.error
                .clone()
                .unwrap()
                .replace(".env", "P")
                .replace("private/keys.txt", "P")
                .replace("missing.txt", "P")
        })
        .collect();
    assert!(r.results.iter().all(|x| !x.success && x.replacements == 0));
    assert_eq!(errs[0], errs[1]);
    assert_eq!(errs[1], errs[2]);
    assert_eq!(t.read(".env"), b"token=1\n");
}

#[test]
fn grep_errors() {
    let t = basic_tree();
    let p = t.policy();
    assert_eq!(code_of(grep(&p, &gspec(".", "("))), "S217");
    // A line never contains `\n`, so a pattern asking for one is refused, not silently dead.
    assert_eq!(code_of(grep(&p, &gspec(".", "hello\\nworld"))), "S217");
    assert_eq!(code_of(grep(&p, &gspec(".", ""))), "S210");
    assert_eq!(code_of(grep(&p, &gspec("missing", "x"))), "S211");
    assert_eq!(code_of(grep(&p, &gspec("../", "x"))), "S215");
    assert_eq!(code_of(grep(&p, &gspec("/etc", "x"))), "S215");
    assert_eq!(code_of(grep(&p, &gspec("", "x"))), "S210");
}

#[test]
fn grep_unjailed_takes_absolute_paths() {
    let t = basic_tree();
    let config = Config {
        fs: iii_shell_protocol::config::FsConfig {
            allow_unjailed: true,
            ..Default::default()
        },
        ..Config::default()
    };
    let p = Policy::build(1, &serde_json::to_string(&config).unwrap()).unwrap();
    let r = grep(&p, &gspec(&t.abs("sub"), "hello")).unwrap();
    assert_eq!(
        hits(&t, &r),
        pairs(&[("sub/b.rs", 2), ("sub/deep/c.md", 1)])
    );
    assert_eq!(code_of(grep(&p, &gspec("sub", "hello"))), "S210");
    // The default denylist still applies.
    assert_eq!(code_of(grep(&p, &gspec("/etc/shadow", "root"))), "S211");
}

#[test]
fn sed_literal_mode_first_only_and_groups() {
    let t = Tree::new();
    t.write("lit.txt", "a.b*c axb*c a.b*c\n");
    t.write("first.txt", "cat cat\ncat\n");
    t.write("groups.txt", "alice@example bob@test\n");
    t.write("case.txt", "Foo foo FOO\n");
    let p = t.policy();

    let mut s = sspec("a.b*c", "$1(x)");
    s.regex = false;
    s.files = vec!["lit.txt".into()];
    let r = sed(&p, &s).unwrap();
    assert_eq!(r.total_replacements, 2);
    assert_eq!(t.read("lit.txt"), b"$1(x) axb*c $1(x)\n");

    let mut s = sspec("cat", "dog");
    s.first_only = true;
    s.files = vec!["first.txt".into()];
    let r = sed(&p, &s).unwrap();
    assert_eq!((r.total_replacements, r.results[0].replacements), (1, 1));
    assert_eq!(t.read("first.txt"), b"dog cat\ncat\n");

    let mut s = sspec(r"(\w+)@(\w+)", "$2 at ${1}!");
    s.files = vec!["groups.txt".into()];
    assert_eq!(sed(&p, &s).unwrap().total_replacements, 2);
    assert_eq!(t.read("groups.txt"), b"example at alice! test at bob!\n");

    let mut s = sspec("foo", "bar");
    s.ignore_case = true;
    s.regex = false;
    s.files = vec!["case.txt".into()];
    assert_eq!(sed(&p, &s).unwrap().total_replacements, 3);
    assert_eq!(t.read("case.txt"), b"bar bar bar\n");
}

#[test]
fn sed_files_form_reports_per_file_failures() {
    let t = Tree::new();
    t.write("a.txt", "old\n");
    t.write("b.txt", "old old\n");
    std::fs::create_dir_all(t.root.join("dir")).unwrap();
    let p = t.policy();
    let mut s = sspec("old", "new");
    s.files = vec![
        "a.txt".into(),
        "missing.txt".into(),
        "dir".into(),
        "../escape.txt".into(),
        t.abs("b.txt"),
    ];
    let r = sed(&p, &s).unwrap();
    assert_eq!(r.results.len(), 5);
    assert_eq!(
        (
            r.results[0].path.as_str(),
            r.results[0].replacements,
            r.results[0].success
        ),
        (t.abs("a.txt").as_str(), 1, true)
    );
    assert_eq!(r.results[0].error, None);
    assert_eq!(r.results[1].path, "missing.txt");
    assert!(!r.results[1].success);
    assert_eq!(
        r.results[1].error.as_deref(),
        Some("path not found or not accessible: missing.txt")
    );
    assert!(!r.results[2].success);
    assert!(r.results[2]
        .error
        .as_deref()
        .unwrap()
        .contains("not a regular file"));
    assert_eq!(r.results[3].path, "../escape.txt");
    assert!(r.results[3].error.as_deref().unwrap().contains("escapes"));
    assert_eq!((r.results[4].replacements, r.results[4].success), (2, true));
    assert_eq!(r.total_replacements, 3);
    assert_eq!(t.read("a.txt"), b"new\n");
    assert_eq!(t.read("b.txt"), b"new new\n");
}

#[test]
fn sed_request_validation() {
    let t = Tree::new();
    t.write("a.txt", "x\n");
    let p = t.policy();
    let mut s = sspec("x", "y");
    assert_eq!(code_of(sed(&p, &s)), "S210"); // neither
    s.files = vec!["a.txt".into()];
    s.path = Some(".".into());
    assert_eq!(code_of(sed(&p, &s)), "S210"); // both
    s.path = None;
    s.pattern = "(".into();
    assert_eq!(code_of(sed(&p, &s)), "S217");
    s.pattern = String::new();
    assert_eq!(code_of(sed(&p, &s)), "S210");
    // A literal pattern never fails to compile.
    s.pattern = "(".into();
    s.regex = false;
    assert!(sed(&p, &s).unwrap().results[0].success);
    // Path form: the root itself must resolve.
    let mut s = sspec("x", "y");
    s.path = Some("missing".into());
    assert_eq!(code_of(sed(&p, &s)), "S211");
    s.path = Some("..".into());
    assert_eq!(code_of(sed(&p, &s)), "S215");
    assert_eq!(t.read("a.txt"), b"x\n");
}

#[test]
fn sed_keeps_mode_and_bytes() {
    let t = Tree::new();
    let f = t.write(
        "crlf.txt",
        b"foo\r\nbar \xff\xfe foo\r\nlast foo".as_slice(),
    );
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
    let p = t.policy();
    let mut s = sspec("foo", "bazz");
    s.files = vec!["crlf.txt".into()];
    assert_eq!(sed(&p, &s).unwrap().total_replacements, 3);
    assert_eq!(
        t.read("crlf.txt"),
        b"bazz\r\nbar \xff\xfe bazz\r\nlast bazz"
    );
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o7777,
        0o640
    );
    // `$` is a line end, CRLF included; `^` a line start.
    let mut s = sspec("z$", "Z");
    s.files = vec!["crlf.txt".into()];
    assert_eq!(sed(&p, &s).unwrap().total_replacements, 3);
    assert_eq!(
        t.read("crlf.txt"),
        b"bazZ\r\nbar \xff\xfe bazZ\r\nlast bazZ"
    );
    let mut s = sspec("^b", "B");
    s.path = Some(".".into());
    assert_eq!(sed(&p, &s).unwrap().total_replacements, 2);
    assert_eq!(
        t.read("crlf.txt"),
        b"BazZ\r\nBar \xff\xfe bazZ\r\nlast bazZ"
    );
    // No temp file is left behind.
    let names: Vec<_> = std::fs::read_dir(&t.root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("crlf.txt")]);
}

#[test]
fn sed_leaves_unmatched_files_untouched() {
    let t = Tree::new();
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(946_684_800);
    let quiet = t.write("quiet.txt", "nothing here\n");
    t.write("loud.txt", "change me\n");
    for name in ["quiet.txt", "loud.txt"] {
        std::fs::File::options()
            .write(true)
            .open(t.root.join(name))
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let ino = std::fs::metadata(&quiet).unwrap().ino();
    let p = t.policy();

    let mut s = sspec("change", "changed");
    s.path = Some(".".into());
    let r = sed(&p, &s).unwrap();
    // Path form: only the files that matched are listed.
    assert_eq!(r.results.len(), 1);
    assert_eq!(r.results[0].path, t.abs("loud.txt"));
    assert_eq!(std::fs::metadata(&quiet).unwrap().modified().unwrap(), old);
    assert_eq!(std::fs::metadata(&quiet).unwrap().ino(), ino);
    assert_ne!(
        std::fs::metadata(t.root.join("loud.txt"))
            .unwrap()
            .modified()
            .unwrap(),
        old
    );

    // Files form: listed with 0 replacements, still untouched.
    let mut s = sspec("change", "changed");
    s.files = vec!["quiet.txt".into()];
    let r = sed(&p, &s).unwrap();
    assert_eq!(r.results.len(), 1);
    assert_eq!((r.results[0].replacements, r.results[0].success), (0, true));
    assert_eq!(std::fs::metadata(&quiet).unwrap().modified().unwrap(), old);
    assert_eq!(std::fs::metadata(&quiet).unwrap().ino(), ino);
}

#[test]
fn sed_path_form_walks_like_grep() {
    let t = Tree::new();
    t.write("a.rs", "old\n");
    t.write("sub/b.rs", "old old\n");
    t.write("sub/c.txt", "old\n");
    t.write("bin.rs", b"old\0old".as_slice());
    t.write("sub/deep/d.rs", "old\n");
    let p = t.policy();
    let mut s = sspec("old", "new");
    s.path = Some(".".into());
    s.include_glob = vec!["*.rs".into()];
    s.exclude_glob = vec!["deep".into()];
    let r = sed(&p, &s).unwrap();
    let got: Vec<_> = r
        .results
        .iter()
        .map(|x| (x.path.clone(), x.replacements))
        .collect();
    assert_eq!(got, vec![(t.abs("a.rs"), 1), (t.abs("sub/b.rs"), 2)]);
    assert_eq!(r.total_replacements, 3);
    assert_eq!(t.read("sub/c.txt"), b"old\n");
    assert_eq!(t.read("bin.rs"), b"old\0old");
    assert_eq!(t.read("sub/deep/d.rs"), b"old\n");
    // Not recursive.
    let mut s = sspec("old", "new");
    s.path = Some("sub".into());
    s.recursive = false;
    let r = sed(&p, &s).unwrap();
    assert_eq!(r.results.len(), 1);
    assert_eq!(r.results[0].path, t.abs("sub/c.txt"));
    assert_eq!(t.read("sub/deep/d.rs"), b"old\n");
}

#[test]
fn sed_size_caps() {
    let t = Tree::new();
    t.write("grow.txt", "x".repeat(60));
    t.write("big.txt", format!("{}x", "y".repeat(200)));
    t.write("small.txt", "x\n");
    let p = t.policy_with(|c| {
        c.fs.max_write_bytes = 100;
        c.fs.max_read_bytes = 150;
    });
    let mut s = sspec("x", "xx");
    s.files = vec!["grow.txt".into(), "big.txt".into(), "small.txt".into()];
    let r = sed(&p, &s).unwrap();
    assert!(!r.results[0].success);
    assert!(r.results[0]
        .error
        .as_deref()
        .unwrap()
        .contains("max_write_bytes"));
    assert!(!r.results[1].success);
    assert!(r.results[1]
        .error
        .as_deref()
        .unwrap()
        .contains("max_read_bytes"));
    assert_eq!((r.results[2].replacements, r.results[2].success), (1, true));
    assert_eq!(r.total_replacements, 1);
    assert_eq!(t.read("grow.txt"), "x".repeat(60).as_bytes());
    assert_eq!(t.read("big.txt").len(), 201);
    // Path form: the oversized file is skipped, the one over the write cap reported.
    let mut s = sspec("x", "xx");
    s.path = Some(".".into());
    let r = sed(&p, &s).unwrap();
    let got: Vec<_> = r
        .results
        .iter()
        .map(|x| (x.path.clone(), x.success))
        .collect();
    assert_eq!(
        got,
        vec![(t.abs("grow.txt"), false), (t.abs("small.txt"), true)]
    );
}

#[test]
fn sed_through_an_inner_symlink_edits_the_target() {
    let t = Tree::new();
    t.write("real.txt", "v1\n");
    symlink("real.txt", t.root.join("alias.txt")).unwrap();
    let p = t.policy();
    let mut s = sspec("v1", "v2");
    s.files = vec!["alias.txt".into()];
    let r = sed(&p, &s).unwrap();
    assert_eq!(r.results[0].path, t.abs("real.txt"));
    assert_eq!(t.read("real.txt"), b"v2\n");
    assert!(std::fs::symlink_metadata(t.root.join("alias.txt"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn sed_drops_special_bits_unless_allowed() {
    let t = Tree::new();
    let f = t.write("tool.sh", "echo old\n");
    let mode = |f: &Path| std::fs::metadata(f).unwrap().permissions().mode() & 0o7777;
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o4750)).unwrap();
    let mut s = sspec("old", "new");
    s.files = vec!["tool.sh".into()];
    assert_eq!(sed(&t.policy(), &s).unwrap().total_replacements, 1);
    assert_eq!(mode(&f), 0o750);
    // Allowed, and the file is the executor's own (the test runs as the file's owner).
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o4750)).unwrap();
    let p = t.policy_with(|c| c.fs.allow_special_bits = true);
    let mut s = sspec("new", "newer");
    s.files = vec!["tool.sh".into()];
    assert_eq!(sed(&p, &s).unwrap().total_replacements, 1);
    assert_eq!(mode(&f), 0o4750);
    assert_eq!(t.read("tool.sh"), b"echo newer\n");
}

/// `(uid_t)-1` means "no change" to chown(2): the executor refuses it itself (S210), whatever
/// the broker let through, and changes nothing.
#[test]
fn chmod_refuses_the_no_change_owner_ids_and_changes_nothing() {
    use iii_shell_files::fs::ops::chmod;
    let t = Tree::new();
    let f = t.write("f", "x");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let p = t.policy();
    for (uid, gid) in [(Some(u32::MAX), None), (None, Some(u32::MAX))] {
        let e = chmod(&p, "f", 0o644, uid, gid, false).expect_err("refused");
        let w = e.to_wire();
        assert_eq!(w.code, "S210", "{w:?}");
        assert!(w.message.contains("4294967295 is not an id"), "{w:?}");
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o7777, 0o600);
    }
    chmod(&p, "f", 0o644, None, None, false).expect("a plain chmod still works");
    assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o7777, 0o644);
}
