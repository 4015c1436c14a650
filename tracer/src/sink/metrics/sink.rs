//! The observed stream into the Prometheus series: per-process series are
//! keyed by the labels the tracker gave each process when it started, and
//! dropped when the last process of a label set exits. Kernel and user-side
//! loss counters arrive cumulative; the series take their increments.

use std::{collections::HashMap, sync::Arc};

use tracer_common::{counters::Counter, fault::FaultTally};

use super::{
    Metrics,
    observe::{FaultObservation, PauseObservation, StackGrowthObservation, WaitedOn},
};
use crate::{
    model::labels::ProcessLabels,
    model::{
        fault::{Fault, FaultKind},
        losses::Losses,
        observed::{Membership, Observed},
    },
    sink::{Sink, slow_pauses::record_id},
};

/// The agent's sink.
pub struct MetricsSink {
    metrics: Arc<Metrics>,
    labels: HashMap<u32, ProcessLabels>,
    kernel_last: HashMap<Counter, u64>,
    losses_last: Losses,
    overflow_last: u64,
    /// Per process, the kernel's count of fault events shed so far.
    shed_last: HashMap<u32, FaultTally>,
    /// The backend marks every file-backed fault (an unmarked one is a
    /// swap-in).
    file_faults_seen: bool,
    /// Pauses at least this long have a slow-pause record, named by the
    /// exemplar of their duration bucket (None: no records kept).
    record_threshold: Option<crate::model::pause::SlowThreshold>,
}

impl std::ops::Deref for MetricsSink {
    type Target = Metrics;
    fn deref(&self) -> &Metrics {
        &self.metrics
    }
}

/// The part of a fault the series record.
pub fn fault_observation(f: &Fault, in_pause: bool) -> FaultObservation {
    FaultObservation {
        in_pause,
        backing: f.kind,
        wait_ns: f.blocked_ns,
        waited_on: if f.waited_on_other() {
            WaitedOn::Other
        } else {
            WaitedOn::Own
        },
    }
}

impl MetricsSink {
    pub fn new(metrics: Arc<Metrics>) -> MetricsSink {
        MetricsSink {
            metrics,
            labels: HashMap::new(),
            kernel_last: HashMap::new(),
            losses_last: Losses::default(),
            overflow_last: 0,
            shed_last: HashMap::new(),
            file_faults_seen: false,
            record_threshold: None,
        }
    }

    /// Name the slow-pause record of each `slow` pause
    /// in the exemplar of its duration bucket.
    pub fn with_record_exemplars(
        mut self,
        slow: crate::model::pause::SlowThreshold,
    ) -> MetricsSink {
        self.record_threshold = Some(slow);
        self
    }

    /// Faults the kernel counted but did not send (outside pauses, under a
    /// storm) into `major_faults_total`, so its sum stays every fault.
    fn shed(&mut self, pid: u32, now: &FaultTally) {
        let last = self.shed_last.entry(pid).or_default();
        let new = [
            (
                FaultKind::FileBacked,
                now.file_backed.saturating_sub(last.file_backed),
            ),
            (FaultKind::SwapIn, now.swap_in.saturating_sub(last.swap_in)),
            (
                if self.file_faults_seen {
                    FaultKind::SwapIn
                } else {
                    FaultKind::Unknown
                },
                now.unknown_kind.saturating_sub(last.unknown_kind),
            ),
        ];
        *last = *now;
        if let Some(l) = self.labels.get(&pid) {
            for (backing, n) in new {
                if n > 0 {
                    self.metrics.faults_shed(l, backing, n);
                }
            }
        }
    }

    /// The labels of `pid`, or count an event of a process not traced.
    fn labels(&self, pid: u32) -> Option<&ProcessLabels> {
        let l = self.labels.get(&pid);
        if l.is_none() {
            self.metrics.events_lost("unattributed", 1);
        }
        l
    }

    fn fault(&self, f: &Fault, in_pause: bool) {
        if let Some(l) = self.labels(f.tgid) {
            self.metrics.fault(l, &fault_observation(f, in_pause));
        }
    }
}

