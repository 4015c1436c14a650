//! Stop-the-world pauses: the per-process pause window the kernel keeps open
//! between `stopTheWorldWithSema` entry and a RET of `startTheWorldWithSema`,
//! and the event sent when it closes.

use crate::{assert_size, event::EventHeader};

/// Longest `m.preemptoff` text kept (Go 1.19/1.20 reasons are short phrases).
pub const REASON_TEXT_LEN: usize = 32;

/// `reason` value meaning "Go passed no reason code; see `reason_text`".
pub const REASON_FROM_TEXT: u32 = u32::MAX;

/// A pause window, kept per tgid in `PAUSE_WINDOWS` (user space inserts it
/// closed when it traces a process and deletes it when the process goes
/// away). Open from
/// `stopTheWorldWithSema` entry to a RET of `startTheWorldWithSema`, then
/// kept closed (`stop_ts_ns` 0) for the next pause. Only traced processes
/// have one, so the end probe's lookup doubles as the traced check.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PauseWindow {
    // The entry probe writes only the first 40 bytes of a value it finds
    // cold, the stopping probe the next 24: what they set comes first.
    /// `bpf_ktime_get_ns()` at `stopTheWorldWithSema` entry.
    pub stop_ts_ns: u64,
    /// `stopTheWorldWithSema` entries of the process (its
    /// `Probe::StopTheWorld` hits), counted here: no map of its own to look
    /// up in a probe that runs every few milliseconds, with cold caches.
    pub entries: u64,
    /// Thread that called `stopTheWorldWithSema`.
    pub stop_tid: u32,
    /// The `stwReason` (Go 1.21+), else `REASON_FROM_TEXT`.
    pub reason: u32,
    /// `PauseEvent::FLAG_*` bits known so far.
    pub flags: u32,
    /// Bytes of `reason_text` that are the `m.preemptoff` string.
    pub reason_text_len: u32,
    /// The process's `GoOffsets::start_rsp_started_stopping`, set by user
    /// space with the entry, so the end probe needs no `TRACED` lookup.
    pub start_rsp_started_stopping: u16,
    /// `PauseWindow::SETUP_*`: what user space set up for this process.
    pub setup: u16,
    /// The process's `GoOffsets::start_call_rsp_started_stopping`.
    pub start_call_rsp_started_stopping: u16,
    pub _pad: u16,
    /// Go's own stopping phase (Go 1.22+, with `PauseEvent::FLAG_STOPPING`):
    /// its length from the stopping probe, the rest filled in by the end
    /// probe of `startTheWorldWithSema`. Next to what the entry probe wrote,
    /// so the stopping probe finds it in cache.
    pub stopping: GoStopping,
    /// `m.preemptoff` (Go 1.19/1.20, with `PauseEvent::FLAG_REASON_TEXT`),
    /// truncated to `REASON_TEXT_LEN`.
    pub reason_text: [u8; REASON_TEXT_LEN],
    /// The last closed window (`bpf_ktime_get_ns` at its entry and end
    /// probes; 0 before the first): a fault that began inside it and ended
    /// after it is still a fault in a pause, and the fault programs must
    /// know that to keep its event.
    pub last_stop_ts_ns: u64,
    pub last_end_ts_ns: u64,
}
assert_size!(PauseWindow, 56 + REASON_TEXT_LEN + GoStopping::SIZE);

impl PauseWindow {
    /// The reason is `m.preemptoff` (Go 1.19/1.20): the entry probe reads
    /// the process's `TracedProcess` offsets for it.
    pub const SETUP_REASON_FROM_PREEMPTOFF: u16 = 1 << 0;
    /// The process's pauses are explained (`PAUSE_DETAILS` has its entry).
    pub const SETUP_EXPLAINED: u16 = 1 << 1;
    /// The end probe sits on `startTheWorldWithSema`'s calls of
    /// `timeHistogram.record` (RBX: Go's pause), not on its RETs (RAX: Go's
    /// `now`).
    pub const SETUP_END_AT_RECORD: u16 = 1 << 2;

    /// The closed window user space inserts when it traces a process: every
    /// traced process has one, so its pause probes do one lookup.
    pub fn closed(process: &crate::process::TracedProcess, explained: bool) -> PauseWindow {
        let mut setup = 0;
        if process.flags & crate::process::TracedProcess::FLAG_REASON_FROM_PREEMPTOFF != 0 {
            setup |= Self::SETUP_REASON_FROM_PREEMPTOFF;
        }
        if explained {
            setup |= Self::SETUP_EXPLAINED;
        }
        let at_call = process.offsets.start_call_rsp_started_stopping;
        if at_call != crate::process::GoOffsets::UNKNOWN {
            setup |= Self::SETUP_END_AT_RECORD;
        }
        PauseWindow {
            stop_ts_ns: 0,
            stop_tid: 0,
            reason: 0,
            flags: 0,
            reason_text_len: 0,
            reason_text: [0; REASON_TEXT_LEN],
            stopping: GoStopping::default(),
            start_rsp_started_stopping: process.offsets.start_rsp_started_stopping,
            setup,
            start_call_rsp_started_stopping: at_call,
            _pad: 0,
            entries: 0,
            last_stop_ts_ns: 0,
            last_end_ts_ns: 0,
        }
    }

