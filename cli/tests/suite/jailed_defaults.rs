//! What a new user meets on a jailed start of the shipped configuration: commands,
//! background jobs and terminal sessions start in the primary root, get a `HOME` they can
//! write that outlives the call and the executor, `doctor` shows both, and the logs carry
//! no WARN that is untrue or repeated. All through the real binary: `iii-shell serve` against
//! the test engine, `iii-shell call`, `iii-shell doctor`, `iii-shell executor --socket`.
//!
//! The jail is what an operator sets up: a workspace owned by an unprivileged user (the
//! commands' user, `run_as` unset), the worker started from a directory outside every root
//! and scratch path, with a `HOME` there too (as `/root` is for a root service). That
//! directory is never the checkout's when the checkout lies in a scratch path (a clone under
//! `/tmp`): see [`outside_scratch`].

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use common::*;
use iii_shell_protocol::config::{Config, SHIPPED_CONFIG_YAML};
use iii_test_engine::{TestClient, TestEngine};
use serde_json::{json, Value};

/// The uid that owns the workspace, so commands act as it.
const APP_UID: u32 = 4242;

/// A workspace owned by [`APP_UID`] (in /tmp), and the worker's start-up directory and
/// `HOME`, outside every root and scratch path (in the target dir).
struct Site {
    _root: tempfile::TempDir,
    _start: tempfile::TempDir,
    /// The primary root, canonical.
    root: PathBuf,
    /// The worker's working directory at start-up.
    start: PathBuf,
    /// The worker's own `HOME` (outside the jail, like `/root`).
    own_home: PathBuf,
}

impl Site {
    fn new() -> Site {
        assert!(
            is_root(),
            "these tests need root: the workspace belongs to uid {APP_UID} and the executor switches to it"
        );
        let root_dir = tempdir();
        let root = canon(root_dir.path());
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("README"), "workspace\n").unwrap();
        for p in [root.clone(), root.join("sub"), root.join("README")] {
            std::os::unix::fs::chown(&p, Some(APP_UID), Some(APP_UID)).unwrap();
        }
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let start_dir = tempfile::Builder::new()
            .prefix("jailed-defaults-")
            .tempdir_in(outside_scratch())
            .unwrap();
        let start = canon(start_dir.path());
        let own_home = start.join("own-home");
        std::fs::create_dir(&own_home).unwrap();
        Site {
            _root: root_dir,
            _start: start_dir,
            root,
            start,
            own_home,
        }
    }

    /// The shipped `config.yaml` plus this workspace as the one host root.
    fn config(&self) -> Config {
        let mut c = Config::from_yaml(SHIPPED_CONFIG_YAML).expect("the shipped config parses");
        c.fs.host_roots = vec![s(&self.root)];
        c
    }

    fn write_config(&self, name: &str, c: &Config) -> PathBuf {
        let p = self.start.join(name);
        std::fs::write(&p, serde_norway::to_string(c).unwrap()).unwrap();
        p
    }

    fn root_str(&self) -> String {
        s(&self.root)
    }

    /// `serve` seeded with `c`, started from the start-up directory with the own HOME.
    fn worker(&self, engine: &TestEngine, c: &Config) -> Worker {
        Worker::builder()
            .engine(engine)
            .seed(c)
            .current_dir(&self.start)
            .env("HOME", &s(&self.own_home))
            .start()
    }

    /// `iii-shell ARGS` as the worker would run it: same start-up directory, same HOME, no
    /// worker name or namespace.
    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .current_dir(&self.start)
            .env("HOME", &self.own_home)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("III_NAMESPACE")
            .env_remove("III_WORKER_NAME")
            .stdin(Stdio::null())
            .output()
            .expect("run iii-shell")
    }

    /// `iii-shell call --config FILE shell::exec` of `sh -c script`: its result.
    fn sh(&self, config: &Path, script: &str) -> Value {
        let payload = json!({"command": "sh", "args": ["-c", script]}).to_string();
        let o = self.run(&["call", "--config", &s(config), "shell::exec", &payload]);
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
    }
}

