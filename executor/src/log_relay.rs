//! The executor's WARN and ERROR events (INFO when `telemetry.logs_level: info`) for the
//! broker to ship to the engine: the executor talks to no network.
//!
//! [`RelayLayer`] sits beside the stderr log. When the policy in force has telemetry on, it
//! copies each event it keeps into a bounded queue (at most [`MAX_QUEUED`]; the oldest goes
//! first, as the broker's outbox does) with the trace of the request being handled; the
//! server's writer sends the queue as `ServerFrame::Logs`. Local logging is unchanged.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

use iii_shell_protocol::config::{TelemetryConfig, TelemetryLogLevel};
use iii_shell_protocol::trace::{LogRecord, Severity};
use tokio::sync::Notify;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// Events kept while no broker takes them.
pub const MAX_QUEUED: usize = 512;

/// 0: off; 1: error; 2: warn and error; 3: info too.
static LEVEL: AtomicU8 = AtomicU8::new(0);
static QUEUE: Mutex<VecDeque<LogRecord>> = Mutex::new(VecDeque::new());
static READY: Notify = Notify::const_new();

/// Follows the `telemetry` section of the policy in force.
pub fn apply(c: &TelemetryConfig) {
    let l = match (c.enabled, c.logs_level) {
        (false, _) => 0,
        (true, TelemetryLogLevel::Error) => 1,
        (true, TelemetryLogLevel::Warn) => 2,
        (true, TelemetryLogLevel::Info) => 3,
    };
    LEVEL.store(l, Ordering::Relaxed);
}

/// Whether an event of `level` is relayed under `setting` (see [`LEVEL`]).
pub fn relays(setting: u8, level: &Level) -> bool {
    let need = match *level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        _ => return false,
    };
    setting >= need
}

fn push(r: LogRecord) {
    let mut q = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
    if q.len() >= MAX_QUEUED {
        q.pop_front();
    }
    q.push_back(r);
    drop(q);
    READY.notify_one();
}

/// Everything queued.
pub fn take() -> Vec<LogRecord> {
    QUEUE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain(..)
        .collect()
}

/// Resolves when something was queued.
pub async fn ready() {
    READY.notified().await
}

#[derive(Default)]
struct Line(String);

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.insert_str(0, value);
        } else {
            self.0.push_str(&format!(" {}={}", field.name(), value));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?}"));
        } else {
            self.0.push_str(&format!(" {}={:?}", field.name(), value));
        }
    }
}

pub struct RelayLayer;

impl<S: Subscriber> Layer<S> for RelayLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let level = event.metadata().level();
        if !relays(LEVEL.load(Ordering::Relaxed), level) {
            return;
        }
        let mut line = Line::default();
        event.record(&mut line);
        let severity = match *level {
            Level::ERROR => Severity::Error,
            Level::WARN => Severity::Warn,
            _ => Severity::Info,
        };
        push(LogRecord {
            unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
            severity,
            target: event.metadata().target().to_string(),
            body: line.0,
            trace: iii_shell_protocol::call_trace::current().map(|r| r.ids()),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_keeps_the_newest_max_queued() {
        for i in 0..MAX_QUEUED + 5 {
            push(LogRecord {
                unix_ns: i as u64,
                severity: Severity::Warn,
                target: "t".into(),
                body: String::new(),
                trace: None,
            });
        }
        let got = take();
        assert_eq!(got.len(), MAX_QUEUED);
        assert_eq!(got[0].unix_ns, 5);
        assert_eq!(got[MAX_QUEUED - 1].unix_ns, (MAX_QUEUED + 4) as u64);
        assert!(take().is_empty());
    }

    #[test]
    fn levels_relay_what_the_configuration_says() {
        let all = [Level::ERROR, Level::WARN, Level::INFO, Level::DEBUG];
        let row = |s: u8| all.map(|l| relays(s, &l));
        assert_eq!(row(0), [false, false, false, false]);
        assert_eq!(row(1), [true, false, false, false]);
        assert_eq!(row(2), [true, true, false, false]);
        assert_eq!(row(3), [true, true, true, false]);
    }
}
