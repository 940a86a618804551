//! The `shell` configuration document (ide 0.12.9 shape).
//!
//! Parsing is strict: keys removed in older releases are refused with a migration hint, and
//! unknown keys are refused too, because serde would otherwise ignore a stale or misspelt key
//! and boot with a weaker policy than the operator wrote.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// The shipped `config.yaml`, which is also the built-in zero-config default.
pub const SHIPPED_CONFIG_YAML: &str = include_str!("../../config.yaml");

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The whole configuration of the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
#[schemars(title = "ShellConfig")]
pub struct Config {
    /// Foreground exec hard cap in ms; a per-call `timeout_ms` is clamped to this.
    pub max_timeout_ms: u64,
    /// Host background job hard cap in ms; 0 = unbounded. A job that runs longer is killed and its status becomes `killed`.
    pub max_bg_timeout_ms: u64,
    /// Timeout applied when the caller omits `timeout_ms` (code default 10000).
    pub default_timeout_ms: u64,
    /// Cap on captured stdout and on captured stderr, each, in bytes; output past it sets `*_truncated`.
    pub max_output_bytes: u64,
    /// Which of the worker's environment variables reach commands.
    pub env: EnvConfig,
    /// Advisory regexes over `argv.join(" ")`: a tripwire for catastrophic mistakes, NOT a security boundary. Command-shaped patterns are anchored to argv[0] and tolerate sudo/doas/nohup/env/timeout wrappers.
    pub denylist_patterns: Vec<String>,
    /// `shell::exec_bg` past this many running jobs is rejected.
    pub max_concurrent_jobs: u32,
    /// Finished jobs are pruned this many seconds after they finish.
    pub job_retention_secs: u64,
    /// Filesystem jail, caps and path denylist for `shell::fs::*`, exec `cwd` and `coder::*`.
    pub fs: FsConfig,
    /// Globs shared by `coder::*` and `shell::fs::*`.
    pub code: CodeConfig,
    /// Per-session change history of the turns module.
    pub turns: TurnsConfig,
    /// Limits of the `shell::changed` change feed (its OS watchers).
    pub watch: WatchConfig,
    /// Sandbox-target forwarding.
    pub sandbox: SandboxConfig,
    /// Default working directory of commands, background jobs and terminal sessions when a call gives no `cwd`; null = the primary root when jailed (the first of `fs.host_roots`), the executor's own working directory when unjailed.
    pub working_dir: Option<String>,
    /// Kernel confinement of commands and of the executor: Landlock, seccomp, capabilities, resource limits.
    pub confinement: ConfinementConfig,
    /// Limits of terminal sessions (`shell::pty::*`).
    pub pty: PtyConfig,
    /// Limits of driving background jobs (`shell::job::*`: stdin writes, output reads, waits).
    pub jobs: JobsConfig,
    /// Spans, logs and gauges sent to the engine's telemetry socket (the iii console's traces, logs and worker view).
    pub telemetry: TelemetryConfig,
}

/// Telemetry to the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Send spans of every call, the worker's logs and its gauges to the engine. When false, no span is built and nothing is sent.
    pub enabled: bool,
    /// The least severe log event shipped to the engine: `warn` (WARN and ERROR, the default), `error`, or `info`. Local stderr logging is not affected.
    pub logs_level: TelemetryLogLevel,
    /// How often the gauges (memory, CPU, uptime, running jobs and terminal sessions) and counters are sent, in ms (1000 to 3600000).
    pub metrics_interval_ms: u64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            enabled: true,
            logs_level: TelemetryLogLevel::Warn,
            metrics_interval_ms: 10_000,
        }
    }
}

/// Which log events go to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TelemetryLogLevel {
    Error,
    #[default]
    Warn,
    Info,
}

/// Limits of driving background jobs (`shell::job::*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    /// Bytes one `shell::job::write` may send to a job's stdin; more is refused (S218) and nothing is written. At least 1.
    pub max_write_bytes: u64,
    /// Bytes of output each job keeps for `shell::job::read`, per stream (stdout, stderr and the merged stream each); older bytes fall out and a reader behind them is told how many it missed. At least 1.
    pub output_buffer_bytes: u64,
    /// Callers waiting at once on jobs (`shell::job::read` with `wait_ms` and `shell::job::wait`), all jobs together; one more is refused (S218). At least 1.
    pub max_waiters: u32,
}

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig {
            max_write_bytes: 1024 * 1024,
            output_buffer_bytes: 1024 * 1024,
            max_waiters: 64,
        }
    }
}

/// Terminal-session limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PtyConfig {
    /// Sessions (running or exited but not yet closed) allowed at once; `shell::pty::open` past it is refused.
    pub max_sessions: u32,
    /// An exited session (its output still replayable) is removed this many seconds after its program exited, unless closed first.
    pub exited_retention_secs: u64,
    /// A live session nobody is attached to is killed and removed after this many seconds detached.
    pub detached_retention_secs: u64,
    /// Running sessions one caller (the engine worker the engine names in `_caller_worker_id`) may hold at once; at least 1.
    pub max_sessions_per_caller: u32,
    /// Who may take a detached session with `shell::pty::adopt`, which needs no token: `any` caller, only the `opener` (the engine worker holding the session), or nobody (`off`).
    pub adopt: PtyAdopt,
}

impl Default for PtyConfig {
    fn default() -> Self {
        PtyConfig {
            max_sessions: 32,
            exited_retention_secs: 3600,
            detached_retention_secs: 86_400,
            max_sessions_per_caller: 16,
            adopt: PtyAdopt::Any,
        }
    }
}

