//! Go's ABIInternal registers in a saved register set, by role: the one
//! place that names an architecture's registers (the programs ask for "the
//! first argument" or "g", never for RAX or R28).
//!
//! | role | amd64 | arm64 |
//! |---|---|---|
//! | first argument / result | RAX | R0 |
//! | second argument | RBX | R1 |
//! | g (the current goroutine) | R14 | R28 |
//! | stack pointer | RSP | SP |
//! | frame pointer | RBP | R29 |
//! | program counter | RIP | PC |
//!
//! `Regs` is the set as a probe's context, a perf sample and a task's saved
//! user registers hold it (`pt_regs` on amd64, `user_pt_regs` on arm64,
//! which begins the kernel's `pt_regs` there). The getters read a set the
//! program may read directly (its context); the `*_at` functions give a
//! field's address, for a set read with `bpf_probe_read_kernel`.
//!
//! Built for one architecture at a time (`bpf_target_arch`, set by
//! aya-ebpf's build from the target or `CARGO_CFG_BPF_TARGET_ARCH`).

#[cfg(bpf_target_arch = "x86_64")]
mod arch {
    use core::ptr::addr_of;

    pub use aya_ebpf::bindings::pt_regs as Regs;

    #[inline(always)]
    pub fn arg0(r: &Regs) -> u64 {
        r.rax
    }

    #[inline(always)]
    pub fn arg1(r: &Regs) -> u64 {
        r.rbx
    }

    #[inline(always)]
    pub fn g(r: &Regs) -> u64 {
        r.r14
    }

    #[inline(always)]
    pub fn sp(r: &Regs) -> u64 {
        r.rsp
    }

    #[inline(always)]
    pub fn fp(r: &Regs) -> u64 {
        r.rbp
    }

    #[inline(always)]
    pub fn pc(r: &Regs) -> u64 {
        r.rip
    }

    /// Whether the set was saved in user mode (CS's privilege level 3).
    #[inline(always)]
    pub fn user_mode(r: &Regs) -> bool {
        r.cs & 3 == 3
    }

    /// The address of g's register in the set at `r` (nothing is read).
    #[inline(always)]
    pub fn g_at(r: *const Regs) -> *const u64 {
        // SAFETY: only the field's address is computed.
        unsafe { addr_of!((*r).r14) }
    }

    #[inline(always)]
    pub fn sp_at(r: *const Regs) -> *const u64 {
        // SAFETY: as above.
        unsafe { addr_of!((*r).rsp) }
    }

    #[inline(always)]
    pub fn pc_at(r: *const Regs) -> *const u64 {
        // SAFETY: as above.
        unsafe { addr_of!((*r).rip) }
    }
}

#[cfg(bpf_target_arch = "aarch64")]
mod arch {
    use core::ptr::addr_of;

    pub use aya_ebpf::bindings::user_pt_regs as Regs;

    #[inline(always)]
    pub fn arg0(r: &Regs) -> u64 {
        r.regs[0]
    }

    #[inline(always)]
    pub fn arg1(r: &Regs) -> u64 {
        r.regs[1]
    }

    #[inline(always)]
    pub fn g(r: &Regs) -> u64 {
        r.regs[28]
    }

    #[inline(always)]
    pub fn sp(r: &Regs) -> u64 {
        r.sp
    }

    #[inline(always)]
    pub fn fp(r: &Regs) -> u64 {
        r.regs[29]
    }

    #[inline(always)]
    pub fn pc(r: &Regs) -> u64 {
        r.pc
    }

    /// Whether the set was saved in user mode (PSTATE's mode EL0t).
    #[inline(always)]
    pub fn user_mode(r: &Regs) -> bool {
        r.pstate & 0xf == 0
    }

    /// The address of g's register in the set at `r` (nothing is read).
    #[inline(always)]
    pub fn g_at(r: *const Regs) -> *const u64 {
        // SAFETY: only the field's address is computed.
        unsafe { addr_of!((*r).regs[28]) }
    }

    #[inline(always)]
    pub fn sp_at(r: *const Regs) -> *const u64 {
        // SAFETY: as above.
        unsafe { addr_of!((*r).sp) }
    }

    #[inline(always)]
    pub fn pc_at(r: *const Regs) -> *const u64 {
        // SAFETY: as above.
        unsafe { addr_of!((*r).pc) }
    }
}

pub use arch::*;

/// Whether Go's `runtime.systemstack` keeps the goroutine's frame pointer
/// when it switches to g0 (amd64: BP is left as it was), so that a frame
/// chain walked on g0 runs on into the goroutine's frames. On arm64 it
/// loads g0's own saved FP (zero) instead: the goroutine's chain starts at
/// `curg.sched.bp`, which `systemstack` saved on the way (asm_arm64.s).
pub const SYSTEMSTACK_KEEPS_FP: bool = cfg!(bpf_target_arch = "x86_64");

/// A probe's register set (`ProbeContext::regs`) as `Regs`.
#[inline(always)]
pub fn of_probe(ctx: &aya_ebpf::programs::ProbeContext) -> &Regs {
    // SAFETY: the kernel hands probes a valid register set, which on arm64
    // begins with `user_pt_regs` (on amd64 it is `pt_regs` itself).
    unsafe { &*(ctx.regs as *const Regs) }
}
