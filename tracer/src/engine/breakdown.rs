//! Computes a pause's breakdown (`model::breakdown` says what each part
//! is) from the scheduler's and the fault events' intervals.

use tracer_common::explain::{OffCpu, StopperTime};

use crate::model::{
    breakdown::Breakdown,
    kernel_wait::{KernelTime, NamedWaits},
};

/// The critical laggard's time from the pause's start until it stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaggardTime {
    /// When it stopped (its last switch-out, at most the end of stopping).
    pub stopped_at_ns: u64,
    pub fault_ns: u64,
    pub runnable_ns: u64,
    pub blocked_ns: u64,
    /// The stopping thread's stopping-phase off-CPU time when it stopped:
    /// what it had beyond that is its reaction.
    pub stopper_off_before: OffCpu,
    /// Its time in the kernel whose kernel stack names it, while stopping.
    pub kernel: KernelTime,
}

/// What the breakdown is computed from.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    pub start_ns: u64,
    pub duration_ns: u64,
    /// Go's stopping time.
    pub stopping_ns: u64,
    pub laggard: Option<LaggardTime>,
    pub stopper: &'a StopperTime,
    /// The stopping thread's time inside major faults in the stopped phase
    /// (begin to end), and the blocked part of it.
    pub stopper_fault_ns: u64,
    pub stopper_fault_blocked_ns: u64,
    /// The stopping thread's time in the kernel whose kernel stack names
    /// it: while stopping, and after.
    pub stopper_kernel_stopping: KernelTime,
    pub stopper_kernel_stopped: KernelTime,
}

/// Name the parts of `ns` (asleep, or running) that `named` covers, in
/// `b`'s `minor_faults_ns` (running only: asleep has none), `mmap_lock_ns`,
/// `reclaim_ns` and `probe_ns`, taken out of `named`; what is left stays
/// in the part it was in.
fn name(b: &mut Breakdown, ns: u64, named: &mut NamedWaits) -> u64 {
    let mut left = Budget(ns);
    for (part, have) in [
        (&mut b.minor_faults_ns, &mut named.fault_ns),
        (&mut b.mmap_lock_ns, &mut named.mmap_lock_ns),
        (&mut b.reclaim_ns, &mut named.reclaim_ns),
        (&mut b.probe_ns, &mut named.probe_ns),
    ] {
        let t = left.take(*have);
        *part += t;
        *have -= t;
    }
    left.0
}

/// Takes parts out of a length; nothing taken can exceed what is left.
struct Budget(u64);

impl Budget {
    fn take(&mut self, ns: u64) -> u64 {
        let t = ns.min(self.0);
        self.0 -= t;
        t
    }
}

/// The breakdown of one pause.
pub fn compute(i: &Inputs) -> Breakdown {
    let mut b = Breakdown::default();
    let stopping = i.stopping_ns.min(i.duration_ns);
    let finished = i.start_ns + stopping;
    let mut s = Budget(stopping);
    let phase0 = &i.stopper.by_phase[0];
    let own = match i.laggard {
        Some(l) => {
            let until = l.stopped_at_ns.clamp(i.start_ns, finished);
            let mut lag = Budget(s.take(until - i.start_ns));
            b.stopping_fault_ns = lag.take(l.fault_ns);
            b.stopping_runnable_ns = lag.take(l.runnable_ns);
            let blocked = lag.take(l.blocked_ns);
            let mut kernel = l.kernel;
            b.stopping_blocked_ns = name(&mut b, blocked, &mut kernel.asleep);
            let on_cpu = lag.take(u64::MAX);
            b.stopping_on_cpu_ns = name(&mut b, on_cpu, &mut kernel.running);
            // The stopping thread's reaction: what it spent off the CPU
            // after the laggard stopped (waiting for a CPU; asleep on
            // something gostw did not see is unexplained).
            let before = l.stopper_off_before;
            OffCpu {
                runnable_ns: phase0.runnable_ns.saturating_sub(before.runnable_ns),
                blocked_ns: phase0.blocked_ns.saturating_sub(before.blocked_ns),
            }
        }
        None => *phase0,
    };
    // The stopping thread's own time in the stopping phase (its reaction,
    // or all of it with no laggard seen).
    let mut kernel = i.stopper_kernel_stopping;
    let runnable0 = s.take(own.runnable_ns);
    b.off_cpu_runnable_ns += runnable0;
    let asleep0 = s.take(own.blocked_ns);
    b.unexplained_ns += name(&mut b, asleep0, &mut kernel.asleep);
    let on_cpu0 = s.take(u64::MAX);
    b.on_cpu_ns += name(&mut b, on_cpu0, &mut kernel.running);
    // An off-CPU interval is kept by the phase it began in: one that began
    // before Go's `finishedStopping` and outlasted it (the stopping probe
    // itself can sleep, see `WaitKind::Uprobe`) goes on in the stopped
    // phase with what of it did not fit in the stopping one.
    let mut p = Budget(i.duration_ns - stopping);
    let later = &i.stopper.by_phase[1..];
    let runnable: u64 =
        later.iter().map(|o| o.runnable_ns).sum::<u64>() + (own.runnable_ns - runnable0);
    let blocked: u64 = later.iter().map(|o| o.blocked_ns).sum::<u64>() + (own.blocked_ns - asleep0);
    kernel.add(&i.stopper_kernel_stopped);
    // Time inside faults is exact (the fault events); the scheduler's
    // blocked time inside them is their blocked part, and the rest of a
    // fault (handling it, waiting to run again) is taken as the runnable
    // time that fits in it.
    let fault = i.stopper_fault_ns;
    let fault_blocked = i.stopper_fault_blocked_ns.min(fault).min(blocked);
    let fault_runnable = runnable.min(fault - fault_blocked);
    b.faults_ns = p.take(fault);
    let asleep = p.take(blocked - fault_blocked);
    b.off_cpu_blocked_ns = name(&mut b, asleep, &mut kernel.asleep);
    b.off_cpu_runnable_ns += p.take(runnable - fault_runnable);
    let on_cpu = p.take(u64::MAX);
    b.on_cpu_ns += name(&mut b, on_cpu, &mut kernel.running);
    b
}

