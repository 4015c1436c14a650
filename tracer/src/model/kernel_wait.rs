//! Where in the kernel the threads that mattered to a pause spent their
//! time: the stopping thread in any phase, the laggards while the world was
//! stopping. The kernel adds up each thread's blocked time by the kernel
//! stack it went to sleep at, and its sampled running in the kernel by the
//! stack each sample interrupted; that stack names what it waited on or
//! did, and `WaitKind` reads it.

use serde::Serialize;
use tracer_common::explain::{PHASE_RESTARTING, PHASE_STOPPED};

/// What a sleep in the kernel waited on, read from its kernel stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    /// The address space's lock (`mmap_lock`), held by another thread (a
    /// `munmap`, `mprotect`, `mmap`, `madvise`): a page fault or a memory
    /// syscall waits for it.
    MmapLock,
    /// gostw's own uprobe: the kernel looking the probe up takes the
    /// address space's lock when its lock-free lookup fails (a writer holds
    /// it), so a probe inside a pause can wait for another thread's
    /// `mprotect` or `munmap`. The cost of tracing, shown where it falls.
    Uprobe,
    /// Freeing memory for the thread: direct or memory-cgroup reclaim, the
    /// `memory.high` throttle on the way back to user space, compaction.
    Reclaim,
    /// A page being read in or locked (major faults, file I/O).
    PageIo,
    /// Handling a page fault in the kernel: zeroing or copying a page
    /// (minor faults), transparent huge pages, NUMA migration.
    PageFault,
    /// Writing dirty pages back before more may be dirtied.
    DirtyThrottle,
    /// A futex: Go's own sleep (an M waiting for work or for the world to
    /// stop or start).
    Futex,
    /// An interruptible sleep (a futex: Go's own waits; a poll; a
    /// nanosleep): its kernel stack is not taken, for cost (what a pause
    /// waits on in the kernel sleeps uninterruptibly).
    Sleep,
    /// The kernel stack could not be taken.
    Unknown,
    /// Anything else (its frames say what).
    Other,
}

impl WaitKind {
    /// Whether time of this kind says why a pause was slow: not Go's own
    /// futex sleeps, an interruptible sleep, or what has no name.
    pub fn says_why(self) -> bool {
        !matches!(
            self,
            WaitKind::Futex | WaitKind::Sleep | WaitKind::Other | WaitKind::Unknown
        )
    }

    /// Its name in JSON and metrics.
    pub fn name(self) -> &'static str {
        match self {
            WaitKind::MmapLock => "mmap_lock",
            WaitKind::Uprobe => "uprobe",
            WaitKind::Reclaim => "reclaim",
            WaitKind::PageIo => "page_io",
            WaitKind::PageFault => "page_fault",
            WaitKind::DirtyThrottle => "dirty_throttle",
            WaitKind::Futex => "futex",
            WaitKind::Sleep => "sleep",
            WaitKind::Unknown => "unknown",
            WaitKind::Other => "other",
        }
    }

    /// The kind of a sleep at kernel `frames` (function names, innermost
    /// first). Reclaim and compaction anywhere on the stack win (they wait
    /// on locks and I/O of their own); else the innermost frame that waits
    /// says on what.
    pub fn of(frames: &[String]) -> WaitKind {
        if frames.is_empty() {
            return WaitKind::Unknown;
        }
        if frames.iter().any(|f| is_reclaim(f)) {
            return WaitKind::Reclaim;
        }
        if frames
            .iter()
            .any(|f| f.starts_with("uprobe_") || f.contains("find_active_uprobe"))
        {
            return WaitKind::Uprobe;
        }
        let in_mm = frames.iter().any(|f| is_mm_entry(f));
        for f in frames {
            if f.starts_with("rwsem_down_") && in_mm {
                return WaitKind::MmapLock;
            }
            if f == "balance_dirty_pages" {
                return WaitKind::DirtyThrottle;
            }
            if f.starts_with("folio_wait_")
                || f.starts_with("__folio_lock")
                || f.starts_with("wait_on_page")
                || f == "__lock_page"
                || f == "__lock_page_or_retry"
                || f == "io_schedule"
            {
                return WaitKind::PageIo;
            }
            if f.starts_with("futex_") {
                return WaitKind::Futex;
            }
        }
        if frames.iter().any(|f| is_fault_entry(f)) {
            return WaitKind::PageFault;
        }
        WaitKind::Other
    }
}

