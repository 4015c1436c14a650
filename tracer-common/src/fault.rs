//! Major page faults of traced processes. Both kernel backends (kprobes, and
//! tracepoints + perf software events) send the same `FaultRecord`, so
//! decoding and correlation in user space are one code path.

use crate::{assert_size, event::EventHeader};

/// One major page fault, sent when it ends. `header.ts_ns` is the end,
/// `header.tid` the faulting thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultEvent {
    pub header: EventHeader,
    /// When the fault began on this thread (`bpf_ktime_get_ns`); 0 if the
    /// backend did not see the beginning (`FLAG_NO_BEGIN`).
    pub begin_ns: u64,
    /// Faulting address.
    pub address: u64,
    /// Instruction pointer of the faulting instruction (user, or kernel when
    /// `FLAG_KERNEL_MODE`), 0 when the backend cannot see it.
    pub ip: u64,
    /// Time the thread was blocked inside the fault.
    pub blocked_ns: u64,
    /// Part of `blocked_ns` spent waiting on I/O this thread issued itself.
    pub wait_own_ns: u64,
    /// Part of `blocked_ns` spent waiting on another thread's read (or on a
    /// page lock it holds).
    pub wait_other_ns: u64,
    /// Return addresses in `FaultRecord::user_stack`; negative: the
    /// kernel's error (no stack).
    pub user_stack_len: i32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Block I/O requests (tracepoint backend) or swap reads (kprobe backend)
    /// this thread issued during the fault.
    pub reads_issued: u32,
    /// Which backend produced the event (`Backend` value).
    pub backend: u32,
}
assert_size!(FaultEvent, 24 + 6 * 8 + 4 * 4);

/// Return addresses of a fault's user stack sent with it, innermost first:
/// as many as user space names (its frames stop at this many); deeper ones
/// are cut.
pub const FAULT_STACK_DEPTH: usize = 24;

/// A fault as the kernel sends it (`EventKind::Fault`): the event, then its
/// user stack. The stack travels in the record, not as an id into a stack
/// map: a map keeps every stack it was given (an agent's fills in time) and
/// refuses one whose hash bucket another holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultRecord {
    pub event: FaultEvent,
    /// The first `event.user_stack_len` entries; zeros after them.
    pub user_stack: [u64; FAULT_STACK_DEPTH],
}
assert_size!(FaultRecord, 88 + FAULT_STACK_DEPTH * 8);

impl FaultRecord {
    /// The user stack's return addresses (none when it could not be taken).
    pub fn stack(&self) -> &[u64] {
        let n = usize::try_from(self.event.user_stack_len).unwrap_or(0);
        &self.user_stack[..n.min(FAULT_STACK_DEPTH)]
    }
}

impl FaultEvent {
    /// The fault was served from a file (page cache miss): `filemap_fault`.
    pub const FLAG_FILE: u32 = 1 << 0;
    /// The fault read anonymous memory back from swap (`do_swap_page`).
    pub const FLAG_SWAP: u32 = 1 << 1;
    /// This thread issued the read itself (own I/O).
    pub const FLAG_OWN_IO: u32 = 1 << 2;
    /// The fault happened in kernel mode (e.g. `copy_from_user` in a syscall).
    pub const FLAG_KERNEL_MODE: u32 = 1 << 3;
    /// The beginning was not seen (tracing started mid-fault).
    pub const FLAG_NO_BEGIN: u32 = 1 << 4;
    /// The fault was retried (the mmap lock was dropped while waiting).
    pub const FLAG_RETRIED: u32 = 1 << 5;
}

/// The kernel backend that produced a `FaultEvent`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `exceptions:page_fault_*` + perf `PAGE_FAULTS_MAJ` + `sched:*` + `block:*`.
    Tracepoint = 1,
    /// kprobes on `do_swap_page`, `filemap_fault`, `swap_read_folio`, `__folio_lock_or_retry`.
    Kprobe = 2,
}

