//! Spawn-path benchmark: a raw `posix_spawn` of `/bin/true` against a full `shell::exec`
//! through the broker library and a real executor process, measured interleaved in one run.
//!
//! Run with `cargo bench -p iii-shell --bench spawn_path` (builds the `iii-shell`
//! binary too); `BENCH_ITERS=200` makes a quick run. Results are recorded in BENCHMARKS.md.
//! `BENCH_BASELINE_EXE=<an iii-shell binary of another build>` first runs this build's
//! executor against that one in rotation; `BENCH_BASELINE_ONLY=1` stops after that.
//! `BENCH_EXE=<an iii-shell binary>` swaps the main executor. `BENCH_RUN_AS=<user|uid[:gid]>`
//! jails the executors to a fresh directory with that `confinement.run_as` (as root: the
//! executor switches to that user); `BENCH_NO_PRESTART=1` starts them with `--no-prestart`
//! (every command through the fallback spawn path); `BENCH_BASELINE_RUN_AS` gives the
//! baseline executor another `confinement.run_as` (the same binary as both, for the uid switch).
//! `BENCH_KINDS_ONLY=1` runs only the spaced comparison of `shell::exec`, `shell::exec_bg` and
//! `shell::pty::open`. The last rows compare telemetry on and off and measure the worker's memory with it on;
//! `BENCH_TELEMETRY_ONLY=1` runs only those. `BENCH_NETWORK_ONLY=1` runs only the per-spawn
//! cost of each `confinement.network` mode.

use std::ffi::CString;
use std::future::Future;
use std::ops::Not;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iii_shell::spawn_executor::spawn_executor_with;
use iii_shell_broker::functions::{dispatch, CallMeta};
use iii_shell_broker::services::Services;
use iii_shell_broker::telemetry;
use iii_shell_broker::telemetry::propagation::Carrier;
use iii_shell_broker::validate::exec_request_with;
use iii_shell_executor::policy::Policy;
use iii_shell_executor::prepare::prepare;
use iii_shell_launch::reaper::reap;
use iii_shell_launch::spawn::SpawnPlan;
use iii_shell_launch::{Launcher, Settings};
use iii_shell_policy::denylist::Denylist;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::messages::{ExecSpec, Request};
use serde_json::{json, Value};

const COMMAND: &str = "cargo bench -p iii-shell --bench spawn_path";
const EXE: &str = env!("CARGO_BIN_EXE_iii-shell");
const TRUE: &str = "/bin/true";
const WARMUP: usize = 200;
const FAT_JOBS: usize = 16;
const FAT_BYTES: usize = 1 << 20;
const FAT_PARENT_MIB: usize = 256;
const FORK_ITERS: usize = 50;
const GOAL: f64 = 1.2;
/// The trace the telemetry rows' calls continue.
const BENCH_TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// What telemetry may add to a foreground exec at p50.
const TELEMETRY_GOAL_US: f64 = 100.0;

fn main() {
    // Executor logs at warn unless the caller asked otherwise (set before any thread exists).
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "warn");
    }
    let iters: usize = std::env::var("BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(2000);
    let warmup = WARMUP.min(iters);

    println!("command: {COMMAND}   (BENCH_ITERS={iters}, warm-up {warmup})");
    println!("iii-shell binary: {EXE}");
    println!("machine: {}", machine_facts());
    println!();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let respawn_iters = iters.min(300);
    if std::env::var_os("BENCH_TELEMETRY_ONLY").is_some() {
        rt.block_on(telemetry_only(iters, warmup));
        return;
    }
    if std::env::var_os("BENCH_KINDS_ONLY").is_some() {
        rt.block_on(async {
            let (config, _jail) = bench_config();
            let (services, mut child, _) = start_executor(&config, &bench_executor_args()).await;
            spawn_kinds(&services, (iters / 10).max(40)).await;
            drop(services);
            wait_or_kill(&mut child, Duration::from_secs(5));
        });
        return;
    }
    if std::env::var_os("BENCH_NETWORK_ONLY").is_some() {
        rt.block_on(network_modes((iters / 4).max(40)));
        return;
    }
    if std::env::var_os("BENCH_RESPAWN_ONLY").is_some() {
        rt.block_on(respawn_comparison(respawn_iters));
        return;
    }
    rt.block_on(bench(iters, warmup));
    rt.block_on(respawn_comparison(respawn_iters));
    drop(rt);

    fork_vs_posix_spawn();
    println!();
    println!("command: {COMMAND}");
}

