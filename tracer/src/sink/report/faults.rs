//! The fault part of the report: per process totals in and outside pauses,
//! top sites, distributions, and every pause with its faults. Built as the
//! stream goes (the correlator already decided each fault's pause).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::engine::{
    fault::{Fault, FaultSite, FaultTotals, SiteCounts},
    observed::{Membership, ObservedPause},
};

/// How many sites a summary lists.
pub const TOP_SITES: usize = 8;
/// Pauses listed with their faults; a longer trace keeps the first ones and
/// says how many more there were.
pub const MAX_PAUSES: usize = 100_000;

/// A pause's window as the report names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PauseWindow {
    pub tgid: u32,
    /// The thread that stopped the world.
    pub stopper_tid: u32,
    /// Window start and end, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Faults inside one pause.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PauseFaults {
    pub window: PauseWindow,
    pub duration_ns: u64,
    pub all: FaultTotals,
    /// Faults of the thread that stopped the world.
    pub stopper: FaultTotals,
    /// Faults of the process's other threads.
    pub other_threads: FaultTotals,
    pub top_sites: Vec<FaultSite>,
}

/// Faults of one process over the whole trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessFaults {
    pub tgid: u32,
    pub all: FaultTotals,
    pub in_pauses: FaultTotals,
    pub outside_pauses: FaultTotals,
    pub pauses: u64,
    pub pauses_with_faults: u64,
    pub top_sites_in_pauses: Vec<FaultSite>,
    pub top_sites_outside_pauses: Vec<FaultSite>,
}

/// A distribution, from an HDR histogram (3 significant digits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Distribution {
    pub count: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

/// Values recorded for a `Distribution`: 1 ns to an hour, larger clamped.
#[derive(Clone, Debug)]
struct Recorder(Histogram<u64>);

impl Default for Recorder {
    fn default() -> Self {
        Recorder(Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds"))
    }
}

impl Recorder {
    fn record(&mut self, v: u64) {
        self.0.saturating_record(v);
    }

    fn distribution(&self) -> Distribution {
        let h = &self.0;
        if h.is_empty() {
            return Distribution::default();
        }
        Distribution {
            count: h.len(),
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        }
    }
}

/// The fault summary of a trace (`gostw faults --json`, `faults` of the
/// attach/run summary).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaultSummary {
    /// The kernel backend that produced the faults.
    pub backend: String,
    pub processes: Vec<ProcessFaults>,
    /// Major faults per pause, over every pause.
    pub faults_per_pause: Distribution,
    /// Duration (begin to end, ns) of faults inside pauses.
    pub fault_ns_in_pauses: Distribution,
    /// Duration (ns) of faults outside pauses.
    pub fault_ns_outside_pauses: Distribution,
    /// Every pause, in time order, with its faults (zero for most).
    pub pauses: Vec<PauseFaults>,
    /// Pauses beyond `MAX_PAUSES`, counted but not listed.
    pub pauses_not_listed: u64,
}

#[derive(Default)]
struct ProcessTotals {
    in_pauses: FaultTotals,
    outside: FaultTotals,
    pauses: u64,
    pauses_with_faults: u64,
    sites_in: SiteCounts,
    sites_out: SiteCounts,
}

/// Builds the `FaultSummary` from the stream.
#[derive(Default)]
pub struct FaultReport {
    backend: String,
    processes: BTreeMap<u32, ProcessTotals>,
    pauses: Vec<PauseFaults>,
    pauses_not_listed: u64,
    per_pause: Recorder,
    ns_in: Recorder,
    ns_out: Recorder,
}

impl FaultReport {
    /// Name the backend that produced the faults.
    pub fn set_backend(&mut self, name: &str) {
        name.clone_into(&mut self.backend);
    }

    /// A process is traced (it is listed even without faults).
    pub fn process(&mut self, pid: u32) {
        self.processes.entry(pid).or_default();
    }

