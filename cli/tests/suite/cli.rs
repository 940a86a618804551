//! The `iii-shell` command line: `call`, `check-config`, `--version`, run as a real process.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const SHIPPED_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../config.yaml");

/// Runs `iii-shell ARGS` in `cwd` (a scratch directory, so no stray ./config.yaml is picked up).
fn run_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run iii-shell")
}

fn run(args: &[&str]) -> Output {
    let dir = tempdir();
    run_in(dir.path(), args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The JSON document `call` printed on stdout.
fn stdout_json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            text(&o.stdout),
            text(&o.stderr)
        )
    })
}

/// Asserts `call` failed with exactly `{code, message}` on stdout; returns (code, message).
fn call_error(o: &Output) -> (String, String) {
    assert!(
        !o.status.success(),
        "expected failure; stdout:\n{}",
        text(&o.stdout)
    );
    let v = stdout_json(o);
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["code", "message"], "{v}");
    (
        v["code"].as_str().unwrap().to_string(),
        v["message"].as_str().unwrap().to_string(),
    )
}

fn write_config(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, yaml).unwrap();
    p
}

#[test]
fn readme_call_prints_the_exec_result() {
    let o = run(&[
        "call",
        "shell::exec",
        r#"{"command":"echo","args":["hello"]}"#,
    ]);
    assert!(
        o.status.success(),
        "status {:?}; stdout:\n{}\nstderr:\n{}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    );
    let v = stdout_json(&o);
    assert_eq!(v["stdout"], "hello\n", "{v}");
    assert_eq!(
        (v["exit_code"].as_i64(), v["timed_out"].as_bool()),
        (Some(0), Some(false)),
        "{v}"
    );
    assert_eq!(o.status.code(), Some(0));

    // A function that takes no payload.
    let o = run(&["call", "shell::list"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(stdout_json(&o), json!({"count": 0, "jobs": []}));
}

#[test]
fn errors_print_code_and_message_and_exit_nonzero() {
    let o = run(&[
        "call",
        "shell::status",
        r#"{"job_id":"00000000-0000-4000-8000-000000000000"}"#,
    ]);
    let (code, message) = call_error(&o);
    assert_eq!(code, "S211");
    assert!(message.starts_with("no such job"), "{message}");

    let o = run(&["call", "shell::exec", r#"{"command":"rm -rf /"}"#]);
    let (code, message) = call_error(&o);
    assert_eq!(code, "invocation_failed");
    assert!(
        message.starts_with("command matches denylist: "),
        "{message}"
    );

    let o = run(&["call", "shell::exec", "{not json"]);
    let (code, message) = call_error(&o);
    assert_eq!(code, "S210");
    assert!(message.contains("malformed payload"), "{message}");

    let o = run(&["call", "shell::nope", "{}"]);
    assert_eq!(call_error(&o).0, "S210");
}

#[test]
fn call_honours_a_config_file() {
    let dir = tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    let jailed = write_config(
        dir.path(),
        "jailed.yaml",
        &format!("fs:\n  host_roots: [{}]\n", root.display()),
    );

    let cfg = jailed.to_str().unwrap();
    let o = run(&[
        "call",
        "--config",
        cfg,
        "shell::exec",
        r#"{"command":"pwd","cwd":".."}"#,
    ]);
    let (code, message) = call_error(&o);
    assert_eq!(code, "S215", "{message}");
    // The jail is in force, not just parsed: a relative cwd resolves under the root.
    let o = run(&[
        "call",
        "--config",
        cfg,
        "shell::exec",
        r#"{"command":"pwd","cwd":"sub"}"#,
    ]);
    assert!(o.status.success(), "{}", text(&o.stdout));
    assert_eq!(
        stdout_json(&o)["stdout"].as_str().map(str::trim),
        canon(&root.join("sub")).to_str()
    );
    // `--config=FILE` works as well.
    let o = run(&[
        "call",
        &format!("--config={cfg}"),
        "shell::exec",
        r#"{"command":"pwd","cwd":".."}"#,
    ]);
    assert_eq!(call_error(&o).0, "S215");
    // Without --config the built-in (unjailed) default applies, even with a config.yaml in cwd.
    std::fs::copy(&jailed, dir.path().join("config.yaml")).unwrap();
    let o = run_in(
        dir.path(),
        &["call", "shell::exec", r#"{"command":"pwd","cwd":"/"}"#],
    );
    assert!(o.status.success(), "{}", text(&o.stdout));
    assert_eq!(stdout_json(&o)["stdout"], "/\n");

    let allowlist = write_config(
        dir.path(),
        "allowlist.yaml",
        "allowlist: []\nfs:\n  allow_unjailed: true\n",
    );
    let o = run(&[
        "call",
        "--config",
        allowlist.to_str().unwrap(),
        "shell::exec",
        r#"{"command":"true"}"#,
    ]);
    let (_, message) = call_error(&o);
    assert!(
        message.contains("(removed in 0.8.0, no replacement)"),
        "{message}"
    );

    let inherit = write_config(
        dir.path(),
        "inherit.yaml",
        "inherit_env: true\nfs:\n  allow_unjailed: true\n",
    );
    let o = run(&[
        "call",
        "--config",
        inherit.to_str().unwrap(),
        "shell::exec",
        r#"{"command":"true"}"#,
    ]);
    let (_, message) = call_error(&o);
    assert!(
        message.contains("config keys removed in 0.7.0"),
        "{message}"
    );

    let missing = dir.path().join("missing.yaml");
    let o = run(&["call", "--config", missing.to_str().unwrap(), "shell::list"]);
    let (_, message) = call_error(&o);
    assert!(message.contains("missing.yaml"), "{message}");
}

#[test]
fn check_config() {
    let o = run(&["check-config", SHIPPED_CONFIG]);
    assert_eq!(o.status.code(), Some(0), "stderr:\n{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("ok"), "{}", text(&o.stdout));

    let dir = tempdir();
    let unjailed = write_config(dir.path(), "unjailed.yaml", "fs:\n  host_roots: []\n");
    let o = run(&["check-config", unjailed.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("refusing to start unjailed"),
        "{}",
        text(&o.stderr)
    );
    // The same with no fs block at all: the code default fails closed.
    let bare = write_config(dir.path(), "bare.yaml", "max_output_bytes: 1000\n");
    let o = run(&["check-config", bare.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("refusing to start unjailed"),
        "{}",
        text(&o.stderr)
    );

    let half = write_config(
        dir.path(),
        "half.yaml",
        "env:\n  inherit_env: true\nfs:\n  allow_unjailed: true\n",
    );
    let o = run(&["check-config", half.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("half-migration"),
        "{}",
        text(&o.stderr)
    );

    for (yaml, want) in [
        (
            "fs:\n  host_root: /srv\n  allow_unjailed: true\n",
            "`fs.host_root` -> `fs.host_roots`",
        ),
        (
            "code:\n  base_path: /srv\nfs:\n  allow_unjailed: true\n",
            "code.base_path",
        ),
        (
            "migrated_from_coder: true\nfs:\n  allow_unjailed: true\n",
            "migrated_from_coder",
        ),
        (
            "allowed_env: [PATH]\nfs:\n  allow_unjailed: true\n",
            "`allowed_env` -> `env.allow`",
        ),
        ("not_a_key: 1\nfs:\n  allow_unjailed: true\n", "not_a_key"),
    ] {
        let p = write_config(dir.path(), "removed.yaml", yaml);
        let o = run(&["check-config", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{yaml}");
        assert!(
            text(&o.stderr).contains(want),
            "{yaml}: {}",
            text(&o.stderr)
        );
    }

    // The root must exist: check-config opens it as the executor does.
    let root = dir.path().canonicalize().unwrap().display().to_string();
    let jailed = write_config(
        dir.path(),
        "jailed.yaml",
        &format!("fs:\n  host_roots: [{root}]\n"),
    );
    let o = run(&["check-config", jailed.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains(&format!("jailed to {root}")),
        "{}",
        text(&o.stdout)
    );

    let o = run(&[
        "check-config",
        dir.path().join("nope.yaml").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn version_flag() {
    let o = run(&["--version"]);
    assert!(o.status.success());
    assert_eq!(
        text(&o.stdout).trim(),
        format!("iii-shell {}", env!("CARGO_PKG_VERSION"))
    );
}

#[tokio::test]
async fn call_through_a_running_executor_keeps_jobs_between_calls() {
    // A `iii-shell executor --socket` shared by several `call --socket` invocations.
    let mut ex = SocketExecutor::start_default().await;
    let sock = ex.path.to_str().unwrap().to_string();
    let call = |args: &[&str]| {
        let mut v = vec!["call", "--socket", &sock];
        v.extend_from_slice(args);
        run(&v)
    };

    let o = call(&["shell::exec", r#"{"command":"echo","args":["via socket"]}"#]);
    assert!(
        o.status.success(),
        "{}\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    assert_eq!(stdout_json(&o)["stdout"], "via socket\n");

    let m = marker();
    let o = call(&[
        "shell::exec_bg",
        &json!({"command": "sh", "args": ["-c", format!("echo bg-out; sleep {m}")]}).to_string(),
    ]);
    assert!(
        o.status.success(),
        "{}\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let id = stdout_json(&o)["job_id"]
        .as_str()
        .expect("job_id")
        .to_string();

    // The job outlives the call that started it and is visible to later calls.
    let needle = format!("sleep {m}");
    assert!(eventually(Duration::from_secs(10), || !procs_with(&needle).is_empty()).await);
    let payload = json!({ "job_id": id }).to_string();
    let o = call(&["shell::status", &payload]);
    assert!(o.status.success(), "{}", text(&o.stdout));
    let job = stdout_json(&o)["job"].clone();
    assert_eq!(
        (job["id"].as_str(), job["status"].as_str()),
        (Some(id.as_str()), Some("running")),
        "{job}"
    );
    assert!(
        eventually(Duration::from_secs(5), || {
            let o = call(&["shell::status", &payload]);
            stdout_json(&o)["job"]["stdout"] == "bg-out\n"
        })
        .await
    );
    let o = call(&["shell::list"]);
    assert_eq!(stdout_json(&o)["count"], 1);

    let o = call(&["shell::kill", &payload]);
    assert_eq!(stdout_json(&o)["killed"], true, "{}", text(&o.stdout));
    assert!(
        eventually(Duration::from_secs(5), || procs_with(&needle).is_empty()).await,
        "job survived the kill"
    );
    let o = call(&["shell::status", &payload]);
    assert_eq!(stdout_json(&o)["job"]["status"], "killed");
    assert_eq!(
        ex.child.try_wait().unwrap(),
        None,
        "the executor outlives its callers"
    );

    // A socket nobody listens on is an error, not a hang.
    let o = run(&["call", "--socket", "/nonexistent/iii.sock", "shell::list"]);
    let (code, message) = call_error(&o);
    assert_eq!(code, "S216");
    assert!(message.contains("/nonexistent/iii.sock"), "{message}");
}

/// `check-config` resolves relative paths as the worker does and runs every check the
/// executor runs on a policy: a root that is missing or not a directory is refused here,
/// not discovered when the worker fails closed.
#[test]
fn check_config_resolves_relative_paths_and_runs_the_executors_checks() {
    let dir = tempdir();
    let cwd = dir.path().canonicalize().unwrap();
    let rel = write_config(
        &cwd,
        "rel.yaml",
        "fs:\n  allow_unjailed: true\nworking_dir: ./data\n",
    );
    std::fs::create_dir(cwd.join("data")).unwrap();
    let o = run_in(&cwd, &["check-config", "rel.yaml"]);
    assert_eq!(o.status.code(), Some(0), "stderr:\n{}", text(&o.stderr));
    let out = text(&o.stdout);
    let want = format!("working_dir     {}/data (written \"./data\"", cwd.display());
    assert!(out.contains(&want), "{out}");
    let want = format!("turns.data_dir  {}/data/shell/turns", cwd.display());
    assert!(out.contains(&want), "{out}");
    drop(rel);

    let file = cwd.join("plain-file");
    std::fs::write(&file, "x").unwrap();
    for (root, want) in [
        (
            cwd.join("missing").display().to_string(),
            "No such file or directory",
        ),
        (file.display().to_string(), "Not a directory"),
    ] {
        let p = write_config(
            &cwd,
            "roots.yaml",
            &format!("fs:\n  host_roots: [{root}]\n"),
        );
        let o = run_in(&cwd, &["check-config", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{root}: {}", text(&o.stdout));
        let err = text(&o.stderr);
        assert!(err.contains("the executor would refuse it"), "{err}");
        assert!(
            err.contains(&format!("fs.host_roots entry {root}")),
            "{err}"
        );
        assert!(err.contains(want), "{err}");
    }

    // Strict mode with a layer switched off is refused here as the executor refuses it.
    let p = write_config(
        &cwd,
        "strict.yaml",
        &format!(
            "fs:\n  host_roots: [{}]\nconfinement:\n  mode: strict\n  seccomp: false\n",
            cwd.display()
        ),
    );
    let o = run_in(&cwd, &["check-config", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    assert!(
        text(&o.stderr).contains("seccomp is disabled"),
        "{}",
        text(&o.stderr)
    );
}
