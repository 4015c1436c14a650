//! Stop-the-world pauses, from kernel events to records: the reason table and
//! the duration Go itself counts. Pure code over decoded events (no kernel
//! needed to test it).

use serde::Serialize;
use tracer_common::pause::{PauseEvent, REASON_FROM_TEXT};

use crate::clock::WallClock;

/// A Go `stwReason` (the table is the same in Go 1.21-1.27).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StwReason(pub u32);

/// (stable identifier, Go's own wording) by `stwReason` value.
const REASONS: &[(&str, &str)] = &[
    ("unknown", "unknown"),
    ("gc_mark_termination", "GC mark termination"),
    ("gc_sweep_termination", "GC sweep termination"),
    ("write_heap_dump", "write heap dump"),
    ("goroutine_profile", "goroutine profile"),
    ("goroutine_profile_cleanup", "goroutine profile cleanup"),
    ("all_goroutines_stack_trace", "all goroutines stack trace"),
    ("read_mem_stats", "read mem stats"),
    ("all_threads_syscall", "AllThreadsSyscall"),
    ("gomaxprocs", "GOMAXPROCS"),
    ("start_trace", "start trace"),
    ("stop_trace", "stop trace"),
    ("test_count_pages_in_use", "CountPagesInUse (test)"),
    ("test_read_metrics_slow", "ReadMetricsSlow (test)"),
    ("test_read_mem_stats_slow", "ReadMemStatsSlow (test)"),
    (
        "test_page_cache_pages_leaked",
        "PageCachePagesLeaked (test)",
    ),
    ("test_reset_debug_log", "ResetDebugLog (test)"),
];

/// Go 1.19/1.20 `m.preemptoff` texts and the `stwReason` they became in 1.21.
const PREEMPTOFF_TEXTS: &[(&str, u32)] = &[
    ("", 2), // gcStart stops the world without setting preemptoff
    ("gcing", 1),
    ("write heap dump", 3),
    ("profile", 4),
    ("profile cleanup", 5),
    ("stack trace", 6),
    ("read mem stats", 7),
    ("doAllThreadsSyscall", 8),
    ("GOMAXPROCS", 9),
    ("start tracing", 10),
    ("stop tracing", 11),
    ("CountPagesInUse", 12),
    ("ReadMetricsSlow", 13),
    ("ReadMemStatsSlow", 14),
    ("PageCachePagesLeaked", 15),
    ("ResetDebugLog", 16),
];

impl StwReason {
    pub const UNKNOWN: StwReason = StwReason(0);
    pub const GC_MARK_TERMINATION: StwReason = StwReason(1);
    pub const GC_SWEEP_TERMINATION: StwReason = StwReason(2);
    pub const READ_MEM_STATS: StwReason = StwReason(7);
    pub const GOMAXPROCS: StwReason = StwReason(9);

    /// The reason a Go 1.19/1.20 `m.preemptoff` text stands for.
    pub fn from_preemptoff(text: &str) -> StwReason {
        PREEMPTOFF_TEXTS
            .iter()
            .find(|(t, _)| *t == text)
            .map_or(StwReason::UNKNOWN, |&(_, code)| StwReason(code))
    }

    /// Stable snake_case identifier (JSON, metrics).
    pub fn id(self) -> &'static str {
        REASONS.get(self.0 as usize).map_or("unknown", |r| r.0)
    }

    /// Go's own wording.
    pub fn name(self) -> &'static str {
        REASONS.get(self.0 as usize).map_or("unknown", |r| r.1)
    }

    /// GC pauses, as Go's `stwReason.isGC` (runtime/metrics `.../gc:seconds`).
    pub fn is_gc(self) -> bool {
        self == Self::GC_MARK_TERMINATION || self == Self::GC_SWEEP_TERMINATION
    }
}

/// Where a pause's `duration_ns` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DurationSource {
    /// Go's own `now - w.startedStopping` (Go 1.22+): equal to what the
    /// runtime adds to its metrics and `MemStats.PauseTotalNs`.
    Go,
    /// From the entry probe of `stopTheWorldWithSema` to Go's `now` at the
    /// end (Go 1.19-1.21, which keep their start time where no probe reaches).
    Probe,
}

