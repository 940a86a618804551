//! How the engine state binds triggers to providers: registering and unregistering bindings
//! and trigger types, a provider's `triggerregistrationresult`, and re-parking the bindings of
//! a connection that is gone (§5, §6.2). The registry's records are in [`crate::triggers`].

use std::time::Instant;

use serde_json::Value;
use uuid::Uuid;

use crate::protocol::{self, ErrorBody, RegisterTrigger, DEFAULT_NAMESPACE};
use crate::state::State;
use crate::triggers::*;

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
