//! What the change feed and the turn history cost, through the engine (the in-process test
//! engine, one `iii-shell serve`):
//!
//! * **Watcher set-up** on a tree of `BENCH_FILES` files (default 100,000, in directories of
//!   100): the time from `registertrigger` to the accepted `triggerregistrationresult`, and the
//!   executor's RSS before and after, against a binding on an empty directory in the same run.
//! * **Pre-image cost** of `coder::update-file` (one insert into a ~10 KiB file): the mean
//!   and p50 call time over `BENCH_ITERS` calls (default 200) with no turn open, then with a
//!   turn open (the executor keeps the pre-image and the after-revision in the turn store),
//!   interleaved in rounds so host noise hits both alike. Since coder changes made outside a
//!   turn are recorded too (one-call turns of `shell.outside-turns`), both sides record; the
//!   numbers in BENCHMARKS.md from before that compare against a call that recorded nothing.
//!
//! Run with `cargo bench -p iii-shell --bench change_feed_cost`. Results are recorded
//! in BENCHMARKS.md ("Change feed").

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use iii_shell_protocol::config::Config;
use iii_test_engine::{TestClient, TestEngine};
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_iii-shell");

fn env_usize(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The executor: the child of the worker whose command line says `executor`.
fn executor_pid(worker: u32) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{worker}/task/{worker}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains("executor"))
                .unwrap_or(false)
        })
}

async fn bind(engine: &TestEngine, binder: &TestClient, id: &str, path: &str) -> Duration {
    let t0 = Instant::now();
    binder.register_trigger(
        id,
        "shell::changed",
        "bench::on-changed",
        json!({"path": path}),
    );
    let ok = engine
        .wait_until(Duration::from_secs(600), |e| {
            e.trigger_registration_results().iter().any(|r| r.id == id)
        })
        .await;
    let took = t0.elapsed();
    let r = engine
        .trigger_registration_results()
        .into_iter()
        .find(|r| r.id == id);
    assert!(
        ok && r.as_ref().is_some_and(|r| r.error.is_none()),
        "binding {id} refused: {r:?}"
    );
    took
}

async fn call(c: &TestClient, f: &str, v: Value) -> Value {
    c.call(f, v).await.unwrap_or_else(|e| panic!("{f}: {e:?}"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let files = env_usize("BENCH_FILES", 100_000);
    let iters = env_usize("BENCH_ITERS", 200);
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let root = base.join("root");
    let tree = root.join("tree");
    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    for i in 0..files {
        let d = tree.join(format!("d{:04}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&d).unwrap();
        }
        std::fs::write(d.join(format!("f{i}.txt")), "x").unwrap();
    }
    let dirs = files.div_ceil(100);
    let mut config = Config::default();
    config.fs.host_roots = vec![root.to_string_lossy().into_owned()];
    config.fs.allow_unjailed = false;
    // The temp dirs are root's: act as root (unset, the executor would act as nobody).
    config.confinement.run_as = Some("root".into());
    config.turns.data_dir = base.join("turns").to_string_lossy().into_owned();
    let seed = base.join("seed.yaml");
    std::fs::write(&seed, serde_norway::to_string(&config).unwrap()).unwrap();
    let engine = TestEngine::start().await;
    let mut child = Command::new(EXE)
        .args(["serve", "--config"])
        .arg(&seed)
        .env("III_URL", engine.url())
        .env("RUST_LOG", "warn")
        .current_dir(&base)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = engine
        .wait_until(Duration::from_secs(30), |e| {
            e.trigger_types().iter().any(|t| t.id == "shell::changed")
        })
        .await;
    assert!(ready, "the worker never registered shell::changed");
    let binder = engine.client().await;
    binder
        .register_function("bench::on-changed", |_, _| async { Ok(json!({})) })
        .await
        .unwrap();
    let exec = executor_pid(child.id()).expect("executor pid");

    // ---- watcher set-up ----
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss0 = rss_kib(exec);
    let t_empty = bind(&engine, &binder, "empty", &empty.to_string_lossy()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss1 = rss_kib(exec);
    let t_tree = bind(&engine, &binder, "tree", &tree.to_string_lossy()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss2 = rss_kib(exec);
    println!(
        "watcher set-up: {files} files in {dirs} directories: {:.1} ms (empty directory: {:.1} ms, {:.0}x); executor RSS {rss1} -> {rss2} KiB (+{} KiB; the empty-directory watcher added {} KiB)",
        t_tree.as_secs_f64() * 1000.0,
        t_empty.as_secs_f64() * 1000.0,
        t_tree.as_secs_f64() / t_empty.as_secs_f64().max(1e-9),
        rss2.saturating_sub(rss1),
        rss1.saturating_sub(rss0),
    );
    binder.send_raw(
        json!({"type": "unregistertrigger", "id": "tree", "trigger_type": "shell::changed"}),
    );
    binder.send_raw(
        json!({"type": "unregistertrigger", "id": "empty", "trigger_type": "shell::changed"}),
    );

    // ---- pre-image cost of coder::update-file ----
    let caller = engine.client().await;
    let body: String = (0..200)
        .map(|i| format!("line {i} of the file being edited\n"))
        .collect();
    std::fs::write(root.join("edit.txt"), &body).unwrap();
    let edit = json!({"files": [{"path": "edit.txt", "ops": [{"op": "insert", "at_line": 1, "content": "x\n"}]}]});
    for _ in 0..20 {
        call(&caller, "coder::update-file", edit.clone()).await;
    }
    let (mut none, mut open) = (Vec::new(), Vec::new());
    let rounds = 10;
    for round in 0..rounds {
        for turn_open in [false, true] {
            let turn = format!("t{round}");
            if turn_open {
                call(
                    &caller,
                    "shell::turns::on-turn-started",
                    json!({"session_id": "bench", "turn_id": turn}),
                )
                .await;
            }
            for _ in 0..iters / rounds {
                let t0 = Instant::now();
                let v = call(&caller, "coder::update-file", edit.clone()).await;
                let took = t0.elapsed();
                assert_eq!(v["results"][0]["success"], true, "{v}");
                if turn_open {
                    open.push(took)
                } else {
                    none.push(took)
                }
            }
            if turn_open {
                call(
                    &caller,
                    "shell::turns::on-turn-completed",
                    json!({"session_id": "bench", "turn_id": turn}),
                )
                .await;
            }
        }
    }
    let list = call(
        &caller,
        "shell::turns::list",
        json!({"session_id": "bench"}),
    )
    .await;
    assert_eq!(
        list["turns"].as_array().map(Vec::len),
        Some(rounds),
        "{list}"
    );
    assert_eq!(list["turns"][0]["file_count"], 1, "{list}");
    let stats = |v: &mut Vec<Duration>| {
        v.sort();
        let mean = v.iter().sum::<Duration>() / v.len() as u32;
        (mean, v[v.len() / 2])
    };
    let ((mn, pn), (mo, po)) = (stats(&mut none), stats(&mut open));
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "coder::update-file (~{} KiB file), {} calls each: no turn open mean {:.0} us p50 {:.0} us; turn open mean {:.0} us p50 {:.0} us; pre-image overhead {:+.0} us mean ({:.2}x), {:+.0} us p50 ({:.2}x)",
        body.len() / 1024,
        none.len(),
        us(mn), us(pn), us(mo), us(po),
        us(mo) - us(mn), us(mo) / us(mn),
        us(po) - us(pn), us(po) / us(pn),
    );
    let _ = child.kill();
    let _ = child.wait();
}
