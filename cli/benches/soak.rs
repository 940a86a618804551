//! A long run with faults (`cargo bench -p iii-shell --bench soak`): the whole worker
//! (`iii-shell serve`) behind the project's test engine, several callers making mixed calls
//! at a steady rate and in bursts, and faults at random times drawn from a seed. After each
//! fault, and at the end, it checks what must hold whatever happened:
//!
//! - every call got exactly one answer: a result, or an error with a documented code (S2xx,
//!   C2xx) or the engine's own error while the worker was away (engine restart, dropped
//!   connection); a call with no answer within [`LOST_AFTER`] is lost;
//! - no job or terminal process outlives its record, and the worker has no zombie child;
//! - the whole worker's memory (Pss of serve, broker and executor), fds and threads return
//!   to their band once the work pauses;
//! - the turn store opens, lists and reverts what it recorded;
//! - every byte a terminal session's consumer acknowledged arrived, in order;
//! - every file a caller owns holds what its last successful write wrote (or, after a write
//!   that failed, the old or the new content).
//!
//! The work: `shell::exec` (plain, output over the cap, timeouts, grandchildren that hold
//! stdout), background jobs with `shell::status` / `shell::list` / `shell::kill`, `shell::fs::*`
//! and `coder::*` on a tree that commands change underneath, searches, terminal sessions
//! with slow consumers and consumers that vanish, and turns with their hooks and reverts.
//! The faults: the executor SIGKILLed; SIGSTOPped, then continued; the engine restarted;
//! the broker's engine connection dropped; the turn store's filesystem (a 4 MiB tmpfs the
//! bench mounts, as root) filled; a configuration reload that adds a root, and one that
//! removes it.
//!
//! Knobs: `SOAK_SECS` (default 120), `SOAK_SEED` (default 1), `SOAK_CALLERS` (default 4),
//! `SOAK_FAULT_EVERY_S` (mean seconds between faults, default 12). With `III_ENGINE_BIN` set
//! it would drive a real engine: that path is not built, and the bench says so and stops.
//! A failed check prints the seed and the event log, and the bench exits with status 1.

#[path = "../tests/suite/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use iii_test_engine::{ErrorBody, TestClient, TestEngine};
use serde_json::{json, Value};

const COMMAND: &str = "cargo bench -p iii-shell --bench soak";
/// A call with no answer after this long is lost (the longest deadline of a call the bench
/// makes is a 3 s command's 13 s; an executor restart adds seconds at most).
const LOST_AFTER: Duration = Duration::from_secs(120);
/// The turn store's filesystem.
const TMPFS_SIZE: &str = "4m";

/// A small deterministic generator (SplitMix64): the same seed, the same run.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Everything the run saw, and what went wrong.
#[derive(Default)]
struct Ledger {
    calls: u64,
    ok: u64,
    errors: BTreeMap<String, u64>,
    lost: u64,
    faults: BTreeMap<&'static str, u64>,
    checks: u64,
    failures: Vec<String>,
    events: Vec<String>,
}

struct Run {
    started: Instant,
    seed: u64,
    ledger: Mutex<Ledger>,
    stop: AtomicBool,
    /// Set while a fault that takes the engine or the worker's connection away is under
    /// way (the engine's own errors are expected then).
    engine_fault: AtomicBool,
    /// Paused while the checks run, so that they see a quiet worker.
    paused: AtomicBool,
    /// Held (shared) by every operation, taken whole by the checks: they see no operation
    /// half done.
    gate: tokio::sync::RwLock<()>,
    in_flight: AtomicU64,
}

impl Run {
    fn event(&self, what: String) {
        let line = format!("{:>8.1} s  {what}", self.started.elapsed().as_secs_f64());
        if std::env::var_os("SOAK_QUIET").is_none() {
            println!("{line}");
        }
        let mut l = self.ledger.lock().unwrap();
        l.events.push(line);
    }
    fn fail(&self, what: String) {
        self.event(format!("FAILED: {what}"));
        self.ledger.lock().unwrap().failures.push(what);
    }
    fn check(&self, ok: bool, what: impl FnOnce() -> String) {
        self.ledger.lock().unwrap().checks += 1;
        if !ok {
            self.fail(what());
        }
    }
}

