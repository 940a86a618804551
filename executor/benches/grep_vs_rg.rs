//! `shell::fs::grep` against ripgrep on the same generated tree, measured in the same run.
//!
//! Run: `cargo bench -p iii-shell-executor --bench grep_vs_rg`
//!
//! Knobs (environment): `GREP_BENCH_FILES` (default 20000), `GREP_BENCH_ROUNDS` (default 7),
//! `GREP_BENCH_THREADS` (default: one per core, at most 12, which is both the `ignore`
//! walker's and ripgrep's default), `GREP_BENCH_DIR` (generate the tree there and reuse it on
//! later runs), `GREP_BENCH_ONLY_OURS` (skip rg: a profiling aid).
//!
//! The tree (~200 MB at the default size, generated deterministically in a temp dir) mixes
//! source-like text in nested and hidden directories, some large files, and binary files.
//! Each round times, interleaved: our `grep()` called directly (policy jailed to the tree,
//! no match cap), ripgrep with its output read through a pipe and counted (the same work:
//! every match produced and consumed), and ripgrep writing to `/dev/null`. Both sides use the
//! same number of threads. The medians are reported, with the ratio against the faster rg
//! variant, and the match counts of both sides must agree.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use iii_shell_executor::policy::Policy;
use iii_shell_files::fs::grep::grep_with_threads;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::fs::GrepSpec;

const PATTERN: &str = r"needle_\w+";

const WORDS: &[&str] = &[
    "fn",
    "let",
    "mut",
    "self",
    "impl",
    "struct",
    "enum",
    "match",
    "return",
    "pub",
    "use",
    "crate",
    "super",
    "where",
    "for",
    "in",
    "if",
    "else",
    "while",
    "loop",
    "break",
    "continue",
    "async",
    "await",
    "move",
    "ref",
    "const",
    "static",
    "type",
    "trait",
    "dyn",
    "Box",
    "Vec",
    "String",
    "Option",
    "Result",
    "Some",
    "None",
    "Ok",
    "Err",
    "value",
    "index",
    "buffer",
    "length",
    "count",
    "offset",
    "handler",
    "request",
    "response",
    "config",
    "policy",
    "path",
    "file",
    "dir",
    "entry",
    "error",
    "context",
    "state",
    "cache",
    "stream",
    "reader",
    "writer",
    "=",
    "+",
    "->",
    "=>",
    "{",
    "}",
    "(",
    ")",
    ";",
    "::",
    "&",
    "0",
    "1",
    "42",
    "\"text\"",
    "// note",
    "#[derive(Debug)]",
];

/// xorshift64*: deterministic and fast.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One file's text: lines of words, about 1 % of them carrying `needle_<n>`.
fn text(rng: &mut Rng, target: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(target + 128);
    while out.len() < target {
        let indent = rng.below(4) as usize * 4;
        out.extend(std::iter::repeat_n(b' ', indent));
        let words = 3 + rng.below(10);
        for i in 0..words {
            if i > 0 {
                out.push(b' ');
            }
            out.extend(WORDS[rng.below(WORDS.len() as u64) as usize].as_bytes());
        }
        if rng.below(100) == 0 {
            write!(out, " needle_{}", rng.below(1000)).unwrap();
        }
        out.push(b'\n');
    }
    out
}

