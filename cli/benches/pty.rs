//! Terminal sessions through the engine (`cargo bench -p iii-shell --bench pty`, release build
//! of the worker and the engine). Every figure is against a reference measured in the same
//! run:
//!
//! - **keystroke at rest**: a one-byte `shell::pty::write` to a session running `cat` until its
//!   echo reaches the consumer, interleaved with the engine's own echo round trip.
//! - **flood**: `cat` of a 64 MiB file in an attached session until the consumer has decoded
//!   the `eof` frame; every byte must arrive, in order. Against the *floor*: a plain engine
//!   client invoking the same kind of consumer function with payloads of exactly the sizes
//!   the session's deliveries had, in the same JSON shape, back to back, with the broker's
//!   in-flight depth per session ([`iii_shell_broker::pty_delivery::IN_FLIGHT`]). Rounds
//!   alternate flood and floor.
//! - **keystroke under flood**: four sessions each `cat` the 64 MiB file to the same consumer
//!   (one page, five panes) while a fifth session echoes keystrokes, interleaved with the
//!   engine's echo round trip under the same load.
//! - the same file in a detached session (the PTY and the ring alone) and through a pipe, and
//!   executor RSS of 100 idle sessions.
//!
//! Each flood round also runs the floor with one more delivery in flight, to show what
//! pipelining would buy and how many deliveries the engine then hands over out of order.
//!
//! Knobs: `PTY_BENCH_N` (keystrokes per measurement, default 500), `PTY_BENCH_ROUNDS` (flood /
//! floor rounds, default 3), `PTY_BENCH_ONLY` (comma-separated of `rest`, `flood`, `contention`,
//! `detached`, `rss`), `PTY_BENCH_LOG` (the worker's `RUST_LOG`, e.g.
//! `info,iii_shell_broker::pty_delivery=trace,iii_shell_executor::pty=trace` for one line per
//! push and per delivery with its answer time) and `PTY_BENCH_LOG_COPY` (where to copy the
//! worker's log before its temporary directory goes).

#[path = "../tests/suite/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use futures_util::StreamExt;
use iii_test_engine::{TestClient, TestEngine};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
const FLOOD_BYTES: usize = 64 * 1024 * 1024;
const MIB: f64 = 1024.0 * 1024.0;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// One decoded delivery, as the consumer saw it.
struct Got {
    sequence: u64,
    data: Vec<u8>,
    truncated: bool,
    eof: bool,
    repeat: bool,
}

type Routes = Arc<
    Mutex<(
        HashMap<String, mpsc::UnboundedSender<Got>>,
        HashMap<String, Vec<Got>>,
    )>,
>;

/// A console page: one output function for every session it shows. Its handler hands each
/// payload to a dispatcher that decodes the base64 (as a page does) and routes it by
/// `session_id`.
struct Page {
    id: String,
    routes: Routes,
    _client: TestClient,
}

impl Page {
    async fn new(engine: &TestEngine, tag: &str) -> Page {
        let id = format!(
            "iii::bench-ui::pty-output::console-{tag}-{}",
            uuid::Uuid::new_v4()
        );
        let client = engine.client().await;
        let (tx, mut rx) = mpsc::unbounded_channel::<Value>();
        client
            .register_function(&id, move |data, _| {
                let _ = tx.send(data);
                async { Ok(json!({})) }
            })
            .await
            .unwrap();
        let routes: Routes = Arc::default();
        let r = routes.clone();
        tokio::spawn(async move {
            while let Some(p) = rx.recv().await {
                let data = p["data"]
                    .as_str()
                    .map(|d| B64.decode(d).expect("data is base64"))
                    .unwrap_or_default();
                let got = Got {
                    sequence: p["sequence"].as_u64().expect("a sequence"),
                    data,
                    truncated: p["truncated"] == true,
                    eof: p["eof"] == true,
                    repeat: p["repeat"] == true,
                };
                let session = p["session_id"].as_str().unwrap_or_default().to_string();
                let mut r = r.lock().unwrap();
                match r.0.get(&session) {
                    Some(tx) => {
                        let _ = tx.send(got);
                    }
                    None => r.1.entry(session).or_default().push(got),
                }
            }
        });
        Page {
            id,
            routes,
            _client: client,
        }
    }

