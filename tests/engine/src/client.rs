//! [`TestClient`]: a raw socket worker for tests — calls functions through the
//! engine, mocks other workers' functions, and moves bytes through channels.
//!
//! It connects once (no reconnect); after an engine restart, create a new one.

use std::collections::HashMap;
use std::future::Future;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Map, Value};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use uuid::Uuid;

use crate::protocol::{ChannelRef, ErrorBody};
use crate::routing::BoxFuture;
use crate::state::Shared;

/// A raw client-side WebSocket to a channel end.
pub type ChannelSocket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Default per-call timeout, like the SDK's.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for helper operations that should be quick (registration, channel I/O).
const HELPER_TIMEOUT: Duration = Duration::from_secs(30);

type Handler =
    Arc<dyn Fn(Value, Option<Value>) -> BoxFuture<Result<Value, ErrorBody>> + Send + Sync>;
type Pending = Arc<Mutex<HashMap<Uuid, oneshot::Sender<Result<Value, ErrorBody>>>>>;

/// A fresh worker name for a raw client: `test-client-` and eight hex digits of a random id
/// (no counter shared by every engine in the process).
pub(crate) fn next_client_name() -> String {
    let id = Uuid::new_v4().simple().to_string();
    format!("test-client-{}", &id[..8])
}

struct Inner {
    out: mpsc::UnboundedSender<Message>,
    pending: Pending,
    handlers: Mutex<HashMap<String, Handler>>,
    received: Mutex<Vec<Value>>,
    /// The engine's `keep_invocation_frames` setting.
    keep_invocation_frames: bool,
    notify: Notify,
}

impl Inner {
    fn send(&self, frame: Value) -> bool {
        self.out.send(Message::text(frame.to_string())).is_ok()
    }
}

/// A socket worker driven by the test. Dropping it drops the socket.
pub struct TestClient {
    shared: Arc<Shared>,
    inner: Arc<Inner>,
    name: String,
    namespace: Option<String>,
    worker_id: Uuid,
    reattach_token: Uuid,
    task: JoinHandle<()>,
    timeout: Duration,
}

impl Drop for TestClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestClient {
    /// Connects, reads `workerregistered`, sends `engine::workers::register`
    /// (fire-and-forget, first frame) and waits until the engine applied it.
    pub(crate) async fn connect(
        shared: Arc<Shared>,
        name: String,
        namespace: Option<String>,
    ) -> TestClient {
        let url = shared.base_url();
        let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .unwrap_or_else(|e| panic!("test client could not connect to {url}: {e}"));
        let hello = tokio::time::timeout(HELPER_TIMEOUT, ws.next())
            .await
            .expect("timed out waiting for workerregistered");
        let hello: Value = match hello {
            Some(Ok(Message::Text(t))) => {
                serde_json::from_str(t.as_str()).expect("workerregistered is JSON")
            }
            other => panic!("expected workerregistered, got {other:?}"),
        };
        assert_eq!(hello["type"], "workerregistered", "first frame: {hello}");
        let parse_id = |k: &str| {
            hello[k]
                .as_str()
                .and_then(|s| Uuid::parse_str(s).ok())
                .unwrap_or_else(|| panic!("workerregistered.{k} is not a UUID: {hello}"))
        };
        let worker_id = parse_id("worker_id");
        let reattach_token = parse_id("reattach_token");

        let (out, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            out,
            pending: Arc::new(Mutex::new(HashMap::new())),
            handlers: Mutex::new(HashMap::new()),
            received: Mutex::new(vec![hello]),
            keep_invocation_frames: shared.settings.keep_invocation_frames,
            notify: Notify::new(),
        });
        let task = tokio::spawn(client_loop(ws, rx, inner.clone()));

