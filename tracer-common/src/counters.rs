//! Per-CPU health counters kept by the kernel programs: every drop and every
//! BPF-side failure is counted here and reported by user space, never lost
//! silently.

/// Index of a counter in the `COUNTERS` per-CPU array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// An event did not fit in the ring buffer (any kind; the
    /// `RingbufFull*` counters below split it by kind).
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
    /// A major fault's user stack could not be taken (`bpf_get_stack`).
    FaultStackFailed = 5,
    /// A major fault ended whose beginning was not seen.
    FaultNoBegin = 6,
    /// A pause event did not fit in the ring buffer (part of `RingbufFull`).
    RingbufFullPause = 7,
    /// A fault event did not fit in the ring buffer (part of `RingbufFull`).
    RingbufFullFault = 8,
    /// A stack-growth event did not fit in the ring buffer (part of
    /// `RingbufFull`).
    RingbufFullStackGrowth = 9,
    /// A stack-growth event not sent because the ring buffer was more than
    /// half full: that half is kept for pause and fault events. Its counts
    /// still reach the per-site map (`STACK_SITES`).
    StackGrowthShed = 10,
    /// A laggard's user stack could not be recorded (`bpf_get_stackid`).
    LaggardStackFailed = 11,
    /// A fault outside every pause whose event was not sent because the
    /// ring buffer was more than half full: that half is kept for faults
    /// inside pauses. It is still counted and timed in `FAULT_COUNTS`.
    FaultShed = 12,
    /// A pause's detail (its explanation) did not fit in the pause ring
    /// buffer: the pause is reported without it.
    RingbufFullDetail = 13,
    /// Calls of the kprobe backend's fault functions (`do_swap_page`,
    /// `filemap_fault`) by traced processes whose return was not seen:
    /// faults in progress when read (a few), or returns the kernel could not
    /// probe (its return-probe instances ran out). Entries add one, returns
    /// take one away, on whatever CPU: the sum over CPUs is what counts.
    FaultReturnsPending = 14,
    /// The kernel stack of a followed thread asleep or sampled in the kernel
    /// inside a pause could not be recorded (`bpf_get_stackid`): that time
    /// has no kind.
    KernelStackFailed = 15,
}

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; 16] = [
        Counter::RingbufFull,
        Counter::ReadUserFailed,
        Counter::MapFull,
        Counter::PauseUnmatched,
        Counter::PauseReopened,
        Counter::FaultStackFailed,
        Counter::FaultNoBegin,
        Counter::RingbufFullPause,
        Counter::RingbufFullFault,
        Counter::RingbufFullStackGrowth,
        Counter::StackGrowthShed,
        Counter::LaggardStackFailed,
        Counter::FaultShed,
        Counter::RingbufFullDetail,
        Counter::FaultReturnsPending,
        Counter::KernelStackFailed,
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
            Counter::RingbufFullPause => "ringbuf_full_pause",
            Counter::RingbufFullFault => "ringbuf_full_fault",
            Counter::RingbufFullStackGrowth => "ringbuf_full_stack_growth",
            Counter::StackGrowthShed => "stack_growth_shed",
            Counter::LaggardStackFailed => "laggard_stack_failed",
            Counter::FaultShed => "fault_shed",
            Counter::RingbufFullDetail => "ringbuf_full_detail",
            Counter::FaultReturnsPending => "fault_returns_pending",
            Counter::KernelStackFailed => "kernel_stack_failed",
        }
    }

    /// Whether the events it counts are missing from the report. Shed
    /// faults are not: the kernel counted them (`FAULT_COUNTS`), only their
    /// stacks were not sent. Pending returns are a gauge that includes the
    /// faults in progress, a sign of loss only when it grows.
    pub const fn is_loss(self) -> bool {
        !matches!(self, Counter::FaultShed | Counter::FaultReturnsPending)
    }

    /// The counter this one is a part of, if it only splits another one
    /// (a total over all counters must skip these).
    pub const fn part_of(self) -> Option<Counter> {
        match self {
            Counter::RingbufFullPause
            | Counter::RingbufFullFault
            | Counter::RingbufFullStackGrowth
            | Counter::RingbufFullDetail => Some(Counter::RingbufFull),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn all_is_in_index_order_with_unique_snake_case_names() {
        let mut names = HashSet::new();
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{c:?} out of order in Counter::ALL");
            let name = c.name();
            assert!(names.insert(name), "{name} used twice");
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{name} is not snake_case"
            );
        }
        for c in Counter::ALL {
            if let Some(whole) = c.part_of() {
                assert_eq!(whole.part_of(), None, "{c:?} is part of a part");
            }
        }
    }
}
