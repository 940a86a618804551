//! Fuzzing (proptest, stable Rust): request parsing and validation for every registered
//! function, from arbitrary JSON. The payload goes through the real dispatcher with no
//! executor attached, so everything the broker checks runs and nothing is executed: a call
//! either fails validation or reaches the point where it needs the executor (or the engine).
//! No case may panic or hang, and every error carries a code and a message.
//!
//! `cargo test` runs a short pass (`FUZZ_CASES`, default 128). A long run:
//!
//! ```text
//! FUZZ_CASES=10000000 cargo test --release -p iii-shell --test fuzz -- fuzz_requests:: --test-threads=1
//! ```

use std::collections::BTreeSet;
use std::time::Duration;

use iii_shell_broker::functions::{catalogue, dispatch, CallMeta};
use iii_shell_broker::services::Services;
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

/// Every property name in the published request schemas (so objects hit real fields).
fn schema_keys() -> Vec<String> {
    fn walk(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Object(props)) = m.get("properties") {
                    out.extend(props.keys().cloned());
                }
                m.values().for_each(|x| walk(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    for f in catalogue() {
        walk(&f.request_format, &mut out);
    }
    out.extend(["_caller_worker_id".to_string(), "x".to_string()]);
    out.into_iter().collect()
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e20f64..1e20).prop_map(Value::from),
        proptest::sample::select(vec![
            "",
            ".",
            "..",
            "/",
            "/etc/shadow",
            "../x",
            "a/../../b",
            "\0",
            "~",
            "sandbox",
            "host",
            "0777",
            "4755",
            "0",
            "-1",
            "abc",
            "*",
            "**/*",
            "(",
            "rm -rf /",
            "sh",
            "echo",
            "true",
            "LD_PRELOAD",
            "PATH",
            "x=y",
            "base64",
            "utf8",
            "hex",
        ])
        .prop_map(|s| Value::from(s.to_string())),
        ".{0,12}".prop_map(Value::from),
    ]
}

fn json(keys: Vec<String>) -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, move |inner| {
        let keys = keys.clone();
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::vec((proptest::sample::select(keys), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

#[test]
fn fuzz_every_function_from_arbitrary_json() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let services = Services::new();
    let mut c = Config::default();
    c.fs.host_roots = vec![root.to_string_lossy().into_owned()];
    services.snapshots.install(c);
    let mut ids: Vec<String> = catalogue().iter().map(|f| f.id.to_string()).collect();
    ids.push("shell::fs::nope".into());
    ids.push("shell::nope".into());
    let keys = schema_keys();
    // Payloads are mostly objects, as the engine sends them.
    let payload = prop_oneof![
        1 => json(keys.clone()),
        4 => proptest::collection::vec((proptest::sample::select(keys.clone()), json(keys)), 0..8)
            .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
    ];
    // Kept small for CI (the in-process harness, `fuzz_validate.rs`, carries the volume), but
    // large enough that the "some payload passed validation" check (about 1 case in 10) cannot
    // fail by chance: 0.9^128 is about 1e-6.
    let mut runner = TestRunner::new(PtConfig {
        cases: cases(128),
        failure_persistence: None,
        ..PtConfig::default()
    });
    let reached = std::cell::Cell::new(0u64);
    let codes = std::cell::RefCell::new(std::collections::BTreeMap::<String, u64>::new());
    runner
        .run(
            &(proptest::sample::select(ids), payload),
            |(id, payload)| {
                let r = rt.block_on(async {
                    tokio::time::timeout(
                        Duration::from_secs(5),
                        dispatch(&services, &id, payload.clone(), CallMeta::default()),
                    )
                    .await
                });
                let r = match r {
                    Ok(r) => r,
                    Err(_) => {
                        return Err(TestCaseError::fail(format!("{id} {payload} hung")));
                    }
                };
                match r {
                    Err(e) => {
                        prop_assert!(
                            !e.code.as_str().is_empty() && !e.message.is_empty(),
                            "{id}: {e:?}"
                        );
                        if e.message.contains("executor went away") {
                            reached.set(reached.get() + 1);
                        }
                        *codes.borrow_mut().entry(e.code.to_string()).or_default() += 1;
                    }
                    Ok(_) => *codes.borrow_mut().entry("ok".into()).or_default() += 1,
                }
                Ok(())
            },
        )
        .unwrap();
    eprintln!(
        "outcomes: {:?}; {} cases passed validation and reached the executor",
        codes.borrow(),
        reached.get()
    );
    // The generator is not vacuous: some payloads get past every broker check.
    assert!(reached.get() > 0, "no payload passed validation");
}
