//! `shell::fs::*` end to end: `iii-shell serve` against the test engine, with a second engine
//! connection as the caller. File bytes travel through engine data channels in both
//! directions (§7 of the engine protocol): byte-exact round trips, framing, bogus and closed
//! channels, caps, a reader that never drains, concurrent streamed writes, a symlink race,
//! and the error codes as a caller sees them.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use iii_shell_protocol::config::Config;
use iii_test_engine::{ChannelRef, ErrorBody, Message, TestClient, TestEngine};
use serde_json::{json, Value};

const CHUNK: usize = 64 * 1024;

/// A worker jailed to `<tmp>/root`, with `<tmp>/outside` next to it.
struct Setup {
    engine: TestEngine,
    worker: Worker,
    caller: Arc<TestClient>,
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

async fn setup(tweak: impl FnOnce(&mut Config)) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let root = base.join("root");
    let outside = base.join("outside");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("x"), "OUTSIDE x").unwrap();
    let mut config = jailed(&root);
    tweak(&mut config);
    let engine = TestEngine::start().await;
    let worker = Worker::builder().engine(&engine).seed(&config).start();
    wait_ready(&engine, &worker).await;
    assert!(
        engine
            .wait_for_function("shell::fs::read", WAIT)
            .await
            .is_some(),
        "{}",
        worker.stderr()
    );
    let caller = Arc::new(engine.client().await);
    Setup {
        engine,
        worker,
        caller,
        _dir: dir,
        root,
        outside,
    }
}

fn code_of(r: &Result<Value, ErrorBody>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v}"),
        Err(e) => e.code.clone(),
    }
}

/// Writes `data` through a fresh channel while the call runs: the caller writes the writer
/// end and closes it; `content` is the reader ref. `extra` is merged into the payload.
async fn write_via_channel(
    c: &TestClient,
    path: &str,
    frames: Vec<Message>,
    extra: Value,
) -> Result<Value, ErrorBody> {
    let (writer, reader) = c.create_channel().await;
    let mut payload = json!({"path": path, "content": reader});
    if let (Some(p), Some(e)) = (payload.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    let feed = async {
        let mut ws = c.open_channel(&writer).await.expect("open the writer end");
        for f in frames {
            // The worker may stop reading (an error): stop writing then.
            if ws.send(f).await.is_err() {
                return;
            }
        }
        let _ = ws.close(None).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await;
    };
    let (r, ()) = tokio::join!(
        c.call_with_timeout("shell::fs::write", payload, Duration::from_secs(120)),
        feed
    );
    r
}

fn frames(data: &[u8]) -> Vec<Message> {
    data.chunks(CHUNK)
        .map(|c| Message::binary(c.to_vec()))
        .collect()
}

/// `shell::fs::read`, then every message of its channel until Close.
async fn read_via_channel(c: &TestClient, path: &str) -> (Value, Vec<Message>) {
    let r = c
        .call("shell::fs::read", json!({"path": path}))
        .await
        .unwrap_or_else(|e| panic!("read {path}: {e:?}"));
    let reader: ChannelRef =
        serde_json::from_value(r["content"].clone()).expect("content is a ContentRef");
    (r.clone(), c.read_channel(&reader).await)
}

fn binary_of(msgs: &[Message]) -> (Vec<u8>, Vec<String>, usize) {
    let (mut bytes, mut texts, mut max) = (Vec::new(), Vec::new(), 0);
    for m in msgs {
        match m {
            Message::Binary(b) => {
                max = max.max(b.len());
                bytes.extend_from_slice(b);
            }
            Message::Text(t) => texts.push(t.as_str().to_string()),
            _ => {}
        }
    }
    (bytes, texts, max)
}

async fn read_bytes(c: &TestClient, path: &str) -> Vec<u8> {
    let (r, msgs) = read_via_channel(c, path).await;
    let (bytes, texts, max) = binary_of(&msgs);
    assert!(texts.is_empty(), "{path}: unexpected text frames {texts:?}");
    assert!(max <= CHUNK, "{path}: a frame of {max} bytes");
    assert_eq!(
        r["size"].as_u64(),
        Some(bytes.len() as u64),
        "{path}: size vs bytes"
    );
    bytes
}

fn pseudo_random(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 7) as u8
        })
        .collect()
}

const MULTI_SCRIPT: &str = "English, Ελληνικά, Русский, עברית, العربية, हिन्दी, 中文, 日本語, 한국어, ไทย, 🦀🚀👩‍👩‍👧, é\u{301}, \u{200f}\n";

