//! Start-up and reload against the size of the tree (`cargo bench -p iii-shell --bench reload`,
//! release build; a reload must not cost with the tree's size). One jail of `RELOAD_BENCH_FILES` files (default
//! 1,000,000, in directories of 100, one protected `.env` per 1,000 directories) and one
//! empty jail, in the same run:
//!
//! 1. **`iii-shell call`**, a whole process (start, executor, policy, one call, exit), on the
//!    big jail against the empty one, alternating, `RELOAD_BENCH_ROUNDS` rounds (default 9),
//!    medians: `shell::fs::stat` (goal ≤ 1.2×), and `shell::exec`, whose first command waits
//!    for the walk for protected entries (its Landlock carve-out needs it).
//! 2. **A reload's round trip** (`configuration::set` to the worker's answer) on a worker
//!    serving the big jail against one serving the empty jail: a reload that keeps the roots,
//!    denylist and globs (it shares the walk), and one that adds a denylist entry (it walks
//!    again, off the call path). Goal ≤ 1.2×.
//!    The two workers take turns at going first, each round once both have settled.
//!    `RELOAD_BENCH_ONLY=reloads` runs this part alone.
//! 3. **Calls in flight during a reload**: `shell::fs::stat` calls back to back on the big
//!    jail's worker, at rest and across each kind of reload; the worst latency in the window
//!    against the worst at rest (goal: never more than 10 ms beyond). With the second kind,
//!    how long the first command after the reload waits for the new walk.

#[path = "../tests/suite/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use iii_test_engine::TestEngine;
use serde_json::{json, Value};

const COMMAND: &str = "cargo bench -p iii-shell --bench reload";
const GOAL: f64 = 1.2;
const IN_FLIGHT_MS: f64 = 10.0;

