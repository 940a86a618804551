//! One span per invocation, in the caller's trace.
//!
//! ```text
//! execute shell::exec            (server; parent: the caller's traceparent, else a new trace)
//! ├── validate                   broker: from the handler's start to its first executor request
//! └── executor.call              broker: the round trip over the executor socket (client)
//!     └── executor.exec          executor: its handling of the request
//!         ├── exec.prepare       re-checks, jail, Landlock ruleset, job cgroup
//!         ├── exec.spawn         the clone and exec of the command
//!         └── exec.wait          until the command exited and its output was read
//! ```
//!
//! The call's state rides in a task-local ([`CALL`]) around the handler, so the executor
//! client and the log layer find it without the handlers passing anything on.
//!
//! What is recorded, exactly: [`request_attributes`] and [`result_attributes`] (plus the
//! byte counts, the wire code of a failure and, on the executor's spans, its own counts and
//! flags). Never an argument's value, an environment value, a file's contents, a path or
//! terminal data.

use std::sync::{Arc, Mutex};

use iii_shell_protocol::trace::TraceContext;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::Span;
use serde_json::Value;

use super::propagation::{extract, Carrier};
use super::Hub;
use crate::engine::frames::ErrorBody;

tokio::task_local! {
    static CALL: Arc<CallState>;
}

/// What a running call's helpers need.
pub struct CallState {
    hub: &'static Hub,
    /// The caller's context with the call span in it.
    cx: Context,
    /// Open from the handler's start until its first executor request (or its end).
    validate: Mutex<Option<Span>>,
}

/// An invocation's span, from its arrival to its answer.
pub struct Call {
    state: Arc<CallState>,
    function_id: String,
}

/// The program name that may be recorded: the last path component of `command`'s first
/// word, when it is a plain name (letters, digits, `._+-`, at most 64 bytes); anything else
/// reads `other`, so a value that is not a program name is never recorded.
pub fn program_name(command: &str) -> &str {
    let first = command.split_whitespace().next().unwrap_or("");
    let base = first.rsplit('/').next().unwrap_or("");
    let plain = !base.is_empty()
        && base.len() <= 64
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
    if plain {
        base
    } else {
        "other"
    }
}

/// Attributes taken from the request, before the call runs.
pub fn request_attributes(function_id: &str, data: &Value) -> Vec<KeyValue> {
    let mut v = Vec::new();
    if matches!(function_id, "shell::exec" | "shell::exec_bg") {
        if let Some(c) = data.get("command").and_then(Value::as_str) {
            v.push(KeyValue::new(
                "iii.shell.program",
                program_name(c).to_string(),
            ));
        }
        let args = data
            .get("args")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        v.push(KeyValue::new("iii.shell.args_count", args as i64));
        let target = match data.get("target") {
            None | Some(Value::Null) => "host",
            Some(Value::String(s)) if s == "host" => "host",
            Some(_) => "sandbox",
        };
        v.push(KeyValue::new("iii.shell.target", target));
    }
    v
}

/// Attributes taken from a successful result.
pub fn result_attributes(function_id: &str, result: &Value) -> Vec<KeyValue> {
    let mut v = Vec::new();
    match function_id {
        "shell::exec" => {
            if let Some(c) = result.get("exit_code").and_then(Value::as_i64) {
                v.push(KeyValue::new("iii.shell.exit_code", c));
            }
            for (k, attr) in [
                ("timed_out", "iii.shell.timed_out"),
                ("stdout_truncated", "iii.shell.stdout_truncated"),
                ("stderr_truncated", "iii.shell.stderr_truncated"),
            ] {
                if let Some(b) = result.get(k).and_then(Value::as_bool) {
                    v.push(KeyValue::new(attr, b));
                }
            }
            for (k, attr) in [
                ("stdout", "iii.shell.stdout_bytes"),
                ("stderr", "iii.shell.stderr_bytes"),
            ] {
                if let Some(s) = result.get(k).and_then(Value::as_str) {
                    v.push(KeyValue::new(attr, s.len() as i64));
                }
            }
            if let Some(d) = result.get("duration_ms").and_then(Value::as_i64) {
                v.push(KeyValue::new("iii.shell.duration_ms", d));
            }
        }
        "shell::exec_bg" => {
            if let Some(id) = result.get("job_id").and_then(Value::as_str) {
                v.push(KeyValue::new("iii.shell.job_id", id.to_string()));
            }
        }
        _ => {}
    }
    v
}

