//! W3C trace context in and out: the `traceparent` and `baggage` an `invokefunction` brings,
//! and the pair the worker sends on the engine calls it makes inside a call.
//!
//! Parsing and formatting are the SDK's propagators; this only adapts the two optional frame
//! fields to their carrier.

use opentelemetry::baggage::BaggageExt;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};

/// The two header-like fields of a frame.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Carrier {
    pub traceparent: Option<String>,
    pub baggage: Option<String>,
}

impl Extractor for Carrier {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent.as_deref(),
            "baggage" => self.baggage.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        let mut k = Vec::new();
        if self.traceparent.is_some() {
            k.push("traceparent");
        }
        if self.baggage.is_some() {
            k.push("baggage");
        }
        k
    }
}

impl Injector for Carrier {
    fn set(&mut self, key: &str, value: String) {
        match key {
            "traceparent" => self.traceparent = Some(value),
            "baggage" if !value.is_empty() => self.baggage = Some(value),
            _ => {}
        }
    }
}

/// The caller's context: its remote span as the parent (when `traceparent` is valid) and its
/// baggage. Malformed values are ignored, as the W3C rules say: the call starts a new trace.
pub fn extract(carrier: &Carrier) -> Context {
    let cx = TraceContextPropagator::new().extract(carrier);
    BaggagePropagator::new().extract_with_context(&cx, carrier)
}

/// `traceparent` (and `baggage`, when there is any) for a frame sent inside `cx`.
pub fn inject(cx: &Context) -> Carrier {
    let mut c = Carrier::default();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(cx, &mut c);
    }
    if !cx.baggage().is_empty() {
        BaggagePropagator::new().inject_context(cx, &mut c);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceId};

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_becomes_the_remote_parent() {
        let cx = extract(&Carrier {
            traceparent: Some(TP.into()),
            baggage: Some("tenant=acme".into()),
        });
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(
            sc.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(sc.span_id(), SpanId::from_hex("00f067aa0ba902b7").unwrap());
        assert_eq!(
            cx.baggage().get("tenant").map(|v| v.to_string()),
            Some("acme".to_string())
        );
        // And it goes out again as it came in.
        assert_eq!(
            inject(&cx),
            Carrier {
                traceparent: Some(TP.into()),
                baggage: Some("tenant=acme".into()),
            }
        );
    }

    #[test]
    fn no_or_a_malformed_traceparent_gives_no_parent() {
        for tp in [None, Some("garbage"), Some("00-0000-00-01"), Some("")] {
            let cx = extract(&Carrier {
                traceparent: tp.map(str::to_string),
                baggage: None,
            });
            assert!(!cx.span().span_context().is_valid(), "{tp:?}");
            assert_eq!(inject(&cx), Carrier::default(), "{tp:?}");
        }
    }
}
