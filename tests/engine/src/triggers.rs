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

use crate::protocol::{self, ErrorBody, RegisterTrigger};
use crate::state::{State, DEFAULT_NAMESPACE};

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
    seq: u64,
    provider: Uuid,
    frame: Value,
}

#[derive(Debug, Clone)]
pub(crate) struct Binding {
    seq: u64,
    reg: RegisterTrigger,
    owner: Uuid,
    /// Owner's connection namespace: first provider lookup when no `trigger_namespace`.
    owner_namespace: String,
    state: BindingState,
    frame: Value,
}

#[derive(Default)]
pub(crate) struct TriggerRegistry {
    types: HashMap<(String, String), TriggerTypeEntry>,
    bindings: HashMap<String, Binding>,
    results: Vec<TriggerRegistrationResult>,
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
enum Resolved<'a> {
    Engine,
    Worker(&'a (String, String), Uuid),
}

impl TriggerRegistry {
    /// `TriggerRegistry::resolve_provider_key`: `trigger_namespace` is strict;
    /// otherwise the owner's namespace first, then `default`.
    fn resolve(&self, b: &Binding) -> Option<Resolved<'_>> {
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

    fn ids_by_seq(&self, mut keep: impl FnMut(&Binding) -> bool) -> Vec<String> {
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
fn provider_frame(reg: &RegisterTrigger) -> Value {
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
fn check_configuration_config(config: &Value) -> Result<(), ErrorBody> {
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

fn blank(ns: &Option<String>) -> bool {
    ns.as_deref().is_some_and(|s| s.trim().is_empty())
}

impl State {
    /// (Re)delivers a binding to the provider it resolves to now. With
    /// `redeliver`, a binding already active on that provider is sent again.
    fn activate_binding(&mut self, id: &str, redeliver: bool) {
        let Some(b) = self.triggers.bindings.get(id) else {
            return;
        };
        let resolved = self.triggers.resolve(b).map(|r| match r {
            Resolved::Engine => TriggerProvider::Engine,
            Resolved::Worker(_, p) => TriggerProvider::Worker(p),
        });
        let previous = b.state.clone();
        let reg = b.reg.clone();
        let owner = b.owner;
        if let BindingState::Active(TriggerProvider::Worker(p)) = previous {
            if resolved != Some(TriggerProvider::Worker(p)) {
                self.send(p, protocol::unregister_trigger(&reg.id, &reg.trigger_type));
            }
        }
        let state = match resolved {
            None => BindingState::Parked,
            Some(TriggerProvider::Engine) => match check_configuration_config(&reg.config) {
                Ok(()) => BindingState::Active(TriggerProvider::Engine),
                Err(error) => {
                    let frame = protocol::trigger_registration_result(
                        &reg.id,
                        &reg.trigger_type,
                        &reg.function_id,
                        Some(&error),
                    );
                    self.send(owner, frame);
                    BindingState::Rejected(error)
                }
            },
            Some(TriggerProvider::Worker(q)) => {
                let now = BindingState::Active(TriggerProvider::Worker(q));
                if redeliver || previous != now {
                    self.send(q, provider_frame(&reg));
                }
                now
            }
        };
        if let Some(b) = self.triggers.bindings.get_mut(id) {
            b.state = state;
        }
    }

    /// W→E `registertrigger` (§5.5), applied in the owner's namespace.
    pub(crate) fn register_trigger(
        &mut self,
        owner: Uuid,
        owner_ns: &str,
        reg: RegisterTrigger,
        frame: Value,
    ) {
        if blank(&reg.namespace) || blank(&reg.trigger_namespace) {
            let error = ErrorBody::new("INVALID_NAMESPACE", "namespace must not be blank");
            let result = protocol::trigger_registration_result(
                &reg.id,
                &reg.trigger_type,
                &reg.function_id,
                Some(&error),
            );
            self.send(owner, result);
            return;
        }
        let seq = self.next_seq();
        let previous = self
            .triggers
            .bindings
            .get(&reg.id)
            .map(|b| b.state.clone())
            .unwrap_or(BindingState::Parked);
        let id = reg.id.clone();
        self.triggers.bindings.insert(
            id.clone(),
            Binding {
                seq,
                reg,
                owner,
                owner_namespace: owner_ns.to_string(),
                state: previous,
                frame,
            },
        );
        self.activate_binding(&id, true);
    }

    /// `unregistertrigger` from a worker: the provider is told (§5.3).
    pub(crate) fn unregister_trigger(&mut self, id: &str) {
        if let Some(b) = self.triggers.bindings.remove(id) {
            if let BindingState::Active(TriggerProvider::Worker(p)) = b.state {
                self.send(p, protocol::unregister_trigger(id, &b.reg.trigger_type));
            }
        }
    }

    /// `registertriggertype` (§5.1): replaces the provider of the key and
    /// re-delivers every binding that resolves to it (live, parked or rejected).
    pub(crate) fn register_trigger_type(
        &mut self,
        provider: Uuid,
        conn_ns: &str,
        frame_ns: Option<String>,
        id: &str,
        frame: Value,
    ) {
        let namespace = match frame_ns {
            Some(ns) if ns.trim().is_empty() => {
                tracing::error!(id, "registertriggertype with blank namespace dropped");
                return;
            }
            Some(ns) => ns,
            None => conn_ns.to_string(),
        };
        if id == CONFIGURATION_TRIGGER && namespace == DEFAULT_NAMESPACE {
            tracing::warn!("registertriggertype for the builtin 'configuration' type ignored");
            return;
        }
        let seq = self.next_seq();
        let key = (namespace, id.to_string());
        self.triggers.types.insert(
            key.clone(),
            TriggerTypeEntry {
                seq,
                provider,
                frame,
            },
        );
        let triggers = &self.triggers;
        let ids = triggers.ids_by_seq(
            |b| matches!(triggers.resolve(b), Some(Resolved::Worker(k, _)) if *k == key),
        );
        for id in ids {
            self.activate_binding(&id, true);
        }
    }

    /// `triggerregistrationresult`: accepted only from the binding's provider;
    /// an error parks the binding and is forwarded to its owner (§5.2).
    pub(crate) fn handle_trigger_registration_result(
        &mut self,
        from: Uuid,
        id: &str,
        trigger_type: &str,
        function_id: &str,
        error: Option<ErrorBody>,
    ) {
        let Some(b) = self.triggers.bindings.get_mut(id) else {
            return;
        };
        if b.state != BindingState::Active(TriggerProvider::Worker(from)) {
            return;
        }
        let owner = b.owner;
        if let Some(err) = &error {
            b.state = BindingState::Rejected(err.clone());
        }
        self.triggers.results.push(TriggerRegistrationResult {
            provider: from,
            id: id.to_string(),
            trigger_type: trigger_type.to_string(),
            function_id: function_id.to_string(),
            error: error.clone(),
            at: Instant::now(),
        });
        if let Some(err) = &error {
            let frame =
                protocol::trigger_registration_result(id, trigger_type, function_id, Some(err));
            self.send(owner, frame);
        }
    }

    /// Trigger part of connection teardown (§1.7): drop the connection's own
    /// bindings (telling live providers), remove its trigger types and move
    /// their bindings to a fallback provider or park them.
    pub(crate) fn remove_trigger_owner(&mut self, conn: Uuid) {
        for id in self.triggers.ids_by_seq(|b| b.owner == conn) {
            self.unregister_trigger(&id);
        }
        self.triggers.types.retain(|_, t| t.provider != conn);
        let orphaned = self
            .triggers
            .ids_by_seq(|b| b.state == BindingState::Active(TriggerProvider::Worker(conn)));
        for id in orphaned {
            self.activate_binding(&id, false);
        }
    }
}
