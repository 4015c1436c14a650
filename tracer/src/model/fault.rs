//! Major page faults, decoded: what was read back, how long the thread
//! waited and on whose read, and the symbolized stack. A fault belongs to a
//! pause when it BEGINS inside the pause's window (any thread of the
//! process); the correlator decides that, this module only describes faults.

use std::sync::Arc;

use serde::Serialize;
use tracer_common::fault::FaultEvent;

use crate::image::Frame;

/// What was read back in a major fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
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

impl FaultKind {
    /// Every kind, in the order the metrics list them.
    pub const ALL: [FaultKind; 3] = [FaultKind::SwapIn, FaultKind::FileBacked, FaultKind::Unknown];

    /// The `backing` label of the metrics and profiles.
    pub fn backing_label(self) -> &'static str {
        match self {
            FaultKind::SwapIn => "swap",
            FaultKind::FileBacked => "file",
            FaultKind::Unknown => "unknown",
        }
    }
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
    pub stack: Arc<[Frame]>,
    /// The stack's addresses as the kernel read them (runtime addresses,
    /// innermost first), one per location of `stack`: each location is a
    /// run of inlined frames closed by a non-inlined one. Empty if unknown.
    pub pcs: Arc<[u64]>,
}

impl Fault {
    /// A fault from its kernel event and its (already symbolized) stack.
    /// `file_faults_seen`: the backend marks every file-backed fault, so an
    /// unmarked one is a swap-in (false when `filemap:mm_filemap_fault` is
    /// missing).
    pub fn from_event(ev: &FaultEvent, stack: Arc<[Frame]>, file_faults_seen: bool) -> Fault {
        let kind = if ev.flags & FaultEvent::FLAG_FILE != 0 {
            FaultKind::FileBacked
        } else if ev.flags & FaultEvent::FLAG_SWAP != 0 || file_faults_seen {
            // A major fault that is not a file read is anonymous memory (or
            // shmem) read back from swap.
            FaultKind::SwapIn
        } else {
            FaultKind::Unknown
        };
        Fault {
            tgid: ev.header.tgid,
            tid: ev.header.tid,
            begin_ns: ev.begin_ns,
            end_ns: ev.header.ts_ns,
            address: ev.address,
            kind,
            blocked_ns: ev.blocked_ns,
            wait_own_ns: ev.wait_own_ns,
            wait_other_ns: ev.wait_other_ns,
            stack,
            pcs: Arc::from([]),
        }
    }

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
    pub fn at_ns(&self) -> u64 {
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
            .find(|f| !f.inlined)
            .or(self.stack.first())
            .map_or("[unknown]", |f| f.function.as_str())
    }

    /// Whether the larger part of the blocked time waited on another
    /// thread's read (or a page lock it held).
    pub fn waited_on_other(&self) -> bool {
        self.wait_other_ns > self.wait_own_ns
    }
}

/// A frame as the fault report's stacks print it (`function`, marked when
/// inlined into the next frame).
pub fn frame_label(f: &Frame) -> String {
    if f.inlined {
        format!("{} (inlined)", f.function)
    } else {
        f.function.clone()
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
    /// Count one more fault.
    pub fn add(&mut self, f: &Fault) {
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

/// Fault sites counted as faults arrive.
#[derive(Clone, Debug, Default)]
pub struct SiteCounts(std::collections::HashMap<String, FaultSite>);

impl SiteCounts {
    /// Count one more fault at its site (the first fault's stack is kept).
    pub fn add(&mut self, f: &Fault) {
        let s = self
            .0
            .entry(f.site().to_owned())
            .or_insert_with(|| FaultSite {
                function: f.site().to_owned(),
                faults: 0,
                fault_ns: 0,
                stack: f.stack.iter().map(frame_label).collect(),
            });
        s.faults += 1;
        s.fault_ns += f.duration_ns();
    }

    /// Sites by fault count (then time), at most `max`.
    pub fn top(&self, max: usize) -> Vec<FaultSite> {
        let mut sites: Vec<_> = self.0.values().cloned().collect();
        sites.sort_by(|a, b| {
            (b.faults, b.fault_ns, &a.function).cmp(&(a.faults, a.fault_ns, &b.function))
        });
        sites.truncate(max);
        sites
    }
}

/// Sites of `faults` by fault count (then time), at most `max`.
pub fn top_sites<'a>(faults: impl IntoIterator<Item = &'a Fault>, max: usize) -> Vec<FaultSite> {
    let mut sites = SiteCounts::default();
    for f in faults {
        sites.add(f);
    }
    sites.top(max)
}

/// The faults of one pause as its record carries them: counts, times, the
/// stopper/other-threads split and the top sites (stacks left out).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PauseFaultStats {
    pub all: FaultTotals,
    /// Faults of the thread that stopped the world.
    pub stopper: FaultTotals,
    /// Faults of the process's other threads.
    pub other_threads: FaultTotals,
    /// At most `LIVE_SITES` sites: (function, faults).
    pub top_sites: Vec<(String, u64)>,
    /// By the phase they began in, where the pause's phases are known
    /// (`engine::explain`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_phase: Option<Box<PhaseFaults>>,
}

/// How many sites a pause record lists.
pub const LIVE_SITES: usize = 3;

impl PauseFaultStats {
    /// The stats of `faults`, all inside a pause stopped by `stopper_tid`.
    pub fn of(stopper_tid: u32, faults: &[Fault]) -> PauseFaultStats {
        let mut s = PauseFaultStats {
            top_sites: top_sites(faults, LIVE_SITES)
                .into_iter()
                .map(|s| (s.function, s.faults))
                .collect(),
            ..Default::default()
        };
        for f in faults {
            s.all.add(f);
            if f.tid == stopper_tid {
                s.stopper.add(f);
            } else {
                s.other_threads.add(f);
            }
        }
        s
    }
}

/// Major faults of a pause by the phase they began in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PhaseFaults {
    pub stopping: FaultTotals,
    pub stopped: FaultTotals,
    /// After the stopping thread began handing Ps back: these threads ran
    /// again and did not lengthen the pause.
    pub restarting: FaultTotals,
}

