//! The current thread's saved user registers, two ways: with the helpers of
//! 5.15 (`bpf_task_pt_regs` of `bpf_get_current_task_btf`), or for older
//! kernels from the task's kernel stack at offsets user space read from BTF
//! (`tracer_common::compat`). Programs that need them are built once for
//! each (`UserRegs`), and user space loads the one the kernel accepts.

use aya_ebpf::{
    helpers::{
        bpf_get_current_task, bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_task_pt_regs,
    },
    macros::map,
    maps::Array,
};
use tracer_common::compat::TaskLayout;

use crate::regs::Regs;

/// `TaskLayout` at index 0, written by user space where the variants load.
#[map]
static TASK_LAYOUT: Array<TaskLayout> = Array::with_max_entries(1, 0);

/// Where the current thread's user registers are; read them with
/// `bpf_probe_read_kernel` only.
pub trait UserRegs {
    fn current() -> Option<*const Regs>;
}

/// 5.15 and newer.
pub struct TaskBtf;

impl UserRegs for TaskBtf {
    #[inline(always)]
    fn current() -> Option<*const Regs> {
        // SAFETY: the current task is valid for the whole program run.
        Some(unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const Regs)
    }
}

/// Older kernels: `task->stack + regs_offset`.
pub struct TaskLayoutRegs;

impl UserRegs for TaskLayoutRegs {
    #[inline(always)]
    fn current() -> Option<*const Regs> {
        let l = TASK_LAYOUT.get(0)?;
        if l.stack_offset == 0 {
            return None;
        }
        // SAFETY: the current task is valid for the program run; the read
        // goes through the checked helper.
        let stack: u64 = unsafe {
            let task = bpf_get_current_task();
            bpf_probe_read_kernel((task + u64::from(l.stack_offset)) as *const u64).ok()?
        };
        (stack != 0).then(|| (stack + u64::from(l.regs_offset)) as *const Regs)
    }
}