impl Hub {
    /// Starts the span of an invocation of `function_id` whose frame was `bytes_in` long.
    pub fn start_call(
        &'static self,
        function_id: &str,
        carrier: &Carrier,
        data: &Value,
        bytes_in: usize,
    ) -> Call {
        let parent = extract(carrier);
        let mut attrs = vec![
            KeyValue::new("iii.function.id", function_id.to_string()),
            KeyValue::new(
                "iii.namespace",
                self.identity
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
            ),
            KeyValue::new("iii.invocation.bytes_in", bytes_in as i64),
        ];
        attrs.extend(request_attributes(function_id, data));
        let span = self.tracer.build_with_context(
            self.tracer
                .span_builder(format!("execute {function_id}"))
                .with_kind(SpanKind::Server)
                .with_attributes(attrs),
            &parent,
        );
        let cx = parent.with_span(span);
        let validate = self.child(&cx, "validate", SpanKind::Internal);
        Call {
            state: Arc::new(CallState {
                hub: self,
                cx,
                validate: Mutex::new(Some(validate)),
            }),
            function_id: function_id.to_string(),
        }
    }

    fn child(&self, cx: &Context, name: &'static str, kind: SpanKind) -> Span {
        self.tracer
            .build_with_context(self.tracer.span_builder(name).with_kind(kind), cx)
    }
}

fn fail(span: &mut impl opentelemetry::trace::Span, code: &str) {
    span.set_attribute(KeyValue::new("error.type", code.to_string()));
    span.set_status(Status::error(code.to_string()));
}

impl Call {
    /// Runs `handler` as this call (its helpers find the call through the task-local).
    pub fn run<F: std::future::Future>(
        &self,
        handler: F,
    ) -> tokio::task::futures::TaskLocalFuture<Arc<CallState>, F> {
        CALL.scope(self.state.clone(), handler)
    }

    /// Ends the call span with the outcome and the size of the answer frame.
    pub fn finish(self, outcome: &Result<Value, ErrorBody>, bytes_out: usize) {
        let code = outcome.as_ref().err().map(|e| e.code.as_str());
        // A call that failed before reaching the executor failed in validation.
        if let Some(mut v) = self.state.validate.lock().ok().and_then(|mut g| g.take()) {
            if let Some(code) = code {
                fail(&mut v, code);
            }
            v.end();
        }
        let span = self.state.cx.span();
        span.set_attribute(KeyValue::new("iii.invocation.bytes_out", bytes_out as i64));
        match outcome {
            Ok(v) => {
                for kv in result_attributes(&self.function_id, v) {
                    span.set_attribute(kv);
                }
                span.set_status(Status::Ok);
            }
            Err(e) => {
                span.set_attribute(KeyValue::new("error.type", e.code.clone()));
                span.set_status(Status::error(e.code.clone()));
            }
        }
        span.end();
        self.state.hub.metrics.call_ended(&self.function_id, code);
    }
}

/// The trace and span a log event inside the current call belongs to.
pub fn current_ids() -> Option<SpanContext> {
    CALL.try_with(|c| c.cx.span().span_context().clone())
        .ok()
        .filter(|sc| sc.is_valid())
}

/// The `traceparent` and `baggage` for an engine call made inside the current call, so
/// what it reaches (a sandbox, a channel) joins the same trace.
pub fn outgoing() -> Option<Carrier> {
    CALL.try_with(|c| super::propagation::inject(&c.cx)).ok()
}

/// A request to the executor inside a call: its span, and the context the request carries.
pub struct RoundTrip {
    span: Span,
    hub: &'static Hub,
    kind: &'static str,
    pub context: Option<TraceContext>,
}

