//! The text form of a `FaultSummary`, for terminals.

use std::fmt::Write as _;

use super::faults::FaultSummary;
use crate::{
    model::fault::{FaultSite, FaultTotals},
    units::{fmt_ns as ms, fmt_time_of_day},
};

fn totals(t: &FaultTotals) -> String {
    if t.faults == 0 {
        return "no major faults".to_owned();
    }
    let unknown = if t.unknown_kind > 0 {
        format!(", {} of unknown kind", t.unknown_kind)
    } else {
        String::new()
    };
    format!(
        "{} major faults ({} swap-in, {} file{unknown}), {} in faults, blocked {} (own {}, other {})",
        t.faults,
        t.swap_in,
        t.file_backed,
        ms(t.fault_ns),
        ms(t.blocked_ns),
        ms(t.wait_own_ns),
        ms(t.wait_other_ns)
    )
}

fn sites(out: &mut String, indent: &str, sites: &[FaultSite]) {
    for s in sites {
        let _ = writeln!(
            out,
            "{indent}{:>5} faults {:>12}  {}",
            s.faults,
            ms(s.fault_ns),
            // From the site on; inlined helpers above it are in the JSON.
            s.stack
                .iter()
                .skip_while(|f| **f != s.function)
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(" <- ")
        );
    }
}

/// Per process: totals, the pauses that had faults (worst first, at most
/// `max_pauses`), and the top faulting sites inside and outside pauses.
pub fn render_text(summary: &FaultSummary, max_pauses: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "major page faults (backend: {})", summary.backend);
    let d = &summary.fault_ns_in_pauses;
    if d.count > 0 {
        let _ = writeln!(
            out,
            "faults per pause: p50 {} p99 {} max {}; fault time in pauses: p50 {} p99 {} max {}",
            summary.faults_per_pause.p50,
            summary.faults_per_pause.p99,
            summary.faults_per_pause.max,
            ms(d.p50),
            ms(d.p99),
            ms(d.max)
        );
    }
    for p in &summary.processes {
        if p.all.faults == 0 {
            let _ = writeln!(out, "pid {}: no major faults ({} pauses)", p.tgid, p.pauses);
            continue;
        }
        let _ = writeln!(out, "pid {}: {}", p.tgid, totals(&p.all));
        let _ = writeln!(
            out,
            "  {} pauses, {} with major faults; in pauses: {}",
            p.pauses,
            p.pauses_with_faults,
            totals(&p.in_pauses)
        );
        let mut worst: Vec<_> = summary
            .pauses
            .iter()
            .filter(|w| w.window.tgid == p.tgid && w.all.faults > 0)
            .collect();
        worst.sort_by_key(|w| std::cmp::Reverse(w.all.fault_ns));
        for w in worst.iter().take(max_pauses) {
            let _ = writeln!(
                out,
                "  pause at {}, {}: {}",
                fmt_time_of_day(w.window.start_unix_ns),
                ms(w.duration_ns),
                totals(&w.all)
            );
            let _ = writeln!(
                out,
                "    stopping thread {}: {}; other threads: {}",
                w.window.stopper_tid, w.stopper.faults, w.other_threads.faults
            );
            sites(&mut out, "    ", &w.top_sites);
        }
        if !p.top_sites_in_pauses.is_empty() {
            let _ = writeln!(out, "  top sites in pauses:");
            sites(&mut out, "    ", &p.top_sites_in_pauses);
        }
        let _ = writeln!(out, "  outside pauses: {}", totals(&p.outside_pauses));
        if p.shed > 0 {
            let _ = writeln!(
                out,
                "    {} of them with their stacks (a {:.1}% sample): {} shed while the ring \
                 buffer was more than half full; sites below are from the sample",
                p.outside_pauses_sent,
                100.0 * p.outside_pauses_sent as f64 / p.outside_pauses.faults.max(1) as f64,
                p.shed
            );
        }
        sites(&mut out, "    ", &p.top_sites_outside_pauses);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        image::Frame,
        model::pause::tests_support::record,
        model::{
            fault::{Fault, FaultKind},
            observed::ObservedPause,
        },
        sink::report::faults::FaultReport,
    };

    #[test]
    fn text_names_pause_sites_and_split() {
        let mut r = FaultReport::default();
        r.set_backend("tracepoint", false);
        r.process(2);
        // Monotonic and Unix clocks far apart, as on a real host: people
        // read wall-clock time, never seconds since boot.
        let mut pause = record(1, 1_191_758_876_000, 40_000_000);
        pause.start_unix_ns = 1_700_000_000_123_456_000;
        r.pause(&ObservedPause {
            record: pause,
            faults: vec![Fault {
                tgid: 1,
                tid: 1,
                begin_ns: 1,
                end_ns: 39_000_001,
                address: 0,
                kind: FaultKind::SwapIn,
                blocked_ns: 38_000_000,
                wait_own_ns: 38_000_000,
                wait_other_ns: 0,
                stack: Arc::from(vec![Frame {
                    function: "runtime.(*spanSet).reset".into(),
                    file: String::new(),
                    line: 0,
                    inlined: false,
                    start_line: 0,
                }]),
                pcs: Arc::from([]),
            }],
        });
        let text = render_text(&r.summary(), 5);
        assert!(text.contains("1 with major faults"), "{text}");
        assert!(text.contains("39.00 ms in faults"), "{text}");
        assert!(text.contains("runtime.(*spanSet).reset"), "{text}");
        assert!(text.contains("stopping thread 1: 1"), "{text}");
        let at = format!(
            "pause at {}, 40.00 ms",
            fmt_time_of_day(1_700_000_000_123_456_000)
        );
        assert!(text.contains(&at), "{at} in {text}");
        assert!(!text.contains("1191.758876"), "{text}");
        // A process without faults is one line, not a row of zeros.
        assert!(text.contains("pid 2: no major faults (0 pauses)"), "{text}");
        assert!(
            text.ends_with("pid 2: no major faults (0 pauses)\n"),
            "{text}"
        );
    }
}