impl Sink for MetricsSink {
    fn observe(&mut self, o: &Observed) {
        let m = &self.metrics;
        match o {
            Observed::Started(info) => {
                m.process_started(&info.labels);
                self.labels.insert(info.pid, info.labels.clone());
            }
            Observed::Exited {
                pid,
                last_of_labels,
            } => {
                m.exposure.exited(*pid);
                self.shed_last.remove(pid);
                if let Some(l) = self.labels.remove(pid) {
                    m.process_exited(&l);
                    if *last_of_labels {
                        m.remove(&l);
                    }
                }
            }
            Observed::Pause(p) => {
                if let Some(l) = self.labels(p.record.pid) {
                    m.pause(
                        l,
                        &PauseObservation {
                            reason: p.record.reason,
                            duration_ns: p.record.duration_ns,
                            major_faults: u32::try_from(p.faults.len()).unwrap_or(u32::MAX),
                            record_id: self
                                .record_threshold
                                .filter(|t| t.is_slow(p.record.duration_ns))
                                .map(|_| record_id(&p.record)),
                        },
                    );
                    m.pause_explained(l, &p.record);
                }
                for f in &p.faults {
                    self.fault(f, true);
                }
            }
            Observed::Fault(f, membership) => {
                self.fault(f, *membership == Membership::LateInPause);
            }
            Observed::StackGrowth { event: ev, .. } => {
                if let Some(l) = self.labels(ev.header.tgid) {
                    m.stack_growth(
                        l,
                        &StackGrowthObservation {
                            old_size: ev.old_size,
                            live_bytes: ev.used,
                        },
                    );
                }
            }
            Observed::Counts {
                pid,
                stop_the_world_entries,
                samples,
                sample_hz,
            } => {
                if let Some(l) = self.labels.get(pid) {
                    if *stop_the_world_entries > 0 {
                        m.stop_the_world_entries(l, *stop_the_world_entries);
                    }
                    m.cpu_samples(l, *samples, *sample_hz);
                }
            }
            Observed::AttachFailed(reason) => m.attach_failure(*reason),
            Observed::SamplerAttached(on) => {
                m.stack_sampler_attached.set(i64::from(*on));
            }
            Observed::LabelsOverflowed => {
                m.label_sets_overflowed.inc();
            }
            Observed::Traced {
                processes,
                executables,
            } => {
                m.processes_traced.set(*processes as i64);
                m.executables_attached.set(*executables as i64);
            }
            Observed::FaultBackend(choice) => {
                self.file_faults_seen = choice.file_faults_seen;
                m.fault_backend(choice.backend.name());
            }
            Observed::FaultCounts { pid, counts } => {
                let shed = counts.shed;
                self.shed(*pid, &shed);
            }
            Observed::FaultsUnavailable(why) => {
                log::warn!("major faults are not traced: {why}");
                m.fault_backend("none");
            }
            Observed::Degraded(list) => {
                for d in list {
                    log::warn!("{} degraded here: {}", d.feature, d.why);
                }
                m.degraded(list);
            }
            Observed::KernelCounters(counters) => {
                for &(counter, value) in counters {
                    if counter == Counter::FaultReturnsPending {
                        // A gauge, not a count of errors (summary only).
                        continue;
                    }
                    let last = self.kernel_last.entry(counter).or_default();
                    let delta = value.saturating_sub(*last);
                    *last = value;
                    if delta > 0 {
                        m.bpf_error(counter.name(), delta);
                        if counter == Counter::RingbufFull {
                            m.events_lost("ringbuf_full", delta);
                        }
                    }
                }
            }
            Observed::Losses { user, correlator } => {
                let last = self.losses_last;
                m.events_lost(
                    "fault_queue_full",
                    correlator
                        .pending_overflow
                        .saturating_sub(self.overflow_last),
                );
                self.overflow_last = correlator.pending_overflow;
                m.events_lost(
                    "undecodable",
                    (user.malformed + user.unknown_kind)
                        .saturating_sub(last.malformed + last.unknown_kind),
                );
                m.events_lost("unhandled", user.unhandled.saturating_sub(last.unhandled));
                self.losses_last = *user;
            }
            Observed::HostPolled {
                known,
                took,
                exec_notifications,
            } => {
                m.proc_known.set(*known as i64);
                m.poll_duration.observe(took.as_secs_f64());
                m.last_poll_unix_seconds.set(
                    std::time::SystemTime::now()
                        .duration_since(std::time::SystemTime::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64()),
                );
                let seen = m.exec_notifications.get();
                m.exec_notifications
                    .inc_by(exec_notifications.saturating_sub(seen));
            }
            Observed::Cost(c) => m.cost.observe(c),
            Observed::ExitStatus { .. }
            | Observed::CpuThrottling { .. }
            | Observed::StackSites { .. }
            | Observed::Goroutines { .. } => {}
            Observed::Exposure(r) => {
                if let Some(l) = self.labels.get(&r.pid) {
                    m.exposure.reading(l, r);
                }
            }
        }
    }
}
