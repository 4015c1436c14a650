//! The series of a pause's explanation (docs/guide/why-slow.md),
//! with bounded labels only: the process's labels, the pause's reason, and
//! a part of the breakdown or a laggard state (fixed lists). Threads,
//! functions and callers are not labels: they are in the pause records.
//! The agent explains pauses when it reads the stopping phase
//! (not with `--no-explain`): the breakdown needs Go's `finishedStopping`.

use std::{collections::BTreeSet, sync::atomic::AtomicU64};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::{Registry, Unit},
};

use super::{Histograms, Metrics, seconds_histogram};
use crate::{
    model::labels::ProcessLabels,
    model::{breakdown::PARTS, pause::PauseRecord},
};

/// The `state` label values, as `LaggardStateName` serializes them.
pub const LAGGARD_STATES: [&str; 4] = ["on_cpu", "fault", "runnable", "blocked"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    #[prometheus(flatten)]
    process: ProcessLabels,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartLabels {
    #[prometheus(flatten)]
    process: ProcessLabels,
    reason: &'static str,
    part: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    #[prometheus(flatten)]
    process: ProcessLabels,
    reason: &'static str,
    state: &'static str,
}

type Seconds = Counter<f64, AtomicU64>;

/// The explanation's families.
pub struct ExplainMetrics {
    stopping: Histograms<ReasonLabels>,
    breakdown: Family<PartLabels, Seconds>,
    laggard: Family<StateLabels, Seconds>,
}

impl ExplainMetrics {
    /// Empty families (registered by `register`).
    pub fn new() -> ExplainMetrics {
        ExplainMetrics {
            stopping: Histograms::new_with_constructor(seconds_histogram),
            breakdown: Family::default(),
            laggard: Family::default(),
        }
    }

    /// Register the families under the agent's prefix.
    pub fn register(&self, r: &mut Registry) {
        r.register_with_unit(
            "pause_stopping",
            "Stopping phase of each pause (Go's finishedStopping - startedStopping, Go 1.22+, not with --no-explain): the world being asked to stop",
            Unit::Seconds,
            self.stopping.clone(),
        );
        r.register_with_unit(
            "pause_breakdown",
            "Pause time by part of its breakdown (the parts of a pause add up to its duration; unexplained is the rest), pauses with a breakdown only",
            Unit::Seconds,
            self.breakdown.clone(),
        );
        r.register_with_unit(
            "pause_laggard",
            "Time the threads that kept the world from stopping spent until they stopped, by what they were doing (the laggards of each pause record summed: they run at once)",
            Unit::Seconds,
            self.laggard.clone(),
        );
    }

    /// One pause's explanation (nothing for the parts it does not have).
    pub fn pause(&self, process: &ProcessLabels, rec: &PauseRecord) {
        let reason = rec.reason;
        if let Some(ns) = rec.stopping_ns {
            self.stopping
                .get_or_create(&ReasonLabels {
                    process: process.clone(),
                    reason,
                })
                .observe(ns as f64 / 1e9);
        }
        if let Some(b) = &rec.breakdown {
            for (part, ns) in b.parts() {
                self.breakdown
                    .get_or_create(&PartLabels {
                        process: process.clone(),
                        reason,
                        part,
                    })
                    .inc_by(ns as f64 / 1e9);
            }
        }
        for l in rec.laggards.iter().flatten() {
            let by_state = [l.on_cpu_ns, l.fault_ns, l.runnable_ns, l.blocked_ns];
            for (state, ns) in LAGGARD_STATES.into_iter().zip(by_state) {
                self.laggard
                    .get_or_create(&StateLabels {
                        process: process.clone(),
                        reason,
                        state,
                    })
                    .inc_by(ns as f64 / 1e9);
            }
        }
    }

    /// Drop the series of `process` for each of its `reasons`.
    pub fn remove(&self, process: &ProcessLabels, reasons: &BTreeSet<&'static str>) {
        for &reason in reasons {
            self.stopping.remove(&ReasonLabels {
                process: process.clone(),
                reason,
            });
            for part in PARTS {
                self.breakdown.remove(&PartLabels {
                    process: process.clone(),
                    reason,
                    part,
                });
            }
            for state in LAGGARD_STATES {
                self.laggard.remove(&StateLabels {
                    process: process.clone(),
                    reason,
                    state,
                });
            }
        }
    }
}

impl Default for ExplainMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The explanation of a pause of a process with `labels` (after
    /// `pause`, which records its reason for removal).
    pub fn pause_explained(&self, labels: &ProcessLabels, rec: &PauseRecord) {
        self.explain.pause(labels, rec);
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;
    use tracer_common::{
        event::{EventHeader, EventKind},
        explain::{Laggard, LaggardState, PauseDetail},
        pause::{GoStopping, PauseEvent, REASON_TEXT_LEN},
    };

    use crate::{
        agent::server::openmetrics_to_text,
        clock::WallClock,
        engine::{
            correlate::GRACE_NS,
            stream::{Stream, StreamOptions, tests::bytes},
        },
        model::observed::{Observed, tests_support::api_process},
        sink::tests_support::{summary_and_metrics, value},
    };

    const MS: u64 = 1_000_000;
    const PID: u32 = 7;

    /// A GC (reason 2) of `PID` at `start` for `dur`, `stopping` of it
    /// stopping, with the stopping probe's figures.
    fn pause(start: u64, dur: u64, stopping: u64) -> Vec<u8> {
        bytes(&PauseEvent {
            header: EventHeader {
                kind: EventKind::Pause as u32,
                tgid: PID,
                tid: PID,
                cpu: 0,
                ts_ns: start + dur + 10,
            },
            stop_ts_ns: start - 10,
            go_now_ns: start + dur,
            go_started_ns: start,
            stop_tid: PID,
            reason: 2,
            flags: PauseEvent::FLAG_GO_START | PauseEvent::FLAG_STOPPING,
            reason_text_len: 0,
            reason_text: [0; REASON_TEXT_LEN],
            stopping: GoStopping {
                started_ns: start,
                finished_ns: start + stopping,
                stopping_ns: 0,
            },
        })
    }

    /// Its detail: one laggard (tid `PID + 1`) running until `lag_until`,
    /// the stopping thread blocked `stopped_blocked` once the world stopped.
    fn detail(start: u64, lag_until: u64, stopped_blocked: u64) -> Vec<u8> {
        let mut d = PauseDetail::ZERO;
        d.header = EventHeader {
            kind: EventKind::PauseDetail as u32,
            tgid: PID,
            tid: PID,
            cpu: 0,
            ts_ns: start + 1,
        };
        d.stop_ts_ns = start - 10;
        d.stop_tid = PID;
        d.config = PauseDetail::SCHED | PauseDetail::STOPPED_PROBE;
        d.stopper.by_phase[1].blocked_ns = stopped_blocked;
        d.nlaggards = 1;
        d.laggards[0] = Laggard {
            tid: PID + 1,
            flags: Laggard::CANDIDATE,
            last_out_ns: lag_until,
            out_state: LaggardState::Runnable as u32,
            user_stack_id: -1,
            held_stack_id: -1,
            ..Laggard::default()
        };
        bytes(&d)
    }

    /// A recorded stream of two explained GCs: the series carry the same
    /// breakdown as the report's summary, part by part, pass promtool, and
    /// go with their process.
    #[test]
    fn a_recorded_stream_gives_the_breakdown_the_summary_has() {
        let info = api_process(PID, "b1");
        let labels = info.labels.clone();
        let mut stream = Stream::new(
            WallClock::default(),
            StreamOptions {
                faults: true,
                stacks: false,
            },
        );
        let mut out = vec![Observed::Started(info)];
        // 10 ms, 8 ms of it stopping, the laggard running 7 ms; then 20 ms,
        // 2 ms stopping (laggard 1.5 ms), the stopping thread blocked 5 ms.
        for r in [
            detail(1_000 * MS, 1_007 * MS, MS),
            pause(1_000 * MS, 10 * MS, 8 * MS),
            detail(1_100 * MS, 1_101_500_000, 5 * MS),
            pause(1_100 * MS, 20 * MS, 2 * MS),
        ] {
            stream.feed(&r, &mut out);
        }
        stream.settle(1_200 * MS + GRACE_NS, &mut out);

        let (s, text, metrics) = summary_and_metrics(&out);
        let l = r#"executable="api",go_version="go1.26.6",build_id="b1",container="",namespace="",pod="",reason="gc_sweep_termination""#;

        let by_reason = &s.processes[0].by_reason[0];
        assert_eq!(by_reason.reason, "gc_sweep_termination");
        let summed = by_reason.breakdown.as_ref().expect("explained pauses");
        assert_eq!(summed.pauses, 2);
        let mut total = 0.0;
        for (part, ns) in summed.total.parts() {
            let v = value(
                &text,
                &format!("gostw_pause_breakdown_seconds_total{{{l},part=\"{part}\"}}"),
            );
            assert!((v - ns as f64 / 1e9).abs() < 1e-12, "{part}: {v} vs {ns}");
            total += v;
        }
        assert!((total - 0.030).abs() < 1e-12, "the parts add up to 30 ms");
        let part = |p: &str| {
            value(
                &text,
                &format!("gostw_pause_breakdown_seconds_total{{{l},part=\"{p}\"}}"),
            )
        };
        assert!((part("stopping_on_cpu") - 0.0085).abs() < 1e-12);
        assert!((part("off_cpu_blocked") - 0.006).abs() < 1e-12);
        let stopping = |suffix: &str| {
            value(
                &text,
                &format!("gostw_pause_stopping_seconds_{suffix}{{{l}}}"),
            )
        };
        assert_eq!(stopping("count"), 2.0);
        assert!((stopping("sum") - 0.010).abs() < 1e-12);
        let on_cpu = value(
            &text,
            &format!("gostw_pause_laggard_seconds_total{{{l},state=\"on_cpu\"}}"),
        );
        assert!((on_cpu - 0.0085).abs() < 1e-12, "{on_cpu}");

        // The text format the agent serves passes promtool.
        let body = openmetrics_to_text(&text);
        gostw_scenario::promtool_check(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));

        metrics.remove(&labels);
        let mut text = String::new();
        encode(&mut text, metrics.registry()).unwrap();
        assert!(!text.contains("executable=\"api\""), "{text}");
    }
}
