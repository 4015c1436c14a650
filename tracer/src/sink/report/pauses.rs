//! Pause statistics for the summary: per process and reason, an HDR
//! histogram of durations, exact count, total and maximum, and the longest
//! pauses.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::engine::pause::{PauseRecord, StwReason};

/// Distribution of one reason's pause durations.
#[derive(Clone, Debug)]
pub struct ReasonStats {
    pub count: u64,
    pub total_ns: u64,
    /// Exact (the histogram rounds to 3 significant digits).
    pub max_ns: u64,
    pub histogram: Histogram<u64>,
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
        }
    }

    fn add(&mut self, ns: u64) {
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
}

/// Every pause of one process, summarised.
#[derive(Clone, Debug, Default)]
pub struct ProcessPauses {
    pub by_reason: BTreeMap<StwReason, ReasonStats>,
    /// The longest pauses, longest first (at most `PauseStats::worst_kept`).
    pub worst: Vec<PauseRecord>,
}

impl ProcessPauses {
    /// Number of pauses.
    pub fn count(&self) -> u64 {
        self.by_reason.values().map(|s| s.count).sum()
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
            .add(rec.duration_ns);
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
    use crate::engine::correlate::tests_support::record;

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
}
