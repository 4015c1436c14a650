//! The report as text for people: a line per pause, and the summary.

use super::Summary;
use crate::{
    engine::caller::CallerSite,
    image::Frame,
    model::{
        fault::PauseFaultStats, kernel_wait::Sleeper, laggard::LaggardRecord, pause::PauseRecord,
    },
    units::{fmt_ns, fmt_time_of_day},
};

/// One live text line.
pub fn pause_line(p: &PauseRecord) -> String {
    let reason = match &p.reason_text {
        Some(t) if p.reason == "unknown" => format!("{:?}", t),
        _ => p.stw_reason().name().to_owned(),
    };
    let stopping = p
        .stopping_ns
        .map(|s| format!(", stopping {}", fmt_ns(s)))
        .unwrap_or_default();
    let line = format!(
        "{}  pid {:<7} STW {:<28} {:>10}  (window {}{stopping}, stopped by tid {})",
        fmt_time_of_day(p.start_unix_ns),
        p.pid,
        reason,
        fmt_ns(p.duration_ns),
        fmt_ns(p.window_ns),
        p.tid
    );
    let line = match p.caller.as_deref().and_then(CallerSite::of) {
        Some(c) => format!("{line}  caller {}", c.function),
        None => line,
    };
    let line = match &p.breakdown {
        Some(b) => {
            let parts: Vec<String> = b
                .largest()
                .iter()
                .take(3)
                .map(|(name, ns)| format!("{name} {}", fmt_ns(*ns)))
                .collect();
            format!("{line}  [{}]", parts.join(", "))
        }
        None => line,
    };
    let line = match p.laggards.as_deref().and_then(<[_]>::first) {
        Some(l) => format!("{line}  {}", laggard_text(l)),
        None => line,
    };
    let line = match kernel_wait_text(p) {
        Some(w) => format!("{line}  {w}"),
        None => line,
    };
    match &p.faults {
        Some(f) if f.all.faults > 0 => format!("{line}  {}", fault_text(f)),
        _ => line,
    }
}

