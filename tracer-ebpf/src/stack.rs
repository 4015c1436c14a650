//! Goroutine stack growth, in two modes that feed the same per-site counts
//! (`STACK_SITES`) and the same sampled events:
//!
//! - exact: a uprobe on `runtime.copystack` entry. It sees every copy with
//!   its new size (grow, GC shrink, forced move) and never the preemption
//!   requests that also enter `runtime.newstack`, so it costs nothing where
//!   goroutines are preempted a lot but do not grow. User space keeps it
//!   attached for a bounded share of the time.
//! - sampled: a CPU-clock perf event on every CPU whose samples count as
//!   stack-growth time when the thread is on its g0 stack copying its
//!   current goroutine's stack (`curg.atomicstatus == _Gcopystack`, set by
//!   newstack around copystack and everything it calls: memmove, the
//!   frame adjuster, the unwinder, stackalloc/stackfree).
//!
//! Both read the goroutine's `sched` buffer, which `runtime.morestack`
//! filled: `sched.pc` is inside the function that needed more stack and
//! `*sched.sp` is the return address into its caller.

use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_RB_AVAIL_DATA,
    helpers::{
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
    },
    macros::{map, perf_event, uprobe},
    maps::{Array, PerCpuArray, PerCpuHashMap},
    programs::{PerfEventContext, ProbeContext},
};
use tracer_common::{
    counters::Counter,
    event::{EventHeader, EventKind},
    process::{GoOffsets, Probe},
    stack::{
        G_COPYSTACK, STACK_FRAMES, StackChange, StackConfig, StackGrowthEvent, StackSiteCounts,
        StackSiteKey, StackSource,
    },
};

use crate::{
    compat::{TaskBtf, TaskLayoutRegs, UserRegs},
    maps::{EVENTS, EVENTS_BYTES, SUBMIT_FLAGS, count, hit, ringbuf_full, traced, traced_sample},
    regs,
};

/// Unread bytes in `EVENTS` past which stack-growth events are shed.
const STACK_EVENTS_MAX_UNREAD: u64 = EVENTS_BYTES as u64 / 2;

/// Copies (exact) and copy samples (sampled) by call site and size.
#[map]
static STACK_SITES: PerCpuHashMap<StackSiteKey, StackSiteCounts> =
    PerCpuHashMap::with_max_entries(16384, 0);

/// `StackConfig` at index 0, written by user space.
#[map]
static STACK_CONFIG: Array<StackConfig> = Array::with_max_entries(1, 0);

/// Per-CPU copy counter that decides which exact hits send a full event.
#[map]
static STACK_SEQ: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Read a `T` at `addr` of the traced process.
#[inline(always)]
pub(crate) fn read<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user checks the address; a bad one is an error.
    unsafe { bpf_probe_read_user(addr as *const T) }.ok()
}

/// Read the word at `base + offset`, unless the offset is unknown.
#[inline(always)]
pub(crate) fn field(base: u64, offset: u16) -> Option<u64> {
    if offset == GoOffsets::UNKNOWN {
        return None;
    }
    read::<u64>(base + offset as u64)
}

/// Where a goroutine stood when it asked for more stack.
struct Site {
    lo: u64,
    hi: u64,
    pc: u64,
    caller: u64,
    sp: u64,
    bp: u64,
}

/// Read the stack bounds and the `sched` buffer of goroutine `gp`.
#[inline(always)]
fn site(gp: u64, o: &GoOffsets) -> Option<Site> {
    let lo = field(gp, o.g_stack_lo)?;
    let hi = field(gp, o.g_stack_hi)?;
    let pc = field(gp, o.g_sched_pc)?;
    let sp = field(gp, o.g_sched_sp)?;
    let bp = field(gp, o.g_sched_bp).unwrap_or(0);
    let caller = if sp >= lo && sp < hi {
        read::<u64>(sp).unwrap_or(0)
    } else {
        0
    };
    Some(Site {
        lo,
        hi,
        pc,
        caller,
        sp,
        bp,
    })
}

/// Add one copy to the per-site counts.
#[inline(always)]
fn add_site(key: &StackSiteKey, copied: u64) {
    match STACK_SITES.get_ptr_mut(key) {
        // SAFETY: this CPU's slot; BPF programs do not migrate mid-run.
        Some(c) => unsafe {
            (*c).count += 1;
            (*c).copied_bytes += copied;
        },
        None => {
            let v = StackSiteCounts {
                count: 1,
                copied_bytes: copied,
            };
            if STACK_SITES.insert(key, v, 0).is_err() {
                count(Counter::MapFull);
            }
        }
    }
}

/// Send a full event with a frame-pointer walk of the goroutine's stack.
#[inline(always)]
fn send_event(tgid: u32, tid: u32, key: &StackSiteKey, s: &Site, goid: u64, new_size: u64) {
    // Samples must never crowd out pauses and faults: past half full, the
    // rest of the buffer is theirs (the site counts above still count it).
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) > STACK_EVENTS_MAX_UNREAD {
        count(Counter::StackGrowthShed);
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<StackGrowthEvent>(0) else {
        ringbuf_full(Counter::RingbufFullStackGrowth);
        return;
    };
    let mut frames = [0u64; STACK_FRAMES];
    frames[0] = s.pc;
    frames[1] = s.caller;
    let mut n = 2u32;
    let mut bp = s.bp;
    // Frame layout on amd64: [bp] = the caller's bp, [bp+8] = return address.
    for (i, frame) in frames.iter_mut().enumerate().skip(2) {
        if bp < s.lo || bp + 16 > s.hi {
            break;
        }
        let Some(pair) = read::<[u64; 2]>(bp) else {
            break;
        };
        *frame = pair[1];
        n = i as u32 + 1;
        // Frames go up the stack; anything else is a corrupt chain.
        if pair[0] <= bp {
            break;
        }
        bp = pair[0];
    }
    entry.write(StackGrowthEvent {
        header: EventHeader {
            kind: EventKind::StackGrowth as u32,
            tgid,
            tid,
            // SAFETY: no preconditions.
            cpu: unsafe { bpf_get_smp_processor_id() },
            // SAFETY: no preconditions.
            ts_ns: unsafe { bpf_ktime_get_ns() },
        },
        source: key.source,
        change: key.change,
        _pad: 0,
        nframes: n,
        goid,
        old_size: s.hi - s.lo,
        new_size,
        used: s.hi.saturating_sub(s.sp),
        frames,
    });
    entry.submit(SUBMIT_FLAGS);
}

