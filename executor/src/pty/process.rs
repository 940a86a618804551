//! Starting a session's program on a new PTY, under the same confinement as a command.
//!
//! The PTY comes from `openpty(3)` (nix). `portable-pty` was not used: its spawn goes
//! through `std::process::Command` (fork + exec with a `pre_exec` hook), which cannot start
//! the child in its job cgroup with `clone3(CLONE_INTO_CGROUP)` or apply the per-command
//! Landlock domain and seccomp program the way [`iii_shell_launch::spawn`] does; all we need from a PTY
//! library is the master/slave pair, and `openpty` gives exactly that. The program is then
//! started by the ordinary spawn routine with the slave as its stdin, stdout and stderr and
//! `TIOCSCTTY` after `setsid`, so it gets the PTY as its controlling terminal.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use iii_shell_protocol::pty::{parse_output_target, OpenSpec};

use crate::policy::Policy;
use crate::prepare;
use crate::started;
use iii_shell_files::error::ExecError;
use iii_shell_files::jail::fstat;
use iii_shell_launch::cgroups::JobCgroup;
use iii_shell_launch::plan::ExecImage;
use iii_shell_launch::prestarted::{Outcome, PrestartedCommand, CONFIRM_EXEC};
use iii_shell_launch::reaper::ROOTS;
use iii_shell_launch::spawn::{self, Child, SpawnPlan};
use iii_shell_policy::command::{check_command, CommandCheck};

/// A started session program.
pub struct Started {
    pub child: Child,
    pub cgroup: Option<JobCgroup>,
    pub master: OwnedFd,
    /// The canonical directory it started in.
    pub cwd: String,
    /// The program as the caller named it (`None`: the login shell).
    pub program: Option<String>,
}

/// The TERM a session gets when the forwarded environment has none.
pub const DEFAULT_TERM: &str = "xterm-256color";

/// Checks what the executor must not trust from the broker: sizes, output target, env keys
/// and values, argv, the denylist, cwd.
pub fn check(policy: &Policy, spec: &OpenSpec) -> Result<(), ExecError> {
    check_size(spec.cols, spec.rows)?;
    if parse_output_target(&spec.output_function_id).is_none() {
        return Err(ExecError::Invalid(
            iii_shell_protocol::pty::bad_output_target(&spec.output_function_id),
        ));
    }
    // The broker's command validator run again (`policy::command`).
    let cmd = CommandCheck {
        argv: spec.argv.as_deref(),
        env: &spec.env,
        cwd: Some(&spec.cwd),
    };
    Ok(check_command(
        &cmd,
        &policy.denylist,
        policy.jail.is_jailed(),
    )?)
}

pub fn check_size(cols: u16, rows: u16) -> Result<(), ExecError> {
    if cols == 0 || rows == 0 {
        return Err(ExecError::Invalid(format!(
            "cols and rows must be at least 1 (got {cols}x{rows})"
        )));
    }
    Ok(())
}

/// The login shell of the user the executor runs as: settled with the policy
/// ([`Policy::settle_user`]), or (a policy not installed by an executor) worked out now.
pub fn login_shell(policy: &Policy) -> String {
    if !policy.user.shell.path.is_empty() {
        return policy.user.shell.path.clone();
    }
    let account = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten();
    crate::policy::shell_for(
        account.as_ref(),
        policy.base_env.get("SHELL").map(String::as_str),
    )
    .path
}

