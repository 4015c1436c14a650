//! Pause statistics for the summary: per process and reason, an HDR
//! histogram of durations, exact count, total and maximum, and the longest
//! pauses.

use std::collections::{BTreeMap, HashMap};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::engine::caller::CallerSite;
use crate::model::{
    breakdown::Breakdown,
    kernel_wait::{Sleeper, WaitKind},
    pause::{PauseRecord, StwReason},
};

/// How many callers of each reason the summary lists.
pub const TOP_CALLERS: usize = 5;

/// One caller of one reason's pauses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallerCount {
    #[serde(flatten)]
    pub site: CallerSite,
    pub pauses: u64,
}

/// Distribution of one reason's pause durations.
#[derive(Clone, Debug)]
pub struct ReasonStats {
    pub count: u64,
    pub total_ns: u64,
    /// Exact (the histogram rounds to 3 significant digits).
    pub max_ns: u64,
    pub histogram: Histogram<u64>,
    /// Pauses by caller site (pauses with a caller stack only).
    pub callers: HashMap<CallerSite, u64>,
    /// The breakdowns of the pauses that have one, summed, and how many.
    pub breakdown: Breakdown,
    pub explained: u64,
}

impl ReasonStats {
    fn new() -> ReasonStats {
        ReasonStats {
            count: 0,
            total_ns: 0,
            max_ns: 0,
            // 1 ns to 1 hour, 3 significant digits.
            histogram: Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                .expect("valid histogram bounds"),
            callers: HashMap::new(),
            breakdown: Breakdown::default(),
            explained: 0,
        }
    }

    fn add(&mut self, rec: &PauseRecord) {
        if let Some(site) = rec.caller.as_deref().and_then(CallerSite::of) {
            *self.callers.entry(site).or_default() += 1;
        }
        if let Some(b) = &rec.breakdown {
            self.breakdown.add(b);
            self.explained += 1;
        }
        let ns = rec.duration_ns;
        self.count += 1;
        self.total_ns = self.total_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
        self.histogram.saturating_record(ns);
    }

    /// Duration at quantile `q` (0..=1), HDR precision (never above the
    /// exact maximum, which HDR's rounding up could otherwise pass).
    pub fn quantile_ns(&self, q: f64) -> u64 {
        self.histogram.value_at_quantile(q).min(self.max_ns)
    }

    /// The callers with the most pauses, most first (then by name).
    pub fn top_callers(&self, max: usize) -> Vec<CallerCount> {
        let mut v: Vec<CallerCount> = self
            .callers
            .iter()
            .map(|(site, &pauses)| CallerCount {
                site: site.clone(),
                pauses,
            })
            .collect();
        v.sort_by(|a, b| (b.pauses, &a.site).cmp(&(a.pauses, &b.site)));
        v.truncate(max);
        v
    }
}

/// One kind of time in the kernel over a process's pauses: whose, asleep
/// or running, in how many pauses, how long in all, and the kernel frames
/// of its longest single entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelKindSummary {
    pub kind: WaitKind,
    pub thread: Sleeper,
    pub on_cpu: bool,
    pub pauses: u64,
    pub ns: u64,
    pub frames: Vec<String>,
    #[serde(skip)]
    longest_ns: u64,
}

/// Every pause of one process, summarised.
#[derive(Clone, Debug, Default)]
pub struct ProcessPauses {
    pub by_reason: BTreeMap<StwReason, ReasonStats>,
    /// The longest pauses, longest first (at most `PauseStats::worst_kept`).
    pub worst: Vec<PauseRecord>,
    /// Time in the kernel by kind, whose and asleep or running.
    pub kernel: BTreeMap<(WaitKind, Sleeper, bool), KernelKindSummary>,
}

impl ProcessPauses {
    /// Number of pauses.
    pub fn count(&self) -> u64 {
        self.by_reason.values().map(|s| s.count).sum()
    }

