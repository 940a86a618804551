//! The whole worker's memory under real work (`cargo bench -p iii-shell --bench memory`,
//! release build of the worker). Prints the proportional set size (Pss, from
//! `/proc/<pid>/smaps_rollup`) of `serve`, the broker and the executor, summed, at four
//! points of one run:
//!
//! - **fresh**: the worker connected and ready, nothing called yet;
//! - **after one burst** (5 s after it, once the worker has settled): 2,000 sequential `shell::exec` calls, 200 concurrent ones, 100 fs
//!   calls and 100 coder calls on a 4,000-file jail, and one attached terminal session that
//!   prints 8 MiB (every byte delivered to a consumer) and is closed;
//! - **after ten bursts** (the long run): the same burst nine more times;
//! - **after idle**: `MEMORY_BENCH_IDLE_S` seconds (default 30) after the work stopped.
//!
//! Pre-started command processes (children of the executor waiting for a command) are not
//! the worker's own memory: they are counted apart, and so are the executor's anonymous and
//! heap pages, which say where the executor's share goes.
//!
//! Knobs: `MEMORY_BENCH_BURSTS` (default 10), `MEMORY_BENCH_IDLE_S` (default 30),
//! `MEMORY_BENCH_SMAPS=1` (print the executor's and the broker's largest mappings at each
//! point), `MEMORY_BENCH_PARTS` (comma-separated of `exec`, `concurrent`, `fs`, `coder`, `pty`:
//! the parts of the burst to run) and `MEMORY_BENCH_HOLD_S` (keep the worker that many seconds
//! more at the end, to look at it).

#[path = "../tests/suite/common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use iii_test_engine::{TestClient, TestEngine};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const COMMAND: &str = "cargo bench -p iii-shell --bench memory";
const GOAL_KIB: u64 = 20_000;
const DRIFT_KIB: u64 = 1_000;
const JAIL_FILES: usize = 4_000;
const PTY_BYTES: usize = 8 * 1024 * 1024;
/// How long after a burst its point is taken: the worker has settled (its heap trim polls
/// every 2 s, `iii_shell::heap::POLL`).
const SETTLE: Duration = Duration::from_secs(5);

/// One `smaps_rollup` field of `pid`, in KiB.
fn rollup_kib(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Each mapping of `pid` with its Pss in KiB: (name, KiB), `[anon]` for unnamed ones.
fn mappings(pid: i32) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut maps = Vec::new();
    let mut name = String::new();
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            name = line
                .split_whitespace()
                .nth(5)
                .unwrap_or("[anon]")
                .to_string();
        } else if let Some(v) = line.strip_prefix("Pss:") {
            let kib = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            maps.push((name.clone(), kib));
        }
    }
    maps
}

/// The heap mapping's Pss of `pid` (`[heap]`, glibc's main arena), in KiB.
fn heap_kib(pid: i32) -> u64 {
    mappings(pid)
        .into_iter()
        .filter(|(n, _)| n == "[heap]")
        .map(|(_, k)| k)
        .sum()
}

/// The `MEMORY_BENCH_SMAPS` view: the eight largest mappings of `pid` by Pss.
fn largest_mappings(pid: i32) -> Vec<String> {
    let mut maps = mappings(pid);
    maps.sort_by_key(|m| std::cmp::Reverse(m.1));
    maps.into_iter()
        .take(8)
        .map(|(n, k)| format!("{n} {k} KiB"))
        .collect()
}