/// One stop-the-world pause of one process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PauseRecord {
    pub pid: u32,
    /// The thread that stopped the world.
    pub tid: u32,
    pub reason_code: u32,
    /// `StwReason::id`.
    pub reason: &'static str,
    /// The `m.preemptoff` text the reason came from (Go 1.19/1.20 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_text: Option<String>,
    /// When the world began to stop, CLOCK_MONOTONIC (Go's nanotime).
    pub start_mono_ns: u64,
    /// The same instant as Unix time.
    pub start_unix_ns: u64,
    /// The pause as Go counts it where possible, see `duration_source`.
    pub duration_ns: u64,
    pub duration_source: DurationSource,
    /// Go's own number (`now - w.startedStopping`), Go 1.22+.
    pub go_duration_ns: Option<u64>,
    /// From the entry probe of `stopTheWorldWithSema` to the end probe of
    /// `startTheWorldWithSema` (includes both probes' own latency).
    pub window_ns: u64,
    /// Go's stopping phase (`finishedStopping - startedStopping`, Go 1.22+,
    /// read where `stopTheWorldWithSema` records it); the rest of `duration_ns` is
    /// the world stopped. `None` where the version has no such figure or
    /// the probe is off.
    pub stopping_ns: Option<u64>,
    /// The stack of the goroutine that asked for the stop, innermost first
    /// (`engine::caller`), when pauses are explained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caller: Option<Vec<crate::image::Frame>>,
    /// The threads that kept the world from stopping, longest first
    /// (`engine::explain`), when pauses are explained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub laggards: Option<Vec<super::laggard::LaggardRecord>>,
    /// Where in the kernel the stopping thread (any phase) and the laggards
    /// (while stopping) slept, longest first, when pauses are explained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_waits: Option<Vec<super::kernel_wait::KernelWaitRecord>>,
    /// Time in the kernel not in `kernel_waits`: the kernel keeps 8 of them
    /// a pause (absent when none was left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_waits_dropped_ns: Option<u64>,
    /// Page faults the stopping thread began inside the pause, minor and
    /// major (the tracepoint fault backend; 0 with the kprobe backend),
    /// when pauses are explained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopper_page_faults: Option<u32>,
    /// The pause's duration in named parts (`engine::breakdown`), where the
    /// stopping phase and the scheduler data are known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<Box<super::breakdown::Breakdown>>,
    /// From the stopping thread's first hand-back of a P to the end of the
    /// pause (other threads run again in it), when seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restarting_ns: Option<u64>,
    /// Major faults inside the pause, when faults are traced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<super::fault::PauseFaultStats>,
    /// What the kernel gathered to explain the pause, until the correlator
    /// releases it (`explain::complete`).
    #[serde(skip)]
    pub explain_input: Option<Box<super::laggard::ExplainInput>>,
}

/// What makes a pause slow, for every output that keeps or prints only
/// slow ones (`--slow-pause`: attach and run's lines, the agent's records,
/// its exemplars and its OTLP log records, `gostw pauses`): at least this
/// long. Zero takes every pause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowThreshold {
    min_ns: u64,
}

impl SlowThreshold {
    /// Every pause is slow.
    pub const ALL: SlowThreshold = SlowThreshold { min_ns: 0 };
    /// No pause is slow (an output that prints no pause line).
    pub const NONE: SlowThreshold = SlowThreshold { min_ns: u64::MAX };

    pub fn at_least(min: std::time::Duration) -> SlowThreshold {
        SlowThreshold::from_ns(u64::try_from(min.as_nanos()).unwrap_or(u64::MAX))
    }

    pub const fn from_ns(min_ns: u64) -> SlowThreshold {
        SlowThreshold { min_ns }
    }

    /// Whether a pause of `duration_ns` is slow.
    pub fn is_slow(self, duration_ns: u64) -> bool {
        self != SlowThreshold::NONE && duration_ns >= self.min_ns
    }

    /// The bound, in ns.
    pub fn min_ns(self) -> u64 {
        self.min_ns
    }
}

impl PauseRecord {
    /// The reason, typed.
    pub fn stw_reason(&self) -> StwReason {
        StwReason(self.reason_code)
    }
}

