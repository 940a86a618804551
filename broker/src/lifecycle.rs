//! The configuration lifecycle: boot (fail-closed) and hot reload.
//!
//! Boot: `configuration::get` the worker's entry (`shell`, or its own id on a many-host
//! engine; see [`crate::worker_identity`]). Nothing stored → `configuration::register`
//! with the schema and the seed as `initial_value`, then read it back. Something stored →
//! register the schema without `initial_value`, so the stored value wins. No `shell::*`
//! function is registered until a valid configuration has been confirmed from the store and
//! accepted by the executor; a nulled or invalid stored value exposes nothing and is retried.
//!
//! Reload: every change event re-fetches the value, builds a new runtime, has the executor
//! accept it, and swaps it in atomically. A bad value keeps the last-good runtime and is
//! reported through `shell::config-status`.

use std::sync::Arc;
use std::time::Duration;

use iii_shell_policy::sync::lock;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::messages::Request;
use iii_shell_protocol::WireError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::engine::frames::{self, ErrorBody};
use crate::engine::EngineLink;
use crate::functions::{catalogue, meta, FunctionDef};
use crate::schema::schema_for;
use crate::services::Services;

pub use crate::worker_identity::DEFAULT_CONFIG_ID as CONFIG_ID;
pub const ON_CHANGE_ID: &str = "shell::on-config-change";

/// Event delivered to the internal `shell::on-config-change` handler. A struct (not `Value`) keeps the request schema concrete; the handler re-fetches the configuration id; unknown fields are ignored.
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "OnConfigChangeEvent")]
pub struct OnConfigChangeEvent {
    /// Configuration id that changed (advisory; the handler re-fetches the value). Schema-only: kept to publish a typed request schema; the handler ignores it.
    #[serde(default)]
    pub id: Option<String>,
}

/// Ack returned by the internal `shell::on-config-change` handler.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "OnConfigChangeResponse")]
pub struct OnConfigChangeResponse {
    pub ok: bool,
}

/// Every function this worker publishes to the engine: the [`catalogue`] plus the internal
/// `shell::on-config-change` handler, in registration order.
pub fn all_function_defs() -> Vec<FunctionDef> {
    let mut v = catalogue();
    v.push(FunctionDef {
        id: ON_CHANGE_ID,
        description: "Internal: reload the security policy + fs backend on configuration change.",
        metadata: meta(true, false, false),
        request_format: schema_for::<OnConfigChangeEvent>(),
        response_format: schema_for::<OnConfigChangeResponse>(),
    });
    v
}

pub struct Lifecycle {
    pub link: EngineLink,
    pub services: Arc<Services>,
    pub seed: Config,
    /// The configuration id this worker reads and registers.
    config_id: String,
    reload_lock: tokio::sync::Mutex<()>,
    trigger_id: String,
    /// `configuration:updated` events our own schema re-registration will fire: they deliver
    /// the stored value again and are no new reload attempt.
    /// Each is expected until its deadline, so one that never arrives (no binding yet) does
    /// not swallow a later operator's event.
    own_echoes: std::sync::Mutex<Vec<std::time::Instant>>,
}

/// How long an echo of our own re-registration is expected.
const ECHO_WINDOW: Duration = Duration::from_secs(10);

/// Why a reload is attempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// A `configuration` event delivered to `shell::on-config-change`.
    Event,
    /// Our own re-fetch after a reconnect.
    Resync,
}

/// What the store holds for `shell`.
enum Stored {
    Missing,
    Valid(Box<Config>),
    Invalid(String),
    Unavailable(String),
}

