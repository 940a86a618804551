//! The engine's telemetry intake (§8.2) and enough of the observability worker's functions to
//! check what a worker sends: binary frames `OTLP` (traces), `MTRC` (metrics) and `LOGS`
//! (logs), each followed by OTLP/JSON, on `/otel` or on the worker socket; stored in memory;
//! served by `engine::traces::list`, `engine::traces::tree`, `engine::logs::list` and the
//! `latest_metrics` of `engine::workers::info`.
//!
//! The JSON is read the way the engine reads it (camelCase keys, hex ids, 64-bit numbers as
//! strings or numbers) but by our own code, with `serde_json::Value` only: a worker whose
//! frames this rejects would be rejected by the engine too. A frame that does not parse is
//! kept in [`Telemetry::errors`] so a test can fail on it.

use serde_json::{json, Map, Value};

use crate::protocol::ErrorBody;

/// Most spans, logs and metric points kept (oldest dropped first).
const MAX_KEPT: usize = 20_000;

#[derive(Debug, Default)]
pub(crate) struct Telemetry {
    /// Stored spans, in the engine's `StoredSpan` JSON shape.
    pub spans: Vec<Value>,
    /// Stored logs, in the engine's `StoredLog` JSON shape.
    pub logs: Vec<Value>,
    /// Number data points: (metric name, attributes, value, time in ns).
    pub points: Vec<(String, Map<String, Value>, f64, u64)>,
    /// Frames that did not parse, with the reason.
    pub errors: Vec<String>,
    /// Frames received, by prefix.
    pub frames: u64,
}

fn num(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn hex_id(v: Option<&Value>, len: usize, what: &str) -> Result<Option<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() || s.chars().all(|c| c == '0') => Ok(None),
        Some(Value::String(s)) if s.len() == len && s.chars().all(|c| c.is_ascii_hexdigit()) => {
            Ok(Some(s.to_ascii_lowercase()))
        }
        Some(other) => Err(format!("{what} is not {len} hex digits: {other}")),
    }
}