/// Who may adopt a detached terminal session (`pty.adopt`), widest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PtyAdopt {
    /// Any caller that names the session and its page family (the seed's rule).
    #[default]
    Any,
    /// Only the engine worker that holds the session: the one that opened it, or the last
    /// to attach to it with its reconnect token.
    Opener,
    /// Nobody: a session whose reconnect token is lost stays lost.
    Off,
}

/// How strictly configured confinement layers must be enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConfinementMode {
    /// Run with whatever the kernel supports, and say so loudly at start-up.
    #[default]
    BestEffort,
    /// Fail closed when any configured layer cannot be fully enforced.
    Strict,
}

/// What network commands reach (the order, from widest to tightest, is
/// [`crate::network::tightness`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkAccess {
    /// Commands may bind and connect TCP ports.
    #[default]
    Allow,
    /// Commands may connect but not bind TCP ports (Landlock ABI 4 and later).
    DenyBind,
    /// Commands reach 127.0.0.1 and ::1 of a network namespace of their own and nothing
    /// else (not the host's own loopback services).
    Loopback,
    /// Commands open no IP, packet or netlink socket (UDP included); Unix sockets only.
    Deny,
}

/// Kernel confinement settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConfinementConfig {
    /// `best_effort` (default) runs with what the kernel supports and says so; `strict` refuses to run when a configured layer cannot be fully enforced.
    pub mode: ConfinementMode,
    /// Apply Landlock to commands (built from the live jail).
    pub landlock: bool,
    /// Apply the seccomp deny filter to the executor and every command.
    pub seccomp: bool,
    /// Syscalls re-allowed from the seccomp deny list by name (e.g. `ptrace` for debuggers).
    #[serde(deserialize_with = "null_as_empty")]
    #[schemars(with = "Option<Vec<String>>")]
    pub seccomp_allow: Vec<String>,
    /// Capabilities the executor keeps (names like `CAP_CHOWN`); every other one is dropped from all sets. Default none.
    #[serde(deserialize_with = "null_as_empty")]
    #[schemars(with = "Option<Vec<String>>")]
    pub capabilities: Vec<String>,
    /// When jailed: writable scratch paths for commands besides the roots.
    #[serde(deserialize_with = "null_as_empty")]
    #[schemars(with = "Option<Vec<String>>")]
    pub scratch_paths: Vec<String>,
    /// When jailed: paths commands may read and execute from besides the roots.
    #[serde(deserialize_with = "null_as_empty")]
    #[schemars(with = "Option<Vec<String>>")]
    pub system_paths: Vec<String>,
    /// Files and trees commands can never open, jailed or not (Landlock grants nothing at or under them; hardlinks and renames of them inherit nothing). The fs surface uses `fs.denylist_paths`. Default: the secret files of the user and group databases, `/etc/shadow`, `/etc/gshadow`, `/etc/shadow-`, `/etc/gshadow-` (the public `/etc/passwd` and `/etc/group` stay readable so tools resolve users).
    #[serde(deserialize_with = "null_as_empty")]
    #[schemars(with = "Option<Vec<String>>")]
    pub secret_paths: Vec<String>,
    /// What network commands reach: `allow` (default), `deny_bind` (no TCP bind), `loopback` (127.0.0.1 and ::1 of a namespace of their own), `deny` (no IP, packet or netlink socket at all; Unix sockets only). A call may tighten it for itself with its `network` field.
    pub network: NetworkAccess,
    /// Unprivileged user the broker drops to when started as root.
    pub broker_user: String,
    /// The user commands (and the executor's fs operations) act as when the worker runs as root: a user name or `uid[:gid]`. Unset: the owner of the primary root when jailed (`nobody` 65534:65534 when that is root, with a warning; `strict` refuses), root when unjailed. `root` in a jail is allowed only as an explicit choice (`strict` refuses it). Ignored when the worker is not root.
    pub run_as: Option<String>,
    /// Per-command resource limits.
    pub rlimits: RlimitConfig,
    /// Limits on each job's cgroup (its whole process tree), which hold for every uid,
    /// root included. They apply where the job cgroup has the controller (cgroup v2 with
    /// `pids` / `memory` delegated); `doctor` says whether it does.
    pub job_limits: JobLimitsConfig,
}

/// Limits on each job's cgroup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct JobLimitsConfig {
    /// `pids.max`: processes and threads in one job's whole tree (default 1024; null for no
    /// limit). Unlike RLIMIT_NPROC, the kernel enforces it for root too, so a fork bomb
    /// cannot use up the host's PIDs.
    pub pids_max: Option<u64>,
    /// `memory.max`: bytes of memory one job's whole tree may use (default null: no limit).
    /// Swap is not counted against it but switched off for the job (`memory.swap.max` 0,
    /// or the cgroup v1 `memsw` limit set to the same value where swap accounting is on).
    pub memory_max_bytes: Option<u64>,
    /// `cpu.max`: the share of one CPU one job's whole tree may use, in percent (100 is one
    /// whole CPU, 250 two and a half; default null: no limit). A quota per 100 ms period.
    pub cpu_max_percent: Option<u32>,
}

impl Default for JobLimitsConfig {
    fn default() -> Self {
        JobLimitsConfig {
            pids_max: Some(1024),
            memory_max_bytes: None,
            cpu_max_percent: None,
        }
    }
}

/// A parsed `confinement.run_as`: a user name, or a numeric uid with an optional gid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunAs {
    Name(String),
    Id { uid: u32, gid: Option<u32> },
}

