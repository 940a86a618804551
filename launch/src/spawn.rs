//! Process creation without copying the executor: `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)`.
//!
//! This is how `posix_spawn` works inside glibc, done here so that the child can also join a
//! job cgroup and start a new session **before** `execve`, which `posix_spawn` cannot do.
//! Because the child shares the parent's memory and the calling thread is suspended until the
//! child execs or exits, the cost does not grow with the executor's size (a `fork` of a fat
//! parent copies its page tables; see BENCHMARKS.md).
//!
//! Everything the child needs (C strings, pointer arrays, fds) is prepared in the parent, as a
//! [`crate::child::Setup`]; the child runs the one child routine ([`crate::child::run`]),
//! which makes only raw system calls and never allocates, locks, or unwinds.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::clone3::Clone3;
pub use crate::plan::{CgroupTarget, ChildConfinement, EnvBlock, ExecImage, SpawnPlan};
use crate::privileges::{Kernel, Privileges};
use std::sync::atomic::{AtomicBool, Ordering};

/// A started child: its pid and a pidfd that becomes readable when it exits.
#[derive(Debug)]
pub struct Child {
    pub pid: i32,
    pub pidfd: OwnedFd,
    /// The job cgroup killed a child that clone3 created inside it before it could run (its
    /// kill count differs from ours: someone wrote its `cgroup.kill`). This child joined by
    /// the write instead; the cgroup must not be reused.
    pub cgroup_refused_clone3: bool,
}

/// What the child reads and writes; lives on the parent's stack for the duration of the
/// clone (with `CLONE_VFORK` the parent is suspended until the child has exec'd or exited).
#[repr(C)]
struct ChildCtx {
    setup: crate::child::Setup,
    /// Written by the child when it fails before or at execve.
    err: i32,
    /// Set by the child just before execve: tells a child that ran from one killed at birth.
    reached_exec: AtomicBool,
}

const CHILD_STACK: usize = 64 * 1024;
/// What clone3 is told the stack is: below the 16-aligned top, inside the allocation.
const CHILD_STACK_USABLE: usize = CHILD_STACK - 64;

/// Starts the child, inside its job cgroup by clone3 where `clone3` says that works. Returns
/// once it has exec'd (or failed to, with the errno it reported).
pub fn spawn(plan: &SpawnPlan, clone3: &Clone3) -> std::io::Result<Child> {
    let argv_ptrs = plan.argv_ptrs();
    let envp_ptrs = plan.envp();
    let fprog = plan.confinement.seccomp.as_ref().map(|f| f.fprog());
    let mut ctx = ChildCtx {
        setup: setup_for(plan, &argv_ptrs, &envp_ptrs, fprog.as_ref()),
        err: 0,
        reached_exec: AtomicBool::new(false),
    };
    ctx.setup.reached_exec = &ctx.reached_exec;
    // A mapping of its own (see `crate::stack`): the heap keeps pages it was given back.
    let stack = crate::stack::Stack::new(CHILD_STACK)?;
    // The stack grows down on every architecture Linux runs this on; align the top to 16.
    let top = stack.top(0) as *mut c_void;
    let mut pidfd: libc::c_int = -1;

    // Block every signal around the clone so no handler of ours can run in the child while it
    // shares our memory; the child resets dispositions and unblocks before execve.
    let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigfillset initialises `all`; pthread_sigmask stores the previous mask in `old`.
    unsafe {
        libc::sigfillset(all.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr());
    }
    let mut pid = -1;
    let mut clone_err = std::io::Error::from_raw_os_error(libc::ENOSYS);
    if let Some(cg) = plan.cgroup.filter(|c| c.dir >= 0 && clone3.available()) {
        // SAFETY: as for clone below; the trampoline runs `child_main` on `stack`, and this
        // thread is suspended (CLONE_VFORK) until the child has exec'd or exited.
        let base = top as usize - CHILD_STACK_USABLE;
        match unsafe {
            crate::clone3::spawn_into(
                cg.dir,
                child_main,
                &mut ctx as *mut ChildCtx as *mut c_void,
                base as *mut u8,
                CHILD_STACK_USABLE,
                &mut pidfd,
            )
        } {
            Ok(p) => {
                clone3.note_success();
                pid = p;
            }
            Err(e) => {
                clone3.note_failure(&e);
                clone_err = e;
            }
        }
    }
    let mut refused = false;
    if pid >= 0 && !ctx.reached_exec.load(Ordering::Acquire) && ctx.err == 0 {
        // The clone3 child never ran: killed at birth by its cgroup. Reap it and start the
        // command again the other way (the write works in such a cgroup).
        // SAFETY: CLONE_PIDFD stored a fresh pidfd that only we own.
        let dead = unsafe { OwnedFd::from_raw_fd(pidfd) };
        let _ = crate::wait::try_reap_blocking(&dead);
        tracing::warn!(
            "a job cgroup killed a new command at birth (its cgroup.kill was written); retrying by cgroup.procs and retiring that cgroup"
        );
        pid = -1;
        pidfd = -1;
        refused = true;
    }
    if pid < 0 {
        // Without clone3 (or when it failed) the child joins the cgroup itself.
        ctx.setup.join[0] = plan.cgroup.map_or(-1, |c| c.procs);
        // SAFETY: `child_main` only performs async-signal-safe system calls on data in
        // `ctx`, which (with argv/envp and the strings they point to) outlives the call: with
        // CLONE_VFORK this thread is suspended until the child has called execve or _exit.
        // The child runs on `stack`, which nothing else uses meanwhile. `pidfd` receives the
        // CLONE_PIDFD descriptor. No exit signal until execve (which resets it to SIGCHLD):
        // the root is reaped through its pidfd either way.
        pid = unsafe {
            libc::clone(
                child_main,
                top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD,
                &mut ctx as *mut ChildCtx as *mut c_void,
                &mut pidfd as *mut libc::c_int,
            )
        };
        if pid < 0 {
            clone_err = std::io::Error::last_os_error();
        }
    }
    // SAFETY: restores the mask saved above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut());
    }
    drop(stack);
    if pid < 0 {
        return Err(clone_err);
    }
    // SAFETY: CLONE_PIDFD stored a fresh pidfd that only we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let child = Child {
        pid,
        pidfd,
        cgroup_refused_clone3: refused,
    };
    if ctx.err != 0 {
        // The child reported a failure and called _exit; reap it so it leaves no zombie.
        let _ = crate::wait::try_reap_blocking(&child.pidfd);
        return Err(std::io::Error::from_raw_os_error(ctx.err));
    }
    Ok(child)
}