/// Where the worker's start-up directory and own `HOME` go: the target directory's temp
/// dir, unless the checkout lies in a scratch path of the shipped configuration (a clone
/// under `/tmp`), where a `HOME` would be in reach of the jail; then the first of `/root`,
/// `/var/lib`, `/run` that is a directory outside them all.
fn outside_scratch() -> PathBuf {
    let c = Config::from_yaml(SHIPPED_CONFIG_YAML).expect("the shipped config parses");
    let scratch = &c.confinement.scratch_paths;
    [env!("CARGO_TARGET_TMPDIR"), "/root", "/var/lib", "/run"]
        .into_iter()
        .map(canon_or_same)
        .find(|p| p.is_dir() && !scratch.iter().any(|s| p.starts_with(canon_or_same(s))))
        .expect("a directory outside every scratch path")
}

fn canon_or_same(p: &str) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p))
}

/// Removes the per-worker HOME a test made (it lives in /tmp, named after the test's own
/// start-up directory, so no other run uses it).
struct RemoveAfter(Option<PathBuf>);

impl Drop for RemoveAfter {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// A console page standing in for the browser: records what a session prints.
struct Page {
    id: String,
    got: Arc<Mutex<Vec<u8>>>,
    _client: TestClient,
}

impl Page {
    async fn new(engine: &TestEngine) -> Page {
        let id = format!(
            "iii::shell-ui::pty-output::console-{}",
            uuid::Uuid::new_v4()
        );
        let client = engine.client().await;
        let got: Arc<Mutex<Vec<u8>>> = Arc::default();
        let sink = got.clone();
        client
            .register_function(&id, move |data: Value, _| {
                let sink = sink.clone();
                async move {
                    if let Some(d) = data["data"].as_str() {
                        let bytes = base64::engine::general_purpose::STANDARD
                            .decode(d)
                            .expect("data is base64");
                        sink.lock().unwrap().extend(bytes);
                    }
                    Ok(json!({}))
                }
            })
            .await
            .expect("register the output function");
        Page {
            id,
            got,
            _client: client,
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.got.lock().unwrap()).into_owned()
    }

    async fn wait_text(&self, needle: &str) -> String {
        let ok = eventually(WAIT, || self.text().contains(needle)).await;
        assert!(ok, "{needle:?} never arrived; got {:?}", self.text());
        self.text()
    }
}

async fn job_output(caller: &TestClient, payload: Value) -> Value {
    let r = caller.call("shell::exec_bg", payload).await.unwrap();
    let id = r["job_id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let job = caller
            .call("shell::status", json!({"job_id": id}))
            .await
            .unwrap()["job"]
            .clone();
        if job["status"] != "running" {
            return job;
        }
        assert!(std::time::Instant::now() < deadline, "still running: {job}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// Lines of `log` at WARN.
fn warns(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains(" WARN ")).collect()
}

/// A jailed start of the shipped configuration: `shell::exec`, `shell::exec_bg` and a
/// terminal session without a `cwd` of their own run in the primary root (not in the
/// worker's directory, which Landlock leaves unreadable), each sees the same `HOME`, a
/// directory of the command user's that it can write, and the whole start logs no WARN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jailed_start_runs_in_the_primary_root_with_a_working_home_and_no_warn() {
    let site = Site::new();
    let engine = TestEngine::start().await;
    let w = site.worker(&engine, &site.config());
    wait_ready(&engine, &w).await;
    w.expect_log("policy accepted").await;
    let caller = engine.client().await;
    let root = site.root_str();

    // shell::exec, no cwd: the primary root, and its files are there to list.
    let probe =
        "pwd; ls; echo \"home=$HOME\"; id -u; echo kept > \"$HOME/probe\" && cat \"$HOME/probe\"";
    let r = caller
        .call(
            "shell::exec",
            json!({"command": "sh", "args": ["-c", probe]}),
        )
        .await
        .unwrap();
    assert_eq!(r["exit_code"], 0, "{r}");
    let out = r["stdout"].as_str().unwrap().to_string();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], root, "{r}");
    assert_eq!(&lines[1..3], ["README", "sub"], "{r}");
    let home = lines[3].strip_prefix("home=").unwrap().to_string();
    let _cleanup = RemoveAfter(Some(PathBuf::from(&home)));
    assert_eq!(&lines[4..], [APP_UID.to_string().as_str(), "kept"], "{r}");
    assert!(
        home.starts_with("/tmp/iii-shell-home-4242-"),
        "the per-worker HOME in the first scratch path: {home}"
    );
    let md = std::fs::symlink_metadata(&home).unwrap();
    assert!(md.is_dir());
    assert_eq!((md.uid(), md.mode() & 0o7777), (APP_UID, 0o700), "{home}");