/// An OTLP `AnyValue` as the engine's stored string.
fn any_string(v: &Value) -> String {
    let Some(o) = v.as_object() else {
        return String::new();
    };
    if let Some(s) = o.get("stringValue").and_then(Value::as_str) {
        return s.to_string();
    }
    if let Some(i) = o.get("intValue") {
        return num(i).map(|n| n.to_string()).unwrap_or_else(|| match i {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
    }
    if let Some(b) = o.get("boolValue").and_then(Value::as_bool) {
        return b.to_string();
    }
    if let Some(d) = o.get("doubleValue").and_then(Value::as_f64) {
        return d.to_string();
    }
    v.to_string()
}

fn attributes(v: Option<&Value>) -> Vec<(String, String)> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|kv| {
                    Some((
                        kv.get("key")?.as_str()?.to_string(),
                        any_string(kv.get("value")?),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn service_name(resource: Option<&Value>) -> String {
    attributes(resource.and_then(|r| r.get("attributes")))
        .into_iter()
        .find(|(k, _)| k == "service.name")
        .map(|(_, v)| v)
        .unwrap_or_else(|| "unknown".into())
}

fn keep(v: &mut Vec<Value>) {
    if v.len() > MAX_KEPT {
        let over = v.len() - MAX_KEPT;
        v.drain(..over);
    }
}

impl Telemetry {
    /// Takes one binary frame; false when it has no telemetry prefix.
    pub(crate) fn ingest(&mut self, frame: &[u8]) -> bool {
        let (prefix, rest) = frame.split_at(frame.len().min(4));
        let kind = match prefix {
            b"OTLP" => 0,
            b"MTRC" => 1,
            b"LOGS" => 2,
            _ => return false,
        };
        self.frames += 1;
        let parsed: Result<Value, String> =
            serde_json::from_slice(rest).map_err(|e| format!("not JSON: {e}"));
        let r = parsed.and_then(|v| match kind {
            0 => self.traces(&v),
            1 => self.metrics(&v),
            _ => self.logs_in(&v),
        });
        if let Err(e) = r {
            let name = ["OTLP", "MTRC", "LOGS"][kind];
            self.errors.push(format!("{name} frame: {e}"));
        }
        true
    }

    fn traces(&mut self, v: &Value) -> Result<(), String> {
        let rs = v
            .get("resourceSpans")
            .and_then(Value::as_array)
            .ok_or("no resourceSpans")?;
        for r in rs {
            let service = service_name(r.get("resource"));
            for ss in r
                .get("scopeSpans")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let scope = ss.get("scope").and_then(|s| s.get("name")).cloned();
                for s in ss
                    .get("spans")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let trace_id = hex_id(s.get("traceId"), 32, "traceId")?.ok_or("no traceId")?;
                    let span_id = hex_id(s.get("spanId"), 16, "spanId")?.ok_or("no spanId")?;
                    let parent = hex_id(s.get("parentSpanId"), 16, "parentSpanId")?;
                    let name = s
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or("span without a name")?;
                    let start = s
                        .get("startTimeUnixNano")
                        .and_then(num)
                        .ok_or("bad startTimeUnixNano")?;
                    let end = s
                        .get("endTimeUnixNano")
                        .and_then(num)
                        .ok_or("bad endTimeUnixNano")?;
                    let status = s.get("status");
                    let code = status
                        .and_then(|st| st.get("code"))
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                    let mut stored = json!({
                        "trace_id": trace_id,
                        "span_id": span_id,
                        "parent_span_id": parent,
                        "name": name,
                        "kind": s.get("kind").cloned().unwrap_or(Value::Null),
                        "start_time_unix_nano": start,
                        "end_time_unix_nano": end,
                        "status": match code { 1 => "ok", 2 => "error", _ => "unset" },
                        "attributes": attributes(s.get("attributes")),
                        "service_name": service,
                        "events": s.get("events").cloned().unwrap_or(json!([])),
                        "links": [],
                        "instrumentation_scope_name": scope,
                    });
                    if let Some(m) = status
                        .and_then(|st| st.get("message"))
                        .and_then(Value::as_str)
                        .filter(|m| !m.is_empty())
                    {
                        stored["status_description"] = json!(m);
                    }
                    self.spans.push(stored);
                }
            }
        }
        keep(&mut self.spans);
        Ok(())
    }

    fn metrics(&mut self, v: &Value) -> Result<(), String> {
        let rm = v
            .get("resourceMetrics")
            .and_then(Value::as_array)
            .ok_or("no resourceMetrics")?;
        for r in rm {
            for sm in r
                .get("scopeMetrics")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                for m in sm
                    .get("metrics")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let name = m
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or("metric without a name")?;
                    let points = m
                        .get("gauge")
                        .or_else(|| m.get("sum"))
                        .and_then(|g| g.get("dataPoints"))
                        .and_then(Value::as_array);
                    for p in points.into_iter().flatten() {
                        let value = p
                            .get("asDouble")
                            .and_then(Value::as_f64)
                            .or_else(|| p.get("asInt").and_then(num).map(|n| n as f64))
                            .ok_or_else(|| format!("{name}: a data point without a value"))?;
                        let at = p
                            .get("timeUnixNano")
                            .and_then(num)
                            .ok_or_else(|| format!("{name}: bad timeUnixNano"))?;
                        let attrs: Map<String, Value> = attributes(p.get("attributes"))
                            .into_iter()
                            .map(|(k, v)| (k, Value::String(v)))
                            .collect();
                        self.points.push((name.to_string(), attrs, value, at));
                    }
                }
            }
        }
        if self.points.len() > MAX_KEPT {
            let over = self.points.len() - MAX_KEPT;
            self.points.drain(..over);
        }
        Ok(())
    }

    fn logs_in(&mut self, v: &Value) -> Result<(), String> {
        let rl = v
            .get("resourceLogs")
            .and_then(Value::as_array)
            .ok_or("no resourceLogs")?;
        for r in rl {
            let service = service_name(r.get("resource"));
            let resource: Map<String, Value> =
                attributes(r.get("resource").and_then(|x| x.get("attributes")))
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect();
            for sl in r
                .get("scopeLogs")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                for l in sl
                    .get("logRecords")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let attrs: Map<String, Value> = attributes(l.get("attributes"))
                        .into_iter()
                        .map(|(k, v)| (k, Value::String(v)))
                        .collect();
                    self.logs.push(json!({
                        "timestamp_unix_nano": l.get("timeUnixNano").and_then(num).unwrap_or(0),
                        "observed_timestamp_unix_nano": l.get("observedTimeUnixNano").and_then(num).unwrap_or(0),
                        "severity_number": l.get("severityNumber").and_then(Value::as_i64).unwrap_or(0),
                        "severity_text": l.get("severityText").and_then(Value::as_str).unwrap_or(""),
                        "body": l.get("body").map(any_string).unwrap_or_default(),
                        "attributes": attrs,
                        "trace_id": hex_id(l.get("traceId"), 32, "traceId")?,
                        "span_id": hex_id(l.get("spanId"), 16, "spanId")?,
                        "resource": resource,
                        "service_name": service,
                    }));
                }
            }
        }
        keep(&mut self.logs);
        Ok(())
    }

    /// `engine::traces::list`: spans of the store, filtered by `trace_id` / `trace_ids`,
    /// `name` and `status`; only each trace's local roots unless `search_all_spans`.
    pub(crate) fn list_traces(&self, data: &Value) -> Result<Value, ErrorBody> {
        let ids: Option<Vec<String>> = match (data.get("trace_id"), data.get("trace_ids")) {
            (Some(Value::String(t)), _) => Some(vec![t.to_ascii_lowercase()]),
            (_, Some(Value::Array(a))) => Some(
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_ascii_lowercase)
                    .collect(),
            ),
            _ => None,
        };
        let all = data
            .get("search_all_spans")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let name = data.get("name").and_then(Value::as_str);
        let status = data.get("status").and_then(Value::as_str);
        let present: std::collections::HashSet<&str> = self
            .spans
            .iter()
            .filter_map(|s| s["span_id"].as_str())
            .collect();
        let matching: Vec<&Value> = self
            .spans
            .iter()
            .filter(|s| {
                ids.as_ref()
                    .is_none_or(|ids| ids.iter().any(|t| s["trace_id"] == *t.as_str()))
            })
            .filter(|s| name.is_none_or(|n| s["name"].as_str().is_some_and(|x| x.contains(n))))
            .filter(|s| status.is_none_or(|st| s["status"] == st))
            .filter(|s| {
                all || s["parent_span_id"]
                    .as_str()
                    .is_none_or(|p| !present.contains(p))
            })
            .collect();
        let offset = data.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize;
        let limit = data.get("limit").and_then(Value::as_u64).unwrap_or(100) as usize;
        let page: Vec<Value> = matching
            .iter()
            .skip(offset)
            .take(limit)
            .map(|s| (*s).clone())
            .collect();
        Ok(json!({
            "spans": page,
            "total": matching.len(),
            "offset": offset,
            "limit": limit,
            "storage": {"complete": true},
        }))
    }

    /// `engine::traces::tree`: one trace as nested `{…span, children}`; a span whose parent is
    /// not stored (the caller's, outside the engine) is a root.
    pub(crate) fn tree(&self, data: &Value) -> Result<Value, ErrorBody> {
        let trace_id = data
            .get("trace_id")
            .and_then(Value::as_str)
            .ok_or_else(|| ErrorBody::new("deserialization_error", "missing field `trace_id`"))?
            .to_ascii_lowercase();
        let spans: Vec<&Value> = self
            .spans
            .iter()
            .filter(|s| s["trace_id"] == *trace_id.as_str())
            .collect();
        let present: std::collections::HashSet<&str> =
            spans.iter().filter_map(|s| s["span_id"].as_str()).collect();
        fn node(span: &Value, all: &[&Value], depth: usize) -> Value {
            let id = span["span_id"].as_str().unwrap_or("");
            let children: Vec<Value> = if depth > 64 {
                Vec::new()
            } else {
                all.iter()
                    .filter(|c| c["parent_span_id"].as_str() == Some(id))
                    .map(|c| node(c, all, depth + 1))
                    .collect()
            };
            let mut n = span.clone();
            n["children"] = json!(children);
            n
        }
        let roots: Vec<Value> = spans
            .iter()
            .filter(|s| {
                s["parent_span_id"]
                    .as_str()
                    .is_none_or(|p| !present.contains(p))
            })
            .map(|s| node(s, &spans, 0))
            .collect();
        Ok(json!({"roots": roots, "storage": {"complete": true}}))
    }

    /// `engine::logs::list`, filtered by `trace_id`, `span_id` and `severity_min`.
    pub(crate) fn list_logs(&self, data: &Value) -> Result<Value, ErrorBody> {
        let trace = data
            .get("trace_id")
            .and_then(Value::as_str)
            .map(str::to_ascii_lowercase);
        let span = data
            .get("span_id")
            .and_then(Value::as_str)
            .map(str::to_ascii_lowercase);
        let min = data.get("severity_min").and_then(Value::as_i64);
        let matching: Vec<&Value> = self
            .logs
            .iter()
            .filter(|l| trace.as_ref().is_none_or(|t| l["trace_id"] == *t.as_str()))
            .filter(|l| span.as_ref().is_none_or(|s| l["span_id"] == *s.as_str()))
            .filter(|l| min.is_none_or(|m| l["severity_number"].as_i64().unwrap_or(0) >= m))
            .collect();
        let offset = data.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize;
        let limit = data.get("limit").and_then(Value::as_u64).unwrap_or(100) as usize;
        let page: Vec<Value> = matching
            .iter()
            .skip(offset)
            .take(limit)
            .map(|l| (*l).clone())
            .collect();
        Ok(json!({"logs": page, "total": matching.len()}))
    }

    /// The `latest_metrics` of `engine::workers::info` for the connection `worker_id`: the
    /// newest point of each worker gauge carrying `worker.id` = it, from the last 2 minutes.
    pub(crate) fn latest_metrics(&self, worker_id: &str, now_ns: u64) -> Option<Value> {
        let since = now_ns.saturating_sub(120_000_000_000);
        let mut out = Map::new();
        let mut latest = 0u64;
        for (name, field) in [
            ("iii.worker.memory.rss", "memory_rss"),
            ("iii.worker.cpu.percent", "cpu_percent"),
            ("iii.worker.uptime_seconds", "uptime_seconds"),
            ("iii.worker.memory.heap_used", "memory_heap_used"),
        ] {
            let newest = self
                .points
                .iter()
                .filter(|(n, a, _, at)| {
                    n == name
                        && *at >= since
                        && a.get("worker.id").and_then(Value::as_str) == Some(worker_id)
                })
                .max_by_key(|(_, _, _, at)| *at);
            if let Some((_, _, v, at)) = newest {
                latest = latest.max(*at);
                out.insert(
                    field.into(),
                    if field == "cpu_percent" {
                        json!(v)
                    } else {
                        json!(*v as u64)
                    },
                );
            }
        }
        if out.is_empty() {
            return None;
        }
        out.insert("timestamp_ms".into(), json!(latest / 1_000_000));
        out.insert("runtime".into(), json!("rust"));
        Some(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_stored_in_the_engines_shape() {
        let mut t = Telemetry::default();
        let frame = br#"OTLP{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"shell"}}]},
            "scopeSpans":[{"scope":{"name":"iii-shell"},"spans":[{"traceId":"4BF92F3577B34DA6A3CE929D0E0E4736","spanId":"00f067aa0ba902b7",
            "parentSpanId":"","name":"x","kind":2,"startTimeUnixNano":"10","endTimeUnixNano":20,
            "attributes":[{"key":"n","value":{"intValue":"3"}},{"key":"b","value":{"boolValue":true}}],
            "status":{"code":2,"message":"S211"}}]}]}]}"#;
        assert!(t.ingest(frame));
        assert!(t.errors.is_empty(), "{:?}", t.errors);
        let s = &t.spans[0];
        assert_eq!(s["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(s["parent_span_id"], Value::Null);
        assert_eq!(s["status"], "error");
        assert_eq!(s["status_description"], "S211");
        assert_eq!(s["service_name"], "shell");
        assert_eq!(s["attributes"], json!([["n", "3"], ["b", "true"]]));
        assert_eq!(s["start_time_unix_nano"], 10);
    }

    #[test]
    fn bad_ids_are_errors_not_spans() {
        let mut t = Telemetry::default();
        assert!(t.ingest(br#"OTLP{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"AAAA","spanId":"00f067aa0ba902b7","name":"x","startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}"#));
        assert!(t.spans.is_empty());
        assert_eq!(t.errors.len(), 1, "{:?}", t.errors);
        assert!(!t.ingest(b"JSON{}"));
    }
}
