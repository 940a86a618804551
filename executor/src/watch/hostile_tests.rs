//! What a command in the jail can do to a watched tree while its binding is live: symlink
//! loops and links out of the jail, deep and wide trees, racing renames, special files.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use iii_shell_protocol::messages::Event;
use iii_shell_protocol::watch::{Change, ChangeKind};
use tokio::sync::broadcast;

use super::tests::policy;
use super::Watches;

/// Every change delivered until none arrived for `quiet` after the first (awaited up to 60 s:
/// a loaded machine may be slow, and every caller expects at least one event).
async fn drain(rx: &mut broadcast::Receiver<Event>, quiet: Duration) -> Vec<Change> {
    let mut got = Vec::new();
    let mut wait = Duration::from_secs(60);
    while let Ok(r) = tokio::time::timeout(wait, rx.recv()).await {
        wait = quiet;
        match r {
            Ok(Event::Changed { changes, .. }) => got.extend(changes),
            Ok(_) => {}
            Err(e) => panic!("the test's receiver lagged: {e}"),
        }
    }
    got
}

fn created(path: &str, dir: bool) -> Change {
    Change {
        path: path.into(),
        kind: ChangeKind::Created,
        dir,
        overflow: false,
    }
}

fn sorted(mut v: Vec<Change>) -> Vec<Change> {
    v.sort_by(|a, b| a.path.cmp(&b.path));
    v
}

/// The inodes every inotify instance of this process watches (from /proc/self/fdinfo).
fn watched_inodes() -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let is_inotify = std::fs::read_link(e.path())
            .is_ok_and(|l| l.as_os_str().as_bytes() == b"anon_inode:inotify");
        let info = format!("/proc/self/fdinfo/{}", e.file_name().to_string_lossy());
        let Ok(text) = std::fs::read_to_string(info) else {
            continue;
        };
        if !is_inotify {
            continue;
        }
        let marks = text.lines().filter(|l| l.starts_with("inotify "));
        for word in marks.flat_map(str::split_whitespace) {
            if let Some(hex) = word.strip_prefix("ino:") {
                out.insert(u64::from_str_radix(hex, 16).unwrap());
            }
        }
    }
    out
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// A symlink loop, a link to itself and links out of the jail (made before and while the
/// watch runs) are reported by name; nothing outside the jail is watched or reported.
#[tokio::test]
async fn symlink_loops_and_links_out_of_the_jail_are_never_followed() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let o = tempfile::tempdir().unwrap();
    let outside = std::fs::canonicalize(o.path()).unwrap();
    std::fs::create_dir(outside.join("sub")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("early")).unwrap();
    let (tx, mut rx) = broadcast::channel(4096);
    let w = Watches::new(tx);
    w.start(policy(&root, |_| {}), "b", &root.to_string_lossy(), false)
        .unwrap();
    std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
    std::os::unix::fs::symlink(".", root.join("self")).unwrap();
    std::os::unix::fs::symlink("b", root.join("a")).unwrap();
    std::os::unix::fs::symlink("a", root.join("b")).unwrap();
    std::fs::create_dir(root.join("new")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("new/esc")).unwrap();
    std::os::unix::fs::symlink("..", root.join("new/up")).unwrap();
    let got = sorted(drain(&mut rx, Duration::from_millis(800)).await);
    assert_eq!(
        got,
        vec![
            created("a", false),
            created("b", false),
            created("new", true),
            created("new/esc", false),
            created("new/up", false),
            created("out", false),
            created("self", false),
        ]
    );
    let inodes = watched_inodes();
    assert!(inodes.contains(&root.metadata().unwrap().ino()));
    assert!(inodes.contains(&root.join("new").metadata().unwrap().ino()));
    for p in [outside.clone(), outside.join("sub")] {
        assert!(
            !inodes.contains(&p.metadata().unwrap().ino()),
            "{p:?} watched"
        );
    }
    // Writes outside, directly and through the links, raise nothing.
    std::fs::write(outside.join("x"), "1").unwrap();
    std::fs::write(root.join("out/y"), "1").unwrap();
    std::fs::write(root.join("early/sub/z"), "1").unwrap();
    std::fs::write(root.join("new/esc/w"), "1").unwrap();
    std::fs::write(root.join("in.txt"), "1").unwrap();
    let got = drain(&mut rx, Duration::from_millis(800)).await;
    assert_eq!(got, vec![created("in.txt", false)]);
}

/// A FIFO, a socket and a character device are reported by name and never opened: the FIFO
/// has no reader once its event arrived, and the watcher goes on serving.
#[tokio::test]
async fn fifos_sockets_and_devices_are_reported_by_name_and_never_opened() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let (tx, mut rx) = broadcast::channel(4096);
    let w = Watches::new(tx);
    w.start(policy(&root, |_| {}), "b", &root.to_string_lossy(), false)
        .unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    for p in ["fifo", "d/fifo"] {
        // SAFETY: a valid NUL-terminated path; mkfifo touches nothing else.
        assert_eq!(
            unsafe { libc::mkfifo(cstr(&root.join(p)).as_ptr(), 0o644) },
            0
        );
    }
    let dev = cstr(&root.join("null"));
    // SAFETY: a valid NUL-terminated path; mknod creates one node (the tests run as root).
    let r = unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 3)) };
    assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    let got = sorted(drain(&mut rx, Duration::from_millis(800)).await);
    assert_eq!(
        got,
        vec![
            created("d", true),
            created("d/fifo", false),
            created("fifo", false),
            created("null", false),
            created("sock", false),
        ]
    );
    for p in ["fifo", "d/fifo"] {
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(root.join(p));
        // ENXIO: no process has the FIFO open for reading.
        assert_eq!(opened.unwrap_err().raw_os_error(), Some(libc::ENXIO), "{p}");
    }
    std::fs::write(root.join("after"), "1").unwrap();
    let got = drain(&mut rx, Duration::from_millis(800)).await;
    assert_eq!(got, vec![created("after", false)]);
}

