//! The frames waiting for the engine's telemetry socket: bounded, oldest dropped first.
//!
//! Exporters push finished frames (`OTLP`/`MTRC`/`LOGS` + OTLP/JSON) here from the SDK's
//! batching threads; the transport task takes them in order. A push never waits: when the
//! queue is over its frame or byte bound the oldest frames go, and what they held is counted,
//! so a socket that is down or slow costs memory up to the bound and nothing else.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::Notify;

/// What kind of telemetry a frame carries (its 4-byte prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Traces,
    Metrics,
    Logs,
}

impl Signal {
    /// The prefix the engine's telemetry socket dispatches on.
    pub fn prefix(self) -> &'static [u8; 4] {
        match self {
            Signal::Traces => b"OTLP",
            Signal::Metrics => b"MTRC",
            Signal::Logs => b"LOGS",
        }
    }
}

/// One binary WebSocket frame for the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub signal: Signal,
    /// Spans, log records or data points inside.
    pub items: u64,
    /// Prefix and JSON.
    pub bytes: Vec<u8>,
}

impl Frame {
    pub fn new(signal: Signal, items: u64, json: &[u8]) -> Frame {
        let mut bytes = Vec::with_capacity(4 + json.len());
        bytes.extend_from_slice(signal.prefix());
        bytes.extend_from_slice(json);
        Frame {
            signal,
            items,
            bytes,
        }
    }
}

/// The bounds of the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub max_frames: usize,
    pub max_bytes: usize,
}

impl Bounds {
    /// 256 frames, 8 MiB: a minute or more of a busy worker's telemetry.
    pub const DEFAULT: Bounds = Bounds {
        max_frames: 256,
        max_bytes: 8 << 20,
    };
}

/// What was dropped so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dropped {
    pub frames: u64,
    pub items: u64,
}

#[derive(Default)]
struct Queue {
    frames: VecDeque<Frame>,
    bytes: usize,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("frames", &self.len())
            .field("dropped", &self.dropped())
            .finish()
    }
}

pub struct Outbox {
    bounds: Bounds,
    queue: Mutex<Queue>,
    dropped_frames: AtomicU64,
    dropped_items: AtomicU64,
    ready: Notify,
}

