//! Helpers of the escape suite (`use common::escape::*`): command runners that return the
//! interesting parts of a `shell::exec` result, syscall probes, an executor started with a
//! pinned envelope, and /proc status checks. (Its jail is [`super::Jail`].)

use std::path::Path;

use iii_shell_broker::services::Services;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::messages::Request;
use serde_json::{json, Value};

use super::{bin, own_home_suffix, s, spawn_pinned, tempdir, Harness};

/// Returns early (after saying why) when the test is not running as root.
#[macro_export]
macro_rules! require_root {
    ($what:expr) => {
        if !iii_shell_confine::requirement::root($what) {
            return;
        }
    };
}

/// A python3 every uid can run (the pyenv shim under /root is not), if there is one.
pub fn python3() -> Option<&'static str> {
    ["/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

/// bash, for `/dev/tcp`.
pub fn bash() -> Option<&'static str> {
    ["/usr/bin/bash", "/bin/bash"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

/// The parts of a `shell::exec` result the cases look at, with the command that gave them (so
/// a failed check names its case).
#[derive(Debug)]
pub struct Out {
    pub argv: Vec<String>,
    pub code: Option<i64>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// A `shell::exec` response that may have been killed (no exit code).
    pub fn from_value(argv: &[&str], v: &Value) -> Out {
        Out::from(argv, v)
    }

    fn from(argv: &[&str], v: &Value) -> Out {
        assert_eq!(
            v["timed_out"], false,
            "{argv:?}: the command timed out: {v}"
        );
        Out {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            code: v["exit_code"].as_i64(),
            stdout: v["stdout"].as_str().unwrap_or_default().to_string(),
            stderr: v["stderr"].as_str().unwrap_or_default().to_string(),
        }
    }

    /// Exit 0.
    pub fn ok(&self) -> &Out {
        assert_eq!(self.code, Some(0), "expected success: {self:?}");
        self
    }

    /// A non-zero exit whose stderr says `needle`.
    pub fn failed_with(&self, needle: &str) -> &Out {
        assert!(
            self.code.is_some_and(|c| c != 0),
            "expected a failure: {self:?}"
        );
        assert!(
            self.stderr.contains(needle),
            "expected {needle:?} in stderr: {self:?}"
        );
        self
    }

    /// A non-zero exit with "Permission denied" (EACCES) on stderr.
    pub fn denied(&self) -> &Out {
        self.failed_with("Permission denied")
    }
}

/// Runs `argv` verbatim (no tokenizing) through `shell::exec`, in `cwd` when given.
pub async fn run(h: &Harness, cwd: Option<&str>, argv: &[&str]) -> Out {
    let mut p = json!({"command": argv[0], "args": &argv[1..], "timeout_ms": 20_000});
    if let Some(c) = cwd {
        p["cwd"] = json!(c);
    }
    Out::from(argv, &h.ok("shell::exec", p).await)
}

/// `sh -c script` in the jail root (jailed harnesses).
pub async fn sh(h: &Harness, script: &str) -> Out {
    run(h, Some("."), &["sh", "-c", script]).await
}

/// `sh -c script` in the executor's working directory (unjailed harnesses).
pub async fn sh_unjailed(h: &Harness, script: &str) -> Out {
    run(h, None, &["sh", "-c", script]).await
}

/// The one line `iii-shell probe syscall NAME` prints when run as a command.
pub async fn probe(h: &Harness, cwd: Option<&str>, name: &str) -> String {
    let bin = s(bin());
    let out = run(h, cwd, &[&bin, "probe", "syscall", name]).await;
    out.ok();
    out.stdout.trim_end().to_string()
}

/// The exact line of an errno result.
pub fn errno_line(name: &str, errno: i32) -> String {
    format!(
        "{name} errno={errno} ({})",
        std::io::Error::from_raw_os_error(errno)
    )
}

/// Asserts the probe of `name` fails with exactly `errno`.
pub async fn assert_probe_errno(h: &Harness, name: &str, errno: i32) {
    assert_eq!(probe(h, None, name).await, errno_line(name, errno));
}

/// Asserts the probe of `name` succeeds.
pub async fn assert_probe_ok(h: &Harness, name: &str) {
    assert_eq!(probe(h, None, name).await, format!("{name} ok"));
}

/// A shell-quoted string for `sh -c`.
pub fn q(p: &Path) -> String {
    format!("'{}'", s(p).replace('\'', r"'\''"))
}

/// A harness whose executor was started with `--pin-config FILE` holding `pinned` (the
/// executor's own start-up confinement comes from that envelope), then given `live`.
pub async fn pinned_harness(pinned: &Config, mut live: Config) -> Harness {
    let turns_dir = tempdir();
    if !live.turns.data_dir.starts_with('/') {
        live.turns.data_dir = s(&turns_dir.path().join("turns"));
    }
    let home_suffix = own_home_suffix(&live, turns_dir.path());
    let services = Services::new();
    let rt = services.snapshots.install(live);
    let (child, client, _pin_dir) = spawn_pinned(pinned).await;
    let executor_pid = client.pid;
    client
        .call(Request::SetPolicy {
            generation: rt.generation,
            config_json: rt.config_json(),
        })
        .await
        .expect("policy accepted within the pinned envelope");
    services.executor.set(client);
    Harness {
        services,
        child,
        executor_pid,
        turns_dir,
        home_suffix,
    }
}

/// The default config with the seccomp filter off, pinned and live (a control).
pub async fn seccomp_off_harness() -> Harness {
    let mut c = Config::builtin_default();
    c.confinement.seccomp = false;
    pinned_harness(&c, c.clone()).await
}

/// The `Key:\tvalue` lines of a /proc status text, as (key, value).
pub fn status_fields(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

pub fn field<'a>(fields: &'a [(String, String)], key: &str) -> &'a str {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key} in {fields:?}"))
}

/// Asserts the confinement lines of a status text: no_new_privs, seccomp filter mode, and
/// (when `caps`) every capability set empty.
pub fn assert_confined_status(text: &str, caps: bool) {
    let f = status_fields(text);
    assert_eq!(field(&f, "NoNewPrivs"), "1", "{text}");
    assert_eq!(field(&f, "Seccomp"), "2", "{text}");
    if caps {
        for k in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(field(&f, k), "0000000000000000", "{k} in {text}");
        }
    }
}