/// Starts the round trip of a request of `kind`, inside the current call (None outside one,
/// or with telemetry off). The call's validation ends here.
pub fn round_trip(kind: &'static str) -> Option<RoundTrip> {
    CALL.try_with(|c| {
        if !c.hub.enabled() {
            return None;
        }
        if let Some(v) = c.validate.lock().ok().and_then(|mut g| g.take()) {
            let mut v = v;
            v.end();
        }
        let mut span = c.hub.child(&c.cx, "executor.call", SpanKind::Client);
        span.set_attribute(KeyValue::new("iii.shell.request", kind));
        let sc = span.span_context();
        let context = (sc.is_valid() && sc.is_sampled()).then(|| TraceContext {
            trace_id: sc.trace_id().to_bytes(),
            span_id: sc.span_id().to_bytes(),
            sampled: true,
        });
        Some(RoundTrip {
            span,
            hub: c.hub,
            kind,
            context,
        })
    })
    .ok()
    .flatten()
}

impl RoundTrip {
    /// Ends the round trip with the executor's answer.
    pub fn finish<T>(mut self, result: &Result<T, iii_shell_protocol::WireError>) {
        match result {
            Ok(_) => {
                if matches!(self.kind, "exec" | "exec_bg" | "pty_open") {
                    self.hub.metrics.spawned();
                }
            }
            Err(e) => fail(&mut self.span, e.code.as_str()),
        }
        self.span.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kv(pairs: &[KeyValue]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|k| (k.key.to_string(), k.value.to_string()))
            .collect()
    }

    fn owned(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn program_names_are_plain_names_or_other() {
        for (cmd, want) in [
            ("echo", "echo"),
            ("/usr/bin/git", "git"),
            ("python3.12", "python3.12"),
            ("g++", "g++"),
            ("ls -la /secret", "ls"),
            ("curl$(id)", "other"),
            ("tok=abc", "other"),
            ("", "other"),
            ("/", "other"),
            (&"a".repeat(65), "other"),
        ] {
            assert_eq!(program_name(cmd), want, "{cmd:?}");
        }
    }

    #[test]
    fn exec_requests_record_the_program_the_argument_count_and_the_target_only() {
        let data = json!({"command": "curl", "args": ["-H", "Authorization: secret"], "env": {"K": "v"}, "stdin": "pw"});
        assert_eq!(
            kv(&request_attributes("shell::exec", &data)),
            owned(&[
                ("iii.shell.program", "curl"),
                ("iii.shell.args_count", "2"),
                ("iii.shell.target", "host"),
            ])
        );
        let sandbox = json!({"command": "ls", "target": {"sandbox_id": "x"}});
        assert_eq!(
            kv(&request_attributes("shell::exec_bg", &sandbox)),
            owned(&[
                ("iii.shell.program", "ls"),
                ("iii.shell.args_count", "0"),
                ("iii.shell.target", "sandbox"),
            ])
        );
        assert!(
            request_attributes("shell::fs::write", &json!({"path": "/a", "content": "x"}))
                .is_empty()
        );
    }

    #[test]
    fn exec_results_record_codes_flags_and_sizes_not_output() {
        let r = json!({"stdout": "hello\n", "stderr": "", "exit_code": 3, "timed_out": false,
                       "stdout_truncated": false, "stderr_truncated": true, "duration_ms": 12});
        assert_eq!(
            kv(&result_attributes("shell::exec", &r)),
            owned(&[
                ("iii.shell.exit_code", "3"),
                ("iii.shell.timed_out", "false"),
                ("iii.shell.stdout_truncated", "false"),
                ("iii.shell.stderr_truncated", "true"),
                ("iii.shell.stdout_bytes", "6"),
                ("iii.shell.stderr_bytes", "0"),
                ("iii.shell.duration_ms", "12"),
            ])
        );
        let timed_out = json!({"stdout": "", "stderr": "", "exit_code": null, "timed_out": true,
                               "stdout_truncated": false, "stderr_truncated": false, "duration_ms": 5});
        assert!(!kv(&result_attributes("shell::exec", &timed_out))
            .iter()
            .any(|(k, _)| k == "iii.shell.exit_code"));
        assert_eq!(
            kv(&result_attributes(
                "shell::exec_bg",
                &json!({"job_id": "j-1", "argv": ["sleep", "9"]})
            )),
            owned(&[("iii.shell.job_id", "j-1")])
        );
        assert!(result_attributes("shell::fs::read", &json!({"content": "secret"})).is_empty());
    }
}
