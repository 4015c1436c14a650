//! The scheduler side of a pause's explanation: `sched:sched_switch` and
//! `sched:sched_waking`, host-wide while any process is traced. Their first
//! action is one array lookup (`PAUSES_OPEN`): while no explained process is
//! inside a pause they return at once. Inside one they follow:
//! - the stopping thread: its off-CPU intervals, runnable (switched out
//!   while running, or woken and waiting for a CPU) or blocked (asleep until
//!   woken), by the phase they began in;
//! - the laggards: the process's other threads leaving the CPU while the
//!   world is stopping, their last switch-out, its state, their off-CPU time
//!   until then and their stack at that point;
//! - the restart: the stopping thread's first wake-up of another thread.
//!
//! Field offsets are those of `/sys/kernel/tracing/events/sched/*/format`.

use aya_ebpf::{
    bindings::{BPF_F_REUSE_STACKID, BPF_F_USER_STACK},
    helpers::{bpf_get_current_task, bpf_probe_read_kernel},
    macros::tracepoint,
    programs::{TracePointContext, tracing::StackIdContext as _},
};
use tracer_common::{
    counters::Counter,
    explain::{
        CANDIDATES, KernelWait, LAGGARDS, Laggard, LaggardState, OffCpu, PHASE_RESTARTING,
        PHASE_STOPPED, PHASE_STOPPING, PauseDetail, PauseThread,
    },
};

use crate::{
    compat::{TaskBtf, TaskLayoutRegs, UserRegs as _},
    explain::{
        PAUSE_STACKS, PAUSE_THREADS, add_kernel_time, any_open, followed, goroutine_frames,
        kernel_stack, laggard_slot, now, open_detail, walk_ms,
    },
    fault::current_ids,
    fault_tracepoint,
    maps::{count, traced},
    regs,
    stack::field,
};

// sched:sched_switch: long prev_state (32), pid_t next_pid (56); the
// current task is the previous one.
const SWITCH_PREV_STATE: usize = 32;
const SWITCH_NEXT_PID: usize = 56;
// sched:sched_waking: pid_t pid (24); common_flags (2).
const WAKING_PID: usize = 24;
const COMMON_FLAGS: usize = 2;
/// `common_flags` bits of a record made in interrupt context (hard IRQ,
/// soft IRQ, NMI): the current task is not the waker.
const IRQ_FLAGS: u8 = 0x08 | 0x10 | 0x40;
/// `prev_state` bits of a sleep (S, D, ...): a preempted task reports
/// TASK_RUNNING (0) or TASK_REPORT_MAX (0x100).
const SLEEP_STATES: i64 = 0xff;
const TASK_UNINTERRUPTIBLE: i64 = 0x2;
/// M list walks per pause (bounds their cost in a long stop: a walk reads
/// 2-3 words per M).
const REWALKS: u32 = 64;

/// `sched:sched_switch`.
#[tracepoint]
pub fn explain_switch(ctx: TracePointContext) -> u32 {
    switched::<true>(&ctx);
    0
}

/// `explain_switch` for kernels before 5.17 (no `bpf_loop`).
#[tracepoint]
pub fn explain_switch_compat(ctx: TracePointContext) -> u32 {
    switched::<false>(&ctx);
    0
}

/// `sched:sched_switch` for both families, where the tracepoint fault
/// backend and the explanation are both on: one program run per context
/// switch host-wide instead of two (each run costs its dispatch and first
/// check, 60-80 ns here, on every switch of every process).
#[tracepoint]
pub fn switch_both(ctx: TracePointContext) -> u32 {
    fault_tracepoint::switched::<TaskBtf>(&ctx);
    switched::<true>(&ctx);
    0
}