fn threads(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

struct Pids {
    serve: i32,
    broker: i32,
    executor: i32,
}

/// One measurement point.
struct Point {
    serve: u64,
    broker: u64,
    executor: u64,
    prestarted: u64,
    executor_anon: u64,
    executor_heap: u64,
    executor_threads: usize,
    broker_threads: usize,
}

impl Point {
    fn take(p: &Pids) -> Point {
        // The executor's children that are not the worker: pre-started command processes
        // (and anything still running, which at a measurement point is nothing else).
        let prestarted = children_of(p.executor)
            .into_iter()
            .map(|c| rollup_kib(c, "Pss:"))
            .sum();
        Point {
            serve: rollup_kib(p.serve, "Pss:"),
            broker: rollup_kib(p.broker, "Pss:"),
            executor: rollup_kib(p.executor, "Pss:"),
            prestarted,
            executor_anon: rollup_kib(p.executor, "Pss_Anon:"),
            executor_heap: heap_kib(p.executor),
            executor_threads: threads(p.executor),
            broker_threads: threads(p.broker),
        }
    }

    fn total(&self) -> u64 {
        self.serve + self.broker + self.executor
    }

    fn print(&self, what: &str, p: &Pids) {
        println!(
            "{what:>16}: {:6.1} MB total (serve {:.1}, broker {:.1}, executor {:.1}; executor anon {:.1}, heap {:.1}; threads broker {} executor {}); pre-started apart: {:.1} MB",
            mb(self.total()),
            mb(self.serve),
            mb(self.broker),
            mb(self.executor),
            mb(self.executor_anon),
            mb(self.executor_heap),
            self.broker_threads,
            self.executor_threads,
            mb(self.prestarted),
        );
        if std::env::var_os("MEMORY_BENCH_SMAPS").is_some() {
            println!("    executor: {}", largest_mappings(p.executor).join(", "));
            println!("    broker:   {}", largest_mappings(p.broker).join(", "));
        }
    }
}

/// KiB as decimal megabytes (the goal's unit).
fn mb(kib: u64) -> f64 {
    kib as f64 * 1024.0 / 1e6
}

/// A jail of `JAIL_FILES` small source-like files in 40 folders, and one 8 MiB file the
/// terminal session prints.
fn make_jail(root: &Path) {
    for d in 0..40 {
        let dir = root.join(format!("src/m{d:02}"));
        std::fs::create_dir_all(&dir).expect("jail dir");
        for f in 0..JAIL_FILES / 40 {
            let body = format!(
                "// module {d} file {f}\nfn item_{d}_{f}() -> u32 {{\n    {f}\n}}\n{}",
                "// filler line of a source file\n".repeat(20)
            );
            std::fs::write(dir.join(format!("f{f:03}.rs")), body).expect("jail file");
        }
    }
    let line = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+/\n";
    let mut big = String::with_capacity(PTY_BYTES + line.len());
    while big.len() < PTY_BYTES {
        big.push_str(line);
    }
    big.truncate(PTY_BYTES);
    std::fs::write(root.join("big.txt"), big).expect("big file");
}

async fn ok(c: &TestClient, f: &str, data: Value) -> Value {
    match c.call(f, data).await {
        Ok(v) => v,
        Err(e) => panic!("{f}: {e:?}"),
    }
}

/// The burst: every call must succeed, and the terminal's bytes must all arrive.
async fn burst(
    engine: &TestEngine,
    caller: &Arc<TestClient>,
    root: &Path,
    page_id: &str,
    page_rx: &mut mpsc::UnboundedReceiver<Value>,
) {
    let cwd = root.to_string_lossy().into_owned();
    let parts = std::env::var("MEMORY_BENCH_PARTS").unwrap_or_default();
    let part = |p: &str| parts.is_empty() || parts.split(',').any(|w| w == p);
    for i in 0..if part("exec") { 2_000 } else { 0 } {
        let r = ok(
            caller,
            "shell::exec",
            json!({"command": "/bin/echo", "args": [format!("call {i}")], "cwd": cwd}),
        )
        .await;
        assert_eq!(r["exit_code"], 0, "exec {i}: {r}");
    }
    let mut set = tokio::task::JoinSet::new();
    for i in 0..if part("concurrent") { 200 } else { 0 } {
        let c = caller.clone();
        let cwd = cwd.clone();
        set.spawn(async move {
            let r = ok(
                &c,
                "shell::exec",
                json!({"command": "/bin/echo", "args": [format!("concurrent {i}")], "cwd": cwd}),
            )
            .await;
            assert_eq!(r["exit_code"], 0, "concurrent exec {i}: {r}");
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("concurrent exec task");
    }
    for i in 0..if part("fs") { 100 } else { 0 } {
        let d = i % 40;
        let f = format!("src/m{d:02}/f{:03}.rs", i % (JAIL_FILES / 40));
        match i % 4 {
            0 => {
                ok(
                    caller,
                    "shell::fs::ls",
                    json!({"path": format!("src/m{d:02}")}),
                )
                .await
            }
            1 => ok(caller, "shell::fs::read", json!({"path": f})).await,
            2 => ok(caller, "shell::fs::stat", json!({"path": f})).await,
            _ => {
                ok(
                    caller,
                    "shell::fs::grep",
                    json!({"path": "src", "pattern": format!("item_{d}_"), "recursive": true}),
                )
                .await
            }
        };
    }
    for i in 0..if part("coder") { 100 } else { 0 } {
        let d = i % 40;
        let f = format!("src/m{d:02}/f{:03}.rs", i % (JAIL_FILES / 40));
        match i % 4 {
            0 => ok(caller, "coder::read-file", json!({"path": f})).await,
            1 => {
                ok(
                    caller,
                    "coder::list-folder",
                    json!({"path": format!("src/m{d:02}")}),
                )
                .await
            }
            2 => ok(caller, "coder::tree", json!({"path": "src"})).await,
            _ => {
                ok(
                    caller,
                    "coder::search",
                    json!({"query": format!("item_{d}_{i}"), "path": "src"}),
                )
                .await
            }
        };
    }
    // One attached terminal session printing 8 MiB, every delivery consumed, then closed.
    if !part("pty") {
        return;
    }
    let s = ok(
        caller,
        "shell::pty::open",
        json!({"cwd": cwd, "cols": 120, "rows": 40, "output_function_id": page_id,
               "program": "cat", "args": [root.join("big.txt").to_string_lossy()]}),
    )
    .await;
    let session = s["session_id"].as_str().expect("a session id").to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut bytes = 0usize;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let p = match tokio::time::timeout(left, page_rx.recv()).await {
            Ok(Some(p)) => p,
            _ => panic!("the terminal's output stopped after {bytes} bytes"),
        };
        if p["session_id"] != session.as_str() {
            continue;
        }
        if let Some(d) = p["data"].as_str() {
            // base64: 4 characters per 3 bytes, less the padding.
            let pad = d.bytes().rev().take_while(|b| *b == b'=').count();
            bytes += d.len() / 4 * 3 - pad;
        }
        if p["eof"] == true {
            break;
        }
    }
    // The PTY turns LF into CRLF: the client sees at least the file's bytes.
    assert!(
        bytes >= PTY_BYTES,
        "terminal delivered {bytes} of {PTY_BYTES}"
    );
    let _ = caller
        .call(
            "shell::pty::close",
            json!({"session_id": session, "access_key": s["access_key"]}),
        )
        .await;
    let _ = engine;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bursts: usize = std::env::var("MEMORY_BENCH_BURSTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let idle_s: u64 = std::env::var("MEMORY_BENCH_IDLE_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!("{COMMAND}: host {cpus} CPUs; {bursts} bursts, then {idle_s} s idle");

    let jail = tempdir();
    let root = canon(jail.path());
    make_jail(&root);
    let engine = TestEngine::builder()
        .keep_invocation_frames(false)
        .start()
        .await;
    let w = Worker::builder()
        .engine(&engine)
        .seed(&jailed(&root))
        .start();
    wait_ready(&engine, &w).await;
    let executor = w.executor_pid().expect("executor pid");
    let broker = children_of(w.pid)
        .into_iter()
        .find(|p| cmdline(*p).is_some_and(|c| c.contains(" broker")))
        .expect("broker pid");
    let pids = Pids {
        serve: w.pid,
        broker,
        executor,
    };

    // The terminal's consumer: every delivery is answered at once.
    let page = engine.client().await;
    let page_id = "iii::bench-ui::pty-output::console-memory".to_string();
    let (tx, mut page_rx) = mpsc::unbounded_channel::<Value>();
    page.register_function(&page_id, move |data, _| {
        let _ = tx.send(data);
        async { Ok(json!({})) }
    })
    .await
    .expect("register the terminal consumer");
    let caller = Arc::new(engine.client().await);

    tokio::time::sleep(Duration::from_secs(2)).await;
    let fresh = Point::take(&pids);
    fresh.print("fresh", &pids);

    let t = Instant::now();
    burst(&engine, &caller, &root, &page_id, &mut page_rx).await;
    let took = t.elapsed();
    tokio::time::sleep(SETTLE).await;
    let one = Point::take(&pids);
    one.print("after 1 burst", &pids);
    println!("    (one burst took {:.1} s)", took.as_secs_f64());

    for i in 1..bursts {
        burst(&engine, &caller, &root, &page_id, &mut page_rx).await;
        if i + 1 < bursts {
            let p = Point::take(&pids);
            println!(
                "{:>16}: {:6.1} MB (at once, before the worker settles)",
                format!("after {}", i + 1),
                mb(p.total())
            );
        }
    }
    tokio::time::sleep(SETTLE).await;
    let ten = Point::take(&pids);
    ten.print(&format!("after {bursts} bursts"), &pids);

    tokio::time::sleep(Duration::from_secs(idle_s)).await;
    let idle = Point::take(&pids);
    idle.print(&format!("after {idle_s} s idle"), &pids);

    if let Some(hold) = std::env::var("MEMORY_BENCH_HOLD_S")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        println!(
            "holding {hold} s: executor {}, broker {}",
            pids.executor, pids.broker
        );
        tokio::time::sleep(Duration::from_secs(hold)).await;
    }
    let peak = [fresh.total(), one.total(), ten.total(), idle.total()]
        .into_iter()
        .max()
        .unwrap_or(0);
    let drift = ten.total() as i64 - one.total() as i64;
    println!(
        "goal: every point <= 20 MB: {} (highest {:.1} MB); long run within 1 MB of one burst: {} ({:+.2} MB); executor after idle {:.1} MB (after the long run {:.1} MB)",
        if peak <= GOAL_KIB { "met" } else { "MISSED" },
        mb(peak),
        if drift.unsigned_abs() <= DRIFT_KIB { "met" } else { "MISSED" },
        drift as f64 * 1024.0 / 1e6,
        mb(idle.executor),
        mb(ten.executor),
    );
}
