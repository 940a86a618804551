//! Fuzzing in process (proptest, stable Rust), no socket and nothing spawned:
//!
//! * `fuzz_exec_broker_then_executor_recheck`: arbitrary `shell::exec` / `shell::exec_bg`
//!   payloads go through the broker's own parse and validation (`validate::exec_request`),
//!   and every typed request it lets through goes through the executor's re-check
//!   (`prepare::check`, under a policy built from the same configuration, as the executor
//!   builds it from `SetPolicy`). The two must agree: the broker never lets through what the
//!   executor refuses, and no case panics.
//! * `fuzz_every_function_in_process`: every registered function (and unknown ids) from
//!   arbitrary JSON through the real dispatcher with no executor attached, on one runtime:
//!   a call either fails the broker's validation with a code and a message or reaches the
//!   point where it needs the executor. The end-to-end harness (`fuzz_requests.rs`) stays, with
//!   a small count.
//!
//! `cargo test` runs a short pass (`FUZZ_CASES`, default 256). A long run:
//!
//! ```text
//! FUZZ_CASES=10000000 nice -n 15 cargo test --release -p iii-shell --test fuzz -- fuzz_validate:: --test-threads=1
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use iii_shell_broker::functions::{catalogue, dispatch, CallMeta};
use iii_shell_broker::services::Services;
use iii_shell_broker::validate::exec_request;
use iii_shell_executor::policy::Policy;
use iii_shell_executor::prepare;
use iii_shell_protocol::config::Config;
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, TestRunner};
use serde_json::{Map, Value};

fn cases(default: u32) -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runner(default: u32) -> TestRunner {
    TestRunner::new(PtConfig {
        cases: cases(default),
        failure_persistence: None,
        ..PtConfig::default()
    })
}

/// Progress for long runs (a run stopped early still says how far it got): every 250,000
/// cases, the count, wall time and this process's user and system CPU time.
fn tick(name: &str, n: &std::cell::Cell<u64>, start: std::time::Instant) {
    n.set(n.get() + 1);
    if n.get().is_multiple_of(250_000) {
        let (u, s) = cpu_secs();
        eprintln!(
            "{name}: {} cases, {:.0} s wall, {u} s user, {s} s sys",
            n.get(),
            start.elapsed().as_secs_f64()
        );
    }
}

/// User and system CPU seconds of this process, from `/proc/self/stat` (fields 14 and 15,
/// in clock ticks of 1/100 s on Linux).
fn cpu_secs() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    (
        f.get(11).copied().unwrap_or(0) / 100,
        f.get(12).copied().unwrap_or(0) / 100,
    )
}

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(vec![
            "", " ", "\0", "sh", "/bin/sh", "echo", "true", "rm", "-rf", "/", "sudo", "su",
            "mkfs", "dd", "of=/dev/sda", "shutdown", "reboot", ":(){ :|:& };:", "chmod",
            "777", "curl", "|", ";", "&&", "$(id)", "`id`", "LD_PRELOAD", "LD_LIBRARY_PATH",
            "PATH", "HOME", "BASH_ENV", "IFS", "x=y", "..", "../..", "/etc/shadow", "~", "host",
            "sandbox", "a\0b", "é", "\u{7f}",
        ])
        .prop_map(str::to_string),
        1 => ".{0,10}",
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e20f64..1e20).prop_map(Value::from),
        word().prop_map(Value::from),
    ]
}