/// The body of `explain_switch`; `BPF_LOOP`: the M list walk may use it.
#[inline(always)]
fn switched<const BPF_LOOP: bool>(ctx: &TracePointContext) {
    if !any_open() {
        return;
    }
    let t = now();
    // SAFETY: offsets inside the tracepoint record (format file).
    let prev_state: i64 = unsafe { ctx.read_at(SWITCH_PREV_STATE) }.unwrap_or(0);
    let next: i32 = unsafe { ctx.read_at(SWITCH_NEXT_PID) }.unwrap_or(0);
    switched_out::<BPF_LOOP>(ctx, prev_state, t);
    if next > 0 {
        switched_in(next as u32, t);
    }
}

/// `sched:sched_waking`, in the waker's context (or an interrupt's).
#[tracepoint]
pub fn explain_waking(ctx: TracePointContext) -> u32 {
    if !any_open() {
        return 0;
    }
    let t = now();
    // SAFETY: offsets inside the tracepoint record.
    let pid: i32 = unsafe { ctx.read_at(WAKING_PID) }.unwrap_or(0);
    let flags: u8 = unsafe { ctx.read_at(COMMON_FLAGS) }.unwrap_or(0);
    if pid <= 0 {
        return 0;
    }
    if flags & IRQ_FLAGS == 0 {
        restart_begins(pid as u32, t);
    }
    woken(pid as u32, t);
    0
}

fn state_of(prev_state: i64) -> LaggardState {
    if prev_state & SLEEP_STATES == 0 {
        LaggardState::Runnable
    } else if prev_state & TASK_UNINTERRUPTIBLE != 0 {
        LaggardState::DiskSleep
    } else {
        LaggardState::Sleeping
    }
}

/// The current thread leaves the CPU.
#[inline(always)]
fn switched_out<const BPF_LOOP: bool>(ctx: &TracePointContext, prev_state: i64, t: u64) {
    let (tgid, tid) = current_ids();
    let Some(d) = open_detail(tgid) else {
        return;
    };
    // The M list is read here, not in the stop's entry probe (which every
    // stop pays for inside its pause): first when a thread of the process
    // leaves the CPU while the world is stopping (the stopping thread
    // beginning to wait, or a thread that stopped before it had to), then
    // each time the stopping thread sleeps again (in 100 us steps): an M
    // that had checked for a stop just before it began can have started a
    // goroutine since, which then delays it. A candidate off the CPU at the
    // first walk was so since the stop began. The thread leaving now is
    // judged by the candidates known before (it may have let its P go).
    let unfiltered = d.ncandidates == 0;
    let first = d.rewalked == 0;
    if d.phase == PHASE_STOPPING
        && (first || (tid == d.stop_tid && d.rewalked < REWALKS))
        && let Some(p) = traced(tgid)
    {
        d.rewalked += 1;
        walk_ms::<BPF_LOOP>(d, p, tgid, if first { d.stop_ts_ns } else { t });
    }
    follow_out(ctx, d, tgid, tid, prev_state, t, unfiltered);
}

