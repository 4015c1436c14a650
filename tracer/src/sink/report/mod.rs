//! What gostw prints: a live line (or JSON line) per notable pause, and a
//! summary at the end. The JSON field names are a stable interface
//! (docs/reference/json.md); units are in the names. One sink serves every
//! terminal front end; its `View` says which summary it ends with.
//!
//! - `pauses`: per reason statistics; `faults`: the fault summary.
//! - `text`, `faults_text`: the text forms.
//! - `exposure`: the memory exposure section and advice.

pub mod exposure;
pub mod faults;
pub mod faults_text;
pub mod health;
pub mod output;
pub mod pauses;
pub mod text;

use std::{
    collections::{BTreeMap, HashMap},
    io::Write as _,
    sync::Arc,
};

use serde::Serialize;
use tracer_common::counters::Counter;

use self::{
    exposure::{ExposureReport, ExposureSection},
    faults::{FaultReport, FaultSummary},
    pauses::{CallerCount, PauseStats, ProcessPauses, TOP_CALLERS},
};
pub use self::{
    output::Output,
    text::{pause_line, summary_text},
};
use super::Sink;
use crate::{
    engine::correlate::CorrelatorStats,
    model::throttling::CpuThrottling,
    model::{
        backend::Degraded,
        breakdown::Breakdown,
        code::Code,
        losses::Losses,
        observed::{Observed, ProcessInfo},
        pause::PauseRecord,
    },
    stackgrowth::{Mode, StackGrowthAggregator, StackGrowthSummary, goroutines},
};

/// How many of each process's longest pauses the summary lists.
pub const WORST_KEPT: usize = 5;

/// Which report a front end ends with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// `attach`/`run`: live pause lines, then pauses, faults and stack growth.
    Trace,
    /// `gostw faults`: the fault summary.
    Faults,
    /// `gostw stacks`: the stack-growth summary.
    Stacks,
}

/// A traced process, as the summary names it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcessEntry {
    pub pid: u32,
    pub exe: String,
    pub go_version: String,
    /// Exit code (128 + signal for a signal) if it exited while traced.
    pub exit_code: Option<i32>,
}

/// One reason's pauses in one process.
#[derive(Clone, Debug, Serialize)]
pub struct ReasonSummary {
    pub reason: &'static str,
    pub reason_code: u32,
    /// Go's wording.
    pub name: &'static str,
    /// Counted by Go as a GC pause (`/sched/pauses/total/gc:seconds`).
    pub gc: bool,
    pub count: u64,
    pub total_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    /// The code that asked for these pauses, most pauses first (when
    /// pauses are explained).
    pub top_callers: Vec<CallerCount>,
    /// Pauses with a breakdown, and their breakdowns summed part by part
    /// (absent when none has one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<ReasonBreakdown>,
}

/// One reason's breakdowns, summed.
#[derive(Clone, Debug, Serialize)]
pub struct ReasonBreakdown {
    pub pauses: u64,
    #[serde(flatten)]
    pub total: Breakdown,
}

/// One process's pauses.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessSummary {
    #[serde(flatten)]
    pub process: ProcessEntry,
    pub pauses: u64,
    /// `stopTheWorldWithSema` entries the kernel counted while traced: every
    /// stop the process made, whether or not its pause reached gostw.
    pub stops_counted: u64,
    /// Stops counted with no pause record: `stops_counted - pauses` (a stop
    /// still in progress when the trace ended counts here too).
    pub pauses_lost: u64,
    pub total_ns: u64,
    pub by_reason: Vec<ReasonSummary>,
    /// The longest pauses, longest first.
    pub worst: Vec<PauseRecord>,
    /// What its CPU cgroup's CFS quota held it back while traced (when
    /// pauses are explained and the group has a `cpu.stat`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_throttling: Option<CpuThrottling>,
    /// Where in the kernel its pauses' threads slept or ran, by kind, most
    /// time first (when pauses are explained).
    pub kernel_waits: Vec<pauses::KernelKindSummary>,
}

/// Events that happened but are missing from the records.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Lost {
    pub total: u64,
    /// Kernel-side counters by name (`Counter::name`).
    pub kernel: BTreeMap<&'static str, u64>,
    /// Events that reached user space but could not be used.
    pub user: Losses,
    /// How the correlator decided faults it could not place in a record
    /// (counted in the totals, so not part of `total`).
    pub correlator: CorrelatorStats,
    /// Live lines standard output could not take (a reader that did not
    /// keep up, or a failed write), and when; absent when none was lost.
    /// Not part of `total`: the records are complete, their lines are not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<crate::sink::queued::Losses>,
}

