//! `--timeline FILE`: the observed stream as a trace-event timeline
//! (`formats::timeline`), written as it comes. Per traced process: a track
//! of its stop-the-world pauses (complete events named by Go's wording of
//! the reason, args = the pause record as `--json` prints it, faults and
//! all), a track per thread with its major faults as slices (instants when
//! the backend did not see the fault begin) and its stack growths as
//! instants. Times are CLOCK_MONOTONIC, as in the records.

use std::io::{self, Write};

use serde_json::{Value, json};
use tracer_common::stack::{StackChange, StackGrowthEvent};

use super::Sink;
use crate::{
    formats::timeline::{TimelineWriter, Track},
    model::{
        code::Code,
        fault::{Fault, FaultKind, frame_label},
        observed::{Membership, Observed},
    },
    units::fmt_stack_size,
};

/// The timeline sink.
pub struct TimelineSink {
    writer: Option<TimelineWriter<Box<dyn Write>>>,
    error: Option<io::Error>,
    pauses: u64,
}

impl TimelineSink {
    /// A timeline written to `out` (buffer it: events are small writes).
    pub fn new(out: Box<dyn Write>) -> io::Result<TimelineSink> {
        let mut w = TimelineWriter::new(out)?;
        w.other_data(
            "producer",
            json!(concat!("gostw ", env!("CARGO_PKG_VERSION"))),
        );
        let args: Vec<String> = std::env::args().collect();
        w.other_data("command", json!(args.join(" ")));
        Ok(TimelineSink {
            writer: Some(w),
            error: None,
            pauses: 0,
        })
    }

    /// Pause events written so far.
    pub fn pauses(&self) -> u64 {
        self.pauses
    }

    /// Close the JSON (after the engine's `finish`); the first write error,
    /// if any.
    pub fn finish(mut self) -> io::Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        match self.writer.take() {
            Some(w) => w.finish().map(drop),
            None => Ok(()),
        }
    }

    /// Run `write` on the writer; the first error stops the timeline.
    fn write(&mut self, write: impl FnOnce(&mut TimelineWriter<Box<dyn Write>>) -> io::Result<()>) {
        if let Some(w) = &mut self.writer
            && let Err(e) = write(w)
        {
            self.error = Some(e);
            self.writer = None;
        }
    }

    fn fault(&mut self, f: &Fault, in_pause: bool) {
        let backing = match f.kind {
            FaultKind::SwapIn => "swap",
            FaultKind::FileBacked => "file",
            FaultKind::Unknown => "unknown",
        };
        let name = format!("major fault ({backing})");
        let args = json!({
            "address": format!("{:#x}", f.address),
            "fault_ns": f.duration_ns(),
            "blocked_ns": f.blocked_ns,
            "wait_own_ns": f.wait_own_ns,
            "wait_other_ns": f.wait_other_ns,
            "in_pause": in_pause,
            "site": f.site(),
            "stack": f.stack.iter().map(frame_label).collect::<Vec<_>>(),
        });
        let track = Track::thread(f.tgid, f.tid);
        self.write(|w| {
            w.thread(f.tgid, f.tid, &thread_name(f.tgid, f.tid))?;
            if f.begin_ns == 0 {
                w.instant(track, "fault", &name, f.end_ns, &args)
            } else {
                w.slice(track, "fault", &name, f.begin_ns, f.duration_ns(), &args)
            }
        });
    }

    fn growth(&mut self, ev: &StackGrowthEvent, code: &Code) {
        let (pid, tid) = (ev.header.tgid, ev.header.tid);
        let frame = |pc: u64| {
            code.return_frames(pc)
                .first()
                .map_or_else(|| format!("{pc:#x}"), ToString::to_string)
        };
        let name = if ev.change == StackChange::Grow as u8 {
            format!(
                "stack growth {} -> {}",
                fmt_stack_size(ev.old_size),
                fmt_stack_size(ev.new_size)
            )
        } else {
            format!("stack copy ({} stack)", fmt_stack_size(ev.old_size))
        };
        let args = json!({
            "function": frame(ev.frames[0]),
            "caller": frame(ev.frames[1]),
            "goid": ev.goid,
            "old_stack_bytes": ev.old_size,
            "new_stack_bytes": (ev.new_size != 0).then_some(ev.new_size),
            "used_bytes": ev.used,
        });
        self.write(|w| {
            w.thread(pid, tid, &thread_name(pid, tid))?;
            w.instant(
                Track::thread(pid, tid),
                "stack",
                &name,
                ev.header.ts_ns,
                &args,
            )
        });
    }
}

