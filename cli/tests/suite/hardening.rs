//! Hardening end to end: `doctor`, the pinned envelope, strict mode.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::*;
use iii_shell_protocol::config::{Config, ConfinementMode};
use iii_shell_protocol::messages::Request;
use serde_json::Value;

#[test]
fn doctor_json_reports_every_layer() {
    let dir = tempdir();
    let out = Command::new(bin())
        .args(["doctor", "--json", "--config"])
        .arg(dir.path().join("none.yaml"))
        .output()
        .expect("run doctor");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON");
    let ex = &v["executor"];
    assert_eq!(ex["no_new_privs"], true, "{v}");
    assert_eq!(ex["seccomp_mode"], 2, "{v}");
    assert_eq!(ex["dumpable"], false, "{v}");
    assert_eq!(ex["subreaper"], true, "{v}");
    assert_eq!(ex["cap_effective"], serde_json::json!([]), "{v}");
    let cmds = &v["commands"];
    assert_eq!(cmds["mode"], "best_effort");
    assert!(cmds["landlock_abi"].as_i64().unwrap_or(0) >= 1, "{v}");
    assert!(
        cmds["seccomp_denied"]
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s == "SYS_ptrace")),
        "{v}"
    );
    // The hardened executor, under its own seccomp filter, started the probe command directly
    // inside its job cgroup: the filter lets exactly that clone3 through.
    if cmds["cgroups"] == true && cfg!(target_arch = "x86_64") {
        assert_eq!(cmds["cgroup_entry"], "clone3", "{v}");
        assert_eq!(cmds["prestart"], "on", "{v}");
    }
    let observed = cmds["observed"].to_string();
    assert!(
        observed.contains("NoNewPrivs: 1") && observed.contains("Seccomp: 2"),
        "{v}"
    );
    let broker = &v["broker"];
    assert_eq!(broker["no_new_privs"], true, "{v}");
    let checks = broker["checks"].to_string();
    assert!(
        !checks.contains("ALLOWED"),
        "the confined broker could still act: {checks}"
    );
    if is_root() {
        assert_ne!(broker["uid"], 0, "the broker must drop root: {v}");
        assert_eq!(broker["cap_bounding"], serde_json::json!([]), "{v}");
    } else {
        iii_shell_confine::requirement::unmet("the broker's privilege drop is asserted as root");
    }
}