// ---------------------------------------------------------------- round trips

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_round_trips_are_byte_exact() {
    let t = setup(|_| {}).await;
    let c = &t.caller;
    let mut nul_laden: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    nul_laden.extend(vec![0u8; 70_000]);
    nul_laden.extend(b"\0\xff\xfe\x00tail\0");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("utf8.txt", MULTI_SCRIPT.repeat(50).into_bytes()),
        ("nul.bin", nul_laden),
        ("512k.bin", pseudo_random(512 * 1024, 1)),
        ("3m.bin", pseudo_random(3 * 1024 * 1024 + 333, 2)),
        ("empty", Vec::new()),
        ("one", vec![0u8]),
    ];
    for (name, data) in &cases {
        let r = write_via_channel(c, name, frames(data), json!({}))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(
            r,
            json!({"bytes_written": data.len(), "path": s(&t.root.join(name)), "files": []}),
            "{name}"
        );
        same_bytes(
            std::fs::read(t.root.join(name)).unwrap(),
            data,
            &format!("{name} on disk"),
        );
        assert_eq!(mode_of(&t.root.join(name)), 0o644);
        let got = read_bytes(c, name).await;
        assert!(
            got == *data,
            "{name}: read back {} bytes, wrote {}",
            got.len(),
            data.len()
        );
    }

    // The read response: a reader ref plus size/mode/mtime; 64 KiB binary frames then Close.
    std::fs::set_permissions(
        t.root.join("3m.bin"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let (r, msgs) = read_via_channel(c, "3m.bin").await;
    let md = std::fs::metadata(t.root.join("3m.bin")).unwrap();
    assert_eq!(r["size"], md.len());
    assert_eq!(r["mode"], "0600");
    assert_eq!(r["mtime"], md.mtime());
    assert_eq!(r["content"]["direction"], "read");
    assert!(
        r["content"]["channel_id"].is_string() && r["content"]["access_key"].is_string(),
        "{r}"
    );
    assert!(
        msgs.iter().all(|m| matches!(m, Message::Binary(_))),
        "only binary frames"
    );
    assert_eq!(msgs.len(), (md.len() as usize).div_ceil(CHUNK));
    assert!(
        msgs[..msgs.len() - 1].iter().all(|m| m.len() == CHUNK),
        "full 64 KiB frames"
    );

    // Inline write, channel read.
    for (name, text) in [
        ("inline-utf8", MULTI_SCRIPT.to_string()),
        ("inline-empty", String::new()),
        ("inline-512k", "q".repeat(512 * 1024)),
    ] {
        let r = c
            .call("shell::fs::write", json!({"path": name, "content": text}))
            .await
            .unwrap();
        assert_eq!(r["bytes_written"], text.len());
        same_bytes(read_bytes(c, name).await, text.as_bytes(), name);
    }

    // Odd framing: tiny and large binary frames, text frames in between (ignored).
    let data = pseudo_random(700_000, 3);
    let mut odd = vec![
        Message::text("{\"note\":\"ignored\"}"),
        Message::binary(data[..1].to_vec()),
    ];
    odd.push(Message::binary(data[1..300_000].to_vec()));
    odd.push(Message::text("also ignored"));
    odd.push(Message::binary(Vec::new()));
    odd.extend(
        data[300_000..]
            .chunks(1000)
            .map(|c| Message::binary(c.to_vec())),
    );
    let r = write_via_channel(c, "odd.bin", odd, json!({"mode": "0640"}))
        .await
        .unwrap();
    assert_eq!(r["bytes_written"], data.len());
    same_bytes(std::fs::read(t.root.join("odd.bin")).unwrap(), &data, "");
    assert_eq!(mode_of(&t.root.join("odd.bin")), 0o640);

    // Names and path forms.
    let long: String = (0..16)
        .map(|i| format!("{i:02}-{}", "ß".repeat(10) + &"y".repeat(180)))
        .collect::<Vec<_>>()
        .join("/");
    for p in [
        "uni/данные/ファイル 📄.bin".to_string(),
        format!("{}//dbl///slash//f", s(&t.root)),
        "sp ace/tab\there".to_string(),
        format!("{long}/leaf"),
    ] {
        let data = pseudo_random(100_000, p.len() as u32);
        let r = write_via_channel(c, &p, frames(&data), json!({"parents": true}))
            .await
            .unwrap_or_else(|e| panic!("{p}: {e:?}"));
        assert_eq!(r["bytes_written"], data.len());
        same_bytes(read_bytes(c, &p).await, &data, &p);
    }
    assert!(t.root.join("dbl/slash/f").is_file());
    assert!(t.root.join(&long).join("leaf").is_file());
    let leftovers: Vec<_> = walk(&t.root)
        .into_iter()
        .filter(|p| p.file_name().unwrap().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_writes_mix_inline_and_channel_content() {
    let t = setup(|_| {}).await;
    let c = &t.caller;
    let data = pseudo_random(200_000, 9);
    let (writer, reader) = c.create_channel().await;
    c.write_channel(&writer, frames(&data)).await;
    let r = c
        .call(
            "shell::fs::write",
            json!({"files": [
                {"path": "b/1.txt", "content": "first", "parents": true},
                {"path": "b/2.bin", "content": reader, "mode": "0600"},
                {"path": "b/3.txt", "content": MULTI_SCRIPT},
            ]}),
        )
        .await
        .unwrap();
    assert_eq!(
        r,
        json!({"bytes_written": 5 + data.len() + MULTI_SCRIPT.len(), "path": "", "files": [
            {"path": s(&t.root.join("b/1.txt")), "bytes_written": 5},
            {"path": s(&t.root.join("b/2.bin")), "bytes_written": data.len()},
            {"path": s(&t.root.join("b/3.txt")), "bytes_written": MULTI_SCRIPT.len()},
        ]})
    );
    same_bytes(std::fs::read(t.root.join("b/2.bin")).unwrap(), &data, "");
    assert_eq!(mode_of(&t.root.join("b/2.bin")), 0o600);
    same_bytes(read_bytes(c, "b/3.txt").await, MULTI_SCRIPT.as_bytes(), "");
}

/// `root` holds `a.txt` = "OLD a" and nothing else; returns the names a failed batch must
/// leave (exactly these, no temp file).
fn old_state(root: &Path) -> Vec<String> {
    std::fs::write(root.join("a.txt"), "OLD a").unwrap();
    std::fs::create_dir_all(root.join("dir")).unwrap();
    names_in(root)
}

/// A `files[]` batch with streamed entries is all-or-nothing. Entries 0 and 1 are
/// channels (one replacing an existing file), entry 2 fails in turn: its channel is over
/// `fs.max_write_bytes`, its target is a directory, its path leaves the jail, its mode is
/// refused. Every time no target changes, no temp file is left, and the error names
/// `files[2]`. Failed before the fix: entries 0 and 1 were written one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_batch_whose_last_entry_fails_changes_nothing() {
    let t = setup(|c| c.fs.max_write_bytes = 1 << 20).await;
    let c = &t.caller;
    let before = old_state(&t.root);
    let data = pseudo_random(300_000, 21);
    let over = pseudo_random((1 << 20) + 1, 22);
    let prewritten = |bytes: Vec<u8>| async move {
        let (writer, reader) = c.create_channel().await;
        c.write_channel(&writer, frames(&bytes)).await;
        reader
    };
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"path": "c.bin", "content": prewritten(over.clone()).await}),
            "S218",
            "max_write_bytes",
        ),
        (
            json!({"path": "dir", "content": prewritten(b"x".to_vec()).await}),
            "S212",
            "is a directory",
        ),
        (
            json!({"path": "../outside/x", "content": prewritten(b"x".to_vec()).await}),
            "S215",
            "",
        ),
        (
            json!({"path": "c.bin", "content": "inline", "mode": "4755"}),
            "S210",
            "",
        ),
    ];
    for (last, code, needle) in cases {
        let files = json!([
            {"path": "a.txt", "content": prewritten(data.clone()).await},
            {"path": "b.bin", "content": prewritten(b"new b".to_vec()).await},
            last,
        ]);
        let e = c
            .call("shell::fs::write", json!({ "files": files }))
            .await
            .expect_err("the batch must fail");
        assert_eq!(e.code, code, "{e:?}");
        assert!(e.message.contains(needle), "{e:?}");
        assert!(
            e.message.contains("files[2]"),
            "the error names the entry: {e:?}"
        );
        assert_eq!(
            std::fs::read_to_string(t.root.join("a.txt")).unwrap(),
            "OLD a",
            "{e:?}"
        );
        assert_eq!(names_in(&t.root), before, "{e:?}");
        assert_eq!(names_in(&t.outside), ["x"]);
        assert_eq!(
            std::fs::read_to_string(t.outside.join("x")).unwrap(),
            "OUTSIDE x"
        );
    }
    // The same batch with a good last entry lands whole.
    let files = json!([
        {"path": "a.txt", "content": prewritten(data.clone()).await},
        {"path": "b.bin", "content": prewritten(b"new b".to_vec()).await},
        {"path": "c.bin", "content": "inline c"},
    ]);
    let r = c
        .call("shell::fs::write", json!({ "files": files }))
        .await
        .unwrap();
    assert_eq!(r["bytes_written"], data.len() + 5 + 8, "{r}");
    same_bytes(std::fs::read(t.root.join("a.txt")).unwrap(), &data, "a.txt");
    assert_eq!(
        std::fs::read_to_string(t.root.join("b.bin")).unwrap(),
        "new b"
    );
    assert_eq!(names_in(&t.root), ["a.txt", "b.bin", "c.bin", "dir"]);
}

