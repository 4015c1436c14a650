//! The summary's `health` section: what tracing cost, as the kernel counts
//! gostw's BPF programs (run-time statistics, on while gostw runs) and as
//! `/proc` counts gostw itself, with the events lost beside it.

use std::fmt::Write as _;

use serde::Serialize;

use crate::{bpf_stats::CostReading, model::backend::Degraded, units::fmt_bytes};

/// One BPF program's share.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProgramHealth {
    pub program: String,
    pub runs: u64,
    pub run_ns: u64,
    /// Mean run time (absent when it never ran).
    pub ns_per_run: Option<f64>,
}

/// gostw's own cost while it traced.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Health {
    /// The kernel counted program run time (`BPF_ENABLE_STATS` worked);
    /// without it `programs` is empty.
    pub bpf_stats_enabled: bool,
    /// Every loaded program, most run time first.
    pub programs: Vec<ProgramHealth>,
    /// Their run time, summed.
    pub bpf_ns: u64,
    /// gostw's own CPU time (user + system, all threads; start-up and
    /// binary analysis included).
    pub cpu_ns: Option<u64>,
    /// gostw's largest resident set (`VmHWM`).
    pub peak_rss_bytes: Option<u64>,
    /// Events lost (the summary's `lost.total`).
    pub events_lost: u64,
    /// Features in use that lose something on this host, and what (as
    /// `gostw check` says it).
    pub degraded: Vec<Degraded>,
}

impl Health {
    /// The section from the last cost reading, the loss total and the
    /// degraded features.
    pub fn of(c: &CostReading, events_lost: u64, degraded: &[Degraded]) -> Health {
        let mut programs: Vec<ProgramHealth> = c
            .programs
            .iter()
            .map(|p| ProgramHealth {
                program: p.name.clone(),
                runs: p.runs,
                run_ns: p.run_ns,
                ns_per_run: p.ns_per_run(),
            })
            .collect();
        programs.sort_by(|a, b| b.run_ns.cmp(&a.run_ns).then(a.program.cmp(&b.program)));
        Health {
            bpf_stats_enabled: c.stats_enabled,
            programs,
            bpf_ns: c.bpf_ns(),
            cpu_ns: c.usage.map(|u| (u.cpu_seconds * 1e9).round() as u64),
            peak_rss_bytes: c.usage.map(|u| u.peak_rss_bytes),
            events_lost,
            degraded: degraded.to_vec(),
        }
    }

    /// The text form: one line for gostw itself, one per program that ran.
    pub fn render_text(&self, elapsed_ns: u64) -> String {
        let mut t = String::from("health:\n");
        let cpu = match self.cpu_ns {
            Some(ns) if elapsed_ns > 0 => format!(
                "{:.2} s CPU ({:.2}% of one core)",
                ns as f64 / 1e9,
                100.0 * ns as f64 / elapsed_ns as f64
            ),
            Some(ns) => format!("{:.2} s CPU", ns as f64 / 1e9),
            None => "CPU unknown".into(),
        };
        let rss = self.peak_rss_bytes.map_or("unknown".into(), fmt_bytes);
        let _ = writeln!(
            t,
            "  gostw: {cpu}, peak RSS {rss}, events lost {}",
            self.events_lost
        );
        for d in &self.degraded {
            let _ = writeln!(t, "  degraded here: {}: {}", d.feature, d.why);
        }
        if !self.bpf_stats_enabled {
            let _ = writeln!(
                t,
                "  BPF programs: run time not counted (enabling BPF statistics failed)"
            );
            return t;
        }
        let _ = writeln!(
            t,
            "  BPF programs: {:.2} ms in all",
            self.bpf_ns as f64 / 1e6
        );
        for p in self.programs.iter().filter(|p| p.runs > 0) {
            let _ = writeln!(
                t,
                "    {:<22} {:>10} runs {:>7.0} ns/run {:>9.2} ms",
                p.program,
                p.runs,
                p.ns_per_run.unwrap_or(0.0),
                p.run_ns as f64 / 1e6
            );
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf_stats::{ProgramCost, SelfUsage};

    fn reading() -> CostReading {
        let p = |name: &str, runs, run_ns| ProgramCost {
            name: name.into(),
            runs,
            run_ns,
        };
        CostReading {
            stats_enabled: true,
            programs: vec![
                p("stw_stop", 40, 40_000),
                p("fault_tp_user", 100_000, 11_000_000),
                p("stack_copy", 0, 0),
            ],
            usage: Some(SelfUsage {
                cpu_seconds: 0.5,
                rss_bytes: 20 << 20,
                peak_rss_bytes: 24 << 20,
            }),
        }
    }

    #[test]
    fn programs_by_run_time_with_their_mean() {
        let h = Health::of(&reading(), 3, &[]);
        assert_eq!(h.bpf_ns, 11_040_000);
        assert_eq!(h.cpu_ns, Some(500_000_000));
        assert_eq!(h.peak_rss_bytes, Some(24 << 20));
        let names: Vec<&str> = h.programs.iter().map(|p| p.program.as_str()).collect();
        assert_eq!(names, ["fault_tp_user", "stw_stop", "stack_copy"]);
        assert_eq!(h.programs[1].ns_per_run, Some(1000.0));
        assert_eq!(h.programs[2].ns_per_run, None);
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(json["programs"][0]["ns_per_run"], 110.0);
        assert_eq!(json["events_lost"], 3);
        assert_eq!(json["degraded"], serde_json::json!([]));
    }

    #[test]
    fn text_shows_own_cpu_share_and_programs_that_ran() {
        let t = Health::of(&reading(), 0, &[]).render_text(10_000_000_000);
        assert!(!t.contains("degraded"), "{t}");
        assert!(
            t.contains("gostw: 0.50 s CPU (5.00% of one core), peak RSS 24.0 MiB, events lost 0"),
            "{t}"
        );
        assert!(t.contains("BPF programs: 11.04 ms in all"), "{t}");
        assert!(t.contains("stw_stop"), "{t}");
        assert!(!t.contains("stack_copy"), "{t}");
        let mut off = reading();
        off.stats_enabled = false;
        off.programs.clear();
        let t = Health::of(&off, 0, &[]).render_text(0);
        assert!(t.contains("run time not counted"), "{t}");
    }

    #[test]
    fn degraded_features_are_kept_and_said() {
        let d = Degraded {
            feature: "kernel waits",
            why: "page faults are not counted".into(),
        };
        let h = Health::of(&reading(), 0, std::slice::from_ref(&d));
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(json["degraded"][0]["feature"], "kernel waits");
        assert_eq!(json["degraded"][0]["why"], "page faults are not counted");
        let t = h.render_text(1);
        assert!(
            t.contains("  degraded here: kernel waits: page faults are not counted\n"),
            "{t}"
        );
    }
}
