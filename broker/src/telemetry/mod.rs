//! Telemetry to the engine: what the iii console shows of this worker.
//!
//! * Every invocation is a span in its caller's trace ([`call_span`]), with children for the
//!   broker's validation, the executor round trip and the executor's own steps
//!   ([`executor_spans`]).
//! * WARN and ERROR events (INFO when `telemetry.logs_level` says so) are OTLP logs with the
//!   trace and span of their call ([`log_layer`]).
//! * The worker's gauges and counters ([`metrics`], sampled by [`usage`]) carry `worker.id`,
//!   which is how `engine::workers::info` finds them.
//!
//! The data model, the trace context and the batching are the OpenTelemetry SDK's; the
//! [`otlp`] exporters turn each batch into one OTLP/JSON frame for the [`outbox`], and the
//! [`transport`] task sends them on the engine's `/otel` socket. A call never waits for any
//! of it. With `telemetry.enabled: false` no span is built, no log record made and no gauge
//! sampled.

pub mod call_span;
pub mod executor_spans;
pub mod identity;
pub mod log_layer;
pub mod metrics;
pub mod otlp;
pub mod outbox;
pub mod propagation;
pub mod transport;
pub mod usage;

pub use identity::{Identity, SCOPE};

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use iii_shell_protocol::config::{TelemetryConfig, TelemetryLogLevel};
use opentelemetry::logs::LoggerProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::logs::{BatchLogProcessor, SdkLogger, SdkLoggerProvider};
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use outbox::{Bounds, Outbox};

/// How often the SDK hands a batch of spans or log records to the exporter.
pub const BATCH_DELAY: Duration = Duration::from_millis(500);

pub struct Hub {
    enabled: AtomicBool,
    /// The least severe event shipped: 0 error, 1 warn, 2 info.
    log_level: AtomicU8,
    metrics_interval_ms: AtomicU64,
    pub(crate) tracer: SdkTracer,
    tracer_provider: SdkTracerProvider,
    pub(crate) logger: SdkLogger,
    logger_provider: SdkLoggerProvider,
    pub metrics: metrics::Meters,
    pub outbox: Arc<Outbox>,
    pub identity: Identity,
}

/// The process's hub. Process-global because its first reader is: the tracing subscriber
/// is installed once per process (in `main`, before the hub can exist: the hub needs the
/// engine URL and identity), and its [`log_layer::ShipLayer`] must find the hub from any
/// thread that logs. Set once ([`install_hub`]), never replaced; a test builds its own
/// [`Hub`] value instead of installing one. To remove it: a `ShipLayer` that owns a slot
/// filled by `install`, and the hub carried by `Services` to the call paths that read it.
static HUB: OnceLock<Hub> = OnceLock::new();

fn level_code(l: TelemetryLogLevel) -> u8 {
    match l {
        TelemetryLogLevel::Error => 0,
        TelemetryLogLevel::Warn => 1,
        TelemetryLogLevel::Info => 2,
    }
}

impl Hub {
    /// The SDK pipelines, exporting into `outbox`. Nothing is sent anywhere until something
    /// takes the outbox's frames (the [`transport`]).
    pub fn new(identity: Identity, outbox: Arc<Outbox>) -> Hub {
        let mut attrs = vec![
            KeyValue::new("service.name", identity.worker_name.clone()),
            KeyValue::new("service.version", iii_shell_protocol::VERSION),
            KeyValue::new("worker.name", identity.worker_name.clone()),
        ];
        if let Some(ns) = &identity.namespace {
            attrs.push(KeyValue::new("service.namespace", ns.clone()));
        }
        let resource = Resource::builder_empty().with_attributes(attrs).build();

        let spans = BatchSpanProcessor::builder(otlp::Spans {
            outbox: outbox.clone(),
            resource: resource.clone(),
        })
        .with_batch_config(
            opentelemetry_sdk::trace::BatchConfigBuilder::default()
                .with_scheduled_delay(BATCH_DELAY)
                // The SDK's channel holds every slot from the start: keep it small (a batch
                // goes out as soon as 128 spans are waiting, so 512 is four batches' worth).
                .with_max_queue_size(512)
                .with_max_export_batch_size(128)
                .build(),
        )
        .build();
        let tracer_provider = SdkTracerProvider::builder()
            .with_span_processor(spans)
            .with_resource(resource.clone())
            .build();
        let tracer = tracer_provider.tracer(SCOPE);

        let logs = BatchLogProcessor::builder(otlp::Logs {
            outbox: outbox.clone(),
            resource: resource.clone(),
        })
        .with_batch_config(
            opentelemetry_sdk::logs::BatchConfigBuilder::default()
                .with_scheduled_delay(BATCH_DELAY)
                .with_max_queue_size(256)
                .with_max_export_batch_size(128)
                .build(),
        )
        .build();
        let logger_provider = SdkLoggerProvider::builder()
            .with_log_processor(logs)
            .with_resource(resource.clone())
            .build();
        let logger = logger_provider.logger(SCOPE);

        let metrics = metrics::Meters::new(outbox.clone(), resource, &identity);
        let d = TelemetryConfig::default();
        Hub {
            enabled: AtomicBool::new(d.enabled),
            log_level: AtomicU8::new(level_code(d.logs_level)),
            metrics_interval_ms: AtomicU64::new(d.metrics_interval_ms),
            tracer,
            tracer_provider,
            logger,
            logger_provider,
            metrics,
            outbox,
            identity,
        }
    }