async fn bench(iters: usize, warmup: usize) {
    standalone_rss();

    let (config, _jail) = bench_config();
    let extra = bench_executor_args();
    let (services, mut child, executor_pid) = start_executor(&config, &extra).await;
    println!(
        "configuration: {}; executor arguments: {extra:?}",
        match &config.confinement.run_as {
            Some(u) => format!("jailed, confinement.run_as {u}"),
            None => "the built-in default".into(),
        }
    );
    let mut rss = vec![(
        "idle, right after start-up + SetPolicy",
        vm_rss_kib(executor_pid),
    )];
    println!(
        "executor pid {executor_pid}, job cgroups: {}",
        job_cgroups(executor_pid)
    );
    println!();

    let raw = RawSpawn::new(TRUE);
    let payload = json!({"command": TRUE, "args": []});

    if let Some(baseline) = std::env::var_os("BENCH_BASELINE_EXE") {
        baseline_comparison(
            (&services, executor_pid),
            &config,
            &raw,
            &payload,
            (Path::new(&baseline), &extra),
            iters,
            warmup,
        )
        .await;
        if std::env::var_os("BENCH_BASELINE_ONLY").is_some() {
            drop(services);
            wait_or_kill(&mut child, Duration::from_secs(5));
            return;
        }
    }

    let idle = compare(&services, &raw, &payload, iters, warmup).await;
    idle.print(&format!(
        "idle executor, {iters} iterations each, interleaved"
    ));
    rss.push(("after the idle run", vm_rss_kib(executor_pid)));

    let jobs = start_fat_jobs(&services).await;
    rss.push((
        "with 16 jobs holding 1 MiB of stdout each",
        vm_rss_kib(executor_pid),
    ));
    let fat = compare(&services, &raw, &payload, iters, warmup).await;
    fat.print(&format!(
        "executor holding {FAT_JOBS} jobs x 1 MiB output, {iters} iterations each, interleaved"
    ));
    for id in &jobs {
        let r = call(&services, "shell::kill", json!({ "job_id": id })).await;
        assert_eq!(r["killed"], json!(true), "kill {id}: {r}");
    }
    rss.push(("after shell::kill of the 16 jobs", vm_rss_kib(executor_pid)));

    println!("executor RSS (VmRSS of pid {executor_pid}):");
    for (what, kib) in &rss {
        println!("  {what:<44} {}", fmt_kib(*kib));
    }
    println!();

    let stage_iters = (iters / 4).max(50);
    stages(&services, &config, &raw, &payload, stage_iters).await;

    // As an agent calls: one command at a time with pauses between them. This is where a
    // child joining its cgroup by a write to cgroup.procs paid an RCU grace period.
    let spaced_n = (iters / 10).max(40);
    let spaced = compare_spaced(&services, &raw, &payload, spaced_n, SPACING).await;
    spaced.print(&format!(
        "spaced calls ({spaced_n} each, {} ms pause before every call)",
        SPACING.as_millis()
    ));

    spawn_kinds(&services, spaced_n).await;

    // How much of the gap is Landlock: the same path with the command ruleset switched off.
    let mut no_landlock = config.clone();
    no_landlock.confinement.landlock = false;
    set_policy(&services, 2, &no_landlock).await;
    let unlandlocked = compare(&services, &raw, &payload, (iters / 2).max(50), warmup / 4).await;
    unlandlocked.print(&format!(
        "idle executor, confinement.landlock: false (for comparison only), {} iterations",
        (iters / 2).max(50)
    ));
    set_policy(&services, 3, &config).await;

    // How much pre-started command processes save: a second executor with them switched off,
    // the two and the raw spawn taking turns.
    let without = prestart_comparison(
        &services,
        executor_pid,
        &config,
        &raw,
        &payload,
        (iters / 2).max(50),
        warmup / 4,
    )
    .await;

    // Last: it installs the process's telemetry hub (every row above ran without one).
    telemetry_comparison(&services, &raw, &payload, iters, warmup).await;

    println!("summary (goal: iii/raw <= {GOAL:.2} at p50, idle and with the fat jobs):");
    for (name, c, judged) in [
        ("idle", &idle, true),
        ("16 fat jobs", &fat, true),
        ("spaced", &spaced, false),
        ("no landlock", &unlandlocked, false),
        ("no prestart", &without, false),
    ] {
        let r50 = c.iii.p50 / c.raw.p50;
        let verdict = match (judged, r50 <= GOAL) {
            (false, _) => "context",
            (true, true) => "MET",
            (true, false) => "NOT MET",
        };
        let steal = c.steal.map_or("n/a".to_string(), |p| format!("{p:.1}%"));
        println!(
            "  {name:<12} p50 {:.1} vs {:.1} us -> {r50:.3}x ({verdict}); p99 {:.1} vs {:.1} us -> {:.2}x; steal {steal}",
            c.iii.p50,
            c.raw.p50,
            c.iii.p99,
            c.raw.p99,
            c.iii.p99 / c.raw.p99
        );
    }
    println!();

    // Closing the connection makes the executor shut down.
    drop(services);
    wait_or_kill(&mut child, Duration::from_secs(5));
}

/// Raw posix_spawn of one program, no file actions, the bench's own environment.
struct RawSpawn {
    path: CString,
}

impl RawSpawn {
    fn new(path: &str) -> RawSpawn {
        RawSpawn {
            path: CString::new(path).expect("path"),
        }
    }

    fn argv(&self) -> [*mut libc::c_char; 2] {
        [
            self.path.as_ptr() as *mut libc::c_char,
            std::ptr::null_mut(),
        ]
    }

    /// posix_spawn + waitpid; returns the elapsed time.
    fn run(&self) -> Duration {
        let argv = self.argv();
        let mut pid: libc::pid_t = 0;
        let start = Instant::now();
        // SAFETY: path and argv are NUL-terminated and outlive the call; environ is the
        // process environment; null file actions and attributes mean the defaults.
        let rc = unsafe {
            libc::posix_spawn(
                &mut pid,
                self.path.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                argv.as_ptr(),
                libc::environ as *const *mut libc::c_char,
            )
        };
        assert_eq!(
            rc,
            0,
            "posix_spawn: {}",
            std::io::Error::from_raw_os_error(rc)
        );
        wait_success(pid);
        start.elapsed()
    }

    /// fork + execve + waitpid; returns the elapsed time.
    fn run_fork(&self) -> Duration {
        let argv = self.argv();
        let start = Instant::now();
        // SAFETY: the child only calls execve and _exit, both async-signal-safe.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above; the pointers were prepared before the fork.
            unsafe {
                libc::execve(
                    self.path.as_ptr(),
                    argv.as_ptr() as *const *const libc::c_char,
                    libc::environ as *const *const libc::c_char,
                );
                libc::_exit(127);
            }
        }
        assert!(pid > 0, "fork: {}", std::io::Error::last_os_error());
        wait_success(pid);
        start.elapsed()
    }
}

fn wait_success(pid: libc::pid_t) {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child, writing into a local int.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::EINTR), "waitpid: {e}");
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x}"
    );
}

/// One `shell::exec` through the full broker → executor path. With a telemetry hub on (the
/// telemetry rows), wrapped as the engine link wraps an invocation: its span in the caller's
/// trace, started before and ended after the handler.
async fn iii_exec(services: &Arc<Services>, payload: &Value) -> Duration {
    let start = Instant::now();
    let r = match telemetry::active() {
        Some(hub) => {
            let carrier = Carrier {
                traceparent: Some(BENCH_TRACEPARENT.into()),
                baggage: None,
            };
            let call = hub.start_call("shell::exec", &carrier, payload, 200);
            let r = call
                .run(dispatch(
                    services,
                    "shell::exec",
                    payload.clone(),
                    CallMeta::default(),
                ))
                .await;
            let answered = r
                .clone()
                .map_err(iii_shell_broker::engine::frames::ErrorBody::from);
            call.finish(&answered, 300);
            r
        }
        None => {
            dispatch(
                services,
                "shell::exec",
                payload.clone(),
                CallMeta::default(),
            )
            .await
        }
    };
    let elapsed = start.elapsed();
    match r {
        Ok(v) if v["exit_code"] == json!(0) => elapsed,
        other => panic!("shell::exec /bin/true: {other:?}"),
    }
}

async fn call(services: &Arc<Services>, function: &str, payload: Value) -> Value {
    match dispatch(services, function, payload, CallMeta::default()).await {
        Ok(v) => v,
        Err(e) => panic!("{function}: {} {}", e.code, e.message),
    }
}

struct Comparison {
    raw: Stats,
    iii: Stats,
    /// The hypervisor's share of all CPU time while it was measured (see [`Steal`]).
    steal: Option<f64>,
}

impl Comparison {
    fn print(&self, title: &str) {
        println!("{title}:");
        print_header();
        print_row("raw posix_spawn + waitpid", &self.raw);
        print_row("iii-shell shell::exec", &self.iii);
        println!(
            "  ratio iii/raw: p50 {:.2}x, p99 {:.2}x   (goal <= {GOAL:.2}x at p50)",
            self.iii.p50 / self.raw.p50,
            self.iii.p99 / self.raw.p99
        );
        println!("  host: {}", fmt_steal(self.steal));
        println!();
    }
}

/// How much CPU time the hypervisor took from this VM ("steal" in `/proc/stat`) since a
/// snapshot, as a share of all CPU time: a busy host shows here, and it makes every
/// cross-process wake-up dearer.
#[derive(Clone, Copy)]
struct Steal {
    steal: u64,
    total: u64,
}