/// Opens the PTY and starts the program on it.
pub async fn start(policy: &Policy, spec: &OpenSpec) -> Result<Started, ExecError> {
    check(policy, spec)?;
    let network = policy.network_for(spec.network)?;
    let limits = policy.job_limits_for(&spec.limits)?;
    policy.commands_ready().await?;
    let resolved = policy.jail.resolve(&spec.cwd)?;
    let st = fstat(&resolved.fd).map_err(|e| ExecError::Internal(format!("cwd: {e}")))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(ExecError::Invalid(format!(
            "cwd is not a directory: {}",
            spec.cwd
        )));
    }
    let cwd = resolved.path.to_string_lossy().into_owned();
    let (path, argv, program) = match &spec.argv {
        Some(argv) => {
            let path = prepare::lookup(&argv[0], policy.base_env.get("PATH").map(String::as_str))
                .map_err(|e| prepare::spawn_error(&argv[0], &e))?;
            (path, argv.clone(), Some(argv[0].clone()))
        }
        None => {
            let shell = login_shell(policy);
            // A leading '-' in argv[0] is how a shell learns it is a login shell.
            let name = Path::new(&shell)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "sh".into());
            (shell, vec![format!("-{name}")], None)
        }
    };
    let mut env = spec.env.clone();
    if !policy.base_env.contains_key("TERM") && !env.iter().any(|(k, _)| k == "TERM") {
        env.push(("TERM".into(), DEFAULT_TERM.into()));
    }

    let size = nix::pty::Winsize {
        ws_row: spec.rows,
        ws_col: spec.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None)
        .map_err(|e| ExecError::Internal(format!("cannot open a pty: {e}")))?;
    let (master, slave) = (pty.master, pty.slave);
    for fd in [&master, &slave] {
        set_cloexec(fd).map_err(|e| ExecError::Internal(format!("pty: {e}")))?;
    }
    spawn::set_nonblocking(&master).map_err(|e| ExecError::Internal(format!("pty: {e}")))?;
    // A pre-started process has the policy's own network mode and limits: a session asking
    // for tighter ones spawns.
    let prestarted = if policy.prestarted_fits(spec.network) && spec.limits == Default::default() {
        in_prestarted(policy, &path, &argv, &env, &slave, &resolved.fd).await?
    } else {
        None
    };
    if let Some((child, cgroup)) = prestarted {
        return Ok(Started {
            child,
            cgroup,
            master,
            cwd,
            program,
        });
    }
    let dup = |fd: &OwnedFd| {
        fd.try_clone()
            .map_err(|e| ExecError::Internal(format!("pty: {e}")))
    };
    let mut plan = SpawnPlan::with_env(
        &path,
        &argv,
        policy.base_envp.clone(),
        &env,
        dup(&slave)?,
        dup(&slave)?,
        slave,
    )
    .map_err(|e| ExecError::Internal(format!("spawn setup: {e}")))?;
    plan.cwd = Some(resolved.fd);
    plan.confinement = policy.commands.child_as(network)?;
    plan.controlling_tty = true;
    // The policy's job limits, as for a command: a pooled cgroup keeps those of the job that
    // last used it, and a fresh one has none.
    let cgroup = policy
        .launcher
        .cgroups()
        .take_for(limits)
        .inspect(|cg| plan.cgroup = Some(cg.target()));
    let child = {
        // As for commands: the root is registered under the lock the orphan reaper checks.
        let mut roots = ROOTS
            .lock()
            .map_err(|_| ExecError::Internal("job table poisoned".into()))?;
        match policy.launcher.spawn(&plan) {
            Ok(c) => {
                roots.push(c.pid);
                c
            }
            Err(e) => {
                drop(roots);
                if let Some(cg) = cgroup {
                    let _ = cg.recycle();
                }
                return Err(prepare::spawn_error(&path, &e));
            }
        }
    };
    // Closes our copies of the slave: from now on only the program's side holds it, so the
    // master reads EIO once every process of the session has let go of it.
    drop(plan);
    if child.cgroup_refused_clone3 {
        if let Some(cg) = &cgroup {
            cg.retire();
        }
    }
    Ok(Started {
        child,
        cgroup,
        master,
        cwd,
        program,
    })
}