    /// The kernel's part by kind, most time first.
    pub fn kernel_kinds(&self) -> Vec<KernelKindSummary> {
        let mut v: Vec<KernelKindSummary> = self.kernel.values().cloned().collect();
        v.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.kind.cmp(&b.kind)));
        v
    }

    fn add_kernel(&mut self, rec: &PauseRecord) {
        let mut seen = std::collections::BTreeSet::new();
        for w in rec.kernel_waits.iter().flatten() {
            let key = (w.kind, w.thread, w.on_cpu);
            let k = self.kernel.entry(key).or_insert_with(|| KernelKindSummary {
                kind: w.kind,
                thread: w.thread,
                on_cpu: w.on_cpu,
                pauses: 0,
                ns: 0,
                frames: Vec::new(),
                longest_ns: 0,
            });
            if seen.insert(key) {
                k.pauses += 1;
            }
            k.ns += w.ns;
            if w.ns > k.longest_ns {
                k.longest_ns = w.ns;
                k.frames.clone_from(&w.frames);
            }
        }
    }

    /// Pauses and summed `duration_ns` of the GC reasons.
    pub fn gc(&self) -> (u64, u64) {
        self.by_reason
            .iter()
            .filter(|(r, _)| r.is_gc())
            .fold((0, 0), |(n, t), (_, s)| (n + s.count, t + s.total_ns))
    }
}

/// Per-process, per-reason statistics of the pauses seen.
#[derive(Debug)]
pub struct PauseStats {
    worst_kept: usize,
    processes: BTreeMap<u32, ProcessPauses>,
}

impl PauseStats {
    /// Statistics that keep the `worst_kept` longest pauses of each process.
    pub fn new(worst_kept: usize) -> PauseStats {
        PauseStats {
            worst_kept,
            processes: BTreeMap::new(),
        }
    }

    /// Account one pause.
    pub fn add(&mut self, rec: &PauseRecord) {
        let p = self.processes.entry(rec.pid).or_default();
        p.by_reason
            .entry(rec.stw_reason())
            .or_insert_with(ReasonStats::new)
            .add(rec);
        p.add_kernel(rec);
        let at = p
            .worst
            .partition_point(|w| w.duration_ns >= rec.duration_ns);
        if at < self.worst_kept {
            p.worst.insert(at, rec.clone());
            p.worst.truncate(self.worst_kept);
        }
    }

    /// The statistics of process `pid` (empty if it never paused).
    pub fn process(&self, pid: u32) -> Option<&ProcessPauses> {
        self.processes.get(&pid)
    }

    /// Every process seen, by pid.
    pub fn processes(&self) -> &BTreeMap<u32, ProcessPauses> {
        &self.processes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::pause::tests_support::record;

    #[test]
    fn processes_stay_separate_and_worst_are_kept_in_order() {
        let mut t = PauseStats::new(2);
        for (pid, d) in [(1, 10), (2, 500), (1, 30), (1, 20), (2, 400)] {
            t.add(&record(pid, 1_000, d));
        }
        let p1 = t.process(1).unwrap();
        assert_eq!(p1.count(), 3);
        assert_eq!(p1.gc(), (3, 60));
        assert_eq!(
            p1.worst.iter().map(|r| r.duration_ns).collect::<Vec<_>>(),
            vec![30, 20]
        );
        let p2 = t.process(2).unwrap();
        assert_eq!(p2.count(), 2);
        assert_eq!(p2.by_reason[&StwReason(2)].max_ns, 500);
    }

    #[test]
    fn callers_are_counted_by_site_most_first() {
        let frame = |f: &str| crate::image::Frame {
            function: f.to_owned(),
            file: String::new(),
            line: 0,
            inlined: false,
            start_line: 0,
        };
        let mut t = PauseStats::new(1);
        for (i, site) in ["main.a", "main.b", "main.b"].iter().enumerate() {
            let mut r = record(1, 1_000 * i as u64, 10);
            r.caller = Some(vec![frame("runtime.GC"), frame(site)]);
            t.add(&r);
        }
        t.add(&record(1, 9_000, 10));
        let top = t.process(1).unwrap().by_reason[&StwReason(2)].top_callers(5);
        let got: Vec<_> = top
            .iter()
            .map(|c| (c.site.function.as_str(), c.site.via.as_str(), c.pauses))
            .collect();
        assert_eq!(
            got,
            [("main.b", "runtime.GC", 2), ("main.a", "runtime.GC", 1)]
        );
    }
}
