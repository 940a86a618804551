//! Turning a checked [`ExecSpec`] into a [`SpawnPlan`]: argv rules, denylist, env gate, cwd
//! through the jail, PATH lookup. Everything here is re-checked even though the broker
//! already validated it.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use iii_shell_protocol::messages::ExecSpec;

use iii_shell_policy::command::{check_command, CommandCheck};

use crate::policy::Policy;
use iii_shell_files::error::ExecError;
use iii_shell_files::jail::{fstat, open_beneath};
use iii_shell_launch::cgroups::JobCgroup;
use iii_shell_launch::spawn::{pipe, set_nonblocking, ExecImage, SpawnPlan};

/// Search path used when the command's environment has no PATH.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A command ready to start, with the parent ends of its pipes.
pub struct Prepared {
    pub plan: SpawnPlan,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// Parent end of the stdin pipe and the bytes to write, when the call gave stdin.
    pub stdin: Option<(OwnedFd, Vec<u8>)>,
    pub cgroup: Option<JobCgroup>,
    /// What starts it: the policy's launcher.
    pub launcher: std::sync::Arc<iii_shell_launch::Launcher>,
}

/// The broker's command validator run again (`policy::command`: argv, the denylist, env keys
/// and values, cwd, in that order); the jail resolves the cwd afterwards.
pub fn check(policy: &Policy, spec: &ExecSpec) -> Result<(), ExecError> {
    let cmd = CommandCheck {
        argv: Some(&spec.argv),
        env: &spec.env,
        cwd: spec.cwd.as_deref(),
    };
    Ok(check_command(
        &cmd,
        &policy.denylist,
        policy.jail.is_jailed(),
    )?)
}

pub use iii_shell_policy::argv::{check_argv, EMPTY_COMMAND};

/// The directory a command starts in, as an fd (None = the executor's own cwd): the call's
/// `cwd` through the jail, else `working_dir`, else (jailed) the primary root.
pub fn resolve_cwd(policy: &Policy, cwd: Option<&str>) -> Result<Option<OwnedFd>, ExecError> {
    use iii_shell_policy::home::{default_cwd, DefaultCwd};
    let resolved = match cwd {
        Some(c) => policy.jail.resolve(c)?.fd,
        None => match default_cwd(
            policy.config.working_dir.as_deref(),
            &policy.config.fs.host_roots,
        ) {
            // The operator's working_dir is trusted configuration, not caller input.
            DefaultCwd::WorkingDir(wd) => {
                open_beneath(None, Path::new(&wd), libc::O_PATH | libc::O_DIRECTORY, 0)
                    .map_err(|e| ExecError::Internal(format!("working_dir {wd}: {e}")))?
            }
            // The descriptor the jail opened the root with when the policy was built: the
            // directory every relative path of the call resolves against too.
            DefaultCwd::PrimaryRoot(_) => match policy.jail.roots().first() {
                Some(root) => root
                    .fd
                    .try_clone()
                    .map_err(|e| ExecError::Internal(format!("cwd: {e}")))?,
                None => return Ok(None),
            },
            DefaultCwd::Executor => return Ok(None),
        },
    };
    let st = fstat(&resolved).map_err(|e| ExecError::Internal(format!("cwd: {e}")))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(ExecError::Invalid(format!(
            "cwd is not a directory: {}",
            cwd.unwrap_or_default()
        )));
    }
    Ok(Some(resolved))
}

/// Finds `program` on `path_var` the way execvp would, skipping relative entries. A program
/// containing `/` is used as given (relative to the command's cwd).
pub fn lookup(program: &str, path_var: Option<&str>) -> Result<String, std::io::Error> {
    if program.contains('/') {
        return Ok(program.to_string());
    }
    let mut denied = false;
    for dir in path_var.unwrap_or(DEFAULT_PATH).split(':') {
        if !dir.starts_with('/') {
            continue;
        }
        let cand = Path::new(dir).join(program);
        if let Ok(md) = std::fs::metadata(&cand) {
            if md.is_file() {
                if md.permissions().mode() & 0o111 != 0 {
                    return Ok(cand.to_string_lossy().into_owned());
                }
                denied = true;
            }
        }
    }
    Err(std::io::Error::from_raw_os_error(if denied {
        libc::EACCES
    } else {
        libc::ENOENT
    }))
}

/// What both ways of starting a command need, checked and resolved: the program's path, the
/// directory it starts in, and the stdin pipe when the call gave stdin.
struct Staged {
    program: String,
    cwd: Option<OwnedFd>,
    /// The child's end of the stdin pipe, and the parent's end with the bytes to write.
    stdin: Option<(OwnedFd, (OwnedFd, Vec<u8>))>,
}

