//! Pre-started command processes (`executor/src/warm.rs`): what a waiting process holds, how
//! it ends, and that a command run in one reads exactly like one spawned from scratch.

use crate::common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::*;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::messages::Request;
use serde_json::json;

/// Sends the executor a newer policy: the built-in default with `max_output_bytes: 4`.
async fn install_four_byte_policy(h: &Harness) {
    let mut config = Config::builtin_default();
    config.max_output_bytes = 4;
    h.services
        .executor
        .get()
        .unwrap()
        .call(Request::SetPolicy {
            generation: 10_000,
            config_json: serde_json::to_string(&config).unwrap(),
        })
        .await
        .expect("policy accepted");
}

async fn two_waiting(h: &Harness) -> BTreeSet<i32> {
    let pid = h.executor_pid;
    assert!(
        eventually(Duration::from_secs(5), || waiting_of(pid).len() == 2).await,
        "the executor keeps two pre-started processes: {:?}",
        waiting_of(pid)
    );
    waiting_of(pid)
}

#[tokio::test]
async fn waiting_processes_hold_nothing_of_the_executor_and_are_confined() {
    let h = Harness::default().await;
    h.ok("shell::exec", json!({"command": "true"})).await;
    for pid in two_waiting(&h).await {
        let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let sockets = fds
            .iter()
            .filter(|fd| {
                std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
                    .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
            })
            .count();
        // Its stdio (/dev/null and the command's two output pipes, made before any call)
        // and the one socket a command arrives on.
        assert_eq!(fds.len(), 4, "pid {pid} holds {fds:?}");
        assert_eq!(sockets, 1, "pid {pid} holds {fds:?}");
        let target = |fd: u32| {
            std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        assert_eq!(target(0), "/dev/null", "pid {pid}");
        assert!(target(1).starts_with("pipe:"), "pid {pid}: {}", target(1));
        assert!(target(2).starts_with("pipe:"), "pid {pid}: {}", target(2));
        assert_ne!(target(1), target(2), "pid {pid}: one pipe each");
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        assert_eq!(comm.trim(), "iii-prestarted", "pid {pid}");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        for line in ["NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000"] {
            assert!(status.contains(line), "pid {pid} lacks {line}:\n{status}");
        }
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        assert!(cgroup.contains("/job-"), "pid {pid} is in {cgroup}");
    }
}

#[tokio::test]
async fn commands_run_in_a_waiting_process_and_in_their_own_session_and_cgroup() {
    let h = Harness::default().await;
    h.ok("shell::exec", json!({"command": "true"})).await;
    let waiting = two_waiting(&h).await;
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", "echo $$; cut -d' ' -f6 /proc/self/stat; grep -c '^0::.*/job-' /proc/self/cgroup; pwd; cat"], "cwd": "/tmp", "stdin": "in", "env": {"X_MARK": "1"}}),
        )
        .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let out = r["stdout"].as_str().unwrap();
    let lines: Vec<&str> = out.lines().collect();
    let pid: i32 = lines[0].parse().unwrap();
    assert!(
        waiting.contains(&pid),
        "the command ran as pid {pid}, not in one of the waiting processes {waiting:?}"
    );
    assert_eq!(lines[1], lines[0], "its own session");
    assert_eq!(lines[2], "1", "in a job cgroup: {out}");
    assert_eq!(lines[3], "/tmp");
    assert_eq!(lines[4], "in");
}

