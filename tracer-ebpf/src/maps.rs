//! Maps shared by every probe family, and the small helpers around them.

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use tracer_common::{
    counters::Counter,
    fault::FaultCounts,
    pause::PauseWindow,
    process::{Probe, ProbeHitKey, TracedProcess},
};

pub use tracer_common::process::MAX_TRACED;

/// Processes being traced, by tgid. Filled by user space before a process
/// can reach a probe; every probe checks it first.
#[map]
pub static TRACED: HashMap<u32, TracedProcess> =
    HashMap::with_max_entries(MAX_TRACED, BPF_F_NO_PREALLOC);

/// The pause window of each traced process, by tgid, inserted closed
/// (`PauseWindow::closed`) by user space when it traces the process and
/// deleted when the process goes away: open from `stopTheWorldWithSema`
/// entry to a RET of `startTheWorldWithSema`, then closed (`stop_ts_ns` 0)
/// for the next pause. A process stops the world at most once at a time
/// (`worldsema`), so one slot per tgid. Only traced processes have one, so
/// the lookup is the pause probes' traced check too. Not preallocated: see
/// `MAX_TRACED`.
#[map]
pub static PAUSE_WINDOWS: HashMap<u32, PauseWindow> =
    HashMap::with_max_entries(MAX_TRACED, BPF_F_NO_PREALLOC);

/// Size of the `EVENTS` ring buffer.
pub const EVENTS_BYTES: u32 = 4 * 1024 * 1024;

/// All events to user space.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// Size of the `PAUSE_EVENTS` ring buffer: a pause and its detail take at
/// most ~1.8 KB, so 1 MiB holds ~580 pauses between two reads (20 ms; the
/// agent's 100 ms), where a pause storm makes a few per millisecond.
pub const PAUSE_EVENTS_BYTES: u32 = 1024 * 1024;

/// Pause events and their details, apart from `EVENTS`: faults and stack
/// growth, however many, never take a pause's room.
#[map]
pub static PAUSE_EVENTS: RingBuf = RingBuf::with_byte_size(PAUSE_EVENTS_BYTES, 0);

/// Major faults per traced process (by tgid), counted before their event is
/// sent or shed: the totals stay exact under a fault storm. User space
/// inserts the entry when it traces the process and reads and deletes it
/// when the process goes.
#[map]
pub static FAULT_COUNTS: PerCpuHashMap<u32, FaultCounts> =
    PerCpuHashMap::with_max_entries(MAX_TRACED, BPF_F_NO_PREALLOC);

/// Flags of every `EVENTS` submit: no wake-up. Waking the reader from BPF
/// context costs ~19 us per event in these VMs (measured in
/// `stw_start_ret`); user space reads the buffer on a timer instead
/// (`events::READ_PERIOD`, 20 ms; the agent drains every 100 ms).
pub const SUBMIT_FLAGS: u64 = BPF_RB_NO_WAKEUP as u64;

/// Health counters (drops, failed reads), per CPU so they never contend.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::LEN, 0);

/// Hits per (process, probe): what the probes saw, independently of whether
/// an event made it to user space. Per CPU, so no atomics are needed. The
/// two most frequent count where their probe looks anyway (one cold map
/// lookup less): `Probe::StopTheWorld` in `PauseWindow::entries`,
/// `Probe::CpuSample` in `TracedProcess::cpu_samples`.
#[map]
pub static PROBE_HITS: PerCpuHashMap<ProbeHitKey, u64> = PerCpuHashMap::with_max_entries(16384, 0);

/// The traced-process entry of the current thread's process, if traced.
#[inline(always)]
pub fn traced(tgid: u32) -> Option<&'static TracedProcess> {
    // SAFETY: entries are only inserted and removed by user space; a stale
    // read at worst attributes one event to a process being detached.
    unsafe { TRACED.get(tgid) }
}

/// Add one to the `cpu_samples` of process `tgid`'s entry, if traced;
/// the entry, for its offsets.
#[inline(always)]
pub fn traced_sample(tgid: u32) -> Option<&'static TracedProcess> {
    let p = TRACED.get_ptr_mut(tgid)?;
    // SAFETY: a valid map value; the BPF atomic add (two CPUs may sample
    // the same process at once).
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*p).cpu_samples, 1);
        Some(&*p)
    }
}

/// Add one to a health counter.
#[inline(always)]
pub fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot, and BPF programs do not migrate mid-run.
        unsafe { *slot = (*slot).wrapping_add(1) };
    }
}

/// Take one from `counter` on this CPU (wrapping: the sum over CPUs is
/// what counts; see `Counter::FaultReturnsPending`).
#[inline(always)]
pub fn uncount(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: as in `count`.
        unsafe { *slot = (*slot).wrapping_sub(1) };
    }
}

/// Count an event of one kind (`Counter::RingbufFull*`) that did not fit in
/// the ring buffer, in its kind's counter and in the total.
#[inline(always)]
pub fn ringbuf_full(kind: Counter) {
    count(Counter::RingbufFull);
    count(kind);
}

/// Count one hit of `probe` by process `tgid`.
#[inline(always)]
pub fn hit(tgid: u32, probe: Probe) {
    let key = ProbeHitKey {
        tgid,
        probe: probe as u32,
    };
    match PROBE_HITS.get_ptr_mut(key) {
        // SAFETY: this CPU's slot; BPF programs do not migrate mid-run.
        Some(n) => unsafe { *n += 1 },
        None => {
            if PROBE_HITS.insert(key, 1, 0).is_err() {
                count(Counter::MapFull);
            }
        }
    }
}
