//! The one stream every front end consumes: what the engine observed, in
//! order. Sinks (the terminal/JSON report, the Prometheus metrics, profiles)
//! are functions of this stream and nothing else, so a recorded stream fed
//! to two sinks gives the same numbers.

use std::{path::PathBuf, sync::Arc};

use tracer_common::{
    counters::Counter,
    stack::{StackGrowthEvent, StackSiteCounts, StackSiteKey},
};

use super::{code::Code, fault::Fault, losses::Losses, pause::PauseRecord};
use crate::{
    image::ProcessImage,
    model::{
        backend::{BackendChoice, Degraded},
        labels::ProcessLabels,
    },
};

/// A traced process, as every sink names it.
#[derive(Clone)]
pub struct ProcessInfo {
    pub pid: u32,
    /// The executable's path as the process sees it.
    pub exe: PathBuf,
    /// The series labels of its executable (bounded: see the tracker).
    pub labels: ProcessLabels,
    /// e.g. "go1.22.10".
    pub go_version: String,
    /// The analysed executable as this process maps it (None only for test
    /// kernels): the engine resolves its load bias while the process lives,
    /// so a sink symbolizes without reading `/proc`.
    pub image: Option<Arc<ProcessImage>>,
}

/// Whether a fault began inside a pause of its process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Membership {
    /// It began outside every pause.
    Outside,
    /// It began inside a pause whose record was already out (it ended more
    /// than the correlator's grace after that pause): in a pause, but not in
    /// that pause's record.
    LateInPause,
}

/// One pause with the major faults that began inside it.
#[derive(Clone, Debug)]
pub struct ObservedPause {
    pub record: PauseRecord,
    pub faults: Vec<Fault>,
}

/// CPU samples of a traced process, counted in the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSamples {
    /// All samples that landed in the process.
    pub all: u64,
    /// Those that caught it copying a goroutine stack.
    pub stack_growth: u64,
}

/// Why an executable or a process could not be traced (a bounded label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// The binary could not be analysed (not readable, malformed, no probe point).
    Analysis,
    /// A Go version whose runtime layout gostw does not know.
    UnsupportedGo,
    /// The kernel refused a probe.
    Attach,
    /// The process could not be added to the traced set.
    Trace,
    /// The process exited before it could be traced.
    ProcessGone,
    /// `--max-executables` reached.
    Limit,
}

impl FailureReason {
    pub const ALL: [FailureReason; 6] = [
        FailureReason::Analysis,
        FailureReason::UnsupportedGo,
        FailureReason::Attach,
        FailureReason::Trace,
        FailureReason::ProcessGone,
        FailureReason::Limit,
    ];

    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            FailureReason::Analysis => "analysis",
            FailureReason::UnsupportedGo => "unsupported_go",
            FailureReason::Attach => "attach",
            FailureReason::Trace => "trace",
            FailureReason::ProcessGone => "process_gone",
            FailureReason::Limit => "limit",
        }
    }
}

/// What the correlator decided in a way worth reporting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CorrelatorStats {
    /// Faults that began in a pause whose record was already released.
    pub late_faults: u64,
    /// Faults decided as outside because the pending queue was full.
    pub pending_overflow: u64,
}

