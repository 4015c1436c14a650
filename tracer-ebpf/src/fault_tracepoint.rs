//! Major-fault backend built from tracepoints and a perf software event, for
//! kernels without kprobes. A fault begins at `exceptions:page_fault_*` (per
//! thread begin time) and, if it was major, ends in the perf software event
//! `PAGE_FAULTS_MAJ` (period 1, one per CPU), which the kernel raises in the
//! faulting thread at the end of the fault (`mm_account_fault`). Minor faults
//! never end here: their state is simply overwritten by the next begin.
//!
//! Field offsets below are those of `/sys/kernel/tracing/events/*/*/format`,
//! a stable ABI.

use aya_ebpf::{
    macros::{perf_event, tracepoint},
    programs::{PerfEventContext, TracePointContext},
};
use tracer_common::fault::{Backend, FaultEvent};

use crate::{
    fault::{FAULT_STATE, begin, close_blocked, current_ids, emit, now, state_mut},
    maps::traced,
};

// exceptions:page_fault_{user,kernel}: unsigned long address (8), ip (16), error_code (24).
const PF_ADDRESS: usize = 8;
const PF_IP: usize = 16;
// sched:sched_switch: long prev_state (32). Current is the previous task.
const SWITCH_PREV_STATE: usize = 32;
// sched:sched_wakeup: pid_t pid (24).
const WAKEUP_PID: usize = 24;
/// `prev_state` bits that mean "went to sleep" (S, D, T, t, ...): preemption
/// reports TASK_RUNNING (0) or TASK_REPORT_MAX (0x100) and is not blocking.
const SLEEP_STATES: i64 = 0xff;

#[inline(always)]
fn fault_begins(ctx: &TracePointContext, flags: u32) -> u32 {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return 0;
    }
    // SAFETY: offsets inside the tracepoint record (format file).
    let address: u64 = unsafe { ctx.read_at(PF_ADDRESS) }.unwrap_or(0);
    let ip: u64 = unsafe { ctx.read_at(PF_IP) }.unwrap_or(0);
    begin(tid, address, ip, flags);
    0
}

/// `exceptions:page_fault_user` (x86 `do_user_addr_fault`): a fault in user
/// mode begins on this thread.
#[tracepoint]
pub fn fault_tp_user(ctx: TracePointContext) -> u32 {
    fault_begins(&ctx, 0)
}

/// `exceptions:page_fault_kernel`: a fault in kernel mode (e.g. a syscall
/// copying from user memory) begins on this thread.
#[tracepoint]
pub fn fault_tp_kernel(ctx: TracePointContext) -> u32 {
    fault_begins(&ctx, FaultEvent::FLAG_KERNEL_MODE)
}

/// Perf software event `PERF_COUNT_SW_PAGE_FAULTS_MAJ`: a major fault of the
/// current thread just ended. Emits the event with begin, end, waits, stack.
#[perf_event]
pub fn fault_perf_major(ctx: PerfEventContext) -> u32 {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return 0;
    }
    // SAFETY: the context is a `bpf_perf_event_data`; `addr` is the fault address.
    let address = unsafe { (*ctx.ctx).addr };
    match state_mut(tid) {
        Some(state) => {
            // A wakeup the kernel could not report (BPF recursion guard in
            // IRQ context) leaves the interval open: the thread runs now.
            close_blocked(state, now());
            emit(&ctx, tgid, tid, Some(state), address, Backend::Tracepoint);
            // Sleeps after the fault must not count toward it.
            let _ = FAULT_STATE.remove(tid);
        }
        None => emit(&ctx, tgid, tid, None, address, Backend::Tracepoint),
    }
    0
}

/// `filemap:mm_filemap_fault`: the fault in progress reads a file page.
#[tracepoint]
pub fn fault_tp_filemap(_ctx: TracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return 0;
    }
    if let Some(state) = state_mut(tid) {
        state.flags |= FaultEvent::FLAG_FILE;
    }
    0
}

/// `block:block_bio_queue`, in the submitting thread: if that thread is in a
/// fault, it issued the read itself (own I/O).
#[tracepoint]
pub fn fault_tp_bio_queue(_ctx: TracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return 0;
    }
    if let Some(state) = state_mut(tid)
        && state.begin_ns != 0
    {
        state.flags |= FaultEvent::FLAG_OWN_IO;
        state.reads_issued += 1;
    }
    0
}

/// `sched:sched_switch`: the current (previous) thread goes off CPU. If it
/// sleeps inside a fault, an off-CPU interval opens; it is own wait if the
/// thread queued I/O in this fault before sleeping, else other.
#[tracepoint]
pub fn fault_tp_switch(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return 0;
    }
    // SAFETY: offset inside the tracepoint record.
    let prev_state: i64 = unsafe { ctx.read_at(SWITCH_PREV_STATE) }.unwrap_or(0);
    if prev_state & SLEEP_STATES == 0 {
        return 0;
    }
    if let Some(state) = state_mut(tid)
        && state.begin_ns != 0
        && state.off_since_ns == 0
    {
        state.off_since_ns = now();
        state.off_own = u32::from(state.flags & FaultEvent::FLAG_OWN_IO != 0);
    }
    0
}

/// `sched:sched_wakeup`: a thread is woken (often from I/O completion in
/// interrupt context). If it slept inside a fault, the interval closes.
#[tracepoint]
pub fn fault_tp_wakeup(ctx: TracePointContext) -> u32 {
    // SAFETY: offset inside the tracepoint record.
    let pid: i32 = unsafe { ctx.read_at(WAKEUP_PID) }.unwrap_or(0);
    if pid <= 0 {
        return 0;
    }
    // The woken thread is not the current one, so TRACED (by tgid) cannot be
    // asked; FAULT_STATE only holds threads of traced processes.
    if let Some(state) = state_mut(pid as u32) {
        close_blocked(state, now());
    }
    0
}
