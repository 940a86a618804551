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

use crate::protocol::{self, Action, ErrorBody, InvokeFunction, OutboundInvoke};
use crate::state::{FunctionEntry, Shared, State, DEFAULT_NAMESPACE};
use crate::{channels, configuration, connection};

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Functions the engine serves in-process, all in namespace `default`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Builtin {
    WorkersRegister,
    ChannelsCreate,
    ConfigRegister,
    ConfigGet,
    ConfigSet,
    ConfigList,
    ConfigSchema,
    TracesList,
    TracesTree,
    LogsList,
    WorkersInfo,
}

impl Builtin {
    fn from_id(id: &str) -> Option<Self> {
        Some(match id {
            "engine::workers::register" => Builtin::WorkersRegister,
            "engine::channels::create" => Builtin::ChannelsCreate,
            "configuration::register" => Builtin::ConfigRegister,
            "configuration::get" => Builtin::ConfigGet,
            "configuration::set" => Builtin::ConfigSet,
            "configuration::list" => Builtin::ConfigList,
            "configuration::schema" => Builtin::ConfigSchema,
            "engine::traces::list" => Builtin::TracesList,
            "engine::traces::tree" => Builtin::TracesTree,
            "engine::logs::list" => Builtin::LogsList,
            "engine::workers::info" => Builtin::WorkersInfo,
            _ => return None,
        })
    }
}

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
    fn caller(&self) -> Option<Uuid> {
        match &self.reply {
            Reply::Socket { caller, .. } => Some(*caller),
            _ => None,
        }
    }
}

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
        Ok(Target::Builtin(Builtin::WorkersRegister)) => {
            // Inline: the namespace must be fixed before the next frame is read.
            answer(connection::register_worker(shared, caller, data));
        }
        // Builtins answer synchronously; configuration fan-outs run in their own task.
        Ok(Target::Builtin(builtin)) => answer(run_builtin(shared, builtin, data)),
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
            Target::Builtin(builtin) => run_builtin(&shared, builtin, data),
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

fn run_builtin(shared: &Arc<Shared>, builtin: Builtin, data: Value) -> Result<Value, ErrorBody> {
    match builtin {
        // Socket calls are handled inline by `connection::register_worker`.
        Builtin::WorkersRegister => Err(ErrorBody::new(
            "invocation_error",
            "engine::workers::register needs a worker connection",
        )),
        Builtin::ChannelsCreate => channels::create(shared, data),
        Builtin::ConfigRegister => configuration::register(shared, data),
        Builtin::ConfigGet => configuration::get(shared, data),
        Builtin::ConfigSet => configuration::set(shared, data),
        Builtin::ConfigList => configuration::list(shared, data),
        Builtin::ConfigSchema => configuration::schema(shared, data),
        Builtin::TracesList => shared.lock().telemetry.list_traces(&data),
        Builtin::TracesTree => shared.lock().telemetry.tree(&data),
        Builtin::LogsList => shared.lock().telemetry.list_logs(&data),
        Builtin::WorkersInfo => workers_info(shared, &data),
    }
}

/// `engine::workers::info {name, namespace?}`: the live worker of that name, its functions
/// and the `latest_metrics` its gauges reported (§8.2).
fn workers_info(shared: &Arc<Shared>, data: &Value) -> Result<Value, ErrorBody> {
    let name = data
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ErrorBody::new("deserialization_error", "missing field `name`"))?;
    let namespace = data
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_NAMESPACE);
    let st = shared.lock();
    let mut live: Vec<_> = st
        .conns
        .values()
        .filter(|c| {
            c.live()
                && c.name().as_deref() == Some(name)
                && c.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE) == namespace
        })
        .collect();
    live.sort_by_key(|c| c.seq);
    let conn = live
        .last()
        .ok_or_else(|| ErrorBody::new("WORKER_NOT_FOUND", format!("worker '{name}' not found")))?;
    let id = conn.worker_id.to_string();
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut functions: Vec<Value> = st
        .functions
        .iter()
        .filter(|(_, f)| f.owner == conn.worker_id)
        .map(|((_, fid), _)| json!({"function_id": fid}))
        .collect();
    functions.sort_by(|a, b| a["function_id"].as_str().cmp(&b["function_id"].as_str()));
    let mut worker = json!({
        "name": name,
        "id": id,
        "namespace": namespace,
        "status": "connected",
        "function_count": functions.len(),
    });
    if let Some(pid) = conn
        .register_data
        .as_ref()
        .and_then(|d| d.get("pid"))
        .cloned()
    {
        worker["pid"] = pid;
    }
    if let Some(m) = st.telemetry.latest_metrics(&id, now_ns) {
        worker["latest_metrics"] = m;
    }
    Ok(
        json!({"worker": worker, "functions": functions, "trigger_types": [], "registered_triggers": []}),
    )
}
