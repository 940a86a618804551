//! `coder::*` costs, each measured against its reference in the same run.
//!
//! Run: `cargo bench -p iii-shell-executor --bench coder_bench`
//!
//! Knobs: `CODER_BENCH_ONLY` (comma list of `search,tree,read,edit`; default all),
//! `CODER_BENCH_FILES` (search tree, default 20000), `CODER_BENCH_ROUNDS` (default 5),
//! `CODER_BENCH_DIR` (where the generated data lives; reused when present),
//! `CODER_BENCH_THREADS` (walker threads for both sides; default one per core, at most 12),
//! `CODER_BENCH_SEARCH` (`content`, `fuzzy` or `both`, the default: which searches run; one
//! alone is what `valgrind --tool=callgrind` is pointed at for instruction counts).
//!
//! * **search**: `coder::search` (literal, content only, no gitignore, hidden included, the
//!   default excludes on; the tree has none of their folders) against
//!   `rg -F -uu --no-config -j N`, on a ~200 MB tree of 20k files; the query is rare (a few
//!   hundred matches), so both scan every byte and the response budget does not cut the
//!   work short. Then a path-only fuzzy search against `rg --files -uu`.
//! * **tree**: `coder::tree` (defaults: depth 3, 100 per folder, 2000 nodes) on a 10k-entry
//!   and a 100k-entry tree.
//! * **read**: a 1,000-line window of 256 MiB and 1 GiB files, at a fixed position and at
//!   the middle of each file; time, bytes read (`/proc/self/io` rchar) and peak-RSS growth
//!   (VmHWM, reset before each read through `/proc/self/clear_refs`).
//! * **edit**: `coder::update-file` with 100 `update_lines` ops on a 10 MB file against the
//!   same edit by `sed -i` in a shell (sed does not fsync; coder fsyncs the file and its
//!   directory).

use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use iii_shell_executor::policy::Policy;
use iii_shell_files::coder::{self, edit, read, search, tree, Ctx};
use iii_shell_protocol::coder::*;
use iii_shell_protocol::config::Config;

