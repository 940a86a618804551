//! `iii-test-engine`: a small in-process implementation of the *engine side* of
//! the iii engine WebSocket protocol, used as a fixture by end-to-end tests of
//! workers.
//!
//! ```no_run
//! # async fn demo() {
//! use iii_test_engine::TestEngine;
//! use serde_json::json;
//! let engine = TestEngine::start().await;
//! // … start the worker under test with III_URL = engine.url() …
//! engine.wait_for_function("shell::fs::read", std::time::Duration::from_secs(5)).await;
//! let client = engine.client().await;
//! let out = client.call("shell::fs::read", json!({"path": "/tmp/x"})).await;
//! # let _ = out;
//! # }
//! ```
//!
//! See README.md for what is implemented and what is deliberately left out.

mod bindings;
mod builtins;
mod channels;
mod client;
mod config_store;
mod configuration;
mod connection;
mod engine_functions;
mod protocol;
mod routing;
pub mod schema_check;
mod server;
mod state;
mod telemetry;
mod triggers;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::task::JoinHandle;
use uuid::Uuid;

pub use client::{ChannelSocket, TestClient, DEFAULT_CALL_TIMEOUT};
pub use configuration::{ConfigEntry, FanOutResult};
pub use protocol::{ChannelDirection, ChannelRef, ErrorBody};
pub use state::{CallOutcome, FunctionInfo, NamespaceSource, ReceivedFrame, WorkerInfo};
pub use tokio_tungstenite::tungstenite::Message;
pub use triggers::{
    BindingState, TriggerInfo, TriggerProvider, TriggerRegistrationResult, TriggerTypeInfo,
};

use state::{Hangup, Outbound, Settings, Shared};

/// Builder for [`TestEngine`].
#[derive(Debug, Clone)]
pub struct TestEngineBuilder {
    settings: Settings,
    port: u16,
}

impl Default for TestEngineBuilder {
    fn default() -> Self {
        Self {
            settings: Settings {
                namespace_grace: Duration::from_secs(5),
                restart_pause: Duration::from_millis(200),
                handshake_timeout: Duration::from_secs(10),
                keep_invocation_frames: true,
            },
            port: 0,
        }
    }
}

impl TestEngineBuilder {
    /// How long registrations wait for `engine::workers::register` before the
    /// connection is pinned to `default` (engine default 5 s).
    pub fn namespace_grace(mut self, grace: Duration) -> Self {
        self.settings.namespace_grace = grace;
        self
    }

    /// How long [`TestEngine::restart`] keeps the port closed (default 200 ms).
    pub fn restart_pause(mut self, pause: Duration) -> Self {
        self.settings.restart_pause = pause;
        self
    }

    /// Deadline for finishing the HTTP upgrade (engine default 10 s).
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.settings.handshake_timeout = timeout;
        self
    }

    /// Whether `invokefunction` / `invocationresult` frames are kept in the frame logs
    /// ([`WorkerInfo`]'s `received`/`sent`, [`TestClient::received`]); default true. A bench
    /// that moves hundreds of MiB through invocations turns it off to keep memory flat.
    pub fn keep_invocation_frames(mut self, keep: bool) -> Self {
        self.settings.keep_invocation_frames = keep;
        self
    }

    /// Fixed loopback port instead of a free one.
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    pub async fn start(self) -> TestEngine {
        let listener = server::bind(self.port)
            .await
            .unwrap_or_else(|e| panic!("test engine: cannot bind 127.0.0.1:{}: {e}", self.port));
        let port = listener
            .local_addr()
            .expect("test engine: listener has no local address")
            .port();
        let shared = Shared::new(self.settings, port, builtins::run);
        let accept = server::spawn_accept_loop(shared.clone(), listener);
        TestEngine {
            inner: Arc::new(EngineInner {
                shared,
                accept: Mutex::new(Some(accept)),
            }),
        }
    }
}

