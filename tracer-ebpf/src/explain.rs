//! What explains a pause, gathered while its window is open and sent as one
//! `PauseDetail` just before the `PauseEvent` (see `tracer_common::explain`).
//! `opened` runs in the `stopTheWorldWithSema` entry probe, before Go starts
//! its clock; `stopped` in the stopping probe (only when the stopping
//! phase is read, see `stopping`); `send` in the end probe of
//! `startTheWorldWithSema`, after Go took its end time. The scheduler
//! programs of `explain_sched` fill in the rest while the window is open.

use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_xadd},
};

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_F_REUSE_STACKID, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_loop},
    macros::map,
    maps::{Array, HashMap, LruHashMap, StackTrace},
    programs::tracing::StackIdContext,
};
use tracer_common::{
    compat::COMPAT_MAX_MS,
    counters::Counter,
    event::{EventHeader, EventKind},
    explain::{
        CALLER_FRAMES, CANDIDATES, Candidate, KERNEL_WAITS, KernelWait, LAGGARDS, Laggard, MAX_MS,
        PHASE_STOPPED, PHASE_STOPPING, PauseDetail, PauseThread, StopperTime,
    },
    process::{GoOffsets, TracedProcess},
};

use crate::{
    fault::state_mut,
    maps::{MAX_TRACED, PAUSE_EVENTS, count, traced},
    regs,
    stack::{field, read},
};

/// One `PauseDetail` per explained process, by tgid: inserted (zeroed) by
/// user space when it traces the process, so the probes never allocate
/// (not preallocated: see `MAX_TRACED`).
#[map]
pub static PAUSE_DETAILS: HashMap<u32, PauseDetail> =
    HashMap::with_max_entries(MAX_TRACED, BPF_F_NO_PREALLOC);

/// Threads followed inside a pause window, by tid (the stopping thread and
/// the laggards). LRU: entries of finished windows age out.
#[map]
pub static PAUSE_THREADS: LruHashMap<u32, PauseThread> = LruHashMap::with_max_entries(8192, 0);

/// User stacks of laggards, read and symbolized by user space when the
/// pause's detail arrives (20 ms at most later). Taken with
/// `BPF_F_REUSE_STACKID`: a stack whose bucket another holds replaces it,
/// where without the flag it is refused, and a map that keeps every stack
/// it was given refuses more and more of them over an agent's weeks.
#[map]
pub static PAUSE_STACKS: StackTrace = StackTrace::with_max_entries(4096, 0);

/// Pause windows open now, all explained processes together. The scheduler
/// programs return at once while it is 0. Only the probes change it, with
/// atomic adds; a process that vanishes inside a pause leaves it one too
/// high (the programs then do their lookups: slower, never wrong).
#[map]
pub static PAUSES_OPEN: Array<u64> = Array::with_max_entries(1, 0);

/// Whether process `tgid`'s pauses are explained.
#[inline(always)]
pub fn explained(tgid: u32) -> bool {
    // SAFETY: only whether an entry exists is read.
    unsafe { PAUSE_DETAILS.get(tgid) }.is_some()
}

/// Whether any explained process is inside a pause.
#[inline(always)]
pub fn any_open() -> bool {
    PAUSES_OPEN.get(0).is_some_and(|n| *n != 0)
}

#[inline(always)]
fn add_open(delta: u64) {
    if let Some(n) = PAUSES_OPEN.get_ptr_mut(0) {
        // SAFETY: a valid map value; the BPF atomic add.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(n, delta) };
    }
}

/// `bpf_ktime_get_ns`.
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// The stopping thread's registers at the stop's entry that the
/// explanation keeps (values, not the context: a subprogram may not take
/// the probe's context pointer).
pub struct StopEntry {
    /// The frame pointer (the caller's frame), the probe's address, g.
    pub bp: u64,
    pub ip: u64,
    pub g: u64,
}

