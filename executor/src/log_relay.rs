//! The executor's WARN and ERROR events (INFO when `telemetry.logs_level: info`) for the
//! broker to ship to the engine: the executor talks to no network.
//!
//! [`RelayLayer`] sits beside the stderr log. When the policy in force has telemetry on, it
//! copies each event it keeps into a bounded queue (at most [`MAX_QUEUED`]; the oldest goes
//! first, as the broker's outbox does) with the trace of the request being handled; the
//! server's writer sends the queue as `ServerFrame::Logs`. Local logging is unchanged.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use iii_shell_protocol::config::{TelemetryConfig, TelemetryLogLevel};
use iii_shell_protocol::trace::{LogRecord, Severity};
use tokio::sync::Notify;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// Events kept while no broker takes them.
pub const MAX_QUEUED: usize = 512;

/// The relay's state, shared by the [`RelayLayer`] that fills it and the [`Relay`] handles
/// that configure and drain it.
#[derive(Default)]
struct Shared {
    /// 0: off; 1: error; 2: warn and error; 3: info too.
    level: AtomicU8,
    queue: Mutex<VecDeque<LogRecord>>,
    ready: Notify,
}

/// A handle on one relay: what the policy sets ([`Relay::apply`]) and what the server's
/// writer drains ([`Relay::take`], [`Relay::ready`]). Cheap to clone. A relay made with
/// `Relay::default()` has no layer feeding it, so it stays empty.
#[derive(Clone, Default)]
pub struct Relay(Arc<Shared>);

impl Relay {
    /// Follows the `telemetry` section of the policy in force.
    pub fn apply(&self, c: &TelemetryConfig) {
        self.0.level.store(level_of(c), Ordering::Relaxed);
    }

    fn push(&self, r: LogRecord) {
        let mut q = self.0.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= MAX_QUEUED {
            q.pop_front();
        }
        q.push_back(r);
        drop(q);
        self.0.ready.notify_one();
    }

    /// Everything queued.
    pub fn take(&self) -> Vec<LogRecord> {
        self.0
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect()
    }

    /// Resolves when something was queued.
    pub async fn ready(&self) {
        self.0.ready.notified().await
    }
}

/// The level setting [`relays`] takes, from the `telemetry` section.
pub fn level_of(c: &TelemetryConfig) -> u8 {
    match (c.enabled, c.logs_level) {
        (false, _) => 0,
        (true, TelemetryLogLevel::Error) => 1,
        (true, TelemetryLogLevel::Warn) => 2,
        (true, TelemetryLogLevel::Info) => 3,
    }
}

/// Whether an event of `level` is relayed under `setting` (0: off; 1: error; 2: warn and
/// error; 3: info too).
pub fn relays(setting: u8, level: &Level) -> bool {
    let need = match *level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        _ => return false,
    };
    setting >= need
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

/// The tracing layer that fills one relay; [`RelayLayer::new`] hands out the [`Relay`] the
/// executor drains.
pub struct RelayLayer(Relay);

impl RelayLayer {
    pub fn new() -> (RelayLayer, Relay) {
        let relay = Relay::default();
        (RelayLayer(relay.clone()), relay)
    }
}

impl<S: Subscriber> Layer<S> for RelayLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let level = event.metadata().level();
        if !relays(self.0 .0.level.load(Ordering::Relaxed), level) {
            return;
        }
        let mut line = Line::default();
        event.record(&mut line);
        let severity = match *level {
            Level::ERROR => Severity::Error,
            Level::WARN => Severity::Warn,
            _ => Severity::Info,
        };
        self.0.push(LogRecord {
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
        let relay = Relay::default();
        for i in 0..MAX_QUEUED + 5 {
            relay.push(LogRecord {
                unix_ns: i as u64,
                severity: Severity::Warn,
                target: "t".into(),
                body: String::new(),
                trace: None,
            });
        }
        let got = relay.take();
        assert_eq!(got.len(), MAX_QUEUED);
        assert_eq!(got[0].unix_ns, 5);
        assert_eq!(got[MAX_QUEUED - 1].unix_ns, (MAX_QUEUED + 4) as u64);
        assert!(relay.take().is_empty());
    }

    /// Two relays (two executors in one process) keep their own level and queue.
    #[test]
    fn two_relays_are_independent() {
        use tracing_subscriber::layer::SubscriberExt;
        let (la, a) = RelayLayer::new();
        let (lb, b) = RelayLayer::new();
        let on = TelemetryConfig {
            enabled: true,
            logs_level: TelemetryLogLevel::Warn,
            ..Default::default()
        };
        a.apply(&on);
        let sub_a = tracing_subscriber::registry().with(la);
        let sub_b = tracing_subscriber::registry().with(lb);
        tracing::subscriber::with_default(sub_a, || tracing::warn!("to a"));
        tracing::subscriber::with_default(sub_b, || tracing::warn!("to b, which is off"));
        let got = a.take();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].body, "to a");
        assert_eq!(got[0].severity, Severity::Warn);
        assert!(b.take().is_empty());
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
