//! Engine-wide state shared by every socket task, and the snapshot types tests read.
//!
//! All state sits behind one `std::sync::Mutex` that is never held across an
//! `.await`; every mutation goes through [`Shared::update`], which wakes the
//! `wait_*` helpers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::AbortHandle;
use tokio_tungstenite::tungstenite::Message;
use uuid::Uuid;

use crate::config_store::ConfigStore;
use crate::engine_functions::Builtin;
use crate::protocol::{ErrorBody, Inbound};
use crate::triggers::TriggerRegistry;

pub(crate) use crate::protocol::DEFAULT_NAMESPACE;

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub namespace_grace: Duration,
    pub restart_pause: Duration,
    pub handshake_timeout: Duration,
    /// Keep `invokefunction` / `invocationresult` frames in the frame logs (the default).
    /// Off for benches, whose bulk invocations would otherwise grow the logs without bound.
    pub keep_invocation_frames: bool,
}

/// Commands for a worker socket task.
#[derive(Debug)]
pub(crate) enum Outbound {
    Frame(Message),
    /// Send a Close frame, then drop the socket.
    Close,
    /// Drop the TCP socket without a Close frame.
    Abort,
    PauseReads(bool),
}

/// What runs an engine function ([`crate::builtins::run`], installed by the engine's start).
pub(crate) type BuiltinRunner =
    fn(&Arc<Shared>, Option<Uuid>, Builtin, Value) -> Result<Value, ErrorBody>;

pub(crate) struct Shared {
    state: Mutex<State>,
    /// Runs the engine's own functions (routing resolves to them, and does not name them).
    pub run_builtin: BuiltinRunner,
    changed: Notify,
    pub settings: Settings,
    pub port: u16,
    /// Socket tasks (worker and channel connections), aborted on stop/restart.
    tasks: Mutex<Vec<AbortHandle>>,
    /// Whether `/otel` upgrades are accepted (a test turns it off to see a worker cope).
    pub otel_accepted: std::sync::atomic::AtomicBool,
    /// Bumped to close every open `/otel` socket.
    pub otel_epoch: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    pub(crate) fn new(settings: Settings, port: u16, run_builtin: BuiltinRunner) -> Arc<Self> {
        Arc::new(Self {
            run_builtin,
            state: Mutex::new(State {
                keep_invocation_frames: settings.keep_invocation_frames,
                ..State::default()
            }),
            changed: Notify::new(),
            settings,
            port,
            tasks: Mutex::new(Vec::new()),
            otel_accepted: std::sync::atomic::AtomicBool::new(true),
            otel_epoch: tokio::sync::watch::channel(0).0,
        })
    }

    /// Read-only access; use [`Shared::update`] to mutate.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Mutates the state and wakes every waiter.
    pub(crate) fn update<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let out = f(&mut self.lock());
        self.changed.notify_waiters();
        out
    }

    /// Completes on the next state change (call `enable()` before checking).
    pub(crate) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    pub(crate) fn base_url(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port)
    }

    /// Polls `f` after every state change until it yields `Some` or `timeout` passes.
    pub(crate) async fn wait_for<T>(
        &self,
        timeout: Duration,
        mut f: impl FnMut(&State) -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(v) = f(&self.lock()) {
                return Some(v);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return None;
            }
            // The cap guards against changes made without a notification.
            let nap = (deadline - now).min(Duration::from_millis(50));
            let _ = tokio::time::timeout(nap, notified).await;
        }
    }

    pub(crate) fn track_task(&self, handle: AbortHandle) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }

    pub(crate) fn abort_tasks(&self) {
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            task.abort();
        }
    }
}

/// Where the namespace of a connection came from (§1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespaceSource {
    /// The worker's `engine::workers::register` call.
    RegisterCall,
    /// The grace timer fired first; the connection was pinned to `default`.
    GraceTimer,
}

/// One frame received on a worker socket, in arrival order.
#[derive(Debug, Clone)]
pub struct ReceivedFrame {
    pub at: Instant,
    /// The text payload (binary payloads are decoded lossily).
    pub raw: String,
    pub binary: bool,
    /// The parsed JSON, if it was JSON.
    pub json: Option<Value>,
}

