//! What explains a pause beyond its duration, gathered by the kernel while
//! the window is open and sent as one `PauseDetail` event just before the
//! pause's own `PauseEvent` (same ring buffer, so in that order):
//! - the caller: the goroutine stack that asked for the stop;
//! - the stopping thread's off-CPU time by phase (runnable but not running:
//!   preempted, throttled, or woken and waiting for a CPU; blocked:
//!   sleeping until woken);
//! - the laggards: the other threads of the process seen leaving the CPU
//!   while the world was stopping, when each last did, in what state, their
//!   off-CPU time until then and what they were running.
//!
//! The value lives in `PAUSE_DETAILS`, one per traced process, inserted by
//! user space when the process is traced (its presence is the "explain
//! this process" switch) and reset by the `stopTheWorldWithSema` entry
//! probe. The scheduler programs (`explain_switch`, `explain_waking`) find
//! threads of processes inside a pause through `PAUSE_THREADS` (by tid) and
//! do nothing at all while no traced process is inside a pause
//! (`PAUSES_OPEN`).

use crate::{assert_size, event::EventHeader};

/// Return addresses kept of the stopping goroutine's stack.
pub const CALLER_FRAMES: usize = 16;
/// Laggards kept per pause. When more leave the CPU, the one that left it
/// earliest gives its slot up (the last to stop is the one that held the
/// pause); those are counted in `laggards_dropped`.
pub const LAGGARDS: usize = 8;
/// Return addresses kept of a laggard's goroutine.
pub const LAGGARD_FRAMES: usize = 8;
/// Threads running a goroutine at the stop's entry that are remembered
/// (the M list is walked up to `MAX_MS` entries).
pub const CANDIDATES: usize = 8;
pub const KERNEL_WAITS: usize = 8;
/// Ms walked at the stop's entry.
pub const MAX_MS: usize = 32;

/// Phases of a pause, as the kernel programs see them.
pub const PHASE_STOPPING: u32 = 0;
/// Every P stopped (the stopping probe fired).
pub const PHASE_STOPPED: u32 = 1;
/// The stopping thread woke another thread of its process: the world is
/// being restarted (`startTheWorldWithSema` hands Ps back).
pub const PHASE_RESTARTING: u32 = 2;
/// Number of phases.
pub const PHASES: usize = 3;

/// Off-CPU time of one thread in one phase.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpu {
    /// Runnable but not running: switched out while running (preempted,
    /// throttled) until back on a CPU, or woken until back on a CPU.
    pub runnable_ns: u64,
    /// Sleeping: switched out in a sleep state until woken.
    pub blocked_ns: u64,
}
assert_size!(OffCpu, 16);

/// The stopping thread's off-CPU time, by the phase its intervals began in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StopperTime {
    pub by_phase: [OffCpu; PHASES],
    /// Its last wake-up while stopping (what woke it for good is the last
    /// P to stop), and its switch-in after that: the stopping thread's own
    /// reaction time.
    pub last_woken_ns: u64,
    pub last_in_ns: u64,
    /// Its switches off the CPU inside the window.
    pub switches: u32,
    /// Page faults it began inside the window, every kind (the tracepoint
    /// fault backend only).
    pub faults: u32,
}
assert_size!(StopperTime, 16 * PHASES + 24);

/// A thread of the process seen leaving the CPU while the world stopped.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Laggard {
    pub tid: u32,
    /// `LAGGARD_*` bits.
    pub flags: u32,
    /// Its last switch-out while stopping (`bpf_ktime_get_ns`).
    pub last_out_ns: u64,
    /// Its off-CPU time from the stop's start until `last_out_ns` (intervals
    /// that ended before its last switch-out).
    pub off: OffCpu,
    /// Off the CPU before its first seen stint and not in `off` (it was
    /// not followed yet): from the stop's start to that stint's start, by
    /// its `task_struct`'s on-CPU time (0 where that is not known).
    pub unseen_off_ns: u64,
    /// The stopping thread's off-CPU time of the stopping phase up to this
    /// laggard's last switch-out (the rest is its reaction).
    pub stopper_off_at_out: OffCpu,
    /// `LaggardState` of its last switch-out.
    pub out_state: u32,
    /// Its user stack at the last switch-out where its goroutine was still
    /// on the thread (preempted, or in a fault or syscall), in
    /// `PAUSE_STACKS`; negative: none.
    pub user_stack_id: i32,
    /// Its user stack at the first sample of the laggard sampler that found
    /// it on a CPU while the world was stopping (the code that kept it from
    /// stopping; a later one can catch it entering its safe point), in
    /// `PAUSE_STACKS`; negative: none. Never sampled, its
    /// user stack when the kernel last preempted it in its goroutine's code
    /// while the world was stopping (`HELD_AT_PREEMPTION`).
    pub held_stack_id: i32,
    /// Samples that found it on a CPU while the world was stopping.
    pub held_samples: u32,
    /// Its goroutine's id (0 unknown), and that goroutine's saved stack
    /// when it left the thread (`LAGGARD_FRAMES` set).
    pub goid: u64,
    pub nframes: u32,
    /// Page faults it began while the world was stopping, every kind (the
    /// tracepoint fault backend only).
    pub faults: u32,
    pub frames: [u64; LAGGARD_FRAMES],
}
assert_size!(
    Laggard,
    8 + 8 + 16 + 8 + 16 + 8 + 8 + 8 + 8 + 8 * LAGGARD_FRAMES
);

