//! Small helpers every kind of suite uses: paths as payload strings, temp dirs, polling, and
//! reading a file tree back.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A path as the string a payload takes.
pub fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The tests run as root (some cases need it; see `iii_shell_confine::requirement`).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Polls `f` until it holds or `limit` passes.
pub async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// A temp dir outside `/tmp` (a default scratch path, which commands may write): where a
/// test keeps a worker's own state so it stays where it is configured. A test that runs as
/// an unprivileged user (who cannot write the target directory) gets one under `/tmp`.
pub fn private_tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .or_else(|_| tempfile::tempdir())
        .expect("tempdir")
}

/// `$XDG_STATE_HOME` of the workers the tests start: a worker whose turn store lies in
/// commands' reach keeps it here (under the target directory, never the host's own).
pub fn worker_state_home() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("worker-state")
}

pub fn canon(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap()
}

/// The permission bits (with setuid/setgid/sticky) of `p` itself, not of a symlink's target.
pub fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// The names in `dir`, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Every path below `dir` (directories first, then what they hold; not following symlinks).
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        out.push(p.clone());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&p));
        }
    }
    out
}

/// Byte equality that reports sizes and the first difference instead of dumping megabytes.
#[track_caller]
pub fn same_bytes(got: impl AsRef<[u8]>, want: impl AsRef<[u8]>, what: &str) {
    let (got, want) = (got.as_ref(), want.as_ref());
    if got != want {
        let at = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{what}: got {} bytes, want {}; first difference at byte {at}",
            got.len(),
            want.len()
        );
    }
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().unwrap().port()
}