/// The laggard that held the stop longest, e.g. `laggard tid 812 on_cpu
/// 18.2 ms in main.spinLoop (stopped in main.spinner)`: the code it ran
/// while the world waited, and where it stopped when that differs.
fn laggard_text(l: &LaggardRecord) -> String {
    let site = |frames: &[Frame]| {
        frames
            .iter()
            .find(|f| !f.function.starts_with("runtime."))
            .or(frames.first())
            .map(|f| f.function.clone())
    };
    let held = site(&l.frames);
    let mut text = format!(
        "laggard tid {} {} {}",
        l.tid,
        serde_json::to_value(l.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        fmt_ns(l.ns)
    );
    if let Some(f) = &held {
        text += &format!(" in {f}");
    }
    if let Some(stopped) = site(&l.stopped_at)
        && held.as_ref() != Some(&stopped)
    {
        text += &format!(" (stopped in {stopped})");
    }
    if l.page_faults > 0 {
        text += &format!(", {} page faults", l.page_faults);
    }
    if let Some(k) = l.kernel {
        text += &format!(", in the kernel: {} {}", k.kind.name(), fmt_ns(k.ns));
    }
    text
}

/// The longest time in the kernel that says why the pause was slow (a
/// tenth of it or more; Go's own futex sleeps and unnamed ones are left to
/// the JSON), asleep or running (sampled), e.g. `kernel: stopping thread
/// slept uprobe 5.42 ms (rwsem_down_read_slowpath <- down_read <-
/// find_active_uprobe_rcu)`.
fn kernel_wait_text(p: &PauseRecord) -> Option<String> {
    let w = p
        .kernel_waits
        .as_deref()?
        .iter()
        .find(|w| w.kind.says_why() && w.ns * 10 >= p.duration_ns)?;
    let who = match w.thread {
        Sleeper::Stopping => "stopping thread".to_owned(),
        Sleeper::Laggard => format!("laggard tid {}", w.tid),
    };
    let frames: Vec<&str> = w.frames.iter().take(3).map(String::as_str).collect();
    Some(format!(
        "kernel: {who} {} {} {} ({})",
        if w.on_cpu { "ran" } else { "slept" },
        w.kind.name(),
        fmt_ns(w.ns),
        frames.join(" <- ")
    ))
}

/// A pause's faults, e.g. `faults=87 (swap 87) wait=11.9 ms own=9.1 ms
/// other=2.8 ms threads: stopper 80, other 7; began stopping 0, stopped 83,
/// restarting 4 (after the restart); top runtime.markrootSpans`.
fn fault_text(f: &PauseFaultStats) -> String {
    use std::fmt::Write as _;
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
    // By the phase they began in: those of the restart began once threads
    // had their P back, and did not lengthen the pause.
    if let Some(p) = &f.by_phase {
        let _ = write!(
            t,
            "; began stopping {}, stopped {}, restarting {} (after the restart)",
            p.stopping.faults, p.stopped.faults, p.restarting.faults
        );
    }
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
        if p.pauses_lost > 0 {
            let _ = writeln!(
                t,
                "  {} of the {} stops the kernel counted have no pause record (see lost)",
                p.pauses_lost, p.stops_counted
            );
        }
        if let Some(c) = &p.cpu_throttling
            && c.while_traced.nr_throttled > 0
        {
            let _ = writeln!(
                t,
                "  CPU cgroup {} throttled {} times while traced, {} in all (CFS quota)",
                c.cgroup,
                c.while_traced.nr_throttled,
                fmt_ns(c.while_traced.throttled_ns)
            );
        }
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
        let callers: Vec<&super::ReasonSummary> = p
            .by_reason
            .iter()
            .filter(|r| !r.top_callers.is_empty())
            .collect();
        if !callers.is_empty() {
            let _ = writeln!(t, "  callers:");
        }
        for r in callers {
            let sites: Vec<String> = r
                .top_callers
                .iter()
                .map(|c| {
                    if c.site.via.is_empty() {
                        format!("{} {}", c.site.function, c.pauses)
                    } else {
                        format!("{} (via {}) {}", c.site.function, c.site.via, c.pauses)
                    }
                })
                .collect();
            let _ = writeln!(t, "    {:<26} {}", r.name, sites.join(", "));
        }
        let explained: Vec<&super::ReasonSummary> = p
            .by_reason
            .iter()
            .filter(|r| r.breakdown.is_some())
            .collect();
        if !explained.is_empty() {
            let _ = writeln!(
                t,
                "  where the time went (largest parts, all pauses of a reason):"
            );
        }
        for r in explained {
            let b = r.breakdown.as_ref().expect("filtered");
            let parts: Vec<String> = b
                .total
                .largest()
                .iter()
                .take(4)
                .map(|(name, ns)| format!("{name} {}", fmt_ns(*ns)))
                .collect();
            let _ = writeln!(t, "    {:<26} {}", r.name, parts.join(", "));
        }
        let named: Vec<_> = p
            .kernel_waits
            .iter()
            .filter(|k| k.kind.says_why())
            .collect();
        if !named.is_empty() {
            let _ = writeln!(t, "  in the kernel (all pauses):");
        }
        for k in named {
            let who = match k.thread {
                Sleeper::Stopping => "stopping thread",
                Sleeper::Laggard => "laggards",
            };
            let frames: Vec<&str> = k.frames.iter().take(3).map(String::as_str).collect();
            let _ = writeln!(
                t,
                "    {who} {} {} in {} of {} pauses, {} ({})",
                if k.on_cpu { "ran" } else { "slept" },
                k.kind.name(),
                k.pauses,
                p.pauses,
                fmt_ns(k.ns),
                frames.join(" <- ")
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
    if let Some(e) = &s.exposure {
        t += &super::exposure::render_text(e, s.advice.as_deref().unwrap_or_default());
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
    if let Some(o) = &l.output {
        let _ = writeln!(t, "{}", unwritten_text(o));
    }
    if let Some(h) = &s.health {
        let _ = write!(t, "\n{}", h.render_text(s.elapsed_ns));
    }
    t
}

/// What standard output could not take, in a sentence: "live lines not
/// written: 120 (118 while its reader did not keep up, 2 write errors),
/// from 14:03:07.123456 to 14:03:09.000001".
pub fn unwritten_text(l: &crate::sink::queued::Losses) -> String {
    let mut why = Vec::new();
    if l.queue_full > 0 {
        why.push(format!("{} while its reader did not keep up", l.queue_full));
    }
    if l.write_error > 0 {
        why.push(format!("{} write errors", l.write_error));
    }
    format!(
        "live lines not written: {} ({}), from {} to {}",
        l.total(),
        why.join(", "),
        fmt_time_of_day(l.first_unix_ns),
        fmt_time_of_day(l.last_unix_ns)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        fault::{FaultTotals, PhaseFaults},
        kernel_wait::WaitKind,
    };

    #[test]
    fn a_pause_line_splits_its_faults_by_phase() {
        let n = |faults| FaultTotals {
            faults,
            swap_in: faults,
            ..FaultTotals::default()
        };
        let mut f = PauseFaultStats {
            all: n(36),
            stopper: n(34),
            other_threads: n(2),
            ..PauseFaultStats::default()
        };
        assert!(!fault_text(&f).contains("began"), "phases unknown");
        f.by_phase = Some(Box::new(PhaseFaults {
            stopping: n(0),
            stopped: n(34),
            restarting: n(2),
        }));
        assert!(
            fault_text(&f)
                .contains("; began stopping 0, stopped 34, restarting 2 (after the restart)"),
            "{}",
            fault_text(&f)
        );
    }

    #[test]
    fn a_pause_line_names_the_sleep_that_made_it_slow() {
        use crate::model::{
            kernel_wait::{KernelWaitRecord, Phase},
            pause::tests_support::record,
        };
        let wait = |kind, ns| KernelWaitRecord {
            tid: 9,
            thread: Sleeper::Stopping,
            phase: Phase::Stopped,
            kind,
            on_cpu: false,
            ns,
            count: 1,
            frames: [
                "rwsem_down_read_slowpath",
                "down_read",
                "find_active_uprobe_rcu",
                "x",
            ]
            .map(String::from)
            .to_vec(),
        };
        let mut p = record(9, 0, 8_000_000);
        // Go's own futex sleep says nothing; a wait under a tenth neither.
        p.kernel_waits = Some(vec![
            wait(WaitKind::Futex, 7_000_000),
            wait(WaitKind::Uprobe, 700_000),
        ]);
        assert!(!pause_line(&p).contains("kernel:"), "{}", pause_line(&p));
        p.kernel_waits = Some(vec![wait(WaitKind::Uprobe, 5_420_000)]);
        assert!(
            pause_line(&p).ends_with(
                "kernel: stopping thread slept uprobe 5.42 ms \
                 (rwsem_down_read_slowpath <- down_read <- find_active_uprobe_rcu)"
            ),
            "{}",
            pause_line(&p)
        );
    }

    #[test]
    fn a_laggard_line_ends_with_its_page_faults_and_its_kernel_kind() {
        use crate::model::laggard::{FramesFrom, LaggardKernel, LaggardStateName};
        let mut l = LaggardRecord {
            tid: 812,
            state: LaggardStateName::Blocked,
            ns: 12_000_000,
            on_cpu_ns: 0,
            fault_ns: 0,
            runnable_ns: 0,
            blocked_ns: 12_000_000,
            running_goroutine: true,
            goid: None,
            frames: vec![],
            frames_from: FramesFrom::StoppedAt,
            held_samples: 0,
            page_faults: 3,
            kernel: None,
            stopped_at: vec![],
        };
        assert_eq!(
            laggard_text(&l),
            "laggard tid 812 blocked 12.00 ms, 3 page faults"
        );
        l.kernel = Some(LaggardKernel {
            kind: WaitKind::Reclaim,
            ns: 11_500_000,
        });
        assert_eq!(
            laggard_text(&l),
            "laggard tid 812 blocked 12.00 ms, 3 page faults, in the kernel: reclaim 11.50 ms"
        );
    }
}