/// The hand-over carries only what the call adds: no descriptor, stdin alone, or cwd alone.
#[tokio::test]
async fn a_waiting_process_takes_calls_with_and_without_stdin_and_cwd() {
    let h = Harness::default().await;
    h.ok("shell::exec", json!({"command": "true"})).await;
    let own_cwd = std::env::current_dir().unwrap();
    let script = "echo $$; pwd; ls /proc/self/fd | sort -n | tr '\\n' ' '; echo; cat; echo err >&2";
    for (extra, cwd, input) in [
        (json!({}), own_cwd.to_string_lossy().into_owned(), ""),
        (
            json!({"stdin": "given"}),
            own_cwd.to_string_lossy().into_owned(),
            "given",
        ),
        (json!({"cwd": "/tmp"}), "/tmp".to_string(), ""),
    ] {
        let waiting = two_waiting(&h).await;
        let mut req = json!({"command": "sh", "args": ["-c", script]});
        for (k, v) in extra.as_object().unwrap() {
            req[k] = v.clone();
        }
        let r = h.ok("shell::exec", req.clone()).await;
        assert_eq!(r["exit_code"], 0, "{req}: {r}");
        assert_eq!(r["stderr"], "err\n", "{req}: {r}");
        let out = r["stdout"].as_str().unwrap();
        let lines: Vec<&str> = out.lines().collect();
        let pid: i32 = lines[0].parse().unwrap();
        assert!(
            waiting.contains(&pid),
            "{req}: ran as pid {pid}, not in a waiting process {waiting:?}"
        );
        assert_eq!(lines[1], cwd, "{req}: {out}");
        // 0-2, and the descriptor ls reads /proc/self/fd through: nothing else leaked in.
        assert_eq!(lines[2].trim(), "0 1 2 3", "{req}: {out}");
        assert_eq!(lines.get(3).copied().unwrap_or(""), input, "{req}: {out}");
    }
}

#[tokio::test]
async fn an_exec_failure_reads_the_same_as_without_prestart() {
    let dir = tempdir();
    let prog = dir.path().join("not-a-program");
    std::fs::write(&prog, b"\x00\x01\x02\x03 not an executable format").unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let payload = json!({"command": prog.to_str().unwrap(), "args": []});

    let warm = Harness::default().await;
    warm.ok("shell::exec", json!({"command": "true"})).await;
    two_waiting(&warm).await;
    let a = warm.err("shell::exec", payload.clone()).await;

    let cold = Harness::with_args(Config::builtin_default(), &["--no-prestart"]).await;
    cold.ok("shell::exec", json!({"command": "true"})).await;
    assert!(
        waiting_of(cold.executor_pid).is_empty(),
        "--no-prestart keeps no waiting process"
    );
    let b = cold.err("shell::exec", payload).await;

    assert_eq!((a.code, &a.message), (b.code, &b.message));
    assert!(
        a.message.contains("Exec format error (os error 8)"),
        "{}",
        a.message
    );
    // The pool is topped up again after the failure.
    two_waiting(&warm).await;
}

#[tokio::test]
async fn a_policy_change_replaces_the_waiting_processes() {
    let h = Harness::default().await;
    h.ok("shell::exec", json!({"command": "true"})).await;
    let before = two_waiting(&h).await;
    install_four_byte_policy(&h).await;
    for pid in &before {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "waiting process {pid} of the old policy was not discarded and reaped"
        );
    }
    let after = two_waiting(&h).await;
    assert!(after.is_disjoint(&before));
    // And the new policy is the one commands get.
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "echo", "args": ["abcdefgh"]}),
        )
        .await;
    assert_eq!(r["stdout"], "abcd");
    assert_eq!(r["stdout_truncated"], true);
}

#[tokio::test]
async fn a_policy_change_during_a_call_ends_the_old_waiting_processes_at_once() {
    let h = Harness::default().await;
    h.ok("shell::exec", json!({"command": "true"})).await;
    let before = two_waiting(&h).await;
    // A call under the old policy is still running when the policy changes: the old policy
    // lives on until it ends, but its waiting process must not.
    let slow = h.ok("shell::exec", json!({"command": "sleep", "args": ["1"]}));
    let change = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        install_four_byte_policy(&h).await;
        let during = two_waiting(&h).await;
        assert!(
            during.is_disjoint(&before),
            "a waiting process of the replaced policy outlived the change: {during:?} vs {before:?}"
        );
        during
    };
    let (r, during) = tokio::join!(slow, change);
    assert_eq!(r["exit_code"], 0);
    // The old call's end starts nothing under the old policy.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(waiting_of(h.executor_pid), during);
}

