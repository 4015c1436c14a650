//! What explains a pause beyond its duration, gathered by the kernel while
//! the window is open and sent as one `PauseDetail` event just before the
//! pause's own `PauseEvent` (same ring buffer, so in that order): the
//! goroutine stack that asked for the stop (the caller).
//!
//! The value lives in `PAUSE_DETAILS`, one per traced process, inserted by
//! user space when the process is traced (its presence is the "explain
//! this process" switch) and reset by the `stopTheWorldWithSema` entry probe.

use crate::{assert_size, event::EventHeader};

/// Return addresses kept of the stopping goroutine's stack.
pub const CALLER_FRAMES: usize = 16;

/// The explanation of one pause (`EventKind::PauseDetail`). `header.ts_ns`
/// is when it was sent (the RET of `startTheWorldWithSema`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PauseDetail {
    pub header: EventHeader,
    /// The pause's `PauseWindow::stop_ts_ns`, to pair it with its event.
    pub stop_ts_ns: u64,
    /// The thread that stopped the world.
    pub stop_tid: u32,
    /// Return addresses in `caller` (0: not read).
    pub caller_len: u32,
    /// The user goroutine's stack when it asked for the stop, innermost
    /// first: all return addresses (the first is the call of
    /// `systemstack` in e.g. `runtime.stopTheWorld`, then its callers by
    /// the saved frame pointers).
    pub caller: [u64; CALLER_FRAMES],
}
assert_size!(PauseDetail, 24 + 16 + 8 * CALLER_FRAMES);

impl PauseDetail {
    /// A zeroed value, what user space inserts for a newly traced process.
    pub const ZERO: PauseDetail = PauseDetail {
        header: EventHeader {
            kind: 0,
            tgid: 0,
            tid: 0,
            cpu: 0,
            ts_ns: 0,
        },
        stop_ts_ns: 0,
        stop_tid: 0,
        caller_len: 0,
        caller: [0; CALLER_FRAMES],
    };
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: #[repr(C)] plain integers with no implicit padding (sizes
    // asserted above), so any byte pattern is a valid value.
    unsafe impl aya::Pod for super::PauseDetail {}
}
