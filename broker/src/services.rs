//! What every handler can reach: the live configuration snapshot and the executor.

use std::sync::{Arc, Mutex, RwLock};

use iii_shell_policy::sync::lock;
use iii_shell_protocol::messages::Request;
use iii_shell_protocol::{Code, WireError};

use crate::call_deadline::CallBounds;
use crate::engine::EngineLink;
use crate::executor_client::ExecutorClient;
use crate::sandbox_jobs::SandboxJobs;
pub use crate::slots::{EngineSlot, ExecutorSlot};
use crate::snapshot::SnapshotCell;

/// Told of every executor once it is installed and holds the policy in force.
pub type ExecutorListener = Box<dyn Fn(&ExecutorClient) + Send + Sync>;

pub struct Services {
    pub snapshots: Arc<SnapshotCell>,
    pub executor: Arc<ExecutorSlot>,
    /// Background jobs on sandbox targets (host jobs live in the executor).
    pub sandbox_jobs: SandboxJobs,
    /// The broker's record of the host jobs it started, which outlives their executor.
    pub job_book: Arc<crate::job_book::JobBook>,
    /// Delivery of terminal-session output to output functions (the pty functions record
    /// attachments in it). It holds the slots, not these services.
    pub pty: Arc<crate::pty_delivery::Delivery>,
    /// The engine connection, when serving (channels and sandbox forwarding need it).
    pub engine: Arc<EngineSlot>,
    /// What to tell of each executor installed (the change feed restarts its watchers).
    executor_listeners: Mutex<Vec<ExecutorListener>>,
    /// The deadlines of calls to the executors installed from now on.
    call_bounds: RwLock<CallBounds>,
    /// Executors installed so far (every one after the first is a respawn).
    executors_installed: std::sync::atomic::AtomicU64,
}

impl Services {
    pub fn new() -> Arc<Services> {
        let executor: Arc<ExecutorSlot> = Arc::default();
        let engine: Arc<EngineSlot> = Arc::default();
        Arc::new(Services {
            snapshots: Arc::default(),
            pty: Arc::new(crate::pty_delivery::Delivery::new(
                executor.clone(),
                engine.clone(),
            )),
            executor,
            sandbox_jobs: SandboxJobs::default(),
            job_book: Default::default(),
            engine,
            executor_listeners: Mutex::default(),
            call_bounds: RwLock::new(CallBounds::DEFAULT),
            executors_installed: Default::default(),
        })
    }

    /// Other deadlines for calls to the executors installed from now on (tests shorten them).
    pub fn set_call_bounds(&self, bounds: CallBounds) {
        *self.call_bounds.write().unwrap_or_else(|p| p.into_inner()) = bounds;
    }

    pub fn set_engine(&self, link: EngineLink) {
        self.engine.set(link);
    }

    /// Calls `listener` with every executor installed from now on, once it holds the policy.
    pub fn on_executor_ready(&self, listener: ExecutorListener) {
        lock(&self.executor_listeners).push(listener);
    }

    /// `client` is installed and holds the policy in force: tells the listeners.
    pub fn executor_ready(&self, client: &ExecutorClient) {
        for listener in lock(&self.executor_listeners).iter() {
            listener(client);
        }
    }

    /// Shakes hands with the executor on `stream`, gives it the configuration in force and
    /// makes it the executor calls go to. Returns its pid. S216 when no configuration is
    /// installed or the handshake fails; the executor's own error when it refuses the policy.
    pub async fn attach_executor(&self, stream: tokio::net::UnixStream) -> Result<u32, WireError> {
        let rt = self
            .snapshots
            .get()
            .ok_or_else(|| WireError::new(Code::S216, "no configuration installed"))?;
        let bounds = *self.call_bounds.read().unwrap_or_else(|p| p.into_inner());
        let client = ExecutorClient::connect(stream)
            .await
            .map_err(|e| WireError::new(Code::S216, e.to_string()))?
            .with_bounds(bounds);
        let reply = client
            .call(Request::SetPolicy {
                generation: rt.generation,
                config_json: rt.config_json(),
            })
            .await?;
        self.snapshots.accepted(&reply);
        let pid = client.pid;
        self.install_executor(client);
        Ok(pid)
    }

    /// Makes `client` the executor calls go to. The jobs of any other executor are now
    /// answered from the job book, and the job ends this one reports are recorded in it.
    pub fn install_executor(&self, client: ExecutorClient) {
        let client =
            client.with_bounds(*self.call_bounds.read().unwrap_or_else(|p| p.into_inner()));
        if self
            .executors_installed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            > 0
        {
            if let Some(hub) = crate::telemetry::installed() {
                hub.metrics.respawned();
            }
        }
        self.job_book.executor_installed(client.pid);
        let mut events = client.events();
        let book = self.job_book.clone();
        tokio::spawn(async move {
            use iii_shell_protocol::messages::Event;
            loop {
                match events.recv().await {
                    Ok(Event::JobExited {
                        job_id,
                        status,
                        exit_code,
                    }) => book.ended(&job_id, status, exit_code),
                    // Other events (terminal output, …) have their own subscribers.
                    Ok(_) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                }
            }
        });
        self.executor.set(client);
    }

    /// The engine link, or S216 when running without one (`iii-shell call`).
    pub fn engine(&self) -> Result<EngineLink, WireError> {
        self.engine.get()
    }
}

/// The reply kind did not match the request: the executor is not speaking our protocol.
pub fn unexpected_reply() -> WireError {
    WireError::new(Code::S216, "unexpected reply from the executor")
}
