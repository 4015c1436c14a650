//! Reading the `EVENTS` ring buffer. The kernel programs submit without a
//! wake-up where they can (a wake-up from BPF context is expensive), so the
//! reader also drains on a short timer: events wait at most `POLL` in the
//! buffer.

use std::{os::fd::AsRawFd as _, time::Duration};

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

/// The longest an event waits in the ring buffer before it is read.
pub const POLL: Duration = Duration::from_millis(20);

/// Async reader over the ring buffer.
pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl EventReader {
    /// Wrap the `EVENTS` map taken from the loaded programs.
    pub fn new(ring: RingBuf<MapData>) -> std::io::Result<Self> {
        debug_assert!(ring.as_raw_fd() >= 0);
        // SAFETY: the RingBuf owns its map fd and keeps it open, unchanged,
        // for as long as it lives, and the AsyncFd owns the RingBuf.
        let ring = unsafe { AsyncFd::register(ring) }.map_err(std::io::Error::from)?;
        Ok(EventReader { ring })
    }

    /// Wait until events are signalled or `POLL` passes; then `drain`.
    pub async fn wait(&mut self) -> std::io::Result<()> {
        if let Ok(guard) = tokio::time::timeout(POLL, self.ring.readable_mut()).await {
            // Cleared before the drain that follows: a record submitted
            // after it signals again.
            guard?.clear_ready();
        }
        Ok(())
    }

    /// Hand every event already in the buffer to `f`, without waiting.
    pub fn drain(&mut self, f: impl FnMut(&[u8])) -> usize {
        drain(self.ring.get_mut(), f)
    }
}

fn drain(ring: &mut RingBuf<MapData>, mut f: impl FnMut(&[u8])) -> usize {
    let mut n = 0;
    while let Some(item) = ring.next() {
        f(&item);
        n += 1;
    }
    n
}