struct EngineInner {
    shared: Arc<Shared>,
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        if let Some(accept) = self.accept.lock().unwrap_or_else(|p| p.into_inner()).take() {
            accept.abort();
        }
        // Fail in-process waiters too, so no spawned fan-out outlives the engine.
        self.shared.update(|st| {
            st.teardown_all(Hangup::Abort);
            st.pending.clear();
            st.channels.clear();
        });
        self.shared.abort_tasks();
    }
}

/// The in-process engine. Cheap to clone; it stops when the last clone is dropped.
#[derive(Clone)]
pub struct TestEngine {
    inner: Arc<EngineInner>,
}

impl TestEngine {
    /// Starts on a free loopback port with default settings.
    pub async fn start() -> TestEngine {
        Self::builder().start().await
    }

    pub fn builder() -> TestEngineBuilder {
        TestEngineBuilder::default()
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// `ws://127.0.0.1:PORT` (what a worker gets as `III_URL`).
    pub fn url(&self) -> String {
        self.shared().base_url()
    }

    pub fn port(&self) -> u16 {
        self.shared().port
    }

    // ----- clients -------------------------------------------------------

    /// A raw socket worker named `test-client-<8 hex digits>`, already registered.
    pub async fn client(&self) -> TestClient {
        self.client_named(&client::next_client_name()).await
    }

    pub async fn client_named(&self, name: &str) -> TestClient {
        TestClient::connect(self.shared().clone(), name.to_string(), None).await
    }

    /// A client whose connection namespace is `namespace`.
    pub async fn client_in_namespace(&self, name: &str, namespace: &str) -> TestClient {
        TestClient::connect(
            self.shared().clone(),
            name.to_string(),
            Some(namespace.to_string()),
        )
        .await
    }

    /// Engine-originated call in `default` (like a trigger fire: no
    /// `_caller_worker_id`), bounded by [`DEFAULT_CALL_TIMEOUT`].
    pub async fn invoke(&self, function_id: &str, data: Value) -> CallOutcome {
        self.invoke_with(routing_namespace(None), function_id, data, None)
            .await
    }

    /// Engine-originated call with explicit namespace and invocation metadata.
    pub async fn invoke_with(
        &self,
        namespace: &str,
        function_id: &str,
        data: Value,
        metadata: Option<Value>,
    ) -> CallOutcome {
        let call = routing::call(self.shared(), namespace, function_id, data, metadata);
        tokio::time::timeout(DEFAULT_CALL_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| {
                Err(ErrorBody::new(
                    "Timeout",
                    format!("{function_id} did not answer"),
                ))
            })
    }

    // ----- introspection -------------------------------------------------

    /// Every worker connection seen so far (closed ones too), in connect order.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        self.shared().lock().workers_sorted()
    }

    /// The most recent connection whose `engine::workers::register` named it `name`.
    pub fn worker_info(&self, name: &str) -> Option<WorkerInfo> {
        self.workers()
            .into_iter()
            .rev()
            .find(|w| w.name.as_deref() == Some(name))
    }

    pub fn worker(&self, worker_id: Uuid) -> Option<WorkerInfo> {
        let st = self.shared().lock();
        st.conns.get(&worker_id).map(|c| st.worker_info(c))
    }

    /// Waits for a *live* connection registered under `name`.
    pub async fn wait_for_worker(&self, name: &str, timeout: Duration) -> Option<WorkerInfo> {
        self.shared()
            .wait_for(timeout, |st| {
                let mut conns: Vec<_> = st
                    .conns
                    .values()
                    .filter(|c| c.live() && c.name().as_deref() == Some(name))
                    .collect();
                conns.sort_by_key(|c| c.seq);
                conns.last().map(|c| st.worker_info(c))
            })
            .await
    }

    /// Functions registered by workers (builtins are not listed), by registration order.
    pub fn functions(&self) -> Vec<FunctionInfo> {
        let st = self.shared().lock();
        let mut all: Vec<_> = st.functions.iter().collect();
        all.sort_by_key(|(_, f)| f.seq);
        all.into_iter()
            .map(|(k, f)| st.function_info(k, f))
            .collect()
    }

