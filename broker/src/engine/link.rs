//! One logical engine connection that survives restarts and network drops.
//!
//! Per connection: `reattach` first (when we had one before), then the fire-and-forget
//! `engine::workers::register` (so the engine files our registrations at once instead of
//! holding them for its 5 s grace), then every function and trigger binding, replayed from
//! our own record. WS Ping every 20 s; a connection that received nothing for 60 s is dropped
//! and rebuilt; reconnects are tried every 2 s, forever.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use iii_shell_policy::sync::lock;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use super::frames::{invocation_result, ErrorBody, Inbound};

/// Handles one invocation: (function id, data, metadata) → result.
pub type Invoker = Arc<
    dyn Fn(
            String,
            Value,
            Option<Value>,
        ) -> Pin<Box<dyn Future<Output = Result<Value, ErrorBody>> + Send>>
        + Send
        + Sync,
>;

#[derive(Debug, Clone)]
pub struct LinkOptions {
    pub url: String,
    pub name: String,
    pub namespace: Option<String>,
    pub version: String,
    pub ping_every: Duration,
    pub idle_timeout: Duration,
    pub retry_every: Duration,
    pub call_timeout: Duration,
    /// The pid registered with the engine: the process the launcher started (the `serve`
    /// supervisor when the broker runs under it).
    pub pid: u32,
}

impl LinkOptions {
    /// The protocol's timings: Ping every 20 s, reconnect after 60 s of silence, retry every
    /// 2 s. Tests shorten them with `III_SHELL_PING_MS`, `III_SHELL_IDLE_MS` and
    /// `III_SHELL_RETRY_MS`.
    pub fn new(url: String, name: String, namespace: Option<String>) -> Self {
        let ms = |k: &str, d: u64| {
            Duration::from_millis(
                std::env::var(k)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .filter(|v| *v > 0)
                    .unwrap_or(d),
            )
        };
        LinkOptions {
            url,
            name,
            namespace,
            version: iii_shell_protocol::VERSION.to_string(),
            ping_every: ms("III_SHELL_PING_MS", 20_000),
            idle_timeout: ms("III_SHELL_IDLE_MS", 60_000),
            retry_every: ms("III_SHELL_RETRY_MS", 2_000),
            call_timeout: Duration::from_secs(30),
            pid: nix::unistd::getpid().as_raw().unsigned_abs(),
        }
    }
}

/// A binding of a trigger type this worker provides, as the engine delivered it.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferedBinding {
    pub id: String,
    pub trigger_type: String,
    pub function_id: String,
    pub config: Value,
    pub metadata: Option<Value>,
    /// The target function's namespace (`None` = `default`).
    pub namespace: Option<String>,
}

/// Serves the trigger types this worker registers with `registertriggertype`.
pub trait TriggerProvider: Send + Sync {
    /// True for a type this provider serves.
    fn provides(&self, trigger_type: &str) -> bool;
    /// A binding was offered (or offered again): accept it or refuse it with an error.
    fn register(
        &self,
        binding: OfferedBinding,
    ) -> Pin<Box<dyn Future<Output = Result<(), ErrorBody>> + Send>>;
    /// The binding is gone (`unregistertrigger`).
    fn unregister(&self, id: &str);
    /// A new engine connection (epoch) was established and everything replayed on it.
    fn connected(&self, epoch: u64);
}

type PendingCalls = HashMap<String, oneshot::Sender<Result<Value, ErrorBody>>>;

#[derive(Default)]
struct State {
    /// `registerfunction` frames by id, in first-registration order.
    functions: Vec<(String, Value)>,
    /// `registertrigger` frames by binding id.
    triggers: Vec<(String, Value)>,
    /// `registertriggertype` frames by type id.
    trigger_types: Vec<(String, Value)>,
    provider: Option<Arc<dyn TriggerProvider>>,
    worker_id: Option<String>,
    reattach_token: Option<String>,
    out: Option<mpsc::UnboundedSender<Message>>,
    pending: PendingCalls,
}