const WORDS: &[&str] = &[
    "fn", "let", "mut", "self", "impl", "struct", "enum", "match", "return", "pub", "use", "crate",
    "super", "where", "for", "in", "if", "else", "while", "loop", "value", "index", "buffer",
    "length", "count", "offset", "handler", "request", "response", "config",
];
const RARE: &str = "zebra_quagga";

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn text(rng: &mut Rng, target: usize, rare: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(target + 128);
    let at = if rare {
        rng.below(target as u64) as usize
    } else {
        usize::MAX
    };
    let mut placed = false;
    while out.len() < target {
        let words = 3 + rng.below(10);
        for i in 0..words {
            if i > 0 {
                out.push(b' ');
            }
            out.extend(WORDS[rng.below(WORDS.len() as u64) as usize].as_bytes());
        }
        if !placed && out.len() >= at {
            write!(out, " {RARE}").unwrap();
            placed = true;
        }
        out.push(b'\n');
    }
    out
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

/// CPU time (user + system, all threads) used so far by this process (`RUSAGE_SELF`) or by
/// its waited-for children (`RUSAGE_CHILDREN`): less disturbed by other load than wall time,
/// and the stable second figure (valgrind cannot run the executor: it lacks openat2).
fn cpu(who: i32) -> Duration {
    // SAFETY: rusage is plain data (all-zero is valid); getrusage fills the struct we pass,
    // and both `who` values used are valid.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The ratio of the fastest rounds: the least disturbed by the other load on a shared machine.
fn best_ratio(ours: &[Duration], theirs: &[Duration]) -> f64 {
    let min = |v: &[Duration]| v.iter().min().copied().unwrap_or_default().as_secs_f64();
    min(ours) / min(theirs)
}

fn policy_for(root: &Path) -> Policy {
    let mut config = Config::default();
    config.fs.host_roots = vec![root.to_string_lossy().into_owned()];
    config.fs.allow_unjailed = false;
    config.fs.max_read_bytes = 2 << 30;
    config.fs.max_write_bytes = 64 << 20;
    Policy::build(1, &serde_json::to_string(&config).unwrap()).expect("policy")
}

fn gen_search_tree(root: &Path, files: usize) -> u64 {
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
        let data = text(&mut rng, size, i % 50 == 3);
        std::fs::write(dir.join(format!("f{i}.{}", exts[i % exts.len()])), &data).unwrap();
        bytes += data.len() as u64;
    }
    bytes
}

fn search_bench(base: &Path, rounds: usize, threads: usize) {
    let root = base.join("search");
    if !root.join("m0").is_dir() {
        let t = Instant::now();
        let files = env_usize("CODER_BENCH_FILES", 20_000);
        let bytes = gen_search_tree(&root, files);
        println!(
            "search tree: {files} files, {:.1} MB, generated in {:.1?}",
            bytes as f64 / 1e6,
            t.elapsed()
        );
    }
    let policy = policy_for(&root);
    let ctx = Ctx::new(&policy, &FsScope::default()).unwrap();
    let req = SearchInput {
        query: RARE.into(),
        path: ".".into(),
        regex: false,
        ignore_case: false,
        search_content: true,
        search_paths: false,
        include_globs: vec![],
        exclude_globs: vec![],
        context_lines_before: None,
        context_lines_after: None,
        max_matches: Some(100_000),
        max_line_bytes: Some(4096),
        use_default_excludes: true,
        include_hidden: true,
        respect_gitignore: false,
        fuzzy_paths: false,
    };
    let rg = |args: &[&str]| {
        let c0 = cpu(libc::RUSAGE_CHILDREN);
        let t = Instant::now();
        let out = Command::new("rg")
            .args(args)
            .arg("-j")
            .arg(threads.to_string())
            .arg(&root)
            .output()
            .expect("rg");
        (
            t.elapsed(),
            out.stdout.iter().filter(|&&b| b == b'\n').count(),
            cpu(libc::RUSAGE_CHILDREN) - c0,
        )
    };
    let (mut cpu_ours, mut cpu_rg) = (Duration::ZERO, Duration::ZERO);
    let which = std::env::var("CODER_BENCH_SEARCH").unwrap_or_else(|_| "both".into());
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let (mut n_ours, mut n_rg) = (0, 0);
    for _ in 0..rounds * usize::from(which != "fuzzy") {
        let (c0, t) = (cpu(libc::RUSAGE_SELF), Instant::now());
        let r = search::search_with_threads(&ctx, &req, threads).expect("search");
        ours.push(t.elapsed());
        cpu_ours += cpu(libc::RUSAGE_SELF) - c0;
        n_ours = r.content_matches.len();
        assert!(!r.truncated, "the bench query must not hit a budget");
        let (d, n, c) = rg(&["-F", "-uu", "--no-config", "-n", RARE]);
        theirs.push(d);
        cpu_rg += c;
        n_rg = n;
    }
    if which != "fuzzy" {
        let (o, t) = (median(&mut ours), median(&mut theirs));
        println!(
            "search content  coder {o:>10.2?}  rg {t:>10.2?}  ratio {:.3}x  best {:.3}x  cpu {:.3}x  (matches: coder {n_ours}, rg {n_rg}; {threads} threads)",
            o.as_secs_f64() / t.as_secs_f64(),
            best_ratio(&ours, &theirs),
            cpu_ours.as_secs_f64() / cpu_rg.as_secs_f64()
        );
        assert_eq!(n_ours, n_rg, "both sides must find the same matches");
    }
    if which == "content" {
        return;
    }
    let fuzzy = SearchInput {
        query: "m3q7f".into(),
        search_content: false,
        search_paths: true,
        fuzzy_paths: true,
        ..req.clone()
    };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let (mut cpu_ours, mut cpu_rg) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        let (c0, t) = (cpu(libc::RUSAGE_SELF), Instant::now());
        let r = search::search_with_threads(&ctx, &fuzzy, threads).expect("search");
        ours.push(t.elapsed());
        cpu_ours += cpu(libc::RUSAGE_SELF) - c0;
        assert!(!r.path_matches.is_empty());
        let (d, _, c) = rg(&["--files", "-uu", "--no-config"]);
        theirs.push(d);
        cpu_rg += c;
    }
    let (o, t) = (median(&mut ours), median(&mut theirs));
    println!(
        "search fuzzy    coder {o:>10.2?}  rg --files {t:>10.2?}  ratio {:.3}x  best {:.3}x  cpu {:.3}x",
        o.as_secs_f64() / t.as_secs_f64(),
        best_ratio(&ours, &theirs),
        cpu_ours.as_secs_f64() / cpu_rg.as_secs_f64()
    );
}