    /// Applies the `telemetry` section of a configuration that was just installed.
    pub fn apply(&self, c: &TelemetryConfig) {
        self.enabled.store(c.enabled, Ordering::Relaxed);
        self.log_level
            .store(level_code(c.logs_level), Ordering::Relaxed);
        self.metrics_interval_ms
            .store(c.metrics_interval_ms, Ordering::Relaxed);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Whether an event of `level` is shipped.
    pub fn ships(&self, level: &tracing::Level) -> bool {
        let want = self.log_level.load(Ordering::Relaxed);
        let code = match *level {
            tracing::Level::ERROR => 0,
            tracing::Level::WARN => 1,
            tracing::Level::INFO => 2,
            _ => return false,
        };
        self.enabled() && code <= want
    }

    pub fn metrics_interval(&self) -> Duration {
        Duration::from_millis(self.metrics_interval_ms.load(Ordering::Relaxed))
    }

    /// Hands every span and log record still batched to the exporters (shutdown, tests).
    pub fn flush(&self) {
        let _ = self.tracer_provider.force_flush();
        let _ = self.logger_provider.force_flush();
    }
}

/// Installs the process's hub (once) and starts its socket to the engine at `engine_url`.
/// Needs a tokio runtime.
pub fn install(engine_url: &str, identity: Identity) -> &'static Hub {
    let hub = install_hub(Hub::new(identity, Arc::new(Outbox::new(Bounds::DEFAULT))));
    tokio::spawn(transport::run(
        transport::otel_url(engine_url),
        hub.outbox.clone(),
    ));
    hub
}

/// Makes `hub` the process's hub (the first one installed stays), with no transport: whoever
/// installs it takes the outbox's frames (the benches).
pub fn install_hub(hub: Hub) -> &'static Hub {
    let mut hub = Some(hub);
    let installed = HUB.get_or_init(|| hub.take().expect("a hub"));
    installed
}

/// The installed hub, when telemetry is on.
pub fn active() -> Option<&'static Hub> {
    HUB.get().filter(|h| h.enabled())
}

/// The installed hub, on or off.
pub fn installed() -> Option<&'static Hub> {
    HUB.get()
}

/// Applies a newly installed configuration to the hub, if there is one.
pub fn apply(c: &TelemetryConfig) {
    if let Some(h) = HUB.get() {
        h.apply(c);
    }
}

/// The current wall-clock time in ns since the epoch.
pub fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_levels_ship_what_the_configuration_says() {
        let hub = Hub::new(
            Identity {
                worker_name: "t".into(),
                namespace: None,
            },
            Arc::new(Outbox::new(Bounds::DEFAULT)),
        );
        let ship = |h: &Hub| {
            [
                tracing::Level::ERROR,
                tracing::Level::WARN,
                tracing::Level::INFO,
                tracing::Level::DEBUG,
            ]
            .map(|l| h.ships(&l))
        };
        assert_eq!(ship(&hub), [true, true, false, false]);
        let mut c = TelemetryConfig {
            logs_level: TelemetryLogLevel::Info,
            ..Default::default()
        };
        hub.apply(&c);
        assert_eq!(ship(&hub), [true, true, true, false]);
        c.logs_level = TelemetryLogLevel::Error;
        hub.apply(&c);
        assert_eq!(ship(&hub), [true, false, false, false]);
        c.enabled = false;
        hub.apply(&c);
        assert_eq!(ship(&hub), [false, false, false, false]);
    }
}