/// Starts the session's program in a pre-started process, as `shell::exec` does, with the
/// terminal as its stdio and controlling terminal. Waits (without holding the executor's
/// thread) until it has exec'd, as the ordinary spawn does, so a program that cannot be
/// executed is still the open's error. `None` when no pre-started process is ready or it could
/// not take the program (nothing ran): the caller spawns the ordinary way.
async fn in_prestarted(
    policy: &Policy,
    path: &str,
    argv: &[String],
    env: &[(String, String)],
    slave: &OwnedFd,
    cwd: &OwnedFd,
) -> Result<Option<(Child, Option<JobCgroup>)>, ExecError> {
    let Some(w) = policy.take_prestarted() else {
        return Ok(None);
    };
    let image = match ExecImage::new(path, argv, policy.base_envp.clone(), env) {
        Ok(i) => i,
        Err(e) => {
            policy.put_back_prestarted(w);
            return Err(ExecError::Internal(format!("spawn setup: {e}")));
        }
    };
    // Copies: the ordinary spawn still has the originals if the hand-over fails.
    let (Ok(tty), Ok(cwd)) = (slave.try_clone(), cwd.try_clone()) else {
        policy.put_back_prestarted(w);
        return Ok(None);
    };
    let Some(l) = w.launch_on_terminal(image, tty, Some(cwd)) else {
        return Ok(None);
    };
    let PrestartedCommand {
        pid,
        pidfd,
        cgroup,
        memory,
        handover,
        ..
    } = l;
    let child = Child {
        pid,
        pidfd,
        cgroup_refused_clone3: false,
    };
    if !started::handover_closed(handover).await {
        // No end-of-file in time (still in execve, or stopped before it took the program): it
        // may yet read the strings it was handed, and a session holds no `ChildMemory` until
        // its end, so that memory is never freed (a few KiB, rather than memory freed under a
        // process). The session goes on; a failure then shows as the program's exit.
        tracing::warn!(pid, "a terminal's program did not start within {CONFIRM_EXEC:?}; its start-up memory is kept for good");
        std::mem::forget(memory);
        return Ok(Some((child, cgroup)));
    }
    let failed = match memory.peek() {
        Outcome::Took => {
            memory.release_after_exec();
            return Ok(Some((child, cgroup)));
        }
        Outcome::ExecFailed(e) => Some(e),
        Outcome::NeverStarted => None,
    };
    // It is exiting (or dead): reap it before its memory goes, then give its cgroup back.
    let reaped = iii_shell_launch::wait::try_reap_blocking(&child.pidfd).is_ok();
    if let Ok(mut roots) = ROOTS.lock() {
        roots.retain(|&p| p != pid);
    }
    if reaped {
        memory.release_after_exec();
    }
    if let Some(cg) = cgroup {
        // Reaped, it is empty and goes back to the pool; otherwise (or if something is still
        // in it) it is never reused, and removed once empty.
        let back = if reaped { cg.recycle() } else { Err(cg) };
        if let Err(cg) = back {
            cg.retire();
            cg.remove();
        }
    }
    match failed {
        Some(e) => Err(prepare::spawn_error(path, &e)),
        None => Ok(None),
    }
}

fn set_cloexec(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: F_SETFD on a descriptor we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Applies a window size to the PTY (the kernel sends SIGWINCH to its foreground group).
pub fn resize(master: &OwnedFd, cols: u16, rows: u16) -> std::io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which is valid for the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `pids.max` the kernel applies to process `pid`: its job twin's in the cgroup v1
    /// `pids` hierarchy where there is one, else its job cgroup's.
    fn pids_max_of(policy: &Policy, pid: i32, cg: &JobCgroup) -> String {
        let base = policy.launcher.cgroups().base().expect("a cgroup base");
        let dir = if base.pids_v1.is_some() {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
            iii_shell_launch::pids_v1::own_dir(&mountinfo, &own)
                .expect("the session's v1 pids cgroup")
        } else {
            cg.dir.clone()
        };
        std::fs::read_to_string(dir.join("pids.max"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// A terminal session's job cgroup carries the policy's `job_limits`, as a command's
    /// does: not "max" (a fresh cgroup) nor whatever the job that last used a pooled one had.
    #[tokio::test]
    async fn a_session_runs_under_the_policy_pids_max() {
        let launcher = std::sync::Arc::new(iii_shell_launch::Launcher::new(
            iii_shell_launch::Settings::private(),
        ));
        if !launcher.cgroups().usable() || !launcher.cgroups().base().is_some_and(|b| b.pids) {
            launcher.kill_all();
            iii_shell_confine::requirement::unmet("no job cgroups with pids.max here");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let v = serde_json::json!({
            "fs": {"host_roots": [root.path().to_string_lossy()]},
            "confinement": {"job_limits": {"pids_max": 17}},
        });
        let policy = Policy::build(1, &v.to_string())
            .expect("policy")
            .with_launcher(launcher.clone());
        let spec = OpenSpec {
            cwd: root.path().to_string_lossy().into_owned(),
            cols: 80,
            rows: 24,
            output_function_id: "iii::console-ui::pty-output::console-test".into(),
            argv: Some(vec!["sleep".into(), "30".into()]),
            env: Vec::new(),
            caller: String::new(),
            network: None,
            limits: Default::default(),
        };
        let started = start(&policy, &spec).await.expect("a session");
        let cg = started.cgroup.as_ref().expect("a job cgroup");
        let limit = pids_max_of(&policy, started.child.pid, cg);
        // SAFETY: pidfd_send_signal on a pidfd we own; no memory is passed.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                started.child.pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            );
        }
        let _ = iii_shell_launch::reaper::reap(&started.child);
        if let Some(cg) = started.cgroup {
            cg.retire();
            let _ = cg.recycle();
        }
        launcher.kill_all();
        assert_eq!(limit, "17");
    }
}