/// `switched_out` of thread `tid` of `tgid`, whose window `d` is open;
/// `unfiltered`: no M list had named the threads that can delay the stop.
#[inline(always)]
fn follow_out(
    ctx: &TracePointContext,
    d: &mut PauseDetail,
    tgid: u32,
    tid: u32,
    prev_state: i64,
    t: u64,
    unfiltered: bool,
) {
    let state = state_of(prev_state);
    let runnable = state == LaggardState::Runnable;
    if tid == d.stop_tid {
        d.stopper.switches += 1;
        let entry = PauseThread {
            tgid,
            slot: PauseThread::STOPPER,
            stop_ts_ns: d.stop_ts_ns,
            off_since_ns: t,
            off_phase: d.phase,
            woken: u32::from(runnable),
            kstack_id: sleep_stack(ctx, state),
            ..PauseThread::default()
        };
        if PAUSE_THREADS.insert(tid, entry, 0).is_err() {
            count(Counter::MapFull);
        }
        return;
    }
    // What this thread owed since its last switch-out. The entry probe's
    // guess that a candidate was off the CPU held only if a switch-in
    // closed that interval; still open, the thread was running.
    let (pending, mut flags) = match PAUSE_THREADS.get_ptr_mut(tid) {
        // SAFETY: this thread's entry; only its own events touch it now.
        Some(e) if unsafe { (*e).stop_ts_ns } == d.stop_ts_ns => unsafe {
            let was_off = (*e).flags & Laggard::OFF_AT_START != 0 && (*e).off_since_ns == 0;
            (
                (*e).pending,
                if was_off { Laggard::OFF_AT_START } else { 0 },
            )
        },
        _ => (OffCpu::default(), 0),
    };
    // Words, not an Option: the compiler loaded an Option's payload on
    // paths where it was never written, which Linux 6.1's verifier rejects
    // as a read of uninitialized stack (seen in `switch_both`).
    let (m, g) = candidate(d, tid);
    let is_candidate = m != 0;
    // A candidate that stopped without leaving the CPU before the stopping
    // thread's stopping probe: it leaves it now, once (it stopped by
    // `finishedStopping`, where user space clamps it), even if the restart
    // has begun (on a busy host the stopping thread can be that quick).
    if d.phase != PHASE_STOPPING && (!is_candidate || has_slot(d, tid)) {
        return;
    }
    if is_candidate {
        flags |= Laggard::CANDIDATE;
    } else if !unfiltered {
        // The M list named the threads that can delay the stop: others
        // (sysmon, idle Ms waking up) are not laggards.
        return;
    }
    let stopper_off = stopper_off_now(d, t);
    let stint = stint_ns(d);
    let slot = laggard_slot(d, tid);
    let l = &mut d.laggards[slot];
    if l.last_out_ns == 0
        && let Some(stint) = stint
    {
        // Its first switch-out seen: before this stint it was off the CPU
        // since the stop began, apart from what was followed.
        let gap = t.saturating_sub(stint).saturating_sub(d.stop_ts_ns);
        l.unseen_off_ns = gap.saturating_sub(pending.runnable_ns + pending.blocked_ns);
    }
    l.flags |= flags;
    l.off.runnable_ns += pending.runnable_ns;
    l.off.blocked_ns += pending.blocked_ns;
    l.stopper_off_at_out = stopper_off;
    l.last_out_ns = t;
    l.out_state = state as u32;
    // Its goroutine's stack: the saved one once it left the thread (it
    // stopped at a safe point), else the thread's live user stack (its
    // goroutine preempted by the kernel, or in a fault or a syscall).
    let mut left = false;
    if g != 0
        && let Some(p) = traced(tgid)
        && field(m, p.offsets.m_curg).is_some_and(|cur| cur != g)
    {
        goroutine_frames(g, &p.offsets, l);
        left = true;
    }
    if !left {
        let flags = (BPF_F_USER_STACK | BPF_F_REUSE_STACKID) as u64;
        l.user_stack_id = match ctx.get_stackid(&PAUSE_STACKS, flags) {
            Ok(id) => id as i32,
            Err(e) => {
                count(Counter::LaggardStackFailed);
                e
            }
        };
        // Preempted by the kernel in its goroutine's own code while the
        // world waits: that is code that held it, the evidence the laggard
        // sampler would have taken had it found the thread on a CPU.
        if runnable
            && d.phase == PHASE_STOPPING
            && l.held_samples == 0
            && l.user_stack_id >= 0
            && in_goroutine_code(tgid, g)
        {
            l.held_stack_id = l.user_stack_id;
            l.flags |= Laggard::HELD_AT_PREEMPTION;
        }
    }
    let entry = PauseThread {
        tgid,
        slot: slot as u32,
        stop_ts_ns: d.stop_ts_ns,
        off_since_ns: t,
        off_phase: d.phase,
        woken: u32::from(runnable),
        kstack_id: sleep_stack(ctx, state),
        ..PauseThread::default()
    };
    if PAUSE_THREADS.insert(tid, entry, 0).is_err() {
        count(Counter::MapFull);
    }
}

