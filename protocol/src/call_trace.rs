//! Spans of a traced request, measured here and sent to the broker after the reply.
//!
//! A request that carries a [`TraceContext`] is handled inside a [`Recorder`] (a task-local
//! set by the server): the server's `executor.<kind>` span covers the whole handling, and
//! [`start`] opens a child of it anywhere below (`exec.prepare`, `exec.spawn`, `exec.wait`,
//! `fs.walk`; blocking work joins through [`in_blocking`]). A request without a context records nothing and [`start`] returns `None`:
//! one task-local lookup.
//!
//! Attributes are the executor's own vocabulary (`iii.shell.*`, `process.pid`): counts,
//! flags, codes. Never an argument, an environment value, a path or file contents.

use std::sync::{Arc, Mutex};

use crate::trace::{AttrValue, SpanRecord, TraceContext};

tokio::task_local! {
    /// The recorder of the request being handled. Not process-global state: the key is
    /// immutable, and each value lives in the scope that set it ([`scope`] for the request's
    /// task, [`in_blocking`] for its blocking work), so every request and every executor in
    /// a process sees its own. It stays a task-local, not an argument, because the spans and
    /// log events it collects are opened deep below the request handler (`fs.walk`, the log
    /// relay's layer), where threading a value through every call would touch every module.
    static CURRENT: Arc<Recorder>;
}

/// At most this many spans are kept per request (a walk over a huge tree still records one
/// `fs.walk`, but a request can never grow the list without bound).
pub const MAX_SPANS: usize = 64;