/// Turn a kernel `PauseEvent` into a record.
pub fn record(ev: &PauseEvent, clock: WallClock) -> PauseRecord {
    let text = (ev.flags & PauseEvent::FLAG_REASON_TEXT != 0).then(|| {
        let n = (ev.reason_text_len as usize).min(ev.reason_text.len());
        String::from_utf8_lossy(&ev.reason_text[..n]).into_owned()
    });
    let reason = if ev.reason == REASON_FROM_TEXT {
        match (&text, ev.flags & PauseEvent::FLAG_READ_FAILED != 0) {
            (Some(t), false) => StwReason::from_preemptoff(t),
            _ => StwReason::UNKNOWN,
        }
    } else {
        StwReason(ev.reason)
    };
    let window_ns = ev.header.ts_ns.saturating_sub(ev.stop_ts_ns);
    let go_duration_ns = (ev.flags & PauseEvent::FLAG_GO_START != 0)
        .then(|| ev.go_now_ns.checked_sub(ev.go_started_ns))
        .flatten()
        // A start after our entry probe or an end after our end probe is not
        // a time Go took for this pause: the stack slot was not what we expect.
        .filter(|_| ev.go_started_ns >= ev.stop_ts_ns && ev.go_now_ns <= ev.header.ts_ns);
    let stopping_ns = stopping_ns(ev);
    let (duration_ns, duration_source, start_mono_ns) = match go_duration_ns {
        Some(d) => (d, DurationSource::Go, ev.go_started_ns),
        None => {
            // Go's `now` closes the pause if it is plausible, else our end probe.
            let end = if (ev.stop_ts_ns..=ev.header.ts_ns).contains(&ev.go_now_ns) {
                ev.go_now_ns
            } else {
                ev.header.ts_ns
            };
            (
                end.saturating_sub(ev.stop_ts_ns),
                DurationSource::Probe,
                ev.stop_ts_ns,
            )
        }
    };
    PauseRecord {
        pid: ev.header.tgid,
        tid: ev.stop_tid,
        reason_code: reason.0,
        reason: reason.id(),
        reason_text: text,
        start_mono_ns,
        start_unix_ns: clock.unix_ns(start_mono_ns),
        duration_ns,
        duration_source,
        go_duration_ns,
        window_ns,
        stopping_ns,
        caller: None,
        laggards: None,
        kernel_waits: None,
        kernel_waits_dropped_ns: None,
        stopper_page_faults: None,
        breakdown: None,
        restarting_ns: None,
        faults: None,
        explain_input: None,
    }
}

/// Go's stopping time, if the stopping probe fired and its figures belong to
/// this pause: the same `startedStopping` the end probe of
/// `startTheWorldWithSema` saw, and an end inside the pause.
fn stopping_ns(ev: &PauseEvent) -> Option<u64> {
    let s = &ev.stopping;
    let consistent = ev.flags & PauseEvent::FLAG_STOPPING != 0
        && (ev.flags & PauseEvent::FLAG_GO_START == 0 || s.started_ns == ev.go_started_ns)
        && s.started_ns >= ev.stop_ts_ns
        && s.finished_ns <= ev.go_now_ns.min(ev.header.ts_ns);
    consistent.then(|| s.finished_ns.checked_sub(s.started_ns))?
}

/// Pause records for other modules' tests.
#[cfg(test)]
pub mod tests_support {
    use super::{DurationSource, PauseRecord};