fn stage(policy: &Policy, spec: &ExecSpec) -> Result<Staged, ExecError> {
    check(policy, spec)?;
    let cwd = resolve_cwd(policy, spec.cwd.as_deref())?;
    // The forwarded base environment is built once per policy; only overrides are per call.
    // PATH is a dangerous key (refused as an override above), so it comes from the base.
    let path = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .or_else(|| policy.base_env.get("PATH").map(String::as_str));
    let program = lookup(&spec.argv[0], path).map_err(|e| spawn_error(&spec.argv[0], &e))?;
    let stdin = match &spec.stdin {
        Some(bytes) => {
            let (r, w) = pipe().map_err(setup_error)?;
            // pipe() made the read end non-blocking; the child reads it, so make it blocking
            // again by swapping roles: the parent writes through a non-blocking write end.
            let child_end = reopen_blocking(r).map_err(setup_error)?;
            set_nonblocking(&w).map_err(setup_error)?;
            Some((child_end, (w, bytes.clone())))
        }
        None => None,
    };
    Ok(Staged {
        program,
        cwd,
        stdin,
    })
}

fn setup_error(e: std::io::Error) -> ExecError {
    ExecError::Internal(format!("spawn setup: {e}"))
}

/// Builds the spawn plan: environment, program path, pipes, cgroup.
pub fn prepare(policy: &Policy, spec: &ExecSpec) -> Result<Prepared, ExecError> {
    let limits = policy.job_limits_for(&spec.limits)?;
    let Staged {
        program,
        cwd,
        stdin,
    } = stage(policy, spec)?;
    let (out_r, out_w) = pipe().map_err(setup_error)?;
    let (err_r, err_w) = pipe().map_err(setup_error)?;
    let (stdin_child, stdin) = match stdin {
        Some((child_end, parent)) => (child_end, Some(parent)),
        None => (policy.launcher.dev_null().map_err(setup_error)?, None),
    };
    let mut plan = SpawnPlan::with_env(
        &program,
        &spec.argv,
        policy.command_envp.clone(),
        &spec.env,
        stdin_child,
        out_w,
        err_w,
    )
    .map_err(setup_error)?;
    plan.cwd = cwd;
    let network = policy.network_for(spec.network)?;
    plan.confinement = policy.commands.child_as(network)?;
    let cgroup = policy
        .launcher
        .cgroups()
        .take_for(limits)
        .inspect(|cg| plan.cgroup = Some(cg.target()));
    Ok(Prepared {
        plan,
        stdout: out_r,
        stderr: err_r,
        stdin,
        cgroup,
        launcher: policy.launcher.clone(),
    })
}

/// A command checked and ready for a pre-started process, which already holds its output
/// pipes, `/dev/null` as stdin, its cgroup and its confinement: only what differs per call.
pub struct PreparedForPrestarted {
    pub image: ExecImage,
    pub cwd: Option<OwnedFd>,
    /// The child's end of the stdin pipe, when the call gave stdin.
    pub stdin_child: Option<OwnedFd>,
    /// The parent's end of the stdin pipe and the bytes to write.
    pub stdin: Option<(OwnedFd, Vec<u8>)>,
}

/// [`prepare`] for a pre-started process: the same checks, no pipes and no cgroup.
pub fn prepare_for_prestarted(
    policy: &Policy,
    spec: &ExecSpec,
) -> Result<PreparedForPrestarted, ExecError> {
    if !policy.prestarted_fits(spec.network) {
        return Err(ExecError::Internal(
            "a pre-started process runs under the policy's own network mode, not the call's".into(),
        ));
    }
    policy.check_limit_controllers(&policy.config.confinement.job_limits)?;
    let Staged {
        program,
        cwd,
        stdin,
    } = stage(policy, spec)?;
    let image = ExecImage::new(&program, &spec.argv, policy.command_envp.clone(), &spec.env)
        .map_err(setup_error)?;
    let (stdin_child, stdin) = match stdin {
        Some((child_end, parent)) => (Some(child_end), Some(parent)),
        None => (None, None),
    };
    Ok(PreparedForPrestarted {
        image,
        cwd,
        stdin_child,
        stdin,
    })
}

/// Whether a call may run in a pre-started process: only under the policy's own network mode
/// and limits (one that asks for tighter ones is spawned with its own confinement and job
/// cgroup).
pub fn takes_prestarted(policy: &Policy, spec: &ExecSpec) -> bool {
    policy.prestarted_fits(spec.network) && spec.limits == Default::default()
}

