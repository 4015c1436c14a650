//! Pure correlation of major faults with stop-the-world pause windows: no
//! kernel, no I/O, unit-tested. A fault is "in a pause" when it BEGINS inside
//! the window of a pause of the same process (any thread); it is split by
//! whether the faulting thread is the one that stopped the world.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use serde::Serialize;

/// The part of a pause record correlation needs (the pauses pipeline's
/// record converts into this).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PauseWindow {
    pub tgid: u32,
    /// The thread that stopped the world.
    pub stopper_tid: u32,
    /// Window start and end, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    pub end_ns: u64,
}

impl From<&crate::pauses::PauseRecord> for PauseWindow {
    /// The pause as Go counts it (start and duration of the record).
    fn from(p: &crate::pauses::PauseRecord) -> Self {
        PauseWindow {
            tgid: p.pid,
            stopper_tid: p.tid,
            start_ns: p.start_mono_ns,
            end_ns: p.start_mono_ns + p.duration_ns,
        }
    }
}

/// What was read back in a major fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Anonymous memory read back from swap.
    SwapIn,
    /// A file page (page cache miss).
    FileBacked,
    /// Not known: the kernel lacks what tells them apart
    /// (`filemap:mm_filemap_fault` for the tracepoint backend).
    Unknown,
}

/// One decoded, symbolized major fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub tgid: u32,
    pub tid: u32,
    /// Begin (0 when the backend did not see it) and end, CLOCK_MONOTONIC ns.
    pub begin_ns: u64,
    pub end_ns: u64,
    pub address: u64,
    pub kind: FaultKind,
    pub blocked_ns: u64,
    pub wait_own_ns: u64,
    pub wait_other_ns: u64,
    /// Symbolized user stack, innermost first (shared between faults with
    /// the same stack).
    pub stack: Arc<[String]>,
}

impl Fault {
    /// Time from fault begin to end (0 when the begin is unknown).
    pub fn duration_ns(&self) -> u64 {
        if self.begin_ns == 0 {
            0
        } else {
            self.end_ns.saturating_sub(self.begin_ns)
        }
    }

    /// When the fault happened for window matching: its begin, or its end
    /// when the begin is unknown.
    fn at_ns(&self) -> u64 {
        if self.begin_ns == 0 {
            self.end_ns
        } else {
            self.begin_ns
        }
    }

    /// The faulting function: the innermost frame that is not inlined into
    /// another (the function holding the faulting code).
    pub fn site(&self) -> &str {
        self.stack
            .iter()
            .find(|f| !f.ends_with(super::symbols::INLINED))
            .or(self.stack.first())
            .map_or("[unknown]", String::as_str)
    }
}

/// Sums over a set of faults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaultTotals {
    pub faults: u64,
    pub swap_in: u64,
    pub file_backed: u64,
    /// Faults whose kind the backend could not tell.
    pub unknown_kind: u64,
    /// Sum of fault durations (begin to end).
    pub fault_ns: u64,
    /// Time blocked inside faults = `wait_own_ns + wait_other_ns`.
    pub blocked_ns: u64,
    pub wait_own_ns: u64,
    pub wait_other_ns: u64,
}

impl FaultTotals {
    fn add(&mut self, f: &Fault) {
        self.faults += 1;
        match f.kind {
            FaultKind::SwapIn => self.swap_in += 1,
            FaultKind::FileBacked => self.file_backed += 1,
            FaultKind::Unknown => self.unknown_kind += 1,
        }
        self.fault_ns += f.duration_ns();
        self.blocked_ns += f.blocked_ns;
        self.wait_own_ns += f.wait_own_ns;
        self.wait_other_ns += f.wait_other_ns;
    }
}

/// A faulting code site: the innermost function, with one full stack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FaultSite {
    pub function: String,
    pub faults: u64,
    pub fault_ns: u64,
    /// The stack of the first fault seen at this site, innermost first.
    pub stack: Vec<String>,
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

/// The faults of one pause as its live record carries them: counts, times,
/// the stopper/other-threads split and the top sites (stacks left out).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PauseFaultStats {
    pub all: FaultTotals,
    pub stopper: FaultTotals,
    pub other_threads: FaultTotals,
    /// At most `LIVE_SITES` sites: (function, faults).
    pub top_sites: Vec<(String, u64)>,
}

/// How many sites a live pause record lists.
pub const LIVE_SITES: usize = 3;

