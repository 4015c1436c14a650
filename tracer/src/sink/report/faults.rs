//! The fault part of the report: per process totals in and outside pauses,
//! top sites, distributions, and every pause with its faults. Built as the
//! stream goes (the correlator already decided each fault's pause).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;
use tracer_common::fault::{FaultCounts, FaultTally};

use crate::model::{
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
    /// The start as Unix time (what text output shows).
    pub start_unix_ns: u64,
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

/// Faults of one process over the whole trace. `in_pauses` comes from the
/// fault events (every fault inside a pause is sent). Where the kernel
/// counted them (`counted_in_kernel`), `all` is its count, every major fault
/// whether or not its event was sent, and `outside_pauses` is `all` less
/// `in_pauses`; the sites and distributions outside pauses come from the
/// events that were sent (`outside_pauses_sent`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessFaults {
    pub tgid: u32,
    pub all: FaultTotals,
    pub in_pauses: FaultTotals,
    pub outside_pauses: FaultTotals,
    /// The totals above are the kernel's counts.
    pub counted_in_kernel: bool,
    /// Fault events received outside pauses (each with its stack): all of
    /// `outside_pauses.faults` but `shed`.
    pub outside_pauses_sent: u64,
    /// Faults outside pauses counted but not sent, while the ring buffer was
    /// more than half full (that half is kept for faults inside pauses).
    pub shed: u64,
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
    /// The kernel's counts, when it keeps them.
    kernel: Option<FaultCounts>,
    pauses: u64,
    pauses_with_faults: u64,
    sites_in: SiteCounts,
    sites_out: SiteCounts,
}

/// Builds the `FaultSummary` from the stream.
#[derive(Default)]
pub struct FaultReport {
    backend: String,
    /// The backend marks every file-backed fault: an unmarked one is a
    /// swap-in (as `Fault::from_event` decides for events).
    file_faults_seen: bool,
    processes: BTreeMap<u32, ProcessTotals>,
    pauses: Vec<PauseFaults>,
    pauses_not_listed: u64,
    per_pause: Recorder,
    ns_in: Recorder,
    ns_out: Recorder,
}

impl FaultReport {
    /// Name the backend that produced the faults.
    pub fn set_backend(&mut self, name: &str, file_faults_seen: bool) {
        name.clone_into(&mut self.backend);
        self.file_faults_seen = file_faults_seen;
    }

    /// The kernel's counts of a process's faults so far (cumulative).
    pub fn counted(&mut self, pid: u32, counts: &FaultCounts) {
        self.processes.entry(pid).or_default().kernel = Some(*counts);
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
            start_unix_ns: r.start_unix_ns,
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
                    let mut outside = t.outside;
                    if let Some(k) = &t.kernel {
                        // Never fewer than the events received: a poll
                        // can trail the last events.
                        all = max_totals(&self.totals(&k.all()), &all);
                        outside = sub_totals(&all, &t.in_pauses);
                    }
                    ProcessFaults {
                        tgid,
                        all,
                        in_pauses: t.in_pauses,
                        outside_pauses: outside,
                        counted_in_kernel: t.kernel.is_some(),
                        outside_pauses_sent: t.outside.faults,
                        shed: t.kernel.map_or(0, |k| k.shed.faults),
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

impl FaultReport {
    /// A kernel tally as report totals.
    fn totals(&self, t: &FaultTally) -> FaultTotals {
        let (swap_in, unknown_kind) = if self.file_faults_seen {
            (t.swap_in + t.unknown_kind, 0)
        } else {
            (t.swap_in, t.unknown_kind)
        };
        FaultTotals {
            faults: t.faults,
            swap_in,
            file_backed: t.file_backed,
            unknown_kind,
            fault_ns: t.fault_ns,
            blocked_ns: t.blocked_ns,
            wait_own_ns: t.wait_own_ns,
            wait_other_ns: t.wait_other_ns,
        }
    }
}

/// `a - b`, field by field (never below 0).
fn sub_totals(a: &FaultTotals, b: &FaultTotals) -> FaultTotals {
    FaultTotals {
        faults: a.faults.saturating_sub(b.faults),
        swap_in: a.swap_in.saturating_sub(b.swap_in),
        file_backed: a.file_backed.saturating_sub(b.file_backed),
        unknown_kind: a.unknown_kind.saturating_sub(b.unknown_kind),
        fault_ns: a.fault_ns.saturating_sub(b.fault_ns),
        blocked_ns: a.blocked_ns.saturating_sub(b.blocked_ns),
        wait_own_ns: a.wait_own_ns.saturating_sub(b.wait_own_ns),
        wait_other_ns: a.wait_other_ns.saturating_sub(b.wait_other_ns),
    }
}

/// The larger of two totals, by fault count.
fn max_totals(a: &FaultTotals, b: &FaultTotals) -> FaultTotals {
    if a.faults >= b.faults { *a } else { *b }
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
    use crate::{image::Frame, model::fault::FaultKind};

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
            pcs: Arc::from([]),
        }
    }

    fn pause(pid: u32, stopper: u32, start: u64, end: u64, faults: Vec<Fault>) -> ObservedPause {
        let mut record = crate::model::pause::tests_support::record(pid, start, end - start);
        record.tid = stopper;
        ObservedPause { record, faults }
    }

    #[test]
    fn totals_sites_and_distributions() {
        let mut r = FaultReport::default();
        r.set_backend("test", false);
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
    fn kernel_counts_give_the_totals_and_events_the_pauses() {
        use tracer_common::fault::FaultTally;
        let mut r = FaultReport::default();
        r.set_backend("tracepoint", true);
        r.pause(&pause(
            1,
            10,
            1_000,
            2_000,
            vec![fault(1, 10, 1_500, 2_500, "runtime.(*spanSet).reset")],
        ));
        r.fault(
            &fault(1, 11, 6_000, 6_100, "main.work"),
            Membership::Outside,
        );
        // The kernel counted 10 more outside, 7 of them shed; unmarked ones
        // are swap-ins where the backend marks every file-backed fault.
        let tally = |faults, unknown_kind| FaultTally {
            faults,
            unknown_kind,
            fault_ns: faults * 100,
            ..FaultTally::default()
        };
        r.counted(
            1,
            &FaultCounts {
                in_pause: tally(1, 1),
                outside: tally(11, 11),
                shed: tally(7, 7),
            },
        );
        let p = &r.summary().processes[0];
        assert!(p.counted_in_kernel);
        assert_eq!(
            (p.all.faults, p.all.swap_in, p.all.unknown_kind),
            (12, 12, 0)
        );
        assert_eq!(p.in_pauses.faults, 1);
        assert_eq!(p.outside_pauses.faults, 11);
        assert_eq!((p.outside_pauses_sent, p.shed), (1, 7));
        // A count that trails the events never lowers the totals.
        r.counted(1, &FaultCounts::default());
        let p = &r.summary().processes[0];
        assert_eq!((p.all.faults, p.outside_pauses.faults), (2, 1));
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
