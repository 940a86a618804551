//! The `shell::changed` trigger type: the broker's half of the change feed.
//!
//! The engine offers bindings (`registertrigger`); each is checked and handed to the executor
//! as a [`WatchOp::Start`] keyed by the binding id — the executor applies the path policy and
//! runs the watcher — and answered with `triggerregistrationresult` (an error for a path
//! outside policy, a denied path or a non-directory; a binding offered again is answered
//! again). The executor's [`Event::Changed`] batches are fired, fire-and-forget, to each
//! binding's function with its `metadata` and `namespace`.
//!
//! * A binding already served that is offered again with a config that is refused is torn
//!   down: its watcher is stopped, the refusal says so and a WARN log names it. The engine
//!   holds the refusal, so no watcher it does not know of goes on firing.
//! * `unregistertrigger` stops the watcher. The engine unregisters a binding whose owner
//!   disconnects, so that tears it down too.
//! * Reconnect: the engine replays every live binding when we register the type again; a
//!   replay of a binding we already serve keeps its watcher (one watcher per binding id). A
//!   binding not replayed within [`REPLAY_GRACE`] of a new connection is dropped.
//! * A new executor (respawn): every binding is started on it again and gets an overflow
//!   signal, since changes made while no watcher ran are unknown.
//! * Events the executor or the broker could not deliver (a lagging queue) become an overflow
//!   signal for every binding: never a silent gap.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use iii_shell_policy::sync::lock;
use iii_shell_protocol::messages::{Event, Reply, Request};
use iii_shell_protocol::watch::{Change, WatchOp, WatchReply};
use serde_json::{json, Value};

use crate::engine::frames::ErrorBody;
use crate::engine::{OfferedBinding, TriggerProvider};
use crate::executor_client::ExecutorClient;
use crate::slots::{EngineSlot, ExecutorSlot};

/// The trigger type id.
pub const TRIGGER_TYPE: &str = "shell::changed";
/// The seed's description of the type.
pub const DESCRIPTION: &str = "Fires when anything under the watched directory changes, whoever changed it — bind with config: { path } naming the directory (jail-checked like every coder::* path). Ignored paths (git-ignored; outside a repository data/, config/, .iii/, node_modules/) are skipped unless config also sets include_ignored: true.";
/// How long after a reconnect a binding may take to be replayed before it is dropped.
pub const REPLAY_GRACE: Duration = Duration::from_secs(10);

/// The `registertriggertype` frame. The seed publishes empty invocation/return schemas.
pub fn trigger_type_frame() -> Value {
    json!({
        "type": "registertriggertype",
        "id": TRIGGER_TYPE,
        "description": DESCRIPTION,
        "trigger_request_format": {},
        "call_request_format": {},
    })
}

/// The binding config `{path*: string, include_ignored?: bool = false}`.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingConfig {
    pub path: String,
    pub include_ignored: bool,
}

/// Parses a binding config (a pure function: exact-value tests below).
pub fn parse_config(config: &Value) -> Result<BindingConfig, String> {
    let Some(obj) = config.as_object() else {
        return Err("shell::changed config must be an object {path, include_ignored?}".into());
    };
    let path = match obj.get("path") {
        Some(Value::String(p)) if !p.is_empty() => p.clone(),
        Some(Value::String(_)) => return Err("shell::changed config.path is empty".into()),
        Some(_) => return Err("shell::changed config.path must be a string".into()),
        None => return Err("shell::changed config.path is required".into()),
    };
    let include_ignored = match obj.get("include_ignored") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("shell::changed config.include_ignored must be a boolean".into()),
    };
    Ok(BindingConfig {
        path,
        include_ignored,
    })
}

/// The payload fired for one change: `{path, kind, root, dir}` (plus `overflow: true` on the
/// overflow signal).
pub fn payload(root: &str, c: &Change) -> Value {
    let mut v = json!({"path": c.path, "kind": c.kind.as_str(), "root": root, "dir": c.dir});
    if c.overflow {
        v["overflow"] = json!(true);
    }
    v
}

#[derive(Debug, Clone)]
struct Bound {
    offer: OfferedBinding,
    config: BindingConfig,
    root: String,
    /// Connection epoch of the last delivery.
    epoch: u64,
}

#[derive(Default)]
struct FeedState {
    bound: HashMap<String, Bound>,
    /// Per binding id, the number of the latest offer (a register racing an unregister).
    offers: HashMap<String, u64>,
    next_offer: u64,
}

/// The broker's registry of `shell::changed` bindings. It reaches the executor and the engine
/// through their slots; services tell it of each new executor ([`ChangedFeed::attach`]).
pub struct ChangedFeed {
    state: Mutex<FeedState>,
    executor: Arc<ExecutorSlot>,
    engine: Arc<EngineSlot>,
}

