//! The text report of `gostw memory`, and its pieces for other summaries.

use std::fmt::Write as _;

use super::{
    Advice, Exposure, HostSwapDelta, MemoryReport,
    cgroup::{CgroupVersion, Limit},
};
use crate::units::{fmt_bytes, fmt_pct};

fn limit(l: Option<Limit>) -> String {
    match l {
        Some(Limit::Bytes(b)) => fmt_bytes(b),
        Some(Limit::Max) => "max".into(),
        None => "unknown".into(),
    }
}

/// The exposure, and the host's swap traffic when measured.
pub fn render_exposure(e: &Exposure, host_swap: Option<&HostSwapDelta>) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "process {} ({}), {}: {} resident, {} swapped out",
        e.pid,
        e.exe,
        e.go_version,
        fmt_bytes(e.total.resident_bytes),
        fmt_bytes(e.total.swapped_bytes)
    );
    let _ = writeln!(
        o,
        "{:<48} {:>10} {:>10} {:>10} {:>10}  found by",
        "class", "resident", "swapped", "mapped", "reserved"
    );
    for c in &e.classes {
        let u = &c.usage;
        let _ = writeln!(
            o,
            "{:<48} {:>10} {:>10} {:>10} {:>10}  {}",
            c.class.title(),
            fmt_bytes(u.resident_bytes),
            fmt_bytes(u.swapped_bytes),
            fmt_bytes(u.mapped_bytes),
            fmt_bytes(u.reserved_bytes),
            c.source.describe()
        );
        for p in c
            .parts
            .iter()
            .filter(|p| c.parts.len() > 1 || p.source != c.source)
        {
            let u = &p.usage;
            let _ = writeln!(
                o,
                "  {:<46} {:>10} {:>10} {:>10} {:>10}  {}",
                p.name,
                fmt_bytes(u.resident_bytes),
                fmt_bytes(u.swapped_bytes),
                fmt_bytes(u.mapped_bytes),
                fmt_bytes(u.reserved_bytes),
                p.source.describe()
            );
        }
    }
    let _ = writeln!(
        o,
        "heap arenas: {} x 64 MiB at {} (from {})",
        e.arenas.count,
        if e.arenas.ranges.is_empty() {
            "-".to_owned()
        } else {
            e.arenas.ranges.join(", ")
        },
        e.arenas.source.describe()
    );
    let r = &e.gc_metadata_reads;
    let _ = writeln!(
        o,
        "next GC: {} of GC metadata in swap: up to {} major faults when the GC reads it (at least {} with {}-page swap readahead)",
        fmt_bytes(r.swapped_bytes),
        r.faults_at_most,
        r.faults_at_least,
        r.readahead_pages
    );
    if let Some(c) = &e.cgroup {
        let v = match c.version {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        };
        let _ = write!(o, "cgroup {v} {}", c.path);
        if c.dir.is_some() {
            let _ = write!(
                o,
                ": usage {}, limit {} (effective {})",
                c.usage_bytes.map_or("unknown".into(), fmt_bytes),
                limit(c.limit),
                limit(c.effective_limit)
            );
            if c.version == CgroupVersion::V2 {
                let _ = write!(o, ", high {}", limit(c.high));
            }
            let _ = write!(
                o,
                ", swap {} (limit {})",
                c.swap_current_bytes.map_or("unknown".into(), fmt_bytes),
                limit(c.swap_limit)
            );
            if let Some(s) = c.swappiness {
                let _ = write!(o, ", swappiness {s}");
            }
            if !c.events.is_empty() {
                let ev: Vec<String> = c.events.iter().map(|(k, v)| format!("{k} {v}")).collect();
                let _ = write!(o, "; events: {}", ev.join(", "));
            }
        }
        let _ = writeln!(o);
        for n in &c.notes {
            let _ = writeln!(o, "  {n}");
        }
    }
    let h = &e.host;
    let opt = |v: Option<u64>| v.map_or("unknown".into(), |v| v.to_string());
    let _ = write!(
        o,
        "host: swap {} ({} free), vm.swappiness {}, vm.page-cluster {}",
        fmt_bytes(h.swap_total_bytes),
        fmt_bytes(h.swap_free_bytes),
        opt(h.swappiness),
        opt(h.page_cluster)
    );
    if let Some(d) = host_swap {
        let _ = write!(
            o,
            "; over {:.1} s: {:.0} pages/s swapped in, {:.0} out, readahead hit {}",
            d.interval_secs,
            d.pswpin_per_sec,
            d.pswpout_per_sec,
            d.readahead_hit_ratio
                .map_or("- (none read ahead)".into(), fmt_pct)
        );
    }
    let _ = writeln!(o);
    for n in &e.notes {
        let _ = writeln!(o, "note: {n}");
    }
    o
}

/// The advice items, numbered; says so when there are none.
pub fn render_advice(advice: &[Advice]) -> String {
    if advice.is_empty() {
        return "advice: none (no measured evidence passes its threshold)\n".into();
    }
    let mut o = String::from("advice:\n");
    for (i, a) in advice.iter().enumerate() {
        let _ = writeln!(o, "{}. {}", i + 1, a.finding);
        let _ = writeln!(o, "   evidence: {}", a.evidence);
        let _ = writeln!(o, "   action: {}", a.action);
    }
    o
}

/// The whole report of `gostw memory`.
pub fn render_text(report: &MemoryReport) -> String {
    render_exposure(&report.exposure, report.host_swap.as_ref()) + &render_advice(&report.advice)
}