/// The peak resident memory (`VmHWM`) of process `pid`, in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in /proc/{pid}/status"))
}

/// A `files[]` batch of 20 MiB mixing inline and channel entries whose LAST entry
/// fails only when it is renamed into place (its target lies in a sticky directory and
/// belongs to another user, so the kernel refuses the rename with EPERM). Every entry is
/// staged first; the commit renames them in order, and the failing rename rolls back the
/// ones already done: the replaced file gets its old bytes back, the new files are gone, no
/// temp file or pre-image is left, and the error names `files[3]`. The executor's peak memory
/// grows far less than the batch (entries are streamed to their temp files). The same holds
/// for a small inline batch (one request to the executor). Failed before the fix: the first
/// entries stayed written (`a.txt` held the new bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_20_mib_batch_whose_last_rename_fails_changes_nothing() {
    if !is_root() {
        panic!("this test needs root (a file owned by another user); run it as root");
    }
    let t = setup(|_| {}).await;
    let c = &t.caller;
    std::fs::write(t.root.join("a.txt"), "OLD a").unwrap();
    let st = t.root.join("st");
    std::fs::create_dir(&st).unwrap();
    std::fs::write(st.join("theirs"), "THEIRS").unwrap();
    std::os::unix::fs::chown(st.join("theirs"), Some(4343), Some(4343)).unwrap();
    std::fs::set_permissions(st.join("theirs"), std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::chown(&st, Some(4343), Some(4343)).unwrap();
    std::fs::set_permissions(&st, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let (root_before, st_before) = (names_in(&t.root), names_in(&st));
    let unchanged = |what: &str| {
        let a_now = std::fs::read(t.root.join("a.txt")).unwrap();
        assert!(
            a_now == b"OLD a",
            "{what}: the replaced file keeps its bytes, but holds {} bytes",
            a_now.len()
        );
        assert_eq!(
            names_in(&t.root),
            root_before,
            "{what}: no new file, no temp file"
        );
        assert_eq!(names_in(&st), st_before, "{what}");
        assert_eq!(
            std::fs::read_to_string(st.join("theirs")).unwrap(),
            "THEIRS"
        );
    };
    let text = |n: usize, seed: u32| -> String {
        pseudo_random(n, seed)
            .into_iter()
            .map(|b| char::from(b'a' + b % 26))
            .collect()
    };
    let (a, c_txt) = (text(7 << 20, 41), text(6 << 20, 42));
    let b = pseudo_random(7 << 20, 43);
    let pid = t.worker.executor_pid().expect("the executor's pid");
    let peak = peak_rss_kib(pid);
    let (wb, rb) = c.create_channel().await;
    let (wt, rt) = c.create_channel().await;
    let files = json!([
        {"path": "a.txt", "content": a},
        {"path": "b.bin", "content": rb},
        {"path": "c.txt", "content": c_txt},
        {"path": "st/theirs", "content": rt},
    ]);
    let feed = async {
        c.write_channel(&wb, frames(&b)).await;
        c.write_channel(&wt, frames(&[9u8; 4096])).await;
    };
    let (r, ()) = tokio::join!(
        c.call_with_timeout(
            "shell::fs::write",
            json!({ "files": files }),
            Duration::from_secs(120)
        ),
        feed
    );
    let e = r.expect_err("the last rename fails");
    assert_eq!(e.code, "S216", "{e:?}");
    assert!(
        e.message
            .contains("files[3] (st/theirs): rename: Operation not permitted")
            && e.message.contains("no file was written"),
        "{e:?}"
    );
    unchanged("20 MiB staged batch");
    let grown = peak_rss_kib(pid).saturating_sub(peak);
    assert!(
        grown < 8 << 10,
        "the executor's peak memory grew {grown} KiB for a 20 MiB batch"
    );
    // A small all-inline batch goes to the executor as one request: the same outcome.
    let e = c
        .call(
            "shell::fs::write",
            json!({"files": [
                {"path": "a.txt", "content": "new a"},
                {"path": "n.txt", "content": "new n"},
                {"path": "st/theirs", "content": "mine"},
            ]}),
        )
        .await
        .expect_err("the last rename fails");
    assert_eq!(e.code, "S216", "{e:?}");
    assert!(e.message.contains("files[2]"), "{e:?}");
    unchanged("inline batch");
}

/// A staged batch is bounded: more than 256 entries is S218 naming the first one
/// past the cap, and nothing is written. Inline entries over 8 MiB in total take the staged
/// path (they do not fit one frame).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_batch_past_the_entry_cap_is_s218_and_writes_nothing() {
    let t = setup(|_| {}).await;
    let c = &t.caller;
    let before = old_state(&t.root);
    let body = "y".repeat(40 * 1024);
    let files: Vec<Value> = (0..257)
        .map(|i| json!({"path": format!("many/{i}.txt"), "content": body, "parents": true}))
        .collect();
    let e = c
        .call_with_timeout(
            "shell::fs::write",
            json!({ "files": files }),
            Duration::from_secs(120),
        )
        .await
        .expect_err("past the cap");
    assert_eq!(e.code, "S218", "{e:?}");
    assert!(
        e.message.contains("files[256]") && e.message.contains("256 files staged"),
        "{e:?}"
    );
    // `parents: true` made the directory; no file is in it.
    assert_eq!(names_in(&t.root.join("many")), Vec::<String>::new());
    let mut want = before.clone();
    want.push("many".into());
    want.sort();
    assert_eq!(names_in(&t.root), want);
    // 256 entries fit.
    let r = c
        .call_with_timeout(
            "shell::fs::write",
            json!({ "files": files[..256] }),
            Duration::from_secs(120),
        )
        .await
        .unwrap();
    assert_eq!(r["files"].as_array().unwrap().len(), 256);
    assert_eq!(names_in(&t.root.join("many")).len(), 256);
}