/// The child's setup for `plan`: its descriptors, confinement and command (`argv`, `envp`
/// and `fprog` are the plan's, kept alive by the caller). The v2 job cgroup is left to
/// clone3; [`spawn`] sets `join[0]` where the child must join it by a write.
fn setup_for(
    plan: &SpawnPlan,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    fprog: Option<&libc::sock_fprog>,
) -> crate::child::Setup {
    crate::child::Setup {
        // The job's twins in cgroup v1 hierarchies are joined either way; the v2 cgroup
        // only where clone3 did not start the child inside it.
        join: crate::plan::CgroupTarget::v1_joins(plan.cgroup),
        stdio: [
            plan.stdin.as_raw_fd(),
            plan.stdout.as_raw_fd(),
            plan.stderr.as_raw_fd(),
        ],
        ctty: plan.controlling_tty,
        no_new_privs: plan.confinement.no_new_privs,
        landlock_fd: plan.confinement.landlock_fd.unwrap_or(-1),
        seccomp: fprog.map_or(std::ptr::null(), |p| p as *const libc::sock_fprog),
        rlimits: plan.confinement.rlimits,
        command: crate::child::Command {
            program: plan.program.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            stdin: -1,
            cwd: plan.cwd.as_ref().map_or(-1, |f| f.as_raw_fd()),
            tty: -1,
        },
        ..crate::child::Setup::new()
    }
}

/// Runs in the child, on the child stack, sharing the parent's memory: the one child
/// routine, then the failure reported to the parent.
extern "C" fn child_main(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the ChildCtx the parent passed, alive until we exec or exit (the parent
    // is suspended meanwhile); the routine makes only raw system calls on it.
    unsafe { run_in(&Kernel, arg as *mut ChildCtx) }
}

/// The child's life on `p`: the routine, then (it returns only when a step failed) the
/// errno written where the parent reads it, and exit status 127.
unsafe fn run_in<P: Privileges>(p: &P, ctx: *mut ChildCtx) -> libc::c_int {
    // SAFETY (caller): `ctx` is alive and its setup's pointers valid.
    unsafe {
        let rc = crate::child::steps(p, &(*ctx).setup);
        let err = if rc < 0 { (-rc) as i32 } else { libc::ECHILD };
        std::ptr::write_volatile(std::ptr::addr_of_mut!((*ctx).err), err);
        p.exit_group(127);
        127
    }
}

/// A pipe whose read end is non-blocking (for the async reader) and close-on-exec; the write
/// end is handed to the child.
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills `fds` with two new descriptors on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A new pipe's read end has no status flag set (close-on-exec is a descriptor flag), so
    // one F_SETFL does what set_nonblocking's read-modify-write does, a system call sooner.
    // SAFETY: F_SETFL on a descriptor we own.
    if unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((r, w))
}