impl RunAs {
    /// Parses `name`, `uid` or `uid:gid`.
    pub fn parse(s: &str) -> Result<RunAs, String> {
        let bad = || {
            format!(
                "confinement.run_as {s:?} is neither a user name nor uid[:gid] (e.g. \"build\" or \"1000:1000\")"
            )
        };
        if s.is_empty() {
            return Err(bad());
        }
        if s.as_bytes()[0].is_ascii_digit() {
            let (u, g) = match s.split_once(':') {
                Some((u, g)) => (u, Some(g)),
                None => (s, None),
            };
            let num = |x: &str| {
                if x.is_empty() || !x.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                x.parse::<u32>()
                    .ok()
                    .filter(|v| *v != u32::MAX)
                    .ok_or_else(bad)
            };
            let uid = num(u)?;
            let gid = g.map(num).transpose()?;
            return Ok(RunAs::Id { uid, gid });
        }
        let name_ok = s.len() <= 32
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'$'));
        if !name_ok {
            return Err(bad());
        }
        Ok(RunAs::Name(s.to_string()))
    }
}

/// Per-command resource limits; null keeps the executor's own limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RlimitConfig {
    /// RLIMIT_NPROC: processes of the command's uid.
    pub max_processes: Option<u64>,
    /// RLIMIT_AS: address space in bytes.
    pub address_space_bytes: Option<u64>,
    /// RLIMIT_FSIZE: largest file a command may write, in bytes.
    pub file_size_bytes: Option<u64>,
    /// RLIMIT_NOFILE: open files per process (default 4096).
    pub open_files: Option<u64>,
    /// RLIMIT_CPU: CPU seconds per process.
    pub cpu_seconds: Option<u64>,
}

impl Default for RlimitConfig {
    fn default() -> Self {
        RlimitConfig {
            max_processes: None,
            address_space_bytes: None,
            file_size_bytes: None,
            open_files: Some(4096),
            cpu_seconds: None,
        }
    }
}

impl Default for ConfinementConfig {
    fn default() -> Self {
        ConfinementConfig {
            mode: ConfinementMode::BestEffort,
            landlock: true,
            seccomp: true,
            seccomp_allow: Vec::new(),
            capabilities: Vec::new(),
            scratch_paths: strings(&["/tmp", "/var/tmp", "/dev/shm"]),
            system_paths: strings(&[
                "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
                "/proc", "/sys", "/run", "/dev",
            ]),
            secret_paths: default_secret_paths(),
            network: NetworkAccess::Allow,
            broker_user: "nobody".to_string(),
            run_as: None,
            rlimits: RlimitConfig::default(),
            job_limits: JobLimitsConfig::default(),
        }
    }
}

/// Environment forwarding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EnvConfig {
    /// Forward the worker's whole environment to commands. Dangerous per-call keys stay blocked either way.
    pub inherit: bool,
    /// Variables forwarded from the worker's environment when `inherit` is false. Has no effect on the per-call `env` (deny-only).
    pub allow: Vec<String>,
    /// `HOME` of every command, background job and terminal session (an absolute path, used as it is: not created). Null: jailed, the worker's own `HOME` when it lies inside a root or a scratch path, else a per-worker directory under the first scratch path that the executor creates for the command user (mode 0700); unjailed, the worker's own `HOME`. A per-call `env` can never set `HOME`.
    pub home: Option<String>,
}

/// Filesystem policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct FsConfig {
    /// Jail roots for `shell::fs::*`, exec/PTY `cwd`, `coder::*` and `shell::changed`; empty = unjailed (requires `allow_unjailed: true`). The first entry is the primary root.
    #[serde(deserialize_with = "null_as_empty")]
    #[schemars(with = "Option<Vec<String>>")]
    pub host_roots: Vec<String>,
    /// Explicit opt-in to running with no jail root; required whenever `host_roots` is empty.
    pub allow_unjailed: bool,
    /// Largest file `shell::fs::read` serves, in bytes; 0 = unlimited.
    pub max_read_bytes: u64,
    /// Largest file `shell::fs::write` accepts, in bytes; 0 = unlimited.
    pub max_write_bytes: u64,
    /// Paths the fs surface (`shell::fs::*`, `shell::workspace::*`, later `coder::*`) hides: they read exactly like missing ones (S211), with everything under them, and so do hardlinks and renamed copies of the entries that existed when the roots were last walked (matched by device and inode; the executor walks them after each policy whose roots, denylist or globs changed). Commands are governed by `confinement.secret_paths` instead. Default: `/etc/passwd`, `/etc/shadow`, `/etc/gshadow` and the `-` backups of passwd, shadow, group and gshadow.
    #[serde(deserialize_with = "null_as_empty")]
    #[schemars(with = "Option<Vec<String>>")]
    pub denylist_paths: Vec<String>,
    /// Permit setuid/setgid/sticky bits in `mode` fields.
    pub allow_special_bits: bool,
}

/// Globs of the code surface, shared with `shell::fs::*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CodeConfig {
    /// Noise-exclusion globs hidden from `coder::search` and `coder::tree` results; no access protection.
    #[serde(deserialize_with = "null_as_empty")]
    #[schemars(with = "Option<Vec<String>>")]
    pub default_exclude_globs: Vec<String>,
    /// Root-relative globs of files that are listable but never readable or writable (S211 / C211).
    #[serde(deserialize_with = "null_as_empty")]
    #[schemars(with = "Option<Vec<String>>")]
    pub non_accessible_globs: Vec<String>,
}

/// Turn change history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TurnsConfig {
    /// Directory of the durable turn history and its blob store.
    pub data_dir: String,
    /// Cap on the pre-image blob store, in bytes.
    pub max_blob_bytes: u64,
}