impl From<&PauseFaults> for PauseFaultStats {
    fn from(p: &PauseFaults) -> Self {
        PauseFaultStats {
            all: p.all,
            stopper: p.stopper,
            other_threads: p.other_threads,
            top_sites: p
                .top_sites
                .iter()
                .take(LIVE_SITES)
                .map(|s| (s.function.clone(), s.faults))
                .collect(),
        }
    }
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

impl Distribution {
    fn of(values: impl Iterator<Item = u64>) -> Distribution {
        // Up to an hour in ns; larger values are clamped.
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
            .expect("valid bounds");
        for v in values {
            h.saturating_record(v);
        }
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

/// The whole report.
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
}

/// How many sites a summary lists.
pub const TOP_SITES: usize = 8;

/// Collects faults and pause windows (in any order) and correlates them.
#[derive(Default)]
pub struct FaultCorrelator {
    backend: String,
    faults: Vec<Fault>,
    windows: Vec<PauseWindow>,
}

impl FaultCorrelator {
    /// A correlator for faults of `backend` (a name for the report).
    pub fn new(backend: &str) -> Self {
        FaultCorrelator {
            backend: backend.to_owned(),
            ..Default::default()
        }
    }

    pub fn add_fault(&mut self, fault: Fault) {
        self.faults.push(fault);
    }

    pub fn add_window(&mut self, window: PauseWindow) {
        self.windows.push(window);
    }

    /// Faults seen so far.
    pub fn faults(&self) -> &[Fault] {
        &self.faults
    }

    /// The faults seen so far that fall in `w` (before `add_window(w)`):
    /// what a live pause line shows.
    pub fn pause_faults(&self, w: &PauseWindow) -> PauseFaults {
        let one = [*w];
        let faults: Vec<&Fault> = self
            .faults
            .iter()
            .filter(|f| f.tgid == w.tgid && window_of(&one, f.at_ns()).is_some())
            .collect();
        pause_faults(w, &faults)
    }