#[test]
fn doctor_human_output_names_each_layer() {
    let out = Command::new(bin())
        .arg("doctor")
        .output()
        .expect("run doctor");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "broker (pid",
        "executor (pid",
        "no_new_privs",
        "seccomp",
        "landlock",
        "commands (mode",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

#[tokio::test]
async fn a_pinned_envelope_refuses_a_widening_policy() {
    let root = tempdir();
    let envelope = jailed(root.path());
    let (mut child, client, _d) = spawn_pinned(&envelope).await;
    let set = |c: &Config| Request::SetPolicy {
        generation: 1,
        config_json: serde_json::to_string(c).unwrap(),
    };

    // Within the envelope: accepted (a sub-directory root, one more denied path).
    std::fs::create_dir_all(root.path().join("sub")).unwrap();
    let mut narrower = jailed(&root.path().join("sub"));
    narrower.fs.denylist_paths.push("/srv/secret".into());
    client
        .call(set(&narrower))
        .await
        .expect("a narrower policy is accepted");

    // Wider: unjailed, another root, a lost denylist entry, special bits.
    let mut unjailed = Config::builtin_default();
    unjailed.fs.allow_unjailed = true;
    let mut other_root = jailed(std::path::Path::new("/tmp"));
    other_root.fs.host_roots = vec!["/tmp".into()];
    let mut lost = jailed(root.path());
    lost.fs.denylist_paths.clear();
    let mut bits = jailed(root.path());
    bits.fs.allow_special_bits = true;
    for wider in [unjailed, other_root, lost, bits] {
        let e = client
            .call(set(&wider))
            .await
            .expect_err("a widening policy is refused");
        assert_eq!(e.code, "S210");
        assert!(
            e.message.contains("pinned envelope forbids widening"),
            "{e:?}"
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test]
async fn an_envelope_file_others_may_write_is_refused() {
    let dir = tempdir();
    let pin = dir.path().join("envelope.yaml");
    std::fs::write(
        &pin,
        serde_norway::to_string(&Config::builtin_default()).unwrap(),
    )
    .unwrap();
    std::fs::set_permissions(&pin, std::fs::Permissions::from_mode(0o666)).unwrap();
    let status = Command::new(bin())
        .args(["executor", "--socket"])
        .arg(dir.path().join("x.sock"))
        .arg("--pin-config")
        .arg(&pin)
        .status()
        .unwrap();
    assert_eq!(
        status.code(),
        Some(2),
        "a world-writable envelope must be refused"
    );
}

/// Strict mode refuses an executor socket whose peer uid is the uid commands run as. An
/// executor that is not root can only run commands as itself, so it refuses at start; a
/// root one learns the command user from its first policy, and refuses a policy that runs
/// commands as root while root is the peer (it starts, and serves nothing).
#[tokio::test]
async fn strict_mode_refuses_a_named_socket_whose_peer_is_the_command_uid() {
    if !is_root() {
        panic!("this test needs root (it runs one executor as root and one as uid 4242)");
    }
    let dir = tempdir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let pin = dir.path().join("envelope.yaml");
    let mut c = Config::builtin_default();
    c.confinement.mode = ConfinementMode::Strict;
    std::fs::write(&pin, serde_norway::to_string(&c).unwrap()).unwrap();
    std::fs::set_permissions(&pin, std::fs::Permissions::from_mode(0o644)).unwrap();

    // Not root: known at start.
    let out = Command::new("setpriv")
        .args(["--reuid", "4242", "--regid", "4242", "--clear-groups"])
        .arg(bin())
        .args(["executor", "--socket"])
        .arg(dir.path().join("user.sock"))
        .arg("--pin-config")
        .arg(&pin)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("refusing to start in strict mode: the executor socket's peer uid equals the uid commands run as"),
        "{err}"
    );

    // Root: the first policy (unjailed, so commands run as root) is refused, and says why.
    let sock = dir.path().join("root.sock");
    let log = dir.path().join("root.log");
    let mut exec = Command::new(bin())
        .args(["executor", "--socket"])
        .arg(&sock)
        .arg("--pin-config")
        .arg(&pin)
        .env("NO_COLOR", "1")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let listening = eventually(std::time::Duration::from_secs(20), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("executor listening"))
    })
    .await;
    let cfg = dir.path().join("strict.yaml");
    std::fs::write(&cfg, serde_norway::to_string(&c).unwrap()).unwrap();
    let call = Command::new(bin())
        .args(["call", "--socket"])
        .arg(&sock)
        .arg("--config")
        .arg(&cfg)
        .args(["shell::exec", r#"{"command":"true"}"#])
        .output()
        .unwrap();
    let _ = exec.kill();
    let _ = exec.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(listening, "{text}");
    let v: Value = serde_json::from_slice(&call.stdout).unwrap();
    assert_eq!(v["code"], "S210", "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("strict mode refuses this policy: the executor socket's peer uid equals the uid commands run as"),
        "{v}"
    );
    // The executor's own log says so too, and only once it knew (not at start).
    assert!(
        text.contains("policy refused") && !text.contains("WARN iii_shell::cmd_executor"),
        "{text}"
    );
}

#[tokio::test]
async fn strict_mode_refuses_a_policy_without_seccomp() {
    let h = Harness::default().await;
    let mut c = Config::builtin_default();
    c.confinement.mode = ConfinementMode::Strict;
    c.confinement.seccomp = false;
    let e = h
        .services
        .executor
        .call(Request::SetPolicy {
            generation: 9,
            config_json: serde_json::to_string(&c).unwrap(),
        })
        .await
        .expect_err("strict without seccomp must be refused");
    assert!(
        e.message.contains("strict confinement cannot be met"),
        "{e:?}"
    );
    // best_effort accepts the same thing.
    c.confinement.mode = ConfinementMode::BestEffort;
    h.services
        .executor
        .call(Request::SetPolicy {
            generation: 10,
            config_json: serde_json::to_string(&c).unwrap(),
        })
        .await
        .expect("best_effort accepts it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_a_pinned_envelope_rejects_a_widening_reload() {
    use std::time::Duration;
    let engine = iii_test_engine::TestEngine::start().await;
    let root = tempdir();
    let jail = jailed(root.path());
    let pin = root.path().join("envelope.yaml");
    std::fs::write(&pin, serde_norway::to_string(&jail).unwrap()).unwrap();
    std::fs::set_permissions(&pin, std::fs::Permissions::from_mode(0o644)).unwrap();
    engine.config_seed("shell", serde_json::to_value(&jail).unwrap());
    let mut worker = Command::new(bin())
        .arg("--pin-config")
        .arg(&pin)
        .arg("--config")
        .arg(root.path().join("none.yaml"))
        .env("III_URL", engine.url())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(engine
        .wait_for_function("shell::config-status", Duration::from_secs(20))
        .await
        .is_some());
    assert!(
        engine
            .wait_until(Duration::from_secs(10), |e| !e.triggers().is_empty())
            .await,
        "the configuration trigger was never bound"
    );
    let client = engine.client().await;

    let mut wider = jail.clone();
    wider.fs.host_roots.clear();
    wider.fs.allow_unjailed = true;
    engine
        .config_set("shell", serde_json::to_value(&wider).unwrap())
        .await;
    let status = client
        .call("shell::config-status", serde_json::json!({}))
        .await
        .unwrap();
    assert_eq!(status["last_outcome"], "rejected", "{status}");
    assert!(
        status["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("pinned envelope forbids widening"),
        "{status}"
    );
    // The jail is still in force.
    let e = client
        .call(
            "shell::exec",
            serde_json::json!({"command": "pwd", "cwd": "/"}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, "S215");
    let _ = worker.kill();
    let _ = worker.wait();
}

/// `doctor` says which configuration id the worker would use and where relative paths
/// resolve.
#[test]
fn doctor_shows_the_config_id_and_the_resolved_paths() {
    let dir = tempdir();
    let cwd = dir.path().canonicalize().unwrap();
    std::fs::write(
        cwd.join("rel.yaml"),
        "fs:\n  allow_unjailed: true\nworking_dir: ./data\n",
    )
    .unwrap();
    std::fs::create_dir(cwd.join("data")).unwrap();
    let out = Command::new(bin())
        .args(["doctor", "--json", "--config", "rel.yaml"])
        .current_dir(&cwd)
        .env("III_NAMESPACE", "host-b")
        .output()
        .expect("run doctor");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON");
    let c = &v["configuration"];
    assert_eq!(c["config_id"], "shell-host-b", "{v}");
    assert_eq!(
        c["working_dir"],
        cwd.join("data").display().to_string(),
        "{v}"
    );
    assert_eq!(
        c["turns_data_dir"],
        cwd.join("data/shell/turns").display().to_string(),
        "{v}"
    );

    let out = Command::new(bin())
        .args(["doctor", "--config-id", "edge-1", "--config", "rel.yaml"])
        .current_dir(&cwd)
        .env_remove("III_NAMESPACE")
        .output()
        .expect("run doctor");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("config id       edge-1"), "{text}");
    let want = format!("working_dir     {}/data (written \"./data\"", cwd.display());
    assert!(text.contains(&want), "{text}");
}

/// `doctor --json` with `config` in a file: the report.
fn doctor_with(config: &Config) -> Value {
    let dir = tempdir();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, serde_json::to_string(config).unwrap()).unwrap();
    let out = Command::new(bin())
        .args(["doctor", "--json", "--config"])
        .arg(&path)
        .output()
        .expect("run doctor");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON")
}

/// The `observed` line of a real command that starts with `key`, tabs as spaces.
fn observed(v: &Value, key: &str) -> String {
    v["commands"]["observed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str())
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} line: {v}"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The command user's doctor lines, for each way a root worker is configured: the uid, gid and groups
/// a real command ran with, whether it could chmod a file it does not own, the warning, and
/// where the special-bits rule sits.
#[test]
fn doctor_reports_the_command_user_and_the_foreign_chmod_probe() {
    if !iii_shell_confine::requirement::root("the command user cases") {
        return;
    }
    let root = tempdir();
    let mut c = jailed(root.path());
    c.confinement.run_as = Some("4242:4343".into());
    let v = doctor_with(&c);
    let cmds = &v["commands"];
    assert!(
        cmds["user"]
            .as_str()
            .unwrap()
            .starts_with("4242:4343 groups [4343]"),
        "{v}"
    );
    assert_eq!(observed(&v, "Uid:"), "Uid: 4242 4242 4242 4242");
    assert_eq!(observed(&v, "Gid:"), "Gid: 4343 4343 4343 4343");
    assert_eq!(observed(&v, "Groups:"), "Groups: 4343");
    assert!(
        cmds["foreign_chmod"].as_str().unwrap().starts_with("no ("),
        "{v}"
    );
    assert!(
        cmds["seccomp_denied"].as_array().unwrap().iter().any(|s| s
            == "chmod/fchmod/fchmodat/fchmodat2 setting setuid or setgid (in the executor's own filter)"),
        "{v}"
    );
    assert_eq!(cmds["run_as_warning"], Value::Null, "{v}");

    // A root-owned primary root, run_as unset: nobody, and the warning naming the fix.
    let mut c = jailed(root.path());
    c.confinement.run_as = None;
    let v = doctor_with(&c);
    assert_eq!(observed(&v, "Uid:"), "Uid: 65534 65534 65534 65534");
    let w = v["commands"]["run_as_warning"].as_str().unwrap_or_default();
    assert!(
        w.contains("confinement.run_as") && w.contains("change the owner of"),
        "{v}"
    );
    assert!(v["warnings"].to_string().contains(w), "{v}");

    // Root, unjailed: root, said plainly; the probe shows a command could chmod root's files.
    let v = doctor_with(&Config::builtin_default());
    assert_eq!(observed(&v, "Uid:"), "Uid: 0 0 0 0");
    assert!(
        v["commands"]["foreign_chmod"]
            .as_str()
            .unwrap()
            .starts_with("yes"),
        "{v}"
    );
    assert!(
        v["warnings"]
            .to_string()
            .contains("unjailed as root: commands run as root"),
        "{v}"
    );
}