impl ReceivedFrame {
    /// The `"type"` field, if the frame was a JSON object with one.
    pub fn frame_type(&self) -> Option<&str> {
        self.json.as_ref()?.get("type")?.as_str()
    }
}

/// A worker connection, live or closed (closed ones are kept for inspection).
#[derive(Debug)]
pub(crate) struct Conn {
    pub seq: u64,
    pub worker_id: Uuid,
    pub reattach_token: Uuid,
    /// `None` once the engine has torn the connection down.
    pub tx: Option<mpsc::UnboundedSender<Outbound>>,
    /// True until the socket task has dropped the socket.
    pub socket_open: bool,
    pub namespace: Option<String>,
    pub namespace_source: Option<NamespaceSource>,
    /// Registrations waiting for the namespace (§1.4).
    pub queued: Vec<(Value, Inbound)>,
    pub register_data: Option<Value>,
    pub connected_at: Instant,
    pub register_call_at: Option<Instant>,
    pub registrations_applied_at: Option<Instant>,
    pub disconnected_at: Option<Instant>,
    pub received: Vec<ReceivedFrame>,
    pub sent: Vec<Value>,
}

impl Conn {
    pub(crate) fn live(&self) -> bool {
        self.tx.is_some()
    }

    fn meta_str(&self, key: &str) -> Option<String> {
        self.register_data
            .as_ref()?
            .get(key)?
            .as_str()
            .map(sanitize_worker_text)
    }

    pub(crate) fn name(&self) -> Option<String> {
        self.meta_str("name")
    }
}

/// Strips control and bidi-override characters and caps at 280 chars, like the
/// engine does for worker name/description.
pub(crate) fn sanitize_worker_text(s: &str) -> String {
    s.chars()
        .filter(|c| {
            !c.is_control()
                && !matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
        })
        .take(280)
        .collect()
}

/// A function registered by a worker.
#[derive(Debug, Clone)]
pub(crate) struct FunctionEntry {
    pub seq: u64,
    pub owner: Uuid,
    pub frame: Value,
    pub registered_at: Instant,
}

#[derive(Default)]
pub(crate) struct State {
    pub seq: u64,
    pub conns: HashMap<Uuid, Conn>,
    /// `(namespace, id)` → worker function.
    pub functions: HashMap<(String, String), FunctionEntry>,
    /// `(namespace, id)` → `registerservice` frame and owner.
    pub services: HashMap<(String, String), (Uuid, Value)>,
    /// Invocation id sent to the callee → call in flight.
    pub pending: HashMap<Uuid, PendingCall>,
    pub triggers: TriggerRegistry,
    pub config: ConfigStore,
    pub channels: HashMap<Uuid, Channel>,
    /// What arrived on the telemetry frames (§8.2).
    pub telemetry: crate::telemetry::Telemetry,
    /// [`Settings::keep_invocation_frames`].
    pub keep_invocation_frames: bool,
}

/// True for the frames [`Settings::keep_invocation_frames`] leaves out of the logs.
pub(crate) fn is_invocation_frame(frame: &Value) -> bool {
    matches!(
        frame.get("type").and_then(Value::as_str),
        Some("invokefunction" | "invocationresult")
    )
}

/// How a torn-down connection's socket is ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hangup {
    /// The socket already ended (the task is exiting).
    AlreadyGone,
    Close,
    Abort,
}

impl State {
    pub(crate) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    pub(crate) fn live_conn(&self, id: Uuid) -> Option<&Conn> {
        self.conns.get(&id).filter(|c| c.live())
    }

    /// Sends a JSON frame to a live connection; false if it is gone.
    pub(crate) fn send(&mut self, to: Uuid, frame: Value) -> bool {
        let Some(conn) = self.conns.get_mut(&to) else {
            return false;
        };
        let Some(tx) = &conn.tx else {
            return false;
        };
        let ok = tx
            .send(Outbound::Frame(Message::text(frame.to_string())))
            .is_ok();
        if self.keep_invocation_frames || !is_invocation_frame(&frame) {
            conn.sent.push(frame);
        }
        ok
    }

