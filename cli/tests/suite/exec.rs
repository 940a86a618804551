//! `shell::exec` end to end: broker validation → executor process → real commands.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use iii_shell_policy::env_policy::{DANGEROUS_KEYS, DANGEROUS_PREFIXES};
use iii_shell_protocol::config::Config;
use serde_json::json;

#[tokio::test]
async fn echo_args_tokenizing_and_exit_codes() {
    let h = Harness::default().await;
    let r = h
        .ok("shell::exec", json!({"command": "echo", "args": ["hello"]}))
        .await;
    assert_eq!(r["stdout"], "hello\n");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["stdout_truncated"], false);
    assert!(r["duration_ms"].is_u64());
    for key in [
        "stdout",
        "stderr",
        "exit_code",
        "timed_out",
        "stdout_truncated",
        "stderr_truncated",
        "duration_ms",
    ] {
        assert!(r.get(key).is_some(), "missing {key} in {r}");
    }

    // args absent: shell-words tokenization; present (even empty): verbatim.
    let r = h
        .ok("shell::exec", json!({"command": "printf '%s|' 'a b' c"}))
        .await;
    assert_eq!(r["stdout"], "a b|c|");
    let e = h
        .err("shell::exec", json!({"command": "echo hi", "args": []}))
        .await;
    assert_eq!(e.code, "S216");
    assert!(
        e.message.contains("No such file or directory (os error 2)"),
        "{e:?}"
    );

    // A non-zero exit is a result, not an error; stderr is separate.
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", "echo out; echo err >&2; exit 7"]}),
        )
        .await;
    assert_eq!(
        (
            r["exit_code"].as_i64(),
            r["stdout"].as_str(),
            r["stderr"].as_str()
        ),
        (Some(7), Some("out\n"), Some("err\n"))
    );

    // Killed by a signal: exit_code null, not timed out.
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", "kill -9 $$"]}),
        )
        .await;
    assert_eq!(r["exit_code"], serde_json::Value::Null);
    assert_eq!(r["timed_out"], false);
}

/// GEN-06, ERR-03, EXEC-01: `command`/`args` of the wrong JSON type are a malformed payload
/// (S210) on exec and exec_bg alike; the argv parse errors stay plain messages.
#[tokio::test]
async fn argv_type_errors_are_s210_and_parse_errors_plain_messages() {
    let h = Harness::default().await;
    let malformed = [
        (json!({"command": 42}), "'command' must be a string"),
        (
            json!({"command": ["ls", "-l"]}),
            "'command' must be a string",
        ),
        (
            json!({"command": "ls", "args": "-l"}),
            "'args' must be an array of strings",
        ),
        (
            json!({"command": "ls", "args": ["-l", 3]}),
            "'args[1]' must be a string",
        ),
    ];
    for (payload, want) in malformed {
        for function in ["shell::exec", "shell::exec_bg"] {
            let e = h.err(function, payload.clone()).await;
            assert_eq!(e.code, "S210", "{function} {payload}: {e:?}");
            assert!(
                e.message.starts_with("malformed payload: ") && e.message.contains(want),
                "{function} {payload}: {e:?}"
            );
        }
    }
    let cases = [
        (json!({"command": "echo 'oops"}), "parse command"),
        (json!({"command": "echo", "args": ["a\u{0}b"]}), "NUL"),
    ];
    for (payload, want) in cases {
        let e = h.err("shell::exec", payload.clone()).await;
        assert_eq!(e.code, "invocation_failed", "{payload}: {e:?}");
        assert!(e.message.contains(want), "{payload}: {e:?}");
    }
    // A payload that does not deserialize otherwise is S210.
    let e = h
        .err("shell::exec", json!({"command": "ls", "stdin": 5}))
        .await;
    assert_eq!(e.code, "S210");
}

/// The seed's Errors table: an empty command is S210, and says so.
#[tokio::test]
async fn an_empty_command_is_s210() {
    let h = Harness::default().await;
    for function in ["shell::exec", "shell::exec_bg"] {
        for payload in [
            json!({"command": ""}),
            json!({"command": "  \t"}),
            json!({"command": "", "args": ["-l"]}),
            json!({"command": " ", "args": []}),
        ] {
            let e = h.err(function, payload.clone()).await;
            assert_eq!(e.code, "S210", "{function} {payload}: {e:?}");
            assert!(
                e.message.contains("empty command"),
                "{function} {payload}: {e:?}"
            );
        }
    }
}

