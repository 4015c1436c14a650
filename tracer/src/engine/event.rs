//! Decoding the `EVENTS` ring buffer: raw bytes in, checked typed events
//! out, once for every consumer. Decoding never trusts the kernel's bytes to
//! be aligned or long enough.

use crate::model::losses::Losses;
use tracer_common::{
    event::{EventHeader, EventKind},
    explain::{KERNEL_WAITS, LAGGARDS, Laggard, PauseDetail},
    fault::FaultRecord,
    pause::PauseEvent,
    stack::StackGrowthEvent,
};

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

/// A `PauseDetail` as the kernel sends it: up to its last laggard in use
/// (`PauseDetail::sent_len`); the rest reads as zero. The length sent is
/// what counts: a laggard added on another CPU (the laggard sampler) after
/// the kernel took the length can raise `nlaggards` in the bytes copied, and
/// is not part of this pause's detail. A length that ends inside a laggard
/// is malformed.
fn decode_detail(raw: &[u8]) -> Result<PauseDetail, DecodeError> {
    let short = |need| DecodeError::TooShort {
        kind: Some(EventKind::PauseDetail),
        got: raw.len(),
        need,
    };
    if raw.len() < PauseDetail::LAGGARDS_AT {
        return Err(short(PauseDetail::LAGGARDS_AT));
    }
    let mut d = PauseDetail::ZERO;
    let len = raw.len().min(std::mem::size_of::<PauseDetail>());
    // SAFETY: `len` bytes fit in `d`, and PauseDetail is Pod (any bytes are
    // a valid value).
    unsafe { std::ptr::copy_nonoverlapping(raw.as_ptr(), (&raw mut d).cast::<u8>(), len) };
    let whole = (len - PauseDetail::LAGGARDS_AT) / std::mem::size_of::<Laggard>();
    if len < std::mem::size_of::<PauseDetail>() && len != PauseDetail::sent_len(whole) {
        return Err(short(PauseDetail::sent_len(whole + 1)));
    }
    d.nlaggards = d.nlaggards.min(whole.min(LAGGARDS) as u32);
    d.nwaits = d.nwaits.min(KERNEL_WAITS as u32);
    Ok(d)
}

/// A decoded kernel event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Pause(PauseEvent),
    Fault(FaultRecord),
    StackGrowth(StackGrowthEvent),
    /// Boxed: it is much larger than the others.
    PauseDetail(Box<PauseDetail>),
}

impl Event {
    /// Decode one raw ring-buffer record: the header once, then its body.
    pub fn decode(raw: &[u8]) -> Result<Event, DecodeError> {
        let (_, kind) = header(raw)?;
        Ok(match kind {
            EventKind::Pause => Event::Pause(decode(kind, raw)?),
            EventKind::Fault => Event::Fault(decode(kind, raw)?),
            EventKind::StackGrowth => Event::StackGrowth(decode(kind, raw)?),
            EventKind::PauseDetail => Event::PauseDetail(Box::new(decode_detail(raw)?)),
        })
    }

    /// The process the event belongs to.
    pub fn tgid(&self) -> u32 {
        match self {
            Event::Pause(e) => e.header.tgid,
            Event::Fault(e) => e.event.header.tgid,
            Event::StackGrowth(e) => e.header.tgid,
            Event::PauseDetail(e) => e.header.tgid,
        }
    }
}

impl DecodeError {
    /// Count this failed decode in `losses`.
    pub fn count_in(&self, losses: &mut Losses) {
        match self {
            DecodeError::UnknownKind(_) => losses.unknown_kind += 1,
            DecodeError::TooShort { .. } => losses.malformed += 1,
        }
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

    #[test]
    fn a_detail_is_sent_up_to_its_last_laggard() {
        let mut d = PauseDetail::ZERO;
        d.header.kind = EventKind::PauseDetail as u32;
        d.header.tgid = 42;
        d.nlaggards = 1;
        d.laggards[0].tid = 7;
        d.laggards[1].tid = 8; // not in use: not sent
        d.candidates[0].tid = 9; // kernel-side only
        // SAFETY: a plain value's bytes.
        let all = unsafe {
            std::slice::from_raw_parts(
                (&raw const d).cast::<u8>(),
                std::mem::size_of::<PauseDetail>(),
            )
        };
        let sent = &all[..PauseDetail::sent_len(1)];
        let Event::PauseDetail(got) = Event::decode(sent).unwrap() else {
            panic!("not a detail");
        };
        assert_eq!((got.header.tgid, got.laggards[0].tid), (42, 7));
        assert_eq!((got.laggards[1].tid, got.candidates[0].tid), (0, 0));
        // Ending inside a laggard: malformed.
        let cut = &all[..PauseDetail::sent_len(1) - 8];
        assert!(matches!(
            Event::decode(cut),
            Err(DecodeError::TooShort { .. })
        ));
        // A laggard counted after the kernel took the length (the sampler,
        // on another CPU): the length sent decides.
        d.nlaggards = 2;
        // SAFETY: as above.
        let raced = unsafe {
            std::slice::from_raw_parts((&raw const d).cast::<u8>(), PauseDetail::sent_len(1))
        };
        let Event::PauseDetail(got) = Event::decode(raced).unwrap() else {
            panic!("not a detail");
        };
        assert_eq!((got.nlaggards, got.laggards[1].tid), (1, 0));
        assert!(matches!(
            Event::decode(&all[..PauseDetail::LAGGARDS_AT - 1]),
            Err(DecodeError::TooShort { .. })
        ));
    }
}