/// The window of process `tgid` opened at `stop_ts_ns` on thread `tid`,
/// with the registers `at` of the stop's entry:
/// reset its detail and record the caller. Its own map value only: each
/// lookup of a map this probe touches once a pause costs 0.5-1 us cold.
#[inline(always)]
pub fn opened(tgid: u32, tid: u32, stop_ts_ns: u64, at: &StopEntry) {
    let Some(d) = PAUSE_DETAILS.get_ptr_mut(tgid) else {
        return;
    };
    // SAFETY: this process's value; its pauses never overlap (`worldsema`)
    // and only user space deletes the entry.
    let d = unsafe { &mut *d };
    if d.open == 0 {
        d.open = 1;
        add_open(1);
    }
    d.stop_ts_ns = stop_ts_ns;
    d.stop_tid = tid;
    d.phase = PHASE_STOPPING;
    d.stopped_ns = 0;
    d.restart_ns = 0;
    d.stopper = StopperTime::default();
    d.nlaggards = 0;
    d.laggards_dropped = 0;
    d.nwaits = 0;
    d.waits_dropped = 0;
    d.waits_dropped_ns = 0;
    // Where `systemstack` does not keep the goroutine's frame pointer, its
    // chain goes on from the one the goroutine saved.
    let then = if regs::SYSTEMSTACK_KEEPS_FP {
        0
    } else {
        traced(tgid)
            .and_then(|p| goroutine_bp(at.g, &p.offsets))
            .unwrap_or(0)
    };
    d.caller_len = walk_caller(at.bp, then, &mut d.caller);
    d.allm = if d.allm_link != 0 && d.stop_the_world_link != 0 {
        // The probe sits a few bytes into the function (its prologue's
        // branch); PIE load biases are page-aligned.
        d.allm_link
            .wrapping_add(at.ip.wrapping_sub(d.stop_the_world_link) & !0xfff)
    } else {
        0
    };
    // The M list is walked later, when a thread first leaves the CPU while
    // the world is stopping (`explain_sched`): a walk here would cost this
    // probe, which every stop pays inside its pause, about 2 us.
    d.rewalked = 0;
    d.ms_walked = 0;
    d.ncandidates = 0;
}

/// The stopping thread's return addresses, innermost first, following the
/// frame pointers from `bp` (the frame pointer at the stop's entry): the g0 frames the
/// stop runs in, then the goroutine that asked for it, as `systemstack`
/// keeps the goroutine's frame pointer in BP when it switches to g0 (user
/// space drops the g0 part). Frames go up a stack; the chain changes stacks
/// once, which may go down. Reading the goroutine's saved state instead
/// (`g0.m.curg.sched`, its stack bounds) touched three more pages of the
/// process and cost this probe about 0.35 us more a stop here.
/// Where the chain ends (a zero frame pointer), it goes on from `then`
/// once, if not zero: the goroutine's saved frame pointer on arm64.
#[inline(always)]
fn walk_caller(mut bp: u64, mut then: u64, out: &mut [u64; CALLER_FRAMES]) -> u32 {
    let mut filled = 0;
    let mut switched = false;
    for slot in out.iter_mut() {
        if bp == 0 {
            (bp, then) = (then, 0);
        }
        if bp == 0 || !bp.is_multiple_of(8) {
            break;
        }
        // amd64 frame: [bp] = the caller's bp, [bp+8] = the return address.
        let Some(pair) = read::<[u64; 2]>(bp) else {
            break;
        };
        if pair[1] == 0 {
            break;
        }
        *slot = pair[1];
        filled += 1;
        if pair[0] <= bp {
            if switched {
                break;
            }
            switched = true;
        }
        bp = pair[0];
    }
    filled
}

/// The frame pointer the goroutine that asked for the stop had when it
/// switched to g0 (`g0.m.curg.sched.bp`), where `systemstack` does not keep
/// it (`regs::SYSTEMSTACK_KEEPS_FP`); none when the stop was not asked for
/// through a switch (it is zero then).
#[inline(always)]
fn goroutine_bp(g0: u64, o: &GoOffsets) -> Option<u64> {
    let m = field(g0, o.g_m)?;
    let curg = field(m, o.m_curg)?;
    field(curg, o.g_sched_bp).filter(|&bp| bp != 0)
}