#[tokio::test]
async fn stdin_env_and_base_env() {
    let h = Harness::default().await;
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "cat", "stdin": "piped ✓\n"}),
        )
        .await;
    assert_eq!(r["stdout"], "piped ✓\n");
    // Without stdin, stdin is /dev/null (cat exits at once).
    let r = h
        .ok("shell::exec", json!({"command": "cat", "timeout_ms": 5000}))
        .await;
    assert_eq!(
        (r["stdout"].as_str(), r["timed_out"].as_bool()),
        (Some(""), Some(false))
    );
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", "echo $NODE_ENV"], "env": {"NODE_ENV": "test"}}),
        )
        .await;
    assert_eq!(r["stdout"], "test\n");
    // The forwarded PATH still reaches children (inherit: true).
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", "echo $PATH"]}),
        )
        .await;
    assert_eq!(
        r["stdout"].as_str().map(str::trim),
        std::env::var("PATH").ok().as_deref()
    );

    // inherit: false forwards only env.allow: no other variable of the executor's environment
    // (this test process's, which the whole suite shares, so none is set here) gets through.
    let mut c = Config::builtin_default();
    c.env.inherit = false;
    c.env.allow = vec!["PATH".into(), "III_TEST_VISIBLE".into()];
    let h2 = Harness::new(c).await;
    let r = h2
        .ok("shell::exec", json!({"command": "env", "args": []}))
        .await;
    let out = r["stdout"].as_str().unwrap();
    assert!(out.contains("PATH="), "{out}");
    assert!(!out.contains("HOME="), "{out}");
    let ours: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
    assert!(
        ours.len() > 1,
        "this process has no variable but PATH: {ours:?}"
    );
    for k in ours.iter().filter(|k| *k != "PATH") {
        let line = format!("{k}=");
        assert!(
            !out.lines().any(|l| l.starts_with(&line)),
            "{k} forwarded: {out}"
        );
    }
}

#[tokio::test]
async fn every_dangerous_env_key_is_refused() {
    let h = Harness::default().await;
    let mut keys: Vec<String> = DANGEROUS_KEYS.iter().map(|s| s.to_string()).collect();
    keys.extend(DANGEROUS_PREFIXES.iter().map(|p| format!("{p}ANYTHING")));
    keys.extend(
        [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "LD_AUDIT",
            "DYLD_INSERT_LIBRARIES",
            "path",
            "Ld_Preload",
        ]
        .map(String::from),
    );
    for key in keys {
        let e = h
            .err(
                "shell::exec",
                json!({"command": "true", "env": {key.clone(): "x", "FINE": "1"}}),
            )
            .await;
        assert_eq!(e.code, "S210", "{key}");
        assert!(e.message.contains(&key), "{key}: {e:?}");
    }
    for bad in ["PATH=/tmp/evil", "1X", "A-B", ""] {
        let e = h
            .err("shell::exec", json!({"command": "true", "env": {bad: "x"}}))
            .await;
        assert_eq!(e.code, "S210", "{bad}");
    }
}

#[tokio::test]
async fn cwd_is_confined_like_fs_paths() {
    let dir = tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("file"), "x").unwrap();
    std::fs::create_dir_all(dir.path().join("outside")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside"), root.join("link-out")).unwrap();
    let mut c = jailed(&root);
    c.fs.denylist_paths
        .push(root.join("secret").to_string_lossy().into_owned());
    std::fs::create_dir_all(root.join("secret")).unwrap();
    let h = Harness::new(c).await;

    let r = h
        .ok("shell::exec", json!({"command": "pwd", "cwd": "sub"}))
        .await;
    assert_eq!(
        r["stdout"].as_str().unwrap().trim(),
        canon(&root.join("sub")).to_str().unwrap()
    );
    let abs = format!("{}//sub/.", root.display());
    let r = h
        .ok("shell::exec", json!({"command": "pwd", "cwd": abs}))
        .await;
    assert_eq!(
        r["stdout"].as_str().unwrap().trim(),
        canon(&root.join("sub")).to_str().unwrap()
    );

    for escape in [
        "..",
        "link-out",
        "sub/../../",
        "/etc",
        &format!("{}-evil", root.display()),
    ] {
        let e = h
            .err("shell::exec", json!({"command": "pwd", "cwd": escape}))
            .await;
        assert_eq!(e.code, "S215", "{escape}: {e:?}");
    }
    let missing = h
        .err("shell::exec", json!({"command": "pwd", "cwd": "nope"}))
        .await;
    assert_eq!(missing.code, "S211");
    let denied = h
        .err("shell::exec", json!({"command": "pwd", "cwd": "secret"}))
        .await;
    assert_eq!(denied.code, "S211");
    assert_eq!(
        denied.message.replace("secret", "X"),
        missing.message.replace("nope", "X")
    );
    let e = h
        .err("shell::exec", json!({"command": "pwd", "cwd": "file"}))
        .await;
    assert_eq!(e.code, "S210");

    // Unjailed: only absolute paths.
    let h = Harness::default().await;
    let e = h
        .err("shell::exec", json!({"command": "pwd", "cwd": "tmp"}))
        .await;
    assert_eq!(e.code, "S210");
    let e = h
        .err("shell::exec", json!({"command": "pwd", "cwd": "~/x"}))
        .await;
    assert_eq!(e.code, "S210");
    let r = h
        .ok("shell::exec", json!({"command": "pwd", "cwd": "/tmp"}))
        .await;
    assert_eq!(r["stdout"], "/tmp\n");
}

