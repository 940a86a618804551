//! The life and death of the processes behind `iii-shell serve`: an executor
//! killed with SIGKILL leaves nothing running and its jobs keep an honest record, a clean
//! SIGTERM is quiet, and the broker's configuration never reaches its command line.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use iii_test_engine::TestEngine;
use nix::sys::signal::Signal;
use serde_json::json;

fn sigkill(pid: i32) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
}

/// Pid of the broker: the worker's child started as `broker`.
fn broker_pid(w: &Worker) -> Option<i32> {
    children_of(w.pid)
        .into_iter()
        .find(|p| cmdline(*p).is_some_and(|c| c.contains(" broker ")))
}

/// An executor killed with SIGKILL, with a foreground call in flight and a background job
/// whose tree holds a plain child and a setsid daemon (closed output): everything it started
/// is dead by the time the next executor serves, and the job answers `shell::status` with
/// `killed` and a note naming the restart, not S211.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_executor_leaves_nothing_running_and_its_jobs_stay_known() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = Arc::new(engine.client().await);
    let first = w.wait_executor(None).await;

    let (child, daemon, fg) = (w.marker(600), w.marker(600), w.marker(600));
    let script = format!(
        "setsid sleep {daemon} </dev/null >/dev/null 2>&1 & sleep {child} & echo started; wait"
    );
    let r = caller
        .call(
            "shell::exec_bg",
            json!({"command": "sh", "args": ["-c", script]}),
        )
        .await
        .unwrap();
    let job_id = r["job_id"].as_str().expect("job id").to_string();
    // A job that finished before the crash keeps its own outcome.
    let done = caller
        .call(
            "shell::exec_bg",
            json!({"command": "sh", "args": ["-c", "exit 5"]}),
        )
        .await
        .unwrap();
    let done_id = done["job_id"].as_str().unwrap().to_string();
    assert!(
        eventually(WAIT, || {
            // `sh -c` carries both markers in its own command line too.
            procs_with(&format!("sleep {child}")).len() >= 2
                && procs_with(&format!("sleep {daemon}")).len() >= 2
        })
        .await,
        "the job's tree never started; stderr:\n{}",
        w.stderr()
    );
    let call = {
        let caller = caller.clone();
        let fg = fg.clone();
        tokio::spawn(async move {
            caller
                .call("shell::exec", json!({"command": "sleep", "args": [fg]}))
                .await
        })
    };
    assert!(
        eventually(WAIT, || !procs_with(&format!("sleep {fg}")).is_empty()).await,
        "{}",
        w.stderr()
    );
    let st = caller
        .call("shell::status", json!({"job_id": done_id}))
        .await
        .unwrap();
    assert_eq!(st["job"]["status"], "finished", "{st}");

    sigkill(first);
    let r = tokio::time::timeout(WAIT, call)
        .await
        .expect("answered")
        .unwrap();
    assert_code(&r, "S216");

    let second = w.wait_executor(Some(first)).await;
    assert_ne!(first, second);
    // The supervisor kills what the dead executor owned before it starts the next one.
    for m in [&child, &daemon, &fg] {
        assert!(
            procs_with(&format!("sleep {m}")).is_empty(),
            "'sleep {m}' outlived its executor: {:?}; stderr:\n{}",
            procs_with(m),
            w.stderr()
        );
    }

    // The job records survive: killed, with a reason naming the restart.
    assert!(
        eventually(WAIT, || w.log_lines("executor running").len() >= 2).await,
        "{}",
        w.stderr()
    );
    let st = caller
        .call("shell::status", json!({"job_id": job_id}))
        .await
        .unwrap_or_else(|e| panic!("status of a job of the dead executor: {e:?}"));
    let job = &st["job"];
    assert_eq!(job["status"], "killed", "{st}");
    assert_eq!(job["exit_code"], serde_json::Value::Null, "{st}");
    assert!(job["finished_at_ms"].is_u64(), "{st}");
    assert!(
        job["stderr"]
            .as_str()
            .is_some_and(|s| s.contains("executor restarted")),
        "{st}"
    );
    let st = caller
        .call("shell::status", json!({"job_id": done_id}))
        .await
        .unwrap();
    assert_eq!(st["job"]["status"], "finished", "{st}");
    assert_eq!(st["job"]["exit_code"], 5, "{st}");

    // `list` stays consistent with `status`, and `kill` answers like for any ended job.
    let list = caller.call("shell::list", json!({})).await.unwrap();
    let entry = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == job_id.as_str())
        .unwrap_or_else(|| panic!("the job is missing from shell::list: {list}"));
    assert_eq!(entry["status"], "killed", "{list}");
    assert_eq!(list["count"], list["jobs"].as_array().unwrap().len());
    let k = caller
        .call("shell::kill", json!({"job_id": job_id}))
        .await
        .unwrap();
    assert_eq!(k["killed"], false, "{k}");
    assert_eq!(k["status"], "killed", "{k}");

    // The new executor serves.
    let r = caller
        .call("shell::exec", json!({"command": "echo", "args": ["again"]}))
        .await
        .unwrap();
    assert_eq!(r["stdout"], "again\n");
}