    /// `Engine::cleanup_worker` (§1.7): runs once per connection.
    pub(crate) fn teardown(&mut self, id: Uuid, hangup: Hangup) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let Some(tx) = conn.tx.take() else {
            return;
        };
        match hangup {
            Hangup::AlreadyGone => {}
            Hangup::Close => {
                let _ = tx.send(Outbound::Close);
            }
            Hangup::Abort => {
                let _ = tx.send(Outbound::Abort);
            }
        }
        conn.disconnected_at = Some(Instant::now());
        conn.queued.clear();
        tracing::debug!(worker_id = %id, "worker connection torn down");
        self.functions.retain(|_, f| f.owner != id);
        self.services.retain(|_, (owner, _)| *owner != id);
        self.halt_invocations_of(id);
        self.remove_trigger_owner(id);
    }

    /// Tears down every live worker connection.
    pub(crate) fn teardown_all(&mut self, hangup: Hangup) -> Vec<Uuid> {
        let live: Vec<Uuid> = self
            .conns
            .values()
            .filter(|c| c.live())
            .map(|c| c.worker_id)
            .collect();
        for id in &live {
            self.teardown(*id, hangup);
        }
        live
    }

    pub(crate) fn worker_info(&self, conn: &Conn) -> WorkerInfo {
        let data = conn.register_data.as_ref();
        let get = |k: &str| data.and_then(|d| d.get(k)).filter(|v| !v.is_null());
        WorkerInfo {
            worker_id: conn.worker_id,
            connected: conn.live(),
            name: conn.name(),
            version: get("version").and_then(Value::as_str).map(String::from),
            runtime: get("runtime").and_then(Value::as_str).map(String::from),
            os: get("os").and_then(Value::as_str).map(String::from),
            pid: get("pid").and_then(Value::as_u64),
            description: conn.meta_str("description"),
            isolation: get("isolation").cloned(),
            namespace: conn.namespace.clone(),
            namespace_source: conn.namespace_source,
            register_data: conn.register_data.clone(),
            connected_at: conn.connected_at,
            register_call_at: conn.register_call_at,
            registrations_applied_at: conn.registrations_applied_at,
            disconnected_at: conn.disconnected_at,
            received: conn.received.clone(),
            sent: conn.sent.clone(),
        }
    }

    pub(crate) fn workers_sorted(&self) -> Vec<WorkerInfo> {
        let mut conns: Vec<&Conn> = self.conns.values().collect();
        conns.sort_by_key(|c| c.seq);
        conns.into_iter().map(|c| self.worker_info(c)).collect()
    }

    pub(crate) fn function_info(&self, key: &(String, String), f: &FunctionEntry) -> FunctionInfo {
        let field = |k: &str| f.frame.get(k).filter(|v| !v.is_null()).cloned();
        FunctionInfo {
            namespace: key.0.clone(),
            id: key.1.clone(),
            owner: f.owner,
            owner_name: self.conns.get(&f.owner).and_then(Conn::name),
            description: field("description").and_then(|v| v.as_str().map(String::from)),
            request_format: field("request_format"),
            response_format: field("response_format"),
            metadata: field("metadata"),
            frame: f.frame.clone(),
            registered_at: f.registered_at,
        }
    }
}

