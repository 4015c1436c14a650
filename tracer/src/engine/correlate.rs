//! Streaming correlation of major faults with stop-the-world pauses, the one
//! rule for every front end. A fault is in a pause when it begins inside the
//! pause as Go counts it (any thread of the process). Its event is sent when
//! it ends, a pause's when the world restarts, so neither order settles it on
//! arrival:
//! - a fault that began after the last pause seen of its process waits in a
//!   pending queue until a later pause says whether it began inside it, or
//!   until `HORIZON_NS` has passed since it began (no pause contained it);
//! - a pause is held until `GRACE_NS` after its end before it is released,
//!   so the faults that began inside it and ended after it (threads still
//!   running while the world stops, or woken inside `startTheWorldWithSema`)
//!   are in its record. A fault of a pause already released is counted in
//!   the pause (`Membership::LateInPause`) but not in its record.
//!
//! Memory is bounded: per process the held pauses, the last released window
//! and the pending faults, all dropped when the process is gone (its last
//! window also once no fault that began in it can still come); the pending
//! queue holds at most `MAX_PENDING` faults for all processes together (more
//! are decided as outside at once and counted in `pending_overflow`).
//! Pure code: the caller gives the time, so it runs in unit tests.

use std::collections::{HashMap, VecDeque};

use super::explain;
pub use crate::model::observed::CorrelatorStats;
use crate::model::{
    fault::{Fault, PauseFaultStats},
    observed::{Membership, Observed, ObservedPause},
    pause::PauseRecord,
};

/// How long after its end a pause waits for faults that began inside it.
/// The reader drains every 20 ms, so a live line appears at most about
/// 70 ms after its pause.
pub const GRACE_NS: u64 = 50_000_000;
/// How long after it began a pending fault waits for a pause to contain it.
/// A fault inside a pause longer than this is counted outside it.
pub const HORIZON_NS: u64 = 2_000_000_000;
/// Pending faults, all processes together.
pub const MAX_PENDING: usize = 65_536;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    start_ns: u64,
    end_ns: u64,
}

impl Window {
    fn of(rec: &PauseRecord) -> Window {
        Window {
            start_ns: rec.start_mono_ns,
            end_ns: rec.start_mono_ns.saturating_add(rec.duration_ns),
        }
    }

    fn contains(&self, t: u64) -> bool {
        (self.start_ns..self.end_ns).contains(&t)
    }
}

struct Held {
    window: Window,
    pause: ObservedPause,
}

#[derive(Default)]
struct ProcessState {
    /// Pauses not released yet, oldest first.
    held: VecDeque<Held>,
    pending: VecDeque<Fault>,
    last_released: Option<Window>,
}

impl ProcessState {
    /// Start of the newest pause seen.
    fn latest_start(&self) -> Option<u64> {
        self.held
            .back()
            .map(|h| h.window)
            .or(self.last_released)
            .map(|w| w.start_ns)
    }
}

/// The streaming correlator.
pub struct Correlator {
    /// Whether faults are traced (else pauses are released at once).
    faults_traced: bool,
    processes: HashMap<u32, ProcessState>,
    pending: usize,
    pub stats: CorrelatorStats,
}

impl Correlator {
    pub fn new(faults_traced: bool) -> Correlator {
        Correlator {
            faults_traced,
            processes: HashMap::new(),
            pending: 0,
            stats: CorrelatorStats::default(),
        }
    }

    /// Faults waiting for their pause membership, all processes.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Processes with state.
    pub fn processes(&self) -> usize {
        self.processes.len()
    }

    /// A pause ended.
    pub fn pause(&mut self, mut record: PauseRecord, out: &mut Vec<Observed>) {
        if !self.faults_traced {
            explain::complete(&mut record, &[]);
            out.push(Observed::Pause(Box::new(ObservedPause {
                record,
                faults: Vec::new(),
            })));
            return;
        }
        let window = Window::of(&record);
        let st = self.processes.entry(record.pid).or_default();
        let mut faults = Vec::new();
        let before = st.pending.len();
        st.pending.retain(|f| {
            let at = f.at_ns();
            if at >= window.end_ns {
                return true;
            }
            if window.contains(at) {
                faults.push(f.clone());
            } else {
                out.push(Observed::Fault(f.clone(), Membership::Outside));
            }
            false
        });
        self.pending -= before - st.pending.len();
        st.held.push_back(Held {
            window,
            pause: ObservedPause { record, faults },
        });
    }

