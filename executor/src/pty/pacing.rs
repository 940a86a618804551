//! When a session's reader waits before reading more of the program's output.
//!
//! A program writes into a PTY much faster than a consumer can be invoked with it, and the
//! ring keeps only [`RING_BYTES`]. Without a pause, a flood evicts output the consumer was
//! about to receive, and it gets a gap although it was keeping up. So, while the session is
//! attached and its consumer *keeps up*, the reader waits once the output not yet acknowledged
//! would no longer fit the ring after one more read; the program then blocks in `write(2)`, as
//! on any terminal, until an acknowledgement makes room. A consumer keeps up while it
//! acknowledges something at least every [`KEEPING_UP`]. One that does not is *slow*: from then
//! on the reader never waits for it until it has caught up with everything (nothing left
//! unacknowledged), so a slow or stuck consumer holds the program up at most [`KEEPING_UP`]
//! once, and after that gets coalesced output and gaps as before.
//!
//! Every decision here is a pure function of the [`Pace`] state and what the caller passes in.

use std::time::{Duration, Instant};

use super::ring::RING_BYTES;

/// Bytes one read of the PTY master takes at most.
pub const READ_BYTES: usize = 64 * 1024;

/// Unacknowledged bytes at which the reader waits: one more read then cannot evict any of
/// them (the ring evicts its oldest, acknowledged frames first).
pub const HOLD_AT: usize = RING_BYTES - READ_BYTES;

/// How long a consumer may go without acknowledging anything before it counts as slow.
pub const KEEPING_UP: Duration = Duration::from_millis(250);

/// A session's pacing state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// When the consumer last made progress: an acknowledgement that moved, or the first push
    /// after it had caught up (the clock starts when something is owed to it).
    pub progress_at: Instant,
    /// The consumer fell behind by [`KEEPING_UP`] and has not caught up since.
    pub slow: bool,
}

/// What the reader does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Read,
    /// Wait for an acknowledgement, at most this long, then decide again.
    Wait(Duration),
}

/// What the decision looks at besides the [`Pace`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub at: Instant,
    /// Someone receives this session's output now: attached, its attachment released, and a
    /// broker subscribed.
    pub delivering: bool,
    /// Bytes in the ring after the last acknowledged sequence.
    pub unacked: usize,
}

impl Pace {
    pub fn new(at: Instant) -> Pace {
        Pace {
            progress_at: at,
            slow: false,
        }
    }

    /// Decides whether the reader reads now; marks the consumer slow when its time is up.
    pub fn step(&mut self, now: Now) -> Step {
        if !now.delivering || self.slow || now.unacked < HOLD_AT {
            return Step::Read;
        }
        let waited = now.at.saturating_duration_since(self.progress_at);
        match KEEPING_UP.checked_sub(waited) {
            Some(left) if !left.is_zero() => Step::Wait(left),
            _ => {
                self.slow = true;
                Step::Read
            }
        }
    }

    /// An acknowledgement arrived; `unacked` is what is still owed after it.
    pub fn acked(&mut self, at: Instant, moved: bool, unacked: usize) {
        if moved {
            self.progress_at = at;
        }
        if unacked == 0 {
            self.slow = false;
        }
    }

    /// A push went out; `owed_before` is what was unacknowledged before it.
    pub fn pushed(&mut self, at: Instant, owed_before: usize) {
        if owed_before == 0 {
            self.progress_at = at;
        }
    }

    /// A new attachment (or none): a new consumer, judged afresh.
    pub fn retarget(&mut self, at: Instant) {
        *self = Pace::new(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now(at: Instant, delivering: bool, unacked: usize) -> Now {
        Now {
            at,
            delivering,
            unacked,
        }
    }

    #[test]
    fn the_constants() {
        assert_eq!(HOLD_AT, 2 * 1024 * 1024 - 64 * 1024);
        assert_eq!(KEEPING_UP, Duration::from_millis(250));
    }

    #[test]
    fn reads_below_the_mark_or_when_nobody_receives() {
        let t = Instant::now();
        let mut p = Pace::new(t);
        assert_eq!(p.step(now(t, true, HOLD_AT - 1)), Step::Read);
        assert_eq!(p.step(now(t, false, RING_BYTES)), Step::Read);
        assert!(!p.slow);
    }

    #[test]
    fn waits_for_a_consumer_that_keeps_up_for_what_is_left_of_its_time() {
        let t = Instant::now();
        let mut p = Pace::new(t);
        assert_eq!(
            p.step(now(t + Duration::from_millis(30), true, HOLD_AT)),
            Step::Wait(Duration::from_millis(220))
        );
        // An acknowledgement that moved restarts the clock.
        p.acked(t + Duration::from_millis(60), true, HOLD_AT);
        assert_eq!(
            p.step(now(t + Duration::from_millis(100), true, HOLD_AT)),
            Step::Wait(Duration::from_millis(210))
        );
        // One that did not move does not.
        p.acked(t + Duration::from_millis(300), false, HOLD_AT);
        assert_eq!(
            p.step(now(t + Duration::from_millis(300), true, HOLD_AT)),
            Step::Wait(Duration::from_millis(10))
        );
        assert!(!p.slow);
    }

    #[test]
    fn a_consumer_that_falls_behind_is_slow_until_it_has_caught_up() {
        let t = Instant::now();
        let mut p = Pace::new(t);
        assert_eq!(p.step(now(t + KEEPING_UP, true, HOLD_AT)), Step::Read);
        assert!(p.slow);
        // Its next acknowledgement does not make it fast again while output is still owed.
        p.acked(t + KEEPING_UP * 2, true, HOLD_AT + 5);
        assert_eq!(
            p.step(now(t + KEEPING_UP * 2, true, HOLD_AT + 5)),
            Step::Read
        );
        assert!(p.slow);
        // Caught up: judged afresh.
        p.acked(t + KEEPING_UP * 3, true, 0);
        assert!(!p.slow);
        assert_eq!(
            p.step(now(t + KEEPING_UP * 3, true, HOLD_AT)),
            Step::Wait(KEEPING_UP)
        );
    }

    #[test]
    fn the_clock_starts_with_the_first_push_owed() {
        let t = Instant::now();
        let mut p = Pace::new(t);
        let later = t + Duration::from_secs(10);
        p.pushed(later, 0);
        assert_eq!(
            p.step(now(later + Duration::from_millis(1), true, HOLD_AT)),
            Step::Wait(Duration::from_millis(249))
        );
        // A push on top of what is already owed does not restart it.
        p.pushed(later + Duration::from_millis(50), 1000);
        assert_eq!(
            p.step(now(later + Duration::from_millis(50), true, HOLD_AT)),
            Step::Wait(Duration::from_millis(200))
        );
    }

    #[test]
    fn a_new_attachment_is_judged_afresh() {
        let t = Instant::now();
        let mut p = Pace::new(t);
        p.step(now(t + KEEPING_UP, true, HOLD_AT));
        assert!(p.slow);
        let t2 = t + Duration::from_secs(1);
        p.retarget(t2);
        assert_eq!(p, Pace::new(t2));
    }
}
