//! Stop-the-world pause probes: `runtime.stopTheWorldWithSema` entry opens a
//! pause window for the process, the end of `runtime.startTheWorldWithSema`
//! (its calls of `timeHistogram.record` on Go 1.22+, its RETs before)
//! closes it and sends one `PauseEvent`. Never a uretprobe (Go moves
//! stacks); inside the window only the stopping probe (`stopping`), which
//! lengthens the pause by its trap. Where they sit: `kernel::pause_points`
//! in user space.

use aya_ebpf::{
    EbpfContext as _,
    helpers::{
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_buf,
    },
    macros::uprobe,
    programs::ProbeContext,
};
use tracer_common::{
    counters::Counter,
    event::{EventHeader, EventKind},
    pause::{GoStopping, PauseEvent, PauseWindow, REASON_FROM_TEXT, REASON_TEXT_LEN},
    process::GoOffsets,
};

use crate::{
    explain,
    maps::{PAUSE_EVENTS, PAUSE_WINDOWS, SUBMIT_FLAGS, count, ringbuf_full, traced},
    regs,
};

/// Go: `func stopTheWorldWithSema(reason stwReason) worldStop` (1.21+, reason
/// in AL); `func stopTheWorldWithSema()` before, with the reason in
/// `getg().m.preemptoff`. Runs on g0 (`regs::g`) with the world still running, and
/// before Go starts its own clock (1.22+).
///
/// It runs every few milliseconds in a busy process, so every map it
/// touches is a cache miss (~0.5-1 us each here): one lookup, the window,
/// written in place (and the detail when the pause is explained). `TRACED`
/// is read only where the reason is a string (Go 1.19/1.20).
#[uprobe]
pub fn stw_stop(ctx: ProbeContext) -> u32 {
    let tgid = ctx.tgid();
    let Some(w) = PAUSE_WINDOWS.get_ptr_mut(tgid) else {
        return 0;
    };
    // SAFETY: a pointer to this process's value; its pauses do not overlap
    // (`worldsema`), and only user space deletes the entry.
    let w = unsafe { &mut *w };
    if w.stop_ts_ns != 0 {
        count(Counter::PauseReopened);
    }
    // SAFETY: helper with no arguments.
    let stop_ts_ns = unsafe { bpf_ktime_get_ns() };
    let r = regs::of_probe(&ctx);
    w.entries += 1;
    w.stop_ts_ns = stop_ts_ns;
    w.stop_tid = ctx.pid();
    w.flags = 0;
    w.reason_text_len = 0;
    w.reason = (regs::arg0(r) & 0xff) as u32;
    if w.setup & PauseWindow::SETUP_REASON_FROM_PREEMPTOFF != 0
        && let Some(process) = traced(tgid)
    {
        w.reason = REASON_FROM_TEXT;
        w.flags |= PauseEvent::FLAG_REASON_TEXT;
        if read_preemptoff(regs::g(r), &process.offsets, w).is_err() {
            w.flags |= PauseEvent::FLAG_READ_FAILED;
            count(Counter::ReadUserFailed);
        }
    }
    if w.setup & PauseWindow::SETUP_EXPLAINED != 0 {
        let at = explain::StopEntry {
            bp: regs::fp(r),
            ip: regs::pc(r),
            g: regs::g(r),
        };
        explain::opened(tgid, w.stop_tid, stop_ts_ns, &at);
    }
    0
}

/// `m := g0.m; s := m.preemptoff` (a Go string: pointer, then length).
#[inline(always)]
fn read_preemptoff(g0: u64, offsets: &GoOffsets, window: &mut PauseWindow) -> Result<(), i32> {
    if offsets.g_m == GoOffsets::UNKNOWN || offsets.m_preemptoff == GoOffsets::UNKNOWN {
        return Err(-1);
    }
    // SAFETY: bpf_probe_read_user checks the address; a bad one is an error.
    let m: u64 = unsafe { bpf_probe_read_user((g0 + u64::from(offsets.g_m)) as *const u64)? };
    let s = m + u64::from(offsets.m_preemptoff);
    // SAFETY: as above.
    let (ptr, len): (u64, u64) = unsafe {
        (
            bpf_probe_read_user(s as *const u64)?,
            bpf_probe_read_user((s + 8) as *const u64)?,
        )
    };
    if len == 0 {
        return Ok(());
    }
    // The strings are literals in the binary's rodata; reading the full
    // buffer past a short one stays inside it, and user space cuts at `len`.
    // SAFETY: as above.
    unsafe { bpf_probe_read_user_buf(ptr as *const u8, &mut window.reason_text)? };
    window.reason_text_len = if len < REASON_TEXT_LEN as u64 {
        len as u32
    } else {
        REASON_TEXT_LEN as u32
    };
    Ok(())
}