/// Limits of the `shell::changed` watchers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct WatchConfig {
    /// Most `shell::changed` bindings (one recursive watcher each) this worker serves at once; a binding past it is refused. Default 64.
    pub max_watchers: u32,
    /// Most distinct paths one watcher holds in its 200 ms coalescing window; past it the window collapses into one overflow signal (the root, kind `modified`, `overflow: true`). Default 4096.
    pub max_pending_paths: u32,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            max_watchers: 64,
            max_pending_paths: 4096,
        }
    }
}

/// Sandbox forwarding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// When false, every `target: sandbox` call returns S210.
    pub enabled: bool,
}

/// `key:` with no value (YAML null) reads as an empty list. The fields using it publish the
/// schema of `Option<Vec<String>>`, so the schema accepts that null too.
fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The spawn-time refusal of `shell::exec_bg` when `limit` jobs are running (host and
/// sandbox wording alike). A limit of 0 means background jobs are switched off.
pub fn job_cap_reached(limit: usize) -> String {
    if limit == 0 {
        "background jobs are disabled (max_concurrent_jobs: 0): raise max_concurrent_jobs to \
         allow shell::exec_bg, or run the command in the foreground with shell::exec"
            .to_string()
    } else {
        format!("max concurrent jobs reached ({limit} running): wait for one to finish or stop one with shell::kill")
    }
}

/// The fs surface's default `fs.denylist_paths`: the seed's `/etc/passwd` and `/etc/shadow`,
/// deliberately widened to `/etc/gshadow` and the `-` backups of all four databases (which
/// hold the same hashes as the live files).
pub fn default_denylist_paths() -> Vec<String> {
    strings(&[
        "/etc/passwd",
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/passwd-",
        "/etc/shadow-",
        "/etc/group-",
        "/etc/gshadow-",
    ])
}

/// The commands' default `confinement.secret_paths`: the files holding password hashes, and
/// only those (tools need the public `/etc/passwd` and `/etc/group` to resolve users).
pub fn default_secret_paths() -> Vec<String> {
    strings(&[
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/shadow-",
        "/etc/gshadow-",
    ])
}

/// Prefix shared by the command-shaped denylist patterns: tolerates `env [K=V]…`, `sudo`,
/// `doas`, `nohup` and `timeout [duration]` wrappers, each optionally path-qualified.
pub const WRAPPER_PREFIX: &str = r"(?i)^(?:(?:\S*/)?env(?:\s+\S+=\S*)*\s+|(?:\S*/)?(?:sudo|doas|nohup)\s+|(?:\S*/)?timeout(?:\s+\S+)?\s+)*(\S*/)?";

/// The catastrophic-only denylist of the newest seed, in order.
pub fn default_denylist_patterns() -> Vec<String> {
    let mut v = vec![r"rm\s+-rf\s+/".to_string(), r":\(\)\s*\{\s*:\|".to_string()];
    for tail in ["mkfs", r"dd\s+if=", r"shutdown\b", r"reboot\b"] {
        v.push(format!("{WRAPPER_PREFIX}{tail}"));
    }
    v.push("/etc/shadow".to_string());
    v
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            inherit: true,
            allow: strings(&["PATH", "HOME", "LANG", "LC_ALL", "TERM"]),
            home: None,
        }
    }
}

impl Default for FsConfig {
    /// Code default: no roots and no opt-in, so a config that names neither fails closed.
    fn default() -> Self {
        FsConfig {
            host_roots: Vec::new(),
            allow_unjailed: false,
            max_read_bytes: 16 * 1024 * 1024,
            max_write_bytes: 16 * 1024 * 1024,
            denylist_paths: default_denylist_paths(),
            allow_special_bits: false,
        }
    }
}

impl Default for CodeConfig {
    fn default() -> Self {
        CodeConfig {
            default_exclude_globs: strings(&[
                "**/.git/**",
                "**/node_modules/**",
                "**/target/**",
                "**/dist/**",
                "**/.venv/**",
                "**/__pycache__/**",
            ]),
            non_accessible_globs: strings(&[
                "**/.env",
                "**/.env.*",
                "**/*.pem",
                "**/*.key",
                "**/secrets/**",
            ]),
        }
    }
}

impl Default for TurnsConfig {
    fn default() -> Self {
        TurnsConfig {
            data_dir: "data/shell/turns".to_string(),
            max_blob_bytes: 256 * 1024 * 1024,
        }
    }
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig { enabled: true }
    }
}

impl Default for Config {
    /// Code defaults, used for keys a partial config leaves out.
    fn default() -> Self {
        Config {
            max_timeout_ms: 120_000,
            max_bg_timeout_ms: 0,
            default_timeout_ms: 10_000,
            max_output_bytes: 1024 * 1024,
            env: EnvConfig::default(),
            denylist_patterns: default_denylist_patterns(),
            max_concurrent_jobs: 16,
            job_retention_secs: 3600,
            fs: FsConfig::default(),
            code: CodeConfig::default(),
            turns: TurnsConfig::default(),
            watch: WatchConfig::default(),
            sandbox: SandboxConfig::default(),
            working_dir: None,
            confinement: ConfinementConfig::default(),
            pty: PtyConfig::default(),
            jobs: JobsConfig::default(),
            telemetry: TelemetryConfig::default(),
        }
    }
}

impl Config {
    /// The built-in zero-config default: what the shipped `config.yaml` says. Unjailed (with the
    /// explicit opt-in), env forwarded, catastrophic-only denylist.
    pub fn builtin_default() -> Config {
        let mut c = Config {
            default_timeout_ms: 30_000,
            ..Config::default()
        };
        c.fs.allow_unjailed = true;
        c
    }

