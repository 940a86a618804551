//! What the configuration worker stores: the entries, and the events a change fires. A leaf:
//! the engine state holds a [`ConfigStore`], and the `configuration` builtins (which route
//! fan-outs) change it.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

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
    pub(crate) fn descriptor(&self) -> Value {
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
    pub(crate) fn stored(&self) -> Value {
        let mut v = self.descriptor();
        if let Some(obj) = v.as_object_mut() {
            obj.insert("value".into(), self.value.clone());
        }
        v
    }
}

#[derive(Debug, Default)]
pub(crate) struct ConfigStore {
    pub(crate) entries: BTreeMap<String, ConfigEntry>,
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
    pub(crate) event_type: &'static str,
    pub(crate) entry: ConfigEntry,
    pub(crate) old_value: Value,
    pub(crate) new_value: Value,
}

impl ConfigEvent {
    pub(crate) fn new(event_type: &'static str, entry: &ConfigEntry, old_value: Value) -> Self {
        Self {
            event_type,
            entry: entry.clone(),
            old_value,
            new_value: entry.value.clone(),
        }
    }

    pub(crate) fn payload(&self) -> Value {
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