impl Laggard {
    /// It held a P while the world stopped (the M list).
    pub const CANDIDATE: u32 = 1 << 0;
    /// `frames` is its goroutine's saved stack (it left the thread).
    pub const GOROUTINE_FRAMES: u32 = 1 << 1;
    /// Its first event in the window was a switch-in: it was off the CPU
    /// when the stop began (the time until then is in `off`).
    pub const OFF_AT_START: u32 = 1 << 2;
    /// `held_stack_id` is from a preemption, not a sample (on a busy host
    /// a laggard can wait for a CPU through the whole stop, never sampled).
    pub const HELD_AT_PREEMPTION: u32 = 1 << 3;
}

/// How a thread left the CPU (`prev_state` of `sched:sched_switch`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaggardState {
    /// Not seen leaving.
    None = 0,
    /// Still runnable: preempted or throttled.
    Runnable = 1,
    /// Interruptible sleep (futex, wait queues).
    Sleeping = 2,
    /// Uninterruptible sleep (disk I/O, page locks).
    DiskSleep = 3,
}

impl LaggardState {
    /// The state of a raw value.
    pub const fn from_u32(v: u32) -> LaggardState {
        match v {
            1 => LaggardState::Runnable,
            2 => LaggardState::Sleeping,
            3 => LaggardState::DiskSleep,
            _ => LaggardState::None,
        }
    }
}

/// Time a followed thread spent in the kernel at one kernel stack: the
/// stopping thread in any phase, a laggard while the world was stopping.
/// Asleep (blocked, not runnable): the stack is taken where the thread left
/// the CPU, so it says what it waited on (the address space's lock,
/// reclaim, page I/O, a futex). Running (`ON_CPU`, from the laggard
/// sampler): the stack it was interrupted at (a page fault, reclaim).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelWait {
    pub tid: u32,
    /// The phase the wait began in (`PHASE_*`).
    pub phase: u32,
    /// Its kernel stack in `PAUSE_STACKS` (negative: not taken).
    pub kstack_id: i32,
    /// Intervals added up here.
    pub count: u32,
    pub blocked_ns: u64,
}
assert_size!(KernelWait, 24);

impl KernelWait {
    /// In `phase`: time the thread was found running in the kernel by the
    /// laggard sampler (`blocked_ns` counts its samples' period), not asleep.
    pub const ON_CPU: u32 = 1 << 8;
    /// `kstack_id` of an interruptible sleep (S): its stack is not taken.
    /// Go's own futex waits are most of them (the stopping thread sleeps
    /// and wakes every 100 us while it waits), and a kernel stack costs a
    /// few hundred ns each; what a pause can wait on in the kernel (locks,
    /// reclaim, I/O) sleeps uninterruptibly (D).
    pub const INTERRUPTIBLE: i32 = i32::MIN;
}

/// A thread holding a P while the world stops (from the M list).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Candidate {
    pub tid: u32,
    pub _pad: u32,
    /// Its M and the last goroutine seen on it (`m.curg`; 0: none yet).
    pub m: u64,
    pub g: u64,
}
assert_size!(Candidate, 24);