#[tokio::test]
async fn timeouts_clamp_default_and_zero() {
    let mut c = Config::builtin_default();
    c.max_timeout_ms = 400;
    c.default_timeout_ms = 300;
    let h = Harness::new(c).await;

    let t = Instant::now();
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sleep", "args": ["5"], "timeout_ms": 60000}),
        )
        .await;
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["exit_code"], serde_json::Value::Null);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(390) && took < Duration::from_secs(3),
        "{took:?}"
    );

    for fallback in [json!(-5), json!(2.5)] {
        let t = Instant::now();
        let r = h
            .ok(
                "shell::exec",
                json!({"command": "sleep", "args": ["5"], "timeout_ms": fallback}),
            )
            .await;
        assert_eq!(r["timed_out"], true);
        assert!(
            t.elapsed() >= Duration::from_millis(290),
            "{:?}",
            t.elapsed()
        );
    }

    let t = Instant::now();
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sleep", "args": ["5"], "timeout_ms": 0}),
        )
        .await;
    assert_eq!(r["timed_out"], true);
    assert!(t.elapsed() < Duration::from_millis(250));
}

#[tokio::test]
async fn timeout_kills_a_daemonizing_tree() {
    let h = Harness::default().await;
    let (a, b, c) = (marker(), marker(), marker());
    // A child that setsid()s away, a classic double-fork daemon with closed stdio, and the
    // foreground sleeper.
    let script = format!(
        "setsid sleep {a} & (setsid sh -c 'sleep {b}' </dev/null >/dev/null 2>&1 &) ; sleep {c}"
    );
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", script], "timeout_ms": 700}),
        )
        .await;
    assert_eq!(r["timed_out"], true);
    for m in [&a, &b, &c] {
        let gone = eventually(Duration::from_secs(3), || {
            procs_with(&format!("sleep {m}")).is_empty()
        })
        .await;
        assert!(
            gone,
            "process 'sleep {m}' survived the timeout: {:?}",
            procs_with(m)
        );
    }
    let pid = h.executor_pid;
    assert!(
        eventually(Duration::from_secs(3), || zombies_of(pid).is_empty()).await,
        "zombies: {:?}",
        zombies_of(pid)
    );
}

#[tokio::test]
async fn grandchild_holding_the_pipe_does_not_hang_the_call() {
    let h = Harness::default().await;
    let m = marker();
    let t = Instant::now();
    let script = format!("sleep {m} & echo started");
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", script], "timeout_ms": 800}),
        )
        .await;
    let took = t.elapsed();
    assert!(took < Duration::from_secs(3), "call hung for {took:?}");
    assert_eq!(r["stdout"], "started\n");
    // The root finished before the deadline: its exit code stands, even though the deadline
    // came while a grandchild still held the pipes.
    assert_eq!(r["timed_out"], false, "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(
        eventually(Duration::from_secs(3), || procs_with(&format!("sleep {m}"))
            .is_empty())
        .await
    );

    // A well-behaved daemon (stdio closed) does not hold the call: it returns at once.
    let m = marker();
    let t = Instant::now();
    let script = format!("sleep {m} </dev/null >/dev/null 2>&1 & echo ok");
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", script], "timeout_ms": 5000}),
        )
        .await;
    assert_eq!(
        (r["stdout"].as_str(), r["timed_out"].as_bool()),
        (Some("ok\n"), Some(false))
    );
    assert!(t.elapsed() < Duration::from_secs(2));
    for p in procs_with(&format!("sleep {m}")) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// `sh -c 'sleep 20 & echo done'` returns once the root has exited and the pipes