/// The kernel stack a thread leaving the CPU in `state` sleeps at: taken
/// for an uninterruptible sleep only (`KernelWait::INTERRUPTIBLE`).
#[inline(always)]
fn sleep_stack(ctx: &TracePointContext, state: LaggardState) -> i32 {
    match state {
        LaggardState::DiskSleep => kernel_stack(ctx),
        LaggardState::Sleeping => KernelWait::INTERRUPTIBLE,
        _ => -1,
    }
}

/// Add `ns` of sleep at `e`'s kernel stack to `d`'s waits: the stopping
/// thread's in any phase, a laggard's only while the world is stopping (its
/// sleep after it stopped kept no one waiting).
#[inline(always)]
fn add_wait(d: &mut PauseDetail, tid: u32, e: &PauseThread, ns: u64) {
    if e.slot != PauseThread::STOPPER && d.phase != PHASE_STOPPING {
        return;
    }
    add_kernel_time(d, tid, e.off_phase, e.kstack_id, ns);
}

/// Whether the current thread left user mode running goroutine `g` on
/// `g`'s own stack (g's register holds it in Go's ABIInternal): not the runtime on g0's
/// stack on its way to stopping. Its user registers are where the kernel
/// saved them on entry (`TASK_LAYOUT`, read on every kernel).
#[inline(always)]
fn in_goroutine_code(tgid: u32, g: u64) -> bool {
    if g == 0 {
        return false;
    }
    let (Some(saved), Some(p)) = (TaskLayoutRegs::current(), traced(tgid)) else {
        return false;
    };
    // SAFETY: reads of the kernel stack through the checked helper.
    let read = |at: *const u64| unsafe { bpf_probe_read_kernel(at) }.ok();
    let (Some(g_now), Some(sp)) = (read(regs::g_at(saved)), read(regs::sp_at(saved))) else {
        return false;
    };
    let (Some(lo), Some(hi)) = (
        field(g, p.offsets.g_stack_lo),
        field(g, p.offsets.g_stack_hi),
    ) else {
        return false;
    };
    g_now == g && (lo..hi).contains(&sp)
}

/// Whether `tid` has a laggard slot in `d` with a switch-out (the laggard
/// sampler's slots may have none yet).
#[inline(always)]
fn has_slot(d: &PauseDetail, tid: u32) -> bool {
    for i in 0..LAGGARDS {
        if i >= d.nlaggards as usize {
            break;
        }
        if d.laggards[i].tid == tid && d.laggards[i].last_out_ns != 0 {
            return true;
        }
    }
    false
}

/// The current task's on-CPU time since it last got a CPU (its
/// `task_struct`: `se.sum_exec_runtime - se.prev_sum_exec_runtime`, brought
/// up to date by the switch being traced), if the offsets are known.
#[inline(always)]
fn stint_ns(d: &PauseDetail) -> Option<u64> {
    if d.task_sum_exec == 0 || d.task_prev_sum_exec == 0 {
        return None;
    }
    // SAFETY: the current task is valid for the program's run; the reads
    // go through the checked helper.
    unsafe {
        let task = bpf_get_current_task();
        let sum: u64 =
            bpf_probe_read_kernel((task + u64::from(d.task_sum_exec)) as *const u64).ok()?;
        let prev: u64 =
            bpf_probe_read_kernel((task + u64::from(d.task_prev_sum_exec)) as *const u64).ok()?;
        Some(sum.saturating_sub(prev))
    }
}

