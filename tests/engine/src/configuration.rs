//! The built-in `configuration` worker (§6): `configuration::{register, get,
//! set, list, schema}` over an in-memory store, and the `configuration`
//! trigger fan-out.
//!
//! Deliberate simplifications: `${VAR}` / `${VAR:default}` templates are *not*
//! expanded (values are returned and validated raw, so `EXPAND_FAILED` never
//! occurs); schemas are checked by [`crate::schema_check`]; there is no TTL
//! expiry and no file watching (tests use [`crate::TestEngine::config_set`] /
//! [`crate::TestEngine::config_delete`] to simulate external edits).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::protocol::ErrorBody;
use crate::routing;
use crate::schema_check;
use crate::state::{CallOutcome, Shared};

pub(crate) const REGISTERED: &str = "configuration:registered";
pub(crate) const UPDATED: &str = "configuration:updated";
pub(crate) const DELETED: &str = "configuration:deleted";

/// One stored configuration. `schema: None` = unknown (after a restart, or a
/// seeded value), which makes `set` fail with `SCHEMA_UNAVAILABLE`.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigEntry {
    pub id: String,
    pub name: String,
    pub description: String,
    pub schema: Option<Value>,
    pub value: Value,
    pub metadata: Option<Value>,
}

impl ConfigEntry {
    fn descriptor(&self) -> Value {
        let mut obj = Map::new();
        obj.insert("id".into(), json!(self.id));
        obj.insert("name".into(), json!(self.name));
        obj.insert("description".into(), json!(self.description));
        obj.insert("schema".into(), self.schema.clone().unwrap_or(Value::Null));
        if let Some(m) = &self.metadata {
            obj.insert("metadata".into(), m.clone());
        }
        Value::Object(obj)
    }

    /// `configuration::register` result: descriptor plus the raw value.
    fn stored(&self) -> Value {
        let mut v = self.descriptor();
        if let Some(obj) = v.as_object_mut() {
            obj.insert("value".into(), self.value.clone());
        }
        v
    }
}

#[derive(Debug, Default)]
pub(crate) struct ConfigStore {
    entries: BTreeMap<String, ConfigEntry>,
}

impl ConfigStore {
    pub(crate) fn entry(&self, id: &str) -> Option<&ConfigEntry> {
        self.entries.get(id)
    }

    /// Forgets every schema but keeps values (what an engine restart does).
    pub(crate) fn forget_schemas(&mut self) {
        for e in self.entries.values_mut() {
            e.schema = None;
        }
    }

    /// Stores a value without registration or event (a pre-existing file).
    pub(crate) fn seed(&mut self, id: &str, value: Value) {
        self.entries
            .entry(id.to_string())
            .or_insert_with(|| ConfigEntry {
                id: id.to_string(),
                name: String::new(),
                description: String::new(),
                schema: None,
                value: Value::Null,
                metadata: None,
            })
            .value = value;
    }

    /// Replaces the value unconditionally; returns the event to fire.
    pub(crate) fn overwrite(&mut self, id: &str, value: Value) -> ConfigEvent {
        let existed = self.entries.get(id).map(|e| e.value.clone());
        self.seed(id, value);
        let entry = self.entries[id].clone();
        match existed {
            Some(old) => ConfigEvent::new(UPDATED, &entry, old),
            None => ConfigEvent::new(REGISTERED, &entry, Value::Null),
        }
    }

    pub(crate) fn delete(&mut self, id: &str) -> Option<ConfigEvent> {
        let entry = self.entries.remove(id)?;
        let mut event = ConfigEvent::new(DELETED, &entry, entry.value.clone());
        event.new_value = Value::Null;
        Some(event)
    }
}

/// A configuration event ready for fan-out (§6.3).
#[derive(Debug, Clone)]
pub(crate) struct ConfigEvent {
    event_type: &'static str,
    entry: ConfigEntry,
    old_value: Value,
    new_value: Value,
}

impl ConfigEvent {
    fn new(event_type: &'static str, entry: &ConfigEntry, old_value: Value) -> Self {
        Self {
            event_type,
            entry: entry.clone(),
            old_value,
            new_value: entry.value.clone(),
        }
    }

    fn payload(&self) -> Value {
        let mut obj = Map::new();
        obj.insert("type".into(), json!("configuration"));
        obj.insert("event_type".into(), json!(self.event_type));
        obj.insert("id".into(), json!(self.entry.id));
        obj.insert("name".into(), json!(self.entry.name));
        obj.insert("description".into(), json!(self.entry.description));
        obj.insert(
            "schema".into(),
            self.entry.schema.clone().unwrap_or(Value::Null),
        );
        obj.insert("old_value".into(), self.old_value.clone());
        obj.insert("new_value".into(), self.new_value.clone());
        if let Some(m) = &self.entry.metadata {
            obj.insert("metadata".into(), m.clone());
        }
        Value::Object(obj)
    }
}

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