#[tokio::test]
async fn waiting_processes_end_with_the_executor() {
    let mut h = Harness::default().await;
    h.ok("shell::exec", json!({"command": "true"})).await;
    let waiting = two_waiting(&h).await;
    h.child.kill().unwrap();
    h.child.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(5), || waiting
            .iter()
            .all(|&p| !alive(p)))
        .await,
        "waiting processes outlived their executor: {:?}",
        waiting.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn concurrent_calls_each_get_their_own_output() {
    let h = std::sync::Arc::new(Harness::default().await);
    let mut tasks = Vec::new();
    for i in 0..24 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let r = h
                .ok(
                    "shell::exec",
                    json!({"command": "sh", "args": ["-c", "echo $1; echo err$1 >&2", "sh", i.to_string()]}),
                )
                .await;
            (i, r)
        }));
    }
    for t in tasks {
        let (i, r) = t.await.unwrap();
        assert_eq!(r["stdout"], format!("{i}\n"), "{r}");
        assert_eq!(r["stderr"], format!("err{i}\n"), "{r}");
        assert_eq!(r["exit_code"], 0);
    }
}

#[tokio::test]
async fn a_low_open_files_limit_does_not_cost_the_command_its_descriptors() {
    for limit in [5u64, 6] {
        let mut config = Config::builtin_default();
        config.confinement.rlimits.open_files = Some(limit);
        let h = Harness::new(config).await;
        h.ok("shell::exec", json!({"command": "true"})).await;
        two_waiting(&h).await;
        let r = h
            .ok(
                "shell::exec",
                json!({"command": "sh", "args": ["-c", "pwd; ulimit -n; cat"], "cwd": "/tmp", "stdin": "x"}),
            )
            .await;
        assert_eq!(r["exit_code"], 0, "open_files {limit}: {r}");
        assert_eq!(
            r["stdout"],
            format!("/tmp\n{limit}\nx"),
            "open_files {limit}"
        );
    }
}

#[tokio::test]
async fn a_signal_sent_to_a_waiting_process_does_not_reach_a_later_command() {
    // Only reachable without Landlock's signal scoping.
    let mut config = Config::builtin_default();
    config.confinement.landlock = false;
    let h = Harness::new(config).await;
    h.ok("shell::exec", json!({"command": "true"})).await;
    let waiting = two_waiting(&h).await;
    // The command itself runs in one of them: it signals the other.
    let pids: Vec<String> = waiting.iter().map(|p| p.to_string()).collect();
    let script = format!(
        "n=0; for p in {}; do [ $p != $$ ] && kill -TERM $p && n=$((n+1)); done; echo $n",
        pids.join(" ")
    );
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", script]}),
        )
        .await;
    assert_eq!(r["stdout"], "1\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    for _ in 0..3 {
        let r = h
            .ok(
                "shell::exec",
                json!({"command": "echo", "args": ["still here"]}),
            )
            .await;
        assert_eq!(
            r["exit_code"], 0,
            "a stale SIGTERM reached a later command: {r}"
        );
        assert_eq!(r["stdout"], "still here\n");
    }
}

#[tokio::test]
async fn waiting_processes_killed_from_outside_are_replaced_and_reaped() {
    let h = Harness::default().await;
    h.ok("shell::exec", json!({"command": "true"})).await;
    let waiting = two_waiting(&h).await;
    for &pid in &waiting {
        // SAFETY: kill(2) on processes this test just listed; no memory is passed.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    for i in 0..3 {
        let r = h
            .ok(
                "shell::exec",
                json!({"command": "echo", "args": [i.to_string()]}),
            )
            .await;
        assert_eq!(r["stdout"], format!("{i}\n"), "{r}");
    }
    let after = two_waiting(&h).await;
    assert!(after.is_disjoint(&waiting));
    assert!(
        eventually(Duration::from_secs(3), || waiting
            .iter()
            .all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()))
        .await,
        "killed waiting processes were not reaped: {:?}",
        zombies_of(h.executor_pid)
    );
}

