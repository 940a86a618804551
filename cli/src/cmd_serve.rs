//! `iii-shell serve` (the default): the supervisor of the two halves.
//!
//! It validates the seed configuration, starts the executor (root stays root, minus every
//! capability the configuration does not list) over a socketpair with no path on disk, and
//! starts the broker as an unprivileged user (`confinement.broker_user`) when run as root.
//! Then it drops its own capabilities, sets no_new_privs and the seccomp deny filter, and
//! only watches: when the executor dies it starts a new one and hands its socket to the
//! broker over a control socket (the broker cannot exec anything itself), after a wait that
//! grows while executors die young ([`crate::respawn_backoff`]); when the broker dies on its
//! own it lets the executor go and starts a new pair (`serve_loop`), and when the broker
//! exits after a shutdown it exits with the broker's status; SIGTERM/SIGINT are forwarded to
//! the broker, which stops taking calls, answers those in flight and exits.

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use iii_shell_protocol::config::{Config, ConfinementMode};

use crate::cli::ServeArgs;
use crate::respawn_backoff::respawn_delay;
use crate::spawn_executor::{clear_cloexec, spawn_executor_raw};
use iii_shell_broker::confine::lookup_user;
use iii_shell_broker::executor_source::send_fd;

pub fn run(args: ServeArgs) -> i32 {
    // A seed file that exists but does not parse aborts boot before anything else happens.
    let seed = match args.seed() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}; refusing to start (fix or remove the file)");
            return 1;
        }
    };
    // strict refuses to start when the seed would run jailed commands as root or fall back
    // to nobody (the executor refuses such a policy too, whichever value the engine holds).
    if let Err(e) = iii_shell_launch::run_as::decide_here(&seed) {
        if seed.confinement.mode == ConfinementMode::Strict {
            tracing::error!("{e}; refusing to start (set confinement.run_as)");
            return 1;
        }
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "cannot locate our own binary (/proc/self/exe); mount /proc, or run the halves apart (iii-shell executor + iii-shell broker)");
            return 1;
        }
    };
    // A child subreaper: when an executor dies, the commands it started are re-parented to
    // us (not to init), so we can find and kill them before a new executor serves.
    if let Err(e) = iii_shell_confine::become_subreaper() {
        tracing::warn!(error = %e, "cannot become a child subreaper: where no job cgroup exists, commands of a dead executor may outlive it");
    }
    let executor_args: Vec<String> = match &args.pin_config {
        Some(p) => vec!["--pin-config".into(), p.display().to_string()],
        None => Vec::new(),
    };
    let starter = Starter {
        exe,
        executor_args,
        args,
        seed: seed.clone(),
    };
    let Some(pair) = starter.start_pair() else {
        return 1;
    };
    // The supervisor reads nothing from the network or the broker; it only starts executors
    // and hands their sockets over. It keeps its capabilities so that a respawned executor
    // starts exactly like the first (which then drops them itself), and takes no_new_privs,
    // a non-dumpable state and the seccomp deny filter.
    if let Err(e) = harden_supervisor(&seed) {
        tracing::error!("the supervisor cannot harden itself: {e}; strict mode stops here, best_effort goes on without it: run `iii-shell doctor` to see which layer this kernel lacks");
        if seed.confinement.mode == ConfinementMode::Strict {
            return 1;
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime; the process is out of threads or memory: raise the limits (ulimit -u, the unit's TasksMax/MemoryMax)");
            return 1;
        }
    };
    rt.block_on(serve_loop(starter, pair))
}

/// What `serve` needs to start the two halves again.
struct Starter {
    exe: std::path::PathBuf,
    executor_args: Vec<String>,
    args: ServeArgs,
    seed: Config,
}

/// A running executor and broker, and our end of the broker's control socket.
struct Pair {
    executor: Child,
    broker: Child,
    control: OwnedFd,
}