/// The executor is killed (SIGKILL) while a streamed batch is staged, one entry
/// complete and the next one's channel still open. The call fails, no target changes, and
/// no temp file is left anywhere in the root (staged entries have no name until commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_killed_mid_batch_leaves_nothing_behind() {
    let t = setup(|_| {}).await;
    let c = &t.caller;
    let before = old_state(&t.root);
    let (w0, r0) = c.create_channel().await;
    c.write_channel(&w0, frames(&pseudo_random(200_000, 31)))
        .await;
    // Entry 1: a channel whose writer sends one chunk and then stalls.
    let (w1, r1) = c.create_channel().await;
    let mut ws1 = c.open_channel(&w1).await.expect("open the writer end");
    ws1.send(Message::binary(vec![7u8; 1000])).await.unwrap();
    let call = c.call_with_timeout(
        "shell::fs::write",
        json!({"files": [
            {"path": "a.txt", "content": r0},
            {"path": "b.bin", "content": r1},
        ]}),
        Duration::from_secs(60),
    );
    let killer = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let pid = t.worker.executor_pid().expect("the executor's pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    };
    let (r, ()) = tokio::join!(call, killer);
    let e = r.expect_err("the executor died mid-batch");
    assert_eq!(e.code, "S216", "{e:?}");
    assert!(e.message.contains("files[1]"), "{e:?}");
    drop(ws1);
    assert_eq!(
        std::fs::read_to_string(t.root.join("a.txt")).unwrap(),
        "OLD a"
    );
    assert_eq!(names_in(&t.root), before);
    // The worker serves again (a new executor), and the same batch now lands (a fresh
    // channel each try: a try that meets the restart window may have spent its channel).
    let r = loop {
        let (w0, r0) = c.create_channel().await;
        c.write_channel(&w0, frames(b"fresh")).await;
        match c
            .call("shell::fs::write", json!({"files": [{"path": "a.txt", "content": r0}, {"path": "b.bin", "content": "b"}]}))
            .await
        {
            Err(e) if e.code == "S216" => tokio::time::sleep(Duration::from_millis(200)).await,
            other => break other,
        }
    };
    r.unwrap();
    assert_eq!(
        std::fs::read_to_string(t.root.join("a.txt")).unwrap(),
        "fresh"
    );
}