/// The explanation of one pause (`EventKind::PauseDetail`). `header.ts_ns`
/// is when it was sent (the end probe of `startTheWorldWithSema`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PauseDetail {
    pub header: EventHeader,
    /// The pause's `PauseWindow::stop_ts_ns`, to pair it with its event.
    pub stop_ts_ns: u64,
    /// The thread that stopped the world.
    pub stop_tid: u32,
    /// Return addresses in `caller` (0: not read).
    pub caller_len: u32,
    /// The stopping thread's stack at the stop's entry, innermost first,
    /// all return addresses by the frame pointers: its g0 frames (up to
    /// the one into `runtime.systemstack`), then the goroutine that asked
    /// for the stop (the call of `systemstack` in e.g.
    /// `runtime.stopTheWorld`, then its callers).
    pub caller: [u64; CALLER_FRAMES],
    /// 1 while the window is open (counted in `PAUSES_OPEN`).
    pub open: u32,
    /// `PHASE_*` now.
    pub phase: u32,
    /// `PauseDetail::*` settings user space gave (kept across pauses).
    pub config: u32,
    pub _pad: u32,
    /// Byte offsets in the kernel's `task_struct` of
    /// `se.sum_exec_runtime` and `se.prev_sum_exec_runtime` (from BTF; 0:
    /// unknown), set by user space.
    pub task_sum_exec: u32,
    pub task_prev_sum_exec: u32,
    /// When every P had stopped (the stopping probe's clock, just after
    /// Go's `finishedStopping`; 0 without it) and when the restart began (the stopping thread's
    /// first wake-up of another thread of the process after that; 0 if none
    /// was seen).
    pub stopped_ns: u64,
    pub restart_ns: u64,
    pub stopper: StopperTime,
    /// The runtime address of `runtime.allm` (0: unknown), for those walks,
    /// set at each stop's entry from the link-time addresses of
    /// `runtime.allm` and `stopTheWorldWithSema` user space gives (kept
    /// across pauses: the entry probe needs no `TRACED` lookup); walks made
    /// so far (0: none yet).
    pub allm: u64,
    pub allm_link: u64,
    pub stop_the_world_link: u64,
    pub rewalked: u32,
    /// Candidates in `candidates`; the Ms walked last time.
    pub ncandidates: u32,
    pub ms_walked: u32,
    /// Laggards in `laggards`, and those seen but not kept.
    pub nlaggards: u32,
    pub laggards_dropped: u32,
    pub _pad2: u32,
    /// Waits in `waits`, and those not kept (all in use) with their time.
    pub nwaits: u32,
    pub waits_dropped: u32,
    pub waits_dropped_ns: u64,
    pub waits: [KernelWait; KERNEL_WAITS],
    /// Sent up to the last laggard in use (`PauseDetail::sent_len`): what
    /// follows stays in the kernel.
    pub laggards: [Laggard; LAGGARDS],
    /// Threads holding a P (from the M list) when a thread of the process
    /// first left the CPU while the world was stopping, or at one of the
    /// stopping thread's later sleeps waiting for them (an M that checked
    /// for a stop just before it began can start a goroutine after it),
    /// with the last goroutine seen on each.
    pub candidates: [Candidate; CANDIDATES],
}
assert_size!(
    PauseDetail,
    24 + 16
        + 8 * CALLER_FRAMES
        + 40
        + (16 * PHASES + 24)
        + 48
        + 16
        + 24 * KERNEL_WAITS
        + LAGGARDS * (88 + 8 * LAGGARD_FRAMES)
        + 24 * CANDIDATES
);

/// A zeroed laggard.
const NO_LAGGARD: Laggard = Laggard {
    tid: 0,
    flags: 0,
    last_out_ns: 0,
    off: OffCpu {
        runnable_ns: 0,
        blocked_ns: 0,
    },
    unseen_off_ns: 0,
    stopper_off_at_out: OffCpu {
        runnable_ns: 0,
        blocked_ns: 0,
    },
    out_state: 0,
    user_stack_id: -1,
    held_stack_id: -1,
    held_samples: 0,
    goid: 0,
    nframes: 0,
    faults: 0,
    frames: [0; LAGGARD_FRAMES],
};

impl PauseDetail {
    /// Bytes of a detail before its laggards: what is always sent.
    pub const LAGGARDS_AT: usize = core::mem::offset_of!(PauseDetail, laggards);

    /// Bytes sent of a detail with `nlaggards` laggards in use: the
    /// candidates and unused laggard slots stay in the kernel (a pause
    /// usually has none or one, and the ring buffer's pages are cold).
    pub const fn sent_len(nlaggards: usize) -> usize {
        let n = if nlaggards < LAGGARDS {
            nlaggards
        } else {
            LAGGARDS
        };
        Self::LAGGARDS_AT + n * core::mem::size_of::<Laggard>()
    }

