//! What gostw prints: a live line (or JSON line) per notable pause, and a
//! summary at the end. The JSON field names are a stable interface
//! (README.md, "JSON output"); units are in the names.

use std::{collections::BTreeMap, io::Write};

use serde::Serialize;
use tracer_common::counters::Counter;

use crate::{
    pauses::{PauseRecord, ProcessPauses},
    pipeline::{Pipeline, PipelineStats, Record},
    units::{fmt_ns, fmt_time_of_day},
};

/// A traced process, as the summary names it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub exe: String,
    pub go_version: String,
    /// Exit code (128 + signal for a signal) if it exited while traced.
    pub exit_code: Option<i32>,
}

/// One reason's pauses in one process.
#[derive(Clone, Debug, Serialize)]
pub struct ReasonSummary {
    pub reason: &'static str,
    pub reason_code: u32,
    /// Go's wording.
    pub name: &'static str,
    /// Counted by Go as a GC pause (`/sched/pauses/total/gc:seconds`).
    pub gc: bool,
    pub count: u64,
    pub total_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

/// One process's pauses.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessSummary {
    #[serde(flatten)]
    pub process: ProcessInfo,
    pub pauses: u64,
    pub total_ns: u64,
    pub by_reason: Vec<ReasonSummary>,
    /// The longest pauses, longest first.
    pub worst: Vec<PauseRecord>,
}

/// Events that happened but are missing from the records.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Lost {
    pub total: u64,
    /// Kernel-side counters by name (`Counter::name`).
    pub kernel: BTreeMap<&'static str, u64>,
    /// Events that reached user space but could not be used.
    pub user: PipelineStats,
}

/// The end-of-trace report.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub elapsed_ns: u64,
    pub processes: Vec<ProcessSummary>,
    /// Major faults and how much of each pause they explain (when traced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<crate::faults::FaultSummary>,
    /// Goroutine stack growth of the traced process (when traced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_growth: Option<crate::stackgrowth::StackGrowthSummary>,
    pub lost: Lost,
}

impl Summary {
    /// Build the summary of `pipeline` for `processes`, with the kernel
    /// `counters` read at the end.
    pub fn new(
        pipeline: &Pipeline,
        processes: &[ProcessInfo],
        counters: &[(Counter, u64)],
        elapsed_ns: u64,
    ) -> Summary {
        let empty = ProcessPauses::default();
        let processes = processes
            .iter()
            .map(|info| {
                let p = pipeline.pauses.process(info.pid).unwrap_or(&empty);
                let by_reason: Vec<_> = p
                    .by_reason
                    .iter()
                    .map(|(r, s)| ReasonSummary {
                        reason: r.id(),
                        reason_code: r.0,
                        name: r.name(),
                        gc: r.is_gc(),
                        count: s.count,
                        total_ns: s.total_ns,
                        p50_ns: s.quantile_ns(0.5),
                        p90_ns: s.quantile_ns(0.9),
                        p99_ns: s.quantile_ns(0.99),
                        p999_ns: s.quantile_ns(0.999),
                        max_ns: s.max_ns,
                    })
                    .collect();
                ProcessSummary {
                    process: info.clone(),
                    pauses: p.count(),
                    total_ns: by_reason.iter().map(|r| r.total_ns).sum(),
                    by_reason,
                    worst: p.worst.clone(),
                }
            })
            .collect();
        let kernel: BTreeMap<_, _> = counters.iter().map(|&(c, n)| (c.name(), n)).collect();
        let lost = Lost {
            // Counters that split another one (per-kind ring buffer drops) are not added twice.
            total: counters
                .iter()
                .filter(|(c, _)| c.part_of().is_none())
                .map(|&(_, n)| n)
                .sum::<u64>()
                + pipeline.stats.lost(),
            kernel,
            user: pipeline.stats,
        };
        Summary {
            kind: "summary",
            elapsed_ns,
            processes,
            faults: pipeline.faults.as_ref().map(|f| f.summary()),
            stack_growth: None,
            lost,
        }
    }
}

/// Where and how records and the summary are written.
pub struct Output {
    out: Box<dyn Write>,
    json: bool,
    threshold_ns: u64,
}

