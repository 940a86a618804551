//! Public JSON types of `shell::exec`, `shell::exec_bg`, `shell::status`, `shell::list` and
//! `shell::kill`, exactly as the ide 0.12.9 registry page publishes them.
//!
//! Response types are also carried over the executor socket, so they use no serde attribute
//! that a non-self-describing format (postcard) cannot round-trip.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// Where a command or fs operation runs. (A plain comment, not a doc comment: the published
// `Target` definition carries no description.)
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Target {
    #[default]
    Host,
    Sandbox {
        #[schemars(extend("format" = "uuid"))]
        sandbox_id: String,
    },
}

fn default_target() -> Target {
    Target::Host
}

/// Wire request for `shell::exec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ExecRequest")]
pub struct ExecRequest {
    /// Program name (PATH-resolved) or path to an executable, as a string; put arguments in `args`.
    pub command: String,
    /// Arguments, in order (all strings). Omit/null to tokenize `command` shell-words style; pass an array (even empty) to use it verbatim.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// Working directory (host only, S210 on sandbox); jail-confined like shell::fs::* paths (S215 on escape), must be an existing directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Per-call env values (host only, S210 on sandbox); exec-hijacking keys (PATH, IFS, HOME, LD_*/DYLD_*, …) reject the whole call S210.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Bytes written to the program's stdin, then EOF (host only, S210 on sandbox); omit to leave stdin at /dev/null.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Where to run the command. Defaults to the host worker; pass `{ kind: "sandbox", sandbox_id }` to forward the call to a microVM.
    #[serde(default = "default_target")]
    pub target: Target,
    /// Per-call timeout in milliseconds, capped at the configured max; negative or fractional values fall back to the default.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// What network the command may reach, only ever tighter than the configured `confinement.network` (host only, S210 on sandbox): `allow` < `deny_bind` < `loopback` < `deny`; a wider value is S210.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::config::NetworkAccess>,
    /// Tighter limits for this command's job (host only, S210 on sandbox): memory_max_bytes, cpu_max_percent, pids_max; each at most the worker's confinement.job_limits (S210 naming the field above it).
    #[serde(default)]
    pub limits: Option<iii_shell_policy::call_limits::CallLimits>,
}

/// Wire request for `shell::exec_bg`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ExecBgRequest")]
pub struct ExecBgRequest {
    /// Program name (PATH-resolved) or path to an executable, as a string; put arguments in `args`.
    pub command: String,
    /// Arguments, in order (all strings). Omit/null to tokenize `command` shell-words style; pass an array (even empty) to use it verbatim.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// Working directory (host only, S210 on sandbox); jail-confined like shell::fs::* paths (S215 on escape), must be an existing directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Per-call env values (host only, S210 on sandbox); exec-hijacking keys (PATH, IFS, HOME, LD_*/DYLD_*, …) reject the whole call S210.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Bytes written to the program's stdin, then EOF (host only, S210 on sandbox); omit to leave stdin at /dev/null.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Where to run: the host (default) or { kind: "sandbox", sandbox_id }.
    #[serde(default = "default_target")]
    pub target: Target,
    /// Per-call timeout in milliseconds; ignored by host background jobs, forwarded to sandbox targets.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// What network the command may reach, only ever tighter than the configured `confinement.network` (host only, S210 on sandbox): `allow` < `deny_bind` < `loopback` < `deny`; a wider value is S210.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::config::NetworkAccess>,
    /// Tighter limits for this command's job (host only, S210 on sandbox): memory_max_bytes, cpu_max_percent, pids_max; each at most the worker's confinement.job_limits (S210 naming the field above it).
    #[serde(default)]
    pub limits: Option<iii_shell_policy::call_limits::CallLimits>,
}

impl From<ExecBgRequest> for ExecRequest {
    fn from(r: ExecBgRequest) -> Self {
        ExecRequest {
            command: r.command,
            args: r.args,
            cwd: r.cwd,
            env: r.env,
            stdin: r.stdin,
            target: r.target,
            timeout_ms: r.timeout_ms,
            network: r.network,
            limits: r.limits,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ExecResponse")]
pub struct ExecResponse {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}

impl ExecResponse {
    /// A call that timed out before producing anything: no output, no exit code.
    pub fn timed_out_empty(duration_ms: u64) -> ExecResponse {
        ExecResponse {
            stdout: String::new(),
            stderr: String::new(),
            exit_code: None,
            timed_out: true,
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ExecBgResponse")]
pub struct ExecBgResponse {
    pub job_id: String,
    pub argv: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    Running,
    Finished,
    Killed,
    Failed,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Running => "running",
            JobStatus::Finished => "finished",
            JobStatus::Killed => "killed",
            JobStatus::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct JobRecord {
    pub id: String,
    pub argv: Vec<String>,
    pub status: JobStatus,
    pub exit_code: Option<i32>,
    pub started_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// `shell::list` returns one `JobSummary` per record. argv, stdout, and stderr are deliberately omitted: the global JOBS map is process-wide and has no per-caller scope, so any caller could otherwise read every other caller's command line and captured output (which may embed credentials). Full records remain reachable via `shell::status <job_id>` — the random UUID acts as an unguessable capability for that record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct JobSummary {
    pub id: String,
    pub status: JobStatus,
    pub exit_code: Option<i32>,
    pub started_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "StatusRequest")]
pub struct StatusRequest {
    pub job_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "StatusResponse")]
pub struct StatusResponse {
    pub job: JobRecord,
}

/// `shell::list` takes no arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ListRequest")]
pub struct ListRequest {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ListResponse")]
pub struct ListResponse {
    pub count: usize,
    pub jobs: Vec<JobSummary>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "KillRequest")]
pub struct KillRequest {
    pub job_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "KillResponse")]
pub struct KillResponse {
    pub job_id: String,
    pub killed: bool,
    pub status: JobStatus,
    pub reason: Option<String>,
}
