//! The console page in a real browser, and the reproducibility of its bundle.
//!
//! * `the_served_bundle_is_a_fresh_build_of_the_lockfile`: `npm ci && npm run build` of `web/`
//!   in a scratch copy produces exactly the bytes `shell::ui-content` serves (the committed
//!   `web/dist/`, embedded in the binary).
//! * `the_page_works_in_headless_chromium`: the test engine, `iii-shell serve`, a connection
//!   playing the iii console (owner of `console:script` / `console:style`: it receives our
//!   bindings and fetches the assets through `shell::ui-content`), and a small HTTP server
//!   for the test host page (`web/host/`, our stand-in for the console SPA: `setup(host)`
//!   with the engine client, the page slot and trigger bindings) serving the fetched assets at
//!   `/ui/<path>` as the console does. `web/host/drive.mjs` then drives Debian's Chromium
//!   through playwright-core: pick a workspace, see a file made by `shell::exec` appear in
//!   the tree within a second, open it, change it with `coder::update-file` inside a harness
//!   turn and see the diff, see the sessions with recorded turns listed newest first (turn
//!   counts, times) and open one with a click, revert the turn and see it restored (the
//!   session that gets a new turn moves to the top; a typed id still loads), type `echo hi` in a
//!   terminal and see `hi`, reload and see the scrollback replayed (and the workspace, the open
//!   file and the font size kept), leave the page and adopt its orphaned terminal session.
//!   Nothing may be fetched from any other origin. Screenshots go to `target/ui-screenshots/`.
//!
//! Both need node/npm (and the browser test Chromium at /usr/bin/chromium). Without them the
//! tests say so and pass on a developer machine; on CI (`CI=true` or
//! `III_SHELL_REQUIRE_ROOT=1`) a missing tool fails them.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::*;
use iii_shell_protocol::config::Config;
use iii_test_engine::TestEngine;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CHROMIUM: &str = "/usr/bin/chromium";

fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
        || std::env::var("III_SHELL_REQUIRE_ROOT").is_ok_and(|v| v == "1")
}

fn on_path(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether the tools are here; on CI their absence is a failure, never a skip.
fn tools(need_browser: bool) -> bool {
    let mut missing = Vec::new();
    for t in ["node", "npm"] {
        if !on_path(t) {
            missing.push(t.to_string());
        }
    }
    if need_browser && !Path::new(CHROMIUM).exists() {
        missing.push(CHROMIUM.to_string());
    }
    if missing.is_empty() {
        return true;
    }
    let msg = format!(
        "missing {}: install Debian's nodejs, npm and chromium (.ci/run does)",
        missing.join(", ")
    );
    assert!(!required(), "{msg}");
    eprintln!("SKIPPED (not on CI): {msg}");
    false
}

fn web_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../web")
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name == "node_modules" || name == "dist" {
            continue;
        }
        let (src, dst) = (e.path(), to.join(&name));
        if e.file_type().unwrap().is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

fn run(dir: &Path, program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("npm_config_audit", "false")
        .env("npm_config_fund", "false")
        .env("npm_config_update_notifier", "false")
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// `npm ci && npm run build` in a scratch copy of `web/` (once per test binary).
fn fresh_build() -> &'static Result<PathBuf, String> {
    static BUILD: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILD.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-page-build");
        let _ = std::fs::remove_dir_all(&dir);
        copy_tree(&web_dir(), &dir);
        // --ignore-scripts: no package's install script runs (esbuild finds its binary in its
        // platform package without one).
        run(
            &dir,
            "npm",
            &["ci", "--ignore-scripts", "--no-audit", "--no-fund"],
        )?;
        run(&dir, "npm", &["run", "build"])?;
        Ok(dir)
    })
}

#[test]
fn the_served_bundle_is_a_fresh_build_of_the_lockfile() {
    if !tools(false) {
        return;
    }
    let dir = fresh_build().as_ref().unwrap_or_else(|e| panic!("{e}"));
    for asset in iii_shell_broker::console_ui::ASSETS {
        let file = asset.path.strip_prefix("shell/").unwrap();
        let fresh = std::fs::read_to_string(dir.join("dist").join(file)).unwrap();
        assert!(
            fresh == asset.content,
            "{} differs from a fresh `npm ci && npm run build` ({} vs {} bytes): run `npm ci && npm run build` in web/ and commit web/dist/",
            asset.path,
            fresh.len(),
            asset.content.len()
        );
    }
}

/// A content hash for the console's `?v=` (first 16 hex chars of a 64-bit FNV-1a: only cache
/// busting, as the console's sha256 prefix).
fn hash(s: &str) -> String {
    let h = s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    });
    format!("{h:016x}")
}

struct Served {
    path: String,
    kind: &'static str,
    content: String,
    content_type: String,
}