impl Output {
    /// Write to `out`, as JSON lines or text; only pauses of at least
    /// `threshold_ns` are written as they happen.
    pub fn new(out: Box<dyn Write>, json: bool, threshold_ns: u64) -> Output {
        Output {
            out,
            json,
            threshold_ns,
        }
    }

    /// A record, if it is notable enough.
    pub fn record(&mut self, rec: &Record) -> std::io::Result<()> {
        match rec {
            Record::Pause(p) if p.duration_ns < self.threshold_ns => Ok(()),
            Record::Pause(p) if !self.json => writeln!(self.out, "{}", pause_line(p)),
            _ => self.json_line(rec),
        }
    }

    /// The final summary.
    pub fn summary(&mut self, s: &Summary) -> std::io::Result<()> {
        if self.json {
            self.json_line(s)?;
        } else {
            write!(self.out, "{}", summary_text(s))?;
        }
        self.out.flush()
    }

    /// A text line for people (text mode only; JSON output stays parseable).
    pub fn note(&mut self, text: &str) -> std::io::Result<()> {
        if self.json {
            return Ok(());
        }
        writeln!(self.out, "{text}")?;
        self.out.flush()
    }

    fn json_line(&mut self, v: &impl Serialize) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, v)?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}

/// One live text line.
pub fn pause_line(p: &PauseRecord) -> String {
    let reason = match &p.reason_text {
        Some(t) if p.reason == "unknown" => format!("{:?}", t),
        _ => p.stw_reason().name().to_owned(),
    };
    let line = format!(
        "{}  pid {:<7} STW {:<28} {:>10}  (window {}, stopped by tid {})",
        fmt_time_of_day(p.start_unix_ns),
        p.pid,
        reason,
        fmt_ns(p.duration_ns),
        fmt_ns(p.window_ns),
        p.tid
    );
    match &p.faults {
        Some(f) if f.all.faults > 0 => format!("{line}  {}", fault_text(f)),
        _ => line,
    }
}

/// A pause's faults, e.g. `faults=87 (swap 87) wait=11.9 ms own=9.1 ms
/// other=2.8 ms threads: stopper 80, other 7; top runtime.markrootSpans`.
fn fault_text(f: &crate::faults::PauseFaultStats) -> String {
    let a = &f.all;
    let kinds: Vec<String> = [
        ("swap", a.swap_in),
        ("file", a.file_backed),
        ("unknown", a.unknown_kind),
    ]
    .iter()
    .filter(|(_, n)| *n > 0)
    .map(|(k, n)| format!("{k} {n}"))
    .collect();
    let mut t = format!(
        "faults={} ({}) in-fault={} wait={} own={} other={} threads: stopper {}, other {}",
        a.faults,
        kinds.join(", "),
        fmt_ns(a.fault_ns),
        fmt_ns(a.blocked_ns),
        fmt_ns(a.wait_own_ns),
        fmt_ns(a.wait_other_ns),
        f.stopper.faults,
        f.other_threads.faults,
    );
    if let Some((site, _)) = f.top_sites.first() {
        t.push_str("; top ");
        t.push_str(site);
    }
    t
}

/// The summary as text.
pub fn summary_text(s: &Summary) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    for p in &s.processes {
        let i = &p.process;
        let _ = writeln!(
            t,
            "\npid {} ({}, {}): {} stop-the-world pauses, {} in all, over {}{}",
            i.pid,
            i.exe,
            i.go_version,
            p.pauses,
            fmt_ns(p.total_ns),
            fmt_ns(s.elapsed_ns),
            i.exit_code
                .map(|c| format!("; exited with code {c}"))
                .unwrap_or_default()
        );
        if p.by_reason.is_empty() {
            continue;
        }
        let _ = writeln!(
            t,
            "  {:<28} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "reason", "count", "p50", "p90", "p99", "p99.9", "max", "total"
        );
        for r in &p.by_reason {
            let _ = writeln!(
                t,
                "  {:<28} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
                r.name,
                r.count,
                fmt_ns(r.p50_ns),
                fmt_ns(r.p90_ns),
                fmt_ns(r.p99_ns),
                fmt_ns(r.p999_ns),
                fmt_ns(r.max_ns),
                fmt_ns(r.total_ns)
            );
        }
        let _ = writeln!(t, "  worst pauses:");
        for w in &p.worst {
            let _ = writeln!(t, "    {}", pause_line(w));
        }
    }
    if let Some(f) = &s.faults {
        let _ = write!(
            t,
            "\nmajor faults:\n{}",
            crate::faults::report::render_text(f, 10)
        );
    }
    if let Some(g) = &s.stack_growth {
        let _ = write!(t, "\nstack growth:\n{}", g.render_text());
    }
    let l = &s.lost;
    let mut parts: Vec<String> = l
        .kernel
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    for (name, n) in [
        ("malformed", l.user.malformed),
        ("unknown_kind", l.user.unknown_kind),
        ("unhandled", l.user.unhandled),
    ] {
        if n > 0 {
            parts.push(format!("{name} {n}"));
        }
    }
    let _ = writeln!(
        t,
        "events lost: {}{}",
        l.total,
        if parts.is_empty() {
            String::new()
        } else {
            format!(" ({})", parts.join(", "))
        }
    );
    t
}