    /// Deliveries of `session` from its first on.
    fn follow(&self, session: &str) -> mpsc::UnboundedReceiver<Got> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut r = self.routes.lock().unwrap();
        for g in r.1.remove(session).unwrap_or_default() {
            let _ = tx.send(g);
        }
        r.0.insert(session.to_string(), tx);
        rx
    }

    fn open(&self, program: &str, args: Value) -> Value {
        json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": self.id,
               "program": program, "args": args})
    }
}

/// What one session's flood delivered, read until its `eof`.
#[derive(Default)]
struct Flood {
    seconds: f64,
    bytes: usize,
    sizes: Vec<usize>,
    gaps: usize,
    in_order: bool,
    all_x: bool,
}

async fn drain_flood(rx: &mut mpsc::UnboundedReceiver<Got>, t: Instant) -> Flood {
    let mut f = Flood {
        in_order: true,
        all_x: true,
        ..Flood::default()
    };
    let mut last = 0;
    loop {
        let g = rx.recv().await.expect("the page is alive");
        if g.repeat || g.sequence <= last && !(g.eof && g.data.is_empty()) {
            f.in_order = false;
        }
        last = last.max(g.sequence);
        f.gaps += g.truncated as usize;
        f.all_x &= g.data.iter().all(|&b| b == b'x');
        f.bytes += g.data.len();
        f.sizes.push(g.data.len());
        if g.eof {
            f.seconds = t.elapsed().as_secs_f64();
            return f;
        }
    }
}

/// The engine carrying the same deliveries from a plain client: payloads of `sizes` bytes in
/// the output function's shape, `depth` in flight, to `page`. Returns the seconds until the
/// consumer has decoded the last, and how many arrived after one with a higher sequence (a
/// page that drops a delivery whose sequence is not above the last it applied would lose
/// those).
async fn floor(caller: &TestClient, page: &Page, sizes: &[usize], depth: usize) -> (f64, usize) {
    let session = format!("floor-{}", uuid::Uuid::new_v4());
    let mut rx = page.follow(&session);
    let x = vec![b'x'; sizes.iter().copied().max().unwrap_or(0)];
    let payloads: Vec<Value> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            json!({"session_id": session, "sequence": i as u64 + 1,
                   "data": (n > 0).then(|| B64.encode(&x[..n])), "eof": i + 1 == sizes.len(),
                   "exit_code": null, "signal": null, "error": null, "truncated": false,
                   "repeat": false})
        })
        .collect();
    let t = Instant::now();
    let sender = futures_util::stream::iter(payloads)
        .map(|p| caller.call(&page.id, p))
        .buffered(depth.max(1))
        .for_each(|r| {
            r.expect("floor invocation");
            async {}
        });
    let total: usize = sizes.iter().sum();
    let receiver = async {
        let (mut got, mut late, mut top) = (0, 0, 0);
        for _ in 0..sizes.len() {
            let g = rx.recv().await.unwrap();
            got += g.data.len();
            late += (g.sequence < top) as usize;
            top = top.max(g.sequence);
        }
        (got, late)
    };
    let ((), (got, late)) = tokio::join!(sender, receiver);
    assert_eq!(got, total);
    (t.elapsed().as_secs_f64(), late)
}