    // shell::exec_bg, no cwd: the same place and the same HOME.
    let job = job_output(
        &caller,
        json!({"command": "sh", "args": ["-c", "pwd; echo \"$HOME\"; cat \"$HOME/probe\""]}),
    )
    .await;
    assert_eq!(job["stdout"], format!("{root}\n{home}\nkept\n"), "{job}");

    // A terminal session: its `cwd` is required ("." is the primary root), and its login
    // shell gets the same HOME, so ~/.profile and history work.
    let page = Page::new(&engine).await;
    let script =
        "pwd; echo \"home=$HOME\"; cd && pwd && echo from-pty >> probe && echo done-probing";
    caller
        .call(
            "shell::pty::open",
            json!({"cwd": ".", "cols": 200, "rows": 24, "output_function_id": page.id,
                   "program": "sh", "args": ["-c", script]}),
        )
        .await
        .unwrap();
    let text = page.wait_text("done-probing").await;
    assert!(
        text.contains(&format!("{root}\r\nhome={home}\r\n{home}\r\ndone-probing")),
        "{text:?}"
    );
    assert_eq!(
        std::fs::read_to_string(Path::new(&home).join("probe")).unwrap(),
        "kept\nfrom-pty\n"
    );

    // A per-call cwd still wins.
    let r = caller
        .call("shell::exec", json!({"command": "pwd", "cwd": "sub"}))
        .await
        .unwrap();
    assert_eq!(r["stdout"], format!("{root}/sub\n"), "{r}");

    // Nothing on the way logged a WARN.
    let log = w.stderr();
    assert_eq!(warns(&log), Vec::<&str>::new(), "{log}");
}

/// The HOME persists: what one `iii-shell call` writes there (`git config --global`), the
/// next one reads back, each with a fresh executor; `doctor` and `check-config` name it.
#[test]
fn the_home_outlives_the_call_and_the_executor_and_doctor_shows_it() {
    let site = Site::new();
    let cfg = site.write_config("shell.yaml", &site.config());
    let set = site.sh(
        &cfg,
        "git config --global user.name iii-shell-test && echo \"$HOME\"",
    );
    assert_eq!(set["exit_code"], 0, "{set}");
    let home = set["stdout"].as_str().unwrap().trim().to_string();
    let _cleanup = RemoveAfter(Some(PathBuf::from(&home)));
    assert!(home.starts_with("/tmp/iii-shell-home-4242-"), "{home}");
    let get = site.sh(&cfg, "git config --global user.name; echo \"$HOME\"");
    assert_eq!(get["stdout"], format!("iii-shell-test\n{home}\n"), "{get}");
    assert_eq!(
        std::fs::read_to_string(Path::new(&home).join(".gitconfig")).unwrap(),
        "[user]\n\tname = iii-shell-test\n"
    );

    let o = site.run(&["doctor", "--json", "--config", &s(&cfg)]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["commands"]["home"],
        format!("{home} (the per-worker default: owned by uid 4242, mode 0700, kept across calls and restarts)"),
        "{v}"
    );
    assert_eq!(
        v["commands"]["cwd"],
        format!("{} (the primary root)", site.root_str()),
        "{v}"
    );
    assert_eq!(v["warnings"], json!([]), "{v}");
    let o = site.run(&["doctor", "--config", &s(&cfg)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!(
            "  HOME               {home} (the per-worker default"
        )),
        "{text}"
    );
    let o = site.run(&["check-config", &s(&cfg)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!(
            "  working_dir     null (commands start in the primary root {})\n",
            site.root_str()
        )) && text.contains(&format!("  HOME            {home} (the per-worker default, made for uid 4242 with mode 0700 when the executor takes this policy)\n")),
        "{text}"
    );
}