/// A clean SIGTERM: no ERROR line, no new executor, exit 0, and the job it was running is
/// gone. Once to the supervisor alone, once to the whole group (as systemd does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_sigterm_logs_no_error_and_starts_no_executor() {
    for whole_group in [false, true] {
        let engine = TestEngine::start().await;
        let mut w = start_ready(&engine).await;
        let caller = engine.client().await;
        let executor = w.wait_executor(None).await;
        let m = w.marker(600);
        caller
            .call(
                "shell::exec_bg",
                json!({"command": "sleep", "args": [m.clone()]}),
            )
            .await
            .unwrap();
        assert!(eventually(WAIT, || !procs_with(&format!("sleep {m}")).is_empty()).await);
        if whole_group {
            for p in [Some(executor), broker_pid(&w)].into_iter().flatten() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), Signal::SIGTERM);
            }
        }
        w.signal(Signal::SIGTERM);
        let status = w
            .wait_exit(Duration::from_secs(15))
            .await
            .unwrap_or_else(|| panic!("still running; stderr:\n{}", w.stderr()));
        let log = w.stderr();
        assert_eq!(status.code(), Some(0), "{status:?}; stderr:\n{log}");
        assert!(
            w.log_lines("ERROR").is_empty(),
            "whole group {whole_group}: a clean SIGTERM logged an ERROR:\n{log}"
        );
        assert_eq!(
            w.log_lines("executor hardened").len(),
            1,
            "whole group {whole_group}: a new executor was started during shutdown:\n{log}"
        );
        assert!(procs_with(&format!("sleep {m}")).is_empty(), "{log}");
    }
}

/// The broker's configuration (and the engine URL) reach it through an inherited
/// descriptor: `/proc/<broker>/cmdline`, which every local user can read, holds neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_brokers_configuration_is_not_on_its_command_line() {
    let engine = TestEngine::start().await;
    let root = tempfile::tempdir().unwrap();
    let secret_root = root.path().join("jail-root-7f3e9a");
    std::fs::create_dir(&secret_root).unwrap();
    let w = Worker::builder()
        .engine(&engine)
        .seed(&jailed(&secret_root))
        .start();
    wait_ready(&engine, &w).await;
    let caller = engine.client().await;
    // The seed arrived: commands run jailed in the root.
    let r = caller.call("shell::exec", pwd_in(".")).await.unwrap();
    assert!(
        r["stdout"].as_str().unwrap().contains("jail-root-7f3e9a"),
        "{r}"
    );
    let broker = broker_pid(&w).expect("the broker process");
    let raw = std::fs::read(format!("/proc/{broker}/cmdline")).unwrap();
    let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
    assert!(cmd.contains("broker"), "{cmd}");
    assert!(
        !cmd.contains("jail-root-7f3e9a") && !cmd.contains("host_roots"),
        "the configuration is on the broker's command line: {cmd}"
    );
    assert!(!cmd.contains(&engine.url()), "the URL is on it: {cmd}");
}