/// Directories renamed back and forth inside the tree and in and out of it, racing the
/// watcher: afterwards events name the paths where files are now, and a directory moved out
/// of the tree raises nothing for what happens in it there.
#[tokio::test]
async fn racing_renames_leave_events_for_the_paths_where_files_are_now() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let o = tempfile::tempdir().unwrap();
    let outside = std::fs::canonicalize(o.path()).unwrap();
    std::fs::create_dir_all(root.join("a/in")).unwrap();
    std::fs::create_dir(root.join("g")).unwrap();
    let (tx, mut rx) = broadcast::channel(4096);
    let w = Watches::new(tx);
    w.start(policy(&root, |_| {}), "b", &root.to_string_lossy(), false)
        .unwrap();
    for _ in 0..200 {
        std::fs::rename(root.join("a"), root.join("b")).unwrap();
        std::fs::rename(root.join("b"), outside.join("c")).unwrap();
        std::fs::rename(outside.join("c"), root.join("a")).unwrap();
        std::fs::rename(root.join("a/in"), root.join("in2")).unwrap();
        std::fs::rename(root.join("in2"), root.join("a/in")).unwrap();
    }
    std::fs::rename(root.join("g"), outside.join("g")).unwrap();
    let race = drain(&mut rx, Duration::from_millis(800)).await;
    for c in &race {
        assert!(
            c.overflow || ["a", "a/in", "b", "b/in", "in2", "g"].contains(&c.path.as_str()),
            "{c:?}"
        );
    }
    std::fs::write(outside.join("g/x"), "1").unwrap();
    std::fs::write(outside.join("after-race"), "1").unwrap();
    std::fs::write(root.join("a/in/f"), "1").unwrap();
    std::fs::write(root.join("a/f"), "1").unwrap();
    let got = sorted(drain(&mut rx, Duration::from_millis(800)).await);
    assert_eq!(got, vec![created("a/f", false), created("a/in/f", false)]);
}

/// Makes `levels` nested directories `d` under `top`, fd-relative (the path outgrows
/// PATH_MAX).
fn deep_tree(top: &Path, levels: usize) {
    let name = CString::new("d").unwrap();
    // SAFETY: a valid NUL-terminated path; the descriptor is owned by this function.
    let mut fd = unsafe { libc::open(cstr(top).as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
    assert!(fd >= 0);
    for _ in 0..levels {
        // SAFETY: fd is an open directory, name a valid NUL-terminated name.
        assert_eq!(unsafe { libc::mkdirat(fd, name.as_ptr(), 0o755) }, 0);
        // SAFETY: as above; the old descriptor is closed once the next one is open.
        let next = unsafe { libc::openat(fd, name.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
        assert!(next >= 0);
        // SAFETY: fd is open and owned here.
        unsafe { libc::close(fd) };
        fd = next;
    }
    // SAFETY: fd is open and owned here.
    unsafe { libc::close(fd) };
}

/// A tree deeper than the kernel's path limit, moved into the watched tree in one rename,
/// cannot be watched or listed to its bottom: the watcher sends the overflow signal instead
/// of reporting the part it could list, and goes on serving.
#[tokio::test]
async fn a_tree_deeper_than_path_max_sends_the_overflow_signal() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let o = tempfile::tempdir().unwrap();
    let outside = std::fs::canonicalize(o.path()).unwrap();
    std::fs::create_dir(outside.join("deep")).unwrap();
    deep_tree(&outside.join("deep"), 3000);
    let (tx, mut rx) = broadcast::channel(4096);
    let w = Watches::new(tx);
    w.start(policy(&root, |_| {}), "b", &root.to_string_lossy(), false)
        .unwrap();
    std::fs::rename(outside.join("deep"), root.join("deep")).unwrap();
    let got = drain(&mut rx, Duration::from_millis(1500)).await;
    let overflow = Change {
        path: ".".into(),
        kind: ChangeKind::Modified,
        dir: true,
        overflow: true,
    };
    assert!(
        got.contains(&overflow),
        "no overflow in {} changes",
        got.len()
    );
    std::fs::write(root.join("after"), "1").unwrap();
    let got = drain(&mut rx, Duration::from_millis(800)).await;
    assert_eq!(got, vec![created("after", false)]);
}

/// 20,000 new directories: every one is reported, or the overflow signal is sent; never a
/// silent gap. The watcher goes on serving.
#[tokio::test]
async fn twenty_thousand_new_directories_are_all_reported_or_overflow() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let (tx, mut rx) = broadcast::channel(4096);
    let w = Watches::new(tx);
    w.start(policy(&root, |_| {}), "b", &root.to_string_lossy(), false)
        .unwrap();
    std::fs::create_dir(root.join("many")).unwrap();
    for i in 0..20_000 {
        std::fs::create_dir(root.join(format!("many/{i}"))).unwrap();
    }
    let got = drain(&mut rx, Duration::from_millis(1500)).await;
    if !got.iter().any(|c| c.overflow) {
        let paths: BTreeSet<String> = got.into_iter().map(|c| c.path).collect();
        let mut want: BTreeSet<String> = (0..20_000).map(|i| format!("many/{i}")).collect();
        want.insert("many".into());
        assert_eq!(paths, want);
    }
    std::fs::write(root.join("after"), "1").unwrap();
    let got = drain(&mut rx, Duration::from_millis(800)).await;
    assert_eq!(got, vec![created("after", false)]);
}
