//! Go's stopping phase (Go 1.23+): a uprobe at each RET of
//! `runtime.stopTheWorldWithSema`, where the `worldStop` it returns is still
//! in registers (ABIInternal, measured on 1.24-1.27 amd64 builds): AL =
//! reason, RBX = `startedStopping`, RCX = `finishedStopping`, RDI =
//! `stoppingCPUTime`. `finishedStopping` is never stored where the RET of
//! `startTheWorldWithSema` could read it, so this is the only place.
//!
//! The world is stopped here: the trap lands inside the pause the program
//! pays for (README, "Stopping phase"). The program does one map lookup and
//! a few stores (two lookups when the pause is explained), nothing else.

use aya_ebpf::{EbpfContext as _, macros::uprobe, programs::ProbeContext};
use tracer_common::pause::PauseEvent;

use crate::{explain, pause::PAUSE_WINDOWS};

#[uprobe]
pub fn stw_stopped(ctx: ProbeContext) -> u32 {
    // Only traced processes have a pause window, so this lookup is also the
    // traced check.
    let Some(window) = PAUSE_WINDOWS.get_ptr_mut(ctx.tgid()) else {
        return 0;
    };
    // SAFETY: uprobe context, pt_regs readable; the window is this
    // process's, and its pauses never overlap (`worldsema`).
    unsafe {
        let regs = &*ctx.regs;
        if (*window).stop_ts_ns == 0 {
            return 0;
        }
        (*window).stopping.started_ns = regs.rbx;
        (*window).stopping.finished_ns = regs.rcx;
        (*window).stopping.cpu_ns = regs.rdi;
        (*window).flags |= PauseEvent::FLAG_STOPPING;
        explain::stopped(ctx.tgid(), regs.rcx);
    }
    0
}
