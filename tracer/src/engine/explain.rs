//! A pause's explanation, from the kernel's `PauseDetail` (made ready by the
//! stream: frames symbolized) and the pause's major faults (known once the
//! correlator releases the pause): the laggards with their state, the
//! breakdown, the restart, and the faults by phase.

use tracer_common::explain::{Laggard, OffCpu};

use super::breakdown::{self, LaggardTime};
use crate::model::{
    fault::{Fault, PhaseFaults},
    kernel_wait::{KernelTime, KernelWaitRecord, Phase, Sleeper, WaitKind},
    laggard::{FramesFrom, LaggardKernel, LaggardRecord, LaggardStateName, RawLaggard},
    pause::PauseRecord,
};

/// Laggards a pause record lists (the longest to stop).
pub const RECORD_LAGGARDS: usize = 4;

/// Fill in `rec`'s explanation from its input and `faults` (all the
/// pause's faults, any thread).
pub fn complete(rec: &mut PauseRecord, faults: &[Fault]) {
    let Some(input) = rec.explain_input.take() else {
        return;
    };
    let start = rec.start_mono_ns;
    let end = start + rec.duration_ns;
    let finished = rec.stopping_ns.map(|s| start + s);
    let restart = input.restart_ns.filter(|r| (start..end).contains(r));
    rec.restarting_ns = restart.map(|r| end - r);
    let stop_end = finished.unwrap_or(end);
    // A laggard the sampler found running but never saw leave the CPU
    // while the world stopped held it until the end of stopping.
    let mut laggards: Vec<(LaggardRecord, u64, OffCpu)> = input
        .laggards
        .iter()
        .filter(|l| l.last_out_ns > start || l.held_samples > 0)
        .map(|l| laggard(l, start, stop_end, faults))
        .collect();
    laggards.sort_by(|a, b| b.0.ns.cmp(&a.0.ns).then(a.0.tid.cmp(&b.0.tid)));
    let mut waits: Vec<KernelWaitRecord> = input
        .waits
        .iter()
        .map(|w| KernelWaitRecord::of(w, rec.tid))
        .collect();
    waits.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.tid.cmp(&b.tid)));
    // The kernel keeps a sleep in the phase the stopping probe had not yet
    // ended: the stopping thread's sleeps in a probe that the kernel puts in
    // the stopping phase are the stopping probe's own, which sits after Go's
    // `finishedStopping`: by Go's clock, the stopped phase.
    let mut stopper = input.stopper;
    for w in waits.iter_mut().filter(|w| {
        w.thread == Sleeper::Stopping
            && w.kind == WaitKind::Uprobe
            && w.phase == Phase::Stopping
            && !w.on_cpu
    }) {
        w.phase = Phase::Stopped;
        let moved = w.ns.min(stopper.by_phase[0].blocked_ns);
        stopper.by_phase[0].blocked_ns -= moved;
        stopper.by_phase[1].blocked_ns += moved;
    }
    if let (Some(finished), true) = (finished, input.sched) {
        let critical = laggards.first().map(|(l, until, stopper_off)| LaggardTime {
            stopped_at_ns: *until,
            fault_ns: l.fault_ns,
            runnable_ns: l.runnable_ns,
            blocked_ns: l.blocked_ns,
            stopper_off_before: *stopper_off,
            kernel: KernelTime::of(&waits, |w| {
                w.tid == l.tid && w.thread == Sleeper::Laggard && w.phase == Phase::Stopping
            }),
        });
        let stopper_kernel = |phase: fn(Phase) -> bool| {
            KernelTime::of(&waits, move |w| {
                w.thread == Sleeper::Stopping && phase(w.phase)
            })
        };
        let stopper_faults: Vec<&Fault> = faults
            .iter()
            .filter(|f| f.tid == rec.tid && f.at_ns() >= finished)
            .collect();
        let stopper_fault_ns = stopper_faults
            .iter()
            .map(|f| overlap(f, finished, end))
            .sum();
        let stopper_fault_blocked_ns = stopper_faults.iter().map(|f| f.blocked_ns).sum();
        rec.breakdown = Some(Box::new(breakdown::compute(&breakdown::Inputs {
            start_ns: start,
            duration_ns: rec.duration_ns,
            stopping_ns: finished - start,
            laggard: critical,
            stopper: &stopper,
            stopper_fault_ns,
            stopper_fault_blocked_ns,
            stopper_kernel_stopping: stopper_kernel(|p| p == Phase::Stopping),
            stopper_kernel_stopped: stopper_kernel(|p| p != Phase::Stopping),
        })));
        if let Some(stats) = &mut rec.faults {
            stats.by_phase = Some(Box::new(by_phase(faults, finished, restart)));
        }
    }
    laggards.truncate(RECORD_LAGGARDS);
    for (l, ..) in &mut laggards {
        l.kernel = LaggardKernel::main_of(&waits, l.tid);
    }
    rec.laggards = Some(laggards.into_iter().map(|(l, ..)| l).collect());
    rec.kernel_waits = Some(waits);
    rec.kernel_waits_dropped_ns = (input.waits_dropped_ns > 0).then_some(input.waits_dropped_ns);
    rec.stopper_page_faults = Some(input.stopper.faults);
}

