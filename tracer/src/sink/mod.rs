//! The front ends' ends of the one stream: every output gostw makes is a
//! `Sink` of `model::observed::Observed`.
//!
//! - `report`: live lines and the summary, as text or JSON (attach, run,
//!   faults, stacks).
//! - `metrics`: the agent's Prometheus metrics; `otlp`: the same and the
//!   slow pauses, pushed to an OpenTelemetry collector.
//! - `profile`: pprof profiles of faults and stack growth (`--pprof`, the
//!   agent's `/debug/pprof/*`).
//! - `timeline`: the trace-event timeline (`--timeline`).
//! - `slow_pauses`: the agent's record of every slow pause
//!   (`/debug/pauses`), and `pause_log` the JSON lines it writes of them.
//! - `queued`: the bounded writer that keeps a stalled reader or a full
//!   disk from blocking the event loop (the pause log, live lines on
//!   standard output).

pub mod file;
pub mod metrics;
pub mod otlp;
pub mod pause_log;
pub mod profile;
pub mod queued;
pub mod report;
pub mod slow_pauses;
pub mod timeline;

/// Defined beside the stream it consumes, so the engine, below the sinks,
/// can feed one.
pub use crate::model::observed::Sink;

#[cfg(test)]
mod recorded_tests;

#[cfg(test)]
pub mod tests_support {
    use std::{
        io::{self, Write},
        sync::{Arc, Mutex},
    };

    /// A `Write` whose bytes a test reads afterwards (a sink's output).
    #[derive(Clone, Default)]
    pub struct Captured(pub Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        pub fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// `stream` through the report and the metrics at once: the report's
    /// summary, and the metrics' exposition (with their registry).
    pub fn summary_and_metrics(
        stream: &[crate::model::observed::Observed],
    ) -> (super::report::Summary, String, Arc<super::metrics::Metrics>) {
        use super::{
            Sink as _,
            metrics::{Metrics, MetricsSink},
            report::{Output, ReportSink, View},
        };
        let report = ReportSink::new(
            View::Trace,
            Output::new(
                Box::new(io::sink()),
                true,
                crate::model::pause::SlowThreshold::NONE,
            ),
            true,
            None,
        );
        let metrics = Arc::new(Metrics::new());
        let mut both = (report, MetricsSink::new(metrics.clone()));
        both.observe_all(stream);
        let summary = both.0.summary(0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, metrics.registry()).unwrap();
        (summary, text, metrics)
    }

    /// The value of the first series line of `text` that starts with
    /// `series` (name and labels).
    pub fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }
}