/// were drained for at most ROOT_EXIT_DRAIN (2 s), with the real exit code and the output
/// read so far, and the grandchild is killed as on a timeout.
#[tokio::test]
async fn a_finished_root_returns_though_a_grandchild_holds_its_pipes() {
    let h = Harness::default().await;
    let m = marker();
    let t = Instant::now();
    let script = format!("sleep {m} & echo done; echo late >&2; exit 3");
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", script], "timeout_ms": 20000}),
        )
        .await;
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(10),
        "the call took {took:?}: {r}"
    );
    assert_eq!(r["timed_out"], false, "{r}");
    assert_eq!(r["exit_code"], 3, "{r}");
    assert_eq!(r["stdout"], "done\n", "{r}");
    assert_eq!(r["stderr"], "late\n", "{r}");
    assert!(
        eventually(Duration::from_secs(3), || procs_with(&format!("sleep {m}"))
            .is_empty())
        .await,
        "the grandchild survived the call: {:?}",
        procs_with(&m)
    );
}

/// A daemon that closed its output and called setsid does not hold the call, and does not
/// outlive it either: `shell::exec_bg` is the way to leave something running.
#[tokio::test]
async fn a_setsid_daemon_does_not_outlive_its_exec_call() {
    let h = Harness::default().await;
    if !job_cgroups_enabled(h.executor_pid) {
        iii_shell_confine::requirement::unmet(
            "no job cgroups here, so a setsid daemon with closed output cannot be found",
        );
        return;
    }
    let m = marker();
    let script = format!("setsid sleep {m} </dev/null >/dev/null 2>&1 & echo ok");
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", script], "timeout_ms": 5000}),
        )
        .await;
    assert_eq!(r["stdout"], "ok\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(
        eventually(Duration::from_secs(3), || procs_with(&format!("sleep {m}"))
            .is_empty())
        .await,
        "the daemon survived the call: {:?}",
        procs_with(&m)
    );
}

#[tokio::test]
async fn output_caps_at_exactly_the_limit_and_on_char_boundaries() {
    let mut c = Config::builtin_default();
    c.max_output_bytes = 1000;
    let h = Harness::new(c).await;
    let gen = |n: usize, fd: u8| json!({"command": "sh", "args": ["-c", format!("head -c {n} /dev/zero | tr '\\0' a >&{fd}")]});

    let r = h.ok("shell::exec", gen(1000, 1)).await;
    assert_eq!(
        (
            r["stdout"].as_str().unwrap().len(),
            r["stdout_truncated"].as_bool()
        ),
        (1000, Some(false))
    );
    let r = h.ok("shell::exec", gen(1001, 1)).await;
    assert_eq!(
        (
            r["stdout"].as_str().unwrap().len(),
            r["stdout_truncated"].as_bool()
        ),
        (1000, Some(true))
    );
    let r = h.ok("shell::exec", gen(5_000_000, 2)).await;
    assert_eq!(
        (
            r["stderr"].as_str().unwrap().len(),
            r["stderr_truncated"].as_bool()
        ),
        (1000, Some(true))
    );
    assert_eq!(
        (r["stdout"].as_str(), r["stdout_truncated"].as_bool()),
        (Some(""), Some(false))
    );
    assert_eq!(r["exit_code"], 0, "the pipe kept draining past the cap");

    // 999 ASCII bytes then a 3-byte character: the cap splits it, so it is dropped whole.
    let script = "head -c 999 /dev/zero | tr '\\0' a; printf '\\342\\202\\254'";
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", script]}),
        )
        .await;
    let out = r["stdout"].as_str().unwrap();
    assert_eq!(
        (out.len(), r["stdout_truncated"].as_bool()),
        (999, Some(true))
    );
    // Invalid UTF-8 is converted lossily.
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "printf", "args": ["a\\377b"]}),
        )
        .await;
    assert_eq!(r["stdout"], "a\u{fffd}b");
}

#[tokio::test]
async fn denylist_wrappers_and_plain_message() {
    let h = Harness::default().await;
    let patterns = Config::builtin_default().denylist_patterns;
    for cmd in [
        "sudo shutdown -h now",
        "/sbin/reboot",
        "env A=1 timeout 5 mkfs.ext4 /dev/null",
        "nohup doas dd if=/dev/zero of=/dev/null",
        "timeout 3s /usr/bin/sudo /sbin/shutdown now",
        "rm -rf /",
        "cat /etc/shadow",
    ] {
        let e = h.err("shell::exec", json!({"command": cmd})).await;
        assert_eq!(e.code, "invocation_failed", "{cmd}");
        assert!(
            e.message.starts_with("command matches denylist: "),
            "{cmd}: {e:?}"
        );
        let pat = e.message.trim_start_matches("command matches denylist: ");
        assert!(patterns.iter().any(|p| p == pat), "{cmd}: {pat}");
    }
    // Not command-shaped: allowed.
    let r = h
        .ok(
            "shell::exec",
            json!({"command": "grep -rn shutdown /dev/null"}),
        )
        .await;
    assert_eq!(r["exit_code"], 1);
}

