//! What a test does when the machine lacks what it needs (root, cgroup v2, address-space
//! randomization, …): it skips, saying so, unless `III_SHELL_REQUIRE_ROOT=1`, when it
//! fails. `.ci/run` sets it, so a skipped test can never pass silently on CI.

/// The variable that turns a skip into a failure.
pub const REQUIRE_ENV: &str = "III_SHELL_REQUIRE_ROOT";

/// What happens to a test whose need is not met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmet {
    Skip,
    Fail,
}

/// The decision, from the value of [`REQUIRE_ENV`]: only `1` makes it a failure.
pub fn on_unmet(require: Option<&str>) -> Unmet {
    match require.map(str::trim) {
        Some("1") => Unmet::Fail,
        _ => Unmet::Skip,
    }
}

/// Called by a test when `what` (e.g. "needs root") is not met: returns (the caller then
/// returns, having said it skipped), or panics when [`REQUIRE_ENV`] is `1`.
#[track_caller]
pub fn unmet(what: &str) {
    match on_unmet(std::env::var(REQUIRE_ENV).ok().as_deref()) {
        Unmet::Fail => panic!(
            "{what}, and {REQUIRE_ENV}=1 requires it: run the tests as root on a kernel that has it"
        ),
        Unmet::Skip => eprintln!("SKIPPED: {what} (set {REQUIRE_ENV}=1 to make this a failure)"),
    }
}

/// `true` when the test may go on: the process is root. Otherwise [`unmet`].
#[track_caller]
pub fn root(why: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    unmet(&format!("needs root ({why})"));
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_means_fail() {
        for (v, want) in [
            (None, Unmet::Skip),
            (Some(""), Unmet::Skip),
            (Some("0"), Unmet::Skip),
            (Some("true"), Unmet::Skip),
            (Some("1"), Unmet::Fail),
            (Some(" 1\n"), Unmet::Fail),
        ] {
            assert_eq!(on_unmet(v), want, "{v:?}");
        }
    }
}
