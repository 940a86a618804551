//! Helpers of the escape suite: a jail next to an "outside" directory, command runners that
//! return the interesting parts of a `shell::exec` result, syscall probes, an executor started
//! with a pinned envelope, and a standalone `executor --socket`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use iii_shell_broker::executor_client::ExecutorClient;
use iii_shell_broker::services::Services;
use iii_shell_broker::spawn_executor::spawn_executor_with;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::messages::Request;
use serde_json::{json, Value};

use crate::common::{bin, canon, eventually, jailed, s, tempdir, Harness};

pub const SECRET: &[u8] = b"OUTSIDE SECRET";

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

/// The canonical directory of the `iii-shell` binary (granted read/exec in jailed configs so
/// commands can run `iii-shell probe`).
pub fn bin_dir() -> PathBuf {
    canon(bin()).parent().unwrap().to_path_buf()
}

/// `<tmp>/root` (the jail) next to `<tmp>/outside` (holding `secret.txt`, mode 0640).
/// Everything is canonical, and `<tmp>` is world-traversable.
pub struct Jail {
    _dir: tempfile::TempDir,
    pub base: PathBuf,
    pub root: PathBuf,
    pub outside: PathBuf,
}

impl Jail {
    pub fn new() -> Jail {
        let dir = tempdir();
        let base = canon(dir.path());
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), SECRET).unwrap();
        std::fs::set_permissions(
            outside.join("secret.txt"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        Jail {
            _dir: dir,
            base,
            root,
            outside,
        }
    }

    /// Jailed to `root`. No scratch paths (the temp dirs live under /tmp, a default scratch
    /// path, which would make "outside" writable), and the binary's directory is a system path.
    pub fn config(&self) -> Config {
        let mut c = jailed(&self.root);
        c.confinement.scratch_paths = Vec::new();
        c.confinement.system_paths.push(s(&bin_dir()));
        c
    }

    pub async fn harness(&self) -> Harness {
        Harness::new(self.config()).await
    }

    /// Names in `outside`.
    pub fn outside_names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Nothing appeared in `outside`, and `secret.txt` kept its bytes and mode.
    pub fn outside_untouched(&self) {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            self.outside_names(),
            ["secret.txt"],
            "something appeared outside the jail"
        );
        assert_eq!(
            std::fs::read(self.outside.join("secret.txt")).unwrap(),
            SECRET,
            "the outside file changed"
        );
        let md = std::fs::symlink_metadata(self.outside.join("secret.txt")).unwrap();
        assert!(md.file_type().is_file());
        assert_eq!(md.mode() & 0o7777, 0o640, "the outside file's mode changed");
    }
}

/// The parts of a `shell::exec` result the cases look at.
#[derive(Debug)]
pub struct Out {
    pub code: Option<i64>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    fn from(v: &Value) -> Out {
        assert_eq!(v["timed_out"], false, "the command timed out: {v}");
        Out {
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
    Out::from(&h.ok("shell::exec", p).await)
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
    let dir = tempdir();
    let turns_dir = tempdir();
    if !live.turns.data_dir.starts_with('/') {
        live.turns.data_dir = s(&turns_dir.path().join("turns"));
    }
    let path = dir.path().join("pinned.yaml");
    // JSON is YAML; the file must be owned by root (or us) and writable by nobody else.
    std::fs::write(&path, serde_json::to_string_pretty(pinned).unwrap()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let services = Services::new();
    let rt = services.snapshots.install(live);
    let (child, stream) = spawn_executor_with(bin(), &["--pin-config".to_string(), s(&path)])
        .expect("spawn executor");
    let client = ExecutorClient::connect(stream).await.expect("handshake");
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
    }
}

/// The default config with the seccomp filter off, pinned and live (a control).
pub async fn seccomp_off_harness() -> Harness {
    let mut c = Config::builtin_default();
    c.confinement.seccomp = false;
    pinned_harness(&c, c.clone()).await
}

/// `iii-shell executor --socket PATH --peer-uid N`, killed on drop.
pub struct SocketExecutor {
    pub child: Child,
    pub path: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl SocketExecutor {
    pub async fn start(peer_uid: u32) -> SocketExecutor {
        let dir = tempdir();
        // World-traversable, so a refusal can only come from the socket itself.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = canon(dir.path()).join("executor.sock");
        let log = dir.path().join("executor.log");
        let child = Command::new(bin())
            .args(["executor", "--socket"])
            .arg(&path)
            .args(["--peer-uid", &peer_uid.to_string()])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn executor");
        let mut e = SocketExecutor {
            child,
            path,
            log,
            _dir: dir,
        };
        let up = eventually(Duration::from_secs(10), || {
            e.log().contains("executor listening")
        })
        .await;
        assert!(
            up && e.path.exists(),
            "executor is not listening; exit: {:?}; log:\n{}",
            e.child.try_wait(),
            e.log()
        );
        e
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn assert_alive(&mut self) {
        assert_eq!(
            self.child.try_wait().unwrap(),
            None,
            "executor died; log:\n{}",
            self.log()
        );
    }
}

impl Drop for SocketExecutor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
