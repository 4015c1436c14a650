//! The agent's metrics and slow-pause records over OTLP (`gostw agent
//! --otlp-endpoint`), by OpenTelemetry's own Rust SDK and exporter (gRPC by
//! tonic, or HTTP/protobuf), beside Prometheus.
//!
//! - Metrics: `gostw.pause.duration` (seconds, a base-2 exponential
//!   histogram per reason), and sums: `gostw.stop_the_world.entries`,
//!   `gostw.pause.major_faults`, `gostw.cpu.samples`,
//!   `gostw.stack_growth.samples`, `gostw.slow_pauses`. Cumulative, like
//!   Prometheus' counters.
//! - Logs: one record per slow pause, its body the line `/debug/pauses`
//!   serves for it (the same `id`), its event name `gostw.slow_pause`.
//!
//! Each export is cut at a timeout and counted by result (`counted`).
//!
//! The resource is the agent's host (`service.*`, `host.*`, and whatever
//! `OTEL_RESOURCE_ATTRIBUTES` adds); one agent reports many processes, so
//! each point and record carries its process's attributes in the semantic
//! conventions' names (`process.*`, `k8s.*`) plus `gostw.*` for the rest.

mod counted;

use std::{
    collections::HashMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use opentelemetry::{
    KeyValue,
    logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity},
    metrics::{Counter, Histogram, MeterProvider as _},
};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response, hyper::HyperClient};
use opentelemetry_otlp::{LogExporter, MetricExporter, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::{
    Resource,
    logs::{SdkLogger, SdkLoggerProvider},
    metrics::{Aggregation, Instrument, PeriodicReader, SdkMeterProvider, Stream},
};

use self::counted::{Counted, ExportCounters};
use crate::{
    model::{
        labels::ProcessLabels,
        observed::{Observed, Sink},
    },
    sink::{metrics::outputs::OutputMetrics, slow_pauses::SlowPause},
};

/// How the agent reaches its OTLP receiver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpOptions {
    /// The receiver's URL (gRPC: `http://host:4317`; HTTP: the base,
    /// `/v1/metrics` and `/v1/logs` are added); None: the
    /// `OTEL_EXPORTER_OTLP_*` environment variables say.
    pub endpoint: Option<String>,
    pub protocol: Protocol,
    /// Metrics are sent this often (logs as the SDK's batch processor
    /// sends them).
    pub interval: Duration,
    /// Slow pauses become log records.
    pub slow: crate::model::pause::SlowThreshold,
    /// The resource's `host.name`.
    pub host_name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    /// The name `OTEL_EXPORTER_OTLP_PROTOCOL` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Protocol, String> {
        match [Protocol::Grpc, Protocol::HttpProtobuf]
            .into_iter()
            .find(|p| p.name() == s)
        {
            Some(p) => Ok(p),
            None => Err(format!(
                "{s}: grpc or http/protobuf (http/json is not supported)"
            )),
        }
    }
}

struct Instruments {
    pause_duration: Histogram<f64>,
    entries: Counter<u64>,
    pause_faults: Counter<u64>,
    cpu_samples: Counter<u64>,
    growth_samples: Counter<u64>,
    slow_pauses: Counter<u64>,
}

/// The OTLP sink: instruments fed from the stream, records logged.
pub struct OtlpSink {
    meters: SdkMeterProvider,
    logs: SdkLoggerProvider,
    logger: SdkLogger,
    instruments: Instruments,
    attributes: HashMap<u32, (ProcessLabels, Vec<KeyValue>)>,
    slow: crate::model::pause::SlowThreshold,
    /// The exporters' tonic and hyper clients live on it.
    _runtime: tokio::runtime::Runtime,
}

/// The HTTP exporters' client: hyper's, its requests run on the OTLP
/// runtime. The SDK's reader and log processor threads wait on the export
/// futures outside any tokio runtime, where hyper's client cannot run.
#[derive(Debug)]
struct OnRuntime {
    client: HyperClient,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await?
    }
}

/// Longest an HTTP export may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest any export may take: `OTEL_EXPORTER_OTLP_TIMEOUT`
/// (milliseconds), which the SDK's exporters read too, else 10 s. A
/// receiver that never answers then costs timed-out exports, counted.
fn export_timeout(env: Option<&str>) -> Duration {
    env.and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(HTTP_TIMEOUT, Duration::from_millis)
}

/// A process's attributes on every point and record.
fn process_attributes(l: &ProcessLabels) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::new("process.executable.name", l.executable.clone()),
        KeyValue::new("process.runtime.name", "go"),
        KeyValue::new("process.runtime.version", l.go_version.clone()),
        KeyValue::new("gostw.build_id", l.build_id.clone()),
        KeyValue::new("gostw.container", l.container.clone()),
    ];
    if !l.pod.is_empty() {
        a.push(KeyValue::new("k8s.namespace.name", l.namespace.clone()));
        a.push(KeyValue::new("k8s.pod.name", l.pod.clone()));
        a.push(KeyValue::new("k8s.container.name", l.container.clone()));
    }
    a
}