pub fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `/dev/null` opened read-only, close-on-exec, once per launcher: [`DevNull::open`] hands out
/// duplicates (one system call per command instead of a path walk).
#[derive(Debug, Default)]
pub struct DevNull(std::sync::OnceLock<Option<OwnedFd>>);

impl DevNull {
    /// A new descriptor of `/dev/null`.
    pub fn open(&self) -> std::io::Result<OwnedFd> {
        match self.0.get_or_init(|| open_dev_null().ok()) {
            Some(fd) => fd.try_clone(),
            None => open_dev_null(),
        }
    }
}

/// `/dev/null` opened read-only, close-on-exec, by path.
pub fn open_dev_null() -> std::io::Result<OwnedFd> {
    Ok(std::fs::File::options()
        .read(true)
        .open("/dev/null")?
        .into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wait::ExitStatus;
    use std::io::Read;

    fn run(argv: &[&str]) -> std::io::Result<(ExitStatus, String)> {
        let (r, w) = pipe()?;
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let plan = SpawnPlan::new(
            &argv[0],
            &argv,
            vec![("A".to_string(), "1".to_string())],
            open_dev_null()?,
            w.try_clone()?,
            w,
        )?;
        let child = spawn(&plan, &Clone3::default())?;
        drop(plan);
        let st = crate::wait::try_reap_blocking(&child.pidfd)?;
        let mut out = String::new();
        let mut f = std::fs::File::from(r);
        loop {
            let mut buf = [0u8; 4096];
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok((st, out))
    }

    #[test]
    fn spawns_with_env_and_status() {
        let (st, out) = run(&["/bin/sh", "-c", "echo $A; trap - PIPE; exit 3"]).unwrap();
        assert_eq!(st, ExitStatus::Exited(3));
        assert_eq!(out, "1\n");
    }

    #[test]
    fn missing_program_reports_errno() {
        let err = run(&["/nonexistent/prog"]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(err.to_string(), "No such file or directory (os error 2)");
    }

    #[test]
    fn child_gets_default_sigpipe_and_own_session() {
        let (_, out) = run(&["/bin/sh", "-c", "grep -E '^(SigIgn)' /proc/self/status; ps -o sid= -p $$ >/dev/null; echo sid=$(cut -d' ' -f6 /proc/self/stat)"]).unwrap();
        assert!(out.contains("SigIgn:\t0000000000000000"), "{out}");
    }
}

/// The order of an ordinary spawn's steps, and what a failed step reports, on the recording
/// fake (no root, no clone: the routine runs in the test's own thread).
#[cfg(test)]
mod seam_tests {
    use super::*;
    use crate::plan::CgroupTarget;
    use crate::privileges::fake::{confinement, expected_on_failure, Call, Recorder};

    /// A plan with every layer, in a job cgroup (dir 40, procs 41, v1 twins: pids 42, memory
    /// 43, cpu 44).
    fn plan(tty: bool) -> SpawnPlan {
        let argv = vec!["echo".to_string(), "hi".to_string()];
        let fd = || open_dev_null().unwrap();
        let mut plan = SpawnPlan::new(
            "/bin/echo",
            &argv,
            vec![("A".into(), "1".into())],
            fd(),
            fd(),
            fd(),
        )
        .unwrap();
        plan.cwd = Some(fd());
        plan.cgroup = Some(CgroupTarget {
            dir: 40,
            procs: 41,
            v1_procs: [42, 43, 44],
        });
        plan.confinement = confinement();
        plan.controlling_tty = tty;
        plan
    }

    /// Runs the child's life for `plan` on `p` (`by_write`: clone3 was not used, so the
    /// child joins the v2 cgroup itself); the calls, the errno written for the parent, and
    /// whether the child got as far as execve.
    fn run_on(p: &Recorder, plan: &SpawnPlan, by_write: bool) -> (Vec<Call>, i32, bool) {
        let argv = plan.argv_ptrs();
        let envp = plan.envp();
        let fprog = plan.confinement.seccomp.as_ref().map(|f| f.fprog());
        let mut ctx = ChildCtx {
            setup: setup_for(plan, &argv, &envp, fprog.as_ref()),
            err: 0,
            reached_exec: AtomicBool::new(false),
        };
        ctx.setup.reached_exec = &ctx.reached_exec;
        if by_write {
            ctx.setup.join[0] = plan.cgroup.map_or(-1, |c| c.procs);
        }
        // SAFETY: every pointer in the setup points into `plan`, `argv`, `envp`, `fprog` or
        // `ctx`, all alive for the call; the fake makes no system call.
        let status = unsafe { run_in(p, &mut ctx) };
        assert_eq!(status, 127);
        (p.calls(), ctx.err, ctx.reached_exec.load(Ordering::Acquire))
    }

    fn full_run(plan: &SpawnPlan, by_write: bool, tty: bool) -> Vec<Call> {
        let fd = |f: &OwnedFd| f.as_raw_fd();
        let mut calls = vec![Call::DefaultSignals, Call::Setsid];
        if by_write {
            calls.push(Call::JoinCgroup(41));
        }
        calls.extend([
            Call::JoinCgroup(42),
            Call::JoinCgroup(43),
            Call::JoinCgroup(44),
            Call::DupOnto(fd(&plan.stdin), 0),
            Call::DupOnto(fd(&plan.stdout), 1),
            Call::DupOnto(fd(&plan.stderr), 2),
        ]);
        if tty {
            calls.push(Call::ControllingTty);
        }
        calls.extend([
            Call::NoNewPrivs,
            Call::LandlockRestrictSelf(50),
            Call::SeccompInstall(3),
            Call::CloseDescriptors { keep: -1 },
            Call::Fchdir(fd(plan.cwd.as_ref().unwrap())),
            Call::Setrlimit(libc::RLIMIT_NOFILE as i32, 64),
            Call::Setrlimit(libc::RLIMIT_NPROC as i32, 99),
            Call::ClearSignalMask,
            Call::Execve("/bin/echo".into(), vec!["echo".into(), "hi".into()]),
        ]);
        calls
    }

    #[test]
    fn a_foreground_spawn_confines_itself_in_this_exact_order() {
        for (by_write, tty) in [(false, false), (true, false), (false, true), (true, true)] {
            let plan = plan(tty);
            let (calls, _, reached) = run_on(&Recorder::default(), &plan, by_write);
            let mut want = full_run(&plan, by_write, tty);
            want.push(Call::ExitGroup(127));
            assert_eq!(calls, want, "by_write={by_write} tty={tty}");
            assert!(reached);
        }
    }

    #[test]
    fn a_plan_without_confinement_makes_none_of_its_calls() {
        let mut plan = plan(false);
        plan.confinement = Default::default();
        plan.cwd = None;
        plan.cgroup = None;
        let fd = |f: &OwnedFd| f.as_raw_fd();
        let (calls, _, _) = run_on(&Recorder::default(), &plan, false);
        assert_eq!(
            calls,
            vec![
                Call::DefaultSignals,
                Call::Setsid,
                Call::DupOnto(fd(&plan.stdin), 0),
                Call::DupOnto(fd(&plan.stdout), 1),
                Call::DupOnto(fd(&plan.stderr), 2),
                Call::CloseDescriptors { keep: -1 },
                Call::ClearSignalMask,
                Call::Execve("/bin/echo".into(), vec!["echo".into(), "hi".into()]),
                Call::ExitGroup(127),
            ]
        );
    }

    #[test]
    fn a_failed_step_is_the_last_one_run_and_its_errno_reaches_the_parent() {
        for (by_write, tty) in [(false, false), (true, true)] {
            let plan = plan(tty);
            let full = full_run(&plan, by_write, tty);
            for n in 0..full.len() {
                let p = Recorder::failing_at(n, libc::EPERM);
                let (calls, err, reached) = run_on(&p, &plan, by_write);
                let (want, failed) = expected_on_failure(&full, n, &[Call::ExitGroup(127)]);
                assert_eq!(calls, want, "failing {:?}", full[n]);
                if failed {
                    assert_eq!(err, libc::EPERM, "failing {:?}", full[n]);
                    // Only a failed execve got past the point of no return.
                    assert_eq!(reached, matches!(full[n], Call::Execve(..)));
                }
            }
        }
    }
}