    /// A major fault ended.
    pub fn fault(&mut self, f: Fault, out: &mut Vec<Observed>) {
        let at = f.at_ns();
        let st = self.processes.entry(f.tgid).or_default();
        if let Some(h) = st.held.iter_mut().find(|h| h.window.contains(at)) {
            h.pause.faults.push(f);
            return;
        }
        if st.last_released.is_some_and(|w| w.contains(at)) {
            self.stats.late_faults += 1;
            out.push(Observed::Fault(f, Membership::LateInPause));
            return;
        }
        // Pauses of a process come one after the other: a pause containing
        // a fault that began before the newest one would have been seen.
        if st.latest_start().is_some_and(|s| at < s) {
            out.push(Observed::Fault(f, Membership::Outside));
            return;
        }
        if self.pending >= MAX_PENDING {
            self.stats.pending_overflow += 1;
            out.push(Observed::Fault(f, Membership::Outside));
            return;
        }
        st.pending.push_back(f);
        self.pending += 1;
    }

    /// When the oldest held pause is due for release (CLOCK_MONOTONIC ns):
    /// the event loop wakes for it instead of waiting for its next tick.
    pub fn next_release_ns(&self) -> Option<u64> {
        self.processes
            .values()
            .filter_map(|st| st.held.front())
            .map(|h| h.window.end_ns.saturating_add(GRACE_NS + 1))
            .min()
    }

    /// Release what time has settled (`now_ns`: CLOCK_MONOTONIC, after the
    /// ring buffer was drained).
    pub fn settle(&mut self, now_ns: u64, out: &mut Vec<Observed>) {
        for st in self.processes.values_mut() {
            while st
                .pending
                .front()
                .is_some_and(|f| f.at_ns().saturating_add(HORIZON_NS) < now_ns)
            {
                let f = st.pending.pop_front().expect("checked");
                self.pending -= 1;
                out.push(Observed::Fault(f, Membership::Outside));
            }
            while st
                .held
                .front()
                .is_some_and(|h| h.window.end_ns.saturating_add(GRACE_NS) < now_ns)
            {
                release(st, out);
            }
        }
        // A process with nothing held or pending keeps its last window while
        // a fault that began inside it could still arrive (late, not yet
        // past the horizon).
        self.processes.retain(|_, st| {
            !st.held.is_empty()
                || !st.pending.is_empty()
                || st
                    .last_released
                    .is_some_and(|w| w.end_ns.saturating_add(HORIZON_NS) >= now_ns)
        });
    }

    /// `pid` is gone and its events are all in: release its pauses and
    /// decide its pending faults (outside), and forget it.
    pub fn exited(&mut self, pid: u32, out: &mut Vec<Observed>) {
        let Some(mut st) = self.processes.remove(&pid) else {
            return;
        };
        while !st.held.is_empty() {
            release(&mut st, out);
        }
        self.pending -= st.pending.len();
        out.extend(
            st.pending
                .into_iter()
                .map(|f| Observed::Fault(f, Membership::Outside)),
        );
    }

    /// The trace ends: every process as if it exited.
    pub fn finish(&mut self, out: &mut Vec<Observed>) {
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            self.exited(pid, out);
        }
    }
}