/// Functions of reclaim, memory-cgroup throttling and compaction.
fn is_reclaim(f: &str) -> bool {
    f.starts_with("shrink_")
        || f.starts_with("try_to_free_")
        || f.starts_with("try_to_compact")
        || f.starts_with("compact_zone")
        || matches!(
            f,
            "do_try_to_free_pages"
                | "__perform_reclaim"
                | "__alloc_pages_direct_reclaim"
                | "__alloc_pages_direct_compact"
                | "throttle_direct_reclaim"
                | "reclaim_throttle"
                | "mem_cgroup_handle_over_high"
                | "reclaim_high"
        )
}

/// The page-fault path's entry on x86 and arm64.
fn is_fault_entry(f: &str) -> bool {
    matches!(
        f,
        "handle_mm_fault"
            | "do_user_addr_fault"
            | "exc_page_fault"
            | "asm_exc_page_fault"
            | "do_page_fault"
    )
}

/// Functions through which a thread takes its address space's lock: the
/// page-fault path and the memory syscalls.
fn is_mm_entry(f: &str) -> bool {
    [
        "user_addr_fault",
        "do_page_fault",
        "mm_and_find_vma",
        "mmap",
        "munmap",
        "mprotect",
        "madvise",
        "mremap",
        "brk",
        "get_user_pages",
        "access_remote_vm",
    ]
    .iter()
    .any(|p| f.contains(p))
}

/// The scheduler's own frames at the top of a sleeping thread's stack (and
/// the tracing frames above them), left out of what a record shows.
fn is_scheduler(f: &str) -> bool {
    f.starts_with("schedule")
        || f.starts_with("__schedule")
        || f.starts_with("io_schedule")
        || f.starts_with("bpf_")
        || f.starts_with("perf_")
        || f.starts_with("__bpf_")
        || f.starts_with("__traceiter_")
        || f.starts_with("trace_call_bpf")
        || f.starts_with("__perf_")
}

/// The frames worth showing of a sleep's kernel stack: from the first one
/// below the scheduler's.
pub fn shown(frames: &[String]) -> Vec<String> {
    let last_sched = frames.iter().rposition(|f| is_scheduler(f));
    // Only the scheduler's block at the top: a tracing frame deep in a
    // stack is not where the sleep began.
    let cut = match last_sched {
        Some(i) if frames[..=i].iter().all(|f| is_scheduler(f)) => i + 1,
        _ => frames.iter().take_while(|f| is_scheduler(f)).count(),
    };
    frames[cut..].iter().take(SHOWN_FRAMES).cloned().collect()
}

/// Kernel frames a record keeps per wait.
pub const SHOWN_FRAMES: usize = 8;

/// A wait as the kernel added it up, its stack named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawWait {
    pub tid: u32,
    /// `PHASE_*` of the kernel side.
    pub phase: u32,
    pub count: u32,
    pub blocked_ns: u64,
    /// Sampled running, not asleep (`KernelWait::ON_CPU`).
    pub on_cpu: bool,
    /// An interruptible sleep, its stack not taken.
    pub interruptible: bool,
    /// Kernel function names, innermost first (empty: not taken).
    pub frames: Vec<String>,
}

/// The phase of a pause a wait began in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Stopping,
    Stopped,
    Restarting,
}

