//! A value that is set once, later, by another thread, and that threads and async tasks can
//! wait for: the record of a policy's protected entries, and the command ruleset built from
//! it, are made off the call path and waited for only by what needs them.

use std::sync::{Condvar, Mutex, OnceLock};

#[derive(Debug)]
pub struct Ready<T> {
    value: OnceLock<T>,
    /// Held by [`Ready::set`] while it wakes the threads, and by a thread between its check
    /// and its wait, so no wake-up falls between the two.
    lock: Mutex<()>,
    threads: Condvar,
    tasks: tokio::sync::Notify,
}

impl<T> Default for Ready<T> {
    fn default() -> Self {
        Ready {
            value: OnceLock::new(),
            lock: Mutex::new(()),
            threads: Condvar::new(),
            tasks: tokio::sync::Notify::new(),
        }
    }
}

impl<T> Ready<T> {
    /// A value that is there from the start.
    pub fn now(value: T) -> Ready<T> {
        let r = Ready::default();
        r.set(value);
        r
    }

    /// The value, if it is set.
    pub fn get(&self) -> Option<&T> {
        self.value.get()
    }

    /// Sets the value (the first call wins; a later one is dropped) and wakes every waiter.
    pub fn set(&self, value: T) {
        let _ = self.value.set(value);
        drop(self.lock.lock());
        self.threads.notify_all();
        self.tasks.notify_waiters();
    }

    /// Waits for the value on this thread.
    pub fn wait_blocking(&self) -> &T {
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(v) = self.value.get() {
                return v;
            }
            guard = self.threads.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits for the value without holding up the task's thread.
    pub async fn wait(&self) -> &T {
        loop {
            let woken = self.tasks.notified();
            tokio::pin!(woken);
            // Registered before the check, so a `set` between the two still wakes it.
            woken.as_mut().enable();
            if let Some(v) = self.value.get() {
                return v;
            }
            woken.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_thread_waits_for_a_value_set_later_and_the_first_set_wins() {
        let r = Arc::new(Ready::default());
        assert_eq!(r.get(), None);
        let r2 = r.clone();
        let t = std::thread::spawn(move || *r2.wait_blocking());
        std::thread::sleep(Duration::from_millis(20));
        r.set(7u32);
        r.set(8u32);
        assert_eq!(t.join().unwrap(), 7);
        assert_eq!(r.get(), Some(&7));
        assert_eq!(*Ready::now(3u8).wait_blocking(), 3);
    }

    #[tokio::test]
    async fn a_task_waits_for_a_value_set_by_a_thread() {
        let r = Arc::new(Ready::default());
        let r2 = r.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            r2.set("done".to_string());
        });
        let v = tokio::time::timeout(Duration::from_secs(5), r.wait())
            .await
            .expect("woken");
        assert_eq!(v, "done");
        t.join().unwrap();
    }
}