impl Steal {
    fn now() -> Option<Steal> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|v| v.parse().ok())
            .collect::<Option<_>>()?;
        Some(Steal {
            steal: *f.get(7)?,
            total: f.iter().sum(),
        })
    }

    /// Percent of all CPU time since `start` that was stolen.
    fn since(start: Option<Steal>) -> Option<f64> {
        let (a, b) = (start?, Steal::now()?);
        let total = b.total.checked_sub(a.total).filter(|&t| t > 0)?;
        Some(b.steal.saturating_sub(a.steal) as f64 * 100.0 / total as f64)
    }
}

fn fmt_steal(steal: Option<f64>) -> String {
    match steal {
        Some(p) => format!("hypervisor steal {p:.1}% of CPU time during this measurement"),
        None => "hypervisor steal n/a".into(),
    }
}

/// Raw and iii alternately, the order flipping every pair (ABBA…), after a shared warm-up.
async fn compare(
    services: &Arc<Services>,
    raw: &RawSpawn,
    payload: &Value,
    iters: usize,
    warmup: usize,
) -> Comparison {
    interleave(services, raw, payload, warmup).await;
    let steal = Steal::now();
    let (r, i) = interleave(services, raw, payload, iters).await;
    Comparison {
        raw: Stats::of(r),
        iii: Stats::of(i),
        steal: Steal::since(steal),
    }
}

/// `n` raw spawns and `n` calls, alternately, the order flipping every pair (ABBA…).
async fn interleave(
    services: &Arc<Services>,
    raw: &RawSpawn,
    payload: &Value,
    n: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut r, mut i) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for k in 0..n {
        if k % 2 == 0 {
            r.push(raw.run());
            i.push(iii_exec(services, payload).await);
        } else {
            i.push(iii_exec(services, payload).await);
            r.push(raw.run());
        }
    }
    (r, i)
}

/// Two executors measured the way the goal rows are ([`compare`]: raw and iii interleaved),
/// in alternating blocks of [`BLOCK`] pairs, each executor against the raw spawns of its own
/// blocks. Only one executor is called at a time, so work one does after its reply (releasing
/// descriptors, pre-starting the next process) overlaps a raw spawn, as it does in the goal
/// rows, and never the other executor's call (as it can in [`rotate3`]).
async fn blocks(
    services: &Arc<Services>,
    other: &Arc<Services>,
    raw: &RawSpawn,
    payload: &Value,
    iters: usize,
    warmup: usize,
) -> [Comparison; 2] {
    const BLOCK: usize = 100;
    interleave(services, raw, payload, warmup).await;
    interleave(other, raw, payload, warmup).await;
    let steal = Steal::now();
    let mut samples: [(Vec<Duration>, Vec<Duration>); 2] = Default::default();
    let mut done = 0;
    while done < iters {
        let n = BLOCK.min(iters - done);
        for (which, s) in [services, other].into_iter().enumerate() {
            let (r, i) = interleave(s, raw, payload, n).await;
            samples[which].0.extend(r);
            samples[which].1.extend(i);
        }
        done += n;
    }
    let steal = Steal::since(steal);
    samples.map(|(r, i)| Comparison {
        raw: Stats::of(r),
        iii: Stats::of(i),
        steal,
    })
}

/// Raw spawns, `services` and `other` taking turns (raw, first, second, then the order shifts
/// by one), after a shared warm-up, with `pause` before every spawn and call when given.
/// Returns the three samples' statistics.
async fn rotate3(
    services: &Arc<Services>,
    other: &Arc<Services>,
    raw: &RawSpawn,
    payload: &Value,
    (iters, warmup): (usize, usize),
    pause: Option<Duration>,
) -> (Stats, Stats, Stats) {
    for _ in 0..warmup {
        raw.run();
        iii_exec(services, payload).await;
        iii_exec(other, payload).await;
    }
    let (mut r, mut first, mut second) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..iters {
        for k in 0..3 {
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
            match (n + k) % 3 {
                0 => r.push(raw.run()),
                1 => first.push(iii_exec(services, payload).await),
                _ => second.push(iii_exec(other, payload).await),
            }
        }
    }
    (Stats::of(r), Stats::of(first), Stats::of(second))
}

/// The default executor against a second one started with `--no-prestart`, in rotation with
/// raw spawns. Prints all three and returns the "off" comparison.
async fn prestart_comparison(
    services: &Arc<Services>,
    pid: u32,
    config: &Config,
    raw: &RawSpawn,
    payload: &Value,
    iters: usize,
    warmup: usize,
) -> Comparison {
    let (off, mut child, off_pid) = start_executor(config, &["--no-prestart"]).await;
    let cpu = CpuMeter::start([pid, off_pid]);
    let (r, on_s, off_s) = rotate3(services, &off, raw, payload, (iters, warmup), None).await;
    print_rotation(
        &format!("pre-started command processes on and off (a second executor with --no-prestart), {iters} iterations each, rotating"),
        &r,
        [("pre-start on (default)", "on", &on_s), ("pre-start off", "off", &off_s)],
        cpu.per_call(iters + warmup),
        cpu.steal(),
    );
    drop(off);
    wait_or_kill(&mut child, Duration::from_secs(5));
    Comparison {
        raw: r,
        iii: off_s,
        steal: cpu.steal(),
    }
}

/// This build's executor against one from another build (`BENCH_BASELINE_EXE`, an
/// `iii-shell` binary), in rotation with raw spawns: a change to the executor measured
/// against the code before it in one run, so the machine's drift cancels out. The broker side
/// is this build's for both.
async fn baseline_comparison(
    (services, pid): (&Arc<Services>, u32),
    config: &Config,
    raw: &RawSpawn,
    payload: &Value,
    (baseline, extra): (&Path, &[&str]),
    iters: usize,
    warmup: usize,
) {
    // `BENCH_BASELINE_RUN_AS` gives the baseline another `confinement.run_as` (the same
    // binary as root in the jail against the command user, say).
    let mut base_config = config.clone();
    if let Some(u) = std::env::var("BENCH_BASELINE_RUN_AS")
        .ok()
        .filter(|u| !u.is_empty())
    {
        println!("baseline: confinement.run_as {u}");
        base_config.confinement.run_as = Some(u);
    }
    let (base, mut child, base_pid) = start_executor_from(baseline, &base_config, extra).await;
    let [this, other] = blocks(services, &base, raw, payload, iters, warmup).await;
    println!(
        "this build's executor against {} ({iters} pairs each, alternating blocks of raw/iii pairs, as in the goal rows):",
        baseline.display()
    );
    print_header();
    print_row("raw posix_spawn + waitpid (this build's blocks)", &this.raw);
    print_row("iii-shell shell::exec, this build", &this.iii);
    print_row("raw posix_spawn + waitpid (baseline's blocks)", &other.raw);
    print_row("iii-shell shell::exec, baseline", &other.iii);
    println!(
        "  ratio iii/raw at p50: this build {:.2}x, baseline {:.2}x",
        this.iii.p50 / this.raw.p50,
        other.iii.p50 / other.raw.p50
    );
    println!("  host: {}", fmt_steal(this.steal));
    println!();
    // Spaced: every spawn and call after a pause, so nothing one executor does after its
    // reply can overlap anything measured.
    let spaced = (iters / 10).max(10);
    let cpu = CpuMeter::start([pid, base_pid]);
    let (r, this, other) = rotate3(services, &base, raw, payload, (spaced, 0), Some(SPACING)).await;
    print_rotation(
        &format!(
            "this build's executor against the baseline, spaced ({spaced} each, {} ms pause before every spawn and call)",
            SPACING.as_millis()
        ),
        &r,
        [
            ("this build", "this build", &this),
            ("baseline", "baseline", &other),
        ],
        cpu.per_call(spaced),
        cpu.steal(),
    );
    let cpu = CpuMeter::start([pid, base_pid]);
    let (r, this, other) = rotate3(services, &base, raw, payload, (iters, warmup), None).await;
    print_rotation(
        &format!(
            "this build's executor against {} ({iters} iterations each, rotating)",
            baseline.display()
        ),
        &r,
        [
            ("this build", "this build", &this),
            ("baseline", "baseline", &other),
        ],
        cpu.per_call(iters + warmup),
        cpu.steal(),
    );
    drop(base);
    wait_or_kill(&mut child, Duration::from_secs(5));
}

