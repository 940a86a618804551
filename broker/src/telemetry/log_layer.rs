//! WARN and ERROR events (INFO when `telemetry.logs_level: info`) as OTLP log records, with
//! the trace and span of the call they happened in. The local stderr log is its own layer
//! and stays as it was.
//!
//! [`ShipLayer`] serves the broker's own events; [`Hub::relay_executor_logs`] the
//! executor's, which arrive over the socket with the trace they belong to.

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use iii_shell_protocol::trace::{LogRecord as ExecutorLog, Severity as ExecutorSeverity};
use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, Severity};
use opentelemetry::trace::{SpanId, TraceFlags, TraceId};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

use super::Hub;

/// The message and fields of an event, as one line: `message key=value …`.
#[derive(Default)]
pub struct Line(pub String);

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.insert_str(0, value);
        } else {
            let _ = write!(self.0, " {}={}", field.name(), value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let msg = format!("{value:?}");
            self.0.insert_str(0, &msg);
        } else {
            let _ = write!(self.0, " {}={:?}", field.name(), value);
        }
    }
}

fn severity(level: &Level) -> (Severity, &'static str) {
    match *level {
        Level::ERROR => (Severity::Error, "ERROR"),
        Level::WARN => (Severity::Warn, "WARN"),
        Level::INFO => (Severity::Info, "INFO"),
        Level::DEBUG => (Severity::Debug, "DEBUG"),
        Level::TRACE => (Severity::Trace, "TRACE"),
    }
}

impl Hub {
    #[allow(clippy::too_many_arguments)]
    fn emit_log(
        &self,
        ts: std::time::SystemTime,
        sev: (Severity, &'static str),
        target: &str,
        body: String,
        process: &'static str,
        trace: Option<(TraceId, SpanId)>,
    ) {
        let mut r = self.logger.create_log_record();
        r.set_timestamp(ts);
        r.set_observed_timestamp(std::time::SystemTime::now());
        r.set_severity_number(sev.0);
        r.set_severity_text(sev.1);
        r.set_body(AnyValue::from(body));
        r.add_attribute("code.namespace", target.to_string());
        r.add_attribute("iii.shell.process", process);
        if let Some((t, s)) = trace {
            r.set_trace_context(t, s, Some(TraceFlags::SAMPLED));
        }
        self.logger.emit(r);
    }

    /// Ships the executor's log events.
    pub fn relay_executor_logs(&self, logs: Vec<ExecutorLog>) {
        for l in logs {
            let level = match l.severity {
                ExecutorSeverity::Error => Level::ERROR,
                ExecutorSeverity::Warn => Level::WARN,
                ExecutorSeverity::Info => Level::INFO,
            };
            if !self.ships(&level) {
                continue;
            }
            let trace = l
                .trace
                .map(|(t, s)| (TraceId::from_bytes(t), SpanId::from_bytes(s)))
                .filter(|(t, s)| *t != TraceId::INVALID && *s != SpanId::INVALID);
            self.emit_log(
                UNIX_EPOCH + Duration::from_nanos(l.unix_ns),
                severity(&level),
                &l.target,
                l.body,
                "executor",
                trace,
            );
        }
    }
}

/// The broker's own events to the engine. Installed at start-up with the stderr layer; it
/// does nothing until a hub is installed and telemetry is on.
pub struct ShipLayer;

impl<S: Subscriber> Layer<S> for ShipLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let Some(hub) = super::installed() else {
            return;
        };
        let level = event.metadata().level();
        if !hub.ships(level) {
            return;
        }
        let mut line = Line::default();
        event.record(&mut line);
        let trace = super::call_span::current_ids().map(|sc| (sc.trace_id(), sc.span_id()));
        hub.emit_log(
            std::time::SystemTime::now(),
            severity(level),
            event.metadata().target(),
            line.0,
            "broker",
            trace,
        );
    }
}