    /// Correlate everything collected so far.
    pub fn summary(&self) -> FaultSummary {
        let mut windows: BTreeMap<u32, Vec<PauseWindow>> = BTreeMap::new();
        for w in &self.windows {
            windows.entry(w.tgid).or_default().push(*w);
        }
        for ws in windows.values_mut() {
            ws.sort_by_key(|w| w.start_ns);
        }
        // Index of the window (per process) each fault falls in.
        let mut per_pause: BTreeMap<(u32, usize), Vec<&Fault>> = BTreeMap::new();
        let mut per_process: BTreeMap<u32, (Vec<&Fault>, Vec<&Fault>)> = BTreeMap::new();
        for f in &self.faults {
            let slot = per_process.entry(f.tgid).or_default();
            match windows.get(&f.tgid).and_then(|ws| window_of(ws, f.at_ns())) {
                Some(i) => {
                    per_pause.entry((f.tgid, i)).or_default().push(f);
                    slot.0.push(f);
                }
                None => slot.1.push(f),
            }
        }
        for tgid in windows.keys() {
            per_process.entry(*tgid).or_default();
        }

        let mut pauses = Vec::new();
        for (tgid, ws) in &windows {
            for (i, w) in ws.iter().enumerate() {
                let faults = per_pause.get(&(*tgid, i)).map_or(&[][..], Vec::as_slice);
                pauses.push(pause_faults(w, faults));
            }
        }
        pauses.sort_by_key(|p| (p.window.start_ns, p.window.tgid));

        // Durations, where the begin is known, inside and outside pauses.
        let durations = |inside: bool| {
            per_process
                .values()
                .flat_map(move |(i, o)| if inside { i } else { o })
                .filter(|f| f.begin_ns != 0)
                .map(|f| f.duration_ns())
                .collect::<Vec<_>>()
        };
        let (in_ns, out_ns) = (durations(true), durations(false));
        let processes = per_process
            .into_iter()
            .map(|(tgid, (inside, outside))| {
                let ws = windows.get(&tgid).map_or(&[][..], Vec::as_slice);
                let mut pf = ProcessFaults {
                    tgid,
                    all: FaultTotals::default(),
                    in_pauses: FaultTotals::default(),
                    outside_pauses: FaultTotals::default(),
                    pauses: ws.len() as u64,
                    pauses_with_faults: per_pause.keys().filter(|(t, _)| *t == tgid).count() as u64,
                    top_sites_in_pauses: top_sites(&inside),
                    top_sites_outside_pauses: top_sites(&outside),
                };
                for f in &inside {
                    pf.all.add(f);
                    pf.in_pauses.add(f);
                }
                for f in &outside {
                    pf.all.add(f);
                    pf.outside_pauses.add(f);
                }
                pf
            })
            .collect();
        FaultSummary {
            backend: self.backend.clone(),
            processes,
            faults_per_pause: Distribution::of(pauses.iter().map(|p| p.all.faults)),
            fault_ns_in_pauses: Distribution::of(in_ns.into_iter()),
            fault_ns_outside_pauses: Distribution::of(out_ns.into_iter()),
            pauses,
        }
    }
}

/// Totals, thread split and sites of `faults`, all inside `w`.
fn pause_faults(w: &PauseWindow, faults: &[&Fault]) -> PauseFaults {
    let mut p = PauseFaults {
        window: *w,
        duration_ns: w.end_ns.saturating_sub(w.start_ns),
        all: FaultTotals::default(),
        stopper: FaultTotals::default(),
        other_threads: FaultTotals::default(),
        top_sites: top_sites(faults),
    };
    for f in faults {
        p.all.add(f);
        if f.tid == w.stopper_tid {
            p.stopper.add(f);
        } else {
            p.other_threads.add(f);
        }
    }
    p
}

/// The window (sorted by start) containing `t`, start inclusive, end exclusive.
fn window_of(windows: &[PauseWindow], t: u64) -> Option<usize> {
    // The last window starting at or before t.
    let i = windows
        .partition_point(|w| w.start_ns <= t)
        .checked_sub(1)?;
    (t < windows[i].end_ns).then_some(i)
}

/// Sites by fault count (then time), at most `TOP_SITES`.
fn top_sites(faults: &[&Fault]) -> Vec<FaultSite> {
    let mut sites: HashMap<&str, FaultSite> = HashMap::new();
    for f in faults {
        let s = sites.entry(f.site()).or_insert_with(|| FaultSite {
            function: f.site().to_owned(),
            faults: 0,
            fault_ns: 0,
            stack: f.stack.to_vec(),
        });
        s.faults += 1;
        s.fault_ns += f.duration_ns();
    }
    let mut sites: Vec<_> = sites.into_values().collect();
    sites.sort_by(|a, b| {
        (b.faults, b.fault_ns, &a.function).cmp(&(a.faults, a.fault_ns, &b.function))
    });
    sites.truncate(TOP_SITES);
    sites
}

#[cfg(test)]
mod tests {
    use super::*;

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
            stack: vec![site.to_owned(), "runtime.gcStart".to_owned()].into(),
        }
    }

    fn window(tgid: u32, stopper: u32, start: u64, end: u64) -> PauseWindow {
        PauseWindow {
            tgid,
            stopper_tid: stopper,
            start_ns: start,
            end_ns: end,
        }
    }

    #[test]
    fn a_live_pause_sees_the_faults_already_in() {
        let mut c = FaultCorrelator::new("test");
        c.add_fault(fault(1, 10, 1_500, 1_900, "runtime.markrootSpans"));
        c.add_fault(fault(1, 11, 1_600, 1_800, "runtime.markrootSpans"));
        c.add_fault(fault(1, 11, 900, 1_100, "main.work"));
        c.add_fault(fault(2, 20, 1_600, 1_700, "main.work"));
        let w = window(1, 10, 1_000, 2_000);
        let live = PauseFaultStats::from(&c.pause_faults(&w));
        assert_eq!(live.all.faults, 2);
        assert_eq!((live.stopper.faults, live.other_threads.faults), (1, 1));
        assert_eq!(live.all.fault_ns, 600);
        assert_eq!(
            live.top_sites,
            vec![("runtime.markrootSpans".to_owned(), 2)]
        );
        c.add_window(w);
        assert_eq!(c.summary().pauses[0].all, live.all);
    }