/// A documented error code of this worker.
fn documented(code: &str) -> bool {
    let b = code.as_bytes();
    b.len() == 4
        && (b[0] == b'S' || b[0] == b'C')
        && b[1] == b'2'
        && code[2..].parse::<u8>().is_ok()
}

/// The engine's own errors while the worker is away from it.
fn engine_error(code: &str) -> bool {
    matches!(
        code,
        "NotConnected"
            | "function_not_found"
            | "channel_send_failed"
            | "WORKER_NOT_FOUND"
            | "invocation_stopped"
    ) || code.starts_with("worker_")
        || code.contains("disconnect")
}

/// The callers' engine connections, replaced after an engine restart.
struct Callers {
    engine: Arc<TestEngine>,
    clients: tokio::sync::RwLock<Vec<Arc<TestClient>>>,
}

impl Callers {
    async fn client(&self, i: usize) -> Arc<TestClient> {
        self.clients.read().await[i].clone()
    }
    async fn reconnect(&self) {
        let mut all = self.clients.write().await;
        for c in all.iter_mut() {
            let mut fresh = self.engine.client().await;
            fresh.set_call_timeout(LOST_AFTER);
            *c = Arc::new(fresh);
        }
    }
}

/// One call, recorded in the ledger.
async fn call(run: &Run, c: &TestClient, f: &str, data: Value) -> Result<Value, ErrorBody> {
    run.in_flight.fetch_add(1, Ordering::Relaxed);
    let r = c.call(f, data.clone()).await;
    run.in_flight.fetch_sub(1, Ordering::Relaxed);
    let mut l = run.ledger.lock().unwrap();
    l.calls += 1;
    match &r {
        Ok(_) => l.ok += 1,
        Err(e) if e.code == "Timeout" => {
            l.lost += 1;
            drop(l);
            run.fail(format!("{f} {data}: no answer within {LOST_AFTER:?}"));
        }
        Err(e) => {
            let count = l.errors.entry(e.code.clone()).or_default();
            *count += 1;
            let first = *count == 1;
            let fine = documented(&e.code) || engine_error(&e.code);
            drop(l);
            if !fine {
                run.fail(format!("{f} {data}: undocumented error {e:?}"));
            }
            if first {
                run.event(format!("first {}: {f}: {}", e.code, e.message));
            }
        }
    }
    r
}

/// What each caller's own files should hold: the content of the last successful write, or
/// either of two after a write whose answer was an error.
#[derive(Default)]
struct Files {
    expect: HashMap<PathBuf, Vec<Option<String>>>,
}

struct World {
    run: Arc<Run>,
    callers: Arc<Callers>,
    root: PathBuf,
    files: Mutex<Files>,
    page_id: String,
    /// Terminal output received per session: the bytes, in order of delivery.
    pty_out: Mutex<HashMap<String, Vec<u8>>>,
    turn_no: AtomicU64,
}

impl World {
    fn cwd(&self) -> String {
        self.root.to_string_lossy().into_owned()
    }

