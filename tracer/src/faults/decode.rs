//! From raw ring-buffer bytes to `Fault`s: checked decoding (shared by both
//! backends) and symbolized user stacks read from `FAULT_STACKS`.

use std::sync::Arc;

use aya::maps::{MapData, StackTraceMap};
use tracer_common::{
    event::EventKind,
    fault::{Backend, FaultEvent},
};

use super::{
    correlate::{Fault, FaultKind},
    symbols::StackSymbolizer,
};
use crate::events::{self, DecodeError};

/// Decode the bytes of one `EventKind::Fault` event.
pub fn decode_fault(bytes: &[u8]) -> Result<FaultEvent, DecodeError> {
    events::decode::<FaultEvent>(EventKind::Fault, bytes)
}

/// The backend name of an event's `backend` field.
pub fn backend_name(v: u32) -> &'static str {
    match v {
        x if x == Backend::Tracepoint as u32 => "tracepoint",
        x if x == Backend::Kprobe as u32 => "kprobe",
        _ => "unknown",
    }
}

/// A `Fault` from its event and its (already symbolized) stack.
/// `file_faults_seen`: the backend marks every file-backed fault, so an
/// unmarked one is a swap-in (false when `filemap:mm_filemap_fault` is
/// missing).
pub fn fault_from_event(ev: &FaultEvent, stack: Arc<[String]>, file_faults_seen: bool) -> Fault {
    let kind = if ev.flags & FaultEvent::FLAG_FILE != 0 {
        FaultKind::FileBacked
    } else if ev.flags & FaultEvent::FLAG_SWAP != 0 || file_faults_seen {
        // A major fault that is not a file read is anonymous memory (or shmem)
        // read back from swap.
        FaultKind::SwapIn
    } else {
        FaultKind::Unknown
    };
    Fault {
        tgid: ev.header.tgid,
        tid: ev.header.tid,
        begin_ns: ev.begin_ns,
        end_ns: ev.header.ts_ns,
        address: ev.address,
        kind,
        blocked_ns: ev.blocked_ns,
        wait_own_ns: ev.wait_own_ns,
        wait_other_ns: ev.wait_other_ns,
        stack,
    }
}

/// Decodes fault events and symbolizes their stacks from the kernel's
/// `FAULT_STACKS` map.
pub struct FaultDecoder {
    stacks: Option<StackTraceMap<MapData>>,
    pub symbolizer: StackSymbolizer,
    /// See `fault_from_event`.
    pub file_faults_seen: bool,
}

impl FaultDecoder {
    /// `stacks` is the `FAULT_STACKS` map (None: no stacks, e.g. in tests).
    pub fn new(stacks: Option<StackTraceMap<MapData>>) -> Self {
        FaultDecoder {
            stacks,
            symbolizer: StackSymbolizer::default(),
            file_faults_seen: true,
        }
    }

    /// Decode and symbolize one raw fault event.
    pub fn decode(&mut self, bytes: &[u8]) -> Result<Fault, DecodeError> {
        let ev = decode_fault(bytes)?;
        let stacks = &self.stacks;
        let stack = self
            .symbolizer
            .stack(ev.header.tgid, ev.user_stack_id, || match stacks {
                Some(map) => map
                    .get(&(ev.user_stack_id as u32), 0)
                    .map(|t| t.frames().iter().map(|f| f.ip).collect())
                    .unwrap_or_default(),
                None => Vec::new(),
            });
        Ok(fault_from_event(&ev, stack, self.file_faults_seen))
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::event::EventHeader;

    use super::*;

    fn bytes_of(ev: &FaultEvent) -> Vec<u8> {
        // SAFETY: FaultEvent is Pod (no padding), so its bytes are initialized.
        unsafe {
            std::slice::from_raw_parts(
                (ev as *const FaultEvent).cast::<u8>(),
                size_of::<FaultEvent>(),
            )
        }
        .to_vec()
    }

    fn event(backend: Backend, flags: u32) -> FaultEvent {
        FaultEvent {
            header: EventHeader {
                kind: EventKind::Fault as u32,
                tgid: 7,
                tid: 8,
                cpu: 1,
                ts_ns: 5_000,
            },
            begin_ns: 1_000,
            address: 0xc000_0000,
            ip: 0x401000,
            blocked_ns: 3_000,
            wait_own_ns: 1_000,
            wait_other_ns: 2_000,
            user_stack_id: -14,
            flags,
            reads_issued: 1,
            backend: backend as u32,
        }
    }

    #[test]
    fn both_backends_decode_through_one_path() {
        for (backend, flags, kind) in [
            (
                Backend::Tracepoint,
                FaultEvent::FLAG_OWN_IO,
                FaultKind::SwapIn,
            ),
            (Backend::Kprobe, FaultEvent::FLAG_SWAP, FaultKind::SwapIn),
            (
                Backend::Tracepoint,
                FaultEvent::FLAG_FILE,
                FaultKind::FileBacked,
            ),
            (
                Backend::Kprobe,
                FaultEvent::FLAG_FILE,
                FaultKind::FileBacked,
            ),
        ] {
            let ev = event(backend, flags);
            let mut d = FaultDecoder::new(None);
            // Unaligned on purpose.
            let mut buf = vec![0u8];
            buf.extend(bytes_of(&ev));
            let f = d.decode(&buf[1..]).unwrap();
            assert_eq!(decode_fault(&buf[1..]).unwrap(), ev);
            assert_eq!(f.kind, kind);
            assert_eq!((f.tgid, f.tid, f.begin_ns, f.end_ns), (7, 8, 1_000, 5_000));
            assert_eq!(f.duration_ns(), 4_000);
            assert_eq!(f.blocked_ns, f.wait_own_ns + f.wait_other_ns);
            assert!(f.stack.is_empty(), "negative stack id means no stack");
            assert_ne!(backend_name(ev.backend), "unknown");
        }
    }

    #[test]
    fn kind_is_unknown_without_the_filemap_tracepoint() {
        let mut ev = event(Backend::Tracepoint, 0);
        let none: Arc<[String]> = Arc::from(Vec::new());
        assert_eq!(
            fault_from_event(&ev, none.clone(), false).kind,
            FaultKind::Unknown
        );
        assert_eq!(
            fault_from_event(&ev, none.clone(), true).kind,
            FaultKind::SwapIn
        );
        ev.flags = FaultEvent::FLAG_SWAP;
        assert_eq!(fault_from_event(&ev, none, false).kind, FaultKind::SwapIn);
    }

    #[test]
    fn short_event_is_an_error() {
        let ev = event(Backend::Tracepoint, 0);
        let b = bytes_of(&ev);
        assert!(matches!(
            decode_fault(&b[..b.len() - 1]),
            Err(DecodeError::TooShort {
                kind: Some(EventKind::Fault),
                ..
            })
        ));
    }
}