    /// A pause and the faults inside it.
    pub fn pause(&mut self, p: &ObservedPause) {
        let r = &p.record;
        let window = PauseWindow {
            tgid: r.pid,
            stopper_tid: r.tid,
            start_ns: r.start_mono_ns,
            end_ns: r.start_mono_ns + r.duration_ns,
        };
        let mut entry = PauseFaults {
            window,
            duration_ns: r.duration_ns,
            all: FaultTotals::default(),
            stopper: FaultTotals::default(),
            other_threads: FaultTotals::default(),
            top_sites: Vec::new(),
        };
        let totals = self.processes.entry(r.pid).or_default();
        let mut sites = SiteCounts::default();
        for f in &p.faults {
            entry.all.add(f);
            if f.tid == r.tid {
                entry.stopper.add(f);
            } else {
                entry.other_threads.add(f);
            }
            sites.add(f);
            totals.in_pauses.add(f);
            totals.sites_in.add(f);
            if f.begin_ns != 0 {
                self.ns_in.record(f.duration_ns());
            }
        }
        entry.top_sites = sites.top(TOP_SITES);
        totals.pauses += 1;
        totals.pauses_with_faults += u64::from(!p.faults.is_empty());
        self.per_pause.record(p.faults.len() as u64);
        if self.pauses.len() < MAX_PAUSES {
            self.pauses.push(entry);
        } else {
            self.pauses_not_listed += 1;
        }
    }

    /// A fault that is not in a pause record.
    pub fn fault(&mut self, f: &Fault, membership: Membership) {
        let totals = self.processes.entry(f.tgid).or_default();
        let in_pause = membership == Membership::LateInPause;
        if in_pause {
            totals.in_pauses.add(f);
            totals.sites_in.add(f);
        } else {
            totals.outside.add(f);
            totals.sites_out.add(f);
        }
        if f.begin_ns != 0 {
            if in_pause {
                &mut self.ns_in
            } else {
                &mut self.ns_out
            }
            .record(f.duration_ns());
        }
    }

    /// The summary so far.
    pub fn summary(&self) -> FaultSummary {
        let mut pauses = self.pauses.clone();
        pauses.sort_by_key(|p| (p.window.start_ns, p.window.tgid));
        FaultSummary {
            backend: self.backend.clone(),
            processes: self
                .processes
                .iter()
                .map(|(&tgid, t)| {
                    let mut all = t.in_pauses;
                    add_totals(&mut all, &t.outside);
                    ProcessFaults {
                        tgid,
                        all,
                        in_pauses: t.in_pauses,
                        outside_pauses: t.outside,
                        pauses: t.pauses,
                        pauses_with_faults: t.pauses_with_faults,
                        top_sites_in_pauses: t.sites_in.top(TOP_SITES),
                        top_sites_outside_pauses: t.sites_out.top(TOP_SITES),
                    }
                })
                .collect(),
            faults_per_pause: self.per_pause.distribution(),
            fault_ns_in_pauses: self.ns_in.distribution(),
            fault_ns_outside_pauses: self.ns_out.distribution(),
            pauses,
            pauses_not_listed: self.pauses_not_listed,
        }
    }
}

