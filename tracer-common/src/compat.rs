//! Program variants for older kernels. Some programs call helpers that
//! arrived after 5.10 (`bpf_get_current_task_btf` 5.11, `bpf_task_pt_regs`
//! 5.15, `bpf_loop` 5.17); each has a variant without them, which user space
//! loads instead where the kernel lacks the helper. Results are the same;
//! only the cost differs (see the README's kernel matrix).

/// One program and its variant for kernels without `helper`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fallback {
    pub preferred: &'static str,
    pub fallback: &'static str,
    pub helper: Helper,
    /// How the variant does without it.
    pub how: &'static str,
}

/// Helpers some preferred programs need, and the kernel that added them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Helper {
    /// `bpf_get_current_task_btf` (5.11) and `bpf_task_pt_regs` (5.15):
    /// always used together, so 5.15 decides.
    TaskPtRegs,
    /// `bpf_loop` (5.17).
    Loop,
}

impl Helper {
    pub const ALL: [Helper; 2] = [Helper::TaskPtRegs, Helper::Loop];

    pub fn name(self) -> &'static str {
        match self {
            Helper::TaskPtRegs => "bpf_task_pt_regs",
            Helper::Loop => "bpf_loop",
        }
    }

    /// The first Linux release that has it.
    pub fn since(self) -> &'static str {
        match self {
            Helper::TaskPtRegs => "5.15",
            Helper::Loop => "5.17",
        }
    }
}

/// Every program with a variant.
pub const FALLBACKS: &[Fallback] = &[
    Fallback {
        preferred: "fault_tp_switch",
        fallback: "fault_tp_switch_compat",
        helper: Helper::TaskPtRegs,
        how: "finds the thread's user registers from its task_struct (offsets from BTF)",
    },
    Fallback {
        preferred: "stack_sample",
        fallback: "stack_sample_compat",
        helper: Helper::TaskPtRegs,
        how: "finds the thread's user registers from its task_struct (offsets from BTF)",
    },
    Fallback {
        preferred: "explain_switch",
        fallback: "explain_switch_compat",
        helper: Helper::Loop,
        how: "walks the M list in a bounded loop of COMPAT_MAX_MS Ms",
    },
];

/// Ms the bounded-loop walk reads (the verifier of older kernels checks
/// every iteration; `explain::MAX_MS` with `bpf_loop`).
pub const COMPAT_MAX_MS: usize = 16;

/// Where the current task's saved user registers are, for the variants
/// without `bpf_task_pt_regs`: `*(task + stack_offset) + regs_offset`
/// (x86-64's `task_pt_regs`: the top of the kernel stack, `THREAD_SIZE`
/// above `task->stack`, less one `struct pt_regs`). Index 0 of the
/// `TASK_LAYOUT` array, written by user space; zero: unknown.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskLayout {
    pub stack_offset: u32,
    pub regs_offset: u32,
}
crate::assert_size!(TaskLayout, 8);

/// The map holding the `TaskLayout`.
pub const TASK_LAYOUT: &str = "TASK_LAYOUT";

#[cfg(feature = "user")]
mod user {
    // SAFETY: repr(C), plain integers, no padding.
    unsafe impl aya::Pod for super::TaskLayout {}
}