/// Prints a [`rotate3`] result: the raw row, one row per executor (`(row label, ratio label,
/// stats)`), their p50 ratios against raw, and the CPU each executor used per call.
fn print_rotation(
    title: &str,
    raw: &Stats,
    executors: [(&str, &str, &Stats); 2],
    cpu: [Option<CpuPerCall>; 2],
    steal: Option<f64>,
) {
    println!("{title}:");
    print_header();
    print_row("raw posix_spawn + waitpid", raw);
    for (row, _, stats) in executors {
        print_row(&format!("iii-shell shell::exec, {row}"), stats);
    }
    let ratios: Vec<String> = executors
        .iter()
        .map(|(_, name, stats)| format!("{name} {:.2}x", stats.p50 / raw.p50))
        .collect();
    println!("  ratio iii/raw at p50: {}", ratios.join(", "));
    let cpu: Vec<String> = executors
        .iter()
        .zip(cpu)
        .map(|((_, name, _), c)| match c {
            Some(c) => format!(
                "{name} {:.0} us + {:.0} us ({:.1} switches)",
                c.executor_us, c.children_us, c.switches
            ),
            None => format!("{name} n/a"),
        })
        .collect();
    println!(
        "  CPU per call (executor's threads + its reaped children, incl. the command; the executor's context switches): {}",
        cpu.join(", ")
    );
    println!("  host: {}", fmt_steal(steal));
    println!();
}

/// CPU time of executors across a run: their threads' run time (`/proc/<pid>/task/*/schedstat`,
/// nanoseconds) and their reaped children's user + system time (`/proc/<pid>/stat`, clock
/// ticks), which covers the pre-started processes and the commands they became.
struct CpuMeter {
    pids: [u32; 2],
    at_start: [Option<(u64, u64, u64)>; 2],
    steal: Option<Steal>,
}

#[derive(Clone, Copy)]
struct CpuPerCall {
    executor_us: f64,
    children_us: f64,
    switches: f64,
}

impl CpuMeter {
    fn start(pids: [u32; 2]) -> CpuMeter {
        CpuMeter {
            pids,
            at_start: pids.map(cpu_of),
            steal: Steal::now(),
        }
    }

    /// See [`Steal::since`].
    fn steal(&self) -> Option<f64> {
        Steal::since(self.steal)
    }

    fn per_call(&self, calls: usize) -> [Option<CpuPerCall>; 2] {
        let mut out = [None; 2];
        for (i, pid) in self.pids.iter().enumerate() {
            if let (Some((own0, kids0, sw0)), Some((own1, kids1, sw1))) =
                (self.at_start[i], cpu_of(*pid))
            {
                out[i] = Some(CpuPerCall {
                    executor_us: own1.saturating_sub(own0) as f64 / 1e3 / calls as f64,
                    children_us: kids1.saturating_sub(kids0) as f64 / 1e3 / calls as f64,
                    switches: sw1.saturating_sub(sw0) as f64 / calls as f64,
                });
            }
        }
        out
    }
}

/// (run time of `pid`'s threads, user + system time of its reaped children), in nanoseconds,
/// and the context switches of its threads.
fn cpu_of(pid: u32) -> Option<(u64, u64, u64)> {
    let (mut own, mut switches) = (0u64, 0u64);
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
        own += stat.split_whitespace().next()?.parse::<u64>().ok()?;
        let status = std::fs::read_to_string(task.path().join("status")).ok()?;
        for line in status.lines() {
            if line.starts_with("voluntary_ctxt_switches:")
                || line.starts_with("nonvoluntary_ctxt_switches:")
            {
                switches += line.split_whitespace().nth(1)?.parse::<u64>().ok()?;
            }
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces): cutime and cstime are the
    // 16th and 17th fields of the whole line, the 14th and 15th after ")".
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(13)?.parse::<u64>().ok()? + f.get(14)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some((own, ticks * 1_000_000_000 / hz, switches))
}

/// Starts `iii-shell executor` with `extra` arguments, connects and installs `config`.
/// Returns the services that reach it, the process and its pid.
/// The configuration of the measured executors: the built-in default, or (`BENCH_RUN_AS`)
/// jailed to a fresh directory with that `confinement.run_as`. The directory is returned to
/// keep it alive.
fn bench_config() -> (Config, Option<tempfile::TempDir>) {
    let mut c = Config::builtin_default();
    let Some(user) = std::env::var("BENCH_RUN_AS").ok().filter(|u| !u.is_empty()) else {
        return (c, None);
    };
    let dir = tempfile::tempdir().expect("a temporary jail root");
    c.fs.host_roots = vec![dir.path().to_string_lossy().into_owned()];
    c.fs.allow_unjailed = false;
    c.confinement.run_as = Some(user);
    (c, Some(dir))
}

/// `--no-prestart` when `BENCH_NO_PRESTART` is set.
fn bench_executor_args() -> Vec<&'static str> {
    match std::env::var_os("BENCH_NO_PRESTART") {
        Some(_) => vec!["--no-prestart"],
        None => Vec::new(),
    }
}

async fn start_executor(config: &Config, extra: &[&str]) -> (Arc<Services>, Child, u32) {
    let exe = std::env::var_os("BENCH_EXE").map(std::path::PathBuf::from);
    start_executor_from(exe.as_deref().unwrap_or(Path::new(EXE)), config, extra).await
}