impl Phase {
    pub fn of(kernel_phase: u32) -> Phase {
        match kernel_phase {
            PHASE_STOPPED => Phase::Stopped,
            PHASE_RESTARTING => Phase::Restarting,
            _ => Phase::Stopping,
        }
    }
}

/// Whose sleep it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sleeper {
    /// The thread that stopped the world.
    Stopping,
    /// Another thread of the process, while the world was stopping.
    Laggard,
}

/// Time a thread slept in the kernel during a pause at one kernel stack, in
/// a pause record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelWaitRecord {
    pub tid: u32,
    pub thread: Sleeper,
    pub phase: Phase,
    pub kind: WaitKind,
    /// Running in the kernel (sampled: `ns` is `count` samples of 1 ms of
    /// CPU time), not asleep.
    pub on_cpu: bool,
    /// Asleep: blocked time (until woken) over `count` sleeps.
    pub ns: u64,
    pub count: u32,
    /// Its kernel stack below the scheduler, innermost first (at most
    /// `SHOWN_FRAMES`).
    pub frames: Vec<String>,
}

impl KernelWaitRecord {
    /// The record of `w` in a pause stopped by thread `stopper`.
    pub fn of(w: &RawWait, stopper: u32) -> KernelWaitRecord {
        KernelWaitRecord {
            tid: w.tid,
            thread: if w.tid == stopper {
                Sleeper::Stopping
            } else {
                Sleeper::Laggard
            },
            phase: Phase::of(w.phase),
            kind: if w.interruptible {
                WaitKind::Sleep
            } else {
                WaitKind::of(&w.frames)
            },
            on_cpu: w.on_cpu,
            ns: w.blocked_ns,
            count: w.count,
            frames: shown(&w.frames),
        }
    }
}

/// Time in the kernel that the breakdown names by its kind (the rest stays
/// in the blocked or running parts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamedWaits {
    pub mmap_lock_ns: u64,
    pub reclaim_ns: u64,
    pub probe_ns: u64,
    /// Running in the page-fault path (sampled running only).
    pub fault_ns: u64,
}

impl NamedWaits {
    /// The named time of `waits` that `keep` selects.
    pub fn of<'a>(
        waits: impl IntoIterator<Item = &'a KernelWaitRecord>,
        keep: impl Fn(&KernelWaitRecord) -> bool,
    ) -> NamedWaits {
        let mut n = NamedWaits::default();
        for w in waits.into_iter().filter(|w| keep(w)) {
            match w.kind {
                WaitKind::MmapLock => n.mmap_lock_ns += w.ns,
                WaitKind::Reclaim => n.reclaim_ns += w.ns,
                WaitKind::Uprobe => n.probe_ns += w.ns,
                WaitKind::PageFault if w.on_cpu => n.fault_ns += w.ns,
                _ => {}
            }
        }
        n
    }
}

/// A thread's named time in the kernel, asleep and running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelTime {
    pub asleep: NamedWaits,
    pub running: NamedWaits,
}

impl KernelTime {
    /// The named time of `waits` that `keep` selects.
    pub fn of(waits: &[KernelWaitRecord], keep: impl Fn(&KernelWaitRecord) -> bool) -> KernelTime {
        KernelTime {
            asleep: NamedWaits::of(waits, |w| !w.on_cpu && keep(w)),
            running: NamedWaits::of(waits, |w| w.on_cpu && keep(w)),
        }
    }

