//! Function registry and invocation routing (§2–§4).
//!
//! A socket caller's `invokefunction` is resolved strictly in its `namespace`
//! (absent → `default`): a worker-registered function wins, then the in-process
//! builtins (only in `default`). Worker functions are invoked on their owner
//! with the caller's invocation id (a fresh UUID for fire-and-forget calls or
//! on collision — the real engine does the same, see the transcripts), and the
//! owner's `invocationresult` is routed back to the caller.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::engine_functions::Builtin;
use crate::protocol::{self, Action, ErrorBody, InvokeFunction, OutboundInvoke};
use crate::state::{FunctionEntry, PendingCall, Reply, Shared, State, DEFAULT_NAMESPACE};

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

enum Target {
    Worker(Uuid),
    Builtin(Builtin),
}

impl State {
    /// `Engine::resolve_function`: strict lookup of `(namespace, id)`.
    fn resolve(&self, namespace: &str, function_id: &str) -> Result<Target, ErrorBody> {
        let key = (namespace.to_string(), function_id.to_string());
        if let Some(f) = self.functions.get(&key) {
            return Ok(Target::Worker(f.owner));
        }
        if namespace == DEFAULT_NAMESPACE {
            if let Some(b) = Builtin::from_id(function_id) {
                return Ok(Target::Builtin(b));
            }
        }
        let mut elsewhere: Vec<&str> = self
            .functions
            .keys()
            .filter(|(_, id)| id == function_id)
            .map(|(ns, _)| ns.as_str())
            .collect();
        elsewhere.sort_unstable();
        let mut message = format!("Function {function_id} not found in namespace {namespace}.");
        if !elsewhere.is_empty() {
            message.push_str(&format!(
                " It is registered in namespace(s): {}.",
                elsewhere.join(", ")
            ));
        }
        Err(ErrorBody::new("function_not_found", message))
    }

    /// Delivers a call outcome to whoever waits for it.
    pub(crate) fn deliver(
        &mut self,
        function_id: &str,
        reply: Reply,
        outcome: Result<Value, ErrorBody>,
    ) {
        match reply {
            Reply::Socket {
                caller,
                invocation_id,
            } => {
                let frame = protocol::invocation_result(&invocation_id, function_id, &outcome);
                self.send(caller, frame);
            }
            Reply::Internal(tx) => {
                let _ = tx.send(outcome);
            }
            Reply::Void => {}
        }
    }

    /// W→E `invocationresult`: only the connection that was invoked may answer;
    /// results for unknown ids are ignored.
    pub(crate) fn handle_invocation_result(
        &mut self,
        from: Uuid,
        invocation_id: &str,
        result: Option<Value>,
        error: Option<ErrorBody>,
    ) {
        let Ok(id) = Uuid::parse_str(invocation_id) else {
            return;
        };
        match self.pending.get(&id) {
            Some(p) if p.callee == from => {}
            _ => {
                tracing::debug!(%id, "invocationresult for unknown invocation ignored");
                return;
            }
        }
        if let Some(call) = self.pending.remove(&id) {
            let outcome = match error {
                Some(e) => Err(e),
                None => Ok(result.unwrap_or(Value::Null)),
            };
            self.deliver(&call.function_id, call.reply, outcome);
        }
    }

    /// Fails every in-flight call that has `conn` as caller or callee with
    /// `invocation_stopped` (`InvocationHandler::halt_invocation`).
    pub(crate) fn halt_invocations_of(&mut self, conn: Uuid) {
        let ids: Vec<Uuid> = self
            .pending
            .iter()
            .filter(|(_, p)| p.callee == conn || p.caller() == Some(conn))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(call) = self.pending.remove(&id) {
                self.deliver(
                    &call.function_id,
                    call.reply,
                    Err(ErrorBody::invocation_stopped()),
                );
            }
        }
    }

    /// Sends `invokefunction` to `owner` and records the pending call.
    fn dispatch_to_worker(
        &mut self,
        owner: Uuid,
        preferred_id: Option<Uuid>,
        function_id: &str,
        call: CallParts,
        reply: Reply,
    ) -> Result<(), (Reply, ErrorBody)> {
        let invocation_id = match preferred_id {
            Some(id) if !self.pending.contains_key(&id) => id,
            _ => Uuid::new_v4(),
        };
        let frame = protocol::invoke_function(OutboundInvoke {
            invocation_id,
            function_id,
            data: call.data,
            metadata: call.metadata,
            traceparent: call.traceparent,
            baggage: call.baggage,
        });
        if !self.send(owner, frame) {
            return Err((
                reply,
                ErrorBody::new(
                    "channel_send_failed",
                    format!("failed to send invocation of {function_id} to its worker"),
                ),
            ));
        }
        self.pending.insert(
            invocation_id,
            PendingCall {
                callee: owner,
                function_id: function_id.to_string(),
                reply,
            },
        );
        Ok(())
    }

    /// Applies `registerfunction` for a connection whose namespace is known (§2.1).
    pub(crate) fn register_function(
        &mut self,
        conn: Uuid,
        namespace: &str,
        id: &str,
        frame: Value,
    ) {
        if id.is_empty() {
            tracing::warn!("registerfunction with empty id ignored");
            return;
        }
        if id.starts_with("engine::") && namespace != DEFAULT_NAMESPACE {
            let rejected = protocol::registration_rejected(
                "FUNCTION_NAMESPACE_CONFLICT",
                namespace,
                Some(id),
                None,
                "",
            );
            self.send(conn, rejected);
            return;
        }
        let key = (namespace.to_string(), id.to_string());
        if let Some(existing) = self.functions.get(&key) {
            if existing.owner != conn && self.live_conn(existing.owner).is_some() {
                let rejected = protocol::registration_rejected(
                    "FUNCTION_NAMESPACE_CONFLICT",
                    namespace,
                    Some(id),
                    None,
                    &existing.owner.to_string(),
                );
                self.send(conn, rejected);
                return;
            }
        }
        let seq = self.next_seq();
        self.functions.insert(
            key,
            FunctionEntry {
                seq,
                owner: conn,
                frame,
                registered_at: Instant::now(),
            },
        );
    }

    pub(crate) fn unregister_function(&mut self, conn: Uuid, namespace: &str, id: &str) {
        let key = (namespace.to_string(), id.to_string());
        if self.functions.get(&key).is_some_and(|f| f.owner == conn) {
            self.functions.remove(&key);
        }
    }
}