/// The console's HTTP side for the test: the host page, its React, the manifest and assets.
async fn serve_http(build: PathBuf, assets: Arc<Vec<Served>>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let build = build.clone();
            let assets = assets.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf);
                let target = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let path = target.split('?').next().unwrap_or("/");
                let file = |rel: &str, ty: &str| {
                    std::fs::read(build.join(rel))
                        .ok()
                        .map(|b| (ty.to_string(), b))
                };
                let found: Option<(String, Vec<u8>)> = match path {
                    "/" => file("host/index.html", "text/html; charset=utf-8"),
                    "/host.js" => file("host/host.js", "text/javascript; charset=utf-8"),
                    "/vendor/react.js" => {
                        file("host/dist/react.js", "text/javascript; charset=utf-8")
                    }
                    "/ui" => {
                        let list: Vec<Value> = assets
                            .iter()
                            .map(|a| json!({"path": a.path, "kind": a.kind, "hash": hash(&a.content), "worker": "shell", "warnings": []}))
                            .collect();
                        Some((
                            "application/json".into(),
                            json!({"disabled": false, "assets": list})
                                .to_string()
                                .into_bytes(),
                        ))
                    }
                    p => p.strip_prefix("/ui/").and_then(|p| {
                        assets
                            .iter()
                            .find(|a| a.path == p)
                            .map(|a| (a.content_type.clone(), a.content.clone().into_bytes()))
                    }),
                };
                let (status, ty, body) = match found {
                    Some((ty, body)) => ("200 OK", ty, body),
                    None => ("404 Not Found", "text/plain".into(), b"not found".to_vec()),
                };
                let head = format!("HTTP/1.1 {status}\r\nContent-Type: {ty}\r\nContent-Length: {}\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n", body.len());
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(&body).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_works_in_headless_chromium() {
    if !tools(true) {
        return;
    }
    let build = tokio::task::spawn_blocking(|| fresh_build().clone())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));

    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let ws = base.join("workspace");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("README.md"), "# demo\n").unwrap();
    std::fs::write(ws.join("src/lib.rs"), "pub fn demo() {}\n").unwrap();
    let mut config: Config = jailed(&ws);
    config.turns.data_dir = base.join("data/turns").to_string_lossy().into_owned();
    // No scratch paths: the store in /tmp stays in place only out of commands' reach.
    config.confinement.scratch_paths = Vec::new();
    let engine = TestEngine::start().await;
    let worker = Worker::builder().engine(&engine).seed(&config).start();
    wait_ready(&engine, &worker).await;

    // The console's part: own the asset types, take our bindings, fetch each asset.
    let console = engine.client_named("console").await;
    for ty in ["console:script", "console:style"] {
        console.send_raw(
            json!({"type": "registertriggertype", "id": ty, "description": "console asset",
            "trigger_request_format": {}, "call_request_format": {}}),
        );
    }
    let bindings = || -> Vec<Value> {
        console
            .received()
            .into_iter()
            .filter(|f| f["type"] == "registertrigger")
            .collect()
    };
    assert!(
        console
            .wait_for_frame(WAIT, |_| bindings().len() >= 2)
            .await
            .is_some(),
        "the page's bindings never arrived: {:?}\n{}",
        console.received(),
        worker.stderr()
    );
    let mut assets = Vec::new();
    for b in bindings() {
        let path = b["config"]["path"].as_str().unwrap().to_string();
        let got = console
            .call("shell::ui-content", json!({"path": path}))
            .await
            .unwrap();
        console.send_raw(json!({"type": "triggerregistrationresult", "id": b["id"],
            "trigger_type": b["trigger_type"], "function_id": b["function_id"]}));
        assets.push(Served {
            kind: if b["trigger_type"] == "console:style" {
                "style"
            } else {
                "script"
            },
            path,
            content: got["content"].as_str().unwrap().to_string(),
            content_type: got["content_type"].as_str().unwrap().to_string(),
        });
    }
    let port = serve_http(build.clone(), Arc::new(assets)).await;

    let shots = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("ui-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).unwrap();
    let url = format!(
        "http://127.0.0.1:{port}/?engine={}#/ext/shell",
        engine.url()
    );
    let ws_arg = ws.to_string_lossy().into_owned();
    let shots_arg = shots.to_string_lossy().into_owned();
    let drive = tokio::process::Command::new("node")
        .args(["host/drive.mjs", &url, &ws_arg, &shots_arg])
        .current_dir(&build)
        .env("CHROMIUM", CHROMIUM)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(240), drive)
        .await
        .expect("the browser driver took more than 240 s")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("DRIVE OK"),
        "the browser test failed (screenshots in {shots_arg}):\n{stdout}\n{stderr}\nworker:\n{}",
        worker.stderr()
    );
    // The revert restored the bytes on disk, and the page's state was stored per pane.
    assert!(std::fs::read_to_string(ws.join("hello.rs"))
        .unwrap()
        .contains("println!(\"hello\")"));
    assert!(base.join("data/ui-state/shell%3Aexplorer.json").exists());
    for shot in [
        "01-workspace.png",
        "02-diff.png",
        "03-sessions.png",
        "03-reverted.png",
        "04-terminal.png",
        "05-reloaded.png",
        "06-adopted.png",
    ] {
        assert!(shots.join(shot).exists(), "{shot}");
    }
}
