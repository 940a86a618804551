//! Trigger types and bindings (§5, §6.2).
//!
//! The `configuration` type (namespace `default`) is provided in-process; every
//! other type is provided by the worker connection that sent
//! `registertriggertype`. Bindings whose type has no provider are parked and
//! delivered when one appears; bindings a provider rejected stay parked until
//! the type is registered again.

use std::collections::HashMap;
use std::time::Instant;

use serde_json::{Map, Value};
use uuid::Uuid;

use crate::protocol::DEFAULT_NAMESPACE;
use crate::protocol::{ErrorBody, RegisterTrigger};

/// The in-process trigger type served by the configuration worker.
pub(crate) const CONFIGURATION_TRIGGER: &str = "configuration";

/// Who delivers a binding's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerProvider {
    /// The engine itself (`configuration`).
    Engine,
    /// A worker connection (by worker id).
    Worker(Uuid),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingState {
    /// Delivered to its provider (not necessarily acknowledged yet).
    Active(TriggerProvider),
    /// No provider for its type yet.
    Parked,
    /// The provider answered with an error; parked until the type is registered again.
    Rejected(ErrorBody),
}

/// Snapshot of a trigger binding (see [`crate::TestEngine::triggers`]).
#[derive(Debug, Clone)]
pub struct TriggerInfo {
    pub id: String,
    pub trigger_type: String,
    pub function_id: String,
    pub config: Value,
    pub metadata: Option<Value>,
    /// Target function namespace (`None` = `default`).
    pub namespace: Option<String>,
    pub trigger_namespace: Option<String>,
    /// Worker id of the connection that registered the binding.
    pub owner: Uuid,
    pub state: BindingState,
    /// The `registertrigger` frame as received.
    pub frame: Value,
}

/// Snapshot of a worker-provided trigger type.
#[derive(Debug, Clone)]
pub struct TriggerTypeInfo {
    pub namespace: String,
    pub id: String,
    pub provider: Uuid,
    /// The `registertriggertype` frame as received.
    pub frame: Value,
}

/// A `triggerregistrationresult` accepted from a provider.
#[derive(Debug, Clone)]
pub struct TriggerRegistrationResult {
    pub provider: Uuid,
    pub id: String,
    pub trigger_type: String,
    pub function_id: String,
    pub error: Option<ErrorBody>,
    pub at: Instant,
}

#[derive(Debug, Clone)]
pub(crate) struct TriggerTypeEntry {
    pub(crate) seq: u64,
    pub(crate) provider: Uuid,
    pub(crate) frame: Value,
}

#[derive(Debug, Clone)]
pub(crate) struct Binding {
    pub(crate) seq: u64,
    pub(crate) reg: RegisterTrigger,
    pub(crate) owner: Uuid,
    /// Owner's connection namespace: first provider lookup when no `trigger_namespace`.
    pub(crate) owner_namespace: String,
    pub(crate) state: BindingState,
    pub(crate) frame: Value,
}

#[derive(Default)]
pub(crate) struct TriggerRegistry {
    pub(crate) types: HashMap<(String, String), TriggerTypeEntry>,
    pub(crate) bindings: HashMap<String, Binding>,
    pub(crate) results: Vec<TriggerRegistrationResult>,
}

/// A binding of the in-process `configuration` type, ready to be fired.
#[derive(Debug, Clone)]
pub(crate) struct ConfigSubscriber {
    pub function_id: String,
    pub namespace: String,
    pub metadata: Option<Value>,
    pub condition_function_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolved<'a> {
    Engine,
    Worker(&'a (String, String), Uuid),
}

impl TriggerRegistry {
    /// `TriggerRegistry::resolve_provider_key`: `trigger_namespace` is strict;
    /// otherwise the owner's namespace first, then `default`.
    pub(crate) fn resolve(&self, b: &Binding) -> Option<Resolved<'_>> {
        let candidates: Vec<&str> = match b.reg.trigger_namespace.as_deref() {
            Some(tns) => vec![tns],
            None => vec![b.owner_namespace.as_str(), DEFAULT_NAMESPACE],
        };
        for ns in candidates {
            if b.reg.trigger_type == CONFIGURATION_TRIGGER && ns == DEFAULT_NAMESPACE {
                return Some(Resolved::Engine);
            }
            let key = (ns.to_string(), b.reg.trigger_type.clone());
            if let Some((key, t)) = self.types.get_key_value(&key) {
                return Some(Resolved::Worker(key, t.provider));
            }
        }
        None
    }

    pub(crate) fn ids_by_seq(&self, mut keep: impl FnMut(&Binding) -> bool) -> Vec<String> {
        let mut found: Vec<(u64, String)> = self
            .bindings
            .values()
            .filter(|b| keep(b))
            .map(|b| (b.seq, b.reg.id.clone()))
            .collect();
        found.sort();
        found.into_iter().map(|(_, id)| id).collect()
    }