#[cfg(test)]
mod tests {
    use tracer_common::explain::OffCpu;

    use super::*;

    const MS: u64 = 1_000_000;

    fn asleep(asleep: NamedWaits) -> KernelTime {
        KernelTime {
            asleep,
            ..KernelTime::default()
        }
    }

    fn stopper(phase0: (u64, u64), stopped: (u64, u64)) -> StopperTime {
        let mut s = StopperTime::default();
        s.by_phase[0] = OffCpu {
            runnable_ns: phase0.0,
            blocked_ns: phase0.1,
        };
        s.by_phase[1] = OffCpu {
            runnable_ns: stopped.0,
            blocked_ns: stopped.1,
        };
        s
    }

    #[test]
    fn a_spinning_laggard_explains_the_stopping_phase() {
        // 20 ms pause, 19.5 ms stopping; the laggard ran until 19.4 ms; the
        // stopping thread was woken at 19.4 ms and ran at 19.45 ms.
        let st = stopper((50_000, 19 * MS), (0, 0));
        let b = compute(&Inputs {
            start_ns: 1_000,
            duration_ns: 20 * MS,
            stopping_ns: 19_500_000,
            laggard: Some(LaggardTime {
                stopped_at_ns: 1_000 + 19_400_000,
                // It had slept 19 ms by then; the 50 us wait for a CPU came after.
                stopper_off_before: OffCpu {
                    runnable_ns: 0,
                    blocked_ns: 19 * MS,
                },
                ..LaggardTime::default()
            }),
            stopper: &st,
            stopper_fault_ns: 0,
            stopper_fault_blocked_ns: 0,
            stopper_kernel_stopping: KernelTime::default(),
            stopper_kernel_stopped: KernelTime::default(),
        });
        assert_eq!(b.stopping_on_cpu_ns, 19_400_000);
        assert_eq!(b.off_cpu_runnable_ns, 50_000);
        assert_eq!(b.on_cpu_ns, 50_000 + 500_000);
        assert_eq!(b.unexplained_ns, 0);
        assert_eq!(b.total_ns(), 20 * MS);
        assert_eq!(b.largest()[0], ("stopping_on_cpu", 19_400_000));
    }

    #[test]
    fn throttling_and_faults_of_the_stopped_phase_are_parts() {
        // 10 ms pause, 1 ms stopping with a laggard throttled for 0.6 ms;
        // then the stopping thread is 2.5 ms inside faults (2 ms of them
        // blocked, 0.5 ms waiting to run again), blocked 1 ms otherwise and
        // waits 5 ms for a CPU otherwise.
        let st = stopper((0, 0), (5_500_000, 3 * MS));
        let b = compute(&Inputs {
            start_ns: 0,
            duration_ns: 10 * MS,
            stopping_ns: MS,
            laggard: Some(LaggardTime {
                stopped_at_ns: MS,
                runnable_ns: 600_000,
                ..LaggardTime::default()
            }),
            stopper: &st,
            stopper_fault_ns: 2_500_000,
            stopper_fault_blocked_ns: 2 * MS,
            stopper_kernel_stopping: KernelTime::default(),
            stopper_kernel_stopped: KernelTime::default(),
        });
        assert_eq!(b.stopping_runnable_ns, 600_000);
        assert_eq!(b.stopping_on_cpu_ns, 400_000);
        assert_eq!(b.off_cpu_runnable_ns, 5 * MS);
        assert_eq!(b.faults_ns, 2_500_000);
        assert_eq!(b.off_cpu_blocked_ns, MS);
        assert_eq!(b.on_cpu_ns, 500_000);
        assert_eq!((b.unexplained_ns, b.total_ns()), (0, 10 * MS));
        assert_eq!(b.runnable_ns(), 5_600_000);
    }

