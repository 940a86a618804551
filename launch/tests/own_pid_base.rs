//! An executor whose pid an earlier executor had (a container's executor often gets the same
//! small pid every time) finds that one's job-cgroup base, and its twin in a cgroup v1 `pids`
//! hierarchy, with job cgroups whose names collide with its own. They are taken for stale:
//! its first job cgroup is made, not refused. A test binary of its own, so that nothing in
//! this process has made a base before the planted one.

use iii_shell_launch::{cgroups, pids_v1, Launcher, Settings};

#[test]
fn a_leftover_base_with_our_own_pid_is_swept_not_reused() {
    if !nix::unistd::geteuid().is_root() {
        iii_shell_confine::requirement::unmet("needs root (cgroup directories)");
        return;
    }
    let Some(parent) = cgroups::own_cgroup_dir() else {
        iii_shell_confine::requirement::unmet("no cgroup v2 hierarchy here");
        return;
    };
    let name = format!("iii-shell-{}", std::process::id());
    let planted = parent.join(&name).join("job-1");
    if std::fs::create_dir_all(&planted).is_err() {
        iii_shell_confine::requirement::unmet("the cgroup v2 hierarchy is not writable here");
        return;
    }
    let twin = pids_v1::own().map(|d| d.join(&name).join("job-1"));
    if let Some(t) = &twin {
        std::fs::create_dir_all(t).expect("plant a v1 twin");
    }
    let launcher = Launcher::new(Settings::executor());
    let cg = launcher.cgroups().create();
    let made = cg.is_some();
    // Leave nothing behind, whatever happened.
    if let Some(cg) = cg {
        let _ = cg.recycle();
    }
    launcher.kill_all();
    assert!(
        made,
        "the first job cgroup was refused: the leftover base's job-1 (v2{}) collided with it",
        if twin.is_some() {
            " and its v1 pids twin"
        } else {
            ""
        }
    );
}
