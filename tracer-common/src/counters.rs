//! Per-CPU health counters kept by the kernel programs: every drop and every
//! BPF-side failure is counted here and reported by user space, never lost
//! silently.

/// Index of a counter in the `COUNTERS` per-CPU array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// An event did not fit in the ring buffer.
    RingbufFull = 0,
    /// A read of the traced process's memory failed (`bpf_probe_read_user`).
    ReadUserFailed = 1,
    /// A per-thread or per-process map was full.
    MapFull = 2,
    /// A `startTheWorldWithSema` RET with no open pause window (tracing began
    /// inside a pause).
    PauseUnmatched = 3,
    /// A `stopTheWorldWithSema` entry while that process's window was still
    /// open (the earlier window is lost).
    PauseReopened = 4,
    /// A major fault's user stack could not be recorded (`bpf_get_stackid`).
    FaultStackFailed = 5,
    /// A major fault ended whose beginning was not seen.
    FaultNoBegin = 6,
}

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; 7] = [
        Counter::RingbufFull,
        Counter::ReadUserFailed,
        Counter::MapFull,
        Counter::PauseUnmatched,
        Counter::PauseReopened,
        Counter::FaultStackFailed,
        Counter::FaultNoBegin,
    ];
    /// Number of slots in the `COUNTERS` array.
    pub const LEN: u32 = Self::ALL.len() as u32;

    /// A stable name for reports and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::RingbufFull => "ringbuf_full",
            Counter::ReadUserFailed => "read_user_failed",
            Counter::MapFull => "map_full",
            Counter::PauseUnmatched => "pause_unmatched",
            Counter::PauseReopened => "pause_reopened",
            Counter::FaultStackFailed => "fault_stack_failed",
            Counter::FaultNoBegin => "fault_no_begin",
        }
    }
}