impl Outbox {
    pub fn new(bounds: Bounds) -> Outbox {
        Outbox {
            bounds,
            queue: Mutex::default(),
            dropped_frames: AtomicU64::new(0),
            dropped_items: AtomicU64::new(0),
            ready: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `frame`, dropping the oldest frames while the queue is over a bound. A frame
    /// larger than the byte bound on its own is dropped itself.
    pub fn push(&self, frame: Frame) {
        let mut gone = Dropped::default();
        {
            let mut q = self.lock();
            if frame.bytes.len() > self.bounds.max_bytes {
                gone.frames += 1;
                gone.items += frame.items;
            } else {
                q.bytes += frame.bytes.len();
                q.frames.push_back(frame);
                while q.frames.len() > self.bounds.max_frames || q.bytes > self.bounds.max_bytes {
                    let Some(old) = q.frames.pop_front() else {
                        break;
                    };
                    q.bytes -= old.bytes.len();
                    gone.frames += 1;
                    gone.items += old.items;
                }
            }
        }
        self.count(gone);
        self.ready.notify_one();
    }

    /// Puts back a frame the transport took but could not send (the socket failed under
    /// it): first in line again, unless newer frames filled the queue meanwhile.
    pub fn put_back(&self, frame: Frame) {
        let mut gone = Dropped::default();
        {
            let mut q = self.lock();
            if q.frames.len() >= self.bounds.max_frames
                || q.bytes + frame.bytes.len() > self.bounds.max_bytes
            {
                gone.frames += 1;
                gone.items += frame.items;
            } else {
                q.bytes += frame.bytes.len();
                q.frames.push_front(frame);
            }
        }
        self.count(gone);
    }

    fn count(&self, gone: Dropped) {
        if gone.frames > 0 {
            self.dropped_frames
                .fetch_add(gone.frames, Ordering::Relaxed);
            self.dropped_items.fetch_add(gone.items, Ordering::Relaxed);
        }
    }

    /// The oldest frame, if any.
    pub fn pop(&self) -> Option<Frame> {
        let mut q = self.lock();
        let f = q.frames.pop_front()?;
        q.bytes -= f.bytes.len();
        Some(f)
    }

    /// Waits for the next frame.
    pub async fn next(&self) -> Frame {
        loop {
            let ready = self.ready.notified();
            if let Some(f) = self.pop() {
                return f;
            }
            ready.await;
        }
    }

    pub fn len(&self) -> usize {
        self.lock().frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dropped(&self) -> Dropped {
        Dropped {
            frames: self.dropped_frames.load(Ordering::Relaxed),
            items: self.dropped_items.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: u8, size: usize) -> Frame {
        Frame::new(Signal::Traces, n as u64, &vec![n; size])
    }

    #[test]
    fn a_frame_is_its_prefix_and_json() {
        let f = Frame::new(Signal::Logs, 3, b"{}");
        assert_eq!(f.bytes, b"LOGS{}");
        assert_eq!(Frame::new(Signal::Metrics, 0, b"x").bytes, b"MTRCx");
        assert_eq!(Frame::new(Signal::Traces, 0, b"x").bytes, b"OTLPx");
    }

    #[test]
    fn past_the_frame_bound_the_oldest_go_first_and_are_counted() {
        let o = Outbox::new(Bounds {
            max_frames: 2,
            max_bytes: 1 << 20,
        });
        o.push(frame(1, 10));
        o.push(frame(2, 10));
        o.push(frame(3, 10));
        assert_eq!(
            o.dropped(),
            Dropped {
                frames: 1,
                items: 1
            }
        );
        assert_eq!(o.pop().map(|f| f.items), Some(2));
        assert_eq!(o.pop().map(|f| f.items), Some(3));
        assert_eq!(o.pop(), None);
    }

    #[test]
    fn past_the_byte_bound_the_oldest_go_first() {
        // Each frame is 4 + 40 bytes; three fit in 140, a fourth pushes the first out.
        let o = Outbox::new(Bounds {
            max_frames: 100,
            max_bytes: 140,
        });
        for n in 1..=4 {
            o.push(frame(n, 40));
        }
        assert_eq!(
            o.dropped(),
            Dropped {
                frames: 1,
                items: 1
            }
        );
        assert_eq!(o.len(), 3);
        assert_eq!(o.pop().map(|f| f.items), Some(2));
    }

    #[test]
    fn a_frame_over_the_byte_bound_alone_is_dropped_not_the_queue() {
        let o = Outbox::new(Bounds {
            max_frames: 10,
            max_bytes: 100,
        });
        o.push(frame(1, 10));
        o.push(frame(7, 200));
        assert_eq!(
            o.dropped(),
            Dropped {
                frames: 1,
                items: 7
            }
        );
        assert_eq!(o.pop().map(|f| f.items), Some(1));
    }

    #[test]
    fn a_frame_put_back_is_sent_first_unless_the_queue_filled() {
        let o = Outbox::new(Bounds {
            max_frames: 2,
            max_bytes: 1 << 20,
        });
        o.push(frame(1, 1));
        let taken = o.pop().unwrap();
        o.push(frame(2, 1));
        o.put_back(taken);
        assert_eq!(o.pop().map(|f| f.items), Some(1));
        o.push(frame(3, 1));
        o.push(frame(4, 1));
        // Full: the frame put back is the oldest and is the one dropped.
        o.put_back(frame(5, 1));
        assert_eq!(
            o.dropped(),
            Dropped {
                frames: 2,
                items: 7
            }
        );
    }
}