/// A laggard's record, when it stopped (at most `stop_end`), and the
/// stopping thread's off-CPU time by then.
fn laggard(
    l: &RawLaggard,
    start: u64,
    stop_end: u64,
    faults: &[Fault],
) -> (LaggardRecord, u64, OffCpu) {
    let until = if l.last_out_ns > start {
        l.last_out_ns.min(stop_end)
    } else {
        stop_end
    };
    let ns = until.saturating_sub(start);
    // Its faults' waits inside [start, until): part of its blocked time.
    let mine: Vec<&Fault> = faults
        .iter()
        .filter(|f| f.tid == l.tid && f.at_ns() < until && f.end_ns > start)
        .collect();
    // Time inside its faults is exact; their blocked part is in its
    // followed blocked time, the rest of them (handling, waiting to run
    // again) is taken out of its runnable time and of the time off the CPU
    // before it was followed (it held a P: waiting to run, or in a fault).
    let in_fault: u64 = mine.iter().map(|f| overlap(f, start, until)).sum();
    let in_fault = in_fault.min(ns);
    let fault_blocked = mine
        .iter()
        .map(|f| f.blocked_ns)
        .sum::<u64>()
        .min(in_fault)
        .min(l.off.blocked_ns);
    let off_runnable = l.off.runnable_ns + l.unseen_off_ns;
    let fault_runnable = off_runnable.min(in_fault - fault_blocked);
    let mut left = ns;
    let mut take = |v: u64| {
        let t = v.min(left);
        left -= t;
        t
    };
    let fault_ns = take(in_fault);
    let blocked_ns = take(l.off.blocked_ns - fault_blocked);
    let runnable_ns = take(off_runnable - fault_runnable);
    let on_cpu_ns = left;
    let state = [
        (LaggardStateName::OnCpu, on_cpu_ns),
        (LaggardStateName::Fault, fault_ns),
        (LaggardStateName::Runnable, runnable_ns),
        (LaggardStateName::Blocked, blocked_ns),
    ]
    .into_iter()
    .max_by_key(|&(_, ns)| ns)
    .map_or(LaggardStateName::OnCpu, |(s, _)| s);
    // What held the world: the faulting code; for a laggard that mostly ran
    // or waited to run, the code it was sampled running; for one that
    // mostly slept (a syscall that kept its P, a lock), where it slept.
    let (frames, frames_from) = match (state, mine.first()) {
        (LaggardStateName::Fault, Some(f)) => (f.stack.to_vec(), FramesFrom::Fault),
        (LaggardStateName::OnCpu | LaggardStateName::Runnable, _) if !l.held.is_empty() => {
            let from = if l.held_samples == 0 && l.flags & Laggard::HELD_AT_PREEMPTION != 0 {
                FramesFrom::Preemption
            } else {
                FramesFrom::Sample
            };
            (l.held.clone(), from)
        }
        _ => (l.frames.clone(), FramesFrom::StoppedAt),
    };
    let rec = LaggardRecord {
        tid: l.tid,
        state,
        ns,
        on_cpu_ns,
        fault_ns,
        runnable_ns,
        blocked_ns,
        running_goroutine: l.flags & Laggard::CANDIDATE != 0,
        goid: (l.goid != 0).then_some(l.goid),
        frames,
        frames_from,
        held_samples: l.held_samples,
        page_faults: l.faults,
        kernel: None,
        stopped_at: l.frames.clone(),
    };
    (rec, until, l.stopper_off_at_out)
}

/// How much of fault `f` lies inside `[from, to)`.
fn overlap(f: &Fault, from: u64, to: u64) -> u64 {
    let end = if f.begin_ns == 0 {
        f.end_ns
    } else {
        f.end_ns.max(f.begin_ns)
    };
    end.min(to).saturating_sub(f.at_ns().max(from))
}

