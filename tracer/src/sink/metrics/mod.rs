//! The agent's Prometheus metrics: what the traced processes did (pauses,
//! faults, stack growth, by executable) and the agent's own health. Series of
//! a label set are removed when its last process exits, so Prometheus marks
//! them stale and memory stays bounded by the live processes.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        Mutex,
        atomic::{AtomicI64, AtomicU64},
    },
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter, exemplar::HistogramWithExemplars, family::Family, gauge::Gauge,
        histogram::Histogram,
    },
    registry::{Registry, Unit},
};

pub mod cost;
pub mod explain;
pub mod exposure;
pub mod observe;
pub mod outputs;
mod sink;
pub mod slow;

use self::observe::{
    FaultObservation, PauseObservation, StackGrowthObservation, WaitedOn, waited_label,
};
pub use self::sink::MetricsSink;
use crate::{
    model::fault::FaultKind,
    model::observed::CpuSamples,
    model::{labels::ProcessLabels, observed::FailureReason},
};

/// Pause and fault-wait buckets: 1-2-5 per decade from 10 us to 10 s (19
/// bounds), fine enough to tell a 50 us pause from a 200 us one and a 40 ms
/// outlier from a 100 ms one.
pub const SECONDS_BUCKETS: [f64; 19] = [
    10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3,
    200e-3, 500e-3, 1.0, 2.0, 5.0, 10.0,
];

/// Major faults in one pause: 0 (most pauses) up to 1000.
pub const FAULT_COUNT_BUCKETS: [f64; 11] = [
    0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0,
];

