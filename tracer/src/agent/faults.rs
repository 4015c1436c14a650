//! Major faults for the agent: the fault backend attached once for the whole
//! host (system-wide probes, gated by the traced set the tracker fills), and
//! the attribution of each fault to a pause of its process or not.
//!
//! A fault is in a pause when it begins inside the pause as Go counts it.
//! Its event is sent when it ends, a pause's when the world restarts, so
//! neither order settles it on arrival:
//! - a fault that began after the last pause seen of its process waits in a
//!   pending queue until a later pause says whether it began inside it, or
//!   until `HORIZON` has passed since it began (no pause contained it);
//! - a pause is held until `GRACE` after its end before it is exported, so
//!   the faults that began inside it and ended after it still count in its
//!   `major_faults`.
//!
//! Memory: per process, the held pause, the last window and the pending
//! faults; all of it is dropped when the process is gone, and the pending
//! queue is bounded for the whole agent (`MAX_PENDING`; faults beyond it are
//! counted as `events_lost{stage="fault_queue_full"}`, not observed).
//!
//! Unlike `faults::FaultTracer` (the `gostw faults` report), nothing is kept
//! per fault beyond this and stacks are not read.

use std::collections::{HashMap, VecDeque};

use tracer_common::fault::Backend as KernelBackend;

use super::{
    metrics::Metrics,
    observe::{Backing, FaultObservation, Observer, PauseObservation, WaitedOn},
};
use crate::{
    ebpf::Programs,
    faults::{
        FaultSource, backend,
        correlate::{Fault, FaultKind},
        decode::{decode_fault, fault_from_event},
    },
    pauses::PauseRecord,
};

/// How long after it began a pending fault waits for a pause to contain it.
/// A pause longer than this that contains a fault's beginning sees the fault
/// counted outside it.
pub const HORIZON_NS: u64 = 2_000_000_000;
/// How long after its end a pause waits for faults that began inside it and
/// ended after it.
pub const GRACE_NS: u64 = 300_000_000;
/// Pending faults, all processes together.
pub const MAX_PENDING: usize = 65_536;

/// The part of a fault the metrics need.
#[derive(Clone, Copy, Debug, PartialEq)]
struct PendingFault {
    /// When it began (its end when the begin was not seen).
    at_ns: u64,
    obs: FaultObservation,
}

#[derive(Clone, Copy, Debug)]
struct Window {
    start_ns: u64,
    end_ns: u64,
}

impl Window {
    fn contains(&self, t: u64) -> bool {
        (self.start_ns..self.end_ns).contains(&t)
    }
}

#[derive(Clone, Copy, Debug)]
struct HeldPause {
    window: Window,
    obs: PauseObservation,
}

#[derive(Default)]
struct ProcessState {
    pending: VecDeque<PendingFault>,
    held: Option<HeldPause>,
    /// The last pause seen (held or exported).
    last: Option<Window>,
}

/// Per-process attribution of faults to pauses (pure: no kernel, no clock;
/// `settle` is given the time).
#[derive(Default)]
pub struct Attribution {
    processes: HashMap<u32, ProcessState>,
    pending: usize,
}

/// A fault's observation without its pause membership.
pub fn observation(f: &Fault) -> FaultObservation {
    FaultObservation {
        in_pause: false,
        // Unknown only where the kernel cannot tell them apart (no
        // filemap:mm_filemap_fault): anonymous memory is the usual case.
        backing: match f.kind {
            FaultKind::FileBacked => Backing::File,
            FaultKind::SwapIn | FaultKind::Unknown => Backing::Swap,
        },
        wait_ns: f.blocked_ns,
        // The larger part of the blocked time names the wait.
        waited_on: if f.wait_other_ns > f.wait_own_ns {
            WaitedOn::Other
        } else {
            WaitedOn::Own
        },
    }
}

impl Attribution {
    /// Faults waiting for their pause membership, all processes.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Processes with state.
    pub fn processes(&self) -> usize {
        self.processes.len()
    }

