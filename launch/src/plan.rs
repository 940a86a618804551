//! What a spawn is given, built in the parent before any clone: the program, argv and
//! environment as C strings ([`SpawnPlan`], [`ExecImage`], [`EnvBlock`]), the descriptors,
//! the job cgroup to start in ([`CgroupTarget`]) and the confinement the child applies to
//! itself ([`ChildConfinement`]). Plain data: nothing here makes a system call.

use std::ffi::CString;
use std::os::fd::{OwnedFd, RawFd};

/// Where a child starts: a job cgroup, given both ways the kernel can put a new process there.
///
/// `dir` (the cgroup directory, `O_PATH`) is for `clone3(CLONE_INTO_CGROUP)`, which creates the
/// child directly inside the cgroup. `procs` (its `cgroup.procs`, open for writing) is the
/// fallback where clone3 is unavailable: the child writes "0" to it before execve. That write
/// takes the cgroup threadgroup lock for writing, which waits for an RCU grace period
/// (milliseconds on an idle machine), so it is only used when clone3 cannot be.
///
/// `v1_procs` (-1 for none) are the `cgroup.procs` of the job's twins in the cgroup v1
/// `pids`, `memory` and `cpu` hierarchies ([`crate::pids_v1`]): the child always writes "0"
/// to each, clone3 or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupTarget {
    pub dir: RawFd,
    pub procs: RawFd,
    pub v1_procs: [RawFd; 3],
}

/// How many `cgroup.procs` a child may join: its v2 job cgroup and three v1 twins.
pub const JOINS: usize = 4;

impl CgroupTarget {
    /// What the child joins when clone3 started it in the v2 cgroup: the v1 twins only.
    pub fn v1_joins(target: Option<CgroupTarget>) -> [RawFd; JOINS] {
        let v1 = target.map_or([-1; 3], |c| c.v1_procs);
        [-1, v1[0], v1[1], v1[2]]
    }
}

/// Everything a spawn needs, prepared in the parent.
pub struct SpawnPlan {
    pub(crate) program: CString,
    argv: Vec<CString>,
    base_env: std::sync::Arc<EnvBlock>,
    extra_env: EnvBlock,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub cwd: Option<OwnedFd>,
    /// The job cgroup the child starts in (see [`CgroupTarget`]).
    pub cgroup: Option<CgroupTarget>,
    /// Confinement applied in the child just before execve.
    pub confinement: ChildConfinement,
    /// stdin is a terminal (a PTY slave) that becomes the child's controlling terminal
    /// (`TIOCSCTTY`, after `setsid`).
    pub controlling_tty: bool,
}

/// What the child applies to itself before execve. Built in the parent, per policy.
#[derive(Clone, Default)]
pub struct ChildConfinement {
    pub rlimits: iii_shell_confine::Rlimits,
    pub no_new_privs: bool,
    /// A Landlock ruleset fd (raw, owned by the policy, which outlives the spawn).
    pub landlock_fd: Option<i32>,
    /// The seccomp program (kept alive by the Arc while the child uses it).
    pub seccomp: Option<std::sync::Arc<iii_shell_confine::seccomp::Filter>>,
}

/// An environment turned into `KEY=value` C strings once, to be shared by many spawns (the
/// policy's forwarded base environment).
#[derive(Debug, Default)]
pub struct EnvBlock {
    entries: Vec<(String, CString)>,
}

impl EnvBlock {
    pub fn new(env: impl IntoIterator<Item = (String, String)>) -> std::io::Result<EnvBlock> {
        let entries = env
            .into_iter()
            .map(|(k, v)| Ok((k.clone(), nul(&format!("{k}={v}"))?)))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(EnvBlock { entries })
    }
}

fn nul(s: &str) -> std::io::Result<CString> {
    CString::new(s).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

/// The program, argv and environment overrides as C strings.
fn c_strings(
    program: &str,
    argv: &[String],
    overrides: &[(String, String)],
) -> std::io::Result<(CString, Vec<CString>, EnvBlock)> {
    let program = nul(program)?;
    let argv = argv.iter().map(|a| nul(a)).collect::<Result<Vec<_>, _>>()?;
    let extra = EnvBlock::new(overrides.iter().cloned())?;
    Ok((program, argv, extra))
}

impl SpawnPlan {
    pub fn new(
        program: &str,
        argv: &[String],
        env: impl IntoIterator<Item = (String, String)>,
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
    ) -> std::io::Result<SpawnPlan> {
        let base = std::sync::Arc::new(EnvBlock::new(env)?);
        Self::with_env(program, argv, base, &[], stdin, stdout, stderr)
    }

    /// A plan whose environment is `base` with `overrides` replacing or adding keys.
    pub fn with_env(
        program: &str,
        argv: &[String],
        base: std::sync::Arc<EnvBlock>,
        overrides: &[(String, String)],
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
    ) -> std::io::Result<SpawnPlan> {
        let (program, argv, extra) = c_strings(program, argv, overrides)?;
        Ok(SpawnPlan {
            program,
            argv,
            base_env: base,
            extra_env: extra,
            stdin,
            stdout,
            stderr,
            cwd: None,
            cgroup: None,
            confinement: ChildConfinement::default(),
            controlling_tty: false,
        })
    }

    pub(crate) fn argv_ptrs(&self) -> Vec<*const libc::c_char> {
        argv_ptrs(&self.argv)
    }

    pub(crate) fn envp(&self) -> Vec<*const libc::c_char> {
        envp(&self.base_env, &self.extra_env)
    }
}

/// Pointers to every argument, NULL-terminated.
/// A [`SpawnPlan`] as plain values, for tests and logs: what runs, with what, where, and
/// under which confinement (descriptors as numbers, the cwd only as present or not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSummary {
    pub program: String,
    pub argv: Vec<String>,
    /// `KEY=value`, in the order the command sees them.
    pub env: Vec<String>,
    pub cwd: bool,
    pub cgroup: Option<CgroupTarget>,
    pub controlling_tty: bool,
    pub no_new_privs: bool,
    /// A Landlock ruleset is applied.
    pub landlock: bool,
    /// The seccomp program's length in instructions, when one is installed.
    pub seccomp: Option<usize>,
    /// The system calls it denies.
    pub seccomp_denied: Vec<&'static str>,
    /// `(resource, limit)` in the order they are set.
    pub rlimits: Vec<(i32, u64)>,
}

