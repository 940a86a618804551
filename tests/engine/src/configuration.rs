//! The built-in `configuration` worker (§6): `configuration::{register, get,
//! set, list, schema}` over an in-memory store, and the `configuration`
//! trigger fan-out.
//!
//! Deliberate simplifications: `${VAR}` / `${VAR:default}` templates are *not*
//! expanded (values are returned and validated raw, so `EXPAND_FAILED` never
//! occurs); schemas are checked by [`crate::schema_check`]; there is no TTL
//! expiry and no file watching (tests use [`crate::TestEngine::config_set`] /
//! [`crate::TestEngine::config_delete`] to simulate external edits).

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::protocol::ErrorBody;
use crate::routing;
use crate::schema_check;
use crate::state::{CallOutcome, Shared};

pub use crate::config_store::ConfigEntry;
pub(crate) use crate::config_store::{ConfigEvent, REGISTERED, UPDATED};

/// Result of delivering one event to one bound function.
#[derive(Debug, Clone)]
pub struct FanOutResult {
    pub function_id: String,
    pub namespace: String,
    /// `None` when a `condition_function_id` skipped the handler.
    pub outcome: Option<CallOutcome>,
}

/// Calls every matching `configuration` binding sequentially, each awaited,
/// in the binding's namespace with the binding's metadata (§6.4).
pub(crate) async fn fan_out(shared: &Arc<Shared>, event: ConfigEvent) -> Vec<FanOutResult> {
    let subscribers = shared
        .lock()
        .triggers
        .configuration_subscribers(&event.entry.id, event.event_type);
    let payload = event.payload();
    let mut results = Vec::new();
    for sub in subscribers {
        if let Some(condition) = &sub.condition_function_id {
            let verdict = routing::call(
                shared,
                &sub.namespace,
                condition,
                payload.clone(),
                sub.metadata.clone(),
            )
            .await;
            if matches!(verdict, Ok(Value::Bool(false)) | Err(_)) {
                results.push(FanOutResult {
                    function_id: sub.function_id,
                    namespace: sub.namespace,
                    outcome: None,
                });
                continue;
            }
        }
        let outcome = routing::call(
            shared,
            &sub.namespace,
            &sub.function_id,
            payload.clone(),
            sub.metadata.clone(),
        )
        .await;
        if let Err(e) = &outcome {
            tracing::warn!(function_id = %sub.function_id, error = %e, "configuration handler failed");
        }
        results.push(FanOutResult {
            function_id: sub.function_id,
            namespace: sub.namespace,
            outcome: Some(outcome),
        });
    }
    results
}

fn spawn_fan_out(shared: &Arc<Shared>, event: ConfigEvent) {
    let shared = shared.clone();
    tokio::spawn(async move {
        fan_out(&shared, event).await;
    });
}

/// `store.rs validate_id`: `[a-z0-9_-]{1,64}`.
pub(crate) fn validate_id(id: &str) -> Result<(), ErrorBody> {
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ErrorBody::new(
            "INVALID_ID",
            format!("invalid configuration id '{id}': must match [a-z0-9_-]{{1,64}}"),
        ))
    }
}

fn parse<T: for<'de> Deserialize<'de>>(data: Value) -> Result<T, ErrorBody> {
    serde_json::from_value(data).map_err(ErrorBody::deserialization)
}

fn not_found(id: &str) -> ErrorBody {
    ErrorBody::new("NOT_FOUND", format!("configuration '{id}' not found"))
}

fn check(schema: &Value, value: &Value) -> Result<(), ErrorBody> {
    schema_check::validate(schema, value).map_err(|errors| {
        ErrorBody::new(
            "SCHEMA_INVALID",
            format!("schema validation failed: {}", errors.join("; ")),
        )
    })
}

#[derive(Deserialize)]
struct RegisterInput {
    id: String,
    name: String,
    description: String,
    schema: Value,
    #[serde(default)]
    initial_value: Option<Value>,
    #[serde(default)]
    metadata: Option<Value>,
}