#[cfg(test)]
mod tests {
    use tracer_common::{event::EventHeader, event::EventKind, fault::Backend};

    use super::*;

    fn event(flags: u32) -> FaultEvent {
        FaultEvent {
            header: EventHeader {
                kind: EventKind::Fault as u32,
                tgid: 7,
                tid: 8,
                cpu: 1,
                ts_ns: 5_000,
            },
            begin_ns: 1_000,
            address: 0xc000_0000,
            ip: 0x401000,
            blocked_ns: 3_000,
            wait_own_ns: 1_000,
            wait_other_ns: 2_000,
            user_stack_len: -14,
            flags,
            reads_issued: 1,
            backend: Backend::Tracepoint as u32,
        }
    }

    fn frame(name: &str, inlined: bool) -> Frame {
        Frame {
            function: name.into(),
            file: String::new(),
            line: 0,
            inlined,
            start_line: 0,
        }
    }

    #[test]
    fn kinds_follow_flags_and_the_filemap_tracepoint() {
        let none: Arc<[Frame]> = Arc::from(Vec::new());
        let f = Fault::from_event(&event(FaultEvent::FLAG_FILE), none.clone(), false);
        assert_eq!(f.kind, FaultKind::FileBacked);
        assert_eq!((f.tgid, f.tid, f.begin_ns, f.end_ns), (7, 8, 1_000, 5_000));
        assert_eq!(f.duration_ns(), 4_000);
        assert!(f.waited_on_other());
        assert_eq!(
            Fault::from_event(&event(0), none.clone(), false).kind,
            FaultKind::Unknown
        );
        assert_eq!(
            Fault::from_event(&event(0), none.clone(), true).kind,
            FaultKind::SwapIn
        );
        assert_eq!(
            Fault::from_event(&event(FaultEvent::FLAG_SWAP), none, false).kind,
            FaultKind::SwapIn
        );
    }

    #[test]
    fn site_is_the_function_holding_inlined_code() {
        let mut f = Fault::from_event(&event(0), Arc::from(Vec::new()), true);
        assert_eq!(f.site(), "[unknown]");
        f.stack = vec![
            frame("internal/runtime/atomic.(*Uint32).Load", true),
            frame("runtime.(*spanSet).reset", false),
            frame("runtime.finishsweep_m", false),
        ]
        .into();
        assert_eq!(f.site(), "runtime.(*spanSet).reset");
        let s = top_sites([&f, &f], 8);
        assert_eq!(
            (s[0].function.as_str(), s[0].faults),
            ("runtime.(*spanSet).reset", 2)
        );
        assert_eq!(
            s[0].stack[0],
            "internal/runtime/atomic.(*Uint32).Load (inlined)"
        );
    }

    #[test]
    fn pause_stats_split_stopper_and_others() {
        let mut a = Fault::from_event(&event(0), Arc::from(vec![frame("x", false)]), true);
        let mut b = a.clone();
        b.tid = 9;
        a.blocked_ns = 50;
        let s = PauseFaultStats::of(8, &[a, b.clone(), b]);
        assert_eq!(
            (s.all.faults, s.stopper.faults, s.other_threads.faults),
            (3, 1, 2)
        );
        assert_eq!(s.top_sites, vec![("x".to_owned(), 3)]);
        assert_eq!(s.all.blocked_ns, 50 + 2 * 3_000);
    }
}
