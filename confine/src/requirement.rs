//! What a test does when the machine lacks what it needs (root, cgroup v2, address-space
//! randomization, …): it skips, saying so, unless `III_SHELL_REQUIRE_ROOT=1` or `CI=true`
//! (as CI services set it), when it fails. `.ci/run` sets the first, so a skipped test can
//! never pass silently on CI.

/// The variable that turns a skip into a failure.
pub const REQUIRE_ENV: &str = "III_SHELL_REQUIRE_ROOT";

/// The variable CI services set (`true`); it turns a skip into a failure too.
pub const CI_ENV: &str = "CI";

/// What happens to a test whose need is not met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmet {
    Skip,
    Fail,
}

/// The decision, from the values of [`REQUIRE_ENV`] (`1` makes it a failure) and [`CI_ENV`]
/// (`true` or `1` makes it a failure).
pub fn on_unmet(require: Option<&str>, ci: Option<&str>) -> Unmet {
    match (require.map(str::trim), ci.map(str::trim)) {
        (Some("1"), _) | (_, Some("true" | "1")) => Unmet::Fail,
        _ => Unmet::Skip,
    }
}

/// Called by a test when `what` (e.g. "needs root") is not met: returns (the caller then
/// returns, having said it skipped), or panics when [`REQUIRE_ENV`] is `1`.
#[track_caller]
pub fn unmet(what: &str) {
    let require = std::env::var(REQUIRE_ENV).ok();
    let ci = std::env::var(CI_ENV).ok();
    match on_unmet(require.as_deref(), ci.as_deref()) {
        Unmet::Fail => panic!(
            "{what}, and {REQUIRE_ENV}=1 or {CI_ENV}=true requires it: run the tests as root on a kernel that has it"
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
    fn only_one_or_ci_true_means_fail() {
        for (require, ci, want) in [
            (None, None, Unmet::Skip),
            (Some(""), None, Unmet::Skip),
            (Some("0"), None, Unmet::Skip),
            (Some("true"), None, Unmet::Skip),
            (Some("1"), None, Unmet::Fail),
            (Some(" 1\n"), None, Unmet::Fail),
            (None, Some("false"), Unmet::Skip),
            (None, Some(""), Unmet::Skip),
            (None, Some("yes"), Unmet::Skip),
            (None, Some("true"), Unmet::Fail),
            (None, Some("1"), Unmet::Fail),
            (Some("0"), Some("true"), Unmet::Fail),
        ] {
            assert_eq!(on_unmet(require, ci), want, "{require:?} {ci:?}");
        }
    }
}
