//! One worker socket (`/`): start-up, frame dispatch, namespace queue, reattach
//! and teardown (§1.4–§1.7, §8.1).

use std::sync::Arc;
use std::time::Instant;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use uuid::Uuid;

use crate::protocol::{self, ErrorBody, Inbound};
use crate::routing;
use crate::state;
use crate::state::{
    Conn, Hangup, NamespaceSource, Outbound, ReceivedFrame, Shared, State, DEFAULT_NAMESPACE,
};

/// Serves one upgraded worker socket until it ends.
pub(crate) async fn run(shared: Arc<Shared>, ws: WebSocketStream<TcpStream>) {
    let worker_id = Uuid::new_v4();
    let reattach_token = Uuid::new_v4();
    let (tx, mut rx) = mpsc::unbounded_channel();
    shared.update(|st| {
        let seq = st.next_seq();
        st.conns.insert(
            worker_id,
            Conn {
                seq,
                worker_id,
                reattach_token,
                tx: Some(tx),
                socket_open: true,
                namespace: None,
                namespace_source: None,
                queued: Vec::new(),
                register_data: None,
                connected_at: Instant::now(),
                register_call_at: None,
                registrations_applied_at: None,
                disconnected_at: None,
                received: Vec::new(),
                sent: Vec::new(),
            },
        );
        st.send(
            worker_id,
            protocol::worker_registered(worker_id, reattach_token),
        );
    });
    tracing::debug!(%worker_id, "worker connected");
    spawn_grace_timer(&shared, worker_id);

    let (mut sink, mut stream) = ws.split();
    let mut reads_paused = false;
    loop {
        tokio::select! {
            biased;
            out = rx.recv() => match out {
                Some(Outbound::Frame(msg)) => {
                    if sink.send(msg).await.is_err() {
                        break;
                    }
                }
                Some(Outbound::Close) => {
                    let frame = CloseFrame { code: CloseCode::Away, reason: "engine closing".into() };
                    let _ = sink.send(Message::Close(Some(frame))).await;
                    break;
                }
                Some(Outbound::PauseReads(paused)) => reads_paused = paused,
                Some(Outbound::Abort) | None => break,
            },
            incoming = stream.next(), if !reads_paused => match incoming {
                Some(Ok(Message::Text(text))) => dispatch(&shared, worker_id, text.as_str(), false),
                Some(Ok(Message::Binary(bytes))) => {
                    let text = String::from_utf8_lossy(&bytes).into_owned();
                    dispatch(&shared, worker_id, &text, true);
                }
                // WS Ping is answered by tungstenite on the next read/write.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
            },
        }
    }
    drop(sink);
    drop(stream);
    shared.update(|st| {
        st.teardown(worker_id, Hangup::AlreadyGone);
        if let Some(conn) = st.conns.get_mut(&worker_id) {
            conn.socket_open = false;
        }
    });
    tracing::debug!(%worker_id, "worker socket closed");
}

fn spawn_grace_timer(shared: &Arc<Shared>, worker_id: Uuid) {
    let shared = Arc::downgrade(shared);
    let grace = match shared.upgrade() {
        Some(s) => s.settings.namespace_grace,
        None => return,
    };
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        if let Some(shared) = shared.upgrade() {
            shared.update(|st| {
                if st
                    .live_conn(worker_id)
                    .is_some_and(|c| c.namespace.is_none())
                {
                    tracing::debug!(%worker_id, "namespace grace expired; pinned to default");
                    st.resolve_namespace(worker_id, DEFAULT_NAMESPACE, NamespaceSource::GraceTimer);
                }
            });
        }
    });
}

/// Handles one text (or non-telemetry binary) payload from a worker.
fn dispatch(shared: &Arc<Shared>, worker_id: Uuid, text: &str, binary: bool) {
    if binary && ["OTLP", "MTRC", "LOGS"].iter().any(|p| text.starts_with(p)) {
        record(shared, worker_id, text, binary, None);
        // The worker socket takes telemetry frames too (§1.2).
        shared.update(|st| st.telemetry.ingest(text.as_bytes()));
        return;
    }
    let decoded = protocol::decode(text);
    let keep = shared.settings.keep_invocation_frames
        || !matches!(&decoded, Ok(Some((value, _))) if state::is_invocation_frame(value));
    let live = if keep {
        let json = match &decoded {
            Ok(Some((value, _))) => Some(value.clone()),
            _ => serde_json::from_str(text).ok(),
        };
        record(shared, worker_id, text, binary, json)
    } else {
        shared.update(|st| st.live_conn(worker_id).is_some())
    };
    if !live {
        return; // torn down (e.g. evicted) while frames were still arriving
    }
    let (frame, msg) = match decoded {
        Ok(Some(decoded)) => decoded,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(%worker_id, error = %e, "json decode error; frame ignored");
            return;
        }
    };
    match msg {
        Inbound::Ping => {
            shared.update(|st| st.send(worker_id, protocol::pong()));
        }
        Inbound::Pong => {}
        Inbound::Reattach {
            previous_worker_id,
            reattach_token,
        } => reattach(shared, worker_id, previous_worker_id, reattach_token),
        Inbound::InvokeFunction(call) => routing::handle_invoke(shared, worker_id, call),
        Inbound::InvocationResult {
            invocation_id,
            result,
            error,
            ..
        } => shared
            .update(|st| st.handle_invocation_result(worker_id, &invocation_id, result, error)),
        Inbound::TriggerRegistrationResult {
            id,
            trigger_type,
            function_id,
            error,
        } => shared.update(|st| {
            st.handle_trigger_registration_result(
                worker_id,
                &id,
                &trigger_type,
                &function_id,
                error,
            )
        }),
        // The remaining variants are the namespaced registrations (§1.4 step 2).
        registration => shared.update(|st| {
            let Some(conn) = st.conns.get_mut(&worker_id) else {
                return;
            };
            match conn.namespace.clone() {
                None => conn.queued.push((frame, registration)),
                Some(ns) => st.apply_registration(worker_id, &ns, frame, registration),
            }
        }),
    }
}

