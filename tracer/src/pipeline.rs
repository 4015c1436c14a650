//! The user-side pipeline: raw ring-buffer bytes in, typed records out.
//! `Pipeline::feed` decodes the common header, dispatches on `EventKind` to
//! the correlator of that kind, and returns the record it produced (for the
//! live output). Undecodable events and kinds nobody handles are counted, not
//! fatal.
//!
//! Adding an event kind: a correlator field on `Pipeline` (pure code over the
//! decoded struct, like `PauseTracker`), a match arm in `feed`, and a variant
//! of `Record` (its serde tag is the JSON `type`).

use serde::Serialize;
use tracer_common::{event::EventKind, pause::PauseEvent};

use crate::{
    events::{self, DecodeError},
    faults::{FaultTracer, PauseWindow},
    pauses::{PauseRecord, PauseTracker, WallClock},
    stackgrowth::StackGrowthAggregator,
};

/// What the pipeline produces, one per handled event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    Pause(PauseRecord),
}

/// Events the pipeline saw but could not use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PipelineStats {
    /// Events decoded and handled.
    pub handled: u64,
    /// Header or body shorter than its kind needs.
    pub malformed: u64,
    /// A `kind` value this gostw does not know (a newer kernel object).
    pub unknown_kind: u64,
    /// A known kind with no correlator in this pipeline.
    pub unhandled: u64,
}

impl PipelineStats {
    /// Events that reached user space but produced no record.
    pub fn lost(&self) -> u64 {
        self.malformed + self.unknown_kind + self.unhandled
    }
}

/// Decoding, dispatch, and the correlators of every event kind.
pub struct Pipeline {
    pub pauses: PauseTracker,
    /// Major faults, when traced: each pause record gets the faults already
    /// in that fall in it, and becomes a window of the fault summary.
    pub faults: Option<FaultTracer>,
    /// Stack-growth events, when traced.
    pub stacks: Option<StackGrowthAggregator>,
    pub stats: PipelineStats,
}

/// How many of each process's longest pauses the summary lists.
pub const WORST_KEPT: usize = 5;

impl Pipeline {
    /// A pipeline that prints times with `clock`.
    pub fn new(clock: WallClock) -> Pipeline {
        Pipeline {
            pauses: PauseTracker::new(clock, WORST_KEPT),
            faults: None,
            stacks: None,
            stats: PipelineStats::default(),
        }
    }

