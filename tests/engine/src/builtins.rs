//! Running the engine's own functions ([`Builtin`]): worker registration, channels, the
//! configuration worker, and the observability queries.

use std::sync::Arc;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::engine_functions::Builtin;
use crate::protocol::ErrorBody;
use crate::state::{Shared, DEFAULT_NAMESPACE};
use crate::{channels, configuration, connection};

/// Runs `builtin` for `caller` (the worker connection that invoked it; `None` for an
/// engine-originated call). Answers synchronously; configuration fan-outs run in their own
/// task. Installed in [`Shared`] as its builtin runner, so routing does not name the modules
/// the builtins live in (they route calls of their own).
pub(crate) fn run(
    shared: &Arc<Shared>,
    caller: Option<Uuid>,
    builtin: Builtin,
    data: Value,
) -> Result<Value, ErrorBody> {
    match builtin {
        // Inline: the namespace must be fixed before the next frame is read.
        Builtin::WorkersRegister => match caller {
            Some(caller) => connection::register_worker(shared, caller, data),
            None => Err(ErrorBody::new(
                "invocation_error",
                "engine::workers::register needs a worker connection",
            )),
        },
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
