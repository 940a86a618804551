//! `iii-shell serve` (the default): the supervisor of the two halves.
//!
//! It validates the seed configuration, starts the executor (root stays root, minus every
//! capability the configuration does not list) over a socketpair with no path on disk, and
//! starts the broker as an unprivileged user (`confinement.broker_user`) when run as root.
//! Then it drops its own capabilities, sets no_new_privs and the seccomp deny filter, and
//! only watches: when the executor dies it starts a new one and hands its socket to the
//! broker over a control socket (the broker cannot exec anything itself); when the broker
//! exits it exits with the broker's status; SIGTERM/SIGINT are forwarded to the broker, which
//! stops taking calls, answers those in flight and exits.

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use iii_shell_protocol::config::{Config, ConfinementMode};

use crate::cli::ServeArgs;
use crate::confine::lookup_user;
use crate::executor_source::send_fd;
use crate::lifecycle::load_seed;
use crate::spawn_executor::{clear_cloexec, spawn_executor_raw};

pub fn run(args: ServeArgs) -> i32 {
    // A seed file that exists but does not parse aborts boot before anything else happens.
    let seed = match load_seed(&args.config) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}; refusing to start (fix or remove the file)");
            return 1;
        }
    };
    // strict refuses to start when the seed would run jailed commands as root or fall back
    // to nobody (the executor refuses such a policy too, whichever value the engine holds).
    if let Err(e) = iii_shell_executor::run_as::decide_here(&seed) {
        if seed.confinement.mode == ConfinementMode::Strict {
            tracing::error!("{e}; refusing to start (set confinement.run_as)");
            return 1;
        }
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "cannot locate our own binary");
            return 1;
        }
    };
    let executor_args: Vec<String> = match &args.pin_config {
        Some(p) => vec!["--pin-config".into(), p.display().to_string()],
        None => Vec::new(),
    };
    let (executor, broker_end) = match spawn_executor_raw(&exe, &executor_args) {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the executor");
            return 1;
        }
    };
    let (broker, control) = match spawn_broker(&exe, &args, &seed, broker_end) {
        Ok(x) => x,
        Err(e) => {
            tracing::error!("cannot start the broker: {e}");
            let mut executor = executor;
            let _ = executor.kill();
            let _ = executor.wait();
            return 1;
        }
    };
    // The supervisor reads nothing from the network or the broker; it only starts executors
    // and hands their sockets over. It keeps its capabilities so that a respawned executor
    // starts exactly like the first (which then drops them itself), and takes no_new_privs,
    // a non-dumpable state and the seccomp deny filter.
    if let Err(e) = harden_supervisor(&seed) {
        tracing::error!("supervisor: {e}");
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
            tracing::error!(error = %e, "cannot start the async runtime");
            return 1;
        }
    };
    rt.block_on(supervise(exe, executor_args, executor, broker, control))
}

fn harden_supervisor(seed: &Config) -> Result<(), String> {
    use iii_shell_executor::confine::{seccomp, set_no_new_privs};
    // SAFETY: PR_SET_DUMPABLE 0 only changes a process flag.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    if seed.confinement.seccomp {
        let f = seccomp::build(&seed.confinement.seccomp_allow)?;
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
    let seed_json = serde_json::to_string(seed).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg("broker")
        .arg("--executor-fd")
        .arg(executor_end.as_raw_fd().to_string())
        .arg("--control-fd")
        .arg(theirs.as_raw_fd().to_string())
        .arg("--seed-json")
        .arg(seed_json)
        .stdin(Stdio::null());
    if let Some(url) = &args.url {
        cmd.arg("--url").arg(url);
    }
    if let Some(id) = &args.config_id {
        cmd.arg("--config-id").arg(id);
    }
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", crate::logging::default_filter());
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
    drop(theirs);
    drop(executor_end);
    Ok((child, ours.into()))
}

enum Exit {
    Executor,
    Broker(i32),
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

async fn supervise(
    exe: std::path::PathBuf,
    executor_args: Vec<String>,
    executor: Child,
    broker: Child,
    control: OwnedFd,
) -> i32 {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let broker_pid = broker.id();
    let mut executor_pid = executor.id();
    wait_thread(executor, tx.clone());
    wait_thread(broker, tx.clone());
    let mut backoff = Duration::from_millis(100);
    let mut executor_alive = true;
    loop {
        let exit = tokio::select! {
            ev = rx.recv() => match ev {
                Some((pid, code)) if pid == broker_pid => Exit::Broker(code.unwrap_or(1)),
                Some((pid, _)) if pid == executor_pid => Exit::Executor,
                Some(_) => continue,
                None => return 1,
            },
            _ = crate::cmd_executor::shutdown_signal() => {
                tracing::info!("forwarding the shutdown to the broker");
                // SAFETY: kill(2) on our child's pid with SIGTERM.
                unsafe { libc::kill(broker_pid as i32, libc::SIGTERM) };
                continue;
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
                return code;
            }
            Exit::Executor => {
                executor_alive = false;
                tracing::error!(pid = executor_pid, "the executor exited; respawning it");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                match spawn_executor_raw(&exe, &executor_args) {
                    Ok((child, end)) => {
                        executor_pid = child.id();
                        executor_alive = true;
                        wait_thread(child, tx.clone());
                        if let Err(e) = send_fd(control.as_raw_fd(), end.as_raw_fd()) {
                            tracing::error!(error = %e, "cannot hand the new executor to the broker");
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "cannot start the executor"),
                }
            }
        }
    }
}
