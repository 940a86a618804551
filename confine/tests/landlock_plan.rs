//! The Landlock plan on a temp tree: which paths get which rights, jailed and unjailed,
//! around denied paths and protected entries, and for devices. Pure data; no ruleset is
//! applied here (the escape suite applies the real thing).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use iii_shell_confine::landlock_plan::{
    device_rights, directory_only, full, plan, read_exec, Devices, Plan, DEVICE_FILES,
};
use iii_shell_policy::config::Config;
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

/// The plan with the host's devices.
fn host_plan(c: &Config, protected: &[PathBuf]) -> Plan {
    plan(c, protected, &Devices::host())
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
    let plan = host_plan(&c, &[t.p("root/a/.env")]);

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
    let plan = host_plan(&c, &[]);
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
    let plan = host_plan(&c, &[]);
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

/// Asserts that no grant lies at or under a denied path.
fn nothing_denied_is_granted(plan: &Plan) {
    for (g, a) in &plan.grants {
        for d in &plan.denied {
            assert!(
                !g.starts_with(d),
                "{g:?} ({a:?}) is at or under denied {d:?}"
            );
        }
    }
}

/// The grants at or under `base`, sorted (a path may be granted twice: Landlock adds them up).
fn sorted_under(plan: &Plan, base: &Path) -> Vec<(PathBuf, BitFlags<AccessFs>)> {
    let mut v: Vec<_> = plan
        .grants
        .iter()
        .filter(|(p, _)| p.starts_with(base))
        .cloned()
        .collect();
    v.sort_by(|a, b| (&a.0, a.1.bits()).cmp(&(&b.0, b.1.bits())));
    v
}

fn sorted(mut v: Vec<PathBuf>) -> Vec<PathBuf> {
    v.sort();
    v.dedup();
    v
}

/// A /dev-like tree under `t/dev`: the allowed `null` and `pts/0`, other character devices
/// (`tty0`, `sub/ttyS0`), block devices (`sda`, `sub/sdb1`), a regular file and a symlink
/// to a block device. `None` (after saying so) when device nodes cannot be made here.
fn fake_dev(t: &Tree) -> Option<Devices> {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    if !iii_shell_confine::requirement::root("mknod of fake device nodes") {
        return None;
    }
    for d in ["dev/pts", "dev/sub"] {
        std::fs::create_dir_all(t.p(d)).unwrap();
    }
    for (rel, kind, (major, minor)) in [
        ("dev/null", SFlag::S_IFCHR, (1, 3)),
        ("dev/pts/0", SFlag::S_IFCHR, (136, 0)),
        ("dev/tty0", SFlag::S_IFCHR, (4, 0)),
        ("dev/sub/ttyS0", SFlag::S_IFCHR, (4, 64)),
        ("dev/sda", SFlag::S_IFBLK, (8, 0)),
        ("dev/sub/sdb1", SFlag::S_IFBLK, (8, 17)),
    ] {
        if let Err(e) = mknod(
            &t.p(rel),
            kind,
            Mode::from_bits_truncate(0o600),
            makedev(major, minor),
        ) {
            iii_shell_confine::requirement::unmet(&format!("mknod {rel}: {e}"));
            return None;
        }
    }
    std::fs::write(t.p("dev/sub/file"), "x").unwrap();
    std::os::unix::fs::symlink(t.p("dev/sda"), t.p("dev/link")).unwrap();
    Some(Devices {
        dir: t.p("dev"),
        allowed: vec![t.p("dev/null"), t.p("dev/pts")],
    })
}

#[test]
fn the_rights_are_these_exact_sets() {
    use AccessFs::*;
    assert_eq!(read_exec(), Execute | ReadFile | ReadDir);
    assert_eq!(
        directory_only(),
        ReadDir
            | RemoveDir
            | RemoveFile
            | MakeChar
            | MakeDir
            | MakeReg
            | MakeSock
            | MakeFifo
            | MakeBlock
            | MakeSym
            | Refer
    );
    assert_eq!(
        full(),
        directory_only() | Execute | ReadFile | WriteFile | Truncate | IoctlDev
    );
    assert_eq!(
        device_rights(),
        Execute | ReadFile | ReadDir | WriteFile | IoctlDev | Truncate
    );
    assert_eq!(
        iii_shell_confine::landlock_plan::dir_ops(read_exec()),
        BitFlags::from(ReadDir)
    );
}

#[test]
fn jailed_on_a_fake_dev_grants_the_allowed_devices_and_denies_every_other_node() {
    let t = Tree::new(&["root/a/.env", "root/a/keep.rs", "root/b/file"]);
    let Some(devices) = fake_dev(&t) else { return };
    // The root is named through a symlink, the protected entry through another: grants are
    // made on canonical paths, and both spellings of the protected entry are denied.
    std::os::unix::fs::symlink(t.p("root"), t.p("rootlink")).unwrap();
    std::os::unix::fs::symlink(t.p("root/a"), t.p("root/alias")).unwrap();
    let mut c = Config::default();
    c.fs.host_roots = vec![t.s("rootlink")];
    c.fs.allow_unjailed = false;
    c.confinement.scratch_paths.clear();
    c.confinement.secret_paths.clear();
    c.confinement.system_paths = vec![t.s("dev")];
    let plan = plan(&c, &[t.p("root/alias/.env")], &devices);

    assert_eq!(
        sorted(plan.denied.clone()),
        sorted(vec![
            t.p("root/a/.env"),
            t.p("root/alias/.env"),
            t.p("dev/tty0"),
            t.p("dev/sda"),
            t.p("dev/sub/ttyS0"),
            t.p("dev/sub/sdb1"),
        ])
    );
    let listing = BitFlags::from(AccessFs::ReadDir);
    assert_eq!(
        sorted_under(&plan, &t.base),
        vec![
            (t.p("dev"), listing),
            (t.p("dev/null"), read_exec()),
            (t.p("dev/null"), device_rights()),
            (t.p("dev/pts"), read_exec()),
            (t.p("dev/pts"), device_rights()),
            (t.p("dev/sub"), listing),
            (t.p("dev/sub/file"), read_exec()),
            (t.p("root"), directory_only()),
            (t.p("root/a"), directory_only()),
            (t.p("root/a/keep.rs"), full()),
            (t.p("root/b"), full()),
        ]
    );
    nothing_denied_is_granted(&plan);
    assert_eq!(
        reach(&plan, &t.p("dev/pts/0")),
        read_exec() | device_rights()
    );
    for denied in [
        "dev/tty0",
        "dev/sda",
        "dev/sub/ttyS0",
        "dev/sub/sdb1",
        "dev/link",
    ] {
        assert_eq!(reach(&plan, &t.p(denied)), listing, "{denied}");
    }
    assert_eq!(reach(&plan, &t.p("root/a/.env")), directory_only());
    // Nothing outside the tree: the host's own /dev is not this plan's.
    for outside in ["/", "/dev", "/dev/null", "/tmp"] {
        assert_eq!(
            reach(&plan, Path::new(outside)),
            BitFlags::empty(),
            "{outside}"
        );
    }
}

#[test]
fn unjailed_on_a_fake_dev_denies_the_block_devices_only() {
    let t = Tree::new(&["x/secret/deep/key", "x/other/file", "y/file"]);
    let Some(devices) = fake_dev(&t) else { return };
    let mut c = Config::builtin_default();
    assert!(c.fs.host_roots.is_empty());
    c.confinement.secret_paths = vec![t.s("x/secret")];
    let plan = plan(&c, &[], &devices);

    assert_eq!(
        sorted(plan.denied.clone()),
        sorted(vec![t.p("x/secret"), t.p("dev/sda"), t.p("dev/sub/sdb1")])
    );
    assert_eq!(
        sorted_under(&plan, &t.base),
        vec![
            (t.base.clone(), directory_only()),
            (t.p("dev"), directory_only()),
            (t.p("dev/null"), full()),
            (t.p("dev/pts"), full()),
            (t.p("dev/sub"), directory_only()),
            (t.p("dev/sub/file"), full()),
            (t.p("dev/sub/ttyS0"), full()),
            (t.p("dev/tty0"), full()),
            (t.p("x"), directory_only()),
            (t.p("x/other"), full()),
            (t.p("y"), full()),
        ]
    );
    nothing_denied_is_granted(&plan);
    // Every directory above the tree is carved too, down from `/`.
    for a in t.base.ancestors().skip(1) {
        assert_eq!(reach(&plan, a), directory_only(), "{a:?}");
    }
    for denied in [
        "x/secret",
        "x/secret/deep",
        "x/secret/deep/key",
        "dev/sda",
        "dev/sub/sdb1",
    ] {
        assert_eq!(reach(&plan, &t.p(denied)), directory_only(), "{denied}");
    }
}

#[test]
fn a_denied_root_or_a_root_under_a_denied_path_gets_nothing() {
    let t = Tree::new(&["secret/root/file", "open/file"]);
    let mut c = Config::default();
    c.fs.host_roots = vec![t.s("secret/root"), t.s("open")];
    c.fs.allow_unjailed = false;
    c.confinement.scratch_paths = vec![t.s("secret")];
    c.confinement.system_paths.clear();
    c.confinement.secret_paths = vec![t.s("secret")];
    let plan = host_plan(&c, &[t.p("open/file")]);
    assert_eq!(
        sorted_under(&plan, &t.base),
        vec![(t.p("open"), directory_only())]
    );
    nothing_denied_is_granted(&plan);
}
