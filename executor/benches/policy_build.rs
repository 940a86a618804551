//! What a policy build (start-up, every reload, every `iii-shell call`) costs as the jail grows
//! (`cargo bench -p iii-shell-executor --bench policy_build`; it must not grow with the jail). A jail of
//! `POLICY_BENCH_FILES` files (default 1,000,000, in directories of 100, with one protected
//! `.env` per 1,000 directories) against an empty jail, alternating between them,
//! `POLICY_BENCH_ROUNDS` rounds (default 7), medians:
//!
//! - `Policy::build` (start-up, `iii-shell call`), and a reload's `Policy::build_after` the
//!   current policy, keeping the walk's key or changing it. The goal is ≤ 1.2×.
//! - Apart, what commands wait for on their first use: the walk for protected entries and the
//!   ruleset built from it (`Policy::commands_ready`), which runs off the call path.

use std::time::{Duration, Instant};

use iii_shell_executor::policy::Policy;
use iii_shell_protocol::config::Config;

const GOAL: f64 = 1.2;

fn env(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn jailed_json(root: &std::path::Path) -> String {
    let mut c = Config::builtin_default();
    c.fs.host_roots = vec![root.to_string_lossy().into_owned()];
    c.fs.allow_unjailed = false;
    c.confinement.run_as = Some("root".into());
    serde_json::to_string(&c).expect("config json")
}

/// [`jailed_json`] with one more denylist entry: a reload that changes the walk's key.
fn jailed_json_denying(root: &std::path::Path) -> String {
    let mut c: Config = serde_json::from_str(&jailed_json(root)).expect("config");
    c.fs.denylist_paths
        .push(root.join("nothing-here").to_string_lossy().into_owned());
    serde_json::to_string(&c).expect("config json")
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let files = env("POLICY_BENCH_FILES", 1_000_000);
    let rounds = env("POLICY_BENCH_ROUNDS", 7).max(1);
    let empty = tempfile::tempdir().expect("empty jail");
    let big = tempfile::tempdir().expect("big jail");
    let t = Instant::now();
    let dirs = files.div_ceil(100);
    for d in 0..dirs {
        let dir = big.path().join(format!("d{:03}/e{d:05}", d / 1000));
        std::fs::create_dir_all(&dir).expect("dir");
        for f in 0..100.min(files - d * 100) {
            std::fs::write(dir.join(format!("f{f:02}.txt")), b"x\n").expect("file");
        }
        if d % 1000 == 0 {
            std::fs::write(dir.join(".env"), b"SECRET=1\n").expect("protected file");
        }
    }
    println!(
        "jail: {files} files in {dirs} directories, generated in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let (e_json, b_json) = (jailed_json(empty.path()), jailed_json(big.path()));
    let (e_key, b_key) = (
        jailed_json_denying(empty.path()),
        jailed_json_denying(big.path()),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    // The reloads' predecessors, their walks done.
    let (e_prev, b_prev) = (
        Policy::build(1, &e_json).expect("empty policy"),
        Policy::build(1, &b_json).expect("big policy"),
    );
    let walk = |p: &Policy| {
        let t = Instant::now();
        rt.block_on(p.commands_ready()).expect("ruleset");
        t.elapsed()
    };
    walk(&e_prev);
    walk(&b_prev);
    type Build<'a> = Box<dyn Fn(&str, &Policy) -> Policy + 'a>;
    let kinds: [(&str, Build, &str, &str); 3] = [
        (
            "Policy::build",
            Box::new(|j, _| Policy::build(1, j).expect("policy")),
            &e_json,
            &b_json,
        ),
        (
            "reload keeping the walk's key",
            Box::new(|j, prev| Policy::build_after(2, j, Some(prev)).expect("policy")),
            &e_json,
            &b_json,
        ),
        (
            "reload adding a denylist entry",
            Box::new(|j, prev| Policy::build_after(2, j, Some(prev)).expect("policy")),
            &e_key,
            &b_key,
        ),
    ];
    for (name, build, ej, bj) in &kinds {
        let (mut e, mut b) = (Vec::new(), Vec::new());
        for round in 0..rounds + 1 {
            let t = Instant::now();
            let p = build(ej, &e_prev);
            let te = t.elapsed();
            drop(p);
            let t = Instant::now();
            let p = build(bj, &b_prev);
            let tb = t.elapsed();
            drop(p);
            // Round 0 warms the caches.
            if round > 0 {
                e.push(te);
                b.push(tb);
            }
        }
        let (me, mb) = (median(e), median(b));
        let ratio = mb.as_secs_f64() / me.as_secs_f64();
        println!(
            "{name}, median of {rounds}: empty jail {:.2} ms, {files}-file jail {:.2} ms: {ratio:.2}x (goal <= {GOAL}x: {})",
            me.as_secs_f64() * 1e3,
            mb.as_secs_f64() * 1e3,
            if ratio <= GOAL { "met" } else { "NOT MET" }
        );
    }
    // What the first command of a policy waits for, off the call path.
    let (mut e, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds.min(3) {
        e.push(walk(&Policy::build(1, &e_json).expect("policy")));
        b.push(walk(&Policy::build(1, &b_json).expect("policy")));
    }
    println!(
        "off the call path, the walk and the command ruleset (what a policy's first command waits for): empty jail {:.2} ms, {files}-file jail {:.1} ms",
        median(e).as_secs_f64() * 1e3,
        median(b).as_secs_f64() * 1e3,
    );
    println!(
        "command: cargo bench -p iii-shell-executor --bench policy_build   (POLICY_BENCH_FILES={files}, POLICY_BENCH_ROUNDS={rounds})"
    );
}