fn thread_name(pid: u32, tid: u32) -> String {
    if pid == tid {
        format!("thread {tid} (main)")
    } else {
        format!("thread {tid}")
    }
}

impl Sink for TimelineSink {
    fn observe(&mut self, o: &Observed) {
        match o {
            Observed::Started(info) => {
                let name = format!(
                    "{} (pid {}, {})",
                    info.labels.executable, info.pid, info.go_version
                );
                self.write(|w| w.process(info.pid, &name));
            }
            Observed::Pause(p) => {
                let r = &p.record;
                let args = serde_json::to_value(r).unwrap_or(Value::Null);
                self.pauses += 1;
                self.write(|w| {
                    w.pause(
                        r.pid,
                        r.stw_reason().name(),
                        r.start_mono_ns,
                        r.duration_ns,
                        &args,
                    )
                });
                for f in &p.faults {
                    self.fault(f, true);
                }
            }
            Observed::Fault(f, m) => self.fault(f, *m == Membership::LateInPause),
            Observed::StackGrowth { event, code } => self.growth(event, code),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        model::observed::ObservedPause, model::pause::tests_support::record,
        sink::tests_support::Captured,
    };

    fn fault(tid: u32, begin: u64) -> Fault {
        Fault {
            tgid: 7,
            tid,
            begin_ns: begin,
            end_ns: 5_000_000,
            address: 0xc000_1000,
            kind: FaultKind::SwapIn,
            blocked_ns: 10,
            wait_own_ns: 10,
            wait_other_ns: 0,
            stack: Arc::from(Vec::new()),
            pcs: Arc::from([]),
        }
    }

    #[test]
    fn one_complete_event_per_pause_with_the_record_as_args() {
        let out = Captured::default();
        let mut t = TimelineSink::new(Box::new(out.clone())).unwrap();
        let info = crate::model::observed::tests_support::api_process(7, "");
        let mut r = record(7, 1_000_123, 2_345_678);
        r.tid = 8;
        t.observe_all(&[
            Observed::Started(info),
            Observed::Pause(Box::new(ObservedPause {
                record: r.clone(),
                faults: vec![fault(8, 1_500_000)],
            })),
            Observed::Fault(fault(9, 0), Membership::Outside),
            Observed::Pause(Box::new(ObservedPause {
                record: record(7, 9_000_000, 1_000),
                faults: Vec::new(),
            })),
        ]);
        assert_eq!(t.pauses(), 2);
        t.finish().unwrap();
        let v: Value = serde_json::from_slice(&out.0.lock().unwrap()).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let pauses: Vec<&Value> = events.iter().filter(|e| e["cat"] == "pause").collect();
        assert_eq!(pauses.len(), 2);
        assert_eq!(pauses[0]["ph"], "X");
        assert_eq!(pauses[0]["name"], "GC sweep termination");
        assert_eq!(pauses[0]["ts"], 1000.123);
        assert_eq!(pauses[0]["dur"], 2345.678);
        assert_eq!(pauses[0]["args"], serde_json::to_value(&r).unwrap());
        let faults: Vec<&Value> = events.iter().filter(|e| e["cat"] == "fault").collect();
        assert_eq!(faults.len(), 2);
        assert_eq!(
            (faults[0]["ph"].as_str(), faults[0]["tid"].as_u64()),
            (Some("X"), Some(8))
        );
        assert_eq!(faults[0]["args"]["in_pause"], true);
        // No begin seen: an instant at its end.
        assert_eq!(
            (
                faults[1]["ph"].as_str(),
                faults[1]["args"]["in_pause"].as_bool()
            ),
            (Some("i"), Some(false))
        );
        assert_eq!(v["otherData"]["clock"], "CLOCK_MONOTONIC");
    }

    #[test]
    fn a_write_error_is_reported_at_the_end() {
        /// Takes `0` more bytes, then fails.
        struct Full(usize);
        impl Write for Full {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                if b.len() > self.0 {
                    return Err(io::Error::other("disk full"));
                }
                self.0 -= b.len();
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut t = TimelineSink::new(Box::new(Full(20))).unwrap();
        for i in 0..3 {
            t.observe(&Observed::Pause(Box::new(ObservedPause {
                record: record(7, 1_000 * (i + 1), 10),
                faults: Vec::new(),
            })));
        }
        let err = t.finish().unwrap_err();
        assert_eq!(err.to_string(), "disk full");
    }
}
