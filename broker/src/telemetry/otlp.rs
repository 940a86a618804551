//! The SDK's exporters for the engine: each batch becomes one OTLP/JSON frame in the outbox.
//!
//! The OTLP messages and their JSON form come from `opentelemetry-proto` (hex trace and span
//! ids, camelCase keys, 64-bit numbers as strings: what the engine's `/otel` ingestion
//! reads). Exporting never waits on the network: the frame is queued and the call returns.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::logs::tonic::group_logs_by_resource_and_scope;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::logs::{LogBatch, LogExporter};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use super::outbox::{Frame, Outbox, Signal};

fn queue<T: serde::Serialize>(
    outbox: &Outbox,
    signal: Signal,
    items: u64,
    msg: &T,
) -> OTelSdkResult {
    let json = serde_json::to_vec(msg)
        .map_err(|e| OTelSdkError::InternalFailure(format!("OTLP/JSON encoding: {e}")))?;
    outbox.push(Frame::new(signal, items, &json));
    Ok(())
}

/// The traces frame for `spans` (`OTLP` + an `ExportTraceServiceRequest`).
pub fn traces_json(spans: Vec<SpanData>, resource: &Resource) -> (u64, ExportTraceServiceRequest) {
    let n = spans.len() as u64;
    let res = ResourceAttributesWithSchema::from(resource);
    (
        n,
        ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(spans, &res),
        },
    )
}

#[derive(Debug)]
pub struct Spans {
    pub outbox: Arc<Outbox>,
    pub resource: Resource,
}

impl SpanExporter for Spans {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        if batch.is_empty() {
            return Ok(());
        }
        let (n, msg) = traces_json(batch, &self.resource);
        queue(&self.outbox, Signal::Traces, n, &msg)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource.clone();
    }
}

#[derive(Debug)]
pub struct Logs {
    pub outbox: Arc<Outbox>,
    pub resource: Resource,
}

impl LogExporter for Logs {
    async fn export(&self, batch: LogBatch<'_>) -> OTelSdkResult {
        let n = batch.iter().count() as u64;
        if n == 0 {
            return Ok(());
        }
        let res = ResourceAttributesWithSchema::from(&self.resource);
        let msg = ExportLogsServiceRequest {
            resource_logs: group_logs_by_resource_and_scope(batch, &res),
        };
        queue(&self.outbox, Signal::Logs, n, &msg)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource.clone();
    }
}

#[derive(Debug)]
pub struct Metrics {
    pub outbox: Arc<Outbox>,
}

impl PushMetricExporter for Metrics {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let msg = ExportMetricsServiceRequest::from(metrics);
        let points: u64 = msg
            .resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .map(|s| s.metrics.len() as u64)
            .sum();
        if points == 0 {
            return Ok(());
        }
        queue(&self.outbox, Signal::Metrics, points, &msg)
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: std::time::Duration) -> OTelSdkResult {
        Ok(())
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}