    /// One operation of caller `i`, picked by `rng`.
    async fn op(&self, i: usize, lane: usize, rng: &mut Rng) {
        let c = self.callers.client(i).await;
        let run = &self.run;
        let cwd = self.cwd();
        match rng.below(20) {
            0..=4 => {
                let n = rng.next();
                if let Ok(v) = call(
                    run,
                    &c,
                    "shell::exec",
                    json!({"command": "echo", "args": [format!("n{n}")], "cwd": cwd}),
                )
                .await
                {
                    run.check(v["stdout"] == format!("n{n}\n"), || {
                        format!("echo n{n}: {v}")
                    });
                }
            }
            5 => {
                // Output over the cap.
                let _ = call(
                    run,
                    &c,
                    "shell::exec",
                    json!({"command": "seq", "args": ["1", "400000"], "cwd": cwd}),
                )
                .await;
            }
            6 => {
                // A timeout, and a grandchild that holds stdout past its parent.
                let _ = call(
                    run,
                    &c,
                    "shell::exec",
                    json!({"command": "sleep", "args": ["5"], "timeout_ms": 300, "cwd": cwd}),
                )
                .await;
                let _ = call(run, &c, "shell::exec", json!({"command": "sh", "args": ["-c", "sleep 3 & echo held"], "timeout_ms": 1500, "cwd": cwd})).await;
            }
            7 => self.job(&c, rng).await,
            8..=10 => self.file(i, lane, &c, rng).await,
            11 => {
                // Commands change the tree underneath fs and coder calls.
                let n = rng.below(8);
                let script = format!("mkdir -p churn/d{n}/x && echo {n} > churn/d{n}/x/f && rm -rf churn/d{} && mv churn/d{n} churn/e{n} 2>/dev/null; rm -rf churn/e{}", (n + 1) % 8, (n + 3) % 8);
                let _ = call(
                    run,
                    &c,
                    "shell::exec",
                    json!({"command": "sh", "args": ["-c", script], "cwd": cwd}),
                )
                .await;
            }
            12 => {
                let _ = call(run, &c, "shell::fs::ls", json!({"path": "churn"})).await;
                let _ = call(run, &c, "coder::tree", json!({"path": "churn"})).await;
            }
            13 => {
                let _ = call(run, &c, "shell::fs::grep", json!({"path": "src", "pattern": format!("item_{}_", rng.below(20)), "recursive": true})).await;
            }
            14 => {
                let _ = call(
                    run,
                    &c,
                    "coder::search",
                    json!({"query": format!("item_{}", rng.below(20)), "path": "src"}),
                )
                .await;
            }
            15 => {
                let f = format!("src/m{:02}/f{:02}.rs", rng.below(20), rng.below(20));
                let _ = call(run, &c, "coder::read-file", json!({"path": f})).await;
                let _ = call(run, &c, "shell::fs::stat", json!({"path": f})).await;
            }
            16 | 17 => self.pty(&c, rng).await,
            _ => self.turn(i, lane, &c, rng).await,
        }
    }

    /// A background job, its status, the list, and a kill.
    async fn job(&self, c: &TestClient, rng: &mut Rng) {
        let run = &self.run;
        let secs = 1 + rng.below(3);
        let Ok(v) = call(run, c, "shell::exec_bg", json!({"command": "sh", "args": ["-c", format!("echo soakjob; sleep {secs}"), format!("soak-marker-{}-", run.seed)], "cwd": self.cwd()})).await else {
            return;
        };
        let Some(id) = v["job_id"].as_str() else {
            run.fail(format!("exec_bg without a job id: {v}"));
            return;
        };
        let _ = call(run, c, "shell::status", json!({"job_id": id})).await;
        let _ = call(run, c, "shell::list", json!({})).await;
        if rng.below(2) == 0 {
            let _ = call(run, c, "shell::kill", json!({"job_id": id})).await;
        }
    }

    /// A write to one of caller `i`'s own files, then a read that must see it.
    async fn file(&self, i: usize, lane: usize, c: &TestClient, rng: &mut Rng) {
        let run = &self.run;
        let rel = format!("own/c{i}/l{lane}f{}.txt", rng.below(6));
        let path = self.root.join(&rel);
        let content = format!("caller {i} wrote {}\n", rng.next());
        let via_coder = rng.below(2) == 0;
        let r = if via_coder && path.exists() {
            let _ = call(run, c, "coder::read-file", json!({"path": rel})).await;
            call(
                run,
                c,
                "shell::fs::write",
                json!({"path": rel, "content": content}),
            )
            .await
        } else {
            call(
                run,
                c,
                "shell::fs::write",
                json!({"path": rel, "content": content}),
            )
            .await
        };
        {
            let mut files = self.files.lock().unwrap();
            let e = files
                .expect
                .entry(path.clone())
                .or_insert_with(|| vec![None]);
            match r {
                Ok(_) => *e = vec![Some(content.clone())],
                Err(_) => e.push(Some(content.clone())),
            }
        }
        // The read goes through a data channel: the load only; the disk says what is there.
        let _ = call(run, c, "shell::fs::read", json!({"path": rel})).await;
        let got = std::fs::read_to_string(&path).ok();
        let ok = {
            let files = self.files.lock().unwrap();
            files.expect[&path].contains(&got)
        };
        run.check(ok, || {
            format!("{rel} holds {got:?} after a write of {content:?}")
        });
    }

