//! Kernel events into observations: the agent's end of the ring buffer.
//! Pause events become `PauseRecord`s through the same `pauses::record` the
//! attach/run pipeline uses, then `Observer::pause`; stack growth samples
//! become `Observer::stack_growth`. Stateless per process on
//! purpose: the attach/run pipeline keeps HDR histograms per pid for its
//! summary, which a weeks-long agent cannot afford; the agent's distributions
//! are the Prometheus histograms.

use tracer_common::{event::EventKind, pause::PauseEvent, stack::StackGrowthEvent};

use super::{
    faults::FaultStage,
    metrics::Metrics,
    observe::{Observer, PauseObservation, StackGrowthObservation},
};
use crate::{
    events::{self, DecodeError},
    pauses::{self, WallClock},
};

/// Decodes raw events and hands them to an `Observer`.
pub struct EventStage {
    clock: WallClock,
    /// Fault events and the pauses they fall in (None: no fault backend).
    pub faults: Option<FaultStage>,
}

impl Default for EventStage {
    fn default() -> Self {
        EventStage {
            clock: WallClock::now(),
            faults: None,
        }
    }
}

impl EventStage {
    /// One raw event from the ring buffer.
    pub fn handle(&mut self, raw: &[u8], observer: &mut impl Observer, metrics: &Metrics) {
        let kind = match events::header(raw) {
            Ok((_, kind)) => kind,
            Err(DecodeError::UnknownKind(_) | DecodeError::TooShort { .. }) => {
                metrics.events_lost("undecodable", 1);
                return;
            }
        };
        match kind {
            EventKind::Pause => match events::decode::<PauseEvent>(kind, raw) {
                Ok(ev) => {
                    let rec = pauses::record(&ev, self.clock);
                    match self.faults.as_mut() {
                        // Held until the faults inside it are known.
                        Some(f) => f.pause(&rec, observer),
                        None => observer.pause(
                            rec.pid,
                            &PauseObservation {
                                reason: rec.reason,
                                duration_ns: rec.duration_ns,
                                major_faults: 0,
                            },
                        ),
                    }
                }
                Err(_) => metrics.events_lost("undecodable", 1),
            },
            EventKind::StackGrowth => match events::decode::<StackGrowthEvent>(kind, raw) {
                Ok(ev) => observer.stack_growth(
                    ev.header.tgid,
                    &StackGrowthObservation {
                        old_size: ev.old_size,
                        live_bytes: ev.used,
                    },
                ),
                Err(_) => metrics.events_lost("undecodable", 1),
            },
            EventKind::Fault => match self.faults.as_mut() {
                Some(f) => f.fault(raw, observer, metrics),
                None => metrics.events_lost("unhandled", 1),
            },
        }
    }

    /// After a drain: export the pauses and faults time has settled.
    pub fn settle(&mut self, observer: &mut impl Observer) {
        if let Some(f) = self.faults.as_mut() {
            f.settle(observer);
        }
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{
        event::EventHeader,
        pause::REASON_TEXT_LEN,
        stack::{STACK_FRAMES, StackChange, StackSource},
    };

    use super::*;
    use crate::agent::observe::FaultObservation;

    #[derive(Default)]
    struct Seen(
        Vec<(u32, PauseObservation)>,
        Vec<(u32, StackGrowthObservation)>,
    );

    impl Observer for Seen {
        fn pause(&mut self, pid: u32, p: &PauseObservation) {
            self.0.push((pid, *p));
        }
        fn fault(&mut self, _: u32, _: &FaultObservation) {}
        fn stack_growth(&mut self, pid: u32, g: &StackGrowthObservation) {
            self.1.push((pid, *g));
        }
        fn stop_the_world_entries(&mut self, _: u32, _: u64) {}
    }

    fn bytes<T: aya::Pod>(v: &T) -> Vec<u8> {
        // SAFETY: T is Pod: plain bytes, no padding.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    #[test]
    fn pause_events_reach_the_observer_bad_ones_are_counted() {
        let ev = PauseEvent {
            header: EventHeader {
                kind: EventKind::Pause as u32,
                tgid: 42,
                tid: 43,
                cpu: 0,
                ts_ns: 300_000,
            },
            stop_ts_ns: 100_000,
            go_now_ns: 250_000,
            go_started_ns: 110_000,
            stop_tid: 43,
            reason: 1,
            flags: PauseEvent::FLAG_GO_START,
            reason_text_len: 0,
            reason_text: [0; REASON_TEXT_LEN],
        };
        let mut stage = EventStage::default();
        let metrics = Metrics::new();
        let mut seen = Seen::default();
        stage.handle(&bytes(&ev), &mut seen, &metrics);
        stage.handle(&bytes(&ev)[..40], &mut seen, &metrics);
        stage.handle(&[7u8; 24], &mut seen, &metrics);
        let mut fault = bytes(&ev);
        fault[0] = EventKind::Fault as u8;
        stage.handle(&fault, &mut seen, &metrics);
        assert_eq!(seen.0.len(), 1);
        assert_eq!(seen.0[0].0, 42);
        assert_eq!(seen.0[0].1.reason, "gc_mark_termination");
        assert_eq!(seen.0[0].1.duration_ns, 140_000);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, metrics.registry()).unwrap();
        assert!(
            text.contains("gostw_agent_events_lost_total{stage=\"undecodable\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("gostw_agent_events_lost_total{stage=\"unhandled\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn stack_growth_samples_reach_the_observer() {
        let ev = StackGrowthEvent {
            header: EventHeader {
                kind: EventKind::StackGrowth as u32,
                tgid: 42,
                tid: 44,
                cpu: 1,
                ts_ns: 1,
            },
            source: StackSource::Sampled as u8,
            change: StackChange::Copying as u8,
            _pad: 0,
            nframes: 2,
            goid: 9,
            old_size: 2048,
            new_size: 0,
            used: 700,
            frames: [0; STACK_FRAMES],
        };
        let metrics = Metrics::new();
        let mut seen = Seen::default();
        EventStage::default().handle(&bytes(&ev), &mut seen, &metrics);
        EventStage::default().handle(&bytes(&ev)[..60], &mut seen, &metrics);
        assert_eq!(
            seen.1,
            [(
                42,
                StackGrowthObservation {
                    old_size: 2048,
                    live_bytes: 700
                }
            )]
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, metrics.registry()).unwrap();
        assert!(
            text.contains("gostw_agent_events_lost_total{stage=\"undecodable\"} 1"),
            "{text}"
        );
    }
}