// ---------------------------------------------------------------- bad channels

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bogus_and_spent_channels_fail_cleanly_and_the_worker_stays_healthy() {
    let t = setup(|_| {}).await;
    let c = &t.caller;
    let started = Instant::now();
    // Unknown channel id; a real id with a wrong key.
    let (_w, real) = c.create_channel().await;
    for content in [
        json!({"channel_id": uuid::Uuid::new_v4().to_string(), "access_key": uuid::Uuid::new_v4().to_string(), "direction": "read"}),
        json!({"channel_id": real.channel_id, "access_key": uuid::Uuid::new_v4().to_string()}),
        json!({"channel_id": "not a uuid", "access_key": "??&dir=write"}),
    ] {
        let r = c
            .call(
                "shell::fs::write",
                json!({"path": "bogus", "content": content}),
            )
            .await;
        let e = r.as_ref().expect_err("a bogus channel wrote something");
        assert_eq!(e.code, "S216", "{e:?}");
        assert!(e.message.contains("channel"), "{e:?}");
    }
    assert!(!t.root.join("bogus").exists());

    // A channel whose reader end was already used: zero bytes or a clean error, never a hang.
    let data = b"first use".to_vec();
    let (writer, reader) = c.create_channel().await;
    c.write_channel(&writer, frames(&data)).await;
    let r = c
        .call(
            "shell::fs::write",
            json!({"path": "used-once", "content": reader}),
        )
        .await
        .unwrap();
    assert_eq!(r["bytes_written"], data.len());
    match c
        .call(
            "shell::fs::write",
            json!({"path": "used-twice", "content": reader}),
        )
        .await
    {
        Ok(r) => {
            assert_eq!(r["bytes_written"], 0, "{r}");
            same_bytes(std::fs::read(t.root.join("used-twice")).unwrap(), b"", "");
        }
        Err(e) => assert_eq!(e.code, "S216", "{e:?}"),
    }
    // A read's channel can only be opened once, too: the second reader just gets closed.
    std::fs::write(t.root.join("r.txt"), "read me").unwrap();
    let r = c
        .call("shell::fs::read", json!({"path": "r.txt"}))
        .await
        .unwrap();
    let reader: ChannelRef = serde_json::from_value(r["content"].clone()).unwrap();
    assert_eq!(c.read_channel_bytes(&reader).await.0, b"read me");
    let (again, _) = c.read_channel_bytes(&reader).await;
    assert!(again.is_empty());
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "bad channels took {:?}",
        started.elapsed()
    );

    // Still healthy.
    let r = write_via_channel(c, "after", frames(b"fine"), json!({}))
        .await
        .unwrap();
    assert_eq!(r["bytes_written"], 4);
    same_bytes(read_bytes(c, "after").await, b"fine", "");
    assert!(alive(t.worker.pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_nobody_writes_times_out_instead_of_hanging() {
    let t = setup(|_| {}).await;
    let c = &t.caller;
    let (_writer, reader) = c.create_channel().await;
    let started = Instant::now();
    let r = c
        .call_with_timeout(
            "shell::fs::write",
            json!({"path": "never", "content": reader}),
            Duration::from_secs(90),
        )
        .await;
    assert_eq!(code_of(&r), "S216", "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(75),
        "{:?}",
        started.elapsed()
    );
    assert!(!t.root.join("never").exists());
    assert!(names_in(&t.root).is_empty(), "{:?}", names_in(&t.root));
    let r = c
        .call(
            "shell::fs::write",
            json!({"path": "after", "content": "ok"}),
        )
        .await
        .unwrap();
    assert_eq!(r["bytes_written"], 2);
}

// ---------------------------------------------------------------- caps

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_are_s218_and_leave_nothing_behind() {
    let t = setup(|c| {
        c.fs.max_read_bytes = 1 << 20;
        c.fs.max_write_bytes = 1 << 20;
    })
    .await;
    let c = &t.caller;
    // Streamed write over the cap: S218 while streaming; no file, no temp file.
    let data = pseudo_random(3 << 20, 4);
    let r = write_via_channel(c, "over.bin", frames(&data), json!({})).await;
    let e = r.expect_err("over the cap");
    assert_eq!(e.code, "S218", "{e:?}");
    assert!(e.message.contains("max_write_bytes"), "{e:?}");
    // Exactly the cap is fine.
    let r = write_via_channel(c, "exact.bin", frames(&data[..1 << 20]), json!({}))
        .await
        .unwrap();
    assert_eq!(r["bytes_written"], 1 << 20);
    // Inline over the cap.
    let r = c
        .call(
            "shell::fs::write",
            json!({"path": "over.txt", "content": "x".repeat((1 << 20) + 1)}),
        )
        .await;
    assert_eq!(code_of(&r), "S218");
    assert_eq!(names_in(&t.root), ["exact.bin"]);

    // Read over the cap.
    std::fs::write(t.root.join("big.bin"), &data).unwrap();
    let r = c.call("shell::fs::read", json!({"path": "big.bin"})).await;
    assert_eq!(code_of(&r), "S218");
    assert!(r.unwrap_err().message.contains("max_read_bytes"));
    same_bytes(read_bytes(c, "exact.bin").await, &data[..1 << 20], "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_growing_past_the_cap_mid_stream_ends_with_an_error_frame() {
    const CAP: usize = 32 << 20;
    let t = setup(|c| c.fs.max_read_bytes = CAP as u64).await;
    let c = &t.caller;
    let data = pseudo_random(CAP, 5);
    std::fs::write(t.root.join("grows.bin"), &data).unwrap();
    let r = c
        .call("shell::fs::read", json!({"path": "grows.bin"}))
        .await
        .unwrap();
    assert_eq!(r["size"], CAP);
    // Nobody drains yet, so the stream stalls long before the end; then the file grows.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(t.root.join("grows.bin"))
            .unwrap();
        f.write_all(&[1u8; 256 * 1024]).unwrap();
    }
    let reader: ChannelRef = serde_json::from_value(r["content"].clone()).unwrap();
    let msgs = c.read_channel(&reader).await;
    let (bytes, texts, _) = binary_of(&msgs);
    assert!(
        bytes.len() <= CAP && bytes[..] == data[..bytes.len()],
        "{} bytes",
        bytes.len()
    );
    assert_eq!(texts.len(), 1, "{texts:?}");
    let err: Value = serde_json::from_str(&texts[0]).expect("the error frame is JSON");
    assert!(
        err["error"]
            .as_str()
            .is_some_and(|e| e.contains("max_read_bytes")),
        "{err}"
    );
    assert!(
        matches!(msgs.last(), Some(Message::Text(_))),
        "the error frame comes last, before Close"
    );
}

// ---------------------------------------------------------------- back-pressure

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_never_drains_does_not_wedge_the_worker() {
    let t = setup(|c| c.fs.max_read_bytes = 0).await;
    let c = &t.caller;
    let big = pseudo_random(48 << 20, 6);
    std::fs::write(t.root.join("big.bin"), &big).unwrap();
    // Three reads nobody ever drains.
    let stuck_since = Instant::now();
    let mut stuck = Vec::new();
    for _ in 0..3 {
        let r = c
            .call("shell::fs::read", json!({"path": "big.bin"}))
            .await
            .unwrap();
        assert_eq!(r["size"], big.len());
        stuck.push(r);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Everything else keeps working, streams included.
    let started = Instant::now();
    for i in 0..10 {
        let name = format!("f{i}");
        let data = pseudo_random(150_000 + i, i as u32);
        let r = write_via_channel(c, &name, frames(&data), json!({}))
            .await
            .unwrap();
        assert_eq!(r["bytes_written"], data.len());
        same_bytes(read_bytes(c, &name).await, &data, "");
        let st = c
            .call("shell::fs::stat", json!({"path": name}))
            .await
            .unwrap();
        assert_eq!(st["size"], data.len());
        let r = c
            .call("shell::exec", json!({"command": "true"}))
            .await
            .unwrap();
        assert_eq!(r["exit_code"], 0);
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "calls were slowed to {:?}",
        started.elapsed()
    );
    // A stuck stream can still be drained late, from where it stalled (unless the worker
    // already gave up on it after its 30 s idle limit, on a very slow box).
    let reader: ChannelRef = serde_json::from_value(stuck[0]["content"].clone()).unwrap();
    let in_time = stuck_since.elapsed() < Duration::from_secs(20);
    let (bytes, _) = c.read_channel_bytes(&reader).await;
    assert!(
        bytes[..] == big[..bytes.len()],
        "a late reader got other bytes"
    );
    if in_time {
        assert!(
            bytes.len() == big.len(),
            "a late reader got {} of {} bytes",
            bytes.len(),
            big.len()
        );
    }
    assert!(alive(t.worker.pid));
}

// ---------------------------------------------------------------- atomicity

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_channel_writes_leave_exactly_one_payload() {
    let t = setup(|_| {}).await;
    let payloads: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..8)
            .map(|i| pseudo_random((1 << 20) + i * 4099, 100 + i as u32))
            .collect(),
    );
    for round in 0..2 {
        let tasks: Vec<_> = (0..payloads.len())
            .map(|i| {
                let (c, p) = (t.caller.clone(), payloads.clone());
                tokio::spawn(async move {
                    write_via_channel(&c, "same.bin", frames(&p[i]), json!({})).await
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let got = std::fs::read(t.root.join("same.bin")).unwrap();
        assert!(
            payloads.contains(&got),
            "round {round}: not exactly one payload ({} bytes)",
            got.len()
        );
        assert_eq!(names_in(&t.root), ["same.bin"], "temp files left behind");
        same_bytes(read_bytes(&t.caller, "same.bin").await, &got, "");
    }
}

// ---------------------------------------------------------------- race

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_directory_never_lets_a_stream_escape() {
    let t = setup(|_| {}).await;
    let c = &t.caller;
    let (root, outside) = (t.root.clone(), t.outside.clone());
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("d/x"), "inside x").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("d-swap")).unwrap();
    let mtime = std::fs::metadata(outside.join("x")).unwrap().mtime_nsec();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (a, b, stop) = (root.join("d"), root.join("d-swap"), stop.clone());
        std::thread::spawn(move || {
            let a = std::ffi::CString::new(a.as_os_str().as_encoded_bytes()).unwrap();
            let b = std::ffi::CString::new(b.as_os_str().as_encoded_bytes()).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: renameat2 with two NUL-terminated paths.
                let rc = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
                n += 1;
            }
            n
        })
    };
    let (mut ok, mut escaped) = (0, 0);
    for i in 0..150 {
        match c.call("shell::fs::read", json!({"path": "d/x"})).await {
            Ok(r) => {
                ok += 1;
                let reader: ChannelRef = serde_json::from_value(r["content"].clone()).unwrap();
                let (bytes, _) = c.read_channel_bytes(&reader).await;
                assert_eq!(bytes, b"inside x", "read the outside file");
            }
            Err(e) if e.code == "S215" => escaped += 1,
            Err(e) => panic!("read: {e:?}"),
        }
        match write_via_channel(c, &format!("d/w{i}"), frames(b"inside"), json!({})).await {
            Ok(_) => ok += 1,
            Err(e) if e.code == "S215" => escaped += 1,
            Err(e) => panic!("write: {e:?}"),
        }
        match write_via_channel(
            c,
            &format!("d/p{i}/q/w"),
            frames(b"inside"),
            json!({"parents": true}),
        )
        .await
        {
            Ok(_) => ok += 1,
            Err(e) if e.code == "S215" => escaped += 1,
            Err(e) => panic!("write -p: {e:?}"),
        }
        match c
            .call(
                "shell::fs::write",
                json!({"path": "d/x", "content": "inside x"}),
            )
            .await
        {
            Ok(_) => ok += 1,
            Err(e) if e.code == "S215" => escaped += 1,
            Err(e) => panic!("overwrite: {e:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert_eq!(
        names_in(&outside),
        ["x"],
        "something appeared outside the jail"
    );
    same_bytes(std::fs::read(outside.join("x")).unwrap(), b"OUTSIDE x", "");
    assert_eq!(
        std::fs::metadata(outside.join("x")).unwrap().mtime_nsec(),
        mtime
    );
    assert!(
        ok > 20 && escaped > 20,
        "the race was not exercised: {ok} ok, {escaped} S215"
    );
}

// ---------------------------------------------------------------- error codes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_codes_as_the_caller_sees_them() {
    let t = setup(|c| {
        c.fs.max_read_bytes = 1000;
        c.fs.max_write_bytes = 1000;
    })
    .await;
    let (c, root) = (&t.caller, &t.root);
    std::fs::create_dir_all(root.join("full/inner")).unwrap();
    std::fs::write(root.join("file"), "f").unwrap();
    std::fs::write(root.join("big"), vec![b'b'; 1001]).unwrap();
    std::fs::write(root.join(".env"), "SECRET=1").unwrap();
    std::os::unix::fs::symlink(&t.outside, root.join("out")).unwrap();

    let cases: Vec<(&str, Value, &str)> = vec![
        // S210: malformed payloads, bad modes, mixed write forms, missing content.
        ("shell::fs::ls", json!({"path": ["a"]}), "S210"),
        (
            "shell::fs::mkdir",
            json!({"path": "m", "mode": "0x755"}),
            "S210",
        ),
        (
            "shell::fs::mkdir",
            json!({"path": "m", "mode": "4755"}),
            "S210",
        ),
        (
            "shell::fs::chmod",
            json!({"path": "file", "mode": "1644"}),
            "S210",
        ),
        (
            "shell::fs::write",
            json!({"path": "w", "content": "x", "mode": "2644"}),
            "S210",
        ),
        (
            "shell::fs::write",
            json!({"path": "w", "content": "x", "files": [{"path": "v", "content": "y"}]}),
            "S210",
        ),
        ("shell::fs::write", json!({"files": []}), "S210"),
        ("shell::fs::write", json!({"path": "w"}), "S210"),
        ("shell::fs::rm", json!({"path": "."}), "S210"),
        ("shell::fs::read", json!({"path": ""}), "S210"),
        (
            "shell::fs::read",
            json!({"path": "x", "target": {"kind": "sandbox", "sandbox_id": "nope"}}),
            "S210",
        ),
        // S211: missing, denied, protected.
        ("shell::fs::read", json!({"path": "missing"}), "S211"),
        ("shell::fs::read", json!({"path": ".env"}), "S211"),
        ("shell::fs::stat", json!({"path": "missing"}), "S211"),
        ("shell::fs::rm", json!({"path": "missing"}), "S211"),
        (
            "shell::fs::mv",
            json!({"src": "missing", "dst": "x"}),
            "S211",
        ),
        (
            "shell::fs::write",
            json!({"path": "no/parent", "content": "x"}),
            "S211",
        ),
        (
            "shell::fs::write",
            json!({"path": "sub/.env", "content": "x", "parents": true}),
            "S211",
        ),
        (
            "shell::workspace::read-bytes",
            json!({"path": ".env"}),
            "S211",
        ),
        // S212: wrong type.
        ("shell::fs::read", json!({"path": "full"}), "S212"),
        ("shell::fs::ls", json!({"path": "file"}), "S212"),
        (
            "shell::fs::write",
            json!({"path": "full", "content": "x"}),
            "S212",
        ),
        (
            "shell::workspace::validate",
            json!({"path": "file"}),
            "S212",
        ),
        // S213: exists.
        ("shell::fs::mkdir", json!({"path": "full"}), "S213"),
        (
            "shell::fs::mv",
            json!({"src": "file", "dst": "big"}),
            "S213",
        ),
        // S214: not empty.
        ("shell::fs::rm", json!({"path": "full"}), "S214"),
        // S215: escapes.
        ("shell::fs::read", json!({"path": "../outside/x"}), "S215"),
        ("shell::fs::read", json!({"path": "out/x"}), "S215"),
        (
            "shell::fs::read",
            json!({"path": s(&t.outside.join("x"))}),
            "S215",
        ),
        (
            "shell::fs::write",
            json!({"path": "out/new", "content": "x"}),
            "S215",
        ),
        (
            "shell::fs::mkdir",
            json!({"path": "out/a/b", "parents": true}),
            "S215",
        ),
        ("shell::fs::ls", json!({"path": "/"}), "S215"),
        // S218: caps.
        ("shell::fs::read", json!({"path": "big"}), "S218"),
        (
            "shell::fs::write",
            json!({"path": "w", "content": "y".repeat(1001)}),
            "S218",
        ),
    ];
    for (func, payload, code) in &cases {
        let r = c.call(func, payload.clone()).await;
        let e = r
            .as_ref()
            .expect_err(&format!("{func} {payload} succeeded"));
        assert_eq!(&e.code, code, "{func} {payload}: {e:?}");
        assert!(!e.message.is_empty());
        if *code == "S215" {
            assert!(
                e.message.starts_with("path escapes the fs jail roots"),
                "{e:?}"
            );
        }
    }
    // S218 for a streamed write too.
    let r = write_via_channel(c, "w", frames(&[7u8; 5000]), json!({})).await;
    assert_eq!(code_of(&r), "S218");
    // Redaction over the wire: the denied and the missing look the same but for the path.
    let a = c
        .call("shell::fs::read", json!({"path": ".env"}))
        .await
        .unwrap_err();
    let b = c
        .call("shell::fs::read", json!({"path": "nope"}))
        .await
        .unwrap_err();
    assert_eq!(
        (a.code.as_str(), a.message.replace(".env", "P")),
        (b.code.as_str(), b.message.replace("nope", "P"))
    );
    assert!(
        !root.join("w").exists()
            && !root.join("m").exists()
            && !t.outside.join("new").exists()
            && !t.outside.join("a").exists()
    );
    assert_eq!(names_in(&t.outside), ["x"]);
    let _ = &t.engine;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unjailed_paths_through_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let engine = TestEngine::start().await;
    let worker = Worker::builder()
        .engine(&engine)
        .seed(&Config::builtin_default())
        .start();
    wait_ready(&engine, &worker).await;
    assert!(engine
        .wait_for_function("shell::fs::write", WAIT)
        .await
        .is_some());
    let c = engine.client().await;
    for rel in ["rel/path", "~/x", "./x"] {
        let r = c
            .call("shell::fs::write", json!({"path": rel, "content": "x"}))
            .await;
        assert_eq!(code_of(&r), "S210", "{rel}");
        let r = c.call("shell::fs::read", json!({"path": rel})).await;
        assert_eq!(code_of(&r), "S210", "{rel}");
    }
    let p = format!("/{}//a///b", s(&base));
    let r = write_via_channel(&c, &p, frames(b"abs"), json!({"parents": true}))
        .await
        .unwrap();
    assert_eq!(r["path"], s(&base.join("a/b")));
    same_bytes(read_bytes(&c, &s(&base.join("a/b"))).await, b"abs", "");
    let r = c
        .call("shell::fs::read", json!({"path": "/etc/shadow"}))
        .await;
    assert_eq!(code_of(&r), "S211");
}

/// The caller may finish writing (and closing) the channel before it calls `write`: the data
/// is then ready the moment the worker opens the channel, and must still never stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prewritten_channels_never_stall() {
    let t = setup(|_| {}).await;
    let c = &t.caller;
    for i in 0..24 {
        let data = pseudo_random(600_000 + i, 40 + i as u32);
        let (writer, reader) = c.create_channel().await;
        c.write_channel(&writer, frames(&data)).await;
        let started = Instant::now();
        let r = c
            .call_with_timeout(
                "shell::fs::write",
                json!({"path": format!("pre{i}"), "content": reader}),
                Duration::from_secs(60),
            )
            .await
            .unwrap_or_else(|e| panic!("write {i}: {e:?}"));
        assert_eq!(r["bytes_written"], data.len());
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "write {i} stalled for {:?}",
            started.elapsed()
        );
        same_bytes(
            std::fs::read(t.root.join(format!("pre{i}"))).unwrap(),
            &data,
            "pre",
        );
    }
}