#[tokio::test]
async fn many_calls_in_flight_on_one_connection() {
    let h = Harness::default().await;
    let t = Instant::now();
    let calls = (0..8).map(|i| {
        h.call(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", format!("sleep 0.5; echo {i}")]}),
        )
    });
    let results = futures_util::future::join_all(calls).await;
    for (i, r) in results.into_iter().enumerate() {
        assert_eq!(r.unwrap()["stdout"], format!("{i}\n"));
    }
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "calls were serialised: {:?}",
        t.elapsed()
    );
}

/// What a command's environment holds through the real worker (`iii-shell serve`, whose own
/// environment has `RUST_LOG`, `III_URL` and systemd's service variables, with
/// `env.inherit: true`): none of the worker's own variables, and the agent-safe defaults for a
/// command nobody is at the keyboard of (`PAGER=cat`, `GIT_PAGER=cat`,
/// `GIT_TERMINAL_PROMPT=0`), for `shell::exec` and `shell::exec_bg` alike; a terminal session
/// gets the worker-only filter but not those defaults. A forwarded `PAGER` wins over the
/// default, and per-call `env` still cannot set one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_get_agent_safe_defaults_and_none_of_the_workers_own_variables() {
    use iii_test_engine::TestEngine;
    let engine = TestEngine::start().await;
    let worker_only = [
        ("INVOCATION_ID", "0123456789abcdef"),
        ("JOURNAL_STREAM", "0:0"),
        ("NOTIFY_SOCKET", "/nonexistent/notify"),
        ("STATE_DIRECTORY", "/var/lib/iii-shell"),
        ("III_SHELL_TEST_MARK", "x"),
    ];
    let mut b = Worker::builder()
        .engine(&engine)
        .seed(&Config::builtin_default())
        .env("III_TEST_ALLOWED_NOWHERE", "1")
        .env("KEPT_BY_INHERIT", "yes");
    for (k, v) in worker_only {
        b = b.env(k, v);
    }
    let w = b.start();
    wait_ready(&engine, &w).await;
    let caller = engine.client().await;
    let names = |out: &str| -> Vec<String> {
        out.lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_string()))
            .collect()
    };
    let r = caller
        .call("shell::exec", json!({"command": "env", "args": []}))
        .await
        .unwrap();
    let out = r["stdout"].as_str().unwrap().to_string();
    let keys = names(&out);
    for k in [
        "PAGER=cat",
        "GIT_PAGER=cat",
        "GIT_TERMINAL_PROMPT=0",
        "KEPT_BY_INHERIT=yes",
    ] {
        assert!(out.lines().any(|l| l == k), "{k} missing: {out}");
    }
    for k in ["RUST_LOG", "III_URL", "III_TEST_ALLOWED_NOWHERE"]
        .into_iter()
        .chain(worker_only.iter().map(|(k, _)| *k))
    {
        assert!(!keys.iter().any(|n| n == k), "{k} leaked: {out}");
    }
    // A background job: the same.
    let r = caller
        .call("shell::exec_bg", json!({"command": "env", "args": []}))
        .await
        .unwrap();
    let id = r["job_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + WAIT;
    let job = loop {
        let job = caller
            .call("shell::status", json!({"job_id": id}))
            .await
            .unwrap()["job"]
            .clone();
        if job["status"] != "running" {
            break job;
        }
        assert!(Instant::now() < deadline, "still running: {job}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let out = job["stdout"].as_str().unwrap();
    assert!(out.lines().any(|l| l == "PAGER=cat"), "{out}");
    assert!(!names(out).iter().any(|n| n == "RUST_LOG"), "{out}");
    // Per-call env still cannot set a pager; it can turn the prompt back on.
    let r = caller
        .call(
            "shell::exec",
            json!({"command": "env", "args": [], "env": {"PAGER": "less"}}),
        )
        .await;
    assert_code(&r, "S210");
    let r = caller
        .call(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", "echo $GIT_TERMINAL_PROMPT"], "env": {"GIT_TERMINAL_PROMPT": "1"}}),
        )
        .await
        .unwrap();
    assert_eq!(r["stdout"], "1\n");
}