    /// Both of `o`'s added to these.
    pub fn add(&mut self, o: &KernelTime) {
        for (a, b) in [
            (&mut self.asleep, &o.asleep),
            (&mut self.running, &o.running),
        ] {
            a.mmap_lock_ns += b.mmap_lock_ns;
            a.reclaim_ns += b.reclaim_ns;
            a.probe_ns += b.probe_ns;
            a.fault_ns += b.fault_ns;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn a_fault_waiting_for_the_address_space_lock_is_mmap_lock() {
        // Linux 6.18: the fault path takes the lock killable.
        let new = names(
            "bpf_prog_1 bpf_trace_run4 __traceiter_sched_switch __schedule schedule \
             rwsem_down_read_slowpath down_read_killable lock_mm_and_find_vma \
             do_user_addr_fault exc_page_fault asm_exc_page_fault",
        );
        assert_eq!(WaitKind::of(&new), WaitKind::MmapLock);
        assert_eq!(
            shown(&new),
            names(
                "rwsem_down_read_slowpath down_read_killable lock_mm_and_find_vma \
                 do_user_addr_fault exc_page_fault asm_exc_page_fault"
            )
        );
        // Linux 6.1: plain down_read in do_user_addr_fault.
        let old = names(
            "__schedule schedule rwsem_down_read_slowpath down_read do_user_addr_fault \
             exc_page_fault asm_exc_page_fault",
        );
        assert_eq!(WaitKind::of(&old), WaitKind::MmapLock);
        // A writer waiting in munmap.
        let unmap = names(
            "__schedule schedule rwsem_down_write_slowpath down_write_killable __vm_munmap \
             __x64_sys_munmap do_syscall_64",
        );
        assert_eq!(WaitKind::of(&unmap), WaitKind::MmapLock);
    }

    #[test]
    fn a_probe_waiting_for_the_lock_is_the_probe() {
        // Seen on 6.18: the stopping probe's lookup waited 7 ms for an
        // mprotect beside it.
        let probe = names(
            "__schedule schedule rwsem_down_read_slowpath down_read find_active_uprobe_rcu              uprobe_notify_resume irqentry_exit_to_user_mode asm_exc_int3",
        );
        assert_eq!(WaitKind::of(&probe), WaitKind::Uprobe);
    }

    #[test]
    fn other_semaphores_are_not_the_address_space_lock() {
        let inode = names(
            "__schedule schedule rwsem_down_write_slowpath down_write ext4_buffered_write_iter \
             vfs_write ksys_write do_syscall_64",
        );
        assert_eq!(WaitKind::of(&inode), WaitKind::Other);
    }

    #[test]
    fn reclaim_anywhere_on_the_stack_wins() {
        // memcg reclaim waiting for writeback of a page it wants to free.
        let memcg = names(
            "__schedule schedule io_schedule folio_wait_bit_common shrink_folio_list \
             shrink_lruvec shrink_node try_to_free_mem_cgroup_pages try_charge_memcg \
             __mem_cgroup_charge do_anonymous_page handle_mm_fault do_user_addr_fault",
        );
        assert_eq!(WaitKind::of(&memcg), WaitKind::Reclaim);
        let high = names(
            "__schedule schedule schedule_timeout mem_cgroup_handle_over_high \
             resume_user_mode_work irqentry_exit_to_user_mode",
        );
        assert_eq!(WaitKind::of(&high), WaitKind::Reclaim);
        let compaction = names(
            "__schedule schedule io_schedule migrate_pages compact_zone \
             try_to_compact_pages __alloc_pages_direct_compact",
        );
        assert_eq!(WaitKind::of(&compaction), WaitKind::Reclaim);
    }

    #[test]
    fn the_innermost_wait_names_the_rest() {
        let swap_in = names(
            "__schedule schedule io_schedule folio_wait_bit_common __folio_lock_or_retry \
             do_swap_page handle_mm_fault do_user_addr_fault",
        );
        assert_eq!(WaitKind::of(&swap_in), WaitKind::PageIo);
        let futex =
            names("__schedule schedule futex_wait_queue futex_wait do_futex __x64_sys_futex");
        assert_eq!(WaitKind::of(&futex), WaitKind::Futex);
        assert_eq!(
            WaitKind::of(&names("__schedule schedule do_nanosleep hrtimer_nanosleep")),
            WaitKind::Other
        );
        assert_eq!(WaitKind::of(&[]), WaitKind::Unknown);
    }

    #[test]
    fn running_in_the_fault_path_is_a_page_fault() {
        // Sampled while zeroing a fresh page (a minor fault).
        let zeroing = names(
            "clear_page_erms folio_zero_user vma_alloc_anon_folio_pmd do_anonymous_page \
             __handle_mm_fault handle_mm_fault do_user_addr_fault exc_page_fault",
        );
        assert_eq!(WaitKind::of(&zeroing), WaitKind::PageFault);
        // Reclaim reached from a fault is reclaim.
        let scanning = names(
            "shrink_folio_list shrink_lruvec shrink_node try_to_free_mem_cgroup_pages \
             try_charge_memcg do_anonymous_page handle_mm_fault do_user_addr_fault",
        );
        assert_eq!(WaitKind::of(&scanning), WaitKind::Reclaim);
        // Charging the page to its memory cgroup is every fault's work;
        // only reclaiming from there is reclaim (seen: a control run with
        // no pressure had 2 samples there).
        let charging = names(
            "page_counter_try_charge try_charge_memcg __mem_cgroup_charge \
             do_anonymous_page handle_mm_fault do_user_addr_fault",
        );
        assert_eq!(WaitKind::of(&charging), WaitKind::PageFault);
        assert_eq!(
            WaitKind::of(&names("copy_user_generic _copy_to_user do_syscall_64")),
            WaitKind::Other
        );
    }

    #[test]
    fn the_breakdown_names_only_mmap_lock_and_reclaim() {
        let w = |tid, kind, ns| KernelWaitRecord {
            tid,
            thread: Sleeper::Laggard,
            phase: Phase::Stopping,
            kind,
            on_cpu: false,
            ns,
            count: 1,
            frames: Vec::new(),
        };
        let waits = [
            w(7, WaitKind::MmapLock, 5),
            w(7, WaitKind::Reclaim, 3),
            w(7, WaitKind::Futex, 100),
            w(7, WaitKind::Uprobe, 2),
            KernelWaitRecord {
                on_cpu: true,
                ..w(7, WaitKind::PageFault, 11)
            },
            // Asleep in a fault for no named reason: not named.
            w(7, WaitKind::PageFault, 13),
            w(8, WaitKind::MmapLock, 1_000),
        ];
        assert_eq!(
            NamedWaits::of(&waits, |w| w.tid == 7),
            NamedWaits {
                mmap_lock_ns: 5,
                reclaim_ns: 3,
                probe_ns: 2,
                fault_ns: 11,
            }
        );
    }

    #[test]
    fn a_laggards_main_kernel_kind_adds_asleep_and_running_and_skips_go_sleeps() {
        use crate::model::laggard::LaggardKernel;
        let w = |tid, kind, on_cpu, ns| KernelWaitRecord {
            tid,
            thread: Sleeper::Laggard,
            phase: Phase::Stopping,
            kind,
            on_cpu,
            ns,
            count: 1,
            frames: Vec::new(),
        };
        let waits = [
            w(7, WaitKind::Reclaim, false, 4),
            w(7, WaitKind::Reclaim, true, 3),
            w(7, WaitKind::PageFault, true, 6),
            w(7, WaitKind::Futex, false, 100),
            w(7, WaitKind::Unknown, false, 100),
            w(8, WaitKind::MmapLock, false, 1_000),
            // The stopping thread's, or after the world stopped: not the laggard's hold.
            KernelWaitRecord {
                thread: Sleeper::Stopping,
                ..w(7, WaitKind::MmapLock, false, 50)
            },
            KernelWaitRecord {
                phase: Phase::Stopped,
                ..w(7, WaitKind::MmapLock, false, 50)
            },
        ];
        assert_eq!(
            LaggardKernel::main_of(&waits, 7),
            Some(LaggardKernel {
                kind: WaitKind::Reclaim,
                ns: 7
            })
        );
        assert_eq!(LaggardKernel::main_of(&waits[3..5], 7), None);
    }
}