#[tokio::test]
async fn a_command_handed_to_a_process_that_dies_before_taking_it_runs_anyway() {
    let h = std::sync::Arc::new(Harness::default().await);
    h.ok("shell::exec", json!({"command": "true"})).await;
    let waiting = two_waiting(&h).await;
    // Stopped, a waiting process still accepts the hand-over (its socket is open) but never
    // takes the command.
    for &pid in &waiting {
        // SAFETY: kill(2) on processes this test just listed; no memory is passed.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }
    let call = {
        let h = h.clone();
        tokio::spawn(async move {
            h.ok("shell::exec", json!({"command": "echo", "args": ["ran"]}))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!call.is_finished(), "the command cannot have run yet");
    for &pid in &waiting {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let r = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call finished")
        .unwrap();
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "ran\n", "{r}");
}

/// What the executor's descriptors point at, sorted ("fd->target").
fn fd_targets(pid: u32) -> Vec<String> {
    let mut targets: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let link = std::fs::read_link(e.path())
                        .map(|t| t.display().to_string())
                        .unwrap_or_default();
                    format!("{}->{link}", e.file_name().to_string_lossy())
                })
                .collect()
        })
        .unwrap_or_default();
    targets.sort();
    targets
}

/// The executor's descriptors, split: those that are not job cgroups (pipes, pidfds,
/// sockets: each belongs to one live command or waiting process), and the job cgroup
/// directories it holds open.
struct Held {
    others: usize,
    cgroups: BTreeSet<String>,
}

fn held_by(pid: u32) -> Held {
    let mut others = 0;
    let mut cgroups = BTreeSet::new();
    for t in fd_targets(pid) {
        let target = t.split_once("->").map_or("", |(_, t)| t);
        match target.split_once("/job-") {
            Some((base, job)) if base.starts_with("/sys/fs/cgroup") => {
                let job = job.split('/').next().unwrap_or(job);
                cgroups.insert(format!("{base}/job-{job}"));
            }
            _ => others += 1,
        }
    }
    Held { others, cgroups }
}

/// True when a cgroup has live processes in it.
fn populated(dir: &str) -> bool {
    std::fs::read_to_string(format!("{dir}/cgroup.events"))
        .is_ok_and(|e| e.lines().any(|l| l == "populated 1"))
}

/// How many emptied job cgroups the executor keeps for reuse (`POOL_MAX` in
/// `executor/src/tree.rs`).
const CGROUP_POOL: usize = 8;

#[tokio::test]
async fn calls_of_every_kind_leave_the_executor_holding_no_more_descriptors() {
    let h = Harness::default().await;
    h.ok("shell::exec", json!({"command": "true"})).await;
    two_waiting(&h).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = held_by(h.executor_pid);
    let before_targets = fd_targets(h.executor_pid);
    for _ in 0..5 {
        h.ok("shell::exec", json!({"command": "true"})).await;
        h.ok(
            "shell::exec",
            json!({"command": "cat", "stdin": "x", "cwd": "/tmp"}),
        )
        .await;
        let r = h
            .ok(
                "shell::exec",
                json!({"command": "sleep", "args": ["5"], "timeout_ms": 50}),
            )
            .await;
        assert_eq!(r["timed_out"], true, "{r}");
        let e = h
            .err("shell::exec", json!({"command": "/nonexistent/program"}))
            .await;
        assert!(e.to_string().contains("No such file"), "{e}");
        // A background child that keeps the output pipe open past the root's exit.
        let r = h
            .ok(
                "shell::exec",
                json!({"command": "sh", "args": ["-c", "sleep 0.2 & echo started"], "timeout_ms": 2000}),
            )
            .await;
        assert_eq!(r["stdout"], "started\n", "{r}");
    }
    // Every pipe, pidfd and socket a call used is gone. Job cgroups: the two waiting
    // processes' are populated; any other is an emptied one kept for reuse, at most
    // CGROUP_POOL of them (how many depends on how calls and releases interleaved).
    let settled = || {
        let now = held_by(h.executor_pid);
        let live = now.cgroups.iter().filter(|c| populated(c)).count();
        now.others <= before.others && live <= 2 && now.cgroups.len() <= 2 + CGROUP_POOL
    };
    assert!(
        eventually(Duration::from_secs(5), settled).await,
        "the executor held more after the calls\nbefore: {before_targets:?}\nafter:  {:?}",
        fd_targets(h.executor_pid)
    );
}