    /// A GC sweep termination of `pid` stopped by `pid`, Go-timed.
    pub fn record(pid: u32, start: u64, dur: u64) -> PauseRecord {
        PauseRecord {
            pid,
            tid: pid,
            reason_code: 2,
            reason: "gc_sweep_termination",
            reason_text: None,
            start_mono_ns: start,
            start_unix_ns: start,
            duration_ns: dur,
            duration_source: DurationSource::Go,
            go_duration_ns: Some(dur),
            window_ns: dur,
            stopping_ns: None,
            caller: None,
            laggards: None,
            kernel_waits: None,
            kernel_waits_dropped_ns: None,
            stopper_page_faults: None,
            breakdown: None,
            restarting_ns: None,
            faults: None,
            explain_input: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{
        event::{EventHeader, EventKind},
        pause::{GoStopping, REASON_TEXT_LEN},
    };

    use super::*;

    #[test]
    fn a_pause_is_slow_from_its_threshold_on() {
        let t = SlowThreshold::at_least(std::time::Duration::from_millis(1));
        assert!(!t.is_slow(999_999));
        assert!(t.is_slow(1_000_000));
        assert!(SlowThreshold::ALL.is_slow(0));
        assert!(!SlowThreshold::NONE.is_slow(u64::MAX));
        // A bound past u64 ns (584 years) is "none", not a wrap to a short one.
        let far = SlowThreshold::at_least(std::time::Duration::from_secs(u64::MAX));
        assert_eq!(far, SlowThreshold::NONE);
    }

    fn event(
        pid: u32,
        reason: u32,
        stop: u64,
        started: Option<u64>,
        now: u64,
        ret: u64,
    ) -> PauseEvent {
        PauseEvent {
            header: EventHeader {
                kind: EventKind::Pause as u32,
                tgid: pid,
                tid: pid + 1,
                cpu: 0,
                ts_ns: ret,
            },
            stop_ts_ns: stop,
            go_now_ns: now,
            go_started_ns: started.unwrap_or(0),
            stop_tid: pid + 2,
            reason,
            flags: if started.is_some() {
                PauseEvent::FLAG_GO_START
            } else {
                0
            },
            reason_text_len: 0,
            reason_text: [0; REASON_TEXT_LEN],
            stopping: Default::default(),
        }
    }

    fn text_event(text: &str) -> PauseEvent {
        let mut ev = event(1, REASON_FROM_TEXT, 100, None, 150, 160);
        ev.flags |= PauseEvent::FLAG_REASON_TEXT;
        // The kernel copies a fixed-size buffer; bytes past the length belong
        // to whatever follows the literal.
        ev.reason_text = *b"read mem statsGOMAXPROCSgcingxyz";
        ev.reason_text[..text.len()].copy_from_slice(text.as_bytes());
        ev.reason_text_len = text.len() as u32;
        ev
    }

    #[test]
    fn go_duration_is_used_when_go_start_is_known() {
        let r = record(
            &event(7, 1, 1_000, Some(1_020), 3_020, 3_100),
            WallClock::default(),
        );
        assert_eq!(r.duration_ns, 2_000);
        assert_eq!(r.duration_source, DurationSource::Go);
        assert_eq!(r.go_duration_ns, Some(2_000));
        assert_eq!(r.window_ns, 2_100);
        assert_eq!(r.start_mono_ns, 1_020);
        assert_eq!((r.pid, r.tid), (7, 9));
        assert_eq!(r.reason, "gc_mark_termination");
    }

    #[test]
    fn without_go_start_the_probe_opens_and_go_now_closes() {
        let r = record(
            &event(1, 9, 1_000, None, 2_500, 2_600),
            WallClock::default(),
        );
        assert_eq!(r.duration_ns, 1_500);
        assert_eq!(r.duration_source, DurationSource::Probe);
        assert_eq!(r.go_duration_ns, None);
        assert_eq!(r.reason, "gomaxprocs");
    }

    #[test]
    fn implausible_go_times_fall_back_to_the_probes() {
        // startedStopping before the entry probe: the stack slot held
        // something else.
        let r = record(
            &event(1, 2, 1_000, Some(5), 2_000, 2_100),
            WallClock::default(),
        );
        assert_eq!(r.duration_source, DurationSource::Probe);
        assert_eq!(r.duration_ns, 1_000);
        // Go's now outside the window: the end probe closes it.
        let r = record(
            &event(1, 2, 1_000, None, 99_999, 2_100),
            WallClock::default(),
        );
        assert_eq!(r.duration_ns, 1_100);
    }

    #[test]
    fn stopping_is_go_own_figure_when_it_belongs_to_the_pause() {
        let mut ev = event(7, 2, 1_000, Some(1_020), 3_020, 3_100);
        assert_eq!(record(&ev, WallClock::default()).stopping_ns, None);
        ev.flags |= PauseEvent::FLAG_STOPPING;
        ev.stopping = GoStopping {
            started_ns: 1_020,
            finished_ns: 1_520,
            stopping_ns: 9,
        };
        assert_eq!(record(&ev, WallClock::default()).stopping_ns, Some(500));
        // Another pause's start, or an end past Go's own end: not this pause.
        ev.stopping.started_ns = 1_010;
        assert_eq!(record(&ev, WallClock::default()).stopping_ns, None);
        ev.stopping.started_ns = 1_020;
        ev.stopping.finished_ns = 3_050;
        assert_eq!(record(&ev, WallClock::default()).stopping_ns, None);
    }

    #[test]
    fn preemptoff_texts_map_to_reasons() {
        for (text, want) in [
            ("", "gc_sweep_termination"),
            ("gcing", "gc_mark_termination"),
            ("read mem stats", "read_mem_stats"),
            ("GOMAXPROCS", "gomaxprocs"),
            ("something new", "unknown"),
        ] {
            let r = record(&text_event(text), WallClock::default());
            assert_eq!(r.reason, want, "{text:?}");
            assert_eq!(r.reason_text.as_deref(), Some(text));
        }
        let mut failed = text_event("gcing");
        failed.flags |= PauseEvent::FLAG_READ_FAILED;
        assert_eq!(record(&failed, WallClock::default()).reason, "unknown");
    }

    #[test]
    fn reasons_are_named_like_go() {
        assert_eq!(StwReason(2).name(), "GC sweep termination");
        assert_eq!(StwReason(200).id(), "unknown");
        assert!(StwReason(1).is_gc() && StwReason(2).is_gc() && !StwReason(7).is_gc());
    }

    #[test]
    fn wall_clock_offsets_monotonic_times() {
        let c = WallClock {
            realtime_minus_monotonic_ns: 1_000,
        };
        assert_eq!(c.unix_ns(5), 1_005);
    }
}
