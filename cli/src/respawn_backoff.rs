//! How long `serve`'s supervisor waits before it starts a new executor after one died.
//!
//! An executor that dies again and again soon after starting (a broken binary, a host that
//! refuses it) must not be restarted in a tight loop: each quick death doubles the wait,
//! from [`FIRST`] up to [`MAX`]. An executor that ran for [`HEALTHY_RUN`] or longer was
//! healthy, whatever killed it (the OOM killer, an operator's `kill`): its replacement
//! starts after [`FIRST`] again, so occasional deaths over a long life never cost more than
//! that. Calls that arrive during the wait wait for the new executor (within their own
//! deadlines): a shorter wait is a shorter stall.

use std::time::Duration;

/// The wait after the first death, and after the death of an executor that ran for
/// [`HEALTHY_RUN`].
pub const FIRST: Duration = Duration::from_millis(100);
/// The longest wait, for an executor that keeps dying soon after it starts.
pub const MAX: Duration = Duration::from_secs(5);
/// How long an executor must have run for its death to reset the wait to [`FIRST`].
pub const HEALTHY_RUN: Duration = Duration::from_secs(10);

/// The wait before the next executor starts, given the wait before the one that just died
/// (`None` if it was the first executor) and how long it ran.
pub fn respawn_delay(previous: Option<Duration>, ran_for: Duration) -> Duration {
    match previous {
        Some(p) if ran_for < HEALTHY_RUN => (p * 2).clamp(FIRST, MAX),
        _ => FIRST,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn quick_deaths_double_the_wait_up_to_five_seconds() {
        let mut d = respawn_delay(None, ms(10));
        let mut seen = vec![d];
        for _ in 0..8 {
            d = respawn_delay(Some(d), ms(10));
            seen.push(d);
        }
        assert_eq!(
            seen,
            [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000].map(ms)
        );
    }

    #[test]
    fn a_healthy_run_resets_the_wait() {
        assert_eq!(respawn_delay(Some(ms(5000)), ms(10_000)), ms(100));
        assert_eq!(
            respawn_delay(Some(ms(5000)), Duration::from_secs(3600)),
            ms(100)
        );
        assert_eq!(respawn_delay(Some(ms(5000)), ms(9_999)), ms(5000));
        assert_eq!(respawn_delay(Some(ms(1600)), ms(9_999)), ms(3200));
        // The first executor's death waits the first wait, however long it ran.
        assert_eq!(respawn_delay(None, ms(0)), ms(100));
        assert_eq!(respawn_delay(None, Duration::from_secs(60)), ms(100));
        // Nothing shorter than the first wait, even from a zero.
        assert_eq!(respawn_delay(Some(ms(0)), ms(1)), ms(100));
    }
}
