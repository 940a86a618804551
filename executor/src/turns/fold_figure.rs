//! The measured figure for folding a session's log: `shell::turns::list` of a session whose one
//! turn holds 50,000 recorded paths (what one hooked recursive `shell::fs::rm` of a directory of
//! 50,000 files leaves: a `meta`, a `pre` and a `post` record per file). Not a test of speed
//! (it asserts only the count); it prints the time. Run it with
//!
//! ```text
//! cargo test -p iii-shell-executor --lib turns::fold_figure -- --ignored --nocapture
//! ```
//!
//! (`III_SHELL_FOLD_PATHS` sets another number of paths.)

use serde_json::json;

use super::store::Store;
use super::Turns;
use crate::policy::Policy;

#[test]
#[ignore = "a measured figure, not a check: run it with --ignored --nocapture"]
fn list_of_a_session_with_50000_recorded_paths() {
    let n: usize = std::env::var("III_SHELL_FOLD_PATHS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let d = tempfile::tempdir().unwrap();
    let (root, data) = (d.path().join("root"), d.path().join("data"));
    std::fs::create_dir_all(&root).unwrap();
    let v = json!({"fs": {"host_roots": [root]},
        "confinement": {"scratch_paths": []}, "turns": {"data_dir": data}});
    let p = Policy::build(1, &v.to_string()).unwrap();
    let store = Store::open(&data, 1 << 30).unwrap();
    let mut recs = vec![json!({"t": "start", "turn_id": "t1", "started_at": 1})];
    for i in 0..n {
        let path = format!("{}/tree/d{:03}/f{i:06}", root.display(), i % 500);
        recs.push(json!({"t": "meta", "turn_id": "t1", "path": path, "kind": "file", "existed": true, "mode": 0o644, "at": 2}));
        recs.push(json!({"t": "pre", "turn_id": "t1", "path": path, "kind": "deleted", "cause": "shell::fs::rm", "before": {"revision": format!("sha256:{i:064x}"), "stored": true}, "at": 2}));
    }
    for i in 0..n {
        let path = format!("{}/tree/d{:03}/f{i:06}", root.display(), i % 500);
        recs.push(
            json!({"t": "post", "turn_id": "t1", "path": path, "after_revision": null, "at": 3}),
        );
    }
    store.append_all("big", &recs).unwrap();
    let t = Turns::default();
    let started = std::time::Instant::now();
    let list = t
        .call(
            &p,
            "shell::turns::list",
            &json!({"session_id": "big"}).to_string(),
        )
        .unwrap();
    let took = started.elapsed();
    assert_eq!(list["turns"][0]["file_count"], n);
    eprintln!("shell::turns::list of one turn with {n} recorded paths: {took:?}");
}
