//! `Worker`: the real `iii-shell serve` binary against the in-process test engine
//! (`iii_test_engine`), with a second engine connection as the caller (the `engine_*` suites
//! and every other suite that goes through an engine).
//!
//! Every spawned worker writes its stderr (and its executor's) to a file in its own temp dir,
//! so tests can assert on log lines. Dropping a [`Worker`] SIGKILLs the worker, every process
//! below it, and every process whose command line carries one of the worker's markers (jobs
//! orphaned by a killed executor).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use iii_shell_protocol::config::Config;
use iii_test_engine::{ErrorBody, TestClient, TestEngine, WorkerInfo};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use super::{children_of, cmdline, descendants, eventually, procs_with, unique_sleep_arg, BIN};

/// Generous bound for anything that should happen "soon" on a loaded 2-core CI box.
pub const WAIT: Duration = Duration::from_secs(20);

/// Environment variables of the worker contract, removed from the inherited environment so
/// that only what a test sets reaches the worker.
const CONTRACT_ENV: &[&str] = &[
    "III_URL",
    "III_ENGINE_URL",
    "III_WORKER_NAME",
    "III_NAMESPACE",
    "III_CONFIG",
    "III_CONFIG_NAME",
    "III_ISOLATION",
    "III_SHELL_PING_MS",
    "III_SHELL_IDLE_MS",
    "III_SHELL_RETRY_MS",
    "RUST_LOG",
];

/// How to start one `iii-shell serve`.
pub struct WorkerBuilder {
    dir: tempfile::TempDir,
    args: Vec<String>,
    env: Vec<(String, String)>,
    config: Option<PathBuf>,
    subcommand: bool,
    config_flag: bool,
    cwd: Option<PathBuf>,
    setsid: bool,
    wrapper: Vec<String>,
}

impl Default for WorkerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkerBuilder {
    pub fn new() -> Self {
        WorkerBuilder {
            dir: tempfile::tempdir().expect("tempdir"),
            args: Vec::new(),
            env: Vec::new(),
            config: None,
            subcommand: true,
            config_flag: true,
            cwd: None,
            setsid: false,
            wrapper: Vec::new(),
        }
    }

    /// Starts the binary through `wrapper` (`wrapper[0] wrapper[1..] iii-shell args…`): the
    /// wrapper must end by exec'ing its arguments, so the worker keeps the spawned pid.
    pub fn wrapper(mut self, wrapper: &[&str]) -> Self {
        self.wrapper = wrapper.iter().map(|s| s.to_string()).collect();
        self
    }

    /// `III_URL` = the engine's URL.
    pub fn engine(self, engine: &TestEngine) -> Self {
        self.env("III_URL", &engine.url())
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }

    /// Short keepalive timings (Ping 200 ms, idle 1 s, retry 300 ms).
    pub fn fast_keepalive(self) -> Self {
        self.env("III_SHELL_PING_MS", "200")
            .env("III_SHELL_IDLE_MS", "1000")
            .env("III_SHELL_RETRY_MS", "300")
    }

    /// Writes `yaml` as the `--config` seed file.
    pub fn seed_yaml(mut self, yaml: &str) -> Self {
        let path = self.dir.path().join("seed.yaml");
        std::fs::write(&path, yaml).expect("write seed");
        self.config = Some(path);
        self
    }

    /// A `--config` seed file holding `config`.
    pub fn seed(self, config: &Config) -> Self {
        let yaml = serde_norway::to_string(config).expect("config to yaml");
        self.seed_yaml(&yaml)
    }

    /// Runs `iii-shell` without the `serve` subcommand (as `iii worker add` does).
    pub fn without_subcommand(mut self) -> Self {
        self.subcommand = false;
        self
    }

    /// No `--config` at all (as a launcher runs a worker whose entry has no config block).
    pub fn without_config_flag(mut self) -> Self {
        self.config_flag = false;
        self
    }

    /// Runs the worker in `dir` instead of its own temp dir.
    pub fn current_dir(mut self, dir: &Path) -> Self {
        self.cwd = Some(dir.to_path_buf());
        self
    }

    /// Starts the worker in a session of its own (as the binary launcher does).
    pub fn setsid(mut self) -> Self {
        self.setsid = true;
        self
    }