struct CallParts {
    data: Value,
    metadata: Option<Value>,
    traceparent: Option<String>,
    baggage: Option<String>,
}

/// Handles a W→E `invokefunction` from connection `caller`.
pub(crate) fn handle_invoke(shared: &Arc<Shared>, caller: Uuid, msg: InvokeFunction) {
    let void = matches!(msg.action, Some(Action::Void)) || msg.invocation_id.is_none();
    let reply_id = if void {
        None
    } else {
        msg.invocation_id.clone()
    };
    let function_id = msg.function_id.clone();
    let answer = |outcome: Result<Value, ErrorBody>| {
        if let Some(id) = &reply_id {
            shared.update(|st| {
                st.send(
                    caller,
                    protocol::invocation_result(id, &function_id, &outcome),
                )
            });
        }
    };

    if matches!(msg.action, Some(Action::Enqueue { .. })) {
        answer(Err(ErrorBody::new(
            "enqueue_error",
            "enqueue is not available: no queue worker is connected",
        )));
        return;
    }
    let namespace = match msg.namespace.as_deref() {
        None => DEFAULT_NAMESPACE.to_string(),
        Some(ns) if ns.trim().is_empty() => {
            answer(Err(ErrorBody::new(
                "INVALID_NAMESPACE",
                "namespace must not be blank",
            )));
            return;
        }
        Some(ns) => ns.to_string(),
    };

    let mut data = msg.data;
    if let Some(obj) = data.as_object_mut() {
        obj.insert("_caller_worker_id".into(), json!(caller.to_string()));
    }

    let target = shared.lock().resolve(&namespace, &function_id);
    match target {
        Err(error) => answer(Err(error)),
        // Builtins answer synchronously; configuration fan-outs run in their own task.
        Ok(Target::Builtin(builtin)) => {
            answer((shared.run_builtin)(shared, Some(caller), builtin, data))
        }
        Ok(Target::Worker(owner)) => {
            let preferred = msg
                .invocation_id
                .as_deref()
                .filter(|_| !void)
                .and_then(|id| Uuid::parse_str(id).ok());
            let reply = match &reply_id {
                Some(id) => Reply::Socket {
                    caller,
                    invocation_id: id.clone(),
                },
                None => Reply::Void,
            };
            let parts = CallParts {
                data,
                metadata: msg.metadata,
                traceparent: msg.traceparent,
                baggage: msg.baggage,
            };
            shared.update(|st| {
                if let Err((reply, error)) =
                    st.dispatch_to_worker(owner, preferred, &function_id, parts, reply)
                {
                    st.deliver(&function_id, reply, Err(error));
                }
            });
        }
    }
}

/// An engine-originated call (trigger fan-out, test helper): no
/// `_caller_worker_id` is injected; the result is awaited without timeout.
pub(crate) fn call(
    shared: &Arc<Shared>,
    namespace: &str,
    function_id: &str,
    data: Value,
    metadata: Option<Value>,
) -> BoxFuture<Result<Value, ErrorBody>> {
    let shared = shared.clone();
    let namespace = namespace.to_string();
    let function_id = function_id.to_string();
    Box::pin(async move {
        let target = shared.lock().resolve(&namespace, &function_id)?;
        match target {
            Target::Builtin(builtin) => (shared.run_builtin)(&shared, None, builtin, data),
            Target::Worker(owner) => {
                let (tx, rx) = oneshot::channel();
                let parts = CallParts {
                    data,
                    metadata,
                    traceparent: None,
                    baggage: None,
                };
                shared.update(|st| {
                    st.dispatch_to_worker(owner, None, &function_id, parts, Reply::Internal(tx))
                        .map_err(|(_, e)| e)
                })?;
                rx.await
                    .unwrap_or_else(|_| Err(ErrorBody::invocation_stopped()))
            }
        }
    })
}