pub struct Recorder {
    trace_id: [u8; 16],
    /// The span the request's children hang under (the server's `executor.<kind>`).
    parent: [u8; 8],
    spans: Mutex<Vec<SpanRecord>>,
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A fresh, non-zero span id.
pub fn span_id() -> [u8; 8] {
    let b = *uuid::Uuid::new_v4().as_bytes();
    let mut id = [0u8; 8];
    id.copy_from_slice(&b[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

impl Recorder {
    fn push(&self, r: SpanRecord) {
        let mut g = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() < MAX_SPANS {
            g.push(r);
        }
    }

    /// The spans recorded so far.
    pub fn take(&self) -> Vec<SpanRecord> {
        std::mem::take(&mut *self.spans.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The trace and span a log event in this request belongs to.
    pub fn ids(&self) -> ([u8; 16], [u8; 8]) {
        (self.trace_id, self.parent)
    }
}

/// An open span; it is recorded when dropped.
pub struct Span {
    rec: Arc<Recorder>,
    id: [u8; 8],
    parent: [u8; 8],
    name: &'static str,
    start: u64,
    attributes: Vec<(String, AttrValue)>,
    error_code: Option<String>,
}

impl Span {
    pub fn attr(&mut self, key: &'static str, value: impl Into<Attr>) {
        self.attributes.push((key.to_string(), value.into().0));
    }

    /// Marks the span failed with the wire code `code`.
    pub fn fail(&mut self, code: &str) {
        self.error_code = Some(code.to_string());
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        self.rec.push(SpanRecord {
            trace_id: self.rec.trace_id,
            span_id: self.id,
            parent_span_id: self.parent,
            name: self.name.to_string(),
            start_unix_ns: self.start,
            end_unix_ns: now_ns(),
            attributes: std::mem::take(&mut self.attributes),
            error_code: self.error_code.take(),
        });
    }
}

/// An attribute value.
pub struct Attr(AttrValue);

impl From<bool> for Attr {
    fn from(v: bool) -> Self {
        Attr(AttrValue::Bool(v))
    }
}
impl From<i64> for Attr {
    fn from(v: i64) -> Self {
        Attr(AttrValue::Int(v))
    }
}
impl From<u64> for Attr {
    fn from(v: u64) -> Self {
        Attr(AttrValue::Int(i64::try_from(v).unwrap_or(i64::MAX)))
    }
}
impl From<i32> for Attr {
    fn from(v: i32) -> Self {
        Attr(AttrValue::Int(v.into()))
    }
}
impl From<u32> for Attr {
    fn from(v: u32) -> Self {
        Attr(AttrValue::Int(v.into()))
    }
}
impl From<&'static str> for Attr {
    fn from(v: &'static str) -> Self {
        Attr(AttrValue::Str(v.to_string()))
    }
}

/// A traced request: its recorder and its own span (`executor.<kind>`).
pub struct Traced {
    pub recorder: Arc<Recorder>,
    pub span: Span,
}

/// Starts recording a request under `ctx` (nothing when it is not sampled).
pub fn begin(ctx: Option<TraceContext>, kind: &'static str) -> Option<Traced> {
    let ctx = ctx.filter(|c| c.sampled && c.trace_id != [0; 16] && c.span_id != [0; 8])?;
    let own = span_id();
    let recorder = Arc::new(Recorder {
        trace_id: ctx.trace_id,
        parent: own,
        spans: Mutex::new(Vec::new()),
    });
    let mut span = Span {
        rec: recorder.clone(),
        id: own,
        parent: ctx.span_id,
        name: request_span_name(kind),
        start: now_ns(),
        attributes: Vec::new(),
        error_code: None,
    };
    span.attr("iii.shell.request", kind);
    Some(Traced { recorder, span })
}

/// The name of the span of a request of `kind`.
pub fn request_span_name(kind: &'static str) -> &'static str {
    match kind {
        "exec" => "executor.exec",
        "exec_bg" => "executor.exec_bg",
        "fs" => "executor.fs",
        "coder" => "executor.coder",
        "turns" => "executor.turns",
        "ui_state" => "executor.ui_state",
        "watch" => "executor.watch",
        k if k.starts_with("pty") => "executor.pty",
        _ => "executor.request",
    }
}

/// Runs `f` with `rec` as the current request's recorder (or as it is, with none).
pub async fn scope<F: std::future::Future>(rec: Option<Arc<Recorder>>, f: F) -> F::Output {
    match rec {
        Some(r) => CURRENT.scope(r, f).await,
        None => f.await,
    }
}

/// The current request's recorder (in its task, or in blocking work run by [`in_blocking`]).
pub fn current() -> Option<Arc<Recorder>> {
    CURRENT.try_with(|r| r.clone()).ok()
}

/// Runs blocking work `f` for the request `rec` records (its spans and log events join it):
/// the recorder is in scope on this thread for the duration of `f` only.
pub fn in_blocking<T>(rec: Option<Arc<Recorder>>, f: impl FnOnce() -> T) -> T {
    match rec {
        Some(r) => CURRENT.sync_scope(r, f),
        None => f(),
    }
}

/// Opens a child of the current request's span.
pub fn start(name: &'static str) -> Option<Span> {
    current().map(|r| start_in(&r, name))
}

/// Opens a child of `rec`'s request span (from blocking work, which has no task-local).
pub fn start_in(rec: &Arc<Recorder>, name: &'static str) -> Span {
    Span {
        rec: rec.clone(),
        id: span_id(),
        parent: rec.parent,
        name,
        start: now_ns(),
        attributes: Vec::new(),
        error_code: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> TraceContext {
        TraceContext {
            trace_id: [7; 16],
            span_id: [9; 8],
            sampled: true,
        }
    }

    #[tokio::test]
    async fn children_hang_under_the_request_span_under_the_brokers() {
        let t = begin(Some(ctx()), "exec").unwrap();
        let rec = t.recorder.clone();
        scope(Some(rec.clone()), async {
            let mut s = start("exec.spawn").unwrap();
            s.attr("process.pid", 42u32);
        })
        .await;
        let own = t.span.id;
        drop(t.span);
        let spans = rec.take();
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].name, "exec.spawn");
        assert_eq!(spans[0].parent_span_id, own);
        assert_eq!(
            spans[0].attributes,
            vec![("process.pid".to_string(), AttrValue::Int(42))]
        );
        assert_eq!(spans[1].name, "executor.exec");
        assert_eq!(spans[1].parent_span_id, [9; 8]);
        assert_eq!(spans[1].trace_id, [7; 16]);
        assert!(spans.iter().all(|s| s.end_unix_ns >= s.start_unix_ns));
    }

    #[tokio::test]
    async fn no_context_or_an_unsampled_one_records_nothing() {
        assert!(begin(None, "exec").is_none());
        assert!(begin(
            Some(TraceContext {
                sampled: false,
                ..ctx()
            }),
            "exec"
        )
        .is_none());
        assert!(start("exec.spawn").is_none());
    }

    #[tokio::test]
    async fn a_request_keeps_at_most_max_spans() {
        let t = begin(Some(ctx()), "fs").unwrap();
        for _ in 0..MAX_SPANS + 10 {
            drop(start_in(&t.recorder, "fs.walk"));
        }
        assert_eq!(t.recorder.take().len(), MAX_SPANS);
    }

    /// Blocking work joins its request's trace on the pool thread, and leaves the thread
    /// without it: the next blocking task there records nothing.
    #[tokio::test]
    async fn blocking_work_joins_its_request_and_leaves_the_thread_clean() {
        let t = begin(Some(ctx()), "fs").unwrap();
        let rec = t.recorder.clone();
        let inner = rec.clone();
        let seen = tokio::task::spawn_blocking(move || {
            let during = in_blocking(Some(inner), || {
                drop(start("fs.walk").expect("a span inside the request's blocking work"));
                current().is_some()
            });
            (during, current().is_none(), start("fs.walk").is_none())
        })
        .await
        .unwrap();
        assert_eq!(seen, (true, true, true));
        let spans = rec.take();
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].name, "fs.walk");
        assert_eq!(spans[0].parent_span_id, t.span.id);
    }
}