/// Who upgrades keeps what they set: `env.home` wins, a worker HOME the jail lets commands
/// use is kept, and so is an explicit `working_dir`. Another worker (another namespace) on
/// the same host gets a HOME of its own.
#[test]
fn an_explicit_home_or_working_dir_still_wins() {
    let site = Site::new();
    let mut c = site.config();
    let chosen = site.root.join("sub");
    c.env.home = Some(s(&chosen));
    c.working_dir = Some(s(&site.root.join("sub")));
    let cfg = site.write_config("explicit.yaml", &c);
    let r = site.sh(&cfg, "pwd; echo \"$HOME\"");
    assert_eq!(r["stdout"], format!("{0}\n{0}\n", s(&chosen)), "{r}");

    // HOME set in the worker's environment to a place inside the jail (the old advice).
    let cfg = site.write_config("plain.yaml", &site.config());
    let payload = json!({"command": "sh", "args": ["-c", "echo \"$HOME\""]}).to_string();
    let o = Command::new(BIN)
        .args(["call", "--config", &s(&cfg), "shell::exec", &payload])
        .current_dir(&site.start)
        .env("HOME", s(&chosen))
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["stdout"], format!("{}\n", s(&chosen)), "{v}");

    // Two namespaces, one host, one start-up directory: two HOMEs.
    let homes: Vec<String> = ["host-a", "host-b"]
        .iter()
        .map(|ns| {
            let o = Command::new(BIN)
                .args(["call", "--config", &s(&cfg), "shell::exec", &payload])
                .current_dir(&site.start)
                .env("HOME", &site.own_home)
                .env("III_NAMESPACE", ns)
                .output()
                .unwrap();
            let v: Value = serde_json::from_slice(&o.stdout).unwrap();
            v["stdout"].as_str().unwrap().trim().to_string()
        })
        .collect();
    let _a = RemoveAfter(Some(PathBuf::from(&homes[0])));
    let _b = RemoveAfter(Some(PathBuf::from(&homes[1])));
    assert!(
        homes
            .iter()
            .all(|h| h.starts_with("/tmp/iii-shell-home-4242-")),
        "{homes:?}"
    );
    assert_ne!(homes[0], homes[1]);
}

/// A per-worker HOME someone else planted first (a symlink to a place of theirs, or a
/// directory they own) is refused, not followed or used: commands keep the worker's HOME
/// and one WARN says what to do.
#[test]
fn a_planted_home_is_refused_with_one_warn_naming_the_fix() {
    let site = Site::new();
    let cfg = site.write_config("shell.yaml", &site.config());
    // Learn the name (check-config creates nothing), then plant a symlink there.
    let o = site.run(&["check-config", &s(&cfg)]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let home = text
        .lines()
        .find_map(|l| l.strip_prefix("  HOME            "))
        .and_then(|l| l.split(' ').next())
        .unwrap()
        .to_string();
    assert!(!Path::new(&home).exists(), "check-config made {home}");
    let _cleanup = RemoveAfter(Some(PathBuf::from(&home)));
    let bait = tempdir();
    std::os::unix::fs::chown(bait.path(), Some(APP_UID), Some(APP_UID)).unwrap();
    std::os::unix::fs::symlink(bait.path(), &home).unwrap();
    let payload =
        json!({"command": "sh", "args": ["-c", "echo \"$HOME\"; touch \"$HOME/x\""]}).to_string();
    let o = site.run(&["call", "--config", &s(&cfg), "shell::exec", &payload]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["stdout"], format!("{}\n", s(&site.own_home)), "{v}");
    assert_ne!(
        v["exit_code"], 0,
        "the worker's own HOME is outside the jail: {v}"
    );
    assert!(
        names_in(bait.path()).is_empty(),
        "followed the planted link"
    );
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    let w = warns(&log);
    assert_eq!(w.len(), 1, "{log}");
    assert!(
        w[0].contains(&format!("jailed commands get HOME={}, which they cannot use: {home} is not a directory (a symlink or a file was put there, and is not followed); remove it, or set env.home", s(&site.own_home))),
        "{log}"
    );
    // A directory of another user's.
    std::fs::remove_file(&home).unwrap();
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(4343), Some(4343)).unwrap();
    let o = site.run(&["call", "--config", &s(&cfg), "shell::exec", &payload]);
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        warns(&log).iter().any(|l| l.contains(&format!(
            "{home} belongs to uid 4343, not to uid 4242 that commands run as (someone else made it first); remove it"
        ))),
        "{log}"
    );
    assert!(names_in(Path::new(&home)).is_empty());
}