    #[test]
    fn a_wait_on_no_seen_laggard_is_unexplained_and_parts_never_overflow() {
        let st = stopper((MS, 4 * MS), (50 * MS, 50 * MS));
        let b = compute(&Inputs {
            start_ns: 0,
            duration_ns: 10 * MS,
            stopping_ns: 6 * MS,
            laggard: None,
            stopper: &st,
            stopper_fault_ns: 0,
            stopper_fault_blocked_ns: 0,
            stopper_kernel_stopping: KernelTime::default(),
            stopper_kernel_stopped: KernelTime::default(),
        });
        assert_eq!(b.off_cpu_runnable_ns, MS);
        assert_eq!(b.off_cpu_blocked_ns, 4 * MS);
        assert_eq!(b.unexplained_ns, 4 * MS);
        assert_eq!(b.on_cpu_ns, MS);
        assert_eq!(b.total_ns(), 10 * MS);
    }

    #[test]
    fn named_sleeps_come_out_of_the_blocked_part_they_were_in() {
        // 10 ms: 4 ms stopping, the laggard asleep 3 ms of it (2 ms on the
        // address space's lock); then the stopping thread asleep 5 ms, 1 ms
        // of it in reclaim; named time beyond a part's sleep is cut.
        let st = stopper((0, 0), (0, 5 * MS));
        let named = |mmap_lock_ns, reclaim_ns| NamedWaits {
            mmap_lock_ns,
            reclaim_ns,
            ..NamedWaits::default()
        };
        // The laggard's and the stopping thread's named sleep.
        let with = |laggard: KernelTime, stopped: KernelTime| {
            compute(&Inputs {
                start_ns: 0,
                duration_ns: 10 * MS,
                stopping_ns: 4 * MS,
                laggard: Some(LaggardTime {
                    stopped_at_ns: 4 * MS,
                    blocked_ns: 3 * MS,
                    kernel: laggard,
                    ..LaggardTime::default()
                }),
                stopper: &st,
                stopper_fault_ns: 0,
                stopper_fault_blocked_ns: 0,
                stopper_kernel_stopping: KernelTime::default(),
                stopper_kernel_stopped: stopped,
            })
        };
        let b = with(asleep(named(2 * MS, 0)), asleep(named(0, MS)));
        assert_eq!(b.mmap_lock_ns, 2 * MS);
        assert_eq!(b.stopping_blocked_ns, MS);
        assert_eq!(b.stopping_on_cpu_ns, MS);
        assert_eq!(b.reclaim_ns, MS);
        assert_eq!(b.off_cpu_blocked_ns, 4 * MS);
        assert_eq!(b.on_cpu_ns, MS);
        assert_eq!(b.total_ns(), 10 * MS);
        // More named than asleep: the sleep is all named, nothing overflows.
        let b = with(asleep(named(2 * MS, 2 * MS)), asleep(named(9 * MS, 0)));
        assert_eq!((b.mmap_lock_ns, b.reclaim_ns), (2 * MS + 5 * MS, MS));
        assert_eq!((b.stopping_blocked_ns, b.off_cpu_blocked_ns), (0, 0));
        assert_eq!(b.total_ns(), 10 * MS);
    }

    #[test]
    fn a_sleep_that_outlasts_the_stopping_phase_goes_on_in_the_stopped_one() {
        // Seen on 6.18: 7.14 ms pause, 10 us stopping; the stopping probe
        // (just after Go's finishedStopping) waited 7.1 ms for the address
        // space's lock, an interval the kernel keeps in the stopping phase.
        let st = stopper((0, 7_100_000), (0, 0));
        let b = compute(&Inputs {
            start_ns: 0,
            duration_ns: 7_140_000,
            stopping_ns: 10_000,
            laggard: None,
            stopper: &st,
            stopper_fault_ns: 0,
            stopper_fault_blocked_ns: 0,
            stopper_kernel_stopping: asleep(NamedWaits {
                probe_ns: 7_100_000,
                ..NamedWaits::default()
            }),
            stopper_kernel_stopped: KernelTime::default(),
        });
        assert_eq!(b.probe_ns, 7_100_000);
        assert_eq!((b.unexplained_ns, b.off_cpu_blocked_ns), (0, 0));
        assert_eq!(b.on_cpu_ns, 40_000);
        assert_eq!(b.total_ns(), 7_140_000);
    }
}
