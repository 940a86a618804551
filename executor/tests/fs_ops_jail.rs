//! The fs operations (`fs::ops`, `fs::workspace`) on a real temp tree, called directly: a
//! symlink that leads out of the jail is S215 for every operation, however it is reached, and
//! nothing is created, changed or read beyond it. (The broker's path for the same calls is
//! `cli/tests/suite/fs_host.rs`.)

mod common;

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use common::Tree;
use iii_shell_executor::policy::Policy;
use iii_shell_files::error::ExecError;
use iii_shell_files::fs::{ops, workspace};
use iii_shell_protocol::fs::WriteFile;

const SECRET: &[u8] = b"OUTSIDE SECRET";

/// One operation on a path below `link`, as the executor runs it for its request.
type Op = fn(&Policy, &str) -> Result<(), ExecError>;

fn write(policy: &Policy, path: String, parents: bool) -> Result<(), ExecError> {
    let file = WriteFile {
        path,
        mode: 0o644,
        parents,
        data: b"pwned".to_vec(),
    };
    ops::write_inline(policy, &[file]).map(drop)
}

/// Every operation that takes a path, each named as its function is, with the arguments
/// `cli/tests/suite/fs_host.rs` sends it through the broker.
const OPS: &[(&str, Op)] = &[
    ("stat", |p, link| {
        ops::stat(p, &format!("{link}/secret.txt")).map(drop)
    }),
    ("ls", |p, link| ops::ls(p, link).map(drop)),
    ("workspace::read-bytes", |p, link| {
        workspace::read_bytes(p, &format!("{link}/secret.txt"), 0, 1 << 20).map(drop)
    }),
    ("write", |p, link| {
        write(p, format!("{link}/secret.txt"), false)
    }),
    ("write parents", |p, link| {
        write(p, format!("{link}/new/x"), true)
    }),
    ("mkdir", |p, link| {
        ops::mkdir(p, &format!("{link}/newdir"), 0o755, false).map(drop)
    }),
    ("mkdir parents", |p, link| {
        ops::mkdir(p, &format!("{link}/a/b/c"), 0o755, true).map(drop)
    }),
    ("rm", |p, link| {
        ops::rm(p, &format!("{link}/secret.txt"), false).map(drop)
    }),
    ("rm recursive", |p, link| {
        ops::rm(p, &format!("{link}/x"), true).map(drop)
    }),
    ("chmod", |p, link| {
        ops::chmod(p, &format!("{link}/secret.txt"), 0o777, None, None, false).map(drop)
    }),
    ("chmod owner recursive", |p, link| {
        ops::chmod(p, &format!("{link}/secret.txt"), 0o777, Some(1), None, true).map(drop)
    }),
    ("mv from", |p, link| {
        ops::mv(p, &format!("{link}/secret.txt"), "stolen", false).map(drop)
    }),
    ("mv into", |p, link| {
        ops::mv(p, "in", &format!("{link}/moved"), false).map(drop)
    }),
    ("workspace::list", |p, link| {
        workspace::list(p, link, None).map(drop)
    }),
    ("workspace::validate", |p, link| {
        workspace::validate(p, link).map(drop)
    }),
];

#[test]
fn symlinks_leading_outside_are_s215_for_every_op_and_create_nothing() {
    let t = Tree::new();
    let root = &t.root;
    let secret = t.outside.join("secret.txt");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::create_dir_all(root.join("in/deep")).unwrap();
    symlink(&t.outside, root.join("in/deep/abs")).unwrap();
    symlink("../../../outside", root.join("in/deep/rel")).unwrap();
    symlink("/", root.join("slash")).unwrap();
    symlink("in", root.join("ok-link")).unwrap();
    let policy = t.policy();

    for link in [
        "in/deep/abs",
        "in/deep/rel",
        "ok-link/deep/abs",
        "slash/tmp",
        "in/deep/rel/../root",
    ] {
        for (name, op) in OPS {
            match op(&policy, link) {
                Err(e) => {
                    assert_eq!(
                        e.to_wire().code.to_string(),
                        "S215",
                        "{name} via {link}: {e:?}"
                    );
                    assert!(
                        e.to_string().starts_with("path escapes the fs jail roots"),
                        "{name} via {link}: {e}"
                    );
                }
                Ok(()) => panic!("{name} via {link} succeeded"),
            }
        }
    }
    assert!(root.join("in").is_dir() && !root.join("stolen").exists());
    let mut outside: Vec<_> = std::fs::read_dir(&t.outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    outside.sort();
    assert_eq!(
        outside,
        ["secret.txt"],
        "something appeared outside the jail"
    );
    assert_eq!(std::fs::read(&secret).unwrap(), SECRET);
    let md = std::fs::symlink_metadata(&secret).unwrap();
    assert!(md.file_type().is_file());
    assert_eq!(
        md.permissions().mode() & 0o7777,
        0o640,
        "the outside file's mode changed"
    );
    assert!(!Path::new("/tmp/secret.txt").exists());
}