    /// A worker function in namespace `default`.
    pub fn function(&self, id: &str) -> Option<FunctionInfo> {
        self.function_in(routing_namespace(None), id)
    }

    pub fn function_in(&self, namespace: &str, id: &str) -> Option<FunctionInfo> {
        let st = self.shared().lock();
        let key = (namespace.to_string(), id.to_string());
        st.functions.get(&key).map(|f| st.function_info(&key, f))
    }

    /// Waits until `id` is registered in namespace `default`.
    pub async fn wait_for_function(&self, id: &str, timeout: Duration) -> Option<FunctionInfo> {
        let key = (routing_namespace(None).to_string(), id.to_string());
        self.shared()
            .wait_for(timeout, |st| {
                st.functions.get(&key).map(|f| st.function_info(&key, f))
            })
            .await
    }

    /// Trigger bindings registered by workers, by registration order.
    pub fn triggers(&self) -> Vec<TriggerInfo> {
        self.shared().lock().triggers.infos()
    }

    /// Worker-provided trigger types.
    pub fn trigger_types(&self) -> Vec<TriggerTypeInfo> {
        self.shared().lock().triggers.type_infos()
    }

    /// Every `triggerregistrationresult` accepted from a provider.
    pub fn trigger_registration_results(&self) -> Vec<TriggerRegistrationResult> {
        self.shared().lock().triggers.results()
    }