    #[test]
    fn faults_count_in_the_pause_where_they_begin() {
        let mut c = FaultCorrelator::new("test");
        c.add_window(window(1, 10, 1_000, 2_000));
        c.add_window(window(1, 10, 5_000, 6_000));
        // Begins inside, ends after the window: still in the pause.
        c.add_fault(fault(1, 10, 1_500, 2_500, "runtime.(*spanSet).reset"));
        // Begins before the window, ends inside: not in it.
        c.add_fault(fault(1, 10, 900, 1_100, "main.work"));
        // Exactly at the start: in; exactly at the end: out.
        c.add_fault(fault(1, 11, 5_000, 5_100, "runtime.markrootSpans"));
        c.add_fault(fault(1, 11, 6_000, 6_100, "main.work"));
        // Another process in the same time: never in process 1's pauses.
        c.add_fault(fault(2, 20, 1_600, 1_700, "main.work"));
        let s = c.summary();
        assert_eq!(s.pauses.len(), 2);
        assert_eq!(s.pauses[0].all.faults, 1);
        assert_eq!(s.pauses[0].stopper.faults, 1);
        assert_eq!(s.pauses[0].all.fault_ns, 1_000);
        assert_eq!(
            s.pauses[0].top_sites[0].function,
            "runtime.(*spanSet).reset"
        );
        assert_eq!(s.pauses[1].all.faults, 1);
        assert_eq!(s.pauses[1].other_threads.faults, 1);
        assert_eq!(s.pauses[1].stopper.faults, 0);
        let p1 = &s.processes[0];
        assert_eq!((p1.tgid, p1.all.faults, p1.in_pauses.faults), (1, 4, 2));
        assert_eq!(p1.outside_pauses.faults, 2);
        assert_eq!(p1.pauses_with_faults, 2);
        assert_eq!(p1.top_sites_outside_pauses[0].function, "main.work");
        assert_eq!(p1.top_sites_outside_pauses[0].faults, 2);
        assert_eq!(s.faults_per_pause.count, 2);
        assert_eq!(s.faults_per_pause.max, 1);
        assert_eq!(s.fault_ns_in_pauses.count, 2);
        assert_eq!(s.fault_ns_outside_pauses.count, 3);
        assert_eq!(s.fault_ns_in_pauses.max, 1_000);
        // Large values are kept (3 significant digits), not clamped.
        let d = Distribution::of([40_000_000u64, 100_000].into_iter());
        assert_eq!(d.max / 1_000_000, 40);
        assert_eq!(d.p50 / 1_000, 100);
        let p2 = &s.processes[1];
        assert_eq!((p2.tgid, p2.in_pauses.faults, p2.pauses), (2, 0, 0));
    }

    #[test]
    fn site_is_the_function_holding_inlined_code() {
        let mut f = fault(1, 1, 1, 2, "x");
        f.stack = vec![
            "internal/runtime/atomic.(*Uint32).Load (inlined)".to_owned(),
            "runtime.(*spanSet).reset".to_owned(),
            "runtime.finishsweep_m".to_owned(),
        ]
        .into();
        assert_eq!(f.site(), "runtime.(*spanSet).reset");
    }

    #[test]
    fn unknown_begin_falls_back_to_end_and_zero_duration() {
        let mut c = FaultCorrelator::new("test");
        c.add_window(window(1, 10, 1_000, 2_000));
        let mut f = fault(1, 10, 1_200, 1_300, "x");
        f.begin_ns = 0;
        c.add_fault(f);
        let s = c.summary();
        assert_eq!(s.pauses[0].all.faults, 1);
        assert_eq!(s.pauses[0].all.fault_ns, 0);
    }

    #[test]
    fn totals_split_kinds_and_waits() {
        let mut c = FaultCorrelator::new("test");
        let mut a = fault(1, 10, 10, 110, "a");
        a.wait_own_ns = 30;
        a.wait_other_ns = 20;
        a.blocked_ns = 50;
        let mut b = fault(1, 11, 200, 260, "b");
        b.kind = FaultKind::FileBacked;
        b.wait_own_ns = 0;
        b.wait_other_ns = 40;
        b.blocked_ns = 40;
        c.add_fault(a);
        c.add_fault(b);
        let t = c.summary().processes[0].all;
        assert_eq!((t.faults, t.swap_in, t.file_backed), (2, 1, 1));
        assert_eq!((t.fault_ns, t.blocked_ns), (160, 90));
        assert_eq!((t.wait_own_ns, t.wait_other_ns), (30, 60));
        assert_eq!(t.blocked_ns, t.wait_own_ns + t.wait_other_ns);
    }

    #[test]
    fn no_windows_means_everything_is_outside() {
        let mut c = FaultCorrelator::new("test");
        c.add_fault(fault(1, 10, 10, 20, "a"));
        let s = c.summary();
        assert!(s.pauses.is_empty());
        assert_eq!(s.processes[0].outside_pauses.faults, 1);
        assert_eq!(s.processes[0].pauses_with_faults, 0);
    }
}
