//! What every handler can reach: the live configuration snapshot and the executor.

use std::sync::{Arc, RwLock};

use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::{Code, WireError};

use crate::call_deadline::CallBounds;
use crate::engine::EngineLink;
use crate::executor_client::{executor_lost, ExecutorClient, OutputStream};
use crate::sandbox_jobs::SandboxJobs;
use crate::snapshot::SnapshotCell;

/// The executor connection in use; replaced when a respawned executor comes up.
#[derive(Default)]
pub struct ExecutorSlot {
    client: RwLock<Option<ExecutorClient>>,
}

impl ExecutorSlot {
    pub fn set(&self, c: ExecutorClient) {
        *self.client.write().unwrap_or_else(|p| p.into_inner()) = Some(c);
    }

    pub fn clear(&self) {
        *self.client.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    pub fn get(&self) -> Option<ExecutorClient> {
        self.client.read().ok().and_then(|g| g.clone())
    }

    pub async fn call(&self, request: Request) -> Result<Reply, WireError> {
        match self.get() {
            Some(c) if !c.is_closed() => c.call(request).await,
            _ => Err(executor_lost()),
        }
    }

    pub async fn call_with_output(
        &self,
        request: Request,
    ) -> Result<(Reply, OutputStream), WireError> {
        match self.get() {
            Some(c) if !c.is_closed() => c.call_with_output(request).await,
            _ => Err(executor_lost()),
        }
    }

    pub async fn call_with_input(
        &self,
        request: Request,
        input: tokio::sync::mpsc::Receiver<Result<Vec<u8>, String>>,
    ) -> Result<Reply, WireError> {
        match self.get() {
            Some(c) if !c.is_closed() => c.call_with_input(request, input).await,
            _ => Err(executor_lost()),
        }
    }
}

pub struct Services {
    pub snapshots: Arc<SnapshotCell>,
    pub executor: Arc<ExecutorSlot>,
    /// Background jobs on sandbox targets (host jobs live in the executor).
    pub sandbox_jobs: SandboxJobs,
    /// The broker's record of the host jobs it started, which outlives their executor.
    pub job_book: Arc<crate::job_book::JobBook>,
    /// Delivery of terminal-session output to output functions.
    pub pty: Arc<crate::pty_delivery::Delivery>,
    /// The `shell::changed` bindings this worker serves.
    pub changed: crate::changed::ChangedFeed,
    /// The engine connection, when serving (channels and sandbox forwarding need it).
    engine: RwLock<Option<EngineLink>>,
    /// The deadlines of calls to the executors installed from now on.
    call_bounds: RwLock<CallBounds>,
    /// Executors installed so far (every one after the first is a respawn).
    executors_installed: std::sync::atomic::AtomicU64,
}

impl Services {
    pub fn new() -> Arc<Services> {
        Arc::new(Services {
            snapshots: Arc::default(),
            executor: Arc::default(),
            sandbox_jobs: SandboxJobs::default(),
            job_book: Default::default(),
            pty: Arc::default(),
            changed: Default::default(),
            engine: RwLock::new(None),
            call_bounds: RwLock::new(CallBounds::DEFAULT),
            executors_installed: Default::default(),
        })
    }

    /// Other deadlines for calls to the executors installed from now on (tests shorten them).
    pub fn set_call_bounds(&self, bounds: CallBounds) {
        *self.call_bounds.write().unwrap_or_else(|p| p.into_inner()) = bounds;
    }

    pub fn set_engine(&self, link: EngineLink) {
        *self.engine.write().unwrap_or_else(|p| p.into_inner()) = Some(link);
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
        client
            .call(Request::SetPolicy {
                generation: rt.generation,
                config_json: rt.config_json(),
            })
            .await?;
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
        self.engine
            .read()
            .ok()
            .and_then(|g| g.clone())
            .ok_or_else(|| WireError::new(Code::S216, "this needs an engine connection (data channels and sandbox targets go through the engine); run under `iii-shell serve`"))
    }
}

/// The reply kind did not match the request: the executor is not speaking our protocol.
pub fn unexpected_reply() -> WireError {
    WireError::new(Code::S216, "unexpected reply from the executor")
}
