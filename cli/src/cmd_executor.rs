//! `iii-shell executor`: run the executor half.

use std::os::fd::FromRawFd;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use iii_shell_executor::server::{check_peer, serve_connection};
use iii_shell_executor::{prepare_process, spawn_orphan_reaper, Executor};
use iii_shell_launch::{Launcher, Settings};
use nix::fcntl::{fcntl, FcntlArg, FdFlag};

use iii_shell_protocol::config::Config;

use crate::cli::ExecutorArgs;

/// `--peer-user NAME` becomes the `--peer-uid` of that user, or exit 2 with the reason.
pub fn resolve_peer_user(args: &mut ExecutorArgs) -> Result<(), i32> {
    let Some(name) = &args.peer_user else {
        return Ok(());
    };
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) => {
            args.peer_uid = Some(u.uid.as_raw());
            Ok(())
        }
        Ok(None) => {
            tracing::error!(
                "refusing to start: --peer-user {name}: no such user; create it (the package's sysusers.d entry does: systemd-sysusers) or pass --peer-uid"
            );
            Err(2)
        }
        Err(e) => {
            tracing::error!("refusing to start: --peer-user {name}: cannot look it up: {e}; check /etc/passwd and nsswitch.conf, or pass --peer-uid");
            Err(2)
        }
    }
}

/// What [`harden`] set up for [`run`].
pub struct Hardened {
    /// The pinned envelope (`--pin-config`).
    pub pinned: Option<Config>,
    /// The `--socket` listener, bound while the process could still chown it.
    pub listener: Option<std::os::unix::net::UnixListener>,
    /// What starts every command (made before the capabilities go: its cgroup base is made
    /// then).
    pub launcher: Arc<Launcher>,
}

/// Hardens the executor process. Must run before any other thread exists: capabilities are
/// per thread, and every thread created later inherits the state of the one that creates it.
pub fn harden(args: &ExecutorArgs) -> Result<Hardened, i32> {
    let launcher = Arc::new(Launcher::new(Settings::executor()));
    prepare_process(&launcher);
    if args.fd.is_some() {
        // Spawned by `serve` or `call`: shut down (killing our jobs) when the parent goes.
        // SAFETY: PR_SET_PDEATHSIG only sets a process attribute.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) };
    }
    // Bind the socket and hand it to the peer uid now: chown needs CAP_CHOWN, which the
    // hardening below drops.
    let mut listener = None;
    if let Some(path) = &args.socket {
        let own_uid = nix::unistd::getuid().as_raw();
        listener = Some(bind_socket(
            path,
            args.peer_uid.unwrap_or(own_uid),
            own_uid,
        )?);
    }
    if args.no_prestart {
        launcher.disable_prestart();
    }
    if args.no_state {
        iii_shell_executor::state_move::leave_alone();
    }
    let pinned = match &args.pin_config {
        Some(path) => match load_envelope(path) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!("refusing to start: --pin-config {}: {e}; the envelope must be a valid configuration (iii-shell check-config FILE), owned by root and writable by root only", path.display());
                return Err(2);
            }
        },
        None => None,
    };
    let envelope = pinned
        .as_ref()
        .map(|c| c.confinement.clone())
        .unwrap_or_default();
    // As root, keep what switching to the command user needs (effective and permitted only)
    // until the first policy says which user that is (`run_as`).
    let root = nix::unistd::geteuid().is_root();
    if args.socket.is_some() && !root {
        // Not root: commands can only run as our own uid, so this is known now. As root it
        // is known at the first policy, which says it then (`run_as::apply`).
        let own = nix::unistd::getuid().as_raw();
        if args.peer_uid.unwrap_or(own) == own {
            let msg = iii_shell_launch::run_as::PEER_IS_COMMAND_UID;
            if envelope.mode == iii_shell_protocol::config::ConfinementMode::Strict {
                tracing::error!("refusing to start in strict mode: {msg}");
                return Err(2);
            }
            tracing::warn!("{msg}");
        }
    }
    match iii_shell_executor::confine::harden_executor_retaining(&envelope, root) {
        Ok(report) => {
            if root {
                launcher.run_as().arm();
                if args.socket.is_some() {
                    launcher.run_as().set_peer_uid(
                        args.peer_uid
                            .unwrap_or_else(|| nix::unistd::getuid().as_raw()),
                    );
                }
            }
            for p in &report.problems {
                tracing::warn!("confinement is best-effort here: {p}");
            }
            tracing::info!(
                uid = report.uid,
                no_new_privs = report.no_new_privs,
                seccomp = report.seccomp_mode,
                capabilities = ?report.caps.effective,
                "executor hardened"
            );
            Ok(Hardened {
                pinned,
                listener,
                launcher,
            })
        }
        Err(e) => {
            tracing::error!("refusing to start: {e}; run `iii-shell doctor` to see which layer this kernel lacks, or set confinement.mode: best_effort in the pinned envelope");
            Err(2)
        }
    }
}

