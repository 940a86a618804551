//! The one poison-recovering lock of the workspace.
//!
//! It lives here because every crate of iii-shell depends on this one and it is plain `std`
//! (no system call, no I/O), so it keeps this crate's rule.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking it over if a holder panicked: one panicking request must not wedge every
/// later caller of the same state (the panic itself is answered and logged where it happened).
/// The data is as the panicking holder left it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_mutex_is_taken_over_with_its_data() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let m2 = m.clone();
        let panicked = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            g.push(2);
            panic!("a holder panics");
        })
        .join();
        assert!(panicked.is_err());
        assert!(m.is_poisoned());
        lock(&m).push(3);
        assert_eq!(*lock(&m), [1, 2, 3]);
    }
}