    /// Parses YAML (a `--config` file or `check-config` input) and validates it.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        let value: Value = serde_norway::from_str(text)
            .map_err(|e| ConfigError(format!("config is not valid YAML: {e}")))?;
        Config::from_value(&value)
    }

    /// Parses a JSON value (the stored configuration) and validates it. A null value is
    /// refused: a nulled store never falls back to a default.
    pub fn from_value(value: &Value) -> Result<Config, ConfigError> {
        if value.is_null() {
            return Err(ConfigError(
                "configuration value is null: refusing to fall back to a default".into(),
            ));
        }
        if !value.is_object() {
            return Err(ConfigError("configuration value must be an object".into()));
        }
        reject_removed_keys(value)?;
        let config: Config = serde_json::from_value(value.clone())
            .map_err(|e| ConfigError(format!("invalid configuration: {e}")))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the rules that serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.fs.host_roots.is_empty() && !self.fs.allow_unjailed {
            return Err(ConfigError(
                "fs.host_roots is empty and fs.allow_unjailed is not true: refusing to start \
                 unjailed (set fs.host_roots to at least one directory, or set \
                 fs.allow_unjailed: true)"
                    .into(),
            ));
        }
        for root in &self.fs.host_roots {
            if !root.starts_with('/') {
                return Err(ConfigError(format!(
                    "fs.host_roots entry {root:?} must be an absolute path"
                )));
            }
        }
        for p in &self.fs.denylist_paths {
            if !p.starts_with('/') {
                return Err(ConfigError(format!(
                    "fs.denylist_paths entry {p:?} must be an absolute path"
                )));
            }
        }
        for p in &self.confinement.secret_paths {
            if !p.starts_with('/') {
                return Err(ConfigError(format!(
                    "confinement.secret_paths entry {p:?} must be an absolute path"
                )));
            }
        }
        if self.confinement.job_limits.cpu_max_percent == Some(0) {
            return Err(ConfigError(
                "confinement.job_limits.cpu_max_percent is 0: a job could never run (use at \
                 least 1, or null for no limit)"
                    .into(),
            ));
        }
        for (i, p) in self.denylist_patterns.iter().enumerate() {
            if p.is_empty() {
                return Err(ConfigError(format!("denylist_patterns[{i}] is empty")));
            }
            regex::Regex::new(p).map_err(|e| {
                ConfigError(format!("denylist_patterns[{i}] is not a valid regex: {e}"))
            })?;
        }
        for (key, globs) in [
            ("code.non_accessible_globs", &self.code.non_accessible_globs),
            (
                "code.default_exclude_globs",
                &self.code.default_exclude_globs,
            ),
        ] {
            for g in globs {
                globset::Glob::new(g).map_err(|e| {
                    ConfigError(format!("{key} entry {g:?} is not a valid glob: {e}"))
                })?;
            }
        }
        for (i, k) in self.env.allow.iter().enumerate() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(ConfigError(format!(
                    "env.allow[{i}] {k:?} is not a variable name"
                )));
            }
        }
        if let Some(h) = &self.env.home {
            if !h.starts_with('/') || h.contains('\0') {
                return Err(ConfigError(format!(
                    "env.home {h:?} must be an absolute path (or null for the default)"
                )));
            }
        }
        if self.working_dir.as_deref().is_some_and(str::is_empty) {
            return Err(ConfigError(
                "working_dir is empty: set a directory, or null for the worker's own".into(),
            ));
        }
        if self.turns.data_dir.is_empty() {
            return Err(ConfigError("turns.data_dir is empty".into()));
        }
        if self.pty.max_sessions_per_caller == 0 {
            return Err(ConfigError(
                "pty.max_sessions_per_caller is 0: set at least 1 (no caller could open a terminal)"
                    .into(),
            ));
        }
        if self.max_timeout_ms == 0 {
            return Err(ConfigError("max_timeout_ms must be greater than 0".into()));
        }
        for (key, value) in [
            ("jobs.max_write_bytes", self.jobs.max_write_bytes),
            ("jobs.output_buffer_bytes", self.jobs.output_buffer_bytes),
            ("jobs.max_waiters", self.jobs.max_waiters.into()),
        ] {
            if value == 0 {
                return Err(ConfigError(format!("{key} is 0: set at least 1")));
            }
        }
        if let Some(r) = &self.confinement.run_as {
            RunAs::parse(r).map_err(ConfigError)?;
        }
        if !(1_000..=3_600_000).contains(&self.telemetry.metrics_interval_ms) {
            return Err(ConfigError(format!(
                "telemetry.metrics_interval_ms is {}: it must be between 1000 and 3600000",
                self.telemetry.metrics_interval_ms
            )));
        }
        Ok(())
    }

    /// `self` with a relative `working_dir` and `turns.data_dir` resolved against `base`
    /// (the worker's working directory at start-up). Lexical: `.` components are dropped,
    /// `..` is kept for the kernel to resolve. Absolute paths are unchanged.
    pub fn resolved_against(&self, base: &std::path::Path) -> Config {
        let mut c = self.clone();
        if let Some(wd) = &c.working_dir {
            c.working_dir = Some(resolve_path(base, wd));
        }
        c.turns.data_dir = resolve_path(base, &c.turns.data_dir);
        c
    }

    /// Refuses a relative `working_dir` or `turns.data_dir`: the executor only takes a
    /// configuration the broker has already resolved ([`Config::resolved_against`]).
    pub fn require_resolved(&self) -> Result<(), ConfigError> {
        let relative = |key: &str, p: &str| {
            ConfigError(format!(
                "{key} {p:?} is relative: the broker resolves it against the worker's \
                 start-up directory before the executor sees it"
            ))
        };
        if let Some(wd) = &self.working_dir {
            if !wd.starts_with('/') {
                return Err(relative("working_dir", wd));
            }
        }
        if !self.turns.data_dir.starts_with('/') {
            return Err(relative("turns.data_dir", &self.turns.data_dir));
        }
        Ok(())
    }
}

