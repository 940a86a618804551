//! What a policy build (start-up, every reload, every `iii-shell call`) costs as the jail grows
//! (`cargo bench -p iii-shell-executor --bench policy_build`; issue 27 item 4). A jail of
//! `POLICY_BENCH_FILES` files (default 200,000, in directories of 100, with one protected
//! `.env` per 1,000 directories) against an empty jail, `Policy::build` alternating between
//! them, `POLICY_BENCH_ROUNDS` rounds (default 7), medians. The goal is ≤ 1.2× (today the build
//! scans the roots for protected entries, so it grows with the tree).

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

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let files = env("POLICY_BENCH_FILES", 200_000);
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
    let (mut e, mut b) = (Vec::new(), Vec::new());
    for round in 0..rounds + 1 {
        let t = Instant::now();
        let p = Policy::build(1, &e_json).expect("empty policy");
        let te = t.elapsed();
        drop(p);
        let t = Instant::now();
        let p = Policy::build(1, &b_json).expect("big policy");
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
        "Policy::build, median of {rounds}: empty jail {:.2} ms, {files}-file jail {:.2} ms: {ratio:.1}x (goal <= {GOAL}x: {})",
        me.as_secs_f64() * 1e3,
        mb.as_secs_f64() * 1e3,
        if ratio <= GOAL { "met" } else { "NOT MET" }
    );
}
