//! Standing warnings: conditions of the policy in force (a `HOME` commands cannot use, a
//! capability that reaches other terminals) rather than events. Each is logged when it
//! starts to hold, not again while it holds (a policy pushed again, as every
//! `iii-shell call --socket` does, or a reload that keeps it), and again if it comes back
//! after a policy without it.

use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct Standing {
    current: Mutex<Vec<String>>,
}

impl Standing {
    /// Records `now` as what holds under the new policy; returns those of them that did not
    /// hold under the previous one (to log), in order.
    pub fn newly_standing(&self, now: Vec<String>) -> Vec<String> {
        let mut current = iii_shell_policy::sync::lock(&self.current);
        let fresh = now
            .iter()
            .filter(|w| !current.contains(w))
            .cloned()
            .collect();
        *current = now;
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_is_new_once_per_cause() {
        let s = Standing::default();
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(s.newly_standing(v(&["a"])), v(&["a"]));
        assert_eq!(s.newly_standing(v(&["a"])), v(&[]));
        assert_eq!(s.newly_standing(v(&["a", "b"])), v(&["b"]));
        assert_eq!(s.newly_standing(v(&["b"])), v(&[]));
        // Gone, then back: said again.
        assert_eq!(s.newly_standing(v(&[])), v(&[]));
        assert_eq!(s.newly_standing(v(&["a", "b"])), v(&["a", "b"]));
    }
}