/// Per-thread state of a fault in progress, kept by the kernel programs
/// (key: tid). Defined here so both backends and the size check agree.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultState {
    pub begin_ns: u64,
    pub address: u64,
    pub ip: u64,
    /// When the thread went off CPU (tracepoint backend) or entered a page
    /// lock wait (kprobe backend) inside the fault; 0: not waiting.
    pub off_since_ns: u64,
    /// When it was woken up while off CPU (0: not yet).
    pub woken_ns: u64,
    pub blocked_ns: u64,
    pub wait_own_ns: u64,
    pub wait_other_ns: u64,
    pub flags: u32,
    pub reads_issued: u32,
    /// Whether the interval in progress counts as own wait (1) or other (0),
    /// decided when the thread went off CPU.
    pub off_own: u32,
    /// kprobe backend: the last attempt returned VM_FAULT_RETRY.
    pub retry_pending: u32,
    /// Tracepoint backend, explained processes: the kernel stack
    /// (`PAUSE_STACKS`) of the sleep in progress (`off_since_ns` set), so a
    /// stop that begins while the thread sleeps there can name the sleep.
    /// -1: none.
    pub sleep_stack_id: i32,
    pub _pad: u32,
}
assert_size!(FaultState, 8 * 8 + 6 * 4);

/// Kernel struct offsets the kprobe backend reads, from the kernel's BTF:
/// index 0 of the `FAULT_LAYOUT` array, written by user space when the
/// backend attaches. A zero field is unknown (no BTF), and what it serves is
/// skipped.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultLayout {
    /// `vm_fault.flags`: whether an attempt ran under the per-VMA lock.
    pub vmf_flags: u32,
    /// `task_struct.pending.signal` (the thread's own pending signals).
    pub task_pending_signal: u32,
    /// `task_struct.blocked`.
    pub task_blocked: u32,
    pub _pad: u32,
}
assert_size!(FaultLayout, 16);

/// The map holding the `FaultLayout`.
pub const FAULT_LAYOUT: &str = "FAULT_LAYOUT";

/// The beginning of the fault in progress on one CPU (tracepoint backend,
/// a per-CPU slot): written at every fault begin instead of a per-thread
/// hash entry, since a thread that does not leave the CPU inside its fault
/// (every minor fault, nearly) also ends it there. It is promoted into the
/// per-thread `FaultState` only when the thread switches out while still
/// inside the fault (it may wake up on another CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultBegin {
    /// The faulting thread; 0: no fault in progress on this CPU.
    pub tid: u32,
    /// `FaultEvent::FLAG_*` bits known so far.
    pub flags: u32,
    pub begin_ns: u64,
    pub address: u64,
    pub ip: u64,
    /// Block I/O requests this thread issued in the fault so far.
    pub reads_issued: u32,
    /// The last process seen traced on this CPU (0: none): its faults skip
    /// the `TRACED` lookup. Kept while the slot is free.
    pub traced_tgid: u32,
}
assert_size!(FaultBegin, 4 * 4 + 3 * 8);

/// Major faults of one process counted in the kernel, in or outside its
/// pauses: exact however many fault events had to be shed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultTally {
    pub faults: u64,
    /// With `FaultEvent::FLAG_SWAP`.
    pub swap_in: u64,
    /// With `FaultEvent::FLAG_FILE`.
    pub file_backed: u64,
    /// With neither (the backend could not tell).
    pub unknown_kind: u64,
    /// Begin to end, of the faults whose beginning was seen.
    pub fault_ns: u64,
    pub blocked_ns: u64,
    pub wait_own_ns: u64,
    pub wait_other_ns: u64,
}
assert_size!(FaultTally, 8 * 8);

impl FaultTally {
    /// Count one finished fault (`flags`: its `FaultEvent::FLAG_*` bits).
    pub fn add(&mut self, flags: u32, fault_ns: u64, state: &FaultState) {
        self.faults += 1;
        if flags & FaultEvent::FLAG_FILE != 0 {
            self.file_backed += 1;
        } else if flags & FaultEvent::FLAG_SWAP != 0 {
            self.swap_in += 1;
        } else {
            self.unknown_kind += 1;
        }
        self.fault_ns += fault_ns;
        self.blocked_ns += state.blocked_ns;
        self.wait_own_ns += state.wait_own_ns;
        self.wait_other_ns += state.wait_other_ns;
    }