fn any_json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((word(), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// An exec payload: mostly well-typed fields with hostile values, sometimes the wrong type.
fn exec_payload() -> impl Strategy<Value = Value> {
    let typed_or_any = |s: BoxedStrategy<Value>| prop_oneof![6 => s, 1 => any_json()];
    let command = typed_or_any(word().prop_map(Value::from).boxed());
    let args = typed_or_any(
        proptest::collection::vec(word(), 0..5)
            .prop_map(|v| Value::Array(v.into_iter().map(Value::from).collect()))
            .boxed(),
    );
    let env = typed_or_any(
        proptest::collection::vec((word(), word()), 0..4)
            .prop_map(|kv| {
                Value::Object(
                    kv.into_iter()
                        .map(|(k, v)| (k, Value::from(v)))
                        .collect::<Map<_, _>>(),
                )
            })
            .boxed(),
    );
    let cwd = typed_or_any(word().prop_map(Value::from).boxed());
    let stdin = typed_or_any(word().prop_map(Value::from).boxed());
    let target = typed_or_any(
        proptest::sample::select(vec!["host", "sandbox", "Host", ""])
            .prop_map(Value::from)
            .boxed(),
    );
    let timeout = typed_or_any(any::<u64>().prop_map(Value::from).boxed());
    (
        proptest::option::weighted(0.95, command),
        proptest::option::of(args),
        proptest::option::of(env),
        proptest::option::of(cwd),
        proptest::option::of(stdin),
        proptest::option::of(target),
        proptest::option::of(timeout),
        any::<u8>(),
    )
        .prop_map(|(c, a, e, w, s, t, to, shape)| {
            let mut m = Map::new();
            for (k, v) in [
                ("command", c),
                ("args", a),
                ("env", e),
                ("cwd", w),
                ("stdin", s),
                ("target", t),
                ("timeout_ms", to),
            ] {
                if let Some(v) = v {
                    m.insert(k.to_string(), v);
                }
            }
            match shape {
                0 => Value::Null,
                1 => Value::Array(vec![Value::Object(m)]),
                2 => Value::from("command"),
                _ => Value::Object(m),
            }
        })
}

fn config(root: &std::path::Path) -> Config {
    let mut c = Config::default();
    c.fs.host_roots = vec![root.to_string_lossy().into_owned()];
    c.working_dir = Some(root.to_string_lossy().into_owned());
    c
}

#[test]
fn fuzz_exec_broker_then_executor_recheck() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let c = config(&root);
    // The policy as the executor builds it from the broker's SetPolicy.
    let json = serde_json::to_string(&c).unwrap();
    let policy = Policy::build(1, &json).expect("the executor accepts the default policy");
    let outcomes = std::cell::RefCell::new(BTreeMap::<String, u64>::new());
    let (n, start) = (std::cell::Cell::new(0), std::time::Instant::now());
    runner(256)
        .run(&exec_payload(), |payload| {
            tick("exec", &n, start);
            let key = match exec_request(&payload, &c) {
                Err(e) => {
                    prop_assert!(!e.message.is_empty(), "{payload}: {e:?}");
                    format!("broker {}", e.code)
                }
                Ok(checked) => match checked.spec {
                    // The sandbox target: nothing goes to the executor.
                    None => "sandbox".to_string(),
                    Some(spec) => {
                        let r = prepare::check(&policy, &spec);
                        prop_assert!(
                            r.is_ok(),
                            "the broker let through what the executor refuses: {payload} -> \
                             {spec:?}: {r:?}"
                        );
                        "both accept".to_string()
                    }
                },
            };
            *outcomes.borrow_mut().entry(key).or_default() += 1;
            Ok(())
        })
        .unwrap();
    let o = outcomes.into_inner();
    eprintln!("outcomes: {o:?}");
    // The generator is not vacuous: payloads reach the executor's re-check and are refused.
    assert!(o.get("both accept").copied().unwrap_or(0) > 0, "{o:?}");
    assert!(o.keys().any(|k| k.starts_with("broker")), "{o:?}");
}

#[test]
fn fuzz_every_function_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let services: Arc<Services> = Services::new();
    let mut c = Config::default();
    c.fs.host_roots = vec![root.to_string_lossy().into_owned()];
    services.snapshots.install(c);
    let mut ids: Vec<String> = catalogue().iter().map(|f| f.id.to_string()).collect();
    ids.push("shell::fs::nope".into());
    ids.push("shell::nope".into());
    let payload = prop_oneof![
        1 => any_json(),
        4 => proptest::collection::vec((word(), any_json()), 0..6)
            .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
    ];
    let slow = std::cell::RefCell::new(BTreeMap::<String, (u64, Duration)>::new());
    let reached = std::cell::Cell::new(0u64);
    let (n, start) = (std::cell::Cell::new(0), std::time::Instant::now());
    runner(256)
        .run(
            &(proptest::sample::select(ids), payload),
            |(id, payload)| {
                tick("every function", &n, start);
                let t0 = std::time::Instant::now();
                let r = rt.block_on(async {
                    tokio::time::timeout(
                        Duration::from_secs(5),
                        dispatch(&services, &id, payload.clone(), CallMeta::default()),
                    )
                    .await
                });
                let took = t0.elapsed();
                {
                    let mut s = slow.borrow_mut();
                    let e = s.entry(id.clone()).or_default();
                    e.0 += 1;
                    e.1 += took;
                }
                match r {
                    Err(_) => return Err(TestCaseError::fail(format!("{id} {payload} hung"))),
                    Ok(Err(e)) => {
                        prop_assert!(
                            !e.code.as_str().is_empty() && !e.message.is_empty(),
                            "{id}: {e:?}"
                        );
                        if e.message.contains("executor went away") {
                            reached.set(reached.get() + 1);
                        }
                    }
                    Ok(Ok(_)) => {}
                }
                Ok(())
            },
        )
        .unwrap();
    let mut per: Vec<_> = slow
        .into_inner()
        .into_iter()
        .map(|(id, (n, d))| (d.as_secs_f64() * 1e6 / n as f64, id, n))
        .collect();
    per.sort_by(|a, b| b.0.total_cmp(&a.0));
    eprintln!(
        "{} reached the executor; slowest (µs per call, id, calls): {:?}",
        reached.get(),
        &per[..per.len().min(6)]
    );
    assert!(reached.get() > 0, "no payload passed validation");
}

/// The case the exec harness found: the broker let an env value with a NUL byte through to
/// the executor, which refused it. The broker now answers first, with the executor's words.
#[test]
fn exec_env_value_with_nul_is_refused_by_the_broker() {
    let c = config(std::path::Path::new("/tmp"));
    let payload = serde_json::json!({"command": "echo", "env": {"A": "a\u{0}b"}});
    let e = exec_request(&payload, &c).expect_err("a NUL in an env value is refused");
    assert_eq!(e.code, "S210");
    assert_eq!(e.message, "env value of 'A' contains a NUL byte");
}