/// Snapshot of a worker connection (see [`crate::TestEngine::workers`]).
#[derive(Debug, Clone)]
pub struct WorkerInfo {
    pub worker_id: Uuid,
    /// False once the engine tore the connection down.
    pub connected: bool,
    pub name: Option<String>,
    pub version: Option<String>,
    pub runtime: Option<String>,
    pub os: Option<String>,
    pub pid: Option<u64>,
    pub description: Option<String>,
    pub isolation: Option<Value>,
    /// Resolved connection namespace; `None` while registrations are still queued.
    pub namespace: Option<String>,
    pub namespace_source: Option<NamespaceSource>,
    /// `data` of the (last) `engine::workers::register` call, including the
    /// injected `_caller_worker_id`.
    pub register_data: Option<Value>,
    pub connected_at: Instant,
    /// When the first `engine::workers::register` call arrived.
    pub register_call_at: Option<Instant>,
    /// When queued registrations were applied (namespace resolved).
    pub registrations_applied_at: Option<Instant>,
    pub disconnected_at: Option<Instant>,
    /// Every text/binary frame received on the socket, in order.
    pub received: Vec<ReceivedFrame>,
    /// Every JSON frame the engine sent on the socket, in order.
    pub sent: Vec<Value>,
}

impl WorkerInfo {
    /// `"type"` of each received JSON frame, in order (`"?"` for non-JSON).
    pub fn received_types(&self) -> Vec<String> {
        self.received
            .iter()
            .map(|f| f.frame_type().unwrap_or("?").to_string())
            .collect()
    }

    /// Received JSON frames with the given `"type"`.
    pub fn received_of_type(&self, frame_type: &str) -> Vec<Value> {
        self.received
            .iter()
            .filter(|f| f.frame_type() == Some(frame_type))
            .filter_map(|f| f.json.clone())
            .collect()
    }

    /// Index of the `engine::workers::register` invocation in [`Self::received`].
    pub fn register_call_index(&self) -> Option<usize> {
        self.received.iter().position(|f| {
            f.frame_type() == Some("invokefunction")
                && f.json.as_ref().and_then(|j| j.get("function_id"))
                    == Some(&Value::from("engine::workers::register"))
        })
    }

    /// True when the worker sent `engine::workers::register` before any
    /// namespaced registration frame (the recommended order, §1.4).
    pub fn registered_before_registrations(&self) -> bool {
        const REGS: [&str; 6] = [
            "registerfunction",
            "unregisterfunction",
            "registerservice",
            "registertriggertype",
            "registertrigger",
            "unregistertrigger",
        ];
        let first_reg = self
            .received
            .iter()
            .position(|f| f.frame_type().is_some_and(|t| REGS.contains(&t)));
        match (self.register_call_index(), first_reg) {
            (Some(call), Some(reg)) => call < reg,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

/// Snapshot of a function registered by a worker.
#[derive(Debug, Clone)]
pub struct FunctionInfo {
    pub namespace: String,
    pub id: String,
    /// Worker id of the owning connection.
    pub owner: Uuid,
    pub owner_name: Option<String>,
    pub description: Option<String>,
    pub request_format: Option<Value>,
    pub response_format: Option<Value>,
    pub metadata: Option<Value>,
    /// The `registerfunction` frame as received.
    pub frame: Value,
    /// When the registration was applied (after namespace resolution).
    pub registered_at: Instant,
}

/// Outcome of an in-process call, as returned by configuration fan-outs.
pub type CallOutcome = Result<Value, ErrorBody>;

/// Where a call's result goes.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Back to a socket caller under its own invocation id.
    Socket { caller: Uuid, invocation_id: String },
    /// To an in-process caller (trigger fan-out, test helper).
    Internal(oneshot::Sender<Result<Value, ErrorBody>>),
    /// Fire-and-forget: the result is dropped.
    Void,
}

#[derive(Debug)]
pub(crate) struct PendingCall {
    pub callee: Uuid,
    pub function_id: String,
    pub reply: Reply,
}

impl PendingCall {
    pub(crate) fn caller(&self) -> Option<Uuid> {
        match &self.reply {
            Reply::Socket { caller, .. } => Some(*caller),
            _ => None,
        }
    }
}

/// One `engine::channels::create` channel: its key, and the ends no socket has taken yet.
#[derive(Debug)]
pub(crate) struct Channel {
    pub access_key: Uuid,
    /// Taken by the first writer socket.
    pub(crate) writer: Option<mpsc::Sender<Message>>,
    /// Taken by the first reader socket.
    pub(crate) reader: Option<mpsc::Receiver<Message>>,
}