struct Inner {
    opts: LinkOptions,
    invoker: Invoker,
    state: Mutex<State>,
    connected: watch::Sender<bool>,
    draining: AtomicBool,
    inflight: AtomicUsize,
    /// Number of connections established so far (a reconnect bumps it).
    connections: AtomicU64,
    idle: Notify,
    stop: Notify,
    fatal: watch::Sender<Option<String>>,
}

/// Cheap to clone; all clones drive the same connection.
#[derive(Clone)]
pub struct EngineLink {
    inner: Arc<Inner>,
}

impl EngineLink {
    /// Starts the connection loop in the background.
    pub fn start(opts: LinkOptions, invoker: Invoker) -> EngineLink {
        let (connected, _) = watch::channel(false);
        let (fatal, _) = watch::channel(None);
        let inner = Arc::new(Inner {
            opts,
            invoker,
            state: Mutex::new(State::default()),
            connected,
            draining: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
            connections: AtomicU64::new(0),
            idle: Notify::new(),
            stop: Notify::new(),
            fatal,
        });
        tokio::spawn(run(inner.clone()));
        EngineLink { inner }
    }

    pub fn options(&self) -> &LinkOptions {
        &self.inner.opts
    }

    pub fn is_connected(&self) -> bool {
        *self.inner.connected.borrow()
    }

    /// How many connections have been established so far; changes on every reconnect, even
    /// one too quick for anyone to observe `is_connected()` turning false.
    pub fn connection_epoch(&self) -> u64 {
        self.inner.connections.load(Ordering::SeqCst)
    }

