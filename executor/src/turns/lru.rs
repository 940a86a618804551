//! A map of at most `cap` entries that forgets the least recently used one first: the hooks'
//! per-session state (sub-agent parent links, each session's newest turn) is keyed by ids a
//! caller chooses, so it must not grow with every new id.
//!
//! Each entry carries the tick of its last use; `order` maps ticks back to keys, so the
//! least recently used entry is the first of `order` (O(log n) per call). No LRU crate is in
//! the workspace, and `indexmap` (there transitively) removes from the front in O(n).

use std::collections::{BTreeMap, HashMap};

/// A bounded least-recently-used map from session ids.
#[derive(Debug)]
pub struct Lru<V> {
    cap: usize,
    tick: u64,
    map: HashMap<String, (V, u64)>,
    order: BTreeMap<u64, String>,
}

impl<V> Lru<V> {
    /// A map holding at most `cap` entries (at least one).
    pub fn new(cap: usize) -> Lru<V> {
        Lru {
            cap: cap.max(1),
            tick: 0,
            map: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    fn next(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The value of `key`, which becomes the most recently used.
    pub fn get(&mut self, key: &str) -> Option<&V> {
        let t = self.next();
        let (_, used) = self.map.get_mut(key)?;
        let old = std::mem::replace(used, t);
        if let Some(k) = self.order.remove(&old) {
            self.order.insert(t, k);
        }
        self.map.get(key).map(|(v, _)| v)
    }

    /// Sets `key` (the most recently used now); past `cap` the least recently used entry goes.
    pub fn insert(&mut self, key: String, value: V) {
        let t = self.next();
        if let Some((_, old)) = self.map.insert(key.clone(), (value, t)) {
            self.order.remove(&old);
        }
        self.order.insert(t, key);
        while self.map.len() > self.cap {
            let Some((_, k)) = self.order.pop_first() else {
                break;
            };
            self.map.remove(&k);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_entry_goes_first() {
        let mut m = Lru::new(2);
        m.insert("a".into(), 1);
        m.insert("b".into(), 2);
        assert_eq!(m.get("a"), Some(&1));
        m.insert("c".into(), 3);
        assert_eq!(m.len(), 2);
        assert_eq!(m.get("b"), None, "b was used least recently");
        assert_eq!(
            (m.get("a").copied(), m.get("c").copied()),
            (Some(1), Some(3))
        );
        m.insert("a".into(), 10);
        m.insert("d".into(), 4);
        let got = (
            m.get("a").copied(),
            m.get("c").copied(),
            m.get("d").copied(),
        );
        assert_eq!(got, (Some(10), None, Some(4)));
        let mut one = Lru::new(0);
        one.insert("x".into(), ());
        one.insert("y".into(), ());
        assert_eq!(one.len(), 1);
        assert!(one.get("y").is_some() && !one.is_empty());
    }
}
