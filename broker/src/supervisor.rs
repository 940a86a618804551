//! Keeps an executor running for `serve`: spawns it over a socketpair, hands it the current
//! policy, and respawns it if it dies. In-flight calls of a dead executor fail with S216.

use std::sync::Arc;
use std::time::Duration;

use iii_shell_protocol::messages::Request;
use tokio::sync::watch;

use crate::executor_client::ExecutorClient;
use crate::services::Services;
use crate::spawn_executor::spawn_executor_with;

pub struct Supervisor {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Supervisor {
    /// Starts the executor and waits until the first one is connected.
    pub async fn start(services: Arc<Services>, exe: std::path::PathBuf, args: Vec<String>) -> Result<Supervisor, String> {
        let (stop, stop_rx) = watch::channel(false);
        let (ready_tx, mut ready_rx) = watch::channel(false);
        let task = tokio::spawn(supervise(services, exe, args, stop_rx, ready_tx));
        tokio::time::timeout(Duration::from_secs(10), ready_rx.wait_for(|r| *r))
            .await
            .map_err(|_| "the executor did not come up within 10 s".to_string())?
            .map_err(|_| "the executor could not be started".to_string())?;
        Ok(Supervisor { stop, task })
    }

    /// Stops respawning and lets the executor exit (it sees EOF, kills its jobs, exits).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

async fn supervise(
    services: Arc<Services>,
    exe: std::path::PathBuf,
    args: Vec<String>,
    mut stop: watch::Receiver<bool>,
    ready: watch::Sender<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let (mut child, stream) = match spawn_executor_with(&exe, &args) {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the executor");
                if sleep_or_stop(&mut stop, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let client = match ExecutorClient::connect(stream).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "executor handshake failed");
                let _ = child.kill();
                let _ = child.wait();
                if sleep_or_stop(&mut stop, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let pid = client.pid;
        services.executor.set(client.clone());
        // The newest runtime (a reload may race us; the executor ignores stale generations).
        if let Some(rt) = services.runtime.get() {
            if let Err(e) = client.call(Request::SetPolicy { generation: rt.generation, config_json: rt.config_json() }).await {
                tracing::error!(error = %e, "the respawned executor refused the current policy");
            }
        }
        let _ = ready.send(true);
        tracing::info!(pid, "executor running");
        let started = std::time::Instant::now();
        tokio::select! {
            _ = client.closed() => {}
            _ = async { let _ = stop.wait_for(|s| *s).await; } => {
                drop(client);
                services.executor.clear();
                let _ = tokio::task::spawn_blocking(move || {
                    let deadline = std::time::Instant::now() + Duration::from_secs(5);
                    while std::time::Instant::now() < deadline {
                        if let Ok(Some(_)) = child.try_wait() { return; }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let _ = child.kill();
                    let _ = child.wait();
                }).await;
                return;
            }
        }
        let status = tokio::task::spawn_blocking(move || child.wait()).await;
        tracing::error!(pid, status = ?status.ok().and_then(|s| s.ok()), "the executor exited; respawning it");
        if started.elapsed() > Duration::from_secs(10) {
            backoff = Duration::from_millis(100);
        }
        if sleep_or_stop(&mut stop, backoff).await {
            return;
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Sleeps; true when asked to stop meanwhile.
async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    let stopped = tokio::select! {
        _ = tokio::time::sleep(d) => None,
        _ = stop.wait_for(|s| *s) => Some(true),
    };
    stopped.unwrap_or_else(|| *stop.borrow())
}