/// [`start_executor`] with another `iii-shell` binary.
async fn start_executor_from(
    exe: &Path,
    config: &Config,
    extra: &[&str],
) -> (Arc<Services>, Child, u32) {
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    let (child, stream) = spawn_executor_with(exe, &extra).expect("start the executor");
    let services = Services::new();
    services.snapshots.install(config.clone());
    let pid = services
        .attach_executor(stream)
        .await
        .expect("executor handshake and policy");
    (services, child, pid)
}

/// Pause before every call of the spaced comparison.
const SPACING: Duration = Duration::from_millis(50);

/// Like [`compare`], with a pause before every single call.
async fn compare_spaced(
    services: &Arc<Services>,
    raw: &RawSpawn,
    payload: &Value,
    iters: usize,
    pause: Duration,
) -> Comparison {
    let (mut r, mut i) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    let steal = Steal::now();
    for n in 0..iters {
        for first_raw in [n % 2 == 0, n % 2 != 0] {
            tokio::time::sleep(pause).await;
            if first_raw {
                r.push(raw.run());
            } else {
                i.push(iii_exec(services, payload).await);
            }
        }
    }
    Comparison {
        raw: Stats::of(r),
        iii: Stats::of(i),
        steal: Steal::since(steal),
    }
}

/// Pause before every call of [`spawn_kinds`].
const KINDS_SPACING: Duration = Duration::from_millis(100);
/// `shell::exec_bg` against `shell::exec` of the same program (neither may pay for its extra steps on every call).
const BG_GOAL: f64 = 1.2;
/// `shell::pty::open` against `shell::exec` of the same program.
const PTY_GOAL: f64 = 2.0;

/// Spaced round trips of the three ways to start `/bin/true`, taking turns, 100 ms apart:
/// `shell::exec` (until the command has exited and been reaped), `shell::exec_bg` (until the
/// job has started: its exec confirmed) and `shell::pty::open` (until the session's program
/// runs). Every job and session is cleaned up outside the timing.
async fn spawn_kinds(services: &Arc<Services>, iters: usize) {
    let exec = json!({"command": TRUE, "args": []});
    let bg = json!({"command": TRUE, "args": []});
    let pty = json!({"cwd": "/tmp", "cols": 80, "rows": 24, "program": TRUE, "args": [],
        "output_function_id": "iii::bench-ui::pty-output::console-spawn-kinds"});
    let (mut e, mut b, mut p) = (Vec::new(), Vec::new(), Vec::new());
    let steal = Steal::now();
    for n in 0..iters {
        for k in 0..3 {
            tokio::time::sleep(KINDS_SPACING).await;
            match (n + k) % 3 {
                0 => e.push(iii_exec(services, &exec).await),
                1 => {
                    let t = Instant::now();
                    let r = call(services, "shell::exec_bg", bg.clone()).await;
                    b.push(t.elapsed());
                    assert!(r["job_id"].is_string(), "{r}");
                }
                _ => {
                    let t = Instant::now();
                    let r = call(services, "shell::pty::open", pty.clone()).await;
                    p.push(t.elapsed());
                    let _ = dispatch(
                        services,
                        "shell::pty::close",
                        json!({"session_id": r["session_id"], "access_key": r["access_key"]}),
                        CallMeta::default(),
                    )
                    .await;
                }
            }
        }
    }
    let steal = Steal::since(steal);
    let (e, b, p) = (Stats::of(e), Stats::of(b), Stats::of(p));
    println!(
        "spawn kinds, spaced ({iters} each, {} ms pause before every call, taking turns):",
        KINDS_SPACING.as_millis()
    );
    print_header();
    print_row("shell::exec (to the reaped exit)", &e);
    print_row("shell::exec_bg (to the confirmed exec)", &b);
    print_row("shell::pty::open (to the running program)", &p);
    let verdict = |r: f64, goal: f64| if r <= goal { "MET" } else { "NOT MET" };
    let (rb, rp) = (b.p50 / e.p50, p.p50 / e.p50);
    println!(
        "  exec_bg / exec p50 {rb:.2}x (goal <= {BG_GOAL:.1}x: {}); pty::open / exec p50 {rp:.2}x (goal <= {PTY_GOAL:.1}x: {})",
        verdict(rb, BG_GOAL),
        verdict(rp, PTY_GOAL)
    );
    println!("  host: {}", fmt_steal(steal));
    println!();
}

/// Per-spawn cost of each `confinement.network` mode (`BENCH_NETWORK_ONLY=1`): `shell::exec`
/// of `/bin/true`, taking turns, spaced, on one executor per configured mode (`allow` and
/// `deny`, each with its pre-started processes), and on the `allow` one a call asking for
/// `deny` and one asking for `loopback` (which run as `deny`, through the ordinary spawn path:
/// a pre-started process holds the policy's own mode).
async fn network_modes(iters: usize) {
    use iii_shell_protocol::config::NetworkAccess;
    let (mut allow_cfg, _jail) = bench_config();
    allow_cfg.confinement.network = NetworkAccess::Allow;
    let mut deny_cfg = allow_cfg.clone();
    deny_cfg.confinement.network = NetworkAccess::Deny;
    let args = bench_executor_args();
    let (allow, mut a_child, _) = start_executor(&allow_cfg, &args).await;
    let (deny, mut d_child, _) = start_executor(&deny_cfg, &args).await;
    let plain = json!({"command": TRUE, "args": []});
    let call_deny = json!({"command": TRUE, "args": [], "network": "deny"});
    let call_loopback = json!({"command": TRUE, "args": [], "network": "loopback"});
    let mut rows: [Vec<Duration>; 4] = Default::default();
    let steal = Steal::now();
    for n in 0..iters {
        for k in 0..4 {
            tokio::time::sleep(SPACING).await;
            let i = (n + k) % 4;
            rows[i].push(match i {
                0 => iii_exec(&allow, &plain).await,
                1 => iii_exec(&deny, &plain).await,
                2 => iii_exec(&allow, &call_deny).await,
                _ => iii_exec(&allow, &call_loopback).await,
            });
        }
    }
    let steal = Steal::since(steal);
    let [a, d, cd, cl] = rows.map(Stats::of);
    println!(
        "network modes, spaced ({iters} each, {} ms pause before every call, taking turns):",
        SPACING.as_millis()
    );
    print_header();
    print_row("configured allow", &a);
    print_row("configured deny", &d);
    print_row("allow, the call asks deny", &cd);
    print_row("allow, the call asks loopback (runs as deny)", &cl);
    println!(
        "  deny - allow p50 {:+.1} us (goal <= 200 us); per-call deny - allow {:+.1} us; per-call loopback - allow {:+.1} us",
        d.p50 - a.p50,
        cd.p50 - a.p50,
        cl.p50 - a.p50
    );
    println!("  host: {}", fmt_steal(steal));
    drop((allow, deny));
    wait_or_kill(&mut a_child, Duration::from_secs(5));
    wait_or_kill(&mut d_child, Duration::from_secs(5));
}