impl Starter {
    /// Starts an executor and a broker joined to it; `None` (logged) when either fails.
    fn start_pair(&self) -> Option<Pair> {
        let (executor, broker_end) = match spawn_executor_raw(&self.exe, &self.executor_args) {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the executor; check that this binary is executable and that the process limits (ulimit -u, the unit's TasksMax) allow two more processes");
                return None;
            }
        };
        match spawn_broker(&self.exe, &self.args, &self.seed, broker_end) {
            Ok((broker, control)) => Some(Pair {
                executor,
                broker,
                control,
            }),
            Err(e) => {
                tracing::error!("cannot start the broker: {e}; set confinement.broker_user to an existing unprivileged user (useradd --system NAME)");
                let mut executor = executor;
                let _ = executor.kill();
                let _ = executor.wait();
                None
            }
        }
    }
}

/// Supervises pairs of halves: when the broker dies (a signal, or a failure status) while
/// no shutdown was asked for, its executor is let go with its jobs and terminals (their
/// records lived in the broker), and a new pair starts after the respawn wait
/// ([`respawn_delay`]), so the worker serves again without help from its launcher (the
/// engine's `iii worker add` launcher does not restart a worker that exited). A broker
/// that exits with status 0 (it was told to stop) ends `serve` with status 0.
async fn serve_loop(starter: Starter, first: Pair) -> i32 {
    let mut pair = first;
    let mut last_delay: Option<Duration> = None;
    loop {
        let started = std::time::Instant::now();
        let Pair {
            executor,
            broker,
            control,
        } = pair;
        let code = match supervise(&starter, executor, broker, control).await {
            Ended::Exit(code) => return code,
            Ended::BrokerDied(code) => code,
        };
        let delay = respawn_delay(last_delay, started.elapsed());
        last_delay = Some(delay);
        tracing::error!(code, delay_ms = delay.as_millis() as u64, "the broker died; its executor, jobs and terminals went with it, and a new broker and executor are starting (the lines above say why it died)");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = crate::cmd_executor::shutdown_signal() => return code,
        }
        pair = match starter.start_pair() {
            Some(p) => p,
            None => return code,
        };
    }
}

fn harden_supervisor(seed: &Config) -> Result<(), String> {
    use iii_shell_confine::{seccomp, set_no_new_privs};
    // SAFETY: PR_SET_DUMPABLE 0 only changes a process flag.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    if seed.confinement.seccomp {
        // clone3 is let through here: the supervisor's filter is inherited by every executor
        // it starts later, and its clone3 exception names the supervisor's own call site,
        // not the new executor's, so a respawned executor would find clone3 ENOSYS and start
        // every command the slow way. Each executor installs its own filter, which refuses
        // clone3 but at its own call site; the supervisor reads no input and clones only
        // through std::process::Command.
        // For the same reason `unshare` and `mount` are let through: a respawned executor moves
        // into a mount namespace of its own and mounts the commands' private devpts there
        // before it installs its own filter, which refuses both to everything after it.
        let mut allow = seed.confinement.seccomp_allow.clone();
        for name in ["clone3", "unshare", "mount"] {
            if !allow.iter().any(|a| a == name) {
                allow.push(name.into());
            }
        }
        let f = seccomp::build(&allow)?;
        seccomp::install_self(&f).map_err(|e| format!("seccomp: {e}"))?;
    }
    Ok(())
}

