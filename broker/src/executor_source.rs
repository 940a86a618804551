//! Where the broker's executor connections come from.
//!
//! * `serve`: an inherited socketpair end, plus a control socket on which the supervisor
//!   hands over the socket of a respawned executor (SCM_RIGHTS). The broker itself never
//!   spawns anything: after start-up it cannot exec programs.
//! * Separate units: a socket path, reconnected whenever the executor restarts.
//!
//! Every new connection is given the current policy before it is used.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use iii_shell_protocol::messages::Request;
use tokio::net::UnixStream;

use crate::executor_client::ExecutorClient;
use crate::services::Services;

pub enum ExecutorSource {
    /// The executor's socket and the supervisor's control socket (fds).
    Inherited {
        executor: OwnedFd,
        control: Option<OwnedFd>,
    },
    /// A listening executor at this path.
    Path(PathBuf),
}

/// The running connection keeper.
pub struct Executors {
    task: tokio::task::JoinHandle<()>,
}

fn stream_from(fd: OwnedFd) -> std::io::Result<UnixStream> {
    let s = std::os::unix::net::UnixStream::from(fd);
    s.set_nonblocking(true)?;
    UnixStream::from_std(s)
}

/// Hands `client` the newest policy, then installs it: calls waiting for a new executor
/// reach it only once it holds the policy in force.
async fn install(services: &Arc<Services>, client: ExecutorClient) {
    if let Some(rt) = services.snapshots.get() {
        match client
            .call(Request::SetPolicy {
                generation: rt.generation,
                config_json: rt.config_json(),
            })
            .await
        {
            Ok(reply) => services.snapshots.accepted(&reply),
            Err(e) => {
                tracing::error!(error = %e, "the executor refused the current policy; it exceeds the pinned envelope or names a missing root: fix the configuration entry or widen /etc/iii-shell/envelope.yaml (shell::config-status shows the reason)")
            }
        }
    }
    services.install_executor(client.clone());
    crate::pty_delivery::subscribe(&services.pty, &client);
    // The change feed's watchers live in the executor: start them on this one.
    services.executor_ready(&client);
    tracing::info!(pid = client.pid, "executor running");
}

impl ExecutorSource {
    /// Takes an fd number handed to us on the command line.
    ///
    /// # Safety
    /// `fd` must be an open descriptor this process owns and nothing else uses.
    pub unsafe fn inherited(executor: RawFd, control: Option<RawFd>) -> ExecutorSource {
        // SAFETY: guaranteed by the caller.
        unsafe {
            ExecutorSource::Inherited {
                executor: OwnedFd::from_raw_fd(executor),
                control: control.map(|c| OwnedFd::from_raw_fd(c)),
            }
        }
    }

    /// Connects the first executor and keeps connections coming.
    pub async fn start(self, services: Arc<Services>) -> Result<Executors, String> {
        match self {
            ExecutorSource::Inherited { executor, control } => {
                let stream = stream_from(executor).map_err(|e| format!("executor socket: {e}"))?;
                let client = ExecutorClient::connect(stream)
                    .await
                    .map_err(|e| e.to_string())?;
                install(&services, client).await;
                if control.is_some() {
                    services.executor.expect_replacements();
                }
                let task = tokio::spawn(async move {
                    let Some(control) = control else { return };
                    receive_respawns(services, control).await;
                });
                Ok(Executors { task })
            }
            ExecutorSource::Path(path) => {
                services.executor.expect_replacements();
                let task = tokio::spawn(async move { reconnect_loop(services, path).await });
                Ok(Executors { task })
            }
        }
    }
}

impl Executors {
    /// Lets the executor go: closing our end makes a `serve` executor kill its jobs and exit.
    pub async fn shutdown(self, services: &Services) {
        self.task.abort();
        services.executor.clear();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for the supervisor to hand over the socket of a respawned executor.
async fn receive_respawns(services: Arc<Services>, control: OwnedFd) {
    let std_sock = std::os::unix::net::UnixStream::from(control);
    if std_sock.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(sock) = UnixStream::from_std(std_sock) else {
        return;
    };
    loop {
        if sock.readable().await.is_err() {
            return;
        }
        match sock.try_io(tokio::io::Interest::READABLE, || recv_fd(sock.as_raw_fd())) {
            Ok(Some(fd)) => match stream_from(fd) {
                Ok(stream) => match ExecutorClient::connect(stream).await {
                    Ok(client) => install(&services, client).await,
                    Err(e) => {
                        tracing::error!(error = %e, "respawned executor handshake failed; the broker and the executor must be the same iii-shell binary: restart the worker after an upgrade")
                    }
                },
                Err(e) => {
                    tracing::error!(error = %e, "bad executor socket from the supervisor (a bug); restart the worker")
                }
            },
            Ok(None) => {
                tracing::debug!("the supervisor closed the control socket");
                return;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!(error = %e, "control socket failed");
                return;
            }
        }
    }
}

/// Receives one fd (SCM_RIGHTS). `None` at EOF.
fn recv_fd(sock: RawFd) -> std::io::Result<Option<OwnedFd>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(std::io::Error::from)?;
    if msg.bytes == 0 {
        return Ok(None);
    }
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if let Some(&fd) = fds.first() {
                // SAFETY: the kernel just installed this descriptor in our table for us.
                return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
    }
    Err(std::io::Error::other(
        "control message without a descriptor",
    ))
}

/// Sends one fd (SCM_RIGHTS) over a Unix socket.
pub fn send_fd(sock: RawFd, fd: RawFd) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let byte = [1u8];
    let iov = [std::io::IoSlice::new(&byte)];
    let fds = [fd];
    sendmsg::<()>(
        sock,
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(std::io::Error::from)?;
    Ok(())
}

/// Separate units: connect to the executor socket, and reconnect whenever it goes away.
async fn reconnect_loop(services: Arc<Services>, path: PathBuf) {
    let mut logged = false;
    loop {
        match UnixStream::connect(&path).await {
            Ok(stream) => match ExecutorClient::connect(stream).await {
                Ok(client) => {
                    logged = false;
                    install(&services, client.clone()).await;
                    client.closed().await;
                    tracing::error!(path = %path.display(), "the executor connection ended; reconnecting (its log says why: journalctl -u iii-shell-executor)");
                }
                Err(e) => {
                    tracing::error!(error = %e, "executor handshake failed; the broker and the executor must be the same iii-shell release: restart both after an upgrade")
                }
            },
            Err(e) => {
                if !logged {
                    tracing::error!(path = %path.display(), error = %e, "cannot reach the executor socket; retrying every second. Start the executor (systemctl start iii-shell-executor), and run the broker as its --peer-user");
                    logged = true;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