/// FS-31: one channel frame over `fs.max_write_bytes` is S218 as soon as it arrives, while
/// the writer still holds the channel open: not an S216 once the channel has been idle.
/// (A frame over the engine's own WebSocket frame limit, 16 MiB, never reaches the worker:
/// see docs/limits.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_frame_over_the_write_cap_is_s218_at_once() {
    for cap in [1usize << 20, 8 << 20] {
        let t = setup(|c| c.fs.max_write_bytes = cap as u64).await;
        let c = &t.caller;
        let (writer, reader) = c.create_channel().await;
        let (answered_tx, answered_rx) = tokio::sync::oneshot::channel::<()>();
        let feed = async {
            let mut ws = c.open_channel(&writer).await.expect("open the writer end");
            let _ = ws.send(Message::binary(vec![b'x'; cap + 1])).await;
            // Hold the channel open (no Close) until the call has answered.
            let _ = tokio::time::timeout(Duration::from_secs(60), answered_rx).await;
            let _ = ws.close(None).await;
        };
        let call = async {
            let r = c
                .call_with_timeout(
                    "shell::fs::write",
                    json!({"path": "one.bin", "content": reader}),
                    Duration::from_secs(120),
                )
                .await;
            let _ = answered_tx.send(());
            r
        };
        let (r, ()) = tokio::join!(call, feed);
        let e = match r {
            Ok(v) => panic!("cap {cap}: one frame over the cap answered {v}"),
            Err(e) => e,
        };
        assert_eq!(e.code, "S218", "cap {cap}: {e:?}");
        assert!(e.message.contains("max_write_bytes"), "cap {cap}: {e:?}");
        assert_eq!(names_in(&t.root), Vec::<String>::new(), "cap {cap}");
    }
}
