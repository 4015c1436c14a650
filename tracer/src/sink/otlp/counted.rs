//! The OTLP exporters, wrapped so each export is cut at a timeout and
//! counted by result: a receiver that accepts connections and never
//! answers shows as timeouts in `gostw_agent_otlp_exports_total`, one that
//! refuses as errors, instead of nothing. The SDK logs a failed export
//! once and retries nothing; the counters are what an alert can use.

use std::{future::Future, time::Duration};

use opentelemetry_sdk::{
    Resource,
    error::{OTelSdkError, OTelSdkResult},
    logs::{LogBatch, LogExporter},
    metrics::{Temporality, data::ResourceMetrics, exporter::PushMetricExporter},
};
use prometheus_client::metrics::counter::Counter;

use crate::sink::metrics::outputs::{ExportResult, OutputMetrics};

/// The counters of one signal's exports, by `ExportResult::ALL`.
#[derive(Clone, Debug)]
pub struct ExportCounters([Counter; 3]);

impl ExportCounters {
    pub fn of(metrics: &OutputMetrics, signal: &'static str) -> ExportCounters {
        ExportCounters(ExportResult::ALL.map(|r| metrics.export_counter(signal, r)))
    }

    fn count(&self, r: ExportResult) {
        let i = ExportResult::ALL.iter().position(|&x| x == r).unwrap_or(0);
        self.0[i].inc();
    }
}

/// An exporter whose exports are timed out and counted.
#[derive(Debug)]
pub struct Counted<E> {
    inner: E,
    timeout: Duration,
    /// The OTLP runtime: its timer cuts the exports, which the SDK's
    /// threads poll outside any runtime.
    runtime: tokio::runtime::Handle,
    counters: ExportCounters,
}

impl<E> Counted<E> {
    pub fn new(
        inner: E,
        timeout: Duration,
        runtime: tokio::runtime::Handle,
        counters: ExportCounters,
    ) -> Counted<E> {
        Counted {
            inner,
            timeout,
            runtime,
            counters,
        }
    }

    async fn counted(&self, export: impl Future<Output = OTelSdkResult>) -> OTelSdkResult {
        let timer = {
            let _in = self.runtime.enter();
            tokio::time::sleep(self.timeout)
        };
        let result = tokio::select! {
            r = export => r,
            () = timer => Err(OTelSdkError::Timeout(self.timeout)),
        };
        self.counters.count(match &result {
            Ok(()) => ExportResult::Ok,
            Err(OTelSdkError::Timeout(_)) => ExportResult::Timeout,
            Err(_) => ExportResult::Error,
        });
        result
    }
}

impl<E: PushMetricExporter> PushMetricExporter for Counted<E> {
    fn export(&self, metrics: &ResourceMetrics) -> impl Future<Output = OTelSdkResult> + Send {
        self.counted(self.inner.export(metrics))
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

impl<E: LogExporter> LogExporter for Counted<E> {
    fn export(&self, batch: LogBatch<'_>) -> impl Future<Output = OTelSdkResult> + Send {
        self.counted(self.inner.export(batch))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exporter whose export never ends, or fails at once.
    #[derive(Debug)]
    struct Hung(bool);

    impl LogExporter for Hung {
        async fn export(&self, _: LogBatch<'_>) -> OTelSdkResult {
            if self.0 {
                std::future::pending().await
            } else {
                Err(OTelSdkError::InternalFailure("refused".into()))
            }
        }
    }

    /// Poll `f` to its end on this thread, outside any runtime, as the
    /// SDK's reader and log processor threads do.
    fn block_on<F: Future>(f: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: std::sync::Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = std::sync::Arc::new(Unpark(std::thread::current())).into();
        let mut cx = std::task::Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }

    #[test]
    fn a_hung_export_times_out_and_a_refused_one_is_an_error_both_counted() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let metrics = OutputMetrics::default();
        let counters = ExportCounters::of(&metrics, "logs");
        let hung = Counted::new(
            Hung(true),
            Duration::from_millis(50),
            rt.handle().clone(),
            counters.clone(),
        );
        let started = std::time::Instant::now();
        let r = block_on(hung.export(LogBatch::new(&[])));
        assert!(matches!(r, Err(OTelSdkError::Timeout(_))), "{r:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        let refused = Counted::new(
            Hung(false),
            Duration::from_secs(5),
            rt.handle().clone(),
            counters,
        );
        let r = block_on(refused.export(LogBatch::new(&[])));
        assert!(matches!(r, Err(OTelSdkError::InternalFailure(_))), "{r:?}");
        let got = |r| metrics.export_counter("logs", r).get();
        assert_eq!(
            (
                got(ExportResult::Ok),
                got(ExportResult::Error),
                got(ExportResult::Timeout)
            ),
            (0, 1, 1)
        );
    }
}
