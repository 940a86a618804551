//! What a background job keeps so a caller can drive it (`shell::job::*`): its output rings
//! (stdout, stderr and the two merged in arrival order, each bounded by
//! `jobs.output_buffer_bytes`) with a change signal for long polls, its stdin pipe, the
//! bound on callers waiting at once, and the signal numbers of the documented set.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use iii_shell_policy::job_output::OutputRing;
use iii_shell_policy::sync::lock;
use iii_shell_protocol::job::{JobSignal, JobStream};
use tokio::net::unix::pipe;
use tokio::sync::watch;

/// The three rings of one job.
pub struct Rings {
    pub stdout: OutputRing,
    pub stderr: OutputRing,
    pub merged: OutputRing,
}

impl Rings {
    pub fn get(&self, stream: JobStream) -> &OutputRing {
        match stream {
            JobStream::Stdout => &self.stdout,
            JobStream::Stderr => &self.stderr,
            JobStream::Merged => &self.merged,
        }
    }
}

/// A job's output as readers see it, and the signal that more arrived.
pub struct JobOutput {
    pub rings: Mutex<Rings>,
    /// Bumped on every chunk; long polls wait on it.
    arrived: watch::Sender<u64>,
}

impl JobOutput {
    pub fn new(cap: usize) -> Self {
        JobOutput {
            rings: Mutex::new(Rings {
                stdout: OutputRing::new(cap),
                stderr: OutputRing::new(cap),
                merged: OutputRing::new(cap),
            }),
            arrived: watch::channel(0).0,
        }
    }

    /// A chunk of stdout (`stderr` false) or stderr arrived: into its ring and the merged one.
    pub fn push(&self, stderr: bool, chunk: &[u8]) {
        {
            let mut r = lock(&self.rings);
            if stderr {
                r.stderr.push(chunk);
            } else {
                r.stdout.push(chunk);
            }
            r.merged.push(chunk);
        }
        self.arrived.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Bytes the rings hold (for the finished jobs' memory cap).
    pub fn bytes(&self) -> usize {
        let r = lock(&self.rings);
        r.stdout.len() + r.stderr.len() + r.merged.len()
    }

    /// A receiver that sees every chunk pushed after this call.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.arrived.subscribe()
    }
}

/// A job's stdin.
pub enum JobStdin {
    /// Started by `shell::exec_bg`: stdin is `/dev/null`, or its bytes were written and it was
    /// closed; nothing can be written.
    NotOpen,
    /// Started by `shell::job::start`: the write end of its stdin pipe.
    Open(pipe::Sender),
    /// Closed by `close: true`, or found closed by the program.
    Closed,
}

/// Callers waiting on jobs at once (long-poll reads and waits), bounded by `jobs.max_waiters`.
#[derive(Default)]
pub struct Waiters(AtomicUsize);

/// One waiting caller's place; given back when dropped.
pub struct WaiterSlot<'a>(&'a AtomicUsize);

impl Drop for WaiterSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Waiters {
    /// A place for one more waiting caller, or `None` when `limit` are waiting already.
    pub fn take(&self, limit: usize) -> Option<WaiterSlot<'_>> {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| WaiterSlot(&self.0))
    }

    pub fn now(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// The kernel's number of a signal of the documented set.
pub fn signal_number(s: JobSignal) -> i32 {
    match s {
        JobSignal::Term => libc::SIGTERM,
        JobSignal::Int => libc::SIGINT,
        JobSignal::Hup => libc::SIGHUP,
        JobSignal::Quit => libc::SIGQUIT,
        JobSignal::Kill => libc::SIGKILL,
        JobSignal::Stop => libc::SIGSTOP,
        JobSignal::Cont => libc::SIGCONT,
        JobSignal::Usr1 => libc::SIGUSR1,
        JobSignal::Usr2 => libc::SIGUSR2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_numbers_exact_values() {
        // Linux's numbers (the same on x86_64 and aarch64).
        let numbers: Vec<i32> = JobSignal::ALL.into_iter().map(signal_number).collect();
        assert_eq!(numbers, [15, 2, 1, 3, 9, 19, 18, 10, 12]);
    }

    #[test]
    fn merged_keeps_arrival_order_and_each_stream_its_own_offsets() {
        let o = JobOutput::new(8);
        let rx = o.subscribe();
        o.push(false, b"out1 ");
        o.push(true, b"err1 ");
        o.push(false, b"out2");
        assert!(rx.has_changed().unwrap());
        let r = lock(&o.rings);
        let s = r.stdout.read(0, 99).unwrap();
        assert_eq!(
            (s.bytes.as_slice(), s.missed, s.next_offset),
            (&b"ut1 out2"[..], 1, 9)
        );
        assert_eq!(r.stderr.read(0, 99).unwrap().bytes, b"err1 ");
        let m = r.merged.read(0, 99).unwrap();
        assert_eq!(
            (m.bytes.as_slice(), m.missed, m.next_offset),
            (&b"rr1 out2"[..], 6, 14)
        );
        drop(r);
        assert_eq!(o.bytes(), 8 + 5 + 8);
    }

    #[test]
    fn waiters_are_bounded_and_a_slot_is_given_back() {
        let w = Waiters::default();
        let a = w.take(2).expect("first");
        let b = w.take(2).expect("second");
        assert!(w.take(2).is_none());
        drop(a);
        assert_eq!(w.now(), 1);
        let _c = w.take(2).expect("a place was given back");
        drop(b);
        assert_eq!(w.now(), 1);
    }
}
