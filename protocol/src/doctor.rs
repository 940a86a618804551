//! What `iii-shell doctor` reports about each half and about commands.

use serde::{Deserialize, Serialize};

/// The confinement state of one process, as it reads it back from the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessReport {
    pub role: String,
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub cap_effective: Vec<String>,
    pub cap_permitted: Vec<String>,
    pub cap_inheritable: Vec<String>,
    pub cap_bounding: Vec<String>,
    pub cap_ambient: Vec<String>,
    pub no_new_privs: bool,
    /// 0 none, 1 strict, 2 filter.
    pub seccomp_mode: u32,
    pub seccomp: String,
    pub landlock: String,
    pub dumpable: bool,
    pub subreaper: bool,
    /// Checks that must fail for a confined process, with what happened.
    pub checks: Vec<(String, String)>,
    pub problems: Vec<String>,
}

/// How commands are confined under the current policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandReport {
    pub mode: String,
    pub jailed: bool,
    pub landlock_abi: i32,
    pub landlock: String,
    pub landlock_rules: u64,
    pub scoping: bool,
    pub network: String,
    pub seccomp_denied: Vec<String>,
    pub rlimits: Vec<(String, u64)>,
    pub cgroups: bool,
    /// How a child gets into its job cgroup: `clone3` (created inside it) or `cgroup.procs`
    /// (joins by a write, which waits for an RCU grace period), as the probe command found.
    pub cgroup_entry: String,
    /// Whether `shell::exec` starts commands in pre-started processes: `on`, `off`
    /// (`--no-prestart`), or `unavailable` (no clone3 with `CLONE_INTO_CGROUP` here).
    #[serde(default)]
    pub prestart: String,
    /// What a real command saw (`/proc/self/status` lines, `Uid`/`Gid`/`Groups` included),
    /// run through the spawn path.
    pub observed: Vec<String>,
    /// The user commands act as (`confinement.run_as`), and why.
    #[serde(default)]
    pub user: String,
    /// Whether a command could change the mode of a file it does not own, as a real command
    /// found (`yes …` / `no …`).
    #[serde(default)]
    pub foreign_chmod: String,
    /// The start-up warning about the command user, if any (doctor shows it too).
    #[serde(default)]
    pub run_as_warning: Option<String>,
    /// Which process and memory limits bind a command (`pids.max`, `memory.max`,
    /// `RLIMIT_NPROC`), each with what holds and why not where it does not.
    #[serde(default)]
    pub process_limits: Vec<(String, String)>,
    /// Whether anything bounds how many processes one command may start.
    #[serde(default)]
    pub processes_bounded: bool,
    /// The `HOME` commands, jobs and terminal sessions get, and where it comes from
    /// (`env.home`, the worker's own, the per-worker default).
    #[serde(default)]
    pub home: String,
    /// Where a command without a `cwd` starts, and why (`working_dir`, the primary root, the
    /// executor's own working directory).
    #[serde(default)]
    pub cwd: String,
    pub gaps: Vec<String>,
    /// The shell a terminal session without a program starts, and why terminals act as the
    /// user they do when the worker is root and they are not.
    #[serde(default)]
    pub terminal: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoctorReport {
    pub executor: ProcessReport,
    pub commands: CommandReport,
    /// Summary of the pinned envelope, if the executor has one.
    pub envelope: Option<String>,
    /// What background jobs hold now, and the caps on finished ones.
    pub jobs: JobsReport,
}

/// Background jobs in the executor: what is kept, and the caps on finished jobs (beyond
/// either, the oldest finished job is dropped first).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobsReport {
    pub running: u64,
    pub finished: u64,
    pub finished_bytes: u64,
    pub finished_max: u64,
    pub finished_max_bytes: u64,
    /// Finished jobs dropped by the caps since the executor started.
    pub evicted: u64,
}