/// `faults` by the phase of their beginning.
fn by_phase(faults: &[Fault], finished: u64, restart: Option<u64>) -> PhaseFaults {
    let mut p = PhaseFaults::default();
    for f in faults {
        let at = f.at_ns();
        let totals = if at < finished {
            &mut p.stopping
        } else if restart.is_some_and(|r| at >= r) {
            &mut p.restarting
        } else {
            &mut p.stopped
        };
        totals.add(f);
    }
    p
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tracer_common::explain::{LaggardState, StopperTime};

    use crate::model::laggard::ExplainInput;

    use super::*;
    use crate::{image::Frame, model::fault::FaultKind, model::pause::tests_support::record};

    const MS: u64 = 1_000_000;

    fn fault(tid: u32, begin: u64, end: u64, blocked: u64) -> Fault {
        Fault {
            tgid: 1,
            tid,
            begin_ns: begin,
            end_ns: end,
            address: 0,
            kind: FaultKind::SwapIn,
            blocked_ns: blocked,
            wait_own_ns: blocked,
            wait_other_ns: 0,
            stack: Arc::from(vec![Frame::unknown(0x1234)]),
            pcs: Arc::from(vec![0x1234]),
        }
    }

    fn raw(tid: u32, out: u64, off: (u64, u64)) -> RawLaggard {
        RawLaggard {
            tid,
            flags: Laggard::CANDIDATE,
            last_out_ns: out,
            out_state: LaggardState::Sleeping,
            off: OffCpu {
                runnable_ns: off.0,
                blocked_ns: off.1,
            },
            unseen_off_ns: 0,
            stopper_off_at_out: OffCpu::default(),
            goid: 7,
            frames: vec![Frame::unknown(0x99)],
            held: Vec::new(),
            held_samples: 0,
            faults: 0,
        }
    }

    #[test]
    fn laggards_get_a_state_and_the_last_to_stop_drives_the_breakdown() {
        // Pause of pid 1 (stopped by tid 1) at 100 ms for 10 ms, 8 ms
        // stopping. Tid 2 stopped at 107 ms after a 5 ms fault; tid 3 ran
        // until 101 ms. The stopper faulted 1 ms after stopping, and a
        // restarted thread (tid 4) faulted in the restart.
        let mut rec = record(1, 100 * MS, 10 * MS);
        rec.stopping_ns = Some(8 * MS);
        rec.faults = Some(Default::default());
        let mut stopper = StopperTime::default();
        stopper.by_phase[1].blocked_ns = MS;
        rec.explain_input = Some(Box::new(ExplainInput {
            sched: true,
            restart_ns: Some(109 * MS),
            stopper,
            laggards: vec![
                raw(3, 101 * MS, (0, 0)),
                raw(2, 107 * MS, (0, 5 * MS)),
                raw(5, 99 * MS, (0, 0)),
            ],
            laggards_dropped: 0,
            waits: Vec::new(),
            waits_dropped_ns: 0,
        }));
        let faults = [
            fault(2, 101 * MS, 106 * MS, 5 * MS),
            fault(1, 108_500_000, 109_500_000, MS),
            fault(4, 109_200_000, 110_000_000, 700_000),
        ];
        complete(&mut rec, &faults);
        let l = rec.laggards.as_ref().unwrap();
        assert_eq!(l.len(), 2, "tid 5 stopped before the pause");
        assert_eq!(
            (l[0].tid, l[0].state, l[0].ns),
            (2, LaggardStateName::Fault, 7 * MS)
        );
        assert_eq!((l[0].fault_ns, l[0].on_cpu_ns), (5 * MS, 2 * MS));
        assert_eq!(
            l[0].frames,
            vec![Frame::unknown(0x1234)],
            "the faulting code"
        );
        assert_eq!((l[1].tid, l[1].state), (3, LaggardStateName::OnCpu));
        let b = rec.breakdown.unwrap();
        assert_eq!(b.stopping_fault_ns, 5 * MS);
        assert_eq!(b.stopping_on_cpu_ns, 2 * MS);
        assert_eq!(b.faults_ns, MS);
        assert_eq!(b.total_ns(), 10 * MS);
        assert_eq!(rec.restarting_ns, Some(MS));
        let p = rec.faults.as_ref().unwrap().by_phase.as_ref().unwrap();
        assert_eq!(
            (p.stopping.faults, p.stopped.faults, p.restarting.faults),
            (1, 1, 1)
        );
        assert!(rec.explain_input.is_none());
    }

    #[test]
    fn without_the_stopping_phase_there_is_no_breakdown() {
        let mut rec = record(1, 100 * MS, 10 * MS);
        rec.explain_input = Some(Box::new(ExplainInput {
            sched: true,
            restart_ns: None,
            stopper: StopperTime::default(),
            laggards: vec![raw(2, 104 * MS, (MS, 0))],
            laggards_dropped: 0,
            waits: Vec::new(),
            waits_dropped_ns: 0,
        }));
        complete(&mut rec, &[]);
        assert!(rec.breakdown.is_none());
        let l = &rec.laggards.as_ref().unwrap()[0];
        assert_eq!((l.ns, l.runnable_ns, l.on_cpu_ns), (4 * MS, MS, 3 * MS));
    }

    /// A sampled laggard's frames are the code it ran while the world
    /// waited; where it stopped stays apart. A laggard in a fault keeps the
    /// faulting code, and one that slept where it slept, sampled or not.
    #[test]
    fn a_sampled_laggard_is_the_code_it_ran_and_where_it_stopped_is_apart() {
        let sampled = |tid: u32, out: u64, off: (u64, u64)| RawLaggard {
            held: vec![Frame::unknown(0x42)],
            held_samples: 3,
            ..raw(tid, out, off)
        };
        let mut rec = record(1, 100 * MS, 10 * MS);
        rec.stopping_ns = Some(8 * MS);
        rec.explain_input = Some(Box::new(ExplainInput {
            sched: true,
            restart_ns: None,
            stopper: StopperTime::default(),
            laggards: vec![
                sampled(2, 107 * MS, (0, 0)),
                sampled(3, 106 * MS, (0, 0)),
                sampled(4, 105 * MS, (0, 5 * MS)),
            ],
            laggards_dropped: 0,
            waits: Vec::new(),
            waits_dropped_ns: 0,
        }));
        let faults = [fault(3, 101 * MS, 106 * MS, 5 * MS)];
        complete(&mut rec, &faults);
        let l = rec.laggards.as_ref().unwrap();
        assert_eq!((l[0].tid, l[0].state), (2, LaggardStateName::OnCpu));
        assert_eq!(l[0].frames, vec![Frame::unknown(0x42)]);
        assert_eq!(l[0].held_samples, 3);
        assert_eq!(l[0].frames_from, FramesFrom::Sample);
        assert_eq!(l[0].stopped_at, vec![Frame::unknown(0x99)]);
        assert_eq!((l[1].tid, l[1].state), (3, LaggardStateName::Fault));
        assert_eq!(l[1].frames, vec![Frame::unknown(0x1234)]);
        assert_eq!(l[1].frames_from, FramesFrom::Fault);
        // One that slept held the world where it slept, sampled or not.
        assert_eq!((l[2].tid, l[2].state), (4, LaggardStateName::Blocked));
        assert_eq!(l[2].frames, vec![Frame::unknown(0x99)]);
        assert_eq!(l[2].frames_from, FramesFrom::StoppedAt);
    }

    /// A laggard the sampler found running whose switch-out came only after
    /// the restart began held the world until the end of stopping; one
    /// with neither is no laggard.
    #[test]
    fn a_sampled_laggard_never_seen_leaving_held_it_to_the_end() {
        let mut rec = record(1, 100 * MS, 10 * MS);
        rec.stopping_ns = Some(8 * MS);
        let mut sampled = raw(2, 0, (0, 0));
        sampled.held = vec![Frame::unknown(0x42)];
        sampled.held_samples = 7;
        rec.explain_input = Some(Box::new(ExplainInput {
            sched: true,
            restart_ns: None,
            stopper: StopperTime::default(),
            laggards: vec![sampled, raw(3, 0, (0, 0))],
            laggards_dropped: 0,
            waits: Vec::new(),
            waits_dropped_ns: 0,
        }));
        complete(&mut rec, &[]);
        let l = rec.laggards.as_ref().unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(
            (l[0].tid, l[0].ns, l[0].state),
            (2, 8 * MS, LaggardStateName::OnCpu)
        );
        assert_eq!(l[0].frames_from, FramesFrom::Sample);
        let b = rec.breakdown.as_ref().unwrap();
        assert_eq!((b.stopping_on_cpu_ns, b.unexplained_ns), (8 * MS, 0));
    }

    /// Never sampled (it waited for a CPU through the stop), a laggard the
    /// kernel preempted in its goroutine's code is named by that code.
    #[test]
    fn an_unsampled_laggard_preempted_in_its_code_is_named_by_it() {
        let mut rec = record(1, 100 * MS, 10 * MS);
        rec.stopping_ns = Some(8 * MS);
        let mut l = raw(2, 107 * MS, (5 * MS, 0));
        l.held = vec![Frame::unknown(0x42)];
        l.flags |= Laggard::HELD_AT_PREEMPTION;
        rec.explain_input = Some(Box::new(ExplainInput {
            sched: true,
            restart_ns: None,
            stopper: StopperTime::default(),
            laggards: vec![l],
            laggards_dropped: 0,
            waits: Vec::new(),
            waits_dropped_ns: 0,
        }));
        complete(&mut rec, &[]);
        let l = &rec.laggards.as_ref().unwrap()[0];
        assert_eq!(l.state, LaggardStateName::Runnable);
        assert_eq!(l.frames, vec![Frame::unknown(0x42)]);
        assert_eq!((l.frames_from, l.held_samples), (FramesFrom::Preemption, 0));
        assert_eq!(l.stopped_at, vec![Frame::unknown(0x99)]);
    }
}
