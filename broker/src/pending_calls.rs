//! The waiters of one executor connection's calls in flight, and the rule that none is ever
//! left without an answer.
//!
//! A waiter is registered before its request is written and removed when its reply comes.
//! When the connection ends, whichever side notices first (the reader at EOF, the writer at
//! a broken pipe) closes the book: every waiter in it is answered with S216 at once, and no
//! waiter can be registered after that (the call learns that its request was never sent and
//! may go to the next executor). Registration and closing take the same lock, so a waiter is
//! either in the book when it closes (and answered) or refused (and never sent): a request
//! written just as the executor died can no longer wait for a reply nobody will send.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use iii_shell_protocol::messages::Reply;
use iii_shell_protocol::WireError;
use tokio::sync::oneshot;

pub type Waiter = oneshot::Sender<Result<Reply, WireError>>;

#[derive(Default)]
struct Book {
    waiters: HashMap<u64, Waiter>,
    closed: bool,
}

/// The shared book of one connection. Cheap to clone.
#[derive(Clone, Default)]
pub struct PendingCalls {
    book: Arc<Mutex<Book>>,
}

impl PendingCalls {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers the waiter of `id`; `false` (and nothing registered) once the book closed.
    pub fn register(&self, id: u64, waiter: Waiter) -> bool {
        let mut b = self.book();
        if b.closed {
            return false;
        }
        b.waiters.insert(id, waiter);
        true
    }

    /// The waiter of `id`, taken out of the book (its reply came, or it gave up).
    pub fn take(&self, id: u64) -> Option<Waiter> {
        self.book().waiters.remove(&id)
    }

    /// Closes the book and answers every waiter in it with `error()`. Idempotent.
    pub fn close(&self, error: impl Fn() -> WireError) {
        let waiters: Vec<Waiter> = {
            let mut b = self.book();
            b.closed = true;
            b.waiters.drain().map(|(_, w)| w).collect()
        };
        for w in waiters {
            let _ = w.send(Err(error()));
        }
    }

    pub fn is_closed(&self) -> bool {
        self.book().closed
    }

    /// Waiters in the book.
    pub fn len(&self) -> usize {
        self.book().waiters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iii_shell_protocol::Code;

    fn lost() -> WireError {
        WireError::new(Code::S216, "lost")
    }

    #[test]
    fn closing_answers_every_waiter_and_refuses_new_ones() {
        let book = PendingCalls::default();
        let (a, mut ra) = oneshot::channel();
        let (b, mut rb) = oneshot::channel();
        assert!(book.register(1, a));
        assert!(book.register(2, b));
        assert_eq!(book.len(), 2);
        book.close(lost);
        assert!(book.is_closed());
        assert_eq!(ra.try_recv().unwrap().unwrap_err().code, Code::S216);
        assert_eq!(rb.try_recv().unwrap().unwrap_err().code, Code::S216);
        let (c, mut rc) = oneshot::channel();
        assert!(!book.register(3, c), "a closed book takes no waiter");
        // The refused waiter was dropped: its call learns at once that nothing will answer.
        assert!(rc.try_recv().is_err());
        assert!(book.is_empty());
        book.close(lost);
    }

    #[test]
    fn a_taken_waiter_is_not_answered_by_the_close() {
        let book = PendingCalls::default();
        let (a, mut ra) = oneshot::channel();
        assert!(book.register(7, a));
        let w = book.take(7).expect("registered");
        book.close(lost);
        assert!(matches!(
            ra.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        drop(w);
        assert!(book.take(7).is_none());
    }
}