    /// A terminal session printing numbered lines to the bench's consumer; sometimes closed
    /// before it finishes (the consumer vanishes).
    async fn pty(&self, c: &TestClient, rng: &mut Rng) {
        let run = &self.run;
        let lines = 200 + rng.below(3000);
        let Ok(s) = call(run, c, "shell::pty::open", json!({"cwd": self.cwd(), "cols": 120, "rows": 40,
            "output_function_id": self.page_id, "program": "sh", "args": ["-c", format!("seq 1 {lines}"), format!("soak-marker-{}-", run.seed)]})).await else {
            return;
        };
        let Some(session) = s["session_id"].as_str().map(str::to_string) else {
            run.fail(format!("pty::open without a session: {s}"));
            return;
        };
        if rng.below(4) == 0 {
            tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
        } else {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        let _ = call(
            run,
            c,
            "shell::pty::close",
            json!({"session_id": session, "access_key": s["access_key"]}),
        )
        .await;
        // What arrived must be 1..k in order, with no gap, for some k.
        let got = self
            .pty_out
            .lock()
            .unwrap()
            .remove(&session)
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&got).replace('\r', "");
        let mut want = 1u64;
        let mut ok = true;
        for l in text.split('\n').filter(|l| !l.is_empty()) {
            if l.parse::<u64>() != Ok(want) {
                // The last line may be cut by the close.
                ok = l.parse::<u64>().is_err() && text.ends_with(l);
                break;
            }
            want += 1;
        }
        run.check(ok, || {
            format!(
                "terminal {session}: output out of order or with a gap after line {}",
                want - 1
            )
        });
    }

    /// A turn: started, a hooked write, completed, listed, and reverted.
    async fn turn(&self, i: usize, lane: usize, c: &TestClient, rng: &mut Rng) {
        let run = &self.run;
        let n = self.turn_no.fetch_add(1, Ordering::Relaxed);
        let (session, turn) = (format!("soak{i}l{lane}"), format!("t{n}"));
        let rel = format!("turns/c{i}/l{lane}t{}.txt", rng.below(4));
        let _ = call(
            run,
            c,
            "shell::turns::on-turn-started",
            json!({"session_id": session, "turn_id": turn, "message_preview": "soak"}),
        )
        .await;
        let args = json!({"path": rel, "content": format!("turn {n}\n")});
        let pre = json!({"point": "pre_trigger", "session_id": session, "turn_id": turn, "step": 1,
            "call": {"id": format!("fc{n}"), "function_id": "shell::fs::write", "arguments": args}});
        let _ = call(run, c, "shell::turns::on-pre-trigger", pre.clone()).await;
        let _ = call(run, c, "shell::fs::write", args).await;
        let mut post = pre;
        post["point"] = json!("post_trigger");
        post["result"] = json!({"is_error": false, "content": []});
        let _ = call(run, c, "shell::turns::on-post-trigger", post).await;
        let _ = call(
            run,
            c,
            "shell::turns::on-turn-completed",
            json!({"session_id": session, "turn_id": turn}),
        )
        .await;
        let _ = call(run, c, "shell::turns::list", json!({"session_id": session})).await;
        if rng.below(2) == 0 {
            let r = call(
                run,
                c,
                "shell::turns::revert",
                // Only this turn's own file: a write carries no session, so the turn also
                // recorded what other callers wrote meanwhile, and reverting those would
                // undo their writes.
                json!({"session_id": session, "turn_id": turn,
                       "paths": [self.root.join(&rel).to_string_lossy()]}),
            )
            .await;
            if let Ok(v) = r {
                // Turns of other sessions write at the same time, and a write carries no
                // session: a file another turn changed since is refused, as documented.
                let refused_as_changed = v["results"].as_array().is_some_and(|rs| {
                    rs.iter().all(|r| {
                        r["success"] == true
                            || r["error"]
                                .as_str()
                                .is_some_and(|e| e.contains("changed since this turn"))
                    })
                });
                let ok = v["failed"] == 0 || v["failed"].is_null() || refused_as_changed;
                run.check(ok, || format!("revert of {session}/{turn}: {v}"));
            }
        }
    }
}

/// The worker's processes.
struct Pids {
    serve: i32,
}

impl Pids {
    fn broker(&self) -> Option<i32> {
        children_of(self.serve)
            .into_iter()
            .find(|p| cmdline(*p).is_some_and(|c| c.contains(" broker ")))
    }
    fn executor(&self) -> Option<i32> {
        children_of(self.serve)
            .into_iter()
            .find(|p| cmdline(*p).is_some_and(|c| c.contains("executor --fd")))
    }
}