fn add_totals(a: &mut FaultTotals, b: &FaultTotals) {
    a.faults += b.faults;
    a.swap_in += b.swap_in;
    a.file_backed += b.file_backed;
    a.unknown_kind += b.unknown_kind;
    a.fault_ns += b.fault_ns;
    a.blocked_ns += b.blocked_ns;
    a.wait_own_ns += b.wait_own_ns;
    a.wait_other_ns += b.wait_other_ns;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{engine::fault::FaultKind, image::Frame};

    fn fault(tgid: u32, tid: u32, begin: u64, end: u64, site: &str) -> Fault {
        Fault {
            tgid,
            tid,
            begin_ns: begin,
            end_ns: end,
            address: 0x1000,
            kind: FaultKind::SwapIn,
            blocked_ns: (end - begin) / 2,
            wait_own_ns: (end - begin) / 2,
            wait_other_ns: 0,
            stack: Arc::from(vec![
                Frame {
                    function: site.into(),
                    file: String::new(),
                    line: 0,
                    inlined: false,
                    start_line: 0,
                },
                Frame {
                    function: "runtime.gcStart".into(),
                    file: String::new(),
                    line: 0,
                    inlined: false,
                    start_line: 0,
                },
            ]),
        }
    }

    fn pause(pid: u32, stopper: u32, start: u64, end: u64, faults: Vec<Fault>) -> ObservedPause {
        let mut record = crate::engine::correlate::tests_support::record(pid, start, end - start);
        record.tid = stopper;
        ObservedPause { record, faults }
    }

    #[test]
    fn totals_sites_and_distributions() {
        let mut r = FaultReport::default();
        r.set_backend("test");
        r.pause(&pause(
            1,
            10,
            1_000,
            2_000,
            vec![fault(1, 10, 1_500, 2_500, "runtime.(*spanSet).reset")],
        ));
        r.pause(&pause(
            1,
            10,
            5_000,
            6_000,
            vec![fault(1, 11, 5_000, 5_100, "runtime.markrootSpans")],
        ));
        r.fault(&fault(1, 10, 900, 1_100, "main.work"), Membership::Outside);
        r.fault(
            &fault(1, 11, 6_000, 6_100, "main.work"),
            Membership::Outside,
        );
        r.fault(
            &fault(2, 20, 1_600, 1_700, "main.work"),
            Membership::Outside,
        );
        let s = r.summary();
        assert_eq!(s.backend, "test");
        assert_eq!(s.pauses.len(), 2);
        assert_eq!((s.pauses[0].all.faults, s.pauses[0].stopper.faults), (1, 1));
        assert_eq!(s.pauses[0].all.fault_ns, 1_000);
        assert_eq!(
            s.pauses[0].top_sites[0].function,
            "runtime.(*spanSet).reset"
        );
        assert_eq!(
            (s.pauses[1].other_threads.faults, s.pauses[1].stopper.faults),
            (1, 0)
        );
        let p1 = &s.processes[0];
        assert_eq!((p1.tgid, p1.all.faults, p1.in_pauses.faults), (1, 4, 2));
        assert_eq!(p1.outside_pauses.faults, 2);
        assert_eq!(p1.pauses_with_faults, 2);
        assert_eq!(p1.top_sites_outside_pauses[0].function, "main.work");
        assert_eq!(p1.top_sites_outside_pauses[0].faults, 2);
        assert_eq!((s.faults_per_pause.count, s.faults_per_pause.max), (2, 1));
        assert_eq!(
            (s.fault_ns_in_pauses.count, s.fault_ns_outside_pauses.count),
            (2, 3)
        );
        assert_eq!(s.fault_ns_in_pauses.max, 1_000);
        let p2 = &s.processes[1];
        assert_eq!((p2.tgid, p2.in_pauses.faults, p2.pauses), (2, 0, 0));
        // Large values are kept (3 significant digits), not clamped.
        let mut d = Recorder::default();
        d.record(40_000_000);
        d.record(100_000);
        let d = d.distribution();
        assert_eq!((d.max / 1_000_000, d.p50 / 1_000), (40, 100));
    }

    #[test]
    fn a_late_fault_counts_in_pauses_but_not_in_a_pause_record() {
        let mut r = FaultReport::default();
        r.pause(&pause(1, 10, 1_000, 2_000, Vec::new()));
        r.fault(
            &fault(1, 11, 1_200, 90_000_000, "x"),
            Membership::LateInPause,
        );
        let s = r.summary();
        assert_eq!(s.processes[0].in_pauses.faults, 1);
        assert_eq!(s.pauses[0].all.faults, 0);
        assert_eq!(s.processes[0].pauses_with_faults, 0);
    }
}