    /// Resolves when the link is connected.
    pub async fn connected(&self) {
        let mut rx = self.inner.connected.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Resolves with the reason when the engine refused us for good.
    pub async fn fatal(&self) -> String {
        let mut rx = self.inner.fatal.subscribe();
        let why = match rx.wait_for(|f| f.is_some()).await {
            Ok(v) => v.clone(),
            Err(_) => None,
        };
        match why {
            Some(w) => w,
            None => std::future::pending().await,
        }
    }

    /// Registers (or re-registers) a function; replayed on every reconnect.
    pub fn register_function(&self, id: &str, frame: Value) {
        let mut st = lock(&self.inner.state);
        match st.functions.iter_mut().find(|(i, _)| i == id) {
            Some(slot) => slot.1 = frame.clone(),
            None => st.functions.push((id.to_string(), frame.clone())),
        }
        send_locked(&st, frame);
    }

    pub fn registered_functions(&self) -> Vec<String> {
        lock(&self.inner.state)
            .functions
            .iter()
            .map(|(i, _)| i.clone())
            .collect()
    }

    /// Removes every function registration (the engine stops routing calls to us).
    pub fn unregister_functions(&self) {
        let mut st = lock(&self.inner.state);
        let ids: Vec<String> = st.functions.drain(..).map(|(i, _)| i).collect();
        for id in ids {
            send_locked(&st, json!({"type": "unregisterfunction", "id": id}));
        }
    }

    /// Binds a trigger; replayed on every reconnect with the same id.
    pub fn register_trigger(&self, id: &str, frame: Value) {
        let mut st = lock(&self.inner.state);
        match st.triggers.iter_mut().find(|(i, _)| i == id) {
            Some(slot) => slot.1 = frame.clone(),
            None => st.triggers.push((id.to_string(), frame.clone())),
        }
        send_locked(&st, frame);
    }

    /// Declares a trigger type this worker provides; replayed on every reconnect (after the
    /// functions, before our own bindings).
    pub fn register_trigger_type(&self, id: &str, frame: Value) {
        let mut st = lock(&self.inner.state);
        match st.trigger_types.iter_mut().find(|(i, _)| i == id) {
            Some(slot) => slot.1 = frame.clone(),
            None => st.trigger_types.push((id.to_string(), frame.clone())),
        }
        send_locked(&st, frame);
    }

    /// Installs the provider of our trigger types (set before they are registered).
    pub fn set_trigger_provider(&self, provider: Arc<dyn TriggerProvider>) {
        lock(&self.inner.state).provider = Some(provider);
    }

    /// Fires a trigger: a fire-and-forget invocation of `function_id` carrying the
    /// binding's `metadata` and `namespace` (§5.4). Dropped when not connected; never waits.
    pub fn fire(
        &self,
        function_id: &str,
        data: Value,
        metadata: Option<&Value>,
        namespace: Option<&str>,
    ) -> bool {
        let mut frame = json!({"type": "invokefunction", "invocation_id": null, "function_id": function_id, "data": data, "action": {"type": "void"}});
        if let Some(m) = metadata.filter(|m| !m.is_null()) {
            frame["metadata"] = m.clone();
        }
        if let Some(ns) = namespace {
            frame["namespace"] = json!(ns);
        }
        let st = lock(&self.inner.state);
        match &st.out {
            Some(out) => out.send(Message::Text(frame.to_string().into())).is_ok(),
            None => false,
        }
    }

    /// Calls a function through the engine and waits for its result (waiting for a
    /// connection first). Builtins are resolved in `default`, so no namespace is sent.
    pub async fn call(&self, function_id: &str, data: Value) -> Result<Value, ErrorBody> {
        self.call_with_timeout(function_id, data, self.inner.opts.call_timeout)
            .await
    }

    /// Like [`Self::call`] with its own deadline (waiting for a connection counts toward it);
    /// on expiry the error code is `timeout`.
    pub async fn call_with_timeout(
        &self,
        function_id: &str,
        data: Value,
        timeout: Duration,
    ) -> Result<Value, ErrorBody> {
        // The id of the invocation in flight, so that a timed-out one is not left pending.
        let in_flight: Mutex<Option<String>> = Mutex::new(None);
        let work = async {
            loop {
                self.connected().await;
                let id = uuid::Uuid::new_v4().to_string();
                let (tx, rx) = oneshot::channel();
                let sent = {
                    let mut st = lock(&self.inner.state);
                    match &st.out {
                        Some(out) => {
                            let mut frame = json!({"type": "invokefunction", "invocation_id": id, "function_id": function_id, "data": data});
                            // Inside a traced call, what this reaches joins its trace.
                            if let Some(c) = crate::telemetry::call_span::outgoing() {
                                if let Some(tp) = c.traceparent {
                                    frame["traceparent"] = json!(tp);
                                }
                                if let Some(b) = c.baggage {
                                    frame["baggage"] = json!(b);
                                }
                            }
                            let ok = out.send(Message::Text(frame.to_string().into())).is_ok();
                            if ok {
                                st.pending.insert(id.clone(), tx);
                                *lock(&in_flight) = Some(id.clone());
                            }
                            ok
                        }
                        None => false,
                    }
                };
                if !sent {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                return rx.await.unwrap_or_else(|_| Err(connection_lost()));
            }
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => {
                let id = lock(&in_flight).take();
                if let Some(id) = id {
                    lock(&self.inner.state).pending.remove(&id);
                }
                Err(ErrorBody::new(
                    "timeout",
                    format!("{function_id}: no answer within {timeout:?}"),
                ))
            }
        }
    }

    /// Builds the `invokefunction` frame of a call of `function_id` whose `data` is the JSON
    /// text `write_data` appends (it must append exactly one JSON value). The frame is text
    /// from the start: bulk payloads are written once, never held as a `serde_json::Value`,
    /// cloned or re-serialized; [`Self::send_prepared`] sends it.
    pub fn prepare_call(
        function_id: &str,
        size_hint: usize,
        write_data: impl FnOnce(&mut String),
    ) -> PreparedCall {
        let id = uuid::Uuid::new_v4().to_string();
        let mut frame = String::with_capacity(size_hint + function_id.len() + 128);
        frame.push_str(r#"{"type":"invokefunction","invocation_id":""#);
        frame.push_str(&id);
        frame.push_str(r#"","function_id":"#);
        frame.push_str(&Value::from(function_id).to_string());
        frame.push_str(r#","data":"#);
        write_data(&mut frame);
        frame.push('}');
        PreparedCall {
            id,
            frame: frame.into(),
        }
    }

    /// Sends a prepared call now; `None` when not connected (send it again once
    /// [`Self::connected`] resolves; the same frame may go out on a later connection). The
    /// answer is awaited with [`SentCall::answer`].
    pub fn send_prepared(&self, call: &PreparedCall) -> Option<SentCall> {
        let (tx, rx) = oneshot::channel();
        let mut st = lock(&self.inner.state);
        let out = st.out.as_ref()?;
        out.send(Message::Text(call.frame.clone())).ok()?;
        st.pending.insert(call.id.clone(), tx);
        Some(SentCall {
            link: self.clone(),
            id: call.id.clone(),
            rx,
        })
    }

    /// Fire-and-forget call (no result), dropped when not connected.
    pub fn call_void(&self, function_id: &str, data: Value) {
        let st = lock(&self.inner.state);
        send_locked(
            &st,
            json!({"type": "invokefunction", "invocation_id": null, "function_id": function_id, "data": data, "action": {"type": "void"}}),
        );
    }

    /// Stops taking calls: new invocations are refused, functions are unregistered, and this
    /// waits (up to `limit`) for the ones in flight to be answered.
    pub async fn drain(&self, limit: Duration) {
        self.inner.draining.store(true, Ordering::SeqCst);
        self.unregister_functions();
        let wait = async {
            while self.inner.inflight.load(Ordering::SeqCst) > 0 {
                let idle = self.inner.idle.notified();
                if self.inner.inflight.load(Ordering::SeqCst) == 0 {
                    break;
                }
                idle.await;
            }
        };
        let _ = tokio::time::timeout(limit, wait).await;
        // Give the writer a moment to flush the last results.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    /// Closes the connection and stops reconnecting.
    pub fn stop(&self) {
        self.inner.stop.notify_waiters();
        self.inner.stop.notify_one();
    }

    /// The id the engine gave the current (or last) connection.
    pub fn worker_id(&self) -> Option<String> {
        lock(&self.inner.state).worker_id.clone()
    }
}

/// An `invokefunction` frame ready to go ([`EngineLink::prepare_call`]).
pub struct PreparedCall {
    id: String,
    frame: Utf8Bytes,
}

impl PreparedCall {
    /// The frame's length in bytes.
    pub fn len(&self) -> usize {
        self.frame.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frame.is_empty()
    }

    /// The frame's text.
    pub fn frame_bytes(&self) -> &[u8] {
        self.frame.as_bytes()
    }
}

/// A call in flight ([`EngineLink::send_prepared`]); dropping it forgets the call.
pub struct SentCall {
    link: EngineLink,
    id: String,
    rx: oneshot::Receiver<Result<Value, ErrorBody>>,
}

impl SentCall {
    /// The call's answer; `connection_lost` when the connection ended first, `timeout` when
    /// none came within `timeout`.
    pub async fn answer(mut self, timeout: Duration) -> Result<Value, ErrorBody> {
        match tokio::time::timeout(timeout, &mut self.rx).await {
            Ok(r) => r.unwrap_or_else(|_| Err(connection_lost())),
            Err(_) => Err(ErrorBody::new(
                "timeout",
                format!("no answer within {timeout:?}"),
            )),
        }
    }
}

impl Drop for SentCall {
    fn drop(&mut self) {
        lock(&self.link.inner.state).pending.remove(&self.id);
    }
}

fn send_locked(st: &State, frame: Value) {
    if let Some(out) = &st.out {
        let _ = out.send(Message::Text(frame.to_string().into()));
    }
}

fn connection_lost() -> ErrorBody {
    ErrorBody::new(
        "connection_lost",
        "the engine connection was lost before the call was answered",
    )
}

async fn run(inner: Arc<Inner>) {
    let mut outage_logged = false;
    loop {
        let attempt =
            tokio_tungstenite::connect_async_with_config(inner.opts.url.as_str(), None, true);
        let conn = tokio::select! {
            r = attempt => r,
            _ = inner.stop.notified() => return,
        };
        match conn {
            Ok((ws, _)) => {
                if outage_logged {
                    tracing::info!(url = %inner.opts.url, "engine reachable again");
                }
                outage_logged = false;
                let stop = serve_connection(&inner, ws).await;
                // `send_replace`, not `send`: `send` drops the value when nobody is subscribed
                // at that moment, which left `is_connected()` stuck at true after a loss.
                inner.connected.send_replace(false);
                let pending: Vec<_> = {
                    let mut st = lock(&inner.state);
                    st.out = None;
                    st.pending.drain().collect()
                };
                for (_, tx) in pending {
                    let _ = tx.send(Err(connection_lost()));
                }
                match stop {
                    Ended::Stopped => return,
                    Ended::Fatal(why) => {
                        tracing::error!("{why}");
                        inner.fatal.send_replace(Some(why));
                        return;
                    }
                    Ended::Lost(why) => {
                        tracing::warn!(url = %inner.opts.url, "engine connection lost ({why}); reconnecting");
                        // One immediate attempt, then the regular retry period.
                        continue;
                    }
                }
            }
            Err(e) => {
                if !outage_logged {
                    tracing::warn!(url = %inner.opts.url, error = %e, "cannot connect to the engine; retrying every {:?}", inner.opts.retry_every);
                    outage_logged = true;
                } else {
                    tracing::debug!(error = %e, "engine connect failed");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(inner.opts.retry_every) => {}
            _ = inner.stop.notified() => return,
        }
    }
}

enum Ended {
    Lost(String),
    Stopped,
    Fatal(String),
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn serve_connection(inner: &Arc<Inner>, ws: Ws) -> Ended {
    let (mut sink, mut stream) = ws.split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
    {
        let mut st = lock(&inner.state);
        if let (Some(id), Some(token)) = (&st.worker_id, &st.reattach_token) {
            let frame =
                json!({"type": "reattach", "previous_worker_id": id, "reattach_token": token});
            let _ = tx.send(Message::Text(frame.to_string().into()));
        }
        let _ = tx.send(Message::Text(
            worker_metadata(&inner.opts).to_string().into(),
        ));
        for (_, f) in st
            .functions
            .iter()
            .chain(st.trigger_types.iter())
            .chain(st.triggers.iter())
        {
            let _ = tx.send(Message::Text(f.to_string().into()));
        }
        st.out = Some(tx.clone());
    }
    let epoch = inner.connections.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(p) = lock(&inner.state).provider.clone() {
        p.connected(epoch);
    }
    inner.connected.send_replace(true);
    tracing::info!(url = %inner.opts.url, "connected to the engine");

    let ping_every = inner.opts.ping_every;
    let writer = tokio::spawn(async move {
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + ping_every, ping_every);
        loop {
            let msg = tokio::select! {
                m = rx.recv() => match m { Some(m) => m, None => break },
                _ = ping.tick() => Message::Ping(Vec::new().into()),
            };
            let close = matches!(msg, Message::Close(_));
            if sink.send(msg).await.is_err() || close {
                break;
            }
        }
        let _ = sink.close().await;
    });

    let ended = loop {
        let next = tokio::select! {
            n = tokio::time::timeout(inner.opts.idle_timeout, stream.next()) => n,
            _ = inner.stop.notified() => {
                let _ = tx.send(Message::Close(None));
                break Ended::Stopped;
            }
        };
        let msg = match next {
            Err(_) => {
                break Ended::Lost(format!(
                    "nothing received for {:?}",
                    inner.opts.idle_timeout
                ))
            }
            Ok(None) => break Ended::Lost("socket closed".into()),
            Ok(Some(Err(e))) => break Ended::Lost(e.to_string()),
            Ok(Some(Ok(m))) => m,
        };
        let text = match msg {
            Message::Text(t) => t.to_string(),
            Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
            Message::Close(_) => break Ended::Lost("engine closed the socket".into()),
            _ => continue,
        };
        if text.trim().is_empty() {
            continue;
        }
        let frame: Inbound = match serde_json::from_str(&text) {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(error = %e, "ignoring an engine frame we do not understand");
                continue;
            }
        };
        if let Some(end) = handle_frame(inner, &tx, frame, text.len()) {
            break end;
        }
    };
    drop(tx);
    {
        let mut st = lock(&inner.state);
        st.out = None;
    }
    // Handlers still running hold clones of `tx` and would keep the writer, the old socket and
    // its Pings alive after the connection is over (and on a half-open socket `close` may
    // never finish); their results can reach no one any more.
    let mut writer = writer;
    if tokio::time::timeout(Duration::from_secs(1), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    ended
}

fn handle_frame(
    inner: &Arc<Inner>,
    tx: &mpsc::UnboundedSender<Message>,
    frame: Inbound,
    frame_bytes: usize,
) -> Option<Ended> {
    match frame {
        Inbound::WorkerRegistered {
            worker_id,
            reattach_token,
        } => {
            tracing::debug!(%worker_id, "engine assigned a worker id");
            let mut st = lock(&inner.state);
            st.worker_id = Some(worker_id);
            st.reattach_token = reattach_token;
        }
        Inbound::InvokeFunction {
            invocation_id,
            function_id,
            data,
            metadata,
            traceparent,
            baggage,
        } => {
            dispatch_invocation(
                inner,
                tx.clone(),
                Invocation {
                    invocation_id,
                    function_id,
                    data,
                    metadata,
                    trace: crate::telemetry::propagation::Carrier {
                        traceparent,
                        baggage,
                    },
                    frame_bytes,
                },
            );
        }
        Inbound::InvocationResult {
            invocation_id,
            result,
            error,
        } => {
            let waiter = lock(&inner.state).pending.remove(&invocation_id);
            if let Some(w) = waiter {
                let _ = w.send(match error {
                    Some(e) => Err(e),
                    None => Ok(result.unwrap_or(Value::Null)),
                });
            }
        }
        Inbound::RegistrationRejected {
            code,
            function_id,
            worker_name,
        } => {
            if code == "FUNCTION_NAMESPACE_CONFLICT" {
                tracing::error!(function_id = ?function_id, "the engine refused a function: another live worker owns it; stop that worker, or give this one its own III_NAMESPACE");
            } else {
                return Some(Ended::Fatal(format!(
                    "the engine rejected this worker ({code}, name {:?}): another live worker uses the same name in this namespace; set III_WORKER_NAME to a unique name",
                    worker_name.unwrap_or_default()
                )));
            }
        }
        Inbound::TriggerRegistrationResult { id, error } => {
            if let Some(e) = error {
                // Our own record of the binding says what it was (the result does not).
                let (trigger_type, path) = lock(&inner.state)
                    .triggers
                    .iter()
                    .find(|(i, _)| *i == id)
                    .map(|(_, f)| {
                        (
                            f["trigger_type"].as_str().unwrap_or_default().to_string(),
                            f["config"]["path"].as_str().map(str::to_string),
                        )
                    })
                    .unwrap_or_default();
                match crate::console_ui::rejection_hint(&trigger_type) {
                    Some(hint) => {
                        tracing::error!(trigger = %id, %trigger_type, path = path.as_deref().unwrap_or(""), code = %e.code, "{hint}: {}", e.message)
                    }
                    None => {
                        tracing::error!(trigger = %id, %trigger_type, code = %e.code, "the engine refused a trigger binding: {}; hot reload needs the engine's configuration worker: check the engine's log", e.message)
                    }
                }
            }
        }
        Inbound::RegisterTrigger {
            id,
            trigger_type,
            function_id,
            config,
            metadata,
            namespace,
        } => {
            let provider = lock(&inner.state)
                .provider
                .clone()
                .filter(|p| p.provides(&trigger_type));
            let Some(provider) = provider else {
                let frame = json!({
                    "type": "triggerregistrationresult", "id": id, "trigger_type": trigger_type, "function_id": function_id,
                    "error": {"code": "trigger_type_not_found", "message": format!("this worker provides no trigger type {trigger_type}")},
                });
                let _ = tx.send(Message::Text(frame.to_string().into()));
                return None;
            };
            let offered = OfferedBinding {
                id: id.clone(),
                trigger_type: trigger_type.clone(),
                function_id: function_id.clone(),
                config,
                metadata,
                namespace,
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let outcome = provider.register(offered).await;
                let mut frame = json!({"type": "triggerregistrationresult", "id": id, "trigger_type": trigger_type, "function_id": function_id});
                if let Err(e) = outcome {
                    tracing::warn!(binding = %id, %trigger_type, "refused a trigger binding: {}", e.message);
                    frame["error"] = json!(e);
                }
                let _ = tx.send(Message::Text(frame.to_string().into()));
            });
        }
        Inbound::UnregisterTrigger { id } => {
            if let Some(p) = lock(&inner.state).provider.clone() {
                p.unregister(&id);
            }
        }
        Inbound::Pong => {}
        Inbound::Ping => {
            let _ = tx.send(Message::Text(json!({"type": "pong"}).to_string().into()));
        }
    }
    None
}

struct InflightGuard(Arc<Inner>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.0.inflight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// One `invokefunction` from the engine.
struct Invocation {
    invocation_id: Option<String>,
    function_id: String,
    data: Value,
    metadata: Option<Value>,
    trace: crate::telemetry::propagation::Carrier,
    /// The size of its frame.
    frame_bytes: usize,
}

fn dispatch_invocation(inner: &Arc<Inner>, tx: mpsc::UnboundedSender<Message>, inv: Invocation) {
    let Invocation {
        invocation_id,
        function_id,
        data,
        metadata,
        trace,
        frame_bytes,
    } = inv;
    if inner.draining.load(Ordering::SeqCst) {
        if let Some(id) = invocation_id {
            let refused = Err(ErrorBody::new("S216", "the worker is shutting down"));
            let _ = tx.send(Message::Text(
                invocation_result(&id, &function_id, &refused)
                    .to_string()
                    .into(),
            ));
        }
        return;
    }
    inner.inflight.fetch_add(1, Ordering::SeqCst);
    let guard = InflightGuard(inner.clone());
    // With telemetry on, the call is a span in its caller's trace; off, nothing is built.
    let call = crate::telemetry::active()
        .map(|hub| hub.start_call(&function_id, &trace, &data, frame_bytes));
    let handler = (inner.invoker)(function_id.clone(), data, metadata);
    tokio::spawn(async move {
        let _guard = guard;
        // The handler runs in its own task so that a panic becomes an S216 answer.
        let joined = match &call {
            Some(c) => tokio::spawn(c.run(handler)).await,
            None => tokio::spawn(handler).await,
        };
        let outcome = match joined {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(function_id, error = %e, "handler failed (a bug: the caller got S216; please report it with these log lines)");
                Err(ErrorBody::new("S216", "internal error: the handler failed"))
            }
        };
        let answer = invocation_id
            .as_ref()
            .map(|id| invocation_result(id, &function_id, &outcome).to_string());
        if let Some(c) = call {
            c.finish(&outcome, answer.as_ref().map_or(0, String::len));
        }
        if let Some(text) = answer {
            let _ = tx.send(Message::Text(text.into()));
        }
    });
}

/// The fire-and-forget `engine::workers::register` call.
fn worker_metadata(opts: &LinkOptions) -> Value {
    let mut data = json!({
        "name": opts.name,
        "version": opts.version,
        "runtime": "rust",
        "os": format!("{} {} (unix)", std::env::consts::OS, std::env::consts::ARCH),
        "pid": opts.pid,
        "description": "iii-shell: privilege-separated shell and filesystem worker",
    });
    if let Some(ns) = &opts.namespace {
        data["namespace"] = json!(ns);
    }
    json!({
        "type": "invokefunction",
        "invocation_id": null,
        "function_id": "engine::workers::register",
        "action": {"type": "void"},
        "data": data,
    })
}