/// The end-of-trace report.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub elapsed_ns: u64,
    pub processes: Vec<ProcessSummary>,
    /// Major faults and how much of each pause they explain (when traced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<FaultSummary>,
    /// Goroutine stack growth of the traced process (when traced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_growth: Option<StackGrowthSummary>,
    /// The traced process's memory exposure (`attach`, `run`: when read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exposure: Option<ExposureSection>,
    /// Advice from the exposure and what the trace measured (with `exposure`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<Vec<crate::memory::Advice>>,
    pub lost: Lost,
    /// What tracing cost gostw (absent in summaries of recorded streams).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<health::Health>,
}

/// Stack growth of one process, as the stream tells it.
struct StackWatch {
    agg: StackGrowthAggregator,
    /// The code at the addresses seen, as the engine symbolized it.
    code: Code,
    samples: (u64, u64),
    peak_goroutines: Option<u64>,
}

impl StackWatch {
    fn new(mode: Mode) -> StackWatch {
        StackWatch {
            agg: StackGrowthAggregator::new(mode),
            code: Code::default(),
            samples: (0, 0),
            peak_goroutines: None,
        }
    }
}

/// The terminal/JSON sink.
pub struct ReportSink {
    view: View,
    output: Output,
    pauses: PauseStats,
    faults: Option<FaultReport>,
    stack_mode: Option<Mode>,
    stacks: HashMap<u32, StackWatch>,
    /// A goroutine count given on the command line, for the memory estimate.
    pub goroutines: Option<u64>,
    /// Say on standard error when a process is traced (`attach`).
    pub announce: bool,
    /// Read the traced process's memory exposure this often, besides at its
    /// start and end (`attach`, `run`; zero: only then).
    pub exposure_every: Option<std::time::Duration>,
    processes: Vec<(Arc<ProcessInfo>, Option<i32>)>,
    throttling: HashMap<u32, CpuThrottling>,
    exposure: ExposureReport,
    counters: Vec<(Counter, u64)>,
    /// Stops the kernel counted, per process.
    stops: HashMap<u32, u64>,
    /// Said on standard error that fault events are being shed.
    shedding_said: bool,
    losses: Losses,
    correlator: CorrelatorStats,
    cost: Option<Arc<crate::bpf_stats::CostReading>>,
    /// Features in use that lose something here.
    degraded: Vec<Degraded>,
    write_error: Option<std::io::Error>,
}

impl ReportSink {
    /// A report of `view`; faults and stack growth sections when traced.
    pub fn new(view: View, output: Output, faults: bool, stacks: Option<Mode>) -> ReportSink {
        ReportSink {
            view,
            output,
            pauses: PauseStats::new(WORST_KEPT),
            faults: faults.then(FaultReport::default),
            stack_mode: stacks,
            stacks: HashMap::new(),
            goroutines: None,
            announce: false,
            exposure_every: None,
            processes: Vec::new(),
            throttling: HashMap::new(),
            exposure: ExposureReport::default(),
            counters: Vec::new(),
            stops: HashMap::new(),
            shedding_said: false,
            losses: Losses::default(),
            correlator: CorrelatorStats::default(),
            cost: None,
            degraded: Vec::new(),
            write_error: None,
        }
    }

    /// The first error writing live records, if any.
    pub fn take_write_error(&mut self) -> Option<std::io::Error> {
        self.write_error.take()
    }

    /// Write what is left (the summary) to standard error: standard
    /// output's reader has gone.
    pub fn to_stderr(&mut self) {
        self.output.direct(Box::new(std::io::stderr()));
    }

    /// The lines of the trace standard output could not take, and what its
    /// end left unwritten (None when it is not written through a queue).
    pub fn unwritten(
        &self,
    ) -> Option<(crate::sink::queued::Losses, crate::sink::queued::Unwritten)> {
        self.output.losses()
    }

    /// The pause statistics of `pid`.
    pub fn process_pauses(&self, pid: u32) -> Option<&ProcessPauses> {
        self.pauses.process(pid)
    }

    fn stack_watch(&mut self, pid: u32) -> Option<&mut StackWatch> {
        let mode = self.stack_mode?;
        Some(
            self.stacks
                .entry(pid)
                .or_insert_with(|| StackWatch::new(mode)),
        )
    }