/// Resolves with the seconds from `t` until `session` is listed as exited.
fn watch_exit(client: TestClient, session: Value, t: Instant) -> tokio::task::JoinHandle<f64> {
    tokio::spawn(async move {
        loop {
            let r = client
                .call("shell::pty::sessions", json!({}))
                .await
                .unwrap();
            let done = r["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["session_id"] == session && s["status"].get("exited").is_some());
            if done {
                return t.elapsed().as_secs_f64();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// CPU seconds (user + system) `pid` has used.
fn cpu_s(pid: i32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit_once(')').map(|r| r.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no memory effects.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `(idle + iowait, total)` CPU ticks so far (`/proc/stat`, all CPUs).
fn idle_ticks() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    (
        f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0),
        f.iter().sum(),
    )
}

/// Percent of the CPUs' time idle since `since`.
fn idle_since(since: (u64, u64)) -> f64 {
    let now = idle_ticks();
    100.0 * now.0.saturating_sub(since.0) as f64 / now.1.saturating_sub(since.1).max(1) as f64
}

/// Hypervisor steal in percent of the time since `since` (`/proc/stat`, all CPUs).
fn steal_ticks() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    (f.get(7).copied().unwrap_or(0), f.iter().sum())
}

fn steal_since(since: (u64, u64)) -> f64 {
    let now = steal_ticks();
    let total = now.1.saturating_sub(since.1).max(1);
    100.0 * now.0.saturating_sub(since.0) as f64 / total as f64
}

/// A session running `cat`, its credentials and its deliveries.
struct Echo {
    id: Value,
    key: Value,
    rx: mpsc::UnboundedReceiver<Got>,
}

impl Echo {
    async fn open(caller: &TestClient, page: &Page) -> Echo {
        let s = caller
            .call("shell::pty::open", page.open("cat", json!([])))
            .await
            .unwrap();
        let mut rx = page.follow(s["session_id"].as_str().unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
        while rx.try_recv().is_ok() {}
        Echo {
            id: s["session_id"].clone(),
            key: s["access_key"].clone(),
            rx,
        }
    }

    /// Microseconds from the write of one byte until its echo reached the consumer.
    async fn keystroke(&mut self, caller: &TestClient, i: usize) -> f64 {
        let c = [b'a' + (i % 26) as u8];
        let t = Instant::now();
        caller
            .call(
                "shell::pty::write",
                json!({"session_id": self.id, "access_key": self.key, "data": B64.encode(c)}),
            )
            .await
            .unwrap();
        loop {
            let g = self.rx.recv().await.unwrap();
            if g.data.contains(&c[0]) {
                return t.elapsed().as_secs_f64() * 1e6;
            }
        }
    }
}

async fn echo_rtt(caller: &TestClient) -> f64 {
    let t = Instant::now();
    caller
        .call("bench::echo", json!({"data": "YQ=="}))
        .await
        .unwrap();
    t.elapsed().as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = env("PTY_BENCH_N", 500);
    let rounds = env("PTY_BENCH_ROUNDS", 3);
    let only = std::env::var("PTY_BENCH_ONLY").unwrap_or_default();
    let runs = |what: &str| only.is_empty() || only.split(',').any(|w| w == what);
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    println!(
        "host: {} CPUs ({cpu_model}), load average at start: {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        load().trim()
    );
    let steal0 = steal_ticks();
    // Bulk invocations would otherwise be logged frame by frame by the engine and its clients.
    let engine = TestEngine::builder()
        .keep_invocation_frames(false)
        .start()
        .await;
    let mut cfg = iii_shell_protocol::config::Config::builtin_default();
    cfg.pty.max_sessions = 200;
    let mut wb = Worker::builder().engine(&engine).seed(&cfg);
    if let Ok(filter) = std::env::var("PTY_BENCH_LOG") {
        wb = wb.env("RUST_LOG", &filter);
    }
    let w = wb.start();
    let keep_log = std::env::var("PTY_BENCH_LOG_COPY").ok();
    wait_ready(&engine, &w).await;
    let exec = w.executor_pid().expect("executor pid");
    let broker = children_of(w.pid)
        .into_iter()
        .find(|p| cmdline(*p).is_some_and(|c| c.contains(" broker")))
        .expect("broker pid");

    let echo = engine.client().await;
    echo.register_function("bench::echo", |data, _| async move { Ok(data) })
        .await
        .unwrap();
    let caller = engine.client().await;
    let page = Page::new(&engine, "main").await;

    if runs("rest") {
        let mut s = Echo::open(&caller, &page).await;
        let (mut reference, mut keystroke) = (Vec::new(), Vec::new());
        for i in 0..n {
            reference.push(echo_rtt(&caller).await);
            keystroke.push(s.keystroke(&caller, i).await);
        }
        let (r50, r99) = (pct(&mut reference, 0.5), pct(&mut reference, 0.99));
        let (k50, k99) = (pct(&mut keystroke, 0.5), pct(&mut keystroke, 0.99));
        println!("keystroke at rest, write -> echo at the consumer: p50 {k50:.0} us, p99 {k99:.0} us (n={n})");
        println!("  engine echo round trip, interleaved: p50 {r50:.0} us, p99 {r99:.0} us");
        println!(
            "  added at p50: {:.0} us (goal <= 500 us; a keystroke is two engine legs more than one echo: write in, output out)",
            k50 - r50
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flood");
    std::fs::write(&file, vec![b'x'; FLOOD_BYTES]).unwrap();
    let depth = iii_shell_broker::pty_delivery::IN_FLIGHT;

    if runs("flood") {
        println!(
            "flood: cat of {} MiB in an attached session until the consumer decoded eof, against the floor (a plain client invoking the same sizes, {depth} in flight)",
            FLOOD_BYTES >> 20
        );
        for round in 1..=rounds {
            let (e0, b0, i0) = (cpu_s(exec), cpu_s(broker), idle_ticks());
            let t = Instant::now();
            let f = caller
                .call(
                    "shell::pty::open",
                    page.open("cat", json!([file.to_string_lossy()])),
                )
                .await
                .unwrap();
            let mut rx = page.follow(f["session_id"].as_str().unwrap());
            let exited_in = watch_exit(engine.client().await, f["session_id"].clone(), t);
            let got = drain_flood(&mut rx, t).await;
            let (ecpu, bcpu, idle) = (cpu_s(exec) - e0, cpu_s(broker) - b0, idle_since(i0));
            let program_s = exited_in.await.unwrap();
            let i1 = idle_ticks();
            let (floor_s, _) = floor(&caller, &page, &got.sizes, depth).await;
            let floor_idle = idle_since(i1);
            // What a second delivery in flight would buy (not used: see pty_delivery).
            let (floor2_s, late2) = floor(&caller, &page, &got.sizes, depth + 1).await;
            let mut sizes: Vec<f64> = got.sizes.iter().map(|&s| s as f64).collect();
            let (s50, smax) = (pct(&mut sizes, 0.5), pct(&mut sizes, 1.0));
            let rate = got.bytes as f64 / MIB / got.seconds;
            let floor_rate = got.bytes as f64 / MIB / floor_s;
            println!(
                "  round {round}: session {:.3} s = {rate:.0} MiB/s ({} of {} bytes, {} invocations, size p50 {:.0} KiB max {:.0} KiB, {} gaps, in order {}, bytes intact {}); program exited after {program_s:.3} s; executor CPU {ecpu:.2} s, broker {bcpu:.2} s, CPUs idle {idle:.0} %",
                got.seconds,
                got.bytes,
                FLOOD_BYTES,
                got.sizes.len(),
                s50 / 1024.0,
                smax / 1024.0,
                got.gaps,
                got.in_order,
                got.all_x,
            );
            println!(
                "  round {round}: floor {floor_s:.3} s = {floor_rate:.0} MiB/s (CPUs idle {floor_idle:.0} %); session / floor = {:.2} (goal >= 0.5, and >= 50 MiB/s with every byte); the floor with {} in flight: {:.0} MiB/s, {late2} of {} arrived after a later one",
                rate / floor_rate,
                depth + 1,
                got.bytes as f64 / MIB / floor2_s,
                got.sizes.len()
            );
        }
    }

    if runs("contention") {
        let mut five = Echo::open(&caller, &page).await;
        let mut floods = Vec::new();
        let t = Instant::now();
        for _ in 0..4 {
            let f = caller
                .call(
                    "shell::pty::open",
                    page.open("cat", json!([file.to_string_lossy()])),
                )
                .await
                .unwrap();
            let mut rx = page.follow(f["session_id"].as_str().unwrap());
            floods.push(tokio::spawn(async move { drain_flood(&mut rx, t).await }));
        }
        // Let all four get going.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (mut reference, mut keystroke) = (Vec::new(), Vec::new());
        let mut i = 0;
        while i < n && !floods.iter().any(|f| f.is_finished()) {
            reference.push(echo_rtt(&caller).await);
            keystroke.push(five.keystroke(&caller, i).await);
            i += 1;
        }
        let during = t.elapsed().as_secs_f64();
        let mut total = 0;
        let mut worst = 0.0f64;
        let mut gaps = 0;
        for f in floods {
            let f = f.await.unwrap();
            total += f.bytes;
            gaps += f.gaps;
            worst = worst.max(f.seconds);
        }
        let (r50, r99) = (pct(&mut reference, 0.5), pct(&mut reference, 0.99));
        let (k50, k99) = (pct(&mut keystroke, 0.5), pct(&mut keystroke, 0.99));
        println!(
            "keystroke under flood (four sessions cat {} MiB each to the same page): p50 {k50:.0} us, p99 {k99:.0} us (n={i}, over the first {during:.2} s)",
            FLOOD_BYTES >> 20
        );
        println!("  engine echo round trip under the same load, interleaved: p50 {r50:.0} us, p99 {r99:.0} us");
        println!(
            "  added at p99: {:.0} us (goal <= 5000 us); floods: {:.0} MiB delivered in {worst:.2} s ({:.0} MiB/s together), {gaps} gaps",
            k99 - r99,
            total as f64 / MIB,
            total as f64 / MIB / worst
        );
    }

    if runs("detached") {
        let t = Instant::now();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("cat {} | wc -c", file.display()))
            .output()
            .unwrap();
        let pipe_s = t.elapsed().as_secs_f64();
        assert!(String::from_utf8_lossy(&out.stdout).trim() == FLOOD_BYTES.to_string());
        let d = caller
            .call(
                "shell::pty::open",
                page.open(
                    "sh",
                    json!(["-c", format!("read x; cat {}", file.display())]),
                ),
            )
            .await
            .unwrap();
        caller
            .call(
                "shell::pty::detach",
                json!({"session_id": d["session_id"], "access_key": d["access_key"]}),
            )
            .await
            .unwrap();
        let (e0, b0) = (cpu_s(exec), cpu_s(broker));
        let t0 = Instant::now();
        caller
            .call(
                "shell::pty::write",
                json!({"session_id": d["session_id"], "access_key": d["access_key"], "data": "Cg=="}),
            )
            .await
            .unwrap();
        let detached_s = watch_exit(engine.client().await, d["session_id"].clone(), t0)
            .await
            .unwrap();
        let mib = FLOOD_BYTES as f64 / MIB;
        println!(
            "flood in a detached session (the PTY and the ring alone): {detached_s:.2} s ({:.0} MiB/s); executor used {:.2} s CPU, broker {:.2} s",
            mib / detached_s,
            cpu_s(exec) - e0,
            cpu_s(broker) - b0
        );
        println!(
            "flood reference: cat | wc -c: {pipe_s:.3} s ({:.0} MiB/s)",
            mib / pipe_s
        );
    }

    if runs("rss") {
        let before = rss_kib(exec);
        for _ in 0..100 {
            caller
                .call("shell::pty::open", page.open("sleep", json!(["1000"])))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = rss_kib(exec);
        println!(
            "executor RSS: {before} KiB -> {after} KiB with 100 more idle sessions: {:.1} KiB per session (rings are empty: idle)",
            (after.saturating_sub(before)) as f64 / 100.0
        );
    }
    if let Some(to) = keep_log {
        std::fs::copy(w.dir().join("stderr.log"), &to).expect("copy the worker's log");
        println!("worker log copied to {to}");
    }
    println!(
        "load average at the end: {}; hypervisor steal over the run {:.1} %",
        load().trim(),
        steal_since(steal0)
    );
}