fn env(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn make_jail(root: &Path, files: usize) {
    let dirs = files.div_ceil(100);
    for d in 0..dirs {
        let dir = root.join(format!("d{:03}/e{d:05}", d / 1000));
        std::fs::create_dir_all(&dir).expect("dir");
        for f in 0..100.min(files - d * 100) {
            std::fs::write(dir.join(format!("f{f:02}.txt")), b"x\n").expect("file");
        }
        if d % 1000 == 0 {
            std::fs::write(dir.join(".env"), b"SECRET=1\n").expect("protected file");
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT MET"
    }
}

/// One `iii-shell call` process, in ms.
fn call_once(config: &Path, function: &str, payload: &Value) -> f64 {
    let t = Instant::now();
    let o = Command::new(BIN)
        .args(["call", "--config"])
        .arg(config)
        .args([function, &payload.to_string()])
        .output()
        .expect("run iii-shell call");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert!(
        o.status.success(),
        "{function}: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    ms
}

fn calls(empty: &Path, big: &Path, files: usize, rounds: usize) {
    let dir = tempdir();
    let cfg = |name: &str, root: &Path| {
        let p = dir.path().join(name);
        let yaml = serde_norway::to_string(&jailed(root)).expect("yaml");
        std::fs::write(&p, yaml).expect("config");
        p
    };
    let (ce, cb) = (cfg("empty.yaml", empty), cfg("big.yaml", big));
    for (function, payload, goal) in [
        ("shell::fs::stat", json!({"path": "."}), true),
        ("shell::exec", json!({"command": "true"}), false),
    ] {
        let (mut e, mut b) = (Vec::new(), Vec::new());
        for round in 0..rounds + 1 {
            let te = call_once(&ce, function, &payload);
            let tb = call_once(&cb, function, &payload);
            if round > 0 {
                e.push(te);
                b.push(tb);
            }
        }
        let (me, mb) = (median(e), median(b));
        let ratio = mb / me;
        println!(
            "iii-shell call {function}, median of {rounds}: empty jail {me:.1} ms, {files}-file jail {mb:.1} ms: {ratio:.2}x{}",
            if goal {
                format!(" (goal <= {GOAL}x: {})", verdict(ratio <= GOAL))
            } else {
                " (the first command waits for the walk for protected entries)".to_string()
            }
        );
    }
}

struct Served {
    engine: TestEngine,
    worker: Worker,
    root: std::path::PathBuf,
    /// The denylist entry of the last reload that changed the walk's key (0: none).
    key: std::sync::atomic::AtomicU64,
}

async fn serve(root: &Path) -> Served {
    let engine = TestEngine::builder()
        .keep_invocation_frames(false)
        .start()
        .await;
    let worker = Worker::builder()
        .engine(&engine)
        .seed(&jailed(root))
        .start();
    wait_ready(&engine, &worker).await;
    let s = Served {
        engine,
        worker,
        root: root.to_path_buf(),
        key: Default::default(),
    };
    s.commands_ready().await;
    s
}

impl Served {
    /// Waits until a command runs (the walk for protected entries is done), in ms.
    async fn commands_ready(&self) -> f64 {
        let c = self.engine.client().await;
        let t = Instant::now();
        let r = c
            .call("shell::exec", json!({"command": "true"}))
            .await
            .unwrap_or_else(|e| panic!("exec: {e:?}\n{}", self.worker.stderr()));
        assert_eq!(r["exit_code"], 0, "{r}");
        t.elapsed().as_secs_f64() * 1e3
    }

    /// Waits for the walk (a command runs) and then for the worker to be idle again.
    async fn settle(&self) {
        self.commands_ready().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    /// The reload's value: `n` moves a limit (the walk's key stays); with `new_key`, the
    /// denylist entry changes too (a new walk). The entry kept between reloads is the last
    /// one set.
    fn value(&self, n: u64, new_key: bool) -> Value {
        use std::sync::atomic::Ordering;
        let mut c = jailed(&self.root);
        c.max_timeout_ms += n;
        if new_key {
            self.key.store(n, Ordering::Relaxed);
        }
        let k = self.key.load(Ordering::Relaxed);
        if k > 0 {
            c.fs.denylist_paths
                .push(self.root.join(format!("nothing-{k}")).display().to_string());
        }
        serde_json::to_value(c).expect("value")
    }

    /// One reload's round trip, in ms.
    async fn reload(&self, n: u64, new_key: bool) -> f64 {
        let t = Instant::now();
        let fan = self
            .engine
            .config_set("shell", self.value(n, new_key))
            .await;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        assert!(
            fan.len() == 1 && fan[0].outcome == Some(Ok(json!({"ok": true}))),
            "{fan:?}\n{}",
            self.worker.stderr()
        );
        ms
    }
}

async fn reloads(empty: &Served, big: &Served, files: usize, rounds: usize) {
    let mut n = 0;
    for (label, new_key) in [
        ("keeping roots, denylist and globs", false),
        ("adding a denylist entry", true),
    ] {
        let (mut e, mut b) = (Vec::new(), Vec::new());
        for round in 0..rounds + 1 {
            n += 1;
            // Taking turns at going first, each once the other worker has settled (its
            // walk done, its pool of pre-started processes refilled; not timed).
            let (te, tb) = if round % 2 == 0 {
                let te = empty.reload(n, new_key).await;
                empty.settle().await;
                (te, big.reload(n, new_key).await)
            } else {
                let tb = big.reload(n, new_key).await;
                big.settle().await;
                (empty.reload(n, new_key).await, tb)
            };
            empty.settle().await;
            big.settle().await;
            if round > 0 {
                e.push(te);
                b.push(tb);
            }
        }
        let (me, mb) = (median(e), median(b));
        let ratio = mb / me;
        println!(
            "reload {label}, round trip, median of {rounds}: empty jail {me:.2} ms, {files}-file jail {mb:.2} ms: {ratio:.2}x (goal <= {GOAL}x: {})",
            verdict(ratio <= GOAL)
        );
    }
}

/// `shell::fs::stat` back to back for `window`: each call's latency in ms.
async fn stats_for(s: &Served, window: Duration) -> Vec<f64> {
    let c = s.engine.client().await;
    let end = Instant::now() + window;
    let mut lat = Vec::new();
    while Instant::now() < end {
        let t = Instant::now();
        c.call("shell::fs::stat", json!({"path": "d000"}))
            .await
            .expect("stat");
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    lat
}

fn worst(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

fn p99(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

async fn in_flight(big: &Served) {
    let rest = stats_for(big, Duration::from_secs(4)).await;
    let (rest_p99, rest_worst) = (p99(&rest), worst(&rest));
    println!(
        "calls at rest: {} shell::fs::stat, p50 {:.2} ms, p99 {rest_p99:.2} ms, worst {rest_worst:.2} ms",
        rest.len(),
        median(rest.clone())
    );
    for (label, new_key) in [
        ("keeping roots, denylist and globs", false),
        ("adding a denylist entry", true),
    ] {
        let caller = stats_for(big, Duration::from_secs(4));
        let reload = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let ms = big.reload(1_000 + new_key as u64, new_key).await;
            let waited = big.commands_ready().await;
            (ms, waited)
        };
        let (lat, (ms, waited)) = tokio::join!(caller, reload);
        let w = worst(&lat);
        println!(
            "calls across a reload {label}: {} calls, p99 {:.2} ms, worst {w:.2} ms, {:+.2} ms beyond the worst at rest (goal <= {IN_FLIGHT_MS} ms: {}); the reload {ms:.2} ms; the first command after it {waited:.1} ms",
            lat.len(),
            p99(&lat),
            w - rest_worst,
            verdict(w - rest_worst <= IN_FLIGHT_MS)
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let files = env("RELOAD_BENCH_FILES", 1_000_000);
    let rounds = env("RELOAD_BENCH_ROUNDS", 9).max(1);
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let empty = tempdir();
    let big = tempdir();
    let t = Instant::now();
    make_jail(big.path(), files);
    println!(
        "{COMMAND}: host {cpus} CPUs; jail of {files} files generated in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let (empty_root, big_root) = (canon(empty.path()), canon(big.path()));
    // `RELOAD_BENCH_ONLY=reloads` runs the reload round trips alone.
    let only_reloads = std::env::var("RELOAD_BENCH_ONLY").is_ok_and(|v| v == "reloads");
    if !only_reloads {
        calls(&empty_root, &big_root, files, rounds);
    }
    let t = Instant::now();
    let big_served = serve(&big_root).await;
    println!(
        "worker on the {files}-file jail: first command {:.1} s after start",
        t.elapsed().as_secs_f64()
    );
    let empty_served = serve(&empty_root).await;
    reloads(&empty_served, &big_served, files, rounds).await;
    if !only_reloads {
        in_flight(&big_served).await;
    }
}
