//! The report as text for people: a line per pause, and the summary.

use super::Summary;
use crate::{
    engine::{fault::PauseFaultStats, pause::PauseRecord},
    units::{fmt_ns, fmt_time_of_day},
};

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
fn fault_text(f: &PauseFaultStats) -> String {
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
        let _ = write!(t, "\n{}", super::faults_text::render_text(f, 10));
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