    /// Handle one raw event from the ring buffer.
    pub fn feed(&mut self, raw: &[u8]) -> Option<Record> {
        let kind = match events::header(raw) {
            Ok((_, kind)) => kind,
            Err(DecodeError::UnknownKind(_)) => {
                self.stats.unknown_kind += 1;
                return None;
            }
            Err(DecodeError::TooShort { .. }) => {
                self.stats.malformed += 1;
                return None;
            }
        };
        let record = match kind {
            EventKind::Pause => match events::decode::<PauseEvent>(kind, raw) {
                Ok(ev) => {
                    let faults = &mut self.faults;
                    Record::Pause(self.pauses.on_event_with(&ev, |rec| {
                        // A fault that begins in the pause ends before the
                        // world restarts (the stopper cannot restart it from
                        // inside a fault; other threads are stopped), and
                        // its event is reserved in the ring buffer before
                        // this pause event: it is already in.
                        if let Some(t) = faults {
                            let w = PauseWindow::from(&*rec);
                            rec.faults = Some(t.pause_faults(&w));
                            t.add_window(w);
                        }
                    }))
                }
                Err(e) => {
                    log::debug!("{e}");
                    self.stats.malformed += 1;
                    return None;
                }
            },
            EventKind::Fault => {
                match &mut self.faults {
                    Some(t) => {
                        let errors = t.decode_errors;
                        t.handle_event(raw);
                        if t.decode_errors > errors {
                            self.stats.malformed += 1;
                        } else {
                            self.stats.handled += 1;
                        }
                    }
                    None => self.stats.unhandled += 1,
                }
                // Faults are reported with their pause and in the summary.
                return None;
            }
            EventKind::StackGrowth => {
                match self.stacks.as_mut().map(|a| a.add_event_bytes(raw)) {
                    Some(Ok(_)) => self.stats.handled += 1,
                    Some(Err(e)) => {
                        log::debug!("{e}");
                        self.stats.malformed += 1;
                    }
                    None => self.stats.unhandled += 1,
                }
                return None;
            }
        };
        self.stats.handled += 1;
        Some(record)
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{
        event::EventHeader,
        pause::{PauseEvent, REASON_TEXT_LEN},
    };

    use super::*;

    fn bytes<T: aya::Pod>(v: &T) -> Vec<u8> {
        // SAFETY: T is Pod: plain bytes, no padding.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    fn pause(pid: u32) -> PauseEvent {
        PauseEvent {
            header: EventHeader {
                kind: EventKind::Pause as u32,
                tgid: pid,
                tid: pid,
                cpu: 0,
                ts_ns: 300,
            },
            stop_ts_ns: 100,
            go_now_ns: 250,
            go_started_ns: 110,
            stop_tid: pid,
            reason: 2,
            flags: PauseEvent::FLAG_GO_START,
            reason_text_len: 0,
            reason_text: [0; REASON_TEXT_LEN],
        }
    }

    #[test]
    fn pause_events_become_records() {
        let mut p = Pipeline::new(WallClock::default());
        let Some(Record::Pause(r)) = p.feed(&bytes(&pause(42))) else {
            panic!("no record");
        };
        assert_eq!((r.pid, r.duration_ns), (42, 140));
        assert_eq!(p.pauses.process(42).unwrap().count(), 1);
        assert_eq!(p.stats.handled, 1);
    }

    #[test]
    fn bad_events_are_counted_not_fatal() {
        let mut p = Pipeline::new(WallClock::default());
        let ev = bytes(&pause(1));
        assert_eq!(p.feed(&ev[..30]), None);
        let mut unknown = ev.clone();
        unknown[0] = 77;
        assert_eq!(p.feed(&unknown), None);
        let mut fault = ev.clone();
        fault[0] = EventKind::Fault as u8;
        assert_eq!(p.feed(&fault), None);
        assert_eq!(p.feed(&[1, 2, 3]), None);
        assert_eq!(
            p.stats,
            PipelineStats {
                handled: 0,
                malformed: 2,
                unknown_kind: 1,
                unhandled: 1
            }
        );
        assert_eq!(p.stats.lost(), 4);
        assert!(p.feed(&ev).is_some());
    }

    #[test]
    fn stack_growth_events_reach_the_aggregator() {
        use tracer_common::stack::StackGrowthEvent;
        let mut p = Pipeline::new(WallClock::default());
        p.stacks = Some(StackGrowthAggregator::new(crate::stackgrowth::Mode::Exact));
        let mut ev: StackGrowthEvent = unsafe { std::mem::zeroed() };
        ev.header.kind = EventKind::StackGrowth as u32;
        ev.header.tgid = 7;
        assert_eq!(p.feed(&bytes(&ev)), None);
        assert_eq!(p.stats.handled, 1);
        assert_eq!(p.feed(&bytes(&ev)[..20]), None);
        assert_eq!(p.stats.malformed, 1);
    }

    #[test]
    fn records_serialize_with_their_type() {
        let mut p = Pipeline::new(WallClock::default());
        let rec = p.feed(&bytes(&pause(5))).unwrap();
        let v: serde_json::Value = serde_json::to_value(&rec).unwrap();
        assert_eq!(v["type"], "pause");
        assert_eq!(v["reason"], "gc_sweep_termination");
        assert_eq!(v["duration_ns"], 140);
        assert_eq!(v["duration_source"], "go");
    }
}