/// Release the oldest held pause of `st`, with its fault stats.
fn release(st: &mut ProcessState, out: &mut Vec<Observed>) {
    let Some(Held { window, mut pause }) = st.held.pop_front() else {
        return;
    };
    pause.record.faults = Some(PauseFaultStats::of(pause.record.tid, &pause.faults));
    explain::complete(&mut pause.record, &pause.faults);
    st.last_released = Some(window);
    out.push(Observed::Pause(Box::new(pause)));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::fault::FaultKind;

    fn fault(pid: u32, begin: u64, end: u64) -> Fault {
        Fault {
            tgid: pid,
            tid: pid,
            begin_ns: begin,
            end_ns: end,
            address: 0,
            kind: FaultKind::SwapIn,
            blocked_ns: 10,
            wait_own_ns: 7,
            wait_other_ns: 3,
            stack: Arc::from(Vec::new()),
            pcs: Arc::from([]),
        }
    }

    fn pause(pid: u32, start: u64, dur: u64) -> PauseRecord {
        crate::model::pause::tests_support::record(pid, start, dur)
    }

    const MS: u64 = 1_000_000;

    fn pauses(out: &[Observed]) -> Vec<(u32, usize)> {
        out.iter()
            .filter_map(|o| match o {
                Observed::Pause(p) => Some((p.record.pid, p.faults.len())),
                _ => None,
            })
            .collect()
    }

    fn faults(out: &[Observed], m: Membership) -> usize {
        out.iter()
            .filter(|o| matches!(o, Observed::Fault(_, x) if *x == m))
            .count()
    }

    #[test]
    fn faults_before_and_after_their_pause_event_count_in_it() {
        let mut c = Correlator::new(true);
        let mut out = Vec::new();
        // Before any pause: pending.
        c.fault(fault(1, 100 * MS, 101 * MS), &mut out);
        c.fault(fault(1, 1000 * MS, 1002 * MS), &mut out);
        c.fault(fault(1, 1005 * MS, 1008 * MS), &mut out);
        assert_eq!((c.pending(), out.len()), (3, 0));
        // The pause [1000, 1010) ms: two in it, the first is outside.
        c.pause(pause(1, 1000 * MS, 10 * MS), &mut out);
        assert_eq!(c.pending(), 0);
        assert_eq!(faults(&out, Membership::Outside), 1);
        assert!(pauses(&out).is_empty(), "held for late faults");
        // Began inside, ended after the pause event.
        c.fault(fault(1, 1009 * MS, 1030 * MS), &mut out);
        // Began after: pending until a pause or the horizon decides.
        c.fault(fault(1, 1020 * MS, 1021 * MS), &mut out);
        assert_eq!(c.pending(), 1);
        assert_eq!(c.next_release_ns(), Some(1010 * MS + GRACE_NS + 1));
        c.settle(1010 * MS + GRACE_NS - 1, &mut out);
        assert!(pauses(&out).is_empty());
        c.settle(1010 * MS + GRACE_NS + 1, &mut out);
        assert_eq!(pauses(&out), [(1, 3)]);
        let Some(Observed::Pause(p)) = out.iter().find(|o| matches!(o, Observed::Pause(_))) else {
            unreachable!()
        };
        assert_eq!(p.record.faults.as_ref().unwrap().all.faults, 3);
        assert_eq!(c.pending(), 1);
        // Late for the per-pause record, still in the pause.
        c.fault(fault(1, 1001 * MS, 1500 * MS), &mut out);
        assert_eq!(faults(&out, Membership::LateInPause), 1);
        assert_eq!(c.stats.late_faults, 1);
        c.settle(1020 * MS + HORIZON_NS + 1, &mut out);
        assert_eq!((c.pending(), c.processes()), (0, 0));
        assert_eq!(faults(&out, Membership::Outside), 2);
    }

    #[test]
    fn pauses_are_released_by_time_and_processes_are_separate() {
        let mut c = Correlator::new(true);
        let mut out = Vec::new();
        c.pause(pause(1, 10 * MS, MS), &mut out);
        c.fault(fault(2, 10 * MS, 12 * MS), &mut out);
        c.fault(fault(1, 10 * MS, 12 * MS), &mut out);
        c.pause(pause(1, 20 * MS, MS), &mut out);
        // Process 2 has no pause: its fault waits.
        assert_eq!(c.pending(), 1);
        // Between the two pauses of process 1: outside at once.
        c.fault(fault(1, 15 * MS, 16 * MS), &mut out);
        assert_eq!(faults(&out, Membership::Outside), 1);
        c.settle(11 * MS + GRACE_NS + 1, &mut out);
        assert_eq!(pauses(&out), [(1, 1)]);
        c.exited(2, &mut out);
        c.exited(1, &mut out);
        assert_eq!(pauses(&out), [(1, 1), (1, 0)]);
        assert_eq!((c.pending(), c.processes()), (0, 0));
        assert_eq!(faults(&out, Membership::Outside), 2);
    }

    #[test]
    fn a_late_fault_is_in_its_pause_when_nothing_else_is_pending() {
        let mut c = Correlator::new(true);
        let mut out = Vec::new();
        c.pause(pause(1, 1000 * MS, 10 * MS), &mut out);
        c.settle(1010 * MS + GRACE_NS + 1, &mut out);
        assert_eq!(pauses(&out), [(1, 0)]);
        // Nothing held or pending: the released window is still known.
        c.fault(fault(1, 1005 * MS, 1200 * MS), &mut out);
        assert_eq!(faults(&out, Membership::LateInPause), 1);
        // Forgotten once a fault that began inside it would have expired.
        c.settle(1010 * MS + HORIZON_NS + 1, &mut out);
        assert_eq!(c.processes(), 0);
    }

    #[test]
    fn the_pending_queue_is_bounded() {
        let mut c = Correlator::new(true);
        let mut out = Vec::new();
        for i in 0..MAX_PENDING as u64 + 10 {
            c.fault(fault(1 + (i % 3) as u32, i, i + 1), &mut out);
        }
        assert_eq!((c.pending(), c.stats.pending_overflow), (MAX_PENDING, 10));
        assert_eq!(faults(&out, Membership::Outside), 10);
        c.exited(1, &mut out);
        assert!(c.pending() < MAX_PENDING);
    }

    #[test]
    fn without_fault_tracing_pauses_go_out_at_once() {
        let mut c = Correlator::new(false);
        let mut out = Vec::new();
        c.pause(pause(1, 10 * MS, MS), &mut out);
        assert_eq!(pauses(&out), [(1, 0)]);
        let Observed::Pause(p) = &out[0] else {
            unreachable!()
        };
        assert!(p.record.faults.is_none());
    }
}