    /// Add another tally (per-CPU values into one).
    pub fn merge(&mut self, o: &FaultTally) {
        self.faults += o.faults;
        self.swap_in += o.swap_in;
        self.file_backed += o.file_backed;
        self.unknown_kind += o.unknown_kind;
        self.fault_ns += o.fault_ns;
        self.blocked_ns += o.blocked_ns;
        self.wait_own_ns += o.wait_own_ns;
        self.wait_other_ns += o.wait_other_ns;
    }
}

/// The value of `FAULT_COUNTS` (per CPU, by tgid): every major fault that
/// ended in a traced process, counted before its event is sent or shed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Faults that began inside a pause (the open window or the last one).
    pub in_pause: FaultTally,
    pub outside: FaultTally,
    /// The part of `outside` whose events were not sent (ring buffer more
    /// than half full).
    pub shed: FaultTally,
}
assert_size!(FaultCounts, 3 * 64);

impl FaultCounts {
    /// Add another process count (per-CPU values into one).
    pub fn merge(&mut self, o: &FaultCounts) {
        self.in_pause.merge(&o.in_pause);
        self.outside.merge(&o.outside);
        self.shed.merge(&o.shed);
    }

    /// Every fault counted.
    pub fn all(&self) -> FaultTally {
        let mut t = self.in_pause;
        t.merge(&self.outside);
        t
    }
}

/// Names of the fault programs, by backend, so attach code and tests agree.
pub mod programs {
    /// Tracepoint backend: (program, tracepoint category, tracepoint name).
    pub const TRACEPOINTS: &[(&str, &str, &str)] = &[
        ("fault_tp_user", "exceptions", "page_fault_user"),
        ("fault_tp_kernel", "exceptions", "page_fault_kernel"),
        ("fault_tp_filemap", "filemap", "mm_filemap_fault"),
        ("fault_tp_bio_queue", "block", "block_bio_queue"),
        ("fault_tp_switch", "sched", "sched_switch"),
        ("fault_tp_wakeup", "sched", "sched_wakeup"),
    ];
    /// The backend's `sched_switch` program.
    pub const SWITCH: &str = "fault_tp_switch";
    /// The one tracepoint program the backend can do without:
    /// `filemap:mm_filemap_fault` is missing on older kernels (6.1 LTS has none);
    /// without it file-backed faults cannot be told from swap-ins.
    pub const OPTIONAL_TRACEPOINT: &str = "fault_tp_filemap";
    /// Tracepoint backend: the perf software event program (`PAGE_FAULTS_MAJ`).
    pub const MAJOR_FAULT_END: &str = "fault_perf_major";
    /// The tracepoint programs a fault begins at: x86's
    /// `exceptions:page_fault_*`. Kernels without them (arm64) begin faults
    /// at `FAULT_BEGIN_PERF` instead.
    pub const BEGIN_TRACEPOINTS: &[&str] = &["fault_tp_user", "fault_tp_kernel"];
    /// Tracepoint backend without `exceptions:*`: the perf software event
    /// program (`PAGE_FAULTS`) that begins a fault.
    pub const FAULT_BEGIN_PERF: &str = "fault_perf_begin";
    /// kprobe backend: (program, kernel functions tried in order, is return probe).
    pub const KPROBES: &[(&str, &[&str], bool)] = &[
        ("fault_kp_swap_entry", &["do_swap_page"], false),
        ("fault_kp_swap_ret", &["do_swap_page"], true),
        ("fault_kp_filemap_entry", &["filemap_fault"], false),
        ("fault_kp_filemap_ret", &["filemap_fault"], true),
        (
            "fault_kp_swap_read",
            &["swap_read_folio", "swap_readpage"],
            false,
        ),
        (
            "fault_kp_lock_entry",
            &["__folio_lock_or_retry", "__lock_page_or_retry"],
            false,
        ),
        (
            "fault_kp_lock_ret",
            &["__folio_lock_or_retry", "__lock_page_or_retry"],
            true,
        ),
    ];
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: #[repr(C)] plain integers with no implicit padding (sizes
    // asserted above), so any byte pattern is a valid value.
    unsafe impl aya::Pod for super::FaultEvent {}
    unsafe impl aya::Pod for super::FaultRecord {}
    unsafe impl aya::Pod for super::FaultState {}
    unsafe impl aya::Pod for super::FaultBegin {}
    unsafe impl aya::Pod for super::FaultCounts {}
    unsafe impl aya::Pod for super::FaultLayout {}
}