    /// `config`: the stopping probe is attached (it moves the phase to
    /// `PHASE_STOPPED`).
    pub const STOPPED_PROBE: u32 = 1 << 0;
    /// `config`: the scheduler programs are attached (off-CPU times are
    /// whole).
    pub const SCHED: u32 = 1 << 1;

    /// A zeroed value, what user space inserts for a newly traced process.
    pub const ZERO: PauseDetail = PauseDetail {
        header: EventHeader {
            kind: 0,
            tgid: 0,
            tid: 0,
            cpu: 0,
            ts_ns: 0,
        },
        stop_ts_ns: 0,
        stop_tid: 0,
        caller_len: 0,
        caller: [0; CALLER_FRAMES],
        open: 0,
        phase: PHASE_STOPPING,
        config: 0,
        _pad: 0,
        task_sum_exec: 0,
        task_prev_sum_exec: 0,
        stopped_ns: 0,
        restart_ns: 0,
        stopper: StopperTime {
            by_phase: [OffCpu {
                runnable_ns: 0,
                blocked_ns: 0,
            }; PHASES],
            last_woken_ns: 0,
            last_in_ns: 0,
            switches: 0,
            faults: 0,
        },
        nlaggards: 0,
        laggards_dropped: 0,
        nwaits: 0,
        waits_dropped: 0,
        waits_dropped_ns: 0,
        waits: [KernelWait {
            tid: 0,
            phase: 0,
            kstack_id: -1,
            count: 0,
            blocked_ns: 0,
        }; KERNEL_WAITS],
        laggards: [NO_LAGGARD; LAGGARDS],
        ncandidates: 0,
        ms_walked: 0,
        candidates: [Candidate {
            tid: 0,
            _pad: 0,
            m: 0,
            g: 0,
        }; CANDIDATES],
        allm: 0,
        allm_link: 0,
        stop_the_world_link: 0,
        rewalked: 0,
        _pad2: 0,
    };
}

/// A thread the scheduler programs follow inside a pause window (key: tid):
/// the stopping thread and the laggards, while they are off the CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PauseThread {
    pub tgid: u32,
    /// Index in `PauseDetail::laggards`, or `STOPPER`.
    pub slot: u32,
    /// The window it belongs to (`PauseDetail::stop_ts_ns`).
    pub stop_ts_ns: u64,
    /// Off the CPU since (0: on it).
    pub off_since_ns: u64,
    /// The phase the interval began in.
    pub off_phase: u32,
    /// 1 once woken (the rest of the interval is runnable).
    pub woken: u32,
    /// A laggard's off-CPU time since its last switch-out, added to its
    /// `Laggard::off` at the next one.
    pub pending: OffCpu,
    /// `Laggard::*` bits to give its slot.
    pub flags: u32,
    /// The kernel stack where it last left the CPU asleep (negative: none),
    /// in `PAUSE_STACKS`.
    pub kstack_id: i32,
}
assert_size!(PauseThread, 56);

impl PauseThread {
    /// `slot` of the stopping thread.
    pub const STOPPER: u32 = u32::MAX;
    /// `slot` of a thread that has no laggard slot yet.
    pub const NO_SLOT: u32 = u32::MAX - 1;
}

/// Names of the scheduler programs: (program, tracepoint category, name).
pub const SCHED_PROGRAMS: &[(&str, &str, &str)] = &[
    ("explain_switch", "sched", "sched_switch"),
    ("explain_waking", "sched", "sched_waking"),
];
/// The CPU-clock program that takes the laggards' stacks while they hold a
/// stop (one perf event per CPU, attached with `SCHED_PROGRAMS`).
pub const LAGGARD_SAMPLER: &str = "laggard_sample";
/// Its period: every millisecond of each CPU's time, so a laggard that
/// holds a stop 1 ms on a CPU is sampled at least once.
pub const LAGGARD_SAMPLE_PERIOD_NS: u64 = 1_000_000;
/// The `sched_switch` program of `SCHED_PROGRAMS`.
pub const EXPLAIN_SWITCH: &str = "explain_switch";
/// The one program on `sched:sched_switch` that does the work of both
/// `explain_switch` and the tracepoint fault backend's `fault_tp_switch`,
/// attached in their place when both are on.
pub const SWITCH_BOTH: &str = "switch_both";

#[cfg(feature = "user")]
mod user {
    // SAFETY: #[repr(C)] plain integers with no implicit padding (sizes
    // asserted above), so any byte pattern is a valid value.
    unsafe impl aya::Pod for super::PauseDetail {}
    unsafe impl aya::Pod for super::PauseThread {}
}
