//! Major-fault backend built from tracepoints and a perf software event, for
//! kernels without kprobes. A fault begins at `exceptions:page_fault_*` (x86)
//! or, where those do not exist (arm64), at the perf software event
//! `PAGE_FAULTS`, which the fault handler raises before it looks up the
//! VMA; if it was major, it ends in the perf software event `PAGE_FAULTS_MAJ`
//! (period 1, one per CPU), which the kernel raises in the faulting thread at
//! the end of the fault (`mm_account_fault`). Minor faults never end here.
//!
//! Cost is set per event: the begin runs on every page fault of a traced
//! process, minor ones included, so it writes only this CPU's `FaultBegin`
//! slot (no hash update). A thread that stays on the CPU until its fault
//! ends finds its slot at the end. A thread that switches out while still
//! inside the fault (it sleeps on I/O or a page lock, or is preempted, and
//! may resume on another CPU) has its slot promoted into the per-thread
//! `FAULT_STATE` entry by `sched_switch` first. The scheduler hooks pay one
//! cheap check for threads not inside a fault.
//!
//! Field offsets below are those of `/sys/kernel/tracing/events/*/*/format`,
//! a stable ABI; the records are read with direct loads.

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{
    EbpfContext as _,
    helpers::bpf_probe_read_kernel,
    macros::{map, perf_event, tracepoint},
    maps::{Array, PerCpuArray},
    programs::{PerfEventContext, TracePointContext},
};
use tracer_common::{
    counters::Counter,
    fault::{Backend, FaultBegin, FaultEvent, FaultState},
};

use crate::{
    compat::{TaskBtf, TaskLayoutRegs, UserRegs},
    fault::{FAULT_STATE, close_blocked, current_ids, emit, now, state_mut},
    maps::{count, traced},
    regs,
};

// exceptions:page_fault_{user,kernel}: unsigned long address (8), ip (16), error_code (24).
const PF_ADDRESS: usize = 8;
const PF_IP: usize = 16;
// sched:sched_switch: pid_t prev_pid (24), long prev_state (32). Current is the previous task.
const SWITCH_PREV_PID: usize = 24;
const SWITCH_PREV_STATE: usize = 32;
// sched:sched_wakeup: pid_t pid (24).
const WAKEUP_PID: usize = 24;
/// `prev_state` as sched_switch reports it: one bit per state letter
/// (S 0x1, D 0x2, T 0x4, ..., I 0x80); preemption reports TASK_RUNNING (0)
/// or TASK_REPORT_MAX (0x100).
const STATE_LETTERS: i64 = 0xff;
/// D: the only way a thread sleeps inside a page fault (I/O, page locks,
/// mmap_lock, reclaim; killable waits report D too). Interruptible sleeps
/// (futex, epoll, nanosleep: most switches of a Go program) are never inside
/// a fault, so they cost no lookup.
const UNINTERRUPTIBLE: i64 = 0x2;

/// The fault in progress on each CPU (index 0), see `FaultBegin`.
#[map]
static FAULT_BEGIN: PerCpuArray<FaultBegin> = PerCpuArray::with_max_entries(1, 0);

/// Threads asleep inside a fault right now, over all CPUs (index 0). While it
/// is 0, `sched_wakeup` (every wake-up on the machine) returns after reading
/// it. It can only err high (an entry evicted or replaced while its interval
/// was open), which costs a lookup per wake-up, never a missed interval.
#[map]
static FAULT_SLEEPERS: Array<u64> = Array::with_max_entries(1, 0);

/// Field of the tracepoint record at `offset`.
#[inline(always)]
fn field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: tracepoint programs may load their record directly at a
    // constant offset inside it, aligned to the size; the verifier checks
    // both. Cheaper than a bpf_probe_read call.
    unsafe { ctx.as_ptr().cast::<u8>().add(offset).cast::<T>().read() }
}

/// This CPU's fault slot.
#[inline(always)]
fn slot() -> Option<&'static mut FaultBegin> {
    // SAFETY: this CPU's value. Programs that use it (tracepoints and the
    // perf software event, all in task context) never run nested on one CPU.
    FAULT_BEGIN.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// This CPU's fault slot if it holds a fault of thread `tid`.
#[inline(always)]
fn live_slot(tid: u32) -> Option<&'static mut FaultBegin> {
    slot().filter(|s| s.tid != 0 && s.tid == tid)
}

/// Add `delta` (wrapping) to `FAULT_SLEEPERS`, atomically: wakeups run on
/// any CPU. The BPF target has no `AtomicU64::fetch_add` (no compare and
/// swap), but its atomic add is what the intrinsic compiles to.
#[inline(always)]
fn sleepers_add(delta: u64) {
    if let Some(p) = FAULT_SLEEPERS.get_ptr_mut(0) {
        // SAFETY: a valid, aligned u64 in the map; every access is atomic.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, delta) };
    }
}

