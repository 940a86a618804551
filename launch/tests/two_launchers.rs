//! Two launchers live in one process: each has its own job-cgroup base and pool, spawns and
//! reaps its own commands concurrently with the other, and neither sees (or kills) the
//! other's jobs.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iii_shell_launch::cgroups::JobLimits;
use iii_shell_launch::plan::{ChildConfinement, EnvBlock, ExecImage, SpawnPlan};
use iii_shell_launch::prestarted::State;
use iii_shell_launch::reaper::ROOTS;
use iii_shell_launch::spawn::pipe;
use iii_shell_launch::wait::{try_reap, try_reap_blocking, ExitStatus};
use iii_shell_launch::{Launcher, Settings};

/// Everything left in a pipe whose write ends are all closed.
fn drain(fd: OwnedFd) -> String {
    let mut f = std::fs::File::from(fd);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("read: {e}"),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup v2 path in `text`, the contents of a `/proc/<pid>/cgroup` (its `0::` line).
fn cgroup_line(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_default()
        .to_string()
}

/// `base`'s path relative to the cgroup v2 mount, as `/proc/<pid>/cgroup` writes it.
fn relative(base: &Path) -> String {
    let own = iii_shell_launch::cgroups::own_cgroup_dir().expect("own cgroup");
    let own_rel = cgroup_line(&std::fs::read_to_string("/proc/self/cgroup").unwrap());
    let name = base.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(base.parent(), Some(own.as_path()));
    format!("{}/{name}", own_rel.trim_end_matches('/'))
}

/// Runs `sh -c 'echo <tag>; cat /proc/self/cgroup; exit <code>'` in a job cgroup of
/// `launcher`'s and reaps it: (status, stdout, the job cgroup's directory).
fn run(launcher: &Launcher, tag: &str, code: i32) -> (ExitStatus, String, PathBuf) {
    let (r, w) = pipe().unwrap();
    let argv: Vec<String> = [
        "/bin/sh".to_string(),
        "-c".into(),
        format!("echo {tag}; cat /proc/self/cgroup; exit {code}"),
    ]
    .into();
    let mut plan = SpawnPlan::new(
        "/bin/sh",
        &argv,
        Vec::<(String, String)>::new(),
        launcher.dev_null().unwrap(),
        w,
        launcher.dev_null().unwrap(),
    )
    .unwrap();
    let cg = launcher
        .cgroups()
        .take_for(JobLimits::default())
        .expect("a job cgroup");
    plan.cgroup = Some(cg.target());
    let child = launcher.spawn(&plan).expect("spawn");
    drop(plan);
    let status = try_reap_blocking(&child.pidfd).expect("reap");
    let out = drain(r);
    let dir = cg.dir.clone();
    while !cg.is_empty() {
        std::thread::yield_now();
    }
    cg.recycle().expect("an emptied cgroup goes back");
    (status, out, dir)
}

#[test]
fn two_launchers_in_one_process_each_run_and_reap_their_own_jobs() {
    if !iii_shell_confine::requirement::root("job cgroups") {
        return;
    }
    let a = Arc::new(Launcher::new(Settings::private()));
    let b = Arc::new(Launcher::new(Settings {
        prestart: false,
        ..Settings::private()
    }));
    let (Some(base_a), Some(base_b)) = (
        a.cgroups().base().map(|x| x.dir.clone()),
        b.cgroups().base().map(|x| x.dir.clone()),
    ) else {
        a.kill_all();
        b.kill_all();
        iii_shell_confine::requirement::unmet("no writable cgroup v2 hierarchy here");
        return;
    };
    assert_ne!(base_a, base_b, "each launcher has a base of its own");
    assert!(base_a.is_dir() && base_b.is_dir());
    let (rel_a, rel_b) = (relative(&base_a), relative(&base_b));

    // Both spawn and reap at once, each under its own base, with its own pool.
    let threads: Vec<_> = [
        (a.clone(), "A", rel_a.clone()),
        (b.clone(), "B", rel_b.clone()),
    ]
    .into_iter()
    .map(|(l, name, rel)| {
        std::thread::spawn(move || {
            for i in 0..8 {
                let tag = format!("{name}{i}");
                let (status, out, dir) = run(&l, &tag, i);
                assert_eq!(status, ExitStatus::Exited(i), "{tag}: {out}");
                let mut lines = out.lines();
                assert_eq!(lines.next(), Some(tag.as_str()), "{out}");
                let cgroup = cgroup_line(&lines.collect::<Vec<_>>().join("\n"));
                assert!(
                    cgroup.starts_with(&format!("{rel}/job-")),
                    "{tag} ran in {cgroup}, not under its launcher's base {rel}"
                );
                assert!(dir.starts_with(l.cgroups().base().unwrap().dir.as_path()));
            }
        })
    })
    .collect();
    for t in threads {
        t.join().expect("a launcher's thread");
    }

    // The one that pre-starts does so inside its own base; the other does not pre-start.
    assert!(!b.prestarting());
    assert_eq!(b.prestart_availability(), "off");
    if a.prestarting() {
        let waiting = a
            .prestart(&ChildConfinement::default(), JobLimits::default())
            .expect("a pre-started process");
        // A launch waits 5 ms for a process still setting itself up (then the executor
        // spawns the ordinary way); this busy machine may need longer.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while waiting.state() == State::Starting && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(
            waiting.state(),
            State::Ready,
            "the pre-started process set itself up"
        );
        let argv = [
            "/bin/sh".to_string(),
            "-c".into(),
            "echo P; cat /proc/self/cgroup; exit 7".into(),
        ];
        let image = ExecImage::new("/bin/sh", &argv, Arc::new(EnvBlock::default()), &[]).unwrap();
        let mut cmd = waiting.launch(image, None, None).expect("handed over");
        let status = try_reap_blocking(&cmd.pidfd).expect("reap");
        let _ = cmd.memory.outcome();
        ROOTS.lock().unwrap().retain(|&p| p != cmd.pid);
        assert_eq!(status, ExitStatus::Exited(7));
        let out = drain(cmd.stdout);
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("P"), "{out}");
        let cgroup = cgroup_line(&lines.collect::<Vec<_>>().join("\n"));
        assert!(cgroup.starts_with(&format!("{rel_a}/job-")), "{cgroup}");
        if let Some(cg) = cmd.cgroup.take() {
            let _ = cg.recycle();
        }
    } else {
        eprintln!("note: no clone3 trampoline here, so no pre-started process to check");
    }

    // A job of B's outlives A's shutdown: A kills only what is under its own base.
    let cg = b.cgroups().take().expect("a job cgroup of B's");
    let mut plan = SpawnPlan::new(
        "/bin/sleep",
        &["sleep".to_string(), "30".into()],
        Vec::<(String, String)>::new(),
        b.dev_null().unwrap(),
        b.dev_null().unwrap(),
        b.dev_null().unwrap(),
    )
    .unwrap();
    plan.cgroup = Some(cg.target());
    let sleeper = b.spawn(&plan).expect("spawn");
    drop(plan);
    a.kill_all();
    assert!(!base_a.exists(), "A's base is gone with A's shutdown");
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        try_reap(&sleeper.pidfd).expect("waitid"),
        None,
        "B's job was killed by A's shutdown"
    );
    assert!(base_b.is_dir());
    b.kill_all();
    assert_eq!(
        try_reap_blocking(&sleeper.pidfd).expect("reap"),
        ExitStatus::Signaled(libc::SIGKILL)
    );
    drop(cg);
    assert!(!base_b.exists(), "B's base is gone with B's shutdown");
}