impl SpawnPlan {
    /// This plan as plain values.
    pub fn summary(&self) -> PlanSummary {
        let text = |c: &CString| c.to_string_lossy().into_owned();
        let c = &self.confinement;
        PlanSummary {
            program: text(&self.program),
            argv: self.argv.iter().map(text).collect(),
            env: self
                .envp()
                .iter()
                .take_while(|p| !p.is_null())
                // SAFETY: each pointer is one of this plan's C strings, alive with `self`.
                .map(|p| {
                    unsafe { std::ffi::CStr::from_ptr(*p) }
                        .to_string_lossy()
                        .into_owned()
                })
                .collect(),
            cwd: self.cwd.is_some(),
            cgroup: self.cgroup,
            controlling_tty: self.controlling_tty,
            no_new_privs: c.no_new_privs,
            landlock: c.landlock_fd.is_some(),
            seccomp: c.seccomp.as_ref().map(|f| f.program.len()),
            seccomp_denied: c.seccomp.as_ref().map_or(Vec::new(), |f| f.denied.clone()),
            rlimits: c.rlimits.entries[..c.rlimits.len].to_vec(),
        }
    }
}

fn argv_ptrs(argv: &[CString]) -> Vec<*const libc::c_char> {
    let mut v: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    v.push(std::ptr::null());
    v
}

/// Pointers to every `KEY=value` of the environment, NULL-terminated: the base minus the
/// keys the overrides replace, then the overrides (the last of a repeated key wins, as the
/// broker's map did).
fn envp(base: &EnvBlock, extra: &EnvBlock) -> Vec<*const libc::c_char> {
    let extra = &extra.entries;
    let mut v = Vec::with_capacity(base.entries.len() + extra.len() + 1);
    for (k, kv) in &base.entries {
        if !extra.iter().any(|(ek, _)| ek == k) {
            v.push(kv.as_ptr());
        }
    }
    for (i, (k, kv)) in extra.iter().enumerate() {
        if !extra[i + 1..].iter().any(|(ek, _)| ek == k) {
            v.push(kv.as_ptr());
        }
    }
    v.push(std::ptr::null());
    v
}

/// What `execve` needs, apart from the descriptors: the program, argv and environment as C
/// strings, with NULL-terminated pointer arrays into them (the arrays stay valid while the
/// image lives: moving it does not move the strings).
#[derive(Default)]
pub struct ExecImage {
    program: CString,
    // The strings the pointer arrays point into: only read through them.
    #[allow(dead_code)]
    argv: Vec<CString>,
    #[allow(dead_code)]
    base_env: std::sync::Arc<EnvBlock>,
    #[allow(dead_code)]
    extra_env: EnvBlock,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
}

impl ExecImage {
    /// The image of `program` run as `argv`, with `base` plus `overrides` as environment.
    pub fn new(
        program: &str,
        argv: &[String],
        base: std::sync::Arc<EnvBlock>,
        overrides: &[(String, String)],
    ) -> std::io::Result<ExecImage> {
        let (program, argv, extra_env) = c_strings(program, argv, overrides)?;
        let argv_ptrs = argv_ptrs(&argv);
        let envp_ptrs = envp(&base, &extra_env);
        Ok(ExecImage {
            program,
            argv,
            base_env: base,
            extra_env,
            argv_ptrs,
            envp_ptrs,
        })
    }

    pub fn program_ptr(&self) -> *const libc::c_char {
        self.program.as_ptr()
    }
    pub fn argv_ptr(&self) -> *const *const libc::c_char {
        self.argv_ptrs.as_ptr()
    }
    pub fn envp_ptr(&self) -> *const *const libc::c_char {
        self.envp_ptrs.as_ptr()
    }
}