/// `iii-shell call --socket` pushes the policy on every call: what is wrong with it is
/// logged once, not once per call, and again when it changes. A root executor whose
/// commands run as another user never claims they share the socket's peer uid.
#[tokio::test]
async fn a_socket_executor_warns_once_per_cause_and_only_when_true() {
    let site = Site::new();
    let exec = SocketExecutor::start_default().await;
    let call = |cfg: &Path| {
        let o = site.run(&[
            "call",
            "--socket",
            &s(&exec.path),
            "--config",
            &s(cfg),
            "shell::exec",
            r#"{"command":"pwd"}"#,
        ]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["stdout"], format!("{}\n", site.root_str()), "{v}");
    };
    // The shipped config, jailed: nothing to warn about, however often it is pushed.
    let cfg = site.write_config("shell.yaml", &site.config());
    call(&cfg);
    call(&cfg);
    let home = Path::new("/tmp").join(iii_shell_policy::home::default_home_name(
        APP_UID,
        &iii_shell_policy::home::worker_identity(
            None,
            None,
            &s(&site.start.join("data/shell/turns")),
        ),
    ));
    let _cleanup = RemoveAfter(Some(home));
    assert!(
        exec.log().contains("commands act as this user uid=4242"),
        "{}",
        exec.log()
    );
    assert_eq!(warns(&exec.log()), Vec::<&str>::new(), "{}", exec.log());

    // env.home outside the jail: true, said once for two pushes, and again for another.
    let mut c = site.config();
    c.env.home = Some(s(&site.own_home));
    let outside = site.write_config("outside.yaml", &c);
    call(&outside);
    call(&outside);
    c.env.home = Some("/var/lib/elsewhere".into());
    let other = site.write_config("other.yaml", &c);
    call(&other);
    let log = exec.log();
    let w = warns(&log);
    assert_eq!(w.len(), 2, "{log}");
    assert!(
        w[0].contains(&format!(
            "env.home ({}) is outside the jail",
            s(&site.own_home)
        )),
        "{log}"
    );
    assert!(
        w[1].contains("env.home (/var/lib/elsewhere) is outside the jail"),
        "{log}"
    );
}

/// When commands do run as the socket's peer uid (root broker, root commands), the executor
/// says so once it knows it: after the first policy settled the command user, once.
#[tokio::test]
async fn the_peer_uid_warning_comes_once_the_command_user_is_known() {
    let site = Site::new();
    let exec = SocketExecutor::start_default().await;
    let cfg = site.write_config("unjailed.yaml", &Config::builtin_default());
    for _ in 0..2 {
        let o = site.run(&[
            "call",
            "--socket",
            &s(&exec.path),
            "--config",
            &s(&cfg),
            "shell::exec",
            r#"{"command":"id","args":["-u"]}"#,
        ]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["stdout"], "0\n", "{v}");
    }
    let log = exec.log();
    let w = warns(&log);
    assert_eq!(w.len(), 1, "{log}");
    assert!(
        w[0].contains("the executor socket's peer uid equals the uid commands run as"),
        "{log}"
    );
    let settled = log
        .find("commands act as this user")
        .expect("the user line");
    assert!(
        log.find(w[0]).unwrap() > settled,
        "warned before the user was known: {log}"
    );
}

/// A worker whose own `HOME` lies in a scratch path (`HOME=/tmp/w`, as in many containers
/// and CI runners) that the command user cannot write: commands never get it. They get the
/// per-worker HOME, which they can write, and one WARN says why and what to do.
#[test]
fn a_worker_home_in_scratch_the_command_user_cannot_write_is_not_handed_on() {
    let site = Site::new();
    let cfg = site.write_config("shell.yaml", &site.config());
    let scratch_home = tempfile::Builder::new()
        .prefix("worker-home-")
        .tempdir_in("/tmp")
        .unwrap();
    let w = canon(scratch_home.path());
    std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o755)).unwrap();
    let payload =
        json!({"command": "sh", "args": ["-c", "echo \"$HOME\"; touch \"$HOME/x\" && echo wrote"]})
            .to_string();
    let o = Command::new(BIN)
        .args(["call", "--config", &s(&cfg), "shell::exec", &payload])
        .current_dir(&site.start)
        .env("HOME", &w)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env_remove("III_NAMESPACE")
        .env_remove("III_WORKER_NAME")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let out = v["stdout"].as_str().unwrap();
    let home = out.lines().next().unwrap_or_default().to_string();
    let _cleanup = RemoveAfter(Some(PathBuf::from(&home)));
    assert!(home.starts_with("/tmp/iii-shell-home-4242-"), "{v}");
    assert_eq!(out, format!("{home}\nwrote\n"), "{v}");
    assert!(names_in(&w).is_empty());
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(
        warns(&log)
            .iter()
            .filter(|l| l.contains(&format!(
                "the worker's HOME ({}) is not writable by uid 4242 that commands run as: commands get the per-worker home {home} instead; set env.home",
                s(&w)
            )))
            .count(),
        1,
        "{log}"
    );
}