/// A respawned executor starts commands with clone3 into their cgroup, like the first one:
/// the supervisor's seccomp filter, which every later executor inherits, must not take clone3
/// away from it (before, the respawned executor found it ENOSYS and fell back to writing
/// `cgroup.procs`, about 5x slower on spaced calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_respawned_executor_keeps_clone3() {
    const DISABLED: &str = "clone3(CLONE_INTO_CGROUP) disabled";
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = engine.client().await;
    let first = w.wait_executor(None).await;
    let r = caller
        .call("shell::exec", json!({"command": "true"}))
        .await
        .unwrap();
    assert_eq!(r["exit_code"], 0);
    if !job_cgroups_enabled(first as u32) || !w.log_lines(DISABLED).is_empty() {
        iii_shell_confine::requirement::unmet(
            "the first executor has no clone3 into job cgroups here",
        );
        return;
    }
    sigkill(first);
    assert!(
        eventually(WAIT, || w.log_lines("executor running").len() >= 2).await,
        "{}",
        w.stderr()
    );
    // The pid the broker was handed (a child of the supervisor carrying "executor --fd" may
    // also be one of the dead executor's pre-started processes, about to be killed).
    let second: i32 = w.log_lines("executor running")[1]
        .rsplit("pid=")
        .next()
        .and_then(|p| p.trim().parse().ok())
        .expect("the new executor's pid");
    for _ in 0..3 {
        let r = caller
            .call("shell::exec", json!({"command": "true"}))
            .await
            .unwrap();
        assert_eq!(r["exit_code"], 0);
    }
    assert!(
        job_cgroups_enabled(second as u32),
        "{second}: {:?} {}",
        std::fs::read_to_string(format!("/proc/{second}/cgroup")),
        w.stderr()
    );
    assert!(
        w.log_lines(DISABLED).is_empty(),
        "the respawned executor lost clone3:\n{}",
        w.stderr()
    );
    // Nor its private devpts instance: the supervisor's filter must let its unshare through.
    assert!(
        w.log_lines("no private devpts instance").is_empty(),
        "the respawned executor lost the commands' private devpts:\n{}",
        w.stderr()
    );
}

/// An executor stopped with SIGSTOP holds no caller past its deadline: a command gets S216
/// within its own timeout plus the margin, a call without a timeout within the fixed bound,
/// and once the executor is continued the worker serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_executor_answers_every_caller_by_the_deadline() {
    use iii_shell_broker::call_deadline::CallBounds;
    let bounds = CallBounds {
        fixed: Duration::from_millis(1500),
        margin: Duration::from_millis(1000),
    };
    let h = Arc::new(
        Harness::with_call_bounds(
            iii_shell_protocol::config::Config::builtin_default(),
            bounds,
        )
        .await,
    );
    let before = h
        .ok("shell::exec", json!({"command": "echo", "args": ["up"]}))
        .await;
    assert_eq!(before["stdout"], "up\n");
    let pid = nix::unistd::Pid::from_raw(h.executor_pid as i32);
    nix::sys::signal::kill(pid, Signal::SIGSTOP).unwrap();

    let started = std::time::Instant::now();
    let calls = [
        (
            "shell::exec",
            json!({"command": "echo", "args": ["x"], "timeout_ms": 500}),
            1500,
        ),
        ("shell::fs::stat", json!({"path": "/"}), 1500),
        ("shell::list", json!({}), 1500),
        (
            "shell::exec",
            json!({"command": "echo", "args": ["y"], "timeout_ms": 2000}),
            3000,
        ),
    ];
    let waits: Vec<_> = calls
        .into_iter()
        .map(|(f, payload, bound_ms)| {
            let h = h.clone();
            tokio::spawn(async move {
                let e = h.err(f, payload).await;
                (f, bound_ms, e, started.elapsed())
            })
        })
        .collect();
    for w in waits {
        let (f, bound_ms, e, took) = w.await.unwrap();
        assert_eq!(e.code.as_str(), "S216", "{f}: {e:?}");
        assert!(
            e.message.starts_with("the executor did not answer this "),
            "{f}: {}",
            e.message
        );
        assert!(
            e.message.contains(&format!("within {bound_ms} ms")),
            "{f}: {}",
            e.message
        );
        assert!(
            took >= Duration::from_millis(bound_ms)
                && took < Duration::from_millis(bound_ms + 1500),
            "{f}: answered after {took:?}, its deadline is {bound_ms} ms"
        );
    }

    nix::sys::signal::kill(pid, Signal::SIGCONT).unwrap();
    let after = h
        .ok("shell::exec", json!({"command": "echo", "args": ["again"]}))
        .await;
    assert_eq!(after["stdout"], "again\n");
    let st = h.ok("shell::fs::stat", json!({"path": "/"})).await;
    assert!(st.is_object(), "{st}");
}