/// Installs `config` in the executor (generations after the bench's first policy).
async fn set_policy(services: &Arc<Services>, generation: u64, config: &Config) {
    let json = serde_json::to_string(config).expect("config json");
    let client = services.executor.get().expect("executor connected");
    client
        .call(Request::SetPolicy {
            generation: generation + 1000,
            config_json: json,
        })
        .await
        .expect("SetPolicy");
}

/// Starts the fat background jobs and waits until each holds exactly 1 MiB of stdout.
async fn start_fat_jobs(services: &Arc<Services>) -> Vec<String> {
    let script = format!("head -c {FAT_BYTES} /dev/zero | tr '\\0' a; exec sleep 100000");
    let mut ids = Vec::new();
    for _ in 0..FAT_JOBS {
        let r = call(
            services,
            "shell::exec_bg",
            json!({"command": "sh", "args": ["-c", script]}),
        )
        .await;
        ids.push(r["job_id"].as_str().expect("job_id").to_string());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for id in &ids {
        loop {
            let r = call(services, "shell::status", json!({ "job_id": id })).await;
            let job = &r["job"];
            let len = job["stdout"].as_str().map(str::len).unwrap_or(0);
            if len == FAT_BYTES {
                assert_eq!(job["stdout_truncated"], json!(false), "job {id}");
                assert_eq!(job["status"], json!("running"), "job {id}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "job {id} has only {len} bytes of stdout"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    println!("{FAT_JOBS} background jobs running, each verified via shell::status: stdout = {FAT_BYTES} bytes, stdout_truncated = false");
    println!();
    ids
}

/// Where the time of one `shell::exec` goes: each stage alone, round-robin with raw spawns.
async fn stages(
    services: &Arc<Services>,
    config: &Config,
    raw: &RawSpawn,
    payload: &Value,
    iters: usize,
) {
    // The executor's stages in this process, under a launcher of their own (job cgroups
    // under a base of its own name, as an executor's).
    let launcher = Arc::new(Launcher::new(Settings::private()));
    let policy = Arc::new(
        Policy::build(1, &serde_json::to_string(config).expect("config json"))
            .expect("policy")
            .with_launcher(launcher.clone()),
    );
    // As the broker's configuration snapshot holds it: compiled once.
    let denylist = Denylist::compile(&config.denylist_patterns).expect("denylist");
    let spec = ExecSpec {
        argv: vec![TRUE.into()],
        cwd: None,
        env: Vec::new(),
        stdin: None,
        timeout_ms: 30_000,
        network: None,
        limits: Default::default(),
    };
    let env: Vec<(String, String)> = std::env::vars().collect();
    let dn = || launcher.dev_null().expect("/dev/null");
    let mut plan = SpawnPlan::new(TRUE, &[TRUE.to_string()], env, dn(), dn(), dn()).expect("plan");
    let cgroups = launcher.cgroups().base().is_some();

    let names = [
        "raw posix_spawn + waitpid (reference)",
        "iii-shell shell::exec, full path",
        "broker: validate::exec_request (JSON -> ExecSpec)",
        "  of which Denylist::compile (per call)",
        "socket round trip: Request::Ping",
        "executor: foreground::run in-process (child also loads seccomp)",
        "  prepare::prepare (env, pipes, cgroup from the pool)",
        "  JobCgroup take + recycle (pooled)",
        "  spawn::spawn + reap, no cgroup",
        "  spawn::spawn + reap, child starts in a cgroup",
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(iters); names.len()];
    for round in 0..(iters + iters / 10) {
        let mut t: Vec<Option<Duration>> = vec![None; names.len()];
        t[0] = Some(raw.run());
        t[1] = Some(iii_exec(services, payload).await);
        t[2] = Some(time(|| {
            exec_request_with(payload, config, &denylist)
                .map(|_| ())
                .expect("validate")
        }));
        t[3] = Some(time(|| {
            drop(Denylist::compile(&config.denylist_patterns).expect("denylist"))
        }));
        t[4] = Some(
            time_async(async { services.executor.call(Request::Ping).await.expect("ping") }).await,
        );
        t[5] = Some(
            time_async(async {
                let r = iii_shell_executor::foreground::run(
                    policy.clone(),
                    spec.clone(),
                    Default::default(),
                )
                .await;
                assert_eq!(r.expect("run").exit_code, Some(0));
            })
            .await,
        );
        let start = Instant::now();
        let prepared = prepare(&policy, &spec).expect("prepare");
        t[6] = Some(start.elapsed());
        let iii_shell_executor::prepare::Prepared {
            plan: p, cgroup, ..
        } = prepared;
        drop(p);
        if let Some(cg) = cgroup {
            cg.recycle().expect("an unused cgroup is empty");
        }
        if cgroups {
            t[7] = Some(time(|| {
                let cg = launcher.cgroups().take().expect("cgroup");
                cg.recycle().expect("an unused cgroup is empty");
            }));
        }
        t[8] = Some(time(|| {
            reap(&launcher.spawn(&plan).expect("spawn")).expect("reap");
        }));
        if let Some(cg) = cgroups.then(|| launcher.cgroups().take()).flatten() {
            plan.cgroup = Some(cg.target());
            t[9] = Some(time(|| {
                reap(&launcher.spawn(&plan).expect("spawn")).expect("reap");
            }));
            plan.cgroup = None;
            while cg.is_empty().not() {
                std::thread::yield_now();
            }
            cg.recycle().expect("empty after the reap");
        }
        // The first tenth of the rounds is warm-up.
        if round >= iters / 10 {
            for (s, d) in samples.iter_mut().zip(t) {
                s.extend(d);
            }
        }
    }
    launcher.kill_all();

    println!("where the time goes ({iters} rounds, stages round-robin; executor stages run in this process):");
    println!("  (this process has no start-up seccomp filter for children to inherit, so its foreground::run children");
    println!("   load the filter themselves, about +100 us that the real executor does not pay)");
    print_header();
    for (name, s) in names.iter().zip(samples) {
        if s.is_empty() {
            println!("  {name:<50} n/a (no writable cgroup v2 hierarchy)");
        } else {
            print_row(name, &Stats::of(s));
        }
    }
    println!();
}

fn time(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

async fn time_async<T>(f: impl Future<Output = T>) -> Duration {
    let start = Instant::now();
    f.await;
    start.elapsed()
}

/// Context: fork vs posix_spawn from a parent that holds (and has touched) 256 MiB.
fn fork_vs_posix_spawn() {
    let raw = RawSpawn::new(TRUE);
    let mut lean = (Vec::new(), Vec::new());
    for _ in 0..FORK_ITERS {
        lean.0.push(raw.run_fork());
        lean.1.push(raw.run());
    }
    // vec![1; n] writes every byte, so every page is resident (THP is madvise-only here).
    let fat = std::hint::black_box(vec![1u8; FAT_PARENT_MIB << 20]);
    let mut heavy = (Vec::new(), Vec::new());
    for n in 0..FORK_ITERS {
        if n % 2 == 0 {
            heavy.0.push(raw.run_fork());
            heavy.1.push(raw.run());
        } else {
            heavy.1.push(raw.run());
            heavy.0.push(raw.run_fork());
        }
    }
    let rss = vm_rss_kib(std::process::id());
    drop(fat);
    println!(
        "context: fork+execve+waitpid vs posix_spawn+waitpid of /bin/true, {FORK_ITERS} each (bench process, VmRSS {} with the {FAT_PARENT_MIB} MiB touched):",
        fmt_kib(rss)
    );
    print_header();
    print_row("lean parent: fork + execve", &Stats::of(lean.0));
    print_row("lean parent: posix_spawn", &Stats::of(lean.1));
    let (f, p) = (Stats::of(heavy.0), Stats::of(heavy.1));
    print_row(&format!("{FAT_PARENT_MIB} MiB parent: fork + execve"), &f);
    print_row(&format!("{FAT_PARENT_MIB} MiB parent: posix_spawn"), &p);
    println!(
        "  fork/posix_spawn with the fat parent: p50 {:.1}x",
        f.p50 / p.p50
    );
}

/// Idle RSS of a freshly started standalone executor and of the broker (`serve`).
fn standalone_rss() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("x.sock");
    let mut ex = Command::new(EXE)
        .arg("executor")
        .arg("--socket")
        .arg(&sock)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start iii-shell executor --socket");
    std::thread::sleep(Duration::from_millis(500));
    let alive = matches!(ex.try_wait(), Ok(None));
    let rss = if alive { vm_rss_kib(ex.id()) } else { None };
    println!(
        "executor idle RSS (iii-shell executor --socket <tmp>/x.sock, after 500 ms): {}",
        fmt_kib(rss)
    );
    terminate(&mut ex);

    let mut serve = Command::new(EXE)
        .args(["serve", "--url", "ws://127.0.0.1:1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start iii-shell serve");
    std::thread::sleep(Duration::from_millis(500));
    match serve.try_wait() {
        Ok(None) => {
            println!(
                "broker idle RSS (iii-shell serve --url ws://127.0.0.1:1, after 500 ms): {}",
                fmt_kib(vm_rss_kib(serve.id()))
            );
            terminate(&mut serve);
        }
        _ => println!("broker idle RSS: n/a (serve lands with the engine link)"),
    }
    println!();
}

fn terminate(child: &mut Child) {
    // SAFETY: kill(2) on the pid of a child we started and have not reaped yet.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    wait_or_kill(child, Duration::from_secs(5));
}

fn wait_or_kill(child: &mut Child, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// VmRSS of a process, in KiB.
fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn fmt_kib(kib: Option<u64>) -> String {
    match kib {
        Some(k) => format!("{:.1} MiB ({k} KiB)", k as f64 / 1024.0),
        None => "n/a".into(),
    }
}

/// Whether the executor made a job-cgroup base (a child of its cgroup named after its pid).
fn job_cgroups(executor_pid: u32) -> String {
    match iii_shell_launch::cgroups::own_cgroup_dir()
        .map(|p| p.join(format!("iii-shell-{executor_pid}")))
    {
        Some(dir) if dir.is_dir() => format!("enabled ({})", dir.display()),
        _ => "disabled (no writable cgroup v2 hierarchy)".into(),
    }
}

fn machine_facts() -> String {
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    format!("nproc {nproc}, kernel {}, CPU {cpu}", kernel.trim())
}

/// Percentiles in microseconds.
struct Stats {
    p50: f64,
    p90: f64,
    p99: f64,
    mean: f64,
    min: f64,
    n: usize,
}

impl Stats {
    fn of(samples: Vec<Duration>) -> Stats {
        let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        us.sort_by(f64::total_cmp);
        let n = us.len();
        // Nearest-rank percentile.
        let pct = |p: f64| us[((p / 100.0 * n as f64).ceil() as usize).clamp(1, n) - 1];
        Stats {
            p50: pct(50.0),
            p90: pct(90.0),
            p99: pct(99.0),
            mean: us.iter().sum::<f64>() / n as f64,
            min: us[0],
            n,
        }
    }
}

fn print_header() {
    println!(
        "  {:<50} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "variant", "p50 us", "p90 us", "p99 us", "mean us", "min us", "n"
    );
}

fn print_row(name: &str, s: &Stats) {
    println!(
        "  {name:<50} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6}",
        s.p50, s.p90, s.p99, s.mean, s.min, s.n
    );
}

/// Spaced `shell::exec` calls through `iii-shell serve` and the test engine, before and after
/// the executor is killed and respawned by the supervisor, in the same run. A respawned
/// executor inherits the supervisor's seccomp filter; it must still start commands with
/// clone3 into their cgroup, so both halves should be alike (they were ~5x apart
/// when that filter took clone3 away). `BENCH_RESPAWN_ONLY=1` runs this part alone.
async fn respawn_comparison(iters: usize) {
    let engine = iii_test_engine::TestEngine::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::var_os("BENCH_EXE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| EXE.into());
    let mut serve = Command::new(&exe)
        .args(["serve", "--config"])
        .arg(dir.path().join("no-seed.yaml"))
        .env("III_URL", engine.url())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start iii-shell serve");
    let caller = engine.client().await;
    let payload = json!({"command": TRUE, "args": []});
    let ready = async {
        engine
            .wait_for_function("shell::exec", Duration::from_secs(30))
            .await
            .is_some()
    };
    if !ready.await {
        println!("respawn: serve never registered shell::exec; skipped");
        terminate(&mut serve);
        return;
    }
    let spaced = |label: &'static str| {
        let caller = &caller;
        let payload = payload.clone();
        async move {
            let mut samples = Vec::with_capacity(iters);
            for n in 0..iters + WARMUP.min(iters) {
                tokio::time::sleep(SPACING).await;
                let t = Instant::now();
                let r = caller.call("shell::exec", payload.clone()).await;
                let took = t.elapsed();
                assert!(r.is_ok(), "{label}: {r:?}");
                if n >= WARMUP.min(iters) {
                    samples.push(took);
                }
            }
            Stats::of(samples)
        }
    };
    let before = spaced("before the respawn").await;
    let executor = executor_of(serve.id());
    let Some(first) = executor else {
        println!("respawn: no executor found under serve; skipped");
        terminate(&mut serve);
        return;
    };
    // SAFETY: kill(2) of the executor we found under our own child.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let back = executor_of(serve.id()).is_some_and(|p| p != first)
            && caller.call("shell::exec", payload.clone()).await.is_ok();
        if back || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = spaced("after the respawn").await;
    println!(
        "respawn (shell::exec {TRUE} through serve and the test engine, {} ms apart, n={iters}):",
        SPACING.as_millis()
    );
    print_header();
    print_row("before", &before);
    print_row("after", &after);
    println!(
        "  after/before at p50: {:.2}x (goal: about 1x; a respawned executor is as fast as a fresh one)",
        after.p50 / before.p50
    );
    terminate(&mut serve);
}

/// The executor under a `serve` process: its child started as `executor --fd`. (The dead
/// executor's pre-started processes, re-parented to `serve`, are killed before a new
/// executor is started.)
fn executor_of(serve: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{serve}/task/{serve}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd)
                .replace('\0', " ")
                .contains("executor --fd")
        })
}

/// Only the telemetry rows (`BENCH_TELEMETRY_ONLY=1`): on against off, and the worker's
/// memory with telemetry on.
async fn telemetry_only(iters: usize, warmup: usize) {
    let (config, _jail) = bench_config();
    let extra = bench_executor_args();
    let (services, mut child, _pid) = start_executor(&config, &extra).await;
    let raw = RawSpawn::new(TRUE);
    let payload = json!({"command": TRUE, "args": []});
    telemetry_comparison(&services, &raw, &payload, iters, warmup).await;
    drop(services);
    wait_or_kill(&mut child, Duration::from_secs(5));
    telemetry_memory(iters.min(2000)).await;
}

/// Telemetry on against off on one executor, in alternating blocks of 100 calls (raw spawns
/// interleaved in each): what spans cost a foreground exec, from the broker's call span to the
/// executor's spawn and wait spans and their trip back over the socket. The outbox is drained
/// as the transport would drain it.
async fn telemetry_comparison(
    services: &Arc<Services>,
    raw: &RawSpawn,
    payload: &Value,
    iters: usize,
    warmup: usize,
) {
    use iii_shell_protocol::config::TelemetryConfig;
    const BLOCK: usize = 100;
    let hub = telemetry::install_hub(telemetry::Hub::new(
        telemetry::Identity {
            worker_name: "bench".into(),
            namespace: None,
        },
        Arc::new(telemetry::outbox::Outbox::new(
            telemetry::outbox::Bounds::DEFAULT,
        )),
    ));
    let outbox = hub.outbox.clone();
    let drained = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let d = drained.clone();
    let drain = tokio::spawn(async move {
        loop {
            let f = outbox.next().await;
            d.fetch_add(f.items, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let set = |on: bool| {
        hub.apply(&TelemetryConfig {
            enabled: on,
            ..Default::default()
        })
    };
    set(true);
    interleave(services, raw, payload, warmup).await;
    set(false);
    interleave(services, raw, payload, warmup).await;
    let steal = Steal::now();
    let mut samples: [(Vec<Duration>, Vec<Duration>); 2] = Default::default();
    let mut done = 0;
    while done < iters {
        let n = BLOCK.min(iters - done);
        for (which, on) in [true, false].into_iter().enumerate() {
            set(on);
            let (r, i) = interleave(services, raw, payload, n).await;
            samples[which].0.extend(r);
            samples[which].1.extend(i);
        }
        done += n;
    }
    let steal = Steal::since(steal);
    set(false);
    hub.flush();
    tokio::time::sleep(Duration::from_millis(700)).await;
    drain.abort();
    let [on, off] = samples.map(|(r, i)| Comparison {
        raw: Stats::of(r),
        iii: Stats::of(i),
        steal,
    });
    on.print(&format!(
        "telemetry on (every call a traced span, executor spans included), {iters} iterations, blocks alternating with off"
    ));
    off.print("telemetry off, the same run");
    let added = on.iii.p50 - off.iii.p50;
    let added_mean = on.iii.mean - off.iii.mean;
    println!(
        "telemetry adds {added:+.1} us at p50 ({added_mean:+.1} us mean; raw spawns of the two: {:.1} / {:.1} us p50); goal <= {TELEMETRY_GOAL_US:.0} us: {}; {} spans reached the outbox, {} dropped",
        on.raw.p50,
        off.raw.p50,
        if added <= TELEMETRY_GOAL_US { "MET" } else { "NOT MET" },
        drained.load(std::sync::atomic::Ordering::Relaxed),
        hub.outbox.dropped().items,
    );
    println!();
}

/// The worker's memory (supervisor + broker + executor, VmRSS) after `n` traced calls with
/// telemetry on, against the test engine's `/otel`, and what its own gauge said.
async fn telemetry_memory(n: usize) {
    let engine = iii_test_engine::TestEngine::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let seed = dir.path().join("seed.yaml");
    std::fs::write(
        &seed,
        "fs:\n  allow_unjailed: true\ntelemetry:\n  metrics_interval_ms: 1000\n",
    )
    .expect("seed");
    let mut serve = Command::new(EXE)
        .args(["serve", "--config"])
        .arg(&seed)
        .env("III_URL", engine.url())
        .env("III_WORKER_NAME", "bench-telemetry")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("serve.log")).expect("log"))
        .spawn()
        .expect("start iii-shell serve");
    if engine
        .wait_for_function("shell::exec", Duration::from_secs(30))
        .await
        .is_none()
    {
        println!(
            "telemetry memory: serve never registered shell::exec; skipped. Its log:\n{}",
            std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default()
        );
        terminate(&mut serve);
        return;
    }
    let caller = engine.client().await;
    // (VmRSS summed, Pss summed) of serve, the broker and the executor, in KiB.
    let sum = |serve: u32| -> (u64, u64) {
        let mut pids = vec![serve];
        pids.extend(children(serve));
        let rss = pids.iter().filter_map(|p| vm_rss_kib(*p)).sum();
        let pss = pids.iter().filter_map(|p| pss_kib(*p)).sum();
        (rss, pss)
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = sum(serve.id());
    for i in 0..n {
        let r = caller
            .call_with_trace(
                "shell::exec",
                json!({"command": TRUE, "args": [format!("{i}")]}),
                BENCH_TRACEPARENT,
                None,
            )
            .await;
        assert!(r.is_ok(), "{r:?}");
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = sum(serve.id());
    let each: Vec<String> = std::iter::once(serve.id())
        .chain(children(serve.id()))
        .map(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            let role = cmd.split_whitespace().nth(1).unwrap_or("?").to_string();
            format!("{role} {}", fmt_kib(pss_kib(p)))
        })
        .collect();
    println!("  Pss by process after the calls: {}", each.join(", "));
    let gauge = engine
        .metric_points()
        .into_iter()
        .filter(|(name, _, _, _)| name == "iii.worker.memory.rss")
        .max_by_key(|(_, _, _, at)| *at)
        .map(|(_, _, v, _)| v as u64 / 1024);
    println!(
        "worker memory with telemetry on (serve + broker + executor): Pss {} KiB idle, {} KiB after {n} traced shell::exec calls (goal <= 20 MB: {}); VmRSS summed (shared pages counted three times) {} / {} KiB; its iii.worker.memory.rss gauge: {}; {} spans stored by the engine",
        before.1,
        after.1,
        if after.1 * 1024 <= 20_000_000 { "MET" } else { "NOT MET" },
        before.0,
        after.0,
        fmt_kib(gauge),
        engine.spans().len(),
    );
    terminate(&mut serve);
    println!();
}

/// The proportional set size of `pid` (shared pages divided among their users), in KiB.
fn pss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The children of `pid` (the broker and the executor, for `serve`).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .collect()
}