fn reopen_blocking(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// The message of a failed spawn: the OS error text, naming the program.
pub fn spawn_error(program: &str, e: &std::io::Error) -> ExecError {
    ExecError::Internal(format!("failed to spawn '{program}': {e}"))
}

/// The plan a checked request becomes, as a whole value: argv, environment, cwd, the
/// confinement the child applies to itself and its cgroup target.
#[cfg(test)]
mod plan_tests {
    use super::*;
    use iii_shell_launch::plan::PlanSummary;
    use iii_shell_protocol::config::Config;

    /// A jailed policy on `root` that forwards no environment, with seccomp and Landlock
    /// as `landlock` and `seccomp` say, and two resource limits.
    async fn policy(root: &Path, landlock: bool, seccomp: bool) -> Policy {
        let mut c = Config::builtin_default();
        c.fs.host_roots = vec![root.to_string_lossy().into_owned()];
        c.fs.allow_unjailed = false;
        c.env.inherit = false;
        c.env.allow = Vec::new();
        c.confinement.landlock = landlock;
        c.confinement.seccomp = seccomp;
        c.confinement.rlimits.open_files = Some(256);
        c.confinement.rlimits.cpu_seconds = Some(30);
        let p = Policy::build(1, &serde_json::to_string(&c).unwrap()).unwrap();
        p.commands_ready().await.unwrap();
        p
    }

    fn spec(cwd: Option<&str>) -> ExecSpec {
        ExecSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), "echo hi".into()],
            cwd: cwd.map(str::to_string),
            env: vec![
                ("GREETING".into(), "hi".into()),
                ("GREETING".into(), "hey".into()),
            ],
            stdin: None,
            timeout_ms: 1000,
            network: None,
            limits: Default::default(),
        }
    }

    /// What a command without a terminal gets before the request's own variables.
    const NON_INTERACTIVE: &[&str] = &["GIT_PAGER=cat", "GIT_TERMINAL_PROMPT=0", "PAGER=cat"];

    fn cwd_of(p: &Prepared) -> Option<std::path::PathBuf> {
        use std::os::fd::AsRawFd;
        let fd = p.plan.cwd.as_ref()?.as_raw_fd();
        std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()
    }

    fn summary(
        env: &[&str],
        seccomp: Option<&iii_shell_confine::seccomp::Filter>,
        landlock: bool,
    ) -> PlanSummary {
        PlanSummary {
            program: "/bin/sh".into(),
            argv: vec!["/bin/sh".into(), "-c".into(), "echo hi".into()],
            env: env.iter().map(|e| e.to_string()).collect(),
            cwd: true,
            // A launcher without job cgroups (not root here): no cgroup target.
            cgroup: None,
            controlling_tty: false,
            no_new_privs: true,
            landlock,
            seccomp: seccomp.map(|f| f.program.len()),
            seccomp_denied: seccomp.map_or(Vec::new(), |f| f.denied.clone()),
            rlimits: vec![
                (libc::RLIMIT_NOFILE as i32, 256),
                (libc::RLIMIT_CPU as i32, 30),
            ],
        }
    }

    #[tokio::test]
    async fn a_request_becomes_this_exact_plan() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        let p = policy(&root, false, false).await;
        let prepared = prepare(&p, &spec(Some("sub"))).unwrap();
        // The non-interactive defaults first, then the request's (the last value of a repeated
        // key wins); nothing of the executor's environment.
        assert_eq!(
            prepared.plan.summary(),
            summary(&[NON_INTERACTIVE, &["GREETING=hey"]].concat(), None, false)
        );
        assert_eq!(cwd_of(&prepared), Some(root.join("sub")));
        assert!(prepared.stdin.is_none());
        assert!(prepared.cgroup.is_none());
        // No cwd: the primary root.
        let prepared = prepare(&p, &spec(None)).unwrap();
        assert_eq!(cwd_of(&prepared), Some(root.clone()));
    }

    #[tokio::test]
    async fn every_layer_of_the_policy_reaches_the_plan() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let p = policy(&root, true, true).await;
        let mut request = spec(None);
        request.stdin = Some(b"input".to_vec());
        let prepared = prepare(&p, &request).unwrap();
        let filter = p.commands.spawn_filter.clone().expect("a per-spawn filter");
        assert!(!filter.denied.is_empty());
        assert_eq!(
            prepared.plan.summary(),
            summary(
                &[NON_INTERACTIVE, &["GREETING=hey"]].concat(),
                Some(&filter),
                true
            )
        );
        assert_eq!(
            prepared.stdin.as_ref().map(|(_, b)| b.as_slice()),
            Some(&b"input"[..])
        );
    }

    #[tokio::test]
    async fn a_refused_request_makes_no_plan() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let p = policy(&root, false, false).await;
        let mut request = spec(None);
        request.env = vec![("LD_PRELOAD".into(), "/tmp/x.so".into())];
        assert!(prepare(&p, &request).is_err());
        let mut request = spec(Some("../.."));
        request.env.clear();
        assert!(prepare(&p, &request).is_err());
    }
}