        let mut data = json!({
            "name": name,
            "runtime": "test-client",
            "version": env!("CARGO_PKG_VERSION"),
            "os": std::env::consts::OS,
            "pid": std::process::id(),
        });
        if let (Some(ns), Some(obj)) = (&namespace, data.as_object_mut()) {
            obj.insert("namespace".into(), json!(ns));
        }
        inner.send(json!({
            "type": "invokefunction",
            "invocation_id": null,
            "function_id": "engine::workers::register",
            "action": {"type": "void"},
            "data": data,
        }));
        // Namespace applied, or the connection was refused (worker-name lease).
        let applied = shared
            .wait_for(HELPER_TIMEOUT, |st| {
                let conn = st.conns.get(&worker_id)?;
                match (&conn.namespace, conn.live()) {
                    (Some(_), true) => Some(true),
                    (_, false) => Some(false),
                    (None, true) => None,
                }
            })
            .await;
        match applied {
            Some(true) => {}
            Some(false) => panic!(
                "test client {name:?} was refused by the engine: {:?}",
                inner
                    .received
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .last()
            ),
            None => panic!("engine never applied the register call of test client {name:?}"),
        }
        TestClient {
            shared,
            inner,
            name,
            namespace,
            worker_id,
            reattach_token,
            task,
            timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    pub fn worker_id(&self) -> Uuid {
        self.worker_id
    }

    pub fn reattach_token(&self) -> Uuid {
        self.reattach_token
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Changes the timeout used by `call*` (default 30 s).
    pub fn set_call_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Sends any JSON frame as-is.
    pub fn send_raw(&self, frame: Value) {
        self.inner.send(frame);
    }

    /// Every JSON frame received so far (including `workerregistered`).
    pub fn received(&self) -> Vec<Value> {
        self.inner
            .received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits for a received frame matching `pred` (already received ones count).
    pub async fn wait_for_frame(
        &self,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(v) = self.received().into_iter().find(|v| pred(v)) {
                return Some(v);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return None;
            }
            let _ = tokio::time::timeout((deadline - now).min(Duration::from_millis(50)), notified)
                .await;
        }
    }

    /// Calls `function_id` in namespace `default` and waits for the result.
    pub async fn call(&self, function_id: &str, data: Value) -> Result<Value, ErrorBody> {
        self.invoke(function_id, data, None, None, self.timeout)
            .await
    }

    /// Calls `function_id` carrying W3C trace context (`traceparent`, and `baggage`).
    pub async fn call_with_trace(
        &self,
        function_id: &str,
        data: Value,
        traceparent: &str,
        baggage: Option<&str>,
    ) -> Result<Value, ErrorBody> {
        let mut extra = Map::new();
        extra.insert("traceparent".into(), json!(traceparent));
        if let Some(b) = baggage {
            extra.insert("baggage".into(), json!(b));
        }
        self.invoke_frame(function_id, data, None, None, extra, self.timeout)
            .await
    }

    pub async fn call_with_metadata(
        &self,
        function_id: &str,
        data: Value,
        metadata: Value,
    ) -> Result<Value, ErrorBody> {
        self.invoke(function_id, data, Some(metadata), None, self.timeout)
            .await
    }

    /// Calls `function_id` resolved in `namespace`.
    pub async fn call_in_namespace(
        &self,
        namespace: &str,
        function_id: &str,
        data: Value,
    ) -> Result<Value, ErrorBody> {
        self.invoke(function_id, data, None, Some(namespace), self.timeout)
            .await
    }

    pub async fn call_with_timeout(
        &self,
        function_id: &str,
        data: Value,
        timeout: Duration,
    ) -> Result<Value, ErrorBody> {
        self.invoke(function_id, data, None, None, timeout).await
    }

    /// Fire-and-forget (`invocation_id: null`, `action: void`).
    pub fn call_void(&self, function_id: &str, data: Value) {
        self.inner.send(json!({
            "type": "invokefunction",
            "invocation_id": null,
            "function_id": function_id,
            "action": {"type": "void"},
            "data": data,
        }));
    }

    async fn invoke(
        &self,
        function_id: &str,
        data: Value,
        metadata: Option<Value>,
        namespace: Option<&str>,
        timeout: Duration,
    ) -> Result<Value, ErrorBody> {
        self.invoke_frame(function_id, data, metadata, namespace, Map::new(), timeout)
            .await
    }

    async fn invoke_frame(
        &self,
        function_id: &str,
        data: Value,
        metadata: Option<Value>,
        namespace: Option<&str>,
        extra: Map<String, Value>,
        timeout: Duration,
    ) -> Result<Value, ErrorBody> {
        let id = Uuid::new_v4();
        let (tx, rx) = oneshot::channel();
        self.inner
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        let mut frame = Map::new();
        frame.insert("type".into(), json!("invokefunction"));
        frame.insert("invocation_id".into(), json!(id.to_string()));
        frame.insert("function_id".into(), json!(function_id));
        frame.insert("data".into(), data);
        if let Some(m) = metadata {
            frame.insert("metadata".into(), m);
        }
        if let Some(ns) = namespace {
            frame.insert("namespace".into(), json!(ns));
        }
        frame.extend(extra);
        if !self.inner.send(Value::Object(frame)) {
            return Err(not_connected());
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(not_connected()),
            Err(_) => {
                self.inner
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                Err(ErrorBody::new(
                    "Timeout",
                    format!("invocation of {function_id} timed out after {timeout:?}"),
                ))
            }
        }
    }

    /// Registers `id` (`{"type":"registerfunction","id":id}`) served by `handler`,
    /// and waits until the engine has filed it.
    pub async fn register_function<F, Fut>(&self, id: &str, handler: F) -> Result<(), ErrorBody>
    where
        F: Fn(Value, Option<Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ErrorBody>> + Send + 'static,
    {
        self.register_function_frame(json!({"type": "registerfunction", "id": id}), handler)
            .await
    }

    /// Like [`Self::register_function`] with a full `registerfunction` frame
    /// (description, request_format, metadata …; `type` is filled in).
    pub async fn register_function_frame<F, Fut>(
        &self,
        mut frame: Value,
        handler: F,
    ) -> Result<(), ErrorBody>
    where
        F: Fn(Value, Option<Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ErrorBody>> + Send + 'static,
    {
        let id = frame["id"]
            .as_str()
            .expect("registerfunction frame needs an \"id\"")
            .to_string();
        if let Some(obj) = frame.as_object_mut() {
            obj.insert("type".into(), json!("registerfunction"));
        }
        let handler: Handler = Arc::new(move |data, metadata| Box::pin(handler(data, metadata)));
        self.inner
            .handlers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), handler);
        let rejected_before = self.rejections_for(&id);
        self.inner.send(frame);

        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let key = (namespace, id.clone());
        let me = self.worker_id;
        let deadline = tokio::time::Instant::now() + HELPER_TIMEOUT;
        loop {
            let filed = self
                .shared
                .wait_for(Duration::from_millis(50), |st| {
                    st.functions.get(&key).filter(|f| f.owner == me).map(|_| ())
                })
                .await;
            if filed.is_some() {
                return Ok(());
            }
            if let Some(rejection) = self
                .rejections_for(&id)
                .into_iter()
                .nth(rejected_before.len())
            {
                return Err(ErrorBody::new(
                    rejection["code"].as_str().unwrap_or("registrationrejected"),
                    rejection.to_string(),
                ));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ErrorBody::new(
                    "Timeout",
                    format!("{id} was never registered"),
                ));
            }
        }
    }

    fn rejections_for(&self, id: &str) -> Vec<Value> {
        self.received()
            .into_iter()
            .filter(|v| v["type"] == "registrationrejected" && v["function_id"] == id)
            .collect()
    }

    /// Sends `unregisterfunction` and forgets the handler.
    pub fn unregister_function(&self, id: &str) {
        self.inner
            .handlers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.inner
            .send(json!({"type": "unregisterfunction", "id": id}));
    }

    /// Sends `registertrigger` (binding `function_id` to `trigger_type`).
    pub fn register_trigger(&self, id: &str, trigger_type: &str, function_id: &str, config: Value) {
        self.inner.send(json!({
            "type": "registertrigger",
            "id": id,
            "trigger_type": trigger_type,
            "function_id": function_id,
            "config": config,
        }));
    }

    /// `engine::channels::create` → `(writer, reader)` refs.
    pub async fn create_channel(&self) -> (ChannelRef, ChannelRef) {
        self.create_channel_sized(None).await
    }

    pub async fn create_channel_sized(&self, buffer_size: Option<u64>) -> (ChannelRef, ChannelRef) {
        let refs = self
            .call(
                "engine::channels::create",
                json!({"buffer_size": buffer_size}),
            )
            .await
            .expect("engine::channels::create failed");
        let writer = serde_json::from_value(refs["writer"].clone()).expect("writer ref");
        let reader = serde_json::from_value(refs["reader"].clone()).expect("reader ref");
        (writer, reader)
    }

    /// Opens a channel end (`ref.direction` decides `dir=`). A 404 is an `Err`.
    pub async fn open_channel(
        &self,
        channel: &ChannelRef,
    ) -> Result<ChannelSocket, tungstenite::Error> {
        let url = channel.url(&self.shared.base_url());
        tokio_tungstenite::connect_async(url.as_str())
            .await
            .map(|(ws, _)| ws)
    }

    /// Opens the writer end, sends `chunks`, then Close.
    pub async fn write_channel(&self, writer: &ChannelRef, chunks: Vec<Message>) {
        let mut ws = self
            .open_channel(writer)
            .await
            .expect("open channel writer");
        tokio::time::timeout(HELPER_TIMEOUT, async {
            for chunk in chunks {
                ws.send(chunk).await.expect("channel write");
            }
            ws.close(None).await.expect("channel close");
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await
        .expect("writing the channel timed out");
    }

    /// Opens the reader end and collects data messages until Close (end of stream).
    pub async fn read_channel(&self, reader: &ChannelRef) -> Vec<Message> {
        let mut ws = self
            .open_channel(reader)
            .await
            .expect("open channel reader");
        tokio::time::timeout(HELPER_TIMEOUT, async {
            let mut messages = Vec::new();
            while let Some(msg) = ws.next().await {
                match msg {
                    Ok(m @ (Message::Binary(_) | Message::Text(_))) => messages.push(m),
                    Ok(Message::Close(_)) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            messages
        })
        .await
        .expect("reading the channel timed out")
    }

    /// [`Self::read_channel`] split into concatenated binary bytes and text frames.
    pub async fn read_channel_bytes(&self, reader: &ChannelRef) -> (Vec<u8>, Vec<String>) {
        let mut bytes = Vec::new();
        let mut texts = Vec::new();
        for m in self.read_channel(reader).await {
            match m {
                Message::Binary(b) => bytes.extend_from_slice(&b),
                Message::Text(t) => texts.push(t.as_str().to_string()),
                _ => {}
            }
        }
        (bytes, texts)
    }

    /// Sends a Close frame and waits for the socket task to end.
    pub async fn close(self) {
        let _ = self.inner.out.send(Message::Close(None));
        let me = self.worker_id;
        self.shared
            .wait_for(HELPER_TIMEOUT, |st| {
                st.conns.get(&me).filter(|c| !c.socket_open).map(|_| ())
            })
            .await;
    }
}

fn not_connected() -> ErrorBody {
    ErrorBody::new("NotConnected", "test client is not connected")
}

async fn client_loop(
    ws: ChannelSocket,
    mut rx: mpsc::UnboundedReceiver<Message>,
    inner: Arc<Inner>,
) {
    let (mut sink, mut stream) = ws.split();
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(msg) => {
                    let closing = matches!(msg, Message::Close(_));
                    if sink.send(msg).await.is_err() {
                        break;
                    }
                    if closing {
                        while let Some(Ok(_)) = stream.next().await {}
                        break;
                    }
                }
                None => break,
            },
            incoming = stream.next() => match incoming {
                Some(Ok(Message::Text(text))) => {
                    if let Ok(frame) = serde_json::from_str::<Value>(text.as_str()) {
                        handle_frame(&inner, frame);
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
        }
    }
    // Dropping the senders fails waiting calls with NotConnected.
    inner
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    inner.notify.notify_waiters();
}

fn handle_frame(inner: &Arc<Inner>, frame: Value) {
    match frame["type"].as_str() {
        Some("invocationresult") => {
            let id = frame["invocation_id"]
                .as_str()
                .and_then(|s| Uuid::parse_str(s).ok());
            let waiter = id.and_then(|id| {
                inner
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id)
            });
            if let Some(waiter) = waiter {
                let outcome = match frame.get("error").filter(|e| !e.is_null()) {
                    Some(e) => Err(serde_json::from_value(e.clone())
                        .unwrap_or_else(|_| ErrorBody::new("invalid_error", e.to_string()))),
                    None => Ok(frame.get("result").cloned().unwrap_or(Value::Null)),
                };
                let _ = waiter.send(outcome);
            }
        }
        Some("invokefunction") => {
            let function_id = frame["function_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let handler = inner
                .handlers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&function_id)
                .cloned();
            let invocation_id = frame["invocation_id"].as_str().map(String::from);
            let data = frame.get("data").cloned().unwrap_or(Value::Null);
            let metadata = frame.get("metadata").cloned();
            let inner = inner.clone();
            tokio::spawn(async move {
                let outcome = match handler {
                    Some(h) => h(data, metadata).await,
                    None => Err(ErrorBody::new(
                        "function_not_found",
                        format!("function {function_id} not found"),
                    )),
                };
                if let Some(id) = invocation_id {
                    let mut reply = json!({
                        "type": "invocationresult",
                        "invocation_id": id,
                        "function_id": function_id,
                    });
                    if let Some(obj) = reply.as_object_mut() {
                        match outcome {
                            Ok(v) => obj.insert("result".into(), v),
                            Err(e) => obj.insert("error".into(), json!(e)),
                        };
                    }
                    inner.send(reply);
                }
            });
        }
        Some("ping") => {
            inner.send(json!({"type": "pong"}));
        }
        _ => {}
    }
    if inner.keep_invocation_frames || !crate::state::is_invocation_frame(&frame) {
        inner
            .received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(frame);
    }
    inner.notify.notify_waiters();
}