/// Stack sizes: Go stacks start at 2 KiB (8 KiB on some systems) and double;
/// powers of two up to Go's 1 GiB maximum.
pub fn stack_size_buckets() -> impl Iterator<Item = f64> {
    (11..=30).map(|shift| f64::from(1u32 << shift))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PauseLabels {
    #[prometheus(flatten)]
    process: ProcessLabels,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabels {
    #[prometheus(flatten)]
    process: ProcessLabels,
    in_pause: &'static str,
    backing: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WaitLabels {
    #[prometheus(flatten)]
    process: ProcessLabels,
    in_pause: &'static str,
    waited_on: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CounterLabel {
    counter: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// The exemplar of a pause duration bucket: the slow-pause record of the
/// last pause that fell in it (OpenMetrics only; /debug/pauses has it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecordId {
    pub pause_id: String,
}

type PauseHistogram = HistogramWithExemplars<RecordId>;

fn pause_histogram() -> PauseHistogram {
    HistogramWithExemplars::new(SECONDS_BUCKETS.into_iter())
}

fn seconds_histogram() -> Histogram {
    Histogram::new(SECONDS_BUCKETS)
}
fn fault_count_histogram() -> Histogram {
    Histogram::new(FAULT_COUNT_BUCKETS)
}
fn stack_size_histogram() -> Histogram {
    Histogram::new(stack_size_buckets())
}

fn bool_label(b: bool) -> &'static str {
    if b { "true" } else { "false" }
}

/// Every metric the agent serves.
pub struct Metrics {
    registry: Registry,
    pause_duration: Family<PauseLabels, PauseHistogram, fn() -> PauseHistogram>,
    pause_major_faults: Histograms<ProcessLabels>,
    stw_entries: Family<ProcessLabels, Counter>,
    major_faults: Family<FaultLabels, Counter>,
    fault_wait: Histograms<WaitLabels>,
    cpu_samples: Family<ProcessLabels, Counter>,
    stack_growth_samples: Family<ProcessLabels, Counter>,
    stack_growth_cpu_seconds: Family<ProcessLabels, Counter<f64, AtomicU64>>,
    stack_old_size: Histograms<ProcessLabels>,
    processes: Family<ProcessLabels, Gauge>,
    explain: explain::ExplainMetrics,
    /// Reasons seen per label set, to remove their series on exit.
    reasons: Mutex<HashMap<ProcessLabels, BTreeSet<&'static str>>>,
    // Health.
    pub processes_traced: Gauge,
    pub executables_attached: Gauge,
    pub stack_sampler_attached: Gauge,
    pub proc_known: Gauge,
    attach_failures: Family<ReasonLabel, Counter>,
    bpf_errors: Family<CounterLabel, Counter>,
    events_lost: Family<StageLabel, Counter>,
    pub label_sets_overflowed: Counter,
    pub exec_notifications: Counter,
    pub scrape_duration: Histogram,
    pub poll_duration: Histogram,
    pub last_poll_unix_seconds: Gauge<f64, AtomicU64>,
    pub build_info: Family<Vec<(&'static str, &'static str)>, Gauge<i64, AtomicI64>>,
    fault_backend: Family<Vec<(&'static str, &'static str)>, Gauge<i64, AtomicI64>>,
    degraded_feature: Family<Vec<(&'static str, &'static str)>, Gauge<i64, AtomicI64>>,
    pub exposure: exposure::ExposureMetrics,
    pub slow_pauses: slow::SlowPauseMetrics,
    /// The outputs' lines and losses, and the OTLP exports.
    pub outputs: outputs::OutputMetrics,
    /// The agent's own cost (`cost`).
    pub cost: cost::CostMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        // Only the standard process series (`cost`) are outside `gostw_`.
        let mut root = Registry::default();
        let r = root.sub_registry_with_prefix("gostw");
        let m = Metrics {
            pause_duration: Family::new_with_constructor(pause_histogram),
            pause_major_faults: Histograms::new_with_constructor(fault_count_histogram),
            stw_entries: Family::default(),
            major_faults: Family::default(),
            fault_wait: Histograms::new_with_constructor(seconds_histogram),
            cpu_samples: Family::default(),
            stack_growth_samples: Family::default(),
            stack_growth_cpu_seconds: Family::default(),
            stack_old_size: Histograms::new_with_constructor(stack_size_histogram),
            processes: Family::default(),
            explain: explain::ExplainMetrics::new(),
            reasons: Mutex::new(HashMap::new()),
            processes_traced: Gauge::default(),
            executables_attached: Gauge::default(),
            stack_sampler_attached: Gauge::default(),
            proc_known: Gauge::default(),
            attach_failures: Family::default(),
            bpf_errors: Family::default(),
            events_lost: Family::default(),
            label_sets_overflowed: Counter::default(),
            exec_notifications: Counter::default(),
            scrape_duration: Histogram::new([1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2, 0.1]),
            poll_duration: Histogram::new([1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0]),
            last_poll_unix_seconds: Gauge::default(),
            build_info: Family::default(),
            fault_backend: Family::default(),
            degraded_feature: Family::default(),
            exposure: Default::default(),
            slow_pauses: Default::default(),
            outputs: Default::default(),
            cost: cost::CostMetrics::default(),
            registry: Registry::default(),
        };
        r.register_with_unit(
            "pause_duration",
            "Stop-the-world pauses of traced Go processes, by stwReason",
            Unit::Seconds,
            m.pause_duration.clone(),
        );
        r.register(
            "pause_major_faults",
            "Major page faults that began inside each stop-the-world pause",
            m.pause_major_faults.clone(),
        );
        r.register(
            "stop_the_world_entries",
            "runtime.stopTheWorldWithSema entries counted in the kernel (independent of event delivery)",
            m.stw_entries.clone(),
        );
        r.register(
            "major_faults",
            "Major page faults of traced processes, inside pauses or not, by what backed the page",
            m.major_faults.clone(),
        );
        r.register_with_unit(
            "fault_wait",
            "Time a thread blocked in a major fault, on its own read or another thread's",
            Unit::Seconds,
            m.fault_wait.clone(),
        );
        r.register(
            "cpu_samples",
            format!(
                "CPU-clock samples ({} Hz per CPU) that landed in traced processes: the denominator of the stack growth share",
                crate::kernel::stacks::SAMPLE_HZ
            ),
            m.cpu_samples.clone(),
        );
        r.register(
            "stack_growth_samples",
            "CPU-clock samples that caught a thread copying a goroutine stack (runtime.newstack -> copystack)",
            m.stack_growth_samples.clone(),
        );
        r.register_with_unit(
            "stack_growth_cpu",
            "CPU time spent growing goroutine stacks, estimated as samples x sample period",
            Unit::Seconds,
            m.stack_growth_cpu_seconds.clone(),
        );
        r.register_with_unit(
            "stack_growth_old_size",
            "Stack size of the goroutine each stack growth sample caught being copied (one observation per sample, not per growth)",
            Unit::Bytes,
            m.stack_old_size.clone(),
        );
        r.register(
            "traced_processes",
            "Processes traced, by executable and container",
            m.processes.clone(),
        );
        m.explain.register(r);
        let a = r.sub_registry_with_prefix("agent");
        m.slow_pauses.register(a);
        m.outputs.register(a);
        a.register(
            "processes_traced",
            "Processes the agent traces now",
            m.processes_traced.clone(),
        );
        a.register(
            "executables_attached",
            "Executables with probes attached now",
            m.executables_attached.clone(),
        );
        a.register(
            "stack_sampler_attached",
            "1 when the stack growth CPU sampler runs (0 until the first executable is attached, or when the kernel refused it)",
            m.stack_sampler_attached.clone(),
        );
        a.register(
            "processes_known",
            "Processes the /proc poller tracks (all, traced or not)",
            m.proc_known.clone(),
        );
        a.register(
            "attach_failures",
            "Executables or processes that could not be traced, by reason",
            m.attach_failures.clone(),
        );
        a.register(
            "bpf_errors",
            "Failures counted by the kernel programs (per-CPU counters, summed)",
            m.bpf_errors.clone(),
        );
        a.register(
            "events_lost",
            "Events lost: ring buffer full in the kernel, undecodable, of a kind the agent does not handle, or of no traced process",
            m.events_lost.clone(),
        );
        a.register(
            "label_sets_overflowed",
            "Processes whose labels were replaced by _overflow (label set limit)",
            m.label_sets_overflowed.clone(),
        );
        a.register(
            "exec_notifications",
            "Execs reported by the kernel's process events connector (stays 0 where it is unavailable: discovery is then by polling alone)",
            m.exec_notifications.clone(),
        );
        a.register_with_unit(
            "scrape_duration",
            "Time to encode /metrics",
            Unit::Seconds,
            m.scrape_duration.clone(),
        );
        a.register_with_unit(
            "poll_duration",
            "Time of one /proc poll including attaches",
            Unit::Seconds,
            m.poll_duration.clone(),
        );
        a.register(
            "last_poll_timestamp_seconds",
            "Unix time of the last completed /proc poll (liveness)",
            m.last_poll_unix_seconds.clone(),
        );
        a.register(
            "build_info",
            "The agent's version (value 1)",
            m.build_info.clone(),
        );
        a.register(
            "fault_backend",
            "The kernel mechanism that observes major faults (value 1): kprobe, tracepoint, or none",
            m.fault_backend.clone(),
        );
        a.register(
            "degraded_feature",
            "Features that run on this host but lose something (value 1), as `gostw check` names them; the agent's log says what",
            m.degraded_feature.clone(),
        );
        m.build_info
            .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION"))])
            .set(1);
        // Known label values from the start, so rate() works from the first
        // increment and the families appear before any failure.
        for f in FailureReason::ALL {
            let _ = m
                .attach_failures
                .get_or_create(&ReasonLabel { reason: f.label() });
        }
        for stage in EVENT_LOSS_STAGES {
            let _ = m.events_lost.get_or_create(&StageLabel { stage });
        }
        m.exposure.register(r);
        m.cost.register_programs(r);
        m.cost.register_process(&mut root);
        Metrics {
            registry: root,
            ..m
        }
    }

    /// The registry, for encoding.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn pause(&self, labels: &ProcessLabels, p: &PauseObservation) {
        let key = PauseLabels {
            process: labels.clone(),
            reason: p.reason,
        };
        let exemplar = p.record_id.clone().map(|pause_id| RecordId { pause_id });
        self.pause_duration
            .get_or_create(&key)
            .observe(p.duration_ns as f64 / 1e9, exemplar, None);
        self.pause_major_faults
            .get_or_create(labels)
            .observe(f64::from(p.major_faults));
        let mut reasons = self.reasons.lock().unwrap_or_else(|e| e.into_inner());
        reasons.entry(labels.clone()).or_default().insert(p.reason);
    }

    /// `n` faults outside pauses that the kernel counted but whose events
    /// were shed: counted in `major_faults_total` (no wait observed).
    pub fn faults_shed(&self, labels: &ProcessLabels, backing: FaultKind, n: u64) {
        self.major_faults
            .get_or_create(&FaultLabels {
                process: labels.clone(),
                in_pause: bool_label(false),
                backing: backing.backing_label(),
            })
            .inc_by(n);
    }

    pub fn fault(&self, labels: &ProcessLabels, f: &FaultObservation) {
        let in_pause = bool_label(f.in_pause);
        self.major_faults
            .get_or_create(&FaultLabels {
                process: labels.clone(),
                in_pause,
                backing: f.backing.backing_label(),
            })
            .inc();
        self.fault_wait
            .get_or_create(&WaitLabels {
                process: labels.clone(),
                in_pause,
                waited_on: waited_label(f.waited_on),
            })
            .observe(f.wait_ns as f64 / 1e9);
    }

    /// One sample that caught a stack copy, with the sizes it saw.
    pub fn stack_growth(&self, labels: &ProcessLabels, g: &StackGrowthObservation) {
        self.stack_old_size
            .get_or_create(labels)
            .observe(g.old_size as f64);
    }

    /// More CPU samples of a process, taken at `hz` per CPU: each stands for
    /// 1/hz s of CPU time (the kernel fixes the period of a CPU-clock event
    /// at 1/hz).
    pub fn cpu_samples(&self, labels: &ProcessLabels, new: CpuSamples, hz: u64) {
        self.cpu_samples.get_or_create(labels).inc_by(new.all);
        self.stack_growth_samples
            .get_or_create(labels)
            .inc_by(new.stack_growth);
        if hz > 0 {
            self.stack_growth_cpu_seconds
                .get_or_create(labels)
                .inc_by(new.stack_growth as f64 / hz as f64);
        }
    }

    pub fn stop_the_world_entries(&self, labels: &ProcessLabels, n: u64) {
        self.stw_entries.get_or_create(labels).inc_by(n);
    }

    /// One more (or one less) live process with these labels.
    pub fn process_started(&self, labels: &ProcessLabels) {
        self.processes.get_or_create(labels).inc();
        self.reasons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(labels.clone())
            .or_default();
        // The series exist from the start: a process with no pause yet still
        // shows its label set, and stop_the_world_entries starts at 0.
        let _ = self.stw_entries.get_or_create(labels);
        let _ = self.cpu_samples.get_or_create(labels);
        let _ = self.stack_growth_samples.get_or_create(labels);
        let _ = self.stack_growth_cpu_seconds.get_or_create(labels);
    }

    /// The last process with `labels` exited: drop every series of them.
    pub fn remove(&self, labels: &ProcessLabels) {
        self.processes.remove(labels);
        self.stw_entries.remove(labels);
        self.pause_major_faults.remove(labels);
        self.cpu_samples.remove(labels);
        self.stack_growth_samples.remove(labels);
        self.stack_growth_cpu_seconds.remove(labels);
        self.stack_old_size.remove(labels);
        let reasons = self
            .reasons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(labels);
        if let Some(reasons) = &reasons {
            self.explain.remove(labels, reasons);
        }
        for reason in reasons.into_iter().flatten() {
            self.pause_duration.remove(&PauseLabels {
                process: labels.clone(),
                reason,
            });
        }
        for in_pause in [true, false].map(bool_label) {
            for backing in FaultKind::ALL.map(FaultKind::backing_label) {
                self.major_faults.remove(&FaultLabels {
                    process: labels.clone(),
                    in_pause,
                    backing,
                });
            }
            for waited_on in [WaitedOn::Own, WaitedOn::Other].map(waited_label) {
                self.fault_wait.remove(&WaitLabels {
                    process: labels.clone(),
                    in_pause,
                    waited_on,
                });
            }
        }
    }

    /// The process counter of `labels` goes down by one (others remain).
    pub fn process_exited(&self, labels: &ProcessLabels) {
        if let Some(g) = self.processes.get(labels) {
            g.dec();
        }
    }

    pub fn attach_failure(&self, reason: FailureReason) {
        self.attach_failures
            .get_or_create(&ReasonLabel {
                reason: reason.label(),
            })
            .inc();
    }

    /// Add to a kernel health counter (the agent keeps the last sum).
    pub fn bpf_error(&self, counter: &'static str, delta: u64) {
        self.bpf_errors
            .get_or_create(&CounterLabel { counter })
            .inc_by(delta);
    }

    pub fn events_lost(&self, stage: &'static str, n: u64) {
        self.events_lost
            .get_or_create(&StageLabel { stage })
            .inc_by(n);
    }

    /// The fault backend the agent attached ("none" without one).
    pub fn fault_backend(&self, backend: &'static str) {
        self.fault_backend.clear();
        self.fault_backend
            .get_or_create(&vec![("backend", backend)])
            .set(1);
    }

    /// The features that lose something here (`gostw check`'s names).
    pub fn degraded(&self, list: &[crate::model::backend::Degraded]) {
        self.degraded_feature.clear();
        for d in list {
            self.degraded_feature
                .get_or_create(&vec![("feature", d.feature)])
                .set(1);
        }
    }

    /// Label sets with series now (for the memory bound checks).
    pub fn live_label_sets(&self) -> usize {
        self.reasons.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Stages where an event can be lost, for `gostw_agent_events_lost_total`.
pub const EVENT_LOSS_STAGES: [&str; 4] =
    ["ringbuf_full", "undecodable", "unhandled", "unattributed"];

#[cfg(test)]
mod tests;
