//! Major-fault backend built from kprobes (the design card's probes), for
//! kernels with CONFIG_KPROBES. A fault is one call of `do_swap_page` (anonymous
//! memory read back from swap) or `filemap_fault` (file page cache miss); it
//! is major when the call returns VM_FAULT_MAJOR, or when it returns
//! VM_FAULT_RETRY: the kernel counts every retried fault as major
//! (`mm_account_fault`, FAULT_FLAG_TRIED), and the retry often never comes
//! back here (another thread mapped the page meanwhile), so such a fault is
//! sent at its first RETRY and its retry, if seen, is folded into it. A
//! RETRY while a signal is pending is the exception: the kernel abandons the
//! fault for the signal handler without counting it (the program faults
//! again afterwards, a new fault), so such an attempt is dropped. So is a
//! RETRY of an attempt under the per-VMA lock (6.4+) that was not major
//! itself: the kernel retries it under the mmap lock without
//! FAULT_FLAG_TRIED, and counts it by that retry's own result. Waits
//! are the time spent in the page-lock slow path, own when this thread issued
//! the swap read itself.
//!
//! Each probe names the kernel function signature it depends on; names moved
//! across releases (`swap_readpage` -> `swap_read_folio` about 6.8,
//! `__lock_page_or_retry` -> `__folio_lock_or_retry` in 5.16): user space
//! attaches whichever exists.

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel},
    macros::{kprobe, kretprobe, map},
    maps::Array,
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    counters::Counter,
    fault::{Backend, FaultEvent, FaultLayout},
};

use crate::{
    fault::{
        FAULT_STATE, STATE_EMITTED, STATE_MAJOR_SEEN, STATE_VMA_LOCK, begin, close_blocked,
        current_ids, emit, now, state_mut,
    },
    maps::{count, traced, uncount},
};

/// `VM_FAULT_MAJOR` and `VM_FAULT_RETRY` (include/linux/mm_types.h, stable).
const VM_FAULT_MAJOR: u32 = 0x0004;
const VM_FAULT_RETRY: u32 = 0x0400;
/// Offset of `address` in `struct vm_fault` (after `vma`, `gfp_mask`, `pgoff`;
/// unchanged since 5.x).
const VM_FAULT_ADDRESS: usize = 24;

/// `FaultLayout` at index 0, written by user space from the kernel's BTF.
#[map]
static FAULT_LAYOUT: Array<FaultLayout> = Array::with_max_entries(1, 0);

/// `FAULT_FLAG_VMA_LOCK` (`enum fault_flag`, 6.4+; the bit is unused before).
const FAULT_FLAG_VMA_LOCK: u32 = 1 << 12;
/// `*(base + offset)` in kernel memory, if the offset is known.
#[inline(always)]
fn read_at<T>(base: u64, offset: u32) -> Option<T> {
    if offset == 0 {
        return None;
    }
    // SAFETY: a kernel pointer read through the helper, which checks it.
    unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T) }.ok()
}

/// Whether the current thread has a signal of its own pending and not
/// blocked (what sets `TIF_SIGPENDING` for the thread-directed signals Go
/// preempts with): a fault that returns VM_FAULT_RETRY now is abandoned
/// (`fault_signal_pending` in the arch's fault handler), not retried, and
/// not counted.
#[inline(always)]
fn signal_pending() -> bool {
    let Some(l) = FAULT_LAYOUT.get(0) else {
        return false;
    };
    // SAFETY: no preconditions.
    let task = unsafe { bpf_get_current_task() };
    let pending: u64 = read_at(task, l.task_pending_signal).unwrap_or(0);
    let blocked: u64 = read_at(task, l.task_blocked).unwrap_or(0);
    pending & !blocked != 0
}

/// `STATE_VMA_LOCK` if the attempt of `vmf` runs under the per-VMA lock.
#[inline(always)]
fn vma_lock_flag(vmf: *const u8) -> u32 {
    let Some(l) = FAULT_LAYOUT.get(0) else {
        return 0;
    };
    let flags: u32 = read_at(vmf as u64, l.vmf_flags).unwrap_or(0);
    if flags & FAULT_FLAG_VMA_LOCK != 0 {
        STATE_VMA_LOCK
    } else {
        0
    }
}

#[inline(always)]
fn fault_entry(ctx: &ProbeContext, flags: u32) -> u32 {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return 0;
    }
    count(Counter::FaultReturnsPending);
    let vmf: *const u8 = ctx.arg(0).unwrap_or(core::ptr::null());
    let address = if vmf.is_null() {
        0
    } else {
        // SAFETY: a kernel pointer read through the helper, which checks it.
        unsafe { bpf_probe_read_kernel(vmf.add(VM_FAULT_ADDRESS).cast::<u64>()) }.unwrap_or(0)
    };
    let vma_lock = if vmf.is_null() { 0 } else { vma_lock_flag(vmf) };
    if let Some(state) = state_mut(tid)
        && state.retry_pending != 0
        && state.address == address
    {
        // The retry of a fault that dropped its lock: same fault.
        state.retry_pending = 0;
        state.flags = (state.flags & !STATE_VMA_LOCK) | FaultEvent::FLAG_RETRIED | flags | vma_lock;
        return 0;
    }
    begin(tid, address, 0, flags | vma_lock);
    0
}