/// Appends to the connection's frame log; false if the connection is gone.
fn record(shared: &Shared, worker_id: Uuid, text: &str, binary: bool, json: Option<Value>) -> bool {
    shared.update(|st| match st.conns.get_mut(&worker_id) {
        Some(conn) if conn.live() => {
            conn.received.push(ReceivedFrame {
                at: Instant::now(),
                raw: text.to_string(),
                binary,
                json,
            });
            true
        }
        _ => false,
    })
}

/// `reattach`: evict the previous connection when id and token match (§1.6).
/// Cleanup is synchronous, so later frames already see a clean slate.
fn reattach(shared: &Shared, worker_id: Uuid, previous: Option<String>, token: Option<String>) {
    let Some(previous) = previous.and_then(|p| Uuid::parse_str(&p).ok()) else {
        return;
    };
    if previous == worker_id {
        return;
    }
    shared.update(|st| {
        let matches = st
            .live_conn(previous)
            .is_some_and(|old| Some(old.reattach_token.to_string()) == token);
        if matches {
            tracing::debug!(%worker_id, %previous, "reattach: evicting previous connection");
            st.teardown(previous, Hangup::Abort);
        }
    });
}

/// `engine::workers::register` (§8.1), run inline for the calling connection.
pub(crate) fn register_worker(
    shared: &Shared,
    worker_id: Uuid,
    data: Value,
) -> Result<Value, ErrorBody> {
    if !data.is_object() {
        return Err(ErrorBody::deserialization(
            "invalid type: expected an object",
        ));
    }
    let namespace = match data.get("namespace") {
        None | Some(Value::Null) => DEFAULT_NAMESPACE.to_string(),
        Some(Value::String(ns)) if ns.trim().is_empty() => {
            return Err(ErrorBody::new(
                "INVALID_NAMESPACE",
                "namespace must not be blank",
            ));
        }
        Some(Value::String(ns)) => ns.clone(),
        Some(other) => {
            return Err(ErrorBody::deserialization(format!(
                "namespace: invalid type {other}, expected a string"
            )))
        }
    };
    shared.update(|st| {
        let Some(conn) = st.conns.get_mut(&worker_id).filter(|c| c.live()) else {
            return Ok(json!({"success": false}));
        };
        conn.register_call_at.get_or_insert_with(Instant::now);
        conn.register_data = Some(data);
        let name = conn.name().filter(|n| !n.is_empty());
        // A late call (after the grace timer) cannot move the namespace.
        let effective_ns = conn.namespace.clone().unwrap_or(namespace);

        if let Some(name) = name {
            let holder = st
                .conns
                .values()
                .filter(|c| c.live() && c.worker_id != worker_id)
                .find(|c| {
                    c.namespace.as_deref() == Some(&effective_ns)
                        && c.name().as_deref() == Some(&name)
                })
                .map(|c| c.worker_id);
            if let Some(holder) = holder {
                let rejected = protocol::registration_rejected(
                    "WORKER_NAMESPACE_CONFLICT",
                    &effective_ns,
                    None,
                    Some(&name),
                    &holder.to_string(),
                );
                st.send(worker_id, rejected);
                st.teardown(worker_id, Hangup::Close);
                return Ok(json!({"success": false}));
            }
        }
        if st
            .conns
            .get(&worker_id)
            .is_some_and(|c| c.namespace.is_none())
        {
            st.resolve_namespace(worker_id, &effective_ns, NamespaceSource::RegisterCall);
        }
        Ok(json!({"success": true}))
    })
}

impl State {
    /// Fixes the connection namespace and drains its queued registrations in order.
    pub(crate) fn resolve_namespace(
        &mut self,
        worker_id: Uuid,
        namespace: &str,
        source: NamespaceSource,
    ) {
        let Some(conn) = self.conns.get_mut(&worker_id) else {
            return;
        };
        if conn.namespace.is_some() {
            return;
        }
        conn.namespace = Some(namespace.to_string());
        conn.namespace_source = Some(source);
        conn.registrations_applied_at = Some(Instant::now());
        let queued = std::mem::take(&mut conn.queued);
        for (frame, msg) in queued {
            self.apply_registration(worker_id, namespace, frame, msg);
        }
    }

    /// Applies one namespaced registration message (with its raw frame).
    pub(crate) fn apply_registration(
        &mut self,
        worker_id: Uuid,
        namespace: &str,
        frame: Value,
        msg: Inbound,
    ) {
        match msg {
            Inbound::RegisterFunction { id } => {
                self.register_function(worker_id, namespace, &id, frame)
            }
            Inbound::UnregisterFunction { id } => {
                self.unregister_function(worker_id, namespace, &id)
            }
            Inbound::RegisterService { id } => {
                self.services
                    .insert((namespace.to_string(), id), (worker_id, frame));
            }
            Inbound::RegisterTriggerType { id, namespace: ns } => {
                self.register_trigger_type(worker_id, namespace, ns, &id, frame)
            }
            Inbound::RegisterTrigger(reg) => {
                self.register_trigger(worker_id, namespace, reg, frame)
            }
            Inbound::UnregisterTrigger { id } => self.unregister_trigger(&id),
            other => tracing::warn!(?other, "not a registration message"),
        }
    }
}