/// The same top-level shape at every size (100 folders of 100 entries), so a budgeted
/// snapshot visits the same folders: the 10k tree has files there, the 100k tree folders of
/// 10 files each.
fn gen_tree(root: &Path, entries: usize) {
    for a in 0..100 {
        let dir = root.join(format!("a{a:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        for b in 0..100 {
            if entries <= 10_000 {
                std::fs::File::create(dir.join(format!("f{b:02}"))).unwrap();
            } else {
                let sub = dir.join(format!("b{b:02}"));
                std::fs::create_dir_all(&sub).unwrap();
                for f in 0..(entries / 10_000) {
                    std::fs::File::create(sub.join(format!("f{f}"))).unwrap();
                }
            }
        }
    }
}

fn tree_bench(base: &Path, rounds: usize) {
    for entries in [10_000usize, 100_000] {
        let root = base.join(format!("tree{entries}"));
        if !root.join("a00").is_dir() {
            gen_tree(&root, entries);
        }
        let policy = policy_for(&root);
        let ctx = Ctx::new(&policy, &FsScope::default()).unwrap();
        let req = TreeInput {
            path: ".".into(),
            max_depth: None,
            per_folder_limit: None,
            include_hidden: true,
            use_default_excludes: true,
        };
        let mut times = Vec::new();
        let mut nodes = 0;
        for _ in 0..rounds {
            let t = Instant::now();
            let r = tree::tree(&ctx, &req).expect("tree");
            times.push(t.elapsed());
            fn count(n: &TreeNode) -> usize {
                1 + n.children.iter().flatten().map(count).sum::<usize>()
            }
            nodes = count(&r.root);
        }
        println!(
            "tree {entries:>7} entries: {:>10.2?}  ({nodes} nodes returned)",
            median(&mut times)
        );
    }
}

fn status_kb(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn rchar() -> u64 {
    let s = std::fs::read_to_string("/proc/self/io").unwrap();
    s.lines()
        .find(|l| l.starts_with("rchar:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn gen_big(path: &Path, bytes: u64) -> u64 {
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut n = 0u64;
    let mut lines = 0u64;
    while n < bytes {
        let l = format!("line {lines:>12} {}\n", "x".repeat(40));
        w.write_all(l.as_bytes()).unwrap();
        n += l.len() as u64;
        lines += 1;
    }
    w.flush().unwrap();
    lines
}

fn read_bench(base: &Path, rounds: usize) {
    let dir = base.join("read");
    std::fs::create_dir_all(&dir).unwrap();
    let policy = policy_for(&dir);
    let ctx = Ctx::new(&policy, &FsScope::default()).unwrap();
    for size in [256u64 << 20, 1 << 30] {
        let name = format!("big{}", size >> 20);
        let path = dir.join(&name);
        let lines = if path.is_file() {
            let mut f = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
            let mut buf = vec![0u8; 1 << 20];
            let mut n = 0u64;
            loop {
                let k = f.read(&mut buf).unwrap();
                if k == 0 {
                    break;
                }
                n += buf[..k].iter().filter(|&&b| b == b'\n').count() as u64;
            }
            n
        } else {
            gen_big(&path, size)
        };
        for (label, from) in [("line 1,000,000", 1_000_000u64), ("middle", lines / 2)] {
            let spec = ReadSpec {
                path: Some(name.clone()),
                paths: None,
                stat: false,
                line_from: Some(from),
                line_to: Some(from + 999),
                numbered: false,
                base64: false,
                max_output_bytes: None,
            };
            let mut times = Vec::new();
            let (mut rss, mut rd) = (0, 0);
            for _ in 0..rounds {
                std::fs::write("/proc/self/clear_refs", "5").unwrap();
                let (hwm0, r0) = (status_kb("VmHWM:"), rchar());
                let t = Instant::now();
                let out = read::read(&ctx, &spec).expect("read");
                times.push(t.elapsed());
                assert_eq!(out.lines_returned, Some(1000));
                rss = status_kb("VmHWM:").saturating_sub(hwm0);
                rd = rchar() - r0;
            }
            println!(
                "read {:>5} MiB, window at {label:<15} {:>10.2?}  read {:>6.1} MiB  peak RSS +{rss} KiB",
                size >> 20,
                median(&mut times),
                rd as f64 / (1 << 20) as f64
            );
        }
    }
}

fn edit_bench(base: &Path, rounds: usize) {
    let dir = base.join("edit");
    std::fs::create_dir_all(&dir).unwrap();
    let policy = policy_for(&dir);
    let ctx = Ctx::new(&policy, &FsScope::default()).unwrap();
    let body: String = (0..310_000)
        .map(|i| format!("line number {i:>8} of the file\n"))
        .collect();
    assert!(body.len() >= 10_000_000);
    let lines: Vec<u32> = (1..=100).map(|k| k * 1900).collect();
    let ops: Vec<EditOp> = lines
        .iter()
        .map(|&l| EditOp::UpdateLines {
            from_line: l,
            to_line: l,
            content: format!("edited {l}\n"),
        })
        .collect();
    let sed_script: String = lines
        .iter()
        .map(|l| format!("-e '{l}s/.*/edited {l}/' "))
        .collect();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        std::fs::write(dir.join("a.txt"), &body).unwrap();
        std::fs::write(dir.join("b.txt"), &body).unwrap();
        let t = Instant::now();
        let r = edit::update_files(
            &ctx,
            &[EditSpec {
                path: "a.txt".into(),
                ops: ops.clone(),
            }],
            &coder::EditLocks::default(),
            &coder::NoRecorder,
        );
        ours.push(t.elapsed());
        assert!(r.results[0].success, "{:?}", r.results[0].error);
        let t = Instant::now();
        let st = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "sed -i {sed_script} {}",
                dir.join("b.txt").display()
            ))
            .status()
            .unwrap();
        theirs.push(t.elapsed());
        assert!(st.success());
        assert_eq!(
            std::fs::read(dir.join("a.txt")).unwrap(),
            std::fs::read(dir.join("b.txt")).unwrap()
        );
    }
    let (o, t) = (median(&mut ours), median(&mut theirs));
    println!(
        "update-file 100 ops on {:.1} MB: coder {o:>10.2?}  sed -i {t:>10.2?}  ratio {:.3}x (identical results)",
        body.len() as f64 / 1e6,
        o.as_secs_f64() / t.as_secs_f64()
    );
}

fn main() {
    if std::env::args().any(|a| a == "--test") || std::env::args().all(|a| a != "--bench") {
        println!("coder_bench: run with `cargo bench -p iii-shell-executor --bench coder_bench`");
        return;
    }
    let rounds = env_usize("CODER_BENCH_ROUNDS", 5).max(1);
    let threads = env_usize(
        "CODER_BENCH_THREADS",
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(12),
    );
    let only = std::env::var("CODER_BENCH_ONLY").unwrap_or_else(|_| "search,tree,read,edit".into());
    let tmp = tempfile::tempdir().unwrap();
    let base: PathBuf = std::env::var_os("CODER_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&base).unwrap();
    let base = std::fs::canonicalize(&base).unwrap();
    for part in only.split(',') {
        match part.trim() {
            "search" => search_bench(&base, rounds, threads),
            "tree" => tree_bench(&base, rounds),
            "read" => read_bench(&base, rounds),
            "edit" => edit_bench(&base, rounds),
            other => println!("unknown part {other}"),
        }
    }
}