/// `p` joined to `base` when relative, without `.` components.
fn resolve_path(base: &std::path::Path, p: &str) -> String {
    use std::path::{Component, PathBuf};
    let joined = base.join(p);
    let mut out = PathBuf::new();
    for c in joined.components() {
        if c != Component::CurDir {
            out.push(c);
        }
    }
    out.to_string_lossy().into_owned()
}

/// Refuses keys removed in 0.7.0 and 0.8.0 with the seeds' migration hints.
fn reject_removed_keys(v: &Value) -> Result<(), ConfigError> {
    let obj = match v.as_object() {
        Some(o) => o,
        None => return Ok(()),
    };
    let mut env_moves = Vec::new();
    if obj.contains_key("inherit_env") {
        env_moves.push("`inherit_env` -> `env.inherit`");
    }
    if obj.contains_key("allowed_env") {
        env_moves.push("`allowed_env` -> `env.allow`");
    }
    if !env_moves.is_empty() {
        return Err(ConfigError(format!(
            "config keys removed in 0.7.0: {} (nest them under one `env:` block; there are no legacy aliases)",
            env_moves.join(", ")
        )));
    }
    if let Some(env) = obj.get("env").and_then(Value::as_object) {
        for old in ["inherit_env", "allowed_env"] {
            if env.contains_key(old) {
                return Err(ConfigError(format!(
                    "config keys removed in 0.7.0: `env.{old}` is a half-migration; the `env` block takes `inherit` and `allow` (`inherit_env` -> `env.inherit`, `allowed_env` -> `env.allow`)"
                )));
            }
        }
    }
    if obj
        .get("fs")
        .and_then(Value::as_object)
        .is_some_and(|fs| fs.contains_key("host_root"))
    {
        return Err(ConfigError(
            "config key removed in 0.7.0: `fs.host_root` -> `fs.host_roots` (one-entry list)"
                .into(),
        ));
    }
    if obj
        .get("code")
        .and_then(Value::as_object)
        .is_some_and(|c| c.contains_key("base_path") || c.contains_key("base_paths"))
    {
        return Err(ConfigError(
            "config keys removed in 0.7.0: `code.base_path` / `code.base_paths` (they never had an effect); set the jail once via `fs.host_roots`".into(),
        ));
    }
    if obj.contains_key("migrated_from_coder") {
        return Err(ConfigError(
            "config key removed in 0.7.0: `migrated_from_coder` (the one-shot coder->shell migration marker is gone); delete it from the stored value".into(),
        ));
    }
    if obj.contains_key("allowlist") {
        return Err(ConfigError(
            "`allowlist` (removed in 0.8.0, no replacement): the shell is deny-only and allow/ask policy lives in the approval-gate; delete the key from the stored value or seed file".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn run_as_parses_names_and_ids_exactly() {
        assert_eq!(RunAs::parse("build"), Ok(RunAs::Name("build".into())));
        assert_eq!(RunAs::parse("root"), Ok(RunAs::Name("root".into())));
        assert_eq!(
            RunAs::parse("1000"),
            Ok(RunAs::Id {
                uid: 1000,
                gid: None
            })
        );
        assert_eq!(
            RunAs::parse("1000:2000"),
            Ok(RunAs::Id {
                uid: 1000,
                gid: Some(2000)
            })
        );
        assert_eq!(
            RunAs::parse("0:0"),
            Ok(RunAs::Id {
                uid: 0,
                gid: Some(0)
            })
        );
        for bad in [
            "",
            "1000:",
            ":1000",
            "10x",
            "1000:abc",
            "4294967295",
            "99999999999",
            "a b",
            "a/b",
            "1:2:3",
        ] {
            assert!(RunAs::parse(bad).is_err(), "{bad:?} parsed");
        }
        let err = Config::from_value(&json!({
            "fs": {"host_roots": ["/tmp"]},
            "confinement": {"run_as": "x:y z"}
        }))
        .unwrap_err();
        assert!(err.0.contains("confinement.run_as"), "{err}");
        // Older configurations (no key) still load, with the key unset.
        let old = Config::from_value(&json!({"fs": {"host_roots": ["/tmp"]}})).unwrap();
        assert_eq!(old.confinement.run_as, None);
    }

    #[test]
    fn a_pinned_run_as_cannot_be_changed_by_a_reload() {
        let mut env = Config::builtin_default();
        env.confinement.run_as = Some("1000".into());
        let mut n = env.clone();
        assert!(crate::widening::widening(&env, &n).is_empty());
        n.confinement.run_as = Some("root".into());
        assert_eq!(
            crate::widening::describe(&crate::widening::widening(&env, &n)),
            "confinement.run_as is Some(\"root\"), not Some(\"1000\")"
        );
    }

    #[test]
    fn shipped_config_is_the_builtin_default() {
        let shipped = Config::from_yaml(SHIPPED_CONFIG_YAML).expect("shipped config parses");
        assert_eq!(shipped, Config::builtin_default());
        assert_eq!(shipped.denylist_patterns.len(), 7);
    }

    #[test]
    fn telemetry_is_on_by_default_and_its_interval_is_bounded() {
        let c = Config::from_value(&serde_json::json!({"fs": {"allow_unjailed": true}})).unwrap();
        assert_eq!(
            c.telemetry,
            TelemetryConfig {
                enabled: true,
                logs_level: TelemetryLogLevel::Warn,
                metrics_interval_ms: 10_000,
            }
        );
        let with = |t: serde_json::Value| {
            Config::from_value(&serde_json::json!({"fs": {"allow_unjailed": true}, "telemetry": t}))
        };
        let off = with(serde_json::json!({"enabled": false, "logs_level": "info"})).unwrap();
        assert!(!off.telemetry.enabled);
        assert_eq!(off.telemetry.logs_level, TelemetryLogLevel::Info);
        for (ms, ok) in [
            (999, false),
            (1000, true),
            (3_600_000, true),
            (3_600_001, false),
        ] {
            let r = with(serde_json::json!({"metrics_interval_ms": ms}));
            assert_eq!(r.is_ok(), ok, "{ms}: {r:?}");
        }
        assert_eq!(
            with(serde_json::json!({"metrics_interval_ms": 5}))
                .unwrap_err()
                .0,
            "telemetry.metrics_interval_ms is 5: it must be between 1000 and 3600000"
        );
        assert!(with(serde_json::json!({"logs_level": "debug"})).is_err());
        assert!(
            with(serde_json::json!({"endpoint": "x"})).is_err(),
            "unknown keys are refused"
        );
    }

    #[test]
    fn pty_limits_have_code_defaults_and_older_configs_still_load() {
        // A configuration written before the `pty` section existed.
        let old = Config::from_value(&json!({"fs": {"allow_unjailed": true}})).unwrap();
        assert_eq!(
            old.pty,
            PtyConfig {
                max_sessions: 32,
                exited_retention_secs: 3600,
                detached_retention_secs: 86_400,
                max_sessions_per_caller: 16,
                adopt: PtyAdopt::Any,
            }
        );
        let narrowed = Config::from_value(&json!({"fs": {"allow_unjailed": true},
            "pty": {"adopt": "opener", "max_sessions_per_caller": 4}}))
        .unwrap();
        assert_eq!(narrowed.pty.adopt, PtyAdopt::Opener);
        assert_eq!(narrowed.pty.max_sessions_per_caller, 4);
        let off =
            Config::from_value(&json!({"fs": {"allow_unjailed": true}, "pty": {"adopt": "off"}}))
                .unwrap();
        assert_eq!(off.pty.adopt, PtyAdopt::Off);
        assert!(Config::from_value(
            &json!({"fs": {"allow_unjailed": true}, "pty": {"adopt": "anyone"}})
        )
        .is_err());
        let zero = Config::from_value(
            &json!({"fs": {"allow_unjailed": true}, "pty": {"max_sessions_per_caller": 0}}),
        )
        .unwrap_err();
        assert!(
            zero.0.starts_with("pty.max_sessions_per_caller is 0"),
            "{zero}"
        );
        let part = Config::from_value(
            &json!({"fs": {"allow_unjailed": true}, "pty": {"max_sessions": 2}}),
        )
        .unwrap();
        assert_eq!(part.pty.max_sessions, 2);
        assert_eq!(part.pty.exited_retention_secs, 3600);
        let e =
            Config::from_value(&json!({"fs": {"allow_unjailed": true}, "pty": {"max_session": 2}}))
                .unwrap_err();
        assert!(e.0.contains("max_session"), "{e}");
    }

    #[test]
    fn code_defaults_fail_closed() {
        let err = Config::from_value(&json!({})).unwrap_err();
        assert!(err.0.starts_with("fs.host_roots is empty"), "{err}");
        assert!(err.0.contains("refusing to start unjailed"), "{err}");
        let ok = Config::from_value(&json!({"fs": {"host_roots": ["/tmp"]}})).unwrap();
        assert_eq!(ok.default_timeout_ms, 10_000);
    }

    #[test]
    fn removed_keys_are_rejected_with_hints() {
        let unjailed = json!({"allow_unjailed": true});
        let cases = [
            (
                json!({"inherit_env": true, "fs": unjailed}),
                "config keys removed in 0.7.0: `inherit_env` -> `env.inherit`",
            ),
            (
                json!({"allowed_env": ["PATH"], "fs": unjailed}),
                "`allowed_env` -> `env.allow`",
            ),
            (
                json!({"env": {"inherit_env": true}, "fs": unjailed}),
                "half-migration",
            ),
            (
                json!({"fs": {"host_root": "/srv", "allow_unjailed": true}}),
                "config key removed in 0.7.0: `fs.host_root` -> `fs.host_roots` (one-entry list)",
            ),
            (
                json!({"code": {"base_path": "/x"}, "fs": unjailed}),
                "`code.base_path` / `code.base_paths`",
            ),
            (
                json!({"code": {"base_paths": ["/x"]}, "fs": unjailed}),
                "`fs.host_roots`",
            ),
            (
                json!({"migrated_from_coder": true, "fs": unjailed}),
                "`migrated_from_coder`",
            ),
            (
                json!({"allowlist": [], "fs": unjailed}),
                "`allowlist` (removed in 0.8.0, no replacement)",
            ),
        ];
        for (value, want) in cases {
            let err = Config::from_value(&value).unwrap_err();
            assert!(err.0.contains(want), "{value}: {err}");
        }
    }

    #[test]
    fn unknown_keys_and_null_are_rejected() {
        assert!(
            Config::from_value(&json!({"fs": {"allow_unjailed": true}, "max_timout_ms": 5}))
                .is_err()
        );
        assert!(Config::from_value(&json!({"fs": {"allow_unjailed": true, "jail": "/"}})).is_err());
        assert!(Config::from_value(&Value::Null)
            .unwrap_err()
            .0
            .contains("null"));
        assert!(Config::from_value(
            &json!({"fs": {"allow_unjailed": true}, "denylist_patterns": ["("]})
        )
        .is_err());
    }

    #[test]
    fn relative_paths_resolve_against_the_start_up_directory() {
        let c = Config::from_yaml(
            "fs: {allow_unjailed: true}\nworking_dir: ./data\nturns: {data_dir: data/shell/turns}\n",
        )
        .expect("a relative working_dir is accepted as written");
        assert_eq!(c.working_dir.as_deref(), Some("./data"));
        let err = c.require_resolved().unwrap_err();
        assert!(
            err.0.starts_with("working_dir \"./data\" is relative"),
            "{err}"
        );
        let r = c.resolved_against(std::path::Path::new("/srv/w"));
        assert_eq!(r.working_dir.as_deref(), Some("/srv/w/data"));
        assert_eq!(r.turns.data_dir, "/srv/w/data/shell/turns");
        assert_eq!(r.require_resolved(), Ok(()));
        // Absolute paths and `..` are left to the kernel; null stays null.
        let mut abs = c.clone();
        abs.working_dir = Some("/x/./y".into());
        abs.turns.data_dir = "../t".into();
        let r = abs.resolved_against(std::path::Path::new("/srv/w"));
        assert_eq!(r.working_dir.as_deref(), Some("/x/y"));
        assert_eq!(r.turns.data_dir, "/srv/w/../t");
        let mut none = c;
        none.working_dir = None;
        assert_eq!(
            none.resolved_against(std::path::Path::new("/b"))
                .working_dir,
            None
        );
        // Only relative paths change: resolving twice is resolving once.
        assert_eq!(r.resolved_against(std::path::Path::new("/other")), r);
        assert!(Config::from_yaml("fs: {allow_unjailed: true}\nworking_dir: ''\n").is_err());
    }

    #[test]
    fn env_home_is_optional_absolute_and_older_configs_load() {
        // The original worker's configurations have no `env.home`.
        let old = Config::from_value(
            &json!({"fs": {"host_roots": ["/tmp"]}, "env": {"inherit": false, "allow": ["PATH", "HOME"]}}),
        )
        .unwrap();
        assert_eq!(old.env.home, None);
        assert_eq!(Config::builtin_default().env.home, None);
        let set = Config::from_value(
            &json!({"fs": {"host_roots": ["/tmp"]}, "env": {"home": "/srv/app/.home"}}),
        )
        .unwrap();
        assert_eq!(set.env.home.as_deref(), Some("/srv/app/.home"));
        // Setting it keeps the other env defaults.
        assert!(set.env.inherit);
        for bad in ["", "home", "~/x", "/a\0b"] {
            let e =
                Config::from_value(&json!({"fs": {"host_roots": ["/tmp"]}, "env": {"home": bad}}))
                    .unwrap_err();
            assert_eq!(
                e.0,
                format!("env.home {bad:?} must be an absolute path (or null for the default)")
            );
        }
        assert!(Config::from_value(
            &json!({"fs": {"host_roots": ["/tmp"]}, "env": {"hmoe": "/x"}})
        )
        .unwrap_err()
        .0
        .contains("hmoe"));
    }

    #[test]
    fn job_cap_messages() {
        assert_eq!(
            job_cap_reached(0),
            "background jobs are disabled (max_concurrent_jobs: 0): raise max_concurrent_jobs \
             to allow shell::exec_bg, or run the command in the foreground with shell::exec"
        );
        assert_eq!(
            job_cap_reached(2),
            "max concurrent jobs reached (2 running): wait for one to finish or stop one with shell::kill"
        );
    }

    #[test]
    fn secret_defaults_exact_values() {
        let c = Config::builtin_default();
        assert_eq!(
            c.fs.denylist_paths,
            [
                "/etc/passwd",
                "/etc/shadow",
                "/etc/gshadow",
                "/etc/passwd-",
                "/etc/shadow-",
                "/etc/group-",
                "/etc/gshadow-"
            ]
        );
        assert_eq!(
            c.confinement.secret_paths,
            [
                "/etc/shadow",
                "/etc/gshadow",
                "/etc/shadow-",
                "/etc/gshadow-"
            ]
        );
        // The original's configs have no `secret_paths`: they load with the default.
        let old = Config::from_value(&json!({"fs": {"allow_unjailed": true,
            "denylist_paths": ["/etc/passwd", "/etc/shadow"]}, "confinement": {"landlock": true}}))
        .unwrap();
        assert_eq!(old.confinement.secret_paths, default_secret_paths());
        assert!(Config::from_value(
            &json!({"fs": {"allow_unjailed": true}, "confinement": {"secret_paths": ["etc/shadow"]}})
        )
        .unwrap_err()
        .0
        .contains("confinement.secret_paths entry"));
        let mut lost = c.clone();
        lost.confinement.secret_paths.clear();
        let why = crate::widening::describe(&crate::widening::widening(&c, &lost));
        assert!(
            why.contains("confinement.secret_paths lost /etc/shadow"),
            "{why}"
        );
        assert!(
            why.contains("confinement.secret_paths lost /etc/gshadow"),
            "{why}"
        );
    }

    #[test]
    fn yaml_null_lists_are_empty() {
        let c = Config::from_yaml("fs:\n  host_roots:\n  allow_unjailed: true\n").unwrap();
        assert!(c.fs.host_roots.is_empty());
    }
}
