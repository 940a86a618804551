//! `Harness`: a real executor process behind the real broker library, called in-process
//! (no engine).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use iii_shell::spawn_executor::spawn_executor_with;
use iii_shell_broker::call_deadline::CallBounds;
use iii_shell_broker::executor_client::ExecutorClient;
use iii_shell_broker::functions::{dispatch, CallMeta};
use iii_shell_broker::services::Services;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::WireError;
use serde_json::Value;

use super::{s, tempdir};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_iii-shell");

pub fn bin() -> &'static Path {
    Path::new(BIN)
}

/// A broker (`Services`) with a real executor attached, killed on drop.
pub struct Harness {
    pub services: Arc<Services>,
    pub child: std::process::Child,
    pub executor_pid: u32,
    /// The jailed commands' per-worker HOME this executor may have made in the first scratch
    /// path (named after `turns_dir`, so no other harness shares it): removed on drop.
    pub home_suffix: Option<(std::path::PathBuf, String)>,
    /// The turn store (`coder::*` keeps its change-diff bodies there): a relative
    /// `turns.data_dir` would land in the crate directory.
    pub turns_dir: tempfile::TempDir,
}

impl Harness {
    pub async fn new(config: Config) -> Harness {
        Harness::with_args(config, &[]).await
    }

    /// An executor started with `extra` arguments (`--no-prestart`, say).
    pub async fn with_args(config: Config, extra: &[&str]) -> Harness {
        Harness::with_services(config, extra, Services::new()).await
    }

    /// A broker whose calls to the executor have other deadlines.
    pub async fn with_call_bounds(config: Config, bounds: CallBounds) -> Harness {
        let services = Services::new();
        services.set_call_bounds(bounds);
        Harness::with_services(config, &[], services).await
    }

    async fn with_services(mut config: Config, extra: &[&str], services: Arc<Services>) -> Harness {
        // Outside /tmp (a scratch path): the store stays in place, out of commands' reach.
        let turns = super::private_tempdir();
        if !config.turns.data_dir.starts_with('/') {
            config.turns.data_dir = turns.path().join("turns").to_string_lossy().into_owned();
        }
        let home_suffix = own_home_suffix(&config, turns.path());
        services.snapshots.install(config);
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let (child, stream) = spawn_executor_with(bin(), &extra).expect("spawn executor");
        let executor_pid = services
            .attach_executor(stream)
            .await
            .expect("handshake and policy accepted");
        Harness {
            services,
            child,
            executor_pid,
            home_suffix,
            turns_dir: turns,
        }
    }

    pub async fn default() -> Harness {
        Harness::new(Config::builtin_default()).await
    }

    pub async fn call(&self, function: &str, payload: Value) -> Result<Value, WireError> {
        dispatch(&self.services, function, payload, CallMeta::default()).await
    }

    pub async fn ok(&self, function: &str, payload: Value) -> Value {
        match self.call(function, payload.clone()).await {
            Ok(v) => v,
            Err(e) => panic!("{function} {payload} failed: {e:?}"),
        }
    }

    pub async fn err(&self, function: &str, payload: Value) -> WireError {
        match self.call(function, payload.clone()).await {
            Ok(v) => panic!("{function} {payload} succeeded: {v}"),
            Err(e) => e,
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((dir, suffix)) = &self.home_suffix {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("iii-shell-home-") && name.ends_with(suffix.as_str()) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
}

/// Where the jailed commands' per-worker HOME of an executor under `config` would be (the
/// first scratch path) and the end of its name that is this worker's, when `config` keeps
/// its turn store in `turns` (a harness's own temp dir, so no other executor shares it).
pub fn own_home_suffix(config: &Config, turns: &Path) -> Option<(std::path::PathBuf, String)> {
    if !Path::new(&config.turns.data_dir).starts_with(turns) {
        return None;
    }
    let dir = config.confinement.scratch_paths.first()?;
    let name =
        iii_shell_policy::home::default_home_name(0, &iii_shell_files::home::identity(config));
    // `iii-shell-home-<uid>-<hash>`: the hash is the part that is ours.
    let hash = name.rsplit('-').next().unwrap_or_default();
    Some((std::path::PathBuf::from(dir), format!("-{hash}")))
}

/// The call fails with `code`; the error, for more checks.
pub async fn expect_code(h: &Harness, function: &str, payload: Value, code: &str) -> WireError {
    let e = h.err(function, payload.clone()).await;
    assert_eq!(e.code, code, "{function} {payload}: {e:?}");
    e
}

/// An executor started with `--pin-config FILE` holding `envelope` (its own start-up
/// confinement comes from that file), handshaken but given no policy yet. The temp dir
/// holds the file.
pub async fn spawn_pinned(
    envelope: &Config,
) -> (std::process::Child, ExecutorClient, tempfile::TempDir) {
    let dir = tempdir();
    let path = dir.path().join("pinned.yaml");
    // JSON is YAML; the file must be owned by root (or us) and writable by nobody else.
    std::fs::write(&path, serde_json::to_string_pretty(envelope).unwrap()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (child, stream) = spawn_executor_with(bin(), &["--pin-config".to_string(), s(&path)])
        .expect("spawn executor");
    let client = ExecutorClient::connect(stream).await.expect("handshake");
    (child, client, dir)
}

/// Polls `shell::status` until the background job `id` has left `running` (at most 20 s);
/// its record.
pub async fn job_done(h: &Harness, id: &str) -> Value {
    let start = std::time::Instant::now();
    loop {
        let job = h
            .ok("shell::status", serde_json::json!({ "job_id": id }))
            .await["job"]
            .clone();
        if job["status"] != "running" {
            return job;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "job {id} is still running: {job}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
