//! The health of the agent's outputs: lines each output wrote and lost (by
//! reason), how long its current write has been blocked, and the OTLP
//! exports that failed or timed out. Labels are bounded: the outputs the
//! agent has, the three loss reasons, OTLP's two signals and three results.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::{Registry, Unit},
};

use crate::sink::queued::{OutputCounters, Reason};

/// The outputs that count their lines: the pause log, and the agent's own
/// log on standard error.
pub const OUTPUTS: [&str; 2] = ["pause_log", "log"];

/// OTLP's signals and the results of an export.
pub const OTLP_SIGNALS: [&str; 2] = ["metrics", "logs"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportResult {
    Ok,
    /// The receiver answered with an error, or the connection failed.
    Error,
    /// No answer within the export timeout.
    Timeout,
}

impl ExportResult {
    pub const ALL: [ExportResult; 3] =
        [ExportResult::Ok, ExportResult::Error, ExportResult::Timeout];

    pub fn label(self) -> &'static str {
        match self {
            ExportResult::Ok => "ok",
            ExportResult::Error => "error",
            ExportResult::Timeout => "timeout",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutputLabel {
    output: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DroppedLabels {
    output: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExportLabels {
    signal: &'static str,
    result: &'static str,
}

#[derive(Default)]
pub struct OutputMetrics {
    lines: Family<OutputLabel, Counter>,
    dropped: Family<DroppedLabels, Counter>,
    blocked: Family<OutputLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    exports: Family<ExportLabels, Counter>,
}

impl OutputMetrics {
    /// Register under the agent's prefix, every series from the start (a
    /// loss is a rate from its first increment).
    pub fn register(&self, r: &mut Registry) {
        for output in OUTPUTS {
            let _ = self.counters(output);
            self.blocked(output, None);
        }
        for signal in OTLP_SIGNALS {
            for result in ExportResult::ALL {
                let _ = self.export_counter(signal, result);
            }
        }
        r.register(
            "output_lines",
            "Lines an output wrote whole (pause_log: the slow-pause records on standard output or in the pause log file; log: the agent's own log on standard error)",
            self.lines.clone(),
        );
        r.register(
            "output_dropped",
            "Lines an output could not write, by reason: queue_full (its writer did not keep up: a stalled reader or slow disk), write_error (a closed pipe, a full disk), rate_limit (--pause-log-rate)",
            self.dropped.clone(),
        );
        r.register_with_unit(
            "output_blocked",
            "How long the write an output's writer is in has been blocked (0: none under way)",
            Unit::Seconds,
            self.blocked.clone(),
        );
        r.register(
            "otlp_exports",
            "OTLP exports by signal and result: ok, error (refused, or the connection failed), timeout (no answer in time)",
            self.exports.clone(),
        );
    }

    /// The counters of `output`, for its queue to count in.
    pub fn counters(&self, output: &'static str) -> OutputCounters {
        let dropped = Reason::ALL.map(|r| {
            self.dropped
                .get_or_create(&DroppedLabels {
                    output,
                    reason: r.label(),
                })
                .clone()
        });
        OutputCounters {
            written: self.lines.get_or_create(&OutputLabel { output }).clone(),
            dropped,
            any_loss: None,
        }
    }

    /// How long `output`'s current write has been blocked.
    pub fn blocked(&self, output: &'static str, for_: Option<std::time::Duration>) {
        self.blocked
            .get_or_create(&OutputLabel { output })
            .set(for_.map_or(0.0, |d| d.as_secs_f64()));
    }

    /// The counter of OTLP exports of `signal` ending in `result`.
    pub fn export_counter(&self, signal: &'static str, result: ExportResult) -> Counter {
        self.exports
            .get_or_create(&ExportLabels {
                signal,
                result: result.label(),
            })
            .clone()
    }
}