/// Follow the frame-pointer chain from `bp` inside the stack `[lo, hi)`,
/// filling `out` from index `n`; returns how many slots are filled.
#[inline(always)]
fn fp_walk<const N: usize>(mut bp: u64, lo: u64, hi: u64, out: &mut [u64; N], n: usize) -> u32 {
    let mut filled = n as u32;
    // amd64 frame: [bp] = the caller's bp, [bp+8] = the return address.
    for slot in out.iter_mut().skip(n) {
        if bp < lo || bp + 16 > hi {
            break;
        }
        let Some(pair) = read::<[u64; 2]>(bp) else {
            break;
        };
        *slot = pair[1];
        filled += 1;
        // Frames go up the stack; anything else is a broken chain.
        if pair[0] <= bp {
            break;
        }
        bp = pair[0];
    }
    filled
}

/// Add the Ms (`runtime.allm`, linked by `m.alllink`) that hold a P right
/// now, other than the stopping one, to the candidates (or update the
/// goroutine of one already there): the threads that can delay the stop.
/// A new one may be off the CPU already (preempted, throttled): its first
/// switch-in then closes an interval that began at `since`. Reads the
/// current process's memory: call it in a thread of process `tgid`.
/// Without `BPF_LOOP` (kernels before 5.17), a bounded loop reads at most
/// `COMPAT_MAX_MS` Ms.
#[inline(always)]
pub fn walk_ms<const BPF_LOOP: bool>(
    d: &mut PauseDetail,
    p: &TracedProcess,
    tgid: u32,
    since: u64,
) {
    d.ms_walked = 0;
    if d.allm == 0 || p.explain.m_alllink == GoOffsets::UNKNOWN {
        return;
    }
    let Some(m) = read::<u64>(d.allm) else {
        count(Counter::ReadUserFailed);
        return;
    };
    let mut w = MsWalk {
        d,
        p,
        tgid,
        since,
        m,
    };
    if !BPF_LOOP {
        for i in 0..COMPAT_MAX_MS {
            if ms_step(i as u64, (&mut w as *mut MsWalk).cast()) != 0 {
                break;
            }
        }
        return;
    }
    // Through `bpf_loop`: the verifier checks `ms_step` once, where a
    // bounded loop around the candidates' loop made it explore every
    // iteration of both (about 0.5 s of verification at each start).
    // SAFETY: `ms_step` reads `w` as the `MsWalk` it is, on this stack.
    unsafe {
        bpf_loop(
            MAX_MS as u32,
            ms_step as *mut c_void,
            (&mut w as *mut MsWalk).cast(),
            0,
        )
    };
}

/// The state of `walk_ms` that `ms_step` carries from one M to the next.
#[repr(C)]
struct MsWalk {
    d: *mut PauseDetail,
    p: *const TracedProcess,
    tgid: u32,
    since: u64,
    /// The M to look at next (0: the list's end).
    m: u64,
}

/// One M of `walk_ms` (a `bpf_loop` callback): 0 goes on, 1 stops.
#[inline(never)]
extern "C" fn ms_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: the `MsWalk` of `walk_ms`, alive for the whole loop; its
    // pointers are a map value of this process and its traced entry.
    let w = unsafe { &mut *ctx.cast::<MsWalk>() };
    let (d, p) = unsafe { (&mut *w.d, &*w.p) };
    let m = w.m;
    if m == 0 {
        return 1;
    }
    let (o, x) = (&p.offsets, &p.explain);
    d.ms_walked += 1;
    let curg = field(m, o.m_curg).unwrap_or(0);
    // Without m.p, a goroutine on the M is the sign it runs.
    let holds_p = if x.m_p == GoOffsets::UNKNOWN {
        curg != 0
    } else {
        match field(m, x.m_p) {
            Some(pp) => pp != 0,
            None => {
                // An M the walk could not read is one it cannot name.
                count(Counter::ReadUserFailed);
                false
            }
        }
    };
    // The stopping thread's own M is the one with its tid.
    if holds_p
        && let Some(procid) = field(m, o.m_procid)
        && procid as u32 != d.stop_tid
    {
        add_candidate(d, procid as u32, m, curg, w.tgid, w.since);
    }
    let Some(next) = field(m, x.m_alllink) else {
        count(Counter::ReadUserFailed);
        return 1;
    };
    w.m = next;
    0
}

/// The kernel stack of thread `tid`'s sleep inside a page fault, if it
/// sleeps in one now (tracepoint fault backend), else -1.
#[inline(always)]
fn asleep_in_fault(tid: u32) -> i32 {
    match state_mut(tid) {
        Some(s) if s.off_since_ns != 0 => s.sleep_stack_id,
        _ => -1,
    }
}