#[inline(always)]
fn fault_return(ctx: &RetProbeContext) -> u32 {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return 0;
    }
    let ret: u32 = ctx.ret();
    let Some(state) = state_mut(tid) else {
        // A call that began before the entry probes were attached (user
        // space attaches the returns first), so not counted as pending.
        return 0;
    };
    uncount(Counter::FaultReturnsPending);
    let major = ret & VM_FAULT_MAJOR != 0;
    if major {
        state.flags |= STATE_MAJOR_SEEN;
    }
    let retry = ret & VM_FAULT_RETRY != 0;
    if retry && state.flags & STATE_EMITTED == 0 && signal_pending() {
        // Abandoned for a signal: the kernel does not count it, and the
        // fault taken again after the handler is a new one.
        let _ = FAULT_STATE.remove(tid);
        return 0;
    }
    // Retried with FAULT_FLAG_TRIED, so counted major whatever the retry
    // finds: any RETRY under the mmap lock, one under the per-VMA lock only
    // if this attempt was major.
    let tried = retry && (state.flags & STATE_VMA_LOCK == 0 || major);
    if (tried || state.flags & STATE_MAJOR_SEEN != 0) && state.flags & STATE_EMITTED == 0 {
        close_blocked(state, now());
        if retry {
            state.flags |= FaultEvent::FLAG_RETRIED;
        }
        let address = state.address;
        emit(ctx, tgid, tid, Some(state), address, Backend::Kprobe);
        state.flags |= STATE_EMITTED;
    }
    if retry {
        state.retry_pending = 1;
    } else {
        let _ = FAULT_STATE.remove(tid);
    }
    0
}

/// `vm_fault_t do_swap_page(struct vm_fault *vmf)` (mm/memory.c): a fault on
/// a swapped-out anonymous page begins.
#[kprobe]
pub fn fault_kp_swap_entry(ctx: ProbeContext) -> u32 {
    fault_entry(&ctx, FaultEvent::FLAG_SWAP)
}

/// Return of `do_swap_page`: VM_FAULT_MAJOR if the page was read from swap.
#[kretprobe]
pub fn fault_kp_swap_ret(ctx: RetProbeContext) -> u32 {
    fault_return(&ctx)
}

/// `vm_fault_t filemap_fault(struct vm_fault *vmf)` (mm/filemap.c): a fault
/// on a file-backed page begins.
#[kprobe]
pub fn fault_kp_filemap_entry(ctx: ProbeContext) -> u32 {
    fault_entry(&ctx, FaultEvent::FLAG_FILE)
}

/// Return of `filemap_fault`: VM_FAULT_MAJOR on a page cache miss.
#[kretprobe]
pub fn fault_kp_filemap_ret(ctx: RetProbeContext) -> u32 {
    fault_return(&ctx)
}

/// `void swap_read_folio(struct folio *folio, struct swap_iocb **plug)` (6.8+)
/// or `int swap_readpage(struct page *page, bool synchronous, struct
/// swap_iocb **plug)` (before): this thread issues a swap read.
#[kprobe]
pub fn fault_kp_swap_read(_ctx: ProbeContext) -> u32 {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return 0;
    }
    if let Some(state) = state_mut(tid) {
        state.flags |= FaultEvent::FLAG_OWN_IO;
        state.reads_issued += 1;
    }
    0
}

/// `vm_fault_t __folio_lock_or_retry(struct folio *folio, struct vm_fault *vmf)`
/// (5.16+) or `int __lock_page_or_retry(struct page *page, struct mm_struct *mm,
/// unsigned int flags)` (before): the slow path of taking a page lock that an
/// I/O in flight holds. Own wait if this thread issued a read in this fault.
#[kprobe]
pub fn fault_kp_lock_entry(_ctx: ProbeContext) -> u32 {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return 0;
    }
    if let Some(state) = state_mut(tid)
        && state.off_since_ns == 0
    {
        state.off_since_ns = now();
        state.off_own = u32::from(state.flags & FaultEvent::FLAG_OWN_IO != 0);
    }
    0
}

/// Return of `__folio_lock_or_retry`: the lock wait is over.
#[kretprobe]
pub fn fault_kp_lock_ret(_ctx: RetProbeContext) -> u32 {
    let (tgid, tid) = current_ids();
    if traced(tgid).is_none() {
        return 0;
    }
    if let Some(state) = state_mut(tid) {
        close_blocked(state, now());
    }
    0
}
