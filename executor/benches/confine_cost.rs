//! What per-spawn confinement costs: `/bin/true` spawned and reaped with and without the
//! child-side Landlock + seccomp + no_new_privs + rlimits, interleaved in one run.
//!
//! Run: `cargo bench -p iii-shell-executor --bench confine_cost` (BENCH_ITERS, default 2000;
//! `BENCH_SPECIAL_BITS=1` adds the special-bits rule loaded per spawn against inherited).

use std::time::Instant;

use iii_shell_executor::policy::CommandConfinement;
use iii_shell_launch::reaper::reap;
use iii_shell_launch::spawn::SpawnPlan;
use iii_shell_launch::{Launcher, Settings};
use iii_shell_protocol::config::Config;

fn once(launcher: &Launcher, confinement: Option<&CommandConfinement>) -> f64 {
    let argv = vec!["/bin/true".to_string()];
    let mut plan = SpawnPlan::new(
        "/bin/true",
        &argv,
        Vec::<(String, String)>::new(),
        launcher.dev_null().unwrap(),
        launcher.dev_null().unwrap(),
        launcher.dev_null().unwrap(),
    )
    .unwrap();
    if let Some(c) = confinement {
        plan.confinement = c.child().expect("ruleset");
    }
    let t = Instant::now();
    let child = launcher.spawn(&plan).expect("spawn");
    reap(&child).expect("reap");
    t.elapsed().as_secs_f64() * 1e6
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p) as usize]
}

fn main() {
    // Like the executor: the start-up filter is on the spawning process, so every child
    // (confined or not) inherits it, and only Landlock, no_new_privs and rlimits are applied
    // per spawn.
    if std::env::var_os("BENCH_NO_BASELINE").is_none() {
        let _ = iii_shell_executor::confine::harden_executor(
            &iii_shell_protocol::config::ConfinementConfig::default(),
        );
    }
    let iters: usize = std::env::var("BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    // No job cgroups: the cost measured is the child's confinement alone.
    let launcher = Launcher::new(Settings::plain());
    let jailed = {
        let mut c = Config::builtin_default();
        c.fs.host_roots = vec!["/tmp".into()];
        c.fs.allow_unjailed = false;
        c
    };
    let only = |landlock: bool, seccomp: bool| {
        let mut c = Config::builtin_default();
        c.confinement.landlock = landlock;
        c.confinement.seccomp = seccomp;
        c
    };
    let mut cases = vec![
        ("unjailed (builtin default)", Config::builtin_default()),
        ("jailed to /tmp", jailed),
    ];
    if std::env::var_os("BENCH_BREAKDOWN").is_some() {
        cases.push(("landlock only", only(true, false)));
        cases.push(("seccomp only", only(false, true)));
        cases.push(("nnp + rlimits only", only(false, false)));
    }
    for (name, config) in cases {
        let conf =
            CommandConfinement::build_now(&config, &Default::default()).expect("confinement");
        for _ in 0..200 {
            once(&launcher, None);
            once(&launcher, Some(&conf));
        }
        let (mut plain, mut confined) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
        for _ in 0..iters {
            plain.push(once(&launcher, None));
            confined.push(once(&launcher, Some(&conf)));
        }
        let (p50a, p99a) = (pct(&mut plain, 0.5), pct(&mut plain, 0.99));
        let (p50b, p99b) = (pct(&mut confined, 0.5), pct(&mut confined, 0.99));
        println!(
            "{name}: landlock {} ({} rules), seccomp {} ({})",
            conf.ruleset().expect("ruleset").enforcement.as_str(),
            conf.ruleset().expect("ruleset").rules,
            conf.seccomp.is_some(),
            if conf.seccomp_per_spawn {
                "loaded per spawn"
            } else {
                "inherited from the executor"
            }
        );
        println!("  unconfined  p50 {p50a:7.0} us  p99 {p99a:7.0} us");
        println!("  confined    p50 {p50b:7.0} us  p99 {p99b:7.0} us");
        println!(
            "  cost        p50 {:+7.0} us  ({:.3}x)",
            p50b - p50a,
            p50b / p50a
        );
    }
    if std::env::var_os("BENCH_SPECIAL_BITS").is_some() {
        special_bits(iters);
    }
    println!(
        "command: cargo bench -p iii-shell-executor --bench confine_cost   (iterations: {iters})"
    );
}

/// The special-bits rule loaded by every child (as before the executor held it itself, and still
/// after a reload turns `fs.allow_special_bits` off) against inherited from this process (as
/// the executor now installs it at its first policy), both with Landlock off, interleaved.
fn special_bits(iters: usize) {
    use iii_shell_executor::confine::special_bits;
    let launcher = Launcher::new(Settings::plain());
    let mut c = Config::builtin_default();
    c.confinement.landlock = false;
    let per_spawn = CommandConfinement::build_now(&c, &Default::default()).expect("confinement");
    assert_eq!(per_spawn.special_bits, special_bits::Placement::PerSpawn);
    special_bits::settle(true);
    let mut inherited =
        CommandConfinement::build_now(&c, &Default::default()).expect("confinement");
    inherited
        .replace_special_bits(false, true)
        .expect("placement");
    assert_eq!(inherited.special_bits, special_bits::Placement::Inherited);
    for _ in 0..200 {
        once(&launcher, Some(&per_spawn));
        once(&launcher, Some(&inherited));
    }
    let (mut a, mut b) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    for _ in 0..iters {
        a.push(once(&launcher, Some(&per_spawn)));
        b.push(once(&launcher, Some(&inherited)));
    }
    let (p50a, p99a) = (pct(&mut a, 0.5), pct(&mut a, 0.99));
    let (p50b, p99b) = (pct(&mut b, 0.5), pct(&mut b, 0.99));
    println!("special-bits rule (Landlock off, no_new_privs + rlimits in both):");
    println!("  loaded per spawn      p50 {p50a:7.0} us  p99 {p99a:7.0} us");
    println!("  inherited             p50 {p50b:7.0} us  p99 {p99b:7.0} us");
    println!(
        "  per-spawn load costs  p50 {:+7.0} us  ({:.3}x)",
        p50a - p50b,
        p50a / p50b
    );
}
