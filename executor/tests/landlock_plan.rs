//! The Landlock plan on a temp tree: which paths get which rights, jailed and unjailed,
//! around denied paths and protected entries, and for devices. Pure data; no ruleset is
//! applied here (the escape suite applies the real thing).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use iii_shell_executor::confine::landlock_rules::{
    device_rights, directory_only, full, plan, read_exec, Plan, DEVICE_FILES,
};
use iii_shell_executor::jail::Protected;
use iii_shell_protocol::config::Config;
use landlock::{AccessFs, BitFlags};

struct Tree {
    _dir: tempfile::TempDir,
    base: PathBuf,
}

impl Tree {
    fn new(files: &[&str]) -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        for f in files {
            let p = base.join(f);
            if f.ends_with('/') {
                std::fs::create_dir_all(&p).unwrap();
            } else {
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, "x").unwrap();
            }
        }
        Tree { _dir: dir, base }
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }
    fn s(&self, rel: &str) -> String {
        self.p(rel).to_string_lossy().into_owned()
    }
}

fn protected(in_roots: Vec<PathBuf>) -> Protected {
    Protected {
        ids: Default::default(),
        in_roots,
        truncated: false,
    }
}

/// The grants at or under `base`, as a map.
fn under(plan: &Plan, base: &Path) -> BTreeMap<PathBuf, BitFlags<AccessFs>> {
    plan.grants
        .iter()
        .filter(|(p, _)| p.starts_with(base))
        .cloned()
        .collect()
}

/// The rights a command has on `path`: Landlock adds up the rules of the path and of every
/// directory above it.
fn reach(plan: &Plan, path: &Path) -> BitFlags<AccessFs> {
    plan.grants
        .iter()
        .filter(|(g, _)| path.starts_with(g))
        .fold(BitFlags::empty(), |acc, (_, a)| acc | *a)
}

const CONTENT: [AccessFs; 3] = [AccessFs::ReadFile, AccessFs::WriteFile, AccessFs::Execute];

fn no_content(rights: BitFlags<AccessFs>) -> bool {
    CONTENT.iter().all(|r| !rights.contains(*r))
}

#[test]
fn jailed_roots_scratch_and_system_paths_with_denied_and_protected_entries() {
    let t = Tree::new(&[
        "root/a/keep.rs",
        "root/a/.env",
        "root/top.txt",
        "root/secret/key",
        "scratch/",
        "sys/bin/tool",
    ]);
    let mut c = Config::default();
    c.fs.host_roots = vec![t.s("root")];
    c.fs.allow_unjailed = false;
    c.confinement.scratch_paths = vec![t.s("scratch")];
    c.confinement.system_paths = vec![t.s("sys")];
    c.confinement.secret_paths = vec![t.s("root/secret")];
    // `.env` matched a non-accessible glob when the policy was built.
    let plan = plan(&c, &protected(vec![t.p("root/a/.env")]));

    let want: BTreeMap<PathBuf, BitFlags<AccessFs>> = [
        (t.p("root"), directory_only()),
        (t.p("root/a"), directory_only()),
        (t.p("root/a/keep.rs"), full()),
        (t.p("root/top.txt"), full()),
        (t.p("scratch"), full()),
        (t.p("sys"), read_exec()),
    ]
    .into_iter()
    .collect();
    assert_eq!(under(&plan, &t.base), want);
    assert!(plan.denied.contains(&t.p("root/secret")));
    assert!(plan.denied.contains(&t.p("root/a/.env")));
    for denied in ["root/secret", "root/secret/key", "root/a/.env"] {
        assert!(no_content(reach(&plan, &t.p(denied))), "{denied}");
    }
    assert_eq!(reach(&plan, &t.p("root/a/keep.rs")), full());
    assert_eq!(reach(&plan, &t.p("sys/bin/tool")), read_exec());
    assert!(!reach(&plan, &t.p("sys/bin/tool")).contains(AccessFs::WriteFile));
    // Nothing else of the host.
    for outside in ["/", "/home", "/root", "/var"] {
        assert_eq!(
            reach(&plan, Path::new(outside)),
            BitFlags::empty(),
            "{outside}"
        );
    }
}

#[test]
fn jailed_devices_are_the_listed_character_devices_only() {
    let t = Tree::new(&["root/"]);
    let mut c = Config::default();
    c.fs.host_roots = vec![t.s("root")];
    c.fs.allow_unjailed = false;
    c.confinement.scratch_paths.clear();
    c.confinement.system_paths = vec!["/dev".into()];
    let plan = plan(&c, &protected(vec![]));
    assert!(reach(&plan, Path::new("/dev/null")).contains(device_rights()));
    assert!(reach(&plan, Path::new("/dev/urandom")).contains(AccessFs::ReadFile));
    // Every other device node under /dev: no content rights at all.
    let mut others = 0;
    for e in std::fs::read_dir("/dev").unwrap().flatten() {
        use std::os::unix::fs::FileTypeExt;
        let p = e.path();
        let t = e.file_type().unwrap();
        if !(t.is_char_device() || t.is_block_device())
            || DEVICE_FILES.iter().any(|d| p.starts_with(d))
        {
            continue;
        }
        others += 1;
        assert!(
            no_content(reach(&plan, &p)),
            "{p:?}: {:?}",
            reach(&plan, &p)
        );
        assert!(plan.denied.contains(&p), "{p:?}");
    }
    if others == 0 {
        iii_shell_confine::requirement::unmet("/dev has no device node besides the allowed ones");
    }
}

#[test]
fn unjailed_grants_everything_but_the_denied_paths_and_block_devices() {
    let t = Tree::new(&["x/secret/key", "x/other/file", "y/file"]);
    let mut c = Config::builtin_default();
    c.confinement.secret_paths = vec![t.s("x/secret")];
    let plan = plan(&c, &protected(vec![]));
    assert_eq!(
        plan.grants
            .iter()
            .find(|(p, _)| p == Path::new("/"))
            .map(|g| g.1),
        Some(directory_only()),
        "the root is carved, not granted whole"
    );
    assert_eq!(
        under(&plan, &t.p("x")).get(&t.p("x")),
        Some(&directory_only())
    );
    assert_eq!(reach(&plan, &t.p("x/other/file")), full());
    assert_eq!(reach(&plan, &t.p("y/file")), full());
    assert!(no_content(reach(&plan, &t.p("x/secret/key"))));
    assert!(no_content(reach(&plan, &t.p("x/secret"))));
    // Character devices stay usable unjailed; block devices never are.
    assert!(reach(&plan, Path::new("/dev/null")).contains(AccessFs::WriteFile));
    let mut blocks = 0;
    for e in std::fs::read_dir("/dev").unwrap().flatten() {
        use std::os::unix::fs::FileTypeExt;
        if e.file_type().unwrap().is_block_device() {
            blocks += 1;
            assert!(no_content(reach(&plan, &e.path())), "{:?}", e.path());
        }
    }
    if blocks == 0 {
        iii_shell_confine::requirement::unmet("/dev has no block device");
    }
}

#[test]
fn landlock_off_plans_nothing_for_the_ruleset() {
    let t = Tree::new(&["root/"]);
    let mut c = Config::default();
    c.fs.host_roots = vec![t.s("root")];
    c.fs.allow_unjailed = false;
    c.confinement.landlock = false;
    let r = iii_shell_executor::confine::landlock_rules::build(&c, &protected(vec![])).unwrap();
    assert!(r.fd.is_none());
    assert_eq!(r.rules, 0);
    assert_eq!(r.gaps, vec!["confinement.landlock is false".to_string()]);
}