fn refused(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new("trigger_registration_failed", message)
}

impl ChangedFeed {
    /// A feed with no bindings, watching through `executor`, firing through `engine`.
    pub fn new(executor: Arc<ExecutorSlot>, engine: Arc<EngineSlot>) -> Arc<ChangedFeed> {
        Arc::new(ChangedFeed {
            state: Mutex::default(),
            executor,
            engine,
        })
    }

    /// Binding ids served now.
    pub fn binding_ids(&self) -> Vec<String> {
        let mut v: Vec<String> = lock(&self.state).bound.keys().cloned().collect();
        v.sort();
        v
    }

    async fn register(feed: &ChangedFeed, offer: OfferedBinding) -> Result<(), ErrorBody> {
        let number = {
            let mut st = lock(&feed.state);
            st.next_offer += 1;
            let n = st.next_offer;
            st.offers.insert(offer.id.clone(), n);
            n
        };
        let epoch = feed.engine.get().map(|l| l.connection_epoch()).unwrap_or(0);
        let (config, root) = match Self::start_watcher(feed, &offer).await {
            Ok(started) => started,
            Err(e) => return Err(feed.refuse(&offer.id, number, e).await),
        };
        let stale = {
            let mut st = lock(&feed.state);
            if st.offers.get(&offer.id) == Some(&number) {
                let id = offer.id.clone();
                st.bound.insert(
                    id,
                    Bound {
                        offer,
                        config,
                        root,
                        epoch,
                    },
                );
                None
            } else if !st.offers.contains_key(&offer.id) {
                Some(offer.id.clone())
            } else {
                None
            }
        };
        // Unregistered while the executor was starting it.
        if let Some(id) = stale {
            let _ = feed
                .executor
                .call(Request::Watch(WatchOp::Stop { binding_id: id }))
                .await;
        }
        Ok(())
    }

    /// Checks an offer's config and has the executor start (or keep) its watcher: the config
    /// and the watched root.
    async fn start_watcher(
        feed: &ChangedFeed,
        offer: &OfferedBinding,
    ) -> Result<(BindingConfig, String), ErrorBody> {
        let config = parse_config(&offer.config).map_err(refused)?;
        let reply = feed
            .executor
            .call(Request::Watch(WatchOp::Start {
                binding_id: offer.id.clone(),
                path: config.path.clone(),
                include_ignored: config.include_ignored,
            }))
            .await
            .map_err(|e| refused(format!("{} {}", e.code, e.message)))?;
        let Reply::Watch(WatchReply::Started { root, .. }) = reply else {
            return Err(refused("unexpected reply from the executor"));
        };
        Ok((config, root))
    }

    /// A refused offer (`number`) of binding `id`. When it is still the latest offer of a
    /// binding already served, that binding is torn down: the engine now holds the refusal,
    /// so the earlier watcher must not go on firing (no watcher at all, rather than one the
    /// engine does not know of). The refusal says so.
    async fn refuse(&self, id: &str, number: u64, e: ErrorBody) -> ErrorBody {
        let was_bound = {
            let mut st = lock(&self.state);
            if st.offers.get(id) != Some(&number) {
                return e;
            }
            st.offers.remove(id);
            st.bound.remove(id).is_some()
        };
        if !was_bound {
            return e;
        }
        let _ = self
            .executor
            .call(Request::Watch(WatchOp::Stop {
                binding_id: id.to_string(),
            }))
            .await;
        tracing::warn!(binding = %id, reason = %e.message, "shell::changed binding offered again with a config that was refused; its earlier watcher was stopped, so the binding fires no more until it is offered with a config that is accepted");
        ErrorBody::new(
            e.code,
            format!(
                "{}; the earlier binding {id} was stopped and fires no more",
                e.message
            ),
        )
    }

