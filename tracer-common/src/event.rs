//! Events the kernel programs send to user space through the one `EVENTS`
//! ring buffer. Every event starts with an `EventHeader`; its `kind` says
//! which struct follows. One buffer keeps events of all kinds in the order
//! they were produced, which the correlator relies on.

use crate::assert_size;

/// What follows the header.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A stop-the-world pause ended (`pause::PauseEvent`).
    Pause = 1,
    /// A major page fault ended (`fault::FaultEvent`).
    Fault = 2,
    /// A goroutine stack grew (`stack::StackGrowthEvent`).
    StackGrowth = 3,
    /// What explains the pause whose `Pause` event follows
    /// (`explain::PauseDetail`).
    PauseDetail = 4,
}

impl EventKind {
    /// The kind of a raw header value, if known.
    pub const fn from_u32(v: u32) -> Option<EventKind> {
        match v {
            1 => Some(EventKind::Pause),
            2 => Some(EventKind::Fault),
            3 => Some(EventKind::StackGrowth),
            4 => Some(EventKind::PauseDetail),
            _ => None,
        }
    }
}

/// The common start of every event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// An `EventKind` value.
    pub kind: u32,
    /// Process (thread group) id.
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// CPU the event was produced on.
    pub cpu: u32,
    /// `bpf_ktime_get_ns()` when the event was produced (CLOCK_MONOTONIC, the
    /// clock Go's nanotime reads).
    pub ts_ns: u64,
}
assert_size!(EventHeader, 24);

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers, no padding (size asserted).
unsafe impl aya::Pod for EventHeader {}
