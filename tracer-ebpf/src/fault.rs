//! What both major-fault backends share: the per-thread state of a fault in
//! progress, and sending the finished fault with its user stack.

use core::ptr::addr_of_mut;

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_USER_STACK, BPF_RB_AVAIL_DATA},
    helpers::{bpf_get_stack, bpf_ktime_get_ns},
    macros::map,
    maps::LruHashMap,
};
use tracer_common::{
    counters::Counter,
    event::{EventHeader, EventKind},
    fault::{Backend, FAULT_STACK_DEPTH, FaultEvent, FaultRecord, FaultState},
};

use crate::maps::{
    EVENTS, EVENTS_BYTES, FAULT_COUNTS, PAUSE_WINDOWS, SUBMIT_FLAGS, count, ringbuf_full,
};

/// Unread bytes in `EVENTS` past which faults outside pauses are counted
/// (`FAULT_COUNTS`) but not sent: the other half is kept for the faults
/// inside pauses, whose stacks are what the report is about.
const OUTSIDE_MAX_UNREAD: u64 = EVENTS_BYTES as u64 / 2;

/// Faults in progress, by tid: every fault of the kprobe backend; for the
/// tracepoint backend only those a thread left the CPU in (see
/// `FaultBegin`). LRU: a thread that exits mid-fault, or whose last fault
/// was minor (the tracepoint backend sees only major ends), leaves an entry
/// that ages out instead of filling the map. Only threads of traced
/// processes are ever inserted, so a lookup here doubles as the traced check
/// where the tracepoint names a thread other than the current one.
#[map]
pub static FAULT_STATE: LruHashMap<u32, FaultState> = LruHashMap::with_max_entries(16384, 0);

/// Internal `FaultState::flags` bit (never sent): an attempt of this fault
/// returned VM_FAULT_MAJOR (kprobe backend).
pub const STATE_MAJOR_SEEN: u32 = 1 << 31;
/// Internal `FaultState::flags` bit: this fault's event was already sent
/// (kprobe backend, at its first VM_FAULT_RETRY).
pub const STATE_EMITTED: u32 = 1 << 30;
/// Internal `FaultState::flags` bit: the current attempt runs under the
/// per-VMA lock (kprobe backend).
pub const STATE_VMA_LOCK: u32 = 1 << 29;

/// `bpf_ktime_get_ns`.
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// The tgid and tid of the current thread.
#[inline(always)]
pub fn current_ids() -> (u32, u32) {
    let id = aya_ebpf::helpers::bpf_get_current_pid_tgid();
    ((id >> 32) as u32, id as u32)
}

/// Start a new fault on thread `tid` (replacing whatever was there; kprobe
/// backend).
#[inline(always)]
pub fn begin(tid: u32, address: u64, ip: u64, flags: u32) {
    let state = FaultState {
        begin_ns: now(),
        address,
        ip,
        flags,
        sleep_stack_id: -1,
        ..FaultState::default()
    };
    if FAULT_STATE.insert(tid, state, 0).is_err() {
        count(Counter::MapFull);
    }
}

/// The fault in progress on `tid`, if any.
#[inline(always)]
pub fn state_mut(tid: u32) -> Option<&'static mut FaultState> {
    // SAFETY: a pointer into the map's value; only this thread's programs
    // and wakeups of it touch the entry, and a torn update at worst skews one
    // fault's wait split.
    FAULT_STATE.get_ptr_mut(tid).map(|p| unsafe { &mut *p })
}

/// Close an off-CPU interval at `end`, charging it to own or other wait.
#[inline(always)]
pub fn close_blocked(state: &mut FaultState, end: u64) {
    if state.off_since_ns == 0 {
        return;
    }
    let d = end.saturating_sub(state.off_since_ns);
    state.blocked_ns += d;
    if state.off_own != 0 {
        state.wait_own_ns += d;
    } else {
        state.wait_other_ns += d;
    }
    state.off_since_ns = 0;
}

/// Whether a fault that began at `begin` (0: not seen; then its `end`)
/// began inside a pause of process `tgid` (its open or last window).
#[inline(always)]
fn in_pause(tgid: u32, begin: u64, end: u64) -> bool {
    let at = if begin != 0 { begin } else { end };
    // SAFETY: a read of this process's window; a torn read at worst files
    // one fault on the wrong side of a pause edge.
    unsafe { PAUSE_WINDOWS.get(tgid) }.is_some_and(|w| w.contains(at))
}

/// Send the finished fault of the current thread (its state, or none if the
/// beginning was not seen), with the user stack, taken into the record.
/// Counted first; a fault outside pauses is shed while `EVENTS` is more
/// than half full.
#[inline(always)]
pub fn emit<C: EbpfContext>(
    ctx: &C,
    tgid: u32,
    tid: u32,
    state: Option<&FaultState>,
    address: u64,
    backend: Backend,
) {
    let end = now();
    let none = FaultState::default();
    let s = state.unwrap_or(&none);
    let fault_ns = if s.begin_ns != 0 {
        end.saturating_sub(s.begin_ns)
    } else {
        0
    };
    let in_pause = in_pause(tgid, s.begin_ns, end);
    let shed = !in_pause && EVENTS.query(BPF_RB_AVAIL_DATA as u64) > OUTSIDE_MAX_UNREAD;
    if let Some(c) = FAULT_COUNTS.get_ptr_mut(tgid) {
        // SAFETY: this CPU's value; BPF programs do not migrate mid-run.
        let c = unsafe { &mut *c };
        if in_pause {
            c.in_pause.add(s.flags, fault_ns, s);
        } else {
            c.outside.add(s.flags, fault_ns, s);
            if shed {
                c.shed.add(s.flags, fault_ns, s);
            }
        }
    }
    if shed {
        count(Counter::FaultShed);
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<FaultRecord>(0) else {
        ringbuf_full(Counter::RingbufFullFault);
        return;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points at the reserved record, `user_stack` is its
    // last field and `bpf_get_stack` writes at most its size (zeroing what
    // the stack does not fill, or all of it on an error).
    let taken = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            addr_of_mut!((*record).user_stack).cast(),
            (FAULT_STACK_DEPTH * 8) as u32,
            BPF_F_USER_STACK as u64,
        )
    };
    let user_stack_len = if taken < 0 {
        count(Counter::FaultStackFailed);
        taken as i32
    } else {
        (taken / 8) as i32
    };
    let header = EventHeader {
        kind: EventKind::Fault as u32,
        tgid,
        tid,
        // SAFETY: no preconditions.
        cpu: unsafe { aya_ebpf::helpers::bpf_get_smp_processor_id() },
        ts_ns: end,
    };
    let event = match state {
        Some(s) => FaultEvent {
            header,
            begin_ns: s.begin_ns,
            address: if s.address != 0 { s.address } else { address },
            ip: s.ip,
            blocked_ns: s.blocked_ns,
            wait_own_ns: s.wait_own_ns,
            wait_other_ns: s.wait_other_ns,
            user_stack_len,
            flags: s.flags & !(STATE_MAJOR_SEEN | STATE_EMITTED | STATE_VMA_LOCK),
            reads_issued: s.reads_issued,
            backend: backend as u32,
        },
        None => {
            count(Counter::FaultNoBegin);
            FaultEvent {
                header,
                address,
                user_stack_len,
                flags: FaultEvent::FLAG_NO_BEGIN,
                backend: backend as u32,
                ..FaultEvent::default()
            }
        }
    };
    // SAFETY: as above; the event is the record's first field.
    unsafe { addr_of_mut!((*record).event).write(event) };
    entry.submit(SUBMIT_FLAGS);
}