    /// Re-checks `pred` after each state change until it holds; false on timeout.
    pub async fn wait_until(&self, timeout: Duration, pred: impl Fn(&TestEngine) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.shared().changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if pred(self) {
                return true;
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return false;
            }
            let nap = (deadline - now).min(Duration::from_millis(50));
            let _ = tokio::time::timeout(nap, changed).await;
        }
    }

    // ----- telemetry (§8.2) ---------------------------------------------

    /// Every span stored from `OTLP` frames, in the engine's stored shape.
    pub fn spans(&self) -> Vec<Value> {
        self.shared().lock().telemetry.spans.clone()
    }

    /// Every log record stored from `LOGS` frames.
    pub fn logs(&self) -> Vec<Value> {
        self.shared().lock().telemetry.logs.clone()
    }

    /// Every number data point from `MTRC` frames: (name, attributes, value, time in ns).
    pub fn metric_points(&self) -> Vec<(String, serde_json::Map<String, Value>, f64, u64)> {
        self.shared().lock().telemetry.points.clone()
    }

    /// Telemetry frames that did not parse, with the reason (a worker bug: the engine would
    /// reject them too).
    pub fn telemetry_errors(&self) -> Vec<String> {
        self.shared().lock().telemetry.errors.clone()
    }

    /// Telemetry frames received so far.
    pub fn telemetry_frames(&self) -> u64 {
        self.shared().lock().telemetry.frames
    }

    /// Accepts (true, the default) or refuses `/otel` upgrades with HTTP 404; refusing also
    /// closes every open `/otel` socket.
    pub fn set_otel_accepted(&self, accepted: bool) {
        self.shared()
            .otel_accepted
            .store(accepted, std::sync::atomic::Ordering::SeqCst);
        if !accepted {
            self.shared().otel_epoch.send_modify(|e| *e += 1);
        }
    }

    // ----- configuration store ------------------------------------------

    /// Stored raw value of a configuration id.
    pub fn config_get(&self, id: &str) -> Option<Value> {
        self.shared()
            .lock()
            .config
            .entry(id)
            .map(|e| e.value.clone())
    }

    pub fn config_entry(&self, id: &str) -> Option<ConfigEntry> {
        self.shared().lock().config.entry(id).cloned()
    }

    /// Pre-stores a value (as if a config file existed) without firing anything;
    /// the entry has no schema until a worker registers it.
    pub fn config_seed(&self, id: &str, value: Value) {
        self.shared().update(|st| st.config.seed(id, value));
    }

    /// Replaces a value without validation (an external edit) and fires
    /// `configuration:updated` (`registered` for a new id); returns after every
    /// bound handler answered.
    pub async fn config_set(&self, id: &str, value: Value) -> Vec<FanOutResult> {
        let event = self.shared().update(|st| st.config.overwrite(id, value));
        configuration::fan_out(self.shared(), event).await
    }

    /// Deletes an entry and fires `configuration:deleted`; returns after fan-out.
    pub async fn config_delete(&self, id: &str) -> Vec<FanOutResult> {
        let event = self.shared().update(|st| st.config.delete(id));
        match event {
            Some(event) => configuration::fan_out(self.shared(), event).await,
            None => Vec::new(),
        }
    }

    /// Forgets every schema but keeps values (what a restart does), so `set`
    /// answers `SCHEMA_UNAVAILABLE` until the owner registers again.
    pub fn config_forget_schemas(&self) {
        self.shared().update(|st| st.config.forget_schemas());
    }

    // ----- fault injection ----------------------------------------------

    /// Drops every worker socket at the TCP level (no Close frame) and runs the
    /// disconnect cleanup. Channels are left alone.
    pub async fn drop_connections(&self) {
        self.hang_up(Hangup::Abort).await;
    }

    /// Like [`Self::drop_connections`] but sends a Close frame (1001) first.
    pub async fn close_connections(&self) {
        self.hang_up(Hangup::Close).await;
    }

    /// Drops one worker connection (no Close frame).
    pub async fn drop_worker(&self, worker_id: Uuid) {
        self.shared()
            .update(|st| st.teardown(worker_id, Hangup::Abort));
        self.wait_sockets_closed(&[worker_id]).await;
    }

    async fn hang_up(&self, hangup: Hangup) {
        let ids = self.shared().update(|st| st.teardown_all(hangup));
        self.wait_sockets_closed(&ids).await;
    }

    async fn wait_sockets_closed(&self, ids: &[Uuid]) {
        self.shared()
            .wait_for(Duration::from_secs(2), |st| {
                ids.iter()
                    .all(|id| st.conns.get(id).is_none_or(|c| !c.socket_open))
                    .then_some(())
            })
            .await;
    }

    /// Stops (or resumes) reading a worker's socket: its frames, WS Pings
    /// included, stay unanswered — a half-open connection as seen by the worker.
    pub fn pause_reads(&self, worker_id: Uuid, paused: bool) {
        let st = self.shared().lock();
        if let Some(tx) = st.conns.get(&worker_id).and_then(|c| c.tx.as_ref()) {
            let _ = tx.send(Outbound::PauseReads(paused));
        }
    }

    /// Stops listening and drops every socket (workers and channels). Stored
    /// state stays inspectable; [`Self::restart`] brings it back.
    pub async fn stop(&self) {
        let accept = self
            .inner
            .accept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(accept) = accept {
            accept.abort();
            let _ = accept.await;
        }
        let ids = self.shared().update(|st| {
            let ids = st.teardown_all(Hangup::Abort);
            st.channels.clear();
            ids
        });
        self.shared().abort_tasks();
        self.shared().update(|st| {
            for id in ids {
                if let Some(c) = st.conns.get_mut(&id) {
                    c.socket_open = false;
                }
            }
        });
    }

    /// Simulates an engine restart: stop, forget every function / trigger
    /// registration and configuration schema (values are kept), wait the
    /// configured pause, and listen again on the same port.
    pub async fn restart(&self) {
        self.stop().await;
        self.shared().update(|st| {
            st.functions.clear();
            st.services.clear();
            st.pending.clear();
            st.triggers.clear_types();
            st.config.forget_schemas();
        });
        tokio::time::sleep(self.shared().settings.restart_pause).await;
        let listener = server::bind(self.port())
            .await
            .unwrap_or_else(|e| panic!("test engine: cannot re-bind port {}: {e}", self.port()));
        let accept = server::spawn_accept_loop(self.shared().clone(), listener);
        *self.inner.accept.lock().unwrap_or_else(|p| p.into_inner()) = Some(accept);
    }
}

/// Absent namespace → `default` (§10.2).
fn routing_namespace(ns: Option<&str>) -> &str {
    ns.unwrap_or(state::DEFAULT_NAMESPACE)
}