#[inline(always)]
fn add_candidate(d: &mut PauseDetail, tid: u32, m: u64, g: u64, tgid: u32, since: u64) {
    let n = d.ncandidates as usize;
    for i in 0..CANDIDATES {
        if i >= n {
            break;
        }
        // An opaque index keeps its bounds check: LLVM otherwise turns the
        // loop into a pointer walk whose end older verifiers (6.1) cannot
        // tie to the counter, and reject the program.
        let Some(c) = d.candidates.get_mut(core::hint::black_box(i)) else {
            break;
        };
        if c.tid == tid {
            // The last goroutine seen on it.
            if g != 0 {
                c.g = g;
            }
            return;
        }
    }
    if n >= CANDIDATES {
        return;
    }
    let Some(slot) = d.candidates.get_mut(core::hint::black_box(n)) else {
        return;
    };
    *slot = Candidate { tid, _pad: 0, m, g };
    d.ncandidates += 1;
    let t = PauseThread {
        tgid,
        slot: PauseThread::NO_SLOT,
        stop_ts_ns: d.stop_ts_ns,
        off_since_ns: since,
        off_phase: PHASE_STOPPING,
        flags: Laggard::CANDIDATE | Laggard::OFF_AT_START,
        kstack_id: asleep_in_fault(tid),
        ..PauseThread::default()
    };
    if PAUSE_THREADS.insert(tid, t, 0).is_err() {
        count(Counter::MapFull);
    }
}

/// Every P of `tgid` stopped at `finished_ns` (Go's `finishedStopping`).
#[inline(always)]
pub fn stopped(tgid: u32, finished_ns: u64) {
    if let Some(d) = PAUSE_DETAILS.get_ptr_mut(tgid) {
        // SAFETY: as in `opened`.
        unsafe {
            if (*d).open != 0 && (*d).phase == PHASE_STOPPING {
                (*d).phase = PHASE_STOPPED;
                (*d).stopped_ns = finished_ns;
            }
        }
    }
}

/// A laggard's goroutine left its thread: its saved stack (`g.sched`, as
/// `morestack`, `mcall` or `systemstack` left it) into `l`.
#[inline(always)]
pub fn goroutine_frames(g: u64, o: &GoOffsets, l: &mut Laggard) {
    let (Some(lo), Some(hi), Some(pc), Some(sp), Some(bp)) = (
        field(g, o.g_stack_lo),
        field(g, o.g_stack_hi),
        field(g, o.g_sched_pc),
        field(g, o.g_sched_sp),
        field(g, o.g_sched_bp),
    ) else {
        return;
    };
    l.frames[0] = pc;
    // After a preemption at a function's stack check, sp is at the return
    // address into its caller; elsewhere the word there is not a return
    // address, and user space drops it when it names no function.
    l.frames[1] = if sp >= lo && sp + 8 <= hi {
        read::<u64>(sp).unwrap_or(0)
    } else {
        0
    };
    l.nframes = fp_walk(bp, lo, hi, &mut l.frames, 2);
    l.goid = field(g, o.g_goid).unwrap_or(0);
    l.flags |= Laggard::GOROUTINE_FRAMES;
}

/// The current thread's kernel stack in `PAUSE_STACKS` (where it sleeps or
/// runs in the kernel), or a negative error.
#[inline(always)]
pub fn kernel_stack<C: StackIdContext>(ctx: &C) -> i32 {
    match ctx.get_stackid(&PAUSE_STACKS, BPF_F_REUSE_STACKID as u64) {
        Ok(id) => id as i32,
        Err(e) => {
            count(Counter::KernelStackFailed);
            e
        }
    }
}

/// Add `ns` of thread `tid`'s time in the kernel at kernel stack `kstack_id`
/// to `d`'s waits, under `phase` (`PHASE_*`, with `KernelWait::ON_CPU` for
/// sampled running).
#[inline(always)]
pub fn add_kernel_time(d: &mut PauseDetail, tid: u32, phase: u32, kstack_id: i32, ns: u64) {
    let n = (d.nwaits as usize).min(KERNEL_WAITS);
    for i in 0..KERNEL_WAITS {
        if i >= n {
            break;
        }
        // Opaque index: see `add_candidate`.
        let Some(w) = d.waits.get_mut(core::hint::black_box(i)) else {
            break;
        };
        if w.tid == tid && w.phase == phase && w.kstack_id == kstack_id {
            w.count += 1;
            w.blocked_ns += ns;
            return;
        }
    }
    match d.waits.get_mut(core::hint::black_box(n)) {
        Some(w) => {
            *w = KernelWait {
                tid,
                phase,
                kstack_id,
                count: 1,
                blocked_ns: ns,
            };
            d.nwaits += 1;
        }
        None => {
            d.waits_dropped += 1;
            d.waits_dropped_ns += ns;
        }
    }
}

