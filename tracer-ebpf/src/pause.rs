//! Stop-the-world pause probes: `runtime.stopTheWorldWithSema` entry opens a
//! pause window, the RET instructions of `runtime.startTheWorldWithSema`
//! close it. Never a uretprobe (Go moves stacks), never a probe inside the
//! window (each hit costs microseconds and would lengthen the pause).

use aya_ebpf::{EbpfContext as _, macros::uprobe, programs::ProbeContext};
use tracer_common::process::Probe;

use crate::maps::{hit, traced};

/// Go: `func stopTheWorldWithSema(reason stwReason) worldStop` (1.21+;
/// no argument before). Runs on g0 with the world still running.
#[uprobe]
pub fn stw_stop(ctx: ProbeContext) -> u32 {
    let tgid = ctx.tgid();
    if traced(tgid).is_none() {
        return 0;
    }
    hit(tgid, Probe::StopTheWorld);
    0
}

/// Attached at each RET of `runtime.startTheWorldWithSema`.
#[uprobe]
pub fn stw_start_ret(ctx: ProbeContext) -> u32 {
    let tgid = ctx.tgid();
    if traced(tgid).is_none() {
        return 0;
    }
    hit(tgid, Probe::StartTheWorldRet);
    0
}