impl Lifecycle {
    pub fn new(
        link: EngineLink,
        services: Arc<Services>,
        seed: Config,
        config_id: String,
    ) -> Arc<Lifecycle> {
        services.snapshots.set_config_id(&config_id);
        Arc::new(Lifecycle {
            link,
            services,
            seed,
            config_id,
            reload_lock: tokio::sync::Mutex::new(()),
            trigger_id: uuid::Uuid::new_v4().to_string(),
            own_echoes: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The configuration id in use.
    pub fn config_id(&self) -> &str {
        &self.config_id
    }

    /// The JSON schema registered with the configuration worker.
    pub fn config_schema() -> Value {
        schema_for::<Config>()
    }

    async fn register_schema(&self, initial_value: Option<&Config>) -> Result<(), ErrorBody> {
        let mut data = json!({
            "id": self.config_id,
            "name": "Shell",
            "description": "iii-shell: command, job and filesystem policy (jail roots, denylists, caps, timeouts).",
            "schema": Self::config_schema(),
        });
        if let Some(v) = initial_value {
            data["initial_value"] = serde_json::to_value(v).unwrap_or(Value::Null);
        }
        self.link
            .call("configuration::register", data)
            .await
            .map(|_| ())
    }

    async fn fetch(&self) -> Stored {
        let id = &self.config_id;
        match self.link.call("configuration::get", json!({"id": id})).await {
            Ok(v) => match v.get("value") {
                None | Some(Value::Null) => Stored::Invalid(format!(
                    "the stored configuration '{id}' is null: refusing to fall back to a default; write a value with configuration::set"
                )),
                Some(value) => match Config::from_value(value) {
                    Ok(c) => Stored::Valid(Box::new(c)),
                    Err(e) => Stored::Invalid(format!("the stored configuration '{id}' is invalid: {e}")),
                },
            },
            Err(e) if e.code == "NOT_FOUND" => Stored::Missing,
            Err(e) if e.code == "SCHEMA_INVALID" || e.code == "EXPAND_FAILED" => {
                // Our own parser gives the migration hint the schema check cannot.
                let raw = self.link.call("configuration::get", json!({"id": id, "raw": true})).await;
                let detail = match raw.ok().and_then(|v| v.get("value").cloned()) {
                    Some(value) => match Config::from_value(&value) {
                        Err(hint) => hint.0,
                        Ok(_) => e.message.clone(),
                    },
                    None => e.message.clone(),
                };
                Stored::Invalid(format!("the stored configuration '{id}' is invalid ({}): {detail}", e.code))
            }
            Err(e) => Stored::Unavailable(format!("configuration::get failed ({}): {}", e.code, e.message)),
        }
    }

    /// Boots fail-closed: returns once a valid configuration is in force and every function
    /// is registered.
    pub async fn boot(self: &Arc<Self>, retry: Duration) {
        let mut last_logged = String::new();
        let mut schema_registered = false;
        loop {
            let problem = match self.fetch().await {
                Stored::Missing => {
                    tracing::info!(config_id = %self.config_id, "no stored configuration '{}': registering the seed as its initial value", self.config_id);
                    match self.register_schema(Some(&self.seed)).await {
                        Ok(()) => {
                            schema_registered = true;
                            continue;
                        }
                        Err(e) => {
                            format!("configuration::register failed ({}): {}", e.code, e.message)
                        }
                    }
                }
                Stored::Valid(config) => {
                    let config = *config;
                    if !schema_registered {
                        if let Err(e) = self.register_schema(None).await {
                            tracing::warn!(code = %e.code, "configuration::register (schema only) failed: {}", e.message);
                        }
                    }
                    match self.apply(config).await {
                        Ok(()) => break,
                        Err(e) => format!(
                            "the executor refused the stored configuration: {}",
                            e.message
                        ),
                    }
                }
                Stored::Invalid(why) => {
                    if !schema_registered && self.register_schema(None).await.is_ok() {
                        schema_registered = true;
                    }
                    why
                }
                Stored::Unavailable(why) => why,
            };
            if problem != last_logged {
                tracing::error!("boot is fail-closed, no function is exposed: {problem}; retrying every {retry:?}. Fix the stored configuration entry through the configuration worker, or delete it to re-seed");
                last_logged = problem;
            }
            tokio::time::sleep(retry).await;
        }
        self.register_functions();
        tracing::info!(
            functions = self.link.registered_functions().len(),
            "configuration confirmed; functions registered"
        );
    }

    fn register_functions(&self) {
        for f in all_function_defs() {
            let frame = frames::register_function(
                f.id,
                f.description,
                &f.request_format,
                &f.response_format,
                &f.metadata,
            );
            self.link.register_function(f.id, frame);
        }
        self.link.register_trigger_type(
            crate::changed::TRIGGER_TYPE,
            crate::changed::trigger_type_frame(),
        );
        // The harness hooks and turn events (hyphenated type ids). Without a harness they
        // stay parked and nothing fires.
        for (i, (ty, function, config)) in crate::functions::turns::hook_bindings()
            .into_iter()
            .enumerate()
        {
            let id = format!("{}-turns-{i}", self.trigger_id);
            let mut frame = frames::register_trigger(&id, ty, function, config);
            if let Some(ns) = &self.link.options().namespace {
                frame["namespace"] = json!(ns);
            }
            self.link.register_trigger(&id, frame);
        }
        // The console page's assets, after the rest of the surface (the console fetches
        // them through shell::ui-content as soon as a binding reaches it).
        for asset in crate::console_ui::ASSETS {
            let id = crate::console_ui::binding_id(&self.trigger_id, asset);
            let frame = crate::console_ui::binding_frame(
                &id,
                asset,
                self.link.options().namespace.as_deref(),
            );
            self.link.register_trigger(&id, frame);
        }
        let mut trigger = frames::register_trigger(
            &self.trigger_id,
            "configuration",
            ON_CHANGE_ID,
            json!({"configuration_id": self.config_id}),
        );
        // `namespace` names where the target function lives (absent = `default`): without it a
        // namespaced worker's change events would be routed to `default` and never reach us.
        if let Some(ns) = &self.link.options().namespace {
            trigger["namespace"] = json!(ns);
        }
        self.link.register_trigger(&self.trigger_id, trigger);
    }

    /// Resolves `config`'s relative paths, has the executor accept it, then swaps it in.
    async fn apply(&self, config: Config) -> Result<(), WireError> {
        let config = crate::worker_identity::resolve(&config)
            .map_err(|e| WireError::new(iii_shell_protocol::Code::S210, e))?;
        let generation = self.services.snapshots.next_generation();
        let previous = self.services.snapshots.get();
        let config_json = serde_json::to_string(&config).unwrap_or_default();
        let reply = self
            .services
            .executor
            .call(Request::SetPolicy {
                generation,
                config_json,
            })
            .await?;
        if let Some(prev) = &previous {
            let widened = iii_shell_policy::widening::widening(&prev.config, &config);
            if !widened.is_empty() {
                tracing::warn!(
                    "privilege change applied by a configuration reload: {}",
                    iii_shell_policy::widening::describe(&widened)
                );
            }
        }
        self.services.snapshots.install_as(generation, config);
        self.services.snapshots.accepted(&reply);
        Ok(())
    }

    /// The handler of `shell::on-config-change`: re-fetch, rebuild, swap, or keep last-good.
    pub async fn on_change(&self) -> Value {
        self.reload(Cause::Event).await
    }

    async fn reload(&self, cause: Cause) -> Value {
        let _guard = self.reload_lock.lock().await;
        let ours = match cause {
            Cause::Resync => true,
            Cause::Event => self.take_own_echo(),
        };
        let outcome = match self.fetch().await {
            Stored::Valid(config) => self
                .apply(*config)
                .await
                .map_err(|e| format!("the executor refused it: {}", e.message)),
            Stored::Missing => Err(format!(
                "the configuration '{}' was deleted from the store",
                self.config_id
            )),
            Stored::Invalid(why) | Stored::Unavailable(why) => Err(why),
        };
        match outcome {
            Ok(()) => {
                tracing::info!(
                    generation = self.services.snapshots.get().map(|r| r.generation),
                    "configuration reloaded"
                );
                json!({"ok": true})
            }
            Err(why) => {
                // The same stored value delivered again by our own doing (the
                // `configuration:updated` our re-register fires after a reconnect, the resync
                // re-fetch) was already rejected and reported: no second ERROR, no second
                // count. Anything else is a new attempt and counts, even the same bad value
                // sent twice.
                let status = self.services.snapshots.status();
                let unchanged = status.last_outcome == crate::snapshot::ReloadOutcome::Rejected
                    && status.last_error.as_deref() == Some(why.as_str());
                if unchanged && ours {
                    tracing::debug!("the stored configuration is unchanged since it was rejected; the last-good configuration stays in force");
                    return json!({"ok": false});
                }
                tracing::error!("configuration reload rejected; the last-good configuration stays in force: {why}. Fix the stored entry (shell::config-status shows last_error)");
                self.services.snapshots.reject(why);
                json!({"ok": false})
            }
        }
    }

    /// After a reconnect: re-register the schema (the engine may have forgotten it) and pick
    /// up changes made while we were away.
    pub async fn resync(&self) {
        let stored = self.fetch().await;
        // The registration fires one `configuration` event at our own binding, which may
        // arrive before the registration's own result: expect it first.
        self.expect_own_echo();
        let registered = match stored {
            Stored::Missing => self.register_schema(Some(&self.seed)).await,
            _ => self.register_schema(None).await,
        };
        if registered.is_err() {
            self.take_own_echo();
        }
        let _ = self.on_change_if_differs().await;
    }

    fn expect_own_echo(&self) {
        let mut e = lock(&self.own_echoes);
        e.push(std::time::Instant::now() + ECHO_WINDOW);
    }

    /// Consumes one expected echo of our own re-registration, if one is pending.
    fn take_own_echo(&self) -> bool {
        let mut e = lock(&self.own_echoes);
        let now = std::time::Instant::now();
        e.retain(|deadline| *deadline > now);
        if e.is_empty() {
            return false;
        }
        e.remove(0);
        true
    }

    async fn on_change_if_differs(&self) -> Option<()> {
        let current = self.services.snapshots.get()?;
        if let Stored::Valid(c) = self.fetch().await {
            if crate::worker_identity::resolve(&c).ok().as_ref() == Some(&current.config) {
                return Some(());
            }
        }
        self.reload(Cause::Resync).await;
        Some(())
    }
}