/// The detail of an open window of `tgid`.
#[inline(always)]
pub(crate) fn open_detail(tgid: u32) -> Option<&'static mut PauseDetail> {
    let d = PAUSE_DETAILS.get_ptr_mut(tgid)?;
    // SAFETY: a pointer into the map's value; only this process's probes
    // and threads touch it, and a torn update skews one pause's figures.
    let d = unsafe { &mut *d };
    (d.open != 0).then_some(d)
}

/// The followed thread of `tid` in an open window, with the detail.
#[inline(always)]
pub(crate) fn followed(tid: u32) -> Option<(&'static mut PauseThread, &'static mut PauseDetail)> {
    let e = PAUSE_THREADS.get_ptr_mut(tid)?;
    // SAFETY: this thread's entry; only its own events touch it.
    let e = unsafe { &mut *e };
    match open_detail(e.tgid) {
        Some(d) if d.stop_ts_ns == e.stop_ts_ns => Some((e, d)),
        _ => None,
    }
}

/// Thread `tid` of a traced process begins a page fault (the tracepoint
/// fault backend's begin): counted for the stopping thread in any phase and
/// for a laggard while the world is stopping.
#[inline(always)]
pub(crate) fn fault_begins(tid: u32) {
    if !any_open() {
        return;
    }
    let Some((e, d)) = followed(tid) else {
        return;
    };
    if e.slot == PauseThread::STOPPER {
        d.stopper.faults += 1;
    } else if d.phase == PHASE_STOPPING {
        let slot = laggard_slot(d, tid);
        d.laggards[slot].faults += 1;
    }
}

/// The laggard slot of `tid` in `d`: its own, a free one, or the one of the
/// laggard that left the CPU earliest (counted as dropped).
#[inline(always)]
pub fn laggard_slot(d: &mut PauseDetail, tid: u32) -> usize {
    let n = (d.nlaggards as usize).min(LAGGARDS);
    let mut earliest = 0;
    for i in 0..LAGGARDS {
        if i >= n {
            break;
        }
        if d.laggards[i].tid == tid {
            return i;
        }
        if d.laggards[i].last_out_ns < d.laggards[earliest].last_out_ns {
            earliest = i;
        }
    }
    let slot = if n < LAGGARDS {
        d.nlaggards += 1;
        n
    } else {
        d.laggards_dropped += 1;
        earliest
    };
    d.laggards[slot] = Laggard {
        tid,
        user_stack_id: -1,
        held_stack_id: -1,
        ..Laggard::default()
    };
    slot
}

/// The window of `tgid` closes on thread `tid`: send its detail up to its
/// last laggard (without a wake-up, like every event).
#[inline(always)]
pub fn send(tgid: u32, tid: u32) {
    let Some(d) = PAUSE_DETAILS.get_ptr_mut(tgid) else {
        return;
    };
    // SAFETY: as in `opened`.
    let d = unsafe { &mut *d };
    if d.open != 0 {
        d.open = 0;
        add_open(u64::MAX);
    }
    d.header = EventHeader {
        kind: EventKind::PauseDetail as u32,
        tgid,
        tid,
        // SAFETY: helpers with no arguments.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns: now(),
    };
    let len = PauseDetail::sent_len(d.nlaggards as usize);
    // SAFETY: `len` is at most the value's size (`sent_len` clamps it).
    let bytes = unsafe { core::slice::from_raw_parts((d as *const PauseDetail).cast::<u8>(), len) };
    if PAUSE_EVENTS
        .output::<[u8]>(bytes, BPF_RB_NO_WAKEUP as u64)
        .is_err()
    {
        crate::maps::ringbuf_full(Counter::RingbufFullDetail);
    }
}