    /// The summary of everything observed, over `elapsed_ns`.
    pub fn summary(&self, elapsed_ns: u64) -> Summary {
        let empty = ProcessPauses::default();
        let processes = self
            .processes
            .iter()
            .map(|(info, exit_code)| {
                let p = self.pauses.process(info.pid).unwrap_or(&empty);
                let by_reason: Vec<_> = p
                    .by_reason
                    .iter()
                    .map(|(r, s)| ReasonSummary {
                        reason: r.id(),
                        reason_code: r.0,
                        name: r.name(),
                        gc: r.is_gc(),
                        count: s.count,
                        total_ns: s.total_ns,
                        p50_ns: s.quantile_ns(0.5),
                        p90_ns: s.quantile_ns(0.9),
                        p99_ns: s.quantile_ns(0.99),
                        p999_ns: s.quantile_ns(0.999),
                        max_ns: s.max_ns,
                        top_callers: s.top_callers(TOP_CALLERS),
                        breakdown: (s.explained > 0).then_some(ReasonBreakdown {
                            pauses: s.explained,
                            total: s.breakdown,
                        }),
                    })
                    .collect();
                ProcessSummary {
                    process: ProcessEntry {
                        pid: info.pid,
                        exe: info.exe.display().to_string(),
                        go_version: info.go_version.clone(),
                        exit_code: *exit_code,
                    },
                    pauses: p.count(),
                    stops_counted: self.stops.get(&info.pid).copied().unwrap_or(0),
                    pauses_lost: self
                        .stops
                        .get(&info.pid)
                        .map_or(0, |&n| n.saturating_sub(p.count())),
                    total_ns: by_reason.iter().map(|r| r.total_ns).sum(),
                    by_reason,
                    worst: p.worst.clone(),
                    cpu_throttling: self.throttling.get(&info.pid).cloned(),
                    kernel_waits: p.kernel_kinds(),
                }
            })
            .collect();
        let kernel: BTreeMap<_, _> = self.counters.iter().map(|&(c, n)| (c.name(), n)).collect();
        let stack_growth = self.stack_summary();
        let first = self.processes.first().map(|(i, _)| i.pid);
        let exposure = first.and_then(|pid| self.exposure.section(pid));
        let advice = exposure.as_ref().map(|e| {
            self.exposure.advice(
                e.pid,
                stack_growth.as_ref(),
                self.throttling.get(&e.pid),
                elapsed_ns,
            )
        });
        let mut summary = Summary {
            kind: "summary",
            elapsed_ns,
            processes,
            faults: self.faults.as_ref().map(FaultReport::summary),
            stack_growth,
            exposure,
            advice,
            lost: Lost {
                // Counters that split another one (per-kind ring buffer
                // drops) are not added twice; shed faults are counted.
                total: self
                    .counters
                    .iter()
                    .filter(|(c, _)| c.part_of().is_none() && c.is_loss())
                    .map(|&(_, n)| n)
                    .sum::<u64>()
                    + self.losses.lost(),
                kernel,
                user: self.losses,
                correlator: self.correlator,
                output: self
                    .output
                    .losses()
                    .map(|(l, _)| l)
                    .filter(|l| l.total() > 0),
            },
            health: None,
        };
        summary.health = self
            .cost
            .as_deref()
            .map(|c| health::Health::of(c, summary.lost.total, &self.degraded));
        summary
    }

    /// Stack growth of the first traced process.
    pub fn stack_summary(&self) -> Option<StackGrowthSummary> {
        let (info, _) = self.processes.first()?;
        let mode = self.stack_mode?;
        let fresh;
        let w = match self.stacks.get(&info.pid) {
            Some(w) => w,
            None => {
                fresh = StackWatch::new(mode);
                &fresh
            }
        };
        let goroutines = self
            .goroutines
            .map(|n| (n, "--goroutines"))
            .or(w.peak_goroutines.map(|n| (n, goroutines::SOURCE)));
        Some(w.agg.summary(&w.code, goroutines))
    }

    /// Write the final report of the view.
    pub fn finish(&mut self, elapsed_ns: u64) -> std::io::Result<()> {
        let mut text = Vec::new();
        match self.view {
            View::Trace => {
                let s = self.summary(elapsed_ns);
                if self.output.json {
                    serde_json::to_writer(&mut text, &s)?;
                    text.push(b'\n');
                } else {
                    text.extend_from_slice(summary_text(&s).as_bytes());
                }
            }
            View::Faults => {
                let s = self
                    .faults
                    .as_ref()
                    .map(FaultReport::summary)
                    .unwrap_or_default();
                if self.output.json {
                    writeln!(text, "{}", serde_json::to_string_pretty(&s)?)?;
                } else {
                    write!(text, "{}", faults_text::render_text(&s, 10))?;
                }
            }
            View::Stacks => {
                if let Some(s) = self.stack_summary() {
                    if self.output.json {
                        serde_json::to_writer(&mut text, &s)?;
                        text.push(b'\n');
                    } else {
                        let (info, _) = &self.processes[0];
                        write!(
                            text,
                            "pid {} ({}):\n{}",
                            info.pid,
                            info.go_version,
                            s.render_text()
                        )?;
                    }
                }
            }
        }
        self.output.write_last(&text)
    }
}