/// Whether some thread may be asleep inside a fault.
#[inline(always)]
fn any_sleeper() -> bool {
    // An aligned 8-byte load is atomic; the BPF target has no atomic-load
    // instruction before cpu v4, so a volatile read stands in for it.
    FAULT_SLEEPERS.get_ptr(0).is_some_and(|p| {
        // SAFETY: as in `sleepers_add`.
        unsafe { p.read_volatile() != 0 }
    })
}

/// A thread goes to sleep inside its fault: open an off-CPU interval, own
/// wait if it queued I/O in this fault before sleeping, else other.
#[inline(always)]
fn open_interval(state: &mut FaultState) {
    state.off_since_ns = now();
    state.off_own = u32::from(state.flags & FaultEvent::FLAG_OWN_IO != 0);
}

/// The kernel stack the current thread, of an explained process, goes to
/// sleep at inside its fault (-1 for other processes: nobody reads it).
/// Taken here, outside pauses too, because a stop that begins while the
/// thread sleeps sees no switch-out of it.
#[inline(always)]
fn sleep_stack(ctx: &TracePointContext) -> i32 {
    let (tgid, _) = current_ids();
    if crate::explain::explained(tgid) {
        crate::explain::kernel_stack(ctx)
    } else {
        -1
    }
}

/// The thread runs again (or its fault ended): close its open interval.
#[inline(always)]
fn close_interval(state: &mut FaultState) {
    if state.off_since_ns == 0 {
        return;
    }
    close_blocked(state, now());
    sleepers_add(u64::MAX);
}

/// Whether the current thread, switching out, is still inside the fault
/// that began at `ip`: a user-mode fault leaves the faulting instruction in
/// the thread's saved user registers until the thread enters the kernel
/// again. Kernel-mode faults (a syscall copying user memory) cannot be told
/// apart this way and count as inside, as do faults where the registers
/// cannot be found.
#[inline(always)]
fn still_in_fault<R: UserRegs>(flags: u32, ip: u64) -> bool {
    if flags & FaultEvent::FLAG_KERNEL_MODE != 0 {
        return true;
    }
    let Some(saved) = R::current() else {
        return true;
    };
    // SAFETY: read through the checked helper.
    unsafe { bpf_probe_read_kernel(regs::pc_at(saved)) }.is_ok_and(|pc| pc == ip)
}

/// The fault of a slot as per-thread state.
#[inline(always)]
fn state_of(b: &FaultBegin) -> FaultState {
    FaultState {
        begin_ns: b.begin_ns,
        address: b.address,
        ip: b.ip,
        flags: b.flags,
        reads_issued: b.reads_issued,
        sleep_stack_id: -1,
        ..FaultState::default()
    }
}

/// A fault at `address`, of the instruction at `ip`, begins on this thread.
#[inline(always)]
fn fault_begins(address: u64, ip: u64, flags: u32) -> u32 {
    let (tgid, tid) = current_ids();
    let Some(slot) = slot() else {
        return 0;
    };
    // A traced process faults many times in a row on a CPU: remember it
    // there rather than look it up each time. A process untraced since
    // (it exited, and its tgid was reused) only costs slot writes until
    // another traced process faults on this CPU; its faults send nothing
    // (the end checks `TRACED`).
    if slot.traced_tgid != tgid {
        if traced(tgid).is_none() {
            return 0;
        }
        slot.traced_tgid = tgid;
    }
    slot.tid = tid;
    slot.flags = flags;
    slot.begin_ns = now();
    slot.address = address;
    slot.ip = ip;
    slot.reads_issued = 0;
    crate::explain::fault_begins(tid);
    0
}

/// `exceptions:page_fault_user` (x86 `do_user_addr_fault`): a fault in user
/// mode begins on this thread.
#[tracepoint]
pub fn fault_tp_user(ctx: TracePointContext) -> u32 {
    fault_begins(field(&ctx, PF_ADDRESS), field(&ctx, PF_IP), 0)
}

/// `exceptions:page_fault_kernel`: a fault in kernel mode (e.g. a syscall
/// copying from user memory) begins on this thread.
#[tracepoint]
pub fn fault_tp_kernel(ctx: TracePointContext) -> u32 {
    fault_begins(
        field(&ctx, PF_ADDRESS),
        field(&ctx, PF_IP),
        FaultEvent::FLAG_KERNEL_MODE,
    )
}