/// Starts `iii-shell broker` with the executor's socket and a control socket.
fn spawn_broker(
    exe: &std::path::Path,
    args: &ServeArgs,
    seed: &Config,
    executor_end: OwnedFd,
) -> Result<(Child, OwnedFd), String> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(|e| e.to_string())?;
    let theirs: OwnedFd = theirs.into();
    clear_cloexec(&theirs).map_err(|e| e.to_string())?;
    clear_cloexec(&executor_end).map_err(|e| e.to_string())?;
    // The configuration and the URL go through an inherited descriptor, never the command
    // line (which every local user can read in /proc/<pid>/cmdline).
    let start_up = crate::cmd_broker::StartUp {
        seed: serde_json::to_value(seed).map_err(|e| e.to_string())?,
        url: args.url.clone(),
    };
    let seed_fd = start_up_fd(&serde_json::to_vec(&start_up).map_err(|e| e.to_string())?)
        .map_err(|e| format!("cannot hand the configuration to the broker: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("broker")
        .arg("--executor-fd")
        .arg(executor_end.as_raw_fd().to_string())
        .arg("--control-fd")
        .arg(theirs.as_raw_fd().to_string())
        .arg("--seed-fd")
        .arg(seed_fd.as_raw_fd().to_string())
        .stdin(Stdio::null());
    if let Some(id) = &args.config_id {
        cmd.arg("--config-id").arg(id);
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let (uid, gid) = lookup_user(&seed.confinement.broker_user)?;
        if uid == 0 {
            return Err(format!(
                "confinement.broker_user {:?} is root",
                seed.confinement.broker_user
            ));
        }
        // In the child, before execve: empty the bounding set (only possible while still
        // privileged), drop the supplementary groups, then switch gid and uid for good.
        // SAFETY: the closure allocates nothing and makes only raw, async-signal-safe system
        // calls (prctl, setgroups, setresgid, setresuid); errno is read on failure.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                for cap in 0..64 {
                    libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
                }
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(gid, gid, gid) != 0
                    || libc::setresuid(uid, uid, uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let child = cmd.spawn().map_err(|e| e.to_string())?;
    drop(seed_fd);
    drop(theirs);
    drop(executor_end);
    Ok((child, ours.into()))
}

/// An anonymous memory file holding `bytes`, positioned at its start, which the next child
/// inherits (close-on-exec cleared).
fn start_up_fd(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    use std::io::{Seek, Write};
    use std::os::fd::FromRawFd;
    // SAFETY: memfd_create with a NUL-terminated name and no flags returns a new descriptor
    // or -1.
    let fd = unsafe { libc::memfd_create(c"iii-shell-start-up".as_ptr(), 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.write_all(bytes)?;
    f.rewind()?;
    Ok(f.into())
}

enum Exit {
    Executor(Option<i32>),
    Broker(i32),
}

/// Whether a broker that exited with `code` (no shutdown asked) is replaced by a new pair:
/// yes when it crashed (a panic's 101, any other failure) or was killed by a signal
/// (128 + n); no for 0 (told to stop) and for [`crate::cmd_broker::STOPPED_ON_PURPOSE`] (it
/// stopped itself: a configuration id it cannot make, no executor, the engine refused it),
/// where a new broker would stop the same way: `serve` exits with that status instead, and
/// what started it (systemd's `Restart=`) decides.
pub fn replace_broker_after(code: i32) -> bool {
    code != 0 && code != crate::cmd_broker::STOPPED_ON_PURPOSE
}

/// How one pair's supervision ended.
enum Ended {
    /// `serve` ends with this status (a shutdown, or the broker's clean exit).
    Exit(i32),
    /// The broker died on its own, with this status: a new pair starts.
    BrokerDied(i32),
}

fn wait_thread(mut child: Child, tx: tokio::sync::mpsc::UnboundedSender<(u32, Option<i32>)>) {
    let pid = child.id();
    std::thread::spawn(move || {
        let code = child.wait().ok().and_then(|s| {
            s.code()
                .or_else(|| std::os::unix::process::ExitStatusExt::signal(&s).map(|s| 128 + s))
        });
        let _ = tx.send((pid, code));
    });
}

/// How long the supervisor waits, after an executor exited cleanly (status 0: its broker
/// connection ended, or it was sent SIGTERM), for the broker's exit or a shutdown signal
/// before it takes the exit for a failure and starts a new executor.
const CLEAN_EXIT_GRACE: Duration = Duration::from_secs(5);

async fn supervise(starter: &Starter, executor: Child, broker: Child, control: OwnedFd) -> Ended {
    let (exe, executor_args) = (&starter.exe, &starter.executor_args);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let broker_pid = broker.id();
    let mut executor_pid = executor.id();
    wait_thread(executor, tx.clone());
    wait_thread(broker, tx.clone());
    // The wait before the last respawn, and when the executor now running started.
    let mut last_delay: Option<Duration> = None;
    let mut started = std::time::Instant::now();
    let mut executor_alive = true;
    // Set by SIGTERM/SIGINT: from then on no executor is started again.
    let mut stopping = false;
    let mut pending: Option<Exit> = None;
    loop {
        let exit = if let Some(e) = pending.take() {
            e
        } else {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some((pid, code)) if pid == broker_pid => Exit::Broker(code.unwrap_or(1)),
                    Some((pid, code)) if pid == executor_pid => Exit::Executor(code),
                    Some(_) => continue,
                    None => return Ended::Exit(1),
                },
                _ = crate::cmd_executor::shutdown_signal() => {
                    tracing::info!("forwarding the shutdown to the broker");
                    stopping = true;
                    // SAFETY: kill(2) on our child's pid with SIGTERM.
                    unsafe { libc::kill(broker_pid as i32, libc::SIGTERM) };
                    continue;
                }
            }
        };
        match exit {
            Exit::Broker(code) => {
                tracing::info!(code, "the broker exited");
                // The executor sees EOF on its socket, kills its jobs and exits.
                if executor_alive {
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                    while tokio::time::Instant::now() < deadline {
                        match tokio::time::timeout_at(deadline, rx.recv()).await {
                            Ok(Some((pid, _))) if pid == executor_pid => break,
                            Ok(Some(_)) => continue,
                            _ => {
                                // SAFETY: kill(2) on our child's pid.
                                unsafe { libc::kill(executor_pid as i32, libc::SIGKILL) };
                                break;
                            }
                        }
                    }
                }
                kill_what_it_left(executor_pid, broker_pid);
                return if stopping || !replace_broker_after(code) {
                    Ended::Exit(code)
                } else {
                    Ended::BrokerDied(code)
                };
            }
            Exit::Executor(code) => {
                executor_alive = false;
                let dead = executor_pid;
                // Whatever the dead executor started dies with it, before anything else.
                kill_what_it_left(dead, broker_pid);
                if stopping {
                    tracing::info!(pid = dead, "the executor exited during shutdown");
                    continue;
                }
                // A clean exit is usually the first half of a shutdown (the broker closed
                // its connection, or the whole group got SIGTERM): wait for the other half.
                let delay = respawn_delay(last_delay, started.elapsed());
                let grace = if code == Some(0) {
                    CLEAN_EXIT_GRACE
                } else {
                    delay
                };
                let sleep = tokio::time::sleep(grace);
                tokio::pin!(sleep);
                let interrupted = loop {
                    tokio::select! {
                        _ = &mut sleep => break false,
                        ev = rx.recv() => match ev {
                            Some((pid, c)) if pid == broker_pid => {
                                pending = Some(Exit::Broker(c.unwrap_or(1)));
                                break true;
                            }
                            Some(_) => continue,
                            None => return Ended::Exit(1),
                        },
                        _ = crate::cmd_executor::shutdown_signal() => {
                            tracing::info!("forwarding the shutdown to the broker");
                            stopping = true;
                            // SAFETY: kill(2) on our child's pid with SIGTERM.
                            unsafe { libc::kill(broker_pid as i32, libc::SIGTERM) };
                            break true;
                        }
                    }
                };
                if interrupted {
                    tracing::info!(pid = dead, "the executor exited during shutdown");
                    continue;
                }
                let delay_ms = grace.as_millis() as u64;
                match code {
                    Some(0) => tracing::warn!(pid = dead, delay_ms, "the executor exited on its own; starting a new one"),
                    Some(c) if c > 128 => tracing::error!(pid = dead, signal = c - 128, delay_ms, "the executor was killed; its commands and jobs were killed with it and a new executor is starting (look for the OOM killer or an operator's kill in the system log)"),
                    c => tracing::error!(pid = dead, code = ?c, delay_ms, "the executor failed; its commands and jobs were killed with it and a new executor is starting (its log lines above say why)"),
                }
                last_delay = Some(delay);
                started = std::time::Instant::now();
                match spawn_executor_raw(exe, executor_args) {
                    Ok((child, end)) => {
                        executor_pid = child.id();
                        executor_alive = true;
                        wait_thread(child, tx.clone());
                        if let Err(e) = send_fd(control.as_raw_fd(), end.as_raw_fd()) {
                            tracing::error!(error = %e, "cannot hand the new executor to the broker; restart iii-shell");
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the executor; check that the iii-shell binary is still in place, then restart iii-shell")
                    }
                }
            }
        }
    }
}

/// Kills everything the executor `dead` started: its job cgroups (the whole subtree, setsid
/// daemons included), then every process re-parented to us, the supervisor being a child
/// subreaper (job trees where no job cgroup exists), with their sessions, process groups
/// and descendants. The zombies are reaped. Only the broker is spared.
fn kill_what_it_left(dead: u32, broker_pid: u32) {
    use iii_shell_launch::{cgroups, procfs};
    if let Some(base) = cgroups::base_of(dead) {
        if !cgroups::kill_base(&base) {
            tracing::warn!(path = %base.display(), "the dead executor's job cgroups are not gone yet");
        }
    }
    // Its job twins in a cgroup v1 pids hierarchy, now empty (the same processes were in
    // the v2 job cgroups just killed); the next executor's sweep removes any left behind.
    iii_shell_launch::pids_v1::remove_base_of(dead);
    let me = std::process::id() as i32;
    let spared = |p: i32| p == broker_pid as i32 || p == me || p <= 1;
    // A SIGKILLed process can take a while to exit on a loaded host: keep killing until no
    // orphan is left alive (zombies are reaped below), within a bound.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let table = procfs::all();
        let orphans: Vec<i32> = table
            .iter()
            .filter(|p| p.ppid == me && !spared(p.pid) && p.state != b'Z')
            .map(|p| p.pid)
            .collect();
        if orphans.is_empty() {
            break;
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!(left = ?orphans, "processes of the dead executor are still exiting after 2 s of SIGKILL");
            break;
        }
        let mut victims = Vec::new();
        for &o in &orphans {
            victims.extend(
                table
                    .iter()
                    .filter(|p| p.sid == o || p.pgid == o)
                    .map(|p| p.pid),
            );
            victims.extend(procfs::descendants(o, &table));
        }
        victims.sort_unstable();
        victims.dedup();
        for v in victims.into_iter().filter(|&v| !spared(v)) {
            // SAFETY: kill(2) with a positive pid and SIGKILL has no memory effects.
            unsafe { libc::kill(v, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    reap_orphans(broker_pid);
}

/// Reaps our zombie children other than the broker (orphans re-parented to us). The current
/// executor is reaped by its own wait thread.
fn reap_orphans(broker_pid: u32) {
    for pid in iii_shell_launch::procfs::own_children() {
        if pid == broker_pid as i32 {
            continue;
        }
        if iii_shell_launch::procfs::stat(pid).is_some_and(|s| s.state == b'Z') {
            // SAFETY: waitpid on one specific zombie child; the status is discarded.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        }
    }
}

#[cfg(test)]
mod replace_tests {
    use super::replace_broker_after;

    #[test]
    fn only_a_crashed_or_killed_broker_is_replaced() {
        let got: Vec<(i32, bool)> = [0, 1, 2, 101, 128 + 9, 128 + 15]
            .into_iter()
            .map(|c| (c, replace_broker_after(c)))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, false),
                (1, false),
                (2, true),
                (101, true),
                (137, true),
                (143, true)
            ]
        );
    }
}