#[cfg(test)]
mod tests {
    use tracer_common::{
        event::{EventHeader, EventKind},
        pause::{PauseEvent, REASON_TEXT_LEN},
    };

    use super::*;
    use crate::pauses::WallClock;

    fn feed(p: &mut Pipeline, pid: u32, reason: u32, d: u64) -> Record {
        let ev = PauseEvent {
            header: EventHeader {
                kind: EventKind::Pause as u32,
                tgid: pid,
                tid: pid,
                cpu: 0,
                ts_ns: 10_000_000,
            },
            stop_ts_ns: 100,
            go_now_ns: 200 + d,
            go_started_ns: 200,
            stop_tid: pid,
            reason,
            flags: PauseEvent::FLAG_GO_START,
            reason_text_len: 0,
            reason_text: [0; REASON_TEXT_LEN],
        };
        // SAFETY: PauseEvent is Pod.
        let raw = unsafe {
            std::slice::from_raw_parts((&ev as *const PauseEvent).cast::<u8>(), size_of_val(&ev))
        };
        p.feed(raw).unwrap()
    }

    #[derive(Clone, Default)]
    struct Buf(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn threshold_filters_live_records_and_summary_has_every_pause() {
        let mut p = Pipeline::new(WallClock::default());
        let buf = Buf::default();
        let mut out = Output::new(Box::new(buf.clone()), true, 1_000);
        for (reason, d) in [(2, 500), (2, 5_000), (7, 2_000)] {
            let rec = feed(&mut p, 9, reason, d);
            out.record(&rec).unwrap();
        }
        let info = ProcessInfo {
            pid: 9,
            exe: "/x".into(),
            go_version: "go1.26.6".into(),
            exit_code: Some(0),
        };
        let dropped = [(Counter::RingbufFull, 2), (Counter::RingbufFullPause, 2)];
        let s = Summary::new(&p, &[info], &dropped, 1);
        out.summary(&s).unwrap();
        let text = String::from_utf8(buf.0.borrow().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0]["duration_ns"], 5_000);
        let sum = &lines[2];
        assert_eq!(sum["type"], "summary");
        let proc0 = &sum["processes"][0];
        assert_eq!(proc0["pid"], 9);
        assert_eq!(proc0["pauses"], 3);
        assert_eq!(proc0["by_reason"][0]["reason"], "gc_sweep_termination");
        assert_eq!(proc0["by_reason"][0]["count"], 2);
        assert_eq!(proc0["by_reason"][0]["max_ns"], 5_000);
        assert_eq!(proc0["by_reason"][1]["reason"], "read_mem_stats");
        assert_eq!(sum["lost"]["total"], 2);
        assert_eq!(sum["lost"]["kernel"]["ringbuf_full"], 2);
        assert_eq!(sum["lost"]["kernel"]["ringbuf_full_pause"], 2);
    }

    #[test]
    fn text_summary_names_reasons_and_losses() {
        let mut p = Pipeline::new(WallClock::default());
        feed(&mut p, 3, 1, 40_000);
        let info = ProcessInfo {
            pid: 3,
            ..Default::default()
        };
        let s = Summary::new(&p, &[info], &[(Counter::MapFull, 0)], 1_000_000_000);
        let t = summary_text(&s);
        assert!(t.contains("GC mark termination"), "{t}");
        assert!(t.contains("40.0 us"), "{t}");
        assert!(t.contains("events lost: 0\n"), "{t}");
    }
}