impl Sink for ReportSink {
    fn closed(&mut self) -> bool {
        if let Some(e) = self.output.take_error() {
            self.write_error.get_or_insert(e);
        }
        self.write_error.is_some()
            || self
                .output
                .watch
                .is_some_and(crate::sink::file::reader_gone)
    }

    fn observe(&mut self, o: &Observed) {
        match o {
            Observed::Started(info) => {
                if self.announce {
                    crate::say!(
                        "gostw: tracing pid {} ({}, {}); Ctrl-C to stop",
                        info.pid,
                        info.exe.display(),
                        info.go_version
                    );
                }
                self.processes.push((info.clone(), None));
                if let Some(f) = &mut self.faults {
                    f.process(info.pid);
                }
            }
            Observed::ExitStatus { pid, code } => {
                if let Some((_, c)) = self.processes.iter_mut().find(|(i, _)| i.pid == *pid) {
                    *c = Some(*code);
                }
            }
            Observed::Pause(p) => {
                self.pauses.add(&p.record);
                self.exposure.pause(p);
                if let Some(f) = &mut self.faults {
                    f.pause(p);
                }
                if self.view == View::Trace
                    && let Err(e) = self.output.pause(&p.record)
                {
                    self.write_error.get_or_insert(e);
                }
            }
            Observed::Fault(f, membership) => {
                if let Some(r) = &mut self.faults {
                    r.fault(f, *membership);
                }
            }
            Observed::StackGrowth { event, code } => {
                if let Some(w) = self.stack_watch(event.header.tgid) {
                    w.agg.add_event(event);
                    w.code.extend(code);
                }
            }
            Observed::Counts {
                pid,
                stop_the_world_entries,
                samples,
                sample_hz,
            } => {
                *self.stops.entry(*pid).or_default() += stop_the_world_entries;
                if let Some(w) = self.stack_watch(*pid) {
                    w.samples.0 += samples.all;
                    w.samples.1 += samples.stack_growth;
                    w.agg.set_cpu_samples(w.samples.0, w.samples.1, *sample_hz);
                }
            }
            Observed::FaultCounts { pid, counts } => {
                if let Some(f) = &mut self.faults {
                    f.counted(*pid, counts);
                }
            }
            Observed::StackSites {
                pid,
                rows,
                observed,
                code,
            } => {
                if let Some(w) = self.stack_watch(*pid) {
                    w.code.extend(code);
                    w.agg.set_sites(rows.iter().copied());
                    w.agg.set_observed(observed.0, observed.1);
                }
            }
            Observed::Goroutines { pid, peak } => {
                if let Some(w) = self.stack_watch(*pid) {
                    w.peak_goroutines = Some(*peak);
                }
            }
            Observed::FaultBackend(choice) => {
                crate::say!(
                    "gostw: fault backend {}: {}",
                    choice.backend.name(),
                    choice.reason
                );
                if let Some(f) = &mut self.faults {
                    f.set_backend(choice.backend.name(), choice.file_faults_seen);
                }
            }
            Observed::FaultsUnavailable(why) => {
                crate::say!("gostw: major faults not traced: {why}");
            }
            Observed::Degraded(list) => {
                for d in list {
                    crate::say!("gostw: {} degraded here: {}", d.feature, d.why);
                }
                self.degraded.clone_from(list);
            }
            Observed::KernelCounters(c) => {
                let shed = c.iter().any(|&(k, n)| k == Counter::FaultShed && n > 0);
                if shed && !self.shedding_said && self.view != View::Stacks {
                    self.shedding_said = true;
                    eprintln!(
                        "gostw: fault storm: faults outside pauses are counted but sent with \
                         their stacks only while the ring buffer is less than half full \
                         (every fault inside a pause is sent); the summary says how many"
                    );
                }
                self.counters.clone_from(c);
            }
            Observed::CpuThrottling { pid, throttling } => {
                self.throttling.insert(*pid, throttling.clone());
            }
            Observed::Exposure(r) => self.exposure.reading(r),
            Observed::Cost(c) => self.cost = Some(c.clone()),
            Observed::Losses { user, correlator } => {
                self.losses = *user;
                self.correlator = *correlator;
            }
            Observed::Exited { .. }
            | Observed::AttachFailed(_)
            | Observed::LabelsOverflowed
            | Observed::Traced { .. }
            | Observed::HostPolled { .. }
            | Observed::SamplerAttached(_) => {}
        }
    }
}

#[cfg(test)]
mod tests;