/// `configuration::register`: idempotent; stores the schema in memory.
pub(crate) fn register(shared: &Arc<Shared>, data: Value) -> Result<Value, ErrorBody> {
    let input: RegisterInput = parse(data)?;
    validate_id(&input.id)?;
    let initial = input.initial_value.filter(|v| !v.is_null());
    if let Some(v) = &initial {
        check(&input.schema, v)?;
    }
    let (result, event) = shared.update(|st| {
        let previous = st.config.entries.get(&input.id).cloned();
        let value = match (&initial, &previous) {
            (Some(v), _) => v.clone(),
            (None, Some(prev)) => prev.value.clone(),
            (None, None) => Value::Null,
        };
        let entry = ConfigEntry {
            id: input.id.clone(),
            name: input.name,
            description: input.description,
            schema: Some(input.schema),
            value,
            metadata: input.metadata.filter(|m| !m.is_null()),
        };
        st.config.entries.insert(input.id.clone(), entry.clone());
        let event = match previous {
            Some(prev) => ConfigEvent::new(UPDATED, &entry, prev.value),
            None => ConfigEvent::new(REGISTERED, &entry, Value::Null),
        };
        (entry.stored(), event)
    });
    spawn_fan_out(shared, event);
    Ok(result)
}

#[derive(Deserialize)]
struct SetInput {
    id: String,
    value: Value,
}

/// `configuration::set`: needs a registered id with a known schema.
pub(crate) fn set(shared: &Arc<Shared>, data: Value) -> Result<Value, ErrorBody> {
    let input: SetInput = parse(data)?;
    validate_id(&input.id)?;
    let event = shared.update(|st| {
        let Some(entry) = st.config.entries.get_mut(&input.id) else {
            return Err(ErrorBody::new(
                "NOT_REGISTERED",
                format!(
                    "configuration '{}' is not registered; call configuration::register first",
                    input.id
                ),
            ));
        };
        let Some(schema) = &entry.schema else {
            return Err(ErrorBody::new(
                "SCHEMA_UNAVAILABLE",
                format!(
                    "schema for configuration '{}' is not available; its owner must call configuration::register again",
                    input.id
                ),
            ));
        };
        check(schema, &input.value)?;
        let old = std::mem::replace(&mut entry.value, input.value);
        Ok(ConfigEvent::new(UPDATED, entry, old))
    })?;
    let result = json!({"old_value": event.old_value, "new_value": event.new_value});
    spawn_fan_out(shared, event);
    Ok(result)
}

#[derive(Deserialize)]
struct GetInput {
    id: String,
    #[serde(default)]
    raw: bool,
}

/// `configuration::get`: `{id, value}`; validated against a known schema unless `raw`.
pub(crate) fn get(shared: &Arc<Shared>, data: Value) -> Result<Value, ErrorBody> {
    let input: GetInput = parse(data)?;
    validate_id(&input.id)?;
    let st = shared.lock();
    let entry = st
        .config
        .entry(&input.id)
        .ok_or_else(|| not_found(&input.id))?;
    if !input.raw {
        if let Some(schema) = &entry.schema {
            check(schema, &entry.value)?;
        }
    }
    Ok(json!({"id": entry.id, "value": entry.value}))
}

#[derive(Deserialize)]
struct ListInput {}

/// `configuration::list`: descriptors sorted by id, never values.
pub(crate) fn list(shared: &Arc<Shared>, data: Value) -> Result<Value, ErrorBody> {
    let _: ListInput = parse(data)?;
    let st = shared.lock();
    let configurations: Vec<Value> = st
        .config
        .entries
        .values()
        .map(ConfigEntry::descriptor)
        .collect();
    Ok(json!({"configurations": configurations}))
}

#[derive(Deserialize)]
struct SchemaInput {
    id: String,
}

/// `configuration::schema`: one descriptor (`schema: null` when unknown).
pub(crate) fn schema(shared: &Arc<Shared>, data: Value) -> Result<Value, ErrorBody> {
    let input: SchemaInput = parse(data)?;
    validate_id(&input.id)?;
    let st = shared.lock();
    st.config
        .entry(&input.id)
        .map(ConfigEntry::descriptor)
        .ok_or_else(|| not_found(&input.id))
}