/// Writes the tree; returns (files, bytes).
fn generate(root: &Path, files: usize) -> (usize, u64) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let exts = ["rs", "py", "js", "md", "txt", "toml", "go", "c"];
    let mut bytes = 0u64;
    for i in 0..files {
        let hidden = if i % 97 == 0 { ".cache/" } else { "" };
        let dir = root.join(format!(
            "{hidden}m{}/p{}/q{}",
            i % 10,
            (i / 10) % 10,
            (i / 100) % 20
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let size = if i % 2000 == 0 {
            2_000_000
        } else {
            1_000 + rng.below(18_000) as usize
        };
        let mut data = text(&mut rng, size);
        if i % 50 == 7 {
            // A binary file: a NUL early on, then more text (with needles rg must skip too).
            let at = rng.below(512) as usize;
            data[at] = 0;
        }
        let path = dir.join(format!("f{i}.{}", exts[i % exts.len()]));
        std::fs::write(&path, &data).unwrap();
        bytes += data.len() as u64;
    }
    (files, bytes)
}

/// User + system CPU time of this process (`RUSAGE_SELF`) or of its waited-for children.
fn cpu(who: i32) -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a zeroed rusage.
    unsafe { libc::getrusage(who, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn rg_cmd(rg: &Path, threads: usize, root: &Path) -> Command {
    let mut c = Command::new(rg);
    c.args(["-n", "--no-heading", "--hidden", "--no-ignore", "-j"])
        .arg(threads.to_string())
        .arg("-e")
        .arg(PATTERN)
        .arg(root);
    c
}

/// Wall-clock and CPU time of one run.
#[derive(Clone, Copy)]
struct Sample {
    wall: Duration,
    cpu: Duration,
}

/// rg with stdout read through a pipe; returns the times and the lines of output.
fn run_rg_piped(rg: &Path, threads: usize, root: &Path) -> (Sample, u64) {
    let (start, cpu0) = (Instant::now(), cpu(libc::RUSAGE_CHILDREN));
    let mut child = rg_cmd(rg, threads, root)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn rg");
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut lines = 0u64;
    loop {
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
    }
    let status = child.wait().unwrap();
    let s = Sample {
        wall: start.elapsed(),
        cpu: cpu(libc::RUSAGE_CHILDREN) - cpu0,
    };
    assert!(status.success(), "rg failed: {status}");
    (s, lines)
}

fn run_rg_null(rg: &Path, threads: usize, root: &Path) -> Sample {
    let (start, cpu0) = (Instant::now(), cpu(libc::RUSAGE_CHILDREN));
    let status = rg_cmd(rg, threads, root)
        .stdout(Stdio::null())
        .status()
        .expect("spawn rg");
    let s = Sample {
        wall: start.elapsed(),
        cpu: cpu(libc::RUSAGE_CHILDREN) - cpu0,
    };
    assert!(status.success(), "rg failed: {status}");
    s
}

fn find_rg() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join("rg"))
        .find(|p| p.is_file())
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it too: keep that cheap.
    if std::env::args().any(|a| a == "--test") || std::env::args().all(|a| a != "--bench") {
        println!("grep_vs_rg: run with `cargo bench -p iii-shell-executor --bench grep_vs_rg`");
        return;
    }
    let Some(rg) = find_rg() else {
        println!("grep_vs_rg: ripgrep (`rg`) is not on PATH; install it (e.g. `apt-get install ripgrep`) to run this benchmark");
        return;
    };
    let files = env_usize("GREP_BENCH_FILES", 20_000);
    let rounds = env_usize("GREP_BENCH_ROUNDS", 7).max(1);
    let threads = env_usize(
        "GREP_BENCH_THREADS",
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(12),
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let root = match std::env::var_os("GREP_BENCH_DIR") {
        // Reuse a tree generated by an earlier run (same GREP_BENCH_FILES), e.g. while profiling.
        Some(d) if Path::new(&d).join("tree/m0").is_dir() => {
            std::fs::canonicalize(Path::new(&d).join("tree")).unwrap()
        }
        keep => {
            let base = keep
                .map(PathBuf::from)
                .unwrap_or_else(|| dir.path().to_path_buf());
            let root = std::fs::canonicalize(&base).unwrap().join("tree");
            let t0 = Instant::now();
            let (n, bytes) = generate(&root, files);
            println!(
                "generated {n} files, {:.1} MB in {:.1?} under {}",
                bytes as f64 / 1e6,
                t0.elapsed(),
                root.display()
            );
            root
        }
    };

    let mut config = Config::default();
    config.fs.host_roots = vec![root.to_string_lossy().into_owned()];
    config.fs.allow_unjailed = false;
    let policy = Policy::build(1, &serde_json::to_string(&config).unwrap()).expect("policy");
    let spec = GrepSpec {
        path: ".".into(),
        pattern: PATTERN.into(),
        recursive: true,
        ignore_case: false,
        include_glob: vec![],
        exclude_glob: vec![],
        max_matches: u64::MAX,
        max_line_bytes: 4096,
    };

    let ours = || {
        let (start, cpu0) = (Instant::now(), cpu(libc::RUSAGE_SELF));
        let r = grep_with_threads(&policy, &spec, threads).expect("grep");
        (
            Sample {
                wall: start.elapsed(),
                cpu: cpu(libc::RUSAGE_SELF) - cpu0,
            },
            r,
        )
    };

    // Warm the page cache and check that both sides agree.
    let (_, r) = ours();
    let (_, rg_lines) = run_rg_piped(&rg, threads, &root);
    assert!(!r.truncated);
    assert_eq!(
        r.matches.len() as u64,
        rg_lines,
        "match counts differ: ours {} vs rg {rg_lines}",
        r.matches.len()
    );
    println!(
        "matches: {} (ours) = {rg_lines} (rg); threads: {threads}; rounds: {rounds}",
        r.matches.len()
    );
    drop(r);

    if std::env::var_os("GREP_BENCH_ONLY_OURS").is_some() {
        // Profiling aid: no rg, just our side.
        for round in 0..rounds {
            let (a, _) = ours();
            println!("round {round}: wall/cpu  ours {:.0?}/{:.0?}", a.wall, a.cpu);
        }
        return;
    }

    let (mut ours_s, mut pipe_s, mut null_s) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (a, r) = ours();
        assert_eq!(r.matches.len() as u64, rg_lines);
        drop(r);
        let (b, lines) = run_rg_piped(&rg, threads, &root);
        assert_eq!(lines, rg_lines);
        let c = run_rg_null(&rg, threads, &root);
        println!(
            "round {round}: wall/cpu  ours {:.0?}/{:.0?}  rg|pipe {:.0?}/{:.0?}  rg>/dev/null {:.0?}/{:.0?}",
            a.wall, a.cpu, b.wall, b.cpu, c.wall, c.cpu
        );
        ours_s.push(a);
        pipe_s.push(b);
        null_s.push(c);
    }
    let med =
        |v: &[Sample], f: fn(&Sample) -> Duration| median(&mut v.iter().map(f).collect::<Vec<_>>());
    for (what, f) in [
        ("wall", (|s: &Sample| s.wall) as fn(&Sample) -> Duration),
        ("cpu", |s: &Sample| s.cpu),
    ] {
        let (o, p, n) = (med(&ours_s, f), med(&pipe_s, f), med(&null_s, f));
        let best = p.min(n);
        println!(
            "median {what}: ours {o:.1?}  rg|pipe {p:.1?}  rg>/dev/null {n:.1?}  ratio ours/rg {:.2}x (vs the faster rg variant; {:.2}x vs pipe, {:.2}x vs /dev/null; goal <= 1.5x)",
            o.as_secs_f64() / best.as_secs_f64(),
            o.as_secs_f64() / p.as_secs_f64(),
            o.as_secs_f64() / n.as_secs_f64(),
        );
    }
    let version = Command::new(&rg).arg("--version").output().map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    });
    println!("rg: {}", version.unwrap_or_default());
}