    pub fn start(self) -> Worker {
        let stderr_path = self.dir.path().join("stderr.log");
        let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
        let config = self
            .config
            .clone()
            .unwrap_or_else(|| self.dir.path().join("no-seed.yaml"));
        let mut cmd = match self.wrapper.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        if self.subcommand {
            cmd.arg("serve");
        }
        if self.config_flag {
            cmd.arg("--config").arg(&config);
        }
        cmd.args(&self.args);
        for k in CONTRACT_ENV {
            cmd.env_remove(k);
        }
        cmd.env("RUST_LOG", "info").env("NO_COLOR", "1");
        cmd.env("XDG_STATE_HOME", super::worker_state_home());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if self.setsid {
            // SAFETY: setsid is async-signal-safe and allocates nothing.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                    nix::unistd::setsid()
                        .map(drop)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let child = cmd
            .current_dir(self.cwd.as_deref().unwrap_or(self.dir.path()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn iii-shell serve");
        // The per-worker HOME jailed commands get is named after the worker's name,
        // namespace and turn store (relative by default: under its own start-up directory).
        let var = |k: &str| {
            self.env
                .iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .filter(|v| !v.trim().is_empty())
        };
        let start = self
            .cwd
            .clone()
            .unwrap_or_else(|| self.dir.path().to_path_buf());
        let home_name = iii_shell_policy::home::default_home_name(
            0,
            &iii_shell_policy::home::worker_identity(
                var("III_NAMESPACE").as_deref(),
                var("III_WORKER_NAME").as_deref(),
                &start.join("data/shell/turns").to_string_lossy(),
            ),
        );
        Worker {
            home_suffix: home_name
                .rsplit('-')
                .next()
                .map(|h| format!("-{h}"))
                .filter(|_| self.cwd.is_none()),
            pid: child.id() as i32,
            child,
            stderr_path,
            dir: self.dir,
            markers: Mutex::new(Vec::new()),
            exited: None,
        }
    }
}

/// A running `iii-shell serve`.
pub struct Worker {
    /// The end of the name of the per-worker HOME this worker's jailed commands get (it
    /// started in its own temp dir, so no other worker shares it): removed from /tmp on drop.
    home_suffix: Option<String>,
    pub pid: i32,
    child: Child,
    stderr_path: PathBuf,
    dir: tempfile::TempDir,
    markers: Mutex<Vec<String>>,
    exited: Option<ExitStatus>,
}

impl Worker {
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder::new()
    }

    /// A worker with default settings connected to `engine` (no seed file).
    pub fn start(engine: &TestEngine) -> Worker {
        WorkerBuilder::new().engine(engine).start()
    }

    /// The worker's own temp dir (its cwd).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything written to stderr so far (worker and executor), ANSI codes stripped.
    pub fn stderr(&self) -> String {
        strip_ansi(&std::fs::read_to_string(&self.stderr_path).unwrap_or_default())
    }

    /// Stderr lines containing `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.stderr()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// Waits until a stderr line contains `needle`.
    pub async fn wait_log(&self, needle: &str, limit: Duration) -> bool {
        eventually(limit, || !self.log_lines(needle).is_empty()).await
    }

    /// Like [`Self::wait_log`], panicking with the log on timeout.
    pub async fn expect_log(&self, needle: &str) {
        if !self.wait_log(needle, WAIT).await {
            panic!(
                "no stderr line contains {needle:?}; stderr:\n{}",
                self.stderr()
            );
        }
    }

    /// Pid of the current executor: a live child of the worker started as `executor --fd`.
    pub fn executor_pid(&self) -> Option<i32> {
        children_of(self.pid)
            .into_iter()
            .find(|p| cmdline(*p).is_some_and(|c| c.contains("executor --fd")))
    }

    /// Waits for an executor other than `not` to be running.
    pub async fn wait_executor(&self, not: Option<i32>) -> i32 {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(p) = self.executor_pid().filter(|p| Some(*p) != not) {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "no executor (other than {not:?}) came up; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid), sig).expect("signal the worker");
    }

    /// The exit status, if the process has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// Waits up to `limit` for the process to exit.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.try_exit() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// A unique token for a command line (e.g. `sleep <marker>`); processes carrying it are
    /// killed when the worker is dropped, wherever they were re-parented to.
    pub fn marker(&self, seconds: u32) -> String {
        let m = unique_sleep_arg(seconds);
        self.markers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(m.clone());
        m
    }

    /// The connection of this worker the engine saw last (by pid).
    pub fn info(&self, engine: &TestEngine) -> Option<WorkerInfo> {
        engine
            .workers()
            .into_iter()
            .rev()
            .find(|w| w.pid == Some(self.pid as u64))
    }

    /// Every connection of this worker, in connect order.
    pub fn connections(&self, engine: &TestEngine) -> Vec<WorkerInfo> {
        engine
            .workers()
            .into_iter()
            .filter(|w| w.pid == Some(self.pid as u64))
            .collect()
    }

    /// Waits for a live connection of this worker.
    pub async fn wait_connected(&self, engine: &TestEngine) -> WorkerInfo {
        let ok = engine
            .wait_until(WAIT, |e| {
                e.workers()
                    .iter()
                    .any(|w| w.connected && w.pid == Some(self.pid as u64))
            })
            .await;
        assert!(ok, "the worker never connected; stderr:\n{}", self.stderr());
        self.info(engine).expect("connection info")
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let mut victims = descendants(self.pid);
        let markers = self
            .markers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for m in &markers {
            victims.extend(procs_with(m));
        }
        if self.try_exit().is_none() {
            let _ = self.child.kill();
        }
        for p in victims {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        let _ = self.child.wait();
        if let Some(suffix) = &self.home_suffix {
            for e in std::fs::read_dir("/tmp").into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("iii-shell-home-") && name.ends_with(suffix.as_str()) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
}

/// Starts a worker for `engine` and waits until `shell::exec` is registered.
pub async fn start_ready(engine: &TestEngine) -> Worker {
    let w = Worker::start(engine);
    wait_ready(engine, &w).await;
    w
}

/// Waits until the worker's functions (and its config trigger binding) are filed.
pub async fn wait_ready(engine: &TestEngine, w: &Worker) {
    for id in [
        "shell::exec",
        "shell::config-status",
        "shell::on-config-change",
    ] {
        if engine.wait_for_function(id, WAIT).await.is_none() {
            panic!("{id} was never registered; stderr:\n{}", w.stderr());
        }
    }
    // The configuration binding is sent right after the functions.
    let bound = engine
        .wait_until(WAIT, |e| {
            e.triggers().iter().any(|t| {
                t.trigger_type == "configuration" && t.function_id == "shell::on-config-change"
            })
        })
        .await;
    assert!(
        bound,
        "the configuration trigger was never bound; stderr:\n{}",
        w.stderr()
    );
}

/// Ids of this worker's functions (`shell::*` and `coder::*`) currently registered, in any
/// namespace.
pub fn shell_functions(engine: &TestEngine) -> Vec<String> {
    engine
        .functions()
        .into_iter()
        .filter(|f| f.id.starts_with("shell::") || f.id.starts_with("coder::"))
        .map(|f| f.id)
        .collect()
}

/// Every function id this build registers: the catalogue plus the internal change handler.
pub fn all_function_ids() -> Vec<String> {
    let mut ids: Vec<String> = iii_shell_broker::functions::catalogue()
        .iter()
        .map(|f| f.id.to_string())
        .collect();
    ids.push(iii_shell_broker::lifecycle::ON_CHANGE_ID.to_string());
    ids
}

/// The functions every build has, whatever else it adds.
pub const CORE_FUNCTIONS: &[&str] = &[
    "shell::exec",
    "shell::exec_bg",
    "shell::status",
    "shell::list",
    "shell::kill",
    "shell::config-status",
    "shell::on-config-change",
];

/// `shell::exec` of `pwd` in `cwd`.
pub fn pwd_in(cwd: &str) -> Value {
    json!({"command": "pwd", "cwd": cwd})
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Asserts that an error has `code`, showing the whole error otherwise.
#[track_caller]
pub fn assert_code<T: std::fmt::Debug>(r: &Result<T, ErrorBody>, code: &str) {
    match r {
        Err(e) if e.code == code => {}
        other => panic!("expected error {code}, got {other:?}"),
    }
}

/// `function` called by `caller` through the engine fails with `code` (the message names the
/// call otherwise); the error, for more checks.
pub async fn expect_engine_code(
    caller: &TestClient,
    function: &str,
    payload: Value,
    code: &str,
) -> ErrorBody {
    match caller.call(function, payload.clone()).await {
        Err(e) if e.code == code => e,
        other => {
            // A payload can hold megabytes (a too-big write): show its start.
            let p: String = payload.to_string().chars().take(300).collect();
            panic!("{function} {p}: expected error {code}, got {other:?}")
        }
    }
}
