//! Stop-the-world pauses: the per-process pause window the kernel keeps open
//! between `stopTheWorldWithSema` entry and a RET of `startTheWorldWithSema`,
//! and the event sent when it closes.

use crate::{assert_size, event::EventHeader};

/// Longest `m.preemptoff` text kept (Go 1.19/1.20 reasons are short phrases).
pub const REASON_TEXT_LEN: usize = 32;

/// `reason` value meaning "Go passed no reason code; see `reason_text`".
pub const REASON_FROM_TEXT: u32 = u32::MAX;

/// A pause window, kept per tgid in `PAUSE_WINDOWS` (kernel only; user
/// space deletes the entry when a process goes away). Open from
/// `stopTheWorldWithSema` entry to a RET of `startTheWorldWithSema`, then
/// kept closed (`stop_ts_ns` 0) for the next pause. Only traced processes
/// have one, so the RET probe's lookup doubles as the traced check.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PauseWindow {
    /// `bpf_ktime_get_ns()` at `stopTheWorldWithSema` entry.
    pub stop_ts_ns: u64,
    /// Thread that called `stopTheWorldWithSema`.
    pub stop_tid: u32,
    /// The `stwReason` (Go 1.21+), else `REASON_FROM_TEXT`.
    pub reason: u32,
    /// `PauseEvent::FLAG_*` bits known at entry.
    pub flags: u32,
    /// Bytes of `reason_text` that are the `m.preemptoff` string.
    pub reason_text_len: u32,
    /// `m.preemptoff` (Go 1.19/1.20), truncated to `REASON_TEXT_LEN`.
    pub reason_text: [u8; REASON_TEXT_LEN],
    /// Go's own stopping phase, read at `stopTheWorldWithSema`'s RET (Go
    /// 1.23+, with `PauseEvent::FLAG_STOPPING`): `w.startedStopping`,
    /// `w.finishedStopping`, `w.stoppingCPUTime`.
    pub stopping: GoStopping,
    /// The process's `GoOffsets::start_rsp_started_stopping`, copied at
    /// entry so the RET probe needs no `TRACED` lookup.
    pub start_rsp_started_stopping: u16,
    pub _pad: [u16; 3],
}
assert_size!(PauseWindow, 24 + REASON_TEXT_LEN + GoStopping::SIZE + 8);

/// The `worldStop` Go returns from `stopTheWorldWithSema` (Go 1.23+): its
/// stopping phase as Go times it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoStopping {
    /// `w.startedStopping` (`nanotime()` once `sched.lock` is held).
    pub started_ns: u64,
    /// `w.finishedStopping` (every P stopped).
    pub finished_ns: u64,
    /// `w.stoppingCPUTime`: the time every P spent stopped before the last
    /// one stopped, summed over Ps.
    pub cpu_ns: u64,
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
    /// `stopping` holds what `stopTheWorldWithSema` returned (its RET probe
    /// fired: Go 1.23+, when asked for).
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
