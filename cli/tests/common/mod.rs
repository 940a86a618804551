//! Shared test harness: a real executor process behind the real broker library.
#![allow(dead_code)]

mod shared;
#[allow(unused_imports)] // not every test binary uses every helper
pub use shared::*;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use iii_shell_broker::functions::{dispatch, CallMeta};
use iii_shell_broker::services::Services;
use iii_shell_broker::spawn_executor::spawn_executor_with;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::WireError;
use serde_json::Value;

pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_iii-shell"))
}

pub struct Harness {
    pub services: Arc<Services>,
    pub child: std::process::Child,
    pub executor_pid: u32,
    /// The turn store (`coder::*` keeps its change-diff bodies there): a relative
    /// `turns.data_dir` would land in the crate directory.
    pub turns_dir: tempfile::TempDir,
}

impl Harness {
    pub async fn new(config: Config) -> Harness {
        Harness::with_args(config, &[]).await
    }

    /// An executor started with `extra` arguments (`--no-prestart`, say).
    pub async fn with_args(mut config: Config, extra: &[&str]) -> Harness {
        let turns = tempdir();
        if !config.turns.data_dir.starts_with('/') {
            config.turns.data_dir = turns.path().join("turns").to_string_lossy().into_owned();
        }
        let services = Services::new();
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
    }
}

/// A config jailed to `root`. These tests were written for commands running as the test's
/// own user (root, in a root-owned temp dir), so they say so: `confinement.run_as: root`
/// (the escape suite's `run_as` cases use other users).
pub fn jailed(root: &Path) -> Config {
    let mut c = Config::builtin_default();
    c.fs.host_roots = vec![root.to_string_lossy().into_owned()];
    c.fs.allow_unjailed = false;
    c.confinement.run_as = Some("root".into());
    c
}

/// Pids of live (non-zombie) processes whose command line contains `needle`.
pub fn procs_with(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if !cmd.contains(needle) {
            continue;
        }
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim().chars().next().unwrap_or('?'))
            });
        if state != Some('Z') {
            out.push(pid);
        }
    }
    out
}

/// Children of `parent`, each with its state letter from `/proc/<pid>/stat`.
pub fn children_of(parent: u32) -> Vec<(i32, char)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let state = f.next().and_then(|s| s.chars().next());
        if let (Some(state), Some(Ok(ppid))) = (state, f.next().map(str::parse::<u32>)) {
            if ppid == parent {
                out.push((pid, state));
            }
        }
    }
    out
}

/// Zombie children of `parent`.
pub fn zombies_of(parent: u32) -> Vec<i32> {
    children_of(parent)
        .into_iter()
        .filter(|&(_, state)| state == 'Z')
        .map(|(pid, _)| pid)
        .collect()
}

/// A unique number for marking test processes (e.g. `sleep 31337.<n>`).
pub fn marker() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}{:04}.{}",
        4000 + (std::process::id() % 5000),
        N.fetch_add(1, Ordering::Relaxed),
        std::process::id() % 97
    )
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

pub fn canon(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap()
}

/// The job-cgroup base (`iii-shell-<pid>`) of the executor `pid`, when it has one.
pub fn job_cgroup_base_of(pid: u32) -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })?;
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let here = mount.join(rel.trim_start_matches('/'));
    // An executor that became the command user moved itself into `<base>/executor`.
    let name = format!("iii-shell-{pid}");
    let base = if here.ends_with(Path::new(&name).join("executor")) {
        here.parent()?.to_path_buf()
    } else {
        here.join(name)
    };
    base.is_dir().then_some(base)
}

/// Whether the executor `pid` runs its commands in job cgroups.
pub fn job_cgroups_enabled(pid: u32) -> bool {
    job_cgroup_base_of(pid).is_some()
}

/// The call fails with `code`; the error, for more checks.
pub async fn expect_code(h: &Harness, function: &str, payload: Value, code: &str) -> WireError {
    let e = h.err(function, payload.clone()).await;
    assert_eq!(e.code, code, "{function} {payload}: {e:?}");
    e
}