    pub(crate) fn configuration_subscribers(
        &self,
        config_id: &str,
        event_type: &str,
    ) -> Vec<ConfigSubscriber> {
        let mut subs: Vec<(u64, ConfigSubscriber)> = self
            .bindings
            .values()
            .filter(|b| b.state == BindingState::Active(TriggerProvider::Engine))
            .filter(|b| {
                let cfg = &b.reg.config;
                let id_ok = match cfg.get("configuration_id").and_then(Value::as_str) {
                    Some(wanted) => wanted == config_id,
                    None => true,
                };
                let type_ok = match cfg.get("event_types").and_then(Value::as_array) {
                    Some(types) => types.iter().any(|t| t.as_str() == Some(event_type)),
                    None => true,
                };
                id_ok && type_ok
            })
            .map(|b| {
                (
                    b.seq,
                    ConfigSubscriber {
                        function_id: b.reg.function_id.clone(),
                        namespace: b
                            .reg
                            .namespace
                            .clone()
                            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string()),
                        metadata: b.reg.metadata.clone().filter(|m| !m.is_null()),
                        condition_function_id: b
                            .reg
                            .config
                            .get("condition_function_id")
                            .and_then(Value::as_str)
                            .map(String::from),
                    },
                )
            })
            .collect();
        subs.sort_by_key(|(seq, _)| *seq);
        subs.into_iter().map(|(_, s)| s).collect()
    }

    pub(crate) fn clear_types(&mut self) {
        self.types.clear();
    }

    pub(crate) fn infos(&self) -> Vec<TriggerInfo> {
        let mut all: Vec<&Binding> = self.bindings.values().collect();
        all.sort_by_key(|b| b.seq);
        all.into_iter()
            .map(|b| TriggerInfo {
                id: b.reg.id.clone(),
                trigger_type: b.reg.trigger_type.clone(),
                function_id: b.reg.function_id.clone(),
                config: b.reg.config.clone(),
                metadata: b.reg.metadata.clone(),
                namespace: b.reg.namespace.clone(),
                trigger_namespace: b.reg.trigger_namespace.clone(),
                owner: b.owner,
                state: b.state.clone(),
                frame: b.frame.clone(),
            })
            .collect()
    }

    pub(crate) fn type_infos(&self) -> Vec<TriggerTypeInfo> {
        let mut all: Vec<(&(String, String), &TriggerTypeEntry)> = self.types.iter().collect();
        all.sort_by_key(|(_, t)| t.seq);
        all.into_iter()
            .map(|((ns, id), t)| TriggerTypeInfo {
                namespace: ns.clone(),
                id: id.clone(),
                provider: t.provider,
                frame: t.frame.clone(),
            })
            .collect()
    }

    pub(crate) fn results(&self) -> Vec<TriggerRegistrationResult> {
        self.results.clone()
    }
}

/// E→W `registertrigger`: `metadata`, `namespace` and `trigger_namespace` are
/// omitted when absent (namespaces also when `default`) (§5.2).
pub(crate) fn provider_frame(reg: &RegisterTrigger) -> Value {
    let mut frame = Map::new();
    frame.insert("type".into(), "registertrigger".into());
    frame.insert("id".into(), reg.id.clone().into());
    frame.insert("trigger_type".into(), reg.trigger_type.clone().into());
    frame.insert("function_id".into(), reg.function_id.clone().into());
    frame.insert("config".into(), reg.config.clone());
    if let Some(m) = reg.metadata.clone().filter(|m| !m.is_null()) {
        frame.insert("metadata".into(), m);
    }
    for (key, ns) in [
        ("namespace", &reg.namespace),
        ("trigger_namespace", &reg.trigger_namespace),
    ] {
        if let Some(ns) = ns.as_ref().filter(|ns| ns.as_str() != DEFAULT_NAMESPACE) {
            frame.insert(key.into(), ns.clone().into());
        }
    }
    Value::Object(frame)
}

/// `ConfigurationTriggerConfig`: optional `configuration_id` (string),
/// `event_types` (array of strings), `condition_function_id` (string).
pub(crate) fn check_configuration_config(config: &Value) -> Result<(), ErrorBody> {
    let fail = |why: &str| {
        Err(ErrorBody::new(
            "trigger_registration_failed",
            format!("invalid configuration trigger config: {why}"),
        ))
    };
    let Some(obj) = config.as_object() else {
        return fail("expected an object");
    };
    for key in ["configuration_id", "condition_function_id"] {
        if obj.get(key).is_some_and(|v| !v.is_null() && !v.is_string()) {
            return fail(&format!("{key} must be a string"));
        }
    }
    if let Some(types) = obj.get("event_types").filter(|v| !v.is_null()) {
        let ok = types
            .as_array()
            .is_some_and(|a| a.iter().all(Value::is_string));
        if !ok {
            return fail("event_types must be an array of strings");
        }
    }
    Ok(())
}

pub(crate) fn blank(ns: &Option<String>) -> bool {
    ns.as_deref().is_some_and(|s| s.trim().is_empty())
}