/// What the engine observed.
#[derive(Clone)]
pub enum Observed {
    /// A process is traced from now on.
    Started(Arc<ProcessInfo>),
    /// A traced process exited (or tracing it stopped); its events are all
    /// in. `last_of_labels`: no other traced process has its labels.
    Exited { pid: u32, last_of_labels: bool },
    /// A process's exit status, when gostw started it.
    ExitStatus { pid: u32, code: i32 },
    /// A pause and its faults (boxed: its record is by far the largest).
    Pause(Box<ObservedPause>),
    /// A major fault that is not part of a pause record.
    Fault(Fault, Membership),
    /// A stack growth event (exact) or sample (sampled).
    StackGrowth {
        event: StackGrowthEvent,
        /// The code at its return addresses (filled by the engine before
        /// any sink sees it).
        code: Arc<Code>,
    },
    /// Counts the kernel kept for a process, since the last `Counts`.
    Counts {
        pid: u32,
        stop_the_world_entries: u64,
        samples: CpuSamples,
        /// Samples per second per CPU of the sampler.
        sample_hz: u64,
    },
    /// Every major fault of a process counted in the kernel so far
    /// (cumulative; sent when it changed): exact however many fault events
    /// were shed.
    FaultCounts {
        pid: u32,
        counts: tracer_common::fault::FaultCounts,
    },
    /// The stack-growth site counts of a process, cumulative (exact mode's
    /// kernel map), and how long stack growth was observed.
    StackSites {
        pid: u32,
        rows: Vec<(StackSiteKey, StackSiteCounts)>,
        observed: (std::time::Duration, std::time::Duration),
        /// The code at the rows' sites and callers (filled by the engine).
        code: Arc<Code>,
    },
    /// An executable could not be traced.
    AttachFailed(FailureReason),
    /// A label set did not fit the limit and shares the overflow label.
    LabelsOverflowed,
    /// The host's processes were polled (the agent's discovery).
    HostPolled {
        /// Processes known to discovery.
        known: usize,
        took: std::time::Duration,
        /// Exec notifications so far.
        exec_notifications: u64,
    },
    /// How much is traced now.
    Traced {
        processes: usize,
        executables: usize,
    },
    /// The stack-growth sampler was attached (true) or detached.
    SamplerAttached(bool),
    /// The fault backend attached (with the first traced process).
    FaultBackend(BackendChoice),
    /// Faults were asked for but cannot be traced here: why.
    FaultsUnavailable(String),
    /// Features in use that lose something on this host (once, after
    /// `FaultBackend`).
    Degraded(Vec<Degraded>),
    /// A traced process's CPU cgroup was throttled this much while traced
    /// (sent just before its `Exited`, where the group has a quota).
    CpuThrottling {
        pid: u32,
        throttling: super::throttling::CpuThrottling,
    },
    /// A traced process's memory and swap exposure was read (`attach`,
    /// `run`): at its start, on each refresh, and at its end (sent just
    /// before its `Exited`).
    Exposure(Arc<crate::memory::watch::ExposureReading>),
    /// A process's peak goroutine count rose (`runtime.allglen`).
    Goroutines { pid: u32, peak: u64 },
    /// The kernel-side health counters, cumulative.
    KernelCounters(Vec<(Counter, u64)>),
    /// Events user space could not use, and the correlator's counts; cumulative.
    Losses {
        user: Losses,
        correlator: CorrelatorStats,
    },
    /// gostw's own cost so far (its BPF programs, CPU, memory); cumulative,
    /// at most once a second.
    Cost(Arc<crate::bpf_stats::CostReading>),
}

/// Something that consumes the observed stream.
pub trait Sink {
    fn observe(&mut self, o: &Observed);

    /// What this sink writes can no longer be written or read (a write
    /// failed, or its reader went away): tracing should stop.
    fn closed(&mut self) -> bool {
        false
    }

    /// Every observation of `all`, in order.
    fn observe_all(&mut self, all: &[Observed]) {
        for o in all {
            self.observe(o);
        }
    }
}

/// A sink that may be absent (an output not asked for).
impl<S: Sink> Sink for Option<S> {
    fn observe(&mut self, o: &Observed) {
        if let Some(s) = self {
            s.observe(o);
        }
    }

    fn closed(&mut self) -> bool {
        self.as_mut().is_some_and(S::closed)
    }
}

/// Two sinks fed the same stream.
impl<A: Sink, B: Sink> Sink for (A, B) {
    fn observe(&mut self, o: &Observed) {
        self.0.observe(o);
        self.1.observe(o);
    }

    fn closed(&mut self) -> bool {
        self.0.closed() || self.1.closed()
    }
}

#[cfg(test)]
pub mod tests_support {
    use super::*;

    /// The test process every sink test traces: pid `pid` of `/srv/api`,
    /// Go 1.26.6, build id `build_id`, in no container.
    pub fn api_process(pid: u32, build_id: &str) -> Arc<ProcessInfo> {
        Arc::new(ProcessInfo {
            pid,
            exe: "/srv/api".into(),
            labels: ProcessLabels {
                executable: "api".into(),
                go_version: "go1.26.6".into(),
                build_id: build_id.into(),
                ..ProcessLabels::default()
            },
            go_version: "go1.26.6".into(),
            image: None,
        })
    }
}