fn rollup_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn count_dir(path: String) -> u64 {
    std::fs::read_dir(path)
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

/// Memory (KiB of Pss), fds and threads of serve + broker + executor.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    pss_kib: u64,
    fds: u64,
    threads: u64,
}

fn usage(p: &Pids) -> Usage {
    let mut u = Usage::default();
    for pid in [Some(p.serve), p.broker(), p.executor()]
        .into_iter()
        .flatten()
    {
        u.pss_kib += rollup_kib(pid);
        u.fds += count_dir(format!("/proc/{pid}/fd"));
        u.threads += count_dir(format!("/proc/{pid}/task"));
    }
    u
}

/// Every process below `pid` (children first found through /proc's ppid).
fn tree(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for c in children_of(p) {
            out.push(c);
            todo.push(c);
        }
    }
    out
}

fn state_of(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
}

/// Waits until the worker answers an exec again (after a fault).
async fn recovered(world: &World, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let c = world.callers.client(0).await;
        if let Ok(v) = c
            .call("shell::exec", json!({"command": "echo", "args": ["up"]}))
            .await
        {
            if v["stdout"] == "up\n" {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// The kinds of fault, each drawn at least once per cycle through them.
const FAULTS: [&str; 7] = [
    "executor SIGKILL",
    "executor SIGSTOP+SIGCONT",
    "engine restart",
    "broker connection dropped",
    "turn store disk full",
    "configuration reload",
    "broker SIGKILL",
];

/// The tmpfs the turn store lives on, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Tmpfs {
        std::fs::create_dir_all(at).expect("tmpfs mount point");
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={TMPFS_SIZE},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "{COMMAND}: cannot mount a tmpfs at {} (run as root)",
            at.display()
        );
        Tmpfs(at.to_path_buf())
    }

    /// Fills it; the filler's path.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let p = self.0.join("soak-filler");
        if let Ok(mut f) = std::fs::File::create(&p) {
            let chunk = vec![0u8; 64 * 1024];
            while f.write_all(&chunk).is_ok() {}
            let _ = f.sync_all();
        }
        p
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// The page that takes terminal output: every delivery recorded per session, sometimes
/// after a pause (a slow consumer).
async fn register_page(engine: &TestEngine, world: &Arc<World>) -> TestClient {
    let page = engine.client().await;
    let w = world.clone();
    let slow = Arc::new(AtomicU64::new(0));
    page.register_function(&world.page_id, move |data: Value, _| {
        let w = w.clone();
        let slow = slow.clone();
        async move {
            if let (Some(s), Some(d)) = (data["session_id"].as_str(), data["data"].as_str()) {
                use base64::Engine as _;
                if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(d) {
                    w.pty_out
                        .lock()
                        .unwrap()
                        .entry(s.to_string())
                        .or_default()
                        .extend(bytes);
                }
            }
            if slow.fetch_add(1, Ordering::Relaxed).is_multiple_of(7) {
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            Ok(json!({}))
        }
    })
    .await
    .expect("register the terminal consumer");
    page
}

fn make_tree(root: &Path, callers: usize) {
    for d in 0..20 {
        let dir = root.join(format!("src/m{d:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..20 {
            std::fs::write(
                dir.join(format!("f{f:02}.rs")),
                format!("fn item_{d}_{f}() {{}}\n"),
            )
            .unwrap();
        }
    }
    for i in 0..callers {
        std::fs::create_dir_all(root.join(format!("own/c{i}"))).unwrap();
        std::fs::create_dir_all(root.join(format!("turns/c{i}"))).unwrap();
    }
    std::fs::create_dir_all(root.join("churn")).unwrap();
}

struct Setup {
    engine: Arc<TestEngine>,
    worker: Worker,
    pids: Pids,
    world: Arc<World>,
    page: tokio::sync::Mutex<TestClient>,
    tmpfs: Tmpfs,
    extra_root: PathBuf,
    extra_added: AtomicBool,
}

impl Setup {
    /// Injects one fault.
    async fn fault(&self, kind: &'static str, rng: &mut Rng) {
        let run = &self.world.run;
        run.event(format!("fault: {kind}"));
        *run.ledger.lock().unwrap().faults.entry(kind).or_default() += 1;
        let signal = |pid: Option<i32>, sig| {
            if let Some(p) = pid {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), sig);
            }
        };
        use nix::sys::signal::Signal;
        match kind {
            "executor SIGKILL" => signal(self.pids.executor(), Signal::SIGKILL),
            "executor SIGSTOP+SIGCONT" => {
                let pid = self.pids.executor();
                signal(pid, Signal::SIGSTOP);
                tokio::time::sleep(Duration::from_millis(1000 + rng.below(3000))).await;
                signal(pid, Signal::SIGCONT);
            }
            "engine restart" => {
                run.engine_fault.store(true, Ordering::Relaxed);
                self.engine.restart().await;
                self.world.callers.reconnect().await;
                let _ = self
                    .engine
                    .wait_for_function("shell::exec", Duration::from_secs(60))
                    .await;
                *self.page.lock().await = register_page(&self.engine, &self.world).await;
            }
            "broker connection dropped" => {
                run.engine_fault.store(true, Ordering::Relaxed);
                let pid = self.worker.pid as u64;
                if let Some(w) = self
                    .engine
                    .workers()
                    .into_iter()
                    .rev()
                    .find(|w| w.connected && w.pid == Some(pid))
                {
                    self.engine.drop_worker(w.worker_id).await;
                }
                let _ = self
                    .engine
                    .wait_for_function("shell::exec", Duration::from_secs(60))
                    .await;
            }
            "turn store disk full" => {
                let filler = self.tmpfs.fill();
                tokio::time::sleep(Duration::from_secs(3)).await;
                let _ = std::fs::remove_file(filler);
            }
            "configuration reload" => {
                let mut v = self
                    .engine
                    .config_get("shell")
                    .expect("the stored configuration");
                let extra = self.extra_root.to_string_lossy().into_owned();
                let roots = v["fs"]["host_roots"].as_array_mut().expect("host_roots");
                let adding = !self.extra_added.load(Ordering::Relaxed);
                if adding {
                    roots.push(json!(extra));
                } else {
                    roots.retain(|r| r != &json!(extra));
                }
                self.extra_added.store(adding, Ordering::Relaxed);
                run.event(format!(
                    "  reload: {} {}",
                    if adding { "add root" } else { "remove root" },
                    extra
                ));
                self.engine.config_set("shell", v).await;
            }
            "broker SIGKILL" => {
                run.engine_fault.store(true, Ordering::Relaxed);
                signal(self.pids.broker(), Signal::SIGKILL);
                tokio::time::sleep(Duration::from_millis(500)).await;
                let _ = self
                    .engine
                    .wait_for_function("shell::exec", Duration::from_secs(60))
                    .await;
                // The new broker's functions and this caller's old invocations: settle.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            _ => unreachable!("{kind}"),
        }
    }

    /// Pauses the callers, lets every call in flight finish, and checks the invariants.
    async fn checks(&self, what: &str, band: &mut Option<Usage>, samples: &mut Vec<(f64, Usage)>) {
        let run = &self.world.run;
        run.paused.store(true, Ordering::Relaxed);
        let _quiet = run.gate.write().await;
        let t = Instant::now();
        while run.in_flight.load(Ordering::Relaxed) > 0
            && t.elapsed() < LOST_AFTER + Duration::from_secs(10)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        run.check(run.in_flight.load(Ordering::Relaxed) == 0, || {
            format!("{what}: calls still unanswered")
        });
        run.check(
            recovered(&self.world, Duration::from_secs(90)).await,
            || format!("{what}: the worker does not serve again"),
        );
        run.engine_fault.store(false, Ordering::Relaxed);
        // Jobs sleep at most 3 s and terminals print at most 3,200 lines.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let marker = format!("soak-marker-{}-", run.seed);
        let left: Vec<i32> = all_pids()
            .into_iter()
            .filter(|p| cmdline(*p).is_some_and(|c| c.contains(&marker)))
            .collect();
        run.check(left.is_empty(), || {
            format!("{what}: job or terminal processes outlived their record: {left:?}")
        });
        let zombies = || -> Vec<i32> {
            tree(self.worker.pid)
                .into_iter()
                .filter(|p| state_of(*p) == Some('Z'))
                .collect()
        };
        let z = zombies();
        if !z.is_empty() {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let z: Vec<i32> = zombies().into_iter().filter(|p| z.contains(p)).collect();
        run.check(z.is_empty(), || {
            format!("{what}: zombies under the worker: {z:?}")
        });
        self.check_files(what);
        self.check_turns(what).await;
        // The band: the first quiet sample, and room for the pre-started processes and the
        // runtime's idle threads.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let u = usage(&self.pids);
        samples.push((run.started.elapsed().as_secs_f64(), u));
        run.event(format!(
            "  {what}: Pss {:.1} MB, {} fds, {} threads",
            u.pss_kib as f64 / 1000.0,
            u.fds,
            u.threads
        ));
        match band {
            None => *band = Some(u),
            Some(b) => {
                run.check(u.fds <= b.fds + 24, || {
                    format!(
                        "{what}: fds {} over the band ({} at the start)",
                        u.fds, b.fds
                    )
                });
                run.check(u.threads <= b.threads + 12, || {
                    format!(
                        "{what}: threads {} over the band ({} at the start)",
                        u.threads, b.threads
                    )
                });
                run.check(u.pss_kib <= b.pss_kib + 12_000, || {
                    format!(
                        "{what}: Pss {} KiB over the band ({} KiB at the start)",
                        u.pss_kib, b.pss_kib
                    )
                });
            }
        }
        run.paused.store(false, Ordering::Relaxed);
    }

    fn check_files(&self, what: &str) {
        let files = self.world.files.lock().unwrap();
        for (path, want) in &files.expect {
            let got = std::fs::read_to_string(path).ok();
            let ok = want.contains(&got);
            self.world.run.check(ok, || {
                format!(
                    "{what}: {} holds {got:?}, not one of {want:?}",
                    path.display()
                )
            });
        }
    }

    async fn check_turns(&self, what: &str) {
        let c = self.world.callers.client(0).await;
        let run = &self.world.run;
        let r = call(run, &c, "shell::turns::sessions", json!({})).await;
        run.check(r.is_ok(), || {
            format!("{what}: the turn store does not list its sessions: {r:?}")
        });
        let r = call(
            run,
            &c,
            "shell::turns::list",
            json!({"session_id": "soak0l0"}),
        )
        .await;
        run.check(r.is_ok(), || {
            format!("{what}: the turn store does not list a session's turns: {r:?}")
        });
    }
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn env_u64(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::var_os("III_ENGINE_BIN").is_some() {
        println!("{COMMAND}: III_ENGINE_BIN is set, but the real-engine path of this bench is not built yet; run without it to drive the test engine");
        return;
    }
    println!("{COMMAND}: III_ENGINE_BIN unset: the project's test engine (tests/engine); set it for a real engine (not built yet)");
    let secs = env_u64("SOAK_SECS", 120);
    let seed = env_u64("SOAK_SEED", 1);
    let n_callers = env_u64("SOAK_CALLERS", 4) as usize;
    let fault_every = env_u64("SOAK_FAULT_EVERY_S", 10).max(2);
    println!("{COMMAND}: SOAK_SECS={secs} SOAK_SEED={seed} SOAK_CALLERS={n_callers} SOAK_FAULT_EVERY_S={fault_every}");

    let dir = tempdir();
    let base = canon(dir.path());
    let root = base.join("root");
    let extra_root = base.join("extra");
    std::fs::create_dir_all(&extra_root).unwrap();
    make_tree(&root, n_callers);
    let tmpfs = Tmpfs::mount(&base.join("turns"));
    let mut config = jailed(&root);
    config.turns.data_dir = base.join("turns/store").to_string_lossy().into_owned();
    let engine = Arc::new(
        TestEngine::builder()
            .keep_invocation_frames(false)
            .start()
            .await,
    );
    let worker = Worker::builder().engine(&engine).seed(&config).start();
    wait_ready(&engine, &worker).await;
    let pids = Pids { serve: worker.pid };

    let run = Arc::new(Run {
        started: Instant::now(),
        seed,
        ledger: Mutex::default(),
        stop: AtomicBool::new(false),
        engine_fault: AtomicBool::new(false),
        paused: AtomicBool::new(false),
        gate: tokio::sync::RwLock::new(()),
        in_flight: AtomicU64::new(0),
    });
    let callers = Arc::new(Callers {
        engine: engine.clone(),
        clients: tokio::sync::RwLock::new(Vec::new()),
    });
    for _ in 0..n_callers {
        let mut c = engine.client().await;
        c.set_call_timeout(LOST_AFTER);
        callers.clients.write().await.push(Arc::new(c));
    }
    let world = Arc::new(World {
        run: run.clone(),
        callers,
        root: root.clone(),
        files: Mutex::default(),
        page_id: "iii::soak-ui::pty-output::console-page".into(),
        pty_out: Mutex::default(),
        turn_no: AtomicU64::new(0),
    });
    let page = register_page(&engine, &world).await;
    let setup = Setup {
        engine: engine.clone(),
        worker,
        pids,
        world: world.clone(),
        page: tokio::sync::Mutex::new(page),
        tmpfs,
        extra_root,
        extra_added: AtomicBool::new(false),
    };
    let burst = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..n_callers {
        let (world, burst) = (world.clone(), burst.clone());
        let mut rng = Rng(seed ^ (0x5EED_0000 + i as u64 * 7919));
        tasks.push(tokio::spawn(async move {
            while !world.run.stop.load(Ordering::Relaxed) {
                if world.run.paused.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                let _op = world.run.gate.read().await;
                if burst.load(Ordering::Relaxed) {
                    let mut set = tokio::task::JoinSet::new();
                    for lane in 1..=4 {
                        let (w, mut r) = (world.clone(), Rng(rng.next()));
                        set.spawn(async move { w.op(i, lane, &mut r).await });
                    }
                    while set.join_next().await.is_some() {}
                } else {
                    world.op(i, 0, &mut rng).await;
                    tokio::time::sleep(Duration::from_millis(20 + rng.below(150))).await;
                }
            }
        }));
    }

    let mut rng = Rng(seed);
    let mut order: Vec<&'static str> = Vec::new();
    let mut band = None;
    let mut samples = Vec::new();
    setup.checks("start", &mut band, &mut samples).await;
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        let wait = fault_every * 500 + rng.below(fault_every * 1000);
        // A burst for a third of the runs between faults.
        let bursting = rng.below(3) == 0;
        burst.store(bursting, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        burst.store(false, Ordering::Relaxed);
        if order.is_empty() {
            order = FAULTS.to_vec();
            for k in (1..order.len()).rev() {
                order.swap(k, rng.below(k as u64 + 1) as usize);
            }
        }
        let kind = order.pop().expect("a fault");
        setup.fault(kind, &mut rng).await;
        setup.checks(kind, &mut band, &mut samples).await;
    }
    run.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    setup.checks("end", &mut band, &mut samples).await;
    let ok = report(&run, secs, &samples);
    // The tmpfs is unmounted before the exit status is given.
    drop(setup);
    if !ok {
        std::process::exit(1);
    }
}

fn report(run: &Run, secs: u64, samples: &[(f64, Usage)]) -> bool {
    let l = run.ledger.lock().unwrap();
    let errors: u64 = l.errors.values().sum();
    println!(
        "soak: {secs} s, seed {}: {} calls ({} ok, {} errors, {} lost), {} checks, {} failures",
        run.seed,
        l.calls,
        l.ok,
        errors,
        l.lost,
        l.checks,
        l.failures.len()
    );
    println!("  errors by code: {:?}", l.errors);
    println!("  faults: {:?}", l.faults);
    if let (Some(first), Some(last)) = (samples.first(), samples.last()) {
        // Memory drift is measured from the first sample after ten minutes (or the first).
        let from = samples.iter().find(|(t, _)| *t >= 600.0).unwrap_or(first);
        println!(
            "  drift start → end: Pss {:+.2} MB, fds {:+}, threads {:+}; Pss from {:.0} s: {:+.2} MB ({:.1} → {:.1} MB)",
            (last.1.pss_kib as f64 - first.1.pss_kib as f64) / 1000.0,
            last.1.fds as i64 - first.1.fds as i64,
            last.1.threads as i64 - first.1.threads as i64,
            from.0,
            (last.1.pss_kib as f64 - from.1.pss_kib as f64) / 1000.0,
            from.1.pss_kib as f64 / 1000.0,
            last.1.pss_kib as f64 / 1000.0,
        );
    }
    if !l.failures.is_empty() {
        println!(
            "SOAK FAILED (seed {}; rerun with SOAK_SEED={} SOAK_SECS={secs}). Event log:",
            run.seed, run.seed
        );
        for e in &l.events {
            println!("{e}");
        }
        return false;
    }
    println!("soak: every check held");
    true
}