/// `confinement.job_limits.pids_max` binds a command a waiting process runs: the process
/// joined its job's cgroups (on a hybrid host, also the job's twin in the cgroup v1 `pids`
/// hierarchy) while it waited, before the call arrived. Bounded: the script starts at most
/// 40 processes whatever happens.
#[tokio::test]
async fn pids_max_binds_a_command_run_in_a_waiting_process() {
    use iii_shell_protocol::messages::Reply;
    let mut c = Config::builtin_default();
    c.confinement.job_limits.pids_max = Some(20);
    let h = Harness::new(c).await;
    h.ok("shell::exec", json!({"command": "true"})).await;
    let Reply::Doctor(report) = h.services.executor.call(Request::Doctor).await.unwrap() else {
        panic!("not a doctor reply")
    };
    let line = &report
        .commands
        .process_limits
        .iter()
        .find(|(k, _)| k == "pids.max")
        .expect("a pids.max line")
        .1;
    if !line.starts_with("enforced: ") {
        eprintln!("OUTCOME pids_max_not_enforceable_on_this_host: doctor says pids.max {line}");
        assert!(
            std::env::var_os("III_SHELL_REQUIRE_PIDS_MAX").is_none(),
            "III_SHELL_REQUIRE_PIDS_MAX is set but this host cannot enforce pids.max: {line}"
        );
        return;
    }
    // The doctor's probe command took a waiting process; the pool is topped up after it.
    let waiting = two_waiting(&h).await;
    let m = format!(
        "{}.{}",
        7000 + std::process::id() % 1000,
        std::process::id()
    );
    let needle = format!("sleep {m}");
    let script = format!("echo $$; for i in $(seq 40); do sleep {m} & done 2>/dev/null; sleep 3");
    let (r, n) = tokio::join!(
        h.ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", script], "timeout_ms": 5000})
        ),
        async {
            assert!(
                eventually(Duration::from_secs(10), || !procs_with(&needle).is_empty()).await,
                "the command never started"
            );
            tokio::time::sleep(Duration::from_millis(700)).await;
            let n = procs_with(&needle).len();
            for p in procs_with(&needle) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            n
        }
    );
    let pid: i32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(
        waiting.contains(&pid),
        "the command ran as pid {pid}, not in one of the waiting processes {waiting:?}"
    );
    assert!(n <= 20, "{n} processes ran in a command limited to 20");
}

/// `shell::exec_bg` starts its command the way `shell::exec` does: in a waiting process, in
/// its own session and job cgroup, with the call's stdin and cwd, and the pool is topped up.
#[tokio::test]
async fn a_background_job_runs_in_a_waiting_process() {
    let h = Harness::default().await;
    h.ok("shell::exec", json!({"command": "true"})).await;
    let waiting = two_waiting(&h).await;
    let r = h
        .ok(
            "shell::exec_bg",
            json!({"command": "sh", "args": ["-c", "echo $$; cut -d' ' -f6 /proc/self/stat; grep -c '^0::.*/job-' /proc/self/cgroup; pwd; cat"], "cwd": "/tmp", "stdin": "in"}),
        )
        .await;
    let id = r["job_id"].as_str().expect("a job id").to_string();
    let job = job_done(&h, &id).await;
    assert_eq!(job["exit_code"], 0, "{job}");
    let out = job["stdout"].as_str().unwrap_or_default();
    let lines: Vec<&str> = out.lines().collect();
    let pid: i32 = lines[0].parse().unwrap();
    assert!(
        waiting.contains(&pid),
        "the job ran as pid {pid}, not in one of the waiting processes {waiting:?}"
    );
    assert_eq!(lines[1], lines[0], "its own session");
    assert_eq!(lines[2], "1", "in a job cgroup: {out}");
    assert_eq!(lines[3], "/tmp");
    assert_eq!(lines[4], "in");
    two_waiting(&h).await;
}