    /// One fault of `pid` that ended. Returns false when it was dropped
    /// (pending queue full).
    pub fn fault(&mut self, f: &Fault, observer: &mut impl Observer) -> bool {
        let at_ns = if f.begin_ns == 0 {
            f.end_ns
        } else {
            f.begin_ns
        };
        let mut obs = observation(f);
        let st = self.processes.entry(f.tgid).or_default();
        if let Some(h) = st.held.as_mut().filter(|h| h.window.contains(at_ns)) {
            h.obs.major_faults = h.obs.major_faults.saturating_add(1);
            obs.in_pause = true;
            observer.fault(f.tgid, &obs);
            return true;
        }
        match st.last {
            // Began in the last pause, which is exported already: in a
            // pause, but too late for its per-pause count.
            Some(w) if w.contains(at_ns) => {
                obs.in_pause = true;
                observer.fault(f.tgid, &obs);
            }
            // Pauses of a process come one after the other: one containing
            // this fault would have been seen before the last one.
            Some(w) if at_ns < w.start_ns => observer.fault(f.tgid, &obs),
            _ if self.pending >= MAX_PENDING => return false,
            _ => {
                st.pending.push_back(PendingFault { at_ns, obs });
                self.pending += 1;
            }
        }
        true
    }

    /// A pause of `rec.pid` ended: the previous held pause is exported, this
    /// one is held; pending faults that began before its end are decided.
    pub fn pause(&mut self, rec: &PauseRecord, observer: &mut impl Observer) {
        let window = Window {
            start_ns: rec.start_mono_ns,
            end_ns: rec.start_mono_ns.saturating_add(rec.duration_ns),
        };
        let st = self.processes.entry(rec.pid).or_default();
        if let Some(h) = st.held.take() {
            observer.pause(rec.pid, &h.obs);
        }
        let mut held = HeldPause {
            window,
            obs: PauseObservation {
                reason: rec.reason,
                duration_ns: rec.duration_ns,
                major_faults: 0,
            },
        };
        let before = st.pending.len();
        st.pending.retain(|p| {
            if p.at_ns >= window.end_ns {
                return true;
            }
            let mut obs = p.obs;
            if window.contains(p.at_ns) {
                obs.in_pause = true;
                held.obs.major_faults = held.obs.major_faults.saturating_add(1);
            }
            observer.fault(rec.pid, &obs);
            false
        });
        self.pending -= before - st.pending.len();
        st.held = Some(held);
        st.last = Some(window);
    }

    /// Export what time has settled (`now_ns`: CLOCK_MONOTONIC, after the
    /// ring buffer was drained): pending faults older than `HORIZON_NS` are
    /// outside any pause, held pauses older than `GRACE_NS` are complete.
    pub fn settle(&mut self, now_ns: u64, observer: &mut impl Observer) {
        for (&pid, st) in &mut self.processes {
            while let Some(p) = st.pending.front().filter(|p| p.at_ns + HORIZON_NS < now_ns) {
                observer.fault(pid, &p.obs);
                st.pending.pop_front();
                self.pending -= 1;
            }
            if st
                .held
                .is_some_and(|h| h.window.end_ns.saturating_add(GRACE_NS) < now_ns)
            {
                let h = st.held.take().expect("checked");
                observer.pause(pid, &h.obs);
            }
        }
        self.processes
            .retain(|_, st| st.held.is_some() || !st.pending.is_empty());
    }

    /// `pid` is gone (its events are all drained): export its held pause
    /// and its pending faults (outside any pause), and forget it.
    pub fn exited(&mut self, pid: u32, observer: &mut impl Observer) {
        let Some(st) = self.processes.remove(&pid) else {
            return;
        };
        if let Some(h) = st.held {
            observer.pause(pid, &h.obs);
        }
        self.pending -= st.pending.len();
        for p in st.pending {
            observer.fault(pid, &p.obs);
        }
    }

    /// Pids with state, for the exit check.
    pub fn pids(&self) -> Vec<u32> {
        self.processes.keys().copied().collect()
    }
}

