//! The SIGCHLD path: exited orphans are reaped without a `/proc` scan, job roots are left to
//! their supervisors, and a root that hides the queue is reported so the scan can settle it.
//!
//! One test in its own binary: it reaps "any child", which would steal the children of other
//! tests running in the same process.

use std::time::{Duration, Instant};

use iii_shell_launch::procfs;
use iii_shell_launch::reaper::{reap_exited_orphans, reap_orphans, OrphanCheck, ROOTS};

/// A child that exits at once; returns once it is a zombie.
fn exited_child() -> i32 {
    // SAFETY: the child only calls _exit, which is async-signal-safe.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: as above.
        unsafe { libc::_exit(0) };
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while procfs::stat(pid).is_none_or(|s| s.state != b'Z') {
        assert!(Instant::now() < deadline, "child {pid} never exited");
        std::thread::sleep(Duration::from_millis(2));
    }
    pid
}

fn is_zombie(pid: i32) -> bool {
    procfs::stat(pid).is_some_and(|s| s.state == b'Z')
}

fn set_roots(roots: &[i32]) {
    let mut r = ROOTS.lock().unwrap();
    r.clear();
    r.extend_from_slice(roots);
}

#[test]
fn exited_orphans_are_reaped_and_roots_are_left_to_their_supervisors() {
    // Nothing exited: nothing to do.
    assert_eq!(reap_exited_orphans(), OrphanCheck::Clear);

    // Two orphans: both reaped by one call.
    let (a, b) = (exited_child(), exited_child());
    assert_eq!(reap_exited_orphans(), OrphanCheck::Clear);
    assert!(
        !is_zombie(a) && !is_zombie(b),
        "orphans {a} {b} left as zombies"
    );

    // A root that exited first hides the orphan behind it: the root stays a zombie for its
    // supervisor, and the caller is told to look again.
    let root = exited_child();
    let orphan = exited_child();
    set_roots(&[root]);
    assert_eq!(reap_exited_orphans(), OrphanCheck::RootPending);
    assert!(is_zombie(root), "a job root was reaped by the orphan path");
    assert!(is_zombie(orphan));
    // The /proc scan sees past it.
    reap_orphans();
    assert!(is_zombie(root), "a job root was reaped by the /proc scan");
    assert!(!is_zombie(orphan), "the scan left orphan {orphan}");

    // Once its supervisor has reaped it (here: it stops being a root), the queue is clear.
    set_roots(&[]);
    assert_eq!(reap_exited_orphans(), OrphanCheck::Clear);
    assert!(!is_zombie(root));
}
