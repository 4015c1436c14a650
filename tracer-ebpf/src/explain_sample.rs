//! The laggards' code while they hold a stop: a CPU-clock sampler on every
//! CPU (`LAGGARD_SAMPLER`, every `LAGGARD_SAMPLE_PERIOD_NS`), attached with
//! the scheduler programs. While no explained process is inside a pause it
//! returns after one array lookup. Inside a stopping phase, a thread that
//! the M list named as running a goroutine, sampled in user mode while
//! still running that goroutine (g's register, `regs::g`, is it), has
//! its user stack taken at the first such sample: the code that keeps it
//! from stopping (later samples are counted). A sample
//! after the goroutine reached its safe point (the runtime on g0's stack)
//! is not taken. Its switch-out (`explain_sched`) only shows where it
//! finally stopped, which for a loop whose safe point is in its caller is
//! the caller, not the loop.
//!
//! A sample in the kernel of such a thread while stopping, or of the
//! stopping thread in any phase, adds its period to the pause's kernel
//! time at the kernel stack it interrupted (`KernelWait::ON_CPU`): the time
//! those threads ran in the kernel (page faults zeroing or copying pages,
//! reclaim scanning) rather than in Go code.

use aya_ebpf::{
    bindings::{BPF_F_REUSE_STACKID, BPF_F_USER_STACK},
    macros::perf_event,
    programs::{PerfEventContext, tracing::StackIdContext as _},
};
use tracer_common::{
    counters::Counter,
    explain::{KernelWait, LAGGARD_SAMPLE_PERIOD_NS, PHASE_STOPPING},
};

use crate::{
    explain::{PAUSE_STACKS, add_kernel_time, any_open, kernel_stack, laggard_slot, open_detail},
    explain_sched::candidate,
    fault::current_ids,
    maps::{count, traced},
    regs,
    stack::field,
};

/// `LAGGARD_SAMPLER`.
#[perf_event]
pub fn laggard_sample(ctx: PerfEventContext) -> u32 {
    if !any_open() {
        return 0;
    }
    let (tgid, tid) = current_ids();
    let Some(d) = open_detail(tgid) else {
        return 0;
    };
    // SAFETY: the kernel hands perf_event programs valid sample data.
    let sample = unsafe { &(*ctx.ctx).regs };
    let stopper = tid == d.stop_tid;
    let stopping = d.phase == PHASE_STOPPING;
    // Only threads that held a P running a goroutine when the stop began:
    // the others (sysmon, an idle M looking for work) do not delay it.
    let (m, g) = if stopping && !stopper {
        candidate(d, tid)
    } else {
        (0, 0)
    };
    if !regs::user_mode(sample) {
        if stopper || m != 0 {
            let stack = kernel_stack(&ctx);
            add_kernel_time(
                d,
                tid,
                d.phase | KernelWait::ON_CPU,
                stack,
                LAGGARD_SAMPLE_PERIOD_NS,
            );
        }
        return 0;
    }
    if m == 0 || regs::g(sample) != g {
        return 0;
    }
    // On the goroutine's own stack: once it reached its safe point the
    // runtime runs on g0's (`runtime.newstack` after a stack-check
    // preemption) with g's register not yet changed.
    let Some(p) = traced(tgid) else {
        return 0;
    };
    let (Some(lo), Some(hi)) = (
        field(g, p.offsets.g_stack_lo),
        field(g, p.offsets.g_stack_hi),
    ) else {
        return 0;
    };
    if !(lo..hi).contains(&regs::sp(sample)) {
        return 0;
    }
    let slot = laggard_slot(d, tid);
    let l = &mut d.laggards[slot];
    // The first sample's stack is the code that kept the world waiting.
    // A later one can catch the goroutine on its way to the safe point
    // (`runtime.morestack`, still on its own stack), which names where it
    // stopped, as its switch-out already does.
    if l.held_samples == 0 {
        let flags = (BPF_F_USER_STACK | BPF_F_REUSE_STACKID) as u64;
        match ctx.get_stackid(&PAUSE_STACKS, flags) {
            Ok(id) => l.held_stack_id = id as i32,
            Err(_) => {
                count(Counter::LaggardStackFailed);
                return 0;
            }
        }
    }
    l.held_samples += 1;
    0
}