/// The stopping thread's off-CPU time of the stopping phase so far,
/// counting an interval in progress up to `t`.
#[inline(always)]
fn stopper_off_now(d: &PauseDetail, t: u64) -> OffCpu {
    let mut off = d.stopper.by_phase[0];
    if let Some(e) = PAUSE_THREADS.get_ptr_mut(d.stop_tid) {
        // SAFETY: a read of the stopper's entry.
        let e = unsafe { &*e };
        if e.stop_ts_ns == d.stop_ts_ns && e.off_since_ns != 0 && e.off_phase == PHASE_STOPPING {
            let ns = t.saturating_sub(e.off_since_ns);
            if e.woken != 0 {
                off.runnable_ns += ns;
            } else {
                off.blocked_ns += ns;
            }
        }
    }
    off
}

/// `(m, g)` of `tid` if the M list had it running a goroutine, else
/// `(0, 0)`.
#[inline(always)]
pub(crate) fn candidate(d: &PauseDetail, tid: u32) -> (u64, u64) {
    for i in 0..CANDIDATES {
        if i >= d.ncandidates as usize {
            break;
        }
        // Opaque index: see `explain::add_candidate`.
        let Some(c) = d.candidates.get(core::hint::black_box(i)) else {
            break;
        };
        if c.tid == tid {
            return (c.m, c.g);
        }
    }
    (0, 0)
}

/// Thread `tid` is woken: the blocked part of its interval ends.
#[inline(always)]
fn woken(tid: u32, t: u64) {
    let Some((e, d)) = followed(tid) else {
        return;
    };
    if e.off_since_ns == 0 || e.woken != 0 {
        return;
    }
    let blocked = t.saturating_sub(e.off_since_ns);
    add_wait(d, tid, e, blocked);
    if e.slot == PauseThread::STOPPER {
        d.stopper.by_phase[phase_index(e.off_phase)].blocked_ns += blocked;
        if d.phase == PHASE_STOPPING {
            d.stopper.last_woken_ns = t;
        }
    } else {
        e.pending.blocked_ns += blocked;
    }
    e.off_since_ns = t;
    e.woken = 1;
}

/// Thread `tid` gets a CPU: its interval ends (runnable since it was woken
/// or preempted; blocked if it was never seen woken).
#[inline(always)]
fn switched_in(tid: u32, t: u64) {
    let Some((e, d)) = followed(tid) else {
        return;
    };
    if e.off_since_ns == 0 {
        return;
    }
    let ns = t.saturating_sub(e.off_since_ns);
    // A candidate the entry probe guessed off the CPU, never woken, was
    // waiting for one: runnable.
    let runnable = e.woken != 0 || e.flags & Laggard::OFF_AT_START != 0;
    if !runnable {
        add_wait(d, tid, e, ns);
    }
    if e.slot == PauseThread::STOPPER {
        let off = &mut d.stopper.by_phase[phase_index(e.off_phase)];
        if runnable {
            off.runnable_ns += ns;
        } else {
            off.blocked_ns += ns;
        }
        if d.phase == PHASE_STOPPING {
            d.stopper.last_in_ns = t;
        }
    } else if runnable {
        e.pending.runnable_ns += ns;
    } else {
        e.pending.blocked_ns += ns;
    }
    e.off_since_ns = 0;
    e.woken = 0;
}

fn phase_index(phase: u32) -> usize {
    match phase {
        PHASE_STOPPED => 1,
        PHASE_RESTARTING => 2,
        _ => 0,
    }
}

/// The current thread wakes `wakee`: if it is a stopping thread whose world
/// is stopped, the restart has begun (`startTheWorldWithSema` hands Ps back
/// to their Ms). Without the stopping probe the phase is still "stopping"
/// here: the first wake-up it makes is then taken as the restart.
#[inline(always)]
fn restart_begins(wakee: u32, t: u64) {
    let (tgid, tid) = current_ids();
    if wakee == tid {
        return;
    }
    let Some(d) = open_detail(tgid) else {
        return;
    };
    let stopped = d.phase == PHASE_STOPPED
        || (d.phase == PHASE_STOPPING && d.config & PauseDetail::STOPPED_PROBE == 0);
    if tid == d.stop_tid && stopped {
        d.phase = PHASE_RESTARTING;
        d.restart_ns = t;
    }
}
