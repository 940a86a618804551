//! The executor's spans, measured over there and sent back on the socket, become spans of
//! this worker's trace pipeline with the ids and times the executor gave them.

use std::time::{Duration, UNIX_EPOCH};

use iii_shell_protocol::trace::{AttrValue, SpanRecord};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};

use super::Hub;

fn value(v: &AttrValue) -> opentelemetry::Value {
    match v {
        AttrValue::Str(s) => s.clone().into(),
        AttrValue::Int(i) => (*i).into(),
        AttrValue::Bool(b) => (*b).into(),
    }
}

/// The executor's attribute names all start with `iii.shell.` or are OTel semantic
/// conventions; anything else is not recorded (a defence against a confused executor).
pub fn allowed_attribute(key: &str) -> bool {
    key.starts_with("iii.shell.") || matches!(key, "process.pid")
}

impl Hub {
    /// Emits `records` as finished spans.
    pub fn emit_executor_spans(&self, records: Vec<SpanRecord>) {
        if !self.enabled() {
            return;
        }
        for r in records {
            let trace_id = TraceId::from_bytes(r.trace_id);
            let parent = SpanId::from_bytes(r.parent_span_id);
            if trace_id == TraceId::INVALID || parent == SpanId::INVALID {
                continue;
            }
            let parent_cx = Context::new().with_remote_span_context(SpanContext::new(
                trace_id,
                parent,
                TraceFlags::SAMPLED,
                true,
                TraceState::default(),
            ));
            let mut attrs: Vec<KeyValue> = r
                .attributes
                .iter()
                .filter(|(k, _)| allowed_attribute(k))
                .map(|(k, v)| KeyValue::new(k.clone(), value(v)))
                .collect();
            if let Some(code) = &r.error_code {
                attrs.push(KeyValue::new("error.type", code.clone()));
            }
            let mut builder = self
                .tracer
                .span_builder(r.name.clone())
                .with_kind(SpanKind::Internal)
                .with_start_time(UNIX_EPOCH + Duration::from_nanos(r.start_unix_ns))
                .with_attributes(attrs);
            builder.span_id = Some(SpanId::from_bytes(r.span_id));
            let mut span = self.tracer.build_with_context(builder, &parent_cx);
            span.set_status(match &r.error_code {
                Some(code) => Status::error(code.clone()),
                None => Status::Ok,
            });
            span.end_with_timestamp(UNIX_EPOCH + Duration::from_nanos(r.end_unix_ns));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_executors_own_vocabulary_is_recorded() {
        for (k, ok) in [
            ("iii.shell.exit_code", true),
            ("process.pid", true),
            ("argv", false),
            ("env.PATH", false),
            ("iii.function.id", false),
        ] {
            assert_eq!(allowed_attribute(k), ok, "{k}");
        }
    }
}