/// The agent's resource: the host it runs on.
fn resource(host: &str) -> Resource {
    Resource::builder()
        .with_service_name("gostw-agent")
        .with_attributes([
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("host.name", host.to_owned()),
            KeyValue::new("host.arch", "amd64"),
            KeyValue::new("os.type", "linux"),
        ])
        .build()
}

impl OtlpSink {
    /// Start the exporters; their exports are counted in `outputs`.
    pub fn start(o: &OtlpOptions, outputs: &OutputMetrics) -> anyhow::Result<OtlpSink> {
        // The SDK's reader and log processor run threads of their own; the
        // exporters' clients need a tokio runtime that keeps running.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gostw-otlp")
            .enable_all()
            .build()
            .context("starting the OTLP runtime")?;
        let _in = runtime.enter();
        let http = || OnRuntime {
            client: HyperClient::with_default_connector(HTTP_TIMEOUT, None),
            runtime: runtime.handle().clone(),
        };
        let url = |path: &str| {
            o.endpoint.as_ref().map(|e| match o.protocol {
                Protocol::Grpc => e.clone(),
                Protocol::HttpProtobuf => format!("{}{path}", e.trim_end_matches('/')),
            })
        };
        // The same four ways for both signals' builders (distinct types).
        macro_rules! exporter {
            ($builder:expr, $path:literal) => {
                match o.protocol {
                    Protocol::Grpc => {
                        let b = $builder.with_tonic();
                        match url("") {
                            Some(u) => b.with_endpoint(u).build(),
                            None => b.build(),
                        }
                    }
                    Protocol::HttpProtobuf => {
                        let b = $builder
                            .with_http()
                            .with_http_client(http())
                            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
                        match url($path) {
                            Some(u) => b.with_endpoint(u).build(),
                            None => b.build(),
                        }
                    }
                }
            };
        }
        let timeout = export_timeout(std::env::var("OTEL_EXPORTER_OTLP_TIMEOUT").ok().as_deref());
        let metrics = Counted::new(
            exporter!(MetricExporter::builder(), "/v1/metrics")
                .context("the OTLP metric exporter")?,
            timeout,
            runtime.handle().clone(),
            ExportCounters::of(outputs, "metrics"),
        );
        let logs = Counted::new(
            exporter!(LogExporter::builder(), "/v1/logs").context("the OTLP log exporter")?,
            timeout,
            runtime.handle().clone(),
            ExportCounters::of(outputs, "logs"),
        );
        let resource = resource(&o.host_name);
        let meters = SdkMeterProvider::builder()
            .with_resource(resource.clone())
            .with_reader(
                PeriodicReader::builder(metrics)
                    .with_interval(o.interval)
                    .build(),
            )
            .with_view(|i: &Instrument| {
                (i.name() == "gostw.pause.duration")
                    .then(|| {
                        Stream::builder()
                            .with_aggregation(Aggregation::Base2ExponentialHistogram {
                                max_size: 160,
                                max_scale: 20,
                                record_min_max: true,
                            })
                            .build()
                            .ok()
                    })
                    .flatten()
            })
            .build();
        let logs = SdkLoggerProvider::builder()
            .with_resource(resource)
            .with_batch_exporter(logs)
            .build();
        let meter = meters.meter("gostw");
        let instruments = Instruments {
            pause_duration: meter
                .f64_histogram("gostw.pause.duration")
                .with_unit("s")
                .with_description(
                    "stop-the-world pauses (Go's own duration where the version allows)",
                )
                .build(),
            entries: meter
                .u64_counter("gostw.stop_the_world.entries")
                .with_description("stopTheWorldWithSema entries counted in the kernel")
                .build(),
            pause_faults: meter
                .u64_counter("gostw.pause.major_faults")
                .with_description("major page faults that began inside pauses")
                .build(),
            cpu_samples: meter
                .u64_counter("gostw.cpu.samples")
                .with_description(format!(
                    "CPU-clock samples ({} Hz per CPU) that landed in the process",
                    crate::kernel::stacks::SAMPLE_HZ
                ))
                .build(),
            growth_samples: meter
                .u64_counter("gostw.stack_growth.samples")
                .with_description("of those, samples that caught a goroutine stack being copied")
                .build(),
            slow_pauses: meter
                .u64_counter("gostw.slow_pauses")
                .with_description("pauses recorded as slow (sent as log records)")
                .build(),
        };
        let logger = logs.logger("gostw");
        drop(_in);
        Ok(OtlpSink {
            meters,
            logs,
            logger,
            instruments,
            attributes: HashMap::new(),
            slow: o.slow,
            _runtime: runtime,
        })
    }