    fn unregister(&self, id: &str) {
        let existed = {
            let mut st = lock(&self.state);
            st.offers.remove(id);
            st.bound.remove(id).is_some()
        };
        let executor = self.executor.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let _ = executor
                .call(Request::Watch(WatchOp::Stop {
                    binding_id: id.clone(),
                }))
                .await;
            if existed {
                tracing::info!(binding = %id, "shell::changed binding removed");
            }
        });
    }

    /// After a reconnect: drop the bindings the engine did not replay within the grace.
    fn sweep_after(self: &Arc<Self>, epoch: u64) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(REPLAY_GRACE).await;
            let Some(feed) = weak.upgrade() else {
                return;
            };
            let gone: Vec<String> = lock(&feed.state)
                .bound
                .values()
                .filter(|b| b.epoch < epoch)
                .map(|b| b.offer.id.clone())
                .collect();
            for id in gone {
                tracing::info!(binding = %id, "shell::changed binding not replayed after a reconnect; stopping its watcher");
                feed.unregister(&id);
            }
        });
    }

    fn fire_all_overflow(&self) {
        let Ok(link) = self.engine.get() else { return };
        let bound: Vec<Bound> = lock(&self.state).bound.values().cloned().collect();
        for b in bound {
            let c = Change {
                path: ".".into(),
                kind: iii_shell_protocol::watch::ChangeKind::Modified,
                dir: true,
                overflow: true,
            };
            link.fire(
                &b.offer.function_id,
                payload(&b.root, &c),
                b.offer.metadata.as_ref(),
                b.offer.namespace.as_deref(),
            );
        }
    }

    fn deliver(&self, binding_id: &str, changes: &[Change]) {
        let Ok(link) = self.engine.get() else { return };
        let Some(b) = lock(&self.state).bound.get(binding_id).cloned() else {
            return;
        };
        for c in changes {
            link.fire(
                &b.offer.function_id,
                payload(&b.root, c),
                b.offer.metadata.as_ref(),
                b.offer.namespace.as_deref(),
            );
        }
    }

    /// A new executor connection: pump its events, then start every binding on it again.
    pub fn attach(self: &Arc<Self>, client: &ExecutorClient) {
        let mut rx = client.events();
        let weak: Weak<ChangedFeed> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let ev = rx.recv().await;
                let Some(feed) = weak.upgrade() else {
                    return;
                };
                match ev {
                    Ok(Event::Changed {
                        binding_id,
                        changes,
                    }) => feed.deliver(&binding_id, &changes),
                    Ok(Event::EventsLost { .. }) => feed.fire_all_overflow(),
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::error!(lost = n, "executor events fell behind in the broker; change-feed subscribers get an overflow signal");
                        feed.fire_all_overflow();
                    }
                    Err(_) => return,
                }
            }
        });
        let bound: Vec<Bound> = lock(&self.state).bound.values().cloned().collect();
        if bound.is_empty() {
            return;
        }
        let client = client.clone();
        let feed = self.clone();
        tokio::spawn(async move {
            for b in &bound {
                let r = client
                    .call(Request::Watch(WatchOp::Start {
                        binding_id: b.offer.id.clone(),
                        path: b.config.path.clone(),
                        include_ignored: b.config.include_ignored,
                    }))
                    .await;
                if let Err(e) = r {
                    tracing::error!(binding = %b.offer.id, "the new executor refused a shell::changed watcher ({}); the binding gets no more events until it is bound again", e.message);
                }
            }
            feed.fire_all_overflow();
        });
    }
}

/// The link's view of the feed.
pub struct Provider(pub Arc<ChangedFeed>);

impl TriggerProvider for Provider {
    fn provides(&self, trigger_type: &str) -> bool {
        trigger_type == TRIGGER_TYPE
    }

    fn register(
        &self,
        binding: OfferedBinding,
    ) -> Pin<Box<dyn Future<Output = Result<(), ErrorBody>> + Send>> {
        let feed = self.0.clone();
        Box::pin(async move { ChangedFeed::register(&feed, binding).await })
    }

    fn unregister(&self, id: &str) {
        self.0.unregister(id);
    }

    fn connected(&self, epoch: u64) {
        if epoch > 1 {
            self.0.sweep_after(epoch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iii_shell_protocol::watch::ChangeKind;

    #[test]
    fn binding_configs_parse_exactly() {
        assert_eq!(
            parse_config(&json!({"path": "/w"})),
            Ok(BindingConfig {
                path: "/w".into(),
                include_ignored: false
            })
        );
        assert_eq!(
            parse_config(&json!({"path": "/w", "include_ignored": true})),
            Ok(BindingConfig {
                path: "/w".into(),
                include_ignored: true
            })
        );
        assert_eq!(
            parse_config(&json!({})),
            Err("shell::changed config.path is required".into())
        );
        assert_eq!(
            parse_config(&json!({"path": 3})),
            Err("shell::changed config.path must be a string".into())
        );
        assert_eq!(
            parse_config(&json!({"path": "/w", "include_ignored": "yes"})),
            Err("shell::changed config.include_ignored must be a boolean".into())
        );
        assert!(parse_config(&Value::Null).is_err());
    }

    #[test]
    fn the_payload_is_path_kind_root_dir() {
        let c = Change {
            path: "src/a.rs".into(),
            kind: ChangeKind::Created,
            dir: false,
            overflow: false,
        };
        assert_eq!(
            payload("/w", &c),
            json!({"path": "src/a.rs", "kind": "created", "root": "/w", "dir": false})
        );
        let o = Change {
            path: ".".into(),
            kind: ChangeKind::Modified,
            dir: true,
            overflow: true,
        };
        assert_eq!(
            payload("/w", &o),
            json!({"path": ".", "kind": "modified", "root": "/w", "dir": true, "overflow": true})
        );
    }
}