/// The attached fault backend and the attribution, fed by the agent's
/// event stage.
pub struct FaultStage {
    pub backend: &'static str,
    file_faults_seen: bool,
    attribution: Attribution,
}

/// `CLOCK_MONOTONIC` in ns, the clock of kernel timestamps.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl FaultStage {
    /// Attach the fault backend (`auto`) for the whole agent; log the
    /// choice and export it. Without one the agent still serves pauses, and
    /// `gostw_agent_fault_backend{backend="none"}` says so.
    pub fn attach(programs: &mut Programs, metrics: &Metrics) -> Option<FaultStage> {
        match backend::attach(programs, FaultSource::Auto) {
            Ok(choice) => {
                let name = match choice.backend {
                    KernelBackend::Tracepoint => "tracepoint",
                    KernelBackend::Kprobe => "kprobe",
                };
                log::info!("major faults: {name} backend ({})", choice.reason);
                metrics.fault_backend(name);
                Some(FaultStage {
                    backend: name,
                    file_faults_seen: choice.file_faults_seen,
                    attribution: Attribution::default(),
                })
            }
            Err(e) => {
                log::warn!("major faults are not traced: {e:#}");
                metrics.fault_backend("none");
                None
            }
        }
    }

    /// One raw fault event.
    pub fn fault(&mut self, raw: &[u8], observer: &mut impl Observer, metrics: &Metrics) {
        let Ok(ev) = decode_fault(raw) else {
            metrics.events_lost("undecodable", 1);
            return;
        };
        let f = fault_from_event(&ev, std::sync::Arc::from(Vec::new()), self.file_faults_seen);
        if !self.attribution.fault(&f, observer) {
            metrics.events_lost("fault_queue_full", 1);
        }
    }

    /// One pause record.
    pub fn pause(&mut self, rec: &PauseRecord, observer: &mut impl Observer) {
        self.attribution.pause(rec, observer);
    }

    /// After a drain: forget processes that are gone, export what time
    /// settled.
    pub fn settle(&mut self, observer: &mut impl Observer) {
        for pid in self.attribution.pids() {
            // SAFETY: kill with signal 0 only checks that the process exists.
            let gone = unsafe { libc::kill(pid as libc::pid_t, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if gone {
                self.attribution.exited(pid, observer);
            }
        }
        self.attribution.settle(monotonic_ns(), observer);
    }

    pub fn attribution(&self) -> &Attribution {
        &self.attribution
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{agent::observe::StackGrowthObservation, pauses::DurationSource};

    #[derive(Default)]
    struct Seen {
        pauses: Vec<(u32, PauseObservation)>,
        faults: Vec<(u32, FaultObservation)>,
    }

    impl Observer for Seen {
        fn pause(&mut self, pid: u32, p: &PauseObservation) {
            self.pauses.push((pid, *p));
        }
        fn fault(&mut self, pid: u32, f: &FaultObservation) {
            self.faults.push((pid, *f));
        }
        fn stack_growth(&mut self, _: u32, _: &StackGrowthObservation) {}
        fn stop_the_world_entries(&mut self, _: u32, _: u64) {}
    }

    impl Seen {
        fn in_pause(&self) -> usize {
            self.faults.iter().filter(|(_, f)| f.in_pause).count()
        }
    }

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
        }
    }

    fn pause(pid: u32, start: u64, dur: u64) -> PauseRecord {
        PauseRecord {
            pid,
            tid: pid,
            reason_code: 0,
            reason: "gc_sweep_termination",
            reason_text: None,
            start_mono_ns: start,
            start_unix_ns: start,
            duration_ns: dur,
            duration_source: DurationSource::Go,
            go_duration_ns: Some(dur),
            window_ns: dur,
            faults: None,
        }
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn faults_before_and_after_their_pause_event_count_in_it() {
        let mut a = Attribution::default();
        let mut seen = Seen::default();
        // Before any pause: pending.
        a.fault(&fault(1, 100 * MS, 101 * MS), &mut seen);
        a.fault(&fault(1, 1000 * MS, 1002 * MS), &mut seen);
        a.fault(&fault(1, 1005 * MS, 1008 * MS), &mut seen);
        assert_eq!((a.pending(), seen.faults.len()), (3, 0));
        // The pause [1000, 1010) ms: two in it, the first is outside.
        a.pause(&pause(1, 1000 * MS, 10 * MS), &mut seen);
        assert_eq!(a.pending(), 0);
        assert_eq!((seen.faults.len(), seen.in_pause()), (3, 2));
        assert!(seen.pauses.is_empty(), "held for late faults");
        // Began inside, ended after the pause event.
        a.fault(&fault(1, 1009 * MS, 1030 * MS), &mut seen);
        // Began after: pending until a pause or the horizon decides.
        a.fault(&fault(1, 1020 * MS, 1021 * MS), &mut seen);
        assert_eq!((seen.in_pause(), a.pending()), (3, 1));
        a.settle(1100 * MS, &mut seen);
        assert!(seen.pauses.is_empty());
        a.settle(1010 * MS + GRACE_NS + 1, &mut seen);
        assert_eq!(seen.pauses.len(), 1);
        assert_eq!(seen.pauses[0].1.major_faults, 3);
        assert_eq!(a.pending(), 1);
        // Late for the per-pause count, still in the pause.
        a.fault(&fault(1, 1001 * MS, 1500 * MS), &mut seen);
        assert_eq!(seen.in_pause(), 4);
        a.settle(1020 * MS + HORIZON_NS + 1, &mut seen);
        assert_eq!((a.pending(), a.processes()), (0, 0));
        assert_eq!(seen.faults.len(), 6);
        assert_eq!(seen.in_pause(), 4);
        let w = seen.faults[0].1;
        assert_eq!(
            (w.backing, w.waited_on, w.wait_ns),
            (Backing::Swap, WaitedOn::Own, 10)
        );
    }

    #[test]
    fn the_next_pause_exports_the_held_one_and_processes_are_separate() {
        let mut a = Attribution::default();
        let mut seen = Seen::default();
        a.pause(&pause(1, 10 * MS, MS), &mut seen);
        a.fault(&fault(2, 10 * MS, 12 * MS), &mut seen);
        a.fault(&fault(1, 10 * MS, 12 * MS), &mut seen);
        a.pause(&pause(1, 20 * MS, MS), &mut seen);
        assert_eq!(
            seen.pauses,
            [(
                1,
                PauseObservation {
                    reason: "gc_sweep_termination",
                    duration_ns: MS,
                    major_faults: 1
                }
            )]
        );
        // Process 2 has no pause: its fault waits.
        assert_eq!(a.pending(), 1);
        // Before the last pause of its process: outside at once.
        a.fault(&fault(1, 15 * MS, 16 * MS), &mut seen);
        assert_eq!(
            seen.faults.last().unwrap(),
            &(
                1,
                FaultObservation {
                    in_pause: false,
                    backing: Backing::Swap,
                    wait_ns: 10,
                    waited_on: WaitedOn::Own,
                }
            )
        );
        a.exited(2, &mut seen);
        a.exited(1, &mut seen);
        assert_eq!((a.pending(), a.processes(), seen.pauses.len()), (0, 0, 2));
    }

    #[test]
    fn the_pending_queue_is_bounded() {
        let mut a = Attribution::default();
        let mut seen = Seen::default();
        let mut dropped = 0;
        for i in 0..MAX_PENDING as u64 + 10 {
            if !a.fault(&fault(1 + (i % 3) as u32, i, i + 1), &mut seen) {
                dropped += 1;
            }
        }
        assert_eq!((a.pending(), dropped), (MAX_PENDING, 10));
        a.exited(1, &mut seen);
        assert!(a.pending() < MAX_PENDING);
    }

    #[test]
    fn observation_maps_kind_and_wait() {
        let mut f = fault(1, 1, 2);
        f.kind = FaultKind::FileBacked;
        f.wait_own_ns = 1;
        f.wait_other_ns = 5;
        let o = observation(&f);
        assert_eq!((o.backing, o.waited_on), (Backing::File, WaitedOn::Other));
    }
}
