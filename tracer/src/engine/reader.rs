//! Reading the two ring buffers: `PAUSE_EVENTS` (pauses and their details)
//! and `EVENTS` (faults and stack growth). Pauses have a ring of their own so
//! that no storm of faults takes their room. The kernel programs submit
//! without a wake-up where they can (a wake-up from BPF context is
//! expensive), so the reader also drains on a short timer: events wait at
//! most `POLL` in the buffers.

use std::{os::fd::AsRawFd as _, time::Duration};

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

/// The longest an event waits in a ring buffer before it is read.
pub const POLL: Duration = Duration::from_millis(20);

/// Async reader over both ring buffers.
pub struct EventReader {
    pauses: AsyncFd<RingBuf<MapData>>,
    events: AsyncFd<RingBuf<MapData>>,
}

impl EventReader {
    /// Wrap the `PAUSE_EVENTS` and `EVENTS` maps taken from the loaded
    /// programs.
    pub fn new(pauses: RingBuf<MapData>, events: RingBuf<MapData>) -> std::io::Result<Self> {
        debug_assert!(pauses.as_raw_fd() >= 0 && events.as_raw_fd() >= 0);
        // SAFETY: each RingBuf owns its map fd and keeps it open, unchanged,
        // for as long as it lives, and its AsyncFd owns the RingBuf.
        let pauses = unsafe { AsyncFd::register(pauses) }.map_err(std::io::Error::from)?;
        // SAFETY: as above.
        let events = unsafe { AsyncFd::register(events) }.map_err(std::io::Error::from)?;
        Ok(EventReader { pauses, events })
    }

    /// Wait until events are signalled in either buffer or `POLL` passes;
    /// then `drain`.
    pub async fn wait(&mut self) -> std::io::Result<()> {
        let EventReader { pauses, events } = self;
        let either = async {
            tokio::select! {
                g = pauses.readable_mut() => g.map(|mut g| g.clear_ready()),
                g = events.readable_mut() => g.map(|mut g| g.clear_ready()),
            }
        };
        // Cleared before the drain that follows: a record submitted after it
        // signals again.
        if let Ok(r) = tokio::time::timeout(POLL, either).await {
            r?;
        }
        Ok(())
    }

    /// Hand every record already in the buffers to `f`, without waiting:
    /// pauses first (a pause's faults may arrive before or after it; the
    /// correlator takes either order).
    pub fn drain(&mut self, mut f: impl FnMut(&[u8])) -> usize {
        self.drain_pauses(usize::MAX, &mut f) + self.drain_events(usize::MAX, &mut f)
    }

    /// At most `limit` records of the pause buffer (`drain` in parts: under
    /// a storm the kernel fills the buffers as fast as they are read, and a
    /// drain that chased it would hold every decoded record until it caught
    /// up).
    pub fn drain_pauses(&mut self, limit: usize, mut f: impl FnMut(&[u8])) -> usize {
        drain(self.pauses.get_mut(), limit, &mut f)
    }

    /// At most `limit` records of the fault and stack-growth buffer.
    pub fn drain_events(&mut self, limit: usize, mut f: impl FnMut(&[u8])) -> usize {
        drain(self.events.get_mut(), limit, &mut f)
    }
}

/// A record's `EventHeader::ts_ns` (0 if it is too short to have one).
pub fn record_ts_ns(raw: &[u8]) -> u64 {
    raw.get(16..24)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

fn drain(ring: &mut RingBuf<MapData>, limit: usize, f: &mut impl FnMut(&[u8])) -> usize {
    let mut n = 0;
    while n < limit
        && let Some(item) = ring.next()
    {
        f(&item);
        n += 1;
    }
    n
}
