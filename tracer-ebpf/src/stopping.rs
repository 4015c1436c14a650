//! Go's stopping phase (Go 1.22+): a uprobe on each call of
//! `runtime.(*timeHistogram).record` in `runtime.stopTheWorldWithSema` (one
//! for GC pauses, one for the others), made once the last P stopped, with
//! Go's stopping time `finish - start` in the second argument register
//! (ABIInternal: the receiver first, the duration next; `regs::arg1`). The kernel emulates a CALL: one trap (0.8 us
//! here), where the RET of `stopTheWorldWithSema` (single-stepped) cost
//! 10 us, and both are inside the pause the program pays for.
//!
//! One map lookup and two stores (and the explained pause's phase).

use aya_ebpf::{EbpfContext as _, macros::uprobe, programs::ProbeContext};
use tracer_common::pause::{PauseEvent, PauseWindow};

use crate::{explain, maps::PAUSE_WINDOWS, regs};

#[uprobe]
pub fn stw_stopped(ctx: ProbeContext) -> u32 {
    let tgid = ctx.tgid();
    // Only traced processes have a pause window, so this lookup is also the
    // traced check.
    let Some(window) = PAUSE_WINDOWS.get_ptr_mut(tgid) else {
        return 0;
    };
    let r = regs::of_probe(&ctx);
    // SAFETY: the window is this process's, and its pauses never overlap
    // (`worldsema`).
    unsafe {
        if (*window).stop_ts_ns == 0 {
            return 0;
        }
        // `record(h, duration)`: the stopping phase's length.
        (*window).stopping.stopping_ns = regs::arg1(r);
        (*window).flags |= PauseEvent::FLAG_STOPPING;
        if (*window).setup & PauseWindow::SETUP_EXPLAINED != 0 {
            explain::stopped(tgid, explain::now());
        }
    }
    0
}
