//! Reading the `EVENTS` ring buffer: raw bytes in, checked typed events out.
//! Decoding never trusts the kernel's bytes to be aligned or long enough.

use std::{os::fd::AsRawFd as _, time::Duration};

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;
use tracer_common::event::{EventHeader, EventKind};

/// Why an event could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("event of {got} bytes, {kind:?} needs {need}")]
    TooShort {
        kind: Option<EventKind>,
        got: usize,
        need: usize,
    },
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
}

/// Copy a `T` out of the front of `bytes` (length-checked, unaligned read).
pub fn read_pod<T: aya::Pod>(bytes: &[u8]) -> Result<T, DecodeError> {
    let need = std::mem::size_of::<T>();
    if bytes.len() < need {
        return Err(DecodeError::TooShort {
            kind: None,
            got: bytes.len(),
            need,
        });
    }
    // SAFETY: length checked above; T is Pod, so any bytes are a valid T.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// The header and kind of a raw event.
pub fn header(bytes: &[u8]) -> Result<(EventHeader, EventKind), DecodeError> {
    let h: EventHeader = read_pod(bytes)?;
    let kind = EventKind::from_u32(h.kind).ok_or(DecodeError::UnknownKind(h.kind))?;
    Ok((h, kind))
}

/// Decode a whole event of type `T` (which starts with an `EventHeader`).
pub fn decode<T: aya::Pod>(kind: EventKind, bytes: &[u8]) -> Result<T, DecodeError> {
    read_pod(bytes).map_err(|e| match e {
        DecodeError::TooShort { got, need, .. } => DecodeError::TooShort {
            kind: Some(kind),
            got,
            need,
        },
        other => other,
    })
}

/// How often `EventReader::read_batch` looks at the ring buffer even when it
/// is not woken: the kernel programs submit without waking the reader (a
/// wake-up from BPF context costs ~19 us per event in these VMs), so an
/// event waits at most this long.
pub const READ_PERIOD: Duration = Duration::from_millis(20);

/// Async reader over the ring buffer.
pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    /// Made at the first `read_batch`: callers that only `drain` need no
    /// timer driver in their runtime.
    timer: Option<tokio::time::Interval>,
}

impl EventReader {
    /// Wrap the `EVENTS` map taken from the loaded programs.
    pub fn new(ring: RingBuf<MapData>) -> std::io::Result<Self> {
        debug_assert!(ring.as_raw_fd() >= 0);
        // SAFETY: the RingBuf owns its map fd and keeps it open, unchanged,
        // for as long as it lives, and the AsyncFd owns the RingBuf.
        let ring = unsafe { AsyncFd::register(ring) }.map_err(std::io::Error::from)?;
        Ok(EventReader { ring, timer: None })
    }

    /// Wait until the buffer is readable or `READ_PERIOD` has passed, then
    /// hand each event in it to `f`. Returns how many were handled (maybe 0).
    pub async fn read_batch(&mut self, f: impl FnMut(&[u8])) -> std::io::Result<usize> {
        let timer = self.timer.get_or_insert_with(|| {
            let mut t = tokio::time::interval(READ_PERIOD);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        tokio::select! {
            guard = self.ring.readable_mut() => guard?.clear_ready(),
            _ = timer.tick() => {}
        }
        Ok(self.drain(f))
    }

    /// Hand every event already in the buffer to `f`, without waiting.
    pub fn drain(&mut self, mut f: impl FnMut(&[u8])) -> usize {
        let ring = self.ring.get_mut();
        let mut n = 0;
        while let Some(item) = ring.next() {
            f(&item);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_unknown_events_are_errors_not_panics() {
        assert!(matches!(
            header(&[0u8; 10]),
            Err(DecodeError::TooShort { .. })
        ));
        let mut b = [0u8; 24];
        b[0] = 99;
        assert_eq!(header(&b), Err(DecodeError::UnknownKind(99)));
        b[0] = EventKind::Pause as u8;
        b[4] = 7;
        let (h, k) = header(&b[..]).unwrap();
        assert_eq!((h.tgid, k), (7, EventKind::Pause));
    }

    #[test]
    fn unaligned_input_decodes() {
        let mut buf = [0u8; 25];
        buf[1] = EventKind::Fault as u8;
        let (_, k) = header(&buf[1..]).unwrap();
        assert_eq!(k, EventKind::Fault);
    }
}