    /// Send what is left, then stop the exporters.
    pub fn shutdown(self) {
        if let Err(e) = self.meters.shutdown() {
            log::warn!("OTLP metrics at shutdown: {e}");
        }
        if let Err(e) = self.logs.shutdown() {
            log::warn!("OTLP logs at shutdown: {e}");
        }
    }

    fn slow_pause(&self, attrs: &[KeyValue], p: &SlowPause) {
        let mut r = self.logger.create_log_record();
        r.set_event_name("gostw.slow_pause");
        r.set_timestamp(UNIX_EPOCH + Duration::from_nanos(p.record.start_unix_ns));
        r.set_observed_timestamp(SystemTime::now());
        r.set_severity_number(Severity::Info);
        r.set_severity_text("INFO");
        r.set_body(AnyValue::String(
            serde_json::to_string(p).unwrap_or_default().into(),
        ));
        r.add_attribute("gostw.pause.id", p.id.clone());
        r.add_attribute("gostw.pause.reason", p.record.reason);
        r.add_attribute(
            "gostw.pause.duration_ns",
            i64::try_from(p.record.duration_ns).unwrap_or(i64::MAX),
        );
        r.add_attribute("process.pid", i64::from(p.record.pid));
        r.add_attributes(
            attrs
                .iter()
                .map(|kv| (kv.key.clone(), AnyValue::from(kv.value.to_string()))),
        );
        self.logger.emit(r);
    }
}

impl Sink for OtlpSink {
    fn observe(&mut self, o: &Observed) {
        let i = &self.instruments;
        match o {
            Observed::Started(info) => {
                let attrs = process_attributes(&info.labels);
                self.attributes
                    .insert(info.pid, (info.labels.clone(), attrs));
            }
            Observed::Exited { pid, .. } => {
                self.attributes.remove(pid);
            }
            Observed::Pause(p) => {
                let Some((labels, attrs)) = self.attributes.get(&p.record.pid) else {
                    return;
                };
                let mut with_reason = attrs.clone();
                with_reason.push(KeyValue::new("gostw.pause.reason", p.record.reason));
                i.pause_duration
                    .record(p.record.duration_ns as f64 / 1e9, &with_reason);
                if !p.faults.is_empty() {
                    i.pause_faults.add(p.faults.len() as u64, attrs);
                }
                if self.slow.is_slow(p.record.duration_ns) {
                    i.slow_pauses.add(1, attrs);
                    self.slow_pause(attrs, &SlowPause::new(labels, p.record.clone()));
                }
            }
            Observed::Counts {
                pid,
                stop_the_world_entries,
                samples,
                ..
            } => {
                let Some((_, attrs)) = self.attributes.get(pid) else {
                    return;
                };
                i.entries.add(*stop_the_world_entries, attrs);
                i.cpu_samples.add(samples.all, attrs);
                i.growth_samples.add(samples.stack_growth, attrs);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(a: &[KeyValue]) -> Vec<(String, String)> {
        a.iter()
            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
            .collect()
    }

    #[test]
    fn the_export_timeout_is_the_sdks_variable_or_ten_seconds() {
        assert_eq!(export_timeout(Some("1500")), Duration::from_millis(1500));
        for unset in [None, Some("0"), Some("soon")] {
            assert_eq!(export_timeout(unset), HTTP_TIMEOUT);
        }
    }

    #[test]
    fn kubernetes_names_become_k8s_attributes_and_others_do_not() {
        let mut l = ProcessLabels {
            executable: "api".into(),
            go_version: "go1.27.3".into(),
            build_id: "Zd9-3Thfd6hC".into(),
            container: "0123456789ab".into(),
            ..Default::default()
        };
        let plain = keys(&process_attributes(&l));
        assert!(
            plain.iter().all(|(k, _)| !k.starts_with("k8s.")),
            "{plain:?}"
        );
        assert!(plain.contains(&("gostw.container".into(), "0123456789ab".into())));
        l.container = "app".into();
        l.namespace = "shop".into();
        l.pod = "web-0".into();
        let k8s = keys(&process_attributes(&l));
        for kv in [
            ("k8s.namespace.name", "shop"),
            ("k8s.pod.name", "web-0"),
            ("k8s.container.name", "app"),
            ("process.executable.name", "api"),
            ("process.runtime.version", "go1.27.3"),
        ] {
            assert!(
                k8s.contains(&(kv.0.into(), kv.1.into())),
                "{kv:?} in {k8s:?}"
            );
        }
    }

    #[test]
    fn protocols_are_the_otel_names() {
        assert_eq!("grpc".parse(), Ok(Protocol::Grpc));
        assert_eq!("http/protobuf".parse(), Ok(Protocol::HttpProtobuf));
        assert!("http/json".parse::<Protocol>().is_err());
    }
}
