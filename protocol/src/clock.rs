//! The wall clock in the wire's unit.
//!
//! Here rather than in `iii_shell_policy` because it reads the system clock (which that crate
//! may not), and beside the types whose `*_at_ms` fields carry it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, the unit of every `*_at_ms` field; 0 for a clock set
/// before 1970.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_ms_is_the_system_clock_in_milliseconds() {
        let ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        let before = ms(SystemTime::now());
        let now = now_ms();
        let after = ms(SystemTime::now());
        assert!(
            before <= now && now <= after,
            "{before} <= {now} <= {after}"
        );
    }
}