/// A background job whose program cannot be executed is still the call's error, with the
/// message a spawn from scratch gives, and no job is listed for it.
#[tokio::test]
async fn a_background_exec_failure_is_the_calls_error_as_without_prestart() {
    let dir = tempdir();
    let prog = dir.path().join("not-a-program");
    std::fs::write(&prog, b"\x00\x01\x02\x03 not an executable format").unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let payload = json!({"command": prog.to_str().unwrap(), "args": []});

    let warm = Harness::default().await;
    warm.ok("shell::exec", json!({"command": "true"})).await;
    two_waiting(&warm).await;
    let a = warm.err("shell::exec_bg", payload.clone()).await;
    let listed = warm.ok("shell::list", json!({})).await;

    let cold = Harness::with_args(Config::builtin_default(), &["--no-prestart"]).await;
    let b = cold.err("shell::exec_bg", payload).await;

    assert_eq!((a.code, &a.message), (b.code, &b.message));
    assert!(
        a.message.contains("Exec format error (os error 8)"),
        "{}",
        a.message
    );
    assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(0), "{listed}");
    // The failed process was reaped, and the pool is topped up again.
    assert!(
        eventually(Duration::from_secs(5), || zombies_of(warm.executor_pid)
            .is_empty())
        .await,
        "zombies: {:?}",
        zombies_of(warm.executor_pid)
    );
    two_waiting(&warm).await;
}

/// A background job handed to a waiting process that dies before taking it starts anyway,
/// the ordinary way.
#[tokio::test]
async fn a_background_job_handed_to_a_process_that_dies_first_runs_anyway() {
    let h = std::sync::Arc::new(Harness::default().await);
    h.ok("shell::exec", json!({"command": "true"})).await;
    let waiting = two_waiting(&h).await;
    for &pid in &waiting {
        // SAFETY: kill(2) on processes this test just listed; no memory is passed.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }
    let call = {
        let h = h.clone();
        tokio::spawn(async move {
            h.ok(
                "shell::exec_bg",
                json!({"command": "echo", "args": ["ran"]}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !call.is_finished(),
        "the call waits for the exec to be confirmed"
    );
    for &pid in &waiting {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let r = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call finished")
        .unwrap();
    let id = r["job_id"].as_str().expect("a job id").to_string();
    let job = job_done(&h, &id).await;
    assert_eq!(job["exit_code"], 0, "{job}");
    assert_eq!(job["stdout"], "ran\n", "{job}");
}

/// A waiting process stopped before it takes a background job (a same-uid process can do
/// that) holds the call up for the confirmation bound at most, never for good: the job is
/// then taken as started, and runs once the process is continued.
#[tokio::test]
async fn a_background_job_handed_to_a_stopped_process_returns_within_the_bound() {
    let h = std::sync::Arc::new(Harness::default().await);
    h.ok("shell::exec", json!({"command": "true"})).await;
    let waiting = two_waiting(&h).await;
    for &pid in &waiting {
        // SAFETY: kill(2) on processes this test just listed; no memory is passed.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }
    let t = std::time::Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(15),
        h.ok(
            "shell::exec_bg",
            json!({"command": "echo", "args": ["ran late"]}),
        ),
    )
    .await
    .expect("the call returned within the confirmation bound");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_secs(4),
        "it waited for the exec: {took:?}"
    );
    let id = r["job_id"].as_str().expect("a job id").to_string();
    for &pid in &waiting {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
    let job = job_done(&h, &id).await;
    assert_eq!(job["exit_code"], 0, "{job}");
    assert_eq!(job["stdout"], "ran late\n", "{job}");
}