/// Reads the pinned envelope: it must be owned by root (or by us) and writable by nobody else.
pub fn load_envelope(path: &std::path::Path) -> Result<Config, String> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(path).map_err(|e| e.to_string())?;
    let me = nix::unistd::getuid().as_raw();
    if md.uid() != 0 && md.uid() != me {
        return Err(format!("owned by uid {}, not root", md.uid()));
    }
    if md.mode() & 0o022 != 0 {
        return Err(format!(
            "mode {:04o} lets others write it",
            md.mode() & 0o7777
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    Config::from_yaml(&text).map_err(|e| e.0)
}

/// Serves as the executor; `log_relay` is the relay the process's log layer fills.
pub async fn run(
    args: ExecutorArgs,
    hardened: Hardened,
    log_relay: iii_shell_executor::log_relay::Relay,
) -> i32 {
    let Hardened {
        pinned,
        listener,
        launcher,
    } = hardened;
    spawn_orphan_reaper();
    tokio::spawn(crate::heap::trim_when_quiet());
    let exec = Arc::new(Executor {
        log_relay,
        ..Executor::with_launcher(pinned, launcher)
    });
    if args.fd.is_some() {
        // Started by `serve` (or `call`) over an inherited socket: its parent is part of the
        // worker, and counts in its memory and CPU gauges.
        // SAFETY: getppid cannot fail.
        let _ = exec.supervisor.set(unsafe { libc::getppid() } as u32);
    }
    let own_uid = nix::unistd::getuid().as_raw();
    let expected = args.peer_uid.unwrap_or(own_uid);

    if let Some(fd) = args.fd {
        // SAFETY: the parent handed us this descriptor number as the inherited socket; we take
        // sole ownership of it here and nothing else in this process uses that number.
        let std_stream = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
        // The broker cleared close-on-exec so we could inherit it; set it again, or every
        // command we spawn would hold the broker connection.
        let cloexec = fcntl(&std_stream, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
            .map(drop)
            .map_err(std::io::Error::from);
        let stream = match cloexec
            .and_then(|_| std_stream.set_nonblocking(true))
            .and_then(|_| tokio::net::UnixStream::from_std(std_stream))
        {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(fd, error = %e, "--fd is not a usable socket; --fd is internal to `iii-shell serve` and `call`: use --socket PATH");
                return 2;
            }
        };
        if let Err(e) = check_peer(&stream, expected) {
            tracing::error!("refusing the inherited connection: {e}; --fd is internal to `iii-shell serve` and `call`: use --socket PATH");
            return 2;
        }
        tokio::select! {
            _ = serve_connection(exec.clone(), stream) => tracing::debug!("broker connection ended; shutting down"),
            _ = shutdown_signal() => tracing::info!("signal received; shutting down"),
        }
        exec.shutdown();
        return 0;
    }

    let Some(path) = args.socket else { return 2 };
    let listener = match listener.map_or_else(|| bind_socket(&path, expected, own_uid), Ok) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|_| tokio::net::UnixListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "cannot listen on the executor socket; check the file descriptor limit (LimitNOFILE)");
            return 2;
        }
    };
    tracing::info!(path = %path.display(), peer_uid = expected, "executor listening");
    let code = loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    if let Err(e) = check_peer(&stream, expected) {
                        tracing::warn!("refused a connection: {e}");
                        continue;
                    }
                    tokio::spawn(serve_connection(exec.clone(), stream));
                }
                Err(e) => tracing::warn!(error = %e, "accept failed"),
            },
            _ = shutdown_signal() => break 0,
        }
    };
    exec.shutdown();
    let _ = std::fs::remove_file(&path);
    code
}

/// Binds the executor socket; only the named peer may connect: owner = peer uid, mode 0600.
fn bind_socket(
    path: &std::path::Path,
    expected: u32,
    own_uid: u32,
) -> Result<std::os::unix::net::UnixListener, i32> {
    let _ = std::fs::remove_file(path);
    let listener = match std::os::unix::net::UnixListener::bind(path) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "cannot bind the executor socket; its directory must exist and be writable by root (RuntimeDirectory=iii-shell creates /run/iii-shell)");
            return Err(2);
        }
    };
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    if expected != own_uid {
        if let Err(e) = nix::unistd::chown(path, Some(nix::unistd::Uid::from_raw(expected)), None) {
            tracing::error!(error = %e, "cannot hand the socket to uid {expected}; the executor needs CAP_CHOWN at start-up (keep it in the unit's CapabilityBoundingSet)");
            return Err(2);
        }
    }
    Ok(listener)
}

/// SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