/// Go: `func copystack(gp *g, newsize uintptr)` (1.19-1.27, ABIInternal:
/// gp and newsize in the first two argument registers). Runs on g0.
#[uprobe]
pub fn stack_copy(ctx: ProbeContext) -> u32 {
    let _ = try_stack_copy(&ctx);
    0
}

fn try_stack_copy(ctx: &ProbeContext) -> Option<()> {
    let tgid = ctx.tgid();
    let p = traced(tgid)?;
    hit(tgid, Probe::Copystack);
    // `copystack(gp, newsize)`.
    let r = regs::of_probe(ctx);
    let (gp, new_size) = (regs::arg0(r), regs::arg1(r));
    let o = &p.offsets;
    let Some(s) = site(gp, o) else {
        count(Counter::ReadUserFailed);
        return None;
    };
    let old = s.hi - s.lo;
    let change = StackChange::of(old, new_size);
    let grow = change == StackChange::Grow;
    let key = StackSiteKey {
        tgid,
        source: StackSource::Exact as u8,
        change: change as u8,
        _pad: 0,
        old_size: old as u32,
        new_size: new_size as u32,
        // A shrink happens to a parked goroutine: its sched.pc says where it
        // parked, not what grew; keep one counter per size for those.
        site_pc: if grow { s.pc } else { 0 },
        caller_pc: if grow { s.caller } else { 0 },
    };
    add_site(&key, s.hi.saturating_sub(s.sp));
    if !grow {
        return Some(());
    }
    let every = STACK_CONFIG.get(0).map_or(0, |c| c.exact_event_every) as u64;
    if every == 0 {
        return Some(());
    }
    let seq = STACK_SEQ.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot.
    let n = unsafe {
        *seq += 1;
        *seq
    };
    if n % every == 0 {
        let goid = field(gp, o.g_goid).unwrap_or(0);
        send_event(tgid, ctx.pid(), &key, &s, goid, new_size);
    }
    Some(())
}

/// g's register (the current goroutine in Go code) of the sampled thread
/// in user mode: the sample's own register when it hit user code, else the
/// one saved at the kernel entry (a sample that lands in the page fault of a
/// fresh stack page still counts). Only that word is read, not the whole
/// register set.
#[inline(always)]
fn user_g<R: UserRegs>(ctx: &PerfEventContext) -> Option<u64> {
    // SAFETY: the kernel hands perf_event programs valid sample data.
    let sample = unsafe { &(*ctx.ctx).regs };
    if regs::user_mode(sample) {
        return Some(regs::g(sample));
    }
    let user = R::current()?;
    // SAFETY: read through the checked helper.
    unsafe { bpf_probe_read_kernel(regs::g_at(user)) }.ok()
}

/// CPU-clock sample on every CPU (pid -1); only traced processes pay more
/// than the map lookup.
#[perf_event]
pub fn stack_sample(ctx: PerfEventContext) -> u32 {
    let _ = try_stack_sample::<TaskBtf>(&ctx);
    0
}

/// `stack_sample` for kernels before 5.15 (`tracer_common::compat`).
#[perf_event]
pub fn stack_sample_compat(ctx: PerfEventContext) -> u32 {
    let _ = try_stack_sample::<TaskLayoutRegs>(&ctx);
    0
}

#[inline(always)]
fn try_stack_sample<R: UserRegs>(ctx: &PerfEventContext) -> Option<()> {
    let tgid = ctx.tgid();
    let p = traced_sample(tgid)?;
    let o = &p.offsets;
    // g's register holds the current g in Go code (ABIInternal). Outside Go code it may
    // hold anything, and the reads below fail or do not match: not an error.
    let g = user_g::<R>(ctx)?;
    let m = field(g, o.g_m)?;
    if m == 0 || field(m, o.m_g0)? != g {
        return None;
    }
    let curg = field(m, o.m_curg)?;
    if curg == 0 || o.g_atomicstatus == GoOffsets::UNKNOWN {
        return None;
    }
    let status = read::<u32>(curg + o.g_atomicstatus as u64)?;
    if status != G_COPYSTACK {
        return None;
    }
    hit(tgid, Probe::StackCopySample);
    let s = site(curg, o)?;
    // Until copystack switches the goroutine over, hi-lo is the old size.
    let key = StackSiteKey {
        tgid,
        source: StackSource::Sampled as u8,
        change: StackChange::Copying as u8,
        _pad: 0,
        old_size: (s.hi - s.lo) as u32,
        new_size: 0,
        site_pc: s.pc,
        caller_pc: s.caller,
    };
    add_site(&key, 0);
    let goid = field(curg, o.g_goid).unwrap_or(0);
    send_event(tgid, ctx.pid(), &key, &s, goid, 0);
    Some(())
}