    /// Whether a fault that began at `begin_ns` (kernel clock) began inside
    /// this process's open window or its last closed one.
    pub fn contains(&self, begin_ns: u64) -> bool {
        (self.stop_ts_ns != 0 && begin_ns >= self.stop_ts_ns)
            || (self.last_stop_ts_ns != 0
                && begin_ns >= self.last_stop_ts_ns
                && begin_ns <= self.last_end_ts_ns)
    }
}

/// A pause's stopping phase as Go times it (Go 1.22+): from
/// `startedStopping` (`nanotime()` once `sched.lock` is held) to
/// `finishedStopping` (every P stopped).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoStopping {
    /// `startedStopping`: the same word the RET probe of
    /// `startTheWorldWithSema` reads (`PauseEvent::go_started_ns`).
    pub started_ns: u64,
    /// `started_ns + stopping_ns`.
    pub finished_ns: u64,
    /// `finishedStopping - startedStopping`, what Go records in
    /// `/sched/pauses/stopping/*`: RBX at `stopTheWorldWithSema`'s call of
    /// `timeHistogram.record`.
    pub stopping_ns: u64,
}
assert_size!(GoStopping, GoStopping::SIZE);

impl GoStopping {
    /// Size in bytes.
    pub const SIZE: usize = 24;
}

/// One stop-the-world pause of one process (`EventKind::Pause`). The header's
/// `ts_ns`/`tid`/`cpu` are those of the `startTheWorldWithSema` RET probe.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PauseEvent {
    pub header: EventHeader,
    /// `bpf_ktime_get_ns()` at `stopTheWorldWithSema` entry.
    pub stop_ts_ns: u64,
    /// Go's `now` at the end of the pause (RAX at the RET: the value
    /// `startTheWorldWithSema` returns).
    pub go_now_ns: u64,
    /// Go's `w.startedStopping` (1.22+, read from the stack at the RET); valid
    /// only with `FLAG_GO_START`.
    pub go_started_ns: u64,
    /// Thread that stopped the world.
    pub stop_tid: u32,
    /// The `stwReason` code, or `REASON_FROM_TEXT`.
    pub reason: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Bytes of `reason_text` in use.
    pub reason_text_len: u32,
    /// `m.preemptoff` for Go 1.19/1.20 (the reason as text).
    pub reason_text: [u8; REASON_TEXT_LEN],
    /// Go's stopping phase; valid only with `FLAG_STOPPING`.
    pub stopping: GoStopping,
}
assert_size!(PauseEvent, 24 + 40 + REASON_TEXT_LEN + GoStopping::SIZE);

impl PauseEvent {
    /// `go_started_ns` holds Go's own start of the pause.
    pub const FLAG_GO_START: u32 = 1 << 0;
    /// The reason was read from `m.preemptoff` (Go 1.19/1.20).
    pub const FLAG_REASON_TEXT: u32 = 1 << 1;
    /// Reading the reason or Go's start from the process's memory failed.
    pub const FLAG_READ_FAILED: u32 = 1 << 2;
    /// `stopping` holds Go's stopping phase (the stopping probe fired, and
    /// Go's start was read: Go 1.22+, when asked for).
    pub const FLAG_STOPPING: u32 = 1 << 3;
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: #[repr(C)] integers and byte arrays, no implicit padding (sizes
    // asserted above), so any byte pattern is a valid value.
    unsafe impl aya::Pod for super::PauseWindow {}
    unsafe impl aya::Pod for super::PauseEvent {}
    unsafe impl aya::Pod for super::GoStopping {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_contains_faults_begun_in_it_or_in_the_last_one() {
        let mut w = PauseWindow::closed(&crate::process::TracedProcess::default(), false);
        assert!(!w.contains(5));
        w.stop_ts_ns = 100;
        assert!(w.contains(100) && w.contains(150));
        assert!(!w.contains(99));
        (w.last_stop_ts_ns, w.last_end_ts_ns, w.stop_ts_ns) = (100, 200, 0);
        assert!(w.contains(100) && w.contains(200));
        assert!(!w.contains(99) && !w.contains(201));
    }
}
