//! What explains a pause, gathered while its window is open and sent as one
//! `PauseDetail` just before the `PauseEvent` (see `tracer_common::explain`).
//! `opened` runs in the `stopTheWorldWithSema` entry probe, before Go starts
//! its clock; `send` in the RET probe of `startTheWorldWithSema`, after Go
//! took its end time. Nothing here runs inside the pause.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::map,
    maps::HashMap,
};
use tracer_common::{
    counters::Counter,
    event::{EventHeader, EventKind},
    explain::{CALLER_FRAMES, PauseDetail},
    process::GoOffsets,
};

use crate::{
    maps::{EVENTS, count},
    stack::{field, read},
};

/// One `PauseDetail` per explained process, by tgid: inserted (zeroed) by
/// user space when it traces the process, so the probes never allocate.
#[map]
pub static PAUSE_DETAILS: HashMap<u32, PauseDetail> = HashMap::with_max_entries(4096, 0);

/// The window of process `tgid` opened at `stop_ts_ns` on thread `tid`,
/// whose g register (R14: `g0`, `stopTheWorldWithSema` runs on the system
/// stack) is `g0`: reset its detail and record the caller.
#[inline(always)]
pub fn opened(tgid: u32, tid: u32, stop_ts_ns: u64, g0: u64, offsets: &GoOffsets) {
    let Some(d) = PAUSE_DETAILS.get_ptr_mut(tgid) else {
        return;
    };
    // SAFETY: this process's value; its pauses never overlap (`worldsema`)
    // and only user space deletes the entry.
    let d = unsafe { &mut *d };
    d.stop_ts_ns = stop_ts_ns;
    d.stop_tid = tid;
    d.caller_len = walk_caller(g0, offsets, &mut d.caller);
}

/// The user goroutine's return addresses, innermost first, from the state
/// `systemstack` saved in `curg.sched`. Go 1.21+ gives `systemstack` a frame
/// of its own (sp = bp = its saved frame pointer): the frame-pointer chain
/// from there is the whole stack. Before, it has none: sp is at the return
/// address into its caller and bp is that caller's frame pointer.
#[inline(always)]
fn walk_caller(g0: u64, o: &GoOffsets, out: &mut [u64; CALLER_FRAMES]) -> u32 {
    let Some(curg) = field(g0, o.g_m).and_then(|m| field(m, o.m_curg)) else {
        count(Counter::ReadUserFailed);
        return 0;
    };
    if curg == 0 || curg == g0 {
        return 0;
    }
    let (Some(lo), Some(hi), Some(sp), Some(mut bp)) = (
        field(curg, o.g_stack_lo),
        field(curg, o.g_stack_hi),
        field(curg, o.g_sched_sp),
        field(curg, o.g_sched_bp),
    ) else {
        count(Counter::ReadUserFailed);
        return 0;
    };
    if sp < lo || sp + 8 > hi {
        return 0;
    }
    let mut n = 0u32;
    if sp != bp {
        let Some(first) = read::<u64>(sp) else {
            return 0;
        };
        out[0] = first;
        n = 1;
    }
    // amd64 frame: [bp] = the caller's bp, [bp+8] = the return address.
    for slot in out.iter_mut().skip(n as usize) {
        if bp < lo || bp + 16 > hi {
            break;
        }
        let Some(pair) = read::<[u64; 2]>(bp) else {
            break;
        };
        *slot = pair[1];
        n += 1;
        // Frames go up the stack; anything else is a broken chain.
        if pair[0] <= bp {
            break;
        }
        bp = pair[0];
    }
    n
}

/// The window of `tgid` closes on thread `tid`: send its detail (without a
/// wake-up: the `PauseEvent` that follows wakes the reader).
#[inline(always)]
pub fn send(tgid: u32, tid: u32) {
    let Some(d) = PAUSE_DETAILS.get_ptr_mut(tgid) else {
        return;
    };
    // SAFETY: as in `opened`.
    let d = unsafe { &mut *d };
    d.header = EventHeader {
        kind: EventKind::PauseDetail as u32,
        tgid,
        tid,
        // SAFETY: helpers with no arguments.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns: unsafe { bpf_ktime_get_ns() },
    };
    if EVENTS
        .output::<PauseDetail>(&*d, BPF_RB_NO_WAKEUP as u64)
        .is_err()
    {
        count(Counter::RingbufFull);
    }
}