/// Perf software event `PERF_COUNT_SW_PAGE_FAULTS` (period 1, one per CPU):
/// a fault begins on this thread, where the kernel has no
/// `exceptions:page_fault_*` (arm64). The event carries the faulting
/// registers (user or kernel mode) and address.
#[perf_event]
pub fn fault_perf_begin(ctx: PerfEventContext) -> u32 {
    // SAFETY: the context is a `bpf_perf_event_data`.
    let data = unsafe { &*ctx.ctx };
    let flags = if regs::user_mode(&data.regs) {
        0
    } else {
        FaultEvent::FLAG_KERNEL_MODE
    };
    fault_begins(data.addr, regs::pc(&data.regs), flags)
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
    // A live slot is the thread's latest fault, and it never left the CPU
    // in it: any hash entry is older.
    if let Some(slot) = live_slot(tid) {
        slot.tid = 0;
        let state = state_of(slot);
        emit(&ctx, tgid, tid, Some(&state), address, Backend::Tracepoint);
        return 0;
    }
    match state_mut(tid) {
        Some(state) => {
            // A wakeup the kernel could not report (BPF recursion guard in
            // IRQ context) leaves the interval open: the thread runs now.
            close_interval(state);
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
    let (_, tid) = current_ids();
    if let Some(slot) = live_slot(tid) {
        slot.flags |= FaultEvent::FLAG_FILE;
    } else if let Some(state) = state_mut(tid) {
        // Only threads of traced processes have an entry.
        state.flags |= FaultEvent::FLAG_FILE;
    }
    0
}

/// `block:block_bio_queue`, in the submitting thread: if that thread is in a
/// fault, it issued the read itself (own I/O).
#[tracepoint]
pub fn fault_tp_bio_queue(_ctx: TracePointContext) -> u32 {
    let (_, tid) = current_ids();
    if let Some(slot) = live_slot(tid) {
        slot.flags |= FaultEvent::FLAG_OWN_IO;
        slot.reads_issued += 1;
    } else if let Some(state) = state_mut(tid)
        && state.begin_ns != 0
    {
        state.flags |= FaultEvent::FLAG_OWN_IO;
        state.reads_issued += 1;
    }
    0
}

/// `sched:sched_switch`: the current (previous) thread goes off CPU. If its
/// fault is still in progress on this CPU, the fault moves to the per-thread
/// map (the thread may resume elsewhere); if it sleeps inside a fault, an
/// off-CPU interval opens. Other threads return after the slot check, or, if
/// they sleep uninterruptibly, one lookup.
#[tracepoint]
pub fn fault_tp_switch(ctx: TracePointContext) -> u32 {
    switched::<TaskBtf>(&ctx);
    0
}

/// `fault_tp_switch` for kernels before 5.15 (`tracer_common::compat`).
#[tracepoint]
pub fn fault_tp_switch_compat(ctx: TracePointContext) -> u32 {
    switched::<TaskLayoutRegs>(&ctx);
    0
}

/// The body of `fault_tp_switch` (also run by `explain_sched::switch_both`).
#[inline(always)]
pub fn switched<R: UserRegs>(ctx: &TracePointContext) {
    let tid = field::<i32>(ctx, SWITCH_PREV_PID) as u32;
    let prev_state: i64 = field(ctx, SWITCH_PREV_STATE);
    let blocked = prev_state & UNINTERRUPTIBLE != 0;
    if let Some(slot) = live_slot(tid) {
        slot.tid = 0;
        // Sleeping or preempted (it may resume on another CPU) in the fault.
        let preempted = prev_state & STATE_LETTERS == 0;
        if (blocked || preempted) && still_in_fault::<R>(slot.flags, slot.ip) {
            promote(ctx, tid, slot, blocked);
        }
        return;
    }
    if !blocked {
        return;
    }
    let Some(state) = state_mut(tid) else {
        return;
    };
    if state.begin_ns == 0 || state.off_since_ns != 0 {
        return;
    }
    if still_in_fault::<R>(state.flags, state.ip) {
        open_interval(state);
        state.sleep_stack_id = sleep_stack(ctx);
        sleepers_add(1);
    } else {
        // A fault the thread was preempted in, which then ended minor (no
        // end event): forget it rather than charge this sleep to it.
        let _ = FAULT_STATE.remove(tid);
    }
}

/// Move the fault of a slot into `FAULT_STATE` for thread `tid`, which
/// leaves the CPU asleep (`blocked`) or preempted.
#[inline(always)]
fn promote(ctx: &TracePointContext, tid: u32, slot: &FaultBegin, blocked: bool) {
    let mut state = state_of(slot);
    if blocked {
        open_interval(&mut state);
        state.sleep_stack_id = sleep_stack(ctx);
    }
    if FAULT_STATE.insert(tid, state, 0).is_err() {
        count(Counter::MapFull);
        return;
    }
    if blocked {
        sleepers_add(1);
    }
}

/// `sched:sched_wakeup`: a thread is woken (often from I/O completion in
/// interrupt context). If it slept inside a fault, the interval closes.
#[tracepoint]
pub fn fault_tp_wakeup(ctx: TracePointContext) -> u32 {
    if !any_sleeper() {
        return 0;
    }
    let pid: i32 = field(&ctx, WAKEUP_PID);
    if pid <= 0 {
        return 0;
    }
    // The woken thread is not the current one, so TRACED (by tgid) cannot be
    // asked; FAULT_STATE only holds threads of traced processes.
    if let Some(state) = state_mut(pid as u32) {
        close_interval(state);
    }
    0
}
