//! What the kernel gathered about the threads that kept a pause from
//! stopping, and how a pause record lists them (`explain` fills them in).

use serde::Serialize;
use tracer_common::explain::{LaggardState, OffCpu, StopperTime};

use crate::{
    image::Frame,
    model::kernel_wait::{KernelWaitRecord, Phase, Sleeper, WaitKind},
};

/// A laggard's main kind of time in the kernel while the world was stopping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LaggardKernel {
    pub kind: WaitKind,
    pub ns: u64,
}

impl LaggardKernel {
    /// The kind `waits` give laggard `tid` the most time of, while stopping.
    pub fn main_of(waits: &[KernelWaitRecord], tid: u32) -> Option<LaggardKernel> {
        let mut by_kind = std::collections::BTreeMap::<WaitKind, u64>::new();
        for w in waits.iter().filter(|w| {
            w.tid == tid
                && w.thread == Sleeper::Laggard
                && w.phase == Phase::Stopping
                && w.kind.says_why()
        }) {
            *by_kind.entry(w.kind).or_default() += w.ns;
        }
        by_kind
            .into_iter()
            .max_by_key(|&(kind, ns)| (ns, std::cmp::Reverse(kind)))
            .map(|(kind, ns)| LaggardKernel { kind, ns })
    }
}

/// A laggard as the kernel saw it, its frames symbolized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawLaggard {
    pub tid: u32,
    /// `Laggard::*` bits.
    pub flags: u32,
    pub last_out_ns: u64,
    pub out_state: LaggardState,
    pub off: OffCpu,
    /// Off the CPU before it was followed (`Laggard::unseen_off_ns`).
    pub unseen_off_ns: u64,
    /// The stopping thread's stopping-phase off-CPU time at its last
    /// switch-out.
    pub stopper_off_at_out: OffCpu,
    pub goid: u64,
    /// Its goroutine's saved stack when it left the thread, else the
    /// thread's user stack at its last switch-out.
    pub frames: Vec<Frame>,
    /// Its user stack at the laggard sampler's first sample of it while the
    /// world was stopping (empty: never sampled), and how many samples.
    pub held: Vec<Frame>,
    pub held_samples: u32,
    /// Page faults it began while the world was stopping.
    pub faults: u32,
}

/// What the kernel gathered for one pause (`PauseDetail`), for
/// `complete`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExplainInput {
    /// The scheduler programs were attached (the off-CPU times are whole).
    pub sched: bool,
    pub restart_ns: Option<u64>,
    pub stopper: StopperTime,
    pub laggards: Vec<RawLaggard>,
    pub laggards_dropped: u32,
    /// Where in the kernel the followed threads slept, and the time of the
    /// waits the kernel had no slot left for.
    pub waits: Vec<super::kernel_wait::RawWait>,
    pub waits_dropped_ns: u64,
}

/// How a laggard spent the time until it stopped, by its largest part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LaggardStateName {
    /// Running code that reached no safe point.
    OnCpu,
    /// Blocked in a major page fault.
    Fault,
    /// Waiting for a CPU (preempted, throttled).
    Runnable,
    /// Asleep otherwise (a syscall that kept its P, a lock).
    Blocked,
}

/// Where a laggard's `frames` come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FramesFrom {
    /// The major fault it waited in.
    Fault,
    /// The laggard sampler found it running them.
    Sample,
    /// The kernel preempted it there (it waited for a CPU, unsampled).
    Preemption,
    /// Where it stopped (nothing better seen).
    StoppedAt,
}

/// A thread that kept the world from stopping, in a pause record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LaggardRecord {
    pub tid: u32,
    pub state: LaggardStateName,
    /// From the pause's start until it stopped (its last switch-out, at
    /// most the end of stopping).
    pub ns: u64,
    pub on_cpu_ns: u64,
    pub fault_ns: u64,
    pub runnable_ns: u64,
    pub blocked_ns: u64,
    /// It was running a goroutine when the stop began (from the M list).
    pub running_goroutine: bool,
    /// That goroutine's id, if read.
    pub goid: Option<u64>,
    /// The code that kept it from stopping, innermost first: the faulting
    /// code for `fault`; for `on_cpu` and `runnable`, its user stack when
    /// the laggard sampler last found it on a CPU while the world was
    /// stopping, or, never sampled, when the kernel last preempted it in
    /// its goroutine's code then; else `stopped_at`.
    pub frames: Vec<Frame>,
    /// Where `frames` come from.
    pub frames_from: FramesFrom,
    /// Samples that found it on a CPU while the world was stopping (one per
    /// millisecond of CPU time).
    pub held_samples: u32,
    /// Page faults it began while the world was stopping, minor and major
    /// (counted where faults are traced by the tracepoint backend; 0 with
    /// the kprobe backend, which sees major faults only).
    pub page_faults: u32,
    /// The kind of time in the kernel it spent most of while the world was
    /// stopping, of the kinds that say why (`WaitKind::says_why`), asleep
    /// and running together (its `kernel_waits`); `None` without any.
    pub kernel: Option<LaggardKernel>,
    /// Where it stopped: its goroutine's stack when it left the thread, else
    /// its thread's user stack at its last switch-out.
    pub stopped_at: Vec<Frame>,
}
