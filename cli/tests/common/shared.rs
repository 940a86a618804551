//! The small helpers every test binary of this crate shares, whichever harness it uses
//! (`common` includes this module; `support` includes it by path).

use std::path::Path;
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