/// Calls made in a stream while the executor is SIGKILLed, so that some arrive as it dies
/// and some while the supervisor waits before starting the next one: every one is answered,
/// and those made after it died are served by the next one instead of failing at once. A
/// call that may have reached the executor before it died may fail with S216 (it may have
/// run); nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_during_an_executor_restart_wait_for_the_next_executor() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let caller = Arc::new(engine.client().await);
    let first = w.wait_executor(None).await;
    let mut calls = Vec::new();
    for i in 0..40 {
        if i == 5 {
            sigkill(first);
        }
        let c = caller.clone();
        calls.push(tokio::spawn(async move {
            c.call(
                "shell::exec",
                json!({"command": "echo", "args": [format!("n{i}")]}),
            )
            .await
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut served_after = 0;
    for (i, call) in calls.into_iter().enumerate() {
        let r = tokio::time::timeout(Duration::from_secs(60), call)
            .await
            .unwrap_or_else(|_| panic!("call {i} was never answered; stderr:\n{}", w.stderr()))
            .unwrap();
        match r {
            Ok(v) => {
                assert_eq!(v["stdout"], format!("n{i}\n"), "{v}");
                if i >= 10 {
                    served_after += 1;
                }
            }
            Err(e) => {
                // Only a call that can have reached the executor before it died.
                assert!(
                    i < 10,
                    "call {i}, made after the executor died, failed: {e:?}; stderr:\n{}",
                    w.stderr()
                );
                assert_eq!(e.code, "S216", "{e:?}");
            }
        }
    }
    assert_eq!(served_after, 30);
    assert_ne!(w.wait_executor(Some(first)).await, first);
}

/// After the executor has run for the documented healthy time, its death costs the first
/// wait again, however many executors died before (the wait had stuck at 5 s after five
/// deaths in the worker's life).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_respawn_wait_resets_after_a_healthy_run() {
    let engine = TestEngine::start().await;
    let w = start_ready(&engine).await;
    let mut pid = w.wait_executor(None).await;
    // Six quick deaths: 100, 200, 400, 800, 1600, 3200 ms.
    for _ in 0..6 {
        sigkill(pid);
        pid = w.wait_executor(Some(pid)).await;
    }
    let killed = |w: &Worker| w.log_lines("the executor was killed");
    assert!(
        eventually(WAIT, || killed(&w).len() == 6).await,
        "{}",
        w.stderr()
    );
    assert!(
        killed(&w)[5].trim_end().ends_with("delay_ms=3200"),
        "{:?}",
        killed(&w)
    );
    tokio::time::sleep(iii_shell::respawn_backoff::HEALTHY_RUN + Duration::from_millis(500)).await;
    sigkill(pid);
    w.wait_executor(Some(pid)).await;
    assert!(
        eventually(WAIT, || killed(&w).len() == 7).await,
        "{}",
        w.stderr()
    );
    let last = &killed(&w)[6];
    assert!(last.trim_end().ends_with("delay_ms=100"), "{last}");
}

/// A broker that dies (SIGKILL) takes its executor, jobs and terminals with it, and
/// `serve` starts a new pair by itself: the worker connects again and serves, with no job
/// process left behind and no help from its launcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_broker_is_replaced_with_a_new_pair() {
    let engine = TestEngine::start().await;
    let mut w = start_ready(&engine).await;
    let caller = engine.client().await;
    let executor = w.wait_executor(None).await;
    let m = w.marker(600);
    caller
        .call(
            "shell::exec_bg",
            json!({"command": "sleep", "args": [m.clone()]}),
        )
        .await
        .unwrap();
    assert!(eventually(WAIT, || !procs_with(&format!("sleep {m}")).is_empty()).await);
    let broker = broker_pid(&w).expect("a broker");
    sigkill(broker);
    assert!(
        eventually(WAIT, || broker_pid(&w).is_some_and(|b| b != broker)).await,
        "no new broker; stderr:\n{}",
        w.stderr()
    );
    assert!(w.try_exit().is_none(), "serve exited: {}", w.stderr());
    let second = w.wait_executor(Some(executor)).await;
    assert_ne!(second, executor);
    assert!(
        procs_with(&format!("sleep {m}")).is_empty(),
        "the dead broker's job outlived it"
    );
    assert_eq!(w.log_lines("the broker died").len(), 1, "{}", w.stderr());
    // The new broker registers again and serves.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        match caller
            .call("shell::exec", json!({"command": "echo", "args": ["back"]}))
            .await
        {
            Ok(v) => {
                assert_eq!(v["stdout"], "back\n");
                break;
            }
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{e:?}; stderr:\n{}",
                    w.stderr()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    // A shutdown still ends the whole worker with status 0.
    w.signal(Signal::SIGTERM);
    let status = w.wait_exit(Duration::from_secs(20)).await.expect("exits");
    assert_eq!(status.code(), Some(0), "{}", w.stderr());
}