/// The end of the pause. Go 1.22+: attached at `startTheWorldWithSema`'s
/// two calls of `timeHistogram.record` (emulated: one trap), made just after
/// Go took `now`, with Go's pause `now - w.startedStopping` in the second
/// argument register and `w.startedStopping` in the function's frame.
/// Before (or where those are not found): at each RET, where the result
/// register is Go's `now` (and, from 1.22, the slot is still below SP).
/// Rarely run, so every map it touches is a cache miss: it looks up only
/// the pause window (which only traced processes have), and the explained
/// pause's detail when there is one.
#[uprobe]
pub fn stw_start_ret(ctx: ProbeContext) -> u32 {
    let tgid = ctx.tgid();
    let Some(slot) = PAUSE_WINDOWS.get_ptr_mut(tgid) else {
        // Not traced.
        return 0;
    };
    // SAFETY: as in `stw_stop`. Only the first 64 bytes are read unless
    // the flags say the text is there; then closed.
    let window = unsafe { &mut *slot };
    let stop_ts_ns = window.stop_ts_ns;
    window.stop_ts_ns = 0;
    if stop_ts_ns != 0 {
        window.last_stop_ts_ns = stop_ts_ns;
        // SAFETY: helper with no arguments.
        window.last_end_ts_ns = unsafe { bpf_ktime_get_ns() };
    }
    if stop_ts_ns == 0 {
        // Traced since inside this pause.
        count(Counter::PauseUnmatched);
        return 0;
    }
    let r = regs::of_probe(&ctx);
    let mut flags = window.flags;
    let mut go_started_ns = 0;
    // On the calls of `timeHistogram.record` the slot is above SP and the
    // second argument is Go's pause; on the RETs it is below SP and the
    // result is Go's `now`.
    let at_call = window.setup & PauseWindow::SETUP_END_AT_RECORD != 0;
    let (off, slot) = if at_call {
        let off = window.start_call_rsp_started_stopping;
        (off, regs::sp(r).wrapping_add(u64::from(off)))
    } else {
        let off = window.start_rsp_started_stopping;
        (off, regs::sp(r).wrapping_sub(u64::from(off)))
    };
    if off != GoOffsets::UNKNOWN {
        // SAFETY: bpf_probe_read_user checks the address.
        match unsafe { bpf_probe_read_user(slot as *const u64) } {
            Ok(v) => {
                go_started_ns = v;
                flags |= PauseEvent::FLAG_GO_START;
            }
            Err(_) => {
                flags |= PauseEvent::FLAG_READ_FAILED;
                count(Counter::ReadUserFailed);
            }
        }
    }
    let go_now_ns = match (at_call, flags & PauseEvent::FLAG_GO_START != 0) {
        (false, _) => regs::arg0(r),
        (true, true) => go_started_ns.wrapping_add(regs::arg1(r)),
        // Go's pause without its start: no time of Go's to report.
        (true, false) => 0,
    };
    // The stopping probe gave the phase's length; Go's start anchors it.
    let mut stopping = GoStopping::default();
    if flags & PauseEvent::FLAG_STOPPING != 0 {
        if flags & PauseEvent::FLAG_GO_START != 0 {
            let ns = window.stopping.stopping_ns;
            stopping = GoStopping {
                started_ns: go_started_ns,
                finished_ns: go_started_ns.wrapping_add(ns),
                stopping_ns: ns,
            };
        } else {
            flags &= !PauseEvent::FLAG_STOPPING;
        }
    }
    if window.setup & PauseWindow::SETUP_EXPLAINED != 0 {
        explain::send(tgid, ctx.pid());
    }
    let Some(mut entry) = PAUSE_EVENTS.reserve::<PauseEvent>(0) else {
        ringbuf_full(Counter::RingbufFullPause);
        return 0;
    };
    entry.write(PauseEvent {
        header: EventHeader {
            kind: EventKind::Pause as u32,
            tgid,
            tid: ctx.pid(),
            // SAFETY: helper with no arguments.
            cpu: unsafe { bpf_get_smp_processor_id() },
            ts_ns: window.last_end_ts_ns,
        },
        stop_ts_ns,
        go_now_ns,
        go_started_ns,
        stop_tid: window.stop_tid,
        reason: window.reason,
        flags,
        reason_text_len: window.reason_text_len,
        reason_text: if flags & PauseEvent::FLAG_REASON_TEXT != 0 {
            window.reason_text
        } else {
            [0; REASON_TEXT_LEN]
        },
        stopping,
    });
    entry.submit(SUBMIT_FLAGS);
    0
}
