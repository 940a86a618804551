//! The live configuration snapshot and the reload status.
//!
//! A call takes one [`ConfigSnapshot`] at its start and keeps it to the end, so a reload never
//! changes the rules in the middle of a call.

use std::sync::{Arc, Mutex, RwLock};

use iii_shell_policy::denylist::Denylist;
use iii_shell_policy::sync::lock;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::{Code, WireError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug)]
pub struct ConfigSnapshot {
    pub generation: u64,
    pub config: Config,
    /// `config.denylist_patterns` compiled once per snapshot (about a millisecond), or why
    /// they do not compile (every command is then refused with S216).
    pub denylist: Result<Arc<Denylist>, String>,
}

impl ConfigSnapshot {
    pub fn new(generation: u64, config: Config) -> ConfigSnapshot {
        let denylist = Denylist::compile(&config.denylist_patterns).map(Arc::new);
        ConfigSnapshot {
            generation,
            config,
            denylist,
        }
    }

    /// The compiled denylist, or S216 naming the pattern that does not compile.
    pub fn denylist(&self) -> Result<&Denylist, WireError> {
        self.denylist
            .as_deref()
            .map_err(|e| WireError::new(Code::S216, e.clone()))
    }

    /// The document sent to the executor.
    pub fn config_json(&self) -> String {
        serde_json::to_string(&self.config).unwrap_or_else(|_| "null".into())
    }
}

/// Outcome of the most recent hot-reload attempt, exposed via `shell::config-status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReloadOutcome {
    /// The live runtime reflects the most recent configuration the worker loaded.
    Applied,
    /// The most recent configuration:updated delivered a value the worker could NOT build; the previous valid policy is still active and the central store has DIVERGED from what shell is enforcing.
    Rejected,
}

/// Operator-visible hot-reload status. `rejected_reloads > 0` (or `last_outcome == Rejected`) means a stored config was refused and shell is enforcing an older policy than the central store — actionable divergence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ReloadStatus")]
pub struct ReloadStatus {
    // Outcome of the most recent hot-reload attempt. (A plain comment: the published schema is
    // a bare `$ref` to `ReloadOutcome`, which carries the description.)
    pub last_outcome: ReloadOutcome,
    /// Build error from the most recent rejected reload (why it was refused).
    pub last_error: Option<String>,
    /// Cumulative count of rejected reloads since boot (never reset).
    pub rejected_reloads: u64,
    /// The configuration id this worker reads: `shell` alone, `shell-<namespace>` with `III_NAMESPACE`, or the `--config-id` given.
    /// Sent in every reply but left out of the published schema, which stays the seed's
    /// (the seed's schema allows additional properties, so the reply still validates).
    #[serde(default)]
    #[schemars(skip)]
    pub config_id: String,
    /// What holds under the policy in force that commands will meet, each with its fix: a
    /// root or `working_dir` the command user cannot enter, a `HOME` commands cannot use,
    /// capabilities that reach other terminals. Set by the executor when it accepts a
    /// policy. Left out of the published schema like `config_id` (the seed's allows it), and
    /// left out of the reply when there is none, so a worker with nothing to say answers the
    /// seed's shape exactly.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(skip)]
    pub warnings: Vec<String>,
}

#[derive(Debug)]
pub struct SnapshotCell {
    current: RwLock<Option<Arc<ConfigSnapshot>>>,
    status: Mutex<ReloadStatus>,
}

impl Default for SnapshotCell {
    fn default() -> Self {
        SnapshotCell {
            current: RwLock::new(None),
            status: Mutex::new(ReloadStatus {
                last_outcome: ReloadOutcome::Applied,
                last_error: None,
                rejected_reloads: 0,
                config_id: crate::worker_identity::DEFAULT_CONFIG_ID.to_string(),
                warnings: Vec::new(),
            }),
        }
    }
}

impl SnapshotCell {
    pub fn get(&self) -> Option<Arc<ConfigSnapshot>> {
        self.current.read().ok().and_then(|g| g.clone())
    }

    /// The generation the next installed snapshot will get.
    pub fn next_generation(&self) -> u64 {
        self.get().map(|r| r.generation + 1).unwrap_or(1)
    }

    /// Installs a new snapshot and records the outcome `applied`.
    pub fn install(&self, config: Config) -> Arc<ConfigSnapshot> {
        let generation = self.next_generation();
        self.install_as(generation, config)
    }

    /// Installs a snapshot under a generation already announced to the executor.
    pub fn install_as(&self, generation: u64, config: Config) -> Arc<ConfigSnapshot> {
        // The telemetry switch and cadence follow the configuration in force.
        crate::telemetry::apply(&config.telemetry);
        let mut g = self.current.write().unwrap_or_else(|p| p.into_inner());
        let rt = Arc::new(ConfigSnapshot::new(generation, config));
        *g = Some(rt.clone());
        drop(g);
        let mut s = lock(&self.status);
        // A later reload that applies clears the error: `last_error` describes the last
        // outcome, so it must not keep reporting a divergence that has ended.
        s.last_outcome = ReloadOutcome::Applied;
        s.last_error = None;
        rt
    }

    /// Records the configuration id reported by `shell::config-status`.
    pub fn set_config_id(&self, id: &str) {
        let mut s = lock(&self.status);
        s.config_id = id.to_string();
    }

    /// Records what the executor warned about when it accepted the policy in force (the
    /// reply to `SetPolicy`; any other reply leaves them as they are).
    pub fn accepted(&self, reply: &iii_shell_protocol::messages::Reply) {
        if let iii_shell_protocol::messages::Reply::PolicyAccepted { warnings, .. } = reply {
            lock(&self.status).warnings = warnings.clone();
        }
    }

    /// Records a rejected reload; the current snapshot stays.
    pub fn reject(&self, error: String) {
        let mut s = lock(&self.status);
        s.last_outcome = ReloadOutcome::Rejected;
        s.last_error = Some(error);
        s.rejected_reloads += 1;
    }

    pub fn status(&self) -> ReloadStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
